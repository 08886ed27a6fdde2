// Checks shared by the two batch loaders (DataLoader over token streams, PackedLoader over
// examples): their common options, and the scan for the first token outside the vocabulary.
#ifndef PATRICKSTAR_TRAINER_DATA_INTERNAL_LOADER_CHECKS_H_
#define PATRICKSTAR_TRAINER_DATA_INTERNAL_LOADER_CHECKS_H_

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <limits>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/string_view.h"
#include "absl/types/span.h"
#include "trainer/data/token_span.h"

namespace ps {
namespace data_internal {

// The options both loaders have. seq_len_is_int32: seq_len must also fit an int32 (PackedLoader's
// positions are int32); otherwise only >= 1 is required.
struct LoaderShape {
  int64_t batch_size = 0;
  int64_t seq_len = 0;
  int64_t vocab_size = 0;
  int rank = 0;
  int world_size = 0;
  bool seq_len_is_int32 = false;
};

// InvalidArgument naming `options_name`.field (e.g. "DataLoaderOptions.batch_size = 0 must be >=
// 1"), or the 64-bit overflow of batch_size * seq_len * world_size.
inline absl::Status CheckLoaderShape(absl::string_view options_name, const LoaderShape& o) {
  const auto bad = [&](absl::string_view field, absl::string_view problem) {
    return absl::InvalidArgumentError(absl::StrCat(options_name, ".", field, " ", problem));
  };
  constexpr int64_t kMaxInt32 = std::numeric_limits<int32_t>::max();
  if (o.batch_size < 1) return bad("batch_size", absl::StrCat("= ", o.batch_size, " must be >= 1"));
  if (o.seq_len_is_int32 && (o.seq_len < 1 || o.seq_len > kMaxInt32)) {
    return bad("seq_len", absl::StrCat("= ", o.seq_len, " must be in [1, ", kMaxInt32,
                                       "] (positions are int32)"));
  }
  if (o.seq_len < 1) return bad("seq_len", absl::StrCat("= ", o.seq_len, " must be >= 1"));
  if (o.vocab_size < 1 || o.vocab_size > kMaxInt32) {
    return bad("vocab_size", absl::StrCat("= ", o.vocab_size, " must be in [1, ", kMaxInt32,
                                          "] (batches hold int32 tokens)"));
  }
  if (o.world_size < 1) return bad("world_size", absl::StrCat("= ", o.world_size, " must be >= 1"));
  if (o.rank < 0 || o.rank >= o.world_size) {
    return bad("rank",
               absl::StrCat("= ", o.rank, " must be in [0, world_size = ", o.world_size, ")"));
  }
  constexpr int64_t kMax = std::numeric_limits<int64_t>::max();
  if (o.batch_size > kMax / o.seq_len / o.world_size) {
    return absl::InvalidArgumentError(
        absl::StrCat(options_name, ": batch_size * seq_len * world_size = ", o.batch_size, " * ",
                     o.seq_len, " * ", o.world_size, " overflows 64 bits"));
  }
  return absl::OkStatus();
}

// The position of the first token >= limit, or tokens.size() if none: a branch-free max per block
// (vectorized by the compiler), then the exact position only in the block that fails.
template <typename T>
int64_t FirstTokenAtLeast(absl::Span<const T> tokens, int64_t limit) {
  constexpr size_t kBlock = 4096;
  for (size_t start = 0; start < tokens.size(); start += kBlock) {
    const size_t end = std::min(tokens.size(), start + kBlock);
    T max = 0;
    for (size_t i = start; i < end; ++i) max = tokens[i] > max ? tokens[i] : max;
    if (static_cast<int64_t>(max) >= limit) {
      for (size_t i = start;; ++i) {
        if (static_cast<int64_t>(tokens[i]) >= limit) return static_cast<int64_t>(i);
      }
    }
  }
  return static_cast<int64_t>(tokens.size());
}
inline int64_t FirstTokenAtLeast(TokenSpan tokens, int64_t limit) {
  return tokens.width_bytes() == 2 ? FirstTokenAtLeast(tokens.u16(), limit)
                                   : FirstTokenAtLeast(tokens.u32(), limit);
}

}  // namespace data_internal
}  // namespace ps

#endif  // PATRICKSTAR_TRAINER_DATA_INTERNAL_LOADER_CHECKS_H_
