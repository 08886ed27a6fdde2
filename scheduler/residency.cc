#include "scheduler/residency.h"

#include <algorithm>
#include <tuple>
#include <utility>

#include "absl/strings/str_cat.h"
#include "base/status_macros.h"
#include "base/units.h"
#include "chunk/chunk_type.h"
#include "glog/logging.h"
#include "memory/memory_tracker.h"

namespace ps {

absl::StatusOr<std::unique_ptr<ResidencyEngine>> ResidencyEngine::Create(
    ChunkStore* store, Backend* backend, DeviceMemory* accelerator, DeviceMemory* host,
    ResidencyOptions options, ChunkManagerCounters* counters) {
  if (store == nullptr || backend == nullptr || accelerator == nullptr || host == nullptr ||
      counters == nullptr) {
    return absl::InvalidArgumentError(
        "ResidencyEngine::Create: store, backend, accelerator, host and counters must all be "
        "given");
  }
  std::unique_ptr<ResidencyEngine> engine(
      new ResidencyEngine(store, backend, accelerator, host, std::move(options), counters));
  for (ChunkType type : kAllChunkTypes) {
    const int64_t bytes = store->layout().ChunkBytes(type, store->compute_dtype());
    for (DeviceMemory* memory : {accelerator, host}) {
      if (memory->chunk_pool_for(bytes) == nullptr) {
        return absl::InvalidArgumentError(absl::StrCat(
            "ResidencyEngine: a ", ChunkTypeName(type), " chunk needs ", FormatBytes(bytes),
            " but no chunk pool of ", memory->device().ToString(), " has blocks that large"));
      }
    }
    engine->cost_bytes_[static_cast<size_t>(type)] =
        accelerator->chunk_pool_for(bytes)->block_bytes();
  }
  ASSIGN_OR_RETURN(engine->load_stream_, backend->CreateStream());
  ASSIGN_OR_RETURN(engine->store_stream_, backend->CreateStream());
  ASSIGN_OR_RETURN(engine->compute_done_, backend->CreateEvent());
  ASSIGN_OR_RETURN(engine->loads_done_, backend->CreateEvent());
  ASSIGN_OR_RETURN(engine->stores_done_, backend->CreateEvent());
  return engine;
}

ResidencyEngine::ResidencyEngine(ChunkStore* store, Backend* backend, DeviceMemory* accelerator,
                                 DeviceMemory* host, ResidencyOptions options,
                                 ChunkManagerCounters* counters)
    : store_(store),
      backend_(backend),
      accel_(accelerator),
      host_(host),
      options_(std::move(options)),
      counters_(counters),
      keys_(store->num_chunks()) {}

ResidencyEngine::~ResidencyEngine() {
  if (compute_waits_on_loads_) {
    // The compute stream may still have to pass a wait on loads_done_, which dies with the engine.
    absl::Status s = options_.compute_stream->RecordEvent(compute_done_.get());
    compute_pending_ = true;
    LOG_IF(ERROR, !s.ok()) << "ChunkManager: compute stream failed at destruction: " << s;
  }
  if (compute_pending_) {
    // The caller's compute stream still has to complete the event this engine owns.
    absl::Status s = compute_done_->Synchronize();
    LOG_IF(ERROR, !s.ok()) << "ChunkManager: compute stream failed at destruction: " << s;
  }
  for (Stream* stream : {load_stream_.get(), store_stream_.get()}) {
    if (stream == nullptr) continue;
    absl::Status s = stream->Synchronize();
    LOG_IF(ERROR, !s.ok()) << "ChunkManager: copy stream failed at destruction: " << s;
  }
}

std::vector<int64_t> ResidencyEngine::ResidentKeys() const {
  std::vector<int64_t> keys(resident_.begin(), resident_.end());
  std::sort(keys.begin(), keys.end());
  return keys;
}

int64_t ResidencyEngine::StuckBytes(const absl::flat_hash_set<int64_t>& keep) const {
  int64_t stuck = 0;
  for (int64_t key : resident_) {
    if (!keep.contains(key) && !chunk(key).movable()) stuck += key_cost_bytes(key);
  }
  return stuck;
}

// --- Events --------------------------------------------------------------------------------------

ChunkMoveEvent ResidencyEngine::MoveEvent(ChunkMoveKind kind, const Chunk& chunk,
                                          MoveContext context) const {
  ChunkMoveEvent e;
  e.kind = kind;
  e.chunk = chunk.id();
  e.bytes = IsCopy(kind) ? chunk.capacity_bytes() : 0;
  e.stage = context.stage;
  e.moment = context.moment;
  return e;
}

absl::Status ResidencyEngine::TimedCopy(Stream& stream, ChunkMoveEvent event,
                                        const std::function<absl::Status()>& enqueue) {
  ChunkEventListener* listener = options_.listener;
  if (listener == nullptr) return enqueue();
  const MonotonicClock clock = options_.clock;
  // Written by the first host function and read by the second, on the same stream thread (a
  // stream runs its work in order), so no synchronization is needed beyond the stream's own.
  auto start_ns = std::make_shared<int64_t>(0);
  RETURN_IF_ERROR(stream.LaunchHostFunc([start_ns, clock] { *start_ns = clock.now_ns(); }));
  RETURN_IF_ERROR(enqueue());
  return stream.LaunchHostFunc([start_ns, clock, listener, event]() mutable {
    event.start_ns = *start_ns;
    event.end_ns = clock.now_ns();
    listener->OnChunkMove(event);
  });
}

void ResidencyEngine::ReportMove(ChunkMoveKind kind, int64_t key, MoveContext context) {
  if (options_.listener == nullptr) return;
  ChunkMoveEvent e = MoveEvent(kind, chunk(key), context);
  e.start_ns = e.end_ns = NowNs();
  options_.listener->OnChunkMove(e);
}

void ResidencyEngine::ReportAccess(absl::string_view name, int64_t chunk_index, Stage stage,
                                   int64_t moment, bool warmup, int64_t request_ns) const {
  if (options_.listener == nullptr) return;
  ChunkAccessEvent e;
  e.name = name;
  e.chunk_index = chunk_index;
  e.stage = stage;
  e.moment = moment;
  e.warmup = warmup;
  e.request_ns = request_ns;
  e.ready_ns = NowNs();
  e.resident_bytes = resident_bytes_;
  e.accelerator_model_bytes = accel_->tracker()->current_bytes(MemoryKind::kModelData);
  e.accelerator_non_model_bytes = accel_->tracker()->current_bytes(MemoryKind::kNonModelData);
  options_.listener->OnAccess(e);
}

void ResidencyEngine::ReportRelease(absl::string_view name, int64_t chunk_index,
                                    Stage stage) const {
  if (options_.listener != nullptr) options_.listener->OnRelease(name, chunk_index, stage, NowNs());
}

// --- Moves ---------------------------------------------------------------------------------------

absl::Status ResidencyEngine::Load(const std::vector<int64_t>& keys, MoveContext context,
                                   bool prefetch) {
  TransferCounters& c = traffic(context.stage);
  std::vector<int64_t> copied;
  absl::Status status = absl::OkStatus();
  for (int64_t key : keys) {
    Chunk& ch = chunk(key);
    if (!ch.has_payload()) {
      status = ch.AllocatePayload(*accel_->chunk_pool_for(ch.capacity_bytes()));
      if (!status.ok()) break;
      ++c.allocations;
      ReportMove(ChunkMoveKind::kAllocation, key, context);
    } else if (ch.device().is_host()) {
      status = TimedCopy(
          *load_stream_,
          MoveEvent(prefetch ? ChunkMoveKind::kPrefetch : ChunkMoveKind::kLoad, ch, context), [&] {
            return ch.CopyToKeepingBacking(*accel_->chunk_pool_for(ch.capacity_bytes()),
                                           *load_stream_);
          });
      if (!status.ok()) break;
      copied.push_back(key);
      ++c.loads;
      c.load_bytes += ch.capacity_bytes();
    } else {
      status = absl::InternalError(
          absl::StrCat("chunk ", ch.id().ToString(), " is on the accelerator but not tracked"));
      break;
    }
    VLOG(2) << "moment " << context.moment << ": " << (prefetch ? "prefetch " : "load ") << ch.id();
    resident_.insert(key);
    resident_bytes_ += key_cost_bytes(key);
    if (prefetch) {
      prefetched_.insert(key);
      ++counters_->prefetches;
    }
  }
  if (!copied.empty()) {
    ASSIGN_OR_RETURN(std::shared_ptr<Event> event, backend_->CreateEvent());
    RETURN_IF_ERROR(load_stream_->RecordEvent(event.get()));
    for (int64_t key : copied) pending_[key] = event;
  }
  return status;
}

absl::Status ResidencyEngine::Evict(const std::vector<int64_t>& victims, MoveContext context,
                                    int64_t* evicted) {
  if (victims.empty()) return absl::OkStatus();
  RETURN_IF_ERROR(WaitForCopies(victims));
  TransferCounters& c = traffic(context.stage);
  std::vector<int64_t> dirty, to_disk;
  for (int64_t key : victims) {
    const Chunk& ch = chunk(key);
    if (ch.backing_valid()) continue;
    if (dropper_ != nullptr && !ch.has_backing() && dropper_->CanDropToDisk(key)) {
      to_disk.push_back(key);
    } else {
      dirty.push_back(key);
    }
  }
  // Kernels enqueued before the last release may still use a victim. A clean drop frees the block
  // on the host at once: the host waits for them. Write-backs only: the store stream waits for
  // them, and the host waits for the store stream below anyway.
  const bool compute_waited_by_store = compute_pending_ && dirty.size() == victims.size();
  if (compute_waited_by_store) {
    RETURN_IF_ERROR(store_stream_->WaitEvent(compute_done_.get()));
  } else {
    RETURN_IF_ERROR(WaitForCompute());
  }
  absl::Status written = absl::OkStatus();
  int64_t enqueued = 0;
  for (int64_t key : dirty) {
    Chunk& ch = chunk(key);
    written = TimedCopy(*store_stream_, MoveEvent(ChunkMoveKind::kWriteBack, ch, context), [&] {
      return ch.WriteBackAsync(*store_stream_, host_->chunk_pool_for(ch.capacity_bytes()));
    });
    if (!written.ok()) break;
    ++enqueued;
    ++c.write_backs;
    c.write_back_bytes += ch.capacity_bytes();
    if (frozen_param(key)) counters_->frozen_writeback_bytes += ch.capacity_bytes();
  }
  // Wait even after a failure: a chunk whose write-back is enqueued counts as clean.
  if (enqueued > 0 || compute_waited_by_store) {
    RETURN_IF_ERROR(SyncStream(*store_stream_));
    // The store stream passed the compute stream's last release point: nothing is pending.
    if (compute_waited_by_store) compute_pending_ = false;
  }
  RETURN_IF_ERROR(written);
  for (int64_t key : victims) {
    Chunk& ch = chunk(key);
    const bool was_dirty = std::find(dirty.begin(), dirty.end(), key) != dirty.end();
    const bool dropped = std::find(to_disk.begin(), to_disk.end(), key) != to_disk.end();
    VLOG(2) << "moment " << context.moment << ": evict " << ch.id()
            << (was_dirty ? " (written back)"
                : dropped ? " (dropped: on disk)"
                          : " (clean)");
    RETURN_IF_ERROR(dropped ? dropper_->DropToDisk(key) : ch.RevertToBacking());
    resident_.erase(key);
    resident_bytes_ -= key_cost_bytes(key);
    prefetched_.erase(key);
    if (evicted != nullptr) ++*evicted;
    if (!was_dirty) {
      ++c.clean_evictions;
      ReportMove(ChunkMoveKind::kCleanEviction, key, context);
    }
  }
  return absl::OkStatus();
}

absl::Status ResidencyEngine::MoveToHost(int64_t key, MoveContext context) {
  Chunk& ch = chunk(key);
  if (!ch.has_payload()) return ch.AllocatePayload(*host_->chunk_pool_for(ch.capacity_bytes()));
  if (ch.device().is_host()) return absl::OkStatus();
  return Evict({key}, context);
}

absl::StatusOr<bool> ResidencyEngine::StartWriteBehind(int64_t key, MoveContext context) {
  if (!resident_.contains(key)) return false;
  Chunk& ch = chunk(key);
  // A frozen chunk is never written behind: it stays clean (see frozen_param).
  if (!ch.movable() || ch.backing_valid() || behind_.contains(key) || frozen_param(key)) {
    return false;
  }
  if (auto it = pending_.find(key); it != pending_.end()) {
    // Its load (a stream-ordered access does not wait for it on the host): done, or the store
    // stream waits for the load stream.
    if (it->second->Query()) {
      RETURN_IF_ERROR(WaitForCopies({key}));
    } else {
      RETURN_IF_ERROR(load_stream_->RecordEvent(loads_done_.get()));
      RETURN_IF_ERROR(store_stream_->WaitEvent(loads_done_.get()));
    }
  }
  // A stream-side wait for the caller's kernels up to the last release: the host does not block.
  if (compute_pending_) RETURN_IF_ERROR(store_stream_->WaitEvent(compute_done_.get()));
  RETURN_IF_ERROR(
      TimedCopy(*store_stream_, MoveEvent(ChunkMoveKind::kWriteBehind, ch, context), [&] {
        return ch.WriteBackAsync(*store_stream_, host_->chunk_pool_for(ch.capacity_bytes()));
      }));
  ASSIGN_OR_RETURN(std::shared_ptr<Event> event, backend_->CreateEvent());
  RETURN_IF_ERROR(store_stream_->RecordEvent(event.get()));
  pending_[key] = std::move(event);
  behind_.insert(key);
  TransferCounters& c = traffic(context.stage);
  ++c.write_backs;
  c.write_back_bytes += ch.capacity_bytes();
  ++counters_->write_behinds;
  VLOG(2) << "moment " << context.moment << ": write behind " << ch.id();
  return true;
}

absl::Status ResidencyEngine::ReleasePayload(int64_t key) {
  RETURN_IF_ERROR(WaitForCopies({key}));
  // Kernels enqueued before the last release may still read the payload.
  RETURN_IF_ERROR(WaitForCompute());
  RETURN_IF_ERROR(chunk(key).ReleasePayload());
  if (resident_.erase(key) > 0) resident_bytes_ -= key_cost_bytes(key);
  prefetched_.erase(key);
  return absl::OkStatus();
}

bool ResidencyEngine::frozen_param(int64_t key) const {
  const ChunkId id = keys_.IdOf(key);
  return id.type == ChunkType::kParam && !store_->layout().chunk_trainable(id.index) &&
         chunk(key).is_local();
}

void ResidencyEngine::NoteAccessed(int64_t key) {
  if (prefetched_.erase(key) > 0) ++counters_->prefetch_hits;
}

// --- Waiting -------------------------------------------------------------------------------------

absl::Status ResidencyEngine::WaitForCopies(const std::vector<int64_t>& keys) {
  for (int64_t key : keys) {
    auto it = pending_.find(key);
    if (it == pending_.end()) continue;
    if (!it->second->Query()) {
      const int64_t start = NowNs();
      RETURN_IF_ERROR(it->second->Synchronize());
      counters_->stall_ns += NowNs() - start;
    }
    pending_.erase(it);
    behind_.erase(key);
    Chunk& ch = chunk(key);
    // A frozen chunk keeps its host copy whatever clean_eviction says: it is the parameter's
    // home, never written back.
    if (!options_.clean_eviction && ch.has_backing() && !frozen_param(key)) {
      RETURN_IF_ERROR(ch.DiscardBacking());
    }
  }
  return absl::OkStatus();
}

bool ResidencyEngine::CopiesDone(int64_t key) {
  auto it = pending_.find(key);
  if (it == pending_.end()) return true;
  if (!it->second->Query()) return false;
  // Completed: let WaitForCopies do the bookkeeping (it will not block).
  return WaitForCopies({key}).ok();
}

absl::Status ResidencyEngine::SyncStream(Stream& stream) {
  const int64_t start = NowNs();
  RETURN_IF_ERROR(stream.Synchronize());
  counters_->stall_ns += NowNs() - start;
  return absl::OkStatus();
}

absl::Status ResidencyEngine::SyncLoadStream() { return SyncStream(*load_stream_); }

absl::Status ResidencyEngine::NoteComputeRelease() {
  if (options_.compute_stream == nullptr) return absl::OkStatus();
  RETURN_IF_ERROR(options_.compute_stream->RecordEvent(compute_done_.get()));
  compute_pending_ = true;
  return absl::OkStatus();
}

absl::Status ResidencyEngine::WaitForCompute() {
  if (!compute_pending_) return absl::OkStatus();
  compute_pending_ = false;
  const int64_t start = NowNs();
  absl::Status s = compute_done_->Synchronize();
  counters_->compute_wait_ns += NowNs() - start;
  return s;
}

absl::Status ResidencyEngine::OrderComputeAfterLoads(const std::vector<int64_t>& keys,
                                                     bool zero_fill) {
  CHECK(options_.compute_stream != nullptr) << "OrderComputeAfterLoads without a compute stream";
  bool loads = zero_fill, stores = false;
  for (int64_t key : keys) {
    auto it = pending_.find(key);
    if (it == pending_.end()) continue;
    // A finished copy completes its bookkeeping here (and reports its error) without blocking.
    if (it->second->Query()) {
      RETURN_IF_ERROR(WaitForCopies({key}));
      continue;
    }
    (behind_.contains(key) ? stores : loads) = true;
  }
  bool in_flight = false;
  for (auto [wanted, stream, event] :
       {std::tuple{loads, load_stream_.get(), loads_done_.get()},
        std::tuple{stores, store_stream_.get(), stores_done_.get()}}) {
    if (!wanted) continue;
    RETURN_IF_ERROR(stream->RecordEvent(event));
    in_flight |= !event->Query();
    RETURN_IF_ERROR(options_.compute_stream->WaitEvent(event));
    compute_waits_on_loads_ = true;
  }
  if (in_flight) ++counters_->stream_ordered_waits;
  return absl::OkStatus();
}

// --- Pressure ------------------------------------------------------------------------------------

int64_t ResidencyEngine::ReclaimUnderPressure(const absl::flat_hash_set<int64_t>& keep,
                                              MoveContext context) {
  std::vector<int64_t> victims;
  for (int64_t key : resident_) {
    if (chunk(key).movable() && !keep.contains(key)) victims.push_back(key);
  }
  if (victims.empty()) return 0;
  std::sort(victims.begin(), victims.end());
  int64_t evicted = 0;
  if (absl::Status s = Evict(victims, context, &evicted); !s.ok()) {
    LOG(WARNING) << "ChunkManager: evicting under memory pressure failed after " << evicted
                 << " of " << victims.size() << " chunks: " << s;
  }
  if (evicted > 0) {
    ++counters_->pressure_reclaims;
    counters_->pressure_evictions += evicted;
    LOG_FIRST_N(WARNING, 5)
        << "ChunkManager: " << accel_->device().ToString()
        << " ran out of memory between accesses; evicted " << evicted
        << " chunks to make room (raise ChunkManagerOptions.nonmodel_slack_bytes to plan for the "
           "allocator's overhead instead)";
  }
  int64_t released = 0;
  for (ChunkBlockPool* pool : accel_->chunk_pools()) released += pool->ReleaseCached();
  return released;
}

}  // namespace ps
