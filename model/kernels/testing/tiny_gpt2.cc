#include "model/kernels/testing/tiny_gpt2.h"

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <string>
#include <type_traits>
#include <vector>

#include "absl/random/distributions.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/str_cat.h"
#include "absl/types/span.h"
#include "base/status_macros.h"
#include "base/thread_pool.h"
#include "memory/dtype_math.h"
#include "model/kernels/encoder.h"
#include "model/kernels/gelu.h"
#include "model/kernels/gqa_attention.h"
#include "model/kernels/layernorm.h"
#include "model/kernels/lm_head_cross_entropy.h"
#include "model/kernels/matmul.h"
#include "model/kernels/residual.h"

namespace ps::kernel_testing {
namespace {

// GPT-2's attention: the grouped-query kernel with kv heads = heads reading q = qkv, k = qkv + C,
// v = qkv + 2C of the fused qkv [B, T, 3C] through row strides of 3C.
GqaAttentionShape Gpt2AttentionShape(int64_t B, int64_t T, int64_t C, int64_t H, int64_t tile) {
  return {.batch = B,
          .seq_len = T,
          .num_heads = H,
          .num_kv_heads = H,
          .head_dim = C / H,
          .tile = tile,
          .q_row_stride = 3 * C,
          .kv_row_stride = 3 * C};
}

}  // namespace

template <typename T>
int64_t TinyGpt2<T>::Add(const std::string& name, int64_t size) {
  const int64_t offset = tensors_.empty() ? 0 : tensors_.back().offset + tensors_.back().size;
  tensors_.push_back({name, offset, size});
  return offset;
}

template <typename T>
TinyGpt2<T>::TinyGpt2(const TinyGpt2Config& config, int64_t batch, int64_t seq_len)
    : cfg_(config), B_(batch), L_(seq_len) {
  const int64_t C = cfg_.channels, N = B_ * L_;
  wte_ = Add("wte.weight", cfg_.vocab_size * C);
  wpe_ = Add("wpe.weight", cfg_.max_seq_len * C);
  for (int64_t l = 0; l < cfg_.num_layers; ++l) {
    const std::string p = absl::StrCat("h.", l, ".");
    Layer layer;
    layer.ln1_w = Add(p + "ln_1.weight", C);
    layer.ln1_b = Add(p + "ln_1.bias", C);
    layer.attn_w = Add(p + "attn.c_attn.weight", C * 3 * C);
    layer.attn_b = Add(p + "attn.c_attn.bias", 3 * C);
    layer.proj_w = Add(p + "attn.c_proj.weight", C * C);
    layer.proj_b = Add(p + "attn.c_proj.bias", C);
    layer.ln2_w = Add(p + "ln_2.weight", C);
    layer.ln2_b = Add(p + "ln_2.bias", C);
    layer.fc_w = Add(p + "mlp.c_fc.weight", C * 4 * C);
    layer.fc_b = Add(p + "mlp.c_fc.bias", 4 * C);
    layer.fcproj_w = Add(p + "mlp.c_proj.weight", 4 * C * C);
    layer.fcproj_b = Add(p + "mlp.c_proj.bias", C);
    layers_.push_back(layer);
    LayerActs a;
    a.in.resize(N * C);
    a.ln1.resize(N * C);
    a.ln1_mean.resize(N);
    a.ln1_rstd.resize(N);
    a.qkv.resize(N * 3 * C);
    a.atty.resize(N * C);
    a.lse.resize(B_ * cfg_.num_heads * L_);
    a.attproj.resize(N * C);
    a.res2.resize(N * C);
    a.ln2.resize(N * C);
    a.ln2_mean.resize(N);
    a.ln2_rstd.resize(N);
    a.fch.resize(N * 4 * C);
    a.fch_gelu.resize(N * 4 * C);
    a.fcproj.resize(N * C);
    acts_.push_back(std::move(a));
  }
  lnf_w_ = Add("ln_f.weight", C);
  lnf_b_ = Add("ln_f.bias", C);
  params_.assign(tensors_.back().offset + tensors_.back().size, T{0});
  grads_.assign(params_.size(), T{0});
  final_in_.resize(N * C);
  lnf_.resize(N * C);
  lnf_mean_.resize(N);
  lnf_rstd_.resize(N);
  ce_lse_.resize(N);
}

template <typename T>
void TinyGpt2<T>::InitGpt2(TestRng& gen) {
  const double residual_std = 0.02 / std::sqrt(2.0 * cfg_.num_layers);
  for (const ParamTensor& t : tensors_) {
    const std::string& n = t.name;
    auto ends_with = [&](const std::string& s) {
      return n.size() >= s.size() && n.compare(n.size() - s.size(), s.size(), s) == 0;
    };
    T* p = params_.data() + t.offset;
    if (n.find("ln_") != std::string::npos) {
      std::fill(p, p + t.size, ends_with(".weight") ? T{1} : T{0});
    } else if (ends_with(".bias")) {
      std::fill(p, p + t.size, T{0});
    } else {
      const double std = ends_with("c_proj.weight") ? residual_std : 0.02;
      for (int64_t i = 0; i < t.size; ++i) p[i] = static_cast<T>(absl::Gaussian(gen, 0.0, std));
    }
  }
}

template <typename T>
std::vector<uint16_t> TinyGpt2<T>::Bf16Param(int64_t offset, int64_t size) const {
  std::vector<uint16_t> bits(static_cast<size_t>(size));
  for (int64_t i = 0; i < size; ++i) {
    bits[i] = FloatToBFloat16Bits(static_cast<float>(params_[offset + i]));
  }
  return bits;
}

template <typename T>
absl::Status TinyGpt2<T>::Linear(int64_t in, int64_t out, absl::Span<const T> x, int64_t w,
                                 int64_t b, absl::Span<T> y, ThreadPool* pool) {
  const MatmulShape shape{B_ * L_, in, out};
  if constexpr (std::is_same_v<T, float>) {
    if (cfg_.bf16_gemms) {
      std::vector<float> ws(MatmulBf16ForwardWorkspaceElems(shape));
      return MatmulForwardBf16(shape, x, Bf16Param(w, in * out), P(b, out), y, absl::MakeSpan(ws),
                               pool);
    }
  }
  return MatmulForward<T>(shape, x, P(w, in * out), P(b, out), y, pool);
}

template <typename T>
absl::Status TinyGpt2<T>::LinearBackward(int64_t in, int64_t out, absl::Span<const T> x, int64_t w,
                                         int64_t b, absl::Span<const T> dy, absl::Span<T> dx,
                                         ThreadPool* pool) {
  const MatmulShape shape{B_ * L_, in, out};
  if constexpr (std::is_same_v<T, float>) {
    if (cfg_.bf16_gemms) {
      std::vector<float> ws(MatmulBf16BackwardWorkspaceElems(shape));
      return MatmulBackwardBf16(shape, x, Bf16Param(w, in * out), dy, dx, G(w, in * out), G(b, out),
                                absl::MakeSpan(ws), pool);
    }
  }
  return MatmulBackward<T>(shape, x, P(w, in * out), dy, dx, G(w, in * out), G(b, out), pool);
}

template <typename T>
absl::StatusOr<double> TinyGpt2<T>::Forward(absl::Span<const int32_t> tokens,
                                            absl::Span<const int32_t> targets, ThreadPool* pool) {
  const int64_t C = cfg_.channels, N = B_ * L_, H = cfg_.num_heads;
  const int64_t V = cfg_.vocab_size;
  const int num_threads = pool == nullptr ? 1 : pool->num_threads();
  const GqaAttentionShape att = Gpt2AttentionShape(B_, L_, C, H, cfg_.attention_tile);
  std::vector<T> att_ws(GqaAttentionWorkspaceElems(att, num_threads));
  RETURN_IF_ERROR(EncoderForward<T>({B_, L_, C, V, cfg_.max_seq_len}, tokens, P(wte_, V * C),
                                    P(wpe_, cfg_.max_seq_len * C), absl::MakeSpan(acts_[0].in),
                                    pool));
  for (int64_t l = 0; l < cfg_.num_layers; ++l) {
    const Layer& w = layers_[l];
    LayerActs& a = acts_[l];
    absl::Span<T> out =
        l + 1 < cfg_.num_layers ? absl::MakeSpan(acts_[l + 1].in) : absl::MakeSpan(final_in_);
    RETURN_IF_ERROR(LayerNormForward<T>({N, C}, a.in, P(w.ln1_w, C), P(w.ln1_b, C),
                                        absl::MakeSpan(a.ln1), absl::MakeSpan(a.ln1_mean),
                                        absl::MakeSpan(a.ln1_rstd), pool));
    RETURN_IF_ERROR(Linear(C, 3 * C, a.ln1, w.attn_w, w.attn_b, absl::MakeSpan(a.qkv), pool));
    const absl::Span<const T> qkv(a.qkv);
    const int64_t n = GqaAttentionQElems(att);
    RETURN_IF_ERROR(GqaAttentionForward<T>(att, qkv.subspan(0, n), qkv.subspan(C, n),
                                           qkv.subspan(2 * C, n), absl::MakeSpan(a.atty),
                                           absl::MakeSpan(a.lse), absl::MakeSpan(att_ws), pool));
    RETURN_IF_ERROR(Linear(C, C, a.atty, w.proj_w, w.proj_b, absl::MakeSpan(a.attproj), pool));
    RETURN_IF_ERROR(ResidualForward<T>(a.in, a.attproj, absl::MakeSpan(a.res2), pool));
    RETURN_IF_ERROR(LayerNormForward<T>({N, C}, a.res2, P(w.ln2_w, C), P(w.ln2_b, C),
                                        absl::MakeSpan(a.ln2), absl::MakeSpan(a.ln2_mean),
                                        absl::MakeSpan(a.ln2_rstd), pool));
    RETURN_IF_ERROR(Linear(C, 4 * C, a.ln2, w.fc_w, w.fc_b, absl::MakeSpan(a.fch), pool));
    RETURN_IF_ERROR(GeluForward<T>(a.fch, absl::MakeSpan(a.fch_gelu), pool));
    RETURN_IF_ERROR(
        Linear(4 * C, C, a.fch_gelu, w.fcproj_w, w.fcproj_b, absl::MakeSpan(a.fcproj), pool));
    RETURN_IF_ERROR(ResidualForward<T>(a.res2, a.fcproj, out, pool));
  }
  RETURN_IF_ERROR(LayerNormForward<T>({N, C}, final_in_, P(lnf_w_, C), P(lnf_b_, C),
                                      absl::MakeSpan(lnf_), absl::MakeSpan(lnf_mean_),
                                      absl::MakeSpan(lnf_rstd_), pool));
  const LmHeadCrossEntropyShape ce{N, C, V, cfg_.ce_row_tile, cfg_.ce_vocab_tile};
  if constexpr (std::is_same_v<T, float>) {
    if (cfg_.bf16_gemms && cfg_.bf16_lm_head) {
      std::vector<float> ws(LmHeadCrossEntropyBf16WorkspaceElems(ce));
      return LmHeadCrossEntropyForwardBf16(ce, lnf_, Bf16Param(wte_, V * C), targets,
                                           absl::MakeSpan(ce_lse_), absl::MakeSpan(ws), pool);
    }
  }
  std::vector<T> ce_ws(LmHeadCrossEntropyWorkspaceElems(ce));
  return LmHeadCrossEntropyForward<T>(ce, lnf_, P(wte_, V * C), targets, absl::MakeSpan(ce_lse_),
                                      absl::MakeSpan(ce_ws), pool);
}

template <typename T>
absl::Status TinyGpt2<T>::Backward(absl::Span<const int32_t> tokens,
                                   absl::Span<const int32_t> targets, ThreadPool* pool) {
  const int64_t C = cfg_.channels, N = B_ * L_, H = cfg_.num_heads;
  const int64_t V = cfg_.vocab_size;
  std::fill(grads_.begin(), grads_.end(), T{0});
  // d(residual stream) flowing down from the layer above; starts at the final LayerNorm.
  std::vector<T> dres(N * C, T{0}), dlnf(N * C, T{0});
  const LmHeadCrossEntropyShape ce{N, C, V, cfg_.ce_row_tile, cfg_.ce_vocab_tile};
  bool head_done = false;
  if constexpr (std::is_same_v<T, float>) {
    if (cfg_.bf16_gemms && cfg_.bf16_lm_head) {
      std::vector<float> ws(LmHeadCrossEntropyBf16WorkspaceElems(ce));
      RETURN_IF_ERROR(LmHeadCrossEntropyBackwardBf16(ce, lnf_, Bf16Param(wte_, V * C), targets,
                                                     ce_lse_, 1.0, absl::MakeSpan(dlnf),
                                                     G(wte_, V * C), absl::MakeSpan(ws), pool));
      head_done = true;
    }
  }
  if (!head_done) {
    std::vector<T> ce_ws(LmHeadCrossEntropyWorkspaceElems(ce));
    RETURN_IF_ERROR(LmHeadCrossEntropyBackward<T>(ce, lnf_, P(wte_, V * C), targets, ce_lse_, 1.0,
                                                  absl::MakeSpan(dlnf), G(wte_, V * C),
                                                  absl::MakeSpan(ce_ws), pool));
  }
  RETURN_IF_ERROR(LayerNormBackward<T>({N, C}, final_in_, P(lnf_w_, C), lnf_mean_, lnf_rstd_, dlnf,
                                       absl::MakeSpan(dres), G(lnf_w_, C), G(lnf_b_, C), pool));
  const GqaAttentionShape att = Gpt2AttentionShape(B_, L_, C, H, cfg_.attention_tile);
  for (int64_t l = cfg_.num_layers - 1; l >= 0; --l) {
    const Layer& w = layers_[l];
    const LayerActs& a = acts_[l];
    std::vector<T> dres2(N * C, T{0}), dfcproj(N * C, T{0}), dfch_gelu(N * 4 * C, T{0}),
        dfch(N * 4 * C, T{0}), dln2(N * C, T{0}), din(N * C, T{0}), dattproj(N * C, T{0}),
        datty(N * C, T{0}), dqkv(N * 3 * C, T{0}), dln1(N * C, T{0});
    // out = res2 + fcproj
    RETURN_IF_ERROR(
        ResidualBackward<T>(dres, absl::MakeSpan(dres2), absl::MakeSpan(dfcproj), pool));
    RETURN_IF_ERROR(LinearBackward(4 * C, C, a.fch_gelu, w.fcproj_w, w.fcproj_b, dfcproj,
                                   absl::MakeSpan(dfch_gelu), pool));
    RETURN_IF_ERROR(GeluBackward<T>(a.fch, dfch_gelu, absl::MakeSpan(dfch), pool));
    RETURN_IF_ERROR(
        LinearBackward(C, 4 * C, a.ln2, w.fc_w, w.fc_b, dfch, absl::MakeSpan(dln2), pool));
    RETURN_IF_ERROR(LayerNormBackward<T>({N, C}, a.res2, P(w.ln2_w, C), a.ln2_mean, a.ln2_rstd,
                                         dln2, absl::MakeSpan(dres2), G(w.ln2_w, C), G(w.ln2_b, C),
                                         pool));
    // res2 = in + attproj
    RETURN_IF_ERROR(
        ResidualBackward<T>(dres2, absl::MakeSpan(din), absl::MakeSpan(dattproj), pool));
    RETURN_IF_ERROR(
        LinearBackward(C, C, a.atty, w.proj_w, w.proj_b, dattproj, absl::MakeSpan(datty), pool));
    const absl::Span<const T> qkv(a.qkv);
    const absl::Span<T> dqkv_span = absl::MakeSpan(dqkv);
    const int64_t n = GqaAttentionQElems(att);
    RETURN_IF_ERROR(GqaAttentionBackward<T>(
        att, qkv.subspan(0, n), qkv.subspan(C, n), qkv.subspan(2 * C, n), a.atty, a.lse, datty,
        dqkv_span.subspan(0, n), dqkv_span.subspan(C, n), dqkv_span.subspan(2 * C, n), pool));
    RETURN_IF_ERROR(
        LinearBackward(C, 3 * C, a.ln1, w.attn_w, w.attn_b, dqkv, absl::MakeSpan(dln1), pool));
    RETURN_IF_ERROR(LayerNormBackward<T>({N, C}, a.in, P(w.ln1_w, C), a.ln1_mean, a.ln1_rstd, dln1,
                                         absl::MakeSpan(din), G(w.ln1_w, C), G(w.ln1_b, C), pool));
    dres = std::move(din);
  }
  return EncoderBackward<T>({B_, L_, C, V, cfg_.max_seq_len}, tokens, dres, G(wte_, V * C),
                            G(wpe_, cfg_.max_seq_len * C), pool);
}

template class TinyGpt2<float>;
template class TinyGpt2<double>;

}  // namespace ps::kernel_testing
