// CollectiveHooks: the two group collectives ZeRO data parallelism needs from the ChunkManager's
// point of view, injected so that scheduler/chunk_manager stays free of comm/ (and is tested with
// any implementation): scheduler/comm_collectives.h implements them over a comm/ Communicator.
//
// A *group* is the world_size() param chunks [group * N, group * N + N) of a ChunkLayout; chunk
// group * N + r is owned by rank r (chunk/chunk_layout.h). The manager hands over one payload
// pointer per rank — the chunk owned by that rank, as this rank holds it — all of `count_elems`
// elements of `dtype`, on host-addressable memory (host, pinned, or the emulated accelerator's
// memory) or wherever the implementation documents. A padding chunk (no parameters) has a null
// pointer on every rank: it takes no part and its contents are never defined.
//
// Every rank must call the same collectives for the same groups in the same order (the manager
// guarantees this: its decisions depend only on the access sequence, which every rank runs
// identically). Calls are synchronous: when one returns, the payloads hold the result.
//
// Thread safety: an implementation is used by one ChunkManager on one thread.
#ifndef PATRICKSTAR_SCHEDULER_COLLECTIVE_HOOKS_H_
#define PATRICKSTAR_SCHEDULER_COLLECTIVE_HOOKS_H_

#include <cstdint>

#include "absl/status/status.h"
#include "absl/types/span.h"
#include "memory/dtype.h"

namespace ps {

class CollectiveHooks {
 public:
  virtual ~CollectiveHooks() = default;

  virtual int rank() const = 0;
  virtual int world_size() const = 0;

  // All-gather: afterwards payloads[r] holds, on every rank, the bytes rank r's payloads[r] held
  // before (rank r's own chunk is only read). REQUIRES: payloads.size() == world_size().
  [[nodiscard]] virtual absl::Status AllGatherGroup(int64_t group, absl::Span<void* const> payloads,
                                                    int64_t count_elems, DType dtype) = 0;

  // Reduce-scatter with averaging: afterwards payloads[rank()] holds the element-wise mean over
  // ranks r of rank r's payloads[rank()] (gradients of this rank's chunk, averaged over the data-
  // parallel ranks); the other payloads are only read. Every rank receives bit-identical means
  // for the same inputs. REQUIRES: payloads.size() == world_size().
  [[nodiscard]] virtual absl::Status ReduceScatterGroup(int64_t group,
                                                        absl::Span<void* const> payloads,
                                                        int64_t count_elems, DType dtype) = 0;
};

}  // namespace ps

#endif  // PATRICKSTAR_SCHEDULER_COLLECTIVE_HOOKS_H_
