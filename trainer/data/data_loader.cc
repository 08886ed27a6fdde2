#include "trainer/data/data_loader.h"

#include <algorithm>
#include <cstdint>
#include <limits>
#include <numeric>
#include <utility>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "base/status_macros.h"
#include "glog/logging.h"
#include "trainer/data/internal/epoch_permutation.h"
#include "trainer/data/internal/loader_checks.h"

namespace ps {
namespace {

// Inputs and targets of one window of t_len + 1 tokens. Tokens are < vocab_size <= INT32_MAX.
template <typename T>
void CopyWindow(const T* src, int64_t t_len, int32_t* in, int32_t* out) {
  for (int64_t t = 0; t < t_len; ++t) {
    in[t] = static_cast<int32_t>(src[t]);
    out[t] = static_cast<int32_t>(src[t + 1]);
  }
}

}  // namespace

std::string DataCursorString(const DataCursor& cursor) {
  return absl::StrCat("epoch ", cursor.epoch, ", batch ", cursor.batch_in_epoch);
}

absl::StatusOr<DataLoader> DataLoader::Create(TokenSpan tokens, const DataLoaderOptions& options) {
  const DataLoaderOptions& o = options;
  RETURN_IF_ERROR(
      data_internal::CheckLoaderShape("DataLoaderOptions", {.batch_size = o.batch_size,
                                                            .seq_len = o.seq_len,
                                                            .vocab_size = o.vocab_size,
                                                            .rank = o.rank,
                                                            .world_size = o.world_size}));

  const auto n = static_cast<int64_t>(tokens.size());
  const int64_t num_windows = n >= 1 ? (n - 1) / o.seq_len : 0;
  const int64_t per_rank = num_windows / o.batch_size / o.world_size;
  if (per_rank < 1) {
    const int64_t need = o.batch_size * o.seq_len * o.world_size + 1;
    return absl::InvalidArgumentError(
        absl::StrCat("the token stream is too short for one batch: it has ", n, " tokens (",
                     num_windows, " windows of seq_len + 1 = ", o.seq_len + 1, " tokens at stride ",
                     o.seq_len, "), but batch_size ", o.batch_size, " x world_size ", o.world_size,
                     " = ", o.batch_size * o.world_size, " windows need at least ", need,
                     " tokens; use more data or a smaller batch_size, seq_len or world_size"));
  }
  const int64_t i = data_internal::FirstTokenAtLeast(tokens, o.vocab_size);
  if (i < n) {
    return absl::InvalidArgumentError(absl::StrCat(
        "token ", tokens[i], " at position ", i, " of ", n, " is out of range for vocab_size ",
        o.vocab_size, "; the data was tokenized for a larger vocabulary"));
  }
  return DataLoader(tokens, options, num_windows);
}

DataLoader::DataLoader(TokenSpan tokens, const DataLoaderOptions& options, int64_t num_windows)
    : tokens_(tokens),
      options_(options),
      num_windows_(num_windows),
      batches_per_epoch_(num_windows / options.batch_size / options.world_size) {
  if (options_.shuffle) {
    permutation_ = MakePermutation(0);
    permutation_epoch_ = 0;
  }
}

absl::Status DataLoader::CheckCursor(const DataCursor& cursor) const {
  if (cursor.epoch < 0 || cursor.batch_in_epoch < 0 ||
      cursor.batch_in_epoch >= batches_per_epoch_) {
    return absl::InvalidArgumentError(absl::StrCat(
        "data cursor (", DataCursorString(cursor),
        ") is out of range: epochs are >= 0 and this "
        "loader has ",
        batches_per_epoch_, " batches per epoch (", num_tokens(), " tokens, batch_size ",
        options_.batch_size, ", seq_len ", options_.seq_len, ", world_size ", options_.world_size,
        "); was it saved with other data or options?"));
  }
  return absl::OkStatus();
}

std::vector<int64_t> DataLoader::MakePermutation(int64_t epoch) const {
  return EpochPermutation(num_windows_, options_.seed, epoch);
}

const std::vector<int64_t>& DataLoader::PermutationFor(int64_t epoch,
                                                       std::vector<int64_t>* scratch) const {
  if (epoch == permutation_epoch_) return permutation_;
  *scratch = MakePermutation(epoch);
  return *scratch;
}

std::vector<int64_t> DataLoader::WindowsAt(const DataCursor& cursor) const {
  const int64_t b = options_.batch_size;
  const int64_t global_batch = cursor.batch_in_epoch * options_.world_size + options_.rank;
  std::vector<int64_t> windows(static_cast<size_t>(b));
  if (!options_.shuffle) {
    std::iota(windows.begin(), windows.end(), global_batch * b);
    return windows;
  }
  std::vector<int64_t> scratch;
  const std::vector<int64_t>& perm = PermutationFor(cursor.epoch, &scratch);
  for (int64_t row = 0; row < b; ++row) windows[row] = perm[global_batch * b + row];
  return windows;
}

void DataLoader::FillBatch(const DataCursor& cursor, absl::Span<int32_t> tokens,
                           absl::Span<int32_t> targets) const {
  const int64_t t_len = options_.seq_len;
  const std::vector<int64_t> windows = WindowsAt(cursor);
  for (size_t row = 0; row < windows.size(); ++row) {
    int32_t* in = tokens.data() + row * t_len;
    int32_t* out = targets.data() + row * t_len;
    if (tokens_.width_bytes() == 2) {
      CopyWindow(tokens_.u16().data() + windows[row] * t_len, t_len, in, out);
    } else {
      CopyWindow(tokens_.u32().data() + windows[row] * t_len, t_len, in, out);
    }
  }
}

absl::Status DataLoader::BatchAt(const DataCursor& cursor, absl::Span<int32_t> tokens,
                                 absl::Span<int32_t> targets) const {
  RETURN_IF_ERROR(CheckCursor(cursor));
  const int64_t want = tokens_per_batch();
  if (static_cast<int64_t>(tokens.size()) != want || static_cast<int64_t>(targets.size()) != want) {
    return absl::InvalidArgumentError(
        absl::StrCat("batch buffers hold ", tokens.size(), " tokens and ", targets.size(),
                     " targets; batch_size * seq_len = ", options_.batch_size, " * ",
                     options_.seq_len, " = ", want, " each are needed"));
  }
  FillBatch(cursor, tokens, targets);
  return absl::OkStatus();
}

absl::Status DataLoader::Seek(const DataCursor& cursor) {
  RETURN_IF_ERROR(CheckCursor(cursor));
  cursor_ = cursor;
  if (options_.shuffle && permutation_epoch_ != cursor_.epoch) {
    permutation_ = MakePermutation(cursor_.epoch);
    permutation_epoch_ = cursor_.epoch;
  }
  return absl::OkStatus();
}

absl::Status DataLoader::Next(absl::Span<int32_t> tokens, absl::Span<int32_t> targets) {
  RETURN_IF_ERROR(BatchAt(cursor_, tokens, targets));
  DataCursor next = cursor_;
  if (++next.batch_in_epoch == batches_per_epoch_) {
    next.batch_in_epoch = 0;
    ++next.epoch;
  }
  return Seek(next);
}

TokenBatch DataLoader::Next() {
  TokenBatch batch;
  batch.batch_size = options_.batch_size;
  batch.seq_len = options_.seq_len;
  batch.cursor = cursor_;
  batch.tokens.resize(static_cast<size_t>(tokens_per_batch()));
  batch.targets.resize(static_cast<size_t>(tokens_per_batch()));
  const absl::Status status = Next(absl::MakeSpan(batch.tokens), absl::MakeSpan(batch.targets));
  // The buffers are sized here and the cursor is always valid: failing is a bug.
  CHECK(status.ok()) << status;
  return batch;
}

}  // namespace ps
