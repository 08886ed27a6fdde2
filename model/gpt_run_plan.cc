// The pre-flight plan of a run (PlanGptRun, CheckGptRunFits: model/gpt_activation_profile.h):
// the layout's chunk size, the activation profile replayed by the memory plan, and the refusals
// that name what does not fit and what to change.
#include <algorithm>
#include <cstdint>
#include <limits>
#include <optional>
#include <string>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "base/status_macros.h"
#include "base/units.h"
#include "chunk/chunk_layout.h"
#include "chunk/chunk_type.h"
#include "glog/logging.h"
#include "model/gpt_activation_profile.h"
#include "model/kernels/kernel_workspaces.h"
#include "model/lora_config.h"
#include "model/quant4_config.h"
#include "model/model_config.h"

namespace ps {
namespace {

// The model planned: model_config, or config's GPT-2.
ModelConfig PlannedModel(const GptRunPlanOptions& o) {
  return o.model_config.has_value() ? *o.model_config : FromGptConfig(o.config);
}

// The refusals' pieces: "model NAME (P parameters, DTYPE, micro batch B, seq_len T[, world size
// W])"; what limits host memory (accelerator.host_memory when `capped`, else what the OS gives);
// and the advice that ends a host-memory refusal.
std::string PlannedRunName(const GptRunPlanOptions& o, const ModelConfig& mc) {
  return absl::StrCat(
      "model ", mc.name, " (", ModelParameterCount(mc), " parameters, ", DTypeName(o.compute_dtype),
      ", micro batch ", o.model.batch, ", seq_len ",
      o.model.seq_len == 0 ? mc.max_position_embeddings : o.model.seq_len,
      o.world_size > 1 ? absl::StrCat(", world size ", o.world_size) : std::string(), ")");
}

std::string HostLimit(const GptRunPlanOptions& o, bool capped) {
  if (capped) {
    return absl::StrCat("accelerator.host_memory caps the host pools at ",
                        FormatBytes(*o.host_cap_bytes));
  }
  return absl::StrCat("the OS can give this process only ", FormatBytes(o.host_available_bytes),
                      " more (MemAvailable, or the memory cgroup's limit if lower)");
}

constexpr char kHostMemoryAdvice[] =
    ". Use a smaller model, 16-bit precision, more ranks (ZeRO shards the model data), or a "
    "machine with more memory. Nothing was allocated";

// The host-memory advice: without the disk tier, it is the first thing to try.
std::string HostMemoryAdvice(const GptRunPlanOptions& o) {
  if (o.disk.has_value()) return kHostMemoryAdvice;
  return absl::StrCat(
      ". Put the optimizer state (",
      ModelDataBytesPerParam(o.compute_dtype) - SizeOf(o.compute_dtype),
      " bytes per parameter) on a local disk with --nvme_path=DIR "
      "(zero_optimization.offload_optimizer.device \"nvme\"), or use a smaller model, 16-bit "
      "precision, more ranks (ZeRO shards the model data), or a machine with more memory. Nothing "
      "was allocated");
}

// All of the owned optimizer state, as a disk-tier budget (MemoryPlan clips it to the state).
constexpr int64_t kWholeStateBudget = std::numeric_limits<int64_t>::max() / 4;

// A disk tier's automatic host budget: what the host limit (the cap, else what the OS can give
// less a margin) leaves for the tier's `tier_bytes` beside everything else `all` (a plan holding
// all of them in RAM) counts; at most all of them, at least the tier's `least`.
int64_t AutoTierBudget(const GptRunPlanOptions& o, const MemoryPlan& all, int64_t tier_bytes,
                       int64_t least) {
  int64_t b = tier_bytes;
  if (o.host_available_bytes > 0) {
    const int64_t margin = std::max(kDiskTierHostMarginBytes, o.host_available_bytes / 20);
    b = std::min(b, o.host_available_bytes - margin - (all.host_needed_bytes - tier_bytes));
  }
  if (o.host_cap_bytes.has_value()) {
    b = std::min(b, *o.host_cap_bytes - (all.host_model_data_bytes - tier_bytes));
  }
  return std::max(b, least);
}

// PlanMemory with the disk tier's host budget: o.disk's, or the automatic one (see
// GptRunPlanOptions::DiskTier), which needs a first plan holding all the state to see what the
// rest of the run takes. `budget` receives the budget planned with.
absl::StatusOr<MemoryPlan> PlanMemoryWithDisk(const GptRunPlanOptions& o, MemoryPlanOptions& p,
                                              int64_t& budget) {
  budget = 0;
  if (!o.disk.has_value()) return PlanMemory(p);
  p.disk = MemoryPlanOptions::DiskTier{.host_budget_bytes = o.disk->host_budget_bytes,
                                       .read_ahead = o.disk->read_ahead,
                                       .in_host_memory = o.disk->in_host_memory,
                                       .optimizer_state = o.disk->optimizer_state,
                                       .frozen_params = o.disk->frozen_params,
                                       .frozen_host_budget_bytes = o.disk->frozen_host_budget_bytes,
                                       .frozen_read_ahead = o.disk->frozen_read_ahead};
  if (o.disk->optimizer_state && o.disk->host_budget_bytes <= 0) {
    p.disk->host_budget_bytes = kWholeStateBudget;
    ASSIGN_OR_RETURN(const MemoryPlan all, PlanMemory(p));
    p.disk->host_budget_bytes =
        AutoTierBudget(o, all, all.disk_host_bytes, all.disk_min_host_bytes);
  }
  if (o.disk->frozen_params && o.disk->frozen_host_budget_bytes <= 0) {
    // The frozen base's automatic budget, beside the optimizer state's (planned first).
    p.disk->frozen_host_budget_bytes = kWholeStateBudget;
    ASSIGN_OR_RETURN(const MemoryPlan all, PlanMemory(p));
    p.disk->frozen_host_budget_bytes = AutoTierBudget(o, all, all.disk_frozen_host_bytes,
                                                      all.disk_frozen_min_host_bytes);
  }
  budget = p.disk->host_budget_bytes;
  return PlanMemory(p);
}

// Tensor offsets of the run's layout: 16-byte aligned with a 4-bit base (its blobs' scales are
// f32 arrays), else unaligned (every element type is its own alignment).
int64_t PlanAlignmentElems(const GptRunPlanOptions& o) {
  return o.model.quant4.has_value() ? Quant4AlignmentElems(o.compute_dtype) : 1;
}

// The plan of one chunk size and budget.
absl::StatusOr<GptRunPlan> PlanOne(const GptRunPlanOptions& o, int64_t chunk_elems) {
  const ModelConfig mc = PlannedModel(o);
  const GptConfig view = GptConfigView(mc);
  GptRunPlan run;
  run.vocab.vocab_block_rows = GptVocabBlockRowsForChunk(view, chunk_elems, o.model.ce_vocab_tile);
  if (run.vocab.vocab_block_rows == 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("chunk.size ", chunk_elems, " elements cannot hold one vocabulary tile of ",
                     o.model.ce_vocab_tile, " embedding rows of model ", view.name));
  }
  if (run.vocab.vocab_block_rows >= view.vocab_size) run.vocab.vocab_block_rows = 0;
  GptModelOptions model = o.model;
  if (model.seq_len == 0) model.seq_len = view.max_seq_len;
  GptMemoryModel memory =
      ModelActivationProfile(mc, model, o.compute_dtype, run.vocab, o.kernel_workspaces.get());
  MemoryPlanOptions p;
  p.ops = std::move(memory.ops);
  p.profile = std::move(memory.profile);
  p.chunk_elems = chunk_elems;
  p.tensor_alignment_elems = PlanAlignmentElems(o);
  p.compute_dtype = o.compute_dtype;
  p.world_size = o.world_size;
  p.rank = o.rank;
  p.gradient_accumulation_steps = o.gradient_accumulation_steps;
  p.overlap_snapshot_bytes = o.overlap_snapshot_bytes;
  p.comm_buffer_bytes = o.comm_buffer_bytes;
  p.host_cap_bytes = o.host_cap_bytes;
  p.host_available_bytes = o.host_available_bytes;
  p.host_resident_bytes = o.host_resident_bytes;
  p.host_overhead_bytes = o.host_overhead_bytes;
  p.host_workspace_bytes = o.host_workspace_bytes;
  p.accelerator_in_host_memory = o.accelerator_in_host_memory;
  // A budget first guessed, then (auto) set to what the plan needs: the segments, and so the
  // slack, depend on it.
  run.accelerator_bytes = o.accelerator_bytes > 0 ? o.accelerator_bytes : 4 * kGiB;
  for (int round = 0; round < 3; ++round) {
    p.accelerator_bytes = run.accelerator_bytes;
    p.scratch = ScratchOptionsForBudget(run.accelerator_bytes);
    // One segment beside the stranded bytes (a request between two samples), and a tide margin
    // of 1/32 of the activation peak: measured (capacity_benchmark), bf16 runs' real tide ran
    // 0.5-0.9% above the profile's at mlp.c_proj's backward. The moment-by-moment comparison
    // added since (trainer/activation_profile_match_test, model/llama_model_test) finds the two
    // equal on every shape it runs, CPU- and CUDA-sized workspaces alike; the gpt2 measurement
    // has not been repeated, so the margin stays.
    p.slack_margin_bytes = p.scratch.small_segment_bytes;
    p.slack_peak_fraction = 1.0 / 32;
    ASSIGN_OR_RETURN(run.plan, PlanMemoryWithDisk(o, p, run.disk_host_budget_bytes));
    run.scratch = p.scratch;
    if (o.accelerator_bytes > 0 || run.plan.min_accelerator_bytes <= run.accelerator_bytes) break;
    run.accelerator_bytes = AlignUp(run.plan.min_accelerator_bytes, kMiB);
  }
  return run;
}

}  // namespace

absl::StatusOr<GptRunPlan> PlanGptRun(const GptRunPlanOptions& o) {
  if (o.model_config.has_value()) {
    RETURN_IF_ERROR(ValidateModelConfig(*o.model_config));
  } else {
    RETURN_IF_ERROR(ValidateGptConfig(o.config));
  }
  const ModelConfig mc = PlannedModel(o);
  const GptConfig view = GptConfigView(mc);
  if (o.model.lora.has_value()) RETURN_IF_ERROR(ValidateLoraConfig(mc, *o.model.lora));
  if (o.model.quant4.has_value()) {
    RETURN_IF_ERROR(ValidateQuant4Config(
        mc, o.model.lora.has_value() ? &*o.model.lora : nullptr, *o.model.quant4));
  }
  if (o.model.batch <= 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("train_micro_batch_size_per_gpu must be >= 1, got ", o.model.batch));
  }
  // A model whose model data alone exceeds the host memory this process may use is refused
  // before any layout is built: a mistyped size (a vocabulary of 1e9 rows) otherwise spent minutes
  // and gigabytes listing blocks for a plan that could only refuse it. Every rank holds at least
  // its share of the model data in host memory, less what a real accelerator keeps.
  // (A frozen base in the disk tier may be on disk too: nothing of the model data has to be in
  // RAM but a budget the full plan checks.)
  const bool frozen_on_disk = o.disk.has_value() && o.disk->frozen_params;
  if (o.host_available_bytes > 0 && (o.accelerator_in_host_memory || o.accelerator_bytes > 0) &&
      !frozen_on_disk) {
    // With the disk tier the optimizer state may all be on disk: the parameters stay. With LoRA
    // the base is frozen (param payloads only; the adapters are not counted: a lower bound).
    const int64_t bytes_per_param = o.disk.has_value() || o.model.lora.has_value()
                                        ? SizeOf(o.compute_dtype)
                                        : ModelDataBytesPerParam(o.compute_dtype);
    double model_data =
        static_cast<double>(ModelParameterCount(mc)) * static_cast<double>(bytes_per_param);
    if (o.model.quant4.has_value()) {
      // The 4-bit weights take their blobs' bytes instead.
      const Quant4Totals q = Quant4TotalsOf(
          Quant4Weights(mc, *o.model.lora, *o.model.quant4), o.compute_dtype);
      model_data += static_cast<double>(q.stored_bytes) -
                    static_cast<double>(q.values) * static_cast<double>(bytes_per_param);
    }
    const double lower_bound =
        model_data / o.world_size -
        (o.accelerator_in_host_memory ? 0.0 : static_cast<double>(o.accelerator_bytes));
    const bool capped = o.host_cap_bytes.has_value() && *o.host_cap_bytes < o.host_available_bytes;
    const int64_t host_limit = capped ? *o.host_cap_bytes : o.host_available_bytes;
    if (lower_bound > static_cast<double>(host_limit)) {
      const std::string needed = FormatBytes(static_cast<int64_t>(
          std::min(lower_bound, static_cast<double>(std::numeric_limits<int64_t>::max()))));
      return absl::ResourceExhaustedError(absl::StrCat(
          PlannedRunName(o, mc), " does not fit in host memory: its ",
          o.disk.has_value() ? "parameters alone need" : "model data alone needs", " at least ",
          needed, " of host memory (",
          absl::StrFormat("%.4g", model_data / static_cast<double>(ModelParameterCount(mc))),
          " bytes per parameter) but ",
          HostLimit(o, capped), "; the smallest host memory that fits is at least ", needed,
          HostMemoryAdvice(o)));
    }
  }
  int64_t min_elems = ModelMinChunkElems(mc, o.model.ce_vocab_tile);
  if (o.model.quant4.has_value()) {
    // The 4-bit weights take their blobs, about a quarter of their 16-bit elements: the largest
    // operator is then another (a vocabulary block, an adapter, a 16-bit linear, a blob), and
    // chunks sized for the 16-bit one would be mostly padding. As ModelMinChunkElems, over the
    // operators of this run (one vocabulary block of ce_vocab_tile rows stands for them all).
    ModelConfig one_block = mc;
    one_block.vocab_size = std::min(o.model.ce_vocab_tile, mc.vocab_size);
    min_elems = 0;
    for (const OperatorSpec& op : ModelOperatorsFor(one_block, o.model.lora, {.vocab_block_rows = 0},
                                                    o.model.quant4, o.compute_dtype)) {
      min_elems = std::max(min_elems, OperatorNumElems(op));
    }
  } else if (o.model.lora.has_value()) {
    // An adapter operator (up to three A/B pairs) may outgrow the base's largest with a large r.
    for (const OperatorSpec& op : LoraModelOperators(mc, *o.model.lora)) {
      if (absl::EndsWith(op.name, ".lora")) min_elems = std::max(min_elems, OperatorNumElems(op));
    }
  }
  if (o.chunk_elems > 0) {
    if (o.chunk_elems < min_elems) {
      return absl::InvalidArgumentError(absl::StrCat(
          "chunk.size = ", o.chunk_elems, " elements is below the smallest chunk of model ",
          view.name, " (", min_elems, " elements); use chunk.size >= ", min_elems, " or \"auto\""));
    }
    ASSIGN_OR_RETURN(GptRunPlan run, PlanOne(o, o.chunk_elems));
    run.chunk_note = "chunk.size";
    return run;
  }
  int64_t step = 1024;
  while (step * 2 * 8 <= min_elems) step *= 2;
  const int64_t first = AlignUp(min_elems, step);
  // Candidates by the model data of all ranks (a layout each, cheap), then planned in that order
  // (a replay each): the first that fits the accelerator wins. A chunk that does not fit the
  // accelerator rules out the larger ones (their working sets are larger).
  struct Candidate {
    int64_t chunk_elems;
    int64_t model_data_bytes;
  };
  std::vector<Candidate> candidates;
  for (int64_t c = first; c <= std::max(first, 2 * min_elems); c += step) {
    VocabLayoutOptions vocab{.vocab_block_rows =
                                 GptVocabBlockRowsForChunk(view, c, o.model.ce_vocab_tile)};
    ChunkLayoutOptions layout_options{.capacity_elems = c,
                                      .world_size = o.world_size,
                                      .tensor_alignment_elems = PlanAlignmentElems(o)};
    ASSIGN_OR_RETURN(ChunkLayout layout,
                     ChunkLayout::Build(layout_options,
                                        ModelOperatorsFor(mc, o.model.lora, vocab, o.model.quant4,
                                                          o.compute_dtype)));
    candidates.push_back({c, layout.TotalModelDataBytes(o.compute_dtype)});
  }
  std::stable_sort(candidates.begin(), candidates.end(),
                   [](const Candidate& a, const Candidate& b) {
                     return a.model_data_bytes < b.model_data_bytes;
                   });
  std::optional<GptRunPlan> best;
  int64_t too_large_elems = std::numeric_limits<int64_t>::max();
  int planned = 0;
  for (const Candidate& c : candidates) {
    if (c.chunk_elems >= too_large_elems) continue;
    ++planned;
    ASSIGN_OR_RETURN(GptRunPlan run, PlanOne(o, c.chunk_elems));
    // Every rank must choose the same chunk size: the choice depends on nothing rank-local (the
    // total model data, the accelerator's fit), never on the host memory a rank sees.
    if (run.plan.fits_accelerator) {
      best = std::move(run);
      break;
    }
    too_large_elems = c.chunk_elems;
    if (!best.has_value() || run.plan.min_accelerator_bytes < best->plan.min_accelerator_bytes) {
      best = std::move(run);
    }
  }
  best->chunk_note = absl::StrCat("chunk.size \"auto\": ", candidates.size(), " candidates, ",
                                  planned, " planned");
  return *std::move(best);
}
absl::Status CheckGptRunDisk(const GptRunPlanOptions& o, const GptRunPlan& run) {
  const MemoryPlan& p = run.plan;
  if (!p.disk_tier || !o.disk.has_value() || o.disk->free_bytes <= 0 ||
      p.disk_bytes <= o.disk->free_bytes) {
    return absl::OkStatus();
  }
  return absl::ResourceExhaustedError(absl::StrCat(
      PlannedRunName(o, PlannedModel(o)),
      " does not fit on disk: the optimizer state this rank owns needs ", FormatBytes(p.disk_bytes),
      " of swap files (", p.disk_bytes, " bytes) but the filesystem of ", o.disk->dir,
      " (zero_optimization.offload_optimizer.nvme_path, --nvme_path) has only ",
      FormatBytes(o.disk->free_bytes), " free (", o.disk->free_bytes,
      " bytes). Free space there, name a larger disk, or use more ranks (ZeRO shards the "
      "optimizer state). Nothing was allocated"));
}

absl::Status CheckGptRunFits(const GptRunPlanOptions& o, const GptRunPlan& run) {
  const MemoryPlan& p = run.plan;
  RETURN_IF_ERROR(CheckGptRunDisk(o, run));
  if (p.fits()) return absl::OkStatus();
  const ModelConfig mc = PlannedModel(o);
  const std::string what = PlannedRunName(o, mc);
  // An explicit host budget below the tier's minimum: the key to change, not the machine.
  if (p.disk_tier && o.disk.has_value() && o.disk->host_budget_bytes > 0 &&
      o.disk->host_budget_bytes < p.disk_min_host_bytes) {
    return absl::ResourceExhaustedError(absl::StrCat(
        what, ": the disk tier's host budget zero_optimization.offload_optimizer.host_budget (",
        o.disk->host_budget_bytes, " bytes) is below the tier's minimum of ",
        FormatBytes(p.disk_min_host_bytes), " (", p.disk_min_host_bytes,
        " bytes: the optimizer state of two chunk indices, one accessed and one written behind). "
        "Set host_budget to at least that, or to 0 (auto). Nothing was allocated"));
  }
  if (!p.fits_host) {
    const bool capped = o.host_cap_bytes.has_value() &&
                        p.host_model_data_bytes + p.host_accumulator_bytes > *o.host_cap_bytes;
    return absl::ResourceExhaustedError(absl::StrCat(
        what, " does not fit in host memory: the plan needs ", FormatBytes(p.host_needed_bytes),
        " more host memory (model data ", FormatBytes(p.host_model_data_bytes),
        p.host_accumulator_bytes > 0
            ? absl::StrCat(", gradient accumulator ", FormatBytes(p.host_accumulator_bytes))
            : std::string(),
        p.host_accelerator_bytes > 0
            ? absl::StrCat(", the emulated accelerator ", FormatBytes(p.host_accelerator_bytes))
            : std::string(),
        p.disk_tier
            ? absl::StrCat(", the disk tier's optimizer state ", FormatBytes(p.disk_host_bytes),
                           " (its minimum ", FormatBytes(p.disk_min_host_bytes), ")")
            : std::string(),
        p.host_swap_bytes > 0 ? absl::StrCat(", its swap files in RAM under ", o.disk->dir,
                                             " (a tmpfs) ", FormatBytes(p.host_swap_bytes))
                              : std::string(),
        ") but ", HostLimit(o, capped), "; the smallest host memory that fits is ",
        FormatBytes(p.host_needed_bytes), HostMemoryAdvice(o)));
  }
  // The accelerator: the largest batch that fits this budget, if any.
  std::string batch;
  for (int64_t b = o.model.batch - 1; b >= 1; b = b > 8 ? b / 2 : b - 1) {
    GptRunPlanOptions smaller = o;
    smaller.model.batch = b;
    smaller.chunk_elems = p.chunk_elems;
    smaller.accelerator_bytes = run.accelerator_bytes;
    absl::StatusOr<GptRunPlan> r = PlanGptRun(smaller);
    if (r.ok() && r->plan.fits_accelerator) {
      batch = absl::StrCat(", or --micro_batch_size=", b, " (train_micro_batch_size_per_gpu)");
      break;
    }
  }
  return absl::ResourceExhaustedError(absl::StrCat(
      what, " does not fit the accelerator's ", FormatBytes(run.accelerator_bytes),
      ": it needs at least ", FormatBytes(p.min_accelerator_bytes), " (",
      FormatBytes(p.lower_bound_bytes), " at ", p.lower_bound_at, ": the operator's ",
      FormatBytes(p.largest_working_set_bytes), " working set plus the activations then; ",
      FormatBytes(p.slack_bytes), " of allocator slack",
      o.comm_buffer_bytes > 0
          ? absl::StrCat(", ", FormatBytes(o.comm_buffer_bytes), " of communication buffers")
          : std::string(),
      "). Use --accelerator_memory=", FormatBytes(AlignUp(p.min_accelerator_bytes, kMiB)),
      " (accelerator.memory) or more", batch,
      ", or activation checkpointing. Nothing was allocated"));
}

}  // namespace ps
