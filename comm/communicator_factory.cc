#include "comm/communicator_factory.h"

#include <memory>
#include <string>
#include <utility>

#include "absl/strings/ascii.h"
#include "absl/strings/str_cat.h"
#include "base/status_macros.h"
#include "comm/local_communicator.h"
#include "comm/mpi_communicator.h"
#include "glog/logging.h"

#if PS_WITH_CUDA
#include "comm/nccl/nccl_communicator.h"
#endif

namespace ps {

bool NcclCompiledIn() { return PS_WITH_CUDA != 0; }

absl::StatusOr<CommunicatorOptions> ChooseTrainingCommunicator(absl::string_view comm_flag,
                                                               bool cuda_accelerator,
                                                               bool launched_by_mpirun,
                                                               int accelerator_device) {
  CommunicatorOptions options;
  options.kind = "";
  std::string kind(comm_flag);
  if (kind == "auto") {
    if (!launched_by_mpirun) return options;
    kind = cuda_accelerator ? "nccl" : "mpi";
  }
  if (kind == "local") return options;
  if (kind == "mpi") {
    if (cuda_accelerator && launched_by_mpirun) {
      return absl::InvalidArgumentError(
          "--comm=mpi with --accelerator=cuda hands device memory to a host communicator (the "
          "ZeRO chunk payloads live on the GPU): use --comm=nccl, or --comm=auto, which picks "
          "nccl for cuda under mpirun");
    }
    options.kind = "mpi";
    return options;
  }
  if (kind == "nccl") {
    options.kind = "nccl";
    if (launched_by_mpirun) {
      options.cuda_device = -1;
      options.first_cuda_device = accelerator_device;
    } else {
      options.cuda_device = accelerator_device;
    }
    return options;
  }
  return absl::InvalidArgumentError(
      absl::StrCat("--comm must be auto, local, mpi or nccl, got \"", comm_flag, "\""));
}

absl::StatusOr<std::unique_ptr<Communicator>> CreateCommunicator(
    const CommunicatorOptions& options) {
  const std::string kind = absl::AsciiStrToLower(options.kind);
  if (kind == "local") return std::unique_ptr<Communicator>(new LocalCommunicator());
  if (kind == "mpi") {
    if (!MpiCommunicator::LaunchedByMpirun()) {
      LOG(INFO) << "communicator \"mpi\": this process was not started by mpirun, so it runs as "
                   "an MPI singleton, a world of one. Launch with `mpirun -np N ...` for N ranks";
    }
    ASSIGN_OR_RETURN(auto comm, MpiCommunicator::Create());
    return std::unique_ptr<Communicator>(std::move(comm));
  }
  if (kind == "nccl") {
#if PS_WITH_CUDA
    NcclCommunicatorOptions nccl;
    nccl.cuda_device = options.cuda_device;
    nccl.first_cuda_device = options.first_cuda_device;
    nccl.cuda_stream = options.cuda_stream;
    nccl.bootstrap = options.bootstrap;
    if (nccl.bootstrap == nullptr) {
      ASSIGN_OR_RETURN(auto mpi, MpiCommunicator::Create());
      nccl.bootstrap = std::shared_ptr<Communicator>(std::move(mpi));
    }
    ASSIGN_OR_RETURN(auto comm, NcclCommunicator::Create(nccl));
    return std::unique_ptr<Communicator>(std::move(comm));
#else
    return absl::UnimplementedError(
        "communicator \"nccl\" is not in this build: rebuild with --config=cuda (e.g. "
        "`bazel build --config=cuda //...`), or use \"mpi\" for host buffers");
#endif
  }
  return absl::InvalidArgumentError(absl::StrCat("unknown communicator \"", options.kind,
                                                 "\": expected one of local, mpi, nccl"));
}

}  // namespace ps
