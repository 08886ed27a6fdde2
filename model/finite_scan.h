// Finding Inf and NaN in stored tensors: the check that keeps non-finite weights out of a run.
//
// Imported weights (model/gpt2_checkpoint.h, model/hf_checkpoint.h) and training checkpoints
// (trainer/checkpoint.h) are scanned once, in their stored dtype, before anything is loaded; a
// checkpoint's state is scanned again before it is written. A value is non-finite when its
// exponent bits are all ones (IEEE 754: Inf when the mantissa is zero, NaN otherwise), so the
// scan is one AND and one compare per element on the raw bits — no conversion, no floating point.
// FindFirstNonFinite runs Highway vectors, dispatched at run time (AVX-512, AVX2, SSE4, ...,
// scalar), over little-endian bytes at any alignment (safetensors places tensors at arbitrary
// offsets), so a scan costs about as much as reading the bytes once.
//
// Thread safety: pure functions.
#ifndef PATRICKSTAR_MODEL_FINITE_SCAN_H_
#define PATRICKSTAR_MODEL_FINITE_SCAN_H_

#include <cstdint>
#include <string>

#include "absl/status/status.h"
#include "absl/strings/string_view.h"
#include "absl/types/span.h"
#include "memory/dtype.h"

namespace ps {

// The index of the first Inf or NaN among the `num_elems` elements of `dtype` stored
// little-endian at `data` (any alignment), or -1 when every element is finite.
// REQUIRES: dtype is f32, f16 or bf16; `data` holds num_elems * SizeOf(dtype) bytes;
// num_elems >= 0.
int64_t FindFirstNonFinite(DType dtype, const void* data, int64_t num_elems);

// "NaN", "+Inf" or "-Inf": the kind of the non-finite element `index` of `data` (as above).
// REQUIRES: that element is non-finite.
std::string NonFiniteKind(DType dtype, const void* data, int64_t index);

// Row-major coordinates of flat element `index` in `shape`, e.g. "[3, 17]" ("[]" for a scalar).
// REQUIRES: 0 <= index < product of shape (or index == 0 for a scalar).
std::string ElementCoordinates(absl::Span<const int64_t> shape, int64_t index);

// OK if every element is finite. Otherwise DataLoss:
//   "<where>: tensor '<name>' holds NaN at [3, 17] (element 401 of 1024) ..."
// followed by what to do (the weights are unusable for training; fix or re-export the file).
// `where` names the file (e.g. "safetensors file 'x.safetensors'").
// REQUIRES: as FindFirstNonFinite; shape's product is num_elems.
[[nodiscard]] absl::Status CheckTensorFinite(absl::string_view where, absl::string_view name,
                                             DType dtype, absl::Span<const int64_t> shape,
                                             const void* data, int64_t num_elems);

// The name of the Highway target FindFirstNonFinite dispatches to (e.g. "AVX3", "AVX2",
// "SCALAR"), for tests that run it on every target with hwy::SetSupportedTargetsForTest.
const char* FiniteScanTargetName();

}  // namespace ps

#endif  // PATRICKSTAR_MODEL_FINITE_SCAN_H_
