// Prepares a fine-tuning example file (trainer/data/example_file.h) from JSON Lines, for the
// trainer's --train_data / --val_data (docs/chat_data.md):
//
//   bazel run //tools:prepare_data -- --input=chat.jsonl --tokenizer=MODEL_DIR --output=train.bin
//       [--chat_template=NAME] [--train_on=all_assistant|last_assistant] [--train_on_prompt]
//       [--print_examples=N] [--skip_bad_lines] [--chat_date="26 Jul 2024"]
//
// MODEL_DIR: a Hugging Face model or tokenizer directory. The tokenizer is tokenizer.json (byte-
// level BPE: GPT-2, Llama-3, Qwen2/2.5/3), else tokenizer.model (SentencePiece). The chat template
// is chat_template.jinja if present, else tokenizer_config.json's "chat_template", recognized as
// one of the known families (trainer/data/chat_template.h); --chat_template=NAME overrides it.
// bos_token/eos_token come from tokenizer_config.json when it names them.
//
// Each line is one example (trainer/data/conversation.h). A bad line stops the run with
// FILE:LINE and the reason, nothing written; with --skip_bad_lines it is skipped and counted by
// reason in the summary. Long examples are kept whole: the trainer truncates them to its seq_len
// (and counts them); the summary gives the length distribution.
//
// Exit status 0 with a summary on stdout (after any --print_examples lines); 1 with an
// explanation on stderr.
#include <algorithm>
#include <cstdint>
#include <cstdlib>
#include <fstream>
#include <iostream>
#include <map>
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
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "base/flag_presence.h"
#include "base/status_macros.h"
#include "nlohmann/json.hpp"
#include "trainer/data/chat_template.h"
#include "trainer/data/conversation.h"
#include "trainer/data/example_file.h"
#include "trainer/data/load_tokenizer.h"
#include "trainer/data/tokenizer.h"

ABSL_FLAG(std::string, input, "", "JSON Lines file of examples (required)");
ABSL_FLAG(std::string, tokenizer, "",
          "Hugging Face model or tokenizer directory: tokenizer.json or tokenizer.model, "
          "tokenizer_config.json with its chat_template (required)");
ABSL_FLAG(std::string, output, "", "example file to write (required)");
ABSL_FLAG(std::string, chat_template, "",
          "chat template family overriding the directory's: llama3, qwen2, qwen2.5, qwen3, "
          "mistral, gpt2");
ABSL_FLAG(std::string, train_on, "all_assistant",
          "which assistant messages are trained: all_assistant or last_assistant");
ABSL_FLAG(bool, train_on_prompt, false,
          "train every token (prompts and scaffolding too), not only the answers");
ABSL_FLAG(int64_t, print_examples, 0,
          "print the first N examples as JSON lines {\"input_ids\", \"labels\"} (labels -100 where "
          "not trained)");
ABSL_FLAG(bool, skip_bad_lines, false,
          "skip lines that cannot be used (counted by reason) instead of stopping");
ABSL_FLAG(std::string, chat_date, "26 Jul 2024",
          "llama3 only: the 'Today Date' of the system header");

namespace ps {
namespace {

using Json = nlohmann::json;

absl::StatusOr<std::string> ReadFile(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) return absl::NotFoundError(absl::StrCat("cannot open '", path, "'"));
  std::ostringstream buffer;
  buffer << in.rdbuf();
  if (in.bad()) return absl::DataLossError(absl::StrCat("cannot read '", path, "'"));
  return std::move(buffer).str();
}

bool Exists(const std::string& path) { return std::ifstream(path).good(); }

// Relative paths are relative to the directory `bazel run` was started from.
std::string UserPath(const std::string& path) {
  const char* dir = std::getenv("BUILD_WORKING_DIRECTORY");
  return dir != nullptr && !path.empty() && path[0] != '/' ? absl::StrCat(dir, "/", path) : path;
}

// A special token from tokenizer_config.json: a string or {"content": string}; "" if absent.
std::string ConfigToken(const Json& config, const char* key) {
  const auto it = config.find(key);
  if (it == config.end()) return "";
  if (it->is_string()) return it->get<std::string>();
  if (it->is_object() && it->contains("content") && (*it)["content"].is_string()) {
    return (*it)["content"].get<std::string>();
  }
  return "";
}

struct Directory {
  std::unique_ptr<Tokenizer> tokenizer;
  std::optional<ChatFamily> family;
  std::string family_source;  // where the family came from, for the summary
  ChatRenderOptions render;
};

absl::StatusOr<Directory> LoadDirectory(const std::string& dir) {
  Directory d;
  const std::string json_path = dir + "/tokenizer.json";
  const std::string model_path = dir + "/tokenizer.model";
  if (Exists(json_path)) {
    ASSIGN_OR_RETURN(d.tokenizer, LoadTokenizer(json_path));
  } else if (Exists(model_path)) {
    ASSIGN_OR_RETURN(d.tokenizer, LoadTokenizer(model_path));
  } else {
    return absl::NotFoundError(absl::StrCat("--tokenizer='", dir,
                                            "' has neither tokenizer.json nor tokenizer.model"));
  }
  Json config = Json::object();
  const std::string config_path = dir + "/tokenizer_config.json";
  if (Exists(config_path)) {
    ASSIGN_OR_RETURN(std::string text, ReadFile(config_path));
    config = Json::parse(text, nullptr, /*allow_exceptions=*/false);
    if (config.is_discarded() || !config.is_object()) {
      return absl::InvalidArgumentError(
          absl::StrCat("'", config_path, "' is not a JSON object"));
    }
    d.render.bos_token = ConfigToken(config, "bos_token");
    d.render.eos_token = ConfigToken(config, "eos_token");
  }
  d.render.date_string = absl::GetFlag(FLAGS_chat_date);
  const std::string flag = absl::GetFlag(FLAGS_chat_template);
  if (!flag.empty()) {
    ASSIGN_OR_RETURN(ChatFamily f, ChatFamilyFromName(flag));
    d.family = f;
    d.family_source = "--chat_template";
    return d;
  }
  std::string jinja, source;
  const std::string jinja_path = dir + "/chat_template.jinja";
  if (Exists(jinja_path)) {
    ASSIGN_OR_RETURN(jinja, ReadFile(jinja_path));
    source = jinja_path;
  } else if (config.contains("chat_template")) {
    const Json& t = config["chat_template"];
    source = config_path;
    if (t.is_string()) {
      jinja = t.get<std::string>();
    } else if (t.is_array()) {  // [{"name", "template"}, ...]: the one named "default"
      for (const Json& e : t) {
        if (e.is_object() && e.value("name", "") == "default" && e["template"].is_string()) {
          jinja = e["template"].get<std::string>();
        }
      }
      if (jinja.empty()) {
        return absl::InvalidArgumentError(absl::StrCat(
            "'", config_path, "' has a list of chat templates without one named \"default\""));
      }
    } else {
      return absl::InvalidArgumentError(
          absl::StrCat("'", config_path, "': \"chat_template\" is neither a string nor a list"));
    }
  }
  if (!source.empty()) {
    ASSIGN_OR_RETURN(ChatFamily f, RecognizeChatTemplate(jinja, absl::StrCat("'", source, "'")));
    d.family = f;
    d.family_source = source;
  }
  return d;
}

std::string ExampleJson(const TokenizedExample& ex) {
  std::vector<int64_t> labels(ex.tokens.size());
  for (size_t i = 0; i < ex.tokens.size(); ++i) {
    labels[i] = ex.trained[i] ? static_cast<int64_t>(ex.tokens[i]) : -100;
  }
  return absl::StrCat("{\"input_ids\": [", absl::StrJoin(ex.tokens, ", "), "], \"labels\": [",
                      absl::StrJoin(labels, ", "), "]}");
}

absl::Status Run() {
  RETURN_IF_ERROR(RefuseEmptyFlags(__FILE__));
  const std::string input = UserPath(absl::GetFlag(FLAGS_input));
  const std::string output = UserPath(absl::GetFlag(FLAGS_output));
  const std::string dir = UserPath(absl::GetFlag(FLAGS_tokenizer));
  if (input.empty() || output.empty() || dir.empty()) {
    return absl::InvalidArgumentError("--input, --tokenizer and --output are required");
  }
  const std::string train_on = absl::GetFlag(FLAGS_train_on);
  if (train_on != "all_assistant" && train_on != "last_assistant") {
    return absl::InvalidArgumentError(absl::StrCat(
        "--train_on='", train_on, "' is neither all_assistant nor last_assistant"));
  }
  const int64_t print_n = absl::GetFlag(FLAGS_print_examples);
  if (print_n < 0) return absl::InvalidArgumentError("--print_examples must be >= 0");
  ASSIGN_OR_RETURN(Directory d, LoadDirectory(dir));

  ExampleOptions options;
  options.family = d.family;
  options.render = d.render;
  options.train_on = train_on == "last_assistant" ? TrainOn::kLastAssistant
                                                   : TrainOn::kAllAssistant;
  options.train_on_prompt = absl::GetFlag(FLAGS_train_on_prompt);
  ExampleTokenizer tokenizer(d.tokenizer.get(), options);

  std::ifstream in(input, std::ios::binary);
  if (!in) return absl::NotFoundError(absl::StrCat("cannot open --input='", input, "'"));
  std::vector<uint32_t> tokens;
  std::vector<uint8_t> trained;
  std::vector<int64_t> starts = {0};
  std::map<std::string, int64_t> skipped;
  std::map<std::string, int64_t> shapes;
  int64_t line_no = 0, printed = 0, trained_tokens = 0, max_len = 0;
  std::string line;
  while (std::getline(in, line)) {
    ++line_no;
    if (!line.empty() && line.back() == '\r') line.pop_back();
    if (line.find_first_not_of(" \t") == std::string::npos) continue;  // blank lines
    LineProblem problem;
    std::optional<ParsedExample> ex = ParseExampleLine(line, &problem);
    TokenizedExample t;
    if (ex.has_value() && tokenizer.Tokenize(*ex, &t, &problem)) {
      ++shapes[std::string(ExampleShapeName(ex->shape))];
      tokens.insert(tokens.end(), t.tokens.begin(), t.tokens.end());
      trained.insert(trained.end(), t.trained.begin(), t.trained.end());
      starts.push_back(static_cast<int64_t>(tokens.size()));
      trained_tokens += std::count(t.trained.begin(), t.trained.end(), 1);
      max_len = std::max<int64_t>(max_len, static_cast<int64_t>(t.tokens.size()));
      if (printed < print_n) {
        std::cout << ExampleJson(t) << "\n";
        ++printed;
      }
      continue;
    }
    const std::string where = absl::StrCat(input, ":", line_no);
    if (!absl::GetFlag(FLAGS_skip_bad_lines)) {
      return absl::InvalidArgumentError(absl::StrCat(
          where, ": ", problem.message, " [", problem.reason,
          "] (nothing written; --skip_bad_lines skips and counts such lines)"));
    }
    ++skipped[problem.reason];
  }
  if (in.bad()) return absl::DataLossError(absl::StrCat("cannot read --input='", input, "'"));
  const int64_t examples = static_cast<int64_t>(starts.size()) - 1;
  if (examples == 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("--input='", input, "' gave no examples (", line_no, " lines)"));
  }
  ExamplesView view{TokenSpan(tokens), starts, trained};
  RETURN_IF_ERROR(WriteExampleFile(output, view));

  std::cout << absl::StrFormat(
      "prepare_data: %d examples, %d tokens, %d trained tokens (%.1f%%) -> %s\n", examples,
      tokens.size(), trained_tokens, 100.0 * trained_tokens / std::max<size_t>(1, tokens.size()),
      output);
  std::cout << absl::StrFormat("  example length: max %d, mean %.1f tokens\n", max_len,
                               static_cast<double>(tokens.size()) / examples);
  std::cout << "  tokenizer: " << d.tokenizer->name() << ", vocabulary " << d.tokenizer->vocab_size()
            << "\n";
  std::cout << "  chat template: "
            << (d.family.has_value() ? absl::StrCat(ChatFamilyName(*d.family), " (from ",
                                                    d.family_source, ")")
                                     : std::string("none"))
            << "; train on: " << (options.train_on_prompt ? "every token" : train_on) << "\n";
  for (const auto& [shape, n] : shapes) std::cout << "  shape " << shape << ": " << n << "\n";
  int64_t total_skipped = 0;
  for (const auto& [reason, n] : skipped) total_skipped += n;
  std::cout << "  skipped lines: " << total_skipped;
  for (const auto& [reason, n] : skipped) std::cout << ", " << reason << " " << n;
  std::cout << "\n";
  return absl::OkStatus();
}

}  // namespace
}  // namespace ps

int main(int argc, char** argv) {
  absl::SetProgramUsageMessage(
      "Prepares fine-tuning examples from JSON Lines (docs/chat_data.md):\n"
      "  prepare_data --input=FILE.jsonl --tokenizer=MODEL_DIR --output=OUT.bin");
  absl::ParseCommandLine(argc, argv);
  if (absl::Status s = ps::Run(); !s.ok()) {
    std::cerr << "prepare_data: " << s.message() << "\n";
    return 1;
  }
  return 0;
}
