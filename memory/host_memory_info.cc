#include "memory/host_memory_info.h"

#include <algorithm>
#include <cstdint>
#include <fstream>
#include <optional>
#include <sstream>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "absl/strings/string_view.h"
#include "absl/strings/strip.h"
#include "base/units.h"

namespace ps {
namespace {

// A v1 limit at or above this means "no limit" (the kernel reports 2^63 - page size).
constexpr int64_t kUnlimitedV1 = int64_t{1} << 62;

std::optional<std::string> ReadWholeFile(const std::string& path) {
  std::ifstream in(path);
  if (!in) return std::nullopt;
  std::ostringstream os;
  os << in.rdbuf();
  return os.str();
}

// The first integer of a one-value file ("123\n"); nullopt for "max" or anything unreadable.
std::optional<int64_t> ReadInt(const std::string& path) {
  const std::optional<std::string> text = ReadWholeFile(path);
  if (!text.has_value()) return std::nullopt;
  int64_t value = 0;
  if (!absl::SimpleAtoi(absl::StripAsciiWhitespace(*text), &value)) return std::nullopt;
  return value;
}

// "Key:   123 kB" lines of /proc/meminfo and /proc/self/status, in bytes.
std::optional<int64_t> FindKiBField(absl::string_view text, absl::string_view key) {
  for (absl::string_view line : absl::StrSplit(text, '\n')) {
    if (!absl::ConsumePrefix(&line, key) || !absl::ConsumePrefix(&line, ":")) continue;
    line = absl::StripAsciiWhitespace(line);
    const bool kib = absl::ConsumeSuffix(&line, "kB");
    int64_t value = 0;
    if (!absl::SimpleAtoi(absl::StripAsciiWhitespace(line), &value)) return std::nullopt;
    return kib ? value * kKiB : value;
  }
  return std::nullopt;
}

// "/a/b" -> {"/a/b", "/a", "/"}.
std::vector<std::string> SelfAndAncestors(std::string path) {
  std::vector<std::string> out;
  if (path.empty() || path[0] != '/') path = "/" + path;
  while (true) {
    out.push_back(path);
    if (path == "/") break;
    const size_t slash = path.rfind('/');
    path = slash == 0 ? "/" : path.substr(0, slash);
  }
  return out;
}

std::string Join(const std::string& root, const std::string& path) {
  return path == "/" ? root : root + path;
}

}  // namespace

int64_t HostMemoryInfo::available_bytes() const {
  int64_t available = mem_available_bytes;
  if (cgroup_limit_bytes.has_value()) {
    available = std::min(available, *cgroup_limit_bytes - cgroup_usage_bytes.value_or(0));
  }
  return std::max<int64_t>(0, available);
}

std::string HostMemoryInfo::DebugString() const {
  std::string s =
      absl::StrCat(FormatBytes(available_bytes()), " available (MemAvailable ",
                   FormatBytes(mem_available_bytes), " of ", FormatBytes(mem_total_bytes));
  if (cgroup_limit_bytes.has_value()) {
    absl::StrAppend(&s, "; memory cgroup ", cgroup_dir, ": limit ",
                    FormatBytes(*cgroup_limit_bytes), ", ",
                    FormatBytes(cgroup_usage_bytes.value_or(0)), " used");
  }
  absl::StrAppend(&s, "); this process holds ", FormatBytes(process_resident_bytes));
  return s;
}

absl::StatusOr<HostMemoryInfo> ReadHostMemoryInfo(const HostMemoryInfoOptions& options) {
  HostMemoryInfo info;
  const std::string meminfo_path = options.proc_root + "/meminfo";
  const std::optional<std::string> meminfo = ReadWholeFile(meminfo_path);
  if (!meminfo.has_value()) {
    return absl::NotFoundError(
        absl::StrCat("cannot read ", meminfo_path, " to learn how much host memory is available"));
  }
  const std::optional<int64_t> total = FindKiBField(*meminfo, "MemTotal");
  const std::optional<int64_t> available = FindKiBField(*meminfo, "MemAvailable");
  if (!total.has_value() || !available.has_value()) {
    return absl::DataLossError(absl::StrCat(
        meminfo_path, " has no MemTotal or MemAvailable line (a kernel before 3.14?)"));
  }
  info.mem_total_bytes = *total;
  info.mem_available_bytes = *available;

  if (const std::optional<std::string> status = ReadWholeFile(options.proc_root + "/self/status");
      status.has_value()) {
    info.process_resident_bytes = FindKiBField(*status, "VmRSS").value_or(0);
    info.process_peak_resident_bytes = FindKiBField(*status, "VmHWM").value_or(0);
  }

  const std::optional<std::string> cgroups = ReadWholeFile(options.proc_root + "/self/cgroup");
  if (!cgroups.has_value()) return info;
  std::optional<int64_t> best_room;
  auto consider = [&](const std::string& dir, std::optional<int64_t> limit,
                      std::optional<int64_t> usage) {
    if (!limit.has_value()) return;
    const int64_t room = *limit - usage.value_or(0);
    if (!best_room.has_value() || room < *best_room) {
      best_room = room;
      info.cgroup_limit_bytes = limit;
      info.cgroup_usage_bytes = usage.value_or(0);
      info.cgroup_dir = dir;
    }
  };
  for (absl::string_view line : absl::StrSplit(*cgroups, '\n', absl::SkipEmpty())) {
    // "hierarchy-id:controllers:path".
    const std::vector<std::string> parts = absl::StrSplit(line, absl::MaxSplits(':', 2));
    if (parts.size() != 3) continue;
    const bool v2 = parts[0] == "0" && parts[1].empty();
    bool v1_memory = false;
    for (absl::string_view controller : absl::StrSplit(parts[1], ',')) {
      v1_memory |= controller == "memory";
    }
    if (!v2 && !v1_memory) continue;
    const std::string mount = v2 ? options.cgroup_root : options.cgroup_root + "/memory";
    for (const std::string& path : SelfAndAncestors(parts[2])) {
      const std::string dir = Join(mount, path);
      if (v2) {
        // "max" reads as no limit.
        consider(dir, ReadInt(dir + "/memory.max"), ReadInt(dir + "/memory.current"));
      } else {
        std::optional<int64_t> limit = ReadInt(dir + "/memory.limit_in_bytes");
        if (limit.has_value() && *limit >= kUnlimitedV1) limit.reset();
        consider(dir, limit, ReadInt(dir + "/memory.usage_in_bytes"));
      }
    }
  }
  return info;
}

}  // namespace ps
