// The per-epoch order of a data loader's units (DataLoader's windows, PackedLoader's rows): one
// definition, so every loader shuffles the same way on every platform.
//
// Thread safety: a pure function.
#ifndef PATRICKSTAR_TRAINER_DATA_INTERNAL_EPOCH_PERMUTATION_H_
#define PATRICKSTAR_TRAINER_DATA_INTERNAL_EPOCH_PERMUTATION_H_

#include <cstdint>
#include <numeric>
#include <vector>

#include "absl/types/span.h"
#include "base/splitmix64.h"

namespace ps {

// A permutation of [0, n) for epoch `epoch` of a run with seed `seed`: the identity shuffled by
// Fisher-Yates over SplitMix64 seeded with DeriveSeed(seed, epoch) (base/splitmix64.h).
// REQUIRES: n >= 0, epoch >= 0.
inline std::vector<int64_t> EpochPermutation(int64_t n, uint64_t seed, int64_t epoch) {
  std::vector<int64_t> perm(static_cast<size_t>(n));
  std::iota(perm.begin(), perm.end(), int64_t{0});
  SplitMix64 rng(DeriveSeed(seed, static_cast<uint64_t>(epoch)));
  Shuffle(absl::MakeSpan(perm), rng);
  return perm;
}

}  // namespace ps

#endif  // PATRICKSTAR_TRAINER_DATA_INTERNAL_EPOCH_PERMUTATION_H_
