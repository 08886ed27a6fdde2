#include "memory/backend.h"

namespace ps {

absl::string_view CopyKindName(CopyKind kind) {
  switch (kind) {
    case CopyKind::kHostToDevice:
      return "host_to_device";
    case CopyKind::kDeviceToHost:
      return "device_to_host";
    case CopyKind::kDeviceToDevice:
      return "device_to_device";
    case CopyKind::kHostToHost:
      return "host_to_host";
  }
  return "unknown";
}

}  // namespace ps
