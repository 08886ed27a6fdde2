#include "disk/disk_probe.h"

#include <fcntl.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/statfs.h>
#include <sys/statvfs.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <chrono>
#include <cstdlib>
#include <memory>
#include <vector>

#include "absl/cleanup/cleanup.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "base/file_io.h"
#include "base/status_macros.h"
#include "disk/io_engine.h"
#include "disk/swap_dir.h"

namespace ps {
namespace {

int64_t NowNs() {
  return std::chrono::duration_cast<std::chrono::nanoseconds>(
             std::chrono::steady_clock::now().time_since_epoch())
      .count();
}

struct FreeDeleter {
  void operator()(void* p) const { std::free(p); }
};

// Runs requests of `block` bytes over [0, total) in order, `depth` in flight, each in its own part
// of `buffers` (depth * block bytes). Short transfers are continued. Errors name `path`.
absl::Status SequentialPass(IoEngine& engine, int fd, const std::string& path, bool write,
                            int64_t total, int64_t block, int depth, char* buffers) {
  struct Request {
    int64_t offset;
    int64_t done;
    int64_t bytes;
  };
  std::vector<Request> slots(static_cast<size_t>(depth));
  std::vector<int> free_slots;
  for (int i = depth - 1; i >= 0; --i) free_slots.push_back(i);
  int64_t next = 0;
  int in_flight = 0;
  std::vector<IoCompletion> completions;
  auto submit = [&](int slot) {
    const Request& r = slots[static_cast<size_t>(slot)];
    const IoRequest request{.fd = fd,
                            .offset = r.offset + r.done,
                            .buffer = buffers + static_cast<int64_t>(slot) * block + r.done,
                            .bytes = r.bytes - r.done,
                            .write = write,
                            .tag = static_cast<uint64_t>(slot)};
    ++in_flight;
    return engine.Submit(absl::MakeConstSpan(&request, 1));
  };
  while (next < total || in_flight > 0) {
    while (next < total && !free_slots.empty()) {
      const int slot = free_slots.back();
      free_slots.pop_back();
      slots[static_cast<size_t>(slot)] =
          Request{.offset = next, .done = 0, .bytes = std::min(block, total - next)};
      next += slots[static_cast<size_t>(slot)].bytes;
      RETURN_IF_ERROR(submit(slot));
    }
    completions.clear();
    RETURN_IF_ERROR(engine.Reap(1, &completions));
    for (const IoCompletion& c : completions) {
      --in_flight;
      const int slot = static_cast<int>(c.tag);
      Request& r = slots[static_cast<size_t>(slot)];
      if (c.result < 0) {
        return ErrnoError(static_cast<int>(-c.result),
                          absl::StrCat(write ? "disk probe: cannot write at offset "
                                             : "disk probe: cannot read at offset ",
                                       r.offset + r.done, " of"),
                          path);
      }
      if (c.result == 0) {
        return absl::DataLossError(absl::StrCat("disk probe: '", path, "' ended at offset ",
                                                r.offset + r.done, " (short ",
                                                write ? "write)" : "read)"));
      }
      r.done += c.result;
      if (r.done < r.bytes) {
        RETURN_IF_ERROR(submit(slot));
      } else {
        free_slots.push_back(slot);
      }
    }
  }
  return absl::OkStatus();
}

}  // namespace

absl::StatusOr<int64_t> FreeDiskBytes(const std::string& dir) {
  struct statvfs st = {};
  if (::statvfs(dir.c_str(), &st) != 0) {
    return ErrnoError(errno, "cannot read the free space (statvfs) of", dir);
  }
  return static_cast<int64_t>(st.f_bavail) * static_cast<int64_t>(st.f_frsize);
}

absl::StatusOr<std::string> FilesystemName(const std::string& dir) {
  struct statfs st = {};
  if (::statfs(dir.c_str(), &st) != 0) {
    return ErrnoError(errno, "cannot read the filesystem type (statfs) of", dir);
  }
  switch (static_cast<uint32_t>(st.f_type)) {
    case 0x01021994u:
      return std::string("tmpfs");
    case 0xEF53u:
      return std::string("ext4");
    case 0x58465342u:
      return std::string("xfs");
    case 0x9123683Eu:
      return std::string("btrfs");
    case 0x794C7630u:
      return std::string("overlay");
    case 0x6969u:
      return std::string("nfs");
    case 0xF2F52010u:
      return std::string("f2fs");
    case 0x2FC12FC1u:
      return std::string("zfs");
    default:
      return absl::StrFormat("0x%x", static_cast<uint32_t>(st.f_type));
  }
}

absl::StatusOr<bool> IsRamBacked(const std::string& dir) {
  struct statfs st = {};
  if (::statfs(dir.c_str(), &st) != 0) {
    return ErrnoError(errno, "cannot read the filesystem type (statfs) of", dir);
  }
  // TMPFS_MAGIC, RAMFS_MAGIC, HUGETLBFS_MAGIC (linux/magic.h).
  switch (static_cast<uint32_t>(st.f_type)) {
    case 0x01021994u:
    case 0x858458F6u:
    case 0x958458F6u:
      return true;
    default:
      return false;
  }
}

absl::StatusOr<SwapFile> CreateSwapFile(const std::string& path, const std::string& dir,
                                        bool want_direct, bool refuse_direct_for_test) {
  SwapFile file;
  file.path = path;
  constexpr int kFlags = O_RDWR | O_CREAT | O_EXCL | O_CLOEXEC;
  if (want_direct) {
    file.fd = refuse_direct_for_test ? (errno = EINVAL, -1)
                                     : ::open(path.c_str(), kFlags | O_DIRECT, 0600);
    if (file.fd >= 0) {
      file.direct = true;
      file.note = "O_DIRECT";
    } else if (errno != EINVAL) {
      return ErrnoError(errno, "cannot create the swap file", path);
    } else {
      absl::StatusOr<std::string> fs = FilesystemName(dir);
      file.note = absl::StrCat("buffered: the filesystem of ", dir, " (", fs.ok() ? *fs : "unknown",
                               ") refuses O_DIRECT");
    }
  } else {
    file.note = "buffered: direct I/O not asked for (aio direct = false)";
  }
  if (!file.direct) {
    file.fd = ::open(path.c_str(), kFlags, 0600);
    if (file.fd < 0) return ErrnoError(errno, "cannot create the swap file", path);
    file.buffered_fd = file.fd;
    return file;
  }
  file.buffered_fd = ::open(path.c_str(), O_RDWR | O_CLOEXEC);
  if (file.buffered_fd < 0) {
    const int err = errno;
    ::close(file.fd);
    ::unlink(path.c_str());
    return ErrnoError(err, "cannot open a second (buffered) descriptor of the swap file", path);
  }
  return file;
}

void CloseSwapFile(SwapFile& file) {
  if (file.buffered_fd >= 0 && file.buffered_fd != file.fd) ::close(file.buffered_fd);
  if (file.fd >= 0) ::close(file.fd);
  file.fd = file.buffered_fd = -1;
}

absl::StatusOr<DiskBandwidth> MeasureDiskBandwidth(const std::string& dir,
                                                   const FileChunkSwapOptions& options,
                                                   int64_t bytes) {
  if (bytes <= 0) {
    return absl::InvalidArgumentError(absl::StrCat("disk probe: ", bytes, " bytes to measure"));
  }
  const int64_t block = options.block_size;
  if (block <= 0 || (options.direct && block % kDirectIoAlignment != 0)) {
    return absl::InvalidArgumentError(
        absl::StrCat("aio.block_size must be positive (and a multiple of ", kDirectIoAlignment,
                     " for direct I/O), got ", block));
  }
  struct stat st = {};
  if (::stat(dir.c_str(), &st) != 0) return ErrnoError(errno, "cannot use the directory", dir);
  ASSIGN_OR_RETURN(OpenedIoEngine engine,
                   OpenIoEngine(IoEngineOptions{
                       .kind = options.engine,
                       .queue_depth = options.queue_depth,
                       .thread_count = options.thread_count,
                       .io_uring_refusal_for_test = options.io_uring_refusal_for_test}));
  // Unique per call: ranks running as threads of one process may probe one directory at once.
  static std::atomic<int64_t> probes{0};
  const std::string path =
      absl::StrCat(dir, "/patrickstar-probe-", ::getpid(), "-", probes.fetch_add(1), ".bin");
  const int cleanup_handle = RegisterFileForSignalCleanup(path);
  absl::Cleanup unregister = [cleanup_handle] { UnregisterFileForSignalCleanup(cleanup_handle); };
  ASSIGN_OR_RETURN(SwapFile file,
                   CreateSwapFile(path, dir, options.direct, options.refuse_direct_for_test));
  absl::Cleanup remove = [&file] {
    CloseSwapFile(file);
    ::unlink(file.path.c_str());
  };
  const int64_t blocks = (bytes + block - 1) / block;
  const int64_t total = blocks * block;
  const int depth = static_cast<int>(std::min<int64_t>(options.queue_depth, blocks));
  if (const int rc = engine.engine->Allocate(file.fd, 0, total); rc != 0) {
    ASSIGN_OR_RETURN(const int64_t free_bytes, FreeDiskBytes(dir));
    return absl::ErrnoToStatus(
        -rc, absl::StrCat("disk probe: cannot allocate ", total, " bytes for '", path, "' (",
                          free_bytes, " bytes free in '", dir, "')"));
  }
  std::unique_ptr<char, FreeDeleter> buffers(static_cast<char*>(
      std::aligned_alloc(kDirectIoAlignment, static_cast<size_t>(depth * block))));
  if (buffers == nullptr) {
    return absl::ResourceExhaustedError(
        absl::StrCat("disk probe: cannot allocate ", depth * block, " bytes of buffers"));
  }
  for (int64_t i = 0; i < depth * block; ++i) {
    buffers.get()[i] = static_cast<char>((i * 131 + 7) & 0xff);
  }
  const int fd = file.direct ? file.fd : file.buffered_fd;

  DiskBandwidth result;
  result.engine = engine.description;
  result.direct = file.direct;
  result.note = file.direct ? file.note
                            : absl::StrCat(file.note,
                                           "; the read bandwidth includes the page cache, not "
                                           "the disk alone");
  int64_t start = NowNs();
  RETURN_IF_ERROR(
      SequentialPass(*engine.engine, fd, path, /*write=*/true, total, block, depth, buffers.get()));
  if (::fdatasync(file.fd) != 0) return ErrnoError(errno, "disk probe: cannot fdatasync", path);
  result.write_bytes_per_s =
      static_cast<double>(total) * 1e9 / static_cast<double>(std::max<int64_t>(1, NowNs() - start));
  start = NowNs();
  RETURN_IF_ERROR(SequentialPass(*engine.engine, fd, path, /*write=*/false, total, block, depth,
                                 buffers.get()));
  result.read_bytes_per_s =
      static_cast<double>(total) * 1e9 / static_cast<double>(std::max<int64_t>(1, NowNs() - start));
  // Latency: a few blocks read alone.
  const int64_t latency_blocks = std::min<int64_t>(blocks, 16);
  start = NowNs();
  RETURN_IF_ERROR(SequentialPass(*engine.engine, fd, path, /*write=*/false, latency_blocks * block,
                                 block, 1, buffers.get()));
  result.block_latency_ns = std::max<int64_t>(1, (NowNs() - start) / latency_blocks);
  return result;
}

}  // namespace ps
