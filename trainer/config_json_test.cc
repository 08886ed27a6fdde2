// trainer/config_json.h: canonical forms, and random configs surviving the JSON round trip exactly.
#include "trainer/config_json.h"

#include <unistd.h>

#include <cmath>
#include <cstdint>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <functional>
#include <limits>
#include <map>
#include <memory>
#include <ostream>
#include <random>
#include <string>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "base/testing/status_matchers.h"
#include "base/units.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "nlohmann/json.hpp"
#include "trainer/config.h"
#include "trainer/config_parse.h"
#include "trainer/testing/config_testing.h"

namespace ps {
namespace {

using config_testing::DocFor;
using config_testing::Json;
using config_testing::KeySample;
using config_testing::KeySamples;
using config_testing::Minimal;
using config_testing::Parse;
using config_testing::ParseAndValidate;
using config_testing::RandomConfigs;
using config_testing::WithMinimal;
using ::testing::AllOf;
using ::testing::ElementsAre;
using ::testing::HasSubstr;
using ::testing::Not;
using ::testing::UnorderedElementsAre;

constexpr absl::StatusCode kInvalid = absl::StatusCode::kInvalidArgument;

// --- Canonical JSON -----------------------------------------------------------------------

TEST(TrainConfigToJsonTest, CanonicalForms) {
  TrainConfig c = DefaultTrainConfig();
  std::string json = TrainConfigToJson(c);
  EXPECT_THAT(json, HasSubstr("\"memory\": \"10MiB\""));
  EXPECT_THAT(json, HasSubstr("\"host_memory\": 0"));
  EXPECT_THAT(json, HasSubstr("\"size\": 81920"));
  EXPECT_THAT(json, HasSubstr("\"type\": \"WarmupDecayLR\""));
  EXPECT_THAT(json, Not(HasSubstr("warmup_max_lr")));              // -1: the optimizer's lr
  EXPECT_THAT(json, Not(HasSubstr("cos_min_ratio")));              // not a WarmupDecayLR param
  EXPECT_THAT(json, Not(HasSubstr("train_batch_size\"")));         // 0: derived
  EXPECT_EQ(json.find("\"train_micro_batch_size_per_gpu\""), 4u);  // fixed order, 2-space indent
  c.scheduler = SchedulerConfig{};  // kNone: no section, so no params either
  c.chunk.size_elems = 0;
  c.accelerator.memory_bytes = 1536;
  c.accelerator.host_memory_bytes = 3 * kKiB;
  json = TrainConfigToJson(c);
  EXPECT_THAT(json, Not(HasSubstr("scheduler")));
  EXPECT_THAT(json, HasSubstr("\"size\": \"auto\""));
  EXPECT_THAT(json, HasSubstr("\"memory\": 1536"));
  EXPECT_THAT(json, HasSubstr("\"host_memory\": \"3KiB\""));
  EXPECT_THAT(Parse(json), IsOkAndHolds(c));
}

TEST(TrainConfigToJsonTest, InapplicableSchedulerParamsAreNotWritten) {
  TrainConfig c;
  c.scheduler.type = SchedulerType::kWarmupLR;
  c.scheduler.cos_min_ratio = 0.5;  // not a WarmupLR param
  ASSERT_OK_AND_ASSIGN(const TrainConfig back, Parse(TrainConfigToJson(c)));
  EXPECT_EQ(back.scheduler.cos_min_ratio, SchedulerConfig{}.cos_min_ratio);
  c.scheduler.cos_min_ratio = SchedulerConfig{}.cos_min_ratio;
  EXPECT_EQ(back, c);
}

// --- Random round trips -------------------------------------------------------------------

TEST(RoundTripTest, RandomConfigsSurviveJsonExactly) {
  RandomConfigs random(20240607);
  for (int i = 0; i < 1000; ++i) {
    const TrainConfig c = random.Next();
    const std::string json = TrainConfigToJson(c);
    SCOPED_TRACE(absl::StrCat("config #", i, ":\n", json));
    ASSERT_OK_AND_ASSIGN(const TrainConfig back, Parse(json));
    ASSERT_EQ(back, c);
    // Canonical: writing the parsed config again gives the same text.
    ASSERT_EQ(TrainConfigToJson(back), json);
  }
}

}  // namespace
}  // namespace ps
