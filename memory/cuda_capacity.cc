#include "memory/cuda_capacity.h"

#include <cstdint>
#include <string>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "base/units.h"

namespace ps {

absl::StatusOr<int64_t> CudaCapacityFromFree(int64_t requested_bytes, int64_t free_bytes,
                                             int64_t total_bytes, int64_t margin_bytes,
                                             int device_index) {
  const int64_t usable = free_bytes - margin_bytes;
  const std::string numbers = absl::StrCat(
      "cuda device ", device_index, " has ", FormatBytes(free_bytes), " free of ",
      FormatBytes(total_bytes), "; ", FormatBytes(margin_bytes),
      " of that is kept for what the CUDA runtime, cuBLAS and NCCL allocate outside the cap "
      "(lazily loaded kernels, library handles, communication buffers)");
  if (requested_bytes < 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("accelerator memory cap ", requested_bytes, " bytes is negative"));
  }
  if (usable <= 0) {
    return absl::InvalidArgumentError(absl::StrCat(
        numbers, ", which leaves nothing: free the GPU (other processes hold it: nvidia-smi)"));
  }
  if (requested_bytes == 0) return usable;
  if (requested_bytes > usable) {
    return absl::InvalidArgumentError(
        absl::StrCat("accelerator memory cap ", FormatBytes(requested_bytes), " is above the ",
                     FormatBytes(usable), " this run can use: ", numbers,
                     ". Lower the cap (accelerator.memory, --accelerator_memory) to at most ",
                     // whole MiB, rounded down: a value a person can type that still fits
                     FormatBytes(usable / kMiB * kMiB), ", or leave it unset to use that much"));
  }
  return requested_bytes;
}

}  // namespace ps
