// Communicator: the collectives of ZeRO data parallelism — all-gather (fetch a chunk group's
// remote chunks), reduce-scatter (average a group's gradients into the owner's chunk), all-reduce
// (overflow flags, norms), broadcast and barrier — behind one interface with three
// implementations:
//  - local (comm/local_communicator.h): a world of one. Collectives are copies; arguments are still
//    validated exactly as elsewhere, so single-process runs exercise the same contract.
//  - mpi   (comm/mpi_communicator.h): OpenMPI on host-addressable buffers (host memory, pinned
//    memory, the emulated `cpu` accelerator's memory). Also the launcher's bootstrap (ranks and
//    world come from mpirun) and the channel NCCL's unique id travels on.
//  - nccl  (comm/nccl/nccl_communicator.h, --config=cuda): CUDA device buffers, work enqueued on a
//    CUDA stream.
// Create one by name with CreateCommunicator() (comm/communicator_factory.h).
//
// Semantics are NCCL's. With `world` = world_size() and `count` elements of `dtype`:
//  - AllGather:     every rank contributes `count`; `recv` (count*world) holds the contributions in
//                   rank order. In place when send == recv + rank*count.
//  - ReduceScatter: `send` has count*world elements; rank r receives into `recv` (count) the
//                   reduction over ranks of send[r*count, (r+1)*count). In place when
//                   recv == send + rank*count; the other slots of that buffer are unspecified
//                   afterwards.
//  - AllReduce:     `recv` (count) = the reduction over ranks of `send` (count). In place when
//                   send == recv.
//  - Broadcast:     `recv` (count) on every rank = `send` of rank `root`. `send` is read only on
//                   the root (it may be null elsewhere). In place when send == recv.
//  - Barrier:       completes on a rank once every rank has issued it.
// Any other overlap of `send` and `recv` is InvalidArgument. count == 0 is a valid no-op
// collective (null pointers are then allowed); it still takes part in the ordering below.
//
// Reductions (ReduceOp): kSum, kAvg (sum / world), kMax. f16 and bf16 reductions accumulate each
// element in f32 and round once to the 16-bit type (round-to-nearest-even, memory/dtype_math.h)
// in `local` and `mpi`, whatever the world size: sums of f16 gradients cannot overflow at an
// intermediate partial sum, and every rank gets the same bits. `nccl` uses NCCL's arithmetic
// (16-bit partial sums, rounded at each step; kAvg pre-multiplies by 1/world), so its 16-bit
// results may differ from the others' in the last bits. f32 sums are f32 additions in an
// unspecified order. kMax of NaN operands is unspecified (use integer flags for overflow
// checks). kAvg is floating-point only; integer sums must not overflow.
//
// Asynchrony: every collective returns a CommRequest at once; the caller must keep the buffers
// alive and untouched until it completes (Done() or Wait() OK). Dropping a request does not
// cancel the collective. On one communicator, requests complete in issue order: once a request
// is done, every request issued before it on the same communicator is done too. Each collective
// also has a synchronous form (AllGather, ...) that issues and waits.
//
// Ordering across ranks: every rank must issue the same collectives, with the same counts, dtypes,
// ops and roots, in the same order (as with NCCL and MPI). A mismatch is undefined: it may fail or
// hang; Wait(timeout) turns a hang into DeadlineExceeded.
//
// Errors: bad arguments (null buffer with count > 0, negative count, disallowed overlap, dtype or
// op outside the enums, kAvg on an integer dtype, root out of range, a count the transport cannot
// express) are InvalidArgument from the issuing call, before anything is communicated; every rank
// gets the same error for the same arguments, so a rejected call does not desynchronize ranks.
// Transport failures surface from Wait() (Internal/Unavailable with the transport's message).
//
// Thread safety: all methods are thread-safe. Calls from several threads are issued in the order
// they reach the communicator, so callers that need the cross-rank order above must order their
// own calls. A CommRequest may be waited on from any thread, and more than once.
#ifndef PATRICKSTAR_COMM_COMMUNICATOR_H_
#define PATRICKSTAR_COMM_COMMUNICATOR_H_

#include <cstdint>
#include <memory>
#include <ostream>
#include <string>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "absl/time/time.h"
#include "memory/dtype.h"

namespace ps {

// Element types a collective moves. The three model-data dtypes plus two integer types for flags
// and counters.
enum class CommDType : uint8_t { kF32 = 0, kF16 = 1, kBF16 = 2, kI32 = 3, kU8 = 4 };

// Bytes per element (0 for a value outside the enum).
int64_t CommDTypeSize(CommDType dtype);
// "f32", "f16", "bf16", "i32", "u8" ("invalid(N)" outside the enum).
std::string CommDTypeName(CommDType dtype);
bool IsFloatingPoint(CommDType dtype);
// The collective element type of a model-data dtype.
CommDType ToCommDType(DType dtype);
std::ostream& operator<<(std::ostream& os, CommDType dtype);

enum class ReduceOp : uint8_t { kSum = 0, kAvg = 1, kMax = 2 };
// "sum", "avg", "max" ("invalid(N)" outside the enum).
std::string ReduceOpName(ReduceOp op);
std::ostream& operator<<(std::ostream& os, ReduceOp op);

// Which memory a communicator's buffers must be in.
enum class CommMemory : uint8_t {
  kHost = 0,        // host-addressable: host, pinned, or the emulated accelerator's memory
  kCudaDevice = 1,  // CUDA device memory of the communicator's GPU
};

// The completion handle of one collective.
class CommRequest {
 public:
  // Does not wait and does not cancel: the collective runs to completion regardless.
  virtual ~CommRequest() = default;

  // True once the collective has completed (successfully or not). Never blocks.
  virtual bool Done() = 0;
  // Blocks until the collective completes; returns its outcome. Idempotent.
  [[nodiscard]] virtual absl::Status Wait() = 0;
  // Like Wait(), but returns DeadlineExceeded (naming the collective) if it has not completed
  // within `timeout`; the collective then stays in flight (for nccl: the communicator is aborted,
  // see comm/nccl/nccl_communicator.h) and its buffers must stay valid.
  [[nodiscard]] virtual absl::Status Wait(absl::Duration timeout) = 0;
};

class Communicator {
 public:
  // Waits for the collectives still in flight on this communicator (their buffers must be alive).
  virtual ~Communicator() = default;

  // "local", "mpi" or "nccl".
  virtual absl::string_view name() const = 0;
  // This process's rank in [0, world_size()).
  virtual int rank() const = 0;
  virtual int world_size() const = 0;
  virtual CommMemory memory() const = 0;
  // The CUDA device whose memory this communicator moves (nccl: this rank's GPU); -1 for
  // host-memory communicators. A trainer puts its accelerator on the same device.
  virtual int cuda_device() const { return -1; }

  // --- Asynchronous collectives (semantics in the file comment) ---------------------------------

  [[nodiscard]] virtual absl::StatusOr<std::unique_ptr<CommRequest>> AllGatherAsync(
      const void* send, void* recv, int64_t count_elems, CommDType dtype) = 0;
  // `count_elems` is the per-rank (output) count; `send` holds count_elems * world_size().
  [[nodiscard]] virtual absl::StatusOr<std::unique_ptr<CommRequest>> ReduceScatterAsync(
      const void* send, void* recv, int64_t count_elems, CommDType dtype, ReduceOp op) = 0;
  [[nodiscard]] virtual absl::StatusOr<std::unique_ptr<CommRequest>> AllReduceAsync(
      const void* send, void* recv, int64_t count_elems, CommDType dtype, ReduceOp op) = 0;
  [[nodiscard]] virtual absl::StatusOr<std::unique_ptr<CommRequest>> BroadcastAsync(
      const void* send, void* recv, int64_t count_elems, CommDType dtype, int root) = 0;
  [[nodiscard]] virtual absl::StatusOr<std::unique_ptr<CommRequest>> BarrierAsync() = 0;

  // --- Synchronous forms: issue, then Wait() ----------------------------------------------------

  [[nodiscard]] absl::Status AllGather(const void* send, void* recv, int64_t count_elems,
                                       CommDType dtype);
  [[nodiscard]] absl::Status ReduceScatter(const void* send, void* recv, int64_t count_elems,
                                           CommDType dtype, ReduceOp op);
  [[nodiscard]] absl::Status AllReduce(const void* send, void* recv, int64_t count_elems,
                                       CommDType dtype, ReduceOp op);
  [[nodiscard]] absl::Status Broadcast(const void* send, void* recv, int64_t count_elems,
                                       CommDType dtype, int root);
  [[nodiscard]] absl::Status Barrier();
};

}  // namespace ps

#endif  // PATRICKSTAR_COMM_COMMUNICATOR_H_
