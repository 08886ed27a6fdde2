// PS_HOST_DEVICE marks inline functions that compile both for the host and, under nvcc, for the
// GPU, so CPU tests exercise exactly the arithmetic CUDA kernels run (STYLE.md rule 9).
#ifndef PATRICKSTAR_BASE_HOST_DEVICE_H_
#define PATRICKSTAR_BASE_HOST_DEVICE_H_

#if defined(__CUDACC__)
#define PS_HOST_DEVICE __host__ __device__ __forceinline__
#else
#define PS_HOST_DEVICE inline
#endif

#endif  // PATRICKSTAR_BASE_HOST_DEVICE_H_
