// Kernels: the one interface through which a model runs its operators on an accelerator — every
// operator's forward and backward of the chunked GPT-2 and Llama-family models, plus zero-fill,
// dtype conversion, a GEMM with 16-bit operands and nn.Linear over 4-bit (QLoRA) weights — with a
// CPU implementation for the emulated accelerator (model/kernels/cpu_kernels.h) and a CUDA one
// (model/kernels/cuda/cuda_kernels.h, --config=cuda). Create the one matching a backend with CreateKernels (kernels_factory.h).
//
// The contract every implementation keeps, and the model relies on:
//  - Asynchronous, stream-ordered. Every operation is *enqueued* on the given Stream and returns
//    at once; it runs after the work enqueued on that stream before it, and before the work
//    enqueued after it, as a CUDA kernel launch does. The CPU implementation really does this: the
//    kernel runs later on the emulated stream's worker thread, so the host races ahead exactly as
//    it does with a GPU, and an ordering mistake (reading a result before waiting for it, reusing a
//    buffer a queued kernel still reads, another stream reading gradients backward still writes)
//    gives wrong results on the CPU too — deterministically with the cpu backend's stall hooks
//    (memory/cpu_backend.h).
//  - Device memory only. Every pointer is device memory of the backend the stream belongs to
//    (chunk payloads, scratch from DeviceMemory::scratch()), never host memory; tokens, targets and
//    the loss live on the device too (copy them with Stream::MemcpyAsync). Buffers must stay valid,
//    and inputs unchanged, until the operation has run: free scratch with
//    CachingAllocator::DeallocateOnStream on the same stream, or after an event/synchronization.
//  - No allocation, no synchronization. Workspaces are the caller's: an operation that needs one
//    has a `...WorkspaceBytes(shape)` query, answered by the implementation (the CUDA ones include
//    the cuBLAS workspace, so even cuBLAS's scratch comes from the caller's allocator and counts
//    against the device cap and the tide).
//  - Errors. Every argument error is found at enqueue, identically for every implementation (this
//    class checks them before an implementation sees the call): InvalidArgument naming the
//    operation and the offending dimension or buffer, and nothing is enqueued. An implementation
//    adds its own limits at enqueue (CUDA: head_dim <= 128, grid dimensions; CPU: every buffer must
//    lie inside a live device allocation of its backend, which catches host pointers and buffers
//    too small for the shape). Errors that depend on device data (a token or target outside the
//    vocabulary) cannot be seen at enqueue: the CPU implementation reports them at the stream's
//    next Synchronize (the stream's asynchronous error, as a CUDA kernel fault), the CUDA kernels
//    write NaN into the affected rows instead of reading out of bounds.
//  - Math. Shapes, layouts and the `+=` gradient contract are those of the CPU kernels in
//    model/kernels/*.h (each header has the math): gradients accumulate, so zero them (Zero) before
//    the first micro-batch. The CPU implementation gives bit for bit what calling those kernels
//    directly gives; the CUDA one differs by rounding (documented per kernel in
//    model/kernels/cuda). Activations and gradients are f32; low-precision (f16/bf16) parameters
//    are either converted to f32 scratch with Convert, or multiplied directly with Gemm (16-bit
//    operands, f32 accumulation: tensor cores on the GPU).
//  - Input gradient only. For a frozen operator (LoRA's base model) the parameter gradients are
//    optional: a null dw / db in LinearBackward, MatmulBackward, MatmulBackwardBf16,
//    LayerNormBackward and RmsNormBackward, and a null dblock in LmHeadBlockBackward, skip that
//    gradient's work (and its validation); dx (dh) is then, on the CPU, bit for bit the full
//    call's. LoraBackward's dx may be null likewise.
//
// Why an abstract class and not a struct of function objects: the implementations carry state the
// operations share (the CPU thread pool; the cuBLAS handle and its lock; the backend whose memory
// the CPU checks pointers against), a model holds one object for all ~40 operations rather than 40
// separately-initialized callables that could be half set, and the public methods are
// non-virtual: they validate arguments once, here, and call the private virtual Do* methods only
// with valid ones (the non-virtual interface idiom), so every implementation rejects the same
// inputs with the same words and none can forget a check. A test fake overrides the Do* methods.
//
// Thread safety: implementations are thread-safe; operations may be enqueued from several threads
// (on one stream, the caller orders its own enqueues). Keep the Kernels object (and, for the CPU,
// its thread pool) alive until the work enqueued through it has completed.
#ifndef PATRICKSTAR_MODEL_KERNELS_KERNELS_H_
#define PATRICKSTAR_MODEL_KERNELS_KERNELS_H_

#include <cstdint>
#include <initializer_list>

#include "absl/status/status.h"
#include "absl/strings/string_view.h"
#include "memory/backend.h"
#include "memory/dtype.h"
#include "model/kernels/embedding.h"
#include "model/kernels/encoder.h"
#include "model/kernels/gemm_shape.h"
#include "model/kernels/gqa_attention.h"
#include "model/kernels/kernel_workspaces.h"
#include "model/kernels/layernorm.h"
#include "model/kernels/linear.h"
#include "model/kernels/lm_head_cross_entropy.h"
#include "model/kernels/lora.h"
#include "model/kernels/matmul.h"
#include "model/kernels/nf4.h"
#include "model/kernels/rmsnorm.h"
#include "model/kernels/rope.h"
#include "model/kernels/swiglu.h"
#include "model/kernels/vocab_blocks.h"

namespace ps {

// The touched-rows buffer of a vocabulary matrix (model/kernels/vocab_blocks.h, "Tied weights"):
// `slot_of_token` [vocab_size] int32 on the device maps a row of the matrix to its slot in
// `slot_rows` [num_slots, channels] f32, or to -1 when the batch does not touch it.
struct TouchedRowsShape {
  int64_t channels = 0;    // C
  int64_t vocab_size = 0;  // V: entries of slot_of_token
  int64_t num_slots = 0;   // rows of slot_rows
};

class Kernels {
 public:
  virtual ~Kernels() = default;

  // "cpu" or "cuda".
  virtual absl::string_view name() const = 0;

  // --- Workspaces ---------------------------------------------------------------------------
  // The bytes of device workspace each operation asks its caller for (kernel_workspaces.h): they
  // depend on the implementation (and for the CPU on its thread count), not only the shape. Pass
  // at least that many. The queries below forward to workspaces().
  virtual const KernelWorkspaces& workspaces() const = 0;

  int64_t GemmWorkspaceBytes(const GemmShape& s) const {
    return workspaces().GemmWorkspaceBytes(s);
  }
  int64_t MatmulWorkspaceBytes(const MatmulShape& s) const {  // fwd and bwd
    return workspaces().MatmulWorkspaceBytes(s);
  }
  int64_t LinearWorkspaceBytes(const LinearShape& s) const {  // fwd and bwd
    return workspaces().LinearWorkspaceBytes(s);
  }
  int64_t GqaAttentionForwardWorkspaceBytes(const GqaAttentionShape& s) const {
    return workspaces().GqaAttentionForwardWorkspaceBytes(s);
  }
  int64_t GqaAttentionBackwardWorkspaceBytes(const GqaAttentionShape& s) const {
    return workspaces().GqaAttentionBackwardWorkspaceBytes(s);
  }
  // Forward and backward.
  int64_t LmHeadCrossEntropyWorkspaceBytes(const LmHeadCrossEntropyShape& s) const {
    return workspaces().LmHeadCrossEntropyWorkspaceBytes(s);
  }
  // The bf16-weight GEMMs (MatmulForwardBf16 / MatmulBackwardBf16 below).
  int64_t MatmulBf16ForwardWorkspaceBytes(const MatmulShape& s) const {
    return workspaces().MatmulBf16ForwardWorkspaceBytes(s);
  }
  int64_t MatmulBf16BackwardWorkspaceBytes(const MatmulShape& s) const {
    return workspaces().MatmulBf16BackwardWorkspaceBytes(s);
  }
  // The vocabulary-block LM head (LmHeadBlockForward / LmHeadBlockBackward below) for a block
  // stored as `block_dtype`.
  int64_t LmHeadBlockForwardWorkspaceBytes(const VocabBlockShape& s, DType block_dtype) const {
    return workspaces().LmHeadBlockForwardWorkspaceBytes(s, block_dtype);
  }
  int64_t LmHeadBlockBackwardWorkspaceBytes(const VocabBlockShape& s, DType block_dtype) const {
    return workspaces().LmHeadBlockBackwardWorkspaceBytes(s, block_dtype);
  }
  // The LoRA adapter (LoraForward / LoraBackward below).
  int64_t LoraForwardWorkspaceBytes(const LoraShape& s) const {
    return workspaces().LoraForwardWorkspaceBytes(s);
  }
  int64_t LoraBackwardWorkspaceBytes(const LoraShape& s) const {
    return workspaces().LoraBackwardWorkspaceBytes(s);
  }
  // nn.Linear over a 4-bit weight (Quant4LinearForward / Quant4LinearBackwardInput below), computing
  // in `compute_dtype`.
  int64_t Quant4LinearWorkspaceBytes(const LinearShape& s,  // fwd and bwd
                                     DType compute_dtype = DType::kF32) const {
    return workspaces().Quant4LinearWorkspaceBytes(s, compute_dtype);
  }

  // --- Memory -------------------------------------------------------------------------------
  // Sets `bytes` bytes at dst to zero (0.0 in f32, f16 and bf16). bytes == 0 enqueues nothing.
  [[nodiscard]] absl::Status Zero(Stream& stream, void* dst, int64_t bytes);
  // dst[i] = src[i] converted from src_dtype to dst_dtype for i < num_elems, bit for bit as
  // memory/convert.h (round-to-nearest-even, NaN payloads kept); same dtype is a copy. src and dst
  // must not overlap. num_elems == 0 enqueues nothing.
  [[nodiscard]] absl::Status Convert(Stream& stream, DType src_dtype, const void* src,
                                     DType dst_dtype, void* dst, int64_t num_elems);

  // --- GEMM with 16-bit operands --------------------------------------------------------------
  // See GemmShape. For bf16 compute (on the GPU: cublasGemmEx, CUBLAS_COMPUTE_32F, tensor cores;
  // on the CPU: bf16 operands through internal/bf16_gemm.h, oneDNN's AVX512-BF16 kernels where
  // the CPU has them, else widened to f32 and sgemm; f16 operands widened to f32 in the workspace,
  // then sgemm — exact products, f32 sums in every case).
  [[nodiscard]] absl::Status Gemm(Stream& stream, const GemmShape& shape, float alpha,
                                  const void* a, const void* b, float beta, float* c,
                                  void* workspace, int64_t workspace_bytes);

  // --- GPT-2 -----------------------------------------------------------------------------------
  // model/kernels/encoder.h: out[B,T,C] = wte[tokens] + wpe[0..T); tokens [B,T] int32.
  [[nodiscard]] absl::Status EncoderForward(Stream& stream, const EncoderShape& shape,
                                            const int32_t* tokens, const float* wte,
                                            const float* wpe, float* out);
  [[nodiscard]] absl::Status EncoderBackward(Stream& stream, const EncoderShape& shape,
                                             const int32_t* tokens, const float* dout, float* dwte,
                                             float* dwpe);
  // model/kernels/layernorm.h. The backward's dw and db may be null (input gradient only).
  [[nodiscard]] absl::Status LayerNormForward(Stream& stream, const LayerNormShape& shape,
                                              const float* x, const float* w, const float* b,
                                              float* y, float* mean, float* rstd);
  [[nodiscard]] absl::Status LayerNormBackward(Stream& stream, const LayerNormShape& shape,
                                               const float* x, const float* w, const float* mean,
                                               const float* rstd, const float* dy, float* dx,
                                               float* dw, float* db);
  // model/kernels/matmul.h (Conv1D, W [in, out]): y = x W + b. The backward's dw and db may be
  // null (input gradient only; likewise in MatmulBackwardBf16).
  [[nodiscard]] absl::Status MatmulForward(Stream& stream, const MatmulShape& shape, const float* x,
                                           const float* w, const float* b, float* y,
                                           void* workspace, int64_t workspace_bytes);
  [[nodiscard]] absl::Status MatmulBackward(Stream& stream, const MatmulShape& shape,
                                            const float* x, const float* w, const float* dy,
                                            float* dx, float* dw, float* db, void* workspace,
                                            int64_t workspace_bytes);
  // model/kernels/gelu.h over num_elems elements; y may equal x.
  [[nodiscard]] absl::Status GeluForward(Stream& stream, int64_t num_elems, const float* x,
                                         float* y);
  [[nodiscard]] absl::Status GeluBackward(Stream& stream, int64_t num_elems, const float* x,
                                          const float* dy, float* dx);
  // model/kernels/residual.h: out = a + b (out may equal a or b); da += dout, db += dout (da and
  // db must not overlap).
  [[nodiscard]] absl::Status ResidualForward(Stream& stream, int64_t num_elems, const float* a,
                                             const float* b, float* out);
  [[nodiscard]] absl::Status ResidualBackward(Stream& stream, int64_t num_elems, const float* dout,
                                              float* da, float* db);
  // model/kernels/residual.h: x *= alpha (Gemma's embedding multiplier, forward and backward).
  [[nodiscard]] absl::Status ScaleInPlace(Stream& stream, int64_t num_elems, float alpha, float* x);
  // model/kernels/lm_head_cross_entropy.h. The forward writes the mean loss to *loss (one double
  // in device memory: copy it to the host after the stream got there) and lse [N]. wte is the
  // tied embedding or an untied lm_head.weight [V, C]; targets [N] int32 on the device.
  [[nodiscard]] absl::Status LmHeadCrossEntropyForward(
      Stream& stream, const LmHeadCrossEntropyShape& shape, const float* h, const float* wte,
      const int32_t* targets, float* lse, double* loss, void* workspace, int64_t workspace_bytes);
  // dh += dloss/dh * loss_grad, dwte += dloss/dwte * loss_grad (loss_grad: 1, or the loss scale).
  [[nodiscard]] absl::Status LmHeadCrossEntropyBackward(Stream& stream,
                                                        const LmHeadCrossEntropyShape& shape,
                                                        const float* h, const float* wte,
                                                        const int32_t* targets, const float* lse,
                                                        double loss_grad, float* dh, float* dwte,
                                                        void* workspace, int64_t workspace_bytes);

  // model/kernels/matmul.h's bf16 variants (Conv1D, W [in, out] bf16 bit patterns read in place):
  // y = bf16(x) W + b; dx += bf16(dy) W^T, dw += bf16(x)^T bf16(dy), db += column sums of dy.
  // Activations rounded to bf16 (round-to-nearest-even) in the workspace, f32 accumulation, f32
  // outputs (dw too: the caller converts it into the gradient slot). b and db are f32.
  [[nodiscard]] absl::Status MatmulForwardBf16(Stream& stream, const MatmulShape& shape,
                                               const float* x, const uint16_t* w, const float* b,
                                               float* y, void* workspace, int64_t workspace_bytes);
  [[nodiscard]] absl::Status MatmulBackwardBf16(Stream& stream, const MatmulShape& shape,
                                                const float* x, const uint16_t* w, const float* dy,
                                                float* dx, float* dw, float* db, void* workspace,
                                                int64_t workspace_bytes);

  // --- The vocabulary in row blocks (model/kernels/vocab_blocks.h has the math) ---------------
  // A block is rows [row_begin, row_begin + block_rows) of the [vocab_size, C] matrix, stored as
  // `block_dtype` (f32, f16 or bf16) and read in place. tokens and targets are [rows] int32 on the
  // device; a token or target outside the vocabulary is a device-data error (see above).
  //
  // out[n, :] = block[tokens[n] - row_begin, :] (widened exactly) for the tokens in the block;
  // other rows of out [rows, C] f32 are left alone.
  [[nodiscard]] absl::Status EmbeddingBlockForward(Stream& stream, const VocabBlockShape& shape,
                                                   const int32_t* tokens, DType block_dtype,
                                                   const void* block, float* out);
  // slot_rows[slot_of_token[tokens[n]], :] += dout[n, :] for n = 0, 1, ..., num_tokens - 1 whose
  // token has a slot (>= 0). dout [num_tokens, C]. A slot >= num_slots is a device-data error.
  [[nodiscard]] absl::Status ScatterRowsAdd(Stream& stream, const TouchedRowsShape& shape,
                                            int64_t num_tokens, const int32_t* tokens,
                                            const int32_t* slot_of_token, const float* dout,
                                            float* slot_rows);
  // slot_rows[slot_of_token[row_begin + r], :] = src[r, :] for r in [0, rows) with a slot >= 0
  // (the LM head's gradient rows of one vocabulary tile kept for the embedding's part). src
  // [rows, C] f32; [row_begin, row_begin + rows) inside [0, vocab_size).
  [[nodiscard]] absl::Status CopyRowsToSlots(Stream& stream, const TouchedRowsShape& shape,
                                             int64_t row_begin, int64_t rows,
                                             const int32_t* slot_of_token, const float* src,
                                             float* slot_rows);
  // dst[r, :] = slot_rows[slot_of_token[row_begin + r], :] converted to dst_dtype, for r in
  // [0, rows) with a slot >= 0; the other rows of dst [rows, C] (dst_dtype) are left alone (the
  // touched rows' complete gradients written into a block's gradient slot).
  [[nodiscard]] absl::Status CopySlotsToRows(Stream& stream, const TouchedRowsShape& shape,
                                             int64_t row_begin, int64_t rows,
                                             const int32_t* slot_of_token, const float* slot_rows,
                                             DType dst_dtype, void* dst);
  // GPT-2's learned positions: out[b, t, :] += wpe[p, :]; dwpe[p, :] += dout[b, t, :] summed in
  // increasing (b, t), with p = t, or p = positions[b*T + t] when `positions` (device int32
  // [batch, seq_len], e.g. restarting at every packed document) is given. out/dout [batch,
  // seq_len, C], wpe/dwpe [max_seq_len, C] f32. A position outside [0, max_seq_len): the CPU
  // reports InvalidArgument at the stream's next Synchronize, CUDA writes NaN rows (forward) and
  // drops the row (backward).
  [[nodiscard]] absl::Status PositionEmbeddingForward(Stream& stream, int64_t batch,
                                                      int64_t seq_len, int64_t channels,
                                                      int64_t max_seq_len, const float* wpe,
                                                      float* out,
                                                      const int32_t* positions = nullptr);
  [[nodiscard]] absl::Status PositionEmbeddingBackward(Stream& stream, int64_t batch,
                                                       int64_t seq_len, int64_t channels,
                                                       int64_t max_seq_len, const float* dout,
                                                       float* dwpe,
                                                       const int32_t* positions = nullptr);
  // The LM head over blocks: LmHeadStateInit, LmHeadBlockForward for every block in increasing
  // row order, LmHeadFinish. state is LmHeadStateElems(shape) = 3 * rows f32 (only shape.rows is
  // read by the init). h [rows, C] f32. The forward refuses a row_begin that is not a multiple of
  // vocab_tile (InvalidArgument, at enqueue).
  [[nodiscard]] absl::Status LmHeadStateInit(Stream& stream, const VocabBlockShape& shape,
                                             float* state);
  [[nodiscard]] absl::Status LmHeadBlockForward(Stream& stream, const VocabBlockShape& shape,
                                                const float* h, DType block_dtype,
                                                const void* block, const int32_t* targets,
                                                float* state, void* workspace,
                                                int64_t workspace_bytes);
  // lse [rows] and the mean cross-entropy over the valid targets (0 if none) as one double in
  // device memory at *loss (copy it to the host after the stream got there).
  [[nodiscard]] absl::Status LmHeadFinish(Stream& stream, const VocabBlockShape& shape,
                                          const int32_t* targets, const float* state, float* lse,
                                          double* loss);
  // dh += dloss/dh * loss_grad for this block's part of the vocabulary (f32 [rows, C]), and
  // dblock [block_rows, C] f32 = dloss/dblock * loss_grad (written, not added; null: dh only — the
  // CUDA implementation then skips the dblock GEMMs, the CPU one computes each tile's gradient in
  // the workspace and drops it). Calling it once
  // per vocabulary tile (block_rows <= vocab_tile, row_begin a multiple of vocab_tile) in
  // increasing order gives the same dh and gradient bits as one call over the whole block, so
  // dblock can stay one tile of scratch.
  [[nodiscard]] absl::Status LmHeadBlockBackward(Stream& stream, const VocabBlockShape& shape,
                                                 const float* h, DType block_dtype,
                                                 const void* block, const int32_t* targets,
                                                 const float* lse, double loss_grad, float* dh,
                                                 float* dblock, void* workspace,
                                                 int64_t workspace_bytes);

  // --- Llama / Qwen2 / Mistral --------------------------------------------------------------
  // model/kernels/rmsnorm.h. The backward's dw may be null (input gradient only).
  [[nodiscard]] absl::Status RmsNormForward(Stream& stream, const RmsNormShape& shape,
                                            const float* x, const float* w, float* y, float* rstd);
  [[nodiscard]] absl::Status RmsNormBackward(Stream& stream, const RmsNormShape& shape,
                                             const float* x, const float* w, const float* rstd,
                                             const float* dy, float* dx, float* dw);
  // model/kernels/rope.h: x [B,T,H,D] rotated in place; cos, sin [table_positions, D/2] (f32
  // tables from RopeTables, copied to the device). The backward is a transform, not a +=. Row
  // (b, t) takes the angles of position t, or of positions[b*T + t] when `positions` (device int32
  // [B, T]) is given; the tables need max position + 1 rows (T rows when positions < T). A
  // position outside the tables: InvalidArgument at the next Synchronize (CPU), NaN rows (CUDA).
  [[nodiscard]] absl::Status RopeForward(Stream& stream, const RopeShape& shape, const float* cos,
                                         const float* sin, float* x,
                                         const int32_t* positions = nullptr);
  [[nodiscard]] absl::Status RopeBackward(Stream& stream, const RopeShape& shape, const float* cos,
                                          const float* sin, float* dx,
                                          const int32_t* positions = nullptr);
  // model/kernels/swiglu.h: h = silu(g) * u (h may equal g or u); dg and du must not overlap.
  // act kGeluTanh: Gemma's GeGLU, h = gelu_tanh(g) * u.
  [[nodiscard]] absl::Status SwiGluForward(Stream& stream, int64_t num_elems, const float* g,
                                           const float* u, float* h,
                                           GateActivation act = GateActivation::kSilu);
  [[nodiscard]] absl::Status SwiGluBackward(Stream& stream, int64_t num_elems, const float* g,
                                            const float* u, const float* dh, float* dg, float* du,
                                            GateActivation act = GateActivation::kSilu);
  // model/kernels/gqa_attention.h: q, out [B,T,Hq,D]; k, v [B,T,Hkv,D]; lse [B,Hq,T]. q (dq)
  // and k, v (dk, dv) may be strided views (shape.q_row_stride, kv_row_stride) into one fused
  // buffer; the gradients must not share elements. GPT-2's multi-head attention is the case
  // num_kv_heads == num_heads, head_dim = C / H, on its fused qkv [B,T,3C]: q = qkv, k = qkv + C,
  // v = qkv + 2C (dq, dk, dv likewise in dqkv), both row strides 3C. The mask: query (b, t) sees
  // keys max(key_start[b,t], t - shape.sliding_window + 1) <= j <= t (window 0: no window);
  // key_start (device int32 [B, T], null: all 0 = plain causal) is where each packed document
  // starts, REQUIRES 0 <= key_start[b,t] <= t, non-decreasing in t (the CPU checks it and reports
  // InvalidArgument at the next Synchronize; CUDA's results are then wrong but it never reads out
  // of bounds). Both passes skip key tiles outside a query tile's visible range.
  [[nodiscard]] absl::Status GqaAttentionForward(Stream& stream, const GqaAttentionShape& shape,
                                                 const float* q, const float* k, const float* v,
                                                 float* out, float* lse, void* workspace,
                                                 int64_t workspace_bytes,
                                                 const int32_t* key_start = nullptr);
  [[nodiscard]] absl::Status GqaAttentionBackward(
      Stream& stream, const GqaAttentionShape& shape, const float* q, const float* k,
      const float* v, const float* out, const float* lse, const float* dout, float* dq, float* dk,
      float* dv, void* workspace, int64_t workspace_bytes, const int32_t* key_start = nullptr);
  // model/kernels/linear.h (nn.Linear, W [out, in]): y = x W^T + b. b and db are null when
  // !shape.bias. In the backward, dw and db may be null (input gradient only, see above).
  [[nodiscard]] absl::Status LinearForward(Stream& stream, const LinearShape& shape, const float* x,
                                           const float* w, const float* b, float* y,
                                           void* workspace, int64_t workspace_bytes);
  [[nodiscard]] absl::Status LinearBackward(Stream& stream, const LinearShape& shape,
                                            const float* x, const float* w, const float* dy,
                                            float* dx, float* dw, float* db, void* workspace,
                                            int64_t workspace_bytes);
  // model/kernels/embedding.h: out[N,C] = wte[tokens]; dwte += scatter, skipping padding_idx.
  [[nodiscard]] absl::Status EmbeddingForward(Stream& stream, const EmbeddingShape& shape,
                                              const int32_t* tokens, const float* wte, float* out);
  [[nodiscard]] absl::Status EmbeddingBackward(Stream& stream, const EmbeddingShape& shape,
                                               const int32_t* tokens, const float* dout,
                                               float* dwte);

  // --- 4-bit frozen weights (QLoRA; model/kernels/nf4.h, nf4_linear.h have the math) -----------
  // `w` is a Quant4Tensor whose pointers are device memory: codes (Quant4CodeBytes(num_elems)
  // bytes), and either absmax (Quant4NumBlocks f32) or the nested state (one code per block,
  // Quant4NestedNumBlocks f32 scales, the offset by value). Every implementation dequantizes a
  // value to the same bits (level * absmax, one f32 product; nested absmax as nf4_math.h).
  //
  // Values [begin, begin + count) of the flattened tensor into dst [count] as dst_dtype (f32; bf16
  // or f16: the f32 value rounded to nearest even), bit for bit the CPU codec's on every
  // implementation. count == 0 enqueues nothing.
  [[nodiscard]] absl::Status Dequantize4Bit(Stream& stream, const Quant4Tensor& w, int64_t begin,
                                            int64_t count, DType dst_dtype, void* dst);
  // nn.Linear (W [out, in], w.num_elems == out * in) on the dequantized weight, which is never
  // whole in memory: tiles of it are dequantized into the workspace inside the GEMM. f32
  // activations. y [N, out] = x [N, in] dequant(W)^T + b (overwritten; b [out] f32, null when
  // !shape.bias). The CPU gives bit for bit LinearForward on the dequantized f32 matrix (and what
  // nf4_linear.h's function gives, whatever the thread count); CUDA rounds as cuBLAS does.
  //
  // compute_dtype (bitsandbytes' bnb_4bit_compute_dtype; the workspace query takes the same): f32,
  // or bf16 / f16 as bitsandbytes' Linear4bit computes with it (nf4_linear.h): x, bias and the
  // dequantized weight rounded to it (nearest even), exact products summed in f32, y rounded to it
  // once (the bias added before that rounding); the backward rounds dy, and adds dy W rounded to
  // it to dx (f32). Buffers stay f32, holding 16-bit values where rounded. The CPU gives bit for
  // bit nf4_linear.h's function; CUDA multiplies the same 16-bit operands with cuBLAS
  // (CUBLAS_COMPUTE_32F), so only the f32 summation order differs.
  [[nodiscard]] absl::Status Quant4LinearForward(Stream& stream, const LinearShape& shape,
                                                 const float* x, const Quant4Tensor& w,
                                                 const float* b, float* y, void* workspace,
                                                 int64_t workspace_bytes,
                                                 DType compute_dtype = DType::kF32);
  // dx [N, in] += dy [N, out] dequant(W): the input gradient only (the base is frozen). dx must
  // not overlap dy.
  [[nodiscard]] absl::Status Quant4LinearBackwardInput(Stream& stream, const LinearShape& shape,
                                                       const Quant4Tensor& w, const float* dy,
                                                       float* dx, void* workspace,
                                                       int64_t workspace_bytes,
                                                       DType compute_dtype = DType::kF32);

  // --- LoRA adapters (model/kernels/lora.h; dropout_math.h has the dropout rule) -------------
  // h [rows, rank] = x A^T (overwritten; keep it for the backward); y [rows, out] += scale * h B^T.
  // x [rows, in], a [rank, in], b [out, rank], all f32. Any rank >= 1 (also rank > in or out).
  // y must not overlap x, a, b or h.
  [[nodiscard]] absl::Status LoraForward(Stream& stream, const LoraShape& shape, const float* x,
                                         const float* a, const float* b, float* h, float* y,
                                         void* workspace, int64_t workspace_bytes);
  // g = scale * dy B [rows, rank] (in the workspace); db += scale * dy^T h; da += g^T x;
  // dx += g A. dx may be null: no input gradient (the work is skipped). da, db and dx must not
  // overlap each other or the inputs.
  [[nodiscard]] absl::Status LoraBackward(Stream& stream, const LoraShape& shape, const float* x,
                                          const float* a, const float* b, const float* h,
                                          const float* dy, float* dx, float* da, float* db,
                                          void* workspace, int64_t workspace_bytes);
  // Inverted dropout over num_elems f32 elements with dropout_math.h's counter-based mask (the
  // same on every implementation, bit for bit): y[i] = keep(seed, i) ? x[i] * scale(p) : 0.
  // REQUIRES 0 <= p < 1 (p == 0: y = x). y must not overlap x. num_elems == 0 enqueues nothing.
  [[nodiscard]] absl::Status DropoutForward(Stream& stream, int64_t num_elems, float p,
                                            uint64_t seed, const float* x, float* y);
  // dx[i] += keep(seed, i) ? dy[i] * scale(p) : 0: exactly the forward's mask for the same seed
  // and p. dx must not overlap dy.
  [[nodiscard]] absl::Status DropoutBackward(Stream& stream, int64_t num_elems, float p,
                                             uint64_t seed, const float* dy, float* dx);

 protected:
  // One buffer argument of an operation, as the checks see it.
  struct BufferArg {
    absl::string_view name;
    const void* ptr = nullptr;
    int64_t bytes = 0;
  };
  // Implementation-specific check of a (non-null, aligned) buffer argument, at enqueue: the CPU
  // implementation checks it lies inside a live device allocation of its backend. Default: OK.
  [[nodiscard]] virtual absl::Status CheckBuffer(absl::string_view op, const BufferArg& buffer);

 private:
  // Validates the buffers of `op` (non-null, aligned to `align` bytes, sizes that fit int64, then
  // CheckBuffer).
  absl::Status CheckBuffers(absl::string_view op, std::initializer_list<BufferArg> buffers,
                            int64_t align);
  absl::Status CheckWorkspace(absl::string_view op, const void* workspace, int64_t workspace_bytes,
                              int64_t needed_bytes);
  // The device buffers of a 4-bit tensor (kernels_quant4.cc): type, count, and each buffer of its
  // form (codes; absmax or nested codes and scales) checked as CheckBuffers checks a buffer.
  absl::Status CheckQuant4Buffers(absl::string_view op, const Quant4Tensor& w);
  // An optional per-token int32 input [batch, seq_len] (positions, key_start): OK when null,
  // else checked as CheckBuffers checks a buffer of batch * seq_len int32. Its values live on the
  // device and are not read here.
  absl::Status CheckOptionalPerToken(absl::string_view op, absl::string_view name,
                                     const int32_t* values, int64_t batch, int64_t seq_len);

  // The implementations. Called only with arguments that passed every check above.
  virtual absl::Status DoZero(Stream& stream, void* dst, int64_t bytes) = 0;
  virtual absl::Status DoConvert(Stream& stream, DType src_dtype, const void* src, DType dst_dtype,
                                 void* dst, int64_t num_elems) = 0;
  virtual absl::Status DoGemm(Stream& stream, const GemmShape& shape, float alpha, const void* a,
                              const void* b, float beta, float* c, void* workspace,
                              int64_t workspace_bytes) = 0;
  virtual absl::Status DoEncoderForward(Stream& stream, const EncoderShape& shape,
                                        const int32_t* tokens, const float* wte, const float* wpe,
                                        float* out) = 0;
  virtual absl::Status DoEncoderBackward(Stream& stream, const EncoderShape& shape,
                                         const int32_t* tokens, const float* dout, float* dwte,
                                         float* dwpe) = 0;
  virtual absl::Status DoLayerNormForward(Stream& stream, const LayerNormShape& shape,
                                          const float* x, const float* w, const float* b, float* y,
                                          float* mean, float* rstd) = 0;
  virtual absl::Status DoLayerNormBackward(Stream& stream, const LayerNormShape& shape,
                                           const float* x, const float* w, const float* mean,
                                           const float* rstd, const float* dy, float* dx, float* dw,
                                           float* db) = 0;
  virtual absl::Status DoMatmulForward(Stream& stream, const MatmulShape& shape, const float* x,
                                       const float* w, const float* b, float* y, void* workspace,
                                       int64_t workspace_bytes) = 0;
  virtual absl::Status DoMatmulBackward(Stream& stream, const MatmulShape& shape, const float* x,
                                        const float* w, const float* dy, float* dx, float* dw,
                                        float* db, void* workspace, int64_t workspace_bytes) = 0;
  virtual absl::Status DoGeluForward(Stream& stream, int64_t num_elems, const float* x,
                                     float* y) = 0;
  virtual absl::Status DoGeluBackward(Stream& stream, int64_t num_elems, const float* x,
                                      const float* dy, float* dx) = 0;
  virtual absl::Status DoResidualForward(Stream& stream, int64_t num_elems, const float* a,
                                         const float* b, float* out) = 0;
  virtual absl::Status DoResidualBackward(Stream& stream, int64_t num_elems, const float* dout,
                                          float* da, float* db) = 0;
  virtual absl::Status DoScaleInPlace(Stream& stream, int64_t num_elems, float alpha, float* x) = 0;
  virtual absl::Status DoLmHeadCrossEntropyForward(Stream& stream,
                                                   const LmHeadCrossEntropyShape& shape,
                                                   const float* h, const float* wte,
                                                   const int32_t* targets, float* lse, double* loss,
                                                   void* workspace, int64_t workspace_bytes) = 0;
  virtual absl::Status DoLmHeadCrossEntropyBackward(Stream& stream,
                                                    const LmHeadCrossEntropyShape& shape,
                                                    const float* h, const float* wte,
                                                    const int32_t* targets, const float* lse,
                                                    double loss_grad, float* dh, float* dwte,
                                                    void* workspace, int64_t workspace_bytes) = 0;
  virtual absl::Status DoRmsNormForward(Stream& stream, const RmsNormShape& shape, const float* x,
                                        const float* w, float* y, float* rstd) = 0;
  virtual absl::Status DoRmsNormBackward(Stream& stream, const RmsNormShape& shape, const float* x,
                                         const float* w, const float* rstd, const float* dy,
                                         float* dx, float* dw) = 0;
  virtual absl::Status DoRopeForward(Stream& stream, const RopeShape& shape, const float* cos,
                                     const float* sin, float* x, const int32_t* positions) = 0;
  virtual absl::Status DoRopeBackward(Stream& stream, const RopeShape& shape, const float* cos,
                                      const float* sin, float* dx, const int32_t* positions) = 0;
  virtual absl::Status DoSwiGluForward(Stream& stream, int64_t num_elems, const float* g,
                                       const float* u, float* h, GateActivation act) = 0;
  virtual absl::Status DoSwiGluBackward(Stream& stream, int64_t num_elems, const float* g,
                                        const float* u, const float* dh, float* dg, float* du,
                                        GateActivation act) = 0;
  virtual absl::Status DoGqaAttentionForward(Stream& stream, const GqaAttentionShape& shape,
                                             const float* q, const float* k, const float* v,
                                             float* out, float* lse, void* workspace,
                                             int64_t workspace_bytes, const int32_t* key_start) = 0;
  virtual absl::Status DoGqaAttentionBackward(Stream& stream, const GqaAttentionShape& shape,
                                              const float* q, const float* k, const float* v,
                                              const float* out, const float* lse, const float* dout,
                                              float* dq, float* dk, float* dv, void* workspace,
                                              int64_t workspace_bytes,
                                              const int32_t* key_start) = 0;
  virtual absl::Status DoLinearForward(Stream& stream, const LinearShape& shape, const float* x,
                                       const float* w, const float* b, float* y, void* workspace,
                                       int64_t workspace_bytes) = 0;
  virtual absl::Status DoLinearBackward(Stream& stream, const LinearShape& shape, const float* x,
                                        const float* w, const float* dy, float* dx, float* dw,
                                        float* db, void* workspace, int64_t workspace_bytes) = 0;
  virtual absl::Status DoEmbeddingForward(Stream& stream, const EmbeddingShape& shape,
                                          const int32_t* tokens, const float* wte, float* out) = 0;
  virtual absl::Status DoEmbeddingBackward(Stream& stream, const EmbeddingShape& shape,
                                           const int32_t* tokens, const float* dout,
                                           float* dwte) = 0;

  // The vocabulary blocks, the touched rows and the bf16-weight GEMMs.
  virtual absl::Status DoMatmulForwardBf16(Stream& stream, const MatmulShape& shape, const float* x,
                                           const uint16_t* w, const float* b, float* y,
                                           void* workspace, int64_t workspace_bytes) = 0;
  virtual absl::Status DoMatmulBackwardBf16(Stream& stream, const MatmulShape& shape,
                                            const float* x, const uint16_t* w, const float* dy,
                                            float* dx, float* dw, float* db, void* workspace,
                                            int64_t workspace_bytes) = 0;
  virtual absl::Status DoEmbeddingBlockForward(Stream& stream, const VocabBlockShape& shape,
                                               const int32_t* tokens, DType block_dtype,
                                               const void* block, float* out) = 0;
  virtual absl::Status DoScatterRowsAdd(Stream& stream, const TouchedRowsShape& shape,
                                        int64_t num_tokens, const int32_t* tokens,
                                        const int32_t* slot_of_token, const float* dout,
                                        float* slot_rows) = 0;
  virtual absl::Status DoCopyRowsToSlots(Stream& stream, const TouchedRowsShape& shape,
                                         int64_t row_begin, int64_t rows,
                                         const int32_t* slot_of_token, const float* src,
                                         float* slot_rows) = 0;
  virtual absl::Status DoCopySlotsToRows(Stream& stream, const TouchedRowsShape& shape,
                                         int64_t row_begin, int64_t rows,
                                         const int32_t* slot_of_token, const float* slot_rows,
                                         DType dst_dtype, void* dst) = 0;
  virtual absl::Status DoPositionEmbeddingForward(Stream& stream, int64_t batch, int64_t seq_len,
                                                  int64_t channels, int64_t max_seq_len,
                                                  const float* wpe, float* out,
                                                  const int32_t* positions) = 0;
  virtual absl::Status DoPositionEmbeddingBackward(Stream& stream, int64_t batch, int64_t seq_len,
                                                   int64_t channels, int64_t max_seq_len,
                                                   const float* dout, float* dwpe,
                                                   const int32_t* positions) = 0;
  virtual absl::Status DoLmHeadStateInit(Stream& stream, const VocabBlockShape& shape,
                                         float* state) = 0;
  virtual absl::Status DoLmHeadBlockForward(Stream& stream, const VocabBlockShape& shape,
                                            const float* h, DType block_dtype, const void* block,
                                            const int32_t* targets, float* state, void* workspace,
                                            int64_t workspace_bytes) = 0;
  virtual absl::Status DoLmHeadFinish(Stream& stream, const VocabBlockShape& shape,
                                      const int32_t* targets, const float* state, float* lse,
                                      double* loss) = 0;
  virtual absl::Status DoLmHeadBlockBackward(Stream& stream, const VocabBlockShape& shape,
                                             const float* h, DType block_dtype, const void* block,
                                             const int32_t* targets, const float* lse,
                                             double loss_grad, float* dh, float* dblock,
                                             void* workspace, int64_t workspace_bytes) = 0;

  // 4-bit weights.
  virtual absl::Status DoDequantize4Bit(Stream& stream, const Quant4Tensor& w, int64_t begin,
                                        int64_t count, DType dst_dtype, void* dst) = 0;
  virtual absl::Status DoQuant4LinearForward(Stream& stream, const LinearShape& shape,
                                             const float* x, const Quant4Tensor& w, const float* b,
                                             float* y, void* workspace, int64_t workspace_bytes,
                                             DType compute_dtype) = 0;
  virtual absl::Status DoQuant4LinearBackwardInput(Stream& stream, const LinearShape& shape,
                                                   const Quant4Tensor& w, const float* dy,
                                                   float* dx, void* workspace,
                                                   int64_t workspace_bytes,
                                                   DType compute_dtype) = 0;

  // LoRA and dropout.
  virtual absl::Status DoLoraForward(Stream& stream, const LoraShape& shape, const float* x,
                                     const float* a, const float* b, float* h, float* y,
                                     void* workspace, int64_t workspace_bytes) = 0;
  virtual absl::Status DoLoraBackward(Stream& stream, const LoraShape& shape, const float* x,
                                      const float* a, const float* b, const float* h,
                                      const float* dy, float* dx, float* da, float* db,
                                      void* workspace, int64_t workspace_bytes) = 0;
  virtual absl::Status DoDropoutForward(Stream& stream, int64_t num_elems, float p, uint64_t seed,
                                        const float* x, float* y) = 0;
  virtual absl::Status DoDropoutBackward(Stream& stream, int64_t num_elems, float p, uint64_t seed,
                                         const float* dy, float* dx) = 0;
};

}  // namespace ps

#endif  // PATRICKSTAR_MODEL_KERNELS_KERNELS_H_
