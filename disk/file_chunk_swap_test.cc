#include "disk/file_chunk_swap.h"

#include <fcntl.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <iostream>
#include <memory>
#include <string>
#include <vector>

#include "absl/random/distributions.h"
#include "absl/strings/str_cat.h"
#include "base/testing/status_matchers.h"
#include "base/testing/test_rng.h"
#include "disk/io_engine.h"
#include "disk/testing/counting_io_engine.h"
#include "disk/testing/faulty_io_engine.h"
#include "disk/testing/io_uring_gate.h"
#include "disk/testing/scoped_test_dir.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "memory/resources.h"

namespace ps {
namespace {

using ::testing::AnyOf;
using ::testing::HasSubstr;

// A host buffer starting `misalign` bytes past a page boundary.
class Buffer {
 public:
  explicit Buffer(int64_t bytes, int64_t misalign = 0)
      : base_(static_cast<char*>(std::aligned_alloc(
            4096, static_cast<size_t>((bytes + misalign + 4095) / 4096 * 4096)))),
        bytes_(bytes),
        misalign_(misalign) {
    CHECK(base_ != nullptr);
  }
  ~Buffer() { std::free(base_); }
  Buffer(const Buffer&) = delete;
  Buffer& operator=(const Buffer&) = delete;

  char* data() { return base_ + misalign_; }
  int64_t bytes() const { return bytes_; }
  void Fill(TestRng& rng) {
    // Eight random bytes per draw: the sanitizer builds run this test at -O0.
    for (int64_t i = 0; i < bytes_; i += 8) {
      const uint64_t word = rng();
      std::memcpy(data() + i, &word, static_cast<size_t>(std::min<int64_t>(8, bytes_ - i)));
    }
  }
  bool Equals(const std::vector<char>& expected) {
    return static_cast<int64_t>(expected.size()) == bytes_ &&
           std::memcmp(data(), expected.data(), expected.size()) == 0;
  }

 private:
  char* base_;
  int64_t bytes_;
  int64_t misalign_;
};

struct SwapConfig {
  IoEngineKind engine;
  bool direct;
};

std::string ConfigName(const ::testing::TestParamInfo<SwapConfig>& info) {
  return absl::StrCat(info.param.engine == IoEngineKind::kIoUring ? "io_uring" : "threads",
                      info.param.direct ? "_direct" : "_buffered");
}

class FileChunkSwapTest : public ::testing::TestWithParam<SwapConfig> {
 protected:
  void SetUp() override {
    if (GetParam().engine == IoEngineKind::kIoUring) {
      const std::string refusal = IoUringRefusal();
      if (!refusal.empty()) GTEST_SKIP() << "io_uring is refused here: " << refusal;
    }
  }

  FileChunkSwapOptions Options(const std::string& dir) const {
    FileChunkSwapOptions o;
    o.dir = dir;
    o.engine = GetParam().engine;
    o.direct = GetParam().direct;
    o.block_size = 64 << 10;
    o.queue_depth = 4;
    o.thread_count = 2;
    return o;
  }
};

// Writes every slot with fresh random bytes and reads them all back, all I/Os of a phase in flight
// at once and waited for in random order, for a few rounds.
void RoundTrips(ChunkSwap& swap, const std::vector<int64_t>& sizes, TestRng& rng, int rounds,
                int64_t misalign) {
  const int n = static_cast<int>(sizes.size());
  std::vector<std::vector<char>> expected(static_cast<size_t>(n));
  std::vector<int> order(static_cast<size_t>(n));
  for (int i = 0; i < n; ++i) order[static_cast<size_t>(i)] = i;
  for (int round = 0; round < rounds; ++round) {
    std::vector<std::unique_ptr<Buffer>> src;
    std::vector<IoTicket> tickets(static_cast<size_t>(n));
    std::shuffle(order.begin(), order.end(), rng);
    for (int k : order) {
      src.push_back(
          std::make_unique<Buffer>(sizes[static_cast<size_t>(k)], misalign == 0 ? 0 : (k % 7) + 1));
      src.back()->Fill(rng);
      expected[static_cast<size_t>(k)].assign(src.back()->data(),
                                              src.back()->data() + src.back()->bytes());
      ASSERT_OK_AND_ASSIGN(tickets[static_cast<size_t>(k)], swap.StartWrite(k, src.back()->data()));
    }
    std::shuffle(order.begin(), order.end(), rng);
    for (int k : order) {
      ASSERT_OK(swap.Wait(tickets[static_cast<size_t>(k)]));
      EXPECT_TRUE(swap.written(k));
    }
    std::vector<std::unique_ptr<Buffer>> dst(static_cast<size_t>(n));
    std::shuffle(order.begin(), order.end(), rng);
    for (int k : order) {
      dst[static_cast<size_t>(k)] = std::make_unique<Buffer>(
          sizes[static_cast<size_t>(k)], misalign == 0 ? 0 : ((k + round) % 5) + 1);
      std::memset(dst[static_cast<size_t>(k)]->data(), 0x5a,
                  static_cast<size_t>(sizes[static_cast<size_t>(k)]));
      ASSERT_OK_AND_ASSIGN(tickets[static_cast<size_t>(k)],
                           swap.StartRead(k, dst[static_cast<size_t>(k)]->data()));
    }
    std::shuffle(order.begin(), order.end(), rng);
    for (int k : order) {
      // Poll until done for some, Wait directly for the others.
      if (k % 2 == 0) {
        while (!swap.Poll(tickets[static_cast<size_t>(k)])) ::usleep(50);
      }
      ASSERT_OK(swap.Wait(tickets[static_cast<size_t>(k)]));
      EXPECT_TRUE(dst[static_cast<size_t>(k)]->Equals(expected[static_cast<size_t>(k)]))
          << "slot " << k << " of " << sizes[static_cast<size_t>(k)] << " bytes, round " << round;
    }
  }
}

std::vector<int64_t> AwkwardSizes(TestRng& rng, int n) {
  std::vector<int64_t> sizes = {1, 4095, 4096, 4097, 65536, 65537, 3 * 65536 + 4096 + 13};
  while (static_cast<int>(sizes.size()) < n) {
    sizes.push_back(absl::Uniform<int64_t>(rng, 1, 300 << 10));
  }
  std::shuffle(sizes.begin(), sizes.end(), rng);
  return sizes;
}

TEST_P(FileChunkSwapTest, RandomRoundTrips) {
  ScopedTestDir dir;
  ASSERT_OK_AND_ASSIGN(std::unique_ptr<ChunkSwap> swap, OpenFileChunkSwap(Options(dir.path())));
  TestRng rng(1);
  const std::vector<int64_t> sizes = AwkwardSizes(rng, 20);
  int64_t total = 0;
  for (size_t k = 0; k < sizes.size(); ++k) {
    ASSERT_OK(swap->AddSlot(static_cast<int64_t>(k), sizes[k], absl::StrCat("master#", k)));
    EXPECT_EQ(swap->slot_bytes(static_cast<int64_t>(k)), sizes[k]);
    total += (sizes[k] + 4095) / 4096 * 4096;
  }
  const ChunkSwapInfo info = swap->info();
  EXPECT_EQ(info.file_bytes, total);
  EXPECT_EQ(std::filesystem::file_size(info.path), static_cast<uintmax_t>(total));
  EXPECT_EQ(info.engine, GetParam().engine == IoEngineKind::kIoUring ? "io_uring" : "threads");
  // The test directory's filesystem (ext4 or xfs on CI) takes O_DIRECT; elsewhere the note says
  // why.
  if (GetParam().direct && !info.direct) {
    EXPECT_THAT(info.direct_note, HasSubstr("refuses O_DIRECT"));
  }
  if (!GetParam().direct) {
    EXPECT_FALSE(info.direct);
  }
  RoundTrips(*swap, sizes, rng, 3, /*misalign=*/0);
  const ChunkSwapCounters c = swap->counters();
  EXPECT_EQ(c.writes, 3 * static_cast<int64_t>(sizes.size()));
  EXPECT_EQ(c.reads, 3 * static_cast<int64_t>(sizes.size()));
  int64_t bytes = 0;
  for (int64_t s : sizes) bytes += s;
  EXPECT_EQ(c.write_bytes, 3 * bytes);
  EXPECT_EQ(c.read_bytes, 3 * bytes);
  const std::string path = info.path;
  swap.reset();
  EXPECT_FALSE(std::filesystem::exists(path));
  EXPECT_TRUE(std::filesystem::is_empty(dir.path()));
}

TEST_P(FileChunkSwapTest, MisalignedBuffersGoBufferedAndStayCorrect) {
  ScopedTestDir dir;
  ASSERT_OK_AND_ASSIGN(std::unique_ptr<ChunkSwap> swap, OpenFileChunkSwap(Options(dir.path())));
  TestRng rng(2);
  const std::vector<int64_t> sizes = AwkwardSizes(rng, 10);
  for (size_t k = 0; k < sizes.size(); ++k) {
    ASSERT_OK(swap->AddSlot(static_cast<int64_t>(k), sizes[k], absl::StrCat("momentum#", k)));
  }
  RoundTrips(*swap, sizes, rng, 2, /*misalign=*/1);
  if (swap->info().direct) {
    EXPECT_GT(swap->counters().buffered_requests, 0);
  } else {
    EXPECT_EQ(swap->counters().buffered_requests, 0);
  }
}

TEST_P(FileChunkSwapTest, AioKnobs) {
  for (const bool single_submit : {false, true}) {
    for (const bool overlap_events : {false, true}) {
      SCOPED_TRACE(
          absl::StrCat("single_submit ", single_submit, " overlap_events ", overlap_events));
      ScopedTestDir dir;
      FileChunkSwapOptions o = Options(dir.path());
      o.single_submit = single_submit;
      o.overlap_events = overlap_events;
      o.queue_depth = 3;
      o.block_size = 16 << 10;
      ASSERT_OK_AND_ASSIGN(std::unique_ptr<ChunkSwap> swap, OpenFileChunkSwap(o));
      TestRng rng(3);
      const std::vector<int64_t> sizes = AwkwardSizes(rng, 8);
      for (size_t k = 0; k < sizes.size(); ++k) {
        ASSERT_OK(swap->AddSlot(static_cast<int64_t>(k), sizes[k], absl::StrCat("variance#", k)));
      }
      RoundTrips(*swap, sizes, rng, 1, /*misalign=*/0);
    }
  }
}

// The aio knobs observed at the I/O seam (a CountingIoEngine under the swap): block_size sets
// every request's size, queue_depth bounds (and fills) what is in flight, single_submit submits
// requests one by one, overlap_events reaps one completion at a time instead of whole batches.
// A knob the swap ignored (or replaced by its default) fails here.
struct KnobCase {
  int64_t block_size;
  int queue_depth;
  bool single_submit;
  bool overlap_events;
};

TEST_P(FileChunkSwapTest, AioKnobsReachTheEngine) {
  for (const KnobCase k : {KnobCase{16 << 10, 3, false, true}, KnobCase{8 << 10, 5, true, true},
                           KnobCase{32 << 10, 1, false, false}, KnobCase{4 << 10, 4, false, false},
                           KnobCase{12 << 10, 2, true, false}}) {
    SCOPED_TRACE(absl::StrCat("block_size ", k.block_size, ", queue_depth ", k.queue_depth,
                              ", single_submit ", k.single_submit, ", overlap_events ",
                              k.overlap_events));
    ScopedTestDir dir;
    FileChunkSwapOptions o = Options(dir.path());
    o.block_size = k.block_size;
    o.queue_depth = k.queue_depth;
    o.single_submit = k.single_submit;
    o.overlap_events = k.overlap_events;
    std::shared_ptr<IoRecords> records;
    o.wrap_engine_for_test = [&records](std::unique_ptr<IoEngine> inner) {
      auto counting = std::make_unique<CountingIoEngine>(std::move(inner));
      records = counting->records();
      return counting;
    };
    ASSERT_OK_AND_ASSIGN(std::unique_ptr<ChunkSwap> swap, OpenFileChunkSwap(o));
    ASSERT_NE(records, nullptr) << "the seam was not called";
    // Two slots of whole blocks (more blocks than the queue is deep), each written then read.
    constexpr int kBlocks = 12;
    const int64_t bytes = kBlocks * k.block_size;
    ASSERT_OK(swap->AddSlot(0, bytes, "master#0"));
    ASSERT_OK(swap->AddSlot(1, bytes, "master#1"));
    EXPECT_EQ(records->allocate_calls, 2);
    TestRng rng(8);
    Buffer a(bytes), b(bytes), back(bytes);
    a.Fill(rng);
    b.Fill(rng);
    ASSERT_OK_AND_ASSIGN(IoTicket ta, swap->StartWrite(0, a.data()));
    ASSERT_OK_AND_ASSIGN(IoTicket tb, swap->StartWrite(1, b.data()));
    ASSERT_OK(swap->Wait(ta));
    ASSERT_OK(swap->Wait(tb));
    ASSERT_OK_AND_ASSIGN(ta, swap->StartRead(1, back.data()));
    ASSERT_OK(swap->Wait(ta));
    EXPECT_EQ(std::memcmp(back.data(), b.data(), static_cast<size_t>(bytes)), 0);
    swap.reset();  // no I/O in flight from here: the record is complete

    const IoRecords& r = *records;
    // block_size: each slot's I/O is kBlocks requests of exactly block_size, covering the slot.
    ASSERT_EQ(r.requests.size(), static_cast<size_t>(3 * kBlocks));
    int writes = 0;
    int64_t covered = 0;
    for (const IoRecords::Request& q : r.requests) {
      EXPECT_EQ(q.bytes, k.block_size);
      EXPECT_EQ(q.offset % k.block_size, 0);
      writes += q.write ? 1 : 0;
      covered += q.bytes;
    }
    EXPECT_EQ(writes, 2 * kBlocks);
    EXPECT_EQ(covered, 3 * bytes);
    // queue_depth: never more in flight, and filled: a slot's requests are queued at once.
    EXPECT_EQ(r.max_in_flight, k.queue_depth);
    EXPECT_EQ(r.in_flight, 0);
    for (const IoRecords::Submission& s : r.submissions) {
      EXPECT_LE(s.in_flight_before + s.requests, k.queue_depth);
      EXPECT_GE(s.requests, 1);
    }
    // single_submit: one request per Submit; batched, the first Submit fills the queue.
    ASSERT_FALSE(r.submissions.empty());
    if (k.single_submit) {
      EXPECT_EQ(r.submissions.size(), r.requests.size());
    } else {
      EXPECT_EQ(r.submissions.front().requests, k.queue_depth);
      if (k.queue_depth > 1) {
        EXPECT_LT(r.submissions.size(), r.requests.size());
      }
    }
    // overlap_events: reap one completion and refill; without it, wait for the whole batch and
    // submit the next one only onto an empty queue.
    ASSERT_FALSE(r.reapings.empty());
    bool waited_for_one_of_several = false;
    for (const IoRecords::Reaping& p : r.reapings) {
      EXPECT_GE(p.in_flight, 1);
      if (k.overlap_events) {
        EXPECT_EQ(p.min_completions, 1);
        waited_for_one_of_several |= p.in_flight > 1;
      } else {
        EXPECT_EQ(p.min_completions, p.in_flight);
      }
    }
    if (k.overlap_events && k.queue_depth > 1) {
      EXPECT_TRUE(waited_for_one_of_several);
    }
    if (!k.overlap_events && !k.single_submit) {
      for (const IoRecords::Submission& s : r.submissions) EXPECT_EQ(s.in_flight_before, 0);
    }
  }
}

TEST_P(FileChunkSwapTest, ReadOfUnwrittenSlotAndBusySlotAreRefused) {
  ScopedTestDir dir;
  ASSERT_OK_AND_ASSIGN(std::unique_ptr<ChunkSwap> swap, OpenFileChunkSwap(Options(dir.path())));
  ASSERT_OK(swap->AddSlot(7, 10000, "master#7"));
  EXPECT_THAT(swap->AddSlot(7, 10, "again"), StatusIs(absl::StatusCode::kInvalidArgument));
  EXPECT_THAT(swap->AddSlot(8, 0, "empty"), StatusIs(absl::StatusCode::kInvalidArgument));
  Buffer b(10000);
  EXPECT_THAT(swap->StartRead(7, b.data()),
              StatusIs(absl::StatusCode::kFailedPrecondition, HasSubstr("master#7")));
  EXPECT_THAT(swap->StartRead(9, b.data()), StatusIs(absl::StatusCode::kNotFound));
  EXPECT_THAT(swap->StartWrite(9, b.data()), StatusIs(absl::StatusCode::kNotFound));
  EXPECT_FALSE(swap->written(7));
  ASSERT_OK_AND_ASSIGN(IoTicket t, swap->StartWrite(7, b.data()));
  EXPECT_THAT(swap->StartWrite(7, b.data()),
              StatusIs(absl::StatusCode::kFailedPrecondition, HasSubstr("in flight")));
  EXPECT_OK(swap->Wait(t));
  EXPECT_THAT(swap->Wait(t), StatusIs(absl::StatusCode::kNotFound));
  EXPECT_FALSE(swap->Poll(t));
  EXPECT_TRUE(swap->written(7));
}

TEST_P(FileChunkSwapTest, CorruptedFileIsDataLossNamingTheSlot) {
  ScopedTestDir dir;
  ASSERT_OK_AND_ASSIGN(std::unique_ptr<ChunkSwap> swap, OpenFileChunkSwap(Options(dir.path())));
  ASSERT_OK(swap->AddSlot(0, 5000, "master#0"));
  ASSERT_OK(swap->AddSlot(1, 100000, "master#1"));
  TestRng rng(4);
  Buffer src(100000);
  src.Fill(rng);
  ASSERT_OK_AND_ASSIGN(IoTicket t0, swap->StartWrite(0, src.data()));
  ASSERT_OK_AND_ASSIGN(IoTicket t1, swap->StartWrite(1, src.data()));
  ASSERT_OK(swap->Wait(t0));
  ASSERT_OK(swap->Wait(t1));
  // Flip one bit of slot 1 (offset 8192 in the file) behind the swap's back.
  const std::string path = swap->info().path;
  const int fd = ::open(path.c_str(), O_RDWR);
  ASSERT_GE(fd, 0);
  char byte = 0;
  ASSERT_EQ(::pread(fd, &byte, 1, 8192 + 777), 1);
  byte ^= 0x10;
  ASSERT_EQ(::pwrite(fd, &byte, 1, 8192 + 777), 1);
  Buffer dst(100000);
  ASSERT_OK_AND_ASSIGN(t1, swap->StartRead(1, dst.data()));
  EXPECT_THAT(swap->Wait(t1), StatusIs(absl::StatusCode::kDataLoss,
                                       AllOf(HasSubstr("master#1"), HasSubstr(path),
                                             HasSubstr("offset 8192"), HasSubstr("CRC-32C"))));
  // Slot 0 is intact. Then the file is cut short: a read past its end is a short read.
  ASSERT_OK_AND_ASSIGN(t0, swap->StartRead(0, dst.data()));
  EXPECT_OK(swap->Wait(t0));
  ASSERT_EQ(::ftruncate(fd, 4096), 0);
  ::close(fd);
  ASSERT_OK_AND_ASSIGN(t1, swap->StartRead(1, dst.data()));
  EXPECT_THAT(swap->Wait(t1), StatusIs(absl::StatusCode::kDataLoss,
                                       AllOf(HasSubstr("master#1"), HasSubstr("short read"))));
}

// Faults injected under the swap at random moments: every I/O either succeeds with the right
// bytes or fails with an error naming its slot; every injected error shows up as a failed I/O.
TEST_P(FileChunkSwapTest, InjectedFaultsEndInCleanErrors) {
  TestRng seeds(5);
  int64_t total_errors = 0;
  int64_t total_ok_reads = 0;
  FaultCounts total_faults;
  const int kSeeds = GetParam().engine == IoEngineKind::kIoUring ? 20 : 30;
  for (int trial = 0; trial < kSeeds; ++trial) {
    const uint64_t seed = seeds();
    SCOPED_TRACE(absl::StrCat("trial ", trial, ", fault seed ", seed));
    ScopedTestDir dir;
    FileChunkSwapOptions o = Options(dir.path());
    o.block_size = 8 << 10;
    std::shared_ptr<FaultCounts> faults;
    o.wrap_engine_for_test = [&](std::unique_ptr<IoEngine> inner) {
      auto faulty = std::make_unique<FaultyIoEngine>(std::move(inner),
                                                     FaultRates{.short_transfer = 0.2,
                                                                .read_eof = 0.01,
                                                                .eio = 0.01,
                                                                .write_enospc = 0.01,
                                                                .corrupt_read = 0.02},
                                                     seed);
      faults = faulty->counts();
      return faulty;
    };
    ASSERT_OK_AND_ASSIGN(std::unique_ptr<ChunkSwap> swap, OpenFileChunkSwap(o));
    TestRng rng(100 + trial);
    const int kSlots = 6;
    std::vector<int64_t> sizes;
    std::vector<std::vector<char>> model(kSlots);
    std::vector<bool> model_written(kSlots, false);
    for (int k = 0; k < kSlots; ++k) {
      sizes.push_back(absl::Uniform<int64_t>(rng, 1, 48 << 10));
      ASSERT_OK(swap->AddSlot(k, sizes.back(), absl::StrCat("state#", k)));
    }
    int64_t errors = 0;
    for (int step = 0; step < 12; ++step) {
      // Up to kSlots I/Os in flight on distinct slots, waited for in random order.
      struct Op {
        int key = 0;
        bool write = false;
        std::unique_ptr<Buffer> buffer = nullptr;
        IoTicket ticket = 0;
      };
      std::vector<Op> ops;
      for (int k = 0; k < kSlots; ++k) {
        if (absl::Bernoulli(rng, 0.3)) continue;
        Op op{.key = k, .write = !model_written[k] || absl::Bernoulli(rng, 0.4)};
        op.buffer = std::make_unique<Buffer>(sizes[k], absl::Bernoulli(rng, 0.2) ? 3 : 0);
        if (op.write) op.buffer->Fill(rng);
        absl::StatusOr<IoTicket> t = op.write ? swap->StartWrite(k, op.buffer->data())
                                              : swap->StartRead(k, op.buffer->data());
        ASSERT_OK(t.status());
        op.ticket = *t;
        ops.push_back(std::move(op));
      }
      std::shuffle(ops.begin(), ops.end(), rng);
      for (Op& op : ops) {
        const absl::Status status = swap->Wait(op.ticket);
        const std::string name = absl::StrCat("state#", op.key);
        if (!status.ok()) {
          ++errors;
          EXPECT_THAT(status.code(),
                      AnyOf(absl::StatusCode::kDataLoss, absl::StatusCode::kResourceExhausted));
          EXPECT_THAT(status.message(), HasSubstr(name));
          if (status.code() == absl::StatusCode::kResourceExhausted) {
            EXPECT_THAT(status.message(), HasSubstr(dir.path()));
          }
          if (op.write) model_written[op.key] = false;
          EXPECT_EQ(swap->written(op.key), model_written[op.key]) << name;
          continue;
        }
        if (op.write) {
          model[op.key].assign(op.buffer->data(), op.buffer->data() + sizes[op.key]);
          model_written[op.key] = true;
        } else {
          ++total_ok_reads;
          EXPECT_TRUE(op.buffer->Equals(model[op.key]))
              << "an OK read of " << name << " returned wrong bytes";
        }
        EXPECT_EQ(swap->written(op.key), model_written[op.key]) << name;
      }
    }
    swap.reset();
    ASSERT_NE(faults, nullptr);
    // Each injected error fails the I/O it hit (several may hit one I/O); nothing else fails.
    EXPECT_LE(errors, faults->errors());
    EXPECT_EQ(errors > 0, faults->errors() > 0)
        << errors << " failed I/Os, " << faults->errors() << " injected errors";
    total_errors += errors;
    total_faults.short_transfers += faults->short_transfers;
    total_faults.read_eofs += faults->read_eofs;
    total_faults.eios += faults->eios;
    total_faults.write_enospcs += faults->write_enospcs;
    total_faults.corrupt_reads += faults->corrupt_reads;
  }
  std::cout << total_errors << " failed I/Os, " << total_ok_reads
            << " good reads; injected: " << total_faults.short_transfers << " short transfers, "
            << total_faults.read_eofs << " EOFs, " << total_faults.eios << " EIOs, "
            << total_faults.write_enospcs << " ENOSPCs, " << total_faults.corrupt_reads
            << " corrupted reads\n";
  // Every kind of fault was drawn, and the short transfers ended in good reads.
  EXPECT_GT(total_errors, 0);
  EXPECT_GT(total_ok_reads, 0);
  EXPECT_GT(total_faults.short_transfers, 0);
  EXPECT_GT(total_faults.read_eofs, 0);
  EXPECT_GT(total_faults.eios, 0);
  EXPECT_GT(total_faults.write_enospcs, 0);
  EXPECT_GT(total_faults.corrupt_reads, 0);
}

TEST_P(FileChunkSwapTest, NoSpaceForASlotIsResourceExhaustedNamingTheDirectory) {
  ScopedTestDir dir;
  FileChunkSwapOptions o = Options(dir.path());
  o.wrap_engine_for_test = [](std::unique_ptr<IoEngine> inner) {
    return std::make_unique<FaultyIoEngine>(std::move(inner), FaultRates{.allocate_enospc = 1.0},
                                            1);
  };
  ASSERT_OK_AND_ASSIGN(std::unique_ptr<ChunkSwap> swap, OpenFileChunkSwap(o));
  EXPECT_THAT(swap->AddSlot(0, 5000, "master#0"),
              StatusIs(absl::StatusCode::kResourceExhausted,
                       AllOf(HasSubstr(dir.path()), HasSubstr("master#0"),
                             HasSubstr("needs 8192 more bytes"), HasSubstr("bytes free"))));
  EXPECT_EQ(swap->slot_bytes(0), 0);
  EXPECT_EQ(swap->info().file_bytes, 0);
}

// Chunk payloads from the host resource (memory/resources.cc) are page-aligned, so all but the
// tail of an odd-sized slot goes direct.
TEST_P(FileChunkSwapTest, HostResourcePayloadsGoDirect) {
  ScopedTestDir dir;
  ASSERT_OK_AND_ASSIGN(std::unique_ptr<ChunkSwap> swap, OpenFileChunkSwap(Options(dir.path())));
  HostResource host;
  const int64_t bytes = (1 << 20) + 13;
  ASSERT_OK_AND_ASSIGN(void* src, host.Allocate(bytes));
  ASSERT_OK_AND_ASSIGN(void* dst, host.Allocate(bytes));
  EXPECT_EQ(reinterpret_cast<uintptr_t>(src) % 4096, 0u);
  EXPECT_EQ(reinterpret_cast<uintptr_t>(dst) % 4096, 0u);
  std::memset(src, 0x3c, static_cast<size_t>(bytes));
  ASSERT_OK(swap->AddSlot(0, bytes, "master#0"));
  ASSERT_OK_AND_ASSIGN(IoTicket t, swap->StartWrite(0, src));
  ASSERT_OK(swap->Wait(t));
  ASSERT_OK_AND_ASSIGN(t, swap->StartRead(0, dst));
  ASSERT_OK(swap->Wait(t));
  EXPECT_EQ(std::memcmp(src, dst, static_cast<size_t>(bytes)), 0);
  // One buffered request each way: the 13-byte tail.
  EXPECT_EQ(swap->counters().buffered_requests, swap->info().direct ? 2 : 0);
  EXPECT_OK(host.Deallocate(src, bytes));
  EXPECT_OK(host.Deallocate(dst, bytes));
}

INSTANTIATE_TEST_SUITE_P(Engines, FileChunkSwapTest,
                         ::testing::Values(SwapConfig{IoEngineKind::kThreads, true},
                                           SwapConfig{IoEngineKind::kThreads, false},
                                           SwapConfig{IoEngineKind::kIoUring, true},
                                           SwapConfig{IoEngineKind::kIoUring, false}),
                         ConfigName);

TEST(FileChunkSwap, TmpfsDirectory) {
  if (!std::filesystem::is_directory("/dev/shm")) GTEST_SKIP() << "no /dev/shm here";
  ScopedTestDir dir("/dev/shm");
  ASSERT_OK_AND_ASSIGN(std::unique_ptr<ChunkSwap> swap,
                       OpenFileChunkSwap(FileChunkSwapOptions{.dir = dir.path()}));
  // tmpfs takes O_DIRECT since Linux 6.6 and refuses it before.
  const ChunkSwapInfo info = swap->info();
  if (!info.direct) {
    EXPECT_EQ(info.direct_note, absl::StrCat("buffered: the filesystem of ", dir.path(),
                                             " (tmpfs) refuses O_DIRECT"));
  } else {
    EXPECT_EQ(info.direct_note, "O_DIRECT");
  }
  TestRng rng(6);
  const std::vector<int64_t> sizes = AwkwardSizes(rng, 8);
  for (size_t k = 0; k < sizes.size(); ++k) {
    ASSERT_OK(swap->AddSlot(static_cast<int64_t>(k), sizes[k], absl::StrCat("param#", k)));
  }
  RoundTrips(*swap, sizes, rng, 1, /*misalign=*/1);
}

TEST(FileChunkSwap, RefusedDirectIoFallsBackToBufferedAndSaysWhy) {
  if (!std::filesystem::is_directory("/dev/shm")) GTEST_SKIP() << "no /dev/shm here";
  ScopedTestDir dir("/dev/shm");
  ASSERT_OK_AND_ASSIGN(
      std::unique_ptr<ChunkSwap> swap,
      OpenFileChunkSwap(FileChunkSwapOptions{.dir = dir.path(), .refuse_direct_for_test = true}));
  EXPECT_FALSE(swap->info().direct);
  EXPECT_EQ(swap->info().direct_note,
            absl::StrCat("buffered: the filesystem of ", dir.path(), " (tmpfs) refuses O_DIRECT"));
  TestRng rng(7);
  const std::vector<int64_t> sizes = AwkwardSizes(rng, 8);
  for (size_t k = 0; k < sizes.size(); ++k) {
    ASSERT_OK(swap->AddSlot(static_cast<int64_t>(k), sizes[k], absl::StrCat("param#", k)));
  }
  RoundTrips(*swap, sizes, rng, 1, /*misalign=*/0);
  EXPECT_EQ(swap->counters().buffered_requests, 0);
}

TEST(FileChunkSwap, RefusedIoUringFallsBackToThreadsOrIsAnError) {
  ScopedTestDir dir;
  FileChunkSwapOptions o{.dir = dir.path(), .io_uring_refusal_for_test = EPERM};
  {
    ASSERT_OK_AND_ASSIGN(std::unique_ptr<ChunkSwap> swap, OpenFileChunkSwap(o));
    EXPECT_EQ(swap->info().engine, "threads (io_uring refused: Operation not permitted)");
  }
  o.engine = IoEngineKind::kIoUring;
  EXPECT_THAT(OpenFileChunkSwap(o), StatusIs(absl::StatusCode::kFailedPrecondition,
                                             HasSubstr("Operation not permitted")));
  EXPECT_TRUE(std::filesystem::is_empty(dir.path()));
}

// The threads of this process (/proc/self/task).
int ProcessThreads() {
  int n = 0;
  for ([[maybe_unused]] const auto& e : std::filesystem::directory_iterator("/proc/self/task")) ++n;
  return n;
}

// aio.thread_count is the size of the pread/pwrite pool: the swap adds that many workers beside
// its own I/O thread; io_uring (the kernel carries the I/O) adds the I/O thread alone.
TEST(FileChunkSwap, ThreadCountSizesTheThreadEngine) {
  {
    // Warm-up: runtimes that start a helper thread with the first thread (a sanitizer's) do it now.
    ScopedTestDir dir;
    ASSERT_OK(
        OpenFileChunkSwap(FileChunkSwapOptions{.dir = dir.path(), .engine = IoEngineKind::kThreads})
            .status());
  }
  for (const int threads : {1, 3, 6}) {
    SCOPED_TRACE(absl::StrCat("thread_count ", threads));
    ScopedTestDir dir;
    const int before = ProcessThreads();
    ASSERT_OK_AND_ASSIGN(
        std::unique_ptr<ChunkSwap> swap,
        OpenFileChunkSwap(FileChunkSwapOptions{
            .dir = dir.path(), .thread_count = threads, .engine = IoEngineKind::kThreads}));
    EXPECT_EQ(swap->info().engine, "threads");
    EXPECT_EQ(ProcessThreads() - before, threads + 1);
    swap.reset();
    EXPECT_EQ(ProcessThreads(), before);
  }
  const std::string refusal = IoUringRefusal();
  if (!refusal.empty()) GTEST_SKIP() << "io_uring is refused here: " << refusal;
  ScopedTestDir dir;
  const int before = ProcessThreads();
  ASSERT_OK_AND_ASSIGN(
      std::unique_ptr<ChunkSwap> swap,
      OpenFileChunkSwap(FileChunkSwapOptions{
          .dir = dir.path(), .thread_count = 6, .engine = IoEngineKind::kIoUring}));
  EXPECT_EQ(swap->info().engine, "io_uring");
  EXPECT_EQ(ProcessThreads() - before, 1);
}

TEST(FileChunkSwap, AutoEngineSaysWhichRuns) {
  ScopedTestDir dir;
  ASSERT_OK_AND_ASSIGN(std::unique_ptr<ChunkSwap> swap,
                       OpenFileChunkSwap(FileChunkSwapOptions{.dir = dir.path()}));
  EXPECT_EQ(swap->info().engine, ExpectedAutoEngine());
}

TEST(FileChunkSwap, BadOptionsAndDirectories) {
  ScopedTestDir dir;
  EXPECT_THAT(OpenFileChunkSwap(FileChunkSwapOptions{.dir = dir.path() + "/missing"}),
              StatusIs(absl::StatusCode::kNotFound, HasSubstr(dir.path() + "/missing")));
  EXPECT_THAT(OpenFileChunkSwap(FileChunkSwapOptions{.dir = dir.path(), .block_size = 1000}),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("aio.block_size")));
  EXPECT_THAT(
      OpenFileChunkSwap(FileChunkSwapOptions{.dir = dir.path(), .block_size = int64_t{2} << 30}),
      StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("at most")));
  EXPECT_THAT(OpenFileChunkSwap(FileChunkSwapOptions{.dir = dir.path(), .queue_depth = 0}),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("aio.queue_depth")));
  EXPECT_THAT(OpenFileChunkSwap(FileChunkSwapOptions{.dir = dir.path(), .thread_count = 0}),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("aio.thread_count")));
  // A buffered swap takes any block size.
  EXPECT_OK(OpenFileChunkSwap(
      FileChunkSwapOptions{.dir = dir.path(), .block_size = 1000, .direct = false}));
}

TEST(FileChunkSwap, TwoRanksShareADirectory) {
  ScopedTestDir dir;
  ASSERT_OK_AND_ASSIGN(std::unique_ptr<ChunkSwap> a,
                       OpenFileChunkSwap(FileChunkSwapOptions{.dir = dir.path(), .rank = 0}));
  ASSERT_OK_AND_ASSIGN(std::unique_ptr<ChunkSwap> b,
                       OpenFileChunkSwap(FileChunkSwapOptions{.dir = dir.path(), .rank = 1}));
  EXPECT_EQ(a->info().path, dir.path() + "/patrickstar-swap-rank0.bin");
  EXPECT_EQ(b->info().path, dir.path() + "/patrickstar-swap-rank1.bin");
  EXPECT_THAT(OpenFileChunkSwap(FileChunkSwapOptions{.dir = dir.path(), .rank = 1}),
              StatusIs(absl::StatusCode::kFailedPrecondition,
                       AllOf(HasSubstr(dir.path()), HasSubstr(absl::StrCat(::getpid())))));
}

}  // namespace
}  // namespace ps
