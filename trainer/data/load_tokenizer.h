// LoadTokenizer: a tokenizer from a file, its kind detected from the content.
//
//   - a JSON object (first non-blank byte '{'): a Hugging Face tokenizer.json (BpeTokenizer);
//   - anything else: a SentencePiece tokenizer.model (a ModelProto; SentencePieceTokenizer).
//
// Errors: NotFound for a missing file; InvalidArgument naming the file (and the key, for
// tokenizer.json) for a file of neither kind or one that is malformed or uses an unsupported
// feature (see tokenizer.h and sentencepiece_tokenizer.h).
#ifndef PATRICKSTAR_TRAINER_DATA_LOAD_TOKENIZER_H_
#define PATRICKSTAR_TRAINER_DATA_LOAD_TOKENIZER_H_

#include <memory>
#include <string>

#include "absl/status/statusor.h"
#include "trainer/data/tokenizer.h"

namespace ps {

[[nodiscard]] absl::StatusOr<std::unique_ptr<Tokenizer>> LoadTokenizer(const std::string& path);

}  // namespace ps

#endif  // PATRICKSTAR_TRAINER_DATA_LOAD_TOKENIZER_H_
