// TransformerProgram::Run: one pass of the transformer program (model/transformer_program.h) over a
// ProgramContext, declared here so that its parts can live in rooms of their own:
//   - model/transformer_program_ops.cc: buffers and parameter slots, the linears (Conv1D,
//     nn.Linear), the LoRA adapters, the norms and the residual adds — forward and backward of
//     each;
//   - model/transformer_program_block.cc: one transformer block, forward and backward (the backward
//     in named parts: MLP, attention, q/k/v projections, adapters, norms and residuals);
//   - model/transformer_program.cc: the whole model — inputs, embedding, blocks, final norm, LM
//   head
//     and cross-entropy — and TransformerProgram's entry points.
// Internal to the program.
//
// The order of the program's scratch allocations, frees and operator accesses is its contract with
// the memory plan: the activation profile records exactly this order
// (model/gpt_activation_profile.h) and the plan replays it. Moving code between these files must
// keep every statement's order.
//
// Thread safety: thread-compatible, as the context.
#ifndef PATRICKSTAR_MODEL_INTERNAL_TRANSFORMER_PROGRAM_RUN_H_
#define PATRICKSTAR_MODEL_INTERNAL_TRANSFORMER_PROGRAM_RUN_H_

#include <algorithm>
#include <cstdint>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/types/span.h"
#include "base/splitmix64.h"
#include "chunk/chunk_layout.h"
#include "model/internal/program_buffers.h"
#include "model/kernels/kernels.h"
#include "model/model_config.h"
#include "model/transformer_block_spec.h"
#include "model/transformer_program.h"

namespace ps {
namespace program_internal {

// What a pass keeps: everything for backward, one block's worth (activation checkpointing) or
// nothing beyond the block being computed (evaluation).
enum class Mode { kTrain, kCheckpoint, kEvaluate };

}  // namespace program_internal

class TransformerProgram::Run {
 public:
  using Block = ProgramLayout::Block;
  using Lora = ProgramLayout::Lora;
  using Op = ProgramLayout::Op;
  using VocabBlock = ProgramLayout::VocabBlock;
  using Activations = program_internal::Activations;
  using BlockActs = program_internal::BlockActs;
  using Buffer = program_internal::Buffer;
  using Mode = program_internal::Mode;
  using ScopedAccess = program_internal::ScopedAccess;

  Run(const TransformerProgram& p, ProgramContext& ctx)
      : p_(p),
        m_(p.config_),
        spec_(p.spec_),
        s_(p.shape_),
        ctx_(&ctx),
        B_(p.shape_.batch),
        T_(p.shape_.seq_len),
        C_(p.config_.hidden_size),
        N_(B_ * T_) {}

  absl::StatusOr<double> ForwardBackward(const ProgramInputs& in, double loss_scale);
  absl::StatusOr<double> Evaluate(const ProgramInputs& in);

 private:
  // --- Buffers and parameter slots ------------------------------------------------------------

  // f32 scratch of `elems` elements, zeroed if asked.
  absl::StatusOr<Buffer> Alloc(int64_t elems, bool zero);
  // A kernel workspace of `bytes` as the workspace query answered (no allocation for 0).
  absl::StatusOr<Buffer> Workspace(int64_t bytes);
  // The parameter's values as f32: the slot itself (f32 chunks) or a converted copy.
  absl::StatusOr<Buffer> ParamF32(TensorId tensor, absl::Span<const float>* values);
  // The slot as bf16 bit patterns (read in place by the bf16 GEMMs) if its dtype is bf16.
  absl::StatusOr<const uint16_t*> ParamBf16(TensorId tensor);
  // An f32 gradient into the tensor's param slot (converted to the slot's dtype).
  absl::Status WriteGrad(TensorId tensor, const Buffer& grad);
  // `rows` rows of f32 gradient into rows [first_row, first_row + rows) of a [*, C] slot.
  absl::Status WriteGradRows(TensorId tensor, int64_t first_row, int64_t rows, const float* grad);

  // --- Linears and norms ---------------------------------------------------------------------

  // y = x W (+ b) of a Conv1D ([in, out]) operator: accesses it; bf16 weights read in place.
  absl::Status ConvLinearForward(const Op& op, int64_t in_features, int64_t out_features,
                                 const float* x, float* y);
  // dx += dy W^T of a Conv1D operator; its weight's and bias's gradients into their slots.
  // A frozen operator gets only dx.
  absl::Status ConvLinearBackward(const Op& op, int64_t in_features, int64_t out_features,
                                  const float* x, const float* dy, float* dx);
  // y = x W^T (+ b) of an nn.Linear ([out, in]) inside the caller's access of its operator; the
  // weights are read as f32.
  absl::Status NnLinearFwd(TensorId w, TensorId b, int64_t in_features, int64_t out_features,
                           const float* x, float* y);
  // dx += dy W of an nn.Linear inside the caller's access; its gradients into their slots
  // (`trainable`), or none (frozen).
  absl::Status NnLinearBwd(TensorId w, TensorId b, bool trainable, int64_t in_features,
                           int64_t out_features, const float* x, const float* dy, float* dx);
  // The 4-bit format of weight `w` (ProgramLayout::quant4), or null.
  const Quant4Format* Quant4Of(TensorId w) const;
  // NnLinearFwd / NnLinearBwd over a 4-bit weight (format `q`; frozen: dx only). GPT-2's Conv1D
  // weights are stored transposed, so they take this nn.Linear path too.
  absl::Status Quant4LinearFwd(const Quant4Format& q, TensorId w, TensorId b, int64_t in_features,
                               int64_t out_features, const float* x, float* y);
  absl::Status Quant4LinearBwd(const Quant4Format& q, TensorId w, int64_t in_features,
                               int64_t out_features, const float* dy, float* dx);
  // A linear operator of the block (Conv1D or nn.Linear), accessed around its computation; then
  // its adapter, if any, in its own access (h keeps the adapter's A drop(x)).
  absl::Status LinearForward(const Op& op, int64_t in_features, int64_t out_features,
                             const float* x, float* y, Buffer& h);
  // The backward of LinearForward: the operator's (dx only when frozen), then its adapter's
  // (frees h).
  absl::Status LinearBackward(const Op& op, int64_t in_features, int64_t out_features,
                              const float* x, const float* dy, float* dx, Buffer& h);

  // --- LoRA adapters (inside the caller's access of the adapter operator) ---------------------

  bool dropout() const { return training_ && s_.lora_dropout > 0.0f; }
  // The seed of adapter `l`'s dropout mask in this pass.
  uint64_t DropoutSeed(const Lora& l) const {
    return DeriveSeed(dropout_seed_, static_cast<uint64_t>(l.a));
  }
  LoraShape LoraShapeOf(const Lora& l, int64_t in_features, int64_t out_features) const {
    return LoraShape{.rows = N_,
                     .in_features = in_features,
                     .out_features = out_features,
                     .rank = l.rank,
                     .scale = s_.lora_scale};
  }
  // The adapter's input: x itself, or (training with dropout) its dropped copy in `dropped`.
  absl::StatusOr<const float*> AdapterInput(const Lora& l, int64_t in_features, const float* x,
                                            Buffer& dropped);
  // y += scale * B (A drop(x)), keeping h = A drop(x) [N, rank].
  absl::Status AdapterForward(const Lora& l, int64_t in_features, int64_t out_features,
                              const float* x, float* y, Buffer& h);
  // dx += the adapter's part of the input gradient from dy; dA and dB into their slots (the
  // adapter operator's only backward use). Frees h.
  absl::Status AdapterBackward(const Lora& l, int64_t in_features, int64_t out_features,
                               const float* x, Buffer& h, const float* dy, float* dx);

  bool layer_norm() const { return spec_.norm == TransformerBlockSpec::Norm::kLayerNorm; }
  // y = norm(x): LayerNorm (weight, bias; keeps mean and rstd) or RMSNorm (weight; keeps rstd).
  absl::Status NormForward(const Op& op, const float* x, Buffer& y, Buffer& mean, Buffer& rstd);
  // dx += the norm's input gradient from dy; its parameters' gradients into their slots.
  // A frozen norm gets only dx.
  absl::Status NormBackward(const Op& op, const float* x, const Buffer& mean, const Buffer& rstd,
                            const float* dy, float* dx);

  // y = RMSNorm(x) over each head's head_dim elements (x [N, heads, D]; Qwen3's q_norm, k_norm)
  // with weight `w` [D], inside the caller's access of the q/k/v operator; keeps the rstd.
  absl::Status HeadNormForward(TensorId w, int64_t heads, const Buffer& x, Buffer& y, Buffer& rstd);
  // The backward of HeadNormForward: `dy` (the gradient of y) is replaced by the gradient of x;
  // the weight's gradient goes into its slot.
  absl::Status HeadNormBackward(TensorId w, bool trainable, int64_t heads, const Buffer& x,
                                const Buffer& rstd, Buffer& dy);

  // --- The block -----------------------------------------------------------------------------

  bool fused_qkv() const { return spec_.attention == TransformerBlockSpec::Attention::kFusedMha; }
  // Whether `layer` rotates q and k (RoPE positions and not a NoPE layer).
  bool rope(int64_t layer) const { return spec_.RopeOn(layer); }
  bool swiglu() const { return spec_.mlp == TransformerBlockSpec::Mlp::kSwiGlu; }
  // The norms of the sublayers' outputs and their statistics: OLMo 2's ln_1 and ln_2 (in place
  // of the pre norms), or Gemma's ln_1_post and ln_2_post (besides them).
  struct PostNorms {
    const Op* attn;
    const Op* mlp;
    Buffer* attn_mean;
    Buffer* attn_rstd;
    Buffer* mlp_mean;
    Buffer* mlp_rstd;
  };
  PostNorms PostNormsOf(const Block& ops, BlockActs& a) const {
    if (spec_.sandwich_norms) {
      return {&ops.ln_1_post, &ops.ln_2_post, &a.ln1p_mean,
              &a.ln1p_rstd,   &a.ln2p_mean,   &a.ln2p_rstd};
    }
    return {&ops.ln_1, &ops.ln_2, &a.ln1_mean, &a.ln1_rstd, &a.ln2_mean, &a.ln2_rstd};
  }
  // Grouped-query attention of `layer` over q, k, v rows of `stride` elements (the fused
  // projection's packed [q | k | v] rows) or packed rows (0), with the layer's sliding window.
  GqaAttentionShape AttentionShape(int64_t layer) const {
    const int64_t stride = fused_qkv() ? m_.q_size() + 2 * m_.kv_size() : 0;
    return GqaAttentionShape{.batch = B_,
                             .seq_len = T_,
                             .num_heads = m_.num_heads,
                             .num_kv_heads = m_.num_kv_heads,
                             .head_dim = m_.head_dim,
                             .tile = s_.attention_tile,
                             .q_row_stride = stride,
                             .kv_row_stride = stride,
                             .sliding_window = m_.LayerSlidingWindow(layer)};
  }
  // Where q, k and v of a block are: in the fused qkv rows, or their own buffers.
  struct QkvPointers {
    float* q;
    float* k;
    float* v;
  };
  QkvPointers Qkv(const BlockActs& a) const {
    if (!fused_qkv()) return {a.q.data(), a.k.data(), a.v.data()};
    const int64_t Q = m_.q_size(), K = m_.kv_size();
    return {a.qkv.data(), a.qkv.data() + Q, a.qkv.data() + Q + K};
  }
  // The RoPE tables of `layer` (Gemma 3's local layers have their own).
  const float* rope_cos(int64_t layer) const {
    const InputsOffsets o = InputsLayout();
    return rope_dev_ + (m_.LayerHasLocalRope(layer) ? o.rope_local_cos : o.rope_cos);
  }
  const float* rope_sin(int64_t layer) const {
    const InputsOffsets o = InputsLayout();
    return rope_dev_ + (m_.LayerHasLocalRope(layer) ? o.rope_local_sin : o.rope_sin);
  }
  // Gemma's embedding multiplier, rounded to the compute dtype and then held in f32.
  float EmbeddingMultiplier() const;
  absl::Status Residual(const float* in, Buffer& out);
  absl::Status ResidualBwd(const Buffer& dout, Buffer& da, Buffer& db);

  // One block from `in`, keeping its activations in `a`. A recompute (activation checkpointing)
  // stops after what the block's backward needs and leaves `out` empty.
  absl::Status BlockForward(int64_t layer, const float* in, bool recompute, BlockActs& a,
                            Buffer& out);

  // Backward through block `layer` from d(output) `dres`, which becomes d(input); frees the
  // block's activations and its input `in`. The order of its frees is the tide the memory plan
  // replays (see the comment at its definition, model/transformer_program_block.cc).
  absl::Status BlockBackward(int64_t layer, BlockActs& a, Buffer& in, Buffer& dres);
  // The MLP's backward from d(mlp_out) `dmlp_out` (freed): returns d(ln2), the gradient of the
  // MLP's input; frees the MLP's activations (act, fch, up) and ln2.
  absl::StatusOr<Buffer> MlpBackward(const Block& ops, BlockActs& a, Buffer& dmlp_out);
  // The gradients of q, k and v: in the fused projection's rows (`qkv`) or their own buffers
  // (`q`, `k`, `v`); `d` points at each.
  struct QkvGrads {
    Buffer qkv, q, k, v;
    QkvPointers d{};
  };
  // The attention's backward from d(attention projection) `dattn_out` (freed): the output
  // projection, the attention scores, RoPE, then the q/k/v projections; returns d(ln1), the
  // gradient of the attention's input; frees the attention's activations but ln1.
  absl::StatusOr<Buffer> AttentionBackward(int64_t layer, const Block& ops, BlockActs& a,
                                           Buffer& dattn_out);
  // The grouped-query attention kernel's backward: d(atty) `datty` into d(q), d(k), d(v) at `d`
  // (its workspace freed on return).
  absl::Status ScoresBackward(int64_t layer, const BlockActs& a, const Buffer& datty,
                              const QkvPointers& d);
  // The split q/k/v projections' backward into `dln1`: in the operator's access, the q/k norms'
  // (replacing g.q and g.k by the projections' gradients) and the three nn.Linear's, each
  // gradient freed once no adapter needs it; then the adapters (QkvAdaptersBackward).
  absl::Status SplitQkvBackward(const ProgramLayout::QkvOp& qkv, BlockActs& a, QkvGrads& g,
                                float* dln1);
  // The q/k/v adapters' backward into `dln1`, in the adapter operator's access; frees their h and
  // the gradients g.q, g.k, g.v. REQUIRES: qkv.lora_op() >= 0.
  absl::Status QkvAdaptersBackward(const ProgramLayout::QkvOp& qkv, BlockActs& a, QkvGrads& g,
                                   float* dln1);

  // --- Embedding, LM head, the whole model -----------------------------------------------------

  // Elements of Activations::inputs (f32-sized): the loss (a double) at 0, tokens, targets, the
  // RoPE cos and sin tables (empty without RoPE), the local layers' (empty without), then with
  // ProgramShape::token_metadata the positions and key_start (N each; not uploaded when a pass has
  // none).
  struct InputsOffsets {
    int64_t tokens = 0, targets = 0, rope_cos = 0, rope_sin = 0, rope_local_cos = 0,
            rope_local_sin = 0, positions = 0, key_start = 0, total = 0;
  };
  InputsOffsets InputsLayout() const {
    InputsOffsets o;
    o.tokens = 2;  // after the loss (one double: two f32 elements, 8-byte aligned)
    o.targets = o.tokens + N_;
    o.rope_cos = o.targets + N_;
    const int64_t table = static_cast<int64_t>(p_.rope_cos_.size());
    o.rope_sin = o.rope_cos + table;
    const int64_t local = static_cast<int64_t>(p_.rope_local_cos_.size());
    o.rope_local_cos = o.rope_sin + table;
    o.rope_local_sin = o.rope_local_cos + local;
    o.positions = o.rope_local_sin + local;
    const int64_t meta = s_.token_metadata ? N_ : 0;
    o.key_start = o.positions + meta;
    o.total = o.key_start + meta;
    return o;
  }
  // The device copies of this pass's positions and key_start, or null (position t, plain causal).
  const int32_t* positions_dev() const { return positions_dev_; }
  const int32_t* key_start_dev() const { return key_start_dev_; }
  double* LossOnDevice(const Activations& acts) const {
    return reinterpret_cast<double*>(acts.inputs.data());
  }
  VocabBlockShape BlockShape(const VocabBlock& b) const {
    return VocabBlockShape{.rows = N_,
                           .channels = C_,
                           .vocab_size = m_.vocab_size,
                           .row_begin = b.row_begin,
                           .block_rows = b.rows,
                           .row_tile = s_.ce_row_tile,
                           .vocab_tile = s_.ce_vocab_tile,
                           .ignore_index = kIgnoreIndex};
  }
  TouchedRowsShape TouchedShape() const {
    return TouchedRowsShape{
        .channels = C_, .vocab_size = m_.vocab_size, .num_slots = std::min(N_, m_.vocab_size)};
  }
  const std::vector<VocabBlock>& head_blocks() const {
    return spec_.tied_lm_head ? p_.layout_.embed : p_.layout_.lm_head;
  }
  // Whether the embedding (tied: the LM head too) trains: all of its blocks share one flag (a
  // LoRA base freezes the whole matrix or saves the whole module).
  bool embedding_trainable() const { return p_.layout_.embed.front().trainable; }
  bool lm_head_trainable() const { return head_blocks().front().trainable; }

  // Allocates acts.inputs and enqueues the copies of tokens, targets, the RoPE tables and the
  // positions and key_start when the pass has them (one asynchronous copy: they lie back to back
  // from o.tokens, each of 4-byte elements).
  absl::Status UploadInputs(const ProgramInputs& in, Activations& acts);

  // acts.x[0] = the embedding rows of the tokens (+ wpe).
  absl::Status EmbeddingForward(Activations& acts);

  // The LM head and cross-entropy over every block: the loss on the device; keeps acts.ce_lse.
  absl::Status LmHeadForward(Activations& acts);

  absl::StatusOr<double> Forward(const ProgramInputs& in, Mode mode, Activations& acts);

  // The LM head's backward over every block: dlnf += ..., the blocks' gradients into their slots
  // one vocabulary tile at a time (tied: the batch's rows kept in acts.touched_grads).
  absl::Status LmHeadBackward(double loss_scale, Activations& acts, Buffer& dlnf);

  // The embedding's backward from d(x[0]) `dx0`: wpe's gradient, and the batch's embedding rows.
  // A frozen embedding (and wpe) is not accessed: nothing of it is computed.
  absl::Status EmbeddingBackward(Activations& acts, Buffer& dx0);

  absl::Status Backward(const ProgramInputs& in, double loss_scale, Activations& acts);

  const TransformerProgram& p_;
  const ModelConfig& m_;
  const TransformerBlockSpec& spec_;
  const ProgramShape& s_;
  ProgramContext* const ctx_;
  const int64_t B_, T_, C_, N_;
  // A ForwardBackward (LoRA dropout on) rather than an Evaluate, and its dropout seed.
  bool training_ = false;
  uint64_t dropout_seed_ = 0;
  // The device copy of the RoPE tables (in Activations::inputs) during a pass.
  const float* rope_dev_ = nullptr;
  // The device copies of the pass's positions and key_start (in Activations::inputs), or null.
  const int32_t* positions_dev_ = nullptr;
  const int32_t* key_start_dev_ = nullptr;
};

}  // namespace ps

#endif  // PATRICKSTAR_MODEL_INTERNAL_TRANSFORMER_PROGRAM_RUN_H_
