// Tokenizers that turn text into the uint16 tokens of llm.c token files
// (trainer/data/token_file.h).
//
// ByteTokenizer: every byte is one token (vocabulary 256). Lossless for any input.
//
// Gpt2BpeTokenizer: GPT-2's byte-level BPE from a Hugging Face/OpenAI `vocab.json` (token string ->
// id) and `merges.txt` (one merge "left right" per line, highest priority first; an optional
// first line "#version: ..."). Encoding, as OpenAI's encoder.py:
//   1. Pre-tokenization: the text is split by GPT-2's pattern
//        's|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+
//      (alternatives tried in order at each position, each greedy) — implemented by hand over
//      UTF-8 code points, not with a regex engine (Gpt2PreTokenize below).
//   2. Each piece's UTF-8 bytes are mapped to GPT-2's printable stand-in characters
//      (bytes_to_unicode: '!'..'~', '¡'..'¬', '®'..'ÿ' stand for themselves, the other 68 bytes
//      for U+0100 upward in byte order; a space becomes 'Ġ').
//   3. BPE: starting from one symbol per byte, repeatedly take the adjacent pair whose merge comes
//      first in merges.txt and merge all its occurrences left to right, until no pair has a merge.
//      (Implemented with a heap in O(n log n) per piece, processing one rank at a time, which gives
//      exactly encoder.py's result even for merges listed before the merges that create their
//      parts.) Pieces are cached.
//   4. Each final symbol's id is looked up in vocab.json.
//
// Limits, documented rather than hidden:
//   - \p{L} / \p{N} are Unicode 14.0's general categories L and N (generated tables, no locale,
//     no ICU); \s is the Unicode White_Space property. Python's `regex` module may use a different
//     Unicode version, and some engines also count U+001C..U+001F as \s; text with characters whose
//     class differs may split differently.
//   - Bytes that are not well-formed UTF-8 are single characters of the "other" class (as Python's
//     surrogateescape decoding would make them); they are encoded byte-exactly.
//   - Special tokens are not recognized in the text: "<|endoftext|>" in the input is encoded as
//     ordinary characters (tiktoken's `disallowed_special=()`). Use eot_token() to insert it.
//   - Ids must be < 65536 (the token file format stores uint16).
//
// Errors when loading: NotFound for missing files; InvalidArgument for malformed vocab.json
// (invalid JSON or UTF-8, not an object, a duplicate key, an id that is not an integer in
// [0, 65535], two tokens with one id, a missing byte symbol) or merges.txt (a line without exactly
// two space-separated symbols, a symbol or merged result missing from the vocabulary, a duplicate
// merge), naming the file and the line or token.
//
// Thread safety: Encode() updates a cache: one thread per tokenizer object. Const methods may be
// called concurrently.
#ifndef PATRICKSTAR_TRAINER_DATA_TOKENIZER_H_
#define PATRICKSTAR_TRAINER_DATA_TOKENIZER_H_

#include <array>
#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "absl/types/span.h"

namespace ps {

class Tokenizer {
 public:
  virtual ~Tokenizer() = default;

  // "byte" or "gpt2-bpe".
  virtual absl::string_view name() const = 0;
  // Every id Encode() produces is < vocab_size().
  virtual int64_t vocab_size() const = 0;
  // Appends the tokens of `text` (any bytes) to `out`.
  virtual void Encode(absl::string_view text, std::vector<uint16_t>* out) = 0;
  // The text of `tokens`. Errors: InvalidArgument naming the first id that is not in the
  // vocabulary or has no byte decoding.
  [[nodiscard]] virtual absl::StatusOr<std::string> Decode(
      absl::Span<const uint16_t> tokens) const = 0;
};

class ByteTokenizer final : public Tokenizer {
 public:
  absl::string_view name() const override { return "byte"; }
  int64_t vocab_size() const override { return 256; }
  void Encode(absl::string_view text, std::vector<uint16_t>* out) override;
  absl::StatusOr<std::string> Decode(absl::Span<const uint16_t> tokens) const override;
};

// GPT-2's pre-tokenization (step 1 above): the pieces, in order, as views into `text`; their
// concatenation is `text`.
std::vector<absl::string_view> Gpt2PreTokenize(absl::string_view text);

// GPT-2's bytes_to_unicode: for each byte, the UTF-8 encoding of its stand-in character.
const std::array<std::string, 256>& Gpt2ByteToUnicode();

class Gpt2BpeTokenizer final : public Tokenizer {
 public:
  // Reads and validates vocab.json and merges.txt.
  [[nodiscard]] static absl::StatusOr<std::unique_ptr<Gpt2BpeTokenizer>> Load(
      const std::string& vocab_path, const std::string& merges_path);
  // The same from the files' contents; `vocab_name` and `merges_name` appear in error messages.
  [[nodiscard]] static absl::StatusOr<std::unique_ptr<Gpt2BpeTokenizer>> FromContents(
      absl::string_view vocab_json, absl::string_view merges_txt,
      absl::string_view vocab_name = "vocab.json", absl::string_view merges_name = "merges.txt");

  absl::string_view name() const override { return "gpt2-bpe"; }
  // The largest id in vocab.json plus one (50257 for GPT-2).
  int64_t vocab_size() const override { return vocab_size_; }
  void Encode(absl::string_view text, std::vector<uint16_t>* out) override;
  absl::StatusOr<std::string> Decode(absl::Span<const uint16_t> tokens) const override;

  // The id of a vocabulary entry (in its stand-in spelling, e.g. "Ġthe"), if present.
  std::optional<uint16_t> TokenId(absl::string_view token) const;
  // The id of "<|endoftext|>", if the vocabulary has it.
  std::optional<uint16_t> eot_token() const { return TokenId("<|endoftext|>"); }
  int64_t num_merges() const { return static_cast<int64_t>(merges_.size()); }

 private:
  struct Merge {
    uint32_t rank;
    uint16_t merged;
  };
  Gpt2BpeTokenizer() = default;
  // BPE of one pre-tokenized piece, appended to `out`.
  void EncodePiece(absl::string_view piece, std::vector<uint16_t>* out) const;
  static uint64_t PairKey(uint16_t left, uint16_t right) { return (uint64_t{left} << 16) | right; }

  int64_t vocab_size_ = 0;
  absl::flat_hash_map<std::string, uint16_t> token_to_id_;
  std::vector<std::optional<std::string>> id_to_token_;  // indexed by id
  std::array<uint16_t, 256> byte_to_id_{};               // id of each byte's stand-in symbol
  absl::flat_hash_map<uint64_t, Merge> merges_;          // PairKey(left, right) -> merge
  absl::flat_hash_map<uint32_t, uint8_t> char_to_byte_;  // stand-in code point -> byte
  // Encoded pieces. Cleared when it reaches kMaxCacheEntries.
  static constexpr size_t kMaxCacheEntries = size_t{1} << 20;
  absl::flat_hash_map<std::string, std::vector<uint16_t>> cache_;
};

}  // namespace ps

#endif  // PATRICKSTAR_TRAINER_DATA_TOKENIZER_H_
