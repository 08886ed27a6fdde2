// Tests for model/safetensors.h: bit-exact round trips, compatibility with files written by the
// reference Python library (model/testdata/make_testdata.py), and rejection of malformed files
// with DataLoss errors that name the problem — never a crash (the suite runs under ASan/UBSan).
#include "model/safetensors.h"

#include <dirent.h>
#include <sys/stat.h>

#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <random>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "base/testing/status_matchers.h"
#include "base/testing/test_rng.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "memory/dtype.h"
#include "memory/dtype_math.h"

namespace ps {
namespace {

using ::testing::AllOf;
using ::testing::ElementsAre;
using ::testing::HasSubstr;
using ::testing::IsEmpty;

std::string TmpPath(const std::string& name) {
  const char* dir = std::getenv("TEST_TMPDIR");
  return absl::StrCat(dir != nullptr ? dir : "/tmp", "/", name);
}

std::string TestDataPath(const std::string& name) {
  const char* dir = std::getenv("TEST_SRCDIR");
  return absl::StrCat(dir != nullptr ? dir : ".", "/patrickstar_cc/model/testdata/", name);
}

void WriteRawFile(const std::string& path, const std::string& bytes) {
  std::ofstream out(path, std::ios::binary | std::ios::trunc);
  out.write(bytes.data(), static_cast<std::streamsize>(bytes.size()));
  ASSERT_TRUE(out.good()) << path;
}

std::string ReadRawFile(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  return std::string(std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>());
}

// A file image: 8-byte little-endian length of `header`, `header`, `buffer`.
std::string Image(const std::string& header, const std::string& buffer) {
  std::string out(8, '\0');
  const uint64_t n = header.size();
  std::memcpy(out.data(), &n, 8);
  return out + header + buffer;
}

// Writes Image(header, buffer) and opens it.
absl::StatusOr<SafetensorsFile> OpenImage(const std::string& name, const std::string& header,
                                          const std::string& buffer) {
  const std::string path = TmpPath(name);
  WriteRawFile(path, Image(header, buffer));
  return SafetensorsFile::Open(path);
}

std::vector<uint8_t> RandomBytes(size_t n, uint32_t seed) {
  TestRng rng(seed);
  std::vector<uint8_t> out(n);
  for (uint8_t& b : out) b = static_cast<uint8_t>(rng());
  return out;
}

std::vector<std::string> ListDir(const std::string& dir) {
  std::vector<std::string> names;
  DIR* d = opendir(dir.c_str());
  if (d == nullptr) return names;
  while (dirent* e = readdir(d)) {
    const std::string n = e->d_name;
    if (n != "." && n != "..") names.push_back(n);
  }
  closedir(d);
  return names;
}

// ---------------------------------------------------------------------------------------------
// Round trips.

struct TestTensor {
  SafetensorsTensorSpec spec;
  std::vector<uint8_t> bytes;
};

std::vector<TestTensor> OddTensors() {
  std::vector<TestTensor> tensors;
  uint32_t seed = 1;
  for (DType dtype : {DType::kF32, DType::kF16, DType::kBF16}) {
    const std::string d(DTypeName(dtype));
    for (const std::vector<int64_t>& shape : std::vector<std::vector<int64_t>>{
             {}, {0}, {3, 0, 2}, {7}, {2, 3, 5}, {1, 1, 1, 1}, {13, 3}}) {
      int64_t numel = 1;
      for (int64_t s : shape) numel *= s;
      TestTensor t;
      t.spec.name = absl::StrCat(d, "/rank", shape.size(), "_n", numel, "_", seed);
      t.spec.dtype = dtype;
      t.spec.shape = shape;
      // Random bits: NaN payloads, signaling NaNs, subnormals and Infs must all survive.
      t.bytes = RandomBytes(static_cast<size_t>(numel * SizeOf(dtype)), seed++);
      tensors.push_back(std::move(t));
    }
  }
  return tensors;
}

TEST(SafetensorsTest, RoundTripIsBitExactForAllDTypesAndOddShapes) {
  const std::vector<TestTensor> tensors = OddTensors();
  std::vector<SafetensorsTensorData> data;
  for (const TestTensor& t : tensors) data.push_back({t.spec, absl::MakeConstSpan(t.bytes)});
  const std::map<std::string, std::string> metadata = {{"format", "pt"}, {"note", "h\xC3\xA9llo"}};
  const std::string path = TmpPath("round_trip.safetensors");
  ASSERT_OK(WriteSafetensors(path, data, metadata));

  ASSERT_OK_AND_ASSIGN(SafetensorsFile file, SafetensorsFile::Open(path));
  EXPECT_EQ(file.metadata(), metadata);
  ASSERT_EQ(file.tensors().size(), tensors.size());
  for (const TestTensor& t : tensors) {
    SCOPED_TRACE(t.spec.name);
    ASSERT_OK_AND_ASSIGN(const SafetensorsTensorView view, file.Get(t.spec.name));
    EXPECT_EQ(view.dtype, t.spec.dtype);
    EXPECT_EQ(view.info->dtype_name, SafetensorsDTypeName(t.spec.dtype));
    EXPECT_EQ(view.info->shape, t.spec.shape);
    EXPECT_EQ(view.info->num_elements * SizeOf(t.spec.dtype), static_cast<int64_t>(t.bytes.size()));
    EXPECT_EQ(std::vector<uint8_t>(view.bytes.begin(), view.bytes.end()), t.bytes);
    // The writer aligns every tensor to its element size within the mapping.
    EXPECT_EQ(reinterpret_cast<uintptr_t>(view.bytes.data()) % SizeOf(t.spec.dtype), 0u);
  }
  // Tensors are listed by name.
  for (size_t i = 1; i < file.tensors().size(); ++i) {
    EXPECT_LT(file.tensors()[i - 1].name, file.tensors()[i].name);
  }
}

TEST(SafetensorsTest, WrittenHeaderIsPaddedSortedAndStartsWithBrace) {
  const std::vector<float> a = {1.0f, 2.0f, 3.0f};
  const std::vector<uint16_t> b = {0x3C00};
  const std::string path = TmpPath("layout.safetensors");
  ASSERT_OK(WriteSafetensors(
      path,
      {SafetensorsTensorData{{"zeta", DType::kF16, {1}},
                             absl::MakeConstSpan(reinterpret_cast<const uint8_t*>(b.data()), 2)},
       SafetensorsTensorData{{"alpha", DType::kF32, {3}},
                             absl::MakeConstSpan(reinterpret_cast<const uint8_t*>(a.data()), 12)}},
      {}));
  const std::string raw = ReadRawFile(path);
  ASSERT_GE(raw.size(), 8u);
  uint64_t n;
  std::memcpy(&n, raw.data(), 8);
  EXPECT_EQ(n % 8, 0u);
  const std::string header = raw.substr(8, n);
  EXPECT_EQ(header[0], '{');
  EXPECT_EQ(header.find("__metadata__"), std::string::npos);  // omitted when empty
  EXPECT_LT(header.find("\"alpha\""), header.find("\"zeta\""));
  EXPECT_EQ(raw.size(), 8 + n + 12 + 2);
  // Only spaces after the closing brace.
  const size_t close = header.rfind('}');
  EXPECT_EQ(header.find_first_not_of(' ', close + 1), std::string::npos);
}

TEST(SafetensorsTest, ReadAsF32ConvertsExactly) {
  const std::vector<uint16_t> half = {0x3C00, 0xC000, 0x7BFF, 0x0001, 0x7C00, 0x8000};
  const std::vector<uint16_t> bf = {0x3F80, 0xC000, 0x4049, 0x0001, 0xFF80, 0x7F7F};
  const std::vector<float> f = {1.5f, -0.0f};
  auto span = [](const auto& v) {
    return absl::MakeConstSpan(reinterpret_cast<const uint8_t*>(v.data()), v.size() * sizeof(v[0]));
  };
  const std::string path = TmpPath("convert.safetensors");
  ASSERT_OK(WriteSafetensors(path,
                             {SafetensorsTensorData{{"h", DType::kF16, {2, 3}}, span(half)},
                              SafetensorsTensorData{{"b", DType::kBF16, {6}}, span(bf)},
                              SafetensorsTensorData{{"f", DType::kF32, {2}}, span(f)}},
                             {}));
  ASSERT_OK_AND_ASSIGN(SafetensorsFile file, SafetensorsFile::Open(path));
  ASSERT_OK_AND_ASSIGN(const std::vector<float> h32, file.ReadAsF32("h"));
  ASSERT_OK_AND_ASSIGN(const std::vector<float> b32, file.ReadAsF32("b"));
  ASSERT_OK_AND_ASSIGN(const std::vector<float> f32, file.ReadAsF32("f"));
  for (size_t i = 0; i < half.size(); ++i) {
    const float want = HalfBitsToFloat(half[i]);
    EXPECT_EQ(std::memcmp(&h32[i], &want, 4), 0) << i;
  }
  for (size_t i = 0; i < bf.size(); ++i) {
    const float want = BFloat16BitsToFloat(bf[i]);
    EXPECT_EQ(std::memcmp(&b32[i], &want, 4), 0) << i;
  }
  EXPECT_EQ(std::memcmp(f32.data(), f.data(), 8), 0);

  std::vector<float> wrong(5);
  EXPECT_THAT(file.ReadAsF32("h", absl::MakeSpan(wrong)),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("'h' has 6 elements")));
  EXPECT_THAT(file.ReadAsF32("nope"), StatusIs(absl::StatusCode::kNotFound, HasSubstr("'nope'")));

  // Element ranges.
  std::vector<float> part(3);
  ASSERT_OK(file.ReadAsF32("b", 2, absl::MakeSpan(part)));
  EXPECT_EQ(std::memcmp(part.data(), &b32[2], 12), 0);
  ASSERT_OK(file.ReadAsF32("f", 1, absl::MakeSpan(part).subspan(0, 1)));
  EXPECT_EQ(std::memcmp(part.data(), &f32[1], 4), 0);
  EXPECT_OK(file.ReadAsF32("h", 6, absl::Span<float>()));
  EXPECT_THAT(
      file.ReadAsF32("h", 4, absl::MakeSpan(part)),
      StatusIs(absl::StatusCode::kInvalidArgument, "elements [4, 7) are outside tensor 'h'"));
  EXPECT_THAT(file.ReadAsF32("h", -1, absl::MakeSpan(part)),
              StatusIs(absl::StatusCode::kInvalidArgument, "outside"));
}

TEST(SafetensorsTest, ReadsUnalignedHalfTensors) {
  // A header of odd length puts the F16 data at an odd address, as some writers (MLX) do.
  std::string header = R"({"x":{"dtype":"F16","shape":[2],"data_offsets":[0,4]}})";
  if (header.size() % 2 == 0) header += ' ';
  const uint16_t bits[2] = {0x3C00, 0xC200};
  std::string buffer(reinterpret_cast<const char*>(bits), 4);
  ASSERT_OK_AND_ASSIGN(SafetensorsFile file, OpenImage("unaligned.safetensors", header, buffer));
  EXPECT_THAT(file.ReadAsF32("x"), IsOkAndHolds(ElementsAre(1.0f, -3.0f)));
}

TEST(SafetensorsTest, WriteReplacesExistingFileAtomicallyAndLeavesNoTemporaries) {
  const std::string dir = TmpPath("atomic");
  ASSERT_EQ(mkdir(dir.c_str(), 0755), 0);
  const std::string path = dir + "/m.safetensors";
  WriteRawFile(path, "old contents");
  const std::vector<float> v = {4.0f};
  const auto bytes = absl::MakeConstSpan(reinterpret_cast<const uint8_t*>(v.data()), 4);
  ASSERT_OK(WriteSafetensors(path, {SafetensorsTensorData{{"v", DType::kF32, {1}}, bytes}}, {}));
  EXPECT_THAT(ListDir(dir), ElementsAre("m.safetensors"));
  ASSERT_OK_AND_ASSIGN(SafetensorsFile file, SafetensorsFile::Open(path));
  EXPECT_THAT(file.ReadAsF32("v"), IsOkAndHolds(ElementsAre(4.0f)));

  // A failing producer aborts the write: the old file stays, the temporary is removed.
  const std::string before = ReadRawFile(path);
  const SafetensorsTensorSpec spec{"w", DType::kF32, {2}};
  EXPECT_THAT(WriteSafetensors(path, {&spec, 1}, {},
                               [](size_t, absl::Span<uint8_t>) {
                                 return absl::InternalError("producer failed");
                               }),
              StatusIs(absl::StatusCode::kInternal, "producer failed"));
  EXPECT_EQ(ReadRawFile(path), before);
  EXPECT_THAT(ListDir(dir), ElementsAre("m.safetensors"));
}

TEST(SafetensorsTest, WriterRejectsBadSpecs) {
  const std::string path = TmpPath("bad_spec.safetensors");
  const std::vector<uint8_t> four(4);
  const auto b4 = absl::MakeConstSpan(four);
  auto write = [&](std::vector<SafetensorsTensorData> t,
                   std::map<std::string, std::string> metadata = {}) {
    return WriteSafetensors(path, t, metadata);
  };
  EXPECT_THAT(write({{{"a", DType::kF32, {1}}, b4}, {{"a", DType::kF32, {1}}, b4}}),
              StatusIs(absl::StatusCode::kInvalidArgument, "'a' appears more than once"));
  EXPECT_THAT(write({{{"", DType::kF32, {1}}, b4}}),
              StatusIs(absl::StatusCode::kInvalidArgument, "empty name"));
  EXPECT_THAT(write({{{"__metadata__", DType::kF32, {1}}, b4}}),
              StatusIs(absl::StatusCode::kInvalidArgument, "reserved"));
  EXPECT_THAT(write({{{"neg", DType::kF32, {-1}}, b4}}),
              StatusIs(absl::StatusCode::kInvalidArgument, "'neg' shape [-1]"));
  EXPECT_THAT(write({{{"big", DType::kF32, {int64_t{1} << 40, int64_t{1} << 40}}, b4}}),
              StatusIs(absl::StatusCode::kInvalidArgument, "'big'"));
  EXPECT_THAT(write({{{"short", DType::kF32, {2}}, b4}}),
              StatusIs(absl::StatusCode::kInvalidArgument,
                       AllOf(HasSubstr("'short'"), HasSubstr("8 bytes) but 4 bytes"))));
  EXPECT_THAT(write({{{"bad\xFFutf8", DType::kF32, {1}}, b4}}),
              StatusIs(absl::StatusCode::kInvalidArgument, "not UTF-8"));
  EXPECT_THAT(write({{{"ok", DType::kF32, {1}}, b4}}, {{"k", "\xC0\x80"}}),
              StatusIs(absl::StatusCode::kInvalidArgument, "UTF-8"));
  EXPECT_THAT(WriteSafetensors(TmpPath("no/such/dir/x.safetensors"),
                               std::vector<SafetensorsTensorData>{}, {}),
              StatusIs(absl::StatusCode::kNotFound, "no/such/dir/x.safetensors"));
  // Nothing was left behind by the rejected writes.
  EXPECT_NE(access(path.c_str(), F_OK), 0);
}

TEST(SafetensorsTest, EmptyFileWithOnlyMetadataRoundTrips) {
  const std::string path = TmpPath("empty.safetensors");
  ASSERT_OK(WriteSafetensors(path, std::vector<SafetensorsTensorData>{}, {{"k", "v"}}));
  ASSERT_OK_AND_ASSIGN(SafetensorsFile file, SafetensorsFile::Open(path));
  EXPECT_THAT(file.tensors(), IsEmpty());
  EXPECT_EQ(file.metadata().at("k"), "v");
}

// Writing in pieces gives the same bytes as writing whole tensors, asks for consecutive element
// ranges no larger than the limit, and calls once for a zero-size tensor.
TEST(SafetensorsTest, PiecewiseWriteEqualsWholeWrite) {
  const std::vector<SafetensorsTensorSpec> specs = {{"a", DType::kF32, {3, 7}},
                                                    {"b", DType::kBF16, {13}},
                                                    {"c", DType::kF16, {0, 4}},
                                                    {"d", DType::kF32, {}}};
  // Element e of tensor t has bytes derived from (t, e, byte), independent of how it is asked for.
  auto byte_of = [](size_t t, int64_t e, int64_t b) {
    return static_cast<uint8_t>(t * 31 + e * 7 + b * 3 + 1);
  };
  ASSERT_OK(WriteSafetensors(
      TmpPath("whole.safetensors"), specs, {{"k", "v"}}, [&](size_t t, absl::Span<uint8_t> dst) {
        const int64_t es = SizeOf(specs[t].dtype);
        for (size_t i = 0; i < dst.size(); ++i) {
          dst[i] = byte_of(t, static_cast<int64_t>(i) / es, static_cast<int64_t>(i) % es);
        }
        return absl::OkStatus();
      }));
  for (const int64_t piece_bytes : {1, 5, 8, 12, 1000}) {
    std::vector<int64_t> next(specs.size(), 0);
    std::vector<int> calls(specs.size(), 0);
    const std::string path = TmpPath(absl::StrCat("pieces", piece_bytes, ".safetensors"));
    ASSERT_OK(WriteSafetensorsInPieces(
        path, specs, {{"k", "v"}},
        [&](size_t t, int64_t first, absl::Span<uint8_t> dst) {
          const int64_t es = SizeOf(specs[t].dtype);
          EXPECT_EQ(first, next[t]) << "pieces of tensor " << t << " out of order";
          EXPECT_LE(static_cast<int64_t>(dst.size()), std::max(piece_bytes, es));
          EXPECT_EQ(static_cast<int64_t>(dst.size()) % es, 0);
          for (size_t i = 0; i < dst.size(); ++i) {
            dst[i] = byte_of(t, first + static_cast<int64_t>(i) / es, static_cast<int64_t>(i) % es);
          }
          next[t] += static_cast<int64_t>(dst.size()) / es;
          ++calls[t];
          return absl::OkStatus();
        },
        piece_bytes));
    EXPECT_EQ(ReadRawFile(path), ReadRawFile(TmpPath("whole.safetensors"))) << piece_bytes;
    EXPECT_EQ(calls[2], 1);  // the zero-size tensor
  }
  EXPECT_THAT(WriteSafetensorsInPieces(
                  TmpPath("bad.safetensors"), specs, {},
                  [](size_t, int64_t, absl::Span<uint8_t>) { return absl::OkStatus(); }, 0),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("max_piece_bytes")));
}

// ---------------------------------------------------------------------------------------------
// Files written by the reference implementation (Python safetensors 0.8.0).

TEST(SafetensorsTest, ReadsFileWrittenByPythonLibrary) {
  ASSERT_OK_AND_ASSIGN(SafetensorsFile file,
                       SafetensorsFile::Open(TestDataPath("python_reference.safetensors")));
  EXPECT_EQ(file.metadata().at("format"), "pt");
  EXPECT_EQ(file.metadata().at("source"), "make_testdata.py");
  EXPECT_EQ(file.tensors().size(), 7u);

  EXPECT_THAT(file.ReadAsF32("a_f32"),
              IsOkAndHolds(ElementsAre(-1.0f, -0.5f, 0.0f, 0.5f, 1.0f, 1.5f)));
  EXPECT_THAT(file.Find("a_f32")->shape, ElementsAre(2, 3));
  ASSERT_OK_AND_ASSIGN(const SafetensorsTensorView b, file.Get("b_f16"));
  EXPECT_EQ(b.dtype, DType::kF16);
  ASSERT_OK_AND_ASSIGN(const std::vector<float> b32, file.ReadAsF32("b_f16"));
  EXPECT_THAT(b32, ElementsAre(1.0f, -2.0f, 0.5f, 65504.0f, 0.0f));
  EXPECT_TRUE(std::signbit(b32[4]));
  ASSERT_OK_AND_ASSIGN(const SafetensorsTensorView c, file.Get("c_bf16"));
  EXPECT_EQ(c.dtype, DType::kBF16);
  EXPECT_THAT(c.info->shape, ElementsAre(2, 2));
  EXPECT_THAT(file.ReadAsF32("c_bf16"),
              IsOkAndHolds(ElementsAre(1.0f, -2.0f, 3.140625f, BFloat16BitsToFloat(1))));
  EXPECT_THAT(file.Find("d_scalar")->shape, IsEmpty());
  EXPECT_THAT(file.ReadAsF32("d_scalar"), IsOkAndHolds(ElementsAre(3.25f)));
  EXPECT_THAT(file.Find("e_empty")->shape, ElementsAre(0, 3));
  EXPECT_THAT(file.ReadAsF32("e_empty"), IsOkAndHolds(IsEmpty()));
  EXPECT_THAT(file.ReadAsF32("g_3d"), IsOkAndHolds(ElementsAre(0, 1, 2, 3, 4, 5)));
  EXPECT_THAT(file.Find("g_3d")->shape, ElementsAre(2, 1, 3));

  // I64 is recognized (the file opens, its bytes are reachable) but not a supported dtype.
  const SafetensorsTensorInfo* i64 = file.Find("f_i64");
  ASSERT_NE(i64, nullptr);
  EXPECT_EQ(i64->dtype_name, "I64");
  EXPECT_FALSE(i64->dtype.has_value());
  const absl::Span<const uint8_t> raw = file.Bytes(*i64);
  ASSERT_EQ(raw.size(), 24u);
  int64_t values[3];
  std::memcpy(values, raw.data(), 24);
  EXPECT_THAT(values, ElementsAre(1, 2, 3));
  EXPECT_THAT(file.Get("f_i64"),
              StatusIs(absl::StatusCode::kUnimplemented,
                       AllOf(HasSubstr("'f_i64'"), HasSubstr("I64"), HasSubstr("not supported"))));
}

// ---------------------------------------------------------------------------------------------
// Malformed files.

constexpr absl::StatusCode kDataLoss = absl::StatusCode::kDataLoss;

TEST(SafetensorsCorruptionTest, MissingFileIsNotFound) {
  EXPECT_THAT(SafetensorsFile::Open(TmpPath("does_not_exist.safetensors")),
              StatusIs(absl::StatusCode::kNotFound, HasSubstr("does_not_exist.safetensors")));
}

TEST(SafetensorsCorruptionTest, DirectoryIsRejected) {
  const char* dir = std::getenv("TEST_TMPDIR");
  ASSERT_NE(dir, nullptr);
  EXPECT_THAT(SafetensorsFile::Open(dir),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("not a regular file")));
}

TEST(SafetensorsCorruptionTest, TooShortForTheLengthField) {
  for (size_t n : {0, 1, 7}) {
    const std::string path = TmpPath(absl::StrCat("short", n, ".safetensors"));
    WriteRawFile(path, std::string(n, '\x01'));
    EXPECT_THAT(SafetensorsFile::Open(path),
                StatusIs(kDataLoss, AllOf(HasSubstr(path), HasSubstr("8-byte header length"))));
  }
}

TEST(SafetensorsCorruptionTest, HeaderLengthBeyondFileOrLimit) {
  const std::string header = R"({"a":{"dtype":"F32","shape":[1],"data_offsets":[0,4]}})";
  std::string image = Image(header, std::string(4, '\0'));
  uint64_t n = image.size();  // more than what follows the length field
  std::memcpy(image.data(), &n, 8);
  const std::string path = TmpPath("long_header.safetensors");
  WriteRawFile(path, image);
  EXPECT_THAT(SafetensorsFile::Open(path),
              StatusIs(kDataLoss, AllOf(HasSubstr("header length"), HasSubstr("truncated"))));

  n = ~uint64_t{0};
  std::memcpy(image.data(), &n, 8);
  WriteRawFile(path, image);
  EXPECT_THAT(SafetensorsFile::Open(path), StatusIs(kDataLoss, HasSubstr("-byte limit")));
}

TEST(SafetensorsCorruptionTest, EveryTruncationIsRejected) {
  const std::vector<TestTensor> tensors = OddTensors();
  std::vector<SafetensorsTensorData> data;
  for (const TestTensor& t : tensors) data.push_back({t.spec, absl::MakeConstSpan(t.bytes)});
  const std::string full_path = TmpPath("full.safetensors");
  ASSERT_OK(WriteSafetensors(full_path, data, {{"format", "pt"}}));
  const std::string full = ReadRawFile(full_path);
  const std::string path = TmpPath("truncated.safetensors");
  for (size_t len = 0; len < full.size(); ++len) {
    WriteRawFile(path, full.substr(0, len));
    const auto file = SafetensorsFile::Open(path);
    ASSERT_THAT(file, StatusIs(kDataLoss)) << "truncated to " << len << " of " << full.size();
  }
  // Truncation inside the data buffer names the tensor that runs past the end.
  WriteRawFile(path, full.substr(0, full.size() - 1));
  EXPECT_THAT(SafetensorsFile::Open(path),
              StatusIs(kDataLoss, AllOf(HasSubstr("tensor '"), HasSubstr("truncated"))));
}

TEST(SafetensorsCorruptionTest, HeaderMustBeAJsonObject) {
  EXPECT_THAT(OpenImage("json1.safetensors", R"({"a": {"dtype": "F32", )", ""),
              StatusIs(kDataLoss, HasSubstr("not valid JSON")));
  EXPECT_THAT(OpenImage("json2.safetensors", "[1, 2]", ""),
              StatusIs(kDataLoss, HasSubstr("does not start with '{'")));
  EXPECT_THAT(OpenImage("json3.safetensors", " {}", ""),
              StatusIs(kDataLoss, HasSubstr("does not start with '{'")));
  EXPECT_THAT(OpenImage("json4.safetensors", "", ""),
              StatusIs(kDataLoss, HasSubstr("does not start with '{'")));
  EXPECT_THAT(OpenImage("json5.safetensors", "{\"a\xFF\": 1}", ""),
              StatusIs(kDataLoss, HasSubstr("UTF-8")));
  EXPECT_THAT(OpenImage("json6.safetensors", "{} {}", ""),
              StatusIs(kDataLoss, HasSubstr("not valid JSON")));
  // Padding with spaces (and other JSON whitespace) is fine; so is an empty object.
  EXPECT_OK(OpenImage("json7.safetensors", "{}      ", ""));
}

TEST(SafetensorsCorruptionTest, BadTensorEntriesNameTheTensor) {
  struct Case {
    std::string header;
    std::string buffer;
    std::string expected;
  };
  const std::string four(4, '\0');
  const std::vector<Case> cases = {
      {R"({"t":{"dtype":"Q8","shape":[4],"data_offsets":[0,4]}})", four,
       "tensor 't': unknown dtype \"Q8\""},
      {R"({"t":{"dtype":7,"shape":[1],"data_offsets":[0,4]}})", four,
       "tensor 't': missing or non-string \"dtype\""},
      {R"({"t":{"shape":[1],"data_offsets":[0,4]}})", four, "tensor 't': missing or non-string"},
      {R"({"t":{"dtype":"F32","data_offsets":[0,4]}})", four, "tensor 't': missing \"shape\""},
      {R"({"t":{"dtype":"F32","shape":[1]}})", four, "tensor 't': missing \"data_offsets\""},
      {R"({"t":{"dtype":"F32","shape":[1],"data_offsets":[0]}})", four,
       "tensor 't': missing \"data_offsets\""},
      {R"({"t":[1,2]})", four, "tensor 't': header entry is not a JSON object"},
      {R"({"t":{"dtype":"F32","shape":[-1],"data_offsets":[0,4]}})", four,
       "tensor 't': shape [-1] has a dimension that is not a non-negative integer"},
      {R"({"t":{"dtype":"F32","shape":[1.5],"data_offsets":[0,4]}})", four,
       "tensor 't': shape [1.5]"},
      {R"({"t":{"dtype":"F32","shape":["1"],"data_offsets":[0,4]}})", four, "tensor 't': shape"},
      {R"({"t":{"dtype":"F32","shape":[9223372036854775808],"data_offsets":[0,4]}})", four,
       "tensor 't': shape"},
      {R"({"t":{"dtype":"F32","shape":[4294967296,4294967296],"data_offsets":[0,4]}})", four,
       "tensor 't': shape [4294967296, 4294967296] of F32 overflows"},
      {R"({"t":{"dtype":"F32","shape":[2],"data_offsets":[0,4]}})", four,
       "tensor 't': shape [2] of F32 needs 8 bytes but data_offsets [0, 4] hold 4"},
      {R"({"t":{"dtype":"F32","shape":[1],"data_offsets":[-4,4]}})", four,
       "tensor 't': data_offsets [-4,4] are not non-negative integers"},
      {R"({"t":{"dtype":"F32","shape":[1],"data_offsets":[4,0]}})", four,
       "tensor 't': data_offsets [4, 0] have begin > end"},
      {R"({"t":{"dtype":"F32","shape":[1],"data_offsets":[4,8]}})", four,
       "tensor 't': data_offsets [4, 8] extend past the end of the data buffer (4 bytes)"},
      {R"({"a":{"dtype":"F32","shape":[1],"data_offsets":[0,4]},)"
       R"("b":{"dtype":"F32","shape":[1],"data_offsets":[2,6]}})",
       std::string(6, '\0'), "tensor 'b' data_offsets [2, 6] overlap tensor 'a' [0, 4]"},
      {R"({"a":{"dtype":"F32","shape":[1],"data_offsets":[0,4]},)"
       R"("b":{"dtype":"F32","shape":[1],"data_offsets":[0,4]}})",
       four, "overlap tensor"},
      {R"({"a":{"dtype":"F32","shape":[1],"data_offsets":[0,4]},)"
       R"("b":{"dtype":"F32","shape":[1],"data_offsets":[8,12]}})",
       std::string(12, '\0'),
       "bytes [4, 8) of the data buffer belong to no tensor (gap before tensor 'b')"},
      {R"({"a":{"dtype":"F32","shape":[1],"data_offsets":[4,8]}})", std::string(8, '\0'),
       "bytes [0, 4) of the data buffer belong to no tensor (gap before tensor 'a')"},
      {R"({"a":{"dtype":"F32","shape":[1],"data_offsets":[0,4]}})", std::string(6, '\0'),
       "the data buffer has 6 bytes but the tensors cover only the first 4"},
      {R"({"a":{"dtype":"F32","shape":[1],"data_offsets":[0,4]},)"
       R"("a":{"dtype":"F32","shape":[1],"data_offsets":[0,4]}})",
       four, "names tensor 'a' more than once"},
      {R"({"__metadata__":{"k":1}})", "", "\"__metadata__\" value of key 'k' is not a string"},
      {R"({"__metadata__":"pt"})", "", "\"__metadata__\" is not a JSON object"},
  };
  int i = 0;
  for (const Case& c : cases) {
    SCOPED_TRACE(c.header);
    const std::string name = absl::StrCat("entry", i++, ".safetensors");
    EXPECT_THAT(OpenImage(name, c.header, c.buffer),
                StatusIs(kDataLoss, AllOf(HasSubstr(name), HasSubstr(c.expected))));
  }
}

TEST(SafetensorsCorruptionTest, PackedSubByteDTypesAreUnimplemented) {
  EXPECT_THAT(
      OpenImage("f4.safetensors", R"({"t":{"dtype":"F4","shape":[8],"data_offsets":[0,4]}})",
                std::string(4, '\0')),
      StatusIs(absl::StatusCode::kUnimplemented,
               AllOf(HasSubstr("f4.safetensors"), HasSubstr("tensor 't'"),
                     HasSubstr("packed sub-byte dtype F4"))));
}

TEST(SafetensorsCorruptionTest, ZeroSizeTensorsMayShareAnOffset) {
  ASSERT_OK_AND_ASSIGN(SafetensorsFile file,
                       OpenImage("zeros.safetensors",
                                 R"({"a":{"dtype":"F32","shape":[0],"data_offsets":[0,0]},)"
                                 R"("b":{"dtype":"BF16","shape":[2,0],"data_offsets":[0,0]},)"
                                 R"("c":{"dtype":"U8","shape":[3],"data_offsets":[0,3]},)"
                                 R"("d":{"dtype":"F16","shape":[0],"data_offsets":[3,3]}})",
                                 "xyz"));
  EXPECT_EQ(file.tensors().size(), 4u);
  EXPECT_THAT(file.Get("c"), StatusIs(absl::StatusCode::kUnimplemented, "U8"));
}

TEST(SafetensorsCorruptionTest, RandomByteFlipsNeverCrash) {
  const std::vector<TestTensor> tensors = OddTensors();
  std::vector<SafetensorsTensorData> data;
  for (const TestTensor& t : tensors) data.push_back({t.spec, absl::MakeConstSpan(t.bytes)});
  const std::string full_path = TmpPath("fuzz_base.safetensors");
  ASSERT_OK(WriteSafetensors(full_path, data, {{"format", "pt"}}));
  const std::string full = ReadRawFile(full_path);
  uint64_t header_size;
  std::memcpy(&header_size, full.data(), 8);
  TestRng rng(42);
  const std::string path = TmpPath("fuzz.safetensors");
  int opened = 0;
  for (int iter = 0; iter < 600; ++iter) {
    std::string mutated = full;
    const int flips = 1 + static_cast<int>(rng() % 3);
    for (int k = 0; k < flips; ++k) {
      // Mostly inside the length field and the header, where the structure lives.
      const size_t pos = rng() % (8 + header_size);
      mutated[pos] = static_cast<char>(rng());
    }
    WriteRawFile(path, mutated);
    absl::StatusOr<SafetensorsFile> file = SafetensorsFile::Open(path);
    if (!file.ok()) {
      EXPECT_THAT(file, StatusIs(kDataLoss)) << file.status();
      continue;
    }
    ++opened;
    // Whatever opened must be internally consistent and readable end to end.
    for (const SafetensorsTensorInfo& t : file->tensors()) {
      const absl::Span<const uint8_t> bytes = file->Bytes(t);
      ASSERT_EQ(static_cast<int64_t>(bytes.size()), t.num_elements * t.element_size_bytes);
      if (t.dtype.has_value()) {
        EXPECT_OK(file->ReadAsF32(t.name).status());
      }
    }
  }
  SUCCEED() << opened << " mutants still opened";
}

}  // namespace
}  // namespace ps
