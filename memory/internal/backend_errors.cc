#include "memory/internal/backend_errors.h"

#include "absl/strings/str_cat.h"
#include "base/units.h"

namespace ps::backend_internal {

absl::Status CheckAllocationSize(absl::string_view what, int64_t bytes) {
  if (bytes > 0) return absl::OkStatus();
  return absl::InvalidArgumentError(absl::StrCat(what, ": size must be positive, got ", bytes));
}

absl::Status CheckTransferArgs(absl::string_view what, const void* dst, const void* src,
                               int64_t bytes) {
  if (bytes < 0) return absl::InvalidArgumentError(absl::StrCat(what, ": negative size ", bytes));
  if (bytes > 0 && (dst == nullptr || src == nullptr)) {
    return absl::InvalidArgumentError(
        absl::StrCat(what, " of ", bytes, " bytes with a null pointer"));
  }
  return absl::OkStatus();
}

bool DestinationIsDevice(CopyKind kind) {
  return kind == CopyKind::kHostToDevice || kind == CopyKind::kDeviceToDevice;
}

bool SourceIsDevice(CopyKind kind) {
  return kind == CopyKind::kDeviceToHost || kind == CopyKind::kDeviceToDevice;
}

absl::Status DeviceOutOfMemory(Device device, absl::string_view backend, absl::string_view why,
                               int64_t requested_bytes, int64_t in_use_bytes, int64_t cap_bytes) {
  return absl::ResourceExhaustedError(absl::StrCat(
      device.ToString(), " (", backend, ") is out of memory", why, ": requested ",
      FormatBytes(requested_bytes), " (", requested_bytes, " bytes) with ",
      FormatBytes(in_use_bytes), " of its ", FormatBytes(cap_bytes),
      " capacity in use. Lower the chunk size or the batch size, or raise the accelerator memory "
      "cap."));
}

absl::Status NotALiveAllocation(absl::string_view what, const void* ptr, Device device,
                                absl::string_view kind_of_memory) {
  return absl::InvalidArgumentError(absl::StrCat(
      what, ": ", absl::Hex(reinterpret_cast<uintptr_t>(ptr)), " is not a live ", kind_of_memory,
      " allocation of ", device.ToString(), " (double free, or a pointer from elsewhere)"));
}

absl::Status OutsideDeviceMemory(absl::string_view what, const void* ptr, int64_t bytes,
                                 Device device, absl::string_view backend) {
  return absl::InvalidArgumentError(absl::StrCat(
      what, ": the range of ", bytes, " bytes at ", absl::Hex(reinterpret_cast<uintptr_t>(ptr)),
      " is not inside device memory allocated on ", device.ToString(), " by this ", backend,
      " backend (freed, foreign, or overrun)"));
}

}  // namespace ps::backend_internal
