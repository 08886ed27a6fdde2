// Tests for model/gpt2_checkpoint.h on tiny synthetic GPT-2 files written with our writer and on
// one written by the Python safetensors library in the layout of transformers' GPT2LMHeadModel
// (model/testdata/make_testdata.py).
#include "model/gpt2_checkpoint.h"

#include <cmath>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <string>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "base/testing/status_matchers.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "memory/dtype.h"
#include "model/safetensors.h"

namespace ps {
namespace {

using ::testing::AllOf;
using ::testing::ElementsAre;
using ::testing::HasSubstr;
using ::testing::Not;

constexpr Gpt2Dims kTiny{.vocab_size = 11, .max_positions = 6, .hidden = 4, .num_layers = 2};

std::string TmpPath(const std::string& name) {
  const char* dir = std::getenv("TEST_TMPDIR");
  return absl::StrCat(dir != nullptr ? dir : "/tmp", "/", name);
}

std::string TestDataPath(const std::string& name) {
  const char* dir = std::getenv("TEST_SRCDIR");
  return absl::StrCat(dir != nullptr ? dir : ".", "/patrickstar_cc/model/testdata/", name);
}

// The values make_testdata.py uses: exact in f32, f16 and bf16, and different per tensor.
float Value(absl::string_view hf_name, int64_t j) {
  return static_cast<float>((7 * j + 3 * static_cast<int64_t>(hf_name.size())) % 23) * 0.125f -
         1.0f;
}

std::vector<float> Values(absl::string_view hf_name, int64_t n) {
  std::vector<float> v(static_cast<size_t>(n));
  for (int64_t j = 0; j < n; ++j) v[static_cast<size_t>(j)] = Value(hf_name, j);
  return v;
}

int64_t NumElements(const std::vector<int64_t>& shape) {
  int64_t n = 1;
  for (int64_t d : shape) n *= d;
  return n;
}

// One tensor of a hand-built file (always F32).
struct Entry {
  std::string name;
  std::vector<int64_t> shape;
  std::vector<float> values;
};

// A complete tiny GPT-2 whose names carry `prefix`.
std::vector<Entry> TinyEntries(const Gpt2Dims& dims, const std::string& prefix = "") {
  std::vector<Entry> entries;
  for (const Gpt2TensorSpec& s : Gpt2TensorSpecs(dims)) {
    entries.push_back({prefix + s.name, s.shape, Values(s.name, NumElements(s.shape))});
  }
  return entries;
}

Entry* FindEntry(std::vector<Entry>& entries, const std::string& name) {
  for (Entry& e : entries) {
    if (e.name == name) return &e;
  }
  return nullptr;
}

std::string WriteEntries(const std::string& file_name, const std::vector<Entry>& entries) {
  const std::string path = TmpPath(file_name);
  std::vector<SafetensorsTensorData> data;
  for (const Entry& e : entries) {
    data.push_back({{e.name, DType::kF32, e.shape},
                    absl::MakeConstSpan(reinterpret_cast<const uint8_t*>(e.values.data()),
                                        e.values.size() * sizeof(float))});
  }
  const absl::Status s = WriteSafetensors(path, data, {{"format", "pt"}});
  EXPECT_OK(s);
  return path;
}

// Every tensor of `ckpt` holds exactly Values(name).
void ExpectTinyValues(const Gpt2Checkpoint& ckpt) {
  for (const Gpt2TensorSpec& s : ckpt.specs()) {
    SCOPED_TRACE(s.name);
    ASSERT_OK_AND_ASSIGN(const std::vector<float> got, ckpt.ReadF32(s.name));
    EXPECT_EQ(got, Values(s.name, NumElements(s.shape)));
  }
}

TEST(Gpt2CheckpointTest, SpecsAreHuggingFaceNamesWithConv1DShapes) {
  const std::vector<Gpt2TensorSpec> specs = Gpt2TensorSpecs(kTiny);
  ASSERT_EQ(specs.size(), 4u + 12u * 2u);
  EXPECT_EQ(specs[0].name, "wte.weight");
  EXPECT_THAT(specs[0].shape, ElementsAre(11, 4));
  EXPECT_EQ(specs[1].name, "wpe.weight");
  EXPECT_THAT(specs[1].shape, ElementsAre(6, 4));
  EXPECT_EQ(specs[4].name, "h.0.attn.c_attn.weight");
  EXPECT_THAT(specs[4].shape, ElementsAre(4, 12));  // [in, out]
  EXPECT_EQ(specs[5].name, "h.0.attn.c_attn.bias");
  EXPECT_THAT(specs[5].shape, ElementsAre(12));
  EXPECT_EQ(specs[6].name, "h.0.attn.c_proj.weight");
  EXPECT_THAT(specs[6].shape, ElementsAre(4, 4));
  EXPECT_EQ(specs[10].name, "h.0.mlp.c_fc.weight");
  EXPECT_THAT(specs[10].shape, ElementsAre(4, 16));
  EXPECT_EQ(specs[12].name, "h.0.mlp.c_proj.weight");
  EXPECT_THAT(specs[12].shape, ElementsAre(16, 4));
  EXPECT_EQ(specs[13].name, "h.0.mlp.c_proj.bias");
  EXPECT_EQ(specs[14].name, "h.1.ln_1.weight");
  EXPECT_EQ(specs[26].name, "ln_f.weight");
  EXPECT_EQ(specs[27].name, "ln_f.bias");
}

TEST(Gpt2CheckpointTest, ValidateDimsNamesTheField) {
  EXPECT_OK(ValidateGpt2Dims(kTiny));
  Gpt2Dims d = kTiny;
  d.vocab_size = 0;
  EXPECT_THAT(ValidateGpt2Dims(d), StatusIs(absl::StatusCode::kInvalidArgument, "vocab_size"));
  d = kTiny;
  d.num_layers = -1;
  EXPECT_THAT(ValidateGpt2Dims(d), StatusIs(absl::StatusCode::kInvalidArgument, "num_layers"));
  d = kTiny;
  d.hidden = int64_t{1} << 40;
  EXPECT_THAT(ValidateGpt2Dims(d), StatusIs(absl::StatusCode::kInvalidArgument, "overflows"));
}

class Gpt2WriteTest : public ::testing::TestWithParam<DType> {};

TEST_P(Gpt2WriteTest, WrittenFileLoadsWithInferredDimsAndExactValues) {
  const DType dtype = GetParam();
  const std::string path = TmpPath(absl::StrCat("tiny_", DTypeName(dtype), ".safetensors"));
  std::vector<std::string> filled;
  ASSERT_OK(WriteGpt2Safetensors(path, kTiny, dtype,
                                 [&](absl::string_view name, absl::Span<float> out) {
                                   filled.emplace_back(name);
                                   const std::vector<float> v = Values(name, out.size());
                                   std::copy(v.begin(), v.end(), out.begin());
                                   return absl::OkStatus();
                                 },
                                 {{"producer", "patrickstar_cc"}}));
  EXPECT_EQ(filled.size(), Gpt2TensorSpecs(kTiny).size());

  ASSERT_OK_AND_ASSIGN(const SafetensorsFile raw, SafetensorsFile::Open(path));
  EXPECT_EQ(raw.metadata().at("format"), "pt");
  EXPECT_EQ(raw.metadata().at("producer"), "patrickstar_cc");
  ASSERT_EQ(raw.tensors().size(), Gpt2TensorSpecs(kTiny).size());
  for (const SafetensorsTensorInfo& t : raw.tensors()) {
    EXPECT_FALSE(absl::StartsWith(t.name, "transformer.")) << t.name;
    EXPECT_EQ(t.dtype, dtype) << t.name;
  }

  ASSERT_OK_AND_ASSIGN(const Gpt2Checkpoint ckpt, Gpt2Checkpoint::Open(path));
  EXPECT_EQ(ckpt.dims(), kTiny);
  EXPECT_FALSE(ckpt.had_lm_head());
  ExpectTinyValues(ckpt);
  // The same file validates against explicit, matching dimensions.
  EXPECT_OK(Gpt2Checkpoint::Open(path, kTiny).status());
}

INSTANTIATE_TEST_SUITE_P(AllDTypes, Gpt2WriteTest,
                         ::testing::Values(DType::kF32, DType::kF16, DType::kBF16),
                         [](const auto& info) { return std::string(DTypeName(info.param)); });

TEST(Gpt2CheckpointTest, WriterPropagatesFillErrorsAndValidatesDims) {
  const std::string path = TmpPath("fill_error.safetensors");
  EXPECT_THAT(WriteGpt2Safetensors(path, kTiny, DType::kF32,
                                   [](absl::string_view name, absl::Span<float>) {
                                     return absl::FailedPreconditionError(
                                         absl::StrCat("no data for ", name));
                                   }),
              StatusIs(absl::StatusCode::kFailedPrecondition, "no data for"));
  EXPECT_THAT(SafetensorsFile::Open(path), StatusIs(absl::StatusCode::kNotFound));
  Gpt2Dims bad = kTiny;
  bad.hidden = 0;
  EXPECT_THAT(
      WriteGpt2Safetensors(path, bad, DType::kF32,
                           [](absl::string_view, absl::Span<float>) { return absl::OkStatus(); }),
      StatusIs(absl::StatusCode::kInvalidArgument, "hidden"));
}

TEST(Gpt2CheckpointTest, LoadsPrefixedNamesMaskBuffersAndTiedHead) {
  std::vector<Entry> entries = TinyEntries(kTiny, "transformer.");
  for (int i = 0; i < kTiny.num_layers; ++i) {
    const int64_t p = kTiny.max_positions;
    entries.push_back({absl::StrCat("transformer.h.", i, ".attn.bias"),
                       {1, 1, p, p},
                       std::vector<float>(static_cast<size_t>(p * p), 1.0f)});
    entries.push_back({absl::StrCat("transformer.h.", i, ".attn.masked_bias"), {}, {-1e4f}});
  }
  entries.push_back({"lm_head.weight", {11, 4}, Values("wte.weight", 44)});
  ASSERT_OK_AND_ASSIGN(const Gpt2Checkpoint ckpt,
                       Gpt2Checkpoint::Open(WriteEntries("prefixed.safetensors", entries)));
  EXPECT_EQ(ckpt.dims(), kTiny);
  EXPECT_TRUE(ckpt.had_lm_head());
  ExpectTinyValues(ckpt);
  const SafetensorsTensorInfo* info = ckpt.Find("h.1.mlp.c_fc.weight");
  ASSERT_NE(info, nullptr);
  EXPECT_EQ(info->name, "transformer.h.1.mlp.c_fc.weight");
  // Lookups use the Hugging Face names without prefix.
  EXPECT_THAT(ckpt.ReadF32("transformer.wte.weight"),
              StatusIs(absl::StatusCode::kNotFound, "without \"transformer.\""));
  EXPECT_THAT(ckpt.ReadF32("h.0.attn.bias"), StatusIs(absl::StatusCode::kNotFound));
}

TEST(Gpt2CheckpointTest, UnprefixedFileWithTiedHeadLoads) {
  std::vector<Entry> entries = TinyEntries(kTiny);
  entries.push_back({"lm_head.weight", {11, 4}, Values("wte.weight", 44)});
  ASSERT_OK_AND_ASSIGN(const Gpt2Checkpoint ckpt,
                       Gpt2Checkpoint::Open(WriteEntries("tied.safetensors", entries), kTiny));
  EXPECT_TRUE(ckpt.had_lm_head());
}

TEST(Gpt2CheckpointTest, UntiedHeadIsRejectedNamingTheElement) {
  std::vector<Entry> entries = TinyEntries(kTiny);
  std::vector<float> head = Values("wte.weight", 44);
  head[2 * 4 + 3] += 0.5f;  // row 2, column 3
  entries.push_back({"lm_head.weight", {11, 4}, head});
  EXPECT_THAT(Gpt2Checkpoint::Open(WriteEntries("untied.safetensors", entries)),
              StatusIs(absl::StatusCode::kInvalidArgument,
                       AllOf(HasSubstr("lm_head.weight differs from 'wte.weight' at [2, 3]"),
                             HasSubstr("untied"))));

  // A sign difference of zero is a difference too: the comparison is bit for bit.
  std::vector<Entry> zero = TinyEntries(kTiny);
  FindEntry(zero, "wte.weight")->values[0] = 0.0f;
  std::vector<float> neg_zero_head = FindEntry(zero, "wte.weight")->values;
  neg_zero_head[0] = -0.0f;
  zero.push_back({"lm_head.weight", {11, 4}, neg_zero_head});
  EXPECT_THAT(Gpt2Checkpoint::Open(WriteEntries("negzero.safetensors", zero)),
              StatusIs(absl::StatusCode::kInvalidArgument, "at [0, 0]"));
}

TEST(Gpt2CheckpointTest, HeadOfWrongShapeIsRejected) {
  std::vector<Entry> entries = TinyEntries(kTiny);
  entries.push_back({"lm_head.weight", {10, 4}, Values("wte.weight", 40)});
  EXPECT_THAT(Gpt2Checkpoint::Open(WriteEntries("head_shape.safetensors", entries)),
              StatusIs(absl::StatusCode::kInvalidArgument,
                       "1 tensor(s) of the wrong shape: 'lm_head.weight' has shape [10, 4], "
                       "expected [11, 4]"));
}

TEST(Gpt2CheckpointTest, WrongShapeIsNamed) {
  std::vector<Entry> entries = TinyEntries(kTiny);
  Entry* e = FindEntry(entries, "h.1.attn.c_attn.weight");
  ASSERT_NE(e, nullptr);
  e->shape = {4, 8};
  e->values.resize(32);
  EXPECT_THAT(
      Gpt2Checkpoint::Open(WriteEntries("wrong_shape.safetensors", entries)),
      StatusIs(absl::StatusCode::kInvalidArgument,
               AllOf(HasSubstr("wrong_shape.safetensors"),
                     HasSubstr("'h.1.attn.c_attn.weight' has shape [4, 8], expected [4, 12]"))));
}

TEST(Gpt2CheckpointTest, MissingAndUnexpectedTensorsAreNamed) {
  std::vector<Entry> entries = TinyEntries(kTiny);
  std::erase_if(entries, [](const Entry& e) { return e.name == "h.0.ln_2.bias"; });
  entries.push_back({"h.0.attn.rotary", {2}, {0.0f, 0.0f}});
  EXPECT_THAT(Gpt2Checkpoint::Open(WriteEntries("missing.safetensors", entries)),
              StatusIs(absl::StatusCode::kInvalidArgument,
                       AllOf(HasSubstr("1 missing tensor(s): h.0.ln_2.bias"),
                             HasSubstr("1 unexpected tensor(s): 'h.0.attn.rotary'"))));

  // A mask buffer of a block the model does not have is not ignored.
  std::vector<Entry> extra = TinyEntries(kTiny);
  extra.push_back({"h.5.attn.bias", {1}, {1.0f}});
  EXPECT_THAT(Gpt2Checkpoint::Open(WriteEntries("extra_block.safetensors", extra), kTiny),
              StatusIs(absl::StatusCode::kInvalidArgument, "'h.5.attn.bias'"));
}

TEST(Gpt2CheckpointTest, TensorPresentWithAndWithoutPrefixIsRejected) {
  std::vector<Entry> entries = TinyEntries(kTiny);
  entries.push_back({"transformer.ln_f.bias", {4}, Values("ln_f.bias", 4)});
  EXPECT_THAT(Gpt2Checkpoint::Open(WriteEntries("twice.safetensors", entries)),
              StatusIs(absl::StatusCode::kInvalidArgument,
                       "1 duplicated tensor(s): ln_f.bias is present twice, as 'ln_f.bias' and as "
                       "'transformer.ln_f.bias'"));
}

TEST(Gpt2CheckpointTest, ExpectedDimsThatDoNotMatchListEveryMismatch) {
  const std::string path = WriteEntries("dims.safetensors", TinyEntries(kTiny));
  Gpt2Dims wider = kTiny;
  wider.hidden = 8;
  EXPECT_THAT(Gpt2Checkpoint::Open(path, wider),
              StatusIs(absl::StatusCode::kInvalidArgument,
                       AllOf(HasSubstr("dimensions 11/6/8/2"),
                             HasSubstr("28 tensor(s) of the wrong shape: 'wte.weight' has shape "
                                       "[11, 4], expected [11, 8]; 'wpe.weight'"),
                             HasSubstr("... and"))));
  Gpt2Dims deeper = kTiny;
  deeper.num_layers = 3;
  EXPECT_THAT(Gpt2Checkpoint::Open(path, deeper),
              StatusIs(absl::StatusCode::kInvalidArgument,
                       AllOf(HasSubstr("12 missing tensor(s): h.2.ln_1.weight"),
                             Not(HasSubstr("unexpected")))));
}

TEST(Gpt2CheckpointTest, InferenceErrorsNameTheTensor) {
  std::vector<Entry> no_wte = TinyEntries(kTiny);
  std::erase_if(no_wte, [](const Entry& e) { return e.name == "wte.weight"; });
  EXPECT_THAT(Gpt2Checkpoint::Open(WriteEntries("no_wte.safetensors", no_wte)),
              StatusIs(absl::StatusCode::kInvalidArgument,
                       AllOf(HasSubstr("cannot infer"), HasSubstr("wte.weight is missing"))));

  std::vector<Entry> flat_wpe = TinyEntries(kTiny);
  Entry* wpe = FindEntry(flat_wpe, "wpe.weight");
  wpe->shape = {24};
  EXPECT_THAT(Gpt2Checkpoint::Open(WriteEntries("flat_wpe.safetensors", flat_wpe)),
              StatusIs(absl::StatusCode::kInvalidArgument,
                       "'wpe.weight' has shape [24], expected [max_positions, 4]"));

  std::vector<Entry> no_blocks = TinyEntries(kTiny);
  std::erase_if(no_blocks, [](const Entry& e) { return absl::StartsWith(e.name, "h."); });
  EXPECT_THAT(Gpt2Checkpoint::Open(WriteEntries("no_blocks.safetensors", no_blocks)),
              StatusIs(absl::StatusCode::kInvalidArgument, "no transformer block"));

  std::vector<Entry> far_block = TinyEntries(kTiny);
  far_block.push_back({"h.999999.ln_1.weight", {4}, Values("x", 4)});
  EXPECT_THAT(Gpt2Checkpoint::Open(WriteEntries("far_block.safetensors", far_block)),
              StatusIs(absl::StatusCode::kInvalidArgument, "block index h.999999 is impossible"));
}

// Weights holding Inf or NaN are refused when the file is opened, naming the first such tensor in
// model order and the element, in whatever dtype they are stored.
TEST(Gpt2CheckpointTest, RefusesNonFiniteValuesNamingTheTensorAndElement) {
  std::vector<Entry> entries = TinyEntries(kTiny, "transformer.");
  // h.1.attn.c_proj.weight is [4, 4]: element 11 is [2, 3]. ln_f.bias comes later in model order.
  FindEntry(entries, "transformer.h.1.attn.c_proj.weight")->values[11] = std::nanf("");
  FindEntry(entries, "transformer.ln_f.bias")->values[0] = INFINITY;
  EXPECT_THAT(Gpt2Checkpoint::Open(WriteEntries("nan.safetensors", entries)),
              StatusIs(absl::StatusCode::kDataLoss,
                       AllOf(HasSubstr("nan.safetensors"),
                             HasSubstr("'transformer.h.1.attn.c_proj.weight' holds NaN at [2, 3]"),
                             HasSubstr("element 11 of 16"))));

  // Stored as f16 (the writer converts f32 Inf to f16 Inf).
  const std::string f16_path = TmpPath("inf_f16.safetensors");
  ASSERT_OK(WriteGpt2Safetensors(f16_path, kTiny, DType::kF16,
                                 [](absl::string_view name, absl::Span<float> out) {
                                   for (size_t j = 0; j < out.size(); ++j) out[j] = 0.5f;
                                   if (name == "wpe.weight") out[5] = -INFINITY;
                                   return absl::OkStatus();
                                 }));
  EXPECT_THAT(Gpt2Checkpoint::Open(f16_path),
              StatusIs(absl::StatusCode::kDataLoss,
                       AllOf(HasSubstr("'wpe.weight' holds -Inf at [1, 1]"), HasSubstr("f16"))));
  // A finite value that overflows f16 is not written as f16 Inf silently either: it is Inf in the
  // file, so the same refusal applies.
  ASSERT_OK(WriteGpt2Safetensors(f16_path, kTiny, DType::kF16,
                                 [](absl::string_view name, absl::Span<float> out) {
                                   for (size_t j = 0; j < out.size(); ++j) out[j] = 0.5f;
                                   if (name == "ln_f.weight") out[3] = 1e6f;
                                   return absl::OkStatus();
                                 }));
  EXPECT_THAT(Gpt2Checkpoint::Open(f16_path),
              StatusIs(absl::StatusCode::kDataLoss, HasSubstr("'ln_f.weight' holds +Inf at [3]")));
}

// A file written by the Python safetensors library, laid out as transformers' GPT2LMHeadModel
// saves it: "transformer." prefix, mask buffers, lm_head, and mixed dtypes (wte BF16, ln_1 F16,
// lm_head and the rest F32).
TEST(Gpt2CheckpointTest, ReadsHuggingFaceLayoutWrittenByPython) {
  ASSERT_OK_AND_ASSIGN(const Gpt2Checkpoint ckpt,
                       Gpt2Checkpoint::Open(TestDataPath("python_gpt2_tiny.safetensors")));
  EXPECT_EQ(ckpt.dims(), kTiny);
  EXPECT_TRUE(ckpt.had_lm_head());  // BF16 wte equals F32 lm_head after conversion
  EXPECT_EQ(ckpt.Find("wte.weight")->dtype, DType::kBF16);
  EXPECT_EQ(ckpt.Find("h.1.ln_1.bias")->dtype, DType::kF16);
  EXPECT_EQ(ckpt.Find("h.1.ln_2.bias")->dtype, DType::kF32);
  ExpectTinyValues(ckpt);
}

}  // namespace
}  // namespace ps
