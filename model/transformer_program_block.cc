// TransformerProgram::Run's transformer block (model/internal/transformer_program_run.h): its
// forward, and its backward in named parts.
#include <cstdint>
#include <utility>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "base/status_macros.h"
#include "model/internal/program_buffers.h"
#include "model/internal/transformer_program_run.h"
#include "model/transformer_program.h"

namespace ps {
namespace {

using program_internal::Buffer;
using program_internal::ScopedAccess;

}  // namespace

absl::Status TransformerProgram::Run::BlockForward(int64_t layer, const float* in, bool recompute,
                                                   BlockActs& a, Buffer& out) {
  const Block& ops = p_.layout_.blocks[static_cast<size_t>(layer)];
  const int64_t Q = m_.q_size(), K = m_.kv_size(), I = m_.intermediate_size;
  const int64_t D = m_.head_dim;
  // Pre norms (ln_1, ln_2 on the sublayers' inputs) unless OLMo 2's post norms replace them; a
  // norm of each sublayer's output (OLMo 2's ln_1 and ln_2, Gemma's ln_1_post and ln_2_post).
  const bool pre = !spec_.post_norms;
  const bool post = spec_.post_norms || spec_.sandwich_norms;
  const PostNorms pn = PostNormsOf(ops, a);
  if (pre) RETURN_IF_ERROR(NormForward(ops.ln_1, in, a.ln1, a.ln1_mean, a.ln1_rstd));
  a.attn_in = pre ? a.ln1.data() : in;
  if (fused_qkv()) {
    ASSIGN_OR_RETURN(a.qkv, Alloc(N_ * (Q + 2 * K), false));
    RETURN_IF_ERROR(LinearForward(ops.qkv, C_, Q + 2 * K, a.attn_in, a.qkv.data(), a.lh_qkv));
  } else {
    ASSIGN_OR_RETURN(a.q, Alloc(N_ * Q, false));
    ASSIGN_OR_RETURN(a.k, Alloc(N_ * K, false));
    ASSIGN_OR_RETURN(a.v, Alloc(N_ * K, false));
    const ProgramLayout::QkvOp& qkv = ops.qkv_split;
    const bool adapted = qkv.lora_op() >= 0;
    auto head_norms = [&]() -> absl::Status {
      a.q_in = std::move(a.q);
      a.k_in = std::move(a.k);
      RETURN_IF_ERROR(HeadNormForward(qkv.q_norm, m_.num_heads, a.q_in, a.q, a.q_rstd));
      return HeadNormForward(qkv.k_norm, m_.num_kv_heads, a.k_in, a.k, a.k_rstd);
    };
    {
      ASSIGN_OR_RETURN(ScopedAccess access, ScopedAccess::Begin(ctx_, qkv.op, Stage::kForward));
      RETURN_IF_ERROR(NnLinearFwd(qkv.q_w, qkv.q_b, C_, Q, a.attn_in, a.q.data()));
      RETURN_IF_ERROR(NnLinearFwd(qkv.k_w, qkv.k_b, C_, K, a.attn_in, a.k.data()));
      RETURN_IF_ERROR(NnLinearFwd(qkv.v_w, qkv.v_b, C_, K, a.attn_in, a.v.data()));
      if (spec_.qk_norm && !adapted) RETURN_IF_ERROR(head_norms());
      RETURN_IF_ERROR(access.End());
    }
    if (adapted) {
      ASSIGN_OR_RETURN(ScopedAccess access,
                       ScopedAccess::Begin(ctx_, qkv.lora_op(), Stage::kForward));
      if (qkv.q_lora.present()) {
        RETURN_IF_ERROR(AdapterForward(qkv.q_lora, C_, Q, a.attn_in, a.q.data(), a.lh_q));
      }
      if (qkv.k_lora.present()) {
        RETURN_IF_ERROR(AdapterForward(qkv.k_lora, C_, K, a.attn_in, a.k.data(), a.lh_k));
      }
      if (qkv.v_lora.present()) {
        RETURN_IF_ERROR(AdapterForward(qkv.v_lora, C_, K, a.attn_in, a.v.data(), a.lh_v));
      }
      RETURN_IF_ERROR(access.End());
      if (spec_.qk_norm) {
        // The norms read the adapted projections: the q/k/v operator's second access.
        ASSIGN_OR_RETURN(ScopedAccess again, ScopedAccess::Begin(ctx_, qkv.op, Stage::kForward));
        RETURN_IF_ERROR(head_norms());
        RETURN_IF_ERROR(again.End());
      }
    }
  }
  const QkvPointers qkv = Qkv(a);
  if (rope(layer)) {
    const RopeShape qs{B_, T_, m_.num_heads, D, T_, spec_.rotary_dim};
    const RopeShape ks{B_, T_, m_.num_kv_heads, D, T_, spec_.rotary_dim};
    RETURN_IF_ERROR(ctx_->Compute([&](Kernels& k, Stream& s) {
      RETURN_IF_ERROR(
          k.RopeForward(s, qs, rope_cos(layer), rope_sin(layer), qkv.q, positions_dev()));
      return k.RopeForward(s, ks, rope_cos(layer), rope_sin(layer), qkv.k, positions_dev());
    }));
  }
  {
    const GqaAttentionShape att = AttentionShape(layer);
    ASSIGN_OR_RETURN(a.atty, Alloc(N_ * Q, false));
    ASSIGN_OR_RETURN(a.lse, Alloc(B_ * m_.num_heads * T_, false));
    const int64_t ws_bytes = ctx_->workspaces().GqaAttentionForwardWorkspaceBytes(att);
    ASSIGN_OR_RETURN(Buffer ws, Workspace(ws_bytes));
    RETURN_IF_ERROR(ctx_->Compute([&](Kernels& k, Stream& s) {
      return k.GqaAttentionForward(s, att, qkv.q, qkv.k, qkv.v, a.atty.data(), a.lse.data(),
                                   ws.data(), ws_bytes, key_start_dev());
    }));
  }
  if (post) {
    // res2 = in + ln_1(attention projection(atty)) (Gemma: ln_1_post); the projection is kept as
    // the norm's input, and the MLP reads res2 itself (Gemma: ln_2(res2)).
    ASSIGN_OR_RETURN(a.attn_o, Alloc(N_ * C_, false));
    RETURN_IF_ERROR(LinearForward(ops.attn_out, Q, C_, a.atty.data(), a.attn_o.data(), a.lh_o));
    RETURN_IF_ERROR(NormForward(*pn.attn, a.attn_o.data(), a.res2, *pn.attn_mean, *pn.attn_rstd));
    RETURN_IF_ERROR(Residual(in, a.res2));
    if (pre) {
      RETURN_IF_ERROR(NormForward(ops.ln_2, a.res2.data(), a.ln2, a.ln2_mean, a.ln2_rstd));
    }
    a.mlp_in = pre ? a.ln2.data() : a.res2.data();
  } else {
    // res2 = in + attention projection(atty), computed in place of the projection.
    ASSIGN_OR_RETURN(a.res2, Alloc(N_ * C_, false));
    RETURN_IF_ERROR(LinearForward(ops.attn_out, Q, C_, a.atty.data(), a.res2.data(), a.lh_o));
    RETURN_IF_ERROR(Residual(in, a.res2));
    RETURN_IF_ERROR(NormForward(ops.ln_2, a.res2.data(), a.ln2, a.ln2_mean, a.ln2_rstd));
    a.mlp_in = a.ln2.data();
  }
  ASSIGN_OR_RETURN(a.fch, Alloc(N_ * I, false));
  RETURN_IF_ERROR(LinearForward(ops.mlp_in, C_, I, a.mlp_in, a.fch.data(), a.lh_in));
  if (swiglu()) {
    ASSIGN_OR_RETURN(a.up, Alloc(N_ * I, false));
    RETURN_IF_ERROR(LinearForward(ops.mlp_up, C_, I, a.mlp_in, a.up.data(), a.lh_up));
  }
  ASSIGN_OR_RETURN(a.act, Alloc(N_ * I, false));
  RETURN_IF_ERROR(ctx_->Compute([&](Kernels& k, Stream& s) {
    if (swiglu()) {
      return k.SwiGluForward(s, N_ * I, a.fch.data(), a.up.data(), a.act.data(), spec_.gate);
    }
    return k.GeluForward(s, N_ * I, a.fch.data(), a.act.data());
  }));
  if (post) {
    // out = res2 + ln_2(MLP projection(act)); the projection is kept as the norm's input (and,
    // recomputing, the norm's statistics are what backward needs; its output is discarded).
    ASSIGN_OR_RETURN(a.mlp_o, Alloc(N_ * C_, false));
    RETURN_IF_ERROR(LinearForward(ops.mlp_out, I, C_, a.act.data(), a.mlp_o.data(), a.lh_out));
    RETURN_IF_ERROR(NormForward(*pn.mlp, a.mlp_o.data(), out, *pn.mlp_mean, *pn.mlp_rstd));
    if (recompute) {
      out.Reset();
      return absl::OkStatus();
    }
    return Residual(a.res2.data(), out);
  }
  if (recompute) {
    // The block's output is not needed again, but an adapter on the MLP's output projection
    // needs its h = A drop(act) in backward: recomputed in the adapter's own access, with the
    // same kernel on the same input (bit for bit), its output discarded.
    if (!ops.mlp_out.lora.present()) return absl::OkStatus();
    ASSIGN_OR_RETURN(Buffer discarded, Alloc(N_ * C_, true));
    ASSIGN_OR_RETURN(ScopedAccess access,
                     ScopedAccess::Begin(ctx_, ops.mlp_out.lora.op, Stage::kForward));
    RETURN_IF_ERROR(
        AdapterForward(ops.mlp_out.lora, I, C_, a.act.data(), discarded.data(), a.lh_out));
    return access.End();
  }
  // out = res2 + MLP projection(act), in place of the projection.
  ASSIGN_OR_RETURN(out, Alloc(N_ * C_, false));
  RETURN_IF_ERROR(LinearForward(ops.mlp_out, I, C_, a.act.data(), out.data(), a.lh_out));
  return Residual(a.res2.data(), out);
}

// The backward of a block, in the parts below. Every buffer is freed at the statement that frees
// it in the forward's reverse (an explicit Reset() or a move that replaces it), never by falling
// out of scope on the success path: the order of these frees (and of the allocations between them)
// is the tide the memory plan replays. The activation profile records it by running this very
// code over its RecordingContext (model/gpt_activation_profile.cc: FreeScratch becomes the
// profile's Free event), and PlanMemory (scheduler/memory_plan.h) replays those events through a
// CachingAllocator to predict accelerator memory before the run allocates anything. Reordering a
// free here changes the plan; trainer/activation_profile_match_test holds the live tide equal to
// the replayed one.
absl::Status TransformerProgram::Run::BlockBackward(int64_t layer, BlockActs& a, Buffer& in,
                                                    Buffer& dres) {
  const Block& ops = p_.layout_.blocks[static_cast<size_t>(layer)];
  const bool pre = !spec_.post_norms;
  const bool post = spec_.post_norms || spec_.sandwich_norms;
  const PostNorms pn = PostNormsOf(ops, a);
  // out = res2 + mlp(ln_2(res2)), or (post norms) res2 + ln_2(mlp(res2)), or (sandwich norms)
  // res2 + ln_2_post(mlp(ln_2(res2)))
  ASSIGN_OR_RETURN(Buffer dres2, Alloc(N_ * C_, true));
  ASSIGN_OR_RETURN(Buffer dmlp_out, Alloc(N_ * C_, true));
  RETURN_IF_ERROR(ResidualBwd(dres, dres2, dmlp_out));
  dres.Reset();
  if (post) {
    // dmlp_out holds d(ln_2's output): through the norm to d(the MLP's output).
    Buffer dnorm = std::move(dmlp_out);
    ASSIGN_OR_RETURN(dmlp_out, Alloc(N_ * C_, true));
    RETURN_IF_ERROR(NormBackward(*pn.mlp, a.mlp_o.data(), *pn.mlp_mean, *pn.mlp_rstd, dnorm.data(),
                                 dmlp_out.data()));
    dnorm.Reset();
    a.mlp_o.Reset();
    if (spec_.sandwich_norms) {
      a.ln2p_mean.Reset();
      a.ln2p_rstd.Reset();
    }
  }
  ASSIGN_OR_RETURN(Buffer dln2, MlpBackward(ops, a, dmlp_out));
  if (!pre) {
    RETURN_IF_ERROR(Residual(dln2.data(), dres2));  // the MLP read res2 itself
  } else {
    RETURN_IF_ERROR(
        NormBackward(ops.ln_2, a.res2.data(), a.ln2_mean, a.ln2_rstd, dln2.data(), dres2.data()));
  }
  dln2.Reset();
  a.res2.Reset();
  a.ln2_mean.Reset();
  a.ln2_rstd.Reset();
  // res2 = in + attention(ln_1(in)), or (post norms) in + ln_1(attention(in))
  ASSIGN_OR_RETURN(Buffer din, Alloc(N_ * C_, true));
  ASSIGN_OR_RETURN(Buffer dattn_out, Alloc(N_ * C_, true));
  RETURN_IF_ERROR(ResidualBwd(dres2, din, dattn_out));
  dres2.Reset();
  if (post) {
    Buffer dnorm = std::move(dattn_out);
    ASSIGN_OR_RETURN(dattn_out, Alloc(N_ * C_, true));
    RETURN_IF_ERROR(NormBackward(*pn.attn, a.attn_o.data(), *pn.attn_mean, *pn.attn_rstd,
                                 dnorm.data(), dattn_out.data()));
    dnorm.Reset();
    a.attn_o.Reset();
    if (spec_.sandwich_norms) {
      a.ln1p_mean.Reset();
      a.ln1p_rstd.Reset();
    }
  }
  ASSIGN_OR_RETURN(Buffer dln1, AttentionBackward(layer, ops, a, dattn_out));
  a.ln1.Reset();
  if (!pre) {
    RETURN_IF_ERROR(Residual(dln1.data(), din));  // the attention read the block's input itself
  } else {
    RETURN_IF_ERROR(
        NormBackward(ops.ln_1, in.data(), a.ln1_mean, a.ln1_rstd, dln1.data(), din.data()));
  }
  dln1.Reset();
  in.Reset();
  a.Reset();
  dres = std::move(din);
  return absl::OkStatus();
}

absl::StatusOr<Buffer> TransformerProgram::Run::MlpBackward(const Block& ops, BlockActs& a,
                                                            Buffer& dmlp_out) {
  const int64_t I = m_.intermediate_size;
  ASSIGN_OR_RETURN(Buffer dact, Alloc(N_ * I, true));
  RETURN_IF_ERROR(
      LinearBackward(ops.mlp_out, I, C_, a.act.data(), dmlp_out.data(), dact.data(), a.lh_out));
  dmlp_out.Reset();
  a.act.Reset();
  // d(fch) (and d(up)) from d(act).
  ASSIGN_OR_RETURN(Buffer dfch, Alloc(N_ * I, true));
  Buffer dup;
  if (swiglu()) {
    ASSIGN_OR_RETURN(dup, Alloc(N_ * I, true));
  }
  RETURN_IF_ERROR(ctx_->Compute([&](Kernels& k, Stream& s) {
    if (swiglu()) {
      return k.SwiGluBackward(s, N_ * I, a.fch.data(), a.up.data(), dact.data(), dfch.data(),
                              dup.data(), spec_.gate);
    }
    return k.GeluBackward(s, N_ * I, a.fch.data(), dact.data(), dfch.data());
  }));
  dact.Reset();
  a.fch.Reset();
  a.up.Reset();
  ASSIGN_OR_RETURN(Buffer dln2, Alloc(N_ * C_, true));
  RETURN_IF_ERROR(
      LinearBackward(ops.mlp_in, C_, I, a.mlp_in, dfch.data(), dln2.data(), a.lh_in));
  dfch.Reset();
  if (swiglu()) {
    RETURN_IF_ERROR(
        LinearBackward(ops.mlp_up, C_, I, a.mlp_in, dup.data(), dln2.data(), a.lh_up));
    dup.Reset();
  }
  a.ln2.Reset();
  return dln2;
}

absl::StatusOr<Buffer> TransformerProgram::Run::AttentionBackward(int64_t layer, const Block& ops,
                                                                  BlockActs& a,
                                                                  Buffer& dattn_out) {
  const int64_t Q = m_.q_size(), K = m_.kv_size();
  const int64_t D = m_.head_dim;
  ASSIGN_OR_RETURN(Buffer datty, Alloc(N_ * Q, true));
  RETURN_IF_ERROR(
      LinearBackward(ops.attn_out, Q, C_, a.atty.data(), dattn_out.data(), datty.data(), a.lh_o));
  dattn_out.Reset();
  // d(q), d(k), d(v): in the fused projection's rows, or their own buffers.
  QkvGrads g;
  if (fused_qkv()) {
    ASSIGN_OR_RETURN(g.qkv, Alloc(N_ * (Q + 2 * K), true));
    g.d = {g.qkv.data(), g.qkv.data() + Q, g.qkv.data() + Q + K};
  } else {
    ASSIGN_OR_RETURN(g.q, Alloc(N_ * Q, true));
    ASSIGN_OR_RETURN(g.k, Alloc(N_ * K, true));
    ASSIGN_OR_RETURN(g.v, Alloc(N_ * K, true));
    g.d = {g.q.data(), g.k.data(), g.v.data()};
  }
  RETURN_IF_ERROR(ScoresBackward(layer, a, datty, g.d));
  datty.Reset();
  a.atty.Reset();
  a.lse.Reset();
  a.qkv.Reset();
  a.q.Reset();
  a.k.Reset();
  a.v.Reset();
  if (rope(layer)) {
    const RopeShape qs{B_, T_, m_.num_heads, D, T_, spec_.rotary_dim};
    const RopeShape ks{B_, T_, m_.num_kv_heads, D, T_, spec_.rotary_dim};
    RETURN_IF_ERROR(ctx_->Compute([&](Kernels& k, Stream& s) {
      RETURN_IF_ERROR(
          k.RopeBackward(s, qs, rope_cos(layer), rope_sin(layer), g.d.q, positions_dev()));
      return k.RopeBackward(s, ks, rope_cos(layer), rope_sin(layer), g.d.k, positions_dev());
    }));
  }
  ASSIGN_OR_RETURN(Buffer dln1, Alloc(N_ * C_, true));
  if (fused_qkv()) {
    RETURN_IF_ERROR(
        LinearBackward(ops.qkv, C_, Q + 2 * K, a.attn_in, g.d.q, dln1.data(), a.lh_qkv));
    g.qkv.Reset();
  } else {
    RETURN_IF_ERROR(SplitQkvBackward(ops.qkv_split, a, g, dln1.data()));
  }
  return dln1;
}

absl::Status TransformerProgram::Run::ScoresBackward(int64_t layer, const BlockActs& a,
                                                     const Buffer& datty,
                                                     const QkvPointers& d) {
  const GqaAttentionShape att = AttentionShape(layer);
  const QkvPointers qkv = Qkv(a);
  const int64_t ws_bytes = ctx_->workspaces().GqaAttentionBackwardWorkspaceBytes(att);
  ASSIGN_OR_RETURN(Buffer ws, Workspace(ws_bytes));
  return ctx_->Compute([&](Kernels& k, Stream& s) {
    return k.GqaAttentionBackward(s, att, qkv.q, qkv.k, qkv.v, a.atty.data(), a.lse.data(),
                                  datty.data(), d.q, d.k, d.v, ws.data(), ws_bytes,
                                  key_start_dev());
  });
}

absl::Status TransformerProgram::Run::SplitQkvBackward(const ProgramLayout::QkvOp& qkv,
                                                       BlockActs& a, QkvGrads& g, float* dln1) {
  const int64_t Q = m_.q_size(), K = m_.kv_size();
  {
    ASSIGN_OR_RETURN(ScopedAccess access, ScopedAccess::Begin(ctx_, qkv.op, Stage::kBackward));
    if (spec_.qk_norm) {
      // d(q) and d(k) become the gradients of the projections, through the norms.
      RETURN_IF_ERROR(
          HeadNormBackward(qkv.q_norm, qkv.trainable, m_.num_heads, a.q_in, a.q_rstd, g.q));
      RETURN_IF_ERROR(
          HeadNormBackward(qkv.k_norm, qkv.trainable, m_.num_kv_heads, a.k_in, a.k_rstd, g.k));
      g.d.q = g.q.data();
      g.d.k = g.k.data();
      a.q_in.Reset();
      a.k_in.Reset();
      a.q_rstd.Reset();
      a.k_rstd.Reset();
    }
    // Each projection's gradient is freed once nothing needs it (its adapter's backward
    // comes after this access).
    RETURN_IF_ERROR(NnLinearBwd(qkv.q_w, qkv.q_b, qkv.trainable, C_, Q, a.attn_in, g.d.q, dln1));
    if (!qkv.q_lora.present()) g.q.Reset();
    RETURN_IF_ERROR(NnLinearBwd(qkv.k_w, qkv.k_b, qkv.trainable, C_, K, a.attn_in, g.d.k, dln1));
    if (!qkv.k_lora.present()) g.k.Reset();
    RETURN_IF_ERROR(NnLinearBwd(qkv.v_w, qkv.v_b, qkv.trainable, C_, K, a.attn_in, g.d.v, dln1));
    if (!qkv.v_lora.present()) g.v.Reset();
    RETURN_IF_ERROR(access.End());
  }
  if (qkv.lora_op() < 0) return absl::OkStatus();
  return QkvAdaptersBackward(qkv, a, g, dln1);
}

absl::Status TransformerProgram::Run::QkvAdaptersBackward(const ProgramLayout::QkvOp& qkv,
                                                          BlockActs& a, QkvGrads& g, float* dln1) {
  const int64_t Q = m_.q_size(), K = m_.kv_size();
  ASSIGN_OR_RETURN(ScopedAccess access, ScopedAccess::Begin(ctx_, qkv.lora_op(), Stage::kBackward));
  if (qkv.q_lora.present()) {
    RETURN_IF_ERROR(AdapterBackward(qkv.q_lora, C_, Q, a.attn_in, a.lh_q, g.d.q, dln1));
  }
  if (qkv.k_lora.present()) {
    RETURN_IF_ERROR(AdapterBackward(qkv.k_lora, C_, K, a.attn_in, a.lh_k, g.d.k, dln1));
  }
  if (qkv.v_lora.present()) {
    RETURN_IF_ERROR(AdapterBackward(qkv.v_lora, C_, K, a.attn_in, a.lh_v, g.d.v, dln1));
  }
  RETURN_IF_ERROR(access.End());
  g.q.Reset();
  g.k.Reset();
  g.v.Reset();
  return absl::OkStatus();
}

}  // namespace ps
