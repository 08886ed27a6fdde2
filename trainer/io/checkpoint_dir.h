// Atomic checkpoint directories: a checkpoint is either fully on disk and verified, or absent.
//
// Layout under a root directory:
//   <root>/step-00000042/              a committed checkpoint (step zero-padded to 8 digits; more
//                                      digits past 99,999,999)
//            manifest.json             {"format": "patrickstar_cc checkpoint", "version": 1,
//                                       "step": 42,
//                                       "files": [{"name": "params.bin", "size_bytes": 1024,
//                                                  "crc32c": "e3069283"}, ...],
//                                       "state": <the caller's JSON>}
//            params.bin ...            the caller's files (flat: names match [A-Za-z0-9._-]+)
//   <root>/.tmp-step-43-<pid>-<rnd>/   a checkpoint being written (or debris of a crashed writer)
//   <root>/.tmp-delete-step-00000040-<pid>-<rnd>/   a pruned checkpoint being deleted
//
// Writing (CheckpointWriter):
//   ASSIGN_OR_RETURN(CheckpointWriter w, CheckpointWriter::Begin(root, step));
//   RETURN_IF_ERROR(w.WriteFile("rng.bin", bytes));          // or: write w.FilePath("params.bin")
//   RETURN_IF_ERROR(w.AddFile("params.bin"));                //     yourself, then AddFile it
//   ASSIGN_OR_RETURN(std::string dir, w.Commit({{"step", step}, {"tokens_seen", n}}));
// Commit() re-reads every file, computing its size and CRC-32C (base/crc32c.h: hardware
// CRC-32C runs at memory speed, so the re-read costs about as much as reading the page cache),
// fsyncs each file, writes and fsyncs the manifest, fsyncs the temporary directory, renames it to
// step-<N> (renameat2 RENAME_NOREPLACE: an existing committed step is never overwritten,
// AlreadyExists), and fsyncs the root. The rename is the commit point: a crash before it leaves
// only a .tmp-* directory, which no reader lists; after it, everything the manifest names is on
// disk.
//
// Pruning, after a commit: keeps the `keep_last` committed checkpoints with the highest steps, and
// never the one just written. A pruned checkpoint is first renamed to .tmp-delete-* (so it vanishes
// from listings atomically) and then deleted, so a crash mid-deletion leaves only debris.
//
// Debris cleanup (in Begin() and after a commit): a directory named .tmp-step-<N>-<pid>-<rnd> or
// .tmp-delete-<...>-<pid>-<rnd> is removed when its writer is gone: <pid> is not a live process
// (kill(pid, 0) fails with ESRCH), or <pid> is this process and no CheckpointWriter of this process
// owns it (a previous run that had the same pid, as happens in containers). Anything else in the
// root is never touched. ASSUMPTION: all writers of one root run on one host in one pid namespace,
// and one at a time; on a root shared across hosts a live remote writer could look dead.
//
// Reading: ListCheckpoints(root) (committed checkpoints only: step-<N> directories holding a
// manifest.json, by increasing step), LatestCheckpoint(root), OpenCheckpoint(dir), which verifies
// the manifest and every file's size and CRC-32C before returning the caller's state.
//
// Error codes: a missing checkpoint file is NotFound; a size or checksum mismatch, or a manifest
// that is not valid JSON or is malformed, is DataLoss naming the file (and both checksums); a
// directory that is not a checkpoint (no manifest, or a manifest of another format) is
// InvalidArgument; a root that is a file is FailedPrecondition; a bad step or file name is
// InvalidArgument; other I/O errors carry the errno's canonical code. Messages name the paths.
//
// Thread safety: CheckpointWriter is not thread-safe (one thread drives it); the free functions are
// thread-safe. Several writers of different roots may run concurrently.
#ifndef PATRICKSTAR_TRAINER_IO_CHECKPOINT_DIR_H_
#define PATRICKSTAR_TRAINER_IO_CHECKPOINT_DIR_H_

#include <cstdint>
#include <string>
#include <vector>

#include "absl/container/flat_hash_set.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "nlohmann/json.hpp"

namespace ps {

inline constexpr absl::string_view kCheckpointManifestName = "manifest.json";
inline constexpr absl::string_view kCheckpointFormat = "patrickstar_cc checkpoint";
inline constexpr int kCheckpointFormatVersion = 1;

// "step-00000042". REQUIRES: step >= 0.
std::string CheckpointDirName(int64_t step);

struct CheckpointOptions {
  // How many committed checkpoints to keep after a commit (the highest steps; the one just
  // written always stays). 0 keeps all. REQUIRES: >= 0.
  int keep_last = 3;
};

// A committed checkpoint directory.
struct CheckpointRef {
  int64_t step = 0;
  std::string path;  // <root>/step-<N>
};

// One file of a checkpoint, as recorded in its manifest.
struct CheckpointFileInfo {
  std::string name;
  std::string path;
  int64_t size_bytes = 0;
  uint32_t crc32c = 0;
};

// A checkpoint opened and verified by OpenCheckpoint.
struct Checkpoint {
  int64_t step = 0;
  std::string path;
  nlohmann::json state;                   // the JSON given to Commit()
  std::vector<CheckpointFileInfo> files;  // sorted by name

  // The path of file `name`; NotFound (listing the files) if the manifest has no such file.
  absl::StatusOr<std::string> FilePath(absl::string_view name) const;
};

class CheckpointWriter {
 public:
  // Creates `root` (with parents) if it does not exist, removes debris of dead writers, and creates
  // the temporary directory. AlreadyExists if step-<N> is already committed; InvalidArgument for a
  // negative step or an empty root or bad options; FailedPrecondition if `root` is not a directory.
  static absl::StatusOr<CheckpointWriter> Begin(const std::string& root, int64_t step,
                                                CheckpointOptions options = {});

  CheckpointWriter(CheckpointWriter&& other) noexcept;
  CheckpointWriter& operator=(CheckpointWriter&& other) noexcept;
  CheckpointWriter(const CheckpointWriter&) = delete;
  CheckpointWriter& operator=(const CheckpointWriter&) = delete;

  // Removes the temporary directory unless Commit() succeeded.
  ~CheckpointWriter();

  // The temporary directory the caller writes files into.
  const std::string& path() const { return tmp_path_; }
  int64_t step() const { return step_; }
  // path() + "/" + name (name not validated here; AddFile does).
  std::string FilePath(absl::string_view name) const;

  // Records that the caller wrote regular file `name` into path(). InvalidArgument for a name that
  // is not [A-Za-z0-9._-]+, is "." or "..", or is "manifest.json"; AlreadyExists if added before;
  // NotFound if the file is not there; FailedPrecondition after Commit()/Abort().
  [[nodiscard]] absl::Status AddFile(absl::string_view name);

  // Writes `bytes` to a new file `name` in path() and adds it. AlreadyExists if the file exists.
  [[nodiscard]] absl::Status WriteFile(absl::string_view name, absl::string_view bytes);

  // Checksums, writes the manifest with `state` under "state", makes everything durable, renames
  // to <root>/step-<N>, prunes and cleans debris (failures there are logged, not returned: the
  // checkpoint is committed). Returns the committed directory. FailedPrecondition if path() holds
  // an entry that was not added (or Commit/Abort ran before); NotFound if an added file is gone;
  // AlreadyExists if step-<N> was committed meanwhile. On error nothing is committed and the
  // temporary directory is removed by the destructor (or Abort()).
  absl::StatusOr<std::string> Commit(const nlohmann::json& state);

  // Removes the temporary directory; the writer is then finished. Idempotent.
  [[nodiscard]] absl::Status Abort();

 private:
  CheckpointWriter() = default;
  void Release();  // forget the temp dir (after commit or abort)

  std::string root_;
  int64_t step_ = 0;
  CheckpointOptions options_;
  std::string tmp_path_;
  bool active_ = false;  // owns tmp_path_ (not committed, not aborted, not moved from)
  std::vector<std::string> files_;
  absl::flat_hash_set<std::string> file_set_;
};

// The committed checkpoints under `root`, by increasing step. An absent root has none (OK);
// FailedPrecondition if `root` is not a directory.
absl::StatusOr<std::vector<CheckpointRef>> ListCheckpoints(const std::string& root);

// The committed checkpoint with the highest step; NotFound if there is none.
absl::StatusOr<CheckpointRef> LatestCheckpoint(const std::string& root);

struct OpenCheckpointOptions {
  // Re-read every file and compare its CRC-32C with the manifest (sizes are always checked).
  bool verify_checksums = true;
};

// Reads and validates `dir`'s manifest and checks every file it lists (see the error codes above).
absl::StatusOr<Checkpoint> OpenCheckpoint(const std::string& dir,
                                          OpenCheckpointOptions options = {});

}  // namespace ps

#endif  // PATRICKSTAR_TRAINER_IO_CHECKPOINT_DIR_H_
