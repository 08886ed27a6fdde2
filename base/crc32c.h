// CRC-32C (Castagnoli), the checksum of iSCSI, ext4 metadata, SSE4.2's `crc32` instruction and
// Google's storage formats: polynomial 0x1EDC6F41 (reflected 0x82F63B78), initial value and final
// XOR 0xFFFFFFFF. Crc32c("123456789") == 0xE3069283.
//
// Why CRC-32C for checkpoint files: it detects every burst error up to 32 bits and every odd number
// of flipped bits, and modern x86 CPUs compute it in hardware faster than memory can be read, so
// verifying a multi-gigabyte checkpoint costs about as much as reading it.
//
// Two implementations, chosen at run time (no -m flags at build time):
//   - software: table-driven slice-by-8 (8 bytes per step, 8 KiB of tables built at compile time);
//   - hardware: the SSE4.2 `crc32` instruction on three interleaved streams (the instruction has a
//     latency of 3 cycles and a throughput of 1, so one stream would leave 2/3 of it idle); the
//     three partial CRCs are combined with a precomputed "append L zero bytes" operator.
// Both give identical results for every input (tested against a bitwise reference).
//
// Thread safety: all functions are thread-safe.
#ifndef PATRICKSTAR_BASE_CRC32C_H_
#define PATRICKSTAR_BASE_CRC32C_H_

#include <cstddef>
#include <cstdint>

#include "absl/strings/string_view.h"

namespace ps {

// Extends `crc` (the CRC-32C of some prefix, 0 for the empty prefix) with `size` more bytes:
// Crc32cExtend(Crc32cExtend(0, a), b) == Crc32c(a + b).
uint32_t Crc32cExtend(uint32_t crc, const void* data, size_t size);

// The CRC-32C of `data`.
inline uint32_t Crc32c(const void* data, size_t size) { return Crc32cExtend(0, data, size); }
inline uint32_t Crc32c(absl::string_view data) { return Crc32cExtend(0, data.data(), data.size()); }

// True when Crc32cExtend uses the SSE4.2 instruction on this CPU.
bool Crc32cHardwareAvailable();

namespace crc32c_internal {
// The two implementations, exposed for tests and benchmarks. ExtendHardware REQUIRES:
// Crc32cHardwareAvailable().
uint32_t ExtendSoftware(uint32_t crc, const void* data, size_t size);
uint32_t ExtendHardware(uint32_t crc, const void* data, size_t size);
// One bit at a time, straight from the definition: the reference the others are tested against.
uint32_t ExtendBitwise(uint32_t crc, const void* data, size_t size);
}  // namespace crc32c_internal

}  // namespace ps

#endif  // PATRICKSTAR_BASE_CRC32C_H_
