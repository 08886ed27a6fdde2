#include "model/model_state_io.h"

#include <algorithm>
#include <cstdint>
#include <cstring>
#include <functional>
#include <optional>
#include <sstream>
#include <string>
#include <utility>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/strings/string_view.h"
#include "absl/synchronization/mutex.h"
#include "absl/types/span.h"
#include "base/status_macros.h"
#include "chunk/chunk_layout.h"
#include "chunk/chunk_store.h"
#include "chunk/chunk_type.h"
#include "chunk/operator_spec.h"
#include "glog/logging.h"
#include "memory/backend.h"
#include "memory/convert.h"
#include "memory/device.h"
#include "memory/device_memory.h"
#include "memory/dtype.h"
#include "memory/resources.h"
#include "model/gpt2_checkpoint.h"
#include "model/gpt_config.h"
#include "model/hf_checkpoint.h"
#include "model/lora_config.h"
#include "model/model_config.h"
#include "model/peft_adapter.h"
#include "scheduler/chunk_manager.h"

namespace ps {

namespace {

// Calls `write(tensors)` for every chunk this rank owns (its master, or for a frozen chunk its
// param payload) with the chunk's tensors for which `include` holds (all when null; a chunk with
// none is skipped), while all of its chunk types (a frozen chunk: its param chunk) are accessed on
// the host (AccessChunks, kReadWrite); releases the chunk even when `write` fails, and returns the
// first error. Frozen chunks are skipped when `trainable_only`. First drops the gathered copies
// of other ranks' chunks (ZeRO: they are stale once this rank rewrites its own).
absl::Status WriteOwnedChunksOnHost(
    ChunkStore& store, ChunkManager& manager,
    const std::function<absl::Status(absl::Span<const TensorId> tensors)>& write,
    const std::function<bool(TensorId)>& include = nullptr, bool trainable_only = false) {
  const ChunkLayout& layout = store.layout();
  RETURN_IF_ERROR(manager.ReleaseRemoteChunks());
  static constexpr ChunkType kParamOnly[] = {ChunkType::kParam};
  for (int64_t c = 0; c < layout.num_chunks(); ++c) {
    const bool trainable = layout.chunk_trainable(c);
    if (trainable_only && !trainable) continue;
    std::vector<TensorId> tensors = layout.TensorsInChunk(c);
    if (include != nullptr) {
      tensors.erase(
          std::remove_if(tensors.begin(), tensors.end(), [&](TensorId t) { return !include(t); }),
          tensors.end());
    }
    if (tensors.empty() ||
        !layout.HoldsPayload(trainable ? ChunkType::kMaster : ChunkType::kParam, c, store.rank())) {
      continue;
    }
    const absl::Span<const ChunkType> types =
        trainable ? absl::Span<const ChunkType>(kAllChunkTypes) : absl::MakeConstSpan(kParamOnly);
    RETURN_IF_ERROR(manager.AccessChunks(c, types, Device::Host(), AccessMode::kReadWrite));
    const absl::Status status = write(tensors);
    const absl::Status released = manager.ReleaseChunks(c, types);
    RETURN_IF_ERROR(status);
    RETURN_IF_ERROR(released);
  }
  return absl::OkStatus();
}

}  // namespace

// The optimizer-state chunks of at most one chunk index accessed on the host through the manager
// for reading, because their payloads were not in memory (the disk tier holds them in swap files
// between accesses; the manager loads them back). Consecutive reads of one chunk's tensors share
// the access. Released by Release() or, failing that, on destruction (logged).
class ModelStateIo::HostReadAccess {
 public:
  HostReadAccess(const ChunkStore& store, ChunkManager& manager)
      : store_(store), manager_(manager) {}
  HostReadAccess(const HostReadAccess&) = delete;
  HostReadAccess& operator=(const HostReadAccess&) = delete;
  ~HostReadAccess() {
    const absl::Status released = Release();
    LOG_IF(WARNING, !released.ok()) << "GptModel: releasing a chunk read: " << released;
  }

  // Makes chunk `chunk_index` of `type` readable where it is. Nothing (no manager call) for a
  // chunk with a payload, a chunk this rank holds no payload of (View says so), and any type but
  // the optimizer state's. Otherwise releases what was accessed before and accesses, on the host
  // (kRead: a clean chunk stays clean), each optimizer-state chunk of the index that this rank
  // holds and that has no payload. FailedPrecondition inside an iteration (an access there would
  // be a moment of the schedule).
  absl::Status Prepare(ChunkType type, int64_t chunk_index) {
    if (!IsOptimizerState(type)) return absl::OkStatus();
    if (chunk_index == index_ && std::find(types_.begin(), types_.end(), type) != types_.end()) {
      return absl::OkStatus();
    }
    const ChunkLayout& layout = store_.layout();
    if (store_.chunk(type, chunk_index).has_payload() ||
        !layout.HoldsPayload(type, chunk_index, store_.rank())) {
      return absl::OkStatus();
    }
    if (manager_.in_iteration()) {
      return absl::FailedPreconditionError(absl::StrCat(
          "GptModel: chunk ", store_.chunk(type, chunk_index).id().ToString(),
          " is not in memory (its bytes are on disk), and loading it inside an iteration would "
          "disturb the schedule; read it after EndIteration"));
    }
    RETURN_IF_ERROR(Release());
    std::vector<ChunkType> missing;
    for (ChunkType t : {ChunkType::kMaster, ChunkType::kMomentum, ChunkType::kVariance}) {
      if (layout.HoldsPayload(t, chunk_index, store_.rank()) &&
          !store_.chunk(t, chunk_index).has_payload()) {
        missing.push_back(t);
      }
    }
    RETURN_IF_ERROR(manager_.AccessChunks(chunk_index, missing, Device::Host(), AccessMode::kRead));
    index_ = chunk_index;
    types_ = std::move(missing);
    return absl::OkStatus();
  }

  // Releases the chunks accessed, if any.
  absl::Status Release() {
    if (index_ < 0) return absl::OkStatus();
    const int64_t index = index_;
    index_ = -1;
    return manager_.ReleaseChunks(index, std::exchange(types_, {}));
  }

 private:
  const ChunkStore& store_;
  ChunkManager& manager_;
  int64_t index_ = -1;
  std::vector<ChunkType> types_;
};

absl::StatusOr<Backend*> AcceleratorBackendOf(const DeviceMemory& accelerator) {
  // The accelerator memory sits on its backend (CreateAcceleratorMemory).
  const auto* device = dynamic_cast<const BackendDeviceResource*>(accelerator.upstream());
  if (device == nullptr) {
    return absl::InternalError(
        "GptModel: the accelerator memory has no backend to compute and copy with");
  }
  return device->backend();
}

ModelStateIo::ModelStateIo(Parts parts) : parts_(std::move(parts)) {}

ModelStateIo::~ModelStateIo() {
  absl::MutexLock lock(&staging_mu_);
  if (staging_ != nullptr) {
    // The stream waited for its copies when each read ended; nothing is in flight.
    const absl::Status freed = staging_backend_->FreePinnedHost(staging_);
    LOG_IF(WARNING, !freed.ok()) << "GptModel: freeing the payload staging buffer: " << freed;
  }
}

absl::Status ModelStateIo::RequireHostPayload(const TensorView& v, absl::string_view what) {
  if (v.device.is_host()) return absl::OkStatus();
  return absl::InternalError(absl::StrCat("GptModel: ", what, " found a payload on ",
                                          v.device.ToString(),
                                          " where the manager should have moved it to the host"));
}

absl::Status ModelStateIo::ReadPayloadRange(const TensorView& v, int64_t first_elem,
                                            absl::Span<float> out) const {
  const int64_t n = static_cast<int64_t>(out.size());
  const int64_t elem_bytes = SizeOf(v.dtype);
  CHECK(first_elem >= 0 && first_elem + n <= v.numel);
  const char* src = static_cast<const char*>(v.data) + first_elem * elem_bytes;
  if (v.device.is_host()) return Convert(v.dtype, src, DType::kF32, out.data(), n);
  absl::MutexLock lock(&staging_mu_);
  if (staging_ == nullptr) {
    ASSIGN_OR_RETURN(staging_backend_, AcceleratorBackendOf(*parts_.accelerator));
    ASSIGN_OR_RETURN(staging_, staging_backend_->AllocatePinnedHost(parts_.payload_staging_bytes));
  }
  if (staging_stream_ == nullptr) {
    ASSIGN_OR_RETURN(staging_stream_, staging_backend_->CreateStream());
    ASSIGN_OR_RETURN(staging_event_, staging_backend_->CreateEvent());
  }
  // The payload may have been written by compute still queued (a gradient written into its slot):
  // the copy waits for the compute stream's work so far.
  RETURN_IF_ERROR(parts_.compute_stream->RecordEvent(staging_event_.get()));
  RETURN_IF_ERROR(staging_stream_->WaitEvent(staging_event_.get()));
  const int64_t piece_elems = parts_.payload_staging_bytes / elem_bytes;
  for (int64_t done = 0; done < n; done += piece_elems) {
    const int64_t elems = std::min(piece_elems, n - done);
    absl::Status copied = staging_stream_->MemcpyAsync(staging_, src + done * elem_bytes,
                                                       elems * elem_bytes, CopyKind::kDeviceToHost);
    if (copied.ok()) copied = staging_stream_->Synchronize();
    if (!copied.ok()) {
      // A stream that failed keeps its error (memory/backend.h): the next read gets a new one.
      staging_stream_.reset();
      return copied;
    }
    RETURN_IF_ERROR(Convert(v.dtype, staging_, DType::kF32, out.data() + done, elems));
  }
  return absl::OkStatus();
}

absl::Status ModelStateIo::WriteParameter(TensorId tensor, absl::Span<const float> values) {
  ASSIGN_OR_RETURN(TensorView param, parts_.store->View(ChunkType::kParam, tensor));
  CHECK_EQ(param.numel, static_cast<int64_t>(values.size()));
  RETURN_IF_ERROR(RequireHostPayload(param, "setting a parameter"));
  if (frozen(tensor)) {
    // The param slot is the frozen weight: rounded to the compute dtype once.
    return Convert(DType::kF32, values.data(), param.dtype, param.data, param.numel);
  }
  ASSIGN_OR_RETURN(TensorView master, parts_.store->View(ChunkType::kMaster, tensor));
  RETURN_IF_ERROR(RequireHostPayload(master, "setting a master weight"));
  std::memcpy(master.data, values.data(), values.size() * sizeof(float));
  RETURN_IF_ERROR(Convert(DType::kF32, values.data(), param.dtype, param.data, param.numel));
  for (ChunkType type : {ChunkType::kMomentum, ChunkType::kVariance}) {
    ASSIGN_OR_RETURN(TensorView v, parts_.store->View(type, tensor));
    RETURN_IF_ERROR(RequireHostPayload(v, "zeroing the optimizer state"));
    std::memset(v.data, 0, static_cast<size_t>(v.bytes()));
  }
  return absl::OkStatus();
}

bool ModelStateIo::frozen(TensorId tensor) const {
  const ChunkLayout& layout = parts_.store->layout();
  return !layout.chunk_trainable(layout.tensor(tensor).chunk_index);
}

bool ModelStateIo::is_adapter(TensorId tensor) const {
  if (parts_.lora == nullptr) return false;
  const absl::string_view name = parts_.store->layout().tensor(tensor).name;
  return absl::EndsWith(name, ".lora_A.weight") || absl::EndsWith(name, ".lora_B.weight");
}

absl::Status ModelStateIo::SetParameters(const ParameterFillFn& fill,
                                         const std::function<bool(TensorId)>& include) {
  if (parts_.manager->in_iteration()) {
    return absl::FailedPreconditionError(
        "GptModel: parameters can only be set outside an iteration (after EndIteration)");
  }
  const ChunkLayout& layout = parts_.store->layout();
  std::vector<float> values;
  return WriteOwnedChunksOnHost(
      *parts_.store, *parts_.manager,
      [&](absl::Span<const TensorId> tensors) -> absl::Status {
        for (TensorId t : tensors) {
          values.assign(static_cast<size_t>(layout.tensor(t).numel), 0.0f);
          RETURN_IF_ERROR(fill(t, absl::MakeSpan(values)));
          RETURN_IF_ERROR(WriteParameter(t, values));
        }
        return absl::OkStatus();
      },
      include);
}

absl::Status ModelStateIo::LoadGpt2Checkpoint(const Gpt2Checkpoint& checkpoint) {
  if (parts_.model_config->architecture() != ModelArchitecture::kGpt2) {
    return absl::FailedPreconditionError(
        absl::StrCat("GptModel::LoadGpt2Checkpoint: model '", parts_.config->name, "' is a ",
                     ModelFamilyName(parts_.model_config->family),
                     " model, not GPT-2; load a Hugging Face directory (LoadHfCheckpoint)"));
  }
  if (!(checkpoint.dims() == parts_.dims)) {
    std::ostringstream os;
    os << "GptModel: the checkpoint's dimensions " << checkpoint.dims()
       << " differ from the model's " << parts_.dims << " (config '" << parts_.config->name << "')";
    return absl::InvalidArgumentError(os.str());
  }
  const ChunkLayout& layout = parts_.store->layout();
  return SetParameters([&](TensorId t, absl::Span<float> out) {
    const std::string& name = layout.tensor(t).name;
    if (const std::optional<RowBlockName> block = ParseRowBlockName(name); block.has_value()) {
      return checkpoint.ReadF32(block->base, block->row_begin * parts_.config->hidden, out);
    }
    return checkpoint.ReadF32(name, out);
  });
}

absl::Status ModelStateIo::LoadHfCheckpoint(const HfCheckpoint& checkpoint) {
  ModelConfig theirs = checkpoint.config(), ours = *parts_.model_config;
  theirs.name = ours.name = "";
  theirs.torch_dtype = ours.torch_dtype = std::nullopt;
  if (!(theirs == ours)) {
    std::ostringstream os;
    os << "GptModel: the Hugging Face model in " << checkpoint.dir() << " (" << checkpoint.config()
       << ") differs from the model's configuration (" << *parts_.model_config << ")";
    return absl::InvalidArgumentError(os.str());
  }
  const ChunkLayout& layout = parts_.store->layout();
  return SetParameters(
      [&](TensorId t, absl::Span<float> out) {
        const std::string& name = layout.tensor(t).name;
        if (const std::optional<RowBlockName> block = ParseRowBlockName(name); block.has_value()) {
          return checkpoint.ReadAsF32(block->base, block->row_begin * parts_.config->hidden, out);
        }
        return checkpoint.ReadAsF32(name, 0, out);
      },
      [&](TensorId t) { return !is_adapter(t); });
}

absl::Status ModelStateIo::SaveHfCheckpoint(const std::string& dir, DType dtype,
                                            const HfExportOptions& options) const {
  if (parts_.manager->in_iteration()) {
    return absl::FailedPreconditionError(
        "GptModel: export the parameters outside an iteration (after EndIteration)");
  }
  if (parts_.store->layout().world_size() > 1) {
    return absl::FailedPreconditionError(absl::StrCat(
        "GptModel::SaveHfCheckpoint: this rank holds the master weights of its own chunks only "
        "(ZeRO, world size ",
        parts_.store->layout().world_size(), "); gather them first, as the trainer's export does"));
  }
  return WriteHfCheckpoint(
      dir, *parts_.model_config, dtype,
      ConvertingFill(
          [&](const TensorSpec& tensor, int64_t first_elem, absl::Span<float> dst) {
            return ReadTensorRange(ChunkType::kMaster, tensor.name, first_elem, dst);
          },
          dtype),
      options);
}

absl::Status ModelStateIo::LoadTrainingState(const TrainingStateFillFn& fill) {
  if (parts_.manager->in_iteration()) {
    return absl::FailedPreconditionError(
        "GptModel: the training state can only be loaded outside an iteration");
  }
  const ChunkLayout& layout = parts_.store->layout();
  std::vector<float> values;
  return WriteOwnedChunksOnHost(
      *parts_.store, *parts_.manager,
      [&](absl::Span<const TensorId> tensors) -> absl::Status {
        for (TensorId t : tensors) {
          const TensorInfo& info = layout.tensor(t);
          values.assign(static_cast<size_t>(info.numel), 0.0f);
          for (ChunkType type : {ChunkType::kMomentum, ChunkType::kVariance, ChunkType::kMaster}) {
            RETURN_IF_ERROR(fill(info.name, type, absl::MakeSpan(values)));
            ASSIGN_OR_RETURN(TensorView v, parts_.store->View(type, t));
            RETURN_IF_ERROR(RequireHostPayload(v, "loading the training state"));
            std::memcpy(v.data, values.data(), values.size() * sizeof(float));
          }
          // `values` holds the master values now.
          ASSIGN_OR_RETURN(TensorView param, parts_.store->View(ChunkType::kParam, t));
          RETURN_IF_ERROR(RequireHostPayload(param, "loading the training state"));
          RETURN_IF_ERROR(
              Convert(DType::kF32, values.data(), param.dtype, param.data, param.numel));
        }
        return absl::OkStatus();
      },
      /*include=*/nullptr, /*trainable_only=*/true);
}

absl::Status ModelStateIo::VisitTrainingState(const TrainingStateVisitFn& visit) const {
  if (parts_.manager->in_iteration()) {
    return absl::FailedPreconditionError(
        "GptModel: the training state can only be read outside an iteration");
  }
  // The checkpoint's order (each name's master, momentum, variance in turn) is kept; a chunk
  // whose payloads are on disk is accessed once for the run of its tensors, which follow one
  // another in that order (ParameterNames is the layout's placement order).
  HostReadAccess access(*parts_.store, *parts_.manager);
  std::vector<float> values;
  for (const TrainingStateTensor& t : TrainingStateTensors()) {
    int64_t numel = 1;
    for (int64_t d : t.shape) numel *= d;
    values.assign(static_cast<size_t>(numel), 0.0f);
    absl::Status status = ReadRange(t.type, t.name, 0, absl::MakeSpan(values), access);
    if (status.ok()) status = visit(t.name, t.type, values);
    if (!status.ok()) {
      (void)access.Release();  // the first error is the one to report
      return status;
    }
  }
  return access.Release();
}

std::vector<TrainingStateTensor> ModelStateIo::TrainingStateTensors() const {
  std::vector<TrainingStateTensor> tensors;
  for (const TensorSpec& spec : ParameterSpecs()) {
    if (!HoldsTrainingState(spec.name)) continue;  // another rank's (ZeRO)
    for (ChunkType type : {ChunkType::kMaster, ChunkType::kMomentum, ChunkType::kVariance}) {
      tensors.push_back({.name = spec.name, .type = type, .shape = spec.shape});
    }
  }
  return tensors;
}

bool ModelStateIo::HoldsTrainingState(absl::string_view name) const {
  const ChunkLayout& layout = parts_.store->layout();
  absl::StatusOr<TensorId> t = layout.FindTensor(name);
  return t.ok() && layout.HoldsPayload(ChunkType::kMaster, layout.tensor(*t).chunk_index,
                                       parts_.store->rank());
}

std::vector<std::string> ModelStateIo::ParameterNames() const {
  std::vector<std::string> names;
  for (TensorId t : parts_.param_tensors) names.push_back(parts_.store->layout().tensor(t).name);
  return names;
}

std::vector<TensorSpec> ModelStateIo::ParameterSpecs() const {
  std::vector<TensorSpec> specs;
  for (TensorId t : parts_.param_tensors) {
    const TensorInfo& info = parts_.store->layout().tensor(t);
    specs.push_back({info.name, info.shape});
  }
  return specs;
}

absl::Status ModelStateIo::SaveGpt2Safetensors(const std::string& path, DType dtype) const {
  if (parts_.model_config->architecture() != ModelArchitecture::kGpt2) {
    return absl::FailedPreconditionError(
        absl::StrCat("GptModel::SaveGpt2Safetensors: model '", parts_.config->name, "' is a ",
                     ModelFamilyName(parts_.model_config->family),
                     " model, not GPT-2; export a Hugging Face directory (SaveHfCheckpoint)"));
  }
  if (parts_.manager->in_iteration()) {
    return absl::FailedPreconditionError(
        "GptModel: export the parameters outside an iteration (after EndIteration)");
  }
  if (parts_.store->layout().world_size() > 1) {
    return absl::FailedPreconditionError(absl::StrCat(
        "GptModel::SaveGpt2Safetensors: this rank holds the master weights of its own chunks "
        "only (ZeRO, world size ",
        parts_.store->layout().world_size(),
        "); gather them first, as the trainer's export does (trainer/trainer.h)"));
  }
  return WriteGpt2Safetensors(path, parts_.dims, dtype,
                              [&](absl::string_view name, absl::Span<float> out) -> absl::Status {
                                return ReadTensorInto(ChunkType::kMaster, name, out);
                              });
}

absl::StatusOr<std::vector<float>> ModelStateIo::ReadTensor(ChunkType type,
                                                            absl::string_view name) const {
  int64_t numel = 0;
  if (absl::StatusOr<TensorId> t = parts_.store->layout().FindTensor(name); t.ok()) {
    numel = parts_.store->layout().tensor(*t).numel;
  } else if (BlocksOf(name) != nullptr) {
    numel = parts_.config->vocab_size * parts_.config->hidden;
  } else {
    return t.status();
  }
  std::vector<float> out(static_cast<size_t>(numel));
  RETURN_IF_ERROR(ReadTensorInto(type, name, absl::MakeSpan(out)));
  return out;
}

absl::Status ModelStateIo::ReadTensorInto(ChunkType type, absl::string_view name,
                                          absl::Span<float> out) const {
  const ChunkLayout& layout = parts_.store->layout();
  absl::StatusOr<TensorId> t = layout.FindTensor(name);
  if (t.ok()) {
    const int64_t numel = layout.tensor(*t).numel;
    if (static_cast<int64_t>(out.size()) != numel) {
      return absl::InvalidArgumentError(absl::StrCat("GptModel::ReadTensorInto: '", name, "' has ",
                                                     numel, " elements, not ", out.size()));
    }
    return ReadTensorRange(type, name, 0, out);
  }
  if (BlocksOf(name) == nullptr) return t.status();
  // A vocabulary matrix in row blocks: assembled.
  const int64_t c = parts_.config->hidden;
  if (static_cast<int64_t>(out.size()) != parts_.config->vocab_size * c) {
    return absl::InvalidArgumentError(absl::StrCat("GptModel::ReadTensorInto: '", name, "' has ",
                                                   parts_.config->vocab_size * c, " elements, not ",
                                                   out.size()));
  }
  return ReadTensorRange(type, name, 0, out);
}

absl::StatusOr<ChunkType> ModelStateIo::ReadableType(ChunkType type, int64_t chunk_index,
                                                     absl::string_view name) const {
  if (parts_.store->layout().chunk_trainable(chunk_index)) return type;
  switch (type) {
    case ChunkType::kMaster:
      return ChunkType::kParam;  // the frozen weight itself: there is no master copy
    case ChunkType::kMomentum:
    case ChunkType::kVariance:
      return absl::FailedPreconditionError(absl::StrCat(
          "GptModel: '", name, "' is frozen (a LoRA base tensor): no optimizer state (",
          ChunkTypeName(type), ")"));
    default:
      return type;
  }
}

const std::vector<ModelStateIo::RowBlock>* ModelStateIo::BlocksOf(absl::string_view name) const {
  const ChunkLayout& layout = parts_.store->layout();
  for (const std::vector<RowBlock>& blocks : parts_.row_blocks) {
    if (blocks.empty()) continue;
    const std::string& first = layout.tensor(blocks.front().tensor).name;
    const std::optional<RowBlockName> block = ParseRowBlockName(first);
    if (block.has_value() && block->base == name) return &blocks;
  }
  return nullptr;
}

absl::Status ModelStateIo::ReadTensorRange(ChunkType type, absl::string_view name,
                                           int64_t first_elem, absl::Span<float> out) const {
  HostReadAccess access(*parts_.store, *parts_.manager);
  const absl::Status status = ReadRange(type, name, first_elem, out, access);
  const absl::Status released = access.Release();
  RETURN_IF_ERROR(status);
  return released;
}

absl::Status ModelStateIo::ReadRange(ChunkType type, absl::string_view name, int64_t first_elem,
                                     absl::Span<float> out, HostReadAccess& access) const {
  const ChunkLayout& layout = parts_.store->layout();
  const int64_t n = static_cast<int64_t>(out.size());
  auto outside = [&](int64_t numel) {
    return absl::InvalidArgumentError(absl::StrCat("GptModel::ReadTensorRange: elements [",
                                                   first_elem, ", ", first_elem + n, ") of '", name,
                                                   "' are outside its ", numel));
  };
  if (absl::StatusOr<TensorId> t = layout.FindTensor(name); t.ok()) {
    const TensorInfo& info = layout.tensor(*t);
    if (first_elem < 0 || first_elem + n > info.numel) return outside(info.numel);
    ASSIGN_OR_RETURN(const ChunkType read, ReadableType(type, info.chunk_index, name));
    RETURN_IF_ERROR(access.Prepare(read, info.chunk_index));
    ASSIGN_OR_RETURN(TensorView v, parts_.store->View(read, *t));
    return ReadPayloadRange(v, first_elem, out);
  }
  const std::vector<RowBlock>* blocks = BlocksOf(name);
  if (blocks == nullptr) {
    return absl::NotFoundError(absl::StrCat("GptModel: no tensor '", name, "'"));
  }
  const int64_t c = parts_.config->hidden;
  if (first_elem < 0 || first_elem + n > parts_.config->vocab_size * c) {
    return outside(parts_.config->vocab_size * c);
  }
  // Each block holds the element range [row_begin c, (row_begin + rows) c) of the whole.
  for (const RowBlock& b : *blocks) {
    const int64_t lo = std::max(first_elem, b.row_begin * c);
    const int64_t hi = std::min(first_elem + n, (b.row_begin + b.rows) * c);
    if (lo >= hi) continue;
    const int64_t chunk = layout.tensor(b.tensor).chunk_index;
    ASSIGN_OR_RETURN(const ChunkType read, ReadableType(type, chunk, name));
    RETURN_IF_ERROR(access.Prepare(read, chunk));
    ASSIGN_OR_RETURN(TensorView v, parts_.store->View(read, b.tensor));
    RETURN_IF_ERROR(ReadPayloadRange(
        v, lo - b.row_begin * c,
        out.subspan(static_cast<size_t>(lo - first_elem), static_cast<size_t>(hi - lo))));
  }
  return absl::OkStatus();
}

// --- LoRA ----------------------------------------------------------------------------------

absl::Status ModelStateIo::CheckExport(absl::string_view caller, bool need_lora,
                                       bool whole_model) const {
  if (need_lora && parts_.lora == nullptr) {
    return absl::FailedPreconditionError(
        absl::StrCat("GptModel::", caller, ": model '", parts_.config->name,
                     "' has no LoRA configuration (GptModelOptions::lora)"));
  }
  if (parts_.manager->in_iteration()) {
    return absl::FailedPreconditionError(
        absl::StrCat("GptModel::", caller, " runs outside an iteration (after EndIteration)"));
  }
  if (whole_model && parts_.store->layout().world_size() > 1) {
    return absl::FailedPreconditionError(absl::StrCat(
        "GptModel::", caller, ": this rank holds its own chunks only (ZeRO, world size ",
        parts_.store->layout().world_size(), "); run it in a world of one rank"));
  }
  return absl::OkStatus();
}

absl::Status ModelStateIo::LoadPeftAdapter(const std::string& dir) {
  RETURN_IF_ERROR(CheckExport("LoadPeftAdapter", /*need_lora=*/true, /*whole_model=*/false));
  const ModelConfig& model = *parts_.model_config;
  ASSIGN_OR_RETURN(PeftAdapter adapter, ReadPeftAdapter(dir, model));
  const LoraConfig& ours = *parts_.lora;
  const LoraConfig& theirs = adapter.lora;
  auto mismatch = [&](absl::string_view key, absl::string_view their_value,
                      absl::string_view our_value) {
    return absl::InvalidArgumentError(absl::StrCat(
        "GptModel::LoadPeftAdapter: the adapter in ", dir, " has ", key, " = ", their_value,
        " but the model's LoRA configuration has ", key, " = ", our_value,
        "; load an adapter trained with this configuration or change the `lora` section"));
  };
  if (theirs.r != ours.r) return mismatch("r", absl::StrCat(theirs.r), absl::StrCat(ours.r));
  if (theirs.lora_alpha != ours.lora_alpha) {
    return mismatch("lora_alpha", absl::StrCat(theirs.lora_alpha), absl::StrCat(ours.lora_alpha));
  }
  auto modules = [&](const LoraConfig& lora) {
    std::vector<std::string> names;
    for (const LoraTarget& t : LoraTargets(model, lora)) names.push_back(t.module);
    return names;
  };
  auto list = [](absl::Span<const std::string> v) {
    return absl::StrCat("[", absl::StrJoin(v, ", "), "]");
  };
  if (modules(theirs) != modules(ours)) {
    return mismatch("target_modules", list(theirs.target_modules), list(ours.target_modules));
  }
  if (LoraSavedTensors(model, theirs) != LoraSavedTensors(model, ours)) {
    return mismatch("modules_to_save", list(theirs.modules_to_save), list(ours.modules_to_save));
  }
  const ChunkLayout& layout = parts_.store->layout();
  // A stored tensor's whole-tensor name and the offset of its first element there.
  auto whole = [&](TensorId t) -> std::pair<std::string, int64_t> {
    const std::string& name = layout.tensor(t).name;
    if (const std::optional<RowBlockName> block = ParseRowBlockName(name); block.has_value()) {
      return {block->base, block->row_begin * parts_.config->hidden};
    }
    return {name, 0};
  };
  return SetParameters(
      [&](TensorId t, absl::Span<float> out) -> absl::Status {
        const auto [name, first] = whole(t);
        const std::vector<float>& values = adapter.tensors.at(name);
        CHECK_LE(first + static_cast<int64_t>(out.size()), static_cast<int64_t>(values.size()));
        std::copy_n(values.begin() + first, out.size(), out.begin());
        return absl::OkStatus();
      },
      [&](TensorId t) { return adapter.tensors.contains(whole(t).first); });
}

absl::Status ModelStateIo::SavePeftAdapter(const std::string& dir, DType dtype,
                                           const std::string& base_model_name_or_path) const {
  RETURN_IF_ERROR(CheckExport("SavePeftAdapter", /*need_lora=*/true, /*whole_model=*/true));
  return WritePeftAdapter(
      dir, *parts_.model_config, *parts_.lora, base_model_name_or_path,
      [&](const TensorSpec& tensor, absl::Span<float> dst) {
        return ReadTensorInto(ChunkType::kMaster, tensor.name, dst);
      },
      dtype);
}

absl::Status ModelStateIo::SaveMergedHfCheckpoint(const std::string& dir, DType dtype,
                                                  const HfExportOptions& options) const {
  RETURN_IF_ERROR(CheckExport("SaveMergedHfCheckpoint", /*need_lora=*/true, /*whole_model=*/true));
  absl::flat_hash_map<std::string, LoraTarget> targets;
  for (LoraTarget& t : LoraTargets(*parts_.model_config, *parts_.lora)) {
    std::string weight = t.base_weight;
    targets.emplace(std::move(weight), std::move(t));
  }
  const int64_t r = parts_.lora->r;
  const float scale = static_cast<float>(parts_.lora->scale());
  // The adapter of the weight being written (the writer asks for a tensor's ranges in order).
  const LoraTarget* cached = nullptr;
  std::vector<float> a, b;
  return WriteHfCheckpoint(
      dir, *parts_.model_config, dtype,
      ConvertingFill(
          [&](const TensorSpec& tensor, int64_t first_elem, absl::Span<float> dst) -> absl::Status {
            RETURN_IF_ERROR(ReadTensorRange(ChunkType::kMaster, tensor.name, first_elem, dst));
            const auto it = targets.find(tensor.name);
            if (it == targets.end()) return absl::OkStatus();
            const LoraTarget& t = it->second;
            if (cached != &t) {
              cached = nullptr;
              a.resize(static_cast<size_t>(r * t.in));
              b.resize(static_cast<size_t>(t.out * r));
              RETURN_IF_ERROR(ReadTensorInto(ChunkType::kMaster, t.a, absl::MakeSpan(a)));
              RETURN_IF_ERROR(ReadTensorInto(ChunkType::kMaster, t.b, absl::MakeSpan(b)));
              cached = &t;
            }
            // PEFT's get_delta_weight: (B @ A) * scaling (transposed for Conv1D), in f32.
            for (size_t j = 0; j < dst.size(); ++j) {
              const int64_t e = first_elem + static_cast<int64_t>(j);
              const int64_t o = t.conv1d ? e % t.out : e / t.in;
              const int64_t i = t.conv1d ? e / t.out : e % t.in;
              float delta = 0.0f;
              for (int64_t k = 0; k < r; ++k) delta += b[o * r + k] * a[k * t.in + i];
              dst[j] += delta * scale;
            }
            return absl::OkStatus();
          },
          dtype),
      options);
}

absl::StatusOr<std::string> ModelStateIo::BaseFingerprint() const {
  RETURN_IF_ERROR(CheckExport("BaseFingerprint", /*need_lora=*/true, /*whole_model=*/true));
  // FNV-1a's offset and prime over 64-bit words (gpt_model.h's BaseFingerprint comment): a 7B base
  // is 13 GB of f32 values, a multiply per byte took minutes, one per 8 bytes takes seconds.
  uint64_t h = 0xcbf29ce484222325ull;
  const auto mix_word = [&h](uint64_t w) {
    h ^= w;
    h *= 0x100000001b3ull;
    h ^= h >> 32;
  };
  auto mix = [&mix_word](const void* data, size_t bytes) {
    const auto* p = static_cast<const unsigned char*>(data);
    size_t i = 0;
    for (; i + 8 <= bytes; i += 8) {
      uint64_t w;
      std::memcpy(&w, p + i, 8);
      mix_word(w);
    }
    if (i < bytes) {
      uint64_t w = 0;
      std::memcpy(&w, p + i, bytes - i);
      mix_word(w);
    }
    mix_word(static_cast<uint64_t>(bytes));
  };
  const absl::string_view dtype = DTypeName(parts_.store->compute_dtype());
  constexpr int64_t kPiece = int64_t{1} << 20;
  std::vector<float> values;
  // Whole (Hugging Face) tensors, so that the vocabulary split does not change the digest.
  for (const OperatorSpec& op :
       LoraModelOperators(*parts_.model_config, *parts_.lora, {.vocab_block_rows = 0})) {
    if (op.trainable) continue;
    for (const TensorSpec& t : op.tensors) {
      mix(t.name.data(), t.name.size());
      mix("", 1);
      for (const int64_t d : t.shape) mix(&d, sizeof(d));
      mix(dtype.data(), dtype.size());
      ASSIGN_OR_RETURN(const int64_t numel, ShapeNumElems(t.shape));
      for (int64_t first = 0; first < numel; first += kPiece) {
        values.resize(static_cast<size_t>(std::min(kPiece, numel - first)));
        RETURN_IF_ERROR(ReadTensorRange(ChunkType::kParam, t.name, first, absl::MakeSpan(values)));
        mix(values.data(), values.size() * sizeof(float));
      }
    }
  }
  return absl::StrCat(absl::Hex(h, absl::kZeroPad16));
}

}  // namespace ps
