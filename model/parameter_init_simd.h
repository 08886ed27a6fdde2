// The vectorized inner loops of model/parameter_init.cc's FillNormal (Highway, run-time dispatch,
// capped by PS_SIMD_MAX): the std::mt19937_64 recurrence twisted a state block at a time, and the
// Box-Muller transform of a block's draws with Highway's vector log, sin and cos. Internal to
// parameter_init; the values FillNormal returns stay bit-identical to the scalar formula (see
// NormalBlock's contract for how).
//
// Thread safety: the functions keep no state; any thread may call them on its own buffers.
#ifndef PATRICKSTAR_MODEL_PARAMETER_INIT_SIMD_H_
#define PATRICKSTAR_MODEL_PARAMETER_INIT_SIMD_H_

#include <cstdint>

namespace ps::parameter_init_internal {

// std::mt19937_64's state size (n) and shift size (m).
inline constexpr int kMtStateWords = 312;
inline constexpr int kMtShiftWords = 156;
// The pairs of draws one state block yields, and the padding NormalBlock may read and write past
// them (a whole vector of the widest target: 8 pairs).
inline constexpr int kMtPairs = kMtStateWords / 2;
inline constexpr int kMtPadPairs = 8;

// One twist of the mt19937_64 state `mt` (kMtStateWords words): the standard's recurrence for all
// n words (what the engine does when it has handed out its n tempered outputs).
void MtTwist(uint64_t* mt);

// The Box-Muller values of the kMtPairs pairs of (untempered) state words in `raw` (after a twist,
// before tempering): pair p tempers raw[2p] and raw[2p + 1] into draws a and b, u1 = ((a >> 11) +
// 1) 2^-53, u2 = (b >> 11) 2^-53, r = sqrt(-2 log u1), and
//   cos_out[p] = float(std r cos(2 pi u2)), sin_out[p] = float(std r sin(2 pi u2))
// computed with vector approximations whose error is far inside a margin of 2^-44 std r: where the
// margin around a value does not round to one float (a value near the midpoint between two
// floats, or r = 0), the pair's index goes to `redo` (the caller recomputes it with the scalar
// libm formula), so every pair not in `redo` equals the scalar formula bit for bit. Returns the
// number of indices written to `redo` (ascending, all < kMtPairs).
// REQUIRES: raw holds 2 (kMtPairs + kMtPadPairs) readable words; cos_out and sin_out
// kMtPairs + kMtPadPairs floats; redo kMtPairs + kMtPadPairs ints.
int NormalBlock(const uint64_t* raw, double std, float* cos_out, float* sin_out, int* redo);

// Tempers one state word into the engine's output (the standard's tempering).
inline uint64_t MtTemper(uint64_t y) {
  y ^= (y >> 29) & 0x5555555555555555ULL;
  y ^= (y << 17) & 0x71D67FFFEDA60000ULL;
  y ^= (y << 37) & 0xFFF7EEE000000000ULL;
  y ^= y >> 43;
  return y;
}

}  // namespace ps::parameter_init_internal

#endif  // PATRICKSTAR_MODEL_PARAMETER_INIT_SIMD_H_
