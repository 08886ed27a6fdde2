#include "trainer/evaluation.h"

#include <algorithm>
#include <cstdint>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/str_cat.h"
#include "absl/types/span.h"
#include "base/status_macros.h"
#include "trainer/data/data_loader.h"

namespace ps {
namespace trainer_internal {

namespace {

// Example files: every row of the validation data (all of this rank's batches of epoch 0), the
// loss summed over the trained targets of all ranks and divided by their count.
absl::StatusOr<double> EvaluatePacked(const TrainRun& run, BatchBuffers& batch) {
  const PackedLoader& loader = *run.data.val_packed;
  batch.packed.resize(std::max<size_t>(batch.packed.size(), 1));
  PackedBatch& b = batch.packed.front();
  double loss_sum = 0;
  int64_t targets = 0;
  for (int64_t i = 0; i < loader.batches_per_epoch(); ++i) {
    DataCursor cursor;
    cursor.epoch = 0;
    cursor.batch_in_epoch = i;
    RETURN_IF_ERROR(loader.BatchAt(cursor, &b));
    targets += loader.TrainedTargetsAllRanks(cursor);
    // Every rank runs every forward, even of a batch without trained targets (loss 0): under ZeRO
    // the forwards gather parameters collectively.
    ASSIGN_OR_RETURN(const double loss, run.runtime.model->Evaluate(ModelInputs{
                                            .tokens = b.tokens,
                                            .targets = b.targets,
                                            .positions = b.positions,
                                            .key_start = b.key_start}));
    loss_sum += loss * static_cast<double>(b.trained_targets);
  }
  if (targets == 0) {
    return absl::InvalidArgumentError(absl::StrCat(
        "validation data '", run.config.data.val_path,
        "' has no trained target (every label is masked, at seq_len ", run.shape.seq_len,
        "): there is no validation loss; give other validation data or data.eval_every 0"));
  }
  ASSIGN_OR_RETURN(const double mean, run.MeanOverRanks(loss_sum));
  return mean * static_cast<double>(run.shape.world) / static_cast<double>(targets);
}

}  // namespace

absl::StatusOr<double> EvaluateValidation(const TrainRun& run, BatchBuffers& batch) {
  if (run.data.val_packed.has_value()) return EvaluatePacked(run, batch);
  const int64_t batches =
      std::min(run.config.data.eval_batches, run.data.val_loader->batches_per_epoch());
  double sum = 0;
  for (int64_t b = 0; b < batches; ++b) {
    DataCursor cursor;
    cursor.epoch = 0;
    cursor.batch_in_epoch = b;
    RETURN_IF_ERROR(run.data.val_loader->BatchAt(cursor, absl::MakeSpan(batch.tokens),
                                                 absl::MakeSpan(batch.targets)));
    ASSIGN_OR_RETURN(const double loss, run.runtime.model->Evaluate(batch.tokens, batch.targets));
    sum += loss;
  }
  return run.MeanOverRanks(sum / static_cast<double>(std::max<int64_t>(batches, 1)));
}

}  // namespace trainer_internal
}  // namespace ps
