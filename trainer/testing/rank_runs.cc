#include "trainer/testing/rank_runs.h"

#include <memory>
#include <thread>
#include <utility>

#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "comm/communicator.h"
#include "comm/testing/thread_communicator.h"

namespace ps::trainer_testing {
namespace {

RankRun RunOne(const TrainConfig& config, TrainerEnvironment env) {
  RankRun result;
  absl::StatusOr<std::unique_ptr<Trainer>> trainer = Trainer::Create(config, std::move(env));
  if (!trainer.ok()) {
    result.status = trainer.status();
    return result;
  }
  result.created = true;
  result.status = (*trainer)->Run();
  result.losses = Losses(**trainer);
  result.summary = (*trainer)->summary();
  return result;
}

}  // namespace

std::vector<double> Losses(const Trainer& trainer) {
  std::vector<double> losses;
  for (const StepMetrics& m : trainer.history()) losses.push_back(m.loss);
  return losses;
}

std::vector<RankRun> RunRanks(
    const TrainConfig& config, int world,
    const std::function<void(int rank, TrainerEnvironment&)>& env_for_rank) {
  return RunRanks(std::vector<TrainConfig>(world, config), env_for_rank);
}

std::vector<RankRun> RunRanks(
    const std::vector<TrainConfig>& configs,
    const std::function<void(int rank, TrainerEnvironment&)>& env_for_rank) {
  const int world = static_cast<int>(configs.size());
  std::vector<RankRun> results(world);
  if (world == 1) {
    TrainerEnvironment env;
    if (env_for_rank) env_for_rank(0, env);
    results[0] = RunOne(configs[0], std::move(env));
    return results;
  }
  std::vector<std::unique_ptr<Communicator>> comms =
      CreateThreadCommunicators(world, absl::Seconds(120));
  std::vector<std::thread> threads;
  for (int r = 0; r < world; ++r) {
    threads.emplace_back([&, r] {
      TrainerEnvironment env;
      if (env_for_rank) env_for_rank(r, env);
      env.communicator = comms[r].get();
      env.comm_timeout = absl::Seconds(120);
      results[r] = RunOne(configs[r], std::move(env));
    });
  }
  for (std::thread& t : threads) t.join();
  return results;
}

}  // namespace ps::trainer_testing
