#include "memory/device.h"

#include "absl/strings/str_cat.h"

namespace ps {

std::string Device::ToString() const {
  return is_host() ? std::string("host") : absl::StrCat("accelerator:", index);
}

std::ostream& operator<<(std::ostream& os, const Device& d) { return os << d.ToString(); }

}  // namespace ps
