// Tests for trainer/io/run_paths.h on a real directory tree: outputs that are inputs or each other
// through the same spelling, other spellings, hard links, symlinks (also dangling ones and
// symlinked directories) and not-yet-existing paths; what lies inside the checkpoint writer's
// entries; outputs that cannot be created.
#include "trainer/io/run_paths.h"

#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "base/testing/status_matchers.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace ps {
namespace {

namespace fs = std::filesystem;
using ::testing::AllOf;
using ::testing::HasSubstr;

class RunPathsTest : public ::testing::Test {
 protected:
  void SetUp() override {
    root_ = absl::StrCat(::testing::TempDir(), "/run_paths_test_", ::getpid());
    fs::remove_all(root_);
    fs::create_directories(root_ + "/data");
    fs::create_directories(root_ + "/out");
    std::ofstream(root_ + "/data/train.bin") << "tokens";
    std::ofstream(root_ + "/data/val.bin") << "tokens";
    std::ofstream(root_ + "/config.json") << "{}";
  }
  void TearDown() override { fs::remove_all(root_); }

  std::string P(const std::string& rel) const { return root_ + "/" + rel; }

  std::vector<RunInput> Inputs() const {
    return {{P("config.json"), "the config file (--config)"},
            {P("data/train.bin"), "data.train (--train_data)"},
            {P("data/val.bin"), "data.val (--val_data)"}};
  }
  absl::Status Check(std::vector<RunOutput> outputs) const {
    return CheckRunPaths(Inputs(), outputs);
  }

  std::string root_;
};

TEST_F(RunPathsTest, DistinctPathsPass) {
  EXPECT_OK(Check({{P("out/m.jsonl"), "profile.metrics (--metrics_out)"},
                   {P("out/t.json"), "profile.trace (--trace_out)"},
                   {P("out/w.safetensors"), "checkpoint.export"},
                   {P("ckpt"), "checkpoint.dir (--save_dir)", RunOutputKind::kCheckpointRoot},
                   {"", "profile.trace (--trace_out)"}}));
  // Two inputs may be the same file (validating on the training data).
  EXPECT_OK(
      CheckRunPaths({{P("data/train.bin"), "data.train"}, {P("data/train.bin"), "data.val"}}, {}));
}

TEST_F(RunPathsTest, AnOutputThatIsAnInputIsRefusedHoweverItIsSpelled) {
  const auto refused = [&](const std::string& path, const std::string& input_key) {
    SCOPED_TRACE(path);
    EXPECT_THAT(Check({{path, "profile.metrics (--metrics_out)"}}),
                StatusIs(absl::StatusCode::kInvalidArgument,
                         AllOf(HasSubstr("profile.metrics (--metrics_out) '" + path + "'"),
                               HasSubstr(input_key), HasSubstr("would destroy the input"))));
  };
  refused(P("data/train.bin"), "data.train (--train_data)");
  refused(P("out/../data/./train.bin"), "data.train (--train_data)");
  refused(P("config.json"), "the config file (--config)");
  // A hard link, a symlink, and a symlinked directory.
  fs::create_hard_link(P("data/val.bin"), P("out/hard.bin"));
  refused(P("out/hard.bin"), "data.val (--val_data)");
  fs::create_symlink(P("data/train.bin"), P("out/soft.bin"));
  refused(P("out/soft.bin"), "data.train (--train_data)");
  fs::create_directory_symlink(P("data"), P("linked"));
  refused(P("linked/train.bin"), "data.train (--train_data)");
  // A relative spelling.
  const fs::path cwd = fs::current_path();
  fs::current_path(P("out"));
  refused("../data/train.bin", "data.train (--train_data)");
  fs::current_path(cwd);
  // The same refusal for the export and the checkpoint directory.
  EXPECT_THAT(Check({{P("data/val.bin"), "checkpoint.export"}}),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("checkpoint.export")));
  EXPECT_THAT(Check({{P("data"), "checkpoint.dir (--save_dir)", RunOutputKind::kCheckpointRoot},
                     {P("data"), "checkpoint.export", RunOutputKind::kReplacedDirectory}}),
              StatusIs(absl::StatusCode::kInvalidArgument,
                       HasSubstr("two outputs would overwrite each other")));
}

TEST_F(RunPathsTest, OutputsThatDoNotExistYetCanStillCollide) {
  EXPECT_THAT(Check({{P("out/m.jsonl"), "profile.metrics (--metrics_out)"},
                     {P("out/sub/../m.jsonl"), "profile.trace (--trace_out)"}}),
              StatusIs(absl::StatusCode::kInvalidArgument,
                       AllOf(HasSubstr("profile.trace"), HasSubstr("profile.metrics"),
                             HasSubstr("two outputs would overwrite each other"))));
  // A dangling symlink: creating the output creates its target.
  fs::create_symlink(P("out/target.json"), P("out/dangling.json"));
  EXPECT_THAT(Check({{P("out/target.json"), "profile.metrics (--metrics_out)"},
                     {P("out/dangling.json"), "profile.trace (--trace_out)"}}),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("through a link")));
  // A dangling symlink to an input that does not exist yet is no conflict with the inputs
  // (the input will fail to open), but a chain of links is followed.
  fs::create_symlink(P("out/dangling.json"), P("out/chain.json"));
  EXPECT_THAT(Check({{P("out/target.json"), "profile.metrics"}, {P("out/chain.json"), "t"}}),
              StatusIs(absl::StatusCode::kInvalidArgument));
  // A loop of links.
  fs::create_symlink(P("out/loop_b"), P("out/loop_a"));
  fs::create_symlink(P("out/loop_a"), P("out/loop_b"));
  EXPECT_FALSE(Check({{P("out/loop_a"), "profile.trace (--trace_out)"}}).ok());
}

TEST_F(RunPathsTest, NothingMayLieInsideTheCheckpointWritersEntries) {
  const RunOutput ckpt{P("ckpt"), "checkpoint.dir (--save_dir)", RunOutputKind::kCheckpointRoot};
  fs::create_directories(P("ckpt/step-00000002"));
  fs::create_directories(P("ckpt/rank-1/step-00000002"));
  fs::create_directories(P("ckpt/notes"));
  std::ofstream(P("ckpt/step-00000002/train.bin")) << "x";
  std::ofstream(P("ckpt/rank-1/step-00000002/val.bin")) << "x";
  std::ofstream(P("ckpt/notes/val.bin")) << "x";
  std::ofstream(P("ckpt/direct.bin")) << "x";
  EXPECT_THAT(
      CheckRunPaths({{P("ckpt/step-00000002/train.bin"), "data.train (--train_data)"}}, {ckpt}),
      StatusIs(absl::StatusCode::kInvalidArgument,
               AllOf(HasSubstr("data.train (--train_data)"),
                     HasSubstr("inside 'step-00000002' of checkpoint.dir (--save_dir)"))));
  EXPECT_THAT(CheckRunPaths({{P("ckpt/rank-1/step-00000002/val.bin"), "data.val"}}, {ckpt}),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("inside 'rank-1'")));
  // Through a symlinked directory.
  fs::create_directory_symlink(P("ckpt/step-00000002"), P("data/link"));
  EXPECT_THAT(CheckRunPaths({{P("data/link/train.bin"), "data.train"}}, {ckpt}),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("'step-00000002'")));
  // Outputs too, even ones that do not exist yet.
  EXPECT_THAT(CheckRunPaths({}, {ckpt, {P("ckpt/step-00000002/m.jsonl"), "profile.metrics"}}),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("profile.metrics")));
  EXPECT_THAT(CheckRunPaths({}, {{P("new/.tmp-step-3-1-ab"), "profile.trace"},
                                 {P("new"), "checkpoint.dir", RunOutputKind::kCheckpointRoot}}),
              StatusIs(absl::StatusCode::kInvalidArgument));
  // Entries the writer never touches are fine: `--save_dir=.` with the data beside it.
  EXPECT_OK(
      CheckRunPaths({{P("ckpt/direct.bin"), "data.train"}, {P("ckpt/notes/val.bin"), "data.val"}},
                    {ckpt, {P("ckpt/metrics.jsonl"), "profile.metrics"}}));
}

TEST_F(RunPathsTest, ADirectoryReplacedAsAWholeMayHoldNothingElse) {
  fs::create_directories(P("model"));
  std::ofstream(P("model/config.json")) << "{}";
  EXPECT_THAT(
      CheckRunPaths({{P("model/config.json"), "checkpoint.init_from"}},
                    {{P("model"), "checkpoint.export", RunOutputKind::kReplacedDirectory}}),
      StatusIs(absl::StatusCode::kInvalidArgument,
               AllOf(HasSubstr("checkpoint.init_from"), HasSubstr("inside checkpoint.export"),
                     HasSubstr("replaced as a whole"))));
}

TEST_F(RunPathsTest, OutputsMustBeCreatable) {
  EXPECT_THAT(Check({{P("out"), "profile.metrics (--metrics_out)"}}),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("is a directory")));
  EXPECT_THAT(Check({{P("missing/dir/w.safetensors"), "checkpoint.export"}}),
              StatusIs(absl::StatusCode::kInvalidArgument,
                       AllOf(HasSubstr("checkpoint.export"), HasSubstr("does not exist"))));
  EXPECT_THAT(Check({{P("data/train.bin/x"), "profile.trace"}}),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("profile.trace")));
  EXPECT_THAT(Check({{P("config.json"), "checkpoint.dir", RunOutputKind::kCheckpointRoot}}),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("not a directory")));
  EXPECT_THAT(Check({{P("config.json/ck"), "checkpoint.dir", RunOutputKind::kCheckpointRoot}}),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("not a directory")));
  // A checkpoint root that does not exist yet, several levels deep, is created by the writer.
  EXPECT_OK(Check({{P("a/b/c"), "checkpoint.dir", RunOutputKind::kCheckpointRoot}}));
}

}  // namespace
}  // namespace ps
