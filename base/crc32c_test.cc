#include "base/crc32c.h"

#include <cstdint>
#include <random>
#include <string>
#include <vector>

#include "gtest/gtest.h"

namespace ps {
namespace {

using crc32c_internal::ExtendBitwise;
using crc32c_internal::ExtendHardware;
using crc32c_internal::ExtendSoftware;

using ExtendFn = uint32_t (*)(uint32_t, const void*, size_t);

struct Impl {
  const char* name;
  ExtendFn fn;
};

std::vector<Impl> Implementations() {
  std::vector<Impl> impls = {
      {"bitwise", &ExtendBitwise}, {"software", &ExtendSoftware}, {"dispatched", &Crc32cExtend}};
  if (Crc32cHardwareAvailable()) impls.push_back({"hardware", &ExtendHardware});
  return impls;
}

// Known answers: the check value of the CRC catalogue and RFC 3720 (iSCSI) appendix B.4.
TEST(Crc32cTest, KnownVectors) {
  std::vector<uint8_t> zeros(32, 0x00), ones(32, 0xFF), inc(32), dec(32);
  for (int i = 0; i < 32; ++i) {
    inc[i] = static_cast<uint8_t>(i);
    dec[i] = static_cast<uint8_t>(31 - i);
  }
  // An iSCSI SCSI Read (10) command PDU.
  const std::vector<uint8_t> pdu = {0x01, 0xc0, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00,
                                    0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x14, 0x00, 0x00, 0x00,
                                    0x00, 0x00, 0x04, 0x00, 0x00, 0x00, 0x00, 0x14, 0x00, 0x00,
                                    0x00, 0x18, 0x28, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00,
                                    0x02, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00};
  const std::string check = "123456789";
  for (const Impl& impl : Implementations()) {
    SCOPED_TRACE(impl.name);
    EXPECT_EQ(impl.fn(0, check.data(), check.size()), 0xE3069283u);
    EXPECT_EQ(impl.fn(0, zeros.data(), zeros.size()), 0x8A9136AAu);
    EXPECT_EQ(impl.fn(0, ones.data(), ones.size()), 0x62A8AB43u);
    EXPECT_EQ(impl.fn(0, inc.data(), inc.size()), 0x46DD794Eu);
    EXPECT_EQ(impl.fn(0, dec.data(), dec.size()), 0x113FDB5Cu);
    EXPECT_EQ(impl.fn(0, pdu.data(), pdu.size()), 0xD9963A56u);
    EXPECT_EQ(impl.fn(0, nullptr, 0), 0u);
  }
  EXPECT_EQ(Crc32c("123456789"), 0xE3069283u);
}

// Random contents, awkward lengths (around the 8-byte step and the 3 x 1024-byte interleaved
// block) and every alignment: all implementations agree with the bitwise definition.
TEST(Crc32cTest, RandomInputsMatchBitwiseReference) {
  std::mt19937_64 rng(12345);
  std::vector<uint8_t> buffer(3 * 3 * 1024 + 64);
  for (uint8_t& b : buffer) b = static_cast<uint8_t>(rng());
  std::vector<size_t> lengths = {0,    1,    2,    7,    8,    9,    15,   16,   17,
                                 63,   64,   65,   1023, 1024, 1025, 3071, 3072, 3073,
                                 3079, 3080, 6143, 6144, 6151, 9216, 9217};
  for (int i = 0; i < 40; ++i) lengths.push_back(rng() % (buffer.size() - 8));
  for (size_t length : lengths) {
    for (size_t offset = 0; offset < 8; ++offset) {
      const uint32_t seed = static_cast<uint32_t>(rng());
      const uint32_t want = ExtendBitwise(seed, buffer.data() + offset, length);
      for (const Impl& impl : Implementations()) {
        ASSERT_EQ(impl.fn(seed, buffer.data() + offset, length), want)
            << impl.name << " length " << length << " offset " << offset;
      }
    }
  }
}

// Crc32cExtend(Crc32cExtend(0, a), b) == Crc32c(a + b), for every split point.
TEST(Crc32cTest, ExtendComposes) {
  std::mt19937_64 rng(7);
  std::string data(5000, '\0');
  for (char& c : data) c = static_cast<char>(rng());
  const uint32_t whole = Crc32c(data);
  for (size_t split = 0; split <= data.size(); split += 1 + rng() % 97) {
    const uint32_t head = Crc32c(data.data(), split);
    EXPECT_EQ(Crc32cExtend(head, data.data() + split, data.size() - split), whole) << split;
  }
}

// Every single-bit flip changes the checksum (a CRC detects all 1-bit errors).
TEST(Crc32cTest, DetectsEverySingleBitFlip) {
  std::mt19937_64 rng(99);
  std::string data(4096, '\0');
  for (char& c : data) c = static_cast<char>(rng());
  const uint32_t good = Crc32c(data);
  for (size_t byte = 0; byte < data.size(); ++byte) {
    for (int bit = 0; bit < 8; ++bit) {
      data[byte] = static_cast<char>(data[byte] ^ (1 << bit));
      ASSERT_NE(Crc32c(data), good) << byte << ":" << bit;
      data[byte] = static_cast<char>(data[byte] ^ (1 << bit));
    }
  }
}

}  // namespace
}  // namespace ps
