// CpuAdam: the AdamKernels (optimizer/adam_kernels.h) for memory the CPU can address — host RAM,
// and the emulated accelerator of the cpu backend, whose device memory is host RAM.
//
// Vectorized with Highway and dispatched at run time to the best instruction set of the running
// CPU (AVX-512, AVX2+FMA, SSE4, SSSE3 or scalar; no -march flag), multithreaded over an owned
// ThreadPool. Step is fused: one pass over memory reads the gradient in the compute dtype, and
// per element unscales and clips it, checks it for Inf/NaN, updates master, momentum and variance
// (optimizer/adam_math.h), and writes the new parameter back in the compute dtype.
//
// How the work is cut, and why results do not depend on the thread count: every segment is split
// into blocks of kCpuAdamBlockElems elements at fixed offsets from its start, and blocks are the
// tasks of the pool. Within a block, Step converts 16-bit gradients to f32 in registers (F16C for
// f16 on x86 from AVX2 up, integer arithmetic for bf16; bit-exact like memory/convert.h; f16
// elsewhere goes through an f32 tile of kCpuAdamTileElems), the update runs on whole vectors, the
// leftover elements of the segment's last vector run through AdamUpdate (adam_math.h), and the new
// master values are rounded to the compute dtype (round-to-nearest-even) in the same pass.
// GradientStats widens into f32 tiles; its partial sums are kept per tile and added in a fixed
// order. Which code path an element takes depends only on its offset in its segment and the
// segment's length, so for one instruction set the output bits are the same for any number of
// threads and any scheduling.
//
// Lengths and pointers: any n_elems >= 0; pointers need only their element alignment.
//
// Thread safety: all methods may be called concurrently (the pool serializes its jobs).
#ifndef PATRICKSTAR_OPTIMIZER_CPU_ADAM_H_
#define PATRICKSTAR_OPTIMIZER_CPU_ADAM_H_

#include <cstdint>
#include <memory>
#include <string>

#include "absl/flags/declare.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/types/span.h"
#include "base/thread_pool.h"
#include "optimizer/adam_kernels.h"

// Threads of a CpuAdam created with num_threads = 0; 0 here means every core.
ABSL_DECLARE_FLAG(int32_t, cpu_adam_threads);

namespace ps {

// Elements per task of the thread pool (a multiple of kCpuAdamTileElems).
inline constexpr int64_t kCpuAdamBlockElems = 32768;
// Elements per f32 staging tile (a multiple of every Highway vector length).
inline constexpr int64_t kCpuAdamTileElems = 1024;

struct CpuAdamOptions {
  // Threads of the pool, the calling thread included. 0: the --cpu_adam_threads flag, whose
  // default 0 means std::thread::hardware_concurrency().
  int num_threads = 0;
};

class CpuAdam final : public AdamKernels {
 public:
  // InvalidArgument for num_threads < 0 (or a negative --cpu_adam_threads).
  static absl::StatusOr<std::unique_ptr<CpuAdam>> Create(const CpuAdamOptions& options = {});

  int num_threads() const { return pool_.num_threads(); }

  std::string name() const override;

  // Synchronous: the results are in memory when these return.
  [[nodiscard]] absl::StatusOr<GradStats> GradientStats(
      absl::Span<const GradSegment> segments) override;
  [[nodiscard]] absl::StatusOr<AdamStepResult> Step(
      absl::Span<const AdamSegment> segments) override;
  [[nodiscard]] absl::Status RestoreParams(absl::Span<const ParamRestoreSegment> segments) override;
  [[nodiscard]] absl::Status AccumulateGradients(
      absl::Span<const GradAccumulateSegment> segments) override;

 private:
  explicit CpuAdam(int num_threads) : pool_(num_threads) {}

  ThreadPool pool_;
};

// How the dispatched target's GradientStats sums squares (optimizer/grad_stats_math.h): its f32
// lanes per vector and whether its multiply-add is fused. CudaAdam reproduces that order, so a
// chunk's statistics have the same bits on either device.
struct CpuSumSquaresShape {
  int lanes = 1;
  bool fused = false;
};
CpuSumSquaresShape CpuAdamSumSquaresShape();

// The Highway target CpuAdam dispatches to right now ("AVX3", "AVX2", "SSE4", "SCALAR", ...).
// Tests may change it with hwy::SetSupportedTargetsForTest.
const char* CpuAdamTargetName();

}  // namespace ps

#endif  // PATRICKSTAR_OPTIMIZER_CPU_ADAM_H_
