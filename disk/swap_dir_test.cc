#include "disk/swap_dir.h"

#include <fcntl.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <filesystem>
#include <string>

#include "absl/strings/str_cat.h"
#include "base/testing/status_matchers.h"
#include "disk/testing/scoped_test_dir.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace ps {
namespace {

using ::testing::AllOf;
using ::testing::HasSubstr;
using ::testing::UnorderedElementsAre;

bool Exists(const std::string& path) { return std::filesystem::exists(path); }

void Touch(const std::string& path) {
  const int fd = ::open(path.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0600);
  CHECK_GE(fd, 0) << path;
  CHECK_EQ(::write(fd, "swap", 4), 4);
  ::close(fd);
}

// A child process that claims `dir` for the given ranks, creates their swap files, tells the
// parent (one byte on a pipe) and then waits for a signal. `before` runs first in the child.
pid_t StartClaimingChild(const std::string& dir, std::initializer_list<int> ranks,
                         void (*before)() = nullptr) {
  int ready[2];
  CHECK_EQ(::pipe(ready), 0);
  const pid_t pid = ::fork();
  CHECK_GE(pid, 0);
  if (pid == 0) {
    ::close(ready[0]);
    if (before != nullptr) before();
    std::vector<std::unique_ptr<SwapDir>> claims;
    for (int rank : ranks) {
      absl::StatusOr<std::unique_ptr<SwapDir>> claim = SwapDir::Claim(dir, rank);
      if (!claim.ok()) ::_exit(10);
      Touch((*claim)->swap_path());
      claims.push_back(*std::move(claim));
    }
    if (::write(ready[1], "r", 1) != 1) ::_exit(11);
    while (true) ::pause();
  }
  ::close(ready[1]);
  char byte = 0;
  CHECK_EQ(::read(ready[0], &byte, 1), 1) << "the child failed before claiming";
  ::close(ready[0]);
  return pid;
}

int WaitFor(pid_t pid) {
  int status = 0;
  CHECK_EQ(::waitpid(pid, &status, 0), pid);
  return status;
}

TEST(SwapDir, ClaimsAndRemovesItsFiles) {
  ScopedTestDir dir;
  std::string swap_path, lock_path;
  {
    ASSERT_OK_AND_ASSIGN(std::unique_ptr<SwapDir> claim, SwapDir::Claim(dir.path(), 3));
    swap_path = claim->swap_path();
    lock_path = claim->lock_path();
    EXPECT_EQ(swap_path, dir.path() + "/patrickstar-swap-rank3.bin");
    EXPECT_EQ(lock_path, dir.path() + "/patrickstar-swap-rank3.lock");
    EXPECT_TRUE(claim->removed_stale_files().empty());
    Touch(swap_path);
    // The lock file holds our pid.
    std::string pid(16, '\0');
    const int fd = ::open(lock_path.c_str(), O_RDONLY);
    ASSERT_GE(fd, 0);
    pid.resize(static_cast<size_t>(::read(fd, pid.data(), pid.size())));
    ::close(fd);
    EXPECT_EQ(pid, absl::StrCat(::getpid(), "\n"));
  }
  EXPECT_FALSE(Exists(swap_path));
  EXPECT_FALSE(Exists(lock_path));
  EXPECT_TRUE(std::filesystem::is_empty(dir.path()));
}

TEST(SwapDir, BadDirectoriesAreNamed) {
  ScopedTestDir dir;
  const std::string missing = dir.path() + "/missing";
  EXPECT_THAT(SwapDir::Claim(missing, 0),
              StatusIs(absl::StatusCode::kNotFound, HasSubstr(missing)));
  const std::string file = dir.path() + "/a-file";
  Touch(file);
  EXPECT_THAT(SwapDir::Claim(file, 0),
              StatusIs(absl::StatusCode::kFailedPrecondition,
                       AllOf(HasSubstr(file), HasSubstr("not a directory"))));
  if (::geteuid() != 0) {
    const std::string read_only = dir.path() + "/read-only";
    ASSERT_EQ(::mkdir(read_only.c_str(), 0555), 0);
    EXPECT_THAT(SwapDir::Claim(read_only, 0),
                StatusIs(absl::StatusCode::kPermissionDenied,
                         AllOf(HasSubstr(read_only), HasSubstr("not writable"))));
  }
}

TEST(SwapDir, ALiveRunHoldsTheDirectory) {
  ScopedTestDir dir;
  const pid_t child = StartClaimingChild(dir.path(), {0});
  EXPECT_THAT(SwapDir::Claim(dir.path(), 0),
              StatusIs(absl::StatusCode::kFailedPrecondition,
                       AllOf(HasSubstr(dir.path()), HasSubstr(absl::StrCat("process ", child)),
                             HasSubstr("in use by another run"))));
  // Another rank of the same directory is free.
  EXPECT_OK(SwapDir::Claim(dir.path(), 1));
  // The other run's swap file is not touched.
  EXPECT_TRUE(Exists(dir.path() + "/patrickstar-swap-rank0.bin"));
  ::kill(child, SIGKILL);
  WaitFor(child);
  EXPECT_OK(SwapDir::Claim(dir.path(), 0));
}

TEST(SwapDir, StaleFilesOfAKilledRunAreRemovedAndReported) {
  ScopedTestDir dir;
  // A live rank (ours), whose file must survive.
  ASSERT_OK_AND_ASSIGN(std::unique_ptr<SwapDir> live, SwapDir::Claim(dir.path(), 5));
  Touch(live->swap_path());
  const pid_t child = StartClaimingChild(dir.path(), {0, 1});
  ::kill(child, SIGKILL);
  const int status = WaitFor(child);
  ASSERT_TRUE(WIFSIGNALED(status) && WTERMSIG(status) == SIGKILL);
  const std::string stale0 = dir.path() + "/patrickstar-swap-rank0.bin";
  const std::string stale1 = dir.path() + "/patrickstar-swap-rank1.bin";
  ASSERT_TRUE(Exists(stale0));
  ASSERT_TRUE(Exists(stale1));
  // A probe file of a process that is gone (the child).
  const std::string stale_probe = absl::StrCat(dir.path(), "/patrickstar-probe-", child, "-0.bin");
  Touch(stale_probe);

  ASSERT_OK_AND_ASSIGN(std::unique_ptr<SwapDir> claim, SwapDir::Claim(dir.path(), 0));
  EXPECT_THAT(claim->removed_stale_files(), UnorderedElementsAre(stale0, stale1, stale_probe));
  EXPECT_FALSE(Exists(stale0));
  EXPECT_FALSE(Exists(stale1));
  EXPECT_FALSE(Exists(stale_probe));
  EXPECT_TRUE(Exists(live->swap_path()));
}

void ExpectFilesRemovedAfter(int signal) {
  ScopedTestDir dir;
  struct sigaction current = {};
  ASSERT_EQ(::sigaction(signal, nullptr, &current), 0);
  if (current.sa_handler == SIG_IGN) GTEST_SKIP() << "the signal is ignored in this process";
  const pid_t child = StartClaimingChild(dir.path(), {0});
  ASSERT_TRUE(Exists(dir.path() + "/patrickstar-swap-rank0.bin"));
  ::kill(child, signal);
  const int status = WaitFor(child);
  // The child still dies of the signal...
  EXPECT_TRUE(WIFSIGNALED(status) && WTERMSIG(status) == signal) << status;
  // ...and its files are gone.
  EXPECT_TRUE(std::filesystem::is_empty(dir.path()));
}

TEST(SwapDir, FilesAreRemovedWhenSigtermKillsAProcessWithoutHandlers) {
  ExpectFilesRemovedAfter(SIGTERM);
}

TEST(SwapDir, FilesAreRemovedWhenSigintKillsAProcessWithoutHandlers) {
  ExpectFilesRemovedAfter(SIGINT);
}

extern "C" void ExitQuietly(int) { ::_exit(42); }

TEST(SwapDir, AHandlerOfTheProgramIsLeftInPlace) {
  ScopedTestDir dir;
  // The child's own handler (a trainer's graceful stop, here an immediate exit) stays in charge:
  // the registry does not replace it, so the files are removed only by the program's own exit
  // path (this one skips it).
  const pid_t child = StartClaimingChild(dir.path(), {0}, [] {
    struct sigaction action = {};
    action.sa_handler = &ExitQuietly;
    sigemptyset(&action.sa_mask);
    ::sigaction(SIGTERM, &action, nullptr);
  });
  ::kill(child, SIGTERM);
  const int status = WaitFor(child);
  EXPECT_TRUE(WIFEXITED(status) && WEXITSTATUS(status) == 42) << status;
  EXPECT_TRUE(Exists(dir.path() + "/patrickstar-swap-rank0.bin"));
}

TEST(SwapDir, RegistryEntriesAreReused) {
  ScopedTestDir dir;
  for (int i = 0; i < 200; ++i) {
    const int handle = RegisterFileForSignalCleanup(absl::StrCat(dir.path(), "/f", i));
    ASSERT_GE(handle, 0);
    UnregisterFileForSignalCleanup(handle);
  }
  EXPECT_EQ(RegisterFileForSignalCleanup(std::string(5000, 'x')), -1);
}

}  // namespace
}  // namespace ps
