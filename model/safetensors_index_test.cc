#include "model/safetensors_index.h"

#include <sys/stat.h>
#include <unistd.h>

#include <cstdint>
#include <cstdlib>
#include <fstream>
#include <map>
#include <numeric>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "base/splitmix64.h"
#include "base/testing/status_matchers.h"
#include "gtest/gtest.h"
#include "memory/dtype.h"
#include "model/safetensors.h"
#include "nlohmann/json.hpp"

namespace ps {
namespace {

using ::testing::AllOf;
using ::testing::HasSubstr;

// A fresh empty directory under the test's temporary directory.
std::string FreshDir(const std::string& name) {
  const char* tmp = std::getenv("TEST_TMPDIR");
  const std::string dir = absl::StrCat(tmp != nullptr ? tmp : "/tmp", "/", name);
  std::string cmd = absl::StrCat("rm -rf '", dir, "' && mkdir -p '", dir, "'");
  EXPECT_EQ(std::system(cmd.c_str()), 0);
  return dir;
}

std::string ReadFile(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  return std::string(std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>());
}

void WriteFile(const std::string& path, const std::string& bytes) {
  std::ofstream out(path, std::ios::binary | std::ios::trunc);
  out << bytes;
}

bool Exists(const std::string& path) { return ::access(path.c_str(), F_OK) == 0; }

// Deterministic bytes of element e of tensor t.
uint8_t ByteOf(size_t t, int64_t byte_index) {
  return static_cast<uint8_t>(Mix64(t * 1000003 + static_cast<uint64_t>(byte_index)));
}

SafetensorsPieceFillFn PatternFill(const std::vector<SafetensorsTensorSpec>& specs) {
  return [&specs](size_t t, int64_t first, absl::Span<uint8_t> dst) {
    const int64_t offset = first * SizeOf(specs[t].dtype);
    for (size_t i = 0; i < dst.size(); ++i) dst[i] = ByteOf(t, offset + static_cast<int64_t>(i));
    return absl::OkStatus();
  };
}

// Tensors of BF16 elements with the given byte sizes (even).
std::vector<SafetensorsTensorSpec> SizedSpecs(const std::vector<int64_t>& bytes) {
  std::vector<SafetensorsTensorSpec> specs;
  for (size_t i = 0; i < bytes.size(); ++i) {
    specs.push_back({absl::StrCat("t", i), DType::kBF16, {bytes[i] / 2}});
  }
  return specs;
}

TEST(SafetensorsShardPlanTest, FollowsTransformersRule) {
  struct Case {
    std::vector<int64_t> bytes;
    int64_t max;
    std::vector<std::vector<size_t>> shards;
  };
  const Case cases[] = {
      // huggingface_hub's documented example: [6, 6, 2, 6, 2, 2] with a limit of 10.
      {{6, 6, 2, 6, 2, 2}, 10, {{0}, {1, 2}, {3, 4, 5}}},
      {{10}, 10, {{0}}},                  // exactly at the limit: fits
      {{4, 6}, 10, {{0, 1}}},             // sum exactly at the limit
      {{4, 8}, 10, {{0}, {1}}},           // one byte... two over
      {{12}, 10, {{0}}},                  // alone and too large: one shard of its own
      {{2, 12, 2}, 10, {{0}, {1}, {2}}},  // an oversize tensor splits its neighbours
      {{12, 14}, 10, {{0}, {1}}},
      {{0, 0, 10, 0}, 10, {{0, 1, 2, 3}}},  // zero-size tensors never tip a shard
      {{}, 10, {{}}},                       // nothing: one empty file
  };
  for (const Case& c : cases) {
    ASSERT_OK_AND_ASSIGN(const SafetensorsShardPlan plan,
                         PlanSafetensorsShards(SizedSpecs(c.bytes), c.max));
    EXPECT_EQ(plan.tensors, c.shards) << ::testing::PrintToString(c.bytes);
    EXPECT_EQ(plan.total_size_bytes, std::accumulate(c.bytes.begin(), c.bytes.end(), int64_t{0}));
    if (c.shards.size() == 1) {
      EXPECT_EQ(plan.file_names, std::vector<std::string>{"model.safetensors"});
    } else {
      EXPECT_EQ(plan.file_names.front(),
                absl::StrCat("model-00001-of-0000", c.shards.size(), ".safetensors"));
    }
  }
}

TEST(SafetensorsShardPlanTest, RandomPlansAreGreedyOrderedAndBounded) {
  SplitMix64 rng(7);
  for (int trial = 0; trial < 500; ++trial) {
    std::vector<int64_t> bytes(rng.Below(20));
    for (int64_t& b : bytes) b = 2 * static_cast<int64_t>(rng.Below(rng.Below(2) ? 8 : 40));
    const int64_t max = 1 + static_cast<int64_t>(rng.Below(40));
    ASSERT_OK_AND_ASSIGN(const SafetensorsShardPlan plan,
                         PlanSafetensorsShards(SizedSpecs(bytes), max));
    std::vector<size_t> order;
    std::vector<int64_t> sums;
    for (const std::vector<size_t>& shard : plan.tensors) {
      int64_t sum = 0;
      for (const size_t i : shard) {
        order.push_back(i);
        sum += bytes[i];
      }
      sums.push_back(sum);
      // Either within the limit, or one tensor that alone exceeds it.
      EXPECT_TRUE(sum <= max || (shard.size() == 1 && bytes[shard[0]] > max));
    }
    std::vector<size_t> want(bytes.size());
    std::iota(want.begin(), want.end(), size_t{0});
    EXPECT_EQ(order, want);
    // Greedy: a shard ends only because the next tensor did not fit (or was oversize).
    for (size_t s = 0; s + 1 < plan.tensors.size(); ++s) {
      const size_t next = plan.tensors[s + 1][0];
      const bool oversize =
          (plan.tensors[s].size() == 1 && bytes[plan.tensors[s][0]] > max) || bytes[next] > max;
      EXPECT_TRUE(oversize || sums[s] + bytes[next] > max);
    }
  }
}

TEST(SafetensorsShardPlanTest, RejectsBadInput) {
  EXPECT_THAT(PlanSafetensorsShards(SizedSpecs({2}), 0),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("max_shard_bytes")));
  std::vector<SafetensorsTensorSpec> dup = SizedSpecs({2, 2});
  dup[1].name = "t0";
  EXPECT_THAT(PlanSafetensorsShards(dup, 10),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("'t0'")));
  EXPECT_THAT(PlanSafetensorsShards({{"", DType::kF32, {1}}}, 10),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("empty name")));
  EXPECT_THAT(PlanSafetensorsShards({{"x", DType::kF32, {1, -1}}}, 10),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("'x'")));
  EXPECT_THAT(PlanSafetensorsShards({{"x", DType::kF32, {int64_t{1} << 40, int64_t{1} << 30}}}, 10),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("'x'")));
  EXPECT_THAT(PlanSafetensorsShards(SizedSpecs(std::vector<int64_t>(100000, 2)), 1),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("99999")));
}

// Random tensors (every dtype, scalars, zero-size, awkward shapes) written sharded and read back.
TEST(ShardedSafetensorsTest, WriteThenReadIsBitExact) {
  SplitMix64 rng(11);
  for (int trial = 0; trial < 20; ++trial) {
    std::vector<SafetensorsTensorSpec> specs;
    const int n = 1 + static_cast<int>(rng.Below(12));
    for (int i = 0; i < n; ++i) {
      SafetensorsTensorSpec s;
      s.name = absl::StrCat("layer.", rng.Below(1000), ".w", i);
      s.dtype = std::vector<DType>{DType::kF32, DType::kF16, DType::kBF16}[rng.Below(3)];
      const int rank = static_cast<int>(rng.Below(4));
      for (int r = 0; r < rank; ++r) s.shape.push_back(static_cast<int64_t>(rng.Below(13)));
      specs.push_back(s);
    }
    const std::string dir = FreshDir(absl::StrCat("roundtrip", trial));
    ShardedWriteOptions options;
    options.max_shard_bytes = 1 + static_cast<int64_t>(rng.Below(600));
    options.max_piece_bytes = 1 + static_cast<int64_t>(rng.Below(50));
    ASSERT_OK_AND_ASSIGN(const SafetensorsShardPlan plan,
                         WriteShardedSafetensors(dir, specs, PatternFill(specs), options));
    EXPECT_EQ(Exists(absl::StrCat(dir, "/model.safetensors.index.json")), plan.sharded());
    EXPECT_EQ(Exists(absl::StrCat(dir, "/model.safetensors")), !plan.sharded());
    ASSERT_OK_AND_ASSIGN(const ShardedSafetensors w, ShardedSafetensors::OpenDirectory(dir));
    EXPECT_EQ(w.sharded(), plan.sharded());
    EXPECT_EQ(w.shards().size(), plan.file_names.size());
    EXPECT_EQ(w.total_size_bytes(), plan.total_size_bytes);
    ASSERT_EQ(w.names().size(), specs.size());
    for (size_t t = 0; t < specs.size(); ++t) {
      const ShardedTensorRef ref = w.Find(specs[t].name);
      ASSERT_NE(ref.info, nullptr) << specs[t].name;
      EXPECT_EQ(ref.info->shape, specs[t].shape);
      EXPECT_EQ(ref.info->dtype, specs[t].dtype);
      EXPECT_EQ(ref.file->metadata().at("format"), "pt");
      const absl::Span<const uint8_t> bytes = ref.file->Bytes(*ref.info);
      for (size_t i = 0; i < bytes.size(); ++i) {
        ASSERT_EQ(bytes[i], ByteOf(t, static_cast<int64_t>(i))) << specs[t].name << " byte " << i;
      }
    }
    if (plan.sharded()) {
      const nlohmann::json index =
          nlohmann::json::parse(ReadFile(absl::StrCat(dir, "/model.safetensors.index.json")));
      EXPECT_EQ(index["metadata"]["total_size"], plan.total_size_bytes);
      EXPECT_EQ(index["metadata"]["total_parameters"], plan.total_elems);
      for (size_t s = 0; s < plan.tensors.size(); ++s) {
        for (const size_t t : plan.tensors[s]) {
          EXPECT_EQ(index["weight_map"][specs[t].name], plan.file_names[s]);
        }
      }
    }
  }
}

// A directory with two shards: a, b in shard 1; c in shard 2. Returns the index path.
std::string TwoShardDir(const std::string& name) {
  const std::string dir = FreshDir(name);
  const std::vector<SafetensorsTensorSpec> specs = {
      {"a", DType::kF32, {2}}, {"b", DType::kF16, {3}}, {"c", DType::kBF16, {5}}};
  ShardedWriteOptions options;
  options.max_shard_bytes = 14;
  const absl::StatusOr<SafetensorsShardPlan> plan =
      WriteShardedSafetensors(dir, specs, PatternFill(specs), options);
  EXPECT_OK(plan.status());
  EXPECT_EQ(plan->tensors, (std::vector<std::vector<size_t>>{{0, 1}, {2}}));
  return absl::StrCat(dir, "/model.safetensors.index.json");
}

TEST(ShardedSafetensorsTest, MalformedIndexesNameTheFileAndTheKey) {
  using C = absl::StatusCode;
  struct Case {
    const char* index;
    C code;
    const char* mentions;
  };
  const char* s1 = "model-00001-of-00002.safetensors";
  const char* s2 = "model-00002-of-00002.safetensors";
  auto map = [&](const std::string& entries, const std::string& metadata = "") {
    return absl::StrCat("{", metadata, "\"weight_map\": {", entries, "}}");
  };
  const std::string good_entries =
      absl::StrCat("\"a\": \"", s1, "\", \"b\": \"", s1, "\", \"c\": \"", s2, "\"");
  const std::vector<std::pair<std::string, std::pair<C, std::string>>> cases = {
      {"{\"weight_map\": {\"a\": ", {C::kDataLoss, "line 1"}},
      {"[]", {C::kDataLoss, "not a JSON object"}},
      {"{}", {C::kDataLoss, "\"weight_map\" is missing"}},
      {"{\"weight_map\": []}", {C::kDataLoss, "\"weight_map\" must be an object"}},
      {"{\"weight_map\": {}}", {C::kDataLoss, "\"weight_map\" is empty"}},
      {map(absl::StrCat(good_entries, ", \"a\": \"", s1, "\"")), {C::kDataLoss, "\"a\""}},
      {map("\"a\": 3"), {C::kDataLoss, "\"a\""}},
      {map("\"a\": \"../model-00001-of-00002.safetensors\""), {C::kDataLoss, "'/'"}},
      {map("\"a\": \"/etc/passwd.safetensors\""), {C::kDataLoss, "'/'"}},
      {map("\"a\": \"..\""), {C::kDataLoss, "not a file name"}},
      {map("\"a\": \"weights.bin\""), {C::kDataLoss, ".safetensors"}},
      {map("\"a\": \"\""), {C::kDataLoss, "empty"}},
      {map(absl::StrCat(good_entries, ", \"d\": \"model-00009-of-00009.safetensors\"")),
       {C::kNotFound, "model-00009-of-00009.safetensors"}},
      {map(absl::StrCat(good_entries, ", \"d\": \"", s2, "\"")),
       {C::kDataLoss, "\"d\" in shard \"model-00002-of-00002.safetensors\", which has no"}},
      {map(absl::StrCat("\"a\": \"", s1, "\", \"c\": \"", s2, "\"")),
       {C::kDataLoss, "holds tensor \"b\", which \"weight_map\" does not list"}},
      {map(absl::StrCat("\"a\": \"", s1, "\", \"b\": \"", s2, "\", \"c\": \"", s2, "\"")),
       {C::kDataLoss, "tensor \"b\" is in shard \"model-00001-of-00002.safetensors\" but"}},
      {map(good_entries, "\"metadata\": {\"total_size\": 29}, "),
       {C::kDataLoss, "\"metadata.total_size\" is 29 bytes but the shards' tensors hold 24"}},
      {map(good_entries, "\"metadata\": {\"total_size\": \"24\"}, "),
       {C::kDataLoss, "metadata.total_size"}},
      {map(good_entries, "\"metadata\": {\"total_size\": -24}, "),
       {C::kDataLoss, "metadata.total_size"}},
      {map(good_entries, "\"metadata\": [], "), {C::kDataLoss, "\"metadata\""}},
  };
  for (const auto& [text, want] : cases) {
    const std::string index = TwoShardDir("malformed");
    WriteFile(index, text);
    EXPECT_THAT(ShardedSafetensors::OpenIndex(index),
                StatusIs(want.first, AllOf(HasSubstr(index), HasSubstr(want.second))))
        << text;
  }
  // Accepted variants: total_size as an integral float, extra metadata, no metadata.
  for (const std::string& metadata :
       {std::string("\"metadata\": {\"total_size\": 24.0, \"total_parameters\": 1, \"x\": 1}, "),
        std::string("\"metadata\": null, "), std::string()}) {
    const std::string index = TwoShardDir("variants");
    WriteFile(index, map(good_entries, metadata));
    EXPECT_OK(ShardedSafetensors::OpenIndex(index)) << metadata;
  }
}

TEST(ShardedSafetensorsTest, TensorInTwoShardsIsRefused) {
  const std::string index = TwoShardDir("two_shards");
  const std::string dir = index.substr(0, index.rfind('/'));
  // Rewrite shard 2 to hold "b" as well as "c".
  const std::vector<SafetensorsTensorSpec> specs = {{"b", DType::kF16, {3}},
                                                    {"c", DType::kBF16, {5}}};
  ASSERT_OK(WriteSafetensorsInPieces(absl::StrCat(dir, "/model-00002-of-00002.safetensors"), specs,
                                     {}, PatternFill(specs), 64));
  EXPECT_THAT(ShardedSafetensors::OpenIndex(index),
              StatusIs(absl::StatusCode::kDataLoss, HasSubstr("\"b\" is in two shards")));
}

TEST(ShardedSafetensorsTest, CorruptShardIsDataLossNamingIt) {
  const std::string index = TwoShardDir("corrupt_shard");
  const std::string shard =
      absl::StrCat(index.substr(0, index.rfind('/')), "/model-00002-of-00002.safetensors");
  WriteFile(shard, ReadFile(shard).substr(0, 20));
  EXPECT_THAT(ShardedSafetensors::OpenIndex(index),
              StatusIs(absl::StatusCode::kDataLoss,
                       AllOf(HasSubstr(index), HasSubstr("model-00002-of-00002.safetensors"))));
}

TEST(ShardedSafetensorsTest, DirectoryLookup) {
  const std::string empty = FreshDir("no_weights");
  EXPECT_THAT(ShardedSafetensors::OpenDirectory(empty),
              StatusIs(absl::StatusCode::kNotFound,
                       AllOf(HasSubstr(empty), HasSubstr("model.safetensors.index.json"))));
  WriteFile(absl::StrCat(empty, "/pytorch_model.bin"), "pickle");
  EXPECT_THAT(ShardedSafetensors::OpenDirectory(empty),
              StatusIs(absl::StatusCode::kNotFound, HasSubstr("pytorch_model")));
  EXPECT_THAT(ShardedSafetensors::OpenDirectory(absl::StrCat(empty, "/nope")),
              StatusIs(absl::StatusCode::kNotFound, HasSubstr("does not exist")));
  // model.safetensors wins over an index, as in transformers.
  const std::string index = TwoShardDir("both");
  const std::string dir = index.substr(0, index.rfind('/'));
  const std::vector<SafetensorsTensorSpec> single = {{"z", DType::kF32, {1}}};
  ASSERT_OK(WriteSafetensorsInPieces(absl::StrCat(dir, "/model.safetensors"), single, {},
                                     PatternFill(single), 64));
  ASSERT_OK_AND_ASSIGN(const ShardedSafetensors w, ShardedSafetensors::OpenDirectory(dir));
  EXPECT_FALSE(w.sharded());
  EXPECT_EQ(w.names(), std::vector<std::string>{"z"});
  EXPECT_THAT(w.Get("a"), StatusIs(absl::StatusCode::kNotFound, HasSubstr("'a'")));
  ASSERT_OK_AND_ASSIGN(const ShardedSafetensors s, ShardedSafetensors::OpenIndex(index));
  EXPECT_EQ(s.names(), (std::vector<std::string>{"a", "b", "c"}));
  std::vector<float> out(2);
  EXPECT_OK(s.ReadAsF32("c", 3, absl::MakeSpan(out)));
  EXPECT_THAT(s.ReadAsF32("c", 4, absl::MakeSpan(out)),
              StatusIs(absl::StatusCode::kInvalidArgument));
}

// Random corruption of a valid index: every outcome opens or is a clean error naming the index.
TEST(ShardedSafetensorsTest, RandomIndexCorruptionIsEitherValidOrAClearError) {
  const std::string index = TwoShardDir("random_corruption");
  const std::string original = ReadFile(index);
  SplitMix64 rng(99);
  int ok = 0;
  for (int trial = 0; trial < 800; ++trial) {
    std::string text = original;
    switch (rng.Below(4)) {
      case 0:
        text.resize(rng.Below(text.size()));
        break;
      case 1: {
        const char bytes[] = {'"', '{', '}', ',', ':', '0', '9', '.', '/', '\xc3', '\0'};
        text[rng.Below(text.size())] = bytes[rng.Below(std::size(bytes))];
        break;
      }
      default: {
        nlohmann::json j = nlohmann::json::parse(original);
        nlohmann::json& target = rng.Below(2) ? j["weight_map"] : j["metadata"];
        auto it = target.begin();
        std::advance(it, rng.Below(target.size()));
        const nlohmann::json replacements[] = {
            "x.safetensors",        "model-00002-of-00002.safetensors", nullptr, 7, -1, 24,
            nlohmann::json::array()};
        if (rng.Below(3) == 0) {
          target.erase(it);
        } else {
          *it = replacements[rng.Below(std::size(replacements))];
        }
        text = j.dump();
        break;
      }
    }
    WriteFile(index, text);
    const absl::StatusOr<ShardedSafetensors> w = ShardedSafetensors::OpenIndex(index);
    if (w.ok()) {
      ++ok;
      continue;
    }
    EXPECT_TRUE(w.status().code() == absl::StatusCode::kDataLoss ||
                w.status().code() == absl::StatusCode::kNotFound)
        << w.status();
    EXPECT_THAT(std::string(w.status().message()), HasSubstr(index));
  }
  EXPECT_GT(ok, 10);
  WriteFile(index, original);
  EXPECT_OK(ShardedSafetensors::OpenIndex(index));
}

}  // namespace
}  // namespace ps
