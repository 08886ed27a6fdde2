#include "comm/testing/communicator_conformance.h"

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <random>
#include <string>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/time/time.h"
#include "base/testing/status_matchers.h"
#include "comm/communicator.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "memory/dtype_math.h"

namespace ps {

CommTestMemory HostTestMemory() {
  CommTestMemory m;
  m.allocate = [](int64_t bytes) { return std::malloc(std::max<int64_t>(bytes, 1)); };
  m.free = [](void* p) { std::free(p); };
  m.upload = [](void* dst, const void* src, int64_t bytes) {
    if (bytes > 0) std::memcpy(dst, src, bytes);
  };
  m.download = [](void* dst, const void* src, int64_t bytes) {
    if (bytes > 0) std::memcpy(dst, src, bytes);
  };
  return m;
}

void CommunicatorConformanceTest::SetUp() {
  absl::StatusOr<std::unique_ptr<Communicator>> comm = GetParam().create();
  if (absl::IsUnavailable(comm.status())) GTEST_SKIP() << comm.status();
  ASSERT_OK(comm.status());
  comm_ = *std::move(comm);
}

namespace {

// Long enough for a slow sanitizer build; short enough that a hang fails instead of timing out
// the whole test binary.
constexpr absl::Duration kWait = absl::Seconds(60);

constexpr CommDType kAllDTypes[] = {CommDType::kF32, CommDType::kF16, CommDType::kBF16,
                                    CommDType::kI32, CommDType::kU8};
constexpr ReduceOp kAllOps[] = {ReduceOp::kSum, ReduceOp::kAvg, ReduceOp::kMax};

using Bytes = std::vector<uint8_t>;

// Per-rank counts every rank agrees on: the awkward ones plus a few random (fixed seed).
std::vector<int64_t> TestCounts() {
  std::vector<int64_t> counts = {0, 1, 2, 3, 7, 64, 1023, 4097};
  std::mt19937_64 rng(20240607);
  for (int i = 0; i < 2; ++i) counts.push_back(1 + static_cast<int64_t>(rng() % 40000));
  return counts;
}

uint64_t Mix(uint64_t x) {  // splitmix64
  x += 0x9e3779b97f4a7c15ull;
  x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ull;
  x = (x ^ (x >> 27)) * 0x94d049bb133111ebull;
  return x ^ (x >> 31);
}

float ToFloat(CommDType dtype, const uint8_t* p) {
  switch (dtype) {
    case CommDType::kF32: {
      float f;
      std::memcpy(&f, p, 4);
      return f;
    }
    case CommDType::kF16:
    case CommDType::kBF16: {
      uint16_t h;
      std::memcpy(&h, p, 2);
      return dtype == CommDType::kF16 ? HalfBitsToFloat(h) : BFloat16BitsToFloat(h);
    }
    case CommDType::kI32: {
      int32_t i;
      std::memcpy(&i, p, 4);
      return static_cast<float>(i);
    }
    case CommDType::kU8:
      return *p;
  }
  return 0;
}

// Stores `v` (already representable, or to be rounded once) as `dtype`.
void FromFloat(CommDType dtype, float v, uint8_t* p) {
  switch (dtype) {
    case CommDType::kF32:
      std::memcpy(p, &v, 4);
      return;
    case CommDType::kF16: {
      const uint16_t h = FloatToHalfBits(v);
      std::memcpy(p, &h, 2);
      return;
    }
    case CommDType::kBF16: {
      const uint16_t h = FloatToBFloat16Bits(v);
      std::memcpy(p, &h, 2);
      return;
    }
    case CommDType::kI32: {
      const int32_t i = static_cast<int32_t>(v);
      std::memcpy(p, &i, 4);
      return;
    }
    case CommDType::kU8:
      *p = static_cast<uint8_t>(v);
      return;
  }
}

// Element `i` of rank `rank`'s input for `seed`, as a float (exact in every dtype).
float InputValue(uint64_t seed, int rank, int64_t i, CommDType dtype) {
  const uint64_t h = Mix(seed * 0x100000001b3ull ^ Mix(static_cast<uint64_t>(rank) << 40 ^ i));
  switch (dtype) {
    case CommDType::kI32:
      return static_cast<float>(static_cast<int64_t>(h % 2001) - 1000);
    case CommDType::kU8:
      return static_cast<float>(h % 32);  // sums over <= 8 ranks stay below 256
    default: {
      const int m = static_cast<int>(h % 511) - 255;
      const int e = static_cast<int>((h >> 16) % 9) - 4;
      return std::ldexp(static_cast<float>(m), e);
    }
  }
}

Bytes Input(uint64_t seed, int rank, int64_t n, CommDType dtype) {
  const int64_t elem = CommDTypeSize(dtype);
  Bytes out(n * elem);
  for (int64_t i = 0; i < n; ++i) FromFloat(dtype, InputValue(seed, rank, i, dtype), &out[i * elem]);
  return out;
}

// The reduction over all ranks of elements [offset, offset + n) of the inputs for `seed`: f32 sum in rank order (exact by construction), avg = sum
// / world, rounded once to `dtype`.
Bytes Reference(uint64_t seed, int world, int64_t offset, int64_t n, CommDType dtype,
                ReduceOp op) {
  const int64_t elem = CommDTypeSize(dtype);
  Bytes out(n * elem);
  for (int64_t i = 0; i < n; ++i) {
    if (dtype == CommDType::kI32 || dtype == CommDType::kU8) {
      int64_t acc = op == ReduceOp::kMax ? INT64_MIN : 0;
      for (int r = 0; r < world; ++r) {
        const auto v = static_cast<int64_t>(InputValue(seed, r, offset + i, dtype));
        acc = op == ReduceOp::kMax ? std::max(acc, v) : acc + v;
      }
      FromFloat(dtype, static_cast<float>(acc), &out[i * elem]);
      continue;
    }
    float acc = op == ReduceOp::kMax ? -INFINITY : 0.0f;
    for (int r = 0; r < world; ++r) {
      const float v = InputValue(seed, r, offset + i, dtype);
      acc = op == ReduceOp::kMax ? std::max(acc, v) : acc + v;
    }
    if (op == ReduceOp::kAvg) acc /= static_cast<float>(world);
    FromFloat(dtype, acc, &out[i * elem]);
  }
  return out;
}

// A buffer in the communicator's memory.
class TestBuffer {
 public:
  TestBuffer(const CommTestMemory& memory, int64_t bytes)
      : memory_(memory), bytes_(bytes), ptr_(memory.allocate(bytes)) {}
  ~TestBuffer() { memory_.free(ptr_); }
  TestBuffer(const TestBuffer&) = delete;
  TestBuffer& operator=(const TestBuffer&) = delete;

  uint8_t* get() const { return static_cast<uint8_t*>(ptr_); }
  void Upload(const Bytes& host, int64_t offset = 0) {
    memory_.upload(get() + offset, host.data(), static_cast<int64_t>(host.size()));
  }
  Bytes Download(int64_t offset, int64_t bytes) const {
    Bytes out(bytes);
    memory_.download(out.data(), get() + offset, bytes);
    return out;
  }
  // Fills the whole buffer with a pattern that no result matches by accident.
  void Poison() { Upload(Bytes(bytes_, 0xa5)); }

 private:
  const CommTestMemory& memory_;
  const int64_t bytes_;
  void* const ptr_;
};

// Compares a result with the reference: bit-exact, or within NCCL-style rounding for float
// sum/avg when the communicator does not promise exact reductions.
void ExpectResult(const Bytes& got, const Bytes& want, CommDType dtype, ReduceOp op, bool exact,
                  int world, const std::string& what) {
  ASSERT_EQ(got.size(), want.size()) << what;
  if (exact || !IsFloatingPoint(dtype) || op == ReduceOp::kMax) {
    if (got == want) return;
    const int64_t elem = CommDTypeSize(dtype);
    for (size_t i = 0; i < got.size(); i += elem) {
      if (std::memcmp(&got[i], &want[i], elem) != 0) {
        ADD_FAILURE() << what << ": element " << i / elem << " is "
                      << ToFloat(dtype, &got[i]) << ", want " << ToFloat(dtype, &want[i]);
        return;
      }
    }
    return;
  }
  const float eps = dtype == CommDType::kF32 ? 0x1p-23f : dtype == CommDType::kF16 ? 0x1p-10f
                                                                                  : 0x1p-7f;
  const int64_t elem = CommDTypeSize(dtype);
  for (size_t i = 0; i < got.size(); i += elem) {
    const float g = ToFloat(dtype, &got[i]);
    const float w = ToFloat(dtype, &want[i]);
    const float tol = world * eps * std::max(std::fabs(w), 16.0f);
    if (!(std::fabs(g - w) <= tol)) {
      ADD_FAILURE() << what << ": element " << i / elem << " is " << g << ", want " << w
                    << " within " << tol;
      return;
    }
  }
}

std::string Where(const char* what, int64_t count, CommDType dtype, bool in_place,
                  const char* op = "") {
  return absl::StrCat(what, op, " count=", count, " dtype=", CommDTypeName(dtype),
                      in_place ? " in-place" : " out-of-place");
}

TEST_P(CommunicatorConformanceTest, ReportsAConsistentWorld) {
  EXPECT_GE(comm_->world_size(), 1);
  EXPECT_GE(comm_->rank(), 0);
  EXPECT_LT(comm_->rank(), comm_->world_size());
  EXPECT_FALSE(comm_->name().empty());
  // Every rank agrees on the world size and holds a distinct rank: all-gather the ranks.
  const int world = comm_->world_size();
  std::vector<int32_t> ranks(world, -1);
  const int32_t mine[2] = {comm_->rank(), world};
  const CommTestMemory& memory = GetParam().memory;
  TestBuffer send(memory, sizeof(mine));
  TestBuffer recv(memory, 2 * sizeof(int32_t) * world);
  send.Upload(Bytes(reinterpret_cast<const uint8_t*>(mine),
                    reinterpret_cast<const uint8_t*>(mine) + sizeof(mine)));
  ASSERT_OK_AND_ASSIGN(auto req, comm_->AllGatherAsync(send.get(), recv.get(), 2, CommDType::kI32));
  ASSERT_OK(req->Wait(kWait));
  const Bytes got = recv.Download(0, 2 * sizeof(int32_t) * world);
  for (int r = 0; r < world; ++r) {
    int32_t pair[2];
    std::memcpy(pair, &got[r * sizeof(pair)], sizeof(pair));
    EXPECT_EQ(pair[0], r);
    EXPECT_EQ(pair[1], world);
  }
}

TEST_P(CommunicatorConformanceTest, AllGatherMatchesReference) {
  const int world = comm_->world_size();
  const int rank = comm_->rank();
  const CommTestMemory& memory = GetParam().memory;
  uint64_t seed = 1;
  for (int64_t count : TestCounts()) {
    for (CommDType dtype : kAllDTypes) {
      for (bool in_place : {false, true}) {
        ++seed;
        const std::string what = Where("all-gather", count, dtype, in_place);
        SCOPED_TRACE(what);
        const int64_t elem = CommDTypeSize(dtype);
        TestBuffer recv(memory, count * world * elem);
        TestBuffer send(memory, count * elem);
        recv.Poison();
        const Bytes mine = Input(seed, rank, count, dtype);
        const void* send_ptr = send.get();
        if (in_place) {
          recv.Upload(mine, rank * count * elem);
          send_ptr = recv.get() + rank * count * elem;
        } else {
          send.Upload(mine);
        }
        ASSERT_OK_AND_ASSIGN(auto req, comm_->AllGatherAsync(send_ptr, recv.get(), count, dtype));
        ASSERT_OK(req->Wait(kWait));
        EXPECT_TRUE(req->Done());
        Bytes want;
        for (int r = 0; r < world; ++r) {
          const Bytes theirs = Input(seed, r, count, dtype);
          want.insert(want.end(), theirs.begin(), theirs.end());
        }
        EXPECT_TRUE(recv.Download(0, count * world * elem) == want) << what;
        if (!in_place) {
          EXPECT_TRUE(send.Download(0, count * elem) == mine) << "send changed";
        }
      }
    }
  }
}

TEST_P(CommunicatorConformanceTest, ReduceScatterMatchesReference) {
  const int world = comm_->world_size();
  const int rank = comm_->rank();
  const CommTestMemory& memory = GetParam().memory;
  uint64_t seed = 1000;
  for (int64_t count : TestCounts()) {
    for (CommDType dtype : kAllDTypes) {
      for (ReduceOp op : kAllOps) {
        if (op == ReduceOp::kAvg && !IsFloatingPoint(dtype)) continue;
        for (bool in_place : {false, true}) {
          ++seed;
          const std::string what =
              Where("reduce-scatter ", count, dtype, in_place, ReduceOpName(op).c_str());
          SCOPED_TRACE(what);
          const int64_t elem = CommDTypeSize(dtype);
          TestBuffer send(memory, count * world * elem);
          TestBuffer recv(memory, count * elem);
          const Bytes mine = Input(seed, rank, count * world, dtype);
          send.Upload(mine);
          recv.Poison();
          void* recv_ptr = in_place ? send.get() + rank * count * elem : recv.get();
          ASSERT_OK_AND_ASSIGN(
              auto req, comm_->ReduceScatterAsync(send.get(), recv_ptr, count, dtype, op));
          ASSERT_OK(req->Wait(kWait));
          const Bytes got = in_place ? send.Download(rank * count * elem, count * elem)
                                     : recv.Download(0, count * elem);
          ExpectResult(got,
                       Reference(seed, world, rank * count, count, dtype, op),
                       dtype, op, GetParam().exact_float_reductions, world, what);
          if (!in_place) {
            EXPECT_TRUE(send.Download(0, count * world * elem) == mine) << "send changed";
          }
        }
      }
    }
  }
}

TEST_P(CommunicatorConformanceTest, AllReduceMatchesReference) {
  const int world = comm_->world_size();
  const int rank = comm_->rank();
  const CommTestMemory& memory = GetParam().memory;
  uint64_t seed = 2000;
  for (int64_t count : TestCounts()) {
    for (CommDType dtype : kAllDTypes) {
      for (ReduceOp op : kAllOps) {
        if (op == ReduceOp::kAvg && !IsFloatingPoint(dtype)) continue;
        for (bool in_place : {false, true}) {
          ++seed;
          const std::string what =
              Where("all-reduce ", count, dtype, in_place, ReduceOpName(op).c_str());
          SCOPED_TRACE(what);
          const int64_t elem = CommDTypeSize(dtype);
          TestBuffer send(memory, count * elem);
          TestBuffer recv(memory, count * elem);
          const Bytes mine = Input(seed, rank, count, dtype);
          send.Upload(mine);
          recv.Poison();
          void* recv_ptr = in_place ? send.get() : recv.get();
          ASSERT_OK_AND_ASSIGN(auto req,
                               comm_->AllReduceAsync(send.get(), recv_ptr, count, dtype, op));
          ASSERT_OK(req->Wait(kWait));
          const Bytes got =
              in_place ? send.Download(0, count * elem) : recv.Download(0, count * elem);
          ExpectResult(got, Reference(seed, world, 0, count, dtype, op), dtype, op,
                       GetParam().exact_float_reductions, world, what);
          if (!in_place) {
          EXPECT_TRUE(send.Download(0, count * elem) == mine) << "send changed";
        }
        }
      }
    }
  }
}

TEST_P(CommunicatorConformanceTest, BroadcastFromEveryRoot) {
  const int world = comm_->world_size();
  const int rank = comm_->rank();
  const CommTestMemory& memory = GetParam().memory;
  uint64_t seed = 3000;
  for (int root = 0; root < world; ++root) {
    for (int64_t count : TestCounts()) {
      for (CommDType dtype : kAllDTypes) {
        for (bool in_place : {false, true}) {
          ++seed;
          const std::string what =
              absl::StrCat(Where("broadcast", count, dtype, in_place), " root=", root);
          SCOPED_TRACE(what);
          const int64_t elem = CommDTypeSize(dtype);
          TestBuffer send(memory, count * elem);
          TestBuffer recv(memory, count * elem);
          recv.Poison();
          const Bytes theirs = Input(seed, root, count, dtype);
          const void* send_ptr = nullptr;  // only the root's send is read
          if (rank == root) {
            if (in_place) {
              recv.Upload(theirs);
              send_ptr = recv.get();
            } else {
              send.Upload(theirs);
              send_ptr = send.get();
            }
          }
          ASSERT_OK_AND_ASSIGN(auto req,
                               comm_->BroadcastAsync(send_ptr, recv.get(), count, dtype, root));
          ASSERT_OK(req->Wait(kWait));
          EXPECT_TRUE(recv.Download(0, count * elem) == theirs) << what;
        }
      }
    }
  }
}

TEST_P(CommunicatorConformanceTest, BarriersAndSynchronousFormsSucceed) {
  for (int i = 0; i < 20; ++i) ASSERT_OK(comm_->Barrier());
  ASSERT_OK_AND_ASSIGN(auto req, comm_->BarrierAsync());
  ASSERT_OK(req->Wait(kWait));

  const int world = comm_->world_size();
  const CommTestMemory& memory = GetParam().memory;
  const int64_t count = 5;
  TestBuffer big(memory, count * world * 4);
  TestBuffer small(memory, count * 4);
  small.Upload(Input(7, comm_->rank(), count, CommDType::kF32));
  ASSERT_OK(comm_->AllGather(small.get(), big.get(), count, CommDType::kF32));
  ASSERT_OK(comm_->ReduceScatter(big.get(), small.get(), count, CommDType::kF32, ReduceOp::kMax));
  ASSERT_OK(comm_->AllReduce(small.get(), small.get(), count, CommDType::kF32, ReduceOp::kSum));
  ASSERT_OK(comm_->Broadcast(small.get(), small.get(), count, CommDType::kF32, 0));
  // Every rank gathered the same buffer, so the max over ranks of slot r is rank r's input; the
  // all-reduce sums those: element i is the sum over ranks of their inputs.
  const Bytes got = small.Download(0, count * 4);
  for (int64_t i = 0; i < count; ++i) {
    float want = 0;
    for (int r = 0; r < world; ++r) want += InputValue(7, r, i, CommDType::kF32);
    EXPECT_EQ(ToFloat(CommDType::kF32, &got[i * 4]), want) << i;
  }
  // Zero-count collectives with null buffers are valid no-ops.
  ASSERT_OK(comm_->AllGather(nullptr, nullptr, 0, CommDType::kF16));
  ASSERT_OK(comm_->ReduceScatter(nullptr, nullptr, 0, CommDType::kBF16, ReduceOp::kAvg));
  ASSERT_OK(comm_->AllReduce(nullptr, nullptr, 0, CommDType::kU8, ReduceOp::kMax));
  ASSERT_OK(comm_->Broadcast(nullptr, nullptr, 0, CommDType::kI32, world - 1));
}

// Many collectives in flight at once, of every kind, each with its own buffers; waited on in
// reverse order. Requests complete in issue order.
TEST_P(CommunicatorConformanceTest, ManyOutstandingRequests) {
  const int world = comm_->world_size();
  const int rank = comm_->rank();
  const CommTestMemory& memory = GetParam().memory;
  struct Pending {
    std::unique_ptr<TestBuffer> send, recv;
    std::unique_ptr<CommRequest> request;
    int kind;
    int64_t count;
    CommDType dtype;
    ReduceOp op;
    uint64_t seed;
  };
  std::vector<Pending> pending;
  std::mt19937_64 rng(99);  // same sequence on every rank
  for (int i = 0; i < 64; ++i) {
    Pending p;
    p.kind = static_cast<int>(rng() % 4);
    p.count = static_cast<int64_t>(rng() % 3000);
    p.dtype = kAllDTypes[rng() % 5];
    p.op = IsFloatingPoint(p.dtype) ? kAllOps[rng() % 3] : (rng() % 2 ? ReduceOp::kSum
                                                                       : ReduceOp::kMax);
    p.seed = 5000 + i;
    const int64_t elem = CommDTypeSize(p.dtype);
    const int64_t send_n = p.kind == 1 ? p.count * world : p.count;
    const int64_t recv_n = p.kind == 0 ? p.count * world : p.count;
    p.send = std::make_unique<TestBuffer>(memory, send_n * elem);
    p.recv = std::make_unique<TestBuffer>(memory, recv_n * elem);
    p.send->Upload(Input(p.seed, p.kind == 3 ? 0 : rank, send_n, p.dtype));
    p.recv->Poison();
    absl::StatusOr<std::unique_ptr<CommRequest>> req;
    switch (p.kind) {
      case 0:
        req = comm_->AllGatherAsync(p.send->get(), p.recv->get(), p.count, p.dtype);
        break;
      case 1:
        req = comm_->ReduceScatterAsync(p.send->get(), p.recv->get(), p.count, p.dtype, p.op);
        break;
      case 2:
        req = comm_->AllReduceAsync(p.send->get(), p.recv->get(), p.count, p.dtype, p.op);
        break;
      default:
        req = comm_->BroadcastAsync(p.send->get(), p.recv->get(), p.count, p.dtype, 0);
        break;
    }
    ASSERT_OK(req.status());
    p.request = *std::move(req);
    pending.push_back(std::move(p));
  }
  ASSERT_OK(pending.back().request->Wait(kWait));
  for (const Pending& p : pending) EXPECT_TRUE(p.request->Done()) << "completed out of order";
  for (auto it = pending.rbegin(); it != pending.rend(); ++it) {
    Pending& p = *it;
    ASSERT_OK(p.request->Wait(kWait));
    const int64_t elem = CommDTypeSize(p.dtype);
    const std::string what = absl::StrCat("request kind ", p.kind, " count ", p.count, " ",
                                          CommDTypeName(p.dtype), " ", ReduceOpName(p.op));
    switch (p.kind) {
      case 0: {
        Bytes want;
        for (int r = 0; r < world; ++r) {
          const Bytes theirs = Input(p.seed, r, p.count, p.dtype);
          want.insert(want.end(), theirs.begin(), theirs.end());
        }
        EXPECT_TRUE(p.recv->Download(0, p.count * world * elem) == want) << what;
        break;
      }
      case 1:
        ExpectResult(p.recv->Download(0, p.count * elem),
                     Reference(p.seed, world, rank * p.count, p.count, p.dtype, p.op),
                     p.dtype, p.op, GetParam().exact_float_reductions, world, what);
        break;
      case 2:
        ExpectResult(p.recv->Download(0, p.count * elem),
                     Reference(p.seed, world, 0, p.count, p.dtype, p.op), p.dtype, p.op,
                     GetParam().exact_float_reductions, world, what);
        break;
      default:
        EXPECT_TRUE(p.recv->Download(0, p.count * elem) == Input(p.seed, 0, p.count, p.dtype))
            << what;
        break;
    }
  }
}

TEST_P(CommunicatorConformanceTest, WaitIsIdempotentAndTimedWaitOnADoneRequestIsOk) {
  const CommTestMemory& memory = GetParam().memory;
  TestBuffer buf(memory, 64 * 4);
  buf.Upload(Input(11, comm_->rank(), 64, CommDType::kF32));
  ASSERT_OK_AND_ASSIGN(auto req, comm_->AllReduceAsync(buf.get(), buf.get(), 64, CommDType::kF32,
                                                       ReduceOp::kMax));
  ASSERT_OK(req->Wait());
  EXPECT_TRUE(req->Done());
  EXPECT_OK(req->Wait());
  EXPECT_OK(req->Wait(absl::ZeroDuration()));
  EXPECT_OK(req->Wait(absl::Milliseconds(1)));
}

// f16/bf16 sums and averages accumulate in f32 and round once.
TEST_P(CommunicatorConformanceTest, SixteenBitReductionsAccumulateInF32AndRoundOnce) {
  if (!GetParam().exact_float_reductions) {
    GTEST_SKIP() << GetParam().name << " uses NCCL's 16-bit arithmetic (rounding per step)";
  }
  const int world = comm_->world_size();
  const int rank = comm_->rank();
  const CommTestMemory& memory = GetParam().memory;
  // bf16 has 8 significant bits: 1 + k * 2^-8 is exact in f32; pairwise rounding would round
  // each 1 + 2^-8 back to 1 (a tie, to even), but the f32 sum rounds once.
  {
    const uint16_t mine = FloatToBFloat16Bits(rank == 0 ? 1.0f : 0x1p-8f);
    TestBuffer buf(memory, 2);
    buf.Upload(Bytes{static_cast<uint8_t>(mine & 0xff), static_cast<uint8_t>(mine >> 8)});
    ASSERT_OK(comm_->AllReduce(buf.get(), buf.get(), 1, CommDType::kBF16, ReduceOp::kSum));
    const Bytes got = buf.Download(0, 2);
    EXPECT_EQ(ToFloat(CommDType::kBF16, got.data()),
              BFloat16BitsToFloat(FloatToBFloat16Bits(1.0f + (world - 1) * 0x1p-8f)));
  }
  // f16 max is 65504: the sum of 40000 over two or more ranks overflows, the average does not.
  {
    const uint16_t mine = FloatToHalfBits(40000.0f);
    TestBuffer buf(memory, 2 * world);
    TestBuffer out(memory, 2);
    Bytes in;
    for (int r = 0; r < world; ++r) {
      in.push_back(static_cast<uint8_t>(mine & 0xff));
      in.push_back(static_cast<uint8_t>(mine >> 8));
    }
    buf.Upload(in);
    ASSERT_OK(comm_->ReduceScatter(buf.get(), out.get(), 1, CommDType::kF16, ReduceOp::kAvg));
    EXPECT_EQ(ToFloat(CommDType::kF16, out.Download(0, 2).data()), 40000.0f);
    ASSERT_OK(comm_->AllReduce(buf.get(), out.get(), 1, CommDType::kF16, ReduceOp::kSum));
    EXPECT_EQ(ToFloat(CommDType::kF16, out.Download(0, 2).data()),
              world == 1 ? 40000.0f : INFINITY);
  }
}

TEST_P(CommunicatorConformanceTest, InfinitiesAndNaNsPropagateThroughSums) {
  const int world = comm_->world_size();
  const int rank = comm_->rank();
  const CommTestMemory& memory = GetParam().memory;
  for (CommDType dtype : {CommDType::kF32, CommDType::kF16, CommDType::kBF16}) {
    SCOPED_TRACE(CommDTypeName(dtype));
    const int64_t elem = CommDTypeSize(dtype);
    Bytes in(3 * elem);
    FromFloat(dtype, rank == 0 ? INFINITY : 1.0f, &in[0]);
    FromFloat(dtype, rank == world - 1 ? NAN : 2.0f, &in[elem]);
    FromFloat(dtype, -INFINITY, &in[2 * elem]);
    TestBuffer buf(memory, 3 * elem);
    buf.Upload(in);
    ASSERT_OK(comm_->AllReduce(buf.get(), buf.get(), 3, dtype, ReduceOp::kSum));
    const Bytes got = buf.Download(0, 3 * elem);
    EXPECT_EQ(ToFloat(dtype, &got[0]), INFINITY);
    EXPECT_TRUE(std::isnan(ToFloat(dtype, &got[elem])));
    EXPECT_EQ(ToFloat(dtype, &got[2 * elem]), -INFINITY);
  }
}

// Every bad argument is InvalidArgument from the issuing call, identically on every rank, and the
// communicator keeps working afterwards.
TEST_P(CommunicatorConformanceTest, RejectsBadArgumentsWithClearErrors) {
  const int world = comm_->world_size();
  const int rank = comm_->rank();
  const CommTestMemory& memory = GetParam().memory;
  const int64_t n = 16;
  TestBuffer a(memory, n * world * 4 + 64);
  TestBuffer b(memory, n * world * 4 + 64);
  uint8_t* pa = a.get();
  uint8_t* pb = b.get();
  const auto kInvalid = absl::StatusCode::kInvalidArgument;
  const CommDType bad_dtype = static_cast<CommDType>(77);
  const ReduceOp bad_op = static_cast<ReduceOp>(9);

  EXPECT_THAT(comm_->AllGatherAsync(pa, pb, -1, CommDType::kF32),
              StatusIs(kInvalid, ::testing::HasSubstr("negative")));
  EXPECT_THAT(comm_->AllGatherAsync(nullptr, pb, n, CommDType::kF32),
              StatusIs(kInvalid, ::testing::HasSubstr("send buffer is null")));
  EXPECT_THAT(comm_->AllGatherAsync(pa, nullptr, n, CommDType::kF32),
              StatusIs(kInvalid, ::testing::HasSubstr("recv buffer is null")));
  EXPECT_THAT(comm_->AllGatherAsync(pa, pb, n, bad_dtype),
              StatusIs(kInvalid, ::testing::HasSubstr("invalid(77)")));
  // Overlap other than the in-place layout: send one element past our slot.
  EXPECT_THAT(comm_->AllGatherAsync(pa + (rank * n + 1) * 4, pa, n, CommDType::kF32),
              StatusIs(kInvalid, ::testing::HasSubstr("in-place all-gather needs")));
  EXPECT_THAT(comm_->ReduceScatterAsync(pa, pa + (rank * n + 1) * 4, n, CommDType::kF32,
                                        ReduceOp::kSum),
              StatusIs(kInvalid, ::testing::HasSubstr("in-place reduce-scatter needs")));
  EXPECT_THAT(comm_->ReduceScatterAsync(pa, pb, n, CommDType::kI32, ReduceOp::kAvg),
              StatusIs(kInvalid, ::testing::HasSubstr("avg is defined for f32, f16 and bf16")));
  EXPECT_THAT(comm_->ReduceScatterAsync(pa, pb, n, CommDType::kF32, bad_op),
              StatusIs(kInvalid, ::testing::HasSubstr("invalid(9)")));
  EXPECT_THAT(comm_->AllReduceAsync(pa, pa + 4, n, CommDType::kF32, ReduceOp::kSum),
              StatusIs(kInvalid, ::testing::HasSubstr("overlaps")));
  EXPECT_THAT(comm_->AllReduceAsync(pa, pb, n, CommDType::kU8, ReduceOp::kAvg),
              StatusIs(kInvalid, ::testing::HasSubstr("u8")));
  EXPECT_THAT(comm_->BroadcastAsync(pa, pb, n, CommDType::kF32, world),
              StatusIs(kInvalid, ::testing::HasSubstr("root")));
  EXPECT_THAT(comm_->BroadcastAsync(pa, pb, n, CommDType::kF32, -1),
              StatusIs(kInvalid, ::testing::HasSubstr("root")));
  // Only the root reads send, so a null send is an error on the root alone: ask rank 0 to
  // broadcast from itself with a null send, and everyone else checks a rejected root instead.
  if (rank == 0) {
    EXPECT_THAT(comm_->BroadcastAsync(nullptr, pb, n, CommDType::kF32, 0),
                StatusIs(kInvalid, ::testing::HasSubstr("send buffer is null")));
  }
  EXPECT_THAT(comm_->AllGatherAsync(pa, pb, int64_t{1} << 62, CommDType::kF32),
              StatusIs(kInvalid, ::testing::HasSubstr("overflow")));

  // Still in sync and working.
  a.Upload(Input(12, rank, n, CommDType::kF32));
  ASSERT_OK(comm_->AllReduce(pa, pb, n, CommDType::kF32, ReduceOp::kSum));
  ExpectResult(b.Download(0, n * 4), Reference(12, world, 0, n, CommDType::kF32, ReduceOp::kSum),
               CommDType::kF32, ReduceOp::kSum, true, world, "all-reduce after errors");
}

}  // namespace
}  // namespace ps
