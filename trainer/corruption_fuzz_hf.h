// The Hugging Face half of corruption_fuzz_test, in its own translation unit behind this
// interface (which names no config type; written when trainer/config.h's TrainModelConfig was
// still called ModelConfig and clashed with model/model_config.h's). Test-only.
#ifndef PATRICKSTAR_TRAINER_CORRUPTION_FUZZ_HF_H_
#define PATRICKSTAR_TRAINER_CORRUPTION_FUZZ_HF_H_

#include <string>

#include "absl/status/status.h"

namespace ps::corruption_fuzz {

// Writes a tiny Llama as a sharded (more than 3 files) bf16 Hugging Face directory `dir`.
[[nodiscard]] absl::Status WriteTinyHfDirectory(const std::string& dir);

// HfCheckpoint::Open(dir), then every parameter read as f32. Returns the Open error as is; a
// read error after a successful Open, or a non-finite value read, is returned as kInternal (which
// the test counts as a failure: Open promised a loadable, finite checkpoint).
[[nodiscard]] absl::Status OpenAndReadHfDirectory(const std::string& dir);

}  // namespace ps::corruption_fuzz

#endif  // PATRICKSTAR_TRAINER_CORRUPTION_FUZZ_HF_H_
