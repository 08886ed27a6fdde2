// HybridAdam's optimizer.overlap: speculative updates during backward, validated by Step
// (optimizer/hybrid_adam.h, docs/pipeline.md). Kept apart from hybrid_adam.cc so that the
// serialized step reads as it did; the two share StepScalars, GradientStats and the kernels, so
// a committed speculation has the serialized step's bits.
#include <cstdint>
#include <cstring>
#include <new>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/str_cat.h"
#include "base/status_macros.h"
#include "glog/logging.h"
#include "memory/dtype.h"
#include "optimizer/adam_kernels.h"
#include "optimizer/grad_clip.h"
#include "optimizer/hybrid_adam.h"
#include "optimizer/internal/with_chunk.h"

namespace ps {
namespace {

using hybrid_adam_internal::WithChunk;

bool SameBits(const std::vector<AdamStepScalars>& a, const std::vector<AdamStepScalars>& b) {
  return a.size() == b.size() &&
         (a.empty() || std::memcmp(a.data(), b.data(), a.size() * sizeof(AdamStepScalars)) == 0);
}

absl::Status NeedsHost(const AdamChunkAccess& access, int64_t chunk, const AdamChunkPayloads& p) {
  if (access.HostAddressable(p.device)) return absl::OkStatus();
  return absl::FailedPreconditionError(absl::StrCat(
      "HybridAdam (optimizer.overlap): chunk ", chunk, " was given on ", p.device.ToString(),
      " but speculation and its rollback copy host memory; the access must put "
      "speculated chunks on the host"));
}

}  // namespace

void HybridAdam::EndSpeculation() { spec_ = Speculation{}; }

bool HybridAdam::BeginSpeculation() {
  EndSpeculation();
  if (!overlap_ || accumulation_steps_ != 1 || pending_micro_batches_ != 0 || predict_rollback_ ||
      owned_chunks_.empty() || !ValidateHyperParams().ok() || !(loss_scaler_.scale() > 0)) {
    return false;
  }
  const size_t n = owned_chunks_.size();
  spec_.active = true;
  spec_.loss_scale = loss_scaler_.scale();
  spec_.step = step_;
  // The serialized step's unscale: loss scale times k (= 1 here), the same double.
  spec_.scalars = StepScalars(spec_.loss_scale * static_cast<double>(accumulation_steps_), 1.0);
  spec_.has_stats.assign(n, 0);
  spec_.stats.assign(n, GradStats{});
  spec_.updated.assign(n, 0);
  spec_.on_accelerator.assign(n, 0);
  spec_.snapshot_offset.assign(n, -1);
  return true;
}

absl::Status HybridAdam::SpeculateChunk(AdamChunkAccess& access, int64_t chunk_index) {
  if (!spec_.active || chunk_index < 0 ||
      chunk_index >= static_cast<int64_t>(owned_index_.size())) {
    return absl::OkStatus();
  }
  const int64_t k = owned_index_[static_cast<size_t>(chunk_index)];
  if (k < 0 || spec_.has_stats[static_cast<size_t>(k)]) return absl::OkStatus();
  const size_t ku = static_cast<size_t>(k);
  const int64_t width = SizeOf(compute_dtype_);
  int64_t elems = 0;
  for (const Run& run : runs_[ku]) elems += run.numel;
  const int64_t need = OverlapSnapshotBytes(elems, compute_dtype_);
  bool update = !spec_.stopped && spec_.snapshot_used + need <= overlap_snapshot_bytes_;
  if (update && static_cast<int64_t>(snapshot_.size()) < spec_.snapshot_used + need) {
    try {
      snapshot_.resize(static_cast<size_t>(spec_.snapshot_used + need));
    } catch (const std::bad_alloc&) {
      update = false;  // no room: this chunk waits for the verdict
    }
  }
  return WithChunk(
      access, chunk_index, update ? AdamChunkUse::kUpdate : AdamChunkUse::kGradients,
      [&](const AdamChunkPayloads& p) -> absl::Status {
        ASSIGN_OR_RETURN(AdamKernels * kernels, KernelsFor(chunk_index, p.device));
        // The gradient pass's statistics of this chunk: same kernel, same segments.
        std::vector<GradSegment> grads;
        for (const Run& run : runs_[ku]) {
          grads.push_back({compute_dtype_,
                           static_cast<const char*>(p.param) + run.offset_elems * width,
                           run.numel});
        }
        ASSIGN_OR_RETURN(const GradStats stats, kernels->GradientStats(grads));
        spec_.stats[ku] = stats;
        spec_.has_stats[ku] = 1;
        if (!stats.finite()) {
          spec_.stopped = true;  // the verdict will be "overflow": update nothing more
          return absl::OkStatus();
        }
        if (!update) return absl::OkStatus();
        RETURN_IF_ERROR(NeedsHost(access, chunk_index, p));
        // Snapshot, run by run: gradient, master, exp_avg, exp_avg_sq.
        const int64_t offset = spec_.snapshot_used;
        char* dst = snapshot_.data() + offset;
        std::vector<AdamSegment> segments;
        for (const Run& run : runs_[ku]) {
          char* param = static_cast<char*>(p.param) + run.offset_elems * width;
          const size_t f32_bytes = static_cast<size_t>(run.numel) * sizeof(float);
          std::memcpy(dst, param, static_cast<size_t>(run.numel * width));
          dst += run.numel * width;
          for (const float* src : {p.master, p.exp_avg, p.exp_avg_sq}) {
            std::memcpy(dst, src + run.offset_elems, f32_bytes);
            dst += f32_bytes;
          }
          segments.push_back({spec_.scalars[static_cast<size_t>(run.group)], compute_dtype_, param,
                              param, p.master + run.offset_elems, p.exp_avg + run.offset_elems,
                              p.exp_avg_sq + run.offset_elems, run.numel});
        }
        spec_.snapshot_offset[ku] = offset;
        spec_.snapshot_used += need;
        spec_.updated[ku] = 1;
        spec_.on_accelerator[ku] = !p.device.is_host();
        ++spec_.updated_chunks;
        ASSIGN_OR_RETURN(const AdamStepResult result, kernels->Step(segments));
        if (result.nonfinite_elems != 0) {
          return absl::InternalError(absl::StrCat(
              "HybridAdam: the speculative update of chunk ", chunk_index, " saw ",
              result.nonfinite_elems, " Inf/NaN gradients its gradient statistics did not"));
        }
        return absl::OkStatus();
      });
}

absl::Status HybridAdam::RollBack(AdamChunkAccess& access) {
  const int64_t width = SizeOf(compute_dtype_);
  absl::Status status;
  for (size_t k = 0; k < owned_chunks_.size() && k < spec_.updated.size(); ++k) {
    if (!spec_.updated[k]) continue;
    const int64_t chunk = owned_chunks_[k];
    status = WithChunk(access, chunk, AdamChunkUse::kUpdate,
                       [&](const AdamChunkPayloads& p) -> absl::Status {
                         RETURN_IF_ERROR(NeedsHost(access, chunk, p));
                         const char* src = snapshot_.data() + spec_.snapshot_offset[k];
                         for (const Run& run : runs_[k]) {
                           char* param = static_cast<char*>(p.param) + run.offset_elems * width;
                           const size_t f32_bytes = static_cast<size_t>(run.numel) * sizeof(float);
                           std::memcpy(param, src, static_cast<size_t>(run.numel * width));
                           src += run.numel * width;
                           for (float* dst : {p.master, p.exp_avg, p.exp_avg_sq}) {
                             std::memcpy(dst + run.offset_elems, src, f32_bytes);
                             src += f32_bytes;
                           }
                         }
                         return absl::OkStatus();
                       });
    if (!status.ok()) break;
  }
  EndSpeculation();
  return status;
}

absl::Status HybridAdam::AbortSpeculation(AdamChunkAccess& access) {
  if (!spec_.active) return absl::OkStatus();
  return RollBack(access);
}

bool HybridAdam::CorruptSnapshotForTesting() {
  for (size_t k = 0; k < spec_.updated.size(); ++k) {
    if (!spec_.updated[k]) continue;
    // The first master value of the chunk's first run sits after that run's gradients; flip an
    // exponent bit of it (its top byte: little-endian), which changes any value, zero included.
    const int64_t at = spec_.snapshot_offset[k] + runs_[k][0].numel * SizeOf(compute_dtype_);
    snapshot_[static_cast<size_t>(at + 3)] ^= 0x40;
    return true;
  }
  return false;
}

absl::StatusOr<AdamStepReport> HybridAdam::StepAfterSpeculation(AdamChunkAccess& access) {
  const int64_t speculated = spec_.updated_chunks;
  // Anything but a clean, unclipped step with unchanged scalars: undo, then the serialized step.
  const auto serialized = [&]() -> absl::StatusOr<AdamStepReport> {
    VLOG(1) << "HybridAdam step " << step_ + 1 << ": " << speculated
            << " chunks updated inside backward, rolled back";
    RETURN_IF_ERROR(RollBack(access));
    predict_rollback_ = true;
    ASSIGN_OR_RETURN(AdamStepReport report, Step(access));
    report.speculated_chunks = speculated;
    report.speculation_rolled_back = true;
    return report;
  };
  if (!ValidateHyperParams().ok() || pending_micro_batches_ != accumulation_steps_ - 1 ||
      loss_scaler_.scale() != spec_.loss_scale || step_ != spec_.step ||
      !SameBits(StepScalars(spec_.loss_scale * static_cast<double>(accumulation_steps_), 1.0),
                spec_.scalars)) {
    return serialized();
  }
  const int64_t width = SizeOf(compute_dtype_);
  AdamStepReport report;
  report.loss_scale = loss_scaler_.scale();
  report.step = step_;
  // The gradient pass over the chunks not seen during backward, summed with the kept statistics
  // in ascending chunk order: GradientPass's `+=` sequence, so the same bits.
  GradStats stats;
  std::vector<GradSegment> grad_segments;
  for (size_t k = 0; k < owned_chunks_.size(); ++k) {
    if (spec_.has_stats[k]) {
      stats += spec_.stats[k];
      continue;
    }
    const int64_t chunk = owned_chunks_[k];
    absl::Status s = WithChunk(
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
          return absl::OkStatus();
        });
    if (!s.ok()) {
      // Put the speculated chunks back before reporting, so the state is the pre-step one.
      if (absl::Status r = RollBack(access); !r.ok()) LOG(ERROR) << "HybridAdam: rollback: " << r;
      return s;
    }
  }
  if (grad_stats_reducer_) {
    if (absl::Status s = grad_stats_reducer_(stats); !s.ok()) {
      if (absl::Status r = RollBack(access); !r.ok()) LOG(ERROR) << "HybridAdam: rollback: " << r;
      return s;
    }
  }
  if (!stats.finite() || pending_nonfinite_ > 0) return serialized();
  const double unscale = report.loss_scale * static_cast<double>(accumulation_steps_);
  const double norm = stats.Norm(unscale);
  if (ClipCoefficient(norm, max_grad_norm_) != 1.0) return serialized();

  // Commit: the verdict is the one the speculation assumed.
  VLOG(1) << "HybridAdam step " << step_ + 1 << ": " << speculated
          << " chunks updated inside backward, committed";
  consecutive_skipped_steps_ = 0;
  predict_rollback_ = false;
  report.nonfinite_grads = stats.nonfinite_elems;
  report.grad_norm = norm;
  report.clip_coef = 1.0;
  report.speculated_chunks = speculated;
  std::vector<AdamSegment> segments;
  for (size_t k = 0; k < owned_chunks_.size(); ++k) {
    if (spec_.updated[k]) {
      (spec_.on_accelerator[k] ? report.accelerator_chunks : report.host_chunks)++;
      continue;
    }
    const int64_t chunk = owned_chunks_[k];
    absl::Status s = WithChunk(
        access, chunk, AdamChunkUse::kUpdate, [&](const AdamChunkPayloads& p) -> absl::Status {
          ASSIGN_OR_RETURN(AdamKernels * kernels, KernelsFor(chunk, p.device));
          (p.device.is_host() ? report.host_chunks : report.accelerator_chunks)++;
          segments.clear();
          for (const Run& run : runs_[k]) {
            char* param = static_cast<char*>(p.param) + run.offset_elems * width;
            segments.push_back({spec_.scalars[static_cast<size_t>(run.group)], compute_dtype_,
                                param, param, p.master + run.offset_elems,
                                p.exp_avg + run.offset_elems, p.exp_avg_sq + run.offset_elems,
                                run.numel});
          }
          ASSIGN_OR_RETURN(const AdamStepResult result, kernels->Step(segments));
          if (result.nonfinite_elems != 0) {
            return absl::InternalError(absl::StrCat(
                "HybridAdam: the Adam update of chunk ", chunk, " saw ", result.nonfinite_elems,
                " Inf/NaN gradients that the gradient pass did not; the gradients changed during "
                "the optimizer step"));
          }
          return absl::OkStatus();
        });
    if (!s.ok()) {
      // As the serialized step: partially applied; resume from a checkpoint.
      EndSpeculation();
      return s;
    }
  }
  EndSpeculation();
  ++step_;
  report.step = step_;
  RETURN_IF_ERROR(loss_scaler_.Update(/*overflow=*/false));
  report.next_loss_scale = loss_scaler_.scale();
  return report;
}

}  // namespace ps
