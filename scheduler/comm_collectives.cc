#include "scheduler/comm_collectives.h"

#include <cstring>
#include <memory>
#include <vector>

#include "absl/strings/str_cat.h"
#include "base/status_macros.h"

namespace ps {

absl::Status CommCollectives::CheckPayloads(absl::Span<void* const> payloads,
                                            int64_t count_elems) const {
  if (static_cast<int64_t>(payloads.size()) != comm_->world_size()) {
    return absl::InvalidArgumentError(absl::StrCat("ZeRO collective: ", payloads.size(),
                                                   " payloads for a world of ", comm_->world_size(),
                                                   " ranks"));
  }
  if (count_elems < 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("ZeRO collective: negative element count ", count_elems));
  }
  return absl::OkStatus();
}

absl::Status CommCollectives::AllGatherGroup(int64_t group, absl::Span<void* const> payloads,
                                             int64_t count_elems, DType dtype) {
  RETURN_IF_ERROR(CheckPayloads(payloads, count_elems));
  std::vector<std::unique_ptr<CommRequest>> requests;
  absl::Status issued = absl::OkStatus();
  for (int owner = 0; owner < comm_->world_size(); ++owner) {
    void* payload = payloads[static_cast<size_t>(owner)];
    if (payload == nullptr) continue;  // padding: no rank takes part
    absl::StatusOr<std::unique_ptr<CommRequest>> request =
        comm_->BroadcastAsync(payload, payload, count_elems, ToCommDType(dtype), owner);
    if (!request.ok()) {
      issued = request.status();
      break;
    }
    requests.push_back(*std::move(request));
  }
  // Wait for what was issued even after a failure: the buffers must outlive the requests.
  absl::Status waited = absl::OkStatus();
  for (auto& request : requests) waited.Update(request->Wait(timeout_));
  RETURN_IF_ERROR(issued);
  if (!waited.ok()) {
    return absl::Status(waited.code(),
                        absl::StrCat("all-gather of chunk group ", group, ": ", waited.message()));
  }
  return absl::OkStatus();
}

absl::Status CommCollectives::ReduceScatterGroup(int64_t group, absl::Span<void* const> payloads,
                                                 int64_t count_elems, DType dtype) {
  RETURN_IF_ERROR(CheckPayloads(payloads, count_elems));
  const int world = comm_->world_size();
  const int64_t bytes = count_elems * SizeOf(dtype);
  staging_.resize(static_cast<size_t>(bytes * world));
  for (int r = 0; r < world; ++r) {
    uint8_t* slot = staging_.data() + r * bytes;
    if (payloads[static_cast<size_t>(r)] == nullptr) {
      std::memset(slot, 0, static_cast<size_t>(bytes));
    } else {
      std::memcpy(slot, payloads[static_cast<size_t>(r)], static_cast<size_t>(bytes));
    }
  }
  // This rank's own chunk may be padding (no payload): it then receives into its staging slot.
  void* recv = payloads[static_cast<size_t>(comm_->rank())];
  if (recv == nullptr) recv = staging_.data() + comm_->rank() * bytes;
  ASSIGN_OR_RETURN(std::unique_ptr<CommRequest> request,
                   comm_->ReduceScatterAsync(staging_.data(), recv, count_elems, ToCommDType(dtype),
                                             ReduceOp::kAvg));
  absl::Status waited = request->Wait(timeout_);
  if (!waited.ok()) {
    return absl::Status(waited.code(), absl::StrCat("reduce-scatter of chunk group ", group, ": ",
                                                    waited.message()));
  }
  return absl::OkStatus();
}

absl::Status CommCollectives::GatherBytes(const void* in, int64_t bytes,
                                          std::vector<uint8_t>& out) {
  out.assign(static_cast<size_t>(bytes * comm_->world_size()), 0);
  ASSIGN_OR_RETURN(std::unique_ptr<CommRequest> request,
                   comm_->AllGatherAsync(in, out.data(), bytes, CommDType::kU8));
  return request->Wait(timeout_);
}

absl::Status CommCollectives::ReduceGradStats(double& sum_squares, int64_t& nonfinite_elems) {
  struct Stats {
    double sum_squares;
    int64_t nonfinite_elems;
  };
  const Stats mine{sum_squares, nonfinite_elems};
  std::vector<uint8_t> all;
  absl::Status s = GatherBytes(&mine, sizeof(Stats), all);
  if (!s.ok()) {
    return absl::Status(s.code(), absl::StrCat("all-reduce of the gradient statistics (norm and "
                                               "overflow flags): ",
                                               s.message()));
  }
  Stats total{0.0, 0};
  for (int r = 0; r < comm_->world_size(); ++r) {
    Stats x;
    std::memcpy(&x, all.data() + r * sizeof(Stats), sizeof(Stats));
    total.sum_squares += x.sum_squares;
    total.nonfinite_elems += x.nonfinite_elems;
  }
  sum_squares = total.sum_squares;
  nonfinite_elems = total.nonfinite_elems;
  return absl::OkStatus();
}

absl::StatusOr<double> CommCollectives::AllReduceMean(double value) {
  std::vector<uint8_t> all;
  RETURN_IF_ERROR(GatherBytes(&value, sizeof(double), all));
  double sum = 0;
  for (int r = 0; r < comm_->world_size(); ++r) {
    double x;
    std::memcpy(&x, all.data() + r * sizeof(double), sizeof(double));
    sum += x;
  }
  return sum / comm_->world_size();
}

absl::StatusOr<std::vector<int64_t>> CommCollectives::AllGatherInt64(int64_t value) {
  std::vector<uint8_t> all;
  RETURN_IF_ERROR(GatherBytes(&value, sizeof(int64_t), all));
  std::vector<int64_t> out(static_cast<size_t>(comm_->world_size()));
  std::memcpy(out.data(), all.data(), out.size() * sizeof(int64_t));
  return out;
}

}  // namespace ps
