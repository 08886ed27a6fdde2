// A whole Llama-family decoder (Llama 2/3, Qwen2/2.5, Mistral without sliding window) assembled
// from the model/kernels operators, for tests only: flat parameter and gradient vectors with
// Hugging Face's tensor names and layouts (LlamaForCausalLM / Qwen2ForCausalLM: nn.Linear weights
// [out, in]), all activations kept, forward to the logits and the mean loss, backward to every
// parameter gradient. It checks that the kernels compose into the exact transformers math
// (reference logits/loss/gradients recorded from transformers, finite differences on the whole
// model) and shows the next layer (the chunked model) the order of kernel calls:
//
//   x = embed_tokens[tokens]                                         EmbeddingForward
//   per layer:
//     n = RMSNorm(x) * input_layernorm                                RmsNormForward
//     q = n Wq^T (+bq), k = n Wk^T (+bk), v = n Wv^T (+bv)            LinearForward x3
//     q, k = RoPE(q), RoPE(k)   (in place, [B,T,H,D] views)           RopeForward x2
//     a = GQA(q, k, v)                                                GqaAttentionForward
//     x = x + a Wo^T                                                  LinearForward, Residual
//     n = RMSNorm(x) * post_attention_layernorm                       RmsNormForward
//     x = x + (silu(n Wg^T) * (n Wu^T)) Wd^T                          Linear x2, SwiGlu, Linear,
//                                                                     Residual
//   h = RMSNorm(x) * norm
//   loss = CE(h W_head^T, targets), W_head = lm_head or embed_tokens  LmHeadCrossEntropyForward
//   (tie_word_embeddings: the LM head's gradient and the embedding scatter add into one tensor)
//
// Not thread-safe; one Forward/Backward at a time.
#ifndef PATRICKSTAR_MODEL_KERNELS_TESTING_TINY_LLAMA_H_
#define PATRICKSTAR_MODEL_KERNELS_TESTING_TINY_LLAMA_H_

#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/types/span.h"
#include "base/testing/test_rng.h"
#include "base/thread_pool.h"
#include "model/kernels/rope.h"
#include "model/kernels/testing/tiny_gpt2.h"  // ParamTensor

namespace ps::kernel_testing {

struct TinyLlamaConfig {
  int64_t vocab_size = 96;
  int64_t hidden_size = 48;
  int64_t intermediate_size = 80;
  int64_t num_layers = 2;
  int64_t num_heads = 4;     // num_attention_heads
  int64_t num_kv_heads = 2;  // num_key_value_heads
  int64_t head_dim = 12;     // hidden_size / num_heads unless the config says otherwise
  double rms_norm_eps = 1e-5;
  RopeConfig rope;              // rope.head_dim must equal head_dim
  bool attention_bias = false;  // q/k/v biases (Qwen2: true; o_proj never has one here)
  bool tie_word_embeddings = false;
  int64_t padding_idx = -1;  // nn.Embedding padding_idx (pad_token_id), -1 for none
  // Kernel tiles, small so that a tiny model still crosses tile boundaries.
  int64_t attention_tile = 5;
  int64_t ce_row_tile = 7;
  int64_t ce_vocab_tile = 24;
};

template <typename T>
class TinyLlama {
 public:
  // A model for batches of `batch` sequences of `seq_len` tokens. Parameters start at zero.
  // CHECK-fails on an invalid config (tests only).
  TinyLlama(const TinyLlamaConfig& config, int64_t batch, int64_t seq_len);

  // transformers' _init_weights: Linear and Embedding weights ~ N(0, 0.02), biases 0, RMSNorm
  // weights 1.
  void InitLlama(TestRng& gen);

  // Mean cross-entropy of predicting targets[b, t] (ignore_index -100) from tokens[b, 0..t].
  [[nodiscard]] absl::StatusOr<double> Forward(absl::Span<const int32_t> tokens,
                                               absl::Span<const int32_t> targets, ThreadPool* pool);
  // The logits [B*T, V] of the last Forward (h W_head^T), computed on demand.
  [[nodiscard]] absl::StatusOr<std::vector<T>> Logits(ThreadPool* pool) const;
  // Sets grads() to d loss / d params for the batch of the last Forward.
  [[nodiscard]] absl::Status Backward(absl::Span<const int32_t> tokens,
                                      absl::Span<const int32_t> targets, ThreadPool* pool);

  std::vector<T>& params() { return params_; }
  const std::vector<T>& grads() const { return grads_; }
  const std::vector<ParamTensor>& tensors() const { return tensors_; }
  // The tensor called `name` (Hugging Face's name), or nullptr.
  const ParamTensor* Find(const std::string& name) const;
  // Replaces the RoPE tables computed from the config ([seq_len, head_dim/2] each), e.g. by the
  // exact tables another implementation used. CHECK-fails on a wrong size.
  void SetRopeTables(std::vector<T> cos, std::vector<T> sin);

 private:
  struct Layer {
    int64_t in_norm, q_w, q_b, k_w, k_b, v_w, v_b, o_w, post_norm, gate_w, up_w, down_w;
  };
  struct LayerActs {
    std::vector<T> in, n1, rstd1, q, k, v, att, lse, o, res2, n2, rstd2, gate, up, h, down;
  };
  int64_t Add(const std::string& name, int64_t size);
  absl::Span<const T> P(int64_t offset, int64_t size) const {
    return absl::Span<const T>(params_).subspan(offset, size);
  }
  absl::Span<T> G(int64_t offset, int64_t size) {
    return absl::MakeSpan(grads_).subspan(offset, size);
  }
  // Empty spans for a missing bias (offset -1).
  absl::Span<const T> PBias(int64_t offset, int64_t size) const {
    return offset < 0 ? absl::Span<const T>() : P(offset, size);
  }
  absl::Span<T> GBias(int64_t offset, int64_t size) {
    return offset < 0 ? absl::Span<T>() : G(offset, size);
  }
  int64_t head_offset() const { return cfg_.tie_word_embeddings ? embed_ : lm_head_; }

  TinyLlamaConfig cfg_;
  int64_t B_, L_;
  std::vector<ParamTensor> tensors_;
  std::vector<T> params_, grads_;
  int64_t embed_ = 0, norm_ = 0, lm_head_ = -1;
  std::vector<Layer> layers_;
  std::vector<LayerActs> acts_;
  std::vector<T> cos_, sin_;  // RoPE tables [L, head_dim / 2]
  std::vector<T> final_in_, final_norm_, final_rstd_, ce_lse_;
};

extern template class TinyLlama<float>;
extern template class TinyLlama<double>;

}  // namespace ps::kernel_testing

#endif  // PATRICKSTAR_MODEL_KERNELS_TESTING_TINY_LLAMA_H_
