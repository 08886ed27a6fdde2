// Reading and writing safetensors files (Hugging Face's tensor container format).
//
// Format (https://github.com/huggingface/safetensors, "Format" section):
//   bytes [0, 8)       N, the header length, an unsigned 64-bit little-endian integer;
//   bytes [8, 8 + N)   a UTF-8 JSON object, starting with '{', optionally padded at the end
//                      with spaces:
//                        {"<tensor name>": {"dtype": "F32", "shape": [2, 3],
//                                           "data_offsets": [begin, end]},
//                         ...,
//                         "__metadata__": {"<key>": "<value>", ...}}   (optional, strings only)
//   bytes [8 + N, EOF) the byte buffer. data_offsets are relative to its start; the tensors'
//                      byte ranges must tile it exactly (no gaps, no overlaps, nothing left over).
// Tensors are dense, row-major (C order), little-endian. Zero-size tensors (a dimension of 0,
// data_offsets [b, b]) and scalars (shape []) are allowed.
//
// dtypes. The reader recognizes every byte-sized safetensors dtype (BOOL, U8, I8, F8_E5M2,
// F8_E4M3, F8_E8M0, F8_E5M2FNUZ, F8_E4M3FNUZ, I16, U16, F16, BF16, I32, U32, F32, C64, F64, I64,
// U64), so a file holding some of them still opens and is fully validated (sizes, offsets). Only
// F32, F16 and BF16 tensors are *supported*, i.e. have a ps::DType and can be read through
// Get()/ReadAsF32(); asking for another one is Unimplemented naming the tensor and its dtype. A
// dtype string outside that list makes the file fail to open: the packed sub-byte dtypes (F4,
// F6_E2M3, F6_E3M2) with Unimplemented, anything else as corrupt (DataLoss).
//
// Strictness. Where the reference reader (Python safetensors 0.8.0) is laxer than the written
// specification, this reader follows the specification: the header must start with '{' (the
// reference also accepts leading whitespace) and a tensor name may appear only once (the reference
// silently keeps one of the duplicates).
//
// Error codes. A file that is not a well-formed safetensors file (truncated, header length
// beyond the file, invalid JSON or UTF-8, unknown dtype, negative or non-integer dimension,
// size/offset mismatch, gaps, overlaps, duplicate names) is DataLoss; a missing file is NotFound;
// a sub-byte dtype is Unimplemented; other I/O failures are the errno's canonical code
// (PermissionDenied, ...). Every message names the file and, where one is involved, the tensor.
//
// This is a general container layer; model/gpt2_checkpoint.h gives the tensors GPT-2 meaning.
#ifndef PATRICKSTAR_MODEL_SAFETENSORS_H_
#define PATRICKSTAR_MODEL_SAFETENSORS_H_

#include <cstddef>
#include <cstdint>
#include <functional>
#include <map>
#include <optional>
#include <string>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "absl/types/span.h"
#include "memory/dtype.h"

namespace ps {

// Headers longer than this are rejected as corrupt (the reference implementation's limit too).
inline constexpr uint64_t kSafetensorsMaxHeaderBytes = uint64_t{100} << 20;

// The safetensors dtype string of a supported dtype: "F32", "F16", "BF16".
absl::string_view SafetensorsDTypeName(DType dtype);

// One tensor's header entry, validated.
struct SafetensorsTensorInfo {
  std::string name;
  std::string dtype_name;          // as written in the file, e.g. "F32", "I64"
  std::optional<DType> dtype;      // set for F32/F16/BF16, nullopt for other known dtypes
  int64_t element_size_bytes = 0;  // bytes per element of dtype_name
  std::vector<int64_t> shape;      // every dimension >= 0; empty for a scalar
  int64_t num_elements = 0;        // product of shape (1 for a scalar)
  int64_t begin_bytes = 0;         // data_offsets, relative to the byte buffer
  int64_t end_bytes = 0;
  int64_t size_bytes() const { return end_bytes - begin_bytes; }
};

// A supported tensor's view into the mapped file.
struct SafetensorsTensorView {
  const SafetensorsTensorInfo* info = nullptr;
  DType dtype = DType::kF32;
  // The tensor's bytes (num_elements * SizeOf(dtype)). Not necessarily aligned to the element
  // size: files written by other tools may place tensors at odd offsets. Copy (memcpy) before
  // reinterpreting, or use SafetensorsFile::ReadAsF32().
  absl::Span<const uint8_t> bytes;
};

// A safetensors file, memory-mapped read-only and validated.
//
// Ownership and lifetime: the object owns the mapping and unmaps it on destruction; every
// span and pointer it hands out (tensor bytes, infos) is valid until the object is destroyed or
// moved from. Pages are read lazily by the OS. If another process truncates the file while it is
// mapped, touching the lost pages raises SIGBUS: do not modify files that are open here (the
// writer below never does; it replaces files by rename).
//
// Thread safety: after Open() returns, all const methods may be called concurrently.
class SafetensorsFile {
 public:
  // Maps and validates `path` (see the file comment for what is checked). Nothing about the
  // file is trusted until everything has been checked; a malformed file is an error, never a
  // crash or an out-of-bounds read.
  // Errors: NotFound (no such file), DataLoss (malformed), other canonical codes for I/O errors.
  [[nodiscard]] static absl::StatusOr<SafetensorsFile> Open(const std::string& path);

  SafetensorsFile(SafetensorsFile&& other) noexcept;
  SafetensorsFile& operator=(SafetensorsFile&& other) noexcept;
  SafetensorsFile(const SafetensorsFile&) = delete;
  SafetensorsFile& operator=(const SafetensorsFile&) = delete;
  ~SafetensorsFile();

  const std::string& path() const { return path_; }

  // All tensors, sorted by name.
  const std::vector<SafetensorsTensorInfo>& tensors() const { return tensors_; }

  // The `__metadata__` object (empty if absent).
  const std::map<std::string, std::string>& metadata() const { return metadata_; }

  // The tensor called `name`, or nullptr.
  const SafetensorsTensorInfo* Find(absl::string_view name) const;

  // Raw bytes of any tensor (supported dtype or not); see SafetensorsTensorView::bytes about
  // alignment. REQUIRES: `info` belongs to this file.
  absl::Span<const uint8_t> Bytes(const SafetensorsTensorInfo& info) const;

  // The tensor called `name` with its ps::DType.
  // Errors: NotFound (no such tensor), Unimplemented (a known but unsupported dtype).
  [[nodiscard]] absl::StatusOr<SafetensorsTensorView> Get(absl::string_view name) const;

  // Copies tensor `name` into `out`, converting F16/BF16 to f32 exactly (memory/convert.h).
  // Errors: as Get(); InvalidArgument if out.size() != num_elements.
  [[nodiscard]] absl::Status ReadAsF32(absl::string_view name, absl::Span<float> out) const;
  [[nodiscard]] absl::StatusOr<std::vector<float>> ReadAsF32(absl::string_view name) const;

  // Copies elements [first_elem, first_elem + out.size()) of tensor `name` (in row-major order)
  // into `out` as f32, for reading large tensors in pieces.
  // Errors: as Get(); InvalidArgument if the range is not within the tensor.
  [[nodiscard]] absl::Status ReadAsF32(absl::string_view name, int64_t first_elem,
                                       absl::Span<float> out) const;

 private:
  SafetensorsFile() = default;
  void Unmap();

  std::string path_;
  const uint8_t* map_addr_ = nullptr;  // the whole file; owned (munmap on destruction)
  size_t map_size_bytes_ = 0;
  size_t buffer_offset_bytes_ = 0;  // 8 + N
  std::vector<SafetensorsTensorInfo> tensors_;
  absl::flat_hash_map<std::string, size_t> index_;  // name -> position in tensors_
  std::map<std::string, std::string> metadata_;
};

// Shape and dtype of one tensor to write.
struct SafetensorsTensorSpec {
  std::string name;
  DType dtype = DType::kF32;
  std::vector<int64_t> shape;  // every dimension >= 0; {} for a scalar
};

// Produces the bytes of specs[index] into `dst` (exactly numel * SizeOf(dtype) bytes, aligned to
// the element size). A non-OK status aborts the write.
using SafetensorsFillFn = std::function<absl::Status(size_t index, absl::Span<uint8_t> dst)>;

// Writes a safetensors file with the given tensors and metadata, streaming: at most one tensor's
// bytes are buffered at a time. The file is written atomically: to a temporary file in the same
// directory, fsync'ed, renamed over `path`, then the directory is fsync'ed; on any error the
// temporary file is removed and `path` is untouched.
//
// Layout, as the reference Python/Rust implementation writes it: header keys sorted, the header
// padded with spaces so the buffer starts at a multiple of 8, tensors stored in order of
// decreasing element size then name, so every tensor is aligned to its element size in the file.
// The `__metadata__` key is omitted when `metadata` is empty.
//
// Errors: InvalidArgument for bad specs (empty, duplicate or reserved "__metadata__" name, name or
// metadata not valid UTF-8, negative dimension, size overflow) naming the tensor; whatever `fill`
// returns; I/O errors with their canonical codes, naming the path.
[[nodiscard]] absl::Status WriteSafetensors(const std::string& path,
                                            absl::Span<const SafetensorsTensorSpec> specs,
                                            const std::map<std::string, std::string>& metadata,
                                            const SafetensorsFillFn& fill);

// Produces elements [first_elem, first_elem + n) of specs[index], in row-major order, into `dst`
// (exactly n * SizeOf(dtype) bytes, aligned to the element size). A non-OK status aborts the write.
using SafetensorsPieceFillFn =
    std::function<absl::Status(size_t index, int64_t first_elem, absl::Span<uint8_t> dst)>;

// As WriteSafetensors above, but asks for each tensor in consecutive pieces of at most
// `max_piece_bytes` (rounded down to whole elements, at least one element), so that at most one
// piece is buffered however large a tensor is. Pieces of one tensor come in order; tensors come
// in file data order. A zero-size tensor gets one call with an empty `dst`.
// Errors: as WriteSafetensors; InvalidArgument if max_piece_bytes < 1.
[[nodiscard]] absl::Status WriteSafetensorsInPieces(
    const std::string& path, absl::Span<const SafetensorsTensorSpec> specs,
    const std::map<std::string, std::string>& metadata, const SafetensorsPieceFillFn& fill,
    int64_t max_piece_bytes);

// A tensor to write from memory.
struct SafetensorsTensorData {
  SafetensorsTensorSpec spec;
  absl::Span<const uint8_t> bytes;  // exactly numel * SizeOf(dtype) bytes; not owned
};

// Convenience form of the above for tensors already in memory.
// Errors: as above, plus InvalidArgument if a tensor's byte count does not match its shape.
[[nodiscard]] absl::Status WriteSafetensors(const std::string& path,
                                            absl::Span<const SafetensorsTensorData> tensors,
                                            const std::map<std::string, std::string>& metadata);

}  // namespace ps

#endif  // PATRICKSTAR_MODEL_SAFETENSORS_H_
