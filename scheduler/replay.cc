#include "scheduler/replay.h"

#include <algorithm>
#include <bit>
#include <limits>

#include "absl/container/flat_hash_map.h"
#include "absl/container/flat_hash_set.h"
#include "absl/strings/str_cat.h"
#include "base/status_macros.h"

namespace ps {
namespace {

absl::Status CheckStep(const ReplayStep& step, int64_t index) {
  absl::flat_hash_set<int64_t> distinct(step.chunks.begin(), step.chunks.end());
  if (static_cast<int64_t>(distinct.size()) > step.capacity_chunks) {
    return absl::InvalidArgumentError(absl::StrCat("step ", index, " needs ", distinct.size(),
                                                   " chunks resident but only ",
                                                   step.capacity_chunks, " fit"));
  }
  return absl::OkStatus();
}

}  // namespace

absl::StatusOr<ReplayResult> Replay(absl::Span<const ReplayStep> steps, int iterations,
                                    EvictionPolicy& policy, bool schedule_known_in_advance) {
  for (size_t i = 0; i < steps.size(); ++i) RETURN_IF_ERROR(CheckStep(steps[i], i));
  ReplayResult result;
  AccessSchedule schedule;
  absl::flat_hash_set<int64_t> resident;
  const int64_t total = static_cast<int64_t>(steps.size());
  if (schedule_known_in_advance) {
    for (int64_t m = 0; m < total; ++m) {
      for (int64_t c : steps[m].chunks) RETURN_IF_ERROR(schedule.Record(c, m));
    }
    RETURN_IF_ERROR(schedule.Finish(total));
    policy.SetSchedule(&schedule);
  }
  const bool learn = !schedule_known_in_advance;
  for (int it = 0; it < iterations; ++it) {
    int64_t loads = 0;
    for (int64_t m = 0; m < total; ++m) {
      const ReplayStep& step = steps[m];
      const absl::flat_hash_set<int64_t> needed(step.chunks.begin(), step.chunks.end());
      int64_t missing = 0;
      for (int64_t c : needed) missing += resident.contains(c) ? 0 : 1;
      const int64_t over = static_cast<int64_t>(resident.size()) + missing - step.capacity_chunks;
      if (over > 0) {
        std::vector<EvictionCandidate> candidates;
        for (int64_t c : resident) {
          if (!needed.contains(c)) candidates.push_back({c, 1});
        }
        std::sort(candidates.begin(), candidates.end(),
                  [](const EvictionCandidate& a, const EvictionCandidate& b) {
                    return a.chunk < b.chunk;
                  });
        for (int64_t victim : policy.ChooseVictims(candidates, over, m)) {
          resident.erase(victim);
          ++result.evictions;
        }
      }
      for (int64_t c : needed) {
        if (resident.insert(c).second) ++loads;
        policy.RecordUse(c, m);
        if (learn && it == 0) RETURN_IF_ERROR(schedule.Record(c, m));
      }
      if (static_cast<int64_t>(resident.size()) > step.capacity_chunks) {
        return absl::InternalError(absl::StrCat("policy ", policy.name(), " left ", resident.size(),
                                                " chunks resident at step ", m, " with capacity ",
                                                step.capacity_chunks));
      }
    }
    if (learn && it == 0) {
      RETURN_IF_ERROR(schedule.Finish(total));
      policy.SetSchedule(&schedule);
    }
    result.loads += loads;
    result.loads_per_iteration.push_back(loads);
  }
  policy.SetSchedule(nullptr);
  return result;
}

absl::StatusOr<int64_t> MinimumLoads(absl::Span<const ReplayStep> steps, int iterations,
                                     absl::Span<const int64_t> initially_resident) {
  for (size_t i = 0; i < steps.size(); ++i) RETURN_IF_ERROR(CheckStep(steps[i], i));
  uint32_t initial = 0;
  for (int64_t c : initially_resident) {
    if (c < 0 || c >= 16) {
      return absl::InvalidArgumentError("MinimumLoads: chunk keys must be in [0, 16)");
    }
    initial |= 1u << c;
  }
  // best[resident set] = fewest loads to reach it.
  absl::flat_hash_map<uint32_t, int64_t> best = {{initial, 0}};
  for (int it = 0; it < iterations; ++it) {
    for (const ReplayStep& step : steps) {
      uint32_t need = 0;
      for (int64_t c : step.chunks) {
        if (c < 0 || c >= 16)
          return absl::InvalidArgumentError("MinimumLoads: chunk keys must be in [0, 16)");
        need |= 1u << c;
      }
      absl::flat_hash_map<uint32_t, int64_t> next;
      for (const auto& [set, loads] : best) {
        const int64_t cost = loads + std::popcount(need & ~set);
        // Keep any subset of what was resident, plus what the step needs, within capacity.
        const uint32_t keepable = set & ~need;
        for (uint32_t keep = keepable;; keep = (keep - 1) & keepable) {
          const uint32_t after = keep | need;
          if (std::popcount(after) <= step.capacity_chunks) {
            auto [pos, inserted] = next.try_emplace(after, cost);
            if (!inserted) pos->second = std::min(pos->second, cost);
          }
          if (keep == 0) break;
        }
      }
      best = std::move(next);
    }
  }
  int64_t minimum = std::numeric_limits<int64_t>::max();
  for (const auto& [set, loads] : best) minimum = std::min(minimum, loads);
  return minimum;
}

}  // namespace ps
