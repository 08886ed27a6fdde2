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
#include "absl/strings/string_view.h"
#include "comm/communicator.h"

namespace ps {

struct CommunicatorOptions {
  std::string kind = "local";
  // nccl only: the GPU (-1: the node's ranks take consecutive GPUs from first_cuda_device,
  // modulo the GPU count), the cudaStream_t to enqueue on (nullptr: one owned by the
  // communicator), and the host communicator the NCCL unique id is broadcast on (null: a new mpi
  // communicator).
  int cuda_device = -1;
  int first_cuda_device = 0;
  void* cuda_stream = nullptr;
  std::shared_ptr<Communicator> bootstrap;
};

[[nodiscard]] absl::StatusOr<std::unique_ptr<Communicator>> CreateCommunicator(
    const CommunicatorOptions& options);

// Whether this binary was built with --config=cuda (and so has the nccl communicator).
bool NcclCompiledIn();

// The communicator of a training run, from the trainer's --comm flag ("auto", "local", "mpi",
// "nccl"), whether its accelerator is "cuda", whether mpirun started this process, and
// accelerator.device. A kind of "" means no communicator (a world of one).
//  - auto: nccl under mpirun with cuda (ZeRO payloads are device memory, which only nccl can
//    move), mpi under mpirun otherwise, none without mpirun.
//  - mpi with cuda under mpirun: InvalidArgument naming --comm=nccl (the host communicator
//    would dereference device pointers).
//  - nccl under mpirun: each rank takes its GPU by node-local rank, counting from
//    accelerator.device (cuda_device -1, first_cuda_device = accelerator.device), so ranks do not
//    all land on one GPU; without mpirun (a world of one): accelerator.device.
// Anything else is InvalidArgument.
[[nodiscard]] absl::StatusOr<CommunicatorOptions> ChooseTrainingCommunicator(
    absl::string_view comm_flag, bool cuda_accelerator, bool launched_by_mpirun,
    int accelerator_device);

}  // namespace ps

#endif  // PATRICKSTAR_COMM_COMMUNICATOR_FACTORY_H_
