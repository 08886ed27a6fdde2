// ModelStateIo on its own (no GptModel): parameters set and read back, row blocks assembled under
// the whole tensor's name, staged reads of accelerator payloads across staging pieces, and the
// training state's table of contents against what VisitTrainingState visits.
#include "model/model_state_io.h"

#include <cstdint>
#include <cstring>
#include <map>
#include <memory>
#include <string>
#include <tuple>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/string_view.h"
#include "absl/types/span.h"
#include "base/status_macros.h"
#include "base/testing/status_matchers.h"
#include "chunk/chunk.h"
#include "chunk/chunk_layout.h"
#include "chunk/chunk_store.h"
#include "chunk/chunk_type.h"
#include "chunk/tensor_state.h"
#include "disk/chunk_swap.h"
#include "disk/testing/memory_chunk_swap.h"
#include "gtest/gtest.h"
#include "memory/backend.h"
#include "memory/cpu_backend.h"
#include "memory/device.h"
#include "memory/device_memory.h"
#include "memory/dtype.h"
#include "model/gpt2_checkpoint.h"
#include "model/gpt_config.h"
#include "model/model_config.h"
#include "scheduler/chunk_events.h"
#include "scheduler/chunk_manager.h"
#include "scheduler/disk_tier.h"
#include "scheduler/metronome.h"

namespace ps {
namespace {

using ::testing::AllOf;
using ::testing::HasSubstr;

// vocab 64 in row blocks of 24 rows (0:24, 24:48, 48:64), hidden 32, over chunks of 5120
// elements, so the parameters spread over several chunks.
constexpr int64_t kChunkElems = 5120;
constexpr int64_t kBlockRows = 24;
// Three f32 elements per staged piece: every tensor crosses piece boundaries.
constexpr int64_t kStagingBytes = 12;

GptConfig SmallConfig() {
  return GptConfig{.name = "small",
                   .vocab_size = 64,
                   .max_seq_len = 16,
                   .hidden = 32,
                   .num_layers = 2,
                   .num_heads = 4};
}

// Everything the state I/O works over, destroyed in the right order (the store before the
// memories, the I/O before the stream it waits on).
struct Rig {
  GptConfig config = SmallConfig();
  ModelConfig model_config = FromGptConfig(SmallConfig());
  std::unique_ptr<Backend> backend;
  std::unique_ptr<DeviceMemory> accelerator;
  std::unique_ptr<DeviceMemory> host;
  std::unique_ptr<ChunkStore> store;
  std::unique_ptr<Stream> compute_stream;
  std::unique_ptr<ChunkManager> manager;
  std::unique_ptr<ModelStateIo> io;
};

// With `swap`, the manager runs the disk tier over it at the tier's minimum host budget (two
// chunk indices' optimizer state): the state of every other index lives in the swap.
absl::StatusOr<std::unique_ptr<Rig>> MakeRig(int64_t payload_staging_bytes,
                                             ChunkEventListener* listener = nullptr,
                                             ChunkSwap* swap = nullptr) {
  auto rig = std::make_unique<Rig>();
  ASSIGN_OR_RETURN(rig->backend, CreateCpuBackend({.capacity_bytes = int64_t{64} << 20}));
  DeviceMemoryOptions memory_options;
  memory_options.chunk_block_bytes = kChunkElems * 4;
  ASSIGN_OR_RETURN(rig->accelerator, CreateAcceleratorMemory(rig->backend.get(), memory_options));
  ASSIGN_OR_RETURN(rig->host, CreateHostMemory(rig->backend.get(), memory_options));
  ASSIGN_OR_RETURN(ChunkLayout layout,
                   ChunkLayout::Build({.capacity_elems = kChunkElems},
                                      GptOperators(rig->config, {.vocab_block_rows = kBlockRows})));
  ASSIGN_OR_RETURN(rig->store,
                   ChunkStore::Create(std::move(layout), {.compute_dtype = DType::kF32}));
  ASSIGN_OR_RETURN(rig->compute_stream, rig->backend->CreateStream());
  ChunkManagerOptions manager_options;
  manager_options.listener = listener;
  if (swap != nullptr) {
    manager_options.disk =
        DiskTierOptions{.swap = swap,
                        .host_budget_bytes = DiskTierMinHostBytes(
                            kChunkElems * 4, rig->store->layout().num_data_chunks()),
                        .read_ahead = 1};
  }
  ASSIGN_OR_RETURN(rig->manager,
                   ChunkManager::Create(rig->store.get(), rig->backend.get(),
                                        rig->accelerator.get(), rig->host.get(), manager_options));
  const ChunkLayout& l = rig->store->layout();
  ModelStateIo::Parts parts{.model_config = &rig->model_config,
                            .config = &rig->config,
                            .dims = Gpt2Dims{.vocab_size = rig->config.vocab_size,
                                             .max_positions = rig->config.max_seq_len,
                                             .hidden = rig->config.hidden,
                                             .num_layers = rig->config.num_layers},
                            .store = rig->store.get(),
                            .manager = rig->manager.get(),
                            .accelerator = rig->accelerator.get(),
                            .compute_stream = rig->compute_stream.get(),
                            .payload_staging_bytes = payload_staging_bytes,
                            .param_tensors = {},
                            .row_blocks = {{}}};
  for (TensorId t = 0; t < l.num_tensor_ids(); ++t) {
    parts.param_tensors.push_back(t);
    if (const auto block = ParseRowBlockName(l.tensor(t).name); block.has_value()) {
      parts.row_blocks[0].push_back(
          {.tensor = t, .row_begin = block->row_begin, .rows = block->row_end - block->row_begin});
    }
  }
  rig->io = std::make_unique<ModelStateIo>(std::move(parts));
  return rig;
}

// A value no other (tensor, element) has, exact in f32.
float ValueOf(TensorId t, int64_t i) { return static_cast<float>(t * 8192 + i) * 0.25f; }

absl::Status FillDistinct(Rig& rig) {
  return rig.io->SetParameters([](TensorId t, absl::Span<float> out) {
    for (size_t i = 0; i < out.size(); ++i) out[i] = ValueOf(t, static_cast<int64_t>(i));
    return absl::OkStatus();
  });
}

TEST(ModelStateIoTest, SetParametersWritesMasterAndParamAndZeroesTheMoments) {
  ASSERT_OK_AND_ASSIGN(std::unique_ptr<Rig> rig, MakeRig(kStagingBytes));
  ASSERT_OK(FillDistinct(*rig));
  const ChunkLayout& l = rig->store->layout();
  for (TensorId t = 0; t < l.num_tensor_ids(); ++t) {
    const std::string& name = l.tensor(t).name;
    SCOPED_TRACE(name);
    std::vector<float> expected(static_cast<size_t>(l.tensor(t).numel));
    for (size_t i = 0; i < expected.size(); ++i) expected[i] = ValueOf(t, static_cast<int64_t>(i));
    EXPECT_THAT(rig->io->ReadTensor(ChunkType::kMaster, name), IsOkAndHolds(expected));
    EXPECT_THAT(rig->io->ReadTensor(ChunkType::kParam, name), IsOkAndHolds(expected));
    EXPECT_THAT(rig->io->ReadTensor(ChunkType::kMomentum, name),
                IsOkAndHolds(std::vector<float>(expected.size(), 0.0f)));
  }
}

TEST(ModelStateIoTest, ReadsRowBlocksUnderTheWholeTensorsName) {
  ASSERT_OK_AND_ASSIGN(std::unique_ptr<Rig> rig, MakeRig(kStagingBytes));
  ASSERT_OK(FillDistinct(*rig));
  const ChunkLayout& l = rig->store->layout();
  // wte.weight is the blocks' rows in order.
  std::vector<float> expected;
  for (const auto& [begin, end] : {std::pair<int64_t, int64_t>{0, 24}, {24, 48}, {48, 64}}) {
    ASSERT_OK_AND_ASSIGN(const TensorId t, l.FindTensor(RowBlockNameOf("wte.weight", begin, end)));
    for (int64_t i = 0; i < (end - begin) * 32; ++i) expected.push_back(ValueOf(t, i));
  }
  ASSERT_EQ(expected.size(), 64 * 32);
  EXPECT_THAT(rig->io->ReadTensor(ChunkType::kMaster, "wte.weight"), IsOkAndHolds(expected));
  // A range across the first block boundary, and one inside the last block.
  for (const auto& [first, n] : {std::pair<int64_t, int64_t>{24 * 32 - 5, 11}, {50 * 32 + 3, 7}}) {
    std::vector<float> out(static_cast<size_t>(n));
    ASSERT_OK(
        rig->io->ReadTensorRange(ChunkType::kMaster, "wte.weight", first, absl::MakeSpan(out)));
    EXPECT_EQ(out, std::vector<float>(expected.begin() + first, expected.begin() + first + n));
  }
  std::vector<float> out(3);
  EXPECT_THAT(
      rig->io->ReadTensorRange(ChunkType::kMaster, "wte.weight", 64 * 32 - 2, absl::MakeSpan(out)),
      StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("outside")));
  EXPECT_THAT(rig->io->ReadTensorInto(ChunkType::kMaster, "wte.weight", absl::MakeSpan(out)),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("2048 elements")));
  EXPECT_THAT(rig->io->ReadTensor(ChunkType::kMaster, "no.such.weight"),
              StatusIs(absl::StatusCode::kNotFound));
}

TEST(ModelStateIoTest, StagesAcceleratorPayloadsPieceByPiece) {
  ASSERT_OK_AND_ASSIGN(std::unique_ptr<Rig> rig, MakeRig(kStagingBytes));
  ASSERT_OK(FillDistinct(*rig));
  const ChunkLayout& l = rig->store->layout();
  // Every master chunk onto the accelerator, where it stays after the release.
  for (int64_t c = 0; c < l.num_chunks(); ++c) {
    if (l.TensorsInChunk(c).empty()) continue;
    ASSERT_OK(rig->manager->AccessChunks(c, {ChunkType::kMaster}, Device::Accelerator(),
                                         AccessMode::kRead));
    ASSERT_OK(rig->manager->ReleaseChunks(c, {ChunkType::kMaster}));
  }
  for (TensorId t = 0; t < l.num_tensor_ids(); ++t) {
    SCOPED_TRACE(l.tensor(t).name);
    ASSERT_OK_AND_ASSIGN(const TensorView v, rig->store->View(ChunkType::kMaster, t));
    ASSERT_FALSE(v.device.is_host());
    std::vector<float> expected(static_cast<size_t>(v.numel));
    for (size_t i = 0; i < expected.size(); ++i) expected[i] = ValueOf(t, static_cast<int64_t>(i));
    EXPECT_THAT(rig->io->ReadTensor(ChunkType::kMaster, l.tensor(t).name), IsOkAndHolds(expected));
  }
}

TEST(ModelStateIoTest, TrainingStateTensorsAreWhatVisitTrainingStateVisits) {
  ASSERT_OK_AND_ASSIGN(std::unique_ptr<Rig> rig, MakeRig(kStagingBytes));
  ASSERT_OK(FillDistinct(*rig));
  using Visit = std::tuple<std::string, ChunkType, size_t>;
  std::vector<Visit> visited;
  ASSERT_OK(rig->io->VisitTrainingState(
      [&](absl::string_view name, ChunkType type, absl::Span<const float> values) {
        visited.emplace_back(std::string(name), type, values.size());
        return absl::OkStatus();
      }));
  std::vector<Visit> listed;
  for (const TrainingStateTensor& t : rig->io->TrainingStateTensors()) {
    size_t numel = 1;
    for (int64_t d : t.shape) numel *= static_cast<size_t>(d);
    listed.emplace_back(t.name, t.type, numel);
  }
  EXPECT_EQ(visited, listed);
  // Every stored parameter, each as master, momentum, variance in turn.
  const std::vector<std::string> names = rig->io->ParameterNames();
  ASSERT_EQ(listed.size(), 3 * names.size());
  for (size_t i = 0; i < names.size(); ++i) {
    EXPECT_EQ(std::get<0>(listed[3 * i]), names[i]);
    EXPECT_EQ(std::get<1>(listed[3 * i]), ChunkType::kMaster);
    EXPECT_EQ(std::get<1>(listed[3 * i + 1]), ChunkType::kMomentum);
    EXPECT_EQ(std::get<1>(listed[3 * i + 2]), ChunkType::kVariance);
  }
}

TEST(ModelStateIoTest, LoadTrainingStateIsWhatVisitTrainingStateReadsBack) {
  ASSERT_OK_AND_ASSIGN(std::unique_ptr<Rig> rig, MakeRig(kStagingBytes));
  auto value = [](absl::string_view name, ChunkType type, size_t i) {
    return static_cast<float>(name.size() * 1000 + static_cast<size_t>(type) * 100 + i % 97);
  };
  ASSERT_OK(rig->io->LoadTrainingState(
      [&](absl::string_view name, ChunkType type, absl::Span<float> out) {
        for (size_t i = 0; i < out.size(); ++i) out[i] = value(name, type, i);
        return absl::OkStatus();
      }));
  int visits = 0;
  ASSERT_OK(rig->io->VisitTrainingState(
      [&](absl::string_view name, ChunkType type, absl::Span<const float> values) {
        for (size_t i = 0; i < values.size(); ++i) {
          if (values[i] != value(name, type, i)) {
            return absl::InternalError(absl::StrCat(name, " element ", i, " differs"));
          }
        }
        ++visits;
        return absl::OkStatus();
      }));
  EXPECT_EQ(visits, static_cast<int>(rig->io->TrainingStateTensors().size()));
  // The param slot holds the master value (f32 chunks: exactly).
  for (const std::string& name : rig->io->ParameterNames()) {
    ASSERT_OK_AND_ASSIGN(std::vector<float> param, rig->io->ReadTensor(ChunkType::kParam, name));
    for (size_t i = 0; i < param.size(); ++i) {
      ASSERT_EQ(param[i], value(name, ChunkType::kMaster, i)) << name << " " << i;
    }
  }
  const absl::Status failed =
      rig->io->LoadTrainingState([](absl::string_view, ChunkType, absl::Span<float>) {
        return absl::DataLossError("bad file");
      });
  EXPECT_THAT(failed, StatusIs(absl::StatusCode::kDataLoss, HasSubstr("bad file")));
}

// Stands in for the disk tier (scheduler/, not wired here): it records the manager's optimizer
// accesses and, when chunk index `c` is accessed, writes the bytes saved for it back into the
// payloads the manager gave the chunks — what the tier's load from the swap file does. Everything
// runs on the test's thread (host accesses copy nothing, so no copy-stream callback comes).
class DiskTierStandIn : public ChunkEventListener {
 public:
  void OnChunkMove(const ChunkMoveEvent&) override {}
  void OnAccess(const ChunkAccessEvent& event) override {
    accesses.push_back(event.chunk_index);
    for (const auto& [key, bytes] : saved) {
      if (key.second != event.chunk_index) continue;
      Chunk& chunk = store->chunk(key.first, key.second);
      if (chunk.tensor_count(TensorState::kCompute) == 0) continue;  // not this access's type
      std::memcpy(chunk.payload(), bytes.data(), bytes.size());
    }
  }
  void OnRelease(absl::string_view, int64_t chunk_index, Stage, int64_t) override {
    releases.push_back(chunk_index);
  }

  // Saves the payload of chunk `c` of `type` and releases it (its bytes "on disk").
  absl::Status Evict(ChunkType type, int64_t c) {
    Chunk& chunk = store->chunk(type, c);
    std::vector<char>& bytes = saved[{type, c}];
    bytes.resize(static_cast<size_t>(chunk.capacity_bytes()));
    std::memcpy(bytes.data(), chunk.payload(), bytes.size());
    return chunk.ReleasePayload();
  }

  ChunkStore* store = nullptr;
  std::map<std::pair<ChunkType, int64_t>, std::vector<char>> saved;
  std::vector<int64_t> accesses;
  std::vector<int64_t> releases;
};

// A value per (name, type, element), exact in f32.
float StateValue(absl::string_view name, ChunkType type, size_t i) {
  return static_cast<float>(name.size() * 1000 + static_cast<size_t>(type) * 100 + i % 97);
}

struct DiskRig {
  DiskTierStandIn tier;
  std::unique_ptr<Rig> rig;
  // A chunk index holding at least two tensors, and their names.
  int64_t chunk = -1;
  std::vector<std::string> names;
};

absl::StatusOr<std::unique_ptr<DiskRig>> MakeDiskRig() {
  auto d = std::make_unique<DiskRig>();
  ASSIGN_OR_RETURN(d->rig, MakeRig(kStagingBytes, &d->tier));
  d->tier.store = d->rig->store.get();
  RETURN_IF_ERROR(d->rig->io->LoadTrainingState(
      [](absl::string_view name, ChunkType type, absl::Span<float> out) {
        for (size_t i = 0; i < out.size(); ++i) out[i] = StateValue(name, type, i);
        return absl::OkStatus();
      }));
  const ChunkLayout& l = d->rig->store->layout();
  for (int64_t c = 0; c < l.num_chunks() && d->chunk < 0; ++c) {
    if (l.TensorsInChunk(c).size() >= 2) d->chunk = c;
  }
  if (d->chunk < 0) return absl::InternalError("no chunk holds two tensors");
  for (TensorId t : l.TensorsInChunk(d->chunk)) d->names.push_back(l.tensor(t).name);
  d->tier.accesses.clear();
  d->tier.releases.clear();
  return d;
}

absl::Status ExpectState(const std::vector<float>& values, absl::string_view name, ChunkType type) {
  for (size_t i = 0; i < values.size(); ++i) {
    if (values[i] != StateValue(name, type, i)) {
      return absl::InternalError(absl::StrCat(name, " ", ChunkTypeName(type), " element ", i,
                                              " is ", values[i], ", not ",
                                              StateValue(name, type, i)));
    }
  }
  return absl::OkStatus();
}

// The real tier (scheduler/disk_tier.h over an in-memory swap that checks every read against what
// was written) instead of the stand-in: the training state loaded into the model goes to the swap
// beyond the budget, and reads back exactly (ReadTensor, VisitTrainingState), twice over, after a
// second load that overwrites what the swap holds.
TEST(ModelStateIoDiskTest, TrainingStateRoundTripsThroughTheRealDiskTier) {
  MemoryChunkSwap swap;
  ASSERT_OK_AND_ASSIGN(std::unique_ptr<Rig> rig, MakeRig(kStagingBytes, nullptr, &swap));
  ASSERT_NE(rig->manager->disk_tier(), nullptr);
  ASSERT_GT(rig->store->layout().num_data_chunks(), 2) << "the budget must not hold every index";
  for (const float offset : {0.0f, 0.5f}) {
    SCOPED_TRACE(absl::StrCat("offset ", offset));
    const auto value = [offset](absl::string_view name, ChunkType type, size_t i) {
      return StateValue(name, type, i) + offset;
    };
    ASSERT_OK(rig->io->LoadTrainingState(
        [&](absl::string_view name, ChunkType type, absl::Span<float> out) {
          for (size_t i = 0; i < out.size(); ++i) out[i] = value(name, type, i);
          return absl::OkStatus();
        }));
    const ChunkSwapCounters before = swap.counters();
    int64_t visits = 0;
    ASSERT_OK(rig->io->VisitTrainingState(
        [&](absl::string_view name, ChunkType type, absl::Span<const float> values) {
          ++visits;
          for (size_t i = 0; i < values.size(); ++i) {
            if (values[i] != value(name, type, i)) {
              return absl::InternalError(
                  absl::StrCat(name, " ", ChunkTypeName(type), " element ", i, " is ", values[i]));
            }
          }
          return absl::OkStatus();
        }));
    EXPECT_EQ(visits, static_cast<int64_t>(rig->io->TrainingStateTensors().size()));
    EXPECT_GT(swap.counters().reads, before.reads) << "the visit read state back from the swap";
    EXPECT_GT(swap.counters().writes, 0) << "the load spilled state to the swap";
    for (const TrainingStateTensor& t : rig->io->TrainingStateTensors()) {
      ASSERT_OK_AND_ASSIGN(std::vector<float> v, rig->io->ReadTensor(t.type, t.name));
      for (size_t i = 0; i < v.size(); ++i) {
        ASSERT_EQ(v[i], value(t.name, t.type, i)) << t.name << " " << ChunkTypeName(t.type);
      }
    }
  }
  EXPECT_EQ(swap.in_flight(), 0);
}

TEST(ModelStateIoDiskTest, PayloadsInMemoryAreReadWithoutTheManager) {
  ASSERT_OK_AND_ASSIGN(std::unique_ptr<DiskRig> d, MakeDiskRig());
  for (const std::string& name : d->names) {
    ASSERT_OK_AND_ASSIGN(std::vector<float> m, d->rig->io->ReadTensor(ChunkType::kMomentum, name));
    EXPECT_OK(ExpectState(m, name, ChunkType::kMomentum));
  }
  ASSERT_OK(d->rig->io->VisitTrainingState(
      [](absl::string_view name, ChunkType type, absl::Span<const float> values) {
        return ExpectState(std::vector<float>(values.begin(), values.end()), name, type);
      }));
  EXPECT_TRUE(d->tier.accesses.empty());
  EXPECT_TRUE(d->tier.releases.empty());
}

TEST(ModelStateIoDiskTest, ChunksOnDiskAreReadThroughTheManagerAndReleased) {
  ASSERT_OK_AND_ASSIGN(std::unique_ptr<DiskRig> d, MakeDiskRig());
  const int64_t c = d->chunk;
  ChunkStore& store = *d->rig->store;
  for (ChunkType type : {ChunkType::kMomentum, ChunkType::kVariance}) {
    ASSERT_OK(d->tier.Evict(type, c));
  }
  // One tensor: the chunk is accessed, read, released.
  const std::string& name = d->names[1];
  ASSERT_OK_AND_ASSIGN(std::vector<float> v, d->rig->io->ReadTensor(ChunkType::kVariance, name));
  EXPECT_OK(ExpectState(v, name, ChunkType::kVariance));
  EXPECT_EQ(d->tier.accesses, std::vector<int64_t>{c});
  EXPECT_EQ(d->tier.releases, std::vector<int64_t>{c});
  for (ChunkType type : {ChunkType::kMomentum, ChunkType::kVariance}) {
    EXPECT_TRUE(store.chunk(type, c).has_payload());
    EXPECT_EQ(store.chunk(type, c).tensor_count(TensorState::kCompute), 0);
  }
  // A range of it, through ReadTensorRange.
  ASSERT_OK(d->tier.Evict(ChunkType::kMomentum, c));
  ASSERT_OK(d->tier.Evict(ChunkType::kVariance, c));
  d->tier.accesses.clear();
  d->tier.releases.clear();
  std::vector<float> range(5);
  ASSERT_OK(d->rig->io->ReadTensorRange(ChunkType::kMomentum, name, 3, absl::MakeSpan(range)));
  for (size_t i = 0; i < range.size(); ++i) {
    EXPECT_EQ(range[i], StateValue(name, ChunkType::kMomentum, i + 3));
  }
  EXPECT_EQ(d->tier.accesses, std::vector<int64_t>{c});
  EXPECT_EQ(d->tier.releases, std::vector<int64_t>{c});
}

TEST(ModelStateIoDiskTest, VisitTrainingStateAccessesAChunkOnceForItsTensors) {
  ASSERT_OK_AND_ASSIGN(std::unique_ptr<DiskRig> d, MakeDiskRig());
  const int64_t c = d->chunk;
  for (ChunkType type : {ChunkType::kMaster, ChunkType::kMomentum, ChunkType::kVariance}) {
    ASSERT_OK(d->tier.Evict(type, c));
  }
  int64_t visits = 0;
  ASSERT_OK(d->rig->io->VisitTrainingState(
      [&](absl::string_view name, ChunkType type, absl::Span<const float> values) {
        ++visits;
        return ExpectState(std::vector<float>(values.begin(), values.end()), name, type);
      }));
  EXPECT_EQ(visits, static_cast<int64_t>(d->rig->io->TrainingStateTensors().size()));
  // Every tensor of the chunk, three types each: one access.
  EXPECT_EQ(d->tier.accesses, std::vector<int64_t>{c});
  EXPECT_EQ(d->tier.releases, std::vector<int64_t>{c});
  EXPECT_EQ(d->rig->store->chunk(ChunkType::kMaster, c).tensor_count(TensorState::kCompute), 0);
}

TEST(ModelStateIoDiskTest, AFailedVisitStillReleasesTheChunk) {
  ASSERT_OK_AND_ASSIGN(std::unique_ptr<DiskRig> d, MakeDiskRig());
  const int64_t c = d->chunk;
  ASSERT_OK(d->tier.Evict(ChunkType::kMomentum, c));
  const std::string& failing = d->names[0];
  EXPECT_THAT(d->rig->io->VisitTrainingState(
                  [&](absl::string_view name, ChunkType type, absl::Span<const float>) {
                    if (name == failing && type == ChunkType::kMomentum) {
                      return absl::DataLossError("disk full");
                    }
                    return absl::OkStatus();
                  }),
              StatusIs(absl::StatusCode::kDataLoss, HasSubstr("disk full")));
  EXPECT_EQ(d->tier.accesses, std::vector<int64_t>{c});
  EXPECT_EQ(d->tier.releases, std::vector<int64_t>{c});
  EXPECT_EQ(d->rig->store->chunk(ChunkType::kMomentum, c).tensor_count(TensorState::kCompute), 0);
  // The model is usable: the next read works.
  ASSERT_OK_AND_ASSIGN(std::vector<float> m, d->rig->io->ReadTensor(ChunkType::kMomentum, failing));
  EXPECT_OK(ExpectState(m, failing, ChunkType::kMomentum));
}

TEST(ModelStateIoDiskTest, AChunkOnDiskIsNotLoadedInsideAnIteration) {
  ASSERT_OK_AND_ASSIGN(std::unique_ptr<DiskRig> d, MakeDiskRig());
  ASSERT_OK(d->tier.Evict(ChunkType::kMaster, d->chunk));
  ASSERT_OK(d->rig->manager->BeginIteration());
  EXPECT_THAT(d->rig->io->ReadTensor(ChunkType::kMaster, d->names[0]),
              StatusIs(absl::StatusCode::kFailedPrecondition,
                       AllOf(HasSubstr("is not in memory"), HasSubstr("after EndIteration"))));
  // What is in memory is still read there (a gradient between backward and the step).
  ASSERT_OK_AND_ASSIGN(std::vector<float> m,
                       d->rig->io->ReadTensor(ChunkType::kMomentum, d->names[0]));
  EXPECT_OK(ExpectState(m, d->names[0], ChunkType::kMomentum));
  ASSERT_OK(d->rig->manager->EndIteration());
  EXPECT_TRUE(d->tier.accesses.empty());
}

}  // namespace
}  // namespace ps
