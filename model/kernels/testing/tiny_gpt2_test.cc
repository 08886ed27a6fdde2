// Whole-model checks of the kernels composed into GPT-2: the fresh-initialization loss and a
// finite-difference gradient check over every parameter tensor.
#include "model/kernels/testing/tiny_gpt2.h"

#include <cmath>
#include <cstdint>
#include <random>
#include <vector>

#include "absl/random/distributions.h"
#include "absl/types/span.h"
#include "base/check.h"
#include "base/testing/status_matchers.h"
#include "base/testing/test_rng.h"
#include "base/thread_pool.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "model/kernels/matmul.h"
#include "model/kernels/testing/kernel_test_util.h"

namespace ps::kernel_testing {
namespace {

using ::testing::DoubleNear;

constexpr int64_t kBatch = 2;
constexpr int64_t kSeqLen = 16;

// Random tokens and next-token targets (the last position of each sequence is ignored).
struct Batch {
  std::vector<int32_t> tokens, targets;
};
Batch RandomBatch(TestRng& gen, const TinyGpt2Config& cfg) {
  Batch batch;
  std::vector<int32_t> stream(kBatch * (kSeqLen + 1));
  for (int32_t& t : stream) t = absl::Uniform<int32_t>(gen, 0, cfg.vocab_size);
  for (int64_t b = 0; b < kBatch; ++b) {
    for (int64_t t = 0; t < kSeqLen; ++t) {
      batch.tokens.push_back(stream[b * (kSeqLen + 1) + t]);
      batch.targets.push_back(t + 1 < kSeqLen ? stream[b * (kSeqLen + 1) + t + 1] : -100);
    }
  }
  return batch;
}

// Parameters far from initialization (weights ~0.3, LayerNorm gains around 1, nonzero biases),
// so every nonlinearity is exercised and no gradient is trivially tiny.
template <typename T>
void RandomizeParams(TestRng& gen, TinyGpt2<T>& model) {
  for (const ParamTensor& t : model.tensors()) {
    const bool is_ln = t.name.find("ln_") != std::string::npos;
    const bool is_weight = t.name.find("weight") != std::string::npos;
    for (int64_t i = 0; i < t.size; ++i) {
      double v = absl::Uniform<double>(gen, -0.3, 0.3);
      if (is_ln && is_weight) v += 1.0;
      if (!is_weight) v /= 3;
      model.params()[t.offset + i] = static_cast<T>(v);
    }
  }
}

class TinyGpt2Test : public ::testing::Test {
 protected:
  TinyGpt2Config cfg_;  // vocab 64, T 16, C 32, 2 layers, 4 heads
};

TEST_F(TinyGpt2Test, FreshInitializationLossIsNearLogVocab) {
  TestRng gen(1);  // fixed seed: reproducible failures
  TinyGpt2<float> model(cfg_, kBatch, kSeqLen);
  model.InitGpt2(gen);
  const Batch batch = RandomBatch(gen, cfg_);
  ASSERT_OK_AND_ASSIGN(const double loss, model.Forward(batch.tokens, batch.targets, nullptr));
  // Logits h . wte have standard deviation ~0.02 * sqrt(C) = 0.11 (h is LayerNorm output), so
  // the loss exceeds ln V by about var/2 = 0.006 on average. Over the 30 target tokens the mean of
  // the target logits alone varies with a standard deviation of about 0.11 / sqrt(30) = 0.02
  // (PS_TEST_SEED 0..299 measured mean +0.0064, sd 0.021, extremes -0.058 and +0.057; the old bound
  // 0.05 failed 6 of the 300): the bound 0.15 is about 7 of those, as in tiny_llama_test, and a
  // wrongly scaled initialization (std 1.0: logits of std 5.7, about +16) still fails.
  EXPECT_THAT(loss, DoubleNear(std::log(64.0), 0.15));
}

TEST_F(TinyGpt2Test, WholeModelGradientMatchesFiniteDifferencesInDouble) {
  TestRng gen(2);  // fixed seed: reproducible failures
  TinyGpt2<double> model(cfg_, kBatch, kSeqLen);
  RandomizeParams(gen, model);
  const Batch batch = RandomBatch(gen, cfg_);
  ASSERT_OK(model.Forward(batch.tokens, batch.targets, nullptr).status());
  ASSERT_OK(model.Backward(batch.tokens, batch.targets, nullptr));
  const std::vector<double> grads = model.grads();
  auto loss = [&]() {
    absl::StatusOr<double> l = model.Forward(batch.tokens, batch.targets, nullptr);
    PS_CHECK_OK(l);
    return *l;
  };
  // Every tensor: 6 elements spread over it plus 2 random ones.
  int checked = 0;
  for (const ParamTensor& t : model.tensors()) {
    std::vector<int64_t> picks;
    for (int k = 0; k < 6; ++k) picks.push_back(t.offset + k * t.size / 6);
    for (int k = 0; k < 2; ++k) picks.push_back(t.offset + absl::Uniform<int64_t>(gen, 0, t.size));
    for (int64_t i : picks) {
      const double fd = CentralDifference(model.params(), i, loss);
      // Double precision, h = 1e-5: truncation + rounding error ~1e-10 on a loss of ~4
      // (measured worst 1.4e-10); the bound leaves 100x headroom.
      EXPECT_NEAR(grads[i], fd, 1e-8 + 1e-6 * std::abs(fd)) << t.name << "[" << i - t.offset << "]";
      ++checked;
    }
  }
  EXPECT_EQ(checked, 8 * static_cast<int>(model.tensors().size()));
}

TEST_F(TinyGpt2Test, FloatGradientsMatchDoubleGradients) {
  TestRng gen(3);  // fixed seed: reproducible failures
  TinyGpt2<double> model64(cfg_, kBatch, kSeqLen);
  RandomizeParams(gen, model64);
  TinyGpt2<float> model32(cfg_, kBatch, kSeqLen);
  model32.params() = Convert<float>(model64.params());
  const Batch batch = RandomBatch(gen, cfg_);
  ThreadPool pool(2);
  ASSERT_OK_AND_ASSIGN(const double loss64, model64.Forward(batch.tokens, batch.targets, nullptr));
  ASSERT_OK_AND_ASSIGN(const double loss32, model32.Forward(batch.tokens, batch.targets, &pool));
  ASSERT_OK(model64.Backward(batch.tokens, batch.targets, nullptr));
  ASSERT_OK(model32.Backward(batch.tokens, batch.targets, &pool));
  EXPECT_THAT(loss32, DoubleNear(loss64, 1e-5 * loss64));
  for (const ParamTensor& t : model64.tensors()) {
    const auto g64 = absl::Span<const double>(model64.grads()).subspan(t.offset, t.size);
    const auto g32 = absl::Span<const float>(model32.grads()).subspan(t.offset, t.size);
    double scale = 0;
    for (double g : g64) scale = std::max(scale, std::abs(g));
    // Float rounding (6e-8) amplified through two blocks of LayerNorm, attention and MLP: the
    // measured worst case is ~1.1e-6 of the tensor's largest gradient; allow 2e-5.
    ExpectAllNear(g32, g64, 2e-5 * scale, 0, t.name);
  }
}

TEST_F(TinyGpt2Test, ResultsDoNotDependOnThreadCount) {
  TestRng gen(4);  // fixed seed: reproducible failures
  TinyGpt2<float> a(cfg_, kBatch, kSeqLen), b(cfg_, kBatch, kSeqLen);
  a.InitGpt2(gen);
  b.params() = a.params();
  const Batch batch = RandomBatch(gen, cfg_);
  ThreadPool pool(3);
  ASSERT_OK_AND_ASSIGN(const double la, a.Forward(batch.tokens, batch.targets, nullptr));
  ASSERT_OK_AND_ASSIGN(const double lb, b.Forward(batch.tokens, batch.targets, &pool));
  ASSERT_OK(a.Backward(batch.tokens, batch.targets, nullptr));
  ASSERT_OK(b.Backward(batch.tokens, batch.targets, &pool));
  EXPECT_EQ(la, lb);
  EXPECT_EQ(a.grads(), b.grads());
}

}  // namespace
}  // namespace ps::kernel_testing
