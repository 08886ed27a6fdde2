// ModelStateIo's 4-bit weights (model/model_state_io.h, model/quant4_config.h): quantizing the
// logical values into a weight's blob as they are set, and dequantizing them as they are read.
#include <cstdint>
#include <cstring>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "base/mutex.h"
#include "absl/types/span.h"
#include "base/status_macros.h"
#include "chunk/chunk_type.h"
#include "glog/logging.h"
#include "memory/dtype.h"
#include "model/kernels/nf4.h"
#include "model/model_state_io.h"
#include "model/quant4_config.h"

namespace ps {

absl::Status ModelStateIo::WriteQuant4(TensorId tensor, const Quant4Format& q,
                                       absl::Span<const float> values, ThreadPool* pool) {
  ASSIGN_OR_RETURN(TensorView param, parts_.store->View(ChunkType::kParam, tensor));
  RETURN_IF_ERROR(RequireHostPayload(param, "setting a 4-bit weight"));
  const int64_t n = q.num_elems();
  CHECK_EQ(static_cast<int64_t>(values.size()), n);
  const Quant4BlobLayout layout = Quant4BlobLayoutOf(q);
  CHECK_LE(layout.bytes, param.bytes());
  const std::string& name = parts_.store->layout().tensor(tensor).name;
  // GPT-2's Conv1D: the values are [in, out]; bitsandbytes quantizes the [out, in] transpose.
  std::vector<float> transposed;
  const float* src = values.data();
  if (q.transposed) {
    transposed.resize(static_cast<size_t>(n));
    for (int64_t i = 0; i < q.cols; ++i) {
      for (int64_t o = 0; o < q.rows; ++o) transposed[o * q.cols + i] = values[i * q.rows + o];
    }
    src = transposed.data();
  }
  auto* blob = static_cast<uint8_t*>(param.data);
  std::memset(blob, 0, static_cast<size_t>(param.bytes()));
  const absl::Span<uint8_t> codes(blob + layout.codes, static_cast<size_t>(Quant4CodeBytes(n)));
  const int64_t blocks = Quant4NumBlocks(n);
  auto named = [&](const absl::Status& s) {
    return s.ok() ? s
                  : absl::Status(s.code(), absl::StrCat("quantizing '", name, "' to 4 bits (",
                                                         Quant4TypeName(q.type), "): ", s.message()));
  };
  if (!q.nested) {
    const absl::Span<float> absmax(reinterpret_cast<float*>(blob + layout.absmax),
                                   static_cast<size_t>(blocks));
    RETURN_IF_ERROR(named(Quantize4Bit(q.type, DType::kF32, src, n, codes, absmax, pool)));
    MutexLock lock(&quant4_mu_);
    parts_.quant4->nested_offset.erase(tensor);
    return absl::OkStatus();
  }
  std::vector<float> absmax(static_cast<size_t>(blocks));
  RETURN_IF_ERROR(
      named(Quantize4Bit(q.type, DType::kF32, src, n, codes, absl::MakeSpan(absmax), pool)));
  float offset = 0.0f;
  RETURN_IF_ERROR(named(QuantizeAbsmaxNested(
      absmax, absl::MakeSpan(blob + layout.nested_codes, static_cast<size_t>(blocks)),
      absl::MakeSpan(reinterpret_cast<float*>(blob + layout.nested_absmax),
                     static_cast<size_t>(Quant4NestedNumBlocks(blocks))),
      &offset)));
  MutexLock lock(&quant4_mu_);
  parts_.quant4->nested_offset[tensor] = offset;
  return absl::OkStatus();
}

absl::StatusOr<bool> ModelStateIo::WriteQuant4Blob(TensorId tensor,
                                                   const Quant4BlobFillFn& blob_fill) {
  ASSIGN_OR_RETURN(TensorView param, parts_.store->View(ChunkType::kParam, tensor));
  RETURN_IF_ERROR(RequireHostPayload(param, "setting a 4-bit weight"));
  auto* blob = static_cast<uint8_t*>(param.data);
  std::memset(blob, 0, static_cast<size_t>(param.bytes()));
  float offset = 0.0f;
  ASSIGN_OR_RETURN(
      const bool written,
      blob_fill(tensor,
                absl::MakeSpan(blob, static_cast<size_t>(Quant4BlobLayoutOf(*quant4(tensor)).bytes)),
                &offset));
  if (written) {
    MutexLock lock(&quant4_mu_);
    parts_.quant4->nested_offset[tensor] = offset;
  }
  return written;
}

absl::Status ModelStateIo::ReadQuant4Range(TensorId tensor, const Quant4Format& q,
                                           const TensorView& v, int64_t first_elem,
                                           absl::Span<float> out) const {
  std::vector<char> staged;
  const void* blob = v.data;
  if (!v.device.is_host()) {
    staged.resize(static_cast<size_t>(v.bytes()));
    RETURN_IF_ERROR(ReadPayloadBytes(v, absl::MakeSpan(staged)));
    blob = staged.data();
  }
  return DequantizeQuant4Range(q, Quant4TensorAt(q, blob, parts_.quant4->Offset(tensor)),
                               first_elem, out);
}

}  // namespace ps
