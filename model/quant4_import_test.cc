// Importing pre-quantized 4-bit directories: the reference directories of
// model/testdata/nf4_prequant (written in transformers + bitsandbytes' saved format by
// make_prequant_dir.py, with their dequantized values) must import to blobs that dequantize to
// those values bit for bit; every malformed variant, written here as a mutated copy, is refused
// with an error naming the tensor and the file.
#include "model/quant4_import.h"

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <functional>
#include <map>
#include <optional>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "base/testing/status_matchers.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "memory/dtype.h"
#include "model/hf_checkpoint.h"
#include "model/hf_json.h"
#include "model/kernels/nf4.h"
#include "model/quant4_config.h"
#include "model/safetensors.h"
#include "model/safetensors_index.h"
#include "nlohmann/json.hpp"

namespace ps {
namespace {

using ::testing::AllOf;
using ::testing::HasSubstr;
using json = nlohmann::json;
using C = absl::StatusCode;

std::string PrequantPath(const std::string& name) {
  const char* dir = std::getenv("TEST_SRCDIR");
  return absl::StrCat(dir != nullptr ? dir : ".", "/patrickstar_cc/model/testdata/nf4_prequant/",
                      name);
}

std::string TmpDir(const std::string& name) {
  const std::string dir = absl::StrCat(testing::TempDir(), "/quant4_import_", name);
  std::filesystem::remove_all(dir);
  std::filesystem::create_directories(dir);
  return dir;
}

std::string ReadText(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  return std::string(std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>());
}

// A tensor of any dtype, as raw bytes: what the mutated copies are made of.
struct RawTensor {
  std::string dtype;
  std::vector<int64_t> shape;
  std::vector<uint8_t> bytes;
};
using RawTensors = std::map<std::string, RawTensor>;

RawTensors ReadAll(const std::string& path) {
  absl::StatusOr<SafetensorsFile> file = SafetensorsFile::Open(path);
  EXPECT_OK(file.status());
  RawTensors out;
  if (!file.ok()) return out;
  for (const SafetensorsTensorInfo& info : file->tensors()) {
    const absl::Span<const uint8_t> b = file->Bytes(info);
    out[info.name] = RawTensor{info.dtype_name, info.shape, {b.begin(), b.end()}};
  }
  return out;
}

// The safetensors format (model/safetensors.h), written directly: this writer's dtypes are any.
void WriteRaw(const std::string& path, const RawTensors& tensors) {
  json header = json::object();
  header["__metadata__"] = {{"format", "pt"}};
  int64_t offset = 0;
  std::string data;
  for (const auto& [name, t] : tensors) {
    header[name] = {{"dtype", t.dtype},
                    {"shape", t.shape},
                    {"data_offsets", {offset, offset + static_cast<int64_t>(t.bytes.size())}}};
    data.append(reinterpret_cast<const char*>(t.bytes.data()), t.bytes.size());
    offset += static_cast<int64_t>(t.bytes.size());
  }
  std::string h = header.dump();
  h.append((8 - h.size() % 8) % 8, ' ');
  std::string out(8, '\0');
  const uint64_t n = h.size();
  for (int i = 0; i < 8; ++i) out[i] = static_cast<char>((n >> (8 * i)) & 0xff);
  out += h;
  out += data;
  std::ofstream f(path, std::ios::binary | std::ios::trunc);
  f.write(out.data(), static_cast<std::streamsize>(out.size()));
}

std::vector<float> AsFloats(const RawTensor& t) {
  std::vector<float> v(t.bytes.size() / 4);
  std::memcpy(v.data(), t.bytes.data(), v.size() * 4);
  return v;
}
void SetFloats(RawTensor& t, const std::vector<float>& v) {
  t.bytes.resize(v.size() * 4);
  std::memcpy(t.bytes.data(), v.data(), t.bytes.size());
  t.shape = {static_cast<int64_t>(v.size())};
}
json QuantStateOf(const RawTensor& t) {
  return json::parse(std::string(t.bytes.begin(), t.bytes.end()));
}
void SetQuantState(RawTensor& t, const std::string& text) {
  t.bytes.assign(text.begin(), text.end());
  t.shape = {static_cast<int64_t>(t.bytes.size())};
}

uint32_t Bits(float f) {
  uint32_t u;
  std::memcpy(&u, &f, 4);
  return u;
}

// A blob buffer, 16-byte aligned (floats inside it are read in place).
struct Blob {
  explicit Blob(int64_t bytes) : storage((bytes + 15) / 16), size(bytes) {}
  absl::Span<uint8_t> span() { return {reinterpret_cast<uint8_t*>(storage.data()), size}; }
  struct alignas(16) Chunk {
    uint8_t b[16];
  };
  std::vector<Chunk> storage;
  size_t size;
};

// One variant of model/testdata/nf4_prequant.
struct Variant {
  std::string dir;
  Quant4Config config;
  bool transposed;
  int weights;
};

const Variant kLlama{"llama_nf4_nested", {Quant4Type::kNf4, true, DType::kF32, {}}, false, 14};
const Variant kGpt2{"gpt2_fp4", {Quant4Type::kFp4, false, DType::kF32, {}}, true, 8};

Quant4Format FormatOf(const Variant& v, const RawTensor& expected) {
  return Quant4Format{v.config.quant_type, v.config.double_quant, expected.shape[0],
                      expected.shape[1], v.transposed};
}

// Imports every weight of a variant and checks its values against the expected ones, bit for bit.
void CheckVariant(const Variant& v) {
  SCOPED_TRACE(v.dir);
  ASSERT_OK_AND_ASSIGN(
      json config, hf_json::ParseObject(ReadText(PrequantPath(v.dir + "/config.json")), "config",
                                        v.dir, C::kInvalidArgument));
  ASSERT_OK_AND_ASSIGN(std::optional<Quant4Config> q, Quant4ConfigFromHfConfig(config, v.dir));
  ASSERT_TRUE(q.has_value());
  EXPECT_EQ(*q, v.config);

  ASSERT_OK_AND_ASSIGN(ShardedSafetensors weights,
                       ShardedSafetensors::OpenDirectory(PrequantPath(v.dir)));
  const RawTensors expected = ReadAll(PrequantPath(v.dir + ".expected.safetensors"));
  std::vector<std::string> state_keys;
  int imported = 0;
  for (const auto& [name, values] : expected) {
    if (absl::EndsWith(name, ".nested_offset")) continue;
    SCOPED_TRACE(name);
    const Quant4Format format = FormatOf(v, values);
    for (std::string& k : Quant4StateKeys(name, format.type, format.nested)) {
      state_keys.push_back(std::move(k));
    }
    Blob blob(Quant4BlobLayoutOf(format).bytes);
    // Garbage first: the import writes every byte, padding included.
    std::memset(blob.span().data(), 0xa5, blob.size);
    ASSERT_OK_AND_ASSIGN(Quant4Imported got,
                         ImportQuant4Weight(weights, name, format, blob.span()));
    EXPECT_EQ(got.source_dtype, v.transposed ? DType::kBF16 : DType::kF32);
    if (format.nested) {
      const std::vector<float> offset = AsFloats(expected.at(name + ".nested_offset"));
      EXPECT_EQ(Bits(got.nested_offset), Bits(offset[0]));
    } else {
      EXPECT_EQ(got.nested_offset, 0.0f);
    }
    const Quant4Tensor t = Quant4TensorAt(format, blob.span().data(), got.nested_offset);
    std::vector<float> out(format.num_elems());
    ASSERT_OK(Dequantize4Bit(t, 0, format.num_elems(), DType::kF32, out.data()));
    const std::vector<float> want = AsFloats(values);
    ASSERT_EQ(out.size(), want.size());
    for (size_t i = 0; i < want.size(); ++i) {
      ASSERT_EQ(Bits(out[i]), Bits(want[i]))
          << "element " << i << ": " << out[i] << " vs " << want[i];
    }
    // The blob is deterministic: padding zero, whatever was there before.
    Blob again(blob.size);
    ASSERT_OK(ImportQuant4Weight(weights, name, format, again.span()).status());
    EXPECT_EQ(std::memcmp(blob.span().data(), again.span().data(), blob.size), 0);
    ++imported;
  }
  EXPECT_EQ(imported, v.weights);
  std::sort(state_keys.begin(), state_keys.end());
  EXPECT_EQ(Quant4StateTensorNames(weights), state_keys);
}

TEST(Quant4ImportTest, LlamaNf4NestedDequantizesBitForBit) { CheckVariant(kLlama); }

TEST(Quant4ImportTest, Gpt2Fp4PlainDequantizesBitForBit) { CheckVariant(kGpt2); }

TEST(Quant4ImportTest, StateTensorNames) {
  for (const char* name : {"a.weight.absmax", "a.weight.quant_map", "a.weight.nested_absmax",
                           "a.weight.nested_quant_map", "a.weight.quant_state.bitsandbytes__nf4",
                           "a.weight.quant_state.bitsandbytes__fp4"}) {
    EXPECT_TRUE(IsQuant4StateTensorName(name)) << name;
  }
  for (const char* name : {"model.layers.0.self_attn.q_proj.weight", "absmax", ".absmax",
                           "a.weight.quant_state.bitsandbytes__int4", "a.absmax.weight",
                           "model.norm.weight", "lm_head.weight"}) {
    EXPECT_FALSE(IsQuant4StateTensorName(name)) << name;
  }
  EXPECT_EQ(
      Quant4StateKeys("w", Quant4Type::kFp4, false),
      (std::vector<std::string>{"w.absmax", "w.quant_map", "w.quant_state.bitsandbytes__fp4"}));
  EXPECT_EQ(Quant4StateKeys("w", Quant4Type::kNf4, true),
            (std::vector<std::string>{"w.absmax", "w.quant_map", "w.nested_absmax",
                                      "w.nested_quant_map", "w.quant_state.bitsandbytes__nf4"}));
}

// ---------------------------------------------------------------------------------------------
// Refusals, on mutated copies of the reference directories.
// ---------------------------------------------------------------------------------------------

class MutatedTest : public ::testing::Test {
 protected:
  // Copies variant `v`'s tensors, applies `mutate`, writes them as path_ and imports
  // `weight` (its expected format unless `format` is given).
  absl::Status Import(const Variant& v, const std::string& weight,
                      const std::function<void(RawTensors&)>& mutate,
                      std::optional<Quant4Format> format = std::nullopt) {
    RawTensors tensors = ReadAll(PrequantPath(v.dir + "/model.safetensors"));
    mutate(tensors);
    const std::string dir = TmpDir("mutated");  // the directory of path_, made afresh
    WriteRaw(path_, tensors);
    absl::StatusOr<ShardedSafetensors> weights = ShardedSafetensors::OpenDirectory(dir);
    if (!weights.ok()) return weights.status();
    if (!format.has_value()) {
      const RawTensors expected = ReadAll(PrequantPath(v.dir + ".expected.safetensors"));
      format = FormatOf(v, expected.at(weight));
    }
    Blob blob(Quant4BlobLayoutOf(*format).bytes);
    return ImportQuant4Weight(*weights, weight, *format, blob.span()).status();
  }

  // Where every mutated copy is written (known before the call, for the expected messages).
  const std::string path_ =
      absl::StrCat(testing::TempDir(), "/quant4_import_mutated/model.safetensors");
};

const std::string kW = "model.layers.1.mlp.down_proj.weight";  // [30, 45]: 22 blocks
const std::string kG = "transformer.h.1.attn.c_attn.weight";   // [63, 21]: odd count
const std::string kQs = kW + ".quant_state.bitsandbytes__nf4";

TEST_F(MutatedTest, UnchangedCopyImports) {
  EXPECT_OK(Import(kLlama, kW, [](RawTensors&) {}));
  EXPECT_OK(Import(kGpt2, kG, [](RawTensors&) {}));
}

TEST_F(MutatedTest, MissingTensorsAreNamed) {
  for (const std::string& key : {kW, kW + ".absmax", kW + ".quant_map", kW + ".nested_absmax",
                                 kW + ".nested_quant_map", kQs}) {
    SCOPED_TRACE(key);
    EXPECT_THAT(Import(kLlama, kW, [&](RawTensors& t) { t.erase(key); }),
                StatusIs(C::kInvalidArgument,
                         AllOf(HasSubstr("'" + key + "' is missing"), HasSubstr(path_))));
  }
}

TEST_F(MutatedTest, WrongDtypesAreNamed) {
  struct Case {
    std::string key, dtype, expected;
  };
  for (const Case& c :
       {Case{kW, "I8", "U8"}, Case{kW + ".absmax", "I8", "U8"},
        Case{kW + ".quant_map", "I32", "F32"}, Case{kW + ".nested_absmax", "I32", "F32"},
        Case{kW + ".nested_quant_map", "U32", "F32"}, Case{kQs, "I8", "U8"}}) {
    SCOPED_TRACE(c.key);
    EXPECT_THAT(Import(kLlama, kW, [&](RawTensors& t) { t.at(c.key).dtype = c.dtype; }),
                StatusIs(C::kInvalidArgument,
                         AllOf(HasSubstr("'" + c.key + "' in file '" + path_ + "'"),
                               HasSubstr("dtype " + c.dtype + ", expected " + c.expected))));
  }
  // Plain absmax is F32: the nested form's U8 is refused when the config says plain.
  EXPECT_THAT(Import(kGpt2, kG,
                     [&](RawTensors& t) {
                       RawTensor& a = t.at(kG + ".absmax");
                       a.dtype = "U8";
                       a.bytes.resize(a.shape[0]);
                     }),
              StatusIs(C::kInvalidArgument, HasSubstr("dtype U8, expected F32")));
}

TEST_F(MutatedTest, MisshapenTensorsAreNamed) {
  auto drop_last = [](RawTensor& r, int64_t elem_bytes) {
    r.bytes.resize(r.bytes.size() - elem_bytes);
    r.shape[0] -= 1;
  };
  struct Case {
    std::string key;
    std::function<void(RawTensor&)> mutate;
    std::string message;
  };
  const std::vector<Case> cases = {
      {kW, [&](RawTensor& r) { drop_last(r, 1); }, "shape [674, 1], expected [675, 1]"},
      {kW, [&](RawTensor& r) { r.shape = {675}; }, "shape [675], expected [675, 1]"},
      {kW + ".absmax", [&](RawTensor& r) { drop_last(r, 1); }, "shape [21], expected [22]"},
      {kW + ".quant_map", [&](RawTensor& r) { drop_last(r, 4); }, "shape [15], expected [16]"},
      {kW + ".nested_absmax",
       [&](RawTensor& r) {
         r.bytes.resize(8, 0);
         r.shape = {2};
       },
       "shape [2], expected [1]"},
      {kW + ".nested_quant_map", [&](RawTensor& r) { drop_last(r, 4); },
       "shape [255], expected [256]"},
      {kQs,
       [&](RawTensor& r) {
         r.shape = {r.shape[0], 1};
       },
       "expected ["},
  };
  for (const Case& c : cases) {
    SCOPED_TRACE(c.key + ": " + c.message);
    EXPECT_THAT(
        Import(kLlama, kW, [&](RawTensors& t) { c.mutate(t.at(c.key)); }),
        StatusIs(C::kInvalidArgument, AllOf(HasSubstr("'" + c.key + "' in file '" + path_ + "'"),
                                            HasSubstr(c.message))));
  }
}

// Edits the quant_state JSON of kW.
std::function<void(RawTensors&)> EditState(std::function<void(json&)> edit) {
  return [edit](RawTensors& t) {
    json s = QuantStateOf(t.at(kQs));
    edit(s);
    SetQuantState(t.at(kQs), s.dump());
  };
}

TEST_F(MutatedTest, QuantStateJsonIsChecked) {
  auto text = [](const std::string& s) {
    return [s](RawTensors& t) { SetQuantState(t.at(kQs), s); };
  };
  struct Case {
    std::function<void(RawTensors&)> mutate;
    C code;
    std::string message;
  };
  const std::vector<Case> cases = {
      {text("{\"quant_type\": \"nf4\""), C::kDataLoss, "not valid JSON"},
      {text("[1, 2]"), C::kDataLoss, "not a JSON object"},
      {text("\xff\xfe"), C::kDataLoss, ""},
      {text("{\"quant_type\": \"nf4\", \"quant_type\": \"nf4\"}"), C::kDataLoss, "quant_type"},
      {EditState([](json& s) { s["quant_type"] = "fp4"; }), C::kInvalidArgument,
       "quant_type is \"fp4\" but config.json's bnb_4bit_quant_type is \"nf4\""},
      {EditState([](json& s) { s["quant_type"] = "int4"; }), C::kDataLoss,
       "disagrees with the key's suffix"},
      {EditState([](json& s) { s["blocksize"] = 128; }), C::kUnimplemented, "blocksize 128"},
      {EditState([](json& s) { s["blocksize"] = "64"; }), C::kDataLoss, "must be an integer"},
      {EditState([](json& s) { s["nested_blocksize"] = 128; }), C::kDataLoss,
       "nested_blocksize 128, expected 256"},
      {EditState([](json& s) {
         s["shape"] = {45, 30};
       }),
       C::kInvalidArgument, "shape [45, 30], expected [30, 45]"},
      {EditState([](json& s) { s["shape"] = {1350}; }), C::kInvalidArgument, "shape [1350]"},
      {EditState([](json& s) { s["shape"] = "30x45"; }), C::kDataLoss, "list of integers"},
      {EditState([](json& s) { s["dtype"] = "float64"; }), C::kDataLoss, "dtype \"float64\""},
      {EditState([](json& s) { s["nested_dtype"] = "float16"; }), C::kDataLoss,
       "nested_dtype \"float16\""},
      {EditState([](json& s) { s.erase("nested_offset"); }), C::kDataLoss, "no \"nested_offset\""},
      {EditState([](json& s) { s["nested_offset"] = "0.5"; }), C::kDataLoss, "nested_offset"},
      {EditState([](json& s) { s["nested_offset"] = 1e300; }), C::kDataLoss, "overflows"},
      {EditState([](json& s) { s.erase("shape"); }), C::kDataLoss, "no \"shape\""},
      {EditState([](json& s) { s["code"] = 1; }), C::kDataLoss, "unknown key \"code\""},
  };
  for (const Case& c : cases) {
    SCOPED_TRACE(c.message);
    EXPECT_THAT(Import(kLlama, kW, c.mutate),
                StatusIs(c.code, AllOf(HasSubstr("'" + kQs + "' in file '" + path_ + "'"),
                                       HasSubstr(c.message))));
  }
  // Plain absmax: nested keys in the JSON are corrupt.
  const std::string gqs = kG + ".quant_state.bitsandbytes__fp4";
  EXPECT_THAT(Import(kGpt2, kG,
                     [&](RawTensors& t) {
                       json s = QuantStateOf(t.at(gqs));
                       s["nested_offset"] = 0.5;
                       SetQuantState(t.at(gqs), s.dump());
                     }),
              StatusIs(C::kDataLoss, HasSubstr("\"nested_offset\" without double quantization")));
}

TEST_F(MutatedTest, StateOfTheOtherKindIsRefusedNamingTheConfigKey) {
  // Saved as fp4 (the key's suffix) where config.json says nf4.
  EXPECT_THAT(Import(kLlama, kW,
                     [&](RawTensors& t) {
                       RawTensor qs = t.at(kQs);
                       t.erase(kQs);
                       t[kW + ".quant_state.bitsandbytes__fp4"] = qs;
                     }),
              StatusIs(C::kInvalidArgument, AllOf(HasSubstr(kW + ".quant_state.bitsandbytes__fp4"),
                                                  HasSubstr("bnb_4bit_quant_type is \"nf4\""))));
  // The directory is nested; a plain format (use_double_quant false) is refused.
  Quant4Format plain{Quant4Type::kNf4, false, 30, 45, false};
  EXPECT_THAT(
      Import(
          kLlama, kW, [](RawTensors&) {}, plain),
      StatusIs(C::kInvalidArgument, AllOf(HasSubstr(kW + ".nested_absmax"),
                                          HasSubstr("bnb_4bit_use_double_quant is false"))));
  // The directory is plain; a nested format is refused (its absmax is F32, not the codes).
  Quant4Format nested{Quant4Type::kFp4, true, 63, 21, true};
  EXPECT_THAT(Import(
                  kGpt2, kG, [](RawTensors&) {}, nested),
              StatusIs(C::kInvalidArgument, HasSubstr("bnb_4bit_use_double_quant")));
  // The model expects another shape.
  Quant4Format other{Quant4Type::kNf4, true, 45, 30, false};
  EXPECT_THAT(Import(
                  kLlama, kW, [](RawTensors&) {}, other),
              StatusIs(C::kInvalidArgument, HasSubstr("expected [45, 30]")));
}

TEST_F(MutatedTest, CodeBooksMustBeStandard) {
  // One ulp off in one entry of quant_map.
  EXPECT_THAT(Import(kLlama, kW,
                     [&](RawTensors& t) {
                       std::vector<float> m = AsFloats(t.at(kW + ".quant_map"));
                       m[5] = std::nextafter(m[5], 0.0f);
                       SetFloats(t.at(kW + ".quant_map"), m);
                     }),
              StatusIs(C::kDataLoss, AllOf(HasSubstr("'" + kW + ".quant_map' in file '" + path_),
                                           HasSubstr("entry 5"), HasSubstr("non-standard"))));
  // FP4's table on an NF4 weight.
  EXPECT_THAT(Import(kLlama, kW,
                     [&](RawTensors& t) {
                       std::vector<float> m(Quant4Levels(Quant4Type::kFp4),
                                            Quant4Levels(Quant4Type::kFp4) + 16);
                       SetFloats(t.at(kW + ".quant_map"), m);
                     }),
              StatusIs(C::kDataLoss, HasSubstr("entry 0")));
  // NaN in quant_map.
  EXPECT_THAT(Import(kGpt2, kG,
                     [&](RawTensors& t) {
                       std::vector<float> m = AsFloats(t.at(kG + ".quant_map"));
                       m[15] = std::nanf("");
                       SetFloats(t.at(kG + ".quant_map"), m);
                     }),
              StatusIs(C::kDataLoss, HasSubstr("entry 15")));
  // FP4's quant_map has +0.0 at entry 8 (bitsandbytes), the kernel's table -0.0: both accepted.
  EXPECT_OK(Import(kGpt2, kG, [&](RawTensors& t) {
    std::vector<float> m = AsFloats(t.at(kG + ".quant_map"));
    EXPECT_EQ(Bits(m[8]), 0u);  // as bitsandbytes writes it
    m[8] = -0.0f;
    SetFloats(t.at(kG + ".quant_map"), m);
  }));
  // nested_quant_map other than create_dynamic_map().
  EXPECT_THAT(
      Import(kLlama, kW,
             [&](RawTensors& t) {
               std::vector<float> m = AsFloats(t.at(kW + ".nested_quant_map"));
               m[200] *= 1.5f;
               SetFloats(t.at(kW + ".nested_quant_map"), m);
             }),
      StatusIs(C::kDataLoss, AllOf(HasSubstr("'" + kW + ".nested_quant_map' in file '" + path_),
                                   HasSubstr("entry 200"), HasSubstr("create_dynamic_map"))));
}

TEST_F(MutatedTest, NonFiniteScalesAreNamed) {
  EXPECT_THAT(Import(kLlama, kW,
                     [&](RawTensors& t) { SetFloats(t.at(kW + ".nested_absmax"), {INFINITY}); }),
              StatusIs(C::kDataLoss, AllOf(HasSubstr("'" + kW + ".nested_absmax'"),
                                           HasSubstr("nested block 0"))));
  EXPECT_THAT(
      Import(kGpt2, kG,
             [&](RawTensors& t) {
               std::vector<float> a = AsFloats(t.at(kG + ".absmax"));
               a[17] = std::nanf("");
               SetFloats(t.at(kG + ".absmax"), a);
             }),
      StatusIs(C::kDataLoss, AllOf(HasSubstr("'" + kG + ".absmax'"), HasSubstr("block 17"))));
}

TEST(Quant4ImportTest, BlobOfTheWrongSizeIsRefused) {
  ASSERT_OK_AND_ASSIGN(ShardedSafetensors weights,
                       ShardedSafetensors::OpenDirectory(PrequantPath(kGpt2.dir)));
  const Quant4Format f{Quant4Type::kFp4, false, 63, 21, true};
  Blob blob(Quant4BlobLayoutOf(f).bytes + 16);
  EXPECT_THAT(ImportQuant4Weight(weights, kG, f, blob.span()),
              StatusIs(C::kInvalidArgument, HasSubstr("blob of")));
}

// A nested weight of more than 256 blocks (several nested blocks), written here with this
// project's codec: the import puts each section where Quant4TensorAt reads it.
TEST(Quant4ImportTest, SeveralNestedBlocksRoundTrip) {
  const Quant4Format f{Quant4Type::kNf4, true, 301, 63, false};  // 18963 values, 297 blocks
  const int64_t n = f.num_elems(), blocks = Quant4NumBlocks(n);
  std::vector<float> w(n);
  uint32_t s = 12345;
  for (float& x : w) {
    s = s * 1664525u + 1013904223u;
    x = (static_cast<float>(s >> 8) / 16777216.0f - 0.5f) * (1.0f + static_cast<float>(s % 7));
  }
  std::vector<uint8_t> codes(Quant4CodeBytes(n));
  std::vector<float> absmax(blocks);
  ASSERT_OK(Quantize4Bit(f.type, DType::kF32, w.data(), n, absl::MakeSpan(codes),
                         absl::MakeSpan(absmax), nullptr));
  std::vector<uint8_t> qcodes(blocks);
  std::vector<float> absmax2(Quant4NestedNumBlocks(blocks));
  float offset = 0;
  ASSERT_OK(QuantizeAbsmaxNested(absmax, absl::MakeSpan(qcodes), absl::MakeSpan(absmax2), &offset));
  ASSERT_EQ(absmax2.size(), 2u);
  RawTensors t;
  t["w"] = RawTensor{"U8", {Quant4CodeBytes(n), 1}, codes};
  t["w.absmax"] = RawTensor{"U8", {blocks}, qcodes};
  SetFloats(t["w.nested_absmax"], absmax2);
  t["w.nested_absmax"].dtype = "F32";
  SetFloats(t["w.quant_map"], {Quant4Levels(f.type), Quant4Levels(f.type) + 16});
  t["w.quant_map"].dtype = "F32";
  SetFloats(t["w.nested_quant_map"], {DynamicMap8(), DynamicMap8() + 256});
  t["w.nested_quant_map"].dtype = "F32";
  json state = {{"quant_type", "nf4"},
                {"blocksize", 64},
                {"dtype", "float16"},
                {"shape", {301, 63}},
                {"nested_blocksize", 256},
                {"nested_dtype", "float32"},
                {"nested_offset", static_cast<double>(offset)}};
  t["w.quant_state.bitsandbytes__nf4"] = RawTensor{"U8", {}, {}};
  SetQuantState(t["w.quant_state.bitsandbytes__nf4"], state.dump());
  const std::string dir = TmpDir("several_nested");
  WriteRaw(dir + "/model.safetensors", t);
  ASSERT_OK_AND_ASSIGN(ShardedSafetensors weights, ShardedSafetensors::OpenDirectory(dir));
  Blob blob(Quant4BlobLayoutOf(f).bytes);
  ASSERT_OK_AND_ASSIGN(Quant4Imported got, ImportQuant4Weight(weights, "w", f, blob.span()));
  EXPECT_EQ(Bits(got.nested_offset), Bits(offset));
  EXPECT_EQ(got.source_dtype, DType::kF16);
  const Quant4Tensor direct{f.type,         n,     codes.data(), nullptr, qcodes.data(),
                            absmax2.data(), offset};
  std::vector<float> want(n), out(n);
  ASSERT_OK(Dequantize4Bit(direct, 0, n, DType::kF32, want.data()));
  ASSERT_OK(Dequantize4Bit(Quant4TensorAt(f, blob.span().data(), got.nested_offset), 0, n,
                           DType::kF32, out.data()));
  EXPECT_EQ(std::memcmp(want.data(), out.data(), n * sizeof(float)), 0);
}

// ---------------------------------------------------------------------------------------------
// quantization_config
// ---------------------------------------------------------------------------------------------

absl::StatusOr<std::optional<Quant4Config>> FromText(const std::string& text) {
  return Quant4ConfigFromHfConfig(json::parse(text), "dir/config.json");
}

TEST(Quant4ConfigFromHfConfigTest, ReadsTheKeys) {
  EXPECT_THAT(FromText(R"({"model_type": "llama"})"), IsOkAndHolds(std::nullopt));
  EXPECT_THAT(FromText(R"({"quantization_config": null})"), IsOkAndHolds(std::nullopt));
  // Defaults: BitsAndBytesConfig's (fp4, no double quant, float32), quant_method implied.
  EXPECT_THAT(FromText(R"({"quantization_config": {"load_in_4bit": true}})"),
              IsOkAndHolds(Quant4Config{}));
  EXPECT_THAT(
      FromText(R"({"quantization_config": {"quant_method": "bitsandbytes", "_load_in_4bit": true,
           "bnb_4bit_quant_type": "nf4", "bnb_4bit_use_double_quant": true,
           "bnb_4bit_compute_dtype": "bfloat16", "bnb_4bit_quant_storage": "uint8",
           "llm_int8_skip_modules": ["lm_head", "mlp."], "llm_int8_threshold": 6.0,
           "llm_int8_has_fp16_weight": false, "llm_int8_enable_fp32_cpu_offload": true,
           "load_in_8bit": false, "_load_in_8bit": false}})"),
      IsOkAndHolds(Quant4Config{Quant4Type::kNf4, true, DType::kBF16, {"lm_head", "mlp."}}));
  EXPECT_THAT(FromText(R"({"quantization_config": {"load_in_4bit": true,
           "bnb_4bit_compute_dtype": "float16"}})"),
              IsOkAndHolds(Quant4Config{Quant4Type::kFp4, false, DType::kF16, {}}));
}

TEST(Quant4ConfigFromHfConfigTest, RefusalsNameTheKey) {
  struct Case {
    std::string q;
    C code;
    std::string message;
  };
  const std::vector<Case> cases = {
      {R"("yes")", C::kInvalidArgument, "quantization_config must be an object"},
      {R"({"quant_method": "gptq", "bits": 4})", C::kUnimplemented, "quantization_config.bits"},
      {R"({"quant_method": "gptq", "load_in_4bit": true})", C::kUnimplemented,
       "quantization_config.quant_method is \"gptq\""},
      {R"({"quant_method": "bitsandbytes", "load_in_8bit": true})", C::kUnimplemented,
       "quantization_config.load_in_8bit"},
      {R"({"_load_in_8bit": true})", C::kUnimplemented, "quantization_config.load_in_8bit"},
      {R"({"quant_method": "bitsandbytes"})", C::kInvalidArgument,
       "quantization_config.load_in_4bit is not true"},
      {R"({"load_in_4bit": false, "_load_in_4bit": true})", C::kInvalidArgument,
       "quantization_config.load_in_4bit is false but _load_in_4bit is true"},
      {R"({"load_in_4bit": 1})", C::kInvalidArgument,
       "quantization_config.load_in_4bit must be a boolean"},
      {R"({"load_in_4bit": true, "bnb_4bit_quant_type": "int4"})", C::kInvalidArgument,
       "quantization_config.bnb_4bit_quant_type is \"int4\""},
      {R"({"load_in_4bit": true, "bnb_4bit_quant_type": "NF4"})", C::kInvalidArgument,
       "bnb_4bit_quant_type"},
      {R"({"load_in_4bit": true, "bnb_4bit_use_double_quant": "true"})", C::kInvalidArgument,
       "quantization_config.bnb_4bit_use_double_quant must be a boolean"},
      {R"({"load_in_4bit": true, "bnb_4bit_compute_dtype": "float64"})", C::kInvalidArgument,
       "quantization_config.bnb_4bit_compute_dtype is \"float64\""},
      {R"({"load_in_4bit": true, "bnb_4bit_quant_storage": "bfloat16"})", C::kUnimplemented,
       "quantization_config.bnb_4bit_quant_storage is \"bfloat16\""},
      {R"({"load_in_4bit": true, "llm_int8_skip_modules": "lm_head"})", C::kInvalidArgument,
       "quantization_config.llm_int8_skip_modules must be a list"},
      {R"({"load_in_4bit": true, "llm_int8_skip_modules": ["a", 3]})", C::kInvalidArgument,
       "quantization_config.llm_int8_skip_modules entries must be strings"},
      {R"({"load_in_4bit": true, "llm_int8_threshold": "6"})", C::kInvalidArgument,
       "quantization_config.llm_int8_threshold"},
      {R"({"load_in_4bit": true, "llm_int8_has_fp16_weight": 0})", C::kInvalidArgument,
       "quantization_config.llm_int8_has_fp16_weight"},
      {R"({"load_in_4bit": true, "bnb_4bit_blocksize": 64})", C::kUnimplemented,
       "quantization_config.bnb_4bit_blocksize is not a key"},
  };
  for (const Case& c : cases) {
    SCOPED_TRACE(c.q);
    EXPECT_THAT(FromText(absl::StrCat(R"({"quantization_config": )", c.q, "}")),
                StatusIs(c.code, AllOf(HasSubstr("dir/config.json"), HasSubstr(c.message))));
  }
}


// HfCheckpoint::Open of a pre-quantized directory checks each 4-bit weight's tensors by name and
// shape: a missing state tensor is named as missing, a misshapen code tensor as wrong shape, a
// state tensor of no 4-bit weight as not a parameter; the unchanged copy opens.
TEST(PrequantizedHfCheckpoint, OpenNamesMissingMisshapenAndStrayState) {
  auto open = [](const std::function<void(RawTensors&)>& mutate) {
    RawTensors tensors = ReadAll(PrequantPath(kLlama.dir + "/model.safetensors"));
    mutate(tensors);
    const std::string dir = TmpDir("open");
    std::ofstream(dir + "/config.json") << ReadText(PrequantPath(kLlama.dir + "/config.json"));
    WriteRaw(dir + "/model.safetensors", tensors);
    return HfCheckpoint::Open(dir).status();
  };
  EXPECT_OK(open([](RawTensors&) {}));
  for (const std::string& key : {kW + ".absmax", kW + ".nested_quant_map", kQs}) {
    EXPECT_THAT(open([&](RawTensors& t) { t.erase(key); }),
                StatusIs(C::kInvalidArgument, AllOf(HasSubstr("missing: "), HasSubstr(key))));
  }
  EXPECT_THAT(open([&](RawTensors& t) { t.at(kW).shape = {t.at(kW).shape[0]}; }),
              StatusIs(C::kInvalidArgument, AllOf(HasSubstr("wrong shape: "), HasSubstr(kW))));
  EXPECT_THAT(open([&](RawTensors& t) { t.at(kW).dtype = "I8"; }),
              StatusIs(C::kInvalidArgument, AllOf(HasSubstr("wrong shape: "), HasSubstr("I8"))));
  const std::string stray = "model.norm.weight.absmax";
  EXPECT_THAT(open([&](RawTensors& t) { t[stray] = t.at(kW + ".absmax"); }),
              StatusIs(C::kInvalidArgument, AllOf(HasSubstr("not parameters"), HasSubstr(stray))));
}

}  // namespace
}  // namespace ps
