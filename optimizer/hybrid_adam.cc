#include "optimizer/hybrid_adam.h"

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <limits>
#include <memory>
#include <new>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/ascii.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "base/status_macros.h"
#include "chunk/chunk.h"
#include "chunk/chunk_layout.h"
#include "chunk/chunk_store.h"
#include "chunk/chunk_type.h"
#include "glog/logging.h"
#include "memory/backend.h"
#include "memory/device.h"
#include "memory/dtype.h"
#include "optimizer/adam_kernels.h"
#include "optimizer/adam_math.h"
#include "optimizer/grad_accumulator.h"
#include "optimizer/grad_clip.h"
#include "optimizer/internal/with_chunk.h"
#include "optimizer/loss_scaler.h"

namespace ps {
namespace {

using hybrid_adam_internal::WithChunk;

const char* UseName(AdamChunkUse use) {
  switch (use) {
    case AdamChunkUse::kGradients:
      return "the gradient pass";
    case AdamChunkUse::kRestore:
      return "restoring parameters";
    case AdamChunkUse::kUpdate:
      return "the Adam update";
  }
  return "?";
}

// Row-major coordinates of flat element `index` of `shape`: "[3, 17]".
std::string Coordinates(const std::vector<int64_t>& shape, int64_t index) {
  std::vector<int64_t> coords(shape.size(), 0);
  for (size_t d = shape.size(); d-- > 0;) {
    if (shape[d] <= 0) break;
    coords[d] = index % shape[d];
    index /= shape[d];
  }
  return absl::StrCat("[", absl::StrJoin(coords, ", "), "]");
}

constexpr absl::string_view kDivergenceAdvice =
    "Lower the learning rate (optimizer.params.lr), enable gradient clipping (gradient_clipping, "
    "e.g. 1.0), and check the training data and the initial weights";

absl::Status CheckFiniteAtLeast(absl::string_view what, double value, double min) {
  if (!std::isfinite(value) || value < min) {
    return absl::InvalidArgumentError(
        absl::StrCat("HybridAdam: ", what, " must be finite and >= ", min, ", got ", value));
  }
  return absl::OkStatus();
}

}  // namespace

absl::StatusOr<AdamChunkPayloads> ResidentChunkAccess::Acquire(int64_t chunk_index,
                                                               AdamChunkUse use) {
  if (chunk_index < 0 || chunk_index >= store_.num_chunks()) {
    return absl::InvalidArgumentError(absl::StrCat("ResidentChunkAccess: chunk index ", chunk_index,
                                                   " outside [0, ", store_.num_chunks(), ")"));
  }
  std::vector<ChunkType> types = {ChunkType::kParam};
  if (use != AdamChunkUse::kGradients) types.push_back(ChunkType::kMaster);
  if (use == AdamChunkUse::kUpdate) {
    types.push_back(ChunkType::kMomentum);
    types.push_back(ChunkType::kVariance);
  }
  AdamChunkPayloads payloads;
  for (ChunkType type : types) {
    const Chunk& chunk = store_.chunk(type, chunk_index);
    if (!chunk.has_payload()) {
      return absl::FailedPreconditionError(absl::StrCat(
          chunk.id().ToString(), " has no payload, but ", UseName(use),
          " of the optimizer step needs it: the ADAM-stage placement must make the chunk "
          "resident before HybridAdam::Step"));
    }
    if (type == ChunkType::kParam) {
      payloads.device = chunk.device();
    } else if (chunk.device() != payloads.device) {
      return absl::FailedPreconditionError(
          absl::StrCat(chunk.id().ToString(), " is on ", chunk.device().ToString(), " but param#",
                       chunk_index, " is on ", payloads.device.ToString(),
                       ": the chunks one Adam kernel reads must be on the same device"));
    }
    switch (type) {
      case ChunkType::kParam:
        payloads.param = chunk.payload();
        break;
      case ChunkType::kMaster:
        payloads.master = static_cast<float*>(chunk.payload());
        break;
      case ChunkType::kMomentum:
        payloads.exp_avg = static_cast<float*>(chunk.payload());
        break;
      case ChunkType::kVariance:
        payloads.exp_avg_sq = static_cast<float*>(chunk.payload());
        break;
    }
  }
  return payloads;
}

bool IsBiasOrNormTensor(const TensorInfo& tensor) {
  const std::string name = absl::AsciiStrToLower(tensor.name);
  return absl::EndsWith(name, "bias") || absl::StrContains(name, "ln_") ||
         absl::StrContains(name, "layernorm") || absl::StrContains(name, "layer_norm") ||
         absl::StrContains(name, "norm.");
}

HybridAdam::~HybridAdam() {
  if (accumulator_backend_ != nullptr && accumulator_ != nullptr) {
    if (absl::Status s = accumulator_backend_->FreePinnedHost(accumulator_); !s.ok()) {
      LOG(ERROR) << "HybridAdam: freeing the pinned gradient accumulator: " << s;
    }
  }
}

absl::StatusOr<std::unique_ptr<HybridAdam>> HybridAdam::Create(const ChunkLayout& layout, int rank,
                                                               DType compute_dtype,
                                                               HybridAdamOptions options,
                                                               HybridAdamKernels kernels) {
  if (kernels.host == nullptr) {
    return absl::InvalidArgumentError("HybridAdam: kernels.host is required (e.g. a CpuAdam)");
  }
  if (options.groups.empty()) {
    return absl::InvalidArgumentError("HybridAdam: at least one parameter group is required");
  }
  if (rank < 0 || rank >= layout.world_size()) {
    return absl::InvalidArgumentError(
        absl::StrCat("HybridAdam: rank ", rank, " outside [0, ", layout.world_size(), ")"));
  }
  if (options.max_consecutive_skipped_steps < -1) {
    return absl::InvalidArgumentError(absl::StrCat(
        "HybridAdam: max_consecutive_skipped_steps must be >= 0, or -1 for no limit, got ",
        options.max_consecutive_skipped_steps));
  }
  if (options.gradient_accumulation_steps < 1) {
    return absl::InvalidArgumentError(
        absl::StrCat("HybridAdam: gradient_accumulation_steps must be >= 1, got ",
                     options.gradient_accumulation_steps));
  }
  if (compute_dtype != DType::kF32 && compute_dtype != DType::kF16 &&
      compute_dtype != DType::kBF16) {
    return absl::InvalidArgumentError(
        absl::StrCat("HybridAdam: unknown compute dtype ", static_cast<int>(compute_dtype)));
  }
  auto adam = std::unique_ptr<HybridAdam>(new HybridAdam());
  adam->mode_ = options.mode;
  adam->beta1_ = options.beta1;
  adam->beta2_ = options.beta2;
  adam->eps_ = options.eps;
  adam->max_grad_norm_ = options.max_grad_norm;
  for (const ParamGroupOptions& group : options.groups) {
    adam->group_names_.push_back(group.name);
    adam->group_settings_.push_back({group.lr, group.weight_decay});
  }
  RETURN_IF_ERROR(adam->ValidateHyperParams());
  adam->loss_scaler_ = std::move(options.loss_scaler);
  adam->grad_stats_reducer_ = std::move(options.grad_stats_reducer);
  adam->kernels_ = kernels;
  adam->compute_dtype_ = compute_dtype;
  adam->max_consecutive_skipped_steps_ = options.max_consecutive_skipped_steps;
  if (options.overlap_snapshot_bytes < 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("HybridAdam: overlap_snapshot_bytes must be >= 0, got ",
                     options.overlap_snapshot_bytes));
  }
  adam->overlap_ = options.overlap;
  adam->overlap_snapshot_bytes_ = options.overlap_snapshot_bytes;
  adam->owned_index_.assign(static_cast<size_t>(layout.num_chunks()), -1);
  adam->tensor_group_.assign(static_cast<size_t>(layout.num_tensor_ids()), -1);

  for (int64_t chunk = 0; chunk < layout.num_chunks(); ++chunk) {
    if (!layout.HoldsPayload(ChunkType::kMaster, chunk, rank)) continue;
    std::vector<Run> runs;
    std::vector<Slot> slots;
    for (TensorId id : layout.TensorsInChunk(chunk)) {
      const TensorInfo& tensor = layout.tensor(id);
      slots.push_back({tensor.name, tensor.shape, tensor.offset_elems, tensor.numel});
      int group = -1;
      for (size_t g = 0; g < options.groups.size(); ++g) {
        const auto& selector = options.groups[g].selector;
        if (!selector || selector(tensor)) {
          group = static_cast<int>(g);
          break;
        }
      }
      if (group < 0) {
        return absl::InvalidArgumentError(
            absl::StrCat("HybridAdam: no parameter group takes tensor \"", tensor.name,
                         "\"; add a last group without a selector to catch the rest"));
      }
      adam->tensor_group_[id] = group;
      if (!runs.empty() && runs.back().group == group &&
          runs.back().offset_elems + runs.back().numel == tensor.offset_elems) {
        runs.back().numel += tensor.numel;
      } else {
        runs.push_back({tensor.offset_elems, tensor.numel, group});
      }
    }
    if (runs.empty()) continue;
    std::sort(slots.begin(), slots.end(),
              [](const Slot& a, const Slot& b) { return a.offset_elems < b.offset_elems; });
    std::vector<int64_t> acc_offsets;
    for (const Run& run : runs) {
      acc_offsets.push_back(adam->owned_param_elems_);
      adam->owned_param_elems_ += run.numel;
    }
    adam->owned_index_[static_cast<size_t>(chunk)] =
        static_cast<int64_t>(adam->owned_chunks_.size());
    adam->owned_chunks_.push_back(chunk);
    adam->runs_.push_back(std::move(runs));
    adam->slots_.push_back(std::move(slots));
    adam->run_acc_offsets_.push_back(std::move(acc_offsets));
  }
  adam->accumulation_steps_ = options.gradient_accumulation_steps;
  const int64_t acc_bytes =
      GradientAccumulatorBytes(adam->owned_param_elems_, adam->accumulation_steps_);
  if (acc_bytes > 0) {
    const std::string what = absl::StrCat(
        "HybridAdam: cannot allocate the gradient accumulator of gradient_accumulation_steps ",
        adam->accumulation_steps_, ": ", acc_bytes, " bytes of ",
        kernels.pinned_accumulator_backend != nullptr ? "pinned " : "",
        "host memory (4 per owned parameter)");
    if (kernels.pinned_accumulator_backend != nullptr) {
      absl::StatusOr<void*> pinned =
          kernels.pinned_accumulator_backend->AllocatePinnedHost(acc_bytes);
      if (!pinned.ok()) {
        return absl::Status(pinned.status().code(),
                            absl::StrCat(what, ": ", pinned.status().message()));
      }
      adam->accumulator_backend_ = kernels.pinned_accumulator_backend;
      adam->accumulator_ = static_cast<float*>(*pinned);
      std::fill(adam->accumulator_, adam->accumulator_ + adam->owned_param_elems_, 0.0f);
    } else {
      try {
        adam->accumulator_storage_.assign(static_cast<size_t>(adam->owned_param_elems_), 0.0f);
      } catch (const std::bad_alloc&) {
        return absl::ResourceExhaustedError(what);
      }
      adam->accumulator_ = adam->accumulator_storage_.data();
    }
    adam->accumulator_elems_ = adam->owned_param_elems_;
  }
  return adam;
}

absl::Status HybridAdam::ValidateHyperParams() const {
  if (mode_ != AdamMode::kAdam && mode_ != AdamMode::kAdamW) {
    return absl::InvalidArgumentError(
        absl::StrCat("HybridAdam: unknown mode ", static_cast<int>(mode_)));
  }
  for (const auto& [name, beta] :
       {std::pair<const char*, double>{"betas[0] (beta1)", beta1_}, {"betas[1] (beta2)", beta2_}}) {
    if (!(beta >= 0.0 && beta < 1.0)) {
      return absl::InvalidArgumentError(
          absl::StrCat("HybridAdam: optimizer.params.", name, " must be in [0, 1), got ", beta));
    }
  }
  RETURN_IF_ERROR(CheckFiniteAtLeast("optimizer.params.eps", eps_, 0.0));
  if (std::isnan(max_grad_norm_) || std::isinf(max_grad_norm_)) {
    return absl::InvalidArgumentError(absl::StrCat(
        "HybridAdam: gradient_clipping (max_grad_norm) must be finite (<= 0 turns clipping off), "
        "got ",
        max_grad_norm_));
  }
  for (size_t g = 0; g < group_settings_.size(); ++g) {
    const std::string prefix = absl::StrCat("param group \"", group_names_[g], "\" ");
    RETURN_IF_ERROR(CheckFiniteAtLeast(prefix + "lr", group_settings_[g].lr, 0.0));
    RETURN_IF_ERROR(
        CheckFiniteAtLeast(prefix + "weight_decay", group_settings_[g].weight_decay, 0.0));
  }
  return absl::OkStatus();
}

absl::StatusOr<AdamKernels*> HybridAdam::KernelsFor(int64_t chunk_index, Device device) const {
  if (device.is_host()) return kernels_.host;
  if (kernels_.accelerator == nullptr) {
    return absl::FailedPreconditionError(
        absl::StrCat("HybridAdam: chunk ", chunk_index, " is placed on ", device.ToString(),
                     " for the ADAM stage, but the optimizer has no accelerator kernels; pass "
                     "HybridAdamKernels.accelerator (CudaAdam, or a CpuAdam for the cpu backend)"));
  }
  return kernels_.accelerator;
}

std::vector<AdamStepScalars> HybridAdam::StepScalars(double unscale, double clip_coef) const {
  std::vector<AdamStepScalars> scalars;
  for (const ParamGroupSettings& group : group_settings_) {
    scalars.push_back(MakeAdamStepScalars(mode_, group.lr, beta1_, beta2_, eps_, group.weight_decay,
                                          step_ + 1, unscale, clip_coef));
  }
  return scalars;
}

void HybridAdam::SetLearningRate(double lr) {
  for (ParamGroupSettings& group : group_settings_) group.lr = lr;
}

int HybridAdam::group_of(TensorId tensor) const {
  if (tensor < 0 || tensor >= static_cast<TensorId>(tensor_group_.size())) return -1;
  return tensor_group_[tensor];
}

absl::StatusOr<std::string> HybridAdam::LocateNonFinite(AdamChunkAccess& access, size_t k) {
  const int64_t chunk = owned_chunks_[k];
  const int64_t width = SizeOf(compute_dtype_);
  std::string where = absl::StrCat("chunk ", chunk);
  RETURN_IF_ERROR(WithChunk(
      access, chunk, AdamChunkUse::kGradients, [&](const AdamChunkPayloads& p) -> absl::Status {
        ASSIGN_OR_RETURN(AdamKernels * kernels, KernelsFor(chunk, p.device));
        const char* base = static_cast<const char*>(p.param);
        // Inf/NaN among elements [offset, offset + n) of the chunk, counted by the kernel (the
        // payload may be device memory the host cannot read).
        const auto count = [&](int64_t offset, int64_t n) -> absl::StatusOr<int64_t> {
          const GradSegment segment{compute_dtype_, base + offset * width, n};
          ASSIGN_OR_RETURN(const GradStats stats, kernels->GradientStats({&segment, 1}));
          return stats.nonfinite_elems;
        };
        for (const Slot& slot : slots_[k]) {
          ASSIGN_OR_RETURN(const int64_t bad, count(slot.offset_elems, slot.numel));
          if (bad == 0) continue;
          // The first one lies in [lo, hi): halve until one element is left.
          int64_t lo = 0, hi = slot.numel;
          while (hi - lo > 1) {
            const int64_t mid = lo + (hi - lo) / 2;
            ASSIGN_OR_RETURN(const int64_t left, count(slot.offset_elems + lo, mid - lo));
            (left > 0 ? hi : lo) = mid;
          }
          where = absl::StrCat(slot.name, " at ", Coordinates(slot.shape, lo));
          return absl::OkStatus();
        }
        return absl::OkStatus();
      }));
  return where;
}

absl::Status HybridAdam::GradientPass(AdamChunkAccess& access, GradStats& stats,
                                      std::vector<int64_t>& chunk_nonfinite) {
  const int64_t width = SizeOf(compute_dtype_);
  stats = GradStats{};
  chunk_nonfinite.assign(owned_chunks_.size(), 0);
  std::vector<GradSegment> grad_segments;
  for (size_t k = 0; k < owned_chunks_.size(); ++k) {
    const int64_t chunk = owned_chunks_[k];
    RETURN_IF_ERROR(WithChunk(
        access, chunk, AdamChunkUse::kGradients, [&](const AdamChunkPayloads& p) -> absl::Status {
          ASSIGN_OR_RETURN(AdamKernels * kernels, KernelsFor(chunk, p.device));
          grad_segments.clear();
          for (const Run& run : runs_[k]) {
            grad_segments.push_back({compute_dtype_,
                                     static_cast<const char*>(p.param) + run.offset_elems * width,
                                     run.numel});
          }
          ASSIGN_OR_RETURN(const GradStats chunk_stats, kernels->GradientStats(grad_segments));
          stats += chunk_stats;
          chunk_nonfinite[k] = chunk_stats.nonfinite_elems;
          return absl::OkStatus();
        }));
  }
  if (grad_stats_reducer_) RETURN_IF_ERROR(grad_stats_reducer_(stats));
  return absl::OkStatus();
}

absl::StatusOr<std::string> HybridAdam::FirstNonFinite(
    AdamChunkAccess& access, const std::vector<int64_t>& chunk_nonfinite) {
  for (size_t k = 0; k < owned_chunks_.size(); ++k) {
    if (chunk_nonfinite[k] != 0) return LocateNonFinite(access, k);
  }
  return std::string("on another rank");
}

absl::Status HybridAdam::AccumulatePass(AdamChunkAccess& access) {
  const int64_t width = SizeOf(compute_dtype_);
  std::vector<GradAccumulateSegment> acc_segments;
  for (size_t k = 0; k < owned_chunks_.size(); ++k) {
    const int64_t chunk = owned_chunks_[k];
    RETURN_IF_ERROR(WithChunk(
        access, chunk, AdamChunkUse::kGradients, [&](const AdamChunkPayloads& p) -> absl::Status {
          ASSIGN_OR_RETURN(AdamKernels * kernels, KernelsFor(chunk, p.device));
          acc_segments.clear();
          for (size_t r = 0; r < runs_[k].size(); ++r) {
            const Run& run = runs_[k][r];
            acc_segments.push_back({compute_dtype_,
                                    static_cast<const char*>(p.param) + run.offset_elems * width,
                                    accumulator_ + run_acc_offsets_[k][r], run.numel});
          }
          return kernels->AccumulateGradients(acc_segments);
        }));
  }
  return absl::OkStatus();
}

absl::Status HybridAdam::RestorePass(AdamChunkAccess& access, AdamStepReport& report) {
  const int64_t width = SizeOf(compute_dtype_);
  std::vector<ParamRestoreSegment> restore_segments;
  for (size_t k = 0; k < owned_chunks_.size(); ++k) {
    const int64_t chunk = owned_chunks_[k];
    RETURN_IF_ERROR(WithChunk(
        access, chunk, AdamChunkUse::kRestore, [&](const AdamChunkPayloads& p) -> absl::Status {
          ASSIGN_OR_RETURN(AdamKernels * kernels, KernelsFor(chunk, p.device));
          (p.device.is_host() ? report.host_chunks : report.accelerator_chunks)++;
          restore_segments.clear();
          for (const Run& run : runs_[k]) {
            restore_segments.push_back({p.master + run.offset_elems, compute_dtype_,
                                        static_cast<char*>(p.param) + run.offset_elems * width,
                                        run.numel});
          }
          return kernels->RestoreParams(restore_segments);
        }));
  }
  return absl::OkStatus();
}

void HybridAdam::ResetAccumulation() {
  if (accumulator_ != nullptr) std::fill(accumulator_, accumulator_ + accumulator_elems_, 0.0f);
  pending_micro_batches_ = 0;
  pending_nonfinite_ = 0;
  pending_first_nonfinite_.clear();
}

absl::StatusOr<AdamStepReport> HybridAdam::EndSkippedStep(int64_t nonfinite,
                                                          const std::string& where,
                                                          AdamStepReport report) {
  ResetAccumulation();
  predict_rollback_ = true;
  report.skipped = true;
  report.grad_norm = std::numeric_limits<double>::infinity();
  report.nonfinite_grads = nonfinite;
  report.first_nonfinite = where;
  const std::string first =
      absl::StrCat(nonfinite, " Inf/NaN gradient", nonfinite == 1 ? "" : "s", "; the first ",
                   where == "on another rank" ? "is " : "in ", where);
  if (compute_dtype_ != DType::kF16) {
    return absl::OutOfRangeError(absl::StrCat(
        "non-finite gradients at optimizer step ", step_ + 1, " (", first, ") with ",
        DTypeName(compute_dtype_),
        " parameters: nothing is loss-scaled, so this is divergence (or bad data or weights), "
        "not a loss-scale event. The step was not applied and training stops. ",
        kDivergenceAdvice));
  }
  ++consecutive_skipped_steps_;
  report.consecutive_skipped_steps = consecutive_skipped_steps_;
  const absl::Status scaler_status = loss_scaler_.Update(/*overflow=*/true);
  report.next_loss_scale = loss_scaler_.scale();
  if (!scaler_status.ok()) {
    return absl::Status(scaler_status.code(),
                        absl::StrCat(scaler_status.message(), " (", first, ")"));
  }
  if (max_consecutive_skipped_steps_ >= 0 &&
      consecutive_skipped_steps_ > max_consecutive_skipped_steps_) {
    return absl::OutOfRangeError(absl::StrCat(
        "fp16: ", consecutive_skipped_steps_,
        " optimizer steps in a row were skipped for "
        "non-finite gradients (this one: ",
        first, "; loss scale ", report.loss_scale,
        "), more than fp16.max_consecutive_skipped_steps = ", max_consecutive_skipped_steps_,
        ". Lowering the loss scale has not helped: training diverged or the data or weights "
        "are bad, and training stops. ",
        kDivergenceAdvice));
  }
  return report;
}

absl::StatusOr<AdamStepReport> HybridAdam::Accumulate(AdamChunkAccess& access) {
  if (accumulation_steps_ <= 1 || pending_micro_batches_ >= accumulation_steps_ - 1) {
    return absl::FailedPreconditionError(
        absl::StrCat("HybridAdam::Accumulate: ", pending_micro_batches_,
                     " micro-batches are pending with gradient_accumulation_steps ",
                     accumulation_steps_, "; the next micro-batch ends the step (call Step)"));
  }
  AdamStepReport report;
  report.accumulated = true;
  report.loss_scale = loss_scaler_.scale();
  report.next_loss_scale = report.loss_scale;
  report.step = step_;
  report.consecutive_skipped_steps = consecutive_skipped_steps_;
  GradStats stats;
  std::vector<int64_t> chunk_nonfinite;
  RETURN_IF_ERROR(GradientPass(access, stats, chunk_nonfinite));
  report.nonfinite_grads = stats.nonfinite_elems;
  if (!stats.finite()) {
    ASSIGN_OR_RETURN(const std::string where, FirstNonFinite(access, chunk_nonfinite));
    RETURN_IF_ERROR(RestorePass(access, report));
    if (compute_dtype_ != DType::kF16) {
      return EndSkippedStep(stats.nonfinite_elems,
                            absl::StrCat(where, ", micro-batch ", pending_micro_batches_ + 1),
                            report);
    }
    // f16: a loss-scale event; the step is skipped when its last micro-batch arrives.
    if (pending_nonfinite_ == 0) {
      pending_first_nonfinite_ = absl::StrCat(where, ", micro-batch ", pending_micro_batches_ + 1);
    }
    pending_nonfinite_ += stats.nonfinite_elems;
    report.first_nonfinite = pending_first_nonfinite_;
    ++pending_micro_batches_;
    return report;
  }
  report.grad_norm = stats.Norm(report.loss_scale);
  // Three passes, like Step's (gradients, fold, update), so that every micro-batch makes the
  // same chunk accesses and the scheduler's warm-up trace fits them all. After an f16 overflow
  // earlier in this step the sum is discarded anyway: only restore.
  if (pending_nonfinite_ == 0) RETURN_IF_ERROR(AccumulatePass(access));
  RETURN_IF_ERROR(RestorePass(access, report));
  ++pending_micro_batches_;
  return report;
}

absl::StatusOr<AdamStepReport> HybridAdam::Step(AdamChunkAccess& access) {
  if (spec_.active) return StepAfterSpeculation(access);
  RETURN_IF_ERROR(ValidateHyperParams());
  if (pending_micro_batches_ != accumulation_steps_ - 1) {
    return absl::FailedPreconditionError(absl::StrCat(
        "HybridAdam::Step: ", pending_micro_batches_,
        " micro-batches are pending but gradient_accumulation_steps ", accumulation_steps_,
        " needs ", accumulation_steps_ - 1, " before the step (call Accumulate)"));
  }
  const int64_t width = SizeOf(compute_dtype_);
  const bool accumulating = accumulation_steps_ > 1;
  AdamStepReport report;
  report.loss_scale = loss_scaler_.scale();
  report.step = step_;

  // Gradient pass: overflow and norm, before anything is written.
  GradStats stats;
  std::vector<int64_t> chunk_nonfinite;
  RETURN_IF_ERROR(GradientPass(access, stats, chunk_nonfinite));
  report.nonfinite_grads = stats.nonfinite_elems;

  if (!stats.finite() || pending_nonfinite_ > 0) {
    // Skip the step: the param slots hold gradients; find the first bad one while they are
    // there, then put the parameters back.
    std::string where = pending_first_nonfinite_;
    if (!stats.finite()) {
      ASSIGN_OR_RETURN(where, FirstNonFinite(access, chunk_nonfinite));
      if (accumulating) absl::StrAppend(&where, ", micro-batch ", accumulation_steps_);
      if (!pending_first_nonfinite_.empty()) where = pending_first_nonfinite_;
    }
    RETURN_IF_ERROR(RestorePass(access, report));
    return EndSkippedStep(stats.nonfinite_elems + pending_nonfinite_, where, report);
  }

  // The unscale factor: the loss scale, times k when the gradient is a sum of k micro-batch
  // means.
  const double unscale = report.loss_scale * static_cast<double>(accumulation_steps_);
  if (accumulating) {
    // Fold the last micro-batch into the accumulator (on the chunk's device's kernels) and take
    // the stats of the sum (host memory: the host kernels). The param slots keep their gradients
    // until the update.
    GradStats sum_stats;
    std::vector<GradAccumulateSegment> acc_segments;
    std::vector<GradSegment> sum_segments;
    for (size_t k = 0; k < owned_chunks_.size(); ++k) {
      const int64_t chunk = owned_chunks_[k];
      RETURN_IF_ERROR(WithChunk(
          access, chunk, AdamChunkUse::kGradients, [&](const AdamChunkPayloads& p) -> absl::Status {
            ASSIGN_OR_RETURN(AdamKernels * kernels, KernelsFor(chunk, p.device));
            acc_segments.clear();
            sum_segments.clear();
            for (size_t r = 0; r < runs_[k].size(); ++r) {
              const Run& run = runs_[k][r];
              float* acc = accumulator_ + run_acc_offsets_[k][r];
              acc_segments.push_back({compute_dtype_,
                                      static_cast<const char*>(p.param) + run.offset_elems * width,
                                      acc, run.numel});
              sum_segments.push_back({DType::kF32, acc, run.numel});
            }
            RETURN_IF_ERROR(kernels->AccumulateGradients(acc_segments));
            ASSIGN_OR_RETURN(const GradStats chunk_stats,
                             kernels_.host->GradientStats(sum_segments));
            sum_stats += chunk_stats;
            return absl::OkStatus();
          }));
    }
    if (grad_stats_reducer_) RETURN_IF_ERROR(grad_stats_reducer_(sum_stats));
    if (!sum_stats.finite()) {
      // Every micro-batch was finite but their f32 sum is not.
      RETURN_IF_ERROR(RestorePass(access, report));
      return EndSkippedStep(sum_stats.nonfinite_elems,
                            absl::StrCat("the sum of the ", accumulation_steps_,
                                         " micro-batches' gradients (f32 overflow)"),
                            report);
    }
    stats = sum_stats;
  }
  consecutive_skipped_steps_ = 0;

  report.grad_norm = stats.Norm(unscale);
  report.clip_coef = ClipCoefficient(report.grad_norm, max_grad_norm_);
  predict_rollback_ = report.clip_coef != 1.0;
  const std::vector<AdamStepScalars> scalars = StepScalars(unscale, report.clip_coef);
  std::vector<AdamSegment> segments;
  std::vector<ParamRestoreSegment> restore_segments;
  for (size_t k = 0; k < owned_chunks_.size(); ++k) {
    const int64_t chunk = owned_chunks_[k];
    RETURN_IF_ERROR(WithChunk(
        access, chunk, AdamChunkUse::kUpdate, [&](const AdamChunkPayloads& p) -> absl::Status {
          ASSIGN_OR_RETURN(AdamKernels * kernels, KernelsFor(chunk, p.device));
          (p.device.is_host() ? report.host_chunks : report.accelerator_chunks)++;
          segments.clear();
          restore_segments.clear();
          for (size_t r = 0; r < runs_[k].size(); ++r) {
            const Run& run = runs_[k][r];
            char* param = static_cast<char*>(p.param) + run.offset_elems * width;
            if (accumulating) {
              // The gradient is the f32 sum; the master is updated, then the parameter is
              // written from it (the same rounding as the fused write).
              segments.push_back({scalars[run.group], DType::kF32,
                                  accumulator_ + run_acc_offsets_[k][r], nullptr,
                                  p.master + run.offset_elems, p.exp_avg + run.offset_elems,
                                  p.exp_avg_sq + run.offset_elems, run.numel});
              restore_segments.push_back(
                  {p.master + run.offset_elems, compute_dtype_, param, run.numel});
            } else {
              segments.push_back({scalars[run.group], compute_dtype_, param, param,
                                  p.master + run.offset_elems, p.exp_avg + run.offset_elems,
                                  p.exp_avg_sq + run.offset_elems, run.numel});
            }
          }
          ASSIGN_OR_RETURN(const AdamStepResult result, kernels->Step(segments));
          if (result.nonfinite_elems != 0) {
            return absl::InternalError(absl::StrCat(
                "HybridAdam: the Adam update of chunk ", chunk, " saw ", result.nonfinite_elems,
                " Inf/NaN gradients that the gradient pass did not; the gradients changed during "
                "the optimizer step"));
          }
          if (accumulating) RETURN_IF_ERROR(kernels->RestoreParams(restore_segments));
          return absl::OkStatus();
        }));
  }
  if (accumulating) ResetAccumulation();
  ++step_;
  report.step = step_;
  RETURN_IF_ERROR(loss_scaler_.Update(/*overflow=*/false));
  report.next_loss_scale = loss_scaler_.scale();
  return report;
}

}  // namespace ps
