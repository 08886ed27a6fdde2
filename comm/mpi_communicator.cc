#include "comm/mpi_communicator.h"

#include <mpi.h>
#include <sched.h>
#include <stdlib.h>

#include <algorithm>
#include <atomic>
#include <climits>
#include <cstdlib>
#include <cstring>
#include <deque>
#include <memory>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/functional/any_invocable.h"
#include "absl/memory/memory.h"
#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "absl/time/time.h"
#include "base/mutex.h"
#include "base/status_macros.h"
#include "comm/internal/collective.h"
#include "comm/internal/completion.h"
#include "glog/logging.h"
#include "memory/convert.h"
#include "memory/dtype_math.h"

#if defined(__SANITIZE_ADDRESS__)
#include <sanitizer/lsan_interface.h>
#endif

namespace ps {
namespace mpi_internal {
namespace {

using comm_internal::Collective;
using comm_internal::CollectiveCall;
using comm_internal::Completion;

// An MPI return code as a Status: the MPI error string, and a canonical code from its class.
absl::Status MpiStatus(int rc, absl::string_view what) {
  if (rc == MPI_SUCCESS) return absl::OkStatus();
  char text[MPI_MAX_ERROR_STRING] = {0};
  int len = 0;
  if (MPI_Error_string(rc, text, &len) != MPI_SUCCESS) std::snprintf(text, sizeof(text), "?");
  int error_class = rc;
  MPI_Error_class(rc, &error_class);
  const std::string message = absl::StrCat(what, " failed: MPI error ", rc, ": ", text);
  switch (error_class) {
    case MPI_ERR_BUFFER:
    case MPI_ERR_COUNT:
    case MPI_ERR_TYPE:
    case MPI_ERR_ROOT:
    case MPI_ERR_OP:
    case MPI_ERR_ARG:
      return absl::InvalidArgumentError(message);
    case MPI_ERR_TRUNCATE:
      return absl::InvalidArgumentError(absl::StrCat(
          message, " (the ranks passed different counts to the same collective)"));
    case MPI_ERR_NO_MEM:
      return absl::ResourceExhaustedError(message);
    default:
      return absl::InternalError(message);
  }
}

// --- 16-bit reductions: f32 arithmetic, one rounding ----------------------------------------------

template <bool kBF16>
float Widen(uint16_t bits) {
  return kBF16 ? BFloat16BitsToFloat(bits) : HalfBitsToFloat(bits);
}

// Vectorized conversions of a block (memory/convert.h: bit-identical to dtype_math.h).
template <bool kBF16>
void WidenBlock(const uint16_t* in, float* out, int n) {
  if (kBF16) {
    ConvertBF16ToF32(in, out, n);
  } else {
    ConvertF16ToF32(in, out, n);
  }
}
template <bool kBF16>
void NarrowBlock(const float* in, uint16_t* out, int n) {
  if (kBF16) {
    ConvertF32ToBF16(in, out, n);
  } else {
    ConvertF32ToF16(in, out, n);
  }
}

// MPI_User_function bodies: inout[i] = round(f(in[i], inout[i])), a block at a time in f32.
constexpr int kBlock = 2048;

template <bool kBF16, typename F>
void Combine16(void* in, void* inout, int len, F f) {
  const auto* a = static_cast<const uint16_t*>(in);
  auto* b = static_cast<uint16_t*>(inout);
  float fa[kBlock], fb[kBlock];
  for (int start = 0; start < len; start += kBlock) {
    const int n = std::min(kBlock, len - start);
    WidenBlock<kBF16>(a + start, fa, n);
    WidenBlock<kBF16>(b + start, fb, n);
    for (int i = 0; i < n; ++i) fb[i] = f(fa[i], fb[i]);
    NarrowBlock<kBF16>(fb, b + start, n);
  }
}

template <bool kBF16>
void Sum16(void* in, void* inout, int* len, MPI_Datatype*) {
  Combine16<kBF16>(in, inout, *len, [](float x, float y) { return x + y; });
}
// The average of exactly two contributions: (a + b) / 2 in f32 (exact scaling), rounded once.
template <bool kBF16>
void Avg2Of16(void* in, void* inout, int* len, MPI_Datatype*) {
  Combine16<kBF16>(in, inout, *len, [](float x, float y) { return (x + y) * 0.5f; });
}
// Max keeps the 16-bit pattern of the larger operand (exact; NaN handling unspecified).
template <bool kBF16>
void Max16(void* in, void* inout, int* len, MPI_Datatype*) {
  const auto* a = static_cast<const uint16_t*>(in);
  auto* b = static_cast<uint16_t*>(inout);
  for (int i = 0; i < *len; ++i) {
    if (Widen<kBF16>(a[i]) > Widen<kBF16>(b[i])) b[i] = a[i];
  }
}

MPI_Datatype MpiType(CommDType dtype) {
  switch (dtype) {
    case CommDType::kF32:
      return MPI_FLOAT;
    case CommDType::kF16:
    case CommDType::kBF16:
      return MPI_UINT16_T;
    case CommDType::kI32:
      return MPI_INT32_T;
    case CommDType::kU8:
      return MPI_UINT8_T;
  }
  return MPI_DATATYPE_NULL;
}

}  // namespace

// One queued collective (or setup step) and what the MPI thread knows about it.
struct MpiOp {
  uint64_t comm_id = 0;
  std::shared_ptr<Completion> completion;
  // On the MPI thread, in queue order: starts the operation; sets *request to an MPI request to
  // poll, or leaves MPI_REQUEST_NULL when the operation finished inside start.
  absl::AnyInvocable<absl::Status(MPI_Request*)> start;
  // On the MPI thread once MPI completed it (and every earlier op of the same communicator
  // completed): post-processing (narrowing, averaging, in-place copies).
  absl::AnyInvocable<absl::Status()> finish;

  MPI_Request request = MPI_REQUEST_NULL;
  bool mpi_done = false;
  absl::Status status;
};

// The process-wide MPI thread. Created on first use and never destroyed (MPI can be initialized
// once per process); exits at process exit (see OnExit).
class MpiRuntime {
 public:
  static absl::StatusOr<MpiRuntime*> Get() {
    static MpiRuntime* const runtime = new MpiRuntime();
    RETURN_IF_ERROR(runtime->init_status_);
    return runtime;
  }

  int world_rank() const { return world_rank_; }
  int world_size() const { return world_size_; }

  // Queues `op`; its completion is reported through op->completion.
  void Submit(std::shared_ptr<MpiOp> op) {
    MutexLock lock(&mu_);
    if (shut_down_) {
      op->completion->Complete(absl::FailedPreconditionError(
          absl::StrCat(op->completion->description(), ": the process is exiting and MPI is "
                                                      "shut down")));
      return;
    }
    ++pending_;
    queue_.push_back(std::move(op));
  }

  // Runs `fn` on the MPI thread (in queue order) and waits for it.
  absl::Status Call(std::string description, uint64_t comm_id,
                    absl::AnyInvocable<absl::Status()> fn) {
    auto op = std::make_shared<MpiOp>();
    op->comm_id = comm_id;
    op->completion = std::make_shared<Completion>(std::move(description));
    op->start = [fn = std::move(fn)](MPI_Request*) mutable { return fn(); };
    auto completion = op->completion;
    Submit(std::move(op));
    return completion->Wait();
  }

  // Custom reduction ops (valid after a successful Get()).
  MPI_Op sum16(bool bf16) const { return bf16 ? ops_.sum_bf16 : ops_.sum_f16; }
  MPI_Op avg2_16(bool bf16) const { return bf16 ? ops_.avg2_bf16 : ops_.avg2_f16; }
  MPI_Op max16(bool bf16) const { return bf16 ? ops_.max_bf16 : ops_.max_f16; }

 private:
  struct Ops {
    MPI_Op sum_f16 = MPI_OP_NULL, sum_bf16 = MPI_OP_NULL;
    MPI_Op avg2_f16 = MPI_OP_NULL, avg2_bf16 = MPI_OP_NULL;
    MPI_Op max_f16 = MPI_OP_NULL, max_bf16 = MPI_OP_NULL;
  };

  MpiRuntime() {
    ps::Mutex init_mu;
    bool init_done = false;
    thread_ = std::thread([this, &init_mu, &init_done] {
#if defined(__SANITIZE_ADDRESS__)
      // OpenMPI keeps allocations from MPI_Init to exit that LeakSanitizer reports as leaks (its
      // libraries lack frame pointers, so suppressions by library cannot match them). Every MPI
      // call of the process is made on this thread: ignore this thread's allocations. Our own
      // allocations here are owned by RAII objects created on the callers' threads.
      __lsan_disable();
#endif
      absl::Status status = Initialize();
      {
        MutexLock lock(&init_mu);
        init_status_ = status;
        init_done = true;
      }
      if (status.ok()) Loop();
    });
    MutexLock lock(&init_mu);
    init_mu.Await([&]() ABSL_NO_THREAD_SAFETY_ANALYSIS { return init_done; });
    if (!init_status_.ok()) {
      thread_.join();
      return;
    }
    on_exit(&MpiRuntime::OnExit, this);
  }

  // On the MPI thread.
  absl::Status Initialize() {
    int finalized = 0;
    MPI_Finalized(&finalized);
    if (finalized) {
      return absl::FailedPreconditionError(
          "MPI was already finalized in this process; create MPI communicators before "
          "MPI_Finalize");
    }
    int initialized = 0;
    MPI_Initialized(&initialized);
    int provided = MPI_THREAD_SINGLE;
    if (initialized) {
      // Someone else's MPI: our thread is not theirs, so calls must be safe from any thread.
      MPI_Query_thread(&provided);
      if (provided != MPI_THREAD_MULTIPLE) {
        return absl::FailedPreconditionError(absl::StrCat(
            "MPI was initialized by other code with thread level ", provided,
            "; the mpi communicator makes its MPI calls on its own thread and needs "
            "MPI_THREAD_MULTIPLE (",
            MPI_THREAD_MULTIPLE, ") then. Initialize MPI with MPI_Init_thread(..., "
                                 "MPI_THREAD_MULTIPLE, ...) or let the communicator do it"));
      }
    } else {
      // Every MPI call of this process is made from this thread: FUNNELED is all we need.
      const int rc = MPI_Init_thread(nullptr, nullptr, MPI_THREAD_MULTIPLE, &provided);
      if (rc != MPI_SUCCESS) return MpiStatus(rc, "MPI_Init_thread");
      if (provided < MPI_THREAD_FUNNELED) {
        return absl::FailedPreconditionError(absl::StrCat(
            "MPI provides thread level ", provided, " (MPI_THREAD_SINGLE); the mpi communicator "
            "needs at least MPI_THREAD_FUNNELED. Use an MPI built with thread support"));
      }
      initialized_by_us_ = true;
    }
    RETURN_IF_ERROR(MpiStatus(MPI_Comm_set_errhandler(MPI_COMM_WORLD, MPI_ERRORS_RETURN),
                              "MPI_Comm_set_errhandler(MPI_COMM_WORLD)"));
    RETURN_IF_ERROR(MpiStatus(MPI_Comm_rank(MPI_COMM_WORLD, &world_rank_), "MPI_Comm_rank"));
    RETURN_IF_ERROR(MpiStatus(MPI_Comm_size(MPI_COMM_WORLD, &world_size_), "MPI_Comm_size"));
    RETURN_IF_ERROR(MpiStatus(MPI_Op_create(&Sum16<false>, 1, &ops_.sum_f16), "MPI_Op_create"));
    RETURN_IF_ERROR(MpiStatus(MPI_Op_create(&Sum16<true>, 1, &ops_.sum_bf16), "MPI_Op_create"));
    RETURN_IF_ERROR(
        MpiStatus(MPI_Op_create(&Avg2Of16<false>, 1, &ops_.avg2_f16), "MPI_Op_create"));
    RETURN_IF_ERROR(
        MpiStatus(MPI_Op_create(&Avg2Of16<true>, 1, &ops_.avg2_bf16), "MPI_Op_create"));
    RETURN_IF_ERROR(MpiStatus(MPI_Op_create(&Max16<false>, 1, &ops_.max_f16), "MPI_Op_create"));
    RETURN_IF_ERROR(MpiStatus(MPI_Op_create(&Max16<true>, 1, &ops_.max_bf16), "MPI_Op_create"));
    VLOG(1) << "MPI initialized: rank " << world_rank_ << " of " << world_size_
            << ", thread level " << provided;
    return absl::OkStatus();
  }

  // The MPI thread's loop: start queued ops in order, poll what is in flight, report completions
  // in issue order per communicator. Returns after a clean shutdown request.
  void Loop() {
    std::vector<std::shared_ptr<MpiOp>> in_flight;
    int idle_rounds = 0;
    while (true) {
      std::deque<std::shared_ptr<MpiOp>> to_start;
      {
        MutexLock lock(&mu_);
        if (in_flight.empty()) {
          mu_.Await([this]() ABSL_NO_THREAD_SAFETY_ANALYSIS {
            return !queue_.empty() || finalize_requested_;
          });
        }
        to_start.swap(queue_);
        if (finalize_requested_ && to_start.empty() && in_flight.empty()) break;
      }
      bool progressed = !to_start.empty();
      for (auto& op : to_start) {
        op->status = op->start(&op->request);
        if (!op->status.ok() || op->request == MPI_REQUEST_NULL) op->mpi_done = true;
        in_flight.push_back(std::move(op));
      }
      for (auto& op : in_flight) {
        if (op->mpi_done) continue;
        int flag = 0;
        const int rc = MPI_Test(&op->request, &flag, MPI_STATUS_IGNORE);
        if (rc != MPI_SUCCESS) {
          op->status = MpiStatus(rc, op->completion->description());
          op->mpi_done = true;
        } else if (flag) {
          op->mpi_done = true;
        }
      }
      // Report in issue order per communicator: an op waits for its communicator's earlier ops.
      std::vector<uint64_t> blocked;
      for (auto it = in_flight.begin(); it != in_flight.end();) {
        MpiOp& op = **it;
        const bool is_blocked =
            std::find(blocked.begin(), blocked.end(), op.comm_id) != blocked.end();
        if (!op.mpi_done || is_blocked) {
          if (!is_blocked) blocked.push_back(op.comm_id);
          ++it;
          continue;
        }
        if (op.status.ok() && op.finish) op.status = op.finish();
        {
          // Before Complete: a waiter woken by it may exit the process at once (OnExit).
          MutexLock lock(&mu_);
          --pending_;
        }
        op.completion->Complete(std::move(op.status));
        it = in_flight.erase(it);
        progressed = true;
      }
      if (progressed) {
        idle_rounds = 0;
      } else if (++idle_rounds < 1000) {
        sched_yield();
      } else {
        // Long transfers: poll less often so that the caller's compute keeps its core.
        absl::SleepFor(absl::Microseconds(50));
      }
    }
    const int rc = MPI_Finalize();
    if (rc != MPI_SUCCESS) LOG(ERROR) << MpiStatus(rc, "MPI_Finalize");
  }

  // glibc on_exit handler: finalize MPI only on a clean exit (see mpi_communicator.h).
  static void OnExit(int exit_status, void* arg) {
    auto* self = static_cast<MpiRuntime*>(arg);
    {
      MutexLock lock(&self->mu_);
      self->shut_down_ = true;
      const bool multi = self->world_size_ > 1;
      if (!self->initialized_by_us_) return;
      if (exit_status != 0) {
        if (multi) {
          LOG(WARNING) << "rank " << self->world_rank_ << " exits with status " << exit_status
                       << ": not calling MPI_Finalize, so mpirun ends the other ranks instead of "
                          "leaving them waiting for this one";
        }
        return;
      }
      if (self->pending_ > 0) {
        LOG(ERROR) << "rank " << self->world_rank_ << " exits with " << self->pending_
                   << " MPI collective(s) still in flight: not calling MPI_Finalize (it would "
                      "wait for them); mpirun will report this rank as exiting improperly";
        return;
      }
      self->finalize_requested_ = true;
    }
    self->thread_.join();
  }

  absl::Status init_status_;
  bool initialized_by_us_ = false;  // written before init_done, read after
  int world_rank_ = 0;
  int world_size_ = 1;
  Ops ops_;
  std::thread thread_;

  Mutex mu_;
  std::deque<std::shared_ptr<MpiOp>> queue_ ABSL_GUARDED_BY(mu_);
  int64_t pending_ ABSL_GUARDED_BY(mu_) = 0;  // submitted, not yet reported
  bool finalize_requested_ ABSL_GUARDED_BY(mu_) = false;
  bool shut_down_ ABSL_GUARDED_BY(mu_) = false;
};

}  // namespace mpi_internal

namespace {

using comm_internal::Collective;
using comm_internal::CollectiveCall;
using comm_internal::Completion;
using mpi_internal::MpiOp;
using mpi_internal::MpiRuntime;
using mpi_internal::MpiStatus;
using mpi_internal::MpiType;

constexpr char kTimeoutHint[] =
    "; it is still in flight, so keep its buffers alive. If another rank died, mpirun ends this "
    "job; otherwise check that every rank issues the same collectives (same counts, dtypes, ops, "
    "roots) in the same order";

MPI_Op MpiBuiltinOp(ReduceOp op) { return op == ReduceOp::kMax ? MPI_MAX : MPI_SUM; }

// out[i] = in[i] / world (f32 average after an f32 sum).
void DivideF32(const float* in, float* out, int64_t n, int world) {
  const float w = static_cast<float>(world);
  for (int64_t i = 0; i < n; ++i) out[i] = in[i] / w;
}

// Narrows an f32 result into a 16-bit buffer, dividing by `divisor` first (1 for a sum).
void NarrowF32(const float* in, void* out, int64_t n, bool bf16, int divisor) {
  auto* o = static_cast<uint16_t*>(out);
  const float d = static_cast<float>(divisor);
  for (int64_t i = 0; i < n; ++i) {
    const float v = divisor == 1 ? in[i] : in[i] / d;
    o[i] = bf16 ? FloatToBFloat16Bits(v) : FloatToHalfBits(v);
  }
}

// f16/bf16 input widened to f32.
void WidenToF32(const void* in, int64_t n, bool bf16, float* out) {
  if (n == 0) return;
  if (bf16) {
    ConvertBF16ToF32(static_cast<const uint16_t*>(in), out, n);
  } else {
    ConvertF16ToF32(static_cast<const uint16_t*>(in), out, n);
  }
}

bool Is16Bit(CommDType dtype) { return dtype == CommDType::kF16 || dtype == CommDType::kBF16; }

// How one reduction runs: the MPI datatype and op, and whether it goes through f32.
struct ReducePlan {
  bool widen = false;  // 16-bit sum/avg with more than two ranks
  MPI_Datatype type = MPI_DATATYPE_NULL;
  MPI_Op op = MPI_OP_NULL;
  int divide_by = 1;  // f32 (or widened) average: divide the sum afterwards
};

ReducePlan PlanReduce(const MpiRuntime& runtime, CommDType dtype, ReduceOp op, int world) {
  ReducePlan plan;
  if (Is16Bit(dtype)) {
    const bool bf16 = dtype == CommDType::kBF16;
    if (op == ReduceOp::kMax) {
      plan.type = MPI_UINT16_T;
      plan.op = runtime.max16(bf16);
    } else if (world <= 2) {
      plan.type = MPI_UINT16_T;
      plan.op = (op == ReduceOp::kAvg && world == 2) ? runtime.avg2_16(bf16) : runtime.sum16(bf16);
    } else {
      plan.widen = true;
      plan.type = MPI_FLOAT;
      plan.op = MPI_SUM;
      plan.divide_by = op == ReduceOp::kAvg ? world : 1;
    }
    return plan;
  }
  plan.type = MpiType(dtype);
  plan.op = MpiBuiltinOp(op);
  plan.divide_by = op == ReduceOp::kAvg ? world : 1;
  return plan;
}

}  // namespace

// Read before main (MPI_Init of a singleton sets some of these variables in its own process).
const bool kLaunchedByMpirun = std::getenv("OMPI_COMM_WORLD_SIZE") != nullptr ||
                               std::getenv("PMIX_RANK") != nullptr ||
                               std::getenv("PMI_RANK") != nullptr;

bool MpiCommunicator::LaunchedByMpirun() { return kLaunchedByMpirun; }

absl::StatusOr<std::unique_ptr<MpiCommunicator>> MpiCommunicator::Create() {
  ASSIGN_OR_RETURN(MpiRuntime * runtime, MpiRuntime::Get());
  static std::atomic<uint64_t> next_id{1};
  const uint64_t id = next_id.fetch_add(1);
  auto comm = std::make_unique<MPI_Comm>(MPI_COMM_NULL);
  int rank = 0;
  int world = 1;
  RETURN_IF_ERROR(runtime->Call("MPI_Comm_dup(MPI_COMM_WORLD)", id, [&]() -> absl::Status {
    RETURN_IF_ERROR(MpiStatus(MPI_Comm_dup(MPI_COMM_WORLD, comm.get()), "MPI_Comm_dup"));
    RETURN_IF_ERROR(MpiStatus(MPI_Comm_set_errhandler(*comm, MPI_ERRORS_RETURN),
                              "MPI_Comm_set_errhandler"));
    RETURN_IF_ERROR(MpiStatus(MPI_Comm_rank(*comm, &rank), "MPI_Comm_rank"));
    return MpiStatus(MPI_Comm_size(*comm, &world), "MPI_Comm_size");
  }));
  return absl::WrapUnique(new MpiCommunicator(runtime, id, comm.release(), rank, world));
}

MpiCommunicator::MpiCommunicator(mpi_internal::MpiRuntime* runtime, uint64_t id, void* comm,
                                 int rank, int world)
    : runtime_(runtime), id_(id), comm_(comm), rank_(rank), world_(world) {}

MpiCommunicator::~MpiCommunicator() {
  auto* comm = static_cast<MPI_Comm*>(comm_);
  // Reported after every earlier op of this communicator, so in-flight work is done by then.
  const absl::Status status = runtime_->Call("MPI_Comm_free", id_, [comm] {
    return MpiStatus(MPI_Comm_free(comm), "MPI_Comm_free");
  });
  if (!status.ok()) LOG(ERROR) << status;
  delete comm;
}

namespace {

// Queues `op` for `call` and returns its request.
std::unique_ptr<CommRequest> SubmitOp(MpiRuntime* runtime, uint64_t comm_id,
                                      const CollectiveCall& call, int rank, int world,
                                      absl::AnyInvocable<absl::Status(MPI_Request*)> start,
                                      absl::AnyInvocable<absl::Status()> finish) {
  auto op = std::make_shared<MpiOp>();
  op->comm_id = comm_id;
  op->completion = std::make_shared<Completion>(comm_internal::Describe(call, rank, world));
  op->start = std::move(start);
  op->finish = std::move(finish);
  auto completion = op->completion;
  runtime->Submit(std::move(op));
  return std::make_unique<comm_internal::CompletionRequest>(std::move(completion), kTimeoutHint);
}

}  // namespace

absl::StatusOr<std::unique_ptr<CommRequest>> MpiCommunicator::AllGatherAsync(
    const void* send, void* recv, int64_t count_elems, CommDType dtype) {
  CollectiveCall call{.kind = Collective::kAllGather,
                      .send = send,
                      .recv = recv,
                      .count_elems = count_elems,
                      .dtype = dtype};
  RETURN_IF_ERROR(comm_internal::Validate(call, rank_, world_, INT_MAX, "MPI"));
  const bool in_place = comm_internal::IsInPlace(call, rank_, world_);
  MPI_Comm comm = *static_cast<MPI_Comm*>(comm_);
  const int count = static_cast<int>(count_elems);
  const MPI_Datatype type = MpiType(dtype);
  const std::string what = comm_internal::Describe(call, rank_, world_);
  return SubmitOp(
      runtime_, id_, call, rank_, world_,
      [=](MPI_Request* request) {
        return MpiStatus(MPI_Iallgather(in_place ? MPI_IN_PLACE : send, count, type, recv, count,
                                        type, comm, request),
                         what);
      },
      nullptr);
}

absl::StatusOr<std::unique_ptr<CommRequest>> MpiCommunicator::ReduceScatterAsync(
    const void* send, void* recv, int64_t count_elems, CommDType dtype, ReduceOp op) {
  CollectiveCall call{.kind = Collective::kReduceScatter,
                      .send = send,
                      .recv = recv,
                      .count_elems = count_elems,
                      .dtype = dtype,
                      .op = op};
  RETURN_IF_ERROR(comm_internal::Validate(call, rank_, world_, INT_MAX, "MPI"));
  // In place, MPI's result would land in slot 0; reduce into scratch and copy to our slot.
  const bool in_place = comm_internal::IsInPlace(call, rank_, world_);
  MPI_Comm comm = *static_cast<MPI_Comm*>(comm_);
  const int world = world_;
  const int count = static_cast<int>(count_elems);
  const int64_t elem = CommDTypeSize(dtype);
  const bool bf16 = dtype == CommDType::kBF16;
  const ReducePlan plan = PlanReduce(*runtime_, dtype, op, world_);
  const std::string what = comm_internal::Describe(call, rank_, world_);
  // Scratch owned by the op: the widened input and its f32 result, or a native-type result.
  auto wide = std::make_shared<std::vector<float>>();
  auto native = std::make_shared<std::vector<char>>();
  return SubmitOp(
      runtime_, id_, call, rank_, world_,
      [=](MPI_Request* request) {
        const void* in = send;
        void* out = recv;
        if (plan.widen) {
          const int64_t n_in = static_cast<int64_t>(count) * world;
          wide->resize(n_in + count);
          WidenToF32(send, n_in, bf16, wide->data());
          in = wide->data();
          out = wide->data() + n_in;
        } else if (in_place || plan.divide_by != 1) {
          native->resize(count * elem);
          out = native->data();
        }
        return MpiStatus(
            MPI_Ireduce_scatter_block(in, out, count, plan.type, plan.op, comm, request), what);
      },
      [=]() {
        if (count == 0) return absl::OkStatus();
        if (plan.widen) {
          NarrowF32(wide->data() + static_cast<int64_t>(count) * world, recv, count, bf16,
                    plan.divide_by);
        } else if (plan.divide_by != 1) {
          DivideF32(reinterpret_cast<const float*>(native->data()), static_cast<float*>(recv),
                    count, plan.divide_by);
        } else if (in_place) {
          std::memcpy(recv, native->data(), count * elem);
        }
        return absl::OkStatus();
      });
}

absl::StatusOr<std::unique_ptr<CommRequest>> MpiCommunicator::AllReduceAsync(
    const void* send, void* recv, int64_t count_elems, CommDType dtype, ReduceOp op) {
  CollectiveCall call{.kind = Collective::kAllReduce,
                      .send = send,
                      .recv = recv,
                      .count_elems = count_elems,
                      .dtype = dtype,
                      .op = op};
  RETURN_IF_ERROR(comm_internal::Validate(call, rank_, world_, INT_MAX, "MPI"));
  const bool in_place = comm_internal::IsInPlace(call, rank_, world_);
  MPI_Comm comm = *static_cast<MPI_Comm*>(comm_);
  const int count = static_cast<int>(count_elems);
  const bool bf16 = dtype == CommDType::kBF16;
  const ReducePlan plan = PlanReduce(*runtime_, dtype, op, world_);
  const std::string what = comm_internal::Describe(call, rank_, world_);
  auto wide = std::make_shared<std::vector<float>>();
  return SubmitOp(
      runtime_, id_, call, rank_, world_,
      [=](MPI_Request* request) {
        if (plan.widen) {
          wide->resize(count);
          WidenToF32(send, count, bf16, wide->data());
          return MpiStatus(
              MPI_Iallreduce(MPI_IN_PLACE, wide->data(), count, plan.type, plan.op, comm, request),
              what);
        }
        return MpiStatus(MPI_Iallreduce(in_place ? MPI_IN_PLACE : send, recv, count, plan.type,
                                        plan.op, comm, request),
                         what);
      },
      [=]() {
        if (plan.widen) {
          NarrowF32(wide->data(), recv, count, bf16, plan.divide_by);
        } else if (plan.divide_by != 1) {
          DivideF32(static_cast<const float*>(recv), static_cast<float*>(recv), count,
                    plan.divide_by);
        }
        return absl::OkStatus();
      });
}

absl::StatusOr<std::unique_ptr<CommRequest>> MpiCommunicator::BroadcastAsync(
    const void* send, void* recv, int64_t count_elems, CommDType dtype, int root) {
  CollectiveCall call{.kind = Collective::kBroadcast,
                      .send = send,
                      .recv = recv,
                      .count_elems = count_elems,
                      .dtype = dtype,
                      .root = root};
  RETURN_IF_ERROR(comm_internal::Validate(call, rank_, world_, INT_MAX, "MPI"));
  MPI_Comm comm = *static_cast<MPI_Comm*>(comm_);
  const int count = static_cast<int>(count_elems);
  const MPI_Datatype type = MpiType(dtype);
  const bool copy_first = rank_ == root && count_elems > 0 && send != recv;
  const int64_t bytes = count_elems * CommDTypeSize(dtype);
  const std::string what = comm_internal::Describe(call, rank_, world_);
  return SubmitOp(
      runtime_, id_, call, rank_, world_,
      [=](MPI_Request* request) {
        if (copy_first) std::memcpy(recv, send, bytes);
        return MpiStatus(MPI_Ibcast(recv, count, type, root, comm, request), what);
      },
      nullptr);
}

absl::StatusOr<std::unique_ptr<CommRequest>> MpiCommunicator::BarrierAsync() {
  CollectiveCall call{.kind = Collective::kBarrier};
  MPI_Comm comm = *static_cast<MPI_Comm*>(comm_);
  const std::string what = comm_internal::Describe(call, rank_, world_);
  return SubmitOp(
      runtime_, id_, call, rank_, world_,
      [=](MPI_Request* request) { return MpiStatus(MPI_Ibarrier(comm, request), what); },
      nullptr);
}

}  // namespace ps
