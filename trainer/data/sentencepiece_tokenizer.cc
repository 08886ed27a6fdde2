#include "trainer/data/sentencepiece_tokenizer.h"

#include <cerrno>
#include <fstream>
#include <sstream>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "base/status_macros.h"

namespace ps {

SentencePieceTokenizer::SentencePieceTokenizer()
    : processor_(std::make_unique<data_internal::SentencePieceShim>()) {}

SentencePieceTokenizer::~SentencePieceTokenizer() = default;

absl::StatusOr<std::unique_ptr<SentencePieceTokenizer>> SentencePieceTokenizer::Load(
    const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) {
    const int err = errno;
    return absl::ErrnoToStatus(err, absl::StrCat("cannot open tokenizer file '", path, "'"));
  }
  std::ostringstream buffer;
  buffer << in.rdbuf();
  if (in.bad()) return absl::DataLossError(absl::StrCat("cannot read tokenizer file '", path, "'"));
  return FromContents(buffer.str(), absl::StrCat("'", path, "'"));
}

absl::StatusOr<std::unique_ptr<SentencePieceTokenizer>> SentencePieceTokenizer::FromContents(
    absl::string_view model_proto, absl::string_view name) {
  std::unique_ptr<SentencePieceTokenizer> tok(new SentencePieceTokenizer());
  if (model_proto.empty()) {
    return absl::InvalidArgumentError(
        absl::StrCat("SentencePiece model ", name, ": the file is empty"));
  }
  const std::string error = tok->processor_->LoadFromSerializedProto(
      std::string_view(model_proto.data(), model_proto.size()));
  if (!error.empty()) {
    return absl::InvalidArgumentError(absl::StrCat(
        "SentencePiece model ", name, ": not a valid ModelProto (the library says: ", error, ")"));
  }
  if (tok->processor_->PieceSize() <= 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("SentencePiece model ", name, ": pieces: the model has no pieces"));
  }
  const int byte_zero = tok->processor_->PieceToId("<0x00>");
  tok->byte_fallback_ = byte_zero >= 0 && tok->processor_->IsByte(byte_zero);
  return tok;
}

std::string SentencePieceTokenizer::name() const {
  return absl::StrCat("sentencepiece (", vocab_size(), " pieces",
                      byte_fallback_ ? ", byte fallback" : "", ")");
}

int64_t SentencePieceTokenizer::vocab_size() const { return processor_->PieceSize(); }

absl::Status SentencePieceTokenizer::Encode(absl::string_view text, std::vector<uint32_t>* out) {
  std::vector<int> ids;
  const std::string error = processor_->Encode(std::string_view(text.data(), text.size()), &ids);
  if (!error.empty()) {
    return absl::InternalError(absl::StrCat("SentencePiece could not encode the text: ", error));
  }
  out->reserve(out->size() + ids.size());
  for (const int id : ids) out->push_back(static_cast<uint32_t>(id));
  return absl::OkStatus();
}

absl::StatusOr<std::string> SentencePieceTokenizer::Decode(
    absl::Span<const uint32_t> tokens) const {
  std::vector<int> ids;
  ids.reserve(tokens.size());
  const int64_t size = vocab_size();
  for (size_t i = 0; i < tokens.size(); ++i) {
    if (tokens[i] >= size) {
      return absl::InvalidArgumentError(absl::StrCat("token ", tokens[i], " at position ", i,
                                                     " is not in the vocabulary of ", size));
    }
    ids.push_back(static_cast<int>(tokens[i]));
  }
  std::string text;
  const std::string error = processor_->Decode(ids, &text);
  if (!error.empty()) {
    return absl::InvalidArgumentError(absl::StrCat("SentencePiece could not decode: ", error));
  }
  return text;
}

std::optional<uint32_t> SentencePieceTokenizer::TokenId(absl::string_view token) const {
  const int id = processor_->PieceToId(std::string_view(token.data(), token.size()));
  if (id < 0 || processor_->IdToPiece(id) != token) return std::nullopt;  // unknown -> unk id
  return static_cast<uint32_t>(id);
}

std::optional<uint32_t> SentencePieceTokenizer::document_token() const {
  const int bos = processor_->bos_id();
  if (bos < 0) return std::nullopt;
  return static_cast<uint32_t>(bos);
}

}  // namespace ps
