#include "scheduler/disk_tier.h"

#include <algorithm>
#include <utility>

#include "absl/strings/str_cat.h"
#include "base/status_macros.h"
#include "base/units.h"
#include "glog/logging.h"

namespace ps {
namespace {

absl::Status Prefixed(const absl::Status& status, const std::string& prefix) {
  return absl::Status(status.code(), absl::StrCat(prefix, status.message()));
}

}  // namespace

int64_t DiskTierFrozenMinHostBytes(int64_t param_block_bytes, int64_t frozen_chunks) {
  return frozen_chunks > 0 ? param_block_bytes : 0;
}

int64_t DiskTierMinHostBytes(int64_t state_block_bytes, int64_t owned_indices) {
  return std::min<int64_t>(owned_indices, 2) * static_cast<int64_t>(kDiskBackedTypes.size()) *
         state_block_bytes;
}

DiskTierSplit SplitDiskTierBudget(int64_t host_budget_bytes, int64_t state_block_bytes,
                                  int64_t owned_indices, int64_t read_ahead) {
  DiskTierSplit split;
  const int64_t per_index = static_cast<int64_t>(kDiskBackedTypes.size()) * state_block_bytes;
  const int64_t slots = per_index > 0 ? host_budget_bytes / per_index : owned_indices;
  if (slots >= owned_indices) {
    split.kept = owned_indices;
    return split;
  }
  const int64_t wanted = 2 + read_ahead;
  if (slots <= wanted) {
    split.window = slots;
    split.read_ahead = std::max<int64_t>(0, slots - 2);
  } else {
    split.kept = slots - wanted;
    split.window = wanted;
    split.read_ahead = read_ahead;
  }
  return split;
}

absl::StatusOr<std::unique_ptr<DiskTier>> DiskTier::Create(ChunkStore* store, DeviceMemory* host,
                                                           DiskTierOptions options,
                                                           ChunkManagerCounters* counters,
                                                           MonotonicClock clock) {
  if (options.swap == nullptr) {
    return absl::InvalidArgumentError(
        "ChunkManagerOptions.disk.swap is null; pass the ChunkSwap the disk tier spills to");
  }
  if (options.read_ahead < 0) {
    return absl::InvalidArgumentError(absl::StrCat(
        "ChunkManagerOptions.disk.read_ahead must not be negative, got ", options.read_ahead));
  }
  if (options.frozen_params &&
      (options.frozen_read_ahead < 0 || options.frozen_host_budget_bytes < 0)) {
    return absl::InvalidArgumentError(
        absl::StrCat("ChunkManagerOptions.disk.frozen_read_ahead (", options.frozen_read_ahead,
                     ") and frozen_host_budget_bytes (", options.frozen_host_budget_bytes,
                     ") must not be negative"));
  }
  std::unique_ptr<DiskTier> tier(new DiskTier(store, host, options, counters, clock));
  const ChunkLayout& layout = store->layout();
  const int64_t n = store->num_chunks();
  tier->state_.resize(kNumChunkTypes * n);
  tier->kept_.assign(n, false);
  for (int64_t index = 0; index < n; ++index) {
    if (options.frozen_params && !layout.chunk_trainable(index) &&
        layout.HoldsPayload(ChunkType::kParam, index, store->rank())) {
      const int64_t key = tier->keys_.Key(ChunkType::kParam, index);
      tier->state_[key].frozen = true;
      tier->frozen_keys_.push_back(key);
    }
    if (!options.optimizer_state) continue;
    bool owned = false;
    for (ChunkType type : kDiskBackedTypes) {
      if (!layout.HoldsPayload(type, index, store->rank())) continue;
      const int64_t key = tier->keys_.Key(type, index);
      tier->state_[key].backed = true;
      tier->backed_keys_.push_back(key);
      owned = true;
    }
    if (owned) tier->owned_indices_.push_back(index);
  }
  std::sort(tier->backed_keys_.begin(), tier->backed_keys_.end());
  const int64_t block = tier->backed_keys_.empty() ? 0 : tier->BlockBytes(tier->backed_keys_[0]);
  const int64_t owned = static_cast<int64_t>(tier->owned_indices_.size());
  tier->min_host_bytes_ = DiskTierMinHostBytes(block, owned);
  if (options.host_budget_bytes < tier->min_host_bytes_) {
    return absl::InvalidArgumentError(absl::StrCat(
        "the disk tier's host budget (ChunkManagerOptions.disk.host_budget_bytes) is ",
        FormatBytes(options.host_budget_bytes), " (", options.host_budget_bytes,
        " bytes) but it needs at least ", FormatBytes(tier->min_host_bytes_), " (",
        tier->min_host_bytes_,
        " bytes: the master, momentum and variance chunks of one index accessed plus one written "
        "behind); give the host more memory or use a smaller chunk size"));
  }
  tier->frozen_min_host_bytes_ =
      DiskTierFrozenMinHostBytes(tier->frozen_keys_.empty() ? 0 : tier->FrozenBlockBytes(),
                                 static_cast<int64_t>(tier->frozen_keys_.size()));
  if (options.frozen_params && options.frozen_host_budget_bytes < tier->frozen_min_host_bytes_) {
    return absl::InvalidArgumentError(absl::StrCat(
        "the disk tier's host budget for frozen params "
        "(ChunkManagerOptions.disk.frozen_host_budget_bytes) is ",
        FormatBytes(options.frozen_host_budget_bytes), " (", options.frozen_host_budget_bytes,
        " bytes) but it needs at least ", FormatBytes(tier->frozen_min_host_bytes_), " (",
        tier->frozen_min_host_bytes_,
        " bytes: the host block of the one param chunk an access loads); give the frozen params "
        "more host memory or use a smaller chunk size"));
  }
  tier->split_ = SplitDiskTierBudget(options.host_budget_bytes, block, owned, options.read_ahead);
  for (int64_t i = 0; i < tier->split_.kept; ++i) tier->kept_[tier->owned_indices_[i]] = true;
  for (int64_t key : tier->backed_keys_) {
    const Chunk& ch = tier->ChunkOf(key);
    RETURN_IF_ERROR(options.swap->AddSlot(key, ch.capacity_bytes(), ch.id().ToString()));
  }
  for (int64_t key : tier->frozen_keys_) {
    const Chunk& ch = tier->ChunkOf(key);
    RETURN_IF_ERROR(options.swap->AddSlot(key, ch.capacity_bytes(), ch.id().ToString()));
  }
  // Chunks filled before the manager existed: spill what does not fit.
  RETURN_IF_ERROR(tier->MakeRoom(0, {}, -1).status());
  RETURN_IF_ERROR(tier->MakeFrozenRoom(0, {}, -1, -1).status());
  tier->iteration_peak_ = 0;
  tier->frozen_iteration_peak_ = 0;
  tier->NoteHostBytes();
  VLOG(1) << "disk tier: " << tier->backed_keys_.size() << " chunks on "
          << options.swap->info().path << ", host budget " << FormatBytes(options.host_budget_bytes)
          << " (minimum " << FormatBytes(tier->min_host_bytes_) << "), " << tier->split_.kept
          << " of " << owned << " indices kept, window " << tier->split_.window << ", read-ahead "
          << tier->split_.read_ahead << "; " << tier->frozen_keys_.size()
          << " frozen param chunks, host budget " << FormatBytes(options.frozen_host_budget_bytes);
  return tier;
}

DiskTier::DiskTier(ChunkStore* store, DeviceMemory* host, DiskTierOptions options,
                   ChunkManagerCounters* counters, MonotonicClock clock)
    : store_(store),
      host_(host),
      options_(options),
      counters_(counters),
      clock_(clock),
      keys_(store->num_chunks()) {}

DiskTier::~DiskTier() {
  std::vector<int64_t> keys = backed_keys_;
  keys.insert(keys.end(), frozen_keys_.begin(), frozen_keys_.end());
  for (int64_t key : keys) {
    KeyState& s = state_[key];
    for (IoTicket* ticket : {&s.read, &s.write}) {
      if (*ticket == 0) continue;
      if (absl::Status st = options_.swap->Wait(*ticket); !st.ok()) {
        LOG(ERROR) << "disk tier: I/O of " << ChunkOf(key).id() << " failed at shutdown: " << st;
      }
      *ticket = 0;
    }
  }
}

bool DiskTier::kept(int64_t index) const {
  return index >= 0 && index < static_cast<int64_t>(kept_.size()) && kept_[index];
}

int64_t DiskTier::BlockBytes(int64_t key) const {
  // Every optimizer-state chunk is f32 of the layout's capacity: one block size.
  if (block_bytes_ == 0)
    block_bytes_ = host_->chunk_pool_for(ChunkOf(key).capacity_bytes())->block_bytes();
  return block_bytes_;
}

int64_t DiskTier::HostBytesOf(int64_t key) const {
  const Chunk& ch = ChunkOf(key);
  int64_t bytes = 0;
  if (ch.has_payload() && ch.device().is_host()) bytes += BlockBytes(key);
  if (ch.has_backing() && ch.backing_device().is_host()) bytes += BlockBytes(key);
  return bytes;
}

int64_t DiskTier::host_bytes() const {
  int64_t bytes = 0;
  for (int64_t key : backed_keys_) bytes += HostBytesOf(key);
  return bytes;
}

void DiskTier::NoteHostBytes() {
  const int64_t bytes = host_bytes();
  counters_->disk_peak_host_bytes = std::max(counters_->disk_peak_host_bytes, bytes);
  iteration_peak_ = std::max(iteration_peak_, bytes);
  const int64_t frozen = frozen_host_bytes();
  frozen_peak_ = std::max(frozen_peak_, frozen);
  frozen_iteration_peak_ = std::max(frozen_iteration_peak_, frozen);
}

int64_t DiskTier::Distance(int64_t index, int64_t from) const {
  const int64_t n = keys_.num_chunks();
  return ((index - from - 1) % n + n) % n;
}

// --- Room ----------------------------------------------------------------------------------------

absl::StatusOr<bool> DiskTier::MakeRoom(int64_t bytes, absl::Span<const int64_t> protect,
                                        int64_t prefetch_index) {
  const int64_t budget = options_.host_budget_bytes;
  int64_t have = host_bytes();
  if (have + bytes <= budget) return true;
  const bool prefetch = prefetch_index >= 0;
  struct Candidate {
    int64_t key;
    int rank;  // 0: streamed, 1: kept, 2: read in flight
    int64_t distance;
  };
  std::vector<Candidate> candidates;
  for (int64_t key : backed_keys_) {
    if (std::find(protect.begin(), protect.end(), key) != protect.end()) continue;
    const Chunk& ch = ChunkOf(key);
    if (!ch.has_payload() || !ch.device().is_host() || !ch.movable()) continue;
    const KeyState& s = state_[key];
    const int64_t index = keys_.IdOf(key).index;
    const int64_t distance = Distance(index, position_);
    if (prefetch) {
      // Only what OPT evicts before this read's chunk is used, and never a wait.
      if (kept_[index] || s.read != 0 || distance <= Distance(prefetch_index, position_)) continue;
      if (s.write != 0 ? !options_.swap->Poll(s.write)
                       : !s.clean && ch.tensor_count(TensorState::kFree) < ch.num_tensors()) {
        continue;
      }
    }
    candidates.push_back({key, s.read != 0 ? 2 : (kept_[index] ? 1 : 0), distance});
  }
  std::sort(candidates.begin(), candidates.end(), [](const Candidate& a, const Candidate& b) {
    return a.rank != b.rank ? a.rank < b.rank : a.distance > b.distance;
  });
  for (const Candidate& c : candidates) {
    if (have + bytes <= budget) break;
    const int64_t freed = HostBytesOf(c.key);
    RETURN_IF_ERROR(Spill(c.key));
    have -= freed;
  }
  if (have + bytes <= budget) return true;
  if (prefetch) return false;
  return absl::ResourceExhaustedError(absl::StrCat(
      "the disk tier needs ", FormatBytes(bytes), " more host memory for optimizer state but ",
      FormatBytes(have), " of its ", FormatBytes(budget),
      " host budget is held by chunks in use or in flight (the minimum budget, ",
      FormatBytes(min_host_bytes_),
      ", holds one index accessed at a time); access fewer optimizer chunks at once or raise "
      "the host budget"));
}

absl::Status DiskTier::DropUnusedReadAhead(int64_t key) {
  KeyState& s = state_[key];
  Chunk& ch = ChunkOf(key);
  // A read-ahead nobody used yet: its bytes are the slot's, so dropping it loses nothing.
  const absl::Status read = options_.swap->Wait(s.read);
  s.read = 0;
  s.ahead = false;
  if (!read.ok()) {
    LOG(WARNING) << "disk tier: a read-ahead of " << ch.id() << " failed: " << read;
  }
  return ch.ReleasePayload();
}

absl::Status DiskTier::WriteUnlessClean(int64_t key, const void* src) {
  const Chunk& ch = ChunkOf(key);
  const bool holds_data = ch.tensor_count(TensorState::kFree) < ch.num_tensors();
  if (holds_data && !state_[key].clean) {
    RETURN_IF_ERROR(StartWrite(key, src));
    return WaitWrite(key);
  }
  ++counters_->disk_drops;
  return absl::OkStatus();
}

absl::Status DiskTier::ReleaseToSlot(int64_t key) {
  KeyState& s = state_[key];
  Chunk& ch = ChunkOf(key);
  const bool holds_data = ch.tensor_count(TensorState::kFree) < ch.num_tensors();
  std::vector<TensorState> saved(ch.num_tensors());
  for (int slot = 0; slot < ch.num_tensors(); ++slot) saved[slot] = ch.tensor_state(slot);
  RETURN_IF_ERROR(ch.ReleasePayload());
  s.spilled = holds_data;
  s.saved = holds_data ? std::move(saved) : std::vector<TensorState>();
  return absl::OkStatus();
}

absl::Status DiskTier::Spill(int64_t key) {
  KeyState& s = state_[key];
  if (s.read != 0) return DropUnusedReadAhead(key);
  if (s.write != 0) RETURN_IF_ERROR(WaitWrite(key));
  RETURN_IF_ERROR(WriteUnlessClean(key, nullptr));
  RETURN_IF_ERROR(ReleaseToSlot(key));
  VLOG(2) << "disk tier: spill " << ChunkOf(key).id();
  return absl::OkStatus();
}

// --- I/O -----------------------------------------------------------------------------------------

absl::Status DiskTier::StartWrite(int64_t key, const void* src) {
  KeyState& s = state_[key];
  Chunk& ch = ChunkOf(key);
  absl::StatusOr<IoTicket> ticket =
      options_.swap->StartWrite(key, src != nullptr ? src : ch.payload());
  if (!ticket.ok()) {
    return Prefixed(ticket.status(), absl::StrCat("writing ", ch.id().ToString(), " to disk: "));
  }
  s.write = *ticket;
  ++counters_->disk_writes;
  counters_->disk_write_bytes += ch.capacity_bytes();
  return absl::OkStatus();
}

absl::Status DiskTier::WaitWrite(int64_t key) {
  KeyState& s = state_[key];
  const int64_t start = clock_.now_ns();
  const absl::Status written = options_.swap->Wait(s.write);
  counters_->disk_write_wait_ns += clock_.now_ns() - start;
  s.write = 0;
  if (!written.ok()) {
    return Prefixed(written, absl::StrCat("writing ", ChunkOf(key).id().ToString(), " to disk: "));
  }
  // Nothing wrote the payload while its write was in flight (accesses wait for it first).
  s.clean = true;
  return absl::OkStatus();
}

absl::Status DiskTier::StartRead(int64_t key, bool ahead) {
  KeyState& s = state_[key];
  Chunk& ch = ChunkOf(key);
  const std::string prefix = absl::StrCat("loading ", ch.id().ToString(), " from disk: ");
  if (absl::Status allocated = ch.AllocatePayload(*host_->chunk_pool_for(ch.capacity_bytes()));
      !allocated.ok()) {
    return Prefixed(allocated, prefix);
  }
  absl::StatusOr<IoTicket> ticket = options_.swap->StartRead(key, ch.payload());
  if (!ticket.ok()) {
    if (absl::Status released = ch.ReleasePayload(); !released.ok()) {
      LOG(ERROR) << "disk tier: " << released;
    }
    return Prefixed(ticket.status(), prefix);
  }
  s.read = *ticket;
  s.ahead = ahead;
  ++counters_->disk_reads;
  counters_->disk_read_bytes += ch.capacity_bytes();
  if (ahead) ++counters_->disk_read_aheads;
  NoteHostBytes();
  return absl::OkStatus();
}

absl::Status DiskTier::Load(int64_t key) {
  KeyState& s = state_[key];
  Chunk& ch = ChunkOf(key);
  if (s.read == 0) {
    RETURN_IF_ERROR(StartRead(key, /*ahead=*/false));
  } else if (s.ahead) {
    ++counters_->disk_read_ahead_hits;
  }
  const int64_t start = clock_.now_ns();
  const absl::Status read = options_.swap->Wait(s.read);
  counters_->disk_read_wait_ns += clock_.now_ns() - start;
  s.read = 0;
  s.ahead = false;
  if (!read.ok()) {
    // The chunk stays spilled (its tensors FREE, its states remembered).
    if (absl::Status released = ch.ReleasePayload(); !released.ok()) {
      LOG(ERROR) << "disk tier: " << released;
    }
    return Prefixed(read, absl::StrCat("loading ", ch.id().ToString(), " from disk: "));
  }
  for (int slot = 0; slot < ch.num_tensors(); ++slot) {
    if (s.saved[slot] != TensorState::kFree) {
      RETURN_IF_ERROR(ch.SetTensorState(slot, TensorState::kHold));
    }
  }
  s.spilled = false;
  s.saved.clear();
  s.clean = true;
  VLOG(2) << "disk tier: load " << ch.id();
  return absl::OkStatus();
}

// --- The manager's hooks -------------------------------------------------------------------------

absl::Status DiskTier::PrepareAccess(int64_t chunk_index, absl::Span<const int64_t> keys,
                                     Device device) {
  RETURN_IF_ERROR(PrepareFrozenChunks(keys, device));
  std::vector<int64_t> backed_keys;
  for (int64_t key : keys) {
    if (backed(key)) backed_keys.push_back(key);
  }
  if (backed_keys.empty()) return absl::OkStatus();
  position_ = chunk_index;
  int64_t need = 0;
  for (int64_t key : backed_keys) {
    // The access may write the payload: its write must be complete first.
    if (state_[key].write != 0) RETURN_IF_ERROR(WaitWrite(key));
    const Chunk& ch = ChunkOf(key);
    const bool on_host = ch.has_payload() && ch.device().is_host();
    if (device.is_host() ? !on_host : (!ch.has_payload() && state_[key].spilled)) {
      need += BlockBytes(key);
    }
  }
  RETURN_IF_ERROR(MakeRoom(need, keys, -1).status());
  for (int64_t key : backed_keys) {
    if (state_[key].spilled) RETURN_IF_ERROR(Load(key));
  }
  NoteHostBytes();
  return absl::OkStatus();
}

void DiskTier::NoteAccess(int64_t key, bool writes) {
  if (!backed(key) && !frozen(key)) return;
  const Chunk& ch = ChunkOf(key);
  if (writes || ch.tensor_count(TensorState::kFree) > 0) state_[key].clean = false;
}

void DiskTier::AfterAccess(int64_t chunk_index, absl::Span<const int64_t> keys, Device device,
                           bool descending) {
  if (device.is_host()) {
    ReadAhead(chunk_index, keys, descending);
    return;
  }
  // Placed on the accelerator for good: the host copy is not kept (see the file comment).
  for (int64_t key : keys) {
    if (!backed(key)) continue;
    Chunk& ch = ChunkOf(key);
    if (ch.has_backing() && ch.backing_device().is_host()) {
      if (absl::Status s = ch.DiscardBacking(); !s.ok()) LOG(ERROR) << "disk tier: " << s;
    }
  }
  NoteHostBytes();
}

absl::Status DiskTier::AfterRelease(int64_t chunk_index, absl::Span<const int64_t> keys,
                                    bool descending) {
  for (int64_t key : keys) {
    if (!backed(key) || kept_[chunk_index]) continue;
    KeyState& s = state_[key];
    const Chunk& ch = ChunkOf(key);
    if (s.clean || s.write != 0 || !ch.has_payload() || !ch.device().is_host() ||
        ch.tensor_count(TensorState::kFree) == ch.num_tensors()) {
      continue;
    }
    RETURN_IF_ERROR(StartWrite(key));
    ++counters_->disk_write_behinds;
  }
  ReadAhead(chunk_index, keys, descending);
  return absl::OkStatus();
}

void DiskTier::ReadAhead(int64_t chunk_index, absl::Span<const int64_t> keys, bool descending) {
  if (split_.read_ahead == 0 || owned_indices_.empty()) return;
  std::vector<ChunkType> types;
  for (int64_t key : keys) {
    if (backed(key)) types.push_back(keys_.IdOf(key).type);
  }
  if (types.empty()) return;
  // The next streamed owned indices after chunk_index, wrapping around; descending: those below
  // it, nearest first, without wrapping.
  const int64_t owned = static_cast<int64_t>(owned_indices_.size());
  const int64_t start =
      std::upper_bound(owned_indices_.begin(), owned_indices_.end(), chunk_index) -
      owned_indices_.begin();
  const int64_t below =
      std::lower_bound(owned_indices_.begin(), owned_indices_.end(), chunk_index) -
      owned_indices_.begin();
  int64_t found = 0;
  for (int64_t step = 0; step < (descending ? below : owned) && found < split_.read_ahead;
       ++step) {
    const int64_t index =
        descending ? owned_indices_[below - 1 - step] : owned_indices_[(start + step) % owned];
    if (index == chunk_index) break;
    if (kept_[index]) continue;
    ++found;
    for (ChunkType type : types) {
      const int64_t key = keys_.Key(type, index);
      const KeyState& s = state_[key];
      if (!s.spilled || s.read != 0) continue;
      absl::StatusOr<bool> room = MakeRoom(BlockBytes(key), {}, index);
      if (!room.ok()) {
        LOG(WARNING) << "disk tier: read-ahead stopped: " << room.status();
        return;
      }
      if (!*room) return;
      if (absl::Status s = StartRead(key, /*ahead=*/true); !s.ok()) {
        // The demand access reads it again and reports the error.
        LOG(WARNING) << "disk tier: read-ahead: " << s;
        return;
      }
    }
  }
}

// --- Frozen param chunks -------------------------------------------------------------------------

int64_t DiskTier::FrozenBlockBytes() const {
  // Every param chunk has the layout's capacity in the compute dtype: one block size.
  if (frozen_block_bytes_ == 0) {
    frozen_block_bytes_ =
        host_->chunk_pool_for(ChunkOf(frozen_keys_[0]).capacity_bytes())->block_bytes();
  }
  return frozen_block_bytes_;
}

int64_t DiskTier::FrozenHostBytesOf(int64_t key) const {
  const Chunk& ch = ChunkOf(key);
  int64_t bytes = 0;
  if (ch.has_payload() && ch.device().is_host()) bytes += FrozenBlockBytes();
  if (ch.has_backing() && ch.backing_device().is_host()) bytes += FrozenBlockBytes();
  return bytes;
}

int64_t DiskTier::frozen_host_bytes() const {
  int64_t bytes = 0;
  for (int64_t key : frozen_keys_) bytes += FrozenHostBytesOf(key);
  return bytes;
}

void DiskTier::SetSchedule(const AccessSchedule* schedule) {
  schedule_ = schedule;
  frozen_order_.clear();
  if (schedule == nullptr) return;
  for (const auto& [moment, key] : schedule->sequence()) {
    if (frozen(key)) frozen_order_.emplace_back(moment, key);
  }
}

int64_t DiskTier::FrozenEvictionRank(int64_t key, int64_t moment) const {
  if (schedule_ != nullptr && moment >= 0) return schedule_->NextUse(key, moment);
  return -state_[key].last_use;  // least recently used first
}

absl::StatusOr<bool> DiskTier::MakeFrozenRoom(int64_t bytes, absl::Span<const int64_t> protect,
                                              int64_t moment, int64_t ahead_of) {
  const int64_t budget = options_.frozen_host_budget_bytes;
  int64_t have = frozen_host_bytes();
  if (have + bytes <= budget) return true;
  const bool ahead = ahead_of >= 0;
  struct Candidate {
    int64_t key;
    int64_t rank;
  };
  std::vector<Candidate> candidates;
  for (int64_t key : frozen_keys_) {
    if (std::find(protect.begin(), protect.end(), key) != protect.end()) continue;
    if (FrozenHostBytesOf(key) == 0) continue;
    const Chunk& ch = ChunkOf(key);
    const KeyState& s = state_[key];
    const bool needs_write = !s.clean && ch.tensor_count(TensorState::kFree) < ch.num_tensors();
    if (ch.device().is_host()) {
      if (!ch.movable()) continue;
      if (ahead && (s.read != 0 || needs_write)) continue;
    } else {
      // The host backing copy of an accelerator payload; a stale one cannot stand in for it.
      if (engine_ == nullptr || !ch.backing_valid()) continue;
      if (ahead && (needs_write || !engine_->CopiesDone(key))) continue;
    }
    const int64_t rank = FrozenEvictionRank(key, moment);
    // A read-ahead evicts only what OPT evicts before its own chunk is used.
    if (ahead && rank <= ahead_of) continue;
    candidates.push_back({key, rank});
  }
  std::sort(candidates.begin(), candidates.end(), [](const Candidate& a, const Candidate& b) {
    return a.rank != b.rank ? a.rank > b.rank : a.key < b.key;
  });
  for (const Candidate& c : candidates) {
    if (have + bytes <= budget) break;
    const int64_t freed = FrozenHostBytesOf(c.key);
    RETURN_IF_ERROR(DropFrozenCopy(c.key));
    have -= freed;
  }
  if (have + bytes <= budget) return true;
  if (ahead) return false;
  return absl::ResourceExhaustedError(absl::StrCat(
      "the disk tier needs ", FormatBytes(bytes), " more host memory for frozen param chunks but ",
      FormatBytes(have), " of their ", FormatBytes(budget),
      " host budget (ChunkManagerOptions.disk.frozen_host_budget_bytes) is held by chunks in use "
      "(the minimum, ",
      FormatBytes(frozen_min_host_bytes_),
      ", holds one chunk accessed at a time); access fewer frozen chunks on the host at once or "
      "raise the budget"));
}

absl::Status DiskTier::DropFrozenCopy(int64_t key) {
  KeyState& s = state_[key];
  Chunk& ch = ChunkOf(key);
  if (s.read != 0) return DropUnusedReadAhead(key);
  const bool on_host = ch.device().is_host();
  // The host backing copy may still be the source of the accelerator load.
  if (!on_host) RETURN_IF_ERROR(engine_->WaitForCopies({key}));
  // The one write of a frozen chunk (again only if its values were rewritten).
  RETURN_IF_ERROR(WriteUnlessClean(key, on_host ? ch.payload() : ch.backing()));
  if (!on_host) {
    VLOG(2) << "disk tier: drop the host copy of " << ch.id();
    return ch.DiscardBacking();
  }
  RETURN_IF_ERROR(ReleaseToSlot(key));
  VLOG(2) << "disk tier: spill " << ch.id();
  return absl::OkStatus();
}

bool DiskTier::CanDropToDisk(int64_t key) const {
  if (!frozen(key)) return false;
  const KeyState& s = state_[key];
  const Chunk& ch = ChunkOf(key);
  return s.read == 0 && ch.has_payload() && !ch.has_backing() &&
         (s.clean || ch.tensor_count(TensorState::kFree) == ch.num_tensors());
}

absl::Status DiskTier::DropToDisk(int64_t key) {
  RETURN_IF_ERROR(ReleaseToSlot(key));
  ++counters_->disk_drops;
  VLOG(2) << "disk tier: evicted " << ChunkOf(key).id() << " to its slot";
  return absl::OkStatus();
}

absl::Status DiskTier::PrepareParamAccess(absl::Span<const int64_t> keys, int64_t moment) {
  std::vector<int64_t> frozen_keys;
  int64_t need = 0;
  for (int64_t key : keys) {
    if (!frozen(key)) continue;
    frozen_keys.push_back(key);
    state_[key].last_use = ++use_clock_;
    if (!ChunkOf(key).has_payload() && state_[key].spilled) need += FrozenBlockBytes();
  }
  if (frozen_keys.empty()) return absl::OkStatus();
  RETURN_IF_ERROR(MakeFrozenRoom(need, frozen_keys, moment, -1).status());
  for (int64_t key : frozen_keys) {
    if (state_[key].spilled) RETURN_IF_ERROR(Load(key));
  }
  NoteHostBytes();
  return absl::OkStatus();
}

absl::Status DiskTier::PrepareFrozenChunks(absl::Span<const int64_t> keys, Device device) {
  std::vector<int64_t> frozen_keys;
  for (int64_t key : keys) {
    if (frozen(key)) frozen_keys.push_back(key);
  }
  if (frozen_keys.empty()) return absl::OkStatus();
  int64_t need = 0;
  for (int64_t key : frozen_keys) {
    state_[key].last_use = ++use_clock_;
    const Chunk& ch = ChunkOf(key);
    if (device.is_host() && ch.has_payload() && !ch.device().is_host() && !ch.has_backing() &&
        engine_ != nullptr && engine_->resident(key) && CanDropToDisk(key)) {
      // Moving it to the host would write it into a fresh block: it is on disk, so it is evicted
      // to its slot and read back like any spilled chunk.
      RETURN_IF_ERROR(engine_->Evict({key}, MoveContext{Stage::kAdam, -1}));
    }
    if (device.is_host() ? FrozenHostBytesOf(key) == 0
                         : (!ch.has_payload() && state_[key].spilled)) {
      need += FrozenBlockBytes();
    }
  }
  RETURN_IF_ERROR(MakeFrozenRoom(need, frozen_keys, -1, -1).status());
  for (int64_t key : frozen_keys) {
    if (state_[key].spilled) RETURN_IF_ERROR(Load(key));
  }
  NoteHostBytes();
  return absl::OkStatus();
}

bool DiskTier::TakeReadyParam(int64_t key) {
  if (!frozen(key)) return true;
  KeyState& s = state_[key];
  if (s.read == 0) return !s.spilled;
  if (!options_.swap->Poll(s.read)) return false;
  if (absl::Status loaded = Load(key); !loaded.ok()) {
    // The demand access reads it again and reports the error.
    LOG(WARNING) << "disk tier: " << loaded;
    return false;
  }
  return true;
}

void DiskTier::AfterParamAccess(int64_t moment) {
  if (schedule_ == nullptr || moment < 0 || options_.frozen_read_ahead == 0 ||
      frozen_order_.empty()) {
    return;
  }
  const size_t n = frozen_order_.size();
  const size_t start = std::upper_bound(frozen_order_.begin(), frozen_order_.end(), moment,
                                        [](int64_t m, const std::pair<int64_t, int64_t>& e) {
                                          return m < e.first;
                                        }) -
                       frozen_order_.begin();
  std::vector<int64_t> seen;
  int64_t found = 0;
  for (size_t step = 0; step < n && found < options_.frozen_read_ahead; ++step) {
    const auto& [m, key] = frozen_order_[(start + step) % n];
    if (m == moment) break;  // wrapped around to the access itself
    if (std::find(seen.begin(), seen.end(), key) != seen.end()) continue;
    seen.push_back(key);
    ++found;
    const KeyState& s = state_[key];
    if (!s.spilled || s.read != 0) continue;
    absl::StatusOr<bool> room =
        MakeFrozenRoom(FrozenBlockBytes(), {}, moment, schedule_->NextUse(key, moment));
    if (!room.ok()) {
      LOG(WARNING) << "disk tier: frozen read-ahead stopped: " << room.status();
      return;
    }
    if (!*room) return;
    if (absl::Status st = StartRead(key, /*ahead=*/true); !st.ok()) {
      // The demand access reads it again and reports the error.
      LOG(WARNING) << "disk tier: frozen read-ahead: " << st;
      return;
    }
  }
}

}  // namespace ps
