#include "trainer/evaluation.h"

#include <algorithm>
#include <cstdint>

#include "absl/status/statusor.h"
#include "absl/types/span.h"
#include "base/status_macros.h"
#include "trainer/data/data_loader.h"

namespace ps {
namespace trainer_internal {

absl::StatusOr<double> EvaluateValidation(const TrainRun& run, BatchBuffers& batch) {
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
