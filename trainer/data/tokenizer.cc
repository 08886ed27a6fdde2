#include "trainer/data/tokenizer.h"

#include <algorithm>
#include <cerrno>
#include <cstdint>
#include <cstdlib>
#include <fstream>
#include <functional>
#include <limits>
#include <sstream>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"
#include "absl/strings/string_view.h"
#include "base/status_macros.h"
#include "base/utf8.h"
#include "nlohmann/json.hpp"
#include "utf8proc.h"

namespace ps {
namespace {

using data_internal::PreTokenize;
using data_internal::RecognizeSplitPattern;
using data_internal::SplitPattern;
using data_internal::SplitPatternName;
using Json = nlohmann::json;

// Token ids become int32 in batches (trainer/data/data_loader.h).
constexpr uint64_t kMaxTokenId = std::numeric_limits<int32_t>::max();

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
// Files and normalization.

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

// NFC of every maximal well-formed UTF-8 run of `text`; ill-formed bytes are kept as they are.
std::string Nfc(absl::string_view text) {
  std::string out;
  out.reserve(text.size());
  size_t pos = 0;
  while (pos < text.size()) {
    size_t end = pos;
    bool ascii = true;
    while (end < text.size()) {
      const Utf8Char c = DecodeUtf8(text, end);
      if (!c.valid()) break;
      ascii = ascii && c.cp < 0x80;
      end += static_cast<size_t>(c.length);
    }
    if (ascii) {  // NFC leaves ASCII alone
      out.append(text.data() + pos, end - pos);
    } else {
      utf8proc_uint8_t* mapped = nullptr;
      const utf8proc_ssize_t n =
          utf8proc_map(reinterpret_cast<const utf8proc_uint8_t*>(text.data() + pos),
                       static_cast<utf8proc_ssize_t>(end - pos), &mapped,
                       static_cast<utf8proc_option_t>(UTF8PROC_STABLE | UTF8PROC_COMPOSE));
      if (n >= 0) {
        out.append(reinterpret_cast<const char*>(mapped), static_cast<size_t>(n));
      } else {  // not reached for well-formed input; keep the text rather than lose it
        out.append(text.data() + pos, end - pos);
      }
      std::free(mapped);
    }
    while (end < text.size()) {
      const Utf8Char c = DecodeUtf8(text, end);
      if (c.valid()) break;
      out.append(text.data() + end, static_cast<size_t>(c.length));
      end += static_cast<size_t>(c.length);
    }
    pos = end;
  }
  return out;
}

// Parses JSON without exceptions. `duplicate_key_depth` > 0: records the keys of objects at that
// nesting depth, to reject duplicates (a JSON parser silently keeps one of them).
Json ParseJson(absl::string_view text, int duplicate_key_depth, std::vector<std::string>* keys) {
  Json::parser_callback_t on_event = [&](int depth, Json::parse_event_t event, Json& parsed) {
    if (keys != nullptr && event == Json::parse_event_t::key && depth == duplicate_key_depth &&
        parsed.is_string()) {
      keys->push_back(parsed.get<std::string>());
    }
    return true;
  };
  return Json::parse(text.begin(), text.end(), on_event, /*allow_exceptions=*/false);
}

// The member `key` of object `j`, or nullptr.
const Json* Member(const Json& j, absl::string_view key) {
  if (!j.is_object()) return nullptr;
  const auto it = j.find(std::string(key));
  return it == j.end() ? nullptr : &*it;
}

bool IsNullOrAbsent(const Json* j) { return j == nullptr || j->is_null(); }

}  // namespace

// ---------------------------------------------------------------------------------------------
// ByteTokenizer.

absl::Status ByteTokenizer::Encode(absl::string_view text, std::vector<uint32_t>* out) {
  out->reserve(out->size() + text.size());
  for (const char c : text) out->push_back(static_cast<uint8_t>(c));
  return absl::OkStatus();
}

absl::StatusOr<std::string> ByteTokenizer::Decode(absl::Span<const uint32_t> tokens) const {
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
// BPE.

std::vector<absl::string_view> Gpt2PreTokenize(absl::string_view text) {
  std::vector<absl::string_view> pieces;
  PreTokenize(SplitPattern::kGpt2, text, &pieces);
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

absl::Status BpeTokenizer::IndexBytes(
    const std::function<absl::Status(absl::string_view)>& vocab_error) {
  const std::array<uint32_t, 256> cps = ByteToCodePoint();
  for (int b = 0; b < 256; ++b) {
    const std::string& symbol = Gpt2ByteToUnicode()[b];
    const auto it = token_to_id_.find(symbol);
    if (it == token_to_id_.end()) {
      return vocab_error(absl::StrCat("the symbol '", symbol, "' of byte ", b,
                                      " is missing; a byte-level BPE vocabulary has all 256"));
    }
    byte_to_id_[b] = it->second;
    char_to_byte_[cps[b]] = static_cast<uint8_t>(b);
  }
  return absl::OkStatus();
}

absl::StatusOr<std::unique_ptr<BpeTokenizer>> BpeTokenizer::LoadGpt2(
    const std::string& vocab_path, const std::string& merges_path) {
  ASSIGN_OR_RETURN(const std::string vocab, ReadFile(vocab_path, "vocabulary file"));
  ASSIGN_OR_RETURN(const std::string merges, ReadFile(merges_path, "merges file"));
  return FromGpt2Contents(vocab, merges, absl::StrCat("'", vocab_path, "'"),
                          absl::StrCat("'", merges_path, "'"));
}

absl::StatusOr<std::unique_ptr<BpeTokenizer>> BpeTokenizer::FromGpt2Contents(
    absl::string_view vocab_json, absl::string_view merges_txt, absl::string_view vocab_name,
    absl::string_view merges_name) {
  auto vocab_error = [&](absl::string_view what) {
    return absl::InvalidArgumentError(absl::StrCat("vocabulary ", vocab_name, ": ", what));
  };
  std::unique_ptr<BpeTokenizer> tok(new BpeTokenizer());
  tok->kind_ = "gpt2-bpe";
  tok->splits_ = {SplitPattern::kGpt2};

  // vocab.json: {"token": id, ...}.
  std::vector<std::string> keys;
  const Json vocab = ParseJson(vocab_json, 1, &keys);
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
    if (!value.is_number_unsigned() || value.get<uint64_t>() > kMaxTokenId) {
      return vocab_error(absl::StrCat("the id of token '", token, "' is ", value.dump(),
                                      "; ids must be integers in [0, ", kMaxTokenId, "]"));
    }
    if (token.empty()) return vocab_error("has an empty token");
    const auto id = value.get<uint32_t>();
    max_id = std::max<int64_t>(max_id, id);
    const auto [where, inserted] = tok->id_to_token_.try_emplace(id, token);
    if (!inserted) {
      return vocab_error(
          absl::StrCat("tokens '", where->second, "' and '", token, "' have the same id ", id));
    }
    tok->token_to_id_[token] = id;
  }
  tok->vocab_size_ = max_id + 1;
  RETURN_IF_ERROR(tok->IndexBytes(vocab_error));
  tok->document_token_ = tok->TokenId("<|endoftext|>");

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
    uint32_t ids[2];
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
    if (!inserted) return merges_error(absl::StrCat("duplicate of line ", where->second));
    tok->merges_[key] = Merge{rank++, merged_it->second};
  }
  return tok;
}

absl::StatusOr<std::unique_ptr<BpeTokenizer>> BpeTokenizer::LoadTokenizerJson(
    const std::string& path) {
  ASSIGN_OR_RETURN(const std::string json, ReadFile(path, "tokenizer file"));
  return FromTokenizerJson(json, absl::StrCat("'", path, "'"));
}

// --- tokenizer.json, one section at a time -------------------------------------------------

namespace data_internal {

// BpeTokenizer::FromTokenizerJson's steps, one per section of the file, run in the file's order of
// checks (the first error found is the one reported): the model (its options, vocab and merges),
// the normalizer, the pre-tokenizer, the decoder, the added tokens and the post-processor. Each
// step validates its section and fills the parts of the tokenizer it owns; a friend of
// BpeTokenizer.
class TokenizerJsonReader {
 public:
  // `name` appears in error messages; `tok` is filled by Read().
  TokenizerJsonReader(absl::string_view name, BpeTokenizer& tok) : name_(name), tok_(tok) {}

  absl::Status Read(absl::string_view json_text);

 private:
  // A section's added token before its id is checked: the token and the id the file gives it.
  struct AddedTokenEntry {
    BpeTokenizer::AddedToken token;
    const Json* id;
  };

  // InvalidArgument naming the file and `key`.
  absl::Status Error(absl::string_view key, absl::string_view what) const {
    return absl::InvalidArgumentError(absl::StrCat("tokenizer ", name_, ": ", key, ": ", what));
  }
  absl::Status Unsupported(absl::string_view key, const Json& value,
                           absl::string_view supported) const {
    return Error(key, absl::StrCat(value.dump(), " is not supported (supported: ", supported, ")"));
  }

  // model.type, dropout, byte_fallback, continuing_subword_prefix, end_of_word_suffix and
  // ignore_merges.
  absl::Status ReadModelOptions(const Json& model);
  // model.vocab into the vocabulary and the byte index; returns its largest id.
  absl::StatusOr<int64_t> ReadVocab(const Json& model);
  // model.merges ("a b" or ["a", "b"]), ranked in file order.
  absl::Status ReadMerges(const Json& model);
  absl::Status ReadNormalizer(const Json& root);
  // pre_tokenizer: a ByteLevel step, or a Sequence of Split steps ending with ByteLevel.
  absl::Status ReadPreTokenizer(const Json& root);
  absl::Status ReadByteLevelStep(const std::string& key, const Json& step);
  absl::Status ReadSplitStep(const std::string& key, const Json& step);
  absl::Status ReadDecoder(const Json& root);
  // added_tokens, with the ids the library gives them (tokenizers' AddedVocabulary::add_tokens);
  // returns the largest added id, or -1.
  absl::StatusOr<int64_t> ReadAddedTokens(const Json& root, uint32_t model_vocab_len);
  absl::StatusOr<AddedTokenEntry> ReadAddedToken(const std::string& key, const Json& a) const;
  // The id the tokenizers library gives added token `text`: its model.vocab id, or the next id
  // after the vocabulary and the added tokens so far (largest `max_added`, -1 for none).
  uint32_t LibraryAddedId(const std::string& text, int64_t max_added,
                          uint32_t model_vocab_len) const;
  // post_processor: the document token (TemplateProcessing's first special token).
  absl::Status ReadPostProcessor(const Json& root);

  const absl::string_view name_;
  BpeTokenizer& tok_;
};

absl::Status TokenizerJsonReader::Read(absl::string_view json_text) {
  const Json root = ParseJson(json_text, 0, nullptr);
  if (root.is_discarded()) return Error("(file)", "not valid JSON (or not valid UTF-8)");
  if (!root.is_object()) return Error("(file)", "not a JSON object");
  const Json* model = Member(root, "model");
  if (model == nullptr || !model->is_object()) {
    return Error("model",
                 "missing or not an object; this is not a Hugging Face tokenizer.json "
                 "(GPT-2's vocab.json and merges.txt go to --vocab and --merges)");
  }
  RETURN_IF_ERROR(ReadModelOptions(*model));
  ASSIGN_OR_RETURN(const int64_t max_id, ReadVocab(*model));
  RETURN_IF_ERROR(ReadMerges(*model));
  RETURN_IF_ERROR(ReadNormalizer(root));
  RETURN_IF_ERROR(ReadPreTokenizer(root));
  RETURN_IF_ERROR(ReadDecoder(root));
  const auto model_vocab_len = static_cast<uint32_t>(Member(*model, "vocab")->size());
  ASSIGN_OR_RETURN(const int64_t max_added, ReadAddedTokens(root, model_vocab_len));
  tok_.vocab_size_ = std::max(max_id, max_added) + 1;
  RETURN_IF_ERROR(ReadPostProcessor(root));
  if (!tok_.document_token_.has_value()) tok_.document_token_ = tok_.TokenId("<|endoftext|>");
  return absl::OkStatus();
}

absl::Status TokenizerJsonReader::ReadModelOptions(const Json& model) {
  const Json* type = Member(model, "type");
  if (type != nullptr && *type != "BPE") {
    return Unsupported("model.type", *type,
                       "\"BPE\"; for SentencePiece models use tokenizer.model");
  }
  if (const Json* v = Member(model, "dropout"); !IsNullOrAbsent(v)) {
    return Unsupported("model.dropout", *v, "null");
  }
  if (const Json* v = Member(model, "byte_fallback"); !IsNullOrAbsent(v) && *v != false) {
    return Unsupported("model.byte_fallback", *v, "false: byte-level BPE needs no byte fallback");
  }
  for (const char* key : {"continuing_subword_prefix", "end_of_word_suffix"}) {
    if (const Json* v = Member(model, key); !IsNullOrAbsent(v) && *v != "") {
      return Unsupported(absl::StrCat("model.", key), *v, "null");
    }
  }
  if (const Json* v = Member(model, "ignore_merges"); !IsNullOrAbsent(v)) {
    if (!v->is_boolean()) return Error("model.ignore_merges", "not a boolean");
    tok_.ignore_merges_ = v->get<bool>();
  }
  return absl::OkStatus();
}

absl::StatusOr<int64_t> TokenizerJsonReader::ReadVocab(const Json& model) {
  const Json* vocab = Member(model, "vocab");
  if (vocab == nullptr || !vocab->is_object() || vocab->empty()) {
    return Error("model.vocab", "missing, empty or not an object of token -> id");
  }
  int64_t max_id = -1;
  for (const auto& [token, value] : vocab->items()) {
    if (!value.is_number_unsigned() || value.get<uint64_t>() > kMaxTokenId) {
      return Error("model.vocab", absl::StrCat("the id of token '", token, "' is ", value.dump(),
                                               "; ids must be integers in [0, ", kMaxTokenId, "]"));
    }
    if (token.empty()) return Error("model.vocab", "has an empty token");
    const auto id = value.get<uint32_t>();
    max_id = std::max<int64_t>(max_id, id);
    const auto [where, inserted] = tok_.id_to_token_.try_emplace(id, token);
    if (!inserted) {
      return Error("model.vocab", absl::StrCat("tokens '", where->second, "' and '", token,
                                               "' have the same id ", id));
    }
    tok_.token_to_id_[token] = id;
  }
  RETURN_IF_ERROR(
      tok_.IndexBytes([&](absl::string_view what) { return Error("model.vocab", what); }));
  return max_id;
}

absl::Status TokenizerJsonReader::ReadMerges(const Json& model) {
  const Json* merges = Member(model, "merges");
  if (merges == nullptr || !merges->is_array()) {
    return Error("model.merges", "missing or not an array");
  }
  for (size_t i = 0; i < merges->size(); ++i) {
    const Json& m = (*merges)[i];
    const std::string key = absl::StrCat("model.merges[", i, "]");
    std::string parts[2];
    if (m.is_string()) {
      const std::string line = m.get<std::string>();
      const std::vector<std::string> split = absl::StrSplit(line, ' ');
      if (split.size() != 2 || split[0].empty() || split[1].empty()) {
        return Error(key, absl::StrCat("'", line, "' is not two symbols separated by one space"));
      }
      parts[0] = split[0];
      parts[1] = split[1];
    } else if (m.is_array() && m.size() == 2 && m[0].is_string() && m[1].is_string()) {
      parts[0] = m[0].get<std::string>();
      parts[1] = m[1].get<std::string>();
    } else {
      return Error(key, absl::StrCat(m.dump(), " is neither \"a b\" nor [\"a\", \"b\"]"));
    }
    uint32_t ids[2];
    for (int p = 0; p < 2; ++p) {
      const auto it = tok_.token_to_id_.find(parts[p]);
      if (it == tok_.token_to_id_.end()) {
        return Error(key, absl::StrCat("symbol '", parts[p], "' is not in model.vocab"));
      }
      ids[p] = it->second;
    }
    const std::string merged = parts[0] + parts[1];
    const auto merged_it = tok_.token_to_id_.find(merged);
    if (merged_it == tok_.token_to_id_.end()) {
      return Error(key, absl::StrCat("the merged symbol '", merged, "' is not in model.vocab"));
    }
    // A repeated merge keeps its first (highest) rank.
    tok_.merges_.try_emplace(BpeTokenizer::PairKey(ids[0], ids[1]),
                             BpeTokenizer::Merge{static_cast<uint32_t>(i), merged_it->second});
  }
  return absl::OkStatus();
}

absl::Status TokenizerJsonReader::ReadNormalizer(const Json& root) {
  if (const Json* n = Member(root, "normalizer"); !IsNullOrAbsent(n)) {
    const Json* t = Member(*n, "type");
    if (t == nullptr || *t != "NFC") return Unsupported("normalizer", *n, "null or NFC");
    tok_.nfc_ = true;
  }
  return absl::OkStatus();
}

absl::Status TokenizerJsonReader::ReadPreTokenizer(const Json& root) {
  const Json* pre = Member(root, "pre_tokenizer");
  if (IsNullOrAbsent(pre)) {
    return Error("pre_tokenizer", "missing; byte-level BPE needs a ByteLevel pre-tokenizer");
  }
  std::vector<std::pair<std::string, const Json*>> steps;
  const Json* t = Member(*pre, "type");
  if (t != nullptr && *t == "Sequence") {
    const Json* list = Member(*pre, "pretokenizers");
    if (list == nullptr || !list->is_array()) {
      return Error("pre_tokenizer.pretokenizers", "missing or not an array");
    }
    for (size_t i = 0; i < list->size(); ++i) {
      steps.emplace_back(absl::StrCat("pre_tokenizer.pretokenizers[", i, "]"), &(*list)[i]);
    }
  } else {
    steps.emplace_back("pre_tokenizer", pre);
  }
  bool byte_level = false;
  for (const auto& [key, step] : steps) {
    const Json* st = Member(*step, "type");
    if (byte_level) {
      return Error(key,
                   "ByteLevel must be the last pre-tokenizer (supported: [Split...,] "
                   "ByteLevel)");
    }
    if (st != nullptr && *st == "ByteLevel") {
      byte_level = true;
      RETURN_IF_ERROR(ReadByteLevelStep(key, *step));
    } else if (st != nullptr && *st == "Split") {
      RETURN_IF_ERROR(ReadSplitStep(key, *step));
    } else {
      return Unsupported(key, *step, "ByteLevel, or a Sequence of Split and ByteLevel");
    }
  }
  if (!byte_level) {
    return Error("pre_tokenizer", "has no ByteLevel step; only byte-level BPE is supported");
  }
  return absl::OkStatus();
}

absl::Status TokenizerJsonReader::ReadByteLevelStep(const std::string& key, const Json& step) {
  if (const Json* v = Member(step, "add_prefix_space"); !IsNullOrAbsent(v) && *v != false) {
    return Unsupported(absl::StrCat(key, ".add_prefix_space"), *v, "false");
  }
  const Json* use_regex = Member(step, "use_regex");
  if (IsNullOrAbsent(use_regex) || *use_regex == true) {
    tok_.splits_.push_back(SplitPattern::kGpt2);
  }
  return absl::OkStatus();
}

absl::Status TokenizerJsonReader::ReadSplitStep(const std::string& key, const Json& step) {
  const Json* pattern = Member(step, "pattern");
  const Json* regex = pattern == nullptr ? nullptr : Member(*pattern, "Regex");
  if (regex == nullptr || !regex->is_string()) {
    return Error(absl::StrCat(key, ".pattern"), "only {\"Regex\": ...} patterns are supported");
  }
  const std::optional<SplitPattern> known = RecognizeSplitPattern(regex->get<std::string>());
  if (!known.has_value()) {
    return Error(absl::StrCat(key, ".pattern.Regex"),
                 absl::StrCat(regex->dump(),
                              " is not a known pattern (supported: GPT-2's, "
                              "Llama-3's and Qwen2's pre-tokenizer regex)"));
  }
  if (const Json* v = Member(step, "behavior"); v == nullptr || *v != "Isolated") {
    return Unsupported(absl::StrCat(key, ".behavior"), v ? *v : Json(), "\"Isolated\"");
  }
  if (const Json* v = Member(step, "invert"); !IsNullOrAbsent(v) && *v != false) {
    return Unsupported(absl::StrCat(key, ".invert"), *v, "false");
  }
  tok_.splits_.push_back(*known);
  return absl::OkStatus();
}

absl::Status TokenizerJsonReader::ReadDecoder(const Json& root) {
  if (const Json* d = Member(root, "decoder"); !IsNullOrAbsent(d)) {
    const Json* t = Member(*d, "type");
    if (t == nullptr || *t != "ByteLevel") return Unsupported("decoder", *d, "null or ByteLevel");
  }
  return absl::OkStatus();
}

absl::StatusOr<int64_t> TokenizerJsonReader::ReadAddedTokens(const Json& root,
                                                             uint32_t model_vocab_len) {
  int64_t max_added = -1;
  const Json* added = Member(root, "added_tokens");
  if (IsNullOrAbsent(added)) return max_added;
  if (!added->is_array()) return Error("added_tokens", "not an array");
  for (size_t i = 0; i < added->size(); ++i) {
    const std::string key = absl::StrCat("added_tokens[", i, "]");
    ASSIGN_OR_RETURN(AddedTokenEntry entry, ReadAddedToken(key, (*added)[i]));
    BpeTokenizer::AddedToken& token = entry.token;
    const std::string& text = token.content;
    const uint32_t expected = LibraryAddedId(text, max_added, model_vocab_len);
    if (entry.id->get<uint64_t>() != expected) {
      return Error(absl::StrCat(key, ".id"),
                   absl::StrCat("'", text, "' has id ", entry.id->dump(),
                                " but the tokenizers library gives it ", expected,
                                " (its model.vocab id, or the next id after the ", model_vocab_len,
                                " vocabulary entries); the file is "
                                "inconsistent"));
    }
    token.id = expected;
    if (tok_.added_by_id_.contains(expected)) continue;  // the library keeps the first
    max_added = std::max<int64_t>(max_added, expected);
    tok_.added_by_first_byte_[static_cast<uint8_t>(text[0])].push_back(tok_.added_.size());
    tok_.added_by_id_[expected] = tok_.added_.size();
    tok_.added_.push_back(std::move(token));
  }
  return max_added;
}

absl::StatusOr<TokenizerJsonReader::AddedTokenEntry> TokenizerJsonReader::ReadAddedToken(
    const std::string& key, const Json& a) const {
  const Json* content = Member(a, "content");
  const Json* id = Member(a, "id");
  if (content == nullptr || !content->is_string() || content->get<std::string>().empty()) {
    return Error(absl::StrCat(key, ".content"), "missing, empty or not a string");
  }
  const std::string text = content->get<std::string>();
  if (id == nullptr || !id->is_number_unsigned() || id->get<uint64_t>() > kMaxTokenId) {
    return Error(absl::StrCat(key, ".id"),
                 absl::StrCat("missing or not an integer in [0, ", kMaxTokenId, "]"));
  }
  for (const char* flag : {"single_word", "lstrip", "rstrip"}) {
    if (const Json* v = Member(a, flag); !IsNullOrAbsent(v) && *v != false) {
      return Unsupported(absl::StrCat(key, ".", flag, " ('", text, "')"), *v, "false");
    }
  }
  BpeTokenizer::AddedToken token{text, 0, false, true};
  if (const Json* v = Member(a, "special"); v != nullptr && v->is_boolean()) {
    token.special = v->get<bool>();
  }
  if (const Json* v = Member(a, "normalized"); v != nullptr && v->is_boolean()) {
    token.normalized = v->get<bool>();
  } else {
    token.normalized = !token.special;
  }
  return AddedTokenEntry{std::move(token), id};
}

uint32_t TokenizerJsonReader::LibraryAddedId(const std::string& text, int64_t max_added,
                                             uint32_t model_vocab_len) const {
  if (const auto it = tok_.token_to_id_.find(text); it != tok_.token_to_id_.end()) {
    return it->second;
  }
  if (max_added < 0) return model_vocab_len;
  return static_cast<uint64_t>(max_added) >= model_vocab_len || model_vocab_len == 0
             ? static_cast<uint32_t>(max_added + 1)
             : model_vocab_len;
}

absl::Status TokenizerJsonReader::ReadPostProcessor(const Json& root) {
  const Json* p = Member(root, "post_processor");
  if (IsNullOrAbsent(p)) return absl::OkStatus();
  const Json* t = Member(*p, "type");
  const Json* single = Member(*p, "single");
  if (t != nullptr && *t == "TemplateProcessing" && single != nullptr && single->is_array() &&
      !single->empty()) {
    const Json* special = Member((*single)[0], "SpecialToken");
    const Json* special_name = special == nullptr ? nullptr : Member(*special, "id");
    if (special_name != nullptr && special_name->is_string()) {
      const std::optional<uint32_t> bos = tok_.TokenId(special_name->get<std::string>());
      if (!bos.has_value()) {
        return Error("post_processor.single[0].SpecialToken.id",
                     absl::StrCat(special_name->dump(), " is not a token of this tokenizer"));
      }
      tok_.document_token_ = bos;
    }
  }
  return absl::OkStatus();
}

}  // namespace data_internal

absl::StatusOr<std::unique_ptr<BpeTokenizer>> BpeTokenizer::FromTokenizerJson(
    absl::string_view json_text, absl::string_view name) {
  std::unique_ptr<BpeTokenizer> tok(new BpeTokenizer());
  tok->kind_ = "tokenizer.json";
  RETURN_IF_ERROR(data_internal::TokenizerJsonReader(name, *tok).Read(json_text));
  return tok;
}

std::string BpeTokenizer::name() const {
  std::vector<std::string> patterns;
  for (const SplitPattern p : splits_) patterns.emplace_back(SplitPatternName(p));
  return absl::StrCat(kind_, " (", absl::StrJoin(patterns, "+"), " pre-tokenizer",
                      nfc_ ? ", NFC" : "", ignore_merges_ ? ", ignore_merges" : "", ")");
}

std::optional<uint32_t> BpeTokenizer::TokenId(absl::string_view token) const {
  for (const AddedToken& a : added_) {
    if (a.content == token) return a.id;
  }
  const auto it = token_to_id_.find(token);
  if (it == token_to_id_.end()) return std::nullopt;
  return it->second;
}

void BpeTokenizer::SplitAddedTokens(absl::string_view text, bool normalized,
                                    std::vector<std::pair<absl::string_view, int>>* out) const {
  size_t start = 0;  // of the current ordinary segment
  size_t pos = 0;
  while (pos < text.size()) {
    // Leftmost-longest, over all added tokens of this kind; a special token that is not parsed
    // still takes its match (as the library), which then stays ordinary text.
    int best = -1;
    for (const size_t i : added_by_first_byte_[static_cast<uint8_t>(text[pos])]) {
      const AddedToken& a = added_[i];
      if (a.normalized != normalized) continue;
      if (!absl::StartsWith(text.substr(pos), a.content)) continue;
      if (best < 0 || a.content.size() > added_[best].content.size()) best = static_cast<int>(i);
    }
    if (best < 0) {
      ++pos;
      continue;
    }
    const size_t end = pos + added_[best].content.size();
    if (added_[best].special && !parse_special_tokens_) {
      pos = end;
      continue;
    }
    if (pos > start) out->emplace_back(text.substr(start, pos - start), -1);
    out->emplace_back(text.substr(pos, end - pos), best);
    start = pos = end;
  }
  if (start < text.size()) out->emplace_back(text.substr(start), -1);
}

absl::Status BpeTokenizer::Encode(absl::string_view text, std::vector<uint32_t>* out) {
  if (added_.empty() && !nfc_) {
    EncodeOrdinary(text, out);
    return absl::OkStatus();
  }
  std::vector<std::pair<absl::string_view, int>> raw, normalized;
  SplitAddedTokens(text, /*normalized=*/false, &raw);
  for (const auto& [segment, added] : raw) {
    if (added >= 0) {
      out->push_back(added_[added].id);
      continue;
    }
    const std::string nfc = nfc_ ? Nfc(segment) : std::string();
    const absl::string_view norm = nfc_ ? absl::string_view(nfc) : segment;
    normalized.clear();
    SplitAddedTokens(norm, /*normalized=*/true, &normalized);
    for (const auto& [piece, added2] : normalized) {
      if (added2 >= 0) {
        out->push_back(added_[added2].id);
      } else {
        EncodeOrdinary(piece, out);
      }
    }
  }
  return absl::OkStatus();
}

void BpeTokenizer::EncodeOrdinary(absl::string_view text, std::vector<uint32_t>* out) {
  std::vector<absl::string_view> pieces = {text}, next;
  for (const SplitPattern pattern : splits_) {
    next.clear();
    for (const absl::string_view p : pieces) PreTokenize(pattern, p, &next);
    pieces.swap(next);
  }
  for (const absl::string_view piece : pieces) {
    if (piece.empty()) continue;
    const auto it = cache_.find(piece);
    if (it != cache_.end()) {
      out->insert(out->end(), it->second.begin(), it->second.end());
      continue;
    }
    std::vector<uint32_t> ids;
    EncodePiece(piece, &ids);
    out->insert(out->end(), ids.begin(), ids.end());
    if (cache_.size() >= kMaxCacheEntries) cache_.clear();
    cache_.emplace(piece, std::move(ids));
  }
}

void BpeTokenizer::EncodePiece(absl::string_view piece, std::vector<uint32_t>* out) const {
  const int n = static_cast<int>(piece.size());
  if (n == 0) return;
  if (ignore_merges_) {
    std::string symbols;
    for (const char c : piece) symbols += Gpt2ByteToUnicode()[static_cast<uint8_t>(c)];
    const auto it = token_to_id_.find(symbols);
    if (it != token_to_id_.end()) {
      out->push_back(it->second);
      return;
    }
  }
  // A doubly linked list of symbols; merging keeps the left node, so node indices stay in text
  // order.
  std::vector<uint32_t> sym(n);
  std::vector<int> prev(n), next(n);
  for (int i = 0; i < n; ++i) {
    sym[i] = byte_to_id_[static_cast<uint8_t>(piece[i])];
    prev[i] = i - 1;
    next[i] = i + 1 < n ? i + 1 : -1;
  }
  struct Candidate {
    uint32_t rank;
    int left;
    uint32_t left_sym, right_sym;
  };
  // A min-heap on (rank, left): the lowest rank first, leftmost first within it. A merge never
  // creates a pair of its own rank (the merged symbol is longer than either part), so merging
  // every occurrence of one rank left to right is the same as the library's one-at-a-time heap.
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
      sym[right] = std::numeric_limits<uint32_t>::max();
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

absl::StatusOr<std::string> BpeTokenizer::Decode(absl::Span<const uint32_t> tokens) const {
  std::string text;
  for (size_t i = 0; i < tokens.size(); ++i) {
    const uint32_t id = tokens[i];
    if (const auto added = added_by_id_.find(id); added != added_by_id_.end()) {
      text += added_[added->second].content;
      continue;
    }
    const auto it = id_to_token_.find(id);
    if (it == id_to_token_.end()) {
      return absl::InvalidArgumentError(
          absl::StrCat("token ", id, " at position ", i, " is not in the vocabulary"));
    }
    const std::string& token = it->second;
    for (size_t pos = 0; pos < token.size();) {
      const Utf8Char c = DecodeUtf8(token, pos);
      const auto byte = char_to_byte_.find(c.cp);
      if (byte == char_to_byte_.end()) {
        return absl::InvalidArgumentError(absl::StrCat(
            "token ", id, " ('", token, "') at position ", i,
            " has a character outside GPT-2's byte alphabet; it cannot be decoded to bytes"));
      }
      text.push_back(static_cast<char>(byte->second));
      pos += static_cast<size_t>(c.length);
    }
  }
  return text;
}

}  // namespace ps
