// ModelStateIo's core (model/model_state_io.h): the staged reads, the parameter setters and the
// export checks; the training state, the imports and exports, the PEFT adapter, the merged export
// and the base fingerprint are each in a file of their own (model/model_state_io_*.cc).
#include "model/model_state_io.h"

#include <algorithm>
#include <cstdint>
#include <cstring>
#include <functional>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "absl/functional/function_ref.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/string_view.h"
#include "base/mutex.h"
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
#include "model/gpt_config.h"
#include "model/internal/model_state_io_parts.h"
#include "scheduler/chunk_manager.h"

namespace ps {

namespace model_state_io_internal {

void ForEachOwnedTensor(const ChunkStore& store, const std::function<bool(TensorId)>& include,
                        bool trainable_only, absl::FunctionRef<void(TensorId)> visit) {
  const ChunkLayout& layout = store.layout();
  for (int64_t c = 0; c < layout.num_chunks(); ++c) {
    const bool trainable = layout.chunk_trainable(c);
    if (trainable_only && !trainable) continue;
    if (!layout.HoldsPayload(trainable ? ChunkType::kMaster : ChunkType::kParam, c, store.rank())) {
      continue;
    }
    for (TensorId t : layout.TensorsInChunk(c)) {
      if (include == nullptr || include(t)) visit(t);
    }
  }
}

absl::Status WriteOwnedChunksOnHost(
    ChunkStore& store, ChunkManager& manager,
    const std::function<absl::Status(absl::Span<const TensorId> tensors)>& write,
    const std::function<bool(TensorId)>& include, bool trainable_only) {
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

}  // namespace model_state_io_internal

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
  MutexLock lock(&staging_mu_);
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
  return StagedRead(src, n * elem_bytes, elem_bytes,
                    [&](const void* host, int64_t offset, int64_t bytes) {
                      return Convert(v.dtype, host, DType::kF32, out.data() + offset / elem_bytes,
                                     bytes / elem_bytes);
                    });
}

absl::Status ModelStateIo::ReadPayloadBytes(const TensorView& v, absl::Span<char> out) const {
  CHECK_EQ(static_cast<int64_t>(out.size()), v.bytes());
  if (v.device.is_host()) {
    std::memcpy(out.data(), v.data, out.size());
    return absl::OkStatus();
  }
  return StagedRead(static_cast<const char*>(v.data), v.bytes(), 1,
                    [&](const void* host, int64_t offset, int64_t bytes) {
                      std::memcpy(out.data() + offset, host, static_cast<size_t>(bytes));
                      return absl::OkStatus();
                    });
}

absl::Status ModelStateIo::StagedRead(
    const char* src, int64_t bytes, int64_t piece_quantum,
    absl::FunctionRef<absl::Status(const void* host, int64_t offset, int64_t bytes)> consume)
    const {
  MutexLock lock(&staging_mu_);
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
  const int64_t piece = parts_.payload_staging_bytes / piece_quantum * piece_quantum;
  for (int64_t done = 0; done < bytes; done += piece) {
    const int64_t now = std::min(piece, bytes - done);
    absl::Status copied =
        staging_stream_->MemcpyAsync(staging_, src + done, now, CopyKind::kDeviceToHost);
    if (copied.ok()) copied = staging_stream_->Synchronize();
    if (!copied.ok()) {
      // A stream that failed keeps its error (memory/backend.h): the next read gets a new one.
      staging_stream_.reset();
      return copied;
    }
    RETURN_IF_ERROR(consume(staging_, done, now));
  }
  return absl::OkStatus();
}

absl::Status ModelStateIo::WriteParameter(TensorId tensor, absl::Span<const float> values,
                                          ThreadPool* quant_pool) {
  if (const Quant4Format* q = quant4(tensor)) return WriteQuant4(tensor, *q, values, quant_pool);
  CHECK_EQ(parts_.store->layout().tensor(tensor).numel, static_cast<int64_t>(values.size()));
  return WriteParameterRange(tensor, 0, values);
}

absl::Status ModelStateIo::WriteParameterRange(TensorId tensor, int64_t first_elem,
                                               absl::Span<const float> values) {
  CHECK(quant4(tensor) == nullptr);
  const int64_t n = static_cast<int64_t>(values.size());
  // Elements [first_elem, first_elem + n) of a view.
  const auto at = [&](const TensorView& v) {
    CHECK_LE(first_elem + n, v.numel);
    return static_cast<char*>(v.data) + first_elem * SizeOf(v.dtype);
  };
  ASSIGN_OR_RETURN(TensorView param, parts_.store->View(ChunkType::kParam, tensor));
  RETURN_IF_ERROR(RequireHostPayload(param, "setting a parameter"));
  if (frozen(tensor)) {
    // The param slot is the frozen weight: rounded to the compute dtype once.
    return Convert(DType::kF32, values.data(), param.dtype, at(param), n);
  }
  ASSIGN_OR_RETURN(TensorView master, parts_.store->View(ChunkType::kMaster, tensor));
  RETURN_IF_ERROR(RequireHostPayload(master, "setting a master weight"));
  if (at(master) != reinterpret_cast<const char*>(values.data())) {
    std::memcpy(at(master), values.data(), values.size() * sizeof(float));
  }
  RETURN_IF_ERROR(Convert(DType::kF32, values.data(), param.dtype, at(param), n));
  for (ChunkType type : {ChunkType::kMomentum, ChunkType::kVariance}) {
    ASSIGN_OR_RETURN(TensorView v, parts_.store->View(type, tensor));
    RETURN_IF_ERROR(RequireHostPayload(v, "zeroing the optimizer state"));
    std::memset(at(v), 0, static_cast<size_t>(n * SizeOf(v.dtype)));
  }
  return absl::OkStatus();
}

int64_t ModelStateIo::LogicalNumel(TensorId tensor) const {
  const Quant4Format* q = quant4(tensor);
  return q != nullptr ? q->num_elems() : parts_.store->layout().tensor(tensor).numel;
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

ModelStateIo::SetProgress::SetProgress(const ModelStateIo& io,
                                       const std::function<bool(TensorId)>& include,
                                       const ProgressFn& progress, const ProgressUnitsFn& units)
    : io_(io), progress_(progress), units_(units) {
  if (progress_ == nullptr) return;
  model_state_io_internal::ForEachOwnedTensor(*io_.parts_.store, include, /*trainable_only=*/false,
                                              [&](TensorId t) { total_ += this->units(t); });
}

int64_t ModelStateIo::SetProgress::units(TensorId t) const {
  return units_ != nullptr ? units_(t) : io_.LogicalNumel(t);
}

void ModelStateIo::SetProgress::Add(int64_t units) {
  if (progress_ == nullptr || total_ <= 0) return;
  MutexLock lock(&mu_);
  done_ = std::min(total_, done_ + units);
  progress_(done_, total_);
}

void ModelStateIo::SetProgress::Finish() {
  if (progress_ == nullptr || total_ <= 0) return;
  MutexLock lock(&mu_);
  // The last call says done == total even where the units were counted short.
  if (done_ < total_) progress_(total_, total_);
  done_ = total_;
}

absl::Status ModelStateIo::SetParameters(const ParameterFillFn& fill,
                                         const std::function<bool(TensorId)>& include,
                                         const Quant4BlobFillFn& blob_fill, bool parallel,
                                         const ProgressFn& progress,
                                         const ProgressUnitsFn& units) {
  if (parts_.manager->in_iteration()) {
    return absl::FailedPreconditionError(
        "GptModel: parameters can only be set outside an iteration (after EndIteration)");
  }
  // One tensor: its blob as it is, or its values filled (and quantized with `pool`).
  auto set_one = [&](TensorId t, std::vector<float>& values, ThreadPool* pool) -> absl::Status {
    if (blob_fill != nullptr && quant4(t) != nullptr) {
      ASSIGN_OR_RETURN(const bool written, WriteQuant4Blob(t, blob_fill));
      if (written) return absl::OkStatus();
    }
    values.assign(static_cast<size_t>(LogicalNumel(t)), 0.0f);
    RETURN_IF_ERROR(fill(t, absl::MakeSpan(values)));
    return WriteParameter(t, values, pool);
  };
  SetProgress counter(*this, include, progress, units);
  const auto report = [&](TensorId t) { counter.Add(counter.units(t)); };
  std::vector<float> values;
  const absl::Status status = model_state_io_internal::WriteOwnedChunksOnHost(
      *parts_.store, *parts_.manager,
      [&](absl::Span<const TensorId> tensors) -> absl::Status {
        if (!parallel || parts_.pool == nullptr || tensors.size() < 2) {
          for (TensorId t : tensors) {
            RETURN_IF_ERROR(set_one(t, values, parts_.pool));
            report(t);
          }
          return absl::OkStatus();
        }
        // The chunk's tensors on the pool's threads, each with its own buffer (the fills are
        // thread-safe; the quantization inside a task runs on its thread alone).
        std::vector<absl::Status> status(tensors.size());
        parts_.pool->ParallelFor(static_cast<int64_t>(tensors.size()), [&](int64_t i) {
          std::vector<float> own;
          status[static_cast<size_t>(i)] = set_one(tensors[static_cast<size_t>(i)], own, nullptr);
          if (status[static_cast<size_t>(i)].ok()) report(tensors[static_cast<size_t>(i)]);
        });
        for (const absl::Status& s : status) RETURN_IF_ERROR(s);
        return absl::OkStatus();
      },
      include);
  RETURN_IF_ERROR(status);
  counter.Finish();
  return absl::OkStatus();
}

absl::Status ModelStateIo::SetParametersInPieces(const ParameterRangeFillFn& fill,
                                                 const std::function<bool(TensorId)>& include,
                                                 const Quant4BlobFillFn& blob_fill,
                                                 const ProgressFn& progress,
                                                 const ProgressUnitsFn& units) {
  const ParameterFillFn whole = [&](TensorId t, absl::Span<float> out) { return fill(t, 0, out); };
  if (parts_.pool == nullptr || parts_.pool->num_threads() < 2) {
    return SetParameters(whole, include, blob_fill, /*parallel=*/false, progress, units);
  }
  if (parts_.manager->in_iteration()) {
    return absl::FailedPreconditionError(
        "GptModel: parameters can only be set outside an iteration (after EndIteration)");
  }
  SetProgress counter(*this, include, progress, units);
  const int64_t threads = parts_.pool->num_threads();
  // A piece: elements [first, first + count) of a tensor; a 4-bit weight is one piece (whole).
  struct Piece {
    TensorId tensor;
    int64_t first = 0;
    int64_t count = 0;
  };
  // A piece through a buffer: a 4-bit weight (its blob as it is, or quantized from the whole
  // tensor's values) or a frozen tensor's range (rounded into its param slot).
  const auto set_piece = [&](const Piece& p, std::vector<float>& values) -> absl::Status {
    values.resize(static_cast<size_t>(p.count));
    if (quant4(p.tensor) == nullptr) {
      RETURN_IF_ERROR(fill(p.tensor, p.first, absl::MakeSpan(values)));
      return WriteParameterRange(p.tensor, p.first, values);
    }
    if (blob_fill != nullptr) {
      ASSIGN_OR_RETURN(const bool written, WriteQuant4Blob(p.tensor, blob_fill));
      if (written) return absl::OkStatus();
    }
    RETURN_IF_ERROR(fill(p.tensor, 0, absl::MakeSpan(values)));
    return WriteParameter(p.tensor, values, nullptr);
  };
  // The pieces' buffers: at most one per thread at a time, reused (fresh buffers of tens of MiB
  // each would fault their pages in again for every piece).
  class Buffers {
   public:
    std::vector<float> Take() {
      MutexLock lock(&mu_);
      if (free_.empty()) return {};
      std::vector<float> b = std::move(free_.back());
      free_.pop_back();
      return b;
    }
    void Give(std::vector<float> b) {
      MutexLock lock(&mu_);
      free_.push_back(std::move(b));
    }

   private:
    Mutex mu_;
    std::vector<std::vector<float>> free_;
  } buffers;
  const absl::Status status = model_state_io_internal::WriteOwnedChunksOnHost(
      *parts_.store, *parts_.manager,
      [&](absl::Span<const TensorId> tensors) -> absl::Status {
        std::vector<Piece> pieces;
        for (TensorId t : tensors) {
          const int64_t n = LogicalNumel(t);
          const int64_t m =
              quant4(t) != nullptr ? 1 : std::clamp<int64_t>(n / kMinPieceElems, 1, threads);
          for (int64_t j = 0; j < m; ++j) {
            pieces.push_back({t, n * j / m, n * (j + 1) / m - n * j / m});
          }
        }
        std::vector<absl::Status> status(pieces.size());
        parts_.pool->ParallelFor(static_cast<int64_t>(pieces.size()), [&](int64_t i) {
          const Piece& p = pieces[static_cast<size_t>(i)];
          const int64_t n = LogicalNumel(p.tensor);
          absl::Status& s = status[static_cast<size_t>(i)];
          if (quant4(p.tensor) == nullptr && !frozen(p.tensor)) {
            // Filled straight into the master slot (f32), then rounded into the param slot.
            s = FillParameterRangeInPlace(p.tensor, p.first, p.count, fill);
          } else {
            std::vector<float> values = buffers.Take();
            s = set_piece(p, values);
            buffers.Give(std::move(values));
          }
          if (!s.ok()) return;
          // This piece's share of the tensor's units (the shares of its pieces add up).
          const int64_t u = counter.units(p.tensor);
          counter.Add(u * (p.first + p.count) / n - u * p.first / n);
        });
        for (const absl::Status& s : status) RETURN_IF_ERROR(s);
        return absl::OkStatus();
      },
      include);
  RETURN_IF_ERROR(status);
  counter.Finish();
  return absl::OkStatus();
}

absl::Status ModelStateIo::FillParameterRangeInPlace(TensorId tensor, int64_t first_elem,
                                                     int64_t count,
                                                     const ParameterRangeFillFn& fill) {
  ASSIGN_OR_RETURN(TensorView master, parts_.store->View(ChunkType::kMaster, tensor));
  RETURN_IF_ERROR(RequireHostPayload(master, "setting a master weight"));
  CHECK(master.dtype == DType::kF32);
  CHECK_LE(first_elem + count, master.numel);
  const absl::Span<float> values(static_cast<float*>(master.data) + first_elem,
                                 static_cast<size_t>(count));
  RETURN_IF_ERROR(fill(tensor, first_elem, values));
  // The master already holds the values: WriteParameterRange's copy onto itself is skipped.
  return WriteParameterRange(tensor, first_elem, values);
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
    if (const Quant4Format* q = quant4(t)) {
      specs.push_back({info.name, q->transposed ? std::vector<int64_t>{q->cols, q->rows}
                                                : std::vector<int64_t>{q->rows, q->cols}});
      continue;
    }
    specs.push_back({info.name, info.shape});
  }
  return specs;
}

absl::StatusOr<std::vector<float>> ModelStateIo::ReadTensor(ChunkType type,
                                                            absl::string_view name) const {
  int64_t numel = 0;
  if (absl::StatusOr<TensorId> t = parts_.store->layout().FindTensor(name); t.ok()) {
    numel = LogicalNumel(*t);
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
    const int64_t numel = LogicalNumel(*t);
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
    const int64_t numel = LogicalNumel(*t);
    if (first_elem < 0 || first_elem + n > numel) return outside(numel);
    ASSIGN_OR_RETURN(const ChunkType read, ReadableType(type, info.chunk_index, name));
    RETURN_IF_ERROR(access.Prepare(read, info.chunk_index));
    ASSIGN_OR_RETURN(TensorView v, parts_.store->View(read, *t));
    if (const Quant4Format* q = quant4(*t)) return ReadQuant4Range(*t, *q, v, first_elem, out);
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

}  // namespace ps
