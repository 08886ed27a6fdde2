// The TrainRun's own helpers: agreement across ranks, the checkpoint identity, closing the outputs.
#include "trainer/internal/train_run.h"

#include <algorithm>
#include <cstdint>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/str_cat.h"
#include "base/status_macros.h"
#include "comm/communicator.h"
#include "trainer/checkpoint.h"

namespace ps {
namespace trainer_internal {

bool TrainRun::DeviceCommunicator() const {
  if (shape.world <= 1) return false;
  return env.device_communicator_for_test != nullptr ||
         env.communicator->memory() != CommMemory::kHost;
}

absl::StatusOr<double> TrainRun::MeanOverRanks(double value) const {
  if (runtime.collectives == nullptr) return value;
  return runtime.collectives->AllReduceMean(value);
}

absl::StatusOr<bool> TrainRun::AnyRank(bool flag) const {
  if (runtime.collectives == nullptr) return flag;
  ASSIGN_OR_RETURN(std::vector<int64_t> flags, runtime.collectives->AllGatherInt64(flag ? 1 : 0));
  return std::any_of(flags.begin(), flags.end(), [](int64_t f) { return f != 0; });
}

CheckpointIdentity TrainRun::Identity() const {
  const GptConfig& gpt = resolved.gpt;
  CheckpointIdentity id;
  id.vocab_size = gpt.vocab_size;
  id.max_seq_len = gpt.max_seq_len;
  id.hidden = gpt.hidden;
  id.num_layers = gpt.num_layers;
  id.num_heads = gpt.num_heads;
  id.compute_dtype = shape.dtype;
  id.world_size = shape.world;
  id.micro_batch = shape.micro_batch;
  id.seq_len = shape.seq_len;
  id.shuffle = config.data.shuffle;
  id.data_seed = config.data.seed;
  if (data.train_packed.has_value()) {
    id.data_format = "examples";
    id.packing = config.data.packing;
  }
  id.quant4 = resolved.quant4;
  if (resolved.lora.has_value()) {
    id.lora = resolved.lora;
    id.base_fingerprint = resolved.base_fingerprint;
    id.base_source = config.checkpoint.init_from.empty()
                         ? absl::StrCat("seeded initialization, seed ", config.seed)
                         : absl::StrCat("checkpoint.init_from '", config.checkpoint.init_from, "'");
  }
  return id;
}

absl::Status TrainRun::CloseOutputs() {
  closed = true;
  absl::Status status;
  if (runtime.metrics != nullptr) status.Update(runtime.metrics->Close());
  if (runtime.trace != nullptr) status.Update(runtime.trace->Close());
  return status;
}

}  // namespace trainer_internal
}  // namespace ps
