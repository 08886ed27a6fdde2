#include "model/kernels/swiglu.h"

#include <cstdint>
#include <type_traits>

#include "absl/status/status.h"
#include "absl/types/span.h"
#include "base/status_macros.h"
#include "base/thread_pool.h"
#include "model/kernels/internal/kernel_util.h"
#include "model/kernels/internal/llama_simd.h"
#include "model/kernels/swiglu_math.h"

namespace ps {
namespace {

using kernels_internal::CheckElems;
using kernels_internal::CheckPositive;
using kernels_internal::ParallelForRanges;

constexpr int64_t kElemsPerTask = 8192;

}  // namespace

template <typename T>
absl::Status SwiGluForward(absl::Span<const T> g, absl::Span<const T> u, absl::Span<T> h,
                           ThreadPool* pool, GateActivation act) {
  constexpr char kKernel[] = "SwiGluForward";
  const int64_t n = static_cast<int64_t>(g.size());
  RETURN_IF_ERROR(CheckPositive(kKernel, "gate size", n));
  RETURN_IF_ERROR(CheckElems(kKernel, "up", u, n, "size of gate"));
  RETURN_IF_ERROR(CheckElems(kKernel, "out", h, n, "size of gate"));
  ParallelForRanges(pool, n, kElemsPerTask, [&](int64_t begin, int64_t end) {
    if constexpr (std::is_same_v<T, float>) {
      kernels_internal::llama_simd::SwiGluForward(g.data() + begin, u.data() + begin,
                                                  h.data() + begin, end - begin,
                                                  act == GateActivation::kGeluTanh);
    } else {
      for (int64_t i = begin; i < end; ++i) h[i] = GatedActivation(act, g[i], u[i]);
    }
  });
  return absl::OkStatus();
}

template <typename T>
absl::Status SwiGluBackward(absl::Span<const T> g, absl::Span<const T> u, absl::Span<const T> dh,
                            absl::Span<T> dg, absl::Span<T> du, ThreadPool* pool,
                            GateActivation act) {
  constexpr char kKernel[] = "SwiGluBackward";
  const int64_t n = static_cast<int64_t>(g.size());
  RETURN_IF_ERROR(CheckPositive(kKernel, "gate size", n));
  RETURN_IF_ERROR(CheckElems(kKernel, "up", u, n, "size of gate"));
  RETURN_IF_ERROR(CheckElems(kKernel, "dout", dh, n, "size of gate"));
  RETURN_IF_ERROR(CheckElems(kKernel, "dgate", dg, n, "size of gate"));
  RETURN_IF_ERROR(CheckElems(kKernel, "dup", du, n, "size of gate"));
  ParallelForRanges(pool, n, kElemsPerTask, [&](int64_t begin, int64_t end) {
    if constexpr (std::is_same_v<T, float>) {
      kernels_internal::llama_simd::SwiGluBackward(
          g.data() + begin, u.data() + begin, dh.data() + begin, dg.data() + begin,
          du.data() + begin, end - begin, act == GateActivation::kGeluTanh);
    } else {
      for (int64_t i = begin; i < end; ++i) {
        const SwiGluGrads<T> d = GatedActivationBackwardTerms(act, g[i], u[i], dh[i]);
        dg[i] += d.dg;
        du[i] += d.du;
      }
    }
  });
  return absl::OkStatus();
}

#define PS_SWIGLU_INSTANTIATE_(T)                                                                 \
  template absl::Status SwiGluForward<T>(absl::Span<const T>, absl::Span<const T>, absl::Span<T>, \
                                         ThreadPool*, GateActivation);                            \
  template absl::Status SwiGluBackward<T>(absl::Span<const T>, absl::Span<const T>,               \
                                          absl::Span<const T>, absl::Span<T>, absl::Span<T>,      \
                                          ThreadPool*, GateActivation)
PS_SWIGLU_INSTANTIATE_(float);
PS_SWIGLU_INSTANTIATE_(double);
#undef PS_SWIGLU_INSTANTIATE_

}  // namespace ps
