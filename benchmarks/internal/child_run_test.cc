// RunInChild: the child's result comes back whole; the body runs in another process (the
// parent's memory is untouched); a child that dies or exits before sending is reported with its
// wait status, a SIGKILL as the likely OOM killer, and the rest of the result zeroed.
#include "benchmarks/internal/child_run.h"

#include <sys/wait.h>
#include <unistd.h>

#include <csignal>
#include <cstdint>
#include <cstdio>
#include <string>

#include "gtest/gtest.h"

namespace ps::benchmarks_internal {
namespace {

struct Result {
  bool ok = false;
  int64_t pid = 0;
  double values[1000] = {};  // larger than a pipe's atomic write
  char error[128] = {};
};

TEST(RunInChildTest, ReturnsTheChildsResult) {
  const Result r = RunInChild<Result>([](Result& out) {
    out.ok = true;
    out.pid = getpid();
    for (int i = 0; i < 1000; ++i) out.values[i] = 0.5 * i;
  });
  EXPECT_TRUE(r.ok);
  EXPECT_NE(r.pid, getpid());
  EXPECT_NE(r.pid, 0);
  for (int i = 0; i < 1000; ++i) ASSERT_EQ(r.values[i], 0.5 * i) << i;
  EXPECT_STREQ(r.error, "");
}

TEST(RunInChildTest, BodyRunsInAnotherProcess) {
  int touched = 0;
  const Result r = RunInChild<Result>([&touched](Result& out) {
    touched = 1;
    out.ok = true;
  });
  EXPECT_TRUE(r.ok);
  EXPECT_EQ(touched, 0);
}

TEST(RunInChildTest, SigkilledChildIsReportedAsTheLikelyOomKiller) {
  const Result r = RunInChild<Result>([](Result& out) {
    out.ok = true;
    raise(SIGKILL);
  });
  EXPECT_FALSE(r.ok);
  EXPECT_EQ(r.pid, 0);
  EXPECT_STREQ(r.error,
               "the training process died (wait status 9: SIGKILL, likely the OOM killer)");
}

TEST(RunInChildTest, ChildThatExitsWithoutSendingIsReportedWithItsWaitStatus) {
  const Result r = RunInChild<Result>([](Result& out) {
    out.ok = true;
    _exit(3);
  });
  EXPECT_FALSE(r.ok);
  char expected[128];
  std::snprintf(expected, sizeof(expected), "the training process died (wait status %d)", 3 << 8);
  EXPECT_STREQ(r.error, expected);
}

}  // namespace
}  // namespace ps::benchmarks_internal
