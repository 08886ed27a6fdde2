#include "model/gpt_model.h"

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <functional>
#include <memory>
#include <numbers>
#include <optional>
#include <random>
#include <sstream>
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
#include "chunk/chunk_layout.h"
#include "chunk/chunk_store.h"
#include "chunk/chunk_type.h"
#include "chunk/operator_spec.h"
#include "chunk/tensor_state.h"
#include "glog/logging.h"
#include "memory/caching_allocator.h"
#include "memory/convert.h"
#include "memory/device.h"
#include "memory/device_memory.h"
#include "memory/dtype.h"
#include "model/gpt2_checkpoint.h"
#include "model/gpt_config.h"
#include "model/kernels/attention.h"
#include "model/kernels/encoder.h"
#include "model/kernels/gelu.h"
#include "model/kernels/layernorm.h"
#include "model/kernels/lm_head_cross_entropy.h"
#include "model/kernels/matmul.h"
#include "model/kernels/residual.h"
#include "base/thread_pool.h"
#include "scheduler/chunk_manager.h"

namespace ps {

// --- Helpers
// --------------------------------------------------------------------------------------

// An f32 allocation of the accelerator's scratch() (non-model data), freed on destruction.
class GptModel::Buffer {
 public:
  Buffer() = default;
  Buffer(CachingAllocator* allocator, float* data, int64_t elems)
      : allocator_(allocator), data_(data), elems_(elems) {}
  Buffer(Buffer&& other) noexcept
      : allocator_(std::exchange(other.allocator_, nullptr)),
        data_(std::exchange(other.data_, nullptr)),
        elems_(std::exchange(other.elems_, 0)) {}
  Buffer& operator=(Buffer&& other) noexcept {
    if (this != &other) {
      Reset();
      allocator_ = std::exchange(other.allocator_, nullptr);
      data_ = std::exchange(other.data_, nullptr);
      elems_ = std::exchange(other.elems_, 0);
    }
    return *this;
  }
  Buffer(const Buffer&) = delete;
  Buffer& operator=(const Buffer&) = delete;
  ~Buffer() { Reset(); }

  void Reset() {
    if (data_ == nullptr) return;
    const absl::Status s =
        allocator_->Deallocate(data_, elems_ * static_cast<int64_t>(sizeof(float)));
    CHECK(s.ok()) << "GptModel: freeing an activation buffer failed: " << s;
    allocator_ = nullptr;
    data_ = nullptr;
    elems_ = 0;
  }
  float* data() const { return data_; }
  int64_t elems() const { return elems_; }
  absl::Span<float> span() const { return absl::Span<float>(data_, static_cast<size_t>(elems_)); }
  absl::Span<const float> cspan() const {
    return absl::Span<const float>(data_, static_cast<size_t>(elems_));
  }

 private:
  CachingAllocator* allocator_ = nullptr;
  float* data_ = nullptr;
  int64_t elems_ = 0;
};

// Access(op, stage) ... Release(op, stage); released on destruction if End() was not reached (an
// error path), so a failing kernel never leaves an operator accessed.
class GptModel::ScopedAccess {
 public:
  static absl::StatusOr<ScopedAccess> Begin(ChunkManager* manager, OperatorId op, Stage stage) {
    RETURN_IF_ERROR(manager->Access(op, stage));
    return ScopedAccess(manager, op, stage);
  }
  ScopedAccess(ScopedAccess&& other) noexcept
      : manager_(std::exchange(other.manager_, nullptr)), op_(other.op_), stage_(other.stage_) {}
  ScopedAccess& operator=(ScopedAccess&&) = delete;
  ScopedAccess(const ScopedAccess&) = delete;
  ScopedAccess& operator=(const ScopedAccess&) = delete;
  ~ScopedAccess() {
    if (manager_ == nullptr) return;
    const absl::Status s = manager_->Release(op_, stage_);
    LOG_IF(ERROR, !s.ok()) << "GptModel: releasing operator " << op_ << " after an error: " << s;
  }
  [[nodiscard]] absl::Status End() {
    return std::exchange(manager_, nullptr)->Release(op_, stage_);
  }

 private:
  ScopedAccess(ChunkManager* manager, OperatorId op, Stage stage)
      : manager_(manager), op_(op), stage_(stage) {}
  ChunkManager* manager_;
  OperatorId op_;
  Stage stage_;
};

// An operator with a weight and a bias: Conv1D (weight [in, out]) or LayerNorm (weight, bias [C]).
struct GptModel::LinearOp {
  OperatorId op = -1;
  TensorId w = -1;
  TensorId b = -1;
};

struct GptModel::BlockOps {
  LinearOp ln_1, c_attn, attn_proj, ln_2, c_fc, mlp_proj;
};

// What one block's backward needs from its forward (its input is kept in Activations::x).
struct GptModel::BlockActs {
  Buffer ln1, ln1_mean, ln1_rstd, qkv, atty, lse, res2, ln2, ln2_mean, ln2_rstd, fch, fch_gelu;
  void Reset() { *this = BlockActs(); }
};

struct GptModel::Activations {
  // The residual stream: x[l] is block l's input, x[num_layers] the final LayerNorm's input.
  std::vector<Buffer> x;
  std::vector<BlockActs> blocks;
  Buffer lnf, lnf_mean, lnf_rstd, ce_lse;
  // Training: the loss scale, and d(lnf) and d(wte) (the LM head's part; the encoder adds its
  // own in Backward), which the training forward computes together with the loss.
  double loss_scale = 1.0;
  Buffer dlnf, dwte;
};

namespace {

uint64_t SplitMix64(uint64_t x) {
  x += 0x9E3779B97F4A7C15ULL;
  x = (x ^ (x >> 30)) * 0xBF58476D1CE4E5B9ULL;
  x = (x ^ (x >> 27)) * 0x94D049BB133111EBULL;
  return x ^ (x >> 31);
}

// N(0, std) values from stream `stream` of `seed`: mt19937_64 (its sequence is fixed by the C++
// standard) and Box-Muller in double (std::normal_distribution is implementation-defined).
void FillNormal(uint64_t seed, uint64_t stream, double std, absl::Span<float> out) {
  std::mt19937_64 gen(SplitMix64(seed ^ SplitMix64(stream)));
  constexpr double kTwoPi = 2.0 * std::numbers::pi;
  for (size_t i = 0; i < out.size(); i += 2) {
    const double u1 = static_cast<double>((gen() >> 11) + 1) * 0x1.0p-53;  // (0, 1]
    const double u2 = static_cast<double>(gen() >> 11) * 0x1.0p-53;        // [0, 1)
    const double r = std::sqrt(-2.0 * std::log(u1));
    out[i] = static_cast<float>(std * r * std::cos(kTwoPi * u2));
    if (i + 1 < out.size()) out[i + 1] = static_cast<float>(std * r * std::sin(kTwoPi * u2));
  }
}

}  // namespace

// --- Construction
// ---------------------------------------------------------------------------------

GptModel::GptModel(const GptConfig& config, ChunkStore* store, ChunkManager* manager,
                   DeviceMemory* accelerator, const GptModelOptions& options)
    : config_(config),
      options_(options),
      store_(store),
      manager_(manager),
      accelerator_(accelerator) {}

GptModel::~GptModel() = default;

absl::StatusOr<std::unique_ptr<GptModel>> GptModel::Create(const GptConfig& config,
                                                           ChunkStore* store, ChunkManager* manager,
                                                           DeviceMemory* accelerator,
                                                           const GptModelOptions& options) {
  if (store == nullptr || manager == nullptr || accelerator == nullptr) {
    return absl::InvalidArgumentError(
        "GptModel::Create: store, manager and accelerator must not be null");
  }
  RETURN_IF_ERROR(ValidateGptConfig(config));
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
  if (o.seq_len > config.max_seq_len) {
    return absl::InvalidArgumentError(absl::StrCat(
        "GptModelOptions.seq_len ", o.seq_len, " exceeds the model's ", config.max_seq_len,
        " positions (GptConfig.max_seq_len of '", config.name, "'); use a shorter sequence"));
  }
  std::unique_ptr<GptModel> model(new GptModel(config, store, manager, accelerator, o));
  RETURN_IF_ERROR(model->ResolveLayout());
  model->pool_ = std::make_unique<ThreadPool>(o.threads);
  return model;
}

absl::Status GptModel::ResolveLayout() {
  const ChunkLayout& layout = store_->layout();
  const std::vector<OperatorSpec> ops = GptOperators(config_);
  if (layout.num_operator_ids() != static_cast<int64_t>(ops.size())) {
    return absl::InvalidArgumentError(absl::StrCat(
        "GptModel: the chunk layout has ", layout.num_operator_ids(), " operators but GPT config '",
        config_.name, "' has ", ops.size(), "; build the layout from GptOperators(config)"));
  }
  std::vector<LinearOp> resolved;
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
    for (size_t i = 0; i < spec.tensors.size(); ++i) {
      const TensorSpec& ts = spec.tensors[i];
      absl::StatusOr<TensorId> t = layout.FindTensor(ts.name);
      ASSIGN_OR_RETURN(const int64_t numel, ShapeNumElems(ts.shape));
      if (!t.ok() || layout.tensor(*t).op != *op || layout.tensor(*t).numel != numel) {
        return absl::InvalidArgumentError(
            absl::StrCat("GptModel: tensor '", ts.name, "' ", ShapeString(ts.shape),
                         " of operator '", spec.name, "' is missing from the layout or differs"));
      }
      (i == 0 ? r.w : r.b) = *t;
      param_tensors_.push_back(*t);
    }
    resolved.push_back(r);
  }
  embedding_op_ = resolved[0].op;
  wte_ = resolved[0].w;
  wpe_ = resolved[0].b;
  for (int64_t l = 0; l < config_.num_layers; ++l) {
    const LinearOp* r = &resolved[1 + 6 * l];
    blocks_.push_back(BlockOps{r[0], r[1], r[2], r[3], r[4], r[5]});
  }
  ln_f_ = std::make_unique<LinearOp>(resolved.back());
  return absl::OkStatus();
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
  ASSIGN_OR_RETURN(void* p, scratch->Allocate(elems * static_cast<int64_t>(sizeof(float))));
  Buffer buffer(scratch, static_cast<float*>(p), elems);
  if (zero) std::memset(p, 0, static_cast<size_t>(elems) * sizeof(float));
  return buffer;
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
  RETURN_IF_ERROR(Convert(v.dtype, v.data, DType::kF32, buffer.data(), v.numel));
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
  return Convert(DType::kF32, grad.data(), v.dtype, v.data, v.numel);
}

absl::Status GptModel::WriteParameter(TensorId tensor, absl::Span<const float> values) {
  ASSIGN_OR_RETURN(TensorView master, store_->View(ChunkType::kMaster, tensor));
  ASSIGN_OR_RETURN(TensorView param, store_->View(ChunkType::kParam, tensor));
  CHECK_EQ(master.numel, static_cast<int64_t>(values.size()));
  std::memcpy(master.data, values.data(), values.size() * sizeof(float));
  RETURN_IF_ERROR(Convert(DType::kF32, values.data(), param.dtype, param.data, param.numel));
  for (ChunkType type : {ChunkType::kMomentum, ChunkType::kVariance}) {
    ASSIGN_OR_RETURN(TensorView v, store_->View(type, tensor));
    std::memset(v.data, 0, static_cast<size_t>(v.bytes()));
  }
  return absl::OkStatus();
}

absl::Status GptModel::SetParameters(
    const std::function<absl::Status(size_t index, absl::Span<float> out)>& fill) {
  if (manager_->in_iteration()) {
    return absl::FailedPreconditionError(
        "GptModel: parameters can only be set outside an iteration (after EndIteration)");
  }
  const ChunkLayout& layout = store_->layout();
  absl::flat_hash_map<TensorId, size_t> index_of;
  for (size_t i = 0; i < param_tensors_.size(); ++i) index_of[param_tensors_[i]] = i;
  // ZeRO: other ranks' copies of this rank's chunks are stale from now on.
  RETURN_IF_ERROR(manager_->ReleaseRemoteChunks());
  std::vector<float> values;
  for (int64_t c = 0; c < layout.num_chunks(); ++c) {
    const std::vector<TensorId> tensors = layout.TensorsInChunk(c);
    if (tensors.empty() || !layout.HoldsPayload(ChunkType::kMaster, c, store_->rank())) continue;
    RETURN_IF_ERROR(
        manager_->AccessChunks(c, kAllChunkTypes, Device::Host(), AccessMode::kReadWrite));
    absl::Status status;
    for (TensorId t : tensors) {
      values.assign(static_cast<size_t>(layout.tensor(t).numel), 0.0f);
      status = fill(index_of.at(t), absl::MakeSpan(values));
      if (status.ok()) status = WriteParameter(t, values);
      if (!status.ok()) break;
    }
    const absl::Status released = manager_->ReleaseChunks(c, kAllChunkTypes);
    RETURN_IF_ERROR(status);
    RETURN_IF_ERROR(released);
  }
  return absl::OkStatus();
}

absl::Status GptModel::InitializeParameters(uint64_t seed) {
  const ChunkLayout& layout = store_->layout();
  const double residual_std = 0.02 / std::sqrt(2.0 * static_cast<double>(config_.num_layers));
  return SetParameters([&](size_t index, absl::Span<float> out) {
    const std::string& name = layout.tensor(param_tensors_[index]).name;
    if (absl::StrContains(name, "ln_")) {
      std::fill(out.begin(), out.end(), absl::EndsWith(name, ".weight") ? 1.0f : 0.0f);
    } else if (absl::EndsWith(name, ".bias")) {
      std::fill(out.begin(), out.end(), 0.0f);
    } else {
      FillNormal(seed, index, absl::EndsWith(name, "c_proj.weight") ? residual_std : 0.02, out);
    }
    return absl::OkStatus();
  });
}

absl::Status GptModel::LoadGpt2Checkpoint(const Gpt2Checkpoint& checkpoint) {
  if (!(checkpoint.dims() == dims())) {
    std::ostringstream os;
    os << "GptModel: the checkpoint's dimensions " << checkpoint.dims()
       << " differ from the model's " << dims() << " (config '" << config_.name << "')";
    return absl::InvalidArgumentError(os.str());
  }
  const ChunkLayout& layout = store_->layout();
  return SetParameters([&](size_t index, absl::Span<float> out) {
    return checkpoint.ReadF32(layout.tensor(param_tensors_[index]).name, out);
  });
}

absl::Status GptModel::LoadTrainingState(const TrainingStateFillFn& fill) {
  if (manager_->in_iteration()) {
    return absl::FailedPreconditionError(
        "GptModel: the training state can only be loaded outside an iteration");
  }
  const ChunkLayout& layout = store_->layout();
  RETURN_IF_ERROR(manager_->ReleaseRemoteChunks());
  std::vector<float> values;
  for (int64_t c = 0; c < layout.num_chunks(); ++c) {
    const std::vector<TensorId> tensors = layout.TensorsInChunk(c);
    if (tensors.empty() || !layout.HoldsPayload(ChunkType::kMaster, c, store_->rank())) continue;
    RETURN_IF_ERROR(
        manager_->AccessChunks(c, kAllChunkTypes, Device::Host(), AccessMode::kReadWrite));
    absl::Status status = [&]() -> absl::Status {
      for (TensorId t : tensors) {
        const TensorInfo& info = layout.tensor(t);
        values.assign(static_cast<size_t>(info.numel), 0.0f);
        for (ChunkType type : {ChunkType::kMomentum, ChunkType::kVariance, ChunkType::kMaster}) {
          RETURN_IF_ERROR(fill(info.name, type, absl::MakeSpan(values)));
          ASSIGN_OR_RETURN(TensorView v, store_->View(type, t));
          std::memcpy(v.data, values.data(), values.size() * sizeof(float));
        }
        // `values` holds the master values now.
        ASSIGN_OR_RETURN(TensorView param, store_->View(ChunkType::kParam, t));
        RETURN_IF_ERROR(
            Convert(DType::kF32, values.data(), param.dtype, param.data, param.numel));
      }
      return absl::OkStatus();
    }();
    const absl::Status released = manager_->ReleaseChunks(c, kAllChunkTypes);
    RETURN_IF_ERROR(status);
    RETURN_IF_ERROR(released);
  }
  return absl::OkStatus();
}

absl::Status GptModel::VisitTrainingState(const TrainingStateVisitFn& visit) const {
  if (manager_->in_iteration()) {
    return absl::FailedPreconditionError(
        "GptModel: the training state can only be read outside an iteration");
  }
  for (const std::string& name : ParameterNames()) {
    if (!HoldsTrainingState(name)) continue;
    for (ChunkType type : {ChunkType::kMaster, ChunkType::kMomentum, ChunkType::kVariance}) {
      ASSIGN_OR_RETURN(std::vector<float> v, ReadTensor(type, name));
      RETURN_IF_ERROR(visit(name, type, v));
    }
  }
  return absl::OkStatus();
}

bool GptModel::HoldsTrainingState(absl::string_view name) const {
  const ChunkLayout& layout = store_->layout();
  absl::StatusOr<TensorId> t = layout.FindTensor(name);
  return t.ok() &&
         layout.HoldsPayload(ChunkType::kMaster, layout.tensor(*t).chunk_index, store_->rank());
}

std::vector<std::string> GptModel::ParameterNames() const {
  std::vector<std::string> names;
  for (const OperatorSpec& op : GptOperators(config_)) {
    for (const TensorSpec& t : op.tensors) names.push_back(t.name);
  }
  return names;
}

absl::Status GptModel::SaveGpt2Safetensors(const std::string& path, DType dtype) const {
  if (manager_->in_iteration()) {
    return absl::FailedPreconditionError(
        "GptModel: export the parameters outside an iteration (after EndIteration)");
  }
  if (store_->layout().world_size() > 1) {
    return absl::FailedPreconditionError(absl::StrCat(
        "GptModel::SaveGpt2Safetensors: this rank holds the master weights of its own chunks "
        "only (ZeRO, world size ", store_->layout().world_size(),
        "); gather them first, as the trainer's export does (trainer/trainer.h)"));
  }
  return WriteGpt2Safetensors(
      path, dims(), dtype, [&](absl::string_view name, absl::Span<float> out) -> absl::Status {
        ASSIGN_OR_RETURN(std::vector<float> v, ReadTensor(ChunkType::kMaster, name));
        if (v.size() != out.size()) {
          return absl::InternalError(absl::StrCat("GptModel: size of '", name, "' differs"));
        }
        std::memcpy(out.data(), v.data(), v.size() * sizeof(float));
        return absl::OkStatus();
      });
}

absl::StatusOr<std::vector<float>> GptModel::ReadTensor(ChunkType type,
                                                        absl::string_view name) const {
  ASSIGN_OR_RETURN(TensorId t, store_->layout().FindTensor(name));
  ASSIGN_OR_RETURN(TensorView v, store_->View(type, t));
  std::vector<float> out(static_cast<size_t>(v.numel));
  RETURN_IF_ERROR(Convert(v.dtype, v.data, DType::kF32, out.data(), v.numel));
  return out;
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
  ASSIGN_OR_RETURN(ScopedAccess access, ScopedAccess::Begin(manager_, op.op, Stage::kForward));
  const MatmulShape shape{options_.batch * options_.seq_len, in_features, out_features};
  absl::Span<const float> w, b;
  ASSIGN_OR_RETURN(const std::optional<absl::Span<const uint16_t>> w_bf16, ParamBf16(op.w));
  if (w_bf16.has_value()) {
    // bf16 chunks: the GEMM reads the chunk's bf16 weights in place (matmul.h, bf16 variants).
    ASSIGN_OR_RETURN(Buffer b_f32, ParamF32(op.b, &b));
    ASSIGN_OR_RETURN(Buffer ws, Alloc(MatmulBf16ForwardWorkspaceElems(shape), false));
    RETURN_IF_ERROR(MatmulForwardBf16(shape, x, *w_bf16, b, y, ws.span(), pool_.get()));
    return access.End();
  }
  ASSIGN_OR_RETURN(Buffer w_f32, ParamF32(op.w, &w));
  ASSIGN_OR_RETURN(Buffer b_f32, ParamF32(op.b, &b));
  RETURN_IF_ERROR(MatmulForward<float>(shape, x, w, b, y, pool_.get()));
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
  ASSIGN_OR_RETURN(ScopedAccess access, ScopedAccess::Begin(manager_, op.op, Stage::kForward));
  absl::Span<const float> w, b;
  ASSIGN_OR_RETURN(Buffer w_f32, ParamF32(op.w, &w));
  ASSIGN_OR_RETURN(Buffer b_f32, ParamF32(op.b, &b));
  RETURN_IF_ERROR(
      LayerNormForward<float>({n, c}, x, w, b, y.span(), mean.span(), rstd.span(), pool_.get()));
  w_f32.Reset();
  b_f32.Reset();
  return access.End();
}

absl::Status GptModel::BlockForward(int64_t layer, absl::Span<const float> in, bool recompute,
                                    BlockActs& a, Buffer& out) {
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
    ASSIGN_OR_RETURN(Buffer ws, Alloc(AttentionWorkspaceElems(att, pool_->num_threads()), false));
    RETURN_IF_ERROR(AttentionForward<float>(att, a.qkv.cspan(), a.atty.span(), a.lse.span(),
                                            ws.span(), pool_.get()));
  }
  // res2 = in + attn.c_proj(atty), computed in place of the projection.
  ASSIGN_OR_RETURN(a.res2, Alloc(N * C, false));
  RETURN_IF_ERROR(LinearForward(ops.attn_proj, C, C, a.atty.cspan(), a.res2.span()));
  RETURN_IF_ERROR(ResidualForward<float>(in, a.res2.cspan(), a.res2.span(), pool_.get()));
  RETURN_IF_ERROR(LayerNormFwd(ops.ln_2, a.res2.cspan(), a.ln2, a.ln2_mean, a.ln2_rstd));
  ASSIGN_OR_RETURN(a.fch, Alloc(N * 4 * C, false));
  RETURN_IF_ERROR(LinearForward(ops.c_fc, C, 4 * C, a.ln2.cspan(), a.fch.span()));
  ASSIGN_OR_RETURN(a.fch_gelu, Alloc(N * 4 * C, false));
  RETURN_IF_ERROR(GeluForward<float>(a.fch.cspan(), a.fch_gelu.span(), pool_.get()));
  if (recompute) return absl::OkStatus();  // the block's output is not needed again
  // out = res2 + mlp.c_proj(fch_gelu), in place of the projection.
  ASSIGN_OR_RETURN(out, Alloc(N * C, false));
  RETURN_IF_ERROR(LinearForward(ops.mlp_proj, 4 * C, C, a.fch_gelu.cspan(), out.span()));
  return ResidualForward<float>(a.res2.cspan(), out.cspan(), out.span(), pool_.get());
}

absl::StatusOr<double> GptModel::Forward(absl::Span<const int32_t> tokens,
                                         absl::Span<const int32_t> targets, ForwardMode mode,
                                         Activations& acts) {
  const int64_t B = options_.batch, T = options_.seq_len, C = config_.hidden, N = B * T;
  const int64_t V = config_.vocab_size, L = config_.num_layers;
  acts.x.resize(L + 1);
  acts.blocks.resize(L);
  {
    ASSIGN_OR_RETURN(acts.x[0], Alloc(N * C, false));
    ASSIGN_OR_RETURN(ScopedAccess access,
                     ScopedAccess::Begin(manager_, embedding_op_, Stage::kForward));
    absl::Span<const float> wte, wpe;
    // bf16 chunks: only the rows read are widened (not the whole V x C table).
    ASSIGN_OR_RETURN(const std::optional<absl::Span<const uint16_t>> wte_bf16, ParamBf16(wte_));
    Buffer wte_f32;
    if (!wte_bf16.has_value()) {
      ASSIGN_OR_RETURN(wte_f32, ParamF32(wte_, &wte));
    }
    ASSIGN_OR_RETURN(Buffer wpe_f32, ParamF32(wpe_, &wpe));
    const EncoderShape shape{B, T, C, V, config_.max_seq_len};
    RETURN_IF_ERROR(
        wte_bf16.has_value()
            ? EncoderForwardBf16(shape, tokens, *wte_bf16, wpe, acts.x[0].span(), pool_.get())
            : EncoderForward<float>(shape, tokens, wte, wpe, acts.x[0].span(), pool_.get()));
    wte_f32.Reset();
    wpe_f32.Reset();
    RETURN_IF_ERROR(access.End());
  }
  for (int64_t l = 0; l < L; ++l) {
    RETURN_IF_ERROR(
        BlockForward(l, acts.x[l].cspan(), /*recompute=*/false, acts.blocks[l], acts.x[l + 1]));
    if (mode != ForwardMode::kTrain) acts.blocks[l].Reset();
    if (mode == ForwardMode::kEvaluate) acts.x[l].Reset();
  }
  RETURN_IF_ERROR(LayerNormFwd(*ln_f_, acts.x[L].cspan(), acts.lnf, acts.lnf_mean, acts.lnf_rstd));
  if (mode == ForwardMode::kEvaluate) {
    acts.x[L].Reset();
    acts.lnf_mean.Reset();
    acts.lnf_rstd.Reset();
  }
  // The LM head, tied to wte: the embedding operator's second use. Training runs the head's
  // forward and backward in one kernel (LmHeadCrossEntropyForwardBackward: the same bits as the
  // two kernels, without computing the logits a second time); its gradients wait in `acts` for
  // Backward.
  const bool train = mode != ForwardMode::kEvaluate;
  const LmHeadCrossEntropyShape ce{.rows = N,
                                   .channels = C,
                                   .vocab_size = V,
                                   .row_tile = options_.ce_row_tile,
                                   .vocab_tile = options_.ce_vocab_tile,
                                   .ignore_index = kIgnoreIndex};
  ASSIGN_OR_RETURN(acts.ce_lse, Alloc(N, false));
  if (train) {
    ASSIGN_OR_RETURN(acts.dwte, Alloc(V * C, true));
    ASSIGN_OR_RETURN(acts.dlnf, Alloc(N * C, true));
  }
  ASSIGN_OR_RETURN(ScopedAccess access,
                   ScopedAccess::Begin(manager_, embedding_op_, Stage::kForward));
  double loss = 0;
  ASSIGN_OR_RETURN(const std::optional<absl::Span<const uint16_t>> wte_bf16, ParamBf16(wte_));
  if (wte_bf16.has_value()) {
    ASSIGN_OR_RETURN(Buffer ws, Alloc(train ? LmHeadCrossEntropyFusedBf16WorkspaceElems(ce)
                                            : LmHeadCrossEntropyBf16WorkspaceElems(ce),
                                      false));
    ASSIGN_OR_RETURN(
        loss,
        train ? LmHeadCrossEntropyForwardBackwardBf16(
                    ce, acts.lnf.cspan(), *wte_bf16, targets, acts.loss_scale, acts.ce_lse.span(),
                    acts.dlnf.span(), acts.dwte.span(), ws.span(), pool_.get())
              : LmHeadCrossEntropyForwardBf16(ce, acts.lnf.cspan(), *wte_bf16, targets,
                                              acts.ce_lse.span(), ws.span(), pool_.get()));
    RETURN_IF_ERROR(access.End());
    return loss;
  }
  ASSIGN_OR_RETURN(Buffer ws, Alloc(train ? LmHeadCrossEntropyFusedWorkspaceElems(ce)
                                          : LmHeadCrossEntropyWorkspaceElems(ce),
                                    false));
  absl::Span<const float> wte;
  ASSIGN_OR_RETURN(Buffer wte_f32, ParamF32(wte_, &wte));
  ASSIGN_OR_RETURN(
      loss, train ? LmHeadCrossEntropyForwardBackward<float>(
                        ce, acts.lnf.cspan(), wte, targets, acts.loss_scale, acts.ce_lse.span(),
                        acts.dlnf.span(), acts.dwte.span(), ws.span(), pool_.get())
                  : LmHeadCrossEntropyForward<float>(ce, acts.lnf.cspan(), wte, targets,
                                                     acts.ce_lse.span(), ws.span(), pool_.get()));
  wte_f32.Reset();
  RETURN_IF_ERROR(access.End());
  return loss;
}

// --- Backward
// -------------------------------------------------------------------------------------

absl::Status GptModel::LinearBackward(const LinearOp& op, int64_t in_features, int64_t out_features,
                                      absl::Span<const float> x, absl::Span<const float> dy,
                                      absl::Span<float> dx) {
  ASSIGN_OR_RETURN(Buffer dw, Alloc(in_features * out_features, true));
  ASSIGN_OR_RETURN(Buffer db, Alloc(out_features, true));
  ASSIGN_OR_RETURN(ScopedAccess access, ScopedAccess::Begin(manager_, op.op, Stage::kBackward));
  const MatmulShape shape{options_.batch * options_.seq_len, in_features, out_features};
  absl::Span<const float> w, b;
  ASSIGN_OR_RETURN(const std::optional<absl::Span<const uint16_t>> w_bf16, ParamBf16(op.w));
  if (w_bf16.has_value()) {
    ASSIGN_OR_RETURN(Buffer ws, Alloc(MatmulBf16BackwardWorkspaceElems(shape), false));
    RETURN_IF_ERROR(MatmulBackwardBf16(shape, x, *w_bf16, dy, dx, dw.span(), db.span(), ws.span(),
                                       pool_.get()));
  } else {
    ASSIGN_OR_RETURN(Buffer w_f32, ParamF32(op.w, &w));
    RETURN_IF_ERROR(MatmulBackward<float>(shape, x, w, dy, dx, dw.span(), db.span(), pool_.get()));
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
  ASSIGN_OR_RETURN(ScopedAccess access, ScopedAccess::Begin(manager_, op.op, Stage::kBackward));
  absl::Span<const float> w;
  ASSIGN_OR_RETURN(Buffer w_f32, ParamF32(op.w, &w));
  RETURN_IF_ERROR(LayerNormBackward<float>({n, c}, x, w, mean, rstd, dy, dx, dw.span(), db.span(),
                                           pool_.get()));
  w_f32.Reset();
  RETURN_IF_ERROR(WriteGrad(op.w, dw.cspan()));
  RETURN_IF_ERROR(WriteGrad(op.b, db.cspan()));
  return access.End();
}

absl::Status GptModel::BlockBackward(int64_t layer, BlockActs& a, Buffer& in, Buffer& dres) {
  const BlockOps& ops = blocks_[layer];
  const int64_t B = options_.batch, T = options_.seq_len, C = config_.hidden, N = B * T;
  ThreadPool* pool = pool_.get();
  // out = res2 + fcproj
  ASSIGN_OR_RETURN(Buffer dres2, Alloc(N * C, true));
  ASSIGN_OR_RETURN(Buffer dfcproj, Alloc(N * C, true));
  RETURN_IF_ERROR(ResidualBackward<float>(dres.cspan(), dres2.span(), dfcproj.span(), pool));
  dres.Reset();
  ASSIGN_OR_RETURN(Buffer dfch_gelu, Alloc(N * 4 * C, true));
  RETURN_IF_ERROR(LinearBackward(ops.mlp_proj, 4 * C, C, a.fch_gelu.cspan(), dfcproj.cspan(),
                                 dfch_gelu.span()));
  dfcproj.Reset();
  a.fch_gelu.Reset();
  ASSIGN_OR_RETURN(Buffer dfch, Alloc(N * 4 * C, true));
  RETURN_IF_ERROR(GeluBackward<float>(a.fch.cspan(), dfch_gelu.cspan(), dfch.span(), pool));
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
  RETURN_IF_ERROR(ResidualBackward<float>(dres2.cspan(), din.span(), dattproj.span(), pool));
  dres2.Reset();
  ASSIGN_OR_RETURN(Buffer datty, Alloc(N * C, true));
  RETURN_IF_ERROR(
      LinearBackward(ops.attn_proj, C, C, a.atty.cspan(), dattproj.cspan(), datty.span()));
  dattproj.Reset();
  ASSIGN_OR_RETURN(Buffer dqkv, Alloc(N * 3 * C, true));
  const AttentionShape att{B, T, C, config_.num_heads, options_.attention_tile};
  RETURN_IF_ERROR(AttentionBackward<float>(att, a.qkv.cspan(), a.atty.cspan(), a.lse.cspan(),
                                           datty.cspan(), dqkv.span(), pool));
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

absl::Status GptModel::Backward(absl::Span<const int32_t> tokens, absl::Span<const int32_t> targets,
                                double loss_scale, Activations& acts) {
  const int64_t B = options_.batch, T = options_.seq_len, C = config_.hidden, N = B * T;
  const int64_t V = config_.vocab_size, L = config_.num_layers;
  // d(wte) of both uses (the LM head's part, computed by the training forward; the encoder's part
  // at the end) and d(lnf).
  Buffer dwte = std::move(acts.dwte), dlnf = std::move(acts.dlnf);
  {
    // The LM head's backward use of the embedding operator: its gradients are already in dwte
    // and dlnf (Forward), but the access stays, so the schedule of chunk accesses is unchanged.
    ASSIGN_OR_RETURN(ScopedAccess access,
                     ScopedAccess::Begin(manager_, embedding_op_, Stage::kBackward));
    RETURN_IF_ERROR(access.End());
  }
  acts.ce_lse.Reset();
  acts.lnf.Reset();
  ASSIGN_OR_RETURN(Buffer dres, Alloc(N * C, true));
  RETURN_IF_ERROR(LayerNormBwd(*ln_f_, acts.x[L].cspan(), acts.lnf_mean.cspan(),
                               acts.lnf_rstd.cspan(), dlnf.cspan(), dres.span()));
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
  ASSIGN_OR_RETURN(Buffer dwpe, Alloc(config_.max_seq_len * C, true));
  ASSIGN_OR_RETURN(ScopedAccess access,
                   ScopedAccess::Begin(manager_, embedding_op_, Stage::kBackward));
  RETURN_IF_ERROR(EncoderBackward<float>({B, T, C, V, config_.max_seq_len}, tokens, dres.cspan(),
                                         dwte.span(), dwpe.span(), pool_.get()));
  // wte's last backward use: both parts are in; the slots take the gradients.
  RETURN_IF_ERROR(WriteGrad(wte_, dwte.cspan()));
  RETURN_IF_ERROR(WriteGrad(wpe_, dwpe.cspan()));
  return access.End();
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
  Activations acts;
  acts.loss_scale = loss_scale;
  const ForwardMode mode =
      options_.activation_checkpointing ? ForwardMode::kCheckpoint : ForwardMode::kTrain;
  ASSIGN_OR_RETURN(const double loss, Forward(tokens, targets, mode, acts));
  RETURN_IF_ERROR(Backward(tokens, targets, loss_scale, acts));
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
  Activations acts;
  return Forward(tokens, targets, ForwardMode::kEvaluate, acts);
}

}  // namespace ps
