// Command-line overrides of single config keys (the trainer's flags, trainer/train.cc).
//
// Thread safety: value types and pure functions.
#ifndef PATRICKSTAR_TRAINER_CONFIG_OVERRIDES_H_
#define PATRICKSTAR_TRAINER_CONFIG_OVERRIDES_H_

#include <cstdint>
#include <optional>
#include <string>

#include "absl/status/status.h"
#include "trainer/config.h"

namespace ps {

// Overrides from command-line flags; unset fields leave the file's value. Strings are taken as they
// are: "" sets the key to empty, which in TrainConfig means "not set". The train binary never
// passes one: it refuses a flag given an empty value (`--train_data=`, or `--train_data=$DATA` with
// DATA unset) before, naming the flag (train.cc RefuseEmptyFlags, the one place for every flag).
//   model               a preset name; also clears model's explicit dimensions (they belonged to
//                       the file's model), keeping activation_checkpointing
//   train_data, val_data, init_from, save_dir (checkpoint.dir), metrics_out (profile.metrics),
//   trace_out (profile.trace): strings, taken as they are
//   accelerator         "cpu" | "cuda" (case-insensitive)
//   accelerator_memory  a byte quantity, base/units.h ParseBytes ("64MiB", "1.5GB", "1048576")
//   chunk_size          elements (an integer > 0) or "auto"
//   steps (> 0), seq_len (>= 0; 0 = the model's n_positions), seed, resume
//   micro_batch_size    >= 1; also resets train_batch_size to 0 (derived), so a file's
//                       train_batch_size cannot contradict the flag
//   gradient_accumulation_steps  >= 1; also resets train_batch_size to 0, like micro_batch_size
//   nvme_path           a directory: the disk tier — sets
//                       zero_optimization.offload_optimizer.device "nvme" and its nvme_path
//                       (and offload_param.nvme_path when offload_param.device is "nvme")
//                       (ValidateTrainConfig checks the directory)
//   lora_r              >= 1: lora.r; turns LoRA on (a lora section with PEFT's defaults) when the
//                       config has no lora section
//   lora_alpha (> 0, finite), lora_dropout ([0, 1)), lora_target_modules (comma-separated module
//   names, or all-linear), lora_init_from (a directory): the lora section's keys. Each
//                       needs a rank: a lora section in the config or lora_r, else InvalidArgument
//                       naming the flag (a --lora_* flag alone does not turn LoRA on)
//   export_merged       a directory: checkpoint.export_merged (ValidateTrainConfig
//                       refuses it without a lora section)
//   load_in_4bit        quantization.load_in_4bit; the section's other keys stay as the file has
//                       them (else BitsAndBytesConfig's defaults). ValidateTrainConfig refuses
//                       true without a lora section. false turns a file's 4-bit base off.
struct ConfigOverrides {
  std::optional<std::string> model, train_data, val_data, init_from, accelerator,
      accelerator_memory, chunk_size, save_dir, metrics_out, trace_out, nvme_path;
  std::optional<int64_t> steps, seq_len, micro_batch_size, gradient_accumulation_steps;
  std::optional<uint64_t> seed;
  std::optional<bool> resume;
  std::optional<bool> packing;  // data.packing
  std::optional<int64_t> lora_r;
  std::optional<double> lora_alpha, lora_dropout;
  std::optional<std::string> lora_target_modules, lora_init_from, export_merged;
  std::optional<bool> load_in_4bit;  // quantization.load_in_4bit
};

// Applies `o` to `config`. InvalidArgument naming the flag and its value for a value it cannot
// parse or that is out of range (the config is then unchanged). Checks only what it parses; call
// ValidateTrainConfig afterwards.
[[nodiscard]] absl::Status ApplyOverrides(const ConfigOverrides& o, TrainConfig* config);

}  // namespace ps

#endif  // PATRICKSTAR_TRAINER_CONFIG_OVERRIDES_H_
