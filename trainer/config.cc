#include "trainer/config.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cmath>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <exception>
#include <limits>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/ascii.h"
#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "absl/strings/string_view.h"
#include "absl/types/span.h"
#include "base/status_macros.h"
#include "base/units.h"
#include "base/utf8.h"
#include "chunk/chunk_layout.h"
#include "chunk/operator_spec.h"
#include "glog/logging.h"
#include "nlohmann/json.hpp"

namespace ps {
namespace {

using Json = nlohmann::json;
using OrderedJson = nlohmann::ordered_json;

// A config file is a few KiB; the cap stops `--config=/dev/zero` from eating memory.
constexpr int64_t kMaxConfigFileBytes = 16 * kMiB;
// The deepest config path is 3 objects (optimizer.params.betas); anything much deeper is not a
// config, and the limit keeps every later walk shallow.
constexpr int kMaxJsonDepth = 16;
// Sanity bounds that keep every product below int64 overflow.
constexpr int64_t kMaxChunkElems = int64_t{1} << 40;
constexpr int64_t kMaxModelDim = int64_t{1} << 30;
constexpr double kMaxModelParams = 9007199254740992.0;  // 2^53
constexpr int kMaxThreads = 1 << 16;
constexpr double kMaxBatchElems = 1099511627776.0;  // 2^40 sequences or tokens
constexpr int kMaxDeviceIndex = 1 << 16;

// --- The embedded default: every value in one place ------------------------------------------

// Measured on the emulated accelerator: with micro batch 8 x 128 tokens the activations alone need
// ~32 MiB (~24 MiB with activation checkpointing), above the model data. 8 x 64 tokens with
// activation checkpointing peak at ~6.6 MiB of activations, so a 10 MiB cap — below the 12.9 MiB
// of model data — leaves room for about a quarter of the chunks: ~10 MiB of chunks move per step,
// and the validation loss falls from 5.6 to ~0.43 in 2000 steps (`bazel run //trainer:train`).
TrainConfig MakeDefaultTrainConfig() {
  TrainConfig c;
  // A small GPT-2: 842,496 parameters, 12.9 MiB of f32 model data (16 bytes/param).
  c.model.vocab_size = 256;
  c.model.max_seq_len = 128;
  c.model.hidden = 128;
  c.model.num_layers = 4;
  c.model.num_heads = 4;
  // Activations of 8 x 64 tokens with each block recomputed in backward take ~6.6 MiB of the
  // accelerator at their peak; the rest of the cap is left to chunks.
  c.model.activation_checkpointing = true;
  c.data.seq_len = 64;
  c.train_micro_batch_size_per_gpu = 8;
  c.steps = 2000;  // ~90 s on 2 cores (~41 ms a step)
  c.steps_per_print = 1;  // a progress line per step
  c.optimizer.type = OptimizerType::kAdamW;
  c.optimizer.lr = 3e-3;
  c.optimizer.weight_decay = 0.01;
  c.scheduler.type = SchedulerType::kWarmupDecayLR;
  c.scheduler.warmup_num_steps = 30;
  c.scheduler.warmup_type = "linear";
  c.scheduler.warmup_min_lr = 0;
  c.scheduler.warmup_max_lr = -1;   // optimizer.lr
  c.scheduler.total_num_steps = 0;  // train_steps
  c.gradient_clipping = 1.0;
  // 80 Ki elements: the largest operator, mlp.c_fc (128 x 512 + 512 = 66,048 elements), fits, and
  // the model takes 13 chunks (80% of their capacity used). 64 Ki would not hold mlp.c_fc.
  c.chunk.size_elems = 80 * kKiB;
  c.accelerator.kind = AcceleratorKind::kCpu;
  // Below the model data (13.5 MB), so chunks move: after the activations' peak about a quarter
  // of the chunks fit.
  c.accelerator.memory_bytes = 10 * kMiB;
  c.data.eval_every = 250;  // on the trainer's synthetic validation split (data.val empty)
  c.data.eval_batches = 4;
  return c;
}

// --- Key tables -------------------------------------------------------------------------------

// A key people commonly write for one of ours, suggested whatever its edit distance.
struct Alias {
  absl::string_view wrong;
  absl::string_view right;
};

struct Section {
  absl::string_view path;  // "" for the top level
  absl::Span<const absl::string_view> keys;
  absl::Span<const Alias> aliases;
};

constexpr absl::string_view kTopKeys[] = {"train_batch_size",
                                          "train_micro_batch_size_per_gpu",
                                          "gradient_accumulation_steps",
                                          "train_steps",
                                          "seed",
                                          "threads",
                                          "steps_per_print",
                                          "gradient_clipping",
                                          "optimizer",
                                          "scheduler",
                                          "fp16",
                                          "bf16",
                                          "model",
                                          "chunk",
                                          "accelerator",
                                          "data",
                                          "checkpoint",
                                          "profile"};
constexpr Alias kTopAliases[] = {
    {"steps", "train_steps"},
    {"max_steps", "train_steps"},
    {"train_iters", "train_steps"},
    {"num_steps", "train_steps"},
    {"batch_size", "train_micro_batch_size_per_gpu"},
    {"micro_batch_size", "train_micro_batch_size_per_gpu"},
    {"train_micro_batch_size", "train_micro_batch_size_per_gpu"},
    {"bfloat16", "bf16"},
    {"lr", "optimizer.params.lr"},
    {"learning_rate", "optimizer.params.lr"},
    {"max_grad_norm", "gradient_clipping"},
    {"grad_clip", "gradient_clipping"},
    {"num_threads", "threads"},
};

constexpr absl::string_view kOptimizerKeys[] = {"type", "params"};
constexpr Alias kOptimizerAliases[] = {{"lr", "params"},
                                       {"betas", "params"},
                                       {"eps", "params"},
                                       {"weight_decay", "params"},
                                       {"name", "type"}};
constexpr absl::string_view kOptimizerParamKeys[] = {
    "lr", "betas", "eps", "weight_decay", "adam_w_mode", "amsgrad", "bias_correction"};
constexpr Alias kOptimizerParamAliases[] = {
    {"learning_rate", "lr"}, {"beta1", "betas"}, {"beta2", "betas"}, {"epsilon", "eps"}};

constexpr absl::string_view kSchedulerKeys[] = {"type", "params"};
constexpr Alias kSchedulerAliases[] = {{"name", "type"}};
constexpr absl::string_view kSchedulerParamKeys[] = {
    "warmup_min_lr",   "warmup_max_lr",    "warmup_num_steps", "warmup_type",
    "total_num_steps", "warmup_min_ratio", "cos_min_ratio",    "last_batch_iteration"};
constexpr Alias kSchedulerParamAliases[] = {{"warmup_steps", "warmup_num_steps"},
                                            {"total_steps", "total_num_steps"}};

constexpr absl::string_view kFp16Keys[] = {
    "enabled",           "loss_scale", "initial_scale_power",
    "loss_scale_window", "hysteresis", "consecutive_hysteresis",
    "min_loss_scale"};
constexpr absl::string_view kBf16Keys[] = {"enabled"};

constexpr absl::string_view kModelKeys[] = {"preset",
                                            "vocab_size",
                                            "n_positions",
                                            "n_embd",
                                            "n_layer",
                                            "n_head",
                                            "activation_checkpointing"};
constexpr Alias kModelAliases[] = {
    {"name", "preset"},
    {"hidden", "n_embd"},
    {"hidden_size", "n_embd"},
    {"d_model", "n_embd"},
    {"num_layers", "n_layer"},
    {"num_hidden_layers", "n_layer"},
    {"num_heads", "n_head"},
    {"num_attention_heads", "n_head"},
    {"n_ctx", "n_positions"},
    {"max_seq_len", "n_positions"},
    {"max_position_embeddings", "n_positions"},
    {"seq_len", "n_positions"},
    {"gradient_checkpointing", "activation_checkpointing"},
};

constexpr absl::string_view kChunkKeys[] = {"size"};
constexpr Alias kChunkAliases[] = {
    {"size_elems", "size"}, {"chunk_size", "size"}, {"elements", "size"}};

constexpr absl::string_view kAcceleratorKeys[] = {"backend", "memory", "host_memory",
                                                  "copy_bandwidth", "device"};
constexpr Alias kAcceleratorAliases[] = {
    {"kind", "backend"},
    {"type", "backend"},
    {"memory_bytes", "memory"},
    {"capacity", "memory"},
    {"bandwidth", "copy_bandwidth"},
    {"device_index", "device"},
};

constexpr absl::string_view kDataKeys[] = {"train", "val",        "seq_len",     "shuffle",
                                           "seed",  "eval_every", "eval_batches"};
constexpr Alias kDataAliases[] = {
    {"train_path", "train"},   {"train_data", "train"}, {"val_path", "val"},
    {"val_data", "val"},       {"validation", "val"},   {"valid", "val"},
    {"seq_length", "seq_len"},
};

constexpr absl::string_view kCheckpointKeys[] = {"dir",    "every",     "keep_last",
                                                 "resume", "init_from", "export"};
constexpr Alias kCheckpointAliases[] = {
    {"save_dir", "dir"},   {"path", "dir"},           {"directory", "dir"},
    {"keep", "keep_last"}, {"export_path", "export"}, {"save_every", "every"},
};

constexpr absl::string_view kProfileKeys[] = {"trace", "metrics"};
constexpr Alias kProfileAliases[] = {{"trace_path", "trace"},
                                     {"trace_out", "trace"},
                                     {"metrics_path", "metrics"},
                                     {"metrics_out", "metrics"}};

constexpr Section kTopSection{"", kTopKeys, kTopAliases};
constexpr Section kOptimizerSection{"optimizer", kOptimizerKeys, kOptimizerAliases};
constexpr Section kOptimizerParamsSection{"optimizer.params", kOptimizerParamKeys,
                                          kOptimizerParamAliases};
constexpr Section kSchedulerSection{"scheduler", kSchedulerKeys, kSchedulerAliases};
constexpr Section kSchedulerParamsSection{"scheduler.params", kSchedulerParamKeys,
                                          kSchedulerParamAliases};
constexpr Section kFp16Section{"fp16", kFp16Keys, {}};
constexpr Section kBf16Section{"bf16", kBf16Keys, {}};
constexpr Section kModelSection{"model", kModelKeys, kModelAliases};
constexpr Section kChunkSection{"chunk", kChunkKeys, kChunkAliases};
constexpr Section kAcceleratorSection{"accelerator", kAcceleratorKeys, kAcceleratorAliases};
constexpr Section kDataSection{"data", kDataKeys, kDataAliases};
constexpr Section kCheckpointSection{"checkpoint", kCheckpointKeys, kCheckpointAliases};
constexpr Section kProfileSection{"profile", kProfileKeys, kProfileAliases};

// Top-level DeepSpeed keys accepted and ignored, with the reason given in the warning.
struct IgnoredKey {
  absl::string_view key;
  absl::string_view why;
};
constexpr IgnoredKey kIgnoredKeys[] = {
    {"zero_optimization",
     "chunks replace ZeRO stages; data-parallel ranks shard chunks ZeRO-style on their own"},
    {"zero_allow_untested_optimizer", "the optimizer is always HybridAdam"},
    {"wall_clock_breakdown", "use profile.trace for timings"},
    {"memory_breakdown", "use profile.trace and profile.metrics for memory"},
    {"prescale_gradients", "gradients are averaged after the reduction"},
    {"gradient_predivide_factor", "gradients are averaged after the reduction"},
    {"communication_data_type", "collectives use the chunks' dtype"},
    {"sparse_gradients", "the model has no sparse gradients"},
    {"tensorboard", "use profile.metrics (JSONL)"},
    {"wandb", "use profile.metrics (JSONL)"},
    {"csv_monitor", "use profile.metrics (JSONL)"},
    {"comms_logger", "use profile.trace"},
    {"flops_profiler", "use profile.trace and profile.metrics"},
    {"dump_state", "not applicable"},
    {"activation_checkpointing", "set model.activation_checkpointing instead"},
};

// Which scheduler params each type takes (last_batch_iteration: all).
bool SchedulerParamApplies(SchedulerType type, absl::string_view key) {
  if (key == "last_batch_iteration" || key == "warmup_num_steps" || key == "warmup_type") {
    return type != SchedulerType::kNone;
  }
  switch (type) {
    case SchedulerType::kNone:
      return false;
    case SchedulerType::kWarmupLR:
      return key == "warmup_min_lr" || key == "warmup_max_lr";
    case SchedulerType::kWarmupDecayLR:
      return key == "warmup_min_lr" || key == "warmup_max_lr" || key == "total_num_steps";
    case SchedulerType::kWarmupCosineLR:
      return key == "total_num_steps" || key == "warmup_min_ratio" || key == "cos_min_ratio";
  }
  return false;
}

std::vector<std::string> SchedulerParamsOf(SchedulerType type) {
  std::vector<std::string> keys;
  for (absl::string_view key : kSchedulerParamKeys) {
    if (SchedulerParamApplies(type, key)) keys.emplace_back(key);
  }
  return keys;
}

// --- Small helpers -------------------------------------------------------------------------

std::string JoinPath(absl::string_view path, absl::string_view key) {
  return path.empty() ? std::string(key) : absl::StrCat(path, ".", key);
}

// The shortest "%g" form that reads back as the same double.
std::string FormatDouble(double v) {
  for (int precision = 6; precision <= 17; ++precision) {
    std::string s = absl::StrFormat("%.*g", precision, v);
    if (std::strtod(s.c_str(), nullptr) == v) return s;
  }
  return absl::StrFormat("%.17g", v);
}

// A string value for a message: quoted, JSON-escaped, long ones cut.
std::string Quote(absl::string_view s) {
  constexpr size_t kMax = 60;
  std::string cut(s.substr(0, kMax));
  std::string quoted = Json(cut).dump(-1, ' ', false, Json::error_handler_t::replace);
  if (s.size() > kMax) quoted.insert(quoted.size() - 1, "...");
  return quoted;
}

// "integer 5", "number 2.5", "string \"x\"", "boolean true", "null", "array", "object".
std::string Describe(const Json& v) {
  if (v.is_null()) return "null";
  if (v.is_boolean()) return v.get<bool>() ? "boolean true" : "boolean false";
  if (v.is_number_unsigned()) return absl::StrCat("integer ", v.get<uint64_t>());
  if (v.is_number_integer()) return absl::StrCat("integer ", v.get<int64_t>());
  if (v.is_number_float()) return absl::StrCat("number ", FormatDouble(v.get<double>()));
  if (v.is_string()) return absl::StrCat("string ", Quote(v.get_ref<const std::string&>()));
  if (v.is_array()) return absl::StrCat("array of ", v.size(), " element(s)");
  if (v.is_object()) return "object";
  return "binary";
}

// Optimal string alignment distance (Damerau-Levenshtein with adjacent transpositions), ASCII
// case-insensitive.
int EditDistance(absl::string_view a_in, absl::string_view b_in) {
  const std::string a = absl::AsciiStrToLower(a_in);
  const std::string b = absl::AsciiStrToLower(b_in);
  const size_t n = a.size(), m = b.size();
  std::vector<std::vector<int>> d(n + 1, std::vector<int>(m + 1, 0));
  for (size_t i = 0; i <= n; ++i) d[i][0] = static_cast<int>(i);
  for (size_t j = 0; j <= m; ++j) d[0][j] = static_cast<int>(j);
  for (size_t i = 1; i <= n; ++i) {
    for (size_t j = 1; j <= m; ++j) {
      const int cost = a[i - 1] == b[j - 1] ? 0 : 1;
      d[i][j] = std::min({d[i - 1][j] + 1, d[i][j - 1] + 1, d[i - 1][j - 1] + cost});
      if (i > 1 && j > 1 && a[i - 1] == b[j - 2] && a[i - 2] == b[j - 1]) {
        d[i][j] = std::min(d[i][j], d[i - 2][j - 2] + 1);
      }
    }
  }
  return d[n][m];
}

// The valid key a misspelled `key` most likely meant, or "" if none is close.
std::string Suggest(absl::string_view key, const Section& section) {
  for (const Alias& alias : section.aliases) {
    if (absl::EqualsIgnoreCase(alias.wrong, key)) return std::string(alias.right);
  }
  // Keys longer than any valid one are not typos of it; cap the work.
  if (key.size() > 64) return "";
  const int max_distance = key.size() <= 4 ? 1 : key.size() <= 8 ? 2 : 3;
  int best = max_distance + 1;
  std::string best_key;
  for (absl::string_view valid : section.keys) {
    const int d = EditDistance(key, valid);
    if (d < best) {
      best = d;
      best_key = std::string(valid);
    }
  }
  return best_key;
}

absl::Status BadValue(absl::string_view key, absl::string_view value, absl::string_view rule) {
  return absl::InvalidArgumentError(absl::StrCat("`", key, "` = ", value, ": ", rule));
}
absl::Status BadValue(absl::string_view key, int64_t value, absl::string_view rule) {
  return BadValue(key, absl::StrCat(value), rule);
}
absl::Status BadDouble(absl::string_view key, double value, absl::string_view rule) {
  return BadValue(key, FormatDouble(value), rule);
}

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

absl::StatusOr<OptimizerType> ParseOptimizerType(absl::string_view name) {
  if (absl::EqualsIgnoreCase(name, "Adam")) return OptimizerType::kAdam;
  if (absl::EqualsIgnoreCase(name, "AdamW")) return OptimizerType::kAdamW;
  return absl::InvalidArgumentError("is not supported; use \"Adam\" or \"AdamW\"");
}

absl::StatusOr<SchedulerType> ParseSchedulerType(absl::string_view name) {
  for (SchedulerType t :
       {SchedulerType::kWarmupLR, SchedulerType::kWarmupDecayLR, SchedulerType::kWarmupCosineLR}) {
    if (absl::EqualsIgnoreCase(name, SchedulerTypeName(t))) return t;
  }
  return absl::InvalidArgumentError(
      "is not supported; use \"WarmupLR\", \"WarmupDecayLR\" or \"WarmupCosineLR\" (omit the "
      "scheduler section for a constant learning rate)");
}

absl::StatusOr<AcceleratorKind> ParseAcceleratorKind(absl::string_view name) {
  if (absl::EqualsIgnoreCase(name, "cpu")) return AcceleratorKind::kCpu;
  if (absl::EqualsIgnoreCase(name, "cuda")) return AcceleratorKind::kCuda;
  return absl::InvalidArgumentError(
      "is not a backend; use \"cpu\" (the emulated accelerator) or \"cuda\"");
}

// "12GB/s", "1.5 GiB/s", "100MB" (the "/s" is optional).
absl::StatusOr<double> ParseBandwidth(absl::string_view text) {
  absl::string_view s = absl::StripAsciiWhitespace(text);
  if (absl::EndsWithIgnoreCase(s, "/s")) s.remove_suffix(2);
  absl::StatusOr<int64_t> bytes = ParseBytes(s);
  if (!bytes.ok()) return bytes.status();
  return static_cast<double>(*bytes);
}

// --- Syntax pass: positions of syntax errors, duplicate keys, depth ---------------------------

// Runs nlohmann's SAX parser over the text before the DOM parse: the SAX interface reports the
// byte position of a syntax error without exceptions, and sees every key, so a key written twice
// (which the DOM would silently collapse to the last value) is caught.
class SyntaxChecker final : public nlohmann::json_sax<Json> {
 public:
  bool null() override { return Value(); }
  bool boolean(bool) override { return Value(); }
  bool number_integer(number_integer_t) override { return Value(); }
  bool number_unsigned(number_unsigned_t) override { return Value(); }
  bool number_float(number_float_t, const string_t&) override { return Value(); }
  bool string(string_t&) override { return Value(); }
  bool binary(binary_t&) override { return Value(); }
  bool start_object(std::size_t) override { return Open(/*is_object=*/true); }
  bool end_object() override { return Close(); }
  bool start_array(std::size_t) override { return Open(/*is_object=*/false); }
  bool end_array() override { return Close(); }
  bool key(string_t& key) override {
    Frame& f = frames_.back();
    if (std::find(f.keys.begin(), f.keys.end(), key) != f.keys.end()) {
      error_ = absl::StrCat("key `", JoinPath(Path(), key),
                            "` appears more than once in its object; keep one");
      return false;
    }
    f.keys.push_back(key);
    f.current = key;
    return true;
  }
  bool parse_error(std::size_t position, const std::string& /*last_token*/,
                   const nlohmann::detail::exception& ex) override {
    syntax_error_position_ = position;
    syntax_error_ = ex.what();
    return false;
  }

  // Set after a failed parse: either a structural error (duplicate key, depth) or a syntax one.
  const std::string& error() const { return error_; }
  std::optional<size_t> syntax_error_position() const { return syntax_error_position_; }
  const std::string& syntax_error() const { return syntax_error_; }

 private:
  struct Frame {
    bool is_object = true;
    std::vector<std::string> keys;
    std::string current;  // the key (objects) or "[index]" (arrays) of the value being read
    int64_t next_index = 0;
  };

  bool Value() {
    if (!frames_.empty() && !frames_.back().is_object) {
      frames_.back().current = absl::StrCat("[", frames_.back().next_index++, "]");
    }
    return true;
  }
  bool Open(bool is_object) {
    Value();
    if (static_cast<int>(frames_.size()) >= kMaxJsonDepth) {
      error_ = absl::StrCat("the JSON nests deeper than ", kMaxJsonDepth,
                            " levels (a config needs 3); this is not a config file");
      return false;
    }
    frames_.push_back(Frame{is_object, {}, "", 0});
    return true;
  }
  bool Close() {
    frames_.pop_back();
    return true;
  }
  // Path of the object being filled: the enclosing frames' current keys.
  std::string Path() const {
    std::string path;
    for (size_t i = 0; i + 1 < frames_.size(); ++i) {
      const std::string& part = frames_[i].current;
      if (!path.empty() && !absl::StartsWith(part, "[")) path += ".";
      path += part;
    }
    return path;
  }

  std::vector<Frame> frames_;
  std::string error_;
  std::optional<size_t> syntax_error_position_;
  std::string syntax_error_;
};

// "source:line:col: JSON syntax error: <what>; the line reads: <line>".
absl::Status SyntaxError(absl::string_view text, absl::string_view source, size_t position,
                         absl::string_view what) {
  // nlohmann's position counts the bytes read, the offending one included.
  const size_t offset = std::min(text.size(), position > 0 ? position - 1 : 0);
  const size_t line_start = text.rfind('\n', offset == 0 ? absl::string_view::npos : offset - 1);
  const size_t begin = (line_start == absl::string_view::npos || offset == 0) ? 0 : line_start + 1;
  int64_t line = 1;
  for (size_t i = 0; i < begin; ++i) line += text[i] == '\n';
  int64_t column = 1;  // in characters: UTF-8 continuation bytes do not count
  for (size_t i = begin; i < offset; ++i) {
    column += (static_cast<unsigned char>(text[i]) & 0xC0) != 0x80;
  }
  size_t end = text.find('\n', begin);
  if (end == absl::string_view::npos) end = text.size();
  absl::string_view line_text = text.substr(begin, std::min<size_t>(end - begin, 100));
  // Drop nlohmann's "[json.exception.parse_error.101] parse error at line 2, column 8: ".
  std::string message(what);
  if (const size_t bracket = message.find("] "); bracket != std::string::npos) {
    message = message.substr(bracket + 2);
  }
  if (absl::StartsWith(message, "parse error")) {
    if (const size_t colon = message.find(": "); colon != std::string::npos) {
      message = message.substr(colon + 2);
    }
  }
  return absl::InvalidArgumentError(
      absl::StrCat(source, ":", line, ":", column, ": JSON syntax error: ", message,
                   "; the line reads: ", Quote(std::string(line_text))));
}

// --- The reader -----------------------------------------------------------------------------

// Reads typed values out of a parsed JSON object; every error names the source and the key path.
class Reader {
 public:
  Reader(absl::string_view source, std::vector<std::string>* ignored)
      : source_(source), ignored_(ignored) {}

  absl::Status Error(absl::string_view message) const {
    return absl::InvalidArgumentError(absl::StrCat(source_, ": ", message));
  }
  absl::Status TypeError(absl::string_view path, absl::string_view expected,
                         const Json& found) const {
    return Error(absl::StrCat("`", path, "` must be ", expected, ", found ", Describe(found)));
  }
  absl::Status ValueError(absl::string_view path, const Json& value, absl::string_view rule) const {
    return Error(absl::StrCat("`", path, "` = ", Describe(value), ": ", rule));
  }

  // Every key of `obj` must be one of the section's (or, at the top level, an ignored DeepSpeed
  // key, which is reported and skipped).
  absl::Status CheckKeys(const Json& obj, const Section& section) const {
    for (auto it = obj.begin(); it != obj.end(); ++it) {
      const std::string& key = it.key();
      if (std::find(section.keys.begin(), section.keys.end(), key) != section.keys.end()) {
        continue;
      }
      if (section.path.empty()) {
        const auto ignored = std::find_if(std::begin(kIgnoredKeys), std::end(kIgnoredKeys),
                                          [&key](const IgnoredKey& k) { return k.key == key; });
        if (ignored != std::end(kIgnoredKeys)) {
          LOG(WARNING) << source_ << ": ignoring DeepSpeed key `" << key << "`: " << ignored->why;
          if (ignored_ != nullptr) ignored_->push_back(key);
          continue;
        }
      }
      std::string message =
          absl::StrCat("unknown key `", JoinPath(section.path, Truncate(key)), "`");
      const std::string suggestion = Suggest(key, section);
      if (!suggestion.empty()) absl::StrAppend(&message, "; did you mean `", suggestion, "`?");
      absl::StrAppend(&message, " (valid keys ",
                      section.path.empty() ? std::string("at the top level")
                                           : absl::StrCat("in `", section.path, "`"),
                      ": ", absl::StrJoin(section.keys, ", "), ")");
      return Error(message);
    }
    return absl::OkStatus();
  }

  // The member `key` of `obj`, or null when absent.
  static const Json* Find(const Json& obj, absl::string_view key) {
    auto it = obj.find(std::string(key));
    return it == obj.end() ? nullptr : &*it;
  }

  // A section: null when absent; InvalidArgument unless an object with valid keys.
  absl::StatusOr<const Json*> GetSection(const Json& parent, const Section& section,
                                         absl::string_view key) const {
    const Json* v = Find(parent, key);
    if (v == nullptr) return nullptr;
    if (!v->is_object()) return TypeError(section.path, "an object", *v);
    RETURN_IF_ERROR(CheckKeys(*v, section));
    return v;
  }

  absl::Status GetBool(const Json& obj, absl::string_view path, absl::string_view key,
                       bool* out) const {
    const Json* v = Find(obj, key);
    if (v == nullptr) return absl::OkStatus();
    if (!v->is_boolean()) return TypeError(JoinPath(path, key), "a boolean (true or false)", *v);
    *out = v->get<bool>();
    return absl::OkStatus();
  }

  absl::Status GetString(const Json& obj, absl::string_view path, absl::string_view key,
                         std::string* out) const {
    const Json* v = Find(obj, key);
    if (v == nullptr) return absl::OkStatus();
    if (!v->is_string()) return TypeError(JoinPath(path, key), "a string", *v);
    *out = v->get<std::string>();
    return absl::OkStatus();
  }

  absl::Status GetDouble(const Json& obj, absl::string_view path, absl::string_view key,
                         double* out) const {
    const Json* v = Find(obj, key);
    if (v == nullptr) return absl::OkStatus();
    if (!v->is_number()) return TypeError(JoinPath(path, key), "a number", *v);
    *out = v->get<double>();
    return absl::OkStatus();
  }

  // Integers; a float is accepted when it is a whole number (1e3), as JSON does not tell them
  // apart.
  absl::StatusOr<int64_t> ToInt64(const Json& v, absl::string_view path, int64_t lo,
                                  int64_t hi) const {
    std::optional<int64_t> value;
    if (v.is_number_unsigned()) {
      if (v.get<uint64_t>() <= static_cast<uint64_t>(std::numeric_limits<int64_t>::max())) {
        value = static_cast<int64_t>(v.get<uint64_t>());
      }
    } else if (v.is_number_integer()) {
      value = v.get<int64_t>();
    } else if (v.is_number_float()) {
      const double d = v.get<double>();
      if (d != std::floor(d)) return TypeError(path, "an integer", v);
      if (d >= -9.2e18 && d <= 9.2e18) value = static_cast<int64_t>(d);
    } else {
      return TypeError(path, "an integer", v);
    }
    if (!value.has_value() || *value < lo || *value > hi) {
      return ValueError(path, v, absl::StrCat("out of range; must be in [", lo, ", ", hi, "]"));
    }
    return *value;
  }

  template <typename Int>
  absl::Status GetInt(const Json& obj, absl::string_view path, absl::string_view key,
                      Int* out) const {
    const Json* v = Find(obj, key);
    if (v == nullptr) return absl::OkStatus();
    ASSIGN_OR_RETURN(const int64_t value,
                     ToInt64(*v, JoinPath(path, key), std::numeric_limits<Int>::min(),
                             std::numeric_limits<Int>::max()));
    *out = static_cast<Int>(value);
    return absl::OkStatus();
  }

  absl::Status GetUint64(const Json& obj, absl::string_view path, absl::string_view key,
                         uint64_t* out) const {
    const Json* v = Find(obj, key);
    if (v == nullptr) return absl::OkStatus();
    const std::string full = JoinPath(path, key);
    if (v->is_number_unsigned()) {
      *out = v->get<uint64_t>();
    } else if (v->is_number_integer()) {  // signed: negative
      return ValueError(full, *v, "must be >= 0 (an unsigned 64-bit integer)");
    } else if (v->is_number_float()) {
      const double d = v->get<double>();
      if (d != std::floor(d)) return TypeError(full, "an unsigned integer", *v);
      if (d < 0 || d >= 18446744073709551616.0) {
        return ValueError(full, *v, "out of range; must be in [0, 2^64)");
      }
      *out = static_cast<uint64_t>(d);
    } else {
      return TypeError(full, "an unsigned integer", *v);
    }
    return absl::OkStatus();
  }

  // "64MiB" (base/units.h ParseBytes) or a whole number of bytes >= 0.
  absl::Status GetBytes(const Json& obj, absl::string_view path, absl::string_view key,
                        int64_t* out) const {
    const Json* v = Find(obj, key);
    if (v == nullptr) return absl::OkStatus();
    const std::string full = JoinPath(path, key);
    if (v->is_string()) {
      absl::StatusOr<int64_t> bytes = ParseBytes(v->get_ref<const std::string&>());
      if (!bytes.ok()) {
        return ValueError(full, *v,
                          absl::StrCat(bytes.status().message(),
                                       "; write e.g. \"64MiB\", \"1.5GB\" or an integer"));
      }
      *out = *bytes;
      return absl::OkStatus();
    }
    if (!v->is_number()) {
      return TypeError(full, "a byte quantity (a string like \"64MiB\" or an integer)", *v);
    }
    ASSIGN_OR_RETURN(*out, ToInt64(*v, full, 0, std::numeric_limits<int64_t>::max()));
    return absl::OkStatus();
  }

 private:
  static std::string Truncate(absl::string_view key) {
    return key.size() > 80 ? absl::StrCat(key.substr(0, 80), "...") : std::string(key);
  }

  std::string source_;
  std::vector<std::string>* ignored_;
};

// --- Sections ---------------------------------------------------------------------------------

absl::Status ReadOptimizer(const Reader& r, const Json& top, TrainConfig* c) {
  ASSIGN_OR_RETURN(const Json* opt, r.GetSection(top, kOptimizerSection, "optimizer"));
  if (opt == nullptr) return absl::OkStatus();
  const Json* type = Reader::Find(*opt, "type");
  if (type == nullptr) {
    return r.Error(
        "`optimizer.type` is required when an optimizer section is given: \"Adam\" or "
        "\"AdamW\"");
  }
  if (!type->is_string()) return r.TypeError("optimizer.type", "a string", *type);
  absl::StatusOr<OptimizerType> parsed = ParseOptimizerType(type->get_ref<const std::string&>());
  if (!parsed.ok()) return r.ValueError("optimizer.type", *type, parsed.status().message());
  c->optimizer.type = *parsed;

  ASSIGN_OR_RETURN(const Json* params, r.GetSection(*opt, kOptimizerParamsSection, "params"));
  if (params == nullptr) return absl::OkStatus();
  constexpr absl::string_view p = "optimizer.params";
  RETURN_IF_ERROR(r.GetDouble(*params, p, "lr", &c->optimizer.lr));
  RETURN_IF_ERROR(r.GetDouble(*params, p, "eps", &c->optimizer.eps));
  RETURN_IF_ERROR(r.GetDouble(*params, p, "weight_decay", &c->optimizer.weight_decay));
  if (const Json* betas = Reader::Find(*params, "betas"); betas != nullptr) {
    if (!betas->is_array() || betas->size() != 2 || !(*betas)[0].is_number() ||
        !(*betas)[1].is_number()) {
      return r.TypeError("optimizer.params.betas", "an array of two numbers [beta1, beta2]",
                         *betas);
    }
    c->optimizer.beta1 = (*betas)[0].get<double>();
    c->optimizer.beta2 = (*betas)[1].get<double>();
  }
  if (const Json* mode = Reader::Find(*params, "adam_w_mode"); mode != nullptr) {
    bool adam_w_mode = false;
    RETURN_IF_ERROR(r.GetBool(*params, p, "adam_w_mode", &adam_w_mode));
    if (c->optimizer.type == OptimizerType::kAdamW && !adam_w_mode) {
      return r.ValueError("optimizer.params.adam_w_mode", *mode,
                          "contradicts optimizer.type \"AdamW\"; use type \"Adam\" for L2 weight "
                          "decay");
    }
    if (adam_w_mode) c->optimizer.type = OptimizerType::kAdamW;
  }
  if (const Json* amsgrad = Reader::Find(*params, "amsgrad"); amsgrad != nullptr) {
    bool value = false;
    RETURN_IF_ERROR(r.GetBool(*params, p, "amsgrad", &value));
    if (value)
      return r.ValueError("optimizer.params.amsgrad", *amsgrad, "not supported; use false");
  }
  if (const Json* bc = Reader::Find(*params, "bias_correction"); bc != nullptr) {
    bool value = true;
    RETURN_IF_ERROR(r.GetBool(*params, p, "bias_correction", &value));
    if (!value) {
      return r.ValueError("optimizer.params.bias_correction", *bc,
                          "not supported; bias correction is always applied (use true)");
    }
  }
  return absl::OkStatus();
}

absl::Status ReadScheduler(const Reader& r, const Json& top, TrainConfig* c) {
  ASSIGN_OR_RETURN(const Json* sched, r.GetSection(top, kSchedulerSection, "scheduler"));
  if (sched == nullptr) return absl::OkStatus();
  const Json* type = Reader::Find(*sched, "type");
  if (type == nullptr) {
    return r.Error(
        "`scheduler.type` is required when a scheduler section is given: \"WarmupLR\", "
        "\"WarmupDecayLR\" or \"WarmupCosineLR\" (omit the section for a constant learning rate)");
  }
  if (!type->is_string()) return r.TypeError("scheduler.type", "a string", *type);
  absl::StatusOr<SchedulerType> parsed = ParseSchedulerType(type->get_ref<const std::string&>());
  if (!parsed.ok()) return r.ValueError("scheduler.type", *type, parsed.status().message());
  SchedulerConfig& s = c->scheduler;
  s.type = *parsed;

  ASSIGN_OR_RETURN(const Json* params, r.GetSection(*sched, kSchedulerParamsSection, "params"));
  if (params == nullptr) return absl::OkStatus();
  for (auto it = params->begin(); it != params->end(); ++it) {
    if (!SchedulerParamApplies(s.type, it.key())) {
      return r.Error(
          absl::StrCat("`scheduler.params.", it.key(), "` does not apply to scheduler type ",
                       SchedulerTypeName(s.type),
                       ", which takes: ", absl::StrJoin(SchedulerParamsOf(s.type), ", ")));
    }
  }
  constexpr absl::string_view p = "scheduler.params";
  RETURN_IF_ERROR(r.GetDouble(*params, p, "warmup_min_lr", &s.warmup_min_lr));
  if (const Json* v = Reader::Find(*params, "warmup_max_lr"); v != nullptr) {
    RETURN_IF_ERROR(r.GetDouble(*params, p, "warmup_max_lr", &s.warmup_max_lr));
    if (!(s.warmup_max_lr >= 0)) {
      return r.ValueError("scheduler.params.warmup_max_lr", *v,
                          "must be >= 0 (omit it to use optimizer.params.lr)");
    }
  }
  RETURN_IF_ERROR(r.GetInt(*params, p, "warmup_num_steps", &s.warmup_num_steps));
  if (const Json* v = Reader::Find(*params, "warmup_type"); v != nullptr) {
    RETURN_IF_ERROR(r.GetString(*params, p, "warmup_type", &s.warmup_type));
    s.warmup_type = absl::AsciiStrToLower(s.warmup_type);
    if (s.warmup_type != "log" && s.warmup_type != "linear") {
      return r.ValueError("scheduler.params.warmup_type", *v, "use \"log\" or \"linear\"");
    }
  }
  RETURN_IF_ERROR(r.GetInt(*params, p, "total_num_steps", &s.total_num_steps));
  RETURN_IF_ERROR(r.GetDouble(*params, p, "warmup_min_ratio", &s.warmup_min_ratio));
  RETURN_IF_ERROR(r.GetDouble(*params, p, "cos_min_ratio", &s.cos_min_ratio));
  if (const Json* v = Reader::Find(*params, "last_batch_iteration"); v != nullptr) {
    int64_t last = -1;
    RETURN_IF_ERROR(r.GetInt(*params, p, "last_batch_iteration", &last));
    if (last != -1) {
      return r.ValueError("scheduler.params.last_batch_iteration", *v,
                          "only -1 (a fresh start) is accepted; to continue a run, resume from "
                          "its checkpoint (checkpoint.resume), which restores the schedule");
    }
  }
  return absl::OkStatus();
}

absl::Status ReadPrecision(const Reader& r, const Json& top, TrainConfig* c) {
  ASSIGN_OR_RETURN(const Json* fp16, r.GetSection(top, kFp16Section, "fp16"));
  if (fp16 != nullptr) {
    Fp16Config& f = c->fp16;
    RETURN_IF_ERROR(r.GetBool(*fp16, "fp16", "enabled", &f.enabled));
    RETURN_IF_ERROR(r.GetDouble(*fp16, "fp16", "loss_scale", &f.loss_scale));
    RETURN_IF_ERROR(r.GetInt(*fp16, "fp16", "initial_scale_power", &f.initial_scale_power));
    RETURN_IF_ERROR(r.GetInt(*fp16, "fp16", "loss_scale_window", &f.loss_scale_window));
    RETURN_IF_ERROR(r.GetInt(*fp16, "fp16", "hysteresis", &f.hysteresis));
    RETURN_IF_ERROR(r.GetBool(*fp16, "fp16", "consecutive_hysteresis", &f.consecutive_hysteresis));
    RETURN_IF_ERROR(r.GetDouble(*fp16, "fp16", "min_loss_scale", &f.min_loss_scale));
  }
  ASSIGN_OR_RETURN(const Json* bf16, r.GetSection(top, kBf16Section, "bf16"));
  if (bf16 != nullptr) RETURN_IF_ERROR(r.GetBool(*bf16, "bf16", "enabled", &c->bf16));
  return absl::OkStatus();
}

absl::Status ReadModel(const Reader& r, const Json& top, TrainConfig* c) {
  ASSIGN_OR_RETURN(const Json* model, r.GetSection(top, kModelSection, "model"));
  if (model == nullptr) return absl::OkStatus();
  ModelConfig& m = c->model;
  RETURN_IF_ERROR(r.GetString(*model, "model", "preset", &m.preset));
  RETURN_IF_ERROR(r.GetInt(*model, "model", "vocab_size", &m.vocab_size));
  RETURN_IF_ERROR(r.GetInt(*model, "model", "n_positions", &m.max_seq_len));
  RETURN_IF_ERROR(r.GetInt(*model, "model", "n_embd", &m.hidden));
  RETURN_IF_ERROR(r.GetInt(*model, "model", "n_layer", &m.num_layers));
  RETURN_IF_ERROR(r.GetInt(*model, "model", "n_head", &m.num_heads));
  RETURN_IF_ERROR(
      r.GetBool(*model, "model", "activation_checkpointing", &m.activation_checkpointing));
  return absl::OkStatus();
}

absl::Status ReadChunk(const Reader& r, const Json& top, TrainConfig* c) {
  ASSIGN_OR_RETURN(const Json* chunk, r.GetSection(top, kChunkSection, "chunk"));
  if (chunk == nullptr) return absl::OkStatus();
  const Json* size = Reader::Find(*chunk, "size");
  if (size == nullptr) return absl::OkStatus();
  if (size->is_string()) {
    if (!absl::EqualsIgnoreCase(size->get_ref<const std::string&>(), "auto")) {
      return r.ValueError("chunk.size", *size,
                          "use \"auto\" (chunk-size search) or an integer number of elements "
                          "(not bytes)");
    }
    c->chunk.size_elems = 0;
    return absl::OkStatus();
  }
  if (!size->is_number()) {
    return r.TypeError("chunk.size", "an integer number of elements or \"auto\"", *size);
  }
  ASSIGN_OR_RETURN(c->chunk.size_elems, r.ToInt64(*size, "chunk.size", 1, kMaxChunkElems));
  return absl::OkStatus();
}

absl::Status ReadAccelerator(const Reader& r, const Json& top, TrainConfig* c) {
  ASSIGN_OR_RETURN(const Json* acc, r.GetSection(top, kAcceleratorSection, "accelerator"));
  if (acc == nullptr) return absl::OkStatus();
  AcceleratorConfig& a = c->accelerator;
  if (const Json* backend = Reader::Find(*acc, "backend"); backend != nullptr) {
    if (!backend->is_string()) return r.TypeError("accelerator.backend", "a string", *backend);
    absl::StatusOr<AcceleratorKind> kind =
        ParseAcceleratorKind(backend->get_ref<const std::string&>());
    if (!kind.ok()) return r.ValueError("accelerator.backend", *backend, kind.status().message());
    a.kind = *kind;
  }
  RETURN_IF_ERROR(r.GetBytes(*acc, "accelerator", "memory", &a.memory_bytes));
  RETURN_IF_ERROR(r.GetBytes(*acc, "accelerator", "host_memory", &a.host_memory_bytes));
  if (const Json* bw = Reader::Find(*acc, "copy_bandwidth"); bw != nullptr) {
    if (bw->is_string()) {
      absl::StatusOr<double> parsed = ParseBandwidth(bw->get_ref<const std::string&>());
      if (!parsed.ok()) {
        return r.ValueError("accelerator.copy_bandwidth", *bw,
                            absl::StrCat(parsed.status().message(),
                                         "; write e.g. \"12GB/s\" or a number of bytes per "
                                         "second (0: unthrottled)"));
      }
      a.copy_bandwidth_bytes_per_s = *parsed;
    } else if (bw->is_number()) {
      a.copy_bandwidth_bytes_per_s = bw->get<double>();
    } else {
      return r.TypeError("accelerator.copy_bandwidth",
                         "a bandwidth (a string like \"12GB/s\" or a number of bytes per second)",
                         *bw);
    }
  }
  RETURN_IF_ERROR(r.GetInt(*acc, "accelerator", "device", &a.device_index));
  return absl::OkStatus();
}

absl::Status ReadData(const Reader& r, const Json& top, TrainConfig* c) {
  ASSIGN_OR_RETURN(const Json* data, r.GetSection(top, kDataSection, "data"));
  if (data == nullptr) return absl::OkStatus();
  DataConfig& d = c->data;
  RETURN_IF_ERROR(r.GetString(*data, "data", "train", &d.train_path));
  RETURN_IF_ERROR(r.GetString(*data, "data", "val", &d.val_path));
  RETURN_IF_ERROR(r.GetInt(*data, "data", "seq_len", &d.seq_len));
  RETURN_IF_ERROR(r.GetBool(*data, "data", "shuffle", &d.shuffle));
  RETURN_IF_ERROR(r.GetUint64(*data, "data", "seed", &d.seed));
  RETURN_IF_ERROR(r.GetInt(*data, "data", "eval_every", &d.eval_every));
  RETURN_IF_ERROR(r.GetInt(*data, "data", "eval_batches", &d.eval_batches));
  return absl::OkStatus();
}

absl::Status ReadCheckpoint(const Reader& r, const Json& top, TrainConfig* c) {
  ASSIGN_OR_RETURN(const Json* ckpt, r.GetSection(top, kCheckpointSection, "checkpoint"));
  if (ckpt == nullptr) return absl::OkStatus();
  CheckpointConfig& k = c->checkpoint;
  RETURN_IF_ERROR(r.GetString(*ckpt, "checkpoint", "dir", &k.dir));
  RETURN_IF_ERROR(r.GetInt(*ckpt, "checkpoint", "every", &k.every));
  RETURN_IF_ERROR(r.GetInt(*ckpt, "checkpoint", "keep_last", &k.keep_last));
  RETURN_IF_ERROR(r.GetBool(*ckpt, "checkpoint", "resume", &k.resume));
  RETURN_IF_ERROR(r.GetString(*ckpt, "checkpoint", "init_from", &k.init_from));
  RETURN_IF_ERROR(r.GetString(*ckpt, "checkpoint", "export", &k.export_path));
  return absl::OkStatus();
}

absl::Status ReadProfile(const Reader& r, const Json& top, TrainConfig* c) {
  ASSIGN_OR_RETURN(const Json* prof, r.GetSection(top, kProfileSection, "profile"));
  if (prof == nullptr) return absl::OkStatus();
  RETURN_IF_ERROR(r.GetString(*prof, "profile", "trace", &c->profile.trace_path));
  RETURN_IF_ERROR(r.GetString(*prof, "profile", "metrics", &c->profile.metrics_path));
  return absl::OkStatus();
}

absl::StatusOr<TrainConfig> ParseTrainConfigImpl(absl::string_view text, absl::string_view source,
                                                 std::vector<std::string>* ignored_keys) {
  {
    SyntaxChecker checker;
    if (!Json::sax_parse(text.begin(), text.end(), &checker)) {
      if (!checker.error().empty()) {
        return absl::InvalidArgumentError(absl::StrCat(source, ": ", checker.error()));
      }
      return SyntaxError(text, source, checker.syntax_error_position().value_or(0),
                         checker.syntax_error());
    }
  }
  const Json top = Json::parse(text.begin(), text.end(), nullptr, /*allow_exceptions=*/false);
  if (top.is_discarded()) {
    // The SAX pass accepted the same text; this cannot happen.
    return absl::InternalError(absl::StrCat(source, ": the JSON parser rejected the text"));
  }
  const Reader r(source, ignored_keys);
  if (!top.is_object()) {
    return r.Error(absl::StrCat("a config is a JSON object ({...}), found ", Describe(top)));
  }
  RETURN_IF_ERROR(r.CheckKeys(top, kTopSection));

  TrainConfig c;
  RETURN_IF_ERROR(r.GetInt(top, "", "train_batch_size", &c.train_batch_size));
  RETURN_IF_ERROR(
      r.GetInt(top, "", "train_micro_batch_size_per_gpu", &c.train_micro_batch_size_per_gpu));
  RETURN_IF_ERROR(r.GetInt(top, "", "gradient_accumulation_steps", &c.gradient_accumulation_steps));
  RETURN_IF_ERROR(r.GetInt(top, "", "train_steps", &c.steps));
  RETURN_IF_ERROR(r.GetUint64(top, "", "seed", &c.seed));
  RETURN_IF_ERROR(r.GetInt(top, "", "threads", &c.threads));
  RETURN_IF_ERROR(r.GetInt(top, "", "steps_per_print", &c.steps_per_print));
  RETURN_IF_ERROR(r.GetDouble(top, "", "gradient_clipping", &c.gradient_clipping));
  RETURN_IF_ERROR(ReadOptimizer(r, top, &c));
  RETURN_IF_ERROR(ReadScheduler(r, top, &c));
  RETURN_IF_ERROR(ReadPrecision(r, top, &c));
  RETURN_IF_ERROR(ReadModel(r, top, &c));
  RETURN_IF_ERROR(ReadChunk(r, top, &c));
  RETURN_IF_ERROR(ReadAccelerator(r, top, &c));
  RETURN_IF_ERROR(ReadData(r, top, &c));
  RETURN_IF_ERROR(ReadCheckpoint(r, top, &c));
  RETURN_IF_ERROR(ReadProfile(r, top, &c));
  return c;
}

// --- Per-key value checks (shared by parsing and validation) -----------------------------------

absl::Status CheckString(absl::string_view key, const std::string& value) {
  if (!IsValidUtf8(value)) {
    return BadValue(key, Quote(value), "is not valid UTF-8 (the config is stored as JSON)");
  }
  if (value.find('\0') != std::string::npos) {
    return BadValue(key, Quote(value), "contains a NUL character");
  }
  return absl::OkStatus();
}

absl::Status CheckFieldValues(const TrainConfig& c) {
  // Batch and steps.
  if (c.train_batch_size < 0) {
    return BadValue("train_batch_size", c.train_batch_size,
                    "must be >= 1 (or omitted: micro batch x accumulation x world size)");
  }
  if (c.train_micro_batch_size_per_gpu < 1) {
    return BadValue("train_micro_batch_size_per_gpu", c.train_micro_batch_size_per_gpu,
                    "must be >= 1");
  }
  if (c.gradient_accumulation_steps < 1) {
    return BadValue("gradient_accumulation_steps", c.gradient_accumulation_steps,
                    "must be >= 1 (and only 1 is supported yet)");
  }
  if (c.gradient_accumulation_steps > 1) {
    return BadValue("gradient_accumulation_steps", c.gradient_accumulation_steps,
                    "gradient accumulation is not supported yet; use 1 and raise "
                    "train_micro_batch_size_per_gpu instead");
  }
  if (c.steps < 0) {
    return BadValue("train_steps", c.steps, "must be > 0 (or 0 in a file, set with --steps)");
  }
  if (c.threads < 0 || c.threads > kMaxThreads) {
    return BadValue("threads", c.threads,
                    absl::StrCat("must be in [0, ", kMaxThreads, "]; 0 uses every core"));
  }
  if (c.steps_per_print < 1) {
    return BadValue("steps_per_print", c.steps_per_print, "must be >= 1");
  }
  if (!(c.gradient_clipping >= 0) || !std::isfinite(c.gradient_clipping)) {
    return BadDouble("gradient_clipping", c.gradient_clipping,
                     "must be finite and >= 0 (the global L2 norm to clip to; 0 = off)");
  }

  // Optimizer.
  const OptimizerConfig& o = c.optimizer;
  if (!(o.lr >= 0) || !std::isfinite(o.lr)) {
    return BadDouble("optimizer.params.lr", o.lr, "the learning rate must be finite and >= 0");
  }
  if (!(o.beta1 >= 0 && o.beta1 < 1)) {
    return BadDouble("optimizer.params.betas[0]", o.beta1, "must be in [0, 1), e.g. 0.9");
  }
  if (!(o.beta2 >= 0 && o.beta2 < 1)) {
    return BadDouble("optimizer.params.betas[1]", o.beta2, "must be in [0, 1), e.g. 0.999");
  }
  if (!(o.eps > 0) || !std::isfinite(o.eps)) {
    return BadDouble("optimizer.params.eps", o.eps, "must be finite and > 0, e.g. 1e-8");
  }
  if (!(o.weight_decay >= 0) || !std::isfinite(o.weight_decay)) {
    return BadDouble("optimizer.params.weight_decay", o.weight_decay, "must be finite and >= 0");
  }

  // Scheduler.
  const SchedulerConfig& s = c.scheduler;
  if (!(s.warmup_min_lr >= 0) || !std::isfinite(s.warmup_min_lr)) {
    return BadDouble("scheduler.params.warmup_min_lr", s.warmup_min_lr, "must be finite and >= 0");
  }
  if (!(s.warmup_max_lr == -1 || (s.warmup_max_lr >= 0 && std::isfinite(s.warmup_max_lr)))) {
    return BadDouble("scheduler.params.warmup_max_lr", s.warmup_max_lr,
                     "must be finite and >= 0 (or omitted: optimizer.params.lr)");
  }
  if (s.warmup_num_steps < 0) {
    return BadValue("scheduler.params.warmup_num_steps", s.warmup_num_steps, "must be >= 0");
  }
  if (s.warmup_type != "log" && s.warmup_type != "linear") {
    return BadValue("scheduler.params.warmup_type", Quote(s.warmup_type),
                    "use \"log\" or \"linear\"");
  }
  if (s.total_num_steps < 0) {
    return BadValue("scheduler.params.total_num_steps", s.total_num_steps,
                    "must be >= 0 (0: train_steps)");
  }
  if (!(s.warmup_min_ratio >= 0 && s.warmup_min_ratio <= 1)) {
    return BadDouble("scheduler.params.warmup_min_ratio", s.warmup_min_ratio, "must be in [0, 1]");
  }
  if (!(s.cos_min_ratio >= 0 && s.cos_min_ratio <= 1)) {
    return BadDouble("scheduler.params.cos_min_ratio", s.cos_min_ratio, "must be in [0, 1]");
  }

  // fp16.
  const Fp16Config& f = c.fp16;
  if (!(f.loss_scale >= 0 && f.loss_scale <= kMaxLossScale)) {
    return BadDouble("fp16.loss_scale", f.loss_scale,
                     "must be in [0, 2^100]; 0 selects dynamic loss scaling");
  }
  if (f.initial_scale_power < 0 || f.initial_scale_power > 100) {
    return BadValue("fp16.initial_scale_power", f.initial_scale_power,
                    "must be in [0, 100] (the initial scale is 2^power)");
  }
  if (f.loss_scale_window < 1) {
    return BadValue("fp16.loss_scale_window", f.loss_scale_window, "must be >= 1 clean steps");
  }
  if (f.hysteresis < 1) return BadValue("fp16.hysteresis", f.hysteresis, "must be >= 1");
  if (!(f.min_loss_scale > 0 && f.min_loss_scale <= kMaxLossScale)) {
    return BadDouble("fp16.min_loss_scale", f.min_loss_scale, "must be in (0, 2^100]");
  }

  // Model.
  const ModelConfig& m = c.model;
  RETURN_IF_ERROR(CheckString("model.preset", m.preset));
  if (!m.preset.empty()) {
    const std::vector<std::string> names = GptPresetNames();
    if (std::find(names.begin(), names.end(), m.preset) == names.end()) {
      return BadValue("model.preset", Quote(m.preset),
                      absl::StrCat("unknown preset; valid presets: ", absl::StrJoin(names, ", "),
                                   " (or omit it and give every dimension)"));
    }
  }
  for (const auto& [key, value] :
       {std::pair<absl::string_view, int64_t>{"model.vocab_size", m.vocab_size},
        {"model.n_positions", m.max_seq_len},
        {"model.n_embd", m.hidden},
        {"model.n_layer", m.num_layers},
        {"model.n_head", m.num_heads}}) {
    if (value < 0 || value > kMaxModelDim) {
      return BadValue(key, value,
                      absl::StrCat("must be in [1, ", kMaxModelDim, "] (or 0: the preset's)"));
    }
  }

  // Chunk.
  if (c.chunk.size_elems < 0 || c.chunk.size_elems > kMaxChunkElems) {
    return BadValue("chunk.size", c.chunk.size_elems,
                    absl::StrCat("must be in [1, ", kMaxChunkElems, "] elements, or \"auto\" (0)"));
  }

  // Accelerator.
  const AcceleratorConfig& a = c.accelerator;
  if (a.memory_bytes < 0) {
    return BadValue("accelerator.memory", a.memory_bytes, "must be >= 0 bytes (0: default)");
  }
  if (a.host_memory_bytes < 0) {
    return BadValue("accelerator.host_memory", a.host_memory_bytes,
                    "must be >= 0 bytes (0: unlimited)");
  }
  if (!(a.copy_bandwidth_bytes_per_s >= 0) || !std::isfinite(a.copy_bandwidth_bytes_per_s)) {
    return BadDouble("accelerator.copy_bandwidth", a.copy_bandwidth_bytes_per_s,
                     "must be finite and >= 0 bytes/s (0: unthrottled)");
  }
  if (a.device_index < 0 || a.device_index > kMaxDeviceIndex) {
    return BadValue("accelerator.device", a.device_index,
                    absl::StrCat("must be in [0, ", kMaxDeviceIndex, "]"));
  }

  // Data.
  const DataConfig& d = c.data;
  RETURN_IF_ERROR(CheckString("data.train", d.train_path));
  RETURN_IF_ERROR(CheckString("data.val", d.val_path));
  if (d.seq_len < 0) {
    return BadValue("data.seq_len", d.seq_len, "must be >= 0 (0: the model's n_positions)");
  }
  if (d.eval_every < 0) {
    return BadValue("data.eval_every", d.eval_every,
                    "must be >= 0 steps (0: only at the end when there is a validation set)");
  }
  if (d.eval_batches < 1) return BadValue("data.eval_batches", d.eval_batches, "must be >= 1");

  // Checkpoint and profile.
  const CheckpointConfig& k = c.checkpoint;
  RETURN_IF_ERROR(CheckString("checkpoint.dir", k.dir));
  RETURN_IF_ERROR(CheckString("checkpoint.init_from", k.init_from));
  RETURN_IF_ERROR(CheckString("checkpoint.export", k.export_path));
  if (k.every < 0) {
    return BadValue("checkpoint.every", k.every, "must be >= 0 steps (0: only at the end)");
  }
  if (k.keep_last < 1) {
    return BadValue("checkpoint.keep_last", k.keep_last, "must be >= 1 checkpoints");
  }
  RETURN_IF_ERROR(CheckString("profile.trace", c.profile.trace_path));
  RETURN_IF_ERROR(CheckString("profile.metrics", c.profile.metrics_path));
  return absl::OkStatus();
}

}  // namespace

// --- Public API ---------------------------------------------------------------------------------

PrecisionMode TrainConfig::precision() const {
  if (fp16.enabled) return PrecisionMode::kF16;
  if (bf16) return PrecisionMode::kBF16;
  return PrecisionMode::kF32;
}

absl::string_view OptimizerTypeName(OptimizerType type) {
  return type == OptimizerType::kAdam ? "Adam" : "AdamW";
}

absl::string_view SchedulerTypeName(SchedulerType type) {
  switch (type) {
    case SchedulerType::kNone:
      return "none";
    case SchedulerType::kWarmupLR:
      return "WarmupLR";
    case SchedulerType::kWarmupDecayLR:
      return "WarmupDecayLR";
    case SchedulerType::kWarmupCosineLR:
      return "WarmupCosineLR";
  }
  return "unknown";
}

absl::string_view PrecisionModeName(PrecisionMode mode) {
  switch (mode) {
    case PrecisionMode::kF32:
      return "f32";
    case PrecisionMode::kF16:
      return "f16";
    case PrecisionMode::kBF16:
      return "bf16";
  }
  return "unknown";
}

absl::string_view AcceleratorKindName(AcceleratorKind kind) {
  return kind == AcceleratorKind::kCpu ? "cpu" : "cuda";
}

DType ComputeDType(PrecisionMode mode) {
  switch (mode) {
    case PrecisionMode::kF16:
      return DType::kF16;
    case PrecisionMode::kBF16:
      return DType::kBF16;
    case PrecisionMode::kF32:
      break;
  }
  return DType::kF32;
}

std::vector<std::string> TrainConfigKeyPaths() {
  std::vector<std::string> paths;
  const auto add = [&paths](const Section& section) {
    for (absl::string_view key : section.keys) {
      // Sections are listed through their own tables.
      if (section.path.empty() &&
          (key == "optimizer" || key == "scheduler" || key == "fp16" || key == "bf16" ||
           key == "model" || key == "chunk" || key == "accelerator" || key == "data" ||
           key == "checkpoint" || key == "profile")) {
        continue;
      }
      if (key == "params") continue;
      paths.push_back(JoinPath(section.path, key));
    }
  };
  for (const Section* section :
       {&kTopSection, &kOptimizerSection, &kOptimizerParamsSection, &kSchedulerSection,
        &kSchedulerParamsSection, &kFp16Section, &kBf16Section, &kModelSection, &kChunkSection,
        &kAcceleratorSection, &kDataSection, &kCheckpointSection, &kProfileSection}) {
    add(*section);
  }
  return paths;
}

std::vector<std::string> IgnoredDeepSpeedKeys() {
  std::vector<std::string> keys;
  for (const IgnoredKey& k : kIgnoredKeys) keys.emplace_back(k.key);
  return keys;
}

absl::StatusOr<TrainConfig> ParseTrainConfig(absl::string_view json_text, absl::string_view source,
                                             std::vector<std::string>* ignored_keys) {
  // nlohmann/json throws; nothing here should (types are checked before every get), but no
  // exception may leave this function.
  try {
    ASSIGN_OR_RETURN(TrainConfig config, ParseTrainConfigImpl(json_text, source, ignored_keys));
    const absl::Status values = CheckFieldValues(config);
    if (!values.ok()) {
      return absl::InvalidArgumentError(absl::StrCat(source, ": ", values.message()));
    }
    return config;
  } catch (const std::exception& e) {
    return absl::InternalError(
        absl::StrCat(source, ": unexpected error parsing the config: ", e.what()));
  }
}

absl::StatusOr<TrainConfig> LoadTrainConfig(const std::string& path) {
  const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) {
    const int err = errno;
    const std::string message =
        absl::StrCat("cannot open config file ", path, ": ", std::strerror(err));
    if (err == ENOENT || err == ENOTDIR) return absl::NotFoundError(message);
    if (err == EACCES || err == EPERM) return absl::PermissionDeniedError(message);
    return absl::InvalidArgumentError(message);
  }
  struct stat st {};
  if (::fstat(fd, &st) == 0 && S_ISDIR(st.st_mode)) {
    ::close(fd);
    return absl::InvalidArgumentError(
        absl::StrCat("config path ", path, " is a directory, not a JSON file"));
  }
  std::string text;
  char buffer[64 * 1024];
  while (true) {
    const ssize_t n = ::read(fd, buffer, sizeof(buffer));
    if (n < 0) {
      if (errno == EINTR) continue;
      const int err = errno;
      ::close(fd);
      return absl::InvalidArgumentError(
          absl::StrCat("cannot read config file ", path, ": ", std::strerror(err)));
    }
    if (n == 0) break;
    text.append(buffer, static_cast<size_t>(n));
    if (static_cast<int64_t>(text.size()) > kMaxConfigFileBytes) {
      ::close(fd);
      return absl::InvalidArgumentError(absl::StrCat("config file ", path, " is larger than ",
                                                     FormatBytes(kMaxConfigFileBytes),
                                                     "; it is not a config"));
    }
  }
  ::close(fd);
  return ParseTrainConfig(text, path);
}

TrainConfig DefaultTrainConfig() { return MakeDefaultTrainConfig(); }

absl::Status ApplyOverrides(const ConfigOverrides& o, TrainConfig* config) {
  TrainConfig c = *config;
  const auto bad = [](absl::string_view flag, absl::string_view value, absl::string_view rule) {
    return absl::InvalidArgumentError(absl::StrCat("--", flag, "=", value, ": ", rule));
  };
  if (o.model.has_value()) {
    const std::vector<std::string> names = GptPresetNames();
    if (std::find(names.begin(), names.end(), *o.model) == names.end()) {
      return bad("model", *o.model,
                 absl::StrCat("unknown model preset; valid presets: ", absl::StrJoin(names, ", ")));
    }
    const bool checkpointing = c.model.activation_checkpointing;
    c.model = ModelConfig{};
    c.model.preset = *o.model;
    c.model.activation_checkpointing = checkpointing;
  }
  if (o.train_data.has_value()) c.data.train_path = *o.train_data;
  if (o.val_data.has_value()) c.data.val_path = *o.val_data;
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
  if (o.seed.has_value()) c.seed = *o.seed;
  if (o.resume.has_value()) c.checkpoint.resume = *o.resume;
  *config = std::move(c);
  return absl::OkStatus();
}

absl::StatusOr<GptConfig> ResolveModelConfig(const ModelConfig& m) {
  for (const auto& [key, value] :
       {std::pair<absl::string_view, int64_t>{"model.vocab_size", m.vocab_size},
        {"model.n_positions", m.max_seq_len},
        {"model.n_embd", m.hidden},
        {"model.n_layer", m.num_layers},
        {"model.n_head", m.num_heads}}) {
    if (value < 0 || value > kMaxModelDim) {
      return BadValue(key, value,
                      absl::StrCat("must be in [1, ", kMaxModelDim, "] (or 0: the preset's)"));
    }
  }
  GptConfig g;
  if (!m.preset.empty()) {
    absl::StatusOr<GptConfig> preset = GptPreset(m.preset);
    if (!preset.ok()) {
      return BadValue(
          "model.preset", Quote(m.preset),
          absl::StrCat("unknown preset; valid presets: ", absl::StrJoin(GptPresetNames(), ", ")));
    }
    g = *std::move(preset);
  } else {
    std::vector<std::string> missing;
    if (m.vocab_size == 0) missing.push_back("model.vocab_size");
    if (m.max_seq_len == 0) missing.push_back("model.n_positions");
    if (m.hidden == 0) missing.push_back("model.n_embd");
    if (m.num_layers == 0) missing.push_back("model.n_layer");
    if (m.num_heads == 0) missing.push_back("model.n_head");
    if (!missing.empty()) {
      return absl::InvalidArgumentError(absl::StrCat(
          "the model is not defined: set model.preset (", absl::StrJoin(GptPresetNames(), ", "),
          ") or all five dimensions; missing: ", absl::StrJoin(missing, ", ")));
    }
    g.name = "custom";
  }
  if (m.vocab_size > 0) g.vocab_size = m.vocab_size;
  if (m.max_seq_len > 0) g.max_seq_len = m.max_seq_len;
  if (m.hidden > 0) g.hidden = m.hidden;
  if (m.num_layers > 0) g.num_layers = m.num_layers;
  if (m.num_heads > 0) g.num_heads = m.num_heads;
  if (g.hidden % g.num_heads != 0) {
    return absl::InvalidArgumentError(absl::StrCat(
        "`model.n_embd` = ", g.hidden, " is not divisible by `model.n_head` = ", g.num_heads,
        ": each head gets n_embd / n_head dimensions"));
  }
  // The closed form of GptParameterCount, in floating point so it cannot overflow.
  const double h = static_cast<double>(g.hidden);
  const double params =
      (static_cast<double>(g.vocab_size) + static_cast<double>(g.max_seq_len)) * h +
      static_cast<double>(g.num_layers) * (12 * h * h + 13 * h) + 2 * h;
  if (params > kMaxModelParams) {
    return absl::InvalidArgumentError(
        absl::StrCat("the model (vocab_size ", g.vocab_size, ", n_positions ", g.max_seq_len,
                     ", n_embd ", g.hidden, ", n_layer ", g.num_layers, ") would have ",
                     FormatDouble(params), " parameters, more than 2^53; use smaller dimensions"));
  }
  RETURN_IF_ERROR(ValidateGptConfig(g));
  return g;
}

int64_t ResolveSeqLen(const TrainConfig& config, const GptConfig& model) {
  return config.data.seq_len > 0 ? config.data.seq_len : model.max_seq_len;
}

int64_t ResolveTrainBatchSize(const TrainConfig& config, int world_size) {
  if (config.train_batch_size > 0) return config.train_batch_size;
  return config.train_micro_batch_size_per_gpu * config.gradient_accumulation_steps * world_size;
}

absl::Status ValidateTrainConfig(const TrainConfig& c, int world_size) {
  RETURN_IF_ERROR(CheckFieldValues(c));
  if (world_size < 1) {
    return absl::InvalidArgumentError(
        absl::StrCat("world size must be >= 1 ranks, got ", world_size));
  }
  if (c.steps < 1) {
    return BadValue("train_steps", c.steps,
                    "must be > 0: set train_steps in the config or pass --steps");
  }
  if (c.fp16.enabled && c.bf16) {
    return absl::InvalidArgumentError(
        "`fp16.enabled` and `bf16.enabled` are both true; enable at most one (neither: f32)");
  }
  if (c.train_batch_size > 0) {
    // Both factors are bounded by the checks above only from below; compare in floating point.
    const double derived = static_cast<double>(c.train_micro_batch_size_per_gpu) *
                           static_cast<double>(c.gradient_accumulation_steps) * world_size;
    if (static_cast<double>(c.train_batch_size) != derived) {
      return absl::InvalidArgumentError(absl::StrCat(
          "`train_batch_size` = ", c.train_batch_size,
          " does not equal train_micro_batch_size_per_gpu (", c.train_micro_batch_size_per_gpu,
          ") x gradient_accumulation_steps (", c.gradient_accumulation_steps, ") x world size (",
          world_size, ") = ", FormatDouble(derived),
          "; fix one of them or omit train_batch_size to derive it"));
    }
  }
  ASSIGN_OR_RETURN(const GptConfig model, ResolveModelConfig(c.model));
  // Bounds that keep the trainer's batch and token arithmetic far from int64 overflow.
  const double global_batch = static_cast<double>(c.train_micro_batch_size_per_gpu) *
                              static_cast<double>(c.gradient_accumulation_steps) * world_size;
  const double micro_tokens = static_cast<double>(c.train_micro_batch_size_per_gpu) *
                              static_cast<double>(ResolveSeqLen(c, model));
  if (global_batch > kMaxBatchElems || micro_tokens > kMaxBatchElems) {
    return BadValue("train_micro_batch_size_per_gpu", c.train_micro_batch_size_per_gpu,
                    absl::StrCat("with world size ", world_size, " and seq_len ",
                                 ResolveSeqLen(c, model), " this is ", FormatDouble(global_batch),
                                 " sequences, ", FormatDouble(micro_tokens),
                                 " tokens per micro batch; both must be at most 2^40"));
  }
  if (c.data.seq_len > model.max_seq_len) {
    return absl::InvalidArgumentError(
        absl::StrCat("`data.seq_len` = ", c.data.seq_len, " exceeds the model's n_positions (",
                     model.max_seq_len, ", model ", model.name, "); use at most ",
                     model.max_seq_len, ", or 0 for n_positions"));
  }
  if (c.chunk.size_elems > 0) {
    const std::vector<OperatorSpec> ops = GptOperators(model);
    const OperatorSpec* largest = nullptr;
    int64_t largest_elems = 0;
    for (const OperatorSpec& op : ops) {
      const int64_t elems = OperatorNumElems(op);
      if (elems > largest_elems) {
        largest_elems = elems;
        largest = &op;
      }
    }
    if (largest != nullptr && largest_elems > c.chunk.size_elems) {
      return absl::InvalidArgumentError(absl::StrCat(
          "`chunk.size` = ", c.chunk.size_elems, " elements cannot hold operator ", largest->name,
          " (", largest_elems, " elements; all tensors of an operator share one chunk) of model ",
          model.name, "; use chunk.size >= ", largest_elems, " or \"auto\""));
    }
  }
  if (absl::StatusOr<LrSchedule> schedule = LrSchedule::Create(MakeLrScheduleOptions(c));
      !schedule.ok()) {
    return absl::InvalidArgumentError(absl::StrCat(
        "scheduler ", SchedulerTypeName(c.scheduler.type), ": ", schedule.status().message()));
  }
  RETURN_IF_ERROR(MakeLossScaler(c).status());
  if (c.checkpoint.every > 0 && c.checkpoint.dir.empty()) {
    return absl::InvalidArgumentError(
        absl::StrCat("`checkpoint.every` = ", c.checkpoint.every,
                     " needs a checkpoint directory: set checkpoint.dir (or --save_dir)"));
  }
  if (c.checkpoint.resume && c.checkpoint.dir.empty()) {
    return absl::InvalidArgumentError(
        "`checkpoint.resume` = true needs checkpoint.dir (or --save_dir) to resume from");
  }
  if (c.accelerator.kind == AcceleratorKind::kCuda &&
      c.accelerator.copy_bandwidth_bytes_per_s > 0) {
    return absl::InvalidArgumentError(absl::StrCat(
        "`accelerator.copy_bandwidth` = ", FormatDouble(c.accelerator.copy_bandwidth_bytes_per_s),
        " bytes/s emulates a link and applies only to backend \"cpu\"; remove it (or set 0) for "
        "\"cuda\""));
  }
  return absl::OkStatus();
}

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
                          {"min_loss_scale", c.fp16.min_loss_scale}};
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
                          {"seed", c.data.seed},
                          {"eval_every", c.data.eval_every},
                          {"eval_batches", c.data.eval_batches}};
  j["checkpoint"] = OrderedJson{{"dir", c.checkpoint.dir},
                                {"every", c.checkpoint.every},
                                {"keep_last", c.checkpoint.keep_last},
                                {"resume", c.checkpoint.resume},
                                {"init_from", c.checkpoint.init_from},
                                {"export", c.checkpoint.export_path}};
  j["profile"] = OrderedJson{{"trace", c.profile.trace_path}, {"metrics", c.profile.metrics_path}};
  // Strings that are not UTF-8 (only possible from overrides; ValidateTrainConfig rejects them)
  // are written with U+FFFD instead of throwing.
  return j.dump(2, ' ', false, OrderedJson::error_handler_t::replace);
}

absl::StatusOr<LossScaler> MakeLossScaler(const TrainConfig& config) {
  if (config.precision() != PrecisionMode::kF16) return LossScaler::None();
  if (config.fp16.loss_scale > 0) return LossScaler::Static(config.fp16.loss_scale);
  DynamicLossScalerOptions options;
  options.initial_scale_power = config.fp16.initial_scale_power;
  options.loss_scale_window = config.fp16.loss_scale_window;
  options.hysteresis = config.fp16.hysteresis;
  options.consecutive_hysteresis = config.fp16.consecutive_hysteresis;
  options.min_loss_scale = config.fp16.min_loss_scale;
  return LossScaler::Dynamic(options);
}

LrScheduleOptions MakeLrScheduleOptions(const TrainConfig& config) {
  const SchedulerConfig& s = config.scheduler;
  LrScheduleOptions o;
  o.lr = config.optimizer.lr;
  switch (s.type) {
    case SchedulerType::kNone:
      o.type = LrScheduleType::kConstant;
      return o;
    case SchedulerType::kWarmupLR:
      o.type = LrScheduleType::kWarmup;
      break;
    case SchedulerType::kWarmupDecayLR:
      o.type = LrScheduleType::kWarmupDecay;
      break;
    case SchedulerType::kWarmupCosineLR:
      o.type = LrScheduleType::kWarmupCosine;
      break;
  }
  if (s.type != SchedulerType::kWarmupCosineLR && s.warmup_max_lr != -1) o.lr = s.warmup_max_lr;
  o.warmup_min_lr = s.warmup_min_lr;
  o.warmup_num_steps = s.warmup_num_steps;
  o.warmup_type = s.warmup_type == "log" ? WarmupType::kLog : WarmupType::kLinear;
  o.total_num_steps = s.total_num_steps > 0 ? s.total_num_steps : config.steps;
  o.warmup_min_ratio = s.warmup_min_ratio;
  o.cos_min_ratio = s.cos_min_ratio;
  return o;
}

absl::StatusOr<HybridAdamOptions> MakeHybridAdamOptions(const TrainConfig& config) {
  HybridAdamOptions o;
  o.mode = config.optimizer.type == OptimizerType::kAdamW ? AdamMode::kAdamW : AdamMode::kAdam;
  o.beta1 = config.optimizer.beta1;
  o.beta2 = config.optimizer.beta2;
  o.eps = config.optimizer.eps;
  o.max_grad_norm = config.gradient_clipping;
  ASSIGN_OR_RETURN(o.loss_scaler, MakeLossScaler(config));
  o.groups.clear();
  if (config.optimizer.weight_decay > 0) {
    ParamGroupOptions no_decay;
    no_decay.name = "no_decay";
    no_decay.lr = config.optimizer.lr;
    no_decay.weight_decay = 0;
    no_decay.selector = [](const TensorInfo& t) { return IsBiasOrNormTensor(t); };
    ParamGroupOptions decay;
    decay.name = "decay";
    decay.lr = config.optimizer.lr;
    decay.weight_decay = config.optimizer.weight_decay;
    o.groups.push_back(std::move(no_decay));
    o.groups.push_back(std::move(decay));
  } else {
    ParamGroupOptions all;
    all.name = "default";
    all.lr = config.optimizer.lr;
    all.weight_decay = 0;
    o.groups.push_back(std::move(all));
  }
  return o;
}

}  // namespace ps
