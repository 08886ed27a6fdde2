// Running the Trainer in-process on a world of thread ranks (comm/testing/thread_communicator.h),
// for the trainer's end-to-end tests that compare runs: what each rank reported. Test-only.
#ifndef PATRICKSTAR_TRAINER_TESTING_RANK_RUNS_H_
#define PATRICKSTAR_TRAINER_TESTING_RANK_RUNS_H_

#include <functional>
#include <vector>

#include "absl/status/status.h"
#include "trainer/config.h"
#include "trainer/trainer.h"

namespace ps::trainer_testing {

// What one rank's Trainer reported: the first error of Create or Run (OK when both succeeded),
// the per-step losses it recorded (also those of the steps before an error) and its summary.
struct RankRun {
  absl::Status status;
  bool created = false;  // Create succeeded (so `status` is Run's)
  std::vector<double> losses;
  TrainSummary summary;
};

// Creates and runs a Trainer for `config` on each of `world` ranks (>= 1): one rank runs on the
// calling thread with no communicator (a world of one), more run on threads over thread
// communicators (collective timeout 120 s). `env_for_rank`, if set, fills rank r's environment
// before the communicator is set; it is called on the rank's thread. Each Trainer is destroyed
// before its rank returns.
std::vector<RankRun> RunRanks(
    const TrainConfig& config, int world,
    const std::function<void(int rank, TrainerEnvironment&)>& env_for_rank = nullptr);

// The same with rank r running configs[r] (world = configs.size() >= 1): e.g. a directory per
// rank.
std::vector<RankRun> RunRanks(
    const std::vector<TrainConfig>& configs,
    const std::function<void(int rank, TrainerEnvironment&)>& env_for_rank = nullptr);

// The losses of every step of `run`, as the Trainer's history has them.
std::vector<double> Losses(const Trainer& trainer);

}  // namespace ps::trainer_testing

#endif  // PATRICKSTAR_TRAINER_TESTING_RANK_RUNS_H_
