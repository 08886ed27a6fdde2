// PackedLoader: batches of fine-tuning examples (an ExamplesView, e.g. an ExampleFile) packed
// into rows of seq_len T tokens, with per-row positions and attention segments so that packed
// examples never see each other. docs/data_format.md describes the same rules for users.
//
// Truncation. An example longer than T keeps its first T tokens; truncated_examples() and
// dropped_tokens() count what was cut.
//
// Rows. With packing (the default) the rows are a best-fit-decreasing packing computed once at
// Create(), identical on every platform: examples in order of (truncated) length descending, ties
// by example index ascending; each goes into the existing row with the least free space that still
// fits it (ties: the row created first), or opens a new row if none fits. Rows are numbered in
// creation order and hold their examples in the order they were placed. O(E log E): the free
// capacities are an ordered set keyed by (free, row). Without packing row r is example r.
//
// Epochs. R rows, B rows per batch, G = ceil(R / B) global batches per epoch. Without shuffling
// global batch g of every epoch is rows [gB, gB + B); with shuffling epoch e permutes the rows
// (EpochPermutation: Fisher-Yates over SplitMix64 seeded from (seed, e), as DataLoader does) and
// global batch g is rows P_e[gB .. gB + B - 1]. Slots past R (in the last global batch) are empty
// rows (all padding), so an epoch trains every example exactly once and nothing is taken from the
// next epoch. Epochs follow each other.
//
// Sharding. With world_size W, rank r takes global batches r, r + W, ...; every rank has
// batches_per_epoch() = ceil(G / W) batches per epoch, and a global batch index >= G is all empty
// rows, so ranks stay in step. All ranks draw the same permutations.
//
// Row content ([B, T] int32 each, row-major), for an example at row offset o with tokens
// x_0 .. x_{L-1} (after truncation) and trained flags f_0 .. f_{L-1}:
//   tokens[o + k]    = x_k;
//   targets[o + k]   = x_{k+1} if k + 1 < L and f_{k+1} = 1, else -100 (the example's last
//                      position never predicts: nothing crosses a boundary);
//   positions[o + k] = k;
//   key_start[o + k] = o (query o + k attends to keys [o, o + k]).
// Padding after the last example (from offset q to T): token 0, target -100, positions counting
// from 0 at q, key_start q. An empty row is one padding run (q = 0).
//
// Position. A DataCursor {epoch, batch_in_epoch} (trainer/data/data_loader.h) names the next batch
// of this rank; batches are a pure function of (examples, options, cursor), so Seek() to a saved
// cursor reproduces a run that never stopped.
//
// Ownership: the loader does not own the examples; they must outlive it.
// Thread safety: thread-compatible. Const methods may be called concurrently; Next/Seek may not
// run concurrently with anything else on the same loader.
#ifndef PATRICKSTAR_TRAINER_DATA_PACKED_LOADER_H_
#define PATRICKSTAR_TRAINER_DATA_PACKED_LOADER_H_

#include <cstdint>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/types/span.h"
#include "trainer/data/data_loader.h"
#include "trainer/data/example_file.h"

namespace ps {

// The target value of a position that is not trained (Hugging Face's ignore_index).
inline constexpr int32_t kIgnoredTarget = -100;

struct PackedLoaderOptions {
  // Rows per batch (B, the micro-batch). >= 1.
  int64_t batch_size = 1;
  // Tokens per row (T). In [1, 2^31 - 1].
  int64_t seq_len = 1;
  // Every token must be < vocab_size. In [1, 2^31 - 1] (batches hold int32).
  int64_t vocab_size = 65536;
  // Best-fit-decreasing packing; false: one example per row.
  bool packing = true;
  // Permute the rows every epoch (see the file comment).
  bool shuffle = false;
  // Seed of the shuffle; ignored without shuffling.
  uint64_t seed = 0;
  // This process's rank and the number of ranks sharing the data. 0 <= rank < world_size.
  int rank = 0;
  int world_size = 1;
};

// One micro-batch, owned.
struct PackedBatch {
  int64_t batch_size = 0;  // B
  int64_t seq_len = 0;     // T
  DataCursor cursor;       // where this batch is
  std::vector<int32_t> tokens, targets, positions, key_start;  // [B * T] each, row-major
  int64_t trained_targets = 0;  // targets != -100 in this batch
  int64_t real_tokens = 0;      // non-padding positions
};

class PackedLoader {
 public:
  // A loader over `examples` (not owned; must outlive the loader), positioned at {0, 0}.
  // Errors: InvalidArgument for bad options (naming the field), zero examples, a token >=
  // vocab_size (naming the example and the position in it), or a view that breaks an invariant
  // (ValidateExamples).
  [[nodiscard]] static absl::StatusOr<PackedLoader> Create(ExamplesView examples,
                                                           const PackedLoaderOptions& options);

  const PackedLoaderOptions& options() const { return options_; }
  int64_t num_examples() const { return examples_.num_examples(); }
  // R.
  int64_t num_rows() const { return static_cast<int64_t>(row_trained_targets_.size()); }
  // The examples of row `row`, in row order. REQUIRES: 0 <= row < num_rows().
  absl::Span<const int64_t> RowExamples(int64_t row) const;
  // G = ceil(R / B).
  int64_t global_batches_per_epoch() const { return global_batches_; }
  // ceil(G / W): this rank's batches per epoch. >= 1.
  int64_t batches_per_epoch() const { return batches_per_epoch_; }
  // Examples longer than T, and the tokens cut from them.
  int64_t truncated_examples() const { return truncated_examples_; }
  int64_t dropped_tokens() const { return dropped_tokens_; }
  // Real (non-padding) tokens over R * T: the rows' fill, over one epoch (the empty rows that
  // complete the last global batches are not counted).
  double real_token_fraction() const;

  // The position of the batch the next call to Next() returns.
  DataCursor cursor() const { return cursor_; }
  // Moves to `cursor`. Errors: InvalidArgument if epoch < 0 or batch_in_epoch is not in
  // [0, batches_per_epoch()) (the loader does not move).
  [[nodiscard]] absl::Status Seek(const DataCursor& cursor);
  // Fills `out` with the batch at cursor() and advances the cursor (to the next epoch after the
  // last batch). Cannot fail at a valid cursor (the status is for symmetry with BatchAt).
  [[nodiscard]] absl::Status Next(PackedBatch* out);
  // The batch at `cursor` without moving. Errors: as Seek().
  [[nodiscard]] absl::Status BatchAt(const DataCursor& cursor, PackedBatch* out) const;

  // The rows of this rank's batch at `cursor`, in slot order; -1 for an empty row.
  // REQUIRES: `cursor` is valid (see Seek).
  std::vector<int64_t> RowsAt(const DataCursor& cursor) const;
  // The sum over all ranks of trained_targets of the batches they get at `cursor` (every rank can
  // compute it locally). REQUIRES: `cursor` is valid (see Seek).
  int64_t TrainedTargetsAllRanks(const DataCursor& cursor) const;

 private:
  PackedLoader(ExamplesView examples, const PackedLoaderOptions& options);

  absl::Status CheckCursor(const DataCursor& cursor) const;
  // The rows of global batch `global_batch` of `epoch` (-1: empty), B of them.
  std::vector<int64_t> GlobalBatchRows(int64_t epoch, int64_t global_batch) const;
  // Kept length of example e: min(length, T).
  int64_t KeptLength(int64_t e) const;
  void FillRow(int64_t row, int32_t* tokens, int32_t* targets, int32_t* positions,
               int32_t* key_start, int64_t* trained_targets, int64_t* real_tokens) const;

  ExamplesView examples_;
  PackedLoaderOptions options_;
  // Row r holds examples row_examples_[row_begin_[r] .. row_begin_[r + 1]).
  std::vector<int64_t> row_begin_;
  std::vector<int64_t> row_examples_;
  std::vector<int64_t> row_trained_targets_;  // per row
  int64_t real_tokens_per_epoch_ = 0;
  int64_t truncated_examples_ = 0;
  int64_t dropped_tokens_ = 0;
  int64_t global_batches_ = 0;
  int64_t batches_per_epoch_ = 0;
  DataCursor cursor_;
  // Shuffling: the permutation of epoch permutation_epoch_ (recomputed when Next or Seek enters
  // another epoch; const methods asking for another epoch compute a temporary one).
  int64_t permutation_epoch_ = -1;
  std::vector<int64_t> permutation_;
};

}  // namespace ps

#endif  // PATRICKSTAR_TRAINER_DATA_PACKED_LOADER_H_
