// GPU copy and Adam bandwidth, each beside its reference measured in the same run:
//
//  - chunk-sized host<->device copies through the cuda backend (Stream::MemcpyAsync between pinned
//    host memory from AllocatePinnedHost and device memory from AllocateDevice: the calls the
//    chunk residency code makes) against a plain cudaMemcpyAsync of the same size between
//    cudaMallocHost and cudaMalloc buffers on a plain stream;
//  - the device's own copy bandwidth (device-to-device cudaMemcpyAsync, bytes read + written);
//  - CudaAdam's step on device-resident bf16 gradients/parameters with f32 master, m and v
//    (28 bytes read + written per element), as GB/s and as a fraction of that copy bandwidth.
//
// Each number is the median of --reps timed repetitions after one warm-up, wall clock around the
// enqueue and a synchronize. Without a usable GPU it prints why and exits 1.
//
//   bazel run -c opt --config=cuda //benchmarks:cuda_copy_benchmark -- --chunk_mib=64,256
#include <cuda_runtime.h>

#include <algorithm>
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "absl/flags/flag.h"
#include "absl/flags/parse.h"
#include "absl/status/status.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "base/status_macros.h"
#include "memory/backend.h"
#include "memory/backend_factory.h"
#include "memory/dtype.h"
#include "optimizer/adam_kernels.h"
#include "optimizer/adam_math.h"
#include "optimizer/cuda/cuda_adam.h"

ABSL_FLAG(std::vector<std::string>, chunk_mib, std::vector<std::string>({"64", "256"}),
          "Copy sizes in MiB (chunk payload sizes).");
ABSL_FLAG(int, reps, 10, "Timed repetitions per measurement (the median is printed).");
ABSL_FLAG(int64_t, adam_melems, 64, "Elements per CudaAdam step, in millions.");
ABSL_FLAG(int, device, 0, "CUDA device index.");

namespace ps {
namespace {

#define BENCH_CUDA(expr)                                                                    \
  do {                                                                                      \
    const cudaError_t bench_e = (expr);                                                     \
    if (bench_e != cudaSuccess) {                                                           \
      return absl::InternalError(absl::StrCat(#expr, ": ", cudaGetErrorName(bench_e), ": ", \
                                              cudaGetErrorString(bench_e)));                \
    }                                                                                       \
  } while (0)

// Median seconds of `reps` runs of fn (after one warm-up); fn enqueues and synchronizes.
absl::StatusOr<double> MedianSeconds(int reps, const std::function<absl::Status()>& fn) {
  RETURN_IF_ERROR(fn());
  std::vector<double> t;
  for (int i = 0; i < reps; ++i) {
    const auto t0 = std::chrono::steady_clock::now();
    RETURN_IF_ERROR(fn());
    t.push_back(std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count());
  }
  std::sort(t.begin(), t.end());
  return t[t.size() / 2];
}

double GBs(double bytes, double seconds) { return bytes / seconds / 1e9; }

absl::Status Run() {
  const int reps = std::max(1, absl::GetFlag(FLAGS_reps));
  ASSIGN_OR_RETURN(std::unique_ptr<Backend> backend,
                   CreateBackend({.kind = "cuda", .device_index = absl::GetFlag(FLAGS_device)}));
  cudaDeviceProp prop{};
  BENCH_CUDA(cudaGetDeviceProperties(&prop, absl::GetFlag(FLAGS_device)));
  std::printf("device: %s, %d SMs, %.1f GiB\n", prop.name, prop.multiProcessorCount,
              static_cast<double>(prop.totalGlobalMem) / (1 << 30));
  ASSIGN_OR_RETURN(std::unique_ptr<Stream> stream, backend->CreateStream());
  cudaStream_t raw_stream = nullptr;
  BENCH_CUDA(cudaStreamCreateWithFlags(&raw_stream, cudaStreamNonBlocking));

  double device_copy_gbs = 0;
  for (const std::string& mib_text : absl::GetFlag(FLAGS_chunk_mib)) {
    int64_t mib = 0;
    if (!absl::SimpleAtoi(mib_text, &mib) || mib <= 0) {
      return absl::InvalidArgumentError(
          absl::StrCat("--chunk_mib: \"", mib_text, "\" is not a positive size in MiB"));
    }
    const int64_t bytes = mib << 20;
    ASSIGN_OR_RETURN(void* host, backend->AllocatePinnedHost(bytes));
    ASSIGN_OR_RETURN(void* dev, backend->AllocateDevice(bytes));
    void* raw_host = nullptr;
    void* raw_dev = nullptr;
    void* raw_dev2 = nullptr;
    BENCH_CUDA(cudaMallocHost(&raw_host, bytes));
    BENCH_CUDA(cudaMalloc(&raw_dev, bytes));
    BENCH_CUDA(cudaMalloc(&raw_dev2, bytes));
    auto backend_copy = [&](CopyKind kind) {
      return [&, kind]() -> absl::Status {
        RETURN_IF_ERROR(kind == CopyKind::kHostToDevice
                            ? stream->MemcpyAsync(dev, host, bytes, kind)
                            : stream->MemcpyAsync(host, dev, bytes, kind));
        return stream->Synchronize();
      };
    };
    auto raw_copy = [&](cudaMemcpyKind kind) {
      return [&, kind]() -> absl::Status {
        void* dst = kind == cudaMemcpyHostToDevice   ? raw_dev
                    : kind == cudaMemcpyDeviceToHost ? raw_host
                                                     : raw_dev2;
        const void* src = kind == cudaMemcpyHostToDevice ? raw_host : raw_dev;
        BENCH_CUDA(cudaMemcpyAsync(dst, src, bytes, kind, raw_stream));
        BENCH_CUDA(cudaStreamSynchronize(raw_stream));
        return absl::OkStatus();
      };
    };
    ASSIGN_OR_RETURN(const double b_h2d,
                     MedianSeconds(reps, backend_copy(CopyKind::kHostToDevice)));
    ASSIGN_OR_RETURN(const double r_h2d, MedianSeconds(reps, raw_copy(cudaMemcpyHostToDevice)));
    ASSIGN_OR_RETURN(const double b_d2h,
                     MedianSeconds(reps, backend_copy(CopyKind::kDeviceToHost)));
    ASSIGN_OR_RETURN(const double r_d2h, MedianSeconds(reps, raw_copy(cudaMemcpyDeviceToHost)));
    ASSIGN_OR_RETURN(const double r_d2d, MedianSeconds(reps, raw_copy(cudaMemcpyDeviceToDevice)));
    const double b = static_cast<double>(bytes);
    std::printf(
        "copy %lld MiB: H2D chunk %.1f GB/s vs cudaMemcpyAsync %.1f GB/s (%.2fx); D2H chunk %.1f "
        "GB/s vs %.1f GB/s (%.2fx); D2D %.1f GB/s (read + written)\n",
        static_cast<long long>(mib), GBs(b, b_h2d), GBs(b, r_h2d), r_h2d / b_h2d, GBs(b, b_d2h),
        GBs(b, r_d2h), r_d2h / b_d2h, GBs(2 * b, r_d2d));
    device_copy_gbs = std::max(device_copy_gbs, GBs(2 * b, r_d2d));
    RETURN_IF_ERROR(backend->FreePinnedHost(host));
    RETURN_IF_ERROR(backend->FreeDevice(dev));
    BENCH_CUDA(cudaFreeHost(raw_host));
    BENCH_CUDA(cudaFree(raw_dev));
    BENCH_CUDA(cudaFree(raw_dev2));
  }

  // CudaAdam over one device-resident segment.
  const int64_t n = absl::GetFlag(FLAGS_adam_melems) * 1000000;
  ASSIGN_OR_RETURN(std::unique_ptr<CudaAdam> adam, CudaAdam::Create(*backend));
  std::vector<void*> buffers;
  for (int64_t bytes_per : {2, 2, 4, 4, 4}) {  // grad, param (bf16); master, m, v (f32)
    ASSIGN_OR_RETURN(void* p, backend->AllocateDevice(n * bytes_per));
    BENCH_CUDA(cudaMemset(p, 0, n * bytes_per));
    buffers.push_back(p);
  }
  const AdamStepScalars s = MakeAdamStepScalars(AdamMode::kAdamW, 1e-3, 0.9, 0.999, 1e-8, 0.01,
                                                /*step=*/10, /*loss_scale=*/1.0);
  const AdamSegment segment{s,
                            DType::kBF16,
                            buffers[0],
                            buffers[1],
                            static_cast<float*>(buffers[2]),
                            static_cast<float*>(buffers[3]),
                            static_cast<float*>(buffers[4]),
                            n};
  ASSIGN_OR_RETURN(const double adam_s, MedianSeconds(reps, [&]() -> absl::Status {
                     return adam->Step({&segment, 1}).status();
                   }));
  const double adam_gbs = GBs(28.0 * static_cast<double>(n), adam_s);
  std::printf(
      "CudaAdam bf16 %lld M elements: %.3f ms, %.1f GB/s (28 B/element), %.2f of the device copy "
      "bandwidth (%.1f GB/s)\n",
      static_cast<long long>(n / 1000000), adam_s * 1e3, adam_gbs, adam_gbs / device_copy_gbs,
      device_copy_gbs);
  for (void* p : buffers) RETURN_IF_ERROR(backend->FreeDevice(p));
  BENCH_CUDA(cudaStreamDestroy(raw_stream));
  return absl::OkStatus();
}

}  // namespace
}  // namespace ps

int main(int argc, char** argv) {
  absl::ParseCommandLine(argc, argv);
  const absl::Status status = ps::Run();
  if (!status.ok()) {
    std::fprintf(stderr, "cuda_copy_benchmark: %s\n", std::string(status.message()).c_str());
    return 1;
  }
  return 0;
}
