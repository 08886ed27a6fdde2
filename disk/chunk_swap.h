// ChunkSwap: the disk tier's store — fixed-size slots in swap files under a directory the user
// names (zero_optimization.offload_optimizer.nvme_path, --nvme_path), each slot holding one
// chunk payload that does not fit in host RAM. The scheduler (scheduler/disk_tier.h) decides what
// goes to disk and when; this class only moves bytes, asynchronously, and checks them:
//  - Every write records the CRC-32C of the bytes it wrote; every read is checked against it
//    (and against its length). A mismatch, a short read or write, EIO or ENOSPC is an error
//    naming the file, the slot (e.g. "momentum#12") and the offset — never a wrong number.
//  - Slots are written before they are read: reading a slot never written is FailedPrecondition
//    (a swap file is scratch, never trusted across runs).
//  - The files are removed when the swap is destroyed (also after SIGINT/SIGTERM: see
//    disk/swap_dir.h), and a directory left by a killed run is detected.
//
// Implementations: the file-backed swap (disk/file_chunk_swap.h: io_uring or a pread/pwrite
// thread pool, O_DIRECT where the filesystem allows it) and an in-memory one for tests
// (disk/testing/memory_chunk_swap.h).
//
// Thread safety: thread-compatible. One thread (the scheduler's) calls it; the I/O runs on the
// implementation's own threads or the kernel's queue.
#ifndef PATRICKSTAR_DISK_CHUNK_SWAP_H_
#define PATRICKSTAR_DISK_CHUNK_SWAP_H_

#include <cstdint>
#include <string>

#include "absl/status/status.h"
#include "absl/status/statusor.h"

namespace ps {

// Names one asynchronous read or write until Wait() consumed it.
using IoTicket = int64_t;

// What the swap is and how its I/O runs, for the plan, the console and the metrics.
struct ChunkSwapInfo {
  // The swap files, and the directory they are in.
  std::string dir;
  std::string path;
  // "io_uring", or "threads" — with the reason io_uring is not used when it was wanted
  // ("threads (io_uring refused: Operation not permitted)").
  std::string engine;
  // O_DIRECT in use; when not, why ("buffered: tmpfs refuses O_DIRECT").
  bool direct = false;
  std::string direct_note;
  // Bytes the slots take in the files (each rounded up to the direct-I/O alignment).
  int64_t file_bytes = 0;
};

struct ChunkSwapCounters {
  int64_t reads = 0;
  int64_t writes = 0;
  int64_t read_bytes = 0;
  int64_t write_bytes = 0;
  // Time Wait() blocked the caller (the part of the I/O not hidden behind its work).
  int64_t read_wait_ns = 0;
  int64_t write_wait_ns = 0;
  // Requests that went through a buffered descriptor although the swap uses O_DIRECT, because
  // their buffer, offset or length was not aligned (disk/file_chunk_swap.h). Added after the
  // fields above; 0 for swaps without direct I/O.
  int64_t buffered_requests = 0;
};

class ChunkSwap {
 public:
  // Waits for the I/O in flight (errors are logged), closes and removes the swap files.
  virtual ~ChunkSwap() = default;

  // Adds slot `key` (the caller's number; unique) of `bytes` (> 0) named `name` for messages
  // ("master#3"). InvalidArgument for a repeated key or bytes <= 0; ResourceExhausted (naming the
  // directory, the bytes needed and free) when the file cannot grow to hold it.
  [[nodiscard]] virtual absl::Status AddSlot(int64_t key, int64_t bytes, std::string name) = 0;

  // Starts writing the slot's bytes from `src`, which must stay valid and unchanged until Wait()
  // of the ticket. The CRC-32C is taken from `src` before the write is submitted. NotFound for an
  // unknown key; FailedPrecondition while another I/O of the slot is in flight.
  [[nodiscard]] virtual absl::StatusOr<IoTicket> StartWrite(int64_t key, const void* src) = 0;
  // Starts reading the slot into `dst` (the slot's bytes; valid until Wait()). NotFound for an
  // unknown key; FailedPrecondition when the slot was never written or another I/O of it is in
  // flight.
  [[nodiscard]] virtual absl::StatusOr<IoTicket> StartRead(int64_t key, void* dst) = 0;

  // Blocks until the I/O completes; consumes the ticket. For a read, checks the length and the
  // CRC-32C against the last completed write: DataLoss on a mismatch or a short read; the
  // operating system's error (EIO: DataLoss/Internal, ENOSPC: ResourceExhausted) otherwise, each
  // naming the file, the slot and the offset. A failed write leaves the slot unreadable
  // (FailedPrecondition on the next StartRead) until written again. NotFound for an unknown
  // ticket.
  [[nodiscard]] virtual absl::Status Wait(IoTicket ticket) = 0;
  // True when the I/O completed (Wait() would not block). False for an unknown ticket.
  virtual bool Poll(IoTicket ticket) = 0;

  // Whether the slot holds a completed write.
  virtual bool written(int64_t key) const = 0;
  // Bytes of slot `key`; 0 for an unknown key.
  virtual int64_t slot_bytes(int64_t key) const = 0;
  virtual ChunkSwapInfo info() const = 0;
  virtual ChunkSwapCounters counters() const = 0;
};

}  // namespace ps

#endif  // PATRICKSTAR_DISK_CHUNK_SWAP_H_
