// The file-backed ChunkSwap (disk/chunk_swap.h): slots in one file per rank,
// "<dir>/patrickstar-swap-rank<R>.bin", claimed through disk/swap_dir.h, moved by an IoEngine
// (disk/io_engine.h: io_uring, or a pread/pwrite thread pool) with O_DIRECT where the filesystem
// allows it.
//
// Layout and I/O:
//  - Slots are placed one after another at offsets that are multiples of kDirectIoAlignment; the
//    file grows with fallocate as slots are added, so the space is reserved up front (ENOSPC:
//    ResourceExhausted naming the directory, the bytes needed and the bytes free).
//  - A slot's read or write is split into requests of at most block_size bytes, queued, and carried
//    by the swap's own I/O thread, which keeps at most queue_depth requests in flight (refilling as
//    each completes with overlap_events, batch by batch without; one submission per request with
//    single_submit). The I/O progresses while the caller works; Wait() only blocks on what is left.
//  - Requests whose buffer, offset or length is not a multiple of kDirectIoAlignment (an odd-sized
//    slot's last bytes, a misaligned buffer, the rest of a short transfer) go through a second,
//    buffered descriptor of the same file: correct, not direct; counters().buffered_requests
//    counts them. Host chunk payloads (memory/resources.cc) are page-aligned, so only the tail of
//    an odd-sized slot takes that path.
//  - A short transfer (fewer bytes than asked, not an error) is continued with the rest. A read
//    that returns 0 bytes before the slot's end is a short read: DataLoss.
//  - The CRC-32C (base/crc32c.h) of a write is taken from the source on the I/O thread while
//    the write is in flight (the source may not change before Wait) and becomes the slot's when
//    the write completes; a read's bytes are checksummed on the I/O thread once they all arrived,
//    and Wait() compares: DataLoss naming the file, the slot and the offset on a mismatch. Both
//    stay off the caller's thread, which runs Adam meanwhile.
//  - Errors of the disk: EIO is DataLoss ("the disk reported an I/O error"), ENOSPC on a write is
//    ResourceExhausted naming the directory and its free bytes, other errnos keep their canonical
//    code; each names the file, the slot and the file offset. A failed write leaves the slot
//    unwritten (FailedPrecondition on the next StartRead).
//  - The destructor waits for the I/O in flight (logging errors nobody waited for), closes the file
//    and removes it with the lock (disk/swap_dir.h; also after SIGINT/SIGTERM).
//
// Thread safety: thread-compatible, as ChunkSwap (the I/O thread is internal).
#ifndef PATRICKSTAR_DISK_FILE_CHUNK_SWAP_H_
#define PATRICKSTAR_DISK_FILE_CHUNK_SWAP_H_

#include <memory>

#include "absl/status/statusor.h"
#include "disk/chunk_swap.h"
#include "disk/swap_options.h"

namespace ps {

// Claims options.dir for options.rank, creates the swap file and opens the engine. Errors:
// those of SwapDir::Claim (missing or read-only directory, another live run) and OpenIoEngine
// (io_uring asked for and refused), InvalidArgument for a block_size, queue_depth or
// thread_count out of range (naming the aio key), and the errno of creating the file.
[[nodiscard]] absl::StatusOr<std::unique_ptr<ChunkSwap>> OpenFileChunkSwap(
    FileChunkSwapOptions options);

}  // namespace ps

#endif  // PATRICKSTAR_DISK_FILE_CHUNK_SWAP_H_
