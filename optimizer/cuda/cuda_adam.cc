#include "optimizer/cuda/cuda_adam.h"

#include <cuda_runtime.h>

#include <algorithm>
#include <cstdint>
#include <cstring>
#include <memory>
#include <utility>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/str_cat.h"
#include "absl/types/span.h"
#include "base/mutex.h"
#include "base/status_macros.h"
#include "glog/logging.h"
#include "memory/backend.h"
#include "memory/cuda/convert_kernels.h"
#include "memory/cuda/cuda_status.h"
#include "memory/dtype.h"
#include "optimizer/adam_kernels.h"
#include "optimizer/cpu_adam.h"
#include "optimizer/cuda/adam_kernels.h"

namespace ps {
namespace {

static_assert(static_cast<int>(cuda::GradType::kF32) == static_cast<int>(DType::kF32));
static_assert(static_cast<int>(cuda::GradType::kF16) == static_cast<int>(DType::kF16));
static_assert(static_cast<int>(cuda::GradType::kBF16) == static_cast<int>(DType::kBF16));

constexpr int64_t kBlockSumsBytes = cuda::kGradStatsMaxBlocks * sizeof(double);
constexpr int64_t kWorkspaceBytes = kBlockSumsBytes + sizeof(unsigned long long);
// The footprint memory plans count (optimizer/cuda_adam_footprint.h) is this one.
static_assert(kWorkspaceBytes == kCudaAdamWorkspaceBytes);

cuda::GradType ToGradType(DType dtype) { return static_cast<cuda::GradType>(dtype); }

// Whether a kernel on the current device may dereference `ptr`: device or managed memory, or
// pinned host memory mapped at the same address in the unified address space. Pageable host
// memory may not. A pointer the runtime does not know is pageable memory.
bool DeviceAddressable(const void* ptr) {
  cudaPointerAttributes attr{};
  if (cudaPointerGetAttributes(&attr, ptr) != cudaSuccess) {
    (void)cudaGetLastError();  // clears the non-sticky error this query leaves behind
    return false;
  }
  switch (attr.type) {
    case cudaMemoryTypeDevice:
    case cudaMemoryTypeManaged:
      return true;
    case cudaMemoryTypeHost:
      return attr.devicePointer == ptr;
    default:
      return false;
  }
}

}  // namespace

absl::StatusOr<std::unique_ptr<CudaAdam>> CudaAdam::Create(Backend& backend) {
  if (backend.name() != "cuda") {
    return absl::InvalidArgumentError(absl::StrCat(
        "CudaAdam needs the cuda backend, got \"", backend.name(),
        "\"; for the cpu backend's emulated accelerator use CpuAdam (its memory is host RAM)"));
  }
  ASSIGN_OR_RETURN(std::unique_ptr<Stream> stream, backend.CreateStream());
  ASSIGN_OR_RETURN(void* device_workspace, backend.AllocateDevice(kWorkspaceBytes));
  absl::StatusOr<void*> host_workspace = backend.AllocatePinnedHost(kWorkspaceBytes);
  if (!host_workspace.ok()) {
    (void)backend.FreeDevice(device_workspace);
    return host_workspace.status();
  }
  absl::StatusOr<void*> staging = backend.AllocateDevice(kCudaAdamStagingBytes);
  if (!staging.ok()) {
    (void)backend.FreeDevice(device_workspace);
    (void)backend.FreePinnedHost(*host_workspace);
    return absl::Status(staging.status().code(),
                        absl::StrCat("CudaAdam: its ", kCudaAdamStagingBytes,
                                     "-byte staging tile: ", staging.status().message()));
  }
  return std::unique_ptr<CudaAdam>(
      new CudaAdam(backend, std::move(stream), device_workspace, *host_workspace, *staging));
}

absl::Status CudaAdam::MakeCurrent() const {
  PS_CUDA_RETURN_IF_ERROR(cudaSetDevice(backend_.device().index));
  return absl::OkStatus();
}

CudaAdam::~CudaAdam() {
  {
    MutexLock lock(&mu_);
    if (absl::Status s = stream_->Synchronize(); !s.ok()) LOG(ERROR) << "CudaAdam: " << s;
    stream_.reset();
  }
  if (absl::Status s = backend_.FreeDevice(device_workspace_); !s.ok()) {
    LOG(ERROR) << "CudaAdam: " << s;
  }
  if (absl::Status s = backend_.FreePinnedHost(host_workspace_); !s.ok()) {
    LOG(ERROR) << "CudaAdam: " << s;
  }
  if (absl::Status s = backend_.FreeDevice(staging_); !s.ok()) LOG(ERROR) << "CudaAdam: " << s;
}

absl::StatusOr<GradStats> CudaAdam::GradientStats(absl::Span<const GradSegment> segments) {
  RETURN_IF_ERROR(ValidateGradSegments("CudaAdam::GradientStats", segments));
  RETURN_IF_ERROR(MakeCurrent());
  MutexLock lock(&mu_);
  auto* block_sums = static_cast<double*>(device_workspace_);
  auto* counter = reinterpret_cast<unsigned long long*>(static_cast<char*>(device_workspace_) +
                                                        kBlockSumsBytes);
  RETURN_IF_ERROR(stream_->MemsetAsync(device_workspace_, 0, kWorkspaceBytes));
  auto* cuda_stream = static_cast<cudaStream_t>(stream_->native_handle());
  // CpuAdam's order (optimizer/grad_stats_math.h) with the lanes of the CPU target this process
  // dispatches to: a chunk's statistics, and so the clipping coefficient, have the same bits
  // whichever device holds the chunk. Per segment, up to kGradStatsMaxBlocks blocks per launch;
  // the block sums are added here in order, as CpuAdam adds its blocks'.
  const CpuSumSquaresShape shape = CpuAdamSumSquaresShape();
  cuda::GradStatsOrder order;
  order.block_elems = kCpuAdamBlockElems;
  order.tile_elems = kCpuAdamTileElems;
  order.lanes = shape.lanes;
  order.fused = shape.fused;
  GradStats stats;
  const auto* host_sums = static_cast<const double*>(host_workspace_);
  for (const GradSegment& s : segments) {
    const int64_t blocks = (s.n_elems + kCpuAdamBlockElems - 1) / kCpuAdamBlockElems;
    for (int64_t first = 0; first < blocks; first += cuda::kGradStatsMaxBlocks) {
      const int64_t n = std::min<int64_t>(cuda::kGradStatsMaxBlocks, blocks - first);
      PS_CUDA_RETURN_IF_ERROR(cuda::LaunchGradStats(ToGradType(s.dtype), s.grad, s.n_elems, first,
                                                    n, order, block_sums, counter, cuda_stream));
      RETURN_IF_ERROR(stream_->MemcpyAsync(host_workspace_, device_workspace_,
                                           n * static_cast<int64_t>(sizeof(double)),
                                           CopyKind::kDeviceToHost));
      RETURN_IF_ERROR(stream_->Synchronize());
      for (int64_t b = 0; b < n; ++b) stats.sum_squares += host_sums[b];
    }
  }
  RETURN_IF_ERROR(stream_->MemcpyAsync(static_cast<char*>(host_workspace_) + kBlockSumsBytes,
                                       counter, sizeof(unsigned long long),
                                       CopyKind::kDeviceToHost));
  RETURN_IF_ERROR(stream_->Synchronize());
  unsigned long long nonfinite;
  std::memcpy(&nonfinite, static_cast<const char*>(host_workspace_) + kBlockSumsBytes,
              sizeof(nonfinite));
  stats.nonfinite_elems = static_cast<int64_t>(nonfinite);
  return stats;
}

absl::StatusOr<AdamStepResult> CudaAdam::Step(absl::Span<const AdamSegment> segments) {
  RETURN_IF_ERROR(ValidateAdamSegments("CudaAdam::Step", segments));
  RETURN_IF_ERROR(MakeCurrent());
  MutexLock lock(&mu_);
  auto* counter = reinterpret_cast<unsigned long long*>(static_cast<char*>(device_workspace_) +
                                                        kBlockSumsBytes);
  RETURN_IF_ERROR(stream_->MemsetAsync(counter, 0, sizeof(unsigned long long)));
  auto* cuda_stream = static_cast<cudaStream_t>(stream_->native_handle());
  for (size_t i = 0; i < segments.size(); ++i) {
    const AdamSegment& s = segments[i];
    if (s.n_elems == 0) continue;
    if (!DeviceAddressable(s.grad)) {
      if (s.param != nullptr && !DeviceAddressable(s.param)) {
        return absl::InvalidArgumentError(absl::StrCat(
            "CudaAdam::Step: segment ", i,
            "'s gradients and parameters are host memory the GPU cannot address; only "
            "gradients may be staged from the host (pass param = nullptr with f32 gradients "
            "and write the parameters with RestoreParams)"));
      }
      RETURN_IF_ERROR(StagedStep(s, counter));
      continue;
    }
    PS_CUDA_RETURN_IF_ERROR(cuda::LaunchAdamStep(s.scalars, ToGradType(s.dtype), s.grad, s.param,
                                                 s.master, s.exp_avg, s.exp_avg_sq, s.n_elems,
                                                 counter, cuda_stream));
  }
  void* host_counter = static_cast<char*>(host_workspace_) + kBlockSumsBytes;
  RETURN_IF_ERROR(stream_->MemcpyAsync(host_counter, counter, sizeof(unsigned long long),
                                       CopyKind::kDeviceToHost));
  RETURN_IF_ERROR(stream_->Synchronize());
  unsigned long long nonfinite;
  std::memcpy(&nonfinite, host_counter, sizeof(nonfinite));
  return AdamStepResult{static_cast<int64_t>(nonfinite)};
}

absl::Status CudaAdam::RestoreParams(absl::Span<const ParamRestoreSegment> segments) {
  RETURN_IF_ERROR(ValidateRestoreSegments("CudaAdam::RestoreParams", segments));
  RETURN_IF_ERROR(MakeCurrent());
  MutexLock lock(&mu_);
  auto* cuda_stream = static_cast<cudaStream_t>(stream_->native_handle());
  for (const ParamRestoreSegment& s : segments) {
    switch (s.dtype) {
      case DType::kF32:
        if (s.n_elems > 0) {
          RETURN_IF_ERROR(
              stream_->MemcpyAsync(s.param, s.master, s.n_elems * 4, CopyKind::kDeviceToDevice));
        }
        break;
      case DType::kF16:
        PS_CUDA_RETURN_IF_ERROR(cuda::LaunchConvertF32ToF16(
            s.master, static_cast<uint16_t*>(s.param), s.n_elems, cuda_stream));
        break;
      case DType::kBF16:
        PS_CUDA_RETURN_IF_ERROR(cuda::LaunchConvertF32ToBF16(
            s.master, static_cast<uint16_t*>(s.param), s.n_elems, cuda_stream));
        break;
    }
  }
  return stream_->Synchronize();
}

absl::Status CudaAdam::StagedStep(const AdamSegment& s, unsigned long long* counter) {
  auto* cuda_stream = static_cast<cudaStream_t>(stream_->native_handle());
  const int64_t width = SizeOf(s.dtype);
  const int64_t tile_elems = kCudaAdamStagingBytes / width;
  for (int64_t off = 0; off < s.n_elems; off += tile_elems) {
    const int64_t n = std::min(tile_elems, s.n_elems - off);
    // Stream-ordered after the previous tile's kernel, which read the staging tile.
    RETURN_IF_ERROR(stream_->MemcpyAsync(staging_, static_cast<const char*>(s.grad) + off * width,
                                         n * width, CopyKind::kHostToDevice));
    PS_CUDA_RETURN_IF_ERROR(cuda::LaunchAdamStep(
        s.scalars, ToGradType(s.dtype), staging_,
        s.param == nullptr ? nullptr : static_cast<char*>(s.param) + off * width, s.master + off,
        s.exp_avg + off, s.exp_avg_sq + off, n, counter, cuda_stream));
  }
  return absl::OkStatus();
}

absl::Status CudaAdam::StagedAccumulate(const GradAccumulateSegment& s) {
  auto* cuda_stream = static_cast<cudaStream_t>(stream_->native_handle());
  auto* tile = static_cast<float*>(staging_);
  const int64_t width = SizeOf(s.dtype);
  constexpr int64_t kTileElems = kCudaAdamStagingBytes / sizeof(float);
  for (int64_t off = 0; off < s.n_elems; off += kTileElems) {
    const int64_t n = std::min(kTileElems, s.n_elems - off);
    const int64_t bytes = n * static_cast<int64_t>(sizeof(float));
    RETURN_IF_ERROR(stream_->MemcpyAsync(tile, s.acc + off, bytes, CopyKind::kHostToDevice));
    PS_CUDA_RETURN_IF_ERROR(cuda::LaunchAccumulateGrads(
        ToGradType(s.dtype), static_cast<const char*>(s.grad) + off * width, tile, n, cuda_stream));
    RETURN_IF_ERROR(stream_->MemcpyAsync(s.acc + off, tile, bytes, CopyKind::kDeviceToHost));
  }
  return absl::OkStatus();
}

absl::Status CudaAdam::AccumulateGradients(absl::Span<const GradAccumulateSegment> segments) {
  RETURN_IF_ERROR(ValidateAccumulateSegments("CudaAdam::AccumulateGradients", segments));
  RETURN_IF_ERROR(MakeCurrent());
  for (size_t i = 0; i < segments.size(); ++i) {
    if (segments[i].n_elems > 0 && !DeviceAddressable(segments[i].grad)) {
      return absl::InvalidArgumentError(
          absl::StrCat("CudaAdam::AccumulateGradients: segment ", i,
                       "'s gradients are not memory the GPU can address; CudaAdam accumulates "
                       "gradients of chunks on the GPU (host chunks run on CpuAdam)"));
    }
  }
  MutexLock lock(&mu_);
  auto* cuda_stream = static_cast<cudaStream_t>(stream_->native_handle());
  for (const GradAccumulateSegment& s : segments) {
    if (s.n_elems == 0) continue;
    if (DeviceAddressable(s.acc)) {
      PS_CUDA_RETURN_IF_ERROR(
          cuda::LaunchAccumulateGrads(ToGradType(s.dtype), s.grad, s.acc, s.n_elems, cuda_stream));
    } else {
      RETURN_IF_ERROR(StagedAccumulate(s));
    }
  }
  return stream_->Synchronize();
}

}  // namespace ps
