#include "trainer/progress_meter.h"

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <optional>
#include <string>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "base/units.h"

namespace ps {
namespace {

// Back to the start of the line, and clear to its end (ANSI "erase in line").
constexpr absl::string_view kRewrite = "\r\033[K";

std::string FormatAmount(double amount, ProgressUnit unit) {
  if (unit == ProgressUnit::kBytes) {
    // FormatBytes takes int64: amounts here are clamped reports, so they fit.
    return FormatBytes(static_cast<int64_t>(std::min(amount, 9.2e18)));
  }
  return FormatCount(amount);
}

// A rate: below 100 (per second) with up to three significant digits, so a slow phase does not
// read "0 elements/s".
std::string FormatRate(double per_s, ProgressUnit unit) {
  const std::string value = per_s < 99.5 ? absl::StrFormat("%.3g", std::max(0.0, per_s))
                            : unit == ProgressUnit::kBytes ? FormatAmount(per_s, unit)
                                                           : FormatCount(per_s);
  if (unit == ProgressUnit::kElements) return absl::StrCat(value, " elements/s");
  return per_s < 99.5 ? absl::StrCat(value, " B/s") : absl::StrCat(value, "/s");
}

}  // namespace

std::string FormatDuration(double seconds) {
  if (!(seconds > 0)) return "0 ms";  // negative or NaN
  if (seconds < 0.9995) return absl::StrFormat("%.0f ms", seconds * 1e3);
  if (seconds < 9.95) return absl::StrFormat("%.1f s", seconds);
  if (seconds < 59.5) return absl::StrFormat("%.0f s", seconds);
  if (seconds < 3600) {
    const int64_t s = static_cast<int64_t>(std::llround(seconds));
    return absl::StrFormat("%dm %02ds", s / 60, s % 60);
  }
  if (seconds < 99.0 * 86400) {
    const int64_t m = static_cast<int64_t>(std::llround(seconds / 60));
    return absl::StrFormat("%dh %02dm", m / 60, m % 60);
  }
  return "> 99 days";
}

std::string FormatCount(double count) {
  if (!std::isfinite(count)) return "?";
  count = std::max(0.0, count);
  if (count < 999.5) return absl::StrFormat("%.0f", count);
  if (count < 999.95e3) return absl::StrFormat("%.1fk", count / 1e3);
  if (count < 999.95e6) return absl::StrFormat("%.1fM", count / 1e6);
  if (count < 999.995e9) return absl::StrFormat("%.2fB", count / 1e9);
  return absl::StrFormat("%.2fT", count / 1e12);
}

std::optional<double> EstimateSecondsLeft(double done, double total, double elapsed_s) {
  if (!std::isfinite(done) || !std::isfinite(total) || !std::isfinite(elapsed_s)) {
    return std::nullopt;
  }
  if (total <= 0 || done <= 0 || elapsed_s <= 0) return std::nullopt;
  if (done >= total) return 0.0;
  return elapsed_s * ((total - done) / done);
}

std::string FormatTokensPerSecond(double tokens_per_s) {
  if (!std::isfinite(tokens_per_s) || tokens_per_s <= 0) return absl::StrFormat("%7.0f", 0.0);
  if (tokens_per_s >= 99.5) return absl::StrFormat("%7.0f", tokens_per_s);
  if (tokens_per_s >= 9.995) return absl::StrFormat("%7.1f", tokens_per_s);
  if (tokens_per_s >= 0.9995) return absl::StrFormat("%7.2f", tokens_per_s);
  return absl::StrFormat("%7.3g", tokens_per_s);
}

ProgressMeter::ProgressMeter(std::ostream* out, ProgressMeterOptions options)
    : out_(out), options_(options) {}

ProgressMeter::~ProgressMeter() {
  MutexLock lock(&mu_);
  if (running_ && (line_open_ || options_.is_terminal)) Write("\n");
  ClearStatusLocked();
}

bool ProgressMeter::running() const {
  MutexLock lock(&mu_);
  return running_;
}

void ProgressMeter::Write(absl::string_view text) {
  if (out_ == nullptr) return;
  *out_ << text;
  out_->flush();
}

void ProgressMeter::ClearStatusLocked() {
  if (!status_showing_) return;
  Write(kRewrite);
  status_showing_ = false;
}

void ProgressMeter::Begin(absl::string_view label, ProgressUnit unit) {
  MutexLock lock(&mu_);
  if (running_) EndLocked("", /*failed=*/false);
  ClearStatusLocked();
  running_ = true;
  label_ = std::string(label);
  unit_ = unit;
  begin_ns_ = options_.clock.now_ns();
  last_line_ns_ = begin_ns_;
  done_ = 0;
  total_ = 0;
  Write(absl::StrCat(label_, " ..."));
  line_open_ = !options_.is_terminal;
}

std::string ProgressMeter::ProgressText(int64_t now_ns) const {
  const double elapsed_s = 1e-9 * static_cast<double>(now_ns - begin_ns_);
  if (total_ <= 0) return absl::StrCat(FormatDuration(elapsed_s), " so far");
  const double done = static_cast<double>(done_);
  const double total = static_cast<double>(total_);
  std::string text = absl::StrFormat("%3.0f%% (%s of %s%s)", std::floor(100.0 * done / total),
                                     FormatAmount(done, unit_), FormatAmount(total, unit_),
                                     unit_ == ProgressUnit::kElements ? " elements" : "");
  if (elapsed_s > 0 && done > 0) absl::StrAppend(&text, ", ", FormatRate(done / elapsed_s, unit_));
  if (std::optional<double> left = EstimateSecondsLeft(done, total, elapsed_s)) {
    absl::StrAppend(&text, ", ", FormatDuration(*left), " left");
  }
  return text;
}

void ProgressMeter::Update(int64_t done, int64_t total) {
  MutexLock lock(&mu_);
  if (!running_) return;
  total_ = std::max<int64_t>(0, total);
  done_ = std::clamp<int64_t>(done, 0, total_);
  const int64_t now = options_.clock.now_ns();
  const int64_t interval =
      options_.is_terminal ? options_.terminal_interval_ns : options_.plain_interval_ns;
  if (now - last_line_ns_ < interval) return;
  last_line_ns_ = now;
  if (options_.is_terminal) {
    Write(absl::StrCat(kRewrite, label_, " ... ", ProgressText(now)));
    return;
  }
  Write(absl::StrCat(line_open_ ? "\n" : "", label_, " ... ", ProgressText(now), "\n"));
  line_open_ = false;
}

ProgressFn ProgressMeter::Fn() {
  return [this](int64_t done, int64_t total) { Update(done, total); };
}

double ProgressMeter::EndLocked(absl::string_view note, bool failed) {
  if (!running_) return 0;
  const int64_t now = options_.clock.now_ns();
  const double seconds = 1e-9 * static_cast<double>(std::max<int64_t>(0, now - begin_ns_));
  std::string text = absl::StrCat(failed ? "failed after " : "done in ", FormatDuration(seconds));
  if (total_ > 0 && !failed) {
    const double done = static_cast<double>(done_);
    absl::StrAppend(&text, " (", FormatAmount(done, unit_),
                    unit_ == ProgressUnit::kElements ? " elements" : "");
    if (seconds > 0 && done > 0) absl::StrAppend(&text, ", ", FormatRate(done / seconds, unit_));
    absl::StrAppend(&text, ")");
  }
  absl::StrAppend(&text, note, "\n");
  if (options_.is_terminal) {
    Write(absl::StrCat(kRewrite, label_, " ... ", text));
  } else if (line_open_) {
    Write(absl::StrCat(" ", text));
  } else {
    Write(absl::StrCat(label_, " ... ", text));
  }
  running_ = false;
  line_open_ = false;
  return seconds;
}

double ProgressMeter::End(absl::string_view note) {
  MutexLock lock(&mu_);
  return EndLocked(note, /*failed=*/false);
}

double ProgressMeter::Fail() {
  MutexLock lock(&mu_);
  return EndLocked("", /*failed=*/true);
}

void ProgressMeter::Status(absl::string_view line) {
  MutexLock lock(&mu_);
  if (!options_.is_terminal || running_) return;
  Write(absl::StrCat(kRewrite, line));
  status_showing_ = true;
}

void ProgressMeter::ClearStatus() {
  MutexLock lock(&mu_);
  ClearStatusLocked();
}

void ProgressMeter::Print(absl::string_view text) {
  MutexLock lock(&mu_);
  if (running_) EndLocked("", /*failed=*/false);
  ClearStatusLocked();
  Write(text);
}

}  // namespace ps
