#include "chunk/chunk_size_search.h"

#include <algorithm>
#include <cstdint>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "base/testing/status_matchers.h"
#include "base/units.h"
#include "chunk/chunk_layout.h"
#include "chunk/chunk_type.h"
#include "chunk/operator_spec.h"
#include "chunk/testing/transformer_operators.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "memory/dtype.h"

namespace ps {
namespace {

using ::testing::AllOf;
using ::testing::HasSubstr;
using ::testing::Not;

// GPT-2-shaped operators by preset name (the search itself knows no model).
std::vector<OperatorSpec> Gpt(const std::string& preset) {
  using chunk_testing::TransformerOperators;
  if (preset == "tiny") return TransformerOperators(chunk_testing::kTinyShape);
  if (preset == "gpt2") return TransformerOperators(chunk_testing::kGpt2Shape);
  if (preset == "gpt2-medium") return TransformerOperators(chunk_testing::kGpt2MediumShape);
  if (preset == "1B") return TransformerOperators(chunk_testing::k1BShape);
  EXPECT_EQ(preset, "10B");
  return TransformerOperators(chunk_testing::k10BShape);
}

// Builds the real layout for `candidate` and checks every number of the candidate against it.
void VerifyWithLayout(const std::vector<OperatorSpec>& ops, const ChunkSizeCandidate& candidate,
                      const ChunkSizeSearchOptions& options) {
  SCOPED_TRACE(absl::StrCat("chunk ", candidate.chunk_elems, " world ", options.world_size,
                            " alignment ", options.tensor_alignment_elems));
  ASSERT_OK_AND_ASSIGN(
      ChunkLayout layout,
      ChunkLayout::Build({.capacity_elems = candidate.chunk_elems,
                          .world_size = options.world_size,
                          .tensor_alignment_elems = options.tensor_alignment_elems},
                         ops));
  ASSERT_OK(layout.Validate());
  EXPECT_EQ(layout.num_unplaced_tensors(), 0);
  EXPECT_EQ(layout.placed_elems(), ModelNumElems(ops));
  EXPECT_EQ(candidate.num_chunks, layout.num_chunks());
  EXPECT_EQ(candidate.num_padding_chunks, layout.num_padding_chunks());
  EXPECT_DOUBLE_EQ(candidate.utilization, layout.utilization());
  EXPECT_EQ(candidate.model_data_bytes, layout.TotalModelDataBytes(options.compute_dtype));
  // Frozen parameters need only their param bytes (equal to ModelDataBytesPerParam for all when
  // every operator is trainable).
  const int64_t param_bytes = SizeOf(ChunkDType(ChunkType::kParam, options.compute_dtype));
  EXPECT_EQ(
      candidate.waste_bytes,
      layout.TotalModelDataBytes(options.compute_dtype) - ModelNumElems(ops) * param_bytes -
          layout.trainable_elems() * (ModelDataBytesPerParam(options.compute_dtype) - param_bytes));
  int64_t max_rank_bytes = 0;
  for (int rank = 0; rank < options.world_size; ++rank) {
    max_rank_bytes =
        std::max(max_rank_bytes, layout.RankModelDataBytes(options.compute_dtype, rank));
  }
  EXPECT_EQ(candidate.rank_model_data_bytes, max_rank_bytes);
  const int64_t param_chunk_bytes = layout.ChunkBytes(ChunkType::kParam, options.compute_dtype);
  EXPECT_EQ(candidate.working_set_bytes, options.world_size * param_chunk_bytes);
  EXPECT_EQ(candidate.rank_peak_bytes,
            max_rank_bytes + (options.world_size - 1) * param_chunk_bytes);
  EXPECT_EQ(candidate.fits_accelerator,
            candidate.working_set_bytes <=
                options.working_set_fraction * options.accelerator_memory_bytes);
  EXPECT_EQ(candidate.fits_memory, candidate.rank_peak_bytes <= options.accelerator_memory_bytes +
                                                                    options.host_memory_bytes);
}

TEST(ChunkSizeSearch, EvaluationMatchesTheRealLayout) {
  const std::vector<OperatorSpec> ops = Gpt("tiny");
  for (int world : {1, 2, 3, 8}) {
    for (int64_t alignment : {1, 64}) {
      for (DType dtype : {DType::kF16, DType::kF32}) {
        ChunkSizeSearchOptions options{.world_size = world,
                                       .compute_dtype = dtype,
                                       .accelerator_memory_bytes = kMiB,
                                       .host_memory_bytes = kMiB,
                                       .tensor_alignment_elems = alignment};
        for (int64_t chunk : {20'480, 20'481, 23'000, 33'333, 40'000, 65'536, 130'000}) {
          ASSERT_OK_AND_ASSIGN(ChunkSizeCandidate c, EvaluateChunkSize(ops, chunk, options));
          ASSERT_NO_FATAL_FAILURE(VerifyWithLayout(ops, c, options));
        }
      }
    }
  }
}

// A frozen base (LoRA): param-only chunks, counted exactly as the real layout counts them, for a
// frozen prefix (base, then adapters) and for kinds that alternate (every kind change may open
// empty chunks to complete a ZeRO group).
TEST(ChunkSizeSearch, EvaluationMatchesTheRealLayoutWithFrozenOperators) {
  for (const bool alternate : {false, true}) {
    std::vector<OperatorSpec> ops = Gpt("tiny");
    for (size_t k = 0; k < ops.size(); ++k) {
      ops[k].trainable = alternate ? (k / 3) % 2 == 1 : k >= ops.size() * 2 / 3;
    }
    for (int world : {1, 2, 3, 8}) {
      for (DType dtype : {DType::kBF16, DType::kF32}) {
        ChunkSizeSearchOptions options{.world_size = world,
                                       .compute_dtype = dtype,
                                       .accelerator_memory_bytes = kMiB,
                                       .host_memory_bytes = kMiB,
                                       .tensor_alignment_elems = 64};
        for (int64_t chunk : {20'480, 23'000, 40'000, 130'000}) {
          ASSERT_OK_AND_ASSIGN(ChunkSizeCandidate c, EvaluateChunkSize(ops, chunk, options));
          ASSERT_NO_FATAL_FAILURE(VerifyWithLayout(ops, c, options));
        }
      }
    }
  }
}

struct Case {
  std::string preset;
  int world_size;
  int64_t accelerator_memory_bytes;
  int64_t host_memory_bytes;
  DType dtype;
};

TEST(ChunkSizeSearch, BestOnGptPresetsIsVerifiedByBuildingTheLayout) {
  const Case cases[] = {
      {"gpt2", 1, 16 * kGiB, 64 * kGiB, DType::kF16},
      {"gpt2", 8, 16 * kGiB, 64 * kGiB, DType::kBF16},
      {"gpt2-medium", 2, 8 * kGiB, 32 * kGiB, DType::kF32},
      {"1B", 3, 32 * kGiB, 240 * kGiB, DType::kF16},
      {"10B", 1, 32 * kGiB, 240 * kGiB, DType::kF16},
      {"10B", 8, 80 * kGiB, 128 * kGiB, DType::kF16},
  };
  for (const Case& c : cases) {
    SCOPED_TRACE(absl::StrCat(c.preset, " world ", c.world_size));
    const std::vector<OperatorSpec> ops = Gpt(c.preset);
    const ChunkSizeSearchOptions options{.world_size = c.world_size,
                                         .compute_dtype = c.dtype,
                                         .accelerator_memory_bytes = c.accelerator_memory_bytes,
                                         .host_memory_bytes = c.host_memory_bytes};
    ASSERT_OK_AND_ASSIGN(ChunkSizeSearchResult result, SearchChunkSize(ops, options));
    EXPECT_EQ(result.total_params, ModelNumElems(ops));
    EXPECT_EQ(result.largest_operator, "wte");
    ASSERT_FALSE(result.candidates.empty());
    const int64_t lower = AlignUp(result.largest_operator_elems, options.granularity_elems);
    EXPECT_EQ(result.candidates.front().chunk_elems, lower);
    EXPECT_LE(result.candidates.back().chunk_elems, 2 * lower);
    // The best is feasible and has the least model data of all feasible candidates.
    const ChunkSizeCandidate& best = result.best;
    EXPECT_TRUE(best.feasible());
    for (const ChunkSizeCandidate& other : result.candidates) {
      EXPECT_EQ(other.chunk_elems % options.granularity_elems, 0);
      EXPECT_GE(other.chunk_elems, result.largest_operator_elems);
      if (other.feasible()) {
        EXPECT_GE(other.model_data_bytes, best.model_data_bytes);
      }
    }
    // Its utilization and fit, from the layout itself.
    ASSERT_NO_FATAL_FAILURE(VerifyWithLayout(ops, best, options));
    // Spot-check other candidates too.
    for (size_t i = 0; i < result.candidates.size(); i += 37) {
      ASSERT_NO_FATAL_FAILURE(VerifyWithLayout(ops, result.candidates[i], options));
    }
  }
}

TEST(ChunkSizeSearch, Gpt2OnOneRankFindsAHighUtilizationChunk) {
  const std::vector<OperatorSpec> ops = Gpt("gpt2");
  const ChunkSizeSearchOptions options{.accelerator_memory_bytes = 16 * kGiB,
                                       .host_memory_bytes = 64 * kGiB};
  ASSERT_OK_AND_ASSIGN(ChunkSizeSearchResult result, SearchChunkSize(ops, options));
  // 37 Mi .. 74 Mi elements.
  EXPECT_EQ(result.candidates.size(), 38u);
  EXPECT_GT(result.best.utilization, 0.95);
  const std::string table = FormatChunkSizeTable(result, options, 10);
  EXPECT_THAT(table, AllOf(HasSubstr("124439808 parameters in 75 operators"),
                           HasSubstr("largest operator 'wte' = 38597376 elements"),
                           HasSubstr(absl::StrCat("* ", result.best.chunk_elems)),
                           HasSubstr("28 more candidates not shown")));
  const std::string all = FormatChunkSizeTable(result, options, 0);
  EXPECT_THAT(all, Not(HasSubstr("more candidates")));
}

TEST(ChunkSizeSearch, ExplainsImpossibleInputs) {
  const std::vector<OperatorSpec> ops = Gpt("gpt2");
  const ChunkSizeSearchOptions ok{.accelerator_memory_bytes = 16 * kGiB,
                                  .host_memory_bytes = 64 * kGiB};
  ChunkSizeSearchOptions o = ok;
  o.accelerator_memory_bytes = 100 * kMiB;
  EXPECT_THAT(SearchChunkSize(ops, o),
              StatusIs(absl::StatusCode::kInvalidArgument,
                       AllOf(HasSubstr("operator 'wte' has 38597376 elements"),
                             HasSubstr("more accelerator memory"))));
  o = ok;
  o.accelerator_memory_bytes = kGiB;  // one chunk of <= 152 MiB fits half of it...
  o.host_memory_bytes = 1;            // ...but 14 B x 124M parameters = 1.6 GiB do not fit
  EXPECT_THAT(SearchChunkSize(ops, o),
              StatusIs(absl::StatusCode::kInvalidArgument,
                       AllOf(HasSubstr("does not fit"), HasSubstr("Add host memory"))));
  o = ok;
  o.max_chunk_elems = kMiB;
  EXPECT_THAT(SearchChunkSize(ops, o),
              StatusIs(absl::StatusCode::kInvalidArgument, "raise max_chunk_elems"));
  o = ok;
  o.granularity_elems = 1;
  o.max_chunk_elems = 100'000'000;
  EXPECT_THAT(SearchChunkSize(ops, o), StatusIs(absl::StatusCode::kInvalidArgument, "too many"));
  EXPECT_THAT(SearchChunkSize({}, ok),
              StatusIs(absl::StatusCode::kInvalidArgument, "no operators"));
  EXPECT_THAT(EvaluateChunkSize(ops, 1000, ok),
              StatusIs(absl::StatusCode::kInvalidArgument, "cannot hold operator 'wte'"));

  const std::pair<ChunkSizeSearchOptions, std::string> bad[] = {
      {{.world_size = 0, .accelerator_memory_bytes = 1, .host_memory_bytes = 1}, "world_size"},
      {{.accelerator_memory_bytes = 0, .host_memory_bytes = 1}, "accelerator_memory_bytes"},
      {{.accelerator_memory_bytes = 1, .host_memory_bytes = 0}, "host_memory_bytes"},
      {{.accelerator_memory_bytes = 1, .host_memory_bytes = 1, .working_set_fraction = 1.5},
       "working_set_fraction"},
      {{.accelerator_memory_bytes = 1, .host_memory_bytes = 1, .granularity_elems = 0},
       "granularity_elems"},
      {{.accelerator_memory_bytes = 1, .host_memory_bytes = 1, .tensor_alignment_elems = 0},
       "tensor_alignment_elems"},
  };
  for (const auto& [options, field] : bad) {
    EXPECT_THAT(SearchChunkSize(ops, options), StatusIs(absl::StatusCode::kInvalidArgument, field));
  }
}

TEST(ChunkSizeSearch, ManyRanksNeedPaddingAndGatheredChunks) {
  const std::vector<OperatorSpec> ops = Gpt("gpt2");
  const ChunkSizeSearchOptions options{
      .world_size = 8, .accelerator_memory_bytes = 16 * kGiB, .host_memory_bytes = 64 * kGiB};
  ASSERT_OK_AND_ASSIGN(ChunkSizeSearchResult result, SearchChunkSize(ops, options));
  // gpt2 (wte whole) fills at most 4 chunks of >= 37 Mi elements: 8 ranks need padding.
  EXPECT_EQ(result.best.num_chunks, 8);
  EXPECT_GE(result.best.num_padding_chunks, 4);
  EXPECT_EQ(result.best.working_set_bytes, 8 * result.best.chunk_elems * 2);
  // Padding chunks carry no optimizer state: a chunk size that needs one data chunk fewer wins
  // even though every chunk is larger.
  EXPECT_EQ(result.best.num_chunks - result.best.num_padding_chunks, 3);
  EXPECT_EQ(result.candidates.front().num_chunks - result.candidates.front().num_padding_chunks, 4);
}

}  // namespace
}  // namespace ps
