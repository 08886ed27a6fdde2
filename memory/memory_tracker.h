// MemoryTracker: how many bytes of one device are in use, split into model data and non-model data.
//
// PatrickStar's scheduler places chunks under the "tide" of non-model data (activations,
// workspaces): during the warm-up iteration it records, for every moment, the peak non-model bytes
// reached since the previous moment, and later keeps exactly the chunks that fit beside that peak.
// This tracker is where those numbers come from. The pools of a device report into it: the
// chunk-block pool as kModelData (chunk payloads: params, grads, Adam state), the caching allocator
// as kNonModelData. Both report bytes handed out to users, not bytes they keep cached, because
// cached bytes can be reclaimed and are not part of the tide.
//
// Peaks: each kind has a peak, and the total (model + non-model) has its own peak, which can be
// lower than the sum of the two kinds' peaks because they need not peak at the same time.
// ResetPeaks() sets every peak to the current value, so "peak since the last ResetPeaks" is a
// well-defined quantity; SnapshotAndResetPeaks() reads and resets in one atomic step, which is what
// a scheduler sampling moment after moment wants (no allocation can slip between the read and the
// reset).
//
// Thread safety: thread-safe. All methods may be called concurrently.
#ifndef PATRICKSTAR_MEMORY_MEMORY_TRACKER_H_
#define PATRICKSTAR_MEMORY_MEMORY_TRACKER_H_

#include <array>
#include <cstdint>
#include <string>

#include "absl/base/thread_annotations.h"
#include "absl/strings/string_view.h"
#include "base/mutex.h"
#include "memory/device.h"

namespace ps {

enum class MemoryKind : uint8_t {
  // Chunk payloads: parameters, gradients, optimizer state.
  kModelData = 0,
  // Everything else: activations, temporary buffers, workspaces, communication buffers.
  kNonModelData = 1,
};

// "model_data" or "non_model_data".
absl::string_view MemoryKindName(MemoryKind kind);

// A consistent view of a tracker at one instant. All values in bytes.
struct MemoryTrackerSnapshot {
  Device device;
  int64_t model_bytes = 0;
  int64_t non_model_bytes = 0;
  int64_t total_bytes = 0;
  // Peaks since the last ResetPeaks() (or since construction).
  int64_t peak_model_bytes = 0;
  int64_t peak_non_model_bytes = 0;
  int64_t peak_total_bytes = 0;

  // One line for logs: "accelerator:0: model 1.00 GiB (peak 1.50 GiB), non-model ...".
  std::string DebugString() const;
};

class MemoryTracker {
 public:
  explicit MemoryTracker(Device device);

  MemoryTracker(const MemoryTracker&) = delete;
  MemoryTracker& operator=(const MemoryTracker&) = delete;

  // The device whose memory this tracker accounts.
  Device device() const { return device_; }

  // Records that `bytes` more bytes of `kind` are in use, raising the peaks as needed.
  // REQUIRES: bytes >= 0 (CHECK-fails otherwise: a negative amount is a caller bug).
  void Add(MemoryKind kind, int64_t bytes);

  // Records that `bytes` bytes of `kind` are no longer in use.
  // REQUIRES: 0 <= bytes <= current_bytes(kind). Subtracting more than is held means some caller
  // released memory twice or never recorded it; that is a bug, and the process CHECK-fails with a
  // message naming the device, the kind and both numbers.
  void Subtract(MemoryKind kind, int64_t bytes);

  // Bytes of `kind` in use now.
  int64_t current_bytes(MemoryKind kind) const;
  // Highest current_bytes(kind) since the last ResetPeaks().
  int64_t peak_bytes(MemoryKind kind) const;
  // Model plus non-model bytes in use now.
  int64_t total_bytes() const;
  // Highest total_bytes() since the last ResetPeaks().
  int64_t peak_total_bytes() const;

  // All current values and peaks, read under one lock.
  MemoryTrackerSnapshot Snapshot() const;

  // Sets every peak (each kind's and the total's) to the current value.
  void ResetPeaks();

  // Snapshot() and ResetPeaks() as one atomic step: returns the peaks since the previous reset and
  // starts a new measurement interval.
  MemoryTrackerSnapshot SnapshotAndResetPeaks();

  // A second, independent measurement interval for a caller that wants peaks over a longer span
  // (a training step) while the scheduler resets the peaks above at every moment: the same as
  // SnapshotAndResetPeaks but with peaks since the previous call of this method (or since
  // construction), and resetting only those.
  MemoryTrackerSnapshot SnapshotAndResetIntervalPeaks();

 private:
  MemoryTrackerSnapshot SnapshotLocked() const ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  void ResetPeaksLocked() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);

  const Device device_;
  mutable Mutex mu_;
  std::array<int64_t, 2> current_bytes_ ABSL_GUARDED_BY(mu_) = {0, 0};
  std::array<int64_t, 2> peak_bytes_ ABSL_GUARDED_BY(mu_) = {0, 0};
  int64_t peak_total_bytes_ ABSL_GUARDED_BY(mu_) = 0;
  std::array<int64_t, 2> interval_peak_bytes_ ABSL_GUARDED_BY(mu_) = {0, 0};
  int64_t interval_peak_total_bytes_ ABSL_GUARDED_BY(mu_) = 0;
};

}  // namespace ps

#endif  // PATRICKSTAR_MEMORY_MEMORY_TRACKER_H_
