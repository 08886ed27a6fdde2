#include "memory/memory_tracker.h"

#include <algorithm>

#include "absl/strings/str_cat.h"
#include "base/units.h"
#include "glog/logging.h"

namespace ps {
namespace {

constexpr int Index(MemoryKind kind) { return static_cast<int>(kind); }

}  // namespace

absl::string_view MemoryKindName(MemoryKind kind) {
  switch (kind) {
    case MemoryKind::kModelData:
      return "model_data";
    case MemoryKind::kNonModelData:
      return "non_model_data";
  }
  return "unknown";
}

std::string MemoryTrackerSnapshot::DebugString() const {
  return absl::StrCat(device.ToString(), ": model ", FormatBytes(model_bytes), " (peak ",
                      FormatBytes(peak_model_bytes), "), non-model ", FormatBytes(non_model_bytes),
                      " (peak ", FormatBytes(peak_non_model_bytes), "), total ",
                      FormatBytes(total_bytes), " (peak ", FormatBytes(peak_total_bytes), ")");
}

MemoryTracker::MemoryTracker(Device device) : device_(device) {}

void MemoryTracker::Add(MemoryKind kind, int64_t bytes) {
  CHECK_GE(bytes, 0) << "MemoryTracker(" << device_ << ")::Add of a negative amount for "
                     << MemoryKindName(kind);
  MutexLock lock(&mu_);
  int64_t& current = current_bytes_[Index(kind)];
  current += bytes;
  int64_t& peak = peak_bytes_[Index(kind)];
  peak = std::max(peak, current);
  peak_total_bytes_ = std::max(peak_total_bytes_, current_bytes_[0] + current_bytes_[1]);
  int64_t& interval_peak = interval_peak_bytes_[Index(kind)];
  interval_peak = std::max(interval_peak, current);
  interval_peak_total_bytes_ =
      std::max(interval_peak_total_bytes_, current_bytes_[0] + current_bytes_[1]);
}

MemoryTrackerSnapshot MemoryTracker::SnapshotAndResetIntervalPeaks() {
  MutexLock lock(&mu_);
  MemoryTrackerSnapshot s = SnapshotLocked();
  s.peak_model_bytes = interval_peak_bytes_[0];
  s.peak_non_model_bytes = interval_peak_bytes_[1];
  s.peak_total_bytes = interval_peak_total_bytes_;
  interval_peak_bytes_ = current_bytes_;
  interval_peak_total_bytes_ = current_bytes_[0] + current_bytes_[1];
  return s;
}

void MemoryTracker::Subtract(MemoryKind kind, int64_t bytes) {
  CHECK_GE(bytes, 0) << "MemoryTracker(" << device_ << ")::Subtract of a negative amount for "
                     << MemoryKindName(kind);
  MutexLock lock(&mu_);
  int64_t& current = current_bytes_[Index(kind)];
  CHECK_LE(bytes, current) << "MemoryTracker(" << device_ << "): subtracting " << bytes
                           << " bytes of " << MemoryKindName(kind) << " but only " << current
                           << " bytes are recorded as in use; some memory was released twice or "
                              "never recorded";
  current -= bytes;
}

int64_t MemoryTracker::current_bytes(MemoryKind kind) const {
  MutexLock lock(&mu_);
  return current_bytes_[Index(kind)];
}

int64_t MemoryTracker::peak_bytes(MemoryKind kind) const {
  MutexLock lock(&mu_);
  return peak_bytes_[Index(kind)];
}

int64_t MemoryTracker::total_bytes() const {
  MutexLock lock(&mu_);
  return current_bytes_[0] + current_bytes_[1];
}

int64_t MemoryTracker::peak_total_bytes() const {
  MutexLock lock(&mu_);
  return peak_total_bytes_;
}

MemoryTrackerSnapshot MemoryTracker::Snapshot() const {
  MutexLock lock(&mu_);
  return SnapshotLocked();
}

void MemoryTracker::ResetPeaks() {
  MutexLock lock(&mu_);
  ResetPeaksLocked();
}

MemoryTrackerSnapshot MemoryTracker::SnapshotAndResetPeaks() {
  MutexLock lock(&mu_);
  MemoryTrackerSnapshot snapshot = SnapshotLocked();
  ResetPeaksLocked();
  return snapshot;
}

MemoryTrackerSnapshot MemoryTracker::SnapshotLocked() const {
  MemoryTrackerSnapshot s;
  s.device = device_;
  s.model_bytes = current_bytes_[Index(MemoryKind::kModelData)];
  s.non_model_bytes = current_bytes_[Index(MemoryKind::kNonModelData)];
  s.total_bytes = s.model_bytes + s.non_model_bytes;
  s.peak_model_bytes = peak_bytes_[Index(MemoryKind::kModelData)];
  s.peak_non_model_bytes = peak_bytes_[Index(MemoryKind::kNonModelData)];
  s.peak_total_bytes = peak_total_bytes_;
  return s;
}

void MemoryTracker::ResetPeaksLocked() {
  peak_bytes_ = current_bytes_;
  peak_total_bytes_ = current_bytes_[0] + current_bytes_[1];
}

}  // namespace ps
