#include "trainer/io/run_paths.h"

#include <limits.h>
#include <stdlib.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <filesystem>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"
#include "base/file_io.h"
#include "base/status_macros.h"

namespace ps {
namespace {

// The kernel's limit on symlinks followed while resolving one path.
constexpr int kMaxSymlinks = 40;

struct FileId {
  dev_t dev = 0;
  ino_t ino = 0;
  friend bool operator==(const FileId&, const FileId&) = default;
};

FileId IdOf(const struct stat& st) { return {st.st_dev, st.st_ino}; }

// What a path names (see the file comment of run_paths.h).
struct Identity {
  bool exists = false;
  bool is_dir = false;
  // exists: the file itself; otherwise the nearest existing ancestor (a directory, or a
  // non-directory that makes the path impossible to create).
  FileId id;
  bool ancestor_is_dir = true;
  // The components below `id` that do not exist, lexically normalized ("a/b.json"); empty when
  // the path exists.
  std::string rest;
  // realpath(3) of the existing part (the file, or the nearest existing ancestor).
  std::string anchor;

  // An absolute path without symlinks: the anchor, then the missing components.
  std::string resolved() const {
    if (rest.empty()) return anchor;
    return absl::StrCat(anchor == "/" ? "" : anchor, "/", rest);
  }

  bool SameAs(const Identity& o) const {
    return exists == o.exists && id == o.id && rest == o.rest;
  }
};

std::string StripTrailingSlashes(std::string p) {
  while (p.size() > 1 && p.back() == '/') p.pop_back();
  return p;
}

absl::StatusOr<std::string> RealPath(const std::string& p, const std::string& name) {
  char buf[PATH_MAX];
  if (::realpath(p.c_str(), buf) == nullptr) {
    return ErrnoError(errno, absl::StrCat("cannot resolve ", name), p);
  }
  return std::string(buf);
}

// `rest` joined under `parent_rest`, with "." dropped and ".." applied lexically.
std::string JoinRest(const std::string& parent_rest, const std::string& name) {
  std::vector<std::string> parts;
  for (absl::string_view c : absl::StrSplit(parent_rest, '/', absl::SkipEmpty())) {
    parts.emplace_back(c);
  }
  if (name == "..") {
    if (!parts.empty()) parts.pop_back();
  } else if (name != "." && !name.empty()) {
    parts.push_back(name);
  }
  return absl::StrJoin(parts, "/");
}

// `input`: a file the run only reads. An existing input that realpath(3) cannot resolve — a pipe
// of process substitution, /dev/fd/N, /dev/stdin on a pipe: its /proc link names "pipe:[N]",
// not a path — is identified by (st_dev, st_ino) alone, which is all rule 1 needs; its anchor is
// the path as written (an output must resolve: rules 2-4 place it on the filesystem).
absl::StatusOr<Identity> Identify(const std::string& path, const std::string& name,
                                  bool input = false, int depth = 0) {
  std::string p = StripTrailingSlashes(path);
  for (int links = 0;; ++links) {
    struct stat st;
    if (::stat(p.c_str(), &st) == 0) {
      Identity out;
      out.exists = true;
      out.is_dir = S_ISDIR(st.st_mode);
      out.id = IdOf(st);
      absl::StatusOr<std::string> real = RealPath(p, name);
      if (!real.ok() && input && !S_ISDIR(st.st_mode) && !S_ISREG(st.st_mode)) {
        std::error_code ec;
        const std::filesystem::path absolute = std::filesystem::absolute(p, ec);
        out.anchor = ec ? p : absolute.lexically_normal().string();
        return out;
      }
      ASSIGN_OR_RETURN(out.anchor, std::move(real));
      return out;
    }
    if (errno != ENOENT && errno != ENOTDIR) {
      return ErrnoError(errno, absl::StrCat("cannot examine ", name), p);
    }
    // A dangling symlink: an output created through it lands at its target.
    if (::lstat(p.c_str(), &st) == 0 && S_ISLNK(st.st_mode)) {
      if (links >= kMaxSymlinks) {
        return ErrnoError(ELOOP, absl::StrCat("cannot examine ", name), path);
      }
      std::vector<char> target(static_cast<size_t>(st.st_size > 0 ? st.st_size : PATH_MAX) + 1);
      const ssize_t n = ::readlink(p.c_str(), target.data(), target.size() - 1);
      if (n < 0) return ErrnoError(errno, absl::StrCat("cannot examine ", name), p);
      std::string t(target.data(), static_cast<size_t>(n));
      if (!t.empty() && t[0] != '/') {
        t = (std::filesystem::path(p).parent_path() / t).string();
      }
      p = StripTrailingSlashes(t);
      continue;
    }
    break;
  }
  // Does not exist: the parent's identity plus this name.
  if (depth > 4096) return absl::InvalidArgumentError(absl::StrCat(name, ": path too deep"));
  const std::filesystem::path fp(p);
  std::string parent = fp.parent_path().string();
  const std::string leaf = fp.filename().string();
  if (parent.empty()) parent = ".";
  if (parent == p) {  // "/" cannot be missing; guard against loops anyway
    return absl::InvalidArgumentError(absl::StrCat(name, " '", path, "' cannot be examined"));
  }
  ASSIGN_OR_RETURN(Identity out, Identify(parent, name, /*input=*/false, depth + 1));
  if (out.exists) {
    out.exists = false;
    out.ancestor_is_dir = out.is_dir;
    out.is_dir = false;
  }
  out.rest = JoinRest(out.rest, leaf);
  return out;
}

std::vector<std::string> Components(const std::string& resolved) {
  std::vector<std::string> parts;
  for (absl::string_view c : absl::StrSplit(resolved, '/', absl::SkipEmpty())) {
    parts.emplace_back(c);
  }
  return parts;
}

bool IsCheckpointManagedEntry(absl::string_view entry) {
  return absl::StartsWith(entry, "step-") || absl::StartsWith(entry, ".tmp-") ||
         absl::StartsWith(entry, "rank-");
}

struct Named {
  std::string path;
  std::string name;
  bool output = false;
  RunOutputKind kind = RunOutputKind::kFile;
  Identity id;
};

std::string Describe(const Named& n) { return absl::StrCat(n.name, " '", n.path, "'"); }

// If `inner` lies strictly inside directory `outer` (which exists), the name of the entry of
// `outer` it lies under; nullopt otherwise.
absl::StatusOr<std::optional<std::string>> EntryOfContaining(const Named& inner,
                                                             const Named& outer) {
  if (!outer.id.exists) {
    // Both below the same existing ancestor: compare the missing components lexically.
    if (inner.id.exists || !(inner.id.id == outer.id.id) || outer.id.rest.empty()) {
      return std::nullopt;
    }
    const std::string prefix = outer.id.rest + "/";
    if (!absl::StartsWith(inner.id.rest, prefix)) return std::nullopt;
    const std::string below = inner.id.rest.substr(prefix.size());
    return below.substr(0, below.find('/'));
  }
  const std::vector<std::string> parts = Components(inner.id.resolved());
  // Stat each existing proper ancestor, the deepest first (parts[0, d) for d from the existing
  // part's length down); the first one that is `outer` decides, and parts[d] is the entry.
  const size_t missing = Components(inner.id.rest).size();
  for (size_t d = parts.size() - missing + 1; d-- > 0;) {
    if (d >= parts.size()) continue;  // `inner` itself (rule 1's business)
    const std::string ancestor =
        "/" + absl::StrJoin(parts.begin(), parts.begin() + static_cast<ptrdiff_t>(d), "/");
    struct stat st;
    if (::stat(ancestor.c_str(), &st) != 0) continue;
    if (IdOf(st) == outer.id.id) return parts[d];
  }
  return std::nullopt;
}

}  // namespace

absl::Status CheckRunPaths(absl::Span<const RunInput> inputs, absl::Span<const RunOutput> outputs) {
  std::vector<Named> all;
  for (const RunInput& in : inputs) {
    if (in.path.empty()) continue;
    all.push_back({in.path, in.name, false, RunOutputKind::kFile, {}});
  }
  for (const RunOutput& out : outputs) {
    if (out.path.empty()) continue;
    all.push_back({out.path, out.name, true, out.kind, {}});
  }
  for (Named& n : all) {
    ASSIGN_OR_RETURN(n.id, Identify(n.path, n.name, /*input=*/!n.output));
  }

  // Rule 4: outputs must be creatable.
  for (const Named& n : all) {
    if (!n.output) continue;
    if (n.kind == RunOutputKind::kFile) {
      if (n.id.exists && n.id.is_dir) {
        return absl::InvalidArgumentError(absl::StrCat(
            Describe(n), " is a directory; give a file path (it is written as one file)"));
      }
      if (!n.id.exists && (Components(n.id.rest).size() > 1 || !n.id.ancestor_is_dir)) {
        return absl::InvalidArgumentError(
            absl::StrCat(Describe(n), " cannot be created: its directory '",
                         std::filesystem::path(n.id.resolved()).parent_path().string(),
                         "' does not exist (or is not a directory); create it first"));
      }
    } else {
      if (n.id.exists && !n.id.is_dir) {
        return absl::InvalidArgumentError(
            absl::StrCat(Describe(n), " exists and is not a directory; give a directory path"));
      }
      if (!n.id.exists && !n.id.ancestor_is_dir) {
        return absl::InvalidArgumentError(
            absl::StrCat(Describe(n), " cannot be created: a parent of it is not a directory"));
      }
    }
  }
  // Rule 1: outputs are distinct from everything else.
  for (size_t i = 0; i < all.size(); ++i) {
    for (size_t j = i + 1; j < all.size(); ++j) {
      const Named& a = all[i];
      const Named& b = all[j];
      if (!a.output && !b.output) continue;
      if (!a.id.SameAs(b.id)) continue;
      const Named& out = a.output ? a : b;
      const Named& other = a.output ? b : a;
      return absl::InvalidArgumentError(absl::StrCat(
          Describe(out), " is the same ", out.id.exists ? "file" : "path", " as ", Describe(other),
          out.path == other.path ? "" : " (through a link or another spelling)",
          other.output ? ": two outputs would overwrite each other"
                       : ": writing it would destroy the input",
          "; choose another path"));
    }
  }
  // Rules 2 and 3: nothing inside what the checkpoint writer or a directory replacement owns.
  for (const Named& owner : all) {
    if (!owner.output || owner.kind == RunOutputKind::kFile) continue;
    for (const Named& n : all) {
      if (&n == &owner) continue;
      ASSIGN_OR_RETURN(const std::optional<std::string> entry, EntryOfContaining(n, owner));
      if (!entry.has_value()) continue;
      if (owner.kind == RunOutputKind::kReplacedDirectory) {
        return absl::InvalidArgumentError(absl::StrCat(
            Describe(n), " lies inside ", Describe(owner),
            ", which is replaced as a whole when it is written; move it out or choose another "
            "directory"));
      }
      if (IsCheckpointManagedEntry(*entry)) {
        return absl::InvalidArgumentError(absl::StrCat(
            Describe(n), " lies inside '", *entry, "' of ", Describe(owner),
            ", an entry the checkpoint writer creates, renames and deletes (step-*, .tmp-*, "
            "rank-*); move it out of the checkpoint directory or choose another one"));
      }
    }
  }
  return absl::OkStatus();
}

}  // namespace ps
