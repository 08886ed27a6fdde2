// Trainer: the façade of trainer/trainer.h over a TrainRun (trainer/internal/train_run.h). Create
// wires the run (trainer/run_wiring.h), Run trains it (trainer/training_loop.h), SummaryText
// prints its summary (trainer/console.h); the files named in train_run.h hold the rest.
#include "trainer/trainer.h"

#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "base/status_macros.h"
#include "glog/logging.h"
#include "trainer/config.h"
#include "trainer/console.h"
#include "trainer/internal/train_run.h"
#include "trainer/run_wiring.h"
#include "trainer/training_loop.h"

namespace ps {

class Trainer::Impl {
 public:
  Impl(const TrainConfig& config, TrainerEnvironment env) : run(config, std::move(env)) {}
  ~Impl() {
    if (!run.closed) {
      if (absl::Status s = run.CloseOutputs(); !s.ok()) LOG(WARNING) << s;
    }
  }

  trainer_internal::TrainRun run;
};

Trainer::Trainer(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}
Trainer::~Trainer() = default;

absl::StatusOr<std::unique_ptr<Trainer>> Trainer::Create(const TrainConfig& config,
                                                         TrainerEnvironment env) {
  auto impl = std::make_unique<Impl>(config, std::move(env));
  RETURN_IF_ERROR(trainer_internal::WireRun(impl->run));
  return std::unique_ptr<Trainer>(new Trainer(std::move(impl)));
}

absl::Status Trainer::Run() { return trainer_internal::RunTraining(impl_->run); }
const TrainSummary& Trainer::summary() const { return impl_->run.progress.summary; }
const std::vector<StepMetrics>& Trainer::history() const { return impl_->run.progress.history; }
const GptModel& Trainer::model() const { return *impl_->run.runtime.model; }
std::string Trainer::SummaryText() const { return trainer_internal::SummaryText(impl_->run); }

}  // namespace ps
