#include "model/transformer_program.h"

#include <algorithm>
#include <cstdint>
#include <cstring>
#include <optional>
#include <utility>
#include <vector>

#include "absl/strings/match.h"
#include "base/splitmix64.h"
#include "base/status_macros.h"
#include "base/units.h"
#include "glog/logging.h"
#include "memory/dtype.h"
#include "model/internal/program_buffers.h"
#include "model/kernels/rope.h"

namespace ps {
namespace {

using Block = ProgramLayout::Block;
using Lora = ProgramLayout::Lora;
using Op = ProgramLayout::Op;
using VocabBlock = ProgramLayout::VocabBlock;
using program_internal::Activations;
using program_internal::BlockActs;
using program_internal::Buffer;
using program_internal::ScopedAccess;

// What a pass keeps: everything for backward, one block's worth (activation checkpointing) or
// nothing beyond the block being computed (evaluation).
enum class Mode { kTrain, kCheckpoint, kEvaluate };

template <typename T>
absl::Span<const char> Bytes(absl::Span<const T> s) {
  return absl::Span<const char>(reinterpret_cast<const char*>(s.data()), s.size() * sizeof(T));
}

}  // namespace

// One pass of the program over a context.
class TransformerProgram::Run {
 public:
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

  absl::StatusOr<double> ForwardBackward(const ProgramInputs& in, double loss_scale) {
    training_ = true;
    dropout_seed_ = in.dropout_seed;
    Activations acts;
    const Mode mode = s_.activation_checkpointing ? Mode::kCheckpoint : Mode::kTrain;
    ASSIGN_OR_RETURN(const double loss, Forward(in, mode, acts));
    RETURN_IF_ERROR(Backward(in, loss_scale, acts));
    return loss;
  }
  absl::StatusOr<double> Evaluate(const ProgramInputs& in) {
    Activations acts;
    return Forward(in, Mode::kEvaluate, acts);
  }

 private:
  // --- Buffers and parameter slots ------------------------------------------------------------

  // f32 scratch of `elems` elements, zeroed if asked.
  absl::StatusOr<Buffer> Alloc(int64_t elems, bool zero) {
    ASSIGN_OR_RETURN(float* p, ctx_->AllocateScratch(elems));
    Buffer buffer(ctx_, p, elems);
    if (zero) {
      RETURN_IF_ERROR(ctx_->Compute([&](Kernels& k, Stream& s) {
        return k.Zero(s, p, elems * static_cast<int64_t>(sizeof(float)));
      }));
    }
    return buffer;
  }
  // A kernel workspace of `bytes` as the workspace query answered (no allocation for 0).
  absl::StatusOr<Buffer> Workspace(int64_t bytes) {
    if (bytes == 0) return Buffer();
    return Alloc(CeilDiv(bytes, static_cast<int64_t>(sizeof(float))), false);
  }
  // The parameter's values as f32: the slot itself (f32 chunks) or a converted copy.
  absl::StatusOr<Buffer> ParamF32(TensorId tensor, absl::Span<const float>* values) {
    ASSIGN_OR_RETURN(const TensorView v, ctx_->Param(tensor));
    if (v.dtype == DType::kF32) {
      *values =
          absl::Span<const float>(static_cast<const float*>(v.data), static_cast<size_t>(v.numel));
      return Buffer();
    }
    ASSIGN_OR_RETURN(Buffer buffer, Alloc(v.numel, /*zero=*/false));
    RETURN_IF_ERROR(ctx_->Compute([&](Kernels& k, Stream& s) {
      return k.Convert(s, v.dtype, v.data, DType::kF32, buffer.data(), v.numel);
    }));
    *values = absl::Span<const float>(buffer.data(), static_cast<size_t>(v.numel));
    return buffer;
  }
  // The slot as bf16 bit patterns (read in place by the bf16 GEMMs) if its dtype is bf16.
  absl::StatusOr<const uint16_t*> ParamBf16(TensorId tensor) {
    ASSIGN_OR_RETURN(const TensorView v, ctx_->Param(tensor));
    return v.dtype == DType::kBF16 ? static_cast<const uint16_t*>(v.data) : nullptr;
  }
  // An f32 gradient into the tensor's param slot (converted to the slot's dtype).
  absl::Status WriteGrad(TensorId tensor, const Buffer& grad) {
    ASSIGN_OR_RETURN(const TensorView v, ctx_->Param(tensor));
    CHECK_EQ(v.numel, grad.elems());
    return ctx_->Compute([&](Kernels& k, Stream& s) {
      return k.Convert(s, DType::kF32, grad.data(), v.dtype, v.data, v.numel);
    });
  }
  // `rows` rows of f32 gradient into rows [first_row, first_row + rows) of a [*, C] slot.
  absl::Status WriteGradRows(TensorId tensor, int64_t first_row, int64_t rows, const float* grad) {
    ASSIGN_OR_RETURN(const TensorView v, ctx_->Param(tensor));
    CHECK_LE((first_row + rows) * C_, v.numel);
    return ctx_->Compute([&](Kernels& k, Stream& s) {
      return k.Convert(s, DType::kF32, grad, v.dtype,
                       static_cast<char*>(v.data) + first_row * C_ * SizeOf(v.dtype), rows * C_);
    });
  }

  // --- Linears and norms ---------------------------------------------------------------------

  // y = x W (+ b) of a Conv1D ([in, out]) operator: accesses it; bf16 weights read in place.
  absl::Status ConvLinearForward(const Op& op, int64_t in_features, int64_t out_features,
                                 const float* x, float* y) {
    ASSIGN_OR_RETURN(ScopedAccess access, ScopedAccess::Begin(ctx_, op.op, Stage::kForward));
    const MatmulShape shape{N_, in_features, out_features};
    absl::Span<const float> w, b;
    ASSIGN_OR_RETURN(const uint16_t* w_bf16, ParamBf16(op.w));
    if (w_bf16 != nullptr) {
      ASSIGN_OR_RETURN(Buffer b_f32, ParamF32(op.b, &b));
      const int64_t ws_bytes = ctx_->workspaces().MatmulBf16ForwardWorkspaceBytes(shape);
      ASSIGN_OR_RETURN(Buffer ws, Workspace(ws_bytes));
      RETURN_IF_ERROR(ctx_->Compute([&](Kernels& k, Stream& s) {
        return k.MatmulForwardBf16(s, shape, x, w_bf16, b.data(), y, ws.data(), ws_bytes);
      }));
      return access.End();
    }
    ASSIGN_OR_RETURN(Buffer w_f32, ParamF32(op.w, &w));
    ASSIGN_OR_RETURN(Buffer b_f32, ParamF32(op.b, &b));
    const int64_t ws_bytes = ctx_->workspaces().MatmulWorkspaceBytes(shape);
    ASSIGN_OR_RETURN(Buffer ws, Workspace(ws_bytes));
    RETURN_IF_ERROR(ctx_->Compute([&](Kernels& k, Stream& s) {
      return k.MatmulForward(s, shape, x, w.data(), b.data(), y, ws.data(), ws_bytes);
    }));
    w_f32.Reset();
    b_f32.Reset();
    return access.End();
  }
  // dx += dy W^T of a Conv1D operator; its weight's and bias's gradients into their slots.
  // A frozen operator gets only dx.
  absl::Status ConvLinearBackward(const Op& op, int64_t in_features, int64_t out_features,
                                  const float* x, const float* dy, float* dx) {
    Buffer dw, db;
    if (op.trainable) {
      ASSIGN_OR_RETURN(dw, Alloc(in_features * out_features, true));
      ASSIGN_OR_RETURN(db, Alloc(out_features, true));
    }
    ASSIGN_OR_RETURN(ScopedAccess access, ScopedAccess::Begin(ctx_, op.op, Stage::kBackward));
    const MatmulShape shape{N_, in_features, out_features};
    ASSIGN_OR_RETURN(const uint16_t* w_bf16, ParamBf16(op.w));
    if (w_bf16 != nullptr) {
      const int64_t ws_bytes = ctx_->workspaces().MatmulBf16BackwardWorkspaceBytes(shape);
      ASSIGN_OR_RETURN(Buffer ws, Workspace(ws_bytes));
      RETURN_IF_ERROR(ctx_->Compute([&](Kernels& k, Stream& s) {
        return k.MatmulBackwardBf16(s, shape, x, w_bf16, dy, dx, dw.data(), db.data(), ws.data(),
                                    ws_bytes);
      }));
    } else {
      absl::Span<const float> w;
      ASSIGN_OR_RETURN(Buffer w_f32, ParamF32(op.w, &w));
      const int64_t ws_bytes = ctx_->workspaces().MatmulWorkspaceBytes(shape);
      ASSIGN_OR_RETURN(Buffer ws, Workspace(ws_bytes));
      RETURN_IF_ERROR(ctx_->Compute([&](Kernels& k, Stream& s) {
        return k.MatmulBackward(s, shape, x, w.data(), dy, dx, dw.data(), db.data(), ws.data(),
                                ws_bytes);
      }));
    }
    // This is the operator's only backward use: its slots take the gradients now.
    if (op.trainable) {
      RETURN_IF_ERROR(WriteGrad(op.w, dw));
      RETURN_IF_ERROR(WriteGrad(op.b, db));
    }
    return access.End();
  }
  // y = x W^T (+ b) of an nn.Linear ([out, in]) inside the caller's access of its operator; the
  // weights are read as f32.
  absl::Status NnLinearFwd(TensorId w, TensorId b, int64_t in_features, int64_t out_features,
                           const float* x, float* y) {
    absl::Span<const float> wv, bv;
    ASSIGN_OR_RETURN(Buffer w_f32, ParamF32(w, &wv));
    Buffer b_f32;
    if (b >= 0) {
      ASSIGN_OR_RETURN(b_f32, ParamF32(b, &bv));
    }
    const LinearShape shape{N_, in_features, out_features, b >= 0};
    const int64_t ws_bytes = ctx_->workspaces().LinearWorkspaceBytes(shape);
    ASSIGN_OR_RETURN(Buffer ws, Workspace(ws_bytes));
    return ctx_->Compute([&](Kernels& k, Stream& s) {
      return k.LinearForward(s, shape, x, wv.data(), b >= 0 ? bv.data() : nullptr, y, ws.data(),
                             ws_bytes);
    });
  }
  // dx += dy W of an nn.Linear inside the caller's access; its gradients into their slots
  // (`trainable`), or none (frozen).
  absl::Status NnLinearBwd(TensorId w, TensorId b, bool trainable, int64_t in_features,
                           int64_t out_features, const float* x, const float* dy, float* dx) {
    Buffer dw, db;
    if (trainable) {
      ASSIGN_OR_RETURN(dw, Alloc(in_features * out_features, true));
      if (b >= 0) {
        ASSIGN_OR_RETURN(db, Alloc(out_features, true));
      }
    }
    absl::Span<const float> wv;
    ASSIGN_OR_RETURN(Buffer w_f32, ParamF32(w, &wv));
    const LinearShape shape{N_, in_features, out_features, b >= 0};
    const int64_t ws_bytes = ctx_->workspaces().LinearWorkspaceBytes(shape);
    ASSIGN_OR_RETURN(Buffer ws, Workspace(ws_bytes));
    RETURN_IF_ERROR(ctx_->Compute([&](Kernels& k, Stream& s) {
      return k.LinearBackward(s, shape, x, wv.data(), dy, dx, dw.data(), db.data(), ws.data(),
                              ws_bytes);
    }));
    ws.Reset();
    w_f32.Reset();
    if (!trainable) return absl::OkStatus();
    // The weight's only backward use: its slot takes the gradient now.
    RETURN_IF_ERROR(WriteGrad(w, dw));
    if (b >= 0) RETURN_IF_ERROR(WriteGrad(b, db));
    return absl::OkStatus();
  }
  // A linear operator of the block (Conv1D or nn.Linear), accessed around its computation; then
  // its adapter, if any, in its own access (h keeps the adapter's A drop(x)).
  absl::Status LinearForward(const Op& op, int64_t in_features, int64_t out_features,
                             const float* x, float* y, Buffer& h) {
    if (!spec_.linear_out_in) {
      RETURN_IF_ERROR(ConvLinearForward(op, in_features, out_features, x, y));
    } else {
      ASSIGN_OR_RETURN(ScopedAccess access, ScopedAccess::Begin(ctx_, op.op, Stage::kForward));
      RETURN_IF_ERROR(NnLinearFwd(op.w, op.b, in_features, out_features, x, y));
      RETURN_IF_ERROR(access.End());
    }
    if (!op.lora.present()) return absl::OkStatus();
    ASSIGN_OR_RETURN(ScopedAccess access, ScopedAccess::Begin(ctx_, op.lora.op, Stage::kForward));
    RETURN_IF_ERROR(AdapterForward(op.lora, in_features, out_features, x, y, h));
    return access.End();
  }
  // The backward of LinearForward: the operator's (dx only when frozen), then its adapter's
  // (frees h).
  absl::Status LinearBackward(const Op& op, int64_t in_features, int64_t out_features,
                              const float* x, const float* dy, float* dx, Buffer& h) {
    if (!spec_.linear_out_in) {
      RETURN_IF_ERROR(ConvLinearBackward(op, in_features, out_features, x, dy, dx));
    } else {
      ASSIGN_OR_RETURN(ScopedAccess access, ScopedAccess::Begin(ctx_, op.op, Stage::kBackward));
      RETURN_IF_ERROR(NnLinearBwd(op.w, op.b, op.trainable, in_features, out_features, x, dy, dx));
      RETURN_IF_ERROR(access.End());
    }
    if (!op.lora.present()) return absl::OkStatus();
    ASSIGN_OR_RETURN(ScopedAccess access, ScopedAccess::Begin(ctx_, op.lora.op, Stage::kBackward));
    RETURN_IF_ERROR(AdapterBackward(op.lora, in_features, out_features, x, h, dy, dx));
    return access.End();
  }

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
                                            Buffer& dropped) {
    if (!dropout()) return x;
    ASSIGN_OR_RETURN(dropped, Alloc(N_ * in_features, false));
    RETURN_IF_ERROR(ctx_->Compute([&](Kernels& k, Stream& s) {
      return k.DropoutForward(s, N_ * in_features, s_.lora_dropout, DropoutSeed(l), x,
                              dropped.data());
    }));
    return static_cast<const float*>(dropped.data());
  }
  // y += scale * B (A drop(x)), keeping h = A drop(x) [N, rank].
  absl::Status AdapterForward(const Lora& l, int64_t in_features, int64_t out_features,
                              const float* x, float* y, Buffer& h) {
    Buffer dropped;
    ASSIGN_OR_RETURN(const float* xin, AdapterInput(l, in_features, x, dropped));
    ASSIGN_OR_RETURN(h, Alloc(N_ * l.rank, false));
    absl::Span<const float> a, b;
    ASSIGN_OR_RETURN(Buffer a_f32, ParamF32(l.a, &a));
    ASSIGN_OR_RETURN(Buffer b_f32, ParamF32(l.b, &b));
    const LoraShape shape = LoraShapeOf(l, in_features, out_features);
    const int64_t ws_bytes = ctx_->workspaces().LoraForwardWorkspaceBytes(shape);
    ASSIGN_OR_RETURN(Buffer ws, Workspace(ws_bytes));
    return ctx_->Compute([&](Kernels& k, Stream& s) {
      return k.LoraForward(s, shape, xin, a.data(), b.data(), h.data(), y, ws.data(), ws_bytes);
    });
  }
  // dx += the adapter's part of the input gradient from dy; dA and dB into their slots (the
  // adapter operator's only backward use). Frees h.
  absl::Status AdapterBackward(const Lora& l, int64_t in_features, int64_t out_features,
                               const float* x, Buffer& h, const float* dy, float* dx) {
    ASSIGN_OR_RETURN(Buffer da, Alloc(l.rank * in_features, true));
    ASSIGN_OR_RETURN(Buffer db, Alloc(out_features * l.rank, true));
    Buffer dropped, ddropped;
    ASSIGN_OR_RETURN(const float* xin, AdapterInput(l, in_features, x, dropped));
    float* dxin = dx;
    if (dropout()) {
      ASSIGN_OR_RETURN(ddropped, Alloc(N_ * in_features, true));
      dxin = ddropped.data();
    }
    absl::Span<const float> a, b;
    ASSIGN_OR_RETURN(Buffer a_f32, ParamF32(l.a, &a));
    ASSIGN_OR_RETURN(Buffer b_f32, ParamF32(l.b, &b));
    const LoraShape shape = LoraShapeOf(l, in_features, out_features);
    const int64_t ws_bytes = ctx_->workspaces().LoraBackwardWorkspaceBytes(shape);
    ASSIGN_OR_RETURN(Buffer ws, Workspace(ws_bytes));
    RETURN_IF_ERROR(ctx_->Compute([&](Kernels& k, Stream& s) {
      RETURN_IF_ERROR(k.LoraBackward(s, shape, xin, a.data(), b.data(), h.data(), dy, dxin,
                                     da.data(), db.data(), ws.data(), ws_bytes));
      if (!dropout()) return absl::OkStatus();
      return k.DropoutBackward(s, N_ * in_features, s_.lora_dropout, DropoutSeed(l),
                               ddropped.data(), dx);
    }));
    ws.Reset();
    a_f32.Reset();
    b_f32.Reset();
    dropped.Reset();
    ddropped.Reset();
    h.Reset();
    RETURN_IF_ERROR(WriteGrad(l.a, da));
    return WriteGrad(l.b, db);
  }

  bool layer_norm() const { return spec_.norm == TransformerBlockSpec::Norm::kLayerNorm; }
  // y = norm(x): LayerNorm (weight, bias; keeps mean and rstd) or RMSNorm (weight; keeps rstd).
  absl::Status NormForward(const Op& op, const float* x, Buffer& y, Buffer& mean, Buffer& rstd) {
    const int64_t n = N_, c = C_;
    ASSIGN_OR_RETURN(y, Alloc(n * c, false));
    if (layer_norm()) {
      ASSIGN_OR_RETURN(mean, Alloc(n, false));
    }
    ASSIGN_OR_RETURN(rstd, Alloc(n, false));
    ASSIGN_OR_RETURN(ScopedAccess access, ScopedAccess::Begin(ctx_, op.op, Stage::kForward));
    absl::Span<const float> w, b;
    ASSIGN_OR_RETURN(Buffer w_f32, ParamF32(op.w, &w));
    Buffer b_f32;
    if (layer_norm()) {
      ASSIGN_OR_RETURN(b_f32, ParamF32(op.b, &b));
    }
    RETURN_IF_ERROR(ctx_->Compute([&](Kernels& k, Stream& s) {
      if (layer_norm()) {
        return k.LayerNormForward(s, {n, c}, x, w.data(), b.data(), y.data(), mean.data(),
                                  rstd.data());
      }
      return k.RmsNormForward(s, {n, c, m_.norm_eps}, x, w.data(), y.data(), rstd.data());
    }));
    w_f32.Reset();
    b_f32.Reset();
    return access.End();
  }
  // dx += the norm's input gradient from dy; its parameters' gradients into their slots.
  // A frozen norm gets only dx.
  absl::Status NormBackward(const Op& op, const float* x, const Buffer& mean, const Buffer& rstd,
                            const float* dy, float* dx) {
    const int64_t n = N_, c = C_;
    Buffer dw, db;
    if (op.trainable) {
      ASSIGN_OR_RETURN(dw, Alloc(c, true));
      if (layer_norm()) {
        ASSIGN_OR_RETURN(db, Alloc(c, true));
      }
    }
    ASSIGN_OR_RETURN(ScopedAccess access, ScopedAccess::Begin(ctx_, op.op, Stage::kBackward));
    absl::Span<const float> w;
    ASSIGN_OR_RETURN(Buffer w_f32, ParamF32(op.w, &w));
    RETURN_IF_ERROR(ctx_->Compute([&](Kernels& k, Stream& s) {
      if (layer_norm()) {
        return k.LayerNormBackward(s, {n, c}, x, w.data(), mean.data(), rstd.data(), dy, dx,
                                   dw.data(), db.data());
      }
      return k.RmsNormBackward(s, {n, c, m_.norm_eps}, x, w.data(), rstd.data(), dy, dx, dw.data());
    }));
    w_f32.Reset();
    if (op.trainable) {
      RETURN_IF_ERROR(WriteGrad(op.w, dw));
      if (layer_norm()) RETURN_IF_ERROR(WriteGrad(op.b, db));
    }
    return access.End();
  }

  // y = RMSNorm(x) over each head's head_dim elements (x [N, heads, D]; Qwen3's q_norm, k_norm)
  // with weight `w` [D], inside the caller's access of the q/k/v operator; keeps the rstd.
  absl::Status HeadNormForward(TensorId w, int64_t heads, const Buffer& x, Buffer& y,
                               Buffer& rstd) {
    const RmsNormShape shape{N_ * heads, m_.head_dim, m_.norm_eps};
    ASSIGN_OR_RETURN(y, Alloc(shape.rows * shape.channels, false));
    ASSIGN_OR_RETURN(rstd, Alloc(shape.rows, false));
    absl::Span<const float> wv;
    ASSIGN_OR_RETURN(Buffer w_f32, ParamF32(w, &wv));
    return ctx_->Compute([&](Kernels& k, Stream& s) {
      return k.RmsNormForward(s, shape, x.data(), wv.data(), y.data(), rstd.data());
    });
  }
  // The backward of HeadNormForward: `dy` (the gradient of y) is replaced by the gradient of x;
  // the weight's gradient goes into its slot.
  absl::Status HeadNormBackward(TensorId w, bool trainable, int64_t heads, const Buffer& x,
                                const Buffer& rstd, Buffer& dy) {
    const RmsNormShape shape{N_ * heads, m_.head_dim, m_.norm_eps};
    ASSIGN_OR_RETURN(Buffer dx, Alloc(shape.rows * shape.channels, true));
    Buffer dw;
    if (trainable) {
      ASSIGN_OR_RETURN(dw, Alloc(shape.channels, true));
    }
    absl::Span<const float> wv;
    ASSIGN_OR_RETURN(Buffer w_f32, ParamF32(w, &wv));
    RETURN_IF_ERROR(ctx_->Compute([&](Kernels& k, Stream& s) {
      return k.RmsNormBackward(s, shape, x.data(), wv.data(), rstd.data(), dy.data(), dx.data(),
                               dw.data());
    }));
    w_f32.Reset();
    if (trainable) RETURN_IF_ERROR(WriteGrad(w, dw));
    dy = std::move(dx);
    return absl::OkStatus();
  }

  // --- The block -----------------------------------------------------------------------------

  bool fused_qkv() const { return spec_.attention == TransformerBlockSpec::Attention::kFusedMha; }
  bool rope() const { return spec_.positions == TransformerBlockSpec::Positions::kRope; }
  bool swiglu() const { return spec_.mlp == TransformerBlockSpec::Mlp::kSwiGlu; }
  // Grouped-query attention over q, k, v rows of `stride` elements (the fused projection's packed
  // [q | k | v] rows) or packed rows (0).
  GqaAttentionShape AttentionShape() const {
    const int64_t stride = fused_qkv() ? m_.q_size() + 2 * m_.kv_size() : 0;
    return GqaAttentionShape{.batch = B_,
                             .seq_len = T_,
                             .num_heads = m_.num_heads,
                             .num_kv_heads = m_.num_kv_heads,
                             .head_dim = m_.head_dim,
                             .tile = s_.attention_tile,
                             .q_row_stride = stride,
                             .kv_row_stride = stride};
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
  const float* rope_cos() const { return rope_dev_ + InputsLayout().rope_cos; }
  const float* rope_sin() const { return rope_dev_ + InputsLayout().rope_sin; }
  absl::Status Residual(const float* in, Buffer& out) {
    return ctx_->Compute([&](Kernels& k, Stream& s) {
      return k.ResidualForward(s, out.elems(), in, out.data(), out.data());
    });
  }
  absl::Status ResidualBwd(const Buffer& dout, Buffer& da, Buffer& db) {
    return ctx_->Compute([&](Kernels& k, Stream& s) {
      return k.ResidualBackward(s, dout.elems(), dout.data(), da.data(), db.data());
    });
  }

  // One block from `in`, keeping its activations in `a`. A recompute (activation checkpointing)
  // stops after what the block's backward needs and leaves `out` empty.
  absl::Status BlockForward(int64_t layer, const float* in, bool recompute, BlockActs& a,
                            Buffer& out) {
    const Block& ops = p_.layout_.blocks[static_cast<size_t>(layer)];
    const int64_t Q = m_.q_size(), K = m_.kv_size(), I = m_.intermediate_size;
    const int64_t D = m_.head_dim;
    RETURN_IF_ERROR(NormForward(ops.ln_1, in, a.ln1, a.ln1_mean, a.ln1_rstd));
    if (fused_qkv()) {
      ASSIGN_OR_RETURN(a.qkv, Alloc(N_ * (Q + 2 * K), false));
      RETURN_IF_ERROR(LinearForward(ops.qkv, C_, Q + 2 * K, a.ln1.data(), a.qkv.data(), a.lh_qkv));
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
        RETURN_IF_ERROR(NnLinearFwd(qkv.q_w, qkv.q_b, C_, Q, a.ln1.data(), a.q.data()));
        RETURN_IF_ERROR(NnLinearFwd(qkv.k_w, qkv.k_b, C_, K, a.ln1.data(), a.k.data()));
        RETURN_IF_ERROR(NnLinearFwd(qkv.v_w, qkv.v_b, C_, K, a.ln1.data(), a.v.data()));
        if (spec_.qk_norm && !adapted) RETURN_IF_ERROR(head_norms());
        RETURN_IF_ERROR(access.End());
      }
      if (adapted) {
        ASSIGN_OR_RETURN(ScopedAccess access,
                         ScopedAccess::Begin(ctx_, qkv.lora_op(), Stage::kForward));
        if (qkv.q_lora.present()) {
          RETURN_IF_ERROR(AdapterForward(qkv.q_lora, C_, Q, a.ln1.data(), a.q.data(), a.lh_q));
        }
        if (qkv.k_lora.present()) {
          RETURN_IF_ERROR(AdapterForward(qkv.k_lora, C_, K, a.ln1.data(), a.k.data(), a.lh_k));
        }
        if (qkv.v_lora.present()) {
          RETURN_IF_ERROR(AdapterForward(qkv.v_lora, C_, K, a.ln1.data(), a.v.data(), a.lh_v));
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
    if (rope()) {
      RETURN_IF_ERROR(ctx_->Compute([&](Kernels& k, Stream& s) {
        RETURN_IF_ERROR(
            k.RopeForward(s, {B_, T_, m_.num_heads, D, T_}, rope_cos(), rope_sin(), qkv.q));
        return k.RopeForward(s, {B_, T_, m_.num_kv_heads, D, T_}, rope_cos(), rope_sin(), qkv.k);
      }));
    }
    {
      const GqaAttentionShape att = AttentionShape();
      ASSIGN_OR_RETURN(a.atty, Alloc(N_ * Q, false));
      ASSIGN_OR_RETURN(a.lse, Alloc(B_ * m_.num_heads * T_, false));
      const int64_t ws_bytes = ctx_->workspaces().GqaAttentionForwardWorkspaceBytes(att);
      ASSIGN_OR_RETURN(Buffer ws, Workspace(ws_bytes));
      RETURN_IF_ERROR(ctx_->Compute([&](Kernels& k, Stream& s) {
        return k.GqaAttentionForward(s, att, qkv.q, qkv.k, qkv.v, a.atty.data(), a.lse.data(),
                                     ws.data(), ws_bytes);
      }));
    }
    // res2 = in + attention projection(atty), computed in place of the projection.
    ASSIGN_OR_RETURN(a.res2, Alloc(N_ * C_, false));
    RETURN_IF_ERROR(LinearForward(ops.attn_out, Q, C_, a.atty.data(), a.res2.data(), a.lh_o));
    RETURN_IF_ERROR(Residual(in, a.res2));
    RETURN_IF_ERROR(NormForward(ops.ln_2, a.res2.data(), a.ln2, a.ln2_mean, a.ln2_rstd));
    ASSIGN_OR_RETURN(a.fch, Alloc(N_ * I, false));
    RETURN_IF_ERROR(LinearForward(ops.mlp_in, C_, I, a.ln2.data(), a.fch.data(), a.lh_in));
    if (swiglu()) {
      ASSIGN_OR_RETURN(a.up, Alloc(N_ * I, false));
      RETURN_IF_ERROR(LinearForward(ops.mlp_up, C_, I, a.ln2.data(), a.up.data(), a.lh_up));
    }
    ASSIGN_OR_RETURN(a.act, Alloc(N_ * I, false));
    RETURN_IF_ERROR(ctx_->Compute([&](Kernels& k, Stream& s) {
      if (swiglu()) return k.SwiGluForward(s, N_ * I, a.fch.data(), a.up.data(), a.act.data());
      return k.GeluForward(s, N_ * I, a.fch.data(), a.act.data());
    }));
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

  // Backward through block `layer` from d(output) `dres`, which becomes d(input); frees the
  // block's activations and its input `in`.
  absl::Status BlockBackward(int64_t layer, BlockActs& a, Buffer& in, Buffer& dres) {
    const Block& ops = p_.layout_.blocks[static_cast<size_t>(layer)];
    const int64_t Q = m_.q_size(), K = m_.kv_size(), I = m_.intermediate_size;
    const int64_t D = m_.head_dim;
    // out = res2 + mlp_out
    ASSIGN_OR_RETURN(Buffer dres2, Alloc(N_ * C_, true));
    ASSIGN_OR_RETURN(Buffer dmlp_out, Alloc(N_ * C_, true));
    RETURN_IF_ERROR(ResidualBwd(dres, dres2, dmlp_out));
    dres.Reset();
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
                                dup.data());
      }
      return k.GeluBackward(s, N_ * I, a.fch.data(), dact.data(), dfch.data());
    }));
    dact.Reset();
    a.fch.Reset();
    a.up.Reset();
    ASSIGN_OR_RETURN(Buffer dln2, Alloc(N_ * C_, true));
    RETURN_IF_ERROR(
        LinearBackward(ops.mlp_in, C_, I, a.ln2.data(), dfch.data(), dln2.data(), a.lh_in));
    dfch.Reset();
    if (swiglu()) {
      RETURN_IF_ERROR(
          LinearBackward(ops.mlp_up, C_, I, a.ln2.data(), dup.data(), dln2.data(), a.lh_up));
      dup.Reset();
    }
    a.ln2.Reset();
    RETURN_IF_ERROR(
        NormBackward(ops.ln_2, a.res2.data(), a.ln2_mean, a.ln2_rstd, dln2.data(), dres2.data()));
    dln2.Reset();
    a.res2.Reset();
    a.ln2_mean.Reset();
    a.ln2_rstd.Reset();
    // res2 = in + attn_out
    ASSIGN_OR_RETURN(Buffer din, Alloc(N_ * C_, true));
    ASSIGN_OR_RETURN(Buffer dattn_out, Alloc(N_ * C_, true));
    RETURN_IF_ERROR(ResidualBwd(dres2, din, dattn_out));
    dres2.Reset();
    ASSIGN_OR_RETURN(Buffer datty, Alloc(N_ * Q, true));
    RETURN_IF_ERROR(
        LinearBackward(ops.attn_out, Q, C_, a.atty.data(), dattn_out.data(), datty.data(), a.lh_o));
    dattn_out.Reset();
    // d(q), d(k), d(v): in the fused projection's rows, or their own buffers.
    Buffer dqkv, dq, dk, dv;
    QkvPointers d;
    if (fused_qkv()) {
      ASSIGN_OR_RETURN(dqkv, Alloc(N_ * (Q + 2 * K), true));
      d = {dqkv.data(), dqkv.data() + Q, dqkv.data() + Q + K};
    } else {
      ASSIGN_OR_RETURN(dq, Alloc(N_ * Q, true));
      ASSIGN_OR_RETURN(dk, Alloc(N_ * K, true));
      ASSIGN_OR_RETURN(dv, Alloc(N_ * K, true));
      d = {dq.data(), dk.data(), dv.data()};
    }
    {
      const GqaAttentionShape att = AttentionShape();
      const QkvPointers qkv = Qkv(a);
      const int64_t ws_bytes = ctx_->workspaces().GqaAttentionBackwardWorkspaceBytes(att);
      ASSIGN_OR_RETURN(Buffer ws, Workspace(ws_bytes));
      RETURN_IF_ERROR(ctx_->Compute([&](Kernels& k, Stream& s) {
        return k.GqaAttentionBackward(s, att, qkv.q, qkv.k, qkv.v, a.atty.data(), a.lse.data(),
                                      datty.data(), d.q, d.k, d.v, ws.data(), ws_bytes);
      }));
    }
    datty.Reset();
    a.atty.Reset();
    a.lse.Reset();
    a.qkv.Reset();
    a.q.Reset();
    a.k.Reset();
    a.v.Reset();
    if (rope()) {
      RETURN_IF_ERROR(ctx_->Compute([&](Kernels& k, Stream& s) {
        RETURN_IF_ERROR(
            k.RopeBackward(s, {B_, T_, m_.num_heads, D, T_}, rope_cos(), rope_sin(), d.q));
        return k.RopeBackward(s, {B_, T_, m_.num_kv_heads, D, T_}, rope_cos(), rope_sin(), d.k);
      }));
    }
    ASSIGN_OR_RETURN(Buffer dln1, Alloc(N_ * C_, true));
    if (fused_qkv()) {
      RETURN_IF_ERROR(
          LinearBackward(ops.qkv, C_, Q + 2 * K, a.ln1.data(), d.q, dln1.data(), a.lh_qkv));
      dqkv.Reset();
    } else {
      const ProgramLayout::QkvOp& qkv = ops.qkv_split;
      {
        ASSIGN_OR_RETURN(ScopedAccess access, ScopedAccess::Begin(ctx_, qkv.op, Stage::kBackward));
        if (spec_.qk_norm) {
          // d(q) and d(k) become the gradients of the projections, through the norms.
          RETURN_IF_ERROR(
              HeadNormBackward(qkv.q_norm, qkv.trainable, m_.num_heads, a.q_in, a.q_rstd, dq));
          RETURN_IF_ERROR(
              HeadNormBackward(qkv.k_norm, qkv.trainable, m_.num_kv_heads, a.k_in, a.k_rstd, dk));
          d.q = dq.data();
          d.k = dk.data();
          a.q_in.Reset();
          a.k_in.Reset();
          a.q_rstd.Reset();
          a.k_rstd.Reset();
        }
        // Each projection's gradient is freed once nothing needs it (its adapter's backward
        // comes after this access).
        RETURN_IF_ERROR(
            NnLinearBwd(qkv.q_w, qkv.q_b, qkv.trainable, C_, Q, a.ln1.data(), d.q, dln1.data()));
        if (!qkv.q_lora.present()) dq.Reset();
        RETURN_IF_ERROR(
            NnLinearBwd(qkv.k_w, qkv.k_b, qkv.trainable, C_, K, a.ln1.data(), d.k, dln1.data()));
        if (!qkv.k_lora.present()) dk.Reset();
        RETURN_IF_ERROR(
            NnLinearBwd(qkv.v_w, qkv.v_b, qkv.trainable, C_, K, a.ln1.data(), d.v, dln1.data()));
        if (!qkv.v_lora.present()) dv.Reset();
        RETURN_IF_ERROR(access.End());
      }
      if (qkv.lora_op() >= 0) {
        ASSIGN_OR_RETURN(ScopedAccess access,
                         ScopedAccess::Begin(ctx_, qkv.lora_op(), Stage::kBackward));
        if (qkv.q_lora.present()) {
          RETURN_IF_ERROR(
              AdapterBackward(qkv.q_lora, C_, Q, a.ln1.data(), a.lh_q, d.q, dln1.data()));
        }
        if (qkv.k_lora.present()) {
          RETURN_IF_ERROR(
              AdapterBackward(qkv.k_lora, C_, K, a.ln1.data(), a.lh_k, d.k, dln1.data()));
        }
        if (qkv.v_lora.present()) {
          RETURN_IF_ERROR(
              AdapterBackward(qkv.v_lora, C_, K, a.ln1.data(), a.lh_v, d.v, dln1.data()));
        }
        RETURN_IF_ERROR(access.End());
        dq.Reset();
        dk.Reset();
        dv.Reset();
      }
    }
    a.ln1.Reset();
    RETURN_IF_ERROR(
        NormBackward(ops.ln_1, in.data(), a.ln1_mean, a.ln1_rstd, dln1.data(), din.data()));
    dln1.Reset();
    in.Reset();
    a.Reset();
    dres = std::move(din);
    return absl::OkStatus();
  }

  // --- Embedding, LM head, the whole model -----------------------------------------------------

  // Elements of Activations::inputs (f32-sized): the loss (a double) at 0, tokens, targets, the
  // RoPE cos and sin tables (empty without RoPE).
  struct InputsOffsets {
    int64_t tokens = 0, targets = 0, rope_cos = 0, rope_sin = 0, total = 0;
  };
  InputsOffsets InputsLayout() const {
    InputsOffsets o;
    o.tokens = 2;  // after the loss (one double: two f32 elements, 8-byte aligned)
    o.targets = o.tokens + N_;
    o.rope_cos = o.targets + N_;
    const int64_t table = static_cast<int64_t>(p_.rope_cos_.size());
    o.rope_sin = o.rope_cos + table;
    o.total = o.rope_sin + table;
    return o;
  }
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

  // Allocates acts.inputs and enqueues the copies of tokens, targets and the RoPE tables (one
  // asynchronous copy: they lie back to back from o.tokens, each of 4-byte elements).
  absl::Status UploadInputs(const ProgramInputs& in, Activations& acts) {
    const InputsOffsets o = InputsLayout();
    ASSIGN_OR_RETURN(acts.inputs, Alloc(o.total, false));
    const absl::Span<const char> pieces[] = {Bytes(in.tokens), Bytes(in.targets),
                                             Bytes(absl::MakeConstSpan(p_.rope_cos_)),
                                             Bytes(absl::MakeConstSpan(p_.rope_sin_))};
    RETURN_IF_ERROR(
        ctx_->Upload(ProgramContext::Staging::kInputs, acts.inputs.data() + o.tokens, pieces));
    rope_dev_ = acts.inputs.data();
    return absl::OkStatus();
  }

  // acts.x[0] = the embedding rows of the tokens (+ wpe).
  absl::Status EmbeddingForward(Activations& acts) {
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
    if (spec_.positions != TransformerBlockSpec::Positions::kLearned) return absl::OkStatus();
    // Then the positions: x = wte[token] + wpe[position].
    const Op& wpe_op = p_.layout_.wpe;
    ASSIGN_OR_RETURN(ScopedAccess access, ScopedAccess::Begin(ctx_, wpe_op.op, Stage::kForward));
    absl::Span<const float> wpe;
    ASSIGN_OR_RETURN(Buffer wpe_f32, ParamF32(wpe_op.w, &wpe));
    RETURN_IF_ERROR(ctx_->Compute([&](Kernels& k, Stream& s) {
      return k.PositionEmbeddingForward(s, B_, T_, C_, m_.max_position_embeddings, wpe.data(),
                                        acts.x[0].data());
    }));
    wpe_f32.Reset();
    return access.End();
  }

  // The LM head and cross-entropy over every block: the loss on the device; keeps acts.ce_lse.
  absl::Status LmHeadForward(Activations& acts) {
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
      return k.LmHeadFinish(s, first, targets, state.data(), acts.ce_lse.data(),
                            LossOnDevice(acts));
    });
  }

  absl::StatusOr<double> Forward(const ProgramInputs& in, Mode mode, Activations& acts) {
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

  // The LM head's backward over every block: dlnf += ..., the blocks' gradients into their slots
  // one vocabulary tile at a time (tied: the batch's rows kept in acts.touched_grads).
  absl::Status LmHeadBackward(double loss_scale, Activations& acts, Buffer& dlnf) {
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

  // The embedding's backward from d(x[0]) `dx0`: wpe's gradient, and the batch's embedding rows.
  // A frozen embedding (and wpe) is not accessed: nothing of it is computed.
  absl::Status EmbeddingBackward(Activations& acts, Buffer& dx0) {
    // The embedding's part of the batch's rows, added to the LM head's in token order (no
    // parameter is read: nothing is accessed).
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
                                           dwpe.data());
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

  absl::Status Backward(const ProgramInputs& in, double loss_scale, Activations& acts) {
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
};

absl::StatusOr<TransformerProgram> TransformerProgram::Create(const ModelConfig& config,
                                                              const ProgramShape& shape,
                                                              ProgramLayout layout) {
  TransformerProgram p(config, shape, std::move(layout));
  if (p.spec_.positions == TransformerBlockSpec::Positions::kRope) {
    RopeConfig rope{.head_dim = config.head_dim,
                    .theta = config.rope_theta,
                    .scaling_type = "",
                    .llama3 = RopeLlama3Params{}};
    if (config.rope_scaling.type == RopeScalingType::kLlama3) {
      const RopeScaling& rs = config.rope_scaling;
      rope.scaling_type = "llama3";
      rope.llama3 = RopeLlama3Params{rs.factor, rs.low_freq_factor, rs.high_freq_factor,
                                     static_cast<double>(rs.original_max_position_embeddings)};
    }
    const size_t table = static_cast<size_t>(shape.seq_len * config.head_dim / 2);
    p.rope_cos_.resize(table);
    p.rope_sin_.resize(table);
    RETURN_IF_ERROR(RopeTables<float>(rope, shape.seq_len, absl::MakeSpan(p.rope_cos_),
                                      absl::MakeSpan(p.rope_sin_)));
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
