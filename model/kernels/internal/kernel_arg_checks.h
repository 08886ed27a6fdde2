// Argument checks shared by the files of the Kernels class (model/kernels/kernels.cc,
// kernels_vocab.cc): each returns OkStatus or InvalidArgument naming the operation `op` and the
// offending dimension or buffer, in the words every implementation answers with. Private to the
// //model/kernels:kernels target.
#ifndef PATRICKSTAR_MODEL_KERNELS_INTERNAL_KERNEL_ARG_CHECKS_H_
#define PATRICKSTAR_MODEL_KERNELS_INTERNAL_KERNEL_ARG_CHECKS_H_

#include <cstdint>
#include <initializer_list>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/string_view.h"
#include "base/status_macros.h"
#include "memory/dtype.h"
#include "model/kernels/matmul.h"

namespace ps {
namespace kernels_internal {

// Element sizes, in bytes.
constexpr int64_t kF32 = sizeof(float);
constexpr int64_t kI32 = sizeof(int32_t);

inline absl::Status Positive(absl::string_view op, absl::string_view name, int64_t value) {
  if (value > 0) return absl::OkStatus();
  return absl::InvalidArgumentError(absl::StrCat(op, ": ", name, " must be positive, got ", value));
}

// A dimension handed to a BLAS (OpenBLAS and cuBLAS take 32-bit integers).
inline absl::Status BlasDim(absl::string_view op, absl::string_view name, int64_t value) {
  if (value > 0 && value <= INT32_MAX) return absl::OkStatus();
  return absl::InvalidArgumentError(
      absl::StrCat(op, ": ", name, " must be in [1, 2^31), got ", value));
}

// The product of `dims` times `elem_bytes`, or InvalidArgument when it overflows (no buffer that
// large can exist). REQUIRES: every factor positive.
inline absl::StatusOr<int64_t> Bytes(absl::string_view op, absl::string_view what,
                                     std::initializer_list<int64_t> dims, int64_t elem_bytes) {
  int64_t bytes = elem_bytes;
  for (int64_t d : dims) {
    if (__builtin_mul_overflow(bytes, d, &bytes)) {
      return absl::InvalidArgumentError(
          absl::StrCat(op, ": ", what, " would be larger than 2^63 bytes; the shape is wrong"));
    }
  }
  return bytes;
}

inline bool Overlap(const void* a, int64_t a_bytes, const void* b, int64_t b_bytes) {
  const auto pa = reinterpret_cast<uintptr_t>(a), pb = reinterpret_cast<uintptr_t>(b);
  return pa < pb + static_cast<uintptr_t>(b_bytes) && pb < pa + static_cast<uintptr_t>(a_bytes);
}

inline absl::Status NoOverlap(absl::string_view op, absl::string_view a_name, const void* a,
                              absl::string_view b_name, const void* b, int64_t bytes) {
  if (!Overlap(a, bytes, b, bytes)) return absl::OkStatus();
  return absl::InvalidArgumentError(
      absl::StrCat(op, ": ", a_name, " and ", b_name, " overlap; they must be separate buffers"));
}

inline absl::Status NoOverlap(absl::string_view op, absl::string_view a_name, const void* a,
                              int64_t a_bytes, absl::string_view b_name, const void* b,
                              int64_t b_bytes) {
  if (!Overlap(a, a_bytes, b, b_bytes)) return absl::OkStatus();
  return absl::InvalidArgumentError(
      absl::StrCat(op, ": ", a_name, " and ", b_name, " overlap; they must be separate buffers"));
}

inline bool ValidDType(DType dtype) {
  return dtype == DType::kF32 || dtype == DType::kF16 || dtype == DType::kBF16;
}

// MatmulShape's dimensions (the f32 and the bf16-weight GEMMs alike).
inline absl::Status CheckShape(absl::string_view op, const MatmulShape& s) {
  RETURN_IF_ERROR(BlasDim(op, "rows", s.rows));
  RETURN_IF_ERROR(BlasDim(op, "in_features", s.in_features));
  return BlasDim(op, "out_features", s.out_features);
}

}  // namespace kernels_internal
}  // namespace ps

#endif  // PATRICKSTAR_MODEL_KERNELS_INTERNAL_KERNEL_ARG_CHECKS_H_
