#include "chunk/chunk_size_search.h"

#include <algorithm>
#include <cstdint>
#include <limits>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "base/status_macros.h"
#include "base/units.h"
#include "chunk/chunk_type.h"

namespace ps {
namespace {

constexpr int64_t kMaxCandidates = 1'000'000;

// The operator sizes the simulation needs.
struct ModelSizes {
  std::vector<std::vector<int64_t>> tensor_numels;  // per operator, in order
  std::vector<bool> trainable;                      // per operator (OperatorSpec::trainable)
  int64_t total_params = 0;
  // Parameters of trainable operators (frozen ones have no optimizer state).
  int64_t trainable_params = 0;
  // Sum over operators of their extent in an empty chunk (>= total_params with alignment).
  int64_t total_footprint = 0;
  int64_t largest_footprint = 0;
  std::string largest_name;
};

absl::Status ValidateOptions(const ChunkSizeSearchOptions& o) {
  auto bad = [](auto&&... args) { return absl::InvalidArgumentError(absl::StrCat(args...)); };
  if (o.world_size < 1)
    return bad("chunk-size search: world_size must be >= 1, got ", o.world_size);
  if (o.accelerator_memory_bytes <= 0) {
    return bad(
        "chunk-size search: accelerator_memory_bytes must be positive (the memory of one "
        "accelerator), got ",
        o.accelerator_memory_bytes);
  }
  if (o.host_memory_bytes <= 0) {
    return bad(
        "chunk-size search: host_memory_bytes must be positive (host memory available to "
        "one rank), got ",
        o.host_memory_bytes);
  }
  if (!(o.working_set_fraction > 0 && o.working_set_fraction <= 1)) {
    return bad("chunk-size search: working_set_fraction must be in (0, 1], got ",
               o.working_set_fraction);
  }
  if (o.granularity_elems <= 0) {
    return bad("chunk-size search: granularity_elems must be positive, got ", o.granularity_elems);
  }
  if (o.min_chunk_elems < 0 || o.max_chunk_elems < 0) {
    return bad(
        "chunk-size search: min_chunk_elems and max_chunk_elems must be >= 0 (0 = "
        "automatic), got ",
        o.min_chunk_elems, " and ", o.max_chunk_elems);
  }
  if (o.tensor_alignment_elems < 1) {
    return bad("chunk-size search: tensor_alignment_elems must be >= 1, got ",
               o.tensor_alignment_elems);
  }
  return absl::OkStatus();
}

absl::StatusOr<ModelSizes> Summarize(absl::Span<const OperatorSpec> ops, int64_t alignment) {
  if (ops.empty()) {
    return absl::InvalidArgumentError("chunk-size search: the model has no operators");
  }
  ModelSizes m;
  m.tensor_numels.reserve(ops.size());
  for (const OperatorSpec& op : ops) {
    RETURN_IF_ERROR(ValidateOperatorSpec(op));
    std::vector<int64_t> numels;
    int64_t footprint = 0;
    for (const TensorSpec& t : op.tensors) {
      ASSIGN_OR_RETURN(int64_t numel, ShapeNumElems(t.shape));
      numels.push_back(numel);
      footprint = AlignUp(footprint, alignment) + numel;
      m.total_params += numel;
      if (op.trainable) m.trainable_params += numel;
    }
    m.total_footprint += footprint;
    if (footprint > m.largest_footprint) {
      m.largest_footprint = footprint;
      m.largest_name = op.name;
    }
    m.tensor_numels.push_back(std::move(numels));
    m.trainable.push_back(op.trainable);
  }
  return m;
}

// What ChunkLayout::Build(kAppend) makes of the model for chunks of `chunk_elems`.
struct AppendCount {
  int64_t data_chunks = 0;
  // The most data chunks holding optimizer state (trainable or empty) one rank owns.
  int64_t max_rank_state_chunks = 0;
  // Data chunks holding optimizer state, over all ranks.
  int64_t state_chunks = 0;
};

// Simulates ChunkLayout::Build(kAppend): each operator goes after the last tensor of the last
// chunk if that chunk holds its kind (frozen or trainable) and all its tensors fit there, else into
// a new chunk; when the kind changes with world size N > 1, empty chunks first complete the last
// chunk's ZeRO group (a group holds one kind). First fit in the last chunk finds nothing earlier:
// a layout built only by appending has no gaps but alignment gaps, which hold no aligned offset.
// Frozen chunks hold no optimizer state; empty chunks do (chunk/chunk_layout.h).
// REQUIRES: chunk_elems >= largest footprint.
AppendCount CountAppendChunks(const ModelSizes& m, int64_t chunk_elems, int64_t alignment,
                              int world_size) {
  std::vector<bool> frozen_chunk;  // by data chunk
  int64_t end = 0;
  for (size_t k = 0; k < m.tensor_numels.size(); ++k) {
    const std::vector<int64_t>& numels = m.tensor_numels[k];
    const bool frozen = !m.trainable[k];
    const int64_t chunks = static_cast<int64_t>(frozen_chunk.size());
    if (chunks > 0 && frozen_chunk.back() == frozen) {
      int64_t e = end;
      bool fits = true;
      for (int64_t n : numels) {
        e = AlignUp(e, alignment);
        if (e > chunk_elems - n) {
          fits = false;
          break;
        }
        e += n;
      }
      if (fits) {
        end = e;
        continue;
      }
    }
    if (chunks > 0 && frozen_chunk.back() != frozen) {
      frozen_chunk.resize(static_cast<size_t>(AlignUp(chunks, world_size)), false);
    }
    frozen_chunk.push_back(frozen);
    end = 0;
    for (int64_t n : numels) end = AlignUp(end, alignment) + n;
  }
  AppendCount count;
  count.data_chunks = static_cast<int64_t>(frozen_chunk.size());
  std::vector<int64_t> per_rank(static_cast<size_t>(world_size), 0);
  for (size_t c = 0; c < frozen_chunk.size(); ++c) {
    if (frozen_chunk[c]) continue;
    ++count.state_chunks;
    ++per_rank[c % static_cast<size_t>(world_size)];
  }
  count.max_rank_state_chunks = *std::max_element(per_rank.begin(), per_rank.end());
  return count;
}

int64_t WorkingSetLimitBytes(const ChunkSizeSearchOptions& o) {
  return static_cast<int64_t>(o.working_set_fraction *
                              static_cast<double>(o.accelerator_memory_bytes));
}

ChunkSizeCandidate Evaluate(const ModelSizes& m, int64_t chunk_elems,
                            const ChunkSizeSearchOptions& o) {
  const int64_t n = o.world_size;
  const int64_t param_elem_bytes = SizeOf(ChunkDType(ChunkType::kParam, o.compute_dtype));
  const int64_t os_elem_bytes =
      ModelDataBytesPerParam(o.compute_dtype) - param_elem_bytes;  // master + momentum + variance
  ChunkSizeCandidate c;
  c.chunk_elems = chunk_elems;
  const AppendCount count =
      CountAppendChunks(m, chunk_elems, o.tensor_alignment_elems, static_cast<int>(n));
  const int64_t data_chunks = count.data_chunks;
  c.num_chunks = AlignUp(data_chunks, n);
  c.num_padding_chunks = c.num_chunks - data_chunks;
  c.utilization = static_cast<double>(m.total_params) /
                  (static_cast<double>(c.num_chunks) * static_cast<double>(chunk_elems));
  // Frozen chunks are param-only.
  c.model_data_bytes = c.num_chunks * chunk_elems * param_elem_bytes +
                       count.state_chunks * chunk_elems * os_elem_bytes;
  c.waste_bytes =
      c.model_data_bytes - m.total_params * param_elem_bytes - m.trainable_params * os_elem_bytes;
  // Param chunks split evenly; the rank owning the most state chunks bounds the rest.
  c.rank_model_data_bytes = c.num_chunks / n * chunk_elems * param_elem_bytes +
                            count.max_rank_state_chunks * chunk_elems * os_elem_bytes;
  c.working_set_bytes = n * chunk_elems * param_elem_bytes;
  c.rank_peak_bytes = c.rank_model_data_bytes + (n - 1) * chunk_elems * param_elem_bytes;
  c.fits_accelerator = c.working_set_bytes <= WorkingSetLimitBytes(o);
  c.fits_memory = c.rank_peak_bytes <= o.accelerator_memory_bytes + o.host_memory_bytes;
  return c;
}

// "336592896 (321.0 Mi)", "33792 (33.0 Ki)", "100".
std::string Elems(int64_t elems) {
  if (elems >= kMiB)
    return absl::StrFormat("%d (%.1f Mi)", elems, static_cast<double>(elems) / kMiB);
  if (elems >= kKiB)
    return absl::StrFormat("%d (%.1f Ki)", elems, static_cast<double>(elems) / kKiB);
  return absl::StrCat(elems);
}

}  // namespace

absl::StatusOr<ChunkSizeCandidate> EvaluateChunkSize(absl::Span<const OperatorSpec> ops,
                                                     int64_t chunk_elems,
                                                     const ChunkSizeSearchOptions& options) {
  RETURN_IF_ERROR(ValidateOptions(options));
  ASSIGN_OR_RETURN(ModelSizes m, Summarize(ops, options.tensor_alignment_elems));
  if (chunk_elems < m.largest_footprint) {
    return absl::InvalidArgumentError(absl::StrCat(
        "a chunk of ", chunk_elems, " elements cannot hold operator '", m.largest_name, "' (",
        m.largest_footprint, " elements); all of an operator's parameters must share one chunk"));
  }
  return Evaluate(m, chunk_elems, options);
}

absl::StatusOr<ChunkSizeSearchResult> SearchChunkSize(absl::Span<const OperatorSpec> ops,
                                                      const ChunkSizeSearchOptions& options) {
  RETURN_IF_ERROR(ValidateOptions(options));
  const ChunkSizeSearchOptions& o = options;
  ASSIGN_OR_RETURN(ModelSizes m, Summarize(ops, o.tensor_alignment_elems));
  const int64_t gran = o.granularity_elems;
  const int64_t param_elem_bytes = SizeOf(ChunkDType(ChunkType::kParam, o.compute_dtype));
  const std::string dtype_name(DTypeName(o.compute_dtype));

  const int64_t lower = AlignUp(std::max(m.largest_footprint, o.min_chunk_elems), gran);
  const int64_t ws_limit_bytes = WorkingSetLimitBytes(o);
  const int64_t ws_max_elems = ws_limit_bytes / (o.world_size * param_elem_bytes);
  if (lower > ws_max_elems) {
    return absl::InvalidArgumentError(absl::StrFormat(
        "no chunk size fits the accelerator: operator '%s' has %d elements, so a chunk needs at "
        "least %s elements (granularity %d); one access needs its whole ZeRO group of %d such %s "
        "chunk(s) on the accelerator = %s, more than the %s allowed (working_set_fraction %.2f "
        "of %s accelerator memory). "
        "Give more accelerator memory or a larger working_set_fraction, use fewer ranks, a "
        "smaller granularity, or split that operator (e.g. keep the embedding on the host)",
        m.largest_name, m.largest_footprint, Elems(lower), gran, o.world_size, dtype_name,
        FormatBytes(o.world_size * lower * param_elem_bytes), FormatBytes(ws_limit_bytes),
        o.working_set_fraction, FormatBytes(o.accelerator_memory_bytes)));
  }
  int64_t upper = o.max_chunk_elems > 0 ? o.max_chunk_elems / gran * gran : 2 * lower;
  upper = std::min(upper, AlignUp(m.total_footprint, gran));
  upper = std::min(upper, ws_max_elems / gran * gran);
  if (upper < lower) {
    return absl::InvalidArgumentError(
        absl::StrCat("chunk-size search: max_chunk_elems ", o.max_chunk_elems,
                     " is below the smallest candidate ", lower, " (operator '", m.largest_name,
                     "' has ", m.largest_footprint, " elements, rounded up to the granularity ",
                     gran, "); raise max_chunk_elems"));
  }
  const int64_t count = (upper - lower) / gran + 1;
  if (count > kMaxCandidates) {
    return absl::InvalidArgumentError(
        absl::StrCat("chunk-size search: ", count, " candidates between ", lower, " and ", upper,
                     " elements at granularity ", gran, " are too many (limit ", kMaxCandidates,
                     "); raise granularity_elems or narrow min/max_chunk_elems"));
  }

  ChunkSizeSearchResult result;
  result.total_params = m.total_params;
  result.num_operators = static_cast<int64_t>(m.tensor_numels.size());
  result.largest_operator = m.largest_name;
  result.largest_operator_elems = m.largest_footprint;
  result.candidates.reserve(count);
  const ChunkSizeCandidate* best = nullptr;
  const ChunkSizeCandidate* least_peak = nullptr;
  for (int64_t chunk_elems = lower; chunk_elems <= upper; chunk_elems += gran) {
    result.candidates.push_back(Evaluate(m, chunk_elems, o));
  }
  for (const ChunkSizeCandidate& c : result.candidates) {
    if (least_peak == nullptr || c.rank_peak_bytes < least_peak->rank_peak_bytes) least_peak = &c;
    if (c.feasible() && (best == nullptr || c.model_data_bytes < best->model_data_bytes)) {
      best = &c;
    }
  }
  if (best == nullptr) {
    return absl::InvalidArgumentError(absl::StrFormat(
        "the model's data does not fit: with %d parameters at %d bytes each (%s compute) and "
        "world size %d, one rank needs at least %s (at chunk size %s, with %d chunks gathered "
        "from other ranks) but has %s of accelerator + %s of host memory. Add host memory, add "
        "ranks, or train a smaller model",
        m.total_params, ModelDataBytesPerParam(o.compute_dtype), dtype_name, o.world_size,
        FormatBytes(least_peak->rank_peak_bytes), Elems(least_peak->chunk_elems), o.world_size - 1,
        FormatBytes(o.accelerator_memory_bytes), FormatBytes(o.host_memory_bytes)));
  }
  result.best = *best;
  return result;
}

std::string FormatChunkSizeTable(const ChunkSizeSearchResult& result,
                                 const ChunkSizeSearchOptions& o, int max_rows) {
  std::string out;
  const int64_t bytes_per_param = ModelDataBytesPerParam(o.compute_dtype);
  int64_t feasible = 0;
  for (const ChunkSizeCandidate& c : result.candidates) feasible += c.feasible() ? 1 : 0;
  absl::StrAppendFormat(
      &out,
      "model: %d parameters in %d operators; largest operator '%s' = %d elements\n"
      "ideal model data: %d B/param (%s compute) x parameters = %s over %d rank(s)\n"
      "hardware: world size %d; accelerator %s per rank (working set limit %s = %.2f of it); "
      "host %s per rank\n",
      result.total_params, result.num_operators, result.largest_operator,
      result.largest_operator_elems, bytes_per_param, DTypeName(o.compute_dtype),
      FormatBytes(result.total_params * bytes_per_param), o.world_size, o.world_size,
      FormatBytes(o.accelerator_memory_bytes), FormatBytes(WorkingSetLimitBytes(o)),
      o.working_set_fraction, FormatBytes(o.host_memory_bytes));
  if (!result.candidates.empty()) {
    absl::StrAppendFormat(&out,
                          "candidates: %s .. %s elements in steps of %d: %d candidates, %d "
                          "feasible\n",
                          Elems(result.candidates.front().chunk_elems),
                          Elems(result.candidates.back().chunk_elems), o.granularity_elems,
                          result.candidates.size(), feasible);
  }
  absl::StrAppendFormat(&out, "best: %s elements per chunk\n\n", Elems(result.best.chunk_elems));

  std::vector<const ChunkSizeCandidate*> rows;
  rows.reserve(result.candidates.size());
  for (const ChunkSizeCandidate& c : result.candidates) rows.push_back(&c);
  if (max_rows > 0) {
    std::stable_sort(rows.begin(), rows.end(), [](const auto* a, const auto* b) {
      if (a->feasible() != b->feasible()) return a->feasible();
      return a->model_data_bytes < b->model_data_bytes;
    });
    if (static_cast<int64_t>(rows.size()) > max_rows) rows.resize(max_rows);
  }
  absl::StrAppendFormat(&out, "  %-26s %7s %4s %8s %13s %11s %12s %12s %12s  %s\n", "chunk elems",
                        "chunks", "pad", "util", "model data", "waste", "per rank", "peak/rank",
                        "working set", "fits");
  for (const ChunkSizeCandidate* c : rows) {
    const char* fits = c->feasible()          ? "yes"
                       : !c->fits_accelerator ? "no: working set"
                                              : "no: memory";
    absl::StrAppendFormat(&out, "%s %-26s %7d %4d %7.2f%% %13s %11s %12s %12s %12s  %s\n",
                          c->chunk_elems == result.best.chunk_elems ? "*" : " ",
                          Elems(c->chunk_elems), c->num_chunks, c->num_padding_chunks,
                          100.0 * c->utilization, FormatBytes(c->model_data_bytes),
                          FormatBytes(c->waste_bytes), FormatBytes(c->rank_model_data_bytes),
                          FormatBytes(c->rank_peak_bytes), FormatBytes(c->working_set_bytes), fits);
  }
  if (max_rows > 0 && static_cast<int64_t>(result.candidates.size()) > max_rows) {
    absl::StrAppendFormat(&out, "  ... %d more candidates not shown\n",
                          static_cast<int64_t>(result.candidates.size()) - max_rows);
  }
  return out;
}

}  // namespace ps
