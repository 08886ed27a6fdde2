// Test helpers for model/kernels/cuda: whether a GPU is present, device vectors
// with host copies, and a stream. Failures of the CUDA runtime here are
// test-infrastructure errors and CHECK-fail.
#ifndef PATRICKSTAR_MODEL_KERNELS_CUDA_CUDA_TEST_UTIL_H_
#define PATRICKSTAR_MODEL_KERNELS_CUDA_CUDA_TEST_UTIL_H_

#include <cuda_runtime.h>

#include <cstddef>
#include <vector>

#include "glog/logging.h"

namespace ps::cuda_testing {

// True when the CUDA runtime sees at least one device.
inline bool HaveGpu() {
  int count = 0;
  if (cudaGetDeviceCount(&count) != cudaSuccess) {
    (void)cudaGetLastError();  // clear the error for later calls
    return false;
  }
  return count > 0;
}

// A device array of n elements of T (n may be 0), optionally filled from a host
// vector.
template <typename T>
class DeviceVector {
 public:
  explicit DeviceVector(size_t n) : n_(n) {
    CHECK_EQ(cudaMalloc(&data_, (n == 0 ? 1 : n) * sizeof(T)), cudaSuccess);
  }
  explicit DeviceVector(const std::vector<T>& host) : DeviceVector(host.size()) { Upload(host); }
  DeviceVector(const DeviceVector&) = delete;
  DeviceVector& operator=(const DeviceVector&) = delete;
  ~DeviceVector() { CHECK_EQ(cudaFree(data_), cudaSuccess); }

  T* get() { return static_cast<T*>(data_); }
  const T* get() const { return static_cast<const T*>(data_); }
  size_t size() const { return n_; }

  // Synchronous copies (the device is idle afterwards).
  void Upload(const std::vector<T>& host) {
    CHECK_EQ(host.size(), n_);
    CHECK_EQ(cudaMemcpy(data_, host.data(), n_ * sizeof(T), cudaMemcpyHostToDevice), cudaSuccess);
  }
  std::vector<T> Download() const {
    CHECK_EQ(cudaDeviceSynchronize(), cudaSuccess);
    std::vector<T> host(n_);
    CHECK_EQ(cudaMemcpy(host.data(), data_, n_ * sizeof(T), cudaMemcpyDeviceToHost), cudaSuccess);
    return host;
  }

 private:
  size_t n_;
  void* data_ = nullptr;
};

class TestStream {
 public:
  TestStream() { CHECK_EQ(cudaStreamCreate(&stream_), cudaSuccess); }
  TestStream(const TestStream&) = delete;
  TestStream& operator=(const TestStream&) = delete;
  ~TestStream() { CHECK_EQ(cudaStreamDestroy(stream_), cudaSuccess); }
  cudaStream_t get() const { return stream_; }
  void Synchronize() const { CHECK_EQ(cudaStreamSynchronize(stream_), cudaSuccess); }

 private:
  cudaStream_t stream_ = nullptr;
};

}  // namespace ps::cuda_testing

#endif  // PATRICKSTAR_MODEL_KERNELS_CUDA_CUDA_TEST_UTIL_H_
