// The files a training run reads and writes, checked against each other before anything is opened
// for writing: an output must never destroy an input (or another output).
//
// Without this check, `--metrics_out=train.bin --train_data=train.bin` truncates the token file
// the trainer has memory-mapped, and the process dies of SIGBUS.
//
// What counts as the same file. Paths are compared by what they name on the filesystem, not by
// spelling, so symlinks, hard links, "..", bind mounts and relative paths are all seen through:
//   - a path that exists is identified by (st_dev, st_ino) of what stat(2) finds (symlinks
//     followed), so two hard links to one file are the same file; an input that is a pipe,
//     FIFO, socket or device (--config=<(...), --config=/dev/stdin) need not resolve to a path
//     (a pipe's /proc link does not), only outputs must;
//   - a dangling symlink is identified by the path it points to (followed up to 40 times, as the
//     kernel does when an output is created through it);
//   - a path that does not exist (yet) is identified by its nearest existing ancestor directory
//     (st_dev, st_ino) and the remaining components, lexically normalized: "out/../m.jsonl" and
//     "./m.jsonl" name the same future file. Such a path can never be an existing input, but two
//     outputs can still collide this way.
//
// The rules (CheckRunPaths), each an InvalidArgument naming both paths as the user wrote them and
// the config key / flag of each:
//   1. No output is the same file as an input (the config file, data.train, data.val,
//      checkpoint.init_from) or as another output (profile.metrics, profile.trace,
//      checkpoint.export, checkpoint.dir). Two inputs may be the same file (validating on the
//      training data is allowed).
//   2. The checkpoint directory (kCheckpointRoot) owns the entries it creates, renames and
//      deletes — those named step-*, .tmp-* and rank-* directly inside it (see
//      trainer/io/checkpoint_dir.h; rank-* holds the other ranks' roots under ZeRO). No other
//      path, input or output, may lie inside one of them: pruning would delete it. Anything else
//      inside the checkpoint directory is never touched, so `--save_dir=.` with the data in the
//      current directory is fine.
//   3. A directory replaced as a whole (kReplacedDirectory, a Hugging Face export directory,
//      model/atomic_directory.h) may not contain any other path.
//   4. Outputs must be creatable: an output file may not be an existing directory and its parent
//      directory must exist; a checkpoint root or replaced directory may not be an existing
//      non-directory, and its nearest existing ancestor must be a directory. (Caught here, not
//      after hours of training when the export is written.)
// Only the paths listed are checked; the resumed checkpoint is the checkpoint root itself.
//
// Errors: InvalidArgument as above; the errno's canonical code (naming the path and its key) when
// a path cannot be examined (e.g. PermissionDenied on a parent directory, ELOOP).
//
// Thread safety: thread-safe (reads the filesystem only). The answer is about the filesystem at
// the time of the call; a path created or replaced concurrently by another process is not seen.
#ifndef PATRICKSTAR_TRAINER_IO_RUN_PATHS_H_
#define PATRICKSTAR_TRAINER_IO_RUN_PATHS_H_

#include <string>

#include "absl/status/status.h"
#include "absl/types/span.h"

namespace ps {

// A file the run reads. `name` is how the user wrote it, e.g. "data.train (--train_data)".
struct RunInput {
  std::string path;
  std::string name;
};

enum class RunOutputKind {
  // A file created, truncated, appended to or replaced by a rename (metrics, trace, export).
  kFile,
  // A checkpoint root (see rule 2).
  kCheckpointRoot,
  // A directory replaced as a whole (see rule 3).
  kReplacedDirectory,
};

struct RunOutput {
  std::string path;
  std::string name;
  RunOutputKind kind = RunOutputKind::kFile;
};

// Checks `inputs` and `outputs` (empty paths are skipped) against the rules of the file comment.
[[nodiscard]] absl::Status CheckRunPaths(absl::Span<const RunInput> inputs,
                                         absl::Span<const RunOutput> outputs);

}  // namespace ps

#endif  // PATRICKSTAR_TRAINER_IO_RUN_PATHS_H_
