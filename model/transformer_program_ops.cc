// TransformerProgram::Run's operators (model/internal/transformer_program_run.h): scratch buffers
// and parameter slots, the linears (Conv1D and nn.Linear), the LoRA adapters, the norms and the
// residual adds, forward and backward of each.
#include <cstdint>
#include <utility>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/types/span.h"
#include "base/status_macros.h"
#include "base/units.h"
#include "glog/logging.h"
#include "memory/dtype.h"
#include "model/internal/program_buffers.h"
#include "model/internal/transformer_program_run.h"
#include "model/transformer_program.h"

namespace ps {
namespace {

using program_internal::Buffer;
using program_internal::ScopedAccess;

}  // namespace

absl::StatusOr<Buffer> TransformerProgram::Run::Alloc(int64_t elems, bool zero) {
  ASSIGN_OR_RETURN(float* p, ctx_->AllocateScratch(elems));
  Buffer buffer(ctx_, p, elems);
  if (zero) {
    RETURN_IF_ERROR(ctx_->Compute([&](Kernels& k, Stream& s) {
      return k.Zero(s, p, elems * static_cast<int64_t>(sizeof(float)));
    }));
  }
  return buffer;
}

absl::StatusOr<Buffer> TransformerProgram::Run::Workspace(int64_t bytes) {
  if (bytes == 0) return Buffer();
  return Alloc(CeilDiv(bytes, static_cast<int64_t>(sizeof(float))), false);
}

absl::StatusOr<Buffer> TransformerProgram::Run::ParamF32(TensorId tensor,
                                                         absl::Span<const float>* values) {
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

absl::StatusOr<const uint16_t*> TransformerProgram::Run::ParamBf16(TensorId tensor) {
  ASSIGN_OR_RETURN(const TensorView v, ctx_->Param(tensor));
  return v.dtype == DType::kBF16 ? static_cast<const uint16_t*>(v.data) : nullptr;
}

absl::Status TransformerProgram::Run::WriteGrad(TensorId tensor, const Buffer& grad) {
  ASSIGN_OR_RETURN(const TensorView v, ctx_->Param(tensor));
  CHECK_EQ(v.numel, grad.elems());
  return ctx_->Compute([&](Kernels& k, Stream& s) {
    return k.Convert(s, DType::kF32, grad.data(), v.dtype, v.data, v.numel);
  });
}

absl::Status TransformerProgram::Run::WriteGradRows(TensorId tensor, int64_t first_row,
                                                    int64_t rows, const float* grad) {
  ASSIGN_OR_RETURN(const TensorView v, ctx_->Param(tensor));
  CHECK_LE((first_row + rows) * C_, v.numel);
  return ctx_->Compute([&](Kernels& k, Stream& s) {
    return k.Convert(s, DType::kF32, grad, v.dtype,
                     static_cast<char*>(v.data) + first_row * C_ * SizeOf(v.dtype), rows * C_);
  });
}

absl::Status TransformerProgram::Run::ConvLinearForward(const Op& op, int64_t in_features,
                                                        int64_t out_features, const float* x,
                                                        float* y) {
  ASSIGN_OR_RETURN(ScopedAccess access, ScopedAccess::Begin(ctx_, op.op, Stage::kForward));
  if (const Quant4Format* q = Quant4Of(op.w)) {
    RETURN_IF_ERROR(Quant4LinearFwd(*q, op.w, op.b, in_features, out_features, x, y));
    return access.End();
  }
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

absl::Status TransformerProgram::Run::ConvLinearBackward(const Op& op, int64_t in_features,
                                                         int64_t out_features, const float* x,
                                                         const float* dy, float* dx) {
  Buffer dw, db;
  if (op.trainable) {
    ASSIGN_OR_RETURN(dw, Alloc(in_features * out_features, true));
    ASSIGN_OR_RETURN(db, Alloc(out_features, true));
  }
  ASSIGN_OR_RETURN(ScopedAccess access, ScopedAccess::Begin(ctx_, op.op, Stage::kBackward));
  if (const Quant4Format* q = Quant4Of(op.w)) {
    CHECK(!op.trainable) << "a 4-bit weight is frozen";
    RETURN_IF_ERROR(Quant4LinearBwd(*q, op.w, in_features, out_features, dy, dx));
    return access.End();
  }
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

const Quant4Format* TransformerProgram::Run::Quant4Of(TensorId w) const {
  return p_.layout_.quant4 == nullptr ? nullptr : p_.layout_.quant4->Find(w);
}

absl::Status TransformerProgram::Run::Quant4LinearFwd(const Quant4Format& q, TensorId w,
                                                      TensorId b, int64_t in_features,
                                                      int64_t out_features, const float* x,
                                                      float* y) {
  CHECK_EQ(q.rows, out_features);
  CHECK_EQ(q.cols, in_features);
  ASSIGN_OR_RETURN(const TensorView wv, ctx_->Param(w));
  absl::Span<const float> bv;
  Buffer b_f32;
  if (b >= 0) {
    ASSIGN_OR_RETURN(b_f32, ParamF32(b, &bv));
  }
  const LinearShape shape{N_, in_features, out_features, b >= 0};
  const DType compute = p_.layout_.quant4->compute_dtype;
  const int64_t ws_bytes = ctx_->workspaces().Quant4LinearWorkspaceBytes(shape, compute);
  ASSIGN_OR_RETURN(Buffer ws, Workspace(ws_bytes));
  const float offset = p_.layout_.quant4->Offset(w);
  return ctx_->Compute([&](Kernels& k, Stream& s) {
    return k.Quant4LinearForward(s, shape, x, Quant4TensorAt(q, wv.data, offset),
                                 b >= 0 ? bv.data() : nullptr, y, ws.data(), ws_bytes, compute);
  });
}

absl::Status TransformerProgram::Run::Quant4LinearBwd(const Quant4Format& q, TensorId w,
                                                      int64_t in_features, int64_t out_features,
                                                      const float* dy, float* dx) {
  CHECK_EQ(q.rows, out_features);
  CHECK_EQ(q.cols, in_features);
  ASSIGN_OR_RETURN(const TensorView wv, ctx_->Param(w));
  // The bias (if any) has no gradient either: the operator is frozen.
  const LinearShape shape{N_, in_features, out_features, false};
  const DType compute = p_.layout_.quant4->compute_dtype;
  const int64_t ws_bytes = ctx_->workspaces().Quant4LinearWorkspaceBytes(shape, compute);
  ASSIGN_OR_RETURN(Buffer ws, Workspace(ws_bytes));
  const float offset = p_.layout_.quant4->Offset(w);
  return ctx_->Compute([&](Kernels& k, Stream& s) {
    return k.Quant4LinearBackwardInput(s, shape, Quant4TensorAt(q, wv.data, offset), dy, dx,
                                       ws.data(), ws_bytes, compute);
  });
}

absl::Status TransformerProgram::Run::NnLinearFwd(TensorId w, TensorId b, int64_t in_features,
                                                  int64_t out_features, const float* x, float* y) {
  if (const Quant4Format* q = Quant4Of(w)) {
    return Quant4LinearFwd(*q, w, b, in_features, out_features, x, y);
  }
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

absl::Status TransformerProgram::Run::NnLinearBwd(TensorId w, TensorId b, bool trainable,
                                                  int64_t in_features, int64_t out_features,
                                                  const float* x, const float* dy, float* dx) {
  if (const Quant4Format* q = Quant4Of(w)) {
    CHECK(!trainable) << "a 4-bit weight is frozen";
    return Quant4LinearBwd(*q, w, in_features, out_features, dy, dx);
  }
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

absl::Status TransformerProgram::Run::LinearForward(const Op& op, int64_t in_features,
                                                    int64_t out_features, const float* x, float* y,
                                                    Buffer& h) {
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

absl::Status TransformerProgram::Run::LinearBackward(const Op& op, int64_t in_features,
                                                     int64_t out_features, const float* x,
                                                     const float* dy, float* dx, Buffer& h) {
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

absl::StatusOr<const float*> TransformerProgram::Run::AdapterInput(const Lora& l,
                                                                   int64_t in_features,
                                                                   const float* x,
                                                                   Buffer& dropped) {
  if (!dropout()) return x;
  ASSIGN_OR_RETURN(dropped, Alloc(N_ * in_features, false));
  RETURN_IF_ERROR(ctx_->Compute([&](Kernels& k, Stream& s) {
    return k.DropoutForward(s, N_ * in_features, s_.lora_dropout, DropoutSeed(l), x,
                            dropped.data());
  }));
  return static_cast<const float*>(dropped.data());
}

absl::Status TransformerProgram::Run::AdapterForward(const Lora& l, int64_t in_features,
                                                     int64_t out_features, const float* x, float* y,
                                                     Buffer& h) {
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

absl::Status TransformerProgram::Run::AdapterBackward(const Lora& l, int64_t in_features,
                                                      int64_t out_features, const float* x,
                                                      Buffer& h, const float* dy, float* dx) {
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
    RETURN_IF_ERROR(k.LoraBackward(s, shape, xin, a.data(), b.data(), h.data(), dy, dxin, da.data(),
                                   db.data(), ws.data(), ws_bytes));
    if (!dropout()) return absl::OkStatus();
    return k.DropoutBackward(s, N_ * in_features, s_.lora_dropout, DropoutSeed(l), ddropped.data(),
                             dx);
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

absl::Status TransformerProgram::Run::NormForward(const Op& op, const float* x, Buffer& y,
                                                  Buffer& mean, Buffer& rstd) {
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
    return k.RmsNormForward(s, {n, c, m_.norm_eps, spec_.norm_weight_offset}, x, w.data(), y.data(),
                            rstd.data());
  }));
  w_f32.Reset();
  b_f32.Reset();
  return access.End();
}

absl::Status TransformerProgram::Run::NormBackward(const Op& op, const float* x, const Buffer& mean,
                                                   const Buffer& rstd, const float* dy, float* dx) {
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
    return k.RmsNormBackward(s, {n, c, m_.norm_eps, spec_.norm_weight_offset}, x, w.data(),
                             rstd.data(), dy, dx, dw.data());
  }));
  w_f32.Reset();
  if (op.trainable) {
    RETURN_IF_ERROR(WriteGrad(op.w, dw));
    if (layer_norm()) RETURN_IF_ERROR(WriteGrad(op.b, db));
  }
  return access.End();
}

absl::Status TransformerProgram::Run::HeadNormForward(TensorId w, int64_t heads, const Buffer& x,
                                                      Buffer& y, Buffer& rstd) {
  // Per head ([N * heads, D]) or over each token's whole projection ([N, heads * D]: OLMo 2).
  const double offset = spec_.norm_weight_offset;
  const RmsNormShape shape = spec_.qk_norm_whole
                                 ? RmsNormShape{N_, heads * m_.head_dim, m_.norm_eps, offset}
                                 : RmsNormShape{N_ * heads, m_.head_dim, m_.norm_eps, offset};
  ASSIGN_OR_RETURN(y, Alloc(shape.rows * shape.channels, false));
  ASSIGN_OR_RETURN(rstd, Alloc(shape.rows, false));
  absl::Span<const float> wv;
  ASSIGN_OR_RETURN(Buffer w_f32, ParamF32(w, &wv));
  return ctx_->Compute([&](Kernels& k, Stream& s) {
    return k.RmsNormForward(s, shape, x.data(), wv.data(), y.data(), rstd.data());
  });
}

absl::Status TransformerProgram::Run::HeadNormBackward(TensorId w, bool trainable, int64_t heads,
                                                       const Buffer& x, const Buffer& rstd,
                                                       Buffer& dy) {
  // Per head ([N * heads, D]) or over each token's whole projection ([N, heads * D]: OLMo 2).
  const double offset = spec_.norm_weight_offset;
  const RmsNormShape shape = spec_.qk_norm_whole
                                 ? RmsNormShape{N_, heads * m_.head_dim, m_.norm_eps, offset}
                                 : RmsNormShape{N_ * heads, m_.head_dim, m_.norm_eps, offset};
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

absl::Status TransformerProgram::Run::Residual(const float* in, Buffer& out) {
  return ctx_->Compute([&](Kernels& k, Stream& s) {
    return k.ResidualForward(s, out.elems(), in, out.data(), out.data());
  });
}

absl::Status TransformerProgram::Run::ResidualBwd(const Buffer& dout, Buffer& da, Buffer& db) {
  return ctx_->Compute([&](Kernels& k, Stream& s) {
    return k.ResidualBackward(s, dout.elems(), dout.data(), da.data(), db.data());
  });
}

}  // namespace ps
