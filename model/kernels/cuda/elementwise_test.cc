// cuda::Encoder*, cuda::Gelu*, cuda::Residual* against the CPU kernels on
// awkward sizes. Every test reports SKIPPED without a GPU, and in a build
// without --config=cuda (where this file is compiled with no CUDA at all) —
// never passed.
#include "base/testing/gpu_gate.h"
#include "gtest/gtest.h"

#if PS_WITH_CUDA
#include <cmath>
#include <cstdint>
#include <optional>
#include <random>
#include <vector>

#include "absl/random/distributions.h"
#include "absl/types/span.h"
#include "base/testing/status_matchers.h"
#include "base/testing/test_rng.h"
#include "gmock/gmock.h"
#include "model/kernels/cuda/cuda_test_util.h"
#include "model/kernels/cuda/elementwise.h"
#include "model/kernels/encoder.h"
#include "model/kernels/gelu.h"
#include "model/kernels/residual.h"
#include "model/kernels/testing/kernel_test_util.h"
#endif

namespace ps {
namespace {

#if PS_WITH_CUDA

using ::ps::cuda_testing::DeviceVector;
using ::ps::cuda_testing::TestStream;
using ::ps::kernel_testing::ExpectAllNear;
using ::ps::kernel_testing::RandomVector;
using ::testing::HasSubstr;

class CudaElementwiseTest : public ::testing::Test {
 protected:
  void SetUp() override {
    PS_REQUIRE_GPUS(1);
    stream_.emplace();
  }
  std::optional<TestStream> stream_;  // created once a GPU is known to exist
};

TEST_F(CudaElementwiseTest, EncoderMatchesCpuBitForBit) {
  TestRng gen(1);  // fixed seed: reproducible failures
  // C not a multiple of 32; T < max_T; a small vocabulary so tokens repeat (the
  // scatter's duplicates) and one with more rows than the 64 buckets.
  for (const EncoderShape s : {EncoderShape{1, 1, 1, 1, 1}, EncoderShape{3, 17, 37, 5, 20},
                               EncoderShape{2, 50, 96, 300, 64}}) {
    const int64_t n_tok = s.batch * s.seq_len, n_out = n_tok * s.channels;
    std::vector<int32_t> tokens(n_tok);
    for (int32_t& t : tokens)
      t = absl::Uniform<int32_t>(gen, 0, static_cast<int32_t>(s.vocab_size));
    const auto wte = RandomVector<float>(gen, s.vocab_size * s.channels);
    const auto wpe = RandomVector<float>(gen, s.max_seq_len * s.channels);
    const auto dout = RandomVector<float>(gen, n_out);
    // Gradients accumulate: start from non-zero values.
    auto dwte = RandomVector<float>(gen, s.vocab_size * s.channels);
    auto dwpe = RandomVector<float>(gen, s.max_seq_len * s.channels);
    DeviceVector<int32_t> d_tokens(tokens);
    DeviceVector<float> d_wte(wte), d_wpe(wpe), d_out(n_out), d_dout(dout), d_dwte(dwte),
        d_dwpe(dwpe);
    ASSERT_OK(cuda::EncoderForward(s, d_tokens.get(), d_wte.get(), d_wpe.get(), d_out.get(),
                                   stream_->get()));
    ASSERT_OK(cuda::EncoderBackward(s, d_tokens.get(), d_dout.get(), d_dwte.get(), d_dwpe.get(),
                                    stream_->get()));
    std::vector<float> out(n_out);
    ASSERT_OK(EncoderForward<float>(s, tokens, wte, wpe, absl::MakeSpan(out), nullptr));
    ASSERT_OK(EncoderBackward<float>(s, tokens, dout, absl::MakeSpan(dwte), absl::MakeSpan(dwpe),
                                     nullptr));
    // One add per output element; the scatter adds rows in the CPU kernel's
    // order.
    EXPECT_EQ(d_out.Download(), out);
    EXPECT_EQ(d_dwte.Download(), dwte);
    EXPECT_EQ(d_dwpe.Download(), dwpe);
  }
}

TEST_F(CudaElementwiseTest, EncoderOutOfRangeTokenGivesNaNRowsNotACrash) {
  const EncoderShape s{1, 3, 4, 2, 3};
  DeviceVector<int32_t> tokens(std::vector<int32_t>{0, 7, -1});
  DeviceVector<float> wte(std::vector<float>(8, 1.0f)), wpe(std::vector<float>(12, 0.5f)), out(12),
      dwte(std::vector<float>(8, 0.0f)), dwpe(std::vector<float>(12, 0.0f));
  ASSERT_OK(cuda::EncoderForward(s, tokens.get(), wte.get(), wpe.get(), out.get(), stream_->get()));
  const std::vector<float> o = out.Download();
  for (int c = 0; c < 4; ++c) {
    EXPECT_EQ(o[c], 1.5f);
    EXPECT_TRUE(std::isnan(o[4 + c]) && std::isnan(o[8 + c])) << c;
  }
  DeviceVector<float> dout(std::vector<float>(12, 1.0f));
  ASSERT_OK(
      cuda::EncoderBackward(s, tokens.get(), dout.get(), dwte.get(), dwpe.get(), stream_->get()));
  EXPECT_EQ(dwte.Download(), (std::vector<float>{1, 1, 1, 1, 0, 0, 0, 0}));
  EXPECT_EQ(dwpe.Download(), std::vector<float>(12, 1.0f));
}

TEST_F(CudaElementwiseTest, GeluMatchesCpu) {
  TestRng gen(2);  // fixed seed: reproducible failures
  for (const int64_t n : {int64_t{1}, int64_t{31}, int64_t{100003}}) {
    const auto x = RandomVector<float>(gen, n, -8, 8);
    const auto dy = RandomVector<float>(gen, n);
    auto dx = RandomVector<float>(gen, n);
    DeviceVector<float> d_x(x), d_y(n), d_dy(dy), d_dx(dx);
    ASSERT_OK(cuda::GeluForward(n, d_x.get(), d_y.get(), stream_->get()));
    ASSERT_OK(cuda::GeluBackward(n, d_x.get(), d_dy.get(), d_dx.get(), stream_->get()));
    std::vector<float> y(n);
    ASSERT_OK(GeluForward<float>(x, absl::MakeSpan(y), nullptr));
    ASSERT_OK(GeluBackward<float>(x, dy, absl::MakeSpan(dx), nullptr));
    // Same formula (gelu_math.h, x / (1 + exp(-2u))). CUDA's expf is within 2
    // ulp, the CPU's Highway exp within 1, and both fuse multiply-adds
    // differently; the f32 exponent (|2u| <= ~50 here) carries ~|2u| * 6e-8
    // relative rounding into exp, but where it is large y = x / (1 + e) is tiny
    // (|y| < 4e-3 for x < -3). So y (|y| <= 8) agrees to ~1e-6; dx = dx0 + dy *
    // gelu' with |gelu'| <= 1.13, |dx| <= 2.2, likewise.
    ExpectAllNear(d_y.Download(), y, 1e-6, 1e-6, "y");
    ExpectAllNear(d_dx.Download(), dx, 1e-6, 1e-6, "dx");
  }
}

TEST_F(CudaElementwiseTest, GeluInPlaceAndResidualMatchCpu) {
  TestRng gen(3);  // fixed seed: reproducible failures
  const int64_t n = 70001;
  const auto a = RandomVector<float>(gen, n), b = RandomVector<float>(gen, n);
  const auto dout = RandomVector<float>(gen, n);
  auto da = RandomVector<float>(gen, n), db = RandomVector<float>(gen, n);
  DeviceVector<float> d_a(a), d_b(b), d_out(n), d_dout(dout), d_da(da), d_db(db);
  ASSERT_OK(cuda::ResidualForward(n, d_a.get(), d_b.get(), d_out.get(), stream_->get()));
  ASSERT_OK(cuda::ResidualBackward(n, d_dout.get(), d_da.get(), d_db.get(), stream_->get()));
  std::vector<float> out(n);
  ASSERT_OK(ResidualForward<float>(a, b, absl::MakeSpan(out), nullptr));
  ASSERT_OK(ResidualBackward<float>(dout, absl::MakeSpan(da), absl::MakeSpan(db), nullptr));
  EXPECT_EQ(d_out.Download(), out);  // single IEEE additions: exact
  EXPECT_EQ(d_da.Download(), da);
  EXPECT_EQ(d_db.Download(), db);
  // Aliased residual (out = a) and in-place GELU.
  ASSERT_OK(cuda::ResidualForward(n, d_a.get(), d_b.get(), d_a.get(), stream_->get()));
  EXPECT_EQ(d_a.Download(), out);
  ASSERT_OK(cuda::GeluForward(n, d_a.get(), d_a.get(), stream_->get()));
  std::vector<float> y(n);
  ASSERT_OK(GeluForward<float>(out, absl::MakeSpan(y), nullptr));
  ExpectAllNear(d_a.Download(), y, 1e-6, 1e-6, "in-place gelu");
}

TEST_F(CudaElementwiseTest, RejectsBadArguments) {
  DeviceVector<float> buf(16);
  DeviceVector<int32_t> tokens(4);
  EXPECT_THAT(cuda::GeluForward(0, buf.get(), buf.get(), stream_->get()),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("n must be positive")));
  EXPECT_THAT(cuda::GeluBackward(4, buf.get(), nullptr, buf.get(), stream_->get()),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("dy is null")));
  EXPECT_THAT(cuda::ResidualBackward(4, buf.get(), buf.get(), buf.get(), stream_->get()),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("same buffer")));
  EXPECT_THAT(cuda::EncoderForward({1, 5, 4, 2, 4}, tokens.get(), buf.get(), buf.get(), buf.get(),
                                   stream_->get()),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("exceeds max_seq_len")));
}

#else  // !PS_WITH_CUDA

TEST(CudaElementwise, NotBuilt) { PS_REQUIRE_GPUS(1); }

#endif

}  // namespace
}  // namespace ps
