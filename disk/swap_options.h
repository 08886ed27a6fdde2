// FileChunkSwapOptions: how the file-backed swap (disk/file_chunk_swap.h) and the disk probe
// (disk/disk_probe.h) do their I/O — the directory, and DeepSpeed's `aio` knobs.
#ifndef PATRICKSTAR_DISK_SWAP_OPTIONS_H_
#define PATRICKSTAR_DISK_SWAP_OPTIONS_H_

#include <cstdint>
#include <functional>
#include <memory>
#include <string>

#include "disk/io_engine.h"

namespace ps {

// Direct I/O needs buffers, offsets and lengths aligned to the device's logical block; 4096 covers
// every current device (512-byte and 4 KiB sectors). Slots start at multiples of it.
inline constexpr int64_t kDirectIoAlignment = 4096;

struct FileChunkSwapOptions {
  // The directory of the swap files (nvme_path). Must exist and be writable.
  std::string dir = {};
  // The rank: the swap file is "<dir>/patrickstar-swap-rank<rank>.bin" (disk/swap_dir.h).
  int rank = 0;

  // DeepSpeed's aio section.
  // The largest single request: a slot's I/O is split into requests of at most this many bytes.
  // At most 1 GiB; with direct I/O a multiple of kDirectIoAlignment.
  int64_t block_size = int64_t{1} << 20;
  // Requests in flight at most.
  int queue_depth = 8;
  // Threads of the pread/pwrite engine (unused by io_uring).
  int thread_count = 1;
  // Submit each request alone (one system call each) instead of batching the ready ones.
  bool single_submit = false;
  // Keep submitting while completions are reaped (refill the queue as each request completes);
  // false: submit a batch, wait for all of it, then the next.
  bool overlap_events = true;

  // io_uring, the thread pool, or io_uring with the thread pool as fallback (disk/io_engine.h).
  IoEngineKind engine = IoEngineKind::kAuto;
  // O_DIRECT where the filesystem allows it; buffered (with a note saying why) where it refuses.
  bool direct = true;

  // Test seams. `wrap_engine_for_test` receives the opened engine and returns the one to use
  // (e.g. a FaultyIoEngine around it); `io_uring_refusal_for_test` (an errno) makes io_uring look
  // refused; `refuse_direct_for_test` makes O_DIRECT look refused (EINVAL), as old tmpfs does.
  std::function<std::unique_ptr<IoEngine>(std::unique_ptr<IoEngine>)> wrap_engine_for_test = {};
  int io_uring_refusal_for_test = 0;
  bool refuse_direct_for_test = false;
};

}  // namespace ps

#endif  // PATRICKSTAR_DISK_SWAP_OPTIONS_H_
