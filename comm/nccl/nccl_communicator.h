// NcclCommunicator: collectives on CUDA device memory with NCCL (--config=cuda only).
//
// Each rank drives one GPU. Collectives are enqueued on a CUDA stream (the caller's, or one the
// communicator creates), in stream order with the caller's kernels; a request is a CUDA event
// recorded after the collective. Semantics and in-place rules are NCCL's, which
// comm/communicator.h adopts; arithmetic is NCCL's too: f16/bf16 partial sums are rounded at each
// step and kAvg pre-multiplies by 1/world, so results may differ from `local`/`mpi` in the last
// bits. Barrier is an all-reduce of one int on a device scratch word (NCCL has no barrier).
//
// Bootstrap: rank 0 of `bootstrap` (a host-memory communicator: `mpi`, or `local` for a world of
// one) creates the ncclUniqueId and broadcasts it over `bootstrap`; ranks and world size are the
// bootstrap's.
//
// Errors: ncclResult_t and cudaError_t become Status at the call site, with NCCL's last-error text.
// Buffers that are not device memory of this communicator's GPU are InvalidArgument at issue.
// Wait(timeout) polls the event and ncclCommGetAsyncError; on an asynchronous NCCL error or on
// timeout it aborts the communicator (ncclCommAbort: a hung NCCL kernel can only be ended so),
// returns Unavailable / DeadlineExceeded, and every later call on this communicator is
// FailedPrecondition — create a new one (every rank must).
//
// Thread safety: see comm/communicator.h. The CUDA device is set on the calling thread by each
// call.
#ifndef PATRICKSTAR_COMM_NCCL_NCCL_COMMUNICATOR_H_
#define PATRICKSTAR_COMM_NCCL_NCCL_COMMUNICATOR_H_

#include <cstdint>
#include <memory>

#include "absl/status/statusor.h"
#include "comm/communicator.h"

namespace ps {

namespace nccl_internal {
struct NcclState;
}  // namespace nccl_internal

struct NcclCommunicatorOptions {
  // Required: the communicator the unique id is broadcast on (kept alive by this communicator).
  std::shared_ptr<Communicator> bootstrap;
  // The GPU of this rank; -1: NodeLocalCudaDevice(first_cuda_device, the node-local rank
  // (OMPI_COMM_WORLD_LOCAL_RANK, else the bootstrap rank), the number of GPUs).
  int cuda_device = -1;
  int first_cuda_device = 0;
  // The cudaStream_t collectives are enqueued on; nullptr: a non-blocking stream owned by the
  // communicator (see cuda_stream()).
  void* cuda_stream = nullptr;
};

class NcclCommunicator final : public Communicator {
 public:
  // Collective over the bootstrap's ranks. Unavailable if this machine has no CUDA GPU.
  static absl::StatusOr<std::unique_ptr<NcclCommunicator>> Create(
      const NcclCommunicatorOptions& options);

  // Waits for the collectives in flight (unless aborted), then destroys the NCCL communicator.
  ~NcclCommunicator() override;

  absl::string_view name() const override { return "nccl"; }
  int rank() const override;
  int world_size() const override;
  CommMemory memory() const override { return CommMemory::kCudaDevice; }
  int cuda_device() const override;
  // The cudaStream_t collectives run on.
  void* cuda_stream() const;

  absl::StatusOr<std::unique_ptr<CommRequest>> AllGatherAsync(const void* send, void* recv,
                                                              int64_t count_elems,
                                                              CommDType dtype) override;
  absl::StatusOr<std::unique_ptr<CommRequest>> ReduceScatterAsync(const void* send, void* recv,
                                                                  int64_t count_elems,
                                                                  CommDType dtype,
                                                                  ReduceOp op) override;
  absl::StatusOr<std::unique_ptr<CommRequest>> AllReduceAsync(const void* send, void* recv,
                                                              int64_t count_elems, CommDType dtype,
                                                              ReduceOp op) override;
  absl::StatusOr<std::unique_ptr<CommRequest>> BroadcastAsync(const void* send, void* recv,
                                                              int64_t count_elems, CommDType dtype,
                                                              int root) override;
  absl::StatusOr<std::unique_ptr<CommRequest>> BarrierAsync() override;

 private:
  explicit NcclCommunicator(std::shared_ptr<nccl_internal::NcclState> state);

  const std::shared_ptr<nccl_internal::NcclState> state_;
};

}  // namespace ps

#endif  // PATRICKSTAR_COMM_NCCL_NCCL_COMMUNICATOR_H_
