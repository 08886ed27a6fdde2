#include "scheduler/chunk_manager.h"

#include <algorithm>
#include <tuple>
#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/time/clock.h"
#include "base/status_macros.h"
#include "base/units.h"
#include "chunk/tensor_state.h"
#include "glog/logging.h"
#include "memory/memory_tracker.h"

namespace ps {

// --- Counters ------------------------------------------------------------------------------------

TransferCounters& TransferCounters::operator+=(const TransferCounters& o) {
  loads += o.loads;
  load_bytes += o.load_bytes;
  write_backs += o.write_backs;
  write_back_bytes += o.write_back_bytes;
  clean_evictions += o.clean_evictions;
  allocations += o.allocations;
  return *this;
}

TransferCounters ChunkManagerCounters::Total() const {
  TransferCounters total;
  for (const TransferCounters& s : by_stage) total += s;
  return total;
}

ChunkManagerCounters ChunkManagerCounters::Minus(const ChunkManagerCounters& earlier) const {
  ChunkManagerCounters d = *this;
  for (int s = 0; s < kNumStages; ++s) {
    TransferCounters& a = d.by_stage[s];
    const TransferCounters& b = earlier.by_stage[s];
    a.loads -= b.loads;
    a.load_bytes -= b.load_bytes;
    a.write_backs -= b.write_backs;
    a.write_back_bytes -= b.write_back_bytes;
    a.clean_evictions -= b.clean_evictions;
    a.allocations -= b.allocations;
  }
  d.prefetches -= earlier.prefetches;
  d.write_behinds -= earlier.write_behinds;
  d.prefetch_hits -= earlier.prefetch_hits;
  d.pressure_reclaims -= earlier.pressure_reclaims;
  d.pressure_evictions -= earlier.pressure_evictions;
  d.stall_ns -= earlier.stall_ns;
  d.all_gathers -= earlier.all_gathers;
  d.all_gather_bytes -= earlier.all_gather_bytes;
  d.reduce_scatters -= earlier.reduce_scatters;
  d.reduce_scatter_bytes -= earlier.reduce_scatter_bytes;
  d.remote_releases -= earlier.remote_releases;
  d.comm_ns -= earlier.comm_ns;
  return d;
}

std::string ChunkManagerCounters::DebugString() const {
  std::string out;
  for (Stage s : {Stage::kForward, Stage::kBackward, Stage::kAdam}) {
    const TransferCounters& c = stage(s);
    absl::StrAppend(&out, StageName(s), ": ", c.loads, " loads (", FormatBytes(c.load_bytes), "), ",
                    c.write_backs, " write-backs (", FormatBytes(c.write_back_bytes), "), ",
                    c.clean_evictions, " clean evictions, ", c.allocations, " allocations; ");
  }
  absl::StrAppend(&out, prefetches, " prefetches, ", prefetch_hits, " prefetch hits, ",
                  write_behinds, " write-behinds, ", pressure_evictions,
                  " evictions under pressure, stall ",
                  absl::StrFormat("%.3f ms", stall_ns / 1e6));
  if (all_gathers > 0 || reduce_scatters > 0) {
    absl::StrAppend(&out, "; ZeRO: ", all_gathers, " all-gathers (", FormatBytes(all_gather_bytes),
                    " in), ", reduce_scatters, " reduce-scatters (",
                    FormatBytes(reduce_scatter_bytes), " out), ", remote_releases,
                    " remote payloads freed, ", absl::StrFormat("%.3f ms", comm_ns / 1e6),
                    " in collectives");
  }
  return out;
}

bool AdamPlacement::OnAccelerator(int64_t chunk_index) const {
  return std::binary_search(accelerator_chunks.begin(), accelerator_chunks.end(), chunk_index);
}

// --- Construction --------------------------------------------------------------------------------

absl::StatusOr<std::unique_ptr<ChunkManager>> ChunkManager::Create(ChunkStore* store,
                                                                   Backend* backend,
                                                                   DeviceMemory* accelerator,
                                                                   DeviceMemory* host,
                                                                   ChunkManagerOptions options) {
  if (store == nullptr || backend == nullptr || accelerator == nullptr || host == nullptr) {
    return absl::InvalidArgumentError(
        "ChunkManager::Create: store, backend, accelerator and host must all be given");
  }
  const int world = store->layout().world_size();
  if (world > 1 && options.collectives == nullptr) {
    return absl::InvalidArgumentError(absl::StrCat(
        "ChunkManager: the layout shards chunks over ", world,
        " ranks (ZeRO) but ChunkManagerOptions.collectives is not set; pass the collectives of "
        "the data-parallel world (scheduler/comm_collectives.h)"));
  }
  if (options.collectives != nullptr &&
      (options.collectives->world_size() != world ||
       (world > 1 && options.collectives->rank() != store->rank()))) {
    return absl::InvalidArgumentError(absl::StrCat(
        "ChunkManagerOptions.collectives is rank ", options.collectives->rank(), " of a world of ",
        options.collectives->world_size(), " but the chunk store is rank ", store->rank(),
        " of a layout for world size ", world, "; build the layout for the communicator's world"));
  }
  if (accelerator->device() != backend->device()) {
    return absl::InvalidArgumentError(absl::StrCat(
        "ChunkManager: the accelerator memory is on ", accelerator->device().ToString(),
        " but the backend drives ", backend->device().ToString()));
  }
  if (!host->device().is_host()) {
    return absl::InvalidArgumentError(absl::StrCat("ChunkManager: the host memory is on ",
                                                   host->device().ToString(), ", not the host"));
  }
  if (!(options.warmup_chunk_fraction > 0 && options.warmup_chunk_fraction <= 1)) {
    return absl::InvalidArgumentError(
        absl::StrCat("ChunkManagerOptions.warmup_chunk_fraction must be in (0, 1], got ",
                     options.warmup_chunk_fraction));
  }
  if (options.comm_buffer_bytes < 0 || options.nonmodel_slack_bytes < 0 ||
      options.adam_margin_bytes < 0) {
    return absl::InvalidArgumentError(absl::StrCat(
        "ChunkManagerOptions: comm_buffer_bytes (", options.comm_buffer_bytes,
        "), nonmodel_slack_bytes (", options.nonmodel_slack_bytes, ") and adam_margin_bytes (",
        options.adam_margin_bytes, ") must not be negative"));
  }
  const std::optional<int64_t> cap = accelerator->capacity_bytes();
  if (!cap.has_value()) {
    return absl::InvalidArgumentError("ChunkManager: the accelerator memory has no capacity");
  }
  const int64_t budget = options.device_budget_bytes.value_or(*cap);
  if (budget <= 0 || budget > *cap) {
    return absl::InvalidArgumentError(
        absl::StrCat("ChunkManagerOptions.device_budget_bytes must be in (0, ", *cap,
                     "] (the accelerator's capacity), got ", budget));
  }
  const ChunkLayout& layout = store->layout();
  for (ChunkType type : kAllChunkTypes) {
    const int64_t bytes = layout.ChunkBytes(type, store->compute_dtype());
    for (DeviceMemory* memory : {accelerator, host}) {
      if (bytes > memory->chunk_block_bytes()) {
        return absl::InvalidArgumentError(absl::StrCat(
            "ChunkManager: a ", ChunkTypeName(type), " chunk needs ", FormatBytes(bytes),
            " but the chunk pool of ", memory->device().ToString(), " has blocks of ",
            FormatBytes(memory->chunk_block_bytes()),
            "; set DeviceMemoryOptions.chunk_block_bytes to the largest chunk's bytes"));
      }
    }
  }
  for (int64_t index : options.static_param_chunks) {
    if (index < 0 || index >= store->num_chunks()) {
      return absl::InvalidArgumentError(
          absl::StrCat("ChunkManagerOptions.static_param_chunks: chunk index ", index,
                       " outside [0, ", store->num_chunks(), ")"));
    }
  }
  std::unique_ptr<ChunkManager> manager(
      new ChunkManager(store, backend, accelerator, host, std::move(options)));
  manager->budget_bytes_ = budget;
  manager->reserved_bytes_ =
      manager->options_.comm_buffer_bytes + manager->options_.nonmodel_slack_bytes;
  ASSIGN_OR_RETURN(manager->load_stream_, backend->CreateStream());
  ASSIGN_OR_RETURN(manager->store_stream_, backend->CreateStream());
  ASSIGN_OR_RETURN(manager->compute_done_, backend->CreateEvent());
  absl::flat_hash_set<int64_t> static_keys;
  for (int64_t index : manager->options_.static_param_chunks) {
    static_keys.insert(manager->ChunkKey(ChunkId{ChunkType::kParam, index}));
  }
  ASSIGN_OR_RETURN(manager->policy_,
                   CreateEvictionPolicy(manager->options_.policy, std::move(static_keys)));
  if (manager->options_.evict_under_pressure) {
    manager->reclaimer_ = std::make_unique<PressureReclaimer>(manager.get());
    accelerator->upstream()->AddReclaimer(
        manager->reclaimer_.get(),
        absl::StrCat("chunk_manager(", accelerator->device().ToString(), ")"));
  }
  return manager;
}

ChunkManager::ChunkManager(ChunkStore* store, Backend* backend, DeviceMemory* accelerator,
                           DeviceMemory* host, ChunkManagerOptions options)
    : store_(store),
      backend_(backend),
      accel_(accelerator),
      host_(host),
      options_(std::move(options)),
      num_chunks_(store->num_chunks()),
      device_cost_bytes_(accelerator->chunk_block_bytes()),
      world_size_(store->layout().world_size()),
      rank_(store->rank()),
      collectives_(world_size_ > 1 ? options_.collectives : nullptr) {
  const ChunkLayout& layout = store->layout();
  gathered_.assign(layout.num_groups(), 0);
  backward_touched_.assign(layout.num_groups(), 0);
  group_ops_.resize(layout.num_groups());
  for (OperatorId op = 0; op < layout.num_operator_ids(); ++op) {
    if (layout.op(op).placed()) group_ops_[layout.group_of(layout.op(op).chunk_index)].push_back(op);
  }
  forward_uses_.assign(layout.num_operator_ids(), 0);
  backward_releases_.assign(layout.num_operator_ids(), 0);
}

ChunkManager::~ChunkManager() {
  if (reclaimer_ != nullptr) accel_->upstream()->RemoveReclaimer(reclaimer_.get());
  if (compute_pending_) {
    // The caller's compute stream still has to complete the event this manager owns.
    absl::Status s = compute_done_->Synchronize();
    LOG_IF(ERROR, !s.ok()) << "ChunkManager: compute stream failed at destruction: " << s;
  }
  for (Stream* stream : {load_stream_.get(), store_stream_.get()}) {
    if (stream == nullptr) continue;
    absl::Status s = stream->Synchronize();
    LOG_IF(ERROR, !s.ok()) << "ChunkManager: copy stream failed at destruction: " << s;
  }
}

int64_t ChunkManager::ChunkKey(ChunkId id) const {
  return static_cast<int64_t>(id.type) * num_chunks_ + id.index;
}

ChunkId ChunkManager::ChunkIdOfKey(int64_t key) const {
  return ChunkId{static_cast<ChunkType>(key / num_chunks_), key % num_chunks_};
}

int64_t ChunkManager::NowNs() const {
  return options_.clock_ns ? options_.clock_ns() : absl::GetCurrentTimeNanos();
}

ChunkMoveEvent ChunkManager::MoveEvent(ChunkMoveKind kind, const Chunk& chunk, Stage stage) const {
  ChunkMoveEvent e;
  e.kind = kind;
  e.chunk = chunk.id();
  e.bytes = IsCopy(kind) ? chunk.capacity_bytes() : 0;
  e.stage = stage;
  e.moment = in_iteration_ ? metronome_.moment() : -1;
  return e;
}

absl::Status ChunkManager::TimedCopy(Stream& stream, ChunkMoveEvent event,
                                     const std::function<absl::Status()>& enqueue) {
  ChunkEventListener* listener = options_.listener;
  if (listener == nullptr) return enqueue();
  std::function<int64_t()> clock =
      options_.clock_ns ? options_.clock_ns : std::function<int64_t()>(absl::GetCurrentTimeNanos);
  // Written by the first host function and read by the second, on the same stream thread (a
  // stream runs its work in order), so no synchronization is needed beyond the stream's own.
  auto start_ns = std::make_shared<int64_t>(0);
  RETURN_IF_ERROR(stream.LaunchHostFunc([start_ns, clock] { *start_ns = clock(); }));
  RETURN_IF_ERROR(enqueue());
  return stream.LaunchHostFunc([start_ns, clock, listener, event]() mutable {
    event.start_ns = *start_ns;
    event.end_ns = clock();
    listener->OnChunkMove(event);
  });
}

void ChunkManager::ReportMove(ChunkMoveKind kind, int64_t key, Stage stage) {
  if (options_.listener == nullptr) return;
  ChunkMoveEvent e = MoveEvent(kind, ChunkOfKey(key), stage);
  e.start_ns = e.end_ns = NowNs();
  options_.listener->OnChunkMove(e);
}

void ChunkManager::ReportAccess(absl::string_view name, int64_t chunk_index, Stage stage,
                                int64_t moment, int64_t request_ns) {
  if (options_.listener == nullptr) return;
  ChunkAccessEvent e;
  e.name = name;
  e.chunk_index = chunk_index;
  e.stage = stage;
  e.moment = moment;
  e.warmup = in_iteration_ && metronome_.is_warmup();
  e.request_ns = request_ns;
  e.ready_ns = NowNs();
  e.resident_bytes = resident_bytes_;
  e.accelerator_model_bytes = accel_->tracker()->current_bytes(MemoryKind::kModelData);
  e.accelerator_non_model_bytes = accel_->tracker()->current_bytes(MemoryKind::kNonModelData);
  options_.listener->OnAccess(e);
}

int64_t ChunkManager::ReclaimUnderPressure() {
  if (busy_ > 0) return 0;  // an allocation of the manager's own: nothing may move now
  BusyScope busy(this);
  std::vector<int64_t> victims;
  for (int64_t key : resident_) {
    if (ChunkOfKey(key).movable() && !active_chunks_.contains(key)) victims.push_back(key);
  }
  if (victims.empty()) return 0;
  std::sort(victims.begin(), victims.end());
  const Stage stage = in_iteration_ && metronome_.moment() >= 0 ? PassOf(metronome_.stage())
                                                                : Stage::kForward;
  if (absl::Status s = Evict(victims, stage); !s.ok()) {
    LOG(WARNING) << "ChunkManager: evicting under memory pressure failed: " << s;
  }
  ++counters_.pressure_reclaims;
  counters_.pressure_evictions += static_cast<int64_t>(victims.size());
  LOG_FIRST_N(WARNING, 5)
      << "ChunkManager: " << accel_->device().ToString()
      << " ran out of memory between accesses; evicted " << victims.size()
      << " chunks to make room (raise ChunkManagerOptions.nonmodel_slack_bytes to plan for the "
         "allocator's overhead instead)";
  return accel_->chunk_pool()->ReleaseCached();
}

std::vector<int64_t> ChunkManager::ResidentChunkKeys() const {
  std::vector<int64_t> keys(resident_.begin(), resident_.end());
  std::sort(keys.begin(), keys.end());
  return keys;
}

int64_t ChunkManager::ChunkableBytes(int64_t moment) const {
  return trace_.ChunkableBytes(moment, budget_bytes_, reserved_bytes_);
}

// --- Moments and limits --------------------------------------------------------------------------

absl::Status ChunkManager::BeginIteration() {
  BusyScope busy(this);
  if (in_iteration_) {
    return absl::FailedPreconditionError(absl::StrCat(
        "BeginIteration: iteration ", metronome_.iteration(), " has not ended; call EndIteration"));
  }
  accel_->tracker()->ResetPeaks();
  host_->tracker()->ResetPeaks();
  iteration_start_counters_ = counters_;
  in_iteration_ = true;
  backward_started_ = false;
  std::fill(forward_uses_.begin(), forward_uses_.end(), 0);
  std::fill(backward_releases_.begin(), backward_releases_.end(), 0);
  return absl::OkStatus();
}

absl::Status ChunkManager::EndIteration() {
  BusyScope busy(this);
  if (!in_iteration_) {
    return absl::FailedPreconditionError("EndIteration without BeginIteration");
  }
  if (!active_ops_.empty()) {
    return absl::FailedPreconditionError(
        absl::StrCat("EndIteration: operator '",
                     store_->layout().op(active_ops_.begin()->first).name, "' is still accessed (",
                     active_ops_.size(), " operators in all); release every operator first"));
  }
  if (!active_chunks_.empty()) {
    return absl::FailedPreconditionError(
        absl::StrCat("EndIteration: chunk ", ChunkIdOfKey(*active_chunks_.begin()).ToString(),
                     " is still accessed by the optimizer; call ReleaseChunks first"));
  }
  RETURN_IF_ERROR(FinishGroups(PassOf(Stage::kBackward)));
  const bool warmup = metronome_.is_warmup();
  if (warmup && metronome_.moment() < 0) {
    return absl::FailedPreconditionError(
        "EndIteration: the warm-up iteration had no moments (no Access, BeginAdam or "
        "AccessChunks); there is nothing to learn a schedule from");
  }
  RETURN_IF_ERROR(SampleTide());
  const int64_t moments = metronome_.EndIteration();
  if (warmup) {
    RETURN_IF_ERROR(trace_.Finish(moments));
    policy_->SetSchedule(&trace_.schedule());
    ComputeAdamPlacement();
  } else if (moments != trace_.total_moments()) {
    LOG(WARNING) << "ChunkManager: iteration " << metronome_.iteration() - 1 << " had " << moments
                 << " moments but the warm-up had " << trace_.total_moments()
                 << "; moments off the learned trace use the warm-up's conservative limits";
  }
  iteration_counters_.push_back(counters_.Minus(iteration_start_counters_));
  in_iteration_ = false;
  backward_started_ = false;
  return absl::OkStatus();
}

absl::Status ChunkManager::SampleTide() {
  const MemoryTrackerSnapshot a = accel_->tracker()->SnapshotAndResetPeaks();
  const MemoryTrackerSnapshot h = host_->tracker()->SnapshotAndResetPeaks();
  if (metronome_.is_warmup() && metronome_.moment() >= 0) {
    RETURN_IF_ERROR(trace_.RecordMoment(
        metronome_.moment(),
        TideSample{metronome_.stage(), a.peak_non_model_bytes, h.peak_non_model_bytes}));
  }
  return absl::OkStatus();
}

absl::StatusOr<int64_t> ChunkManager::Tick(Stage stage) {
  if (!in_iteration_) return -1;
  RETURN_IF_ERROR(SampleTide());
  return metronome_.Tick(stage);
}

ChunkManager::Limits ChunkManager::LimitsAt(int64_t moment) const {
  Limits l;
  const int64_t nonmodel_now = accel_->tracker()->current_bytes(MemoryKind::kNonModelData);
  if (moment >= 0 && trace_.finished() && moment < trace_.total_moments()) {
    l.known = true;
    l.tide_bytes = trace_.AcceleratorTideBytes(moment);
    const int64_t own_peak = std::max(trace_.sample(moment).accelerator_peak_bytes, nonmodel_now);
    l.hard_bytes = std::max<int64_t>(0, budget_bytes_ - own_peak - reserved_bytes_);
    l.target_bytes = std::min(l.hard_bytes, ChunkableBytes(moment));
  } else {
    l.tide_bytes = nonmodel_now;
    l.hard_bytes = std::max<int64_t>(0, budget_bytes_ - nonmodel_now - reserved_bytes_);
    l.target_bytes = std::min(
        l.hard_bytes,
        static_cast<int64_t>(options_.warmup_chunk_fraction * static_cast<double>(budget_bytes_)));
  }
  return l;
}

std::string ChunkManager::WorkingSetError(const std::string& what, int64_t working_set_bytes,
                                          int64_t own_bytes, const Limits& limits,
                                          int64_t moment) const {
  std::string stuck;
  if (working_set_bytes > own_bytes) {
    stuck = absl::StrCat(", plus ", FormatBytes(working_set_bytes - own_bytes),
                         " of other chunks in COMPUTE or pinned");
  }
  return absl::StrCat(
      what, moment >= 0 ? absl::StrCat(" at moment ", moment) : std::string(" (untracked)"),
      " needs ", FormatBytes(working_set_bytes), " of chunks resident on ",
      accel_->device().ToString(), " (", FormatBytes(own_bytes), " for its own chunks", stuck,
      "), but only ", FormatBytes(limits.hard_bytes), " of the ", FormatBytes(budget_bytes_),
      " device budget is left for chunks (non-model data ", limits.known ? "peaks at " : "uses ",
      FormatBytes(limits.tide_bytes), ", ", FormatBytes(reserved_bytes_),
      " is reserved for communication buffers and slack). Use a smaller chunk size, activation "
      "checkpointing (or a smaller batch) to lower the non-model peak, or more device memory");
}

// --- Moving chunks -------------------------------------------------------------------------------

absl::Status ChunkManager::MakeResident(const std::vector<int64_t>& keys, Stage stage,
                                        int64_t moment, const std::string& what) {
  const absl::flat_hash_set<int64_t> keep(keys.begin(), keys.end());
  std::vector<int64_t> missing;
  for (int64_t key : keys) {
    if (resident_.contains(key)) {
      if (prefetched_.erase(key) > 0) ++counters_.prefetch_hits;
    } else {
      missing.push_back(key);
    }
  }
  int64_t stuck_bytes = 0;
  for (int64_t key : resident_) {
    if (!keep.contains(key) && !ChunkOfKey(key).movable()) stuck_bytes += device_cost_bytes_;
  }
  const int64_t own_bytes = device_cost_bytes_ * static_cast<int64_t>(keys.size());
  const int64_t working_set_bytes = own_bytes + stuck_bytes;
  const Limits limits = LimitsAt(moment);
  if (working_set_bytes > limits.hard_bytes) {
    return absl::ResourceExhaustedError(
        WorkingSetError(what, working_set_bytes, own_bytes, limits, moment));
  }
  current_limit_bytes_ = std::max(limits.target_bytes, working_set_bytes);
  VLOG(2) << "moment " << moment << ": " << what << ", limit " << current_limit_bytes_ << " bytes, "
          << resident_.size() << " chunks resident";
  const int64_t over = resident_bytes_ + device_cost_bytes_ * static_cast<int64_t>(missing.size()) -
                       current_limit_bytes_;
  if (over > 0) RETURN_IF_ERROR(EvictFor(over, keep, stage, moment, what));
  RETURN_IF_ERROR(Load(missing, stage, /*prefetch=*/false));
  return WaitForCopies(keys);
}

absl::Status ChunkManager::EvictFor(int64_t need_bytes, const absl::flat_hash_set<int64_t>& keep,
                                    Stage stage, int64_t now, const std::string& what) {
  std::vector<EvictionCandidate> candidates;
  for (int64_t key : ResidentChunkKeys()) {
    if (!keep.contains(key) && ChunkOfKey(key).movable()) {
      candidates.push_back({key, device_cost_bytes_});
    }
  }
  const std::vector<int64_t> victims = policy_->ChooseVictims(candidates, need_bytes, now);
  const int64_t freed = device_cost_bytes_ * static_cast<int64_t>(victims.size());
  if (freed < need_bytes) {
    return absl::ResourceExhaustedError(absl::StrCat(
        what, ": cannot make room for its chunks on ", accel_->device().ToString(), ": ",
        FormatBytes(need_bytes), " must be evicted but only ", FormatBytes(freed),
        " of resident chunks may move (the rest are in COMPUTE or pinned)"));
  }
  return Evict(victims, stage);
}

absl::Status ChunkManager::Evict(const std::vector<int64_t>& victims, Stage stage) {
  if (victims.empty()) return absl::OkStatus();
  RETURN_IF_ERROR(WaitForCopies(victims));
  RETURN_IF_ERROR(WaitForCompute());
  TransferCounters& c = counters_.by_stage[static_cast<int>(stage)];
  std::vector<int64_t> dirty;
  for (int64_t key : victims) {
    if (!ChunkOfKey(key).backing_valid()) dirty.push_back(key);
  }
  absl::Status written = absl::OkStatus();
  int64_t enqueued = 0;
  for (int64_t key : dirty) {
    Chunk& chunk = ChunkOfKey(key);
    written = TimedCopy(*store_stream_, MoveEvent(ChunkMoveKind::kWriteBack, chunk, stage),
                        [&] { return chunk.WriteBackAsync(*store_stream_, host_->chunk_pool()); });
    if (!written.ok()) break;
    ++enqueued;
    ++c.write_backs;
    c.write_back_bytes += chunk.capacity_bytes();
  }
  // Wait even after a failure: a chunk whose write-back is enqueued counts as clean.
  if (enqueued > 0) RETURN_IF_ERROR(SyncStream(*store_stream_));
  RETURN_IF_ERROR(written);
  for (int64_t key : victims) {
    Chunk& chunk = ChunkOfKey(key);
    const bool was_dirty = std::find(dirty.begin(), dirty.end(), key) != dirty.end();
    VLOG(2) << "moment " << metronome_.moment() << ": evict " << chunk.id()
            << (was_dirty ? " (written back)" : " (clean)");
    RETURN_IF_ERROR(chunk.RevertToBacking());
    resident_.erase(key);
    resident_bytes_ -= device_cost_bytes_;
    prefetched_.erase(key);
    if (!was_dirty) {
      ++c.clean_evictions;
      ReportMove(ChunkMoveKind::kCleanEviction, key, stage);
    }
  }
  return absl::OkStatus();
}

absl::Status ChunkManager::Load(const std::vector<int64_t>& keys, Stage stage, bool prefetch) {
  TransferCounters& c = counters_.by_stage[static_cast<int>(stage)];
  std::vector<int64_t> copied;
  absl::Status status = absl::OkStatus();
  for (int64_t key : keys) {
    Chunk& chunk = ChunkOfKey(key);
    if (!chunk.has_payload()) {
      status = chunk.AllocatePayload(*accel_->chunk_pool());
      if (!status.ok()) break;
      ++c.allocations;
      ReportMove(ChunkMoveKind::kAllocation, key, stage);
    } else if (chunk.device().is_host()) {
      status = TimedCopy(
          *load_stream_,
          MoveEvent(prefetch ? ChunkMoveKind::kPrefetch : ChunkMoveKind::kLoad, chunk, stage),
          [&] { return chunk.CopyToKeepingBacking(*accel_->chunk_pool(), *load_stream_); });
      if (!status.ok()) break;
      copied.push_back(key);
      ++c.loads;
      c.load_bytes += chunk.capacity_bytes();
    } else {
      status = absl::InternalError(
          absl::StrCat("chunk ", chunk.id().ToString(), " is on the accelerator but not tracked"));
      break;
    }
    VLOG(2) << "moment " << metronome_.moment() << ": " << (prefetch ? "prefetch " : "load ")
            << chunk.id();
    resident_.insert(key);
    resident_bytes_ += device_cost_bytes_;
    if (prefetch) {
      prefetched_.insert(key);
      ++counters_.prefetches;
    }
  }
  if (!copied.empty()) {
    ASSIGN_OR_RETURN(std::shared_ptr<Event> event, backend_->CreateEvent());
    RETURN_IF_ERROR(load_stream_->RecordEvent(event.get()));
    for (int64_t key : copied) pending_[key] = event;
  }
  return status;
}

absl::Status ChunkManager::WaitForCopies(const std::vector<int64_t>& keys) {
  for (int64_t key : keys) {
    auto it = pending_.find(key);
    if (it == pending_.end()) continue;
    if (!it->second->Query()) {
      const int64_t start = NowNs();
      RETURN_IF_ERROR(it->second->Synchronize());
      counters_.stall_ns += NowNs() - start;
    }
    pending_.erase(it);
    Chunk& chunk = ChunkOfKey(key);
    if (!options_.clean_eviction && chunk.has_backing()) RETURN_IF_ERROR(chunk.DiscardBacking());
  }
  return absl::OkStatus();
}

bool ChunkManager::CopiesDone(int64_t key) {
  auto it = pending_.find(key);
  if (it == pending_.end()) return true;
  if (!it->second->Query()) return false;
  // Completed: let WaitForCopies do the bookkeeping (it will not block).
  return WaitForCopies({key}).ok();
}

absl::Status ChunkManager::SyncStream(Stream& stream) {
  const int64_t start = NowNs();
  RETURN_IF_ERROR(stream.Synchronize());
  counters_.stall_ns += NowNs() - start;
  return absl::OkStatus();
}

absl::Status ChunkManager::WaitForCompute() {
  if (!compute_pending_) return absl::OkStatus();
  compute_pending_ = false;
  return compute_done_->Synchronize();
}

absl::Status ChunkManager::MoveToHost(int64_t key, Stage stage) {
  Chunk& chunk = ChunkOfKey(key);
  if (!chunk.has_payload()) return chunk.AllocatePayload(*host_->chunk_pool());
  if (chunk.device().is_host()) return absl::OkStatus();
  return Evict({key}, stage);
}

absl::Status ChunkManager::Prefetch(int64_t moment) {
  if (!options_.prefetch || moment < 0 || !trace_.finished()) return absl::OkStatus();
  const int64_t next = moment + 1;
  if (next >= trace_.total_moments()) return absl::OkStatus();  // not across iterations
  const Stage stage = PassOf(trace_.sample(next).stage);
  if (stage == Stage::kAdam) return absl::OkStatus();
  const std::vector<int64_t>& next_keys = trace_.ChunksAt(next);
  std::vector<int64_t> keys;
  for (int64_t key : next_keys) {
    const Chunk& chunk = ChunkOfKey(key);
    if (chunk.has_payload() && chunk.device().is_host() && chunk.movable() &&
        !chunk.has_backing()) {
      keys.push_back(key);
    }
  }
  if (keys.empty()) return absl::OkStatus();
  const int64_t missing_bytes = device_cost_bytes_ * static_cast<int64_t>(keys.size());
  const int64_t over = resident_bytes_ + missing_bytes - LimitsAt(moment).target_bytes;
  if (over > 0) {
    // Only the evictions the access at `next` would make (its target is the trace's), and only
    // free (clean) ones.
    const int64_t next_allowed =
        std::max(ChunkableBytes(next), device_cost_bytes_ * static_cast<int64_t>(next_keys.size()));
    const int64_t demand_over = resident_bytes_ + missing_bytes - next_allowed;
    if (over > demand_over) return absl::OkStatus();
    const absl::flat_hash_set<int64_t> keep(next_keys.begin(), next_keys.end());
    std::vector<EvictionCandidate> candidates;
    for (int64_t key : ResidentChunkKeys()) {
      if (!keep.contains(key) && !ChunkOfKey(key).pinned()) {
        candidates.push_back({key, device_cost_bytes_});
      }
    }
    const std::vector<int64_t> victims = policy_->ChooseVictims(candidates, over, next);
    if (device_cost_bytes_ * static_cast<int64_t>(victims.size()) < over) return absl::OkStatus();
    for (int64_t key : victims) {
      const Chunk& chunk = ChunkOfKey(key);
      if (!chunk.movable() || !chunk.backing_valid() || !CopiesDone(key)) {
        return absl::OkStatus();
      }
    }
    RETURN_IF_ERROR(Evict(victims, stage));
  }
  return Load(keys, stage, /*prefetch=*/true);
}

void ChunkManager::RecordUse(int64_t key, int64_t moment) {
  policy_->RecordUse(key, std::max<int64_t>(moment, 0));
}

absl::Status ChunkManager::RecordAccess(int64_t key, int64_t moment) {
  if (in_iteration_ && metronome_.is_warmup() && moment >= 0) {
    return trace_.RecordAccess(key, moment);
  }
  return absl::OkStatus();
}

absl::Status ChunkManager::WriteBehind(int64_t key) {
  const int64_t moment = metronome_.moment();
  if (!options_.write_behind || !options_.clean_eviction || !in_iteration_ ||
      !metronome_.in_trace() || !resident_.contains(key)) {
    return absl::OkStatus();
  }
  Chunk& chunk = ChunkOfKey(key);
  const ChunkId id = chunk.id();
  if (!chunk.movable() || chunk.backing_valid() || pending_.contains(key) ||
      trace_.schedule().NextUse(key, moment) < trace_.total_moments() ||
      (id.type == ChunkType::kParam && adam_placement_.OnAccelerator(id.index))) {
    return absl::OkStatus();
  }
  // Not used on the accelerator again this iteration and updated on the host: it goes back to
  // the host before its next use whatever happens, so its copy may as well start now — on the
  // accelerator-to-host stream, after the caller's kernels up to this release (a stream-side
  // wait: the host does not block).
  if (compute_pending_) RETURN_IF_ERROR(store_stream_->WaitEvent(compute_done_.get()));
  RETURN_IF_ERROR(TimedCopy(
      *store_stream_,
      MoveEvent(ChunkMoveKind::kWriteBehind, chunk, PassOf(metronome_.stage())),
      [&] { return chunk.WriteBackAsync(*store_stream_, host_->chunk_pool()); }));
  ASSIGN_OR_RETURN(std::shared_ptr<Event> event, backend_->CreateEvent());
  RETURN_IF_ERROR(store_stream_->RecordEvent(event.get()));
  pending_[key] = std::move(event);
  TransferCounters& c = counters_.by_stage[static_cast<int>(PassOf(metronome_.stage()))];
  ++c.write_backs;
  c.write_back_bytes += chunk.capacity_bytes();
  ++counters_.write_behinds;
  VLOG(2) << "moment " << moment << ": write behind " << id;
  return absl::OkStatus();
}

void ChunkManager::ComputeAdamPlacement() {
  adam_placement_ = AdamPlacement();
  // Room that stays free at every moment once every param chunk the iteration uses on the
  // accelerator is resident: optimizer state placed there is never evicted again.
  int64_t min_chunkable = budget_bytes_;
  for (int64_t m = 0; m < trace_.total_moments(); ++m) {
    min_chunkable = std::min(min_chunkable, ChunkableBytes(m));
  }
  // Param chunks used on the accelerator, with their last use.
  absl::flat_hash_map<int64_t, int64_t> last_use;
  for (const auto& [m, key] : trace_.schedule().sequence()) {
    if (ChunkIdOfKey(key).type == ChunkType::kParam) last_use[key] = m;
  }
  adam_placement_.available_bytes = std::max<int64_t>(
      0, min_chunkable - device_cost_bytes_ * static_cast<int64_t>(last_use.size()) -
             options_.adam_margin_bytes);
  // Each index updated on the accelerator keeps its three optimizer-state chunks there. The
  // indices whose param chunk is used last (resident when the step starts) come first.
  const int64_t per_index_bytes = 3 * device_cost_bytes_;
  const ChunkLayout& layout = store_->layout();
  std::vector<std::pair<int64_t, int64_t>> order;  // (-last use, index)
  for (int64_t i = 0; i < num_chunks_; ++i) {
    if (!layout.HoldsPayload(ChunkType::kMaster, i, store_->rank())) continue;
    auto it = last_use.find(ChunkKey(ChunkId{ChunkType::kParam, i}));
    order.emplace_back(it == last_use.end() ? 1 : -it->second, i);
  }
  std::sort(order.begin(), order.end());
  const int64_t n = std::min<int64_t>(adam_placement_.available_bytes / per_index_bytes,
                                      static_cast<int64_t>(order.size()));
  for (int64_t k = 0; k < n; ++k) adam_placement_.accelerator_chunks.push_back(order[k].second);
  std::sort(adam_placement_.accelerator_chunks.begin(), adam_placement_.accelerator_chunks.end());
}

// --- The model -----------------------------------------------------------------------------------

absl::Status ChunkManager::Access(OperatorId op, Stage stage) {
  BusyScope busy(this);
  if (stage == Stage::kAdam) {
    return absl::InvalidArgumentError(
        "Access is for operators in FWD or BWD; the optimizer uses BeginAdam and AccessChunks");
  }
  const ChunkLayout& layout = store_->layout();
  if (op < 0 || op >= layout.num_operator_ids()) {
    return absl::InvalidArgumentError(absl::StrCat("Access: unknown operator id ", op,
                                                   " (the model has ", layout.num_operator_ids(),
                                                   " operators)"));
  }
  const OperatorInfo& info = layout.op(op);
  if (!info.placed()) {
    return absl::FailedPreconditionError(
        absl::StrCat("Access: operator '", info.name, "' has no tensors in any chunk"));
  }
  if (auto it = active_ops_.find(op); it != active_ops_.end()) {
    return absl::FailedPreconditionError(
        absl::StrCat("Access: operator '", info.name, "' is already accessed (",
                     StageName(it->second), "); release it first"));
  }
  const int64_t request_ns = options_.listener != nullptr ? NowNs() : 0;
  ASSIGN_OR_RETURN(const int64_t moment, Tick(stage));
  if (stage == Stage::kBackward) backward_started_ = true;
  const int64_t key = ChunkKey(ChunkId{ChunkType::kParam, info.chunk_index});
  const std::string what = absl::StrCat("operator '", info.name, "' (", StageName(stage), ")");
  const int64_t group = layout.group_of(info.chunk_index);
  const bool gather = collectives_ != nullptr && !gathered_[group];
  // A gather needs the whole group resident as one working set.
  const std::vector<int64_t> keys = gather ? GroupKeys(group) : std::vector<int64_t>{key};
  RETURN_IF_ERROR(MakeResident(keys, PassOf(stage), moment, what));
  if (gather) RETURN_IF_ERROR(GatherGroup(group));
  Chunk& chunk = ChunkOfKey(key);
  bool zero_fill = false;
  for (TensorId t : info.tensors) {
    ASSIGN_OR_RETURN(TensorState s, store_->tensor_state(ChunkType::kParam, t));
    zero_fill |= s == TensorState::kFree;
  }
  RETURN_IF_ERROR(
      store_->SetOperatorState(ChunkType::kParam, op, TensorState::kCompute, load_stream_.get()));
  if (zero_fill) RETURN_IF_ERROR(SyncStream(*load_stream_));
  if (stage == Stage::kBackward) chunk.MarkPayloadWritten();
  active_ops_.emplace(op, stage);
  if (collectives_ != nullptr) {
    if (stage == Stage::kBackward) backward_touched_[group] = 1;
    if (stage == Stage::kForward && in_iteration_ && !backward_started_) ++forward_uses_[op];
  }
  for (int64_t k : keys) {
    RecordUse(k, moment);
    RETURN_IF_ERROR(RecordAccess(k, moment));
  }
  ReportAccess(info.name, -1, stage, moment, request_ns);
  if (absl::Status s = Prefetch(moment); !s.ok()) {
    // A prefetch is an optimization: the access at the next moment will load what is missing.
    LOG(WARNING) << "ChunkManager: prefetch after " << what << " failed: " << s;
  }
  return absl::OkStatus();
}

absl::Status ChunkManager::Release(OperatorId op, Stage stage) {
  BusyScope busy(this);
  if (stage == Stage::kAdam) {
    return absl::InvalidArgumentError(
        "Release is for operators in FWD or BWD; the optimizer uses ReleaseChunks");
  }
  const ChunkLayout& layout = store_->layout();
  if (op < 0 || op >= layout.num_operator_ids()) {
    return absl::InvalidArgumentError(absl::StrCat("Release: unknown operator id ", op));
  }
  const OperatorInfo& info = layout.op(op);
  auto it = active_ops_.find(op);
  if (it == active_ops_.end()) {
    return absl::FailedPreconditionError(absl::StrCat("Release of operator '", info.name, "' (",
                                                      StageName(stage),
                                                      ") without a matching Access"));
  }
  if (it->second != stage) {
    return absl::FailedPreconditionError(absl::StrCat("Release of operator '", info.name, "' in ",
                                                      StageName(stage), " but it was accessed in ",
                                                      StageName(it->second)));
  }
  const TensorState to =
      stage == Stage::kForward ? TensorState::kHoldAfterFwd : TensorState::kHoldAfterBwd;
  RETURN_IF_ERROR(store_->SetOperatorState(ChunkType::kParam, op, to));
  active_ops_.erase(it);
  if (options_.compute_stream != nullptr) {
    RETURN_IF_ERROR(options_.compute_stream->RecordEvent(compute_done_.get()));
    compute_pending_ = true;
  }
  if (options_.listener != nullptr) options_.listener->OnRelease(info.name, -1, stage, NowNs());
  const int64_t key = ChunkKey(ChunkId{ChunkType::kParam, info.chunk_index});
  if (collectives_ == nullptr) {
    if (stage == Stage::kBackward) RETURN_IF_ERROR(WriteBehind(key));
    return absl::OkStatus();
  }
  const int64_t group = layout.group_of(info.chunk_index);
  if (stage == Stage::kForward) {
    if ((!in_iteration_ || !backward_started_) && GroupAllIn(group, TensorState::kHoldAfterFwd)) {
      RETURN_IF_ERROR(FreeGroup(group));
    }
    return absl::OkStatus();
  }
  if (in_iteration_) ++backward_releases_[op];
  if (GroupFinishedBackward(group)) {
    RETURN_IF_ERROR(ReduceGroup(group, PassOf(stage), in_iteration_ ? metronome_.moment() : -1));
    RETURN_IF_ERROR(FreeGroup(group));
    // The owner's chunk holds the averaged gradients now, for the optimizer step.
    const int64_t own = ChunkKey(ChunkId{ChunkType::kParam, group * world_size_ + rank_});
    if (!store_->layout().is_padding(group * world_size_ + rank_)) {
      RETURN_IF_ERROR(WriteBehind(own));
    }
  }
  return absl::OkStatus();
}

// --- The optimizer -------------------------------------------------------------------------------

absl::StatusOr<AdamPlacement> ChunkManager::BeginAdam() {
  BusyScope busy(this);
  if (!active_ops_.empty()) {
    return absl::FailedPreconditionError(
        absl::StrCat("BeginAdam: operator '", store_->layout().op(active_ops_.begin()->first).name,
                     "' is still accessed; release every operator before the optimizer step"));
  }
  RETURN_IF_ERROR(FinishGroups(PassOf(Stage::kBackward)));
  ASSIGN_OR_RETURN(const int64_t moment, Tick(Stage::kAdam));
  // Nothing is known during the warm-up (or off the trace): every index runs on the host.
  if (moment >= 0 && metronome_.in_trace()) return adam_placement_;
  return AdamPlacement();
}

absl::Status ChunkManager::AccessChunks(int64_t chunk_index, absl::Span<const ChunkType> types,
                                        Device device, AccessMode mode) {
  BusyScope busy(this);
  if (chunk_index < 0 || chunk_index >= num_chunks_) {
    return absl::InvalidArgumentError(
        absl::StrCat("AccessChunks: chunk index ", chunk_index, " outside [0, ", num_chunks_, ")"));
  }
  if (types.empty()) return absl::InvalidArgumentError("AccessChunks: no chunk types given");
  if (!device.is_host() && device != accel_->device()) {
    return absl::InvalidArgumentError(absl::StrCat("AccessChunks: device ", device.ToString(),
                                                   " is neither the host nor ",
                                                   accel_->device().ToString()));
  }
  std::vector<int64_t> keys;
  for (ChunkType type : types) {
    const int64_t key = ChunkKey(ChunkId{type, chunk_index});
    if (std::find(keys.begin(), keys.end(), key) != keys.end()) {
      return absl::InvalidArgumentError(
          absl::StrCat("AccessChunks: type ", ChunkTypeName(type), " given twice"));
    }
    keys.push_back(key);
    const Chunk& chunk = ChunkOfKey(key);
    if (active_chunks_.contains(key) || chunk.tensor_count(TensorState::kCompute) > 0) {
      return absl::FailedPreconditionError(
          absl::StrCat("AccessChunks: chunk ", chunk.id().ToString(),
                       " is already in COMPUTE; release it first"));
    }
    if (!store_->layout().HoldsPayload(type, chunk_index, store_->rank())) {
      return absl::FailedPreconditionError(absl::StrCat(
          "AccessChunks: this rank holds no payload of chunk ", chunk.id().ToString()));
    }
  }
  const int64_t request_ns = options_.listener != nullptr ? NowNs() : 0;
  ASSIGN_OR_RETURN(const int64_t moment, Tick(Stage::kAdam));
  const std::string what = absl::StrCat("optimizer access of chunk ", chunk_index);
  if (device.is_accelerator()) {
    RETURN_IF_ERROR(MakeResident(keys, Stage::kAdam, moment, what));
  } else {
    for (int64_t key : keys) RETURN_IF_ERROR(MoveToHost(key, Stage::kAdam));
  }
  bool device_zero_fill = false;
  for (int64_t key : keys) {
    Chunk& chunk = ChunkOfKey(key);
    for (int slot = 0; slot < chunk.num_tensors(); ++slot) {
      device_zero_fill |= chunk.tensor_state(slot) == TensorState::kFree && device.is_accelerator();
      RETURN_IF_ERROR(chunk.SetTensorState(slot, TensorState::kCompute, load_stream_.get()));
    }
    if (mode == AccessMode::kReadWrite) chunk.MarkPayloadWritten();
    active_chunks_.insert(key);
  }
  if (device_zero_fill) RETURN_IF_ERROR(SyncStream(*load_stream_));
  if (device.is_accelerator()) {
    for (int64_t key : keys) {
      RecordUse(key, moment);
      RETURN_IF_ERROR(RecordAccess(key, moment));
    }
  }
  ReportAccess("adam", chunk_index, Stage::kAdam, moment, request_ns);
  return absl::OkStatus();
}

absl::Status ChunkManager::ReleaseChunks(int64_t chunk_index, absl::Span<const ChunkType> types) {
  BusyScope busy(this);
  if (chunk_index < 0 || chunk_index >= num_chunks_) {
    return absl::InvalidArgumentError(absl::StrCat("ReleaseChunks: chunk index ", chunk_index,
                                                   " outside [0, ", num_chunks_, ")"));
  }
  for (ChunkType type : types) {
    const int64_t key = ChunkKey(ChunkId{type, chunk_index});
    if (!active_chunks_.contains(key)) {
      return absl::FailedPreconditionError(absl::StrCat("ReleaseChunks of chunk ",
                                                        ChunkId{type, chunk_index}.ToString(),
                                                        " without a matching AccessChunks"));
    }
  }
  for (ChunkType type : types) {
    const int64_t key = ChunkKey(ChunkId{type, chunk_index});
    Chunk& chunk = ChunkOfKey(key);
    for (int slot = 0; slot < chunk.num_tensors(); ++slot) {
      if (chunk.tensor_state(slot) == TensorState::kCompute) {
        RETURN_IF_ERROR(chunk.SetTensorState(slot, TensorState::kHold));
      }
    }
    active_chunks_.erase(key);
  }
  if (options_.listener != nullptr) {
    options_.listener->OnRelease("adam", chunk_index, Stage::kAdam, NowNs());
  }
  if (options_.compute_stream != nullptr) {
    RETURN_IF_ERROR(options_.compute_stream->RecordEvent(compute_done_.get()));
    compute_pending_ = true;
  }
  return absl::OkStatus();
}

// --- ZeRO ----------------------------------------------------------------------------------------

std::vector<int64_t> ChunkManager::GroupKeys(int64_t group) const {
  const ChunkLayout& layout = store_->layout();
  std::vector<int64_t> keys;
  for (int64_t index : layout.ChunksInGroup(group)) {
    if (!layout.is_padding(index)) keys.push_back(ChunkKey(ChunkId{ChunkType::kParam, index}));
  }
  return keys;
}

bool ChunkManager::GroupAllIn(int64_t group, TensorState state) const {
  for (int64_t key : GroupKeys(group)) {
    const Chunk& chunk = store_->chunk(ChunkIdOfKey(key));
    if (chunk.tensor_count(state) != chunk.num_tensors()) return false;
  }
  return true;
}

bool ChunkManager::GroupFinishedBackward(int64_t group) const {
  if (!GroupAllIn(group, TensorState::kHoldAfterBwd)) return false;
  for (OperatorId op : group_ops_[group]) {
    if (backward_releases_[op] < std::max(forward_uses_[op], 1)) return false;
  }
  return true;
}

absl::Status ChunkManager::RunGroupCollective(
    int64_t group, const std::vector<int64_t>& keys,
    const std::function<absl::Status(absl::Span<void* const>, int64_t, DType)>& collective) {
  std::vector<void*> payloads(static_cast<size_t>(world_size_), nullptr);
  for (int64_t key : keys) {
    Chunk& chunk = ChunkOfKey(key);
    if (!chunk.has_payload()) {
      return absl::InternalError(absl::StrCat("ZeRO group ", group, ": chunk ",
                                              chunk.id().ToString(), " has no payload"));
    }
    payloads[static_cast<size_t>(chunk.owner_rank())] = chunk.payload();
  }
  for (int64_t key : keys) ChunkOfKey(key).Pin();
  const int64_t start = NowNs();
  absl::Status status = collective(payloads, store_->layout().capacity_elems(),
                                   store_->compute_dtype());
  counters_.comm_ns += NowNs() - start;
  for (int64_t key : keys) RETURN_IF_ERROR(ChunkOfKey(key).Unpin());
  if (!status.ok()) {
    return absl::Status(status.code(), absl::StrCat("ZeRO collective of chunk group ", group,
                                                    " (rank ", rank_, " of ", world_size_,
                                                    "): ", status.message()));
  }
  return absl::OkStatus();
}

absl::Status ChunkManager::GatherGroup(int64_t group) {
  const std::vector<int64_t> keys = GroupKeys(group);
  // An owner's tensor that was never written (FREE) is zero-filled, as an access would, so that
  // every rank sees the same bytes.
  bool zero_fill = false;
  for (int64_t key : keys) {
    Chunk& chunk = ChunkOfKey(key);
    if (!chunk.is_local()) continue;
    for (int slot = 0; slot < chunk.num_tensors(); ++slot) {
      if (chunk.tensor_state(slot) == TensorState::kFree) {
        RETURN_IF_ERROR(chunk.SetTensorState(slot, TensorState::kCompute, load_stream_.get()));
        RETURN_IF_ERROR(chunk.SetTensorState(slot, TensorState::kHold));
        zero_fill = true;
      }
    }
  }
  if (zero_fill) RETURN_IF_ERROR(SyncStream(*load_stream_));
  RETURN_IF_ERROR(RunGroupCollective(
      group, keys, [&](absl::Span<void* const> payloads, int64_t count, DType dtype) {
        return collectives_->AllGatherGroup(group, payloads, count, dtype);
      }));
  for (int64_t key : keys) {
    Chunk& chunk = ChunkOfKey(key);
    if (!chunk.is_local()) {
      chunk.MarkPayloadWritten();
      counters_.all_gather_bytes += chunk.capacity_bytes();
    }
    for (int slot = 0; slot < chunk.num_tensors(); ++slot) {
      if (chunk.tensor_state(slot) != TensorState::kHold) {
        RETURN_IF_ERROR(chunk.SetTensorState(slot, TensorState::kHold));
      }
    }
  }
  ++counters_.all_gathers;
  gathered_[group] = 1;
  backward_touched_[group] = 0;
  VLOG(2) << "rank " << rank_ << ": gathered group " << group;
  return absl::OkStatus();
}

absl::Status ChunkManager::ReduceGroup(int64_t group, Stage stage, int64_t moment) {
  const std::vector<int64_t> keys = GroupKeys(group);
  RETURN_IF_ERROR(
      MakeResident(keys, stage, moment, absl::StrCat("reduce-scatter of chunk group ", group)));
  // The caller's kernels that wrote the gradients must be done.
  RETURN_IF_ERROR(WaitForCompute());
  RETURN_IF_ERROR(RunGroupCollective(
      group, keys, [&](absl::Span<void* const> payloads, int64_t count, DType dtype) {
        return collectives_->ReduceScatterGroup(group, payloads, count, dtype);
      }));
  for (int64_t key : keys) {
    Chunk& chunk = ChunkOfKey(key);
    if (chunk.is_local()) {
      chunk.MarkPayloadWritten();
    } else {
      counters_.reduce_scatter_bytes += chunk.capacity_bytes();
    }
  }
  ++counters_.reduce_scatters;
  backward_touched_[group] = 0;
  VLOG(2) << "rank " << rank_ << ": reduce-scattered group " << group;
  return absl::OkStatus();
}

absl::Status ChunkManager::FreeGroup(int64_t group) {
  for (int64_t key : GroupKeys(group)) {
    Chunk& chunk = ChunkOfKey(key);
    if (chunk.is_local() || !chunk.has_payload()) continue;
    RETURN_IF_ERROR(WaitForCopies({key}));
    // Kernels enqueued before the last Release may still read the payload.
    RETURN_IF_ERROR(WaitForCompute());
    RETURN_IF_ERROR(chunk.ReleasePayload());
    if (resident_.erase(key) > 0) resident_bytes_ -= device_cost_bytes_;
    prefetched_.erase(key);
    ++counters_.remote_releases;
  }
  gathered_[group] = 0;
  backward_touched_[group] = 0;
  return absl::OkStatus();
}

absl::Status ChunkManager::FinishGroups(Stage stage) {
  if (collectives_ == nullptr) return absl::OkStatus();
  for (int64_t group = 0; group < static_cast<int64_t>(gathered_.size()); ++group) {
    if (!gathered_[group]) continue;
    if (backward_touched_[group]) {
      RETURN_IF_ERROR(ReduceGroup(group, stage, in_iteration_ ? metronome_.moment() : -1));
    }
    RETURN_IF_ERROR(FreeGroup(group));
  }
  return absl::OkStatus();
}

absl::Status ChunkManager::ReleaseRemoteChunks() {
  BusyScope busy(this);
  if (!active_ops_.empty() || !active_chunks_.empty()) {
    return absl::FailedPreconditionError(
        "ReleaseRemoteChunks: an operator or chunk is still accessed; release it first");
  }
  if (collectives_ == nullptr) return absl::OkStatus();
  for (int64_t group = 0; group < static_cast<int64_t>(gathered_.size()); ++group) {
    if (gathered_[group]) RETURN_IF_ERROR(FreeGroup(group));
  }
  return absl::OkStatus();
}

}  // namespace ps
