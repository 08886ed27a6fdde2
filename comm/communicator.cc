#include "comm/communicator.h"

#include <string>

#include "absl/strings/str_cat.h"
#include "base/status_macros.h"

namespace ps {

int64_t CommDTypeSize(CommDType dtype) {
  switch (dtype) {
    case CommDType::kF32:
    case CommDType::kI32:
      return 4;
    case CommDType::kF16:
    case CommDType::kBF16:
      return 2;
    case CommDType::kU8:
      return 1;
  }
  return 0;
}

std::string CommDTypeName(CommDType dtype) {
  switch (dtype) {
    case CommDType::kF32:
      return "f32";
    case CommDType::kF16:
      return "f16";
    case CommDType::kBF16:
      return "bf16";
    case CommDType::kI32:
      return "i32";
    case CommDType::kU8:
      return "u8";
  }
  return absl::StrCat("invalid(", static_cast<int>(dtype), ")");
}

bool IsFloatingPoint(CommDType dtype) {
  return dtype == CommDType::kF32 || dtype == CommDType::kF16 || dtype == CommDType::kBF16;
}

CommDType ToCommDType(DType dtype) {
  switch (dtype) {
    case DType::kF32:
      return CommDType::kF32;
    case DType::kF16:
      return CommDType::kF16;
    case DType::kBF16:
      return CommDType::kBF16;
  }
  return static_cast<CommDType>(255);
}

std::ostream& operator<<(std::ostream& os, CommDType dtype) { return os << CommDTypeName(dtype); }

std::string ReduceOpName(ReduceOp op) {
  switch (op) {
    case ReduceOp::kSum:
      return "sum";
    case ReduceOp::kAvg:
      return "avg";
    case ReduceOp::kMax:
      return "max";
  }
  return absl::StrCat("invalid(", static_cast<int>(op), ")");
}

std::ostream& operator<<(std::ostream& os, ReduceOp op) { return os << ReduceOpName(op); }

absl::Status Communicator::AllGather(const void* send, void* recv, int64_t count_elems,
                                     CommDType dtype) {
  ASSIGN_OR_RETURN(auto request, AllGatherAsync(send, recv, count_elems, dtype));
  return request->Wait();
}

absl::Status Communicator::ReduceScatter(const void* send, void* recv, int64_t count_elems,
                                         CommDType dtype, ReduceOp op) {
  ASSIGN_OR_RETURN(auto request, ReduceScatterAsync(send, recv, count_elems, dtype, op));
  return request->Wait();
}

absl::Status Communicator::AllReduce(const void* send, void* recv, int64_t count_elems,
                                     CommDType dtype, ReduceOp op) {
  ASSIGN_OR_RETURN(auto request, AllReduceAsync(send, recv, count_elems, dtype, op));
  return request->Wait();
}

absl::Status Communicator::Broadcast(const void* send, void* recv, int64_t count_elems,
                                     CommDType dtype, int root) {
  ASSIGN_OR_RETURN(auto request, BroadcastAsync(send, recv, count_elems, dtype, root));
  return request->Wait();
}

absl::Status Communicator::Barrier() {
  ASSIGN_OR_RETURN(auto request, BarrierAsync());
  return request->Wait();
}

}  // namespace ps
