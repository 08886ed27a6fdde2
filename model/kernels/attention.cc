#include "model/kernels/attention.h"

#include <algorithm>
#include <atomic>
#include <cmath>
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
#include "model/kernels/softmax_math.h"

namespace ps {
namespace {

using kernels_internal::AttentionBackwardReference;
using kernels_internal::AttentionForwardReference;
using kernels_internal::CheckElems;
using kernels_internal::CheckPositive;
using kernels_internal::CheckWorkspace;
using kernels_internal::NumTasks;
using kernels_internal::ParallelFor;
namespace simd = kernels_internal::simd;

absl::Status CheckShape(const char* kernel, const AttentionShape& s) {
  RETURN_IF_ERROR(CheckPositive(kernel, "batch", s.batch));
  RETURN_IF_ERROR(CheckPositive(kernel, "seq_len", s.seq_len));
  RETURN_IF_ERROR(CheckPositive(kernel, "channels", s.channels));
  RETURN_IF_ERROR(CheckPositive(kernel, "num_heads", s.num_heads));
  RETURN_IF_ERROR(CheckPositive(kernel, "tile", s.tile));
  if (s.channels % s.num_heads != 0) {
    return absl::InvalidArgumentError(absl::StrCat(
        kernel, ": channels ", s.channels, " is not a multiple of num_heads ", s.num_heads));
  }
  return absl::OkStatus();
}

}  // namespace

int64_t AttentionWorkspaceElems(const AttentionShape& shape, int num_threads) {
  const int64_t hd = shape.num_heads > 0 ? shape.channels / shape.num_heads : 0;
  return std::max(1, num_threads) * (shape.tile + hd);
}

template <typename T>
absl::Status AttentionForward(const AttentionShape& shape, absl::Span<const T> qkv,
                              absl::Span<T> out, absl::Span<T> lse, absl::Span<T> workspace,
                              ThreadPool* pool) {
  constexpr char kKernel[] = "AttentionForward";
  RETURN_IF_ERROR(CheckShape(kKernel, shape));
  const int64_t B = shape.batch, L = shape.seq_len, C = shape.channels, H = shape.num_heads;
  const int64_t hd = C / H, tile = shape.tile;
  RETURN_IF_ERROR(CheckElems(kKernel, "qkv", qkv, B * L * 3 * C, "B*T*3C"));
  RETURN_IF_ERROR(CheckElems(kKernel, "out", out, B * L * C, "B*T*C"));
  RETURN_IF_ERROR(CheckElems(kKernel, "lse", lse, B * H * L, "B*H*T"));
  const int num_slots = pool == nullptr ? 1 : pool->num_threads();
  RETURN_IF_ERROR(CheckWorkspace(kKernel, workspace, AttentionWorkspaceElems(shape, num_slots)));

  if constexpr (std::is_same_v<T, float>) {
    // The fast schedule (bit-identical to the reference, internal/attention_simd.h). Work items
    // are whole heads (b, h), of equal cost (the reference's (b, h, query tile) items differ by
    // the causal triangle, and their static round-robin left one thread ~20% more work); each
    // slot claims the next unclaimed head until none is left, with its own scores and output row.
    const float scale = AttentionScale<float>(hd);
    const int64_t num_items = B * H;
    std::atomic<int64_t> next_item{0};
    ParallelFor(pool, num_slots, [&](int64_t slot) {
      float* scores = workspace.data() + slot * (tile + hd);
      float* acc = scores + tile;
      for (int64_t item = next_item++; item < num_items; item = next_item++) {
        const int64_t b = item / H, h = item % H;
        const float* base = qkv.data() + b * L * 3 * C + h * hd;
        const simd::AttentionHeadView head{.q = base,
                                           .k = base + C,
                                           .v = base + 2 * C,
                                           .qkv_stride = 3 * C,
                                           .seq_len = L,
                                           .head_dim = hd,
                                           .scale = scale};
        simd::AttentionForwardRows(head, tile, 0, L, out.data() + b * L * C + h * hd, C,
                                   lse.data() + (b * H + h) * L, scores, acc);
      }
    });
  } else {
    AttentionForwardReference<T>(shape, qkv, out, lse, workspace, pool);
  }
  return absl::OkStatus();
}

template <typename T>
absl::Status AttentionBackward(const AttentionShape& shape, absl::Span<const T> qkv,
                               absl::Span<const T> out, absl::Span<const T> lse,
                               absl::Span<const T> dout, absl::Span<T> dqkv, ThreadPool* pool) {
  constexpr char kKernel[] = "AttentionBackward";
  RETURN_IF_ERROR(CheckShape(kKernel, shape));
  const int64_t B = shape.batch, L = shape.seq_len, C = shape.channels, H = shape.num_heads;
  const int64_t hd = C / H;
  RETURN_IF_ERROR(CheckElems(kKernel, "qkv", qkv, B * L * 3 * C, "B*T*3C"));
  RETURN_IF_ERROR(CheckElems(kKernel, "out", out, B * L * C, "B*T*C"));
  RETURN_IF_ERROR(CheckElems(kKernel, "lse", lse, B * H * L, "B*H*T"));
  RETURN_IF_ERROR(CheckElems(kKernel, "dout", dout, B * L * C, "B*T*C"));
  RETURN_IF_ERROR(CheckElems(kKernel, "dqkv", dqkv, B * L * 3 * C, "B*T*3C"));

  if constexpr (std::is_same_v<T, float>) {
    // One task per (b, h): it owns that head's dq, dk and dv (internal/attention_simd.h).
    const float scale = AttentionScale<float>(hd);
    ParallelFor(pool, B * H, [&](int64_t item) {
      const int64_t b = item / H, h = item % H;
      const float* base = qkv.data() + b * L * 3 * C + h * hd;
      float* dbase = dqkv.data() + b * L * 3 * C + h * hd;
      const simd::AttentionHeadView head{.q = base,
                                         .k = base + C,
                                         .v = base + 2 * C,
                                         .qkv_stride = 3 * C,
                                         .seq_len = L,
                                         .head_dim = hd,
                                         .scale = scale};
      const int64_t row = b * L * C + h * hd;
      simd::AttentionBackwardHead(head, out.data() + row, dout.data() + row, C,
                                  lse.data() + (b * H + h) * L, dbase, dbase + C, dbase + 2 * C);
    });
  } else {
    AttentionBackwardReference<T>(shape, qkv, out, lse, dout, dqkv, pool);
  }
  return absl::OkStatus();
}

#define PS_ATTENTION_INSTANTIATE_(T)                                                     \
  template absl::Status AttentionForward<T>(const AttentionShape&, absl::Span<const T>,  \
                                            absl::Span<T>, absl::Span<T>, absl::Span<T>, \
                                            ThreadPool*);                                \
  template absl::Status AttentionBackward<T>(const AttentionShape&, absl::Span<const T>, \
                                             absl::Span<const T>, absl::Span<const T>,   \
                                             absl::Span<const T>, absl::Span<T>, ThreadPool*)
PS_ATTENTION_INSTANTIATE_(float);
PS_ATTENTION_INSTANTIATE_(double);
#undef PS_ATTENTION_INSTANTIATE_

}  // namespace ps
