// CPU Adam throughput (optimizer/cpu_adam.h) against the machine's memory bandwidth, measured in
// the same run: a STREAM triad (a[i] = b[i] + s * c[i], f32) on the same number of threads of the
// same kind of pool. The fused kernel is memory-bound, so its bytes/s as a fraction of the triad's
// is the figure of merit.
//
// Bytes are counted as STREAM does: bytes the loop reads plus bytes it writes, nothing for
// write-allocate traffic. Adam with f16/bf16 gradients in place moves 28 bytes per element
// (gradient 2 in, parameter 2 out, master/momentum/variance 4 in and 4 out each); with f32
// gradients 32. The triad moves 12 bytes per element. The triad is vectorized with Highway (best
// target, as STREAM compiled with -O3 -march=native would be) and run twice: with ordinary stores
// (STREAM's definition, the reference of the "of triad" column; its stores also cost a read for
// ownership that STREAM does not count, while Adam's stores go to lines it has just read) and with
// non-temporal stores, which avoid that read — the stricter reference of the "of NT triad" column.
//
// Rows: the fused kernel with f16, bf16 and f32 gradients on every Highway target the CPU
// supports (hwy::SetSupportedTargetsForTest restricts the dispatch; "*" marks the target the
// run-time dispatch picks), and the naive loop — AdamUpdate from optimizer/adam_math.h plus the
// scalar f16 conversions, element by element — on one thread and on the pool. Every row runs once
// as a warm-up before any is timed; then the rows are timed round-robin, each next to its two
// triads, --reps times, and each figure is the best of its reps: on a shared machine the
// available bandwidth drifts, and interleaving makes the rows see the same conditions. The last
// lines compare the dispatched f16 kernel with the triad (goal: >= 1.4x) and with the other
// targets.
//
//   bazel run //benchmarks:cpu_adam_benchmark -- --elems=67108864 --reps=5 --cpu_adam_threads=0
#include <algorithm>
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <functional>
#include <memory>
#include <random>
#include <string>
#include <vector>

#include "absl/flags/flag.h"
#include "absl/flags/parse.h"
#include "base/check.h"
#include "base/thread_pool.h"
#include "glog/logging.h"
#include "hwy/aligned_allocator.h"
#include "hwy/targets.h"
#include "memory/dtype.h"
#include "memory/dtype_math.h"
#include "optimizer/adam_kernels.h"
#include "optimizer/adam_math.h"
#include "optimizer/cpu_adam.h"

// The triad, once per SIMD target (hwy/foreach_target.h re-includes this file).
#undef HWY_TARGET_INCLUDE
#define HWY_TARGET_INCLUDE "benchmarks/cpu_adam_benchmark.cc"
#include "hwy/foreach_target.h"  // IWYU pragma: keep
#include "hwy/highway.h"

HWY_BEFORE_NAMESPACE();
namespace ps {
namespace adam_benchmark_internal {
namespace HWY_NAMESPACE {
namespace hn = hwy::HWY_NAMESPACE;

// a[i] = b[i] + s * c[i] for i in [begin, end). REQUIRES: begin and end are multiples of the
// vector length; with `non_temporal`, a + begin is vector-aligned.
void TriadTask(float* HWY_RESTRICT a, const float* HWY_RESTRICT b, const float* HWY_RESTRICT c,
               float s, int64_t begin, int64_t end, bool non_temporal) {
  const hn::ScalableTag<float> d;
  const auto vs = hn::Set(d, s);
  const int64_t lanes = static_cast<int64_t>(hn::Lanes(d));
  if (non_temporal) {
    for (int64_t i = begin; i < end; i += lanes) {
      hn::Stream(hn::MulAdd(vs, hn::LoadU(d, c + i), hn::LoadU(d, b + i)), d, a + i);
    }
  } else {
    for (int64_t i = begin; i < end; i += lanes) {
      hn::StoreU(hn::MulAdd(vs, hn::LoadU(d, c + i), hn::LoadU(d, b + i)), d, a + i);
    }
  }
}

}  // namespace HWY_NAMESPACE
}  // namespace adam_benchmark_internal
}  // namespace ps
HWY_AFTER_NAMESPACE();

#if HWY_ONCE

ABSL_FLAG(int64_t, elems, int64_t{64} << 20, "elements per chunk (64M by default)");
ABSL_FLAG(int32_t, reps, 5, "timed runs per row; the best is reported");

namespace ps {
namespace adam_benchmark_internal {
HWY_EXPORT(TriadTask);
void Triad(float* a, const float* b, const float* c, float s, int64_t begin, int64_t end,
           bool non_temporal) {
  HWY_DYNAMIC_DISPATCH(TriadTask)(a, b, c, s, begin, end, non_temporal);
}
}  // namespace adam_benchmark_internal

namespace {

// Elements per task of the triad's and the naive loop's pool (as CpuAdam's blocks).
constexpr int64_t kTaskElems = kCpuAdamBlockElems;

double Seconds(const std::function<void()>& run) {
  const auto start = std::chrono::steady_clock::now();
  run();
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
}

void ForEachTask(ThreadPool& pool, int64_t n, const std::function<void(int64_t, int64_t)>& fn) {
  const int64_t tasks = (n + kTaskElems - 1) / kTaskElems;
  pool.ParallelFor(tasks, [&](int64_t task) {
    const int64_t begin = task * kTaskElems;
    fn(begin, std::min(n, begin + kTaskElems));
  });
}

// Best times of one row's kernel and of the two triads measured next to it.
struct Measurement {
  double kernel_s = 1e30;
  double triad_s = 1e30;
  double nt_triad_s = 1e30;
};

// One row: a kernel, the Highway targets it runs with (0: all the CPU supports), its labels and
// the bytes it moves per element.
struct RowSpec {
  std::string kernel, target;
  int threads;
  int64_t bytes_per_elem;
  int64_t targets;
  std::function<void()> run;
};

class Bench {
 public:
  Bench(int64_t n, ThreadPool& pool)
      : n_(n),
        pool_(pool),
        a_(hwy::AllocateAligned<float>(n)),
        b_(hwy::AllocateAligned<float>(n)),
        c_(hwy::AllocateAligned<float>(n)) {
    for (int64_t i = 0; i < n; ++i) {
      a_[i] = 0.0f;
      b_[i] = 1.0f;
      c_[i] = 2.0f;
    }
  }

  // Runs every row once untimed, then `reps` rounds over all rows, each row's kernel (restricted
  // to its targets) followed by the two triads (best target).
  std::vector<Measurement> MeasureRoundRobin(const std::vector<RowSpec>& rows, int reps) {
    std::vector<Measurement> best(rows.size());
    for (int r = 0; r <= reps; ++r) {  // round 0 is the warm-up
      for (size_t k = 0; k < rows.size(); ++k) {
        hwy::SetSupportedTargetsForTest(rows[k].targets);
        const double kernel = Seconds(rows[k].run);
        hwy::SetSupportedTargetsForTest(0);
        const double t = Seconds([&] { Triad(false); });
        const double nt = Seconds([&] { Triad(true); });
        if (r == 0) continue;
        best[k].kernel_s = std::min(best[k].kernel_s, kernel);
        best[k].triad_s = std::min(best[k].triad_s, t);
        best[k].nt_triad_s = std::min(best[k].nt_triad_s, nt);
      }
    }
    CHECK_EQ(a_[n_ - 1], 7.0f);
    return best;
  }

 private:
  void Triad(bool non_temporal) {
    ForEachTask(pool_, n_, [&](int64_t begin, int64_t end) {
      adam_benchmark_internal::Triad(a_.get(), b_.get(), c_.get(), 3.0f, begin, end, non_temporal);
    });
  }

  const int64_t n_;
  ThreadPool& pool_;
  hwy::AlignedFreeUniquePtr<float[]> a_, b_, c_;
};

// Bytes per second of the row relative to its triads.
double OfTriad(const RowSpec& row, const Measurement& m, int64_t elems) {
  const double bytes_per_s =
      static_cast<double>(elems) / m.kernel_s * static_cast<double>(row.bytes_per_elem);
  return bytes_per_s / (12.0 * static_cast<double>(elems) / m.triad_s);
}

void PrintRow(const RowSpec& row, int64_t elems, const Measurement& m) {
  const double elems_per_s = static_cast<double>(elems) / m.kernel_s;
  const double bytes_per_s = elems_per_s * static_cast<double>(row.bytes_per_elem);
  const double triad = 12.0 * static_cast<double>(elems) / m.triad_s;
  const double nt_triad = 12.0 * static_cast<double>(elems) / m.nt_triad_s;
  std::printf("%-26s %-8s %7d %9.1f %7.2f %8.2f %9.2f %8.1f%% %8.1f%%\n", row.kernel.c_str(),
              row.target.c_str(), row.threads, elems_per_s / 1e6, bytes_per_s / 1e9, triad / 1e9,
              nt_triad / 1e9, 100.0 * bytes_per_s / triad, 100.0 * bytes_per_s / nt_triad);
  std::fflush(stdout);
}

int Main() {
  const int64_t n = absl::GetFlag(FLAGS_elems);
  const int reps = absl::GetFlag(FLAGS_reps);
  CHECK_GT(reps, 0);
  CHECK(n > 0 && n % kTaskElems == 0) << "--elems must be a positive multiple of " << kTaskElems;
  auto adam_or = CpuAdam::Create();
  PS_CHECK_OK(adam_or);
  std::unique_ptr<CpuAdam> adam = *std::move(adam_or);
  const int threads = adam->num_threads();
  ThreadPool pool(threads);
  Bench bench(n, pool);

  // Adam state: one chunk of each type.
  std::mt19937 rng(1);
  std::normal_distribution<float> normal;
  std::vector<float> master(n), m(n, 0.0f), v(n, 0.0f), grad32(n);
  std::vector<uint16_t> grad16(n), grad_bf16(n);
  for (int64_t i = 0; i < n; ++i) {
    master[i] = normal(rng) * 0.02f;
    const float g = normal(rng) * 1024.0f;
    grad32[i] = g;
    grad16[i] = FloatToHalfBits(g);
    grad_bf16[i] = FloatToBFloat16Bits(g);
  }
  // The parameters overwrite the gradients in place; nothing is reset between runs (the values
  // stay finite and the work per element does not depend on them).
  const AdamStepScalars s = MakeAdamStepScalars(AdamMode::kAdamW, 1e-3, 0.9, 0.999, 1e-8, 0.01,
                                                /*step=*/10, /*loss_scale=*/1024.0);

  auto fused = [&](DType dtype, void* grad) {
    return std::function<void()>(
        [&adam, segment = AdamSegment{s, dtype, grad, grad, master.data(), m.data(), v.data(), n}] {
          PS_CHECK_OK(adam->Step({&segment, 1}));
        });
  };
  // The target the dispatch picks with all targets allowed.
  hwy::SetSupportedTargetsForTest(0);
  const std::string dispatched = CpuAdamTargetName();

  std::vector<RowSpec> rows;
  struct Grad {
    const char* name;
    DType dtype;
    void* data;
    int64_t bytes;
  };
  for (const Grad& g : {Grad{"f16", DType::kF16, grad16.data(), 28},
                        Grad{"bf16", DType::kBF16, grad_bf16.data(), 28},
                        Grad{"f32", DType::kF32, grad32.data(), 32}}) {
    for (int64_t target : hwy::SupportedAndGeneratedTargets()) {
      const std::string name = hwy::TargetName(target);
      rows.push_back({std::string("CpuAdam fused, ") + g.name + " grads",
                      name + (name == dispatched ? " *" : ""), threads, g.bytes, target,
                      fused(g.dtype, g.data)});
    }
  }
  // The naive loop: the scalar reference element by element.
  auto naive = [&](int64_t begin, int64_t end) {
    for (int64_t i = begin; i < end; ++i) {
      float p = master[i];
      float mi = m[i];
      float vi = v[i];
      AdamUpdate(s, HalfBitsToFloat(grad16[i]), p, mi, vi);
      master[i] = p;
      m[i] = mi;
      v[i] = vi;
      grad16[i] = FloatToHalfBits(p);
    }
  };
  rows.push_back({"naive scalar loop, f16", "-", 1, 28, 0, [&] { naive(0, n); }});
  rows.push_back(
      {"naive scalar loop, f16", "-", threads, 28, 0, [&] { ForEachTask(pool, n, naive); }});

  std::printf(
      "cpu_adam_benchmark: %lld elements per chunk, %d threads, best of %d round-robin rounds "
      "after a warm-up round; bytes counted as STREAM does (Adam: 28 B/elem with 16-bit "
      "gradients, 32 with f32; triad: 12 B/elem); * = the target the dispatch picks\n",
      static_cast<long long>(n), threads, reps);
  const std::vector<Measurement> best = bench.MeasureRoundRobin(rows, reps);
  std::printf("%-26s %-8s %7s %9s %7s %8s %9s %9s %9s\n", "kernel", "target", "threads", "Melem/s",
              "GB/s", "triad", "NT triad", "of triad", "of NT");
  for (size_t k = 0; k < rows.size(); ++k) PrintRow(rows[k], n, best[k]);

  // The acceptance figures: the dispatched f16 kernel against the triad and the other targets.
  for (size_t k = 0; k < rows.size(); ++k) {
    if (rows[k].kernel != "CpuAdam fused, f16 grads" || rows[k].target != dispatched + " *") {
      continue;
    }
    std::printf("\ndispatched f16 kernel (%s): %.2fx the triad (goal >= 1.4x)", dispatched.c_str(),
                OfTriad(rows[k], best[k], n));
    for (size_t j = 0; j < rows.size(); ++j) {
      if (j == k || rows[j].kernel != rows[k].kernel) continue;
      std::printf("; %.2fx %s", best[j].kernel_s / best[k].kernel_s, rows[j].target.c_str());
    }
    std::printf("\n");
  }
  return 0;
}

}  // namespace
}  // namespace ps

int main(int argc, char** argv) {
  absl::ParseCommandLine(argc, argv);
  return ps::Main();
}

#endif  // HWY_ONCE
