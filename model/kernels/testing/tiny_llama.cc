#include "model/kernels/testing/tiny_llama.h"

#include <algorithm>
#include <cstdint>
#include <string>
#include <utility>
#include <vector>

#include "absl/random/distributions.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/str_cat.h"
#include "absl/types/span.h"
#include "base/check.h"
#include "base/status_macros.h"
#include "base/thread_pool.h"
#include "model/kernels/embedding.h"
#include "model/kernels/gqa_attention.h"
#include "model/kernels/linear.h"
#include "model/kernels/lm_head_cross_entropy.h"
#include "model/kernels/residual.h"
#include "model/kernels/rmsnorm.h"
#include "model/kernels/rope.h"
#include "model/kernels/swiglu.h"

namespace ps::kernel_testing {

template <typename T>
int64_t TinyLlama<T>::Add(const std::string& name, int64_t size) {
  const int64_t offset = tensors_.empty() ? 0 : tensors_.back().offset + tensors_.back().size;
  tensors_.push_back({name, offset, size});
  return offset;
}

template <typename T>
const ParamTensor* TinyLlama<T>::Find(const std::string& name) const {
  for (const ParamTensor& t : tensors_) {
    if (t.name == name) return &t;
  }
  return nullptr;
}

template <typename T>
void TinyLlama<T>::SetRopeTables(std::vector<T> cos, std::vector<T> sin) {
  CHECK_EQ(cos.size(), cos_.size());
  CHECK_EQ(sin.size(), sin_.size());
  cos_ = std::move(cos);
  sin_ = std::move(sin);
}

template <typename T>
TinyLlama<T>::TinyLlama(const TinyLlamaConfig& config, int64_t batch, int64_t seq_len)
    : cfg_(config), B_(batch), L_(seq_len) {
  CHECK_EQ(cfg_.rope.head_dim, cfg_.head_dim) << "rope.head_dim must equal head_dim";
  PS_CHECK_OK(ValidateRopeConfig(cfg_.rope));
  const int64_t C = cfg_.hidden_size, I = cfg_.intermediate_size, N = B_ * L_;
  const int64_t Dq = cfg_.num_heads * cfg_.head_dim, Dkv = cfg_.num_kv_heads * cfg_.head_dim;
  embed_ = Add("model.embed_tokens.weight", cfg_.vocab_size * C);
  for (int64_t l = 0; l < cfg_.num_layers; ++l) {
    const std::string p = absl::StrCat("model.layers.", l, ".");
    Layer w;
    w.in_norm = Add(p + "input_layernorm.weight", C);
    w.q_w = Add(p + "self_attn.q_proj.weight", Dq * C);
    w.q_b = cfg_.attention_bias ? Add(p + "self_attn.q_proj.bias", Dq) : -1;
    w.k_w = Add(p + "self_attn.k_proj.weight", Dkv * C);
    w.k_b = cfg_.attention_bias ? Add(p + "self_attn.k_proj.bias", Dkv) : -1;
    w.v_w = Add(p + "self_attn.v_proj.weight", Dkv * C);
    w.v_b = cfg_.attention_bias ? Add(p + "self_attn.v_proj.bias", Dkv) : -1;
    w.o_w = Add(p + "self_attn.o_proj.weight", C * Dq);
    w.post_norm = Add(p + "post_attention_layernorm.weight", C);
    w.gate_w = Add(p + "mlp.gate_proj.weight", I * C);
    w.up_w = Add(p + "mlp.up_proj.weight", I * C);
    w.down_w = Add(p + "mlp.down_proj.weight", C * I);
    layers_.push_back(w);
    LayerActs a;
    for (std::vector<T>* v : {&a.in, &a.o, &a.res2, &a.n1, &a.n2, &a.down}) v->resize(N * C);
    a.rstd1.resize(N);
    a.rstd2.resize(N);
    a.q.resize(N * Dq);
    a.att.resize(N * Dq);
    a.k.resize(N * Dkv);
    a.v.resize(N * Dkv);
    a.lse.resize(B_ * cfg_.num_heads * L_);
    for (std::vector<T>* v : {&a.gate, &a.up, &a.h}) v->resize(N * I);
    acts_.push_back(std::move(a));
  }
  norm_ = Add("model.norm.weight", C);
  if (!cfg_.tie_word_embeddings) lm_head_ = Add("lm_head.weight", cfg_.vocab_size * C);
  params_.assign(tensors_.back().offset + tensors_.back().size, T{0});
  grads_.assign(params_.size(), T{0});
  final_in_.resize(N * C);
  final_norm_.resize(N * C);
  final_rstd_.resize(N);
  ce_lse_.resize(N);
  cos_.resize(L_ * cfg_.head_dim / 2);
  sin_.resize(L_ * cfg_.head_dim / 2);
  PS_CHECK_OK(RopeTables<T>(cfg_.rope, L_, absl::MakeSpan(cos_), absl::MakeSpan(sin_)));
}

template <typename T>
void TinyLlama<T>::InitLlama(TestRng& gen) {
  for (const ParamTensor& t : tensors_) {
    const std::string& n = t.name;
    T* p = params_.data() + t.offset;
    if (n.find("norm") != std::string::npos) {
      std::fill(p, p + t.size, T{1});
    } else if (n.size() > 5 && n.compare(n.size() - 5, 5, ".bias") == 0) {
      std::fill(p, p + t.size, T{0});
    } else {
      for (int64_t i = 0; i < t.size; ++i) p[i] = static_cast<T>(absl::Gaussian(gen, 0.0, 0.02));
    }
  }
}

template <typename T>
absl::StatusOr<double> TinyLlama<T>::Forward(absl::Span<const int32_t> tokens,
                                             absl::Span<const int32_t> targets, ThreadPool* pool) {
  const int64_t C = cfg_.hidden_size, I = cfg_.intermediate_size, N = B_ * L_;
  const int64_t V = cfg_.vocab_size, Hq = cfg_.num_heads, Hkv = cfg_.num_kv_heads,
                D = cfg_.head_dim;
  const int64_t Dq = Hq * D, Dkv = Hkv * D;
  const bool bias = cfg_.attention_bias;
  const int num_threads = pool == nullptr ? 1 : pool->num_threads();
  const GqaAttentionShape att{B_, L_, Hq, Hkv, D, cfg_.attention_tile};
  std::vector<T> att_ws(GqaAttentionWorkspaceElems(att, num_threads));
  const RmsNormShape norm{N, C, cfg_.rms_norm_eps};
  RETURN_IF_ERROR(EmbeddingForward<T>({N, C, V, cfg_.padding_idx}, tokens, P(embed_, V * C),
                                      absl::MakeSpan(acts_[0].in), pool));
  for (int64_t l = 0; l < cfg_.num_layers; ++l) {
    const Layer& w = layers_[l];
    LayerActs& a = acts_[l];
    absl::Span<T> out =
        l + 1 < cfg_.num_layers ? absl::MakeSpan(acts_[l + 1].in) : absl::MakeSpan(final_in_);
    RETURN_IF_ERROR(RmsNormForward<T>(norm, a.in, P(w.in_norm, C), absl::MakeSpan(a.n1),
                                      absl::MakeSpan(a.rstd1), pool));
    RETURN_IF_ERROR(LinearForward<T>({N, C, Dq, bias}, a.n1, P(w.q_w, Dq * C), PBias(w.q_b, Dq),
                                     absl::MakeSpan(a.q), pool));
    RETURN_IF_ERROR(LinearForward<T>({N, C, Dkv, bias}, a.n1, P(w.k_w, Dkv * C), PBias(w.k_b, Dkv),
                                     absl::MakeSpan(a.k), pool));
    RETURN_IF_ERROR(LinearForward<T>({N, C, Dkv, bias}, a.n1, P(w.v_w, Dkv * C), PBias(w.v_b, Dkv),
                                     absl::MakeSpan(a.v), pool));
    RETURN_IF_ERROR(RopeForward<T>({B_, L_, Hq, D, L_}, cos_, sin_, absl::MakeSpan(a.q), pool));
    RETURN_IF_ERROR(RopeForward<T>({B_, L_, Hkv, D, L_}, cos_, sin_, absl::MakeSpan(a.k), pool));
    RETURN_IF_ERROR(GqaAttentionForward<T>(att, a.q, a.k, a.v, absl::MakeSpan(a.att),
                                           absl::MakeSpan(a.lse), absl::MakeSpan(att_ws), pool));
    RETURN_IF_ERROR(LinearForward<T>({N, Dq, C, false}, a.att, P(w.o_w, C * Dq), {},
                                     absl::MakeSpan(a.o), pool));
    RETURN_IF_ERROR(ResidualForward<T>(a.in, a.o, absl::MakeSpan(a.res2), pool));
    RETURN_IF_ERROR(RmsNormForward<T>(norm, a.res2, P(w.post_norm, C), absl::MakeSpan(a.n2),
                                      absl::MakeSpan(a.rstd2), pool));
    RETURN_IF_ERROR(LinearForward<T>({N, C, I, false}, a.n2, P(w.gate_w, I * C), {},
                                     absl::MakeSpan(a.gate), pool));
    RETURN_IF_ERROR(
        LinearForward<T>({N, C, I, false}, a.n2, P(w.up_w, I * C), {}, absl::MakeSpan(a.up), pool));
    RETURN_IF_ERROR(SwiGluForward<T>(a.gate, a.up, absl::MakeSpan(a.h), pool));
    RETURN_IF_ERROR(LinearForward<T>({N, I, C, false}, a.h, P(w.down_w, C * I), {},
                                     absl::MakeSpan(a.down), pool));
    RETURN_IF_ERROR(ResidualForward<T>(a.res2, a.down, out, pool));
  }
  RETURN_IF_ERROR(RmsNormForward<T>(norm, final_in_, P(norm_, C), absl::MakeSpan(final_norm_),
                                    absl::MakeSpan(final_rstd_), pool));
  const LmHeadCrossEntropyShape ce{N, C, V, cfg_.ce_row_tile, cfg_.ce_vocab_tile};
  std::vector<T> ce_ws(LmHeadCrossEntropyWorkspaceElems(ce));
  return LmHeadCrossEntropyForward<T>(ce, final_norm_, P(head_offset(), V * C), targets,
                                      absl::MakeSpan(ce_lse_), absl::MakeSpan(ce_ws), pool);
}

template <typename T>
absl::StatusOr<std::vector<T>> TinyLlama<T>::Logits(ThreadPool* pool) const {
  const int64_t C = cfg_.hidden_size, N = B_ * L_, V = cfg_.vocab_size;
  std::vector<T> logits(N * V);
  RETURN_IF_ERROR(LinearForward<T>({N, C, V, false}, final_norm_, P(head_offset(), V * C), {},
                                   absl::MakeSpan(logits), pool));
  return logits;
}

template <typename T>
absl::Status TinyLlama<T>::Backward(absl::Span<const int32_t> tokens,
                                    absl::Span<const int32_t> targets, ThreadPool* pool) {
  const int64_t C = cfg_.hidden_size, I = cfg_.intermediate_size, N = B_ * L_;
  const int64_t V = cfg_.vocab_size, Hq = cfg_.num_heads, Hkv = cfg_.num_kv_heads,
                D = cfg_.head_dim;
  const int64_t Dq = Hq * D, Dkv = Hkv * D;
  const bool bias = cfg_.attention_bias;
  std::fill(grads_.begin(), grads_.end(), T{0});
  const RmsNormShape norm{N, C, cfg_.rms_norm_eps};
  // d(residual stream) flowing down from the layer above; starts at the final RMSNorm.
  std::vector<T> dres(N * C, T{0}), dnorm(N * C, T{0});
  const LmHeadCrossEntropyShape ce{N, C, V, cfg_.ce_row_tile, cfg_.ce_vocab_tile};
  std::vector<T> ce_ws(LmHeadCrossEntropyWorkspaceElems(ce));
  RETURN_IF_ERROR(LmHeadCrossEntropyBackward<T>(
      ce, final_norm_, P(head_offset(), V * C), targets, ce_lse_, 1.0, absl::MakeSpan(dnorm),
      G(head_offset(), V * C), absl::MakeSpan(ce_ws), pool));
  RETURN_IF_ERROR(RmsNormBackward<T>(norm, final_in_, P(norm_, C), final_rstd_, dnorm,
                                     absl::MakeSpan(dres), G(norm_, C), pool));
  const GqaAttentionShape att{B_, L_, Hq, Hkv, D, cfg_.attention_tile};
  for (int64_t l = cfg_.num_layers - 1; l >= 0; --l) {
    const Layer& w = layers_[l];
    const LayerActs& a = acts_[l];
    std::vector<T> dres2(N * C, T{0}), ddown(N * C, T{0}), dh(N * I, T{0}), dgate(N * I, T{0}),
        dup(N * I, T{0}), dn2(N * C, T{0}), din(N * C, T{0}), do_(N * C, T{0}), datt(N * Dq, T{0}),
        dq(N * Dq, T{0}), dk(N * Dkv, T{0}), dv(N * Dkv, T{0}), dn1(N * C, T{0});
    // out = res2 + down
    RETURN_IF_ERROR(ResidualBackward<T>(dres, absl::MakeSpan(dres2), absl::MakeSpan(ddown), pool));
    RETURN_IF_ERROR(LinearBackward<T>({N, I, C, false}, a.h, P(w.down_w, C * I), ddown,
                                      absl::MakeSpan(dh), G(w.down_w, C * I), {}, pool));
    RETURN_IF_ERROR(
        SwiGluBackward<T>(a.gate, a.up, dh, absl::MakeSpan(dgate), absl::MakeSpan(dup), pool));
    RETURN_IF_ERROR(LinearBackward<T>({N, C, I, false}, a.n2, P(w.gate_w, I * C), dgate,
                                      absl::MakeSpan(dn2), G(w.gate_w, I * C), {}, pool));
    RETURN_IF_ERROR(LinearBackward<T>({N, C, I, false}, a.n2, P(w.up_w, I * C), dup,
                                      absl::MakeSpan(dn2), G(w.up_w, I * C), {}, pool));
    RETURN_IF_ERROR(RmsNormBackward<T>(norm, a.res2, P(w.post_norm, C), a.rstd2, dn2,
                                       absl::MakeSpan(dres2), G(w.post_norm, C), pool));
    // res2 = in + o
    RETURN_IF_ERROR(ResidualBackward<T>(dres2, absl::MakeSpan(din), absl::MakeSpan(do_), pool));
    RETURN_IF_ERROR(LinearBackward<T>({N, Dq, C, false}, a.att, P(w.o_w, C * Dq), do_,
                                      absl::MakeSpan(datt), G(w.o_w, C * Dq), {}, pool));
    RETURN_IF_ERROR(GqaAttentionBackward<T>(att, a.q, a.k, a.v, a.att, a.lse, datt,
                                            absl::MakeSpan(dq), absl::MakeSpan(dk),
                                            absl::MakeSpan(dv), pool));
    RETURN_IF_ERROR(RopeBackward<T>({B_, L_, Hq, D, L_}, cos_, sin_, absl::MakeSpan(dq), pool));
    RETURN_IF_ERROR(RopeBackward<T>({B_, L_, Hkv, D, L_}, cos_, sin_, absl::MakeSpan(dk), pool));
    RETURN_IF_ERROR(LinearBackward<T>({N, C, Dq, bias}, a.n1, P(w.q_w, Dq * C), dq,
                                      absl::MakeSpan(dn1), G(w.q_w, Dq * C), GBias(w.q_b, Dq),
                                      pool));
    RETURN_IF_ERROR(LinearBackward<T>({N, C, Dkv, bias}, a.n1, P(w.k_w, Dkv * C), dk,
                                      absl::MakeSpan(dn1), G(w.k_w, Dkv * C), GBias(w.k_b, Dkv),
                                      pool));
    RETURN_IF_ERROR(LinearBackward<T>({N, C, Dkv, bias}, a.n1, P(w.v_w, Dkv * C), dv,
                                      absl::MakeSpan(dn1), G(w.v_w, Dkv * C), GBias(w.v_b, Dkv),
                                      pool));
    RETURN_IF_ERROR(RmsNormBackward<T>(norm, a.in, P(w.in_norm, C), a.rstd1, dn1,
                                       absl::MakeSpan(din), G(w.in_norm, C), pool));
    dres = std::move(din);
  }
  return EmbeddingBackward<T>({N, C, V, cfg_.padding_idx}, tokens, dres, G(embed_, V * C), pool);
}

template class TinyLlama<float>;
template class TinyLlama<double>;

}  // namespace ps::kernel_testing
