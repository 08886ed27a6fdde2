// A small Hugging Face model directory for the trainer's end-to-end tests (checkpoint.init_from,
// LoRA bases), written with the project's own writer (model/hf_checkpoint.h). Test-only.
#ifndef PATRICKSTAR_TRAINER_TESTING_HF_MODEL_DIR_H_
#define PATRICKSTAR_TRAINER_TESTING_HF_MODEL_DIR_H_

#include <cstdint>
#include <string>

#include "absl/status/status.h"
#include "model/model_config.h"

namespace ps::trainer_testing {

// Writes `config` as the Hugging Face directory `dir` (config.json and f32 safetensors) with
// transformers-like initial values: norms 1, biases 0, other weights N(0, 0.02) from a generator
// seeded by the tensor's name, the piece's first element and `seed` (deterministic: the same
// arguments write the same bytes; another seed writes other weights). Seed 0 leaves the name and
// piece alone. Errors: WriteHfCheckpoint's.
[[nodiscard]] absl::Status WriteTinyHfModel(const std::string& dir, const ModelConfig& config,
                                            uint64_t seed);

}  // namespace ps::trainer_testing

#endif  // PATRICKSTAR_TRAINER_TESTING_HF_MODEL_DIR_H_
