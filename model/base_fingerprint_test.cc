// GptModel::BaseFingerprint against golden digests computed outside this code base.
//
// Every LoRA checkpoint stores the fingerprint of its frozen base, and a resume refuses a base
// whose fingerprint differs (trainer/run_checkpoints.cc). A change of the hash — its constants,
// the pieces it covers, their order, the tensor order or the dtype conversion — would therefore
// turn every LoRA checkpoint saved so far into a refusal without any other test noticing (they
// compare fingerprints with each other only). Here the digest of the tiny Hugging Face models of
// model/testdata, loaded under LoRA in f32 and bf16, is compared with the one
// model/testdata/make_base_fingerprint_golden.py computes from the algorithm as
// model/gpt_model.h documents it (Python's standard library only). If this test fails, either
// the change was a mistake, or existing checkpoints stop resuming: then say so in the change and
// regenerate the table with the script.
#include <cstdlib>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/strings/str_cat.h"
#include "base/status_macros.h"
#include "base/testing/status_matchers.h"
#include "base/units.h"
#include "chunk/chunk_layout.h"
#include "chunk/chunk_store.h"
#include "gtest/gtest.h"
#include "memory/cpu_backend.h"
#include "memory/device_memory.h"
#include "memory/dtype.h"
#include "model/gpt_model.h"
#include "model/hf_checkpoint.h"
#include "model/lora_config.h"
#include "model/model_config.h"
#include "scheduler/chunk_manager.h"

namespace ps {
namespace {

std::string Runfile(const std::string& path) {
  const char* dir = std::getenv("TEST_SRCDIR");
  return absl::StrCat(dir != nullptr ? dir : ".", "/patrickstar_cc/model/testdata/", path);
}

// The output of `python3 model/testdata/make_base_fingerprint_golden.py` (Python 3.11.7).
struct Golden {
  const char* model;
  const char* dtype;
  const char* digest;
};
constexpr Golden kGolden[] = {
    {"hf_tiny_llama", "f32", "6ba72e63b76005d6"},
    {"hf_tiny_llama", "bf16", "9e44a7c6c4d45213"},
    {"hf_tiny_gpt2", "f32", "eda9c9fb6ff52887"},
    {"hf_tiny_gpt2", "bf16", "baf11986a3a3c71c"},
};

struct Model {
  std::unique_ptr<Backend> backend;
  std::unique_ptr<DeviceMemory> accelerator;
  std::unique_ptr<DeviceMemory> host;
  std::unique_ptr<ChunkStore> store;
  std::unique_ptr<ChunkManager> manager;
  std::unique_ptr<GptModel> model;
};

// A LoRA model of `base`'s architecture with `base` loaded. Small chunks, so the base spans many
// of them and the digest is read across chunk boundaries.
absl::StatusOr<std::unique_ptr<Model>> LoadLoraModel(const HfCheckpoint& base, DType dtype) {
  const ModelConfig& config = base.config();
  LoraConfig lora;
  lora.r = 2;
  lora.lora_alpha = 4;
  lora.target_modules = config.family == ModelFamily::kGpt2
                            ? std::vector<std::string>{"c_attn"}
                            : std::vector<std::string>{"q_proj", "v_proj"};
  constexpr int64_t kChunkElems = 2048;
  auto m = std::make_unique<Model>();
  ASSIGN_OR_RETURN(m->backend, CreateCpuBackend({.capacity_bytes = 64 * kMiB}));
  DeviceMemoryOptions memory_options;
  memory_options.chunk_block_bytes = kChunkElems * 4;
  ASSIGN_OR_RETURN(m->accelerator, CreateAcceleratorMemory(m->backend.get(), memory_options));
  ASSIGN_OR_RETURN(m->host, CreateHostMemory(m->backend.get(), memory_options));
  ASSIGN_OR_RETURN(ChunkLayout layout,
                   ChunkLayout::Build({.capacity_elems = kChunkElems},
                                      ModelOperatorsFor(config, lora, /*vocab=*/{})));
  ASSIGN_OR_RETURN(m->store, ChunkStore::Create(std::move(layout), {.compute_dtype = dtype}));
  ASSIGN_OR_RETURN(m->manager, ChunkManager::Create(m->store.get(), m->backend.get(),
                                                    m->accelerator.get(), m->host.get(), {}));
  ASSIGN_OR_RETURN(m->model,
                   GptModel::Create(config, m->store.get(), m->manager.get(), m->accelerator.get(),
                                    GptModelOptions{.batch = 1, .seq_len = 8, .lora = lora}));
  RETURN_IF_ERROR(m->model->InitializeParameters(/*seed=*/1));
  RETURN_IF_ERROR(m->model->LoadHfCheckpoint(base));
  return m;
}

TEST(BaseFingerprint, MatchesTheDigestComputedFromItsDocumentedAlgorithm) {
  for (const Golden& g : kGolden) {
    SCOPED_TRACE(absl::StrCat(g.model, " ", g.dtype));
    ASSERT_OK_AND_ASSIGN(const HfCheckpoint base, HfCheckpoint::Open(Runfile(g.model)));
    ASSERT_OK_AND_ASSIGN(const DType dtype, ParseDType(g.dtype));
    ASSERT_OK_AND_ASSIGN(const std::unique_ptr<Model> m, LoadLoraModel(base, dtype));
    ASSERT_OK_AND_ASSIGN(const std::string digest, m->model->BaseFingerprint());
    EXPECT_EQ(digest, g.digest);
  }
}

}  // namespace
}  // namespace ps
