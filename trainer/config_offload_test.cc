// The disk tier's configuration in DeepSpeed's words: zero_optimization.offload_optimizer,
// zero_optimization.offload_param and aio — every key, the defaults, the keys accepted and
// ignored with a warning naming them, each error, the --nvme_path override, the nvme_path checks
// of ValidateTrainConfig and the canonical JSON (--print_config) round trip.
#include <sys/stat.h>
#include <unistd.h>

#include <cstdlib>
#include <ctime>
#include <filesystem>
#include <fstream>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "absl/synchronization/mutex.h"
#include "base/testing/status_matchers.h"
#include "glog/logging.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "nlohmann/json.hpp"
#include "trainer/config.h"
#include "trainer/config_json.h"
#include "trainer/config_overrides.h"
#include "trainer/config_parse.h"
#include "trainer/config_schema.h"
#include "trainer/config_validate.h"
#include "trainer/testing/config_testing.h"

namespace ps {
namespace {

using config_testing::Json;
using config_testing::Parse;
using config_testing::WithMinimal;
using ::testing::AllOf;
using ::testing::ElementsAre;
using ::testing::HasSubstr;
using ::testing::IsEmpty;
using ::testing::UnorderedElementsAre;

constexpr absl::StatusCode kInvalid = absl::StatusCode::kInvalidArgument;

// The warnings logged while it is alive.
class WarningCapture : public google::LogSink {
 public:
  WarningCapture() { google::AddLogSink(this); }
  ~WarningCapture() override { google::RemoveLogSink(this); }
  void send(google::LogSeverity severity, const char*, const char*, int, const std::tm*,
            const char* message, size_t message_len) override {
    if (severity != google::GLOG_WARNING) return;
    absl::MutexLock lock(&mu_);
    warnings_.emplace_back(message, message_len);
  }
  std::vector<std::string> warnings() {
    absl::MutexLock lock(&mu_);
    return warnings_;
  }

 private:
  absl::Mutex mu_;
  std::vector<std::string> warnings_;
};

std::string TempDir() {
  const char* tmp = std::getenv("TEST_TMPDIR");
  return tmp != nullptr ? tmp : "/tmp";
}

// A fresh directory under the test's temporary directory.
std::string MakeDir(const std::string& name) {
  const std::string dir = TempDir() + "/" + name;
  std::filesystem::create_directories(dir);
  return dir;
}

TEST(OffloadConfigTest, DefaultsAreDeepSpeeds) {
  const TrainConfig c;
  const OffloadOptimizerConfig& oo = c.zero_optimization.offload_optimizer;
  EXPECT_EQ(oo.device, OffloadDevice::kNone);
  EXPECT_EQ(oo.nvme_path, "");
  EXPECT_EQ(oo.buffer_count, 4);
  EXPECT_FALSE(oo.pin_memory);
  EXPECT_EQ(c.zero_optimization.offload_param.device, OffloadDevice::kNone);
  EXPECT_FALSE(c.zero_optimization.offload_param.pin_memory);
  EXPECT_EQ(c.aio.block_size_bytes, 1048576);
  EXPECT_EQ(c.aio.queue_depth, 8);
  EXPECT_EQ(c.aio.thread_count, 1);
  EXPECT_FALSE(c.aio.single_submit);
  EXPECT_TRUE(c.aio.overlap_events);
  // Empty sections keep them.
  EXPECT_THAT(Parse(R"({"zero_optimization": {"offload_optimizer": {}, "offload_param": {}},
                        "aio": {}})"),
              IsOkAndHolds(TrainConfig{}));
  // DeepSpeed's null for "no offload section".
  EXPECT_THAT(Parse(R"({"zero_optimization": {"offload_optimizer": null, "offload_param": null}})"),
              IsOkAndHolds(TrainConfig{}));
  EXPECT_OK(ValidateTrainConfig(DefaultTrainConfig()));
}

TEST(OffloadConfigTest, EveryKeyLands) {
  const std::string dir = MakeDir("every_key");
  ASSERT_OK_AND_ASSIGN(const TrainConfig c, Parse(WithMinimal(Json::parse(absl::StrCat(R"({
      "zero_optimization": {
        "offload_optimizer": {"device": "nvme", "nvme_path": ")",
                                                                                       dir, R"(",
                              "buffer_count": 6, "pin_memory": true},
        "offload_param": {"device": "cpu", "pin_memory": true}},
      "aio": {"block_size": 262144, "queue_depth": 32, "thread_count": 2, "single_submit": true,
              "overlap_events": false}})")))));
  const OffloadOptimizerConfig& oo = c.zero_optimization.offload_optimizer;
  EXPECT_EQ(oo.device, OffloadDevice::kNvme);
  EXPECT_EQ(oo.nvme_path, dir);
  EXPECT_EQ(oo.buffer_count, 6);
  EXPECT_TRUE(oo.pin_memory);
  EXPECT_EQ(c.zero_optimization.offload_param.device, OffloadDevice::kCpu);
  EXPECT_TRUE(c.zero_optimization.offload_param.pin_memory);
  EXPECT_EQ(c.aio.block_size_bytes, 262144);
  EXPECT_EQ(c.aio.queue_depth, 32);
  EXPECT_EQ(c.aio.thread_count, 2);
  EXPECT_TRUE(c.aio.single_submit);
  EXPECT_FALSE(c.aio.overlap_events);
  EXPECT_OK(ValidateTrainConfig(c));
}

TEST(OffloadConfigTest, DevicesAreCaseInsensitiveAndBlockSizeTakesUnits) {
  for (const auto& [name, device] :
       {std::pair<std::string, OffloadDevice>{"none", OffloadDevice::kNone},
        {"CPU", OffloadDevice::kCpu},
        {"Nvme", OffloadDevice::kNvme}}) {
    SCOPED_TRACE(name);
    ASSERT_OK_AND_ASSIGN(
        const TrainConfig c,
        Parse(Json{{"zero_optimization", {{"offload_optimizer", {{"device", name}}}}}}.dump()));
    EXPECT_EQ(c.zero_optimization.offload_optimizer.device, device);
  }
  ASSERT_OK_AND_ASSIGN(const TrainConfig c, Parse(R"({"aio": {"block_size": "256KiB"}})"));
  EXPECT_EQ(c.aio.block_size_bytes, 256 * 1024);
  // DeepSpeed configs write integers as floats (1e6) at times.
  ASSERT_OK_AND_ASSIGN(
      const TrainConfig f,
      Parse(R"({"zero_optimization": {"offload_optimizer": {"buffer_count": 5.0}}})"));
  EXPECT_EQ(f.zero_optimization.offload_optimizer.buffer_count, 5);
}

// A common real-world DeepSpeed config: ZeRO-3 with the optimizer and the parameters offloaded to
// the CPU — this system's default placement.
TEST(OffloadConfigTest, DeepSpeedCpuOffloadConfigIsAccepted) {
  std::vector<std::string> ignored;
  WarningCapture capture;
  std::ifstream in("trainer/testdata/configs/deepspeed_zero3_cpu_offload.json");
  ASSERT_TRUE(in.good());
  const std::string text((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  ASSERT_OK_AND_ASSIGN(const TrainConfig c,
                       ParseTrainConfig(text, "deepspeed_zero3_cpu_offload.json", &ignored));
  EXPECT_EQ(c.zero_optimization.offload_optimizer.device, OffloadDevice::kCpu);
  EXPECT_TRUE(c.zero_optimization.offload_optimizer.pin_memory);
  EXPECT_EQ(c.zero_optimization.offload_param.device, OffloadDevice::kCpu);
  EXPECT_TRUE(c.zero_optimization.offload_param.pin_memory);
  EXPECT_TRUE(c.bf16);
  EXPECT_OK(ValidateTrainConfig(c));
  EXPECT_THAT(ignored, UnorderedElementsAre("zero_optimization", "wall_clock_breakdown"));
  // Each ignored ZeRO key is named with its reason.
  std::string all;
  for (const std::string& w : capture.warnings()) absl::StrAppend(&all, w, "\n");
  EXPECT_THAT(all, AllOf(HasSubstr("ignoring key `zero_optimization.stage`: chunks replace ZeRO"),
                         HasSubstr("ignoring key `zero_optimization.overlap_comm`: collectives "
                                   "move whole chunks"),
                         HasSubstr("ignoring key `zero_optimization.stage3_max_live_parameters`"),
                         HasSubstr("ignoring key `zero_optimization.sub_group_size`: the "
                                   "optimizer steps one chunk at a time")));
}

TEST(OffloadConfigTest, NotApplicableKeysAreWarnedAboutByName) {
  std::vector<std::string> ignored;
  WarningCapture capture;
  ASSERT_OK_AND_ASSIGN(const TrainConfig c, ParseTrainConfig(R"({"zero_optimization": {
      "offload_optimizer": {"device": "cpu", "nvme_path": "/x", "buffer_count": 8,
                            "fast_init": false},
      "offload_param": {"device": "cpu", "nvme_path": "/x", "buffer_count": 5,
                        "buffer_size": 1e8, "max_in_cpu": 1e9}}})",
                                                             "t.json", &ignored));
  EXPECT_THAT(ignored, ElementsAre("zero_optimization"));
  // Kept (the config round-trips) though unused.
  EXPECT_EQ(c.zero_optimization.offload_optimizer.nvme_path, "/x");
  EXPECT_EQ(c.zero_optimization.offload_optimizer.buffer_count, 8);
  EXPECT_EQ(c.zero_optimization.offload_param.nvme_path, "/x");
  EXPECT_EQ(c.zero_optimization.offload_param.max_in_cpu, 1000000000);
  std::string all;
  for (const std::string& w : capture.warnings()) absl::StrAppend(&all, w, "\n");
  EXPECT_THAT(
      all,
      AllOf(HasSubstr("ignoring key `zero_optimization.offload_optimizer.fast_init`"),
            HasSubstr("ignoring key `zero_optimization.offload_param.buffer_size`: the disk "
                      "tier reads and writes whole param chunks"),
            HasSubstr("`zero_optimization.offload_param.max_in_cpu` applies only to device "
                      "\"nvme\" (a frozen base on disk)"),
            HasSubstr("`zero_optimization.offload_param.nvme_path` applies only to device "
                      "\"nvme\""),
            HasSubstr("`zero_optimization.offload_optimizer.nvme_path` applies only to device "
                      "\"nvme\""),
            HasSubstr("`zero_optimization.offload_optimizer.buffer_count` applies only to device "
                      "\"nvme\"")));
}

TEST(OffloadConfigTest, TheCanonicalJsonWarnsAboutNothing) {
  // Defaults are written for every key; reading them back must not warn (nvme_path "" and
  // buffer_count 4 with device "none").
  const std::string json = TrainConfigToJson(DefaultTrainConfig());
  std::vector<std::string> ignored;
  WarningCapture capture;
  ASSERT_OK_AND_ASSIGN(const TrainConfig back, ParseTrainConfig(json, "t.json", &ignored));
  EXPECT_EQ(back, DefaultTrainConfig());
  EXPECT_THAT(ignored, IsEmpty());
  EXPECT_THAT(capture.warnings(), IsEmpty());
}

TEST(OffloadConfigTest, HostBudgetIsAByteQuantity) {
  ASSERT_OK_AND_ASSIGN(const TrainConfig a, Parse(R"({"zero_optimization": {"offload_optimizer":
      {"device": "nvme", "nvme_path": "/x", "host_budget": "1536MiB"}}})"));
  EXPECT_EQ(a.zero_optimization.offload_optimizer.host_budget_bytes, int64_t{1536} << 20);
  ASSERT_OK_AND_ASSIGN(const TrainConfig b, Parse(R"({"zero_optimization": {"offload_optimizer":
      {"device": "nvme", "nvme_path": "/x", "host_budget": 123456789}}})"));
  EXPECT_EQ(b.zero_optimization.offload_optimizer.host_budget_bytes, 123456789);
  EXPECT_EQ(DefaultTrainConfig().zero_optimization.offload_optimizer.host_budget_bytes, 0);
  const absl::StatusOr<TrainConfig> bad = Parse(R"({"zero_optimization": {"offload_optimizer":
      {"device": "nvme", "nvme_path": "/x", "host_budget": "lots"}}})");
  EXPECT_THAT(bad, StatusIs(absl::StatusCode::kInvalidArgument,
                            HasSubstr("zero_optimization.offload_optimizer.host_budget")));
}

TEST(OffloadConfigTest, PrintConfigShowsTheSectionsAndRoundTrips) {
  TrainConfig c = DefaultTrainConfig();
  c.zero_optimization.offload_optimizer = {.device = OffloadDevice::kNvme,
                                           .nvme_path = "/mnt/ssd/swap",
                                           .buffer_count = 3,
                                           .host_budget_bytes = 6 * (int64_t{1} << 30),
                                           .pin_memory = true};
  c.zero_optimization.offload_param.device = OffloadDevice::kCpu;
  c.zero_optimization.offload_param.pin_memory = true;
  c.aio = {.block_size_bytes = 512 * 1024,
           .queue_depth = 16,
           .thread_count = 4,
           .single_submit = true,
           .overlap_events = false};
  const std::string text = TrainConfigToJson(c);
  const Json j = Json::parse(text);
  EXPECT_EQ(j["zero_optimization"]["offload_optimizer"],
            Json::parse(R"({"device": "nvme", "nvme_path": "/mnt/ssd/swap", "buffer_count": 3,
                            "host_budget": "6GiB", "pin_memory": true})"));
  EXPECT_EQ(j["zero_optimization"]["offload_param"],
            Json::parse(R"({"device": "cpu", "buffer_count": 5, "max_in_cpu": "auto",
                            "pin_memory": true})"));
  EXPECT_EQ(j["aio"], Json::parse(R"({"block_size": "512KiB", "queue_depth": 16,
                                      "thread_count": 4, "single_submit": true,
                                      "overlap_events": false})"));
  EXPECT_THAT(Parse(text), IsOkAndHolds(c));
}

TEST(OffloadConfigTest, ValueErrorsNameTheKey) {
  const struct {
    const char* patch;
    const char* key;
    const char* rule;
  } kCases[] = {
      {R"({"zero_optimization": {"offload_optimizer": {"device": "disk"}}})",
       "`zero_optimization.offload_optimizer.device` = string \"disk\"",
       "use \"none\", \"cpu\" or \"nvme\""},
      {R"({"zero_optimization": {"offload_optimizer": {"device": 1}}})",
       "`zero_optimization.offload_optimizer.device` must be a string", ""},
      {R"({"zero_optimization": {"offload_param": {"device": "gpu"}}})",
       "`zero_optimization.offload_param.device` = string \"gpu\"", "not an offload device"},
      {R"({"zero_optimization": {"offload_param": {"max_in_cpu": "lots"}}})",
       "`zero_optimization.offload_param.max_in_cpu` = string \"lots\"",
       "an integer number of parameter elements"},
      {R"({"zero_optimization": {"offload_param": {"max_in_cpu": -1}}})",
       "`zero_optimization.offload_param.max_in_cpu` = integer -1", "out of range"},
      {R"({"zero_optimization": {"offload_param": {"max_in_cpu": 1.5}}})",
       "`zero_optimization.offload_param.max_in_cpu` must be an integer", ""},
      {R"({"zero_optimization": {"offload_param": {"buffer_count": -1}}})",
       "`zero_optimization.offload_param.buffer_count` = -1", "must be in [0, 65536]"},
      {R"({"zero_optimization": {"offload_param": {"nvme_dir": "/x"}}})",
       "unknown key `zero_optimization.offload_param.nvme_dir`; did you mean `nvme_path`?", ""},
      {R"({"zero_optimization": {"offload_optimizer": {"buffer_count": 0}}})",
       "`zero_optimization.offload_optimizer.buffer_count` = 0", "must be in [1, 65536]"},
      {R"({"zero_optimization": {"offload_optimizer": {"buffer_count": -2}}})",
       "`zero_optimization.offload_optimizer.buffer_count` = -2", "reads ahead"},
      {R"({"zero_optimization": {"offload_optimizer": {"pin_memory": "yes"}}})",
       "`zero_optimization.offload_optimizer.pin_memory` must be a boolean", ""},
      {R"({"zero_optimization": {"offload_optimizer": {"nvme_dir": "/x"}}})",
       "unknown key `zero_optimization.offload_optimizer.nvme_dir`; did you mean `nvme_path`?", ""},
      {R"({"zero_optimization": {"offload_optimiser": {"device": "nvme"}}})",
       "unknown key `zero_optimization.offload_optimiser`; did you mean `offload_optimizer`?", ""},
      {R"({"zero_optimization": {"offload_parm": {}}})", "did you mean `offload_param`?", ""},
      {R"({"zero_optimization": {"offload_optimizer": 1}})",
       "`zero_optimization.offload_optimizer` must be an object", ""},
      {R"({"zero_optimization": "on"})", "`zero_optimization` must be an object", ""},
      {R"({"aio": {"block_size": 1000}})", "`aio.block_size` = 1000",
       "must be a multiple of 4096 bytes"},
      {R"({"aio": {"block_size": 0}})", "`aio.block_size` = 0", "multiple of 4096"},
      {R"({"aio": {"block_size": "2GiB"}})", "`aio.block_size` = 2147483648",
       "in [4096, 1073741824]"},
      {R"({"aio": {"queue_depth": 0}})", "`aio.queue_depth` = 0", "must be in [1, 32768]"},
      {R"({"aio": {"thread_count": 0}})", "`aio.thread_count` = 0", "must be in [1, 1024]"},
      {R"({"aio": {"single_submit": 1}})", "`aio.single_submit` must be a boolean", ""},
      {R"({"aio": {"intra_op_parallelism": 2}})",
       "unknown key `aio.intra_op_parallelism`; did you mean `thread_count`?", ""},
  };
  for (const auto& k : kCases) {
    SCOPED_TRACE(k.patch);
    EXPECT_THAT(Parse(k.patch), StatusIs(kInvalid, AllOf(HasSubstr("test.json: "), HasSubstr(k.key),
                                                         HasSubstr(k.rule))));
  }
}

TEST(OffloadConfigTest, NvmeNeedsAnExistingWritableDirectory) {
  TrainConfig c = DefaultTrainConfig();
  c.zero_optimization.offload_optimizer.device = OffloadDevice::kNvme;
  EXPECT_THAT(ValidateTrainConfig(c),
              StatusIs(kInvalid, AllOf(HasSubstr("zero_optimization.offload_optimizer.nvme_path"),
                                       HasSubstr("--nvme_path"))));
  const std::string missing = TempDir() + "/no/such/dir";
  c.zero_optimization.offload_optimizer.nvme_path = missing;
  EXPECT_THAT(ValidateTrainConfig(c),
              StatusIs(absl::StatusCode::kNotFound,
                       AllOf(HasSubstr("zero_optimization.offload_optimizer.nvme_path"),
                             HasSubstr(missing))));
  const std::string file = TempDir() + "/a_file";
  std::ofstream(file) << "x";
  c.zero_optimization.offload_optimizer.nvme_path = file;
  EXPECT_THAT(ValidateTrainConfig(c),
              StatusIs(kInvalid, AllOf(HasSubstr("zero_optimization.offload_optimizer.nvme_path"),
                                       HasSubstr(file), HasSubstr("is not a directory"))));
  const std::string dir = MakeDir("swap");
  c.zero_optimization.offload_optimizer.nvme_path = dir;
  EXPECT_OK(ValidateTrainConfig(c));
  if (::geteuid() != 0) {  // root writes anywhere
    const std::string read_only = MakeDir("read_only");
    ASSERT_EQ(::chmod(read_only.c_str(), 0555), 0);
    c.zero_optimization.offload_optimizer.nvme_path = read_only;
    EXPECT_THAT(ValidateTrainConfig(c),
                StatusIs(absl::StatusCode::kPermissionDenied,
                         AllOf(HasSubstr("no write access"), HasSubstr(read_only))));
  }
  // Only the disk tier needs the directory.
  c.zero_optimization.offload_optimizer = {.device = OffloadDevice::kCpu, .nvme_path = missing};
  EXPECT_OK(ValidateTrainConfig(c));
}

TEST(OffloadConfigTest, NvmePathFlagTurnsTheDiskTierOn) {
  TrainConfig c = DefaultTrainConfig();
  const std::string dir = MakeDir("flag");
  ConfigOverrides o;
  o.nvme_path = dir;
  ASSERT_OK(ApplyOverrides(o, &c));
  EXPECT_EQ(c.zero_optimization.offload_optimizer.device, OffloadDevice::kNvme);
  EXPECT_EQ(c.zero_optimization.offload_optimizer.nvme_path, dir);
  EXPECT_EQ(c.zero_optimization.offload_optimizer.buffer_count, 4);  // the file's, unchanged
  EXPECT_OK(ValidateTrainConfig(c));
  // Over a file that asked for "cpu" with its own window.
  ASSERT_OK_AND_ASSIGN(
      TrainConfig f,
      Parse(WithMinimal(Json::parse(
          R"({"zero_optimization": {"offload_optimizer": {"device": "cpu", "buffer_count": 2}}})"))));
  ASSERT_OK(ApplyOverrides(o, &f));
  EXPECT_EQ(f.zero_optimization.offload_optimizer.device, OffloadDevice::kNvme);
  EXPECT_EQ(f.zero_optimization.offload_optimizer.buffer_count, 2);
  // A file's "nvme" without a path, completed by the flag.
  ASSERT_OK_AND_ASSIGN(
      TrainConfig g, Parse(WithMinimal(Json::parse(
                         R"({"zero_optimization": {"offload_optimizer": {"device": "nvme"}}})"))));
  EXPECT_THAT(ValidateTrainConfig(g), StatusIs(kInvalid, HasSubstr("nvme_path")));
  ASSERT_OK(ApplyOverrides(o, &g));
  EXPECT_OK(ValidateTrainConfig(g));
  // An empty path (the binary refuses an empty flag before: train_binary_test) is the disk tier
  // without a directory, which validation refuses naming the key and the flag.
  TrainConfig h = DefaultTrainConfig();
  o.nvme_path = "";
  ASSERT_OK(ApplyOverrides(o, &h));
  EXPECT_THAT(ValidateTrainConfig(h),
              StatusIs(kInvalid, AllOf(HasSubstr("zero_optimization.offload_optimizer.nvme_path"),
                                       HasSubstr("--nvme_path"))));
}

// offload_param "nvme": a frozen base (a lora section) on disk, in DeepSpeed's words.
TrainConfig FrozenOnDisk(const std::string& dir) {
  TrainConfig c = DefaultTrainConfig();
  c.lora = LoraSettings{};
  c.lora->r = 4;
  c.lora->target_modules = {"c_attn"};
  c.zero_optimization.offload_param.device = OffloadDevice::kNvme;
  c.zero_optimization.offload_param.nvme_path = dir;
  return c;
}

TEST(OffloadConfigTest, OffloadParamNvmeReadsDeepSpeedsKeys) {
  std::vector<std::string> ignored;
  WarningCapture capture;
  ASSERT_OK_AND_ASSIGN(const TrainConfig c, ParseTrainConfig(R"({"zero_optimization": {
      "offload_param": {"device": "nvme", "nvme_path": "/local_nvme", "pin_memory": true,
                        "buffer_count": 7, "buffer_size": 1e8, "max_in_cpu": 1e9}}})",
                                                             "t.json", &ignored));
  const OffloadParamConfig& op = c.zero_optimization.offload_param;
  EXPECT_EQ(op.device, OffloadDevice::kNvme);
  EXPECT_EQ(op.nvme_path, "/local_nvme");
  EXPECT_EQ(op.buffer_count, 7);
  EXPECT_EQ(op.max_in_cpu, 1000000000);
  EXPECT_TRUE(op.pin_memory);
  // buffer_size alone is ignored, with its reason.
  EXPECT_THAT(ignored, ElementsAre("zero_optimization"));
  ASSERT_EQ(capture.warnings().size(), 1u);
  EXPECT_THAT(capture.warnings()[0],
              HasSubstr("ignoring key `zero_optimization.offload_param.buffer_size`: the disk "
                        "tier reads and writes whole param chunks"));
  // The defaults: DeepSpeed's buffer_count, max_in_cpu auto.
  EXPECT_EQ(OffloadParamConfig{}.buffer_count, 5);
  EXPECT_EQ(OffloadParamConfig{}.max_in_cpu, 0);
  ASSERT_OK_AND_ASSIGN(const TrainConfig a, Parse(R"({"zero_optimization": {"offload_param":
      {"device": "nvme", "nvme_path": "/x", "max_in_cpu": "AUTO"}}})"));
  EXPECT_EQ(a.zero_optimization.offload_param.max_in_cpu, 0);
}

TEST(OffloadConfigTest, OffloadParamNvmeRoundTripsThroughPrintConfig) {
  TrainConfig c = FrozenOnDisk("/mnt/ssd/swap");
  c.zero_optimization.offload_param.buffer_count = 0;
  c.zero_optimization.offload_param.max_in_cpu = 123456;
  const std::string text = TrainConfigToJson(c);
  EXPECT_EQ(Json::parse(text)["zero_optimization"]["offload_param"],
            Json::parse(R"({"device": "nvme", "nvme_path": "/mnt/ssd/swap", "buffer_count": 0,
                            "max_in_cpu": 123456, "pin_memory": false})"));
  EXPECT_THAT(Parse(text), IsOkAndHolds(c));
  c.zero_optimization.offload_param.max_in_cpu = 0;  // auto
  EXPECT_THAT(Parse(TrainConfigToJson(c)), IsOkAndHolds(c));
}

TEST(OffloadConfigTest, OffloadParamNvmeNeedsAFrozenBase) {
  const std::string dir = MakeDir("frozen");
  TrainConfig c = FrozenOnDisk(dir);
  EXPECT_OK(ValidateTrainConfig(c));
  c.lora.reset();
  EXPECT_THAT(ValidateTrainConfig(c),
              StatusIs(kInvalid, AllOf(HasSubstr("zero_optimization.offload_param.device"),
                                       HasSubstr("only a frozen base"), HasSubstr("lora"))));
  // Its directory is checked as offload_optimizer's is, naming its own key.
  TrainConfig d = FrozenOnDisk("");
  EXPECT_THAT(ValidateTrainConfig(d),
              StatusIs(kInvalid, HasSubstr("zero_optimization.offload_param.nvme_path")));
  d.zero_optimization.offload_param.nvme_path = TempDir() + "/no/such/frozen";
  EXPECT_THAT(ValidateTrainConfig(d),
              StatusIs(absl::StatusCode::kNotFound,
                       HasSubstr("zero_optimization.offload_param.nvme_path")));
}

TEST(OffloadConfigTest, OneSwapServesBothTiers) {
  const std::string dir = MakeDir("both");
  const std::string other = MakeDir("other");
  TrainConfig c = FrozenOnDisk(dir);
  c.zero_optimization.offload_optimizer = {.device = OffloadDevice::kNvme, .nvme_path = dir};
  EXPECT_OK(ValidateTrainConfig(c));
  // The same directory spelled otherwise.
  c.zero_optimization.offload_optimizer.nvme_path = dir + "/./";
  EXPECT_OK(ValidateTrainConfig(c));
  c.zero_optimization.offload_optimizer.nvme_path = other;
  EXPECT_THAT(ValidateTrainConfig(c),
              StatusIs(kInvalid, AllOf(HasSubstr("zero_optimization.offload_param.nvme_path"),
                                       HasSubstr("zero_optimization.offload_optimizer.nvme_path"),
                                       HasSubstr("one swap serves both"))));
  // --nvme_path sets both.
  ConfigOverrides o;
  o.nvme_path = other;
  ASSERT_OK(ApplyOverrides(o, &c));
  EXPECT_EQ(c.zero_optimization.offload_param.nvme_path, other);
  EXPECT_EQ(c.zero_optimization.offload_optimizer.nvme_path, other);
  EXPECT_OK(ValidateTrainConfig(c));
  // Without offload_param "nvme" the flag leaves its (unused) path alone.
  TrainConfig f = FrozenOnDisk(dir);
  f.zero_optimization.offload_param.device = OffloadDevice::kCpu;
  ASSERT_OK(ApplyOverrides(o, &f));
  EXPECT_EQ(f.zero_optimization.offload_param.nvme_path, dir);
}

TEST(OffloadConfigTest, KeyPathsListTheNewKeys) {
  const std::vector<std::string> paths = TrainConfigKeyPaths();
  for (const char* path :
       {"zero_optimization.offload_optimizer.device",
        "zero_optimization.offload_optimizer.nvme_path",
        "zero_optimization.offload_optimizer.buffer_count",
        "zero_optimization.offload_optimizer.pin_memory", "zero_optimization.offload_param.device",
        "zero_optimization.offload_param.pin_memory", "zero_optimization.offload_param.nvme_path",
        "zero_optimization.offload_param.buffer_count",
        "zero_optimization.offload_param.max_in_cpu", "aio.block_size", "aio.queue_depth",
        "aio.thread_count", "aio.single_submit", "aio.overlap_events"}) {
    EXPECT_THAT(paths, testing::Contains(path));
  }
  EXPECT_THAT(paths,
              testing::Not(testing::Contains("zero_optimization.offload_param.buffer_size")));
  EXPECT_THAT(IgnoredDeepSpeedKeys(), testing::Not(testing::Contains("zero_optimization")));
  EXPECT_EQ(ZeroOptimizationIgnoredReason("reduce_bucket_size"),
            "collectives move whole chunks (chunk.size sets their granularity)");
  EXPECT_THAT(std::string(ZeroOptimizationIgnoredReason("stage3_prefetch_bucket_size")),
              HasSubstr("chunks replace ZeRO stages"));
}

}  // namespace
}  // namespace ps
