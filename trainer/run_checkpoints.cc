#include "trainer/run_checkpoints.h"

#include <algorithm>
#include <cstdint>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/str_cat.h"
#include "base/status_macros.h"
#include "trainer/checkpoint.h"
#include "trainer/config_json.h"
#include "trainer/data/data_loader.h"
#include "trainer/io/checkpoint_dir.h"

namespace ps {
namespace trainer_internal {

absl::Status Resume(TrainRun& run) {
  const std::string root = RankCheckpointRoot(run.config.checkpoint.dir, run.shape.rank);
  absl::StatusOr<std::string> latest = LatestTrainingCheckpoint(root);
  std::string dir;
  if (run.runtime.collectives == nullptr) {
    ASSIGN_OR_RETURN(dir, std::move(latest));
  } else {
    // Agree on the newest step every rank has (-1: none, -2: unreadable), so that either every
    // rank resumes from the same step or every rank fails.
    int64_t step = -1;
    if (latest.ok()) {
      ASSIGN_OR_RETURN(std::vector<CheckpointRef> refs, ListCheckpoints(root));
      step = refs.empty() ? -1 : refs.back().step;
    } else if (!absl::IsNotFound(latest.status())) {
      step = -2;
    }
    ASSIGN_OR_RETURN(std::vector<int64_t> steps, run.runtime.collectives->AllGatherInt64(step));
    for (int r = 0; r < run.shape.world; ++r) {
      if (steps[r] < 0) {
        if (r == run.shape.rank && !latest.ok()) return latest.status();
        return absl::FailedPreconditionError(absl::StrCat(
            "cannot resume: rank ", r, " of ", run.shape.world,
            " has no readable checkpoint under '", RankCheckpointRoot(run.config.checkpoint.dir, r),
            "' (checkpoints of a ZeRO run are per rank; resume with the world size that wrote "
            "them)"));
      }
    }
    const int64_t common = *std::min_element(steps.begin(), steps.end());
    ASSIGN_OR_RETURN(dir, TrainingCheckpointAtStep(root, common));
  }
  ASSIGN_OR_RETURN(TrainingCheckpointState state,
                   ReadTrainingCheckpoint(dir, run.Identity(), run.runtime.model.get()));
  run.runtime.adam->set_step(state.adam_step);
  run.runtime.adam->set_consecutive_skipped_steps(state.consecutive_skipped_steps);
  // The state's values were read from the checkpoint's manifest: an error names it.
  const auto in_manifest = [&dir](absl::Status s) {
    if (s.ok()) return s;
    return absl::Status(s.code(),
                        absl::StrCat("checkpoint ", dir, "/manifest.json: ", s.message()));
  };
  RETURN_IF_ERROR(in_manifest(run.runtime.adam->loss_scaler().Restore(state.loss_scaler)));
  RETURN_IF_ERROR(in_manifest(run.data.SeekTrain(state.data_cursor)));
  run.progress.step = state.step;
  run.progress.last_loss = state.last_loss;
  if (run.out() != nullptr) {
    *run.out() << "resumed from " << dir << " at step " << run.progress.step << " (data "
               << DataCursorString(state.data_cursor) << ")"
               << (run.shape.world > 1 ? absl::StrCat(", with every rank's checkpoint of that step")
                                       : "")
               << "\n";
  }
  return absl::OkStatus();
}

absl::Status SaveCheckpoint(const TrainRun& run, RunProgress& progress) {
  const int64_t t0 = run.NowNs();
  const int64_t trace_t0 = run.runtime.trace != nullptr ? run.runtime.trace->NowNs() : 0;
  TrainingCheckpointState state;
  state.step = progress.step;
  state.adam_step = run.runtime.adam->step();
  state.loss_scaler = run.runtime.adam->loss_scaler().state();
  state.data_cursor = run.data.train_cursor();
  state.last_loss = progress.last_loss;
  state.consecutive_skipped_steps = run.runtime.adam->consecutive_skipped_steps();
  state.identity = run.Identity();
  state.config_json = TrainConfigToJson(run.config);
  ASSIGN_OR_RETURN(
      const std::string dir,
      WriteTrainingCheckpoint(RankCheckpointRoot(run.config.checkpoint.dir, run.shape.rank),
                              run.config.checkpoint.keep_last, state, *run.runtime.model));
  progress.summary.checkpoints_written.push_back(dir);
  progress.summary.checkpoint_s += Seconds(t0, run.NowNs());
  if (run.runtime.trace != nullptr) {
    run.runtime.trace->Complete(run.runtime.steps_track, "checkpoint", "checkpoint", trace_t0,
                                run.runtime.trace->NowNs() - trace_t0,
                                {{"step", progress.step}, {"dir", dir}});
  }
  if (run.out() != nullptr) *run.out() << "checkpoint: " << dir << "\n";
  return absl::OkStatus();
}

}  // namespace trainer_internal
}  // namespace ps
