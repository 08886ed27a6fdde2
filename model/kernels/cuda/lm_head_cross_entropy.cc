#include "model/kernels/cuda/lm_head_cross_entropy.h"

#include <cuda_runtime.h>

#include <algorithm>
#include <cstdint>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "base/status_macros.h"
#include "model/kernels/cuda/cublas.h"
#include "model/kernels/cuda/internal/host_util.h"
#include "model/kernels/cuda/internal/launchers.h"
#include "model/kernels/internal/kernel_util.h"
#include "model/kernels/lm_head_cross_entropy.h"

namespace ps::cuda {
namespace {

using cuda_internal::CheckNotNull;
using cuda_internal::LaunchStatus;
using kernels_internal::CheckBlasDim;

// The workspace carved into its parts.
struct Workspace {
  float* logits;
  float* run_max;
  float* run_sum;
  float* target_logit;
  float* scale;
  double* row_loss;
};

using Tiles = VocabTiles;
Tiles TilesOf(const LmHeadCrossEntropyShape& s) { return VocabTilesOf(s); }

// The parts at LmHeadCrossEntropyLayout's offsets (cuda/workspace_sizes.h).
Workspace Carve(const LmHeadCrossEntropyShape& s, void* base) {
  const LmHeadCrossEntropyWorkspaceLayout l = LmHeadCrossEntropyLayout(s);
  char* p = static_cast<char*>(base);
  Workspace w;
  w.logits = reinterpret_cast<float*>(p + l.logits);
  w.run_max = reinterpret_cast<float*>(p + l.run_max);
  w.run_sum = reinterpret_cast<float*>(p + l.run_sum);
  w.target_logit = reinterpret_cast<float*>(p + l.target_logit);
  w.scale = reinterpret_cast<float*>(p + l.scale);
  w.row_loss = reinterpret_cast<double*>(p + l.row_loss);
  return w;
}

absl::Status CheckArgs(const char* kernel, const LmHeadCrossEntropyShape& s, const float* h,
                       const float* wte, const int32_t* targets, const float* lse,
                       const void* workspace, int64_t workspace_bytes) {
  RETURN_IF_ERROR(CheckBlasDim(kernel, "rows", s.rows));
  RETURN_IF_ERROR(CheckBlasDim(kernel, "channels", s.channels));
  RETURN_IF_ERROR(CheckBlasDim(kernel, "vocab_size", s.vocab_size));
  RETURN_IF_ERROR(CheckBlasDim(kernel, "row_tile", s.row_tile));
  RETURN_IF_ERROR(CheckBlasDim(kernel, "vocab_tile", s.vocab_tile));
  RETURN_IF_ERROR(CheckNotNull(
      kernel,
      {{"h", h}, {"wte", wte}, {"targets", targets}, {"lse", lse}, {"workspace", workspace}}));
  const int64_t needed = LmHeadCrossEntropyWorkspaceBytes(s);
  if (workspace_bytes < needed) {
    return absl::InvalidArgumentError(
        absl::StrCat(kernel, ": workspace has ", workspace_bytes, " bytes, needs ", needed));
  }
  if (reinterpret_cast<uintptr_t>(workspace) % 256 != 0) {
    return absl::InvalidArgumentError(
        absl::StrCat(kernel, ": workspace must be 256-byte aligned (as cudaMalloc returns it)"));
  }
  return absl::OkStatus();
}

}  // namespace

absl::Status LmHeadCrossEntropyForward(const CublasHandle& cublas,
                                       const LmHeadCrossEntropyShape& shape, const float* h,
                                       const float* wte, const int32_t* targets, float* lse,
                                       double* loss, void* workspace, int64_t workspace_bytes,
                                       cudaStream_t stream) {
  constexpr char kKernel[] = "cuda::LmHeadCrossEntropyForward";
  RETURN_IF_ERROR(CheckArgs(kKernel, shape, h, wte, targets, lse, workspace, workspace_bytes));
  RETURN_IF_ERROR(CheckNotNull(kKernel, {{"loss", loss}}));
  const int64_t N = shape.rows, V = shape.vocab_size, C = shape.channels;
  const Tiles tiles = TilesOf(shape);
  const Workspace ws = Carve(shape, workspace);
  for (int64_t r0 = 0; r0 < N; r0 += tiles.rows) {
    const int64_t R = std::min(tiles.rows, N - r0);
    for (int64_t v0 = 0; v0 < V; v0 += tiles.vocab) {
      const int64_t Vt = std::min(tiles.vocab, V - v0);
      RETURN_IF_ERROR(Gemm(cublas, stream, false, true, R, Vt, C, 1.0f, h + r0 * C, C, wte + v0 * C,
                           C, 0.0f, ws.logits, Vt));
      RETURN_IF_ERROR(LaunchStatus(
          cuda_internal::LaunchCrossEntropyForwardTile(
              R, Vt, v0, ws.logits, targets + r0, ws.run_max, ws.run_sum, ws.target_logit, stream),
          kKernel));
    }
    RETURN_IF_ERROR(LaunchStatus(cuda_internal::LaunchCrossEntropyFinishRows(
                                     R, V, shape.ignore_index, targets + r0, ws.run_max, ws.run_sum,
                                     ws.target_logit, lse + r0, ws.row_loss + r0, stream),
                                 kKernel));
  }
  return LaunchStatus(cuda_internal::LaunchCrossEntropyMeanLoss(N, shape.ignore_index, targets,
                                                                ws.row_loss, loss, stream),
                      kKernel);
}

absl::Status LmHeadCrossEntropyBackward(const CublasHandle& cublas,
                                        const LmHeadCrossEntropyShape& shape, const float* h,
                                        const float* wte, const int32_t* targets, const float* lse,
                                        double loss_grad, float* dh, float* dwte, void* workspace,
                                        int64_t workspace_bytes, cudaStream_t stream) {
  constexpr char kKernel[] = "cuda::LmHeadCrossEntropyBackward";
  RETURN_IF_ERROR(CheckArgs(kKernel, shape, h, wte, targets, lse, workspace, workspace_bytes));
  RETURN_IF_ERROR(CheckNotNull(kKernel, {{"dh", dh}, {"dwte", dwte}}));
  const int64_t N = shape.rows, V = shape.vocab_size, C = shape.channels;
  const Tiles tiles = TilesOf(shape);
  const Workspace ws = Carve(shape, workspace);
  RETURN_IF_ERROR(LaunchStatus(cuda_internal::LaunchCrossEntropyGradScale(
                                   N, shape.ignore_index, targets, loss_grad, ws.scale, stream),
                               kKernel));
  for (int64_t r0 = 0; r0 < N; r0 += tiles.rows) {
    const int64_t R = std::min(tiles.rows, N - r0);
    for (int64_t v0 = 0; v0 < V; v0 += tiles.vocab) {
      const int64_t Vt = std::min(tiles.vocab, V - v0);
      float* dz = ws.logits;
      RETURN_IF_ERROR(Gemm(cublas, stream, false, true, R, Vt, C, 1.0f, h + r0 * C, C, wte + v0 * C,
                           C, 0.0f, dz, Vt));
      RETURN_IF_ERROR(LaunchStatus(
          cuda_internal::LaunchCrossEntropyBackwardTile(
              R, Vt, v0, V, shape.ignore_index, targets + r0, lse + r0, ws.scale, dz, stream),
          kKernel));
      // dh[r0:r0+R] += dz wte[v0:v0+Vt];  dwte[v0:v0+Vt] += dz^T h[r0:r0+R].
      RETURN_IF_ERROR(Gemm(cublas, stream, false, false, R, C, Vt, 1.0f, dz, Vt, wte + v0 * C, C,
                           1.0f, dh + r0 * C, C));
      RETURN_IF_ERROR(Gemm(cublas, stream, true, false, Vt, C, R, 1.0f, dz, Vt, h + r0 * C, C, 1.0f,
                           dwte + v0 * C, C));
    }
  }
  return absl::OkStatus();
}

}  // namespace ps::cuda
