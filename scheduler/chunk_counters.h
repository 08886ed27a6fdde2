// ChunkManagerCounters: what the ChunkManager counted — chunk traffic per pass of the iteration,
// prefetches and their hits, write-behinds, evictions under memory pressure, stall time, and the
// ZeRO collectives.
//
// Arithmetic is derived, not listed: every counter struct here is a plain aggregate of int64_t
// fields (an array of TransferCounters counts as its fields), so sums and differences are taken
// over its object representation as an array of int64_t (FlatCounters below). A field added to a
// struct takes part in +=, Minus and == with no further edit; the static_asserts reject what would
// break that (padding, a narrower or floating-point field).
//
// Thread safety: value types.
#ifndef PATRICKSTAR_SCHEDULER_CHUNK_COUNTERS_H_
#define PATRICKSTAR_SCHEDULER_CHUNK_COUNTERS_H_

#include <array>
#include <bit>
#include <cstddef>
#include <cstdint>
#include <string>
#include <type_traits>

#include "scheduler/metronome.h"

namespace ps {

// A counter struct seen as an array of its int64_t fields.
template <typename T>
struct FlatCounters {
  static_assert(std::is_trivially_copyable_v<T>);
  static_assert(std::has_unique_object_representations_v<T>,
                "counter structs hold int64_t fields only (no padding, no floating point)");
  static_assert(sizeof(T) % sizeof(int64_t) == 0 && alignof(T) == alignof(int64_t),
                "counter structs hold int64_t fields only");
  static constexpr size_t kFields = sizeof(T) / sizeof(int64_t);
  using Array = std::array<int64_t, kFields>;

  static Array Of(const T& t) { return std::bit_cast<Array>(t); }
  static T From(const Array& a) { return std::bit_cast<T>(a); }
  // a[i] += b[i] (sign = 1) or a[i] -= b[i] (sign = -1) for every field.
  static T Combine(const T& a, const T& b, int64_t sign) {
    Array x = Of(a);
    const Array y = Of(b);
    for (size_t i = 0; i < kFields; ++i) x[i] += sign * y[i];
    return From(x);
  }
};

// Chunk traffic. A load is a host-to-accelerator chunk copy, a write-back an accelerator-to-host
// one; bytes are payload bytes (capacity_bytes of the chunk).
struct TransferCounters {
  int64_t loads = 0;
  int64_t load_bytes = 0;
  int64_t write_backs = 0;
  int64_t write_back_bytes = 0;
  // Evictions that dropped the accelerator copy of a clean chunk: no copy.
  int64_t clean_evictions = 0;
  // Released chunks given a fresh accelerator payload (no copy).
  int64_t allocations = 0;

  int64_t moved_bytes() const { return load_bytes + write_back_bytes; }
  TransferCounters& operator+=(const TransferCounters& o);
  friend bool operator==(const TransferCounters& a, const TransferCounters& b) = default;
};

struct ChunkManagerCounters {
  // By the pass of the iteration whose access caused the traffic: FWD accesses after the
  // iteration's first BWD access (activation-checkpointing recompute) belong to the backward
  // pass and count under BWD. Untracked accesses count under the stage they name.
  std::array<TransferCounters, kNumStages> by_stage;
  // Chunks loaded ahead of their access, and accesses that found their chunk already loaded (or
  // loading) by a prefetch.
  int64_t prefetches = 0;
  int64_t prefetch_hits = 0;
  // Write-backs started early (also counted in by_stage as write-backs).
  int64_t write_behinds = 0;
  // Times the accelerator ran out of memory between accesses and the manager evicted chunks to
  // make room ("Pressure" in scheduler/chunk_manager.h), and the chunks it evicted then (also
  // counted in by_stage as write-backs or clean evictions). A reclaim whose eviction failed
  // counts neither.
  int64_t pressure_reclaims = 0;
  int64_t pressure_evictions = 0;
  // Payload bytes of frozen param chunks (chunk/chunk_layout.h: a LoRA fine-tune's base) this
  // rank owns that were copied accelerator -> host (also counted in by_stage as write-backs).
  // The engine never writes a frozen chunk back (backward never writes it, so its host copy stays
  // valid and every eviction is a clean drop): 0 unless something wrote its payload on the
  // accelerator outside the model's accesses (an AccessChunks kReadWrite on the accelerator).
  // Gathered remote copies (ZeRO) are transient and not counted.
  int64_t frozen_writeback_bytes = 0;
  // Time the calling thread blocked on chunk copies (loads, write-backs, zero-fills). With a
  // compute stream (stream-ordered accesses, see scheduler/chunk_manager.h) an access no longer
  // waits for its loads on the host, so this is only the host waits that remain (evictions, the
  // optimizer's host chunks, ZeRO collectives). Time a kernel spends waiting on the device for a
  // load is not visible to the host and is not counted.
  int64_t stall_ns = 0;
  // Time the calling thread blocked on the compute stream (before a clean drop, BeginAdam, ZeRO
  // reductions): the host had run ahead of the kernels, so this is compute, not copy time.
  int64_t compute_wait_ns = 0;
  // Stream-ordered accesses whose loads (or zero-fills) were still in flight when the access
  // returned: the compute stream waits for them instead of the host (not counted in stall_ns).
  int64_t stream_ordered_waits = 0;
  // ZeRO (world size > 1): group all-gathers and the bytes this rank received (remote data
  // chunks), reduce-scatters and the bytes this rank sent for others (remote data chunks), and
  // remote payloads freed. Time inside the collectives counts as comm_ns, not as stall.
  int64_t all_gathers = 0;
  int64_t all_gather_bytes = 0;
  int64_t reduce_scatters = 0;
  int64_t reduce_scatter_bytes = 0;
  int64_t remote_releases = 0;
  int64_t comm_ns = 0;
  // The disk tier (ChunkManagerOptions::disk, scheduler/disk_tier.h); all zero without it.
  // Reads and writes of optimizer-state chunks and their payload bytes (counted when started);
  // the reads started ahead of their access and the accesses that found one (hits); writes started
  // at a release (write-behind, also counted in disk_writes); spills that needed no write (clean,
  // or written behind already); the time the calling thread blocked on reads (the stall the
  // read-ahead did not hide) and on writes.
  int64_t disk_reads = 0;
  int64_t disk_read_bytes = 0;
  int64_t disk_writes = 0;
  int64_t disk_write_bytes = 0;
  int64_t disk_read_aheads = 0;
  int64_t disk_read_ahead_hits = 0;
  int64_t disk_write_behinds = 0;
  int64_t disk_drops = 0;
  int64_t disk_read_wait_ns = 0;
  int64_t disk_write_wait_ns = 0;
  // The most host bytes the tier's chunks held at once. A peak, not a sum: Minus and += treat it
  // like the other fields, so a difference of two readings means nothing; the ChunkManager's
  // iteration_counters() hold each iteration's own peak instead.
  int64_t disk_peak_host_bytes = 0;

  const TransferCounters& stage(Stage s) const { return by_stage[static_cast<int>(s)]; }
  TransferCounters& stage(Stage s) { return by_stage[static_cast<int>(s)]; }
  // Traffic summed over the stages.
  TransferCounters Total() const;
  // `this - earlier`, counter by counter.
  ChunkManagerCounters Minus(const ChunkManagerCounters& earlier) const;
  ChunkManagerCounters& operator+=(const ChunkManagerCounters& o);
  friend bool operator==(const ChunkManagerCounters& a, const ChunkManagerCounters& b) = default;
  // One line for logs.
  std::string DebugString() const;
};

}  // namespace ps

#endif  // PATRICKSTAR_SCHEDULER_CHUNK_COUNTERS_H_
