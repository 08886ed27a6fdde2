#include "benchmarks/internal/gemm_breakdown.h"

#include <algorithm>
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <functional>
#include <random>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/types/span.h"
#include "base/check.h"
#include "base/thread_pool.h"
#include "model/kernels/internal/bf16_gemm.h"
#include "model/kernels/internal/blas.h"
#include "model/kernels/lora.h"
#include "model/kernels/matmul.h"

namespace ps::benchmarks_internal {
namespace {

using Clock = std::chrono::steady_clock;

double BestSeconds(int reps, const std::function<void()>& fn) {
  fn();  // warm-up: scratch buffers grown, pages touched
  double best = 1e30;
  for (int r = 0; r < std::max(1, reps); ++r) {
    const Clock::time_point t0 = Clock::now();
    fn();
    best = std::min(best, std::chrono::duration<double>(Clock::now() - t0).count());
  }
  return best;
}

double OnceSeconds(const std::function<void()>& fn) {
  const Clock::time_point t0 = Clock::now();
  fn();
  return std::chrono::duration<double>(Clock::now() - t0).count();
}

std::vector<float> Random(int64_t n, float scale, uint32_t seed) {
  std::mt19937 gen(seed);
  std::uniform_real_distribution<float> dist(-scale, scale);
  std::vector<float> v(static_cast<size_t>(n));
  for (float& x : v) x = dist(gen);
  return v;
}

std::vector<uint16_t> Bf16(const std::vector<float>& v) {
  std::vector<uint16_t> out(v.size());
  kernels_internal::RoundToBf16(v.data(), out.data(), static_cast<int64_t>(v.size()), nullptr);
  return out;
}

void Ok(const absl::Status& s) { PS_CHECK_OK(s); }

std::string Mnk(int64_t m, int64_t n, int64_t k) { return absl::StrCat(m, "x", n, "x", k); }

struct Projection {
  std::string name;
  int64_t in = 0, out = 0;
  int per_layer = 1;  // projections of this shape per layer (k/v, gate/up share one row)
};

}  // namespace

std::vector<GemmBreakdownRow> TimeLlamaGemms(const GemmBreakdownShape& s, int reps,
                                             ThreadPool* pool) {
  const int64_t N = s.rows, C = s.hidden;
  const std::vector<Projection> projections = {{"q_proj", C, s.q_dim, 1},
                                               {"k_proj,v_proj", C, s.kv_dim, 2},
                                               {"o_proj", s.q_dim, C, 1},
                                               {"gate_proj,up_proj", C, s.intermediate, 2},
                                               {"down_proj", s.intermediate, C, 1}};
  const int64_t forwards = s.activation_checkpointing ? 2 : 1;
  std::vector<GemmBreakdownRow> rows;
  for (const Projection& p : projections) {
    const MatmulShape shape{.rows = N, .in_features = p.in, .out_features = p.out};
    const std::vector<float> x = Random(N * p.in, 1.0f, 1), dy = Random(N * p.out, 1e-2f, 2);
    const std::vector<float> w = Random(p.in * p.out, 0.02f, 3), b(static_cast<size_t>(p.out));
    const std::vector<uint16_t> w16 = Bf16(w);
    std::vector<float> y(static_cast<size_t>(N * p.out)), dx(static_cast<size_t>(N * p.in));
    std::vector<float> dw(s.frozen_base ? 0 : static_cast<size_t>(p.in * p.out));
    std::vector<float> ws(static_cast<size_t>(
        std::max(MatmulBf16ForwardWorkspaceElems(shape), MatmulBf16BackwardWorkspaceElems(shape))));
    const double fwd_flops = 2.0 * N * p.in * p.out;
    const int64_t calls = p.per_layer * s.layers;
    const double fwd = BestSeconds(reps, [&] {
      Ok(s.bf16 ? MatmulForwardBf16(shape, x, w16, b, absl::MakeSpan(y), absl::MakeSpan(ws), pool)
                : MatmulForward<float>(shape, x, w, b, absl::MakeSpan(y), pool));
    });
    rows.push_back(
        {absl::StrCat(p.name, " forward"), Mnk(N, p.out, p.in), calls * forwards, fwd_flops, fwd});
    const double bwd = BestSeconds(reps, [&] {
      Ok(s.bf16 ? MatmulBackwardBf16(shape, x, w16, dy, absl::MakeSpan(dx), absl::MakeSpan(dw), {},
                                     absl::MakeSpan(ws), pool)
                : MatmulBackward<float>(shape, x, w, dy, absl::MakeSpan(dx), absl::MakeSpan(dw), {},
                                        pool));
    });
    rows.push_back({absl::StrCat(p.name, s.frozen_base ? " backward (dX)" : " backward (dX, dW)"),
                    s.frozen_base ? Mnk(N, p.in, p.out)
                                  : absl::StrCat(Mnk(N, p.in, p.out), " + ", Mnk(p.in, p.out, N)),
                    calls, fwd_flops * (s.frozen_base ? 1 : 2), bwd});
  }
  // The adapters: one row pair per targeted projection shape.
  if (s.lora_rank > 0) {
    for (const Projection& p : projections) {
      int targeted = 0;
      for (const std::string& t : s.lora_targets) {
        if (absl::StrContains(p.name, t)) ++targeted;
      }
      if (targeted == 0) continue;
      const int64_t R = s.lora_rank;
      const LoraShape shape{
          .rows = N, .in_features = p.in, .out_features = p.out, .rank = R, .scale = 2.0f};
      const std::vector<float> x = Random(N * p.in, 1.0f, 4), dy = Random(N * p.out, 1e-2f, 5);
      const std::vector<float> a = Random(R * p.in, 0.02f, 6), bb = Random(p.out * R, 0.02f, 7);
      std::vector<float> h(static_cast<size_t>(N * R)), y(static_cast<size_t>(N * p.out));
      std::vector<float> dx(static_cast<size_t>(N * p.in)), da(a.size()), db(bb.size());
      std::vector<float> ws(static_cast<size_t>(LoraBackwardWorkspaceElems(shape)));
      const double fwd_flops = 2.0 * N * R * (p.in + p.out);
      const int64_t calls = targeted * s.layers;
      const double fwd = BestSeconds(reps, [&] {
        Ok(LoraForward<float>(shape, x, a, bb, absl::MakeSpan(h), absl::MakeSpan(y), pool));
      });
      rows.push_back({absl::StrCat("LoRA r", R, " ", p.name, " forward"),
                      absl::StrCat(Mnk(N, R, p.in), " + ", Mnk(N, p.out, R)), calls * forwards,
                      fwd_flops, fwd});
      const double bwd = BestSeconds(reps, [&] {
        Ok(LoraBackward<float>(shape, x, a, bb, h, dy, absl::MakeSpan(dx), absl::MakeSpan(da),
                               absl::MakeSpan(db), absl::MakeSpan(ws), pool));
      });
      rows.push_back({absl::StrCat("LoRA r", R, " ", p.name, " backward"),
                      absl::StrCat("4 GEMMs, rank ", R), calls, 2 * fwd_flops, bwd});
    }
  }
  // The LM head's tiles: logits (forward, and again in the backward: the row-block head
  // recomputes each block's logits), dh (and dW when the head trains).
  {
    const int64_t V = s.vocab, R = std::min(N, s.row_tile), Vt = std::min(V, s.vocab_tile);
    const std::vector<float> h = Random(R * C, 1.0f, 8), dz = Random(R * Vt, 1e-3f, 9);
    const std::vector<float> w = Random(V * C, 0.02f, 10);
    const std::vector<uint16_t> h16 = Bf16(h), dz16 = Bf16(dz), w16 = Bf16(w);
    std::vector<float> z(static_cast<size_t>(R * Vt)), dh(static_cast<size_t>(R * C));
    std::vector<float> dw(static_cast<size_t>(Vt * C));
    // Over every (row tile, vocabulary tile) of the step, each call of `tile` one tile.
    const int64_t row_tiles = (N + R - 1) / R;
    const auto over_vocab = [&](const std::function<void(int64_t v0, int64_t vt)>& tile) {
      for (int64_t v0 = 0; v0 < V; v0 += Vt) tile(v0, std::min(Vt, V - v0));
    };
    const double logits = BestSeconds(reps, [&] {
      over_vocab([&](int64_t v0, int64_t vt) {
        if (s.bf16) {
          Ok(kernels_internal::GemmBf16({.trans_b = true,
                                         .m = R,
                                         .n = vt,
                                         .k = C,
                                         .a = h16.data(),
                                         .lda = C,
                                         .b = w16.data() + v0 * C,
                                         .ldb = C,
                                         .c = z.data(),
                                         .ldc = vt},
                                        pool));
        } else {
          kernels_internal::Gemm(false, true, R, vt, C, 1.0f, h.data(), C, w.data() + v0 * C, C,
                                 0.0f, z.data(), vt, pool);
        }
      });
    });
    const double flops = 2.0 * R * V * C;
    rows.push_back({"LM head logits (forward; again in backward)",
                    absl::StrCat(Mnk(R, Vt, C), " x ", (V + Vt - 1) / Vt), 2 * row_tiles, flops,
                    logits});
    const double grads = BestSeconds(reps, [&] {
      over_vocab([&](int64_t v0, int64_t vt) {
        if (s.bf16) {
          Ok(kernels_internal::GemmBf16({.m = R,
                                         .n = C,
                                         .k = vt,
                                         .a = dz16.data(),
                                         .lda = vt,
                                         .b = w16.data() + v0 * C,
                                         .ldb = C,
                                         .accumulate = true,
                                         .c = dh.data(),
                                         .ldc = C},
                                        pool));
          if (!s.frozen_base) {
            Ok(kernels_internal::GemmBf16({.trans_a = true,
                                           .m = vt,
                                           .n = C,
                                           .k = R,
                                           .a = dz16.data(),
                                           .lda = vt,
                                           .b = h16.data(),
                                           .ldb = C,
                                           .accumulate = true,
                                           .c = dw.data(),
                                           .ldc = C},
                                          pool));
          }
        } else {
          kernels_internal::Gemm(false, false, R, C, vt, 1.0f, dz.data(), vt, w.data() + v0 * C, C,
                                 1.0f, dh.data(), C, pool);
          if (!s.frozen_base) {
            kernels_internal::Gemm(true, false, vt, C, R, 1.0f, dz.data(), vt, h.data(), C, 1.0f,
                                   dw.data(), C, pool);
          }
        }
      });
    });
    rows.push_back({s.frozen_base ? "LM head dh" : "LM head dh, dW",
                    absl::StrCat(Mnk(R, C, Vt), " x ", (V + Vt - 1) / Vt), row_tiles,
                    flops * (s.frozen_base ? 1 : 2), grads});
  }
  return rows;
}

double PrintSkinnyGridAb(const GemmBreakdownShape& s, int reps, ThreadPool* pool) {
  struct AbShape {
    std::string op;
    bool tb;
    int64_t m, n, k, calls;
  };
  const int64_t N = s.rows, C = s.hidden, fw = s.activation_checkpointing ? 2 : 1;
  const int64_t R = std::min(N, s.row_tile), Vt = std::min(s.vocab, s.vocab_tile);
  const int64_t tiles = (s.vocab + Vt - 1) / Vt * ((N + R - 1) / R);
  const std::vector<AbShape> shapes = {
      {"q_proj, o_proj forward", false, N, s.q_dim, C, 2 * fw * s.layers},
      {"q_proj, o_proj dX", true, N, C, s.q_dim, 2 * s.layers},
      {"k_proj, v_proj forward", false, N, s.kv_dim, C, 2 * fw * s.layers},
      {"k_proj, v_proj dX", true, N, C, s.kv_dim, 2 * s.layers},
      {"gate_proj, up_proj forward", false, N, s.intermediate, C, 2 * fw * s.layers},
      {"gate_proj, up_proj dX", true, N, C, s.intermediate, 2 * s.layers},
      {"down_proj forward", false, N, C, s.intermediate, fw * s.layers},
      {"down_proj dX", true, N, s.intermediate, C, s.layers},
      {"LM head logits tile", true, R, Vt, C, 2 * tiles},
      {"LM head dh tile", false, R, C, Vt, tiles}};
  std::printf(
      "\nskinny GEMM grid (issue #38: one row block of all m <= 256 rows) vs the former grid "
      "(64-row blocks), f32 sgemm, alternating calls in this run:\n| GEMM | m x n x k | former "
      "ms | current ms | speedup |\n|---|---|---|---|---|\n");
  double former_total = 0, current_total = 0;
  std::string line = "gemm_grid_ab:";
  for (const AbShape& g : shapes) {
    const kernels_internal::GemmBlocks now = kernels_internal::GemmBlocksFor(g.m, g.n);
    const std::vector<float> a = Random(g.m * g.k, 1.0f, 11), b = Random(g.k * g.n, 0.02f, 12);
    std::vector<float> c(static_cast<size_t>(g.m * g.n));
    const int64_t ldb = g.tb ? g.k : g.n;
    const auto current = [&] {
      kernels_internal::Gemm(false, g.tb, g.m, g.n, g.k, 1.0f, a.data(), g.k, b.data(), ldb, 0.0f,
                             c.data(), g.n, pool);
    };
    const int64_t rows = 64, m_blocks = (g.m + rows - 1) / rows;
    const int64_t n_blocks = (g.n + now.cols - 1) / now.cols;
    const auto former = [&] {
      const auto block = [&](int64_t task) {
        const int64_t m0 = task / n_blocks * rows, n0 = task % n_blocks * now.cols;
        kernels_internal::GemmSingleCall(
            false, g.tb, std::min(rows, g.m - m0), std::min(now.cols, g.n - n0), g.k, 1.0f,
            a.data() + m0 * g.k, g.k, g.tb ? b.data() + n0 * ldb : b.data() + n0, ldb, 0.0f,
            c.data() + m0 * g.n + n0, g.n);
      };
      if (pool == nullptr) {
        for (int64_t t = 0; t < m_blocks * n_blocks; ++t) block(t);
      } else {
        pool->ParallelFor(m_blocks * n_blocks, block);
      }
    };
    current();
    former();
    double best_current = 1e30, best_former = 1e30;
    for (int r = 0; r < std::max(1, reps); ++r) {
      best_current = std::min(best_current, OnceSeconds(current));
      best_former = std::min(best_former, OnceSeconds(former));
    }
    former_total += best_former * static_cast<double>(g.calls);
    current_total += best_current * static_cast<double>(g.calls);
    std::printf("| %s | %s | %.2f | %.2f | %.3fx |\n", g.op.c_str(), Mnk(g.m, g.n, g.k).c_str(),
                best_former * 1e3, best_current * 1e3, best_former / best_current);
    std::string key = g.op;
    for (char& ch : key) {
      if (ch == ' ' || ch == ',') ch = '_';
    }
    absl::StrAppend(&line, absl::StrFormat(" %s=%.3f", key, best_former / best_current));
  }
  const double speedup = former_total / std::max(current_total, 1e-12);
  std::printf("| the step's GEMMs (per step) | | %.1f | %.1f | %.3fx |\n%s step=%.3f\n",
              former_total * 1e3, current_total * 1e3, speedup, line.c_str(), speedup);
  return speedup;
}

double PrintGemmBreakdown(const std::vector<GemmBreakdownRow>& rows, double peak_flops,
                          const std::string& peak_name) {
  std::printf(
      "\nGEMM breakdown (each kernel alone at the step's shape; fraction of the %s probe, %.1f "
      "GFLOP/s):\n| operator | GEMM m x n x k | calls/step | ms/call | ms/step | GFLOP/s | "
      "fraction |\n|---|---|---|---|---|---|---|\n",
      peak_name.c_str(), peak_flops / 1e9);
  double total_s = 0, total_flops = 0;
  std::string line = "gemm_breakdown:";
  for (const GemmBreakdownRow& r : rows) {
    const double rate = r.flops / std::max(r.seconds, 1e-12);
    const double per_step = r.seconds * static_cast<double>(r.calls);
    total_s += per_step;
    total_flops += r.flops * static_cast<double>(r.calls);
    std::printf("| %s | %s | %lld | %.2f | %.1f | %.1f | %.3f |\n", r.op.c_str(), r.shape.c_str(),
                static_cast<long long>(r.calls), r.seconds * 1e3, per_step * 1e3, rate / 1e9,
                peak_flops > 0 ? rate / peak_flops : 0.0);
    std::string key = r.op;
    for (char& c : key) {
      if (c == ' ' || c == ',' || c == '(' || c == ')' || c == ';') c = '_';
    }
    absl::StrAppend(&line, absl::StrFormat(" %s=%.4f,%.3f", key, per_step,
                                           peak_flops > 0 ? rate / peak_flops : 0.0));
  }
  const double rate = total_flops / std::max(total_s, 1e-12);
  std::printf("| all GEMMs above | | | | %.1f | %.1f | %.3f |\n", total_s * 1e3, rate / 1e9,
              peak_flops > 0 ? rate / peak_flops : 0.0);
  std::printf("%s total_s=%.4f total_fraction=%.3f\n", line.c_str(), total_s,
              peak_flops > 0 ? rate / peak_flops : 0.0);
  return total_s;
}

}  // namespace ps::benchmarks_internal
