// The 4-bit weight codec of QLoRA, exactly as bitsandbytes stores it (quantize_4bit /
// dequantize_4bit, blocksize 64, quant_type "nf4" or "fp4", optionally with compress_statistics,
// i.e. double quantization of the absmax values): what a frozen base model's linear layers become
// when they are loaded in 4 bits, and what transformers + bitsandbytes save in a pre-quantized
// checkpoint (`weight` [uint8 codes], `weight.absmax`, `weight.nested_absmax`,
// `weight.nested_quant_map`, `weight.quant_map`, `weight.quant_state.bitsandbytes__nf4`).
//
// The arithmetic is model/kernels/nf4_math.h's (shared with the CUDA kernels); a tensor is its
// flattened values, cut into blocks of 64 (the last may be shorter), two codes per byte with the
// first value in the high nibble. Bit for bit what bitsandbytes' CUDA kernels compute, with two
// documented exceptions that no CPU can reproduce: bitsandbytes builds them with --use_fast_math,
// so there (1) 1/absmax is an approximate reciprocal (within 1 ulp: a value within an ulp of a
// decision threshold can take the neighbouring code) and (2) denormal inputs and products are
// flushed to zero. Here both are IEEE (exact reciprocal, denormals kept). Dequantization given
// codes and absmax is a single float32 product either way, so it matches bitsandbytes' for every
// checkpoint whose absmax values are normal numbers (all real ones). The double-quantization
// offset is the mean of the absmax values computed in double and rounded to float (torch sums in
// float32 on the GPU: its offset can differ in the last bit; an imported checkpoint brings its
// own).
//
// NaN and Inf inputs are refused (InvalidArgument naming the element): bitsandbytes has no defined
// result for them (its block max ignores NaN and an Inf absmax zeroes the block), and a
// non-finite weight is a broken checkpoint.
//
// Quantization runs once, at load, and is scalar; dequantization is what every GEMM over a 4-bit
// weight runs and is SIMD (Highway, dispatched at run time; every target gives the same bits, as
// each output is one float32 product).
#ifndef PATRICKSTAR_MODEL_KERNELS_NF4_H_
#define PATRICKSTAR_MODEL_KERNELS_NF4_H_

#include <cstdint>

#include "absl/status/status.h"
#include "absl/types/span.h"
#include "base/thread_pool.h"
#include "memory/dtype.h"
#include "model/kernels/nf4_math.h"

namespace ps {

// "nf4", "fp4".
const char* Quant4TypeName(Quant4Type type);

// Sizes of a 4-bit tensor of num_elems values.
constexpr int64_t Quant4CodeBytes(int64_t num_elems) { return (num_elems + 1) / 2; }
constexpr int64_t Quant4NumBlocks(int64_t num_elems) {
  return (num_elems + kQuant4BlockElems - 1) / kQuant4BlockElems;
}
// Blocks of the nested quantization of Quant4NumBlocks absmax values.
constexpr int64_t Quant4NestedNumBlocks(int64_t num_blocks) {
  return (num_blocks + kQuant4NestedBlockElems - 1) / kQuant4NestedBlockElems;
}
// Bytes of the quantized state: codes plus float32 absmax, or codes plus one byte per block, one
// float per nested block and the offset (double quantization).
constexpr int64_t Quant4StateBytes(int64_t num_elems, bool nested) {
  const int64_t blocks = Quant4NumBlocks(num_elems);
  return Quant4CodeBytes(num_elems) +
         (nested ? blocks + 4 * Quant4NestedNumBlocks(blocks) + 4 : 4 * blocks);
}

// The 256 values of bitsandbytes' create_dynamic_map() (the nested absmax's code book; what a
// checkpoint stores as `nested_quant_map`).
const float* DynamicMap8();
// The 16 levels of a 4-bit type (what a checkpoint stores as `quant_map`, up to FP4's scale: its
// quant_map is the FP4 values / 12, the levels here are the CUDA kernel's table).
const float* Quant4Levels(Quant4Type type);

// A quantized tensor as views of caller-owned memory: codes, and either plain absmax or the nested
// state. Pointers are host memory here (the Kernels GEMMs take device memory).
struct Quant4Tensor {
  Quant4Type type = Quant4Type::kNf4;
  int64_t num_elems = 0;
  const uint8_t* codes = nullptr;  // Quant4CodeBytes(num_elems) bytes
  // Plain: Quant4NumBlocks(num_elems) float32 absmax values; null when nested.
  const float* absmax = nullptr;
  // Nested (double quantization), used when absmax is null: one code per block,
  // Quant4NestedNumBlocks(blocks) float32 scales, and the offset added back.
  const uint8_t* nested_codes = nullptr;
  const float* nested_absmax = nullptr;
  float nested_offset = 0.0f;

  bool nested() const { return absmax == nullptr; }
};

// InvalidArgument unless num_elems >= 0 and the pointers the form needs are non-null.
[[nodiscard]] absl::Status CheckQuant4Tensor(const char* op, const Quant4Tensor& t);

// Quantizes num_elems values of src_dtype (f32, bf16 or f16) at src into codes
// (Quant4CodeBytes) and absmax (Quant4NumBlocks), in parallel over blocks on `pool` (may be null;
// the result does not depend on it). InvalidArgument on sizes that do not match, a null src with
// num_elems > 0, or a NaN/Inf value (naming its index); nothing useful is written then.
[[nodiscard]] absl::Status Quantize4Bit(Quant4Type type, DType src_dtype, const void* src,
                                        int64_t num_elems, absl::Span<uint8_t> codes,
                                        absl::Span<float> absmax, ThreadPool* pool);

// Double quantization of the absmax values (quantize_4bit's compress_statistics): offset = their
// mean, then the 8-bit dynamic blockwise quantization of absmax - offset in blocks of 256.
// nested_codes: absmax.size() bytes; nested_absmax: Quant4NestedNumBlocks(absmax.size()).
// InvalidArgument on sizes that do not match or a non-finite absmax.
[[nodiscard]] absl::Status QuantizeAbsmaxNested(absl::Span<const float> absmax,
                                                absl::Span<uint8_t> nested_codes,
                                                absl::Span<float> nested_absmax, float* offset);

// absmax[b] = DynamicMap8()[nested_codes[b]] * nested_absmax[b / 256] + offset (nf4_math.h).
[[nodiscard]] absl::Status DequantizeAbsmaxNested(absl::Span<const uint8_t> nested_codes,
                                                  absl::Span<const float> nested_absmax,
                                                  float offset, absl::Span<float> absmax);

// Values [begin, begin + count) of the flattened tensor, dequantized into dst as dst_dtype (f32:
// level * absmax; bf16: that product rounded to nearest even, as bitsandbytes' bf16 output; f16
// likewise). begin may be any element (odd ones start in a low nibble). InvalidArgument on a bad
// tensor or range or a null dst. Single-threaded: callers parallelize over ranges.
[[nodiscard]] absl::Status Dequantize4Bit(const Quant4Tensor& t, int64_t begin, int64_t count,
                                          DType dst_dtype, void* dst);

namespace kernels_internal {
// The dequantization loop on resolved block scales: dst[i] = levels[code(begin + i)] *
// block_absmax[(begin + i) / 64 - begin / 64] for i < count. Highway, dispatched (nf4.cc).
void Dequantize4BitF32(const float* levels, const uint8_t* codes, const float* block_absmax,
                       int64_t begin, int64_t count, float* dst);
}  // namespace kernels_internal

}  // namespace ps

#endif  // PATRICKSTAR_MODEL_KERNELS_NF4_H_
