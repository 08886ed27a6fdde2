// WithChunk: the one acquire / run / release bracket of HybridAdam's passes (hybrid_adam.cc) and of
// its speculation inside backward (hybrid_adam_overlap.cc). Internal to //optimizer:hybrid_adam.
#ifndef PATRICKSTAR_OPTIMIZER_INTERNAL_WITH_CHUNK_H_
#define PATRICKSTAR_OPTIMIZER_INTERNAL_WITH_CHUNK_H_

#include <cstdint>

#include "absl/status/status.h"
#include "base/status_macros.h"
#include "optimizer/hybrid_adam.h"

namespace ps {
namespace hybrid_adam_internal {

// Acquires chunk `chunk_index` for `use`, runs fn(payloads), and releases it even if fn failed.
// Returns the first error.
template <typename Fn>
absl::Status WithChunk(AdamChunkAccess& access, int64_t chunk_index, AdamChunkUse use, Fn fn) {
  ASSIGN_OR_RETURN(const AdamChunkPayloads payloads, access.Acquire(chunk_index, use));
  const absl::Status status = fn(payloads);
  const absl::Status released = access.Release(chunk_index, use);
  RETURN_IF_ERROR(status);
  return released;
}

}  // namespace hybrid_adam_internal
}  // namespace ps

#endif  // PATRICKSTAR_OPTIMIZER_INTERNAL_WITH_CHUNK_H_
