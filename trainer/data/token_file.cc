#include "trainer/data/token_file.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <bit>
#include <cerrno>
#include <cstring>
#include <limits>
#include <utility>

#include "absl/cleanup/cleanup.h"
#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/string_view.h"
#include "base/file_io.h"
#include "base/status_macros.h"

namespace ps {
namespace {

static_assert(std::endian::native == std::endian::little,
              "token files are little-endian; this reader maps them as native integers");

// Magic numbers of other llm.c files, to say what a foreign file is.
constexpr int32_t kLlmcLlama3TokenMagic = 20240801;
constexpr int32_t kLlmcModelMagic = 20240326;

// True if the first bytes look like text (printable ASCII, whitespace or UTF-8 lead/continuation
// bytes), for the "this is a text file" hint.
bool LooksLikeText(const uint8_t* bytes, size_t size) {
  if (size == 0) return false;
  const size_t n = size < 256 ? size : 256;
  for (size_t i = 0; i < n; ++i) {
    const uint8_t c = bytes[i];
    const bool ok = (c >= 0x20 && c != 0x7f) || c == '\n' || c == '\r' || c == '\t';
    if (!ok) return false;
  }
  return true;
}

}  // namespace

absl::StatusOr<TokenFile> TokenFile::Open(const std::string& path) {
  auto corrupt = [&](absl::string_view what) {
    return absl::DataLossError(absl::StrCat("token file '", path, "': ", what));
  };
  const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) return ErrnoError(errno, "cannot open token file", path);
  absl::Cleanup close_fd = [fd] { ::close(fd); };
  struct stat st;
  if (::fstat(fd, &st) != 0) return ErrnoError(errno, "cannot stat token file", path);
  if (!S_ISREG(st.st_mode)) {
    return absl::InvalidArgumentError(
        absl::StrCat("token file '", path, "' is not a regular file"));
  }
  const auto file_size = static_cast<uint64_t>(st.st_size);
  if (file_size == 0) {
    return corrupt("the file is empty (0 bytes); a token file starts with a 1024-byte header");
  }

  // Read the header (or what there is of it) first, so a short or foreign file is described
  // precisely before anything is mapped.
  uint8_t head[kTokenFileHeaderBytes];
  const size_t want = file_size < sizeof(head) ? static_cast<size_t>(file_size) : sizeof(head);
  size_t got = 0;
  while (got < want) {
    const ssize_t n = ::pread(fd, head + got, want - got, static_cast<off_t>(got));
    if (n < 0) {
      if (errno == EINTR) continue;
      return ErrnoError(errno, "cannot read token file", path);
    }
    if (n == 0) break;
    got += static_cast<size_t>(n);
  }
  if (got != want) {
    return corrupt(
        absl::StrCat("the file shrank while being read (", got, " of ", want, " header bytes)"));
  }
  const absl::string_view text_hint =
      LooksLikeText(head, got)
          ? "; it looks like a text file: convert text with `bazel run //tools:text_to_bin`"
          : "";
  if (file_size < kTokenFileHeaderBytes) {
    return corrupt(
        absl::StrCat("the file is ", file_size, " bytes, shorter than the ", kTokenFileHeaderBytes,
                     "-byte header; it is truncated or not an llm.c token file", text_hint));
  }
  int32_t header[kTokenFileHeaderInts];
  std::memcpy(header, head, sizeof(header));
  const int32_t magic = header[0];
  const int32_t version = header[1];
  const int32_t count = header[2];
  if (magic != kTokenFileMagic) {
    if (magic == kLlmcLlama3TokenMagic) {
      return corrupt(absl::StrCat("this is an llm.c Llama-3 token file (magic ", magic,
                                  ", version ", version,
                                  ", uint32 tokens); only GPT-2-style files (magic ",
                                  kTokenFileMagic, ", version 1, uint16 tokens) are supported"));
    }
    if (magic == kLlmcModelMagic) {
      return corrupt(
          absl::StrCat("this is an llm.c model checkpoint (magic ", magic, "), not a token file"));
    }
    return corrupt(absl::StrCat("bad magic number ", magic, " (expected ", kTokenFileMagic,
                                "); not an llm.c token file", text_hint));
  }
  if (version != kTokenFileVersion) {
    return corrupt(absl::StrCat("unsupported version ", version,
                                "; only version 1 (uint16 tokens) is supported"));
  }
  if (count < 0) {
    return corrupt(absl::StrCat("the header's token count is negative (", count, ")"));
  }
  const uint64_t payload_bytes = file_size - kTokenFileHeaderBytes;
  const uint64_t declared_bytes = static_cast<uint64_t>(count) * sizeof(uint16_t);
  if (payload_bytes < declared_bytes) {
    return corrupt(absl::StrCat("truncated: the header declares ", count, " tokens (",
                                declared_bytes, " bytes after the header) but the file has only ",
                                payload_bytes, " bytes after the header (",
                                payload_bytes / sizeof(uint16_t), " tokens)"));
  }
  if (payload_bytes > declared_bytes) {
    return corrupt(absl::StrCat("the file has ", payload_bytes - declared_bytes,
                                " trailing bytes after the ", count,
                                " tokens its header declares; it is corrupt or was not written "
                                "as one token file"));
  }

  TokenFile file;
  file.path_ = path;
  void* addr = ::mmap(nullptr, file_size, PROT_READ, MAP_PRIVATE, fd, 0);
  if (addr == MAP_FAILED) return ErrnoError(errno, "cannot mmap token file", path);
  file.map_addr_ = addr;
  file.map_size_bytes_ = file_size;
  const auto* tokens =
      reinterpret_cast<const uint16_t*>(static_cast<const uint8_t*>(addr) + kTokenFileHeaderBytes);
  file.tokens_ = absl::MakeConstSpan(tokens, static_cast<size_t>(count));
  uint16_t max_token = 0;
  for (const uint16_t t : file.tokens_) max_token = t > max_token ? t : max_token;
  file.max_token_ = max_token;
  return file;
}

TokenFile::TokenFile(TokenFile&& other) noexcept
    : path_(std::move(other.path_)),
      map_addr_(std::exchange(other.map_addr_, nullptr)),
      map_size_bytes_(std::exchange(other.map_size_bytes_, 0)),
      tokens_(std::exchange(other.tokens_, {})),
      max_token_(std::exchange(other.max_token_, 0)) {}

TokenFile& TokenFile::operator=(TokenFile&& other) noexcept {
  if (this != &other) {
    Unmap();
    path_ = std::move(other.path_);
    map_addr_ = std::exchange(other.map_addr_, nullptr);
    map_size_bytes_ = std::exchange(other.map_size_bytes_, 0);
    tokens_ = std::exchange(other.tokens_, {});
    max_token_ = std::exchange(other.max_token_, 0);
  }
  return *this;
}

TokenFile::~TokenFile() { Unmap(); }

void TokenFile::Unmap() {
  if (map_addr_ != nullptr) ::munmap(map_addr_, map_size_bytes_);
  map_addr_ = nullptr;
  map_size_bytes_ = 0;
  tokens_ = {};
}

absl::Status WriteTokenFile(const std::string& path, absl::Span<const uint16_t> tokens) {
  if (tokens.size() > static_cast<size_t>(std::numeric_limits<int32_t>::max())) {
    return absl::InvalidArgumentError(
        absl::StrCat("cannot write token file '", path, "': ", tokens.size(),
                     " tokens exceed the format's limit of ", std::numeric_limits<int32_t>::max(),
                     " (the header's count is an int32); split the data into several files"));
  }
  int32_t header[kTokenFileHeaderInts] = {};
  header[0] = kTokenFileMagic;
  header[1] = kTokenFileVersion;
  header[2] = static_cast<int32_t>(tokens.size());

  return WriteFileAtomically(path, [&](int fd, const std::string& tmp_path) -> absl::Status {
    RETURN_IF_ERROR(WriteAll(fd, header, sizeof(header), tmp_path));
    return WriteAll(fd, tokens.data(), tokens.size() * sizeof(uint16_t), tmp_path);
  });
}

}  // namespace ps
