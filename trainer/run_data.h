// A training run's data: data.train / data.val, each an llm.c token file
// (trainer/data/token_file.h) cut into micro-batches by this rank's DataLoader, or an example file
// (trainer/data/example_file.h: the kind is read from the file's magic) whose examples this rank's
// PackedLoader packs into rows (data.packing) — or the built-in synthetic corpus
// (trainer/data/synthetic_corpus.h) when data.train is unset. Rank r of N reads global batches
// r, r + N, ... either way.
#ifndef PATRICKSTAR_TRAINER_RUN_DATA_H_
#define PATRICKSTAR_TRAINER_RUN_DATA_H_

#include "absl/status/status.h"
#include "trainer/internal/train_run.h"

namespace ps {
namespace trainer_internal {

// Opens or generates the data and sets data.train_loader or data.train_packed (and data.val_loader
// or data.val_packed when there is validation data), keeping what they read in
// data.train_file/data.val_file, data.train_examples/data.val_examples or
// data.synthetic_train/data.synthetic_val (and the corpus's entropies for the console).
// data.packing is ignored for token files. `data` is run.data: this file writes that part of the
// run.
// Errors: the files' (NotFound, DataLoss naming the file; a magic of neither kind, naming the
// key), InvalidArgument for tokens beyond the model's vocabulary or a synthetic corpus with a
// vocabulary under 256, the loaders' (prefixed "training data: " / "validation data: ").
// REQUIRES: ResolveModel succeeded; run.shape set (micro_batch, seq_len, rank, world).
[[nodiscard]] absl::Status LoadData(const TrainRun& run, RunData& data);

}  // namespace trainer_internal
}  // namespace ps

#endif  // PATRICKSTAR_TRAINER_RUN_DATA_H_
