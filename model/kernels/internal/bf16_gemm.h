// bf16 GEMMs with f32 accumulation for the CPU kernels of model/kernels (the bf16 paths of
// matmul.h and lm_head_cross_entropy.h):
//   C[m, n] (f32) = op(A)[m, k] op(B)[k, n]   (+ C when accumulating)
// with A and B bf16 bit patterns (uint16_t), row-major with leading dimensions lda, ldb, ldc, and
// op(X) = X or X^T, as kernels_internal::Gemm (internal/blas.h) for f32.
//
// Backends (--bf16_gemm=auto|onednn|fallback, or SetBf16GemmBackendForTest):
//   - onednn: oneDNN's matmul primitive (Debian libdnnl-dev), whose brgemm kernels multiply bf16
//     pairs with the AVX512-BF16 dot-product instruction (VDPBF16PS, twice the f32 FMA rate) or
//     AMX, accumulating in f32. Used only where oneDNN runs such a kernel on this CPU: auto checks
//     the CPU's ISA through oneDNN and that the primitive it builds is a native bf16 one.
//   - fallback: both operands widened to f32 (exactly: bf16 -> f32 is exact) and multiplied by
//     OpenBLAS sgemm. The same products as onednn (a product of two bf16 values is exact in f32);
//     only the order of the f32 sums differs. Used by auto on CPUs without AVX512-BF16.
// auto picks onednn when available, else the fallback. --bf16_gemm=onednn on a CPU without it is
// an error (FailedPrecondition naming the flag), not a silent slow path.
//
// Threading and determinism (onednn): the output is cut into a grid of blocks fixed by the shape
// (never by the thread count), each computed by one serial oneDNN call (OpenMP threads set to 1 in
// the calling thread: no OpenMP worker threads spin next to ours) on `pool`, so results are
// bit-identical for any pool size, including none. oneDNN primitives are created once per block
// shape and cached for the process. The fallback widens on `pool` and runs internal/blas.h's
// grid of single-threaded sgemm calls on `pool`, bit-identical for any pool size too.
//
// Thread safety: GemmBf16 may be called from several threads (the primitive cache is locked);
// calls must not overlap on the same output.
#ifndef PATRICKSTAR_MODEL_KERNELS_INTERNAL_BF16_GEMM_H_
#define PATRICKSTAR_MODEL_KERNELS_INTERNAL_BF16_GEMM_H_

#include <cstdint>
#include <string>

#include "absl/status/status.h"
#include "absl/strings/string_view.h"
#include "base/thread_pool.h"

namespace ps::kernels_internal {

enum class Bf16GemmBackend {
  kAuto,      // onednn where the CPU has native bf16 GEMM kernels, else fallback
  kOneDnn,    // oneDNN; FailedPrecondition where it has no native bf16 kernel
  kFallback,  // f32 sgemm on the widened operands
};

// "auto", "onednn", "fallback".
absl::string_view Bf16GemmBackendName(Bf16GemmBackend backend);
// Abseil flag support for --bf16_gemm (the names above).
bool AbslParseFlag(absl::string_view text, Bf16GemmBackend* backend, std::string* error);
std::string AbslUnparseFlag(Bf16GemmBackend backend);

// Whether oneDNN runs a native bf16 matmul kernel (AVX512-BF16 or AMX) on this CPU, and a line
// that says which (e.g. "oneDNN 2.6.3: brg:avx512_core_bf16") or why not. Computed once.
bool OneDnnBf16Available();
const std::string& OneDnnBf16Description();

// The backend the next GemmBf16 calls use: the override of SetBf16GemmBackendForTest if set, else
// --bf16_gemm; kAuto resolved. FailedPrecondition if onednn is requested but not available.
[[nodiscard]] absl::Status ResolveBf16GemmBackend(Bf16GemmBackend* resolved);

// Overrides --bf16_gemm for this process (tests and benchmarks); kAuto restores the flag's value.
void SetBf16GemmBackendForTest(Bf16GemmBackend backend);

struct Bf16GemmArgs {
  bool trans_a = false;
  bool trans_b = false;
  int64_t m = 0, n = 0, k = 0;
  const uint16_t* a = nullptr;  // op(A) [m, k]: A is [m, k] (lda >= k), or [k, m] (lda >= m)
  int64_t lda = 0;
  const uint16_t* b = nullptr;  // op(B) [k, n]: B is [k, n] (ldb >= n), or [n, k] (ldb >= k)
  int64_t ldb = 0;
  bool accumulate = false;  // C += op(A) op(B) instead of C = op(A) op(B)
  float* c = nullptr;       // [m, n], ldc >= n
  int64_t ldc = 0;
};

// dst[i] = src[i] rounded to bf16 (round-to-nearest-even, memory/convert.h), for i < n; in fixed
// ranges on `pool` (may be null).
void RoundToBf16(const float* src, uint16_t* dst, int64_t n, ThreadPool* pool);

// dst = src^T rounded to bf16 as RoundToBf16 does: src is [rows, cols] row-major, dst
// [cols, rows] row-major (dst[c * rows + r] = bf16(src[r * cols + c])), in fixed tiles on `pool`.
// The GEMM kernels use it to hand oneDNN a transposed operand in plain layout (a transposed A is
// otherwise copied again by every output block).
void RoundToBf16Transposed(const float* src, int64_t rows, int64_t cols, uint16_t* dst,
                           ThreadPool* pool);

// --- The fallback's pieces, for kernels that call sgemm themselves ------------------------------
// Without native bf16 GEMMs (the fallback), a kernel whose operands start as f32 (activations,
// gradients) need not round them to bf16 and widen them back, nor transpose them for oneDNN: it
// rounds them once into f32 values that are bf16 values (RoundToBf16Values), widens its bf16
// operands (WidenBf16) and calls Gemm (internal/blas.h) with the transposes sgemm reads itself.
// The products are those of GemmBf16's fallback (every operand a bf16 value, f32 sums).

// dst[i] = bf16(src[i]) as an f32 (exactly the value RoundToBf16 stores, widened), in fixed ranges
// on `pool` (may be null). dst may equal src.
void RoundToBf16Values(const float* src, float* dst, int64_t n, ThreadPool* pool);

// dst[i] = src[i] widened to f32 (exact), in fixed ranges on `pool` (may be null).
void WidenBf16(const uint16_t* src, float* dst, int64_t n, ThreadPool* pool);

// Per-thread f32 scratch for the fallback's operands: slot 0, 1 or 2 holds at least `elems`
// floats (contents unspecified), grown when asked for more and kept until the thread ends (so a
// training step's GEMMs fault in no fresh pages). GemmBf16's fallback uses slots 0 and 1: a kernel
// that fills slots itself must not call GemmBf16 while it still reads them.
inline constexpr int kFallbackScratchSlots = 3;
float* FallbackScratch(int slot, int64_t elems);

// The LM heads' fallback GEMMs over one tile (lm_head_cross_entropy.cc, vocab_blocks.cc): `hr` is
// the tile's R rows of h rounded to bf16 values, `wf` its Vt weight rows widened, both with C
// columns (row-major, packed).
//   FallbackTileLogits: z[R, Vt] = hr wf^T (packed with row stride Vt).
//   FallbackTileGrads:  dzr[R, Vt] = dz rounded to bf16 values; dh[R, C] += dzr wf;
//                       dw[Vt, C] += dzr^T hr.
void FallbackTileLogits(const float* hr, const float* wf, int64_t R, int64_t Vt, int64_t C,
                        float* z, ThreadPool* pool);
void FallbackTileGrads(const float* hr, const float* wf, const float* dz, float* dzr, int64_t R,
                       int64_t Vt, int64_t C, float* dh, float* dw, ThreadPool* pool);

// Runs the GEMM on the resolved backend; `pool` (may be null) runs the onednn blocks.
// REQUIRES: m, n, k >= 1; the buffers valid for their extents; C does not overlap A or B.
// Errors: FailedPrecondition from ResolveBf16GemmBackend; Internal if oneDNN fails (its status
// named). Nothing is written on an error before the first block runs.
[[nodiscard]] absl::Status GemmBf16(const Bf16GemmArgs& args, ThreadPool* pool);

}  // namespace ps::kernels_internal

#endif  // PATRICKSTAR_MODEL_KERNELS_INTERNAL_BF16_GEMM_H_
