#include "comm/testing/subprocess.h"

#include <fcntl.h>
#include <limits.h>
#include <poll.h>
#include <signal.h>
#include <sys/types.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cerrno>
#include <cstdlib>
#include <cstring>
#include <string>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "absl/strings/string_view.h"
#include "absl/time/clock.h"

extern char** environ;

namespace ps {
namespace {

bool Unset(const std::string& entry, const std::vector<std::string>& patterns) {
  const std::string name = entry.substr(0, entry.find('='));
  for (const std::string& p : patterns) {
    if (!p.empty() && p.back() == '*') {
      if (absl::StartsWith(name, p.substr(0, p.size() - 1))) return true;
    } else if (name == p) {
      return true;
    }
  }
  return false;
}

}  // namespace

absl::StatusOr<SubprocessResult> RunSubprocess(const SubprocessOptions& options) {
  if (options.argv.empty()) return absl::InvalidArgumentError("RunSubprocess: empty argv");
  std::vector<std::string> env;
  for (char** e = environ; *e != nullptr; ++e) {
    if (!Unset(*e, options.unset_env)) env.emplace_back(*e);
  }
  for (const std::string& s : options.set_env) env.push_back(s);
  std::vector<char*> argv_c, env_c;
  for (const std::string& s : options.argv) argv_c.push_back(const_cast<char*>(s.c_str()));
  argv_c.push_back(nullptr);
  for (const std::string& s : env) env_c.push_back(const_cast<char*>(s.c_str()));
  env_c.push_back(nullptr);

  int fds[2];
  if (pipe2(fds, O_CLOEXEC) != 0) {
    return absl::InternalError(absl::StrCat("pipe2: ", std::strerror(errno)));
  }
  const absl::Time start = absl::Now();
  const pid_t pid = fork();
  if (pid < 0) {
    close(fds[0]);
    close(fds[1]);
    return absl::InternalError(absl::StrCat("fork: ", std::strerror(errno)));
  }
  if (pid == 0) {  // child: only async-signal-safe calls until exec
    setpgid(0, 0);
    dup2(fds[1], STDOUT_FILENO);
    dup2(fds[1], STDERR_FILENO);
    execve(argv_c[0], argv_c.data(), env_c.data());
    _exit(127);
  }
  setpgid(pid, pid);  // also here, so that the group exists before any kill below
  close(fds[1]);

  SubprocessResult result;
  const absl::Time deadline = start + options.timeout;
  char buf[4096];
  bool open = true;
  while (open) {
    const absl::Duration left = deadline - absl::Now();
    if (left <= absl::ZeroDuration()) {
      result.timed_out = true;
      break;
    }
    pollfd p = {fds[0], POLLIN, 0};
    const int ready = poll(&p, 1, static_cast<int>(absl::ToInt64Milliseconds(left)) + 1);
    if (ready < 0 && errno == EINTR) continue;
    if (ready <= 0) continue;
    const ssize_t n = read(fds[0], buf, sizeof(buf));
    if (n > 0) {
      result.output.append(buf, n);
    } else if (n == 0 || errno != EINTR) {
      open = false;  // every writer closed: the group is (almost) done
    }
  }
  if (result.timed_out) kill(-pid, SIGKILL);
  int status = 0;
  // The leader may outlive its output pipe briefly; after the deadline, kill and reap.
  while (true) {
    const pid_t r = waitpid(pid, &status, result.timed_out ? 0 : WNOHANG);
    if (r == pid) break;
    if (r < 0 && errno != EINTR) break;
    if (absl::Now() > deadline) {
      result.timed_out = true;
      kill(-pid, SIGKILL);
    } else {
      absl::SleepFor(absl::Milliseconds(10));
    }
  }
  // Children that outlived the leader (they should not) go too.
  kill(-pid, SIGKILL);
  close(fds[0]);
  result.elapsed = absl::Now() - start;
  if (WIFEXITED(status)) result.exit_code = WEXITSTATUS(status);
  if (WIFSIGNALED(status)) result.term_signal = WTERMSIG(status);
  return result;
}

std::string DescribeExit(const SubprocessResult& result) {
  if (result.timed_out) {
    return absl::StrCat("killed by the watchdog after ", absl::FormatDuration(result.elapsed));
  }
  if (result.term_signal != 0) {
    return absl::StrCat("signal ", result.term_signal, " (", strsignal(result.term_signal), ")");
  }
  return absl::StrCat("exit code ", result.exit_code, " after ",
                      absl::FormatDuration(result.elapsed));
}

std::string FindMpirun() {
  if (const char* env = std::getenv("PS_MPIRUN"); env != nullptr && *env != '\0') return env;
  const char* path = std::getenv("PATH");
  for (absl::string_view dir : absl::StrSplit(path != nullptr ? path : "", ':')) {
    if (dir.empty()) continue;
    char resolved[PATH_MAX];
    if (realpath(std::string(dir).c_str(), resolved) == nullptr) continue;
    const std::string candidate = absl::StrCat(resolved, "/mpirun");
    if (access(candidate.c_str(), X_OK) == 0) return candidate;
  }
  return "/usr/bin/mpirun";
}

}  // namespace ps
