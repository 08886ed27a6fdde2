// Small POSIX file helpers shared by every writer of durable files (safetensors, token files,
// checkpoints): errno as a Status naming the path, complete writes, fsync of a path, and the
// write-to-a-temporary-then-rename pattern.
//
// Thread safety: the functions are thread-safe (they share no state).
#ifndef PATRICKSTAR_BASE_FILE_IO_H_
#define PATRICKSTAR_BASE_FILE_IO_H_

#include <cstddef>
#include <string>

#include "absl/functional/function_ref.h"
#include "absl/status/status.h"
#include "absl/strings/string_view.h"

namespace ps {

// absl::ErrnoToStatus(err, "<what> '<path>'"): the canonical code of `err` and a message naming
// the operation and the path.
absl::Status ErrnoError(int err, absl::string_view what, absl::string_view path);

// Writes all `size` bytes of `data` to `fd`, retrying on EINTR and short writes. Errors name
// `path` ("cannot write '<path>'").
[[nodiscard]] absl::Status WriteAll(int fd, const void* data, size_t size, absl::string_view path);

// Opens `path` read-only (with O_DIRECTORY when `directory`) and fsyncs it.
[[nodiscard]] absl::Status FsyncPath(const std::string& path, bool directory);

// Writes `path` atomically: `write(fd, tmp_path)` fills a new temporary file (mode 0644) in the
// same directory, which is then fsync'ed, closed and renamed over `path`, and the directory is
// fsync'ed (when it can be opened). On any error, `write`'s included, the temporary file is
// removed and `path` is untouched; the error names the file.
[[nodiscard]] absl::Status WriteFileAtomically(
    const std::string& path,
    absl::FunctionRef<absl::Status(int fd, const std::string& tmp_path)> write);

}  // namespace ps

#endif  // PATRICKSTAR_BASE_FILE_IO_H_
