#include "scheduler/comm_collectives.h"

#include <cstring>
#include <memory>
#include <vector>

#include "absl/strings/str_cat.h"
#include "base/status_macros.h"
#include "base/units.h"
#include "glog/logging.h"
#include "memory/caching_allocator.h"
#include "memory/memory_resource.h"

namespace ps {

int64_t CommCollectives::DeviceStagingBytes(int world, int64_t chunk_elems, DType dtype) {
  const int64_t reduce =
      world > 1 ? AlignUp(world * chunk_elems * SizeOf(dtype), kAllocationAlignment) : 0;
  return reduce + AlignUp(world * kScalarSlotBytes, kAllocationAlignment);
}

CommCollectives::CommCollectives(Communicator* comm, CommCollectivesOptions options)
    : comm_(comm), timeout_(options.timeout), options_(options) {}

absl::StatusOr<std::unique_ptr<CommCollectives>> CommCollectives::Create(
    Communicator* comm, CommCollectivesOptions options) {
  if (comm == nullptr) return absl::InvalidArgumentError("CommCollectives: no communicator");
  std::unique_ptr<CommCollectives> c(new CommCollectives(comm, options));
  if (comm->memory() == CommMemory::kHost) return c;
  if (options.backend == nullptr || options.accelerator == nullptr) {
    return absl::InvalidArgumentError(
        absl::StrCat("CommCollectives: the '", comm->name(),
                     "' communicator needs device memory; set CommCollectivesOptions.backend and "
                     ".accelerator to the accelerator the chunks live on"));
  }
  if (options.chunk_elems < 0) {
    return absl::InvalidArgumentError(absl::StrCat(
        "CommCollectivesOptions.chunk_elems must not be negative, got ", options.chunk_elems));
  }
  if (options.accelerator->device() != options.backend->device()) {
    return absl::InvalidArgumentError(
        absl::StrCat("CommCollectivesOptions: the accelerator memory is on ",
                     options.accelerator->device().ToString(), " but the backend drives ",
                     options.backend->device().ToString()));
  }
  const int world = comm->world_size();
  c->reduce_staging_bytes_ = world > 1 ? options.chunk_elems * SizeOf(options.dtype) * world : 0;
  c->scalar_offset_ = AlignUp(c->reduce_staging_bytes_, kAllocationAlignment);
  c->device_staging_bytes_ = DeviceStagingBytes(world, options.chunk_elems, options.dtype);
  ASSIGN_OR_RETURN(c->stream_, options.backend->CreateStream());
  absl::StatusOr<void*> staging =
      options.accelerator->scratch()->Allocate(c->device_staging_bytes_);
  if (!staging.ok()) {
    return absl::Status(
        staging.status().code(),
        absl::StrCat("CommCollectives: the ZeRO staging buffer (", c->device_staging_bytes_,
                     " bytes: ", world, " chunks of ", options.chunk_elems, " ",
                     DTypeName(options.dtype),
                     " elements and the scalar word) does not fit the accelerator: ",
                     staging.status().message()));
  }
  c->device_staging_ = *staging;
  return c;
}

CommCollectives::~CommCollectives() {
  if (device_staging_ == nullptr) return;
  absl::Status s = stream_->Synchronize();
  s.Update(options_.accelerator->scratch()->Deallocate(device_staging_, device_staging_bytes_));
  LOG_IF(ERROR, !s.ok()) << "CommCollectives: giving the device staging back failed: " << s;
}

absl::Status CommCollectives::RequireDeviceStaging() const {
  if (device_staging_ != nullptr) return absl::OkStatus();
  return absl::FailedPreconditionError(
      absl::StrCat("CommCollectives: the '", comm_->name(),
                   "' communicator needs device memory; build the collectives with "
                   "CommCollectives::Create and CommCollectivesOptions.accelerator"));
}

absl::StatusOr<uint8_t*> CommCollectives::StageOnDevice(absl::Span<void* const> payloads,
                                                        int64_t bytes) {
  if (bytes * comm_->world_size() > reduce_staging_bytes_) {
    return absl::InvalidArgumentError(
        absl::StrCat("ZeRO reduce-scatter of ", comm_->world_size(), " x ", bytes,
                     " bytes but the device staging holds ", reduce_staging_bytes_,
                     " (CommCollectivesOptions.chunk_elems and .dtype must be the chunk store's)"));
  }
  uint8_t* staging = static_cast<uint8_t*>(device_staging_);
  for (int r = 0; r < comm_->world_size(); ++r) {
    uint8_t* slot = staging + r * bytes;
    const void* payload = payloads[static_cast<size_t>(r)];
    if (payload == nullptr) {
      RETURN_IF_ERROR(stream_->MemsetAsync(slot, 0, bytes));
    } else {
      RETURN_IF_ERROR(stream_->MemcpyAsync(slot, payload, bytes, CopyKind::kDeviceToDevice));
    }
  }
  RETURN_IF_ERROR(stream_->Synchronize());
  return staging;
}

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
  uint8_t* staging = nullptr;
  if (on_device()) {
    RETURN_IF_ERROR(RequireDeviceStaging());
    ASSIGN_OR_RETURN(staging, StageOnDevice(payloads, bytes));
  } else {
    staging_.resize(static_cast<size_t>(bytes * world));
    staging = staging_.data();
    for (int r = 0; r < world; ++r) {
      uint8_t* slot = staging + r * bytes;
      if (payloads[static_cast<size_t>(r)] == nullptr) {
        std::memset(slot, 0, static_cast<size_t>(bytes));
      } else {
        std::memcpy(slot, payloads[static_cast<size_t>(r)], static_cast<size_t>(bytes));
      }
    }
  }
  // This rank's own chunk may be padding (no payload): it then receives into its staging slot.
  void* recv = payloads[static_cast<size_t>(comm_->rank())];
  if (recv == nullptr) recv = staging + comm_->rank() * bytes;
  ASSIGN_OR_RETURN(
      std::unique_ptr<CommRequest> request,
      comm_->ReduceScatterAsync(staging, recv, count_elems, ToCommDType(dtype), ReduceOp::kAvg));
  absl::Status waited = request->Wait(timeout_);
  if (!waited.ok()) {
    return absl::Status(waited.code(), absl::StrCat("reduce-scatter of chunk group ", group, ": ",
                                                    waited.message()));
  }
  return absl::OkStatus();
}

absl::Status CommCollectives::GatherBytes(const void* in, int64_t bytes,
                                          std::vector<uint8_t>& out) {
  const int world = comm_->world_size();
  out.assign(static_cast<size_t>(bytes * world), 0);
  if (!on_device()) {
    ASSIGN_OR_RETURN(std::unique_ptr<CommRequest> request,
                     comm_->AllGatherAsync(in, out.data(), bytes, CommDType::kU8));
    return request->Wait(timeout_);
  }
  RETURN_IF_ERROR(RequireDeviceStaging());
  CHECK_LE(bytes, kScalarSlotBytes);
  // In place: this rank's value goes into its slot of the word.
  uint8_t* word = static_cast<uint8_t*>(device_staging_) + scalar_offset_;
  uint8_t* mine = word + comm_->rank() * bytes;
  RETURN_IF_ERROR(stream_->MemcpyAsync(mine, in, bytes, CopyKind::kHostToDevice));
  RETURN_IF_ERROR(stream_->Synchronize());
  ASSIGN_OR_RETURN(std::unique_ptr<CommRequest> request,
                   comm_->AllGatherAsync(mine, word, bytes, CommDType::kU8));
  RETURN_IF_ERROR(request->Wait(timeout_));
  RETURN_IF_ERROR(stream_->MemcpyAsync(out.data(), word, bytes * world, CopyKind::kDeviceToHost));
  return stream_->Synchronize();
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
