// Device: where a byte lives. Host RAM, or accelerator number `index` (a CUDA GPU, or the emulated
// accelerator of the cpu backend). Cheap value type; hashable; printable ("host", "accelerator:0").
#ifndef PATRICKSTAR_MEMORY_DEVICE_H_
#define PATRICKSTAR_MEMORY_DEVICE_H_

#include <cstdint>
#include <ostream>
#include <string>

namespace ps {

enum class DeviceKind : uint8_t { kHost = 0, kAccelerator = 1 };

struct Device {
  DeviceKind kind = DeviceKind::kHost;
  int index = 0;

  static constexpr Device Host() { return Device{DeviceKind::kHost, 0}; }
  static constexpr Device Accelerator(int index = 0) {
    return Device{DeviceKind::kAccelerator, index};
  }

  constexpr bool is_host() const { return kind == DeviceKind::kHost; }
  constexpr bool is_accelerator() const { return kind == DeviceKind::kAccelerator; }

  std::string ToString() const;

  friend constexpr bool operator==(const Device& a, const Device& b) {
    return a.kind == b.kind && a.index == b.index;
  }
  friend constexpr bool operator!=(const Device& a, const Device& b) { return !(a == b); }
  template <typename H>
  friend H AbslHashValue(H h, const Device& d) {
    return H::combine(std::move(h), static_cast<int>(d.kind), d.index);
  }
};

std::ostream& operator<<(std::ostream& os, const Device& d);

}  // namespace ps

#endif  // PATRICKSTAR_MEMORY_DEVICE_H_
