#include "model/gpt_model.h"

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/string_view.h"
#include "absl/types/span.h"
#include "base/status_macros.h"
#include "base/thread_pool.h"
#include "base/units.h"
#include "chunk/chunk_layout.h"
#include "chunk/chunk_store.h"
#include "chunk/chunk_type.h"
#include "chunk/operator_spec.h"
#include "chunk/tensor_state.h"
#include "glog/logging.h"
#include "memory/backend.h"
#include "memory/device.h"
#include "memory/device_memory.h"
#include "memory/dtype.h"
#include "memory/resources.h"
#include "model/gpt2_checkpoint.h"
#include "model/gpt_config.h"
#include "model/hf_checkpoint.h"
#include "model/kernels/kernels.h"
#include "model/kernels/kernels_factory.h"
#include "model/kernels/vocab_blocks.h"
#include "model/live_program_context.h"
#include "model/lora_config.h"
#include "model/model_config.h"
#include "model/model_state_io.h"
#include "model/parameter_init.h"
#include "model/transformer_block_spec.h"
#include "model/transformer_program.h"
#include "scheduler/chunk_manager.h"

namespace ps {

// --- Helpers
// --------------------------------------------------------------------------------------

namespace {

// The host runs ahead of the compute stream, so an error can return while kernels and copies it
// enqueued are still queued (reading the caller's tokens, say): on an error path the host waits
// for the stream before ForwardBackward or Evaluate returns.
class WaitOnError {
 public:
  explicit WaitOnError(Stream* stream) : stream_(stream) {}
  WaitOnError(const WaitOnError&) = delete;
  WaitOnError& operator=(const WaitOnError&) = delete;
  ~WaitOnError() {
    if (stream_ == nullptr) return;
    const absl::Status s = stream_->Synchronize();
    VLOG_IF(1, !s.ok()) << "GptModel: the compute stream failed on an error path: " << s;
  }
  void Dismiss() { stream_ = nullptr; }

 private:
  Stream* stream_;
};

}  // namespace

std::vector<OperatorSpec> ModelOperatorsFor(const ModelConfig& config,
                                            const std::optional<LoraConfig>& lora,
                                            const VocabLayoutOptions& vocab,
                                            const std::optional<Quant4Config>& quant4,
                                            DType dtype) {
  if (!lora.has_value()) {
    CHECK(!quant4.has_value()) << "a 4-bit base needs LoRA";
    return ModelOperators(config, vocab);
  }
  std::vector<OperatorSpec> ops = LoraModelOperators(config, *lora, vocab);
  if (!quant4.has_value()) return ops;
  return Quant4StoredOperators(std::move(ops), Quant4Weights(config, *lora, *quant4), dtype);
}

// --- Construction
// ---------------------------------------------------------------------------------

GptModel::GptModel(const ModelConfig& config, const GptConfig& gpt, ChunkStore* store,
                   ChunkManager* manager, DeviceMemory* accelerator, const GptModelOptions& options)
    : model_config_(config),
      config_(gpt),
      spec_(BlockSpecOf(config)),
      options_(options),
      store_(store),
      manager_(manager),
      accelerator_(accelerator) {}

GptModel::~GptModel() = default;

absl::StatusOr<Backend*> GptModel::AcceleratorBackend() const {
  return AcceleratorBackendOf(*accelerator_);
}

absl::StatusOr<std::unique_ptr<GptModel>> GptModel::Create(const GptConfig& config,
                                                           ChunkStore* store, ChunkManager* manager,
                                                           DeviceMemory* accelerator,
                                                           const GptModelOptions& options) {
  RETURN_IF_ERROR(ValidateGptConfig(config));
  return CreateImpl(FromGptConfig(config), config, store, manager, accelerator, options);
}

absl::StatusOr<std::unique_ptr<GptModel>> GptModel::Create(const ModelConfig& config,
                                                           ChunkStore* store, ChunkManager* manager,
                                                           DeviceMemory* accelerator,
                                                           const GptModelOptions& options) {
  RETURN_IF_ERROR(ValidateModelConfig(config));
  if (config.architecture() == ModelArchitecture::kGpt2) {
    ASSIGN_OR_RETURN(GptConfig gpt, ToGptConfig(config));
    return CreateImpl(config, gpt, store, manager, accelerator, options);
  }
  const GptConfig view{.name = config.name,
                       .vocab_size = config.vocab_size,
                       .max_seq_len = config.max_position_embeddings,
                       .hidden = config.hidden_size,
                       .num_layers = config.num_layers,
                       .num_heads = config.num_heads};
  return CreateImpl(config, view, store, manager, accelerator, options);
}

absl::StatusOr<std::unique_ptr<GptModel>> GptModel::CreateImpl(
    const ModelConfig& mconfig, const GptConfig& config, ChunkStore* store, ChunkManager* manager,
    DeviceMemory* accelerator, const GptModelOptions& options) {
  if (store == nullptr || manager == nullptr || accelerator == nullptr) {
    return absl::InvalidArgumentError(
        "GptModel::Create: store, manager and accelerator must not be null");
  }
  GptModelOptions o = options;
  if (o.seq_len == 0) o.seq_len = config.max_seq_len;
  const std::pair<const char*, int64_t> positive[] = {{"batch", o.batch},
                                                      {"seq_len", o.seq_len},
                                                      {"threads", o.threads},
                                                      {"attention_tile", o.attention_tile},
                                                      {"ce_row_tile", o.ce_row_tile},
                                                      {"ce_vocab_tile", o.ce_vocab_tile}};
  for (const auto& [field, value] : positive) {
    if (value <= 0) {
      return absl::InvalidArgumentError(
          absl::StrCat("GptModelOptions.", field, " must be positive, got ", value));
    }
  }
  if (o.payload_staging_bytes < static_cast<int64_t>(sizeof(float))) {
    return absl::InvalidArgumentError(
        absl::StrCat("GptModelOptions.payload_staging_bytes must be at least ", sizeof(float),
                     " (one f32 element), got ", o.payload_staging_bytes));
  }
  if (o.seq_len > config.max_seq_len) {
    return absl::InvalidArgumentError(absl::StrCat(
        "GptModelOptions.seq_len ", o.seq_len, " exceeds the model's ", config.max_seq_len,
        " positions (GptConfig.max_seq_len of '", config.name, "'); use a shorter sequence"));
  }
  if (o.lora.has_value()) RETURN_IF_ERROR(ValidateLoraConfig(mconfig, *o.lora));
  if (o.quant4.has_value()) {
    RETURN_IF_ERROR(ValidateQuant4Config(mconfig, o.lora.has_value() ? &*o.lora : nullptr,
                                         *o.quant4));
    if (o.quant4->double_quant && store->layout().world_size() > 1) {
      return absl::UnimplementedError(absl::StrCat(
          "GptModel: bnb_4bit_use_double_quant with ", store->layout().world_size(),
          " ranks is not supported: each rank quantizes its own chunks and the nested offsets "
          "would not reach the others; use bnb_4bit_use_double_quant false or one rank"));
    }
  }
  std::unique_ptr<GptModel> model(new GptModel(mconfig, config, store, manager, accelerator, o));
  ASSIGN_OR_RETURN(ProgramLayout layout, model->ResolveLayout());
  ASSIGN_OR_RETURN(
      model->program_,
      TransformerProgram::Create(
          mconfig,
          ProgramShape{
              .batch = o.batch,
              .seq_len = o.seq_len,
              .activation_checkpointing = o.activation_checkpointing,
              .attention_tile = o.attention_tile,
              .ce_row_tile = o.ce_row_tile,
              .ce_vocab_tile = o.ce_vocab_tile,
              .lora_scale = o.lora.has_value() ? static_cast<float>(o.lora->scale()) : 1.0f,
              .lora_dropout = o.lora.has_value() ? static_cast<float>(o.lora->lora_dropout) : 0.0f,
              .token_metadata = o.token_metadata},
          std::move(layout)));
  model->pool_ = std::make_unique<ThreadPool>(o.threads);
  model->kernels_ = o.kernels;
  model->stream_ = o.compute_stream;
  if (model->kernels_ == nullptr || model->stream_ == nullptr) {
    ASSIGN_OR_RETURN(Backend * backend, model->AcceleratorBackend());
    if (model->kernels_ == nullptr) {
      ASSIGN_OR_RETURN(model->owned_kernels_,
                       CreateKernels(backend, KernelsOptions{.cpu_pool = model->pool_.get()}));
      model->kernels_ = model->owned_kernels_.get();
    }
    if (model->stream_ == nullptr) {
      ASSIGN_OR_RETURN(model->owned_stream_, backend->CreateStream());
      model->stream_ = model->owned_stream_.get();
      // The manager does not know this stream: the host waits before each Release.
      model->release_wait_ = model->stream_;
    }
  }
  model->live_ = std::make_unique<LiveProgramContext>(store, manager, accelerator, model->kernels_,
                                                      model->stream_, model->release_wait_);
  ModelStateIo::Parts io{
      .model_config = &model->model_config_,
      .config = &model->config_,
      .dims = model->dims(),
      .store = store,
      .manager = manager,
      .accelerator = accelerator,
      .compute_stream = model->stream_,
      .payload_staging_bytes = o.payload_staging_bytes,
      .param_tensors = model->param_tensors_,
      .row_blocks = {},
      .lora = model->options_.lora.has_value() ? &*model->options_.lora : nullptr,
      .quant4 = model->quant4_table_.get(),
      .pool = model->pool_.get()};
  const ProgramLayout& resolved = model->program_->layout();
  for (const std::vector<ProgramLayout::VocabBlock>* blocks :
       {&resolved.embed, &resolved.lm_head}) {
    std::vector<ModelStateIo::RowBlock>& rows = io.row_blocks.emplace_back();
    for (const ProgramLayout::VocabBlock& b : *blocks) {
      rows.push_back({.tensor = b.tensor, .row_begin = b.row_begin, .rows = b.rows});
    }
  }
  model->io_ = std::make_unique<ModelStateIo>(std::move(io));
  return model;
}

absl::StatusOr<ProgramLayout> GptModel::ResolveLayout() {
  const ChunkLayout& layout = store_->layout();
  // The layout's wte split: one operator "wte", or blocks "wte[0:R]", "wte[R:2R]", ...
  const bool gpt2 = model_config_.architecture() == ModelArchitecture::kGpt2;
  const std::string embed = gpt2 ? "wte" : "model.embed_tokens";
  VocabLayoutOptions vocab;
  if (!layout.FindOperator(embed).ok()) {
    for (OperatorId op = 0; op < layout.num_operator_ids(); ++op) {
      const std::optional<RowBlockName> block = ParseRowBlockName(layout.op(op).name);
      if (block.has_value() && block->base == embed && block->row_begin == 0) {
        vocab.vocab_block_rows = block->row_end;
      }
    }
    if (vocab.vocab_block_rows == 0) {
      return absl::InvalidArgumentError(
          absl::StrCat("GptModel: the chunk layout has no operator '", embed, "' or '", embed,
                       "[0:R]' (model config '", config_.name,
                       "'); build the layout from ModelOperators(config, layout)"));
    }
  }
  // The initialization streams: a tensor's index in the unsplit order (for GPT-2 wte, wpe, then
  // the blocks' and ln_f's tensors, as before wte could be split), so that the same seed gives
  // the same model whatever the layout. LoRA: the base's tensors come first in the same order
  // (the same streams as the full model's), then the adapters'.
  for (const OperatorSpec& op : ModelOperatorsFor(model_config_, options_.lora, {})) {
    for (const TensorSpec& t : op.tensors) {
      init_stream_.emplace(t.name, static_cast<uint64_t>(init_stream_.size()));
    }
  }
  const DType dtype = store_->compute_dtype();
  const std::vector<OperatorSpec> ops =
      ModelOperatorsFor(model_config_, options_.lora, vocab, options_.quant4, dtype);
  const char* const ops_fn =
      options_.quant4.has_value()
          ? "ModelOperatorsFor(config, lora, vocab, quant4, dtype)"
          : (options_.lora.has_value() ? "LoraModelOperators(config, lora)"
                                       : "ModelOperators(config)");
  if (layout.num_operator_ids() != static_cast<int64_t>(ops.size())) {
    // Name the first operator that differs.
    std::string first;
    for (size_t i = 0; i < ops.size() || static_cast<int64_t>(i) < layout.num_operator_ids(); ++i) {
      const bool ours = i < ops.size();
      const bool theirs = static_cast<int64_t>(i) < layout.num_operator_ids();
      if (ours && theirs && ops[i].name == layout.op(static_cast<OperatorId>(i)).name) continue;
      first = ours ? absl::StrCat("; the first missing or out of place is '", ops[i].name, "'")
                   : absl::StrCat("; the first extra is '",
                                  layout.op(static_cast<OperatorId>(i)).name, "'");
      break;
    }
    return absl::InvalidArgumentError(
        absl::StrCat("GptModel: the chunk layout has ", layout.num_operator_ids(),
                     " operators but model config '", config_.name, "' has ", ops.size(), first,
                     "; build the layout from ", ops_fn));
  }
  std::vector<OperatorId> op_ids;
  std::vector<std::vector<TensorId>> tensor_ids;
  for (const OperatorSpec& spec : ops) {
    absl::StatusOr<OperatorId> op = layout.FindOperator(spec.name);
    if (!op.ok()) {
      return absl::InvalidArgumentError(
          absl::StrCat("GptModel: operator '", spec.name, "' of config '", config_.name,
                       "' is not in the chunk layout; build it from ", ops_fn));
    }
    const OperatorInfo& info = layout.op(*op);
    if (info.trainable != spec.trainable) {
      return absl::InvalidArgumentError(absl::StrCat(
          "GptModel: operator '", spec.name, "' is ", info.trainable ? "trainable" : "frozen",
          " in the chunk layout but ", spec.trainable ? "trainable" : "frozen", " in ", ops_fn));
    }
    if (info.tensors.size() != spec.tensors.size() || !info.placed()) {
      return absl::InvalidArgumentError(
          absl::StrCat("GptModel: operator '", spec.name, "' has ", info.tensors.size(),
                       " tensors in the layout (placed: ", info.placed(), "), expected ",
                       spec.tensors.size(), " placed tensors"));
    }
    op_ids.push_back(*op);
    std::vector<TensorId>& ids = tensor_ids.emplace_back();
    for (const TensorSpec& ts : spec.tensors) {
      absl::StatusOr<TensorId> t = layout.FindTensor(ts.name);
      ASSIGN_OR_RETURN(const int64_t numel, ShapeNumElems(ts.shape));
      if (!t.ok() || layout.tensor(*t).op != *op || layout.tensor(*t).numel != numel) {
        return absl::InvalidArgumentError(
            absl::StrCat("GptModel: tensor '", ts.name, "' ", ShapeString(ts.shape),
                         " of operator '", spec.name, "' is missing from the layout or differs"));
      }
      ids.push_back(*t);
      param_tensors_.push_back(*t);
    }
  }
  // The 4-bit weights: their blobs must start 16-byte aligned (Quant4AlignmentElems).
  if (options_.quant4.has_value()) {
    quant4_table_ = std::make_shared<Quant4Table>();
    quant4_table_->compute_dtype = options_.quant4->compute_dtype;
    for (const Quant4Weight& w : Quant4Weights(model_config_, *options_.lora, *options_.quant4)) {
      ASSIGN_OR_RETURN(const TensorId t, layout.FindTensor(w.tensor));
      const TensorInfo& info = layout.tensor(t);
      if (info.offset_elems % Quant4AlignmentElems(dtype) != 0) {
        return absl::InvalidArgumentError(absl::StrCat(
            "GptModel: 4-bit weight '", w.tensor, "' starts at element ", info.offset_elems,
            " of its chunk, not 16-byte aligned; build the layout with tensor_alignment_elems = ",
            Quant4AlignmentElems(dtype), " (Quant4AlignmentElems)"));
      }
      quant4_table_->format.emplace(t, w.format);
    }
  }
  // The row blocks are those of GptVocabBlocks (the same split for every vocabulary matrix).
  const std::vector<GptVocabBlock> blocks = GptVocabBlocks(config_, vocab);
  for (size_t k = 0; k < blocks.size(); ++k) {
    if (blocks[k].row_begin % options_.ce_vocab_tile != 0) {
      return absl::InvalidArgumentError(absl::StrCat(
          "GptModel: vocabulary block '", layout.op(op_ids[k]).name, "' starts at row ",
          blocks[k].row_begin,
          ", not a multiple of GptModelOptions.ce_vocab_tile = ", options_.ce_vocab_tile,
          "; blocks must hold whole LM-head vocabulary tiles (size them with "
          "GptVocabBlockRowsForChunk) so that the split cannot change results"));
    }
  }
  ProgramLayout program_layout = ProgramLayoutOf(
      model_config_, ops, blocks, [&](size_t op) { return op_ids[op]; },
      [&](size_t op, size_t j) { return tensor_ids[op][j]; });
  program_layout.quant4 = quant4_table_;
  return program_layout;
}

int64_t GptModel::vocab_block_rows() const { return program_->layout().embed.front().rows; }

Gpt2Dims GptModel::dims() const {
  return Gpt2Dims{.vocab_size = config_.vocab_size,
                  .max_positions = config_.max_seq_len,
                  .hidden = config_.hidden,
                  .num_layers = config_.num_layers};
}

absl::Status GptModel::InitializeParameters(uint64_t seed, const InitializeOptions& options) {
  if (options.adapters_only && !options_.lora.has_value()) {
    return absl::InvalidArgumentError(
        "GptModel::InitializeParameters: adapters_only needs LoRA adapters (GptModelOptions.lora "
        "is not set); initialize the whole model instead");
  }
  const ChunkLayout& layout = store_->layout();
  std::function<bool(TensorId)> include;
  if (options.adapters_only) include = [&](TensorId t) { return io_->is_adapter(t); };
  // Pieces of a tensor on several threads: FillNormal's ranges equal those of the whole.
  return io_->SetParametersInPieces(
      [&](TensorId t, int64_t first, absl::Span<float> out) {
        // A wte block draws its rows of wte's stream.
        std::string name = layout.tensor(t).name;
        int64_t first_elem = first;
        if (const std::optional<RowBlockName> block = ParseRowBlockName(name); block.has_value()) {
          name = block->base;
          first_elem += block->row_begin * config_.hidden;
        }
        if (io_->is_adapter(t)) {
          // PEFT: A Kaiming-uniform, B zeros. (Adapters are small: one piece, first == 0.)
          if (absl::EndsWith(name, ".lora_A.weight")) {
            const auto it = init_stream_.find(name);
            CHECK(it != init_stream_.end()) << "no tensor " << name;
            if (first == 0) {
              InitLoraA(seed, it->second, out, layout.tensor(t).shape.back());
            } else {
              std::vector<float> whole(static_cast<size_t>(layout.tensor(t).numel));
              InitLoraA(seed, it->second, absl::MakeSpan(whole), layout.tensor(t).shape.back());
              std::copy_n(whole.begin() + first, out.size(), out.begin());
            }
          } else {
            std::fill(out.begin(), out.end(), 0.0f);
          }
          return absl::OkStatus();
        }
        const ParameterInit init = InitOf(model_config_.architecture(), config_.num_layers, name,
                                          model_config_.norm_weight_offset());
        uint64_t stream = 0;
        if (init.kind == ParameterInit::Kind::kNormal) {
          const auto it = init_stream_.find(name);
          CHECK(it != init_stream_.end()) << "no tensor " << name;
          stream = it->second;
        }
        FillInitialValues(init, seed, stream, first_elem, out);
        return absl::OkStatus();
      },
      include, /*blob_fill=*/nullptr, options.progress);
}

absl::Status GptModel::LoadGpt2Checkpoint(const Gpt2Checkpoint& checkpoint) {
  return io_->LoadGpt2Checkpoint(checkpoint);
}

absl::Status GptModel::LoadHfCheckpoint(const HfCheckpoint& checkpoint, ProgressFn progress) {
  return io_->LoadHfCheckpoint(checkpoint, progress);
}

absl::Status GptModel::SaveHfCheckpoint(const std::string& dir, DType dtype,
                                        const HfExportOptions& options) const {
  return io_->SaveHfCheckpoint(dir, dtype, options);
}

absl::Status GptModel::LoadPeftAdapter(const std::string& dir) { return io_->LoadPeftAdapter(dir); }

absl::Status GptModel::SavePeftAdapter(const std::string& dir, DType dtype,
                                       const std::string& base_model_name_or_path) const {
  return io_->SavePeftAdapter(dir, dtype, base_model_name_or_path);
}

absl::Status GptModel::SaveMergedHfCheckpoint(const std::string& dir, DType dtype,
                                              const HfExportOptions& options) const {
  return io_->SaveMergedHfCheckpoint(dir, dtype, options);
}

absl::StatusOr<std::string> GptModel::BaseFingerprint() const { return io_->BaseFingerprint(); }

absl::Status GptModel::SaveGpt2Safetensors(const std::string& path, DType dtype) const {
  return io_->SaveGpt2Safetensors(path, dtype);
}

absl::Status GptModel::LoadTrainingState(const TrainingStateFillFn& fill) {
  return io_->LoadTrainingState(fill);
}

absl::Status GptModel::VisitTrainingState(const TrainingStateVisitFn& visit) const {
  return io_->VisitTrainingState(visit);
}

std::vector<TrainingStateTensor> GptModel::TrainingStateTensors() const {
  return io_->TrainingStateTensors();
}

bool GptModel::HoldsTrainingState(absl::string_view name) const {
  return io_->HoldsTrainingState(name);
}

std::vector<std::string> GptModel::ParameterNames() const { return io_->ParameterNames(); }

std::vector<TensorSpec> GptModel::ParameterSpecs() const { return io_->ParameterSpecs(); }

absl::StatusOr<std::vector<float>> GptModel::ReadTensor(ChunkType type,
                                                        absl::string_view name) const {
  return io_->ReadTensor(type, name);
}

absl::Status GptModel::ReadTensorInto(ChunkType type, absl::string_view name,
                                      absl::Span<float> out) const {
  return io_->ReadTensorInto(type, name, out);
}

absl::Status GptModel::ReadTensorRange(ChunkType type, absl::string_view name, int64_t first_elem,
                                       absl::Span<float> out) const {
  return io_->ReadTensorRange(type, name, first_elem, out);
}

// --- Inputs
// ---------------------------------------------------------------------------------------

absl::Status GptModel::CheckInputs(absl::Span<const int32_t> tokens,
                                   absl::Span<const int32_t> targets) const {
  const int64_t n = options_.batch * options_.seq_len;
  for (const auto& [what, span] : {std::pair{"tokens", tokens}, std::pair{"targets", targets}}) {
    if (static_cast<int64_t>(span.size()) != n) {
      return absl::InvalidArgumentError(absl::StrCat(
          "GptModel: ", what, " has ", span.size(), " elements; the model was created for batch ",
          options_.batch, " x seq_len ", options_.seq_len, " = ", n));
    }
  }
  const int64_t v = config_.vocab_size;
  for (int64_t i = 0; i < n; ++i) {
    if (tokens[i] < 0 || tokens[i] >= v) {
      return absl::InvalidArgumentError(absl::StrCat("GptModel: token id ", tokens[i],
                                                     " at position ", i, " is outside [0, ", v,
                                                     ") (vocab_size of '", config_.name, "')"));
    }
    if (targets[i] != kIgnoreIndex && (targets[i] < 0 || targets[i] >= v)) {
      return absl::InvalidArgumentError(absl::StrCat("GptModel: target ", targets[i],
                                                     " at position ", i, " is outside [0, ", v,
                                                     ") and not the ignore index ", kIgnoreIndex));
    }
  }
  return absl::OkStatus();
}

absl::Status GptModel::CheckInputs(const ModelInputs& in) const {
  RETURN_IF_ERROR(CheckInputs(in.tokens, in.targets));
  if (in.positions.empty() && in.key_start.empty()) return absl::OkStatus();
  const int64_t B = options_.batch, T = options_.seq_len, n = B * T;
  if (!options_.token_metadata) {
    return absl::InvalidArgumentError(
        "GptModel: the batch has positions and key_start but the model was created without "
        "GptModelOptions::token_metadata (its inputs buffer has no room for them)");
  }
  for (const auto& [what, span] :
       {std::pair{"positions", in.positions}, std::pair{"key_start", in.key_start}}) {
    if (static_cast<int64_t>(span.size()) != n) {
      return absl::InvalidArgumentError(absl::StrCat(
          "GptModel: ", what, " has ", span.size(), " elements; the model was created for batch ",
          B, " x seq_len ", T, " = ", n, " (positions and key_start come together)"));
    }
  }
  for (int64_t b = 0; b < B; ++b) {
    for (int64_t t = 0; t < T; ++t) {
      const int64_t i = b * T + t;
      if (in.positions[i] < 0 || in.positions[i] >= T) {
        return absl::InvalidArgumentError(
            absl::StrCat("GptModel: position ", in.positions[i], " at row ", b, ", column ", t,
                         " is outside [0, ", T, ") (seq_len)"));
      }
      if (in.key_start[i] < 0 || in.key_start[i] > t) {
        return absl::InvalidArgumentError(
            absl::StrCat("GptModel: key_start ", in.key_start[i], " at row ", b, ", column ", t,
                         " is outside [0, ", t, "] (a token attends to keys at or before it)"));
      }
      if (t > 0 && in.key_start[i] < in.key_start[i - 1]) {
        return absl::InvalidArgumentError(absl::StrCat(
            "GptModel: key_start decreases at row ", b, ", column ", t, " (", in.key_start[i - 1],
            " then ", in.key_start[i], "); it must be non-decreasing along a row"));
      }
    }
  }
  return absl::OkStatus();
}

// --- Entry points
// ---------------------------------------------------------------------------------

absl::Status GptModel::CheckParametersInSlots(absl::string_view caller) const {
  const ChunkLayout& layout = store_->layout();
  for (TensorId t : param_tensors_) {
    ASSIGN_OR_RETURN(const TensorState state, store_->tensor_state(ChunkType::kParam, t));
    if (state == TensorState::kHoldAfterBwd) {
      return absl::FailedPreconditionError(absl::StrCat(
          "GptModel::", caller, ": the param slot of '", layout.tensor(t).name,
          "' holds a gradient of the last backward, not the parameter: run the optimizer step "
          "(HybridAdam::Step, which writes the parameters back) first, or use TrainStep, or "
          "reload the parameters (InitializeParameters / LoadGpt2Checkpoint)"));
    }
  }
  return absl::OkStatus();
}

absl::StatusOr<double> GptModel::ForwardBackward(absl::Span<const int32_t> tokens,
                                                 absl::Span<const int32_t> targets,
                                                 double loss_scale, uint64_t dropout_seed) {
  return ForwardBackward(ModelInputs{.tokens = tokens, .targets = targets}, loss_scale,
                         dropout_seed);
}

absl::StatusOr<double> GptModel::ForwardBackward(const ModelInputs& in, double loss_scale,
                                                 uint64_t dropout_seed) {
  const absl::Span<const int32_t> tokens = in.tokens;
  RETURN_IF_ERROR(CheckInputs(in));
  RETURN_IF_ERROR(CheckParametersInSlots("ForwardBackward"));
  if (!(loss_scale > 0) || !std::isfinite(loss_scale)) {
    return absl::InvalidArgumentError(
        absl::StrCat("GptModel: loss_scale must be positive and finite, got ", loss_scale));
  }
  if (!manager_->in_iteration()) {
    return absl::FailedPreconditionError(
        "GptModel::ForwardBackward runs inside an iteration: call ChunkManager::BeginIteration "
        "first (or use TrainStep)");
  }
  // The batch's distinct tokens: their embedding rows get both gradient parts before one write.
  slot_of_token_.assign(static_cast<size_t>(config_.vocab_size), -1);
  int32_t slots = 0;
  for (const int32_t t : tokens) {
    if (slot_of_token_[t] < 0) slot_of_token_[t] = slots++;
  }
  WaitOnError wait(stream_);  // after the activations' stream-ordered frees
  ASSIGN_OR_RETURN(const double loss, program_->ForwardBackward(*live_,
                                                                {.tokens = tokens,
                                                                 .targets = in.targets,
                                                                 .slot_of_token = slot_of_token_,
                                                                 .dropout_seed = dropout_seed,
                                                                 .positions = in.positions,
                                                                 .key_start = in.key_start},
                                                                loss_scale));
  // Every gradient is in its slot before the optimizer (or a caller) reads it.
  wait.Dismiss();
  RETURN_IF_ERROR(stream_->Synchronize());
  return loss;
}

absl::StatusOr<double> GptModel::Evaluate(absl::Span<const int32_t> tokens,
                                          absl::Span<const int32_t> targets) {
  return Evaluate(ModelInputs{.tokens = tokens, .targets = targets});
}

absl::StatusOr<double> GptModel::Evaluate(const ModelInputs& in) {
  RETURN_IF_ERROR(CheckInputs(in));
  RETURN_IF_ERROR(CheckParametersInSlots("Evaluate"));
  if (manager_->in_iteration()) {
    return absl::FailedPreconditionError(
        "GptModel::Evaluate runs outside an iteration (its accesses are untracked); call it "
        "after EndIteration");
  }
  WaitOnError wait(stream_);
  absl::StatusOr<double> loss = program_->Evaluate(*live_, {.tokens = in.tokens,
                                                             .targets = in.targets,
                                                             .positions = in.positions,
                                                             .key_start = in.key_start});
  if (loss.ok()) wait.Dismiss();  // the program waited for the loss
  return loss;
}

}  // namespace ps
