#include "model/live_program_context.h"

#include <cstring>
#include <utility>

#include "base/status_macros.h"
#include "chunk/chunk_type.h"
#include "glog/logging.h"
#include "memory/caching_allocator.h"
#include "memory/resources.h"
#include "model/model_state_io.h"

namespace ps {

// --- PinnedUploadBuffer
// ---------------------------------------------------------------------------

PinnedUploadBuffer::~PinnedUploadBuffer() {
  if (absl::Status s = WaitAndFree(); !s.ok()) LOG(WARNING) << "GptModel: " << s;
}

absl::StatusOr<char*> PinnedUploadBuffer::Acquire(int64_t bytes) {
  // Query first: a finished copy (the usual case: the host waited for the stream since) costs no
  // wait, so the host keeps running ahead of the compute stream.
  if (event_ != nullptr && !event_->Query()) RETURN_IF_ERROR(event_->Synchronize());
  if (bytes > bytes_) {
    RETURN_IF_ERROR(WaitAndFree());
    ASSIGN_OR_RETURN(void* data, backend_->AllocatePinnedHost(bytes));
    data_ = static_cast<char*>(data);
    bytes_ = bytes;
  }
  if (event_ == nullptr) {
    ASSIGN_OR_RETURN(event_, backend_->CreateEvent());
  }
  return data_;
}

absl::Status PinnedUploadBuffer::Upload(Stream& stream, void* dst, int64_t bytes) {
  RETURN_IF_ERROR(stream.MemcpyAsync(dst, data_, bytes, CopyKind::kHostToDevice));
  return stream.RecordEvent(event_.get());
}

absl::Status PinnedUploadBuffer::WaitAndFree() {
  if (data_ == nullptr) return absl::OkStatus();
  if (event_ != nullptr) RETURN_IF_ERROR(event_->Synchronize());
  void* data = std::exchange(data_, nullptr);
  bytes_ = 0;
  return backend_->FreePinnedHost(data);
}

// --- LiveProgramContext
// ---------------------------------------------------------------------------

absl::StatusOr<float*> LiveProgramContext::AllocateScratch(int64_t elems) {
  ASSIGN_OR_RETURN(void* p, accelerator_->scratch()->AllocateOnStream(
                                elems * static_cast<int64_t>(sizeof(float)), *stream_));
  return static_cast<float*>(p);
}

void LiveProgramContext::FreeScratch(float* data, int64_t elems) {
  CachingAllocator* scratch = accelerator_->scratch();
  const int64_t bytes = elems * static_cast<int64_t>(sizeof(float));
  absl::Status s = scratch->DeallocateOnStream(data, bytes, *stream_);
  if (!s.ok()) {
    VLOG(1) << "GptModel: a stream-ordered free failed (" << s << "); waiting for the stream";
    const absl::Status synced = stream_->Synchronize();
    VLOG_IF(1, !synced.ok()) << "GptModel: the compute stream failed before a free: " << synced;
    s = scratch->Deallocate(data, bytes);
  }
  CHECK(s.ok()) << "GptModel: freeing an activation buffer failed: " << s;
}

absl::Status LiveProgramContext::Access(OperatorId op, Stage stage) {
  return manager_->Access(op, stage);
}

absl::Status LiveProgramContext::WaitBeforeRelease() {
  return release_wait_ == nullptr ? absl::OkStatus() : release_wait_->Synchronize();
}

absl::Status LiveProgramContext::Release(OperatorId op, Stage stage) {
  // The manager may move or drop the operator's chunks after the kernels enqueued so far (stream
  // order), or — with release_wait — the host first waits for them and returns the stream's error
  // first, if any (the operator is released either way).
  const absl::Status synced = WaitBeforeRelease();
  const absl::Status released = manager_->Release(op, stage);
  return synced.ok() ? released : synced;
}

void LiveProgramContext::ReleaseAfterError(OperatorId op, Stage stage) {
  // An error path: the operator's queued kernels finish before its chunks may move.
  const absl::Status synced = WaitBeforeRelease();
  VLOG_IF(1, !synced.ok()) << "GptModel: compute stream error on an error path: " << synced;
  const absl::Status s = manager_->Release(op, stage);
  LOG_IF(ERROR, !s.ok()) << "GptModel: releasing operator " << op << " after an error: " << s;
}

absl::StatusOr<TensorView> LiveProgramContext::Param(TensorId tensor) {
  return store_->View(ChunkType::kParam, tensor);
}

absl::Status LiveProgramContext::Upload(Staging staging, void* device,
                                        absl::Span<const absl::Span<const char>> pieces) {
  int64_t bytes = 0;
  for (const absl::Span<const char> piece : pieces) bytes += static_cast<int64_t>(piece.size());
  std::unique_ptr<PinnedUploadBuffer>& buffer = uploads_[static_cast<size_t>(staging)];
  if (buffer == nullptr) {
    ASSIGN_OR_RETURN(Backend * backend, AcceleratorBackendOf(*accelerator_));
    buffer = std::make_unique<PinnedUploadBuffer>(backend);
  }
  ASSIGN_OR_RETURN(char* staged, buffer->Acquire(bytes));
  for (const absl::Span<const char> piece : pieces) {
    if (!piece.empty()) std::memcpy(staged, piece.data(), piece.size());
    staged += piece.size();
  }
  return buffer->Upload(*stream_, device, bytes);
}

absl::StatusOr<double> LiveProgramContext::ReadLoss(const double* device) {
  double loss = 0;
  RETURN_IF_ERROR(stream_->MemcpyAsync(&loss, device, sizeof(double), CopyKind::kDeviceToHost));
  RETURN_IF_ERROR(stream_->Synchronize());
  return loss;
}

}  // namespace ps
