#include "trainer/data/chat_template.h"

#include <algorithm>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/escaping.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "base/utf8.h"

namespace ps {
namespace {

constexpr ChatFamily kAllFamilies[] = {ChatFamily::kLlama3, ChatFamily::kQwen2,
                                       ChatFamily::kQwen25, ChatFamily::kQwen3,
                                       ChatFamily::kMistral, ChatFamily::kGpt2};

// Python's str.isspace(): Unicode White_Space minus U+200B-ish exceptions, plus the information
// separators U+001C..U+001F (bidi class B/S), exactly CPython's _PyUnicode_IsWhitespace table.
bool PyIsSpace(uint32_t cp) {
  return (cp >= 0x09 && cp <= 0x0D) || (cp >= 0x1C && cp <= 0x20) || cp == 0x85 || cp == 0xA0 ||
         cp == 0x1680 || (cp >= 0x2000 && cp <= 0x200A) || cp == 0x2028 || cp == 0x2029 ||
         cp == 0x202F || cp == 0x205F || cp == 0x3000;
}

// Python's s.lstrip(c) / s.rstrip(c) / s.strip(c) for one ASCII character.
absl::string_view LStripChar(absl::string_view s, char c) {
  while (!s.empty() && s.front() == c) s.remove_prefix(1);
  return s;
}
absl::string_view RStripChar(absl::string_view s, char c) {
  while (!s.empty() && s.back() == c) s.remove_suffix(1);
  return s;
}

// Text after the last occurrence of `sep` (Python's s.split(sep)[-1]); all of s if absent.
absl::string_view AfterLast(absl::string_view s, absl::string_view sep) {
  const size_t pos = s.rfind(sep);
  return pos == absl::string_view::npos ? s : s.substr(pos + sep.size());
}
// Text before the first occurrence of `sep` (Python's s.split(sep)[0]).
absl::string_view BeforeFirst(absl::string_view s, absl::string_view sep) {
  const size_t pos = s.find(sep);
  return pos == absl::string_view::npos ? s : s.substr(0, pos);
}

// Appends pieces to the rendering and records trained spans.
class Builder {
 public:
  void Add(absl::string_view piece) { text_.append(piece.data(), piece.size()); }
  size_t pos() const { return text_.size(); }
  void Span(size_t begin) { spans_.push_back({begin, text_.size()}); }
  RenderedChat Finish(std::vector<std::string> specials) {
    RenderedChat out;
    out.text = std::move(text_);
    out.assistant_spans = std::move(spans_);
    out.special_tokens = std::move(specials);
    return out;
  }

 private:
  std::string text_;
  std::vector<ByteSpan> spans_;
};

absl::Status CheckRoles(ChatFamily family, absl::Span<const ChatMessage> messages) {
  for (size_t i = 0; i < messages.size(); ++i) {
    const std::string& role = messages[i].role;
    if (role != "system" && role != "user" && role != "assistant") {
      return absl::InvalidArgumentError(absl::StrCat("message ", i, " has role '", role,
                                                     "'; known roles: system, user, assistant"));
    }
    if (family == ChatFamily::kMistral && role == "system") {
      return absl::InvalidArgumentError(absl::StrCat(
          "message ", i,
          " is a system message, which the Mistral-7B-Instruct-v0.3 template (chat template "
          "'mistral') drops without a trace; remove it or fold it into the first user message"));
    }
  }
  return absl::OkStatus();
}

RenderedChat RenderLlama3(absl::Span<const ChatMessage> messages, const ChatRenderOptions& o) {
  Builder b;
  const std::string bos = o.bos_token.empty() ? "<|begin_of_text|>" : o.bos_token;
  b.Add(bos);
  size_t first = 0;
  absl::string_view system;
  if (!messages.empty() && messages[0].role == "system") {
    system = PyStrip(messages[0].content);
    first = 1;
  }
  b.Add("<|start_header_id|>system<|end_header_id|>\n\n");
  b.Add("Cutting Knowledge Date: December 2023\n");
  b.Add(absl::StrCat("Today Date: ", o.date_string, "\n\n"));
  b.Add(system);
  b.Add("<|eot_id|>");
  for (size_t i = first; i < messages.size(); ++i) {
    const ChatMessage& m = messages[i];
    b.Add(absl::StrCat("<|start_header_id|>", m.role, "<|end_header_id|>\n\n"));
    const size_t begin = b.pos();
    b.Add(PyStrip(m.content));
    b.Add("<|eot_id|>");
    if (m.role == "assistant") b.Span(begin);
  }
  return b.Finish({bos, "<|start_header_id|>", "<|end_header_id|>", "<|eot_id|>"});
}

// One ChatML turn: <|im_start|>role\ncontent<|im_end|>\n, the span over content<|im_end|>.
void ChatMlTurn(Builder* b, absl::string_view role, absl::string_view content, bool trained) {
  b->Add(absl::StrCat("<|im_start|>", role, "\n"));
  const size_t begin = b->pos();
  b->Add(content);
  b->Add("<|im_end|>");
  if (trained) b->Span(begin);
  b->Add("\n");
}

RenderedChat RenderQwen2(absl::Span<const ChatMessage> messages, bool qwen25) {
  Builder b;
  const bool has_system = !messages.empty() && messages[0].role == "system";
  if (qwen25) {
    // The system turn comes first: the given one, else the default; the loop skips message 0 if
    // it is the system message.
    ChatMlTurn(&b, "system",
               has_system ? absl::string_view(messages[0].content)
                          : "You are Qwen, created by Alibaba Cloud. You are a helpful assistant.",
               false);
    for (size_t i = has_system ? 1 : 0; i < messages.size(); ++i) {
      ChatMlTurn(&b, messages[i].role, messages[i].content, messages[i].role == "assistant");
    }
  } else {
    if (!messages.empty() && !has_system) {
      ChatMlTurn(&b, "system", "You are a helpful assistant.", false);
    }
    for (const ChatMessage& m : messages) ChatMlTurn(&b, m.role, m.content, m.role == "assistant");
  }
  return b.Finish({"<|im_start|>", "<|im_end|>"});
}

RenderedChat RenderQwen3(absl::Span<const ChatMessage> messages) {
  Builder b;
  const size_t n = messages.size();
  if (n > 0 && messages[0].role == "system") ChatMlTurn(&b, "system", messages[0].content, false);
  // The last user message that is not a tool response (the template's ns.last_query_index).
  size_t last_query = n == 0 ? 0 : n - 1;
  for (size_t k = n; k-- > 0;) {
    const std::string& c = messages[k].content;
    if (messages[k].role == "user" &&
        !(absl::StartsWith(c, "<tool_response>") && absl::EndsWith(c, "</tool_response>"))) {
      last_query = k;
      break;
    }
  }
  for (size_t i = 0; i < n; ++i) {
    const ChatMessage& m = messages[i];
    if (m.role == "user" || (m.role == "system" && i != 0)) {
      ChatMlTurn(&b, m.role, m.content, false);
      continue;
    }
    if (m.role != "assistant") continue;
    absl::string_view content = m.content;
    absl::string_view reasoning;
    if (absl::StrContains(m.content, "</think>")) {
      content = LStripChar(AfterLast(m.content, "</think>"), '\n');
      reasoning = LStripChar(
          AfterLast(RStripChar(BeforeFirst(m.content, "</think>"), '\n'), "<think>"), '\n');
    }
    b.Add("<|im_start|>assistant\n");
    const size_t begin = b.pos();
    if (i > last_query && (i + 1 == n || !reasoning.empty())) {
      b.Add("<think>\n");
      b.Add(RStripChar(LStripChar(reasoning, '\n'), '\n'));
      b.Add("\n</think>\n\n");
      b.Add(LStripChar(content, '\n'));
    } else {
      b.Add(content);
    }
    b.Add("<|im_end|>");
    b.Span(begin);
    b.Add("\n");
  }
  return b.Finish({"<|im_start|>", "<|im_end|>"});
}

RenderedChat RenderMistral(absl::Span<const ChatMessage> messages, const ChatRenderOptions& o) {
  Builder b;
  const std::string bos = o.bos_token.empty() ? "<s>" : o.bos_token;
  const std::string eos = o.eos_token.empty() ? "</s>" : o.eos_token;
  b.Add(bos);
  for (const ChatMessage& m : messages) {
    if (m.role == "user") {
      b.Add(absl::StrCat(" [INST] ", m.content, " [/INST]"));
    } else {
      b.Add(" ");
      const size_t begin = b.pos();
      b.Add(absl::StrCat(m.content, " ", eos));
      b.Span(begin);
    }
  }
  return b.Finish({bos, eos, "[INST]", "[/INST]"});
}

RenderedChat RenderGpt2(absl::Span<const ChatMessage> messages, const ChatRenderOptions& o) {
  Builder b;
  const std::string eos = o.eos_token.empty() ? "<|endoftext|>" : o.eos_token;
  for (const ChatMessage& m : messages) {
    const size_t begin = b.pos();
    b.Add(m.content);
    b.Add(eos);
    if (m.role == "assistant") b.Span(begin);
  }
  return b.Finish({eos});
}

}  // namespace

absl::string_view PyStrip(absl::string_view s) {
  size_t begin = 0;
  while (begin < s.size()) {
    const Utf8Char c = DecodeUtf8(s, begin);
    if (!c.valid() || !PyIsSpace(c.cp)) break;
    begin += c.length;
  }
  size_t end = s.size();
  while (end > begin) {
    // Step back to the start of the last character.
    size_t start = end - 1;
    while (start > begin && (static_cast<unsigned char>(s[start]) & 0xC0) == 0x80) --start;
    const Utf8Char c = DecodeUtf8(s, start);
    if (!c.valid() || start + c.length != end || !PyIsSpace(c.cp)) break;
    end = start;
  }
  return s.substr(begin, end - begin);
}

absl::string_view ChatFamilyName(ChatFamily family) {
  switch (family) {
    case ChatFamily::kLlama3:
      return "llama3";
    case ChatFamily::kQwen2:
      return "qwen2";
    case ChatFamily::kQwen25:
      return "qwen2.5";
    case ChatFamily::kQwen3:
      return "qwen3";
    case ChatFamily::kMistral:
      return "mistral";
    case ChatFamily::kGpt2:
      return "gpt2";
  }
  return "?";
}

std::string KnownChatFamilyNames() {
  std::vector<std::string> names;
  for (ChatFamily f : kAllFamilies) names.emplace_back(ChatFamilyName(f));
  return absl::StrJoin(names, ", ");
}

absl::StatusOr<ChatFamily> ChatFamilyFromName(absl::string_view name) {
  for (ChatFamily f : kAllFamilies) {
    if (ChatFamilyName(f) == name) return f;
  }
  return absl::InvalidArgumentError(absl::StrCat("unknown chat template '", name,
                                                 "'; known: ", KnownChatFamilyNames()));
}

absl::StatusOr<ChatFamily> RecognizeChatTemplate(absl::string_view jinja,
                                                 absl::string_view source) {
  auto has = [&](absl::string_view marker) { return absl::StrContains(jinja, marker); };
  // Markers, most specific first. Each is in the committed real template of its family and in
  // no other family's (chat_template_test checks both).
  if (has("<|start_header_id|>") && has("Cutting Knowledge Date: December 2023")) {
    return ChatFamily::kLlama3;
  }
  if (has("<|im_start|>") && has("last_query_index") && has("</think>")) return ChatFamily::kQwen3;
  if (has("<|im_start|>") && has("You are Qwen, created by Alibaba Cloud. You are a helpful "
                                  "assistant.")) {
    return ChatFamily::kQwen25;
  }
  if (has("<|im_start|>") && has("messages[0]['role'] != 'system'") &&
      has("You are a helpful assistant.<|im_end|>") && !has("<think>")) {
    return ChatFamily::kQwen2;
  }
  if (has("' [INST] ' + message['content'] + ' [/INST]'") &&
      has("' ' + message.content + ' ' + eos_token")) {
    return ChatFamily::kMistral;
  }
  // transformers' former default for GPT-2 (each content followed by eos).
  if (PyStrip(jinja) ==
      "{% for message in messages %}{{ message.content }}{{ eos_token }}{% endfor %}") {
    return ChatFamily::kGpt2;
  }
  std::string found = "an unrecognized template";
  if (has("<|start_header_id|>")) found = "a Llama-3 style template without the Llama-3.1 date "
                                          "header (Llama-3.0?)";
  else if (has("<|im_start|>")) found = "a ChatML template of no known family";
  else if (has("[INST]")) found = "a Mistral [INST] template other than Mistral-7B-Instruct-v0.3's";
  return absl::InvalidArgumentError(absl::StrCat(
      "chat template in ", source, " is ", found, " (first 80 bytes: '",
      absl::CHexEscape(jinja.substr(0, 80)), "'); known templates: ", KnownChatFamilyNames(),
      " — pass --chat_template=NAME if one of them renders what this model expects"));
}

absl::StatusOr<RenderedChat> RenderChat(ChatFamily family, absl::Span<const ChatMessage> messages,
                                        const ChatRenderOptions& options) {
  if (absl::Status s = CheckRoles(family, messages); !s.ok()) return s;
  switch (family) {
    case ChatFamily::kLlama3:
      return RenderLlama3(messages, options);
    case ChatFamily::kQwen2:
      return RenderQwen2(messages, /*qwen25=*/false);
    case ChatFamily::kQwen25:
      return RenderQwen2(messages, /*qwen25=*/true);
    case ChatFamily::kQwen3:
      return RenderQwen3(messages);
    case ChatFamily::kMistral:
      return RenderMistral(messages, options);
    case ChatFamily::kGpt2:
      return RenderGpt2(messages, options);
  }
  return absl::InternalError("unknown chat family");
}

}  // namespace ps
