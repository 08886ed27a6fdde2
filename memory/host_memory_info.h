// Host memory the operating system can really give this process, read before a run allocates, so
// that a run the OS out-of-memory killer would end is refused instead (scheduler/memory_plan.h).
//
// Two limits apply on Linux and the tighter one wins:
//  - the machine: /proc/meminfo's MemAvailable (free memory plus what the kernel can reclaim
//    without swapping: clean page cache, reclaimable slab) — what a new allocation can get;
//  - the process's memory cgroup: the limit minus the usage, for the cgroup this process is in
//    and each ancestor up to the hierarchy's root (v2: memory.max / memory.current; v1:
//    memory.limit_in_bytes / memory.usage_in_bytes, where a limit of 2^62 or more means none).
//    A container's cgroup namespace may show the process at "/" although /proc/self/cgroup names
//    a deeper path; paths that do not exist under the mount are skipped.
// Also read: the process's own resident set (/proc/self/status VmRSS) and its peak (VmHWM),
// because memory already resident is not counted again in MemAvailable.
//
// Every path is injectable (HostMemoryInfoOptions), so tests give fake /proc and /sys trees.
//
// Thread safety: pure functions of the files they read.
#ifndef PATRICKSTAR_MEMORY_HOST_MEMORY_INFO_H_
#define PATRICKSTAR_MEMORY_HOST_MEMORY_INFO_H_

#include <cstdint>
#include <optional>
#include <string>

#include "absl/status/statusor.h"

namespace ps {

struct HostMemoryInfoOptions {
  // Where /proc/meminfo, /proc/self/cgroup and /proc/self/status are read.
  std::string proc_root = "/proc";
  // The cgroup mount point: v2 files directly under it (cgroup_root + path), v1 memory files
  // under cgroup_root + "/memory" + path.
  std::string cgroup_root = "/sys/fs/cgroup";
};

struct HostMemoryInfo {
  // /proc/meminfo.
  int64_t mem_total_bytes = 0;
  int64_t mem_available_bytes = 0;
  // The tightest memory cgroup (the least limit - usage over the process's cgroup and its
  // ancestors), if any has a limit; its directory for messages.
  std::optional<int64_t> cgroup_limit_bytes;
  std::optional<int64_t> cgroup_usage_bytes;
  std::string cgroup_dir;
  // /proc/self/status (0 when unreadable).
  int64_t process_resident_bytes = 0;
  int64_t process_peak_resident_bytes = 0;

  // What a new allocation of this process can still get: MemAvailable, or the cgroup's limit -
  // usage when that is less (never negative).
  int64_t available_bytes() const;
  // "21.3 GiB available (MemAvailable; cgroup /a/b: 30 GiB limit, 4 GiB used); this process
  // holds 120 MiB".
  std::string DebugString() const;
};

// Reads the files above. NotFound / DataLoss naming the file when /proc/meminfo is missing or has
// no MemAvailable; a missing or unreadable cgroup or status file is not an error (no cgroup limit,
// zero resident bytes).
absl::StatusOr<HostMemoryInfo> ReadHostMemoryInfo(const HostMemoryInfoOptions& options = {});

}  // namespace ps

#endif  // PATRICKSTAR_MEMORY_HOST_MEMORY_INFO_H_
