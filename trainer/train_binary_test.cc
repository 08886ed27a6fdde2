// Runs the real training program (//trainer:train) as a user would: exit codes, error messages,
// signals, and kill -9 in the middle of checkpoint writes.
#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <map>
#include <random>
#include <regex>
#include <set>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "absl/strings/ascii.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_split.h"
#include "base/testing/status_matchers.h"
#include "base/units.h"
#include "comm/communicator_factory.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "memory/backend_factory.h"
#include "nlohmann/json.hpp"
#include "trainer/config.h"
#include "trainer/config_json.h"
#include "trainer/data/token_file.h"
#include "trainer/io/checkpoint_dir.h"
#include "trainer/testing/test_files.h"

namespace ps {
namespace {

using ::ps::trainer_testing::ReadFile;
using ::testing::HasSubstr;

std::string TrainBinary() { return trainer_testing::Runfile("trainer/train"); }

// Starts the binary with `args`, stdout and stderr to files in `dir`; stdin from `stdin_fd` when
// it is >= 0 (the child inherits every descriptor not marked close-on-exec, as a shell's process
// substitution passes /dev/fd/N).
pid_t Start(const std::vector<std::string>& args, const std::string& dir, int stdin_fd = -1) {
  const std::string out = dir + "/stdout.txt";
  const std::string err = dir + "/stderr.txt";
  const pid_t pid = ::fork();
  if (pid == 0) {
    std::FILE* o = std::freopen(out.c_str(), "w", stdout);
    std::FILE* e = std::freopen(err.c_str(), "w", stderr);
    if (o == nullptr || e == nullptr) ::_exit(120);
    if (stdin_fd >= 0 && ::dup2(stdin_fd, 0) < 0) ::_exit(122);
    std::vector<char*> argv;
    const std::string binary = TrainBinary();
    argv.push_back(const_cast<char*>(binary.c_str()));
    for (const std::string& a : args) argv.push_back(const_cast<char*>(a.c_str()));
    argv.push_back(nullptr);
    ::execv(binary.c_str(), argv.data());
    ::_exit(121);
  }
  return pid;
}

// Waits up to `timeout` for `pid`; returns its wait status, or kills it and fails.
int Wait(pid_t pid, std::chrono::seconds timeout = std::chrono::seconds(240)) {
  const auto deadline = std::chrono::steady_clock::now() + timeout;
  int status = 0;
  while (true) {
    const pid_t r = ::waitpid(pid, &status, WNOHANG);
    if (r == pid) return status;
    if (std::chrono::steady_clock::now() > deadline) {
      ::kill(pid, SIGKILL);
      ::waitpid(pid, &status, 0);
      ADD_FAILURE() << "the trainer did not finish in time";
      return -1;
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  }
}

struct Result {
  int exit_code = -1;
  std::string out, err;
};

Result RunToEnd(const std::vector<std::string>& args, const std::string& dir, int stdin_fd = -1) {
  const int status = Wait(Start(args, dir, stdin_fd));
  Result r;
  r.exit_code = WIFEXITED(status) ? WEXITSTATUS(status) : -1;
  r.out = ReadFile(dir + "/stdout.txt");
  r.err = ReadFile(dir + "/stderr.txt");
  return r;
}

// The tiny model of trainer_test.cc, as a config file.
std::string WriteTinyConfig(const std::string& dir, int64_t steps, int64_t checkpoint_every = 0) {
  TrainConfig c = DefaultTrainConfig();
  c.model = TrainModelConfig{};
  c.model.vocab_size = 256;
  c.model.max_seq_len = 32;
  c.model.hidden = 64;
  c.model.num_layers = 2;
  c.model.num_heads = 2;
  c.data.seq_len = 32;
  c.train_micro_batch_size_per_gpu = 2;
  c.train_batch_size = 0;
  c.steps = steps;
  c.chunk.size_elems = 24 * 1024;
  c.accelerator.memory_bytes = 1536 * kKiB;
  c.threads = 1;
  c.data.eval_every = 0;
  c.data.eval_batches = 1;
  c.scheduler.warmup_num_steps = 2;
  c.checkpoint = CheckpointConfig{};
  c.checkpoint.every = checkpoint_every;
  c.checkpoint.keep_last = 2;
  c.profile = ProfileConfig{};
  const std::string path = dir + "/config.json";
  std::ofstream(path) << TrainConfigToJson(c);
  return path;
}

TEST(TrainBinary, RunsAConfigFileAndWritesMetrics) {
  const std::string dir = trainer_testing::FreshTempDir("train_binary_test", "run");
  const std::string config = WriteTinyConfig(dir, 3);
  const Result r = RunToEnd({"--config=" + config, "--metrics_out=" + dir + "/m.jsonl"}, dir);
  ASSERT_EQ(r.exit_code, 0) << r.err;
  EXPECT_THAT(r.out, HasSubstr("step     3/3 | loss"));
  EXPECT_THAT(r.out, HasSubstr("== summary =="));
  const std::string metrics = ReadFile(dir + "/m.jsonl");
  int lines = 0;
  for (absl::string_view line : absl::StrSplit(metrics, '\n', absl::SkipEmpty())) {
    EXPECT_TRUE(nlohmann::json::accept(line)) << line;
    ++lines;
  }
  EXPECT_EQ(lines, 3);
}

TEST(TrainBinary, BadFlagsAndConfigsExitTwoWithTheKeyNamed) {
  const std::string dir = trainer_testing::FreshTempDir("train_binary_test", "bad");
  Result r = RunToEnd({"--accelerator_memory=12XB"}, dir);
  EXPECT_EQ(r.exit_code, 2);
  EXPECT_THAT(r.err, HasSubstr("accelerator_memory"));

  r = RunToEnd({"--steps=0"}, dir);
  EXPECT_EQ(r.exit_code, 2);
  EXPECT_THAT(r.err, HasSubstr("steps"));

  r = RunToEnd({"--model=gpt7"}, dir);
  EXPECT_EQ(r.exit_code, 2);
  EXPECT_THAT(r.err, HasSubstr("gpt2"));

  std::ofstream(dir + "/typo.json")
      << R"({"train_steps": 3, "optimizer": {"type": "AdamW", "params": {"lr": 0.001, "betaz": [0.9, 0.99]}}})";
  r = RunToEnd({"--config=" + dir + "/typo.json"}, dir);
  EXPECT_EQ(r.exit_code, 2);
  EXPECT_THAT(r.err, HasSubstr("optimizer.params.betaz"));
  EXPECT_THAT(r.err, HasSubstr("betas"));

  std::ofstream(dir + "/syntax.json") << "{\"train_steps\": 3,\n \"seed\": }";
  r = RunToEnd({"--config=" + dir + "/syntax.json"}, dir);
  EXPECT_EQ(r.exit_code, 2);
  EXPECT_THAT(r.err, HasSubstr("syntax.json"));

  r = RunToEnd({"--config=" + dir + "/absent.json"}, dir);
  EXPECT_NE(r.exit_code, 0);
  EXPECT_THAT(r.err, HasSubstr("absent.json"));

  const std::string config = WriteTinyConfig(dir, 3);
  r = RunToEnd({"--config=" + config, "--train_data=" + dir + "/none.bin"}, dir);
  EXPECT_EQ(r.exit_code, 1);
  EXPECT_THAT(r.err, HasSubstr("none.bin"));

  r = RunToEnd({"--config=" + config, "--resume", "--save_dir=" + dir + "/empty"}, dir);
  EXPECT_EQ(r.exit_code, 1);
  EXPECT_THAT(r.err, HasSubstr("no checkpoint"));
  EXPECT_THAT(r.err, ::testing::Not(HasSubstr("Check failed")));
}

TEST(TrainBinary, SigtermFinishesTheStepWritesACheckpointAndExitsZero) {
  const std::string dir = trainer_testing::FreshTempDir("train_binary_test", "sigterm");
  const std::string config = WriteTinyConfig(dir, 100000);
  const pid_t pid = Start({"--config=" + config, "--save_dir=" + dir + "/ckpt"}, dir);
  // Wait for training to be under way.
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(120);
  while (!absl::StrContains(ReadFile(dir + "/stdout.txt"), "step     1/") &&
         std::chrono::steady_clock::now() < deadline) {
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  }
  ASSERT_EQ(::kill(pid, SIGTERM), 0);
  const int status = Wait(pid);
  ASSERT_TRUE(WIFEXITED(status)) << "killed by signal " << WTERMSIG(status);
  EXPECT_EQ(WEXITSTATUS(status), 0) << ReadFile(dir + "/stderr.txt");
  EXPECT_THAT(ReadFile(dir + "/stdout.txt"), HasSubstr("stop requested"));
  ASSERT_OK_AND_ASSIGN(CheckpointRef latest, LatestCheckpoint(dir + "/ckpt"));
  EXPECT_GE(latest.step, 1);
  EXPECT_OK(OpenCheckpoint(latest.path).status());
}

// kill -9 at random moments of a run that checkpoints every step: whatever is listed as a
// checkpoint verifies, and the run resumes from it.
TEST(TrainBinary, KillNineNeverLeavesABrokenCheckpoint) {
  const std::string dir = trainer_testing::FreshTempDir("train_binary_test", "kill9");
  const std::string config = WriteTinyConfig(dir, 100000, /*checkpoint_every=*/1);
  std::mt19937 rng(11);
  for (int trial = 0; trial < 4; ++trial) {
    SCOPED_TRACE(absl::StrCat("trial ", trial));
    const pid_t pid = Start({"--config=" + config, "--save_dir=" + dir + "/ckpt",
                             trial == 0 ? "--resume=false" : "--resume"},
                            dir);
    std::this_thread::sleep_for(std::chrono::milliseconds(1500 + rng() % 1500));
    ASSERT_EQ(::kill(pid, SIGKILL), 0);
    int status = 0;
    ::waitpid(pid, &status, 0);
    ASSERT_OK_AND_ASSIGN(std::vector<CheckpointRef> refs, ListCheckpoints(dir + "/ckpt"));
    for (const CheckpointRef& ref : refs) {
      EXPECT_OK(OpenCheckpoint(ref.path).status()) << ref.path;
    }
  }
  // Resume from whatever is there and take two more steps.
  ASSERT_OK_AND_ASSIGN(CheckpointRef latest, LatestCheckpoint(dir + "/ckpt"));
  const Result r = RunToEnd({"--config=" + config, "--save_dir=" + dir + "/ckpt", "--resume",
                             absl::StrCat("--steps=", latest.step + 2)},
                            dir);
  EXPECT_EQ(r.exit_code, 0) << r.err;
  EXPECT_THAT(r.out, HasSubstr(absl::StrCat("resumed from ", latest.path)));
}

// Every flag that cannot be parsed, an unknown flag and a stray argument exit 2 naming it (absl's
// own parser would exit 1), before any work.
TEST(TrainBinary, EveryUnparseableFlagExitsTwoNamingIt) {
  const std::string dir = trainer_testing::FreshTempDir("train_binary_test", "flags");
  const std::vector<std::pair<std::vector<std::string>, std::string>> cases = {
      {{"--steps=abc"}, "--steps=abc"},
      {{"--steps=1e3"}, "--steps=1e3"},
      {{"--steps=99999999999999999999"}, "--steps"},
      {{"--seed=-1"}, "--seed=-1"},
      {{"--resume=maybe"}, "--resume=maybe"},
      {{"--micro_batch_size=two"}, "--micro_batch_size"},
      {{"--nosuchflag"}, "unknown flag --nosuchflag"},
      {{"--stpes=3"}, "did you mean --steps?"},
      {{"--steps"}, "--steps needs a value"},
      {{"train.bin"}, "unexpected argument 'train.bin'"},
      {{"--", "extra"}, "unexpected argument 'extra'"},
      {{"--comm=tcp", "--print_config"}, "--comm must be auto, local, mpi or nccl"},
      {{"--accelerator_memory=lots"}, "--accelerator_memory=lots"},
  };
  for (const auto& [args, expected] : cases) {
    SCOPED_TRACE(args[0]);
    const Result r = RunToEnd(args, dir);
    EXPECT_EQ(r.exit_code, 2) << r.err;
    EXPECT_THAT(r.err, HasSubstr(expected));
    EXPECT_THAT(r.out, ::testing::Not(HasSubstr("step ")));
  }
  // The accepted spellings still work.
  const Result r = RunToEnd({"--steps", "7", "--noresume", "-seed=3", "--print_config"}, dir);
  EXPECT_EQ(r.exit_code, 0) << r.err;
  EXPECT_THAT(r.out, HasSubstr("\"train_steps\": 7"));
}

// The flags trainer/train.cc defines, from `train --helpfull` (absl lists them under "Flags from
// trainer/train.cc:"), with whether each is a boolean.
std::map<std::string, bool> FlagsOfTheBinary(const std::string& dir) {
  const Result r = RunToEnd({"--helpfull"}, dir);
  std::map<std::string, bool> flags;
  bool in_section = false;
  std::string current;
  for (absl::string_view line : absl::StrSplit(r.out + r.err, '\n')) {
    const absl::string_view trimmed = absl::StripLeadingAsciiWhitespace(line);
    if (absl::StartsWith(trimmed, "Flags from ")) {
      in_section = absl::StrContains(trimmed, "trainer/train.cc");
      continue;
    }
    if (!in_section) continue;
    // A flag's first line is indented by 4 spaces; its wrapped help by more (and may start with
    // a flag it mentions, as --comm's does).
    if (absl::StartsWith(line, "    --")) {
      const size_t end = trimmed.find_first_of(" (");
      current = std::string(trimmed.substr(2, end == absl::string_view::npos ? end : end - 2));
      flags[current] = false;
    }
    // A boolean's default is printed as false or true, unquoted: "default: false;".
    if (!current.empty() && (absl::StrContains(line, "default: false;") ||
                             absl::StrContains(line, "default: true;"))) {
      flags[current] = true;
    }
  }
  return flags;
}

// An empty value is never "not given": every flag of the binary given an empty value — `--flag=`
// or `--flag ""`, as `--train_data=$DATA` with DATA unset gives — exits 2 before any work, naming
// the flag. (It used to train the default run on the synthetic corpus and exit 0.)
TEST(TrainBinary, EveryFlagGivenAnEmptyValueExitsTwoNamingIt) {
  const std::string dir = trainer_testing::FreshTempDir("train_binary_test", "empty_flags");
  const std::map<std::string, bool> flags = FlagsOfTheBinary(dir);
  for (const char* expected : {"config", "train_data", "val_data", "init_from", "nvme_path",
                               "save_dir", "metrics_out", "trace_out", "lora_init_from",
                               "export_merged", "comm", "steps", "seed", "resume"}) {
    ASSERT_TRUE(flags.count(expected)) << "--helpfull does not list --" << expected;
  }
  const std::string metrics = dir + "/metrics.jsonl";
  for (const auto& [flag, boolean] : flags) {
    SCOPED_TRACE(flag);
    for (const std::vector<std::string>& args :
         {std::vector<std::string>{"--" + flag + "=", "--steps=1", "--metrics_out=" + metrics},
          std::vector<std::string>{"--" + flag, "", "--steps=1", "--metrics_out=" + metrics}}) {
      if (boolean && args[1].empty()) continue;  // `--resume ""`: a boolean takes no next value
      if (flag == "steps" || flag == "metrics_out") continue;  // given twice below
      const Result r = RunToEnd(args, dir);
      EXPECT_EQ(r.exit_code, 2) << r.err;
      EXPECT_THAT(r.err, HasSubstr("--" + flag));
      if (!boolean) {
        EXPECT_THAT(r.err, HasSubstr("--" + flag + " is empty"));
        EXPECT_THAT(r.err, HasSubstr("unset shell variable"));
      }
      EXPECT_THAT(r.out, ::testing::Not(HasSubstr("step ")));
      EXPECT_FALSE(std::filesystem::exists(metrics));
    }
  }
  for (const char* flag : {"steps", "metrics_out"}) {
    const Result r = RunToEnd({absl::StrCat("--", flag, "=")}, dir);
    EXPECT_EQ(r.exit_code, 2) << r.err;
    EXPECT_THAT(r.err, HasSubstr(absl::StrCat("--", flag, " is empty")));
  }
  // The issue's command: `train --config= --train_data=$DATA` with DATA unset.
  const Result r = RunToEnd({"--config=", "--train_data="}, dir);
  EXPECT_EQ(r.exit_code, 2) << r.err;
  EXPECT_THAT(r.err, HasSubstr("--config is empty"));
  EXPECT_THAT(r.out, ::testing::Not(HasSubstr("step ")));
  // A flag left out is "not given", and a value is a value.
  const Result given = RunToEnd({"--steps=3", "--print_config"}, dir);
  EXPECT_EQ(given.exit_code, 0) << given.err;
}

// An empty string in the config file is refused naming the key (leaving the key out is "not
// given"), exit 2 before any work.
TEST(TrainBinary, AnEmptyStringInTheConfigExitsTwoNamingTheKey) {
  const std::string dir = trainer_testing::FreshTempDir("train_binary_test", "empty_keys");
  const std::vector<std::pair<std::string, std::string>> cases = {
      {R"({"data": {"train": ""}})", "`data.train` = string \"\""},
      {R"({"data": {"val": ""}})", "`data.val` = string \"\""},
      {R"({"checkpoint": {"init_from": ""}})", "`checkpoint.init_from` = string \"\""},
      {R"({"checkpoint": {"dir": ""}})", "`checkpoint.dir` = string \"\""},
      {R"({"profile": {"metrics": ""}})", "`profile.metrics` = string \"\""},
      {R"({"model": {"preset": ""}})", "`model.preset` = string \"\""},
      {R"({"zero_optimization": {"offload_optimizer": {"device": "nvme", "nvme_path": ""}}})",
       "`zero_optimization.offload_optimizer.nvme_path` = string \"\""},
      {R"({"lora": {"r": 4, "target_modules": "all-linear", "init_from": ""}})",
       "`lora.init_from` = string \"\""},
      {R"({"accelerator": {"memory": ""}})", "`accelerator.memory` = string \"\""},
  };
  for (const auto& [json, expected] : cases) {
    SCOPED_TRACE(json);
    std::ofstream(dir + "/config.json") << json;
    const Result r = RunToEnd({"--config=" + dir + "/config.json", "--steps=1"}, dir);
    EXPECT_EQ(r.exit_code, 2) << r.err;
    EXPECT_THAT(r.err, HasSubstr(expected));
    EXPECT_THAT(r.out, ::testing::Not(HasSubstr("step ")));
  }
}

// Something the config asks for that this program does not implement, found before training
// (here a Hugging Face config.json's hidden_act, read when the trainer is built) exits 2, as a
// mistake in the config (README: "2 for a mistake in flags or config found before training").
TEST(TrainBinary, AnUnimplementedFeatureFoundBeforeTrainingExitsTwo) {
  const std::string dir = trainer_testing::FreshTempDir("train_binary_test", "unimplemented");
  const std::string hf = dir + "/qwen3";
  std::filesystem::create_directories(hf);
  std::ofstream(hf + "/config.json") << R"({"model_type": "qwen3", "vocab_size": 256,
    "hidden_size": 32, "intermediate_size": 48, "num_hidden_layers": 2,
    "num_attention_heads": 4, "num_key_value_heads": 2, "head_dim": 16,
    "max_position_embeddings": 128, "tie_word_embeddings": true, "hidden_act": "relu"})";
  const std::string metrics = dir + "/metrics.jsonl";
  const Result r =
      RunToEnd({"--init_from=" + hf, "--steps=1", "--metrics_out=" + metrics}, dir);
  EXPECT_EQ(r.exit_code, 2) << r.err;
  EXPECT_THAT(r.err, HasSubstr("hidden_act"));
  EXPECT_THAT(r.err, HasSubstr("relu"));
  EXPECT_THAT(r.out, ::testing::Not(HasSubstr("step ")));
}

// Every flag the binary defines has a row in docs/training.md's flags table, and every row names
// a flag the binary defines.
TEST(TrainBinary, EveryFlagIsInTheDocsFlagsTable) {
  const std::string dir = trainer_testing::FreshTempDir("train_binary_test", "docs_flags");
  std::set<std::string> binary;
  for (const auto& [flag, boolean] : FlagsOfTheBinary(dir)) binary.insert(flag);
  ASSERT_GE(binary.size(), 20u);
  const std::string docs = ReadFile(trainer_testing::Runfile("docs/training.md"));
  ASSERT_FALSE(docs.empty());
  // The table under "## Flags": rows "| `--name...` ...", the first cell naming one or more flags.
  const size_t section = docs.find("\n## Flags\n");
  ASSERT_NE(section, std::string::npos) << "docs/training.md has no \"## Flags\" section";
  const size_t next = docs.find("\n## ", section + 1);
  std::set<std::string> documented;
  for (absl::string_view line :
       absl::StrSplit(absl::string_view(docs).substr(section, next - section), '\n')) {
    if (!absl::StartsWith(line, "| `--")) continue;
    const absl::string_view cell = line.substr(1, line.find('|', 1) - 1);
    for (absl::string_view piece : absl::StrSplit(cell, '`', absl::SkipEmpty())) {
      if (!absl::StartsWith(piece, "--")) continue;
      piece.remove_prefix(2);
      documented.insert(std::string(piece.substr(0, piece.find_first_of("=[ "))));
    }
  }
  for (const std::string& flag : binary) {
    EXPECT_TRUE(documented.count(flag)) << "--" << flag << " is missing from docs/training.md";
  }
  for (const std::string& flag : documented) {
    EXPECT_TRUE(binary.count(flag)) << "docs/training.md documents --" << flag
                                    << ", which the binary does not define";
  }
}

// --print_config from a Hugging Face directory: stdout is the config JSON alone, and stderr says
// the model is config.json's (its family and size), not the model section printed.
TEST(TrainBinary, PrintConfigFromADirectoryNamesItsModel) {
  const std::string dir = trainer_testing::FreshTempDir("train_binary_test", "print_config_hf");
  const std::string hf = dir + "/qwen3";
  std::filesystem::create_directories(hf);
  std::ofstream(hf + "/config.json") << R"({"model_type": "qwen3", "vocab_size": 256,
    "hidden_size": 32, "intermediate_size": 48, "num_hidden_layers": 2,
    "num_attention_heads": 4, "num_key_value_heads": 2, "head_dim": 16,
    "max_position_embeddings": 128, "tie_word_embeddings": true})";
  const Result r = RunToEnd({"--init_from=" + hf, "--print_config"}, dir);
  EXPECT_EQ(r.exit_code, 0) << r.err;
  EXPECT_TRUE(nlohmann::json::accept(r.out)) << r.out;
  EXPECT_THAT(r.err, HasSubstr("is a Hugging Face directory"));
  EXPECT_THAT(r.err, HasSubstr("qwen3"));
  EXPECT_THAT(r.err, HasSubstr("hidden_size 32, 2 layers"));
  // Without a directory there is no note.
  const Result plain = RunToEnd({"--print_config"}, dir);
  EXPECT_EQ(plain.exit_code, 0) << plain.err;
  EXPECT_THAT(plain.err, ::testing::Not(HasSubstr("Hugging Face directory")));
}

// --nvme_path turns the disk tier on (zero_optimization.offload_optimizer.device "nvme" and its
// nvme_path, shown by --print_config); a directory that does not exist is refused before any work,
// naming the key and the path.
TEST(TrainBinary, NvmePathFlagSetsTheDiskTier) {
  const std::string dir = trainer_testing::FreshTempDir("train_binary_test", "nvme_path");
  const std::string swap = dir + "/swap";
  std::filesystem::create_directories(swap);
  const Result r = RunToEnd({"--nvme_path=" + swap, "--print_config"}, dir);
  EXPECT_EQ(r.exit_code, 0) << r.err;
  ASSERT_TRUE(nlohmann::json::accept(r.out)) << r.out;
  const nlohmann::json j = nlohmann::json::parse(r.out);
  EXPECT_EQ(j["zero_optimization"]["offload_optimizer"]["device"], "nvme");
  EXPECT_EQ(j["zero_optimization"]["offload_optimizer"]["nvme_path"], swap);
  EXPECT_EQ(j["aio"]["block_size"], "1MiB");
  const Result missing = RunToEnd({"--nvme_path=" + dir + "/missing", "--print_config"}, dir);
  EXPECT_EQ(missing.exit_code, 1) << missing.err;
  EXPECT_THAT(missing.err, HasSubstr("zero_optimization.offload_optimizer.nvme_path"));
  EXPECT_THAT(missing.err, HasSubstr(dir + "/missing"));
}

// --comm=nccl is refused before any work with the fix named, except on a GPU: in this build (no
// CUDA) exit 1, "rebuild with --config=cuda"; in a cuda build, with the emulated accelerator,
// exit 2 naming accelerator.backend, and without a GPU exit 1 with the backend's words. With a GPU
// (a cuda build on a GPU machine) the cuda run trains one step over NCCL, a world of one.
TEST(TrainBinary, CommNcclIsRefusedBeforeAnyWorkWithTheFix) {
  const std::string dir = trainer_testing::FreshTempDir("train_binary_test", "nccl");
  const std::string metrics = dir + "/metrics.jsonl";
  BackendOptions probe;
  probe.kind = "cuda";
  const bool gpu = CreateBackend(probe).ok();
  for (const std::string accelerator : {"cpu", "cuda"}) {
    SCOPED_TRACE(accelerator);
    std::filesystem::remove(metrics);
    const Result r = RunToEnd(
        {"--comm=nccl", "--accelerator=" + accelerator, "--steps=1", "--metrics_out=" + metrics},
        dir);
    if (NcclCompiledIn() && accelerator == "cuda" && gpu) {
      EXPECT_EQ(r.exit_code, 0) << r.err;
      EXPECT_TRUE(std::filesystem::exists(metrics));
      continue;
    }
    EXPECT_THAT(r.err, HasSubstr("--comm=nccl"));
    EXPECT_THAT(r.out, ::testing::Not(HasSubstr("step ")));
    EXPECT_FALSE(std::filesystem::exists(metrics)) << "no output before the checks";
    if (!NcclCompiledIn()) {
      EXPECT_EQ(r.exit_code, 1) << r.err;
      EXPECT_THAT(r.err, HasSubstr("rebuild with --config=cuda"));
    } else if (accelerator == "cpu") {
      EXPECT_EQ(r.exit_code, 2) << r.err;
      EXPECT_THAT(r.err, HasSubstr("accelerator.backend"));
    } else {
      EXPECT_EQ(r.exit_code, 1) << r.err;
      EXPECT_THAT(r.err, HasSubstr("no CUDA device is available"));
    }
  }
}

// An output that is an input — same path, a hard link, a symlink — is refused with exit 2 before
// anything is opened for writing: the token file keeps its bytes (it used to be truncated to 0
// and the run died of SIGBUS).
TEST(TrainBinary, OutputsThatAreInputsExitTwoAndDestroyNothing) {
  const std::string dir = trainer_testing::FreshTempDir("train_binary_test", "alias");
  const std::string config = WriteTinyConfig(dir, 3);
  std::vector<uint16_t> tokens(20000);
  for (size_t i = 0; i < tokens.size(); ++i) tokens[i] = static_cast<uint16_t>(i * 31 % 256);
  ASSERT_OK(WriteTokenFile(dir + "/train.bin", tokens));
  const std::string original = ReadFile(dir + "/train.bin");
  std::filesystem::create_hard_link(dir + "/train.bin", dir + "/hard.bin");
  std::filesystem::create_symlink(dir + "/train.bin", dir + "/soft.bin");
  const std::string train = "--train_data=" + dir + "/train.bin";
  for (const std::vector<std::string>& outputs :
       std::vector<std::vector<std::string>>{{"--metrics_out=" + dir + "/train.bin"},
                                             {"--trace_out=" + dir + "/hard.bin"},
                                             {"--metrics_out=" + dir + "/soft.bin"},
                                             {"--trace_out=" + config},
                                             {"--save_dir=" + dir + "/train.bin"}}) {
    SCOPED_TRACE(outputs[0]);
    std::vector<std::string> args = {"--config=" + config, train};
    args.insert(args.end(), outputs.begin(), outputs.end());
    const Result r = RunToEnd(args, dir);
    EXPECT_EQ(r.exit_code, 2) << r.err;
    EXPECT_THAT(r.err, HasSubstr(outputs[0].substr(2, outputs[0].find('=') - 2)));
    EXPECT_EQ(ReadFile(dir + "/train.bin"), original);
  }
  // A checkpoint directory holding the data is fine where the writer does not manage it.
  const Result ok = RunToEnd({"--config=" + config, train, "--save_dir=" + dir}, dir);
  EXPECT_EQ(ok.exit_code, 0) << ok.err;
  EXPECT_EQ(ReadFile(dir + "/train.bin"), original);
}

// A run that diverges (an absurd learning rate) exits 1 with the reason and what to do, and the
// checkpoints written before it are the only ones: none of the failing step.
TEST(TrainBinary, ADivergedRunExitsOneAndSavesNothingNew) {
  const std::string dir = trainer_testing::FreshTempDir("train_binary_test", "diverge");
  {
    const nlohmann::json tiny = nlohmann::json::parse(ReadFile(WriteTinyConfig(dir, 10, 1)));
    nlohmann::json j = tiny;
    j["optimizer"]["params"]["lr"] = 1e30;
    j["gradient_clipping"] = 0;
    j["checkpoint"]["keep_last"] = 10;
    std::ofstream(dir + "/diverge.json") << j.dump();
  }
  const Result r =
      RunToEnd({"--config=" + dir + "/diverge.json", "--save_dir=" + dir + "/ckpt"}, dir);
  EXPECT_EQ(r.exit_code, 1) << r.err;
  EXPECT_THAT(r.err, HasSubstr("non-finite gradients"));
  EXPECT_THAT(r.err, HasSubstr("optimizer.params.lr"));
  ASSERT_OK_AND_ASSIGN(std::vector<CheckpointRef> refs, ListCheckpoints(dir + "/ckpt"));
  ASSERT_FALSE(refs.empty());
  int last_printed = 0;
  for (int s = 1; s <= 10; ++s) {
    if (absl::StrContains(r.out, absl::StrCat("step ", absl::StrFormat("%5d", s), "/10"))) {
      last_printed = s;
    }
  }
  EXPECT_EQ(refs.back().step, last_printed) << r.out;
  for (const CheckpointRef& ref : refs) EXPECT_OK(OpenCheckpoint(ref.path).status());
}

// SIGINT on a run throttled to the slowest allowed link (1 MB/s; a step moves ~40 MiB, ~40 s at
// that speed): the link emulation ends, the current step finishes, a checkpoint is written and
// the program exits 0 well before the step could have finished at link speed.
TEST(TrainBinary, SigintEndsASlowLinkRunInSeconds) {
  const std::string dir = trainer_testing::FreshTempDir("train_binary_test", "slow_link");
  nlohmann::json j = nlohmann::json::parse(ReadFile(WriteTinyConfig(dir, 1000)));
  j["model"]["n_embd"] = 256;
  j["model"]["n_layer"] = 4;
  j["model"]["n_head"] = 4;
  j["chunk"]["size"] = 266240;
  j["accelerator"]["memory"] = 8 * kMiB;
  j["accelerator"]["copy_bandwidth"] = "1MB/s";
  std::ofstream(dir + "/slow.json") << j.dump();
  const pid_t pid = Start({"--config=" + dir + "/slow.json", "--save_dir=" + dir + "/ckpt"}, dir);
  // The checkpoint root is created once the stop handlers are installed and everything is
  // checked; then the first chunk copies run.
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(120);
  while (!std::filesystem::exists(dir + "/ckpt") && std::chrono::steady_clock::now() < deadline) {
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  }
  ASSERT_TRUE(std::filesystem::exists(dir + "/ckpt")) << ReadFile(dir + "/stderr.txt");
  std::this_thread::sleep_for(std::chrono::milliseconds(1000));
  ASSERT_EQ(::kill(pid, SIGINT), 0);
  const int status = Wait(pid, std::chrono::seconds(30));
  ASSERT_TRUE(WIFEXITED(status)) << ReadFile(dir + "/stderr.txt");
  EXPECT_EQ(WEXITSTATUS(status), 0) << ReadFile(dir + "/stderr.txt");
  EXPECT_THAT(ReadFile(dir + "/stdout.txt"), HasSubstr("stop requested"));
  ASSERT_OK_AND_ASSIGN(CheckpointRef latest, LatestCheckpoint(dir + "/ckpt"));
  EXPECT_OK(OpenCheckpoint(latest.path).status());
}

// A pipe holding `text`, write end closed: its read end (inherited by the trainer: pipe(2) does
// not set close-on-exec) is what a shell's <(echo ...) passes as /dev/fd/N.
int PipeHolding(const std::string& text) {
  int fds[2];
  if (::pipe(fds) != 0) return -1;
  const ssize_t n = ::write(fds[1], text.data(), text.size());
  ::close(fds[1]);
  if (n != static_cast<ssize_t>(text.size())) {
    ::close(fds[0]);
    return -1;
  }
  return fds[0];
}

// Writes `text` into the FIFO `path` once a reader opens it (polling, so that a trainer that
// never opens it leaves no writer blocked), for up to a minute.
std::thread FifoWriter(const std::string& path, const std::string& text) {
  return std::thread([path, text] {
    const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(60);
    while (std::chrono::steady_clock::now() < deadline) {
      const int fd = ::open(path.c_str(), O_WRONLY | O_NONBLOCK | O_CLOEXEC);
      if (fd < 0) {
        std::this_thread::sleep_for(std::chrono::milliseconds(10));
        continue;
      }
      ::fcntl(fd, F_SETFL, 0);
      ssize_t written = 0;
      while (written < static_cast<ssize_t>(text.size())) {
        const ssize_t n = ::write(fd, text.data() + written, text.size() - written);
        if (n <= 0) break;
        written += n;
      }
      ::close(fd);
      return;
    }
  });
}

// A config in a pipe (--config=<(...), i.e. /dev/fd/N, and --config=/dev/stdin) or a named FIFO
// is read once and trains; an output that is the config's FIFO is still refused.
TEST(TrainBinary, AConfigFromAPipeOrAFifoTrains) {
  const std::string dir = trainer_testing::FreshTempDir("train_binary_test", "pipe");
  const std::string text = ReadFile(WriteTinyConfig(dir, 2));
  {
    SCOPED_TRACE("--config=/dev/fd/N");
    const int fd = PipeHolding(text);
    ASSERT_GE(fd, 0);
    const Result r = RunToEnd({absl::StrCat("--config=/dev/fd/", fd)}, dir);
    ::close(fd);
    EXPECT_EQ(r.exit_code, 0) << r.err;
    EXPECT_THAT(r.out, HasSubstr("step     2/2"));
  }
  {
    SCOPED_TRACE("--config=/dev/stdin");
    const int fd = PipeHolding(text);
    ASSERT_GE(fd, 0);
    const Result r = RunToEnd({"--config=/dev/stdin"}, dir, /*stdin_fd=*/fd);
    ::close(fd);
    EXPECT_EQ(r.exit_code, 0) << r.err;
    EXPECT_THAT(r.out, HasSubstr("step     2/2"));
  }
  const std::string fifo = dir + "/config.fifo";
  ASSERT_EQ(::mkfifo(fifo.c_str(), 0600), 0);
  {
    SCOPED_TRACE("a FIFO");
    std::thread writer = FifoWriter(fifo, text);
    const Result r = RunToEnd({"--config=" + fifo}, dir);
    writer.join();
    EXPECT_EQ(r.exit_code, 0) << r.err;
    EXPECT_THAT(r.out, HasSubstr("step     2/2"));
  }
  {
    SCOPED_TRACE("an output that is the config's FIFO");
    std::thread writer = FifoWriter(fifo, text);
    const Result r = RunToEnd({"--config=" + fifo, "--metrics_out=" + fifo}, dir);
    writer.join();
    EXPECT_EQ(r.exit_code, 2) << r.err;
    EXPECT_THAT(r.err, HasSubstr("profile.metrics (--metrics_out)"));
    EXPECT_THAT(r.err, HasSubstr("the config file (--config)"));
  }
}

// Every model dimension out of range, and a Llama-family preset's dimensions that do not fit it,
// are refused naming the key the config wrote (not the model's internal field names).
TEST(TrainBinary, ModelKeysAreNamedAsTheConfigWritesThem) {
  const std::string dir = trainer_testing::FreshTempDir("train_binary_test", "model_keys");
  const nlohmann::json tiny = nlohmann::json::parse(ReadFile(WriteTinyConfig(dir, 1)));
  const std::vector<std::pair<nlohmann::json, std::string>> cases = {
      {{{"n_layer", 1000000000}}, "`model.n_layer` = 1000000000"},
      {{{"n_embd", int64_t{1} << 31}}, "`model.n_embd` = 2147483648"},
      {{{"n_head", int64_t{1} << 31}}, "`model.n_head` = 2147483648"},
      {{{"n_positions", int64_t{1} << 31}}, "`model.n_positions` = 2147483648"},
      {{{"vocab_size", int64_t{1} << 31}}, "`model.vocab_size` = 2147483648"},
      {{{"preset", "llama-tiny"}, {"n_layer", 1 << 21}}, "`model.n_layer` = 2097152"},
      {{{"preset", "llama-tiny"}, {"n_head", 3}}, "`model.n_head` = 3"},
      {{{"preset", "llama-tiny"}, {"n_embd", 80}, {"n_head", 5}}, "`model.n_head` = 5"},
      {{{"preset", "llama-tiny"}, {"n_embd", 68}}, "`model.n_embd` / `model.n_head`"},
  };
  for (const auto& [model, expected] : cases) {
    SCOPED_TRACE(model.dump());
    nlohmann::json j = tiny;
    if (model.contains("preset")) {
      j["model"] = model;
    } else {
      j["model"].update(model);
    }
    std::ofstream(dir + "/model.json") << j.dump();
    const Result r = RunToEnd({"--config=" + dir + "/model.json"}, dir);
    EXPECT_EQ(r.exit_code, 2) << r.err;
    EXPECT_THAT(r.err, HasSubstr(expected));
    for (const char* internal :
         {"num_layers", "hidden_size", "num_heads", "max_position_embeddings", "head_dim"}) {
      EXPECT_THAT(r.err, ::testing::Not(HasSubstr(internal)));
    }
  }
}

// fp16 with a learning rate that makes the weights overflow f16 stops at once (exit 1, the
// reason on stderr), as f32/bf16 divergence does; a gradient overflow with finite weights (a huge
// loss scale) is still a skipped step, and the run goes on to its end.
TEST(TrainBinary, Fp16WeightsThatOverflowStopButGradientOverflowsSkip) {
  const std::string dir = trainer_testing::FreshTempDir("train_binary_test", "fp16");
  const nlohmann::json tiny = nlohmann::json::parse(ReadFile(WriteTinyConfig(dir, 10)));
  nlohmann::json j = tiny;
  j["fp16"]["enabled"] = true;
  j["optimizer"]["params"]["lr"] = 1e30;
  j["gradient_clipping"] = 0;
  std::ofstream(dir + "/weights.json") << j.dump();
  Result r = RunToEnd({"--config=" + dir + "/weights.json"}, dir);
  EXPECT_EQ(r.exit_code, 1) << r.out;
  EXPECT_THAT(r.err, HasSubstr("fp16: the parameters are no longer finite at step"));
  EXPECT_THAT(r.err, HasSubstr("optimizer.params.lr"));
  // At the first skip: no skipped step was printed (the one that stopped is not).
  EXPECT_THAT(r.out, HasSubstr("step     1/10"));
  EXPECT_THAT(r.out, ::testing::Not(HasSubstr("(skipped: overflow)")));

  j = tiny;
  j["train_steps"] = 3;
  j["fp16"]["enabled"] = true;
  j["fp16"]["initial_scale_power"] = 40;
  std::ofstream(dir + "/gradients.json") << j.dump();
  r = RunToEnd({"--config=" + dir + "/gradients.json"}, dir);
  EXPECT_EQ(r.exit_code, 0) << r.err;
  EXPECT_THAT(r.out, HasSubstr("(skipped: overflow)"));
  EXPECT_THAT(r.out, HasSubstr("step     3/3"));
}

// --init_from naming no directory, with no model section: the path and why it cannot be read
// come first (exit 1, as with a model section), not "the model is not defined".
TEST(TrainBinary, InitFromWithoutAModelNamesThePathAndTheCause) {
  const std::string dir = trainer_testing::FreshTempDir("train_binary_test", "init_from");
  std::ofstream(dir + "/config.json") << R"({"train_steps": 1})";
  std::ofstream(dir + "/notes.txt") << "hello";
  std::filesystem::create_symlink(dir + "/loop_b", dir + "/loop_a");
  std::filesystem::create_symlink(dir + "/loop_a", dir + "/loop_b");
  const std::vector<std::pair<std::string, std::string>> cases = {
      {dir + "/notes.txt", "not a safetensors file"},
      {dir + "/loop_a", "Too many levels of symbolic links"},
      {dir + "/missing.safetensors", "No such file or directory"},
  };
  for (const auto& [path, cause] : cases) {
    SCOPED_TRACE(path);
    const Result r = RunToEnd({"--config=" + dir + "/config.json", "--init_from=" + path}, dir);
    EXPECT_EQ(r.exit_code, 1) << r.err;
    EXPECT_THAT(r.err, HasSubstr(path));
    EXPECT_THAT(r.err, HasSubstr(cause));
    EXPECT_THAT(r.err, HasSubstr("checkpoint.init_from (--init_from)"));
    EXPECT_THAT(r.err, ::testing::Not(HasSubstr("the model is not defined")));
  }
}

// data.eval_every 0 never validates; N validates before the first step, every N and at the end.
TEST(TrainBinary, EvalEveryZeroTurnsValidationOff) {
  const std::string dir = trainer_testing::FreshTempDir("train_binary_test", "eval");
  const std::string config = WriteTinyConfig(dir, 2);  // eval_every 0
  Result r = RunToEnd({"--config=" + config}, dir);
  EXPECT_EQ(r.exit_code, 0) << r.err;
  EXPECT_THAT(r.out, ::testing::Not(HasSubstr("validation loss")));
  EXPECT_THAT(r.out, HasSubstr("validation: off (data.eval_every = 0"));
  nlohmann::json j = nlohmann::json::parse(ReadFile(config));
  j["data"]["eval_every"] = 1;
  std::ofstream(dir + "/eval1.json") << j.dump();
  r = RunToEnd({"--config=" + dir + "/eval1.json"}, dir);
  EXPECT_EQ(r.exit_code, 0) << r.err;
  EXPECT_THAT(r.out, HasSubstr("step     0 validation loss"));
  EXPECT_THAT(r.out, HasSubstr("step     2 validation loss"));
}

std::vector<double> MetricLosses(const std::string& path) {
  std::vector<double> losses;
  for (absl::string_view line : absl::StrSplit(ReadFile(path), '\n', absl::SkipEmpty())) {
    losses.push_back(nlohmann::json::parse(line)["loss"].get<double>());
  }
  return losses;
}

// --model= takes the Llama-family presets: a small one trains from a seeded random init under a
// cap below its 1.82 MiB of model data, bit for bit the same for a seed, with falling loss; an
// unknown preset lists every valid name.
TEST(TrainBinary, ALlamaFamilyPresetTrainsFromASeededRandomInit) {
  const std::string dir = trainer_testing::FreshTempDir("train_binary_test", "llama_preset");
  const auto run = [&](const std::string& seed, const std::string& metrics) {
    return RunToEnd({"--model=llama-tiny", "--steps=12", "--seq_len=32", "--micro_batch_size=4",
                     "--accelerator_memory=1536KiB", "--seed=" + seed, "--metrics_out=" + metrics},
                    dir);
  };
  Result r = run("5", dir + "/a.jsonl");
  ASSERT_EQ(r.exit_code, 0) << r.err;
  EXPECT_THAT(r.out, HasSubstr("model llama-tiny: 2 layers, 4 heads, hidden 64"));
  r = run("5", dir + "/b.jsonl");
  ASSERT_EQ(r.exit_code, 0) << r.err;
  r = run("6", dir + "/c.jsonl");
  ASSERT_EQ(r.exit_code, 0) << r.err;
  const std::vector<double> a = MetricLosses(dir + "/a.jsonl");
  const std::vector<double> b = MetricLosses(dir + "/b.jsonl");
  const std::vector<double> c = MetricLosses(dir + "/c.jsonl");
  ASSERT_EQ(a.size(), 12u);
  EXPECT_EQ(a, b) << "the same seed must give the same losses";
  EXPECT_NE(a.front(), c.front()) << "the seed must reach the initialization";
  EXPECT_LT((a[9] + a[10] + a[11]) / 3, a[0] - 0.3) << r.out;

  r = RunToEnd({"--model=llama-9"}, dir);
  EXPECT_EQ(r.exit_code, 2);
  for (const char* name : {"llama-tiny", "qwen2.5-3b", "mistral-7b-v0.3", "gpt2"}) {
    EXPECT_THAT(r.err, HasSubstr(name));
  }
}

// QLoRA from the command line: --load_in_4bit without LoRA, and a compute dtype not built yet,
// exit 2 before any work naming the keys; with LoRA the run trains, its header says the base is
// 4-bit, --print_config writes the section so that it loads back, and a checkpoint of the 4-bit
// run resumes only as a 4-bit run.
TEST(TrainBinary, FourBitBaseNeedsLoraSaysItIsFourBitAndResumesOnlyAsSuch) {
  const std::string dir = trainer_testing::FreshTempDir("train_binary_test", "qlora");
  const std::string metrics = dir + "/metrics.jsonl";
  const std::vector<std::string> tiny = {"--model=llama-tiny", "--seq_len=16",
                                         "--micro_batch_size=2"};
  const auto with = [&](std::vector<std::string> extra) {
    std::vector<std::string> args = tiny;
    args.insert(args.end(), extra.begin(), extra.end());
    return args;
  };
  Result r = RunToEnd(with({"--load_in_4bit", "--steps=1", "--metrics_out=" + metrics}), dir);
  EXPECT_EQ(r.exit_code, 2) << r.err;
  EXPECT_THAT(r.err, HasSubstr("quantization.load_in_4bit"));
  EXPECT_THAT(r.err, HasSubstr("`lora`"));
  EXPECT_THAT(r.out, ::testing::Not(HasSubstr("step ")));
  EXPECT_FALSE(std::filesystem::exists(metrics));

  std::ofstream(dir + "/bf16_compute.json")
      << R"({"train_steps": 1, "lora": {"r": 4, "target_modules": ["q_proj"]},
             "bf16": {"enabled": true},
             "quantization": {"load_in_4bit": true, "bnb_4bit_compute_dtype": "bfloat16"}})";
  r = RunToEnd(with({"--config=" + dir + "/bf16_compute.json"}), dir);
  EXPECT_EQ(r.exit_code, 0) << r.err;
  EXPECT_THAT(r.out, HasSubstr("computed in bf16"));
  EXPECT_THAT(r.out, HasSubstr("| loss "));

  const std::vector<std::string> qlora =
      with({"--lora_r=4", "--lora_target_modules=q_proj,v_proj", "--load_in_4bit"});
  const auto qlora_with = [&](std::vector<std::string> extra) {
    std::vector<std::string> args = qlora;
    args.insert(args.end(), extra.begin(), extra.end());
    return args;
  };
  r = RunToEnd(qlora_with({"--steps=2", "--save_dir=" + dir + "/ckpt",
                           "--metrics_out=" + metrics}),
               dir);
  ASSERT_EQ(r.exit_code, 0) << r.err;
  EXPECT_THAT(r.out, HasSubstr("base: 14 linear weights in 4-bit fp4: "));
  EXPECT_THAT(r.out, HasSubstr("bytes per parameter (4 in f32 unquantized)"));
  EXPECT_EQ(MetricLosses(metrics).size(), 2u);
  // The summary counts the base's parameters, not its 4-bit blobs' elements: as the header.
  {
    const std::smatch head = [&] {
      std::smatch m;
      std::regex_search(r.out, m, std::regex(R"(: \d+ trainable parameters \([^)]*\), (\d+) frozen)"));
      return m;
    }();
    std::smatch tail;
    ASSERT_TRUE(std::regex_search(r.out, tail, std::regex(R"(and (\d+) frozen parameters;)")));
    ASSERT_EQ(head.size(), 2u) << r.out;
    EXPECT_EQ(head[1].str(), tail[1].str());
  }

  // --print_config: the section, and the printed config loads back to the same text.
  r = RunToEnd(qlora_with({"--print_config", "--steps=2"}), dir);
  ASSERT_EQ(r.exit_code, 0) << r.err;
  EXPECT_THAT(r.out, HasSubstr("\"quantization\""));
  EXPECT_THAT(r.out, HasSubstr("\"bnb_4bit_quant_type\": \"fp4\""));
  std::ofstream(dir + "/printed.json") << r.out;
  const Result again = RunToEnd({"--config=" + dir + "/printed.json", "--print_config"}, dir);
  ASSERT_EQ(again.exit_code, 0) << again.err;
  EXPECT_EQ(again.out, r.out);

  // The 4-bit run's checkpoint: refused by the same run at 16 bits (or in nf4), naming the key.
  r = RunToEnd(with({"--lora_r=4", "--lora_target_modules=q_proj,v_proj", "--steps=3",
                     "--resume", "--save_dir=" + dir + "/ckpt"}),
               dir);
  EXPECT_EQ(r.exit_code, 1) << r.err;
  EXPECT_THAT(r.err, HasSubstr("the quantization section"));
  std::ofstream(dir + "/nf4.json") << R"({"quantization": {"bnb_4bit_quant_type": "nf4"}})";
  r = RunToEnd(qlora_with({"--config=" + dir + "/nf4.json", "--steps=3", "--resume",
                           "--save_dir=" + dir + "/ckpt"}),
               dir);
  EXPECT_EQ(r.exit_code, 1) << r.err;
  EXPECT_THAT(r.err, HasSubstr("quantization.bnb_4bit_quant_type \"fp4\" (this run: \"nf4\")"));
  r = RunToEnd(qlora_with({"--steps=3", "--resume", "--save_dir=" + dir + "/ckpt",
                           "--metrics_out=" + metrics}),
               dir);
  ASSERT_EQ(r.exit_code, 0) << r.err;
  EXPECT_EQ(MetricLosses(metrics).size(), 3u);
}

// The binary with `args`, stdout into a new pipe (as under `tee` or a CI log) or a pseudo-terminal
// (`terminal`), whose reading end goes to *read_fd; stderr to dir/stderr.txt.
pid_t StartWithStdoutTo(const std::vector<std::string>& args, const std::string& dir, bool terminal,
                        int* read_fd) {
  int child_fd = -1;
  if (terminal) {
    const int master = ::posix_openpt(O_RDWR | O_NOCTTY | O_CLOEXEC);
    if (master < 0 || ::grantpt(master) != 0 || ::unlockpt(master) != 0) return -1;
    child_fd = ::open(::ptsname(master), O_RDWR | O_NOCTTY | O_CLOEXEC);
    *read_fd = master;
  } else {
    int fds[2];
    if (::pipe2(fds, O_CLOEXEC) != 0) return -1;
    *read_fd = fds[0];
    child_fd = fds[1];
  }
  if (child_fd < 0) return -1;
  const std::string err = dir + "/stderr.txt";
  const pid_t pid = ::fork();
  if (pid == 0) {
    if (::dup2(child_fd, 1) < 0) ::_exit(120);
    if (std::freopen(err.c_str(), "w", stderr) == nullptr) ::_exit(120);
    std::vector<char*> argv;
    const std::string binary = TrainBinary();
    argv.push_back(const_cast<char*>(binary.c_str()));
    for (const std::string& a : args) argv.push_back(const_cast<char*>(a.c_str()));
    argv.push_back(nullptr);
    ::execv(binary.c_str(), argv.data());
    ::_exit(121);
  }
  ::close(child_fd);
  return pid;
}

// Appends what `fd` yields to *text until `until` is in it (empty: until end of file, or EIO from
// a terminal whose program exited) or `timeout` passes. Returns whether `until` was found.
bool ReadUntil(int fd, absl::string_view until, std::string* text,
               std::chrono::seconds timeout = std::chrono::seconds(120)) {
  const auto deadline = std::chrono::steady_clock::now() + timeout;
  char buffer[4096];
  while (std::chrono::steady_clock::now() < deadline) {
    if (!until.empty() && absl::StrContains(*text, until)) return true;
    pollfd p{fd, POLLIN, 0};
    if (::poll(&p, 1, 100) <= 0) continue;
    const ssize_t n = ::read(fd, buffer, sizeof(buffer));
    if (n <= 0) return until.empty();
    text->append(buffer, static_cast<size_t>(n));
  }
  return false;
}

// Piped into a log, the run's lines arrive as they are written (stdout used to be block-buffered
// there: a `tee`d log showed nothing until the run exited or 4 KiB had piled up): on a link so
// slow that the first step takes ~40 s, the header, the seeded init's line and the run's start
// line all arrive while that step still runs, the header before the init's line; plain lines
// only (no carriage returns or terminal escapes). After SIGINT the summary has the time to first
// step, and the metrics file's line its numbers with the setup's phases.
TEST(TrainBinary, LinesReachAPipeAsWrittenHeaderBeforeInit) {
  const std::string dir = trainer_testing::FreshTempDir("train_binary_test", "pipe_out");
  nlohmann::json j = nlohmann::json::parse(ReadFile(WriteTinyConfig(dir, 1000)));
  j["model"]["n_embd"] = 256;
  j["model"]["n_layer"] = 4;
  j["model"]["n_head"] = 4;
  j["chunk"]["size"] = 266240;
  j["accelerator"]["memory"] = 8 * kMiB;
  j["accelerator"]["copy_bandwidth"] = "1MB/s";  // a step moves ~40 MiB: ~40 s
  std::ofstream(dir + "/slow.json") << j.dump();
  const std::string metrics = dir + "/m.jsonl";
  int fd = -1;
  const pid_t pid = StartWithStdoutTo(
      {"--config=" + dir + "/slow.json", "--metrics_out=" + metrics}, dir, /*terminal=*/false, &fd);
  ASSERT_GT(pid, 0);
  std::string out;
  const bool started =
      ReadUntil(fd, "training 1000 steps from step 0", &out, std::chrono::seconds(30));
  int status = 0;
  // Nothing waited for the exit, nor for the first step's line.
  EXPECT_EQ(::waitpid(pid, &status, WNOHANG), 0) << "the lines came only at the exit";
  EXPECT_THAT(out, ::testing::Not(HasSubstr("step     1/"))) << "the first step was not that slow";
  ::kill(pid, SIGINT);
  EXPECT_TRUE(ReadUntil(fd, "", &out));
  ::close(fd);
  status = Wait(pid, std::chrono::seconds(60));
  ASSERT_TRUE(started) << out << ReadFile(dir + "/stderr.txt");
  ASSERT_TRUE(WIFEXITED(status));
  EXPECT_EQ(WEXITSTATUS(status), 0) << ReadFile(dir + "/stderr.txt");
  const size_t header = out.find("model custom: 4 layers");
  const size_t init = out.find("initializing ");
  const size_t start = out.find("training 1000 steps from step 0");
  const size_t step1 = out.find("step     1/1000");
  ASSERT_NE(header, std::string::npos) << out;
  ASSERT_NE(init, std::string::npos) << out;
  ASSERT_NE(step1, std::string::npos) << out;
  EXPECT_LT(header, init) << out;
  EXPECT_LT(init, start) << out;
  EXPECT_LT(start, step1) << out;
  // The init's line: begun and ended on one line, with how long it took (and, as the model
  // reports its progress, how many elements at which rate).
  EXPECT_TRUE(std::regex_search(
      out,
      std::regex(R"(\ninitializing [0-9.]+[kMBT]? parameters from seed \d+ \.\.\. done in )"
                 R"([0-9.]+ m?s( \([0-9.]+[kMBT]? elements, [0-9.]+[kMBT]? elements/s\))?\n)")))
      << out;
  EXPECT_EQ(out.find('\r'), std::string::npos) << "a carriage return in plain output";
  EXPECT_EQ(out.find('\033'), std::string::npos) << "a terminal escape in plain output";
  std::smatch m;
  ASSERT_TRUE(std::regex_search(
      out, m,
      std::regex(R"(\ntime to first step ([0-9.]+) s \(setup ([0-9.]+) s[^;]*; first step )"
                 R"(([0-9.]+) s\)\n)")))
      << out;
  EXPECT_NEAR(std::stod(m[1]), std::stod(m[2]) + std::stod(m[3]), 0.11);
  EXPECT_GT(std::stod(m[1]), 0);
  // The metrics file's first line carries the time to first step.
  const std::vector<std::string> lines = absl::StrSplit(ReadFile(metrics), '\n', absl::SkipEmpty());
  ASSERT_GE(lines.size(), 1u);
  const nlohmann::json first = nlohmann::json::parse(lines[0]);
  EXPECT_EQ(first["step"], 1);
  EXPECT_NEAR(first["time_to_first_step_s"].get<double>(),
              first["setup_s"].get<double>() + first["first_step_s"].get<double>(), 1e-6);
  EXPECT_GT(first["setup_s"].get<double>(), 0);
  for (const char* phase : {"startup", "checks", "plan", "data", "memory", "model", "init"}) {
    EXPECT_TRUE(first["setup_phases_s"].contains(phase)) << phase << ": " << lines[0];
  }
  double sum = 0;
  for (const auto& [name, seconds] : first["setup_phases_s"].items()) sum += seconds.get<double>();
  EXPECT_LE(sum, first["setup_s"].get<double>() + 1e-6);
}

// On a terminal the steps get a status line rewritten in place (carriage return, clear to the
// end of the line) with the ETA, and the header still comes before the init's line.
TEST(TrainBinary, ATerminalGetsAStatusLineWithTheEta) {
  const std::string dir = trainer_testing::FreshTempDir("train_binary_test", "tty_out");
  const std::string config = WriteTinyConfig(dir, 100000);
  const std::string metrics = dir + "/m.jsonl";
  int fd = -1;
  const pid_t pid = StartWithStdoutTo({"--config=" + config, "--metrics_out=" + metrics}, dir,
                                      /*terminal=*/true, &fd);
  ASSERT_GT(pid, 0);
  std::string out;
  const bool eta = ReadUntil(fd, "ETA ", &out);
  const bool third = ReadUntil(fd, "step     3/", &out);
  ::kill(pid, SIGINT);
  ReadUntil(fd, "", &out);
  ::close(fd);
  const int status = Wait(pid);
  ASSERT_TRUE(eta && third) << out << ReadFile(dir + "/stderr.txt");
  ASSERT_TRUE(WIFEXITED(status));
  EXPECT_EQ(WEXITSTATUS(status), 0) << ReadFile(dir + "/stderr.txt");
  EXPECT_THAT(out, HasSubstr("\r\033[Kstep 1/100000 | loss "));
  EXPECT_LT(out.find("model custom: 2 layers"), out.find("initializing ")) << out;
  // The step line that follows a status line starts on a cleared line.
  EXPECT_THAT(out, HasSubstr("\r\033[Kstep     2/100000 | loss "));
  EXPECT_THAT(out, HasSubstr("time to first step "));
  // Only the first line of the metrics file carries the time to first step.
  const std::vector<std::string> lines = absl::StrSplit(ReadFile(metrics), '\n', absl::SkipEmpty());
  ASSERT_GE(lines.size(), 3u);
  EXPECT_TRUE(nlohmann::json::parse(lines[0]).contains("time_to_first_step_s"));
  for (size_t i = 1; i < lines.size(); ++i) {
    EXPECT_FALSE(nlohmann::json::parse(lines[i]).contains("time_to_first_step_s")) << lines[i];
  }
}

}  // namespace
}  // namespace ps
