#include "memory/caching_allocator.h"

#include <algorithm>
#include <cmath>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "glog/logging.h"

namespace ps {
namespace {

// Requests above this are refused outright, so that rounding can never overflow.
constexpr int64_t kMaxRequestBytes = int64_t{1} << 60;

std::string PointerString(const void* ptr) {
  return absl::StrCat("0x", absl::Hex(reinterpret_cast<uintptr_t>(ptr)));
}

absl::Status CheckMultiple(absl::string_view option, int64_t value, absl::string_view of_name,
                           int64_t of) {
  if (value <= 0 || value % of != 0) {
    return absl::InvalidArgumentError(absl::StrCat("CachingAllocator: ", option, " = ", value,
                                                   " must be a positive multiple of ", of_name,
                                                   " (", of, ")"));
  }
  return absl::OkStatus();
}

// "37.5%".
std::string Percent(double fraction) {
  const int64_t tenths = std::llround(fraction * 1000.0);
  return absl::StrCat(tenths / 10, ".", tenths % 10, "%");
}

}  // namespace

std::string CachingAllocatorStats::DebugString() const {
  return absl::StrCat(
      "in use ", FormatBytes(in_use_bytes), " (requested ", FormatBytes(requested_bytes), ", ",
      live_allocations, " allocations), reserved ", FormatBytes(reserved_bytes), " in ", segments,
      " segments (peak in use ", FormatBytes(peak_in_use_bytes), ", peak reserved ",
      FormatBytes(peak_reserved_bytes), "), cached ", FormatBytes(cached_bytes), " in ",
      free_blocks, " free blocks (largest ", FormatBytes(largest_free_block_bytes),
      ", fragmentation ", Percent(fragmentation), "), upstream allocations ", upstream_allocations,
      ", deallocations ", upstream_deallocations, ", failed allocations ", failed_allocations,
      stream_ordered_frees == 0
          ? std::string()
          : absl::StrCat(", stream-ordered frees ", stream_ordered_frees, " (", pending_frees,
                         " pending, ", FormatBytes(pending_free_bytes), "; waited ",
                         pending_free_waits, " times; ", events_created, " events created)"));
}

absl::StatusOr<std::unique_ptr<CachingAllocator>> CachingAllocator::Create(
    MemoryResource* upstream, const CachingAllocatorOptions& options) {
  if (upstream == nullptr) {
    return absl::InvalidArgumentError("CachingAllocator: the upstream resource is null");
  }
  absl::Status status = CheckMultiple("round_bytes", options.round_bytes, "kAllocationAlignment",
                                      kAllocationAlignment);
  if (status.ok()) {
    status = CheckMultiple("small_request_max_bytes", options.small_request_max_bytes,
                           "round_bytes", options.round_bytes);
  }
  if (status.ok()) {
    status = CheckMultiple("small_segment_bytes", options.small_segment_bytes, "round_bytes",
                           options.round_bytes);
  }
  if (status.ok()) {
    status = CheckMultiple("large_segment_round_bytes", options.large_segment_round_bytes,
                           "round_bytes", options.round_bytes);
  }
  if (!status.ok()) return status;
  if (options.small_segment_bytes < options.small_request_max_bytes) {
    return absl::InvalidArgumentError(absl::StrCat(
        "CachingAllocator: small_segment_bytes = ", options.small_segment_bytes,
        " must be at least small_request_max_bytes = ", options.small_request_max_bytes));
  }
  if (options.tracker != nullptr && options.tracker->device() != upstream->device()) {
    return absl::InvalidArgumentError(
        absl::StrCat("CachingAllocator: tracker accounts ", options.tracker->device().ToString(),
                     " but ", upstream->name(), " allocates on ", upstream->device().ToString()));
  }
  return std::unique_ptr<CachingAllocator>(new CachingAllocator(upstream, options));
}

CachingAllocator::CachingAllocator(MemoryResource* upstream, const CachingAllocatorOptions& options)
    : upstream_(upstream),
      device_(upstream->device()),
      name_(absl::StrCat("caching_allocator(", upstream->device().ToString(), ")")),
      options_(options),
      event_pool_(std::make_shared<EventPool>()) {}

CachingAllocator::~CachingAllocator() {
  // Streams may still use memory freed on them; the segments go upstream only after that.
  WaitForPendingFrees();
  std::vector<std::pair<char*, int64_t>> segments;
  {
    MutexLock lock(&mu_);
    if (!allocated_.empty()) {
      LOG(WARNING) << name_ << " destroyed with " << allocated_.size()
                   << " allocations still live; returning their segments upstream";
    }
    if (options_.tracker != nullptr) {
      options_.tracker->Subtract(options_.tracked_kind, counters_.in_use_bytes);
    }
    for (auto& [base, segment] : segments_) {
      Block* block = segment->head;
      while (block != nullptr) {
        Block* next = block->next;
        delete block;
        block = next;
      }
      segments.emplace_back(segment->base, segment->size_bytes);
    }
    for (Block* block : spare_blocks_) delete block;
    spare_blocks_.clear();
    segments_.clear();
    allocated_.clear();
    small_free_.clear();
    large_free_.clear();
  }
  for (const auto& [base, size_bytes] : segments) {
    const absl::Status status = upstream_->Deallocate(base, size_bytes);
    LOG_IF(ERROR, !status.ok()) << name_ << ": returning a segment at destruction: " << status;
  }
}

int64_t CachingAllocator::SegmentSizeFor(int64_t bytes) const {
  const int64_t rounded_bytes = RoundedSize(bytes);
  if (IsSmall(rounded_bytes)) return options_.small_segment_bytes;
  return AlignUp(rounded_bytes, options_.large_segment_round_bytes);
}

CachingAllocator::Block* CachingAllocator::NewBlockLocked() {
  if (spare_blocks_.empty()) return new Block;
  Block* block = spare_blocks_.back();
  spare_blocks_.pop_back();
  *block = Block{};
  return block;
}

void CachingAllocator::RecycleBlockLocked(Block* block) {
  constexpr size_t kMaxSpareBlocks = 1024;
  if (spare_blocks_.size() < kMaxSpareBlocks) {
    spare_blocks_.push_back(block);
  } else {
    delete block;
  }
}

void CachingAllocator::EraseFree(FreeSet& free_set, Block* block) {
  const auto it = free_set.find(block);
  DCHECK(it != free_set.end());
  free_set.erase(it);
}

CachingAllocator::Block* CachingAllocator::TakeBestFitLocked(int64_t rounded_bytes,
                                                             bool for_stream) {
  FreeSet& free_set = FreeSetOf(IsSmall(rounded_bytes));
  Block probe;
  probe.size_bytes = rounded_bytes;  // ptr = nullptr sorts before every block of this size
  for (auto it = free_set.lower_bound(&probe); it != free_set.end(); ++it) {
    Block* block = *it;
    // The host skips blocks a stream may still use (a stream waits for them instead).
    if (!for_stream && !UnpassedGuardsLocked(block, nullptr).empty()) continue;
    free_set.erase(it);
    return block;
  }
  return nullptr;
}

void* CachingAllocator::UseBlockLocked(Block* block, int64_t rounded_bytes,
                                       int64_t requested_bytes) {
  DCHECK(!block->allocated);
  DCHECK_GE(block->size_bytes, rounded_bytes);
  const int64_t remainder_bytes = block->size_bytes - rounded_bytes;
  const bool small = block->segment->small;
  const bool split = small ? remainder_bytes >= options_.round_bytes
                           : remainder_bytes > options_.small_request_max_bytes;
  if (split) {
    Block* rest = NewBlockLocked();
    rest->ptr = block->ptr + rounded_bytes;
    rest->size_bytes = remainder_bytes;
    rest->prev = block;
    rest->next = block->next;
    rest->segment = block->segment;
    rest->guards = block->guards;  // the remainder still waits for the same streams
    if (block->next != nullptr) block->next->prev = rest;
    block->next = rest;
    block->size_bytes = rounded_bytes;
    // The old block had no free neighbour (free blocks are always merged), so neither has `rest`.
    FreeSetOf(small).insert(rest);
  }
  block->allocated = true;
  block->requested_bytes = requested_bytes;
  block->guards.clear();  // the caller has waited for them (AllocateImpl)
  allocated_.emplace(block->ptr, block);
  counters_.in_use_bytes += block->size_bytes;
  counters_.requested_bytes += requested_bytes;
  counters_.peak_in_use_bytes = std::max(counters_.peak_in_use_bytes, counters_.in_use_bytes);
  ++counters_.live_allocations;
  ++counters_.total_allocations;
  if (options_.tracker != nullptr) options_.tracker->Add(options_.tracked_kind, block->size_bytes);
  return block->ptr;
}

absl::StatusOr<void*> CachingAllocator::Allocate(int64_t bytes) {
  return AllocateImpl(bytes, nullptr);
}

absl::StatusOr<void*> CachingAllocator::AllocateOnStream(int64_t bytes, Stream& stream) {
  return AllocateImpl(bytes, &stream);
}

std::vector<std::shared_ptr<Event>> CachingAllocator::UnpassedGuardsLocked(const Block* block,
                                                                           const Stream* stream) {
  std::vector<std::shared_ptr<Event>> waits;
  for (const Guard& g : block->guards) {
    if (g.stream == stream) continue;
    const auto it = streams_.find(g.stream);
    if (it == streams_.end() || it->second.passed_seq >= g.seq) continue;
    for (const PendingFree& f : it->second.frees) {
      if (f.seq == g.seq) {
        waits.push_back(f.event);
        break;
      }
    }
  }
  return waits;
}

void* CachingAllocator::TakeGuardedLocked(Block* block, int64_t rounded_bytes,
                                          int64_t requested_bytes, const Stream* stream,
                                          std::vector<std::shared_ptr<Event>>* waits) {
  *waits = UnpassedGuardsLocked(block, stream);
  if (!waits->empty()) ++counters_.pending_free_waits;
  return UseBlockLocked(block, rounded_bytes, requested_bytes);
}

void CachingAllocator::WaitForGuards(const std::vector<std::shared_ptr<Event>>& waits,
                                     Stream* stream) const {
  // The block is the caller's already; it becomes usable once the other streams passed their
  // frees of it: a stream-side wait for a stream-ordered allocation, else a host wait.
  for (const std::shared_ptr<Event>& event : waits) {
    absl::Status status = absl::UnknownError("no stream");
    // The wait is for the event's record at this call (backend.h): once it returns, the event
    // may go back to the pool and be recorded again without moving this wait.
    if (stream != nullptr) status = stream->WaitEvent(event.get());
    if (!status.ok()) status = event->Synchronize();
    LOG_IF(WARNING, !status.ok()) << name_ << ": a stream-ordered free's stream failed: " << status;
  }
}

absl::StatusOr<void*> CachingAllocator::AllocateImpl(int64_t bytes, Stream* stream) {
  if (bytes <= 0) {
    return absl::InvalidArgumentError(absl::StrCat(
        name_, ": cannot allocate ", bytes, " bytes; an allocation must be at least 1 byte"));
  }
  if (bytes > kMaxRequestBytes) {
    {
      MutexLock lock(&mu_);
      ++counters_.failed_allocations;
    }
    return absl::ResourceExhaustedError(absl::StrCat(device_.ToString(), ": out of memory: ", name_,
                                                     " cannot allocate ", FormatBytes(bytes), " (",
                                                     bytes, " bytes): larger than any device"));
  }
  const int64_t rounded_bytes = RoundedSize(bytes);
  std::vector<std::shared_ptr<Event>> waits;
  void* ptr = nullptr;
  {
    MutexLock lock(&mu_);
    ProcessPendingLocked();
    if (Block* block = TakeBestFitLocked(rounded_bytes, stream != nullptr)) {
      ptr = TakeGuardedLocked(block, rounded_bytes, bytes, stream, &waits);
    }
  }
  if (ptr != nullptr) {
    WaitForGuards(waits, stream);
    return ptr;
  }

  // No cached block fits: take a new segment. Without the lock, because an upstream that reclaims
  // calls back into ReleaseCached().
  const int64_t segment_bytes = SegmentSizeFor(bytes);
  absl::StatusOr<void*> base = upstream_->Allocate(segment_bytes);
  if (!base.ok() && absl::IsResourceExhausted(base.status())) {
    // Memory freed on streams that have not got there yet is the last reserve of the host: wait
    // for it. (Also, another thread may have freed a block that fits meanwhile.)
    WaitForPendingFrees();
    {
      MutexLock lock(&mu_);
      if (Block* block = TakeBestFitLocked(rounded_bytes, stream != nullptr)) {
        ptr = TakeGuardedLocked(block, rounded_bytes, bytes, stream, &waits);
      }
    }
    if (ptr != nullptr) {
      WaitForGuards(waits, stream);
      return ptr;
    }
    // Retry only when something changed: an upstream that reclaims (ProviderResource) has already
    // asked this allocator once.
    if (ReleaseCached() > 0) base = upstream_->Allocate(segment_bytes);
  }
  if (!base.ok()) {
    if (!absl::IsResourceExhausted(base.status())) return base.status();
    {
      MutexLock lock(&mu_);
      ++counters_.failed_allocations;
    }
    return absl::ResourceExhaustedError(OutOfMemoryMessage(bytes, segment_bytes, base.status()));
  }

  MutexLock lock(&mu_);
  auto segment = std::make_unique<Segment>();
  segment->base = static_cast<char*>(*base);
  segment->size_bytes = segment_bytes;
  segment->small = IsSmall(rounded_bytes);
  Block* block = NewBlockLocked();
  block->ptr = segment->base;
  block->size_bytes = segment_bytes;
  block->segment = segment.get();
  segment->head = block;
  const bool inserted = segments_.emplace(segment->base, std::move(segment)).second;
  CHECK(inserted) << name_ << ": the upstream returned a live segment again";
  counters_.reserved_bytes += segment_bytes;
  counters_.peak_reserved_bytes = std::max(counters_.peak_reserved_bytes, counters_.reserved_bytes);
  ++counters_.segments;
  ++counters_.upstream_allocations;
  return UseBlockLocked(block, rounded_bytes, bytes);
}

absl::StatusOr<CachingAllocator::Block*> CachingAllocator::TakeAllocationLocked(
    absl::string_view call, void* ptr, int64_t bytes) {
  const auto it = allocated_.find(ptr);
  if (it == allocated_.end()) {
    return absl::InvalidArgumentError(absl::StrCat(
        name_, ": ", call, "(", PointerString(ptr), ", ", bytes,
        " bytes): not a live allocation of this allocator (it belongs to another resource or "
        "was freed already)"));
  }
  Block* block = it->second;
  if (block->requested_bytes != bytes) {
    return absl::InvalidArgumentError(absl::StrCat(
        name_, ": ", call, "(", PointerString(ptr), ", ", bytes, " bytes): it was allocated with ",
        block->requested_bytes, " bytes; pass the size given to Allocate"));
  }
  allocated_.erase(it);
  counters_.requested_bytes -= block->requested_bytes;
  --counters_.live_allocations;
  return block;
}

void CachingAllocator::RestoreAllocationLocked(Block* block) {
  allocated_.emplace(block->ptr, block);
  counters_.requested_bytes += block->requested_bytes;
  ++counters_.live_allocations;
}

void CachingAllocator::FreeBlockLocked(Block* block) {
  counters_.in_use_bytes -= block->size_bytes;
  if (options_.tracker != nullptr) {
    options_.tracker->Subtract(options_.tracked_kind, block->size_bytes);
  }
  block->allocated = false;
  block->requested_bytes = 0;

  FreeSet& free_set = FreeSetOf(block->segment->small);
  if (Block* prev = block->prev; prev != nullptr && !prev->allocated) {
    EraseFree(free_set, prev);  // before its size (the key) changes
    MergeGuards(block->guards, prev->guards);
    prev->size_bytes += block->size_bytes;
    prev->next = block->next;
    if (block->next != nullptr) block->next->prev = prev;
    RecycleBlockLocked(block);
    block = prev;
  }
  if (Block* next = block->next; next != nullptr && !next->allocated) {
    EraseFree(free_set, next);
    MergeGuards(next->guards, block->guards);
    block->size_bytes += next->size_bytes;
    block->next = next->next;
    if (next->next != nullptr) next->next->prev = block;
    RecycleBlockLocked(next);
  }
  free_set.insert(block);
}

absl::Status CachingAllocator::Deallocate(void* ptr, int64_t bytes) {
  MutexLock lock(&mu_);
  absl::StatusOr<Block*> block = TakeAllocationLocked("Deallocate", ptr, bytes);
  if (!block.ok()) return block.status();
  FreeBlockLocked(*block);
  return absl::OkStatus();
}

void CachingAllocator::MergeGuards(const std::vector<Guard>& from, std::vector<Guard>& into) {
  for (const Guard& g : from) {
    bool merged = false;
    for (Guard& h : into) {
      if (h.stream == g.stream) {
        h.seq = std::max(h.seq, g.seq);  // a stream passes its frees in order
        merged = true;
        break;
      }
    }
    if (!merged) into.push_back(g);
  }
}

absl::StatusOr<std::shared_ptr<Event>> CachingAllocator::TakeEvent() {
  std::unique_ptr<Event> event;
  {
    MutexLock lock(&event_pool_->mu);
    if (!event_pool_->events.empty()) {
      event = std::move(event_pool_->events.back());
      event_pool_->events.pop_back();
    }
  }
  if (event == nullptr) {
    absl::StatusOr<std::unique_ptr<Event>> made = options_.event_backend->CreateEvent();
    if (!made.ok()) return made.status();
    event = *std::move(made);
    MutexLock lock(&mu_);
    ++counters_.events_created;
  }
  // The last reference goes back to the pool, never destroys the event: the pending free's
  // reference is dropped only once its completion was seen (ProcessPendingLocked), a waiter's
  // once its WaitEvent or Synchronize returned. Pooling also keeps cudaEventDestroy out of the
  // threads that drop references.
  return std::shared_ptr<Event>(event.release(), [pool = event_pool_](Event* e) {
    MutexLock lock(&pool->mu);
    pool->events.emplace_back(e);
  });
}

absl::Status CachingAllocator::DeallocateOnStream(void* ptr, int64_t bytes, Stream& stream) {
  if (options_.event_backend == nullptr) {
    return absl::FailedPreconditionError(absl::StrCat(
        name_,
        ": DeallocateOnStream needs CachingAllocatorOptions.event_backend (the backend "
        "whose streams order the frees); without it, synchronize and call Deallocate"));
  }
  Block* block = nullptr;
  {
    MutexLock lock(&mu_);
    absl::StatusOr<Block*> taken = TakeAllocationLocked("DeallocateOnStream", ptr, bytes);
    if (!taken.ok()) return taken.status();
    block = *taken;
  }
  // The block is out of allocated_ (a second free of `ptr` fails) but not yet free.
  absl::StatusOr<std::shared_ptr<Event>> taken_event = TakeEvent();
  absl::Status status = taken_event.status();
  std::shared_ptr<Event> event;
  if (taken_event.ok()) {
    event = *std::move(taken_event);
    // A pooled event's last record completed, and no wait refers to it: re-recording it is a
    // fresh record (a failed record leaves it so; dropping `event` then pools it again).
    status = stream.RecordEvent(event.get());
  }
  MutexLock lock(&mu_);
  if (!status.ok()) {
    RestoreAllocationLocked(block);
    return absl::Status(
        status.code(), absl::StrCat(name_, ": DeallocateOnStream(", PointerString(ptr), ", ", bytes,
                                    " bytes): ", status.message()));
  }
  StreamFrees& frees = streams_[&stream];
  const uint64_t seq = ++frees.next_seq;
  frees.frees.push_back({.seq = seq, .event = std::move(event), .bytes = block->size_bytes});
  ++counters_.pending_frees;
  counters_.pending_free_bytes += block->size_bytes;
  ++counters_.stream_ordered_frees;
  block->guards.push_back({.stream = &stream, .seq = seq});
  FreeBlockLocked(block);  // free for `stream` at once; for the rest once the stream passed
  return absl::OkStatus();
}

int64_t CachingAllocator::ProcessPendingLocked() {
  int64_t passed_bytes = 0;
  for (auto& [stream, frees] : streams_) {
    while (!frees.frees.empty() && frees.frees.front().event->Query()) {
      const PendingFree& f = frees.frees.front();
      frees.passed_seq = std::max(frees.passed_seq, f.seq);
      --counters_.pending_frees;
      counters_.pending_free_bytes -= f.bytes;
      passed_bytes += f.bytes;
      frees.frees.pop_front();
    }
  }
  return passed_bytes;
}

int64_t CachingAllocator::ProcessPendingFrees() {
  MutexLock lock(&mu_);
  return ProcessPendingLocked();
}

void CachingAllocator::WaitForPendingFrees() {
  std::vector<std::shared_ptr<Event>> events;
  {
    MutexLock lock(&mu_);
    ProcessPendingLocked();
    // A stream completes its work in order: its latest free covers the earlier ones.
    for (const auto& [stream, frees] : streams_) {
      if (!frees.frees.empty()) events.push_back(frees.frees.back().event);
    }
  }
  if (events.empty()) return;
  for (const std::shared_ptr<Event>& event : events) {
    // An error is the stream's asynchronous failure: its work has still completed.
    const absl::Status status = event->Synchronize();
    LOG_IF(WARNING, !status.ok()) << name_ << ": a stream-ordered free's stream failed: " << status;
  }
  MutexLock lock(&mu_);
  ++counters_.pending_free_waits;
  ProcessPendingLocked();
}

int64_t CachingAllocator::ReleaseCached() {
  WaitForPendingFrees();
  std::vector<std::pair<char*, int64_t>> released;
  {
    MutexLock lock(&mu_);
    ProcessPendingLocked();
    for (const auto& [base, segment] : segments_) {
      Block* head = segment->head;
      if (head->allocated || head->next != nullptr) continue;
      // Freed on a stream after the wait above, by another thread: not the device's yet.
      if (!UnpassedGuardsLocked(head, nullptr).empty()) continue;
      DCHECK_EQ(head->size_bytes, segment->size_bytes);
      EraseFree(FreeSetOf(segment->small), head);
      RecycleBlockLocked(head);
      released.emplace_back(segment->base, segment->size_bytes);
    }
    for (const auto& [base, size_bytes] : released) {
      segments_.erase(base);
      counters_.reserved_bytes -= size_bytes;
      --counters_.segments;
      ++counters_.upstream_deallocations;
    }
  }
  int64_t released_bytes = 0;
  for (const auto& [base, size_bytes] : released) {
    const absl::Status status = upstream_->Deallocate(base, size_bytes);
    LOG_IF(ERROR, !status.ok()) << name_ << ": returning a cached segment upstream: " << status;
    released_bytes += size_bytes;
  }
  return released_bytes;
}

CachingAllocatorStats CachingAllocator::StatsLocked() const {
  CachingAllocatorStats stats = counters_;
  stats.cached_bytes = stats.reserved_bytes - stats.in_use_bytes;
  stats.free_blocks = static_cast<int64_t>(small_free_.size() + large_free_.size());
  int64_t largest_bytes = 0;
  if (!small_free_.empty()) largest_bytes = (*small_free_.rbegin())->size_bytes;
  if (!large_free_.empty()) {
    largest_bytes = std::max(largest_bytes, (*large_free_.rbegin())->size_bytes);
  }
  stats.largest_free_block_bytes = largest_bytes;
  for (const auto& [base, segment] : segments_) {
    const Block* head = segment->head;
    if (!head->allocated && head->next == nullptr) stats.free_segment_bytes += segment->size_bytes;
  }
  stats.fragmentation = stats.cached_bytes == 0 ? 0.0
                                                : 1.0 - static_cast<double>(largest_bytes) /
                                                            static_cast<double>(stats.cached_bytes);
  return stats;
}

CachingAllocatorStats CachingAllocator::stats() const {
  MutexLock lock(&mu_);
  return StatsLocked();
}

void CachingAllocator::ResetPeakStats() {
  MutexLock lock(&mu_);
  counters_.peak_in_use_bytes = counters_.in_use_bytes;
  counters_.peak_reserved_bytes = counters_.reserved_bytes;
}

std::string CachingAllocator::OutOfMemoryMessage(int64_t bytes, int64_t segment_bytes,
                                                 const absl::Status& upstream_status) const {
  const CachingAllocatorStats stats = this->stats();
  return absl::StrCat(
      device_.ToString(), ": out of memory: ", name_, " cannot allocate ", FormatBytes(bytes), " (",
      bytes, " bytes): no cached block fits, so it needs a new ", FormatBytes(segment_bytes),
      " segment, and the upstream refused it even after this allocator returned its fully free "
      "segments. It holds ",
      FormatBytes(stats.reserved_bytes), " reserved in ", stats.segments, " segments, ",
      FormatBytes(stats.in_use_bytes), " in use, ", FormatBytes(stats.cached_bytes),
      " free (largest free block ", FormatBytes(stats.largest_free_block_bytes), ", fragmentation ",
      Percent(stats.fragmentation), "). Upstream: ", upstream_status.message());
}

}  // namespace ps
