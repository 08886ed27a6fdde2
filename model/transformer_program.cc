// TransformerProgram (model/transformer_program.h): its entry points and the whole model's pass —
// the inputs, the embedding, the blocks in turn (model/transformer_program_block.cc), the final
// norm, the LM head and cross-entropy — forward and backward.
#include "model/transformer_program.h"

#include <algorithm>
#include <cstdint>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/types/span.h"
#include "base/status_macros.h"
#include "memory/dtype.h"
#include "memory/dtype_math.h"
#include "model/internal/program_buffers.h"
#include "model/internal/transformer_program_run.h"
#include "model/kernels/rope.h"

namespace ps {
namespace {

using program_internal::Activations;
using program_internal::Buffer;
using program_internal::Mode;
using program_internal::ScopedAccess;

template <typename T>
absl::Span<const char> Bytes(absl::Span<const T> s) {
  return absl::Span<const char>(reinterpret_cast<const char*>(s.data()), s.size() * sizeof(T));
}

}  // namespace

absl::StatusOr<double> TransformerProgram::Run::ForwardBackward(const ProgramInputs& in,
                                                                double loss_scale) {
  training_ = true;
  dropout_seed_ = in.dropout_seed;
  Activations acts;
  const Mode mode = s_.activation_checkpointing ? Mode::kCheckpoint : Mode::kTrain;
  ASSIGN_OR_RETURN(const double loss, Forward(in, mode, acts));
  RETURN_IF_ERROR(Backward(in, loss_scale, acts));
  return loss;
}

absl::StatusOr<double> TransformerProgram::Run::Evaluate(const ProgramInputs& in) {
  Activations acts;
  return Forward(in, Mode::kEvaluate, acts);
}

absl::Status TransformerProgram::Run::UploadInputs(const ProgramInputs& in, Activations& acts) {
  const InputsOffsets o = InputsLayout();
  // Positions and key_start come together or not at all, and only into a buffer with room.
  const bool metadata = !in.positions.empty();
  if (metadata != !in.key_start.empty() || (metadata && !s_.token_metadata)) {
    return absl::InvalidArgumentError(
        "TransformerProgram: positions and key_start must be given together, and only to a "
        "program created with ProgramShape::token_metadata");
  }
  ASSIGN_OR_RETURN(acts.inputs, Alloc(o.total, false));
  const absl::Span<const char> pieces[] = {Bytes(in.tokens),
                                           Bytes(in.targets),
                                           Bytes(absl::MakeConstSpan(p_.rope_cos_)),
                                           Bytes(absl::MakeConstSpan(p_.rope_sin_)),
                                           Bytes(absl::MakeConstSpan(p_.rope_local_cos_)),
                                           Bytes(absl::MakeConstSpan(p_.rope_local_sin_)),
                                           Bytes(in.positions),
                                           Bytes(in.key_start)};
  RETURN_IF_ERROR(ctx_->Upload(ProgramContext::Staging::kInputs, acts.inputs.data() + o.tokens,
                               absl::MakeConstSpan(pieces, metadata ? 8 : 6)));
  rope_dev_ = acts.inputs.data();
  positions_dev_ = metadata ? acts.inputs.i32() + o.positions : nullptr;
  key_start_dev_ = metadata ? acts.inputs.i32() + o.key_start : nullptr;
  return absl::OkStatus();
}

float TransformerProgram::Run::EmbeddingMultiplier() const {
  const float m = static_cast<float>(spec_.embedding_multiplier);
  switch (ctx_->compute_dtype()) {
    case DType::kBF16:
      return BFloat16BitsToFloat(FloatToBFloat16Bits(m));
    case DType::kF16:
      return HalfBitsToFloat(FloatToHalfBits(m));
    default:
      return m;
  }
}

absl::Status TransformerProgram::Run::EmbeddingForward(Activations& acts) {
  const int32_t* tokens = acts.inputs.i32() + InputsLayout().tokens;
  ASSIGN_OR_RETURN(acts.x[0], Alloc(N_ * C_, false));
  // Each block writes the rows of its tokens (16-bit rows widened as they are read); every row
  // belongs to exactly one block.
  for (const VocabBlock& b : p_.layout_.embed) {
    ASSIGN_OR_RETURN(ScopedAccess access, ScopedAccess::Begin(ctx_, b.op, Stage::kForward));
    ASSIGN_OR_RETURN(const TensorView v, ctx_->Param(b.tensor));
    RETURN_IF_ERROR(ctx_->Compute([&](Kernels& k, Stream& s) {
      return k.EmbeddingBlockForward(s, BlockShape(b), tokens, v.dtype, v.data, acts.x[0].data());
    }));
    RETURN_IF_ERROR(access.End());
  }
  if (spec_.embedding_multiplier > 0) {
    // Gemma: x = wte[token] * sqrt(hidden_size), the factor rounded to the compute dtype first
    // (transformers' normalizer is a tensor of the embedding's dtype).
    const float m = EmbeddingMultiplier();
    RETURN_IF_ERROR(ctx_->Compute(
        [&](Kernels& k, Stream& s) { return k.ScaleInPlace(s, N_ * C_, m, acts.x[0].data()); }));
  }
  if (spec_.positions != TransformerBlockSpec::Positions::kLearned) return absl::OkStatus();
  // Then the positions: x = wte[token] + wpe[position].
  const Op& wpe_op = p_.layout_.wpe;
  ASSIGN_OR_RETURN(ScopedAccess access, ScopedAccess::Begin(ctx_, wpe_op.op, Stage::kForward));
  absl::Span<const float> wpe;
  ASSIGN_OR_RETURN(Buffer wpe_f32, ParamF32(wpe_op.w, &wpe));
  RETURN_IF_ERROR(ctx_->Compute([&](Kernels& k, Stream& s) {
    return k.PositionEmbeddingForward(s, B_, T_, C_, m_.max_position_embeddings, wpe.data(),
                                      acts.x[0].data(), positions_dev());
  }));
  wpe_f32.Reset();
  return access.End();
}

absl::Status TransformerProgram::Run::LmHeadForward(Activations& acts) {
  const int32_t* targets = acts.inputs.i32() + InputsLayout().targets;
  ASSIGN_OR_RETURN(acts.ce_lse, Alloc(N_, false));
  // The online softmax state of every row, carried across the blocks.
  const VocabBlockShape first = BlockShape(head_blocks().front());
  ASSIGN_OR_RETURN(Buffer state, Alloc(LmHeadStateElems(first), false));
  RETURN_IF_ERROR(ctx_->Compute(
      [&](Kernels& k, Stream& s) { return k.LmHeadStateInit(s, first, state.data()); }));
  for (const VocabBlock& b : head_blocks()) {
    const VocabBlockShape shape = BlockShape(b);
    const int64_t ws_bytes =
        ctx_->workspaces().LmHeadBlockForwardWorkspaceBytes(shape, ctx_->compute_dtype());
    ASSIGN_OR_RETURN(Buffer ws, Workspace(ws_bytes));
    ASSIGN_OR_RETURN(ScopedAccess access, ScopedAccess::Begin(ctx_, b.op, Stage::kForward));
    ASSIGN_OR_RETURN(const TensorView slot, ctx_->Param(b.tensor));
    RETURN_IF_ERROR(ctx_->Compute([&](Kernels& k, Stream& s) {
      return k.LmHeadBlockForward(s, shape, acts.lnf.data(), slot.dtype, slot.data, targets,
                                  state.data(), ws.data(), ws_bytes);
    }));
    RETURN_IF_ERROR(access.End());
  }
  return ctx_->Compute([&](Kernels& k, Stream& s) {
    return k.LmHeadFinish(s, first, targets, state.data(), acts.ce_lse.data(), LossOnDevice(acts));
  });
}

absl::StatusOr<double> TransformerProgram::Run::Forward(const ProgramInputs& in, Mode mode,
                                                        Activations& acts) {
  const int64_t L = m_.num_layers;
  acts.x.resize(static_cast<size_t>(L + 1));
  acts.blocks.resize(static_cast<size_t>(L));
  RETURN_IF_ERROR(UploadInputs(in, acts));
  RETURN_IF_ERROR(EmbeddingForward(acts));
  for (int64_t l = 0; l < L; ++l) {
    RETURN_IF_ERROR(
        BlockForward(l, acts.x[l].data(), /*recompute=*/false, acts.blocks[l], acts.x[l + 1]));
    if (mode != Mode::kTrain) acts.blocks[l].Reset();
    if (mode == Mode::kEvaluate) acts.x[l].Reset();
  }
  RETURN_IF_ERROR(
      NormForward(p_.layout_.ln_f, acts.x[L].data(), acts.lnf, acts.lnf_mean, acts.lnf_rstd));
  if (mode == Mode::kEvaluate) {
    acts.x[L].Reset();
    acts.lnf_mean.Reset();
    acts.lnf_rstd.Reset();
  }
  // The LM head (tied: the embedding blocks' second use).
  RETURN_IF_ERROR(LmHeadForward(acts));
  // The one value the host needs: the loss, copied back once the stream got there.
  return ctx_->ReadLoss(LossOnDevice(acts));
}

absl::Status TransformerProgram::Run::LmHeadBackward(double loss_scale, Activations& acts,
                                                     Buffer& dlnf) {
  const int32_t* targets = acts.inputs.i32() + InputsLayout().targets;
  for (const VocabBlock& b : head_blocks()) {
    const VocabBlockShape shape = BlockShape(b);
    // One vocabulary tile at a time (the same bits as the whole block: vocab_blocks.h), so the
    // block's gradient needs one tile of scratch. The workspace is sized for the block, which
    // covers every tile of it.
    const int64_t ws_bytes =
        ctx_->workspaces().LmHeadBlockBackwardWorkspaceBytes(shape, ctx_->compute_dtype());
    ASSIGN_OR_RETURN(Buffer ws, Workspace(ws_bytes));
    const int64_t tile_rows =
        std::min(shape.block_rows, std::min(shape.vocab_size, shape.vocab_tile));
    // A frozen head computes only d(lnf).
    Buffer dblock;
    if (b.trainable) {
      ASSIGN_OR_RETURN(dblock, Alloc(tile_rows * C_, false));
    }
    ASSIGN_OR_RETURN(ScopedAccess access, ScopedAccess::Begin(ctx_, b.op, Stage::kBackward));
    ASSIGN_OR_RETURN(const TensorView v, ctx_->Param(b.tensor));
    for (int64_t r0 = 0; r0 < b.rows; r0 += tile_rows) {
      VocabBlockShape tile = shape;
      tile.row_begin = b.row_begin + r0;
      tile.block_rows = std::min(tile_rows, b.rows - r0);
      RETURN_IF_ERROR(ctx_->Compute([&](Kernels& k, Stream& s) {
        RETURN_IF_ERROR(k.LmHeadBlockBackward(
            s, tile, acts.lnf.data(), v.dtype,
            static_cast<const char*>(v.data) + r0 * C_ * SizeOf(v.dtype), targets,
            acts.ce_lse.data(), loss_scale, dlnf.data(), dblock.data(), ws.data(), ws_bytes));
        // The batch's rows stay in f32 for the embedding's part (tied); the tile goes into the
        // slots (its parameters are not read again).
        if (!spec_.tied_lm_head || !b.trainable) return absl::OkStatus();
        return k.CopyRowsToSlots(s, TouchedShape(), tile.row_begin, tile.block_rows,
                                 acts.slots.i32(), dblock.data(), acts.touched_grads.data());
      }));
      if (b.trainable) {
        RETURN_IF_ERROR(WriteGradRows(b.tensor, r0, tile.block_rows, dblock.data()));
      }
    }
    RETURN_IF_ERROR(access.End());
  }
  return absl::OkStatus();
}

absl::Status TransformerProgram::Run::EmbeddingBackward(Activations& acts, Buffer& dx0) {
  // The embedding's part of the batch's rows, added to the LM head's in token order (no
  // parameter is read: nothing is accessed).
  if (embedding_trainable() && spec_.embedding_multiplier > 0) {
    const float m = EmbeddingMultiplier();  // d(wte row) = m * d(x0 row)
    RETURN_IF_ERROR(ctx_->Compute(
        [&](Kernels& k, Stream& s) { return k.ScaleInPlace(s, N_ * C_, m, dx0.data()); }));
  }
  if (embedding_trainable()) {
    RETURN_IF_ERROR(ctx_->Compute([&](Kernels& k, Stream& s) {
      return k.ScatterRowsAdd(s, TouchedShape(), N_, acts.inputs.i32() + InputsLayout().tokens,
                              acts.slots.i32(), dx0.data(), acts.touched_grads.data());
    }));
  }
  if (spec_.positions == TransformerBlockSpec::Positions::kLearned && p_.layout_.wpe.trainable) {
    const Op& wpe = p_.layout_.wpe;
    ASSIGN_OR_RETURN(Buffer dwpe, Alloc(m_.max_position_embeddings * C_, true));
    ASSIGN_OR_RETURN(ScopedAccess access, ScopedAccess::Begin(ctx_, wpe.op, Stage::kBackward));
    RETURN_IF_ERROR(ctx_->Compute([&](Kernels& k, Stream& s) {
      return k.PositionEmbeddingBackward(s, B_, T_, C_, m_.max_position_embeddings, dx0.data(),
                                         dwpe.data(), positions_dev());
    }));
    RETURN_IF_ERROR(WriteGrad(wpe.w, dwpe));
    RETURN_IF_ERROR(access.End());
  }
  dx0.Reset();
  if (!embedding_trainable()) return absl::OkStatus();
  // The embedding's last backward use: the batch's rows take their complete gradients (every
  // block is accessed, whether the batch touches it or not, so the schedule does not depend on
  // the data). Untied, this is the embedding's only backward use: its other rows' gradient is
  // zero.
  const std::vector<VocabBlock>& embed = p_.layout_.embed;
  for (auto it = embed.rbegin(); it != embed.rend(); ++it) {
    const VocabBlock& b = *it;
    ASSIGN_OR_RETURN(ScopedAccess access, ScopedAccess::Begin(ctx_, b.op, Stage::kBackward));
    ASSIGN_OR_RETURN(const TensorView v, ctx_->Param(b.tensor));
    RETURN_IF_ERROR(ctx_->Compute([&](Kernels& k, Stream& s) {
      if (!spec_.tied_lm_head) RETURN_IF_ERROR(k.Zero(s, v.data, v.bytes()));
      return k.CopySlotsToRows(s, TouchedShape(), b.row_begin, b.rows, acts.slots.i32(),
                               acts.touched_grads.data(), v.dtype, v.data);
    }));
    RETURN_IF_ERROR(access.End());
  }
  acts.touched_grads.Reset();
  acts.slots.Reset();
  return absl::OkStatus();
}

absl::Status TransformerProgram::Run::Backward(const ProgramInputs& in, double loss_scale,
                                               Activations& acts) {
  const int64_t V = m_.vocab_size, L = m_.num_layers;
  // Tied, the LM head writes every touched row before the embedding adds to it; untied, the
  // embedding's part starts from zero. A frozen embedding needs neither.
  if (embedding_trainable()) {
    ASSIGN_OR_RETURN(acts.touched_grads, Alloc(std::min(N_, V) * C_, !spec_.tied_lm_head));
    // slot_of_token on the device.
    ASSIGN_OR_RETURN(acts.slots, Alloc(V, false));
    const absl::Span<const char> slots[] = {Bytes(in.slot_of_token)};
    RETURN_IF_ERROR(ctx_->Upload(ProgramContext::Staging::kTokenSlots, acts.slots.data(), slots));
  }
  ASSIGN_OR_RETURN(Buffer dlnf, Alloc(N_ * C_, true));
  RETURN_IF_ERROR(LmHeadBackward(loss_scale, acts, dlnf));
  acts.ce_lse.Reset();
  acts.lnf.Reset();
  ASSIGN_OR_RETURN(Buffer dres, Alloc(N_ * C_, true));
  RETURN_IF_ERROR(NormBackward(p_.layout_.ln_f, acts.x[L].data(), acts.lnf_mean, acts.lnf_rstd,
                               dlnf.data(), dres.data()));
  dlnf.Reset();
  acts.lnf_mean.Reset();
  acts.lnf_rstd.Reset();
  acts.x[L].Reset();
  for (int64_t l = L - 1; l >= 0; --l) {
    if (s_.activation_checkpointing) {
      Buffer unused;
      RETURN_IF_ERROR(
          BlockForward(l, acts.x[l].data(), /*recompute=*/true, acts.blocks[l], unused));
    }
    RETURN_IF_ERROR(BlockBackward(l, acts.blocks[l], acts.x[l], dres));
  }
  return EmbeddingBackward(acts, dres);
}

absl::StatusOr<TransformerProgram> TransformerProgram::Create(const ModelConfig& config,
                                                              const ProgramShape& shape,
                                                              ProgramLayout layout) {
  TransformerProgram p(config, shape, std::move(layout));
  if (p.spec_.positions == TransformerBlockSpec::Positions::kRope) {
    // The rotated channels of each head (all of them but with Phi-3's partial rotary).
    const int64_t rotated = config.rotary_dim();
    RopeConfig rope{.head_dim = rotated,
                    .theta = config.rope_theta,
                    .scaling_type = "",
                    .llama3 = RopeLlama3Params{}};
    if (config.rope_scaling.type == RopeScalingType::kLlama3) {
      const RopeScaling& rs = config.rope_scaling;
      rope.scaling_type = "llama3";
      rope.llama3 = RopeLlama3Params{rs.factor, rs.low_freq_factor, rs.high_freq_factor,
                                     static_cast<double>(rs.original_max_position_embeddings)};
    }
    if (config.rope_scaling.type == RopeScalingType::kLinear) {
      rope.scaling_type = "linear";  // Gemma 3's global layers (the local tables are plain)
      rope.linear_factor = config.rope_scaling.factor;
    }
    if (config.rope_scaling.type == RopeScalingType::kLongRope) {
      // transformers picks the long factors when the longest position + 1 exceeds
      // original_max_position_embeddings: here when the sequence does (packed rows restart their
      // positions, so a packed batch of T > original tokens whose documents are all shorter gets
      // the long factors here and the short ones in transformers).
      const RopeScaling& rs = config.rope_scaling;
      rope.scaling_type = "longrope";
      rope.longrope_factors =
          shape.seq_len > rs.original_max_position_embeddings ? rs.long_factor : rs.short_factor;
      rope.attention_factor = LongRopeAttentionFactor(config);
    }
    const size_t table = static_cast<size_t>(shape.seq_len * rotated / 2);
    p.rope_cos_.resize(table);
    p.rope_sin_.resize(table);
    RETURN_IF_ERROR(RopeTables<float>(rope, shape.seq_len, absl::MakeSpan(p.rope_cos_),
                                      absl::MakeSpan(p.rope_sin_)));
    bool local = false;
    for (int64_t l = 0; l < config.num_layers; ++l) local = local || config.LayerHasLocalRope(l);
    if (local) {
      // Gemma 3's sliding-window layers: the plain tables of base rope_local_base_freq.
      const RopeConfig local_rope{.head_dim = rotated,
                                  .theta = config.rope_local_base_freq,
                                  .scaling_type = "",
                                  .llama3 = RopeLlama3Params{}};
      p.rope_local_cos_.resize(table);
      p.rope_local_sin_.resize(table);
      RETURN_IF_ERROR(RopeTables<float>(local_rope, shape.seq_len,
                                        absl::MakeSpan(p.rope_local_cos_),
                                        absl::MakeSpan(p.rope_local_sin_)));
    }
  }
  return p;
}

absl::StatusOr<double> TransformerProgram::ForwardBackward(ProgramContext& ctx,
                                                           const ProgramInputs& inputs,
                                                           double loss_scale) const {
  return Run(*this, ctx).ForwardBackward(inputs, loss_scale);
}

absl::StatusOr<double> TransformerProgram::Evaluate(ProgramContext& ctx,
                                                    const ProgramInputs& inputs) const {
  return Run(*this, ctx).Evaluate(inputs);
}

}  // namespace ps
