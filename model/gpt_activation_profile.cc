#include "model/gpt_activation_profile.h"

#include <algorithm>
#include <cstdint>
#include <cstdlib>
#include <memory>
#include <string>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "chunk/chunk_layout.h"
#include "glog/logging.h"
#include "model/kernels/kernel_workspaces.h"
#include "model/lora_config.h"
#include "model/model_config.h"
#include "model/quant4_config.h"
#include "model/transformer_program.h"

namespace ps {
namespace {

// The transformer program's recording context: its scratch allocations, frees, accesses and
// releases become ActivationProfile events; nothing is computed. Buffers and parameter slots get
// distinct fake addresses that are never dereferenced (the kernels do not run), so the program's
// pointer arithmetic is harmless.
class RecordingContext final : public ProgramContext {
 public:
  RecordingContext(absl::Span<const OperatorSpec> ops, DType dtype,
                   const KernelWorkspaces& workspaces)
      : ops_(ops), builder_(ops), dtype_(dtype), workspaces_(workspaces) {
    for (const OperatorSpec& op : ops) {
      first_tensor_.push_back(static_cast<TensorId>(numel_.size()));
      for (const TensorSpec& t : op.tensors) numel_.push_back(ShapeNumElems(t.shape).value());
    }
  }

  // The id of the j-th tensor of operator i (operators are their indices in `ops`).
  TensorId tensor_id(size_t op, size_t j) const {
    return first_tensor_[op] + static_cast<TensorId>(j);
  }
  std::vector<ActivationEvent> Take() { return builder_.Take(); }

  absl::StatusOr<float*> AllocateScratch(int64_t elems) override {
    const int64_t id = builder_.Alloc(elems * static_cast<int64_t>(sizeof(float)));
    float* p = Fake(kScratchBase, id);
    buffers_[p] = id;
    return p;
  }
  void FreeScratch(float* data, int64_t) override {
    const auto it = buffers_.find(data);
    CHECK(it != buffers_.end()) << "RecordingContext: freeing a buffer it did not allocate";
    builder_.Free(it->second);
    buffers_.erase(it);
  }
  absl::Status Access(OperatorId op, Stage stage) override {
    builder_.Access(ops_[static_cast<size_t>(op)].name, stage);
    return absl::OkStatus();
  }
  absl::Status Release(OperatorId op, Stage stage) override {
    builder_.Release(ops_[static_cast<size_t>(op)].name, stage);
    return absl::OkStatus();
  }
  void ReleaseAfterError(OperatorId op, Stage stage) override {
    builder_.Release(ops_[static_cast<size_t>(op)].name, stage);
  }
  absl::StatusOr<TensorView> Param(TensorId tensor) override {
    TensorView v;
    v.data = Fake(kParamBase, tensor);
    v.numel = numel_[static_cast<size_t>(tensor)];
    v.dtype = dtype_;
    return v;
  }
  DType compute_dtype() const override { return dtype_; }
  const KernelWorkspaces& workspaces() const override { return workspaces_; }
  absl::Status Compute(absl::FunctionRef<absl::Status(Kernels&, Stream&)>) override {
    return absl::OkStatus();
  }
  absl::Status Upload(Staging, void*, absl::Span<const absl::Span<const char>>) override {
    return absl::OkStatus();
  }
  absl::StatusOr<double> ReadLoss(const double*) override { return 0.0; }

 private:
  // Fake addresses: 2^36-byte slots (more than any buffer or tensor), scratch and parameters in
  // separate ranges.
  static constexpr uintptr_t kScratchBase = uintptr_t{1} << 60;
  static constexpr uintptr_t kParamBase = uintptr_t{1} << 61;
  static float* Fake(uintptr_t base, int64_t id) {
    return reinterpret_cast<float*>(base + (static_cast<uintptr_t>(id) << 36));
  }

  const absl::Span<const OperatorSpec> ops_;
  ActivationProfileBuilder builder_;
  const DType dtype_;
  const KernelWorkspaces& workspaces_;
  std::vector<int64_t> numel_;
  std::vector<TensorId> first_tensor_;
  absl::flat_hash_map<float*, int64_t> buffers_;
};

// The program of `config` over operators `ops` run over a recording context: one ForwardBackward
// (the iteration) and one Evaluate.
GptMemoryModel Record(const ModelConfig& config, std::vector<OperatorSpec> ops,
                      const GptModelOptions& o, DType dtype, const VocabLayoutOptions& layout,
                      const KernelWorkspaces* workspaces) {
  const CpuKernelWorkspaces cpu(o.threads);
  GptMemoryModel m;
  m.ops = std::move(ops);
  RecordingContext ctx(m.ops, dtype, workspaces != nullptr ? *workspaces : cpu);
  const std::vector<GptVocabBlock> rows = GptVocabBlocks(GptConfigView(config), layout);
  ProgramLayout program_layout = ProgramLayoutOf(
      config, m.ops, rows, [](size_t op) { return static_cast<OperatorId>(op); },
      [&](size_t op, size_t j) { return ctx.tensor_id(op, j); });
  if (o.quant4.has_value()) {
    // The 4-bit weights' GEMMs ask for their own workspace (Quant4LinearWorkspaceBytes).
    auto table = std::make_shared<Quant4Table>();
    table->compute_dtype = o.quant4->compute_dtype;
    absl::flat_hash_map<std::string, Quant4Format> formats;
    for (const Quant4Weight& w : Quant4Weights(config, *o.lora, *o.quant4)) {
      formats.emplace(w.tensor, w.format);
    }
    for (size_t op = 0; op < m.ops.size(); ++op) {
      for (size_t j = 0; j < m.ops[op].tensors.size(); ++j) {
        const auto it = formats.find(m.ops[op].tensors[j].name);
        if (it != formats.end()) table->format.emplace(ctx.tensor_id(op, j), it->second);
      }
    }
    CHECK_EQ(table->format.size(), formats.size());
    program_layout.quant4 = std::move(table);
  }
  const ProgramShape shape{
      .batch = o.batch,
      .seq_len = o.seq_len == 0 ? config.max_position_embeddings : o.seq_len,
      .activation_checkpointing = o.activation_checkpointing,
      .attention_tile = o.attention_tile,
      .ce_row_tile = o.ce_row_tile,
      .ce_vocab_tile = o.ce_vocab_tile,
      .lora_scale = o.lora.has_value() ? static_cast<float>(o.lora->scale()) : 1.0f,
      .lora_dropout = o.lora.has_value() ? static_cast<float>(o.lora->lora_dropout) : 0.0f,
      .token_metadata = o.token_metadata};
  absl::StatusOr<TransformerProgram> program =
      TransformerProgram::Create(config, shape, std::move(program_layout));
  CHECK(program.ok()) << "the activation profile of a valid config: " << program.status();
  const absl::Status iteration = program->ForwardBackward(ctx, ProgramInputs{}, 1.0).status();
  CHECK(iteration.ok()) << iteration;
  m.profile.iteration = ctx.Take();
  const absl::Status evaluation = program->Evaluate(ctx, ProgramInputs{}).status();
  CHECK(evaluation.ok()) << evaluation;
  m.profile.evaluation = ctx.Take();
  return m;
}

}  // namespace

GptConfig GptConfigView(const ModelConfig& config) {
  return GptConfig{.name = config.name,
                   .vocab_size = config.vocab_size,
                   .max_seq_len = config.max_position_embeddings,
                   .hidden = config.hidden_size,
                   .num_layers = config.num_layers,
                   .num_heads = config.num_heads};
}

GptMemoryModel ModelActivationProfile(const ModelConfig& config, const GptModelOptions& options,
                                      DType compute_dtype, const VocabLayoutOptions& layout,
                                      const KernelWorkspaces* workspaces) {
  return Record(config,
                ModelOperatorsFor(config, options.lora, layout, options.quant4, compute_dtype),
                options, compute_dtype, layout, workspaces);
}

GptMemoryModel GptActivationProfile(const GptConfig& config, const GptModelOptions& options,
                                    DType compute_dtype, const VocabLayoutOptions& layout,
                                    const KernelWorkspaces* workspaces) {
  const ModelConfig model = FromGptConfig(config);
  return Record(model,
                options.lora.has_value()
                    ? ModelOperatorsFor(model, options.lora, layout, options.quant4, compute_dtype)
                    : GptOperators(config, layout),
                options, compute_dtype, layout, workspaces);
}

int64_t ModelMinChunkElems(const ModelConfig& config, int64_t row_quantum) {
  if (config.architecture() == ModelArchitecture::kGpt2) {
    absl::StatusOr<GptConfig> gpt = ToGptConfig(config);
    if (gpt.ok()) return GptMinChunkElems(*gpt, row_quantum);
  }
  // As GptMinChunkElems: the same model with a vocabulary of one block of row_quantum rows has
  // the same largest operator, without listing every block of a large vocabulary.
  ModelConfig one_block = config;
  one_block.vocab_size = std::min(row_quantum, config.vocab_size);
  int64_t largest = 0;
  for (const OperatorSpec& op : ModelOperators(one_block, {.vocab_block_rows = 0})) {
    largest = std::max(largest, OperatorNumElems(op));
  }
  return largest;
}

}  // namespace ps
