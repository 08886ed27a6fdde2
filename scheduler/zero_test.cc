// ZeRO data parallelism in the ChunkManager, with N ranks as threads of one process talking
// through comm/testing's thread communicator and the real CommCollectives.
//
// Every rank runs the same access program (a forward over the operators with operator 0 used
// twice, like GPT's tied embedding, then the backward in reverse). Parameters are written by
// their owners only; gradients differ by rank. Checked on every rank: an operator always sees
// its owner's current parameters (gathered), the owner's param chunk holds the exact mean of the
// ranks' gradients after backward (computed the way the communicator does), remote payloads are
// freed when their group is done, a tied operator's group is reduced only after its last
// backward use, the resident bytes stay under the limits, and per-rank model bytes are the
// rank's share.
#include <algorithm>
#include <cstdint>
#include <cstring>
#include <memory>
#include <random>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "base/status_macros.h"
#include "base/testing/status_matchers.h"
#include "chunk/chunk.h"
#include "chunk/chunk_layout.h"
#include "chunk/chunk_store.h"
#include "chunk/chunk_type.h"
#include "chunk/operator_spec.h"
#include "chunk/tensor_state.h"
#include "comm/communicator.h"
#include "comm/testing/thread_communicator.h"
#include "glog/logging.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "memory/backend.h"
#include "memory/convert.h"
#include "memory/cpu_backend.h"
#include "memory/device.h"
#include "memory/device_memory.h"
#include "memory/dtype.h"
#include "memory/dtype_math.h"
#include "scheduler/chunk_manager.h"
#include "scheduler/comm_collectives.h"
#include "scheduler/metronome.h"
#include "scheduler/testing/device_checking_communicator.h"

namespace ps {
namespace {

using ::testing::HasSubstr;

// Parameter value of element i of tensor t at version v: multiples of 1/8 in [-4, 4), exact in
// every dtype.
float Param(TensorId t, int64_t i, int v) {
  return static_cast<float>((t * 7 + i * 3 + v * 5) % 64 - 32) / 8.0f;
}
// Gradient of rank r: multiples of 1/4, exact in every dtype; sums over ranks are exact in f32.
float Grad(int r, TensorId t, int64_t i, int v) {
  return static_cast<float>((r * 11 + t * 5 + i + v * 3) % 32 - 16) / 4.0f;
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
// The mean the communicators compute: f32 sum in rank order, divided by the world, rounded once.
float MeanGrad(int world, TensorId t, int64_t i, int v, DType dtype) {
  float sum = 0;
  for (int r = 0; r < world; ++r) sum += Grad(r, t, i, v);
  return Round(sum / static_cast<float>(world), dtype);
}

struct ZeroSetup {
  int world = 2;
  DType dtype = DType::kF32;
  int64_t chunk_elems = 256;
  std::vector<int64_t> op_numels;
  // The emulated accelerator's cap in chunks (of f32 chunk blocks).
  int64_t cap_chunks = 64;
  uint64_t seed = 1;
  // The communicator needs device memory (as nccl does): every buffer it is handed is checked to
  // be the rank's accelerator memory (scheduler/testing/device_checking_communicator.h).
  bool device_comm = false;
  // The manager gets a compute stream, and the "kernels" run on it, queued behind a stall: the
  // forward's reads and the backward's gradient writes happen only when the host next waits.
  bool queued_kernels = false;
  // Operators with an index below this are frozen (a LoRA base before its adapters).
  int64_t frozen_ops = 0;
};

// One rank: its emulated accelerator, memories, chunks, collectives and manager.
class Rank {
 public:
  static absl::StatusOr<std::unique_ptr<Rank>> Create(const ZeroSetup& setup, Communicator* comm) {
    std::unique_ptr<Rank> r(new Rank());
    r->setup_ = setup;
    const int64_t block = setup.chunk_elems * 4;
    DeviceMemoryOptions accel_options;
    accel_options.chunk_block_bytes = block;
    int64_t cap_bytes = setup.cap_chunks * block;
    if (setup.device_comm) {
      // The collectives' staging lives in the scratch allocator: exact-size segments, and room
      // for them beside the chunks.
      accel_options.scratch.round_bytes = 512;
      accel_options.scratch.small_request_max_bytes = 512;
      accel_options.scratch.small_segment_bytes = 512;
      accel_options.scratch.large_segment_round_bytes = 512;
      const int64_t staging =
          CommCollectives::DeviceStagingBytes(setup.world, setup.chunk_elems, setup.dtype);
      cap_bytes += (staging + 511) / 512 * 512;
    }
    ASSIGN_OR_RETURN(r->backend_, CreateCpuBackend({.capacity_bytes = cap_bytes}));
    ASSIGN_OR_RETURN(r->accel_, CreateAcceleratorMemory(r->backend_.get(), accel_options));
    DeviceMemoryOptions host_options;
    host_options.chunk_block_bytes = block;
    host_options.pinned = false;
    ASSIGN_OR_RETURN(r->host_, CreateHostMemory(nullptr, host_options));
    std::vector<OperatorSpec> ops;
    for (size_t i = 0; i < setup.op_numels.size(); ++i) {
      ops.push_back({absl::StrCat("op", i), {{absl::StrCat("op", i, ".w"), {setup.op_numels[i]}}}});
      ops.back().trainable = static_cast<int64_t>(i) >= setup.frozen_ops;
    }
    ChunkLayoutOptions layout_options;
    layout_options.capacity_elems = setup.chunk_elems;
    layout_options.world_size = setup.world;
    ASSIGN_OR_RETURN(ChunkLayout layout, ChunkLayout::Build(layout_options, ops));
    ChunkStoreOptions store_options;
    store_options.compute_dtype = setup.dtype;
    store_options.rank = comm->rank();
    ASSIGN_OR_RETURN(r->store_, ChunkStore::Create(std::move(layout), store_options));
    if (setup.device_comm) {
      r->device_comm_ = std::make_unique<DeviceCheckingCommunicator>(comm, r->backend_.get());
      ASSIGN_OR_RETURN(r->collectives_, CommCollectives::Create(r->device_comm_.get(),
                                                                {.timeout = absl::Seconds(60),
                                                                 .backend = r->backend_.get(),
                                                                 .accelerator = r->accel_.get(),
                                                                 .chunk_elems = setup.chunk_elems,
                                                                 .dtype = setup.dtype}));
    } else {
      r->collectives_ = std::make_unique<CommCollectives>(comm, absl::Seconds(60));
    }
    ChunkManagerOptions options;
    options.collectives = r->collectives_.get();
    if (setup.queued_kernels) {
      ASSIGN_OR_RETURN(r->compute_, r->backend_->CreateStream());
      options.compute_stream = r->compute_.get();
    }
    options.warmup_chunk_fraction = 1.0;
    ASSIGN_OR_RETURN(r->manager_, ChunkManager::Create(r->store_.get(), r->backend_.get(),
                                                       r->accel_.get(), r->host_.get(), options));
    return r;
  }

  ~Rank() {
    manager_.reset();
    store_.reset();
  }

  // Buffers the device-memory communicator checked (0 without one).
  int64_t checked_buffers() const {
    return device_comm_ != nullptr ? device_comm_->checked_buffers() : 0;
  }

  // With queued kernels: the host waits for them (a host read of a payload comes after the
  // kernels and loads enqueued before it).
  absl::Status SyncCompute() {
    return compute_ != nullptr ? compute_->Synchronize() : absl::OkStatus();
  }

  // Holds the compute stream (unless it is held already) until the host next waits.
  absl::Status Stall() {
    if (stall_ != nullptr && stall_->active()) return absl::OkStatus();
    ASSIGN_OR_RETURN(stall_, StallCpuStream(*compute_));
    return absl::OkStatus();
  }

  // Writes `values` into tensor `t`'s param payload: on the host, or with queued kernels as a
  // kernel on the compute stream behind a stall that ends at the host's next wait.
  absl::Status WriteGradient(TensorId t, std::vector<float> values) {
    if (compute_ == nullptr) {
      WriteTensor(ChunkType::kParam, t, values);
      return absl::OkStatus();
    }
    ASSIGN_OR_RETURN(const TensorView v, store_->View(ChunkType::kParam, t));
    RETURN_IF_ERROR(Stall());
    return compute_->LaunchHostFunc([v, values = std::move(values)] {
      CHECK(Convert(DType::kF32, values.data(), v.dtype, v.data, v.numel).ok());
    });
  }

  // Forward "kernel": with queued kernels, reads the operator's parameters on the compute stream
  // behind a stall and checks them once the host waited; otherwise checks them at once.
  absl::Status QueueForwardRead(OperatorId op, int v, std::vector<float>* seen) {
    if (compute_ == nullptr) return CheckParams(op, v);
    const TensorId t = layout().op(op).tensors[0];
    ASSIGN_OR_RETURN(const TensorView view, store_->View(ChunkType::kParam, t));
    RETURN_IF_ERROR(Stall());
    return compute_->LaunchHostFunc([view, seen] {
      seen->resize(static_cast<size_t>(view.numel));
      CHECK(Convert(view.dtype, view.data, DType::kF32, seen->data(), view.numel).ok());
    });
  }
  absl::Status CheckForwardRead(OperatorId op, int v, const std::vector<float>& seen) {
    if (compute_ == nullptr) return absl::OkStatus();
    RETURN_IF_ERROR(SyncCompute());
    const TensorId t = layout().op(op).tensors[0];
    if (seen.size() != static_cast<size_t>(layout().tensor(t).numel)) {
      return absl::InternalError(
          absl::StrCat("rank ", rank(), ": op", op, "'s queued read never ran"));
    }
    for (size_t i = 0; i < seen.size(); ++i) {
      if (seen[i] != Round(Param(t, i, v), setup_.dtype)) {
        return absl::DataLossError(absl::StrCat("rank ", rank(), ": the queued kernel of op", op,
                                                " read [", i, "] = ", seen[i],
                                                ", want parameter version ", v));
      }
    }
    return absl::OkStatus();
  }

  ChunkManager& manager() { return *manager_; }
  ChunkStore& store() { return *store_; }
  const ChunkLayout& layout() const { return store_->layout(); }
  int rank() const { return store_->rank(); }

  std::vector<float> ReadTensor(ChunkType type, TensorId t) const {
    absl::StatusOr<TensorView> v = store_->View(type, t);
    CHECK(v.ok()) << v.status();
    std::vector<float> out(static_cast<size_t>(v->numel));
    CHECK(Convert(v->dtype, v->data, DType::kF32, out.data(), v->numel).ok());
    return out;
  }
  void WriteTensor(ChunkType type, TensorId t, const std::vector<float>& values) {
    absl::StatusOr<TensorView> v = store_->View(type, t);
    CHECK(v.ok()) << v.status();
    CHECK(Convert(DType::kF32, values.data(), v->dtype, v->data, v->numel).ok());
  }

  // What an owner's optimizer step does: writes version `v` of the parameters (and, with
  // `all_types`, master/momentum/variance) into every chunk this rank owns, on the host.
  absl::Status WriteOwnedParameters(int v, bool all_types) {
    const ChunkLayout& l = layout();
    for (int64_t c = 0; c < l.num_chunks(); ++c) {
      if (!l.HoldsPayload(ChunkType::kMaster, c, rank())) continue;
      const std::vector<ChunkType> types =
          all_types ? std::vector<ChunkType>(kAllChunkTypes.begin(), kAllChunkTypes.end())
                    : std::vector<ChunkType>{ChunkType::kParam};
      RETURN_IF_ERROR(manager_->AccessChunks(c, types, Device::Host(), AccessMode::kReadWrite));
      for (TensorId t : l.TensorsInChunk(c)) {
        std::vector<float> values(static_cast<size_t>(l.tensor(t).numel));
        for (size_t i = 0; i < values.size(); ++i) values[i] = Param(t, i, v);
        for (ChunkType type : types) WriteTensor(type, t, values);
      }
      RETURN_IF_ERROR(manager_->ReleaseChunks(c, types));
    }
    return absl::OkStatus();
  }

  // Writes version `v` of the parameters into every frozen chunk this rank owns (the base's
  // initialization: WriteOwnedParameters covers the chunks with optimizer state only).
  absl::Status WriteFrozenParameters(int v) {
    const ChunkLayout& l = layout();
    for (int64_t c = 0; c < l.num_chunks(); ++c) {
      if (l.chunk_trainable(c) || !l.HoldsPayload(ChunkType::kParam, c, rank())) continue;
      RETURN_IF_ERROR(
          manager_->AccessChunks(c, {ChunkType::kParam}, Device::Host(), AccessMode::kReadWrite));
      for (TensorId t : l.TensorsInChunk(c)) {
        std::vector<float> values(static_cast<size_t>(l.tensor(t).numel));
        for (size_t i = 0; i < values.size(); ++i) values[i] = Param(t, i, v);
        WriteTensor(ChunkType::kParam, t, values);
      }
      RETURN_IF_ERROR(manager_->ReleaseChunks(c, {ChunkType::kParam}));
    }
    return absl::OkStatus();
  }

  // A LoRA-style iteration at trainable version v: forward over every operator, backward in
  // reverse where only trainable operators write gradients; frozen operators must read version 0
  // in every pass, their groups are freed without a reduce-scatter, and the owners of trainable
  // chunks hold the mean gradients. Then the owners write version v + 1 of the trainable ones.
  absl::Status RunFrozenIteration(int v) {
    const ChunkLayout& l = layout();
    const int64_t k = l.num_operator_ids();
    auto version = [&](OperatorId op) { return l.op(op).trainable ? v : 0; };
    const int64_t reduces_before = manager_->counters().reduce_scatters;
    RETURN_IF_ERROR(manager_->BeginIteration());
    for (OperatorId op = 0; op < k; ++op) {
      RETURN_IF_ERROR(manager_->Access(op, Stage::kForward));
      RETURN_IF_ERROR(CheckParams(op, version(op)));
      RETURN_IF_ERROR(manager_->Release(op, Stage::kForward));
      RETURN_IF_ERROR(CheckInvariants("forward release"));
    }
    for (OperatorId op = k - 1; op >= 0; --op) {
      RETURN_IF_ERROR(manager_->Access(op, Stage::kBackward));
      const TensorId t = l.op(op).tensors[0];
      RETURN_IF_ERROR(CheckParams(op, version(op)));
      if (l.op(op).trainable) {
        std::vector<float> g(static_cast<size_t>(l.tensor(t).numel));
        for (size_t i = 0; i < g.size(); ++i) g[i] = Grad(rank(), t, i, v);
        WriteTensor(ChunkType::kParam, t, g);
      }
      RETURN_IF_ERROR(manager_->Release(op, Stage::kBackward));
      RETURN_IF_ERROR(CheckInvariants("backward release"));
      // HOLD where the payload stays: the owner's chunk, or a gathered copy whose group is not
      // finished yet; a non-owner's copy is FREE once the release that finished its group's
      // backward freed it.
      ASSIGN_OR_RETURN(TensorState state, store_->tensor_state(ChunkType::kParam, t));
      const bool own = l.owner_of(l.op(op).chunk_index) == rank();
      const bool freed_copy = !own && state == TensorState::kFree &&
                              !manager_->group_gathered(l.group_of(l.op(op).chunk_index));
      if (!l.op(op).trainable && state != TensorState::kHold && !freed_copy) {
        return absl::InternalError(absl::StrCat("rank ", rank(), ": frozen op", op, " is ",
                                                TensorStateName(state), " after its backward"));
      }
    }
    for (int64_t g = 0; g < l.num_groups(); ++g) {
      if (manager_->group_gathered(g)) {
        return absl::InternalError(
            absl::StrCat("rank ", rank(), ": group ", g, " is still gathered after the backward"));
      }
    }
    int64_t trainable_groups = 0;
    for (int64_t g = 0; g < l.num_groups(); ++g) {
      if (!l.group_frozen(g) && !l.is_padding(g * l.world_size())) ++trainable_groups;
    }
    if (manager_->counters().reduce_scatters - reduces_before != trainable_groups) {
      return absl::InternalError(
          absl::StrCat("rank ", rank(), ": ", manager_->counters().reduce_scatters - reduces_before,
                       " reduce-scatters for ", trainable_groups, " trainable groups"));
    }
    for (TensorId t = 0; t < l.num_tensor_ids(); ++t) {
      const int64_t c = l.tensor(t).chunk_index;
      if (l.owner_of(c) != rank()) continue;
      const std::vector<float> got = ReadTensor(ChunkType::kParam, t);
      for (size_t i = 0; i < got.size(); ++i) {
        const float want = l.chunk_trainable(c) ? MeanGrad(setup_.world, t, i, v, setup_.dtype)
                                                : Round(Param(t, i, 0), setup_.dtype);
        if (got[i] != want) {
          return absl::DataLossError(absl::StrCat("rank ", rank(), ": tensor ", t, "[", i,
                                                  "] = ", got[i], ", want ", want));
        }
      }
    }
    ASSIGN_OR_RETURN(AdamPlacement placement, manager_->BeginAdam());
    (void)placement;
    RETURN_IF_ERROR(WriteOwnedParameters(v + 1, /*all_types=*/false));
    RETURN_IF_ERROR(manager_->EndIteration());
    return CheckInvariants("end of iteration");
  }

  // Checks that the operator's tensor holds version `v` of the parameters.
  absl::Status CheckParams(OperatorId op, int v) const {
    const TensorId t = layout().op(op).tensors[0];
    const std::vector<float> got = ReadTensor(ChunkType::kParam, t);
    for (size_t i = 0; i < got.size(); ++i) {
      if (got[i] != Round(Param(t, i, v), setup_.dtype)) {
        return absl::DataLossError(absl::StrCat("rank ", rank(), ": op", op, "[", i, "] = ", got[i],
                                                ", want parameter version ", v, " ",
                                                Param(t, i, v)));
      }
    }
    return absl::OkStatus();
  }

  // Checks the invariants that hold after every call.
  absl::Status CheckInvariants(const char* where) const {
    const ChunkLayout& l = layout();
    int64_t resident = 0;
    for (int64_t c = 0; c < l.num_chunks(); ++c) {
      const Chunk& chunk = store_->chunk(ChunkType::kParam, c);
      if (chunk.has_payload() && !chunk.device().is_host()) ++resident;
      if (!chunk.is_local() && chunk.has_payload() && !manager_->group_gathered(l.group_of(c))) {
        return absl::InternalError(absl::StrCat(where, ": rank ", rank(), ": remote chunk ", c,
                                                " has a payload but its group is not gathered"));
      }
      if (!chunk.is_local() && !chunk.has_payload() && manager_->group_gathered(l.group_of(c)) &&
          !l.is_padding(c)) {
        return absl::InternalError(absl::StrCat(where, ": rank ", rank(), ": remote chunk ", c,
                                                " of a gathered group has no payload"));
      }
    }
    if (resident * manager_->device_chunk_cost_bytes() != manager_->resident_bytes()) {
      return absl::InternalError(absl::StrCat(where, ": rank ", rank(), ": ", resident,
                                              " param chunks on the accelerator but the manager "
                                              "counts ",
                                              manager_->resident_bytes(), " bytes"));
    }
    if (manager_->resident_bytes() > manager_->current_limit_bytes() &&
        manager_->resident_bytes() > 0) {
      return absl::InternalError(absl::StrCat(where, ": rank ", rank(), ": resident ",
                                              manager_->resident_bytes(), " > limit ",
                                              manager_->current_limit_bytes()));
    }
    return absl::OkStatus();
  }

  // One training iteration at parameter version v: forward (op 0, ..., op K-1, op 0 again),
  // backward (op 0, op K-1, ..., op 0), checks, then the owners write version v + 1.
  absl::Status RunIteration(int v) {
    const int64_t k = layout().num_operator_ids();
    std::vector<OperatorId> forward;
    for (OperatorId op = 0; op < k; ++op) forward.push_back(op);
    forward.push_back(0);
    RETURN_IF_ERROR(manager_->BeginIteration());
    for (OperatorId op : forward) {
      RETURN_IF_ERROR(manager_->Access(op, Stage::kForward));
      RETURN_IF_ERROR(CheckInvariants("forward access"));
      std::vector<float> seen;
      RETURN_IF_ERROR(QueueForwardRead(op, v, &seen));
      RETURN_IF_ERROR(manager_->Release(op, Stage::kForward));
      RETURN_IF_ERROR(CheckInvariants("forward release"));
      RETURN_IF_ERROR(CheckForwardRead(op, v, seen));
    }
    // After the forward, a gathered group must still be needed: not all HOLD_AFTER_FWD.
    for (int64_t g = 0; g < layout().num_groups(); ++g) {
      if (!manager_->group_gathered(g)) continue;
      if (layout().group_of(layout().op(0).chunk_index) != g) {
        return absl::InternalError(
            absl::StrCat("rank ", rank(), ": group ", g, " is still gathered after the forward"));
      }
    }
    std::vector<OperatorId> backward = {0};
    for (OperatorId op = k - 1; op >= 0; --op) backward.push_back(op);
    const int64_t tied_group = layout().group_of(layout().op(0).chunk_index);
    for (size_t s = 0; s < backward.size(); ++s) {
      const OperatorId op = backward[s];
      RETURN_IF_ERROR(manager_->Access(op, Stage::kBackward));
      RETURN_IF_ERROR(CheckInvariants("backward access"));
      const TensorId t = layout().op(op).tensors[0];
      const bool last_use = op != 0 || s + 1 == backward.size();
      if (last_use) {
        // The slot takes this rank's gradient.
        std::vector<float> g(static_cast<size_t>(layout().tensor(t).numel));
        for (size_t i = 0; i < g.size(); ++i) g[i] = Grad(rank(), t, i, v);
        RETURN_IF_ERROR(WriteGradient(t, std::move(g)));
      } else {
        RETURN_IF_ERROR(SyncCompute());
        RETURN_IF_ERROR(CheckParams(op, v));
      }
      RETURN_IF_ERROR(manager_->Release(op, Stage::kBackward));
      RETURN_IF_ERROR(CheckInvariants("backward release"));
      // The tied operator's group waits for its second backward use.
      if (!last_use && !manager_->group_gathered(tied_group)) {
        return absl::InternalError(absl::StrCat(
            "rank ", rank(), ": the tied operator's group was reduced before its last use"));
      }
    }
    for (int64_t g = 0; g < layout().num_groups(); ++g) {
      if (manager_->group_gathered(g)) {
        return absl::InternalError(
            absl::StrCat("rank ", rank(), ": group ", g, " is still gathered after the backward"));
      }
    }
    // The owners hold the mean gradients (the reduce-scatters ran after the queued kernels).
    RETURN_IF_ERROR(SyncCompute());
    for (TensorId t = 0; t < layout().num_tensor_ids(); ++t) {
      const int64_t c = layout().tensor(t).chunk_index;
      if (layout().owner_of(c) != rank()) continue;
      const std::vector<float> got = ReadTensor(ChunkType::kParam, t);
      for (size_t i = 0; i < got.size(); ++i) {
        const float want = MeanGrad(setup_.world, t, i, v, setup_.dtype);
        if (got[i] != want) {
          return absl::DataLossError(absl::StrCat("rank ", rank(), ": gradient of tensor ", t, "[",
                                                  i, "] = ", got[i], ", want the mean ", want));
        }
      }
    }
    ASSIGN_OR_RETURN(AdamPlacement placement, manager_->BeginAdam());
    (void)placement;
    RETURN_IF_ERROR(WriteOwnedParameters(v + 1, /*all_types=*/false));
    RETURN_IF_ERROR(manager_->EndIteration());
    return CheckInvariants("end of iteration");
  }

 private:
  Rank() = default;

  ZeroSetup setup_;
  std::unique_ptr<Backend> backend_;
  std::unique_ptr<DeviceMemory> accel_;
  std::unique_ptr<DeviceMemory> host_;
  std::unique_ptr<ChunkStore> store_;
  std::unique_ptr<Stream> compute_;
  std::unique_ptr<CpuStreamStall> stall_;
  std::unique_ptr<DeviceCheckingCommunicator> device_comm_;
  std::unique_ptr<CommCollectives> collectives_;
  std::unique_ptr<ChunkManager> manager_;
};

// Runs `body(rank)` on every rank of a thread world; returns each rank's status.
std::vector<absl::Status> RunRanks(const ZeroSetup& setup,
                                   const std::function<absl::Status(Rank&)>& body) {
  std::vector<std::unique_ptr<Communicator>> comms =
      CreateThreadCommunicators(setup.world, absl::Seconds(60));
  std::vector<absl::Status> status(static_cast<size_t>(setup.world));
  std::vector<std::thread> threads;
  for (int r = 0; r < setup.world; ++r) {
    threads.emplace_back([&, r] {
      absl::StatusOr<std::unique_ptr<Rank>> rank = Rank::Create(setup, comms[r].get());
      if (!rank.ok()) {
        status[r] = rank.status();
        return;
      }
      status[r] = body(**rank);
    });
  }
  for (std::thread& t : threads) t.join();
  return status;
}

std::vector<int64_t> RandomOps(std::mt19937_64& rng, int64_t chunk_elems, int n) {
  std::vector<int64_t> numels;
  for (int i = 0; i < n; ++i) {
    numels.push_back(std::uniform_int_distribution<int64_t>(1, chunk_elems)(rng));
  }
  return numels;
}

struct Param3 {
  int world;
  DType dtype;
  bool tight;  // an accelerator cap of a few groups: chunks (remote ones too) are evicted
  bool device_comm = false;
  bool queued_kernels = false;
};

class ZeroTrainingTest : public ::testing::TestWithParam<Param3> {};

TEST_P(ZeroTrainingTest, GathersParametersAndAveragesGradientsLikeOneRank) {
  const Param3 p = GetParam();
  for (uint64_t seed = 1; seed <= 3; ++seed) {
    std::mt19937_64 rng(seed * 977 + p.world);
    ZeroSetup setup;
    setup.world = p.world;
    setup.dtype = p.dtype;
    setup.chunk_elems = 256;
    setup.op_numels = RandomOps(rng, setup.chunk_elems, 8 + static_cast<int>(seed) * 4);
    setup.cap_chunks = p.tight ? p.world + 1 : 256;
    setup.seed = seed;
    setup.device_comm = p.device_comm;
    setup.queued_kernels = p.queued_kernels;
    std::vector<absl::Status> status = RunRanks(setup, [&](Rank& r) -> absl::Status {
      RETURN_IF_ERROR(r.WriteOwnedParameters(/*v=*/0, /*all_types=*/true));
      for (int v = 0; v < 3; ++v) RETURN_IF_ERROR(r.RunIteration(v));
      const ChunkManagerCounters c = r.manager().counters();
      int64_t data_groups = 0;
      for (int64_t g = 0; g < r.layout().num_groups(); ++g) {
        if (!r.layout().is_padding(g * p.world)) ++data_groups;
      }
      if (c.reduce_scatters != 3 * data_groups) {
        return absl::InternalError(absl::StrCat("rank ", r.rank(), ": ", c.reduce_scatters,
                                                " reduce-scatters for ", data_groups,
                                                " groups in 3 iterations"));
      }
      if (c.all_gathers < 3 * data_groups) {
        return absl::InternalError(
            absl::StrCat("rank ", r.rank(), ": only ", c.all_gathers, " all-gathers"));
      }
      if (p.device_comm && r.checked_buffers() == 0) {
        return absl::InternalError("the device-memory communicator was never handed a buffer");
      }
      if (p.tight && r.layout().num_data_chunks() > setup.cap_chunks &&
          c.Total().write_backs + c.Total().clean_evictions == 0) {
        return absl::InternalError("the tight cap evicted nothing");
      }
      // Between iterations a rank holds exactly its share of the model data.
      int64_t bytes = 0;
      for (Device d : {Device::Host(), Device::Accelerator(0)})
        bytes += r.store().PayloadBytesOn(d);
      // (ChunkLayout::RankModelDataBytes also counts padding param chunks, which never get a
      // payload here: they take no part in the collectives.)
      int64_t want = 0;
      for (int64_t c = 0; c < r.layout().num_data_chunks(); ++c) {
        if (r.layout().owner_of(c) != r.rank()) continue;
        for (ChunkType type : kAllChunkTypes) want += r.layout().ChunkBytes(type, p.dtype);
      }
      if (bytes != want) {
        return absl::InternalError(absl::StrCat("rank ", r.rank(), " holds ", bytes,
                                                " bytes of chunks, its share is ", want));
      }
      return absl::OkStatus();
    });
    for (int r = 0; r < p.world; ++r) EXPECT_OK(status[r]) << "seed " << seed << " rank " << r;
  }
}

INSTANTIATE_TEST_SUITE_P(
    Worlds, ZeroTrainingTest,
    ::testing::Values(Param3{2, DType::kF32, false}, Param3{3, DType::kF32, false},
                      Param3{2, DType::kBF16, false}, Param3{3, DType::kF16, false},
                      Param3{2, DType::kF32, true}, Param3{3, DType::kBF16, true},
                      // Device-memory collectives (nccl's contract) and kernels queued on a
                      // compute stream: the reduce-scatter must see the queued gradients.
                      Param3{2, DType::kF32, false, true, true},
                      Param3{3, DType::kBF16, true, true, true},
                      Param3{4, DType::kF32, true, true, true},
                      Param3{4, DType::kF16, false, true, false},
                      Param3{2, DType::kF32, true, false, true}),
    [](const ::testing::TestParamInfo<Param3>& info) {
      return absl::StrCat(info.param.world, "Ranks", DTypeName(info.param.dtype),
                          info.param.tight ? "Tight" : "Roomy",
                          info.param.device_comm ? "DeviceComm" : "",
                          info.param.queued_kernels ? "Queued" : "");
    });

// ZeRO with a frozen base: the frozen groups are gathered for every use and freed after their
// backward without a reduce-scatter (the owners' frozen parameters stay bit-identical), the
// trainable groups are averaged as usual, and no rank ever writes a frozen chunk back.
TEST(ZeroFrozen, FrozenGroupsAreGatheredAndFreedWithoutReduction) {
  for (const auto& [world, tight] : {std::pair{2, false}, std::pair{3, true}, std::pair{2, true}}) {
    SCOPED_TRACE(absl::StrCat(world, " ranks", tight ? ", tight" : ""));
    std::mt19937_64 rng(31 * world + tight);
    ZeroSetup setup;
    setup.world = world;
    setup.chunk_elems = 256;
    setup.op_numels = RandomOps(rng, setup.chunk_elems, 14);
    setup.frozen_ops = 9;
    setup.cap_chunks = tight ? world + 1 : 256;
    std::vector<absl::Status> status = RunRanks(setup, [&](Rank& r) -> absl::Status {
      RETURN_IF_ERROR(r.layout().Validate());
      RETURN_IF_ERROR(r.WriteFrozenParameters(/*v=*/0));
      RETURN_IF_ERROR(r.WriteOwnedParameters(/*v=*/0, /*all_types=*/true));
      for (int v = 0; v < 3; ++v) RETURN_IF_ERROR(r.RunFrozenIteration(v));
      const ChunkManagerCounters c = r.manager().counters();
      if (c.frozen_writeback_bytes != 0) {
        return absl::InternalError(absl::StrCat("rank ", r.rank(), ": ", c.DebugString()));
      }
      return absl::OkStatus();
    });
    for (int r = 0; r < world; ++r) EXPECT_OK(status[r]) << "rank " << r;
  }
}

// The model-data share, exactly: 40 operators of 1000 elements, 4 per 4096-element chunk, make 10
// data chunks. A rank holds its owned param chunks (2 bytes per element in f16; padding chunks
// included) and, for its owned data chunks, master, momentum and variance (12 bytes per element).
//  - world 2: 10 chunks, 5 owned each: 5 x 14 x 4096 bytes, exactly half of one rank's 10 x 14.
//  - world 4: padded to 12 chunks; ranks 0 and 1 own 3 data chunks each (3 x 14 x 4096), ranks 2
//    and 3 own 2 data chunks and one padding param chunk each ((2 x 14 + 2) x 4096).
TEST(ZeroModelBytes, EachRankHoldsItsShare) {
  std::vector<OperatorSpec> ops;
  for (int i = 0; i < 40; ++i)
    ops.push_back({absl::StrCat("op", i), {{absl::StrCat("w", i), {1000}}}});
  ChunkLayoutOptions one;
  one.capacity_elems = 4096;
  ASSERT_OK_AND_ASSIGN(ChunkLayout single, ChunkLayout::Build(one, ops));
  constexpr int64_t kChunk = 4096;
  EXPECT_EQ(single.RankModelDataBytes(DType::kF16, 0), 10 * 14 * kChunk);
  const std::vector<std::pair<int, std::vector<int64_t>>> expected = {
      {2, {5 * 14 * kChunk, 5 * 14 * kChunk}},
      {4, {3 * 14 * kChunk, 3 * 14 * kChunk, (2 * 14 + 2) * kChunk, (2 * 14 + 2) * kChunk}}};
  for (const auto& [world, bytes] : expected) {
    ChunkLayoutOptions o = one;
    o.world_size = world;
    ASSERT_OK_AND_ASSIGN(ChunkLayout layout, ChunkLayout::Build(o, ops));
    int64_t total = 0;
    for (int r = 0; r < world; ++r) {
      EXPECT_EQ(layout.RankModelDataBytes(DType::kF16, r), bytes[r])
          << "world " << world << " rank " << r;
      total += layout.RankModelDataBytes(DType::kF16, r);
    }
    EXPECT_EQ(total, layout.TotalModelDataBytes(DType::kF16)) << "world " << world;
  }
}

// A group touched by backward but not finished (an operator of it never ran its backward) is
// reduced by BeginAdam, and with kernels queued on the compute stream the reduction must see the
// gradients the queued kernel writes; on device-memory collectives too.
TEST(ZeroQueuedKernels, BeginAdamReducesAfterTheQueuedGradientWrites) {
  for (bool device_comm : {false, true}) {
    ZeroSetup setup;
    setup.world = 2;
    setup.chunk_elems = 256;
    setup.op_numels = {256, 256};  // one group: op0 in chunk 0 (rank 0's), op1 in chunk 1
    setup.device_comm = device_comm;
    setup.queued_kernels = true;
    std::vector<absl::Status> status = RunRanks(setup, [&](Rank& r) -> absl::Status {
      RETURN_IF_ERROR(r.WriteOwnedParameters(/*v=*/0, /*all_types=*/true));
      ChunkManager& m = r.manager();
      RETURN_IF_ERROR(m.BeginIteration());
      for (OperatorId op : {0, 1}) {
        RETURN_IF_ERROR(m.Access(op, Stage::kForward));
        RETURN_IF_ERROR(m.Release(op, Stage::kForward));
      }
      const TensorId t = r.layout().op(0).tensors[0];
      RETURN_IF_ERROR(m.Access(0, Stage::kBackward));
      std::vector<float> g(static_cast<size_t>(r.layout().tensor(t).numel));
      for (size_t i = 0; i < g.size(); ++i) g[i] = Grad(r.rank(), t, i, 0);
      RETURN_IF_ERROR(r.WriteGradient(t, std::move(g)));
      RETURN_IF_ERROR(m.Release(0, Stage::kBackward));
      if (m.counters().reduce_scatters != 0 || !m.group_gathered(0)) {
        return absl::InternalError("the unfinished group was reduced or freed at the release");
      }
      RETURN_IF_ERROR(m.BeginAdam().status());
      if (m.counters().reduce_scatters != 1 || m.group_gathered(0)) {
        return absl::InternalError("BeginAdam did not reduce and free the group");
      }
      if (r.rank() == 0) {
        RETURN_IF_ERROR(r.SyncCompute());
        const std::vector<float> got = r.ReadTensor(ChunkType::kParam, t);
        for (size_t i = 0; i < got.size(); ++i) {
          const float want = MeanGrad(setup.world, t, i, 0, setup.dtype);
          if (got[i] != want) {
            return absl::DataLossError(absl::StrCat("gradient [", i, "] = ", got[i],
                                                    ", want the mean of the queued writes ", want));
          }
        }
      }
      return m.EndIteration();
    });
    for (int r = 0; r < setup.world; ++r) {
      EXPECT_OK(status[r]) << "rank " << r << (device_comm ? " (device collectives)" : "");
    }
  }
}

// A forward-only pass outside an iteration (evaluation) frees each group once all of its
// tensors are HOLD_AFTER_FWD, so at most the groups still in use stay gathered.
TEST(ZeroEvaluate, ForwardFreesFinishedGroups) {
  ZeroSetup setup;
  setup.world = 2;
  setup.op_numels = std::vector<int64_t>(12, 200);  // one operator per chunk
  std::vector<absl::Status> status = RunRanks(setup, [&](Rank& r) -> absl::Status {
    RETURN_IF_ERROR(r.WriteOwnedParameters(0, /*all_types=*/true));
    for (OperatorId op = 0; op < 12; ++op) {
      RETURN_IF_ERROR(r.manager().Access(op, Stage::kForward));
      RETURN_IF_ERROR(r.CheckParams(op, 0));
      RETURN_IF_ERROR(r.manager().Release(op, Stage::kForward));
      // ops 2g and 2g+1 form group g: after 2g+1 the group is finished with the forward.
      const int64_t g = op / 2;
      if (r.manager().group_gathered(g) != (op % 2 == 0)) {
        return absl::InternalError(absl::StrCat("after op ", op, " group ", g,
                                                " gathered: ", r.manager().group_gathered(g)));
      }
      RETURN_IF_ERROR(r.CheckInvariants("evaluate"));
    }
    // The owners rewrite the parameters; the next pass must see them.
    RETURN_IF_ERROR(r.manager().ReleaseRemoteChunks());
    RETURN_IF_ERROR(r.WriteOwnedParameters(1, /*all_types=*/true));
    RETURN_IF_ERROR(r.manager().Access(5, Stage::kForward));
    RETURN_IF_ERROR(r.CheckParams(5, 1));
    RETURN_IF_ERROR(r.CheckParams(4, 1));
    // Nothing may be dropped while accessed.
    const absl::Status busy = r.manager().ReleaseRemoteChunks();
    if (busy.code() != absl::StatusCode::kFailedPrecondition) {
      return absl::InternalError(
          absl::StrCat("ReleaseRemoteChunks while accessed: ", busy.ToString()));
    }
    return r.manager().Release(5, Stage::kForward);
  });
  for (const absl::Status& s : status) EXPECT_OK(s);
}

// A group that cannot fit the accelerator at once is ResourceExhausted, on every rank, with the
// numbers; nothing hangs.
TEST(ZeroLimits, GroupLargerThanTheAcceleratorIsResourceExhausted) {
  ZeroSetup setup;
  setup.world = 3;
  setup.op_numels = std::vector<int64_t>(6, 256);
  setup.cap_chunks = 2;  // a group needs 3
  std::vector<absl::Status> status = RunRanks(setup, [&](Rank& r) -> absl::Status {
    RETURN_IF_ERROR(r.WriteOwnedParameters(0, /*all_types=*/false));
    RETURN_IF_ERROR(r.manager().BeginIteration());
    return r.manager().Access(0, Stage::kForward);
  });
  for (const absl::Status& s : status) {
    EXPECT_THAT(s, StatusIs(absl::StatusCode::kResourceExhausted, HasSubstr("operator 'op0'")));
  }
}

// Configuration errors are InvalidArgument naming what to change.
TEST(ZeroConfig, MissingOrMismatchedCollectivesAreRejected) {
  ASSERT_OK_AND_ASSIGN(auto backend, CreateCpuBackend({.capacity_bytes = 1 << 20}));
  DeviceMemoryOptions mo;
  mo.chunk_block_bytes = 1024;
  ASSERT_OK_AND_ASSIGN(auto accel, CreateAcceleratorMemory(backend.get(), mo));
  mo.pinned = false;
  ASSERT_OK_AND_ASSIGN(auto host, CreateHostMemory(nullptr, mo));
  std::vector<OperatorSpec> ops = {{"a", {{"a.w", {100}}}}, {"b", {{"b.w", {200}}}}};
  ChunkLayoutOptions lo;
  lo.capacity_elems = 256;
  lo.world_size = 2;
  ASSERT_OK_AND_ASSIGN(ChunkLayout layout, ChunkLayout::Build(lo, ops));
  ASSERT_OK_AND_ASSIGN(auto store,
                       ChunkStore::Create(layout, {.compute_dtype = DType::kF32, .rank = 1}));
  EXPECT_THAT(ChunkManager::Create(store.get(), backend.get(), accel.get(), host.get(), {}),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("collectives")));
  std::vector<std::unique_ptr<Communicator>> three = CreateThreadCommunicators(3);
  CommCollectives wrong_world(three[1].get());
  ChunkManagerOptions options;
  options.collectives = &wrong_world;
  EXPECT_THAT(ChunkManager::Create(store.get(), backend.get(), accel.get(), host.get(), options),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("world of 3")));
  std::vector<std::unique_ptr<Communicator>> two = CreateThreadCommunicators(2);
  CommCollectives wrong_rank(two[0].get());
  options.collectives = &wrong_rank;
  EXPECT_THAT(ChunkManager::Create(store.get(), backend.get(), accel.get(), host.get(), options),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("rank 0")));
  CommCollectives right(two[1].get());
  options.collectives = &right;
  EXPECT_OK(ChunkManager::Create(store.get(), backend.get(), accel.get(), host.get(), options));
  // Optimizer state of another rank's chunk is refused.
  ASSERT_OK_AND_ASSIGN(auto manager, ChunkManager::Create(store.get(), backend.get(), accel.get(),
                                                          host.get(), options));
  EXPECT_THAT(manager->AccessChunks(0, {ChunkType::kMaster}, Device::Host(), AccessMode::kRead),
              StatusIs(absl::StatusCode::kFailedPrecondition, HasSubstr("no payload")));
}

// Bad collective arguments are InvalidArgument before anything is communicated.
TEST(CommCollectives, RejectsBadArguments) {
  std::vector<std::unique_ptr<Communicator>> comms = CreateThreadCommunicators(2);
  CommCollectives c(comms[0].get());
  float x[4] = {};
  std::vector<void*> one = {x};
  EXPECT_THAT(c.AllGatherGroup(0, one, 4, DType::kF32),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("1 payloads")));
  std::vector<void*> two = {x, x + 2};
  EXPECT_THAT(c.ReduceScatterGroup(0, two, -1, DType::kF32),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("negative")));
}

// The gradient statistics and means are sums over ranks, bit-identical on every rank.
TEST(CommCollectives, GradStatsAreSummedIdenticallyOnEveryRank) {
  constexpr int kWorld = 3;
  std::vector<std::unique_ptr<Communicator>> comms = CreateThreadCommunicators(kWorld);
  std::vector<double> sums(kWorld), means(kWorld);
  std::vector<int64_t> flags(kWorld);
  std::vector<absl::Status> status(kWorld);
  std::vector<std::thread> threads;
  for (int r = 0; r < kWorld; ++r) {
    threads.emplace_back([&, r] {
      CommCollectives c(comms[r].get());
      double s = 0.1 * (r + 1);
      int64_t n = r == 1 ? 2 : 0;
      status[r] = c.ReduceGradStats(s, n);
      sums[r] = s;
      flags[r] = n;
      absl::StatusOr<double> m = c.AllReduceMean(r * 1.5);
      if (m.ok()) means[r] = *m;
      status[r].Update(m.status());
    });
  }
  for (auto& t : threads) t.join();
  for (int r = 0; r < kWorld; ++r) {
    EXPECT_OK(status[r]);
    double want = 0;
    for (int q = 0; q < kWorld; ++q) want += 0.1 * (q + 1);
    EXPECT_EQ(sums[r], want);
    EXPECT_EQ(flags[r], 2);
    EXPECT_EQ(means[r], 1.5);
  }
}

}  // namespace
}  // namespace ps
