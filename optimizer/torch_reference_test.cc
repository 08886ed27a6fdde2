// CpuAdam against PyTorch: fixed vectors produced once by torch.optim.Adam / torch.optim.AdamW
// (PyTorch 2.15.0, CPU) and checked in under optimizer/testdata/ (see make_reference.py there for
// the exact command). Four steps of a 257-element parameter with weight decay and a learning rate
// that changes before every step; the same gradients are fed as f32, f16 and bf16 (they are exact
// in all three), with and without a power-of-two loss scale, on every Highway target.
//
// PyTorch computes the moments with lerp and divides by sqrt(1 - beta2^t) where we multiply by its
// reciprocal (optimizer/adam_math.h), so agreement is to f32 rounding, not bit-exact.
#include <cmath>
#include <cstdint>
#include <fstream>
#include <memory>
#include <sstream>
#include <string>
#include <vector>

#include "base/testing/status_matchers.h"
#include "gtest/gtest.h"
#include "hwy/highway.h"
#include "hwy/tests/hwy_gtest.h"
#include "memory/dtype.h"
#include "memory/dtype_math.h"
#include "optimizer/adam_kernels.h"
#include "optimizer/adam_math.h"
#include "optimizer/cpu_adam.h"

namespace ps {
namespace {

struct TorchCase {
  AdamMode mode = AdamMode::kAdam;
  double beta1 = 0, beta2 = 0, eps = 0, weight_decay = 0;
  int64_t n = 0;
  std::vector<float> param0;
  std::vector<double> lr;                  // per step
  std::vector<std::vector<float>> grad;    // per step
  std::vector<std::vector<float>> param;   // after each step
  std::vector<float> exp_avg, exp_avg_sq;  // after the last step
};

std::vector<float> ReadFloats(std::istringstream& in, int64_t n) {
  std::vector<float> v(n);
  for (int64_t i = 0; i < n; ++i) {
    double x;
    in >> x;
    v[i] = static_cast<float>(x);
  }
  return v;
}

// Parses the format described in optimizer/testdata/make_reference.py.
TorchCase LoadCase(const std::string& name) {
  const std::string path = "optimizer/testdata/" + name + ".txt";
  std::ifstream file(path);
  EXPECT_TRUE(file.good()) << "cannot open " << path;
  TorchCase c;
  std::string line;
  while (std::getline(file, line)) {
    if (line.empty() || line[0] == '#') continue;
    std::istringstream in(line);
    std::string key;
    in >> key;
    if (key == "config") {
      std::string mode;
      int64_t steps;
      in >> mode >> c.beta1 >> c.beta2 >> c.eps >> c.weight_decay >> c.n >> steps;
      c.mode = mode == "adamw" ? AdamMode::kAdamW : AdamMode::kAdam;
    } else if (key == "param0") {
      c.param0 = ReadFloats(in, c.n);
    } else if (key == "step") {
      int64_t t;
      double lr;
      in >> t >> lr;
      c.lr.push_back(lr);
    } else if (key == "grad") {
      c.grad.push_back(ReadFloats(in, c.n));
    } else if (key == "param") {
      c.param.push_back(ReadFloats(in, c.n));
    } else if (key == "exp_avg") {
      c.exp_avg = ReadFloats(in, c.n);
    } else if (key == "exp_avg_sq") {
      c.exp_avg_sq = ReadFloats(in, c.n);
    } else {
      ADD_FAILURE() << path << ": unknown record " << key;
    }
  }
  EXPECT_EQ(c.grad.size(), c.lr.size());
  EXPECT_EQ(c.param.size(), c.lr.size());
  EXPECT_GT(c.n, 0);
  return c;
}

class TorchReferenceTest : public hwy::TestWithParamTarget {};
HWY_TARGET_INSTANTIATE_TEST_SUITE_P(TorchReferenceTest);

TEST_P(TorchReferenceTest, MatchesPyTorch) {
  ASSERT_OK_AND_ASSIGN(auto adam, CpuAdam::Create({.num_threads = 2}));
  for (const std::string name : {"adam_l2", "adamw", "adamw_beta_eps"}) {
    const TorchCase c = LoadCase(name);
    ASSERT_FALSE(HasFailure());
    for (DType dtype : {DType::kF32, DType::kF16, DType::kBF16}) {
      for (double loss_scale : {1.0, 256.0}) {
        SCOPED_TRACE(name + " " + std::string(DTypeName(dtype)) + " loss scale " +
                     std::to_string(loss_scale));
        std::vector<float> master = c.param0, m(c.n, 0.0f), v(c.n, 0.0f), grad32(c.n);
        std::vector<uint16_t> grad16(c.n);
        for (size_t t = 0; t < c.lr.size(); ++t) {
          for (int64_t i = 0; i < c.n; ++i) {
            const float g = c.grad[t][i] * static_cast<float>(loss_scale);  // exact
            grad32[i] = g;
            grad16[i] = dtype == DType::kF16 ? FloatToHalfBits(g) : FloatToBFloat16Bits(g);
            ASSERT_EQ(dtype == DType::kF16    ? HalfBitsToFloat(grad16[i])
                      : dtype == DType::kBF16 ? BFloat16BitsToFloat(grad16[i])
                                              : g,
                      g)
                << "reference gradient not exact in " << DTypeName(dtype);
          }
          void* grad = dtype == DType::kF32 ? static_cast<void*>(grad32.data())
                                            : static_cast<void*>(grad16.data());
          const AdamSegment segment{
              MakeAdamStepScalars(c.mode, c.lr[t], c.beta1, c.beta2, c.eps, c.weight_decay,
                                  static_cast<int64_t>(t + 1), loss_scale),
              dtype,
              grad,
              grad,
              master.data(),
              m.data(),
              v.data(),
              c.n};
          ASSERT_OK(adam->Step({&segment, 1}));
          for (int64_t i = 0; i < c.n; ++i) {
            const double want = c.param[t][i];
            ASSERT_NEAR(master[i], want, 2e-6 * (std::abs(want) + c.lr[t]))
                << "step " << t + 1 << " element " << i;
          }
        }
        for (int64_t i = 0; i < c.n; ++i) {
          // m averages gradients of magnitude ~0.5 that can cancel: the rounding error is relative
          // to the terms (~0.05 per step), not to m.
          ASSERT_NEAR(m[i], c.exp_avg[i], 1e-6 * (std::abs(c.exp_avg[i]) + 0.02)) << i;
          ASSERT_NEAR(v[i], c.exp_avg_sq[i], 1e-5 * std::abs(c.exp_avg_sq[i]) + 1e-12) << i;
        }
      }
    }
  }
}

}  // namespace
}  // namespace ps
