// A whole GPT-2 assembled from the model/kernels operators, for tests only: flat parameter and
// gradient vectors with Hugging Face's tensor names and layouts, all activations kept, forward
// to the mean loss and backward to every parameter gradient. It exists to check that the kernels
// compose into the exact GPT2LMHeadModel math (fresh-init loss ~ ln V, finite differences on the
// whole model); the real model in model/ runs the same kernels over chunks.
//
// Not thread-safe; one Forward/Backward at a time.
#ifndef PATRICKSTAR_MODEL_KERNELS_TESTING_TINY_GPT2_H_
#define PATRICKSTAR_MODEL_KERNELS_TESTING_TINY_GPT2_H_

#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/types/span.h"
#include "base/testing/test_rng.h"
#include "base/thread_pool.h"

namespace ps::kernel_testing {

struct TinyGpt2Config {
  int64_t vocab_size = 64;
  int64_t max_seq_len = 16;
  int64_t channels = 32;
  int64_t num_layers = 2;
  int64_t num_heads = 4;
  // Kernel tiles, small so that a tiny model still crosses tile boundaries.
  int64_t attention_tile = 5;
  int64_t ce_row_tile = 7;
  int64_t ce_vocab_tile = 24;
  // TinyGpt2<float> only: run the linear layers and the LM head with the bf16 kernels
  // (MatmulForwardBf16 etc., weights rounded to bf16 at each use), as GptModel does with bf16
  // param chunks; the rest stays f32.
  bool bf16_gemms = false;
  // With bf16_gemms: the LM head too, as GptModel's row-block LM head does with bf16 blocks
  // (false: the head runs f32 on wte rounded to bf16).
  bool bf16_lm_head = true;
};

// One named parameter tensor inside the flat parameter vector.
struct ParamTensor {
  std::string name;  // e.g. "h.1.attn.c_proj.weight"
  int64_t offset = 0;
  int64_t size = 0;
};

template <typename T>
class TinyGpt2 {
 public:
  // A model for batches of `batch` sequences of `seq_len` tokens. Parameters start at zero.
  TinyGpt2(const TinyGpt2Config& config, int64_t batch, int64_t seq_len);

  // GPT-2's initialization: weights ~ N(0, 0.02), the two residual projections of each block
  // (attn.c_proj, mlp.c_proj) ~ N(0, 0.02 / sqrt(2 * num_layers)), biases 0, LayerNorm weight 1
  // and bias 0.
  void InitGpt2(TestRng& gen);

  // Mean cross-entropy of predicting targets[b, t] (ignore_index -100) from tokens[b, 0..t].
  [[nodiscard]] absl::StatusOr<double> Forward(absl::Span<const int32_t> tokens,
                                               absl::Span<const int32_t> targets, ThreadPool* pool);
  // Sets grads() to d loss / d params for the batch of the last Forward.
  [[nodiscard]] absl::Status Backward(absl::Span<const int32_t> tokens,
                                      absl::Span<const int32_t> targets, ThreadPool* pool);

  std::vector<T>& params() { return params_; }
  const std::vector<T>& grads() const { return grads_; }
  const std::vector<ParamTensor>& tensors() const { return tensors_; }

 private:
  struct Layer {
    int64_t ln1_w, ln1_b, attn_w, attn_b, proj_w, proj_b, ln2_w, ln2_b, fc_w, fc_b, fcproj_w,
        fcproj_b;
  };
  struct LayerActs {
    std::vector<T> in, ln1, ln1_mean, ln1_rstd, qkv, atty, lse, attproj, res2, ln2, ln2_mean,
        ln2_rstd, fch, fch_gelu, fcproj;
  };
  int64_t Add(const std::string& name, int64_t size);
  // y = x W + b and its backward (G += the gradients), on the f32 or the bf16 kernels.
  absl::Status Linear(int64_t in, int64_t out, absl::Span<const T> x, int64_t w, int64_t b,
                      absl::Span<T> y, ThreadPool* pool);
  absl::Status LinearBackward(int64_t in, int64_t out, absl::Span<const T> x, int64_t w, int64_t b,
                              absl::Span<const T> dy, absl::Span<T> dx, ThreadPool* pool);
  // Parameter tensor `offset` rounded to bf16.
  std::vector<uint16_t> Bf16Param(int64_t offset, int64_t size) const;
  absl::Span<const T> P(int64_t offset, int64_t size) const {
    return absl::Span<const T>(params_).subspan(offset, size);
  }
  absl::Span<T> G(int64_t offset, int64_t size) {
    return absl::MakeSpan(grads_).subspan(offset, size);
  }

  TinyGpt2Config cfg_;
  int64_t B_, L_;
  std::vector<ParamTensor> tensors_;
  std::vector<T> params_, grads_;
  int64_t wte_, wpe_, lnf_w_, lnf_b_;
  std::vector<Layer> layers_;
  std::vector<LayerActs> acts_;
  std::vector<T> final_in_, lnf_, lnf_mean_, lnf_rstd_, ce_lse_;
};

extern template class TinyGpt2<float>;
extern template class TinyGpt2<double>;

}  // namespace ps::kernel_testing

#endif  // PATRICKSTAR_MODEL_KERNELS_TESTING_TINY_GPT2_H_
