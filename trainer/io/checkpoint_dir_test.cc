#include "trainer/io/checkpoint_dir.h"

#include <signal.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <filesystem>
#include <fstream>
#include <map>
#include <random>
#include <set>
#include <sstream>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "base/crc32c.h"
#include "base/testing/status_matchers.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace ps {
namespace {

namespace fs = std::filesystem;
using ::testing::AllOf;
using ::testing::ElementsAre;
using ::testing::HasSubstr;

// A fresh directory per test.
std::string FreshDir(absl::string_view name) {
  const std::string dir =
      absl::StrCat(::testing::TempDir(), "/checkpoint_dir_test_", name, "_", ::getpid());
  fs::remove_all(dir);
  return dir;
}

std::string ReadFile(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  std::stringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

void WriteRaw(const std::string& path, const std::string& bytes) {
  std::ofstream out(path, std::ios::binary | std::ios::trunc);
  out << bytes;
}

std::string RandomBytes(std::mt19937_64& rng, size_t n) {
  std::string s(n, '\0');
  for (char& c : s) c = static_cast<char>(rng());
  return s;
}

std::vector<int64_t> Steps(const std::string& root) {
  absl::StatusOr<std::vector<CheckpointRef>> all = ListCheckpoints(root);
  EXPECT_OK(all.status());
  std::vector<int64_t> steps;
  if (all.ok()) {
    for (const CheckpointRef& r : *all) steps.push_back(r.step);
  }
  return steps;
}

std::vector<std::string> Entries(const std::string& dir) {
  std::vector<std::string> names;
  for (const auto& e : fs::directory_iterator(dir)) names.push_back(e.path().filename());
  std::sort(names.begin(), names.end());
  return names;
}

// Commits step `step` holding one small file; returns the directory.
std::string CommitSimple(const std::string& root, int64_t step, int keep_last = 0) {
  CheckpointOptions options;
  options.keep_last = keep_last;
  absl::StatusOr<CheckpointWriter> w = CheckpointWriter::Begin(root, step, options);
  EXPECT_OK(w.status());
  if (!w.ok()) return "";
  EXPECT_OK(w->WriteFile("data.bin", absl::StrCat("step ", step)));
  absl::StatusOr<std::string> dir = w->Commit({{"step", step}});
  EXPECT_OK(dir.status());
  return dir.ok() ? *dir : "";
}

TEST(CheckpointDirTest, DirNames) {
  EXPECT_EQ(CheckpointDirName(0), "step-00000000");
  EXPECT_EQ(CheckpointDirName(42), "step-00000042");
  EXPECT_EQ(CheckpointDirName(123456789), "step-123456789");
}

TEST(CheckpointDirTest, CommitThenOpenRoundTripsFilesAndState) {
  const std::string root = FreshDir("roundtrip") + "/nested/root/";  // created by Begin
  std::mt19937_64 rng(1);
  const std::map<std::string, std::string> contents = {
      {"empty.bin", ""},
      {"one.bin", "x"},
      {"params.bin", RandomBytes(rng, (1 << 20) + 3)},  // crosses the 1 MiB read block
      {"rng-state_v2.txt", RandomBytes(rng, 4097)},
  };
  ASSERT_OK_AND_ASSIGN(CheckpointWriter w, CheckpointWriter::Begin(root, 7));
  EXPECT_EQ(w.step(), 7);
  EXPECT_THAT(w.path(), HasSubstr("/.tmp-step-7-"));
  EXPECT_TRUE(fs::is_directory(w.path()));
  for (const auto& [name, bytes] : contents) {
    if (name == "params.bin") {
      WriteRaw(w.FilePath(name), bytes);  // written by the caller, then added
      ASSERT_OK(w.AddFile(name));
    } else {
      ASSERT_OK(w.WriteFile(name, bytes));
    }
  }
  EXPECT_TRUE(Steps(root).empty());  // nothing visible before the commit
  const nlohmann::json state = {{"step", 7},
                                {"loss_scale", 65536.0},
                                {"lr", 0.00025},
                                {"tokens", int64_t{1} << 40},
                                {"name", "bad \xFF utf8"},
                                {"nested", {{"a", {1, 2, 3}}}}};
  ASSERT_OK_AND_ASSIGN(const std::string dir, w.Commit(state));
  EXPECT_EQ(dir, root + "step-00000007");  // root ends with a slash here
  EXPECT_FALSE(fs::exists(w.path()));
  EXPECT_THAT(Steps(root), ElementsAre(7));
  ASSERT_OK_AND_ASSIGN(const CheckpointRef latest, LatestCheckpoint(root));
  EXPECT_EQ(latest.step, 7);
  EXPECT_EQ(latest.path, dir);

  ASSERT_OK_AND_ASSIGN(const Checkpoint ckpt, OpenCheckpoint(dir));
  EXPECT_EQ(ckpt.step, 7);
  EXPECT_EQ(ckpt.path, dir);
  nlohmann::json want_state = state;
  want_state["name"] = "bad \xEF\xBF\xBD utf8";  // invalid UTF-8 replaced
  EXPECT_EQ(ckpt.state, want_state);
  ASSERT_EQ(ckpt.files.size(), contents.size());
  size_t i = 0;
  for (const auto& [name, bytes] : contents) {  // std::map: sorted like ckpt.files
    const CheckpointFileInfo& f = ckpt.files[i++];
    EXPECT_EQ(f.name, name);
    EXPECT_EQ(f.path, dir + "/" + name);
    EXPECT_EQ(f.size_bytes, static_cast<int64_t>(bytes.size()));
    EXPECT_EQ(f.crc32c, Crc32c(bytes));
    EXPECT_EQ(ReadFile(f.path), bytes);
  }
  EXPECT_THAT(ckpt.FilePath("params.bin"), IsOkAndHolds(dir + "/params.bin"));
  EXPECT_THAT(ckpt.FilePath("nope"), StatusIs(absl::StatusCode::kNotFound,
                                              AllOf(HasSubstr("nope"), HasSubstr("one.bin"))));
  // The manifest is readable by people and other tools.
  const nlohmann::json manifest = nlohmann::json::parse(ReadFile(dir + "/manifest.json"));
  EXPECT_EQ(manifest["format"], "patrickstar_cc checkpoint");
  EXPECT_EQ(manifest["version"], 1);
  EXPECT_EQ(manifest["files"][0]["name"], "empty.bin");
  EXPECT_EQ(manifest["files"][0]["crc32c"], "00000000");
  EXPECT_EQ(manifest["files"][1]["crc32c"], absl::StrFormat("%08x", Crc32c("x")));
}

TEST(CheckpointDirTest, BeginRejectsBadRootsStepsAndOptions) {
  const std::string dir = FreshDir("begin");
  fs::create_directories(dir);
  const std::string file = dir + "/a_file";
  WriteRaw(file, "not a directory");
  EXPECT_THAT(CheckpointWriter::Begin(file, 1),
              StatusIs(absl::StatusCode::kFailedPrecondition,
                       AllOf(HasSubstr(file), HasSubstr("not a directory"))));
  EXPECT_THAT(CheckpointWriter::Begin(file + "/sub", 1),
              StatusIs(absl::StatusCode::kFailedPrecondition, file));
  EXPECT_THAT(ListCheckpoints(file), StatusIs(absl::StatusCode::kFailedPrecondition, file));
  EXPECT_THAT(CheckpointWriter::Begin(dir, -1), StatusIs(absl::StatusCode::kInvalidArgument, "-1"));
  EXPECT_THAT(CheckpointWriter::Begin("", 1), StatusIs(absl::StatusCode::kInvalidArgument));
  CheckpointOptions bad;
  bad.keep_last = -2;
  EXPECT_THAT(CheckpointWriter::Begin(dir, 1, bad),
              StatusIs(absl::StatusCode::kInvalidArgument, "keep_last"));
  CommitSimple(dir, 3);
  EXPECT_THAT(CheckpointWriter::Begin(dir, 3),
              StatusIs(absl::StatusCode::kAlreadyExists, "step-00000003"));
  // Nothing was left behind by the failed calls.
  EXPECT_THAT(Entries(dir), ElementsAre("a_file", "step-00000003"));
}

TEST(CheckpointDirTest, AddFileValidatesNamesAndPresence) {
  const std::string root = FreshDir("addfile");
  ASSERT_OK_AND_ASSIGN(CheckpointWriter w, CheckpointWriter::Begin(root, 1));
  for (const std::string& bad :
       std::vector<std::string>{"", ".", "..", "a/b", "../x", "manifest.json", "sp ace", "\xC3\xA9",
                                std::string("nul\0", 4), std::string(256, 'a')}) {
    EXPECT_THAT(w.AddFile(bad), StatusIs(absl::StatusCode::kInvalidArgument)) << bad;
    EXPECT_THAT(w.WriteFile(bad, "x"), StatusIs(absl::StatusCode::kInvalidArgument)) << bad;
  }
  EXPECT_THAT(w.AddFile("missing.bin"), StatusIs(absl::StatusCode::kNotFound, "missing.bin"));
  fs::create_directory(w.FilePath("subdir"));
  EXPECT_THAT(w.AddFile("subdir"), StatusIs(absl::StatusCode::kInvalidArgument, "regular file"));
  ASSERT_OK(w.WriteFile("a.bin", "aaa"));
  EXPECT_THAT(w.AddFile("a.bin"), StatusIs(absl::StatusCode::kAlreadyExists, "a.bin"));
  EXPECT_THAT(w.WriteFile("a.bin", "again"), StatusIs(absl::StatusCode::kAlreadyExists, "a.bin"));
  // "subdir" was never added: Commit refuses, naming it; after removing it, Commit works.
  EXPECT_THAT(w.Commit({}), StatusIs(absl::StatusCode::kFailedPrecondition, "subdir"));
  fs::remove(w.FilePath("subdir"));
  WriteRaw(w.FilePath("manifest.json"), "{}");  // a caller may not write the manifest either
  EXPECT_THAT(w.Commit({}), StatusIs(absl::StatusCode::kFailedPrecondition, "manifest.json"));
  fs::remove(w.FilePath("manifest.json"));
  ASSERT_OK(w.Commit(nullptr));
  EXPECT_THAT(w.Commit({}), StatusIs(absl::StatusCode::kFailedPrecondition));
  EXPECT_THAT(w.AddFile("b.bin"), StatusIs(absl::StatusCode::kFailedPrecondition));
  EXPECT_THAT(w.WriteFile("b.bin", "b"), StatusIs(absl::StatusCode::kFailedPrecondition));
  EXPECT_OK(w.Abort());  // no-op after commit
  ASSERT_OK_AND_ASSIGN(const Checkpoint ckpt, OpenCheckpoint(root + "/step-00000001"));
  EXPECT_TRUE(ckpt.state.is_null());
  ASSERT_EQ(ckpt.files.size(), 1u);
}

TEST(CheckpointDirTest, AddedFileRemovedBeforeCommitIsNotFound) {
  const std::string root = FreshDir("removed");
  ASSERT_OK_AND_ASSIGN(CheckpointWriter w, CheckpointWriter::Begin(root, 1));
  ASSERT_OK(w.WriteFile("a.bin", "aaa"));
  fs::remove(w.FilePath("a.bin"));
  EXPECT_THAT(w.Commit({}), StatusIs(absl::StatusCode::kNotFound, "a.bin"));
  EXPECT_TRUE(Steps(root).empty());
}

TEST(CheckpointDirTest, UncommittedWritersLeaveNothing) {
  const std::string root = FreshDir("abort");
  std::string tmp;
  {
    ASSERT_OK_AND_ASSIGN(CheckpointWriter w, CheckpointWriter::Begin(root, 1));
    ASSERT_OK(w.WriteFile("a.bin", "aaa"));
    tmp = w.path();
    CheckpointWriter moved = std::move(w);  // ownership moves; the moved-from one does nothing
    EXPECT_TRUE(fs::exists(tmp));
  }
  EXPECT_FALSE(fs::exists(tmp));
  ASSERT_OK_AND_ASSIGN(CheckpointWriter w, CheckpointWriter::Begin(root, 2));
  tmp = w.path();
  ASSERT_OK(w.Abort());
  EXPECT_FALSE(fs::exists(tmp));
  EXPECT_OK(w.Abort());
  EXPECT_THAT(w.Commit({}), StatusIs(absl::StatusCode::kFailedPrecondition));
  {
    ASSERT_OK_AND_ASSIGN(CheckpointWriter a, CheckpointWriter::Begin(root, 3));
    ASSERT_OK_AND_ASSIGN(CheckpointWriter b, CheckpointWriter::Begin(root, 4));
    const std::string a_path = a.path();
    a = std::move(b);  // a's old directory is aborted
    EXPECT_FALSE(fs::exists(a_path));
  }
  EXPECT_TRUE(Entries(root).empty());
}

// Two writers of the same step: the second commit is AlreadyExists and leaves the first intact.
TEST(CheckpointDirTest, NeverOverwritesACommittedStep) {
  const std::string root = FreshDir("race");
  ASSERT_OK_AND_ASSIGN(CheckpointWriter first, CheckpointWriter::Begin(root, 5));
  ASSERT_OK_AND_ASSIGN(CheckpointWriter second, CheckpointWriter::Begin(root, 5));
  ASSERT_OK(first.WriteFile("x.bin", "first"));
  ASSERT_OK(second.WriteFile("x.bin", "second"));
  ASSERT_OK(first.Commit({{"who", "first"}}));
  EXPECT_THAT(second.Commit({{"who", "second"}}),
              StatusIs(absl::StatusCode::kAlreadyExists, "step-00000005"));
  ASSERT_OK_AND_ASSIGN(const Checkpoint ckpt, OpenCheckpoint(root + "/step-00000005"));
  EXPECT_EQ(ckpt.state["who"], "first");
  EXPECT_EQ(ReadFile(ckpt.files[0].path), "first");
  ASSERT_OK(second.Abort());
  EXPECT_THAT(Entries(root), ElementsAre("step-00000005"));
}

TEST(CheckpointDirTest, PrunesToTheLastKButNeverTheOneJustWritten) {
  for (int keep = 0; keep <= 3; ++keep) {
    SCOPED_TRACE(absl::StrCat("keep_last ", keep));
    const std::string root = FreshDir(absl::StrCat("prune", keep));
    std::vector<int64_t> want;
    for (int64_t step = 10; step <= 60; step += 10) {
      CommitSimple(root, step, keep);
      want.push_back(step);
      if (keep > 0 && static_cast<int>(want.size()) > keep) want.erase(want.begin());
      EXPECT_EQ(Steps(root), want);
    }
    // An older step committed after newer ones stays (it was just written) ...
    CommitSimple(root, 5, keep);
    want.insert(want.begin(), 5);
    EXPECT_EQ(Steps(root), want);
    // ... until the next commit prunes it.
    CommitSimple(root, 70, keep);
    want.push_back(70);
    if (keep > 0) want.assign(want.end() - keep, want.end());
    EXPECT_EQ(Steps(root), want);
    for (const std::string& name : Entries(root)) {
      EXPECT_EQ(name.rfind(".tmp-", 0), std::string::npos) << name;  // no deletion debris
    }
    ASSERT_OK_AND_ASSIGN(const std::vector<CheckpointRef> refs, ListCheckpoints(root));
    for (const CheckpointRef& ref : refs) EXPECT_OK(OpenCheckpoint(ref.path));
  }
}

class CorruptionTest : public ::testing::Test {
 protected:
  void SetUp() override {
    root_ = FreshDir(::testing::UnitTest::GetInstance()->current_test_info()->name());
    std::mt19937_64 rng(77);
    payload_ = RandomBytes(rng, 100000);
    ASSERT_OK_AND_ASSIGN(CheckpointWriter w, CheckpointWriter::Begin(root_, 3));
    ASSERT_OK(w.WriteFile("params.bin", payload_));
    ASSERT_OK(w.WriteFile("small.bin", "abc"));
    ASSERT_OK_AND_ASSIGN(dir_, w.Commit({{"k", 1}}));
    ASSERT_OK(OpenCheckpoint(dir_));
  }
  nlohmann::json Manifest() { return nlohmann::json::parse(ReadFile(dir_ + "/manifest.json")); }
  void SetManifest(const nlohmann::json& m) { WriteRaw(dir_ + "/manifest.json", m.dump()); }

  std::string root_, dir_, payload_;
};

TEST_F(CorruptionTest, EveryFlippedByteIsDataLossNamingFileAndChecksums) {
  std::mt19937_64 rng(5);
  const std::string path = dir_ + "/params.bin";
  for (int trial = 0; trial < 20; ++trial) {
    std::string bad = payload_;
    const size_t at = rng() % bad.size();
    bad[at] = static_cast<char>(bad[at] ^ (1 + rng() % 255));
    WriteRaw(path, bad);
    EXPECT_THAT(OpenCheckpoint(dir_),
                StatusIs(absl::StatusCode::kDataLoss,
                         AllOf(HasSubstr(path), HasSubstr(absl::StrFormat("%08x", Crc32c(bad))),
                               HasSubstr(absl::StrFormat("%08x", Crc32c(payload_))))));
    OpenCheckpointOptions fast;
    fast.verify_checksums = false;  // sizes only: a flipped byte goes unnoticed
    EXPECT_OK(OpenCheckpoint(dir_, fast));
  }
  WriteRaw(path, payload_);
  EXPECT_OK(OpenCheckpoint(dir_));
}

TEST_F(CorruptionTest, TruncatedOrExtendedFileIsDataLoss) {
  const std::string path = dir_ + "/params.bin";
  OpenCheckpointOptions fast;
  fast.verify_checksums = false;
  WriteRaw(path, payload_.substr(0, 4096));
  EXPECT_THAT(
      OpenCheckpoint(dir_, fast),
      StatusIs(absl::StatusCode::kDataLoss, AllOf(HasSubstr(path), HasSubstr("4096"),
                                                  HasSubstr("100000"), HasSubstr("truncated"))));
  WriteRaw(path, payload_ + "x");
  EXPECT_THAT(OpenCheckpoint(dir_), StatusIs(absl::StatusCode::kDataLoss, "100001"));
  WriteRaw(path, "");
  EXPECT_THAT(OpenCheckpoint(dir_), StatusIs(absl::StatusCode::kDataLoss, "truncated"));
}

TEST_F(CorruptionTest, MissingFileIsNotFound) {
  fs::remove(dir_ + "/small.bin");
  EXPECT_THAT(OpenCheckpoint(dir_), StatusIs(absl::StatusCode::kNotFound, "small.bin"));
  // A manifest listing a file that was never there.
  CommitSimple(root_, 4);
  nlohmann::json m = nlohmann::json::parse(ReadFile(root_ + "/step-00000004/manifest.json"));
  m["files"].push_back({{"name", "ghost.bin"}, {"size_bytes", 1}, {"crc32c", "00000000"}});
  WriteRaw(root_ + "/step-00000004/manifest.json", m.dump());
  EXPECT_THAT(OpenCheckpoint(root_ + "/step-00000004"),
              StatusIs(absl::StatusCode::kNotFound, "ghost.bin"));
}

TEST_F(CorruptionTest, MissingManifestIsAForeignDirectory) {
  fs::remove(dir_ + "/manifest.json");
  EXPECT_THAT(OpenCheckpoint(dir_), StatusIs(absl::StatusCode::kInvalidArgument,
                                             AllOf(HasSubstr(dir_), HasSubstr("manifest.json"))));
  EXPECT_TRUE(Steps(root_).empty());  // not listed as committed either
  EXPECT_THAT(OpenCheckpoint(root_ + "/no-such-dir"), StatusIs(absl::StatusCode::kNotFound));
  EXPECT_THAT(OpenCheckpoint(dir_ + "/params.bin"),
              StatusIs(absl::StatusCode::kInvalidArgument, "not a directory"));
  fs::create_directories(root_ + "/other");
  WriteRaw(root_ + "/other/manifest.json", R"({"hello": "world"})");
  EXPECT_THAT(OpenCheckpoint(root_ + "/other"),
              StatusIs(absl::StatusCode::kInvalidArgument, "not a checkpoint directory"));
}

TEST_F(CorruptionTest, GarbageManifestIsDataLoss) {
  std::mt19937_64 rng(9);
  const std::string good = ReadFile(dir_ + "/manifest.json");
  for (int trial = 0; trial < 30; ++trial) {
    // Random bytes, or the real manifest cut short.
    const std::string garbage =
        trial % 2 == 0 ? RandomBytes(rng, 1 + rng() % 300) : good.substr(0, rng() % good.size());
    WriteRaw(dir_ + "/manifest.json", garbage);
    const absl::StatusOr<Checkpoint> opened = OpenCheckpoint(dir_);
    ASSERT_FALSE(opened.ok());
    // A cut that ends inside the "format" value can still parse as a foreign object: then it is
    // InvalidArgument; every other case is DataLoss.
    EXPECT_THAT(opened.status().code(),
                ::testing::AnyOf(absl::StatusCode::kDataLoss, absl::StatusCode::kInvalidArgument))
        << opened.status();
    EXPECT_THAT(opened.status().message(), HasSubstr(dir_));
  }
  WriteRaw(dir_ + "/manifest.json", "");
  EXPECT_THAT(OpenCheckpoint(dir_), StatusIs(absl::StatusCode::kDataLoss, "not valid JSON"));
  WriteRaw(dir_ + "/manifest.json", "{\"format\": \"patrickstar_cc checkpoint\", \"version\": 1,");
  EXPECT_THAT(OpenCheckpoint(dir_), StatusIs(absl::StatusCode::kDataLoss, "not valid JSON"));
  WriteRaw(dir_ + "/manifest.json", good);
  EXPECT_OK(OpenCheckpoint(dir_));
}

TEST_F(CorruptionTest, MalformedManifestFieldsAreDataLoss) {
  const nlohmann::json good = Manifest();
  const auto expect = [&](const nlohmann::json& m, absl::StatusCode code, absl::string_view what) {
    SetManifest(m);
    EXPECT_THAT(OpenCheckpoint(dir_), StatusIs(code, HasSubstr(std::string(what)))) << m.dump();
  };
  nlohmann::json m = good;
  m["version"] = 2;
  expect(m, absl::StatusCode::kUnimplemented, "version 2");
  m = good;
  m["version"] = "1";
  expect(m, absl::StatusCode::kDataLoss, "version");
  m = good;
  m["step"] = -3;
  expect(m, absl::StatusCode::kDataLoss, "step");
  m = good;
  m["step"] = 4;
  expect(m, absl::StatusCode::kDataLoss, "records step 4 but the directory is step 3");
  m = good;
  m.erase("state");
  expect(m, absl::StatusCode::kDataLoss, "state");
  m = good;
  m["files"] = "params.bin";
  expect(m, absl::StatusCode::kDataLoss, "files");
  m = good;
  m["files"][0]["name"] = "../../etc/passwd";
  expect(m, absl::StatusCode::kDataLoss, "files[0]");
  m = good;
  m["files"][0]["name"] = "manifest.json";
  expect(m, absl::StatusCode::kDataLoss, "files[0]");
  m = good;
  m["files"][1]["size_bytes"] = -1;
  expect(m, absl::StatusCode::kDataLoss, "files[1]");
  m = good;
  m["files"][1]["size_bytes"] = 3.5;
  expect(m, absl::StatusCode::kDataLoss, "size_bytes");
  m = good;
  m["files"][1]["crc32c"] = "E3069283";  // uppercase is not what the writer writes
  expect(m, absl::StatusCode::kDataLoss, "crc32c");
  m = good;
  m["files"][1]["crc32c"] = 12345;
  expect(m, absl::StatusCode::kDataLoss, "crc32c");
  m = good;
  m["files"].push_back(good["files"][0]);
  expect(m, absl::StatusCode::kDataLoss, "listed twice");
  m = good;
  m["files"][0] = 7;
  expect(m, absl::StatusCode::kDataLoss, "files[0]");
  SetManifest(good);
  EXPECT_OK(OpenCheckpoint(dir_));
}

TEST(CheckpointDirTest, ListingSkipsEverythingButCommittedCheckpoints) {
  const std::string root = FreshDir("listing");
  EXPECT_THAT(ListCheckpoints(root), IsOkAndHolds(::testing::IsEmpty()));  // absent root
  EXPECT_THAT(LatestCheckpoint(root), StatusIs(absl::StatusCode::kNotFound, root));
  CommitSimple(root, 2);
  CommitSimple(root, 11);
  CommitSimple(root, 100000000);                    // nine digits
  fs::create_directories(root + "/step-00000050");  // no manifest: a half-made foreign directory
  fs::create_directories(root + "/step-5");         // not the canonical spelling
  fs::create_directories(root + "/.tmp-step-60-1-abcdef");
  WriteRaw(root + "/step-00000070", "a file");
  fs::create_directories(root + "/notes");
  EXPECT_EQ(Steps(root), (std::vector<int64_t>{2, 11, 100000000}));
  ASSERT_OK_AND_ASSIGN(const CheckpointRef latest, LatestCheckpoint(root));
  EXPECT_EQ(latest.step, 100000000);
  EXPECT_OK(OpenCheckpoint(latest.path));
}

pid_t DeadPid() {
  const pid_t pid = ::fork();
  if (pid == 0) ::_exit(0);
  int status;
  ::waitpid(pid, &status, 0);
  return pid;
}

// Debris of dead writers goes; live writers' directories and foreign entries stay.
TEST(CheckpointDirTest, CleansDebrisOfDeadWritersOnly) {
  const std::string root = FreshDir("debris");
  fs::create_directories(root);
  const pid_t dead = DeadPid();
  const pid_t live = ::fork();
  ASSERT_GE(live, 0);
  if (live == 0) {
    ::pause();
    ::_exit(0);
  }
  const std::string dead_tmp = absl::StrCat(".tmp-step-9-", dead, "-AbC123");
  const std::string dead_delete = absl::StrCat(".tmp-delete-step-00000004-", dead, "-ff00");
  const std::string live_tmp = absl::StrCat(".tmp-step-9-", live, "-AbC123");
  const std::string self_stale = absl::StrCat(".tmp-step-9-", ::getpid(), "-Zz9");  // a past run
  for (const std::string& d : {dead_tmp, dead_delete, live_tmp, self_stale}) {
    fs::create_directories(root + "/" + d + "/sub");
    WriteRaw(root + "/" + d + "/sub/file", "x");
  }
  const std::vector<std::string> foreign = {
      ".tmp-mine", ".tmp-step-x-1-abc", absl::StrCat(".tmp-step-9-", dead, "-a-b"), "notes.txt"};
  for (const std::string& f : foreign) WriteRaw(root + "/" + f, "keep me");
  fs::create_directories(root + "/" + absl::StrCat(".tmp-step-9-", dead, "-"));  // no random part
  WriteRaw(root + "/" + absl::StrCat(".tmp-step-8-", dead, "-File1"), "a file, not a directory");

  ASSERT_OK_AND_ASSIGN(CheckpointWriter active, CheckpointWriter::Begin(root, 20));
  const std::string active_name = fs::path(active.path()).filename();
  std::set<std::string> names;
  for (const std::string& n : Entries(root)) names.insert(n);
  EXPECT_FALSE(names.contains(dead_tmp));
  EXPECT_FALSE(names.contains(dead_delete));
  EXPECT_FALSE(names.contains(self_stale));
  EXPECT_TRUE(names.contains(live_tmp));
  EXPECT_TRUE(names.contains(active_name));
  for (const std::string& f : foreign) EXPECT_TRUE(names.contains(f)) << f;
  EXPECT_TRUE(names.contains(absl::StrCat(".tmp-step-9-", dead, "-")));
  EXPECT_TRUE(names.contains(absl::StrCat(".tmp-step-8-", dead, "-File1")));

  // A second writer of this process does not take the first one's directory for debris.
  ASSERT_OK_AND_ASSIGN(CheckpointWriter second, CheckpointWriter::Begin(root, 21));
  EXPECT_TRUE(fs::exists(active.path()));
  ASSERT_OK(second.Commit({}));
  EXPECT_TRUE(fs::exists(active.path()));
  EXPECT_TRUE(fs::exists(root + "/" + live_tmp));

  // Once the live writer dies (and is reaped), the next writer removes its directory.
  ::kill(live, SIGKILL);
  int status;
  ASSERT_EQ(::waitpid(live, &status, 0), live);
  ASSERT_OK(active.Commit({}));
  EXPECT_FALSE(fs::exists(root + "/" + live_tmp));
  EXPECT_THAT(Steps(root), ElementsAre(20, 21));
}

// Random sequences of begin/commit/abort with random steps and keep_last, against a model of the
// committed set: after every operation the listing equals the model and every listed checkpoint
// opens and verifies.
TEST(CheckpointDirTest, RandomOperationSequencesMatchAModel) {
  std::mt19937_64 rng(2024);
  for (int sequence = 0; sequence < 8; ++sequence) {
    const std::string root = FreshDir(absl::StrCat("model", sequence));
    std::set<int64_t> model;
    for (int op = 0; op < 30; ++op) {
      const int64_t step = static_cast<int64_t>(rng() % 40);
      CheckpointOptions options;
      options.keep_last = static_cast<int>(rng() % 4);
      const int kind = static_cast<int>(rng() % 4);
      absl::StatusOr<CheckpointWriter> w = CheckpointWriter::Begin(root, step, options);
      if (model.contains(step)) {
        ASSERT_THAT(w, StatusIs(absl::StatusCode::kAlreadyExists));
        continue;
      }
      ASSERT_OK(w.status());
      const int files = static_cast<int>(rng() % 4);
      for (int f = 0; f < files; ++f) {
        ASSERT_OK(w->WriteFile(absl::StrCat("f", f), RandomBytes(rng, rng() % 5000)));
      }
      if (kind == 0) {
        ASSERT_OK(w->Abort());
      } else {
        ASSERT_OK(w->Commit({{"step", step}, {"files", files}}));
        model.insert(step);
        if (options.keep_last > 0) {
          // Keep the highest keep_last steps plus the one just written.
          std::vector<int64_t> sorted(model.begin(), model.end());
          std::set<int64_t> keep(sorted.end() - std::min<size_t>(sorted.size(), options.keep_last),
                                 sorted.end());
          keep.insert(step);
          model = keep;
        }
      }
      ASSERT_EQ(Steps(root), std::vector<int64_t>(model.begin(), model.end())) << "op " << op;
      ASSERT_OK_AND_ASSIGN(const std::vector<CheckpointRef> refs, ListCheckpoints(root));
      for (const CheckpointRef& ref : refs) {
        ASSERT_OK_AND_ASSIGN(const Checkpoint c, OpenCheckpoint(ref.path));
        ASSERT_EQ(c.state["step"], ref.step);
        ASSERT_EQ(c.files.size(), c.state["files"].get<size_t>());
      }
      for (const std::string& name : Entries(root)) {
        ASSERT_EQ(name.rfind(".tmp-", 0), std::string::npos) << name;
      }
    }
  }
}

}  // namespace
}  // namespace ps
