// llm.c's token files (`.bin`): the tokenized training data format of karpathy/llm.c
// (dev/data/data_common.py write_datafile, llmc/dataloader.h).
//
// Format, all little-endian, in two variants (llm.c's dev/data/data_common.py HEADERS_INFO):
//   bytes [0, 1024)            256 int32: header[0] = magic, header[1] = version, header[2] = N
//                              (the token count), the rest 0;
//   then N tokens:             magic 20240520, version 1: uint16 (GPT-2; vocabularies <= 65,536);
//                              magic 20240801, version 7: uint32 (llm.c's Llama-3 files; any
//                              vocabulary).
// The file size must be exactly 1024 + 2N (resp. 4N) bytes.
//
// Anything else — llm.c's model checkpoints (magic 20240326), a magic with the other variant's
// version, text — is rejected with a message saying what the file looks like.
//
// Error codes: NotFound (no such file), InvalidArgument (not a regular file), DataLoss (not a
// well-formed token file: empty, shorter than the header, wrong magic or version, negative count,
// size not matching the count and width — truncated, trailing bytes, or the other width's payload),
// other canonical codes for I/O errors. Every message names the path.
#ifndef PATRICKSTAR_TRAINER_DATA_TOKEN_FILE_H_
#define PATRICKSTAR_TRAINER_DATA_TOKEN_FILE_H_

#include <cstddef>
#include <cstdint>
#include <string>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/types/span.h"
#include "trainer/data/token_span.h"

namespace ps {

inline constexpr int32_t kTokenFileMagic = 20240520;  // uint16 tokens
inline constexpr int32_t kTokenFileVersion = 1;
inline constexpr int32_t kTokenFile32Magic = 20240801;  // uint32 tokens (llm.c's "llama-3")
inline constexpr int32_t kTokenFile32Version = 7;
inline constexpr int kTokenFileHeaderInts = 256;
inline constexpr size_t kTokenFileHeaderBytes = kTokenFileHeaderInts * sizeof(int32_t);  // 1024

// A token file of either variant, memory-mapped read-only and validated.
//
// Ownership and lifetime: the object owns the mapping and unmaps it on destruction; tokens() is
// valid until the object is destroyed or moved from. Do not modify a file while it is open here
// (touching pages that another process truncated away raises SIGBUS); WriteTokenFile never does,
// it replaces files by rename.
//
// Thread safety: after Open() returns, all const methods may be called concurrently.
class TokenFile {
 public:
  // Maps and validates `path` (see the file comment). Reads the whole file once to compute
  // max_token() (a few GB/s).
  [[nodiscard]] static absl::StatusOr<TokenFile> Open(const std::string& path);

  TokenFile(TokenFile&& other) noexcept;
  TokenFile& operator=(TokenFile&& other) noexcept;
  TokenFile(const TokenFile&) = delete;
  TokenFile& operator=(const TokenFile&) = delete;
  ~TokenFile();

  const std::string& path() const { return path_; }
  int64_t num_tokens() const { return static_cast<int64_t>(tokens_.size()); }
  // The tokens, in file order, as stored (uint16 or uint32; aligned: the payload starts at offset
  // 1024 of a page-aligned mapping).
  TokenSpan tokens() const { return tokens_; }
  // 2 (version 1) or 4 (version 7).
  int token_width_bytes() const { return tokens_.width_bytes(); }
  // The largest token in the file; 0 for a file with no tokens. A model's vocabulary must be
  // larger.
  uint32_t max_token() const { return max_token_; }

  // OK if every token is < vocab_size (O(1): max_token() is known). Otherwise InvalidArgument
  // naming the file, the first offending token and its position, and the largest token.
  [[nodiscard]] absl::Status CheckVocabSize(int64_t vocab_size) const;

 private:
  TokenFile() = default;
  void Unmap();

  std::string path_;
  void* map_addr_ = nullptr;  // owned; munmap on destruction
  size_t map_size_bytes_ = 0;
  TokenSpan tokens_;
  uint32_t max_token_ = 0;
};

// Writes `tokens` as a token file at `path` — version 1 for uint16 tokens, version 7 (magic
// 20240801) for uint32 tokens — atomically: to a temporary file in the same
// directory, fsync'ed, renamed over `path`, then the directory is fsync'ed; on any error the
// temporary file is removed and `path` is left as it was. Zero tokens is allowed (a header-only
// file).
// Errors: InvalidArgument for more than INT32_MAX tokens (the header's count is an int32); I/O
// errors with their canonical codes, naming the path.
[[nodiscard]] absl::Status WriteTokenFile(const std::string& path,
                                          absl::Span<const uint16_t> tokens);
[[nodiscard]] absl::Status WriteTokenFile(const std::string& path,
                                          absl::Span<const uint32_t> tokens);

}  // namespace ps

#endif  // PATRICKSTAR_TRAINER_DATA_TOKEN_FILE_H_
