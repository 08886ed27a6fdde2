#include "trainer/config_json.h"

#include <cstdint>
#include <string>
#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/strings/string_view.h"
#include "base/units.h"
#include "model/kernels/nf4.h"
#include "nlohmann/json.hpp"
#include "trainer/config_schema.h"

namespace ps {
namespace {

using OrderedJson = nlohmann::ordered_json;

// "8MiB" when a whole number of the largest binary unit that divides it, else the integer.
// (Only below 2^60: ParseBytes computes in double and rejects values near the int64 limit.)
OrderedJson BytesToJson(int64_t bytes) {
  if (bytes > 0 && bytes < (int64_t{1} << 60)) {
    constexpr std::pair<int64_t, absl::string_view> kUnits[] = {
        {kGiB * 1024, "TiB"}, {kGiB, "GiB"}, {kMiB, "MiB"}, {kKiB, "KiB"}};
    for (const auto& [unit, name] : kUnits) {
      if (bytes % unit == 0) return absl::StrCat(bytes / unit, name);
    }
  }
  return bytes;
}

// Removes every object member whose value is "" (at any depth; list elements stay): an unset path
// is an empty string in TrainConfig, and the parser refuses "" (json_reader.h GetString), so it is
// written as the key left out, which parses back to the same default.
void DropEmptyStrings(OrderedJson& j) {
  if (!j.is_object()) return;
  for (auto it = j.begin(); it != j.end();) {
    if (it->is_string() && it->get_ref<const std::string&>().empty()) {
      it = j.erase(it);
    } else {
      DropEmptyStrings(*it);
      ++it;
    }
  }
}

}  // namespace

std::string TrainConfigToJson(const TrainConfig& c) {
  OrderedJson j = OrderedJson::object();
  if (c.train_batch_size != 0) j["train_batch_size"] = c.train_batch_size;
  j["train_micro_batch_size_per_gpu"] = c.train_micro_batch_size_per_gpu;
  j["gradient_accumulation_steps"] = c.gradient_accumulation_steps;
  j["train_steps"] = c.steps;
  j["seed"] = c.seed;
  j["threads"] = c.threads;
  j["steps_per_print"] = c.steps_per_print;
  j["gradient_clipping"] = c.gradient_clipping;

  OrderedJson opt_params = OrderedJson::object();
  opt_params["lr"] = c.optimizer.lr;
  opt_params["betas"] = OrderedJson::array({c.optimizer.beta1, c.optimizer.beta2});
  opt_params["eps"] = c.optimizer.eps;
  opt_params["weight_decay"] = c.optimizer.weight_decay;
  j["optimizer"] =
      OrderedJson{{"type", OptimizerTypeName(c.optimizer.type)}, {"params", std::move(opt_params)}};

  const SchedulerConfig& s = c.scheduler;
  if (s.type != SchedulerType::kNone) {
    OrderedJson params = OrderedJson::object();
    const auto put = [&](absl::string_view key, OrderedJson value) {
      if (SchedulerParamApplies(s.type, key)) params[std::string(key)] = std::move(value);
    };
    put("warmup_min_lr", s.warmup_min_lr);
    if (s.warmup_max_lr != -1) put("warmup_max_lr", s.warmup_max_lr);
    put("warmup_num_steps", s.warmup_num_steps);
    put("warmup_type", s.warmup_type);
    put("total_num_steps", s.total_num_steps);
    put("warmup_min_ratio", s.warmup_min_ratio);
    put("cos_min_ratio", s.cos_min_ratio);
    j["scheduler"] =
        OrderedJson{{"type", SchedulerTypeName(s.type)}, {"params", std::move(params)}};
  }

  j["fp16"] = OrderedJson{{"enabled", c.fp16.enabled},
                          {"loss_scale", c.fp16.loss_scale},
                          {"initial_scale_power", c.fp16.initial_scale_power},
                          {"loss_scale_window", c.fp16.loss_scale_window},
                          {"hysteresis", c.fp16.hysteresis},
                          {"consecutive_hysteresis", c.fp16.consecutive_hysteresis},
                          {"min_loss_scale", c.fp16.min_loss_scale},
                          {"max_consecutive_skipped_steps", c.fp16.max_consecutive_skipped_steps}};
  j["bf16"] = OrderedJson{{"enabled", c.bf16}};
  j["model"] = OrderedJson{{"preset", c.model.preset},
                           {"vocab_size", c.model.vocab_size},
                           {"n_positions", c.model.max_seq_len},
                           {"n_embd", c.model.hidden},
                           {"n_layer", c.model.num_layers},
                           {"n_head", c.model.num_heads},
                           {"activation_checkpointing", c.model.activation_checkpointing}};
  j["chunk"] = OrderedJson{
      {"size", c.chunk.size_elems == 0 ? OrderedJson("auto") : OrderedJson(c.chunk.size_elems)}};
  j["accelerator"] = OrderedJson{{"backend", AcceleratorKindName(c.accelerator.kind)},
                                 {"memory", BytesToJson(c.accelerator.memory_bytes)},
                                 {"host_memory", BytesToJson(c.accelerator.host_memory_bytes)},
                                 {"copy_bandwidth", c.accelerator.copy_bandwidth_bytes_per_s},
                                 {"device", c.accelerator.device_index}};
  j["data"] = OrderedJson{{"train", c.data.train_path},
                          {"val", c.data.val_path},
                          {"seq_len", c.data.seq_len},
                          {"shuffle", c.data.shuffle},
                          {"packing", c.data.packing},
                          {"seed", c.data.seed},
                          {"eval_every", c.data.eval_every},
                          {"eval_batches", c.data.eval_batches}};
  j["checkpoint"] = OrderedJson{{"dir", c.checkpoint.dir},
                                {"every", c.checkpoint.every},
                                {"keep_last", c.checkpoint.keep_last},
                                {"resume", c.checkpoint.resume},
                                {"init_from", c.checkpoint.init_from},
                                {"export", c.checkpoint.export_path},
                                {"export_merged", c.checkpoint.export_merged}};
  j["profile"] = OrderedJson{{"trace", c.profile.trace_path}, {"metrics", c.profile.metrics_path}};
  const OffloadOptimizerConfig& oo = c.zero_optimization.offload_optimizer;
  const OffloadParamConfig& op = c.zero_optimization.offload_param;
  j["zero_optimization"] = OrderedJson{
      {"offload_optimizer", OrderedJson{{"device", OffloadDeviceName(oo.device)},
                                        {"nvme_path", oo.nvme_path},
                                        {"buffer_count", oo.buffer_count},
                                        {"host_budget", BytesToJson(oo.host_budget_bytes)},
                                        {"pin_memory", oo.pin_memory}}},
      {"offload_param",
       OrderedJson{{"device", OffloadDeviceName(op.device)},
                   {"nvme_path", op.nvme_path},
                   {"buffer_count", op.buffer_count},
                   {"max_in_cpu", op.max_in_cpu == 0 ? OrderedJson("auto")
                                                     : OrderedJson(op.max_in_cpu)},
                   {"pin_memory", op.pin_memory}}}};
  j["aio"] = OrderedJson{{"block_size", BytesToJson(c.aio.block_size_bytes)},
                         {"queue_depth", c.aio.queue_depth},
                         {"thread_count", c.aio.thread_count},
                         {"single_submit", c.aio.single_submit},
                         {"overlap_events", c.aio.overlap_events}};
  if (c.lora.has_value()) {
    const LoraSettings& l = *c.lora;
    j["lora"] = OrderedJson{{"r", l.r},
                            {"lora_alpha", l.lora_alpha},
                            {"lora_dropout", l.lora_dropout},
                            {"target_modules", l.all_linear() ? OrderedJson(kLoraAllLinear)
                                                              : OrderedJson(l.target_modules)},
                            {"bias", l.bias},
                            {"modules_to_save", l.modules_to_save},
                            {"init_from", l.init_from}};
  }
  // The 4-bit base: written when on, or when a file's section (load_in_4bit false) set other keys,
  // so the text parses back to the same config; the default (no quantization) is left out.
  if (const QuantizationSettings& q = c.quantization; q != QuantizationSettings{}) {
    j["quantization"] = OrderedJson{{"load_in_4bit", q.load_in_4bit},
                                    {"bnb_4bit_quant_type", Quant4TypeName(q.quant_type)},
                                    {"bnb_4bit_use_double_quant", q.double_quant},
                                    {"bnb_4bit_compute_dtype", TorchDTypeName(q.compute_dtype)},
                                    {"llm_int8_skip_modules", q.skip_modules}};
  }
  DropEmptyStrings(j);
  // Strings that are not UTF-8 (only possible from overrides; ValidateTrainConfig rejects them)
  // are written with U+FFFD instead of throwing.
  return j.dump(2, ' ', false, OrderedJson::error_handler_t::replace);
}

}  // namespace ps
