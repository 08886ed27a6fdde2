// OperatorSpec / TensorSpec: a model's parameters as the chunk layer sees them — operators (an
// nn.Module with direct parameters: a Linear, a LayerNorm, the embedding), each owning named,
// shaped parameter tensors. The chunk layout places all tensors of one operator in one chunk, so
// accessing an operator makes all of its parameters resident with one chunk access.
//
// These are plain descriptions with no storage; model/ produces them (model/gpt_config.h),
// chunk/chunk_layout.h and chunk/chunk_size_search.h consume them.
//
// Thread safety: value types and pure functions.
#ifndef PATRICKSTAR_CHUNK_OPERATOR_SPEC_H_
#define PATRICKSTAR_CHUNK_OPERATOR_SPEC_H_

#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/types/span.h"

namespace ps {

struct TensorSpec {
  // Unique within a model, e.g. "h.3.attn.c_attn.weight" (Hugging Face GPT-2 names).
  std::string name;
  // Row-major dimensions; every dimension must be positive. An empty shape is a scalar.
  std::vector<int64_t> shape;

  // The product of the dimensions (1 for a scalar).
  int64_t numel() const {
    int64_t n = 1;
    for (int64_t d : shape) n *= d;
    return n;
  }
};

struct OperatorSpec {
  // Unique within a model, e.g. "h.3.attn.c_attn".
  std::string name;
  // At least one tensor.
  std::vector<TensorSpec> tensors;
  // False for a frozen operator (a LoRA fine-tune's base model): its parameters are read but never
  // trained, so its chunk holds only parameters (no gradients, no optimizer state) and is never
  // written back (chunk/chunk_layout.h keeps frozen and trainable operators in separate chunks).
  bool trainable = true;
};

// Number of elements of `shape` (1 for a scalar). InvalidArgument for a non-positive dimension or
// a product that overflows int64.
absl::StatusOr<int64_t> ShapeNumElems(absl::Span<const int64_t> shape);

// "[768, 2304]".
std::string ShapeString(absl::Span<const int64_t> shape);

// OK if the operator has a non-empty name, at least one tensor, non-empty tensor names and valid
// shapes. Error messages name the operator and the tensor.
[[nodiscard]] absl::Status ValidateOperatorSpec(const OperatorSpec& op);

// Total elements of a valid operator's tensors. REQUIRES: ValidateOperatorSpec(op) is OK.
int64_t OperatorNumElems(const OperatorSpec& op);

// Total elements over a valid model. REQUIRES: every operator is valid.
int64_t ModelNumElems(absl::Span<const OperatorSpec> ops);

}  // namespace ps

#endif  // PATRICKSTAR_CHUNK_OPERATOR_SPEC_H_
