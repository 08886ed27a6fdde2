// Prints the chunk-size table for a GPT preset, so a person can pick a chunk size with the
// numbers in front of them (see chunk/chunk_size_search.h for what every column means).
//
//   bazel run //tools:chunk_size_search -- --model=10B --world_size=8
//       --accelerator_memory=80GiB --host_memory=120GiB --dtype=bf16
//
// Exit status 0 with the table on stdout; 1 with an explanation on stderr for impossible inputs.
#include "chunk/chunk_size_search.h"

#include <cstdint>
#include <iostream>
#include <string>
#include <vector>

#include "absl/flags/flag.h"
#include "absl/flags/parse.h"
#include "absl/flags/usage.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "base/status_macros.h"
#include "base/units.h"
#include "chunk/chunk_layout.h"
#include "memory/dtype.h"
#include "model/gpt_config.h"

ABSL_FLAG(std::string, model, "gpt2",
          "GPT preset: tiny, gpt2, gpt2-medium, gpt2-large, gpt2-xl, 1B, 2B, 4B, 6B, 8B, 10B, "
          "12B, 15B, 18B");
ABSL_FLAG(int, world_size, 1, "data-parallel ranks sharing the model ZeRO-style");
ABSL_FLAG(std::string, accelerator_memory, "16GiB", "memory of one accelerator, e.g. 80GiB");
ABSL_FLAG(std::string, host_memory, "64GiB", "host memory available to one rank, e.g. 240GiB");
ABSL_FLAG(std::string, dtype, "f16", "compute dtype of the param chunks: f16, bf16 or f32");
ABSL_FLAG(double, working_set_fraction, 0.5,
          "share of the accelerator one operator's gathered chunks may use; the rest is left "
          "for activations and workspaces");
ABSL_FLAG(int64_t, granularity_elems, ps::kMiB, "candidate chunk sizes are multiples of this");
ABSL_FLAG(int64_t, min_chunk_elems, 0, "smallest candidate (0: the largest operator)");
ABSL_FLAG(int64_t, max_chunk_elems, 0, "largest candidate (0: twice the smallest)");
ABSL_FLAG(int64_t, tensor_alignment_elems, 1, "every tensor offset is a multiple of this");
ABSL_FLAG(int, rows, 20, "rows to print, best first");
ABSL_FLAG(bool, all, false, "print every candidate, by chunk size");

namespace ps {
namespace {

absl::Status Run() {
  ASSIGN_OR_RETURN(GptConfig config, GptPreset(absl::GetFlag(FLAGS_model)));
  ChunkSizeSearchOptions options;
  options.world_size = absl::GetFlag(FLAGS_world_size);
  ASSIGN_OR_RETURN(options.compute_dtype, ParseDType(absl::GetFlag(FLAGS_dtype)));
  absl::StatusOr<int64_t> accelerator = ParseBytes(absl::GetFlag(FLAGS_accelerator_memory));
  if (!accelerator.ok()) {
    return absl::InvalidArgumentError(
        absl::StrCat("--accelerator_memory: ", accelerator.status().message()));
  }
  absl::StatusOr<int64_t> host = ParseBytes(absl::GetFlag(FLAGS_host_memory));
  if (!host.ok()) {
    return absl::InvalidArgumentError(absl::StrCat("--host_memory: ", host.status().message()));
  }
  options.accelerator_memory_bytes = *accelerator;
  options.host_memory_bytes = *host;
  options.working_set_fraction = absl::GetFlag(FLAGS_working_set_fraction);
  options.granularity_elems = absl::GetFlag(FLAGS_granularity_elems);
  options.min_chunk_elems = absl::GetFlag(FLAGS_min_chunk_elems);
  options.max_chunk_elems = absl::GetFlag(FLAGS_max_chunk_elems);
  options.tensor_alignment_elems = absl::GetFlag(FLAGS_tensor_alignment_elems);

  const std::vector<OperatorSpec> ops = GptOperators(config);
  ASSIGN_OR_RETURN(ChunkSizeSearchResult result, SearchChunkSize(ops, options));
  std::cout << absl::StrFormat("%s: hidden %d, %d layers, %d heads, seq %d, vocab %d\n",
                               config.name, config.hidden, config.num_layers, config.num_heads,
                               config.max_seq_len, config.vocab_size);
  std::cout << FormatChunkSizeTable(result, options,
                                    absl::GetFlag(FLAGS_all) ? 0 : absl::GetFlag(FLAGS_rows));

  // The best candidate, checked against the layout the runtime will build.
  ASSIGN_OR_RETURN(ChunkLayout layout,
                   ChunkLayout::Build({.capacity_elems = result.best.chunk_elems,
                                       .world_size = options.world_size,
                                       .tensor_alignment_elems = options.tensor_alignment_elems},
                                      ops));
  RETURN_IF_ERROR(layout.Validate());
  std::cout << absl::StrFormat(
      "\nverified by building the layout: chunk %d elements, %d chunks per type (%d padding), "
      "utilization %.2f%%, model data %s over all ranks, %s on rank 0\n",
      layout.capacity_elems(), layout.num_chunks(), layout.num_padding_chunks(),
      100.0 * layout.utilization(), FormatBytes(layout.TotalModelDataBytes(options.compute_dtype)),
      FormatBytes(layout.RankModelDataBytes(options.compute_dtype, 0)));
  return absl::OkStatus();
}

}  // namespace
}  // namespace ps

int main(int argc, char** argv) {
  absl::SetProgramUsageMessage(
      "Prints the chunk-size table for a GPT preset: chunk count, padding, utilization, model "
      "data, working set and fit for every candidate chunk size, best first.\n"
      "Example: chunk_size_search --model=10B --world_size=8 --accelerator_memory=80GiB "
      "--host_memory=120GiB");
  absl::ParseCommandLine(argc, argv);
  const absl::Status status = ps::Run();
  if (!status.ok()) {
    std::cerr << "chunk_size_search: " << status.message() << "\n";
    return 1;
  }
  return 0;
}
