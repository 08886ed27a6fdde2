#include "model/kernels/cpu_kernels.h"

#include <algorithm>
#include <cstdint>
#include <cstring>
#include <memory>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "absl/types/span.h"
#include "base/status_macros.h"
#include "memory/convert.h"
#include "memory/cpu_backend.h"
#include "model/kernels/embedding.h"
#include "model/kernels/encoder.h"
#include "model/kernels/gelu.h"
#include "model/kernels/gqa_attention.h"
#include "model/kernels/internal/bf16_gemm.h"
#include "model/kernels/internal/blas.h"
#include "model/kernels/internal/kernel_util.h"
#include "model/kernels/layernorm.h"
#include "model/kernels/linear.h"
#include "model/kernels/lm_head_cross_entropy.h"
#include "model/kernels/lora.h"
#include "model/kernels/matmul.h"
#include "model/kernels/nf4.h"
#include "model/kernels/nf4_linear.h"
#include "model/kernels/residual.h"
#include "model/kernels/rmsnorm.h"
#include "model/kernels/rope.h"
#include "model/kernels/swiglu.h"
#include "model/kernels/vocab_blocks.h"

namespace ps {
namespace {

// Every kernel below is a lambda that captures its arguments by value (shapes, device pointers,
// the pool) and nothing of the CpuKernels object, so the object may go away while it is queued.
template <typename Fn>
absl::Status Enqueue(Stream& stream, Fn fn) {
  return LaunchCheckedHostFunc(stream, std::move(fn));
}

absl::Span<float> F32Workspace(void* workspace, int64_t workspace_bytes) {
  return absl::MakeSpan(static_cast<float*>(workspace),
                        static_cast<size_t>(workspace_bytes / static_cast<int64_t>(sizeof(float))));
}

template <typename T>
absl::Span<const T> In(const T* p, int64_t n) {
  return absl::MakeConstSpan(p, static_cast<size_t>(n));
}
template <typename T>
absl::Span<T> Out(T* p, int64_t n) {
  return absl::MakeSpan(p, static_cast<size_t>(n));
}
// An optional output: empty (the kernel skips it) when p is null.
// An optional input: empty when p is null.
template <typename T>
absl::Span<const T> OptIn(const T* p, int64_t n) {
  return p == nullptr ? absl::Span<const T>() : absl::MakeConstSpan(p, static_cast<size_t>(n));
}
template <typename T>
absl::Span<T> OptOut(T* p, int64_t n) {
  return p == nullptr ? absl::Span<T>() : absl::MakeSpan(p, static_cast<size_t>(n));
}

// Rows and columns of a GEMM operand as stored.
struct Stored {
  int64_t rows, cols;
};
Stored StoredA(const GemmShape& s) { return s.trans_a ? Stored{s.k, s.m} : Stored{s.m, s.k}; }
Stored StoredB(const GemmShape& s) { return s.trans_b ? Stored{s.n, s.k} : Stored{s.k, s.n}; }

// Widens a stored 16-bit matrix (rows x cols, `ld` apart) into a packed f32 one.
void Widen(DType dtype, const void* src, Stored m, int64_t ld, float* dst) {
  const auto* s = static_cast<const uint16_t*>(src);
  for (int64_t r = 0; r < m.rows; ++r) {
    if (dtype == DType::kF16) {
      ConvertF16ToF32(s + r * ld, dst + r * m.cols, m.cols);
    } else {
      ConvertBF16ToF32(s + r * ld, dst + r * m.cols, m.cols);
    }
  }
}

}  // namespace

absl::StatusOr<std::unique_ptr<CpuKernels>> CpuKernels::Create(Backend* backend,
                                                               const CpuKernelsOptions& options) {
  if (backend == nullptr) return absl::InvalidArgumentError("CpuKernels: the backend is null");
  if (backend->name() != "cpu") {
    return absl::InvalidArgumentError(
        absl::StrCat("CpuKernels: run on the cpu backend (the emulated accelerator), not on the ",
                     backend->name(), " backend; use CreateKernels to pick the implementation"));
  }
  return std::unique_ptr<CpuKernels>(new CpuKernels(backend, options));
}

absl::Status CpuKernels::CheckBuffer(absl::string_view op, const BufferArg& buffer) {
  return CheckCpuDeviceRange(*backend_, buffer.ptr, buffer.bytes,
                             absl::StrCat(op, ": ", buffer.name));
}

// --- Memory and GEMM
// ------------------------------------------------------------------------------

absl::Status CpuKernels::DoZero(Stream& stream, void* dst, int64_t bytes) {
  return stream.MemsetAsync(dst, 0, bytes);
}

absl::Status CpuKernels::DoConvert(Stream& stream, DType src_dtype, const void* src,
                                   DType dst_dtype, void* dst, int64_t n) {
  return Enqueue(stream, [=] { return ::ps::Convert(src_dtype, src, dst_dtype, dst, n); });
}

absl::Status CpuKernels::DoGemm(Stream& stream, const GemmShape& s, float alpha, const void* a,
                                const void* b, float beta, float* c, void* workspace, int64_t) {
  ThreadPool* pool = pool_;
  return Enqueue(stream, [=]() -> absl::Status {
    if (s.ab_dtype == DType::kF32) {
      kernels_internal::Gemm(s.trans_a, s.trans_b, s.m, s.n, s.k, alpha,
                             static_cast<const float*>(a), s.lda, static_cast<const float*>(b),
                             s.ldb, beta, c, s.ldc, pool);
      return absl::OkStatus();
    }
    if (s.ab_dtype == DType::kBF16) {
      // bf16 operands: the bf16 GEMM of the model's kernels (internal/bf16_gemm.h: oneDNN's
      // AVX512-BF16 kernels where the CPU has them, else sgemm on the widened operands), f32
      // accumulation, bit-identical for any pool size.
      kernels_internal::Bf16GemmArgs g;
      g.trans_a = s.trans_a;
      g.trans_b = s.trans_b;
      g.m = s.m, g.n = s.n, g.k = s.k;
      g.a = static_cast<const uint16_t*>(a);
      g.lda = s.lda;
      g.b = static_cast<const uint16_t*>(b);
      g.ldb = s.ldb;
      if (alpha == 1.0f && (beta == 0.0f || beta == 1.0f)) {
        g.accumulate = beta == 1.0f;
        g.c = c;
        g.ldc = s.ldc;
        return kernels_internal::GemmBf16(g, pool);
      }
      // Other alpha, beta: the product into the workspace, then scaled into C (C unread when
      // beta == 0).
      auto* product = static_cast<float*>(workspace);
      g.c = product;
      g.ldc = s.n;
      RETURN_IF_ERROR(kernels_internal::GemmBf16(g, pool));
      for (int64_t i = 0; i < s.m; ++i) {
        float* row = c + i * s.ldc;
        const float* p = product + i * s.n;
        if (beta == 0.0f) {
          for (int64_t j = 0; j < s.n; ++j) row[j] = alpha * p[j];
        } else {
          for (int64_t j = 0; j < s.n; ++j) row[j] = alpha * p[j] + beta * row[j];
        }
      }
      return absl::OkStatus();
    }
    // f16 operands: widen both exactly into the workspace, then multiply in f32 (the products
    // of two 16-bit values are exact in f32, so this is what a tensor core computes, summed in a
    // different order).
    const Stored sa = StoredA(s), sb = StoredB(s);
    auto* wa = static_cast<float*>(workspace);
    float* wb = wa + sa.rows * sa.cols;
    Widen(s.ab_dtype, a, sa, s.lda, wa);
    Widen(s.ab_dtype, b, sb, s.ldb, wb);
    kernels_internal::Gemm(s.trans_a, s.trans_b, s.m, s.n, s.k, alpha, wa, sa.cols, wb, sb.cols,
                           beta, c, s.ldc, pool);
    return absl::OkStatus();
  });
}

// --- GPT-2
// ----------------------------------------------------------------------------------------

absl::Status CpuKernels::DoEncoderForward(Stream& stream, const EncoderShape& s,
                                          const int32_t* tokens, const float* wte, const float* wpe,
                                          float* out) {
  ThreadPool* pool = pool_;
  return Enqueue(stream, [=] {
    const int64_t bt = s.batch * s.seq_len;
    return ::ps::EncoderForward<float>(s, In(tokens, bt), In(wte, s.vocab_size * s.channels),
                                       In(wpe, s.max_seq_len * s.channels),
                                       Out(out, bt * s.channels), pool);
  });
}

absl::Status CpuKernels::DoEncoderBackward(Stream& stream, const EncoderShape& s,
                                           const int32_t* tokens, const float* dout, float* dwte,
                                           float* dwpe) {
  ThreadPool* pool = pool_;
  return Enqueue(stream, [=] {
    const int64_t bt = s.batch * s.seq_len;
    return ::ps::EncoderBackward<float>(s, In(tokens, bt), In(dout, bt * s.channels),
                                        Out(dwte, s.vocab_size * s.channels),
                                        Out(dwpe, s.max_seq_len * s.channels), pool);
  });
}

absl::Status CpuKernels::DoLayerNormForward(Stream& stream, const LayerNormShape& s, const float* x,
                                            const float* w, const float* b, float* y, float* mean,
                                            float* rstd) {
  ThreadPool* pool = pool_;
  return Enqueue(stream, [=] {
    const int64_t nc = s.rows * s.channels;
    return ::ps::LayerNormForward<float>(s, In(x, nc), In(w, s.channels), In(b, s.channels),
                                         Out(y, nc), Out(mean, s.rows), Out(rstd, s.rows), pool);
  });
}

absl::Status CpuKernels::DoLayerNormBackward(Stream& stream, const LayerNormShape& s,
                                             const float* x, const float* w, const float* mean,
                                             const float* rstd, const float* dy, float* dx,
                                             float* dw, float* db) {
  ThreadPool* pool = pool_;
  return Enqueue(stream, [=] {
    const int64_t nc = s.rows * s.channels;
    return ::ps::LayerNormBackward<float>(s, In(x, nc), In(w, s.channels), In(mean, s.rows),
                                          In(rstd, s.rows), In(dy, nc), Out(dx, nc),
                                          OptOut(dw, s.channels), OptOut(db, s.channels), pool);
  });
}

absl::Status CpuKernels::DoMatmulForward(Stream& stream, const MatmulShape& s, const float* x,
                                         const float* w, const float* b, float* y, void*, int64_t) {
  ThreadPool* pool = pool_;
  return Enqueue(stream, [=] {
    return ::ps::MatmulForward<float>(s, In(x, s.rows * s.in_features),
                                      In(w, s.in_features * s.out_features), In(b, s.out_features),
                                      Out(y, s.rows * s.out_features), pool);
  });
}

absl::Status CpuKernels::DoMatmulBackward(Stream& stream, const MatmulShape& s, const float* x,
                                          const float* w, const float* dy, float* dx, float* dw,
                                          float* db, void*, int64_t) {
  ThreadPool* pool = pool_;
  return Enqueue(stream, [=] {
    return ::ps::MatmulBackward<float>(
        s, In(x, s.rows * s.in_features), In(w, s.in_features * s.out_features),
        In(dy, s.rows * s.out_features), Out(dx, s.rows * s.in_features),
        OptOut(dw, s.in_features * s.out_features), OptOut(db, s.out_features), pool);
  });
}

absl::Status CpuKernels::DoGeluForward(Stream& stream, int64_t n, const float* x, float* y) {
  ThreadPool* pool = pool_;
  return Enqueue(stream, [=] { return ::ps::GeluForward<float>(In(x, n), Out(y, n), pool); });
}

absl::Status CpuKernels::DoGeluBackward(Stream& stream, int64_t n, const float* x, const float* dy,
                                        float* dx) {
  ThreadPool* pool = pool_;
  return Enqueue(stream,
                 [=] { return ::ps::GeluBackward<float>(In(x, n), In(dy, n), Out(dx, n), pool); });
}

absl::Status CpuKernels::DoResidualForward(Stream& stream, int64_t n, const float* a,
                                           const float* b, float* out) {
  ThreadPool* pool = pool_;
  return Enqueue(
      stream, [=] { return ::ps::ResidualForward<float>(In(a, n), In(b, n), Out(out, n), pool); });
}

absl::Status CpuKernels::DoResidualBackward(Stream& stream, int64_t n, const float* dout, float* da,
                                            float* db) {
  ThreadPool* pool = pool_;
  return Enqueue(stream, [=] {
    return ::ps::ResidualBackward<float>(In(dout, n), Out(da, n), Out(db, n), pool);
  });
}

absl::Status CpuKernels::DoScaleInPlace(Stream& stream, int64_t n, float alpha, float* x) {
  ThreadPool* pool = pool_;
  return Enqueue(stream, [=] { return ::ps::ScaleInPlace<float>(alpha, Out(x, n), pool); });
}

absl::Status CpuKernels::DoLmHeadCrossEntropyForward(
    Stream& stream, const LmHeadCrossEntropyShape& s, const float* h, const float* wte,
    const int32_t* targets, float* lse, double* loss, void* workspace, int64_t workspace_bytes) {
  ThreadPool* pool = pool_;
  return Enqueue(stream, [=]() -> absl::Status {
    ASSIGN_OR_RETURN(const double mean_loss,
                     ::ps::LmHeadCrossEntropyForward<float>(
                         s, In(h, s.rows * s.channels), In(wte, s.vocab_size * s.channels),
                         In(targets, s.rows), Out(lse, s.rows),
                         Out(static_cast<float*>(workspace),
                             workspace_bytes / static_cast<int64_t>(sizeof(float))),
                         pool));
    *loss = mean_loss;
    return absl::OkStatus();
  });
}

absl::Status CpuKernels::DoLmHeadCrossEntropyBackward(Stream& stream,
                                                      const LmHeadCrossEntropyShape& s,
                                                      const float* h, const float* wte,
                                                      const int32_t* targets, const float* lse,
                                                      double loss_grad, float* dh, float* dwte,
                                                      void* workspace, int64_t workspace_bytes) {
  ThreadPool* pool = pool_;
  return Enqueue(stream, [=] {
    return ::ps::LmHeadCrossEntropyBackward<float>(
        s, In(h, s.rows * s.channels), In(wte, s.vocab_size * s.channels), In(targets, s.rows),
        In(lse, s.rows), loss_grad, Out(dh, s.rows * s.channels),
        Out(dwte, s.vocab_size * s.channels),
        Out(static_cast<float*>(workspace), workspace_bytes / static_cast<int64_t>(sizeof(float))),
        pool);
  });
}

// --- Llama / Qwen2 / Mistral
// ----------------------------------------------------------------------

absl::Status CpuKernels::DoRmsNormForward(Stream& stream, const RmsNormShape& s, const float* x,
                                          const float* w, float* y, float* rstd) {
  ThreadPool* pool = pool_;
  return Enqueue(stream, [=] {
    const int64_t nc = s.rows * s.channels;
    return ::ps::RmsNormForward<float>(s, In(x, nc), In(w, s.channels), Out(y, nc),
                                       Out(rstd, s.rows), pool);
  });
}

absl::Status CpuKernels::DoRmsNormBackward(Stream& stream, const RmsNormShape& s, const float* x,
                                           const float* w, const float* rstd, const float* dy,
                                           float* dx, float* dw) {
  ThreadPool* pool = pool_;
  return Enqueue(stream, [=] {
    const int64_t nc = s.rows * s.channels;
    return ::ps::RmsNormBackward<float>(s, In(x, nc), In(w, s.channels), In(rstd, s.rows),
                                        In(dy, nc), Out(dx, nc), OptOut(dw, s.channels), pool);
  });
}

absl::Status CpuKernels::DoRopeForward(Stream& stream, const RopeShape& s, const float* cos,
                                       const float* sin, float* x, const int32_t* positions) {
  ThreadPool* pool = pool_;
  return Enqueue(stream, [=] {
    const int64_t table = s.table_positions * (s.rotated() / 2);
    return ::ps::RopeForward<float>(s, In(cos, table), In(sin, table),
                                    Out(x, s.batch * s.seq_len * s.num_heads * s.head_dim), pool,
                                    OptIn(positions, s.batch * s.seq_len));
  });
}

absl::Status CpuKernels::DoRopeBackward(Stream& stream, const RopeShape& s, const float* cos,
                                        const float* sin, float* dx, const int32_t* positions) {
  ThreadPool* pool = pool_;
  return Enqueue(stream, [=] {
    const int64_t table = s.table_positions * (s.rotated() / 2);
    return ::ps::RopeBackward<float>(s, In(cos, table), In(sin, table),
                                     Out(dx, s.batch * s.seq_len * s.num_heads * s.head_dim), pool,
                                     OptIn(positions, s.batch * s.seq_len));
  });
}

absl::Status CpuKernels::DoSwiGluForward(Stream& stream, int64_t n, const float* g, const float* u,
                                         float* h, GateActivation act) {
  ThreadPool* pool = pool_;
  return Enqueue(
      stream, [=] { return ::ps::SwiGluForward<float>(In(g, n), In(u, n), Out(h, n), pool, act); });
}

absl::Status CpuKernels::DoSwiGluBackward(Stream& stream, int64_t n, const float* g, const float* u,
                                          const float* dh, float* dg, float* du,
                                          GateActivation act) {
  ThreadPool* pool = pool_;
  return Enqueue(stream, [=] {
    return ::ps::SwiGluBackward<float>(In(g, n), In(u, n), In(dh, n), Out(dg, n), Out(du, n), pool,
                                       act);
  });
}

absl::Status CpuKernels::DoGqaAttentionForward(Stream& stream, const GqaAttentionShape& s,
                                               const float* q, const float* k, const float* v,
                                               float* out, float* lse, void* workspace,
                                               int64_t workspace_bytes, const int32_t* key_start) {
  ThreadPool* pool = pool_;
  return Enqueue(stream, [=] {
    const int64_t out_elems = s.batch * s.seq_len * s.num_heads * s.head_dim;
    const int64_t q_elems = GqaAttentionQElems(s), kv_elems = GqaAttentionKvElems(s);
    return ::ps::GqaAttentionForward<float>(
        s, In(q, q_elems), In(k, kv_elems), In(v, kv_elems), Out(out, out_elems),
        Out(lse, s.batch * s.num_heads * s.seq_len),
        Out(static_cast<float*>(workspace), workspace_bytes / static_cast<int64_t>(sizeof(float))),
        pool, OptIn(key_start, s.batch * s.seq_len));
  });
}

absl::Status CpuKernels::DoGqaAttentionBackward(Stream& stream, const GqaAttentionShape& s,
                                                const float* q, const float* k, const float* v,
                                                const float* out, const float* lse,
                                                const float* dout, float* dq, float* dk, float* dv,
                                                void*, int64_t, const int32_t* key_start) {
  ThreadPool* pool = pool_;
  return Enqueue(stream, [=] {
    const int64_t out_elems = s.batch * s.seq_len * s.num_heads * s.head_dim;
    const int64_t q_elems = GqaAttentionQElems(s), kv_elems = GqaAttentionKvElems(s);
    return ::ps::GqaAttentionBackward<float>(
        s, In(q, q_elems), In(k, kv_elems), In(v, kv_elems), In(out, out_elems),
        In(lse, s.batch * s.num_heads * s.seq_len), In(dout, out_elems), Out(dq, q_elems),
        Out(dk, kv_elems), Out(dv, kv_elems), pool, OptIn(key_start, s.batch * s.seq_len));
  });
}

absl::Status CpuKernels::DoLinearForward(Stream& stream, const LinearShape& s, const float* x,
                                         const float* w, const float* b, float* y, void*, int64_t) {
  ThreadPool* pool = pool_;
  return Enqueue(stream, [=] {
    return ::ps::LinearForward<float>(s, In(x, s.rows * s.in_features),
                                      In(w, s.out_features * s.in_features),
                                      s.bias ? In(b, s.out_features) : absl::Span<const float>(),
                                      Out(y, s.rows * s.out_features), pool);
  });
}

absl::Status CpuKernels::DoLinearBackward(Stream& stream, const LinearShape& s, const float* x,
                                          const float* w, const float* dy, float* dx, float* dw,
                                          float* db, void*, int64_t) {
  ThreadPool* pool = pool_;
  return Enqueue(stream, [=] {
    return ::ps::LinearBackward<float>(
        s, In(x, s.rows * s.in_features), In(w, s.out_features * s.in_features),
        In(dy, s.rows * s.out_features), Out(dx, s.rows * s.in_features),
        OptOut(dw, s.out_features * s.in_features),
        s.bias ? OptOut(db, s.out_features) : absl::Span<float>(), pool);
  });
}

absl::Status CpuKernels::DoEmbeddingForward(Stream& stream, const EmbeddingShape& s,
                                            const int32_t* tokens, const float* wte, float* out) {
  ThreadPool* pool = pool_;
  return Enqueue(stream, [=] {
    return ::ps::EmbeddingForward<float>(s, In(tokens, s.rows), In(wte, s.vocab_size * s.channels),
                                         Out(out, s.rows * s.channels), pool);
  });
}

absl::Status CpuKernels::DoEmbeddingBackward(Stream& stream, const EmbeddingShape& s,
                                             const int32_t* tokens, const float* dout,
                                             float* dwte) {
  ThreadPool* pool = pool_;
  return Enqueue(stream, [=] {
    return ::ps::EmbeddingBackward<float>(s, In(tokens, s.rows), In(dout, s.rows * s.channels),
                                          Out(dwte, s.vocab_size * s.channels), pool);
  });
}

// --- bf16-weight GEMMs and the vocabulary blocks -------------------------------------------------

absl::Status CpuKernels::DoMatmulForwardBf16(Stream& stream, const MatmulShape& s, const float* x,
                                             const uint16_t* w, const float* b, float* y,
                                             void* workspace, int64_t workspace_bytes) {
  ThreadPool* pool = pool_;
  return Enqueue(stream, [=] {
    return ::ps::MatmulForwardBf16(s, In(x, s.rows * s.in_features),
                                   In(w, s.in_features * s.out_features), In(b, s.out_features),
                                   Out(y, s.rows * s.out_features),
                                   F32Workspace(workspace, workspace_bytes), pool);
  });
}

absl::Status CpuKernels::DoMatmulBackwardBf16(Stream& stream, const MatmulShape& s, const float* x,
                                              const uint16_t* w, const float* dy, float* dx,
                                              float* dw, float* db, void* workspace,
                                              int64_t workspace_bytes) {
  ThreadPool* pool = pool_;
  return Enqueue(stream, [=] {
    return ::ps::MatmulBackwardBf16(
        s, In(x, s.rows * s.in_features), In(w, s.in_features * s.out_features),
        In(dy, s.rows * s.out_features), Out(dx, s.rows * s.in_features),
        OptOut(dw, s.in_features * s.out_features), OptOut(db, s.out_features),
        F32Workspace(workspace, workspace_bytes), pool);
  });
}

absl::Status CpuKernels::DoEmbeddingBlockForward(Stream& stream, const VocabBlockShape& s,
                                                 const int32_t* tokens, DType block_dtype,
                                                 const void* block, float* out) {
  ThreadPool* pool = pool_;
  return Enqueue(stream, [=] {
    const int64_t block_elems = s.block_rows * s.channels;
    if (block_dtype == DType::kF32) {
      return ::ps::EmbeddingBlockForward<float>(s, In(tokens, s.rows),
                                                In(static_cast<const float*>(block), block_elems),
                                                Out(out, s.rows * s.channels), pool);
    }
    return ::ps::EmbeddingBlockForward(s, In(tokens, s.rows),
                                       Block16{static_cast<const uint16_t*>(block), block_dtype},
                                       Out(out, s.rows * s.channels), pool);
  });
}

absl::Status CpuKernels::DoScatterRowsAdd(Stream& stream, const TouchedRowsShape& s,
                                          int64_t num_tokens, const int32_t* tokens,
                                          const int32_t* slot_of_token, const float* dout,
                                          float* slot_rows) {
  ThreadPool* pool = pool_;
  return Enqueue(stream, [=] {
    return ::ps::ScatterRowsAdd<float>(
        s.channels, In(tokens, num_tokens), In(slot_of_token, s.vocab_size),
        In(dout, num_tokens * s.channels), Out(slot_rows, s.num_slots * s.channels), pool);
  });
}

namespace {
// The slot of vocabulary row `row`, or InvalidArgument (a device-data error) when it is outside
// the buffer.
absl::StatusOr<int32_t> SlotOf(absl::string_view op, const TouchedRowsShape& s,
                               const int32_t* slot_of_token, int64_t row) {
  const int32_t slot = slot_of_token[row];
  if (slot >= s.num_slots) {
    return absl::InvalidArgumentError(
        absl::StrCat(op, ": row ", row, " has slot ", slot, " but slot_rows holds ", s.num_slots));
  }
  return slot;
}
}  // namespace

absl::Status CpuKernels::DoCopyRowsToSlots(Stream& stream, const TouchedRowsShape& s,
                                           int64_t row_begin, int64_t rows,
                                           const int32_t* slot_of_token, const float* src,
                                           float* slot_rows) {
  return Enqueue(stream, [=]() -> absl::Status {
    const int64_t C = s.channels;
    for (int64_t r = 0; r < rows; ++r) {
      ASSIGN_OR_RETURN(const int32_t slot,
                       SlotOf("CopyRowsToSlots", s, slot_of_token, row_begin + r));
      if (slot < 0) continue;
      std::memcpy(slot_rows + static_cast<int64_t>(slot) * C, src + r * C,
                  static_cast<size_t>(C) * sizeof(float));
    }
    return absl::OkStatus();
  });
}

absl::Status CpuKernels::DoCopySlotsToRows(Stream& stream, const TouchedRowsShape& s,
                                           int64_t row_begin, int64_t rows,
                                           const int32_t* slot_of_token, const float* slot_rows,
                                           DType dst_dtype, void* dst) {
  return Enqueue(stream, [=]() -> absl::Status {
    const int64_t C = s.channels, row_bytes = C * SizeOf(dst_dtype);
    for (int64_t r = 0; r < rows; ++r) {
      ASSIGN_OR_RETURN(const int32_t slot,
                       SlotOf("CopySlotsToRows", s, slot_of_token, row_begin + r));
      if (slot < 0) continue;
      RETURN_IF_ERROR(::ps::Convert(DType::kF32, slot_rows + static_cast<int64_t>(slot) * C,
                                    dst_dtype, static_cast<char*>(dst) + r * row_bytes, C));
    }
    return absl::OkStatus();
  });
}

absl::Status CpuKernels::DoPositionEmbeddingForward(Stream& stream, int64_t batch, int64_t seq_len,
                                                    int64_t channels, int64_t max_seq_len,
                                                    const float* wpe, float* out,
                                                    const int32_t* positions) {
  ThreadPool* pool = pool_;
  return Enqueue(stream, [=] {
    return ::ps::PositionEmbeddingForward<float>(
        batch, seq_len, channels, In(wpe, max_seq_len * channels),
        Out(out, batch * seq_len * channels), pool, OptIn(positions, batch * seq_len));
  });
}

absl::Status CpuKernels::DoPositionEmbeddingBackward(Stream& stream, int64_t batch, int64_t seq_len,
                                                     int64_t channels, int64_t max_seq_len,
                                                     const float* dout, float* dwpe,
                                                     const int32_t* positions) {
  ThreadPool* pool = pool_;
  return Enqueue(stream, [=] {
    return ::ps::PositionEmbeddingBackward<float>(
        batch, seq_len, channels, In(dout, batch * seq_len * channels),
        Out(dwpe, max_seq_len * channels), pool, OptIn(positions, batch * seq_len));
  });
}

absl::Status CpuKernels::DoLmHeadStateInit(Stream& stream, const VocabBlockShape& s, float* state) {
  return Enqueue(stream, [=] {
    ::ps::LmHeadStateInit<float>(Out(state, LmHeadStateElems(s)));
    return absl::OkStatus();
  });
}

absl::Status CpuKernels::DoLmHeadBlockForward(Stream& stream, const VocabBlockShape& s,
                                              const float* h, DType block_dtype, const void* block,
                                              const int32_t* targets, float* state, void* workspace,
                                              int64_t workspace_bytes) {
  ThreadPool* pool = pool_;
  return Enqueue(stream, [=] {
    const int64_t block_elems = s.block_rows * s.channels;
    if (block_dtype == DType::kF32) {
      return ::ps::LmHeadBlockForward<float>(s, In(h, s.rows * s.channels),
                                             In(static_cast<const float*>(block), block_elems),
                                             In(targets, s.rows), Out(state, LmHeadStateElems(s)),
                                             F32Workspace(workspace, workspace_bytes), pool);
    }
    return ::ps::LmHeadBlockForward(s, In(h, s.rows * s.channels),
                                    Block16{static_cast<const uint16_t*>(block), block_dtype},
                                    In(targets, s.rows), Out(state, LmHeadStateElems(s)),
                                    F32Workspace(workspace, workspace_bytes), pool);
  });
}

absl::Status CpuKernels::DoLmHeadFinish(Stream& stream, const VocabBlockShape& s,
                                        const int32_t* targets, const float* state, float* lse,
                                        double* loss) {
  return Enqueue(stream, [=]() -> absl::Status {
    ASSIGN_OR_RETURN(const double mean_loss,
                     ::ps::LmHeadFinish<float>(s, In(targets, s.rows),
                                               In(state, LmHeadStateElems(s)), Out(lse, s.rows)));
    *loss = mean_loss;
    return absl::OkStatus();
  });
}

absl::Status CpuKernels::DoLmHeadBlockBackward(Stream& stream, const VocabBlockShape& s,
                                               const float* h, DType block_dtype, const void* block,
                                               const int32_t* targets, const float* lse,
                                               double loss_grad, float* dh, float* dblock,
                                               void* workspace, int64_t workspace_bytes) {
  ThreadPool* pool = pool_;
  return Enqueue(stream, [=] {
    const int64_t C = s.channels, block_elems = s.block_rows * C;
    // Each finished vocabulary tile lands in its rows of dblock (if wanted).
    auto on_tile = [&](int64_t v0, int64_t rows, const float* grad) -> absl::Status {
      if (dblock == nullptr) return absl::OkStatus();
      std::memcpy(dblock + (v0 - s.row_begin) * C, grad,
                  static_cast<size_t>(rows * C) * sizeof(float));
      return absl::OkStatus();
    };
    if (block_dtype == DType::kF32) {
      return ::ps::LmHeadBlockBackward<float>(
          s, In(h, s.rows * C), In(static_cast<const float*>(block), block_elems),
          In(targets, s.rows), In(lse, s.rows), loss_grad, Out(dh, s.rows * C),
          F32Workspace(workspace, workspace_bytes), on_tile, pool);
    }
    return ::ps::LmHeadBlockBackward(
        s, In(h, s.rows * C), Block16{static_cast<const uint16_t*>(block), block_dtype},
        In(targets, s.rows), In(lse, s.rows), loss_grad, Out(dh, s.rows * C),
        F32Workspace(workspace, workspace_bytes), on_tile, pool);
  });
}

// --- 4-bit weights -------------------------------------------------------------------------------
// The Quant4Tensor is captured by value (its pointers are device memory of this backend).

absl::Status CpuKernels::DoDequantize4Bit(Stream& stream, const Quant4Tensor& w, int64_t begin,
                                          int64_t count, DType dst_dtype, void* dst) {
  ThreadPool* pool = pool_;
  return Enqueue(stream, [=]() -> absl::Status {
    // Parallel over ranges of whole 64-value blocks (the codec is single-threaded per call); each
    // value is one product, so the split does not change a bit.
    constexpr int64_t kGrain = int64_t{64} << 10;
    const int64_t tasks = (count + kGrain - 1) / kGrain, elem = SizeOf(dst_dtype);
    std::vector<absl::Status> status(static_cast<size_t>(tasks));
    kernels_internal::ParallelFor(pool, tasks, [&](int64_t t) {
      const int64_t n = std::min(kGrain, count - t * kGrain);
      status[t] = ::ps::Dequantize4Bit(w, begin + t * kGrain, n, dst_dtype,
                                       static_cast<char*>(dst) + t * kGrain * elem);
    });
    for (const absl::Status& st : status) RETURN_IF_ERROR(st);
    return absl::OkStatus();
  });
}

absl::Status CpuKernels::DoQuant4LinearForward(Stream& stream, const LinearShape& s, const float* x,
                                               const Quant4Tensor& w, const float* b, float* y,
                                               void* workspace, int64_t workspace_bytes,
                                               DType compute_dtype) {
  ThreadPool* pool = pool_;
  return Enqueue(stream, [=] {
    return ::ps::Quant4LinearForward(s, In(x, s.rows * s.in_features), w,
                                     OptIn(b, s.out_features), Out(y, s.rows * s.out_features),
                                     F32Workspace(workspace, workspace_bytes), pool, compute_dtype);
  });
}

absl::Status CpuKernels::DoQuant4LinearBackwardInput(Stream& stream, const LinearShape& s,
                                                     const Quant4Tensor& w, const float* dy,
                                                     float* dx, void* workspace,
                                                     int64_t workspace_bytes, DType compute_dtype) {
  ThreadPool* pool = pool_;
  return Enqueue(stream, [=] {
    return ::ps::Quant4LinearBackwardInput(s, w, In(dy, s.rows * s.out_features),
                                           Out(dx, s.rows * s.in_features),
                                           F32Workspace(workspace, workspace_bytes), pool,
                                           compute_dtype);
  });
}

// --- LoRA adapters ------------------------------------------------------------------------------

absl::Status CpuKernels::DoLoraForward(Stream& stream, const LoraShape& s, const float* x,
                                       const float* a, const float* b, float* h, float* y, void*,
                                       int64_t) {
  ThreadPool* pool = pool_;
  return Enqueue(stream, [=] {
    return ::ps::LoraForward<float>(s, In(x, s.rows * s.in_features), In(a, s.rank * s.in_features),
                                    In(b, s.out_features * s.rank), Out(h, s.rows * s.rank),
                                    Out(y, s.rows * s.out_features), pool);
  });
}

absl::Status CpuKernels::DoLoraBackward(Stream& stream, const LoraShape& s, const float* x,
                                        const float* a, const float* b, const float* h,
                                        const float* dy, float* dx, float* da, float* db,
                                        void* workspace, int64_t workspace_bytes) {
  ThreadPool* pool = pool_;
  return Enqueue(stream, [=] {
    return ::ps::LoraBackward<float>(
        s, In(x, s.rows * s.in_features), In(a, s.rank * s.in_features),
        In(b, s.out_features * s.rank), In(h, s.rows * s.rank), In(dy, s.rows * s.out_features),
        OptOut(dx, s.rows * s.in_features), Out(da, s.rank * s.in_features),
        Out(db, s.out_features * s.rank), F32Workspace(workspace, workspace_bytes), pool);
  });
}

absl::Status CpuKernels::DoDropoutForward(Stream& stream, int64_t n, float p, uint64_t seed,
                                          const float* x, float* y) {
  ThreadPool* pool = pool_;
  return Enqueue(stream, [=] { return ::ps::DropoutForward(p, seed, In(x, n), Out(y, n), pool); });
}

absl::Status CpuKernels::DoDropoutBackward(Stream& stream, int64_t n, float p, uint64_t seed,
                                           const float* dy, float* dx) {
  ThreadPool* pool = pool_;
  return Enqueue(stream,
                 [=] { return ::ps::DropoutBackward(p, seed, In(dy, n), Out(dx, n), pool); });
}

}  // namespace ps
