// comm_benchmark: all-gather and reduce-scatter of chunk-sized buffers (1 MiB .. 256 MiB), the two
// collectives of ZeRO data parallelism, with bandwidths defined exactly as nccl-tests defines
// them (doc/PERFORMANCE.md there):
//   size  = count * world * sizeof(dtype)  (all-gather: the gathered output; reduce-scatter: the
//                                           input)
//   algbw = size / time
//   busbw = algbw * (world - 1) / world     (for both collectives)
// time is the slowest rank's mean over the timed iterations (each iteration starts after a
// barrier). For scale, the same run measures single-threaded memcpy bandwidth on this machine.
//
//   bazel build -c opt //benchmarks:comm_benchmark
//   mpirun --allow-run-as-root --oversubscribe -np 2 --mca btl self,vader
//       bazel-bin/benchmarks/comm_benchmark --kind=mpi                      (one line)
//   mpirun -np 8 bazel-bin/benchmarks/comm_benchmark --kind=nccl    (--config=cuda build)
//
// Not a Google Benchmark binary: its adaptive iteration counts would differ between ranks, and
// every rank must issue the same collectives.
#include <algorithm>
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <memory>
#include <string>
#include <vector>

#include "absl/flags/flag.h"
#include "absl/flags/parse.h"
#include "absl/strings/str_format.h"
#include "base/check.h"
#include "base/units.h"
#include "comm/communicator.h"
#include "comm/communicator_factory.h"
#include "glog/logging.h"

#if PS_WITH_CUDA
#include <cuda_runtime.h>
#endif

ABSL_FLAG(std::string, kind, "mpi", "communicator: local, mpi or nccl");
ABSL_FLAG(std::string, dtype, "f16", "element type: f32, f16 or bf16");
ABSL_FLAG(std::string, min_size, "1MiB", "smallest size (nccl-tests' size: count*world*elem)");
ABSL_FLAG(std::string, max_size, "256MiB", "largest size");
ABSL_FLAG(std::string, reduce_op, "avg", "reduce-scatter op: sum or avg (ZeRO averages)");

namespace ps {
namespace {

using Clock = std::chrono::steady_clock;

double Seconds(Clock::time_point a, Clock::time_point b) {
  return std::chrono::duration<double>(b - a).count();
}

// Buffers in the communicator's memory.
struct Buffer {
  Buffer(CommMemory memory, int64_t bytes) : memory(memory) {
#if PS_WITH_CUDA
    if (memory == CommMemory::kCudaDevice) {
      CHECK_EQ(cudaMalloc(&ptr, bytes), cudaSuccess);
      CHECK_EQ(cudaMemset(ptr, 0, bytes), cudaSuccess);
      return;
    }
#endif
    CHECK(memory == CommMemory::kHost);
    host.assign(bytes, 0);  // touched: no page faults in the timed loop
    ptr = host.data();
  }
  ~Buffer() {
#if PS_WITH_CUDA
    if (memory == CommMemory::kCudaDevice) cudaFree(ptr);
#endif
  }
  CommMemory memory;
  std::vector<uint8_t> host;
  void* ptr = nullptr;
};

double MemcpyBandwidth() {
  const int64_t bytes = int64_t{256} << 20;
  std::vector<uint8_t> a(bytes, 1), b(bytes, 2);
  double best = 0;
  for (int i = 0; i < 5; ++i) {
    const auto t0 = Clock::now();
    std::memcpy(b.data(), a.data(), bytes);
    const auto t1 = Clock::now();
    best = std::max(best, bytes / Seconds(t0, t1));
  }
  CHECK_EQ(b[bytes / 2], 1);
  return best;
}

// Mean seconds per collective on the slowest rank.
template <typename Issue>
double TimeCollective(Communicator& comm, int iters, Issue issue) {
  for (int i = 0; i < 2; ++i) PS_CHECK_OK(issue()->Wait());  // warm-up
  double total = 0;
  for (int i = 0; i < iters; ++i) {
    PS_CHECK_OK(comm.Barrier());
    const auto t0 = Clock::now();
    PS_CHECK_OK(issue()->Wait());
    total += Seconds(t0, Clock::now());
  }
  double mean = total / iters;
  // The slowest rank's time. Only host communicators can reduce a host value; with nccl each rank
  // times the same synchronized collective, so rank 0's time is representative.
  if (comm.memory() == CommMemory::kHost) {
    float t = static_cast<float>(mean);
    PS_CHECK_OK(comm.AllReduce(&t, &t, 1, CommDType::kF32, ReduceOp::kMax));
    mean = t;
  }
  return mean;
}

int Main() {
  CommunicatorOptions options;
  options.kind = absl::GetFlag(FLAGS_kind);
  auto created = CreateCommunicator(options);
  PS_CHECK_OK(created.status());
  Communicator& comm = **created;
  auto dtype_or = ParseDType(absl::GetFlag(FLAGS_dtype));
  PS_CHECK_OK(dtype_or.status());
  const CommDType dtype = ToCommDType(*dtype_or);
  auto min_size = ParseBytes(absl::GetFlag(FLAGS_min_size));
  auto max_size = ParseBytes(absl::GetFlag(FLAGS_max_size));
  PS_CHECK_OK(min_size.status());
  PS_CHECK_OK(max_size.status());
  const std::string op_name = absl::GetFlag(FLAGS_reduce_op);
  CHECK(op_name == "sum" || op_name == "avg") << "--reduce_op must be sum or avg";
  const ReduceOp op = op_name == "sum" ? ReduceOp::kSum : ReduceOp::kAvg;
  const int world = comm.world_size();
  const int64_t elem = CommDTypeSize(dtype);
  const bool print = comm.rank() == 0;

  if (print) {
    std::printf("comm_benchmark: %s, world %d, %s, reduce-scatter op %s\n",
                std::string(comm.name()).c_str(), world, CommDTypeName(dtype).c_str(),
                op_name.c_str());
    std::printf("memcpy (1 thread, 256 MiB, best of 5): %.2f GB/s\n", MemcpyBandwidth() / 1e9);
    std::printf("%-15s %10s %12s %10s %10s\n", "collective", "size", "time(us)", "algbw",
                "busbw");
    std::printf("%-15s %10s %12s %10s %10s\n", "", "", "", "(GB/s)", "(GB/s)");
  }
  for (int64_t size = *min_size; size <= *max_size; size *= 2) {
    const int64_t count = size / world / elem;
    const int64_t bytes = count * world * elem;  // size rounded down to a multiple
    const int iters = static_cast<int>(std::clamp<int64_t>((int64_t{2} << 30) / bytes, 5, 50));
    Buffer big(comm.memory(), bytes);
    Buffer small(comm.memory(), count * elem);
    const double t_ag = TimeCollective(comm, iters, [&] {
      auto r = comm.AllGatherAsync(small.ptr, big.ptr, count, dtype);
      PS_CHECK_OK(r.status());
      return *std::move(r);
    });
    const double t_rs = TimeCollective(comm, iters, [&] {
      auto r = comm.ReduceScatterAsync(big.ptr, small.ptr, count, dtype, op);
      PS_CHECK_OK(r.status());
      return *std::move(r);
    });
    if (print) {
      for (const auto& [name, t] : {std::pair<const char*, double>{"all-gather", t_ag},
                                    std::pair<const char*, double>{"reduce-scatter", t_rs}}) {
        const double algbw = bytes / t / 1e9;
        const double busbw = algbw * (world - 1) / world;
        std::printf("%-15s %10s %12.1f %10.2f %10.2f\n", name, FormatBytes(bytes).c_str(),
                    t * 1e6, algbw, busbw);
      }
      std::fflush(stdout);
    }
  }
  return 0;
}

}  // namespace
}  // namespace ps

int main(int argc, char** argv) {
  absl::ParseCommandLine(argc, argv);
  return ps::Main();
}
