// Strict JSON reading for the Hugging Face files of a model directory (config.json,
// model.safetensors.index.json), shared by model/hf_config.cc and model/safetensors_index.cc.
//
// Stricter than Python's json module in one way on purpose: an object that names a key twice is
// an error (Python silently keeps the last value, which lets two entries of a hand-edited file
// disagree without anyone noticing). Invalid JSON is reported with its line and column.
//
// Thread safety: pure functions.
#ifndef PATRICKSTAR_MODEL_HF_JSON_H_
#define PATRICKSTAR_MODEL_HF_JSON_H_

#include <string>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "nlohmann/json.hpp"

namespace ps::hf_json {

// Parses `text` as one JSON object. Errors, all with code `code` and a message starting
// "<what> '<path>': ": not valid JSON or UTF-8 (with line and column of the first error), a top
// level that is not an object, a key repeated within one object (naming it).
[[nodiscard]] absl::StatusOr<nlohmann::json> ParseObject(absl::string_view text,
                                                         absl::string_view what,
                                                         absl::string_view path,
                                                         absl::StatusCode code);

// Reads the whole file at `path` (NotFound if missing, other errno codes otherwise).
[[nodiscard]] absl::StatusOr<std::string> ReadTextFile(const std::string& path,
                                                       absl::string_view what);

// A short rendering of a JSON value for error messages: its dump, cut to 60 characters.
std::string Brief(const nlohmann::json& value);

// The JSON type of `value` in words: "null", "a boolean", "a string", "an integer", "a number",
// "an array", "an object".
absl::string_view TypeName(const nlohmann::json& value);

}  // namespace ps::hf_json

#endif  // PATRICKSTAR_MODEL_HF_JSON_H_
