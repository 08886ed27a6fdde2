#include "comm/testing/thread_communicator.h"

#include <cstdint>
#include <cstring>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/str_cat.h"
#include "base/mutex.h"
#include "base/status_macros.h"
#include "comm/internal/collective.h"
#include "comm/internal/completion.h"
#include "glog/logging.h"
#include "memory/dtype_math.h"

namespace ps {
namespace {

using comm_internal::Collective;
using comm_internal::CollectiveCall;

// The state all ranks of one world share.
class World {
 public:
  World(int size, absl::Duration timeout)
      : size_(size), timeout_(timeout), calls_(static_cast<size_t>(size)) {}

  int size() const { return size_; }

  // Runs `call` as rank `rank` (see the file comment).
  absl::Status Run(int rank, const CollectiveCall& call) {
    {
      MutexLock lock(&mu_);
      calls_[static_cast<size_t>(rank)] = call;
    }
    RETURN_IF_ERROR(Barrier(call));
    // Every rank posted its call and nobody writes before the second barrier.
    std::vector<CollectiveCall> calls;
    {
      MutexLock lock(&mu_);
      calls = calls_;
    }
    absl::Status consistent = CheckConsistent(calls);
    std::vector<uint8_t> result;
    if (consistent.ok()) result = Compute(rank, calls);
    RETURN_IF_ERROR(Barrier(call));
    RETURN_IF_ERROR(consistent);
    if (!result.empty()) std::memcpy(call.recv, result.data(), result.size());
    return absl::OkStatus();
  }

 private:
  absl::Status Barrier(const CollectiveCall& call) {
    MutexLock lock(&mu_);
    if (broken_) return Broken(call);
    const int64_t generation = generation_;
    if (++arrived_ == size_) {
      arrived_ = 0;
      ++generation_;
      return absl::OkStatus();
    }
    const bool ok = mu_.AwaitWithTimeout(
        [&]() ABSL_NO_THREAD_SAFETY_ANALYSIS { return generation_ != generation || broken_; },
        timeout_);
    if (generation_ != generation) return absl::OkStatus();
    broken_ = true;
    if (!ok) {
      return absl::DeadlineExceededError(
          absl::StrCat(CollectiveName(call.kind), ": not every rank of the thread world of ",
                       size_, " arrived within ", absl::FormatDuration(timeout_)));
    }
    return Broken(call);
  }

  absl::Status Broken(const CollectiveCall& call) const {
    return absl::UnavailableError(absl::StrCat(CollectiveName(call.kind),
                                               ": the thread world is broken (a rank timed out "
                                               "or stopped taking part)"));
  }

  absl::Status CheckConsistent(const std::vector<CollectiveCall>& calls) const {
    for (const CollectiveCall& c : calls) {
      if (c.kind != calls[0].kind || c.count_elems != calls[0].count_elems ||
          c.dtype != calls[0].dtype || c.op != calls[0].op || c.root != calls[0].root) {
        return absl::InternalError(absl::StrCat(
            "mismatched collectives across the thread world: ",
            comm_internal::Describe(calls[0], 0, size_), " vs ", comm_internal::Describe(c, 0, size_)));
      }
    }
    return absl::OkStatus();
  }

  static float Load(const void* base, int64_t i, CommDType dtype) {
    switch (dtype) {
      case CommDType::kF32:
        return static_cast<const float*>(base)[i];
      case CommDType::kF16:
        return HalfBitsToFloat(static_cast<const uint16_t*>(base)[i]);
      case CommDType::kBF16:
        return BFloat16BitsToFloat(static_cast<const uint16_t*>(base)[i]);
      default:
        LOG(FATAL) << "not a floating-point dtype";
    }
  }

  static void Store(void* base, int64_t i, CommDType dtype, float v) {
    switch (dtype) {
      case CommDType::kF32:
        static_cast<float*>(base)[i] = v;
        return;
      case CommDType::kF16:
        static_cast<uint16_t*>(base)[i] = FloatToHalfBits(v);
        return;
      case CommDType::kBF16:
        static_cast<uint16_t*>(base)[i] = FloatToBFloat16Bits(v);
        return;
      default:
        LOG(FATAL) << "not a floating-point dtype";
    }
  }

  // The reduction over ranks of elements [offset, offset + count) of every rank's send buffer.
  std::vector<uint8_t> Reduce(const std::vector<CollectiveCall>& calls, int64_t offset,
                              int64_t count, ReduceOp op) const {
    const CommDType dtype = calls[0].dtype;
    const int64_t elem = CommDTypeSize(dtype);
    std::vector<uint8_t> out(static_cast<size_t>(count * elem));
    for (int64_t i = 0; i < count; ++i) {
      if (IsFloatingPoint(dtype)) {
        float acc = Load(calls[0].send, offset + i, dtype);
        for (int r = 1; r < size_; ++r) {
          const float v = Load(calls[static_cast<size_t>(r)].send, offset + i, dtype);
          acc = op == ReduceOp::kMax ? std::max(acc, v) : acc + v;
        }
        if (op == ReduceOp::kAvg) acc /= static_cast<float>(size_);
        Store(out.data(), i, dtype, acc);
      } else if (dtype == CommDType::kI32) {
        uint32_t acc = static_cast<const uint32_t*>(calls[0].send)[offset + i];
        for (int r = 1; r < size_; ++r) {
          const uint32_t v = static_cast<const uint32_t*>(calls[static_cast<size_t>(r)].send)[offset + i];
          acc = op == ReduceOp::kMax
                    ? static_cast<uint32_t>(std::max(static_cast<int32_t>(acc), static_cast<int32_t>(v)))
                    : acc + v;
        }
        std::memcpy(out.data() + i * elem, &acc, sizeof(acc));
      } else {
        uint8_t acc = static_cast<const uint8_t*>(calls[0].send)[offset + i];
        for (int r = 1; r < size_; ++r) {
          const uint8_t v = static_cast<const uint8_t*>(calls[static_cast<size_t>(r)].send)[offset + i];
          acc = op == ReduceOp::kMax ? std::max(acc, v) : static_cast<uint8_t>(acc + v);
        }
        out[static_cast<size_t>(i)] = acc;
      }
    }
    return out;
  }

  std::vector<uint8_t> Compute(int rank, const std::vector<CollectiveCall>& calls) const {
    const CollectiveCall& mine = calls[static_cast<size_t>(rank)];
    const int64_t count = mine.count_elems;
    const int64_t bytes = count * CommDTypeSize(mine.dtype);
    if (count == 0) return {};
    switch (mine.kind) {
      case Collective::kAllGather: {
        std::vector<uint8_t> out(static_cast<size_t>(bytes * size_));
        for (int r = 0; r < size_; ++r) {
          std::memcpy(out.data() + r * bytes, calls[static_cast<size_t>(r)].send,
                      static_cast<size_t>(bytes));
        }
        return out;
      }
      case Collective::kReduceScatter:
        return Reduce(calls, rank * count, count, mine.op);
      case Collective::kAllReduce:
        return Reduce(calls, 0, count, mine.op);
      case Collective::kBroadcast: {
        const uint8_t* src = static_cast<const uint8_t*>(calls[static_cast<size_t>(mine.root)].send);
        return std::vector<uint8_t>(src, src + bytes);
      }
      case Collective::kBarrier:
        return {};
    }
    return {};
  }

  const int size_;
  const absl::Duration timeout_;
  Mutex mu_;
  std::vector<CollectiveCall> calls_ ABSL_GUARDED_BY(mu_);
  int arrived_ ABSL_GUARDED_BY(mu_) = 0;
  int64_t generation_ ABSL_GUARDED_BY(mu_) = 0;
  bool broken_ ABSL_GUARDED_BY(mu_) = false;
};

class ThreadCommunicator final : public Communicator {
 public:
  ThreadCommunicator(std::shared_ptr<World> world, int rank)
      : world_(std::move(world)), rank_(rank) {}

  absl::string_view name() const override { return "thread"; }
  int rank() const override { return rank_; }
  int world_size() const override { return world_->size(); }
  CommMemory memory() const override { return CommMemory::kHost; }

  absl::StatusOr<std::unique_ptr<CommRequest>> AllGatherAsync(const void* send, void* recv,
                                                              int64_t count_elems,
                                                              CommDType dtype) override {
    CollectiveCall call{.kind = Collective::kAllGather,
                        .send = send,
                        .recv = recv,
                        .count_elems = count_elems,
                        .dtype = dtype};
    return Run(call);
  }
  absl::StatusOr<std::unique_ptr<CommRequest>> ReduceScatterAsync(const void* send, void* recv,
                                                                  int64_t count_elems,
                                                                  CommDType dtype,
                                                                  ReduceOp op) override {
    CollectiveCall call{.kind = Collective::kReduceScatter,
                        .send = send,
                        .recv = recv,
                        .count_elems = count_elems,
                        .dtype = dtype,
                        .op = op};
    return Run(call);
  }
  absl::StatusOr<std::unique_ptr<CommRequest>> AllReduceAsync(const void* send, void* recv,
                                                              int64_t count_elems,
                                                              CommDType dtype,
                                                              ReduceOp op) override {
    CollectiveCall call{.kind = Collective::kAllReduce,
                        .send = send,
                        .recv = recv,
                        .count_elems = count_elems,
                        .dtype = dtype,
                        .op = op};
    return Run(call);
  }
  absl::StatusOr<std::unique_ptr<CommRequest>> BroadcastAsync(const void* send, void* recv,
                                                              int64_t count_elems,
                                                              CommDType dtype, int root) override {
    CollectiveCall call{.kind = Collective::kBroadcast,
                        .send = send,
                        .recv = recv,
                        .count_elems = count_elems,
                        .dtype = dtype,
                        .root = root};
    return Run(call);
  }
  absl::StatusOr<std::unique_ptr<CommRequest>> BarrierAsync() override {
    CollectiveCall call{.kind = Collective::kBarrier};
    return Run(call);
  }

 private:
  absl::StatusOr<std::unique_ptr<CommRequest>> Run(CollectiveCall call) {
    RETURN_IF_ERROR(comm_internal::Validate(call, rank_, world_->size()));
    // Only the root's send is read; the others may pass null.
    if (call.kind == Collective::kBroadcast && rank_ != call.root) call.send = nullptr;
    absl::Status status = world_->Run(rank_, call);
    return comm_internal::CompletedRequest(comm_internal::Describe(call, rank_, world_->size()),
                                           std::move(status));
  }

  std::shared_ptr<World> world_;
  const int rank_;
};

}  // namespace

std::vector<std::unique_ptr<Communicator>> CreateThreadCommunicators(int world_size,
                                                                    absl::Duration timeout) {
  CHECK_GE(world_size, 1);
  auto world = std::make_shared<World>(world_size, timeout);
  std::vector<std::unique_ptr<Communicator>> comms;
  for (int r = 0; r < world_size; ++r) {
    comms.push_back(std::make_unique<ThreadCommunicator>(world, r));
  }
  return comms;
}

}  // namespace ps
