// EvictionPolicy: which resident chunks leave the accelerator when room is needed.
//
// One interface, so benchmarks compare policies on the same trace:
//  - OptPolicy (the default): Belady's MIN/OPT. Evicts the candidate whose next use, read from the
//    warm-up's AccessSchedule, is furthest in the future (wrapping into the next iteration); ties
//    go to the lower chunk key. Before a schedule exists (the warm-up itself) it behaves as LRU.
//  - LruPolicy: evicts the least recently used candidate.
//  - StaticPartitionPolicy: a fixed set of chunks lives on the accelerator for the whole run (as
//    ZeRO-Offload-style systems place data statically); every other chunk streams through and is
//    evicted first, least recently used first. Static chunks are evicted only when nothing else
//    can make room.
//
// The caller (ChunkManager) passes only legal candidates: resident chunks that are neither in
// COMPUTE nor pinned. ChooseVictims returns candidates in eviction order until their bytes reach
// `need_bytes`, or all candidates if they cannot; the caller reports the shortfall.
//
// Thread safety: thread-compatible.
#ifndef PATRICKSTAR_SCHEDULER_EVICTION_POLICY_H_
#define PATRICKSTAR_SCHEDULER_EVICTION_POLICY_H_

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "absl/container/flat_hash_set.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "absl/types/span.h"
#include "scheduler/access_schedule.h"

namespace ps {

struct EvictionCandidate {
  int64_t chunk = 0;
  int64_t bytes = 0;
};

class EvictionPolicy {
 public:
  virtual ~EvictionPolicy() = default;

  virtual absl::string_view name() const = 0;

  // Notes that `chunk` was used at `moment` (every access, warm-up or not).
  virtual void RecordUse(int64_t chunk, int64_t moment) = 0;

  // Gives the policy the warm-up's schedule (OPT uses it; others may ignore it).
  // REQUIRES: schedule.finished(); `schedule` outlives the policy.
  virtual void SetSchedule(const AccessSchedule* schedule) = 0;

  // See the file comment. `now` is the current moment.
  virtual std::vector<int64_t> ChooseVictims(absl::Span<const EvictionCandidate> candidates,
                                             int64_t need_bytes, int64_t now) = 0;
};

// Orders candidates by `key` (ascending: evicted first) and takes them until need_bytes is met.
class RankedPolicy : public EvictionPolicy {
 public:
  void RecordUse(int64_t chunk, int64_t moment) override { last_use_[chunk] = ++clock_; }
  void SetSchedule(const AccessSchedule* schedule) override { schedule_ = schedule; }
  std::vector<int64_t> ChooseVictims(absl::Span<const EvictionCandidate> candidates,
                                     int64_t need_bytes, int64_t now) override;

 protected:
  // Smaller ranks are evicted first; ties go to the lower chunk key.
  virtual int64_t Rank(int64_t chunk, int64_t now) const = 0;
  // Logical time of the last use (0 = never used).
  int64_t LastUse(int64_t chunk) const;

  const AccessSchedule* schedule_ = nullptr;

 private:
  absl::flat_hash_map<int64_t, int64_t> last_use_;
  int64_t clock_ = 0;
};

class OptPolicy final : public RankedPolicy {
 public:
  absl::string_view name() const override { return "opt"; }

 protected:
  int64_t Rank(int64_t chunk, int64_t now) const override;
};

class LruPolicy final : public RankedPolicy {
 public:
  absl::string_view name() const override { return "lru"; }

 protected:
  int64_t Rank(int64_t chunk, int64_t now) const override { return LastUse(chunk); }
};

class StaticPartitionPolicy final : public RankedPolicy {
 public:
  explicit StaticPartitionPolicy(absl::flat_hash_set<int64_t> static_chunks)
      : static_chunks_(std::move(static_chunks)) {}
  absl::string_view name() const override { return "static"; }
  bool IsStatic(int64_t chunk) const { return static_chunks_.contains(chunk); }

 protected:
  int64_t Rank(int64_t chunk, int64_t now) const override;

 private:
  absl::flat_hash_set<int64_t> static_chunks_;
};

// "opt", "lru" or "static" (static needs its chunk set: see StaticPartitionPolicy). InvalidArgument
// for anything else.
absl::StatusOr<std::unique_ptr<EvictionPolicy>> CreateEvictionPolicy(
    absl::string_view name, absl::flat_hash_set<int64_t> static_chunks = {});

}  // namespace ps

#endif  // PATRICKSTAR_SCHEDULER_EVICTION_POLICY_H_
