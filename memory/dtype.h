// DType: the element types model data is stored in. f32 for master weights and Adam moments; f16 or
// bf16 (or f32) for the compute copy of parameters and their gradients.
//
// Scalar bit-exact conversions shared by CPU and CUDA code are in memory/dtype_math.h; vectorized
// bulk conversions in memory/convert.h.
#ifndef PATRICKSTAR_MEMORY_DTYPE_H_
#define PATRICKSTAR_MEMORY_DTYPE_H_

#include <cstdint>
#include <ostream>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"

namespace ps {

enum class DType : uint8_t { kF32 = 0, kF16 = 1, kBF16 = 2 };

// Bytes per element.
constexpr int64_t SizeOf(DType dtype) { return dtype == DType::kF32 ? 4 : 2; }

// "f32", "f16", "bf16".
absl::string_view DTypeName(DType dtype);

// Accepts the names people use: f32/fp32/float32/float, f16/fp16/float16/half,
// bf16/bfloat16 (case-insensitive). Anything else is InvalidArgument listing the valid names.
absl::StatusOr<DType> ParseDType(absl::string_view name);

std::ostream& operator<<(std::ostream& os, DType dtype);

}  // namespace ps

#endif  // PATRICKSTAR_MEMORY_DTYPE_H_
