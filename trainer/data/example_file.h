// Example files (`.bin`): prepared fine-tuning data — tokens, where each example starts, and which
// tokens are trained targets. Written by tools/prepare_data, read by the trainer, which packs the
// examples into rows itself (trainer/data/packed_loader.h), so one file serves any seq_len.
//
// Format, all little-endian (docs/data_format.md has the same table):
//   bytes [0, 1024)   256 int32 header: [0] magic 20261207, [1] version 1, [2] token width in
//                     bytes (2: uint16, 4: uint32), [3] 0, [4],[5] N = token count and [6],[7]
//                     E = example count, each an int64 as (low 32 bits, high 32 bits); the rest 0.
//   at 1024           N tokens of the header's width,
//                     then zero bytes up to the next multiple of 8 (file offset),
//   then              E + 1 int64 starts: example e is tokens [starts[e], starts[e+1]);
//                     starts[0] = 0, starts[E] = N, strictly increasing (no empty example),
//   then              N uint8 trained flags: 1 where token i is a trained target (the model learns
//                     to predict it from the tokens before it in its example; Hugging Face's
//                     labels[i] = input_ids[i]), 0 where labels[i] = -100. Values 0/1 only, and 0
//                     at every example's first token (it has nothing before it).
//   The file size is exactly 1024 + roundup8(N * width) + 8 * (E + 1) + N.
//
// llm.c's token files (trainer/data/token_file.h) stay as they are; SniffDataFile() tells the two
// apart by their magic.
//
// Error codes: NotFound (no such file), InvalidArgument (not a regular file), DataLoss (not a
// well-formed example file: shorter than the header, a foreign magic, a bad version or width,
// nonzero reserved header words, negative counts, a size not matching the counts — truncated or
// trailing bytes —, broken starts or trained flags), other canonical codes for I/O errors. Every
// message names the path and what is wrong.
#ifndef PATRICKSTAR_TRAINER_DATA_EXAMPLE_FILE_H_
#define PATRICKSTAR_TRAINER_DATA_EXAMPLE_FILE_H_

#include <cstddef>
#include <cstdint>
#include <string>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/types/span.h"
#include "trainer/data/token_span.h"

namespace ps {

inline constexpr int32_t kExampleFileMagic = 20261207;
inline constexpr int32_t kExampleFileVersion = 1;
inline constexpr size_t kExampleFileHeaderBytes = 1024;

// A view of examples (not owning: the spans' storage must outlive it). Its invariants are the
// file's: starts has E + 1 >= 1 entries, starts[0] = 0, strictly increasing, starts[E] =
// tokens.size(); trained has tokens.size() entries, each 0 or 1, and 0 at every starts[e] (e < E).
struct ExamplesView {
  TokenSpan tokens;                   // [N]
  absl::Span<const int64_t> starts;   // [E + 1]
  absl::Span<const uint8_t> trained;  // [N]
  int64_t num_examples() const { return static_cast<int64_t>(starts.size()) - 1; }
};

// OK if `view` keeps every invariant above; otherwise InvalidArgument naming the first broken rule
// with its example and token index. O(N + E).
[[nodiscard]] absl::Status ValidateExamples(const ExamplesView& view);

// An example file, memory-mapped read-only and validated completely at Open().
//
// Ownership and lifetime: the object owns the mapping and unmaps it on destruction; view() is
// valid until the object is destroyed or moved from. Do not modify a file while it is open here
// (WriteExampleFile never does: it replaces files by rename).
//
// Thread safety: after Open() returns, all const methods may be called concurrently.
class ExampleFile {
 public:
  // Maps and validates `path` (see the file comment). Reads the whole file once (a few GB/s).
  [[nodiscard]] static absl::StatusOr<ExampleFile> Open(const std::string& path);

  ExampleFile(ExampleFile&& other) noexcept;
  ExampleFile& operator=(ExampleFile&& other) noexcept;
  ExampleFile(const ExampleFile&) = delete;
  ExampleFile& operator=(const ExampleFile&) = delete;
  ~ExampleFile();

  const std::string& path() const { return path_; }
  // The examples, as stored (tokens uint16 or uint32; starts 8-byte aligned).
  ExamplesView view() const { return view_; }
  int64_t num_tokens() const { return static_cast<int64_t>(view_.tokens.size()); }
  int64_t num_examples() const { return view_.num_examples(); }
  // 2 or 4.
  int token_width_bytes() const { return view_.tokens.width_bytes(); }
  // The largest token in the file; 0 for a file with no tokens.
  uint32_t max_token() const { return max_token_; }

  // OK if every token is < vocab_size (O(1): max_token() is known). Otherwise InvalidArgument
  // naming the file, the first offending token, its example and position, and the largest token.
  [[nodiscard]] absl::Status CheckVocabSize(int64_t vocab_size) const;

 private:
  ExampleFile() = default;
  void Unmap();

  std::string path_;
  void* map_addr_ = nullptr;  // owned; munmap on destruction
  size_t map_size_bytes_ = 0;
  ExamplesView view_;
  uint32_t max_token_ = 0;
};

// Writes `view` as an example file at `path`, atomically like WriteTokenFile (a temporary file in
// the same directory, fsync'ed, renamed over `path`, the directory fsync'ed; on any error `path`
// is left as it was). Tokens are written as uint16 when every token is < 65536 (whatever the
// view's width) unless `force_width4`, else as uint32.
// Errors: InvalidArgument if the view breaks an invariant (nothing is written); I/O errors with
// their canonical codes, naming the path.
[[nodiscard]] absl::Status WriteExampleFile(const std::string& path, const ExamplesView& view,
                                            bool force_width4 = false);

// Which kind of data file `path` is, from its first 8 bytes (magic and version words).
enum class DataFileKind {
  kLlmcTokens,  // llm.c's token file, magic 20240520 or 20240801 (TokenFile)
  kExamples,    // an example file, magic 20261207 (ExampleFile)
};
// Errors: NotFound / other errno codes naming the path; InvalidArgument if it is not a regular
// file; DataLoss naming the path and the magic found if the file is shorter than 8 bytes or its
// magic is neither kind's. The chosen reader validates the rest.
[[nodiscard]] absl::StatusOr<DataFileKind> SniffDataFile(const std::string& path);

}  // namespace ps

#endif  // PATRICKSTAR_TRAINER_DATA_EXAMPLE_FILE_H_
