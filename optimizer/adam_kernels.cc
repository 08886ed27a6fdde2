#include "optimizer/adam_kernels.h"

#include <cmath>
#include <cstdint>
#include <tuple>
#include <utility>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/string_view.h"
#include "absl/types/span.h"
#include "memory/dtype.h"

namespace ps {
namespace {

bool IsValidDType(DType dtype) {
  return dtype == DType::kF32 || dtype == DType::kF16 || dtype == DType::kBF16;
}

// InvalidArgument unless `ptr` is non-null and aligned to `alignment_bytes`.
absl::Status CheckPointer(absl::string_view kernel, size_t segment, absl::string_view what,
                          const void* ptr, int64_t alignment_bytes) {
  if (ptr == nullptr) {
    return absl::InvalidArgumentError(
        absl::StrCat(kernel, ": segment ", segment, " has a null ", what, " pointer"));
  }
  if (reinterpret_cast<uintptr_t>(ptr) % static_cast<uintptr_t>(alignment_bytes) != 0) {
    return absl::InvalidArgumentError(
        absl::StrCat(kernel, ": segment ", segment, " ", what, " pointer 0x",
                     absl::Hex(reinterpret_cast<uintptr_t>(ptr)),
                     " is not aligned to its element size (", alignment_bytes, " bytes)"));
  }
  return absl::OkStatus();
}

absl::Status CheckLengthAndDType(absl::string_view kernel, size_t segment, int64_t n_elems,
                                 DType dtype) {
  if (n_elems < 0) {
    return absl::InvalidArgumentError(
        absl::StrCat(kernel, ": segment ", segment, " has n_elems = ", n_elems, " (must be >= 0)"));
  }
  if (!IsValidDType(dtype)) {
    return absl::InvalidArgumentError(absl::StrCat(kernel, ": segment ", segment,
                                                   " has unknown dtype ", static_cast<int>(dtype)));
  }
  return absl::OkStatus();
}

}  // namespace

absl::Status ValidateGradSegments(absl::string_view kernel,
                                  absl::Span<const GradSegment> segments) {
  for (size_t i = 0; i < segments.size(); ++i) {
    const GradSegment& s = segments[i];
    if (absl::Status st = CheckLengthAndDType(kernel, i, s.n_elems, s.dtype); !st.ok()) return st;
    if (s.n_elems == 0) continue;
    if (absl::Status st = CheckPointer(kernel, i, "grad", s.grad, SizeOf(s.dtype)); !st.ok()) {
      return st;
    }
  }
  return absl::OkStatus();
}

absl::Status ValidateAdamSegments(absl::string_view kernel,
                                  absl::Span<const AdamSegment> segments) {
  for (size_t i = 0; i < segments.size(); ++i) {
    const AdamSegment& s = segments[i];
    if (absl::Status st = CheckLengthAndDType(kernel, i, s.n_elems, s.dtype); !st.ok()) return st;
    if (s.n_elems == 0) continue;
    const int64_t width = SizeOf(s.dtype);
    for (const auto& [what, ptr, align] :
         {std::tuple<absl::string_view, const void*, int64_t>{"grad", s.grad, width},
          {"master", s.master, 4},
          {"exp_avg", s.exp_avg, 4},
          {"exp_avg_sq", s.exp_avg_sq, 4}}) {
      if (absl::Status st = CheckPointer(kernel, i, what, ptr, align); !st.ok()) return st;
    }
    if (s.param != nullptr || s.dtype != DType::kF32) {
      if (absl::Status st = CheckPointer(kernel, i, "param", s.param, width); !st.ok()) return st;
    }
    const AdamStepScalars& c = s.scalars;
    if (!(c.loss_scale > 0.0f) || !std::isfinite(c.loss_scale)) {
      return absl::InvalidArgumentError(absl::StrCat(kernel, ": segment ", i, " has loss_scale = ",
                                                     c.loss_scale, " (must be finite and > 0)"));
    }
    for (const auto& [what, value] : {std::pair<absl::string_view, float>{"beta1", c.beta1},
                                      {"beta2", c.beta2},
                                      {"eps", c.eps},
                                      {"step_size", c.step_size},
                                      {"inv_sqrt_bias_correction2", c.inv_sqrt_bias_correction2},
                                      {"l2", c.l2},
                                      {"decay", c.decay},
                                      {"clip_coef", c.clip_coef}}) {
      if (!std::isfinite(value)) {
        return absl::InvalidArgumentError(
            absl::StrCat(kernel, ": segment ", i, " has a non-finite ", what, " (", value, ")"));
      }
    }
  }
  return absl::OkStatus();
}

absl::Status ValidateRestoreSegments(absl::string_view kernel,
                                     absl::Span<const ParamRestoreSegment> segments) {
  for (size_t i = 0; i < segments.size(); ++i) {
    const ParamRestoreSegment& s = segments[i];
    if (absl::Status st = CheckLengthAndDType(kernel, i, s.n_elems, s.dtype); !st.ok()) return st;
    if (s.n_elems == 0) continue;
    if (absl::Status st = CheckPointer(kernel, i, "master", s.master, 4); !st.ok()) return st;
    if (absl::Status st = CheckPointer(kernel, i, "param", s.param, SizeOf(s.dtype)); !st.ok()) {
      return st;
    }
  }
  return absl::OkStatus();
}

absl::Status ValidateAccumulateSegments(absl::string_view kernel,
                                        absl::Span<const GradAccumulateSegment> segments) {
  for (size_t i = 0; i < segments.size(); ++i) {
    const GradAccumulateSegment& s = segments[i];
    if (absl::Status st = CheckLengthAndDType(kernel, i, s.n_elems, s.dtype); !st.ok()) return st;
    if (s.n_elems == 0) continue;
    if (absl::Status st = CheckPointer(kernel, i, "grad", s.grad, SizeOf(s.dtype)); !st.ok()) {
      return st;
    }
    if (absl::Status st = CheckPointer(kernel, i, "acc", s.acc, 4); !st.ok()) return st;
  }
  return absl::OkStatus();
}

}  // namespace ps
