// HybridAdam: one Adam/AdamW step over every chunk this rank owns, each chunk run on the device
// where its master payload lives during the ADAM stage — the host (CpuAdam) or the accelerator
// (CudaAdam on a GPU; CpuAdam for the cpu backend's emulated accelerator, whose memory is host
// RAM). Which chunks are on the accelerator is the scheduler's ADAM-stage placement; HybridAdam
// does not decide it and does not depend on scheduler/: the placement reaches it through the
// AdamChunkAccess interface below, which trainer/scheduled_chunk_access.h implements over the
// scheduler's ChunkManager (and ResidentChunkAccess over a ChunkStore whose chunks are already
// where they should be).
//
// Frozen chunks (chunk/chunk_layout.h: a LoRA fine-tune's base model) hold no master payload, so
// no rank owns them here: every pass below (gradient statistics for the overflow check and the
// clipping norm, accumulation, the skipped-step restore, the update) skips them, their param
// payloads are never read or written, and owned_param_elems() counts trainable parameters only.
//
// One Step():
//   1. Reads the hyperparameters now: every group's lr and weight decay, betas, eps, the clipping
//      threshold — an LR schedule that calls SetLearningRate() between steps takes effect.
//      (PatrickStar copied lr into per-parameter state at construction, so schedulers did
//      nothing.)
//   2. Gradient pass: for every owned chunk, the sum of squares and Inf/NaN count of the gradients
//      in its param chunk (GradStats), over the tensors only — gaps between tensors hold garbage.
//      The optional reducer (all-reduce over ranks, from comm/) makes them global.
//   3. Inf/NaN anywhere: the first one this rank holds is located (a second pass over the
//      first chunk that had one: per tensor, then a bisection to the element — only on this
//      path), every owned param chunk, whose slots hold gradients, gets its parameters back from
//      the master copy (rounded to the compute dtype, so bit-identical to the parameters before
//      backward), and the step counter does not advance. Then:
//       - f32 and bf16 parameters: nothing is loss-scaled, so an Inf/NaN gradient is divergence,
//         not a loss-scale event: Step returns OutOfRange naming the tensor and element and what
//         to do (lower the learning rate, clip gradients, check the data).
//       - f16 parameters: the step is skipped — a loss-scale event: the loss scaler lowers the
//         scale as its policy says (OutOfRange when it is already at min_loss_scale, as
//         DeepSpeed raises) — unless more than max_consecutive_skipped_steps steps in a row have
//         now been skipped (OutOfRange).
//   4. Otherwise the clipping coefficient is computed from the global norm of the unscaled
//      gradients (a true L2 norm; optimizer/grad_clip.h), and the fused Adam kernel updates
//      master/momentum/variance of every owned chunk and writes the new parameters into the param
//      chunk, one kernel call per chunk with one segment per run of same-group tensors.
//   5. The loss scaler sees a clean step; the step counter advances.
//
// Gradient accumulation (gradient_accumulation_steps = k > 1): an optimizer step consumes k
// micro-batches. After each of micro-batches 1..k-1 the caller runs Accumulate() instead of
// Step(): the gradient pass checks that micro-batch's gradients (the overflow check covers every
// micro-batch), the param slots are added into an f32 accumulator in host memory held only for the
// owned chunks (GradientAccumulatorBytes, optimizer/grad_accumulator.h), and the parameters are
// restored from the master copy (the skipped-step restore). Step() after the k-th micro-batch
// folds its gradients into the accumulator, takes the norm of the sum, and updates from the
// accumulator with the unscale factor loss_scale * k — each micro-batch's loss is a mean over its
// own tokens, so (g_1 + ... + g_k) / k is the gradient of the mean over all k micro-batches, the
// gradient one batch of k times the sequences would give. Then the accumulator is zeroed. An
// Inf/NaN in any micro-batch: f32/bf16 stop (OutOfRange) at that micro-batch; f16 skips the
// whole step at its end. Nothing about accumulation is checkpointed: between steps the
// accumulator is zero. The accumulator is host memory for GPU chunks too: CudaAdam stages it
// through the bus (optimizer/cuda/cuda_adam.h), and updates from it with the sum staged likewise.
//
// The emulated accelerator (cpu backend): its chunks run through the CpuAdam passed as
// HybridAdamKernels::accelerator, directly on the calling thread, not enqueued on a stream with
// Stream::LaunchHostFunc. Stream ordering would buy nothing: Acquire returns only once the
// payloads are resident (any move has completed), and the step needs each pass's result on the
// host before the next pass anyway (the overflow decision precedes every update). Running on the
// calling thread also lets CpuAdam's pool use every core instead of one stream worker thread.
//
// Parameter groups: each tensor belongs to the first group whose selector accepts it (a group
// with no selector accepts everything; every tensor must find a group). Groups have their own lr
// and weight decay, e.g. no decay on biases and LayerNorm weights (IsBiasOrNormTensor).
//
// Thread safety: thread-compatible. Step() runs the kernels, which use their own threads.
#ifndef PATRICKSTAR_OPTIMIZER_HYBRID_ADAM_H_
#define PATRICKSTAR_OPTIMIZER_HYBRID_ADAM_H_

#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "chunk/chunk_layout.h"
#include "chunk/chunk_store.h"
#include "memory/backend.h"
#include "memory/device.h"
#include "memory/dtype.h"
#include "optimizer/adam_kernels.h"
#include "optimizer/adam_math.h"
#include "optimizer/loss_scaler.h"

namespace ps {

// What a pass over a chunk needs resident.
enum class AdamChunkUse : uint8_t {
  kGradients,  // the param chunk, read (its slots hold gradients)
  kRestore,    // the param chunk (written) and the master chunk (read)
  kUpdate,     // all four: param, master, momentum, variance
};

// The payloads of chunk i of each type, on one device. Pointers not needed by the use are null.
// Each points at the whole payload (capacity elements); tensors sit at their layout offsets.
struct AdamChunkPayloads {
  Device device;
  void* param = nullptr;  // compute dtype
  float* master = nullptr;
  float* exp_avg = nullptr;
  float* exp_avg_sq = nullptr;
};

// The ADAM-stage placement as HybridAdam sees it. Acquire(i, use) makes the payloads `use` needs of
// owned chunk i resident on one device — the device its placement chose for the chunk's master —
// and keeps them there, unmoved, until Release(i, use). HybridAdam acquires one chunk at a time,
// in ascending index order, once per pass, and releases it before acquiring the next.
class AdamChunkAccess {
 public:
  virtual ~AdamChunkAccess() = default;
  [[nodiscard]] virtual absl::StatusOr<AdamChunkPayloads> Acquire(int64_t chunk_index,
                                                                  AdamChunkUse use) = 0;
  [[nodiscard]] virtual absl::Status Release(int64_t chunk_index, AdamChunkUse use) = 0;
  // Whether payloads on `device` may be read and written by the host directly (memcpy): the
  // host, and an emulated accelerator whose memory is host RAM. optimizer.overlap speculates
  // only on such chunks (its snapshot and rollback are host copies).
  virtual bool HostAddressable(Device device) const { return device.is_host(); }
};

// AdamChunkAccess over a ChunkStore whose chunks are already where the step should run them (no
// moves; Release does nothing): each chunk runs where its payloads are. FailedPrecondition from
// Acquire if a needed payload is missing (RELEASED) or the needed payloads are not all on one
// device, naming the chunk and the devices. The store must outlive this object.
class ResidentChunkAccess final : public AdamChunkAccess {
 public:
  explicit ResidentChunkAccess(const ChunkStore& store) : store_(store) {}
  [[nodiscard]] absl::StatusOr<AdamChunkPayloads> Acquire(int64_t chunk_index,
                                                          AdamChunkUse use) override;
  [[nodiscard]] absl::Status Release(int64_t chunk_index, AdamChunkUse use) override {
    return absl::OkStatus();
  }

 private:
  const ChunkStore& store_;
};

// True for tensors that conventionally get no weight decay: biases and LayerNorm parameters
// (names ending in "bias", or containing "ln_", "layernorm", "layer_norm" or "norm.").
bool IsBiasOrNormTensor(const TensorInfo& tensor);

struct ParamGroupOptions {
  std::string name;
  double lr = 1e-3;
  double weight_decay = 0.0;
  // Which tensors the group takes; empty: every tensor not taken by an earlier group.
  std::function<bool(const TensorInfo&)> selector = nullptr;
};

struct HybridAdamOptions {
  AdamMode mode = AdamMode::kAdam;  // DeepSpeed/PatrickStar optimizer.type "Adam"
  double beta1 = 0.9;
  double beta2 = 0.999;
  double eps = 1e-8;
  // gradient_clipping: the global L2 norm the unscaled gradients are clipped to; <= 0: off.
  double max_grad_norm = 0.0;
  // At least one.
  std::vector<ParamGroupOptions> groups = {ParamGroupOptions{.name = "default"}};
  // Dynamic or static loss scaling; None() when gradients are not scaled.
  LossScaler loss_scaler = LossScaler::None();
  // Makes the gradient statistics of all ranks global (sums them; comm/ provides it). Empty for
  // a single rank.
  std::function<absl::Status(GradStats&)> grad_stats_reducer = nullptr;
  // f16 parameters only: the most steps in a row that may be skipped for Inf/NaN gradients; the
  // next one is OutOfRange. -1: no limit of its own (the loss scaler's min_loss_scale error still
  // stops a dynamic scale). The trainer sets it from fp16.max_consecutive_skipped_steps.
  int64_t max_consecutive_skipped_steps = -1;
  // Micro-batches per optimizer step (gradient_accumulation_steps), >= 1. With k > 1 the
  // optimizer allocates its accumulator (GradientAccumulatorBytes) at Create.
  int64_t gradient_accumulation_steps = 1;
  // optimizer.overlap (docs/pipeline.md): the trainer may run owned chunks' updates during
  // backward, speculatively (SpeculateChunk), with the serialized step's bits. Off: Step only.
  bool overlap = false;
  // The most host bytes the speculation's rollback snapshot may hold (OverlapSnapshotBytes gives
  // what one chunk needs); chunks beyond it wait for the verdict. >= 0.
  int64_t overlap_snapshot_bytes = int64_t{256} << 20;
};

// The per-step hyperparameters a caller may change between steps.
struct ParamGroupSettings {
  double lr = 1e-3;
  double weight_decay = 0.0;
};

// Kernels for each kind of device. `host` is required; `accelerator` may be null if no chunk will
// ever be stepped on the accelerator (an accelerator chunk is then FailedPrecondition). Both must
// outlive the optimizer; they may be the same object (the emulated accelerator).
struct HybridAdamKernels {
  AdamKernels* host = nullptr;
  AdamKernels* accelerator = nullptr;
  // Optional (gradient_accumulation_steps > 1): the backend whose pinned host memory holds the
  // accumulator instead of pageable memory; must outlive the optimizer. With the cuda backend,
  // pinned memory is mapped into the GPU's address space, so CudaAdam accumulates a GPU chunk's
  // gradients into it in place instead of staging them through pageable 1 MiB tiles, each a
  // synchronous round trip. The accumulator stays in host memory either way (the same host bytes
  // GradientAccumulatorBytes counts). Null: a std::vector.
  Backend* pinned_accumulator_backend = nullptr;
};

struct AdamStepReport {
  // True for Accumulate(): the micro-batch's gradients were added (or, f16, an Inf/NaN among
  // them recorded so that the step will be skipped); no step was taken.
  bool accumulated = false;
  // True if the step was skipped because a gradient was Inf/NaN.
  bool skipped = false;
  // Global L2 norm of the unscaled gradients (before clipping); Inf/NaN-free only if !skipped.
  double grad_norm = 0.0;
  // The coefficient the gradients were multiplied by (1: no clipping).
  double clip_coef = 1.0;
  // The loss scale the gradients carried, and the scale for the next iteration.
  double loss_scale = 1.0;
  double next_loss_scale = 1.0;
  int64_t nonfinite_grads = 0;
  // When Inf/NaN gradients were found: where the first one this rank holds is, e.g.
  // "h.1.attn.c_attn.weight at [3, 17] (NaN)", or "on another rank".
  std::string first_nonfinite;
  // f16: steps skipped in a row, this one included (0 after a clean step).
  int64_t consecutive_skipped_steps = 0;
  // Adam's step count after this step (unchanged when skipped).
  int64_t step = 0;
  // Owned chunks stepped on each kind of device.
  int64_t host_chunks = 0;
  int64_t accelerator_chunks = 0;
  // optimizer.overlap (docs/pipeline.md): owned chunks updated speculatively during backward,
  // and whether those updates were rolled back (the serialized step then ran).
  int64_t speculated_chunks = 0;
  bool speculation_rolled_back = false;
};

// Host bytes the overlap's rollback snapshot takes for `elems` parameters with `compute_dtype`
// gradients: the old master, exp_avg and exp_avg_sq (f32) and the gradient.
inline int64_t OverlapSnapshotBytes(int64_t elems, DType compute_dtype) {
  return elems * (12 + SizeOf(compute_dtype));
}

class HybridAdam {
 public:
  // Builds the optimizer for the chunks `rank` owns in `layout` (those whose master payload it
  // holds: never a frozen chunk), with parameters in `compute_dtype`. Assigns every tensor of those chunks to a group.
  // InvalidArgument naming the option for bad hyperparameters (lr < 0, betas outside [0, 1),
  // eps < 0, weight_decay < 0, non-finite values, no groups), a tensor no group takes, or a
  // missing host kernel. The layout is only read here: tensors placed or moved later are not
  // seen (create a new optimizer after changing the layout).
  static absl::StatusOr<std::unique_ptr<HybridAdam>> Create(const ChunkLayout& layout, int rank,
                                                            DType compute_dtype,
                                                            HybridAdamOptions options,
                                                            HybridAdamKernels kernels);

  HybridAdam(const HybridAdam&) = delete;
  HybridAdam& operator=(const HybridAdam&) = delete;

  // One optimizer step, as described at the top of the file. Errors: InvalidArgument for
  // hyperparameters made invalid since the last step (nothing is touched); the access's and the
  // kernels' errors; FailedPrecondition for an accelerator chunk without accelerator kernels;
  // OutOfRange for Inf/NaN gradients that stop the run (see step 3 at the top: f32/bf16, an
  // overflow at min_loss_scale, too many skipped steps in a row), naming the first tensor and
  // element that held one — the step was not applied and the parameters are restored; Internal
  // if the update saw Inf/NaN gradients the gradient pass did not (the gradients changed during
  // the step). An error after the first chunk was updated leaves the step partially applied;
  // resume from a checkpoint.
  //
  // With gradient_accumulation_steps k > 1: FailedPrecondition (nothing touched) unless exactly
  // k - 1 Accumulate() calls came since the last step.
  [[nodiscard]] absl::StatusOr<AdamStepReport> Step(AdamChunkAccess& access);

  // Micro-batches 1..k-1 of a step with gradient accumulation (see the top of the file): adds the
  // gradients in the owned param slots into the accumulator and restores the parameters from
  // the master copy. FailedPrecondition (nothing touched) when k == 1 or k - 1 micro-batches are
  // already pending; OutOfRange for Inf/NaN gradients with f32/bf16 parameters (the parameters are
  // restored, the pending micro-batches discarded); the access's and kernels' errors.
  [[nodiscard]] absl::StatusOr<AdamStepReport> Accumulate(AdamChunkAccess& access);
  // Micro-batches accumulated since the last step (0 at step boundaries).
  int64_t pending_micro_batches() const { return pending_micro_batches_; }
  int64_t gradient_accumulation_steps() const { return accumulation_steps_; }
  // Parameters in the owned chunks (the accumulator's length when k > 1).
  int64_t owned_param_elems() const { return owned_param_elems_; }

  // --- optimizer.overlap: Adam inside backward (docs/pipeline.md) ----------------------------
  //
  // BeginSpeculation() before backward; SpeculateChunk(access, i) whenever owned chunk i's
  // gradients are final (the trainer calls it from the ChunkManager's gradients-final hook, with
  // an access that puts the chunk on the host); then Step() validates: it combines the kept
  // per-chunk gradient statistics with those of the other chunks in ascending chunk order (the
  // serialized pass's sum, bit for bit), and either commits (no Inf/NaN, clip coefficient 1,
  // scalars unchanged: only the chunks not yet updated are updated) or rolls every speculated
  // chunk back from the snapshot and runs the serialized step. Either way the result has the
  // bits of the step without speculation. An error between BeginSpeculation and Step: call
  // AbortSpeculation (rolls back) before anything else touches the chunks.

  bool overlap() const { return overlap_; }
  void set_overlap(bool overlap) { overlap_ = overlap; }
  int64_t overlap_snapshot_bytes() const { return overlap_snapshot_bytes_; }
  // Starts speculation for the coming Step if it may speculate: overlap on, no gradient
  // accumulation (k == 1), valid hyperparameters, and the previous step neither clipped nor was
  // skipped nor saw an Inf/NaN while speculating (the predictor). Returns whether it did. The
  // lr, betas, eps, weight decay, loss scale and step are read now; Step checks they did not
  // change (a change rolls back).
  bool BeginSpeculation();
  bool speculating() const { return spec_.active; }
  // Owned chunk `chunk_index`'s gradients are final. Keeps its GradStats and, unless it holds an
  // Inf/NaN (speculation then stops for this step) or the snapshot budget is spent, snapshots
  // and updates it with clip coefficient 1. Does nothing when not speculating, for a chunk this
  // rank does not own, or a chunk already seen this step. Acquires the chunk with kUpdate.
  [[nodiscard]] absl::Status SpeculateChunk(AdamChunkAccess& access, int64_t chunk_index);
  // Rolls back every speculated chunk and ends the speculation (no step is taken).
  [[nodiscard]] absl::Status AbortSpeculation(AdamChunkAccess& access);
  // Test hook: flips one bit of the first snapshotted master value, so that a test can show
  // that a wrong rollback is caught. False if nothing is snapshotted.
  bool CorruptSnapshotForTesting();

  // --- Hyperparameters, read at every step ---------------------------------------------------

  // Sets every group's learning rate (what DeepSpeed's schedulers do).
  void SetLearningRate(double lr);
  int num_param_groups() const { return static_cast<int>(group_names_.size()); }
  const std::string& param_group_name(int group) const { return group_names_[group]; }
  // REQUIRES: 0 <= group < num_param_groups().
  ParamGroupSettings& param_group(int group) { return group_settings_[group]; }
  const ParamGroupSettings& param_group(int group) const { return group_settings_[group]; }
  // The group of a tensor; -1 if the tensor is not in a chunk this rank owns.
  int group_of(TensorId tensor) const;
  AdamMode mode() const { return mode_; }
  void set_betas(double beta1, double beta2) {
    beta1_ = beta1;
    beta2_ = beta2;
  }
  void set_eps(double eps) { eps_ = eps; }
  void set_max_grad_norm(double max_grad_norm) { max_grad_norm_ = max_grad_norm; }

  // --- State --------------------------------------------------------------------------------

  // Adam steps taken (skipped steps do not count): the next step uses bias correction step() + 1.
  int64_t step() const { return step_; }
  // For resuming from a checkpoint.
  void set_step(int64_t step) { step_ = step; }
  // f16: the steps skipped in a row so far (for checkpoints, so the limit spans a resume).
  int64_t consecutive_skipped_steps() const { return consecutive_skipped_steps_; }
  void set_consecutive_skipped_steps(int64_t n) { consecutive_skipped_steps_ = n; }
  LossScaler& loss_scaler() { return loss_scaler_; }
  const LossScaler& loss_scaler() const { return loss_scaler_; }
  // Owned chunk indices, ascending.
  const std::vector<int64_t>& owned_chunks() const { return owned_chunks_; }

 private:
  // Contiguous tensors of one chunk in one group: elements [offset_elems, offset_elems + numel).
  struct Run {
    int64_t offset_elems;
    int64_t numel;
    int group;
  };
  // A tensor of an owned chunk, for naming the first Inf/NaN gradient.
  struct Slot {
    std::string name;
    std::vector<int64_t> shape;
    int64_t offset_elems;
    int64_t numel;
  };

  HybridAdam() = default;

 public:
  ~HybridAdam();

 private:
  absl::Status ValidateHyperParams() const;
  absl::StatusOr<AdamKernels*> KernelsFor(int64_t chunk_index, Device device) const;
  // Where the first Inf/NaN gradient of owned chunk k (whose param slots hold gradients) is:
  // "<tensor> at [i, j] (NaN)". A second pass over that chunk only.
  absl::StatusOr<std::string> LocateNonFinite(AdamChunkAccess& access, size_t k);
  // The gradient pass over the param slots: global stats (after the reducer) and each owned
  // chunk's Inf/NaN count (this rank's).
  absl::Status GradientPass(AdamChunkAccess& access, GradStats& stats,
                            std::vector<int64_t>& chunk_nonfinite);
  // Where the first Inf/NaN of this rank is: "on another rank" if none here.
  absl::StatusOr<std::string> FirstNonFinite(AdamChunkAccess& access,
                                             const std::vector<int64_t>& chunk_nonfinite);
  // Adds the param slots (gradients) of every owned chunk into the accumulator.
  absl::Status AccumulatePass(AdamChunkAccess& access);
  // Param slots := master rounded to the compute dtype, every owned chunk.
  absl::Status RestorePass(AdamChunkAccess& access, AdamStepReport& report);
  // The skipped-step ending (params already restored): f32/bf16 OutOfRange; f16 counts the skip,
  // lowers the loss scale, and may stop (see Step). Also discards pending micro-batches.
  absl::StatusOr<AdamStepReport> EndSkippedStep(int64_t nonfinite, const std::string& where,
                                                AdamStepReport report);
  void ResetAccumulation();
  // The per-group scalars of the coming step with `unscale` and `clip_coef`.
  std::vector<AdamStepScalars> StepScalars(double unscale, double clip_coef) const;
  // Step() after BeginSpeculation (optimizer/hybrid_adam_overlap.cc).
  absl::StatusOr<AdamStepReport> StepAfterSpeculation(AdamChunkAccess& access);
  // Copies every snapshotted chunk back (ascending) and ends the speculation.
  absl::Status RollBack(AdamChunkAccess& access);
  void EndSpeculation();

  AdamMode mode_ = AdamMode::kAdam;
  double beta1_ = 0.9;
  double beta2_ = 0.999;
  double eps_ = 1e-8;
  double max_grad_norm_ = 0.0;
  std::vector<std::string> group_names_;
  std::vector<ParamGroupSettings> group_settings_;
  std::vector<int> tensor_group_;  // by TensorId; -1 if not owned
  LossScaler loss_scaler_ = LossScaler::None();
  std::function<absl::Status(GradStats&)> grad_stats_reducer_;
  HybridAdamKernels kernels_;
  DType compute_dtype_ = DType::kF16;
  std::vector<int64_t> owned_chunks_;
  std::vector<std::vector<Run>> runs_;    // parallel to owned_chunks_
  std::vector<std::vector<Slot>> slots_;  // parallel to owned_chunks_, by offset
  int64_t max_consecutive_skipped_steps_ = -1;
  int64_t accumulation_steps_ = 1;
  int64_t owned_param_elems_ = 0;
  // Parallel to runs_: each run's offset in accumulator_ (runs packed back to back).
  std::vector<std::vector<int64_t>> run_acc_offsets_;
  // owned_param_elems_ floats when k > 1, else null: accumulator_storage_'s, or pinned memory of
  // accumulator_backend_ (freed by the destructor).
  float* accumulator_ = nullptr;
  int64_t accumulator_elems_ = 0;
  std::vector<float> accumulator_storage_;
  Backend* accumulator_backend_ = nullptr;
  int64_t pending_micro_batches_ = 0;
  // f16: Inf/NaN seen in a pending micro-batch (the step will be skipped), how many and where.
  int64_t pending_nonfinite_ = 0;
  std::string pending_first_nonfinite_;
  int64_t step_ = 0;
  int64_t consecutive_skipped_steps_ = 0;

  // optimizer.overlap.
  bool overlap_ = false;
  int64_t overlap_snapshot_bytes_ = 0;
  // By chunk index: its index in owned_chunks_, or -1.
  std::vector<int64_t> owned_index_;
  // The previous step clipped, was skipped or stopped speculating: the next does not speculate.
  bool predict_rollback_ = false;
  struct Speculation {
    bool active = false;
    // An Inf/NaN was seen: no further chunk is updated this step.
    bool stopped = false;
    std::vector<AdamStepScalars> scalars;  // clip coefficient 1
    double loss_scale = 1.0;
    int64_t step = 0;
    // Parallel to owned_chunks_: stats kept (1), updated (1), snapshot offset in bytes.
    std::vector<uint8_t> has_stats;
    std::vector<GradStats> stats;
    std::vector<uint8_t> updated;
    std::vector<uint8_t> on_accelerator;
    std::vector<int64_t> snapshot_offset;
    int64_t snapshot_used = 0;
    int64_t updated_chunks = 0;
  };
  Speculation spec_;
  std::vector<char> snapshot_;  // grows to at most overlap_snapshot_bytes_
};

}  // namespace ps

#endif  // PATRICKSTAR_OPTIMIZER_HYBRID_ADAM_H_
