// The Kernels conformance suite (model/kernels/kernels.h): one set of tests every implementation
// passes — the CPU one on the emulated accelerator always, the CUDA one where a GPU exists.
// Instantiate it in a test file with
//
//   INSTANTIATE_TEST_SUITE_P(Cpu, KernelsConformanceTest,
//                            ::testing::Values(KernelsFactory{"cpu", [] { return ...; }, true}),
//                            KernelsFactoryName);
//
// What it checks, for every operation on awkward shapes (odd sizes, tails, repeated tokens,
// ignored targets, padding rows, tiles that do not divide the sizes):
//  - results: against the f64 instantiation of the CPU kernel within f32 rounding, and — for an
//    implementation that declares `bit_identical` — bit for bit against calling the f32 CPU kernel
//    directly on the host; gradients are pre-filled with random values to check the += contract;
//  - argument errors: InvalidArgument at enqueue naming the dimension or buffer, and nothing run;
//  - asynchrony: with the stream held behind a StreamGate (memory/testing/stream_gate.h), every
//    enqueue returns, the outputs stay untouched until the gate opens, and a chain of dependent
//    kernels then runs in stream order; a buffer the host overwrites before the queued kernel ran
//    is what the kernel reads (the hazard, made deterministic), and stream-ordered scratch frees
//    (CachingAllocator::DeallocateOnStream) prevent it;
//  - errors found only while running (a token outside the vocabulary): the CPU reports them at the
//    stream's Synchronize, the GPU writes NaN;
//  - concurrency: two streams running kernels at once (sharing the CPU thread pool, while the host
//    uses the pool too) give the results of one stream alone.
// A factory returning Unavailable (no GPU) makes every test of that instance report SKIPPED.
#ifndef PATRICKSTAR_MODEL_KERNELS_TESTING_KERNELS_CONFORMANCE_H_
#define PATRICKSTAR_MODEL_KERNELS_TESTING_KERNELS_CONFORMANCE_H_

#include <cstdint>
#include <functional>
#include <memory>
#include <ostream>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "base/thread_pool.h"
#include "gtest/gtest.h"
#include "memory/backend.h"
#include "model/kernels/kernels.h"

namespace ps::kernel_testing {

// An implementation under test with what it runs on. Members are destroyed bottom-up: the kernels,
// then the backend, then the pool.
struct KernelsUnderTest {
  std::unique_ptr<ThreadPool> pool;  // may be null
  std::unique_ptr<Backend> backend;
  std::unique_ptr<Kernels> kernels;
};

struct KernelsFactory {
  std::string name;
  std::function<absl::StatusOr<KernelsUnderTest>()> create;
  // Whether the implementation must equal direct calls of the f32 CPU kernels bit for bit.
  bool bit_identical = false;
};

// gtest prints a parameter by its name.
inline void PrintTo(const KernelsFactory& factory, std::ostream* os) { *os << factory.name; }

inline std::string KernelsFactoryName(const ::testing::TestParamInfo<KernelsFactory>& info) {
  return info.param.name;
}

class KernelsConformanceTest : public ::testing::TestWithParam<KernelsFactory> {
 protected:
  void SetUp() override;
  void TearDown() override;

  Kernels& kernels() { return *env_.kernels; }
  Backend& backend() { return *env_.backend; }
  Stream& stream() { return *stream_; }
  bool bit_identical() const { return GetParam().bit_identical; }

  // Device buffers (freed at TearDown). Upload and Download go through `on` (default: stream())
  // and synchronize it.
  void* AllocBytes(int64_t bytes);
  template <typename T>
  T* Alloc(int64_t n) {
    return static_cast<T*>(AllocBytes(n * static_cast<int64_t>(sizeof(T))));
  }
  void UploadBytes(void* device, const void* host, int64_t bytes, Stream* on = nullptr);
  void DownloadBytes(void* host, const void* device, int64_t bytes, Stream* on = nullptr);
  template <typename T>
  T* Upload(const std::vector<T>& host, Stream* on = nullptr) {
    T* device = Alloc<T>(static_cast<int64_t>(host.size()));
    UploadBytes(device, host.data(), static_cast<int64_t>(host.size() * sizeof(T)), on);
    return device;
  }
  template <typename T>
  std::vector<T> Download(const T* device, int64_t n, Stream* on = nullptr) {
    std::vector<T> host(static_cast<size_t>(n));
    DownloadBytes(host.data(), device, n * static_cast<int64_t>(sizeof(T)), on);
    return host;
  }
  // A copy of a 4-bit tensor's host buffers in device memory (its form's buffers, sized from
  // num_elems; kernels_conformance_quant4.cc).
  Quant4Tensor UploadQuant4(const Quant4Tensor& host);
  // A workspace of at least `bytes` (nullptr for 0).
  void* Workspace(int64_t bytes) { return bytes == 0 ? nullptr : AllocBytes(bytes); }

  // Compares an implementation's f32 result with the direct f32 CPU kernel's (bitwise, when the
  // implementation is bit-identical) and with the f64 reference (within `tol` relative to the
  // largest magnitude of the reference).
  void Check(const std::vector<float>& got, const std::vector<float>& direct,
             const std::vector<double>& reference, const std::string& what, double tol = 2e-4);

  KernelsUnderTest env_;
  std::unique_ptr<Stream> stream_;
  // A second stream, for copies while stream_ is held and for concurrency tests.
  std::unique_ptr<Stream> side_;

 private:
  std::vector<void*> buffers_;
};

}  // namespace ps::kernel_testing

#endif  // PATRICKSTAR_MODEL_KERNELS_TESTING_KERNELS_CONFORMANCE_H_
