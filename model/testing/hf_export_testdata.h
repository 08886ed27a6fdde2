// Test data for the Hugging Face exporter: small model directories written by WriteHfCheckpoint
// with deterministic parameter values, committed under model/testdata/cpp_export_*/ and checked
// by model/testdata/check_cpp_export.py (transformers' from_pretrained loads them and finds these
// values); model/hf_checkpoint_test.cc checks that the exporter still writes exactly those bytes.
//
// Values: element i of the tensor called `name` is (k - 64) / 64 with
// k = (Mix64(Fnv1a64(name) + i) >> 40) mod 129 — a multiple of 1/64 in [-1, 1], exact in f32, f16
// and bf16, so every dtype holds the same numbers and Python can recompute them exactly.
#ifndef PATRICKSTAR_MODEL_TESTING_HF_EXPORT_TESTDATA_H_
#define PATRICKSTAR_MODEL_TESTING_HF_EXPORT_TESTDATA_H_

#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/string_view.h"
#include "absl/types/span.h"
#include "memory/dtype.h"
#include "model/model_config.h"

namespace ps::testing {

// FNV-1a, 64 bits (offset 0xcbf29ce484222325, prime 0x100000001b3).
uint64_t Fnv1a64(absl::Span<const uint8_t> bytes);

// The value of element `i` of tensor `name` (see the file comment).
float HfTestValue(absl::string_view name, int64_t i);

struct HfExportCase {
  std::string dir_name;  // e.g. "cpp_export_llama"
  ModelConfig config;
  DType dtype;
  int64_t max_shard_bytes;
};

// The committed cases: llama (biases, GQA, llama3 RoPE, untied, bf16, sharded), qwen2 (tied,
// head_dim != hidden / heads, f16, sharded), mistral (f32, one file), gpt2 (f32, one file).
std::vector<HfExportCase> HfExportCases();

// Writes every case under `out_dir` (which must exist) with WriteHfCheckpoint.
[[nodiscard]] absl::Status WriteHfExportTestdata(const std::string& out_dir);

}  // namespace ps::testing

#endif  // PATRICKSTAR_MODEL_TESTING_HF_EXPORT_TESTDATA_H_
