#include "chunk/operator_spec.h"

#include <cstdint>
#include <limits>
#include <string>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "glog/logging.h"

namespace ps {

absl::StatusOr<int64_t> ShapeNumElems(absl::Span<const int64_t> shape) {
  int64_t numel = 1;
  for (int64_t dim : shape) {
    if (dim <= 0) {
      return absl::InvalidArgumentError(
          absl::StrCat("shape ", ShapeString(shape), " has a non-positive dimension ", dim));
    }
    if (numel > std::numeric_limits<int64_t>::max() / dim) {
      return absl::InvalidArgumentError(
          absl::StrCat("shape ", ShapeString(shape), " has more elements than fit in int64"));
    }
    numel *= dim;
  }
  return numel;
}

std::string ShapeString(absl::Span<const int64_t> shape) {
  return absl::StrCat("[", absl::StrJoin(shape, ", "), "]");
}

absl::Status ValidateOperatorSpec(const OperatorSpec& op) {
  if (op.name.empty()) {
    return absl::InvalidArgumentError("an operator has an empty name; every operator needs one");
  }
  if (op.tensors.empty()) {
    return absl::InvalidArgumentError(
        absl::StrCat("operator '", op.name, "' has no tensors; only operators with parameters ",
                     "are placed in chunks"));
  }
  int64_t total = 0;
  for (const TensorSpec& t : op.tensors) {
    if (t.name.empty()) {
      return absl::InvalidArgumentError(
          absl::StrCat("operator '", op.name, "' has a tensor with an empty name"));
    }
    absl::StatusOr<int64_t> numel = ShapeNumElems(t.shape);
    if (!numel.ok()) {
      return absl::InvalidArgumentError(absl::StrCat("tensor '", t.name, "' of operator '", op.name,
                                                     "': ", numel.status().message()));
    }
    if (total > std::numeric_limits<int64_t>::max() - *numel) {
      return absl::InvalidArgumentError(
          absl::StrCat("operator '", op.name, "' has more elements than fit in int64"));
    }
    total += *numel;
  }
  return absl::OkStatus();
}

int64_t OperatorNumElems(const OperatorSpec& op) {
  int64_t total = 0;
  for (const TensorSpec& t : op.tensors) {
    absl::StatusOr<int64_t> numel = ShapeNumElems(t.shape);
    CHECK(numel.ok()) << numel.status();
    total += *numel;
  }
  return total;
}

int64_t ModelNumElems(absl::Span<const OperatorSpec> ops) {
  int64_t total = 0;
  for (const OperatorSpec& op : ops) total += OperatorNumElems(op);
  return total;
}

}  // namespace ps
