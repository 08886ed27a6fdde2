// Helpers shared by the tests of trainer/config*.h: parsing a test document, a minimal valid
// config to patch, one sample value per key path, a document holding a value at a key path, and
// random valid configs. Test-only.
#ifndef PATRICKSTAR_TRAINER_TESTING_CONFIG_TESTING_H_
#define PATRICKSTAR_TRAINER_TESTING_CONFIG_TESTING_H_

#include <algorithm>
#include <cstdint>
#include <functional>
#include <map>
#include <ostream>
#include <random>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/match.h"
#include "base/units.h"
#include "nlohmann/json.hpp"
#include "trainer/config.h"
#include "trainer/config_schema.h"

namespace ps {

// Failures print configs as their canonical JSON.
void PrintTo(const TrainConfig& config, std::ostream* os);

namespace config_testing {

using Json = nlohmann::json;

// ParseTrainConfig with source "test.json".
absl::StatusOr<TrainConfig> Parse(const std::string& text);
// Parses and validates.
absl::Status ParseAndValidate(const std::string& text, int world_size = 1);
// A small valid config to build on, and it with `patch` merged in (as JSON text).
Json Minimal();
std::string WithMinimal(const Json& patch);

// One sample value per key path (TrainConfigKeyPaths) and how to see it landed.
struct KeySample {
  Json value;
  std::function<bool(const TrainConfig&)> landed;
};
std::map<std::string, KeySample> KeySamples();

// A document holding `value` at `path`, with the siblings the path needs (an optimizer type for
// optimizer.params, a scheduler type the param applies to, lora's required r and
// target_modules).
Json DocFor(const std::string& path, const Json& value);

// Random configs that pass the per-key checks (CheckTrainConfigValues), with every field drawn
// from its whole valid range (awkward doubles, huge integers, non-ASCII strings).
class RandomConfigs {
 public:
  explicit RandomConfigs(uint64_t seed) : rng_(seed) {}

  TrainConfig Next() {
    TrainConfig c;
    c.train_batch_size = Int(0, std::numeric_limits<int64_t>::max());
    c.train_micro_batch_size_per_gpu = Int(1, std::numeric_limits<int64_t>::max());
    c.gradient_accumulation_steps = Int(1, std::numeric_limits<int64_t>::max());
    c.steps = Int(0, std::numeric_limits<int64_t>::max());
    c.seed = U64();
    c.threads = static_cast<int>(Int(0, 65536));
    c.steps_per_print = Int(1, std::numeric_limits<int64_t>::max());
    c.gradient_clipping = NonNegative();
    c.optimizer.type = Bool() ? OptimizerType::kAdam : OptimizerType::kAdamW;
    c.optimizer.lr = NonNegative();
    c.optimizer.beta1 = UnitOpen();
    c.optimizer.beta2 = UnitOpen();
    c.optimizer.eps = Positive();
    c.optimizer.weight_decay = NonNegative();
    c.scheduler.type = static_cast<SchedulerType>(Int(0, 3));
    if (c.scheduler.type != SchedulerType::kNone) {
      c.scheduler.warmup_num_steps = Int(0, std::numeric_limits<int64_t>::max());
      c.scheduler.warmup_type = Bool() ? "log" : "linear";
    }
    if (c.scheduler.type == SchedulerType::kWarmupLR ||
        c.scheduler.type == SchedulerType::kWarmupDecayLR) {
      c.scheduler.warmup_min_lr = NonNegative();
      c.scheduler.warmup_max_lr = Bool() ? -1.0 : NonNegative();
    }
    if (c.scheduler.type == SchedulerType::kWarmupDecayLR ||
        c.scheduler.type == SchedulerType::kWarmupCosineLR) {
      c.scheduler.total_num_steps = Int(0, std::numeric_limits<int64_t>::max());
    }
    if (c.scheduler.type == SchedulerType::kWarmupCosineLR) {
      c.scheduler.warmup_min_ratio = UnitClosed();
      c.scheduler.cos_min_ratio = UnitClosed();
    }
    c.fp16.enabled = Bool();
    c.fp16.loss_scale = Bool() ? 0.0 : std::ldexp(UnitClosed(), static_cast<int>(Int(0, 100)));
    c.fp16.initial_scale_power = static_cast<int>(Int(0, 100));
    c.fp16.loss_scale_window = Int(1, std::numeric_limits<int64_t>::max());
    c.fp16.hysteresis = static_cast<int>(Int(1, std::numeric_limits<int>::max()));
    c.fp16.consecutive_hysteresis = Bool();
    c.fp16.min_loss_scale = std::ldexp(0.5 + UnitClosed() / 2, static_cast<int>(Int(-60, 99)));
    c.bf16 = Bool();
    const std::vector<std::string> presets = TrainModelPresetNames();
    c.model.preset = Bool() ? "" : presets[Int(0, presets.size() - 1)];
    c.model.vocab_size = Int(0, int64_t{1} << 30);
    c.model.max_seq_len = Int(0, int64_t{1} << 30);
    c.model.hidden = Int(0, int64_t{1} << 30);
    c.model.num_layers = Int(0, kMaxModelLayers);
    c.model.num_heads = Int(0, int64_t{1} << 30);
    c.model.activation_checkpointing = Bool();
    c.chunk.size_elems = Int(0, int64_t{1} << 40);
    c.accelerator.kind = Bool() ? AcceleratorKind::kCpu : AcceleratorKind::kCuda;
    c.accelerator.memory_bytes = Bytes();
    c.accelerator.host_memory_bytes = Bytes();
    // 0 (unthrottled) or within [1MB/s, 1PB/s]: here [2^20, 2^49] bytes/s.
    c.accelerator.copy_bandwidth_bytes_per_s =
        Bool() ? 0.0 : std::ldexp(0.5 + UnitClosed() / 2, static_cast<int>(Int(21, 49)));
    c.accelerator.device_index = static_cast<int>(Int(0, 65536));
    c.data.train_path = String();
    c.data.val_path = String();
    c.data.seq_len = Int(0, std::numeric_limits<int64_t>::max());
    c.data.shuffle = Bool();
    c.data.seed = U64();
    c.data.eval_every = Int(0, std::numeric_limits<int64_t>::max());
    c.data.eval_batches = Int(1, std::numeric_limits<int64_t>::max());
    c.checkpoint.dir = String();
    c.checkpoint.every = Int(0, std::numeric_limits<int64_t>::max());
    c.checkpoint.keep_last = Int(1, std::numeric_limits<int64_t>::max());
    c.checkpoint.resume = Bool();
    c.checkpoint.init_from = String();
    c.checkpoint.export_path = String();
    c.checkpoint.export_merged = String();
    c.profile.trace_path = String();
    c.profile.metrics_path = String();
    const OffloadDevice devices[] = {OffloadDevice::kNone, OffloadDevice::kCpu,
                                     OffloadDevice::kNvme};
    c.zero_optimization.offload_optimizer.device = devices[Int(0, 2)];
    c.zero_optimization.offload_optimizer.nvme_path = String();
    c.zero_optimization.offload_optimizer.buffer_count = Int(1, kMaxOffloadBufferCount);
    c.zero_optimization.offload_optimizer.pin_memory = Bool();
    c.zero_optimization.offload_param.device = devices[Int(0, 1)];  // "nvme" is refused
    c.zero_optimization.offload_param.pin_memory = Bool();
    c.aio.block_size_bytes = Int(1, kMaxAioBlockBytes / kAioAlignmentBytes) * kAioAlignmentBytes;
    c.aio.queue_depth = Int(1, kMaxAioQueueDepth);
    c.aio.thread_count = Int(1, kMaxAioThreads);
    c.aio.single_submit = Bool();
    c.aio.overlap_events = Bool();
    if (Bool()) {
      LoraSettings& l = c.lora.emplace();
      l.r = Int(1, int64_t{1} << 30);
      l.lora_alpha = Positive();
      l.lora_dropout = UnitOpen();
      l.target_modules = Bool() ? std::vector<std::string>{std::string(kLoraAllLinear)} : Names(1);
      l.modules_to_save = Names(0);
      l.init_from = String();
    }
    return c;
  }

 private:
  // Small values, boundaries, and anything in between.
  int64_t Int(int64_t lo, int64_t hi) {
    switch (std::uniform_int_distribution<int>(0, 3)(rng_)) {
      case 0:
        return lo;
      case 1:
        return hi;
      case 2:
        return std::uniform_int_distribution<int64_t>(lo, std::min(hi, lo + 100))(rng_);
      default:
        return std::uniform_int_distribution<int64_t>(lo, hi)(rng_);
    }
  }
  uint64_t U64() {
    return Bool() ? std::uniform_int_distribution<uint64_t>(0, 10)(rng_)
                  : std::uniform_int_distribution<uint64_t>()(rng_);
  }
  bool Bool() { return std::uniform_int_distribution<int>(0, 1)(rng_) == 1; }
  double UnitClosed() {
    const double picks[] = {0.0, 1.0, 0.1, 1.0 / 3, 5e-324, 0.9999999999999999};
    return Bool() ? picks[Int(0, 5)] : std::uniform_real_distribution<double>(0, 1)(rng_);
  }
  double UnitOpen() {
    const double v = UnitClosed();
    return v == 1.0 ? 0.5 : v;
  }
  double Positive() {
    const double picks[] = {
        5e-324, 1e-300, 1e-8, 0.1, 1.0 / 3, 1e300, std::numeric_limits<double>::max()};
    return Bool() ? picks[Int(0, 6)]
                  : std::ldexp(0.5 + UnitClosed() / 2, static_cast<int>(Int(-1000, 1000)));
  }
  double NonNegative() { return Int(0, 4) == 0 ? 0.0 : Positive(); }
  int64_t Bytes() {
    switch (std::uniform_int_distribution<int>(0, 4)(rng_)) {
      case 0:
        return 0;
      case 1:
        return Int(1, 1 << 20) * kMiB;
      case 2:
        return Int(1, 100) * kGiB * 1024;
      case 3:
        return std::numeric_limits<int64_t>::max() - Int(0, 5000);
      default:
        return Int(0, std::numeric_limits<int64_t>::max());
    }
  }
  // Valid UTF-8 without NUL: ASCII (quotes, backslashes, control characters), two- to four-byte
  // characters, noncharacters.
  std::string String() {
    if (Int(0, 3) == 0) return "";
    std::string s;
    const int64_t n = Int(1, 40);
    for (int64_t i = 0; i < n; ++i) {
      uint32_t cp = 0;
      switch (std::uniform_int_distribution<int>(0, 3)(rng_)) {
        case 0:
          cp = static_cast<uint32_t>(Int(1, 0x7F));
          break;
        case 1:
          cp = static_cast<uint32_t>(Int(0x80, 0x7FF));
          break;
        case 2:
          do {
            cp = static_cast<uint32_t>(Int(0x800, 0xFFFF));
          } while (cp >= 0xD800 && cp <= 0xDFFF);
          break;
        default:
          cp = static_cast<uint32_t>(Int(0x10000, 0x10FFFF));
      }
      AppendUtf8(cp, &s);
    }
    return s;
  }
  // 0 or more (at least `min`) distinct non-empty module names, none "all-linear".
  std::vector<std::string> Names(int64_t min) {
    std::vector<std::string> names;
    const int64_t n = Int(min, 5);
    while (static_cast<int64_t>(names.size()) < n) {
      std::string name = String();
      if (name.empty() || absl::EqualsIgnoreCase(name, kLoraAllLinear) ||
          std::find(names.begin(), names.end(), name) != names.end()) {
        continue;
      }
      names.push_back(std::move(name));
    }
    return names;
  }
  static void AppendUtf8(uint32_t cp, std::string* s) {
    if (cp < 0x80) {
      s->push_back(static_cast<char>(cp));
    } else if (cp < 0x800) {
      s->push_back(static_cast<char>(0xC0 | (cp >> 6)));
      s->push_back(static_cast<char>(0x80 | (cp & 0x3F)));
    } else if (cp < 0x10000) {
      s->push_back(static_cast<char>(0xE0 | (cp >> 12)));
      s->push_back(static_cast<char>(0x80 | ((cp >> 6) & 0x3F)));
      s->push_back(static_cast<char>(0x80 | (cp & 0x3F)));
    } else {
      s->push_back(static_cast<char>(0xF0 | (cp >> 18)));
      s->push_back(static_cast<char>(0x80 | ((cp >> 12) & 0x3F)));
      s->push_back(static_cast<char>(0x80 | ((cp >> 6) & 0x3F)));
      s->push_back(static_cast<char>(0x80 | (cp & 0x3F)));
    }
  }

  std::mt19937_64 rng_;
};

}  // namespace config_testing
}  // namespace ps

#endif  // PATRICKSTAR_TRAINER_TESTING_CONFIG_TESTING_H_
