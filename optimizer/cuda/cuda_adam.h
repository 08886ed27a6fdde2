// CudaAdam: the AdamKernels (optimizer/adam_kernels.h) for CUDA device memory, over the kernels of
// optimizer/cuda/adam_kernels.h. Built only under --config=cuda.
//
// Each call enqueues its kernels on the optimizer's own stream of the backend and waits for them
// before returning (GradientStats and Step need their results on the host; RestoreParams waits so
// that the chunk may be moved right after). Per call it costs one small device-to-host copy; the
// GPU part of a hybrid step is short next to the CPU part, so chunk-level overlap of the two is
// not attempted yet.
//
// Gradient statistics are summed per block in double on the GPU and the block sums in index order
// on the host, so they are reproducible run to run.
//
// Thread safety: calls are serialized internally (one workspace).
#ifndef PATRICKSTAR_OPTIMIZER_CUDA_CUDA_ADAM_H_
#define PATRICKSTAR_OPTIMIZER_CUDA_CUDA_ADAM_H_

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

namespace ps {

class CudaAdam final : public AdamKernels {
 public:
  // `backend` must be the cuda backend (memory/cuda/cuda_backend.h) and outlive the optimizer.
  // Allocates a small device workspace and pinned host buffer and creates a stream.
  // InvalidArgument for a non-cuda backend; the backend's errors otherwise.
  static absl::StatusOr<std::unique_ptr<CudaAdam>> Create(Backend& backend);
  ~CudaAdam() override;

  std::string name() const override { return "cuda"; }

  [[nodiscard]] absl::StatusOr<GradStats> GradientStats(
      absl::Span<const GradSegment> segments) override;
  [[nodiscard]] absl::StatusOr<AdamStepResult> Step(
      absl::Span<const AdamSegment> segments) override;
  [[nodiscard]] absl::Status RestoreParams(absl::Span<const ParamRestoreSegment> segments) override;
  // Unimplemented: the accumulator is host memory and CUDA payloads are device memory (gradient
  // accumulation is refused with accelerator.backend "cuda" before training starts).
  [[nodiscard]] absl::Status AccumulateGradients(
      absl::Span<const GradAccumulateSegment> segments) override;

 private:
  CudaAdam(Backend& backend, std::unique_ptr<Stream> stream, void* device_workspace,
           void* host_workspace)
      : backend_(backend),
        stream_(std::move(stream)),
        device_workspace_(device_workspace),
        host_workspace_(host_workspace) {}

  Backend& backend_;
  Mutex mu_;
  std::unique_ptr<Stream> stream_ ABSL_GUARDED_BY(mu_);
  // [kGradStatsMaxBlocks doubles][one unsigned long long counter], on the device and pinned.
  void* const device_workspace_;
  void* const host_workspace_;
};

}  // namespace ps

#endif  // PATRICKSTAR_OPTIMIZER_CUDA_CUDA_ADAM_H_
