#include "scheduler/access_schedule.h"

#include <algorithm>

#include "absl/strings/str_cat.h"

namespace ps {

absl::Status AccessSchedule::Record(int64_t chunk, int64_t moment) {
  if (finished()) {
    return absl::FailedPreconditionError("AccessSchedule::Record after Finish");
  }
  if (moment < 0 || moment < last_moment_) {
    return absl::InvalidArgumentError(absl::StrCat("AccessSchedule: moment ", moment,
                                                   " recorded after moment ", last_moment_,
                                                   "; moments must not decrease"));
  }
  last_moment_ = moment;
  std::vector<int64_t>& uses = uses_[chunk];
  if (!uses.empty() && uses.back() == moment) return absl::OkStatus();
  uses.push_back(moment);
  sequence_.emplace_back(moment, chunk);
  return absl::OkStatus();
}

absl::Status AccessSchedule::Finish(int64_t total_moments) {
  if (total_moments <= 0) {
    return absl::InvalidArgumentError(absl::StrCat(
        "AccessSchedule: an iteration needs at least one moment, got ", total_moments));
  }
  if (!sequence_.empty() && last_moment_ >= total_moments) {
    return absl::InvalidArgumentError(absl::StrCat("AccessSchedule: moment ", last_moment_,
                                                   " recorded, but the iteration has only ",
                                                   total_moments, " moments"));
  }
  total_moments_ = total_moments;
  return absl::OkStatus();
}

int64_t AccessSchedule::NextUse(int64_t chunk, int64_t now) const {
  auto it = uses_.find(chunk);
  if (it == uses_.end() || it->second.empty()) return kNever;
  const std::vector<int64_t>& uses = it->second;
  auto next = std::upper_bound(uses.begin(), uses.end(), now);
  if (next != uses.end()) return *next;
  return total_moments_ + uses.front();
}

const std::vector<int64_t>& AccessSchedule::UsesOf(int64_t chunk) const {
  static const std::vector<int64_t>* const kEmpty = new std::vector<int64_t>();
  auto it = uses_.find(chunk);
  return it == uses_.end() ? *kEmpty : it->second;
}

}  // namespace ps
