#include "trainer/data/tokenizer.h"

#include <algorithm>
#include <cerrno>
#include <cstdint>
#include <fstream>
#include <functional>
#include <limits>
#include <sstream>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "absl/strings/string_view.h"
#include "base/status_macros.h"
#include "base/utf8.h"
#include "nlohmann/json.hpp"
#include "trainer/data/internal/unicode_classes.h"

namespace ps {
namespace {

using data_internal::CharClass;
using data_internal::ClassOf;

// ---------------------------------------------------------------------------------------------
// Pre-tokenization.

CharClass ClassAt(absl::string_view text, size_t pos, int* length) {
  // A byte that does not start a well-formed sequence is one character of class kOther (Python's
  // "surrogateescape" decoding does the same).
  const Utf8Char c = DecodeUtf8(text, pos);
  *length = c.valid() ? c.length : 1;
  return ClassOf(c.cp);
}

// The end of the run of characters of class `cls` starting at `pos` (which has that class).
size_t RunEnd(absl::string_view text, size_t pos, CharClass cls) {
  while (pos < text.size()) {
    int length;
    if (ClassAt(text, pos, &length) != cls) break;
    pos += static_cast<size_t>(length);
  }
  return pos;
}

// The end of the piece that GPT-2's pattern matches at `pos` (< text.size()).
size_t MatchAt(absl::string_view text, size_t pos) {
  const size_t n = text.size();
  // 's|'t|'re|'ve|'m|'ll|'d
  if (text[pos] == '\'') {
    const absl::string_view rest = text.substr(pos + 1);
    for (const absl::string_view suffix : {"s", "t", "re", "ve", "m", "ll", "d"}) {
      if (absl::StartsWith(rest, suffix)) return pos + 1 + suffix.size();
    }
  }
  int length;
  const CharClass cls = ClassAt(text, pos, &length);
  // ' ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+' with the optional space: exactly one of the three
  // applies, chosen by the class of the character after the space.
  if (text[pos] == ' ' && pos + 1 < n) {
    int next_length;
    const CharClass next = ClassAt(text, pos + 1, &next_length);
    if (next != CharClass::kSpace) return RunEnd(text, pos + 1, next);
  }
  // The same without the space.
  if (cls != CharClass::kSpace) return RunEnd(text, pos, cls);
  // \s+(?!\S)|\s+ : the whole whitespace run if it ends the text; otherwise the run without its
  // last character (which must stay in front of the next non-space), unless that leaves nothing,
  // in which case \s+ takes the single character.
  size_t last_start = pos;
  size_t end = pos;
  while (end < n) {
    int l;
    if (ClassAt(text, end, &l) != CharClass::kSpace) break;
    last_start = end;
    end += static_cast<size_t>(l);
  }
  if (end == n) return end;
  return last_start > pos ? last_start : end;
}

// ---------------------------------------------------------------------------------------------
// bytes_to_unicode.

// The stand-in code point of each byte (encoder.py's bytes_to_unicode).
std::array<uint32_t, 256> ByteToCodePoint() {
  std::array<uint32_t, 256> map{};
  uint32_t next = 256;
  for (uint32_t b = 0; b < 256; ++b) {
    const bool printable = (b >= '!' && b <= '~') || (b >= 0xA1 && b <= 0xAC) || (b >= 0xAE);
    map[b] = printable ? b : next++;
  }
  return map;
}

// ---------------------------------------------------------------------------------------------
// Files.

absl::StatusOr<std::string> ReadFile(const std::string& path, absl::string_view what) {
  std::ifstream in(path, std::ios::binary);
  if (!in) {
    const int err = errno;
    return absl::ErrnoToStatus(err, absl::StrCat("cannot open ", what, " '", path, "'"));
  }
  std::ostringstream buffer;
  buffer << in.rdbuf();
  if (in.bad()) return absl::DataLossError(absl::StrCat("cannot read ", what, " '", path, "'"));
  return std::move(buffer).str();
}

}  // namespace

// ---------------------------------------------------------------------------------------------
// ByteTokenizer.

void ByteTokenizer::Encode(absl::string_view text, std::vector<uint16_t>* out) {
  out->reserve(out->size() + text.size());
  for (const char c : text) out->push_back(static_cast<uint8_t>(c));
}

absl::StatusOr<std::string> ByteTokenizer::Decode(absl::Span<const uint16_t> tokens) const {
  std::string text(tokens.size(), '\0');
  for (size_t i = 0; i < tokens.size(); ++i) {
    if (tokens[i] > 255) {
      return absl::InvalidArgumentError(absl::StrCat(
          "token ", tokens[i], " at position ", i, " is not a byte (the byte vocabulary is 256)"));
    }
    text[i] = static_cast<char>(tokens[i]);
  }
  return text;
}

// ---------------------------------------------------------------------------------------------
// GPT-2.

std::vector<absl::string_view> Gpt2PreTokenize(absl::string_view text) {
  std::vector<absl::string_view> pieces;
  size_t pos = 0;
  while (pos < text.size()) {
    const size_t end = MatchAt(text, pos);
    pieces.push_back(text.substr(pos, end - pos));
    pos = end;
  }
  return pieces;
}

const std::array<std::string, 256>& Gpt2ByteToUnicode() {
  static const std::array<std::string, 256>* const table = [] {
    auto* t = new std::array<std::string, 256>;
    const std::array<uint32_t, 256> cps = ByteToCodePoint();
    for (int b = 0; b < 256; ++b) AppendUtf8(cps[b], &(*t)[b]);
    return t;
  }();
  return *table;
}

absl::StatusOr<std::unique_ptr<Gpt2BpeTokenizer>> Gpt2BpeTokenizer::Load(
    const std::string& vocab_path, const std::string& merges_path) {
  ASSIGN_OR_RETURN(const std::string vocab, ReadFile(vocab_path, "vocabulary file"));
  ASSIGN_OR_RETURN(const std::string merges, ReadFile(merges_path, "merges file"));
  return FromContents(vocab, merges, absl::StrCat("'", vocab_path, "'"),
                      absl::StrCat("'", merges_path, "'"));
}

absl::StatusOr<std::unique_ptr<Gpt2BpeTokenizer>> Gpt2BpeTokenizer::FromContents(
    absl::string_view vocab_json, absl::string_view merges_txt, absl::string_view vocab_name,
    absl::string_view merges_name) {
  auto vocab_error = [&](absl::string_view what) {
    return absl::InvalidArgumentError(absl::StrCat("vocabulary ", vocab_name, ": ", what));
  };
  std::unique_ptr<Gpt2BpeTokenizer> tok(new Gpt2BpeTokenizer());

  // vocab.json: {"token": id, ...}. Parse without exceptions; record top-level keys to reject
  // duplicates (a JSON parser would silently keep one of them).
  std::vector<std::string> keys;
  nlohmann::json::parser_callback_t on_event =
      [&keys](int depth, nlohmann::json::parse_event_t event, nlohmann::json& parsed) {
        if (event == nlohmann::json::parse_event_t::key && depth == 1 && parsed.is_string()) {
          keys.push_back(parsed.get<std::string>());
        }
        return true;
      };
  const nlohmann::json vocab = nlohmann::json::parse(vocab_json.begin(), vocab_json.end(), on_event,
                                                     /*allow_exceptions=*/false);
  if (vocab.is_discarded()) return vocab_error("not valid JSON (or not valid UTF-8)");
  if (!vocab.is_object()) return vocab_error("not a JSON object of token -> id");
  if (vocab.empty()) return vocab_error("empty");
  {
    std::sort(keys.begin(), keys.end());
    const auto dup = std::adjacent_find(keys.begin(), keys.end());
    if (dup != keys.end()) return vocab_error(absl::StrCat("token '", *dup, "' appears twice"));
  }
  int64_t max_id = -1;
  for (const auto& [token, value] : vocab.items()) {
    if (!value.is_number_unsigned() || value.get<uint64_t>() > 65535) {
      return vocab_error(absl::StrCat("the id of token '", token, "' is ", value.dump(),
                                      "; ids must be integers in [0, 65535] (token files store "
                                      "uint16)"));
    }
    if (token.empty()) return vocab_error("has an empty token");
    max_id = std::max<int64_t>(max_id, value.get<int64_t>());
  }
  tok->vocab_size_ = max_id + 1;
  tok->id_to_token_.resize(static_cast<size_t>(max_id + 1));
  for (const auto& [token, value] : vocab.items()) {
    const auto id = value.get<uint16_t>();
    if (tok->id_to_token_[id].has_value()) {
      return vocab_error(absl::StrCat("tokens '", *tok->id_to_token_[id], "' and '", token,
                                      "' have the same id ", id));
    }
    tok->id_to_token_[id] = token;
    tok->token_to_id_[token] = id;
  }
  const std::array<uint32_t, 256> cps = ByteToCodePoint();
  for (int b = 0; b < 256; ++b) {
    const std::string& symbol = Gpt2ByteToUnicode()[b];
    const auto it = tok->token_to_id_.find(symbol);
    if (it == tok->token_to_id_.end()) {
      return vocab_error(absl::StrCat("the symbol '", symbol, "' of byte ", b,
                                      " is missing; a byte-level BPE vocabulary has all 256"));
    }
    tok->byte_to_id_[b] = it->second;
    tok->char_to_byte_[cps[b]] = static_cast<uint8_t>(b);
  }

  // merges.txt.
  std::vector<absl::string_view> lines = absl::StrSplit(merges_txt, '\n');
  if (!lines.empty() && lines.back().empty()) lines.pop_back();  // the final newline
  absl::flat_hash_map<uint64_t, size_t> line_of;                 // pair -> line number
  uint32_t rank = 0;
  for (size_t i = 0; i < lines.size(); ++i) {
    const size_t line_no = i + 1;
    absl::string_view line = lines[i];
    if (absl::EndsWith(line, "\r")) line.remove_suffix(1);
    if (i == 0 && absl::StartsWith(line, "#version")) continue;
    auto merges_error = [&](absl::string_view what) {
      return absl::InvalidArgumentError(
          absl::StrCat("merges ", merges_name, " line ", line_no, " ('", line, "'): ", what));
    };
    const std::vector<absl::string_view> parts = absl::StrSplit(line, ' ');
    if (parts.size() != 2 || parts[0].empty() || parts[1].empty()) {
      return merges_error("expected two symbols separated by one space");
    }
    uint16_t ids[2];
    for (int p = 0; p < 2; ++p) {
      const auto it = tok->token_to_id_.find(parts[p]);
      if (it == tok->token_to_id_.end()) {
        return merges_error(
            absl::StrCat("symbol '", parts[p], "' is not in the vocabulary ", vocab_name));
      }
      ids[p] = it->second;
    }
    const std::string merged = absl::StrCat(parts[0], parts[1]);
    const auto merged_it = tok->token_to_id_.find(merged);
    if (merged_it == tok->token_to_id_.end()) {
      return merges_error(
          absl::StrCat("the merged symbol '", merged, "' is not in the vocabulary ", vocab_name));
    }
    const uint64_t key = PairKey(ids[0], ids[1]);
    const auto [where, inserted] = line_of.try_emplace(key, line_no);
    if (!inserted) {
      return merges_error(absl::StrCat("duplicate of line ", where->second));
    }
    tok->merges_[key] = Merge{rank++, merged_it->second};
  }
  return tok;
}

std::optional<uint16_t> Gpt2BpeTokenizer::TokenId(absl::string_view token) const {
  const auto it = token_to_id_.find(token);
  if (it == token_to_id_.end()) return std::nullopt;
  return it->second;
}

void Gpt2BpeTokenizer::EncodePiece(absl::string_view piece, std::vector<uint16_t>* out) const {
  // A doubly linked list of symbols; merging keeps the left node, so node indices stay in text
  // order.
  const int n = static_cast<int>(piece.size());
  if (n == 0) return;
  std::vector<uint16_t> sym(n);
  std::vector<int> prev(n), next(n);
  for (int i = 0; i < n; ++i) {
    sym[i] = byte_to_id_[static_cast<uint8_t>(piece[i])];
    prev[i] = i - 1;
    next[i] = i + 1 < n ? i + 1 : -1;
  }
  struct Candidate {
    uint32_t rank;
    int left;
    uint16_t left_sym, right_sym;
  };
  // A min-heap on (rank, left): one rank at a time, left to right within it.
  auto later = [](const Candidate& a, const Candidate& b) {
    return a.rank != b.rank ? a.rank > b.rank : a.left > b.left;
  };
  std::vector<Candidate> heap;
  auto candidate = [&](int left, std::vector<Candidate>* into) {
    const int right = next[left];
    if (right < 0) return;
    const auto it = merges_.find(PairKey(sym[left], sym[right]));
    if (it != merges_.end()) into->push_back({it->second.rank, left, sym[left], sym[right]});
  };
  for (int i = 0; i + 1 < n; ++i) candidate(i, &heap);
  std::make_heap(heap.begin(), heap.end(), later);
  std::vector<Candidate> pending;
  while (!heap.empty()) {
    // Merge every current occurrence of the best pair, left to right (encoder.py's inner loop).
    // Pairs created meanwhile wait until the round is over, as encoder.py only looks for the next
    // best pair after the whole pass.
    const uint32_t round = heap.front().rank;
    while (!heap.empty() && heap.front().rank == round) {
      std::pop_heap(heap.begin(), heap.end(), later);
      const Candidate c = heap.back();
      heap.pop_back();
      const int left = c.left;
      const int right = next[left];
      // Stale if the left node was absorbed (its prev link is cut below), or either symbol
      // changed since the candidate was made.
      if (sym[left] != c.left_sym || right < 0 || sym[right] != c.right_sym) continue;
      if (left > 0 && prev[left] == -2) continue;
      sym[left] = merges_.find(PairKey(c.left_sym, c.right_sym))->second.merged;
      next[left] = next[right];
      if (next[right] >= 0) prev[next[right]] = left;
      prev[right] = -2;  // dead
      next[right] = -1;
      sym[right] = 0xFFFF;
      if (prev[left] >= 0) candidate(prev[left], &pending);
      candidate(left, &pending);
    }
    for (const Candidate& c : pending) {
      heap.push_back(c);
      std::push_heap(heap.begin(), heap.end(), later);
    }
    pending.clear();
  }
  for (int i = 0; i >= 0; i = next[i]) out->push_back(sym[i]);
}

void Gpt2BpeTokenizer::Encode(absl::string_view text, std::vector<uint16_t>* out) {
  for (const absl::string_view piece : Gpt2PreTokenize(text)) {
    const auto it = cache_.find(piece);
    if (it != cache_.end()) {
      out->insert(out->end(), it->second.begin(), it->second.end());
      continue;
    }
    std::vector<uint16_t> ids;
    EncodePiece(piece, &ids);
    out->insert(out->end(), ids.begin(), ids.end());
    if (cache_.size() >= kMaxCacheEntries) cache_.clear();
    cache_.emplace(piece, std::move(ids));
  }
}

absl::StatusOr<std::string> Gpt2BpeTokenizer::Decode(absl::Span<const uint16_t> tokens) const {
  std::string text;
  for (size_t i = 0; i < tokens.size(); ++i) {
    const uint16_t id = tokens[i];
    if (id >= id_to_token_.size() || !id_to_token_[id].has_value()) {
      return absl::InvalidArgumentError(
          absl::StrCat("token ", id, " at position ", i, " is not in the vocabulary"));
    }
    const std::string& token = *id_to_token_[id];
    for (size_t pos = 0; pos < token.size();) {
      const Utf8Char c = DecodeUtf8(token, pos);
      const auto it = char_to_byte_.find(c.cp);
      if (it == char_to_byte_.end()) {
        return absl::InvalidArgumentError(absl::StrCat(
            "token ", id, " ('", token, "') at position ", i,
            " has a character outside GPT-2's byte alphabet; it cannot be decoded to bytes"));
      }
      text.push_back(static_cast<char>(it->second));
      pos += static_cast<size_t>(c.length);
    }
  }
  return text;
}

}  // namespace ps
