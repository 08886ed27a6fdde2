// model/kernels/cuda/vocab_blocks_math.h on the CPU: the element loops of the CUDA kernels
// (vocab_blocks_kernels.cu), run here through the same helpers in the kernels' order, give what
// the CPU kernels of model/kernels/vocab_blocks.h give, bit for bit — embedding blocks of f32,
// f16 and bf16 rows (every block in turn), the scatter of gradients into touched rows, and the
// position-embedding gradient — on awkward sizes; and the device-data rules (NaN rows for tokens
// outside the vocabulary and slots outside the buffer) that the CPU refuses at enqueue instead.
#include "model/kernels/cuda/vocab_blocks_math.h"

#include <algorithm>
#include <array>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <random>
#include <vector>

#include "absl/types/span.h"
#include "base/testing/status_matchers.h"
#include "base/testing/test_rng.h"
#include "gtest/gtest.h"
#include "memory/dtype.h"
#include "memory/dtype_math.h"
#include "model/kernels/vocab_blocks.h"

namespace ps::cuda {
namespace {

uint32_t Bits(float x) {
  uint32_t b;
  std::memcpy(&b, &x, sizeof(b));
  return b;
}

// EmbeddingBlockForwardKernel's body for every element.
void EmulateEmbeddingBlockForward(const VocabBlockShape& s, const std::vector<int32_t>& tokens,
                                  DType dtype, const void* block, std::vector<float>& out) {
  for (int64_t i = 0; i < s.rows * s.channels; ++i) {
    const int64_t n = i / s.channels, c = i % s.channels;
    const int64_t r = EmbeddingBlockRow(tokens[n], s.vocab_size, s.row_begin, s.block_rows);
    if (r == kRowNotInBlock) continue;
    out[i] =
        r == kRowInvalid ? NAN : WidenElement(static_cast<int>(dtype), block, r * s.channels + c);
  }
}

// ScatterRowsAddKernel's body: one "thread" per channel walking the tokens in order.
void EmulateScatterRowsAdd(int64_t C, int64_t V, int64_t num_slots,
                           const std::vector<int32_t>& tokens, const std::vector<int32_t>& slots,
                           const std::vector<float>& dout, std::vector<float>& rows) {
  for (int64_t c = 0; c < C; ++c) {
    for (size_t n = 0; n < tokens.size(); ++n) {
      bool invalid;
      const int32_t slot = TouchedSlot(slots.data(), V, num_slots, tokens[n], &invalid);
      if (slot < 0) continue;
      rows[slot * C + c] += dout[n * C + c];
    }
  }
}

TEST(VocabBlocksMathTest, EmbeddingBlocksMatchTheCpuKernelBitForBit) {
  TestRng rng(3);
  std::normal_distribution<float> normal;
  for (DType dtype : {DType::kF32, DType::kF16, DType::kBF16}) {
    for (const auto& [N, C, V, block_rows] : std::vector<std::array<int64_t, 4>>{
             {1, 1, 1, 1}, {7, 5, 13, 4}, {33, 17, 50, 50}, {64, 3, 1000, 333}}) {
      SCOPED_TRACE(::testing::Message() << DTypeName(dtype) << " N=" << N << " C=" << C
                                        << " V=" << V << " block_rows=" << block_rows);
      std::uniform_int_distribution<int32_t> token(0, static_cast<int32_t>(V - 1));
      std::vector<int32_t> tokens(N);
      for (auto& t : tokens) t = token(rng);
      std::vector<float> want(N * C, -7.0f), got(N * C, -7.0f);
      std::vector<float> wte(V * C);
      std::vector<uint16_t> wte16(V * C);
      for (int64_t i = 0; i < V * C; ++i) {
        wte[i] = normal(rng);
        wte16[i] = dtype == DType::kF16 ? FloatToHalfBits(wte[i]) : FloatToBFloat16Bits(wte[i]);
      }
      for (int64_t row_begin = 0; row_begin < V; row_begin += block_rows) {
        VocabBlockShape s{.rows = N,
                          .channels = C,
                          .vocab_size = V,
                          .row_begin = row_begin,
                          .block_rows = std::min(block_rows, V - row_begin)};
        if (dtype == DType::kF32) {
          const absl::Span<const float> block(wte.data() + row_begin * C, s.block_rows * C);
          ASSERT_OK(EmbeddingBlockForward<float>(s, tokens, block, absl::MakeSpan(want), nullptr));
          EmulateEmbeddingBlockForward(s, tokens, dtype, block.data(), got);
        } else {
          const uint16_t* block = wte16.data() + row_begin * C;
          ASSERT_OK(EmbeddingBlockForward(s, tokens, Block16{block, dtype}, absl::MakeSpan(want),
                                          nullptr));
          EmulateEmbeddingBlockForward(s, tokens, dtype, block, got);
        }
      }
      for (int64_t i = 0; i < N * C; ++i) ASSERT_EQ(Bits(got[i]), Bits(want[i])) << i;
    }
  }
}

TEST(VocabBlocksMathTest, ScatterRowsAddMatchesTheCpuKernelBitForBit) {
  TestRng rng(5);
  std::normal_distribution<float> normal;
  for (const auto& [N, C, V] :
       std::vector<std::array<int64_t, 3>>{{1, 1, 1}, {9, 7, 5}, {100, 65, 37}, {257, 130, 1000}}) {
    SCOPED_TRACE(::testing::Message() << "N=" << N << " C=" << C << " V=" << V);
    std::uniform_int_distribution<int32_t> token(0, static_cast<int32_t>(V - 1));
    std::vector<int32_t> tokens(N), slots(V, -1);
    int32_t num_slots = 0;
    // Tokens repeat (V small), and some are not touched-row tokens (slot -1).
    for (auto& t : tokens) {
      t = token(rng);
      if (slots[t] == -1 && t % 3 != 0) slots[t] = num_slots++;
    }
    num_slots = std::max(num_slots, 1);
    std::vector<float> dout(N * C);
    for (float& x : dout) x = normal(rng);
    std::vector<float> want(num_slots * C), got;
    for (float& x : want) x = normal(rng);
    got = want;
    ASSERT_OK(ScatterRowsAdd<float>(C, tokens, slots, dout, absl::MakeSpan(want), nullptr));
    EmulateScatterRowsAdd(C, V, num_slots, tokens, slots, dout, got);
    for (size_t i = 0; i < got.size(); ++i) ASSERT_EQ(Bits(got[i]), Bits(want[i])) << i;
  }
}

TEST(VocabBlocksMathTest, PositionEmbeddingBackwardOrderMatchesTheCpuKernelBitForBit) {
  TestRng rng(7);
  std::normal_distribution<float> normal;
  for (const auto& [B, T, C] :
       std::vector<std::array<int64_t, 3>>{{1, 1, 1}, {3, 5, 7}, {8, 33, 130}}) {
    std::vector<float> dout(B * T * C), want(T * C + 3 * C);
    for (float& x : dout) x = normal(rng) * 100.0f;
    for (float& x : want) x = normal(rng);
    std::vector<float> got = want;
    ASSERT_OK(PositionEmbeddingBackward<float>(B, T, C, dout, absl::MakeSpan(want), nullptr));
    // PositionEmbeddingBackwardKernel: one element per thread, b increasing.
    for (int64_t i = 0; i < T * C; ++i) {
      float acc = got[i];
      for (int64_t b = 0; b < B; ++b) acc += dout[b * T * C + i];
      got[i] = acc;
    }
    for (size_t i = 0; i < got.size(); ++i) ASSERT_EQ(Bits(got[i]), Bits(want[i])) << i;
  }
}

TEST(VocabBlocksMathTest, DeviceDataErrorsPoisonInsteadOfReadingOutOfBounds) {
  // Tokens outside [0, V): NaN rows, in every block's call.
  EXPECT_EQ(EmbeddingBlockRow(-1, 10, 0, 5), kRowInvalid);
  EXPECT_EQ(EmbeddingBlockRow(10, 10, 5, 5), kRowInvalid);
  EXPECT_EQ(EmbeddingBlockRow(7, 10, 0, 5), kRowNotInBlock);
  EXPECT_EQ(EmbeddingBlockRow(7, 10, 5, 5), 2);
  EXPECT_EQ(EmbeddingBlockRow(4, 10, 0, 5), 4);
  std::vector<int32_t> tokens = {3, 12, -5, 1};
  std::vector<float> block = {1, 2, 3, 4, 5, 6, 7, 8};  // 4 rows x 2 channels
  std::vector<float> out(8, -1.0f);
  EmulateEmbeddingBlockForward(
      {.rows = 4, .channels = 2, .vocab_size = 4, .row_begin = 0, .block_rows = 4}, tokens,
      DType::kF32, block.data(), out);
  EXPECT_EQ(out[0], 7.0f);
  EXPECT_EQ(out[1], 8.0f);
  EXPECT_TRUE(std::isnan(out[2]) && std::isnan(out[3]) && std::isnan(out[4]) && std::isnan(out[5]));
  EXPECT_EQ(out[6], 3.0f);
  // Slots: -1 is "not touched"; a slot >= num_slots or a row outside [0, V) is invalid.
  const std::vector<int32_t> slots = {0, -1, 5, 1};
  bool invalid = true;
  EXPECT_EQ(TouchedSlot(slots.data(), 4, 2, 0, &invalid), 0);
  EXPECT_FALSE(invalid);
  EXPECT_EQ(TouchedSlot(slots.data(), 4, 2, 1, &invalid), -1);
  EXPECT_FALSE(invalid);
  EXPECT_EQ(TouchedSlot(slots.data(), 4, 2, 2, &invalid), -1);
  EXPECT_TRUE(invalid);
  EXPECT_EQ(TouchedSlot(slots.data(), 4, 2, 4, &invalid), -1);
  EXPECT_TRUE(invalid);
  EXPECT_EQ(TouchedSlot(slots.data(), 4, 2, -1, &invalid), -1);
  EXPECT_TRUE(invalid);
}

TEST(VocabBlocksMathTest, WidenAndStoreAreMemoryConvertsRounding) {
  TestRng rng(11);
  std::normal_distribution<float> normal;
  for (int i = 0; i < 10000; ++i) {
    const float x = normal(rng) * std::ldexp(1.0f, i % 40 - 20);
    float f32 = 0;
    uint16_t h = 0, b = 0;
    StoreElement(0, &f32, 0, x);
    StoreElement(1, &h, 0, x);
    StoreElement(2, &b, 0, x);
    ASSERT_EQ(Bits(f32), Bits(x));
    ASSERT_EQ(h, FloatToHalfBits(x));
    ASSERT_EQ(b, FloatToBFloat16Bits(x));
    ASSERT_EQ(Bits(WidenElement(1, &h, 0)), Bits(HalfBitsToFloat(h)));
    ASSERT_EQ(Bits(WidenElement(2, &b, 0)), Bits(BFloat16BitsToFloat(b)));
  }
  float nan_out = 0;
  uint16_t nan16 = 0;
  StoreElement(0, &nan_out, 0, NAN);
  StoreElement(2, &nan16, 0, NAN);
  EXPECT_TRUE(std::isnan(nan_out));
  EXPECT_TRUE(std::isnan(BFloat16BitsToFloat(nan16)));
}

}  // namespace
}  // namespace ps::cuda
