// Highway implementation of optimizer/cpu_adam.h. This file is compiled once per SIMD target:
// hwy/foreach_target.h re-includes it with HWY_TARGET set to each target, and HWY_EXPORT /
// HWY_DYNAMIC_DISPATCH (in the HWY_ONCE section at the bottom) pick one at run time, as in
// Highway's hwy/examples/skeleton.cc and memory/convert.cc.
//
// Per target there are two block kernels, each run by one pool thread on one block of one
// segment: StepBlock (the fused Adam update) and StatsBlock (sum of squares and Inf/NaN count).
// StepBlock converts 16-bit gradients and parameters in registers, inside the update loop (IO
// policies below, bit-identical to memory/convert.h), so main memory is touched once per element
// and array: 2 bytes of gradient read, 12 bytes of master/momentum/variance read and written,
// 2 bytes of parameter written (with f16/bf16 compute), and nothing else is. (It used to widen
// each 1024-element tile into an f32 staging buffer and narrow it back with two dispatched
// memory/convert.h calls per tile; only f16 on targets without F16C still does.) StatsBlock widens
// into an L1-resident f32 tile with memory/convert.h, whose tiles also fix the order of its
// partial sums.
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
#include "memory/dtype_math.h"
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

// How AdamLoop reads the stored gradients and writes the new parameters: f32, or 16-bit values
// converted in registers (no staging tile). Each IO reads element i's gradient before it writes
// element i's parameter, so the two may share memory (the usual in-place case).
//
// The 16-bit conversions are bit-identical to memory/convert.h: f16 with the F16C instructions
// convert.cc uses on x86 targets from AVX2 up (round-to-nearest immediate, NaNs quieted as
// dtype_math.h does); bf16 with the integer form of dtype_math.h that convert.cc vectorizes. f16
// on targets without F16C keeps the staging tile (StepBlock).
#undef PS_CPU_ADAM_F16C
#if HWY_ARCH_X86 && HWY_TARGET <= HWY_AVX2 && !defined(HWY_DISABLE_F16C)
#define PS_CPU_ADAM_F16C 1
#else
#define PS_CPU_ADAM_F16C 0
#endif

using DF = hn::ScalableTag<float>;
using VF = hn::Vec<DF>;

struct F32IO {
  const float* grad;
  float* param;  // may be null: only the master copy is updated
  VF Load(DF d, size_t i) const { return hn::LoadU(d, grad + i); }
  void Store(DF d, size_t i, VF p) const {
    if (param != nullptr) hn::StoreU(p, d, param + i);
  }
  float LoadScalar(size_t i) const { return grad[i]; }
  void StoreScalar(size_t i, float p) const {
    if (param != nullptr) param[i] = p;
  }
};

#if PS_CPU_ADAM_F16C
struct F16IO {
  const uint16_t* grad;
  uint16_t* param;
  VF Load(DF d, size_t i) const {
    const hn::Rebind<uint16_t, DF> du16;
    const hn::Rebind<hwy::float16_t, DF> df16;
    return hn::PromoteTo(d, hn::BitCast(df16, hn::LoadU(du16, grad + i)));
  }
  void Store(DF d, size_t i, VF p) const {
    const hn::Rebind<uint16_t, DF> du16;
    const hn::Rebind<hwy::float16_t, DF> df16;
    hn::StoreU(hn::BitCast(du16, hn::DemoteTo(df16, p)), du16, param + i);
  }
  float LoadScalar(size_t i) const { return HalfBitsToFloat(grad[i]); }
  void StoreScalar(size_t i, float p) const { param[i] = FloatToHalfBits(p); }
};
#endif

struct BF16IO {
  const uint16_t* grad;
  uint16_t* param;
  VF Load(DF d, size_t i) const {
    namespace dti = dtype_internal;
    const hn::RebindToUnsigned<DF> du32;
    const hn::RebindToSigned<DF> di32;
    const hn::Rebind<uint16_t, DF> du16;
    // BFloat16BitsToFloat: the bits shifted up; a NaN comes back quiet.
    const auto bits = hn::ShiftLeft<16>(hn::PromoteTo(du32, hn::LoadU(du16, grad + i)));
    const auto abs = hn::And(bits, hn::Set(du32, dti::kF32AbsMask));
    const auto is_nan = hn::RebindMask(
        du32, hn::BitCast(di32, abs) > hn::Set(di32, static_cast<int32_t>(dti::kF32Inf)));
    return hn::BitCast(d,
                       hn::Or(bits, hn::IfThenElseZero(is_nan, hn::Set(du32, dti::kF32QuietBit))));
  }
  void Store(DF d, size_t i, VF p) const {
    namespace dti = dtype_internal;
    const hn::RebindToUnsigned<DF> du32;
    const hn::RebindToSigned<DF> di32;
    const hn::Rebind<uint16_t, DF> du16;
    // FloatToBFloat16Bits: round to nearest even; a NaN keeps its top payload bits, quieted.
    const auto x = hn::BitCast(du32, p);
    const auto abs = hn::And(x, hn::Set(du32, dti::kF32AbsMask));
    const auto odd = hn::And(hn::ShiftRight<16>(x), hn::Set(du32, 1u));
    const auto rounded = hn::ShiftRight<16>(hn::Add(x, hn::Add(hn::Set(du32, 0x7fffu), odd)));
    const auto nan = hn::Or(hn::ShiftRight<16>(x), hn::Set(du32, dti::kBF16QuietBit));
    const auto is_nan = hn::RebindMask(
        du32, hn::BitCast(di32, abs) > hn::Set(di32, static_cast<int32_t>(dti::kF32Inf)));
    const auto b = hn::IfThenElse(is_nan, nan, rounded);
    // Lanes hold values <= 0xffff, so the saturating i32 -> u16 demotion is exact.
    hn::StoreU(hn::DemoteTo(du16, hn::BitCast(di32, b)), du16, param + i);
  }
  float LoadScalar(size_t i) const { return BFloat16BitsToFloat(grad[i]); }
  void StoreScalar(size_t i, float p) const { param[i] = FloatToBFloat16Bits(p); }
};

// The Adam update of n elements: whole vectors first, then the rest through the scalar reference
// AdamUpdate. Returns the number of effective gradients (unscaled and clipped) that were Inf or
// NaN, counted as they go by (so no copy of in-place gradients is needed to count them later).
template <bool kL2, bool kDecay, class IO>
int64_t AdamLoop(const AdamStepScalars& s, const IO& io, float* HWY_RESTRICT master,
                 float* HWY_RESTRICT exp_avg, float* HWY_RESTRICT exp_avg_sq, size_t n) {
  const DF d;
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
  int64_t nonfinite = 0;
  size_t i = 0;
  for (; i + lanes <= n; i += lanes) {
    auto g = hn::Mul(hn::Div(io.Load(d, i), loss_scale), clip_coef);
    const auto bad = hn::Not(hn::IsFinite(g));
    if (HWY_UNLIKELY(!hn::AllFalse(d, bad))) {
      nonfinite += static_cast<int64_t>(hn::CountTrue(d, bad));
    }
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
    io.Store(d, i, p);
  }
  for (; i < n; ++i) {
    const float raw = io.LoadScalar(i);
    nonfinite += std::isfinite(AdamEffectiveGrad(s, raw)) ? 0 : 1;
    float p = master[i];
    float m = exp_avg[i];
    float v = exp_avg_sq[i];
    AdamUpdate(s, raw, p, m, v);
    master[i] = p;
    exp_avg[i] = m;
    exp_avg_sq[i] = v;
    io.StoreScalar(i, p);
  }
  return nonfinite;
}

template <class IO>
int64_t AdamLoopDispatch(const AdamStepScalars& s, const IO& io, float* master, float* exp_avg,
                         float* exp_avg_sq, size_t n) {
  const bool l2 = s.l2 != 0.0f;
  const bool decay = s.decay != 1.0f;
  if (l2 && decay) return AdamLoop<true, true>(s, io, master, exp_avg, exp_avg_sq, n);
  if (l2) return AdamLoop<true, false>(s, io, master, exp_avg, exp_avg_sq, n);
  if (decay) return AdamLoop<false, true>(s, io, master, exp_avg, exp_avg_sq, n);
  return AdamLoop<false, false>(s, io, master, exp_avg, exp_avg_sq, n);
}

// Widens n 16-bit values into f32 (bit-exact, memory/convert.h).
void Widen(DType dtype, const uint16_t* src, float* dst, size_t n) {
  if (dtype == DType::kF16) {
    ConvertF16ToF32(src, dst, static_cast<int64_t>(n));
  } else {
    ConvertBF16ToF32(src, dst, static_cast<int64_t>(n));
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
  if (seg.dtype == DType::kF32) {
    const F32IO io{static_cast<const float*>(seg.grad) + begin,
                   seg.param == nullptr ? nullptr : static_cast<float*>(seg.param) + begin};
    return AdamLoopDispatch(s, io, master, exp_avg, exp_avg_sq, n);
  }
  const uint16_t* grad = static_cast<const uint16_t*>(seg.grad) + begin;
  uint16_t* param = static_cast<uint16_t*>(seg.param) + begin;
  if (seg.dtype == DType::kBF16) {
    return AdamLoopDispatch(s, BF16IO{grad, param}, master, exp_avg, exp_avg_sq, n);
  }
#if PS_CPU_ADAM_F16C
  return AdamLoopDispatch(s, F16IO{grad, param}, master, exp_avg, exp_avg_sq, n);
#else
  // f16 without F16C: widen a tile at a time into f32 with memory/convert.h (its integer
  // emulation), update, and round the new master values back.
  HWY_ALIGN float tile[kCpuAdamTileElems];
  int64_t nonfinite = 0;
  for (size_t off = 0; off < n; off += kCpuAdamTileElems) {
    const size_t t = std::min<size_t>(kCpuAdamTileElems, n - off);
    Widen(seg.dtype, grad + off, tile, t);
    nonfinite +=
        AdamLoopDispatch(s, F32IO{tile, nullptr}, master + off, exp_avg + off, exp_avg_sq + off, t);
    ConvertF32ToF16(master + off, param + off, static_cast<int64_t>(t));
  }
  return nonfinite;
#endif
}

// Sum of x*x over x[0, n), lanes accumulated in f32 (four accumulators), then added in double in
// a fixed order. Inf or NaN if an element is, or if an f32 partial sum overflowed. The CUDA kernel
// reproduces this order (optimizer/grad_stats_math.h; keep the two in step); the file is compiled
// with -ffp-contract=off, so the double products below are rounded as written.
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

CpuSumSquaresShape SumSquaresShapeImpl() {
  const hn::ScalableTag<float> d;
  return CpuSumSquaresShape{static_cast<int>(hn::Lanes(d)), HWY_NATIVE_FMA != 0};
}

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
HWY_EXPORT(SumSquaresShapeImpl);

int64_t DispatchStepBlock(const AdamSegment& segment, int64_t begin, int64_t len) {
  return HWY_DYNAMIC_DISPATCH(StepBlock)(segment, begin, len);
}
GradStats DispatchStatsBlock(const GradSegment& segment, int64_t begin, int64_t len) {
  return HWY_DYNAMIC_DISPATCH(StatsBlock)(segment, begin, len);
}
const char* DispatchTargetName() { return HWY_DYNAMIC_DISPATCH(TargetNameImpl)(); }
CpuSumSquaresShape DispatchSumSquaresShape() { return HWY_DYNAMIC_DISPATCH(SumSquaresShapeImpl)(); }

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

CpuSumSquaresShape CpuAdamSumSquaresShape() { return cpu_adam_internal::DispatchSumSquaresShape(); }

}  // namespace ps
#endif  // HWY_ONCE
