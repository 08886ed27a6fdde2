// ResidencyEngine: the moving parts of the ChunkManager — the two copy streams, the set of chunks
// resident on the accelerator, loads, evictions, write-behind, and eviction under memory pressure.
// It carries out what it is told and counts it (ChunkManagerCounters); what to move and when is
// decided above it (scheduler/chunk_manager.h, with scheduler/planner.h and the EvictionPolicy).
//
// Streams. Copies run on two streams of the engine, one per direction (a GPU's two copy
// engines): loads and zero-fills on the load stream, write-backs on the store stream. A load is
// asynchronous: the chunk counts as resident at once and its copy is *in flight* until
// WaitForCopies; an event recorded after the copies marks their completion.
//
// Clean eviction (ResidencyOptions::clean_eviction). A chunk loaded from the host keeps its host
// buffer as a backing copy (chunk/chunk.h), so a chunk not written since it was loaded is evicted
// by dropping the accelerator copy, with no copy at all. A dirty chunk is written back into its
// host buffer (allocating one from the host chunk pool if it has none) and the engine waits for
// that. Without clean eviction, host copies are freed as soon as a load completes and every
// eviction is a write-back (PatrickStar's behaviour, kept for comparison).
//
// Frozen chunks (chunk/chunk_layout.h: a LoRA fine-tune's base). An owned frozen param chunk is
// never written by backward (the ChunkManager keeps it clean), so its host copy stays the
// parameter's home: it is kept even without clean eviction, every eviction is a drop, and it is
// never written behind. Were one dirty anyway (written on the accelerator outside the model's
// accesses), its eviction writes it back and counts ChunkManagerCounters::frozen_writeback_bytes.
//
// Frozen chunks on disk (scheduler/disk_tier.h, DiskTierOptions::frozen_params). A DiskDropper
// (SetDiskDropper) may claim a frozen chunk on the accelerator that has no host copy but whose
// bytes a disk slot holds: evicting it gives its accelerator block back (DropToDisk) instead of
// writing it back into a fresh host block; it counts as a clean eviction.
//
// Write-behind. StartWriteBehind starts the write-back of a dirty resident chunk on the store
// stream without waiting (after the caller's compute up to the last release, as a stream-side
// wait); the chunk is in flight until WaitForCopies and, once written, clean: its later eviction
// or move is a drop.
//
// The caller's compute stream (ResidencyOptions::compute_stream). NoteComputeRelease records an
// event on it at every release; before a chunk's device payload is written back or dropped, the
// engine waits for that event, so kernels enqueued before the release are done with it: a host
// wait before a drop, a pressure eviction or a payload release (the block returns to its pool on
// the host at once, so the host must know the kernels are done), a stream-side wait of the store
// stream before a write-back or a write-behind. In the other direction OrderComputeAfterLoads
// makes the compute stream wait for the load stream (loads and zero-fills), so an access needs no
// host wait for its loads; their bookkeeping (pending copies) completes at the next
// WaitForCopies or CopiesDone.
//
// Pressure. ReclaimUnderPressure evicts every resident chunk that may move (not COMPUTE, not
// pinned, not kept by the caller) — dirty ones written back, waiting for the copies — and returns
// the freed blocks to the device: the last resort when an allocation does not fit although the
// plan said it would. Only evictions that happened are counted.
//
// Events. With a ChunkEventListener, every copy is bracketed by host functions on its stream that
// time it where it runs, and moves without a copy are reported at once (scheduler/chunk_events.h).
// MoveContext says which pass and moment a move belongs to.
//
// Thread safety: thread-compatible: one thread calls the engine; the streams only move the bytes
// it enqueued.
#ifndef PATRICKSTAR_SCHEDULER_RESIDENCY_H_
#define PATRICKSTAR_SCHEDULER_RESIDENCY_H_

#include <array>
#include <cstdint>
#include <functional>
#include <memory>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "absl/container/flat_hash_set.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "base/clock.h"
#include "chunk/chunk.h"
#include "chunk/chunk_store.h"
#include "memory/backend.h"
#include "memory/device_memory.h"
#include "scheduler/chunk_counters.h"
#include "scheduler/chunk_events.h"
#include "scheduler/chunk_keys.h"
#include "scheduler/metronome.h"

namespace ps {

// Evicts frozen chunks whose bytes are on disk without a copy (see "Frozen chunks on disk").
class DiskDropper {
 public:
  virtual ~DiskDropper() = default;
  // Whether evicting `key` (resident, movable, no host backing copy) may just drop its payload.
  virtual bool CanDropToDisk(int64_t key) const = 0;
  // Drops `key`'s payload (the caller waited for its copies and the compute stream).
  [[nodiscard]] virtual absl::Status DropToDisk(int64_t key) = 0;
};

struct ResidencyOptions {
  // Keep host copies of loaded chunks so that unchanged chunks are evicted without a copy.
  bool clean_eviction = true;
  // The caller's compute stream, if any (not owned; must outlive the engine).
  Stream* compute_stream = nullptr;
  // Times stalls, collectives and events (base/clock.h).
  MonotonicClock clock = kSteadyClock;
  // Told about every move and access (not owned; must outlive the engine). Null: nothing is
  // reported and nothing extra is enqueued on the streams.
  ChunkEventListener* listener = nullptr;
};

// The pass a move is counted under (ChunkManagerCounters::by_stage) and the moment reported with
// it (-1: outside an iteration).
struct MoveContext {
  Stage stage = Stage::kForward;
  int64_t moment = -1;
};

class ResidencyEngine {
 public:
  // None of the pointers is owned; all must outlive the engine. `accelerator` is the memory of
  // `backend`'s device and `host` host memory, both with a chunk pool for every chunk type's
  // size; `counters` is where the engine counts.
  // InvalidArgument when a device has no chunk pool for a chunk type; errors of creating the
  // streams and the event.
  static absl::StatusOr<std::unique_ptr<ResidencyEngine>> Create(
      ChunkStore* store, Backend* backend, DeviceMemory* accelerator, DeviceMemory* host,
      ResidencyOptions options, ChunkManagerCounters* counters);
  ResidencyEngine(const ResidencyEngine&) = delete;
  ResidencyEngine& operator=(const ResidencyEngine&) = delete;
  // Waits for the compute stream to reach the last release (and, once it was made to wait for the
  // load stream, for all of its work) and for the copies in flight.
  ~ResidencyEngine();

  ChunkKeys keys() const { return keys_; }
  Chunk& chunk(int64_t key) const { return store_->chunk(keys_.IdOf(key)); }
  // What one resident chunk of `type` costs on the accelerator: a block of the chunk pool for its
  // size (DeviceMemory::chunk_pool_for), so a 16-bit param chunk costs a 16-bit block.
  int64_t chunk_cost_bytes(ChunkType type) const { return cost_bytes_[static_cast<size_t>(type)]; }
  // The cost of the chunk of dense key `key`.
  int64_t key_cost_bytes(int64_t key) const { return chunk_cost_bytes(keys_.IdOf(key).type); }
  DeviceMemory& accelerator() const { return *accel_; }

  // --- The resident set (loads in flight included) ----------------------------------------------

  bool resident(int64_t key) const { return resident_.contains(key); }
  // Whether `key` is a param chunk of frozen operators this rank owns (see "Frozen chunks").
  bool frozen_param(int64_t key) const;
  int64_t resident_bytes() const { return resident_bytes_; }
  int64_t num_resident() const { return static_cast<int64_t>(resident_.size()); }
  // Ascending.
  std::vector<int64_t> ResidentKeys() const;
  // Accelerator cost of the resident chunks that cannot move (COMPUTE or pinned) and are not in
  // `keep`.
  int64_t StuckBytes(const absl::flat_hash_set<int64_t>& keep) const;
  // Whether a copy of `key` (load or write-behind) is in flight.
  bool in_flight(int64_t key) const { return pending_.contains(key); }

  // See "Frozen chunks on disk" (not owned; null: none). Must outlive its use, or be reset.
  void SetDiskDropper(DiskDropper* dropper) { dropper_ = dropper; }

  // --- Moves ----------------------------------------------------------------------------------

  // Starts loads onto the accelerator of `keys` (fresh payloads for released chunks, which count
  // as allocations); they are resident from now on. `prefetch` counts them as prefetches.
  // InternalError for a chunk already on the accelerator but not resident; the pools' and
  // streams' errors otherwise (the chunks started before the error stay resident).
  [[nodiscard]] absl::Status Load(const std::vector<int64_t>& keys, MoveContext context,
                                  bool prefetch);
  // Moves `victims` (resident, movable) to the host: clean ones by dropping the accelerator copy,
  // dirty ones by writing back first (waiting for the copies); frozen ones the DiskDropper claims
  // are dropped to disk (no host copy at all). `evicted` (optional) is increased
  // by the chunks actually evicted, also on error. Errors of the copies; if a write-back cannot
  // start, no victim is evicted.
  [[nodiscard]] absl::Status Evict(const std::vector<int64_t>& victims, MoveContext context,
                                   int64_t* evicted = nullptr);
  // Brings chunk `key` to the host: a released chunk gets a host payload; an accelerator one is
  // evicted.
  [[nodiscard]] absl::Status MoveToHost(int64_t key, MoveContext context);
  // Starts the write-back of `key` on the store stream if it is resident, movable, dirty and has
  // no copy in flight; returns whether it started (see the file comment).
  [[nodiscard]] absl::StatusOr<bool> StartWriteBehind(int64_t key, MoveContext context);
  // Frees the payload of `key` wherever it is, after its copies and the caller's compute (ZeRO's
  // remote chunks). FailedPrecondition if it cannot be released (COMPUTE, pinned).
  [[nodiscard]] absl::Status ReleasePayload(int64_t key);

  // Counts an access that found `key` resident: a prefetch hit if a prefetch loaded it and no
  // access used it since.
  void NoteAccessed(int64_t key);

  // --- Waiting --------------------------------------------------------------------------------

  // Waits for the copies of `keys` in flight (counted as stall time).
  [[nodiscard]] absl::Status WaitForCopies(const std::vector<int64_t>& keys);
  // True when no copy of `key` is in flight (completing the bookkeeping of a finished one).
  bool CopiesDone(int64_t key);
  // The load stream, for zero-fills of accelerator payloads; SyncLoadStream waits for it
  // (counted as stall time).
  Stream& load_stream() const { return *load_stream_; }
  [[nodiscard]] absl::Status SyncLoadStream();
  // Records, on the caller's compute stream (if any), the point the next drop or write-back of a
  // device payload waits for.
  [[nodiscard]] absl::Status NoteComputeRelease();
  // Waits on the host for that point.
  [[nodiscard]] absl::Status WaitForCompute();
  // Whether a compute stream was given.
  bool has_compute_stream() const { return options_.compute_stream != nullptr; }
  // Makes the compute stream wait, stream-side, for the copies of `keys` still in flight and, with
  // `zero_fill`, for the zero-fills enqueued on the load stream: for a load, the load stream's
  // work so far (it runs in order, so that is exactly the completion of the latest such load);
  // for a write-behind (its kernels would overwrite the bytes being written back), the store
  // stream's. Counts a stream-ordered wait when something is still in flight. Errors of copies
  // that already failed. REQUIRES: has_compute_stream().
  [[nodiscard]] absl::Status OrderComputeAfterLoads(const std::vector<int64_t>& keys,
                                                    bool zero_fill);

  // --- Pressure -------------------------------------------------------------------------------

  // See the file comment. Chunks in `keep` stay. Returns the bytes given back to the device.
  int64_t ReclaimUnderPressure(const absl::flat_hash_set<int64_t>& keep, MoveContext context);

  // --- Events ---------------------------------------------------------------------------------

  // A reading of ResidencyOptions::clock.
  int64_t NowNs() const { return options_.clock.now_ns(); }
  ChunkEventListener* listener() const { return options_.listener; }
  // Reports an access whose chunks are now resident (requested at `request_ns`).
  void ReportAccess(absl::string_view name, int64_t chunk_index, Stage stage, int64_t moment,
                    bool warmup, int64_t request_ns) const;
  void ReportRelease(absl::string_view name, int64_t chunk_index, Stage stage) const;

 private:
  ResidencyEngine(ChunkStore* store, Backend* backend, DeviceMemory* accelerator,
                  DeviceMemory* host, ResidencyOptions options, ChunkManagerCounters* counters);

  // Enqueues a copy with `enqueue` on `stream`; with a listener, brackets it with host functions
  // that time it on the stream and report `event` when it completes.
  absl::Status TimedCopy(Stream& stream, ChunkMoveEvent event,
                         const std::function<absl::Status()>& enqueue);
  ChunkMoveEvent MoveEvent(ChunkMoveKind kind, const Chunk& chunk, MoveContext context) const;
  // Reports a move without a copy, now.
  void ReportMove(ChunkMoveKind kind, int64_t key, MoveContext context);
  // Waits for the work enqueued on `stream` so far, counting stall time.
  absl::Status SyncStream(Stream& stream);
  TransferCounters& traffic(Stage stage) { return counters_->stage(stage); }

  ChunkStore* const store_;
  Backend* const backend_;
  DeviceMemory* const accel_;
  DeviceMemory* const host_;
  const ResidencyOptions options_;
  ChunkManagerCounters* const counters_;
  const ChunkKeys keys_;
  // chunk_cost_bytes per ChunkType.
  std::array<int64_t, kNumChunkTypes> cost_bytes_ = {};

  // Host-to-accelerator copies and zero-fills; accelerator-to-host copies (two copy engines).
  std::unique_ptr<Stream> load_stream_;
  std::unique_ptr<Stream> store_stream_;
  std::unique_ptr<Event> compute_done_;
  bool compute_pending_ = false;
  // Recorded on the load stream by OrderComputeAfterLoads; the compute stream waits for it. Owned
  // here and only re-recorded (a stream wait refers to the event until it ran), and
  // `compute_waits_on_loads_` says the destructor must let the compute stream pass such a wait
  // before the event dies.
  std::unique_ptr<Event> loads_done_;
  std::unique_ptr<Event> stores_done_;
  bool compute_waits_on_loads_ = false;

  // Chunks whose payload is on the accelerator (loads in flight included).
  absl::flat_hash_set<int64_t> resident_;
  int64_t resident_bytes_ = 0;
  // Copies in flight (loads, write-behinds): key -> the event recorded after the copy.
  absl::flat_hash_map<int64_t, std::shared_ptr<Event>> pending_;
  // The keys of pending_ whose copy is a write-behind (on the store stream).
  absl::flat_hash_set<int64_t> behind_;
  // Chunks loaded by a prefetch and not accessed since.
  absl::flat_hash_set<int64_t> prefetched_;
  DiskDropper* dropper_ = nullptr;
};

}  // namespace ps

#endif  // PATRICKSTAR_SCHEDULER_RESIDENCY_H_
