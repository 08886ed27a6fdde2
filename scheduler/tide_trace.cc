#include "scheduler/tide_trace.h"

#include <algorithm>

#include "absl/strings/str_cat.h"
#include "base/status_macros.h"
#include "glog/logging.h"

namespace ps {

absl::Status TideTrace::RecordMoment(int64_t moment, const TideSample& sample) {
  if (finished()) {
    return absl::FailedPreconditionError(
        absl::StrCat("TideTrace: moment ", moment, " recorded after the trace was finished"));
  }
  if (moment != num_recorded()) {
    return absl::InvalidArgumentError(absl::StrCat("TideTrace: moment ", moment,
                                                   " recorded, but the next moment to record is ",
                                                   num_recorded()));
  }
  if (sample.accelerator_peak_bytes < 0 || sample.host_peak_bytes < 0) {
    return absl::InvalidArgumentError(absl::StrCat(
        "TideTrace: negative peak at moment ", moment, " (accelerator ",
        sample.accelerator_peak_bytes, " bytes, host ", sample.host_peak_bytes, " bytes)"));
  }
  samples_.push_back(sample);
  return absl::OkStatus();
}

absl::Status TideTrace::RecordAccess(int64_t chunk_key, int64_t moment) {
  return schedule_.Record(chunk_key, moment);
}

absl::Status TideTrace::Finish(int64_t total_moments) {
  if (total_moments != num_recorded()) {
    return absl::InvalidArgumentError(absl::StrCat("TideTrace: finished with ", total_moments,
                                                   " moments but ", num_recorded(),
                                                   " were recorded"));
  }
  RETURN_IF_ERROR(schedule_.Finish(total_moments));
  chunks_at_.assign(total_moments, {});
  for (const auto& [moment, chunk] : schedule_.sequence()) chunks_at_[moment].push_back(chunk);
  return absl::OkStatus();
}

const TideSample& TideTrace::sample(int64_t moment) const {
  CHECK(moment >= 0 && moment < num_recorded())
      << "moment " << moment << " outside [0, " << num_recorded() << ")";
  return samples_[moment];
}

int64_t TideTrace::NextMoment(int64_t moment) const {
  CHECK(finished()) << "TideTrace::NextMoment before Finish";
  CHECK(moment >= 0 && moment < total_moments())
      << "moment " << moment << " outside [0, " << total_moments() << ")";
  return (moment + 1) % total_moments();
}

int64_t TideTrace::AcceleratorTideBytes(int64_t moment) const {
  return std::max(sample(moment).accelerator_peak_bytes,
                  sample(NextMoment(moment)).accelerator_peak_bytes);
}

int64_t TideTrace::ChunkableBytes(int64_t moment, int64_t budget_bytes,
                                  int64_t reserved_bytes) const {
  return std::max<int64_t>(0, budget_bytes - AcceleratorTideBytes(moment) - reserved_bytes);
}

int64_t TideTrace::MaxAcceleratorPeakBytes(Stage stage) const {
  int64_t peak = 0;
  for (const TideSample& s : samples_) {
    if (s.stage == stage) peak = std::max(peak, s.accelerator_peak_bytes);
  }
  return peak;
}

int64_t TideTrace::MaxHostPeakBytes(Stage stage) const {
  int64_t peak = 0;
  for (const TideSample& s : samples_) {
    if (s.stage == stage) peak = std::max(peak, s.host_peak_bytes);
  }
  return peak;
}

int64_t TideTrace::MaxAcceleratorPeakBytes() const {
  int64_t peak = 0;
  for (const TideSample& s : samples_) peak = std::max(peak, s.accelerator_peak_bytes);
  return peak;
}

const std::vector<int64_t>& TideTrace::ChunksAt(int64_t moment) const {
  static const std::vector<int64_t>* const kNone = new std::vector<int64_t>();
  if (moment < 0 || moment >= static_cast<int64_t>(chunks_at_.size())) return *kNone;
  return chunks_at_[moment];
}

}  // namespace ps
