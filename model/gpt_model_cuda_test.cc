// GptModel on a GPU: the cuda backend with CudaKernels against the cpu backend (the emulated
// accelerator) with CpuKernels, for a GPT-2 and a Llama tiny config, in f32 and bf16, each under an
// accelerator budget below the param chunks (chunks move between host and GPU during every
// iteration). The cpu side is itself checked bit for bit against independent references in
// gpt_model_test / llama_model_test; here the question is whether the GPU path computes the same
// model through the same chunk moves.
//
// Tolerances (stated, from the arithmetic): f32 — the loss within 1e-5 relative; each gradient
// tensor within 1e-4 of its largest magnitude (+1e-7 absolute): cuBLAS and the CUDA reductions sum
// in other orders than the CPU kernels. bf16 — the GEMMs round activations to bf16 on both sides,
// but a one-ulp difference upstream (2^-8 relative) propagates: the loss within 1e-2 relative and
// each gradient within 3e-2 of its largest magnitude.
//
// Tag "cuda": without a GPU (or in a build without --config=cuda) the GPU tests report SKIPPED.
// CpuSideMovesChunksUnderTheBudget runs everywhere: it checks the budget and model used here do
// make chunks move on the emulated accelerator, so the GPU comparison is made under a real cap.
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <memory>
#include <random>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/str_cat.h"
#include "base/status_macros.h"
#include "base/testing/gpu_gate.h"
#include "base/testing/status_matchers.h"
#include "base/thread_pool.h"
#include "base/units.h"
#include "chunk/chunk_layout.h"
#include "chunk/chunk_store.h"
#include "chunk/chunk_type.h"
#include "gtest/gtest.h"
#include "memory/backend.h"
#include "memory/backend_factory.h"
#include "memory/device_memory.h"
#include "memory/dtype.h"
#include "model/gpt_config.h"
#include "model/gpt_model.h"
#include "model/kernels/kernels.h"
#include "model/kernels/kernels_factory.h"
#include "model/model_config.h"
#include "scheduler/chunk_manager.h"

namespace ps {
namespace {

// 8 layers of hidden 128: about 1.6M parameters (6.4 MB of f32 param chunks, 9 chunks).
ModelConfig Gpt2Tiny() {
  return FromGptConfig(GptConfig{.name = "gpt2-cuda-test",
                                 .vocab_size = 256,
                                 .max_seq_len = 32,
                                 .hidden = 128,
                                 .num_layers = 8,
                                 .num_heads = 4});
}

ModelConfig LlamaTiny() {
  ModelConfig c;
  c.name = "llama-cuda-test";
  c.family = ModelFamily::kLlama;
  c.vocab_size = 256;
  c.hidden_size = 128;
  c.num_layers = 6;
  c.num_heads = 4;
  c.num_kv_heads = 2;
  c.head_dim = 32;
  c.intermediate_size = 344;
  c.max_position_embeddings = 64;
  c.norm_eps = 1e-5;
  c.rope_theta = 10000;
  c.tie_word_embeddings = false;
  c.hidden_act = HiddenAct::kSilu;
  return c;
}

constexpr int64_t kChunkElems = 192 * 1024;
constexpr int64_t kBatch = 2;
constexpr int64_t kSeqLen = 24;  // not a multiple of the attention tile
// Three f32 chunk blocks, and room for the activations and the kernels' workspaces (the cuBLAS
// workspace is set to kCublasWorkspaceBytes below): well under the param chunks.
constexpr int64_t kCublasWorkspaceBytes = 256 * kKiB;
constexpr int64_t kBudgetBytes = 3 * kChunkElems * 4 + 2 * kMiB;

struct Rig {
  std::unique_ptr<Backend> backend;
  std::unique_ptr<DeviceMemory> accelerator;
  std::unique_ptr<DeviceMemory> host;
  std::unique_ptr<ChunkStore> store;
  std::unique_ptr<ThreadPool> pool;
  std::unique_ptr<Kernels> kernels;
  std::unique_ptr<Stream> compute_stream;
  std::unique_ptr<ChunkManager> manager;
  std::unique_ptr<GptModel> model;
};

absl::StatusOr<std::unique_ptr<Rig>> MakeRig(const ModelConfig& config, const std::string& kind,
                                             DType dtype) {
  auto rig = std::make_unique<Rig>();
  BackendOptions backend_options;
  backend_options.kind = kind;
  backend_options.capacity_bytes = 64 * kMiB;
  ASSIGN_OR_RETURN(rig->backend, CreateBackend(backend_options));
  DeviceMemoryOptions memory_options;
  memory_options.chunk_block_bytes = kChunkElems * 4;
  if (dtype != DType::kF32) memory_options.more_chunk_block_bytes = {kChunkElems * SizeOf(dtype)};
  ASSIGN_OR_RETURN(rig->accelerator, CreateAcceleratorMemory(rig->backend.get(), memory_options));
  ASSIGN_OR_RETURN(rig->host, CreateHostMemory(rig->backend.get(), memory_options));
  ASSIGN_OR_RETURN(ChunkLayout layout,
                   ChunkLayout::Build({.capacity_elems = kChunkElems}, ModelOperators(config, {})));
  ASSIGN_OR_RETURN(rig->store, ChunkStore::Create(std::move(layout), {.compute_dtype = dtype}));
  rig->pool = std::make_unique<ThreadPool>(2);
  ASSIGN_OR_RETURN(rig->kernels, CreateKernels(rig->backend.get(), {.cpu_pool = rig->pool.get(),
                                                                    .cuda_cublas_workspace_bytes =
                                                                        kCublasWorkspaceBytes}));
  ASSIGN_OR_RETURN(rig->compute_stream, rig->backend->CreateStream());
  ChunkManagerOptions manager_options;
  manager_options.device_budget_bytes = kBudgetBytes;
  manager_options.compute_stream = rig->compute_stream.get();
  ASSIGN_OR_RETURN(rig->manager,
                   ChunkManager::Create(rig->store.get(), rig->backend.get(),
                                        rig->accelerator.get(), rig->host.get(), manager_options));
  GptModelOptions model_options{.batch = kBatch, .seq_len = kSeqLen, .threads = 2};
  model_options.kernels = rig->kernels.get();
  model_options.compute_stream = rig->compute_stream.get();
  ASSIGN_OR_RETURN(rig->model,
                   TransformerModel::Create(config, rig->store.get(), rig->manager.get(),
                                            rig->accelerator.get(), model_options));
  return rig;
}

struct Pass {
  double loss = 0;
  std::vector<std::vector<float>> grads;  // by ParameterNames()
  int64_t host_to_device_bytes = 0;       // chunk loads during the pass
};

// Three iterations (the first is the warm-up) of forward and backward on seeded random batches;
// the last one's loss and gradients.
absl::StatusOr<Pass> RunPasses(const ModelConfig& config, const std::string& kind, DType dtype) {
  ASSIGN_OR_RETURN(std::unique_ptr<Rig> rig, MakeRig(config, kind, dtype));
  RETURN_IF_ERROR(rig->model->InitializeParameters(5));
  std::mt19937 rng(11);
  std::uniform_int_distribution<int32_t> token(0, static_cast<int32_t>(config.vocab_size) - 1);
  std::vector<int32_t> tokens(kBatch * kSeqLen), targets(kBatch * kSeqLen);
  Pass pass;
  for (int iteration = 0; iteration < 3; ++iteration) {
    for (int32_t& t : tokens) t = token(rng);
    for (int32_t& t : targets) t = token(rng);
    targets[3] = GptModel::kIgnoreIndex;
    const int64_t h2d_before = rig->backend->counters().host_to_device_bytes;
    RETURN_IF_ERROR(rig->manager->BeginIteration());
    ASSIGN_OR_RETURN(pass.loss, rig->model->ForwardBackward(tokens, targets));
    pass.host_to_device_bytes = rig->backend->counters().host_to_device_bytes - h2d_before;
    RETURN_IF_ERROR(rig->manager->EndIteration());
    if (iteration == 2) {
      for (const std::string& name : rig->model->ParameterNames()) {
        ASSIGN_OR_RETURN(std::vector<float> g, rig->model->ReadTensor(ChunkType::kParam, name));
        pass.grads.push_back(std::move(g));
      }
    } else {
      // The gradients are in the param slots: restore the parameters (as a skipped step would).
      RETURN_IF_ERROR(rig->model->InitializeParameters(5));
    }
  }
  return pass;
}

void ExpectGpuMatchesCpu(const ModelConfig& config, DType dtype) {
  PS_REQUIRE_GPUS(1);
  ASSERT_OK_AND_ASSIGN(const Pass cpu, RunPasses(config, "cpu", dtype));
  ASSERT_OK_AND_ASSIGN(const Pass gpu, RunPasses(config, "cuda", dtype));
  const bool f32 = dtype == DType::kF32;
  EXPECT_NEAR(gpu.loss, cpu.loss, (f32 ? 1e-5 : 1e-2) * std::abs(cpu.loss));
  EXPECT_GT(gpu.host_to_device_bytes, 0) << "the budget is below the param chunks";
  ASSERT_EQ(gpu.grads.size(), cpu.grads.size());
  for (size_t t = 0; t < cpu.grads.size(); ++t) {
    ASSERT_EQ(gpu.grads[t].size(), cpu.grads[t].size());
    float largest = 0;
    for (float g : cpu.grads[t]) largest = std::max(largest, std::abs(g));
    const double tolerance = (f32 ? 1e-4 : 3e-2) * largest + 1e-7;
    int64_t bad = 0;
    for (size_t i = 0; i < cpu.grads[t].size(); ++i) {
      if (!(std::abs(gpu.grads[t][i] - cpu.grads[t][i]) <= tolerance)) ++bad;
    }
    EXPECT_EQ(bad, 0) << "tensor " << t << " of " << cpu.grads.size() << ": " << bad
                      << " gradients beyond " << tolerance;
  }
}

TEST(GptModelCuda, Gpt2F32MatchesCpu) { ExpectGpuMatchesCpu(Gpt2Tiny(), DType::kF32); }
TEST(GptModelCuda, Gpt2Bf16MatchesCpu) { ExpectGpuMatchesCpu(Gpt2Tiny(), DType::kBF16); }
TEST(GptModelCuda, LlamaF32MatchesCpu) { ExpectGpuMatchesCpu(LlamaTiny(), DType::kF32); }
TEST(GptModelCuda, LlamaBf16MatchesCpu) { ExpectGpuMatchesCpu(LlamaTiny(), DType::kBF16); }

// The reference side under the same budget: it trains and chunks move (every iteration after the
// warm-up loads chunks), so the GPU comparison above is made under a cap.
TEST(GptModelCuda, CpuSideMovesChunksUnderTheBudget) {
  for (const ModelConfig& config : {Gpt2Tiny(), LlamaTiny()}) {
    for (const DType dtype : {DType::kF32, DType::kBF16}) {
      SCOPED_TRACE(absl::StrCat(config.name, " ", DTypeName(dtype)));
      ASSERT_OK_AND_ASSIGN(const Pass cpu, RunPasses(config, "cpu", dtype));
      EXPECT_TRUE(std::isfinite(cpu.loss));
      EXPECT_NEAR(cpu.loss, std::log(256.0), 0.5);
      EXPECT_GT(cpu.host_to_device_bytes, 0);
    }
  }
}

}  // namespace
}  // namespace ps
