// ScopedTestDir: a fresh directory for one test (under TEST_TMPDIR, or under a given parent such
// as /dev/shm), removed with its contents when the object goes away.
#ifndef PATRICKSTAR_DISK_TESTING_SCOPED_TEST_DIR_H_
#define PATRICKSTAR_DISK_TESTING_SCOPED_TEST_DIR_H_

#include <stdlib.h>

#include <cstdlib>
#include <filesystem>
#include <string>
#include <system_error>

#include "glog/logging.h"

namespace ps {

class ScopedTestDir {
 public:
  // Under `parent`, or TEST_TMPDIR (else /tmp) when empty.
  explicit ScopedTestDir(std::string parent = "") {
    if (parent.empty()) {
      const char* tmp = std::getenv("TEST_TMPDIR");
      parent = tmp != nullptr ? tmp : "/tmp";
    }
    std::string pattern = parent + "/ps-disk-test-XXXXXX";
    CHECK(::mkdtemp(pattern.data()) != nullptr) << "mkdtemp " << pattern;
    path_ = pattern;
  }
  ~ScopedTestDir() {
    std::error_code ignored;
    std::filesystem::remove_all(path_, ignored);
  }
  ScopedTestDir(const ScopedTestDir&) = delete;
  ScopedTestDir& operator=(const ScopedTestDir&) = delete;

  const std::string& path() const { return path_; }

 private:
  std::string path_;
};

}  // namespace ps

#endif  // PATRICKSTAR_DISK_TESTING_SCOPED_TEST_DIR_H_
