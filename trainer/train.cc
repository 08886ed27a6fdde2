// The training program: `bazel run //trainer:train [-- --config=ds_config.json --flag=value ...]`.
//
// With no arguments it trains the embedded default (trainer/config.h DefaultTrainConfig: a small
// GPT on the built-in synthetic corpus, on the emulated accelerator with a memory cap below the
// model data, so chunks really move). A DeepSpeed-format JSON config (--config) replaces the
// default; the other flags override single keys of whichever config is used. The config may be a
// pipe or FIFO (--config=<(...), --config=/dev/stdin): it is read once. See README.md.
//
// Exit codes: 0 after training (also after a SIGINT/SIGTERM, which finishes the current step
// and writes a checkpoint when checkpoint.dir / --save_dir is set); 1 when the run failed
// (including a run that diverged: Inf/NaN loss or gradients, or fp16 weights that are no longer
// finite; and an input that cannot be read); 2 for a mistake in the flags or the config found
// before training — a flag that cannot be parsed, an unknown one, a stray argument, a flag given
// an empty value, a bad value (InvalidArgument), something the config asks for that this program
// does not implement (Unimplemented), or outputs that would overwrite an input — reported before
// any work is done.
//
// An empty value is never "not given": `--train_data=` (or `--train_data=$DATA` with DATA unset)
// is refused naming the flag, for every flag of this program (RefuseEmptyFlags); a flag left out
// keeps the config's value.
//
// Data parallelism: `mpirun -np N bazel-bin/trainer/train ...` runs N ranks of one run (the mpi
// communicator, --comm=auto; nccl when --accelerator=cuda); see trainer/trainer.h. A rank that
// fails exits 1 without MPI_Finalize, so mpirun ends the others. --comm=nccl (a --config=cuda
// build, --accelerator=cuda, a GPU: config_validate.h CheckNcclComm refuses anything else before
// any work, exit 1 for the build or the machine, 2 for the config) runs the same ranks'
// collectives over NCCL, bootstrapped over mpi, each rank on its own GPU: the node-local rank
// counted from accelerator.device (comm/communicator_factory.h ChooseTrainingCommunicator).
// --comm=mpi with --accelerator=cuda under mpirun is refused (exit 2).
#include <unistd.h>

#include <algorithm>
#include <cstdint>
#include <cstdio>
#include <filesystem>
#include <iostream>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "absl/flags/commandlineflag.h"
#include "absl/flags/flag.h"
#include "absl/flags/parse.h"
#include "absl/flags/reflection.h"
#include "absl/flags/usage.h"
#include "absl/status/status.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/string_view.h"
#include "absl/strings/strip.h"
#include "base/clock.h"
#include "base/flag_presence.h"
#include "comm/communicator.h"
#include "comm/communicator_factory.h"
#include "comm/mpi_communicator.h"
#include "glog/logging.h"
#include "memory/backend_factory.h"
#include "model/hf_config.h"
#include "model/model_config.h"
#include "trainer/config.h"
#include "trainer/config_json.h"
#include "trainer/config_overrides.h"
#include "trainer/config_parse.h"
#include "trainer/config_validate.h"
#include "trainer/io/signal_flag.h"
#include "trainer/trainer.h"

ABSL_FLAG(std::string, config, "",
          "DeepSpeed-format JSON config file (with this project's model/chunk/accelerator/data/"
          "checkpoint/profile sections). Left out: the embedded default run.");
ABSL_FLAG(std::string, model, "",
          "Model preset, trained from a seeded random init; replaces the config's model "
          "dimensions. GPT-2: tiny, gpt2, gpt2-medium, gpt2-large, gpt2-xl, 1B ... 18B; the Llama "
          "family: llama-3.2-1b, llama-3-8b, llama-2-7b, tinyllama-1.1b, qwen2.5-0.5b, "
          "qwen2.5-1.5b, qwen2.5-3b, mistral-7b-v0.3, qwen3-0.6b, qwen3-4b, llama-tiny.");
ABSL_FLAG(std::string, train_data, "",
          "Training data: an llm.c .bin token file or an example file (data.train).");
ABSL_FLAG(std::string, val_data, "",
          "Validation data: an llm.c .bin token file or an example file (data.val).");
ABSL_FLAG(std::optional<bool>, packing, std::nullopt,
          "Example files: true packs several examples per row, false puts one example per row "
          "(data.packing; ignored for token files).");
ABSL_FLAG(std::string, init_from, "",
          "Initialize from a Hugging Face GPT-2 safetensors file, or a Hugging Face model "
          "directory (config.json of Llama/Qwen2/Qwen3/Mistral/GPT-2 + model.safetensors or its "
          "sharded index), whose config.json then defines the model (checkpoint.init_from).");
ABSL_FLAG(std::optional<int64_t>, steps, std::nullopt, "Training steps (train_steps).");
ABSL_FLAG(std::optional<int64_t>, seq_len, std::nullopt,
          "Tokens per sequence (data.seq_len; 0: the model's n_positions).");
ABSL_FLAG(std::optional<int64_t>, micro_batch_size, std::nullopt,
          "Sequences per step (train_micro_batch_size_per_gpu).");
ABSL_FLAG(std::optional<int64_t>, gradient_accumulation_steps, std::nullopt,
          "Micro-batches per optimizer step (gradient_accumulation_steps).");
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
ABSL_FLAG(std::string, nvme_path, "",
          "Directory on a local SSD for the disk tier: the optimizer state (master weights, "
          "momentum, variance) that host memory cannot hold lives in swap files there "
          "(zero_optimization.offload_optimizer.device \"nvme\" with this nvme_path; also "
          "offload_param's nvme_path when its device is \"nvme\").");
ABSL_FLAG(std::optional<uint64_t>, seed, std::nullopt, "Seed of the parameter initialization.");
ABSL_FLAG(std::optional<int64_t>, lora_r, std::nullopt,
          "LoRA fine-tuning with adapters of this rank (lora.r; turns LoRA on): the base model is "
          "frozen and low-rank adapters train.");
ABSL_FLAG(std::optional<double>, lora_alpha, std::nullopt,
          "LoRA scale numerator: adapters' output x lora_alpha / r (lora.lora_alpha; default 8).");
ABSL_FLAG(std::optional<double>, lora_dropout, std::nullopt,
          "Dropout on the LoRA adapters' input, in [0, 1) (lora.lora_dropout; default 0).");
ABSL_FLAG(std::string, lora_target_modules, "",
          "Comma-separated module names to adapt, e.g. q_proj,k_proj,v_proj,o_proj (GPT-2: "
          "c_attn,c_proj,c_fc), or all-linear (lora.target_modules).");
ABSL_FLAG(std::string, lora_init_from, "",
          "A PEFT adapter directory (adapter_config.json + adapter_model.safetensors) to continue "
          "from (lora.init_from).");
ABSL_FLAG(std::string, export_merged, "",
          "With LoRA: also write the base model with the adapters merged in as a Hugging Face "
          "model directory (checkpoint.export_merged).");
ABSL_FLAG(bool, load_in_4bit, false,
          "QLoRA: store the frozen base's block linear layers in 4 bits (quantization."
          "load_in_4bit; the quantization section's other keys as the config has them, else "
          "bitsandbytes' defaults: fp4, no double quant, float32 compute). Needs LoRA (a lora "
          "section or --lora_r). --noload_in_4bit turns a config's 4-bit base off.");
ABSL_FLAG(bool, print_config, false, "Print the resolved config as JSON and exit.");
ABSL_FLAG(std::string, comm, "auto",
          "Data-parallel communicator: auto (when started by mpirun: nccl with "
          "--accelerator=cuda, else mpi; without mpirun a world of one), local (a world of "
          "one), mpi (host memory: not with --accelerator=cuda), or nccl (needs a --config=cuda "
          "build, --accelerator=cuda and a GPU per rank: the node-local rank counted from "
          "accelerator.device; bootstrapped over mpi, so launch with mpirun). With N ranks, "
          "chunks are sharded ZeRO-style and each step trains on N micro-batches; rank 0 prints.");

namespace ps {
namespace {

// A string flag's value when it was given, else std::nullopt (the config's value stays).
std::optional<std::string> Given(const absl::Flag<std::string>& flag) {
  if (!FlagGiven(absl::GetFlagReflectionHandle(flag).Name())) return std::nullopt;
  return absl::GetFlag(flag);
}

// The exit status of a problem found before training (README, docs/training.md#exit-status): 2
// for a mistake in the flags or the config — a bad value (InvalidArgument) or something this
// program does not implement (Unimplemented) — else 1 (an input that cannot be read, the machine).
int ExitCodeBeforeTraining(const absl::Status& status) {
  return status.code() == absl::StatusCode::kInvalidArgument ||
                 status.code() == absl::StatusCode::kUnimplemented
             ? 2
             : 1;
}

size_t EditDistance(absl::string_view a, absl::string_view b) {
  std::vector<size_t> row(b.size() + 1);
  for (size_t j = 0; j <= b.size(); ++j) row[j] = j;
  for (size_t i = 1; i <= a.size(); ++i) {
    size_t diagonal = row[0];
    row[0] = i;
    for (size_t j = 1; j <= b.size(); ++j) {
      const size_t up = row[j];
      row[j] = std::min({row[j] + 1, row[j - 1] + 1, diagonal + (a[i - 1] == b[j - 1] ? 0 : 1)});
      diagonal = up;
    }
  }
  return row[b.size()];
}

// absl::ParseCommandLine exits with status 1 on an argument it cannot parse, but a bad flag must
// exit 2 (README). So every argument is checked first, with absl's own syntax (--name=value,
// --name value for non-boolean flags, --[no]name for booleans, -name as --name, "--" ends the
// flags) and each flag's own parser (CommandLineFlag::ParseFrom; absl parses again afterwards).
// This program takes no positional arguments. Arguments that change how absl reads the others
// (--flagfile, --fromenv, --tryfromenv, --undefok) and the usage flags (--help*, --version,
// --only_check_args) are left to absl.
absl::Status CheckArguments(int argc, char** argv) {
  for (int i = 1; i < argc; ++i) {
    const absl::string_view a = argv[i];
    for (absl::string_view special :
         {"flagfile", "fromenv", "tryfromenv", "undefok", "help", "version", "only_check_args"}) {
      if (absl::StartsWith(a, absl::StrCat("--", special)) ||
          absl::StartsWith(a, absl::StrCat("-", special))) {
        return absl::OkStatus();
      }
    }
  }
  for (int i = 1; i < argc; ++i) {
    absl::string_view arg = argv[i];
    if (arg == "--") {
      if (i + 1 < argc) {
        return absl::InvalidArgumentError(absl::StrCat(
            "unexpected argument '", argv[i + 1], "': this program takes flags only (see --help)"));
      }
      break;
    }
    if (!absl::ConsumePrefix(&arg, "--") && !absl::ConsumePrefix(&arg, "-")) {
      return absl::InvalidArgumentError(
          absl::StrCat("unexpected argument '", arg,
                       "': this program takes flags only, written --name=value (see --help)"));
    }
    const size_t eq = arg.find('=');
    const absl::string_view name = arg.substr(0, eq);
    const bool has_value = eq != absl::string_view::npos;
    absl::CommandLineFlag* flag = absl::FindCommandLineFlag(name);
    if (flag == nullptr && !has_value && absl::StartsWith(name, "no")) {
      absl::CommandLineFlag* negated = absl::FindCommandLineFlag(name.substr(2));
      if (negated != nullptr && negated->IsOfType<bool>()) continue;  // --noresume
    }
    if (flag == nullptr || flag->IsRetired()) {
      std::string nearest;
      size_t best = 3;  // suggest only close spellings
      std::vector<std::string> known = {"help"};
      for (const absl::CommandLineFlag* own : FlagsDefinedIn(__FILE__)) known.emplace_back(own->Name());
      for (const std::string& candidate : known) {
        const size_t d = EditDistance(name, candidate);
        if (d < best) {
          best = d;
          nearest = candidate;
        }
      }
      return absl::InvalidArgumentError(
          absl::StrCat("unknown flag --", name,
                       nearest.empty() ? "" : absl::StrCat("; did you mean --", nearest, "?"),
                       " (--help lists the flags)"));
    }
    std::string value;
    if (has_value) {
      value = std::string(arg.substr(eq + 1));
    } else if (flag->IsOfType<bool>()) {
      continue;
    } else if (i + 1 < argc && !absl::StartsWith(argv[i + 1], "--")) {
      value = argv[++i];  // --name value
    } else {
      return absl::InvalidArgumentError(
          absl::StrCat("flag --", name, " needs a value: --", name, "=VALUE (see --help)"));
    }
    std::string error;
    if (!flag->ParseFrom(value, &error)) {
      return absl::InvalidArgumentError(
          absl::StrCat("--", name, "=", value, ": ", error, " (see --help)"));
    }
  }
  return absl::OkStatus();
}

int Main(int argc, char** argv, int64_t start_ns) {
  absl::SetProgramUsageMessage(
      "Trains a transformer language model — GPT-2, or the Llama family (Llama 2/3, Qwen2/2.5, "
      "Qwen3, "
      "Mistral) from a preset (--model) or a Hugging Face directory (--init_from) — whose "
      "parameters, gradients and Adam state live in chunks that move between accelerator and "
      "host memory (PatrickStar's design).\n"
      "  bazel run //trainer:train                      # the embedded default run\n"
      "  bazel run //trainer:train -- --config=ds.json  # a DeepSpeed-format config\n"
      "Flags override single keys of the config.");
  if (absl::Status s = CheckArguments(argc, argv); !s.ok()) {
    std::cerr << "error: " << s.message() << "\n";
    return 2;
  }
  absl::ParseCommandLine(argc, argv);
  // An empty value is a mistake (an unset shell variable: --train_data=$DATA), never "not
  // given": every flag defined here (base/flag_presence.h).
  if (absl::Status s = RefuseEmptyFlags(__FILE__); !s.ok()) {
    std::cerr << "error: " << s.message() << "\n";
    return 2;
  }
  const std::string comm_kind = absl::GetFlag(FLAGS_comm);
  if (comm_kind != "auto" && comm_kind != "local" && comm_kind != "mpi" && comm_kind != "nccl") {
    std::cerr << "error: --comm must be auto, local, mpi or nccl, got \"" << comm_kind << "\"\n";
    return 2;
  }

  absl::StatusOr<TrainConfig> config = DefaultTrainConfig();
  if (FlagGiven("config")) config = LoadTrainConfig(absl::GetFlag(FLAGS_config));
  if (!config.ok()) {
    std::cerr << "error: " << config.status().message() << "\n";
    return 2;
  }
  ConfigOverrides o;
  o.model = Given(FLAGS_model);
  o.train_data = Given(FLAGS_train_data);
  o.val_data = Given(FLAGS_val_data);
  o.packing = absl::GetFlag(FLAGS_packing);
  o.init_from = Given(FLAGS_init_from);
  o.accelerator = Given(FLAGS_accelerator);
  o.accelerator_memory = Given(FLAGS_accelerator_memory);
  o.chunk_size = Given(FLAGS_chunk_size);
  o.save_dir = Given(FLAGS_save_dir);
  o.metrics_out = Given(FLAGS_metrics_out);
  o.trace_out = Given(FLAGS_trace_out);
  o.nvme_path = Given(FLAGS_nvme_path);
  o.steps = absl::GetFlag(FLAGS_steps);
  o.seq_len = absl::GetFlag(FLAGS_seq_len);
  o.micro_batch_size = absl::GetFlag(FLAGS_micro_batch_size);
  o.gradient_accumulation_steps = absl::GetFlag(FLAGS_gradient_accumulation_steps);
  o.seed = absl::GetFlag(FLAGS_seed);
  if (absl::GetFlag(FLAGS_resume)) o.resume = true;
  o.lora_r = absl::GetFlag(FLAGS_lora_r);
  o.lora_alpha = absl::GetFlag(FLAGS_lora_alpha);
  o.lora_dropout = absl::GetFlag(FLAGS_lora_dropout);
  o.lora_target_modules = Given(FLAGS_lora_target_modules);
  o.lora_init_from = Given(FLAGS_lora_init_from);
  o.export_merged = Given(FLAGS_export_merged);
  if (FlagGiven("load_in_4bit")) o.load_in_4bit = absl::GetFlag(FLAGS_load_in_4bit);
  absl::Status status = ApplyOverrides(o, &*config);
  if (!status.ok()) {
    std::cerr << "error: " << status.message() << "\n";
    return ExitCodeBeforeTraining(status);
  }
  // Which communicator (comm/communicator_factory.h): --comm=auto picks nccl for cuda under
  // mpirun, --comm=mpi with cuda under mpirun is refused, nccl ranks take their GPU by local rank.
  absl::StatusOr<CommunicatorOptions> comm_choice = ChooseTrainingCommunicator(
      comm_kind, config->accelerator.kind == AcceleratorKind::kCuda,
      MpiCommunicator::LaunchedByMpirun(), config->accelerator.device_index);
  if (!comm_choice.ok()) {
    std::cerr << "error: " << comm_choice.status().message() << "\n";
    return 2;
  }
  // Under mpirun the world size is known once the ranks have joined (the communicator, made
  // below): until then train_batch_size is checked only as far as any world size allows, and
  // Trainer::Create checks micro x accumulation x world before any work (DeepSpeed's rule).
  const bool world_known = comm_choice->kind.empty() || !MpiCommunicator::LaunchedByMpirun();
  status = ValidateTrainConfig(*config, world_known ? std::optional<int>(1) : std::nullopt);
  if (!status.ok()) {
    // A bad value is the config's (2); an input that cannot be read (checkpoint.init_from
    // missing, a symlink loop, not safetensors) fails as it does when the trainer reads it (1).
    std::cerr << "error: " << status.message() << "\n";
    return ExitCodeBeforeTraining(status);
  }
  if (comm_choice->kind == "nccl") {
    // The build, the config and the machine, before any work (config_validate.h).
    status = CheckNcclComm(*config, NcclCompiledIn(), [&] {
      BackendOptions probe;
      probe.kind = "cuda";
      probe.device_index = config->accelerator.device_index;
      return CreateBackend(probe).status();
    });
    if (!status.ok()) {
      std::cerr << "error: " << status.message() << "\n";
      return ExitCodeBeforeTraining(status);
    }
  }
  if (absl::GetFlag(FLAGS_print_config)) {
    // (Before any communicator: prints on every rank under mpirun.)
    std::cout << TrainConfigToJson(*config) << "\n";
    // From a Hugging Face directory the model is its config.json's, not the model section above
    // (stdout stays the JSON alone).
    std::error_code ec;
    const std::string& dir = config->checkpoint.init_from;
    if (!dir.empty() && std::filesystem::is_directory(dir, ec)) {
      const std::string path = (std::filesystem::path(dir) / "config.json").string();
      absl::StatusOr<ModelConfig> model = ReadHfConfig(path);
      if (model.ok()) {
        std::cerr << "note: checkpoint.init_from is a Hugging Face directory: the model trained is "
                  << path << "'s (" << ModelFamilyName(model->family) << ", "
                  << ModelParameterCount(*model) << " parameters, hidden_size "
                  << model->hidden_size << ", " << model->num_layers << " layers), not the "
                  << "model section printed above\n";
      } else {
        std::cerr << "note: checkpoint.init_from is a directory whose config.json does not read: "
                  << model.status().message() << "\n";
      }
    }
    return 0;
  }

  if (absl::Status s = InstallStopSignalHandlers(); !s.ok()) {
    std::cerr << "error: " << s.message() << "\n";
    return 1;
  }
  std::unique_ptr<Communicator> communicator;
  if (!comm_choice->kind.empty()) {
    // nccl: on this rank's GPU (the trainer's cuda backend follows the communicator's device),
    // its unique id broadcast over a new mpi communicator (a world of one without mpirun).
    absl::StatusOr<std::unique_ptr<Communicator>> created = CreateCommunicator(*comm_choice);
    if (!created.ok()) {
      std::cerr << "error: --comm=" << comm_choice->kind << ": " << created.status().message()
                << "\n";
      return 1;
    }
    communicator = *std::move(created);
  }
  TrainerEnvironment env;
  env.out = &std::cout;
  // A terminal gets self-rewriting progress lines; a pipe or a file (tee, a log, CI) plain lines.
  env.out_is_terminal = ::isatty(STDOUT_FILENO) == 1;
  env.start_ns = start_ns;
  env.communicator = communicator.get();
  env.stop_requested = [] { return StopRequested(); };
  env.stop_requested_async = [] { return StopRequested(); };
  env.config_path = absl::GetFlag(FLAGS_config);
  absl::StatusOr<std::unique_ptr<Trainer>> trainer = Trainer::Create(*config, env);
  if (!trainer.ok()) {
    std::cerr << "error: " << trainer.status().message() << "\n";
    return ExitCodeBeforeTraining(trainer.status());
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
  // The time to first step counts from here (TrainerEnvironment::start_ns).
  const int64_t start_ns = ps::kSteadyClock.now_ns();
  // Every line reaches a pipe or a file as soon as it is written (stdout is otherwise
  // block-buffered there, and a `tee`d log shows nothing until the run exits); the console
  // flushes its own partial lines (trainer/progress_meter.h).
  std::setvbuf(stdout, nullptr, _IOLBF, 0);
  google::InitGoogleLogging(argv[0]);
  FLAGS_logtostderr = true;
  return ps::Main(argc, argv, start_ns);
}
