#include "scheduler/testing/training_harness.h"

#include <algorithm>
#include <cstdint>
#include <cstring>
#include <string>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/time/time.h"
#include "base/clock.h"
#include "base/status_macros.h"
#include "base/units.h"
#include "chunk/operator_spec.h"
#include "memory/cpu_backend.h"
#include "memory/memory_tracker.h"

namespace ps {
namespace {

uint64_t SplitMix(uint64_t& state) {
  uint64_t z = (state += 0x9E3779B97F4A7C15ull);
  z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
  z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
  return z ^ (z >> 31);
}

// The bytes tensor `id` of `type` holds at `version`.
std::vector<uint8_t> Pattern(ChunkType type, TensorId id, uint64_t version, int64_t bytes) {
  uint64_t state = (static_cast<uint64_t>(type) << 56) ^ (static_cast<uint64_t>(id) << 24) ^
                   (version * 0x100000001B3ull);
  std::vector<uint8_t> out(bytes);
  for (int64_t i = 0; i < bytes; i += 8) {
    const uint64_t v = SplitMix(state);
    std::memcpy(out.data() + i, &v, std::min<int64_t>(8, bytes - i));
  }
  return out;
}

}  // namespace

absl::StatusOr<std::unique_ptr<TrainingHarness>> TrainingHarness::Create(
    const HarnessModel& model, const HarnessConfig& config) {
  std::unique_ptr<TrainingHarness> h(new TrainingHarness());
  h->config_ = config;
  h->chunk_bytes_ = model.chunk_elems * 4;
  ASSIGN_OR_RETURN(
      h->backend_,
      CreateCpuBackend({.capacity_bytes = config.cap_bytes,
                        .copy_bandwidth_bytes_per_s = config.copy_bandwidth_bytes_per_s,
                        .stall_streams_until_host_waits = config.stall_streams_until_host_waits}));
  ASSIGN_OR_RETURN(h->compute_, h->backend_->CreateStream());
  DeviceMemoryOptions accel_options;
  accel_options.chunk_block_bytes = h->chunk_bytes_;
  // Exact-size segments, so non-model bytes in use are close to what the device holds.
  accel_options.scratch.round_bytes = 512;
  accel_options.scratch.small_request_max_bytes = 512;
  accel_options.scratch.small_segment_bytes = 512;
  accel_options.scratch.large_segment_round_bytes = 512;
  ASSIGN_OR_RETURN(h->accel_, CreateAcceleratorMemory(h->backend_.get(), accel_options));
  DeviceMemoryOptions host_options;
  host_options.chunk_block_bytes = h->chunk_bytes_;
  host_options.pinned = false;
  ASSIGN_OR_RETURN(h->host_, CreateHostMemory(nullptr, host_options));

  std::vector<OperatorSpec> ops;
  for (size_t i = 0; i < model.op_numels.size(); ++i) {
    ops.push_back({absl::StrCat("op", i), {{absl::StrCat("op", i, ".w"), {model.op_numels[i]}}}});
    ops.back().trainable = std::find(model.frozen_ops.begin(), model.frozen_ops.end(),
                                     static_cast<OperatorId>(i)) == model.frozen_ops.end();
  }
  ASSIGN_OR_RETURN(ChunkLayout layout,
                   ChunkLayout::Build({.capacity_elems = model.chunk_elems}, ops));
  ASSIGN_OR_RETURN(h->store_,
                   ChunkStore::Create(std::move(layout), {.compute_dtype = DType::kF32}));
  ChunkManagerOptions options = config.options;
  options.compute_stream = config.give_compute_stream ? h->compute_.get() : nullptr;
  ASSIGN_OR_RETURN(h->manager_, ChunkManager::Create(h->store_.get(), h->backend_.get(),
                                                     h->accel_.get(), h->host_.get(), options));
  h->version_.assign(kNumChunkTypes,
                     std::vector<uint64_t>(h->store_->layout().num_tensor_ids(), 0));
  return h;
}

TrainingHarness::~TrainingHarness() {
  absl::Status synced = compute_->Synchronize();
  (void)synced;
  for (auto& [op, kept] : kept_) {
    absl::Status s = accel_->scratch()->Deallocate(kept.first, kept.second);
    (void)s;
  }
  manager_.reset();
  store_.reset();  // chunk payloads go back to the pools before the pools go
}

absl::StatusOr<void*> TrainingHarness::AllocateScratch(int64_t bytes) {
  absl::StatusOr<void*> p = accel_->scratch()->Allocate(bytes);
  if (!p.ok()) {
    return absl::Status(
        p.status().code(),
        absl::StrCat("the model could not allocate ", FormatBytes(bytes),
                     " of non-model data beside ", FormatBytes(manager_->resident_bytes()),
                     " of resident chunks: ", p.status().message()));
  }
  return p;
}

absl::Status TrainingHarness::FreeScratch(void* ptr, int64_t bytes) {
  return accel_->scratch()->Deallocate(ptr, bytes);
}

absl::Status TrainingHarness::VerifyTensor(ChunkType type, TensorId id) {
  ASSIGN_OR_RETURN(TensorView view, store_->View(type, id));
  if (!config_.verify) return absl::OkStatus();
  std::vector<uint8_t> actual(view.bytes());
  if (view.device.is_host()) {
    std::memcpy(actual.data(), view.data, actual.size());
  } else {
    RETURN_IF_ERROR(
        compute_->MemcpyAsync(actual.data(), view.data, view.bytes(), CopyKind::kDeviceToHost));
    RETURN_IF_ERROR(compute_->Synchronize());
  }
  const uint64_t version = version_[static_cast<int>(type)][id];
  if (actual != Pattern(type, id, version, view.bytes())) {
    return absl::DataLossError(absl::StrCat("tensor ", store_->layout().tensor(id).name, " of ",
                                            ChunkTypeName(type), " on ", view.device.ToString(),
                                            " does not hold version ", version));
  }
  ++verified_tensors_;
  return absl::OkStatus();
}

std::vector<uint8_t> TrainingHarness::ExpectedBytes(ChunkType type, TensorId id) const {
  return Pattern(type, id, version_[static_cast<int>(type)][id],
                 store_->layout().tensor(id).numel * 4);
}

absl::Status TrainingHarness::WriteTensor(ChunkType type, TensorId id) {
  ASSIGN_OR_RETURN(TensorView view, store_->View(type, id));
  if (!config_.verify) return absl::OkStatus();
  const uint64_t version = ++version_[static_cast<int>(type)][id];
  const std::vector<uint8_t> bytes = Pattern(type, id, version, view.bytes());
  if (view.device.is_host()) {
    std::memcpy(view.data, bytes.data(), bytes.size());
    return absl::OkStatus();
  }
  RETURN_IF_ERROR(
      compute_->MemcpyAsync(view.data, bytes.data(), view.bytes(), CopyKind::kHostToDevice));
  return compute_->Synchronize();
}

absl::Status TrainingHarness::Initialize() {
  const int64_t n = store_->layout().num_data_chunks();
  for (int64_t i = 0; i < n; ++i) {
    std::vector<ChunkType> types;
    for (ChunkType type : kAllChunkTypes) {
      if (store_->layout().HoldsPayload(type, i, store_->rank())) types.push_back(type);
    }
    RETURN_IF_ERROR(manager_->AccessChunks(i, types, Device::Host(), AccessMode::kReadWrite));
    for (ChunkType type : types) {
      for (TensorId id : store_->layout().TensorsInChunk(i)) RETURN_IF_ERROR(WriteTensor(type, id));
    }
    RETURN_IF_ERROR(manager_->ReleaseChunks(i, types));
  }
  return absl::OkStatus();
}

absl::Status TrainingHarness::CheckInvariants(const char* where) {
  const ChunkManager& m = *manager_;
  peak_resident_bytes_ = std::max(peak_resident_bytes_, m.resident_bytes());
  if (m.resident_bytes() > m.current_limit_bytes()) {
    return absl::InternalError(absl::StrCat(where, ": ", m.resident_bytes(),
                                            " resident bytes above the limit ",
                                            m.current_limit_bytes()));
  }
  const int64_t moment = m.metronome().moment();
  if (!m.is_warmup() && m.in_iteration() && moment >= 0 && moment < m.tide().total_moments()) {
    // The limit is the chunkable memory, or a larger working set (which fits its own moment).
    const int64_t chunkable = m.ChunkableBytes(moment);
    if (m.current_limit_bytes() > chunkable &&
        m.current_limit_bytes() > m.budget_bytes() -
                                      m.tide().sample(moment).accelerator_peak_bytes -
                                      m.reserved_bytes()) {
      return absl::InternalError(absl::StrCat(where, ": limit ", m.current_limit_bytes(),
                                              " above the chunkable memory ", chunkable,
                                              " at moment ", moment));
    }
  }
  const int64_t model_bytes = accel_->tracker()->current_bytes(MemoryKind::kModelData);
  if (model_bytes != m.resident_bytes()) {
    return absl::InternalError(absl::StrCat(where, ": the accelerator holds ", model_bytes,
                                            " bytes of chunks, the manager counts ",
                                            m.resident_bytes()));
  }
  if (backend_->allocated_bytes() > config_.cap_bytes) {
    return absl::InternalError(absl::StrCat(where, ": the backend holds ",
                                            backend_->allocated_bytes(), " bytes, cap ",
                                            config_.cap_bytes));
  }
  return absl::OkStatus();
}

absl::Status TrainingHarness::RunStep(const HarnessStep& step) {
  RETURN_IF_ERROR(manager_->Access(step.op, step.stage));
  RETURN_IF_ERROR(CheckInvariants("after Access"));
  const OperatorInfo& info = store_->layout().op(step.op);
  for (TensorId id : info.tensors) RETURN_IF_ERROR(VerifyTensor(ChunkType::kParam, id));
  if (step.keep_bytes > 0) {
    ASSIGN_OR_RETURN(void* p, AllocateScratch(step.keep_bytes));
    kept_[step.op] = {p, step.keep_bytes};
  }
  if (step.temp_bytes > 0) {
    ASSIGN_OR_RETURN(void* p, AllocateScratch(step.temp_bytes));
    if (config_.compute > absl::ZeroDuration()) absl::SleepFor(config_.compute);
    RETURN_IF_ERROR(FreeScratch(p, step.temp_bytes));
  } else if (config_.compute > absl::ZeroDuration()) {
    absl::SleepFor(config_.compute);
  }
  if (step.write) {
    for (TensorId id : info.tensors) RETURN_IF_ERROR(WriteTensor(ChunkType::kParam, id));
  }
  if (step.free_kept_of >= 0) {
    auto it = kept_.find(step.free_kept_of);
    if (it != kept_.end()) {
      RETURN_IF_ERROR(FreeScratch(it->second.first, it->second.second));
      kept_.erase(it);
    }
  }
  RETURN_IF_ERROR(manager_->Release(step.op, step.stage));
  return CheckInvariants("after Release");
}

absl::Status TrainingHarness::RunAdam(bool on_accelerator) {
  ASSIGN_OR_RETURN(AdamPlacement placement, manager_->BeginAdam());
  const int64_t n = store_->layout().num_data_chunks();
  for (int64_t i = 0; i < n; ++i) {
    if (!store_->layout().chunk_trainable(i)) continue;  // the optimizer never sees frozen chunks
    const Device device =
        on_accelerator && placement.OnAccelerator(i) ? accel_->device() : Device::Host();
    RETURN_IF_ERROR(manager_->AccessChunks(i, kAllChunkTypes, device, AccessMode::kReadWrite));
    RETURN_IF_ERROR(CheckInvariants("after AccessChunks"));
    for (ChunkType type : kAllChunkTypes) {
      if (store_->chunk(type, i).device() != device) {
        return absl::InternalError(absl::StrCat("chunk ", ChunkId{type, i}.ToString(), " is on ",
                                                store_->chunk(type, i).device().ToString(),
                                                ", not on ", device.ToString()));
      }
      for (TensorId id : store_->layout().TensorsInChunk(i)) {
        RETURN_IF_ERROR(VerifyTensor(type, id));
        RETURN_IF_ERROR(WriteTensor(type, id));
      }
    }
    RETURN_IF_ERROR(manager_->ReleaseChunks(i, kAllChunkTypes));
  }
  return absl::OkStatus();
}

absl::Status TrainingHarness::RunIteration(const HarnessProgram& program) {
  const MonotonicClock clock = manager_->clock();
  const int64_t start_ns = clock.now_ns();
  RETURN_IF_ERROR(manager_->BeginIteration());
  for (size_t s = 0; s < program.steps.size(); ++s) {
    absl::Status status = RunStep(program.steps[s]);
    if (!status.ok()) {
      return absl::Status(
          status.code(), absl::StrCat("iteration ", manager_->metronome().iteration(), ", step ", s,
                                      ": ", status.message()));
    }
  }
  if (program.adam) RETURN_IF_ERROR(RunAdam(program.adam_on_accelerator));
  RETURN_IF_ERROR(manager_->EndIteration());
  iteration_times_.push_back(absl::Nanoseconds(clock.now_ns() - start_ns));
  return absl::OkStatus();
}

}  // namespace ps
