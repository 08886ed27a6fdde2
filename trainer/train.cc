// The training program: `bazel run //trainer:train [-- --config=ds_config.json --flag=value ...]`.
//
// With no arguments it trains the embedded default (trainer/config.h DefaultTrainConfig: a small
// GPT on the built-in synthetic corpus, on the emulated accelerator with a memory cap below the
// model data, so chunks really move). A DeepSpeed-format JSON config (--config) replaces the
// default; the other flags override single keys of whichever config is used. See README.md.
//
// Exit codes: 0 after training (also after a SIGINT/SIGTERM, which finishes the current step
// and writes a checkpoint when checkpoint.dir / --save_dir is set); 1 when the run failed; 2
// for a bad config or flag, reported before any work is done.
//
// Data parallelism: `mpirun -np N bazel-bin/trainer/train ...` runs N ranks of one run (the mpi
// communicator, --comm=auto); see trainer/trainer.h. A rank that fails exits 1 without
// MPI_Finalize, so mpirun ends the others.
#include <cstdint>
#include <iostream>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "absl/flags/flag.h"
#include "absl/flags/parse.h"
#include "absl/flags/usage.h"
#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "comm/communicator.h"
#include "comm/communicator_factory.h"
#include "comm/mpi_communicator.h"
#include "glog/logging.h"
#include "trainer/config.h"
#include "trainer/config_json.h"
#include "trainer/config_overrides.h"
#include "trainer/config_parse.h"
#include "trainer/config_validate.h"
#include "trainer/io/signal_flag.h"
#include "trainer/trainer.h"

ABSL_FLAG(std::string, config, "",
          "DeepSpeed-format JSON config file (with this project's model/chunk/accelerator/data/"
          "checkpoint/profile sections). Empty: the embedded default run.");
ABSL_FLAG(std::string, model, "",
          "Model preset (tiny, gpt2, gpt2-medium, gpt2-large, gpt2-xl, 1B ... 18B); replaces the "
          "config's model dimensions.");
ABSL_FLAG(std::string, train_data, "", "Training tokens: an llm.c .bin file (data.train).");
ABSL_FLAG(std::string, val_data, "", "Validation tokens: an llm.c .bin file (data.val).");
ABSL_FLAG(std::string, init_from, "",
          "Initialize from a Hugging Face GPT-2 safetensors file (checkpoint.init_from).");
ABSL_FLAG(std::optional<int64_t>, steps, std::nullopt, "Training steps (train_steps).");
ABSL_FLAG(std::optional<int64_t>, seq_len, std::nullopt,
          "Tokens per sequence (data.seq_len; 0: the model's n_positions).");
ABSL_FLAG(std::optional<int64_t>, micro_batch_size, std::nullopt,
          "Sequences per step (train_micro_batch_size_per_gpu).");
ABSL_FLAG(std::string, accelerator, "", "Accelerator backend: cpu (emulated) or cuda.");
ABSL_FLAG(std::string, accelerator_memory, "",
          "Accelerator memory cap, e.g. 64MiB or 1.5GB (accelerator.memory).");
ABSL_FLAG(std::string, chunk_size, "", "Chunk size in elements, or auto (chunk.size).");
ABSL_FLAG(std::string, save_dir, "", "Checkpoint directory (checkpoint.dir).");
ABSL_FLAG(bool, resume, false,
          "Continue from the newest checkpoint in the checkpoint directory (checkpoint.resume).");
ABSL_FLAG(std::string, metrics_out, "", "JSON Lines metrics file, one object per step.");
ABSL_FLAG(std::string, trace_out, "",
          "Chrome trace-event profile (open in ui.perfetto.dev or chrome://tracing).");
ABSL_FLAG(std::optional<uint64_t>, seed, std::nullopt, "Seed of the parameter initialization.");
ABSL_FLAG(bool, print_config, false, "Print the resolved config as JSON and exit.");
ABSL_FLAG(std::string, comm, "auto",
          "Data-parallel communicator: auto (mpi when started by mpirun, else a world of one), "
          "local (a world of one) or mpi. With N ranks, chunks are sharded ZeRO-style and each "
          "step trains on N micro-batches; rank 0 prints.");

namespace ps {
namespace {

std::optional<std::string> NonEmpty(const std::string& s) {
  if (s.empty()) return std::nullopt;
  return s;
}

int Main(int argc, char** argv) {
  absl::SetProgramUsageMessage(
      "Trains a GPT-2 whose parameters, gradients and Adam state live in chunks that move "
      "between accelerator and host memory (PatrickStar's design).\n"
      "  bazel run //trainer:train                      # the embedded default run\n"
      "  bazel run //trainer:train -- --config=ds.json  # a DeepSpeed-format config\n"
      "Flags override single keys of the config.");
  absl::ParseCommandLine(argc, argv);

  absl::StatusOr<TrainConfig> config = DefaultTrainConfig();
  if (!absl::GetFlag(FLAGS_config).empty()) {
    config = LoadTrainConfig(absl::GetFlag(FLAGS_config));
  }
  if (!config.ok()) {
    std::cerr << "error: " << config.status().message() << "\n";
    return 2;
  }
  ConfigOverrides o;
  o.model = NonEmpty(absl::GetFlag(FLAGS_model));
  o.train_data = NonEmpty(absl::GetFlag(FLAGS_train_data));
  o.val_data = NonEmpty(absl::GetFlag(FLAGS_val_data));
  o.init_from = NonEmpty(absl::GetFlag(FLAGS_init_from));
  o.accelerator = NonEmpty(absl::GetFlag(FLAGS_accelerator));
  o.accelerator_memory = NonEmpty(absl::GetFlag(FLAGS_accelerator_memory));
  o.chunk_size = NonEmpty(absl::GetFlag(FLAGS_chunk_size));
  o.save_dir = NonEmpty(absl::GetFlag(FLAGS_save_dir));
  o.metrics_out = NonEmpty(absl::GetFlag(FLAGS_metrics_out));
  o.trace_out = NonEmpty(absl::GetFlag(FLAGS_trace_out));
  o.steps = absl::GetFlag(FLAGS_steps);
  o.seq_len = absl::GetFlag(FLAGS_seq_len);
  o.micro_batch_size = absl::GetFlag(FLAGS_micro_batch_size);
  o.seed = absl::GetFlag(FLAGS_seed);
  if (absl::GetFlag(FLAGS_resume)) o.resume = true;
  absl::Status status = ApplyOverrides(o, &*config);
  if (status.ok()) status = ValidateTrainConfig(*config);
  if (!status.ok()) {
    std::cerr << "error: " << status.message() << "\n";
    return 2;
  }
  if (absl::GetFlag(FLAGS_print_config)) {
    // (Before any communicator: prints on every rank under mpirun.)
    std::cout << TrainConfigToJson(*config) << "\n";
    return 0;
  }

  if (absl::Status s = InstallStopSignalHandlers(); !s.ok()) {
    std::cerr << "error: " << s.message() << "\n";
    return 1;
  }
  const std::string comm_kind = absl::GetFlag(FLAGS_comm);
  if (comm_kind != "auto" && comm_kind != "local" && comm_kind != "mpi") {
    std::cerr << "error: --comm must be auto, local or mpi, got \"" << comm_kind << "\"\n";
    return 2;
  }
  std::unique_ptr<Communicator> communicator;
  if (comm_kind == "mpi" || (comm_kind == "auto" && MpiCommunicator::LaunchedByMpirun())) {
    CommunicatorOptions comm_options;
    comm_options.kind = "mpi";
    absl::StatusOr<std::unique_ptr<Communicator>> created = CreateCommunicator(comm_options);
    if (!created.ok()) {
      std::cerr << "error: " << created.status().message() << "\n";
      return 1;
    }
    communicator = *std::move(created);
  }
  TrainerEnvironment env;
  env.out = &std::cout;
  env.communicator = communicator.get();
  env.stop_requested = [] { return StopRequested(); };
  env.config_path = absl::GetFlag(FLAGS_config);
  absl::StatusOr<std::unique_ptr<Trainer>> trainer = Trainer::Create(*config, env);
  if (!trainer.ok()) {
    std::cerr << "error: " << trainer.status().message() << "\n";
    return trainer.status().code() == absl::StatusCode::kInvalidArgument ? 2 : 1;
  }
  status = (*trainer)->Run();
  std::cout.flush();
  if (!status.ok()) {
    std::cerr << "error: " << status.message() << "\n";
    return 1;
  }
  return 0;
}

}  // namespace
}  // namespace ps

int main(int argc, char** argv) {
  google::InitGoogleLogging(argv[0]);
  FLAGS_logtostderr = true;
  return ps::Main(argc, argv);
}
