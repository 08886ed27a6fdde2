// The Kernels conformance suite (kernels_conformance.h): asynchrony and stream order (a stream
// held behind a StreamGate), stream-ordered scratch, errors found while running, and two streams
// running at once.
#include <atomic>
#include <cmath>
#include <cstdint>
#include <thread>
#include <vector>

#include "absl/status/status.h"
#include "base/testing/status_matchers.h"
#include "base/testing/test_rng.h"
#include "base/units.h"
#include "memory/device_memory.h"
#include "memory/testing/stream_gate.h"
#include "model/kernels/embedding.h"
#include "model/kernels/gelu.h"
#include "model/kernels/gqa_attention.h"
#include "model/kernels/layernorm.h"
#include "model/kernels/matmul.h"
#include "model/kernels/residual.h"
#include "model/kernels/testing/kernel_test_util.h"
#include "model/kernels/testing/kernels_conformance.h"
#include "model/kernels/testing/kernels_conformance_util.h"

namespace ps::kernel_testing {

using ::testing::HasSubstr;

namespace {

// --- Asynchrony and stream order --------------------------------------------------------------

TEST_P(KernelsConformanceTest, KernelsRunAsynchronouslyAndInStreamOrder) {
  TestRng rng(16);
  constexpr int64_t kN = 777;
  const auto a = Rand(rng, kN), b = Rand(rng, kN);
  const std::vector<float> sentinel(kN, -123.0f);
  float *d_a = Upload(a), *d_b = Upload(b), *d_t1 = Alloc<float>(kN), *d_t2 = Alloc<float>(kN);
  float* d_out = Upload(sentinel);
  ASSERT_OK_AND_ASSIGN(auto gate, StreamGate::Close(stream()));
  // A chain: each kernel reads the previous one's output.
  ASSERT_OK(kernels().ResidualForward(stream(), kN, d_a, d_b, d_t1));
  ASSERT_OK(kernels().GeluForward(stream(), kN, d_t1, d_t2));
  ASSERT_OK(kernels().ResidualForward(stream(), kN, d_t2, d_a, d_out));
  // Every enqueue has returned; none of the kernels has run (read through another stream).
  EXPECT_EQ(Download(d_out, kN, side_.get()), sentinel);
  gate->Open();
  std::vector<float> t1(kN), t2(kN), out(kN);
  ASSERT_OK(ResidualForward<float>(C(a), C(b), M(t1), nullptr));
  ASSERT_OK(GeluForward<float>(C(t1), M(t2), nullptr));
  ASSERT_OK(ResidualForward<float>(C(t2), C(a), M(out), nullptr));
  std::vector<double> t1_r(kN), t2_r(kN), out_r(kN);
  ASSERT_OK(ResidualForward<double>(C(D(a)), C(D(b)), M(t1_r), nullptr));
  ASSERT_OK(GeluForward<double>(C(t1_r), M(t2_r), nullptr));
  ASSERT_OK(ResidualForward<double>(C(t2_r), C(D(a)), M(out_r), nullptr));
  Check(Download(d_out, kN), out, out_r, "the chain after the gate opened");
}

// The hazard every ordering bug reduces to, made deterministic: a kernel reads its input when it
// runs, not when it was enqueued, so a host that reuses the buffer in between changes the result.
TEST_P(KernelsConformanceTest, ABufferReusedBeforeTheKernelRanIsWhatTheKernelReads) {
  TestRng rng(17);
  constexpr int64_t kN = 300;
  const auto x_old = Rand(rng, kN), x_new = Rand(rng, kN);
  float *d_x = Upload(x_old), *d_y = Alloc<float>(kN);
  ASSERT_OK_AND_ASSIGN(auto gate, StreamGate::Close(stream()));
  ASSERT_OK(kernels().GeluForward(stream(), kN, d_x, d_y));
  UploadBytes(d_x, x_new.data(), kN * sizeof(float), side_.get());  // the premature reuse
  gate->Open();
  std::vector<float> y_new(kN), y_old(kN);
  ASSERT_OK(GeluForward<float>(C(x_new), M(y_new), nullptr));
  ASSERT_OK(GeluForward<float>(C(x_old), M(y_old), nullptr));
  const std::vector<float> got = Download(d_y, kN);
  ExpectAllNear(got, y_new, 1e-5, 1e-5, "the kernel read the reused buffer");
  EXPECT_NE(got, y_old);
}

// ... and what prevents it: scratch freed in stream order is not handed out again while a kernel
// queued before the free still reads it.
TEST_P(KernelsConformanceTest, StreamOrderedScratchIsNotReusedUnderAQueuedKernel) {
  TestRng rng(18);
  constexpr int64_t kN = 300;
  constexpr int64_t kBytes = kN * sizeof(float);
  DeviceMemoryOptions options;
  options.chunk_block_bytes = kMiB;
  options.capacity_bytes = 16 * kMiB;
  ASSERT_OK_AND_ASSIGN(auto memory, CreateAcceleratorMemory(&backend(), options));
  CachingAllocator& scratch = *memory->scratch();
  const auto x_old = Rand(rng, kN), x_new = Rand(rng, kN);
  ASSERT_OK_AND_ASSIGN(void* x, scratch.Allocate(kBytes));
  ASSERT_OK_AND_ASSIGN(void* y, scratch.Allocate(kBytes));
  UploadBytes(x, x_old.data(), kBytes);
  ASSERT_OK_AND_ASSIGN(auto gate, StreamGate::Close(stream()));
  ASSERT_OK(kernels().GeluForward(stream(), kN, static_cast<float*>(x), static_cast<float*>(y)));
  ASSERT_OK(scratch.DeallocateOnStream(x, kBytes, stream()));
  ASSERT_OK_AND_ASSIGN(void* x2, scratch.Allocate(kBytes));  // the host wants scratch again
  EXPECT_NE(x2, x);
  UploadBytes(x2, x_new.data(), kBytes, side_.get());
  gate->Open();
  std::vector<float> y_old(kN);
  ASSERT_OK(GeluForward<float>(C(x_old), M(y_old), nullptr));
  ExpectAllNear(Download(static_cast<float*>(y), kN), y_old, 1e-5, 1e-5, "kernel output");
  ASSERT_OK(stream().Synchronize());
  EXPECT_OK(scratch.Deallocate(x2, kBytes));
  EXPECT_OK(scratch.Deallocate(y, kBytes));
}

TEST_P(KernelsConformanceTest, DataErrorsFoundWhileRunningAreReportedOrLoud) {
  const EmbeddingShape s{.rows = 4, .channels = 3, .vocab_size = 5};
  const std::vector<int32_t> tokens = {0, 4, 5, 1};  // 5 is outside the vocabulary
  int32_t* d_tokens = Upload(tokens);
  float* d_wte = Upload(std::vector<float>(15, 0.5f));
  float* d_out = Alloc<float>(12);
  // Enqueuing succeeds: the tokens are device data.
  ASSERT_OK(kernels().EmbeddingForward(stream(), s, d_tokens, d_wte, d_out));
  if (kernels().name() == "cpu") {
    EXPECT_THAT(stream().Synchronize(),
                StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("token 5 at index 2")));
  } else {
    const std::vector<float> out = Download(d_out, 12);
    for (int c = 0; c < 3; ++c) {
      EXPECT_TRUE(std::isnan(out[2 * 3 + c])) << c;
      EXPECT_EQ(out[1 * 3 + c], 0.5f);
    }
  }
}

TEST_P(KernelsConformanceTest, ConcurrentStreamsGiveTheResultsOfOneStreamAlone) {
  TestRng rng(19);
  // Per stream: qkv = x W + b, attention, LayerNorm of the attention output, four times over.
  // GPT-2's attention on the fused qkv [B, T, 3C], C = 32: row strides of 3C.
  const GqaAttentionShape as{.batch = 2,
                             .seq_len = 16,
                             .num_heads = 4,
                             .num_kv_heads = 4,
                             .head_dim = 8,
                             .tile = 8,
                             .q_row_stride = 96,
                             .kv_row_stride = 96};
  const int64_t rows = as.batch * as.seq_len, c = as.num_heads * as.head_dim;
  const MatmulShape ms{.rows = rows, .in_features = 48, .out_features = 3 * c};
  const LayerNormShape ls{.rows = rows, .channels = c};
  const auto x = Rand(rng, rows * ms.in_features), w = Rand(rng, ms.in_features * 3 * c),
             b = Rand(rng, 3 * c);
  float *d_x = Upload(x), *d_w = Upload(w), *d_b = Upload(b);
  const std::vector<float> ln_w(c, 1.0f), ln_b(c, 0.0f);
  float *d_lw = Upload(ln_w), *d_lb = Upload(ln_b);
  struct Outputs {
    float *qkv, *att, *lse, *ln, *mean, *rstd;
    void *mws, *aws;
  };
  const int64_t mws = kernels().MatmulWorkspaceBytes(ms);
  const int64_t aws = kernels().GqaAttentionForwardWorkspaceBytes(as);
  const int64_t lse_elems = as.batch * as.num_heads * as.seq_len;
  auto make = [&] {
    return Outputs{Alloc<float>(rows * 3 * c),
                   Alloc<float>(rows * c),
                   Alloc<float>(lse_elems),
                   Alloc<float>(rows * c),
                   Alloc<float>(rows),
                   Alloc<float>(rows),
                   Workspace(mws),
                   Workspace(aws)};
  };
  const Outputs o1 = make(), o2 = make();
  auto enqueue = [&](Stream& s, const Outputs& o) {
    for (int round = 0; round < 4; ++round) {
      ASSERT_OK(kernels().MatmulForward(s, ms, d_x, d_w, d_b, o.qkv, o.mws, mws));
      ASSERT_OK(kernels().GqaAttentionForward(s, as, o.qkv, o.qkv + c, o.qkv + 2 * c, o.att, o.lse,
                                              o.aws, aws));
      ASSERT_OK(kernels().LayerNormForward(s, ls, o.att, d_lw, d_lb, o.ln, o.mean, o.rstd));
    }
  };
  std::atomic<bool> host_ok{true};
  std::thread host([&] {
    // The host uses the kernels' pool at the same time (as CPU Adam would).
    if (env_.pool == nullptr) return;
    std::vector<int64_t> sums(64, 0);
    for (int r = 0; r < 50; ++r) {
      env_.pool->ParallelFor(64, [&](int64_t t) { sums[t] += t; });
    }
    host_ok = sums[63] == 50 * 63;
  });
  enqueue(stream(), o1);
  enqueue(*side_, o2);
  host.join();
  EXPECT_TRUE(host_ok.load());
  ASSERT_OK(side_->Synchronize());
  const std::vector<float> ln1 = Download(o1.ln, rows * c), ln2 = Download(o2.ln, rows * c);
  EXPECT_EQ(ln1, ln2);
  // And what one stream computes is the direct chain's result.
  std::vector<float> qkv(rows * 3 * c), att(rows * c), lse(lse_elems),
      ws(GqaAttentionWorkspaceElems(as, 1)), ln(rows * c), mean(rows), rstd(rows);
  ASSERT_OK(MatmulForward<float>(ms, C(x), C(w), C(b), M(qkv), nullptr));
  ASSERT_OK(FusedQkvAttentionForward<float>(as, C(qkv), M(att), M(lse), M(ws)));
  ASSERT_OK(
      LayerNormForward<float>(ls, C(att), C(ln_w), C(ln_b), M(ln), M(mean), M(rstd), nullptr));
  if (bit_identical()) {
    EXPECT_EQ(ln1, ln);
  } else {
    ExpectAllNear(ln1, ln, 1e-3, 1e-3, "LayerNorm of attention of the GEMM");
  }
}

}  // namespace
}  // namespace ps::kernel_testing
