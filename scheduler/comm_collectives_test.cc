// CommCollectives over a communicator that needs device memory (as nccl does), on the emulated
// accelerator: world sizes 1..4 as threads, every buffer handed to the communicator checked to be
// device memory of the rank's backend (scheduler/testing/device_checking_communicator.h), results
// compared with the host path's arithmetic (f32 sums in rank order, divided by the world, rounded
// once), and the staging counted on the accelerator.
#include "scheduler/comm_collectives.h"

#include <cstdint>
#include <cstring>
#include <functional>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "absl/strings/str_cat.h"
#include "base/status_macros.h"
#include "base/testing/status_matchers.h"
#include "comm/communicator.h"
#include "comm/testing/thread_communicator.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "memory/backend.h"
#include "memory/convert.h"
#include "memory/cpu_backend.h"
#include "memory/device_memory.h"
#include "memory/dtype.h"
#include "memory/dtype_math.h"
#include "memory/memory_tracker.h"
#include "scheduler/testing/device_checking_communicator.h"

namespace ps {
namespace {

using ::testing::HasSubstr;

// Multiples of 1/4 in [-4, 4): exact in every dtype, and their f32 sums over <= 4 ranks too.
float Value(int rank, int slot, int64_t i) {
  return static_cast<float>((rank * 13 + slot * 7 + i * 3) % 32 - 16) / 4.0f;
}
float Round(float x, DType dtype) {
  switch (dtype) {
    case DType::kF16:
      return HalfBitsToFloat(FloatToHalfBits(x));
    case DType::kBF16:
      return BFloat16BitsToFloat(FloatToBFloat16Bits(x));
    default:
      return x;
  }
}

// One rank's emulated accelerator and its device-memory collectives.
struct DeviceRank {
  std::unique_ptr<Backend> backend;
  std::unique_ptr<DeviceMemory> accel;
  std::unique_ptr<DeviceCheckingCommunicator> comm;
  std::unique_ptr<CommCollectives> collectives;

  static absl::StatusOr<std::unique_ptr<DeviceRank>> Create(Communicator* inner,
                                                            int64_t chunk_elems, DType dtype,
                                                            int64_t cap_bytes = 8 << 20) {
    auto r = std::make_unique<DeviceRank>();
    ASSIGN_OR_RETURN(r->backend, CreateCpuBackend({.capacity_bytes = cap_bytes}));
    DeviceMemoryOptions options;
    options.chunk_block_bytes = 4096;
    ASSIGN_OR_RETURN(r->accel, CreateAcceleratorMemory(r->backend.get(), options));
    r->comm = std::make_unique<DeviceCheckingCommunicator>(inner, r->backend.get());
    ASSIGN_OR_RETURN(r->collectives,
                     CommCollectives::Create(r->comm.get(), {.timeout = absl::Seconds(60),
                                                             .backend = r->backend.get(),
                                                             .accelerator = r->accel.get(),
                                                             .chunk_elems = chunk_elems,
                                                             .dtype = dtype}));
    return r;
  }
};

// Runs `body(rank, communicator)` on every rank of a thread world.
std::vector<absl::Status> RunWorld(int world,
                                   const std::function<absl::Status(int, Communicator*)>& body) {
  std::vector<std::unique_ptr<Communicator>> comms =
      CreateThreadCommunicators(world, absl::Seconds(60));
  std::vector<absl::Status> status(static_cast<size_t>(world));
  std::vector<std::thread> threads;
  for (int r = 0; r < world; ++r) {
    threads.emplace_back([&, r] { status[r] = body(r, comms[r].get()); });
  }
  for (std::thread& t : threads) t.join();
  return status;
}

absl::Status WriteValues(void* dst, DType dtype, const std::vector<float>& values) {
  return Convert(DType::kF32, values.data(), dtype, dst, static_cast<int64_t>(values.size()));
}
absl::StatusOr<std::vector<float>> ReadValues(const void* src, DType dtype, int64_t n) {
  std::vector<float> out(static_cast<size_t>(n));
  RETURN_IF_ERROR(Convert(dtype, src, DType::kF32, out.data(), n));
  return out;
}

struct WorldParam {
  int world;
  DType dtype;
};

class DeviceCollectivesTest : public ::testing::TestWithParam<WorldParam> {};

TEST_P(DeviceCollectivesTest, GroupCollectivesAndScalarsRunOnDeviceMemoryOnly) {
  const WorldParam p = GetParam();
  // An odd element count (a tail after any vector width), and with 3+ ranks a padding slot.
  constexpr int64_t kElems = 301;
  const int padding = p.world >= 3 ? p.world - 1 : -1;
  std::vector<absl::Status> status =
      RunWorld(p.world, [&](int rank, Communicator* inner) -> absl::Status {
        ASSIGN_OR_RETURN(std::unique_ptr<DeviceRank> r, DeviceRank::Create(inner, kElems, p.dtype));
        CommCollectives& c = *r->collectives;
        const int64_t staging = CommCollectives::DeviceStagingBytes(p.world, kElems, p.dtype);
        if (c.staging_bytes() != staging) {
          return absl::InternalError(absl::StrCat("staging ", c.staging_bytes(), " != ", staging));
        }
        // The staging is non-model data on the accelerator (the tide sees it).
        const int64_t nonmodel = r->accel->tracker()->current_bytes(MemoryKind::kNonModelData);
        if (nonmodel < staging) {
          return absl::InternalError(absl::StrCat("the accelerator counts ", nonmodel,
                                                  " non-model bytes, less than the staging ",
                                                  staging));
        }
        const int64_t bytes = kElems * SizeOf(p.dtype);
        std::vector<void*> payloads(static_cast<size_t>(p.world), nullptr);
        for (int q = 0; q < p.world; ++q) {
          if (q == padding) continue;
          ASSIGN_OR_RETURN(payloads[q], r->backend->AllocateDevice(bytes));
        }
        if (p.world > 1) {
          // All-gather: the owner's values everywhere; the others start as garbage.
          for (int q = 0; q < p.world; ++q) {
            if (payloads[q] == nullptr) continue;
            std::vector<float> v(kElems);
            for (int64_t i = 0; i < kElems; ++i) v[i] = q == rank ? Value(q, q, i) : 99.0f;
            RETURN_IF_ERROR(WriteValues(payloads[q], p.dtype, v));
          }
          RETURN_IF_ERROR(c.AllGatherGroup(7, payloads, kElems, p.dtype));
          for (int q = 0; q < p.world; ++q) {
            if (payloads[q] == nullptr) continue;
            ASSIGN_OR_RETURN(std::vector<float> got, ReadValues(payloads[q], p.dtype, kElems));
            for (int64_t i = 0; i < kElems; ++i) {
              if (got[i] != Value(q, q, i)) {
                return absl::DataLossError(
                    absl::StrCat("rank ", rank, ": all-gathered slot ", q, "[", i, "] = ", got[i]));
              }
            }
          }
          // Reduce-scatter: this rank's gradients for every slot; its own slot gets the mean.
          for (int q = 0; q < p.world; ++q) {
            if (payloads[q] == nullptr) continue;
            std::vector<float> v(kElems);
            for (int64_t i = 0; i < kElems; ++i) v[i] = Value(rank, q, i);
            RETURN_IF_ERROR(WriteValues(payloads[q], p.dtype, v));
          }
          RETURN_IF_ERROR(c.ReduceScatterGroup(7, payloads, kElems, p.dtype));
          if (payloads[rank] != nullptr) {
            ASSIGN_OR_RETURN(std::vector<float> got, ReadValues(payloads[rank], p.dtype, kElems));
            for (int64_t i = 0; i < kElems; ++i) {
              float sum = 0;
              for (int q = 0; q < p.world; ++q) sum += Value(q, rank, i);
              const float want = Round(sum / static_cast<float>(p.world), p.dtype);
              if (got[i] != want) {
                return absl::DataLossError(
                    absl::StrCat("rank ", rank, ": mean[", i, "] = ", got[i], ", want ", want));
              }
            }
          }
        }
        // Scalar agreement through the device word.
        double sum_squares = 0.25 * (rank + 1);
        int64_t nonfinite = rank == 0 ? 3 : 0;
        RETURN_IF_ERROR(c.ReduceGradStats(sum_squares, nonfinite));
        double want_squares = 0;
        for (int q = 0; q < p.world; ++q) want_squares += 0.25 * (q + 1);
        if (sum_squares != want_squares || nonfinite != 3) {
          return absl::DataLossError(
              absl::StrCat("rank ", rank, ": grad stats ", sum_squares, " / ", nonfinite));
        }
        ASSIGN_OR_RETURN(const double mean, c.AllReduceMean(2.0 * rank));
        if (mean != static_cast<double>(p.world - 1)) {
          return absl::DataLossError(absl::StrCat("rank ", rank, ": mean ", mean));
        }
        ASSIGN_OR_RETURN(const std::vector<int64_t> all, c.AllGatherInt64(100 + rank));
        for (int q = 0; q < p.world; ++q) {
          if (all[q] != 100 + q) return absl::DataLossError("AllGatherInt64");
        }
        if (r->comm->checked_buffers() == 0) return absl::InternalError("nothing was checked");
        for (void* payload : payloads) {
          if (payload != nullptr) RETURN_IF_ERROR(r->backend->FreeDevice(payload));
        }
        return absl::OkStatus();
      });
  for (int r = 0; r < p.world; ++r) EXPECT_OK(status[r]) << "rank " << r;
}

INSTANTIATE_TEST_SUITE_P(Worlds, DeviceCollectivesTest,
                         ::testing::Values(WorldParam{1, DType::kF32}, WorldParam{2, DType::kF32},
                                           WorldParam{3, DType::kBF16}, WorldParam{4, DType::kF16},
                                           WorldParam{4, DType::kF32}),
                         [](const ::testing::TestParamInfo<WorldParam>& info) {
                           return absl::StrCat(info.param.world, "Ranks",
                                               DTypeName(info.param.dtype));
                         });

// The check is real: host memory handed to a device-memory communicator is refused on every rank
// before anything is communicated.
TEST(DeviceCollectives, HostPayloadsAreRefused) {
  std::vector<absl::Status> status = RunWorld(2, [](int rank, Communicator* inner) -> absl::Status {
    ASSIGN_OR_RETURN(std::unique_ptr<DeviceRank> r, DeviceRank::Create(inner, 64, DType::kF32));
    std::vector<float> a(64), b(64);
    std::vector<void*> host = {a.data(), b.data()};
    absl::Status gathered = r->collectives->AllGatherGroup(0, host, 64, DType::kF32);
    if (gathered.code() != absl::StatusCode::kInvalidArgument) {
      return absl::InternalError(absl::StrCat("all-gather of host memory: ", gathered.ToString()));
    }
    absl::Status direct =
        r->comm->AllReduce(a.data(), b.data(), 64, CommDType::kF32, ReduceOp::kSum);
    if (direct.code() != absl::StatusCode::kInvalidArgument) {
      return absl::InternalError(absl::StrCat("all-reduce of host memory: ", direct.ToString()));
    }
    return absl::OkStatus();
  });
  for (const absl::Status& s : status) EXPECT_OK(s);
}

TEST(DeviceCollectives, MisconfigurationIsAnErrorThatNamesTheFix) {
  std::vector<std::unique_ptr<Communicator>> comms = CreateThreadCommunicators(1);
  ASSERT_OK_AND_ASSIGN(auto backend, CreateCpuBackend({.capacity_bytes = 1 << 20}));
  DeviceCheckingCommunicator device(comms[0].get(), backend.get());
  EXPECT_THAT(CommCollectives::Create(&device, {}),
              StatusIs(absl::StatusCode::kInvalidArgument,
                       HasSubstr("CommCollectivesOptions.backend and .accelerator")));
  // The host-only constructor cannot stage on the device.
  CommCollectives host_only(&device);
  double s = 1;
  int64_t n = 0;
  EXPECT_THAT(host_only.ReduceGradStats(s, n), StatusIs(absl::StatusCode::kFailedPrecondition,
                                                        HasSubstr("CommCollectives::Create")));
  // A host communicator needs nothing more.
  EXPECT_OK(CommCollectives::Create(comms[0].get(), {}).status());
}

TEST(DeviceCollectives, StagingThatDoesNotFitIsResourceExhausted) {
  std::vector<absl::Status> status = RunWorld(2, [](int rank, Communicator* inner) -> absl::Status {
    // Two chunks of 1 Mi f32 elements (8 MiB) on a 4 MiB accelerator.
    absl::StatusOr<std::unique_ptr<DeviceRank>> r =
        DeviceRank::Create(inner, 1 << 20, DType::kF32, /*cap_bytes=*/4 << 20);
    if (r.status().code() != absl::StatusCode::kResourceExhausted ||
        r.status().message().find("staging") == std::string::npos) {
      return absl::InternalError(
          absl::StrCat("want ResourceExhausted naming the staging, got ", r.status().ToString()));
    }
    return absl::OkStatus();
  });
  for (const absl::Status& s : status) EXPECT_OK(s);
}

}  // namespace
}  // namespace ps
