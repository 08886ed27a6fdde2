// Multi-process tests of the mpi communicator: launches `mpirun` on helper binaries
// (comm/testing/mpi_conformance_main.cc, comm/testing/mpi_failure_main.cc) and checks exit codes
// and output. Every launch has a watchdog, so a hang fails the test instead of stalling it.
//
// mpirun flags (checked to work offline, as root, in Bazel's sandbox on a 2-core machine):
//   --allow-run-as-root   CI runs as root
//   --oversubscribe       more ranks than cores
//   --mca btl self,vader  shared memory only (no network interfaces needed)
// and TMPDIR=/tmp: OpenMPI puts its session directory and PMIx's Unix sockets under TMPDIR, and
// Bazel's test TMPDIR is longer than a socket path may be.
#include <stdlib.h>
#include <unistd.h>

#include <cstdlib>
#include <string>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/time/time.h"
#include "base/testing/status_matchers.h"
#include "comm/testing/subprocess.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace ps {
namespace {

std::string Runfile(absl::string_view path) {
  const char* srcdir = std::getenv("TEST_SRCDIR");
  const char* workspace = std::getenv("TEST_WORKSPACE");
  return absl::StrCat(srcdir != nullptr ? srcdir : ".", "/",
                      workspace != nullptr ? workspace : "patrickstar_cc", "/", path);
}

SubprocessResult RunMpi(int np, const std::vector<std::string>& program, absl::Duration timeout) {
  SubprocessOptions options;
  const std::string mpirun = FindMpirun();
  if (access(mpirun.c_str(), X_OK) != 0) {
    ADD_FAILURE() << "mpirun not found (looked in PATH and /usr/bin; set PS_MPIRUN): install "
                     "openmpi-bin (tools/bootstrap.sh does)";
    return {};
  }
  options.argv = {mpirun,         "--allow-run-as-root", "--oversubscribe", "-np",
                  absl::StrCat(np), "--mca",             "btl",             "self,vader",
                  "--tag-output"};
  options.argv.insert(options.argv.end(), program.begin(), program.end());
  // The ranks must not write this test's result files (gtest honours XML_OUTPUT_FILE).
  options.unset_env = {"XML_OUTPUT_FILE", "GTEST_OUTPUT", "TEST_PREMATURE_EXIT_FILE",
                       "TEST_WARNINGS_OUTPUT_FILE", "GTEST_SHARD_*", "TEST_SHARD_*",
                       "TEST_TOTAL_SHARDS", "GTEST_TOTAL_SHARDS", "TMPDIR"};
  options.set_env = {"TMPDIR=/tmp"};
  // Under --config=asan: OpenMPI's multi-rank runtime allocates on its own threads from
  // components it dlcloses at MPI_Finalize, so LeakSanitizer reports them from an "unknown
  // module" that no suppression can name. Leak checking stays on in the in-process tests
  // (//comm:mpi_communicator_test), which cover the same code of ours.
  if (const char* asan = std::getenv("ASAN_OPTIONS"); asan != nullptr) {
    options.unset_env.push_back("ASAN_OPTIONS");
    options.set_env.push_back(absl::StrCat("ASAN_OPTIONS=", asan, ":detect_leaks=0"));
  }
  options.timeout = timeout;
  absl::StatusOr<SubprocessResult> result = RunSubprocess(options);
  EXPECT_OK(result.status());
  return result.ok() ? *result : SubprocessResult{};
}

int CountOccurrences(const std::string& text, const std::string& what) {
  int n = 0;
  for (size_t pos = text.find(what); pos != std::string::npos; pos = text.find(what, pos + 1)) {
    ++n;
  }
  return n;
}

class MpiConformanceOnRanks : public ::testing::TestWithParam<int> {};

// The whole conformance suite on N ranks: every rank must pass every test.
TEST_P(MpiConformanceOnRanks, EveryRankPassesTheSuite) {
  const int np = GetParam();
  const SubprocessResult r =
      RunMpi(np, {Runfile("comm/testing/mpi_conformance_main")}, absl::Seconds(300));
  EXPECT_FALSE(r.timed_out) << r.output;
  EXPECT_EQ(r.exit_code, 0) << DescribeExit(r) << "\n" << r.output;
  EXPECT_EQ(CountOccurrences(r.output, "[  PASSED  ]"), np) << r.output;
  EXPECT_EQ(CountOccurrences(r.output, "[  FAILED  ]"), 0) << r.output;
  // The multi-rank tests ran (not skipped) on every rank.
  EXPECT_EQ(CountOccurrences(r.output, "[       OK ] MpiMultiRank.TimedWaitReportsALatePeer"), np)
      << r.output;
}

INSTANTIATE_TEST_SUITE_P(Np, MpiConformanceOnRanks, ::testing::Values(2, 3),
                         [](const ::testing::TestParamInfo<int>& info) {
                           return absl::StrCat(info.param, "Ranks");
                         });

// A rank SIGKILLed while a collective is in flight: mpirun notices, ends the rank still waiting
// (with no timeout) and exits non-zero, well before the watchdog.
TEST(MpiRankFailure, SigkilledRankEndsTheJob) {
  const SubprocessResult r =
      RunMpi(2, {Runfile("comm/testing/mpi_failure_main"), "sigkill"}, absl::Seconds(90));
  ASSERT_FALSE(r.timed_out) << "the surviving rank hung:\n" << r.output;
  EXPECT_NE(r.exit_code, 0) << r.output;
  EXPECT_THAT(r.output, ::testing::HasSubstr("rank 0: waiting for rank 1"));
  EXPECT_THAT(r.output, ::testing::HasSubstr("rank 1 with PID"));
  EXPECT_THAT(r.output, ::testing::HasSubstr("exited on signal 9 (Killed)"));
  EXPECT_THAT(r.output, ::testing::Not(::testing::HasSubstr("barrier finished")));
}

// A rank that returns an error status from main: the communicator skips MPI_Finalize (which would
// wait forever for the rank stuck in the collective), so mpirun ends the job with that status.
TEST(MpiRankFailure, RankExitingWithAnErrorEndsTheJob) {
  const SubprocessResult r =
      RunMpi(2, {Runfile("comm/testing/mpi_failure_main"), "exit"}, absl::Seconds(90));
  ASSERT_FALSE(r.timed_out) << "the job hung:\n" << r.output;
  EXPECT_EQ(r.exit_code, 3) << DescribeExit(r) << "\n" << r.output;
  EXPECT_THAT(r.output, ::testing::HasSubstr("exited with non-zero status"));
  EXPECT_THAT(r.output, ::testing::HasSubstr("not calling MPI_Finalize"));
}

// The clean path: MPI_Finalize runs at exit on every rank and mpirun exits 0 (without it, mpirun
// would report the ranks as exiting improperly and exit 1).
TEST(MpiRankFailure, CleanExitFinalizesAndSucceeds) {
  const SubprocessResult r =
      RunMpi(2, {Runfile("comm/testing/mpi_failure_main"), "clean"}, absl::Seconds(90));
  ASSERT_FALSE(r.timed_out) << r.output;
  EXPECT_EQ(r.exit_code, 0) << DescribeExit(r) << "\n" << r.output;
  EXPECT_EQ(CountOccurrences(r.output, "all-reduce finished: OK"), 2) << r.output;
  EXPECT_THAT(r.output, ::testing::Not(::testing::HasSubstr("improperly")));
}

}  // namespace
}  // namespace ps
