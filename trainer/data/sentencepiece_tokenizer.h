// SentencePiece tokenizers (`tokenizer.model`: Llama-2, Mistral, ...) through Debian's
// libsentencepiece (0.1.97), the library Google's Python `sentencepiece` package wraps.
//
// Encoding is the library's `Encode(text)` — the model's own normalizer, dummy prefix, BPE or
// unigram, and byte fallback (<0xXX> pieces for characters outside the vocabulary, as Llama-2's
// model has) — without BOS/EOS: those are the document token's business (text_to_bin). Bytes that
// are not well-formed UTF-8 are handled as the library handles them.
// The document token (llm.c's convention of one token in front of every document) is the model's
// BOS (<s>, id 1 for Llama-2), if it has one.
//
// Errors when loading: NotFound for a missing file; InvalidArgument for a file the library cannot
// parse as a ModelProto, naming the file and the library's message.
// Thread safety: const methods and Encode() may be called concurrently (the library's processor is
// immutable after loading).
#ifndef PATRICKSTAR_TRAINER_DATA_SENTENCEPIECE_TOKENIZER_H_
#define PATRICKSTAR_TRAINER_DATA_SENTENCEPIECE_TOKENIZER_H_

#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "absl/types/span.h"
#include "trainer/data/internal/sentencepiece_shim.h"
#include "trainer/data/tokenizer.h"

namespace ps {

class SentencePieceTokenizer final : public Tokenizer {
 public:
  [[nodiscard]] static absl::StatusOr<std::unique_ptr<SentencePieceTokenizer>> Load(
      const std::string& path);
  // The same from the file's bytes; `name` appears in error messages.
  [[nodiscard]] static absl::StatusOr<std::unique_ptr<SentencePieceTokenizer>> FromContents(
      absl::string_view model_proto, absl::string_view name = "tokenizer.model");
  ~SentencePieceTokenizer() override;

  std::string name() const override;
  // The number of pieces (32000 for Llama-2).
  int64_t vocab_size() const override;
  absl::Status Encode(absl::string_view text, std::vector<uint32_t>* out) override;
  absl::StatusOr<std::string> Decode(absl::Span<const uint32_t> tokens) const override;
  // The id of the piece spelled `token` ("▁the", "<s>", "<0x0A>").
  std::optional<uint32_t> TokenId(absl::string_view token) const override;
  std::optional<uint32_t> document_token() const override;

 private:
  SentencePieceTokenizer();
  std::unique_ptr<data_internal::SentencePieceShim> processor_;
  bool byte_fallback_ = false;  // has the <0x00>..<0xFF> byte pieces
};

}  // namespace ps

#endif  // PATRICKSTAR_TRAINER_DATA_SENTENCEPIECE_TOKENIZER_H_
