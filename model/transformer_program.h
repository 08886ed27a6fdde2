// TransformerProgram: the forward and backward of a chunked decoder-only transformer — GPT-2 and
// the Llama family alike — written once, over a small ProgramContext, and run by two consumers:
//   - GptModel (model/gpt_model.h) runs it over the live context: scratch from the accelerator's
//     caching allocator, operator accesses through the ChunkManager, parameters in their chunk
//     slots, the kernels enqueued on the compute stream;
//   - the activation profile (model/gpt_activation_profile.h) runs it over a recording context:
//     allocations, frees, accesses and releases become the profile's events, the kernels are not
//     run, and their workspace sizes come from the same KernelWorkspaces the live kernels answer.
// So the tide the memory plan predicts is, by construction, the order and sizes of the model's own
// allocations: a change to the program changes both.
//
// The block is one program parameterized by TransformerBlockSpec (model/transformer_block_spec.h):
// LayerNorm or RMSNorm; a fused [in, out] qkv projection (GPT-2's c_attn) or three nn.Linear
// projections in one operator (q/k/v_proj, optional biases, optionally Qwen3's per-head RMSNorm of
// q and k); RoPE on q and k or learned positions; grouped-query attention (multi-head attention is
// the case num_kv_heads == num_heads; GPT-2's packed qkv is read with a row stride); GELU(tanh) or
// SwiGLU MLP; Conv1D ([in, out]) or nn.Linear ([out, in]) weights; a tied or untied LM head.
//
// Accesses. Each computation that needs parameters is bracketed by Access(op, stage) /
// Release(op, stage), so an operator's chunk is resident only while that operator computes. One
// ForwardBackward accesses, in order:
//   forward:  every embedding block (each writes the rows of its tokens), then GPT-2's wpe; per
//             layer the input norm, the q/k/v projection (GPT-2's c_attn, or q/k/v_proj in one
//             operator, with Qwen3's q/k norms inside that access), the attention output
//             projection, the post-attention norm, the MLP's input projections (c_fc; or gate,
//             then up), its output projection; the final norm; every LM-head block (the untied
//             lm_head's, or the embedding's again), the online softmax carried across blocks;
//   backward: the LM-head blocks, the final norm, per layer from the last the same operators in
//             reverse (except SwiGLU's gate before up: one SwiGLU backward feeds both), under
//             activation checkpointing first re-accessing the layer's operators in forward up to
//             the MLP's output projection (the recompute stops where the block's output would be
//             made; with an adapter on that projection, the recompute ends with the adapter's
//             access, which recomputes the adapter's h), then wpe and the embedding blocks in
//             reverse order.
// The vocabulary blocks are computed one at a time (model/kernels/vocab_blocks.h): no [vocab,
// hidden] buffer ever exists.
//
// Gradients. A backward access computes its operator's parameter gradients into zeroed f32 scratch
// (the kernels accumulate) and, at that operator's last backward use, writes them into the
// parameters' own slots of the param chunk (chunk/chunk_type.h), converted to the slot's dtype. A
// tied embedding is used twice: the LM head's backward writes each block's gradient into its slots
// one vocabulary tile at a time, except the rows of the batch's tokens, kept in f32 in a [distinct
// tokens, hidden] buffer until the embedding's backward has added its part, so every gradient is
// rounded to a 16-bit slot once. Untied, the embedding's gradient is zero outside the batch's rows.
//
// Non-model data. Activations, their gradients, gradient and kernel workspaces, and f32 copies of
// 16-bit parameters are the context's scratch, allocated when produced and freed as soon as
// nothing later needs them: the tide rises through forward and falls through backward. With f32
// chunks the kernels read the slots in place; with f16 chunks every parameter is converted to an
// f32 copy; with bf16 chunks the Conv1D weights and the LM-head blocks are read in place by the
// bf16 GEMMs (model/kernels/matmul.h) and the rest is converted.
//
// Activation checkpointing keeps only each block's input; backward recomputes the block right
// before its backward with the same kernels on the same inputs, so losses and gradients are
// bit-identical to the run without it. Results do not depend on where the scheduler keeps chunks
// or on the thread count; with f32 chunks they are bit-identical to model/kernels/testing's
// tiny_gpt2 and tiny_llama for the models they compute (the same kernel calls in the same order).
//
// Thread safety: a program is immutable after creation and may run over several contexts, one at a
// time per context; a context is driven by one thread.
#ifndef PATRICKSTAR_MODEL_TRANSFORMER_PROGRAM_H_
#define PATRICKSTAR_MODEL_TRANSFORMER_PROGRAM_H_

#include <cstdint>
#include <memory>
#include <vector>

#include "absl/functional/function_ref.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/types/span.h"
#include "chunk/chunk.h"
#include "chunk/chunk_layout.h"
#include "chunk/operator_spec.h"
#include "memory/dtype.h"
#include "model/gpt_config.h"
#include "model/kernels/kernel_workspaces.h"
#include "model/kernels/kernels.h"
#include "model/kernels/vocab_blocks.h"
#include "model/model_config.h"
#include "model/quant4_config.h"
#include "model/transformer_block_spec.h"
#include "scheduler/metronome.h"

namespace ps {

// What the program asks of the world. Every method is called by the one thread running the program.
class ProgramContext {
 public:
  virtual ~ProgramContext() = default;

  // f32 scratch of `elems` (> 0) elements: non-model accelerator memory. ResourceExhausted when it
  // does not fit.
  [[nodiscard]] virtual absl::StatusOr<float*> AllocateScratch(int64_t elems) = 0;
  // Returns a block of AllocateScratch (stream-ordered in the live context). Never fails.
  virtual void FreeScratch(float* data, int64_t elems) = 0;
  // ChunkManager::Access / Release of an operator.
  [[nodiscard]] virtual absl::Status Access(OperatorId op, Stage stage) = 0;
  [[nodiscard]] virtual absl::Status Release(OperatorId op, Stage stage) = 0;
  // Release on an error path (the operator's queued work finished first); logs its own errors.
  virtual void ReleaseAfterError(OperatorId op, Stage stage) = 0;
  // The parameter slot of `tensor`, in the compute dtype. REQUIRES: its operator is accessed.
  [[nodiscard]] virtual absl::StatusOr<TensorView> Param(TensorId tensor) = 0;
  // The dtype of the parameter slots (f32, f16 or bf16).
  virtual DType compute_dtype() const = 0;
  // The kernels' workspace sizes (the implementation that runs, or would run, the program).
  virtual const KernelWorkspaces& workspaces() const = 0;
  // Runs `enqueue` with the kernels and the compute stream (the live context), or skips it (the
  // recording context: nothing is computed).
  [[nodiscard]] virtual absl::Status Compute(
      absl::FunctionRef<absl::Status(Kernels&, Stream&)> enqueue) = 0;
  // Copies host bytes, the concatenation of `pieces`, to `device` on the compute stream (through
  // pinned staging: `staging` names one of the context's two staging buffers). The host pieces
  // may be reused once this returns.
  enum class Staging { kInputs, kTokenSlots };
  [[nodiscard]] virtual absl::Status Upload(Staging staging, void* device,
                                            absl::Span<const absl::Span<const char>> pieces) = 0;
  // The loss the LM head wrote at `device` (the host waits for the stream); 0 when recording.
  [[nodiscard]] virtual absl::StatusOr<double> ReadLoss(const double* device) = 0;
};

// The operators and parameter tensors the program reads, resolved to ids of a chunk layout (or of
// a recording context). An absent bias is -1.
//
// LoRA (model/lora_config.h). A frozen operator (OperatorSpec::trainable false: a LoRA base) is
// read in backward only for its input gradient: its weights get no gradient, nothing is written to
// its slots, and a frozen embedding is not accessed in backward at all. A linear may carry an
// adapter (PEFT's LoraLayer, bias "none"): y = W x + b + scale * B (A drop(x)), A [rank, in] and
// B [out, rank] in their own trainable operator "<base operator>.lora" (one per base operator: the
// q/k/v operator's adapter operator holds the q, k and v pairs that are targeted). The adapter
// operator is accessed right after its base operator's access ends, in forward and in backward
// (never both at once: every moment's working set stays one operator's chunk); with Qwen3's q/k
// norms and an adapter on the q/k/v operator, the forward accesses the q/k/v operator a second
// time for the norms, after the adapter (the norms read the adapted projections).
struct ProgramLayout {
  // One linear's adapter; op == -1 when the linear has none.
  struct Lora {
    OperatorId op = -1;
    TensorId a = -1;  // lora_A.weight [rank, in]
    TensorId b = -1;  // lora_B.weight [out, rank]
    int64_t rank = 0;
    bool present() const { return op >= 0; }
  };
  struct Op {
    OperatorId op = -1;
    TensorId w = -1;
    TensorId b = -1;
    bool trainable = true;
    Lora lora{};
  };
  // q/k/v_proj: three nn.Linear weights, optional biases and (Qwen3) the q/k norms' weights in
  // one operator.
  struct QkvOp {
    OperatorId op = -1;
    TensorId q_w = -1, k_w = -1, v_w = -1, q_b = -1, k_b = -1, v_b = -1, q_norm = -1, k_norm = -1;
    bool trainable = true;
    // The adapters of q_proj, k_proj, v_proj (all in one adapter operator when present).
    Lora q_lora{}, k_lora{}, v_lora{};
    OperatorId lora_op() const {
      return q_lora.present() ? q_lora.op : k_lora.present() ? k_lora.op : v_lora.op;
    }
  };
  // GPT-2: ln_1, c_attn (qkv), attn.c_proj (attn_out), ln_2, mlp.c_fc (mlp_in), mlp.c_proj
  // (mlp_out). Llama: input_layernorm, q/k/v_proj (qkv_split), o_proj, post_attention_layernorm,
  // gate_proj (mlp_in), up_proj (mlp_up), down_proj (mlp_out).
  // Gemma's sandwich norms: post_attention_layernorm (ln_1_post) and post_feedforward_layernorm
  // (ln_2_post), with ln_2 its pre_feedforward_layernorm.
  struct Block {
    Op ln_1, qkv, attn_out, ln_2, mlp_in, mlp_up, mlp_out, ln_1_post, ln_2_post;
    QkvOp qkv_split;
  };
  struct VocabBlock {
    OperatorId op = -1;
    TensorId tensor = -1;
    int64_t row_begin = 0;
    int64_t rows = 0;
    bool trainable = true;
  };
  std::vector<VocabBlock> embed;    // the token embedding's row blocks
  std::vector<VocabBlock> lm_head;  // an untied LM head's row blocks (empty when tied)
  Op wpe;                           // learned positions only
  std::vector<Block> blocks;
  Op ln_f;  // ln_f or model.norm
  // QLoRA (model/quant4_config.h): the linear weights stored as 4-bit blobs, by tensor id, and
  // their nested offsets (read at each GEMM, so the owner may set them after the program is
  // built); null or empty: none. A 4-bit weight's GEMMs run Kernels::Quant4LinearForward and
  // Quant4LinearBackwardInput (frozen: never a weight gradient) with their workspace.
  std::shared_ptr<const Quant4Table> quant4;
};

// The ProgramLayout of `ops` = ModelOperators(config, vocab) (the vocabulary split in the row
// blocks `rows` of GptVocabBlocks), with op_id(i) the id of ops[i] and tensor_id(i, j) the id of
// its j-th tensor; each operator's `trainable` is its spec's. `ops` may continue with adapter
// operators (LoraModelOperators, model/lora_config.h): operator "<base>.lora" holds, per adapted
// linear <module> of base operator <base> in the base's tensor order, "<module>.lora_A.weight"
// [rank, in] then "<module>.lora_B.weight" [out, rank]. REQUIRES: ops is that list (the order of
// model/model_config.h, then adapters whose names and shapes follow that rule).
ProgramLayout ProgramLayoutOf(const ModelConfig& config, absl::Span<const OperatorSpec> ops,
                              absl::Span<const GptVocabBlock> rows,
                              absl::FunctionRef<OperatorId(size_t op)> op_id,
                              absl::FunctionRef<TensorId(size_t op, size_t tensor)> tensor_id);

struct ProgramShape {
  int64_t batch = 1;    // B
  int64_t seq_len = 1;  // T
  bool activation_checkpointing = false;
  int64_t attention_tile = 64;
  int64_t ce_row_tile = 256;
  int64_t ce_vocab_tile = kDefaultVocabTileRows;
  // LoRA: the adapters' scale (lora_alpha / r) and dropout probability on the adapters' input
  // (training passes only; in [0, 1)). Unused without adapters.
  float lora_scale = 1.0f;
  float lora_dropout = 0.0f;
  // Per-token metadata (packed conversation data, trainer/data/packed_loader.h): the inputs buffer
  // then also holds positions and key_start ([B*T] int32 each: 8 bytes per token on the
  // accelerator, counted by the activation profile like every other byte of it). Without it,
  // ProgramInputs' positions and key_start must be empty (the buffer has no room for them).
  bool token_metadata = false;
};

// One batch's host inputs: tokens and targets [B, T]; for ForwardBackward the token -> slot map of
// the batch's distinct tokens ([vocab], -1 for tokens not in the batch; see gpt_model.h
// "Gradients"). A recording context passes empty spans: nothing reads them then.
// dropout_seed seeds the LoRA dropout masks of a ForwardBackward (one mask per adapter, derived
// from this seed and the adapter's A tensor id; the backward and an activation-checkpointing
// recompute regenerate the same masks): pass a different seed for every micro-batch.
//
// positions and key_start ([B*T] each, or both empty: position t and plain causal attention, as
// without them) describe packed rows of several examples: position p of a row is
// positions[p] for RoPE (q and k) or GPT-2's learned positions, and attends to keys j with
// key_start[p] <= j <= p (model/kernels/kernels.h). REQUIRES (GptModel checks it):
// 0 <= positions[p] < T, 0 <= key_start[b, t] <= t, key_start non-decreasing within a row, and
// ProgramShape::token_metadata when they are given.
struct ProgramInputs {
  absl::Span<const int32_t> tokens = {};
  absl::Span<const int32_t> targets = {};
  absl::Span<const int32_t> slot_of_token = {};
  uint64_t dropout_seed = 0;
  absl::Span<const int32_t> positions = {};
  absl::Span<const int32_t> key_start = {};
};

class TransformerProgram {
 public:
  // Targets equal to this are excluded from the loss (PyTorch's default ignore_index).
  static constexpr int32_t kIgnoreIndex = -100;

  // The program of `config` (valid: ValidateModelConfig) over `layout`. InvalidArgument for a bad
  // RoPE configuration.
  static absl::StatusOr<TransformerProgram> Create(const ModelConfig& config,
                                                   const ProgramShape& shape, ProgramLayout layout);

  // Forward and backward of one batch: the mean cross-entropy over the non-ignored targets; every
  // parameter slot then holds d(loss * loss_scale) / d(param). Errors of the context, returned
  // after every buffer is freed and every accessed operator released.
  [[nodiscard]] absl::StatusOr<double> ForwardBackward(ProgramContext& ctx,
                                                       const ProgramInputs& inputs,
                                                       double loss_scale) const;
  // Forward only, keeping no activation beyond the block being computed.
  [[nodiscard]] absl::StatusOr<double> Evaluate(ProgramContext& ctx,
                                                const ProgramInputs& inputs) const;

  const ModelConfig& config() const { return config_; }
  const TransformerBlockSpec& spec() const { return spec_; }
  const ProgramShape& shape() const { return shape_; }
  const ProgramLayout& layout() const { return layout_; }

 private:
  class Run;  // one pass over a context (transformer_program.cc)
  TransformerProgram(const ModelConfig& config, const ProgramShape& shape, ProgramLayout layout)
      : config_(config), spec_(BlockSpecOf(config)), shape_(shape), layout_(std::move(layout)) {}

  ModelConfig config_;
  TransformerBlockSpec spec_;
  ProgramShape shape_;
  ProgramLayout layout_;
  // RoPE tables [seq_len, head_dim / 2] (RoPE positions only), uploaded with the inputs; and
  // those of the local layers (Gemma 3's rope_local_base_freq; empty when no layer has one).
  std::vector<float> rope_cos_, rope_sin_;
  std::vector<float> rope_local_cos_, rope_local_sin_;
};

}  // namespace ps

#endif  // PATRICKSTAR_MODEL_TRANSFORMER_PROGRAM_H_
