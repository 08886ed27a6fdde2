// The real training program (//trainer:train) on a GPU, as issue 13 lists its end-to-end checks:
//
//  - `--accelerator=cuda` trains like `--accelerator=cpu` (the emulated accelerator): 10 f32 steps
//    of the default model, losses within 1e-4 relative at every step (the GPU kernels and the GPU
//    Adam differ from the CPU ones by rounding only).
//  - Under a cap smaller than the model data (GPT-2 small, ~2 GB of f32 model data, under a 1 GiB
//    cap) the run trains and moves chunks: the summary reports chunk traffic and the metrics
//    loaded bytes > 0.
//  - Checkpoint and resume on the GPU are bit-exact: 2 steps, stop, resume to 4 gives the losses of
//    4 straight steps exactly.
//  - 2 ranks over NCCL (`--comm=nccl`, launched with mpirun as trainer/zero_multiprocess_test.cc
//    does) train like 1 rank with the same global batch (losses within 1e-4 relative). Each rank
//    sees one GPU (CUDA_VISIBLE_DEVICES = its local rank, NCCL's one-GPU-per-rank convention), so
//    accelerator.device stays 0 on both. Skipped with fewer than 2 GPUs.
//
// Every test first asks base/testing/gpu_gate.h (PS_REQUIRE_GPUS) for its GPUs and reports
// SKIPPED, naming why, without a CUDA device (or, in a build without --config=cuda, where this file
// is compiled with no CUDA) — never passed; any other CUDA error, or no GPU under PS_EXPECT_GPU,
// fails. Every launch has a watchdog.
#include "base/testing/gpu_gate.h"
#include "gtest/gtest.h"

#if PS_WITH_CUDA
#include <stdlib.h>
#include <unistd.h>

#include <cmath>
#include <cstdint>
#include <cstdlib>
#include <filesystem>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/time/time.h"
#include "comm/testing/subprocess.h"
#include "gmock/gmock.h"
#include "memory/cuda/cuda_backend.h"
#include "nlohmann/json.hpp"
#include "trainer/testing/test_files.h"
#include "trainer/testing/train_process.h"
#endif

namespace ps {
namespace {

#if PS_WITH_CUDA

using ::testing::HasSubstr;

std::string TrainBinary() { return trainer_testing::Runfile("trainer/train"); }

std::string FreshDir(const std::string& name) {
  return trainer_testing::FreshTempDir("train_cuda_test", name);
}

using trainer_testing::HeldModelBytes;
using trainer_testing::ReadMetrics;
using trainer_testing::RunProgram;
using trainer_testing::RunSingle;

void ExpectLossesNear(const std::vector<nlohmann::json>& a, const std::vector<nlohmann::json>& b,
                      double rel) {
  ASSERT_EQ(a.size(), b.size());
  for (size_t i = 0; i < a.size(); ++i) {
    const double la = a[i]["loss"], lb = b[i]["loss"];
    EXPECT_TRUE(std::isfinite(la) && std::isfinite(lb)) << "step " << i + 1;
    EXPECT_LE(std::abs(la - lb), rel * std::abs(la))
        << "step " << i + 1 << ": " << la << " vs " << lb;
    EXPECT_EQ(a[i]["step"], b[i]["step"]);
  }
}

// The default model (12.9 MiB of f32 model data) under a cap with room for cuBLAS's workspace,
// which CudaKernels takes from the caller's memory (32 MiB on Hopper).
std::vector<std::string> DefaultModelFlags(const std::string& accelerator, int64_t steps) {
  return {absl::StrCat("--accelerator=", accelerator), absl::StrCat("--steps=", steps),
          "--accelerator_memory=256MiB", "--seed=7"};
}

TEST(TrainCuda, TrainsLikeTheEmulatedAcceleratorInF32) {
  PS_REQUIRE_GPUS(1);
  const std::string dir = FreshDir("cpu_vs_cuda");
  std::vector<std::string> cpu = DefaultModelFlags("cpu", 10);
  cpu.push_back("--metrics_out=" + dir + "/cpu.jsonl");
  const SubprocessResult rc = RunSingle(cpu, absl::Seconds(300));
  ASSERT_EQ(rc.exit_code, 0) << DescribeExit(rc) << "\n" << rc.output;
  std::vector<std::string> gpu = DefaultModelFlags("cuda", 10);
  gpu.push_back("--metrics_out=" + dir + "/cuda.jsonl");
  const SubprocessResult rg = RunSingle(gpu, absl::Seconds(300));
  ASSERT_EQ(rg.exit_code, 0) << DescribeExit(rg) << "\n" << rg.output;
  EXPECT_THAT(rg.output, HasSubstr("accelerator: cuda"));
  const std::vector<nlohmann::json> a = ReadMetrics(dir + "/cpu.jsonl");
  const std::vector<nlohmann::json> b = ReadMetrics(dir + "/cuda.jsonl");
  ASSERT_EQ(a.size(), 10u);
  ExpectLossesNear(a, b, 1e-4);
}

TEST(TrainCuda, TrainsUnderACapSmallerThanTheModelData) {
  PS_REQUIRE_GPUS(1);
  const std::string dir = FreshDir("small_cap");
  constexpr int64_t kCapBytes = int64_t{1} << 30;
  // GPT-2 small: 124M parameters, ~2 GB of f32 model data (16 bytes per parameter).
  const SubprocessResult r =
      RunSingle({"--model=gpt2", "--accelerator=cuda", "--accelerator_memory=1GiB", "--seq_len=64",
                 "--micro_batch_size=2", "--steps=3", "--metrics_out=" + dir + "/m.jsonl"},
                absl::Seconds(600));
  ASSERT_EQ(r.exit_code, 0) << DescribeExit(r) << "\n" << r.output;
  const int64_t model_bytes = HeldModelBytes(r.output);
  EXPECT_GT(model_bytes, kCapBytes) << "the cap must be smaller than the model data\n" << r.output;
  EXPECT_THAT(r.output, HasSubstr("chunk traffic: loaded"));
  const std::vector<nlohmann::json> m = ReadMetrics(dir + "/m.jsonl");
  ASSERT_EQ(m.size(), 3u);
  int64_t loaded = 0, written_back = 0;
  for (const nlohmann::json& step : m) {
    EXPECT_TRUE(std::isfinite(static_cast<double>(step["loss"]))) << step.dump();
    EXPECT_LE(static_cast<int64_t>(step["accelerator"]["peak_model_bytes"]) +
                  static_cast<int64_t>(step["accelerator"]["peak_non_model_bytes"]),
              kCapBytes)
        << step.dump();
    loaded += static_cast<int64_t>(step["loaded_bytes"]);
    written_back += static_cast<int64_t>(step["written_back_bytes"]);
  }
  EXPECT_GT(loaded, 0) << "no chunk moved although the model data exceeds the cap";
  EXPECT_GT(written_back, 0);
}

TEST(TrainCuda, CheckpointAndResumeAreBitExact) {
  PS_REQUIRE_GPUS(1);
  const std::string dir = FreshDir("resume");
  const std::string straight = dir + "/straight.jsonl", resumed = dir + "/resumed.jsonl";
  auto flags = [&](int64_t steps, std::vector<std::string> extra) {
    std::vector<std::string> f = DefaultModelFlags("cuda", steps);
    f.insert(f.end(), extra.begin(), extra.end());
    return f;
  };
  SubprocessResult r = RunSingle(flags(4, {"--metrics_out=" + straight}), absl::Seconds(300));
  ASSERT_EQ(r.exit_code, 0) << DescribeExit(r) << "\n" << r.output;
  r = RunSingle(flags(2, {"--metrics_out=" + resumed, "--save_dir=" + dir + "/ckpt"}),
                absl::Seconds(300));
  ASSERT_EQ(r.exit_code, 0) << DescribeExit(r) << "\n" << r.output;
  EXPECT_TRUE(std::filesystem::exists(dir + "/ckpt/step-00000002/manifest.json")) << r.output;
  r = RunSingle(flags(4, {"--metrics_out=" + resumed, "--save_dir=" + dir + "/ckpt", "--resume"}),
                absl::Seconds(300));
  ASSERT_EQ(r.exit_code, 0) << DescribeExit(r) << "\n" << r.output;
  EXPECT_THAT(r.output, HasSubstr("resumed from"));
  const std::vector<nlohmann::json> a = ReadMetrics(straight), b = ReadMetrics(resumed);
  ASSERT_EQ(a.size(), 4u);
  ASSERT_EQ(b.size(), 4u);
  for (size_t i = 0; i < 4; ++i) {
    EXPECT_EQ(a[i]["step"], b[i]["step"]);
    EXPECT_EQ(static_cast<double>(a[i]["loss"]), static_cast<double>(b[i]["loss"]))
        << "step " << i + 1;
  }
}

TEST(TrainCuda, TwoRanksOverNcclTrainLikeOneRank) {
  PS_REQUIRE_GPUS(2);
  const std::string dir = FreshDir("nccl");
  const std::string m1 = dir + "/one.jsonl", m2 = dir + "/two.jsonl";
  std::vector<std::string> one = DefaultModelFlags("cuda", 5);
  one.push_back("--micro_batch_size=4");
  one.push_back("--metrics_out=" + m1);
  const SubprocessResult r1 = RunSingle(one, absl::Seconds(300));
  ASSERT_EQ(r1.exit_code, 0) << DescribeExit(r1) << "\n" << r1.output;

  // mpirun -np 2 sh -c 'CUDA_VISIBLE_DEVICES=$OMPI_COMM_WORLD_LOCAL_RANK exec train ...'
  std::vector<std::string> argv = {
      FindMpirun(),
      "--allow-run-as-root",
      "--oversubscribe",
      "-np",
      "2",
      "--mca",
      "btl",
      "self,vader",
      "/bin/sh",
      "-c",
      "CUDA_VISIBLE_DEVICES=$OMPI_COMM_WORLD_LOCAL_RANK exec \"$0\" \"$@\"",
      TrainBinary()};
  for (const std::string& f : DefaultModelFlags("cuda", 5)) argv.push_back(f);
  argv.push_back("--micro_batch_size=2");
  argv.push_back("--comm=nccl");
  argv.push_back("--metrics_out=" + m2);
  const SubprocessResult r2 = RunProgram(argv, absl::Seconds(300));
  ASSERT_EQ(r2.exit_code, 0) << DescribeExit(r2) << "\n" << r2.output;
  EXPECT_THAT(r2.output, HasSubstr("data parallel (ZeRO): 2 ranks"));
  const std::vector<nlohmann::json> a = ReadMetrics(m1), b = ReadMetrics(m2);
  ASSERT_EQ(a.size(), 5u);
  ExpectLossesNear(a, b, 1e-4);
}

#else  // !PS_WITH_CUDA

TEST(TrainCuda, NotBuilt) { PS_REQUIRE_GPUS(1); }

#endif

}  // namespace
}  // namespace ps
