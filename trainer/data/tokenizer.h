// Tokenizers that turn text into the token ids of llm.c token files (trainer/data/token_file.h).
//
// ByteTokenizer: every byte is one token (vocabulary 256). Lossless for any input.
//
// BpeTokenizer: byte-level BPE (GPT-2, Llama-3, Qwen2), from either
//   - GPT-2's `vocab.json` (token string -> id) and `merges.txt` (one merge "left right" per line,
//     highest priority first; an optional first line "#version: ..."), pre-tokenized with GPT-2's
//     pattern; or
//   - a Hugging Face `tokenizer.json` (see "tokenizer.json" below).
// Encoding, as the Hugging Face `tokenizers` library's `encode(text, add_special_tokens=False)`:
//   1. Added tokens (tokenizer.json's `added_tokens`) are cut out of the text, leftmost-longest
//      first: those with "normalized": false from the raw text, then those with "normalized":
//      true from the normalized rest. Special ones ("special": true) only with
//      set_parse_special_tokens(true); by default "<|endoftext|>" in the text is ordinary text, as
//      llm.c's data scripts encode (`encode_ordinary`, `split_special_tokens=True`).
//   2. The rest is normalized (NFC, if the normalizer says so) and pre-tokenized by the regex
//      pattern(s) of the file (internal/pre_tokenize.h: GPT-2's, Llama-3's, Qwen2's).
//   3. Each piece's UTF-8 bytes are mapped to GPT-2's printable stand-in characters
//      (bytes_to_unicode: '!'..'~', '¡'..'¬', '®'..'ÿ' stand for themselves, the other 68 bytes
//      for U+0100 upward in byte order; a space becomes 'Ġ').
//   4. With "ignore_merges": true, a piece that is a vocabulary entry is that one token. Otherwise
//      BPE: starting from one symbol per byte, repeatedly merge the adjacent pair whose merge
//      comes first, leftmost first (a heap, O(n log n) per piece). Pieces are cached.
//   5. Each final symbol's id is looked up in the vocabulary.
// Decoding maps each vocabulary token's stand-in characters back to bytes; an added token decodes
// to its text.
//
// tokenizer.json: what is supported, exactly. Everything else is refused with InvalidArgument
// naming the file and the key, never skipped:
//   model:          {"type": "BPE", "vocab": {token: id}, "merges": ["a b", ...] or [["a", "b"],
//                   ...], "ignore_merges": bool (absent = false)}, with "dropout" null,
//                   "continuing_subword_prefix" and "end_of_word_suffix" null or "",
//                   "byte_fallback" false ("unk_token" and "fuse_unk" are accepted: a byte-level
//                   vocabulary has every byte, so no unknown token can arise).
//   normalizer:     null or {"type": "NFC"} (utf8proc; applied to each well-formed UTF-8 run).
//   pre_tokenizer:  {"type": "ByteLevel", "add_prefix_space": false, "use_regex": true|false}, or
//                   {"type": "Sequence", "pretokenizers": [Split..., ByteLevel]} where each Split
//                   is {"pattern": {"Regex": one of the three patterns}, "behavior": "Isolated",
//                   "invert": false}.
//   decoder:        null or {"type": "ByteLevel"}.
//   post_processor: ignored for encoding (nothing is added); a TemplateProcessing whose "single"
//                   starts with a special token names the document token (below).
//   added_tokens:   [{"id", "content", "special", "normalized", "single_word": false,
//                   "lstrip": false, "rstrip": false}]; each id must be the one the library gives
//                   it (the content's vocabulary id, or the next id after the vocabulary's size).
// The document token (llm.c's convention of one token in front of every document): the
// TemplateProcessing's leading special token (Llama-3's <|begin_of_text|>), else "<|endoftext|>"
// if the vocabulary has it (GPT-2, Qwen2).
//
// Limits, documented rather than hidden:
//   - \p{L} / \p{N} are Unicode 16.0's general categories L and N, \s the White_Space property
//     (internal/unicode_classes.h), as the `tokenizers` library 0.23 classifies them.
//   - Bytes that are not well-formed UTF-8 (which the Python library cannot be given) are single
//     characters of the "other" class; they are encoded byte-exactly and NFC leaves them alone.
//
// Errors when loading: NotFound for missing files; InvalidArgument for malformed files, naming
// the file and the line, token or key.
//
// Thread safety: Encode() updates a cache: one thread per tokenizer object. Const methods may be
// called concurrently.
#ifndef PATRICKSTAR_TRAINER_DATA_TOKENIZER_H_
#define PATRICKSTAR_TRAINER_DATA_TOKENIZER_H_

#include <array>
#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "absl/types/span.h"
#include "trainer/data/internal/pre_tokenize.h"

namespace ps {
namespace data_internal {
class TokenizerJsonReader;  // BpeTokenizer::FromTokenizerJson's steps (tokenizer.cc)
}  // namespace data_internal

class Tokenizer {
 public:
  virtual ~Tokenizer() = default;

  // What it is, for messages: "byte", "gpt2-bpe", "tokenizer.json (llama3 pattern)", ...
  virtual std::string name() const = 0;
  // Every id Encode() produces is < vocab_size().
  virtual int64_t vocab_size() const = 0;
  // Appends the tokens of `text` (any bytes) to `out`. Errors: only from an underlying library
  // (SentencePiece), with its message.
  [[nodiscard]] virtual absl::Status Encode(absl::string_view text, std::vector<uint32_t>* out) = 0;
  // The text of `tokens`. Errors: InvalidArgument naming the first id that is not in the
  // vocabulary or has no byte decoding, and its position.
  [[nodiscard]] virtual absl::StatusOr<std::string> Decode(
      absl::Span<const uint32_t> tokens) const = 0;
  // The id of the token spelled `token` in the vocabulary (as the vocabulary spells it, e.g.
  // "Ġthe", "<|endoftext|>", "<s>"), if present.
  virtual std::optional<uint32_t> TokenId(absl::string_view token) const = 0;
  // The token llm.c's data scripts put in front of every document (see each class), if any.
  virtual std::optional<uint32_t> document_token() const = 0;
};

class ByteTokenizer final : public Tokenizer {
 public:
  std::string name() const override { return "byte"; }
  int64_t vocab_size() const override { return 256; }
  absl::Status Encode(absl::string_view text, std::vector<uint32_t>* out) override;
  absl::StatusOr<std::string> Decode(absl::Span<const uint32_t> tokens) const override;
  std::optional<uint32_t> TokenId(absl::string_view) const override { return std::nullopt; }
  std::optional<uint32_t> document_token() const override { return std::nullopt; }
};

// GPT-2's pre-tokenization: the pieces, in order, as views into `text`; their concatenation is
// `text`.
std::vector<absl::string_view> Gpt2PreTokenize(absl::string_view text);

// GPT-2's bytes_to_unicode: for each byte, the UTF-8 encoding of its stand-in character.
const std::array<std::string, 256>& Gpt2ByteToUnicode();

class BpeTokenizer final : public Tokenizer {
 public:
  // Reads and validates GPT-2's vocab.json and merges.txt.
  [[nodiscard]] static absl::StatusOr<std::unique_ptr<BpeTokenizer>> LoadGpt2(
      const std::string& vocab_path, const std::string& merges_path);
  // The same from the files' contents; `vocab_name` and `merges_name` appear in error messages.
  [[nodiscard]] static absl::StatusOr<std::unique_ptr<BpeTokenizer>> FromGpt2Contents(
      absl::string_view vocab_json, absl::string_view merges_txt,
      absl::string_view vocab_name = "vocab.json", absl::string_view merges_name = "merges.txt");
  // Reads and validates a Hugging Face tokenizer.json (see the file comment).
  [[nodiscard]] static absl::StatusOr<std::unique_ptr<BpeTokenizer>> LoadTokenizerJson(
      const std::string& path);
  // The same from the file's contents; `name` appears in error messages.
  [[nodiscard]] static absl::StatusOr<std::unique_ptr<BpeTokenizer>> FromTokenizerJson(
      absl::string_view json, absl::string_view name = "tokenizer.json");

  std::string name() const override;
  // The largest id of the vocabulary and the added tokens, plus one (50257 for GPT-2, 128256 for
  // Llama-3).
  int64_t vocab_size() const override { return vocab_size_; }
  absl::Status Encode(absl::string_view text, std::vector<uint32_t>* out) override;
  absl::StatusOr<std::string> Decode(absl::Span<const uint32_t> tokens) const override;
  // Vocabulary entries and added tokens.
  std::optional<uint32_t> TokenId(absl::string_view token) const override;
  std::optional<uint32_t> document_token() const override { return document_token_; }

  // Whether special added tokens written in the text are recognized (default false).
  void set_parse_special_tokens(bool parse) { parse_special_tokens_ = parse; }
  int64_t num_merges() const { return static_cast<int64_t>(merges_.size()); }

 private:
  friend class data_internal::TokenizerJsonReader;

  struct Merge {
    uint32_t rank;
    uint32_t merged;
  };
  struct AddedToken {
    std::string content;
    uint32_t id;
    bool special;
    bool normalized;
  };
  BpeTokenizer() = default;
  // Fills byte_to_id_ and char_to_byte_ from the vocabulary; `vocab_error` names the file.
  absl::Status IndexBytes(const std::function<absl::Status(absl::string_view)>& vocab_error);
  // Cuts added tokens (those with `normalized` as given and, unless parse_special_tokens_, not
  // special) out of `text`: appends (segment, added token or -1) pairs.
  void SplitAddedTokens(absl::string_view text, bool normalized,
                        std::vector<std::pair<absl::string_view, int>>* out) const;
  // Normalizes, pre-tokenizes and BPE-encodes text without added tokens.
  void EncodeOrdinary(absl::string_view text, std::vector<uint32_t>* out);
  // BPE of one pre-tokenized piece, appended to `out`.
  void EncodePiece(absl::string_view piece, std::vector<uint32_t>* out) const;
  static uint64_t PairKey(uint32_t left, uint32_t right) { return (uint64_t{left} << 32) | right; }

  std::string kind_;  // "gpt2-bpe" or "tokenizer.json"
  int64_t vocab_size_ = 0;
  absl::flat_hash_map<std::string, uint32_t> token_to_id_;  // the model's vocabulary
  absl::flat_hash_map<uint32_t, std::string> id_to_token_;
  std::array<uint32_t, 256> byte_to_id_{};               // id of each byte's stand-in symbol
  absl::flat_hash_map<uint64_t, Merge> merges_;          // PairKey(left, right) -> merge
  absl::flat_hash_map<uint32_t, uint8_t> char_to_byte_;  // stand-in code point -> byte
  bool ignore_merges_ = false;
  bool nfc_ = false;
  std::vector<data_internal::SplitPattern> splits_;  // applied in order
  std::vector<AddedToken> added_;
  absl::flat_hash_map<uint32_t, size_t> added_by_id_;         // id -> index into added_
  std::array<std::vector<size_t>, 256> added_by_first_byte_;  // indices into added_
  bool parse_special_tokens_ = false;
  std::optional<uint32_t> document_token_;
  // Encoded pieces. Cleared when it reaches kMaxCacheEntries.
  static constexpr size_t kMaxCacheEntries = size_t{1} << 20;
  absl::flat_hash_map<std::string, std::vector<uint32_t>> cache_;
};

}  // namespace ps

#endif  // PATRICKSTAR_TRAINER_DATA_TOKENIZER_H_
