#include "trainer/io/trace_writer.h"

#include <fcntl.h>
#include <unistd.h>

#include <cerrno>
#include <utility>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "base/clock.h"
#include "glog/logging.h"
#include "trainer/io/internal/json_string.h"

namespace ps {

using io_internal::AppendJsonDouble;
using io_internal::AppendJsonInt;
using io_internal::AppendJsonString;
using io_internal::AppendJsonUint;
using io_internal::AppendMicrosFromNanos;

namespace {

// The name of the track MarkRegion draws on; it is sorted above every other track.
constexpr absl::string_view kRegionTrackName = "regions";

std::function<int64_t()> ClockOrDefault(std::function<int64_t()> clock) {
  if (clock) return clock;
  return kSteadyClock.now_ns;
}

}  // namespace

void TraceArg::AppendTo(std::string* out) const {
  AppendJsonString(out, key_);
  out->push_back(':');
  switch (kind_) {
    case Kind::kInt:
      AppendJsonInt(out, int_);
      break;
    case Kind::kUint:
      AppendJsonUint(out, uint_);
      break;
    case Kind::kDouble:
      AppendJsonDouble(out, double_);
      break;
    case Kind::kBool:
      out->append(bool_ ? "true" : "false");
      break;
    case Kind::kString:
      AppendJsonString(out, string_);
      break;
  }
}

void CounterValue::AppendTo(std::string* out) const {
  AppendJsonString(out, series_);
  out->push_back(':');
  if (is_int_) {
    AppendJsonInt(out, int_);
  } else {
    AppendJsonDouble(out, double_);
  }
}

absl::StatusOr<std::unique_ptr<TraceWriter>> TraceWriter::Create(const std::string& path,
                                                                 TraceWriterOptions options) {
  if (options.flush_every_events < 1) {
    return absl::InvalidArgumentError(absl::StrCat(
        "TraceWriterOptions.flush_every_events must be >= 1, got ", options.flush_every_events));
  }
  if (options.flush_interval_ms < 0) {
    return absl::InvalidArgumentError(absl::StrCat(
        "TraceWriterOptions.flush_interval_ms must be >= 0, got ", options.flush_interval_ms));
  }
  const int fd = ::open(path.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
  if (fd < 0) {
    return absl::ErrnoToStatus(errno, absl::StrCat("cannot create trace file '", path, "'"));
  }
  std::unique_ptr<TraceWriter> writer(new TraceWriter(true, fd, path, std::move(options)));
  // The header goes out at once: errors show here, and even an empty run leaves a loadable file.
  absl::Status status = writer->Flush();
  if (!status.ok()) {
    (void)writer->Close();
    return status;
  }
  return writer;
}

std::unique_ptr<TraceWriter> TraceWriter::CreateDisabled() {
  return std::unique_ptr<TraceWriter>(new TraceWriter(false, -1, "", TraceWriterOptions()));
}

TraceWriter::TraceWriter(bool enabled, int fd, std::string path, TraceWriterOptions options)
    : enabled_(enabled),
      path_(std::move(path)),
      options_(std::move(options)),
      clock_ns_(ClockOrDefault(options_.clock_ns)),
      start_ns_(clock_ns_()),
      fd_(fd) {
  MutexLock lock(&mu_);
  last_write_ns_ = start_ns_;
  if (!enabled_) {
    closed_ = true;
    return;
  }
  buffer_ = "[\n";
  std::string event = "{\"name\":\"process_name\",\"ph\":\"M\",\"pid\":";
  AppendJsonInt(&event, options_.pid);
  event.append(",\"tid\":0,\"args\":{\"name\":");
  AppendJsonString(&event, options_.process_name);
  event.append("}}");
  AppendLocked(event);
}

TraceWriter::~TraceWriter() {
  if (!enabled_) return;
  const absl::Status status = Close();
  LOG_IF(ERROR, !status.ok()) << "trace file '" << path_ << "' may be incomplete: " << status;
}

void TraceWriter::AppendEventStart(std::string* out, absl::string_view name, char phase,
                                   int64_t ts_ns) const {
  out->append("{\"name\":");
  AppendJsonString(out, name);
  out->append(",\"ph\":\"");
  out->push_back(phase);
  out->append("\",\"ts\":");
  // Modular subtraction: a timestamp far from the start cannot overflow.
  AppendMicrosFromNanos(
      out, static_cast<int64_t>(static_cast<uint64_t>(ts_ns) - static_cast<uint64_t>(start_ns_)));
  out->append(",\"pid\":");
  AppendJsonInt(out, options_.pid);
}

std::string TraceWriter::ArgsJson(absl::Span<const TraceArg> args) {
  std::string json;
  for (size_t i = 0; i < args.size(); ++i) {
    if (i > 0) json.push_back(',');
    args[i].AppendTo(&json);
  }
  return json;
}

TrackId TraceWriter::Track(absl::string_view name) {
  if (!enabled_) return 0;
  MutexLock lock(&mu_);
  return TrackLocked(name);
}

TrackId TraceWriter::TrackLocked(absl::string_view name) {
  auto it = tracks_.find(name);
  if (it != tracks_.end()) return it->second;
  const TrackId id = static_cast<TrackId>(tracks_.size()) + 1;
  tracks_.emplace(std::string(name), id);
  // The regions track sorts first; the others in creation order.
  const int sort_index = name == kRegionTrackName ? -1 : id;
  for (int k = 0; k < 2; ++k) {
    std::string event = k == 0 ? "{\"name\":\"thread_name\"" : "{\"name\":\"thread_sort_index\"";
    event.append(",\"ph\":\"M\",\"pid\":");
    AppendJsonInt(&event, options_.pid);
    event.append(",\"tid\":");
    AppendJsonInt(&event, id);
    if (k == 0) {
      event.append(",\"args\":{\"name\":");
      AppendJsonString(&event, name);
    } else {
      event.append(",\"args\":{\"sort_index\":");
      AppendJsonInt(&event, sort_index);
    }
    event.append("}}");
    AppendLocked(event);
  }
  return id;
}

void TraceWriter::CompleteImpl(TrackId track, absl::string_view name, absl::string_view category,
                               int64_t start_ns, int64_t duration_ns, absl::string_view args_json) {
  std::string event;
  event.reserve(128 + name.size() + args_json.size());
  AppendEventStart(&event, name, 'X', start_ns);
  event.append(",\"tid\":");
  AppendJsonInt(&event, track);
  event.append(",\"dur\":");
  AppendMicrosFromNanos(&event, duration_ns < 0 ? 0 : duration_ns);
  if (!category.empty()) {
    event.append(",\"cat\":");
    AppendJsonString(&event, category);
  }
  if (!args_json.empty()) {
    event.append(",\"args\":{");
    event.append(args_json.data(), args_json.size());
    event.push_back('}');
  }
  event.push_back('}');
  Emit(event);
}

void TraceWriter::CounterImpl(absl::string_view name, int64_t ts_ns,
                              absl::Span<const CounterValue> values) {
  std::string event;
  AppendEventStart(&event, name, 'C', ts_ns);
  event.append(",\"tid\":0,\"args\":{");
  for (size_t i = 0; i < values.size(); ++i) {
    if (i > 0) event.push_back(',');
    values[i].AppendTo(&event);
  }
  event.append("}}");
  Emit(event);
}

void TraceWriter::InstantImpl(TrackId track, absl::string_view name, int64_t ts_ns,
                              InstantScope scope, absl::Span<const TraceArg> args) {
  std::string event;
  AppendEventStart(&event, name, 'i', ts_ns);
  event.append(",\"tid\":");
  AppendJsonInt(&event, track);
  event.append(scope == InstantScope::kThread    ? ",\"s\":\"t\""
               : scope == InstantScope::kProcess ? ",\"s\":\"p\""
                                                 : ",\"s\":\"g\"");
  if (!args.empty()) {
    event.append(",\"args\":{");
    event.append(ArgsJson(args));
    event.push_back('}');
  }
  event.push_back('}');
  Emit(event);
}

void TraceWriter::MarkRegionImpl(absl::string_view name, int64_t start_ns, int64_t duration_ns,
                                 absl::string_view args_json) {
  TrackId track;
  {
    MutexLock lock(&mu_);
    track = TrackLocked(kRegionTrackName);
  }
  CompleteImpl(track, name, "region", start_ns, duration_ns, args_json);
  InstantImpl(track, absl::StrCat(name, " begin"), start_ns, InstantScope::kGlobal, {});
  InstantImpl(track, absl::StrCat(name, " end"), start_ns + (duration_ns < 0 ? 0 : duration_ns),
              InstantScope::kGlobal, {});
}

void TraceWriter::Emit(absl::string_view event) {
  const int64_t now_ns = clock_ns_();
  MutexLock lock(&mu_);
  if (closed_ || !status_.ok()) return;
  AppendLocked(event);
  if (buffered_events_ >= options_.flush_every_events ||
      now_ns - last_write_ns_ >= options_.flush_interval_ms * 1000000) {
    last_write_ns_ = now_ns;
    WriteBufferLocked();
  }
}

void TraceWriter::AppendLocked(absl::string_view event) {
  if (events_ > 0) buffer_.append(",\n");
  buffer_.append(event.data(), event.size());
  ++events_;
  ++buffered_events_;
}

void TraceWriter::WriteBufferLocked() {
  const char* p = buffer_.data();
  size_t left = buffer_.size();
  while (left > 0 && status_.ok()) {
    const ssize_t n = ::write(fd_, p, left);
    if (n < 0) {
      if (errno == EINTR) continue;
      status_ = absl::ErrnoToStatus(errno, absl::StrCat("cannot write trace file '", path_, "'"));
      break;
    }
    p += n;
    left -= static_cast<size_t>(n);
  }
  buffer_.clear();
  buffered_events_ = 0;
}

absl::Status TraceWriter::Flush() {
  if (!enabled_) return absl::OkStatus();
  MutexLock lock(&mu_);
  if (!closed_ && status_.ok()) WriteBufferLocked();
  return status_;
}

absl::Status TraceWriter::Close() {
  if (!enabled_) return absl::OkStatus();
  MutexLock lock(&mu_);
  if (closed_) return status_;
  closed_ = true;
  if (status_.ok()) {
    buffer_.append("\n]\n");
    WriteBufferLocked();
  }
  if (::close(fd_) != 0 && status_.ok()) {
    status_ = absl::ErrnoToStatus(errno, absl::StrCat("cannot close trace file '", path_, "'"));
  }
  fd_ = -1;
  return status_;
}

int64_t TraceWriter::events() const {
  MutexLock lock(&mu_);
  return events_;
}

ScopedSpan::ScopedSpan(TraceWriter* writer, TrackId track, absl::string_view name,
                       absl::string_view category, absl::Span<const TraceArg> args)
    : writer_(writer != nullptr && writer->enabled() ? writer : nullptr) {
  if (writer_ == nullptr) return;
  track_ = track;
  name_ = std::string(name);
  category_ = std::string(category);
  args_json_ = TraceWriter::ArgsJson(args);
  start_ns_ = writer_->NowNs();
}

void ScopedSpan::AddArg(const TraceArg& arg) {
  if (writer_ == nullptr) return;
  if (!args_json_.empty()) args_json_.push_back(',');
  arg.AppendTo(&args_json_);
}

void ScopedSpan::End() {
  if (writer_ == nullptr) return;
  TraceWriter* const writer = std::exchange(writer_, nullptr);
  writer->CompleteImpl(track_, name_, category_, start_ns_, writer->NowNs() - start_ns_,
                       args_json_);
}

ScopedRegion::ScopedRegion(TraceWriter* writer, absl::string_view name)
    : writer_(writer != nullptr && writer->enabled() ? writer : nullptr) {
  if (writer_ == nullptr) return;
  name_ = std::string(name);
  start_ns_ = writer_->NowNs();
}

void ScopedRegion::End() {
  if (writer_ == nullptr) return;
  TraceWriter* const writer = std::exchange(writer_, nullptr);
  writer->MarkRegionImpl(name_, start_ns_, writer->NowNs() - start_ns_, {});
}

}  // namespace ps
