// Tests for optimizer/hybrid_adam.h over real chunks: a ChunkStore whose payloads live on the host
// and on the cpu backend's emulated accelerator, stepped through ResidentChunkAccess. Results are
// checked against the scalar reference (optimizer/adam_math.h) per tensor with its group's
// hyperparameters; overflow, loss scaling, clipping, learning-rate changes and errors are checked
// against hand-computed values.
#include "optimizer/hybrid_adam.h"

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <memory>
#include <random>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "base/testing/status_matchers.h"
#include "base/testing/test_rng.h"
#include "chunk/chunk.h"
#include "chunk/chunk_layout.h"
#include "chunk/chunk_store.h"
#include "chunk/chunk_type.h"
#include "chunk/operator_spec.h"
#include "chunk/testing/test_memory_resources.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "memory/backend.h"
#include "memory/cpu_backend.h"
#include "memory/dtype.h"
#include "memory/dtype_math.h"
#include "optimizer/adam_kernels.h"
#include "optimizer/adam_math.h"
#include "optimizer/cpu_adam.h"
#include "optimizer/grad_accumulator.h"
#include "optimizer/loss_scaler.h"

namespace ps {
namespace {

using ::testing::AllOf;
using ::testing::HasSubstr;

// A small GPT-like model: per block a LayerNorm, an attention projection and an MLP, with awkward
// sizes; tensor offsets aligned to 3 elements so chunks have gaps between tensors.
std::vector<OperatorSpec> Model(int blocks) {
  std::vector<OperatorSpec> ops;
  ops.push_back({"wte", {{"wte.weight", {37, 16}}}});
  for (int b = 0; b < blocks; ++b) {
    const std::string h = "h." + std::to_string(b) + ".";
    ops.push_back({h + "ln_1", {{h + "ln_1.weight", {16}}, {h + "ln_1.bias", {16}}}});
    ops.push_back(
        {h + "attn", {{h + "attn.c_attn.weight", {16, 47}}, {h + "attn.c_attn.bias", {47}}}});
    ops.push_back({h + "mlp", {{h + "mlp.c_fc.weight", {16, 61}}, {h + "mlp.c_fc.bias", {61}}}});
  }
  ops.push_back({"ln_f", {{"ln_f.weight", {16}}, {"ln_f.bias", {16}}}});
  return ops;
}

float ReadParam(DType dtype, const void* payload, int64_t i) {
  switch (dtype) {
    case DType::kF32:
      return static_cast<const float*>(payload)[i];
    case DType::kF16:
      return HalfBitsToFloat(static_cast<const uint16_t*>(payload)[i]);
    case DType::kBF16:
      return BFloat16BitsToFloat(static_cast<const uint16_t*>(payload)[i]);
  }
  return 0;
}

void WriteParam(DType dtype, void* payload, int64_t i, float x) {
  switch (dtype) {
    case DType::kF32:
      static_cast<float*>(payload)[i] = x;
      break;
    case DType::kF16:
      static_cast<uint16_t*>(payload)[i] = FloatToHalfBits(x);
      break;
    case DType::kBF16:
      static_cast<uint16_t*>(payload)[i] = FloatToBFloat16Bits(x);
      break;
  }
}

// Bytes of a chunk's payload, for bitwise comparisons.
std::vector<uint8_t> PayloadBytes(const Chunk& chunk) {
  const auto* p = static_cast<const uint8_t*>(chunk.payload());
  return std::vector<uint8_t>(p, p + chunk.capacity_bytes());
}

class HybridAdamTest : public ::testing::Test {
 protected:
  // Builds the store for `rank` of `world` ranks and gives every chunk this rank holds a payload:
  // owned chunks whose index is in `on_accelerator` on the emulated accelerator, the rest on the
  // host. Payloads start as: gaps NaN; master random; param = master rounded (the parameters),
  // momentum/variance zero.
  //
  // With `frozen_ops` > 0 the model's first operators are frozen (a LoRA base): their chunks get
  // only a param payload, filled with values that would change any statistic they entered (large,
  // and one +Inf).
  void Build(DType dtype, int world = 1, int rank = 0, std::vector<int64_t> on_accelerator = {},
             int blocks = 4, int frozen_ops = 0) {
    dtype_ = dtype;
    // Tear down a previous build in dependency order: chunks, then resources, then the backend.
    store_.reset();
    device_.reset();
    backend_.reset();
    std::vector<OperatorSpec> model = Model(blocks);
    for (int k = 0; k < frozen_ops; ++k) model[k].trainable = false;
    ASSERT_OK_AND_ASSIGN(
        ChunkLayout layout,
        ChunkLayout::Build(
            {.capacity_elems = 2400, .world_size = world, .tensor_alignment_elems = 3}, model));
    ASSERT_OK_AND_ASSIGN(
        store_, ChunkStore::Create(std::move(layout), {.compute_dtype = dtype, .rank = rank}));
    ASSERT_OK_AND_ASSIGN(backend_, CreateCpuBackend({.capacity_bytes = int64_t{64} << 20}));
    device_ = std::make_unique<TestDeviceResource>(*backend_);
    ASSERT_OK_AND_ASSIGN(cpu_adam_, CpuAdam::Create({.num_threads = 2}));
    TestRng rng(7);
    std::normal_distribution<float> normal;
    for (int64_t i = 0; i < store_->num_chunks(); ++i) {
      const bool accel =
          std::find(on_accelerator.begin(), on_accelerator.end(), i) != on_accelerator.end();
      for (ChunkType type : kAllChunkTypes) {
        if (!store_->layout().HoldsPayload(type, i, rank)) continue;
        Chunk& chunk = store_->chunk(type, i);
        ASSERT_OK(chunk.AllocatePayload(accel ? static_cast<MemoryResource&>(*device_) : host_));
        // NaN everywhere first: the gaps between tensors must never be read as gradients.
        if (type == ChunkType::kParam) {
          for (int64_t e = 0; e < chunk.capacity_elems(); ++e) {
            WriteParam(dtype, chunk.payload(), e, std::numeric_limits<float>::quiet_NaN());
          }
        } else {
          auto* f = static_cast<float*>(chunk.payload());
          std::fill(f, f + chunk.capacity_elems(), std::numeric_limits<float>::quiet_NaN());
        }
      }
      if (!store_->layout().chunk_trainable(i) &&
          store_->layout().HoldsPayload(ChunkType::kParam, i, rank)) {
        for (TensorId id : store_->layout().TensorsInChunk(i)) {
          const TensorInfo& t = store_->layout().tensor(id);
          for (int64_t e = t.offset_elems; e < t.offset_elems + t.numel; ++e) {
            WriteParam(dtype, ParamPayload(i), e, 1000.0f + normal(rng));
          }
          WriteParam(dtype, ParamPayload(i), t.offset_elems,
                     std::numeric_limits<float>::infinity());
        }
      }
      if (!store_->layout().HoldsPayload(ChunkType::kMaster, i, rank)) continue;
      for (TensorId id : store_->layout().TensorsInChunk(i)) {
        const TensorInfo& t = store_->layout().tensor(id);
        for (int64_t e = t.offset_elems; e < t.offset_elems + t.numel; ++e) {
          const float p = normal(rng);
          Master(i)[e] = p;
          Momentum(i)[e] = 0.0f;
          Variance(i)[e] = 0.0f;
          WriteParam(dtype, ParamPayload(i), e, p);
        }
      }
    }
  }

  float* Master(int64_t i) {
    return static_cast<float*>(store_->chunk(ChunkType::kMaster, i).payload());
  }
  float* Momentum(int64_t i) {
    return static_cast<float*>(store_->chunk(ChunkType::kMomentum, i).payload());
  }
  float* Variance(int64_t i) {
    return static_cast<float*>(store_->chunk(ChunkType::kVariance, i).payload());
  }
  void* ParamPayload(int64_t i) { return store_->chunk(ChunkType::kParam, i).payload(); }

  // Writes gradients (times `loss_scale`) into the param slots of every owned tensor:
  // grad(tensor element e) = f(chunk, e).
  template <typename F>
  void WriteGradients(const HybridAdam& adam, F f) {
    for (int64_t i : adam.owned_chunks()) {
      for (TensorId id : store_->layout().TensorsInChunk(i)) {
        const TensorInfo& t = store_->layout().tensor(id);
        for (int64_t e = t.offset_elems; e < t.offset_elems + t.numel; ++e) {
          WriteParam(dtype_, ParamPayload(i), e, f(i, e));
        }
      }
    }
  }

  void WriteRandomGradients(const HybridAdam& adam, float loss_scale, uint32_t seed) {
    TestRng rng(seed);
    std::normal_distribution<float> normal;
    WriteGradients(adam, [&](int64_t, int64_t) { return normal(rng) * loss_scale; });
  }

  struct Snapshot {
    std::vector<std::vector<float>> master, m, v;
    std::vector<std::vector<float>> grad;  // widened
  };
  Snapshot Take(const HybridAdam& adam) {
    Snapshot s;
    for (int64_t i : adam.owned_chunks()) {
      const int64_t n = store_->layout().capacity_elems();
      s.master.emplace_back(Master(i), Master(i) + n);
      s.m.emplace_back(Momentum(i), Momentum(i) + n);
      s.v.emplace_back(Variance(i), Variance(i) + n);
      std::vector<float> g(n);
      for (int64_t e = 0; e < n; ++e) g[e] = ReadParam(dtype_, ParamPayload(i), e);
      s.grad.push_back(std::move(g));
    }
    return s;
  }

  // Checks every owned tensor element against AdamUpdate with its group's constants for step
  // `step`, and that gaps were not touched.
  void ExpectStepped(const HybridAdam& adam, const Snapshot& before, int64_t step,
                     double loss_scale, double clip_coef) {
    int failures = 0;
    for (size_t k = 0; k < adam.owned_chunks().size(); ++k) {
      const int64_t i = adam.owned_chunks()[k];
      std::vector<bool> in_tensor(store_->layout().capacity_elems(), false);
      for (TensorId id : store_->layout().TensorsInChunk(i)) {
        const TensorInfo& t = store_->layout().tensor(id);
        const int group = adam.group_of(id);
        ASSERT_GE(group, 0) << t.name;
        const ParamGroupSettings& settings = adam.param_group(group);
        const AdamStepScalars s =
            MakeAdamStepScalars(adam.mode(), settings.lr, 0.9, 0.999, 1e-8, settings.weight_decay,
                                step, loss_scale, clip_coef);
        for (int64_t e = t.offset_elems; e < t.offset_elems + t.numel; ++e) {
          in_tensor[e] = true;
          float p = before.master[k][e], m = before.m[k][e], v = before.v[k][e];
          AdamUpdate(s, before.grad[k][e], p, m, v);
          const float got = Master(i)[e];
          // Tolerances scale with the magnitudes of the terms of each formula (m may cancel);
          // the kernels' own ULP-level agreement is tested in cpu_adam_test.
          const double g = std::abs(before.grad[k][e] / loss_scale * clip_coef) +
                           std::abs(s.l2 * before.master[k][e]);
          const double m_scale = 0.9 * std::abs(before.m[k][e]) + 0.1 * g;
          const bool ok =
              std::abs(got - p) <= 1e-6 * (std::abs(before.master[k][e]) + settings.lr) &&
              std::abs(Momentum(i)[e] - m) <= 1e-6 * m_scale + 1e-30 &&
              std::abs(Variance(i)[e] - v) <= 1e-6 * (std::abs(v) + 1e-3 * g * g) + 1e-30;
          const float param = ReadParam(dtype_, ParamPayload(i), e);
          float rounded = got;
          if (dtype_ == DType::kF16) rounded = HalfBitsToFloat(FloatToHalfBits(got));
          if (dtype_ == DType::kBF16) rounded = BFloat16BitsToFloat(FloatToBFloat16Bits(got));
          if ((!ok || param != rounded) && failures++ < 5) {
            ADD_FAILURE() << t.name << "[" << e - t.offset_elems << "] chunk " << i << ": master "
                          << got << " want " << p << ", param " << param << " want " << rounded
                          << ", m " << Momentum(i)[e] << " want " << m << ", v " << Variance(i)[e]
                          << " want " << v;
          }
        }
      }
      for (int64_t e = 0; e < store_->layout().capacity_elems(); ++e) {
        if (!in_tensor[e] && !std::isnan(Master(i)[e]) && failures++ < 5) {
          ADD_FAILURE() << "gap element " << e << " of master#" << i << " was written";
        }
      }
    }
  }

  HybridAdamKernels Kernels(bool with_accelerator = true) {
    return {cpu_adam_.get(), with_accelerator ? cpu_adam_.get() : nullptr};
  }

  static HybridAdamOptions AdamWWithNoDecayGroup() {
    HybridAdamOptions options;
    options.mode = AdamMode::kAdamW;
    options.groups = {
        {.name = "no_decay", .lr = 1e-3, .weight_decay = 0.0, .selector = IsBiasOrNormTensor},
        {.name = "decay", .lr = 1e-3, .weight_decay = 0.1}};
    return options;
  }

  DType dtype_ = DType::kF16;
  TestHostResource host_;
  std::unique_ptr<Backend> backend_;
  std::unique_ptr<TestDeviceResource> device_;
  std::unique_ptr<ChunkStore> store_;
  std::unique_ptr<CpuAdam> cpu_adam_;
};

TEST_F(HybridAdamTest, StepsEveryOwnedChunkWhereItsMasterLives) {
  for (DType dtype : {DType::kF16, DType::kBF16, DType::kF32}) {
    SCOPED_TRACE(DTypeName(dtype));
    Build(dtype, 1, 0, /*on_accelerator=*/{1, 3});
    ASSERT_OK_AND_ASSIGN(auto adam, HybridAdam::Create(store_->layout(), 0, dtype,
                                                       AdamWWithNoDecayGroup(), Kernels()));
    ASSERT_GE(adam->owned_chunks().size(), 4u);
    ResidentChunkAccess access(*store_);
    for (int64_t step = 1; step <= 3; ++step) {
      WriteRandomGradients(*adam, 1.0f, 100 + step);
      const Snapshot before = Take(*adam);
      ASSERT_OK_AND_ASSIGN(const AdamStepReport report, adam->Step(access));
      EXPECT_FALSE(report.skipped);
      EXPECT_EQ(report.step, step);
      EXPECT_EQ(report.accelerator_chunks, 2);
      EXPECT_EQ(report.host_chunks, static_cast<int64_t>(adam->owned_chunks().size()) - 2);
      ExpectStepped(*adam, before, step, 1.0, 1.0);
    }
  }
}

TEST_F(HybridAdamTest, GroupsGetTheirOwnWeightDecay) {
  Build(DType::kF32);
  ASSERT_OK_AND_ASSIGN(auto adam, HybridAdam::Create(store_->layout(), 0, DType::kF32,
                                                     AdamWWithNoDecayGroup(), Kernels()));
  const ChunkLayout& layout = store_->layout();
  ASSERT_OK_AND_ASSIGN(TensorId bias, layout.FindTensor("h.1.attn.c_attn.bias"));
  ASSERT_OK_AND_ASSIGN(TensorId norm, layout.FindTensor("h.2.ln_1.weight"));
  ASSERT_OK_AND_ASSIGN(TensorId weight, layout.FindTensor("h.2.mlp.c_fc.weight"));
  EXPECT_EQ(adam->param_group_name(adam->group_of(bias)), "no_decay");
  EXPECT_EQ(adam->param_group_name(adam->group_of(norm)), "no_decay");
  EXPECT_EQ(adam->param_group_name(adam->group_of(weight)), "decay");
  // Zero gradients: AdamW moves only the decayed group, by exactly the factor 1 - lr * wd.
  WriteGradients(*adam, [](int64_t, int64_t) { return 0.0f; });
  const Snapshot before = Take(*adam);
  ResidentChunkAccess access(*store_);
  ASSERT_OK(adam->Step(access));
  for (TensorId id : {bias, norm, weight}) {
    const TensorInfo& t = layout.tensor(id);
    const size_t k =
        std::find(adam->owned_chunks().begin(), adam->owned_chunks().end(), t.chunk_index) -
        adam->owned_chunks().begin();
    const float factor = id == weight ? static_cast<float>(1.0 - 1e-3 * 0.1) : 1.0f;
    for (int64_t e = t.offset_elems; e < t.offset_elems + t.numel; ++e) {
      ASSERT_EQ(Master(t.chunk_index)[e], before.master[k][e] * factor) << t.name;
    }
  }
}

// PatrickStar froze lr at construction; here a schedule that changes it between steps takes
// effect at the next step.
TEST_F(HybridAdamTest, LearningRateIsReadAtEveryStep) {
  Build(DType::kF16);
  HybridAdamOptions options;
  options.mode = AdamMode::kAdam;
  options.groups = {{.name = "all", .lr = 1e-3, .weight_decay = 0.01}};
  ASSERT_OK_AND_ASSIGN(auto adam,
                       HybridAdam::Create(store_->layout(), 0, DType::kF16, options, Kernels()));
  ResidentChunkAccess access(*store_);
  for (int64_t step = 1; step <= 4; ++step) {
    adam->SetLearningRate(1e-3 * step);
    WriteRandomGradients(*adam, 1.0f, 200 + step);
    const Snapshot before = Take(*adam);
    ASSERT_OK(adam->Step(access));
    ExpectStepped(*adam, before, step, 1.0, 1.0);
  }
  // The first Adam step moves every parameter by lr * sign(g) (m = v = 0): check it with a fresh
  // optimizer and lr 0.25, where the move dwarfs f16 rounding.
  adam.reset();
  Build(DType::kF32);
  ASSERT_OK_AND_ASSIGN(adam, HybridAdam::Create(store_->layout(), 0, DType::kF32, {}, Kernels()));
  adam->SetLearningRate(0.25);
  WriteGradients(*adam, [](int64_t, int64_t e) { return e % 2 ? 3.0f : -0.5f; });
  const Snapshot before = Take(*adam);
  ResidentChunkAccess fresh_access(*store_);
  ASSERT_OK(adam->Step(fresh_access));
  const int64_t i = adam->owned_chunks()[0];
  const TensorInfo& t = store_->layout().tensor(store_->layout().TensorsInChunk(i)[0]);
  for (int64_t e = t.offset_elems; e < t.offset_elems + t.numel; ++e) {
    EXPECT_NEAR(Master(i)[e], before.master[0][e] - (e % 2 ? 0.25f : -0.25f), 1e-6f);
  }
}

// One Inf gradient anywhere: the step is skipped, the parameters come back bit-exactly from the
// master copy, master/momentum/variance are untouched, the step count holds, and with DeepSpeed's
// hysteresis 2 the scale halves on the second overflow.
TEST_F(HybridAdamTest, OverflowSkipsTheStepRestoresParamsAndLowersTheScale) {
  Build(DType::kF16, 1, 0, /*on_accelerator=*/{2});
  HybridAdamOptions options = AdamWWithNoDecayGroup();
  ASSERT_OK_AND_ASSIGN(options.loss_scaler,
                       LossScaler::Dynamic({.initial_scale_power = 10, .loss_scale_window = 1000}));
  ASSERT_OK_AND_ASSIGN(auto adam,
                       HybridAdam::Create(store_->layout(), 0, DType::kF16, options, Kernels()));
  ResidentChunkAccess access(*store_);
  // One clean step first so that momentum and variance are not zero.
  WriteRandomGradients(*adam, 1024.0f, 1);
  ASSERT_OK(adam->Step(access));
  ASSERT_EQ(adam->step(), 1);

  std::vector<std::vector<uint8_t>> params_before, master_before, m_before, v_before;
  auto snapshot = [&](std::vector<std::vector<uint8_t>>* out, ChunkType type) {
    out->clear();
    for (int64_t i : adam->owned_chunks()) out->push_back(PayloadBytes(store_->chunk(type, i)));
  };
  snapshot(&params_before, ChunkType::kParam);
  snapshot(&master_before, ChunkType::kMaster);
  snapshot(&m_before, ChunkType::kMomentum);
  snapshot(&v_before, ChunkType::kVariance);

  for (int overflow = 1; overflow <= 2; ++overflow) {
    // Backward overwrites the param slots with gradients; one of them is Inf or NaN: first in the
    // last host chunk (after every other chunk's gradients were seen), then in the first element
    // of the chunk on the accelerator.
    WriteRandomGradients(*adam, 1024.0f, 10 + overflow);
    const int64_t chunk = overflow == 1 ? adam->owned_chunks().back() : 2;
    const TensorInfo& t =
        store_->layout().tensor(store_->layout().TensorsInChunk(chunk)[overflow == 1 ? 0 : 1]);
    WriteParam(DType::kF16, ParamPayload(chunk),
               overflow == 1 ? t.offset_elems + t.numel / 2 : t.offset_elems,
               overflow == 1 ? std::numeric_limits<float>::infinity()
                             : std::numeric_limits<float>::quiet_NaN());
    ASSERT_OK_AND_ASSIGN(const AdamStepReport report, adam->Step(access));
    EXPECT_TRUE(report.skipped);
    EXPECT_EQ(report.nonfinite_grads, 1);
    EXPECT_EQ(report.step, 1);
    EXPECT_EQ(adam->step(), 1);
    EXPECT_EQ(report.loss_scale, 1024.0);
    EXPECT_EQ(report.next_loss_scale, overflow == 1 ? 1024.0 : 512.0) << "overflow " << overflow;
    std::vector<std::vector<uint8_t>> now;
    snapshot(&now, ChunkType::kParam);
    // Gaps hold NaN patterns that were never touched, so whole payloads compare equal.
    EXPECT_EQ(now, params_before) << "params not restored bit-exactly";
    snapshot(&now, ChunkType::kMaster);
    EXPECT_EQ(now, master_before);
    snapshot(&now, ChunkType::kMomentum);
    EXPECT_EQ(now, m_before);
    snapshot(&now, ChunkType::kVariance);
    EXPECT_EQ(now, v_before);
  }
  EXPECT_EQ(adam->loss_scaler().scale(), 512.0);
  // The next clean step uses scale 512 and bias correction of step 2.
  WriteRandomGradients(*adam, 512.0f, 99);
  const Snapshot before = Take(*adam);
  ASSERT_OK_AND_ASSIGN(const AdamStepReport report, adam->Step(access));
  EXPECT_FALSE(report.skipped);
  EXPECT_EQ(report.loss_scale, 512.0);
  ExpectStepped(*adam, before, 2, 512.0, 1.0);
}

// Without loss scaling (f32, bf16) an Inf/NaN gradient is divergence: the step is refused with
// OutOfRange naming the first tensor and element (found by a second pass over that chunk), the
// parameters come back bit-exactly, and nothing else changes.
TEST_F(HybridAdamTest, NonFiniteGradientsStopF32AndBf16NamingTheTensor) {
  for (const DType dtype : {DType::kF32, DType::kBF16}) {
    SCOPED_TRACE(DTypeName(dtype));
    Build(dtype, 1, 0, /*on_accelerator=*/{1});
    ASSERT_OK_AND_ASSIGN(auto adam, HybridAdam::Create(store_->layout(), 0, dtype,
                                                       AdamWWithNoDecayGroup(), Kernels()));
    ResidentChunkAccess access(*store_);
    WriteRandomGradients(*adam, 1.0f, 1);
    ASSERT_OK(adam->Step(access));
    std::vector<std::vector<uint8_t>> params_before, master_before;
    for (int64_t i : adam->owned_chunks()) {
      params_before.push_back(PayloadBytes(store_->chunk(ChunkType::kParam, i)));
      master_before.push_back(PayloadBytes(store_->chunk(ChunkType::kMaster, i)));
    }
    // Two bad gradients: element [5, 30] of a matrix in chunk 1 (on the accelerator) and a later
    // one; the first is named.
    WriteRandomGradients(*adam, 1.0f, 2);
    const TensorInfo* two_d = nullptr;
    for (TensorId id : store_->layout().TensorsInChunk(1)) {
      if (store_->layout().tensor(id).shape.size() == 2 && two_d == nullptr) {
        two_d = &store_->layout().tensor(id);
      }
    }
    ASSERT_NE(two_d, nullptr);
    const TensorInfo& t = *two_d;
    const int64_t e = 5 * t.shape[1] + 30;
    WriteParam(dtype, ParamPayload(1), t.offset_elems + e, std::numeric_limits<float>::infinity());
    WriteParam(dtype, ParamPayload(1), t.offset_elems + e + 7,
               std::numeric_limits<float>::quiet_NaN());
    EXPECT_THAT(adam->Step(access),
                StatusIs(absl::StatusCode::kOutOfRange,
                         AllOf(HasSubstr("2 Inf/NaN gradients"),
                               HasSubstr(absl::StrCat("the first in ", t.name, " at [5, 30]")),
                               HasSubstr(DTypeName(dtype)), HasSubstr("not a loss-scale event"),
                               HasSubstr("optimizer.params.lr"), HasSubstr("gradient_clipping"))));
    EXPECT_EQ(adam->step(), 1);
    for (size_t k = 0; k < adam->owned_chunks().size(); ++k) {
      const int64_t i = adam->owned_chunks()[k];
      EXPECT_EQ(PayloadBytes(store_->chunk(ChunkType::kParam, i)), params_before[k]) << i;
      EXPECT_EQ(PayloadBytes(store_->chunk(ChunkType::kMaster, i)), master_before[k]) << i;
    }
  }
}

// fp16: skipped steps in a row are counted; a clean step resets the count; one more than the
// limit stops with OutOfRange naming fp16.max_consecutive_skipped_steps. Each skipped step's
// report names the first bad gradient.
TEST_F(HybridAdamTest, TooManySkippedStepsInARowStopF16) {
  Build(DType::kF16, 1, 0, /*on_accelerator=*/{2});
  HybridAdamOptions options = AdamWWithNoDecayGroup();
  ASSERT_OK_AND_ASSIGN(options.loss_scaler,
                       LossScaler::Dynamic({.initial_scale_power = 30, .hysteresis = 1}));
  options.max_consecutive_skipped_steps = 2;
  ASSERT_OK_AND_ASSIGN(auto adam,
                       HybridAdam::Create(store_->layout(), 0, DType::kF16, options, Kernels()));
  ResidentChunkAccess access(*store_);
  const TensorInfo& t = store_->layout().tensor(store_->layout().TensorsInChunk(2)[0]);
  const auto overflow = [&](int64_t at) {
    WriteRandomGradients(*adam, 1.0f, 3);
    WriteParam(DType::kF16, ParamPayload(2), t.offset_elems + at,
               std::numeric_limits<float>::quiet_NaN());
    return adam->Step(access);
  };
  for (int round = 0; round < 2; ++round) {
    for (int64_t skip = 1; skip <= 2; ++skip) {
      ASSERT_OK_AND_ASSIGN(const AdamStepReport r, overflow(skip));
      EXPECT_TRUE(r.skipped);
      EXPECT_EQ(r.consecutive_skipped_steps, skip);
      EXPECT_EQ(r.first_nonfinite,
                absl::StrCat(t.name, " at ",
                             t.shape.size() == 1 ? absl::StrCat("[", skip, "]")
                                                 : absl::StrCat("[0, ", skip, "]")));
    }
    if (round == 0) {
      WriteRandomGradients(*adam, 1.0f, 4);
      ASSERT_OK_AND_ASSIGN(const AdamStepReport clean, adam->Step(access));
      EXPECT_FALSE(clean.skipped);
      EXPECT_EQ(adam->consecutive_skipped_steps(), 0);
    }
  }
  EXPECT_THAT(overflow(0), StatusIs(absl::StatusCode::kOutOfRange,
                                    AllOf(HasSubstr("3 optimizer steps in a row"),
                                          HasSubstr("fp16.max_consecutive_skipped_steps = 2"),
                                          HasSubstr(t.name))));
  // A resumed optimizer continues the count.
  adam->set_consecutive_skipped_steps(2);
  EXPECT_THAT(overflow(1), StatusIs(absl::StatusCode::kOutOfRange));
}

// A static fp16 scale with a limit of 0 stops at the first overflow; the loss scaler's own
// min-scale error names the first bad gradient too.
TEST_F(HybridAdamTest, F16LimitZeroAndMinScaleNameTheGradient) {
  Build(DType::kF16);
  HybridAdamOptions options = AdamWWithNoDecayGroup();
  ASSERT_OK_AND_ASSIGN(options.loss_scaler, LossScaler::Static(8.0));
  options.max_consecutive_skipped_steps = 0;
  ASSERT_OK_AND_ASSIGN(auto adam,
                       HybridAdam::Create(store_->layout(), 0, DType::kF16, options, Kernels()));
  ResidentChunkAccess access(*store_);
  const int64_t last = adam->owned_chunks().back();
  const TensorInfo& t = store_->layout().tensor(store_->layout().TensorsInChunk(last).back());
  WriteRandomGradients(*adam, 1.0f, 5);
  WriteParam(DType::kF16, ParamPayload(last), t.offset_elems + t.numel - 1,
             -std::numeric_limits<float>::infinity());
  EXPECT_THAT(
      adam->Step(access),
      StatusIs(absl::StatusCode::kOutOfRange,
               AllOf(HasSubstr("fp16.max_consecutive_skipped_steps = 0"), HasSubstr(t.name))));

  options = AdamWWithNoDecayGroup();
  ASSERT_OK_AND_ASSIGN(options.loss_scaler,
                       LossScaler::Dynamic({.initial_scale_power = 0, .hysteresis = 1}));
  ASSERT_OK_AND_ASSIGN(adam,
                       HybridAdam::Create(store_->layout(), 0, DType::kF16, options, Kernels()));
  WriteRandomGradients(*adam, 1.0f, 6);
  WriteParam(DType::kF16, ParamPayload(last), t.offset_elems,
             std::numeric_limits<float>::infinity());
  EXPECT_THAT(adam->Step(access),
              StatusIs(absl::StatusCode::kOutOfRange,
                       AllOf(HasSubstr("fp16.min_loss_scale"), HasSubstr(t.name))));
  EXPECT_THAT(HybridAdam::Create(store_->layout(), 0, DType::kF16,
                                 HybridAdamOptions{.max_consecutive_skipped_steps = -2}, Kernels()),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("max_consecutive")));
}

// The norm is the L2 norm of the unscaled gradients of all chunks together, and clipping scales
// every gradient by max_norm / (norm + 1e-6).
TEST_F(HybridAdamTest, ClipsByTheGlobalNorm) {
  Build(DType::kF32, 1, 0, /*on_accelerator=*/{0});
  HybridAdamOptions options;
  options.max_grad_norm = 1.0;
  ASSERT_OK_AND_ASSIGN(options.loss_scaler, LossScaler::Static(4.0));
  ASSERT_OK_AND_ASSIGN(auto adam,
                       HybridAdam::Create(store_->layout(), 0, DType::kF32, options, Kernels()));
  int64_t elems = 0;
  for (int64_t i : adam->owned_chunks()) elems += store_->layout().used_elems(i);
  // Every unscaled gradient is 0.5 (stored as 2.0 with loss scale 4): norm = 0.5 * sqrt(elems).
  WriteGradients(*adam, [](int64_t, int64_t) { return 2.0f; });
  const Snapshot before = Take(*adam);
  ResidentChunkAccess access(*store_);
  ASSERT_OK_AND_ASSIGN(const AdamStepReport report, adam->Step(access));
  const double norm = 0.5 * std::sqrt(static_cast<double>(elems));
  EXPECT_NEAR(report.grad_norm, norm, 1e-12 * norm);
  EXPECT_DOUBLE_EQ(report.clip_coef, 1.0 / (norm + 1e-6));
  // m = (1 - beta1) * 0.5 * clip_coef for every element.
  const int64_t i = adam->owned_chunks()[1];
  const int64_t e = store_->layout().tensor(store_->layout().TensorsInChunk(i)[0]).offset_elems;
  EXPECT_NEAR(Momentum(i)[e], 0.1 * 0.5 * report.clip_coef, 1e-6 * 0.05 * report.clip_coef);
  ExpectStepped(*adam, before, 1, 4.0, report.clip_coef);

  // Below the threshold nothing is clipped.
  adam->set_max_grad_norm(10 * norm);
  WriteGradients(*adam, [](int64_t, int64_t) { return 2.0f; });
  ASSERT_OK_AND_ASSIGN(const AdamStepReport unclipped, adam->Step(access));
  EXPECT_EQ(unclipped.clip_coef, 1.0);
}

// Frozen chunks (a LoRA base) are invisible to the optimizer: not owned, not counted in the
// accumulator, their +Inf and large values enter neither the overflow check nor the clipping norm,
// and their bytes stay identical through steps, accumulation and a skipped step's restore.
TEST_F(HybridAdamTest, FrozenChunksAreNeverTouched) {
  for (const DType dtype : {DType::kF32, DType::kF16}) {
    for (const int k : {1, 2}) {
      SCOPED_TRACE(absl::StrCat(DTypeName(dtype), " k=", k));
      Build(dtype, 1, 0, /*on_accelerator=*/{0, 3}, /*blocks=*/4, /*frozen_ops=*/8);
      const ChunkLayout& layout = store_->layout();
      std::vector<int64_t> frozen;
      for (int64_t i = 0; i < layout.num_chunks(); ++i) {
        if (!layout.chunk_trainable(i)) frozen.push_back(i);
      }
      ASSERT_GE(frozen.size(), 2u) << layout.DebugString();
      ASSERT_LT(frozen.size(), static_cast<size_t>(layout.num_chunks()));
      HybridAdamOptions options;
      options.max_grad_norm = 1.0;
      options.gradient_accumulation_steps = k;
      const float scale = 4.0f;
      ASSERT_OK_AND_ASSIGN(options.loss_scaler, LossScaler::Static(scale));
      ASSERT_OK_AND_ASSIGN(auto adam, HybridAdam::Create(layout, 0, dtype, options, Kernels()));
      for (int64_t i : frozen) {
        EXPECT_EQ(std::count(adam->owned_chunks().begin(), adam->owned_chunks().end(), i), 0);
      }
      EXPECT_EQ(adam->owned_param_elems(), layout.trainable_elems());
      EXPECT_EQ(layout.trainable_elems() + layout.frozen_elems(), layout.placed_elems());
      std::vector<std::vector<uint8_t>> frozen_bytes;
      for (int64_t i : frozen)
        frozen_bytes.push_back(PayloadBytes(store_->chunk(ChunkType::kParam, i)));
      ResidentChunkAccess access(*store_);
      for (int micro = 0; micro + 1 < k; ++micro) {
        WriteGradients(*adam, [&](int64_t, int64_t) { return 0.5f * scale; });
        ASSERT_OK_AND_ASSIGN(const AdamStepReport acc, adam->Accumulate(access));
        EXPECT_TRUE(acc.accumulated);
      }
      // Every unscaled gradient is 0.5: the norm counts the trainable elements only.
      WriteGradients(*adam, [&](int64_t, int64_t) { return 0.5f * scale; });
      ASSERT_OK_AND_ASSIGN(const AdamStepReport report, adam->Step(access));
      EXPECT_FALSE(report.skipped);
      const double norm = 0.5 * std::sqrt(static_cast<double>(layout.trainable_elems()));
      EXPECT_NEAR(report.grad_norm, norm, 1e-6 * norm);
      // f16: an Inf in a trainable gradient skips the step and restores the parameters from the
      // masters; the frozen chunks are no part of that either.
      if (dtype == DType::kF16) {
        WriteGradients(*adam, [&](int64_t, int64_t e) {
          return e == 0 ? std::numeric_limits<float>::infinity() : 1.0f;
        });
        for (int micro = 0; micro + 1 < k; ++micro) ASSERT_OK(adam->Accumulate(access).status());
        ASSERT_OK_AND_ASSIGN(const AdamStepReport skipped, adam->Step(access));
        EXPECT_TRUE(skipped.skipped);
      }
      for (size_t j = 0; j < frozen.size(); ++j) {
        EXPECT_EQ(PayloadBytes(store_->chunk(ChunkType::kParam, frozen[j])), frozen_bytes[j])
            << "frozen chunk " << frozen[j];
      }
    }
  }
}

// The reducer sees this rank's statistics and may add other ranks': an Inf elsewhere skips the
// step here too, and their squares enter the norm.
TEST_F(HybridAdamTest, GradStatsReducerMakesStatisticsGlobal) {
  Build(DType::kF16);
  HybridAdamOptions options;
  options.max_grad_norm = 1.0;
  int calls = 0;
  bool remote_overflow = true;
  options.grad_stats_reducer = [&](GradStats& stats) {
    ++calls;
    stats.sum_squares += 1e6;
    if (remote_overflow) stats.nonfinite_elems += 1;
    return absl::OkStatus();
  };
  ASSERT_OK_AND_ASSIGN(auto adam,
                       HybridAdam::Create(store_->layout(), 0, DType::kF16, options, Kernels()));
  ResidentChunkAccess access(*store_);
  WriteGradients(*adam, [](int64_t, int64_t) { return 0.0f; });
  ASSERT_OK_AND_ASSIGN(AdamStepReport report, adam->Step(access));
  EXPECT_TRUE(report.skipped);
  remote_overflow = false;
  // The skipped step put the parameters back into the slots; backward writes gradients again.
  WriteGradients(*adam, [](int64_t, int64_t) { return 0.0f; });
  ASSERT_OK_AND_ASSIGN(report, adam->Step(access));
  EXPECT_FALSE(report.skipped);
  EXPECT_DOUBLE_EQ(report.grad_norm, 1000.0);
  EXPECT_EQ(calls, 2);
}

// With two ranks, rank 1 steps only the chunks it owns (odd indices) and never needs the master
// payloads of the others.
TEST_F(HybridAdamTest, StepsOnlyOwnedChunks) {
  Build(DType::kBF16, /*world=*/2, /*rank=*/1, /*on_accelerator=*/{3});
  ASSERT_OK_AND_ASSIGN(auto adam, HybridAdam::Create(store_->layout(), 1, DType::kBF16,
                                                     AdamWWithNoDecayGroup(), Kernels()));
  ASSERT_FALSE(adam->owned_chunks().empty());
  for (int64_t i : adam->owned_chunks()) EXPECT_EQ(i % 2, 1);
  ResidentChunkAccess access(*store_);
  WriteRandomGradients(*adam, 1.0f, 5);
  const Snapshot before = Take(*adam);
  ASSERT_OK_AND_ASSIGN(const AdamStepReport report, adam->Step(access));
  EXPECT_EQ(report.host_chunks + report.accelerator_chunks,
            static_cast<int64_t>(adam->owned_chunks().size()));
  ExpectStepped(*adam, before, 1, 1.0, 1.0);
}

TEST_F(HybridAdamTest, Errors) {
  Build(DType::kF16, 1, 0, /*on_accelerator=*/{1});
  // An accelerator chunk without accelerator kernels.
  ASSERT_OK_AND_ASSIGN(auto host_only, HybridAdam::Create(store_->layout(), 0, DType::kF16, {},
                                                          Kernels(/*with_accelerator=*/false)));
  ResidentChunkAccess access(*store_);
  EXPECT_THAT(host_only->Step(access),
              StatusIs(absl::StatusCode::kFailedPrecondition, HasSubstr("accelerator")));

  // Bad hyperparameters at creation name the parameter.
  HybridAdamOptions bad;
  bad.beta1 = 1.0;
  EXPECT_THAT(HybridAdam::Create(store_->layout(), 0, DType::kF16, bad, Kernels()),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("beta1")));
  bad = {};
  bad.eps = -1;
  EXPECT_THAT(HybridAdam::Create(store_->layout(), 0, DType::kF16, bad, Kernels()),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("eps")));
  bad = {};
  bad.groups[0].weight_decay = -0.1;
  EXPECT_THAT(HybridAdam::Create(store_->layout(), 0, DType::kF16, bad, Kernels()),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("weight_decay")));
  bad = {};
  bad.groups = {{.name = "only_biases", .selector = IsBiasOrNormTensor}};
  EXPECT_THAT(HybridAdam::Create(store_->layout(), 0, DType::kF16, bad, Kernels()),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("no parameter group")));
  EXPECT_THAT(HybridAdam::Create(store_->layout(), 0, DType::kF16, {}, {}),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("kernels.host")));

  // A learning rate made invalid later: Step refuses and touches nothing.
  ASSERT_OK_AND_ASSIGN(auto adam,
                       HybridAdam::Create(store_->layout(), 0, DType::kF16, {}, Kernels()));
  adam->SetLearningRate(std::nan(""));
  const std::vector<uint8_t> master = PayloadBytes(store_->chunk(ChunkType::kMaster, 0));
  EXPECT_THAT(adam->Step(access), StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("lr")));
  EXPECT_EQ(PayloadBytes(store_->chunk(ChunkType::kMaster, 0)), master);
  adam->SetLearningRate(1e-3);

  // A chunk the placement did not make resident.
  ASSERT_OK(store_->chunk(ChunkType::kVariance, 2).ReleasePayload());
  WriteRandomGradients(*adam, 1.0f, 3);
  EXPECT_THAT(adam->Step(access),
              StatusIs(absl::StatusCode::kFailedPrecondition, HasSubstr("variance#2")));
}

// --- Gradient accumulation ----------------------------------------------------------------------

// k micro-batches: Accumulate() k-1 times (each leaves the parameters bit-exactly as they were and
// touches no optimizer state), then Step(): the update is Adam on the f32 sum of the stored
// gradients unscaled by loss_scale * k, i.e. on the mean gradient — checked against the scalar
// reference (optimizer/adam_math.h) — over two optimizer steps (the accumulator restarts from
// zero), with chunks on the host and on the emulated accelerator, for every compute dtype, with
// the accumulator in pageable memory and in the backend's pinned memory (what a cuda run uses, so
// that CudaAdam updates it in place).
TEST_F(HybridAdamTest, AccumulationStepsOnTheMeanOfTheMicroBatchGradients) {
  for (const DType dtype : {DType::kF32, DType::kBF16, DType::kF16}) {
    for (const int k : {2, 3}) {
      for (const bool pinned : {false, true}) {
        SCOPED_TRACE(absl::StrCat(DTypeName(dtype), " k=", k, pinned ? " pinned" : ""));
        Build(dtype, 1, 0, /*on_accelerator=*/{1});
        HybridAdamOptions options = AdamWWithNoDecayGroup();
        options.gradient_accumulation_steps = k;
        const float scale = dtype == DType::kF16 ? 256.0f : 1.0f;
        if (dtype == DType::kF16) {
          ASSERT_OK_AND_ASSIGN(options.loss_scaler, LossScaler::Static(scale));
        }
        HybridAdamKernels kernels = Kernels();
        if (pinned) kernels.pinned_accumulator_backend = backend_.get();
        ASSERT_OK_AND_ASSIGN(auto adam,
                             HybridAdam::Create(store_->layout(), 0, dtype, options, kernels));
        int64_t owned = 0;
        for (int64_t i : adam->owned_chunks()) {
          for (TensorId id : store_->layout().TensorsInChunk(i)) {
            owned += store_->layout().tensor(id).numel;
          }
        }
        EXPECT_EQ(adam->owned_param_elems(), owned);
        EXPECT_EQ(GradientAccumulatorBytes(adam->owned_param_elems(), k), 4 * owned);
        ResidentChunkAccess access(*store_);
        for (int step = 1; step <= 2; ++step) {
          Snapshot before = Take(*adam);  // grad: the parameters now; replaced by the sum below
          std::vector<std::vector<uint8_t>> params_before;
          for (int64_t i : adam->owned_chunks()) {
            params_before.push_back(PayloadBytes(store_->chunk(ChunkType::kParam, i)));
          }
          std::vector<std::vector<float>> sum(before.grad.size());
          for (size_t c = 0; c < sum.size(); ++c) sum[c].assign(before.grad[c].size(), 0.0f);
          for (int micro = 0; micro < k; ++micro) {
            WriteRandomGradients(*adam, scale, static_cast<uint32_t>(100 * step + micro));
            const Snapshot g = Take(*adam);
            for (size_t c = 0; c < sum.size(); ++c) {
              for (size_t e = 0; e < sum[c].size(); ++e) sum[c][e] += g.grad[c][e];
            }
            if (micro + 1 < k) {
              ASSERT_OK_AND_ASSIGN(const AdamStepReport r, adam->Accumulate(access));
              EXPECT_TRUE(r.accumulated);
              EXPECT_FALSE(r.skipped);
              EXPECT_EQ(adam->pending_micro_batches(), micro + 1);
              EXPECT_EQ(adam->step(), step - 1);
              for (size_t c = 0; c < adam->owned_chunks().size(); ++c) {
                const int64_t i = adam->owned_chunks()[c];
                ASSERT_EQ(PayloadBytes(store_->chunk(ChunkType::kParam, i)), params_before[c])
                    << "micro-batch " << micro << ": parameters not restored";
                ASSERT_EQ(
                    std::memcmp(Master(i), before.master[c].data(), before.master[c].size() * 4),
                    0);
              }
            }
          }
          before.grad = sum;
          ASSERT_OK_AND_ASSIGN(const AdamStepReport r, adam->Step(access));
          EXPECT_FALSE(r.skipped);
          EXPECT_FALSE(r.accumulated);
          EXPECT_EQ(r.step, step);
          EXPECT_EQ(adam->pending_micro_batches(), 0);
          double sum_squares = 0;
          for (size_t c = 0; c < sum.size(); ++c) {
            const int64_t i = adam->owned_chunks()[c];
            for (TensorId id : store_->layout().TensorsInChunk(i)) {
              const TensorInfo& t = store_->layout().tensor(id);
              for (int64_t e = t.offset_elems; e < t.offset_elems + t.numel; ++e) {
                sum_squares += static_cast<double>(sum[c][e]) * sum[c][e];
              }
            }
          }
          EXPECT_NEAR(r.grad_norm, std::sqrt(sum_squares) / (scale * k), 1e-5 * r.grad_norm);
          ExpectStepped(*adam, before, step, static_cast<double>(scale) * k, 1.0);
        }
      }
    }
  }
}

// f16: an Inf/NaN in an early micro-batch is a loss-scale event for the whole step: Accumulate
// reports where it is, the step skips at its last micro-batch (nothing changes but the scale), and
// the next step starts from an empty accumulator. f32/bf16: it stops at that micro-batch.
TEST_F(HybridAdamTest, AccumulationOverflowSkipsTheWholeStep) {
  Build(DType::kF16, 1, 0, /*on_accelerator=*/{2});
  HybridAdamOptions options = AdamWWithNoDecayGroup();
  options.gradient_accumulation_steps = 2;
  ASSERT_OK_AND_ASSIGN(
      options.loss_scaler,
      LossScaler::Dynamic({.initial_scale_power = 10, .loss_scale_window = 1000, .hysteresis = 1}));
  ASSERT_OK_AND_ASSIGN(auto adam,
                       HybridAdam::Create(store_->layout(), 0, DType::kF16, options, Kernels()));
  ResidentChunkAccess access(*store_);
  std::vector<std::vector<uint8_t>> params_before, master_before;
  for (int64_t i : adam->owned_chunks()) {
    params_before.push_back(PayloadBytes(store_->chunk(ChunkType::kParam, i)));
    master_before.push_back(PayloadBytes(store_->chunk(ChunkType::kMaster, i)));
  }
  WriteRandomGradients(*adam, 1024.0f, 1);
  const TensorInfo& t = store_->layout().tensor(store_->layout().TensorsInChunk(2)[0]);
  WriteParam(DType::kF16, ParamPayload(2), t.offset_elems + 3,
             std::numeric_limits<float>::infinity());
  ASSERT_OK_AND_ASSIGN(AdamStepReport r, adam->Accumulate(access));
  EXPECT_EQ(r.nonfinite_grads, 1);
  EXPECT_THAT(r.first_nonfinite, HasSubstr(absl::StrCat(t.name, " at ")));
  EXPECT_THAT(r.first_nonfinite, HasSubstr("micro-batch 1"));
  WriteRandomGradients(*adam, 1024.0f, 2);  // a clean second micro-batch
  ASSERT_OK_AND_ASSIGN(r, adam->Step(access));
  EXPECT_TRUE(r.skipped);
  EXPECT_EQ(r.nonfinite_grads, 1);
  EXPECT_EQ(r.next_loss_scale, 512.0);
  EXPECT_EQ(adam->step(), 0);
  for (size_t c = 0; c < adam->owned_chunks().size(); ++c) {
    const int64_t i = adam->owned_chunks()[c];
    EXPECT_EQ(PayloadBytes(store_->chunk(ChunkType::kParam, i)), params_before[c]);
    EXPECT_EQ(PayloadBytes(store_->chunk(ChunkType::kMaster, i)), master_before[c]);
  }
  // A clean step afterwards: the mean of its own two micro-batches only.
  Snapshot before = Take(*adam);
  WriteRandomGradients(*adam, 512.0f, 3);
  const Snapshot g1 = Take(*adam);
  ASSERT_OK(adam->Accumulate(access));
  WriteRandomGradients(*adam, 512.0f, 4);
  const Snapshot g2 = Take(*adam);
  for (size_t c = 0; c < before.grad.size(); ++c) {
    for (size_t e = 0; e < before.grad[c].size(); ++e) {
      before.grad[c][e] = g1.grad[c][e] + g2.grad[c][e];
    }
  }
  ASSERT_OK_AND_ASSIGN(r, adam->Step(access));
  EXPECT_FALSE(r.skipped);
  ExpectStepped(*adam, before, 1, 512.0 * 2, 1.0);

  for (const DType dtype : {DType::kF32, DType::kBF16}) {
    SCOPED_TRACE(DTypeName(dtype));
    Build(dtype, 1, 0, /*on_accelerator=*/{1});
    HybridAdamOptions o = AdamWWithNoDecayGroup();
    o.gradient_accumulation_steps = 3;
    ASSERT_OK_AND_ASSIGN(auto a, HybridAdam::Create(store_->layout(), 0, dtype, o, Kernels()));
    ResidentChunkAccess acc(*store_);
    WriteRandomGradients(*a, 1.0f, 1);
    ASSERT_OK(a->Accumulate(acc));
    WriteRandomGradients(*a, 1.0f, 2);
    const TensorInfo& u = store_->layout().tensor(store_->layout().TensorsInChunk(1)[0]);
    WriteParam(dtype, ParamPayload(1), u.offset_elems, std::numeric_limits<float>::quiet_NaN());
    EXPECT_THAT(a->Accumulate(acc), StatusIs(absl::StatusCode::kOutOfRange,
                                             AllOf(HasSubstr(u.name), HasSubstr("micro-batch 2"),
                                                   HasSubstr("not a loss-scale event"))));
    EXPECT_EQ(a->pending_micro_batches(), 0);
    EXPECT_EQ(a->step(), 0);
  }
}

// The call protocol: Accumulate only with k > 1 and before the last micro-batch; Step only after
// exactly k - 1 of them. Each refusal touches nothing.
TEST_F(HybridAdamTest, AccumulationCallOrderIsChecked) {
  Build(DType::kF32);
  ASSERT_OK_AND_ASSIGN(auto single,
                       HybridAdam::Create(store_->layout(), 0, DType::kF32, {}, Kernels()));
  ResidentChunkAccess access(*store_);
  WriteRandomGradients(*single, 1.0f, 1);
  EXPECT_THAT(single->Accumulate(access),
              StatusIs(absl::StatusCode::kFailedPrecondition, HasSubstr("call Step")));
  HybridAdamOptions options;
  options.gradient_accumulation_steps = 2;
  ASSERT_OK_AND_ASSIGN(auto adam,
                       HybridAdam::Create(store_->layout(), 0, DType::kF32, options, Kernels()));
  const std::vector<uint8_t> param = PayloadBytes(store_->chunk(ChunkType::kParam, 0));
  EXPECT_THAT(adam->Step(access),
              StatusIs(absl::StatusCode::kFailedPrecondition, HasSubstr("call Accumulate")));
  EXPECT_EQ(PayloadBytes(store_->chunk(ChunkType::kParam, 0)), param);
  ASSERT_OK(adam->Accumulate(access));
  WriteRandomGradients(*adam, 1.0f, 2);
  EXPECT_THAT(adam->Accumulate(access),
              StatusIs(absl::StatusCode::kFailedPrecondition, HasSubstr("call Step")));
  ASSERT_OK(adam->Step(access));
  EXPECT_EQ(adam->step(), 1);
  options.gradient_accumulation_steps = 0;
  EXPECT_THAT(HybridAdam::Create(store_->layout(), 0, DType::kF32, options, Kernels()),
              StatusIs(absl::StatusCode::kInvalidArgument,
                       HasSubstr("gradient_accumulation_steps must be >= 1")));
}

// The accumulator is 4 bytes per owned parameter, only with k > 1; with ZeRO each rank holds its
// own share.
TEST_F(HybridAdamTest, AccumulatorBytesCountOwnedParametersOnly) {
  EXPECT_EQ(GradientAccumulatorBytes(1000, 1), 0);
  EXPECT_EQ(GradientAccumulatorBytes(1000, 2), 4000);
  EXPECT_EQ(GradientAccumulatorBytes(0, 8), 0);
  EXPECT_EQ(GradientAccumulatorBytes(-5, 8), 0);
  int64_t total = 0, world_total = 0;
  for (int rank = 0; rank < 2; ++rank) {
    Build(DType::kBF16, /*world=*/2, rank);
    HybridAdamOptions options;
    options.gradient_accumulation_steps = 4;
    ASSERT_OK_AND_ASSIGN(
        auto adam, HybridAdam::Create(store_->layout(), rank, DType::kBF16, options, Kernels()));
    world_total += adam->owned_param_elems();
    if (rank == 0) {
      for (TensorId id = 0; id < store_->layout().num_tensor_ids(); ++id) {
        total += store_->layout().tensor(id).numel;
      }
    }
    EXPECT_LT(adam->owned_param_elems(), total);
  }
  EXPECT_EQ(world_total, total);
}

TEST(IsBiasOrNormTensorTest, MatchesGpt2AndBertNames) {
  auto named = [](std::string name) {
    TensorInfo t;
    t.name = std::move(name);
    return t;
  };
  EXPECT_TRUE(IsBiasOrNormTensor(named("h.0.attn.c_attn.bias")));
  EXPECT_TRUE(IsBiasOrNormTensor(named("h.11.ln_2.weight")));
  EXPECT_TRUE(IsBiasOrNormTensor(named("ln_f.weight")));
  EXPECT_TRUE(IsBiasOrNormTensor(named("encoder.layer.0.output.LayerNorm.weight")));
  EXPECT_FALSE(IsBiasOrNormTensor(named("h.0.mlp.c_fc.weight")));
  EXPECT_FALSE(IsBiasOrNormTensor(named("wte.weight")));
}

// --- optimizer.overlap: speculation, then validation (docs/pipeline.md) ----------------------

// Every byte of every payload this rank holds (param, master, momentum, variance).
std::vector<std::vector<uint8_t>> AllPayloadBytes(const ChunkStore& store, int rank) {
  std::vector<std::vector<uint8_t>> out;
  for (int64_t i = 0; i < store.num_chunks(); ++i) {
    for (ChunkType type : kAllChunkTypes) {
      if (store.layout().HoldsPayload(type, i, rank))
        out.push_back(PayloadBytes(store.chunk(type, i)));
    }
  }
  return out;
}

// How a test step ends.
enum class Verdict {
  kClean,           // no clipping, no Inf/NaN: the speculation commits
  kClipped,         // clipping engages: roll back, serialized step
  kLocalOverflow,   // an Inf in the chunk speculated last, after the others were updated
  kRemoteOverflow,  // another rank's Inf (through the reducer): every chunk was updated first
  kLrChanged,       // the lr changed between speculation and Step: roll back
};

struct OverlapOutcome {
  absl::Status status;
  AdamStepReport report;
  std::vector<std::vector<uint8_t>> bytes;
  int reducer_calls = 0;
};

// Fixture access for the free test body below.
class HybridAdamOverlapTest : public HybridAdamTest {
 protected:
  // Two steps: a clean one (so the moments are non-zero), then one ending as `verdict`. With
  // `overlap`, each step's chunks are speculated in descending order (backward's) before Step.
  OverlapOutcome RunSteps(DType dtype, int world, int rank, Verdict verdict, bool overlap) {
    OverlapOutcome out;
    Build(dtype, world, rank, /*on_accelerator=*/{}, /*blocks=*/4);
    HybridAdamOptions options = AdamWWithNoDecayGroup();
    options.overlap = overlap;
    bool remote_overflow = false;
    options.grad_stats_reducer = [&](GradStats& stats) {
      ++out.reducer_calls;
      stats.sum_squares += 0.25;  // another rank's share
      if (remote_overflow) stats.nonfinite_elems += 3;
      return absl::OkStatus();
    };
    if (dtype == DType::kF16) {
      options.loss_scaler = *LossScaler::Dynamic({.initial_scale_power = 4, .hysteresis = 1});
    }
    absl::StatusOr<std::unique_ptr<HybridAdam>> created =
        HybridAdam::Create(store_->layout(), rank, dtype, options, Kernels());
    EXPECT_OK(created.status());
    HybridAdam& adam = **created;
    ResidentChunkAccess access(*store_);
    for (int step = 0; step < 2; ++step) {
      const bool last = step == 1;
      if (last && verdict == Verdict::kClipped) {
        adam.set_max_grad_norm(1e-3);
      }
      remote_overflow = last && verdict == Verdict::kRemoteOverflow;
      const float scale = static_cast<float>(adam.loss_scaler().scale());
      WriteRandomGradients(adam, scale, 500 + step);
      if (last && verdict == Verdict::kLocalOverflow) {
        const int64_t first = adam.owned_chunks().front();
        const TensorId id = store_->layout().TensorsInChunk(first).back();
        WriteParam(dtype_, ParamPayload(first), store_->layout().tensor(id).offset_elems + 1,
                   std::numeric_limits<float>::infinity());
      }
      EXPECT_EQ(adam.BeginSpeculation(), overlap);
      const std::vector<int64_t>& owned = adam.owned_chunks();
      for (auto it = owned.rbegin(); it != owned.rend(); ++it) {
        EXPECT_OK(adam.SpeculateChunk(access, *it));
      }
      if (last && verdict == Verdict::kLrChanged) {
        adam.SetLearningRate(3e-3);
      }
      absl::StatusOr<AdamStepReport> report = adam.Step(access);
      out.status = report.status();
      if (report.ok()) out.report = *report;
      if (overlap && report.ok()) {
        const int64_t updated = report->speculated_chunks;
        if (!last || verdict == Verdict::kClean) {
          EXPECT_EQ(updated, static_cast<int64_t>(owned.size()));
          EXPECT_FALSE(report->speculation_rolled_back);
        } else {
          EXPECT_TRUE(report->speculation_rolled_back);
          if (verdict == Verdict::kLocalOverflow) {
            EXPECT_EQ(updated, static_cast<int64_t>(owned.size()) - 1);
          }
        }
      }
      if (!report.ok()) break;
    }
    out.bytes = AllPayloadBytes(*store_, rank);
    return out;
  }
};

TEST_F(HybridAdamOverlapTest, EveryVerdictGivesTheSerializedBits) {
  for (DType dtype : {DType::kF32, DType::kBF16, DType::kF16}) {
    for (const auto& [world, rank] : {std::pair{1, 0}, std::pair{2, 1}}) {
      for (Verdict verdict : {Verdict::kClean, Verdict::kClipped, Verdict::kLocalOverflow,
                              Verdict::kRemoteOverflow, Verdict::kLrChanged}) {
        SCOPED_TRACE(absl::StrCat(DTypeName(dtype), " world ", world, " verdict ",
                                  static_cast<int>(verdict)));
        const OverlapOutcome off = RunSteps(dtype, world, rank, verdict, false);
        const OverlapOutcome on = RunSteps(dtype, world, rank, verdict, true);
        EXPECT_EQ(off.status, on.status);
        if (verdict == Verdict::kLocalOverflow || verdict == Verdict::kRemoteOverflow) {
          if (dtype == DType::kF16) {
            EXPECT_TRUE(off.report.skipped);
          } else {
            EXPECT_EQ(off.status.code(), absl::StatusCode::kOutOfRange);
          }
        }
        if (verdict == Verdict::kClipped) {
          EXPECT_LT(off.report.clip_coef, 1.0);
        }
        EXPECT_EQ(off.report.grad_norm, on.report.grad_norm);
        EXPECT_EQ(off.report.clip_coef, on.report.clip_coef);
        EXPECT_EQ(off.report.skipped, on.report.skipped);
        EXPECT_EQ(off.report.step, on.report.step);
        EXPECT_EQ(off.report.next_loss_scale, on.report.next_loss_scale);
        EXPECT_EQ(off.report.first_nonfinite, on.report.first_nonfinite);
        ASSERT_EQ(off.bytes.size(), on.bytes.size());
        for (size_t c = 0; c < off.bytes.size(); ++c) {
          EXPECT_TRUE(off.bytes[c] == on.bytes[c]) << "payload " << c << " differs";
        }
        // One reduction per step, and one more for a step that rolled back.
        // (A changed lr rolls back before reducing.)
        const bool reduced_twice = verdict != Verdict::kClean && verdict != Verdict::kLrChanged;
        EXPECT_EQ(on.reducer_calls, off.reducer_calls + (reduced_twice ? 1 : 0));
      }
    }
  }
}

TEST_F(HybridAdamOverlapTest, OffOrAccumulatingOrAfterAClippedStepDoesNotSpeculate) {
  Build(DType::kF32);
  HybridAdamOptions options = AdamWWithNoDecayGroup();
  ASSERT_OK_AND_ASSIGN(auto off,
                       HybridAdam::Create(store_->layout(), 0, DType::kF32, options, Kernels()));
  EXPECT_FALSE(off->BeginSpeculation());
  options.overlap = true;
  options.gradient_accumulation_steps = 2;
  ASSERT_OK_AND_ASSIGN(auto accumulating,
                       HybridAdam::Create(store_->layout(), 0, DType::kF32, options, Kernels()));
  EXPECT_FALSE(accumulating->BeginSpeculation());
  options.gradient_accumulation_steps = 1;
  options.max_grad_norm = 1e-3;
  ASSERT_OK_AND_ASSIGN(auto adam,
                       HybridAdam::Create(store_->layout(), 0, DType::kF32, options, Kernels()));
  ResidentChunkAccess access(*store_);
  WriteRandomGradients(*adam, 1.0f, 1);
  ASSERT_OK_AND_ASSIGN(AdamStepReport report, adam->Step(access));
  EXPECT_LT(report.clip_coef, 1.0);
  EXPECT_FALSE(adam->BeginSpeculation()) << "the predictor: the previous step clipped";
  WriteRandomGradients(*adam, 1.0f, 2);
  adam->set_max_grad_norm(0);
  ASSERT_OK(adam->Step(access).status());
  EXPECT_TRUE(adam->BeginSpeculation());
  options.overlap_snapshot_bytes = -1;
  EXPECT_THAT(HybridAdam::Create(store_->layout(), 0, DType::kF32, options, Kernels()).status(),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("overlap_snapshot_bytes")));
}

}  // namespace
}  // namespace ps
