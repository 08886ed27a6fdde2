// HybridAdam with CudaAdam as its accelerator kernels and gradient accumulation (k = 3), against
// the same optimizer run on the host only (CpuAdam), over a placement that moves: owned chunks
// alternate between the GPU and the host from one micro-batch to the next (as in the scheduler's
// warm-up, where every chunk runs on the host, and afterwards, where a chunk runs where the plan
// puts it). The host accumulator is shared by both kernels; the GPU chunks are accumulated by the
// CUDA kernel through the staging tile and updated from the staged sum. After two steps the
// master, momentum and variance match the host-only run within the kernels' rounding (the two
// devices form different fused multiply-adds), and the parameters are exactly the masters rounded.
// f32, f16 and bf16 parameters; gaps between tensors hold NaN and must never be read.
// Every test reports SKIPPED on a machine without a GPU and in a build without --config=cuda.
#include "base/testing/gpu_gate.h"
#include "gtest/gtest.h"

#if PS_WITH_CUDA
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <memory>
#include <random>
#include <string>
#include <vector>

#include "base/status_macros.h"
#include "base/testing/status_matchers.h"
#include "base/testing/test_rng.h"
#include "chunk/chunk_layout.h"
#include "chunk/operator_spec.h"
#include "glog/logging.h"
#include "memory/backend.h"
#include "memory/cuda/cuda_backend.h"
#include "memory/device.h"
#include "memory/dtype.h"
#include "memory/dtype_math.h"
#include "optimizer/cpu_adam.h"
#include "optimizer/cuda/cuda_adam.h"
#include "optimizer/hybrid_adam.h"
#endif

namespace ps {
namespace {

#if PS_WITH_CUDA

// A small GPT-like model with awkward sizes (as hybrid_adam_test.cc's).
std::vector<OperatorSpec> Model() {
  std::vector<OperatorSpec> ops;
  ops.push_back({"wte", {{"wte.weight", {37, 16}}}});
  for (int b = 0; b < 4; ++b) {
    const std::string h = "h." + std::to_string(b) + ".";
    ops.push_back({h + "ln_1", {{h + "ln_1.weight", {16}}, {h + "ln_1.bias", {16}}}});
    ops.push_back(
        {h + "attn", {{h + "attn.c_attn.weight", {16, 47}}, {h + "attn.c_attn.bias", {47}}}});
    ops.push_back({h + "mlp", {{h + "mlp.c_fc.weight", {16, 61}}, {h + "mlp.c_fc.bias", {61}}}});
  }
  ops.push_back({"ln_f", {{"ln_f.weight", {16}}, {"ln_f.bias", {16}}}});
  return ops;
}

float ReadParam(DType dtype, const std::vector<uint8_t>& payload, int64_t i) {
  switch (dtype) {
    case DType::kF32: {
      float x;
      std::memcpy(&x, payload.data() + 4 * i, 4);
      return x;
    }
    case DType::kF16:
    case DType::kBF16: {
      uint16_t b;
      std::memcpy(&b, payload.data() + 2 * i, 2);
      return dtype == DType::kF16 ? HalfBitsToFloat(b) : BFloat16BitsToFloat(b);
    }
  }
  return 0;
}

void WriteParam(DType dtype, std::vector<uint8_t>& payload, int64_t i, float x) {
  if (dtype == DType::kF32) {
    std::memcpy(payload.data() + 4 * i, &x, 4);
    return;
  }
  const uint16_t b = dtype == DType::kF16 ? FloatToHalfBits(x) : FloatToBFloat16Bits(x);
  std::memcpy(payload.data() + 2 * i, &b, 2);
}

// The four payloads of every chunk, held on the host between accesses.
struct HostChunk {
  std::vector<uint8_t> param;
  std::vector<float> master, m, v;
};

// An AdamChunkAccess whose placement changes with every micro-batch: chunk i is on the GPU while
// (i + phase) is even. A GPU access uploads the chunk's payloads into device buffers and the
// release downloads them back, so each GPU access sees the host values and leaves its results
// there (a chunk move each way).
class MovingAccess final : public AdamChunkAccess {
 public:
  MovingAccess(std::vector<HostChunk>& chunks, Backend& backend, Stream& stream,
               int64_t capacity_elems, DType dtype)
      : chunks_(chunks), backend_(backend), stream_(stream) {
    const int64_t param_bytes = capacity_elems * SizeOf(dtype);
    for (size_t i = 0; i < chunks.size(); ++i) {
      Buffers b;
      for (void** p : {&b.param, &b.master, &b.m, &b.v}) {
        absl::StatusOr<void*> ptr =
            backend.AllocateDevice(p == &b.param ? param_bytes : capacity_elems * 4);
        CHECK(ptr.ok()) << ptr.status();
        *p = *ptr;
      }
      device_.push_back(b);
    }
  }
  ~MovingAccess() override {
    for (const Buffers& b : device_) {
      for (void* p : {b.param, b.master, b.m, b.v}) CHECK(backend_.FreeDevice(p).ok());
    }
  }

  void set_phase(int phase) { phase_ = phase; }
  bool OnGpu(int64_t i) const { return (i + phase_) % 2 == 0; }
  int64_t gpu_accesses() const { return gpu_accesses_; }

  absl::StatusOr<AdamChunkPayloads> Acquire(int64_t i, AdamChunkUse) override {
    HostChunk& c = chunks_[i];
    if (!OnGpu(i)) {
      return AdamChunkPayloads{Device::Host(), c.param.data(), c.master.data(), c.m.data(),
                               c.v.data()};
    }
    ++gpu_accesses_;
    const Buffers& b = device_[i];
    RETURN_IF_ERROR(Copy(b.param, c.param.data(), c.param.size(), CopyKind::kHostToDevice));
    RETURN_IF_ERROR(Copy(b.master, c.master.data(), c.master.size() * 4, CopyKind::kHostToDevice));
    RETURN_IF_ERROR(Copy(b.m, c.m.data(), c.m.size() * 4, CopyKind::kHostToDevice));
    RETURN_IF_ERROR(Copy(b.v, c.v.data(), c.v.size() * 4, CopyKind::kHostToDevice));
    RETURN_IF_ERROR(stream_.Synchronize());
    return AdamChunkPayloads{backend_.device(), b.param, static_cast<float*>(b.master),
                             static_cast<float*>(b.m), static_cast<float*>(b.v)};
  }

  absl::Status Release(int64_t i, AdamChunkUse) override {
    if (!OnGpu(i)) return absl::OkStatus();
    HostChunk& c = chunks_[i];
    const Buffers& b = device_[i];
    RETURN_IF_ERROR(Copy(c.param.data(), b.param, c.param.size(), CopyKind::kDeviceToHost));
    RETURN_IF_ERROR(Copy(c.master.data(), b.master, c.master.size() * 4, CopyKind::kDeviceToHost));
    RETURN_IF_ERROR(Copy(c.m.data(), b.m, c.m.size() * 4, CopyKind::kDeviceToHost));
    RETURN_IF_ERROR(Copy(c.v.data(), b.v, c.v.size() * 4, CopyKind::kDeviceToHost));
    return stream_.Synchronize();
  }

 private:
  struct Buffers {
    void* param = nullptr;
    void* master = nullptr;
    void* m = nullptr;
    void* v = nullptr;
  };
  absl::Status Copy(void* dst, const void* src, size_t bytes, CopyKind kind) {
    return stream_.MemcpyAsync(dst, src, static_cast<int64_t>(bytes), kind);
  }

  std::vector<HostChunk>& chunks_;
  Backend& backend_;
  Stream& stream_;
  std::vector<Buffers> device_;
  int phase_ = 0;
  int64_t gpu_accesses_ = 0;
};

// Every chunk on the host.
class HostAccess final : public AdamChunkAccess {
 public:
  explicit HostAccess(std::vector<HostChunk>& chunks) : chunks_(chunks) {}
  absl::StatusOr<AdamChunkPayloads> Acquire(int64_t i, AdamChunkUse) override {
    HostChunk& c = chunks_[i];
    return AdamChunkPayloads{Device::Host(), c.param.data(), c.master.data(), c.m.data(),
                             c.v.data()};
  }
  absl::Status Release(int64_t, AdamChunkUse) override { return absl::OkStatus(); }

 private:
  std::vector<HostChunk>& chunks_;
};

TEST(HybridAdamCuda, AccumulationOverAMovingPlacementMatchesTheHostOnlyRun) {
  PS_REQUIRE_GPUS(1);
  ASSERT_OK_AND_ASSIGN(std::unique_ptr<Backend> backend,
                       CreateCudaBackend({.capacity_bytes = int64_t{1} << 30}));
  ASSERT_OK_AND_ASSIGN(std::unique_ptr<Stream> stream, backend->CreateStream());
  ASSERT_OK_AND_ASSIGN(std::unique_ptr<CudaAdam> cuda_adam, CudaAdam::Create(*backend));
  ASSERT_OK_AND_ASSIGN(std::unique_ptr<CpuAdam> cpu_adam, CpuAdam::Create({.num_threads = 2}));
  constexpr int kMicroBatches = 3;
  constexpr int kSteps = 2;
  for (DType dtype : {DType::kF32, DType::kF16, DType::kBF16}) {
    SCOPED_TRACE(DTypeName(dtype));
    ASSERT_OK_AND_ASSIGN(
        ChunkLayout layout,
        ChunkLayout::Build({.capacity_elems = 2400, .world_size = 1, .tensor_alignment_elems = 3},
                           Model()));
    const int64_t n = layout.capacity_elems();
    // Payloads: gaps NaN, master random, param = master rounded, moments zero.
    std::vector<HostChunk> reference(layout.num_chunks());
    TestRng rng(41);
    std::normal_distribution<float> normal;
    for (int64_t i = 0; i < layout.num_chunks(); ++i) {
      HostChunk& c = reference[i];
      c.param.resize(n * SizeOf(dtype));
      c.master.assign(n, std::numeric_limits<float>::quiet_NaN());
      c.m = c.master;
      c.v = c.master;
      for (int64_t e = 0; e < n; ++e) {
        WriteParam(dtype, c.param, e, std::numeric_limits<float>::quiet_NaN());
      }
      for (TensorId id : layout.TensorsInChunk(i)) {
        const TensorInfo& t = layout.tensor(id);
        for (int64_t e = t.offset_elems; e < t.offset_elems + t.numel; ++e) {
          c.master[e] = normal(rng);
          c.m[e] = c.v[e] = 0.0f;
          WriteParam(dtype, c.param, e, c.master[e]);
        }
      }
    }
    std::vector<HostChunk> hybrid = reference;

    HybridAdamOptions options;
    options.mode = AdamMode::kAdamW;
    options.groups = {{.name = "all", .lr = 1e-3, .weight_decay = 0.01}};
    options.max_grad_norm = 1.0;  // the norm of the accumulated sum clips
    options.gradient_accumulation_steps = kMicroBatches;
    ASSERT_OK_AND_ASSIGN(
        std::unique_ptr<HybridAdam> host_only,
        HybridAdam::Create(layout, 0, dtype, options, {cpu_adam.get(), cpu_adam.get()}));
    ASSERT_OK_AND_ASSIGN(
        std::unique_ptr<HybridAdam> on_gpu,
        HybridAdam::Create(layout, 0, dtype, options, {cpu_adam.get(), cuda_adam.get()}));
    HostAccess host_access(reference);
    MovingAccess moving(hybrid, *backend, *stream, n, dtype);

    int phase = 0;
    for (int step = 0; step < kSteps; ++step) {
      for (int micro = 0; micro < kMicroBatches; ++micro) {
        // The same gradients into both param slots.
        for (int64_t i = 0; i < layout.num_chunks(); ++i) {
          for (TensorId id : layout.TensorsInChunk(i)) {
            const TensorInfo& t = layout.tensor(id);
            for (int64_t e = t.offset_elems; e < t.offset_elems + t.numel; ++e) {
              const float g = normal(rng);
              WriteParam(dtype, reference[i].param, e, g);
              WriteParam(dtype, hybrid[i].param, e, g);
            }
          }
        }
        moving.set_phase(phase++);
        if (micro + 1 < kMicroBatches) {
          ASSERT_OK_AND_ASSIGN(const AdamStepReport a, host_only->Accumulate(host_access));
          ASSERT_OK_AND_ASSIGN(const AdamStepReport b, on_gpu->Accumulate(moving));
          EXPECT_TRUE(a.accumulated && b.accumulated);
        } else {
          ASSERT_OK_AND_ASSIGN(const AdamStepReport a, host_only->Step(host_access));
          ASSERT_OK_AND_ASSIGN(const AdamStepReport b, on_gpu->Step(moving));
          EXPECT_FALSE(a.skipped || b.skipped);
          EXPECT_GT(b.accelerator_chunks, 0);
          EXPECT_NEAR(b.grad_norm, a.grad_norm, 1e-6 * a.grad_norm);
          EXPECT_EQ(b.clip_coef, a.clip_coef);
        }
      }
    }
    EXPECT_GT(moving.gpu_accesses(), 0);

    // Momentum may cancel to near zero: its tolerance scales with the largest momentum too.
    float max_m = 0.0f;
    for (const HostChunk& c : reference) {
      for (float x : c.m) {
        if (std::isfinite(x)) max_m = std::max(max_m, std::abs(x));
      }
    }
    int failures = 0;
    for (int64_t i = 0; i < layout.num_chunks(); ++i) {
      std::vector<bool> in_tensor(n, false);
      for (TensorId id : layout.TensorsInChunk(i)) {
        const TensorInfo& t = layout.tensor(id);
        for (int64_t e = t.offset_elems; e < t.offset_elems + t.numel; ++e) {
          in_tensor[e] = true;
          const float want = reference[i].master[e], got = hybrid[i].master[e];
          // A few ULP per step of each quantity's scale (the devices' FMAs differ).
          const bool ok = std::abs(got - want) <= 1e-6f * (std::abs(want) + 1e-3f) &&
                          std::abs(hybrid[i].m[e] - reference[i].m[e]) <=
                              1e-5f * std::abs(reference[i].m[e]) + 1e-6f * max_m &&
                          std::abs(hybrid[i].v[e] - reference[i].v[e]) <=
                              1e-5f * std::abs(reference[i].v[e]) + 1e-18f;
          float rounded = got;
          if (dtype == DType::kF16) rounded = HalfBitsToFloat(FloatToHalfBits(got));
          if (dtype == DType::kBF16) rounded = BFloat16BitsToFloat(FloatToBFloat16Bits(got));
          const bool param_ok = ReadParam(dtype, hybrid[i].param, e) == rounded;
          if ((!ok || !param_ok) && failures++ < 5) {
            ADD_FAILURE() << t.name << " element " << e - t.offset_elems << ": master " << got
                          << " (host-only " << want << "), m " << hybrid[i].m[e] << " ("
                          << reference[i].m[e] << "), v " << hybrid[i].v[e] << " ("
                          << reference[i].v[e] << "), param "
                          << ReadParam(dtype, hybrid[i].param, e);
          }
        }
      }
      for (int64_t e = 0; e < n; ++e) {
        if (!in_tensor[e] && !std::isnan(hybrid[i].master[e]) && failures++ < 5) {
          ADD_FAILURE() << "gap element " << e << " of master#" << i << " was written";
        }
      }
    }
  }
}

#else  // !PS_WITH_CUDA

TEST(HybridAdamCuda, NotBuilt) { PS_REQUIRE_GPUS(1); }

#endif

}  // namespace
}  // namespace ps
