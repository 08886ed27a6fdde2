#include "trainer/training_loop.h"

#include <sys/resource.h>

#include <algorithm>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/types/span.h"
#include "base/status_macros.h"
#include "chunk/chunk_type.h"
#include "glog/logging.h"
#include "memory/cpu_backend.h"
#include "memory/device.h"
#include "memory/dtype.h"
#include "memory/dtype_math.h"
#include "memory/memory_tracker.h"
#include "model/quant4_config.h"
#include "nlohmann/json.hpp"
#include "scheduler/chunk_manager.h"
#include "scheduler/disk_tier.h"
#include "trainer/console.h"
#include "trainer/evaluation.h"
#include "trainer/export.h"
#include "trainer/progress_meter.h"
#include "trainer/run_checkpoints.h"
#include "trainer/train_step.h"

namespace ps {
namespace trainer_internal {
namespace {

// What the process has used so far (every thread): wall clock, CPU time, page faults. Differences
// around each step go into the summary (issue #24: the emulated accelerator once spent more
// system time than user time faulting in freshly mapped pages).
struct ProcessUsage {
  int64_t wall_ns = 0;  // the run's clock (TrainRun::NowNs)
  double user_s = 0, system_s = 0;
  int64_t minor_faults = 0, major_faults = 0;
};

ProcessUsage ReadProcessUsage(const TrainRun& run) {
  ProcessUsage u;
  u.wall_ns = run.NowNs();
  struct rusage r {};
  if (getrusage(RUSAGE_SELF, &r) == 0) {
    u.user_s = static_cast<double>(r.ru_utime.tv_sec) + 1e-6 * r.ru_utime.tv_usec;
    u.system_s = static_cast<double>(r.ru_stime.tv_sec) + 1e-6 * r.ru_stime.tv_usec;
    u.minor_faults = r.ru_minflt;
    u.major_faults = r.ru_majflt;
  }
  return u;
}

// fp16, after a skipped step: OutOfRange when any f16 parameter (every rank's) is Inf or NaN.
absl::Status CheckF16ParametersFinite(const TrainRun& run, int64_t step) {
  // The parameters were restored from the master weights (rounded to f16) by the skip: a master
  // weight that is not finite, or beyond f16's range, is an Inf in the parameters every
  // forward reads.
  std::string first;
  int64_t bad = 0;
  for (const std::string& name : run.runtime.model->ParameterNames()) {
    if (!run.runtime.model->HoldsTrainingState(name)) continue;
    ASSIGN_OR_RETURN(const std::vector<float> master,
                     run.runtime.model->ReadTensor(ChunkType::kMaster, name));
    for (size_t i = 0; i < master.size(); ++i) {
      if ((FloatToHalfBits(master[i]) & 0x7c00u) != 0x7c00u) continue;
      if (bad++ == 0) {
        first = absl::StrFormat("%s element %d (master weight %g)", name, i, master[i]);
      }
    }
  }
  ASSIGN_OR_RETURN(const bool any, run.AnyRank(bad > 0));
  if (!any) return absl::OkStatus();
  return absl::OutOfRangeError(absl::StrCat(
      "fp16: the parameters are no longer finite at step ", step, " (",
      bad > 0
          ? absl::StrCat(bad, " f16 weight", bad == 1 ? "" : "s", " Inf or NaN; the first: ", first)
          : std::string("on another rank"),
      "): no loss-scale reduction can cure weights, so training diverged and stops; no "
      "checkpoint is written for this step. Lower the learning rate (optimizer.params.lr), enable "
      "gradient clipping (gradient_clipping, e.g. 1.0), or train in bf16 (bf16.enabled), whose "
      "range is f32's"));
}

// One optimizer step (gradient_accumulation_steps micro-batches), measured into `m`; refuses a
// loss that is no longer finite. Advances run.progress.step and run.progress.last_loss.
absl::Status Step(TrainRun& run, StepMetrics& m) {
  m.step = run.progress.step + 1;
  m.lr = run.runtime.schedule->LearningRate(run.progress.step);
  run.runtime.adam->SetLearningRate(m.lr);
  m.loss_scale = run.runtime.adam->loss_scaler().scale();
  m.warmup = run.runtime.manager->metronome().is_warmup();
  const ChunkManagerCounters c0 = run.runtime.manager->counters();
  const int64_t trace_t0 = run.runtime.trace != nullptr ? run.runtime.trace->NowNs() : 0;
  // One optimizer step: gradient_accumulation_steps micro-batches, each one iteration of the
  // manager; all but the last add their gradients into the optimizer's accumulator. TrainStep
  // uses the loss scale read above (the optimizer's, unchanged until its step).
  // Token data: the loss is the mean of the micro-batches' means (each over the same number of
  // tokens: the mean of the whole batch).
  // Example files: the loss is the mean over the trained targets of the whole step, every
  // micro-batch of every rank (transformers' num_items_in_batch). The step's micro-batches are read
  // first, for N_step = the sum of their trained targets over all ranks (TrainedTargetsAllRanks:
  // every rank computes it locally, no collective); micro-batch m (n_m trained targets, loss
  // mean_m) is weighted by n_m * k * world / N_step, which the optimizer's 1/k and ZeRO's mean over
  // ranks turn into n_m / N_step: the gradient of sum_m n_m mean_m / N_step. A micro-batch without
  // trained targets has no gradient (its weight is then 1, a no-op); a step whose N_step is 0 has
  // none at all: its loss is reported as 0 and the optimizer still steps (Adam's momentum and
  // weight decay move the weights as after any zero gradient).
  const int64_t k = run.shape.accumulation_steps;
  const bool packed = run.data.train_packed.has_value();
  int64_t n_step = 0;
  if (packed) {
    run.batch.packed.resize(static_cast<size_t>(k));
    for (PackedBatch& b : run.batch.packed) {
      RETURN_IF_ERROR(run.data.train_packed->Next(&b));
      n_step += run.data.train_packed->TrainedTargetsAllRanks(b.cursor);
    }
    m.trained_targets = n_step;
  }
  TrainStepResult r;
  double loss_sum = 0;
  for (int64_t micro = 0; micro < k; ++micro) {
    const bool last = micro + 1 == k;
    const OptimizerCall call = last ? OptimizerCall::kStep : OptimizerCall::kAccumulate;
    const uint64_t dropout_seed = LoraDropoutSeed(run.config.seed, run.progress.step, k, micro,
                                                  run.shape.world, run.shape.rank);
    TrainStepResult mr;
    if (!packed) {
      RETURN_IF_ERROR(run.data.train_loader->Next(absl::MakeSpan(run.batch.tokens),
                                                  absl::MakeSpan(run.batch.targets)));
      ASSIGN_OR_RETURN(mr, TrainStep(*run.runtime.model, *run.runtime.manager, *run.runtime.adam,
                                     run.batch.tokens, run.batch.targets, call, dropout_seed));
      loss_sum += mr.loss;
    } else {
      const PackedBatch& b = run.batch.packed[static_cast<size_t>(micro)];
      const double n = static_cast<double>(b.trained_targets);
      const double share = n_step > 0 ? n / static_cast<double>(n_step) : 0.0;
      const double weight =
          b.trained_targets > 0 ? share * static_cast<double>(k * run.shape.world) : 1.0;
      ASSIGN_OR_RETURN(mr, TrainStep(*run.runtime.model, *run.runtime.manager, *run.runtime.adam,
                                     ModelInputs{.tokens = b.tokens,
                                                 .targets = b.targets,
                                                 .positions = b.positions,
                                                 .key_start = b.key_start},
                                     call, dropout_seed, weight));
      loss_sum += mr.loss * share;
    }
    r.adam = mr.adam;
    r.forward_backward_ns += mr.forward_backward_ns;
    r.optimizer_ns += mr.optimizer_ns;
    r.forward_backward_stall_ns += mr.forward_backward_stall_ns;
    r.optimizer_stall_ns += mr.optimizer_stall_ns;
  }
  const ChunkManagerCounters c1 = run.runtime.manager->counters();
  if (!packed) {
    r.loss = loss_sum / static_cast<double>(k);
    ASSIGN_OR_RETURN(m.loss, run.MeanOverRanks(r.loss));
  } else {
    // This rank's part of sum_m n_m mean_m / N_step; the step's loss is the sum over ranks.
    r.loss = loss_sum;
    ASSIGN_OR_RETURN(const double mean, run.MeanOverRanks(r.loss));
    m.loss = mean * static_cast<double>(run.shape.world);
  }
  m.grad_norm = r.adam.grad_norm;
  m.skipped = r.adam.skipped;
  if (run.shape.dtype == DType::kF16 && m.skipped) {
    // A skip is a loss-scale event only while the f16 parameters are finite: a lower scale
    // cures gradients that overflowed, not weights that did.
    RETURN_IF_ERROR(CheckF16ParametersFinite(run, m.step));
  }
  // A non-finite loss is divergence unless it came with a skipped fp16 step (a loss-scale event).
  // (Non-finite gradients already stopped the optimizer: HybridAdam.) Nothing is saved for it.
  if (!std::isfinite(m.loss) && !(run.shape.dtype == DType::kF16 && m.skipped)) {
    return absl::OutOfRangeError(absl::StrFormat(
        "the loss of step %d is %f (%s): training diverged or the data or weights are bad, and "
        "training stops; no checkpoint is written for this step. Lower the learning rate "
        "(optimizer.params.lr), enable gradient clipping (gradient_clipping, e.g. 1.0), and "
        "check the training data",
        m.step, m.loss, DTypeName(run.shape.dtype)));
  }
  const double step_s = static_cast<double>(r.forward_backward_ns + r.optimizer_ns) * 1e-9;
  m.step_ms = step_s * 1e3;
  m.tokens_per_s = static_cast<double>(run.shape.micro_batch * run.shape.accumulation_steps *
                                       run.shape.seq_len * run.shape.world) /
                   std::max(1e-9, step_s);
  const auto ms = [](int64_t ns) { return static_cast<double>(std::max<int64_t>(0, ns)) * 1e-6; };
  m.copy_wait_ms = ms(r.forward_backward_stall_ns + r.optimizer_stall_ns);
  m.compute_ms = ms(r.forward_backward_ns - r.forward_backward_stall_ns);
  m.optimizer_ms = ms(r.optimizer_ns - r.optimizer_stall_ns);
  const MemoryTrackerSnapshot a =
      run.runtime.accelerator->tracker()->SnapshotAndResetIntervalPeaks();
  const MemoryTrackerSnapshot h = run.runtime.host->tracker()->SnapshotAndResetIntervalPeaks();
  m.accelerator_peak_model_bytes = a.peak_model_bytes;
  m.accelerator_peak_non_model_bytes = a.peak_non_model_bytes;
  m.accelerator_peak_total_bytes = a.peak_total_bytes;
  m.host_peak_model_bytes = h.peak_model_bytes;
  m.host_peak_non_model_bytes = h.peak_non_model_bytes;
  const TransferCounters d = c1.Minus(c0).Total();
  m.loaded_bytes = d.load_bytes;
  m.written_back_bytes = d.write_back_bytes;
  m.evictions = d.write_backs + d.clean_evictions;
  m.pressure_reclaims = c1.pressure_reclaims - c0.pressure_reclaims;
  m.disk_read_bytes = c1.disk_read_bytes - c0.disk_read_bytes;
  m.disk_write_bytes = c1.disk_write_bytes - c0.disk_write_bytes;
  m.disk_wait_ms = ms(c1.disk_read_wait_ns - c0.disk_read_wait_ns + c1.disk_write_wait_ns -
                      c0.disk_write_wait_ns);

  if (run.runtime.trace != nullptr) {
    const int64_t trace_t2 = run.runtime.trace->NowNs();
    run.runtime.trace->Complete(run.runtime.steps_track, absl::StrCat("step ", m.step), "step",
                                trace_t0, trace_t2 - trace_t0,
                                {{"loss", m.loss}, {"lr", m.lr}, {"loaded_bytes", m.loaded_bytes}});
    if (m.warmup) {
      run.runtime.trace->MarkRegion("warm-up iteration", trace_t0, trace_t2 - trace_t0,
                                    {{"step", m.step}});
    }
  }
  ++run.progress.step;
  run.progress.last_loss = m.loss;
  return absl::OkStatus();
}

// The time to first step (TrainSummary::time_to_first_step_s and its parts), once this process's
// first step ran from `step_start_ns` to `step_end_ns` (readings of the run's clock).
void RecordTimeToFirstStep(TrainRun& run, int64_t step_start_ns, int64_t step_end_ns) {
  TrainSummary& s = run.progress.summary;
  s.setup_s = Seconds(run.console.start_ns, step_start_ns);
  s.first_step_s = Seconds(step_start_ns, step_end_ns);
  s.time_to_first_step_s = Seconds(run.console.start_ns, step_end_ns);
  s.setup_phases = run.console.phases;
}

// Step `m` as one line of profile.metrics (rank 0; nothing without a metrics file). The first
// step of this process also carries the time to first step and the setup's phases.
void WriteMetrics(const TrainRun& run, const StepMetrics& m) {
  if (run.runtime.metrics == nullptr) return;
  nlohmann::json j;
  if (run.progress.history.size() == 1) {
    const TrainSummary& s = run.progress.summary;
    j["time_to_first_step_s"] = s.time_to_first_step_s;
    j["setup_s"] = s.setup_s;
    j["first_step_s"] = s.first_step_s;
    nlohmann::json phases = nlohmann::json::object();
    for (const auto& [name, seconds] : s.setup_phases) phases[name] = seconds;
    j["setup_phases_s"] = phases;
  }
  j["step"] = m.step;
  j["loss"] = m.loss;
  j["lr"] = m.lr;
  j["loss_scale"] = m.loss_scale;
  j["grad_norm"] = m.grad_norm;
  j["skipped"] = m.skipped;
  j["warmup"] = m.warmup;
  j["tokens_per_s"] = m.tokens_per_s;
  j["step_ms"] = m.step_ms;
  j["compute_ms"] = m.compute_ms;
  j["copy_wait_ms"] = m.copy_wait_ms;
  j["optimizer_ms"] = m.optimizer_ms;
  j["accelerator"] = {{"peak_model_bytes", m.accelerator_peak_model_bytes},
                      {"peak_non_model_bytes", m.accelerator_peak_non_model_bytes}};
  j["host"] = {{"peak_model_bytes", m.host_peak_model_bytes},
               {"peak_non_model_bytes", m.host_peak_non_model_bytes}};
  j["loaded_bytes"] = m.loaded_bytes;
  j["written_back_bytes"] = m.written_back_bytes;
  j["evictions"] = m.evictions;
  j["pressure_reclaims"] = m.pressure_reclaims;
  if (m.trained_targets.has_value()) j["trained_targets"] = *m.trained_targets;
  if (run.runtime.swap != nullptr) {
    j["disk"] = {{"read_bytes", m.disk_read_bytes},
                 {"write_bytes", m.disk_write_bytes},
                 {"wait_ms", m.disk_wait_ms}};
    // offload_param "nvme": the most host bytes the frozen base's chunks held so far.
    if (const DiskTier* tier = run.runtime.manager->disk_tier();
        tier != nullptr && tier->num_frozen_chunks() > 0) {
      j["disk"]["frozen_peak_host_bytes"] = tier->frozen_peak_host_bytes();
    }
  }
  if (m.val_loss.has_value()) j["val_loss"] = *m.val_loss;
  if (absl::Status s = run.runtime.metrics->Write(j); !s.ok()) {
    LOG(WARNING) << "metrics: " << s;
  }
}

// The rest of run.progress.summary once the steps are over (summary.seconds is set): the step
// range, the losses, the tokens, the time split and peaks over run.progress.history, the chunk
// traffic and collectives of the manager, the model data this rank holds, the emulated
// accelerator's allocations.
void FinishSummary(const TrainRun& run, RunProgress& progress) {
  progress.summary.last_step = progress.step;
  if (!progress.history.empty()) {
    progress.summary.first_loss = progress.history.front().loss;
    progress.summary.last_loss = progress.history.back().loss;
    const size_t n = std::min<size_t>(10, progress.history.size());
    double sum = 0;
    for (size_t i = progress.history.size() - n; i < progress.history.size(); ++i)
      sum += progress.history[i].loss;
    progress.summary.final_mean_loss = sum / static_cast<double>(n);
  }
  progress.summary.tokens = static_cast<int64_t>(progress.history.size()) * run.shape.micro_batch *
                            run.shape.accumulation_steps * run.shape.seq_len * run.shape.world;
  for (const StepMetrics& m : progress.history) {
    progress.summary.compute_s += m.compute_ms * 1e-3;
    progress.summary.copy_wait_s += m.copy_wait_ms * 1e-3;
    progress.summary.optimizer_s += m.optimizer_ms * 1e-3;
    progress.summary.accelerator_peak_model_bytes =
        std::max(progress.summary.accelerator_peak_model_bytes, m.accelerator_peak_model_bytes);
    progress.summary.accelerator_peak_non_model_bytes = std::max(
        progress.summary.accelerator_peak_non_model_bytes, m.accelerator_peak_non_model_bytes);
    progress.summary.accelerator_peak_total_bytes =
        std::max(progress.summary.accelerator_peak_total_bytes, m.accelerator_peak_total_bytes);
    progress.summary.host_peak_model_bytes =
        std::max(progress.summary.host_peak_model_bytes, m.host_peak_model_bytes);
    progress.summary.host_peak_non_model_bytes =
        std::max(progress.summary.host_peak_non_model_bytes, m.host_peak_non_model_bytes);
  }
  const double train_s =
      progress.summary.compute_s + progress.summary.copy_wait_s + progress.summary.optimizer_s;
  progress.summary.tokens_per_s =
      train_s > 0 ? static_cast<double>(progress.summary.tokens) / train_s : 0;
  const ChunkManagerCounters c = run.runtime.manager->counters();
  const TransferCounters t = c.Total();
  progress.summary.loaded_bytes = t.load_bytes;
  progress.summary.written_back_bytes = t.write_back_bytes;
  progress.summary.loads = t.loads;
  progress.summary.write_backs = t.write_backs;
  progress.summary.clean_evictions = t.clean_evictions;
  progress.summary.prefetches = c.prefetches;
  progress.summary.prefetch_hits = c.prefetch_hits;
  progress.summary.write_behinds = c.write_behinds;
  progress.summary.pressure_evictions = c.pressure_evictions;
  progress.summary.pressure_reclaims = c.pressure_reclaims;
  progress.summary.frozen_writeback_bytes = c.frozen_writeback_bytes;
  progress.summary.trainable_params = run.runtime.store->layout().trainable_elems();
  progress.summary.frozen_params = run.runtime.store->layout().frozen_elems();
  if (run.resolved.quant4.has_value() && run.resolved.lora.has_value()) {
    // A 4-bit weight's layout elements are its blob's: count its values instead.
    const Quant4Totals q = Quant4TotalsOf(
        Quant4Weights(run.resolved.model_config, *run.resolved.lora, *run.resolved.quant4),
        run.runtime.store->compute_dtype());
    progress.summary.frozen_params +=
        q.values - q.stored_bytes / SizeOf(run.runtime.store->compute_dtype());
  }
  progress.summary.disk_reads = c.disk_reads;
  progress.summary.disk_writes = c.disk_writes;
  progress.summary.disk_read_bytes = c.disk_read_bytes;
  progress.summary.disk_write_bytes = c.disk_write_bytes;
  progress.summary.disk_read_ahead_hits = c.disk_read_ahead_hits;
  progress.summary.disk_peak_host_bytes = c.disk_peak_host_bytes;
  if (const DiskTier* tier = run.runtime.manager->disk_tier();
      tier != nullptr && tier->num_frozen_chunks() > 0) {
    progress.summary.disk_frozen_peak_host_bytes = tier->frozen_peak_host_bytes();
    progress.summary.disk_frozen_host_budget_bytes = tier->frozen_host_budget_bytes();
  }
  progress.summary.disk_read_wait_s = static_cast<double>(c.disk_read_wait_ns) * 1e-9;
  progress.summary.disk_write_wait_s = static_cast<double>(c.disk_write_wait_ns) * 1e-9;
  if (run.runtime.disk_bandwidth.has_value()) {
    progress.summary.disk_measured_read_bytes_per_s = run.runtime.disk_bandwidth->read_bytes_per_s;
    progress.summary.disk_measured_write_bytes_per_s =
        run.runtime.disk_bandwidth->write_bytes_per_s;
    progress.summary.disk_engine = run.runtime.disk_bandwidth->engine;
  }
  progress.summary.world_size = run.shape.world;
  progress.summary.rank_model_data_bytes =
      run.runtime.store->PayloadBytesOn(Device::Host()) +
      run.runtime.store->PayloadBytesOn(run.runtime.accelerator->device());
  progress.summary.all_gather_bytes = c.all_gather_bytes;
  progress.summary.reduce_scatter_bytes = c.reduce_scatter_bytes;
  progress.summary.comm_s = static_cast<double>(c.comm_ns) * 1e-9;
  if (absl::StatusOr<CpuBackendMemoryStats> m = GetCpuBackendMemoryStats(*run.runtime.backend);
      m.ok()) {
    progress.summary.accelerator_allocations = m->allocations;
    progress.summary.accelerator_cache_hits = m->reuses();
    progress.summary.accelerator_peak_mapped_bytes = m->peak_mapped_bytes;
  }
}

}  // namespace

absl::Status RunTraining(TrainRun& run) {
  PrintRunStart(run);
  run.progress.summary.first_step = run.progress.step;
  const int64_t start = run.NowNs();
  const int64_t eval_every = run.config.data.eval_every;
  // data.eval_every 0: never validate.
  const bool validates = run.data.has_val() && eval_every > 0;
  // The end of this process's first step: the ETA counts from there (the first step is the
  // warm-up, slower than the rest).
  int64_t first_step_end_ns = 0;
  absl::Status status = [&]() -> absl::Status {
    if (validates) {
      const int64_t e0 = run.NowNs();
      ASSIGN_OR_RETURN(const double v, EvaluateValidation(run, run.batch));
      run.progress.summary.eval_s += Seconds(e0, run.NowNs());
      run.console.AddPhase("validation", Seconds(e0, run.NowNs()));
      run.progress.summary.first_val_loss = v;
      PrintValidationLoss(run, run.progress.step, v);
    }
    while (run.progress.step < run.config.steps) {
      StepMetrics m;
      const ProcessUsage u0 = ReadProcessUsage(run);
      RETURN_IF_ERROR(Step(run, m));
      const ProcessUsage u1 = ReadProcessUsage(run);
      if (run.progress.history.empty()) {
        first_step_end_ns = u1.wall_ns;
        RecordTimeToFirstStep(run, u0.wall_ns, u1.wall_ns);
      }
      run.progress.summary.steps_wall_s += Seconds(u0.wall_ns, u1.wall_ns);
      run.progress.summary.steps_user_s += u1.user_s - u0.user_s;
      run.progress.summary.steps_system_s += u1.system_s - u0.system_s;
      run.progress.summary.steps_minor_faults += u1.minor_faults - u0.minor_faults;
      run.progress.summary.steps_major_faults += u1.major_faults - u0.major_faults;
      const bool last = run.progress.step == run.config.steps;
      ASSIGN_OR_RETURN(const bool stop,
                       run.AnyRank(run.env.stop_requested && run.env.stop_requested()));
      if (validates && (run.progress.step % eval_every == 0 || last || stop)) {
        const int64_t e0 = run.NowNs();
        const int64_t trace_e0 = run.runtime.trace != nullptr ? run.runtime.trace->NowNs() : 0;
        ASSIGN_OR_RETURN(const double v, EvaluateValidation(run, run.batch));
        run.progress.summary.eval_s += Seconds(e0, run.NowNs());
        if (run.runtime.trace != nullptr) {
          run.runtime.trace->Complete(run.runtime.steps_track, "validation", "eval", trace_e0,
                                      run.runtime.trace->NowNs() - trace_e0, {{"val_loss", v}});
        }
        m.val_loss = v;
        run.progress.summary.last_val_loss = v;
      }
      run.progress.history.push_back(m);
      WriteMetrics(run, m);
      if (m.step % std::max<int64_t>(run.config.steps_per_print, 1) == 0 || last ||
          m.step == run.progress.summary.first_step + 1 || m.val_loss.has_value()) {
        PrintProgress(run, m);
      }
      const bool checkpoint_due = !run.config.checkpoint.dir.empty() &&
                                  ((run.config.checkpoint.every > 0 &&
                                    run.progress.step % run.config.checkpoint.every == 0) ||
                                   last || stop);
      if (checkpoint_due) {
        ClearStatus(run);  // SaveCheckpoint prints its own line
        RETURN_IF_ERROR(SaveCheckpoint(run, run.progress));
      }
      if (!last && !stop) {
        // A terminal's status line: the steps after the first at their mean pace so far (the
        // first alone until there is one).
        const int64_t now = run.NowNs();
        const int64_t after_first = m.step - (run.progress.summary.first_step + 1);
        const int64_t to_go = run.config.steps - m.step;
        std::optional<double> eta;
        if (after_first > 0) {
          eta = EstimateSecondsLeft(static_cast<double>(after_first),
                                    static_cast<double>(after_first + to_go),
                                    Seconds(first_step_end_ns, now));
        } else {
          eta = static_cast<double>(to_go) * run.progress.summary.first_step_s;
        }
        PrintStepStatus(run, m, eta);
      }
      if (stop && !last) {
        run.progress.summary.stopped_by_request = true;
        PrintStopped(run);
        break;
      }
    }
    ClearStatus(run);
    if (!run.config.checkpoint.export_path.empty()) {
      RETURN_IF_ERROR(Export(run, run.config.checkpoint.export_path));
      PrintExported(run);
    }
    if (!run.config.checkpoint.export_merged.empty()) {
      RETURN_IF_ERROR(ExportMerged(run, run.config.checkpoint.export_merged));
      PrintExportedMerged(run);
    }
    return absl::OkStatus();
  }();
  ClearStatus(run);  // also after an error: the caller's message starts a clean line
  run.progress.summary.seconds = Seconds(start, run.NowNs());
  FinishSummary(run, run.progress);
  PrintSummary(run);
  status.Update(run.CloseOutputs());
  return status;
}

}  // namespace trainer_internal
}  // namespace ps
