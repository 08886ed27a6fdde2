#include "trainer/data/example_file.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <bit>
#include <cerrno>
#include <cstring>
#include <utility>
#include <vector>

#include "absl/cleanup/cleanup.h"
#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/string_view.h"
#include "base/file_io.h"
#include "base/status_macros.h"

namespace ps {
namespace {

static_assert(std::endian::native == std::endian::little,
              "example files are little-endian; this reader maps them as native integers");

constexpr int kHeaderInts = static_cast<int>(kExampleFileHeaderBytes / sizeof(int32_t));
// Foreign magics, to say what a file is instead.
constexpr int32_t kLlmcTokens16Magic = 20240520;
constexpr int32_t kLlmcTokens32Magic = 20240801;
constexpr int32_t kLlmcModelMagic = 20240326;

uint64_t RoundUp8(uint64_t n) { return (n + 7) / 8 * 8; }

// The example holding token i. REQUIRES: starts valid, 0 <= i < starts.back().
int64_t ExampleOf(absl::Span<const int64_t> starts, int64_t i) {
  return static_cast<int64_t>(std::upper_bound(starts.begin(), starts.end(), i) - starts.begin()) -
         1;
}

// The first broken invariant of `view` as a sentence, or "" if there is none.
std::string BrokenRule(const ExamplesView& view) {
  const auto n = static_cast<int64_t>(view.tokens.size());
  const absl::Span<const int64_t> starts = view.starts;
  if (starts.empty()) {
    return "starts is empty; it must hold E + 1 >= 1 offsets (starts[0] = 0, starts[E] = N)";
  }
  const int64_t e_count = view.num_examples();
  if (static_cast<int64_t>(view.trained.size()) != n) {
    return absl::StrCat("there are ", view.trained.size(), " trained flags for ", n,
                        " tokens; there must be one per token");
  }
  if (starts[0] != 0) {
    return absl::StrCat("starts[0] = ", starts[0], "; the first example must start at token 0");
  }
  if (starts[e_count] != n) {
    return absl::StrCat("starts[E] = starts[", e_count, "] = ", starts[e_count],
                        " but there are N = ", n, " tokens; the last offset must equal N");
  }
  for (int64_t e = 0; e < e_count; ++e) {
    if (starts[e + 1] <= starts[e]) {
      return absl::StrCat("starts is not strictly increasing: starts[", e + 1,
                          "] = ", starts[e + 1], " <= starts[", e, "] = ", starts[e],
                          " (example ", e, " would be empty)");
    }
  }
  // Now every starts[e] with e < E is in [0, N).
  const uint8_t* trained = view.trained.data();
  for (int64_t i = 0; i < n; ++i) {
    if (trained[i] > 1) {
      const int64_t e = ExampleOf(starts, i);
      return absl::StrCat("trained flag of token ", i, " (example ", e, ", position ",
                          i - starts[e], ") is ", static_cast<int>(trained[i]),
                          "; flags are 0 or 1");
    }
  }
  for (int64_t e = 0; e < e_count; ++e) {
    if (trained[starts[e]] != 0) {
      return absl::StrCat("the first token of example ", e, " (token ", starts[e],
                          ") is marked trained; an example's first token has nothing before it "
                          "and cannot be a target");
    }
  }
  return "";
}

template <typename T>
uint32_t MaxOf(absl::Span<const T> tokens) {
  T max = 0;
  for (const T t : tokens) max = t > max ? t : max;
  return max;
}

uint32_t MaxToken(TokenSpan tokens) {
  return tokens.width_bytes() == 2 ? MaxOf(tokens.u16()) : MaxOf(tokens.u32());
}

// Writes tokens [0, n) of `tokens` as `Out` integers, converting in blocks when the widths differ.
template <typename Out>
absl::Status WriteTokensAs(int fd, TokenSpan tokens, const std::string& tmp_path) {
  if (static_cast<size_t>(tokens.width_bytes()) == sizeof(Out)) {
    const void* data = sizeof(Out) == 2 ? static_cast<const void*>(tokens.u16().data())
                                        : static_cast<const void*>(tokens.u32().data());
    return WriteAll(fd, data, tokens.size() * sizeof(Out), tmp_path);
  }
  constexpr size_t kBlock = size_t{1} << 16;
  std::vector<Out> block;
  block.reserve(std::min(kBlock, tokens.size()));
  for (size_t start = 0; start < tokens.size(); start += kBlock) {
    const size_t end = std::min(tokens.size(), start + kBlock);
    block.clear();
    for (size_t i = start; i < end; ++i) block.push_back(static_cast<Out>(tokens[i]));
    RETURN_IF_ERROR(WriteAll(fd, block.data(), block.size() * sizeof(Out), tmp_path));
  }
  return absl::OkStatus();
}

bool LooksLikeText(const uint8_t* bytes, size_t size) {
  if (size == 0) return false;
  const size_t n = std::min<size_t>(size, 256);
  for (size_t i = 0; i < n; ++i) {
    const uint8_t c = bytes[i];
    if (!((c >= 0x20 && c != 0x7f) || c == '\n' || c == '\r' || c == '\t')) return false;
  }
  return true;
}

constexpr absl::string_view kTextHint =
    "; it looks like a text file: prepare JSON Lines with `bazel run //tools:prepare_data`, or "
    "convert plain text with `bazel run //tools:text_to_bin`";

// Reads up to `want` bytes from the start of `fd` into `out`; returns how many were read.
absl::StatusOr<size_t> ReadHead(int fd, uint8_t* out, size_t want, const std::string& path) {
  size_t got = 0;
  while (got < want) {
    const ssize_t n = ::pread(fd, out + got, want - got, static_cast<off_t>(got));
    if (n < 0) {
      if (errno == EINTR) continue;
      return ErrnoError(errno, "cannot read data file", path);
    }
    if (n == 0) break;
    got += static_cast<size_t>(n);
  }
  return got;
}

// Opens `path` read-only as a regular file; returns the descriptor and its size.
absl::StatusOr<std::pair<int, uint64_t>> OpenRegular(const std::string& path,
                                                     absl::string_view what) {
  const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) return ErrnoError(errno, absl::StrCat("cannot open ", what), path);
  struct stat st;
  if (::fstat(fd, &st) != 0) {
    const int err = errno;
    ::close(fd);
    return ErrnoError(err, absl::StrCat("cannot stat ", what), path);
  }
  if (!S_ISREG(st.st_mode)) {
    ::close(fd);
    return absl::InvalidArgumentError(
        absl::StrCat(what, " '", path, "' is not a regular file"));
  }
  return std::make_pair(fd, static_cast<uint64_t>(st.st_size));
}

int64_t HeaderInt64(const int32_t* header, int low) {
  const uint64_t bits = (static_cast<uint64_t>(static_cast<uint32_t>(header[low + 1])) << 32) |
                        static_cast<uint32_t>(header[low]);
  return static_cast<int64_t>(bits);
}

}  // namespace

absl::Status ValidateExamples(const ExamplesView& view) {
  const std::string broken = BrokenRule(view);
  if (broken.empty()) return absl::OkStatus();
  return absl::InvalidArgumentError(absl::StrCat("examples are not well-formed: ", broken));
}

absl::StatusOr<ExampleFile> ExampleFile::Open(const std::string& path) {
  auto corrupt = [&](absl::string_view what) {
    return absl::DataLossError(absl::StrCat("example file '", path, "': ", what));
  };
  ASSIGN_OR_RETURN(const auto fd_size, OpenRegular(path, "example file"));
  const int fd = fd_size.first;
  absl::Cleanup close_fd = [fd] { ::close(fd); };
  const uint64_t file_size = fd_size.second;

  uint8_t head[kExampleFileHeaderBytes];
  const size_t want = static_cast<size_t>(std::min<uint64_t>(file_size, sizeof(head)));
  ASSIGN_OR_RETURN(const size_t got, ReadHead(fd, head, want, path));
  if (got != want) {
    return corrupt(
        absl::StrCat("the file shrank while being read (", got, " of ", want, " header bytes)"));
  }
  const absl::string_view text_hint = LooksLikeText(head, got) ? kTextHint : "";
  if (file_size < kExampleFileHeaderBytes) {
    return corrupt(absl::StrCat("the file is ", file_size, " bytes, shorter than the ",
                                kExampleFileHeaderBytes,
                                "-byte header; it is truncated or not an example file", text_hint));
  }
  int32_t header[kHeaderInts];
  std::memcpy(header, head, sizeof(header));
  const int32_t magic = header[0];
  if (magic != kExampleFileMagic) {
    if (magic == kLlmcTokens16Magic || magic == kLlmcTokens32Magic) {
      return corrupt(absl::StrCat("this is an llm.c token file (magic ", magic,
                                  "), not an example file (magic ", kExampleFileMagic,
                                  "); read it as a token file"));
    }
    if (magic == kLlmcModelMagic) {
      return corrupt(absl::StrCat("this is an llm.c model checkpoint (magic ", magic,
                                  "), not an example file"));
    }
    return corrupt(absl::StrCat("bad magic number ", magic, " (expected ", kExampleFileMagic,
                                "); not an example file", text_hint));
  }
  if (header[1] != kExampleFileVersion) {
    return corrupt(absl::StrCat("unsupported version ", header[1], "; this reader knows version ",
                                kExampleFileVersion));
  }
  const int32_t width = header[2];
  if (width != 2 && width != 4) {
    return corrupt(absl::StrCat("the header's token width is ", width,
                                " bytes; it must be 2 (uint16 tokens) or 4 (uint32 tokens)"));
  }
  for (int k = 3; k < kHeaderInts; ++k) {
    if (k >= 4 && k < 8) continue;
    if (header[k] != 0) {
      return corrupt(absl::StrCat("header word ", k, " is ", header[k],
                                  "; words 3 and 8..255 are reserved and must be 0"));
    }
  }
  const int64_t n = HeaderInt64(header, 4);
  const int64_t e_count = HeaderInt64(header, 6);
  if (n < 0 || e_count < 0) {
    return corrupt(absl::StrCat("the header's counts are negative (N = ", n, " tokens, E = ",
                                e_count, " examples)"));
  }
  const absl::string_view type = width == 2 ? "uint16" : "uint32";
  // Each section is at most the file's size, so the sums below cannot overflow.
  const uint64_t payload_bytes = file_size - kExampleFileHeaderBytes;
  const auto un = static_cast<uint64_t>(n);
  const auto ue = static_cast<uint64_t>(e_count);
  const bool fits = un <= payload_bytes && ue < payload_bytes / 8;
  const uint64_t declared_bytes =
      fits ? RoundUp8(un * static_cast<uint64_t>(width)) + 8 * (ue + 1) + un : 0;
  const std::string layout =
      absl::StrCat("the header declares N = ", n, " ", type, " tokens and E = ", e_count,
                   " examples, which take 1024 + roundup8(", n, " * ", width, ") + 8 * (", e_count,
                   " + 1) + ", n, fits ? absl::StrCat(" = ", kExampleFileHeaderBytes + declared_bytes)
                                       : std::string(),
                   " bytes");
  if (!fits || payload_bytes < declared_bytes) {
    return corrupt(absl::StrCat("truncated: ", layout, ", but the file has only ", file_size,
                                " bytes"));
  }
  if (payload_bytes > declared_bytes) {
    return corrupt(absl::StrCat(payload_bytes - declared_bytes, " trailing bytes: ", layout,
                                ", but the file has ", file_size,
                                " bytes; it is corrupt or was not written as one example file"));
  }

  ExampleFile file;
  file.path_ = path;
  void* addr = ::mmap(nullptr, file_size, PROT_READ, MAP_PRIVATE, fd, 0);
  if (addr == MAP_FAILED) return ErrnoError(errno, "cannot mmap example file", path);
  file.map_addr_ = addr;
  file.map_size_bytes_ = file_size;
  const uint8_t* base = static_cast<const uint8_t*>(addr);
  const uint8_t* tokens = base + kExampleFileHeaderBytes;
  const uint8_t* starts = tokens + RoundUp8(un * static_cast<uint64_t>(width));
  const uint8_t* trained = starts + 8 * (ue + 1);
  if (width == 2) {
    file.view_.tokens = absl::MakeConstSpan(reinterpret_cast<const uint16_t*>(tokens), un);
  } else {
    file.view_.tokens = absl::MakeConstSpan(reinterpret_cast<const uint32_t*>(tokens), un);
  }
  file.view_.starts = absl::MakeConstSpan(reinterpret_cast<const int64_t*>(starts), ue + 1);
  file.view_.trained = absl::MakeConstSpan(trained, un);
  const std::string broken = BrokenRule(file.view_);
  if (!broken.empty()) return corrupt(broken);
  file.max_token_ = MaxToken(file.view_.tokens);
  return file;
}

absl::Status ExampleFile::CheckVocabSize(int64_t vocab_size) const {
  if (static_cast<int64_t>(max_token_) < vocab_size) return absl::OkStatus();
  const TokenSpan& tokens = view_.tokens;
  int64_t pos = 0;
  while (static_cast<int64_t>(tokens[pos]) < vocab_size) ++pos;
  const int64_t e = ExampleOf(view_.starts, pos);
  return absl::InvalidArgumentError(absl::StrCat(
      "example file '", path_, "': token ", tokens[pos], " at position ", pos - view_.starts[e],
      " of example ", e, " (token ", pos, " of ", tokens.size(),
      ") is not below the model's vocabulary size ", vocab_size, " (the file's largest token is ",
      max_token_, "); it was prepared with a tokenizer of a larger vocabulary"));
}

ExampleFile::ExampleFile(ExampleFile&& other) noexcept
    : path_(std::move(other.path_)),
      map_addr_(std::exchange(other.map_addr_, nullptr)),
      map_size_bytes_(std::exchange(other.map_size_bytes_, 0)),
      view_(std::exchange(other.view_, {})),
      max_token_(std::exchange(other.max_token_, 0u)) {}

ExampleFile& ExampleFile::operator=(ExampleFile&& other) noexcept {
  if (this != &other) {
    Unmap();
    path_ = std::move(other.path_);
    map_addr_ = std::exchange(other.map_addr_, nullptr);
    map_size_bytes_ = std::exchange(other.map_size_bytes_, 0);
    view_ = std::exchange(other.view_, {});
    max_token_ = std::exchange(other.max_token_, 0u);
  }
  return *this;
}

ExampleFile::~ExampleFile() { Unmap(); }

void ExampleFile::Unmap() {
  if (map_addr_ != nullptr) ::munmap(map_addr_, map_size_bytes_);
  map_addr_ = nullptr;
  map_size_bytes_ = 0;
  view_ = {};
}

absl::Status WriteExampleFile(const std::string& path, const ExamplesView& view,
                              bool force_width4) {
  const std::string broken = BrokenRule(view);
  if (!broken.empty()) {
    return absl::InvalidArgumentError(
        absl::StrCat("cannot write example file '", path, "': the examples are not well-formed: ",
                     broken));
  }
  const int32_t width = !force_width4 && MaxToken(view.tokens) < 65536 ? 2 : 4;
  const auto n = static_cast<uint64_t>(view.tokens.size());
  const auto e_count = static_cast<uint64_t>(view.num_examples());
  int32_t header[kHeaderInts] = {};
  header[0] = kExampleFileMagic;
  header[1] = kExampleFileVersion;
  header[2] = width;
  header[4] = static_cast<int32_t>(static_cast<uint32_t>(n));
  header[5] = static_cast<int32_t>(static_cast<uint32_t>(n >> 32));
  header[6] = static_cast<int32_t>(static_cast<uint32_t>(e_count));
  header[7] = static_cast<int32_t>(static_cast<uint32_t>(e_count >> 32));
  const uint64_t token_bytes = n * static_cast<uint64_t>(width);
  const uint64_t pad_bytes = RoundUp8(token_bytes) - token_bytes;
  return WriteFileAtomically(path, [&](int fd, const std::string& tmp_path) -> absl::Status {
    RETURN_IF_ERROR(WriteAll(fd, header, sizeof(header), tmp_path));
    if (width == 2) {
      RETURN_IF_ERROR(WriteTokensAs<uint16_t>(fd, view.tokens, tmp_path));
    } else {
      RETURN_IF_ERROR(WriteTokensAs<uint32_t>(fd, view.tokens, tmp_path));
    }
    const uint8_t zeros[8] = {};
    RETURN_IF_ERROR(WriteAll(fd, zeros, pad_bytes, tmp_path));
    RETURN_IF_ERROR(
        WriteAll(fd, view.starts.data(), view.starts.size() * sizeof(int64_t), tmp_path));
    return WriteAll(fd, view.trained.data(), view.trained.size(), tmp_path);
  });
}

absl::StatusOr<DataFileKind> SniffDataFile(const std::string& path) {
  ASSIGN_OR_RETURN(const auto fd_size, OpenRegular(path, "data file"));
  const int fd = fd_size.first;
  absl::Cleanup close_fd = [fd] { ::close(fd); };
  uint8_t head[8] = {};
  const size_t want = static_cast<size_t>(std::min<uint64_t>(fd_size.second, sizeof(head)));
  ASSIGN_OR_RETURN(const size_t got, ReadHead(fd, head, want, path));
  const absl::string_view text_hint = LooksLikeText(head, got) ? kTextHint : "";
  if (got < sizeof(head)) {
    return absl::DataLossError(absl::StrCat(
        "data file '", path, "' is ", got,
        " bytes long; a token file or example file starts with a 1024-byte header", text_hint));
  }
  int32_t magic;
  std::memcpy(&magic, head, sizeof(magic));
  if (magic == kLlmcTokens16Magic || magic == kLlmcTokens32Magic) {
    return DataFileKind::kLlmcTokens;
  }
  if (magic == kExampleFileMagic) return DataFileKind::kExamples;
  const std::string what =
      magic == kLlmcModelMagic ? " (an llm.c model checkpoint)" : std::string(text_hint);
  return absl::DataLossError(absl::StrCat(
      "data file '", path, "' has magic number ", magic, what, "; expected ", kLlmcTokens16Magic,
      " or ", kLlmcTokens32Magic, " (llm.c token file) or ", kExampleFileMagic,
      " (example file from tools/prepare_data)"));
}

}  // namespace ps
