// Tokenizes a text file into llm.c token files (trainer/data/token_file.h) for the trainer.
//
//   bazel run //tools:text_to_bin -- --input=a.txt --output=a.bin
//   bazel run //tools:text_to_bin -- --input=a.txt --output=train.bin
//       --val_output=val.bin --val_fraction=0.1 --vocab=vocab.json --merges=merges.txt
//
// Without --vocab/--merges every byte is one token (vocabulary 256); with them, GPT-2's byte-level
// BPE (trainer/data/tokenizer.h). With --val_output the last --val_fraction of the tokens go to the
// validation file and the rest to --output. Relative paths are relative to the directory `bazel
// run` was started from. The whole input is held in memory.
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
#include <sstream>
#include <string>
#include <vector>

#include "absl/flags/flag.h"
#include "absl/flags/parse.h"
#include "absl/flags/usage.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/types/span.h"
#include "base/status_macros.h"
#include "trainer/data/token_file.h"
#include "trainer/data/tokenizer.h"

ABSL_FLAG(std::string, input, "", "text file to tokenize (required)");
ABSL_FLAG(std::string, output, "",
          "token file to write (required): all tokens, or the train split");
ABSL_FLAG(std::string, val_output, "", "if set, token file for the validation split");
ABSL_FLAG(double, val_fraction, 0.1,
          "with --val_output: the fraction of tokens, taken from the end, that go to validation");
ABSL_FLAG(std::string, vocab, "", "GPT-2 vocab.json (with --merges: BPE; without: byte-level)");
ABSL_FLAG(std::string, merges, "", "GPT-2 merges.txt (with --vocab)");

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
  const std::string vocab = ResolvePath(absl::GetFlag(FLAGS_vocab));
  const std::string merges = ResolvePath(absl::GetFlag(FLAGS_merges));
  const double val_fraction = absl::GetFlag(FLAGS_val_fraction);
  if (input.empty()) return absl::InvalidArgumentError("--input is required");
  if (output.empty()) return absl::InvalidArgumentError("--output is required");
  if (vocab.empty() != merges.empty()) {
    return absl::InvalidArgumentError(
        "--vocab and --merges go together (GPT-2 BPE); give both, or neither for bytes");
  }
  if (!val_output.empty() && !(val_fraction > 0 && val_fraction < 1)) {
    return absl::InvalidArgumentError(
        absl::StrCat("--val_fraction=", val_fraction, " must be in (0, 1)"));
  }
  if (!val_output.empty() && val_output == output) {
    return absl::InvalidArgumentError("--val_output must differ from --output");
  }

  std::unique_ptr<Tokenizer> tokenizer;
  if (vocab.empty()) {
    tokenizer = std::make_unique<ByteTokenizer>();
  } else {
    ASSIGN_OR_RETURN(tokenizer, Gpt2BpeTokenizer::Load(vocab, merges));
  }
  ASSIGN_OR_RETURN(const std::string text, ReadInput(input));

  const auto start = std::chrono::steady_clock::now();
  std::vector<uint16_t> tokens;
  tokenizer->Encode(text, &tokens);
  const double seconds =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  const auto n = static_cast<int64_t>(tokens.size());
  std::cout << absl::StrFormat(
      "%s tokenizer (vocabulary %d): %d bytes -> %d tokens in %.3f s (%.3g tokens/s, %.3g MB/s "
      "of text)\n",
      tokenizer->name(), tokenizer->vocab_size(), text.size(), n, seconds,
      seconds > 0 ? n / seconds : 0.0, seconds > 0 ? text.size() / seconds / 1e6 : 0.0);

  absl::Span<const uint16_t> train = tokens;
  if (!val_output.empty()) {
    const auto val_count = static_cast<int64_t>(std::llround(val_fraction * n));
    if (val_count < 1 || val_count >= n) {
      return absl::InvalidArgumentError(absl::StrCat(
          "--val_fraction=", val_fraction, " of ", n, " tokens leaves ", val_count,
          " validation and ", n - val_count, " training tokens; both splits need at least one"));
    }
    train = train.first(static_cast<size_t>(n - val_count));
    const absl::Span<const uint16_t> val = absl::MakeConstSpan(tokens).last(val_count);
    RETURN_IF_ERROR(WriteTokenFile(val_output, val));
    std::cout << absl::StrFormat("wrote %s: %d validation tokens\n", val_output, val.size());
  }
  RETURN_IF_ERROR(WriteTokenFile(output, train));
  std::cout << absl::StrFormat("wrote %s: %d%s tokens\n", output, train.size(),
                               val_output.empty() ? "" : " training");
  return absl::OkStatus();
}

}  // namespace
}  // namespace ps

int main(int argc, char** argv) {
  absl::SetProgramUsageMessage(
      "Tokenizes a text file into llm.c .bin token files: bytes by default, GPT-2 BPE with "
      "--vocab and --merges.\n"
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
