// MetricsWriter: training metrics as JSON Lines (https://jsonlines.org): one JSON object per line,
// one line per Write().
//
//   ASSIGN_OR_RETURN(auto metrics, MetricsWriter::Open(path, MetricsFileMode::kTruncate));
//   RETURN_IF_ERROR(metrics->Write({{"step", step}, {"loss", loss}, {"lr", lr}}));
//
// Durability: each line goes to the file in a single write() (O_APPEND) when Write() returns, so
// `tail -f` sees it at once and a crashed process loses at most the line being written (no user-
// space buffer). Lines reach the disk itself on the kernel's schedule; Sync() forces it.
//
// Resume: kAppend keeps the existing lines. A file whose last line is unterminated (a crash in the
// middle of a write) is first cut back to its last complete line, with a warning, so every line of
// the file stays a JSON object. Which lines a resumed run should discard (steps after the
// checkpoint it resumes from) is the caller's policy, not this class's.
//
// Values: strings with invalid UTF-8 are written with U+FFFD in place of the bad bytes; NaN and
// infinities are written as null (JSON has no such numbers).
//
// Errors: every failure is a Status naming the file, with the errno's canonical code (a full disk
// is ResourceExhausted). A line left incomplete by a failed write is terminated before the next
// one.
//
// Thread safety: all methods are thread-safe; lines from concurrent Write() calls never interleave.
#ifndef PATRICKSTAR_TRAINER_IO_METRICS_WRITER_H_
#define PATRICKSTAR_TRAINER_IO_METRICS_WRITER_H_

#include <cstdint>
#include <memory>
#include <string>

#include "absl/base/thread_annotations.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "base/mutex.h"
#include "nlohmann/json.hpp"

namespace ps {

enum class MetricsFileMode {
  kTruncate,  // start a new file (an existing one is emptied)
  kAppend,    // keep the existing lines (resume); the file is created if missing
};

class MetricsWriter {
 public:
  // Opens (creating if needed) `path`.
  static absl::StatusOr<std::unique_ptr<MetricsWriter>> Open(const std::string& path,
                                                             MetricsFileMode mode);

  MetricsWriter(const MetricsWriter&) = delete;
  MetricsWriter& operator=(const MetricsWriter&) = delete;
  ~MetricsWriter();  // closes; an error then is logged

  // Writes `record` as one line. InvalidArgument unless `record` is a JSON object.
  [[nodiscard]] absl::Status Write(const nlohmann::json& record);

  // fsync()s the file.
  [[nodiscard]] absl::Status Sync();

  // Closes the file; later Write()/Sync() calls are FailedPrecondition. Idempotent.
  [[nodiscard]] absl::Status Close();

  const std::string& path() const { return path_; }
  int64_t lines_written() const;

 private:
  MetricsWriter(std::string path, int fd) : path_(std::move(path)), fd_(fd) {}

  const std::string path_;
  mutable Mutex mu_;
  int fd_ ABSL_GUARDED_BY(mu_);
  bool torn_ ABSL_GUARDED_BY(mu_) = false;  // the last write stopped mid-line
  int64_t lines_ ABSL_GUARDED_BY(mu_) = 0;
};

}  // namespace ps

#endif  // PATRICKSTAR_TRAINER_IO_METRICS_WRITER_H_
