#include "trainer/config_overrides.h"

#include <algorithm>
#include <cmath>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "absl/strings/ascii.h"
#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "base/status_macros.h"
#include "base/units.h"
#include "trainer/config_schema.h"
#include "trainer/json_reader.h"

namespace ps {

namespace {

absl::Status BadFlag(absl::string_view flag, absl::string_view value, absl::string_view rule) {
  return absl::InvalidArgumentError(absl::StrCat("--", flag, "=", value, ": ", rule));
}

// The --lora_* flags and --export_merged onto `c`.
absl::Status ApplyLoraOverrides(const ConfigOverrides& o, TrainConfig* c) {
  if (o.lora_r.has_value()) {
    if (*o.lora_r < 1 || *o.lora_r > kMaxModelDim) {
      return BadFlag(
          "lora_r", absl::StrCat(*o.lora_r),
          absl::StrCat("must be in [1, ", kMaxModelDim, "]: the adapters' rank, e.g. 8 or 16"));
    }
    if (!c->lora.has_value()) c->lora.emplace();
    c->lora->r = *o.lora_r;
  }
  // The other flags set keys of a lora section, which needs a rank.
  const std::pair<absl::string_view, std::optional<std::string>> flags[] = {
      {"lora_alpha", o.lora_alpha.has_value()
                         ? std::optional<std::string>(FormatShortestDouble(*o.lora_alpha))
                         : std::nullopt},
      {"lora_dropout", o.lora_dropout.has_value()
                           ? std::optional<std::string>(FormatShortestDouble(*o.lora_dropout))
                           : std::nullopt},
      {"lora_target_modules", o.lora_target_modules},
      {"lora_init_from", o.lora_init_from}};
  for (const auto& [flag, value] : flags) {
    if (value.has_value() && !c->lora.has_value()) {
      return BadFlag(flag, *value,
                     "sets a key of LoRA fine-tuning, which needs a rank: pass --lora_r=N (e.g. "
                     "16) or give the config a lora section with r (a --lora_* flag alone does "
                     "not turn LoRA on)");
    }
  }
  if (o.lora_alpha.has_value()) {
    if (!(*o.lora_alpha > 0) || !std::isfinite(*o.lora_alpha)) {
      return BadFlag("lora_alpha", FormatShortestDouble(*o.lora_alpha),
                     "must be finite and > 0: the adapters' output is scaled by lora_alpha / r");
    }
    c->lora->lora_alpha = *o.lora_alpha;
  }
  if (o.lora_dropout.has_value()) {
    if (!(*o.lora_dropout >= 0 && *o.lora_dropout < 1)) {
      return BadFlag("lora_dropout", FormatShortestDouble(*o.lora_dropout),
                     "must be in [0, 1): the probability of dropping an adapter input");
    }
    c->lora->lora_dropout = *o.lora_dropout;
  }
  if (o.lora_target_modules.has_value()) {
    std::vector<std::string> names = ParseLoraModuleList(*o.lora_target_modules);
    if (std::find(names.begin(), names.end(), "") != names.end()) {
      return BadFlag("lora_target_modules", *o.lora_target_modules,
                     "give comma-separated module names, e.g. q_proj,k_proj,v_proj,o_proj "
                     "(GPT-2: c_attn,c_proj,c_fc), or all-linear");
    }
    if (names.size() == 1 && absl::EqualsIgnoreCase(names[0], kLoraAllLinear)) {
      names = {std::string(kLoraAllLinear)};
    }
    c->lora->target_modules = std::move(names);
  }
  if (o.lora_init_from.has_value()) c->lora->init_from = *o.lora_init_from;
  if (o.export_merged.has_value()) c->checkpoint.export_merged = *o.export_merged;
  return absl::OkStatus();
}

}  // namespace

absl::Status ApplyOverrides(const ConfigOverrides& o, TrainConfig* config) {
  TrainConfig c = *config;
  const auto bad = [](absl::string_view flag, absl::string_view value, absl::string_view rule) {
    return absl::InvalidArgumentError(absl::StrCat("--", flag, "=", value, ": ", rule));
  };
  if (o.model.has_value()) {
    const std::vector<std::string> names = TrainModelPresetNames();
    if (std::find(names.begin(), names.end(), *o.model) == names.end()) {
      return bad("model", *o.model,
                 absl::StrCat("unknown model preset; valid presets: ", absl::StrJoin(names, ", ")));
    }
    const bool checkpointing = c.model.activation_checkpointing;
    c.model = TrainModelConfig{};
    c.model.preset = *o.model;
    c.model.activation_checkpointing = checkpointing;
    // A preset comes with the sizes that suit it: the chunk size and the emulated accelerator's
    // memory go back to "auto" (the memory plan picks them) unless given as flags too.
    if (!o.chunk_size.has_value()) c.chunk.size_elems = 0;
    if (!o.accelerator_memory.has_value()) c.accelerator.memory_bytes = 0;
  }
  if (o.train_data.has_value()) c.data.train_path = *o.train_data;
  if (o.val_data.has_value()) c.data.val_path = *o.val_data;
  if (o.packing.has_value()) c.data.packing = *o.packing;
  if (o.init_from.has_value()) c.checkpoint.init_from = *o.init_from;
  if (o.save_dir.has_value()) c.checkpoint.dir = *o.save_dir;
  if (o.metrics_out.has_value()) c.profile.metrics_path = *o.metrics_out;
  if (o.trace_out.has_value()) c.profile.trace_path = *o.trace_out;
  if (o.accelerator.has_value()) {
    absl::StatusOr<AcceleratorKind> kind = ParseAcceleratorKind(*o.accelerator);
    if (!kind.ok()) return bad("accelerator", *o.accelerator, kind.status().message());
    c.accelerator.kind = *kind;
  }
  if (o.accelerator_memory.has_value()) {
    absl::StatusOr<int64_t> bytes = ParseBytes(*o.accelerator_memory);
    if (!bytes.ok()) {
      return bad(
          "accelerator_memory", *o.accelerator_memory,
          absl::StrCat(bytes.status().message(), "; write e.g. 64MiB, 1.5GB or a number of bytes"));
    }
    c.accelerator.memory_bytes = *bytes;
  }
  if (o.chunk_size.has_value()) {
    const absl::string_view text = absl::StripAsciiWhitespace(*o.chunk_size);
    int64_t elems = 0;
    if (absl::EqualsIgnoreCase(text, "auto")) {
      c.chunk.size_elems = 0;
    } else if (absl::SimpleAtoi(text, &elems) && elems >= 1 && elems <= kMaxChunkElems) {
      c.chunk.size_elems = elems;
    } else if (absl::EndsWithIgnoreCase(text, "b") && ParseBytes(text).ok()) {
      return bad("chunk_size", *o.chunk_size,
                 "chunk sizes are in elements, not bytes; give an integer number of elements "
                 "(e.g. 67108864) or \"auto\"");
    } else {
      return bad("chunk_size", *o.chunk_size,
                 absl::StrCat("must be an integer number of elements in [1, ", kMaxChunkElems,
                              "] or \"auto\""));
    }
  }
  if (o.steps.has_value()) {
    if (*o.steps < 1) {
      return bad("steps", absl::StrCat(*o.steps), "must be > 0 optimizer steps");
    }
    c.steps = *o.steps;
  }
  if (o.seq_len.has_value()) {
    if (*o.seq_len < 0) {
      return bad("seq_len", absl::StrCat(*o.seq_len),
                 "must be >= 0 tokens (0: the model's n_positions)");
    }
    c.data.seq_len = *o.seq_len;
  }
  if (o.micro_batch_size.has_value()) {
    if (*o.micro_batch_size < 1) {
      return bad("micro_batch_size", absl::StrCat(*o.micro_batch_size), "must be >= 1 sequences");
    }
    c.train_micro_batch_size_per_gpu = *o.micro_batch_size;
    c.train_batch_size = 0;  // derived from the flag, never contradicting it
  }
  if (o.gradient_accumulation_steps.has_value()) {
    if (*o.gradient_accumulation_steps < 1) {
      return bad("gradient_accumulation_steps", absl::StrCat(*o.gradient_accumulation_steps),
                 "must be >= 1 micro-batches per optimizer step");
    }
    c.gradient_accumulation_steps = *o.gradient_accumulation_steps;
    c.train_batch_size = 0;  // derived from the flag, never contradicting it
  }
  if (o.nvme_path.has_value()) {
    c.zero_optimization.offload_optimizer.device = OffloadDevice::kNvme;
    c.zero_optimization.offload_optimizer.nvme_path = *o.nvme_path;
    // One swap serves both tiers: a frozen base on disk moves with it.
    if (c.zero_optimization.offload_param.device == OffloadDevice::kNvme) {
      c.zero_optimization.offload_param.nvme_path = *o.nvme_path;
    }
  }
  if (o.seed.has_value()) c.seed = *o.seed;
  if (o.resume.has_value()) c.checkpoint.resume = *o.resume;
  RETURN_IF_ERROR(ApplyLoraOverrides(o, &c));
  if (o.load_in_4bit.has_value()) c.quantization.load_in_4bit = *o.load_in_4bit;
  *config = std::move(c);
  return absl::OkStatus();
}

}  // namespace ps
