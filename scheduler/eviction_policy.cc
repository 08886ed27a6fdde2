#include "scheduler/eviction_policy.h"

#include <algorithm>
#include <limits>
#include <tuple>

#include "absl/strings/str_cat.h"

namespace ps {

int64_t RankedPolicy::LastUse(int64_t chunk) const {
  auto it = last_use_.find(chunk);
  return it == last_use_.end() ? 0 : it->second;
}

std::vector<int64_t> RankedPolicy::ChooseVictims(absl::Span<const EvictionCandidate> candidates,
                                                 int64_t need_bytes, int64_t now) {
  std::vector<std::tuple<int64_t, int64_t, int64_t>> ranked;  // (rank, chunk, bytes)
  ranked.reserve(candidates.size());
  for (const EvictionCandidate& c : candidates)
    ranked.emplace_back(Rank(c.chunk, now), c.chunk, c.bytes);
  std::sort(ranked.begin(), ranked.end());
  std::vector<int64_t> victims;
  int64_t freed = 0;
  for (const auto& [rank, chunk, bytes] : ranked) {
    if (freed >= need_bytes) break;
    victims.push_back(chunk);
    freed += bytes;
  }
  return victims;
}

int64_t OptPolicy::Rank(int64_t chunk, int64_t now) const {
  if (schedule_ == nullptr || !schedule_->finished()) return LastUse(chunk);  // warm-up: LRU
  const int64_t next = schedule_->NextUse(chunk, now);
  // Furthest next use first: negate (kNever becomes the most negative, evicted first).
  return next == AccessSchedule::kNever ? std::numeric_limits<int64_t>::min() : -next;
}

int64_t StaticPartitionPolicy::Rank(int64_t chunk, int64_t now) const {
  // Streaming chunks (LRU among them) before any static chunk.
  constexpr int64_t kStaticOffset = int64_t{1} << 60;
  return LastUse(chunk) + (IsStatic(chunk) ? kStaticOffset : 0);
}

absl::StatusOr<std::unique_ptr<EvictionPolicy>> CreateEvictionPolicy(
    absl::string_view name, absl::flat_hash_set<int64_t> static_chunks) {
  if (name == "opt") return std::unique_ptr<EvictionPolicy>(new OptPolicy());
  if (name == "lru") return std::unique_ptr<EvictionPolicy>(new LruPolicy());
  if (name == "static") {
    return std::unique_ptr<EvictionPolicy>(new StaticPartitionPolicy(std::move(static_chunks)));
  }
  return absl::InvalidArgumentError(
      absl::StrCat("unknown eviction policy \"", name, "\": expected opt, lru or static"));
}

}  // namespace ps
