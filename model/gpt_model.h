// GptModel (also spelled TransformerModel): the chunked decoder-only transformer — GPT-2
// (GPT2LMHeadModel's math), and the Llama family (LlamaForCausalLM, Qwen2ForCausalLM,
// Qwen3ForCausalLM, MistralForCausalLM; model/model_config.h) — whose parameters, gradients and
// optimizer state live in the chunks of a ChunkStore. The model owns no model data: its parameters
// are the tensors of ModelOperators(config, layout) (Hugging Face names; the vocabulary matrices
// whole or in row blocks "wte.weight[r0:r1]" that hold whole LM-head vocabulary tiles, so a split
// model computes bit for bit what the unsplit one does), every operator one chunk-access unit.
//
// The model is three parts, each with its own contract:
//   - the forward and backward: model/transformer_program.h (one program for every architecture:
//     the order of operator accesses, where gradients go, which buffers are non-model data,
//     activation checkpointing, determinism);
//   - where they run: model/live_program_context.h (the accelerator's scratch allocator, the
//     ChunkManager, the kernels on one compute stream, asynchronous uploads; the host runs ahead
//     of the stream, and releases are stream-ordered when the manager shares the stream);
//   - the state outside compute: model/model_state_io.h (ReadTensor*, VisitTrainingState,
//     LoadTrainingState, the imports and exports; never dereferences an accelerator payload on
//     the host), with the initial values of model/parameter_init.h.
// GptModel creates them, resolves the store's layout to the program's operator and tensor ids, and
// checks the inputs and the state before each pass. The memory plan's activation profile
// (model/gpt_activation_profile.h) runs the same program over a recording context.
//
// Compute. Every kernel is enqueued on one compute Stream of the accelerator's backend
// (GptModelOptions::kernels and compute_stream, or the model's own). With a compute_stream in the
// options — which must then be the ChunkManager's compute_stream (the trainer's wiring) — each
// Release is stream-ordered and the host does not wait; with the model's own stream, which a
// manager cannot know, the host waits for the stream before each Release, so a manager given a
// compute stream must also be given to the model as options.compute_stream. The host waits for the
// stream for the loss, at the end of ForwardBackward and Evaluate, and wherever the scheduler or
// the allocator must. With the cpu backend the CPU kernels run on the stream's worker thread
// (model/kernels/cpu_kernels.h), bit for bit as direct calls.
//
// Thread safety: thread-compatible. One thread drives the model and its ChunkManager.
#ifndef PATRICKSTAR_MODEL_GPT_MODEL_H_
#define PATRICKSTAR_MODEL_GPT_MODEL_H_

#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "absl/types/span.h"
#include "base/progress.h"
#include "base/thread_pool.h"
#include "chunk/chunk_layout.h"
#include "chunk/chunk_store.h"
#include "chunk/chunk_type.h"
#include "memory/backend.h"
#include "memory/device_memory.h"
#include "memory/dtype.h"
#include "model/gpt2_checkpoint.h"
#include "model/gpt_config.h"
#include "model/hf_checkpoint.h"
#include "model/kernels/kernels.h"
#include "model/kernels/vocab_blocks.h"
#include "model/live_program_context.h"
#include "model/lora_config.h"
#include "model/model_config.h"
#include "model/model_state_io.h"
#include "model/quant4_config.h"
#include "model/transformer_block_spec.h"
#include "model/transformer_program.h"
#include "scheduler/chunk_manager.h"

namespace ps {

// Pinned host bytes a model uses to read accelerator payloads outside compute (one buffer, reused
// for every range; see the file comment). Counted by the trainer's host plan.
inline constexpr int64_t kPayloadStagingBytes = int64_t{4} << 20;

struct GptModelOptions {
  // Sequences per batch (B). Must be >= 1.
  int64_t batch = 1;
  // Tokens per sequence (T); 0 means config.max_seq_len. Must be <= config.max_seq_len.
  int64_t seq_len = 0;
  // Recompute each block in backward instead of keeping its activations (see the file comment).
  bool activation_checkpointing = false;
  // Seed of InitializeParameters().
  uint64_t seed = 0;
  // Threads of the model's ThreadPool for the kernels and their GEMM grids, the caller included.
  // >= 1. Results do not depend on it.
  int threads = 1;
  // Kernel tiles (model/kernels/gqa_attention.h, vocab_blocks.h); the defaults suit real models,
  // tests use small ones to cross tile boundaries. Every wte block must start at a multiple of
  // ce_vocab_tile (model/gpt_config.h's GptVocabBlockRowsForChunk sizes blocks so).
  int64_t attention_tile = 64;
  int64_t ce_row_tile = 256;
  int64_t ce_vocab_tile = kDefaultVocabTileRows;
  // Bytes of the pinned buffer that stages accelerator payloads read outside compute (see the
  // file comment); at least 4 (one f32 element). Tests use small ones to cross piece boundaries.
  int64_t payload_staging_bytes = kPayloadStagingBytes;
  // Where the model computes (see "Compute" in the file comment). Not owned; each must outlive
  // the model. `kernels` must be the implementation of the accelerator's backend, created with a
  // pool of `threads` threads (its workspace sizes enter the activation profile); null: the model
  // creates CreateKernels(backend, {.cpu_pool = its own pool}). `compute_stream` must be a stream
  // of the accelerator's backend and the one the ChunkManager was given as its compute_stream
  // (the model releases operators in stream order on it, see "Compute"); null: the model creates
  // its own, and the manager must have no compute stream (the host then waits at each Release).
  Kernels* kernels = nullptr;
  Stream* compute_stream = nullptr;
  // LoRA fine-tune (model/lora_config.h; see "LoRA" in GptModel's comment): the layout must then
  // hold exactly LoraModelOperators(config, *lora, vocab) — a frozen base and trainable adapter
  // operators. Must pass ValidateLoraConfig(config, *lora).
  std::optional<LoraConfig> lora = std::nullopt;
  // Packed rows (ModelInputs::positions and key_start): the program's inputs buffer holds them,
  // 8 bytes per token more on the accelerator (the activation profile counts them). Without it,
  // a batch with positions or key_start is refused (InvalidArgument).
  bool token_metadata = false;
  // QLoRA (model/quant4_config.h): the frozen block linears stored in 4 bits. Requires `lora`
  // and must pass ValidateQuant4Config. The layout must then hold
  // ModelOperatorsFor(config, lora, vocab, quant4, the store's compute dtype), built with
  // tensor_alignment_elems = Quant4AlignmentElems(that dtype); see "4-bit base" in GptModel.
  std::optional<Quant4Config> quant4 = std::nullopt;
};

// One batch: tokens and targets [batch, seq_len] row-major; targets[b, t] is the token predicted
// from the tokens before it, or kIgnoreIndex. positions and key_start ([batch, seq_len] each, or
// both empty) describe rows that pack several examples (trainer/data/packed_loader.h): token p is
// at position positions[p] (RoPE, or GPT-2's learned positions) and attends to the keys j of its
// row with key_start[p] <= j <= p. Empty: position t and plain causal attention, bit for bit the
// batch without them. Requires GptModelOptions::token_metadata when given.
struct ModelInputs {
  absl::Span<const int32_t> tokens = {};
  absl::Span<const int32_t> targets = {};
  absl::Span<const int32_t> positions = {};
  absl::Span<const int32_t> key_start = {};
};

// The operators a layout of this model holds: ModelOperators(config, vocab) without LoRA,
// LoraModelOperators(config, *lora, vocab) with it; with quant4 as well, its 4-bit weights take
// their stored size in elements of `dtype` (Quant4StoredOperators). REQUIRES: the configs are
// valid (ValidateModelConfig, ValidateLoraConfig, ValidateQuant4Config; quant4 only with lora).
std::vector<OperatorSpec> ModelOperatorsFor(const ModelConfig& config,
                                            const std::optional<LoraConfig>& lora,
                                            const VocabLayoutOptions& vocab = {},
                                            const std::optional<Quant4Config>& quant4 = std::nullopt,
                                            DType dtype = DType::kF32);

// What GptModel::InitializeParameters(seed, options) sets and whom it tells how far it is.
struct InitializeOptions {
  // Only the LoRA adapters (the base is loaded over afterwards). Needs LoRA.
  bool adapters_only = false;
  // Hears (elements done, elements in all), base/progress.h's contract.
  ProgressFn progress;
};

class GptModel {
 public:
  // Targets equal to this are excluded from the loss (PyTorch's default ignore_index).
  static constexpr int32_t kIgnoreIndex = -100;

  // A model of `config` over `store`, whose layout must hold exactly GptOperators(config, layout)
  // for some VocabLayoutOptions (same operator and tensor names and sizes; any placement). None of
  // the pointers is owned; all must outlive the model. `manager` must manage `store`, and
  // `accelerator` be its accelerator memory: activations are allocated from
  // accelerator->scratch().
  // Errors: InvalidArgument for null pointers, an invalid config (ValidateGptConfig), bad options
  // (naming the field), a layout that does not match the config (naming the operator or
  // tensor), or wte blocks that do not start on a multiple of ce_vocab_tile.
  static absl::StatusOr<std::unique_ptr<GptModel>> Create(const GptConfig& config,
                                                          ChunkStore* store, ChunkManager* manager,
                                                          DeviceMemory* accelerator,
                                                          const GptModelOptions& options);
  // A model of any supported architecture: `store`'s layout must hold exactly
  // ModelOperators(config, layout) for some VocabLayoutOptions — with options.lora,
  // LoraModelOperators(config, *options.lora, layout) (ModelOperatorsFor), each operator's
  // trainable flag included (InvalidArgument naming the first operator that is missing, out of
  // place or of the other kind; ValidateLoraConfig's errors as they are). A gpt2-family config must
  // be one a GptConfig expresses (ToGptConfig) and gives the same model as the GptConfig overload.
  // Errors as above, with ValidateModelConfig; seq_len is bounded by max_position_embeddings.
  static absl::StatusOr<std::unique_ptr<GptModel>> Create(const ModelConfig& config,
                                                          ChunkStore* store, ChunkManager* manager,
                                                          DeviceMemory* accelerator,
                                                          const GptModelOptions& options);

  GptModel(const GptModel&) = delete;
  GptModel& operator=(const GptModel&) = delete;
  ~GptModel();

  // LoRA (options.lora set). The base operators are frozen (OperatorSpec::trainable false, except
  // those modules_to_save covers): their chunks hold only the param payload in the compute dtype,
  // which is the base weight itself (no master copy), never written by training. The adapters
  // (A [r, in], B [out, r] per targeted linear; model/lora_config.h) and the modules_to_save
  // tensors are trainable, with master, momentum and variance as any parameter. So:
  //   - InitializeParameters: frozen tensors get the seeded values of the full model (same
  //     streams) rounded to the compute dtype in their param slots; A = InitLoraA (PEFT's
  //     Kaiming-uniform, stream = the tensor's index in the unsplit LoraModelOperators order), B
  //     = 0; trainable tensors' master/param set and moments zeroed.
  //   - LoadHfCheckpoint sets the base tensors (frozen: param slot only, rounded once) and
  //     leaves the adapters as they are (initialize them or LoadPeftAdapter).
  //   - ReadTensor(kMaster, frozen tensor) reads its param slot (the frozen value: there is no
  //     master); kMomentum / kVariance of a frozen tensor: FailedPrecondition.
  //   - The training state (LoadTrainingState, VisitTrainingState, TrainingStateTensors,
  //     HoldsTrainingState) covers the trainable tensors only.
  //   - SaveHfCheckpoint writes the base as stored (frozen params as f32 of their slot values,
  //     modules_to_save from their masters): unmerged; SaveMergedHfCheckpoint merges.
  // The LoRA configuration, or nullopt.
  const std::optional<LoraConfig>& lora() const { return options_.lora; }

  // 4-bit base (options.quant4; model/quant4_config.h). The frozen block linears of
  // Quant4Weights are stored in their chunks as 4-bit blobs (codes and scales, a fraction of the
  // bytes), and every GEMM over one dequantizes tiles of it (Kernels::Quant4LinearForward and
  // Quant4LinearBackwardInput). Everything outside compute sees the logical tensors:
  //   - InitializeParameters and LoadHfCheckpoint quantize each such weight from its f32 values
  //     (bitsandbytes' algorithm, model/kernels/nf4.h), one tensor at a time; LoadHfCheckpoint of
  //     a directory saved pre-quantized by transformers + bitsandbytes takes its codes and scales
  //     as they are.
  //   - ReadTensor / ReadTensorRange / ParameterSpecs give the dequantized values and the Hugging
  //     Face shape, so SaveHfCheckpoint and SaveMergedHfCheckpoint write 16/32-bit weights, and
  //     BaseFingerprint digests the dequantized base.
  //   - The nested (double quantization) offset of each weight is kept on the host
  //     (quant4_table()); with world size > 1 only plain absmax is supported (each rank
  //     quantizes its own chunks and could not know the others' offsets).
  const std::optional<Quant4Config>& quant4() const { return options_.quant4; }

  // ZeRO (a layout of world size N > 1, scheduler/chunk_manager.h): every method that sets or
  // reads the training state touches only the chunks this rank owns (those whose master chunk it
  // holds); the other ranks' parameters reach this rank through the manager's all-gathers. The
  // setters (InitializeParameters, LoadGpt2Checkpoint, LoadTrainingState) must be called on every
  // rank, as they first drop the gathered copies (ChunkManager::ReleaseRemoteChunks). Because the
  // initialization is seeded per tensor, N ranks initialize the same model as one rank does.
  //
  // The seeded initialization (model/parameter_init.h: reproducible from `seed` alone on any
  // platform, one stream per tensor; GPT-2: weights ~ N(0, 0.02), the residual projections
  // ~ N(0, 0.02 / sqrt(2 num_layers)), biases 0, LayerNorm weights 1; Llama: N(0, 0.02)
  // throughout, norm weights 1). Writes the master (f32) chunks and the param chunks (the
  // master value rounded to the compute dtype) and zeroes momentum and variance. Runs outside an
  // iteration (the accesses are untracked; chunks end up on the host).
  // FailedPrecondition inside an iteration; errors of the manager.
  //
  // `options.adapters_only` (LoRA): only the adapters get their seeded values (A = InitLoraA, B =
  // 0, the same values as the full initialization's); no base tensor is written or even accessed
  // — what a run needs whose base LoadHfCheckpoint then fills (--init_from, a preset's weights).
  // The base's slots hold whatever they held until then. InvalidArgument without LoRA.
  // `options.progress` hears (elements set so far, elements to set) after each tensor.
  [[nodiscard]] absl::Status InitializeParameters(uint64_t seed, const InitializeOptions& options);
  [[nodiscard]] absl::Status InitializeParameters(uint64_t seed) {
    return InitializeParameters(seed, InitializeOptions{});
  }
  [[nodiscard]] absl::Status InitializeParameters() { return InitializeParameters(options_.seed); }

  // Forward and backward of one batch inside the caller's iteration (ChunkManager::BeginIteration
  // before, the optimizer step and EndIteration after: see TrainStep). `tokens` and `targets`
  // are [batch, seq_len] row-major; targets[b, t] is the token predicted from tokens[b, 0..t], or
  // kIgnoreIndex. Returns the mean cross-entropy over the non-ignored targets; the param chunks'
  // slots then hold d(loss * loss_scale) / d(param) (loss_scale > 0 is the loss scaler's scale).
  // Until the optimizer step writes the new parameters back into those slots, the model has no
  // parameters in them, so ForwardBackward and Evaluate refuse to run (FailedPrecondition naming a
  // tensor) while any param tensor is HOLD_AFTER_BWD; the optimizer step (even a skipped one,
  // which restores the parameters from the master copy) and InitializeParameters /
  // LoadGpt2Checkpoint end that.
  // Errors: InvalidArgument for inputs of the wrong size, a token outside [0, vocab) or a target
  // outside [0, vocab) other than kIgnoreIndex, or loss_scale <= 0 (nothing is accessed then);
  // FailedPrecondition outside an iteration; ResourceExhausted from the manager (an operator's
  // working set does not fit) or from the scratch allocator (activations do not fit), with their
  // messages. After an error in the middle, the operator being computed is released and all
  // activations are freed, but some gradients may already be written: abandon the iteration's
  // update and re-initialize or reload the parameters.
  // `dropout_seed` seeds the LoRA dropout masks of this micro-batch (the trainer passes a seed
  // derived from its seed and the global micro-batch index); ignored without LoRA dropout. An
  // activation-checkpointing recompute regenerates the same masks.
  [[nodiscard]] absl::StatusOr<double> ForwardBackward(absl::Span<const int32_t> tokens,
                                                       absl::Span<const int32_t> targets,
                                                       double loss_scale = 1.0,
                                                       uint64_t dropout_seed = 0);
  // The same for a batch that may carry positions and key_start (ModelInputs).
  [[nodiscard]] absl::StatusOr<double> ForwardBackward(const ModelInputs& inputs,
                                                       double loss_scale = 1.0,
                                                       uint64_t dropout_seed = 0);

  // Forward only (validation): the mean cross-entropy, keeping no activation beyond the one block
  // being computed. Runs outside an iteration (untracked accesses, the schedule is not disturbed).
  // Errors as ForwardBackward; FailedPrecondition inside an iteration.
  [[nodiscard]] absl::StatusOr<double> Evaluate(absl::Span<const int32_t> tokens,
                                                absl::Span<const int32_t> targets);
  [[nodiscard]] absl::StatusOr<double> Evaluate(const ModelInputs& inputs);

  // InvalidArgument unless `tokens` and `targets` are a batch ForwardBackward accepts (sizes,
  // token and target ranges); touches nothing. The training step (trainer/train_step.h) checks
  // its batch with it before opening an iteration.
  [[nodiscard]] absl::Status CheckInputs(absl::Span<const int32_t> tokens,
                                         absl::Span<const int32_t> targets) const;
  // The same, and for positions and key_start: both empty, or both [batch, seq_len] in a model
  // created with token_metadata, with 0 <= positions[b, t] < seq_len, 0 <= key_start[b, t] <= t
  // and key_start non-decreasing along each row (InvalidArgument naming the element).
  [[nodiscard]] absl::Status CheckInputs(const ModelInputs& inputs) const;

  // A copy of tensor `name` of chunk `type`, converted to f32, read where the chunk's payload is
  // now (an accelerator payload through the pinned staging buffer: see the file comment; the
  // host waits for the copy); no chunk moves and no moment, so it may be called between the
  // backward and the optimizer step to read gradients. While no operator is accessed. `name` is a
  // stored tensor (ParameterNames: "h.0.attn.c_attn.weight", "wte.weight[0:2048]") or a Hugging
  // Face tensor held in row blocks ("wte.weight", assembled from its blocks; all of them must have
  // payloads on this rank). NotFound for an unknown name; FailedPrecondition if a chunk has no
  // payload — except an optimizer-state chunk this rank holds whose bytes are on disk (the disk
  // tier), which is read through the manager outside an iteration (model/model_state_io.h).
  // LoRA: kMaster of a frozen tensor reads its param slot (the frozen value: there is no master);
  // kMomentum / kVariance of a frozen tensor are FailedPrecondition ("frozen: no optimizer
  // state"); kParam of a frozen tensor is always the parameter (its backward writes no gradient).
  [[nodiscard]] absl::StatusOr<std::vector<float>> ReadTensor(ChunkType type,
                                                              absl::string_view name) const;
  // The same into `out` (sized to the tensor; InvalidArgument otherwise).
  [[nodiscard]] absl::Status ReadTensorInto(ChunkType type, absl::string_view name,
                                            absl::Span<float> out) const;

  // Hugging Face GPT-2 checkpoint import: sets the parameters (param and master chunks, momentum
  // and variance zeroed) from `checkpoint`, whose dimensions must match the config
  // (InvalidArgument naming both otherwise). Outside an iteration (FailedPrecondition otherwise,
  // and for a model of the Llama architecture).
  [[nodiscard]] absl::Status LoadGpt2Checkpoint(const Gpt2Checkpoint& checkpoint);
  // Hugging Face directory import (any architecture): sets the parameters from `checkpoint`,
  // whose config must describe this model (every field but name and torch_dtype equal;
  // InvalidArgument naming the directory and both configs otherwise). Reads element ranges, one
  // chunk at a time. Outside an iteration.
  // `progress` hears (bytes of the directory's tensors read, bytes to read), base/progress.h.
  [[nodiscard]] absl::Status LoadHfCheckpoint(const HfCheckpoint& checkpoint,
                                              ProgressFn progress = nullptr);
  // Hugging Face directory export of the master weights as `dtype` (WriteHfCheckpoint: streaming
  // element ranges, sharded above options.max_shard_bytes, atomic). Outside an iteration;
  // FailedPrecondition for world size > 1 (as SaveGpt2Safetensors). LoRA: the base as stored —
  // frozen tensors as the f32 of their param slots, modules_to_save from their masters — without
  // the adapters (unmerged; SaveMergedHfCheckpoint merges them, SavePeftAdapter exports them).
  [[nodiscard]] absl::Status SaveHfCheckpoint(const std::string& dir, DType dtype,
                                              const HfExportOptions& options = {}) const;
  // LoRA only (FailedPrecondition without). Reads PEFT adapter directory `dir`
  // (ReadPeftAdapter) and sets the adapters (and the modules_to_save tensors it holds) from it:
  // master and param, moments zeroed. Its configuration must equal the model's in r, lora_alpha,
  // the targeted modules and modules_to_save (InvalidArgument naming the key, the directory's
  // value and ours); ReadPeftAdapter's errors (shapes, missing tensors) as they are. Outside an
  // iteration; on every rank under ZeRO.
  [[nodiscard]] absl::Status LoadPeftAdapter(const std::string& dir);
  // LoRA only. Writes PEFT adapter directory `dir` (WritePeftAdapter, atomic): the adapters'
  // master weights (and the modules_to_save tensors') as `dtype`, adapter_config.json naming
  // `base_model_name_or_path` (empty: null). Outside an iteration; FailedPrecondition for world
  // size > 1 (as SaveHfCheckpoint).
  [[nodiscard]] absl::Status SavePeftAdapter(const std::string& dir, DType dtype,
                                             const std::string& base_model_name_or_path) const;
  // LoRA only. A Hugging Face directory of the merged model: every adapted weight W + scale B A
  // (GPT-2's Conv1D W[in, out] + scale (B A)^T), computed in f32 from the frozen param slot
  // values and the adapters' master weights, element range by element range as the writer asks
  // (never the whole model in memory); other tensors as SaveHfCheckpoint. Same writer, options
  // and errors as SaveHfCheckpoint.
  [[nodiscard]] absl::Status SaveMergedHfCheckpoint(const std::string& dir, DType dtype,
                                                    const HfExportOptions& options = {}) const;
  // LoRA only. A digest of the frozen base: 16 hex digits of a 64-bit hash over, per frozen
  // tensor in operator order (whole Hugging Face tensors, whatever the vocabulary split), the
  // pieces: its name, one NUL byte, each dimension as an int64, the compute dtype's name, and
  // its stored values (read through the staged reader as their exact f32 conversions, in pieces
  // of 2^20 values). The hash is FNV-1a over 64-bit words: from h = 0xcbf29ce484222325, each
  // piece of bytes is taken as little-endian words (the last one zero-padded) and then its byte
  // count, each word w as h = ((h ^ w) * 0x100000001b3), h ^= h >> 32. Stable across runs and
  // machines (checkpoints store it; model/base_fingerprint_test holds golden digests computed
  // from this comment by model/testdata/make_base_fingerprint_golden.py).
  // Two bases hash equal iff (barring collisions) they hold the same frozen tensors with the same
  // stored values. Outside an iteration; FailedPrecondition for world size > 1 (no rank holds the
  // whole base).
  [[nodiscard]] absl::StatusOr<std::string> BaseFingerprint() const;

  // Elements [first_elem, first_elem + out.size()) of Hugging Face tensor `name` of chunk `type`
  // as f32, assembled across row blocks; the reading rules of ReadTensorInto.
  [[nodiscard]] absl::Status ReadTensorRange(ChunkType type, absl::string_view name,
                                             int64_t first_elem, absl::Span<float> out) const;
  // Checkpoint resume: sets the training state of every tensor this rank holds (see
  // HoldsTrainingState) from `fill(name, type, out)`,
  // called for type kMaster, kMomentum and kVariance in turn (f32 values, `out` sized to the
  // tensor), and each param slot to its master value rounded to the compute dtype — exactly what
  // an optimizer step leaves there, so training continues bit for bit. Outside an iteration
  // (FailedPrecondition otherwise); errors of `fill` are returned as they are (the state is then
  // partially set: load again or re-initialize).
  using TrainingStateFillFn = ModelStateIo::TrainingStateFillFn;  // (name, type, out)
  [[nodiscard]] absl::Status LoadTrainingState(const TrainingStateFillFn& fill);
  // The counterpart for checkpoints: calls `visit(name, type, values)` for every tensor whose
  // training state this rank holds (all of them for world size 1) and type kMaster, kMomentum,
  // kVariance (f32), reading the chunks where they are. Outside an iteration.
  using TrainingStateVisitFn = ModelStateIo::TrainingStateVisitFn;  // (name, type, values)
  [[nodiscard]] absl::Status VisitTrainingState(const TrainingStateVisitFn& visit) const;
  // The tensors VisitTrainingState visits, in its order, without reading them (names, types and
  // shapes: the table of contents of a checkpoint of this rank).
  std::vector<TrainingStateTensor> TrainingStateTensors() const;
  // Whether this rank holds the training state (master, momentum, variance) of parameter `name`:
  // always for world size 1; for the tensors of the chunks it owns under ZeRO. False for an
  // unknown name.
  bool HoldsTrainingState(absl::string_view name) const;
  // The stored tensors' names in checkpoint order (the operators' order of GptOperators): wte's
  // row blocks under their block names ("wte.weight[0:2048]"), so a ZeRO rank can hold some of
  // them.
  std::vector<std::string> ParameterNames() const;
  // The stored tensors (names and shapes) in that order.
  std::vector<TensorSpec> ParameterSpecs() const;
  // Rows per wte block of this model's layout (vocab_size when wte is whole).
  int64_t vocab_block_rows() const;
  // Export: writes the master weights (f32, exact) to `path` as a Hugging Face GPT-2 safetensors
  // file stored as `dtype`. Outside an iteration; FailedPrecondition for world size > 1 (no rank
  // holds every master weight: gather them, as the trainer's export does) and for a Llama-
  // architecture model (SaveHfCheckpoint exports it). I/O errors of WriteGpt2Safetensors.
  [[nodiscard]] absl::Status SaveGpt2Safetensors(const std::string& path, DType dtype) const;

  // The GPT-2 view of the dimensions (for a Llama model: name, vocab, max_position_embeddings,
  // hidden, layers and heads; the rest of its shape is in model_config()).
  const GptConfig& config() const { return config_; }
  const ModelConfig& model_config() const { return model_config_; }
  const TransformerBlockSpec& block_spec() const { return spec_; }
  const GptModelOptions& options() const { return options_; }
  int64_t batch() const { return options_.batch; }
  int64_t seq_len() const { return options_.seq_len; }
  // Gpt2Dims of the config, for checkpoint I/O.
  Gpt2Dims dims() const;

 private:
  GptModel(const ModelConfig& config, const GptConfig& gpt, ChunkStore* store,
           ChunkManager* manager, DeviceMemory* accelerator, const GptModelOptions& options);
  static absl::StatusOr<std::unique_ptr<GptModel>> CreateImpl(
      const ModelConfig& config, const GptConfig& gpt, ChunkStore* store, ChunkManager* manager,
      DeviceMemory* accelerator, const GptModelOptions& options);

  // The program's operators and tensors in the store's layout (every parameter tensor also into
  // param_tensors_); InvalidArgument naming what does not match the config.
  absl::StatusOr<ProgramLayout> ResolveLayout();
  // FailedPrecondition if a param slot holds a gradient (its tensor is HOLD_AFTER_BWD: a backward
  // released it and no optimizer step or reload has written the parameter back since).
  absl::Status CheckParametersInSlots(absl::string_view caller) const;
  // The backend of the accelerator memory (InternalError if it has none).
  absl::StatusOr<Backend*> AcceleratorBackend() const;

  const ModelConfig model_config_;
  const GptConfig config_;
  const TransformerBlockSpec spec_;
  GptModelOptions options_;
  ChunkStore* const store_;
  ChunkManager* const manager_;
  DeviceMemory* const accelerator_;
  std::unique_ptr<ThreadPool> pool_;
  // The kernels and the compute stream (options', or the model's own). The owned ones are
  // destroyed first (the stream, waiting for its work, then the kernels), before the pool.
  Kernels* kernels_ = nullptr;
  Stream* stream_ = nullptr;
  std::unique_ptr<Kernels> owned_kernels_;
  std::unique_ptr<Stream> owned_stream_;
  // The stream the host waits for before each Release: the owned stream (the manager does not
  // order by it); null with the caller's stream (the manager's compute stream).
  Stream* release_wait_ = nullptr;

  // The forward and backward, and the live context they run over (destroyed before the stream
  // its uploads copy on).
  std::optional<TransformerProgram> program_;
  std::unique_ptr<LiveProgramContext> live_;
  // ForwardBackward's token -> slot map of the batch's distinct tokens ([vocab], reused).
  std::vector<int32_t> slot_of_token_;
  // Hugging Face tensor name -> its index in the unsplit ModelOperators order (the
  // initialization's stream).
  absl::flat_hash_map<std::string, uint64_t> init_stream_;
  // The 4-bit weights (options.quant4) and their nested offsets; null without quant4.
  std::shared_ptr<Quant4Table> quant4_table_;
  // Every parameter tensor in ModelOperators order (the initialization's stream index).
  std::vector<TensorId> param_tensors_;

  // The state read and set outside compute (reads, checkpoints, imports and exports).
  std::unique_ptr<ModelStateIo> io_;
};

// The architecture-neutral name.
using TransformerModel = GptModel;
using TransformerModelOptions = GptModelOptions;

}  // namespace ps

#endif  // PATRICKSTAR_MODEL_GPT_MODEL_H_
