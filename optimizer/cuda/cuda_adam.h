// CudaAdam: the AdamKernels (optimizer/adam_kernels.h) for CUDA device memory, over the kernels of
// optimizer/cuda/adam_kernels.h. Built only under --config=cuda.
//
// Each call enqueues its kernels on the optimizer's own stream of the backend and waits for them
// before returning (GradientStats and Step need their results on the host; RestoreParams waits so
// that the chunk may be moved right after). Per call it costs one small device-to-host copy; the
// GPU part of a hybrid step is short next to the CPU part, so chunk-level overlap of the two is
// not attempted yet.
//
// Results are CpuAdam's bit for bit on CPU targets with native FMA (AVX2, AVX-512): the step is
// adam_math.h's AdamUpdate with its explicit fused multiply-adds and nothing else contracted, and
// the gradient statistics run CpuAdam's summation order (optimizer/grad_stats_math.h) with the
// lanes of the CPU target this process dispatches to; the block sums are added in order on the
// host. So a chunk steps to the same bits on either device, and a resumed run (whose warm-up step
// runs every chunk on the CPU) continues bit-exactly.
//
// Gradient accumulation (gradient_accumulation_steps > 1). The f32 accumulator stays where the
// contract puts it, in host memory (optimizer/adam_kernels.h, optimizer/grad_accumulator.h), for
// GPU-placed chunks too: the ADAM-stage placement of a chunk may differ between the micro-batches
// of one step (every chunk runs on the host during the scheduler's warm-up iteration, on its
// planned device afterwards), and a host accumulator serves both kernels without moving; it also
// keeps the memory plan unchanged (GradientAccumulatorBytes are host bytes). The price is bus
// traffic: per micro-batch 8 bytes per accumulated element of a GPU chunk (the accumulator in and
// out), and 4 more at the step, when the update reads the sum.
//   - AccumulateGradients runs the kernel of optimizer/cuda/adam_kernels.h
//     (optimizer/grad_accumulate_math.h's arithmetic, bit-identical to CpuAdam's) on this
//     optimizer's stream. An accumulator the GPU can address (device memory, or pinned host memory
//     mapped into the unified address space) is updated in place; any other host accumulator
//     (the usual std::vector) is staged through a device tile of kCudaAdamStagingBytes, one tile at
//     a time: copied in, accumulated, copied back (stream-ordered copies of the backend).
//   - Step accepts gradients the GPU cannot address (the accumulated sum) the same way: each tile
//     is copied into the staging tile and updated from there; such a segment's param must be null
//     or device memory (the sum is f32 and HybridAdam writes the parameters with RestoreParams).
// Ordering: the gradients are written by the compute stream, which this optimizer's stream does not
// wait on. The caller must finish that work before calling: HybridAdam runs after the scheduler's
// BeginAdam, which host-waits for the compute stream (scheduler/chunk_manager.h), and its chunk
// access returns only resident payloads whose moves completed.
//
// Thread safety: calls are serialized internally (one workspace).
#ifndef PATRICKSTAR_OPTIMIZER_CUDA_CUDA_ADAM_H_
#define PATRICKSTAR_OPTIMIZER_CUDA_CUDA_ADAM_H_

#include <cstdint>
#include <memory>
#include <string>
#include <utility>

#include "absl/base/thread_annotations.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/types/span.h"
#include "base/mutex.h"
#include "memory/backend.h"
#include "optimizer/adam_kernels.h"
#include "optimizer/cuda_adam_footprint.h"

namespace ps {

// kCudaAdamStagingBytes, kCudaAdamWorkspaceBytes and their sum kCudaAdamDeviceBytes (what Create
// takes from the backend) are in optimizer/cuda_adam_footprint.h, for plans in builds without CUDA.

class CudaAdam final : public AdamKernels {
 public:
  // `backend` must be the cuda backend (memory/cuda/cuda_backend.h) and outlive the optimizer.
  // Allocates a small device workspace and pinned host buffer, the device staging tile
  // (kCudaAdamStagingBytes, from the backend, so it counts against the cap), and creates a stream.
  // InvalidArgument for a non-cuda backend; the backend's errors otherwise.
  static absl::StatusOr<std::unique_ptr<CudaAdam>> Create(Backend& backend);
  ~CudaAdam() override;

  std::string name() const override { return "cuda"; }

  [[nodiscard]] absl::StatusOr<GradStats> GradientStats(
      absl::Span<const GradSegment> segments) override;
  [[nodiscard]] absl::StatusOr<AdamStepResult> Step(
      absl::Span<const AdamSegment> segments) override;
  [[nodiscard]] absl::Status RestoreParams(absl::Span<const ParamRestoreSegment> segments) override;
  // acc += grad (see the top of the file): grad in device memory, acc in host or device memory.
  // Synchronous: the accumulator holds the sums when this returns.
  [[nodiscard]] absl::Status AccumulateGradients(
      absl::Span<const GradAccumulateSegment> segments) override;

 private:
  CudaAdam(Backend& backend, std::unique_ptr<Stream> stream, void* device_workspace,
           void* host_workspace, void* staging)
      : backend_(backend),
        stream_(std::move(stream)),
        device_workspace_(device_workspace),
        host_workspace_(host_workspace),
        staging_(staging) {}

  // Makes the backend's GPU current on the calling thread: every entry point launches kernels or
  // queries pointers, which go to the thread's current device, and a thread that never called
  // the backend (or last used another GPU) would otherwise use the wrong one.
  absl::Status MakeCurrent() const;

  // One Adam segment whose gradients the GPU cannot address, tile by tile through staging_.
  absl::Status StagedStep(const AdamSegment& segment, unsigned long long* counter)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // One accumulation segment whose accumulator the GPU cannot address, likewise.
  absl::Status StagedAccumulate(const GradAccumulateSegment& segment)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);

  Backend& backend_;
  Mutex mu_;
  std::unique_ptr<Stream> stream_ ABSL_GUARDED_BY(mu_);
  // [kGradStatsMaxBlocks doubles][one unsigned long long counter], on the device and pinned.
  void* const device_workspace_;
  void* const host_workspace_;
  // kCudaAdamStagingBytes of device memory.
  void* const staging_;
};

}  // namespace ps

#endif  // PATRICKSTAR_OPTIMIZER_CUDA_CUDA_ADAM_H_
