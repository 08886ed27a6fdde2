// Chunk: one runtime chunk — a fixed-capacity buffer of one element type holding the tensors the
// layout placed in it, the TensorState of each of those tensors, and a pin count.
//
// Payload. A chunk either has a payload — capacity_bytes() bytes from a MemoryResource, on that
// resource's device — or none (RELEASED). The chunk remembers the resource and gives the payload
// back to it on release, on a move, and on destruction. Any MemoryResource works (a chunk-block
// pool, a host resource, a test resource); the resource must outlive the chunk's use of it.
// Payload contents are unspecified after allocation: FREE -> COMPUTE zero-fills a tensor's view,
// FREE -> HOLD promises the caller fills it.
//
// Invariants (kept by every method, checked by the randomized test):
//  - tensor_count(s) is exactly the number of tensors in state s; the counts sum to
//    num_tensors().
//  - Without a payload every tensor is FREE (data cannot be held without memory).
//  - state() is derived (chunk/tensor_state.h): RELEASED without payload, else the first
//    non-zero of COMPUTE > HOLD > HOLD_AFTER_FWD > HOLD_AFTER_BWD, else FREE.
//  - A chunk with a COMPUTE tensor, or pinned, is never moved or released: asking is
//    FailedPrecondition and changes nothing.
//  - Only the owner rank holds a master/momentum/variance payload, and padding chunks never do.
//  - A backing copy exists only beside a payload, on another resource (see below).
//
// Backing copy (host memory as the backing store). When the scheduler loads a chunk from the host
// to the accelerator it keeps the host buffer: CopyToKeepingBacking() makes the new buffer the
// payload and the old one the chunk's *backing copy*, marked valid (it holds the payload's bytes).
// While it stays valid, the chunk is *clean*: evicting it is RevertToBacking(), which drops the
// payload and makes the backing copy the payload again, with no copy at all. The backing copy goes
// stale when the payload changes: on FREE -> COMPUTE (zero-fill) and FREE -> HOLD (the caller
// fills it), and whenever the owner calls MarkPayloadWritten() (the chunk cannot see kernels write
// through views, so the scheduler says when it grants write access). A stale backing copy is made
// valid again by WriteBackAsync(), which copies into the existing buffer (no new allocation).
// DiscardBacking() frees it; CopyToKeepingBacking() + waiting + DiscardBacking() is an
// asynchronous move that frees the source only after the copy completed.
// The asynchronous calls only enqueue work on a stream: the caller must wait for that stream (an
// event recorded after the call) before reading or writing the new payload, and before freeing
// or reverting to the backing copy. Nothing in Chunk waits for them.
//
// Errors: an illegal tensor-state transition is FailedPrecondition naming the tensor, the chunk,
// the from and to states and the legal targets; a failed allocation is the resource's
// ResourceExhausted with the chunk named; every failed call leaves the chunk unchanged unless its
// comment says otherwise.
//
// Thread safety: thread-compatible. The scheduler serializes all calls on a chunk.
#ifndef PATRICKSTAR_CHUNK_CHUNK_H_
#define PATRICKSTAR_CHUNK_CHUNK_H_

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "chunk/chunk_layout.h"
#include "chunk/chunk_type.h"
#include "chunk/tensor_state.h"
#include "memory/backend.h"
#include "memory/device.h"
#include "memory/dtype.h"
#include "memory/memory_resource.h"

namespace ps {

// One tensor of a chunk, as placed by the layout.
struct ChunkTensor {
  TensorId id = -1;
  std::string name;
  int64_t offset_elems = 0;
  int64_t numel = 0;
};

struct ChunkSpec {
  ChunkId id;
  DType dtype = DType::kF32;
  int64_t capacity_elems = 0;
  // ZeRO ownership: the rank owning the chunk and the rank of this process.
  int owner_rank = 0;
  int local_rank = 0;
  bool is_padding = false;
  // Ordered by offset, non-overlapping, inside the capacity, distinct ids.
  std::vector<ChunkTensor> tensors;
};

// Where a tensor's elements are: `numel` elements of `dtype` at `data` on `device`. Valid while
// the chunk keeps its payload where it is (a move or release invalidates it).
struct TensorView {
  void* data = nullptr;
  int64_t numel = 0;
  DType dtype = DType::kF32;
  Device device;

  int64_t bytes() const { return numel * SizeOf(dtype); }
};

// The copy kind for moving bytes from `src` to `dst`. InvalidArgument for two different
// accelerators (peer copies are not supported).
absl::StatusOr<CopyKind> CopyKindBetween(Device src, Device dst);

class Chunk {
 public:
  // InvalidArgument if the spec is inconsistent (capacity <= 0, tensors unordered, overlapping,
  // out of bounds, duplicated, or with numel <= 0).
  static absl::StatusOr<std::unique_ptr<Chunk>> Create(ChunkSpec spec);

  // Gives a remaining payload back to its resource (logged if that fails).
  ~Chunk();
  Chunk(const Chunk&) = delete;
  Chunk& operator=(const Chunk&) = delete;

  const ChunkId& id() const { return spec_.id; }
  ChunkType type() const { return spec_.id.type; }
  DType dtype() const { return spec_.dtype; }
  int64_t capacity_elems() const { return spec_.capacity_elems; }
  int64_t capacity_bytes() const { return spec_.capacity_elems * SizeOf(spec_.dtype); }
  int owner_rank() const { return spec_.owner_rank; }
  bool is_local() const { return spec_.owner_rank == spec_.local_rank; }
  bool is_padding() const { return spec_.is_padding; }

  // --- Payload --------------------------------------------------------------------------------

  bool has_payload() const { return payload_ != nullptr; }
  // The payload's device. REQUIRES: has_payload().
  Device device() const;
  // nullptr when RELEASED.
  void* payload() const { return payload_; }
  MemoryResource* payload_resource() const { return resource_; }

  // Allocates capacity_bytes() from `resource`. Tensors stay FREE.
  // FailedPrecondition if the chunk already has a payload, or it is a master/momentum/variance
  // chunk this rank does not own or a padding one; the resource's error (ResourceExhausted)
  // otherwise, with the chunk named.
  [[nodiscard]] absl::Status AllocatePayload(MemoryResource& resource);

  // Gives the payload (and the backing copy, if any) back; every tensor becomes FREE (its data is
  // gone). FailedPrecondition if there is no payload, a tensor is COMPUTE, or the chunk is pinned.
  [[nodiscard]] absl::Status ReleasePayload();

  // Moves the payload to `destination`: allocates there, copies on `stream` (CopyKind derived
  // from the two devices), waits for the copy, gives the old payload back. Tensor states are
  // unchanged. A move to the resource already holding the payload is a no-op. With a backing
  // copy on `destination` the move reuses it: a valid one is simply reverted to (no copy), a stale
  // one is written back into (no allocation) first. A backing copy elsewhere is given back after
  // a successful move.
  // FailedPrecondition if there is no payload, a tensor is COMPUTE, or the chunk is pinned;
  // ResourceExhausted if `destination` is full; the stream's error if the copy fails. On any
  // error the payload stays where it was (if giving the old payload back fails after the copy,
  // the chunk is on `destination` and that error is returned).
  // REQUIRES: `stream` can copy between the two devices (a stream of the accelerator's backend).
  [[nodiscard]] absl::Status MoveTo(MemoryResource& destination, Stream& stream);

  // True if MoveTo/ReleasePayload would be allowed now: a payload, no COMPUTE tensor, not pinned.
  bool movable() const;

  // --- Backing copy (see the file comment) ----------------------------------------------------

  bool has_backing() const { return backing_ != nullptr; }
  // True when the backing copy holds the payload's bytes (the chunk is clean). False without one.
  bool backing_valid() const { return backing_ != nullptr && backing_valid_; }
  // nullptr without a backing copy.
  void* backing() const { return backing_; }
  MemoryResource* backing_resource() const { return backing_resource_; }
  // The backing copy's device. REQUIRES: has_backing().
  Device backing_device() const;

  // Allocates a buffer from `destination`, enqueues a copy of the payload into it on `stream`,
  // and makes it the payload; the old payload becomes the valid backing copy. Tensor states are
  // unchanged; views now point into the new payload. Wait for `stream` before using the new
  // payload (see the file comment).
  // FailedPrecondition if there is no payload, a tensor is COMPUTE, the chunk is pinned, it
  // already has a backing copy, or `destination` already holds the payload; InvalidArgument for
  // two different accelerators; ResourceExhausted if `destination` is full; the stream's error if
  // the enqueue fails. On any error the chunk is unchanged.
  [[nodiscard]] absl::Status CopyToKeepingBacking(MemoryResource& destination, Stream& stream);

  // Makes the backing copy valid by enqueueing a copy of the payload into it on `stream`. A chunk
  // without a backing copy first gets one from `backing_resource` (FailedPrecondition when that
  // is null, or is the payload's resource). No-op for a chunk whose backing copy is valid.
  // FailedPrecondition if there is no payload, a tensor is COMPUTE, or the chunk is pinned;
  // ResourceExhausted if the new backing copy cannot be allocated; the stream's error if the
  // enqueue fails. On any error the chunk is unchanged (a backing copy allocated by this call is
  // freed again).
  [[nodiscard]] absl::Status WriteBackAsync(Stream& stream,
                                            MemoryResource* backing_resource = nullptr);

  // Clean eviction: gives the payload back to its resource and makes the backing copy the
  // payload, with no copy. Tensor states are unchanged.
  // FailedPrecondition if there is no backing copy or it is stale, a tensor is COMPUTE, or the
  // chunk is pinned. REQUIRES: no stream work on either buffer is pending.
  [[nodiscard]] absl::Status RevertToBacking();

  // Gives the backing copy back to its resource. FailedPrecondition without one.
  // REQUIRES: no stream work on it is pending.
  [[nodiscard]] absl::Status DiscardBacking();

  // Records that the payload was (or is about to be) written: the backing copy, if any, goes
  // stale.
  void MarkPayloadWritten() { backing_valid_ = false; }

  // --- Pinning: a pinned chunk is never moved or released (collective buffers in flight) -----

  void Pin() { ++pin_count_; }
  // FailedPrecondition if the chunk is not pinned.
  [[nodiscard]] absl::Status Unpin();
  int pin_count() const { return pin_count_; }
  bool pinned() const { return pin_count_ > 0; }

  // --- Tensors --------------------------------------------------------------------------------

  int num_tensors() const { return static_cast<int>(spec_.tensors.size()); }
  // REQUIRES: 0 <= slot < num_tensors().
  const ChunkTensor& tensor(int slot) const;
  TensorState tensor_state(int slot) const;
  // NotFound if the tensor is not in this chunk.
  absl::StatusOr<int> FindSlot(TensorId id) const;

  // OK if SetTensorState(slot, to, stream) would succeed given whether a stream is passed.
  [[nodiscard]] absl::Status CheckTransition(int slot, TensorState to, bool has_stream) const;

  // Moves tensor `slot` to state `to`.
  // FailedPrecondition for an illegal transition (see the table in chunk/tensor_state.h) or for
  // any state but FREE without a payload; InvalidArgument for a bad slot, or FREE -> COMPUTE on
  // an accelerator payload without a stream.
  // FREE -> COMPUTE zero-fills the tensor's view: with memset for a host payload; for an
  // accelerator payload by MemsetAsync on `stream` — work reading the view must be ordered after
  // it (use the same stream, or an event).
  [[nodiscard]] absl::Status SetTensorState(int slot, TensorState to, Stream* stream = nullptr);

  // The tensor's elements in the payload. FailedPrecondition without a payload.
  absl::StatusOr<TensorView> View(int slot) const;
  // The whole payload as one view of capacity_elems() elements.
  absl::StatusOr<TensorView> PayloadView() const;

  int64_t tensor_count(TensorState state) const { return counts_[static_cast<int>(state)]; }
  const TensorStateCounts& tensor_counts() const { return counts_; }
  ChunkState state() const { return DeriveChunkState(has_payload(), counts_); }

  // "param#3 [HOLD] 4 tensors on accelerator:0, 8.00 MiB, owner 0, backing on host (clean)".
  std::string DebugString() const;

 private:
  explicit Chunk(ChunkSpec spec);

  // FailedPrecondition naming `action` unless movable().
  absl::Status CheckMovable(absl::string_view action) const;
  // Gives the backing copy back (if any), logging and returning a failure.
  absl::Status FreeBacking();
  absl::Status CheckSlot(int slot) const;

  ChunkSpec spec_;
  absl::flat_hash_map<TensorId, int> slot_of_;
  std::vector<TensorState> states_;
  TensorStateCounts counts_{};
  int pin_count_ = 0;
  void* payload_ = nullptr;
  MemoryResource* resource_ = nullptr;
  // The backing copy (see the file comment); only ever set while payload_ is.
  void* backing_ = nullptr;
  MemoryResource* backing_resource_ = nullptr;
  bool backing_valid_ = false;
};

}  // namespace ps

#endif  // PATRICKSTAR_CHUNK_CHUNK_H_
