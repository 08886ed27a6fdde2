// TokenSpan: a read-only view of token ids stored as uint16 (llm.c's GPT-2 token files) or uint32
// (its Llama-3 token files, for vocabularies above 65,536).
//
// Ownership: does not own the tokens; they must outlive the view.
// Thread safety: a value type; const methods may be called concurrently.
#ifndef PATRICKSTAR_TRAINER_DATA_TOKEN_SPAN_H_
#define PATRICKSTAR_TRAINER_DATA_TOKEN_SPAN_H_

#include <cstddef>
#include <cstdint>
#include <vector>

#include "absl/types/span.h"

namespace ps {

class TokenSpan {
 public:
  TokenSpan() = default;
  // Implicit: a TokenSpan stands wherever a span of either width is given.
  TokenSpan(absl::Span<const uint16_t> tokens)  // NOLINT(google-explicit-constructor)
      : data_(tokens.data()), size_(tokens.size()), width_bytes_(2) {}
  TokenSpan(absl::Span<const uint32_t> tokens)  // NOLINT(google-explicit-constructor)
      : data_(tokens.data()), size_(tokens.size()), width_bytes_(4) {}
  TokenSpan(const std::vector<uint16_t>& tokens)  // NOLINT(google-explicit-constructor)
      : TokenSpan(absl::MakeConstSpan(tokens)) {}
  TokenSpan(const std::vector<uint32_t>& tokens)  // NOLINT(google-explicit-constructor)
      : TokenSpan(absl::MakeConstSpan(tokens)) {}

  size_t size() const { return size_; }
  bool empty() const { return size_ == 0; }
  // 2 (uint16) or 4 (uint32).
  int width_bytes() const { return width_bytes_; }
  // Token i. REQUIRES: i < size().
  uint32_t operator[](size_t i) const {
    return width_bytes_ == 2 ? static_cast<const uint16_t*>(data_)[i]
                             : static_cast<const uint32_t*>(data_)[i];
  }
  // The tokens as stored. REQUIRES: width_bytes() is 2 (resp. 4).
  absl::Span<const uint16_t> u16() const {
    return absl::MakeConstSpan(static_cast<const uint16_t*>(data_), size_);
  }
  absl::Span<const uint32_t> u32() const {
    return absl::MakeConstSpan(static_cast<const uint32_t*>(data_), size_);
  }

 private:
  const void* data_ = nullptr;
  size_t size_ = 0;
  int width_bytes_ = 2;
};

}  // namespace ps

#endif  // PATRICKSTAR_TRAINER_DATA_TOKEN_SPAN_H_
