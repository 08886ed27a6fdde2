// CreateCommunicator: a Communicator by name, for configs and flags ("local" | "mpi" | "nccl").
//
//  - "local": a world of one (comm/local_communicator.h).
//  - "mpi":   OpenMPI (comm/mpi_communicator.h). Started without mpirun it still works, as a world
//             of one (an MPI singleton); that is logged, not an error.
//  - "nccl":  NCCL on this rank's GPU (comm/nccl/nccl_communicator.h), bootstrapped over
//             `bootstrap`, or over a new mpi communicator when that is null. In a build without
//             --config=cuda it is Unimplemented, naming the flag; without a GPU, Unavailable.
// Anything else is InvalidArgument listing the names.
#ifndef PATRICKSTAR_COMM_COMMUNICATOR_FACTORY_H_
#define PATRICKSTAR_COMM_COMMUNICATOR_FACTORY_H_

#include <memory>
#include <string>

#include "absl/status/statusor.h"
#include "comm/communicator.h"

namespace ps {

struct CommunicatorOptions {
  std::string kind = "local";
  // nccl only: the GPU (-1: node-local rank modulo the GPU count), the cudaStream_t to enqueue on
  // (nullptr: one owned by the communicator), and the host communicator the NCCL unique id is
  // broadcast on (null: a new mpi communicator).
  int cuda_device = -1;
  void* cuda_stream = nullptr;
  std::shared_ptr<Communicator> bootstrap;
};

[[nodiscard]] absl::StatusOr<std::unique_ptr<Communicator>> CreateCommunicator(
    const CommunicatorOptions& options);

// Whether this binary was built with --config=cuda (and so has the nccl communicator).
bool NcclCompiledIn();

}  // namespace ps

#endif  // PATRICKSTAR_COMM_COMMUNICATOR_FACTORY_H_
