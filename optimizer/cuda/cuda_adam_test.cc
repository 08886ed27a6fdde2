// CudaAdam (optimizer/cuda/cuda_adam.h) against the scalar reference (optimizer/adam_math.h):
// Adam and AdamW, f32/f16/bf16 gradients, loss scale on and off, lengths with tails, aligned
// (float4 path) and unaligned (one element per thread) starts; gradient statistics; parameter
// restore. Every test reports SKIPPED on a machine without a GPU, and in a build without
// --config=cuda (where this file is compiled with no CUDA at all) — never passed.
#include "base/testing/status_matchers.h"
#include "gtest/gtest.h"

#if PS_WITH_CUDA
#include <algorithm>
#include <cfloat>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <memory>
#include <random>
#include <string>
#include <vector>

#include "base/testing/test_rng.h"
#include "glog/logging.h"
#include "memory/backend.h"
#include "memory/cpu_backend.h"
#include "memory/cuda/cuda_backend.h"
#include "memory/dtype.h"
#include "memory/dtype_math.h"
#include "optimizer/adam_kernels.h"
#include "optimizer/adam_math.h"
#include "optimizer/cuda/cuda_adam.h"
#endif

namespace ps {
namespace {

#if PS_WITH_CUDA

constexpr int64_t kTestCapacityBytes = int64_t{1} << 30;

uint16_t Narrow(DType dtype, float x) {
  return dtype == DType::kF16 ? FloatToHalfBits(x) : FloatToBFloat16Bits(x);
}
float Widen(DType dtype, uint16_t x) {
  return dtype == DType::kF16 ? HalfBitsToFloat(x) : BFloat16BitsToFloat(x);
}

// A device allocation with a host mirror; `offset_elems` elements in, so the start can be
// unaligned.
class DeviceArray {
 public:
  DeviceArray(Backend& backend, int64_t elem_bytes, int64_t n, int64_t offset_elems)
      : backend_(backend),
        elem_bytes_(elem_bytes),
        n_(n),
        offset_(offset_elems),
        host_((n + offset_elems) * elem_bytes) {
    auto ptr = backend.AllocateDevice(std::max<int64_t>(1, (n + offset_elems) * elem_bytes));
    CHECK(ptr.ok()) << ptr.status();
    base_ = *ptr;
  }
  ~DeviceArray() { CHECK(backend_.FreeDevice(base_).ok()); }
  void* device() { return static_cast<char*>(base_) + offset_ * elem_bytes_; }
  template <typename T>
  T* host() {
    return reinterpret_cast<T*>(host_.data() + offset_ * elem_bytes_);
  }
  absl::Status Upload(Stream& s) {
    return s.MemcpyAsync(device(), host<char>(), n_ * elem_bytes_, CopyKind::kHostToDevice);
  }
  absl::Status Download(Stream& s) {
    return s.MemcpyAsync(host<char>(), device(), n_ * elem_bytes_, CopyKind::kDeviceToHost);
  }

 private:
  Backend& backend_;
  int64_t elem_bytes_, n_, offset_;
  std::vector<char> host_;
  void* base_ = nullptr;
};

class CudaAdamTest : public ::testing::Test {
 protected:
  void SetUp() override {
    if (CudaDeviceCount() == 0) GTEST_SKIP() << "no CUDA GPU on this machine";
    ASSERT_OK_AND_ASSIGN(backend_, CreateCudaBackend({.capacity_bytes = kTestCapacityBytes}));
    ASSERT_OK_AND_ASSIGN(adam_, CudaAdam::Create(*backend_));
    ASSERT_OK_AND_ASSIGN(stream_, backend_->CreateStream());
  }

  std::unique_ptr<Backend> backend_;
  std::unique_ptr<CudaAdam> adam_;
  std::unique_ptr<Stream> stream_;
};

TEST_F(CudaAdamTest, StepMatchesScalarReference) {
  TestRng rng(3);
  std::normal_distribution<float> normal;
  for (AdamMode mode : {AdamMode::kAdam, AdamMode::kAdamW}) {
    for (DType dtype : {DType::kF32, DType::kF16, DType::kBF16}) {
      for (double loss_scale : {1.0, 1024.0}) {
        const AdamStepScalars s = MakeAdamStepScalars(mode, 1e-3, 0.9, 0.999, 1e-8, 0.01, 4,
                                                      loss_scale, loss_scale == 1 ? 1.0 : 0.5);
        for (int64_t n : {0, 1, 3, 4, 5, 7, 1023, 1024, 1025, 100003}) {
          for (int64_t off : {0, 1, 3}) {
            const int64_t width = SizeOf(dtype);
            DeviceArray grad(*backend_, width, n, off), master(*backend_, 4, n, off),
                m(*backend_, 4, n, 0), v(*backend_, 4, n, off);
            std::vector<float> raw(n), p0(n), m0(n), v0(n);
            for (int64_t i = 0; i < n; ++i) {
              raw[i] = normal(rng) * static_cast<float>(loss_scale);
              if (dtype == DType::kF32) {
                grad.host<float>()[i] = raw[i];
              } else {
                grad.host<uint16_t>()[i] = Narrow(dtype, raw[i]);
                raw[i] = Widen(dtype, grad.host<uint16_t>()[i]);
              }
              master.host<float>()[i] = p0[i] = normal(rng) * (i % 2 ? 1.0f : 1e-3f);
              m.host<float>()[i] = m0[i] = 0.1f * normal(rng);
              v.host<float>()[i] = v0[i] = 0.01f * std::abs(normal(rng));
            }
            for (DeviceArray* a : {&grad, &master, &m, &v}) ASSERT_OK(a->Upload(*stream_));
            ASSERT_OK(stream_->Synchronize());
            // In place: the new parameters overwrite the gradients.
            const AdamSegment segment{s,
                                      dtype,
                                      grad.device(),
                                      grad.device(),
                                      static_cast<float*>(master.device()),
                                      static_cast<float*>(m.device()),
                                      static_cast<float*>(v.device()),
                                      n};
            ASSERT_OK_AND_ASSIGN(const AdamStepResult result, adam_->Step({&segment, 1}));
            EXPECT_EQ(result.nonfinite_elems, 0);
            for (DeviceArray* a : {&grad, &master, &m, &v}) ASSERT_OK(a->Download(*stream_));
            ASSERT_OK(stream_->Synchronize());
            int failures = 0;
            for (int64_t i = 0; i < n && failures < 5; ++i) {
              float p = p0[i], mm = m0[i], vv = v0[i];
              AdamUpdate(s, raw[i], p, mm, vv);
              const double g = std::abs(raw[i] / loss_scale * s.clip_coef) + std::abs(s.l2 * p0[i]);
              const double m_scale = 0.9 * std::abs(m0[i]) + 0.1 * g;
              const double v_scale = 0.999 * v0[i] + 0.001 * g * g;
              const double denom =
                  std::sqrt(static_cast<double>(vv)) * s.inv_sqrt_bias_correction2 + s.eps;
              const double p_scale = std::abs(p0[i]) + s.step_size * m_scale / denom;
              const float got_p = master.host<float>()[i];
              const bool ok = std::abs(got_p - p) <= 8 * FLT_EPSILON * p_scale + FLT_MIN &&
                              std::abs(m.host<float>()[i] - mm) <= 8 * FLT_EPSILON * m_scale &&
                              std::abs(v.host<float>()[i] - vv) <= 8 * FLT_EPSILON * v_scale;
              const bool param_ok = dtype == DType::kF32
                                        ? grad.host<float>()[i] == got_p
                                        : grad.host<uint16_t>()[i] == Narrow(dtype, got_p);
              if (!ok || !param_ok) {
                ++failures;
                ADD_FAILURE() << DTypeName(dtype) << " n " << n << " off " << off << " element "
                              << i << ": master " << got_p << " want " << p;
              }
            }
          }
        }
      }
    }
  }
}

TEST_F(CudaAdamTest, GradientStatsAndNonFiniteCounts) {
  TestRng rng(5);
  std::normal_distribution<float> normal;
  for (DType dtype : {DType::kF32, DType::kF16, DType::kBF16}) {
    for (int64_t n : {1, 255, 256, 257, 1 << 20}) {
      DeviceArray grad(*backend_, SizeOf(dtype), n, 1);
      double want = 0;
      for (int64_t i = 0; i < n; ++i) {
        float x = normal(rng) * 100;
        if (dtype == DType::kF32) {
          grad.host<float>()[i] = x;
        } else {
          grad.host<uint16_t>()[i] = Narrow(dtype, x);
          x = Widen(dtype, grad.host<uint16_t>()[i]);
        }
        want += static_cast<double>(x) * x;
      }
      ASSERT_OK(grad.Upload(*stream_));
      ASSERT_OK(stream_->Synchronize());
      const GradSegment segment{dtype, grad.device(), n};
      const GradSegment twice[] = {segment, segment};
      ASSERT_OK_AND_ASSIGN(const GradStats stats, adam_->GradientStats(twice));
      EXPECT_EQ(stats.nonfinite_elems, 0);
      EXPECT_NEAR(stats.sum_squares, 2 * want, 1e-9 * want) << DTypeName(dtype) << " n " << n;
    }
    // One Inf and one NaN: counted by both passes.
    const int64_t n = 5000;
    DeviceArray grad(*backend_, SizeOf(dtype), n, 0), master(*backend_, 4, n, 0),
        m(*backend_, 4, n, 0), v(*backend_, 4, n, 0);
    std::memset(grad.host<char>(), 0, n * SizeOf(dtype));
    for (int64_t i : {int64_t{17}, n - 1}) {
      const float bad = i == 17 ? std::numeric_limits<float>::infinity() : std::nanf("");
      if (dtype == DType::kF32) {
        grad.host<float>()[i] = bad;
      } else {
        grad.host<uint16_t>()[i] = Narrow(dtype, bad);
      }
    }
    for (DeviceArray* a : {&grad, &master, &m, &v}) ASSERT_OK(a->Upload(*stream_));
    ASSERT_OK(stream_->Synchronize());
    const GradSegment grads{dtype, grad.device(), n};
    ASSERT_OK_AND_ASSIGN(const GradStats stats, adam_->GradientStats({&grads, 1}));
    EXPECT_EQ(stats.nonfinite_elems, 2);
    EXPECT_EQ(stats.sum_squares, 0.0);
    const AdamSegment segment{MakeAdamStepScalars(AdamMode::kAdam, 1e-3, 0.9, 0.999, 1e-8, 0, 1),
                              dtype,
                              grad.device(),
                              grad.device(),
                              static_cast<float*>(master.device()),
                              static_cast<float*>(m.device()),
                              static_cast<float*>(v.device()),
                              n};
    ASSERT_OK_AND_ASSIGN(const AdamStepResult result, adam_->Step({&segment, 1}));
    EXPECT_EQ(result.nonfinite_elems, 2);
  }
}

TEST_F(CudaAdamTest, RestoreParamsRoundsMasterExactly) {
  TestRng rng(9);
  std::normal_distribution<float> normal;
  for (DType dtype : {DType::kF32, DType::kF16, DType::kBF16}) {
    const int64_t n = 10001;
    DeviceArray master(*backend_, 4, n, 1), param(*backend_, SizeOf(dtype), n, 3);
    for (int64_t i = 0; i < n; ++i) master.host<float>()[i] = normal(rng);
    ASSERT_OK(master.Upload(*stream_));
    ASSERT_OK(stream_->Synchronize());
    const ParamRestoreSegment segment{static_cast<const float*>(master.device()), dtype,
                                      param.device(), n};
    ASSERT_OK(adam_->RestoreParams({&segment, 1}));
    ASSERT_OK(param.Download(*stream_));
    ASSERT_OK(stream_->Synchronize());
    for (int64_t i = 0; i < n; ++i) {
      const float x = master.host<float>()[i];
      if (dtype == DType::kF32) {
        ASSERT_EQ(param.host<float>()[i], x);
      } else {
        ASSERT_EQ(param.host<uint16_t>()[i], Narrow(dtype, x)) << i;
      }
    }
  }
}

TEST(CudaAdamCreateTest, RejectsTheCpuBackend) {
  ASSERT_OK_AND_ASSIGN(auto cpu, CreateCpuBackend({.capacity_bytes = 1 << 20}));
  EXPECT_THAT(CudaAdam::Create(*cpu), StatusIs(absl::StatusCode::kInvalidArgument, "CpuAdam"));
}

#else  // !PS_WITH_CUDA

TEST(CudaAdam, NotBuilt) {
  GTEST_SKIP() << "built without --config=cuda: the CUDA Adam tests did not run";
}

#endif

}  // namespace
}  // namespace ps
