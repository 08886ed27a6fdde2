#include "trainer/data/load_tokenizer.h"

#include <cerrno>
#include <fstream>
#include <memory>
#include <sstream>
#include <string>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "base/status_macros.h"
#include "trainer/data/sentencepiece_tokenizer.h"
#include "trainer/data/tokenizer.h"

namespace ps {

absl::StatusOr<std::unique_ptr<Tokenizer>> LoadTokenizer(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) {
    const int err = errno;
    return absl::ErrnoToStatus(err, absl::StrCat("cannot open tokenizer file '", path, "'"));
  }
  std::ostringstream buffer;
  buffer << in.rdbuf();
  if (in.bad()) return absl::DataLossError(absl::StrCat("cannot read tokenizer file '", path, "'"));
  const std::string contents = std::move(buffer).str();
  const std::string name = absl::StrCat("'", path, "'");
  const size_t first = contents.find_first_not_of(" \t\r\n");
  if (first != std::string::npos && contents[first] == '{') {
    ASSIGN_OR_RETURN(std::unique_ptr<BpeTokenizer> tok,
                     BpeTokenizer::FromTokenizerJson(contents, name));
    return std::unique_ptr<Tokenizer>(std::move(tok));
  }
  absl::StatusOr<std::unique_ptr<SentencePieceTokenizer>> sp =
      SentencePieceTokenizer::FromContents(contents, name);
  if (!sp.ok()) {
    return absl::InvalidArgumentError(absl::StrCat(
        "tokenizer file ", name,
        " is neither a Hugging Face tokenizer.json (a JSON object) nor a SentencePiece "
        "tokenizer.model: ",
        sp.status().message()));
  }
  return std::unique_ptr<Tokenizer>(std::move(*sp));
}

}  // namespace ps
