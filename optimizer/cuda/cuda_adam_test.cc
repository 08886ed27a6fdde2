// CudaAdam (optimizer/cuda/cuda_adam.h) against the scalar reference (optimizer/adam_math.h):
// Adam and AdamW, f32/f16/bf16 gradients, loss scale on and off, lengths with tails, aligned
// (float4 path) and unaligned (one element per thread) starts; gradient statistics; parameter
// restore; gradient accumulation against CpuAdam (bit for bit, with the accumulator in pageable
// host, pinned host and device memory, lengths around the staging tile) and the step from an
// accumulated host sum against CpuAdam's. Every test reports SKIPPED on a machine without a GPU,
// and in a build without
// --config=cuda (where this file is compiled with no CUDA at all) — never passed.
#include "base/testing/gpu_gate.h"
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
#include "optimizer/cpu_adam.h"
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
    PS_REQUIRE_GPUS(1);
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
      // f32 lane accumulators, as CpuAdam's (its test allows the same).
      EXPECT_NEAR(stats.sum_squares, 2 * want, 1e-6 * want) << DTypeName(dtype) << " n " << n;
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

// CudaAdam gives CpuAdam's bits: the step (AdamUpdate with its explicit FMAs, nothing else
// contracted) and the gradient statistics (CpuAdam's summation order with this CPU's lanes), so a
// resumed run, whose warm-up step runs every chunk on the CPU, continues bit-exactly. Lengths
// cross the vector, tile and block boundaries; the statistics include an Inf/NaN tile and (f32)
// a tile whose squares overflow the f32 accumulators.
TEST_F(CudaAdamTest, StepAndStatsAreCpuAdamsBitForBit) {
  if (!CpuAdamSumSquaresShape().fused) {
    GTEST_SKIP() << "this CPU's Highway target (" << CpuAdamTargetName()
                 << ") has no native FMA: CudaAdam matches it within ULPs only";
  }
  ASSERT_OK_AND_ASSIGN(std::unique_ptr<CpuAdam> cpu, CpuAdam::Create({.num_threads = 2}));
  TestRng rng(11);
  std::normal_distribution<float> normal;
  for (AdamMode mode : {AdamMode::kAdam, AdamMode::kAdamW}) {
    for (DType dtype : {DType::kF32, DType::kF16, DType::kBF16}) {
      const AdamStepScalars s =
          MakeAdamStepScalars(mode, 3e-4, 0.9, 0.95, 1e-8, 0.1, /*step=*/3, 512.0, 0.3125);
      for (int64_t n : {int64_t{1}, int64_t{7}, int64_t{17}, kCpuAdamTileElems + 9,
                        kCpuAdamBlockElems + 5, 3 * kCpuAdamBlockElems + 1234}) {
        const int64_t width = SizeOf(dtype);
        DeviceArray grad(*backend_, width, n, 1), master(*backend_, 4, n, 0), m(*backend_, 4, n, 0),
            v(*backend_, 4, n, 0);
        std::vector<char> cpu_grad(n * width);
        std::vector<float> cpu_master(n), cpu_m(n), cpu_v(n);
        for (int64_t i = 0; i < n; ++i) {
          const float raw = normal(rng) * 512.0f;
          if (dtype == DType::kF32) {
            grad.host<float>()[i] = raw;
          } else {
            grad.host<uint16_t>()[i] = Narrow(dtype, raw);
          }
          master.host<float>()[i] = normal(rng) * (i % 2 ? 1.0f : 1e-3f);
          m.host<float>()[i] = 0.1f * normal(rng);
          v.host<float>()[i] = 0.01f * std::abs(normal(rng));
        }
        std::memcpy(cpu_grad.data(), grad.host<char>(), n * width);
        std::memcpy(cpu_master.data(), master.host<float>(), n * 4);
        std::memcpy(cpu_m.data(), m.host<float>(), n * 4);
        std::memcpy(cpu_v.data(), v.host<float>(), n * 4);
        for (DeviceArray* a : {&grad, &master, &m, &v}) ASSERT_OK(a->Upload(*stream_));
        ASSERT_OK(stream_->Synchronize());

        const GradSegment gpu_grads{dtype, grad.device(), n};
        const GradSegment cpu_grads{dtype, cpu_grad.data(), n};
        ASSERT_OK_AND_ASSIGN(const GradStats gpu_stats, adam_->GradientStats({&gpu_grads, 1}));
        ASSERT_OK_AND_ASSIGN(const GradStats cpu_stats, cpu->GradientStats({&cpu_grads, 1}));
        EXPECT_EQ(std::memcmp(&gpu_stats.sum_squares, &cpu_stats.sum_squares, 8), 0)
            << DTypeName(dtype) << " n " << n << ": " << gpu_stats.sum_squares << " vs "
            << cpu_stats.sum_squares;

        const AdamSegment gpu_segment{s,
                                      dtype,
                                      grad.device(),
                                      grad.device(),
                                      static_cast<float*>(master.device()),
                                      static_cast<float*>(m.device()),
                                      static_cast<float*>(v.device()),
                                      n};
        const AdamSegment cpu_segment{s,
                                      dtype,
                                      cpu_grad.data(),
                                      cpu_grad.data(),
                                      cpu_master.data(),
                                      cpu_m.data(),
                                      cpu_v.data(),
                                      n};
        ASSERT_OK(adam_->Step({&gpu_segment, 1}));
        ASSERT_OK(cpu->Step({&cpu_segment, 1}));
        for (DeviceArray* a : {&grad, &master, &m, &v}) ASSERT_OK(a->Download(*stream_));
        ASSERT_OK(stream_->Synchronize());
        EXPECT_EQ(std::memcmp(master.host<float>(), cpu_master.data(), n * 4), 0)
            << DTypeName(dtype) << " n " << n << ": master differs";
        EXPECT_EQ(std::memcmp(m.host<float>(), cpu_m.data(), n * 4), 0) << DTypeName(dtype);
        EXPECT_EQ(std::memcmp(v.host<float>(), cpu_v.data(), n * 4), 0) << DTypeName(dtype);
        EXPECT_EQ(std::memcmp(grad.host<char>(), cpu_grad.data(), n * width), 0)
            << DTypeName(dtype) << " n " << n << ": parameters differ";
        if (HasFailure()) return;
      }
    }
  }
  // Statistics of non-finite and overflowing tiles, several segments in one call.
  const int64_t n = 2 * kCpuAdamBlockElems + 77;
  DeviceArray grad(*backend_, 4, n, 0);
  for (int64_t i = 0; i < n; ++i) grad.host<float>()[i] = normal(rng);
  grad.host<float>()[5] = std::numeric_limits<float>::infinity();
  grad.host<float>()[kCpuAdamBlockElems + 3] = std::nanf("");
  for (int64_t i = 0; i < 40; ++i) grad.host<float>()[3 * kCpuAdamTileElems + i] = 3e37f;
  ASSERT_OK(grad.Upload(*stream_));
  ASSERT_OK(stream_->Synchronize());
  const GradSegment gpu_segments[] = {{DType::kF32, grad.device(), n},
                                      {DType::kF32, grad.device(), 1000}};
  const GradSegment cpu_segments[] = {{DType::kF32, grad.host<float>(), n},
                                      {DType::kF32, grad.host<float>(), 1000}};
  ASSERT_OK_AND_ASSIGN(const GradStats gpu_stats, adam_->GradientStats(gpu_segments));
  ASSERT_OK_AND_ASSIGN(const GradStats cpu_stats, cpu->GradientStats(cpu_segments));
  EXPECT_EQ(gpu_stats.nonfinite_elems, cpu_stats.nonfinite_elems);
  EXPECT_EQ(gpu_stats.nonfinite_elems, 3);
  EXPECT_EQ(std::memcmp(&gpu_stats.sum_squares, &cpu_stats.sum_squares, 8), 0)
      << gpu_stats.sum_squares << " vs " << cpu_stats.sum_squares;
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

// Where a test keeps the f32 accumulator.
enum class AccMemory { kPageable, kPinned, kDevice };

const char* AccMemoryName(AccMemory m) {
  switch (m) {
    case AccMemory::kPageable:
      return "pageable host";
    case AccMemory::kPinned:
      return "pinned host";
    case AccMemory::kDevice:
      return "device";
  }
  return "?";
}

// An f32 accumulator of n elements, `offset_elems` in, in one kind of memory, with its host value.
class Accumulator {
 public:
  Accumulator(Backend& backend, AccMemory memory, int64_t n, int64_t offset_elems)
      : backend_(backend), memory_(memory), n_(n), host_(n + offset_elems), off_(offset_elems) {
    const int64_t bytes = std::max<int64_t>(4, (n + offset_elems) * 4);
    if (memory == AccMemory::kPinned) {
      auto p = backend.AllocatePinnedHost(bytes);
      CHECK(p.ok()) << p.status();
      base_ = static_cast<float*>(*p);
    } else if (memory == AccMemory::kDevice) {
      auto p = backend.AllocateDevice(bytes);
      CHECK(p.ok()) << p.status();
      base_ = static_cast<float*>(*p);
    }
  }
  ~Accumulator() {
    if (memory_ == AccMemory::kPinned) CHECK(backend_.FreePinnedHost(base_).ok());
    if (memory_ == AccMemory::kDevice) CHECK(backend_.FreeDevice(base_).ok());
  }
  // The host value (what Upload sends, what Download fills).
  float* host() { return host_.data() + off_; }
  // What the kernels get.
  float* acc() { return memory_ == AccMemory::kPageable ? host() : base_ + off_; }
  absl::Status Upload(Stream& s) {
    if (memory_ == AccMemory::kPageable || n_ == 0) return absl::OkStatus();
    if (memory_ == AccMemory::kPinned) {
      std::memcpy(acc(), host(), n_ * 4);
      return absl::OkStatus();
    }
    return s.MemcpyAsync(acc(), host(), n_ * 4, CopyKind::kHostToDevice);
  }
  absl::Status Download(Stream& s) {
    if (memory_ == AccMemory::kPageable || n_ == 0) return absl::OkStatus();
    if (memory_ == AccMemory::kPinned) {
      std::memcpy(host(), acc(), n_ * 4);
      return absl::OkStatus();
    }
    return s.MemcpyAsync(host(), acc(), n_ * 4, CopyKind::kDeviceToHost);
  }

 private:
  Backend& backend_;
  AccMemory memory_;
  int64_t n_;
  std::vector<float> host_;
  int64_t off_;
  float* base_ = nullptr;
};

uint32_t Bits(float x) {
  uint32_t b;
  std::memcpy(&b, &x, sizeof(b));
  return b;
}

// Fills n gradients of `dtype` (host side of `grad`) with normal values times `scale`, and with
// `specials` a few Inf/NaN/subnormal ones; returns their widened values.
std::vector<float> FillGradients(TestRng& rng, DType dtype, DeviceArray& grad, int64_t n,
                                 float scale, bool specials) {
  std::normal_distribution<float> normal;
  std::uniform_int_distribution<int> pick(0, 99);
  std::vector<float> wide(n);
  for (int64_t i = 0; i < n; ++i) {
    float x = normal(rng) * scale;
    if (specials) {
      const int p = pick(rng);
      if (p == 0) x = std::numeric_limits<float>::infinity();
      if (p == 1) x = std::nanf("");
      if (p == 2) x = std::numeric_limits<float>::denorm_min();
      if (p == 3) x = -0.0f;
    }
    if (dtype == DType::kF32) {
      grad.host<float>()[i] = x;
    } else {
      grad.host<uint16_t>()[i] = Narrow(dtype, x);
      x = Widen(dtype, grad.host<uint16_t>()[i]);
    }
    wide[i] = x;
  }
  return wide;
}

// Three micro-batches of AccumulateGradients on the GPU and on CpuAdam give the same
// accumulator bits, wherever the GPU's accumulator lives, for lengths around the staging tile.
TEST_F(CudaAdamTest, AccumulateGradientsMatchesCpuAdamBitForBit) {
  ASSERT_OK_AND_ASSIGN(std::unique_ptr<CpuAdam> cpu, CpuAdam::Create({.num_threads = 1}));
  TestRng rng(13);
  std::normal_distribution<float> normal;
  const int64_t tile = kCudaAdamStagingBytes / 4;
  for (DType dtype : {DType::kF32, DType::kF16, DType::kBF16}) {
    for (int64_t n : {int64_t{0}, int64_t{1}, int64_t{3}, int64_t{1025}, tile - 1, tile, tile + 5,
                      2 * tile + 3}) {
      for (int64_t off : {0, 1}) {
        for (AccMemory memory : {AccMemory::kPageable, AccMemory::kPinned, AccMemory::kDevice}) {
          SCOPED_TRACE(::testing::Message() << DTypeName(dtype) << " n=" << n << " off=" << off
                                            << " accumulator in " << AccMemoryName(memory));
          DeviceArray grad(*backend_, SizeOf(dtype), n, off);
          Accumulator gpu_acc(*backend_, memory, n, off);
          std::vector<float> want(n);
          for (int64_t i = 0; i < n; ++i) want[i] = gpu_acc.host()[i] = normal(rng);
          ASSERT_OK(gpu_acc.Upload(*stream_));
          for (int micro = 0; micro < 3; ++micro) {
            FillGradients(rng, dtype, grad, n, 1.0f, /*specials=*/true);
            ASSERT_OK(grad.Upload(*stream_));
            ASSERT_OK(stream_->Synchronize());
            const GradAccumulateSegment on_host{dtype, grad.host<char>(), want.data(), n};
            ASSERT_OK(cpu->AccumulateGradients({&on_host, 1}));
            const GradAccumulateSegment on_gpu{dtype, grad.device(), gpu_acc.acc(), n};
            ASSERT_OK(adam_->AccumulateGradients({&on_gpu, 1}));
          }
          ASSERT_OK(gpu_acc.Download(*stream_));
          ASSERT_OK(stream_->Synchronize());
          int failures = 0;
          for (int64_t i = 0; i < n && failures < 5; ++i) {
            const float got = gpu_acc.host()[i];
            if (std::isnan(want[i]) ? !std::isnan(got) : Bits(got) != Bits(want[i])) {
              ++failures;
              ADD_FAILURE() << "element " << i << ": GPU " << got << ", CpuAdam " << want[i];
            }
          }
        }
      }
    }
  }
}

// The update from an accumulated f32 sum in host memory (staged through the tile when pageable,
// read in place when pinned) matches CpuAdam's step from the same sum, and RestoreParams then
// writes the parameters exactly as rounded from the GPU's master.
TEST_F(CudaAdamTest, StepFromAccumulatedHostSumMatchesCpuAdam) {
  ASSERT_OK_AND_ASSIGN(std::unique_ptr<CpuAdam> cpu, CpuAdam::Create({.num_threads = 1}));
  TestRng rng(17);
  std::normal_distribution<float> normal;
  constexpr int kMicroBatches = 3;
  const int64_t tile = kCudaAdamStagingBytes / 4;
  for (DType dtype : {DType::kF32, DType::kF16, DType::kBF16}) {
    const double loss_scale = dtype == DType::kF16 ? 1024.0 : 1.0;
    for (int64_t n : {int64_t{1}, int64_t{5}, int64_t{1025}, tile + 7, int64_t{100003}}) {
      for (int64_t off : {0, 3}) {
        for (AccMemory memory : {AccMemory::kPageable, AccMemory::kPinned}) {
          SCOPED_TRACE(::testing::Message() << DTypeName(dtype) << " n=" << n << " off=" << off
                                            << " accumulator in " << AccMemoryName(memory));
          DeviceArray grad(*backend_, SizeOf(dtype), n, off), param(*backend_, SizeOf(dtype), n, 1),
              master(*backend_, 4, n, off), m(*backend_, 4, n, 0), v(*backend_, 4, n, off);
          Accumulator gpu_acc(*backend_, memory, n, off);
          std::vector<float> cpu_acc(n, 0.0f), p0(n), m0(n), v0(n);
          for (int64_t i = 0; i < n; ++i) {
            gpu_acc.host()[i] = 0.0f;
            master.host<float>()[i] = p0[i] = normal(rng) * (i % 2 ? 1.0f : 1e-3f);
            m.host<float>()[i] = m0[i] = 0.1f * normal(rng);
            v.host<float>()[i] = v0[i] = 0.01f * std::abs(normal(rng));
          }
          ASSERT_OK(gpu_acc.Upload(*stream_));
          for (DeviceArray* a : {&master, &m, &v}) ASSERT_OK(a->Upload(*stream_));
          for (int micro = 0; micro < kMicroBatches; ++micro) {
            FillGradients(rng, dtype, grad, n, static_cast<float>(loss_scale), /*specials=*/false);
            ASSERT_OK(grad.Upload(*stream_));
            ASSERT_OK(stream_->Synchronize());
            const GradAccumulateSegment on_host{dtype, grad.host<char>(), cpu_acc.data(), n};
            ASSERT_OK(cpu->AccumulateGradients({&on_host, 1}));
            const GradAccumulateSegment on_gpu{dtype, grad.device(), gpu_acc.acc(), n};
            ASSERT_OK(adam_->AccumulateGradients({&on_gpu, 1}));
          }
          const AdamStepScalars s =
              MakeAdamStepScalars(AdamMode::kAdamW, 1e-3, 0.9, 0.999, 1e-8, 0.01, 3,
                                  loss_scale * kMicroBatches, /*clip_coef=*/0.5);
          std::vector<float> pc = p0, mc = m0, vc = v0;
          const AdamSegment host_segment{s,         DType::kF32, cpu_acc.data(), nullptr,
                                         pc.data(), mc.data(),   vc.data(),      n};
          ASSERT_OK(cpu->Step({&host_segment, 1}).status());
          const AdamSegment gpu_segment{s,
                                        DType::kF32,
                                        gpu_acc.acc(),
                                        nullptr,
                                        static_cast<float*>(master.device()),
                                        static_cast<float*>(m.device()),
                                        static_cast<float*>(v.device()),
                                        n};
          ASSERT_OK_AND_ASSIGN(const AdamStepResult result, adam_->Step({&gpu_segment, 1}));
          EXPECT_EQ(result.nonfinite_elems, 0);
          const ParamRestoreSegment restore{static_cast<const float*>(master.device()), dtype,
                                            param.device(), n};
          ASSERT_OK(adam_->RestoreParams({&restore, 1}));
          for (DeviceArray* a : {&param, &master, &m, &v}) ASSERT_OK(a->Download(*stream_));
          ASSERT_OK(stream_->Synchronize());
          int failures = 0;
          for (int64_t i = 0; i < n && failures < 5; ++i) {
            // Both devices form fused multiply-adds, not necessarily the same ones: a few ULP of
            // each quantity's scale.
            const double g = std::abs(cpu_acc[i] / (loss_scale * kMicroBatches) * s.clip_coef);
            const double p_scale =
                std::abs(p0[i]) + s.step_size * (std::abs(mc[i]) + g) / (std::sqrt(vc[i]) + s.eps);
            const double m_scale = std::abs(m0[i]) + g;
            const double v_scale = v0[i] + g * g;
            const float got_p = master.host<float>()[i];
            const bool ok = std::abs(got_p - pc[i]) <= 8 * FLT_EPSILON * p_scale + FLT_MIN &&
                            std::abs(m.host<float>()[i] - mc[i]) <= 8 * FLT_EPSILON * m_scale &&
                            std::abs(v.host<float>()[i] - vc[i]) <= 8 * FLT_EPSILON * v_scale;
            const bool param_ok = dtype == DType::kF32
                                      ? param.host<float>()[i] == got_p
                                      : param.host<uint16_t>()[i] == Narrow(dtype, got_p);
            if (!ok || !param_ok) {
              ++failures;
              ADD_FAILURE() << "element " << i << ": master " << got_p << " (CpuAdam " << pc[i]
                            << "), m " << m.host<float>()[i] << " (" << mc[i] << "), v "
                            << v.host<float>()[i] << " (" << vc[i] << ")";
            }
          }
        }
      }
    }
  }
}

TEST_F(CudaAdamTest, HostMemoryItCannotStageIsInvalidArgument) {
  std::vector<float> host_grad(8, 1.0f), host_acc(8, 0.0f), host_param(8, 0.0f);
  DeviceArray master(*backend_, 4, 8, 0), m(*backend_, 4, 8, 0), v(*backend_, 4, 8, 0);
  // Accumulating needs the gradients on the GPU.
  const GradAccumulateSegment acc{DType::kF32, host_grad.data(), host_acc.data(), 8};
  EXPECT_THAT(adam_->AccumulateGradients({&acc, 1}),
              StatusIs(absl::StatusCode::kInvalidArgument, "segment 0's gradients"));
  // A staged update cannot write host parameters.
  const AdamSegment step{MakeAdamStepScalars(AdamMode::kAdam, 1e-3, 0.9, 0.999, 1e-8, 0, 1),
                         DType::kF32,
                         host_grad.data(),
                         host_param.data(),
                         static_cast<float*>(master.device()),
                         static_cast<float*>(m.device()),
                         static_cast<float*>(v.device()),
                         8};
  EXPECT_THAT(adam_->Step({&step, 1}), StatusIs(absl::StatusCode::kInvalidArgument, "param"));
  EXPECT_EQ(host_acc[0], 0.0f);
}

TEST(CudaAdamCreateTest, RejectsTheCpuBackend) {
  ASSERT_OK_AND_ASSIGN(auto cpu, CreateCpuBackend({.capacity_bytes = 1 << 20}));
  EXPECT_THAT(CudaAdam::Create(*cpu), StatusIs(absl::StatusCode::kInvalidArgument, "CpuAdam"));
}

#else  // !PS_WITH_CUDA

TEST(CudaAdam, NotBuilt) { PS_REQUIRE_GPUS(1); }

#endif

}  // namespace
}  // namespace ps
