// GptModel on the emulated accelerator: the untrained loss, bit-exact agreement with the
// host-buffer reference model (model/kernels/testing/tiny_gpt2) for f32, f16 and bf16 param
// chunks (with and without activation checkpointing), checkpoint import/export, and the errors.
// Whole training iterations with the optimizer step (exactness under eviction, overfitting,
// checkpointing's memory, training-state round trips) are the trainer's: trainer/train_step_test.
#include "model/gpt_model.h"

#include <atomic>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <map>
#include <memory>
#include <optional>
#include <random>
#include <sstream>
#include <string>
#include <vector>

#include "absl/random/random.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/str_cat.h"
#include "absl/types/span.h"
#include "base/status_macros.h"
#include "base/testing/status_matchers.h"
#include "base/thread_pool.h"
#include "base/units.h"
#include "chunk/chunk_layout.h"
#include "chunk/chunk_store.h"
#include "chunk/chunk_type.h"
#include "glog/logging.h"
#include "gtest/gtest.h"
#include "memory/convert.h"
#include "memory/cpu_backend.h"
#include "memory/device_memory.h"
#include "memory/dtype.h"
#include "model/gpt2_checkpoint.h"
#include "model/gpt_activation_profile.h"
#include "model/gpt_config.h"
#include "model/hf_checkpoint.h"
#include "model/kernels/internal/bf16_gemm.h"
#include "model/kernels/kernels.h"
#include "model/kernels/kernels_factory.h"
#include "model/kernels/testing/tiny_gpt2.h"
#include "scheduler/activation_profile.h"
#include "scheduler/chunk_manager.h"

namespace ps {
namespace {

using ::testing::AllOf;
using ::testing::HasSubstr;

// The reference model's default shape: vocab 64, 16 positions, 32 channels, 2 layers, 4 heads.
GptConfig SmallConfig(int64_t num_layers = 2) {
  return GptConfig{.name = "small",
                   .vocab_size = 64,
                   .max_seq_len = 16,
                   .hidden = 32,
                   .num_layers = num_layers,
                   .num_heads = 4};
}

// Chunks of 5120 elements: the largest operator of the small configs (mlp.c_fc, 4224 elements)
// fits, and the model spreads over several chunks.
constexpr int64_t kChunkElems = 5120;

struct RigOptions {
  DType dtype = DType::kF32;
  int64_t chunk_elems = kChunkElems;
  int64_t capacity_bytes = 64 * kMiB;
  // ChunkManagerOptions::device_budget_bytes (unset: the capacity).
  std::optional<int64_t> budget_bytes;
  double warmup_chunk_fraction = 0.2;
  // wte in row blocks of this many rows (0: whole).
  int64_t vocab_block_rows = 0;
  // The cpu backend holds all stream work until the host waits (memory/cpu_backend.h), so any
  // host read of a result it did not wait for sees stale memory.
  bool stall_streams_until_host_waits = false;
  // The rig creates the kernels and the compute stream and gives the stream to the manager too
  // (as the trainer does); otherwise the model creates its own.
  bool shared_compute_stream = false;
  GptModelOptions model = {.batch = 2,
                           .seq_len = 16,
                           .threads = 2,
                           .attention_tile = 5,
                           .ce_row_tile = 7,
                           .ce_vocab_tile = 24};
};

// Everything one model needs, destroyed in the right order (the store before the memories).
struct Rig {
  std::unique_ptr<Backend> backend;
  std::unique_ptr<DeviceMemory> accelerator;
  std::unique_ptr<DeviceMemory> host;
  std::unique_ptr<ChunkStore> store;
  std::unique_ptr<ThreadPool> kernel_pool;
  std::unique_ptr<Kernels> kernels;
  std::unique_ptr<Stream> compute_stream;
  std::unique_ptr<ChunkManager> manager;
  std::unique_ptr<GptModel> model;
};

absl::StatusOr<std::unique_ptr<Rig>> MakeRig(const GptConfig& config, const RigOptions& o) {
  auto rig = std::make_unique<Rig>();
  ASSIGN_OR_RETURN(rig->backend, CreateCpuBackend({.capacity_bytes = o.capacity_bytes,
                                                   .stall_streams_until_host_waits =
                                                       o.stall_streams_until_host_waits}));
  DeviceMemoryOptions memory_options;
  memory_options.chunk_block_bytes = o.chunk_elems * 4;
  ASSIGN_OR_RETURN(rig->accelerator, CreateAcceleratorMemory(rig->backend.get(), memory_options));
  ASSIGN_OR_RETURN(rig->host, CreateHostMemory(rig->backend.get(), memory_options));
  ASSIGN_OR_RETURN(
      ChunkLayout layout,
      ChunkLayout::Build({.capacity_elems = o.chunk_elems},
                         GptOperators(config, {.vocab_block_rows = o.vocab_block_rows})));
  ASSIGN_OR_RETURN(rig->store, ChunkStore::Create(std::move(layout), {.compute_dtype = o.dtype}));
  ChunkManagerOptions manager_options;
  manager_options.device_budget_bytes = o.budget_bytes;
  manager_options.warmup_chunk_fraction = o.warmup_chunk_fraction;
  GptModelOptions model_options = o.model;
  if (o.shared_compute_stream) {
    rig->kernel_pool = std::make_unique<ThreadPool>(o.model.threads);
    ASSIGN_OR_RETURN(rig->kernels,
                     CreateKernels(rig->backend.get(), {.cpu_pool = rig->kernel_pool.get()}));
    ASSIGN_OR_RETURN(rig->compute_stream, rig->backend->CreateStream());
    manager_options.compute_stream = rig->compute_stream.get();
    model_options.kernels = rig->kernels.get();
    model_options.compute_stream = rig->compute_stream.get();
  }
  ASSIGN_OR_RETURN(rig->manager,
                   ChunkManager::Create(rig->store.get(), rig->backend.get(),
                                        rig->accelerator.get(), rig->host.get(), manager_options));
  ASSIGN_OR_RETURN(rig->model, GptModel::Create(config, rig->store.get(), rig->manager.get(),
                                                rig->accelerator.get(), model_options));
  return rig;
}

struct Batch {
  std::vector<int32_t> tokens, targets;
};

// Random tokens; targets are the next token, with a few positions ignored.
Batch RandomBatch(const GptConfig& config, int64_t batch, int64_t seq_len, uint32_t seed) {
  std::mt19937 gen(seed);
  Batch b;
  const int64_t n = batch * seq_len;
  for (int64_t i = 0; i < n + 1; ++i) {
    b.tokens.push_back(static_cast<int32_t>(gen() % static_cast<uint32_t>(config.vocab_size)));
  }
  b.targets.assign(b.tokens.begin() + 1, b.tokens.end());
  b.tokens.pop_back();
  b.targets[3] = GptModel::kIgnoreIndex;
  return b;
}

// The Hugging Face names (wte whole), whatever the layout.
std::vector<std::string> ParamNames(const GptConfig& config) {
  std::vector<std::string> names;
  for (const OperatorSpec& op : GptOperators(config)) {
    for (const TensorSpec& t : op.tensors) names.push_back(t.name);
  }
  return names;
}

// Every parameter-chunk slot, by name (parameters before backward, gradients after).
absl::StatusOr<std::vector<std::vector<float>>> ReadAll(const GptModel& model, ChunkType type) {
  std::vector<std::vector<float>> out;
  for (const std::string& name : ParamNames(model.config())) {
    ASSIGN_OR_RETURN(std::vector<float> v, model.ReadTensor(type, name));
    out.push_back(std::move(v));
  }
  return out;
}

bool BitEqual(const std::vector<float>& a, const std::vector<float>& b) {
  return a.size() == b.size() && std::memcmp(a.data(), b.data(), a.size() * sizeof(float)) == 0;
}

kernel_testing::TinyGpt2Config ReferenceConfig(const GptConfig& c, const GptModelOptions& o) {
  return kernel_testing::TinyGpt2Config{.vocab_size = c.vocab_size,
                                        .max_seq_len = c.max_seq_len,
                                        .channels = c.hidden,
                                        .num_layers = c.num_layers,
                                        .num_heads = c.num_heads,
                                        .attention_tile = o.attention_tile,
                                        .ce_row_tile = o.ce_row_tile,
                                        .ce_vocab_tile = o.ce_vocab_tile};
}

// --- 1. The untrained loss ---------------------------------------------------------------------

TEST(GptModel, UntrainedLossIsLnVocab) {
  ASSERT_OK_AND_ASSIGN(GptConfig config, GptPreset("tiny"));
  RigOptions o;
  o.chunk_elems = 20480;  // the embedding operator: (256 + 64) x 64
  o.model.seq_len = 64;
  ASSERT_OK_AND_ASSIGN(std::unique_ptr<Rig> rig, MakeRig(config, o));
  ASSERT_OK(rig->model->InitializeParameters(7));
  const Batch batch = RandomBatch(config, 2, 64, 1);
  ASSERT_OK_AND_ASSIGN(const double eval_loss, rig->model->Evaluate(batch.tokens, batch.targets));
  EXPECT_NEAR(eval_loss, std::log(256.0), 0.05);
  ASSERT_OK(rig->manager->BeginIteration());
  ASSERT_OK_AND_ASSIGN(const double loss, rig->model->ForwardBackward(batch.tokens, batch.targets));
  ASSERT_OK(rig->manager->EndIteration());
  // Evaluation and training run the same kernels on the same parameters.
  EXPECT_EQ(loss, eval_loss);
  // Every activation went back to the scratch allocator.
  EXPECT_EQ(rig->accelerator->scratch()->stats().in_use_bytes, 0);
}

TEST(GptModel, InitializationIsGpt2sAndReproducible) {
  const GptConfig config = SmallConfig();
  ASSERT_OK_AND_ASSIGN(std::unique_ptr<Rig> a, MakeRig(config, {}));
  ASSERT_OK_AND_ASSIGN(std::unique_ptr<Rig> b, MakeRig(config, {}));
  ASSERT_OK(a->model->InitializeParameters(11));
  ASSERT_OK(b->model->InitializeParameters(11));
  ASSERT_OK_AND_ASSIGN(auto pa, ReadAll(*a->model, ChunkType::kParam));
  ASSERT_OK_AND_ASSIGN(auto pb, ReadAll(*b->model, ChunkType::kParam));
  ASSERT_OK_AND_ASSIGN(auto ma, ReadAll(*a->model, ChunkType::kMaster));
  const std::vector<std::string> names = ParamNames(config);
  for (size_t i = 0; i < names.size(); ++i) {
    EXPECT_TRUE(BitEqual(pa[i], pb[i])) << names[i];
    EXPECT_TRUE(BitEqual(pa[i], ma[i])) << names[i];
    const std::vector<float>& v = pa[i];
    double sum = 0, sum_sq = 0;
    for (float x : v) {
      sum += x;
      sum_sq += static_cast<double>(x) * x;
    }
    const double mean = sum / v.size(), std = std::sqrt(sum_sq / v.size() - mean * mean);
    if (names[i].find("ln_") != std::string::npos) {
      EXPECT_EQ(mean, names[i].ends_with(".weight") ? 1.0 : 0.0) << names[i];
      EXPECT_EQ(std, 0.0) << names[i];
    } else if (names[i].ends_with(".bias")) {
      EXPECT_EQ(sum_sq, 0.0) << names[i];
    } else {
      const double expected = names[i].ends_with("c_proj.weight") ? 0.01 : 0.02;  // 0.02/sqrt(4)
      EXPECT_NEAR(std, expected, 0.1 * expected) << names[i];
      EXPECT_NEAR(mean, 0.0, 0.1 * expected) << names[i];
    }
  }
  ASSERT_OK(b->model->InitializeParameters(12));
  ASSERT_OK_AND_ASSIGN(auto pc, ReadAll(*b->model, ChunkType::kParam));
  EXPECT_FALSE(BitEqual(pa[0], pc[0]));
}

// --- 2. The reference model ----------------------------------------------------------------------

// The chunked model with `dtype` param chunks against TinyGpt2<float> holding the same (f32)
// parameter values: the same kernels in the same order on the same f32 operands (with bf16
// chunks: the same bf16 GEMM kernels on the same bf16 weights), so the loss is bit-identical and
// the gradients are bit-identical after rounding to `dtype` (for f32: exactly).
// Scratch allocations the model makes in one ForwardBackward before its `n`-th operator access
// (n = 0: before its last access of the forward pass), from the activation profile, which follows
// the model statement by statement.
int64_t AllocationsBeforeAccess(const GptConfig& config, const RigOptions& o, int n) {
  const GptMemoryModel m =
      GptActivationProfile(config, o.model, o.dtype, {.vocab_block_rows = o.vocab_block_rows});
  const std::vector<ActivationEvent>& events = m.profile.iteration;
  int64_t end = static_cast<int64_t>(events.size());
  int accesses = 0;
  for (int64_t i = 0; i < static_cast<int64_t>(events.size()); ++i) {
    const ActivationEvent& e = events[static_cast<size_t>(i)];
    if (e.kind != ActivationEvent::Kind::kAccess) continue;
    if (n == 0) {
      if (e.stage != Stage::kForward) break;  // backward (and its recomputations) begins
      end = i;
    } else if (++accesses == n) {
      end = i;
      break;
    }
  }
  int64_t allocs = 0;
  for (int64_t i = 0; i < end; ++i) {
    allocs += events[static_cast<size_t>(i)].kind == ActivationEvent::Kind::kAlloc ? 1 : 0;
  }
  return allocs;
}

// With `stall`, each ForwardBackward starts behind a stall of the compute stream (which ends at
// the host's first wait for the backend), and a probe queued first records how many scratch
// allocations the host had made when the stream started: the host must have got through the
// whole forward's enqueues by then (it first waits for the loss) — at least up to the last
// forward access, which is many operators.
void ExpectMatchesReference(DType dtype, bool checkpointing, RigOptions o = {},
                            bool stall = false) {
  const GptConfig config = SmallConfig();
  o.dtype = dtype;
  o.model.activation_checkpointing = checkpointing;
  ASSERT_OK_AND_ASSIGN(std::unique_ptr<Rig> rig, MakeRig(config, o));
  ASSERT_OK(rig->model->InitializeParameters(3));
  const int64_t B = o.model.batch, T = o.model.seq_len;
  kernel_testing::TinyGpt2Config reference_config = ReferenceConfig(config, o.model);
  reference_config.bf16_gemms = dtype == DType::kBF16;
  // GptModel's LM head walks wte's row blocks with bf16 GEMMs for bf16 blocks, the same bits as
  // the whole-matrix bf16 LM head (reference_config.bf16_lm_head, the default).
  kernel_testing::TinyGpt2<float> reference(reference_config, B, T);
  for (const kernel_testing::ParamTensor& t : reference.tensors()) {
    ASSERT_OK_AND_ASSIGN(std::vector<float> v, rig->model->ReadTensor(ChunkType::kParam, t.name));
    ASSERT_EQ(static_cast<int64_t>(v.size()), t.size) << t.name;
    std::memcpy(reference.params().data() + t.offset, v.data(), v.size() * sizeof(float));
  }
  ThreadPool pool(2);
  for (uint32_t seed : {1u, 2u}) {
    const Batch batch = RandomBatch(config, B, T, seed);
    ASSERT_OK_AND_ASSIGN(const double expected_loss,
                         reference.Forward(batch.tokens, batch.targets, &pool));
    ASSERT_OK(reference.Backward(batch.tokens, batch.targets, &pool));

    ASSERT_OK(rig->manager->BeginIteration());
    std::unique_ptr<CpuStreamStall> stalled;
    std::atomic<int64_t> allocs_when_the_stream_started{-1};
    const int64_t allocs_before = rig->accelerator->scratch()->stats().total_allocations;
    if (stall) {
      ASSERT_TRUE(o.shared_compute_stream);
      ASSERT_OK_AND_ASSIGN(stalled, StallCpuStream(*rig->compute_stream));
      ASSERT_OK(rig->compute_stream->LaunchHostFunc([&, scratch = rig->accelerator->scratch()] {
        allocs_when_the_stream_started = scratch->stats().total_allocations - allocs_before;
      }));
    }
    ASSERT_OK_AND_ASSIGN(const double loss,
                         rig->model->ForwardBackward(batch.tokens, batch.targets));
    EXPECT_EQ(loss, expected_loss);
    if (stall) {
      const int64_t forward = AllocationsBeforeAccess(config, o, 0);
      ASSERT_GT(forward, AllocationsBeforeAccess(config, o, 4));  // more than three operators
      EXPECT_GE(allocs_when_the_stream_started.load(), forward)
          << "the compute stream started before the host had enqueued the forward (seed " << seed
          << ")";
      LOG(INFO) << "scratch allocations before the stream started: "
                << allocs_when_the_stream_started.load()
                << " (up to the last forward access: " << forward
                << ", three operators: " << AllocationsBeforeAccess(config, o, 4) << ")";
    }
    for (const kernel_testing::ParamTensor& t : reference.tensors()) {
      ASSERT_OK_AND_ASSIGN(std::vector<float> grad,
                           rig->model->ReadTensor(ChunkType::kParam, t.name));
      // The reference gradient rounded to the chunk's dtype (a no-op for f32).
      std::vector<float> expected(reference.grads().begin() + t.offset,
                                  reference.grads().begin() + t.offset + t.size);
      std::vector<uint16_t> rounded(expected.size());
      if (dtype != DType::kF32) {
        ASSERT_OK(Convert(DType::kF32, expected.data(), dtype, rounded.data(), t.size));
        ASSERT_OK(Convert(dtype, rounded.data(), DType::kF32, expected.data(), t.size));
      }
      EXPECT_TRUE(BitEqual(grad, expected)) << t.name << " (seed " << seed << ")";
    }
    // Gradients are in the slots, so the next forward needs the parameters back: restore them
    // from the master chunks as the optimizer would after a skipped step (here simply by
    // initializing again outside the iteration).
    ASSERT_OK(rig->manager->EndIteration());
    ASSERT_OK(rig->model->InitializeParameters(3));
  }
}

TEST(GptModel, MatchesReferenceModelBitForBitF32) { ExpectMatchesReference(DType::kF32, false); }
TEST(GptModel, MatchesReferenceModelBitForBitF16) { ExpectMatchesReference(DType::kF16, false); }
TEST(GptModel, MatchesReferenceModelBitForBitBF16) { ExpectMatchesReference(DType::kBF16, false); }
// The same with the bf16 GEMMs forced onto the fallback (f32 sgemm on the widened operands), the
// path of CPUs without AVX512-BF16.
TEST(GptModel, MatchesReferenceModelBitForBitBF16FallbackGemms) {
  kernels_internal::SetBf16GemmBackendForTest(kernels_internal::Bf16GemmBackend::kFallback);
  ExpectMatchesReference(DType::kBF16, false);
  kernels_internal::SetBf16GemmBackendForTest(kernels_internal::Bf16GemmBackend::kAuto);
}
TEST(GptModel, MatchesReferenceModelWithCheckpointing) {
  ExpectMatchesReference(DType::kF32, true);
}

// --- 2a. Compute on the stream ---------------------------------------------------------------

// The kernels run on the compute stream, after the host enqueued them. With every stream of the
// backend held until the host waits, a result the model (or the manager, or a staged read) used
// without waiting for the stream would be stale — the loss copied back, a gradient converted into
// its slot before the chunk moved, a payload read outside compute — and the results would differ
// from the reference; they must still be bit-identical.
TEST(GptModel, ComputeHeldUntilTheHostWaitsStillMatchesTheReference) {
  RigOptions o;
  o.stall_streams_until_host_waits = true;
  ExpectMatchesReference(DType::kF32, false, o);
  ExpectMatchesReference(DType::kBF16, true, o);
}

// The trainer's wiring: the caller's kernels and compute stream, the same stream given to the
// manager (whose write-backs and drops then wait for it on the stream); a small budget makes the
// manager evict and write back chunks between operators.
TEST(GptModel, CallersKernelsAndComputeStreamSharedWithTheManager) {
  RigOptions o;
  o.shared_compute_stream = true;
  ExpectMatchesReference(DType::kF32, false, o);
  o.stall_streams_until_host_waits = true;
  ExpectMatchesReference(DType::kF16, false, o);
}

// The host runs ahead of the kernels as with a GPU: with the stream shared with the manager,
// neither a Release nor a scratch free waits for the stream, so a ForwardBackward held behind a
// stall of the compute stream enqueues operator after operator (the whole forward, until it waits
// for the loss) before the first kernel runs — and the results, once the stream ran, are still
// bit-identical to tiny_gpt2 (f32; bf16 with the reference's bf16 GEMMs; f16; checkpointing).
// Meanwhile every scratch buffer is freed while kernels that read it are still queued, and later
// kernels reuse the blocks in stream order: a block handed to anyone else too early would change
// the results.
TEST(GptModel, HostRunsAheadOfTheComputeStreamAcrossOperators) {
  RigOptions o;
  o.shared_compute_stream = true;
  ExpectMatchesReference(DType::kF32, false, o, /*stall=*/true);
  ExpectMatchesReference(DType::kBF16, false, o, /*stall=*/true);
  ExpectMatchesReference(DType::kF16, true, o, /*stall=*/true);
}

// A gradient the compute stream has not written yet is not what a staged read returns: ReadTensor
// waits for the compute stream's work (an event) before copying the payload. Here the caller's
// own kernel, held behind a stall of the compute stream, overwrites a gradient slot on the
// accelerator; the read must return the new values.
TEST(GptModel, StagedReadsWaitForQueuedCompute) {
  const GptConfig config = SmallConfig();
  RigOptions o;
  o.shared_compute_stream = true;
  // Room for every chunk: they stay on the accelerator after the iteration.
  o.capacity_bytes = 64 * kMiB;
  ASSERT_OK_AND_ASSIGN(std::unique_ptr<Rig> rig, MakeRig(config, o));
  ASSERT_OK(rig->model->InitializeParameters(3));
  const Batch batch = RandomBatch(config, o.model.batch, o.model.seq_len, 1);
  ASSERT_OK(rig->manager->BeginIteration());
  ASSERT_OK(rig->model->ForwardBackward(batch.tokens, batch.targets).status());
  const ChunkLayout* layout = &rig->store->layout();
  // A gradient slot whose chunk is on the accelerator.
  std::optional<TensorView> slot;
  std::string name;
  for (const std::string& n : ParamNames(config)) {
    absl::StatusOr<TensorId> t = layout->FindTensor(n);
    if (!t.ok()) continue;
    ASSERT_OK_AND_ASSIGN(TensorView v, rig->store->View(ChunkType::kParam, *t));
    if (!v.device.is_host()) {
      slot = v;
      name = n;
      break;
    }
  }
  ASSERT_TRUE(slot.has_value()) << "no param chunk stayed on the accelerator";
  ASSERT_OK_AND_ASSIGN(std::unique_ptr<CpuStreamStall> stall, StallCpuStream(*rig->compute_stream));
  ASSERT_OK(rig->kernels->Zero(*rig->compute_stream, slot->data, slot->bytes()));
  ASSERT_OK_AND_ASSIGN(std::vector<float> got, rig->model->ReadTensor(ChunkType::kParam, name));
  EXPECT_EQ(got, std::vector<float>(got.size(), 0.0f)) << name;
  stall->Release();
  ASSERT_OK(rig->manager->EndIteration());
}

// --- 2b. The vocabulary in row blocks ----------------------------------------------------------

// wte in blocks of whole LM-head tiles computes bit for bit what the unsplit model computes:
// initialization, loss, every gradient (f32, and bf16 where the tied gradient is rounded once).
void ExpectSplitEqualsWhole(DType dtype, bool checkpointing) {
  SCOPED_TRACE(absl::StrCat(DTypeName(dtype), checkpointing ? " checkpointing" : ""));
  const GptConfig config = SmallConfig();  // vocab 64, CE vocabulary tile 24
  RigOptions whole_options;
  whole_options.dtype = dtype;
  whole_options.model.activation_checkpointing = checkpointing;
  RigOptions split_options = whole_options;
  split_options.vocab_block_rows = 24;  // blocks [0:24] [24:48] [48:64]
  ASSERT_OK_AND_ASSIGN(std::unique_ptr<Rig> whole, MakeRig(config, whole_options));
  ASSERT_OK_AND_ASSIGN(std::unique_ptr<Rig> split, MakeRig(config, split_options));
  EXPECT_EQ(whole->model->vocab_block_rows(), 64);
  EXPECT_EQ(split->model->vocab_block_rows(), 24);
  ASSERT_EQ(split->model->ParameterNames()[0], "wte.weight[0:24]");
  ASSERT_OK(whole->model->InitializeParameters(5));
  ASSERT_OK(split->model->InitializeParameters(5));
  ASSERT_OK_AND_ASSIGN(auto pw, ReadAll(*whole->model, ChunkType::kParam));
  ASSERT_OK_AND_ASSIGN(auto ps, ReadAll(*split->model, ChunkType::kParam));
  const std::vector<std::string> names = ParamNames(config);
  for (size_t i = 0; i < names.size(); ++i) EXPECT_TRUE(BitEqual(pw[i], ps[i])) << names[i];
  for (uint32_t seed : {1u, 2u, 3u}) {
    const Batch batch = RandomBatch(config, 2, 16, seed);
    double losses[2];
    std::vector<std::vector<float>> grads[2];
    Rig* rigs[2] = {whole.get(), split.get()};
    for (int r = 0; r < 2; ++r) {
      ASSERT_OK(rigs[r]->manager->BeginIteration());
      ASSERT_OK_AND_ASSIGN(losses[r], rigs[r]->model->ForwardBackward(batch.tokens, batch.targets));
      ASSERT_OK_AND_ASSIGN(grads[r], ReadAll(*rigs[r]->model, ChunkType::kParam));
      ASSERT_OK(rigs[r]->manager->EndIteration());
      ASSERT_OK(rigs[r]->model->InitializeParameters(5));
      EXPECT_EQ(rigs[r]->accelerator->scratch()->stats().in_use_bytes, 0);
    }
    EXPECT_EQ(losses[0], losses[1]) << "seed " << seed;
    for (size_t i = 0; i < names.size(); ++i) {
      EXPECT_TRUE(BitEqual(grads[0][i], grads[1][i])) << names[i] << " seed " << seed;
    }
    ASSERT_OK_AND_ASSIGN(const double eval_whole,
                         whole->model->Evaluate(batch.tokens, batch.targets));
    EXPECT_THAT(split->model->Evaluate(batch.tokens, batch.targets), IsOkAndHolds(eval_whole));
  }
}

TEST(GptModel, VocabularyBlocksAreBitIdenticalToTheWholeMatrixF32) {
  ExpectSplitEqualsWhole(DType::kF32, false);
  ExpectSplitEqualsWhole(DType::kF32, true);
}
TEST(GptModel, VocabularyBlocksAreBitIdenticalToTheWholeMatrixBF16) {
  ExpectSplitEqualsWhole(DType::kBF16, false);
}

TEST(GptModel, VocabularyBlocksMustHoldWholeTiles) {
  const GptConfig config = SmallConfig();
  RigOptions o;
  o.vocab_block_rows = 20;  // not a multiple of the 24-row tile
  EXPECT_THAT(MakeRig(config, o),
              StatusIs(absl::StatusCode::kInvalidArgument,
                       AllOf(HasSubstr("wte[20:40]"), HasSubstr("ce_vocab_tile = 24"))));
}

TEST(GptModel, SplitModelsExportAndImportTheWholeMatrix) {
  const GptConfig config = SmallConfig();
  RigOptions split;
  split.vocab_block_rows = 48;
  ASSERT_OK_AND_ASSIGN(std::unique_ptr<Rig> a, MakeRig(config, split));
  ASSERT_OK(a->model->InitializeParameters(9));
  const std::string path = absl::StrCat(testing::TempDir(), "/gpt_model_split.safetensors");
  ASSERT_OK(a->model->SaveGpt2Safetensors(path, DType::kF32));
  ASSERT_OK_AND_ASSIGN(Gpt2Checkpoint checkpoint, Gpt2Checkpoint::Open(path));
  ASSERT_OK_AND_ASSIGN(std::vector<float> wte, checkpoint.ReadF32("wte.weight"));
  ASSERT_OK_AND_ASSIGN(std::vector<float> master,
                       a->model->ReadTensor(ChunkType::kMaster, "wte.weight"));
  EXPECT_TRUE(BitEqual(wte, master));
  // Into a whole model and into another split.
  for (int64_t rows : {int64_t{0}, int64_t{24}}) {
    RigOptions o;
    o.vocab_block_rows = rows;
    ASSERT_OK_AND_ASSIGN(std::unique_ptr<Rig> b, MakeRig(config, o));
    ASSERT_OK(b->model->LoadGpt2Checkpoint(checkpoint));
    ASSERT_OK_AND_ASSIGN(auto ma, ReadAll(*a->model, ChunkType::kMaster));
    ASSERT_OK_AND_ASSIGN(auto mb, ReadAll(*b->model, ChunkType::kMaster));
    for (size_t i = 0; i < ma.size(); ++i) EXPECT_TRUE(BitEqual(ma[i], mb[i])) << i;
  }
}

// --- 3. Checkpoint import and export
// --------------------------------------------------------------

TEST(GptModel, ExportsAndImportsHuggingFaceSafetensors) {
  const GptConfig config = SmallConfig();
  ASSERT_OK_AND_ASSIGN(std::unique_ptr<Rig> a, MakeRig(config, {}));
  ASSERT_OK(a->model->InitializeParameters(21));
  const std::string path = absl::StrCat(testing::TempDir(), "/gpt_model_test.safetensors");
  ASSERT_OK(a->model->SaveGpt2Safetensors(path, DType::kF32));
  ASSERT_OK_AND_ASSIGN(Gpt2Checkpoint checkpoint, Gpt2Checkpoint::Open(path));
  EXPECT_EQ(checkpoint.dims(), a->model->dims());

  RigOptions bf16;
  bf16.dtype = DType::kBF16;
  ASSERT_OK_AND_ASSIGN(std::unique_ptr<Rig> b, MakeRig(config, bf16));
  ASSERT_OK(b->model->InitializeParameters(22));
  ASSERT_OK(b->model->LoadGpt2Checkpoint(checkpoint));
  ASSERT_OK_AND_ASSIGN(auto master_a, ReadAll(*a->model, ChunkType::kMaster));
  ASSERT_OK_AND_ASSIGN(auto master_b, ReadAll(*b->model, ChunkType::kMaster));
  ASSERT_OK_AND_ASSIGN(auto param_b, ReadAll(*b->model, ChunkType::kParam));
  for (size_t i = 0; i < master_a.size(); ++i) {
    EXPECT_TRUE(BitEqual(master_a[i], master_b[i])) << i;
    // The bf16 params are the masters rounded.
    std::vector<uint16_t> bits(master_a[i].size());
    std::vector<float> rounded(master_a[i].size());
    ASSERT_OK(Convert(DType::kF32, master_a[i].data(), DType::kBF16, bits.data(), bits.size()));
    ASSERT_OK(Convert(DType::kBF16, bits.data(), DType::kF32, rounded.data(), bits.size()));
    EXPECT_TRUE(BitEqual(param_b[i], rounded)) << i;
  }

  GptConfig other = config;
  other.num_layers = 3;
  ASSERT_OK_AND_ASSIGN(std::unique_ptr<Rig> c, MakeRig(other, {}));
  EXPECT_THAT(c->model->LoadGpt2Checkpoint(checkpoint),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("dimensions")));
}

// --- 3b. Accelerator payloads outside compute ---------------------------------------------------

// Moves every chunk type of the even-numbered chunks that hold tensors to the accelerator (outside
// an iteration: untracked accesses), leaving the odd ones on the host. Returns the bytes of the
// master tensors now on the accelerator, each checked to lie in the emulated accelerator's memory.
absl::StatusOr<int64_t> MoveEvenChunksToAccelerator(Rig& rig) {
  const ChunkLayout& layout = rig.store->layout();
  int64_t master_bytes = 0;
  for (int64_t c = 0; c < layout.num_chunks(); c += 2) {
    if (layout.TensorsInChunk(c).empty()) continue;
    RETURN_IF_ERROR(rig.manager->AccessChunks(c, kAllChunkTypes, rig.manager->accelerator_device(),
                                              AccessMode::kReadWrite));
    RETURN_IF_ERROR(rig.manager->ReleaseChunks(c, kAllChunkTypes));
    for (TensorId t : layout.TensorsInChunk(c)) {
      ASSIGN_OR_RETURN(TensorView v, rig.store->View(ChunkType::kMaster, t));
      RETURN_IF_ERROR(CheckCpuDeviceRange(*rig.backend, v.data, v.bytes(), "a master payload"));
      master_bytes += v.bytes();
    }
  }
  return master_bytes;
}

// Every file under `dir` (names and bytes).
std::map<std::string, std::string> FilesIn(const std::string& dir) {
  std::map<std::string, std::string> files;
  for (const auto& entry : std::filesystem::directory_iterator(dir)) {
    std::ifstream in(entry.path(), std::ios::binary);
    std::ostringstream bytes;
    bytes << in.rdbuf();
    files[entry.path().filename().string()] = bytes.str();
  }
  return files;
}

absl::StatusOr<std::vector<std::vector<float>>> ReadAllStored(const GptModel& model,
                                                              ChunkType type) {
  std::vector<std::vector<float>> out;
  for (const std::string& name : model.ParameterNames()) {
    ASSIGN_OR_RETURN(std::vector<float> v, model.ReadTensor(type, name));
    out.push_back(std::move(v));
  }
  return out;
}

// A model with half its chunks on the (emulated) accelerator exports, saves and reads exactly what
// the same model entirely in host memory does, and every byte it reads from the accelerator comes
// through a stream copy into the staging buffer: a direct host read of an accelerator payload
// (which a GPU would fault on) leaves the device-to-host counter short and fails the test.
void ExpectAcceleratorReadsStaged(DType dtype, int64_t vocab_block_rows, int64_t staging_bytes) {
  SCOPED_TRACE(
      absl::StrCat(DTypeName(dtype), " blocks ", vocab_block_rows, " staging ", staging_bytes));
  const GptConfig config = SmallConfig();
  RigOptions o;
  o.dtype = dtype;
  o.vocab_block_rows = vocab_block_rows;
  o.model.payload_staging_bytes = staging_bytes;
  ASSERT_OK_AND_ASSIGN(std::unique_ptr<Rig> host, MakeRig(config, o));
  ASSERT_OK_AND_ASSIGN(std::unique_ptr<Rig> mixed, MakeRig(config, o));
  ASSERT_OK(host->model->InitializeParameters(31));
  ASSERT_OK(mixed->model->InitializeParameters(31));
  ASSERT_OK_AND_ASSIGN(const int64_t moved_master_bytes, MoveEvenChunksToAccelerator(*mixed));
  ASSERT_GT(moved_master_bytes, 0);

  // HF export: the same files; exactly the moved master bytes cross the link.
  const std::string dir = absl::StrCat(testing::TempDir(), "/staged_", DTypeName(dtype), "_",
                                       vocab_block_rows, "_", staging_bytes);
  const int64_t d2h_before = mixed->backend->counters().device_to_host_bytes;
  ASSERT_OK(mixed->model->SaveHfCheckpoint(dir + "_mixed", DType::kF32));
  EXPECT_EQ(mixed->backend->counters().device_to_host_bytes - d2h_before, moved_master_bytes);
  ASSERT_OK(host->model->SaveHfCheckpoint(dir + "_host", DType::kF32));
  const std::map<std::string, std::string> mixed_files = FilesIn(dir + "_mixed");
  EXPECT_FALSE(mixed_files.empty());
  EXPECT_TRUE(mixed_files == FilesIn(dir + "_host"));

  // The GPT-2 single file.
  ASSERT_OK(mixed->model->SaveGpt2Safetensors(dir + "_mixed.safetensors", DType::kF32));
  ASSERT_OK(host->model->SaveGpt2Safetensors(dir + "_host.safetensors", DType::kF32));
  std::ifstream a(dir + "_mixed.safetensors", std::ios::binary),
      b(dir + "_host.safetensors", std::ios::binary);
  std::ostringstream a_bytes, b_bytes;
  a_bytes << a.rdbuf();
  b_bytes << b.rdbuf();
  EXPECT_FALSE(a_bytes.str().empty());
  EXPECT_TRUE(a_bytes.str() == b_bytes.str());

  // Every stored tensor of every type, and the training state a checkpoint saves.
  for (ChunkType type : kAllChunkTypes) {
    ASSERT_OK_AND_ASSIGN(auto from_mixed, ReadAllStored(*mixed->model, type));
    ASSERT_OK_AND_ASSIGN(auto from_host, ReadAllStored(*host->model, type));
    ASSERT_EQ(from_mixed.size(), from_host.size());
    for (size_t i = 0; i < from_mixed.size(); ++i) {
      EXPECT_TRUE(BitEqual(from_mixed[i], from_host[i])) << ChunkTypeName(type) << " " << i;
    }
  }
  std::map<std::string, std::vector<float>> state_mixed, state_host;
  ASSERT_OK(mixed->model->VisitTrainingState([&](absl::string_view name, ChunkType type,
                                                 absl::Span<const float> values) {
    state_mixed[absl::StrCat(name, "/", ChunkTypeName(type))].assign(values.begin(), values.end());
    return absl::OkStatus();
  }));
  ASSERT_OK(host->model->VisitTrainingState([&](absl::string_view name, ChunkType type,
                                                absl::Span<const float> values) {
    state_host[absl::StrCat(name, "/", ChunkTypeName(type))].assign(values.begin(), values.end());
    return absl::OkStatus();
  }));
  EXPECT_FALSE(state_mixed.empty());
  EXPECT_TRUE(state_mixed == state_host);
}

TEST(GptModel, ReadsAcceleratorPayloadsThroughPinnedStagingF32) {
  // 36 bytes: 9 f32 elements a piece, so every tensor crosses several pieces with a tail.
  ExpectAcceleratorReadsStaged(DType::kF32, 0, 36);
  ExpectAcceleratorReadsStaged(DType::kF32, 24, kPayloadStagingBytes);
}

TEST(GptModel, ReadsAcceleratorPayloadsThroughPinnedStagingBF16) {
  ExpectAcceleratorReadsStaged(DType::kBF16, 24, 6);
  ExpectAcceleratorReadsStaged(DType::kBF16, 0, kPayloadStagingBytes);
}

// Imports and resumes into chunks that live on the accelerator: the manager moves each chunk to
// the host first, and the result is bit-identical to the model entirely in host memory.
TEST(GptModel, ImportsAndResumesIntoAcceleratorResidentChunks) {
  const GptConfig config = SmallConfig();
  RigOptions o;
  o.dtype = DType::kBF16;
  o.model.payload_staging_bytes = 20;
  ASSERT_OK_AND_ASSIGN(std::unique_ptr<Rig> source, MakeRig(config, o));
  ASSERT_OK(source->model->InitializeParameters(41));
  const std::string dir = absl::StrCat(testing::TempDir(), "/staged_import");
  ASSERT_OK(source->model->SaveHfCheckpoint(dir, DType::kF32));
  ASSERT_OK(source->model->SaveGpt2Safetensors(dir + ".safetensors", DType::kF32));
  ASSERT_OK_AND_ASSIGN(const HfCheckpoint hf, HfCheckpoint::Open(dir));
  ASSERT_OK_AND_ASSIGN(const Gpt2Checkpoint gpt2, Gpt2Checkpoint::Open(dir + ".safetensors"));
  // A resume state unlike any initialization: moments from a fixed generator.
  std::mt19937_64 gen(43);
  std::uniform_real_distribution<float> uniform(-1.0f, 1.0f);
  std::map<std::string, std::vector<float>> moments;
  auto fill = [&](absl::string_view name, ChunkType type, absl::Span<float> out) -> absl::Status {
    if (type == ChunkType::kMaster) return source->model->ReadTensorInto(type, name, out);
    std::vector<float>& v = moments[absl::StrCat(name, "/", ChunkTypeName(type))];
    if (v.empty()) {
      for (size_t i = 0; i < out.size(); ++i) v.push_back(uniform(gen));
    }
    std::copy(v.begin(), v.end(), out.begin());
    return absl::OkStatus();
  };
  ASSERT_OK(source->model->LoadTrainingState(fill));

  for (int how = 0; how < 3; ++how) {
    SCOPED_TRACE(how);
    ASSERT_OK_AND_ASSIGN(std::unique_ptr<Rig> target, MakeRig(config, o));
    ASSERT_OK(target->model->InitializeParameters(42));
    ASSERT_OK(MoveEvenChunksToAccelerator(*target).status());
    if (how == 0) {
      ASSERT_OK(target->model->LoadHfCheckpoint(hf));
    }
    if (how == 1) {
      ASSERT_OK(target->model->LoadGpt2Checkpoint(gpt2));
    }
    if (how == 2) {
      ASSERT_OK(target->model->LoadTrainingState(fill));
    }
    for (ChunkType type : {ChunkType::kMaster, ChunkType::kParam}) {
      ASSERT_OK_AND_ASSIGN(auto got, ReadAllStored(*target->model, type));
      ASSERT_OK_AND_ASSIGN(auto want, ReadAllStored(*source->model, type));
      for (size_t i = 0; i < got.size(); ++i) {
        EXPECT_TRUE(BitEqual(got[i], want[i])) << ChunkTypeName(type) << " " << i;
      }
    }
    if (how == 2) {
      for (ChunkType type : {ChunkType::kMomentum, ChunkType::kVariance}) {
        ASSERT_OK_AND_ASSIGN(auto got, ReadAllStored(*target->model, type));
        ASSERT_OK_AND_ASSIGN(auto want, ReadAllStored(*source->model, type));
        for (size_t i = 0; i < got.size(); ++i) {
          EXPECT_TRUE(BitEqual(got[i], want[i])) << ChunkTypeName(type) << " " << i;
        }
      }
    }
  }
}

TEST(GptModel, RejectsAStagingBufferSmallerThanOneElement) {
  RigOptions o;
  o.model.payload_staging_bytes = 3;
  EXPECT_THAT(MakeRig(SmallConfig(), o).status(),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("payload_staging_bytes")));
}

// --- 4. Errors -----------------------------------------------------------------------------------

TEST(GptModel, RejectsBadInputs) {
  const GptConfig config = SmallConfig();
  ASSERT_OK_AND_ASSIGN(std::unique_ptr<Rig> rig, MakeRig(config, {}));
  ASSERT_OK(rig->model->InitializeParameters(1));
  GptModel& model = *rig->model;
  Batch batch = RandomBatch(config, 2, 16, 1);

  // Outside an iteration.
  EXPECT_THAT(model.ForwardBackward(batch.tokens, batch.targets),
              StatusIs(absl::StatusCode::kFailedPrecondition, HasSubstr("BeginIteration")));
  ASSERT_OK(rig->manager->BeginIteration());
  EXPECT_THAT(model.Evaluate(batch.tokens, batch.targets),
              StatusIs(absl::StatusCode::kFailedPrecondition));
  EXPECT_THAT(model.InitializeParameters(1), StatusIs(absl::StatusCode::kFailedPrecondition));

  Batch bad = batch;
  bad.tokens[5] = 64;
  EXPECT_THAT(model.ForwardBackward(bad.tokens, bad.targets),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("token id 64")));
  bad = batch;
  bad.tokens[0] = -1;
  EXPECT_THAT(model.ForwardBackward(bad.tokens, bad.targets),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("token id -1")));
  bad = batch;
  bad.targets[2] = 99;
  EXPECT_THAT(model.ForwardBackward(bad.tokens, bad.targets),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("target 99")));
  bad = batch;
  bad.tokens.pop_back();
  EXPECT_THAT(model.ForwardBackward(bad.tokens, bad.targets),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("batch 2 x seq_len 16")));
  EXPECT_THAT(model.ForwardBackward(batch.tokens, batch.targets, 0.0),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("loss_scale")));
  // Nothing was accessed by the rejected calls: the iteration still works.
  EXPECT_OK(model.ForwardBackward(batch.tokens, batch.targets).status());
  ASSERT_OK(rig->manager->EndIteration());
  EXPECT_THAT(model.ReadTensor(ChunkType::kParam, "h.9.ln_1.weight"),
              StatusIs(absl::StatusCode::kNotFound));
}

TEST(GptModel, RefusesToComputeWithGradientsInTheParamSlots) {
  const GptConfig config = SmallConfig();
  ASSERT_OK_AND_ASSIGN(std::unique_ptr<Rig> rig, MakeRig(config, {}));
  ASSERT_OK(rig->model->InitializeParameters(1));
  const Batch batch = RandomBatch(config, 2, 16, 1);
  ASSERT_OK(rig->manager->BeginIteration());
  ASSERT_OK_AND_ASSIGN(const double loss, rig->model->ForwardBackward(batch.tokens, batch.targets));
  // A second forward in the same iteration would use the gradients as weights.
  EXPECT_THAT(rig->model->ForwardBackward(batch.tokens, batch.targets),
              StatusIs(absl::StatusCode::kFailedPrecondition, HasSubstr("optimizer step")));
  ASSERT_OK(rig->manager->EndIteration());
  // So would an evaluation after an iteration that skipped the optimizer step.
  EXPECT_THAT(rig->model->Evaluate(batch.tokens, batch.targets),
              StatusIs(absl::StatusCode::kFailedPrecondition, HasSubstr("holds a gradient")));
  // Reloading the parameters ends it: the same batch gives the same loss again.
  ASSERT_OK(rig->model->InitializeParameters(1));
  EXPECT_THAT(rig->model->Evaluate(batch.tokens, batch.targets), IsOkAndHolds(loss));
  // (So does the optimizer step, even a skipped one: trainer/train_step_test.)
}

TEST(GptModel, RejectsBadConfigurations) {
  const GptConfig config = SmallConfig();
  ASSERT_OK_AND_ASSIGN(std::unique_ptr<Rig> rig, MakeRig(config, {}));
  GptModelOptions o{.batch = 1, .seq_len = 17};
  EXPECT_THAT(
      GptModel::Create(config, rig->store.get(), rig->manager.get(), rig->accelerator.get(), o),
      StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("exceeds")));
  o = {.batch = 0};
  EXPECT_THAT(
      GptModel::Create(config, rig->store.get(), rig->manager.get(), rig->accelerator.get(), o),
      StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("batch")));
  // A layout of another config.
  GptConfig other = config;
  other.hidden = 64;
  EXPECT_THAT(
      GptModel::Create(other, rig->store.get(), rig->manager.get(), rig->accelerator.get(), {}),
      StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("wte.weight")));
  other = config;
  other.num_layers = 3;
  EXPECT_THAT(
      GptModel::Create(other, rig->store.get(), rig->manager.get(), rig->accelerator.get(), {}),
      StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("operators")));
  EXPECT_THAT(GptModel::Create(config, nullptr, rig->manager.get(), rig->accelerator.get(), {}),
              StatusIs(absl::StatusCode::kInvalidArgument));
}

TEST(GptModel, OutOfMemoryIsResourceExhaustedAndLeavesNothingAccessed) {
  const GptConfig config = SmallConfig();
  // Room for the chunks but not for the activations' scratch segments (2 MiB each by default).
  RigOptions o;
  o.capacity_bytes = 8 * kChunkElems * 4;
  ASSERT_OK_AND_ASSIGN(std::unique_ptr<Rig> rig, MakeRig(config, o));
  ASSERT_OK(rig->model->InitializeParameters(1));
  const Batch batch = RandomBatch(config, 2, 16, 1);
  ASSERT_OK(rig->manager->BeginIteration());
  EXPECT_THAT(rig->model->ForwardBackward(batch.tokens, batch.targets),
              StatusIs(absl::StatusCode::kResourceExhausted));
  // Every activation was freed. (The first activation failed before any access: this warm-up has
  // no moment, and ending it would learn nothing; the budget case below ends its iteration.)
  EXPECT_EQ(rig->accelerator->scratch()->stats().in_use_bytes, 0);

  // The manager's own verdict: a budget below one chunk cannot hold any operator.
  RigOptions tiny_budget;
  tiny_budget.budget_bytes = kChunkElems * 2;
  absl::StatusOr<std::unique_ptr<Rig>> small = MakeRig(config, tiny_budget);
  if (small.ok()) {
    ASSERT_OK((*small)->model->InitializeParameters(1));
    ASSERT_OK((*small)->manager->BeginIteration());
    EXPECT_THAT((*small)->model->ForwardBackward(batch.tokens, batch.targets),
                StatusIs(absl::StatusCode::kResourceExhausted, HasSubstr("wte")));
    // The failing operator was released and every activation freed.
    EXPECT_OK((*small)->manager->EndIteration());
    EXPECT_EQ((*small)->accelerator->scratch()->stats().in_use_bytes, 0);
  } else {
    EXPECT_THAT(small.status(), StatusIs(absl::StatusCode::kInvalidArgument));
  }
}

}  // namespace
}  // namespace ps
