// GptModel (TransformerModel) training steps on the CPU (emulated accelerator) against the GEMM
// peak measured in the same run: GPT-2 124M at batch 4 x sequence 256 (the defaults), f32 and
// bf16 param chunks, activation checkpointing off and on; or any ModelPreset, the Llama
// architecture included (--model=llama-3.2-1b, --model=qwen2.5-0.5b), with --layers=K to keep the
// real widths, vocabulary and attention shape but only K layers (a full 1B step does not fit a
// 2-core, 24 GiB machine shared with other work; the output says when layers were cut).
//
// 1. Peaks, on the benchmark's thread count: OpenBLAS sgemm and the bf16 GEMM
//    (model/kernels/internal/bf16_gemm.h: oneDNN on AVX512-BF16, or its f32 fallback), both as the
//    kernels run them (grids fixed by the shape on the benchmark's pool), on square
//    matrices, best of several runs.
// 2. Kernel breakdown: every kernel a step runs, timed alone at the model's shapes on the same
//    thread pool, times the number of calls per step: where a step's time should go, next to the
//    GEMM FLOP rate of each GEMM shape (the shapes OpenBLAS or oneDNN handle badly show up here).
//    What the measured step spends beyond the sum is the rest: chunk accesses, allocations,
//    conversions of small parameters, thread hand-offs.
// 3. Whole training steps (GptModel::TrainStep: forward, backward, HybridAdam at lr = 0, so every
//    step computes on the same weights; two warm-up steps first, see kWarmupSteps): best and
//    median step time, its CPU time, and the useful FLOP rate as a fraction of the GEMM peak of the
//    step's precision (sgemm for f32, the bf16 GEMM for bf16). With --interleave (the default) the
//    configurations' steps alternate, so a drift in the machine's speed hits them alike.
//
// Useful FLOPs per step (multiply-add = 2): linear layers 6 * N * 12 C^2 * L (forward 2, backward
// 4); the tied LM head 6 * N * C * V; causal attention 4 * T(T+1)/2 * C * L * B forward (QK^T and
// PV over the causal triangle) and twice that backward. Llama: linear 6 N L (C (Q + 2K) + Q C +
// 3 C I), the LM head (tied or not) 6 N C V, attention with Q = heads x head_dim for C. The
// kernel breakdown (2.) covers GPT-2's kernels; for the Llama architecture it is the step's GEMMs
// (benchmarks/internal/gemm_breakdown.h: projections, LM head tiles), checkpointing off.
// Recomputation (the blocks' forward under activation checkpointing) is not useful work: it lowers
// the fraction, as it should.
//
//   bazel run //benchmarks:model_benchmark -- [--iters=3 --threads=0 --batch=4 --seq=256
//       --dtypes=f32,bf16 --checkpointing=off,on --breakdown=true --bf16_gemm=auto]
#include <sys/resource.h>

#include <algorithm>
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <fstream>
#include <functional>
#include <memory>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include "absl/flags/flag.h"
#include "absl/flags/parse.h"
#include "absl/strings/str_split.h"
#include "absl/types/span.h"
#include "base/check.h"
#include "base/thread_pool.h"
#include "base/units.h"
#include "benchmarks/internal/gemm_breakdown.h"
#include "chunk/chunk_layout.h"
#include "chunk/chunk_store.h"
#include "chunk/operator_spec.h"
#include "glog/logging.h"
#include "memory/backend.h"
#include "memory/cpu_backend.h"
#include "memory/device_memory.h"
#include "memory/dtype.h"
#include "memory/dtype_math.h"
#include "model/gpt_activation_profile.h"
#include "model/gpt_config.h"
#include "model/gpt_model.h"
#include "model/kernels/encoder.h"
#include "model/kernels/gelu.h"
#include "model/kernels/gqa_attention.h"
#include "model/kernels/internal/bf16_gemm.h"
#include "model/kernels/internal/blas.h"
#include "model/kernels/layernorm.h"
#include "model/kernels/lm_head_cross_entropy.h"
#include "model/kernels/matmul.h"
#include "model/kernels/residual.h"
#include "model/model_config.h"
#include "optimizer/cpu_adam.h"
#include "optimizer/hybrid_adam.h"

ABSL_FLAG(int32_t, iters, 3, "timed training steps per configuration (after two warm-up steps)");
ABSL_FLAG(int32_t, threads, 0, "threads (model pool and its GEMM grids, Adam); 0 = all cores");
ABSL_FLAG(int64_t, batch, 4, "sequences per batch");
ABSL_FLAG(int64_t, seq, 256, "tokens per sequence");
ABSL_FLAG(std::string, model, "gpt2", "ModelPreset name (GPT-2 or Llama architecture)");
ABSL_FLAG(int32_t, layers, 0, "keep only this many layers of the preset (0: all)");
ABSL_FLAG(std::string, dtypes, "f32,bf16", "param chunk dtypes to run (f32, bf16)");
ABSL_FLAG(std::string, checkpointing, "off,on", "activation checkpointing settings to run");
ABSL_FLAG(bool, breakdown, true, "time each kernel alone at the model's shapes");
ABSL_FLAG(bool, interleave, true,
          "build every configuration first and take their steps in turn (fair on a machine whose "
          "speed drifts; needs the memory of all of them at once), or run them one after another");
#include "scheduler/chunk_manager.h"
#include "trainer/train_step.h"

namespace ps {
namespace {

using Clock = std::chrono::steady_clock;
using kernels_internal::Bf16GemmBackend;

double Seconds(Clock::time_point a, Clock::time_point b) {
  return std::chrono::duration<double>(b - a).count();
}

// Best time of `reps` runs of fn after one warm-up run.
double BestSeconds(int reps, const std::function<void()>& fn) {
  fn();
  double best = 1e30;
  for (int r = 0; r < reps; ++r) {
    const auto t0 = Clock::now();
    fn();
    best = std::min(best, Seconds(t0, Clock::now()));
  }
  return best;
}

std::string LoadAverage() {
  std::ifstream f("/proc/loadavg");
  std::string a, b, c;
  f >> a >> b >> c;
  return a + " " + b + " " + c;
}

std::vector<float> RandomFloats(int64_t n, float scale, uint32_t seed) {
  std::mt19937 gen(seed);
  std::uniform_real_distribution<float> dist(-scale, scale);
  std::vector<float> v(static_cast<size_t>(n));
  for (float& x : v) x = dist(gen);
  return v;
}

std::vector<uint16_t> ToBf16(const std::vector<float>& v) {
  std::vector<uint16_t> out(v.size());
  for (size_t i = 0; i < v.size(); ++i) out[i] = FloatToBFloat16Bits(v[i]);
  return out;
}

// --- 1. Peaks -----------------------------------------------------------------------------------

// sgemm as the kernels run it: the shape-fixed grid of single-threaded OpenBLAS calls on `pool`
// (model/kernels/internal/blas.h).
double SgemmGflops(int n, int reps, ThreadPool* pool) {
  const std::vector<float> a = RandomFloats(int64_t{n} * n, 1, 1),
                           b = RandomFloats(int64_t{n} * n, 1, 2);
  std::vector<float> c(static_cast<size_t>(n) * n);
  const double s = BestSeconds(reps, [&] {
    kernels_internal::Gemm(false, false, n, n, n, 1.0f, a.data(), n, b.data(), n, 0.0f, c.data(), n,
                           pool);
  });
  return 2.0 * n * n * n / s / 1e9;
}

double Bf16GemmGflops(int n, int reps, ThreadPool* pool) {
  const std::vector<uint16_t> a = ToBf16(RandomFloats(int64_t{n} * n, 1, 3)),
                              b = ToBf16(RandomFloats(int64_t{n} * n, 1, 4));
  std::vector<float> c(static_cast<size_t>(n) * n);
  const double s = BestSeconds(reps, [&] {
    PS_CHECK_OK(kernels_internal::GemmBf16({.m = n,
                                            .n = n,
                                            .k = n,
                                            .a = a.data(),
                                            .lda = n,
                                            .b = b.data(),
                                            .ldb = n,
                                            .c = c.data(),
                                            .ldc = n},
                                           pool));
  });
  return 2.0 * n * n * n / s / 1e9;
}

struct Peaks {
  double sgemm = 0, bf16 = 0;
};

Peaks MeasurePeaks(ThreadPool* pool) {
  Peaks p;
  p.sgemm = std::max(SgemmGflops(1024, 5, pool), SgemmGflops(2048, 3, pool));
  p.bf16 = std::max(Bf16GemmGflops(1024, 5, pool), Bf16GemmGflops(2048, 3, pool));
  return p;
}

// --- FLOPs --------------------------------------------------------------------------------------

// Useful FLOPs per step: model/model_config.h's ModelTrainingFlops (the formulas above).
using Flops = ModelFlops;

// --- 2. Kernel breakdown ------------------------------------------------------------------------

struct Row {
  std::string name;
  double calls_off = 0, calls_on = 0;  // per step, checkpointing off / on
  double seconds = 0;                  // per call
  double gemm_flops = 0;               // per call (0: not a GEMM)
};

void PrintBreakdown(const char* title, const std::vector<Row>& rows, double peak) {
  std::printf("\n%s (per call, then per step with checkpointing off / on)\n", title);
  std::printf("%-34s %8s %9s %9s %10s %10s %8s\n", "kernel", "calls", "ms/call", "GFLOP/s",
              "of peak", "ms/step", "(on)");
  double total_off = 0, total_on = 0;
  for (const Row& r : rows) {
    const double off = r.calls_off * r.seconds * 1e3, on = r.calls_on * r.seconds * 1e3;
    total_off += off;
    total_on += on;
    if (r.gemm_flops > 0) {
      const double g = r.gemm_flops / r.seconds / 1e9;
      std::printf("%-34s %8.0f %9.3f %9.1f %9.0f%% %10.1f %8.1f\n", r.name.c_str(), r.calls_off,
                  r.seconds * 1e3, g, 100.0 * g / peak, off, on);
    } else {
      std::printf("%-34s %8.0f %9.3f %9s %10s %10.1f %8.1f\n", r.name.c_str(), r.calls_off,
                  r.seconds * 1e3, "", "", off, on);
    }
  }
  std::printf("%-34s %8s %9s %9s %10s %10.1f %8.1f\n", "sum", "", "", "", "", total_off, total_on);
}

// Times every kernel of a step at the model's shapes. bf16: the GEMM kernels' bf16 variants.
std::vector<Row> KernelBreakdown(const GptConfig& cfg, int64_t B, int64_t T, bool bf16,
                                 ThreadPool* pool, int64_t total_params) {
  const int64_t C = cfg.hidden, V = cfg.vocab_size, L = cfg.num_layers, H = cfg.num_heads;
  const int64_t N = B * T;
  constexpr int kReps = 3;
  std::vector<Row> rows;
  const double Ld = static_cast<double>(L);
  // Linear layers: forward once (twice with checkpointing), backward once.
  struct Linear {
    const char* name;
    int64_t in, out;
  };
  for (const Linear& l : {Linear{"attn.c_attn", C, 3 * C}, Linear{"attn.c_proj", C, C},
                          Linear{"mlp.c_fc", C, 4 * C}, Linear{"mlp.c_proj", 4 * C, C}}) {
    const MatmulShape s{N, l.in, l.out};
    const std::vector<float> x = RandomFloats(N * l.in, 1, 5),
                             w = RandomFloats(l.in * l.out, 0.02f, 6), b(l.out, 0.0f),
                             dy = RandomFloats(N * l.out, 1e-3f, 7);
    const std::vector<uint16_t> wb = ToBf16(w);
    std::vector<float> y(N * l.out), dx(N * l.in), dw(l.in * l.out), db(l.out);
    std::vector<float> ws(
        std::max(MatmulBf16ForwardWorkspaceElems(s), MatmulBf16BackwardWorkspaceElems(s)));
    const double flops = 2.0 * N * l.in * l.out;
    const bool recomputed = std::string(l.name) != "mlp.c_proj";
    const double fwd = BestSeconds(kReps, [&] {
      if (bf16) {
        PS_CHECK_OK(MatmulForwardBf16(s, x, wb, b, absl::MakeSpan(y), absl::MakeSpan(ws), pool));
      } else {
        PS_CHECK_OK(MatmulForward<float>(s, x, w, b, absl::MakeSpan(y), pool));
      }
    });
    const double bwd = BestSeconds(kReps, [&] {
      if (bf16) {
        PS_CHECK_OK(MatmulBackwardBf16(s, x, wb, dy, absl::MakeSpan(dx), absl::MakeSpan(dw),
                                       absl::MakeSpan(db), absl::MakeSpan(ws), pool));
      } else {
        PS_CHECK_OK(MatmulBackward<float>(s, x, w, dy, absl::MakeSpan(dx), absl::MakeSpan(dw),
                                          absl::MakeSpan(db), pool));
      }
    });
    rows.push_back({std::string(l.name) + " fwd " + std::to_string(N) + "x" +
                        std::to_string(l.out) + "x" + std::to_string(l.in),
                    Ld, recomputed ? 2 * Ld : Ld, fwd, flops});
    rows.push_back({std::string(l.name) + " bwd (dx, dw, db)", Ld, Ld, bwd, 2 * flops});
  }
  // LM head + cross-entropy: the training step runs the fused forward+backward kernel.
  {
    const LmHeadCrossEntropyShape ce{.rows = N, .channels = C, .vocab_size = V};
    const std::vector<float> h = RandomFloats(N * C, 1, 8), wte = RandomFloats(V * C, 0.02f, 9);
    const std::vector<uint16_t> wteb = ToBf16(wte);
    std::vector<int32_t> targets(N);
    for (int64_t i = 0; i < N; ++i) targets[i] = static_cast<int32_t>((i * 7919) % V);
    std::vector<float> lse(N), dh(N * C), dwte(V * C);
    std::vector<float> ws(bf16 ? LmHeadCrossEntropyFusedBf16WorkspaceElems(ce)
                               : LmHeadCrossEntropyFusedWorkspaceElems(ce));
    const double s = BestSeconds(1, [&] {
      if (bf16) {
        PS_CHECK_OK(LmHeadCrossEntropyForwardBackwardBf16(
                        ce, h, wteb, targets, 1.0, absl::MakeSpan(lse), absl::MakeSpan(dh),
                        absl::MakeSpan(dwte), absl::MakeSpan(ws), pool)
                        .status());
      } else {
        PS_CHECK_OK(LmHeadCrossEntropyForwardBackward<float>(
                        ce, h, wte, targets, 1.0, absl::MakeSpan(lse), absl::MakeSpan(dh),
                        absl::MakeSpan(dwte), absl::MakeSpan(ws), pool)
                        .status());
      }
    });
    rows.push_back({"LM head + CE fwd+bwd (fused)", 1, 1, s, 3 * 2.0 * N * C * V});
  }
  // Attention.
  {
    // GPT-2's fused qkv read through row strides of 3C (one attention kernel, kv heads = heads).
    const GqaAttentionShape att{.batch = B,
                                .seq_len = T,
                                .num_heads = H,
                                .num_kv_heads = H,
                                .head_dim = C / H,
                                .tile = 64,
                                .q_row_stride = 3 * C,
                                .kv_row_stride = 3 * C};
    const std::vector<float> qkv = RandomFloats(N * 3 * C, 1, 10),
                             dout = RandomFloats(N * C, 1, 11);
    std::vector<float> out(N * C), lse(B * H * T), dqkv(N * 3 * C),
        ws(GqaAttentionWorkspaceElems(att, pool == nullptr ? 1 : pool->num_threads()));
    const int64_t n = GqaAttentionQElems(att);
    const absl::Span<const float> x(qkv);
    const absl::Span<float> dx = absl::MakeSpan(dqkv);
    const double fwd = BestSeconds(kReps, [&] {
      PS_CHECK_OK(GqaAttentionForward<float>(att, x.subspan(0, n), x.subspan(C, n),
                                             x.subspan(2 * C, n), absl::MakeSpan(out),
                                             absl::MakeSpan(lse), absl::MakeSpan(ws), pool));
    });
    const double bwd = BestSeconds(kReps, [&] {
      PS_CHECK_OK(GqaAttentionBackward<float>(att, x.subspan(0, n), x.subspan(C, n),
                                              x.subspan(2 * C, n), out, lse, dout, dx.subspan(0, n),
                                              dx.subspan(C, n), dx.subspan(2 * C, n), pool));
    });
    rows.push_back({"attention fwd", Ld, 2 * Ld, fwd, 0});
    rows.push_back({"attention bwd", Ld, Ld, bwd, 0});
  }
  // Element-wise kernels.
  {
    const std::vector<float> x = RandomFloats(N * C, 1, 12), w(C, 1.0f), b(C, 0.0f),
                             dy = RandomFloats(N * C, 1, 13);
    std::vector<float> y(N * C), mean(N), rstd(N), dx(N * C), dw(C), db(C);
    const double fwd = BestSeconds(kReps, [&] {
      PS_CHECK_OK(LayerNormForward<float>({N, C}, x, w, b, absl::MakeSpan(y), absl::MakeSpan(mean),
                                          absl::MakeSpan(rstd), pool));
    });
    const double bwd = BestSeconds(kReps, [&] {
      PS_CHECK_OK(LayerNormBackward<float>({N, C}, x, w, mean, rstd, dy, absl::MakeSpan(dx),
                                           absl::MakeSpan(dw), absl::MakeSpan(db), pool));
    });
    rows.push_back({"layernorm fwd", 2 * Ld + 1, 4 * Ld + 1, fwd, 0});
    rows.push_back({"layernorm bwd", 2 * Ld + 1, 2 * Ld + 1, bwd, 0});
    const double res_fwd = BestSeconds(
        kReps, [&] { PS_CHECK_OK(ResidualForward<float>(x, dy, absl::MakeSpan(y), pool)); });
    const double res_bwd = BestSeconds(kReps, [&] {
      PS_CHECK_OK(ResidualBackward<float>(x, absl::MakeSpan(y), absl::MakeSpan(dx), pool));
    });
    rows.push_back({"residual fwd", 2 * Ld, 3 * Ld, res_fwd, 0});
    rows.push_back({"residual bwd", 2 * Ld, 2 * Ld, res_bwd, 0});
  }
  {
    const std::vector<float> x = RandomFloats(N * 4 * C, 2, 14),
                             dy = RandomFloats(N * 4 * C, 1, 15);
    std::vector<float> y(N * 4 * C), dx(N * 4 * C);
    const double fwd =
        BestSeconds(kReps, [&] { PS_CHECK_OK(GeluForward<float>(x, absl::MakeSpan(y), pool)); });
    const double bwd = BestSeconds(
        kReps, [&] { PS_CHECK_OK(GeluBackward<float>(x, dy, absl::MakeSpan(dx), pool)); });
    rows.push_back({"gelu fwd", Ld, 2 * Ld, fwd, 0});
    rows.push_back({"gelu bwd", Ld, Ld, bwd, 0});
  }
  {
    const EncoderShape es{B, T, C, V, cfg.max_seq_len};
    std::vector<int32_t> tokens(N);
    for (int64_t i = 0; i < N; ++i) tokens[i] = static_cast<int32_t>((i * 104729) % V);
    const std::vector<float> wte = RandomFloats(V * C, 0.02f, 16),
                             wpe = RandomFloats(cfg.max_seq_len * C, 0.02f, 17),
                             dout = RandomFloats(N * C, 1, 18);
    std::vector<float> out(N * C), dwte(V * C), dwpe(cfg.max_seq_len * C);
    const double fwd = BestSeconds(kReps, [&] {
      PS_CHECK_OK(EncoderForward<float>(es, tokens, wte, wpe, absl::MakeSpan(out), pool));
    });
    const double bwd = BestSeconds(kReps, [&] {
      PS_CHECK_OK(EncoderBackward<float>(es, tokens, dout, absl::MakeSpan(dwte),
                                         absl::MakeSpan(dwpe), pool));
    });
    rows.push_back({"encoder fwd", 1, 1, fwd, 0});
    rows.push_back({"encoder bwd", 1, 1, bwd, 0});
  }
  // The optimizer: one fused Adam pass over every parameter.
  {
    auto adam_or = CpuAdam::Create({.num_threads = pool == nullptr ? 1 : pool->num_threads()});
    PS_CHECK_OK(adam_or);
    std::vector<float> master(total_params, 0.01f), m(total_params, 0.0f), v(total_params, 0.0f);
    std::vector<uint16_t> grad16(bf16 ? total_params : 0, FloatToBFloat16Bits(1e-3f));
    std::vector<float> grad32(bf16 ? 0 : total_params, 1e-3f);
    const AdamStepScalars sc = MakeAdamStepScalars(AdamMode::kAdam, 0.0, 0.9, 0.999, 1e-8, 0.0,
                                                   /*step=*/1, /*loss_scale=*/1.0);
    const AdamSegment seg{sc,
                          bf16 ? DType::kBF16 : DType::kF32,
                          bf16 ? static_cast<const void*>(grad16.data()) : grad32.data(),
                          bf16 ? static_cast<void*>(grad16.data()) : grad32.data(),
                          master.data(),
                          m.data(),
                          v.data(),
                          total_params};
    const double s = BestSeconds(1, [&] { PS_CHECK_OK((*adam_or)->Step({&seg, 1}).status()); });
    rows.push_back({"Adam (all parameters)", 1, 1, s, 0});
  }
  return rows;
}

// --- 3. Whole steps -----------------------------------------------------------------------------

struct StepResult {
  double best_s = 0, median_s = 0, fwd_bwd_s = 0, adam_s = 0, loss = 0;
  // The GEMM peak of the step's precision probed right before and after each timed step (the
  // higher of the two), and the step's useful FLOP rate as a fraction of it: best and median over
  // the steps. On a machine shared with other work the rate of both drifts together.
  double best_fraction = 0, median_fraction = 0, probe_peak_at_best = 0;
  // CPU time (user + system, every thread of the process) of the least costly timed step: unlike
  // the wall time, it barely moves when other processes share the cores, so dtypes can be compared
  // on a busy machine.
  double best_cpu_s = 0;
};

// User + system CPU seconds of the whole process so far.
double ProcessCpuSeconds() {
  rusage u;
  getrusage(RUSAGE_SELF, &u);
  return static_cast<double>(u.ru_utime.tv_sec + u.ru_stime.tv_sec) +
         1e-6 * static_cast<double>(u.ru_utime.tv_usec + u.ru_stime.tv_usec);
}

// A short probe of the GEMM peak (best of three 1024^3 products) for `dtype`'s GEMMs.
double ProbePeak(DType dtype, ThreadPool* pool) {
  return dtype == DType::kBF16 ? Bf16GemmGflops(1024, 3, pool) : SgemmGflops(1024, 3, pool);
}

// One configuration's training state (the model on the emulated accelerator, its chunks, Adam)
// and its timed steps so far. Members are destroyed in reverse order: the optimizer and the model
// before the manager, the store, the memories and the backend they use.
struct StepRun {
  DType dtype = DType::kF32;
  bool checkpointing = false;
  std::string name;  // "bf16, checkpointing off"
  std::unique_ptr<Backend> backend;
  std::unique_ptr<DeviceMemory> accelerator, host;
  std::unique_ptr<ChunkStore> store;
  std::unique_ptr<ChunkManager> manager;
  std::unique_ptr<GptModel> model;
  std::unique_ptr<CpuAdam> cpu_adam;
  std::unique_ptr<HybridAdam> adam;
  std::vector<int32_t> tokens, targets;
  int steps_done = 0;
  double peak_before = 0, best = 1e30;
  std::vector<double> times, fractions, cpu_times;
  StepResult result;
};

// Step 0 is the ChunkManager's warm-up iteration (it records the activation tide); step 1 then
// moves the optimizer state to where the tide leaves room for it for good (a one-time load of up
// to the whole state); from step 2 on, steps are alike.
constexpr int kWarmupSteps = 2;

std::unique_ptr<StepRun> MakeRun(const ModelConfig& config, int64_t batch, int64_t seq, int threads,
                                 DType dtype, bool checkpointing) {
  auto run = std::make_unique<StepRun>();
  run->dtype = dtype;
  run->checkpointing = checkpointing;
  run->name = std::string(DTypeName(dtype)) + ", activation checkpointing " +
              (checkpointing ? "on" : "off");
  const bool gpt2 = config.architecture() == ModelArchitecture::kGpt2;
  // GPT-2: chunks of 40M elements (the embedding operator, 39.4M elements, fits whole). Llama:
  // the smallest chunk of the model, the vocabulary in row blocks sized to it.
  const int64_t kChunkElems = gpt2 ? 40 * kMiB : ModelMinChunkElems(config, kDefaultVocabTileRows);
  VocabLayoutOptions vocab;
  if (!gpt2) {
    vocab.vocab_block_rows = GptVocabBlockRowsForChunk(GptConfigView(config), kChunkElems);
  }
  auto backend_or = CreateCpuBackend({.capacity_bytes = 6 * kGiB});
  PS_CHECK_OK(backend_or);
  run->backend = std::move(*backend_or);
  DeviceMemoryOptions memory_options;
  memory_options.chunk_block_bytes = kChunkElems * 4;
  auto accel_or = CreateAcceleratorMemory(run->backend.get(), memory_options);
  PS_CHECK_OK(accel_or);
  run->accelerator = std::move(*accel_or);
  memory_options.pinned = false;
  auto host_or = CreateHostMemory(run->backend.get(), memory_options);
  PS_CHECK_OK(host_or);
  run->host = std::move(*host_or);
  auto layout_or =
      ChunkLayout::Build({.capacity_elems = kChunkElems}, ModelOperators(config, vocab));
  PS_CHECK_OK(layout_or);
  auto store_or = ChunkStore::Create(std::move(*layout_or), {.compute_dtype = dtype});
  PS_CHECK_OK(store_or);
  run->store = std::move(*store_or);
  auto manager_or = ChunkManager::Create(run->store.get(), run->backend.get(),
                                         run->accelerator.get(), run->host.get(), {});
  PS_CHECK_OK(manager_or);
  run->manager = std::move(*manager_or);
  GptModelOptions model_options;
  model_options.batch = batch;
  model_options.seq_len = seq;
  model_options.threads = threads;
  model_options.activation_checkpointing = checkpointing;
  auto model_or = TransformerModel::Create(config, run->store.get(), run->manager.get(),
                                           run->accelerator.get(), model_options);
  PS_CHECK_OK(model_or);
  run->model = std::move(*model_or);
  PS_CHECK_OK(run->model->InitializeParameters(1));
  auto cpu_adam_or = CpuAdam::Create({.num_threads = threads});
  PS_CHECK_OK(cpu_adam_or);
  run->cpu_adam = std::move(*cpu_adam_or);
  HybridAdamOptions adam_options;
  // lr = 0: every step computes on the same weights (the optimizer's work is the same).
  adam_options.groups = {ParamGroupOptions{.name = "default", .lr = 0.0, .weight_decay = 0.0}};
  auto adam_or =
      HybridAdam::Create(run->store->layout(), 0, dtype, adam_options,
                         {.host = run->cpu_adam.get(), .accelerator = run->cpu_adam.get()});
  PS_CHECK_OK(adam_or);
  run->adam = std::move(*adam_or);

  std::mt19937 gen(2);
  run->tokens.resize(batch * seq + 1);
  for (int32_t& t : run->tokens) t = static_cast<int32_t>(gen() % config.vocab_size);
  run->targets.assign(run->tokens.begin() + 1, run->tokens.end());
  run->tokens.pop_back();
  return run;
}

// Runs and reports the run's next training step.
void RunOneStep(StepRun& run, double useful_flops, ThreadPool* pool) {
  const int i = run.steps_done++;
  if (i == 0) run.peak_before = ProbePeak(run.dtype, pool);
  const ChunkManagerCounters before = run.manager->counters();
  const auto t0 = Clock::now();
  const double cpu0 = ProcessCpuSeconds();
  auto step_or = TrainStep(*run.model, *run.manager, *run.adam, run.tokens, run.targets);
  PS_CHECK_OK(step_or);
  const double s = Seconds(t0, Clock::now());
  const double cpu_s = ProcessCpuSeconds() - cpu0;
  const ChunkManagerCounters moved = run.manager->counters().Minus(before);
  std::printf(
      "    %s, step %d%s: %.3f s (forward+backward %.3f s, optimizer %.3f s; CPU time %.3f s), "
      "loss %.4f; %s\n",
      run.name.c_str(), i, i < kWarmupSteps ? " (warm-up)" : "", s,
      step_or->forward_backward_ns * 1e-9, step_or->optimizer_ns * 1e-9, cpu_s, step_or->loss,
      moved.DebugString().c_str());
  std::fflush(stdout);
  if (i < kWarmupSteps) return;
  const double peak_after = ProbePeak(run.dtype, pool);
  const double peak = std::max(run.peak_before, peak_after);
  run.peak_before = peak_after;
  const double fraction = useful_flops / s / 1e9 / peak;
  std::printf("      useful %.1f GFLOP/s = %.1f%% of the adjacent GEMM peak probe (%.1f GFLOP/s)\n",
              useful_flops / s / 1e9, 100.0 * fraction, peak);
  run.times.push_back(s);
  run.fractions.push_back(fraction);
  run.cpu_times.push_back(cpu_s);
  StepResult& result = run.result;
  if (fraction > result.best_fraction) {
    result.best_fraction = fraction;
    result.probe_peak_at_best = peak;
  }
  if (s < run.best) {
    run.best = s;
    result.fwd_bwd_s = step_or->forward_backward_ns * 1e-9;
    result.adam_s = step_or->optimizer_ns * 1e-9;
  }
  result.loss = step_or->loss;
}

// The run's result over its timed steps.
StepResult Finish(StepRun& run) {
  std::sort(run.times.begin(), run.times.end());
  std::sort(run.fractions.begin(), run.fractions.end());
  StepResult result = run.result;
  result.best_s = run.times.front();
  result.median_s = run.times[run.times.size() / 2];
  result.median_fraction = run.fractions[run.fractions.size() / 2];
  result.best_cpu_s = *std::min_element(run.cpu_times.begin(), run.cpu_times.end());
  return result;
}

int Main() {
  int threads = absl::GetFlag(FLAGS_threads);
  if (threads <= 0) threads = static_cast<int>(std::max(1u, std::thread::hardware_concurrency()));
  const int iters = std::max(1, absl::GetFlag(FLAGS_iters));
  const int64_t batch = absl::GetFlag(FLAGS_batch), seq = absl::GetFlag(FLAGS_seq);
  auto model_or = ModelPreset(absl::GetFlag(FLAGS_model));
  PS_CHECK_OK(model_or);
  ModelConfig model = *model_or;
  const int64_t preset_layers = model.num_layers;
  if (absl::GetFlag(FLAGS_layers) > 0 && absl::GetFlag(FLAGS_layers) < model.num_layers) {
    model.num_layers = absl::GetFlag(FLAGS_layers);
  }
  const bool gpt2 = model.architecture() == ModelArchitecture::kGpt2;
  // The GPT-2 view (the kernel breakdown's shapes; for Llama only the common dimensions).
  const GptConfig config = gpt2 ? *ToGptConfig(model) : GptConfigView(model);
  ThreadPool pool(threads);
  Bf16GemmBackend bf16_backend;
  PS_CHECK_OK(kernels_internal::ResolveBf16GemmBackend(&bf16_backend));

  int64_t params = 0;
  for (const OperatorSpec& op : ModelOperators(model)) {
    for (const TensorSpec& t : op.tensors) {
      int64_t n = 1;
      for (int64_t d : t.shape) n *= d;
      params += n;
    }
  }
  const Flops flops = ModelTrainingFlops(model, batch, seq);
  std::printf(
      "model %s (%s architecture, %lld parameters), batch %lld x seq %lld; %d threads (model "
      "pool, OpenBLAS, Adam); load average %s\n",
      model.name.c_str(), gpt2 ? "GPT-2" : "Llama", static_cast<long long>(params),
      static_cast<long long>(batch), static_cast<long long>(seq), threads, LoadAverage().c_str());
  if (model.num_layers != preset_layers) {
    std::printf(
        "SHRUNK: %lld of the preset's %lld layers (--layers); widths, vocabulary and attention "
        "shape are the preset's\n",
        static_cast<long long>(model.num_layers), static_cast<long long>(preset_layers));
  }
  std::printf("bf16 GEMMs: %s (%s)\n",
              std::string(kernels_internal::Bf16GemmBackendName(bf16_backend)).c_str(),
              kernels_internal::OneDnnBf16Description().c_str());
  std::printf("useful GFLOP per step: %.1f (linear %.1f, LM head %.1f, attention %.1f)\n",
              flops.Total() / 1e9, flops.linear / 1e9, flops.head / 1e9, flops.attention / 1e9);

  Peaks peaks = MeasurePeaks(&pool);
  std::printf(
      "\nGEMM peaks (square 1024/2048, best): sgemm %.1f GFLOP/s, bf16 GEMM %.1f GFLOP/s "
      "(%.2fx)\n",
      peaks.sgemm, peaks.bf16, peaks.bf16 / peaks.sgemm);

  std::vector<DType> dtypes;
  for (absl::string_view d : absl::StrSplit(absl::GetFlag(FLAGS_dtypes), ',')) {
    if (d == "f32") dtypes.push_back(DType::kF32);
    if (d == "bf16") dtypes.push_back(DType::kBF16);
  }
  std::vector<bool> ckpts;
  for (absl::string_view c : absl::StrSplit(absl::GetFlag(FLAGS_checkpointing), ',')) {
    if (c == "off") ckpts.push_back(false);
    if (c == "on") ckpts.push_back(true);
  }

  if (absl::GetFlag(FLAGS_breakdown) && !gpt2) {
    // Llama: the step's GEMMs (benchmarks/internal/gemm_breakdown.h), one table per dtype, and
    // the skinny-GEMM grid against the former one when the step's rows are few.
    for (DType dtype : dtypes) {
      benchmarks_internal::GemmBreakdownShape shape;
      shape.rows = batch * seq;
      shape.hidden = model.hidden_size;
      shape.q_dim = model.q_size();
      shape.kv_dim = model.kv_size();
      shape.intermediate = model.intermediate_size;
      shape.vocab = model.vocab_size;
      shape.layers = model.num_layers;
      shape.bf16 = dtype == DType::kBF16;
      const double peak = 1e9 * (shape.bf16 ? peaks.bf16 : peaks.sgemm);  // FLOP/s
      benchmarks_internal::PrintGemmBreakdown(benchmarks_internal::TimeLlamaGemms(shape, 2, &pool),
                                              peak, shape.bf16 ? "bf16 GEMM" : "sgemm");
      if (dtype == dtypes.front() && shape.rows <= 256) {
        benchmarks_internal::PrintSkinnyGridAb(shape, 3, &pool);
      }
    }
  }
  if (absl::GetFlag(FLAGS_breakdown) && gpt2) {
    for (DType dtype : dtypes) {
      const bool bf16 = dtype == DType::kBF16;
      const std::vector<Row> rows = KernelBreakdown(config, batch, seq, bf16, &pool, params);
      PrintBreakdown(bf16 ? "kernel breakdown, bf16 GEMMs" : "kernel breakdown, f32", rows,
                     bf16 ? peaks.bf16 : peaks.sgemm);
    }
  }

  struct Done {
    DType dtype;
    bool checkpointing;
    StepResult r;
  };
  std::vector<Done> done;
  const int total_steps = iters + kWarmupSteps;
  if (absl::GetFlag(FLAGS_interleave)) {
    // Every configuration built first, then their steps taken in turn: a machine whose speed
    // drifts (a shared VM: +-15% between minutes on the 2-core Zen 3) slows them alike.
    std::vector<std::unique_ptr<StepRun>> runs;
    for (DType dtype : dtypes) {
      for (bool ckpt : ckpts) runs.push_back(MakeRun(model, batch, seq, threads, dtype, ckpt));
    }
    std::printf("\nsteps, the configurations in turn (--interleave):\n");
    for (int i = 0; i < total_steps; ++i) {
      for (auto& run : runs) RunOneStep(*run, flops.Total(), &pool);
    }
    for (auto& run : runs) done.push_back({run->dtype, run->checkpointing, Finish(*run)});
  } else {
    for (DType dtype : dtypes) {
      for (bool ckpt : ckpts) {
        std::unique_ptr<StepRun> run = MakeRun(model, batch, seq, threads, dtype, ckpt);
        std::printf("\n%s:\n", run->name.c_str());
        for (int i = 0; i < total_steps; ++i) RunOneStep(*run, flops.Total(), &pool);
        done.push_back({dtype, ckpt, Finish(*run)});
      }
    }
  }
  // The peaks again after the steps: the fractions use the higher of the two measurements.
  const Peaks after = MeasurePeaks(&pool);
  peaks.sgemm = std::max(peaks.sgemm, after.sgemm);
  peaks.bf16 = std::max(peaks.bf16, after.bf16);
  std::printf(
      "\nGEMM peaks after the steps: sgemm %.1f, bf16 %.1f GFLOP/s (fractions below use "
      "the higher: %.1f, %.1f); load average %s\n",
      after.sgemm, after.bf16, peaks.sgemm, peaks.bf16, LoadAverage().c_str());

  std::printf("\n%-6s %-5s %9s %9s %9s %9s %9s %11s %9s %9s %9s %8s %9s %8s\n", "dtype", "ckpt",
              "step best", "median", "fwd+bwd", "optim", "tokens/s", "useful GF/s", "of peak",
              "(probe)", "(median)", "vs f32", "CPU s", "(vs f32)");
  for (const Done& d : done) {
    const double peak = d.dtype == DType::kBF16 ? peaks.bf16 : peaks.sgemm;
    const double g = flops.Total() / d.r.best_s / 1e9;
    double f32_best = 0, f32_cpu = 0;
    for (const Done& e : done) {
      if (e.dtype == DType::kF32 && e.checkpointing == d.checkpointing) {
        f32_best = e.r.best_s;
        f32_cpu = e.r.best_cpu_s;
      }
    }
    char vs[32] = "", vs_cpu[32] = "";
    if (f32_best > 0) std::snprintf(vs, sizeof(vs), "%.2fx", f32_best / d.r.best_s);
    if (f32_cpu > 0) std::snprintf(vs_cpu, sizeof(vs_cpu), "%.2fx", f32_cpu / d.r.best_cpu_s);
    std::printf(
        "%-6s %-5s %9.3f %9.3f %9.3f %9.3f %9.0f %11.1f %8.1f%% %8.1f%% %8.1f%% %8s %9.3f %8s\n",
        DTypeName(d.dtype).data(), d.checkpointing ? "on" : "off", d.r.best_s, d.r.median_s,
        d.r.fwd_bwd_s, d.r.adam_s, static_cast<double>(batch * seq) / d.r.best_s, g,
        100.0 * g / peak, 100.0 * d.r.best_fraction, 100.0 * d.r.median_fraction, vs,
        d.r.best_cpu_s, vs_cpu);
  }
  std::printf(
      "of peak: the best step's useful FLOP rate over the run's GEMM peak (sgemm for f32, the bf16 "
      "GEMM for bf16, the higher of the measurements before and after the steps); (probe): the "
      "best per-step fraction of the peak probed right before and after that step; (median): the "
      "median per-step fraction; vs f32: step time ratio at the same checkpointing; CPU s: the "
      "least CPU time (user + system, all threads) of a timed step, and (vs f32) its ratio: the "
      "comparison that holds on a machine shared with other work\n");
  return 0;
}

}  // namespace
}  // namespace ps

int main(int argc, char** argv) {
  absl::ParseCommandLine(argc, argv);
  google::InitGoogleLogging(argv[0]);
  return ps::Main();
}
