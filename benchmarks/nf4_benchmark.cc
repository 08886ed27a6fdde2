// QLoRA's 4-bit base (issue #37): the dequantization rate against this machine's memory bandwidth,
// and the dequantizing GEMM (model/kernels/nf4_linear.h) against the f32 GEMM of the same shape on
// the already-dequantized weight (model/kernels/linear.h, the product the 16/32-bit LoRA run does),
// forward and input gradient, in one run:
//  1. bandwidth: memcpy of --copy_mib MiB (read + write bytes per second), best of --reps;
//  2. dequantization of a [--out, --in] NF4 weight (plain absmax and nested) to f32, single thread
//     and in parallel over row ranges on --threads threads: bytes moved (codes + scales read, f32
//     written) per second, and as a fraction of the memcpy rate;
//  3. Quant4LinearForward / Quant4LinearBackwardInput vs LinearForward / LinearBackward (dx only)
//     for x [--rows, --in] on --threads threads, best of --reps: seconds and the ratio; and the
//     same 4-bit GEMMs computing in bf16 (bnb_4bit_compute_dtype bfloat16, plain absmax) against
//     their f32 compute; and against a bf16 base as the 16-bit LoRA run computes it (the weight
//     converted to f32, then the f32 GEMM).
//
//   bazel run -c opt //benchmarks:nf4_benchmark -- --rows=512 --in=4096 --out=11008 --threads=2
#include <algorithm>
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <vector>

#include "absl/flags/flag.h"
#include "absl/flags/parse.h"
#include "absl/random/distributions.h"
#include "absl/random/random.h"
#include "absl/types/span.h"
#include "base/check.h"
#include "base/simd_targets.h"
#include "base/thread_pool.h"
#include "memory/convert.h"
#include "memory/dtype.h"
#include "model/kernels/internal/blas.h"
#include "model/kernels/linear.h"
#include "model/kernels/nf4.h"
#include "model/kernels/nf4_linear.h"

ABSL_FLAG(int64_t, rows, 512, "GEMM rows (tokens)");
ABSL_FLAG(int64_t, in, 4096, "in_features");
ABSL_FLAG(int64_t, out, 11008, "out_features");
ABSL_FLAG(int, threads, 2, "thread pool size");
ABSL_FLAG(int, reps, 3, "repetitions; the best is reported");
ABSL_FLAG(int64_t, copy_mib, 256, "MiB copied by the bandwidth probe");

namespace ps {
namespace {

double Seconds() {
  return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count();
}

template <typename F>
double Best(int reps, F f) {
  double best = 1e300;
  for (int r = 0; r < reps; ++r) {
    const double t0 = Seconds();
    f();
    best = std::min(best, Seconds() - t0);
  }
  return best;
}

int Main() {
  const int64_t N = absl::GetFlag(FLAGS_rows), I = absl::GetFlag(FLAGS_in),
                O = absl::GetFlag(FLAGS_out);
  const int threads = absl::GetFlag(FLAGS_threads), reps = absl::GetFlag(FLAGS_reps);
  ThreadPool pool(threads);
  std::printf("SIMD: %s; OpenBLAS core: %s; threads %d\n", DescribeSimdDispatch().c_str(),
              kernels_internal::OpenBlasCoreName().c_str(), threads);

  // 1. memcpy bandwidth.
  const int64_t copy_bytes = absl::GetFlag(FLAGS_copy_mib) << 20;
  std::vector<char> a(copy_bytes, 1), b(copy_bytes, 2);
  const double t_copy = Best(reps, [&] { std::memcpy(b.data(), a.data(), copy_bytes); });
  const double copy_gbs = 2.0 * copy_bytes / t_copy / 1e9;
  std::printf("memcpy %lld MiB: %.2f GB/s (read + write)\n",
              static_cast<long long>(copy_bytes >> 20), copy_gbs);
  a = {};
  b = {};

  // 2. dequantization.
  absl::BitGen gen;
  const int64_t n = O * I;
  std::vector<float> w(n);
  for (float& v : w) v = absl::Gaussian<float>(gen, 0.0f, 0.02f);
  std::vector<uint8_t> codes(Quant4CodeBytes(n));
  std::vector<float> absmax(Quant4NumBlocks(n));
  PS_CHECK_OK(Quantize4Bit(Quant4Type::kNf4, DType::kF32, w.data(), n, absl::MakeSpan(codes),
                           absl::MakeSpan(absmax), &pool));
  std::vector<uint8_t> nested_codes(absmax.size());
  std::vector<float> nested_absmax(Quant4NestedNumBlocks(absmax.size()));
  float offset = 0;
  PS_CHECK_OK(QuantizeAbsmaxNested(absmax, absl::MakeSpan(nested_codes),
                                   absl::MakeSpan(nested_absmax), &offset));
  const Quant4Tensor plain{Quant4Type::kNf4, n, codes.data(), absmax.data()};
  const Quant4Tensor nested{Quant4Type::kNf4,     n,     codes.data(), nullptr, nested_codes.data(),
                            nested_absmax.data(), offset};
  std::printf("weight [%lld, %lld]: %.4f bytes/param plain, %.4f nested (bf16: 2)\n",
              static_cast<long long>(O), static_cast<long long>(I),
              static_cast<double>(Quant4StateBytes(n, false)) / n,
              static_cast<double>(Quant4StateBytes(n, true)) / n);
  for (const auto& [name, t] : {std::pair{"plain", plain}, std::pair{"nested", nested}}) {
    const double moved = static_cast<double>(Quant4StateBytes(n, t.nested())) + 4.0 * n;
    const double t1 =
        Best(reps, [&] { PS_CHECK_OK(Dequantize4Bit(t, 0, n, DType::kF32, w.data())); });
    const int64_t rows_per_task = std::max<int64_t>(1, O / (4 * threads));
    const double tp = Best(reps, [&] {
      pool.ParallelFor((O + rows_per_task - 1) / rows_per_task, [&](int64_t task) {
        const int64_t r0 = task * rows_per_task, r1 = std::min(O, r0 + rows_per_task);
        PS_CHECK_OK(Dequantize4Bit(t, r0 * I, (r1 - r0) * I, DType::kF32, w.data() + r0 * I));
      });
    });
    std::printf(
        "dequantize %-6s to f32: 1 thread %.2f GB/s (%.0f%% of memcpy), %d threads %.2f "
        "GB/s (%.0f%%); %.2f Gvalues/s\n",
        name, moved / t1 / 1e9, 100 * moved / t1 / 1e9 / copy_gbs, threads, moved / tp / 1e9,
        100 * moved / tp / 1e9 / copy_gbs, n / tp / 1e9);
  }

  // 3. GEMMs. w holds the dequantized weight now.
  const LinearShape shape{N, I, O, false};
  std::vector<float> x(N * I), y(N * O), dy(N * O), dx(N * I, 0.0f);
  for (float& v : x) v = absl::Gaussian<float>(gen, 0.0f, 1.0f);
  for (float& v : dy) v = absl::Gaussian<float>(gen, 0.0f, 1.0f);
  std::vector<float> ws(Quant4LinearWorkspaceElems(shape, threads));
  std::printf(
      "GEMM rows %lld, in %lld, out %lld; workspace %.1f MiB (%d tiles) vs %.1f MiB f32 "
      "weight\n",
      static_cast<long long>(N), static_cast<long long>(I), static_cast<long long>(O),
      ws.size() * 4.0 / (1 << 20), threads, n * 4.0 / (1 << 20));
  const double f32_fwd = Best(
      reps, [&] { PS_CHECK_OK(LinearForward<float>(shape, x, w, {}, absl::MakeSpan(y), &pool)); });
  const double f32_bwd = Best(reps, [&] {
    PS_CHECK_OK(LinearBackward<float>(shape, x, w, dy, absl::MakeSpan(dx), {}, {}, &pool));
  });
  // The 16-bit LoRA base as the model computes it: the bf16 weight converted to f32 (the program's
  // ParamF32, on the compute thread) and then the same f32 GEMM.
  std::vector<uint16_t> w16(n);
  PS_CHECK_OK(Convert(DType::kF32, w.data(), DType::kBF16, w16.data(), n));
  std::vector<float> w32(n);
  const double b16_fwd = Best(reps, [&] {
    PS_CHECK_OK(Convert(DType::kBF16, w16.data(), DType::kF32, w32.data(), n));
    PS_CHECK_OK(LinearForward<float>(shape, x, w32, {}, absl::MakeSpan(y), &pool));
  });
  const double b16_bwd = Best(reps, [&] {
    PS_CHECK_OK(Convert(DType::kBF16, w16.data(), DType::kF32, w32.data(), n));
    PS_CHECK_OK(LinearBackward<float>(shape, x, w32, dy, absl::MakeSpan(dx), {}, {}, &pool));
  });
  for (const auto& [name, t] : {std::pair{"plain", plain}, std::pair{"nested", nested}}) {
    const double q_fwd = Best(reps, [&] {
      PS_CHECK_OK(
          Quant4LinearForward(shape, x, t, {}, absl::MakeSpan(y), absl::MakeSpan(ws), &pool));
    });
    const double q_bwd = Best(reps, [&] {
      PS_CHECK_OK(
          Quant4LinearBackwardInput(shape, t, dy, absl::MakeSpan(dx), absl::MakeSpan(ws), &pool));
    });
    const double flops = 2.0 * N * I * O;
    std::printf(
        "%-6s forward: 4-bit %.3f s (%.1f GFLOP/s) vs f32 %.3f s (%.1f GFLOP/s): %.3fx; "
        "input gradient: 4-bit %.3f s vs f32 %.3f s: %.3fx\n",
        name, q_fwd, flops / q_fwd / 1e9, f32_fwd, flops / f32_fwd / 1e9, q_fwd / f32_fwd, q_bwd,
        f32_bwd, q_bwd / f32_bwd);
    std::printf(
        "%-6s against a bf16 base as LoRA computes it (convert to f32, then the f32 GEMM: "
        "forward %.3f s, input gradient %.3f s): forward %.3fx, input gradient %.3fx\n",
        name, b16_fwd, b16_bwd, q_fwd / b16_fwd, q_bwd / b16_bwd);
    if (t.nested()) continue;
    // bf16 compute: the rounded activations in the workspace too.
    std::vector<float> ws16(Quant4LinearWorkspaceElems(shape, threads, DType::kBF16));
    const double b_fwd = Best(reps, [&] {
      PS_CHECK_OK(Quant4LinearForward(shape, x, t, {}, absl::MakeSpan(y), absl::MakeSpan(ws16),
                                      &pool, DType::kBF16));
    });
    const double b_bwd = Best(reps, [&] {
      PS_CHECK_OK(Quant4LinearBackwardInput(shape, t, dy, absl::MakeSpan(dx),
                                            absl::MakeSpan(ws16), &pool, DType::kBF16));
    });
    std::printf(
        "%-6s bf16 compute (workspace %.1f MiB): forward %.3f s (%.3fx the 4-bit f32 compute), "
        "input gradient %.3f s (%.3fx)\n",
        name, ws16.size() * 4.0 / (1 << 20), b_fwd, b_fwd / q_fwd, b_bwd, b_bwd / q_bwd);
  }
  return 0;
}

}  // namespace
}  // namespace ps

int main(int argc, char** argv) {
  absl::ParseCommandLine(argc, argv);
  return ps::Main();
}
