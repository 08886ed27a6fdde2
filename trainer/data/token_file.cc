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

// The magic number of llm.c's model checkpoints, to say what a foreign file is.
constexpr int32_t kLlmcModelMagic = 20240326;

// The largest of n tokens (0 for none): a plain reduction the compiler vectorizes.
template <typename T>
uint32_t MaxOf(const T* tokens, size_t n) {
  T max = 0;
  for (size_t i = 0; i < n; ++i) max = tokens[i] > max ? tokens[i] : max;
  return max;
}

template <typename T>
absl::Status WriteTokens(const std::string& path, absl::Span<const T> tokens, int32_t magic,
                         int32_t version) {
  if (tokens.size() > static_cast<size_t>(std::numeric_limits<int32_t>::max())) {
    return absl::InvalidArgumentError(
        absl::StrCat("cannot write token file '", path, "': ", tokens.size(),
                     " tokens exceed the format's limit of ", std::numeric_limits<int32_t>::max(),
                     " (the header's count is an int32); split the data into several files"));
  }
  int32_t header[kTokenFileHeaderInts] = {};
  header[0] = magic;
  header[1] = version;
  header[2] = static_cast<int32_t>(tokens.size());
  return WriteFileAtomically(path, [&](int fd, const std::string& tmp_path) -> absl::Status {
    RETURN_IF_ERROR(WriteAll(fd, header, sizeof(header), tmp_path));
    return WriteAll(fd, tokens.data(), tokens.size() * sizeof(T), tmp_path);
  });
}

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
  if (magic != kTokenFileMagic && magic != kTokenFile32Magic) {
    if (magic == kLlmcModelMagic) {
      return corrupt(
          absl::StrCat("this is an llm.c model checkpoint (magic ", magic, "), not a token file"));
    }
    return corrupt(absl::StrCat("bad magic number ", magic, " (expected ", kTokenFileMagic,
                                " for uint16 tokens or ", kTokenFile32Magic,
                                " for uint32 tokens); not an llm.c token file", text_hint));
  }
  const bool wide = magic == kTokenFile32Magic;
  const int32_t want_version = wide ? kTokenFile32Version : kTokenFileVersion;
  if (version != want_version) {
    return corrupt(absl::StrCat("unsupported version ", version, " for magic ", magic,
                                "; llm.c writes version ", want_version, " (",
                                wide ? "uint32" : "uint16", " tokens) with that magic"));
  }
  if (count < 0) {
    return corrupt(absl::StrCat("the header's token count is negative (", count, ")"));
  }
  const uint64_t width = wide ? sizeof(uint32_t) : sizeof(uint16_t);
  const absl::string_view type = wide ? "uint32" : "uint16";
  const uint64_t payload_bytes = file_size - kTokenFileHeaderBytes;
  const uint64_t declared_bytes = static_cast<uint64_t>(count) * width;
  if (payload_bytes != declared_bytes) {
    const uint64_t other_width = wide ? sizeof(uint16_t) : sizeof(uint32_t);
    if (count > 0 && payload_bytes == static_cast<uint64_t>(count) * other_width) {
      return corrupt(absl::StrCat("the header (magic ", magic, ", version ", version, ") says ",
                                  type, " tokens, but the ", payload_bytes, " bytes after it hold ",
                                  count, " tokens of ", other_width,
                                  " bytes; the file was written with the other token width"));
    }
  }
  if (payload_bytes < declared_bytes) {
    return corrupt(absl::StrCat("truncated: the header declares ", count, " ", type, " tokens (",
                                declared_bytes, " bytes after the header) but the file has only ",
                                payload_bytes, " bytes after the header (", payload_bytes / width,
                                " tokens)"));
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
  const uint8_t* payload = static_cast<const uint8_t*>(addr) + kTokenFileHeaderBytes;
  const auto n = static_cast<size_t>(count);
  if (wide) {
    const auto* tokens = reinterpret_cast<const uint32_t*>(payload);
    file.tokens_ = absl::MakeConstSpan(tokens, n);
    file.max_token_ = MaxOf(tokens, n);
  } else {
    const auto* tokens = reinterpret_cast<const uint16_t*>(payload);
    file.tokens_ = absl::MakeConstSpan(tokens, n);
    file.max_token_ = MaxOf(tokens, n);
  }
  return file;
}

absl::Status TokenFile::CheckVocabSize(int64_t vocab_size) const {
  if (static_cast<int64_t>(max_token_) < vocab_size) return absl::OkStatus();
  size_t pos = 0;
  while (pos < tokens_.size() && static_cast<int64_t>(tokens_[pos]) < vocab_size) ++pos;
  return absl::InvalidArgumentError(absl::StrCat(
      "token file '", path_, "': token ", tokens_[pos], " at position ", pos, " of ",
      tokens_.size(), " is not below the model's vocabulary size ", vocab_size,
      " (the file's largest token is ", max_token_, "); it was tokenized for a larger vocabulary"));
}

TokenFile::TokenFile(TokenFile&& other) noexcept
    : path_(std::move(other.path_)),
      map_addr_(std::exchange(other.map_addr_, nullptr)),
      map_size_bytes_(std::exchange(other.map_size_bytes_, 0)),
      tokens_(std::exchange(other.tokens_, {})),
      max_token_(std::exchange(other.max_token_, 0u)) {}

TokenFile& TokenFile::operator=(TokenFile&& other) noexcept {
  if (this != &other) {
    Unmap();
    path_ = std::move(other.path_);
    map_addr_ = std::exchange(other.map_addr_, nullptr);
    map_size_bytes_ = std::exchange(other.map_size_bytes_, 0);
    tokens_ = std::exchange(other.tokens_, {});
    max_token_ = std::exchange(other.max_token_, 0u);
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
  return WriteTokens(path, tokens, kTokenFileMagic, kTokenFileVersion);
}

absl::Status WriteTokenFile(const std::string& path, absl::Span<const uint32_t> tokens) {
  return WriteTokens(path, tokens, kTokenFile32Magic, kTokenFile32Version);
}

}  // namespace ps
