#include "base/crc32c.h"

#include <array>
#include <bit>
#include <cstring>

#if defined(__x86_64__) || defined(__i386__)
#include <nmmintrin.h>
#define PS_CRC32C_X86 1
#else
#define PS_CRC32C_X86 0
#endif

namespace ps {
namespace {

// The reflected Castagnoli polynomial.
constexpr uint32_t kPoly = 0x82F63B78u;

// kTables[k][b]: the CRC contribution of byte value b followed by k zero bytes (slice-by-8).
using Tables = std::array<std::array<uint32_t, 256>, 8>;

constexpr Tables MakeTables() {
  Tables t{};
  for (uint32_t i = 0; i < 256; ++i) {
    uint32_t c = i;
    for (int bit = 0; bit < 8; ++bit) c = (c >> 1) ^ ((c & 1u) ? kPoly : 0u);
    t[0][i] = c;
  }
  for (int k = 1; k < 8; ++k) {
    for (uint32_t i = 0; i < 256; ++i) t[k][i] = (t[k - 1][i] >> 8) ^ t[0][t[k - 1][i] & 0xFFu];
  }
  return t;
}

constexpr Tables kTables = MakeTables();

inline uint64_t LoadLittle64(const uint8_t* p) {
  uint64_t v;
  std::memcpy(&v, p, sizeof(v));
  if constexpr (std::endian::native == std::endian::big) v = __builtin_bswap64(v);
  return v;
}

// The raw (not inverted) CRC register update, software. Slice-by-8: XOR eight bytes into the
// register and look up all eight at once.
uint32_t RawSoftware(uint32_t c, const uint8_t* p, size_t n) {
  while (n > 0 && (reinterpret_cast<uintptr_t>(p) & 7u) != 0) {
    c = (c >> 8) ^ kTables[0][(c ^ *p++) & 0xFFu];
    --n;
  }
  while (n >= 8) {
    const uint64_t v = LoadLittle64(p) ^ c;
    c = kTables[7][v & 0xFF] ^ kTables[6][(v >> 8) & 0xFF] ^ kTables[5][(v >> 16) & 0xFF] ^
        kTables[4][(v >> 24) & 0xFF] ^ kTables[3][(v >> 32) & 0xFF] ^ kTables[2][(v >> 40) & 0xFF] ^
        kTables[1][(v >> 48) & 0xFF] ^ kTables[0][v >> 56];
    p += 8;
    n -= 8;
  }
  while (n > 0) {
    c = (c >> 8) ^ kTables[0][(c ^ *p++) & 0xFFu];
    --n;
  }
  return c;
}

#if PS_CRC32C_X86

// Bytes per stream in the three-way interleaved hardware loop.
constexpr size_t kStreamBytes = 1024;

// The linear operator "feed kStreamBytes zero bytes into the raw register", as four byte-indexed
// tables: Shift(s) = raw CRC register after s is followed by kStreamBytes zeros. Because the raw
// update is linear over GF(2), raw(s, A|B|C) = Shift(Shift(raw(s, A))) ^ Shift(raw(0, B)) ^
// raw(0, C) when |B| = |C| = kStreamBytes, which is how the three streams are joined.
struct ShiftTables {
  std::array<std::array<uint32_t, 256>, 4> t;

  ShiftTables() {
    static constexpr uint8_t kZeros[kStreamBytes] = {};
    std::array<uint32_t, 32> column;
    for (int j = 0; j < 32; ++j) column[j] = RawSoftware(uint32_t{1} << j, kZeros, kStreamBytes);
    for (int k = 0; k < 4; ++k) {
      for (uint32_t b = 0; b < 256; ++b) {
        uint32_t v = 0;
        for (int i = 0; i < 8; ++i) {
          if ((b >> i) & 1u) v ^= column[8 * k + i];
        }
        t[k][b] = v;
      }
    }
  }

  uint32_t Shift(uint32_t s) const {
    return t[0][s & 0xFF] ^ t[1][(s >> 8) & 0xFF] ^ t[2][(s >> 16) & 0xFF] ^ t[3][s >> 24];
  }
};

const ShiftTables& GetShiftTables() {
  static const ShiftTables* const tables = new ShiftTables();
  return *tables;
}

__attribute__((target("sse4.2"))) uint32_t RawHardware(uint32_t crc, const uint8_t* p, size_t n) {
  uint64_t c = crc;
  while (n > 0 && (reinterpret_cast<uintptr_t>(p) & 7u) != 0) {
    c = _mm_crc32_u8(static_cast<uint32_t>(c), *p++);
    --n;
  }
  if (n >= 3 * kStreamBytes) {
    const ShiftTables& shift = GetShiftTables();
    while (n >= 3 * kStreamBytes) {
      uint64_t a = c, b = 0, d = 0;
      const uint8_t* pb = p + kStreamBytes;
      const uint8_t* pd = p + 2 * kStreamBytes;
      for (size_t i = 0; i < kStreamBytes; i += 8) {
        uint64_t va, vb, vd;
        std::memcpy(&va, p + i, 8);
        std::memcpy(&vb, pb + i, 8);
        std::memcpy(&vd, pd + i, 8);
        a = _mm_crc32_u64(a, va);
        b = _mm_crc32_u64(b, vb);
        d = _mm_crc32_u64(d, vd);
      }
      c = shift.Shift(shift.Shift(static_cast<uint32_t>(a)) ^ static_cast<uint32_t>(b)) ^
          static_cast<uint32_t>(d);
      p += 3 * kStreamBytes;
      n -= 3 * kStreamBytes;
    }
  }
  while (n >= 8) {
    uint64_t v;
    std::memcpy(&v, p, 8);
    c = _mm_crc32_u64(c, v);
    p += 8;
    n -= 8;
  }
  while (n > 0) {
    c = _mm_crc32_u8(static_cast<uint32_t>(c), *p++);
    --n;
  }
  return static_cast<uint32_t>(c);
}

bool DetectHardware() { return __builtin_cpu_supports("sse4.2"); }

#else  // !PS_CRC32C_X86

uint32_t RawHardware(uint32_t crc, const uint8_t* p, size_t n) { return RawSoftware(crc, p, n); }
bool DetectHardware() { return false; }

#endif

const bool kHardware = DetectHardware();

}  // namespace

bool Crc32cHardwareAvailable() { return kHardware; }

uint32_t Crc32cExtend(uint32_t crc, const void* data, size_t size) {
  const auto* p = static_cast<const uint8_t*>(data);
  return ~(kHardware ? RawHardware(~crc, p, size) : RawSoftware(~crc, p, size));
}

namespace crc32c_internal {

uint32_t ExtendSoftware(uint32_t crc, const void* data, size_t size) {
  return ~RawSoftware(~crc, static_cast<const uint8_t*>(data), size);
}

uint32_t ExtendHardware(uint32_t crc, const void* data, size_t size) {
  return ~RawHardware(~crc, static_cast<const uint8_t*>(data), size);
}

uint32_t ExtendBitwise(uint32_t crc, const void* data, size_t size) {
  const auto* p = static_cast<const uint8_t*>(data);
  uint32_t c = ~crc;
  for (size_t i = 0; i < size; ++i) {
    c ^= p[i];
    for (int bit = 0; bit < 8; ++bit) c = (c >> 1) ^ (kPoly & (0u - (c & 1u)));
  }
  return ~c;
}

}  // namespace crc32c_internal
}  // namespace ps
