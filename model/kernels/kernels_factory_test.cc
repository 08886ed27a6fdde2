#include "model/kernels/kernels_factory.h"

#include <memory>
#include <string>

#include "base/testing/status_matchers.h"
#include "base/thread_pool.h"
#include "base/units.h"
#include "gtest/gtest.h"
#include "memory/backend_factory.h"

namespace ps {
namespace {

// A backend that only has a name: enough for the factory's choice.
class NamedBackend final : public Backend {
 public:
  explicit NamedBackend(std::string name) : name_(std::move(name)) {}
  absl::string_view name() const override { return name_; }
  Device device() const override { return Device::Accelerator(0); }
  int64_t capacity_bytes() const override { return 0; }
  int64_t allocated_bytes() const override { return 0; }
  BackendCounters counters() const override { return {}; }
  absl::StatusOr<void*> AllocateDevice(int64_t) override { return absl::UnimplementedError(""); }
  absl::Status FreeDevice(void*) override { return absl::UnimplementedError(""); }
  absl::StatusOr<void*> AllocatePinnedHost(int64_t) override {
    return absl::UnimplementedError("");
  }
  absl::Status FreePinnedHost(void*) override { return absl::UnimplementedError(""); }
  absl::StatusOr<std::unique_ptr<Stream>> CreateStream() override {
    return absl::UnimplementedError("");
  }
  absl::StatusOr<std::unique_ptr<Event>> CreateEvent() override {
    return absl::UnimplementedError("");
  }

 private:
  std::string name_;
};

TEST(CreateKernels, PicksTheImplementationOfTheBackend) {
  ASSERT_OK_AND_ASSIGN(auto backend, CreateBackend({.kind = "cpu", .capacity_bytes = kMiB}));
  ThreadPool pool(2);
  ASSERT_OK_AND_ASSIGN(auto kernels, CreateKernels(backend.get(), {.cpu_pool = &pool}));
  EXPECT_EQ(kernels->name(), "cpu");
}

TEST(CreateKernels, RefusesWhatItCannotRun) {
  EXPECT_THAT(CreateKernels(nullptr), StatusIs(absl::StatusCode::kInvalidArgument, "null"));
  NamedBackend tpu("tpu");
  EXPECT_THAT(CreateKernels(&tpu),
              StatusIs(absl::StatusCode::kInvalidArgument, "\"cpu\" or \"cuda\""));
  if (!CudaBackendCompiledIn()) {
    NamedBackend cuda("cuda");
    EXPECT_THAT(CreateKernels(&cuda),
                StatusIs(absl::StatusCode::kFailedPrecondition, "--config=cuda"));
  }
}

// The plan's workspace sizes for a backend are the ones its kernels answer with.
TEST(CreateKernelWorkspaces, AnswersAsTheKernelsOfTheBackendDo) {
  ASSERT_OK_AND_ASSIGN(auto backend, CreateBackend({.kind = "cpu", .capacity_bytes = kMiB}));
  for (int threads : {1, 3}) {
    ThreadPool pool(threads);
    ASSERT_OK_AND_ASSIGN(auto kernels, CreateKernels(backend.get(), {.cpu_pool = &pool}));
    ASSERT_OK_AND_ASSIGN(auto workspaces, CreateKernelWorkspaces(backend.get(), threads));
    EXPECT_EQ(workspaces->name(), "cpu");
    // Attention keeps a tile of scores per thread: the one query that depends on the pool.
    // GPT-2's, on a fused qkv [B, T, 3C] with C = 24: q, k, v through row strides of 3C.
    const GqaAttentionShape att{.batch = 2,
                                .seq_len = 33,
                                .num_heads = 3,
                                .num_kv_heads = 3,
                                .head_dim = 8,
                                .tile = 8,
                                .q_row_stride = 72,
                                .kv_row_stride = 72};
    EXPECT_EQ(workspaces->GqaAttentionForwardWorkspaceBytes(att),
              kernels->GqaAttentionForwardWorkspaceBytes(att));
    const GqaAttentionShape gqa{
        .batch = 2, .seq_len = 17, .num_heads = 4, .num_kv_heads = 2, .head_dim = 8, .tile = 5};
    EXPECT_EQ(workspaces->GqaAttentionForwardWorkspaceBytes(gqa),
              kernels->GqaAttentionForwardWorkspaceBytes(gqa));
    const VocabBlockShape block{.rows = 12,
                                .channels = 16,
                                .vocab_size = 300,
                                .row_begin = 96,
                                .block_rows = 96,
                                .row_tile = 7,
                                .vocab_tile = 48};
    EXPECT_EQ(workspaces->LmHeadBlockBackwardWorkspaceBytes(block, DType::kBF16),
              kernels->LmHeadBlockBackwardWorkspaceBytes(block, DType::kBF16));
  }
}

TEST(CreateKernelWorkspaces, RefusesWhatItCannotAnswerFor) {
  ASSERT_OK_AND_ASSIGN(auto backend, CreateBackend({.kind = "cpu", .capacity_bytes = kMiB}));
  EXPECT_THAT(CreateKernelWorkspaces(backend.get(), 0),
              StatusIs(absl::StatusCode::kInvalidArgument, "cpu_threads must be >= 1, got 0"));
  EXPECT_THAT(CreateKernelWorkspaces(nullptr, 1),
              StatusIs(absl::StatusCode::kInvalidArgument, "null"));
  NamedBackend tpu("tpu");
  EXPECT_THAT(CreateKernelWorkspaces(&tpu, 1),
              StatusIs(absl::StatusCode::kInvalidArgument, "\"cpu\" or \"cuda\""));
  if (!CudaBackendCompiledIn()) {
    NamedBackend cuda("cuda");
    EXPECT_THAT(CreateKernelWorkspaces(&cuda, 1),
                StatusIs(absl::StatusCode::kFailedPrecondition, "--config=cuda"));
  }
}

}  // namespace
}  // namespace ps
