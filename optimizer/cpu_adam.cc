// Highway implementation of optimizer/cpu_adam.h. This file is compiled once per SIMD target:
// hwy/foreach_target.h re-includes it with HWY_TARGET set to each target, and HWY_EXPORT /
// HWY_DYNAMIC_DISPATCH (in the HWY_ONCE section at the bottom) pick one at run time, as in
// Highway's hwy/examples/skeleton.cc and memory/convert.cc.
//
// Per target there are two block kernels, each run by one pool thread on one block of one
// segment: StepBlock (the fused Adam update) and StatsBlock (sum of squares and Inf/NaN count).
// 16-bit gradients go through an f32 tile on the stack, widened and narrowed by memory/convert.h,
// whose conversions are bit-exact on every target (Highway 1.0.3's own f16/bf16 conversions are
// not; see memory/convert.h). The tile stays in L1, so main memory is still touched once per
// element and array: 2 bytes of gradient read, 12 bytes of master/momentum/variance read and
// written, 2 bytes of parameter written (with f16/bf16 compute).
#include "optimizer/cpu_adam.h"

#include <algorithm>
#include <atomic>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <memory>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "absl/flags/flag.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/str_cat.h"
#include "absl/types/span.h"
#include "base/status_macros.h"
#include "memory/convert.h"
#include "memory/dtype.h"
#include "optimizer/adam_kernels.h"
#include "optimizer/adam_math.h"

#undef HWY_TARGET_INCLUDE
#define HWY_TARGET_INCLUDE "optimizer/cpu_adam.cc"
#include "hwy/foreach_target.h"  // IWYU pragma: keep
#include "hwy/highway.h"

// Per-target code lives in ps::cpu_adam_internal::N_<TARGET> so its names cannot collide with other
// Highway files' ps::N_<TARGET> (memory/convert.cc has its own TargetNameImpl).
HWY_BEFORE_NAMESPACE();
namespace ps {
namespace cpu_adam_internal {
namespace HWY_NAMESPACE {
namespace hn = hwy::HWY_NAMESPACE;

// The Adam update of n elements whose stored gradients are f32 at `grad` (which may alias
// `param_out`; param_out may be null). Whole vectors first, then the rest through the scalar
// reference. Returns true if some effective gradient was Inf or NaN.
template <bool kL2, bool kDecay>
bool AdamLoop(const AdamStepScalars& s, const float* grad, float* HWY_RESTRICT master,
              float* HWY_RESTRICT exp_avg, float* HWY_RESTRICT exp_avg_sq, float* param_out,
              size_t n) {
  const hn::ScalableTag<float> d;
  const size_t lanes = hn::Lanes(d);
  const auto loss_scale = hn::Set(d, s.loss_scale);
  const auto clip_coef = hn::Set(d, s.clip_coef);
  const auto l2 = hn::Set(d, s.l2);
  const auto decay = hn::Set(d, s.decay);
  const auto beta1 = hn::Set(d, s.beta1);
  const auto one_minus_beta1 = hn::Set(d, s.one_minus_beta1);
  const auto beta2 = hn::Set(d, s.beta2);
  const auto one_minus_beta2 = hn::Set(d, s.one_minus_beta2);
  const auto eps = hn::Set(d, s.eps);
  const auto step_size = hn::Set(d, s.step_size);
  const auto inv_sqrt_bc2 = hn::Set(d, s.inv_sqrt_bias_correction2);
  // All-ones lanes while every effective gradient seen in that lane was finite (starts all-ones:
  // loss_scale == loss_scale in every lane).
  auto finite = hn::VecFromMask(d, hn::Eq(loss_scale, loss_scale));
  size_t i = 0;
  for (; i + lanes <= n; i += lanes) {
    auto g = hn::Mul(hn::Div(hn::LoadU(d, grad + i), loss_scale), clip_coef);
    finite = hn::And(finite, hn::VecFromMask(d, hn::IsFinite(g)));
    auto p = hn::LoadU(d, master + i);
    if (kL2) g = hn::MulAdd(l2, p, g);
    if (kDecay) p = hn::Mul(p, decay);
    const auto m = hn::MulAdd(beta1, hn::LoadU(d, exp_avg + i), hn::Mul(one_minus_beta1, g));
    const auto v =
        hn::MulAdd(beta2, hn::LoadU(d, exp_avg_sq + i), hn::Mul(hn::Mul(one_minus_beta2, g), g));
    const auto denom = hn::MulAdd(hn::Sqrt(v), inv_sqrt_bc2, eps);
    p = hn::NegMulAdd(step_size, hn::Div(m, denom), p);
    hn::StoreU(m, d, exp_avg + i);
    hn::StoreU(v, d, exp_avg_sq + i);
    hn::StoreU(p, d, master + i);
    if (param_out != nullptr) hn::StoreU(p, d, param_out + i);
  }
  bool any_nonfinite = !hn::AllTrue(d, hn::MaskFromVec(finite));
  for (; i < n; ++i) {
    const float raw = grad[i];
    any_nonfinite |= !std::isfinite(AdamEffectiveGrad(s, raw));
    float p = master[i];
    float m = exp_avg[i];
    float v = exp_avg_sq[i];
    AdamUpdate(s, raw, p, m, v);
    master[i] = p;
    exp_avg[i] = m;
    exp_avg_sq[i] = v;
    if (param_out != nullptr) param_out[i] = p;
  }
  return any_nonfinite;
}

bool AdamLoopDispatch(const AdamStepScalars& s, const float* grad, float* master, float* exp_avg,
                      float* exp_avg_sq, float* param_out, size_t n) {
  const bool l2 = s.l2 != 0.0f;
  const bool decay = s.decay != 1.0f;
  if (l2 && decay) return AdamLoop<true, true>(s, grad, master, exp_avg, exp_avg_sq, param_out, n);
  if (l2) return AdamLoop<true, false>(s, grad, master, exp_avg, exp_avg_sq, param_out, n);
  if (decay) return AdamLoop<false, true>(s, grad, master, exp_avg, exp_avg_sq, param_out, n);
  return AdamLoop<false, false>(s, grad, master, exp_avg, exp_avg_sq, param_out, n);
}

// Counts the effective gradients of f32 `grad[0, n)` that are Inf or NaN (the rare path).
int64_t CountNonFinite(const AdamStepScalars& s, const float* grad, size_t n) {
  int64_t count = 0;
  for (size_t i = 0; i < n; ++i) count += std::isfinite(AdamEffectiveGrad(s, grad[i])) ? 0 : 1;
  return count;
}

// Widens n 16-bit values into f32 (bit-exact, memory/convert.h).
void Widen(DType dtype, const uint16_t* src, float* dst, size_t n) {
  if (dtype == DType::kF16) {
    ConvertF16ToF32(src, dst, static_cast<int64_t>(n));
  } else {
    ConvertBF16ToF32(src, dst, static_cast<int64_t>(n));
  }
}

void Narrow(DType dtype, const float* src, uint16_t* dst, size_t n) {
  if (dtype == DType::kF16) {
    ConvertF32ToF16(src, dst, static_cast<int64_t>(n));
  } else {
    ConvertF32ToBF16(src, dst, static_cast<int64_t>(n));
  }
}

// The fused update of elements [begin, begin + len) of `seg`. Returns the number of non-finite
// effective gradients.
int64_t StepBlock(const AdamSegment& seg, int64_t begin, int64_t len) {
  const AdamStepScalars& s = seg.scalars;
  float* master = seg.master + begin;
  float* exp_avg = seg.exp_avg + begin;
  float* exp_avg_sq = seg.exp_avg_sq + begin;
  const size_t n = static_cast<size_t>(len);
  HWY_ALIGN float tile[kCpuAdamTileElems];
  int64_t nonfinite = 0;
  if (seg.dtype == DType::kF32) {
    const float* grad = static_cast<const float*>(seg.grad) + begin;
    float* param = seg.param == nullptr ? nullptr : static_cast<float*>(seg.param) + begin;
    // In place (param == grad) the gradients are read from a copy in the tile, so that they can
    // still be counted after the parameters overwrote them.
    const bool in_place = seg.param == seg.grad;
    for (size_t off = 0; off < n; off += kCpuAdamTileElems) {
      const size_t t = std::min<size_t>(kCpuAdamTileElems, n - off);
      const float* g = grad + off;
      if (in_place) {
        std::memcpy(tile, g, t * sizeof(float));
        g = tile;
      }
      if (AdamLoopDispatch(s, g, master + off, exp_avg + off, exp_avg_sq + off,
                           param == nullptr ? nullptr : param + off, t)) {
        nonfinite += CountNonFinite(s, g, t);
      }
    }
    return nonfinite;
  }
  const uint16_t* grad = static_cast<const uint16_t*>(seg.grad) + begin;
  uint16_t* param = static_cast<uint16_t*>(seg.param) + begin;
  for (size_t off = 0; off < n; off += kCpuAdamTileElems) {
    const size_t t = std::min<size_t>(kCpuAdamTileElems, n - off);
    Widen(seg.dtype, grad + off, tile, t);
    if (AdamLoopDispatch(s, tile, master + off, exp_avg + off, exp_avg_sq + off, nullptr, t)) {
      nonfinite += CountNonFinite(s, tile, t);
    }
    Narrow(seg.dtype, master + off, param + off, t);
  }
  return nonfinite;
}

// Sum of x*x over x[0, n), lanes accumulated in f32 (four accumulators), then added in double in
// a fixed order. Inf or NaN if an element is, or if an f32 partial sum overflowed.
double SumSquares(const float* HWY_RESTRICT x, size_t n) {
  const hn::ScalableTag<float> d;
  const size_t lanes = hn::Lanes(d);
  auto acc0 = hn::Zero(d);
  auto acc1 = hn::Zero(d);
  auto acc2 = hn::Zero(d);
  auto acc3 = hn::Zero(d);
  size_t i = 0;
  for (; i + 4 * lanes <= n; i += 4 * lanes) {
    const auto x0 = hn::LoadU(d, x + i);
    const auto x1 = hn::LoadU(d, x + i + lanes);
    const auto x2 = hn::LoadU(d, x + i + 2 * lanes);
    const auto x3 = hn::LoadU(d, x + i + 3 * lanes);
    acc0 = hn::MulAdd(x0, x0, acc0);
    acc1 = hn::MulAdd(x1, x1, acc1);
    acc2 = hn::MulAdd(x2, x2, acc2);
    acc3 = hn::MulAdd(x3, x3, acc3);
  }
  for (; i + lanes <= n; i += lanes) {
    const auto x0 = hn::LoadU(d, x + i);
    acc0 = hn::MulAdd(x0, x0, acc0);
  }
  HWY_ALIGN float partial[hn::MaxLanes(d)];
  double sum = 0.0;
  for (const auto& acc : {acc0, acc1, acc2, acc3}) {
    hn::Store(acc, d, partial);
    for (size_t lane = 0; lane < lanes; ++lane) sum += partial[lane];
  }
  for (; i < n; ++i) sum += static_cast<double>(x[i]) * x[i];
  return sum;
}

// Exact recount of a tile whose fast sum was not finite: which elements are Inf/NaN, and the sum
// of squares of the others in double (which cannot overflow: f32 values are below 2^128, their
// squares below 2^256, far inside the double range).
void AddTileSlow(const float* x, size_t n, GradStats* stats) {
  for (size_t i = 0; i < n; ++i) {
    if (!std::isfinite(x[i])) {
      ++stats->nonfinite_elems;
    } else {
      stats->sum_squares += static_cast<double>(x[i]) * x[i];
    }
  }
}

GradStats StatsBlock(const GradSegment& seg, int64_t begin, int64_t len) {
  GradStats stats;
  const size_t n = static_cast<size_t>(len);
  HWY_ALIGN float tile[kCpuAdamTileElems];
  for (size_t off = 0; off < n; off += kCpuAdamTileElems) {
    const size_t t = std::min<size_t>(kCpuAdamTileElems, n - off);
    const float* x;
    if (seg.dtype == DType::kF32) {
      x = static_cast<const float*>(seg.grad) + begin + off;
    } else {
      Widen(seg.dtype, static_cast<const uint16_t*>(seg.grad) + begin + off, tile, t);
      x = tile;
    }
    const double sum = SumSquares(x, t);
    if (std::isfinite(sum)) {
      stats.sum_squares += sum;
    } else {
      AddTileSlow(x, t, &stats);
    }
  }
  return stats;
}

const char* TargetNameImpl() { return hwy::TargetName(HWY_TARGET); }

}  // namespace HWY_NAMESPACE
}  // namespace cpu_adam_internal
}  // namespace ps
HWY_AFTER_NAMESPACE();

#if HWY_ONCE

ABSL_FLAG(int32_t, cpu_adam_threads, 0,
          "Threads of the CPU Adam kernels' pool, the calling thread included; 0 means one per "
          "core (std::thread::hardware_concurrency()).");

namespace ps {
namespace cpu_adam_internal {

HWY_EXPORT(StepBlock);
HWY_EXPORT(StatsBlock);
HWY_EXPORT(TargetNameImpl);

int64_t DispatchStepBlock(const AdamSegment& segment, int64_t begin, int64_t len) {
  return HWY_DYNAMIC_DISPATCH(StepBlock)(segment, begin, len);
}
GradStats DispatchStatsBlock(const GradSegment& segment, int64_t begin, int64_t len) {
  return HWY_DYNAMIC_DISPATCH(StatsBlock)(segment, begin, len);
}
const char* DispatchTargetName() { return HWY_DYNAMIC_DISPATCH(TargetNameImpl)(); }

}  // namespace cpu_adam_internal

namespace {

// One task of the pool: a block of one segment.
struct BlockTask {
  size_t segment;
  int64_t begin;
  int64_t len;
};

// Cuts each segment into blocks of kCpuAdamBlockElems at fixed offsets from its start.
template <typename Segment>
std::vector<BlockTask> MakeBlocks(absl::Span<const Segment> segments) {
  std::vector<BlockTask> blocks;
  for (size_t i = 0; i < segments.size(); ++i) {
    for (int64_t begin = 0; begin < segments[i].n_elems; begin += kCpuAdamBlockElems) {
      blocks.push_back({i, begin, std::min(kCpuAdamBlockElems, segments[i].n_elems - begin)});
    }
  }
  return blocks;
}

}  // namespace

absl::StatusOr<std::unique_ptr<CpuAdam>> CpuAdam::Create(const CpuAdamOptions& options) {
  int threads = options.num_threads;
  if (threads < 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("CpuAdam: num_threads must be >= 0 (0: --cpu_adam_threads), got ", threads));
  }
  if (threads == 0) {
    threads = absl::GetFlag(FLAGS_cpu_adam_threads);
    if (threads < 0) {
      return absl::InvalidArgumentError(
          absl::StrCat("--cpu_adam_threads must be >= 0 (0: one thread per core), got ", threads));
    }
  }
  if (threads == 0) threads = std::max(1u, std::thread::hardware_concurrency());
  return std::unique_ptr<CpuAdam>(new CpuAdam(threads));
}

std::string CpuAdam::name() const {
  return absl::StrCat("cpu(", CpuAdamTargetName(), ", ", num_threads(), " threads)");
}

absl::StatusOr<GradStats> CpuAdam::GradientStats(absl::Span<const GradSegment> segments) {
  RETURN_IF_ERROR(ValidateGradSegments("CpuAdam::GradientStats", segments));
  const std::vector<BlockTask> blocks = MakeBlocks(segments);
  std::vector<GradStats> partial(blocks.size());
  pool_.ParallelFor(static_cast<int64_t>(blocks.size()), [&](int64_t task) {
    const BlockTask& b = blocks[task];
    partial[task] = cpu_adam_internal::DispatchStatsBlock(segments[b.segment], b.begin, b.len);
  });
  GradStats total;
  for (const GradStats& p : partial) total += p;
  return total;
}

absl::StatusOr<AdamStepResult> CpuAdam::Step(absl::Span<const AdamSegment> segments) {
  RETURN_IF_ERROR(ValidateAdamSegments("CpuAdam::Step", segments));
  const std::vector<BlockTask> blocks = MakeBlocks(segments);
  std::atomic<int64_t> nonfinite{0};
  pool_.ParallelFor(static_cast<int64_t>(blocks.size()), [&](int64_t task) {
    const BlockTask& b = blocks[task];
    const int64_t n = cpu_adam_internal::DispatchStepBlock(segments[b.segment], b.begin, b.len);
    if (n != 0) nonfinite.fetch_add(n, std::memory_order_relaxed);
  });
  return AdamStepResult{nonfinite.load()};
}

absl::Status CpuAdam::RestoreParams(absl::Span<const ParamRestoreSegment> segments) {
  RETURN_IF_ERROR(ValidateRestoreSegments("CpuAdam::RestoreParams", segments));
  const std::vector<BlockTask> blocks = MakeBlocks(segments);
  pool_.ParallelFor(static_cast<int64_t>(blocks.size()), [&](int64_t task) {
    const BlockTask& b = blocks[task];
    const ParamRestoreSegment& seg = segments[b.segment];
    const float* master = seg.master + b.begin;
    switch (seg.dtype) {
      case DType::kF32:
        std::memcpy(static_cast<float*>(seg.param) + b.begin, master,
                    static_cast<size_t>(b.len) * sizeof(float));
        break;
      case DType::kF16:
        ConvertF32ToF16(master, static_cast<uint16_t*>(seg.param) + b.begin, b.len);
        break;
      case DType::kBF16:
        ConvertF32ToBF16(master, static_cast<uint16_t*>(seg.param) + b.begin, b.len);
        break;
    }
  });
  return absl::OkStatus();
}

absl::Status CpuAdam::AccumulateGradients(absl::Span<const GradAccumulateSegment> segments) {
  RETURN_IF_ERROR(ValidateAccumulateSegments("CpuAdam::AccumulateGradients", segments));
  const std::vector<BlockTask> blocks = MakeBlocks(segments);
  pool_.ParallelFor(static_cast<int64_t>(blocks.size()), [&](int64_t task) {
    const BlockTask& b = blocks[task];
    const GradAccumulateSegment& seg = segments[b.segment];
    float* acc = seg.acc + b.begin;
    if (seg.dtype == DType::kF32) {
      const float* grad = static_cast<const float*>(seg.grad) + b.begin;
      for (int64_t i = 0; i < b.len; ++i) acc[i] += grad[i];
      return;
    }
    // Widen a block at a time on the stack, then add.
    constexpr int64_t kTile = 1024;
    float wide[kTile];
    const uint16_t* grad = static_cast<const uint16_t*>(seg.grad) + b.begin;
    for (int64_t t = 0; t < b.len; t += kTile) {
      const int64_t n = std::min(kTile, b.len - t);
      if (seg.dtype == DType::kF16) {
        ConvertF16ToF32(grad + t, wide, n);
      } else {
        ConvertBF16ToF32(grad + t, wide, n);
      }
      for (int64_t i = 0; i < n; ++i) acc[t + i] += wide[i];
    }
  });
  return absl::OkStatus();
}

const char* CpuAdamTargetName() { return cpu_adam_internal::DispatchTargetName(); }

}  // namespace ps
#endif  // HWY_ONCE
