#include "model/kernels/cuda/vocab_blocks.h"

#include <cuda_runtime.h>

#include <algorithm>
#include <cstdint>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/str_cat.h"
#include "base/status_macros.h"
#include "memory/cuda/convert_kernels.h"
#include "memory/dtype.h"
#include "model/kernels/cuda/cublas.h"
#include "model/kernels/cuda/internal/host_util.h"
#include "model/kernels/cuda/internal/launchers.h"
#include "model/kernels/cuda/internal/vocab_launchers.h"
#include "model/kernels/vocab_blocks.h"

namespace ps::cuda {
namespace {

using cuda_internal::CheckNotNull;
using cuda_internal::LaunchStatus;

using Tiles = VocabTiles;
Tiles TilesOf(const VocabBlockShape& s) { return VocabTilesOf(s); }

// The workspace carved into its parts (null where the dtype needs none).
struct Workspace {
  float* logits = nullptr;  // [R, Vt] f32: the logits tile, then dlogits in place
  float* scale = nullptr;   // backward: loss_grad / valid targets
  float* wide = nullptr;    // f16: a vocabulary tile widened [Vt, C]
  uint16_t* hb = nullptr;   // bf16: h rounded [N, C]
  uint16_t* dzb = nullptr;  // bf16 backward: the dlogits tile rounded [R, Vt]
  int64_t bytes = 0;
};

// The parts at LmHeadBlockLayout's offsets (cuda/workspace_sizes.h).
Workspace Carve(const VocabBlockShape& s, DType dtype, bool backward, void* base) {
  const LmHeadBlockWorkspaceLayout l = LmHeadBlockLayout(s, dtype, backward);
  char* p = static_cast<char*>(base);
  auto part = [&](int64_t offset) -> void* {
    return offset < 0 || p == nullptr ? nullptr : p + offset;
  };
  Workspace w;
  w.logits = static_cast<float*>(part(l.logits));
  w.scale = static_cast<float*>(part(l.scale));
  w.wide = static_cast<float*>(part(l.wide));
  w.hb = static_cast<uint16_t*>(part(l.hb));
  w.dzb = static_cast<uint16_t*>(part(l.dzb));
  w.bytes = l.bytes;
  return w;
}

GemmOperand BlockOperand(DType dtype) {
  return dtype == DType::kBF16 ? GemmOperand::kBF16 : GemmOperand::kF32;
}

absl::Status CheckLmHeadArgs(const char* kernel, const VocabBlockShape& s, DType dtype,
                             const float* h, const void* block, const int32_t* targets,
                             const void* workspace, int64_t workspace_bytes, bool backward) {
  RETURN_IF_ERROR(CheckNotNull(
      kernel, {{"h", h}, {"block", block}, {"targets", targets}, {"workspace", workspace}}));
  const int64_t needed = Carve(s, dtype, backward, nullptr).bytes;
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

// The GEMM operand of vocabulary tile `vl` (local row) of the block: the block's rows (f32, bf16)
// or the tile widened into the workspace (f16, enqueued here).
absl::StatusOr<const void*> TileRows(const char* kernel, const VocabBlockShape& s, DType dtype,
                                     const void* block, int64_t vl, int64_t vt, const Workspace& ws,
                                     cudaStream_t stream) {
  const int64_t C = s.channels;
  switch (dtype) {
    case DType::kF32:
      return static_cast<const void*>(static_cast<const float*>(block) + vl * C);
    case DType::kBF16:
      return static_cast<const void*>(static_cast<const uint16_t*>(block) + vl * C);
    case DType::kF16:
      RETURN_IF_ERROR(
          LaunchStatus(LaunchConvertF16ToF32(static_cast<const uint16_t*>(block) + vl * C, ws.wide,
                                             vt * C, stream),
                       kernel));
      return static_cast<const void*>(ws.wide);
  }
  return absl::InvalidArgumentError(absl::StrCat(kernel, ": unknown block dtype"));
}

}  // namespace

absl::Status EmbeddingBlockForward(const VocabBlockShape& s, const int32_t* tokens,
                                   DType block_dtype, const void* block, float* out,
                                   cudaStream_t stream) {
  constexpr char kKernel[] = "cuda::EmbeddingBlockForward";
  RETURN_IF_ERROR(CheckNotNull(kKernel, {{"tokens", tokens}, {"block", block}, {"out", out}}));
  return LaunchStatus(cuda_internal::LaunchEmbeddingBlockForward(
                          s.rows, s.channels, s.vocab_size, s.row_begin, s.block_rows, tokens,
                          static_cast<int>(block_dtype), block, out, stream),
                      kKernel);
}

absl::Status ScatterRowsAdd(int64_t channels, int64_t vocab_size, int64_t num_slots,
                            int64_t num_tokens, const int32_t* tokens, const int32_t* slot_of_token,
                            const float* dout, float* slot_rows, cudaStream_t stream) {
  constexpr char kKernel[] = "cuda::ScatterRowsAdd";
  RETURN_IF_ERROR(CheckNotNull(kKernel, {{"tokens", tokens},
                                         {"slot_of_token", slot_of_token},
                                         {"dout", dout},
                                         {"slot_rows", slot_rows}}));
  return LaunchStatus(
      cuda_internal::LaunchScatterRowsAdd(num_tokens, channels, vocab_size, num_slots, tokens,
                                          slot_of_token, dout, slot_rows, stream),
      kKernel);
}

absl::Status CopyRowsToSlots(int64_t channels, int64_t vocab_size, int64_t num_slots,
                             int64_t row_begin, int64_t rows, const int32_t* slot_of_token,
                             const float* src, float* slot_rows, cudaStream_t stream) {
  constexpr char kKernel[] = "cuda::CopyRowsToSlots";
  RETURN_IF_ERROR(CheckNotNull(
      kKernel, {{"slot_of_token", slot_of_token}, {"src", src}, {"slot_rows", slot_rows}}));
  return LaunchStatus(
      cuda_internal::LaunchCopyRowsToSlots(row_begin, rows, channels, vocab_size, num_slots,
                                           slot_of_token, src, slot_rows, stream),
      kKernel);
}

absl::Status CopySlotsToRows(int64_t channels, int64_t vocab_size, int64_t num_slots,
                             int64_t row_begin, int64_t rows, const int32_t* slot_of_token,
                             const float* slot_rows, DType dst_dtype, void* dst,
                             cudaStream_t stream) {
  constexpr char kKernel[] = "cuda::CopySlotsToRows";
  RETURN_IF_ERROR(CheckNotNull(
      kKernel, {{"slot_of_token", slot_of_token}, {"slot_rows", slot_rows}, {"dst", dst}}));
  return LaunchStatus(cuda_internal::LaunchCopySlotsToRows(
                          row_begin, rows, channels, vocab_size, num_slots, slot_of_token,
                          slot_rows, static_cast<int>(dst_dtype), dst, stream),
                      kKernel);
}

absl::Status PositionEmbeddingForward(int64_t batch, int64_t seq_len, int64_t channels,
                                      const float* wpe, float* out, cudaStream_t stream,
                                      const int32_t* positions, int64_t max_positions) {
  constexpr char kKernel[] = "cuda::PositionEmbeddingForward";
  RETURN_IF_ERROR(CheckNotNull(kKernel, {{"wpe", wpe}, {"out", out}}));
  return LaunchStatus(cuda_internal::LaunchPositionEmbeddingForward(
                          batch, seq_len, channels, max_positions, positions, wpe, out, stream),
                      kKernel);
}

absl::Status PositionEmbeddingBackward(int64_t batch, int64_t seq_len, int64_t channels,
                                       const float* dout, float* dwpe, cudaStream_t stream,
                                       const int32_t* positions, int64_t max_positions) {
  constexpr char kKernel[] = "cuda::PositionEmbeddingBackward";
  RETURN_IF_ERROR(CheckNotNull(kKernel, {{"dout", dout}, {"dwpe", dwpe}}));
  return LaunchStatus(cuda_internal::LaunchPositionEmbeddingBackward(
                          batch, seq_len, channels, max_positions, positions, dout, dwpe, stream),
                      kKernel);
}

absl::Status LmHeadStateInit(int64_t rows, float* state, cudaStream_t stream) {
  constexpr char kKernel[] = "cuda::LmHeadStateInit";
  RETURN_IF_ERROR(CheckNotNull(kKernel, {{"state", state}}));
  return LaunchStatus(cuda_internal::LaunchLmHeadStateInit(rows, state, stream), kKernel);
}

absl::Status LmHeadBlockForward(const CublasHandle& cublas, const VocabBlockShape& s,
                                const float* h, DType block_dtype, const void* block,
                                const int32_t* targets, float* state, void* workspace,
                                int64_t workspace_bytes, cudaStream_t stream) {
  constexpr char kKernel[] = "cuda::LmHeadBlockForward";
  RETURN_IF_ERROR(CheckLmHeadArgs(kKernel, s, block_dtype, h, block, targets, workspace,
                                  workspace_bytes, /*backward=*/false));
  RETURN_IF_ERROR(CheckNotNull(kKernel, {{"state", state}}));
  const int64_t N = s.rows, C = s.channels;
  const Tiles tiles = TilesOf(s);
  const Workspace ws = Carve(s, block_dtype, /*backward=*/false, workspace);
  float* run_max = state;
  float* run_sum = state + N;
  float* target_logit = state + 2 * N;
  const void* hx = h;
  if (block_dtype == DType::kBF16) {
    RETURN_IF_ERROR(LaunchStatus(LaunchConvertF32ToBF16(h, ws.hb, N * C, stream), kKernel));
    hx = ws.hb;
  }
  const GemmOperand operand = BlockOperand(block_dtype);
  const int64_t elem = operand == GemmOperand::kBF16 ? 2 : 4;
  for (int64_t vl = 0; vl < s.block_rows; vl += tiles.vocab) {
    const int64_t Vt = std::min(tiles.vocab, s.block_rows - vl);
    ASSIGN_OR_RETURN(const void* w, TileRows(kKernel, s, block_dtype, block, vl, Vt, ws, stream));
    for (int64_t r0 = 0; r0 < N; r0 += tiles.rows) {
      const int64_t R = std::min(tiles.rows, N - r0);
      RETURN_IF_ERROR(Gemm(cublas, stream, false, true, R, Vt, C, 1.0f, operand,
                           static_cast<const char*>(hx) + r0 * C * elem, C, w, C, 0.0f, ws.logits,
                           Vt));
      // v0 is the tile's global row: targets match by global index, and at row 0 the state is
      // taken as empty (as LmHeadStateInit left it).
      RETURN_IF_ERROR(LaunchStatus(cuda_internal::LaunchCrossEntropyForwardTile(
                                       R, Vt, s.row_begin + vl, ws.logits, targets + r0,
                                       run_max + r0, run_sum + r0, target_logit + r0, stream),
                                   kKernel));
    }
  }
  return absl::OkStatus();
}

absl::Status LmHeadFinish(const VocabBlockShape& s, const int32_t* targets, const float* state,
                          float* lse, double* loss, cudaStream_t stream) {
  constexpr char kKernel[] = "cuda::LmHeadFinish";
  RETURN_IF_ERROR(CheckNotNull(
      kKernel, {{"targets", targets}, {"state", state}, {"lse", lse}, {"loss", loss}}));
  return LaunchStatus(cuda_internal::LaunchLmHeadFinish(s.rows, s.vocab_size, s.ignore_index,
                                                        targets, state, lse, loss, stream),
                      kKernel);
}

absl::Status LmHeadBlockBackward(const CublasHandle& cublas, const VocabBlockShape& s,
                                 const float* h, DType block_dtype, const void* block,
                                 const int32_t* targets, const float* lse, double loss_grad,
                                 float* dh, float* dblock, void* workspace, int64_t workspace_bytes,
                                 cudaStream_t stream) {
  constexpr char kKernel[] = "cuda::LmHeadBlockBackward";
  RETURN_IF_ERROR(CheckLmHeadArgs(kKernel, s, block_dtype, h, block, targets, workspace,
                                  workspace_bytes, /*backward=*/true));
  // dblock is optional (input gradient only: dh alone).
  RETURN_IF_ERROR(CheckNotNull(kKernel, {{"lse", lse}, {"dh", dh}}));
  const int64_t N = s.rows, C = s.channels, V = s.vocab_size;
  const Tiles tiles = TilesOf(s);
  const Workspace ws = Carve(s, block_dtype, /*backward=*/true, workspace);
  const bool bf16 = block_dtype == DType::kBF16;
  if (bf16) {
    RETURN_IF_ERROR(LaunchStatus(LaunchConvertF32ToBF16(h, ws.hb, N * C, stream), kKernel));
  }
  RETURN_IF_ERROR(LaunchStatus(cuda_internal::LaunchCrossEntropyGradScale(
                                   N, s.ignore_index, targets, loss_grad, ws.scale, stream),
                               kKernel));
  for (int64_t vl = 0; vl < s.block_rows; vl += tiles.vocab) {
    const int64_t Vt = std::min(tiles.vocab, s.block_rows - vl);
    ASSIGN_OR_RETURN(const void* w, TileRows(kKernel, s, block_dtype, block, vl, Vt, ws, stream));
    float* dblock_tile = dblock == nullptr ? nullptr : dblock + vl * C;
    for (int64_t r0 = 0; r0 < N; r0 += tiles.rows) {
      const int64_t R = std::min(tiles.rows, N - r0);
      float* dz = ws.logits;
      const float beta = r0 == 0 ? 0.0f : 1.0f;  // dblock is written, not added to
      if (bf16) {
        RETURN_IF_ERROR(Gemm(cublas, stream, false, true, R, Vt, C, 1.0f, GemmOperand::kBF16,
                             ws.hb + r0 * C, C, w, C, 0.0f, dz, Vt));
      } else {
        RETURN_IF_ERROR(Gemm(cublas, stream, false, true, R, Vt, C, 1.0f, GemmOperand::kF32,
                             h + r0 * C, C, w, C, 0.0f, dz, Vt));
      }
      RETURN_IF_ERROR(LaunchStatus(cuda_internal::LaunchCrossEntropyBackwardTile(
                                       R, Vt, s.row_begin + vl, V, s.ignore_index, targets + r0,
                                       lse + r0, ws.scale, dz, stream),
                                   kKernel));
      if (bf16) {
        // dh[r0:r0+R] += bf16(dz) W;  dW = (or +=) bf16(dz)^T bf16(h)[r0:r0+R].
        RETURN_IF_ERROR(LaunchStatus(LaunchConvertF32ToBF16(dz, ws.dzb, R * Vt, stream), kKernel));
        RETURN_IF_ERROR(Gemm(cublas, stream, false, false, R, C, Vt, 1.0f, GemmOperand::kBF16,
                             ws.dzb, Vt, w, C, 1.0f, dh + r0 * C, C));
        if (dblock_tile != nullptr) {
          RETURN_IF_ERROR(Gemm(cublas, stream, true, false, Vt, C, R, 1.0f, GemmOperand::kBF16,
                               ws.dzb, Vt, ws.hb + r0 * C, C, beta, dblock_tile, C));
        }
      } else {
        RETURN_IF_ERROR(Gemm(cublas, stream, false, false, R, C, Vt, 1.0f, GemmOperand::kF32, dz,
                             Vt, w, C, 1.0f, dh + r0 * C, C));
        if (dblock_tile != nullptr) {
          RETURN_IF_ERROR(Gemm(cublas, stream, true, false, Vt, C, R, 1.0f, GemmOperand::kF32, dz,
                               Vt, h + r0 * C, C, beta, dblock_tile, C));
        }
      }
    }
  }
  return absl::OkStatus();
}

}  // namespace ps::cuda
