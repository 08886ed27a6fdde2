// File helpers shared by the trainer's end-to-end tests. Test-only.
#ifndef PATRICKSTAR_TRAINER_TESTING_TEST_FILES_H_
#define PATRICKSTAR_TRAINER_TESTING_TEST_FILES_H_

#include <unistd.h>

#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <string>

#include "absl/strings/str_cat.h"
#include "absl/strings/string_view.h"
#include "gtest/gtest.h"

namespace ps::trainer_testing {

// The path of `path` (relative to the workspace root, e.g. "trainer/train") in the test's
// runfiles.
inline std::string Runfile(absl::string_view path) {
  const char* srcdir = std::getenv("TEST_SRCDIR");
  const char* workspace = std::getenv("TEST_WORKSPACE");
  return absl::StrCat(srcdir != nullptr ? srcdir : ".", "/",
                      workspace != nullptr ? workspace : "patrickstar_cc", "/", path);
}

// A new, empty directory <test tmpdir>/<prefix>_<name>_<pid> (removed first if it exists).
inline std::string FreshTempDir(absl::string_view prefix, absl::string_view name) {
  const std::string dir =
      absl::StrCat(::testing::TempDir(), "/", prefix, "_", name, "_", ::getpid());
  std::filesystem::remove_all(dir);
  std::filesystem::create_directories(dir);
  return dir;
}

// The whole file as bytes; empty if it cannot be read. One bulk read (an istreambuf_iterator
// copies a byte at a time, ~100 ms per MB unoptimized, which dominated tests that compare
// checkpoint directories).
inline std::string ReadFile(const std::string& path) {
  std::ifstream in(path, std::ios::binary | std::ios::ate);
  if (!in) return {};
  const std::streamoff size = in.tellg();
  if (size <= 0) return std::string(std::istreambuf_iterator<char>(in.seekg(0)), {});
  std::string bytes(static_cast<size_t>(size), '\0');
  in.seekg(0);
  in.read(bytes.data(), size);
  bytes.resize(static_cast<size_t>(in.gcount()));
  return bytes;
}

}  // namespace ps::trainer_testing

#endif  // PATRICKSTAR_TRAINER_TESTING_TEST_FILES_H_
