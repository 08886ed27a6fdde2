// The masked attention, RoPE with position ids and GPT-2's learned positions with position ids,
// against an independent implementation: torch's masked softmax / scaled_dot_product_attention
// with a boolean block-causal (+ window) mask built from document boundaries, transformers'
// LlamaRotaryEmbedding + apply_rotary_pos_emb with position_ids, and torch indexing/index_add.
// The vectors are testdata/masked_attention_vectors.safetensors, written by
// testdata/make_masked_attention_vectors.py (its docstring names the versions and the tensors).
#include <cmath>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/types/span.h"
#include "base/testing/status_matchers.h"
#include "base/thread_pool.h"
#include "gtest/gtest.h"
#include "model/kernels/gqa_attention.h"
#include "model/kernels/rope.h"
#include "model/kernels/testing/kernel_test_util.h"
#include "model/kernels/vocab_blocks.h"
#include "model/safetensors.h"

namespace ps {
namespace {

using ::ps::kernel_testing::ExpectAllNear;

std::string VectorsPath() {
  const char* dir = std::getenv("TEST_SRCDIR");
  return absl::StrCat(
      dir != nullptr ? dir : ".",
      "/patrickstar_cc/model/kernels/testdata/masked_attention_vectors.safetensors");
}

// A tensor copied out of the file as `dtype` (the file's dtype name must match).
template <typename E>
std::vector<E> Read(const SafetensorsFile& file, const std::string& name,
                    const std::string& dtype) {
  const SafetensorsTensorInfo* info = file.Find(name);
  if (info == nullptr) {
    ADD_FAILURE() << name << " missing from " << file.path();
    return {};
  }
  EXPECT_EQ(info->dtype_name, dtype) << name;
  std::vector<E> out(info->num_elements);
  const absl::Span<const uint8_t> bytes = file.Bytes(*info);
  EXPECT_EQ(bytes.size(), out.size() * sizeof(E)) << name;
  std::memcpy(out.data(), bytes.data(), std::min(bytes.size(), out.size() * sizeof(E)));
  return out;
}

template <typename T>
std::vector<T> Cast(const std::vector<double>& x) {
  return std::vector<T>(x.begin(), x.end());
}

class MaskedAttentionVectorsTest : public ::testing::Test {
 protected:
  void SetUp() override {
    absl::StatusOr<SafetensorsFile> file = SafetensorsFile::Open(VectorsPath());
    ASSERT_OK(file.status());
    file_ = std::make_unique<SafetensorsFile>(*std::move(file));
  }
  std::unique_ptr<SafetensorsFile> file_;
};

// Runs case `name` in precision T and compares every output with the given tolerances.
template <typename T>
void CheckAttentionCase(const SafetensorsFile& file, const std::string& name, double atol,
                        double rtol, ThreadPool* pool) {
  SCOPED_TRACE(name);
  const std::vector<int64_t> dims = Read<int64_t>(file, name + ".shape", "I64");
  ASSERT_EQ(dims.size(), 6u);
  const GqaAttentionShape s{.batch = dims[0],
                            .seq_len = dims[1],
                            .num_heads = dims[2],
                            .num_kv_heads = dims[3],
                            .head_dim = dims[4],
                            .tile = 4,
                            .sliding_window = dims[5]};
  std::vector<int32_t> ks = Read<int32_t>(file, name + ".key_start", "I32");
  const auto q = Cast<T>(Read<double>(file, name + ".q", "F64"));
  const auto k = Cast<T>(Read<double>(file, name + ".k", "F64"));
  const auto v = Cast<T>(Read<double>(file, name + ".v", "F64"));
  const auto dout = Cast<T>(Read<double>(file, name + ".dout", "F64"));
  std::vector<T> out(dout.size()), lse(s.batch * s.num_heads * s.seq_len);
  std::vector<T> dq(q.size()), dk(k.size()), dv(v.size());
  std::vector<T> ws(GqaAttentionWorkspaceElems(s, pool == nullptr ? 1 : pool->num_threads()));
  ASSERT_OK(GqaAttentionForward<T>(s, q, k, v, absl::MakeSpan(out), absl::MakeSpan(lse),
                                   absl::MakeSpan(ws), pool, ks));
  ASSERT_OK(GqaAttentionBackward<T>(s, q, k, v, out, lse, dout, absl::MakeSpan(dq),
                                    absl::MakeSpan(dk), absl::MakeSpan(dv), pool, ks));
  const double G = static_cast<double>(s.num_heads / s.num_kv_heads);
  ExpectAllNear(out, Read<double>(file, name + ".out", "F64"), atol, rtol, "out");
  ExpectAllNear(lse, Read<double>(file, name + ".lse", "F64"), atol, rtol, "lse");
  ExpectAllNear(dq, Read<double>(file, name + ".dq", "F64"), 3 * atol, 3 * rtol, "dq");
  ExpectAllNear(dk, Read<double>(file, name + ".dk", "F64"), 3 * G * atol, 3 * rtol, "dk");
  ExpectAllNear(dv, Read<double>(file, name + ".dv", "F64"), 3 * G * atol, 3 * rtol, "dv");
}

// f64: the same math as torch's float64 run up to summation order (inputs |x| <= 2, D <= 8):
// 1e-12. f32: the kernels' own f32 rounding of float64 inputs, the bounds of gqa_attention_test
// (scores ~1e-6, outputs 1e-5, gradients 3e-5 times the group size).
TEST_F(MaskedAttentionVectorsTest, AttentionMatchesTorchInDoubleAndFloat) {
  ThreadPool pool(3);
  for (int i = 0; i < 4; ++i) {
    const std::string name = absl::StrCat("att", i);
    CheckAttentionCase<double>(*file_, name, 1e-12, 1e-12, &pool);
    CheckAttentionCase<float>(*file_, name, 1e-5, 1e-5, &pool);
    CheckAttentionCase<float>(*file_, name, 1e-5, 1e-5, nullptr);
  }
}

// RoPE with restarting position ids: our f32 tables (RopeTables<float>, within an ulp of
// transformers' cos/sin) and rotation against transformers' float32 output and autograd gradient:
// |x| <= 1, so 2e-6 absolute covers two ulps of the tables and of the rotation.
TEST_F(MaskedAttentionVectorsTest, RopeWithPositionIdsMatchesTransformers) {
  const std::vector<int64_t> dims = Read<int64_t>(*file_, "rope.shape", "I64");
  ASSERT_EQ(dims.size(), 5u);
  const int64_t B = dims[0], T = dims[1], Hq = dims[2], Hkv = dims[3], D = dims[4];
  RopeConfig config;
  config.head_dim = D;
  config.theta = Read<double>(*file_, "rope.theta", "F64").at(0);
  std::vector<float> cos(T * D / 2), sin(T * D / 2);
  ASSERT_OK(RopeTables<float>(config, T, absl::MakeSpan(cos), absl::MakeSpan(sin)));
  const std::vector<int32_t> positions = Read<int32_t>(*file_, "rope.positions", "I32");
  for (const auto& [x_name, heads] : {std::pair<std::string, int64_t>{"q", Hq}, {"k", Hkv}}) {
    SCOPED_TRACE(x_name);
    const RopeShape s{
        .batch = B, .seq_len = T, .num_heads = heads, .head_dim = D, .table_positions = T};
    std::vector<float> x = Read<float>(*file_, "rope." + x_name, "F32");
    ASSERT_OK(RopeForward<float>(s, cos, sin, absl::MakeSpan(x), nullptr, positions));
    ExpectAllNear(x, Read<float>(*file_, "rope." + x_name + "_embed", "F32"), 2e-6, 0, "embed");
    std::vector<float> g = Read<float>(*file_, "rope.g" + x_name, "F32");
    ASSERT_OK(RopeBackward<float>(s, cos, sin, absl::MakeSpan(g), nullptr, positions));
    ExpectAllNear(g, Read<float>(*file_, "rope.d" + x_name, "F32"), 2e-6, 0, "grad");
  }
}

// GPT-2's learned positions with position ids in double: out = x + wpe[pos] is one rounding, so
// exact; dwpe sums a few terms in (b, t) order as torch's index_add does here: within 1e-15.
TEST_F(MaskedAttentionVectorsTest, PositionEmbeddingWithPositionIdsMatchesTorch) {
  const std::vector<int64_t> dims = Read<int64_t>(*file_, "pos.shape", "I64");
  ASSERT_EQ(dims.size(), 4u);
  const int64_t B = dims[0], T = dims[1], C = dims[2], P = dims[3];
  const std::vector<int32_t> positions = Read<int32_t>(*file_, "pos.positions", "I32");
  std::vector<double> out = Read<double>(*file_, "pos.x", "F64");
  const std::vector<double> wpe = Read<double>(*file_, "pos.wpe", "F64");
  ASSERT_EQ(static_cast<int64_t>(wpe.size()), P * C);
  ASSERT_OK(
      PositionEmbeddingForward<double>(B, T, C, wpe, absl::MakeSpan(out), nullptr, positions));
  ExpectAllNear(out, Read<double>(*file_, "pos.out", "F64"), 0, 0, "out");
  std::vector<double> dwpe(P * C, 0.0);
  ASSERT_OK(PositionEmbeddingBackward<double>(B, T, C, Read<double>(*file_, "pos.dout", "F64"),
                                              absl::MakeSpan(dwpe), nullptr, positions));
  ExpectAllNear(dwpe, Read<double>(*file_, "pos.dwpe", "F64"), 1e-15, 0, "dwpe");
}

}  // namespace
}  // namespace ps
