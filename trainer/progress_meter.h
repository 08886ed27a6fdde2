// ProgressMeter: what the training run's console shows while a long phase runs (seeded
// initialization, loading or quantizing a checkpoint, measuring the disk) and between the steps,
// so that a person watching a terminal or a log sees that the run is alive, what it does, how far
// it is, and when it will be done (issue #38: a 7B run used to print nothing for minutes, and
// nothing at all into a `tee`d log until it exited).
//
// A phase: Begin(label) prints "<label> ..." at once (flushed); the work reports (done, total)
// through Fn() (a ProgressFn, base/progress.h, the one way model/ and memory/ report progress);
// End() prints how long the phase took and returns it. Two kinds of output, chosen by the caller
// (train.cc: isatty(stdout)):
//   - a terminal: one line rewritten in place ("\r", then ESC[K to clear to the end of the line)
//     with the percentage, the amount done of the total, the rate and the time left, redrawn at
//     most every terminal_interval_ns; End() leaves it as a plain line "<label> ... done in S s".
//   - anything else (a log, a pipe, CI): whole lines only, each flushed, never "\r"; at most one
//     progress line per plain_interval_ns (10 s) per phase, besides the begin and end: a phase
//     shorter than that prints one line, "<label> ... done in 400 ms" (the begin line is written
//     and flushed unterminated, and End() completes it when nothing came between).
// Status(): the steps' self-rewriting line on a terminal (step, loss, tokens/s, ETA); nothing in
// plain output, where the caller prints its own lines. Print(): any other line, through the meter
// so that a status line is cleared first.
//
// Awkward reports are shown, never trusted: total <= 0 shows only the elapsed time, done is
// clamped into [0, total], arithmetic is in double (no overflow at INT64_MAX).
//
// Thread safety: thread-safe (one mutex): Fn()'s callback may be called from the phase's worker
// threads; the output goes to `out` under the lock. The caller must not write to `out` itself
// while a phase runs or a status line shows (use Print).
#ifndef PATRICKSTAR_TRAINER_PROGRESS_METER_H_
#define PATRICKSTAR_TRAINER_PROGRESS_METER_H_

#include <cstdint>
#include <optional>
#include <ostream>
#include <string>

#include "absl/base/thread_annotations.h"
#include "absl/strings/string_view.h"
#include "base/clock.h"
#include "base/mutex.h"
#include "base/progress.h"

namespace ps {

// The unit a phase's (done, total) counts.
enum class ProgressUnit {
  kBytes,     // shown as FormatBytes ("1.20 GiB")
  kElements,  // shown as a count ("540.0M elements")
};

struct ProgressMeterOptions {
  // Whether the output is a terminal: a line rewritten in place; otherwise plain lines.
  bool is_terminal = false;
  // The clock of the phases' durations, rates and rate limits.
  MonotonicClock clock = kSteadyClock;
  // Plain output: at most one progress line per phase per this interval (besides begin and end).
  int64_t plain_interval_ns = 10'000'000'000;
  // Terminal: the progress line is redrawn at most this often.
  int64_t terminal_interval_ns = 200'000'000;
};

class ProgressMeter {
 public:
  // `out` may be null: nothing is printed and phases are still timed. Not owned; must outlive the
  // meter.
  explicit ProgressMeter(std::ostream* out, ProgressMeterOptions options = {});
  // Clears a status line left showing (nothing else is printed).
  ~ProgressMeter();
  ProgressMeter(const ProgressMeter&) = delete;
  ProgressMeter& operator=(const ProgressMeter&) = delete;

  // Starts phase `label` (what the run does now, e.g. "initializing 1.24B parameters from seed
  // 42"): clears a status line, prints "<label> ..." and flushes. A phase still running is ended
  // first (End()).
  void Begin(absl::string_view label, ProgressUnit unit = ProgressUnit::kElements);
  // The running phase has done `done` of `total` units. Prints as the file comment says (rate
  // limited). Ignored when no phase runs.
  void Update(int64_t done, int64_t total);
  // Update() as a ProgressFn. Valid while the meter lives.
  ProgressFn Fn();
  // Ends the running phase: prints "<label> ... done in S s", with the amount and its rate when
  // the phase reported a total, then `note` (e.g. ", quantized 224 weights"), and a newline;
  // flushes. Returns the phase's seconds (0 when no phase runs).
  double End(absl::string_view note = "");
  // Ends the running phase as failed: "<label> ... failed after S s" (the caller reports why).
  // Returns its seconds.
  double Fail();
  // Terminal only: shows `line` as the rewritten status line (replacing the previous one), and
  // flushes. Plain output: nothing. Ignored while a phase runs.
  void Status(absl::string_view line);
  // Removes the status line, if one shows.
  void ClearStatus();
  // Writes `text` (whole lines, ending in '\n') after clearing a status line, and flushes. Not
  // while a phase runs (the phase is ended first).
  void Print(absl::string_view text);

  bool is_terminal() const { return options_.is_terminal; }
  bool running() const;

 private:
  // The progress part of a line: "45% (540.0M of 1.20B elements), 120.0M elements/s, 5 s left".
  std::string ProgressText(int64_t now_ns) const ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  double EndLocked(absl::string_view note, bool failed) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  void ClearStatusLocked() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Writes `text` to out_ (if any) and flushes.
  void Write(absl::string_view text) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);

  std::ostream* const out_;
  const ProgressMeterOptions options_;
  mutable Mutex mu_;
  // The running phase.
  bool running_ ABSL_GUARDED_BY(mu_) = false;
  std::string label_ ABSL_GUARDED_BY(mu_);
  ProgressUnit unit_ ABSL_GUARDED_BY(mu_) = ProgressUnit::kElements;
  int64_t begin_ns_ ABSL_GUARDED_BY(mu_) = 0;
  // The last report, clamped into [0, total_]; total_ 0: no total reported.
  int64_t done_ ABSL_GUARDED_BY(mu_) = 0;
  int64_t total_ ABSL_GUARDED_BY(mu_) = 0;
  // When the last line of the phase (its begin, a progress line, a redraw) was written.
  int64_t last_line_ns_ ABSL_GUARDED_BY(mu_) = 0;
  // Plain: the begin line is written but not yet terminated.
  bool line_open_ ABSL_GUARDED_BY(mu_) = false;
  // Terminal: a status line shows, unterminated.
  bool status_showing_ ABSL_GUARDED_BY(mu_) = false;
};

// How long `seconds` is, for a person: "40 ms", "1.4 s", "12 s", "3m 05s", "2h 01m" (negative or
// NaN: "0 ms"; beyond 99 days: "> 99 days").
std::string FormatDuration(double seconds);

// A count for a person: "999", "12.3k", "540.0M", "1.24B", "3.50T".
std::string FormatCount(double count);

// The seconds left at a constant rate: done in elapsed_s, total - done to go. nullopt when it
// cannot be told (nothing done yet, no time elapsed, no total, or non-finite inputs); 0 when done
// >= total.
std::optional<double> EstimateSecondsLeft(double done, double total, double elapsed_s);

// Tokens per second as the step line shows it, 7 characters wide: whole numbers from 100 up,
// and enough digits below that a slow step never reads "0" ("   12.5", "   0.25", "0.00312").
std::string FormatTokensPerSecond(double tokens_per_s);

}  // namespace ps

#endif  // PATRICKSTAR_TRAINER_PROGRESS_METER_H_
