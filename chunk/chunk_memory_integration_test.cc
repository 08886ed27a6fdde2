// The chunk layer over the production memory layer: chunk payloads from ChunkBlockPools over the
// host heap and over the emulated accelerator's device memory (memory/chunk_block_pool.h,
// memory/resources.h), moving between them on a cpu-backend stream.
#include <cstdint>
#include <cstring>
#include <memory>
#include <vector>

#include "base/testing/status_matchers.h"
#include "base/units.h"
#include "chunk/chunk.h"
#include "chunk/chunk_layout.h"
#include "chunk/chunk_store.h"
#include "chunk/chunk_type.h"
#include "chunk/tensor_state.h"
#include "chunk/testing/transformer_operators.h"
#include "gtest/gtest.h"
#include "memory/backend.h"
#include "memory/chunk_block_pool.h"
#include "memory/cpu_backend.h"
#include "memory/device.h"
#include "memory/dtype.h"
#include "memory/resources.h"

namespace ps {
namespace {

TEST(ChunkOverBlockPools, MovesBetweenHostAndAcceleratorPoolsKeepData) {
  ASSERT_OK_AND_ASSIGN(std::unique_ptr<Backend> backend,
                       CreateCpuBackend({.capacity_bytes = 64 * kMiB}));
  ASSERT_OK_AND_ASSIGN(std::unique_ptr<Stream> stream, backend->CreateStream());
  HostResource host_memory;
  BackendDeviceResource device_memory(backend.get());

  ASSERT_OK_AND_ASSIGN(
      ChunkLayout layout,
      ChunkLayout::Build({.capacity_elems = 40'000},
                         chunk_testing::TransformerOperators(chunk_testing::kTinyShape)));
  const int64_t param_block_bytes = layout.ChunkBytes(ChunkType::kParam, DType::kF16);
  const int64_t state_block_bytes = layout.ChunkBytes(ChunkType::kMaster, DType::kF16);
  // One pool per device and block size; the accelerator holds at most two param chunks.
  ChunkBlockPoolOptions param_blocks;
  param_blocks.block_bytes = param_block_bytes;
  ChunkBlockPoolOptions state_blocks;
  state_blocks.block_bytes = state_block_bytes;
  ChunkBlockPoolOptions device_param_blocks = param_blocks;
  device_param_blocks.max_blocks = 2;
  ASSERT_OK_AND_ASSIGN(auto host_params, ChunkBlockPool::Create(&host_memory, param_blocks));
  ASSERT_OK_AND_ASSIGN(auto host_states, ChunkBlockPool::Create(&host_memory, state_blocks));
  ASSERT_OK_AND_ASSIGN(auto device_params,
                       ChunkBlockPool::Create(&device_memory, device_param_blocks));
  ASSERT_OK_AND_ASSIGN(auto store, ChunkStore::Create(std::move(layout), {}));
  ASSERT_GE(store->num_chunks(), 3);

  // Every chunk on the host; each parameter written once (FREE -> COMPUTE zero-fills, then the
  // "initializer" writes), then HOLD.
  std::vector<std::vector<uint8_t>> expected(store->num_chunks());
  for (int64_t i = 0; i < store->num_chunks(); ++i) {
    Chunk& param = store->chunk(ChunkType::kParam, i);
    ASSERT_OK(param.AllocatePayload(*host_params));
    for (ChunkType type : {ChunkType::kMaster, ChunkType::kMomentum, ChunkType::kVariance}) {
      ASSERT_OK(store->chunk(type, i).AllocatePayload(*host_states));
    }
    for (int slot = 0; slot < param.num_tensors(); ++slot) {
      ASSERT_OK(param.SetTensorState(slot, TensorState::kCompute));
      ASSERT_OK_AND_ASSIGN(TensorView view, param.View(slot));
      std::memset(view.data, static_cast<int>(i * 16 + slot + 1), view.bytes());
      ASSERT_OK(param.SetTensorState(slot, TensorState::kHold));
    }
    const auto* bytes = static_cast<const uint8_t*>(param.payload());
    expected[i].assign(bytes, bytes + param.capacity_bytes());
  }
  EXPECT_EQ(host_params->stats().blocks_in_use, store->num_chunks());

  // Walk the chunks over the two-chunk accelerator the way forward does: bring chunk i in,
  // evicting chunk i - 2 first.
  for (int64_t i = 0; i < store->num_chunks(); ++i) {
    if (i >= 2) {
      ASSERT_OK(store->chunk(ChunkType::kParam, i - 2).MoveTo(*host_params, *stream));
    }
    Chunk& param = store->chunk(ChunkType::kParam, i);
    ASSERT_OK(param.MoveTo(*device_params, *stream));
    EXPECT_EQ(param.device(), backend->device());
  }
  // A third chunk does not fit: the pool's limit surfaces as ResourceExhausted, nothing moves.
  Chunk& first = store->chunk(ChunkType::kParam, 0);
  EXPECT_THAT(first.MoveTo(*device_params, *stream),
              StatusIs(absl::StatusCode::kResourceExhausted, "moving chunk param#0"));
  EXPECT_TRUE(first.device().is_host());
  // Device blocks were reused, never more than two taken from the device.
  EXPECT_EQ(device_params->stats().upstream_allocations, 2);
  EXPECT_GT(device_params->stats().cache_hits, 0);

  // Everything back on the host, bit-exact.
  for (int64_t i = 0; i < store->num_chunks(); ++i) {
    Chunk& param = store->chunk(ChunkType::kParam, i);
    ASSERT_OK(param.MoveTo(*host_params, *stream));
    const auto* bytes = static_cast<const uint8_t*>(param.payload());
    EXPECT_EQ(std::vector<uint8_t>(bytes, bytes + param.capacity_bytes()), expected[i]) << i;
  }
  EXPECT_EQ(device_params->stats().blocks_in_use, 0);
  EXPECT_EQ(backend->counters().host_to_device_bytes, store->num_chunks() * param_block_bytes);

  // Releasing every payload returns every block.
  for (int64_t i = 0; i < store->num_chunks(); ++i) {
    for (ChunkType type : kAllChunkTypes) ASSERT_OK(store->chunk(type, i).ReleasePayload());
  }
  EXPECT_EQ(host_params->stats().blocks_in_use, 0);
  EXPECT_EQ(host_states->stats().blocks_in_use, 0);
}

}  // namespace
}  // namespace ps
