// The typed key access of model/hf_config.cc and the family-specific readers and writers it
// shares with model/hf_config_families.cc (sliding windows, SmolLM3's NoPE layers, Gemma 3).
//
// Thread safety: pure functions; a Keys reads an object the caller keeps alive.
#ifndef PATRICKSTAR_MODEL_INTERNAL_HF_CONFIG_KEYS_H_
#define PATRICKSTAR_MODEL_INTERNAL_HF_CONFIG_KEYS_H_

#include <cmath>
#include <cstdint>
#include <limits>
#include <optional>
#include <string>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/string_view.h"
#include "base/status_macros.h"
#include "model/hf_json.h"
#include "model/model_config.h"
#include "nlohmann/json.hpp"

namespace ps::hf_config_internal {

using nlohmann::json;

inline constexpr absl::string_view kWhat = "Hugging Face config";

// Typed access to the keys of one config.json object, with errors naming the file and the key.
class Keys {
 public:
  Keys(const json& object, absl::string_view path) : object_(object), path_(path) {}

  absl::string_view path() const { return path_; }

  // The value at `key`, or nullptr when the key is absent.
  const json* Find(absl::string_view key) const {
    const auto it = object_.find(std::string(key));
    return it == object_.end() ? nullptr : &*it;
  }
  // The value at `key`, or nullptr when it is absent or null.
  const json* FindNonNull(absl::string_view key) const {
    const json* v = Find(key);
    return v == nullptr || v->is_null() ? nullptr : v;
  }

  absl::Status Invalid(absl::string_view key, absl::string_view what) const {
    return absl::InvalidArgumentError(absl::StrCat(kWhat, " '", path_, "': \"", key, "\" ", what));
  }
  absl::Status Unsupported(absl::string_view key, absl::string_view what) const {
    return absl::UnimplementedError(absl::StrCat(kWhat, " '", path_, "': \"", key, "\" ", what));
  }

  // An integer that fits int64 (not a float, even 4096.0: transformers 5 refuses those too).
  absl::StatusOr<int64_t> AsInt(absl::string_view key, const json& v) const {
    if (v.is_number_unsigned()) {
      const auto u = v.get<uint64_t>();
      if (u > static_cast<uint64_t>(std::numeric_limits<int64_t>::max())) {
        return Invalid(key, absl::StrCat("is ", u, ", too large"));
      }
      return static_cast<int64_t>(u);
    }
    if (v.is_number_integer()) return v.get<int64_t>();
    return Invalid(key, absl::StrCat("must be an integer, got ", hf_json::TypeName(v), " ",
                                     hf_json::Brief(v)));
  }

  // A positive integer at `key`; `fallback` when absent. Null is an error unless
  // `null_is_default`.
  absl::StatusOr<int64_t> PositiveInt(absl::string_view key, int64_t fallback,
                                      bool null_is_default = false) const {
    const json* v = Find(key);
    if (v == nullptr || (null_is_default && v->is_null())) return fallback;
    ASSIGN_OR_RETURN(const int64_t n, AsInt(key, *v));
    if (n <= 0) return Invalid(key, absl::StrCat("must be a positive integer, got ", n));
    return n;
  }

  // A positive integer at `key`, nullopt when absent or null.
  absl::StatusOr<std::optional<int64_t>> OptionalPositiveInt(absl::string_view key) const {
    const json* v = FindNonNull(key);
    if (v == nullptr) return std::optional<int64_t>();
    ASSIGN_OR_RETURN(const int64_t n, AsInt(key, *v));
    if (n <= 0) return Invalid(key, absl::StrCat("must be a positive integer, got ", n));
    return std::optional<int64_t>(n);
  }

  absl::StatusOr<double> AsNumber(absl::string_view key, const json& v) const {
    if (!v.is_number()) {
      return Invalid(key, absl::StrCat("must be a number, got ", hf_json::TypeName(v), " ",
                                       hf_json::Brief(v)));
    }
    return v.get<double>();
  }

  // A finite positive number at `key`; `fallback` when absent.
  absl::StatusOr<double> PositiveNumber(absl::string_view key, double fallback) const {
    const json* v = Find(key);
    if (v == nullptr) return fallback;
    ASSIGN_OR_RETURN(const double d, AsNumber(key, *v));
    if (!std::isfinite(d) || d <= 0) {
      return Invalid(key, absl::StrCat("must be a positive number, got ", hf_json::Brief(*v)));
    }
    return d;
  }

  absl::StatusOr<bool> Bool(absl::string_view key, bool fallback) const {
    const json* v = Find(key);
    if (v == nullptr) return fallback;
    if (!v->is_boolean()) {
      return Invalid(key, absl::StrCat("must be true or false, got ", hf_json::TypeName(*v), " ",
                                       hf_json::Brief(*v)));
    }
    return v->get<bool>();
  }

  absl::StatusOr<std::string> String(absl::string_view key, absl::string_view fallback) const {
    const json* v = Find(key);
    if (v == nullptr) return std::string(fallback);
    if (!v->is_string()) {
      return Invalid(key, absl::StrCat("must be a string, got ", hf_json::TypeName(*v), " ",
                                       hf_json::Brief(*v)));
    }
    return v->get<std::string>();
  }

 private:
  const json& object_;
  std::string path_;
};

// The window of sliding_window (absent: `fallback`; null: none).
absl::StatusOr<std::optional<int64_t>> SlidingWindow(const Keys& keys,
                                                     std::optional<int64_t> fallback);

// Sets c.sliding_window and c.sliding_window_layers as transformers 4.57.6 applies them (see
// hf_config_families.cc).
absl::Status ParseSlidingWindow(const Keys& keys, ModelConfig& c);

// SmolLM3's NoPE layers (no_rope_layers / no_rope_layer_interval).
absl::Status ParseNoRopeLayers(const Keys& keys, ModelConfig& c);

// Gemma 3's keys beyond llama's (c.family kGemma3, the llama keys read): hidden_activation,
// query_pre_attn_scalar, the soft-capping keys, sliding_window and layer_types,
// rope_local_base_freq, use_bidirectional_attention.
absl::Status ParseGemma3Text(const Keys& keys, ModelConfig& c);

// Writes Gemma 3's keys of `c` into `out` (a gemma3_text config.json object).
void WriteGemma3Text(const ModelConfig& c, json& out);

}  // namespace ps::hf_config_internal

#endif  // PATRICKSTAR_MODEL_INTERNAL_HF_CONFIG_KEYS_H_
