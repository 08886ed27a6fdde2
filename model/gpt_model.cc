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
#include "memory/caching_allocator.h"
#include "memory/convert.h"
#include "memory/device.h"
#include "memory/device_memory.h"
#include "memory/dtype.h"
#include "memory/resources.h"
#include "model/gpt2_checkpoint.h"
#include "model/gpt_config.h"
#include "model/hf_checkpoint.h"
#include "model/kernels/attention.h"
#include "model/kernels/gelu.h"
#include "model/kernels/gqa_attention.h"
#include "model/kernels/kernels.h"
#include "model/kernels/kernels_factory.h"
#include "model/kernels/layernorm.h"
#include "model/kernels/linear.h"
#include "model/kernels/matmul.h"
#include "model/kernels/residual.h"
#include "model/kernels/rmsnorm.h"
#include "model/kernels/rope.h"
#include "model/kernels/swiglu.h"
#include "model/kernels/vocab_blocks.h"
#include "model/model_config.h"
#include "model/model_state_io.h"
#include "model/parameter_init.h"
#include "model/transformer_block_spec.h"
#include "scheduler/chunk_manager.h"

namespace ps {

// --- Helpers
// --------------------------------------------------------------------------------------

// An f32 allocation of the accelerator's scratch() (non-model data), freed on destruction.
class GptModel::Buffer {
 public:
  Buffer() = default;
  Buffer(CachingAllocator* allocator, Stream* stream, float* data, int64_t elems)
      : allocator_(allocator), stream_(stream), data_(data), elems_(elems) {}
  Buffer(Buffer&& other) noexcept
      : allocator_(std::exchange(other.allocator_, nullptr)),
        stream_(std::exchange(other.stream_, nullptr)),
        data_(std::exchange(other.data_, nullptr)),
        elems_(std::exchange(other.elems_, 0)) {}
  Buffer& operator=(Buffer&& other) noexcept {
    if (this != &other) {
      Reset();
      allocator_ = std::exchange(other.allocator_, nullptr);
      stream_ = std::exchange(other.stream_, nullptr);
      data_ = std::exchange(other.data_, nullptr);
      elems_ = std::exchange(other.elems_, 0);
    }
    return *this;
  }
  Buffer(const Buffer&) = delete;
  Buffer& operator=(const Buffer&) = delete;
  ~Buffer() { Reset(); }

  // Frees the buffer in stream order (CachingAllocator::DeallocateOnStream on the compute stream):
  // the host does not wait; a kernel still queued may read or write the block, so only later work
  // on the compute stream reuses it at once — anything else (another stream, the host, the chunk
  // pool through ReleaseCached) only after the stream passed this point. The allocator's (and
  // the tracker's) accounting moves now, at the same program point as the profile's
  // (model/gpt_activation_profile.h). Without events (an allocator with no event backend) the
  // host waits for the stream and frees at once.
  void Reset() {
    if (data_ == nullptr) return;
    const int64_t bytes = elems_ * static_cast<int64_t>(sizeof(float));
    absl::Status s = allocator_->DeallocateOnStream(data_, bytes, *stream_);
    if (!s.ok()) {
      VLOG(1) << "GptModel: a stream-ordered free failed (" << s << "); waiting for the stream";
      const absl::Status synced = stream_->Synchronize();
      VLOG_IF(1, !synced.ok()) << "GptModel: the compute stream failed before a free: " << synced;
      s = allocator_->Deallocate(data_, bytes);
    }
    CHECK(s.ok()) << "GptModel: freeing an activation buffer failed: " << s;
    allocator_ = nullptr;
    stream_ = nullptr;
    data_ = nullptr;
    elems_ = 0;
  }
  float* data() const { return data_; }
  int32_t* i32() const { return reinterpret_cast<int32_t*>(data_); }
  int64_t elems() const { return elems_; }
  absl::Span<float> span() const { return absl::Span<float>(data_, static_cast<size_t>(elems_)); }
  absl::Span<const float> cspan() const {
    return absl::Span<const float>(data_, static_cast<size_t>(elems_));
  }

 private:
  CachingAllocator* allocator_ = nullptr;
  Stream* stream_ = nullptr;
  float* data_ = nullptr;
  int64_t elems_ = 0;
};

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

// Access(op, stage) ... Release(op, stage); released on destruction if End() was not reached (an
// error path), so a failing kernel never leaves an operator accessed. `host_wait` is the compute
// stream when the manager does not order its work by it (GptModel::release_wait_): the host then
// waits for the operator's kernels before each Release; null when the manager shares the stream,
// and the host runs ahead.
class GptModel::ScopedAccess {
 public:
  static absl::StatusOr<ScopedAccess> Begin(ChunkManager* manager, Stream* host_wait, OperatorId op,
                                            Stage stage) {
    RETURN_IF_ERROR(manager->Access(op, stage));
    return ScopedAccess(manager, host_wait, op, stage);
  }
  ScopedAccess(ScopedAccess&& other) noexcept
      : manager_(std::exchange(other.manager_, nullptr)),
        host_wait_(other.host_wait_),
        op_(other.op_),
        stage_(other.stage_) {}
  ScopedAccess& operator=(ScopedAccess&&) = delete;
  ScopedAccess(const ScopedAccess&) = delete;
  ScopedAccess& operator=(const ScopedAccess&) = delete;
  ~ScopedAccess() {
    if (manager_ == nullptr) return;
    // An error path: the operator's queued kernels finish before its chunks may move.
    const absl::Status synced = Wait();
    VLOG_IF(1, !synced.ok()) << "GptModel: compute stream error on an error path: " << synced;
    const absl::Status s = manager_->Release(op_, stage_);
    LOG_IF(ERROR, !s.ok()) << "GptModel: releasing operator " << op_ << " after an error: " << s;
  }
  // Releases the operator: the manager may move or drop its chunks after the kernels enqueued so
  // far (stream order), or — with `host_wait` — the host first waits for them and returns the
  // stream's error first, if any (the operator is released either way).
  [[nodiscard]] absl::Status End() {
    const absl::Status synced = Wait();
    const absl::Status released = std::exchange(manager_, nullptr)->Release(op_, stage_);
    return synced.ok() ? released : synced;
  }

 private:
  ScopedAccess(ChunkManager* manager, Stream* host_wait, OperatorId op, Stage stage)
      : manager_(manager), host_wait_(host_wait), op_(op), stage_(stage) {}
  absl::Status Wait() {
    return host_wait_ == nullptr ? absl::OkStatus() : host_wait_->Synchronize();
  }
  ChunkManager* manager_;
  Stream* host_wait_;
  OperatorId op_;
  Stage stage_;
};

// An operator with a weight and an optional bias (-1 when absent): Conv1D (weight [in, out]),
// nn.Linear (weight [out, in]), LayerNorm (weight, bias [C]) or RMSNorm (weight [C]).
struct GptModel::LinearOp {
  OperatorId op = -1;
  TensorId w = -1;
  TensorId b = -1;
};

// Llama's self_attn.qkv_proj: three nn.Linear weights and optional biases.
struct GptModel::QkvOp {
  OperatorId op = -1;
  TensorId q_w = -1, k_w = -1, v_w = -1, q_b = -1, k_b = -1, v_b = -1;
};

// GPT-2: ln_1, c_attn, attn.c_proj, ln_2, c_fc, mlp.c_proj. Llama: ln_1 = input_layernorm, qkv,
// attn_proj = o_proj, ln_2 = post_attention_layernorm, c_fc = gate_proj, up, mlp_proj = down_proj.
struct GptModel::BlockOps {
  LinearOp ln_1, c_attn, attn_proj, ln_2, c_fc, mlp_proj, up;
  QkvOp qkv;
};

// What one block's backward needs from its forward (its input is kept in Activations::x). Llama
// keeps q, k (rotated), v, and up; fch is its gate projection and fch_gelu silu(gate) * up.
struct GptModel::BlockActs {
  Buffer ln1, ln1_mean, ln1_rstd, qkv, atty, lse, res2, ln2, ln2_mean, ln2_rstd, fch, fch_gelu;
  Buffer q, k, v, up;
  void Reset() { *this = BlockActs(); }
};

struct GptModel::Activations {
  // The residual stream: x[l] is block l's input, x[num_layers] the final LayerNorm's input.
  std::vector<Buffer> x;
  std::vector<BlockActs> blocks;
  Buffer lnf, lnf_mean, lnf_rstd, ce_lse;
  // The batch's distinct tokens (backward): touched_tokens[slot] = token, slot_of_token[token] =
  // slot or -1; touched_grads holds their f32 wte gradient rows (LM head's part, then the
  // embedding's added), sized for min(tokens, vocab) rows whatever the batch, so that the tide
  // does not depend on the data.
  std::vector<int32_t> slot_of_token;
  std::vector<int32_t> touched_tokens;
  Buffer touched_grads;
  // Device copies of the inputs (GptModel::InputsLayout): the loss (one double), tokens, targets
  // and (RoPE) the cos/sin tables; and of slot_of_token (backward).
  Buffer inputs;
  Buffer slots;
};

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

// A pinned host buffer for stream-ordered uploads, reused: before it is overwritten, and before it
// is freed, the host waits for the event recorded after the last copy out of it.
class PinnedUploadBuffer {
 public:
  explicit PinnedUploadBuffer(Backend* backend) : backend_(backend) {}
  PinnedUploadBuffer(const PinnedUploadBuffer&) = delete;
  PinnedUploadBuffer& operator=(const PinnedUploadBuffer&) = delete;
  ~PinnedUploadBuffer() {
    if (absl::Status s = WaitAndFree(); !s.ok()) LOG(WARNING) << "GptModel: " << s;
  }

  // At least `bytes` of pinned memory the host may fill now (no copy out of it is pending).
  absl::StatusOr<char*> Acquire(int64_t bytes) {
    // Query first: a finished copy (the usual case: the host waited for the stream since) costs
    // no wait, so the host keeps running ahead of the compute stream.
    if (event_ != nullptr && !event_->Query()) RETURN_IF_ERROR(event_->Synchronize());
    if (bytes > bytes_) {
      RETURN_IF_ERROR(WaitAndFree());
      ASSIGN_OR_RETURN(void* data, backend_->AllocatePinnedHost(bytes));
      data_ = static_cast<char*>(data);
      bytes_ = bytes;
    }
    if (event_ == nullptr) {
      ASSIGN_OR_RETURN(event_, backend_->CreateEvent());
    }
    return data_;
  }
  // Copies the first `bytes` of the buffer to `dst` on `stream`, after its work so far.
  absl::Status Upload(Stream& stream, void* dst, int64_t bytes) {
    RETURN_IF_ERROR(stream.MemcpyAsync(dst, data_, bytes, CopyKind::kHostToDevice));
    return stream.RecordEvent(event_.get());
  }

 private:
  absl::Status WaitAndFree() {
    if (data_ == nullptr) return absl::OkStatus();
    if (event_ != nullptr) RETURN_IF_ERROR(event_->Synchronize());
    void* data = std::exchange(data_, nullptr);
    bytes_ = 0;
    return backend_->FreePinnedHost(data);
  }

  Backend* const backend_;
  std::unique_ptr<Event> event_;
  char* data_ = nullptr;
  int64_t bytes_ = 0;
};

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
  std::unique_ptr<GptModel> model(new GptModel(mconfig, config, store, manager, accelerator, o));
  RETURN_IF_ERROR(model->ResolveLayout());
  if (model->spec_.positions == TransformerBlockSpec::Positions::kRope) {
    RopeConfig rope{.head_dim = mconfig.head_dim,
                    .theta = mconfig.rope_theta,
                    .scaling_type = "",
                    .llama3 = RopeLlama3Params{}};
    if (mconfig.rope_scaling.type == RopeScalingType::kLlama3) {
      const RopeScaling& rs = mconfig.rope_scaling;
      rope.scaling_type = "llama3";
      rope.llama3 = RopeLlama3Params{rs.factor, rs.low_freq_factor, rs.high_freq_factor,
                                     static_cast<double>(rs.original_max_position_embeddings)};
    }
    const size_t table = static_cast<size_t>(o.seq_len * mconfig.head_dim / 2);
    model->rope_cos_.resize(table);
    model->rope_sin_.resize(table);
    RETURN_IF_ERROR(RopeTables<float>(rope, o.seq_len, absl::MakeSpan(model->rope_cos_),
                                      absl::MakeSpan(model->rope_sin_)));
  }
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
  ModelStateIo::Parts io{.model_config = &model->model_config_,
                         .config = &model->config_,
                         .dims = model->dims(),
                         .store = store,
                         .manager = manager,
                         .accelerator = accelerator,
                         .compute_stream = model->stream_,
                         .payload_staging_bytes = o.payload_staging_bytes,
                         .param_tensors = model->param_tensors_,
                         .row_blocks = {}};
  for (const std::vector<VocabBlock>* blocks : {&model->vocab_blocks_, &model->lm_head_blocks_}) {
    std::vector<ModelStateIo::RowBlock>& rows = io.row_blocks.emplace_back();
    for (const VocabBlock& b : *blocks) {
      rows.push_back({.tensor = b.tensor, .row_begin = b.row_begin, .rows = b.rows});
    }
  }
  model->io_ = std::make_unique<ModelStateIo>(std::move(io));
  return model;
}

absl::Status GptModel::ResolveLayout() {
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
  // the same model whatever the layout.
  for (const OperatorSpec& op : ModelOperators(model_config_)) {
    for (const TensorSpec& t : op.tensors) {
      init_stream_.emplace(t.name, static_cast<uint64_t>(init_stream_.size()));
    }
  }
  const std::vector<OperatorSpec> ops = ModelOperators(model_config_, vocab);
  if (layout.num_operator_ids() != static_cast<int64_t>(ops.size())) {
    return absl::InvalidArgumentError(
        absl::StrCat("GptModel: the chunk layout has ", layout.num_operator_ids(),
                     " operators but model config '", config_.name, "' has ", ops.size(),
                     "; build the layout from ModelOperators(config)"));
  }
  std::vector<LinearOp> resolved;
  std::vector<QkvOp> qkv_resolved;
  for (const OperatorSpec& spec : ops) {
    absl::StatusOr<OperatorId> op = layout.FindOperator(spec.name);
    if (!op.ok()) {
      return absl::InvalidArgumentError(absl::StrCat("GptModel: operator '", spec.name,
                                                     "' of config '", config_.name,
                                                     "' is not in the chunk layout"));
    }
    const OperatorInfo& info = layout.op(*op);
    if (info.tensors.size() != spec.tensors.size() || !info.placed()) {
      return absl::InvalidArgumentError(
          absl::StrCat("GptModel: operator '", spec.name, "' has ", info.tensors.size(),
                       " tensors in the layout (placed: ", info.placed(), "), expected ",
                       spec.tensors.size(), " placed tensors"));
    }
    LinearOp r{.op = *op};
    std::vector<TensorId> ids;
    for (size_t i = 0; i < spec.tensors.size(); ++i) {
      const TensorSpec& ts = spec.tensors[i];
      absl::StatusOr<TensorId> t = layout.FindTensor(ts.name);
      ASSIGN_OR_RETURN(const int64_t numel, ShapeNumElems(ts.shape));
      if (!t.ok() || layout.tensor(*t).op != *op || layout.tensor(*t).numel != numel) {
        return absl::InvalidArgumentError(
            absl::StrCat("GptModel: tensor '", ts.name, "' ", ShapeString(ts.shape),
                         " of operator '", spec.name, "' is missing from the layout or differs"));
      }
      if (i == 0) r.w = *t;
      if (i == 1) r.b = *t;
      ids.push_back(*t);
      param_tensors_.push_back(*t);
    }
    if (absl::EndsWith(spec.name, "qkv_proj")) {
      // q, k, v weights, then (with biases) q, k, v biases.
      QkvOp q{.op = *op, .q_w = ids[0], .k_w = ids[1], .v_w = ids[2]};
      if (ids.size() == 6) {
        q.q_b = ids[3];
        q.k_b = ids[4];
        q.v_b = ids[5];
      }
      qkv_resolved.push_back(q);
    }
    resolved.push_back(r);
  }
  // The row blocks are those of GptVocabBlocks (the same split for every vocabulary matrix).
  const std::vector<GptVocabBlock> blocks = GptVocabBlocks(config_, vocab);
  const size_t nb = blocks.size();
  auto add_blocks = [&](size_t first, std::vector<VocabBlock>& out) -> absl::Status {
    for (size_t k = 0; k < nb; ++k) {
      const LinearOp& r = resolved[first + k];
      out.push_back({r.op, r.w, blocks[k].row_begin, blocks[k].rows});
      if (blocks[k].row_begin % options_.ce_vocab_tile != 0) {
        return absl::InvalidArgumentError(absl::StrCat(
            "GptModel: vocabulary block '", layout.op(r.op).name, "' starts at row ",
            blocks[k].row_begin,
            ", not a multiple of GptModelOptions.ce_vocab_tile = ", options_.ce_vocab_tile,
            "; blocks must hold whole LM-head vocabulary tiles (size them with "
            "GptVocabBlockRowsForChunk) so that the split cannot change results"));
      }
    }
    return absl::OkStatus();
  };
  RETURN_IF_ERROR(add_blocks(0, vocab_blocks_));
  const int64_t L = model_config_.num_layers;
  if (gpt2) {
    wpe_op_ = resolved[nb].op;
    wpe_ = resolved[nb].w;
    const size_t first_layer = 1 + nb;
    for (int64_t l = 0; l < L; ++l) {
      const LinearOp* r = &resolved[first_layer + 6 * l];
      blocks_.push_back(BlockOps{r[0], r[1], r[2], r[3], r[4], r[5], LinearOp{}, QkvOp{}});
    }
    ln_f_ = std::make_unique<LinearOp>(resolved.back());
    return absl::OkStatus();
  }
  // Llama: per layer input_layernorm, qkv_proj, o_proj, post_attention_layernorm, gate, up, down.
  for (int64_t l = 0; l < L; ++l) {
    const LinearOp* r = &resolved[nb + 7 * l];
    blocks_.push_back(BlockOps{.ln_1 = r[0],
                               .c_attn = r[1],
                               .attn_proj = r[2],
                               .ln_2 = r[3],
                               .c_fc = r[4],
                               .mlp_proj = r[6],
                               .up = r[5],
                               .qkv = qkv_resolved[static_cast<size_t>(l)]});
  }
  ln_f_ = std::make_unique<LinearOp>(resolved[nb + 7 * static_cast<size_t>(L)]);
  if (!spec_.tied_lm_head) {
    RETURN_IF_ERROR(add_blocks(nb + 7 * static_cast<size_t>(L) + 1, lm_head_blocks_));
  }
  return absl::OkStatus();
}

int64_t GptModel::vocab_block_rows() const { return vocab_blocks_.front().rows; }

VocabBlockShape GptModel::BlockShape(const VocabBlock& b) const {
  return VocabBlockShape{.rows = options_.batch * options_.seq_len,
                         .channels = config_.hidden,
                         .vocab_size = config_.vocab_size,
                         .row_begin = b.row_begin,
                         .block_rows = b.rows,
                         .row_tile = options_.ce_row_tile,
                         .vocab_tile = options_.ce_vocab_tile,
                         .ignore_index = kIgnoreIndex};
}

Gpt2Dims GptModel::dims() const {
  return Gpt2Dims{.vocab_size = config_.vocab_size,
                  .max_positions = config_.max_seq_len,
                  .hidden = config_.hidden,
                  .num_layers = config_.num_layers};
}

// --- Buffers and parameter slots --------------------------------------------------------------

absl::StatusOr<GptModel::Buffer> GptModel::Alloc(int64_t elems, bool zero) {
  CachingAllocator* scratch = accelerator_->scratch();
  ASSIGN_OR_RETURN(
      void* p, scratch->AllocateOnStream(elems * static_cast<int64_t>(sizeof(float)), *stream_));
  Buffer buffer(scratch, stream_, static_cast<float*>(p), elems);
  if (zero) {
    RETURN_IF_ERROR(kernels_->Zero(*stream_, p, elems * static_cast<int64_t>(sizeof(float))));
  }
  return buffer;
}

absl::StatusOr<GptModel::Buffer> GptModel::Workspace(int64_t bytes) {
  if (bytes == 0) return Buffer();
  return Alloc(CeilDiv(bytes, static_cast<int64_t>(sizeof(float))), false);
}

absl::StatusOr<GptModel::Buffer> GptModel::ParamF32(TensorId tensor,
                                                    absl::Span<const float>* values) {
  ASSIGN_OR_RETURN(TensorView v, store_->View(ChunkType::kParam, tensor));
  if (v.dtype == DType::kF32) {
    *values =
        absl::Span<const float>(static_cast<const float*>(v.data), static_cast<size_t>(v.numel));
    return Buffer();
  }
  ASSIGN_OR_RETURN(Buffer buffer, Alloc(v.numel, /*zero=*/false));
  RETURN_IF_ERROR(
      kernels_->Convert(*stream_, v.dtype, v.data, DType::kF32, buffer.data(), v.numel));
  *values = buffer.cspan();
  return buffer;
}

absl::StatusOr<std::optional<absl::Span<const uint16_t>>> GptModel::ParamBf16(TensorId tensor) {
  ASSIGN_OR_RETURN(TensorView v, store_->View(ChunkType::kParam, tensor));
  if (v.dtype != DType::kBF16) return std::nullopt;
  return absl::Span<const uint16_t>(static_cast<const uint16_t*>(v.data),
                                    static_cast<size_t>(v.numel));
}

absl::Status GptModel::WriteGrad(TensorId tensor, absl::Span<const float> grad) {
  ASSIGN_OR_RETURN(TensorView v, store_->View(ChunkType::kParam, tensor));
  CHECK_EQ(v.numel, static_cast<int64_t>(grad.size()));
  return kernels_->Convert(*stream_, DType::kF32, grad.data(), v.dtype, v.data, v.numel);
}

absl::Status GptModel::WriteGradRows(TensorId tensor, int64_t first_row, int64_t rows,
                                     const float* grad) {
  ASSIGN_OR_RETURN(TensorView v, store_->View(ChunkType::kParam, tensor));
  const int64_t c = config_.hidden;
  CHECK_LE((first_row + rows) * c, v.numel);
  return kernels_->Convert(*stream_, DType::kF32, grad, v.dtype,
                           static_cast<char*>(v.data) + first_row * c * SizeOf(v.dtype), rows * c);
}

absl::Status GptModel::InitializeParameters(uint64_t seed) {
  const ChunkLayout& layout = store_->layout();
  return io_->SetParameters([&](TensorId t, absl::Span<float> out) {
    // A wte block draws its rows of wte's stream.
    std::string name = layout.tensor(t).name;
    int64_t first_elem = 0;
    if (const std::optional<RowBlockName> block = ParseRowBlockName(name); block.has_value()) {
      name = block->base;
      first_elem = block->row_begin * config_.hidden;
    }
    const ParameterInit init = InitOf(model_config_.architecture(), config_.num_layers, name);
    uint64_t stream = 0;
    if (init.kind == ParameterInit::Kind::kNormal) {
      const auto it = init_stream_.find(name);
      CHECK(it != init_stream_.end()) << "no tensor " << name;
      stream = it->second;
    }
    FillInitialValues(init, seed, stream, first_elem, out);
    return absl::OkStatus();
  });
}

absl::Status GptModel::LoadGpt2Checkpoint(const Gpt2Checkpoint& checkpoint) {
  return io_->LoadGpt2Checkpoint(checkpoint);
}

absl::Status GptModel::LoadHfCheckpoint(const HfCheckpoint& checkpoint) {
  return io_->LoadHfCheckpoint(checkpoint);
}

absl::Status GptModel::SaveHfCheckpoint(const std::string& dir, DType dtype,
                                        const HfExportOptions& options) const {
  return io_->SaveHfCheckpoint(dir, dtype, options);
}

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

// --- Forward
// --------------------------------------------------------------------------------------

absl::Status GptModel::LinearForward(const LinearOp& op, int64_t in_features, int64_t out_features,
                                     absl::Span<const float> x, absl::Span<float> y) {
  ASSIGN_OR_RETURN(ScopedAccess access,
                   ScopedAccess::Begin(manager_, release_wait_, op.op, Stage::kForward));
  const MatmulShape shape{options_.batch * options_.seq_len, in_features, out_features};
  absl::Span<const float> w, b;
  ASSIGN_OR_RETURN(const std::optional<absl::Span<const uint16_t>> w_bf16, ParamBf16(op.w));
  if (w_bf16.has_value()) {
    // bf16 chunks: the GEMM reads the chunk's bf16 weights in place (matmul.h, bf16 variants).
    ASSIGN_OR_RETURN(Buffer b_f32, ParamF32(op.b, &b));
    const int64_t ws_bytes = kernels_->MatmulBf16ForwardWorkspaceBytes(shape);
    ASSIGN_OR_RETURN(Buffer ws, Workspace(ws_bytes));
    RETURN_IF_ERROR(kernels_->MatmulForwardBf16(*stream_, shape, x.data(), w_bf16->data(), b.data(),
                                                y.data(), ws.data(), ws_bytes));
    return access.End();
  }
  ASSIGN_OR_RETURN(Buffer w_f32, ParamF32(op.w, &w));
  ASSIGN_OR_RETURN(Buffer b_f32, ParamF32(op.b, &b));
  const int64_t ws_bytes = kernels_->MatmulWorkspaceBytes(shape);
  ASSIGN_OR_RETURN(Buffer ws, Workspace(ws_bytes));
  RETURN_IF_ERROR(kernels_->MatmulForward(*stream_, shape, x.data(), w.data(), b.data(), y.data(),
                                          ws.data(), ws_bytes));
  w_f32.Reset();
  b_f32.Reset();
  return access.End();
}

absl::Status GptModel::LayerNormFwd(const LinearOp& op, absl::Span<const float> x, Buffer& y,
                                    Buffer& mean, Buffer& rstd) {
  const int64_t n = options_.batch * options_.seq_len, c = config_.hidden;
  ASSIGN_OR_RETURN(y, Alloc(n * c, false));
  ASSIGN_OR_RETURN(mean, Alloc(n, false));
  ASSIGN_OR_RETURN(rstd, Alloc(n, false));
  ASSIGN_OR_RETURN(ScopedAccess access,
                   ScopedAccess::Begin(manager_, release_wait_, op.op, Stage::kForward));
  absl::Span<const float> w, b;
  ASSIGN_OR_RETURN(Buffer w_f32, ParamF32(op.w, &w));
  ASSIGN_OR_RETURN(Buffer b_f32, ParamF32(op.b, &b));
  RETURN_IF_ERROR(kernels_->LayerNormForward(*stream_, {n, c}, x.data(), w.data(), b.data(),
                                             y.data(), mean.data(), rstd.data()));
  w_f32.Reset();
  b_f32.Reset();
  return access.End();
}

absl::Status GptModel::BlockForward(int64_t layer, absl::Span<const float> in, bool recompute,
                                    BlockActs& a, Buffer& out) {
  if (spec_.attention == TransformerBlockSpec::Attention::kGqaRope) {
    return LlamaBlockForward(layer, in, recompute, a, out);
  }
  const BlockOps& ops = blocks_[layer];
  const int64_t B = options_.batch, T = options_.seq_len, C = config_.hidden, N = B * T;
  const int64_t H = config_.num_heads;
  RETURN_IF_ERROR(LayerNormFwd(ops.ln_1, in, a.ln1, a.ln1_mean, a.ln1_rstd));
  ASSIGN_OR_RETURN(a.qkv, Alloc(N * 3 * C, false));
  RETURN_IF_ERROR(LinearForward(ops.c_attn, C, 3 * C, a.ln1.cspan(), a.qkv.span()));
  {
    const AttentionShape att{B, T, C, H, options_.attention_tile};
    ASSIGN_OR_RETURN(a.atty, Alloc(N * C, false));
    ASSIGN_OR_RETURN(a.lse, Alloc(B * H * T, false));
    const int64_t ws_bytes = kernels_->AttentionForwardWorkspaceBytes(att);
    ASSIGN_OR_RETURN(Buffer ws, Workspace(ws_bytes));
    RETURN_IF_ERROR(kernels_->AttentionForward(*stream_, att, a.qkv.data(), a.atty.data(),
                                               a.lse.data(), ws.data(), ws_bytes));
  }
  // res2 = in + attn.c_proj(atty), computed in place of the projection.
  ASSIGN_OR_RETURN(a.res2, Alloc(N * C, false));
  RETURN_IF_ERROR(LinearForward(ops.attn_proj, C, C, a.atty.cspan(), a.res2.span()));
  RETURN_IF_ERROR(Residual(in, a.res2));
  RETURN_IF_ERROR(LayerNormFwd(ops.ln_2, a.res2.cspan(), a.ln2, a.ln2_mean, a.ln2_rstd));
  ASSIGN_OR_RETURN(a.fch, Alloc(N * 4 * C, false));
  RETURN_IF_ERROR(LinearForward(ops.c_fc, C, 4 * C, a.ln2.cspan(), a.fch.span()));
  ASSIGN_OR_RETURN(a.fch_gelu, Alloc(N * 4 * C, false));
  RETURN_IF_ERROR(kernels_->GeluForward(*stream_, a.fch.elems(), a.fch.data(), a.fch_gelu.data()));
  if (recompute) return absl::OkStatus();  // the block's output is not needed again
  // out = res2 + mlp.c_proj(fch_gelu), in place of the projection.
  ASSIGN_OR_RETURN(out, Alloc(N * C, false));
  RETURN_IF_ERROR(LinearForward(ops.mlp_proj, 4 * C, C, a.fch_gelu.cspan(), out.span()));
  return Residual(a.res2.cspan(), out);
}

GptModel::InputsOffsets GptModel::InputsLayout() const {
  const int64_t N = options_.batch * options_.seq_len;
  InputsOffsets o;
  o.tokens = 2;  // after the loss (one double: two f32 elements, 8-byte aligned)
  o.targets = o.tokens + N;
  o.rope_cos = o.targets + N;
  const int64_t table = static_cast<int64_t>(rope_cos_.size());
  o.rope_sin = o.rope_cos + table;
  o.total = o.rope_sin + table;
  return o;
}

absl::Status GptModel::UploadInputs(absl::Span<const int32_t> tokens,
                                    absl::Span<const int32_t> targets, Activations& acts) {
  const InputsOffsets o = InputsLayout();
  ASSIGN_OR_RETURN(acts.inputs, Alloc(o.total, false));
  // Tokens, targets and the RoPE tables lie back to back from o.tokens: gathered in pinned
  // staging (4-byte elements each) and uploaded in one asynchronous copy.
  CHECK_EQ(o.targets, o.tokens + static_cast<int64_t>(tokens.size()));
  CHECK_EQ(o.rope_cos, o.targets + static_cast<int64_t>(targets.size()));
  const int64_t bytes = (o.total - o.tokens) * static_cast<int64_t>(sizeof(float));
  if (input_upload_ == nullptr) {
    ASSIGN_OR_RETURN(Backend * backend, AcceleratorBackend());
    input_upload_ = std::make_unique<PinnedUploadBuffer>(backend);
  }
  ASSIGN_OR_RETURN(char* staged, input_upload_->Acquire(bytes));
  const auto put = [&](int64_t offset, const void* host, size_t elems) {
    if (elems > 0) std::memcpy(staged + (offset - o.tokens) * sizeof(float), host, elems * 4);
  };
  put(o.tokens, tokens.data(), tokens.size());
  put(o.targets, targets.data(), targets.size());
  put(o.rope_cos, rope_cos_.data(), rope_cos_.size());
  put(o.rope_sin, rope_sin_.data(), rope_sin_.size());
  RETURN_IF_ERROR(input_upload_->Upload(*stream_, acts.inputs.data() + o.tokens, bytes));
  rope_dev_ = acts.inputs.data();
  return absl::OkStatus();
}

double* GptModel::LossOnDevice(const Activations& acts) const {
  return reinterpret_cast<double*>(acts.inputs.data());
}

TouchedRowsShape GptModel::TouchedShape(const Activations& acts) const {
  const int64_t N = options_.batch * options_.seq_len;
  return TouchedRowsShape{.channels = config_.hidden,
                          .vocab_size = config_.vocab_size,
                          .num_slots = std::min(N, config_.vocab_size)};
}

absl::Status GptModel::Residual(absl::Span<const float> in, Buffer& out) {
  return kernels_->ResidualForward(*stream_, out.elems(), in.data(), out.data(), out.data());
}

absl::Status GptModel::ResidualBwd(const Buffer& dout, Buffer& da, Buffer& db) {
  return kernels_->ResidualBackward(*stream_, dout.elems(), dout.data(), da.data(), db.data());
}

absl::Status GptModel::EmbeddingForward(Activations& acts) {
  const int64_t B = options_.batch, T = options_.seq_len, C = config_.hidden, N = B * T;
  const int32_t* tokens = acts.inputs.i32() + InputsLayout().tokens;
  ASSIGN_OR_RETURN(acts.x[0], Alloc(N * C, false));
  // Each block writes the rows of its tokens (16-bit rows widened as they are read); every row
  // belongs to exactly one block.
  for (const VocabBlock& b : vocab_blocks_) {
    ASSIGN_OR_RETURN(ScopedAccess access,
                     ScopedAccess::Begin(manager_, release_wait_, b.op, Stage::kForward));
    ASSIGN_OR_RETURN(TensorView v, store_->View(ChunkType::kParam, b.tensor));
    RETURN_IF_ERROR(kernels_->EmbeddingBlockForward(*stream_, BlockShape(b), tokens, v.dtype,
                                                    v.data, acts.x[0].data()));
    RETURN_IF_ERROR(access.End());
  }
  if (spec_.positions != TransformerBlockSpec::Positions::kLearned) return absl::OkStatus();
  // Then the positions: x = wte[token] + wpe[position].
  ASSIGN_OR_RETURN(ScopedAccess access,
                   ScopedAccess::Begin(manager_, release_wait_, wpe_op_, Stage::kForward));
  absl::Span<const float> wpe;
  ASSIGN_OR_RETURN(Buffer wpe_f32, ParamF32(wpe_, &wpe));
  RETURN_IF_ERROR(kernels_->PositionEmbeddingForward(*stream_, B, T, C, config_.max_seq_len,
                                                     wpe.data(), acts.x[0].data()));
  wpe_f32.Reset();
  return access.End();
}

absl::Status GptModel::LmHeadForward(Activations& acts) {
  const int64_t N = options_.batch * options_.seq_len;
  const DType dtype = store_->compute_dtype();
  const int32_t* targets = acts.inputs.i32() + InputsLayout().targets;
  ASSIGN_OR_RETURN(acts.ce_lse, Alloc(N, false));
  // The online softmax state of every row, carried across the blocks.
  ASSIGN_OR_RETURN(Buffer state, Alloc(3 * N, false));
  RETURN_IF_ERROR(
      kernels_->LmHeadStateInit(*stream_, BlockShape(head_blocks().front()), state.data()));
  for (const VocabBlock& b : head_blocks()) {
    const VocabBlockShape shape = BlockShape(b);
    const int64_t ws_bytes = kernels_->LmHeadBlockForwardWorkspaceBytes(shape, dtype);
    ASSIGN_OR_RETURN(Buffer ws, Workspace(ws_bytes));
    ASSIGN_OR_RETURN(ScopedAccess access,
                     ScopedAccess::Begin(manager_, release_wait_, b.op, Stage::kForward));
    ASSIGN_OR_RETURN(TensorView v, store_->View(ChunkType::kParam, b.tensor));
    RETURN_IF_ERROR(kernels_->LmHeadBlockForward(*stream_, shape, acts.lnf.data(), v.dtype, v.data,
                                                 targets, state.data(), ws.data(), ws_bytes));
    RETURN_IF_ERROR(access.End());
  }
  return kernels_->LmHeadFinish(*stream_, BlockShape(head_blocks().front()), targets, state.data(),
                                acts.ce_lse.data(), LossOnDevice(acts));
}

absl::StatusOr<double> GptModel::Forward(absl::Span<const int32_t> tokens,
                                         absl::Span<const int32_t> targets, ForwardMode mode,
                                         Activations& acts) {
  const int64_t L = config_.num_layers;
  acts.x.resize(L + 1);
  acts.blocks.resize(L);
  RETURN_IF_ERROR(UploadInputs(tokens, targets, acts));
  RETURN_IF_ERROR(EmbeddingForward(acts));
  for (int64_t l = 0; l < L; ++l) {
    RETURN_IF_ERROR(
        BlockForward(l, acts.x[l].cspan(), /*recompute=*/false, acts.blocks[l], acts.x[l + 1]));
    if (mode != ForwardMode::kTrain) acts.blocks[l].Reset();
    if (mode == ForwardMode::kEvaluate) acts.x[l].Reset();
  }
  RETURN_IF_ERROR(NormFwd(*ln_f_, acts.x[L].cspan(), acts.lnf, acts.lnf_mean, acts.lnf_rstd));
  if (mode == ForwardMode::kEvaluate) {
    acts.x[L].Reset();
    acts.lnf_mean.Reset();
    acts.lnf_rstd.Reset();
  }
  // The LM head (tied: the embedding blocks' second use).
  RETURN_IF_ERROR(LmHeadForward(acts));
  // The one value the host needs: the loss, copied back once the stream got there.
  double loss = 0;
  RETURN_IF_ERROR(
      stream_->MemcpyAsync(&loss, LossOnDevice(acts), sizeof(double), CopyKind::kDeviceToHost));
  RETURN_IF_ERROR(stream_->Synchronize());
  return loss;
}

// --- Backward
// -------------------------------------------------------------------------------------

absl::Status GptModel::LinearBackward(const LinearOp& op, int64_t in_features, int64_t out_features,
                                      absl::Span<const float> x, absl::Span<const float> dy,
                                      absl::Span<float> dx) {
  ASSIGN_OR_RETURN(Buffer dw, Alloc(in_features * out_features, true));
  ASSIGN_OR_RETURN(Buffer db, Alloc(out_features, true));
  ASSIGN_OR_RETURN(ScopedAccess access,
                   ScopedAccess::Begin(manager_, release_wait_, op.op, Stage::kBackward));
  const MatmulShape shape{options_.batch * options_.seq_len, in_features, out_features};
  absl::Span<const float> w, b;
  ASSIGN_OR_RETURN(const std::optional<absl::Span<const uint16_t>> w_bf16, ParamBf16(op.w));
  if (w_bf16.has_value()) {
    const int64_t ws_bytes = kernels_->MatmulBf16BackwardWorkspaceBytes(shape);
    ASSIGN_OR_RETURN(Buffer ws, Workspace(ws_bytes));
    RETURN_IF_ERROR(kernels_->MatmulBackwardBf16(*stream_, shape, x.data(), w_bf16->data(),
                                                 dy.data(), dx.data(), dw.data(), db.data(),
                                                 ws.data(), ws_bytes));
  } else {
    ASSIGN_OR_RETURN(Buffer w_f32, ParamF32(op.w, &w));
    const int64_t ws_bytes = kernels_->MatmulWorkspaceBytes(shape);
    ASSIGN_OR_RETURN(Buffer ws, Workspace(ws_bytes));
    RETURN_IF_ERROR(kernels_->MatmulBackward(*stream_, shape, x.data(), w.data(), dy.data(),
                                             dx.data(), dw.data(), db.data(), ws.data(), ws_bytes));
  }
  // This is the operator's only backward use: its slots take the gradients now.
  RETURN_IF_ERROR(WriteGrad(op.w, dw.cspan()));
  RETURN_IF_ERROR(WriteGrad(op.b, db.cspan()));
  return access.End();
}

absl::Status GptModel::LayerNormBwd(const LinearOp& op, absl::Span<const float> x,
                                    absl::Span<const float> mean, absl::Span<const float> rstd,
                                    absl::Span<const float> dy, absl::Span<float> dx) {
  const int64_t n = options_.batch * options_.seq_len, c = config_.hidden;
  ASSIGN_OR_RETURN(Buffer dw, Alloc(c, true));
  ASSIGN_OR_RETURN(Buffer db, Alloc(c, true));
  ASSIGN_OR_RETURN(ScopedAccess access,
                   ScopedAccess::Begin(manager_, release_wait_, op.op, Stage::kBackward));
  absl::Span<const float> w;
  ASSIGN_OR_RETURN(Buffer w_f32, ParamF32(op.w, &w));
  RETURN_IF_ERROR(kernels_->LayerNormBackward(*stream_, {n, c}, x.data(), w.data(), mean.data(),
                                              rstd.data(), dy.data(), dx.data(), dw.data(),
                                              db.data()));
  w_f32.Reset();
  RETURN_IF_ERROR(WriteGrad(op.w, dw.cspan()));
  RETURN_IF_ERROR(WriteGrad(op.b, db.cspan()));
  return access.End();
}

absl::Status GptModel::BlockBackward(int64_t layer, BlockActs& a, Buffer& in, Buffer& dres) {
  if (spec_.attention == TransformerBlockSpec::Attention::kGqaRope) {
    return LlamaBlockBackward(layer, a, in, dres);
  }
  const BlockOps& ops = blocks_[layer];
  const int64_t B = options_.batch, T = options_.seq_len, C = config_.hidden, N = B * T;
  // out = res2 + fcproj
  ASSIGN_OR_RETURN(Buffer dres2, Alloc(N * C, true));
  ASSIGN_OR_RETURN(Buffer dfcproj, Alloc(N * C, true));
  RETURN_IF_ERROR(ResidualBwd(dres, dres2, dfcproj));
  dres.Reset();
  ASSIGN_OR_RETURN(Buffer dfch_gelu, Alloc(N * 4 * C, true));
  RETURN_IF_ERROR(LinearBackward(ops.mlp_proj, 4 * C, C, a.fch_gelu.cspan(), dfcproj.cspan(),
                                 dfch_gelu.span()));
  dfcproj.Reset();
  a.fch_gelu.Reset();
  ASSIGN_OR_RETURN(Buffer dfch, Alloc(N * 4 * C, true));
  RETURN_IF_ERROR(
      kernels_->GeluBackward(*stream_, a.fch.elems(), a.fch.data(), dfch_gelu.data(), dfch.data()));
  a.fch.Reset();
  dfch_gelu.Reset();
  ASSIGN_OR_RETURN(Buffer dln2, Alloc(N * C, true));
  RETURN_IF_ERROR(LinearBackward(ops.c_fc, C, 4 * C, a.ln2.cspan(), dfch.cspan(), dln2.span()));
  dfch.Reset();
  a.ln2.Reset();
  RETURN_IF_ERROR(LayerNormBwd(ops.ln_2, a.res2.cspan(), a.ln2_mean.cspan(), a.ln2_rstd.cspan(),
                               dln2.cspan(), dres2.span()));
  dln2.Reset();
  a.res2.Reset();
  a.ln2_mean.Reset();
  a.ln2_rstd.Reset();
  // res2 = in + attproj
  ASSIGN_OR_RETURN(Buffer din, Alloc(N * C, true));
  ASSIGN_OR_RETURN(Buffer dattproj, Alloc(N * C, true));
  RETURN_IF_ERROR(ResidualBwd(dres2, din, dattproj));
  dres2.Reset();
  ASSIGN_OR_RETURN(Buffer datty, Alloc(N * C, true));
  RETURN_IF_ERROR(
      LinearBackward(ops.attn_proj, C, C, a.atty.cspan(), dattproj.cspan(), datty.span()));
  dattproj.Reset();
  ASSIGN_OR_RETURN(Buffer dqkv, Alloc(N * 3 * C, true));
  const AttentionShape att{B, T, C, config_.num_heads, options_.attention_tile};
  const int64_t att_ws_bytes = kernels_->AttentionBackwardWorkspaceBytes(att);
  ASSIGN_OR_RETURN(Buffer att_ws, Workspace(att_ws_bytes));
  RETURN_IF_ERROR(kernels_->AttentionBackward(*stream_, att, a.qkv.data(), a.atty.data(),
                                              a.lse.data(), datty.data(), dqkv.data(),
                                              att_ws.data(), att_ws_bytes));
  att_ws.Reset();
  datty.Reset();
  a.atty.Reset();
  a.lse.Reset();
  a.qkv.Reset();
  ASSIGN_OR_RETURN(Buffer dln1, Alloc(N * C, true));
  RETURN_IF_ERROR(LinearBackward(ops.c_attn, C, 3 * C, a.ln1.cspan(), dqkv.cspan(), dln1.span()));
  dqkv.Reset();
  a.ln1.Reset();
  RETURN_IF_ERROR(LayerNormBwd(ops.ln_1, in.cspan(), a.ln1_mean.cspan(), a.ln1_rstd.cspan(),
                               dln1.cspan(), din.span()));
  dln1.Reset();
  in.Reset();
  a.Reset();
  dres = std::move(din);
  return absl::OkStatus();
}

absl::Status GptModel::LmHeadBackward(double loss_scale, Activations& acts, Buffer& dlnf) {
  const int64_t C = config_.hidden;
  const DType dtype = store_->compute_dtype();
  const int32_t* targets = acts.inputs.i32() + InputsLayout().targets;
  for (const VocabBlock& b : head_blocks()) {
    const VocabBlockShape shape = BlockShape(b);
    // One vocabulary tile at a time (the same bits as the whole block: vocab_blocks.h), so the
    // block's gradient needs one tile of scratch. The workspace is sized for the block, which
    // covers every tile of it.
    const int64_t ws_bytes = kernels_->LmHeadBlockBackwardWorkspaceBytes(shape, dtype);
    ASSIGN_OR_RETURN(Buffer ws, Workspace(ws_bytes));
    const int64_t tile_rows =
        std::min(shape.block_rows, std::min(shape.vocab_size, shape.vocab_tile));
    ASSIGN_OR_RETURN(Buffer dblock, Alloc(tile_rows * C, false));
    ASSIGN_OR_RETURN(ScopedAccess access,
                     ScopedAccess::Begin(manager_, release_wait_, b.op, Stage::kBackward));
    ASSIGN_OR_RETURN(TensorView v, store_->View(ChunkType::kParam, b.tensor));
    for (int64_t r0 = 0; r0 < b.rows; r0 += tile_rows) {
      VocabBlockShape tile = shape;
      tile.row_begin = b.row_begin + r0;
      tile.block_rows = std::min(tile_rows, b.rows - r0);
      RETURN_IF_ERROR(kernels_->LmHeadBlockBackward(
          *stream_, tile, acts.lnf.data(), v.dtype,
          static_cast<const char*>(v.data) + r0 * C * SizeOf(v.dtype), targets, acts.ce_lse.data(),
          loss_scale, dlnf.data(), dblock.data(), ws.data(), ws_bytes));
      // The batch's rows stay in f32 for the embedding's part (tied); the tile goes into the
      // slots (its parameters are not read again).
      if (spec_.tied_lm_head) {
        RETURN_IF_ERROR(kernels_->CopyRowsToSlots(*stream_, TouchedShape(acts), tile.row_begin,
                                                  tile.block_rows, acts.slots.i32(), dblock.data(),
                                                  acts.touched_grads.data()));
      }
      RETURN_IF_ERROR(WriteGradRows(b.tensor, r0, tile.block_rows, dblock.data()));
    }
    RETURN_IF_ERROR(access.End());
  }
  return absl::OkStatus();
}

absl::Status GptModel::EmbeddingBackward(Activations& acts, Buffer& dx0) {
  const int64_t B = options_.batch, T = options_.seq_len, C = config_.hidden;
  // The embedding's part of the batch's rows, added to the LM head's in token order (no
  // parameter is read: nothing is accessed).
  RETURN_IF_ERROR(kernels_->ScatterRowsAdd(
      *stream_, TouchedShape(acts), B * T, acts.inputs.i32() + InputsLayout().tokens,
      acts.slots.i32(), dx0.data(), acts.touched_grads.data()));
  if (spec_.positions == TransformerBlockSpec::Positions::kLearned) {
    ASSIGN_OR_RETURN(Buffer dwpe, Alloc(config_.max_seq_len * C, true));
    ASSIGN_OR_RETURN(ScopedAccess access,
                     ScopedAccess::Begin(manager_, release_wait_, wpe_op_, Stage::kBackward));
    RETURN_IF_ERROR(kernels_->PositionEmbeddingBackward(*stream_, B, T, C, config_.max_seq_len,
                                                        dx0.data(), dwpe.data()));
    RETURN_IF_ERROR(WriteGrad(wpe_, dwpe.cspan()));
    RETURN_IF_ERROR(access.End());
  }
  dx0.Reset();
  // wte's last backward use: the batch's rows take their complete gradients (every block is
  // accessed, whether the batch touches it or not, so the schedule does not depend on the data).
  // Untied, this is the embedding's only backward use: its other rows' gradient is zero.
  for (auto it = vocab_blocks_.rbegin(); it != vocab_blocks_.rend(); ++it) {
    const VocabBlock& b = *it;
    ASSIGN_OR_RETURN(ScopedAccess access,
                     ScopedAccess::Begin(manager_, release_wait_, b.op, Stage::kBackward));
    ASSIGN_OR_RETURN(TensorView v, store_->View(ChunkType::kParam, b.tensor));
    if (!spec_.tied_lm_head) RETURN_IF_ERROR(kernels_->Zero(*stream_, v.data, v.bytes()));
    RETURN_IF_ERROR(kernels_->CopySlotsToRows(*stream_, TouchedShape(acts), b.row_begin, b.rows,
                                              acts.slots.i32(), acts.touched_grads.data(), v.dtype,
                                              v.data));
    RETURN_IF_ERROR(access.End());
  }
  acts.touched_grads.Reset();
  acts.slots.Reset();
  return absl::OkStatus();
}

absl::Status GptModel::Backward(absl::Span<const int32_t> tokens, double loss_scale,
                                Activations& acts) {
  const int64_t B = options_.batch, T = options_.seq_len, C = config_.hidden, N = B * T;
  const int64_t V = config_.vocab_size, L = config_.num_layers;
  // The batch's distinct tokens: their wte rows get both gradient parts before one write.
  acts.slot_of_token.assign(static_cast<size_t>(V), -1);
  acts.touched_tokens.clear();
  for (int32_t t : tokens) {
    if (acts.slot_of_token[t] < 0) {
      acts.slot_of_token[t] = static_cast<int32_t>(acts.touched_tokens.size());
      acts.touched_tokens.push_back(t);
    }
  }
  // Tied, the LM head writes every touched row before the embedding adds to it; untied, the
  // embedding's part starts from zero.
  ASSIGN_OR_RETURN(acts.touched_grads, Alloc(std::min(N, V) * C, !spec_.tied_lm_head));
  // slot_of_token on the device, uploaded asynchronously through pinned staging.
  ASSIGN_OR_RETURN(acts.slots, Alloc(V, false));
  {
    const int64_t bytes = V * static_cast<int64_t>(sizeof(int32_t));
    if (slots_upload_ == nullptr) {
      ASSIGN_OR_RETURN(Backend * backend, AcceleratorBackend());
      slots_upload_ = std::make_unique<PinnedUploadBuffer>(backend);
    }
    ASSIGN_OR_RETURN(char* staged, slots_upload_->Acquire(bytes));
    std::memcpy(staged, acts.slot_of_token.data(), static_cast<size_t>(bytes));
    RETURN_IF_ERROR(slots_upload_->Upload(*stream_, acts.slots.data(), bytes));
  }
  ASSIGN_OR_RETURN(Buffer dlnf, Alloc(N * C, true));
  RETURN_IF_ERROR(LmHeadBackward(loss_scale, acts, dlnf));
  acts.ce_lse.Reset();
  acts.lnf.Reset();
  ASSIGN_OR_RETURN(Buffer dres, Alloc(N * C, true));
  RETURN_IF_ERROR(NormBwd(*ln_f_, acts.x[L].cspan(), acts.lnf_mean.cspan(), acts.lnf_rstd.cspan(),
                          dlnf.cspan(), dres.span()));
  dlnf.Reset();
  acts.lnf_mean.Reset();
  acts.lnf_rstd.Reset();
  acts.x[L].Reset();
  for (int64_t l = L - 1; l >= 0; --l) {
    if (options_.activation_checkpointing) {
      Buffer unused;
      RETURN_IF_ERROR(
          BlockForward(l, acts.x[l].cspan(), /*recompute=*/true, acts.blocks[l], unused));
    }
    RETURN_IF_ERROR(BlockBackward(l, acts.blocks[l], acts.x[l], dres));
  }
  return EmbeddingBackward(acts, dres);
}

// --- The Llama block ----------------------------------------------------------------------------

absl::Status GptModel::NormFwd(const LinearOp& op, absl::Span<const float> x, Buffer& y,
                               Buffer& mean, Buffer& rstd) {
  if (spec_.norm == TransformerBlockSpec::Norm::kLayerNorm) {
    return LayerNormFwd(op, x, y, mean, rstd);
  }
  const int64_t n = options_.batch * options_.seq_len, c = config_.hidden;
  ASSIGN_OR_RETURN(y, Alloc(n * c, false));
  ASSIGN_OR_RETURN(rstd, Alloc(n, false));
  ASSIGN_OR_RETURN(ScopedAccess access,
                   ScopedAccess::Begin(manager_, release_wait_, op.op, Stage::kForward));
  absl::Span<const float> w;
  ASSIGN_OR_RETURN(Buffer w_f32, ParamF32(op.w, &w));
  RETURN_IF_ERROR(kernels_->RmsNormForward(*stream_, {n, c, model_config_.norm_eps}, x.data(),
                                           w.data(), y.data(), rstd.data()));
  w_f32.Reset();
  return access.End();
}

absl::Status GptModel::NormBwd(const LinearOp& op, absl::Span<const float> x,
                               absl::Span<const float> mean, absl::Span<const float> rstd,
                               absl::Span<const float> dy, absl::Span<float> dx) {
  if (spec_.norm == TransformerBlockSpec::Norm::kLayerNorm) {
    return LayerNormBwd(op, x, mean, rstd, dy, dx);
  }
  const int64_t n = options_.batch * options_.seq_len, c = config_.hidden;
  ASSIGN_OR_RETURN(Buffer dw, Alloc(c, true));
  ASSIGN_OR_RETURN(ScopedAccess access,
                   ScopedAccess::Begin(manager_, release_wait_, op.op, Stage::kBackward));
  absl::Span<const float> w;
  ASSIGN_OR_RETURN(Buffer w_f32, ParamF32(op.w, &w));
  RETURN_IF_ERROR(kernels_->RmsNormBackward(*stream_, {n, c, model_config_.norm_eps}, x.data(),
                                            w.data(), rstd.data(), dy.data(), dx.data(),
                                            dw.data()));
  w_f32.Reset();
  RETURN_IF_ERROR(WriteGrad(op.w, dw.cspan()));
  return access.End();
}

absl::Status GptModel::NnLinearFwd(TensorId w, TensorId b, int64_t in_features,
                                   int64_t out_features, absl::Span<const float> x,
                                   absl::Span<float> y) {
  absl::Span<const float> wv, bv;
  ASSIGN_OR_RETURN(Buffer w_f32, ParamF32(w, &wv));
  Buffer b_f32;
  if (b >= 0) {
    ASSIGN_OR_RETURN(b_f32, ParamF32(b, &bv));
  }
  const LinearShape shape{options_.batch * options_.seq_len, in_features, out_features, b >= 0};
  const int64_t ws_bytes = kernels_->LinearWorkspaceBytes(shape);
  ASSIGN_OR_RETURN(Buffer ws, Workspace(ws_bytes));
  return kernels_->LinearForward(*stream_, shape, x.data(), wv.data(), b >= 0 ? bv.data() : nullptr,
                                 y.data(), ws.data(), ws_bytes);
}

absl::Status GptModel::NnLinearForward(const LinearOp& op, int64_t in_features,
                                       int64_t out_features, absl::Span<const float> x,
                                       absl::Span<float> y) {
  ASSIGN_OR_RETURN(ScopedAccess access,
                   ScopedAccess::Begin(manager_, release_wait_, op.op, Stage::kForward));
  RETURN_IF_ERROR(NnLinearFwd(op.w, op.b, in_features, out_features, x, y));
  return access.End();
}

absl::Status GptModel::NnLinearBwd(TensorId w, TensorId b, int64_t in_features,
                                   int64_t out_features, absl::Span<const float> x,
                                   absl::Span<const float> dy, absl::Span<float> dx) {
  ASSIGN_OR_RETURN(Buffer dw, Alloc(in_features * out_features, true));
  Buffer db;
  if (b >= 0) {
    ASSIGN_OR_RETURN(db, Alloc(out_features, true));
  }
  absl::Span<const float> wv;
  ASSIGN_OR_RETURN(Buffer w_f32, ParamF32(w, &wv));
  const LinearShape shape{options_.batch * options_.seq_len, in_features, out_features, b >= 0};
  const int64_t ws_bytes = kernels_->LinearWorkspaceBytes(shape);
  ASSIGN_OR_RETURN(Buffer ws, Workspace(ws_bytes));
  RETURN_IF_ERROR(kernels_->LinearBackward(*stream_, shape, x.data(), wv.data(), dy.data(),
                                           dx.data(), dw.data(), b >= 0 ? db.data() : nullptr,
                                           ws.data(), ws_bytes));
  ws.Reset();
  w_f32.Reset();
  // The weight's only backward use: its slot takes the gradient now.
  RETURN_IF_ERROR(WriteGrad(w, dw.cspan()));
  if (b >= 0) RETURN_IF_ERROR(WriteGrad(b, db.cspan()));
  return absl::OkStatus();
}

absl::Status GptModel::NnLinearBackward(const LinearOp& op, int64_t in_features,
                                        int64_t out_features, absl::Span<const float> x,
                                        absl::Span<const float> dy, absl::Span<float> dx) {
  ASSIGN_OR_RETURN(ScopedAccess access,
                   ScopedAccess::Begin(manager_, release_wait_, op.op, Stage::kBackward));
  RETURN_IF_ERROR(NnLinearBwd(op.w, op.b, in_features, out_features, x, dy, dx));
  return access.End();
}

absl::Status GptModel::LlamaBlockForward(int64_t layer, absl::Span<const float> in, bool recompute,
                                         BlockActs& a, Buffer& out) {
  const BlockOps& ops = blocks_[layer];
  const ModelConfig& m = model_config_;
  const int64_t B = options_.batch, T = options_.seq_len, C = m.hidden_size, N = B * T;
  const int64_t Q = m.q_size(), K = m.kv_size(), I = m.intermediate_size;
  RETURN_IF_ERROR(NormFwd(ops.ln_1, in, a.ln1, a.ln1_mean, a.ln1_rstd));
  ASSIGN_OR_RETURN(a.q, Alloc(N * Q, false));
  ASSIGN_OR_RETURN(a.k, Alloc(N * K, false));
  ASSIGN_OR_RETURN(a.v, Alloc(N * K, false));
  {
    const QkvOp& qkv = ops.qkv;
    ASSIGN_OR_RETURN(ScopedAccess access,
                     ScopedAccess::Begin(manager_, release_wait_, qkv.op, Stage::kForward));
    RETURN_IF_ERROR(NnLinearFwd(qkv.q_w, qkv.q_b, C, Q, a.ln1.cspan(), a.q.span()));
    RETURN_IF_ERROR(NnLinearFwd(qkv.k_w, qkv.k_b, C, K, a.ln1.cspan(), a.k.span()));
    RETURN_IF_ERROR(NnLinearFwd(qkv.v_w, qkv.v_b, C, K, a.ln1.cspan(), a.v.span()));
    RETURN_IF_ERROR(access.End());
  }
  const int64_t D = m.head_dim;
  const float* cos = rope_dev_ + InputsLayout().rope_cos;
  const float* sin = rope_dev_ + InputsLayout().rope_sin;
  RETURN_IF_ERROR(kernels_->RopeForward(*stream_, {B, T, m.num_heads, D, T}, cos, sin, a.q.data()));
  RETURN_IF_ERROR(
      kernels_->RopeForward(*stream_, {B, T, m.num_kv_heads, D, T}, cos, sin, a.k.data()));
  {
    const GqaAttentionShape att{B, T, m.num_heads, m.num_kv_heads, D, options_.attention_tile};
    ASSIGN_OR_RETURN(a.atty, Alloc(N * Q, false));
    ASSIGN_OR_RETURN(a.lse, Alloc(B * m.num_heads * T, false));
    const int64_t ws_bytes = kernels_->GqaAttentionForwardWorkspaceBytes(att);
    ASSIGN_OR_RETURN(Buffer ws, Workspace(ws_bytes));
    RETURN_IF_ERROR(kernels_->GqaAttentionForward(*stream_, att, a.q.data(), a.k.data(), a.v.data(),
                                                  a.atty.data(), a.lse.data(), ws.data(),
                                                  ws_bytes));
  }
  // res2 = in + o_proj(att), computed in place of the projection.
  ASSIGN_OR_RETURN(a.res2, Alloc(N * C, false));
  RETURN_IF_ERROR(NnLinearForward(ops.attn_proj, Q, C, a.atty.cspan(), a.res2.span()));
  RETURN_IF_ERROR(Residual(in, a.res2));
  RETURN_IF_ERROR(NormFwd(ops.ln_2, a.res2.cspan(), a.ln2, a.ln2_mean, a.ln2_rstd));
  ASSIGN_OR_RETURN(a.fch, Alloc(N * I, false));
  RETURN_IF_ERROR(NnLinearForward(ops.c_fc, C, I, a.ln2.cspan(), a.fch.span()));
  ASSIGN_OR_RETURN(a.up, Alloc(N * I, false));
  RETURN_IF_ERROR(NnLinearForward(ops.up, C, I, a.ln2.cspan(), a.up.span()));
  ASSIGN_OR_RETURN(a.fch_gelu, Alloc(N * I, false));
  RETURN_IF_ERROR(kernels_->SwiGluForward(*stream_, a.fch.elems(), a.fch.data(), a.up.data(),
                                          a.fch_gelu.data()));
  if (recompute) return absl::OkStatus();  // the block's output is not needed again
  // out = res2 + down_proj(h), in place of the projection.
  ASSIGN_OR_RETURN(out, Alloc(N * C, false));
  RETURN_IF_ERROR(NnLinearForward(ops.mlp_proj, I, C, a.fch_gelu.cspan(), out.span()));
  return Residual(a.res2.cspan(), out);
}

absl::Status GptModel::LlamaBlockBackward(int64_t layer, BlockActs& a, Buffer& in, Buffer& dres) {
  const BlockOps& ops = blocks_[layer];
  const ModelConfig& m = model_config_;
  const int64_t B = options_.batch, T = options_.seq_len, C = m.hidden_size, N = B * T;
  const int64_t Q = m.q_size(), K = m.kv_size(), I = m.intermediate_size, D = m.head_dim;
  // out = res2 + down
  ASSIGN_OR_RETURN(Buffer dres2, Alloc(N * C, true));
  ASSIGN_OR_RETURN(Buffer ddown, Alloc(N * C, true));
  RETURN_IF_ERROR(ResidualBwd(dres, dres2, ddown));
  dres.Reset();
  ASSIGN_OR_RETURN(Buffer dh, Alloc(N * I, true));
  RETURN_IF_ERROR(
      NnLinearBackward(ops.mlp_proj, I, C, a.fch_gelu.cspan(), ddown.cspan(), dh.span()));
  ddown.Reset();
  a.fch_gelu.Reset();
  ASSIGN_OR_RETURN(Buffer dgate, Alloc(N * I, true));
  ASSIGN_OR_RETURN(Buffer dup, Alloc(N * I, true));
  RETURN_IF_ERROR(kernels_->SwiGluBackward(*stream_, a.fch.elems(), a.fch.data(), a.up.data(),
                                           dh.data(), dgate.data(), dup.data()));
  dh.Reset();
  a.fch.Reset();
  a.up.Reset();
  ASSIGN_OR_RETURN(Buffer dln2, Alloc(N * C, true));
  RETURN_IF_ERROR(NnLinearBackward(ops.c_fc, C, I, a.ln2.cspan(), dgate.cspan(), dln2.span()));
  dgate.Reset();
  RETURN_IF_ERROR(NnLinearBackward(ops.up, C, I, a.ln2.cspan(), dup.cspan(), dln2.span()));
  dup.Reset();
  a.ln2.Reset();
  RETURN_IF_ERROR(NormBwd(ops.ln_2, a.res2.cspan(), a.ln2_mean.cspan(), a.ln2_rstd.cspan(),
                          dln2.cspan(), dres2.span()));
  dln2.Reset();
  a.res2.Reset();
  a.ln2_rstd.Reset();
  // res2 = in + o_proj(att)
  ASSIGN_OR_RETURN(Buffer din, Alloc(N * C, true));
  ASSIGN_OR_RETURN(Buffer dattproj, Alloc(N * C, true));
  RETURN_IF_ERROR(ResidualBwd(dres2, din, dattproj));
  dres2.Reset();
  ASSIGN_OR_RETURN(Buffer datty, Alloc(N * Q, true));
  RETURN_IF_ERROR(
      NnLinearBackward(ops.attn_proj, Q, C, a.atty.cspan(), dattproj.cspan(), datty.span()));
  dattproj.Reset();
  ASSIGN_OR_RETURN(Buffer dq, Alloc(N * Q, true));
  ASSIGN_OR_RETURN(Buffer dk, Alloc(N * K, true));
  ASSIGN_OR_RETURN(Buffer dv, Alloc(N * K, true));
  const GqaAttentionShape att{B, T, m.num_heads, m.num_kv_heads, D, options_.attention_tile};
  const int64_t att_ws_bytes = kernels_->GqaAttentionBackwardWorkspaceBytes(att);
  ASSIGN_OR_RETURN(Buffer att_ws, Workspace(att_ws_bytes));
  RETURN_IF_ERROR(kernels_->GqaAttentionBackward(
      *stream_, att, a.q.data(), a.k.data(), a.v.data(), a.atty.data(), a.lse.data(), datty.data(),
      dq.data(), dk.data(), dv.data(), att_ws.data(), att_ws_bytes));
  att_ws.Reset();
  datty.Reset();
  a.atty.Reset();
  a.lse.Reset();
  a.q.Reset();
  a.k.Reset();
  a.v.Reset();
  {
    const float* cos = rope_dev_ + InputsLayout().rope_cos;
    const float* sin = rope_dev_ + InputsLayout().rope_sin;
    RETURN_IF_ERROR(
        kernels_->RopeBackward(*stream_, {B, T, m.num_heads, D, T}, cos, sin, dq.data()));
    RETURN_IF_ERROR(
        kernels_->RopeBackward(*stream_, {B, T, m.num_kv_heads, D, T}, cos, sin, dk.data()));
  }
  ASSIGN_OR_RETURN(Buffer dln1, Alloc(N * C, true));
  {
    const QkvOp& qkv = ops.qkv;
    ASSIGN_OR_RETURN(ScopedAccess access,
                     ScopedAccess::Begin(manager_, release_wait_, qkv.op, Stage::kBackward));
    RETURN_IF_ERROR(NnLinearBwd(qkv.q_w, qkv.q_b, C, Q, a.ln1.cspan(), dq.cspan(), dln1.span()));
    dq.Reset();
    RETURN_IF_ERROR(NnLinearBwd(qkv.k_w, qkv.k_b, C, K, a.ln1.cspan(), dk.cspan(), dln1.span()));
    dk.Reset();
    RETURN_IF_ERROR(NnLinearBwd(qkv.v_w, qkv.v_b, C, K, a.ln1.cspan(), dv.cspan(), dln1.span()));
    dv.Reset();
    RETURN_IF_ERROR(access.End());
  }
  a.ln1.Reset();
  RETURN_IF_ERROR(NormBwd(ops.ln_1, in.cspan(), a.ln1_mean.cspan(), a.ln1_rstd.cspan(),
                          dln1.cspan(), din.span()));
  dln1.Reset();
  in.Reset();
  a.Reset();
  dres = std::move(din);
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
                                                 double loss_scale) {
  RETURN_IF_ERROR(CheckInputs(tokens, targets));
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
  WaitOnError wait(stream_);  // after the activations' stream-ordered frees
  Activations acts;
  const ForwardMode mode =
      options_.activation_checkpointing ? ForwardMode::kCheckpoint : ForwardMode::kTrain;
  ASSIGN_OR_RETURN(const double loss, Forward(tokens, targets, mode, acts));
  RETURN_IF_ERROR(Backward(tokens, loss_scale, acts));
  // Every gradient is in its slot before the optimizer (or a caller) reads it.
  wait.Dismiss();
  RETURN_IF_ERROR(stream_->Synchronize());
  return loss;
}

absl::StatusOr<double> GptModel::Evaluate(absl::Span<const int32_t> tokens,
                                          absl::Span<const int32_t> targets) {
  RETURN_IF_ERROR(CheckInputs(tokens, targets));
  RETURN_IF_ERROR(CheckParametersInSlots("Evaluate"));
  if (manager_->in_iteration()) {
    return absl::FailedPreconditionError(
        "GptModel::Evaluate runs outside an iteration (its accesses are untracked); call it "
        "after EndIteration");
  }
  WaitOnError wait(stream_);
  Activations acts;
  absl::StatusOr<double> loss = Forward(tokens, targets, ForwardMode::kEvaluate, acts);
  if (loss.ok()) wait.Dismiss();  // Forward waited for the loss
  return loss;
}

}  // namespace ps
