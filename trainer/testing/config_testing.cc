#include "trainer/testing/config_testing.h"

#include <string>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/str_split.h"
#include "trainer/config_json.h"
#include "trainer/config_parse.h"
#include "trainer/config_validate.h"

namespace ps {

void PrintTo(const TrainConfig& config, std::ostream* os) { *os << TrainConfigToJson(config); }

namespace config_testing {

absl::StatusOr<TrainConfig> Parse(const std::string& text) {
  return ParseTrainConfig(text, "test.json");
}

absl::Status ParseAndValidate(const std::string& text, int world_size) {
  absl::StatusOr<TrainConfig> c = Parse(text);
  if (!c.ok()) return c.status();
  return ValidateTrainConfig(*c, world_size);
}

Json Minimal() { return Json{{"train_steps", 10}, {"model", {{"preset", "tiny"}}}}; }

std::string WithMinimal(const Json& patch) {
  Json doc = Minimal();
  doc.merge_patch(patch);
  return doc.dump();
}

std::map<std::string, KeySample> KeySamples() {
  std::map<std::string, KeySample> s;
  s["train_batch_size"] = {16, [](const TrainConfig& c) { return c.train_batch_size == 16; }};
  s["train_micro_batch_size_per_gpu"] = {
      4, [](const TrainConfig& c) { return c.train_micro_batch_size_per_gpu == 4; }};
  s["gradient_accumulation_steps"] = {
      1, [](const TrainConfig& c) { return c.gradient_accumulation_steps == 1; }};
  s["train_steps"] = {7, [](const TrainConfig& c) { return c.steps == 7; }};
  s["seed"] = {uint64_t{18446744073709551615u},
               [](const TrainConfig& c) { return c.seed == 18446744073709551615u; }};
  s["threads"] = {3, [](const TrainConfig& c) { return c.threads == 3; }};
  s["steps_per_print"] = {5, [](const TrainConfig& c) { return c.steps_per_print == 5; }};
  s["gradient_clipping"] = {0.5, [](const TrainConfig& c) { return c.gradient_clipping == 0.5; }};
  s["optimizer.type"] = {
      "Adam", [](const TrainConfig& c) { return c.optimizer.type == OptimizerType::kAdam; }};
  s["optimizer.params.lr"] = {0.01, [](const TrainConfig& c) { return c.optimizer.lr == 0.01; }};
  s["optimizer.params.betas"] = {Json::array({0.8, 0.95}), [](const TrainConfig& c) {
                                   return c.optimizer.beta1 == 0.8 && c.optimizer.beta2 == 0.95;
                                 }};
  s["optimizer.params.eps"] = {1e-6, [](const TrainConfig& c) { return c.optimizer.eps == 1e-6; }};
  s["optimizer.params.weight_decay"] = {
      0.1, [](const TrainConfig& c) { return c.optimizer.weight_decay == 0.1; }};
  s["optimizer.params.adam_w_mode"] = {
      true, [](const TrainConfig& c) { return c.optimizer.type == OptimizerType::kAdamW; }};
  s["optimizer.params.amsgrad"] = {false, [](const TrainConfig&) { return true; }};
  s["optimizer.params.bias_correction"] = {true, [](const TrainConfig&) { return true; }};
  s["optimizer.overlap"] = {true, [](const TrainConfig& c) { return c.optimizer.overlap; }};
  s["scheduler.type"] = {"WarmupLR", [](const TrainConfig& c) {
                           return c.scheduler.type == SchedulerType::kWarmupLR;
                         }};
  s["scheduler.params.warmup_min_lr"] = {
      1e-5, [](const TrainConfig& c) { return c.scheduler.warmup_min_lr == 1e-5; }};
  s["scheduler.params.warmup_max_lr"] = {
      0.02, [](const TrainConfig& c) { return c.scheduler.warmup_max_lr == 0.02; }};
  s["scheduler.params.warmup_num_steps"] = {
      11, [](const TrainConfig& c) { return c.scheduler.warmup_num_steps == 11; }};
  s["scheduler.params.warmup_type"] = {
      "log", [](const TrainConfig& c) { return c.scheduler.warmup_type == "log"; }};
  s["scheduler.params.total_num_steps"] = {
      99, [](const TrainConfig& c) { return c.scheduler.total_num_steps == 99; }};
  s["scheduler.params.warmup_min_ratio"] = {
      0.1, [](const TrainConfig& c) { return c.scheduler.warmup_min_ratio == 0.1; }};
  s["scheduler.params.cos_min_ratio"] = {
      0.01, [](const TrainConfig& c) { return c.scheduler.cos_min_ratio == 0.01; }};
  s["scheduler.params.last_batch_iteration"] = {-1, [](const TrainConfig&) { return true; }};
  s["fp16.enabled"] = {true, [](const TrainConfig& c) { return c.fp16.enabled; }};
  s["fp16.loss_scale"] = {128, [](const TrainConfig& c) { return c.fp16.loss_scale == 128; }};
  s["fp16.initial_scale_power"] = {
      12, [](const TrainConfig& c) { return c.fp16.initial_scale_power == 12; }};
  s["fp16.loss_scale_window"] = {
      500, [](const TrainConfig& c) { return c.fp16.loss_scale_window == 500; }};
  s["fp16.hysteresis"] = {4, [](const TrainConfig& c) { return c.fp16.hysteresis == 4; }};
  s["fp16.consecutive_hysteresis"] = {
      true, [](const TrainConfig& c) { return c.fp16.consecutive_hysteresis; }};
  s["fp16.min_loss_scale"] = {0.25,
                              [](const TrainConfig& c) { return c.fp16.min_loss_scale == 0.25; }};
  s["fp16.max_consecutive_skipped_steps"] = {
      7, [](const TrainConfig& c) { return c.fp16.max_consecutive_skipped_steps == 7; }};
  s["bf16.enabled"] = {true, [](const TrainConfig& c) { return c.bf16; }};
  s["model.preset"] = {"gpt2", [](const TrainConfig& c) { return c.model.preset == "gpt2"; }};
  s["model.vocab_size"] = {1000, [](const TrainConfig& c) { return c.model.vocab_size == 1000; }};
  s["model.n_positions"] = {256, [](const TrainConfig& c) { return c.model.max_seq_len == 256; }};
  s["model.n_embd"] = {64, [](const TrainConfig& c) { return c.model.hidden == 64; }};
  s["model.n_layer"] = {2, [](const TrainConfig& c) { return c.model.num_layers == 2; }};
  s["model.n_head"] = {8, [](const TrainConfig& c) { return c.model.num_heads == 8; }};
  s["model.activation_checkpointing"] = {
      true, [](const TrainConfig& c) { return c.model.activation_checkpointing; }};
  s["chunk.size"] = {12345, [](const TrainConfig& c) { return c.chunk.size_elems == 12345; }};
  s["accelerator.backend"] = {
      "cuda", [](const TrainConfig& c) { return c.accelerator.kind == AcceleratorKind::kCuda; }};
  s["accelerator.memory"] = {
      "64MiB", [](const TrainConfig& c) { return c.accelerator.memory_bytes == 64 * kMiB; }};
  s["accelerator.host_memory"] = {
      "1GiB", [](const TrainConfig& c) { return c.accelerator.host_memory_bytes == kGiB; }};
  s["accelerator.copy_bandwidth"] = {"12GB/s", [](const TrainConfig& c) {
                                       return c.accelerator.copy_bandwidth_bytes_per_s == 12e9;
                                     }};
  s["accelerator.device"] = {1,
                             [](const TrainConfig& c) { return c.accelerator.device_index == 1; }};
  s["data.train"] = {"a.bin", [](const TrainConfig& c) { return c.data.train_path == "a.bin"; }};
  s["data.val"] = {"b.bin", [](const TrainConfig& c) { return c.data.val_path == "b.bin"; }};
  s["data.seq_len"] = {64, [](const TrainConfig& c) { return c.data.seq_len == 64; }};
  s["data.shuffle"] = {true, [](const TrainConfig& c) { return c.data.shuffle; }};
  s["data.seed"] = {7, [](const TrainConfig& c) { return c.data.seed == 7; }};
  s["data.eval_every"] = {10, [](const TrainConfig& c) { return c.data.eval_every == 10; }};
  s["data.eval_batches"] = {2, [](const TrainConfig& c) { return c.data.eval_batches == 2; }};
  s["data.packing"] = {false, [](const TrainConfig& c) { return !c.data.packing; }};
  s["checkpoint.dir"] = {"ckpt", [](const TrainConfig& c) { return c.checkpoint.dir == "ckpt"; }};
  s["checkpoint.every"] = {50, [](const TrainConfig& c) { return c.checkpoint.every == 50; }};
  s["checkpoint.keep_last"] = {3, [](const TrainConfig& c) { return c.checkpoint.keep_last == 3; }};
  s["checkpoint.resume"] = {true, [](const TrainConfig& c) { return c.checkpoint.resume; }};
  s["checkpoint.init_from"] = {"gpt2.safetensors", [](const TrainConfig& c) {
                                 return c.checkpoint.init_from == "gpt2.safetensors";
                               }};
  s["checkpoint.export"] = {"out.safetensors", [](const TrainConfig& c) {
                              return c.checkpoint.export_path == "out.safetensors";
                            }};
  s["checkpoint.export_merged"] = {
      "merged", [](const TrainConfig& c) { return c.checkpoint.export_merged == "merged"; }};
  s["profile.trace"] = {"t.json",
                        [](const TrainConfig& c) { return c.profile.trace_path == "t.json"; }};
  s["profile.metrics"] = {"m.jsonl",
                          [](const TrainConfig& c) { return c.profile.metrics_path == "m.jsonl"; }};
  s["zero_optimization.offload_optimizer.device"] = {
      "nvme", [](const TrainConfig& c) {
        return c.zero_optimization.offload_optimizer.device == OffloadDevice::kNvme;
      }};
  s["zero_optimization.offload_optimizer.nvme_path"] = {
      "/mnt/nvme", [](const TrainConfig& c) {
        return c.zero_optimization.offload_optimizer.nvme_path == "/mnt/nvme";
      }};
  s["zero_optimization.offload_optimizer.buffer_count"] = {
      6,
      [](const TrainConfig& c) { return c.zero_optimization.offload_optimizer.buffer_count == 6; }};
  s["zero_optimization.offload_optimizer.host_budget"] = {
      "3GiB", [](const TrainConfig& c) {
        return c.zero_optimization.offload_optimizer.host_budget_bytes == (int64_t{3} << 30);
      }};
  s["zero_optimization.offload_optimizer.pin_memory"] = {
      true, [](const TrainConfig& c) { return c.zero_optimization.offload_optimizer.pin_memory; }};
  s["zero_optimization.offload_param.device"] = {
      "cpu", [](const TrainConfig& c) {
        return c.zero_optimization.offload_param.device == OffloadDevice::kCpu;
      }};
  s["zero_optimization.offload_param.pin_memory"] = {
      true, [](const TrainConfig& c) { return c.zero_optimization.offload_param.pin_memory; }};
  s["zero_optimization.offload_param.nvme_path"] = {
      "/mnt/nvme-param", [](const TrainConfig& c) {
        return c.zero_optimization.offload_param.nvme_path == "/mnt/nvme-param";
      }};
  s["zero_optimization.offload_param.buffer_count"] = {
      7, [](const TrainConfig& c) { return c.zero_optimization.offload_param.buffer_count == 7; }};
  s["zero_optimization.offload_param.max_in_cpu"] = {
      1000000000, [](const TrainConfig& c) {
        return c.zero_optimization.offload_param.max_in_cpu == 1000000000;
      }};
  s["aio.block_size"] = {262144,
                         [](const TrainConfig& c) { return c.aio.block_size_bytes == 262144; }};
  s["aio.queue_depth"] = {32, [](const TrainConfig& c) { return c.aio.queue_depth == 32; }};
  s["aio.thread_count"] = {2, [](const TrainConfig& c) { return c.aio.thread_count == 2; }};
  s["aio.single_submit"] = {true, [](const TrainConfig& c) { return c.aio.single_submit; }};
  s["aio.overlap_events"] = {false, [](const TrainConfig& c) { return !c.aio.overlap_events; }};
  s["lora.r"] = {16, [](const TrainConfig& c) { return c.lora.has_value() && c.lora->r == 16; }};
  s["lora.lora_alpha"] = {
      32, [](const TrainConfig& c) { return c.lora.has_value() && c.lora->lora_alpha == 32; }};
  s["lora.lora_dropout"] = {0.05, [](const TrainConfig& c) {
                              return c.lora.has_value() && c.lora->lora_dropout == 0.05;
                            }};
  s["lora.target_modules"] = {Json::array({"q_proj", "v_proj"}), [](const TrainConfig& c) {
                                return c.lora.has_value() &&
                                       c.lora->target_modules ==
                                           std::vector<std::string>{"q_proj", "v_proj"};
                              }};
  s["lora.bias"] = {
      "none", [](const TrainConfig& c) { return c.lora.has_value() && c.lora->bias == "none"; }};
  s["lora.modules_to_save"] = {
      Json::array({"lm_head"}), [](const TrainConfig& c) {
        return c.lora.has_value() && c.lora->modules_to_save == std::vector<std::string>{"lm_head"};
      }};
  s["lora.init_from"] = {"adapter", [](const TrainConfig& c) {
                           return c.lora.has_value() && c.lora->init_from == "adapter";
                         }};
  s["quantization.load_in_4bit"] = {
      true, [](const TrainConfig& c) { return c.quantization.load_in_4bit; }};
  s["quantization.bnb_4bit_quant_type"] = {"nf4", [](const TrainConfig& c) {
                                             return c.quantization.quant_type == Quant4Type::kNf4;
                                           }};
  s["quantization.bnb_4bit_use_double_quant"] = {
      true, [](const TrainConfig& c) { return c.quantization.double_quant; }};
  s["quantization.bnb_4bit_compute_dtype"] = {
      "bfloat16",
      [](const TrainConfig& c) { return c.quantization.compute_dtype == DType::kBF16; }};
  s["quantization.llm_int8_skip_modules"] = {
      Json::array({"lm_head", "mlp."}), [](const TrainConfig& c) {
        return c.quantization.skip_modules == std::vector<std::string>{"lm_head", "mlp."};
      }};
  return s;
}

Json DocFor(const std::string& path, const Json& value) {
  Json doc = Json::object();
  const std::vector<std::string> parts = absl::StrSplit(path, '.');
  Json* node = &doc;
  for (size_t i = 0; i + 1 < parts.size(); ++i) node = &(*node)[parts[i]];
  (*node)[parts.back()] = value;
  if (absl::StartsWith(path, "optimizer.params.")) doc["optimizer"]["type"] = "AdamW";
  if (absl::StartsWith(path, "scheduler.params.")) {
    const std::string& key = parts.back();
    doc["scheduler"]["type"] =
        (key == "warmup_min_ratio" || key == "cos_min_ratio") ? "WarmupCosineLR" : "WarmupDecayLR";
  }
  if (absl::StartsWith(path, "lora.")) {
    // The section's required keys.
    if (!doc["lora"].contains("r")) doc["lora"]["r"] = 8;
    if (!doc["lora"].contains("target_modules")) doc["lora"]["target_modules"] = {"c_attn"};
  }
  return doc;
}

}  // namespace config_testing
}  // namespace ps
