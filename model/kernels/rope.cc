#include "model/kernels/rope.h"

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <type_traits>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "absl/types/span.h"
#include "base/status_macros.h"
#include "base/thread_pool.h"
#include "model/kernels/internal/kernel_util.h"
#include "model/kernels/internal/llama_simd.h"
#include "model/kernels/rope_math.h"

namespace ps {
namespace {

using kernels_internal::CheckElems;
using kernels_internal::CheckPositive;
using kernels_internal::NumTasks;
using kernels_internal::ParallelFor;
using kernels_internal::RowsPerTask;

bool PositiveFinite(double v) { return v > 0 && std::isfinite(v); }

absl::Status CheckShape(const char* kernel, const RopeShape& s) {
  RETURN_IF_ERROR(CheckPositive(kernel, "batch", s.batch));
  RETURN_IF_ERROR(CheckPositive(kernel, "seq_len", s.seq_len));
  RETURN_IF_ERROR(CheckPositive(kernel, "num_heads", s.num_heads));
  RETURN_IF_ERROR(CheckPositive(kernel, "head_dim", s.head_dim));
  RETURN_IF_ERROR(CheckPositive(kernel, "table_positions", s.table_positions));
  if (s.head_dim % 2 != 0) {
    return absl::InvalidArgumentError(
        absl::StrCat(kernel, ": head_dim ", s.head_dim, " is odd; RoPE rotates pairs"));
  }
  if (s.rotary_dim < 0 || s.rotary_dim > s.head_dim || s.rotary_dim % 2 != 0) {
    return absl::InvalidArgumentError(absl::StrCat(kernel, ": rotary_dim ", s.rotary_dim,
                                                   " must be even and in [0, head_dim=", s.head_dim,
                                                   "] (0: the whole head)"));
  }
  if (s.seq_len > s.table_positions) {
    return absl::InvalidArgumentError(absl::StrCat(kernel, ": seq_len ", s.seq_len,
                                                   " exceeds the cos/sin tables' ",
                                                   s.table_positions, " positions"));
  }
  return absl::OkStatus();
}

// Rotates every head of rows [0, B*T) in place; inverse selects the backward rotation.
// positions: empty, or [B*T] within [0, table_positions).
absl::Status CheckPositions(const char* kernel, const RopeShape& s,
                            absl::Span<const int32_t> positions) {
  if (positions.empty()) return absl::OkStatus();
  const int64_t L = s.seq_len;
  if (static_cast<int64_t>(positions.size()) != s.batch * L) {
    return absl::InvalidArgumentError(absl::StrCat(kernel, ": positions has ", positions.size(),
                                                   " elements, expected B*T = ", s.batch * L,
                                                   " (or none for positions 0 .. T-1)"));
  }
  for (int64_t i = 0; i < s.batch * L; ++i) {
    if (positions[i] < 0 || positions[i] >= s.table_positions) {
      return absl::InvalidArgumentError(
          absl::StrCat(kernel, ": positions[b=", i / L, ", t=", i % L, "] = ", positions[i],
                       " is outside the cos/sin tables' [0, ", s.table_positions, ")"));
    }
  }
  return absl::OkStatus();
}

template <typename T>
absl::Status Rotate(const char* kernel, const RopeShape& shape, absl::Span<const T> cos,
                    absl::Span<const T> sin, absl::Span<T> x, bool inverse, ThreadPool* pool,
                    absl::Span<const int32_t> positions) {
  RETURN_IF_ERROR(CheckShape(kernel, shape));
  RETURN_IF_ERROR(CheckPositions(kernel, shape, positions));
  const int64_t L = shape.seq_len, H = shape.num_heads, D = shape.head_dim;
  const int64_t half = shape.rotated() / 2;
  const int64_t rows = shape.batch * L;
  RETURN_IF_ERROR(
      CheckElems(kernel, "cos", cos, shape.table_positions * half, "table_positions*rotary_dim/2"));
  RETURN_IF_ERROR(
      CheckElems(kernel, "sin", sin, shape.table_positions * half, "table_positions*rotary_dim/2"));
  RETURN_IF_ERROR(CheckElems(kernel, inverse ? "dx" : "x", x, rows * H * D, "B*T*H*D"));
  const int64_t grain = RowsPerTask(H * D);
  ParallelFor(pool, NumTasks(rows, grain), [&](int64_t task) {
    const int64_t end = std::min(rows, (task + 1) * grain);
    for (int64_t row = task * grain; row < end; ++row) {
      const int64_t position = positions.empty() ? row % L : positions[row];
      const T* c = cos.data() + position * half;
      const T* s = sin.data() + position * half;
      for (int64_t h = 0; h < H; ++h) {
        T* head = x.data() + (row * H + h) * D;
        if constexpr (std::is_same_v<T, float>) {
          kernels_internal::llama_simd::RopeRotateHead(head, c, s, half, inverse);
        } else {
          for (int64_t i = 0; i < half; ++i) {
            const RopePair<T> r = inverse ? RopeRotateInverse(head[i], head[i + half], c[i], s[i])
                                          : RopeRotate(head[i], head[i + half], c[i], s[i]);
            head[i] = r.first;
            head[i + half] = r.second;
          }
        }
      }
    }
  });
  return absl::OkStatus();
}

}  // namespace

absl::Status ValidateRopeConfig(const RopeConfig& config) {
  if (config.head_dim <= 0 || config.head_dim % 2 != 0) {
    return absl::InvalidArgumentError(absl::StrCat(
        "RoPE: head_dim must be positive and even (RoPE rotates pairs), got ", config.head_dim));
  }
  if (!PositiveFinite(config.theta)) {
    return absl::InvalidArgumentError(
        absl::StrCat("rope_theta must be a positive finite number, got ", config.theta));
  }
  if (config.scaling_type.empty() || config.scaling_type == "default") return absl::OkStatus();
  if (config.scaling_type == "longrope") {
    if (static_cast<int64_t>(config.longrope_factors.size()) != config.head_dim / 2) {
      return absl::InvalidArgumentError(
          absl::StrCat("rope_scaling.short_factor / long_factor must have rotary_dim / 2 = ",
                       config.head_dim / 2, " entries, got ", config.longrope_factors.size()));
    }
    for (const double f : config.longrope_factors) {
      if (!PositiveFinite(f)) {
        return absl::InvalidArgumentError(absl::StrCat(
            "rope_scaling.short_factor / long_factor entries must be positive, got ", f));
      }
    }
    if (!PositiveFinite(config.attention_factor)) {
      return absl::InvalidArgumentError(absl::StrCat(
          "rope_scaling.attention_factor must be positive, got ", config.attention_factor));
    }
    return absl::OkStatus();
  }
  if (config.scaling_type == "linear") {
    if (!PositiveFinite(config.linear_factor)) {
      return absl::InvalidArgumentError(absl::StrCat(
          "rope_scaling.factor must be a positive finite number for linear, got ",
          config.linear_factor));
    }
    return absl::OkStatus();
  }
  if (config.scaling_type != "llama3") {
    return absl::InvalidArgumentError(absl::StrCat(
        "rope_scaling.rope_type (or the legacy rope_scaling.type) \"", config.scaling_type,
        "\" is not supported; supported: \"llama3\", \"longrope\", \"linear\", \"default\", or no "
        "rope_scaling"));
  }
  const RopeLlama3Params& p = config.llama3;
  if (!PositiveFinite(p.factor)) {
    return absl::InvalidArgumentError(absl::StrCat(
        "rope_scaling.factor must be a positive finite number for llama3, got ", p.factor));
  }
  if (!PositiveFinite(p.low_freq_factor)) {
    return absl::InvalidArgumentError(absl::StrCat(
        "rope_scaling.low_freq_factor must be a positive finite number, got ", p.low_freq_factor));
  }
  if (!std::isfinite(p.high_freq_factor) || !(p.high_freq_factor > p.low_freq_factor)) {
    return absl::InvalidArgumentError(
        absl::StrCat("rope_scaling.high_freq_factor (", p.high_freq_factor,
                     ") must be finite and greater than rope_scaling.low_freq_factor (",
                     p.low_freq_factor, ")"));
  }
  if (!PositiveFinite(p.original_max_position_embeddings)) {
    return absl::InvalidArgumentError(
        absl::StrCat("rope_scaling.original_max_position_embeddings must be positive, got ",
                     p.original_max_position_embeddings));
  }
  return absl::OkStatus();
}

template <typename T>
absl::Status RopeInverseFrequencies(const RopeConfig& config, absl::Span<T> inv_freq) {
  RETURN_IF_ERROR(ValidateRopeConfig(config));
  const int64_t half = config.head_dim / 2;
  RETURN_IF_ERROR(CheckElems("RopeInverseFrequencies", "inv_freq", inv_freq, half, "head_dim/2"));
  const bool llama3 = config.scaling_type == "llama3";
  if (config.scaling_type == "longrope") {
    for (int64_t i = 0; i < half; ++i) {
      inv_freq[i] = RopeLongRopeInverseFrequency<T>(config.theta, i, config.head_dim,
                                                    config.longrope_factors[i]);
    }
    return absl::OkStatus();
  }
  const bool linear = config.scaling_type == "linear";
  for (int64_t i = 0; i < half; ++i) {
    const T f = RopeDefaultInverseFrequency<T>(config.theta, i, config.head_dim);
    // linear: transformers' inv_freq /= factor, in T.
    inv_freq[i] = llama3   ? RopeLlama3InverseFrequency<T>(f, config.llama3)
                  : linear ? f / static_cast<T>(config.linear_factor)
                           : f;
  }
  return absl::OkStatus();
}

template <typename T>
absl::Status RopeTables(const RopeConfig& config, int64_t num_positions, absl::Span<T> cos,
                        absl::Span<T> sin) {
  constexpr char kKernel[] = "RopeTables";
  RETURN_IF_ERROR(ValidateRopeConfig(config));
  RETURN_IF_ERROR(CheckPositive(kKernel, "num_positions", num_positions));
  const int64_t half = config.head_dim / 2;
  RETURN_IF_ERROR(
      CheckElems(kKernel, "cos", cos, num_positions * half, "num_positions*head_dim/2"));
  RETURN_IF_ERROR(
      CheckElems(kKernel, "sin", sin, num_positions * half, "num_positions*head_dim/2"));
  std::vector<T> inv_freq(half);
  RETURN_IF_ERROR(RopeInverseFrequencies<T>(config, absl::MakeSpan(inv_freq)));
  for (int64_t p = 0; p < num_positions; ++p) {
    for (int64_t i = 0; i < half; ++i) {
      const double angle = static_cast<double>(RopeAngle<T>(p, inv_freq[i]));
      cos[p * half + i] = static_cast<T>(std::cos(angle));
      sin[p * half + i] = static_cast<T>(std::sin(angle));
      if (config.attention_factor != 1.0) {
        // transformers: emb.cos() * attention_scaling, in T.
        cos[p * half + i] *= static_cast<T>(config.attention_factor);
        sin[p * half + i] *= static_cast<T>(config.attention_factor);
      }
    }
  }
  return absl::OkStatus();
}

template <typename T>
absl::Status RopeForward(const RopeShape& shape, absl::Span<const T> cos, absl::Span<const T> sin,
                         absl::Span<T> x, ThreadPool* pool, absl::Span<const int32_t> positions) {
  return Rotate<T>("RopeForward", shape, cos, sin, x, /*inverse=*/false, pool, positions);
}

template <typename T>
absl::Status RopeBackward(const RopeShape& shape, absl::Span<const T> cos, absl::Span<const T> sin,
                          absl::Span<T> dx, ThreadPool* pool, absl::Span<const int32_t> positions) {
  return Rotate<T>("RopeBackward", shape, cos, sin, dx, /*inverse=*/true, pool, positions);
}

#define PS_ROPE_INSTANTIATE_(T)                                                                    \
  template absl::Status RopeInverseFrequencies<T>(const RopeConfig&, absl::Span<T>);               \
  template absl::Status RopeTables<T>(const RopeConfig&, int64_t, absl::Span<T>, absl::Span<T>);   \
  template absl::Status RopeForward<T>(const RopeShape&, absl::Span<const T>, absl::Span<const T>, \
                                       absl::Span<T>, ThreadPool*, absl::Span<const int32_t>);     \
  template absl::Status RopeBackward<T>(const RopeShape&, absl::Span<const T>,                     \
                                        absl::Span<const T>, absl::Span<T>, ThreadPool*,           \
                                        absl::Span<const int32_t>)
PS_ROPE_INSTANTIATE_(float);
PS_ROPE_INSTANTIATE_(double);
#undef PS_ROPE_INSTANTIATE_

}  // namespace ps
