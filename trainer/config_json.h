// The canonical JSON form of a TrainConfig: what checkpoint manifests store and resume compares,
// and what --print_config prints.
//
// Thread safety: pure functions.
#ifndef PATRICKSTAR_TRAINER_CONFIG_JSON_H_
#define PATRICKSTAR_TRAINER_CONFIG_JSON_H_

#include <string>

#include "trainer/config.h"

namespace ps {

// The canonical JSON of `config`: every key in a fixed order, two-space indented; byte quantities
// as "8MiB"-style strings when a whole number of KiB/MiB/GiB/TiB, else integers; chunk.size 0 as
// "auto"; scheduler params only those of its type (none and no section for kNone); warmup_max_lr
// omitted when -1; train_batch_size omitted when 0; the lora section only when set, its
// target_modules as the string "all-linear" for PEFT's shorthand, else a list; the quantization
// section only when not the default (load_in_4bit true, or a file's section with other keys set),
// every key written (enum names as bitsandbytes and torch spell them); a string key whose
// value is empty (a path not set: data.train, checkpoint.dir, profile.metrics, model.preset, ...)
// left out, since the parser refuses "" and the key's absence is the same default. For a config that
// passes the per-key checks, ParseTrainConfig(TrainConfigToJson(c)) == c (scheduler params that do
// not apply to its type are not written, so they come back as defaults).
std::string TrainConfigToJson(const TrainConfig& config);

}  // namespace ps

#endif  // PATRICKSTAR_TRAINER_CONFIG_JSON_H_
