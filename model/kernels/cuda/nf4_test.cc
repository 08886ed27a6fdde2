// The GPU 4-bit codec against the CPU one: dequantized values bit for bit (plain and nested, NF4
// and FP4, odd ranges), the dequantizing Linear against the CPU's within f32 GEMM rounding, for
// workspaces from one row/column to the whole matrix. SKIPPED without --config=cuda or a GPU.
#include "base/testing/gpu_gate.h"
#include "gtest/gtest.h"

#if PS_WITH_CUDA
#include <cstdint>
#include <cstring>
#include <optional>
#include <vector>

#include "absl/random/distributions.h"
#include "absl/types/span.h"
#include "base/testing/status_matchers.h"
#include "base/testing/test_rng.h"
#include "gmock/gmock.h"
#include "model/kernels/cuda/cublas.h"
#include "model/kernels/cuda/cuda_test_util.h"
#include "model/kernels/cuda/nf4.h"
#include "model/kernels/nf4.h"
#include "model/kernels/nf4_linear.h"
#include "model/kernels/testing/kernel_test_util.h"
#endif

namespace ps {
namespace {

#if PS_WITH_CUDA

using ::ps::cuda_testing::DeviceVector;
using ::ps::cuda_testing::TestStream;
using ::ps::kernel_testing::ExpectAllNear;

class CudaNf4Test : public ::testing::Test {
 protected:
  void SetUp() override {
    PS_REQUIRE_GPUS(1);
    stream_.emplace();
  }
  std::optional<TestStream> stream_;
};

// A random weight quantized on the host, its state on the host and on the device.
struct Weight {
  std::vector<uint8_t> codes, nested_codes;
  std::vector<float> absmax, nested_absmax;
  Quant4Tensor host;
  std::optional<DeviceVector<uint8_t>> d_codes, d_nested_codes;
  std::optional<DeviceVector<float>> d_absmax, d_nested_absmax;
  Quant4Tensor device;
};

void MakeWeight(TestRng& gen, Quant4Type type, bool nested, int64_t n, Weight& w) {
  std::vector<float> v(n);
  for (float& x : v) x = absl::Gaussian<float>(gen, 0.0f, 0.05f);
  w.codes.resize(Quant4CodeBytes(n));
  w.absmax.resize(Quant4NumBlocks(n));
  ASSERT_OK(Quantize4Bit(type, DType::kF32, v.data(), n, absl::MakeSpan(w.codes),
                         absl::MakeSpan(w.absmax), nullptr));
  w.d_codes.emplace(w.codes);
  w.host = {type, n, w.codes.data(), w.absmax.data()};
  w.device = {type, n, w.d_codes->get(), nullptr};
  if (!nested) {
    w.d_absmax.emplace(w.absmax);
    w.device.absmax = w.d_absmax->get();
    return;
  }
  w.nested_codes.resize(w.absmax.size());
  w.nested_absmax.resize(Quant4NestedNumBlocks(w.absmax.size()));
  float offset = 0;
  ASSERT_OK(QuantizeAbsmaxNested(w.absmax, absl::MakeSpan(w.nested_codes),
                                 absl::MakeSpan(w.nested_absmax), &offset));
  w.d_nested_codes.emplace(w.nested_codes);
  w.d_nested_absmax.emplace(w.nested_absmax);
  w.host = {type,  n, w.codes.data(), nullptr, w.nested_codes.data(), w.nested_absmax.data(),
            offset};
  w.device = {
      type,  n, w.d_codes->get(), nullptr, w.d_nested_codes->get(), w.d_nested_absmax->get(),
      offset};
}

TEST_F(CudaNf4Test, DequantizeIsBitIdenticalToTheCpu) {
  TestRng gen(1);
  for (const Quant4Type type : {Quant4Type::kNf4, Quant4Type::kFp4}) {
    for (const bool nested : {false, true}) {
      for (const int64_t n : {int64_t{1}, int64_t{63}, int64_t{64 * 300 + 17}}) {
        Weight w;
        MakeWeight(gen, type, nested, n, w);
        for (const auto& [begin, count] :
             {std::pair<int64_t, int64_t>{0, n}, {n / 3, n - n / 3}, {n / 2 | 1, n / 4}}) {
          std::vector<float> want(count);
          ASSERT_OK(Dequantize4Bit(w.host, begin, count, DType::kF32, want.data()));
          DeviceVector<float> d(std::max<int64_t>(count, 1));
          ASSERT_OK(cuda::Dequantize4Bit(w.device, begin, count, d.get(), stream_->get()));
          std::vector<float> got = d.Download();
          got.resize(count);
          EXPECT_EQ(0, std::memcmp(got.data(), want.data(), count * 4))
              << "n " << n << " begin " << begin << " nested " << nested;
        }
      }
    }
  }
}

TEST_F(CudaNf4Test, LinearMatchesTheCpu) {
  TestRng gen(2);
  ASSERT_OK_AND_ASSIGN(const cuda::CublasHandle cublas, cuda::CublasHandle::Create());
  for (const LinearShape s : {LinearShape{1, 1, 1, true}, LinearShape{7, 129, 65, true},
                              LinearShape{33, 300, 70, false}, LinearShape{64, 1000, 513, true}}) {
    Weight w;
    MakeWeight(gen, Quant4Type::kNf4, /*nested=*/s.rows % 2 == 1, s.out_features * s.in_features,
               w);
    auto x = kernel_testing::RandomVector<float>(gen, s.rows * s.in_features);
    auto b = kernel_testing::RandomVector<float>(gen, s.out_features);
    auto dy = kernel_testing::RandomVector<float>(gen, s.rows * s.out_features);
    auto dx0 = kernel_testing::RandomVector<float>(gen, s.rows * s.in_features);
    std::vector<float> ws(Quant4LinearWorkspaceElems(s, 1)), y(s.rows * s.out_features), dx = dx0;
    ASSERT_OK(Quant4LinearForward(s, x, w.host,
                                  s.bias ? absl::Span<const float>(b) : absl::Span<const float>(),
                                  absl::MakeSpan(y), absl::MakeSpan(ws), nullptr));
    ASSERT_OK(
        Quant4LinearBackwardInput(s, w.host, dy, absl::MakeSpan(dx), absl::MakeSpan(ws), nullptr));
    for (const int64_t ws_elems :
         {cuda::Quant4LinearMinWorkspaceElems(s), s.in_features * s.out_features}) {
      DeviceVector<float> d_x(x), d_b(b), d_y(y.size()), d_dy(dy), d_dx(dx0), d_ws(ws_elems);
      ASSERT_OK(cuda::Quant4LinearForward(cublas, s, d_x.get(), w.device, d_b.get(), d_y.get(),
                                          d_ws.get(), ws_elems, stream_->get()));
      ASSERT_OK(cuda::Quant4LinearBackwardInput(cublas, s, w.device, d_dy.get(), d_dx.get(),
                                                d_ws.get(), ws_elems, stream_->get()));
      ExpectAllNear(d_y.Download(), y, 1e-4, 1e-4, "y");
      ExpectAllNear(d_dx.Download(), dx, 1e-4, 1e-4, "dx");
    }
  }
}

#else
TEST(CudaNf4Test, NeedsCuda) { GTEST_SKIP() << "built without --config=cuda"; }
#endif

}  // namespace
}  // namespace ps
