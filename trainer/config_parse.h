// ParseTrainConfig / LoadTrainConfig: a training config file (JSON in DeepSpeed's format plus this
// project's sections; trainer/config_schema.h lists every key) into a TrainConfig, each section
// read onto the struct defaults (trainer/config.h), every error InvalidArgument naming the source,
// the full key path and the value, and saying what is allowed:
//   - JSON syntax: "config.json:3:12: JSON syntax error: ..." (1-based line and column, the column
//     counted in characters), with the offending line quoted;
//   - a key given twice in one object, or nesting deeper than any config needs;
//   - unknown keys, with "did you mean `betas`?" when a valid key is within a small
//     case-insensitive Damerau-Levenshtein distance (or is a known alias: hidden_size -> n_embd);
//   - wrong JSON types, naming the expected and the found type;
//   - impossible values, key by key (CheckTrainConfigValues); the checks across keys are
//     ValidateTrainConfig's (trainer/config_validate.h);
//   - quantization.load_in_8bit true is Unimplemented (not InvalidArgument): a valid
//     BitsAndBytesConfig this program does not implement.
//
// Thread safety: pure functions (they may LOG the ignored DeepSpeed keys).
#ifndef PATRICKSTAR_TRAINER_CONFIG_PARSE_H_
#define PATRICKSTAR_TRAINER_CONFIG_PARSE_H_

#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "trainer/config.h"

namespace ps {

// Parses a config file's text. `source` (a file name) prefixes every error message. Checks the
// syntax, duplicate and unknown keys, the JSON types, and each value on its own (ranges, enum
// names, byte quantities, presets); the checks across keys, and train_steps > 0, are
// ValidateTrainConfig's. If `ignored_keys` is non-null, the ignored top-level DeepSpeed keys found
// are appended to it, and "zero_optimization" once when any key inside it was ignored (each ignored
// key is also LOG(WARNING)ed under its full path).
absl::StatusOr<TrainConfig> ParseTrainConfig(absl::string_view json_text, absl::string_view source,
                                             std::vector<std::string>* ignored_keys = nullptr);

// Reads and parses a file (ParseTrainConfig with the path as source). NotFound if it does not
// exist, PermissionDenied if it cannot be read, InvalidArgument for a directory, a file over
// 16 MiB, or any parse error.
absl::StatusOr<TrainConfig> LoadTrainConfig(const std::string& path);

}  // namespace ps

#endif  // PATRICKSTAR_TRAINER_CONFIG_PARSE_H_
