// SplitMix64 and the few things built on it that trainer/data needs to be reproducible on every
// platform: a bounded integer draw, a uniform double, and a Fisher-Yates shuffle.
//
// Why not <random>: std::mt19937_64 is specified bit-exactly, but std::uniform_int_distribution,
// std::uniform_real_distribution and std::shuffle are not — libstdc++, libc++ and MSVC return
// different values for the same engine state. Data order and the synthetic corpus must be the same
// everywhere, so everything here is spelled out.
//
// SplitMix64 is Steele, Lea and Flood's generator (Vigna's reference code: prng.di.unimi.it):
// state += 0x9E3779B97F4A7C15, then a 64-bit finalizer. Its first outputs from state 0 are
// 0xe220a8397b1dcdaf, 0x6e789e6aa1b965f4, 0x06c45d188009454f (checked in the test).
//
// Thread safety: a SplitMix64 is a value; one object must not be used by two threads at once.
#ifndef PATRICKSTAR_BASE_SPLITMIX64_H_
#define PATRICKSTAR_BASE_SPLITMIX64_H_

#include <cstdint>
#include <utility>

#include "absl/types/span.h"

namespace ps {

// The SplitMix64 finalizer: a bijective 64-bit mixer. Also used to derive independent seeds.
constexpr uint64_t Mix64(uint64_t z) {
  z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ULL;
  z = (z ^ (z >> 27)) * 0x94D049BB133111EBULL;
  return z ^ (z >> 31);
}

// A seed for stream `stream` of `seed` (e.g. one per epoch, one per corpus split). Distinct
// (seed, stream) pairs give unrelated streams for all practical purposes.
constexpr uint64_t DeriveSeed(uint64_t seed, uint64_t stream) {
  return Mix64(Mix64(seed ^ 0x5851F42D4C957F2DULL) + 0x9E3779B97F4A7C15ULL * (stream + 1));
}

class SplitMix64 {
 public:
  explicit constexpr SplitMix64(uint64_t seed) : state_(seed) {}

  constexpr uint64_t Next() {
    state_ += 0x9E3779B97F4A7C15ULL;
    return Mix64(state_);
  }

  // A uniform integer in [0, n), without modulo bias (Lemire's multiply-and-reject: the high 64
  // bits of a 128-bit product, rejecting the low-word values that would favour small results).
  // REQUIRES: n > 0.
  constexpr uint64_t Below(uint64_t n) {
    const uint64_t threshold = (0 - n) % n;  // 2^64 mod n
    while (true) {
      const unsigned __int128 m = static_cast<unsigned __int128>(Next()) * n;
      if (static_cast<uint64_t>(m) >= threshold) return static_cast<uint64_t>(m >> 64);
    }
  }

  // A uniform double in [0, 1) with 53 random bits.
  constexpr double Uniform() { return static_cast<double>(Next() >> 11) * 0x1.0p-53; }

 private:
  uint64_t state_;
};

// Fisher-Yates (Durstenfeld) shuffle of `values`, drawing from `rng`: for i from the last element
// down to 1, swap values[i] with values[Below(i + 1)].
template <typename T>
void Shuffle(absl::Span<T> values, SplitMix64& rng) {
  for (size_t i = values.size(); i > 1; --i) {
    const size_t j = static_cast<size_t>(rng.Below(i));
    using std::swap;
    swap(values[i - 1], values[j]);
  }
}

}  // namespace ps

#endif  // PATRICKSTAR_BASE_SPLITMIX64_H_
