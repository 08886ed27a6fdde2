#include "model/kernels/gqa_attention.h"

#include <algorithm>
#include <atomic>
#include <cstdint>
#include <type_traits>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "absl/types/span.h"
#include "base/status_macros.h"
#include "base/thread_pool.h"
#include "model/kernels/attention_math.h"
#include "model/kernels/internal/attention_reference.h"
#include "model/kernels/internal/attention_simd.h"
#include "model/kernels/internal/kernel_util.h"

namespace ps {
namespace {

using kernels_internal::CheckElems;
using kernels_internal::CheckPositive;
using kernels_internal::CheckWorkspace;
using kernels_internal::GqaAttentionBackwardReference;
using kernels_internal::GqaAttentionForwardReference;
using kernels_internal::ParallelFor;
namespace simd = kernels_internal::simd;

absl::Status CheckStride(const char* kernel, const char* name, int64_t stride, int64_t row,
                         const char* row_formula) {
  if (stride == 0 || stride >= row) return absl::OkStatus();
  return absl::InvalidArgumentError(absl::StrCat(kernel, ": ", name, " ", stride,
                                                 " is shorter than a row (", row_formula, " = ",
                                                 row, "); use 0 for packed rows"));
}

absl::Status CheckShape(const char* kernel, const GqaAttentionShape& s) {
  RETURN_IF_ERROR(CheckPositive(kernel, "batch", s.batch));
  RETURN_IF_ERROR(CheckPositive(kernel, "seq_len", s.seq_len));
  RETURN_IF_ERROR(CheckPositive(kernel, "num_heads", s.num_heads));
  RETURN_IF_ERROR(CheckPositive(kernel, "num_kv_heads", s.num_kv_heads));
  RETURN_IF_ERROR(CheckPositive(kernel, "head_dim", s.head_dim));
  RETURN_IF_ERROR(CheckPositive(kernel, "tile", s.tile));
  if (s.sliding_window < 0) {
    return absl::InvalidArgumentError(absl::StrCat(kernel, ": sliding_window ", s.sliding_window,
                                                   " is negative; use 0 for no window"));
  }
  if (s.num_heads % s.num_kv_heads != 0) {
    return absl::InvalidArgumentError(absl::StrCat(kernel, ": num_attention_heads ", s.num_heads,
                                                   " is not a multiple of num_key_value_heads ",
                                                   s.num_kv_heads));
  }
  RETURN_IF_ERROR(
      CheckStride(kernel, "q_row_stride", s.q_row_stride, s.num_heads * s.head_dim, "Hq*D"));
  return CheckStride(kernel, "kv_row_stride", s.kv_row_stride, s.num_kv_heads * s.head_dim,
                     "Hkv*D");
}

// key_start: empty, or [B*T] with 0 <= key_start[b,t] <= t, non-decreasing in t within a row.
absl::Status CheckKeyStart(const char* kernel, const GqaAttentionShape& s,
                           absl::Span<const int32_t> key_start) {
  if (key_start.empty()) return absl::OkStatus();
  const int64_t B = s.batch, L = s.seq_len;
  if (static_cast<int64_t>(key_start.size()) != B * L) {
    return absl::InvalidArgumentError(absl::StrCat(kernel, ": key_start has ", key_start.size(),
                                                   " elements, expected B*T = ", B * L,
                                                   " (or none for plain causal attention)"));
  }
  for (int64_t b = 0; b < B; ++b) {
    const int32_t* row = key_start.data() + b * L;
    for (int64_t t = 0; t < L; ++t) {
      if (row[t] < 0 || row[t] > t) {
        return absl::InvalidArgumentError(
            absl::StrCat(kernel, ": key_start[b=", b, ", t=", t, "] = ", row[t],
                         " is outside [0, t]: a query must see itself"));
      }
      if (t > 0 && row[t] < row[t - 1]) {
        return absl::InvalidArgumentError(absl::StrCat(
            kernel, ": key_start[b=", b, ", t=", t, "] = ", row[t], " is less than key_start[b=", b,
            ", t=", t - 1, "] = ", row[t - 1], "; it must be non-decreasing within a row"));
      }
    }
  }
  return absl::OkStatus();
}

// The q-like and kv-like spans' element counts, for the messages.
constexpr char kQElems[] = "(B*T-1)*q_row_stride + Hq*D";
constexpr char kKvElems[] = "(B*T-1)*kv_row_stride + Hkv*D";

// The f32 view of query head h of batch element b and the kv head it reads.
simd::AttentionHeadView HeadView(const GqaAttentionShape& s, const float* q, const float* k,
                                 const float* v, absl::Span<const int32_t> key_start, int64_t b,
                                 int64_t h) {
  const int64_t L = s.seq_len, D = s.head_dim, g = h / (s.num_heads / s.num_kv_heads);
  const int64_t q_stride = GqaQRowStride(s), kv_stride = GqaKvRowStride(s);
  return {.q = q + b * L * q_stride + h * D,
          .k = k + b * L * kv_stride + g * D,
          .v = v + b * L * kv_stride + g * D,
          .q_stride = q_stride,
          .kv_stride = kv_stride,
          .seq_len = L,
          .head_dim = D,
          .scale = AttentionScale<float>(D),
          .key_start = key_start.empty() ? nullptr : key_start.data() + b * L,
          .window = s.sliding_window};
}

}  // namespace

int64_t GqaAttentionWorkspaceElems(const GqaAttentionShape& shape, int num_threads) {
  return std::max(1, num_threads) * (shape.tile + shape.head_dim);
}

template <typename T>
absl::Status GqaAttentionForward(const GqaAttentionShape& shape, absl::Span<const T> q,
                                 absl::Span<const T> k, absl::Span<const T> v, absl::Span<T> out,
                                 absl::Span<T> lse, absl::Span<T> workspace, ThreadPool* pool,
                                 absl::Span<const int32_t> key_start) {
  constexpr char kKernel[] = "GqaAttentionForward";
  RETURN_IF_ERROR(CheckShape(kKernel, shape));
  RETURN_IF_ERROR(CheckKeyStart(kKernel, shape, key_start));
  const int64_t B = shape.batch, L = shape.seq_len, Hq = shape.num_heads, D = shape.head_dim;
  const int64_t q_elems = GqaAttentionQElems(shape), kv_elems = GqaAttentionKvElems(shape);
  RETURN_IF_ERROR(CheckElems(kKernel, "q", q, q_elems, kQElems));
  RETURN_IF_ERROR(CheckElems(kKernel, "k", k, kv_elems, kKvElems));
  RETURN_IF_ERROR(CheckElems(kKernel, "v", v, kv_elems, kKvElems));
  RETURN_IF_ERROR(CheckElems(kKernel, "out", out, B * L * Hq * D, "B*T*Hq*D"));
  RETURN_IF_ERROR(CheckElems(kKernel, "lse", lse, B * Hq * L, "B*Hq*T"));
  const int num_slots = pool == nullptr ? 1 : pool->num_threads();
  RETURN_IF_ERROR(CheckWorkspace(kKernel, workspace, GqaAttentionWorkspaceElems(shape, num_slots)));

  if constexpr (std::is_same_v<T, float>) {
    // The fast schedule (bit-identical to the reference, internal/attention_simd.h). Work items
    // are whole query heads (b, h), of equal cost (the reference's (b, h, query tile) items differ
    // by the causal triangle, and their static round-robin left one thread ~20% more work); each
    // slot claims the next unclaimed head until none is left, with its own scores and output row.
    const int64_t tile = shape.tile;
    const int64_t num_items = B * Hq;
    std::atomic<int64_t> next_item{0};
    ParallelFor(pool, num_slots, [&](int64_t slot) {
      float* scores = workspace.data() + slot * (tile + D);
      float* acc = scores + tile;
      for (int64_t item = next_item++; item < num_items; item = next_item++) {
        const int64_t b = item / Hq, h = item % Hq;
        simd::AttentionForwardRows(HeadView(shape, q.data(), k.data(), v.data(), key_start, b, h),
                                   tile, 0, L, out.data() + b * L * Hq * D + h * D, Hq * D,
                                   lse.data() + (b * Hq + h) * L, scores, acc);
      }
    });
  } else {
    GqaAttentionForwardReference<T>(shape, q, k, v, out, lse, workspace, pool, key_start);
  }
  return absl::OkStatus();
}

template <typename T>
absl::Status GqaAttentionBackward(const GqaAttentionShape& shape, absl::Span<const T> q,
                                  absl::Span<const T> k, absl::Span<const T> v,
                                  absl::Span<const T> out, absl::Span<const T> lse,
                                  absl::Span<const T> dout, absl::Span<T> dq, absl::Span<T> dk,
                                  absl::Span<T> dv, ThreadPool* pool,
                                  absl::Span<const int32_t> key_start) {
  constexpr char kKernel[] = "GqaAttentionBackward";
  RETURN_IF_ERROR(CheckShape(kKernel, shape));
  RETURN_IF_ERROR(CheckKeyStart(kKernel, shape, key_start));
  const int64_t B = shape.batch, L = shape.seq_len, Hq = shape.num_heads, Hkv = shape.num_kv_heads,
                D = shape.head_dim;
  const int64_t q_elems = GqaAttentionQElems(shape), kv_elems = GqaAttentionKvElems(shape);
  RETURN_IF_ERROR(CheckElems(kKernel, "q", q, q_elems, kQElems));
  RETURN_IF_ERROR(CheckElems(kKernel, "k", k, kv_elems, kKvElems));
  RETURN_IF_ERROR(CheckElems(kKernel, "v", v, kv_elems, kKvElems));
  RETURN_IF_ERROR(CheckElems(kKernel, "out", out, B * L * Hq * D, "B*T*Hq*D"));
  RETURN_IF_ERROR(CheckElems(kKernel, "lse", lse, B * Hq * L, "B*Hq*T"));
  RETURN_IF_ERROR(CheckElems(kKernel, "dout", dout, B * L * Hq * D, "B*T*Hq*D"));
  RETURN_IF_ERROR(CheckElems(kKernel, "dq", dq, q_elems, kQElems));
  RETURN_IF_ERROR(CheckElems(kKernel, "dk", dk, kv_elems, kKvElems));
  RETURN_IF_ERROR(CheckElems(kKernel, "dv", dv, kv_elems, kKvElems));

  if constexpr (std::is_same_v<T, float>) {
    // One task per (b, kv head g): it owns g's dk and dv and the dq of g's query heads, which it
    // walks in increasing order (internal/attention_simd.h) — the reference's order of the sums
    // over the group.
    const int64_t group = Hq / Hkv;
    const int64_t q_stride = GqaQRowStride(shape), kv_stride = GqaKvRowStride(shape);
    ParallelFor(pool, B * Hkv, [&](int64_t item) {
      const int64_t b = item / Hkv, g = item % Hkv;
      float* dk_g = dk.data() + b * L * kv_stride + g * D;
      float* dv_g = dv.data() + b * L * kv_stride + g * D;
      for (int64_t h = g * group; h < (g + 1) * group; ++h) {
        const int64_t row = b * L * Hq * D + h * D;
        simd::AttentionBackwardHead(HeadView(shape, q.data(), k.data(), v.data(), key_start, b, h),
                                    out.data() + row, dout.data() + row, Hq * D,
                                    lse.data() + (b * Hq + h) * L,
                                    dq.data() + b * L * q_stride + h * D, dk_g, dv_g);
      }
    });
  } else {
    GqaAttentionBackwardReference<T>(shape, q, k, v, out, lse, dout, dq, dk, dv, pool, key_start);
  }
  return absl::OkStatus();
}

#define PS_GQA_ATTENTION_INSTANTIATE_(T)                                                           \
  template absl::Status GqaAttentionForward<T>(                                                    \
      const GqaAttentionShape&, absl::Span<const T>, absl::Span<const T>, absl::Span<const T>,     \
      absl::Span<T>, absl::Span<T>, absl::Span<T>, ThreadPool*, absl::Span<const int32_t>);        \
  template absl::Status GqaAttentionBackward<T>(                                                   \
      const GqaAttentionShape&, absl::Span<const T>, absl::Span<const T>, absl::Span<const T>,     \
      absl::Span<const T>, absl::Span<const T>, absl::Span<const T>, absl::Span<T>, absl::Span<T>, \
      absl::Span<T>, ThreadPool*, absl::Span<const int32_t>)
PS_GQA_ATTENTION_INSTANTIATE_(float);
PS_GQA_ATTENTION_INSTANTIATE_(double);
#undef PS_GQA_ATTENTION_INSTANTIATE_

}  // namespace ps
