// DataLoader: cuts a token stream into training batches of next-token prediction.
//
// Windows. With sequence length T, the stream of N tokens holds W = floor((N - 1) / T) windows;
// window w is the T + 1 tokens [w*T, w*T + T + 1) (consecutive windows overlap by one token). A
// batch is B windows: row b's inputs are the window's first T tokens and its targets the last T
// (the same tokens shifted by one), as [B, T] row-major int32.
//
// Order (llm.c's convention). Without shuffling, global batch g is windows gB .. gB + B - 1, i.e.
// the B*T + 1 consecutive tokens starting at token g*B*T — exactly what llm.c's DataLoader reads.
// With shuffling, each epoch e draws a permutation P_e of all W windows (Fisher-Yates over
// SplitMix64 seeded from (seed, e), identical on every platform) and global batch g is windows
// P_e[gB .. gB + B - 1]. Either way an epoch has G = floor(W / B) global batches; the W mod B
// windows left over are skipped in that epoch (without shuffling always the tail of the file; with
// shuffling, different windows each epoch). After the last batch of an epoch the next epoch starts
// from its beginning.
//
// Sharding. With world_size R, rank r takes global batches r, r + R, r + 2R, ... (llm.c's
// process_rank offset and num_processes stride). Every rank gets the same number of batches per
// epoch, floor(G / R); the last G mod R global batches are skipped so that ranks stay in step. All
// ranks draw the same permutations, so for a given (epoch, batch) the ranks' batches are disjoint
// and together are global batches [bR, bR + R).
//
// Position. A DataCursor {epoch, batch_in_epoch} names the next batch this rank will return. The
// batches are a pure function of (tokens, options, cursor): saving cursor() (and the options,
// seed included) and later Seek()-ing to it on a loader built the same way reproduces exactly the
// batches a run that never stopped would have seen, across epoch boundaries.
//
// Tokens are uint16 or uint32 (a TokenSpan: llm.c's token files of either width).
//
// Validation. Create() checks every token once against vocab_size (an O(N) scan, ~GB/s, cheaper
// than a model step by orders of magnitude), so batches never need checking later.
//
// Ownership: the loader does not own the tokens; they must outlive it (e.g. a TokenFile).
// Thread safety: thread-compatible. Const methods may be called concurrently; Next/Seek may not
// run concurrently with anything else on the same loader.
#ifndef PATRICKSTAR_TRAINER_DATA_DATA_LOADER_H_
#define PATRICKSTAR_TRAINER_DATA_DATA_LOADER_H_

#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/types/span.h"
#include "trainer/data/token_span.h"

namespace ps {

struct DataLoaderOptions {
  // Windows per batch (B, the micro-batch). >= 1.
  int64_t batch_size = 1;
  // Tokens per window of inputs (T). >= 1.
  int64_t seq_len = 1;
  // Every token must be < vocab_size. In [1, 2^31 - 1] (batches hold int32).
  int64_t vocab_size = 65536;
  // Shuffle the windows every epoch (see the file comment).
  bool shuffle = false;
  // Seed of the shuffle; ignored without shuffling.
  uint64_t seed = 0;
  // This process's rank and the number of ranks sharing the data. 0 <= rank < world_size.
  int rank = 0;
  int world_size = 1;
};

// The position of a loader: the next batch it returns is batch `batch_in_epoch` (counted in this
// rank's batches) of epoch `epoch`.
struct DataCursor {
  int64_t epoch = 0;
  int64_t batch_in_epoch = 0;

  friend bool operator==(const DataCursor&, const DataCursor&) = default;
};

std::string DataCursorString(const DataCursor& cursor);  // "epoch 2, batch 17"

// One batch, owned.
struct TokenBatch {
  int64_t batch_size = 0;        // B
  int64_t seq_len = 0;           // T
  DataCursor cursor;             // where this batch is
  std::vector<int32_t> tokens;   // [B, T] row-major
  std::vector<int32_t> targets;  // [B, T] row-major; targets[b, t] = tokens[b, t + 1] in the stream
};

class DataLoader {
 public:
  // A loader over `tokens` (not owned; must outlive the loader), positioned at {0, 0}.
  // Errors: InvalidArgument for bad options (naming the field), for a stream too short to give
  // every rank one batch (with the numbers), and for a token >= vocab_size (naming its position
  // and value).
  [[nodiscard]] static absl::StatusOr<DataLoader> Create(TokenSpan tokens,
                                                         const DataLoaderOptions& options);

  const DataLoaderOptions& options() const { return options_; }
  int64_t num_tokens() const { return static_cast<int64_t>(tokens_.size()); }
  // W: windows of T + 1 tokens in the stream.
  int64_t num_windows() const { return num_windows_; }
  // floor(W / B): global batches per epoch (all ranks together, before dropping the rank tail).
  int64_t global_batches_per_epoch() const { return num_windows_ / options_.batch_size; }
  // floor(W / B / R): this rank's batches per epoch. >= 1.
  int64_t batches_per_epoch() const { return batches_per_epoch_; }
  // Tokens of inputs per batch, B * T.
  int64_t tokens_per_batch() const { return options_.batch_size * options_.seq_len; }

  // The position of the batch the next call to Next() returns.
  DataCursor cursor() const { return cursor_; }

  // Moves to `cursor`. Errors: InvalidArgument if epoch < 0 or batch_in_epoch is not in
  // [0, batches_per_epoch()) (the loader does not move).
  [[nodiscard]] absl::Status Seek(const DataCursor& cursor);

  // Writes the batch at cursor() into `tokens` and `targets` ([B, T] row-major each) and advances
  // the cursor (to the next epoch after the last batch).
  // Errors: InvalidArgument if a span's size is not B*T (nothing is written, the cursor stays).
  [[nodiscard]] absl::Status Next(absl::Span<int32_t> tokens, absl::Span<int32_t> targets);
  // The same into a new TokenBatch.
  TokenBatch Next();

  // The batch at `cursor` without moving. Errors: as Seek() and Next().
  [[nodiscard]] absl::Status BatchAt(const DataCursor& cursor, absl::Span<int32_t> tokens,
                                     absl::Span<int32_t> targets) const;

  // The windows (indices w in [0, W); window w starts at token w*T) of the batch at `cursor`, in
  // row order. REQUIRES: `cursor` is valid (see Seek).
  std::vector<int64_t> WindowsAt(const DataCursor& cursor) const;

 private:
  DataLoader(TokenSpan tokens, const DataLoaderOptions& options, int64_t num_windows);

  absl::Status CheckCursor(const DataCursor& cursor) const;
  // Window of row `row` of global batch `global_batch` in `epoch`.
  int64_t WindowOf(int64_t epoch, int64_t global_batch, int64_t row) const;
  // The permutation of epoch `epoch` (shuffling only): the cached one or a new one in `scratch`.
  const std::vector<int64_t>& PermutationFor(int64_t epoch, std::vector<int64_t>* scratch) const;
  std::vector<int64_t> MakePermutation(int64_t epoch) const;
  void FillBatch(const DataCursor& cursor, absl::Span<int32_t> tokens,
                 absl::Span<int32_t> targets) const;

  TokenSpan tokens_;
  DataLoaderOptions options_;
  int64_t num_windows_ = 0;
  int64_t batches_per_epoch_ = 0;
  DataCursor cursor_;
  // Shuffling: the permutation of epoch permutation_epoch_ (recomputed when Next or Seek enters
  // another epoch; const methods asking for another epoch compute a temporary one).
  int64_t permutation_epoch_ = -1;
  std::vector<int64_t> permutation_;
};

}  // namespace ps

#endif  // PATRICKSTAR_TRAINER_DATA_DATA_LOADER_H_
