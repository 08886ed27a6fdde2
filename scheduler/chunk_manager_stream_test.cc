// The ChunkManager under asynchronous compute (scheduler/chunk_manager.h, "Stream order"): the
// harness's compute stream is held (StallCpuStream, or every stream until the host waits), a
// "kernel" is queued on it that reads or writes a chunk, and the manager is made to move, drop,
// write back or free that chunk. Whatever the manager does, the kernel must see the bytes the
// chunk held at its access and its writes must survive; and an access must not make the host wait
// for its loads when the compute stream can wait instead.
#include <algorithm>
#include <atomic>
#include <cstdint>
#include <cstring>
#include <functional>
#include <memory>
#include <vector>

#include "base/status_macros.h"
#include "base/testing/status_matchers.h"
#include "chunk/chunk_store.h"
#include "chunk/chunk_type.h"
#include "chunk/tensor_state.h"
#include "gtest/gtest.h"
#include "memory/caching_allocator.h"
#include "memory/cpu_backend.h"
#include "memory/device.h"
#include "scheduler/chunk_manager.h"
#include "scheduler/metronome.h"
#include "scheduler/testing/training_harness.h"

namespace ps {
namespace {

constexpr int64_t kChunkElems = 1024;  // 4 KiB chunks (f32)
constexpr int64_t kChunkBytes = kChunkElems * 4;

// op0 and op1 share chunk 0 (half each); op2 is the whole of chunk 1.
constexpr OperatorId kOp2 = 2;
constexpr int64_t kChunkOfOp2 = 1;

absl::StatusOr<std::unique_ptr<TrainingHarness>> MakeHarness(HarnessConfig config) {
  config.cap_bytes = 4 * kChunkBytes;
  config.options.warmup_chunk_fraction = 0.5;
  ASSIGN_OR_RETURN(
      std::unique_ptr<TrainingHarness> h,
      TrainingHarness::Create({.chunk_elems = kChunkElems,
                               .op_numels = {kChunkElems / 2, kChunkElems / 2, kChunkElems}},
                              config));
  RETURN_IF_ERROR(h->Initialize());
  return h;
}

// Every stream holds its work until the host waits for the backend.
HarnessConfig HeldStreams(bool compute_stream) {
  HarnessConfig config;
  config.give_compute_stream = compute_stream;
  config.stall_streams_until_host_waits = true;
  return config;
}

TensorId TensorOf(TrainingHarness& h, OperatorId op) {
  return h.store().layout().op(op).tensors.front();
}

// Bytes a queued "backward kernel" writes: distinct from anything the harness writes.
std::vector<uint8_t> KernelBytes(int64_t bytes) {
  std::vector<uint8_t> out(static_cast<size_t>(bytes));
  for (size_t i = 0; i < out.size(); ++i) out[i] = static_cast<uint8_t>(0xA5 ^ (i * 7));
  return out;
}

// Reads `op`'s tensor on the host (it must be there).
absl::StatusOr<std::vector<uint8_t>> HostBytes(TrainingHarness& h, OperatorId op) {
  ASSIGN_OR_RETURN(const TensorView view, h.store().View(ChunkType::kParam, TensorOf(h, op)));
  if (!view.device.is_host()) return absl::InternalError("the tensor is not on the host");
  const uint8_t* p = static_cast<const uint8_t*>(view.data);
  return std::vector<uint8_t>(p, p + view.bytes());
}

// A kernel queued behind a stall that copies a chunk's bytes when it finally runs.
struct QueuedReader {
  std::vector<uint8_t> seen;
  std::atomic<bool> ran{false};
};

absl::Status QueueRead(Stream& stream, const TensorView& view, QueuedReader* reader) {
  const uint8_t* p = static_cast<const uint8_t*>(view.data);
  const int64_t n = view.bytes();
  return stream.LaunchHostFunc([p, n, reader] {
    reader->seen.assign(p, p + n);
    reader->ran.store(true);
  });
}

absl::Status QueueWrite(Stream& stream, const TensorView& view, std::vector<uint8_t> bytes) {
  uint8_t* p = static_cast<uint8_t*>(view.data);
  return stream.LaunchHostFunc(
      [p, bytes = std::move(bytes)] { std::memcpy(p, bytes.data(), bytes.size()); });
}

// --- Loads order themselves with events ----------------------------------------------------------

TEST(ChunkManagerStreamOrder, AccessReturnsBeforeTheLoadAndTheKernelSeesTheLoadedBytes) {
  ASSERT_OK_AND_ASSIGN(auto h, MakeHarness(HeldStreams(/*compute_stream=*/true)));
  ChunkManager& m = h->manager();
  const std::vector<uint8_t> expected = h->ExpectedBytes(ChunkType::kParam, TensorOf(*h, kOp2));
  const int64_t stall_before = m.counters().stall_ns;
  ASSERT_OK(m.Access(kOp2, Stage::kForward));
  ASSERT_OK_AND_ASSIGN(const TensorView view, h->store().View(ChunkType::kParam, TensorOf(*h, 2)));
  ASSERT_EQ(view.device, m.accelerator_device());
  // Nothing waited on the host, so the held load stream has not copied a byte yet.
  EXPECT_NE(std::memcmp(view.data, expected.data(), expected.size()), 0)
      << "Access waited on the host for the load";
  EXPECT_EQ(m.counters().stream_ordered_waits, 1);
  EXPECT_EQ(m.counters().stall_ns, stall_before);
  // A kernel enqueued after the access runs after the load.
  QueuedReader reader;
  ASSERT_OK(QueueRead(h->compute_stream(), view, &reader));
  ASSERT_OK(h->compute_stream().Synchronize());
  EXPECT_TRUE(reader.ran.load());
  EXPECT_EQ(reader.seen, expected) << "the kernel ran before the chunk's load completed";
  ASSERT_OK(m.Release(kOp2, Stage::kForward));
}

TEST(ChunkManagerStreamOrder, ZeroFillOfAFreshTensorIsStreamOrderedToo) {
  ASSERT_OK_AND_ASSIGN(auto h, MakeHarness(HeldStreams(/*compute_stream=*/true)));
  ChunkManager& m = h->manager();
  // Free op2's tensor: the next access zero-fills it (on the load stream).
  ASSERT_OK(m.AccessChunks(kChunkOfOp2, {ChunkType::kParam}, Device::Host(), AccessMode::kRead));
  ASSERT_OK(m.ReleaseChunks(kChunkOfOp2, {ChunkType::kParam}));
  ASSERT_OK(h->store().SetOperatorState(ChunkType::kParam, kOp2, TensorState::kFree));
  ASSERT_OK(m.Access(kOp2, Stage::kBackward));
  ASSERT_OK_AND_ASSIGN(const TensorView view, h->store().View(ChunkType::kParam, TensorOf(*h, 2)));
  QueuedReader reader;
  ASSERT_OK(QueueRead(h->compute_stream(), view, &reader));
  ASSERT_OK(h->compute_stream().Synchronize());
  EXPECT_EQ(reader.seen, std::vector<uint8_t>(reader.seen.size(), 0));
  ASSERT_OK(m.Release(kOp2, Stage::kBackward));
}

TEST(ChunkManagerStreamOrder, WithoutAComputeStreamAccessStillWaitsOnTheHost) {
  ASSERT_OK_AND_ASSIGN(auto h, MakeHarness(HeldStreams(/*compute_stream=*/false)));
  ChunkManager& m = h->manager();
  const std::vector<uint8_t> expected = h->ExpectedBytes(ChunkType::kParam, TensorOf(*h, kOp2));
  ASSERT_OK(m.Access(kOp2, Stage::kForward));
  ASSERT_OK_AND_ASSIGN(const TensorView view, h->store().View(ChunkType::kParam, TensorOf(*h, 2)));
  EXPECT_EQ(std::memcmp(view.data, expected.data(), expected.size()), 0);
  EXPECT_EQ(m.counters().stream_ordered_waits, 0);
  ASSERT_OK(m.Release(kOp2, Stage::kForward));
}

// --- Nothing moves under a queued kernel ---------------------------------------------------------

// Accesses op2 in `stage` and queues, behind a stall of the compute stream, a kernel on its chunk
// (a reader in FWD, a writer of `written` in BWD); then releases it.
struct Queued {
  std::unique_ptr<CpuStreamStall> stall;
  QueuedReader reader;
  std::vector<uint8_t> written;
};

void AccessAndQueue(TrainingHarness& h, Stage stage, Queued& q) {
  ChunkManager& m = h.manager();
  ASSERT_OK(m.Access(kOp2, stage));
  ASSERT_OK_AND_ASSIGN(const TensorView view, h.store().View(ChunkType::kParam, TensorOf(h, 2)));
  ASSERT_EQ(view.device, m.accelerator_device());
  // The load is done before the stall (its completion is not what is tested here, and a host
  // wait for it later would end the stall).
  ASSERT_OK(h.compute_stream().Synchronize());
  ASSERT_OK_AND_ASSIGN(q.stall, StallCpuStream(h.compute_stream()));
  ASSERT_OK(QueueRead(h.compute_stream(), view, &q.reader));
  if (stage == Stage::kBackward) {
    q.written = KernelBytes(view.bytes());
    ASSERT_OK(QueueWrite(h.compute_stream(), view, q.written));
  }
  ASSERT_OK(m.Release(kOp2, stage));
  ASSERT_TRUE(q.stall->active()) << "the release waited for the compute stream";
}

TEST(ChunkManagerStreamOrder, CleanDropWaitsForTheQueuedReader) {
  ASSERT_OK_AND_ASSIGN(auto h, MakeHarness(HarnessConfig()));
  const std::vector<uint8_t> expected = h->ExpectedBytes(ChunkType::kParam, TensorOf(*h, kOp2));
  Queued q;
  AccessAndQueue(*h, Stage::kForward, q);
  ChunkManager& m = h->manager();
  // The optimizer takes the chunk on the host: a clean drop of the accelerator copy.
  ASSERT_OK(m.AccessChunks(kChunkOfOp2, {ChunkType::kParam}, Device::Host(), AccessMode::kRead));
  EXPECT_EQ(m.counters().Total().clean_evictions, 1);
  EXPECT_TRUE(q.reader.ran.load())
      << "the accelerator copy was dropped before the queued kernel read it";
  ASSERT_OK(m.ReleaseChunks(kChunkOfOp2, {ChunkType::kParam}));
  // Its block is reused at once by the next load.
  ASSERT_OK(m.Access(0, Stage::kForward));
  q.stall->Release();
  ASSERT_OK(h->compute_stream().Synchronize());
  EXPECT_EQ(q.reader.seen, expected);
  ASSERT_OK(m.Release(0, Stage::kForward));
}

TEST(ChunkManagerStreamOrder, DirtyWriteBackKeepsTheQueuedWrite) {
  ASSERT_OK_AND_ASSIGN(auto h, MakeHarness(HarnessConfig()));
  Queued q;
  AccessAndQueue(*h, Stage::kBackward, q);
  ChunkManager& m = h->manager();
  ASSERT_OK(m.AccessChunks(kChunkOfOp2, {ChunkType::kParam}, Device::Host(), AccessMode::kRead));
  EXPECT_EQ(m.counters().Total().write_backs, 1);
  EXPECT_THAT(HostBytes(*h, kOp2), IsOkAndHolds(q.written))
      << "the write-back copied the chunk before backward's queued kernel wrote it";
  ASSERT_OK(m.ReleaseChunks(kChunkOfOp2, {ChunkType::kParam}));
}

TEST(ChunkManagerStreamOrder, EvictionUnderPressureWaitsForTheQueuedWriter) {
  ASSERT_OK_AND_ASSIGN(auto h, MakeHarness(HarnessConfig()));
  ChunkManager& m = h->manager();
  ASSERT_OK(m.Access(0, Stage::kForward));
  Queued q;
  AccessAndQueue(*h, Stage::kBackward, q);
  // The activation does not fit beside two chunks: the reclaimer evicts chunk 1 (op0's chunk is
  // in COMPUTE).
  ASSERT_OK_AND_ASSIGN(void* act, h->accelerator().scratch()->Allocate(2 * kChunkBytes + 2048));
  EXPECT_EQ(m.counters().pressure_evictions, 1);
  EXPECT_TRUE(q.reader.ran.load()) << "the chunk was evicted before the queued kernel ran";
  ASSERT_OK(m.Release(0, Stage::kForward));
  ASSERT_OK(h->accelerator().scratch()->Deallocate(act, 2 * kChunkBytes + 2048));
  ASSERT_OK(m.AccessChunks(kChunkOfOp2, {ChunkType::kParam}, Device::Host(), AccessMode::kRead));
  EXPECT_THAT(HostBytes(*h, kOp2), IsOkAndHolds(q.written));
  ASSERT_OK(m.ReleaseChunks(kChunkOfOp2, {ChunkType::kParam}));
}

// A tracked program where op2's chunk is not used again after its backward: after the warm-up,
// its BWD release starts a write-behind.
void RunTrackedIteration(ChunkManager& m, const std::function<void()>& at_op2_backward) {
  ASSERT_OK(m.BeginIteration());
  for (OperatorId op : {0, 1, 2}) {
    ASSERT_OK(m.Access(op, Stage::kForward));
    ASSERT_OK(m.Release(op, Stage::kForward));
  }
  at_op2_backward();
  for (OperatorId op : {1, 0}) {
    ASSERT_OK(m.Access(op, Stage::kBackward));
    ASSERT_OK(m.Release(op, Stage::kBackward));
  }
  ASSERT_OK(m.EndIteration());
}

TEST(ChunkManagerStreamOrder, WriteBehindWaitsOnTheStreamForTheQueuedWriter) {
  ASSERT_OK_AND_ASSIGN(auto h, MakeHarness(HarnessConfig()));
  ChunkManager& m = h->manager();
  RunTrackedIteration(m, [&] {
    ASSERT_OK(m.Access(kOp2, Stage::kBackward));
    ASSERT_OK(m.Release(kOp2, Stage::kBackward));
  });
  Queued q;
  int64_t write_behinds = 0;
  RunTrackedIteration(m, [&] {
    AccessAndQueue(*h, Stage::kBackward, q);
    write_behinds = m.counters().write_behinds;
    // The write-behind started without a host wait.
    EXPECT_TRUE(q.stall->active());
  });
  ASSERT_EQ(write_behinds, 1);
  q.stall->Release();
  // The write-behind made the chunk clean: taking it to the host is a drop, and the host copy must
  // hold what the kernel wrote.
  ASSERT_OK(m.AccessChunks(kChunkOfOp2, {ChunkType::kParam}, Device::Host(), AccessMode::kRead));
  EXPECT_THAT(HostBytes(*h, kOp2), IsOkAndHolds(q.written))
      << "the write-behind copied the chunk before backward's queued kernel wrote it";
  ASSERT_OK(m.ReleaseChunks(kChunkOfOp2, {ChunkType::kParam}));
}

TEST(ChunkManagerStreamOrder, PrefetchEvictingAVictimWaitsForItsQueuedReader) {
  // Four operators of one chunk each on a device of four chunks, one chunk of it taken by an
  // activation for the whole run: three chunks fit. Forward 0..3 then backward 3..0: at op2's
  // forward the prefetch of chunk 3 evicts chunk 0 (used again last), whose queued reader (op0's
  // forward kernel) has not run yet.
  HarnessConfig config;
  config.cap_bytes = 4 * kChunkBytes;
  config.options.warmup_chunk_fraction = 0.5;
  ASSERT_OK_AND_ASSIGN(
      auto h,
      TrainingHarness::Create({.chunk_elems = kChunkElems,
                               .op_numels = {kChunkElems, kChunkElems, kChunkElems, kChunkElems}},
                              config));
  ASSERT_OK(h->Initialize());
  ChunkManager& m = h->manager();
  ASSERT_OK_AND_ASSIGN(void* act, h->accelerator().scratch()->Allocate(kChunkBytes));
  const auto iteration = [&](const std::function<void(OperatorId)>& after_forward_access) {
    ASSERT_OK(m.BeginIteration());
    for (OperatorId op : {0, 1, 2, 3}) {
      ASSERT_OK(m.Access(op, Stage::kForward));
      after_forward_access(op);
      ASSERT_OK(m.Release(op, Stage::kForward));
    }
    for (OperatorId op : {3, 2, 1, 0}) {
      ASSERT_OK(m.Access(op, Stage::kBackward));
      ASSERT_OK(m.Release(op, Stage::kBackward));
    }
    ASSERT_OK(m.EndIteration());
  };
  iteration([](OperatorId) {});
  // Backward left chunks 0 and 1 dirty on the accelerator; bring them home so that the next
  // forward loads them clean (a prefetch only evicts clean chunks).
  for (int64_t index : {0, 1}) {
    ASSERT_OK(m.AccessChunks(index, {ChunkType::kParam}, Device::Host(), AccessMode::kRead));
    ASSERT_OK(m.ReleaseChunks(index, {ChunkType::kParam}));
  }
  const std::vector<uint8_t> expected = h->ExpectedBytes(ChunkType::kParam, TensorOf(*h, 0));
  std::unique_ptr<CpuStreamStall> stall;
  QueuedReader reader;
  int64_t evictions_before = 0, prefetches_before = 0;
  bool evicted_by_prefetch = false;
  iteration([&](OperatorId op) {
    if (op == 0) {
      ASSERT_OK_AND_ASSIGN(const TensorView view, h->store().View(ChunkType::kParam, 0));
      ASSERT_OK(h->compute_stream().Synchronize());
      ASSERT_OK_AND_ASSIGN(stall, StallCpuStream(h->compute_stream()));
      ASSERT_OK(QueueRead(h->compute_stream(), view, &reader));
    }
    if (op == 1) {
      ASSERT_TRUE(stall->active());
      evictions_before = m.counters().Total().clean_evictions;
      prefetches_before = m.counters().prefetches;
    }
    if (op == 2) {
      // Access(op2) prefetched chunk 3 and made room by dropping chunk 0.
      const std::vector<int64_t> resident = m.ResidentChunkKeys();
      evicted_by_prefetch = m.counters().prefetches > prefetches_before &&
                            m.counters().Total().clean_evictions > evictions_before &&
                            std::find(resident.begin(), resident.end(),
                                      m.ChunkKey({ChunkType::kParam, 0})) == resident.end();
      EXPECT_TRUE(reader.ran.load()) << "chunk 0 was dropped before its queued reader ran";
    }
  });
  ASSERT_TRUE(evicted_by_prefetch) << "the program no longer makes the prefetch evict chunk 0";
  stall->Release();
  ASSERT_OK(h->compute_stream().Synchronize());
  EXPECT_EQ(reader.seen, expected);
  ASSERT_OK(h->accelerator().scratch()->Deallocate(act, kChunkBytes));
}

TEST(ChunkManagerStreamOrder, DestructorWaitsForTheQueuedKernel) {
  ASSERT_OK_AND_ASSIGN(auto h, MakeHarness(HarnessConfig()));
  Queued q;
  AccessAndQueue(*h, Stage::kBackward, q);
  h->DestroyManager();
  EXPECT_TRUE(q.reader.ran.load()) << "the manager was destroyed before the compute stream ran";
}

TEST(ChunkManagerStreamOrder, RandomProgramsStayCorrectWhileEveryStreamIsHeld) {
  // The harness verifies every tensor's bytes through the compute stream after each access and
  // writes new ones in backward; with every stream held until the host waits, any missing order
  // between a load, a kernel and an eviction shows up as wrong bytes.
  for (bool prefetch : {false, true}) {
    HarnessConfig config;
    config.stall_streams_until_host_waits = true;
    config.options.prefetch = prefetch;
    ASSERT_OK_AND_ASSIGN(auto h, MakeHarness(config));
    HarnessProgram program;
    for (OperatorId op : {0, 1, 2}) {
      program.steps.push_back({.op = op, .stage = Stage::kForward, .keep_bytes = 1024});
    }
    for (OperatorId op : {2, 1, 0}) {
      program.steps.push_back(
          {.op = op, .stage = Stage::kBackward, .free_kept_of = op, .write = true});
    }
    program.adam = true;
    for (int it = 0; it < 4; ++it) ASSERT_OK(h->RunIteration(program)) << "iteration " << it;
    EXPECT_GT(h->verified_tensors(), 0);
  }
}

}  // namespace
}  // namespace ps
