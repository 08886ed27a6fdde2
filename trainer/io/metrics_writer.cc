#include "trainer/io/metrics_writer.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "glog/logging.h"

namespace ps {
namespace {

absl::Status ErrnoError(int err, absl::string_view what, const std::string& path) {
  return absl::ErrnoToStatus(err, absl::StrCat(what, " metrics file '", path, "'"));
}

// Cuts an unterminated last line (left by a crash mid-write) so the file ends with '\n' or is
// empty. Returns the number of bytes removed.
absl::StatusOr<int64_t> TrimTornLastLine(int fd, const std::string& path) {
  struct stat st;
  if (::fstat(fd, &st) != 0) return ErrnoError(errno, "cannot stat", path);
  int64_t end = st.st_size;
  if (end == 0) return 0;
  std::vector<char> block(64 * 1024);
  int64_t keep = 0;  // bytes up to and including the last '\n'
  bool first_block = true;
  for (int64_t pos = end; pos > 0;) {
    const int64_t begin = std::max<int64_t>(0, pos - static_cast<int64_t>(block.size()));
    const size_t len = static_cast<size_t>(pos - begin);
    const ssize_t n = ::pread(fd, block.data(), len, begin);
    if (n < 0) {
      if (errno == EINTR) continue;
      return ErrnoError(errno, "cannot read", path);
    }
    if (static_cast<size_t>(n) != len) {
      return absl::DataLossError(
          absl::StrCat("metrics file '", path, "' changed while being read"));
    }
    if (first_block && block[len - 1] == '\n') return 0;
    first_block = false;
    const char* last = static_cast<const char*>(::memrchr(block.data(), '\n', len));
    if (last != nullptr) {
      keep = begin + (last - block.data()) + 1;
      break;
    }
    pos = begin;
  }
  if (::ftruncate(fd, keep) != 0) return ErrnoError(errno, "cannot truncate", path);
  return end - keep;
}

}  // namespace

absl::StatusOr<std::unique_ptr<MetricsWriter>> MetricsWriter::Open(const std::string& path,
                                                                   MetricsFileMode mode) {
  const int flags = O_CREAT | O_APPEND | O_CLOEXEC |
                    (mode == MetricsFileMode::kTruncate ? O_WRONLY | O_TRUNC : O_RDWR);
  const int fd = ::open(path.c_str(), flags, 0644);
  if (fd < 0) return ErrnoError(errno, "cannot open", path);
  std::unique_ptr<MetricsWriter> writer(new MetricsWriter(path, fd));
  if (mode == MetricsFileMode::kAppend) {
    struct stat st;
    if (::fstat(fd, &st) != 0) return ErrnoError(errno, "cannot stat", path);
    if (S_ISREG(st.st_mode)) {
      absl::StatusOr<int64_t> trimmed = TrimTornLastLine(fd, path);
      if (!trimmed.ok()) return trimmed.status();
      LOG_IF(WARNING, *trimmed > 0)
          << "metrics file '" << path << "' ended in an incomplete line (a "
          << "crash while writing?); removed its " << *trimmed << " bytes before appending";
    }
  }
  return writer;
}

MetricsWriter::~MetricsWriter() {
  const absl::Status status = Close();
  LOG_IF(ERROR, !status.ok()) << status;
}

absl::Status MetricsWriter::Write(const nlohmann::json& record) {
  if (!record.is_object()) {
    return absl::InvalidArgumentError(absl::StrCat(
        "a metrics record must be a JSON object, got ", record.type_name(), ": ",
        record.dump(-1, ' ', false, nlohmann::json::error_handler_t::replace).substr(0, 200)));
  }
  // error_handler_t::replace: invalid UTF-8 becomes U+FFFD instead of throwing.
  std::string line = record.dump(-1, ' ', false, nlohmann::json::error_handler_t::replace);
  line.push_back('\n');
  MutexLock lock(&mu_);
  if (fd_ < 0) {
    return absl::FailedPreconditionError(
        absl::StrCat("metrics file '", path_, "' is closed; cannot write"));
  }
  if (torn_) line.insert(line.begin(), '\n');
  const char* p = line.data();
  size_t left = line.size();
  while (left > 0) {
    const ssize_t n = ::write(fd_, p, left);
    if (n < 0) {
      if (errno == EINTR) continue;
      const int err = errno;
      torn_ = left != line.size() || torn_;
      return ErrnoError(err, "cannot write to", path_);
    }
    p += n;
    left -= static_cast<size_t>(n);
  }
  torn_ = false;
  ++lines_;
  return absl::OkStatus();
}

absl::Status MetricsWriter::Sync() {
  MutexLock lock(&mu_);
  if (fd_ < 0) {
    return absl::FailedPreconditionError(
        absl::StrCat("metrics file '", path_, "' is closed; cannot sync"));
  }
  if (::fsync(fd_) != 0) return ErrnoError(errno, "cannot fsync", path_);
  return absl::OkStatus();
}

absl::Status MetricsWriter::Close() {
  MutexLock lock(&mu_);
  if (fd_ < 0) return absl::OkStatus();
  const int fd = fd_;
  fd_ = -1;
  if (::close(fd) != 0) return ErrnoError(errno, "cannot close", path_);
  return absl::OkStatus();
}

int64_t MetricsWriter::lines_written() const {
  MutexLock lock(&mu_);
  return lines_;
}

}  // namespace ps
