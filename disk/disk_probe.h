// Facts about the disk under a swap directory, for the pre-flight plan and the benchmark: free
// space, the filesystem, and the sequential bandwidth the swap's own I/O path reaches there.
//
// Thread safety: the functions are thread-safe (they share no state).
#ifndef PATRICKSTAR_DISK_DISK_PROBE_H_
#define PATRICKSTAR_DISK_DISK_PROBE_H_

#include <cstdint>
#include <string>

#include "absl/status/statusor.h"
#include "disk/swap_options.h"

namespace ps {

// Bytes an unprivileged user may still write under `dir` (statvfs: f_bavail * f_frsize). Errors
// name the directory.
[[nodiscard]] absl::StatusOr<int64_t> FreeDiskBytes(const std::string& dir);

// The filesystem `dir` is on, from statfs's magic: "tmpfs", "ext4" (also ext2/ext3, which share
// the magic), "xfs", "btrfs", "overlay", "nfs", "f2fs", "zfs", else the magic in hex ("0x1234").
// Errors name the directory.
[[nodiscard]] absl::StatusOr<std::string> FilesystemName(const std::string& dir);

// Whether `dir` is on a filesystem whose files live in RAM (statfs's f_type: tmpfs, ramfs or
// hugetlbfs): swap files written there take host memory, not disk. Errors name the directory.
[[nodiscard]] absl::StatusOr<bool> IsRamBacked(const std::string& dir);

// A swap or probe file, opened read-write with O_DIRECT when wanted and allowed.
struct SwapFile {
  std::string path;
  // The descriptor for aligned requests (O_DIRECT when `direct`).
  int fd = -1;
  // A second, buffered descriptor of the same file, for requests whose buffer, offset or length is
  // not aligned to kDirectIoAlignment (the same as `fd` when not direct).
  int buffered_fd = -1;
  bool direct = false;
  // "O_DIRECT", or why not: "buffered: the filesystem of /dev/shm (tmpfs) refuses O_DIRECT",
  // "buffered: direct I/O not asked for (aio direct = false)".
  std::string note;
};
// Creates `path` (O_CREAT | O_EXCL, mode 0600). With `want_direct`, opens with O_DIRECT and falls
// back to buffered I/O when the filesystem refuses it (EINVAL). Errors name the path.
[[nodiscard]] absl::StatusOr<SwapFile> CreateSwapFile(const std::string& path,
                                                      const std::string& dir, bool want_direct,
                                                      bool refuse_direct_for_test);
// Closes both descriptors (once when they are the same).
void CloseSwapFile(SwapFile& file);

struct DiskBandwidth {
  double write_bytes_per_s = 0;
  double read_bytes_per_s = 0;
  // Mean time of one block_size read alone (queue depth 1).
  int64_t block_latency_ns = 0;
  // The engine measured ("io_uring", "threads (io_uring refused: ...)").
  std::string engine;
  bool direct = false;
  // Why not direct, and what that means for the numbers ("buffered: ...; the read bandwidth
  // includes the page cache, not the disk alone").
  std::string note;
};

// Writes then reads a temporary file "<dir>/patrickstar-probe-<pid>.bin" of `bytes` (rounded up
// to block_size) sequentially in requests of options.block_size, options.queue_depth in flight,
// through the engine the swap would use (options.engine, options.direct), and removes it (also on
// SIGINT/SIGTERM under the default disposition: disk/swap_dir.h). With O_DIRECT the page cache is
// bypassed; without it the read figure is the page cache's and `note` says so. The write is
// followed by fdatasync, which the write time includes. Errors name the directory or the file.
// REQUIRES: bytes > 0.
[[nodiscard]] absl::StatusOr<DiskBandwidth> MeasureDiskBandwidth(
    const std::string& dir, const FileChunkSwapOptions& options, int64_t bytes);

}  // namespace ps

#endif  // PATRICKSTAR_DISK_DISK_PROBE_H_
