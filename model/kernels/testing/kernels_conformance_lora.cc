// The Kernels conformance suite (kernels_conformance.h): LoRA adapters, their input dropout, and
// the input-gradient-only backward of frozen operators (null parameter gradients).
#include <cmath>
#include <cstdint>
#include <cstring>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/types/span.h"
#include "base/testing/status_matchers.h"
#include "base/testing/test_rng.h"
#include "gmock/gmock.h"
#include "memory/convert.h"
#include "memory/dtype.h"
#include "model/kernels/dropout_math.h"
#include "model/kernels/layernorm.h"
#include "model/kernels/linear.h"
#include "model/kernels/lora.h"
#include "model/kernels/matmul.h"
#include "model/kernels/rmsnorm.h"
#include "model/kernels/testing/kernels_conformance.h"
#include "model/kernels/testing/kernels_conformance_util.h"
#include "model/kernels/vocab_blocks.h"

namespace ps::kernel_testing {
namespace {

using ::testing::HasSubstr;

// Bitwise equality (the same bits, NaN payloads included).
void ExpectSameBits(const std::vector<float>& got, const std::vector<float>& want,
                    const std::string& what) {
  ASSERT_EQ(got.size(), want.size()) << what;
  int reported = 0;
  for (size_t i = 0; i < got.size(); ++i) {
    if (std::memcmp(&got[i], &want[i], sizeof(float)) != 0 && reported++ < 5) {
      ADD_FAILURE() << what << "[" << i << "]: got " << got[i] << ", expected " << want[i];
    }
  }
}

// --- LoRA -----------------------------------------------------------------------------------

TEST_P(KernelsConformanceTest, LoraForwardAndBackward) {
  TestRng rng(40);
  for (const LoraShape s :
       {LoraShape{.rows = 1, .in_features = 5, .out_features = 3, .rank = 1, .scale = 2.0f},
        LoraShape{.rows = 19, .in_features = 23, .out_features = 14, .rank = 4, .scale = 0.5f},
        LoraShape{.rows = 6, .in_features = 3, .out_features = 7, .rank = 8, .scale = 1.0f}}) {
    for (const bool with_dx : {true, false}) {
      const std::string tag =
          absl::StrCat(" N=", s.rows, " in=", s.in_features, " out=", s.out_features, " r=", s.rank,
                       with_dx ? "" : " (no dx)");
      const int64_t ni = s.rows * s.in_features, no = s.rows * s.out_features,
                    ri = s.rank * s.in_features, orr = s.out_features * s.rank,
                    nr = s.rows * s.rank;
      const auto x = Rand(rng, ni), a = Rand(rng, ri), b = Rand(rng, orr), y0 = Rand(rng, no),
                 dy = Rand(rng, no), dx0 = Rand(rng, ni), da0 = Rand(rng, ri), db0 = Rand(rng, orr);
      float *d_x = Upload(x), *d_a = Upload(a), *d_b = Upload(b), *d_h = Alloc<float>(nr),
            *d_y = Upload(y0), *d_dx = Upload(dx0), *d_da = Upload(da0), *d_db = Upload(db0);
      const int64_t fws = kernels().LoraForwardWorkspaceBytes(s);
      const int64_t bws = kernels().LoraBackwardWorkspaceBytes(s);
      ASSERT_OK(kernels().LoraForward(stream(), s, d_x, d_a, d_b, d_h, d_y, Workspace(fws), fws));
      ASSERT_OK(kernels().LoraBackward(stream(), s, d_x, d_a, d_b, d_h, Upload(dy),
                                       with_dx ? d_dx : nullptr, d_da, d_db, Workspace(bws), bws));
      std::vector<float> h(nr), y = y0, dx = dx0, da = da0, db = db0,
                                ws(LoraBackwardWorkspaceElems(s));
      ASSERT_OK(LoraForward<float>(s, C(x), C(a), C(b), M(h), M(y), nullptr));
      ASSERT_OK(LoraBackward<float>(s, C(x), C(a), C(b), C(h), C(dy),
                                    with_dx ? M(dx) : absl::Span<float>(), M(da), M(db), M(ws),
                                    nullptr));
      std::vector<double> h_r(nr), y_r = D(y0), dx_r = D(dx0), da_r = D(da0), db_r = D(db0),
                                   ws_r(LoraBackwardWorkspaceElems(s));
      ASSERT_OK(LoraForward<double>(s, C(D(x)), C(D(a)), C(D(b)), M(h_r), M(y_r), nullptr));
      ASSERT_OK(LoraBackward<double>(s, C(D(x)), C(D(a)), C(D(b)), C(h_r), C(D(dy)),
                                     with_dx ? M(dx_r) : absl::Span<double>(), M(da_r), M(db_r),
                                     M(ws_r), nullptr));
      Check(Download(d_h, nr), h, h_r, "LoraForward h" + tag);
      Check(Download(d_y, no), y, y_r, "LoraForward y" + tag);
      Check(Download(d_dx, ni), dx, dx_r, "LoraBackward dx" + tag);  // untouched without dx
      Check(Download(d_da, ri), da, da_r, "LoraBackward da" + tag);
      Check(Download(d_db, orr), db, db_r, "LoraBackward db" + tag);
    }
  }
}

TEST_P(KernelsConformanceTest, LoraArgumentErrorsAreFoundAtEnqueue) {
  const LoraShape s{.rows = 4, .in_features = 6, .out_features = 5, .rank = 2, .scale = 1.0f};
  float *x = Alloc<float>(24), *a = Alloc<float>(12), *b = Alloc<float>(10), *h = Alloc<float>(8),
        *y = Alloc<float>(20), *dx = Alloc<float>(24), *da = Alloc<float>(12),
        *db = Alloc<float>(10);
  const int64_t fws = kernels().LoraForwardWorkspaceBytes(s);
  const int64_t bws = kernels().LoraBackwardWorkspaceBytes(s);
  void* fw = Workspace(fws);
  void* bw = Workspace(bws);
  LoraShape bad = s;
  bad.rank = 0;
  EXPECT_THAT(kernels().LoraForward(stream(), bad, x, a, b, h, y, fw, fws),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("LoraForward: rank")));
  bad = s;
  bad.rows = -1;
  EXPECT_THAT(kernels().LoraBackward(stream(), bad, x, a, b, h, y, dx, da, db, bw, bws),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("rows")));
  EXPECT_THAT(kernels().LoraForward(stream(), s, x, nullptr, b, h, y, fw, fws),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("a is null")));
  EXPECT_THAT(kernels().LoraBackward(stream(), s, x, a, b, h, y, dx, nullptr, db, bw, bws),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("da is null")));
  EXPECT_THAT(kernels().LoraBackward(stream(), s, x, a, b, h, y, dx, da, nullptr, bw, bws),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("db is null")));
  EXPECT_THAT(kernels().LoraBackward(stream(), s, x, a, b, h, y, dx, da, db, bw, bws - 1),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("workspace has")));
  // y over h, dx over da.
  EXPECT_THAT(kernels().LoraForward(stream(), s, x, a, b, y, y, fw, fws),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("overlap")));
  EXPECT_THAT(kernels().LoraBackward(stream(), s, x, a, b, h, y, dx, dx, db, bw, bws),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("overlap")));
  LoraShape nan_scale = s;
  nan_scale.scale = NAN;
  EXPECT_THAT(kernels().LoraForward(stream(), nan_scale, x, a, b, h, y, fw, fws),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("scale")));
}

// --- Dropout: bit for bit the rule of dropout_math.h on every implementation ---------------

TEST_P(KernelsConformanceTest, DropoutIsTheCounterBasedRuleBitForBit) {
  TestRng rng(41);
  const int64_t n = 100003;
  const auto x = Rand(rng, n, 0.5f, 1.5f), dy = Rand(rng, n), dx0 = Rand(rng, n);
  float *d_x = Upload(x), *d_y = Alloc<float>(n), *d_dy = Upload(dy);
  for (const float p : {0.0f, 0.1f, 0.5f}) {
    for (const uint64_t seed : {uint64_t{0}, uint64_t{0x123456789abcdefULL}}) {
      const std::string tag = absl::StrCat(" p=", p, " seed=", seed);
      float* d_dx = Upload(dx0);
      ASSERT_OK(kernels().DropoutForward(stream(), n, p, seed, d_x, d_y));
      ASSERT_OK(kernels().DropoutBackward(stream(), n, p, seed, d_dy, d_dx));
      std::vector<float> y(n), dx = dx0;
      ASSERT_OK(DropoutForward(p, seed, C(x), M(y), nullptr));
      ASSERT_OK(DropoutBackward(p, seed, C(dy), M(dx), nullptr));
      const std::vector<float> got_y = Download(d_y, n);
      ExpectSameBits(got_y, y, "DropoutForward y" + tag);
      ExpectSameBits(Download(d_dx, n), dx, "DropoutBackward dx" + tag);
      int64_t kept = 0;
      for (float v : got_y) kept += v != 0.0f;
      const double sd = std::sqrt(n * p * (1.0 - p));
      EXPECT_NEAR(static_cast<double>(kept), n * (1.0 - p), 5 * sd + 0.5) << tag;
    }
  }
  EXPECT_THAT(kernels().DropoutForward(stream(), n, 1.0f, 0, d_x, d_y),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("[0, 1)")));
  EXPECT_THAT(kernels().DropoutForward(stream(), n, 0.5f, 0, d_x, d_x),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("overlap")));
  EXPECT_THAT(kernels().DropoutBackward(stream(), n, -0.5f, 0, d_dy, d_y),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("[0, 1)")));
  EXPECT_THAT(kernels().DropoutBackward(stream(), n, 0.5f, 0, nullptr, d_y),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("dy is null")));
  EXPECT_OK(kernels().DropoutForward(stream(), 0, 0.5f, 0, nullptr, nullptr));  // nothing to do
}

// --- Input gradient only: null parameter gradients skip their work, dx is the full call's ----

// On a bit-identical implementation dx must equal the full call's bit for bit; elsewhere (the
// GPU) to rounding.
TEST_P(KernelsConformanceTest, NullParameterGradientsGiveTheSameInputGradient) {
  TestRng rng(42);
  auto same = [&](const std::vector<float>& got, const std::vector<float>& full,
                  const std::string& what) {
    if (bit_identical()) {
      ExpectSameBits(got, full, what);
    } else {
      Check(got, full, D(full), what);
    }
  };
  // Linear, with and without a bias; null dw, null db, both null.
  for (const bool bias : {false, true}) {
    const LinearShape s{.rows = 17, .in_features = 21, .out_features = 10, .bias = bias};
    const int64_t ni = s.rows * s.in_features, no = s.rows * s.out_features,
                  oi = s.out_features * s.in_features;
    const auto x = Rand(rng, ni), w = Rand(rng, oi), dy = Rand(rng, no), dx0 = Rand(rng, ni),
               dw0 = Rand(rng, oi), db0 = Rand(rng, s.out_features);
    float *d_x = Upload(x), *d_w = Upload(w), *d_dy = Upload(dy);
    const int64_t ws = kernels().LinearWorkspaceBytes(s);
    void* d_ws = Workspace(ws);
    float *full_dx = Upload(dx0), *full_dw = Upload(dw0), *full_db = Upload(db0);
    ASSERT_OK(kernels().LinearBackward(stream(), s, d_x, d_w, d_dy, full_dx, full_dw,
                                       bias ? full_db : nullptr, d_ws, ws));
    const std::vector<float> want_dx = Download(full_dx, ni), want_dw = Download(full_dw, oi),
                             want_db = Download(full_db, s.out_features);
    for (const int variant : {0, 1, 2}) {  // null dw; null db; both
      const std::string tag = absl::StrCat("LinearBackward bias=", bias, " variant=", variant);
      float *dx = Upload(dx0), *dw = Upload(dw0), *db = Upload(db0);
      ASSERT_OK(kernels().LinearBackward(stream(), s, d_x, d_w, d_dy, dx,
                                         variant == 1 ? dw : nullptr,
                                         variant == 0 && bias ? db : nullptr, d_ws, ws));
      same(Download(dx, ni), want_dx, tag + " dx");
      if (variant == 1) same(Download(dw, oi), want_dw, tag + " dw");
      if (variant == 0 && bias) same(Download(db, s.out_features), want_db, tag + " db");
      if (variant != 1) ExpectSameBits(Download(dw, oi), dw0, tag + " dw untouched");
      if (variant != 0) ExpectSameBits(Download(db, s.out_features), db0, tag + " db untouched");
    }
  }
  // Matmul (f32 and bf16 weights).
  {
    const MatmulShape s{.rows = 13, .in_features = 19, .out_features = 11};
    const int64_t ni = s.rows * s.in_features, no = s.rows * s.out_features,
                  io = s.in_features * s.out_features;
    const auto x = Rand(rng, ni), w = Rand(rng, io), dy = Rand(rng, no), dx0 = Rand(rng, ni),
               dw0 = Rand(rng, io), db0 = Rand(rng, s.out_features);
    std::vector<uint16_t> w16(io);
    ConvertF32ToBF16(w.data(), w16.data(), io);
    float *d_x = Upload(x), *d_w = Upload(w), *d_dy = Upload(dy);
    uint16_t* d_w16 = Upload(w16);
    const int64_t ws = kernels().MatmulWorkspaceBytes(s);
    const int64_t ws16 = kernels().MatmulBf16BackwardWorkspaceBytes(s);
    void* d_ws = Workspace(ws);
    void* d_ws16 = Workspace(ws16);
    for (const bool bf16 : {false, true}) {
      auto run = [&](float* dx, float* dw, float* db) {
        return bf16 ? kernels().MatmulBackwardBf16(stream(), s, d_x, d_w16, d_dy, dx, dw, db,
                                                   d_ws16, ws16)
                    : kernels().MatmulBackward(stream(), s, d_x, d_w, d_dy, dx, dw, db, d_ws, ws);
      };
      float *full_dx = Upload(dx0), *full_dw = Upload(dw0), *full_db = Upload(db0);
      ASSERT_OK(run(full_dx, full_dw, full_db));
      const std::vector<float> want_dx = Download(full_dx, ni), want_dw = Download(full_dw, io),
                               want_db = Download(full_db, s.out_features);
      for (const int variant : {0, 1, 2}) {
        const std::string tag =
            absl::StrCat(bf16 ? "MatmulBackwardBf16" : "MatmulBackward", " variant=", variant);
        float *dx = Upload(dx0), *dw = Upload(dw0), *db = Upload(db0);
        ASSERT_OK(run(dx, variant == 1 ? dw : nullptr, variant == 0 ? db : nullptr));
        same(Download(dx, ni), want_dx, tag + " dx");
        if (variant == 1) same(Download(dw, io), want_dw, tag + " dw");
        if (variant == 0) same(Download(db, s.out_features), want_db, tag + " db");
        if (variant != 1) ExpectSameBits(Download(dw, io), dw0, tag + " dw untouched");
        if (variant != 0) ExpectSameBits(Download(db, s.out_features), db0, tag + " db untouched");
      }
    }
  }
  // LayerNorm and RmsNorm.
  {
    const LayerNormShape s{.rows = 9, .channels = 37};
    const int64_t nc = s.rows * s.channels;
    const auto x = Rand(rng, nc, -2, 2), w = Rand(rng, s.channels), b = Rand(rng, s.channels),
               dy = Rand(rng, nc), dx0 = Rand(rng, nc), dw0 = Rand(rng, s.channels),
               db0 = Rand(rng, s.channels);
    float *d_x = Upload(x), *d_w = Upload(w), *d_y = Alloc<float>(nc),
          *d_mean = Alloc<float>(s.rows), *d_rstd = Alloc<float>(s.rows), *d_dy = Upload(dy);
    ASSERT_OK(kernels().LayerNormForward(stream(), s, d_x, d_w, Upload(b), d_y, d_mean, d_rstd));
    float *full_dx = Upload(dx0), *full_dw = Upload(dw0), *full_db = Upload(db0);
    ASSERT_OK(kernels().LayerNormBackward(stream(), s, d_x, d_w, d_mean, d_rstd, d_dy, full_dx,
                                          full_dw, full_db));
    const std::vector<float> want_dx = Download(full_dx, nc),
                             want_dw = Download(full_dw, s.channels),
                             want_db = Download(full_db, s.channels);
    for (const int variant : {0, 1, 2}) {
      const std::string tag = absl::StrCat("LayerNormBackward variant=", variant);
      float *dx = Upload(dx0), *dw = Upload(dw0), *db = Upload(db0);
      ASSERT_OK(kernels().LayerNormBackward(stream(), s, d_x, d_w, d_mean, d_rstd, d_dy, dx,
                                            variant == 1 ? dw : nullptr,
                                            variant == 0 ? db : nullptr));
      same(Download(dx, nc), want_dx, tag + " dx");
      if (variant == 1) same(Download(dw, s.channels), want_dw, tag + " dw");
      if (variant == 0) same(Download(db, s.channels), want_db, tag + " db");
      if (variant != 1) ExpectSameBits(Download(dw, s.channels), dw0, tag + " dw untouched");
      if (variant != 0) ExpectSameBits(Download(db, s.channels), db0, tag + " db untouched");
    }
    const RmsNormShape r{.rows = 9, .channels = 37, .eps = 1e-6};
    ASSERT_OK(kernels().RmsNormForward(stream(), r, d_x, d_w, d_y, d_rstd));
    float *rfull_dx = Upload(dx0), *rfull_dw = Upload(dw0);
    ASSERT_OK(kernels().RmsNormBackward(stream(), r, d_x, d_w, d_rstd, d_dy, rfull_dx, rfull_dw));
    float* dx = Upload(dx0);
    ASSERT_OK(kernels().RmsNormBackward(stream(), r, d_x, d_w, d_rstd, d_dy, dx, nullptr));
    same(Download(dx, nc), Download(rfull_dx, nc), "RmsNormBackward dx (null dw)");
  }
  // The LM head over one vocabulary block, f32 and bf16: null dblock gives the same dh.
  for (const DType dtype : {DType::kF32, DType::kBF16}) {
    const int64_t N = 11, Ch = 16, V = 40;
    const VocabBlockShape s{.rows = N,
                            .channels = Ch,
                            .vocab_size = V,
                            .row_begin = 0,
                            .block_rows = V,
                            .row_tile = 4,
                            .vocab_tile = 16};
    std::vector<int32_t> targets(N);
    for (auto& t : targets) t = static_cast<int32_t>(rng() % V);
    const auto h = Rand(rng, N * Ch), wte = Rand(rng, V * Ch), dh0 = Rand(rng, N * Ch);
    const int64_t e = SizeOf(dtype);
    std::vector<uint8_t> block(V * Ch * e);
    if (dtype == DType::kF32) {
      std::memcpy(block.data(), wte.data(), block.size());
    } else {
      ConvertF32ToBF16(wte.data(), reinterpret_cast<uint16_t*>(block.data()), V * Ch);
    }
    float *d_h = Upload(h), *d_state = Alloc<float>(LmHeadStateElems(s)), *d_lse = Alloc<float>(N);
    int32_t* d_targets = Upload(targets);
    uint8_t* d_block = Upload(block);
    double* d_loss = Alloc<double>(1);
    ASSERT_OK(kernels().LmHeadStateInit(stream(), s, d_state));
    const int64_t fws = kernels().LmHeadBlockForwardWorkspaceBytes(s, dtype);
    ASSERT_OK(kernels().LmHeadBlockForward(stream(), s, d_h, dtype, d_block, d_targets, d_state,
                                           Workspace(fws), fws));
    ASSERT_OK(kernels().LmHeadFinish(stream(), s, d_targets, d_state, d_lse, d_loss));
    const int64_t bws = kernels().LmHeadBlockBackwardWorkspaceBytes(s, dtype);
    void* d_ws = Workspace(bws);
    float *full_dh = Upload(dh0), *dblock = Alloc<float>(V * Ch), *dh = Upload(dh0);
    ASSERT_OK(kernels().LmHeadBlockBackward(stream(), s, d_h, dtype, d_block, d_targets, d_lse, 1.0,
                                            full_dh, dblock, d_ws, bws));
    ASSERT_OK(kernels().LmHeadBlockBackward(stream(), s, d_h, dtype, d_block, d_targets, d_lse, 1.0,
                                            dh, nullptr, d_ws, bws));
    same(Download(dh, N * Ch), Download(full_dh, N * Ch),
         absl::StrCat("LmHeadBlockBackward dh (null dblock) ", DTypeName(dtype)));
  }
  // A null dx is still an error where dx is the point.
  const LinearShape s{.rows = 2, .in_features = 3, .out_features = 4};
  float *x = Alloc<float>(6), *w = Alloc<float>(12), *dy = Alloc<float>(8);
  const int64_t ws = kernels().LinearWorkspaceBytes(s);
  EXPECT_THAT(
      kernels().LinearBackward(stream(), s, x, w, dy, nullptr, nullptr, nullptr, Workspace(ws), ws),
      StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("dx is null")));
}

}  // namespace
}  // namespace ps::kernel_testing
