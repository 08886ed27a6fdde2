// CudaKernels' vocabulary-block entry points and bf16 Conv1D GEMMs (model/kernels/kernels.h,
// implemented in model/kernels/cuda/vocab_blocks.h and matmul.h) against the CPU kernels of
// model/kernels/vocab_blocks.h and matmul.h, through the Kernels interface on a cuda backend:
//   - embedding blocks (f32, f16, bf16 rows; every block in turn), ScatterRowsAdd, the position
//     embedding forward and backward: bit for bit (copies, exact widenings, the CPU's order);
//   - the touched-row copies against their contract, for f32/f16/bf16 destinations;
//   - device-data errors: NaN rows for tokens outside the vocabulary and slots outside the buffer;
//   - the LM head over blocks (f32/f16/bf16 blocks, row and vocabulary tiles with tails, ignored
//     targets, several blocks with a short last one) against the CPU's blocks within rounding, and
//     the backward called per vocabulary tile equal to one call, bit for bit;
//   - MatmulForwardBf16 / MatmulBackwardBf16 against the CPU's within f32-summation rounding.
// Every test reports SKIPPED without a GPU, and in a build without --config=cuda — never passed.
#include "base/testing/gpu_gate.h"
#include "gtest/gtest.h"

#if PS_WITH_CUDA
#include <algorithm>
#include <array>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <memory>
#include <random>
#include <string>
#include <vector>

#include "absl/types/span.h"
#include "base/testing/status_matchers.h"
#include "base/testing/test_rng.h"
#include "memory/backend.h"
#include "memory/backend_factory.h"
#include "memory/dtype.h"
#include "memory/dtype_math.h"
#include "model/kernels/cuda/cuda_kernels.h"
#include "model/kernels/cuda/cuda_test_util.h"
#include "model/kernels/kernels.h"
#include "model/kernels/matmul.h"
#include "model/kernels/testing/kernel_test_util.h"
#include "model/kernels/vocab_blocks.h"
#endif

namespace ps {
namespace {

#if PS_WITH_CUDA

using ::ps::cuda_testing::DeviceVector;
using ::ps::kernel_testing::ExpectAllNear;
using ::ps::kernel_testing::RandomVector;

uint32_t Bits(float x) {
  uint32_t b;
  std::memcpy(&b, &x, sizeof(b));
  return b;
}

std::vector<uint16_t> To16(DType dtype, const std::vector<float>& x) {
  std::vector<uint16_t> out(x.size());
  for (size_t i = 0; i < x.size(); ++i) {
    out[i] = dtype == DType::kF16 ? FloatToHalfBits(x[i]) : FloatToBFloat16Bits(x[i]);
  }
  return out;
}

void ExpectBitEqual(const std::vector<float>& got, const std::vector<float>& want,
                    const std::string& what) {
  ASSERT_EQ(got.size(), want.size()) << what;
  int failures = 0;
  for (size_t i = 0; i < got.size() && failures < 5; ++i) {
    if (Bits(got[i]) != Bits(want[i]) && !(std::isnan(got[i]) && std::isnan(want[i]))) {
      ++failures;
      ADD_FAILURE() << what << "[" << i << "]: GPU " << got[i] << ", CPU " << want[i];
    }
  }
}

class CudaVocabBlocksTest : public ::testing::Test {
 protected:
  void SetUp() override {
    PS_REQUIRE_GPUS(1);
    ASSERT_OK_AND_ASSIGN(backend_, CreateBackend({.kind = "cuda", .capacity_bytes = 1 << 30}));
    ASSERT_OK_AND_ASSIGN(kernels_, cuda::CudaKernels::Create(backend_.get()));
    ASSERT_OK_AND_ASSIGN(stream_, backend_->CreateStream());
  }

  std::unique_ptr<Backend> backend_;
  std::unique_ptr<cuda::CudaKernels> kernels_;
  std::unique_ptr<Stream> stream_;
};

TEST_F(CudaVocabBlocksTest, EmbeddingBlocksAndPositionsMatchTheCpuBitForBit) {
  TestRng rng(21);
  for (DType dtype : {DType::kF32, DType::kF16, DType::kBF16}) {
    for (const auto& [B, T, C, V, block_rows] : std::vector<std::array<int64_t, 5>>{
             {1, 1, 1, 1, 1}, {2, 7, 5, 13, 4}, {3, 11, 33, 257, 100}, {4, 64, 130, 1000, 512}}) {
      SCOPED_TRACE(::testing::Message()
                   << DTypeName(dtype) << " B=" << B << " T=" << T << " C=" << C << " V=" << V);
      const int64_t N = B * T;
      std::uniform_int_distribution<int32_t> token(0, static_cast<int32_t>(V - 1));
      std::vector<int32_t> tokens(N);
      for (auto& t : tokens) t = token(rng);
      const std::vector<float> wte = RandomVector<float>(rng, V * C);
      const std::vector<uint16_t> wte16 = To16(dtype, wte);
      const std::vector<float> wpe = RandomVector<float>(rng, (T + 2) * C);
      std::vector<float> want(N * C, 0.0f);
      DeviceVector<int32_t> d_tokens(tokens);
      DeviceVector<float> d_out(want), d_wpe(wpe), d_wte(wte);
      DeviceVector<uint16_t> d_wte16(wte16.empty() ? std::vector<uint16_t>(1) : wte16);
      for (int64_t row_begin = 0; row_begin < V; row_begin += block_rows) {
        const VocabBlockShape s{.rows = N,
                                .channels = C,
                                .vocab_size = V,
                                .row_begin = row_begin,
                                .block_rows = std::min(block_rows, V - row_begin)};
        if (dtype == DType::kF32) {
          ASSERT_OK(EmbeddingBlockForward<float>(
              s, tokens, absl::MakeConstSpan(wte.data() + row_begin * C, s.block_rows * C),
              absl::MakeSpan(want), nullptr));
          ASSERT_OK(kernels_->EmbeddingBlockForward(*stream_, s, d_tokens.get(), dtype,
                                                    d_wte.get() + row_begin * C, d_out.get()));
        } else {
          ASSERT_OK(EmbeddingBlockForward(s, tokens, Block16{wte16.data() + row_begin * C, dtype},
                                          absl::MakeSpan(want), nullptr));
          ASSERT_OK(kernels_->EmbeddingBlockForward(*stream_, s, d_tokens.get(), dtype,
                                                    d_wte16.get() + row_begin * C, d_out.get()));
        }
      }
      ASSERT_OK(PositionEmbeddingForward<float>(B, T, C, wpe, absl::MakeSpan(want), nullptr));
      ASSERT_OK(
          kernels_->PositionEmbeddingForward(*stream_, B, T, C, T + 2, d_wpe.get(), d_out.get()));
      ASSERT_OK(stream_->Synchronize());
      ExpectBitEqual(d_out.Download(), want, "out");

      // Backward: position gradient and the scatter into touched rows.
      const std::vector<float> dout = RandomVector<float>(rng, N * C, -10, 10);
      std::vector<float> dwpe = RandomVector<float>(rng, (T + 2) * C);
      std::vector<int32_t> slots(V, -1);
      int32_t num_slots = 0;
      for (int32_t t : tokens) {
        if (slots[t] == -1 && t % 4 != 1) slots[t] = num_slots++;
      }
      num_slots = std::max(num_slots, 1);
      std::vector<float> rows = RandomVector<float>(rng, num_slots * C);
      DeviceVector<float> d_dout(dout), d_dwpe(dwpe), d_rows(rows);
      DeviceVector<int32_t> d_slots(slots);
      ASSERT_OK(PositionEmbeddingBackward<float>(B, T, C, dout, absl::MakeSpan(dwpe), nullptr));
      ASSERT_OK(ScatterRowsAdd<float>(C, tokens, slots, dout, absl::MakeSpan(rows), nullptr));
      ASSERT_OK(kernels_->PositionEmbeddingBackward(*stream_, B, T, C, T + 2, d_dout.get(),
                                                    d_dwpe.get()));
      const TouchedRowsShape touched{.channels = C, .vocab_size = V, .num_slots = num_slots};
      ASSERT_OK(kernels_->ScatterRowsAdd(*stream_, touched, N, d_tokens.get(), d_slots.get(),
                                         d_dout.get(), d_rows.get()));
      ASSERT_OK(stream_->Synchronize());
      ExpectBitEqual(d_dwpe.Download(), dwpe, "dwpe");
      ExpectBitEqual(d_rows.Download(), rows, "slot_rows");
    }
  }
}

TEST_F(CudaVocabBlocksTest, TouchedRowCopiesFollowTheirContract) {
  TestRng rng(23);
  const int64_t C = 37, V = 300, num_slots = 50;
  std::vector<int32_t> slots(V, -1);
  for (int32_t s = 0; s < num_slots; ++s) slots[(s * 7 + 3) % V] = s;
  DeviceVector<int32_t> d_slots(slots);
  const TouchedRowsShape shape{.channels = C, .vocab_size = V, .num_slots = num_slots};
  for (const auto& [row_begin, rows] :
       std::vector<std::array<int64_t, 2>>{{0, 1}, {0, V}, {5, 100}, {299, 1}, {128, 172}}) {
    // CopyRowsToSlots: the touched rows of src land in their slots; the other slots stay.
    const std::vector<float> src = RandomVector<float>(rng, rows * C);
    std::vector<float> slot_rows = RandomVector<float>(rng, num_slots * C);
    DeviceVector<float> d_src(src), d_slot_rows(slot_rows);
    ASSERT_OK(kernels_->CopyRowsToSlots(*stream_, shape, row_begin, rows, d_slots.get(),
                                        d_src.get(), d_slot_rows.get()));
    for (int64_t r = 0; r < rows; ++r) {
      const int32_t s = slots[row_begin + r];
      if (s >= 0) std::copy_n(src.begin() + r * C, C, slot_rows.begin() + s * C);
    }
    ASSERT_OK(stream_->Synchronize());
    ExpectBitEqual(d_slot_rows.Download(), slot_rows, "CopyRowsToSlots");
    // CopySlotsToRows: back into rows of dst in each dtype, untouched rows left alone.
    for (DType dtype : {DType::kF32, DType::kF16, DType::kBF16}) {
      const std::vector<float> dst0 = RandomVector<float>(rng, rows * C);
      std::vector<float> want = dst0;
      for (int64_t r = 0; r < rows; ++r) {
        const int32_t s = slots[row_begin + r];
        if (s >= 0) std::copy_n(slot_rows.begin() + s * C, C, want.begin() + r * C);
      }
      std::vector<float> got(rows * C);
      if (dtype == DType::kF32) {
        DeviceVector<float> d_dst(dst0);
        ASSERT_OK(kernels_->CopySlotsToRows(*stream_, shape, row_begin, rows, d_slots.get(),
                                            d_slot_rows.get(), dtype, d_dst.get()));
        ASSERT_OK(stream_->Synchronize());
        got = d_dst.Download();
        ExpectBitEqual(got, want, "CopySlotsToRows f32");
      } else {
        DeviceVector<uint16_t> d_dst(To16(dtype, dst0));
        ASSERT_OK(kernels_->CopySlotsToRows(*stream_, shape, row_begin, rows, d_slots.get(),
                                            d_slot_rows.get(), dtype, d_dst.get()));
        ASSERT_OK(stream_->Synchronize());
        EXPECT_EQ(d_dst.Download(), To16(dtype, want)) << DTypeName(dtype);
      }
    }
  }
}

TEST_F(CudaVocabBlocksTest, DeviceDataErrorsBecomeNaNRows) {
  const int64_t C = 4, V = 10;
  // Tokens 12 and -3 are outside the vocabulary: their rows come out NaN, the others are read.
  const std::vector<int32_t> tokens = {1, 12, -3, 9};
  std::vector<float> wte(V * C);
  for (int64_t i = 0; i < V * C; ++i) wte[i] = static_cast<float>(i);
  DeviceVector<int32_t> d_tokens(tokens);
  DeviceVector<float> d_wte(wte), d_out(std::vector<float>(4 * C, 0.0f));
  for (int64_t row_begin : {0, 5}) {
    ASSERT_OK(kernels_->EmbeddingBlockForward(
        *stream_,
        {.rows = 4, .channels = C, .vocab_size = V, .row_begin = row_begin, .block_rows = 5},
        d_tokens.get(), DType::kF32, d_wte.get() + row_begin * C, d_out.get()));
  }
  ASSERT_OK(stream_->Synchronize());
  const std::vector<float> out = d_out.Download();
  for (int64_t c = 0; c < C; ++c) {
    EXPECT_EQ(out[c], wte[1 * C + c]);
    EXPECT_TRUE(std::isnan(out[1 * C + c]));
    EXPECT_TRUE(std::isnan(out[2 * C + c]));
    EXPECT_EQ(out[3 * C + c], wte[9 * C + c]);
  }
  // A slot outside the buffer: the copied row is NaN.
  const std::vector<int32_t> slots = {0, 7, -1, 1, -1, -1, -1, -1, -1, -1};
  DeviceVector<int32_t> d_slots(slots);
  DeviceVector<float> d_rows(std::vector<float>(2 * C, 1.5f)), d_dst(std::vector<float>(4 * C, 0));
  ASSERT_OK(kernels_->CopySlotsToRows(*stream_, {.channels = C, .vocab_size = V, .num_slots = 2}, 0,
                                      4, d_slots.get(), d_rows.get(), DType::kF32, d_dst.get()));
  ASSERT_OK(stream_->Synchronize());
  const std::vector<float> dst = d_dst.Download();
  for (int64_t c = 0; c < C; ++c) {
    EXPECT_EQ(dst[c], 1.5f);
    EXPECT_TRUE(std::isnan(dst[C + c]));
    EXPECT_EQ(dst[2 * C + c], 0.0f);
    EXPECT_EQ(dst[3 * C + c], 1.5f);
  }
}

struct LmHeadCase {
  int64_t rows, channels, vocab, block_rows, row_tile, vocab_tile;
};

TEST_F(CudaVocabBlocksTest, LmHeadOverBlocksMatchesTheCpuBlocks) {
  TestRng rng(29);
  for (DType dtype : {DType::kF32, DType::kF16, DType::kBF16}) {
    for (const LmHeadCase& k : std::vector<LmHeadCase>{{1, 1, 1, 1, 1, 1},
                                                       {37, 19, 101, 32, 8, 16},
                                                       {64, 64, 500, 500, 256, 2048},
                                                       {130, 48, 1000, 256, 64, 128}}) {
      SCOPED_TRACE(::testing::Message()
                   << DTypeName(dtype) << " N=" << k.rows << " C=" << k.channels << " V=" << k.vocab
                   << " block_rows=" << k.block_rows);
      const int64_t N = k.rows, C = k.channels, V = k.vocab;
      const std::vector<float> h = RandomVector<float>(rng, N * C, -2, 2);
      const std::vector<float> wte = RandomVector<float>(rng, V * C, -1, 1);
      const std::vector<uint16_t> wte16 = To16(dtype, wte);
      std::uniform_int_distribution<int32_t> target(0, static_cast<int32_t>(V - 1));
      std::vector<int32_t> targets(N);
      for (int64_t n = 0; n < N; ++n) targets[n] = n % 5 == 3 ? -100 : target(rng);
      const double loss_grad = 0.75;
      // CPU: every block, in order.
      std::vector<float> state(3 * N), lse(N), dh = RandomVector<float>(rng, N * C);
      std::vector<float> dwte(V * C, 0.0f);
      const std::vector<float> dh0 = dh;
      LmHeadStateInit<float>(absl::MakeSpan(state));
      auto shape_of = [&](int64_t row_begin) {
        return VocabBlockShape{.rows = N,
                               .channels = C,
                               .vocab_size = V,
                               .row_begin = row_begin,
                               .block_rows = std::min(k.block_rows, V - row_begin),
                               .row_tile = k.row_tile,
                               .vocab_tile = k.vocab_tile};
      };
      const bool sixteen = dtype != DType::kF32;
      for (int64_t rb = 0; rb < V; rb += k.block_rows) {
        const VocabBlockShape s = shape_of(rb);
        std::vector<float> ws(LmHeadBlockForwardWorkspaceElems(s, sixteen));
        if (sixteen) {
          ASSERT_OK(LmHeadBlockForward(s, h, Block16{wte16.data() + rb * C, dtype}, targets,
                                       absl::MakeSpan(state), absl::MakeSpan(ws), nullptr));
        } else {
          ASSERT_OK(LmHeadBlockForward<float>(
              s, h, absl::MakeConstSpan(wte.data() + rb * C, s.block_rows * C), targets,
              absl::MakeSpan(state), absl::MakeSpan(ws), nullptr));
        }
      }
      ASSERT_OK_AND_ASSIGN(const double loss,
                           LmHeadFinish<float>(shape_of(0), targets, state, absl::MakeSpan(lse)));
      for (int64_t rb = 0; rb < V; rb += k.block_rows) {
        const VocabBlockShape s = shape_of(rb);
        std::vector<float> ws(LmHeadBlockBackwardWorkspaceElems(s, sixteen));
        auto on_tile = [&](int64_t v0, int64_t rows, const float* grad) {
          std::copy_n(grad, rows * C, dwte.begin() + v0 * C);
          return absl::OkStatus();
        };
        if (sixteen) {
          ASSERT_OK(LmHeadBlockBackward(s, h, Block16{wte16.data() + rb * C, dtype}, targets, lse,
                                        loss_grad, absl::MakeSpan(dh), absl::MakeSpan(ws), on_tile,
                                        nullptr));
        } else {
          ASSERT_OK(LmHeadBlockBackward<float>(
              s, h, absl::MakeConstSpan(wte.data() + rb * C, s.block_rows * C), targets, lse,
              loss_grad, absl::MakeSpan(dh), absl::MakeSpan(ws), on_tile, nullptr));
        }
      }
      // GPU: the same calls through the Kernels interface.
      DeviceVector<float> d_h(h), d_wte(wte), d_state(3 * N), d_lse(N), d_dh(dh0), d_dwte(V * C);
      DeviceVector<uint16_t> d_wte16(wte16);
      DeviceVector<int32_t> d_targets(targets);
      DeviceVector<double> d_loss(1);
      auto block_ptr = [&](int64_t rb) -> const void* {
        return sixteen ? static_cast<const void*>(d_wte16.get() + rb * C)
                       : static_cast<const void*>(d_wte.get() + rb * C);
      };
      ASSERT_OK(kernels_->LmHeadStateInit(*stream_, shape_of(0), d_state.get()));
      for (int64_t rb = 0; rb < V; rb += k.block_rows) {
        const VocabBlockShape s = shape_of(rb);
        DeviceVector<char> ws(kernels_->LmHeadBlockForwardWorkspaceBytes(s, dtype));
        ASSERT_OK(kernels_->LmHeadBlockForward(*stream_, s, d_h.get(), dtype, block_ptr(rb),
                                               d_targets.get(), d_state.get(), ws.get(),
                                               ws.size()));
        ASSERT_OK(stream_->Synchronize());  // before ws is freed
      }
      ASSERT_OK(kernels_->LmHeadFinish(*stream_, shape_of(0), d_targets.get(), d_state.get(),
                                       d_lse.get(), d_loss.get()));
      for (int64_t rb = 0; rb < V; rb += k.block_rows) {
        const VocabBlockShape s = shape_of(rb);
        DeviceVector<char> ws(kernels_->LmHeadBlockBackwardWorkspaceBytes(s, dtype));
        ASSERT_OK(kernels_->LmHeadBlockBackward(*stream_, s, d_h.get(), dtype, block_ptr(rb),
                                                d_targets.get(), d_lse.get(), loss_grad, d_dh.get(),
                                                d_dwte.get() + rb * C, ws.get(), ws.size()));
        ASSERT_OK(stream_->Synchronize());
      }
      const double gpu_loss = d_loss.Download()[0];
      EXPECT_NEAR(gpu_loss, loss, 1e-5 * std::max(1.0, std::abs(loss)));
      ExpectAllNear(d_lse.Download(), lse, 1e-5, 1e-5, "lse");
      // bf16: both round the dlogits tiles to bf16, so a dlogit within rounding of a tie may round
      // to neighbouring bf16 values: a relative 2^-8 of one term.
      const double atol = dtype == DType::kBF16 ? 2e-4 : 2e-5;
      ExpectAllNear(d_dh.Download(), dh, atol, 1e-4, "dh");
      ExpectAllNear(d_dwte.Download(), dwte, atol, 1e-4, "dblock");
    }
  }
}

TEST_F(CudaVocabBlocksTest, LmHeadBackwardPerVocabularyTileEqualsOneCall) {
  TestRng rng(31);
  for (DType dtype : {DType::kF32, DType::kBF16}) {
    const int64_t N = 45, C = 24, V = 70, tile = 16;
    const std::vector<float> h = RandomVector<float>(rng, N * C);
    const std::vector<float> wte = RandomVector<float>(rng, V * C);
    std::vector<int32_t> targets(N);
    for (int64_t n = 0; n < N; ++n) targets[n] = static_cast<int32_t>((n * 13) % V);
    const std::vector<float> lse = RandomVector<float>(rng, N, 3, 4);
    DeviceVector<float> d_h(h), d_wte(wte), d_lse(lse), d_dh1(N * C), d_dh2(N * C),
        d_dblock1(V * C), d_dblock2(V * C);
    DeviceVector<uint16_t> d_wte16(dtype == DType::kBF16 ? To16(dtype, wte)
                                                         : std::vector<uint16_t>(1));
    DeviceVector<int32_t> d_targets(targets);
    const void* block = dtype == DType::kBF16 ? static_cast<const void*>(d_wte16.get())
                                              : static_cast<const void*>(d_wte.get());
    const int64_t width = SizeOf(dtype);
    ASSERT_OK(kernels_->Zero(*stream_, d_dh1.get(), N * C * 4));
    ASSERT_OK(kernels_->Zero(*stream_, d_dh2.get(), N * C * 4));
    VocabBlockShape whole{.rows = N,
                          .channels = C,
                          .vocab_size = V,
                          .row_begin = 0,
                          .block_rows = V,
                          .row_tile = 8,
                          .vocab_tile = tile};
    DeviceVector<char> ws(kernels_->LmHeadBlockBackwardWorkspaceBytes(whole, dtype));
    ASSERT_OK(kernels_->LmHeadBlockBackward(*stream_, whole, d_h.get(), dtype, block,
                                            d_targets.get(), d_lse.get(), 1.0, d_dh1.get(),
                                            d_dblock1.get(), ws.get(), ws.size()));
    for (int64_t v0 = 0; v0 < V; v0 += tile) {
      VocabBlockShape s = whole;
      s.row_begin = v0;
      s.block_rows = std::min(tile, V - v0);
      ASSERT_OK(kernels_->LmHeadBlockBackward(*stream_, s, d_h.get(), dtype,
                                              static_cast<const char*>(block) + v0 * C * width,
                                              d_targets.get(), d_lse.get(), 1.0, d_dh2.get(),
                                              d_dblock2.get() + v0 * C, ws.get(), ws.size()));
    }
    ASSERT_OK(stream_->Synchronize());
    ExpectBitEqual(d_dh2.Download(), d_dh1.Download(), "dh");
    ExpectBitEqual(d_dblock2.Download(), d_dblock1.Download(), "dblock");
  }
}

TEST_F(CudaVocabBlocksTest, MatmulBf16MatchesTheCpu) {
  TestRng rng(37);
  for (const auto& [N, I, O] :
       std::vector<std::array<int64_t, 3>>{{1, 1, 1}, {7, 13, 5}, {64, 96, 130}, {129, 257, 65}}) {
    SCOPED_TRACE(::testing::Message() << "N=" << N << " I=" << I << " O=" << O);
    const MatmulShape s{.rows = N, .in_features = I, .out_features = O};
    const std::vector<float> x = RandomVector<float>(rng, N * I);
    const std::vector<uint16_t> w = To16(DType::kBF16, RandomVector<float>(rng, I * O));
    const std::vector<float> b = RandomVector<float>(rng, O);
    const std::vector<float> dy = RandomVector<float>(rng, N * O);
    std::vector<float> y(N * O), dx = RandomVector<float>(rng, N * I),
                                 dw = RandomVector<float>(rng, I * O),
                                 db = RandomVector<float>(rng, O);
    DeviceVector<float> d_x(x), d_b(b), d_y(N * O), d_dy(dy), d_dx(dx), d_dw(dw), d_db(db);
    DeviceVector<uint16_t> d_w(w);
    std::vector<float> fws(
        std::max(MatmulBf16ForwardWorkspaceElems(s), MatmulBf16BackwardWorkspaceElems(s)));
    ASSERT_OK(MatmulForwardBf16(s, x, w, b, absl::MakeSpan(y), absl::MakeSpan(fws), nullptr));
    ASSERT_OK(MatmulBackwardBf16(s, x, w, dy, absl::MakeSpan(dx), absl::MakeSpan(dw),
                                 absl::MakeSpan(db), absl::MakeSpan(fws), nullptr));
    DeviceVector<char> ws(std::max(kernels_->MatmulBf16ForwardWorkspaceBytes(s),
                                   kernels_->MatmulBf16BackwardWorkspaceBytes(s)));
    ASSERT_OK(kernels_->MatmulForwardBf16(*stream_, s, d_x.get(), d_w.get(), d_b.get(), d_y.get(),
                                          ws.get(), ws.size()));
    ASSERT_OK(kernels_->MatmulBackwardBf16(*stream_, s, d_x.get(), d_w.get(), d_dy.get(),
                                           d_dx.get(), d_dw.get(), d_db.get(), ws.get(),
                                           ws.size()));
    ASSERT_OK(stream_->Synchronize());
    // Same bf16 operands on both sides; only the f32 summation order differs.
    const double atol = 1e-5 * std::sqrt(static_cast<double>(std::max(I, std::max(O, N))));
    ExpectAllNear(d_y.Download(), y, atol, 1e-5, "y");
    ExpectAllNear(d_dx.Download(), dx, atol, 1e-5, "dx");
    ExpectAllNear(d_dw.Download(), dw, atol, 1e-5, "dw");
    ExpectAllNear(d_db.Download(), db, atol, 1e-5, "db");
  }
}

#else  // !PS_WITH_CUDA

TEST(CudaVocabBlocks, NotBuilt) { PS_REQUIRE_GPUS(1); }

#endif

}  // namespace
}  // namespace ps
