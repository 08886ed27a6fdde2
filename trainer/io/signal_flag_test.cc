#include "trainer/io/signal_flag.h"

#include <fcntl.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cstdlib>
#include <functional>
#include <string>

#include "disk/swap_dir.h"
#include "gtest/gtest.h"

namespace ps {
namespace {

// Runs `body` in a forked child (so the test process keeps its own signal dispositions) and
// returns its wait status. The child has 10 s to finish: a flag that is never set shows up as a
// SIGALRM death, not a hang.
int RunInChild(const std::function<int()>& body) {
  const pid_t pid = ::fork();
  if (pid == 0) {
    ::alarm(10);
    ::_exit(body());
  }
  int status = 0;
  EXPECT_EQ(::waitpid(pid, &status, 0), pid);
  return status;
}

TEST(SignalFlagTest, SigtermSetsTheFlagAndStaysHandled) {
  const int status = RunInChild([] {
    if (!InstallStopSignalHandlers().ok()) return 1;
    if (StopRequested() || StopSignal() != 0) return 2;
    ::raise(SIGTERM);
    if (!StopRequested() || StopSignal() != SIGTERM) return 3;
    ::raise(SIGTERM);  // still handled: the process lives on
    if (StopSignal() != SIGTERM) return 4;
    ::raise(SIGINT);  // a later SIGINT does not change the first signal
    if (StopSignal() != SIGTERM) return 5;
    ClearStopRequest();
    if (StopRequested() || StopSignal() != 0) return 6;
    return 0;
  });
  ASSERT_TRUE(WIFEXITED(status)) << "child died of signal " << WTERMSIG(status);
  EXPECT_EQ(WEXITSTATUS(status), 0);
}

TEST(SignalFlagTest, SecondSigintKills) {
  const int status = RunInChild([] {
    if (!InstallStopSignalHandlers().ok()) return 1;
    ::raise(SIGINT);
    if (!StopRequested() || StopSignal() != SIGINT) return 2;
    ::raise(SIGINT);  // the second: terminates the process
    return 3;
  });
  ASSERT_TRUE(WIFSIGNALED(status)) << "child exited with " << WEXITSTATUS(status);
  EXPECT_EQ(WTERMSIG(status), SIGINT);
}

TEST(SignalFlagTest, ReinstallingRearmsSigint) {
  const int status = RunInChild([] {
    if (!InstallStopSignalHandlers().ok()) return 1;
    ::raise(SIGINT);
    ClearStopRequest();
    if (!InstallStopSignalHandlers().ok()) return 2;
    ::raise(SIGINT);  // handled again
    return StopSignal() == SIGINT ? 0 : 3;
  });
  ASSERT_TRUE(WIFEXITED(status)) << "child died of signal " << WTERMSIG(status);
  EXPECT_EQ(WEXITSTATUS(status), 0);
}

TEST(SignalFlagTest, WithoutHandlersSigtermKills) {
  const int status = RunInChild([] {
    ::raise(SIGTERM);
    return 0;
  });
  ASSERT_TRUE(WIFSIGNALED(status));
  EXPECT_EQ(WTERMSIG(status), SIGTERM);
}

std::string TempDir() {
  const char* tmp = std::getenv("TEST_TMPDIR");
  return tmp != nullptr ? tmp : "/tmp";
}

bool Exists(const std::string& path) { return ::access(path.c_str(), F_OK) == 0; }

// The second Ctrl-C kills, but first removes the files registered for removal on a fatal signal
// (the disk tier's swap, lock and probe files): a run killed this way leaves nothing behind.
TEST(SignalFlagTest, SecondSigintRemovesTheRegisteredFilesAndKills) {
  const std::string base = TempDir() + "/signal_flag_test_second_sigint";
  const std::string swap = base + ".bin", lock = base + ".lock", kept = base + ".kept";
  for (const std::string& path : {swap, lock, kept}) {
    const int fd = ::open(path.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0600);
    ASSERT_GE(fd, 0) << path;
    ::close(fd);
  }
  const int status = RunInChild([&] {
    if (!InstallStopSignalHandlers().ok()) return 1;
    if (RegisterFileForSignalCleanup(swap) < 0 || RegisterFileForSignalCleanup(lock) < 0) return 2;
    const int unregistered = RegisterFileForSignalCleanup(kept);
    UnregisterFileForSignalCleanup(unregistered);
    ::raise(SIGINT);  // the first: a graceful stop, nothing removed yet
    if (!StopRequested() || !Exists(swap) || !Exists(lock)) return 3;
    ::raise(SIGINT);  // the second: files removed, then the default action
    return 4;
  });
  ASSERT_TRUE(WIFSIGNALED(status)) << "child exited with " << WEXITSTATUS(status);
  EXPECT_EQ(WTERMSIG(status), SIGINT);
  EXPECT_FALSE(Exists(swap));
  EXPECT_FALSE(Exists(lock));
  EXPECT_TRUE(Exists(kept)) << "a file no longer registered was removed";
  ::unlink(kept.c_str());
}

// A signal sent by another process while the child polls the flag, as a training loop does.
TEST(SignalFlagTest, SignalFromAnotherProcessStopsAPollingLoop) {
  for (int signal : {SIGTERM, SIGINT}) {
    int ready[2];
    ASSERT_EQ(::pipe(ready), 0);
    const pid_t pid = ::fork();
    ASSERT_GE(pid, 0);
    if (pid == 0) {
      ::alarm(10);
      ::close(ready[0]);
      if (!InstallStopSignalHandlers().ok()) ::_exit(1);
      const char byte = 1;
      if (::write(ready[1], &byte, 1) != 1) ::_exit(2);
      while (!StopRequested()) ::usleep(1000);  // one "training step"

      ::_exit(100 + StopSignal());
    }
    ::close(ready[1]);
    char byte;
    ASSERT_EQ(::read(ready[0], &byte, 1), 1);
    ::close(ready[0]);
    ::usleep(5000);
    ASSERT_EQ(::kill(pid, signal), 0);
    int status = 0;
    ASSERT_EQ(::waitpid(pid, &status, 0), pid);
    ASSERT_TRUE(WIFEXITED(status)) << "child died of signal " << WTERMSIG(status);
    EXPECT_EQ(WEXITSTATUS(status), 100 + signal);
  }
}

}  // namespace
}  // namespace ps
