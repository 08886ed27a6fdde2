// Chunk-size search: given a model's operators, the world size and the memory of each device,
// find the chunk size that wastes least while one operator's working set still fits the
// accelerator — and the whole table of candidates, so a person can pick with the numbers in front
// of them (//tools:chunk_size_search prints it). PatrickStar's equivalent (§1.20 of the reference
// notes) scans 64M..312M in steps of 32M with hard-coded hardware; this one derives its range from
// the model and takes the hardware as input.
//
// Candidates are the multiples of `granularity_elems` from the smallest chunk holding the largest
// operator (all of an operator's tensors share one chunk) up to an upper bound: max_chunk_elems if
// given, else twice that smallest size — beyond it waste is already bounded by the small block
// operators while the working set and transfer granularity keep growing — and never more than
// one chunk for the whole model or than the working-set limit below.
//
// For each candidate the layout is what ChunkLayout::Build(kAppend) produces (simulated from the
// operator sizes without building it; tests check both agree), and:
//   model data (all ranks)  every param chunk incl. padding x SizeOf(compute) + every data chunk
//                           that is not frozen x 12 bytes (master, momentum, variance) —
//                           ChunkLayout's TotalModelDataBytes (frozen operators, trainable =
//                           false, fill param-only chunks of their own)
//   waste                   model data - params x SizeOf(compute) - trainable params x 12
//   utilization             params / (chunks incl. padding x chunk size)
//   per rank                the most model data one rank holds persistently (its param chunks
//                           plus its master/momentum/variance chunks)
//   working set             accelerator bytes one operator access needs: its ZeRO group's
//                           world_size param chunks, gathered (world_size 1: one chunk)
// Feasible: working set <= working_set_fraction x accelerator memory (the rest is left for
// non-model data: activations, workspaces), and per rank + the (world_size - 1) gathered chunks
// <= accelerator + host memory. Best: the feasible candidate with the least model data (least
// waste); ties go to the smaller chunk.
//
// Thread safety: pure functions.
#ifndef PATRICKSTAR_CHUNK_CHUNK_SIZE_SEARCH_H_
#define PATRICKSTAR_CHUNK_CHUNK_SIZE_SEARCH_H_

#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/types/span.h"
#include "base/units.h"
#include "chunk/operator_spec.h"
#include "memory/dtype.h"

namespace ps {

struct ChunkSizeSearchOptions {
  // Data-parallel ranks (>= 1).
  int world_size = 1;
  // Element type of the param chunks.
  DType compute_dtype = DType::kF16;
  // Memory of one accelerator, and host memory available to one rank. Both > 0.
  int64_t accelerator_memory_bytes = 0;
  int64_t host_memory_bytes = 0;
  // Share of the accelerator memory one operator's working set may use, in (0, 1].
  double working_set_fraction = 0.5;
  // Candidates are multiples of this (> 0).
  int64_t granularity_elems = kMiB;
  // Candidate bounds; 0 = automatic (see the file comment).
  int64_t min_chunk_elems = 0;
  int64_t max_chunk_elems = 0;
  // As ChunkLayoutOptions::tensor_alignment_elems.
  int64_t tensor_alignment_elems = 1;
};

struct ChunkSizeCandidate {
  int64_t chunk_elems = 0;
  // Chunks per type, padding included; padding chunks among them.
  int64_t num_chunks = 0;
  int64_t num_padding_chunks = 0;
  double utilization = 0;
  int64_t model_data_bytes = 0;
  int64_t waste_bytes = 0;
  int64_t rank_model_data_bytes = 0;
  int64_t working_set_bytes = 0;
  // rank_model_data_bytes + (world_size - 1) gathered param chunks.
  int64_t rank_peak_bytes = 0;
  bool fits_accelerator = false;
  bool fits_memory = false;

  bool feasible() const { return fits_accelerator && fits_memory; }
};

struct ChunkSizeSearchResult {
  int64_t total_params = 0;
  int64_t num_operators = 0;
  // The operator that bounds the chunk size from below, and its extent in an empty chunk.
  std::string largest_operator;
  int64_t largest_operator_elems = 0;
  // Every candidate, by increasing chunk size.
  std::vector<ChunkSizeCandidate> candidates;
  ChunkSizeCandidate best;
};

// Evaluates one chunk size. InvalidArgument for bad options, an invalid operator, or a chunk
// smaller than an operator.
absl::StatusOr<ChunkSizeCandidate> EvaluateChunkSize(absl::Span<const OperatorSpec> ops,
                                                     int64_t chunk_elems,
                                                     const ChunkSizeSearchOptions& options);

// The search. InvalidArgument, with the numbers and what to change, for bad options, an empty or
// invalid model, an operator whose smallest chunk's working set exceeds the accelerator share,
// too many candidates for the granularity, or a model whose data fits no candidate.
absl::StatusOr<ChunkSizeSearchResult> SearchChunkSize(absl::Span<const OperatorSpec> ops,
                                                      const ChunkSizeSearchOptions& options);

// A table for people: a header (model, hardware, bounds) and one row per candidate, best first
// (least model data), at most `max_rows` rows (all if max_rows <= 0, then by chunk size).
std::string FormatChunkSizeTable(const ChunkSizeSearchResult& result,
                                 const ChunkSizeSearchOptions& options, int max_rows);

}  // namespace ps

#endif  // PATRICKSTAR_CHUNK_CHUNK_SIZE_SEARCH_H_
