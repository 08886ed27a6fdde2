// Helpers shared by the files of the Kernels conformance suite (kernels_conformance*.cc): random
// inputs, f64 copies, spans, and GPT-2's fused-qkv attention run by the CPU kernel. Private to
// //model/kernels/testing:kernels_conformance.
#ifndef PATRICKSTAR_MODEL_KERNELS_TESTING_KERNELS_CONFORMANCE_UTIL_H_
#define PATRICKSTAR_MODEL_KERNELS_TESTING_KERNELS_CONFORMANCE_UTIL_H_

#include <cstdint>
#include <random>
#include <vector>

#include "absl/status/status.h"
#include "absl/types/span.h"
#include "base/testing/test_rng.h"
#include "model/kernels/gqa_attention.h"

namespace ps::kernel_testing {

inline std::vector<float> Rand(TestRng& rng, int64_t n, float lo = -1, float hi = 1) {
  std::uniform_real_distribution<float> u(lo, hi);
  std::vector<float> v(static_cast<size_t>(n));
  for (float& x : v) x = u(rng);
  return v;
}

inline std::vector<double> D(const std::vector<float>& v) { return {v.begin(), v.end()}; }

template <typename T>
absl::Span<const T> C(const std::vector<T>& v) {
  return absl::MakeConstSpan(v);
}
template <typename T>
absl::Span<T> M(std::vector<T>& v) {
  return absl::MakeSpan(v);
}

// GPT-2's multi-head attention on its fused qkv [B, T, 3C] with the CPU kernel: `s` has kv heads =
// heads, C = num_heads * head_dim and both row strides 3C; q = qkv, k = qkv + C, v = qkv + 2C,
// gradients likewise into dqkv.
template <typename T>
absl::Status FusedQkvAttentionForward(const GqaAttentionShape& s, absl::Span<const T> qkv,
                                      absl::Span<T> out, absl::Span<T> lse, absl::Span<T> ws) {
  const int64_t n = GqaAttentionQElems(s), c = s.num_heads * s.head_dim;
  return GqaAttentionForward<T>(s, qkv.subspan(0, n), qkv.subspan(c, n), qkv.subspan(2 * c, n), out,
                                lse, ws, nullptr);
}
template <typename T>
absl::Status FusedQkvAttentionBackward(const GqaAttentionShape& s, absl::Span<const T> qkv,
                                       absl::Span<const T> out, absl::Span<const T> lse,
                                       absl::Span<const T> dout, absl::Span<T> dqkv) {
  const int64_t n = GqaAttentionQElems(s), c = s.num_heads * s.head_dim;
  return GqaAttentionBackward<T>(s, qkv.subspan(0, n), qkv.subspan(c, n), qkv.subspan(2 * c, n),
                                 out, lse, dout, dqkv.subspan(0, n), dqkv.subspan(c, n),
                                 dqkv.subspan(2 * c, n), nullptr);
}

}  // namespace ps::kernel_testing

#endif  // PATRICKSTAR_MODEL_KERNELS_TESTING_KERNELS_CONFORMANCE_UTIL_H_
