#include "trainer/data/conversation.h"

#include <algorithm>
#include <cstdlib>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "base/utf8.h"
#include "nlohmann/json.hpp"
#include "utf8proc.h"

namespace ps {
namespace {

using Json = nlohmann::json;

std::optional<ParsedExample> Fail(LineProblem* problem, absl::string_view reason,
                                  std::string message) {
  problem->reason = std::string(reason);
  problem->message = std::move(message);
  return std::nullopt;
}

// A JSON string field as UTF-8 (the parser has checked well-formedness), or an error naming it.
bool StringField(const Json& obj, const char* key, std::string* out, LineProblem* problem) {
  const auto it = obj.find(key);
  if (it == obj.end() || !it->is_string()) {
    problem->reason = "bad_field";
    problem->message = absl::StrCat("\"", key, "\" must be a string, found ",
                                    it == obj.end() ? "nothing" : it->type_name());
    return false;
  }
  *out = it->get<std::string>();
  return true;
}

// Messages from a JSON array of {"role", "content"} objects.
bool MessageList(const Json& list, const char* key, std::vector<ChatMessage>* out,
                 LineProblem* problem) {
  for (size_t i = 0; i < list.size(); ++i) {
    const Json& m = list[i];
    if (!m.is_object()) {
      problem->reason = "bad_field";
      problem->message = absl::StrCat("\"", key, "\"[", i, "] must be an object with \"role\" "
                                      "and \"content\", found ", m.type_name());
      return false;
    }
    ChatMessage msg;
    if (!StringField(m, "role", &msg.role, problem) ||
        !StringField(m, "content", &msg.content, problem)) {
      problem->message = absl::StrCat("\"", key, "\"[", i, "]: ", problem->message);
      return false;
    }
    if (msg.role != "system" && msg.role != "user" && msg.role != "assistant") {
      problem->reason = "unknown_role";
      problem->message = absl::StrCat("\"", key, "\"[", i, "] has role \"", msg.role,
                                      "\"; known roles: system, user, assistant");
      return false;
    }
    out->push_back(std::move(msg));
  }
  return true;
}

// A prompt or completion: a string (one message of `role`) or a message list.
bool PromptOrCompletion(const Json& obj, const char* key, const char* role,
                        std::vector<ChatMessage>* out, LineProblem* problem) {
  const Json& v = obj.at(key);
  if (v.is_string()) {
    out->push_back({role, v.get<std::string>()});
    return true;
  }
  if (v.is_array()) return MessageList(v, key, out, problem);
  problem->reason = "bad_field";
  problem->message = absl::StrCat("\"", key, "\" must be a string or a list of messages, found ",
                                  v.type_name());
  return false;
}

// Python-free NFC of well-formed UTF-8 (utf8proc), as the BPE tokenizer's NFC normalizer.
std::string Nfc(absl::string_view text) {
  utf8proc_uint8_t* mapped = nullptr;
  const utf8proc_ssize_t n = utf8proc_map(
      reinterpret_cast<const utf8proc_uint8_t*>(text.data()),
      static_cast<utf8proc_ssize_t>(text.size()), &mapped,
      static_cast<utf8proc_option_t>(UTF8PROC_STABLE | UTF8PROC_COMPOSE));
  if (n < 0) return std::string(text);
  std::string out(reinterpret_cast<const char*>(mapped), static_cast<size_t>(n));
  std::free(mapped);
  return out;
}

}  // namespace

absl::string_view ExampleShapeName(ExampleShape shape) {
  switch (shape) {
    case ExampleShape::kMessages:
      return "messages";
    case ExampleShape::kPromptCompletion:
      return "prompt/completion";
    case ExampleShape::kAlpaca:
      return "instruction/input/output";
    case ExampleShape::kText:
      return "text";
  }
  return "?";
}

std::optional<ParsedExample> ParseExampleLine(absl::string_view line, LineProblem* problem) {
  if (!IsValidUtf8(line)) {
    return Fail(problem, "not_utf8", "the line is not well-formed UTF-8");
  }
  const Json obj = Json::parse(line.begin(), line.end(), nullptr, /*allow_exceptions=*/false);
  if (obj.is_discarded()) {
    return Fail(problem, "not_json",
                "the line is not one JSON value (unpaired \\u surrogate escapes count as "
                "not well-formed)");
  }
  if (!obj.is_object()) {
    return Fail(problem, "no_known_shape",
                absl::StrCat("the line is a JSON ", obj.type_name(), ", not an object"));
  }
  const bool messages = obj.contains("messages");
  const bool prompt = obj.contains("prompt") && obj.contains("completion");
  const bool alpaca = obj.contains("instruction") && obj.contains("output");
  const bool text = obj.contains("text");
  if (messages + prompt + alpaca + text != 1) {
    return Fail(problem, "no_known_shape",
                absl::StrCat(messages + prompt + alpaca + text == 0 ? "no" : "more than one",
                             " known shape: expected exactly one of {\"messages\"}, {\"prompt\", "
                             "\"completion\"}, {\"instruction\", \"input\", \"output\"}, "
                             "{\"text\"}"));
  }
  ParsedExample ex;
  if (text) {
    ex.shape = ExampleShape::kText;
    if (!StringField(obj, "text", &ex.text, problem)) return std::nullopt;
    return ex;
  }
  std::vector<bool> trainable;
  if (messages) {
    ex.shape = ExampleShape::kMessages;
    const Json& list = obj.at("messages");
    if (!list.is_array()) {
      return Fail(problem, "bad_field", absl::StrCat("\"messages\" must be a list, found ",
                                                     list.type_name()));
    }
    if (!MessageList(list, "messages", &ex.messages, problem)) return std::nullopt;
    trainable.assign(ex.messages.size(), true);
  } else if (prompt) {
    ex.shape = ExampleShape::kPromptCompletion;
    if (!PromptOrCompletion(obj, "prompt", "user", &ex.messages, problem)) return std::nullopt;
    trainable.assign(ex.messages.size(), false);
    if (!PromptOrCompletion(obj, "completion", "assistant", &ex.messages, problem)) {
      return std::nullopt;
    }
    trainable.resize(ex.messages.size(), true);
  } else {
    ex.shape = ExampleShape::kAlpaca;
    std::string instruction, input, output;
    if (!StringField(obj, "instruction", &instruction, problem) ||
        !StringField(obj, "output", &output, problem)) {
      return std::nullopt;
    }
    if (obj.contains("input") && !StringField(obj, "input", &input, problem)) return std::nullopt;
    ex.messages.push_back({"user", input.empty() ? instruction
                                                 : absl::StrCat(instruction, "\n\n", input)});
    ex.messages.push_back({"assistant", output});
    trainable = {false, true};
  }
  if (ex.messages.empty()) {
    return Fail(problem, "empty_conversation", "the conversation has no messages");
  }
  ex.trainable.resize(ex.messages.size());
  bool any = false;
  for (size_t i = 0; i < ex.messages.size(); ++i) {
    ex.trainable[i] = trainable[i] && ex.messages[i].role == "assistant";
    any = any || ex.trainable[i];
  }
  if (!any) {
    return Fail(problem, "no_assistant",
                ex.shape == ExampleShape::kPromptCompletion
                    ? "the completion has no assistant message: nothing to train on"
                    : "the conversation has no assistant message: nothing to train on");
  }
  return ex;
}

ExampleTokenizer::ExampleTokenizer(Tokenizer* tokenizer, ExampleOptions options)
    : tokenizer_(tokenizer),
      bpe_(dynamic_cast<BpeTokenizer*>(tokenizer)),
      options_(std::move(options)) {}

bool ExampleTokenizer::TokenizeText(absl::string_view text, TokenizedExample* out,
                                    LineProblem* problem) {
  out->tokens.clear();
  if (const std::optional<uint32_t> doc = tokenizer_->document_token()) {
    out->tokens.push_back(*doc);
  }
  if (bpe_ != nullptr) bpe_->set_parse_special_tokens(false);
  if (absl::Status s = tokenizer_->Encode(text, &out->tokens); !s.ok()) {
    problem->reason = "tokenizer";
    problem->message = std::string(s.message());
    return false;
  }
  if (out->tokens.empty()) {
    problem->reason = "empty_text";
    problem->message = "\"text\" is empty and the tokenizer has no document token";
    return false;
  }
  out->trained.assign(out->tokens.size(), 1);
  out->trained[0] = 0;
  return true;
}

bool ExampleTokenizer::EncodeWithSpans(const RenderedChat& chat, std::vector<uint32_t>* tokens,
                                       std::vector<ByteSpan>* token_bytes,
                                       LineProblem* problem) {
  auto tokenizer_error = [&](const absl::Status& s) {
    problem->reason = "tokenizer";
    problem->message = std::string(s.message());
    return false;
  };
  const std::string& text = chat.text;
  if (bpe_ != nullptr) {
    bpe_->set_parse_special_tokens(true);
    if (absl::Status s = bpe_->Encode(text, tokens); !s.ok()) return tokenizer_error(s);
    std::string decoded;
    std::vector<size_t> ends;
    for (uint32_t t : *tokens) {
      absl::StatusOr<std::string> piece = bpe_->Decode(absl::MakeConstSpan(&t, 1));
      if (!piece.ok()) return tokenizer_error(piece.status());
      decoded += *piece;
      ends.push_back(decoded.size());
    }
    // Token i covers decoded bytes [ends[i-1], ends[i]). The decoded text is the rendering, or
    // its NFC (a normalizing tokenizer); then rendering offsets map through NFC of the prefix.
    if (decoded != text && decoded != Nfc(text)) {
      problem->reason = "tokenizer";
      problem->message = "the tokens do not decode to the rendered text (or its NFC)";
      return false;
    }
    token_bytes->clear();
    size_t begin = 0;
    for (size_t e : ends) {
      token_bytes->push_back({begin, e});
      begin = e;
    }
    return true;
  }
  // Other tokenizers: cut at the special-token strings the template emitted, when the vocabulary
  // has them; each piece is encoded alone and its tokens get the piece's bytes.
  size_t pos = 0;
  while (pos < text.size()) {
    size_t best = text.size(), best_len = 0;
    std::optional<uint32_t> best_id;
    for (const std::string& sp : chat.special_tokens) {
      const std::optional<uint32_t> id = tokenizer_->TokenId(sp);
      if (!id.has_value() || sp.empty()) continue;
      const size_t at = text.find(sp, pos);
      if (at < best || (at == best && sp.size() > best_len)) {
        best = at;
        best_len = sp.size();
        best_id = id;
      }
    }
    if (best > pos) {
      if (absl::Status s = tokenizer_->Encode(absl::string_view(text).substr(pos, best - pos),
                                              tokens);
          !s.ok()) {
        return tokenizer_error(s);
      }
      token_bytes->resize(tokens->size(), ByteSpan{pos, best});
    }
    if (best_id.has_value() && best < text.size()) {
      tokens->push_back(*best_id);
      token_bytes->push_back({best, best + best_len});
    }
    pos = best + best_len;
    if (best_len == 0) break;
  }
  return true;
}

bool ExampleTokenizer::Tokenize(const ParsedExample& example, TokenizedExample* out,
                                LineProblem* problem) {
  if (example.shape == ExampleShape::kText) return TokenizeText(example.text, out, problem);
  if (!options_.family.has_value()) {
    problem->reason = "no_chat_template";
    problem->message = absl::StrCat(
        "a ", ExampleShapeName(example.shape),
        " example needs a chat template, and the tokenizer directory has none; pass "
        "--chat_template=NAME (known: ", KnownChatFamilyNames(), ")");
    return false;
  }
  absl::StatusOr<RenderedChat> chat =
      RenderChat(*options_.family, example.messages, options_.render);
  if (!chat.ok()) {
    problem->reason = "unknown_role";
    problem->message = std::string(chat.status().message());
    return false;
  }
  last_rendering_ = chat->text;
  // Trained byte spans: the assistant messages' spans, in order, of the trainable ones.
  std::vector<ByteSpan> spans;
  size_t assistant = 0;
  for (size_t i = 0; i < example.messages.size(); ++i) {
    if (example.messages[i].role != "assistant") continue;
    if (example.trainable[i]) spans.push_back(chat->assistant_spans[assistant]);
    ++assistant;
  }
  if (options_.train_on == TrainOn::kLastAssistant && spans.size() > 1) {
    spans.erase(spans.begin(), spans.end() - 1);
  }
  std::vector<ByteSpan> token_bytes;
  out->tokens.clear();
  if (!EncodeWithSpans(*chat, &out->tokens, &token_bytes, problem)) return false;
  // Map rendering offsets to the decoded text's (NFC if the tokenizer normalized).
  const std::string& text = chat->text;
  size_t decoded_size = token_bytes.empty() ? 0 : token_bytes.back().end;
  if (bpe_ != nullptr && decoded_size != text.size()) {
    for (ByteSpan& s : spans) {
      s = {Nfc(absl::string_view(text).substr(0, s.begin)).size(),
           Nfc(absl::string_view(text).substr(0, s.end)).size()};
    }
  }
  const size_t n = out->tokens.size();
  out->trained.assign(n, 0);
  for (size_t i = 1; i < n; ++i) {
    if (options_.train_on_prompt) {
      out->trained[i] = 1;
      continue;
    }
    for (const ByteSpan& s : spans) {
      if (token_bytes[i].begin < s.end && s.begin < token_bytes[i].end) {
        out->trained[i] = 1;
        break;
      }
    }
  }
  return true;
}

}  // namespace ps
