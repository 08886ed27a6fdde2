#include "scheduler/chunk_manager.h"

#include <algorithm>
#include <utility>

#include "absl/strings/str_cat.h"
#include "base/status_macros.h"
#include "base/units.h"
#include "chunk/tensor_state.h"
#include "glog/logging.h"
#include "memory/memory_tracker.h"

namespace ps {

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
      if (memory->chunk_pool_for(bytes) == nullptr) {
        return absl::InvalidArgumentError(absl::StrCat(
            "ChunkManager: a ", ChunkTypeName(type), " chunk needs ", FormatBytes(bytes),
            " but the largest chunk pool of ", memory->device().ToString(), " has blocks of ",
            FormatBytes(memory->chunk_pools().back()->block_bytes()),
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
      new ChunkManager(store, accelerator, host, std::move(options)));
  const ChunkManagerOptions& o = manager->options_;
  ASSIGN_OR_RETURN(
      ResidencyPlanner planner,
      ResidencyPlanner::Create(
          {.budget_bytes = budget,
           .reserved_bytes = o.comm_buffer_bytes + o.nonmodel_slack_bytes,
           .warmup_chunk_fraction = o.warmup_chunk_fraction,
           .chunk_cost_bytes =
               accelerator
                   ->chunk_pool_for(layout.ChunkBytes(ChunkType::kMaster, store->compute_dtype()))
                   ->block_bytes(),
           .param_chunk_cost_bytes =
               accelerator
                   ->chunk_pool_for(layout.ChunkBytes(ChunkType::kParam, store->compute_dtype()))
                   ->block_bytes(),
           .adam_margin_bytes = o.adam_margin_bytes,
           .num_chunks = store->num_chunks()}));
  manager->planner_.emplace(std::move(planner));
  manager->accelerator_in_host_memory_ = backend->name() == "cpu";
  ASSIGN_OR_RETURN(manager->engine_, ResidencyEngine::Create(store, backend, accelerator, host,
                                                             {.clean_eviction = o.clean_eviction,
                                                              .compute_stream = o.compute_stream,
                                                              .clock = o.clock,
                                                              .listener = o.listener},
                                                             &manager->counters_));
  absl::flat_hash_set<int64_t> static_keys;
  for (int64_t index : o.static_param_chunks) {
    static_keys.insert(manager->keys_.Key(ChunkType::kParam, index));
  }
  ASSIGN_OR_RETURN(manager->policy_, CreateEvictionPolicy(o.policy, std::move(static_keys)));
  if (world > 1) {
    manager->groups_ = std::make_unique<ZeroGroups>(store, manager->engine_.get(), o.collectives,
                                                    &manager->counters_);
  }
  if (o.disk.has_value()) {
    ASSIGN_OR_RETURN(manager->disk_,
                     DiskTier::Create(store, host, *o.disk, &manager->counters_, o.clock));
    // Frozen param chunks on disk share the engine's copies and evictions.
    manager->disk_->AttachEngine(manager->engine_.get());
    manager->engine_->SetDiskDropper(manager->disk_.get());
  }
  if (o.evict_under_pressure) {
    manager->reclaimer_ = std::make_unique<PressureReclaimer>(manager.get());
    accelerator->upstream()->AddReclaimer(
        manager->reclaimer_.get(),
        absl::StrCat("chunk_manager(", accelerator->device().ToString(), ")"));
  }
  return manager;
}

ChunkManager::ChunkManager(ChunkStore* store, DeviceMemory* accelerator, DeviceMemory* host,
                           ChunkManagerOptions options)
    : store_(store),
      accel_(accelerator),
      host_(host),
      options_(std::move(options)),
      keys_(store->num_chunks()) {
  const ChunkLayout& layout = store->layout();
  chunk_ops_.resize(static_cast<size_t>(store->num_chunks()));
  for (OperatorId op = 0; op < layout.num_operator_ids(); ++op) {
    const OperatorInfo& info = layout.op(op);
    if (info.placed() && info.chunk_index >= 0 && info.chunk_index < store->num_chunks()) {
      chunk_ops_[static_cast<size_t>(info.chunk_index)].push_back(op);
    }
  }
  forward_uses_.assign(static_cast<size_t>(layout.num_operator_ids()), 0);
  backward_releases_.assign(static_cast<size_t>(layout.num_operator_ids()), 0);
  gradients_final_called_.assign(static_cast<size_t>(store->num_chunks()), 0);
}

ChunkManager::~ChunkManager() {
  if (reclaimer_ != nullptr) accel_->upstream()->RemoveReclaimer(reclaimer_.get());
  // The disk tier goes first; the engine must not call it afterwards.
  if (engine_ != nullptr) engine_->SetDiskDropper(nullptr);
  // The engine, destroyed next, waits for the compute stream and the copies in flight.
}

int64_t ChunkManager::ReclaimUnderPressure() {
  if (busy_ > 0) return 0;  // an allocation of the manager's own: nothing may move now
  BusyScope busy(this);
  const Stage stage =
      in_iteration_ && metronome_.moment() >= 0 ? PassOf(metronome_.stage()) : Stage::kForward;
  const int64_t reclaims = counters_.pressure_reclaims;
  const int64_t resident = engine_->resident_bytes();
  const CachingAllocatorStats scratch = accel_->scratch()->stats();
  const int64_t released = engine_->ReclaimUnderPressure(active_chunks_, {stage, CurrentMoment()});
  if (counters_.pressure_reclaims > reclaims) {
    // What the plan's slack did not cover: the numbers to compare with the plan's moment.
    LOG_FIRST_N(WARNING, 5) << "ChunkManager: pressure reclaim at iteration "
                            << metronome_.iteration() << " moment " << CurrentMoment() << " ("
                            << StageName(stage) << "): chunks resident " << FormatBytes(resident)
                            << " (limit " << FormatBytes(current_limit_bytes_)
                            << "), non-model in use " << FormatBytes(scratch.in_use_bytes)
                            << " in segments of " << FormatBytes(scratch.reserved_bytes)
                            << " (free inside segments "
                            << FormatBytes(scratch.cached_bytes - scratch.free_segment_bytes)
                            << ", reserved beside the tide " << FormatBytes(reserved_bytes())
                            << ")";
  }
  return released;
}

int64_t ChunkManager::UnplannedStrandedBytes() const {
  const CachingAllocator* scratch = accel_->scratch();
  if (scratch == nullptr) return 0;
  const CachingAllocatorStats s = scratch->stats();
  // Free space inside segments still in use (fully free segments the pools reclaim on demand).
  const int64_t stranded = s.cached_bytes - s.free_segment_bytes;
  return std::max<int64_t>(0, stranded - options_.nonmodel_slack_bytes);
}

// --- Moments -------------------------------------------------------------------------------------

absl::Status ChunkManager::BeginIteration() {
  BusyScope busy(this);
  if (in_iteration_) {
    return absl::FailedPreconditionError(absl::StrCat(
        "BeginIteration: iteration ", metronome_.iteration(), " has not ended; call EndIteration"));
  }
  accel_->tracker()->ResetPeaks();
  host_->tracker()->ResetPeaks();
  iteration_start_counters_ = counters_;
  if (disk_ != nullptr) disk_->ResetIterationPeak();
  in_iteration_ = true;
  backward_started_ = false;
  if (groups_ != nullptr) groups_->BeginIteration();
  std::fill(forward_uses_.begin(), forward_uses_.end(), 0);
  std::fill(backward_releases_.begin(), backward_releases_.end(), 0);
  std::fill(gradients_final_called_.begin(), gradients_final_called_.end(), 0);
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
        absl::StrCat("EndIteration: chunk ", keys_.IdOf(*active_chunks_.begin()).ToString(),
                     " is still accessed by the optimizer; call ReleaseChunks first"));
  }
  RETURN_IF_ERROR(FinishGroups(PassOf(Stage::kBackward)));
  const bool warmup = metronome_.is_warmup();
  if (warmup && metronome_.moment() < 0) {
    // Nothing to learn a schedule from (the iteration's first access failed, or it made none):
    // the next iteration is the warm-up again.
    LOG(WARNING) << "ChunkManager: the warm-up iteration ended without a moment (no successful "
                    "Access, BeginAdam or AccessChunks); the next iteration is the warm-up";
    in_iteration_ = false;
    backward_started_ = false;
    return absl::OkStatus();
  }
  RETURN_IF_ERROR(SampleTide());
  const int64_t moments = metronome_.EndIteration();
  if (warmup) {
    RETURN_IF_ERROR(trace_.Finish(moments));
    policy_->SetSchedule(&trace_.schedule());
    planner_->SetTrace(&trace_);
    if (disk_ != nullptr) disk_->SetSchedule(&trace_.schedule());
    std::vector<int64_t> state_indices;
    for (int64_t i = 0; i < store_->num_chunks(); ++i) {
      if (store_->layout().HoldsPayload(ChunkType::kMaster, i, store_->rank())) {
        state_indices.push_back(i);
      }
    }
    adam_placement_ = planner_->PlanAdam(state_indices);
  } else if (moments != trace_.total_moments() && gradients_final_hook_used_) {
    // optimizer.overlap: the optimizer step's accesses depend on its verdict (commit: only the
    // chunks not updated inside backward; rollback: the undo, then the serialized passes), so
    // the count varies by design (docs/pipeline.md).
    LOG_FIRST_N(INFO, 1) << "ChunkManager: iteration " << metronome_.iteration() - 1 << " had "
                         << moments << " moments but the warm-up had " << trace_.total_moments()
                         << " (the optimizer ran inside backward); moments off the learned "
                            "trace use the warm-up's conservative limits";
  } else if (moments != trace_.total_moments()) {
    LOG(WARNING) << "ChunkManager: iteration " << metronome_.iteration() - 1 << " had " << moments
                 << " moments but the warm-up had " << trace_.total_moments()
                 << "; moments off the learned trace use the warm-up's conservative limits";
  }
  iteration_counters_.push_back(counters_.Minus(iteration_start_counters_));
  // A peak is not a difference: the iteration's own.
  if (disk_ != nullptr)
    iteration_counters_.back().disk_peak_host_bytes = disk_->iteration_peak_bytes();
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

absl::Status ChunkManager::Tick(Stage stage, int64_t moment) {
  if (moment < 0) return absl::OkStatus();
  RETURN_IF_ERROR(SampleTide());
  const int64_t ticked = metronome_.Tick(stage);
  CHECK_EQ(ticked, moment) << "ChunkManager: the metronome moved between planning and ticking";
  return absl::OkStatus();
}

// --- Making chunks resident ----------------------------------------------------------------------

std::string ChunkManager::WorkingSetError(const std::string& what, const AccessPlan& plan,
                                          int64_t moment) const {
  std::string stuck;
  if (plan.working_set_bytes > plan.own_bytes) {
    stuck = absl::StrCat(", plus ", FormatBytes(plan.working_set_bytes - plan.own_bytes),
                         " of other chunks in COMPUTE or pinned");
  }
  return absl::StrCat(
      what, moment >= 0 ? absl::StrCat(" at moment ", moment) : std::string(" (untracked)"),
      " needs ", FormatBytes(plan.working_set_bytes), " of chunks resident on ",
      accel_->device().ToString(), " (", FormatBytes(plan.own_bytes), " for its own chunks", stuck,
      "), but only ", FormatBytes(plan.limits.hard_bytes), " of the ", FormatBytes(budget_bytes()),
      " device budget is left for chunks (non-model data ",
      plan.limits.known ? "peaks at " : "uses ", FormatBytes(plan.limits.tide_bytes), ", ",
      FormatBytes(reserved_bytes()),
      " is reserved for communication buffers and slack). Use a smaller chunk size, activation "
      "checkpointing (or a smaller batch) to lower the non-model peak, or more device memory");
}

absl::Status ChunkManager::MakeResident(const std::vector<int64_t>& keys, Stage stage,
                                        int64_t moment, const std::string& what) {
  const absl::flat_hash_set<int64_t> keep(keys.begin(), keys.end());
  std::vector<int64_t> missing;
  for (int64_t key : keys) {
    if (engine_->resident(key)) {
      engine_->NoteAccessed(key);
    } else {
      missing.push_back(key);
    }
  }
  int64_t own_bytes = 0, missing_bytes = 0;
  for (int64_t key : keys) own_bytes += engine_->key_cost_bytes(key);
  for (int64_t key : missing) missing_bytes += engine_->key_cost_bytes(key);
  const AccessPlan plan =
      planner_->PlanAccess(moment, accel_->tracker()->current_bytes(MemoryKind::kNonModelData),
                           engine_->resident_bytes(), own_bytes, engine_->StuckBytes(keep),
                           missing_bytes, UnplannedStrandedBytes());
  if (!plan.fits) return absl::ResourceExhaustedError(WorkingSetError(what, plan, moment));
  current_limit_bytes_ = plan.limit_bytes;
  VLOG(2) << "moment " << moment << ": " << what << ", limit " << current_limit_bytes_ << " bytes, "
          << engine_->num_resident() << " chunks resident";
  const MoveContext context{stage, moment};
  if (plan.evict_bytes > 0) {
    std::vector<EvictionCandidate> candidates;
    for (int64_t key : engine_->ResidentKeys()) {
      if (!keep.contains(key) && ChunkOfKey(key).movable()) {
        candidates.push_back({key, engine_->key_cost_bytes(key)});
      }
    }
    const std::vector<int64_t> victims =
        policy_->ChooseVictims(candidates, plan.evict_bytes, moment);
    int64_t freed = 0;
    for (int64_t key : victims) freed += engine_->key_cost_bytes(key);
    if (freed < plan.evict_bytes) {
      return absl::ResourceExhaustedError(absl::StrCat(
          what, ": cannot make room for its chunks on ", accel_->device().ToString(), ": ",
          FormatBytes(plan.evict_bytes), " must be evicted but only ", FormatBytes(freed),
          " of resident chunks may move (the rest are in COMPUTE or pinned)"));
    }
    RETURN_IF_ERROR(engine_->Evict(victims, context));
  }
  return engine_->Load(missing, context, /*prefetch=*/false);
}

absl::Status ChunkManager::AwaitAccess(const std::vector<int64_t>& keys, bool zero_fill) {
  if (engine_->has_compute_stream()) return engine_->OrderComputeAfterLoads(keys, zero_fill);
  return WaitForAccessOnHost(keys, zero_fill);
}

absl::Status ChunkManager::WaitForAccessOnHost(const std::vector<int64_t>& keys, bool zero_fill) {
  RETURN_IF_ERROR(engine_->WaitForCopies(keys));
  return zero_fill ? engine_->SyncLoadStream() : absl::OkStatus();
}

absl::Status ChunkManager::Prefetch(int64_t moment) {
  if (!options_.prefetch) return absl::OkStatus();
  const int64_t next = planner_->PrefetchMoment(moment);
  if (next < 0) return absl::OkStatus();
  const Stage stage = PassOf(trace_.sample(next).stage);
  const std::vector<int64_t>& next_keys = trace_.ChunksAt(next);
  std::vector<int64_t> keys;
  for (int64_t key : next_keys) {
    const Chunk& chunk = ChunkOfKey(key);
    // A frozen chunk still being read from disk is left to its demand access.
    if (chunk.has_payload() && chunk.device().is_host() && chunk.movable() &&
        !chunk.has_backing() && (disk_ == nullptr || disk_->TakeReadyParam(key))) {
      keys.push_back(key);
    }
  }
  if (keys.empty()) return absl::OkStatus();
  int64_t missing_bytes = 0, next_bytes = 0;
  for (int64_t key : keys) missing_bytes += engine_->key_cost_bytes(key);
  for (int64_t key : next_keys) next_bytes += engine_->key_cost_bytes(key);
  const PrefetchPlan plan = planner_->PlanPrefetch(
      moment, accel_->tracker()->current_bytes(MemoryKind::kNonModelData),
      engine_->resident_bytes(), missing_bytes, next_bytes, UnplannedStrandedBytes());
  if (!plan.allowed) return absl::OkStatus();
  const MoveContext context{stage, moment};
  if (plan.evict_bytes > 0) {
    // The victims the access at `next` would choose, and only free (clean) ones.
    const absl::flat_hash_set<int64_t> keep(next_keys.begin(), next_keys.end());
    std::vector<EvictionCandidate> candidates;
    for (int64_t key : engine_->ResidentKeys()) {
      if (!keep.contains(key) && !ChunkOfKey(key).pinned()) {
        candidates.push_back({key, engine_->key_cost_bytes(key)});
      }
    }
    const std::vector<int64_t> victims = policy_->ChooseVictims(candidates, plan.evict_bytes, next);
    int64_t freed = 0;
    for (int64_t key : victims) freed += engine_->key_cost_bytes(key);
    if (freed < plan.evict_bytes) return absl::OkStatus();
    for (int64_t key : victims) {
      const Chunk& chunk = ChunkOfKey(key);
      const bool free_drop =
          chunk.backing_valid() || (disk_ != nullptr && disk_->CanDropToDisk(key));
      if (!chunk.movable() || !free_drop || !engine_->CopiesDone(key)) {
        return absl::OkStatus();
      }
    }
    RETURN_IF_ERROR(engine_->Evict(victims, context));
  }
  return engine_->Load(keys, context, /*prefetch=*/true);
}

absl::Status ChunkManager::WriteBehind(int64_t key) {
  const int64_t moment = metronome_.moment();
  if (!options_.write_behind || !options_.clean_eviction || !in_iteration_ ||
      !metronome_.in_trace()) {
    return absl::OkStatus();
  }
  // Used on the accelerator again this iteration, or updated there by the optimizer: it stays.
  const ChunkId id = keys_.IdOf(key);
  if (planner_->UsedLaterInIteration(key, moment) ||
      (id.type == ChunkType::kParam && adam_placement_.OnAccelerator(id.index))) {
    return absl::OkStatus();
  }
  // Otherwise it goes back to the host before its next use whatever happens, so its copy may as
  // well start now.
  return engine_->StartWriteBehind(key, {PassOf(metronome_.stage()), moment}).status();
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
  const int64_t request_ns = engine_->listener() != nullptr ? engine_->NowNs() : 0;
  // The moment this access will be; it is only counted (ticked) once the chunks are resident.
  const int64_t moment = NextMoment();
  const Stage pass = stage == Stage::kBackward ? Stage::kBackward : PassOf(stage);
  const int64_t key = keys_.Key(ChunkType::kParam, info.chunk_index);
  const std::string what = absl::StrCat("operator '", info.name, "' (", StageName(stage), ")");
  const int64_t group = layout.group_of(info.chunk_index);
  const bool gather = groups_ != nullptr && !groups_->gathered(group);
  // A gather needs the whole group resident as one working set.
  const std::vector<int64_t> keys = gather ? groups_->Keys(group) : std::vector<int64_t>{key};
  // The disk tier first reads spilled frozen chunks back into host memory (the moment only on
  // the learned trace: its schedule orders evictions and the read-ahead).
  const int64_t disk_moment =
      moment >= 0 && !metronome_.is_warmup() && moment < trace_.total_moments() ? moment : -1;
  if (disk_ != nullptr) RETURN_IF_ERROR(disk_->PrepareParamAccess(keys, disk_moment));
  RETURN_IF_ERROR(MakeResident(keys, pass, moment, what));
  if (gather) RETURN_IF_ERROR(groups_->Gather(group));
  RETURN_IF_ERROR(Tick(stage, moment));
  if (stage == Stage::kBackward) backward_started_ = true;
  Chunk& chunk = ChunkOfKey(key);
  bool zero_fill = false;
  for (TensorId t : info.tensors) {
    ASSIGN_OR_RETURN(TensorState s, store_->tensor_state(ChunkType::kParam, t));
    zero_fill |= s == TensorState::kFree;
  }
  // A zero-fill changes a frozen chunk's bytes: its disk slot is stale.
  if (disk_ != nullptr) disk_->NoteAccess(key, zero_fill);
  RETURN_IF_ERROR(store_->SetOperatorState(ChunkType::kParam, op, TensorState::kCompute,
                                           &engine_->load_stream()));
  RETURN_IF_ERROR(AwaitAccess(keys, zero_fill));
  // A frozen operator's backward only reads its parameters (no gradient in its slots): the chunk
  // stays clean, so its host copy stays valid and it is never written back.
  if (stage == Stage::kBackward && info.trainable) chunk.MarkPayloadWritten();
  active_ops_.emplace(op, stage);
  if (stage == Stage::kForward && in_iteration_ && !backward_started_ &&
      static_cast<size_t>(op) < forward_uses_.size()) {
    ++forward_uses_[static_cast<size_t>(op)];
  }
  if (groups_ != nullptr) {
    groups_->NoteAccess(op, group, stage, in_iteration_ && !backward_started_);
  }
  for (int64_t k : keys) {
    policy_->RecordUse(k, std::max<int64_t>(moment, 0));
    if (in_iteration_ && metronome_.is_warmup() && moment >= 0) {
      RETURN_IF_ERROR(trace_.RecordAccess(k, moment));
    }
  }
  engine_->ReportAccess(info.name, -1, stage, moment, in_iteration_ && metronome_.is_warmup(),
                        request_ns);
  if (absl::Status s = Prefetch(moment); !s.ok()) {
    // A prefetch is an optimization: the access at the next moment will load what is missing.
    LOG(WARNING) << "ChunkManager: prefetch after " << what << " failed: " << s;
  }
  if (disk_ != nullptr) disk_->AfterParamAccess(disk_moment);
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
  // A frozen operator's slots still hold the parameter after its backward: HOLD, the state an
  // optimizer step leaves a trained parameter in, so the next forward may access it at once.
  const TensorState to = stage == Stage::kForward ? TensorState::kHoldAfterFwd
                         : info.trainable         ? TensorState::kHoldAfterBwd
                                                  : TensorState::kHold;
  RETURN_IF_ERROR(store_->SetOperatorState(ChunkType::kParam, op, to));
  active_ops_.erase(it);
  RETURN_IF_ERROR(engine_->NoteComputeRelease());
  engine_->ReportRelease(info.name, -1, stage);
  const int64_t key = keys_.Key(ChunkType::kParam, info.chunk_index);
  if (groups_ == nullptr) {
    if (stage == Stage::kBackward) {
      RETURN_IF_ERROR(WriteBehind(key));
      if (in_iteration_ && static_cast<size_t>(op) < backward_releases_.size()) {
        ++backward_releases_[static_cast<size_t>(op)];
      }
      if (info.trainable) {
        RETURN_IF_ERROR(
            CallGradientsFinalHook(info.chunk_index, GradientsFinalNow(info.chunk_index)));
      }
    }
    return absl::OkStatus();
  }
  const int64_t group = layout.group_of(info.chunk_index);
  if (stage == Stage::kForward) {
    if ((!in_iteration_ || !backward_started_) &&
        groups_->AllIn(group, TensorState::kHoldAfterFwd)) {
      RETURN_IF_ERROR(groups_->Free(group));
    }
    return absl::OkStatus();
  }
  if (in_iteration_) groups_->NoteBackwardRelease(op);
  if (groups_->FinishedBackward(group)) {
    // A frozen group has no gradients to reduce: its gathered copies are just freed.
    if (layout.group_frozen(group)) return groups_->Free(group);
    RETURN_IF_ERROR(ReduceGroup(group, PassOf(stage), CurrentMoment()));
    RETURN_IF_ERROR(groups_->Free(group));
    // The owner's chunk holds the averaged gradients now, for the optimizer step.
    if (const int64_t own = groups_->OwnKey(group); own >= 0) {
      RETURN_IF_ERROR(WriteBehind(own));
      RETURN_IF_ERROR(CallGradientsFinalHook(keys_.IdOf(own).index, true));
    }
  }
  return absl::OkStatus();
}

bool ChunkManager::GradientsFinalNow(int64_t chunk_index) const {
  if (!in_iteration_ || static_cast<size_t>(chunk_index) >= chunk_ops_.size()) return false;
  const Chunk& chunk = store_->chunk(ChunkType::kParam, chunk_index);
  if (chunk.tensor_count(TensorState::kHoldAfterBwd) != chunk.num_tensors()) return false;
  for (OperatorId op : chunk_ops_[static_cast<size_t>(chunk_index)]) {
    const size_t o = static_cast<size_t>(op);
    if (backward_releases_[o] < std::max(forward_uses_[o], 1)) return false;
  }
  return true;
}

absl::Status ChunkManager::CallGradientsFinalHook(int64_t chunk_index, bool final) {
  if (!final || !gradients_final_hook_ || !in_iteration_ || chunk_index < 0 ||
      static_cast<size_t>(chunk_index) >= gradients_final_called_.size() ||
      gradients_final_called_[static_cast<size_t>(chunk_index)]) {
    return absl::OkStatus();
  }
  gradients_final_called_[static_cast<size_t>(chunk_index)] = 1;
  return gradients_final_hook_(chunk_index);
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
  // The optimizer reads the gradients backward's kernels write: CPU Adam on the host, GPU Adam on
  // its own stream, from chunks that stay where backward left them (no move, so no copy waits for
  // the compute stream). Every gradient is needed before the first update anyway (the global norm
  // and the overflow check), so one host wait here costs no overlap.
  RETURN_IF_ERROR(engine_->WaitForCompute());
  const int64_t moment = NextMoment();
  RETURN_IF_ERROR(Tick(Stage::kAdam, moment));
  // Nothing is known during the warm-up (or off the trace): every index runs on the host.
  if (moment >= 0 && metronome_.in_trace()) return adam_placement_;
  return AdamPlacement();
}

absl::Status ChunkManager::AccessChunks(int64_t chunk_index, absl::Span<const ChunkType> types,
                                        Device device, AccessMode mode) {
  const std::vector<AccessMode> modes(types.size(), mode);
  return AccessChunks(chunk_index, types, device, absl::MakeConstSpan(modes));
}

absl::Status ChunkManager::AccessChunks(int64_t chunk_index, absl::Span<const ChunkType> types,
                                        Device device, absl::Span<const AccessMode> modes) {
  return AccessChunksImpl(chunk_index, types, device, modes, /*tracked=*/true);
}

absl::Status ChunkManager::AccessChunksInBackward(int64_t chunk_index,
                                                  absl::Span<const ChunkType> types, Device device,
                                                  absl::Span<const AccessMode> modes) {
  {
    BusyScope busy(this);
    // Backward's kernels wrote the gradients the optimizer is about to read on the host.
    RETURN_IF_ERROR(engine_->WaitForCompute());
  }
  return AccessChunksImpl(chunk_index, types, device, modes, /*tracked=*/false);
}

absl::Status ChunkManager::AccessChunksImpl(int64_t chunk_index, absl::Span<const ChunkType> types,
                                            Device device, absl::Span<const AccessMode> modes,
                                            bool tracked) {
  BusyScope busy(this);
  if (chunk_index < 0 || chunk_index >= store_->num_chunks()) {
    return absl::InvalidArgumentError(absl::StrCat("AccessChunks: chunk index ", chunk_index,
                                                   " outside [0, ", store_->num_chunks(), ")"));
  }
  if (types.empty()) return absl::InvalidArgumentError("AccessChunks: no chunk types given");
  if (modes.size() != types.size()) {
    return absl::InvalidArgumentError(absl::StrCat("AccessChunks: ", types.size(),
                                                   " chunk types but ", modes.size(),
                                                   " access modes; give one mode per type"));
  }
  if (!device.is_host() && device != accel_->device()) {
    return absl::InvalidArgumentError(absl::StrCat("AccessChunks: device ", device.ToString(),
                                                   " is neither the host nor ",
                                                   accel_->device().ToString()));
  }
  std::vector<int64_t> keys;
  for (ChunkType type : types) {
    const int64_t key = keys_.Key(type, chunk_index);
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
  const int64_t request_ns = engine_->listener() != nullptr ? engine_->NowNs() : 0;
  // The moment this access will be; it is only counted (ticked) once the chunks are in place.
  // An untracked access (inside backward) is no moment.
  const int64_t moment = tracked ? NextMoment() : -1;
  const std::string what = absl::StrCat("optimizer access of chunk ", chunk_index);
  // The disk tier first brings spilled optimizer state into host memory.
  if (disk_ != nullptr) RETURN_IF_ERROR(disk_->PrepareAccess(chunk_index, keys, device));
  if (device.is_accelerator()) {
    RETURN_IF_ERROR(MakeResident(keys, Stage::kAdam, moment, what));
  } else {
    for (int64_t key : keys) RETURN_IF_ERROR(engine_->MoveToHost(key, {Stage::kAdam, moment}));
  }
  if (disk_ != nullptr) disk_->NoteHostBytes();
  RETURN_IF_ERROR(Tick(Stage::kAdam, moment));
  bool device_zero_fill = false;
  for (size_t k = 0; k < keys.size(); ++k) {
    const int64_t key = keys[k];
    Chunk& chunk = ChunkOfKey(key);
    if (disk_ != nullptr) disk_->NoteAccess(key, modes[k] == AccessMode::kReadWrite);
    for (int slot = 0; slot < chunk.num_tensors(); ++slot) {
      device_zero_fill |= chunk.tensor_state(slot) == TensorState::kFree && device.is_accelerator();
      RETURN_IF_ERROR(chunk.SetTensorState(slot, TensorState::kCompute, &engine_->load_stream()));
    }
    if (modes[k] == AccessMode::kReadWrite) chunk.MarkPayloadWritten();
    active_chunks_.insert(key);
  }
  // The optimizer reads its chunks from the calling thread (optimizer/hybrid_adam.h): the host
  // waits for the loads and zero-fills, also for the accelerator.
  RETURN_IF_ERROR(WaitForAccessOnHost(keys, device_zero_fill));
  if (device.is_accelerator()) {
    for (int64_t key : keys) {
      policy_->RecordUse(key, std::max<int64_t>(moment, 0));
      if (in_iteration_ && metronome_.is_warmup() && moment >= 0) {
        RETURN_IF_ERROR(trace_.RecordAccess(key, moment));
      }
    }
  }
  engine_->ReportAccess("adam", chunk_index, Stage::kAdam, moment,
                        in_iteration_ && metronome_.is_warmup(), request_ns);
  if (!tracked) {
    backward_accessed_.insert(chunk_index);
    gradients_final_hook_used_ = true;
  }
  if (disk_ != nullptr) disk_->AfterAccess(chunk_index, keys, device, /*descending=*/!tracked);
  return absl::OkStatus();
}

absl::Status ChunkManager::ReleaseChunks(int64_t chunk_index, absl::Span<const ChunkType> types) {
  BusyScope busy(this);
  if (chunk_index < 0 || chunk_index >= store_->num_chunks()) {
    return absl::InvalidArgumentError(absl::StrCat("ReleaseChunks: chunk index ", chunk_index,
                                                   " outside [0, ", store_->num_chunks(), ")"));
  }
  for (ChunkType type : types) {
    if (!active_chunks_.contains(keys_.Key(type, chunk_index))) {
      return absl::FailedPreconditionError(absl::StrCat("ReleaseChunks of chunk ",
                                                        ChunkId{type, chunk_index}.ToString(),
                                                        " without a matching AccessChunks"));
    }
  }
  for (ChunkType type : types) {
    const int64_t key = keys_.Key(type, chunk_index);
    Chunk& chunk = ChunkOfKey(key);
    for (int slot = 0; slot < chunk.num_tensors(); ++slot) {
      if (chunk.tensor_state(slot) == TensorState::kCompute) {
        RETURN_IF_ERROR(chunk.SetTensorState(slot, TensorState::kHold));
      }
    }
    active_chunks_.erase(key);
  }
  engine_->ReportRelease("adam", chunk_index, Stage::kAdam);
  RETURN_IF_ERROR(engine_->NoteComputeRelease());
  const bool descending = backward_accessed_.erase(chunk_index) > 0;
  if (disk_ == nullptr) return absl::OkStatus();
  std::vector<int64_t> keys;
  for (ChunkType type : types) keys.push_back(keys_.Key(type, chunk_index));
  return disk_->AfterRelease(chunk_index, keys, descending);
}

// --- ZeRO ----------------------------------------------------------------------------------------

absl::Status ChunkManager::ReduceGroup(int64_t group, Stage stage, int64_t moment) {
  RETURN_IF_ERROR(MakeResident(groups_->Keys(group), stage, moment,
                               absl::StrCat("reduce-scatter of chunk group ", group)));
  return groups_->ReduceScatter(group);
}

absl::Status ChunkManager::FinishGroups(Stage stage) {
  if (groups_ == nullptr) return absl::OkStatus();
  for (int64_t group = 0; group < groups_->num_groups(); ++group) {
    if (!groups_->gathered(group)) continue;
    if (groups_->backward_touched(group) && !store_->layout().group_frozen(group)) {
      RETURN_IF_ERROR(ReduceGroup(group, stage, CurrentMoment()));
    }
    RETURN_IF_ERROR(groups_->Free(group));
  }
  return absl::OkStatus();
}

absl::Status ChunkManager::ReleaseRemoteChunks() {
  BusyScope busy(this);
  if (!active_ops_.empty() || !active_chunks_.empty()) {
    return absl::FailedPreconditionError(
        "ReleaseRemoteChunks: an operator or chunk is still accessed; release it first");
  }
  if (groups_ == nullptr) return absl::OkStatus();
  for (int64_t group = 0; group < groups_->num_groups(); ++group) {
    if (groups_->gathered(group)) RETURN_IF_ERROR(groups_->Free(group));
  }
  return absl::OkStatus();
}

}  // namespace ps
