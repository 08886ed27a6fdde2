// The transformer program's buffers and accesses (model/internal/transformer_program_run.h): RAII
// handles over a ProgramContext — an f32 scratch buffer freed on destruction, an operator access
// released on destruction — and the activations one pass keeps. Internal to the program.
//
// Thread safety: thread-compatible, as the context.
#ifndef PATRICKSTAR_MODEL_INTERNAL_PROGRAM_BUFFERS_H_
#define PATRICKSTAR_MODEL_INTERNAL_PROGRAM_BUFFERS_H_

#include <cstdint>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "base/status_macros.h"
#include "chunk/chunk_layout.h"
#include "model/transformer_program.h"
#include "scheduler/metronome.h"

namespace ps {
namespace program_internal {

// An f32 scratch buffer of the context, freed on destruction.
class Buffer {
 public:
  Buffer() = default;
  Buffer(ProgramContext* ctx, float* data, int64_t elems) : ctx_(ctx), data_(data), elems_(elems) {}
  Buffer(Buffer&& other) noexcept
      : ctx_(std::exchange(other.ctx_, nullptr)),
        data_(std::exchange(other.data_, nullptr)),
        elems_(std::exchange(other.elems_, 0)) {}
  Buffer& operator=(Buffer&& other) noexcept {
    if (this != &other) {
      Reset();
      ctx_ = std::exchange(other.ctx_, nullptr);
      data_ = std::exchange(other.data_, nullptr);
      elems_ = std::exchange(other.elems_, 0);
    }
    return *this;
  }
  Buffer(const Buffer&) = delete;
  Buffer& operator=(const Buffer&) = delete;
  ~Buffer() { Reset(); }

  void Reset() {
    if (data_ == nullptr) return;
    ctx_->FreeScratch(data_, elems_);
    ctx_ = nullptr;
    data_ = nullptr;
    elems_ = 0;
  }
  float* data() const { return data_; }
  int32_t* i32() const { return reinterpret_cast<int32_t*>(data_); }
  int64_t elems() const { return elems_; }

 private:
  ProgramContext* ctx_ = nullptr;
  float* data_ = nullptr;
  int64_t elems_ = 0;
};

// Access(op, stage) ... Release(op, stage); released on destruction if End() was not reached (an
// error path), so a failing kernel never leaves an operator accessed.
class ScopedAccess {
 public:
  static absl::StatusOr<ScopedAccess> Begin(ProgramContext* ctx, OperatorId op, Stage stage) {
    RETURN_IF_ERROR(ctx->Access(op, stage));
    return ScopedAccess(ctx, op, stage);
  }
  ScopedAccess(ScopedAccess&& other) noexcept
      : ctx_(std::exchange(other.ctx_, nullptr)), op_(other.op_), stage_(other.stage_) {}
  ScopedAccess& operator=(ScopedAccess&&) = delete;
  ScopedAccess(const ScopedAccess&) = delete;
  ScopedAccess& operator=(const ScopedAccess&) = delete;
  ~ScopedAccess() {
    if (ctx_ != nullptr) ctx_->ReleaseAfterError(op_, stage_);
  }
  [[nodiscard]] absl::Status End() { return std::exchange(ctx_, nullptr)->Release(op_, stage_); }

 private:
  ScopedAccess(ProgramContext* ctx, OperatorId op, Stage stage)
      : ctx_(ctx), op_(op), stage_(stage) {}
  ProgramContext* ctx_;
  OperatorId op_;
  Stage stage_;
};

// What one block's backward needs from its forward (its input is kept in Activations::x). The
// fused projection keeps qkv; the split one q, k (normalized per head with the q/k norm, rotated
// with RoPE) and v. fch is the MLP's first
// projection (c_fc, gate_proj), up the SwiGLU up projection, act the activation's output.
struct BlockActs {
  Buffer ln1, ln1_mean, ln1_rstd, qkv, q, k, v, atty, lse, res2, ln2, ln2_mean, ln2_rstd, fch, up,
      act;
  // With the q/k norm: the projections (the norms' inputs) and the norms' rstd; q and k are then
  // the normalized (and rotated) heads.
  Buffer q_in, k_in, q_rstd, k_rstd;
  // LoRA: each adapter's h = A drop(x) [N, rank] (ProgramLayout::Lora), for its backward.
  Buffer lh_qkv, lh_q, lh_k, lh_v, lh_o, lh_in, lh_up, lh_out;
  // With post norms (OLMo 2): the attention's and the MLP's output projections, the inputs of
  // ln_1 and ln_2 (ln1 and ln2 are then unused: the sublayers read the residual stream itself).
  Buffer attn_o, mlp_o;
  // With sandwich norms (Gemma): the statistics of the post norms (ln_1_post, ln_2_post); the
  // pre norms keep theirs in ln1_* and ln2_*.
  Buffer ln1p_mean, ln1p_rstd, ln2p_mean, ln2p_rstd;
  // What the attention's and the MLP's input projections read: ln1 and ln2, or (post norms) the
  // block's input and res2. Set by the forward; not owned.
  const float* attn_in = nullptr;
  const float* mlp_in = nullptr;
  void Reset() { *this = BlockActs(); }
};

struct Activations {
  // The residual stream: x[l] is block l's input, x[num_layers] the final norm's input.
  std::vector<Buffer> x;
  std::vector<BlockActs> blocks;
  Buffer lnf, lnf_mean, lnf_rstd, ce_lse;
  // The f32 wte gradient rows of the batch's distinct tokens (LM head's part, then the
  // embedding's added), sized for min(tokens, vocab) rows whatever the batch, so that the tide
  // does not depend on the data.
  Buffer touched_grads;
  // Device copies of the inputs (InputsLayout): the loss (one double), tokens, targets and (RoPE)
  // the cos/sin tables; and of slot_of_token (backward).
  Buffer inputs;
  Buffer slots;
};

}  // namespace program_internal
}  // namespace ps

#endif  // PATRICKSTAR_MODEL_INTERNAL_PROGRAM_BUFFERS_H_
