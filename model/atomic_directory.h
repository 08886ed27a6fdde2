// Replacing a directory of files atomically: a reader sees the old directory or the new one,
// never a mix, and a crash or an error leaves the old one in place.
//
// How: the new contents are written into a fresh staging directory beside the target
// ("<parent>/.<name>.tmp.XXXXXX"), fsync'ed, then swapped with the target in one
// renameat2(RENAME_EXCHANGE) (Linux 3.15+; where the file system refuses it, two renames with a
// window in which the target name is briefly absent), the parent directory fsync'ed, and the old
// contents deleted.
//
// Never losing data: the target may be replaced only if it is absent, empty, or looks like what
// is being written — it contains `marker_file` (for a model directory: config.json) and no
// subdirectory. Regular files of the old directory that the new one does not produce (a
// tokenizer.json next to the weights, say) are carried over into the new one (hard-linked, or
// copied where links are impossible), unless `is_replaced(name)` says the writer owns that name
// (old weight shards must not survive next to new ones).
//
// Thread safety: the function shares no state; two calls on the same target race (the later
// swap wins; neither corrupts the other's staging directory).
#ifndef PATRICKSTAR_MODEL_ATOMIC_DIRECTORY_H_
#define PATRICKSTAR_MODEL_ATOMIC_DIRECTORY_H_

#include <functional>
#include <string>

#include "absl/status/status.h"
#include "absl/strings/string_view.h"

namespace ps {

struct DirectoryReplaceOptions {
  // A file whose presence in an existing non-empty target marks it as replaceable.
  std::string marker_file;
  // True for names of the old directory that the writer owns: those are dropped, not carried
  // over, even if the new directory lacks them.
  std::function<bool(absl::string_view name)> is_replaced;
};

// Replaces directory `dir` (whose parent must exist) with the files `write(staging_dir)` creates
// in the empty directory it is given. `write` must create regular files only.
// Errors: FailedPrecondition (naming the target and the reason) when the target is a file, is a
// non-empty directory without the marker file, or has a subdirectory; NotFound when the parent is
// missing; whatever `write` returns (then the staging directory is removed and `dir` untouched);
// I/O errors with their canonical codes, naming the path.
[[nodiscard]] absl::Status ReplaceDirectoryAtomically(
    const std::string& dir, const DirectoryReplaceOptions& options,
    const std::function<absl::Status(const std::string& staging_dir)>& write);

}  // namespace ps

#endif  // PATRICKSTAR_MODEL_ATOMIC_DIRECTORY_H_
