#include "trainer/testing/model_rig.h"

#include <memory>
#include <utility>

#include "base/status_macros.h"
#include "base/units.h"
#include "chunk/chunk_layout.h"
#include "memory/cpu_backend.h"

namespace ps::trainer_testing {

absl::StatusOr<std::unique_ptr<ModelRig>> MakeModelRig(const GptConfig& config, DType dtype,
                                                       int64_t chunk_elems, uint64_t seed) {
  auto rig = std::make_unique<ModelRig>();
  ASSIGN_OR_RETURN(rig->backend, CreateCpuBackend({.capacity_bytes = 64 * kMiB}));
  DeviceMemoryOptions memory_options;
  memory_options.chunk_block_bytes = chunk_elems * 4;
  ASSIGN_OR_RETURN(rig->accelerator, CreateAcceleratorMemory(rig->backend.get(), memory_options));
  ASSIGN_OR_RETURN(rig->host, CreateHostMemory(rig->backend.get(), memory_options));
  ASSIGN_OR_RETURN(ChunkLayout layout,
                   ChunkLayout::Build({.capacity_elems = chunk_elems}, GptOperators(config)));
  ASSIGN_OR_RETURN(rig->store, ChunkStore::Create(std::move(layout), {.compute_dtype = dtype}));
  ASSIGN_OR_RETURN(rig->manager, ChunkManager::Create(rig->store.get(), rig->backend.get(),
                                                      rig->accelerator.get(), rig->host.get(), {}));
  GptModelOptions model_options;
  model_options.batch = 1;
  model_options.seq_len = config.max_seq_len;
  model_options.threads = 1;
  ASSIGN_OR_RETURN(rig->model, GptModel::Create(config, rig->store.get(), rig->manager.get(),
                                                rig->accelerator.get(), model_options));
  RETURN_IF_ERROR(rig->model->InitializeParameters(seed));
  return rig;
}

}  // namespace ps::trainer_testing
