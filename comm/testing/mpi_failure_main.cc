// Helper binary for comm/mpi_multiprocess_test.cc: how a multi-rank job ends when one rank fails.
// Run as `mpirun -np 2 mpi_failure_main MODE`:
//   sigkill  rank 1 issues a 64 MiB all-reduce, then SIGKILLs itself while it is (very likely)
//            in flight; the others issue it and a barrier after it, and wait on the barrier with
//            no timeout — which can never complete, however far the all-reduce got — so mpirun
//            must end them.
//   exit     rank 1 returns 3 from main before the collective the others wait on (an error
//            path): the mpi communicator must skip MPI_Finalize so mpirun ends the job.
//   clean    every rank completes a collective and returns 0: MPI_Finalize runs at exit and
//            mpirun exits 0.
#include <signal.h>

#include <cstdio>
#include <cstring>
#include <vector>

#include "base/check.h"
#include "comm/mpi_communicator.h"

int main(int argc, char** argv) {
  if (argc != 2) {
    std::fprintf(stderr, "usage: %s sigkill|exit|clean\n", argv[0]);
    return 2;
  }
  const char* mode = argv[1];
  auto comm = ps::MpiCommunicator::Create();
  PS_CHECK_OK(comm.status());
  const int rank = (*comm)->rank();
  std::vector<float> x(16 << 20, 1.0f), y(16 << 20);
  if (rank == 1 && std::strcmp(mode, "exit") == 0) {
    std::fprintf(stderr, "rank 1: failing with exit status 3\n");
    return 3;
  }
  auto req = (*comm)->AllReduceAsync(x.data(), y.data(), static_cast<int64_t>(x.size()),
                                     ps::CommDType::kF32, ps::ReduceOp::kSum);
  PS_CHECK_OK(req.status());
  if (std::strcmp(mode, "sigkill") == 0) {
    if (rank == 1) {
      raise(SIGKILL);
      return 4;  // unreachable
    }
    auto barrier = (*comm)->BarrierAsync();
    PS_CHECK_OK(barrier.status());
    std::fprintf(stderr, "rank %d: waiting for rank 1, which SIGKILLs itself mid-collective\n",
                 rank);
    const absl::Status status = (*barrier)->Wait();
    std::fprintf(stderr, "rank %d: barrier finished: %s\n", rank, status.ToString().c_str());
    return 5;  // unreachable: mpirun kills this rank
  }
  const absl::Status status = (*req)->Wait();
  std::fprintf(stderr, "rank %d: all-reduce finished: %s\n", rank, status.ToString().c_str());
  return status.ok() ? 0 : 1;
}
