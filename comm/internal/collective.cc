#include "comm/internal/collective.h"

#include <cstdint>
#include <limits>
#include <string>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"

namespace ps::comm_internal {

int NodeLocalCudaDevice(int first_device, int local_rank, int device_count) {
  return static_cast<int>((static_cast<int64_t>(first_device) + local_rank) % device_count);
}

namespace {

bool ValidDType(CommDType dtype) { return CommDTypeSize(dtype) != 0; }

bool ValidOp(ReduceOp op) {
  return op == ReduceOp::kSum || op == ReduceOp::kAvg || op == ReduceOp::kMax;
}

bool HasOp(Collective kind) {
  return kind == Collective::kReduceScatter || kind == Collective::kAllReduce;
}

// Whether [a, a + a_bytes) and [b, b + b_bytes) share a byte.
bool Overlap(const void* a, int64_t a_bytes, const void* b, int64_t b_bytes) {
  const auto a0 = reinterpret_cast<uintptr_t>(a);
  const auto b0 = reinterpret_cast<uintptr_t>(b);
  return a_bytes > 0 && b_bytes > 0 && a0 < b0 + static_cast<uintptr_t>(b_bytes) &&
         b0 < a0 + static_cast<uintptr_t>(a_bytes);
}

// The send address that makes `call` in place on `rank` (integer arithmetic: the pointers may be
// unrelated).
uintptr_t InPlaceSend(const CollectiveCall& call, int rank) {
  const auto recv = reinterpret_cast<uintptr_t>(call.recv);
  const auto slot = static_cast<uintptr_t>(rank * call.count_elems * CommDTypeSize(call.dtype));
  switch (call.kind) {
    case Collective::kAllGather:
      return recv + slot;
    case Collective::kReduceScatter:
      return recv - slot;
    case Collective::kAllReduce:
    case Collective::kBroadcast:
      return recv;
    case Collective::kBarrier:
      return 0;
  }
  return 0;
}

const char* InPlaceRule(Collective kind) {
  switch (kind) {
    case Collective::kAllGather:
      return "in-place all-gather needs send == recv + rank * count";
    case Collective::kReduceScatter:
      return "in-place reduce-scatter needs recv == send + rank * count";
    case Collective::kAllReduce:
    case Collective::kBroadcast:
      return "in place needs send == recv";
    case Collective::kBarrier:
      return "";
  }
  return "";
}

}  // namespace

const char* CollectiveName(Collective kind) {
  switch (kind) {
    case Collective::kAllGather:
      return "all-gather";
    case Collective::kReduceScatter:
      return "reduce-scatter";
    case Collective::kAllReduce:
      return "all-reduce";
    case Collective::kBroadcast:
      return "broadcast";
    case Collective::kBarrier:
      return "barrier";
  }
  return "invalid collective";
}

int64_t SendElems(const CollectiveCall& call, int world) {
  switch (call.kind) {
    case Collective::kReduceScatter:
      return call.count_elems * world;
    case Collective::kAllGather:
    case Collective::kAllReduce:
    case Collective::kBroadcast:
      return call.count_elems;
    case Collective::kBarrier:
      return 0;
  }
  return 0;
}

int64_t RecvElems(const CollectiveCall& call, int world) {
  switch (call.kind) {
    case Collective::kAllGather:
      return call.count_elems * world;
    case Collective::kReduceScatter:
    case Collective::kAllReduce:
    case Collective::kBroadcast:
      return call.count_elems;
    case Collective::kBarrier:
      return 0;
  }
  return 0;
}

std::string Describe(const CollectiveCall& call, int rank, int world) {
  if (call.kind == Collective::kBarrier) {
    return absl::StrCat("barrier on rank ", rank, " of ", world);
  }
  std::string s = CollectiveName(call.kind);
  if (HasOp(call.kind)) absl::StrAppend(&s, " (", ReduceOpName(call.op), ")");
  if (call.kind == Collective::kBroadcast) absl::StrAppend(&s, " from root ", call.root);
  absl::StrAppend(&s, " of ", call.count_elems, " ", CommDTypeName(call.dtype),
                  " elements per rank on rank ", rank, " of ", world);
  return s;
}

absl::Status Validate(const CollectiveCall& call, int rank, int world, int64_t max_count_elems,
                      const char* transport) {
  if (call.kind == Collective::kBarrier) return absl::OkStatus();
  const std::string what = CollectiveName(call.kind);
  if (!ValidDType(call.dtype)) {
    return absl::InvalidArgumentError(absl::StrCat(what, ": dtype ", CommDTypeName(call.dtype),
                                                   " is not one of f32, f16, bf16, i32, u8"));
  }
  if (HasOp(call.kind)) {
    if (!ValidOp(call.op)) {
      return absl::InvalidArgumentError(absl::StrCat(what, ": reduction ", ReduceOpName(call.op),
                                                     " is not one of sum, avg, max"));
    }
    if (call.op == ReduceOp::kAvg && !IsFloatingPoint(call.dtype)) {
      return absl::InvalidArgumentError(
          absl::StrCat(what, ": avg is defined for f32, f16 and bf16 only, not ",
                       CommDTypeName(call.dtype), "; sum the integers and divide yourself"));
    }
  }
  if (call.kind == Collective::kBroadcast && (call.root < 0 || call.root >= world)) {
    return absl::InvalidArgumentError(
        absl::StrCat(what, ": root ", call.root, " is not a rank of this world of ", world));
  }
  if (call.count_elems < 0) {
    return absl::InvalidArgumentError(
        absl::StrCat(what, ": count ", call.count_elems, " is negative"));
  }
  const int64_t elem = CommDTypeSize(call.dtype);
  // count * world * elem must fit an int64 byte count.
  if (call.count_elems > std::numeric_limits<int64_t>::max() / world / elem) {
    return absl::InvalidArgumentError(absl::StrCat(what, ": count ", call.count_elems, " x ", world,
                                                   " ranks x ", elem,
                                                   " bytes overflows a 64-bit byte count"));
  }
  if (call.count_elems > max_count_elems) {
    return absl::InvalidArgumentError(absl::StrCat(
        what, ": count ", call.count_elems, " elements per rank exceeds ", transport,
        "'s limit of ", max_count_elems, "; split the buffer into smaller collectives"));
  }
  if (call.count_elems == 0) return absl::OkStatus();
  const bool reads_send = call.kind != Collective::kBroadcast || call.root == rank;
  if (reads_send && call.send == nullptr) {
    return absl::InvalidArgumentError(
        absl::StrCat(what, ": send buffer is null with count ", call.count_elems));
  }
  if (call.recv == nullptr) {
    return absl::InvalidArgumentError(
        absl::StrCat(what, ": recv buffer is null with count ", call.count_elems));
  }
  if (!reads_send) return absl::OkStatus();
  const int64_t send_bytes = SendElems(call, world) * elem;
  const int64_t recv_bytes = RecvElems(call, world) * elem;
  if (Overlap(call.send, send_bytes, call.recv, recv_bytes) &&
      reinterpret_cast<uintptr_t>(call.send) != InPlaceSend(call, rank)) {
    return absl::InvalidArgumentError(absl::StrCat(
        what, ": send [", absl::Hex(reinterpret_cast<uintptr_t>(call.send)), ", +", send_bytes,
        " bytes) overlaps recv [", absl::Hex(reinterpret_cast<uintptr_t>(call.recv)), ", +",
        recv_bytes, " bytes) on rank ", rank, " of ", world, "; ", InPlaceRule(call.kind),
        ", any other overlap is not allowed"));
  }
  return absl::OkStatus();
}

bool IsInPlace(const CollectiveCall& call, int rank, int world) {
  if (call.kind == Collective::kBarrier || call.count_elems == 0) return false;
  if (call.kind == Collective::kBroadcast && call.root != rank) return false;
  return reinterpret_cast<uintptr_t>(call.send) == InPlaceSend(call, rank);
}

}  // namespace ps::comm_internal
