// Crash safety of checkpoint directories, for real: a child process writes a checkpoint (large
// files, slowly) and the parent kills it with SIGKILL after a random delay, many times. After every
// kill the previous checkpoint must be intact and loadable, nothing half-written may be listed as
// committed, and the next writer must clean up the debris.
#include <signal.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include <algorithm>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <random>
#include <string>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "base/crc32c.h"
#include "base/testing/status_matchers.h"
#include "gtest/gtest.h"
#include "trainer/io/checkpoint_dir.h"

namespace ps {
namespace {

namespace fs = std::filesystem;

constexpr int kFiles = 3;
constexpr size_t kFileBytes = size_t{2} << 20;
constexpr size_t kChunkBytes = size_t{64} << 10;
constexpr int kKeepLast = 2;

// The deterministic contents of file `f` of checkpoint `step`, produced chunk by chunk.
class Contents {
 public:
  Contents(int64_t step, int f) : rng_(static_cast<uint64_t>(step) * 16 + f) {}
  void Next(std::string* chunk) {
    chunk->resize(kChunkBytes);
    for (size_t i = 0; i < kChunkBytes; i += 8) {
      const uint64_t v = rng_();
      std::memcpy(chunk->data() + i, &v, 8);
    }
  }

 private:
  std::mt19937_64 rng_;
};

uint32_t ExpectedCrc(int64_t step, int f) {
  Contents contents(step, f);
  std::string chunk;
  uint32_t crc = 0;
  for (size_t done = 0; done < kFileBytes; done += kChunkBytes) {
    contents.Next(&chunk);
    crc = Crc32cExtend(crc, chunk.data(), chunk.size());
  }
  return crc;
}

int64_t NowUs() {
  timespec ts;
  ::clock_gettime(CLOCK_MONOTONIC, &ts);
  return int64_t{ts.tv_sec} * 1000000 + ts.tv_nsec / 1000;
}

// Runs in the child: writes checkpoint `step` slowly, commits, exits 0. Never returns.
[[noreturn]] void WriteCheckpointAndExit(const std::string& root, int64_t step) {
  CheckpointOptions options;
  options.keep_last = kKeepLast;
  absl::StatusOr<CheckpointWriter> w = CheckpointWriter::Begin(root, step, options);
  if (!w.ok()) {
    std::fprintf(stderr, "child: %s\n", w.status().ToString().c_str());
    ::_exit(10);
  }
  std::string chunk;
  for (int f = 0; f < kFiles; ++f) {
    const std::string name = absl::StrCat("shard-", f, ".bin");
    FILE* out = std::fopen(w->FilePath(name).c_str(), "wb");
    if (out == nullptr) ::_exit(11);
    Contents contents(step, f);
    for (size_t done = 0; done < kFileBytes; done += kChunkBytes) {
      contents.Next(&chunk);
      if (std::fwrite(chunk.data(), 1, chunk.size(), out) != chunk.size()) ::_exit(12);
      std::fflush(out);
      ::usleep(100);
    }
    if (std::fclose(out) != 0) ::_exit(13);
    if (!w->AddFile(name).ok()) ::_exit(14);
  }
  absl::StatusOr<std::string> dir = w->Commit({{"step", step}, {"marker", "complete"}});
  if (!dir.ok()) {
    std::fprintf(stderr, "child: %s\n", dir.status().ToString().c_str());
    ::_exit(15);
  }
  ::_exit(0);
}

// Forks a writer of `step`; kills it after `kill_after_us` (never when negative). Returns true if
// the child ran to completion.
bool RunWriter(const std::string& root, int64_t step, int64_t kill_after_us, int64_t* elapsed_us) {
  const int64_t start = NowUs();
  const pid_t pid = ::fork();
  if (pid == 0) WriteCheckpointAndExit(root, step);
  EXPECT_GT(pid, 0);
  if (kill_after_us >= 0) {
    ::usleep(static_cast<useconds_t>(kill_after_us));
    ::kill(pid, SIGKILL);
  }
  int status = 0;
  EXPECT_EQ(::waitpid(pid, &status, 0), pid);
  *elapsed_us = NowUs() - start;
  if (WIFEXITED(status)) {
    EXPECT_EQ(WEXITSTATUS(status), 0) << "the writer failed on its own (see its stderr)";
    return true;
  }
  EXPECT_TRUE(WIFSIGNALED(status) && WTERMSIG(status) == SIGKILL);
  return false;
}

// Every listed checkpoint opens, verifies, and holds exactly what its writer wrote.
void ExpectAllListedIntact(const std::string& root) {
  ASSERT_OK_AND_ASSIGN(const std::vector<CheckpointRef> refs, ListCheckpoints(root));
  for (const CheckpointRef& ref : refs) {
    ASSERT_OK_AND_ASSIGN(const Checkpoint ckpt, OpenCheckpoint(ref.path));
    ASSERT_EQ(ckpt.step, ref.step);
    ASSERT_EQ(ckpt.state["step"], ref.step);
    ASSERT_EQ(ckpt.state["marker"], "complete");
    ASSERT_EQ(ckpt.files.size(), static_cast<size_t>(kFiles));
    for (int f = 0; f < kFiles; ++f) {
      ASSERT_EQ(ckpt.files[f].size_bytes, static_cast<int64_t>(kFileBytes));
      ASSERT_EQ(ckpt.files[f].crc32c, ExpectedCrc(ref.step, f)) << ckpt.files[f].path;
    }
  }
}

std::vector<std::string> TmpEntries(const std::string& root) {
  std::vector<std::string> out;
  for (const auto& e : fs::directory_iterator(root)) {
    const std::string name = e.path().filename();
    if (absl::StartsWith(name, ".tmp-")) out.push_back(name);
  }
  return out;
}

TEST(CheckpointCrashTest, SigkillAtRandomPointsNeverCorruptsCommittedCheckpoints) {
  const std::string root = absl::StrCat(::testing::TempDir(), "/checkpoint_crash_", ::getpid());
  fs::remove_all(root);

  // Two checkpoints written without interruption measure how long a write takes (the faster one:
  // the first run pays for cold caches).
  int64_t duration_us = 0, second_us = 0;
  ASSERT_TRUE(RunWriter(root, 1, -1, &duration_us));
  ASSERT_TRUE(RunWriter(root, 2, -1, &second_us));
  duration_us = std::min(duration_us, second_us);
  ExpectAllListedIntact(root);

  std::mt19937_64 rng(20241120);
  constexpr int kTrials = 40;
  int completed = 0, killed_before_commit = 0, killed_after_commit = 0;
  size_t max_debris = 0;
  for (int trial = 0; trial < kTrials; ++trial) {
    SCOPED_TRACE(absl::StrCat("trial ", trial));
    ASSERT_OK_AND_ASSIGN(const CheckpointRef prev, LatestCheckpoint(root));
    const int64_t step = prev.step + 1;
    // Half the kills anywhere in the write, half near the end (commit, rename, pruning); every
    // tenth trial runs to completion.
    int64_t kill_after_us = -1;
    if (trial % 10 != 9) {
      kill_after_us =
          trial % 2 == 0
              ? static_cast<int64_t>(rng() % static_cast<uint64_t>(duration_us * 13 / 10 + 1))
              : duration_us * 7 / 10 +
                    static_cast<int64_t>(rng() % static_cast<uint64_t>(duration_us * 4 / 10 + 1));
    }
    int64_t elapsed_us = 0;
    const bool finished = RunWriter(root, step, kill_after_us, &elapsed_us);
    if (kill_after_us < 0) duration_us = std::min(duration_us, elapsed_us);

    ASSERT_OK_AND_ASSIGN(const std::vector<CheckpointRef> refs, ListCheckpoints(root));
    std::vector<int64_t> steps;
    for (const CheckpointRef& r : refs) steps.push_back(r.step);
    // The previous checkpoint survives whatever happened (keep_last = 2 keeps it).
    ASSERT_TRUE(std::find(steps.begin(), steps.end(), prev.step) != steps.end());
    const bool committed = std::find(steps.begin(), steps.end(), step) != steps.end();
    if (finished) {
      ASSERT_TRUE(committed);
      ++completed;
    } else if (committed) {
      ++killed_after_commit;
    } else {
      ++killed_before_commit;
    }
    // A writer that ran to the end pruned down to keep_last (one killed between its commit and
    // its pruning leaves an extra checkpoint, which the next completed writer prunes).
    if (finished) {
      ASSERT_EQ(steps.size(), static_cast<size_t>(kKeepLast));
    }
    ExpectAllListedIntact(root);
    max_debris = std::max(max_debris, TmpEntries(root).size());
  }
  std::printf(
      "crash trials: %d, completed %d, killed before the commit point %d, killed after it %d; "
      "one write takes ~%lld us; at most %zu .tmp-* entries at once\n",
      kTrials, completed, killed_before_commit, killed_after_commit,
      static_cast<long long>(duration_us), max_debris);
  EXPECT_GE(completed, kTrials / 10);
  EXPECT_GT(killed_before_commit, 0);

  // The next writer removes all the debris of the dead ones.
  ASSERT_OK_AND_ASSIGN(const CheckpointRef latest, LatestCheckpoint(root));
  CheckpointOptions options;
  options.keep_last = kKeepLast;
  ASSERT_OK_AND_ASSIGN(CheckpointWriter w, CheckpointWriter::Begin(root, latest.step + 1, options));
  EXPECT_EQ(TmpEntries(root), std::vector<std::string>{fs::path(w.path()).filename()});
  ASSERT_OK(w.WriteFile("x.bin", "x"));
  ASSERT_OK(w.Commit({}));
  EXPECT_TRUE(TmpEntries(root).empty());
  ASSERT_OK_AND_ASSIGN(const std::vector<CheckpointRef> refs, ListCheckpoints(root));
  ASSERT_EQ(refs.size(), static_cast<size_t>(kKeepLast));
  EXPECT_EQ(refs[0].step, latest.step);
  fs::remove_all(root);
}

}  // namespace
}  // namespace ps
