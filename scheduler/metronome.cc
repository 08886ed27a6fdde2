#include "scheduler/metronome.h"

#include "glog/logging.h"

namespace ps {

absl::string_view StageName(Stage stage) {
  switch (stage) {
    case Stage::kForward:
      return "FWD";
    case Stage::kBackward:
      return "BWD";
    case Stage::kAdam:
      return "ADAM";
  }
  return "UNKNOWN";
}

std::ostream& operator<<(std::ostream& os, Stage stage) { return os << StageName(stage); }

int64_t Metronome::Tick(Stage stage) {
  ++moment_;
  stage_ = stage;
  if (is_warmup()) warmup_stages_.push_back(stage);
  return moment_;
}

int64_t Metronome::EndIteration() {
  const int64_t moments = moment_ + 1;
  if (is_warmup()) total_moments_ = moments;
  ++iteration_;
  moment_ = -1;
  return moments;
}

int64_t Metronome::NextMoment(int64_t moment) const {
  CHECK(!is_warmup()) << "NextMoment needs the warm-up's moment count";
  CHECK_GT(total_moments_, 0) << "the warm-up had no moments";
  return (moment + 1) % total_moments_;
}

}  // namespace ps
