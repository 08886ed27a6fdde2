#include "trainer/data/packed_loader.h"

#include <algorithm>
#include <limits>
#include <numeric>
#include <set>
#include <utility>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "base/status_macros.h"
#include "glog/logging.h"
#include "trainer/data/internal/epoch_permutation.h"
#include "trainer/data/internal/loader_checks.h"

namespace ps {
namespace {

int64_t CeilDiv(int64_t a, int64_t b) { return a / b + (a % b != 0 ? 1 : 0); }

}  // namespace

absl::StatusOr<PackedLoader> PackedLoader::Create(ExamplesView examples,
                                                  const PackedLoaderOptions& options) {
  RETURN_IF_ERROR(
      data_internal::CheckLoaderShape("PackedLoaderOptions", {.batch_size = options.batch_size,
                                                              .seq_len = options.seq_len,
                                                              .vocab_size = options.vocab_size,
                                                              .rank = options.rank,
                                                              .world_size = options.world_size,
                                                              .seq_len_is_int32 = true}));
  RETURN_IF_ERROR(ValidateExamples(examples));
  if (examples.num_examples() == 0) {
    return absl::InvalidArgumentError(
        "there are no examples to train on (the data holds 0 examples)");
  }
  const TokenSpan tokens = examples.tokens;
  const int64_t bad = data_internal::FirstTokenAtLeast(tokens, options.vocab_size);
  if (bad < static_cast<int64_t>(tokens.size())) {
    const auto it = std::upper_bound(examples.starts.begin(), examples.starts.end(), bad);
    const int64_t e = static_cast<int64_t>(it - examples.starts.begin()) - 1;
    return absl::InvalidArgumentError(absl::StrCat(
        "token ", tokens[bad], " at position ", bad - examples.starts[e], " of example ", e,
        " (token ", bad, " of ", tokens.size(), ") is out of range for vocab_size ",
        options.vocab_size, "; the data was prepared for a larger vocabulary"));
  }
  return PackedLoader(examples, options);
}

int64_t PackedLoader::KeptLength(int64_t e) const {
  return std::min(examples_.starts[e + 1] - examples_.starts[e], options_.seq_len);
}

PackedLoader::PackedLoader(ExamplesView examples, const PackedLoaderOptions& options)
    : examples_(examples), options_(options) {
  const int64_t num_ex = examples.num_examples();
  const int64_t t_len = options.seq_len;
  for (int64_t e = 0; e < num_ex; ++e) {
    const int64_t len = examples.starts[e + 1] - examples.starts[e];
    if (len > t_len) {
      ++truncated_examples_;
      dropped_tokens_ += len - t_len;
    }
    real_tokens_per_epoch_ += std::min(len, t_len);
  }

  // row_of[e] and the placement order, then the rows as a CSR built from them.
  std::vector<int64_t> order(static_cast<size_t>(num_ex));
  std::iota(order.begin(), order.end(), int64_t{0});
  std::vector<int64_t> row_of(static_cast<size_t>(num_ex));
  int64_t num_rows = 0;
  if (!options.packing) {
    row_of = order;
    num_rows = num_ex;
  } else {
    std::vector<int64_t> kept(static_cast<size_t>(num_ex));
    for (int64_t e = 0; e < num_ex; ++e) kept[e] = KeptLength(e);
    std::sort(order.begin(), order.end(),
              [&](int64_t a, int64_t b) { return kept[a] != kept[b] ? kept[a] > kept[b] : a < b; });
    // Rows with free space, keyed by (free tokens, row): lower_bound({len, 0}) is the row with the
    // least free space that fits, the earliest-created among equals. Full rows leave the set.
    std::set<std::pair<int64_t, int64_t>> open_rows;
    for (const int64_t e : order) {
      const int64_t len = kept[e];
      auto it = open_rows.lower_bound({len, int64_t{0}});
      int64_t row;
      int64_t free;
      if (it == open_rows.end()) {
        row = num_rows++;
        free = t_len;
      } else {
        std::tie(free, row) = *it;
        open_rows.erase(it);
      }
      row_of[e] = row;
      if (free - len > 0) open_rows.emplace(free - len, row);
    }
  }
  row_begin_.assign(static_cast<size_t>(num_rows + 1), 0);
  for (int64_t e = 0; e < num_ex; ++e) ++row_begin_[row_of[e] + 1];
  std::partial_sum(row_begin_.begin(), row_begin_.end(), row_begin_.begin());
  row_examples_.resize(static_cast<size_t>(num_ex));
  std::vector<int64_t> fill(row_begin_.begin(), row_begin_.end() - 1);
  for (const int64_t e : order) row_examples_[fill[row_of[e]]++] = e;

  row_trained_targets_.assign(static_cast<size_t>(num_rows), 0);
  for (int64_t e = 0; e < num_ex; ++e) {
    const int64_t s = examples.starts[e];
    const int64_t len = KeptLength(e);
    int64_t n = 0;
    for (int64_t k = 1; k < len; ++k) n += examples.trained[s + k];
    row_trained_targets_[row_of[e]] += n;
  }

  global_batches_ = CeilDiv(num_rows, options.batch_size);
  batches_per_epoch_ = CeilDiv(global_batches_, options.world_size);
  if (options_.shuffle) {
    permutation_ = EpochPermutation(num_rows, options_.seed, 0);
    permutation_epoch_ = 0;
  }
}

absl::Span<const int64_t> PackedLoader::RowExamples(int64_t row) const {
  CHECK(row >= 0 && row < num_rows()) << "row " << row << " of " << num_rows();
  return absl::MakeConstSpan(row_examples_.data() + row_begin_[row],
                             static_cast<size_t>(row_begin_[row + 1] - row_begin_[row]));
}

double PackedLoader::real_token_fraction() const {
  return static_cast<double>(real_tokens_per_epoch_) /
         (static_cast<double>(num_rows()) * static_cast<double>(options_.seq_len));
}

absl::Status PackedLoader::CheckCursor(const DataCursor& cursor) const {
  if (cursor.epoch < 0 || cursor.batch_in_epoch < 0 ||
      cursor.batch_in_epoch >= batches_per_epoch_) {
    return absl::InvalidArgumentError(
        absl::StrCat("data cursor (", DataCursorString(cursor),
                     ") is out of range: epochs are >= 0 and this loader has ", batches_per_epoch_,
                     " batches per epoch (", num_examples(), " examples in ", num_rows(),
                     " rows, batch_size ", options_.batch_size, ", seq_len ", options_.seq_len,
                     ", packing ", options_.packing ? "on" : "off", ", world_size ",
                     options_.world_size, "); was it saved with other data or options?"));
  }
  return absl::OkStatus();
}

std::vector<int64_t> PackedLoader::GlobalBatchRows(int64_t epoch, int64_t global_batch) const {
  const int64_t b = options_.batch_size;
  const int64_t r = num_rows();
  std::vector<int64_t> rows(static_cast<size_t>(b), -1);
  const int64_t first = global_batch * b;
  if (first >= r) return rows;
  const int64_t count = std::min(b, r - first);
  if (!options_.shuffle) {
    std::iota(rows.begin(), rows.begin() + count, first);
    return rows;
  }
  std::vector<int64_t> scratch;
  const std::vector<int64_t>* perm = &permutation_;
  if (epoch != permutation_epoch_) {
    scratch = EpochPermutation(r, options_.seed, epoch);
    perm = &scratch;
  }
  for (int64_t i = 0; i < count; ++i) rows[i] = (*perm)[first + i];
  return rows;
}

std::vector<int64_t> PackedLoader::RowsAt(const DataCursor& cursor) const {
  const absl::Status valid = CheckCursor(cursor);
  CHECK(valid.ok()) << valid;
  return GlobalBatchRows(cursor.epoch, cursor.batch_in_epoch * options_.world_size + options_.rank);
}

int64_t PackedLoader::TrainedTargetsAllRanks(const DataCursor& cursor) const {
  const absl::Status valid = CheckCursor(cursor);
  CHECK(valid.ok()) << valid;
  const int64_t b = options_.batch_size;
  const int64_t r = num_rows();
  const int64_t first_global = cursor.batch_in_epoch * options_.world_size;
  // The ranks' batches together are the contiguous slots [first_global * B, + W * B).
  const int64_t begin = std::min(first_global * b, r);
  const int64_t end = std::min((first_global + options_.world_size) * b, r);
  int64_t total = 0;
  if (!options_.shuffle) {
    for (int64_t i = begin; i < end; ++i) total += row_trained_targets_[i];
    return total;
  }
  std::vector<int64_t> scratch;
  const std::vector<int64_t>* perm = &permutation_;
  if (cursor.epoch != permutation_epoch_) {
    scratch = EpochPermutation(r, options_.seed, cursor.epoch);
    perm = &scratch;
  }
  for (int64_t i = begin; i < end; ++i) total += row_trained_targets_[(*perm)[i]];
  return total;
}

void PackedLoader::FillRow(int64_t row, int32_t* tokens, int32_t* targets, int32_t* positions,
                           int32_t* key_start, int64_t* trained_targets,
                           int64_t* real_tokens) const {
  const int64_t t_len = options_.seq_len;
  const TokenSpan src = examples_.tokens;
  const uint8_t* trained = examples_.trained.data();
  int64_t offset = 0;
  if (row >= 0) {
    for (const int64_t e : RowExamples(row)) {
      const int64_t s = examples_.starts[e];
      const int64_t len = KeptLength(e);
      for (int64_t k = 0; k < len; ++k) {
        const int64_t p = offset + k;
        tokens[p] = static_cast<int32_t>(src[s + k]);
        const bool predicts = k + 1 < len && trained[s + k + 1] != 0;
        targets[p] = predicts ? static_cast<int32_t>(src[s + k + 1]) : kIgnoredTarget;
        *trained_targets += predicts ? 1 : 0;
        positions[p] = static_cast<int32_t>(k);
        key_start[p] = static_cast<int32_t>(offset);
      }
      offset += len;
    }
  }
  *real_tokens += offset;
  for (int64_t p = offset; p < t_len; ++p) {
    tokens[p] = 0;
    targets[p] = kIgnoredTarget;
    positions[p] = static_cast<int32_t>(p - offset);
    key_start[p] = static_cast<int32_t>(offset);
  }
}

absl::Status PackedLoader::BatchAt(const DataCursor& cursor, PackedBatch* out) const {
  RETURN_IF_ERROR(CheckCursor(cursor));
  const int64_t b = options_.batch_size;
  const int64_t t_len = options_.seq_len;
  const auto size = static_cast<size_t>(b * t_len);
  out->batch_size = b;
  out->seq_len = t_len;
  out->cursor = cursor;
  out->tokens.resize(size);
  out->targets.resize(size);
  out->positions.resize(size);
  out->key_start.resize(size);
  out->trained_targets = 0;
  out->real_tokens = 0;
  const std::vector<int64_t> rows = RowsAt(cursor);
  for (int64_t slot = 0; slot < b; ++slot) {
    const size_t at = static_cast<size_t>(slot * t_len);
    FillRow(rows[slot], out->tokens.data() + at, out->targets.data() + at,
            out->positions.data() + at, out->key_start.data() + at, &out->trained_targets,
            &out->real_tokens);
  }
  return absl::OkStatus();
}

absl::Status PackedLoader::Seek(const DataCursor& cursor) {
  RETURN_IF_ERROR(CheckCursor(cursor));
  cursor_ = cursor;
  if (options_.shuffle && permutation_epoch_ != cursor_.epoch) {
    permutation_ = EpochPermutation(num_rows(), options_.seed, cursor_.epoch);
    permutation_epoch_ = cursor_.epoch;
  }
  return absl::OkStatus();
}

absl::Status PackedLoader::Next(PackedBatch* out) {
  RETURN_IF_ERROR(BatchAt(cursor_, out));
  DataCursor next = cursor_;
  if (++next.batch_in_epoch == batches_per_epoch_) {
    next.batch_in_epoch = 0;
    ++next.epoch;
  }
  return Seek(next);
}

}  // namespace ps
