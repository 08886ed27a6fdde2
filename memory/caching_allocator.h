// CachingAllocator: variable-size allocations for non-model data (activations, gradients of
// activations, workspaces), carved from large segments that are kept cached.
//
// Asking a device for memory is slow (cudaMalloc synchronizes the device) and a training iteration
// makes thousands of short-lived allocations of a few hundred distinct sizes, so — like PyTorch's
// CUDACachingAllocator — this allocator takes big segments from its upstream and serves requests
// from them:
//  - Every request is rounded up to a multiple of `round_bytes` (512 B).
//  - Small requests (rounded size <= small_request_max_bytes, 1 MiB) share small segments of
//    small_segment_bytes (2 MiB); large requests get segments of their size rounded up to a
//    multiple of large_segment_round_bytes (2 MiB). Small and large blocks never mix, so a stream
//    of tiny allocations cannot pin down a large segment.
//  - A request is served by the best-fitting free block of its class: the smallest that is big
//    enough, the lowest address among equals (an ordered set keyed by (size, address)).
//  - The block is split when the remainder is worth keeping: for small blocks any remainder (it is
//    at least round_bytes), for large blocks a remainder above small_request_max_bytes — a smaller
//    tail stays part of the allocation rather than becoming a sliver no large request fits.
//  - A freed block is merged with its free neighbours in the same segment at once, so two free
//    blocks are never adjacent.
//  - A segment whose blocks are all free stays cached (counted in reserved_bytes) until
//    ReleaseCached() — called by the device resource when another pool of the device runs short
//    (this class is a Reclaimer) — or until an upstream allocation fails: then this allocator
//    returns all its fully free segments and, if there were any, retries once before reporting
//    ResourceExhausted.
//
// The allocator never reads or writes the memory it manages (it may be accelerator memory).
//
// Two ways to free, two ways to allocate:
//  - Deallocate (the MemoryResource call) is not stream-ordered: the block is reusable as soon as
//    it returns, so the caller must first make sure no stream still reads or writes it
//    (synchronize, or wait on an event recorded after the last use).
//  - DeallocateOnStream(ptr, bytes, stream) is stream-ordered, as cudaFreeAsync: it returns at
//    once and the block is free at once — merged with its free neighbours exactly as Deallocate
//    would — but *guarded* by `stream`: the allocator records an event on `stream`, and the block
//    (and any free block it is merged into or split from) may be used by anything other than
//    `stream` only after the event completed. As in PyTorch's caching allocator, later work on
//    `stream` itself may reuse it at once, because stream order runs it after every kernel
//    enqueued before the free. Work on other streams is not covered: make `stream` wait for it
//    first (Stream::WaitEvent), which is what PyTorch's record_stream achieves.
//  - AllocateOnStream(bytes, stream) is the stream-ordered allocation: the memory is for work
//    enqueued on `stream` from now on. It takes the best-fitting free block, whatever guards it:
//    guards of `stream` need nothing; for a guard of another stream whose free has not completed,
//    `stream` waits for that free's event (Stream::WaitEvent, no host wait).
//    So the choice of block never depends on how far a stream has got: a program that allocates
//    and frees on one stream gets exactly the blocks (and the statistics) it would get with
//    Allocate and Deallocate — which is what the memory plan replays.
//  - Allocate (the MemoryResource call) is for the host or any stream, at once: it passes over
//    free blocks whose stream-ordered frees have not completed (best fit among the others, or a
//    new segment); only when the upstream is out of memory does the host wait for the pending
//    frees and try them.
//  - The events of stream-ordered frees are pooled, as PyTorch's caching allocator pools its
//    CUDA events, so a training step does not pay an event creation and destruction (on the cuda
//    backend cudaEventCreate + cudaEventDestroy) per free: DeallocateOnStream records an event
//    from the allocator's free list and creates one only when the list is empty
//    (stats().events_created). An event goes back to the list when the last reference to it is
//    dropped, which is only once (a) the allocator has seen its free complete — Event::Query at
//    an allocation or ProcessPendingFrees, or the host wait of an allocation under pressure, of
//    ReleaseCached or of the destructor — and dropped the pending free, so no guard of a free
//    block can reach the event any more (a guard names its free by stream and sequence number;
//    once the stream has passed the free, the guard never looks for its event), and (b) every
//    wait that took the event while the free was pending has been enqueued (Stream::WaitEvent)
//    or has returned (Event::Synchronize). Re-recording is then safe in both backends: the
//    event's previous record completed, and a stream wait is for the record current when
//    WaitEvent was called, not for a later one (cudaStreamWaitEvent's rule, and the cpu
//    backend's: the wait keeps the record's generation). So the events alive at once are the
//    pending frees plus the events of waits being enqueued right now; a recycled event never
//    marks an earlier free as passed.
//    Guards are checked (Event::Query, never blocking) at every allocation and at
//    ProcessPendingFrees. ReleaseCached (the device's other pool needs memory, or an upstream
//    allocation failed) waits on the host for every pending free before it returns segments, so
//    memory never leaves this allocator while a queued kernel may still use it. Hence Allocate
//    and ReleaseCached must not run in a host function on a stream (a stream would wait for
//    itself).
//
// Accounting: in_use_bytes counts whole blocks handed out (a request rounded up, plus an unsplit
// tail); a stream-ordered free leaves it at the call, as a plain free does, so the tracker's tide
// moves at the program's points and not at the stream's — the same tide on every run, the one the
// memory plan replays. The device never holds more than the cap for it: a block freed on a stream
// stays in this allocator's segments (reserved_bytes, which the device's cap bounds) and is used
// again only in stream order or after the stream passed the free. pending_frees and
// pending_free_bytes say how many stream-ordered frees the allocator has not yet seen completed
// (informational; that memory is counted cached). With a tracker, exactly in_use_bytes is recorded
// as `tracked_kind` (non-model data by default). reserved_bytes counts segments held from the
// upstream.
//
// Thread safety: thread-safe. The upstream is called without the allocator's lock held, so an
// upstream that reclaims (ProviderResource) may call back into ReleaseCached(). Streams and events
// are never waited on with the lock held; Event::Query is called under it.
#ifndef PATRICKSTAR_MEMORY_CACHING_ALLOCATOR_H_
#define PATRICKSTAR_MEMORY_CACHING_ALLOCATOR_H_

#include <cstdint>
#include <deque>
#include <memory>
#include <string>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/container/btree_set.h"
#include "absl/container/flat_hash_map.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "base/mutex.h"
#include "base/units.h"
#include "memory/backend.h"
#include "memory/device.h"
#include "memory/memory_resource.h"
#include "memory/memory_tracker.h"

namespace ps {

struct CachingAllocatorOptions {
  // Requests are rounded up to a multiple of this. A positive multiple of kAllocationAlignment.
  int64_t round_bytes = 512;
  // Rounded requests up to this size are small. Positive, a multiple of round_bytes.
  int64_t small_request_max_bytes = 1 * kMiB;
  // Size of every small segment. A multiple of round_bytes, >= small_request_max_bytes.
  int64_t small_segment_bytes = 2 * kMiB;
  // Large segments are the rounded request rounded up to a multiple of this. A positive multiple
  // of round_bytes.
  int64_t large_segment_round_bytes = 2 * kMiB;
  // Where in_use_bytes is recorded, if anywhere. Not owned; must outlive the allocator and account
  // the upstream's device.
  MemoryTracker* tracker = nullptr;
  MemoryKind tracked_kind = MemoryKind::kNonModelData;
  // Where the events of stream-ordered frees come from: the backend whose streams are passed to
  // DeallocateOnStream. Not owned; must outlive the allocator. Without it DeallocateOnStream is
  // FailedPrecondition.
  Backend* event_backend = nullptr;
};

struct CachingAllocatorStats {
  // Bytes of blocks handed out (see the file comment), and the sum of the requests behind them.
  int64_t in_use_bytes = 0;
  int64_t requested_bytes = 0;
  // Bytes of segments held from the upstream, and the free part of them (reserved - in use).
  int64_t reserved_bytes = 0;
  int64_t cached_bytes = 0;
  // Highs since construction or the last ResetPeakStats().
  int64_t peak_in_use_bytes = 0;
  int64_t peak_reserved_bytes = 0;
  // Segments held now.
  int64_t segments = 0;
  // Live allocations now, and successful Allocate calls since construction.
  int64_t live_allocations = 0;
  int64_t total_allocations = 0;
  // Segments taken from and returned to the upstream since construction.
  int64_t upstream_allocations = 0;
  int64_t upstream_deallocations = 0;
  // Allocate calls that ended in ResourceExhausted.
  int64_t failed_allocations = 0;
  // Stream-ordered frees whose stream has not (as far as the allocator has seen) passed them yet:
  // their count and bytes (not in in_use_bytes: that memory is cached, guarded by its stream).
  // Since construction: stream-ordered frees, and the times the allocator waited for pending
  // frees (a host wait under memory pressure, or a wait for another stream's free of a block).
  int64_t pending_frees = 0;
  int64_t pending_free_bytes = 0;
  int64_t stream_ordered_frees = 0;
  int64_t pending_free_waits = 0;
  // Events the allocator has created (Backend::CreateEvent) since construction. Events are
  // pooled (see the file comment), so this stays at the most stream-ordered frees pending at
  // once (plus waits being enqueued concurrently), not at stream_ordered_frees.
  int64_t events_created = 0;
  // Bytes of the segments with no block in use (what ReleaseCached would give back now); the rest
  // of cached_bytes is free space inside segments still in use, which only a free can recover.
  int64_t free_segment_bytes = 0;
  // Free blocks now, and the largest of them.
  int64_t free_blocks = 0;
  int64_t largest_free_block_bytes = 0;
  // 1 - largest_free_block_bytes / cached_bytes: 0 when all free memory is one block (or there is
  // none), close to 1 when it is scattered in many small pieces.
  double fragmentation = 0;

  // Several lines for logs.
  std::string DebugString() const;
};

class CachingAllocator final : public MemoryResource, public Reclaimer {
 public:
  // Returns InvalidArgument, naming the option, for a null upstream or options that break the
  // rules in CachingAllocatorOptions. `upstream` is not owned and must outlive the allocator.
  static absl::StatusOr<std::unique_ptr<CachingAllocator>> Create(
      MemoryResource* upstream, const CachingAllocatorOptions& options = {});

  CachingAllocator(const CachingAllocator&) = delete;
  CachingAllocator& operator=(const CachingAllocator&) = delete;

  // Returns every segment to the upstream (logging a warning if allocations are still live: their
  // owners now hold dangling pointers).
  ~CachingAllocator() override;

  // MemoryResource. Allocate: InvalidArgument for bytes <= 0; ResourceExhausted when a new segment
  // is needed and the upstream refuses it even after this allocator released its cached segments
  // (the message names the device, the request, this allocator's holdings and fragmentation, and
  // carries the upstream's explanation). Deallocate: `bytes` must be the size given to Allocate;
  // InvalidArgument, with no state changed, for a pointer that is not a live allocation or a
  // different size.
  [[nodiscard]] absl::StatusOr<void*> Allocate(int64_t bytes) override;
  // Stream-ordered allocation (see the file comment): the memory is for work enqueued on `stream`
  // after this call. Errors as Allocate. `stream` must be of options.event_backend's backend.
  [[nodiscard]] absl::StatusOr<void*> AllocateOnStream(int64_t bytes, Stream& stream);
  [[nodiscard]] absl::Status Deallocate(void* ptr, int64_t bytes) override;

  // Stream-ordered free (see the file comment): `ptr` is no longer the caller's when this returns;
  // its block is reused at once by work on `stream`, by anything else only after all work
  // enqueued on `stream` before this call completed.
  // The event comes from the allocator's pool; a new one is created only when the pool is empty.
  // Errors, with no state changed: InvalidArgument as Deallocate; FailedPrecondition without
  // options.event_backend; the error of creating or recording the event (InvalidArgument for a
  // stream of another backend; the event goes back to the pool).
  [[nodiscard]] absl::Status DeallocateOnStream(void* ptr, int64_t bytes, Stream& stream);

  // Notes the pending frees whose streams have passed them (their blocks become usable by every
  // stream and the host without a wait). Never blocks. Returns their bytes.
  int64_t ProcessPendingFrees();
  Device device() const override { return device_; }
  // "caching_allocator(accelerator:0)".
  std::string name() const override { return name_; }

  // Reclaimer: waits for the pending stream-ordered frees (a host wait: it is called when memory
  // ran out, and that memory is about to be free anyway), then returns every fully free segment to
  // the upstream; returns the bytes given back.
  int64_t ReleaseCached() override;

  CachingAllocatorStats stats() const;
  // Sets the peaks to the current values.
  void ResetPeakStats();

  // The size a request of `bytes` is rounded to. REQUIRES: bytes > 0.
  int64_t RoundedSize(int64_t bytes) const { return AlignUp(bytes, options_.round_bytes); }
  // The size of the segment a new segment for a request of `bytes` would have.
  int64_t SegmentSizeFor(int64_t bytes) const;
  const CachingAllocatorOptions& options() const { return options_; }

 private:
  struct Segment;
  // "Usable by others once `stream` passed its seq-th stream-ordered free."
  struct Guard {
    const Stream* stream = nullptr;
    uint64_t seq = 0;
  };
  // Events whose last reference was dropped, ready to be recorded again. Shared with the deleters
  // of the events handed out (TakeEvent), so it lives as long as any of them. `mu` is a leaf lock:
  // taken under mu_ (a pending free dropped) and without it (a waiter's reference dropped).
  struct EventPool {
    Mutex mu;
    std::vector<std::unique_ptr<Event>> events ABSL_GUARDED_BY(mu);
  };
  struct PendingFree {
    uint64_t seq = 0;
    // From TakeEvent; shared with waiters outside the lock. Dropping the last reference returns
    // the event to the pool.
    std::shared_ptr<Event> event;
    int64_t bytes = 0;
  };
  // The stream-ordered frees of one stream: those not yet seen completed, oldest first, and the
  // latest seen completed.
  struct StreamFrees {
    uint64_t next_seq = 0;
    uint64_t passed_seq = 0;
    std::deque<PendingFree> frees;
  };
  // A contiguous piece of a segment, free or handed out. The blocks of a segment form a
  // doubly-linked list in address order; the first block of a segment never goes away (merges
  // keep the lower block), so Segment::head stays valid.
  struct Block {
    char* ptr = nullptr;
    int64_t size_bytes = 0;
    // Handed out: not free, never merged.
    bool allocated = false;
    // A free block's stream-ordered frees, at most one per stream (its latest).
    std::vector<Guard> guards;
    int64_t requested_bytes = 0;
    Block* prev = nullptr;
    Block* next = nullptr;
    Segment* segment = nullptr;
  };
  struct Segment {
    char* base = nullptr;
    int64_t size_bytes = 0;
    bool small = false;
    Block* head = nullptr;
  };
  // Orders free blocks for best fit: by size, then by address.
  struct BlockLess {
    bool operator()(const Block* a, const Block* b) const {
      if (a->size_bytes != b->size_bytes) return a->size_bytes < b->size_bytes;
      return a->ptr < b->ptr;
    }
  };
  using FreeSet = absl::btree_set<Block*, BlockLess>;

  CachingAllocator(MemoryResource* upstream, const CachingAllocatorOptions& options);

  bool IsSmall(int64_t rounded_bytes) const {
    return rounded_bytes <= options_.small_request_max_bytes;
  }
  FreeSet& FreeSetOf(bool small) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    return small ? small_free_ : large_free_;
  }
  // Block objects are recycled through spare_blocks_ rather than freed, which keeps the
  // split-and-merge of every allocate/free pair away from the C++ heap.
  Block* NewBlockLocked() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  void RecycleBlockLocked(Block* block) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Removes `block`, which must be in `free_set`, from it.
  static void EraseFree(FreeSet& free_set, Block* block);
  // The best-fitting free block of at least `rounded_bytes` in its class, removed from its free
  // set; nullptr when none fits. Unless `for_stream`, blocks whose stream-ordered frees have not
  // completed are passed over.
  Block* TakeBestFitLocked(int64_t rounded_bytes, bool for_stream)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Validates a free of `ptr` (`call` names the method in errors) and takes it away from the
  // caller: out of allocated_, out of the live counters (in_use_bytes unchanged).
  absl::StatusOr<Block*> TakeAllocationLocked(absl::string_view call, void* ptr, int64_t bytes)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Undoes TakeAllocationLocked.
  void RestoreAllocationLocked(Block* block) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Returns `block` (allocated, in no free set) to the cache: merges it with free neighbours.
  void FreeBlockLocked(Block* block) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  absl::StatusOr<void*> AllocateImpl(int64_t bytes, Stream* stream) ABSL_LOCKS_EXCLUDED(mu_);
  // `into` gets the guards of `from` (one per stream, the later free).
  static void MergeGuards(const std::vector<Guard>& from, std::vector<Guard>& into);
  // The events of `block`'s guards whose frees have not completed, except `stream`'s.
  std::vector<std::shared_ptr<Event>> UnpassedGuardsLocked(const Block* block, const Stream* stream)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Hands out `block` for a request on `stream` (nullptr: the host), with the events to wait for.
  void* TakeGuardedLocked(Block* block, int64_t rounded_bytes, int64_t requested_bytes,
                          const Stream* stream, std::vector<std::shared_ptr<Event>>* waits)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Makes `stream` wait for `waits` (the host when `stream` is null or its wait fails).
  void WaitForGuards(const std::vector<std::shared_ptr<Event>>& waits, Stream* stream) const
      ABSL_LOCKS_EXCLUDED(mu_);
  // An event for a stream-ordered free: from the pool, else new from options_.event_backend
  // (counted in events_created). The returned pointer's last reference puts it back in the pool.
  // Errors: CreateEvent's.
  absl::StatusOr<std::shared_ptr<Event>> TakeEvent() ABSL_LOCKS_EXCLUDED(mu_);
  // Notes the pending frees whose events have completed (dropping their events' references, see
  // the file comment); returns their bytes.
  int64_t ProcessPendingLocked() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Blocks (without the lock) until every pending free's stream has passed it, then notes
  // them.
  void WaitForPendingFrees() ABSL_LOCKS_EXCLUDED(mu_);
  // Hands out `block` (not in any free set) for a request, splitting off a worthwhile remainder.
  void* UseBlockLocked(Block* block, int64_t rounded_bytes, int64_t requested_bytes)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  std::string OutOfMemoryMessage(int64_t bytes, int64_t segment_bytes,
                                 const absl::Status& upstream_status) const
      ABSL_LOCKS_EXCLUDED(mu_);
  CachingAllocatorStats StatsLocked() const ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);

  MemoryResource* const upstream_;
  const Device device_;
  const std::string name_;
  const CachingAllocatorOptions options_;

  mutable Mutex mu_;
  FreeSet small_free_ ABSL_GUARDED_BY(mu_);
  FreeSet large_free_ ABSL_GUARDED_BY(mu_);
  // Live allocations by address.
  absl::flat_hash_map<void*, Block*> allocated_ ABSL_GUARDED_BY(mu_);
  // Segments by base address; owns the Segment objects (Blocks are owned through the lists).
  absl::flat_hash_map<char*, std::unique_ptr<Segment>> segments_ ABSL_GUARDED_BY(mu_);
  // Block objects not in any list, for reuse. Owned.
  std::vector<Block*> spare_blocks_ ABSL_GUARDED_BY(mu_);
  // Stream-ordered frees by stream.
  absl::flat_hash_map<const Stream*, StreamFrees> streams_ ABSL_GUARDED_BY(mu_);
  // Never null. The deleters of the events handed out share it, so it outlives the allocator
  // while a waiter still holds an event.
  const std::shared_ptr<EventPool> event_pool_;
  // The counters of CachingAllocatorStats that are kept rather than computed.
  CachingAllocatorStats counters_ ABSL_GUARDED_BY(mu_);
};

}  // namespace ps

#endif  // PATRICKSTAR_MEMORY_CACHING_ALLOCATOR_H_
