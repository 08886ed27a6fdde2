// One collective call as data, with the argument checks and descriptions every Communicator
// implementation shares, so all of them reject the same inputs with the same words. Internal to
// comm/.
#ifndef PATRICKSTAR_COMM_INTERNAL_COLLECTIVE_H_
#define PATRICKSTAR_COMM_INTERNAL_COLLECTIVE_H_

#include <cstdint>
#include <limits>
#include <string>

#include "absl/status/status.h"
#include "comm/communicator.h"

namespace ps::comm_internal {

// The GPU of a rank that was not given one: the node's ranks take consecutive GPUs from
// `first_device` (accelerator.device), wrapping around the `device_count` GPUs this process sees
// (one each when every rank is wrapped with its own CUDA_VISIBLE_DEVICES). REQUIRES:
// device_count > 0, first_device >= 0, local_rank >= 0.
int NodeLocalCudaDevice(int first_device, int local_rank, int device_count);

enum class Collective : uint8_t { kAllGather, kReduceScatter, kAllReduce, kBroadcast, kBarrier };

// "all-gather", "reduce-scatter", "all-reduce", "broadcast", "barrier".
const char* CollectiveName(Collective kind);

struct CollectiveCall {
  Collective kind = Collective::kBarrier;
  const void* send = nullptr;
  void* recv = nullptr;
  int64_t count_elems = 0;  // per-rank count, as in the Communicator methods
  CommDType dtype = CommDType::kF32;
  ReduceOp op = ReduceOp::kSum;  // reduce-scatter and all-reduce only
  int root = 0;                  // broadcast only
};

// Elements in `send` / `recv` for a world of `world` ranks (0 for a barrier).
int64_t SendElems(const CollectiveCall& call, int world);
int64_t RecvElems(const CollectiveCall& call, int world);

// OK if `call` is valid on rank `rank` of `world` (see comm/communicator.h), else InvalidArgument
// saying what is wrong, with the numbers. `max_count_elems` is the largest per-rank count the
// transport can express (MPI counts are ints); `transport` names it in that error.
absl::Status Validate(const CollectiveCall& call, int rank, int world,
                      int64_t max_count_elems = std::numeric_limits<int64_t>::max(),
                      const char* transport = "");

// Whether a valid call is in place (the allowed overlap of send and recv).
bool IsInPlace(const CollectiveCall& call, int rank, int world);

// "reduce-scatter (sum) of 1000 bf16 elements per rank on rank 1 of 4", for messages.
std::string Describe(const CollectiveCall& call, int rank, int world);

}  // namespace ps::comm_internal

#endif  // PATRICKSTAR_COMM_INTERNAL_COLLECTIVE_H_
