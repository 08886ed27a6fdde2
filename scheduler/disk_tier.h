// DiskTier: the tide one level down — the part of the ChunkManager that keeps this rank's
// optimizer state (master, momentum, variance chunks) under a host-RAM budget by spilling chunk
// payloads to a ChunkSwap (disk/chunk_swap.h) and reading them back, ahead of the optimizer.
//
// What is disk-backed. Every master/momentum/variance chunk this rank holds a payload of
// (ChunkLayout::HoldsPayload) gets a swap slot (named like "momentum#12"). Its bytes may live only
// in that slot while its host payload is given back: *spilled* means the tensors' states were
// remembered, the payload released (tensors FREE) and the slot holds the bytes. *Loading* it
// allocates a block from the host chunk pool, reads the slot into it, waits, and restores the
// states (FREE -> HOLD). A chunk whose tensors are all FREE is never written: there is nothing to
// keep, and the usual zero-fill on first access applies. Trainable param chunks are not
// disk-backed; frozen ones may be (see "Frozen param chunks" below).
//
// The host budget (the hard invariant). The tier's host bytes are the host chunk-pool blocks of
// disk-backed chunks — payloads and backing copies on the host, resident, being read ahead or
// being written behind (an I/O's buffer is the chunk's payload). Before anything adds such a block
// (a demand load, a read-ahead, a move to the host, a fresh payload for a first access) the tier
// makes room first, so host_bytes() never exceeds host_budget_bytes. The least budget that works
// is DiskTierMinHostBytes: the state chunks of one access (the update pass takes all three types
// of an index) plus those of one index being written behind; Create refuses less.
//
// Which chunks stay: OPT over the known order. The optimizer (optimizer/hybrid_adam.h) and the
// state I/O (model/model_state_io.h) visit the owned indices in ascending order, one at a time,
// and do so cyclically, pass after pass. In a cyclic order the chunk whose next use is furthest in
// the future is always the one just used: after index p, index j's next use is (j - p - 1) mod N
// accesses away, largest for j = p, then p - 1, ... So Belady's OPT, which evicts the furthest,
// evicts the chunk just released every time; a chunk resident at the start of a pass is never the
// furthest and stays for good. OPT thus amounts to a fixed *kept* set — as many owned indices as
// fit in the budget beside the streaming window — with the others streamed through the window.
// The tier makes that explicit: the kept set is the lowest owned indices that fit beside a window
// of (2 + read_ahead) indices (the access, one written behind, the read-ahead), all of them when
// everything fits. Victims are chosen by the same rule the accelerator tier uses (the furthest
// next use, scheduler/eviction_policy.h's OPT), streamed chunks before kept ones; the kept/streamed
// split only decides which chunks are written behind and read ahead. Giving window room to
// read-ahead instead of keeping more trades disk bytes for overlap, deliberately: a read that
// overlaps the optimizer's compute is cheaper than one the host waits for.
//
// Read-ahead. After an access (and after a release) of index i on the host, reads of the same
// disk-backed types start for the next `read_ahead` streamed indices after i, wrapping around at
// the end: after the last streamed index of a pass the reads of the first streamed ones overlap
// the forward and backward passes before the next optimizer step (they take window room only).
// A read-ahead evicts only streamed chunks whose next use is after its own (what OPT evicts
// anyway) and whose write completed (it never waits); when there is no such room it stops.
//
// Write-behind. At the release of a streamed chunk that changed since its slot was written (a
// kReadWrite access, or a zero-fill), its write starts at once; its payload is given back once the
// write completed and room is needed (lazily: a chunk used again soon is not read back). Clean
// chunks — accessed kRead, or unchanged since their slot was written — are never written, only
// dropped. Kept chunks are written only if they ever have to be spilled.
//
// The accelerator. An access of a spilled chunk on the accelerator (an ADAM placement) first loads
// it into host memory, then the manager's existing path copies it over. Chunks the placement keeps
// on the accelerator live there from the first optimizer step after the warm-up on and never move
// (scheduler/chunk_manager.h): once such a chunk's copy completed, its host backing copy is given
// back, so placed optimizer state costs no host RAM and does not count against the budget. A
// placed chunk moved back to the host later (a host access, a pressure eviction) gets a host block
// again; a host access makes room for it first, a pressure eviction (which frees accelerator
// memory in an emergency) does not — the tier counts it, and spills it first, at its next access.
//
// Frozen param chunks (DiskTierOptions::frozen_params; DeepSpeed's offload_param {device "nvme"}
// for a frozen base). Every frozen param chunk this rank holds (ChunkLayout::chunk_trainable false
// and HoldsPayload: a LoRA/QLoRA base) gets a slot too ("param#7"), under its own host budget,
// frozen_host_budget_bytes. Their host bytes are the host blocks they hold — a payload on the host
// (also one being read ahead) or the host backing copy of a payload on the accelerator — and the
// tier makes room before adding one, so frozen_host_bytes() never exceeds that budget (the same
// hard invariant). The least budget is one param block (DiskTierFrozenMinHostBytes): an access
// needs only its own chunk on the host; every other frozen host copy can go.
//  - Written once. A frozen chunk's slot is written when the chunk first has to leave host RAM
//    with data the slot does not hold yet (lazily, from its host payload or its host backing
//    copy): after the model set its values (ModelStateIo writes them through AccessChunks), the
//    first eviction writes it, and it is never written again — frozen chunks stay clean (the
//    manager never marks them written in backward). Only a write of its values (an AccessChunks
//    kReadWrite, a zero-fill of a FREE tensor) makes the slot stale, and the next eviction then
//    writes it again: the slot always holds the current values.
//  - Dropped, never written back. Once the slot holds its bytes, making room drops a frozen
//    chunk's host payload (it is spilled) or the host backing copy of its accelerator payload
//    (it stays on the accelerator, with no host copy). Evicting such an accelerator payload later
//    just gives its block back (ResidencyEngine's DiskDropper): it is spilled again, no copy.
//  - Read back before a compute access: Access (and AccessChunks) of a spilled frozen chunk first
//    loads it into host memory (waiting for its read if one is in flight); the manager's existing
//    path then copies it to the accelerator. Moving one to the accelerator thus always takes it
//    from its host payload.
//  - Which go, and read-ahead: OPT over the warm-up's recorded access order, the same schedule the
//    accelerator's OptPolicy uses (scheduler/access_schedule.h, handed over by SetSchedule when
//    the warm-up ends). Making room drops the frozen host copies whose next use is furthest;
//    after each tracked access at moment m, reads start for the spilled ones among the next
//    frozen_read_ahead distinct frozen chunks the schedule accesses after m (wrapping into the
//    next iteration), each evicting only copies used after it and never waiting (copies whose
//    slot is current and whose accelerator load completed); when there is no such room, it stops.
//    During the warm-up, off the trace and for untracked accesses there is no read-ahead, and
//    the least recently used copies go first. The accelerator's prefetch skips a frozen chunk
//    whose read is still in flight (its demand access waits for it).
//  - Planned: MemoryPlanOptions::DiskTier's frozen fields (scheduler/memory_plan.h) count the
//    frozen chunks' slots and min(budget, their bytes) of host RAM instead of all of them.
//  Known limit: a frozen chunk first filled on the accelerator (FREE tensors zero-filled there)
//  is written back into a fresh host block on eviction like any dirty chunk — outside the budget
//  until the tier's next call spills it; a model sets its values on the host first.
//
// Errors of the swap (DataLoss, EIO, ENOSPC, ...) are returned with the chunk named ("loading
// momentum#12 from disk: ...", "loading param#7 from disk: ..."); the chunk stays where it was (a
// failed load leaves it spilled, a failed write leaves it on the host, dirty), so the manager stays
// usable and destructible. Destroying the tier waits for the I/O in flight; chunks still spilled
// then keep FREE tensors (the swap's files are scratch: checkpoint through the manager before).
//
// Thread safety: thread-compatible; the ChunkManager's thread calls it.
#ifndef PATRICKSTAR_SCHEDULER_DISK_TIER_H_
#define PATRICKSTAR_SCHEDULER_DISK_TIER_H_

#include <array>
#include <cstdint>
#include <memory>
#include <optional>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/types/span.h"
#include "base/clock.h"
#include "chunk/chunk_store.h"
#include "chunk/tensor_state.h"
#include "disk/chunk_swap.h"
#include "memory/device.h"
#include "memory/device_memory.h"
#include "scheduler/access_schedule.h"
#include "scheduler/chunk_counters.h"
#include "scheduler/chunk_keys.h"
#include "scheduler/residency.h"

namespace ps {

struct DiskTierOptions {
  // Where spilled chunks go. Not owned; must outlive the ChunkManager. Required.
  ChunkSwap* swap = nullptr;
  // Host bytes the disk-backed chunks may take at any moment (see the file comment); at least
  // DiskTierMinHostBytes.
  int64_t host_budget_bytes = 0;
  // Streamed indices read ahead of the optimizer (>= 0), as far as the budget allows.
  int64_t read_ahead = 2;
  // Back the optimizer state (master, momentum, variance). False: only frozen params (with
  // frozen_params; host_budget_bytes is then unused).
  bool optimizer_state = true;
  // Back the frozen param chunks this rank holds (see "Frozen param chunks" above), under
  // frozen_host_budget_bytes of host RAM (at least DiskTierFrozenMinHostBytes), reading ahead
  // the next frozen_read_ahead (>= 0) frozen chunks of the access order.
  bool frozen_params = false;
  int64_t frozen_host_budget_bytes = 0;
  int64_t frozen_read_ahead = 2;
};

// The least frozen_host_budget_bytes: one param chunk's host block (`param_block_bytes`), or 0
// when the rank holds no frozen chunk (`frozen_chunks`).
int64_t DiskTierFrozenMinHostBytes(int64_t param_block_bytes, int64_t frozen_chunks);

// The optimizer-state chunk types the tier backs, in the order the update pass accesses them.
inline constexpr std::array<ChunkType, 3> kDiskBackedTypes = {
    ChunkType::kMaster, ChunkType::kMomentum, ChunkType::kVariance};

// The least host budget the tier works with: the state chunks of one index accessed (all three
// types) plus one index written behind, each chunk a host block of `state_block_bytes` — or all
// of them when the rank owns fewer than two indices (`owned_indices`).
int64_t DiskTierMinHostBytes(int64_t state_block_bytes, int64_t owned_indices);

// How the budget splits (see "Which chunks stay" in the file comment): `kept` indices stay in
// host RAM once loaded, the rest stream through a window of `window` indices, of which
// `read_ahead` are read ahead. REQUIRES: budget >= DiskTierMinHostBytes.
struct DiskTierSplit {
  int64_t kept = 0;
  int64_t window = 0;
  int64_t read_ahead = 0;
};
DiskTierSplit SplitDiskTierBudget(int64_t host_budget_bytes, int64_t state_block_bytes,
                                  int64_t owned_indices, int64_t read_ahead);

class DiskTier final : public DiskDropper {
 public:
  // Adds a swap slot for every disk-backed chunk of `store` and spills the streamed chunks beyond
  // the budget that already hold payloads. `store`, `host` and `counters` are not owned and must
  // outlive the tier. InvalidArgument for a null swap, a negative read_ahead, or a budget below
  // DiskTierMinHostBytes (naming both numbers) — the same for the frozen fields with
  // frozen_params; the swap's errors.
  static absl::StatusOr<std::unique_ptr<DiskTier>> Create(ChunkStore* store, DeviceMemory* host,
                                                          DiskTierOptions options,
                                                          ChunkManagerCounters* counters,
                                                          MonotonicClock clock);
  DiskTier(const DiskTier&) = delete;
  DiskTier& operator=(const DiskTier&) = delete;
  // Waits for the I/O in flight (errors are logged).
  ~DiskTier() override;

  // Whether chunk `key` (a dense key, scheduler/chunk_keys.h) is disk-backed.
  bool backed(int64_t key) const {
    return key < static_cast<int64_t>(state_.size()) && state_[key].backed;
  }
  // Whether chunk `key` is a frozen param chunk the tier backs.
  bool frozen(int64_t key) const {
    return key < static_cast<int64_t>(state_.size()) && state_[key].frozen;
  }
  // Whether index `index`'s chunks stay in host RAM (the kept set).
  bool kept(int64_t index) const;

  // Before the chunks `keys` of index `chunk_index` are accessed on `device`: waits for their
  // writes in flight, makes room for the host blocks the access adds (those of `keys` not on the
  // host yet, for a host access; the spilled ones, for an accelerator access) and loads the
  // spilled ones from disk. Keys that are not disk-backed are ignored. ResourceExhausted when no
  // room can be made (chunks in use fill the budget); the swap's errors, with the chunk named.
  [[nodiscard]] absl::Status PrepareAccess(int64_t chunk_index, absl::Span<const int64_t> keys,
                                           Device device);
  // Before the tensors of `key` go to COMPUTE: a write (`writes`) or a zero-fill of a FREE tensor
  // makes its slot stale.
  void NoteAccess(int64_t key, bool writes);
  // After the access of index `chunk_index` returned: for an accelerator access, gives back the
  // host backing copies of `keys`' disk-backed chunks; for a host access, starts the read-ahead.
  // `descending`: the access came from inside backward (optimizer.overlap, docs/pipeline.md),
  // whose chunks become final in descending index order: the read-ahead takes the streamed
  // indices below `chunk_index` (no wrap) instead of those after it.
  void AfterAccess(int64_t chunk_index, absl::Span<const int64_t> keys, Device device,
                   bool descending = false);
  // After the release of `keys` (index `chunk_index`): starts the write-behind of the streamed
  // ones that changed, then the read-ahead (`descending` as for AfterAccess). The swap's errors,
  // with the chunk named.
  [[nodiscard]] absl::Status AfterRelease(int64_t chunk_index, absl::Span<const int64_t> keys,
                                          bool descending = false);

  // --- Frozen param chunks (see the file comment) ---------------------------------------------

  // The ResidencyEngine whose copies and evictions the frozen chunks share (not owned; set once
  // by the manager before any access, and it must outlive the tier).
  void AttachEngine(ResidencyEngine* engine) { engine_ = engine; }
  // The warm-up's schedule (not owned; outlives the tier): OPT and the read-ahead's order.
  void SetSchedule(const AccessSchedule* schedule);
  // Before the model's access of `keys` (param chunks; others are ignored) at `moment` (-1:
  // untracked or off the trace): makes room for the spilled frozen ones and loads them into host
  // memory. ResourceExhausted when the budget is held by chunks in use; the swap's errors, with
  // the chunk named (the chunk stays spilled).
  [[nodiscard]] absl::Status PrepareParamAccess(absl::Span<const int64_t> keys, int64_t moment);
  // After the model's access at `moment` (>= 0 on the trace): starts the frozen read-ahead.
  void AfterParamAccess(int64_t moment);
  // False while `key` is a frozen chunk whose bytes are not in its payload yet (spilled, or its
  // read still in flight; a completed read is taken, as a load): the accelerator's prefetch must
  // leave it to the demand access.
  bool TakeReadyParam(int64_t key);
  // DiskDropper: a frozen chunk without a host copy whose slot holds its bytes.
  bool CanDropToDisk(int64_t key) const override;
  [[nodiscard]] absl::Status DropToDisk(int64_t key) override;
  // Host bytes of frozen chunks now, their budget, least budget and peaks.
  int64_t frozen_host_bytes() const;
  int64_t frozen_host_budget_bytes() const { return options_.frozen_host_budget_bytes; }
  int64_t frozen_min_host_bytes() const { return frozen_min_host_bytes_; }
  int64_t frozen_peak_host_bytes() const { return frozen_peak_; }
  int64_t frozen_iteration_peak_bytes() const { return frozen_iteration_peak_; }
  int64_t num_frozen_chunks() const { return static_cast<int64_t>(frozen_keys_.size()); }

  // Host bytes of disk-backed chunks now (see the file comment).
  int64_t host_bytes() const;
  int64_t host_budget_bytes() const { return options_.host_budget_bytes; }
  int64_t min_host_bytes() const { return min_host_bytes_; }
  const DiskTierSplit& split() const { return split_; }
  // Records host_bytes() in the peaks (after the manager's own moves).
  void NoteHostBytes();
  // The highest host_bytes() since the last ResetIterationPeak (counters hold the lifetime peak).
  int64_t iteration_peak_bytes() const { return iteration_peak_; }
  void ResetIterationPeak() {
    iteration_peak_ = host_bytes();
    frozen_iteration_peak_ = frozen_host_bytes();
  }
  // Whether chunk `key` is spilled (its bytes only in its slot).
  bool spilled(int64_t key) const { return backed(key) && state_[key].spilled; }

 private:
  struct KeyState {
    bool backed = false;
    // A frozen param chunk (backed stays false: the optimizer-state paths ignore it).
    bool frozen = false;
    // Logical time of its last access, for LRU before the schedule is known.
    int64_t last_use = 0;
    // The slot holds the payload's current bytes.
    bool clean = false;
    // Released with non-FREE tensors whose bytes are in the slot; `saved` are their states.
    bool spilled = false;
    std::vector<TensorState> saved;
    // I/O in flight (0: none). A read started by read-ahead sets `ahead`.
    IoTicket read = 0;
    IoTicket write = 0;
    bool ahead = false;
  };

  DiskTier(ChunkStore* store, DeviceMemory* host, DiskTierOptions options,
           ChunkManagerCounters* counters, MonotonicClock clock);

  Chunk& ChunkOf(int64_t key) const { return store_->chunk(keys_.IdOf(key)); }
  // The host block a chunk of `key` takes.
  int64_t BlockBytes(int64_t key) const;
  // Host blocks `key` holds now (payload and backing copy on the host).
  int64_t HostBytesOf(int64_t key) const;
  // Accesses from `from` until index `index` is next used, in the cyclic ascending order.
  int64_t Distance(int64_t index, int64_t from) const;

  // Frees room for `bytes` more host bytes, sparing `protect`. With `prefetch_index` >= 0 (a
  // read-ahead of that index) only streamed chunks used after it whose writes completed may go,
  // and false is returned when that is not enough; otherwise ResourceExhausted.
  absl::StatusOr<bool> MakeRoom(int64_t bytes, absl::Span<const int64_t> protect,
                                int64_t prefetch_index);
  // Writes `key` if needed, waits, and releases its payload.
  absl::Status Spill(int64_t key);
  // The pieces of every spill: dropping a read-ahead nobody used (its bytes are the slot's);
  // writing the chunk from `src` (null: its payload) and waiting, unless it is clean or holds
  // nothing (a drop, counted); releasing the payload, remembering the tensors' states.
  absl::Status DropUnusedReadAhead(int64_t key);
  absl::Status WriteUnlessClean(int64_t key, const void* src);
  absl::Status ReleaseToSlot(int64_t key);
  absl::Status StartWrite(int64_t key, const void* src = nullptr);
  absl::Status WaitWrite(int64_t key);
  absl::Status StartRead(int64_t key, bool ahead);
  // Waits for `key`'s read (starting one if none) and restores its tensors' states.
  absl::Status Load(int64_t key);
  void ReadAhead(int64_t chunk_index, absl::Span<const int64_t> keys, bool descending = false);
  // Frozen chunks: the host block of one, the host blocks `key` holds, the rank an eviction
  // orders by (larger goes first: the next use after `moment`, or least recent use without a
  // schedule), making room (with `ahead_of` >= 0, a read-ahead of a chunk next used then: only
  // copies used after it, never a wait, false when that is not enough), and dropping one copy.
  int64_t FrozenBlockBytes() const;
  int64_t FrozenHostBytesOf(int64_t key) const;
  int64_t FrozenEvictionRank(int64_t key, int64_t moment) const;
  absl::StatusOr<bool> MakeFrozenRoom(int64_t bytes, absl::Span<const int64_t> protect,
                                      int64_t moment, int64_t ahead_of);
  absl::Status DropFrozenCopy(int64_t key);
  // Accesses of the frozen keys of an AccessChunks call (see PrepareAccess).
  absl::Status PrepareFrozenChunks(absl::Span<const int64_t> keys, Device device);

  ChunkStore* const store_;
  DeviceMemory* const host_;
  const DiskTierOptions options_;
  ChunkManagerCounters* const counters_;
  const MonotonicClock clock_;
  const ChunkKeys keys_;
  // By dense key.
  std::vector<KeyState> state_;
  // The disk-backed keys, ascending, and the owned indices, ascending.
  std::vector<int64_t> backed_keys_;
  std::vector<int64_t> owned_indices_;
  std::vector<bool> kept_;  // by index
  int64_t min_host_bytes_ = 0;
  // BlockBytes, once known.
  mutable int64_t block_bytes_ = 0;
  DiskTierSplit split_;
  // The index of the last access (OPT's "now"); -1 before the first.
  int64_t position_ = -1;
  int64_t iteration_peak_ = 0;
  // Frozen param chunks.
  ResidencyEngine* engine_ = nullptr;
  const AccessSchedule* schedule_ = nullptr;
  std::vector<int64_t> frozen_keys_;
  // The schedule's accesses of frozen keys, (moment, key), in order.
  std::vector<std::pair<int64_t, int64_t>> frozen_order_;
  int64_t frozen_min_host_bytes_ = 0;
  mutable int64_t frozen_block_bytes_ = 0;
  int64_t use_clock_ = 0;
  int64_t frozen_peak_ = 0;
  int64_t frozen_iteration_peak_ = 0;
};

}  // namespace ps

#endif  // PATRICKSTAR_SCHEDULER_DISK_TIER_H_
