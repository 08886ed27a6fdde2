// model/kernels/nf4.h. The dequantization loop is Highway code compiled once per SIMD target
// (hwy/foreach_target.h re-includes this file, as in hwy/examples/skeleton.cc); the rest, in the
// HWY_ONCE section, is scalar. Compiled with -ffp-contract=off (nf4_math.h's nested absmax is a
// product then a sum, never a fused multiply-add).
#include "model/kernels/nf4.h"

#include <algorithm>
#include <cmath>
#include <cstddef>
#include <cstdint>

#undef HWY_TARGET_INCLUDE
#define HWY_TARGET_INCLUDE "model/kernels/nf4.cc"
#include "hwy/foreach_target.h"  // IWYU pragma: keep
#include "hwy/highway.h"

HWY_BEFORE_NAMESPACE();
namespace ps::kernels_internal {
namespace HWY_NAMESPACE {
namespace hn = hwy::HWY_NAMESPACE;

using DF = hn::ScalableTag<float>;
using DU = hn::RebindToUnsigned<DF>;
using DI = hn::RebindToSigned<DF>;
using D8 = hn::Rebind<uint8_t, DF>;

// levels[idx] for idx in [0, 16): one permute where a vector holds 16 floats (AVX-512), two and a
// select where it holds 8 (AVX2), a gather otherwise (SSE, EMU128, SCALAR).
HWY_INLINE hn::Vec<DF> Lookup16(DF df, const float* HWY_RESTRICT levels, hn::Vec<DU> idx) {
  const DI di;
  constexpr size_t kMax = hn::MaxLanes(DF());
  if constexpr (kMax == 16) {
    return hn::TableLookupLanes(hn::LoadU(df, levels),
                                hn::IndicesFromVec(df, hn::BitCast(di, idx)));
  } else if constexpr (kMax == 8) {
    const DU du;
    const auto low = hn::IndicesFromVec(df, hn::BitCast(di, hn::And(idx, hn::Set(du, 7u))));
    const hn::Vec<DF> lo = hn::TableLookupLanes(hn::LoadU(df, levels), low);
    const hn::Vec<DF> hi = hn::TableLookupLanes(hn::LoadU(df, levels + 8), low);
    return hn::IfThenElse(hn::RebindMask(df, hn::Gt(idx, hn::Set(du, 7u))), hi, lo);
  } else {
    return hn::GatherIndex(df, levels, hn::BitCast(di, idx));
  }
}

void Dequantize4BitF32Impl(const float* HWY_RESTRICT levels, const uint8_t* HWY_RESTRICT codes,
                           const float* HWY_RESTRICT block_absmax, int64_t begin, int64_t count,
                           float* HWY_RESTRICT dst) {
  const DF df;
  const DU du;
  const D8 d8;
  const size_t N = hn::Lanes(df);
  const int64_t first_block = begin / kQuant4BlockElems;
  auto code_at = [&](int64_t e) {
    const uint8_t byte = codes[e >> 1];
    return (e & 1) ? (byte & 0x0F) : (byte >> 4);
  };
  int64_t e = begin;
  const int64_t end = begin + count;
  while (e < end) {
    const int64_t block = e / kQuant4BlockElems;
    const int64_t block_end = std::min(end, (block + 1) * kQuant4BlockElems);
    const float a = block_absmax[block - first_block];
    if (e & 1) {  // a low nibble first
      dst[e - begin] = levels[code_at(e)] * a;
      ++e;
    }
    // Whole bytes: N bytes give 2N values, the high nibbles to even positions.
    const hn::Vec<DF> va = hn::Set(df, a);
    const hn::Vec<DU> mask = hn::Set(du, 0x0Fu);
    while (e + 2 * static_cast<int64_t>(N) <= block_end) {
      const hn::Vec<DU> bytes = hn::PromoteTo(du, hn::LoadU(d8, codes + (e >> 1)));
      const hn::Vec<DF> first = hn::Mul(Lookup16(df, levels, hn::ShiftRight<4>(bytes)), va);
      const hn::Vec<DF> second = hn::Mul(Lookup16(df, levels, hn::And(bytes, mask)), va);
      hn::StoreInterleaved2(first, second, df, dst + (e - begin));
      e += 2 * static_cast<int64_t>(N);
    }
    for (; e < block_end; ++e) dst[e - begin] = levels[code_at(e)] * a;
  }
}

}  // namespace HWY_NAMESPACE
}  // namespace ps::kernels_internal
HWY_AFTER_NAMESPACE();

#if HWY_ONCE
#include <cstring>

#include "absl/strings/str_cat.h"
#include "base/status_macros.h"
#include "memory/convert.h"
#include "memory/dtype_math.h"
#include "model/kernels/internal/kernel_util.h"

namespace ps {
namespace kernels_internal {

HWY_EXPORT(Dequantize4BitF32Impl);

void Dequantize4BitF32(const float* levels, const uint8_t* codes, const float* block_absmax,
                       int64_t begin, int64_t count, float* dst) {
  HWY_DYNAMIC_DISPATCH(Dequantize4BitF32Impl)(levels, codes, block_absmax, begin, count, dst);
}

}  // namespace kernels_internal

namespace {

constexpr float kNf4Levels[16] = {PS_NF4_LEVELS};
constexpr float kFp4Levels[16] = {PS_FP4_LEVELS};
constexpr float kDynamicMap[256] = {PS_DYNAMIC_MAP_8BIT};

float ReadValue(DType dtype, const void* src, int64_t i) {
  switch (dtype) {
    case DType::kF32:
      return static_cast<const float*>(src)[i];
    case DType::kBF16:
      return BFloat16BitsToFloat(static_cast<const uint16_t*>(src)[i]);
    case DType::kF16:
      return HalfBitsToFloat(static_cast<const uint16_t*>(src)[i]);
  }
  return 0.0f;
}

absl::Status CheckSize(const char* op, const char* name, int64_t got, int64_t want,
                       const char* formula) {
  if (got == want) return absl::OkStatus();
  return absl::InvalidArgumentError(
      absl::StrCat(op, ": ", name, " has ", got, " elements, expected ", want, " (", formula, ")"));
}

}  // namespace

const char* Quant4TypeName(Quant4Type type) { return type == Quant4Type::kNf4 ? "nf4" : "fp4"; }

const float* DynamicMap8() { return kDynamicMap; }

const float* Quant4Levels(Quant4Type type) {
  return type == Quant4Type::kNf4 ? kNf4Levels : kFp4Levels;
}

absl::Status CheckQuant4Tensor(const char* op, const Quant4Tensor& t) {
  if (t.type != Quant4Type::kNf4 && t.type != Quant4Type::kFp4) {
    return absl::InvalidArgumentError(
        absl::StrCat(op, ": unknown 4-bit type ", static_cast<int>(t.type)));
  }
  if (t.num_elems < 0) {
    return absl::InvalidArgumentError(absl::StrCat(op, ": num_elems ", t.num_elems, " < 0"));
  }
  if (t.num_elems == 0) return absl::OkStatus();
  if (t.codes == nullptr) return absl::InvalidArgumentError(absl::StrCat(op, ": codes is null"));
  if (t.nested() && (t.nested_codes == nullptr || t.nested_absmax == nullptr)) {
    return absl::InvalidArgumentError(absl::StrCat(
        op, ": neither absmax nor the nested state (nested_codes, nested_absmax) is given"));
  }
  if (t.nested() && !std::isfinite(t.nested_offset)) {
    return absl::InvalidArgumentError(
        absl::StrCat(op, ": nested_offset ", t.nested_offset, " is not finite"));
  }
  return absl::OkStatus();
}

absl::Status Quantize4Bit(Quant4Type type, DType src_dtype, const void* src, int64_t num_elems,
                          absl::Span<uint8_t> codes, absl::Span<float> absmax, ThreadPool* pool) {
  constexpr char kOp[] = "Quantize4Bit";
  if (num_elems < 0) {
    return absl::InvalidArgumentError(absl::StrCat(kOp, ": num_elems ", num_elems, " < 0"));
  }
  if (type != Quant4Type::kNf4 && type != Quant4Type::kFp4) {
    return absl::InvalidArgumentError(absl::StrCat(kOp, ": unknown 4-bit type"));
  }
  if (src_dtype != DType::kF32 && src_dtype != DType::kBF16 && src_dtype != DType::kF16) {
    return absl::InvalidArgumentError(absl::StrCat(kOp, ": unknown source dtype"));
  }
  RETURN_IF_ERROR(CheckSize(kOp, "codes", static_cast<int64_t>(codes.size()),
                            Quant4CodeBytes(num_elems), "(num_elems + 1) / 2"));
  RETURN_IF_ERROR(CheckSize(kOp, "absmax", static_cast<int64_t>(absmax.size()),
                            Quant4NumBlocks(num_elems), "ceil(num_elems / 64)"));
  if (num_elems == 0) return absl::OkStatus();
  if (src == nullptr) return absl::InvalidArgumentError(absl::StrCat(kOp, ": src is null"));
  for (int64_t i = 0; i < num_elems; ++i) {
    const float v = ReadValue(src_dtype, src, i);
    if (!std::isfinite(v)) {
      return absl::InvalidArgumentError(
          absl::StrCat(kOp, ": value ", i, " of ", num_elems, " is ", v,
                       "; a 4-bit weight must be finite (is the checkpoint broken?)"));
    }
  }
  const int64_t blocks = Quant4NumBlocks(num_elems);
  constexpr int64_t kBlocksPerTask = 256;
  kernels_internal::ParallelFor(
      pool, kernels_internal::NumTasks(blocks, kBlocksPerTask), [&](int64_t task) {
        const int64_t b_end = std::min(blocks, (task + 1) * kBlocksPerTask);
        for (int64_t b = task * kBlocksPerTask; b < b_end; ++b) {
          const int64_t e0 = b * kQuant4BlockElems;
          const int64_t e1 = std::min(num_elems, e0 + kQuant4BlockElems);
          float m = 0.0f;  // the padding's |0| is in bitsandbytes' max too
          for (int64_t e = e0; e < e1; ++e)
            m = std::max(m, std::fabs(ReadValue(src_dtype, src, e)));
          absmax[b] = m;
          const float inv = 1.0f / m;  // a zero block: inf, and 0 * inf = NaN, as the kernel
          for (int64_t e = e0; e < e1; e += 2) {
            const uint8_t hi = Quantize4(type, ReadValue(src_dtype, src, e) * inv);
            // An odd count's last low nibble is the code of the kernel's zero padding.
            const uint8_t lo =
                Quantize4(type, (e + 1 < e1 ? ReadValue(src_dtype, src, e + 1) : 0.0f) * inv);
            codes[e >> 1] = static_cast<uint8_t>(hi << 4 | lo);
          }
        }
      });
  return absl::OkStatus();
}

absl::Status QuantizeAbsmaxNested(absl::Span<const float> absmax, absl::Span<uint8_t> nested_codes,
                                  absl::Span<float> nested_absmax, float* offset) {
  constexpr char kOp[] = "QuantizeAbsmaxNested";
  const int64_t n = static_cast<int64_t>(absmax.size());
  RETURN_IF_ERROR(CheckSize(kOp, "nested_codes", static_cast<int64_t>(nested_codes.size()), n,
                            "one per absmax"));
  RETURN_IF_ERROR(CheckSize(kOp, "nested_absmax", static_cast<int64_t>(nested_absmax.size()),
                            Quant4NestedNumBlocks(n), "ceil(absmax / 256)"));
  if (offset == nullptr) return absl::InvalidArgumentError(absl::StrCat(kOp, ": offset is null"));
  double sum = 0.0;
  for (int64_t i = 0; i < n; ++i) {
    if (!std::isfinite(absmax[i])) {
      return absl::InvalidArgumentError(
          absl::StrCat(kOp, ": absmax ", i, " is ", absmax[i], ", not finite"));
    }
    sum += absmax[i];
  }
  const float mean = n == 0 ? 0.0f : static_cast<float>(sum / static_cast<double>(n));
  *offset = mean;
  for (int64_t b = 0; b < Quant4NestedNumBlocks(n); ++b) {
    const int64_t i0 = b * kQuant4NestedBlockElems;
    const int64_t i1 = std::min(n, i0 + kQuant4NestedBlockElems);
    float m = 0.0f;
    for (int64_t i = i0; i < i1; ++i) m = std::max(m, std::fabs(absmax[i] - mean));
    nested_absmax[b] = m;
    const float inv = 1.0f / m;
    for (int64_t i = i0; i < i1; ++i) {
      nested_codes[i] = QuantizeDynamic8(kDynamicMap, (absmax[i] - mean) * inv);
    }
  }
  return absl::OkStatus();
}

absl::Status DequantizeAbsmaxNested(absl::Span<const uint8_t> nested_codes,
                                    absl::Span<const float> nested_absmax, float offset,
                                    absl::Span<float> absmax) {
  constexpr char kOp[] = "DequantizeAbsmaxNested";
  const int64_t n = static_cast<int64_t>(nested_codes.size());
  RETURN_IF_ERROR(
      CheckSize(kOp, "absmax", static_cast<int64_t>(absmax.size()), n, "one per nested code"));
  RETURN_IF_ERROR(CheckSize(kOp, "nested_absmax", static_cast<int64_t>(nested_absmax.size()),
                            Quant4NestedNumBlocks(n), "ceil(codes / 256)"));
  for (int64_t i = 0; i < n; ++i) {
    absmax[i] = DequantizeNestedAbsmax(kDynamicMap, nested_codes[i],
                                       nested_absmax[i / kQuant4NestedBlockElems], offset);
  }
  return absl::OkStatus();
}

absl::Status Dequantize4Bit(const Quant4Tensor& t, int64_t begin, int64_t count, DType dst_dtype,
                            void* dst) {
  constexpr char kOp[] = "Dequantize4Bit";
  RETURN_IF_ERROR(CheckQuant4Tensor(kOp, t));
  if (begin < 0 || count < 0 || begin > t.num_elems || count > t.num_elems - begin) {
    return absl::InvalidArgumentError(absl::StrCat(kOp, ": range [", begin, ", ", begin, " + ",
                                                   count, ") is outside the tensor's ", t.num_elems,
                                                   " values"));
  }
  if (dst_dtype != DType::kF32 && dst_dtype != DType::kBF16 && dst_dtype != DType::kF16) {
    return absl::InvalidArgumentError(absl::StrCat(kOp, ": unknown destination dtype"));
  }
  if (count == 0) return absl::OkStatus();
  if (dst == nullptr) return absl::InvalidArgumentError(absl::StrCat(kOp, ": dst is null"));
  const float* levels = Quant4Levels(t.type);
  // Chunks of whole blocks (aligned to the tensor's blocks), their scales resolved into a small
  // buffer (nested: dequantized here), 16-bit outputs converted from an f32 buffer.
  constexpr int64_t kChunkBlocks = 32;
  constexpr int64_t kChunkElems = kChunkBlocks * kQuant4BlockElems;
  float scales[kChunkBlocks + 1];
  alignas(64) float buffer[kChunkElems];
  int64_t e = begin;
  const int64_t end = begin + count;
  while (e < end) {
    const int64_t chunk_end = std::min(end, (e / kChunkElems + 1) * kChunkElems);
    const int64_t b0 = e / kQuant4BlockElems, b1 = (chunk_end - 1) / kQuant4BlockElems + 1;
    const float* block_absmax = t.absmax + b0;
    if (t.nested()) {
      for (int64_t b = b0; b < b1; ++b) {
        scales[b - b0] =
            DequantizeNestedAbsmax(kDynamicMap, t.nested_codes[b],
                                   t.nested_absmax[b / kQuant4NestedBlockElems], t.nested_offset);
      }
      block_absmax = scales;
    }
    const int64_t n = chunk_end - e;
    if (dst_dtype == DType::kF32) {
      kernels_internal::Dequantize4BitF32(levels, t.codes, block_absmax, e, n,
                                          static_cast<float*>(dst) + (e - begin));
    } else {
      kernels_internal::Dequantize4BitF32(levels, t.codes, block_absmax, e, n, buffer);
      uint16_t* out = static_cast<uint16_t*>(dst) + (e - begin);
      if (dst_dtype == DType::kBF16) {
        ConvertF32ToBF16(buffer, out, n);
      } else {
        ConvertF32ToF16(buffer, out, n);
      }
    }
    e = chunk_end;
  }
  return absl::OkStatus();
}

}  // namespace ps
#endif  // HWY_ONCE
