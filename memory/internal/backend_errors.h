// Argument checks and error messages shared by every Backend implementation (cpu, cuda), so the
// backends reject the same inputs with the same words. Internal to memory/.
#ifndef PATRICKSTAR_MEMORY_INTERNAL_BACKEND_ERRORS_H_
#define PATRICKSTAR_MEMORY_INTERNAL_BACKEND_ERRORS_H_

#include <cstdint>

#include "absl/status/status.h"
#include "absl/strings/string_view.h"
#include "memory/backend.h"
#include "memory/device.h"

namespace ps::backend_internal {

// InvalidArgument unless `bytes` > 0 (`what` names the call, e.g. "AllocateDevice").
absl::Status CheckAllocationSize(absl::string_view what, int64_t bytes);

// Checks common to MemcpyAsync/MemsetAsync: InvalidArgument for a negative size, or a null pointer
// with a positive size (pass `src` = dst for a memset).
absl::Status CheckTransferArgs(absl::string_view what, const void* dst, const void* src,
                               int64_t bytes);

// Whether the destination / source of a copy of `kind` is device memory.
bool DestinationIsDevice(CopyKind kind);
bool SourceIsDevice(CopyKind kind);

// ResourceExhausted: `device` (`backend`) is out of memory `why` ("" or a parenthesized reason),
// naming the request, the bytes in use and the cap, and what to change.
absl::Status DeviceOutOfMemory(Device device, absl::string_view backend, absl::string_view why,
                               int64_t requested_bytes, int64_t in_use_bytes, int64_t cap_bytes);

// InvalidArgument: `ptr` passed to `what` is not a live allocation of this backend.
absl::Status NotALiveAllocation(absl::string_view what, const void* ptr, Device device,
                                absl::string_view kind_of_memory);

// InvalidArgument: [ptr, ptr + bytes) passed to `what` is not inside device memory of `backend`.
absl::Status OutsideDeviceMemory(absl::string_view what, const void* ptr, int64_t bytes,
                                 Device device, absl::string_view backend);

}  // namespace ps::backend_internal

#endif  // PATRICKSTAR_MEMORY_INTERNAL_BACKEND_ERRORS_H_
