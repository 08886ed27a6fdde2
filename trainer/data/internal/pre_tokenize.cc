#include "trainer/data/internal/pre_tokenize.h"

#include <cstddef>
#include <optional>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/string_view.h"
#include "base/utf8.h"
#include "trainer/data/internal/unicode_classes.h"

namespace ps::data_internal {
namespace {

constexpr absl::string_view kGpt2Regex =
    R"('s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+)";
constexpr absl::string_view kLlama3Regex =
    R"((?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+)";
constexpr absl::string_view kQwen2Regex =
    R"((?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+)";

// One character of the text: its class and length in bytes. A byte that does not start a
// well-formed sequence is one character of class kOther.
struct Char {
  CharClass cls;
  size_t length;
  bool line_break;  // \r or \n
};

Char CharAt(absl::string_view text, size_t pos) {
  const Utf8Char c = DecodeUtf8(text, pos);
  return Char{ClassOf(c.cp), c.valid() ? static_cast<size_t>(c.length) : size_t{1},
              c.cp == '\r' || c.cp == '\n'};
}

// The end of the run of characters of class `cls` starting at `pos`, at most `max_chars` long.
size_t RunEnd(absl::string_view text, size_t pos, CharClass cls, size_t max_chars = ~size_t{0}) {
  for (size_t count = 0; pos < text.size() && count < max_chars; ++count) {
    const Char c = CharAt(text, pos);
    if (c.cls != cls) break;
    pos += c.length;
  }
  return pos;
}

// The contractions 's 't 're 've 'm 'll 'd at `pos` (case-insensitively for ASCII if
// `ignore_case`); the end of the match or 0.
size_t MatchContraction(absl::string_view text, size_t pos, bool ignore_case) {
  if (text[pos] != '\'') return 0;
  const absl::string_view rest = text.substr(pos + 1);
  for (const absl::string_view suffix : {"s", "t", "re", "ve", "m", "ll", "d"}) {
    const bool match =
        ignore_case ? absl::StartsWithIgnoreCase(rest, suffix) : absl::StartsWith(rest, suffix);
    if (match) return pos + 1 + suffix.size();
  }
  return 0;
}

// \s+(?!\S)|\s+ at `pos` (a whitespace character): the whole whitespace run if it ends the text;
// otherwise the run without its last character (which stays in front of the next non-space),
// unless that leaves nothing, in which case \s+ takes the single character.
size_t MatchSpaceRun(absl::string_view text, size_t pos) {
  size_t last_start = pos;
  size_t end = pos;
  while (end < text.size()) {
    const Char c = CharAt(text, end);
    if (c.cls != CharClass::kSpace) break;
    last_start = end;
    end += c.length;
  }
  if (end == text.size()) return end;
  return last_start > pos ? last_start : end;
}

size_t MatchGpt2(absl::string_view text, size_t pos) {
  if (const size_t end = MatchContraction(text, pos, /*ignore_case=*/false)) return end;
  const Char c = CharAt(text, pos);
  // ' ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+' with the optional space: exactly one of the three
  // applies, chosen by the class of the character after the space.
  if (text[pos] == ' ' && pos + 1 < text.size()) {
    const Char next = CharAt(text, pos + 1);
    if (next.cls != CharClass::kSpace) return RunEnd(text, pos + 1, next.cls);
  }
  if (c.cls != CharClass::kSpace) return RunEnd(text, pos, c.cls);
  return MatchSpaceRun(text, pos);
}

// Llama-3 (max_digits 3) and Qwen2 (max_digits 1).
size_t MatchLlama3(absl::string_view text, size_t pos, size_t max_digits) {
  if (const size_t end = MatchContraction(text, pos, /*ignore_case=*/true)) return end;
  const size_t n = text.size();
  const Char c = CharAt(text, pos);
  // [^\r\n\p{L}\p{N}]?\p{L}+
  if (c.cls == CharClass::kLetter) return RunEnd(text, pos, CharClass::kLetter);
  if (c.cls != CharClass::kNumber && !c.line_break && pos + c.length < n &&
      CharAt(text, pos + c.length).cls == CharClass::kLetter) {
    return RunEnd(text, pos + c.length, CharClass::kLetter);
  }
  // \p{N}{1,3} or \p{N}
  if (c.cls == CharClass::kNumber) return RunEnd(text, pos, CharClass::kNumber, max_digits);
  // ' ?[^\s\p{L}\p{N}]+[\r\n]*'
  size_t start = pos;
  if (text[pos] == ' ' && pos + 1 < n && CharAt(text, pos + 1).cls == CharClass::kOther) {
    start = pos + 1;
  }
  if (CharAt(text, start).cls == CharClass::kOther) {
    size_t end = RunEnd(text, start, CharClass::kOther);
    while (end < n && (text[end] == '\r' || text[end] == '\n')) ++end;
    return end;
  }
  // Only whitespace is left. \s*[\r\n]+: up to the last line break of the whitespace run.
  size_t end = pos;
  size_t after_last_break = 0;
  while (end < n) {
    const Char s = CharAt(text, end);
    if (s.cls != CharClass::kSpace) break;
    end += s.length;
    if (s.line_break) after_last_break = end;
  }
  if (after_last_break != 0) return after_last_break;
  // \s+(?!\S)|\s+
  return MatchSpaceRun(text, pos);
}

}  // namespace

absl::string_view SplitPatternName(SplitPattern pattern) {
  switch (pattern) {
    case SplitPattern::kGpt2:
      return "gpt2";
    case SplitPattern::kLlama3:
      return "llama3";
    case SplitPattern::kQwen2:
      return "qwen2";
  }
  return "unknown";
}

std::optional<SplitPattern> RecognizeSplitPattern(absl::string_view regex) {
  if (regex == kGpt2Regex) return SplitPattern::kGpt2;
  if (regex == kLlama3Regex) return SplitPattern::kLlama3;
  if (regex == kQwen2Regex) return SplitPattern::kQwen2;
  return std::nullopt;
}

void PreTokenize(SplitPattern pattern, absl::string_view text,
                 std::vector<absl::string_view>* pieces) {
  size_t pos = 0;
  while (pos < text.size()) {
    size_t end = 0;
    switch (pattern) {
      case SplitPattern::kGpt2:
        end = MatchGpt2(text, pos);
        break;
      case SplitPattern::kLlama3:
        end = MatchLlama3(text, pos, 3);
        break;
      case SplitPattern::kQwen2:
        end = MatchLlama3(text, pos, 1);
        break;
    }
    pieces->push_back(text.substr(pos, end - pos));
    pos = end;
  }
}

}  // namespace ps::data_internal
