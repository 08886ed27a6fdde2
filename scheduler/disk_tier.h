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
// keep, and the usual zero-fill on first access applies. Param chunks are not disk-backed.
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
// Errors of the swap (DataLoss, EIO, ENOSPC, ...) are returned with the chunk named ("loading
// momentum#12 from disk: ..."); the chunk stays where it was (a failed load leaves it spilled, a
// failed write leaves it on the host, dirty), so the manager stays usable and destructible.
// Destroying the tier waits for the I/O in flight; chunks still spilled then keep FREE tensors
// (the swap's files are scratch: checkpoint through the manager before).
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
#include "scheduler/chunk_counters.h"
#include "scheduler/chunk_keys.h"

namespace ps {

struct DiskTierOptions {
  // Where spilled chunks go. Not owned; must outlive the ChunkManager. Required.
  ChunkSwap* swap = nullptr;
  // Host bytes the disk-backed chunks may take at any moment (see the file comment); at least
  // DiskTierMinHostBytes.
  int64_t host_budget_bytes = 0;
  // Streamed indices read ahead of the optimizer (>= 0), as far as the budget allows.
  int64_t read_ahead = 2;
};

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

class DiskTier {
 public:
  // Adds a swap slot for every disk-backed chunk of `store` and spills the streamed chunks beyond
  // the budget that already hold payloads. `store`, `host` and `counters` are not owned and must
  // outlive the tier. InvalidArgument for a null swap, a negative read_ahead, or a budget below
  // DiskTierMinHostBytes (naming both numbers); the swap's errors.
  static absl::StatusOr<std::unique_ptr<DiskTier>> Create(ChunkStore* store, DeviceMemory* host,
                                                          DiskTierOptions options,
                                                          ChunkManagerCounters* counters,
                                                          MonotonicClock clock);
  DiskTier(const DiskTier&) = delete;
  DiskTier& operator=(const DiskTier&) = delete;
  // Waits for the I/O in flight (errors are logged).
  ~DiskTier();

  // Whether chunk `key` (a dense key, scheduler/chunk_keys.h) is disk-backed.
  bool backed(int64_t key) const {
    return key < static_cast<int64_t>(state_.size()) && state_[key].backed;
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
  void AfterAccess(int64_t chunk_index, absl::Span<const int64_t> keys, Device device);
  // After the release of `keys` (index `chunk_index`): starts the write-behind of the streamed
  // ones that changed, then the read-ahead. The swap's errors, with the chunk named.
  [[nodiscard]] absl::Status AfterRelease(int64_t chunk_index, absl::Span<const int64_t> keys);

  // Host bytes of disk-backed chunks now (see the file comment).
  int64_t host_bytes() const;
  int64_t host_budget_bytes() const { return options_.host_budget_bytes; }
  int64_t min_host_bytes() const { return min_host_bytes_; }
  const DiskTierSplit& split() const { return split_; }
  // Records host_bytes() in the peaks (after the manager's own moves).
  void NoteHostBytes();
  // The highest host_bytes() since the last ResetIterationPeak (counters hold the lifetime peak).
  int64_t iteration_peak_bytes() const { return iteration_peak_; }
  void ResetIterationPeak() { iteration_peak_ = host_bytes(); }
  // Whether chunk `key` is spilled (its bytes only in its slot).
  bool spilled(int64_t key) const { return backed(key) && state_[key].spilled; }

 private:
  struct KeyState {
    bool backed = false;
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
  absl::Status StartWrite(int64_t key);
  absl::Status WaitWrite(int64_t key);
  absl::Status StartRead(int64_t key, bool ahead);
  // Waits for `key`'s read (starting one if none) and restores its tensors' states.
  absl::Status Load(int64_t key);
  void ReadAhead(int64_t chunk_index, absl::Span<const int64_t> keys);

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
};

}  // namespace ps

#endif  // PATRICKSTAR_SCHEDULER_DISK_TIER_H_
