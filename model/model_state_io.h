// ModelStateIo: a chunked transformer's state read and set outside compute — the staged reads of
// chunk payloads (ReadTensor*), the training state of checkpoints (LoadTrainingState,
// VisitTrainingState, TrainingStateTensors), and the Hugging Face / GPT-2 imports and exports.
// GptModel (model/gpt_model.h) owns one and delegates its state methods to it; their contracts
// are documented there, the mechanics here.
//
// One class, written in rooms by concern: model_state_io.cc (the staged reads, the parameter
// setters), model_state_io_training_state.cc (LoadTrainingState, VisitTrainingState),
// model_state_io_hf.cc (the Hugging Face and GPT-2 imports and exports), model_state_io_peft.cc
// (LoadPeftAdapter, SavePeftAdapter), model_state_io_merged.cc (SaveMergedHfCheckpoint) and
// model_state_io_fingerprint.cc (BaseFingerprint); the parts they share are in
// model/internal/model_state_io_parts.h.
//
// Reading. Nothing here dereferences an accelerator payload on the host, so it is correct where
// accelerator memory is not host-addressable (cuda): a payload on the accelerator is copied, after
// the work enqueued on the compute stream so far (an event the copy waits for), with
// Stream::MemcpyAsync (device to host) into one pinned staging buffer of
// `payload_staging_bytes` from the accelerator's backend, piece by piece, and converted from
// there; a payload in host memory is read in place. The staging buffer and its stream are created
// at the first staged read and kept until the object is destroyed.
//
// Reading what is not in memory (the disk tier). An optimizer-state chunk (master, momentum,
// variance) that this rank holds (ChunkLayout::HoldsPayload) may have no payload between accesses:
// its bytes are in a swap file, and the ChunkManager loads them back when the chunk is accessed.
// The readers (ReadTensor*, VisitTrainingState) then read through the manager: outside an
// iteration they access the index's optimizer-state chunks that lack a payload on the host
// (ChunkManager::AccessChunks, kRead, so a clean chunk stays clean), read, and release them
// (ReleaseChunks, also after an error); inside one they fail with FailedPrecondition (an access
// would be a moment of the schedule). A chunk with a payload is read exactly as before, without
// any manager call. VisitTrainingState keeps the checkpoint's order (each name's master,
// momentum, variance) and accesses a chunk once for the run of consecutive tensors it holds.
// (Without a disk tier the manager gives a released chunk a fresh zero-filled payload, which is
// what such a read then returns.)
//
// Setting. The imports, the initialization (SetParameters) and LoadTrainingState first move every
// chunk they write to the host through the manager (ChunkManager::AccessChunks, one chunk at a
// time, all chunk types), and write only host payloads; under ZeRO they touch only the chunks
// this rank owns and first drop the gathered copies of the others (ReleaseRemoteChunks).
//
// Row blocks. A vocabulary matrix held in row blocks ("wte.weight[0:2048]", ...) is read under its
// Hugging Face name ("wte.weight") by assembling the blocks; the stored names are those of
// ParameterNames.
//
// Thread safety: the const readers may be called from several threads (the staging is guarded by
// a mutex) as long as every payload they read is in memory; a read through the manager (a chunk
// on disk) must come from the thread that drives the model, as everything else here, which is
// thread-compatible.
#ifndef PATRICKSTAR_MODEL_MODEL_STATE_IO_H_
#define PATRICKSTAR_MODEL_MODEL_STATE_IO_H_

#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/functional/function_ref.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "base/mutex.h"
#include "absl/types/span.h"
#include "base/progress.h"
#include "chunk/chunk_layout.h"
#include "chunk/chunk_store.h"
#include "chunk/chunk_type.h"
#include "chunk/operator_spec.h"
#include "base/thread_pool.h"
#include "memory/backend.h"
#include "memory/device_memory.h"
#include "memory/dtype.h"
#include "model/gpt2_checkpoint.h"
#include "model/gpt_config.h"
#include "model/hf_checkpoint.h"
#include "model/lora_config.h"
#include "model/model_config.h"
#include "model/quant4_config.h"
#include "scheduler/chunk_manager.h"

namespace ps {

// The backend of `accelerator`'s memory (CreateAcceleratorMemory puts it on a
// BackendDeviceResource); InternalError if it has none.
absl::StatusOr<Backend*> AcceleratorBackendOf(const DeviceMemory& accelerator);

// One tensor of the training state: parameter `name` (a stored name, ParameterNames) and one of
// kMaster, kMomentum, kVariance, all f32 of `shape`.
struct TrainingStateTensor {
  std::string name;
  ChunkType type;
  std::vector<int64_t> shape;
};

class ModelStateIo {
 public:
  // One row block of a vocabulary matrix: rows [row_begin, row_begin + rows) are stored tensor
  // `tensor`.
  struct RowBlock {
    TensorId tensor = -1;
    int64_t row_begin = 0;
    int64_t rows = 0;
  };
  // What the state I/O works over. The pointers are not owned and must outlive the object.
  struct Parts {
    const ModelConfig* model_config = nullptr;
    // The GPT-2 view of the dimensions (name, vocab_size, hidden: the row length of row blocks).
    const GptConfig* config = nullptr;
    Gpt2Dims dims;
    ChunkStore* store = nullptr;
    ChunkManager* manager = nullptr;
    DeviceMemory* accelerator = nullptr;
    // The stream the model computes on: staged copies wait for its work so far.
    Stream* compute_stream = nullptr;
    // Bytes of the pinned staging buffer; >= sizeof(float).
    int64_t payload_staging_bytes = 0;
    // Every parameter tensor in checkpoint order (ModelOperators order, row blocks by block).
    std::vector<TensorId> param_tensors;
    // The vocabulary matrices held in row blocks (the embedding's; an untied LM head's), each in
    // row order; empty lists are ignored.
    std::vector<std::vector<RowBlock>> row_blocks;
    // The LoRA configuration (GptModelOptions::lora), or null: the adapters' tensors are those of
    // LoraTargets; frozen tensors are those of frozen chunks (ChunkLayout::chunk_trainable).
    const LoraConfig* lora = nullptr;
    // The 4-bit weights (GptModelOptions::quant4), or null. Their stored tensors are blobs
    // (model/quant4_config.h); everything here reads and writes their logical values: the
    // setters quantize (and record the nested offsets in the table), the readers dequantize,
    // ParameterSpecs gives the Hugging Face shapes.
    Quant4Table* quant4 = nullptr;
    // Threads for quantizing 4-bit weights as they are set (null: the calling thread).
    ThreadPool* pool = nullptr;
  };

  explicit ModelStateIo(Parts parts);
  ModelStateIo(const ModelStateIo&) = delete;
  ModelStateIo& operator=(const ModelStateIo&) = delete;
  ~ModelStateIo();

  // Writes every parameter this rank owns for which `include(tensor)` holds (all when null)
  // from `fill(tensor, out)` (`out` sized to the stored tensor): the master slot, the param slot
  // (rounded to the compute dtype), momentum and variance zeroed; a frozen tensor's param slot
  // only (it has no other). FailedPrecondition inside an iteration.
  using ParameterFillFn = std::function<absl::Status(TensorId tensor, absl::Span<float> out)>;
  // A 4-bit weight (Parts::quant4) is quantized from the values `fill` gives (its logical
  // size), unless `blob_fill` (when given) writes its blob as it is — a pre-quantized import —
  // and its nested offset, and returns true.
  using Quant4BlobFillFn = std::function<absl::StatusOr<bool>(
      TensorId tensor, absl::Span<uint8_t> blob, float* nested_offset)>;
  // `parallel`: `fill` and `blob_fill` may be called from several threads at once (each call
  // for another tensor); the tensors of a chunk are then set on Parts::pool's threads.
  // `progress` hears (units done, units in all) after each tensor, from one thread at a time
  // (base/progress.h); a tensor counts `units(tensor)` (its logical elements when null).
  using ProgressUnitsFn = std::function<int64_t(TensorId tensor)>;
  [[nodiscard]] absl::Status SetParameters(const ParameterFillFn& fill,
                                           const std::function<bool(TensorId)>& include = nullptr,
                                           const Quant4BlobFillFn& blob_fill = nullptr,
                                           bool parallel = false,
                                           const ProgressFn& progress = nullptr,
                                           const ProgressUnitsFn& units = nullptr);
  // SetParameters from a fill of element ranges: fill(tensor, first_elem, out) gives elements
  // [first_elem, first_elem + out.size()) of the tensor (a 4-bit weight: first_elem 0, whole).
  // A chunk's tensors are split into pieces of at least kMinPieceElems elements, up to one per
  // thread, set on Parts::pool's threads (so one large tensor is no longer one thread's work);
  // `fill` and `blob_fill` must be safe to call from several threads at once. Same values as
  // SetParameters with the whole-tensor fill.
  using ParameterRangeFillFn =
      std::function<absl::Status(TensorId tensor, int64_t first_elem, absl::Span<float> out)>;
  static constexpr int64_t kMinPieceElems = int64_t{1} << 20;
  [[nodiscard]] absl::Status SetParametersInPieces(
      const ParameterRangeFillFn& fill, const std::function<bool(TensorId)>& include = nullptr,
      const Quant4BlobFillFn& blob_fill = nullptr, const ProgressFn& progress = nullptr,
      const ProgressUnitsFn& units = nullptr);
  // Whether stored tensor `tensor` is frozen (its chunk is: no master, no optimizer state).
  bool frozen(TensorId tensor) const;
  // The 4-bit format of stored tensor `tensor`, or null.
  const Quant4Format* quant4(TensorId tensor) const {
    return parts_.quant4 == nullptr ? nullptr : parts_.quant4->Find(tensor);
  }
  // Elements of the logical (Hugging Face) tensor: the 4-bit weight's values, else the stored
  // tensor's.
  int64_t LogicalNumel(TensorId tensor) const;
  // Whether stored tensor `tensor` is a LoRA adapter's A or B.
  bool is_adapter(TensorId tensor) const;

  // GptModel's imports and exports (see model/gpt_model.h for the contracts).
  [[nodiscard]] absl::Status LoadGpt2Checkpoint(const Gpt2Checkpoint& checkpoint);
  // `progress` hears bytes of the directory's tensors read (base/progress.h).
  [[nodiscard]] absl::Status LoadHfCheckpoint(const HfCheckpoint& checkpoint,
                                              const ProgressFn& progress = nullptr);
  [[nodiscard]] absl::Status SaveHfCheckpoint(const std::string& dir, DType dtype,
                                              const HfExportOptions& options) const;
  [[nodiscard]] absl::Status SaveGpt2Safetensors(const std::string& path, DType dtype) const;
  // LoRA (see model/gpt_model.h). FailedPrecondition without a LoRA configuration.
  [[nodiscard]] absl::Status LoadPeftAdapter(const std::string& dir);
  [[nodiscard]] absl::Status SavePeftAdapter(const std::string& dir, DType dtype,
                                             const std::string& base_model_name_or_path) const;
  [[nodiscard]] absl::Status SaveMergedHfCheckpoint(const std::string& dir, DType dtype,
                                                    const HfExportOptions& options) const;
  [[nodiscard]] absl::StatusOr<std::string> BaseFingerprint() const;

  // The training state (see GptModel::LoadTrainingState and VisitTrainingState).
  using TrainingStateFillFn =
      std::function<absl::Status(absl::string_view name, ChunkType type, absl::Span<float> out)>;
  [[nodiscard]] absl::Status LoadTrainingState(const TrainingStateFillFn& fill);
  using TrainingStateVisitFn = std::function<absl::Status(absl::string_view name, ChunkType type,
                                                          absl::Span<const float> values)>;
  [[nodiscard]] absl::Status VisitTrainingState(const TrainingStateVisitFn& visit) const;
  // The tensors VisitTrainingState visits, in its order (ParameterNames' order, each name's
  // kMaster, kMomentum, kVariance), without reading them: what a checkpoint file holds.
  std::vector<TrainingStateTensor> TrainingStateTensors() const;
  bool HoldsTrainingState(absl::string_view name) const;
  std::vector<std::string> ParameterNames() const;
  std::vector<TensorSpec> ParameterSpecs() const;

  // Staged reads (see GptModel::ReadTensor, ReadTensorInto, ReadTensorRange).
  [[nodiscard]] absl::StatusOr<std::vector<float>> ReadTensor(ChunkType type,
                                                              absl::string_view name) const;
  [[nodiscard]] absl::Status ReadTensorInto(ChunkType type, absl::string_view name,
                                            absl::Span<float> out) const;
  [[nodiscard]] absl::Status ReadTensorRange(ChunkType type, absl::string_view name,
                                             int64_t first_elem, absl::Span<float> out) const;

 private:
  // The optimizer-state chunks of one index accessed on the host for reading
  // (internal/model_state_io_parts.h; see "Reading what is not in memory" in the file comment).
  class HostReadAccess;

  // ReadTensorRange's work: chunks without a payload are accessed through `access`, which the
  // caller releases.
  absl::Status ReadRange(ChunkType type, absl::string_view name, int64_t first_elem,
                         absl::Span<float> out, HostReadAccess& access) const;
  // FailedPrecondition naming `caller` inside an iteration or (LoRA) without a LoRA
  // configuration, and for world size > 1 when `whole_model`.
  absl::Status CheckExport(absl::string_view caller, bool need_lora, bool whole_model) const;
  // The chunk type to read for `type` of a tensor in chunk `chunk_index`: kParam for kMaster of
  // a frozen chunk (its only payload); FailedPrecondition naming `name` for kMomentum/kVariance
  // of a frozen chunk.
  absl::StatusOr<ChunkType> ReadableType(ChunkType type, int64_t chunk_index,
                                         absl::string_view name) const;
  // The row blocks of Hugging Face tensor `name`, or nullptr.
  const std::vector<RowBlock>* BlocksOf(absl::string_view name) const;
  // Elements [first_elem, first_elem + out.size()) of the payload `v`, converted to f32 into
  // `out`: in place for a host payload, through the staging buffer for an accelerator payload.
  // REQUIRES: the range lies inside v.
  absl::Status ReadPayloadRange(const TensorView& v, int64_t first_elem,
                                absl::Span<float> out) const;
  // Writes f32 values into the tensor's master slot and its param slot (rounded), zeroes momentum
  // and variance. REQUIRES: the tensor's chunks are accessed on the host.
  // A 4-bit weight is quantized on `quant_pool` (may be null).
  // Elements [first_elem, first_elem + values.size()) of a tensor that is not 4-bit, as
  // WriteParameter writes them (master, param rounded, moments zeroed; frozen: param only).
  absl::Status WriteParameterRange(TensorId tensor, int64_t first_elem,
                                   absl::Span<const float> values);
  // Fills elements [first_elem, first_elem + count) of trainable tensor `tensor` (not 4-bit)
  // straight into its master slot, then writes the rest of it as WriteParameterRange does.
  absl::Status FillParameterRangeInPlace(TensorId tensor, int64_t first_elem, int64_t count,
                                         const ParameterRangeFillFn& fill);
  // SetParameters' progress: the units of the tensors it will set, counted up front, and what
  // is done, reported under a lock (base/progress.h's one-thread-at-a-time contract).
  class SetProgress {
   public:
    SetProgress(const ModelStateIo& io, const std::function<bool(TensorId)>& include,
                const ProgressFn& progress, const ProgressUnitsFn& units);
    int64_t units(TensorId tensor) const;
    void Add(int64_t units);
    void Finish();

   private:
    const ModelStateIo& io_;
    const ProgressFn& progress_;
    const ProgressUnitsFn& units_;
    int64_t total_ = 0;
    Mutex mu_;
    int64_t done_ ABSL_GUARDED_BY(mu_) = 0;
  };
  absl::Status WriteParameter(TensorId tensor, absl::Span<const float> values,
                              ThreadPool* quant_pool);
  // Copies `bytes` of accelerator memory at `src` through the staging buffer, after the compute
  // stream's work so far, in pieces of a multiple of `piece_quantum` bytes: consume(host, offset,
  // bytes) for each.
  absl::Status StagedRead(
      const char* src, int64_t bytes, int64_t piece_quantum,
      absl::FunctionRef<absl::Status(const void* host, int64_t offset, int64_t bytes)> consume)
      const;
  // The whole payload `v` as raw bytes into `out` (v.bytes() of them): a copy for a host
  // payload, through the staging buffer for an accelerator payload.
  absl::Status ReadPayloadBytes(const TensorView& v, absl::Span<char> out) const;
  // Logical elements [first_elem, first_elem + out.size()) of 4-bit weight `tensor` (format `q`,
  // stored blob `v`), dequantized (model_state_io_quant4.cc).
  absl::Status ReadQuant4Range(TensorId tensor, const Quant4Format& q, const TensorView& v,
                               int64_t first_elem, absl::Span<float> out) const;
  // Quantizes the logical values of 4-bit weight `tensor` into its blob (host payload) and
  // records its nested offset.
  absl::Status WriteQuant4(TensorId tensor, const Quant4Format& q, absl::Span<const float> values,
                           ThreadPool* pool);
  // Lets `blob_fill` write 4-bit weight `tensor`'s blob (host payload, zeroed first) and records
  // the offset; false when it declined.
  absl::StatusOr<bool> WriteQuant4Blob(TensorId tensor, const Quant4BlobFillFn& blob_fill);
  // InternalError naming `what` unless `v` is in host memory (the imports write only there).
  static absl::Status RequireHostPayload(const TensorView& v, absl::string_view what);

  const Parts parts_;
  // Guards the writes of Parts::quant4's nested offsets (SetParameters may set tensors on
  // several threads).
  Mutex quant4_mu_;

  // The staging of accelerator payloads (ReadPayloadRange), created on first use. Guarded by
  // staging_mu_ so that const readers stay safe to call from several threads.
  mutable Mutex staging_mu_;
  mutable Backend* staging_backend_ ABSL_GUARDED_BY(staging_mu_) = nullptr;
  mutable std::unique_ptr<Stream> staging_stream_ ABSL_GUARDED_BY(staging_mu_);
  // Recorded on the compute stream before each staged copy, which waits for it.
  mutable std::unique_ptr<Event> staging_event_ ABSL_GUARDED_BY(staging_mu_);
  mutable void* staging_ ABSL_GUARDED_BY(staging_mu_) = nullptr;
};

}  // namespace ps

#endif  // PATRICKSTAR_MODEL_MODEL_STATE_IO_H_
