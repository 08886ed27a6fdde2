// LiveProgramContext: the ProgramContext (model/transformer_program.h) that runs the transformer
// program for real — GptModel's. Scratch comes from the accelerator's caching allocator, stream
// ordered on the compute stream; operators are accessed and released through the ChunkManager;
// parameters are read and gradients written in their param chunk slots; kernels are enqueued on the
// compute stream; inputs go up through pinned staging with asynchronous copies; the loss comes back
// with one device-to-host copy the host waits for.
//
// Release. With `release_wait` null the manager orders its moves by the compute stream (it is the
// manager's compute_stream), so the host does not wait; otherwise the host waits for that stream
// before each Release (only then may the manager move a chunk the kernels read or wrote).
//
// Scratch frees are stream-ordered (CachingAllocator::DeallocateOnStream on the compute stream):
// the host does not wait; later work on the compute stream reuses the block at once, anything else
// only after the stream passed the free. The allocator's (and the tracker's) accounting moves at
// the free's program point, where the activation profile records it. Without events (an allocator
// with no event backend) the host waits for the stream and frees at once.
//
// Thread safety: thread-compatible; one thread drives it (the model's).
#ifndef PATRICKSTAR_MODEL_LIVE_PROGRAM_CONTEXT_H_
#define PATRICKSTAR_MODEL_LIVE_PROGRAM_CONTEXT_H_

#include <array>
#include <cstdint>
#include <memory>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "chunk/chunk_store.h"
#include "memory/backend.h"
#include "memory/device_memory.h"
#include "model/kernels/kernels.h"
#include "model/transformer_program.h"
#include "scheduler/chunk_manager.h"

namespace ps {

// A pinned host buffer for stream-ordered uploads, reused: before it is overwritten, and before it
// is freed, the host waits for the event recorded after the last copy out of it.
class PinnedUploadBuffer {
 public:
  explicit PinnedUploadBuffer(Backend* backend) : backend_(backend) {}
  PinnedUploadBuffer(const PinnedUploadBuffer&) = delete;
  PinnedUploadBuffer& operator=(const PinnedUploadBuffer&) = delete;
  ~PinnedUploadBuffer();

  // At least `bytes` of pinned memory the host may fill now (no copy out of it is pending).
  [[nodiscard]] absl::StatusOr<char*> Acquire(int64_t bytes);
  // Copies the first `bytes` of the buffer to `dst` on `stream`, after its work so far.
  [[nodiscard]] absl::Status Upload(Stream& stream, void* dst, int64_t bytes);

 private:
  absl::Status WaitAndFree();

  Backend* const backend_;
  std::unique_ptr<Event> event_;
  char* data_ = nullptr;
  int64_t bytes_ = 0;
};

class LiveProgramContext final : public ProgramContext {
 public:
  // None owned; each must outlive the context. `accelerator` is the memory whose scratch() holds
  // the buffers (and whose backend stages the uploads, created at the first upload); `kernels` and
  // `stream` the accelerator backend's; `release_wait` as in the file comment.
  LiveProgramContext(ChunkStore* store, ChunkManager* manager, DeviceMemory* accelerator,
                     Kernels* kernels, Stream* stream, Stream* release_wait)
      : store_(store),
        manager_(manager),
        accelerator_(accelerator),
        kernels_(kernels),
        stream_(stream),
        release_wait_(release_wait) {}
  LiveProgramContext(const LiveProgramContext&) = delete;
  LiveProgramContext& operator=(const LiveProgramContext&) = delete;

  absl::StatusOr<float*> AllocateScratch(int64_t elems) override;
  void FreeScratch(float* data, int64_t elems) override;
  absl::Status Access(OperatorId op, Stage stage) override;
  absl::Status Release(OperatorId op, Stage stage) override;
  void ReleaseAfterError(OperatorId op, Stage stage) override;
  absl::StatusOr<TensorView> Param(TensorId tensor) override;
  DType compute_dtype() const override { return store_->compute_dtype(); }
  const KernelWorkspaces& workspaces() const override { return kernels_->workspaces(); }
  absl::Status Compute(absl::FunctionRef<absl::Status(Kernels&, Stream&)> enqueue) override {
    return enqueue(*kernels_, *stream_);
  }
  absl::Status Upload(Staging staging, void* device,
                      absl::Span<const absl::Span<const char>> pieces) override;
  absl::StatusOr<double> ReadLoss(const double* device) override;

 private:
  // The host waits for the compute stream when the manager does not order by it.
  absl::Status WaitBeforeRelease();

  ChunkStore* const store_;
  ChunkManager* const manager_;
  DeviceMemory* const accelerator_;
  Kernels* const kernels_;
  Stream* const stream_;
  Stream* const release_wait_;
  // Staging of the per-micro-batch uploads (Staging::kInputs, kTokenSlots), so that these copies
  // are asynchronous (a pageable source makes the runtime copy synchronously). Created on first
  // use; destroyed (waiting for their last copies) before the stream they copied on.
  std::array<std::unique_ptr<PinnedUploadBuffer>, 2> uploads_;
};

}  // namespace ps

#endif  // PATRICKSTAR_MODEL_LIVE_PROGRAM_CONTEXT_H_
