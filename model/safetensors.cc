#include "model/safetensors.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <bit>
#include <cerrno>
#include <cstring>
#include <limits>
#include <numeric>
#include <utility>

#include "absl/cleanup/cleanup.h"
#include "absl/container/flat_hash_set.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "base/file_io.h"
#include "base/status_macros.h"
#include "base/utf8.h"
#include "memory/convert.h"
#include "nlohmann/json.hpp"

namespace ps {
namespace {

static_assert(std::endian::native == std::endian::little,
              "safetensors data is little-endian; this reader assumes a little-endian host");

constexpr absl::string_view kMetadataKey = "__metadata__";

// Byte-sized dtypes of the safetensors specification, with their element sizes.
struct KnownDType {
  absl::string_view name;
  int64_t size_bytes;
  std::optional<DType> dtype;
};
constexpr KnownDType kKnownDTypes[] = {
    {"BOOL", 1, std::nullopt},        {"U8", 1, std::nullopt},
    {"I8", 1, std::nullopt},          {"F8_E5M2", 1, std::nullopt},
    {"F8_E4M3", 1, std::nullopt},     {"F8_E8M0", 1, std::nullopt},
    {"F8_E5M2FNUZ", 1, std::nullopt}, {"F8_E4M3FNUZ", 1, std::nullopt},
    {"I16", 2, std::nullopt},         {"U16", 2, std::nullopt},
    {"F16", 2, DType::kF16},          {"BF16", 2, DType::kBF16},
    {"I32", 4, std::nullopt},         {"U32", 4, std::nullopt},
    {"F32", 4, DType::kF32},          {"C64", 8, std::nullopt},
    {"F64", 8, std::nullopt},         {"I64", 8, std::nullopt},
    {"U64", 8, std::nullopt},
};

const KnownDType* LookupDType(absl::string_view name) {
  for (const KnownDType& d : kKnownDTypes) {
    if (d.name == name) return &d;
  }
  return nullptr;
}

std::string ShapeString(absl::Span<const int64_t> shape) {
  return absl::StrCat("[", absl::StrJoin(shape, ", "), "]");
}

// Product of `shape` times `element_size`, or nullopt on a negative dimension or int64 overflow.
std::optional<int64_t> CheckedSizeBytes(absl::Span<const int64_t> shape, int64_t element_size,
                                        int64_t* num_elements) {
  int64_t n = 1;
  for (int64_t d : shape) {
    if (d < 0) return std::nullopt;
    if (__builtin_mul_overflow(n, d, &n)) return std::nullopt;
  }
  int64_t bytes;
  if (__builtin_mul_overflow(n, element_size, &bytes)) return std::nullopt;
  if (num_elements != nullptr) *num_elements = n;
  return bytes;
}

// Reads a non-negative integer that fits in int64 from a JSON number.
std::optional<int64_t> AsInt64(const nlohmann::json& v) {
  if (!v.is_number_unsigned()) return std::nullopt;
  const uint64_t u = v.get<uint64_t>();
  if (u > static_cast<uint64_t>(std::numeric_limits<int64_t>::max())) return std::nullopt;
  return static_cast<int64_t>(u);
}

// Validates one tensor entry of the header. `buffer_size` is the byte buffer's length.
absl::StatusOr<SafetensorsTensorInfo> ParseTensorEntry(const std::string& path,
                                                       const std::string& name,
                                                       const nlohmann::json& entry,
                                                       int64_t buffer_size) {
  auto corrupt = [&](absl::string_view what) {
    return absl::DataLossError(
        absl::StrCat("safetensors file '", path, "': tensor '", name, "': ", what));
  };
  if (!entry.is_object()) return corrupt("header entry is not a JSON object");
  SafetensorsTensorInfo info;
  info.name = name;

  const auto dtype_it = entry.find("dtype");
  if (dtype_it == entry.end() || !dtype_it->is_string()) {
    return corrupt("missing or non-string \"dtype\"");
  }
  info.dtype_name = dtype_it->get<std::string>();
  const KnownDType* known = LookupDType(info.dtype_name);
  if (info.dtype_name == "F4" || info.dtype_name == "F6_E2M3" || info.dtype_name == "F6_E3M2") {
    return absl::UnimplementedError(absl::StrCat(
        "safetensors file '", path, "': tensor '", name, "' has the packed sub-byte dtype ",
        info.dtype_name, ", which this reader does not support"));
  }
  if (known == nullptr) {
    return corrupt(absl::StrCat("unknown dtype \"", info.dtype_name,
                                "\" (known: BOOL, U8, I8, F8_E5M2, F8_E4M3, F8_E8M0, F8_E5M2FNUZ, "
                                "F8_E4M3FNUZ, I16, U16, "
                                "F16, BF16, I32, U32, F32, C64, F64, I64, U64)"));
  }
  info.dtype = known->dtype;
  info.element_size_bytes = known->size_bytes;

  const auto shape_it = entry.find("shape");
  if (shape_it == entry.end() || !shape_it->is_array()) {
    return corrupt("missing \"shape\" or it is not an array");
  }
  for (const nlohmann::json& d : *shape_it) {
    const std::optional<int64_t> dim = AsInt64(d);
    if (!dim.has_value()) {
      return corrupt(absl::StrCat("shape ", shape_it->dump(),
                                  " has a dimension that is not a non-negative integer"));
    }
    info.shape.push_back(*dim);
  }

  const auto off_it = entry.find("data_offsets");
  if (off_it == entry.end() || !off_it->is_array() || off_it->size() != 2) {
    return corrupt("missing \"data_offsets\" or it is not a [begin, end] pair");
  }
  const std::optional<int64_t> begin = AsInt64((*off_it)[0]);
  const std::optional<int64_t> end = AsInt64((*off_it)[1]);
  if (!begin.has_value() || !end.has_value()) {
    return corrupt(absl::StrCat("data_offsets ", off_it->dump(), " are not non-negative integers"));
  }
  if (*begin > *end) {
    return corrupt(absl::StrCat("data_offsets [", *begin, ", ", *end, "] have begin > end"));
  }
  if (*end > buffer_size) {
    return corrupt(absl::StrCat("data_offsets [", *begin, ", ", *end,
                                "] extend past the end of the data buffer (", buffer_size,
                                " bytes); the file may be truncated"));
  }
  info.begin_bytes = *begin;
  info.end_bytes = *end;

  const std::optional<int64_t> want =
      CheckedSizeBytes(info.shape, info.element_size_bytes, &info.num_elements);
  if (!want.has_value()) {
    return corrupt(absl::StrCat("shape ", ShapeString(info.shape), " of ", info.dtype_name,
                                " overflows a 64-bit byte count"));
  }
  if (*want != info.size_bytes()) {
    return corrupt(absl::StrCat("shape ", ShapeString(info.shape), " of ", info.dtype_name,
                                " needs ", *want, " bytes but data_offsets [", *begin, ", ", *end,
                                "] hold ", info.size_bytes()));
  }
  return info;
}

// Checks that the tensors' byte ranges tile [0, buffer_size) exactly.
absl::Status CheckTiling(const std::string& path, const std::vector<SafetensorsTensorInfo>& tensors,
                         int64_t buffer_size) {
  std::vector<size_t> order(tensors.size());
  std::iota(order.begin(), order.end(), size_t{0});
  std::sort(order.begin(), order.end(), [&](size_t a, size_t b) {
    return std::make_pair(tensors[a].begin_bytes, tensors[a].end_bytes) <
           std::make_pair(tensors[b].begin_bytes, tensors[b].end_bytes);
  });
  int64_t covered = 0;
  const SafetensorsTensorInfo* prev = nullptr;
  for (size_t i : order) {
    const SafetensorsTensorInfo& t = tensors[i];
    if (t.begin_bytes > covered) {
      return absl::DataLossError(absl::StrCat(
          "safetensors file '", path, "': bytes [", covered, ", ", t.begin_bytes,
          ") of the data buffer belong to no tensor (gap before tensor '", t.name, "')"));
    }
    if (t.begin_bytes < covered) {
      return absl::DataLossError(absl::StrCat("safetensors file '", path, "': tensor '", t.name,
                                              "' data_offsets [", t.begin_bytes, ", ", t.end_bytes,
                                              "] overlap tensor '", prev->name, "' [",
                                              prev->begin_bytes, ", ", prev->end_bytes, "]"));
    }
    covered = t.end_bytes;
    prev = &t;
  }
  if (covered != buffer_size) {
    return absl::DataLossError(absl::StrCat("safetensors file '", path, "': the data buffer has ",
                                            buffer_size,
                                            " bytes but the tensors cover only the first ", covered,
                                            " (trailing bytes belong to no tensor)"));
  }
  return absl::OkStatus();
}

}  // namespace

absl::string_view SafetensorsDTypeName(DType dtype) {
  switch (dtype) {
    case DType::kF32:
      return "F32";
    case DType::kF16:
      return "F16";
    case DType::kBF16:
      return "BF16";
  }
  return "UNKNOWN";
}

// ---------------------------------------------------------------------------------------------
// Reader.

absl::StatusOr<SafetensorsFile> SafetensorsFile::Open(const std::string& path) {
  SafetensorsFile file;
  file.path_ = path;
  auto corrupt = [&](absl::string_view what) {
    return absl::DataLossError(absl::StrCat("safetensors file '", path, "': ", what));
  };

  const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) return ErrnoError(errno, "cannot open safetensors file", path);
  absl::Cleanup close_fd = [fd] { ::close(fd); };
  struct stat st;
  if (::fstat(fd, &st) != 0) return ErrnoError(errno, "cannot stat safetensors file", path);
  if (!S_ISREG(st.st_mode)) {
    return absl::InvalidArgumentError(
        absl::StrCat("safetensors file '", path, "' is not a regular file"));
  }
  const auto file_size = static_cast<uint64_t>(st.st_size);
  if (file_size < 8) {
    return corrupt(absl::StrCat("the file is ", file_size,
                                " bytes, shorter than the 8-byte header length; it is truncated "
                                "or not a safetensors file"));
  }
  void* addr = ::mmap(nullptr, file_size, PROT_READ, MAP_PRIVATE, fd, 0);
  if (addr == MAP_FAILED) return ErrnoError(errno, "cannot mmap safetensors file", path);
  file.map_addr_ = static_cast<const uint8_t*>(addr);
  file.map_size_bytes_ = file_size;

  uint64_t header_size;
  std::memcpy(&header_size, file.map_addr_, sizeof(header_size));
  if (header_size > kSafetensorsMaxHeaderBytes) {
    return corrupt(absl::StrCat("header length ", header_size, " exceeds the ",
                                kSafetensorsMaxHeaderBytes,
                                "-byte limit; the file is corrupt or not a safetensors file"));
  }
  if (header_size > file_size - 8) {
    return corrupt(absl::StrCat("header length ", header_size, " exceeds the ", file_size - 8,
                                " bytes after the length field; the file is truncated or corrupt"));
  }
  if (header_size < 2 || file.map_addr_[8] != '{') {
    return corrupt("the JSON header does not start with '{'; not a safetensors file");
  }
  file.buffer_offset_bytes_ = 8 + header_size;
  const auto buffer_size = static_cast<int64_t>(file_size - file.buffer_offset_bytes_);

  // Parse without exceptions; record top-level keys to reject duplicates (JSON parsers keep
  // only the last one, which would let two entries disagree silently).
  const absl::string_view text(reinterpret_cast<const char*>(file.map_addr_ + 8), header_size);
  std::vector<std::string> top_keys;
  nlohmann::json::parser_callback_t on_event =
      [&top_keys](int depth, nlohmann::json::parse_event_t event, nlohmann::json& parsed) {
        if (event == nlohmann::json::parse_event_t::key && depth == 1 && parsed.is_string()) {
          top_keys.push_back(parsed.get<std::string>());
        }
        return true;
      };
  const nlohmann::json header =
      nlohmann::json::parse(text.begin(), text.end(), on_event, /*allow_exceptions=*/false);
  if (header.is_discarded()) {
    return corrupt("the header is not valid JSON (or not valid UTF-8)");
  }
  if (!header.is_object()) return corrupt("the JSON header is not an object");
  {
    std::sort(top_keys.begin(), top_keys.end());
    const auto dup = std::adjacent_find(top_keys.begin(), top_keys.end());
    if (dup != top_keys.end()) {
      return corrupt(absl::StrCat("the header names tensor '", *dup, "' more than once"));
    }
  }

  for (auto it = header.begin(); it != header.end(); ++it) {
    if (it.key() == kMetadataKey) {
      if (!it.value().is_object()) return corrupt("\"__metadata__\" is not a JSON object");
      for (auto m = it.value().begin(); m != it.value().end(); ++m) {
        if (!m.value().is_string()) {
          return corrupt(
              absl::StrCat("\"__metadata__\" value of key '", m.key(), "' is not a string"));
        }
        file.metadata_.emplace(m.key(), m.value().get<std::string>());
      }
      continue;
    }
    ASSIGN_OR_RETURN(SafetensorsTensorInfo info,
                     ParseTensorEntry(path, it.key(), it.value(), buffer_size));
    file.tensors_.push_back(std::move(info));
  }
  RETURN_IF_ERROR(CheckTiling(path, file.tensors_, buffer_size));

  std::sort(file.tensors_.begin(), file.tensors_.end(),
            [](const SafetensorsTensorInfo& a, const SafetensorsTensorInfo& b) {
              return a.name < b.name;
            });
  file.index_.reserve(file.tensors_.size());
  for (size_t i = 0; i < file.tensors_.size(); ++i) file.index_.emplace(file.tensors_[i].name, i);
  return file;
}

SafetensorsFile::SafetensorsFile(SafetensorsFile&& other) noexcept
    : path_(std::move(other.path_)),
      map_addr_(std::exchange(other.map_addr_, nullptr)),
      map_size_bytes_(std::exchange(other.map_size_bytes_, 0)),
      buffer_offset_bytes_(other.buffer_offset_bytes_),
      tensors_(std::move(other.tensors_)),
      index_(std::move(other.index_)),
      metadata_(std::move(other.metadata_)) {}

SafetensorsFile& SafetensorsFile::operator=(SafetensorsFile&& other) noexcept {
  if (this != &other) {
    Unmap();
    path_ = std::move(other.path_);
    map_addr_ = std::exchange(other.map_addr_, nullptr);
    map_size_bytes_ = std::exchange(other.map_size_bytes_, 0);
    buffer_offset_bytes_ = other.buffer_offset_bytes_;
    tensors_ = std::move(other.tensors_);
    index_ = std::move(other.index_);
    metadata_ = std::move(other.metadata_);
  }
  return *this;
}

SafetensorsFile::~SafetensorsFile() { Unmap(); }

void SafetensorsFile::Unmap() {
  if (map_addr_ != nullptr) {
    ::munmap(const_cast<uint8_t*>(map_addr_), map_size_bytes_);
    map_addr_ = nullptr;
    map_size_bytes_ = 0;
  }
}

const SafetensorsTensorInfo* SafetensorsFile::Find(absl::string_view name) const {
  const auto it = index_.find(name);
  return it == index_.end() ? nullptr : &tensors_[it->second];
}

absl::Span<const uint8_t> SafetensorsFile::Bytes(const SafetensorsTensorInfo& info) const {
  return absl::Span<const uint8_t>(map_addr_ + buffer_offset_bytes_ + info.begin_bytes,
                                   static_cast<size_t>(info.size_bytes()));
}

absl::StatusOr<SafetensorsTensorView> SafetensorsFile::Get(absl::string_view name) const {
  const SafetensorsTensorInfo* info = Find(name);
  if (info == nullptr) {
    return absl::NotFoundError(
        absl::StrCat("safetensors file '", path_, "' has no tensor '", name, "'"));
  }
  if (!info->dtype.has_value()) {
    return absl::UnimplementedError(
        absl::StrCat("safetensors file '", path_, "': tensor '", name, "' has dtype ",
                     info->dtype_name, ", which is not supported (supported: F32, F16, BF16)"));
  }
  return SafetensorsTensorView{info, *info->dtype, Bytes(*info)};
}

absl::Status SafetensorsFile::ReadAsF32(absl::string_view name, absl::Span<float> out) const {
  const SafetensorsTensorInfo* info = Find(name);
  if (info != nullptr && static_cast<int64_t>(out.size()) != info->num_elements) {
    return absl::InvalidArgumentError(
        absl::StrCat("safetensors file '", path_, "': tensor '", name, "' has ", info->num_elements,
                     " elements but the destination holds ", out.size()));
  }
  return ReadAsF32(name, 0, out);
}

absl::Status SafetensorsFile::ReadAsF32(absl::string_view name, int64_t first_elem,
                                        absl::Span<float> out) const {
  ASSIGN_OR_RETURN(const SafetensorsTensorView view, Get(name));
  const int64_t numel = view.info->num_elements;
  const auto n = static_cast<int64_t>(out.size());
  if (first_elem < 0 || first_elem > numel || n > numel - first_elem) {
    return absl::InvalidArgumentError(
        absl::StrCat("safetensors file '", path_, "': elements [", first_elem, ", ", first_elem + n,
                     ") are outside tensor '", name, "' of ", numel, " elements"));
  }
  if (n == 0) return absl::OkStatus();
  const int64_t elem_size = SizeOf(view.dtype);
  const uint8_t* src = view.bytes.data() + first_elem * elem_size;
  if (view.dtype == DType::kF32) {
    std::memcpy(out.data(), src, static_cast<size_t>(n * elem_size));
    return absl::OkStatus();
  }
  // F16/BF16: Convert() needs a source aligned to 2 bytes; files from other writers may not be.
  if (reinterpret_cast<uintptr_t>(src) % 2 == 0) {
    return Convert(view.dtype, src, DType::kF32, out.data(), n);
  }
  std::vector<uint16_t> aligned(static_cast<size_t>(n));
  std::memcpy(aligned.data(), src, static_cast<size_t>(n * elem_size));
  return Convert(view.dtype, aligned.data(), DType::kF32, out.data(), n);
}

absl::StatusOr<std::vector<float>> SafetensorsFile::ReadAsF32(absl::string_view name) const {
  const SafetensorsTensorInfo* info = Find(name);
  std::vector<float> out(info == nullptr ? 0 : static_cast<size_t>(info->num_elements));
  RETURN_IF_ERROR(ReadAsF32(name, absl::MakeSpan(out)));
  return out;
}

// ---------------------------------------------------------------------------------------------
// Writer.

absl::Status WriteSafetensors(const std::string& path,
                              absl::Span<const SafetensorsTensorSpec> specs,
                              const std::map<std::string, std::string>& metadata,
                              const SafetensorsFillFn& fill) {
  // One piece per tensor: the whole of it.
  return WriteSafetensorsInPieces(
      path, specs, metadata,
      [&](size_t index, int64_t first_elem, absl::Span<uint8_t> dst) { return fill(index, dst); },
      std::numeric_limits<int64_t>::max());
}

absl::Status WriteSafetensorsInPieces(const std::string& path,
                                      absl::Span<const SafetensorsTensorSpec> specs,
                                      const std::map<std::string, std::string>& metadata,
                                      const SafetensorsPieceFillFn& fill, int64_t max_piece_bytes) {
  auto invalid = [&](absl::string_view what) {
    return absl::InvalidArgumentError(
        absl::StrCat("cannot write safetensors file '", path, "': ", what));
  };
  // Validate everything before touching the file system.
  std::vector<int64_t> sizes(specs.size());
  absl::flat_hash_set<absl::string_view> seen;
  for (size_t i = 0; i < specs.size(); ++i) {
    const SafetensorsTensorSpec& s = specs[i];
    if (s.name.empty()) return invalid(absl::StrCat("tensor #", i, " has an empty name"));
    if (s.name == kMetadataKey) return invalid("\"__metadata__\" is reserved, not a tensor name");
    if (!IsValidUtf8(s.name)) return invalid(absl::StrCat("tensor #", i, " name is not UTF-8"));
    if (!seen.insert(s.name).second) {
      return invalid(absl::StrCat("tensor '", s.name, "' appears more than once"));
    }
    if (s.dtype != DType::kF32 && s.dtype != DType::kF16 && s.dtype != DType::kBF16) {
      return invalid(absl::StrCat("tensor '", s.name, "' has an invalid dtype"));
    }
    const std::optional<int64_t> bytes = CheckedSizeBytes(s.shape, SizeOf(s.dtype), nullptr);
    if (!bytes.has_value()) {
      return invalid(absl::StrCat("tensor '", s.name, "' shape ", ShapeString(s.shape),
                                  " has a negative dimension or overflows"));
    }
    sizes[i] = *bytes;
  }
  for (const auto& [key, value] : metadata) {
    if (!IsValidUtf8(key) || !IsValidUtf8(value)) {
      return invalid("a metadata key or value is not valid UTF-8");
    }
  }
  if (max_piece_bytes < 1) {
    return invalid(absl::StrCat("max_piece_bytes must be positive, got ", max_piece_bytes));
  }

  // Data order: larger elements first, then by name, so that with the 8-aligned buffer start every
  // tensor is aligned to its element size.
  std::vector<size_t> order(specs.size());
  std::iota(order.begin(), order.end(), size_t{0});
  std::sort(order.begin(), order.end(), [&](size_t a, size_t b) {
    const int64_t sa = SizeOf(specs[a].dtype), sb = SizeOf(specs[b].dtype);
    if (sa != sb) return sa > sb;
    return specs[a].name < specs[b].name;
  });
  std::vector<int64_t> begin(specs.size());
  int64_t offset = 0;
  for (size_t i : order) {
    begin[i] = offset;
    if (__builtin_add_overflow(offset, sizes[i], &offset)) return invalid("total size overflows");
  }

  // Header: "__metadata__" first (as the reference writer does), then tensors sorted by name.
  nlohmann::ordered_json header = nlohmann::ordered_json::object();
  if (!metadata.empty()) {
    nlohmann::ordered_json m = nlohmann::ordered_json::object();
    for (const auto& [key, value] : metadata) m[key] = value;
    header[std::string(kMetadataKey)] = std::move(m);
  }
  std::vector<size_t> by_name(specs.size());
  std::iota(by_name.begin(), by_name.end(), size_t{0});
  std::sort(by_name.begin(), by_name.end(),
            [&](size_t a, size_t b) { return specs[a].name < specs[b].name; });
  for (size_t i : by_name) {
    nlohmann::ordered_json entry = nlohmann::ordered_json::object();
    entry["dtype"] = std::string(SafetensorsDTypeName(specs[i].dtype));
    entry["shape"] = specs[i].shape;
    entry["data_offsets"] = {begin[i], begin[i] + sizes[i]};
    header[specs[i].name] = std::move(entry);
  }
  std::string text = header.dump();  // all strings were checked to be UTF-8: dump cannot throw
  text.append((8 - text.size() % 8) % 8, ' ');
  const uint64_t header_size = text.size();

  // Write to a temporary file in the same directory, then rename over `path`.
  return WriteFileAtomically(path, [&](int fd, const std::string& tmp_path) -> absl::Status {
    RETURN_IF_ERROR(WriteAll(fd, &header_size, sizeof(header_size), tmp_path));
    RETURN_IF_ERROR(WriteAll(fd, text.data(), text.size(), tmp_path));
    std::vector<uint8_t> buffer;
    for (size_t i : order) {
      const int64_t elem_size = SizeOf(specs[i].dtype);
      const int64_t piece_elems = std::max<int64_t>(1, max_piece_bytes / elem_size);
      const int64_t numel = sizes[i] / elem_size;
      int64_t first = 0;
      do {
        const int64_t n = std::min(piece_elems, numel - first);
        buffer.resize(static_cast<size_t>(n * elem_size));
        RETURN_IF_ERROR(fill(i, first, absl::MakeSpan(buffer)));
        RETURN_IF_ERROR(WriteAll(fd, buffer.data(), buffer.size(), tmp_path));
        first += n;
      } while (first < numel);
    }
    return absl::OkStatus();
  });
}

absl::Status WriteSafetensors(const std::string& path,
                              absl::Span<const SafetensorsTensorData> tensors,
                              const std::map<std::string, std::string>& metadata) {
  std::vector<SafetensorsTensorSpec> specs;
  specs.reserve(tensors.size());
  for (const SafetensorsTensorData& t : tensors) {
    const std::optional<int64_t> want =
        CheckedSizeBytes(t.spec.shape, SizeOf(t.spec.dtype), nullptr);
    if (want.has_value() && *want != static_cast<int64_t>(t.bytes.size())) {
      return absl::InvalidArgumentError(absl::StrCat(
          "cannot write safetensors file '", path, "': tensor '", t.spec.name, "' has shape ",
          ShapeString(t.spec.shape), " of ", SafetensorsDTypeName(t.spec.dtype), " (", *want,
          " bytes) but ", t.bytes.size(), " bytes of data"));
    }
    specs.push_back(t.spec);
  }
  return WriteSafetensors(path, specs, metadata,
                          [&](size_t index, absl::Span<uint8_t> dst) -> absl::Status {
                            if (!dst.empty()) {
                              std::memcpy(dst.data(), tensors[index].bytes.data(), dst.size());
                            }
                            return absl::OkStatus();
                          });
}

}  // namespace ps
