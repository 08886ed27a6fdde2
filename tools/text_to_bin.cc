// Tokenizes a text file into llm.c token files (trainer/data/token_file.h) for the trainer.
//
//   bazel run //tools:text_to_bin -- --input=a.txt --output=a.bin
//   bazel run //tools:text_to_bin -- --input=a.txt --output=train.bin
//       --val_output=val.bin --val_fraction=0.1 --tokenizer=tokenizer.json
//
// Tokenizers: --tokenizer=PATH, a Hugging Face tokenizer.json (byte-level BPE: GPT-2, Llama-3,
// Qwen2) or a SentencePiece tokenizer.model (Llama-2), told apart by content
// (trainer/data/load_tokenizer.h); --vocab/--merges, GPT-2's files; neither: every byte is one
// token (vocabulary 256).
//
// Documents: --split_documents=SEP (C escapes allowed, e.g. '\n\n' or '<|endoftext|>') cuts the
// input into documents at SEP (SEP is dropped, empty documents skipped); without it the input is
// one document. As llm.c's data scripts do, --document_token (default "auto": Llama-3's
// <|begin_of_text|>, GPT-2's and Qwen2's <|endoftext|>, SentencePiece's BOS <s>; none for bytes)
// is put in front of every document; "none" puts nothing, any other value names a token.
// Special tokens written in the text are ordinary text unless --parse_special_tokens.
//
// Output: uint16 token files (magic 20240520, version 1) for vocabularies up to 65,536, else uint32
// (llm.c's Llama-3 format: magic 20240801, version 7). With --val_output the last --val_fraction
// of the tokens go to the validation file and the rest to --output. Relative paths are relative to
// the directory `bazel run` was started from. The whole input is held in memory.
//
// Exit status 0 with a summary (token counts, tokens/s) on stdout; 1 with an explanation on stderr.
#include <cerrno>
#include <chrono>
#include <cmath>
#include <cstdint>
#include <cstdlib>
#include <fstream>
#include <iostream>
#include <memory>
#include <optional>
#include <sstream>
#include <string>
#include <vector>

#include "absl/flags/flag.h"
#include "absl/flags/parse.h"
#include "absl/flags/usage.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/escaping.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_split.h"
#include "absl/types/span.h"
#include "base/status_macros.h"
#include "trainer/data/load_tokenizer.h"
#include "trainer/data/token_file.h"
#include "trainer/data/tokenizer.h"

ABSL_FLAG(std::string, input, "", "text file to tokenize (required)");
ABSL_FLAG(std::string, output, "",
          "token file to write (required): all tokens, or the train split");
ABSL_FLAG(std::string, val_output, "", "if set, token file for the validation split");
ABSL_FLAG(double, val_fraction, 0.1,
          "with --val_output: the fraction of tokens, taken from the end, that go to validation");
ABSL_FLAG(std::string, tokenizer, "",
          "Hugging Face tokenizer.json or SentencePiece tokenizer.model (detected by content)");
ABSL_FLAG(std::string, vocab, "", "GPT-2 vocab.json (with --merges: BPE; without: byte-level)");
ABSL_FLAG(std::string, merges, "", "GPT-2 merges.txt (with --vocab)");
ABSL_FLAG(std::string, split_documents, "",
          "separator between documents in the input (C escapes allowed, e.g. '\\n\\n'); empty: "
          "the input is one document");
ABSL_FLAG(std::string, document_token, "auto",
          "token put in front of every document: auto (the tokenizer's BOS or <|endoftext|>, as "
          "llm.c), none, or a token as the vocabulary spells it");
ABSL_FLAG(bool, parse_special_tokens, false,
          "tokenizer.json: recognize special tokens written in the text (default: ordinary text)");

namespace ps {
namespace {

// `bazel run` executes in the runfiles tree; resolve relative paths against the caller's
// directory.
std::string ResolvePath(const std::string& path) {
  if (path.empty() || path[0] == '/') return path;
  const char* dir = std::getenv("BUILD_WORKING_DIRECTORY");
  return dir != nullptr ? absl::StrCat(dir, "/", path) : path;
}

absl::StatusOr<std::string> ReadInput(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) {
    return absl::ErrnoToStatus(errno, absl::StrCat("cannot open input '", path, "'"));
  }
  std::ostringstream buffer;
  buffer << in.rdbuf();
  if (in.bad()) return absl::DataLossError(absl::StrCat("cannot read input '", path, "'"));
  return std::move(buffer).str();
}

absl::Status Run() {
  const std::string input = ResolvePath(absl::GetFlag(FLAGS_input));
  const std::string output = ResolvePath(absl::GetFlag(FLAGS_output));
  const std::string val_output = ResolvePath(absl::GetFlag(FLAGS_val_output));
  const std::string tokenizer_path = ResolvePath(absl::GetFlag(FLAGS_tokenizer));
  const std::string vocab = ResolvePath(absl::GetFlag(FLAGS_vocab));
  const std::string merges = ResolvePath(absl::GetFlag(FLAGS_merges));
  const std::string document_token = absl::GetFlag(FLAGS_document_token);
  const bool parse_special = absl::GetFlag(FLAGS_parse_special_tokens);
  const double val_fraction = absl::GetFlag(FLAGS_val_fraction);
  if (input.empty()) return absl::InvalidArgumentError("--input is required");
  if (output.empty()) return absl::InvalidArgumentError("--output is required");
  if (vocab.empty() != merges.empty()) {
    return absl::InvalidArgumentError(
        "--vocab and --merges go together (GPT-2 BPE); give both, or neither for bytes");
  }
  if (!tokenizer_path.empty() && !vocab.empty()) {
    return absl::InvalidArgumentError(
        "--tokenizer and --vocab/--merges are two ways to name a tokenizer; give one");
  }
  std::string separator;
  if (std::string error;
      !absl::CUnescape(absl::GetFlag(FLAGS_split_documents), &separator, &error)) {
    return absl::InvalidArgumentError(absl::StrCat("--split_documents: ", error));
  }
  if (!val_output.empty() && !(val_fraction > 0 && val_fraction < 1)) {
    return absl::InvalidArgumentError(
        absl::StrCat("--val_fraction=", val_fraction, " must be in (0, 1)"));
  }
  if (!val_output.empty() && val_output == output) {
    return absl::InvalidArgumentError("--val_output must differ from --output");
  }

  std::unique_ptr<Tokenizer> tokenizer;
  if (!tokenizer_path.empty()) {
    ASSIGN_OR_RETURN(tokenizer, LoadTokenizer(tokenizer_path));
  } else if (!vocab.empty()) {
    ASSIGN_OR_RETURN(tokenizer, BpeTokenizer::LoadGpt2(vocab, merges));
  } else {
    tokenizer = std::make_unique<ByteTokenizer>();
  }
  if (parse_special) {
    auto* bpe = dynamic_cast<BpeTokenizer*>(tokenizer.get());
    if (bpe == nullptr) {
      return absl::InvalidArgumentError(absl::StrCat(
          "--parse_special_tokens applies to tokenizer.json and GPT-2 files, not to the ",
          tokenizer->name(), " tokenizer"));
    }
    bpe->set_parse_special_tokens(true);
  }
  std::optional<uint32_t> doc_token;
  if (document_token == "auto") {
    doc_token = tokenizer->document_token();
  } else if (document_token != "none") {
    doc_token = tokenizer->TokenId(document_token);
    if (!doc_token.has_value()) {
      return absl::InvalidArgumentError(
          absl::StrCat("--document_token='", document_token, "' is not a token of the ",
                       tokenizer->name(), " tokenizer (use auto, none or a vocabulary entry)"));
    }
  }
  ASSIGN_OR_RETURN(const std::string text, ReadInput(input));

  const auto start = std::chrono::steady_clock::now();
  std::vector<uint32_t> tokens;
  std::vector<absl::string_view> documents;
  if (separator.empty()) {
    documents.push_back(text);
  } else {
    documents = absl::StrSplit(text, separator, absl::SkipEmpty());
  }
  for (const absl::string_view doc : documents) {
    if (doc_token.has_value()) tokens.push_back(*doc_token);
    RETURN_IF_ERROR(tokenizer->Encode(doc, &tokens));
  }
  const double seconds =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  const auto n = static_cast<int64_t>(tokens.size());
  const bool wide = tokenizer->vocab_size() > 65536;
  std::cout << absl::StrFormat(
      "%s tokenizer (vocabulary %d): %d bytes, %d documents -> %d tokens in %.3f s (%.3g "
      "tokens/s, %.3g MB/s of text)\n",
      tokenizer->name(), tokenizer->vocab_size(), text.size(), documents.size(), n, seconds,
      seconds > 0 ? n / seconds : 0.0, seconds > 0 ? text.size() / seconds / 1e6 : 0.0);
  if (doc_token.has_value()) {
    std::cout << absl::StrFormat("document token %d in front of each document\n", *doc_token);
  }

  // Writes tokens [begin, end) in the file's token width.
  auto write = [&](const std::string& path, size_t begin, size_t end) -> absl::Status {
    const absl::Span<const uint32_t> part = absl::MakeConstSpan(tokens).subspan(begin, end - begin);
    if (wide) return WriteTokenFile(path, part);
    const std::vector<uint16_t> narrow(part.begin(), part.end());  // every id < 65536
    return WriteTokenFile(path, narrow);
  };
  const absl::string_view format =
      wide ? "uint32 tokens, magic 20240801 version 7" : "uint16 tokens, magic 20240520 version 1";
  size_t train_end = tokens.size();
  if (!val_output.empty()) {
    const auto val_count = static_cast<int64_t>(std::llround(val_fraction * n));
    if (val_count < 1 || val_count >= n) {
      return absl::InvalidArgumentError(absl::StrCat(
          "--val_fraction=", val_fraction, " of ", n, " tokens leaves ", val_count,
          " validation and ", n - val_count, " training tokens; both splits need at least one"));
    }
    train_end = static_cast<size_t>(n - val_count);
    RETURN_IF_ERROR(write(val_output, train_end, tokens.size()));
    std::cout << absl::StrFormat("wrote %s: %d validation tokens (%s)\n", val_output, val_count,
                                 format);
  }
  RETURN_IF_ERROR(write(output, 0, train_end));
  std::cout << absl::StrFormat("wrote %s: %d%s tokens (%s)\n", output, train_end,
                               val_output.empty() ? "" : " training", format);
  return absl::OkStatus();
}

}  // namespace
}  // namespace ps

int main(int argc, char** argv) {
  absl::SetProgramUsageMessage(
      "Tokenizes a text file into llm.c .bin token files: bytes by default, a Hugging Face "
      "tokenizer.json or SentencePiece tokenizer.model with --tokenizer, GPT-2 BPE with --vocab "
      "and --merges.\n"
      "Example: text_to_bin --input=a.txt --output=train.bin --val_output=val.bin "
      "--val_fraction=0.1");
  absl::ParseCommandLine(argc, argv);
  const absl::Status status = ps::Run();
  if (!status.ok()) {
    std::cerr << "text_to_bin: " << status.message() << "\n";
    return 1;
  }
  return 0;
}
