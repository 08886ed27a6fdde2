#include "scheduler/planner.h"

#include <algorithm>
#include <utility>

#include "absl/container/flat_hash_map.h"
#include "absl/strings/str_cat.h"
#include "glog/logging.h"

namespace ps {

bool AdamPlacement::OnAccelerator(int64_t chunk_index) const {
  return std::binary_search(accelerator_chunks.begin(), accelerator_chunks.end(), chunk_index);
}

absl::StatusOr<ResidencyPlanner> ResidencyPlanner::Create(const PlannerOptions& o) {
  if (o.budget_bytes <= 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("PlannerOptions.budget_bytes must be positive, got ", o.budget_bytes));
  }
  if (o.chunk_cost_bytes <= 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("PlannerOptions.chunk_cost_bytes must be positive, got ", o.chunk_cost_bytes));
  }
  if (!(o.warmup_chunk_fraction > 0 && o.warmup_chunk_fraction <= 1)) {
    return absl::InvalidArgumentError(absl::StrCat(
        "PlannerOptions.warmup_chunk_fraction must be in (0, 1], got ", o.warmup_chunk_fraction));
  }
  if (o.param_chunk_cost_bytes < 0) {
    return absl::InvalidArgumentError(absl::StrCat(
        "PlannerOptions.param_chunk_cost_bytes must not be negative (0: as chunk_cost_bytes), got ",
        o.param_chunk_cost_bytes));
  }
  if (o.reserved_bytes < 0 || o.adam_margin_bytes < 0 || o.num_chunks < 0) {
    return absl::InvalidArgumentError(absl::StrCat(
        "PlannerOptions: reserved_bytes (", o.reserved_bytes, "), adam_margin_bytes (",
        o.adam_margin_bytes, ") and num_chunks (", o.num_chunks, ") must not be negative"));
  }
  return ResidencyPlanner(o);
}

int64_t ResidencyPlanner::ChunkCostBytes(ChunkType type) const {
  if (type == ChunkType::kParam && options_.param_chunk_cost_bytes > 0) {
    return options_.param_chunk_cost_bytes;
  }
  return options_.chunk_cost_bytes;
}

void ResidencyPlanner::SetTrace(const TideTrace* trace) {
  CHECK(trace != nullptr && trace->finished())
      << "ResidencyPlanner::SetTrace needs a finished trace";
  trace_ = trace;
}

bool ResidencyPlanner::OnTrace(int64_t moment) const {
  return trace_ != nullptr && moment >= 0 && moment < trace_->total_moments();
}

int64_t ResidencyPlanner::ChunkableBytes(int64_t moment) const {
  CHECK(OnTrace(moment)) << "moment " << moment << " is not on the learned trace";
  return trace_->ChunkableBytes(moment, options_.budget_bytes, options_.reserved_bytes);
}

MomentLimits ResidencyPlanner::LimitsAt(int64_t moment, int64_t nonmodel_now_bytes,
                                        int64_t unplanned_bytes) const {
  MomentLimits l;
  const int64_t budget = options_.budget_bytes;
  const int64_t reserved = options_.reserved_bytes;
  const int64_t unplanned = std::max<int64_t>(0, unplanned_bytes);
  if (OnTrace(moment)) {
    l.known = true;
    l.tide_bytes = trace_->AcceleratorTideBytes(moment);
    const int64_t own_peak =
        std::max(trace_->sample(moment).accelerator_peak_bytes, nonmodel_now_bytes);
    l.hard_bytes = std::max<int64_t>(0, budget - own_peak - reserved);
    l.target_bytes = std::min(l.hard_bytes, ChunkableBytes(moment));
  } else {
    l.tide_bytes = nonmodel_now_bytes;
    l.hard_bytes = std::max<int64_t>(0, budget - nonmodel_now_bytes - reserved);
    l.target_bytes = std::min(l.hard_bytes, static_cast<int64_t>(options_.warmup_chunk_fraction *
                                                                 static_cast<double>(budget)));
  }
  // Unplanned bytes lower the target only: an access whose working set still fits the hard limit
  // runs (the pressure reclaimer stays the backstop), it just keeps fewer other chunks.
  l.target_bytes = std::max<int64_t>(0, l.target_bytes - unplanned);
  return l;
}

AccessPlan ResidencyPlanner::PlanAccess(int64_t moment, int64_t nonmodel_now_bytes,
                                        int64_t resident_bytes, int64_t own_bytes,
                                        int64_t stuck_bytes, int64_t missing_bytes,
                                        int64_t unplanned_bytes) const {
  AccessPlan p;
  p.limits = LimitsAt(moment, nonmodel_now_bytes, unplanned_bytes);
  p.own_bytes = own_bytes;
  p.working_set_bytes = p.own_bytes + stuck_bytes;
  p.fits = p.working_set_bytes <= p.limits.hard_bytes;
  p.limit_bytes = std::max(p.limits.target_bytes, p.working_set_bytes);
  p.evict_bytes = std::max<int64_t>(0, resident_bytes + missing_bytes - p.limit_bytes);
  return p;
}

int64_t ResidencyPlanner::PrefetchMoment(int64_t moment) const {
  if (!OnTrace(moment)) return -1;
  const int64_t next = moment + 1;  // not across iterations
  if (next >= trace_->total_moments()) return -1;
  if (trace_->sample(next).stage == Stage::kAdam) return -1;
  return next;
}

PrefetchPlan ResidencyPlanner::PlanPrefetch(int64_t moment, int64_t nonmodel_now_bytes,
                                            int64_t resident_bytes, int64_t missing_bytes,
                                            int64_t next_access_bytes,
                                            int64_t unplanned_bytes) const {
  const int64_t next = PrefetchMoment(moment);
  CHECK_GE(next, 0) << "no prefetch after moment " << moment;
  PrefetchPlan p;
  const int64_t over = resident_bytes + missing_bytes -
                       LimitsAt(moment, nonmodel_now_bytes, unplanned_bytes).target_bytes;
  if (over <= 0) {
    p.allowed = true;
    return p;
  }
  // Only the evictions the access at `next` would make itself (its limit is the trace's target,
  // or its own chunks when they are more).
  const int64_t next_allowed = std::max(ChunkableBytes(next), next_access_bytes);
  const int64_t demand_over = resident_bytes + missing_bytes - next_allowed;
  if (over > demand_over) return p;
  p.allowed = true;
  p.evict_bytes = over;
  return p;
}

AdamPlacement ResidencyPlanner::PlanAdam(absl::Span<const int64_t> state_indices) const {
  CHECK(trace_ != nullptr) << "ResidencyPlanner::PlanAdam needs the learned trace";
  const ChunkKeys k = keys();
  AdamPlacement placement;
  // Room that stays free at every moment once every param chunk the iteration uses on the
  // accelerator is resident: optimizer state placed there is never evicted again.
  int64_t min_chunkable = options_.budget_bytes;
  for (int64_t m = 0; m < trace_->total_moments(); ++m) {
    min_chunkable = std::min(min_chunkable, ChunkableBytes(m));
  }
  // Param chunks used on the accelerator, with their last use.
  absl::flat_hash_map<int64_t, int64_t> last_use;
  for (const auto& [m, key] : trace_->schedule().sequence()) {
    if (k.IdOf(key).type == ChunkType::kParam) last_use[key] = m;
  }
  placement.available_bytes = std::max<int64_t>(
      0, min_chunkable - ChunkCostBytes(ChunkType::kParam) * static_cast<int64_t>(last_use.size()) -
             options_.adam_margin_bytes);
  // Each index updated on the accelerator keeps its three optimizer-state chunks there. The
  // indices whose param chunk is used last (resident when the step starts) come first.
  const int64_t per_index_bytes = 3 * ChunkCostBytes(ChunkType::kMaster);
  std::vector<std::pair<int64_t, int64_t>> order;  // (-last use, index)
  for (int64_t i : state_indices) {
    auto it = last_use.find(k.Key(ChunkType::kParam, i));
    order.emplace_back(it == last_use.end() ? 1 : -it->second, i);
  }
  std::sort(order.begin(), order.end());
  const int64_t n = std::min<int64_t>(placement.available_bytes / per_index_bytes,
                                      static_cast<int64_t>(order.size()));
  for (int64_t j = 0; j < n; ++j) placement.accelerator_chunks.push_back(order[j].second);
  std::sort(placement.accelerator_chunks.begin(), placement.accelerator_chunks.end());
  return placement;
}

bool ResidencyPlanner::UsedLaterInIteration(int64_t key, int64_t moment) const {
  CHECK(OnTrace(moment)) << "moment " << moment << " is not on the learned trace";
  return trace_->schedule().NextUse(key, moment) < trace_->total_moments();
}

}  // namespace ps
