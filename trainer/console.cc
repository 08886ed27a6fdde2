#include "trainer/console.h"

#include <algorithm>
#include <cstdint>
#include <optional>
#include <ostream>
#include <sstream>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/ascii.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "base/simd_targets.h"
#include "base/units.h"
#include "chunk/chunk_layout.h"
#include "chunk/chunk_type.h"
#include "disk/chunk_swap.h"
#include "disk/disk_probe.h"
#include "memory/dtype.h"
#include "model/kernels/internal/bf16_gemm.h"
#include "model/kernels/internal/blas.h"
#include "model/model_config.h"
#include "optimizer/grad_accumulator.h"
#include "scheduler/memory_plan.h"
#include "trainer/config.h"
#include "trainer/model_resolution.h"
#include "trainer/plan_options.h"
#include "trainer/progress_meter.h"

namespace ps {
namespace trainer_internal {
namespace {

// Writes `text` (whole lines) to run.out(), flushed, through the console's meter so that a status
// line is cleared first.
void Emit(const TrainRun& run, absl::string_view text) {
  if (run.out() == nullptr) return;
  if (run.console.meter != nullptr) {
    run.console.meter->Print(text);
    return;
  }
  *run.out() << text;
  run.out()->flush();
}

// The data line of an example file: its examples, the rows they make at this seq_len, the share of
// real (non-padding) tokens, and what truncation cut.
void PrintExampleData(const TrainRun& run, std::ostream& os, absl::string_view what,
                      const std::string& path, const ExampleFile& file,
                      const PackedLoader& loader) {
  os << absl::StrFormat(
      "%s: %s, example file: %d examples, %d tokens; %d rows of %d tokens (packing %s), real "
      "tokens %.1f%%; %d examples truncated to seq_len (%d tokens dropped); batch %d x %d "
      "tokens; %d batches per epoch\n",
      what, path, file.num_examples(), file.num_tokens(), loader.num_rows(), run.shape.seq_len,
      run.config.data.packing ? "on" : "off", 100.0 * loader.real_token_fraction(),
      loader.truncated_examples(), loader.dropped_tokens(), run.shape.micro_batch,
      run.shape.seq_len, loader.batches_per_epoch());
}

}  // namespace

void PrintHeader(const TrainRun& run) {
  if (run.out() == nullptr) return;
  std::ostringstream os;
  const ChunkLayout& layout = run.runtime.store->layout();
  const int64_t params = ModelParameterCount(run.resolved.model_config);
  // LoRA: the frozen base holds only its params (the layout counts what each chunk holds).
  const int64_t model_data = run.resolved.lora.has_value()
                                 ? layout.TotalModelDataBytes(run.shape.dtype)
                                 : params * ModelDataBytesPerParam(run.shape.dtype);
  os << absl::StrFormat(
      "model %s: %d layers, %d heads, hidden %d, vocab %d, %.2fM parameters, %s of model data "
      "(%s)\n",
      run.resolved.gpt.name, run.resolved.gpt.num_layers, run.resolved.gpt.num_heads,
      run.resolved.gpt.hidden, run.resolved.gpt.vocab_size, params / 1e6, FormatBytes(model_data),
      DTypeName(run.shape.dtype));
  os << absl::StrFormat(
      "chunks: %d per type (param, master, momentum, variance) of %d elements (%s) (%s)\n",
      layout.num_chunks(), run.memory.chunk_elems, FormatBytes(run.memory.chunk_elems * 4),
      run.memory.chunk_size_note);
  if (run.resolved.lora.has_value()) {
    // The frozen base's chunks hold only their param payload; the adapters train in full.
    int64_t frozen_chunks = 0;
    for (int64_t c = 0; c < layout.num_chunks(); ++c) {
      if (!layout.chunk_trainable(c)) ++frozen_chunks;
    }
    const int64_t trainable = layout.trainable_elems();
    // A 4-bit base's layout holds its blobs: count the values they hold instead.
    const Quant4Totals q4 = Quant4BaseTotals(run.resolved.model_config, run.resolved.lora,
                                             run.resolved.quant4, run.shape.dtype);
    const int64_t frozen =
        layout.frozen_elems() - q4.stored_bytes / SizeOf(run.shape.dtype) + q4.values;
    const int64_t total = trainable + frozen;
    os << absl::StrFormat(
        "LoRA: r %d, lora_alpha %g (scale %g), dropout %g, targets %s%s: %d trainable "
        "parameters (%.4f%% of %d), %d frozen base parameters in %d param-only chunks (%s "
        "each); %s of model data in all (planned on the host: %s of chunk blocks)\n",
        run.resolved.lora->r, run.resolved.lora->lora_alpha, run.resolved.lora->scale(),
        run.resolved.lora->lora_dropout, absl::StrJoin(run.resolved.lora->target_modules, ","),
        run.resolved.lora->modules_to_save.empty()
            ? std::string()
            : absl::StrCat(", modules_to_save ",
                           absl::StrJoin(run.resolved.lora->modules_to_save, ",")),
        trainable, total > 0 ? 100.0 * static_cast<double>(trainable) / total : 0.0, total, frozen,
        frozen_chunks, FormatBytes(run.memory.chunk_elems * SizeOf(run.shape.dtype)),
        FormatBytes(layout.TotalModelDataBytes(run.shape.dtype)),
        FormatBytes(run.memory.plan.plan.host_model_data_bytes));
    if (run.resolved.quant4.has_value()) {
      os << Quant4BaseLine(run.resolved.model_config, *run.resolved.lora, *run.resolved.quant4,
                           run.shape.dtype)
         << "\n";
    }
  }
  if (!run.resolved.prequantized_line.empty()) {
    os << run.resolved.prequantized_line << "\n";
  }
  os << absl::StrFormat(
      "accelerator: %s, cap %s%s; host memory %s\n", run.runtime.backend->name(),
      FormatBytes(run.runtime.backend->capacity_bytes()),
      run.config.accelerator.copy_bandwidth_bytes_per_s > 0
          ? absl::StrCat(", link ",
                         FormatBytes(static_cast<int64_t>(
                             run.config.accelerator.copy_bandwidth_bytes_per_s)),
                         "/s")
          : std::string(),
      run.config.accelerator.host_memory_bytes > 0
          ? absl::StrCat("cap ", FormatBytes(run.config.accelerator.host_memory_bytes))
          : std::string("uncapped"));
  if (run.config.accelerator.kind != AcceleratorKind::kCuda) {
    // What the CPU kernels dispatch to on this machine: losses are bit-identical run to run and
    // for any `threads` on one CPU kind, and differ in the last bits between kinds.
    std::string bf16;
    if (run.shape.dtype == DType::kBF16) {
      kernels_internal::Bf16GemmBackend backend;
      const absl::Status s = kernels_internal::ResolveBf16GemmBackend(&backend);
      bf16 = s.ok() ? absl::StrCat("; bf16 GEMMs: ", kernels_internal::Bf16GemmBackendName(backend),
                                   " (", kernels_internal::OneDnnBf16Description(), ")")
                    : absl::StrCat("; bf16 GEMMs: ", s.message());
    }
    os << absl::StrFormat("cpu kernels: SIMD %s; OpenBLAS %s kernels%s\n", DescribeSimdDispatch(),
                          kernels_internal::OpenBlasCoreName(), bf16);
  }
  if (run.data.train_packed.has_value()) {
    PrintExampleData(run, os, "data", run.config.data.train_path, *run.data.train_examples,
                     *run.data.train_packed);
  } else {
    os << absl::StrFormat(
        "data: %s, %d tokens; batch %d x %d tokens; %d batches per epoch%s\n",
        run.config.data.train_path.empty() ? std::string("built-in synthetic corpus")
                                           : run.config.data.train_path,
        run.data.train_loader->num_tokens(), run.shape.micro_batch, run.shape.seq_len,
        run.data.train_loader->batches_per_epoch(),
        run.data.unigram_entropy.has_value()
            ? absl::StrFormat("; unigram entropy %.3f nats%s", *run.data.unigram_entropy,
                              run.data.entropy_rate.has_value()
                                  ? absl::StrFormat(", entropy rate %.3f", *run.data.entropy_rate)
                                  : std::string())
            : std::string());
  }
  if (run.data.val_packed.has_value()) {
    PrintExampleData(run, os, "validation data", run.config.data.val_path, *run.data.val_examples,
                     *run.data.val_packed);
  }
  if (run.data.has_val() && run.config.data.eval_every == 0) {
    os << "validation: off (data.eval_every = 0; N > 0 validates every N steps)\n";
  }
  Emit(run, os.str());
}

void PrintDiskTier(const TrainRun& run) {
  if (run.out() == nullptr) return;
  std::ostringstream os;
  if (run.runtime.swap != nullptr && run.runtime.disk_bandwidth.has_value()) {
    const MemoryPlan& p = run.memory.plan.plan;
    const ChunkSwapInfo info = run.runtime.swap->info();
    const DiskBandwidth& bw = *run.runtime.disk_bandwidth;
    const ZeroOptimizationConfig& zero = run.config.zero_optimization;
    const bool state_on_disk = zero.offload_optimizer.device == OffloadDevice::kNvme;
    const bool frozen_on_disk = zero.offload_param.device == OffloadDevice::kNvme;
    os << absl::StrFormat(
        "disk tier: %s in %s (%s of slots; %s, %s); measured there: write %s/s, "
        "read %s/s, %.2f ms per %s block\n",
        state_on_disk && frozen_on_disk ? "optimizer state and the frozen base"
        : state_on_disk                 ? "optimizer state"
                                        : "the frozen base",
        info.path, FormatBytes(p.disk_bytes), info.engine,
        info.direct ? std::string("O_DIRECT") : info.direct_note,
        FormatBytes(static_cast<int64_t>(bw.write_bytes_per_s)),
        FormatBytes(static_cast<int64_t>(bw.read_bytes_per_s)), bw.block_latency_ns * 1e-6,
        FormatBytes(run.config.aio.block_size_bytes));
    const double disk_s = DiskStepSeconds(p, bw.read_bytes_per_s, bw.write_bytes_per_s);
    if (state_on_disk) {
      os << absl::StrFormat(
          "disk tier: host budget %s of optimizer state (minimum %s): %d chunk indices kept in "
          "RAM, %d streamed, read-ahead %d; per step up to %s read and %s written: %.1f s of "
          "disk time at the measured rates\n",
          FormatBytes(run.memory.plan.disk_host_budget_bytes), FormatBytes(p.disk_min_host_bytes),
          p.disk_kept_indices, p.disk_streamed_indices, p.disk_read_ahead,
          FormatBytes(p.disk_read_bytes_per_step), FormatBytes(p.disk_write_bytes_per_step),
          disk_s);
    }
    if (frozen_on_disk) os << FrozenOnDiskLine(zero, run.shape.dtype, p) << "\n";
  }
  Emit(run, os.str());
}

void PrintRunStart(const TrainRun& run) {
  if (run.out() == nullptr) return;
  std::ostringstream os;
  os << absl::StrFormat("training %d steps from step %d with %d threads\n", run.config.steps,
                        run.progress.step, run.shape.threads);
  if (run.shape.accumulation_steps > 1) {
    os << absl::StrFormat(
        "gradient accumulation: %d micro-batches of %d sequences per optimizer step; f32 "
        "accumulator %s of host memory on this rank\n",
        run.shape.accumulation_steps, run.shape.micro_batch,
        FormatBytes(GradientAccumulatorBytes(run.runtime.adam->owned_param_elems(),
                                             run.shape.accumulation_steps)));
  }
  if (run.shape.world > 1) {
    os << absl::StrFormat(
        "data parallel (ZeRO): %d ranks; global batch %d x %d tokens; model data per rank %s "
        "(rank 0)\n",
        run.shape.world, run.shape.micro_batch * run.shape.accumulation_steps * run.shape.world,
        run.shape.seq_len,
        FormatBytes(run.runtime.store->layout().RankModelDataBytes(run.shape.dtype, 0)));
  }
  Emit(run, os.str());
}

void PrintProgress(const TrainRun& run, const StepMetrics& m) {
  if (run.out() == nullptr) return;
  Emit(run,
       absl::StrFormat(
           "step %5d/%d | loss %.4f%s | lr %.3e | scale %g | %s tok/s | %7.1f ms | accel "
           "model %s non-model %s | moved %s%s%s\n",
           m.step, run.config.steps, m.loss,
           m.trained_targets.has_value() ? absl::StrFormat(" over %d targets", *m.trained_targets)
                                         : std::string(),
           m.lr, m.loss_scale, FormatTokensPerSecond(m.tokens_per_s), m.step_ms,
           FormatBytes(m.accelerator_peak_model_bytes),
           FormatBytes(m.accelerator_peak_non_model_bytes),
           FormatBytes(m.loaded_bytes + m.written_back_bytes), m.warmup ? " (warm-up)" : "",
           m.skipped ? " (skipped: overflow)" : ""));
  if (m.val_loss.has_value()) PrintValidationLoss(run, m.step, *m.val_loss);
}

void PrintStepStatus(const TrainRun& run, const StepMetrics& m, std::optional<double> eta_s) {
  if (run.out() == nullptr || run.console.meter == nullptr) return;
  run.console.meter->Status(absl::StrFormat(
      "step %d/%d | loss %.4f | %s tok/s | %s/step | ETA %s", m.step, run.config.steps, m.loss,
      absl::StripLeadingAsciiWhitespace(FormatTokensPerSecond(m.tokens_per_s)),
      FormatDuration(m.step_ms * 1e-3), eta_s.has_value() ? FormatDuration(*eta_s) : "?"));
}

void PrintValidationLoss(const TrainRun& run, int64_t step, double loss) {
  if (run.out() == nullptr) return;
  Emit(run, absl::StrFormat("step %5d validation loss %.4f\n", step, loss));
}

void PrintStopped(const TrainRun& run) {
  if (run.out() == nullptr) return;
  Emit(run, absl::StrCat("stop requested: stopped after step ", run.progress.step, "\n"));
}

void PrintExported(const TrainRun& run) {
  if (run.out() == nullptr) return;
  if (run.resolved.lora.has_value()) {
    Emit(run, absl::StrCat("exported the PEFT LoRA adapter directory (adapter_config.json, "
                           "adapter_model.safetensors) to ",
                           run.config.checkpoint.export_path, "\n"));
    return;
  }
  Emit(run, absl::StrCat("exported Hugging Face ",
                         ExportsHfDirectory(run)
                             ? absl::StrCat(ModelFamilyName(run.resolved.model_config.family),
                                            " model directory")
                             : std::string("GPT-2 weights"),
                         " to ", run.config.checkpoint.export_path, "\n"));
}

void PrintExportedMerged(const TrainRun& run) {
  if (run.out() == nullptr) return;
  Emit(run, absl::StrCat("exported the merged model (W + lora_alpha / r * B A) as a Hugging Face ",
                         ModelFamilyName(run.resolved.model_config.family), " model directory to ",
                         run.config.checkpoint.export_merged, "\n"));
}

void PrintLine(const TrainRun& run, absl::string_view line) {
  if (run.out() == nullptr) return;
  Emit(run, absl::StrCat(line, "\n"));
}

void ClearStatus(const TrainRun& run) {
  if (run.console.meter != nullptr) run.console.meter->ClearStatus();
}

void PrintSummary(const TrainRun& run) {
  if (run.out() != nullptr && !run.progress.history.empty()) Emit(run, SummaryText(run));
}

std::string TimeToFirstStepLine(const TrainSummary& s) {
  // Phases under 0.05 s would print as 0.0: they go to "other" with the time no phase covers.
  std::vector<std::string> parts;
  double shown = 0;
  for (const auto& [name, seconds] : s.setup_phases) {
    if (seconds < 0.05) continue;
    parts.push_back(absl::StrFormat("%s %.1f s", name, seconds));
    shown += seconds;
  }
  if (s.setup_s - shown >= 0.05)
    parts.push_back(absl::StrFormat("other %.1f s", s.setup_s - shown));
  return absl::StrFormat(
      "time to first step %.1f s (setup %.1f s%s; first step %.1f s)\n", s.time_to_first_step_s,
      s.setup_s, parts.empty() ? std::string() : absl::StrCat(": ", absl::StrJoin(parts, ", ")),
      s.first_step_s);
}

std::string SummaryText(const TrainRun& run) {
  const TrainSummary& s = run.progress.summary;
  std::ostringstream os;
  const int64_t steps = s.last_step - s.first_step;
  os << "== summary ==\n";
  os << absl::StrFormat("steps %d..%d in %.1f s; %d tokens, %s tokens/s of training\n",
                        s.first_step + 1, s.last_step, s.seconds, s.tokens,
                        absl::StripLeadingAsciiWhitespace(FormatTokensPerSecond(s.tokens_per_s)));
  if (s.time_to_first_step_s > 0) os << TimeToFirstStepLine(s);
  if (s.tokens_per_s > 0 && run.shape.seq_len > 0) {
    // The model FLOP rate (the numerator of MFU): the useful FLOPs of the tokens trained.
    const double per_token =
        ModelTrainingFlops(run.resolved.model_config, 1, run.shape.seq_len).Total() /
        static_cast<double>(run.shape.seq_len);
    const double rate = per_token * s.tokens_per_s;  // over the training time, as tokens/s
    os << absl::StrFormat(
        "model compute %s (%.4g MFLOP per token: linear layers, LM head and causal attention, "
        "forward and backward; model/model_config.h ModelTrainingFlops)\n",
        rate >= 1e12 ? absl::StrFormat("%.4g TFLOP/s", rate / 1e12)
                     : absl::StrFormat("%.4g GFLOP/s", rate / 1e9),
        per_token / 1e6);
  }
  os << absl::StrFormat("loss %.4f -> %.4f (mean of the last %d steps %.4f)", s.first_loss,
                        s.last_loss, std::min<int64_t>(10, steps), s.final_mean_loss);
  if (run.data.unigram_entropy.has_value()) {
    os << absl::StrFormat("; corpus unigram entropy %.4f nats", *run.data.unigram_entropy);
    if (run.data.entropy_rate.has_value())
      os << absl::StrFormat(", entropy rate %.4f", *run.data.entropy_rate);
  }
  os << "\n";
  if (s.first_val_loss.has_value() && s.last_val_loss.has_value()) {
    os << absl::StrFormat("validation loss %.4f -> %.4f\n", *s.first_val_loss, *s.last_val_loss);
  }
  const double total = std::max(1e-9, s.seconds);
  const double other = std::max(
      0.0, s.seconds - s.compute_s - s.copy_wait_s - s.optimizer_s - s.eval_s - s.checkpoint_s);
  os << absl::StrFormat(
      "time: compute %.1f s (%.0f%%), waiting for chunk copies %.1f s (%.0f%%), optimizer %.1f s "
      "(%.0f%%), validation %.1f s, checkpoints %.1f s, other %.1f s\n",
      s.compute_s, 100 * s.compute_s / total, s.copy_wait_s, 100 * s.copy_wait_s / total,
      s.optimizer_s, 100 * s.optimizer_s / total, s.eval_s, s.checkpoint_s, other);
  os << absl::StrFormat("accelerator %s (cap %s): peak model data %s, peak non-model %s\n",
                        run.runtime.accelerator->device().ToString(),
                        FormatBytes(run.runtime.backend->capacity_bytes()),
                        FormatBytes(s.accelerator_peak_model_bytes),
                        FormatBytes(s.accelerator_peak_non_model_bytes));
  os << absl::StrFormat("host: peak model data %s, peak non-model %s\n",
                        FormatBytes(s.host_peak_model_bytes),
                        FormatBytes(s.host_peak_non_model_bytes));
  os << absl::StrFormat("model data held%s after the last step: %s (%d bytes)\n",
                        s.world_size > 1 ? " by rank 0" : "", FormatBytes(s.rank_model_data_bytes),
                        s.rank_model_data_bytes);
  os << absl::StrFormat(
      "chunk traffic: loaded %s in %d loads (%d prefetched, %d prefetch hits), written back %s "
      "in %d write-backs (%d started early, write-behind), %d clean evictions (no copy)%s\n",
      FormatBytes(s.loaded_bytes), s.loads, s.prefetches, s.prefetch_hits,
      FormatBytes(s.written_back_bytes), s.write_backs, s.write_behinds, s.clean_evictions,
      s.pressure_evictions > 0 ? absl::StrFormat(", %d evicted under memory pressure (%d reclaims)",
                                                 s.pressure_evictions, s.pressure_reclaims)
                               : std::string());
  if (run.resolved.lora.has_value()) {
    os << absl::StrFormat(
        "LoRA: %d trainable and %d frozen parameters; frozen base written back: %s (%d bytes; "
        "frozen chunks are only ever evicted clean)\n",
        s.trainable_params, s.frozen_params, FormatBytes(s.frozen_writeback_bytes),
        s.frozen_writeback_bytes);
  }
  if (!s.disk_engine.empty()) {
    // The disk alone would need read/R + write/W at the rates measured at the start; the share
    // of the optimizer's time that is (the optimizer step is where the tier's I/O happens, beside
    // the read-ahead of the next step's first chunks).
    const double disk_alone_s =
        DiskSeconds(s.disk_read_bytes, s.disk_write_bytes, s.disk_measured_read_bytes_per_s,
                    s.disk_measured_write_bytes_per_s);
    os << absl::StrFormat(
        "disk tier (%s): read %s in %d reads (%d read ahead in time), written %s in %d writes; "
        "waited %.1f s for reads, %.1f s for writes; the disk alone needs %.1f s for that at "
        "the measured rates; tier host peak %s\n",
        s.disk_engine, FormatBytes(s.disk_read_bytes), s.disk_reads, s.disk_read_ahead_hits,
        FormatBytes(s.disk_write_bytes), s.disk_writes, s.disk_read_wait_s, s.disk_write_wait_s,
        disk_alone_s, FormatBytes(s.disk_peak_host_bytes));
    if (s.disk_frozen_host_budget_bytes > 0) {
      os << absl::StrFormat("disk tier: the frozen base's host peak %s of its budget %s\n",
                            FormatBytes(s.disk_frozen_peak_host_bytes),
                            FormatBytes(s.disk_frozen_host_budget_bytes));
    }
  }
  if (s.world_size > 1) {
    os << absl::StrFormat(
        "ZeRO over %d ranks (rank 0's numbers): all-gathered %s, reduce-scattered %s, %.1f s in "
        "collectives\n",
        s.world_size, FormatBytes(s.all_gather_bytes), FormatBytes(s.reduce_scatter_bytes),
        s.comm_s);
  }
  if (s.steps_wall_s > 0) {
    os << absl::StrFormat(
        "host CPU in the steps (every thread): user %.1f s, system %.1f s (%.1f%% of the steps' "
        "%.1f s); page faults %d minor, %d major\n",
        s.steps_user_s, s.steps_system_s, 100 * s.steps_system_s / s.steps_wall_s, s.steps_wall_s,
        s.steps_minor_faults, s.steps_major_faults);
  }
  if (s.accelerator_allocations > 0) {
    os << absl::StrFormat(
        "emulated accelerator memory: %d of %d allocations reused a cached block; at most %s "
        "mapped\n",
        s.accelerator_cache_hits, s.accelerator_allocations,
        FormatBytes(s.accelerator_peak_mapped_bytes));
  }
  if (s.stopped_by_request) os << "stopped early on request (signal)\n";
  return os.str();
}

}  // namespace trainer_internal
}  // namespace ps
