// TraceWriter: a Chrome trace-event profile, written as the run goes, that Perfetto
// (ui.perfetto.dev) and chrome://tracing open.
//
// Format: the "JSON Array Format" of the Trace Event Format specification
// (https://docs.google.com/document/d/1CvAClvFfyA5R-PhYUmn5OOQtYMH4h6I0nSsKchNAySU): the file is
// `[` followed by one event object per line, separated by commas, and `]` on Close(). Both viewers
// accept the array without its closing `]`, so a run that is killed leaves a loadable trace holding
// every event up to the last flush; appending `]` makes it strict JSON.
//
// What is written:
//   - process_name metadata ("M") for the writer's pid, at creation;
//   - per track (Track()): thread_name and thread_sort_index metadata; a track is a "thread" row;
//   - Complete(): "X" events (a box with a start and a duration) on a track;
//   - Counter(): "C" events; each series becomes a counter track drawn as a filled area over time
//     (the trainer draws accelerator model-data and non-model bytes — the tide — this way);
//   - Instant(): "i" events (a tick on a track, a line across the process, or across everything);
//   - MarkRegion(): a box on a "regions" track at the top, plus global instant lines at its start
//     and end, so a phase such as the warm-up iteration stands out across all tracks.
// Timestamps are given in nanoseconds of the writer's clock and written in microseconds (the
// format's unit) relative to the writer's creation, with three decimals: exact to the nanosecond.
//
// Buffering: events go to an in-memory buffer that is written to the file every
// `flush_every_events` events, when `flush_interval_ms` has passed since the last write (checked
// when an event arrives), on Flush() and on Close(). A crash loses at most the buffered events.
//
// Errors: the first I/O error is remembered; from then on events are dropped (no memory growth)
// and Flush() and Close() return that error. Events emitted after Close() are dropped.
//
// Disabled tracing costs ~nothing: callers hold a `TraceWriter*` that may be null, or a writer from
// CreateDisabled(). Every emitting method starts with an inline `enabled()` test, and ScopedSpan
// and ScopedRegion accept a null writer, in which case they do not even read the clock.
//
// Thread safety: all methods are thread-safe (ps::Mutex inside); events are formatted outside the
// lock. The injected clock must be thread-safe.
#ifndef PATRICKSTAR_TRAINER_IO_TRACE_WRITER_H_
#define PATRICKSTAR_TRAINER_IO_TRACE_WRITER_H_

#include <concepts>
#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <string_view>
#include <type_traits>

#include "absl/base/thread_annotations.h"
#include "absl/container/flat_hash_map.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "absl/types/span.h"
#include "base/mutex.h"

namespace ps {

namespace trace_internal {
template <typename T>
concept NonBoolIntegral = std::is_integral_v<T> && !std::is_same_v<T, bool>;
template <typename T>
concept NonBoolArithmetic = std::is_arithmetic_v<T> && !std::is_same_v<T, bool>;
}  // namespace trace_internal

// A track (a row in the viewer; the format's "tid"). Ids are small positive integers.
using TrackId = int;

// One entry of an event's "args" object: a key and a number, bool or string. Strings are copied
// into the event when it is emitted, so temporaries are fine:
//   trace->Complete(track, "load", "chunk", t0, dt, {{"chunk", 17}, {"bytes", n}, {"to", "gpu"}});
class TraceArg {
 public:
  enum class Kind { kInt, kUint, kDouble, kBool, kString };

  template <trace_internal::NonBoolIntegral T>
  TraceArg(absl::string_view key, T value) : key_(key) {
    if constexpr (std::is_signed_v<T>) {
      kind_ = Kind::kInt;
      int_ = value;
    } else {
      kind_ = Kind::kUint;
      uint_ = value;
    }
  }
  template <std::floating_point T>
  TraceArg(absl::string_view key, T value)
      : key_(key), kind_(Kind::kDouble), double_(static_cast<double>(value)) {}
  TraceArg(absl::string_view key, bool value) : key_(key), kind_(Kind::kBool), bool_(value) {}
  TraceArg(absl::string_view key, absl::string_view value)
      : key_(key), kind_(Kind::kString), string_(value) {}
  TraceArg(absl::string_view key, const char* value)
      : TraceArg(key, absl::string_view(value == nullptr ? "" : value)) {}
  TraceArg(absl::string_view key, const std::string& value)
      : TraceArg(key, absl::string_view(value)) {}
  // (Debian's Abseil has its own string_view type, distinct from std::string_view.)
  TraceArg(absl::string_view key, std::string_view value)
      : TraceArg(key, absl::string_view(value.data(), value.size())) {}

  // Appends `"key":value` (valid JSON for every input; see internal/json_string.h).
  void AppendTo(std::string* out) const;

 private:
  absl::string_view key_;
  Kind kind_;
  int64_t int_ = 0;
  uint64_t uint_ = 0;
  double double_ = 0;
  bool bool_ = false;
  absl::string_view string_;
};

// One series of a counter event: `{"model_data", bytes}`. Integers are written exactly.
class CounterValue {
 public:
  template <trace_internal::NonBoolArithmetic T>
  CounterValue(absl::string_view series, T value) : series_(series) {
    if constexpr (std::is_integral_v<T>) {
      if (std::is_unsigned_v<T> && static_cast<uint64_t>(value) > uint64_t{INT64_MAX}) {
        double_ = static_cast<double>(value);  // beyond int64: nearest double
      } else {
        is_int_ = true;
        int_ = static_cast<int64_t>(value);
      }
    } else {
      double_ = static_cast<double>(value);
    }
  }
  void AppendTo(std::string* out) const;

 private:
  absl::string_view series_;
  bool is_int_ = false;
  int64_t int_ = 0;
  double double_ = 0;
};

// Where an instant event is drawn: on its track, across its process, or across the whole trace.
enum class InstantScope { kThread, kProcess, kGlobal };

struct TraceWriterOptions {
  // The name shown for this process, and its "pid" (use the rank in multi-process runs so traces
  // of several ranks can be concatenated).
  std::string process_name = "patrickstar_cc";
  int pid = 0;
  // The time source in nanoseconds; timestamps passed to the writer must come from it.
  // Default (empty): the steady clock (base/clock.h), which is also the ChunkManager's default:
  // the trainer's profiler writes the manager's chunk-event timestamps here.
  std::function<int64_t()> clock_ns;
  // Write the buffer after this many events, or when this long has passed since the last write.
  // REQUIRES: flush_every_events >= 1, flush_interval_ms >= 0.
  int flush_every_events = 1024;
  int64_t flush_interval_ms = 1000;
};

class TraceWriter {
 public:
  // Creates (truncates) `path` and writes the header and the process_name event to it right away,
  // so an error (a missing directory, a full disk) shows here, with the errno's canonical code.
  // InvalidArgument for bad options.
  static absl::StatusOr<std::unique_ptr<TraceWriter>> Create(const std::string& path,
                                                             TraceWriterOptions options = {});

  // A writer that writes nothing: every method returns at once, Flush()/Close() return OK.
  static std::unique_ptr<TraceWriter> CreateDisabled();

  TraceWriter(const TraceWriter&) = delete;
  TraceWriter& operator=(const TraceWriter&) = delete;

  // Closes the file if Close() was not called; an error is then logged (call Close() to see it).
  ~TraceWriter();

  bool enabled() const { return enabled_; }

  // The writer's clock, in nanoseconds.
  int64_t NowNs() const { return clock_ns_(); }

  // The track named `name`, created (with its metadata events) on first use; later calls with the
  // same name return the same id. On a disabled writer returns 0.
  TrackId Track(absl::string_view name);

  // A box on `track` from `start_ns` lasting `duration_ns` (negative durations are written as 0).
  // `category` may be empty (it is omitted then).
  void Complete(TrackId track, absl::string_view name, absl::string_view category, int64_t start_ns,
                int64_t duration_ns, absl::Span<const TraceArg> args = {}) {
    if (enabled_) CompleteImpl(track, name, category, start_ns, duration_ns, ArgsJson(args));
  }

  // Counter samples at `ts_ns`: each value becomes a series of the counter track `name`. A series
  // keeps its value until its next sample.
  void Counter(absl::string_view name, int64_t ts_ns, absl::Span<const CounterValue> values) {
    if (enabled_) CounterImpl(name, ts_ns, values);
  }

  // A point event.
  void Instant(TrackId track, absl::string_view name, int64_t ts_ns,
               InstantScope scope = InstantScope::kThread, absl::Span<const TraceArg> args = {}) {
    if (enabled_) InstantImpl(track, name, ts_ns, scope, args);
  }

  // Marks a phase of the run (e.g. "warm-up iteration") so it is visible in every view: a box on
  // the "regions" track (the top row) and global instant lines "<name> begin" and "<name> end".
  void MarkRegion(absl::string_view name, int64_t start_ns, int64_t duration_ns,
                  absl::Span<const TraceArg> args = {}) {
    if (enabled_) MarkRegionImpl(name, start_ns, duration_ns, ArgsJson(args));
  }

  // Writes buffered events to the file (no fsync). Returns the first I/O error of this writer.
  [[nodiscard]] absl::Status Flush();

  // Writes buffered events and the closing `]`, and closes the file. Returns the first I/O error
  // of this writer (also from earlier flushes). Later calls return the same status.
  [[nodiscard]] absl::Status Close();

  // Events accepted so far (metadata included; dropped ones not).
  int64_t events() const;

  // Internal, for ScopedSpan/ScopedRegion: the same as Complete/MarkRegion with the args already
  // serialized as `"k":v,...` (no braces).
  void CompleteImpl(TrackId track, absl::string_view name, absl::string_view category,
                    int64_t start_ns, int64_t duration_ns, absl::string_view args_json);
  void MarkRegionImpl(absl::string_view name, int64_t start_ns, int64_t duration_ns,
                      absl::string_view args_json);
  static std::string ArgsJson(absl::Span<const TraceArg> args);

 private:
  TraceWriter(bool enabled, int fd, std::string path, TraceWriterOptions options);

  void CounterImpl(absl::string_view name, int64_t ts_ns, absl::Span<const CounterValue> values);
  void InstantImpl(TrackId track, absl::string_view name, int64_t ts_ns, InstantScope scope,
                   absl::Span<const TraceArg> args);
  // Appends the common prefix `{"name":...,"ph":"X","ts":...` of an event.
  void AppendEventStart(std::string* out, absl::string_view name, char phase, int64_t ts_ns) const;
  // Appends one serialized event (an object, no separator) and flushes if due.
  void Emit(absl::string_view event) ABSL_LOCKS_EXCLUDED(mu_);
  TrackId TrackLocked(absl::string_view name) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  void AppendLocked(absl::string_view event) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  void WriteBufferLocked() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);

  const bool enabled_;
  const std::string path_;
  const TraceWriterOptions options_;
  const std::function<int64_t()> clock_ns_;
  const int64_t start_ns_;  // written timestamps are relative to this

  mutable Mutex mu_;
  int fd_ ABSL_GUARDED_BY(mu_);
  bool closed_ ABSL_GUARDED_BY(mu_) = false;
  absl::Status status_ ABSL_GUARDED_BY(mu_);
  std::string buffer_ ABSL_GUARDED_BY(mu_);
  int buffered_events_ ABSL_GUARDED_BY(mu_) = 0;
  int64_t last_write_ns_ ABSL_GUARDED_BY(mu_) = 0;
  int64_t events_ ABSL_GUARDED_BY(mu_) = 0;
  absl::flat_hash_map<std::string, TrackId> tracks_ ABSL_GUARDED_BY(mu_);
  TrackId region_track_ ABSL_GUARDED_BY(mu_) = 0;
};

// Times a scope on `track`: the box starts at construction and ends at destruction (or End()).
// `writer` may be null or disabled: then nothing happens and the clock is not read.
//   { ScopedSpan span(trace, compute_track, "forward", "model"); ... span.AddArg("tokens", n); }
class ScopedSpan {
 public:
  ScopedSpan(TraceWriter* writer, TrackId track, absl::string_view name,
             absl::string_view category = {}, absl::Span<const TraceArg> args = {});
  ~ScopedSpan() { End(); }
  ScopedSpan(const ScopedSpan&) = delete;
  ScopedSpan& operator=(const ScopedSpan&) = delete;

  // Adds an argument to the event (e.g. a result known only at the end).
  void AddArg(const TraceArg& arg);
  // Ends the span now; later calls and the destructor do nothing.
  void End();

 private:
  TraceWriter* writer_;  // null when disabled or ended
  TrackId track_ = 0;
  int64_t start_ns_ = 0;
  std::string name_;
  std::string category_;
  std::string args_json_;
};

// Like ScopedSpan, for MarkRegion: `{ ScopedRegion warmup(trace, "warm-up iteration"); ... }`.
class ScopedRegion {
 public:
  ScopedRegion(TraceWriter* writer, absl::string_view name);
  ~ScopedRegion() { End(); }
  ScopedRegion(const ScopedRegion&) = delete;
  ScopedRegion& operator=(const ScopedRegion&) = delete;
  void End();

 private:
  TraceWriter* writer_;
  int64_t start_ns_ = 0;
  std::string name_;
};

}  // namespace ps

#endif  // PATRICKSTAR_TRAINER_IO_TRACE_WRITER_H_
