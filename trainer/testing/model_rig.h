// A GptModel over the emulated accelerator, with everything it needs, for tests that write and
// read training checkpoints (trainer/checkpoint.h) without running the trainer. Test-only.
#ifndef PATRICKSTAR_TRAINER_TESTING_MODEL_RIG_H_
#define PATRICKSTAR_TRAINER_TESTING_MODEL_RIG_H_

#include <cstdint>
#include <memory>

#include "absl/status/statusor.h"
#include "chunk/chunk_store.h"
#include "memory/backend.h"
#include "memory/device_memory.h"
#include "memory/dtype.h"
#include "model/gpt_config.h"
#include "model/gpt_model.h"
#include "scheduler/chunk_manager.h"

namespace ps::trainer_testing {

// Members in construction order; destroyed in reverse (the model and manager before the store,
// the store before the memories, the memories before the backend).
struct ModelRig {
  std::unique_ptr<Backend> backend;
  std::unique_ptr<DeviceMemory> accelerator;
  std::unique_ptr<DeviceMemory> host;
  std::unique_ptr<ChunkStore> store;
  std::unique_ptr<ChunkManager> manager;
  std::unique_ptr<GptModel> model;
};

// A model of `config` in chunks of `chunk_elems` (which must hold its largest operator), compute
// dtype `dtype`, on a cpu backend with 64 MiB, parameters initialized from `seed`.
absl::StatusOr<std::unique_ptr<ModelRig>> MakeModelRig(const GptConfig& config, DType dtype,
                                                       int64_t chunk_elems, uint64_t seed);

}  // namespace ps::trainer_testing

#endif  // PATRICKSTAR_TRAINER_TESTING_MODEL_RIG_H_
