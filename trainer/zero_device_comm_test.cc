// The trainer's device-memory communicator path (the one --comm=nccl takes on a GPU), exercised on
// the emulated accelerator: two ranks as threads, each over a DeviceCheckingCommunicator
// (scheduler/testing/device_checking_communicator.h) that reports device memory and refuses any
// buffer outside the cpu backend's device allocations — host memory handed to a collective, as
// NCCL would refuse it, fails the run. The ZeRO group collectives (device staging), the scalar
// agreement (loss, stop flags, Inf/NaN count, gradient norm: CommCollectives' device scalar word),
// checkpoints and the export gather (a device tile) all run through it, and must give exactly what
// the host-memory path gives: the same losses bit for bit and the same exported file.
#include <cstdint>
#include <filesystem>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "absl/time/time.h"
#include "base/testing/status_matchers.h"
#include "base/units.h"
#include "comm/communicator.h"
#include "comm/testing/thread_communicator.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "memory/backend.h"
#include "scheduler/testing/device_checking_communicator.h"
#include "trainer/config.h"
#include "trainer/testing/test_files.h"
#include "trainer/trainer.h"

namespace ps {
namespace {

using ::testing::HasSubstr;

// A tiny GPT on the synthetic corpus, chunks below the model data so that groups gather and
// scatter every step.
TrainConfig TinyZeroConfig() {
  TrainConfig c = DefaultTrainConfig();
  c.model = TrainModelConfig{};
  c.model.vocab_size = 256;
  c.model.max_seq_len = 32;
  c.model.hidden = 64;
  c.model.num_layers = 2;
  c.model.num_heads = 2;
  c.data.seq_len = 32;
  c.train_micro_batch_size_per_gpu = 2;
  c.train_batch_size = 0;
  c.steps = 4;
  c.chunk.size_elems = 24 * 1024 + 7;  // an odd chunk: unaligned staging slots
  c.accelerator.memory_bytes = 0;      // the plan's minimum: chunks move
  c.threads = 1;
  c.data.eval_every = 2;
  c.data.eval_batches = 1;
  c.checkpoint = CheckpointConfig{};
  c.profile = ProfileConfig{};
  c.scheduler.total_num_steps = 0;
  c.scheduler.warmup_num_steps = 2;
  return c;
}

struct RankResult {
  absl::Status status;
  std::vector<double> losses;
  int64_t checked_buffers = 0;
  int64_t loaded_bytes = 0;
};

// Runs `config` on `world` thread ranks; with `device`, each rank's collectives go through a
// DeviceCheckingCommunicator over its thread communicator.
std::vector<RankResult> RunRanks(const TrainConfig& config, int world, bool device) {
  std::vector<std::unique_ptr<Communicator>> comms =
      CreateThreadCommunicators(world, absl::Seconds(120));
  std::vector<RankResult> results(world);
  std::vector<std::thread> threads;
  for (int r = 0; r < world; ++r) {
    threads.emplace_back([&, r] {
      RankResult& result = results[r];
      DeviceCheckingCommunicator* checking = nullptr;
      TrainerEnvironment env;
      env.communicator = comms[r].get();
      env.comm_timeout = absl::Seconds(120);
      if (device) {
        env.device_communicator_for_test = [&checking](Communicator* inner, Backend* backend) {
          auto c = std::make_unique<DeviceCheckingCommunicator>(inner, backend);
          checking = c.get();
          return std::unique_ptr<Communicator>(std::move(c));
        };
      }
      absl::StatusOr<std::unique_ptr<Trainer>> trainer = Trainer::Create(config, env);
      if (!trainer.ok()) {
        result.status = trainer.status();
        return;
      }
      result.status = (*trainer)->Run();
      for (const StepMetrics& m : (*trainer)->history()) result.losses.push_back(m.loss);
      result.loaded_bytes = (*trainer)->summary().loaded_bytes;
      if (checking != nullptr) result.checked_buffers = checking->checked_buffers();
    });
  }
  for (std::thread& t : threads) t.join();
  return results;
}

TEST(ZeroDeviceCommunicator, TrainsAndExportsExactlyAsTheHostPath) {
  const std::string dir = trainer_testing::FreshTempDir("zero_device_comm_test", "export");
  for (const bool bf16 : {false, true}) {
    SCOPED_TRACE(bf16 ? "bf16" : "f32");
    TrainConfig host = TinyZeroConfig();
    host.bf16 = bf16;
    TrainConfig device = host;
    host.checkpoint.export_path = dir + (bf16 ? "/host_bf16.safetensors" : "/host.safetensors");
    device.checkpoint.export_path =
        dir + (bf16 ? "/device_bf16.safetensors" : "/device.safetensors");
    device.checkpoint.dir = dir + (bf16 ? "/ckpt_bf16" : "/ckpt");
    device.checkpoint.every = 2;
    const std::vector<RankResult> h = RunRanks(host, 2, /*device=*/false);
    const std::vector<RankResult> d = RunRanks(device, 2, /*device=*/true);
    for (int r = 0; r < 2; ++r) {
      SCOPED_TRACE(absl::StrCat("rank ", r));
      ASSERT_THAT(h[r].status, IsOk());
      ASSERT_THAT(d[r].status, IsOk());
      ASSERT_EQ(d[r].losses.size(), 4u);
      EXPECT_EQ(d[r].losses, h[r].losses) << "the device path must change no number";
      EXPECT_EQ(d[r].losses, d[0].losses) << "every rank reports the mean";
      EXPECT_GT(d[r].checked_buffers, 0) << "every collective went through the device check";
      EXPECT_GT(d[r].loaded_bytes, 0) << "chunks moved";
    }
    const std::string exported = trainer_testing::ReadFile(device.checkpoint.export_path);
    EXPECT_FALSE(exported.empty());
    EXPECT_EQ(exported, trainer_testing::ReadFile(host.checkpoint.export_path));
  }
}

// The hook must stand in with a device-memory communicator of the same world.
TEST(ZeroDeviceCommunicator, RefusesAHookThatIsNotADeviceCommunicator) {
  std::vector<std::unique_ptr<Communicator>> comms = CreateThreadCommunicators(1);
  TrainConfig c = TinyZeroConfig();
  TrainerEnvironment env;
  std::vector<std::unique_ptr<Communicator>> two = CreateThreadCommunicators(2);
  env.communicator = two[0].get();
  env.device_communicator_for_test = [](Communicator*, Backend*) {
    return std::unique_ptr<Communicator>();
  };
  EXPECT_THAT(
      Trainer::Create(c, env).status(),
      StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("device_communicator_for_test")));
}

}  // namespace
}  // namespace ps
