#include "scheduler/activation_profile.h"

#include <string>
#include <utility>
#include <vector>

#include "glog/logging.h"

namespace ps {

ActivationProfileBuilder::ActivationProfileBuilder(absl::Span<const OperatorSpec> ops) {
  for (size_t i = 0; i < ops.size(); ++i) {
    const bool inserted = op_index_.emplace(ops[i].name, static_cast<int64_t>(i)).second;
    CHECK(inserted) << "ActivationProfileBuilder: operator '" << ops[i].name << "' twice";
  }
}

int64_t ActivationProfileBuilder::Alloc(int64_t bytes) {
  CHECK_GT(bytes, 0) << "ActivationProfileBuilder: an allocation of " << bytes << " bytes";
  const int64_t id = next_buffer_++;
  events_.push_back({.kind = ActivationEvent::Kind::kAlloc, .buffer = id, .bytes = bytes});
  return id;
}

void ActivationProfileBuilder::Free(int64_t buffer) {
  if (buffer < 0) return;
  events_.push_back({.kind = ActivationEvent::Kind::kFree, .buffer = buffer});
}

int64_t ActivationProfileBuilder::OpIndex(absl::string_view op) const {
  auto it = op_index_.find(op);
  CHECK(it != op_index_.end()) << "ActivationProfileBuilder: unknown operator '" << op << "'";
  return it->second;
}

void ActivationProfileBuilder::Access(absl::string_view op, Stage stage) {
  events_.push_back({.kind = ActivationEvent::Kind::kAccess, .op = OpIndex(op), .stage = stage});
}

void ActivationProfileBuilder::Release(absl::string_view op, Stage stage) {
  events_.push_back({.kind = ActivationEvent::Kind::kRelease, .op = OpIndex(op), .stage = stage});
}

std::vector<ActivationEvent> ActivationProfileBuilder::Take() { return std::exchange(events_, {}); }

}  // namespace ps
