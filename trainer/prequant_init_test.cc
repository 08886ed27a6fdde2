// --init_from a directory saved pre-quantized (transformers + bitsandbytes save_pretrained: its
// config.json's quantization_config; model/testdata/nf4_prequant/llama_nf4_nested, nf4 with
// double quantization), issue #37:
//  - with a lora section and no quantization section, the run adopts the directory's storage and
//    says so ("base: pre-quantized in DIR (nf4, double quant): loaded as it is"); it trains bit for
//    bit as the run whose section names that storage, and the plan plans the 4-bit base;
//  - a section naming another format is refused by the model's load, naming the directory's;
//  - without lora the directory loads dequantized, a full fine-tune, and the console says so.
#include <cmath>
#include <cstdint>
#include <memory>
#include <random>
#include <sstream>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "base/testing/status_matchers.h"
#include "gmock/gmock.h"
#include "glog/logging.h"
#include "gtest/gtest.h"
#include "model/quant4_config.h"
#include "trainer/config.h"
#include "trainer/data/token_file.h"
#include "trainer/plan_options.h"
#include "trainer/testing/test_files.h"
#include "trainer/trainer.h"

namespace ps {
namespace {

using ::testing::AllOf;
using ::testing::HasSubstr;
using ::testing::Not;

constexpr char kDir[] = "model/testdata/nf4_prequant/llama_nf4_nested";

// A token file of the model's 32-token vocabulary (random tokens, seeded).
std::string TokenFile() {
  static const std::string* const path = [] {
    const std::string dir = trainer_testing::FreshTempDir("prequant_init_test", "data");
    std::vector<uint16_t> tokens(4096);
    std::mt19937_64 gen(37);
    for (uint16_t& t : tokens) t = static_cast<uint16_t>(gen() % 32);
    auto* p = new std::string(dir + "/train.bin");
    const absl::Status written = WriteTokenFile(*p, tokens);
    CHECK(written.ok()) << written;
    return p;
  }();
  return *path;
}

// The tiny pre-quantized llama (hidden 30, 2 layers, vocab 32) with LoRA on every linear layer.
TrainConfig PrequantConfig(bool lora) {
  TrainConfig c = DefaultTrainConfig();
  c.data.train_path = TokenFile();
  c.checkpoint = CheckpointConfig{};
  c.checkpoint.init_from = kDir;
  c.data.seq_len = 16;
  c.data.eval_every = 0;
  c.train_micro_batch_size_per_gpu = 2;
  c.train_batch_size = 0;
  c.steps = 3;
  c.chunk.size_elems = 0;
  c.accelerator.memory_bytes = 0;
  c.threads = 1;
  c.steps_per_print = 1;
  c.profile = ProfileConfig{};
  c.scheduler.total_num_steps = 0;
  c.scheduler.warmup_num_steps = 1;
  if (lora) {
    c.lora = LoraSettings{};
    c.lora->r = 2;
    c.lora->target_modules = {std::string(kLoraAllLinear)};
  }
  return c;
}

struct Ran {
  absl::Status status;
  std::string console;
  std::vector<double> losses;
};

Ran Train(const TrainConfig& c) {
  Ran r;
  std::ostringstream out;
  TrainerEnvironment env;
  env.out = &out;
  absl::StatusOr<std::unique_ptr<Trainer>> t = Trainer::Create(c, env);
  if (!t.ok()) {
    r.status = t.status();
    return r;
  }
  r.status = (*t)->Run();
  for (const StepMetrics& m : (*t)->history()) r.losses.push_back(m.loss);
  r.console = out.str();
  return r;
}

TEST(PrequantInit, LoraAdoptsTheDirectorysStorage) {
  const Ran adopted = Train(PrequantConfig(/*lora=*/true));
  ASSERT_OK(adopted.status);
  EXPECT_THAT(adopted.console,
              AllOf(HasSubstr(absl::StrCat("base: pre-quantized in ", kDir,
                                           " (nf4, double quant): loaded as it is")),
                    HasSubstr("linear weights in 4-bit nf4 (double quant)")));
  ASSERT_EQ(adopted.losses.size(), 3u);
  for (double l : adopted.losses) EXPECT_TRUE(std::isfinite(l)) << l;

  // The same as naming the directory's storage in the section.
  TrainConfig named = PrequantConfig(true);
  named.quantization.load_in_4bit = true;
  named.quantization.quant_type = Quant4Type::kNf4;
  named.quantization.double_quant = true;
  const Ran explicit_run = Train(named);
  ASSERT_OK(explicit_run.status);
  EXPECT_EQ(explicit_run.losses, adopted.losses);

  // The plan plans the 4-bit base (as tools/plan does for this config).
  PlanContext context;
  const TrainConfig c = PrequantConfig(true);
  ASSERT_OK_AND_ASSIGN(context.model, PlanModelFromConfig(c));
  ASSERT_OK_AND_ASSIGN(const RunPlan plan, PlanRunFromConfig(c, context));
  ASSERT_TRUE(plan.options.model.quant4.has_value());
  EXPECT_EQ(plan.options.model.quant4->quant_type, Quant4Type::kNf4);
  EXPECT_TRUE(plan.options.model.quant4->double_quant);
  EXPECT_EQ(plan.options.model.quant4->compute_dtype, DType::kF32);
}

TEST(PrequantInit, ASectionOfAnotherFormatIsRefusedNamingTheDirectorys) {
  TrainConfig c = PrequantConfig(true);
  c.quantization.load_in_4bit = true;
  c.quantization.quant_type = Quant4Type::kFp4;
  const Ran r = Train(c);
  EXPECT_FALSE(r.status.ok());
  EXPECT_THAT(r.status.message(), HasSubstr("nf4"));
}

TEST(PrequantInit, WithoutLoraItLoadsDequantized) {
  const Ran r = Train(PrequantConfig(/*lora=*/false));
  ASSERT_OK(r.status);
  EXPECT_THAT(r.console, HasSubstr(absl::StrCat("base: pre-quantized in ", kDir,
                                                " (nf4, double quant): loaded dequantized to f32 "
                                                "(no lora section: a full fine-tune)")));
  EXPECT_THAT(r.console, Not(HasSubstr("linear weights in 4-bit")));
  ASSERT_EQ(r.losses.size(), 3u);
  for (double l : r.losses) EXPECT_TRUE(std::isfinite(l)) << l;
  PlanContext context;
  const TrainConfig c = PrequantConfig(false);
  ASSERT_OK_AND_ASSIGN(context.model, PlanModelFromConfig(c));
  ASSERT_OK_AND_ASSIGN(const RunPlan plan, PlanRunFromConfig(c, context));
  EXPECT_FALSE(plan.options.model.quant4.has_value());
}

}  // namespace
}  // namespace ps
