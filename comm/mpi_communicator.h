// MpiCommunicator: collectives over OpenMPI on host-addressable buffers (host memory, pinned
// memory, or the emulated `cpu` accelerator's device memory). It is the backend for CPU-only
// multi-rank training, the bootstrap of every multi-rank run (ranks and world size come from
// mpirun), and the channel NCCL's unique id travels on.
//
// Launching: `mpirun -np N prog` gives a world of N. A program started without mpirun runs as an
// MPI singleton: a world of one that works like `local` (no error).
//
// Threading (the design decision): MPI is initialized on, and every MPI call is made from, one
// process-wide MPI thread, so the library needs only MPI_THREAD_FUNNELED (MPI_THREAD_MULTIPLE is
// requested and used if some other code initialized MPI first; then that code must not make MPI
// calls on MPI_COMM_WORLD collectives concurrently with ours, and MPI must provide
// MPI_THREAD_MULTIPLE, else Create() is FailedPrecondition). Issuing a collective validates the
// arguments on the caller's thread and queues it; the MPI thread starts it as a nonblocking MPI
// collective (MPI_Iallgather, MPI_Ireduce_scatter_block, MPI_Iallreduce, MPI_Ibcast, MPI_Ibarrier)
// in queue order and drives progress by polling MPI_Test on everything in flight, so collectives
// progress while the caller computes (OpenMPI's nonblocking collectives progress only inside MPI
// calls). Requests complete in issue order per communicator. Each MpiCommunicator duplicates
// MPI_COMM_WORLD, so independent communicators do not interfere.
//
// 16-bit reductions (f32 accumulation, one rounding; see comm/communicator.h): with at most two
// ranks, custom MPI_Ops on the 16-bit data add the two contributions in f32 and round once (avg:
// (a + b) / 2 in f32, rounded once), so only 16 bits per element travel. With more ranks, sum and
// avg widen to f32 (twice the bytes on the wire) and narrow the result once: MPI's algorithms
// combine partial results, which would otherwise be rounded at every step. Max uses a custom op
// at every world size (it is exact). f32 avg is an f32 sum divided by the world size.
//
// Limits: MPI counts are ints, so a per-rank count above 2^31 - 1 elements is InvalidArgument.
//
// Errors: MPI_COMM_WORLD and every duplicate use MPI_ERRORS_RETURN; MPI error codes become a
// Status with MPI's error string. Wait(timeout) returns DeadlineExceeded while the collective is
// still in flight (it stays in flight; the buffers must stay alive).
//
// When a rank dies (what OpenMPI 4.1's mpirun does, checked by comm/mpi_multiprocess_test.cc):
//  - killed by a signal (e.g. SIGKILL): mpirun reports "mpirun noticed that process rank R ...
//    exited on signal 9 (Killed)", kills the other ranks and exits non-zero (137);
//  - exits with a non-zero status: mpirun reports "mpirun detected that one or more processes
//    exited with non-zero status", kills the other ranks and exits with that status;
//  - exits with status 0 without MPI_Finalize: mpirun reports the process "exiting improperly",
//    kills the others and exits 1.
// The ranks left waiting in a collective are thus terminated by mpirun, not left hanging.
// MPI_Finalize is called by an exit handler (glibc on_exit) only when the process exits with
// status 0 and no collective is in flight: MPI_Finalize synchronizes with the other ranks, so
// calling it on a failing rank would hang the job instead of ending it. Any other exit skips it,
// which makes mpirun end the job as above.
//
// Thread safety: see comm/communicator.h.
#ifndef PATRICKSTAR_COMM_MPI_COMMUNICATOR_H_
#define PATRICKSTAR_COMM_MPI_COMMUNICATOR_H_

#include <cstdint>
#include <memory>
#include <string>

#include "absl/status/statusor.h"
#include "comm/communicator.h"

namespace ps {

namespace mpi_internal {
class MpiRuntime;
}  // namespace mpi_internal

class MpiCommunicator final : public Communicator {
 public:
  // Initializes MPI on first use (later calls reuse it) and duplicates MPI_COMM_WORLD. Collective:
  // every rank must call it, in the same order relative to its other collectives.
  // FailedPrecondition if MPI was already finalized or lacks the thread support described above.
  static absl::StatusOr<std::unique_ptr<MpiCommunicator>> Create();

  // Whether this process was started by mpirun (else Create() gives an MPI singleton).
  static bool LaunchedByMpirun();

  // Waits for this communicator's collectives in flight, then frees its MPI communicator.
  ~MpiCommunicator() override;

  absl::string_view name() const override { return "mpi"; }
  int rank() const override { return rank_; }
  int world_size() const override { return world_; }
  CommMemory memory() const override { return CommMemory::kHost; }

  absl::StatusOr<std::unique_ptr<CommRequest>> AllGatherAsync(const void* send, void* recv,
                                                              int64_t count_elems,
                                                              CommDType dtype) override;
  absl::StatusOr<std::unique_ptr<CommRequest>> ReduceScatterAsync(const void* send, void* recv,
                                                                  int64_t count_elems,
                                                                  CommDType dtype,
                                                                  ReduceOp op) override;
  absl::StatusOr<std::unique_ptr<CommRequest>> AllReduceAsync(const void* send, void* recv,
                                                              int64_t count_elems,
                                                              CommDType dtype,
                                                              ReduceOp op) override;
  absl::StatusOr<std::unique_ptr<CommRequest>> BroadcastAsync(const void* send, void* recv,
                                                              int64_t count_elems,
                                                              CommDType dtype, int root) override;
  absl::StatusOr<std::unique_ptr<CommRequest>> BarrierAsync() override;

 private:
  MpiCommunicator(mpi_internal::MpiRuntime* runtime, uint64_t id, void* comm, int rank, int world);

  mpi_internal::MpiRuntime* const runtime_;
  const uint64_t id_;  // distinguishes communicators on the shared MPI thread
  void* const comm_;   // MPI_Comm*, owned (kept opaque so this header does not include mpi.h)
  const int rank_;
  const int world_;
};

}  // namespace ps

#endif  // PATRICKSTAR_COMM_MPI_COMMUNICATOR_H_
