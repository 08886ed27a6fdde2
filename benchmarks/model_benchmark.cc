// GptModel forward+backward on the CPU (emulated accelerator): tokens/s for GPT-2 124M at batch 1,
// sequence 256, f32 chunks, and the GEMM FLOP/s the iteration achieves as a fraction of
// OpenBLAS's sgemm peak, measured in the same run with the same OpenBLAS thread count.
//
// FLOPs are counted analytically (multiply-add = 2 FLOPs), N = B*T rows:
//   linear layers (c_attn, attn.c_proj, c_fc, mlp.c_proj): forward 2*N*in*out each, backward
//     twice that (dX and dW) — per block 24*N*C^2 forward;
//   LM head (tied wte): forward 2*N*C*V, backward 4*N*C*V (dh and d(wte)); the kernel also
//     recomputes the logits tile by tile in backward (another 2*N*C*V, "executed" column);
//   attention (causal, blockwise kernel, not BLAS): QK^T and PV over the causal triangle,
//     forward 2*T*(T+1)*C per sequence and layer, backward twice that (model FLOPs).
// The achieved rate is (model or executed) FLOPs / measured forward+backward time, and its fraction
// of the best cblas_sgemm rate on square matrices. Everything not a GEMM (LayerNorm, GELU,
// softmax, attention, chunk accesses) is time the GEMM rate has to absorb.
//
// Each timed iteration is BeginIteration, ForwardBackward (timed), then an untimed HybridAdam step
// at lr = 0 (it writes the unchanged master weights back over the gradients in the param slots)
// and EndIteration.
//
// Usage: bazel run //benchmarks:model_benchmark [-- --iters=N --threads=N --seq=N]
#include <cblas.h>

#include <algorithm>
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include "base/check.h"
#include "base/units.h"
#include "chunk/chunk_layout.h"
#include "chunk/chunk_store.h"
#include "chunk/operator_spec.h"
#include "glog/logging.h"
#include "memory/backend.h"
#include "memory/cpu_backend.h"
#include "memory/device_memory.h"
#include "memory/dtype.h"
#include "model/gpt_config.h"
#include "model/gpt_model.h"
#include "model/kernels/matmul.h"
#include "optimizer/cpu_adam.h"
#include "optimizer/hybrid_adam.h"
#include "trainer/scheduled_chunk_access.h"
#include "scheduler/chunk_manager.h"

namespace ps {
namespace {

using Clock = std::chrono::steady_clock;

double Seconds(Clock::time_point a, Clock::time_point b) {
  return std::chrono::duration<double>(b - a).count();
}

// Best-of-`reps` GFLOP/s of C = A B for [m,k] x [k,n] row-major f32 matrices.
double SgemmGflops(int m, int k, int n, int reps) {
  std::vector<float> a(static_cast<size_t>(m) * k), b(static_cast<size_t>(k) * n),
      c(static_cast<size_t>(m) * n);
  std::mt19937 gen(1);
  std::uniform_real_distribution<float> dist(-1.0f, 1.0f);
  for (float& x : a) x = dist(gen);
  for (float& x : b) x = dist(gen);
  const double flops = 2.0 * m * k * n;
  double best = 1e30;
  for (int r = 0; r < reps + 1; ++r) {  // the first run is a warm-up
    const auto t0 = Clock::now();
    cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, m, n, k, 1.0f, a.data(), k, b.data(), n,
                0.0f, c.data(), n);
    const double s = Seconds(t0, Clock::now());
    if (r > 0) best = std::min(best, s);
  }
  return flops / best / 1e9;
}

struct Flops {
  double linear_fwd = 0, linear_bwd = 0;
  double head_fwd = 0, head_bwd = 0, head_recompute = 0;
  double attn_fwd = 0, attn_bwd = 0;
  double ModelGemm() const { return linear_fwd + linear_bwd + head_fwd + head_bwd; }
  double ExecutedGemm() const { return ModelGemm() + head_recompute; }
  double Model() const { return ModelGemm() + attn_fwd + attn_bwd; }
};

Flops CountFlops(const GptConfig& c, int64_t batch, int64_t seq) {
  const double n = static_cast<double>(batch) * seq, C = c.hidden, V = c.vocab_size,
               L = c.num_layers, T = seq;
  Flops f;
  // c_attn C->3C, attn.c_proj C->C, c_fc C->4C, mlp.c_proj 4C->C: 12 C^2 multiply-adds per row.
  f.linear_fwd = L * 2.0 * n * 12.0 * C * C;
  f.linear_bwd = 2.0 * f.linear_fwd;
  f.head_fwd = 2.0 * n * C * V;
  f.head_bwd = 4.0 * n * C * V;
  f.head_recompute = 2.0 * n * C * V;
  f.attn_fwd = L * batch * 2.0 * T * (T + 1) * C;
  f.attn_bwd = 2.0 * f.attn_fwd;
  return f;
}

int64_t IntFlag(int argc, char** argv, const char* name, int64_t def) {
  const std::string prefix = std::string("--") + name + "=";
  for (int i = 1; i < argc; ++i) {
    if (std::strncmp(argv[i], prefix.c_str(), prefix.size()) == 0) {
      return std::atoll(argv[i] + prefix.size());
    }
  }
  return def;
}

int Main(int argc, char** argv) {
  const int threads = static_cast<int>(
      IntFlag(argc, argv, "threads", std::max(1u, std::thread::hardware_concurrency())));
  const int iters = static_cast<int>(IntFlag(argc, argv, "iters", 3));
  const int64_t seq = IntFlag(argc, argv, "seq", 256);
  const int64_t batch = 1;
  SetBlasThreads(threads);

  // (1) OpenBLAS sgemm peak, same thread count.
  std::printf("OpenBLAS threads: %d (model ThreadPool threads: %d)\n", BlasThreads(), threads);
  const double g1024 = SgemmGflops(1024, 1024, 1024, 5);
  const double g2048 = SgemmGflops(2048, 2048, 2048, 3);
  const double peak = std::max(g1024, g2048);
  // The model's own shapes (N = B*T rows) for reference: c_fc forward and the LM head tile.
  const double g_fc = SgemmGflops(static_cast<int>(batch * seq), 768, 3072, 5);
  std::printf("%-40s %10s\n", "cblas_sgemm", "GFLOP/s");
  std::printf("%-40s %10.1f\n", "  1024 x 1024 x 1024", g1024);
  std::printf("%-40s %10.1f\n", "  2048 x 2048 x 2048", g2048);
  std::printf("%-40s %10.1f  (%.0f%% of peak)\n", "  256 x 768 x 3072 (c_fc shape)", g_fc,
              100.0 * g_fc / peak);
  std::printf("%-40s %10.1f\n\n", "  peak (best square)", peak);

  // (2) The model: GPT-2 124M, f32 chunks of 40 Mi elements (the embedding operator, 39.4 M
  // elements, fits in one), everything resident on a 4 GiB emulated accelerator.
  auto config_or = GptPreset("gpt2");
  PS_CHECK_OK(config_or);
  const GptConfig config = *config_or;
  constexpr int64_t kChunkElems = 40 * kMiB;
  auto backend_or = CreateCpuBackend({.capacity_bytes = 4 * kGiB});
  PS_CHECK_OK(backend_or);
  std::unique_ptr<Backend> backend = std::move(*backend_or);
  DeviceMemoryOptions memory_options;
  memory_options.chunk_block_bytes = kChunkElems * 4;
  auto accel_or = CreateAcceleratorMemory(backend.get(), memory_options);
  PS_CHECK_OK(accel_or);
  std::unique_ptr<DeviceMemory> accelerator = std::move(*accel_or);
  memory_options.pinned = false;
  auto host_or = CreateHostMemory(backend.get(), memory_options);
  PS_CHECK_OK(host_or);
  std::unique_ptr<DeviceMemory> host = std::move(*host_or);
  auto layout_or = ChunkLayout::Build({.capacity_elems = kChunkElems}, GptOperators(config));
  PS_CHECK_OK(layout_or);
  auto store_or = ChunkStore::Create(std::move(*layout_or), {.compute_dtype = DType::kF32});
  PS_CHECK_OK(store_or);
  std::unique_ptr<ChunkStore> store = std::move(*store_or);
  auto manager_or =
      ChunkManager::Create(store.get(), backend.get(), accelerator.get(), host.get(), {});
  PS_CHECK_OK(manager_or);
  std::unique_ptr<ChunkManager> manager = std::move(*manager_or);
  GptModelOptions model_options;
  model_options.batch = batch;
  model_options.seq_len = seq;
  model_options.threads = threads;
  auto model_or =
      GptModel::Create(config, store.get(), manager.get(), accelerator.get(), model_options);
  PS_CHECK_OK(model_or);
  std::unique_ptr<GptModel> model = std::move(*model_or);
  PS_CHECK_OK(model->InitializeParameters(1));

  std::mt19937 gen(2);
  std::vector<int32_t> tokens(batch * seq + 1);
  for (int32_t& t : tokens) t = static_cast<int32_t>(gen() % config.vocab_size);
  std::vector<int32_t> targets(tokens.begin() + 1, tokens.end());
  tokens.pop_back();

  // Forward only (Evaluate: outside an iteration), for the forward/backward split.
  PS_CHECK_OK(model->Evaluate(tokens, targets));  // warm-up
  double fwd_s = 1e30;
  for (int i = 0; i < 2; ++i) {
    const auto t0 = Clock::now();
    PS_CHECK_OK(model->Evaluate(tokens, targets));
    fwd_s = std::min(fwd_s, Seconds(t0, Clock::now()));
  }

  // Forward+backward: one warm-up iteration (it records the access trace), then `iters` timed.
  // After the backward the param chunks' slots hold the gradients (gpt_model.h), so each
  // iteration ends with an untimed HybridAdam step at lr = 0 that writes the unchanged master
  // weights back into them; without it the next iteration would run on gradients as weights
  // (tiny and denormal values: 10x slower GEMMs).
  auto cpu_adam_or = CpuAdam::Create({.num_threads = threads});
  PS_CHECK_OK(cpu_adam_or);
  std::unique_ptr<CpuAdam> cpu_adam = std::move(*cpu_adam_or);
  HybridAdamOptions adam_options;
  adam_options.groups = {ParamGroupOptions{.name = "default", .lr = 0.0, .weight_decay = 0.0}};
  auto adam_or = HybridAdam::Create(store->layout(), 0, DType::kF32, adam_options,
                                    {.host = cpu_adam.get(), .accelerator = cpu_adam.get()});
  PS_CHECK_OK(adam_or);
  std::unique_ptr<HybridAdam> adam = std::move(*adam_or);

  std::vector<double> times, adam_times;
  double loss = 0;
  for (int i = 0; i < iters + 1; ++i) {
    PS_CHECK_OK(manager->BeginIteration());
    const ChunkManagerCounters before = manager->counters();
    const auto t0 = Clock::now();
    auto loss_or = model->ForwardBackward(tokens, targets, adam->loss_scaler().scale());
    PS_CHECK_OK(loss_or);
    const double s = Seconds(t0, Clock::now());
    const ChunkManagerCounters d = manager->counters().Minus(before);
    loss = *loss_or;
    const auto t1 = Clock::now();
    {
      auto placement_or = manager->BeginAdam();
      PS_CHECK_OK(placement_or);
      ScheduledChunkAccess access(*manager, *store, accelerator->device(),
                                  std::move(*placement_or));
      PS_CHECK_OK(adam->Step(access));
    }
    PS_CHECK_OK(manager->EndIteration());
    const double adam_s = Seconds(t1, Clock::now());
    std::printf("iteration %d%s: fwd+bwd %.3f s (chunk traffic %.0f MiB, copy stall %.3f s), "
                "untimed lr=0 Adam + EndIteration %.3f s, loss %.4f\n",
                i, i == 0 ? " (warm-up)" : "", s, d.Total().moved_bytes() / double(kMiB),
                d.stall_ns * 1e-9, adam_s, loss);
    if (i > 0) {
      times.push_back(s);
      adam_times.push_back(adam_s);
    }
  }
  std::sort(times.begin(), times.end());
  const double best = times.front(), median = times[times.size() / 2];
  double mean = 0;
  for (double t : times) mean += t;
  mean /= static_cast<double>(times.size());

  int64_t params = 0;
  for (const OperatorSpec& op : GptOperators(config)) {
    for (const TensorSpec& t : op.tensors) {
      int64_t n = 1;
      for (int64_t d : t.shape) n *= d;
      params += n;
    }
  }
  const Flops f = CountFlops(config, batch, seq);
  const double tokens_per_iter = static_cast<double>(batch * seq);
  std::printf("GPT-2 124M (%lld params), batch %lld x seq %lld, f32, %d timed iterations "
              "(+1 warm-up), last loss %.4f\n",
              static_cast<long long>(params), static_cast<long long>(batch),
              static_cast<long long>(seq), iters, loss);
  std::printf("%-40s %12s %12s %12s\n", "", "best", "median", "mean");
  std::printf("%-40s %12.3f %12.3f %12.3f\n", "fwd+bwd seconds / iteration", best, median, mean);
  std::printf("%-40s %12.1f %12.1f %12.1f\n", "tokens/s (fwd+bwd)", tokens_per_iter / best,
              tokens_per_iter / median, tokens_per_iter / mean);
  std::printf("\n%-40s %12s %12s\n", "FLOPs per iteration", "GFLOP", "share");
  const double total_exec = f.ExecutedGemm() + f.attn_fwd + f.attn_bwd;
  auto row = [&](const char* name, double v) {
    std::printf("%-40s %12.2f %11.1f%%\n", name, v / 1e9, 100.0 * v / total_exec);
  };
  row("  linear fwd", f.linear_fwd);
  row("  linear bwd (dX + dW)", f.linear_bwd);
  row("  LM head fwd", f.head_fwd);
  row("  LM head bwd (dh + dwte)", f.head_bwd);
  row("  LM head bwd logits recompute", f.head_recompute);
  row("  attention fwd (not BLAS)", f.attn_fwd);
  row("  attention bwd (not BLAS, model)", f.attn_bwd);
  std::printf("%-40s %12.2f\n", "  model GEMM total", f.ModelGemm() / 1e9);
  std::printf("%-40s %12.2f\n", "  executed GEMM total (with recompute)", f.ExecutedGemm() / 1e9);

  std::printf("\n%-40s %12s %12s\n", "achieved (best iteration)", "GFLOP/s", "of peak");
  auto rate = [&](const char* name, double flops) {
    const double g = flops / best / 1e9;
    std::printf("%-40s %12.1f %11.1f%%\n", name, g, 100.0 * g / peak);
  };
  rate("  model GEMM FLOPs / fwd+bwd time", f.ModelGemm());
  rate("  executed GEMM FLOPs / fwd+bwd time", f.ExecutedGemm());
  rate("  model FLOPs incl. attention", f.Model());
  std::printf("%-40s %12.1f\n", "  sgemm peak (same threads)", peak);

  std::printf("\n%-40s %12.3f s (%.0f%% of fwd+bwd; GEMM-only lower bound at peak %.3f s)\n",
              "forward only (Evaluate, best of 2)", fwd_s, 100.0 * fwd_s / best,
              (f.linear_fwd + f.head_fwd) / (peak * 1e9));
  std::printf("%-40s %12.3f s (GEMM-only lower bound at peak %.3f s)\n",
              "backward (fwd+bwd - forward)", best - fwd_s,
              (f.linear_bwd + f.head_bwd + f.head_recompute) / (peak * 1e9));
  return 0;
}

}  // namespace
}  // namespace ps

int main(int argc, char** argv) {
  google::InitGoogleLogging(argv[0]);
  return ps::Main(argc, argv);
}
