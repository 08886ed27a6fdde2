// Uses two libraries of patrickstar_cc from another Bazel workspace: the tide-aware ChunkManager
// and the CPU Adam. Six parameter tensors of 3000 floats live in chunks of 4096 elements (16 KiB)
// on an emulated accelerator with room for three chunks, so chunks move every iteration. Each
// iteration reads the parameters in a forward pass, writes the gradient of
// 0.5 * ||p - target||^2 into their slots in a backward pass, and runs Adam on the placement the
// manager chooses. Exits 0 when the loss fell by 100x and chunks moved, 1 otherwise.
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/str_cat.h"
#include "chunk/chunk_layout.h"
#include "chunk/chunk_store.h"
#include "chunk/chunk_type.h"
#include "chunk/operator_spec.h"
#include "memory/backend.h"
#include "memory/cpu_backend.h"
#include "memory/device_memory.h"
#include "optimizer/adam_kernels.h"
#include "optimizer/adam_math.h"
#include "optimizer/cpu_adam.h"
#include "scheduler/chunk_manager.h"

namespace {

constexpr int kOps = 6;
constexpr int64_t kElems = 3000;
constexpr int64_t kChunkElems = 4096;
constexpr int64_t kChunkBytes = kChunkElems * 4;
constexpr int kIterations = 60;
constexpr ps::ChunkType kAllTypes[] = {ps::ChunkType::kParam, ps::ChunkType::kMaster,
                                       ps::ChunkType::kMomentum, ps::ChunkType::kVariance};

float Target(int op, int64_t i) { return std::sin(0.01f * static_cast<float>(i) + op); }

float* Data(const ps::ChunkStore& store, ps::ChunkType type, ps::TensorId t) {
  absl::StatusOr<ps::TensorView> view = store.View(type, t);
  return view.ok() ? static_cast<float*>(view->data) : nullptr;
}

absl::Status Run() {
  // The emulated accelerator: 3 chunks of room; host memory uncapped.
  absl::StatusOr<std::unique_ptr<ps::Backend>> backend =
      ps::CreateCpuBackend({.capacity_bytes = 3 * kChunkBytes});
  if (!backend.ok()) return backend.status();
  ps::DeviceMemoryOptions memory;
  memory.chunk_block_bytes = kChunkBytes;
  absl::StatusOr<std::unique_ptr<ps::DeviceMemory>> accel =
      ps::CreateAcceleratorMemory(backend->get(), memory);
  if (!accel.ok()) return accel.status();
  absl::StatusOr<std::unique_ptr<ps::DeviceMemory>> host =
      ps::CreateHostMemory(backend->get(), memory);
  if (!host.ok()) return host.status();

  // The parameters: one operator per tensor, placed in chunks.
  std::vector<ps::OperatorSpec> ops;
  for (int i = 0; i < kOps; ++i) {
    ops.push_back({absl::StrCat("layer", i), {{absl::StrCat("layer", i, ".w"), {kElems}}}});
  }
  absl::StatusOr<ps::ChunkLayout> layout =
      ps::ChunkLayout::Build({.capacity_elems = kChunkElems}, ops);
  if (!layout.ok()) return layout.status();
  absl::StatusOr<std::unique_ptr<ps::ChunkStore>> store =
      ps::ChunkStore::Create(*std::move(layout), {.compute_dtype = ps::DType::kF32});
  if (!store.ok()) return store.status();
  ps::ChunkStore& s = **store;

  absl::StatusOr<std::unique_ptr<ps::ChunkManager>> created =
      ps::ChunkManager::Create(&s, backend->get(), accel->get(), host->get());
  if (!created.ok()) return created.status();
  ps::ChunkManager& manager = **created;
  absl::StatusOr<std::unique_ptr<ps::CpuAdam>> adam = ps::CpuAdam::Create({.num_threads = 2});
  if (!adam.ok()) return adam.status();

  // Initialization outside any iteration: every chunk on the host, zero-filled (FREE -> COMPUTE),
  // so parameters, master copies and moments start at 0.
  for (int64_t c = 0; c < s.num_chunks(); ++c) {
    if (absl::Status st =
            manager.AccessChunks(c, kAllTypes, ps::Device::Host(), ps::AccessMode::kReadWrite);
        !st.ok()) {
      return st;
    }
    if (absl::Status st = manager.ReleaseChunks(c, kAllTypes); !st.ok()) return st;
  }

  double first_loss = 0, loss = 0;
  for (int it = 1; it <= kIterations; ++it) {
    if (absl::Status st = manager.BeginIteration(); !st.ok()) return st;
    loss = 0;
    for (ps::OperatorId op = 0; op < kOps; ++op) {  // forward: read the parameters
      if (absl::Status st = manager.Access(op, ps::Stage::kForward); !st.ok()) return st;
      for (ps::TensorId t : s.layout().op(op).tensors) {
        const float* p = Data(s, ps::ChunkType::kParam, t);
        for (int64_t i = 0; i < kElems; ++i) loss += 0.5 * std::pow(p[i] - Target(op, i), 2);
      }
      if (absl::Status st = manager.Release(op, ps::Stage::kForward); !st.ok()) return st;
    }
    for (ps::OperatorId op = kOps - 1; op >= 0; --op) {  // backward: gradients into the slots
      if (absl::Status st = manager.Access(op, ps::Stage::kBackward); !st.ok()) return st;
      for (ps::TensorId t : s.layout().op(op).tensors) {
        float* g = Data(s, ps::ChunkType::kParam, t);
        for (int64_t i = 0; i < kElems; ++i) g[i] = g[i] - Target(op, i);
      }
      if (absl::Status st = manager.Release(op, ps::Stage::kBackward); !st.ok()) return st;
    }
    // Adam, each chunk where the manager's placement runs it.
    absl::StatusOr<ps::AdamPlacement> placement = manager.BeginAdam();
    if (!placement.ok()) return placement.status();
    // The learning rate decays linearly from 0.05 to 0, so Adam settles instead of oscillating.
    const double lr = 0.05 * (1.0 - static_cast<double>(it - 1) / kIterations);
    const ps::AdamStepScalars scalars =
        ps::MakeAdamStepScalars(ps::AdamMode::kAdam, lr, 0.9, 0.999, 1e-8, 0.0, it);
    for (int64_t c = 0; c < s.num_chunks(); ++c) {
      const ps::Device device =
          placement->OnAccelerator(c) ? manager.accelerator_device() : ps::Device::Host();
      if (absl::Status st = manager.AccessChunks(c, kAllTypes, device, ps::AccessMode::kReadWrite);
          !st.ok()) {
        return st;
      }
      std::vector<ps::AdamSegment> segments;
      for (ps::TensorId t : s.layout().TensorsInChunk(c)) {
        float* param = Data(s, ps::ChunkType::kParam, t);
        segments.push_back({.scalars = scalars,
                            .dtype = ps::DType::kF32,
                            .grad = param,
                            .param = param,
                            .master = Data(s, ps::ChunkType::kMaster, t),
                            .exp_avg = Data(s, ps::ChunkType::kMomentum, t),
                            .exp_avg_sq = Data(s, ps::ChunkType::kVariance, t),
                            .n_elems = kElems});
      }
      if (absl::Status st = (*adam)->Step(segments).status(); !st.ok()) return st;
      if (absl::Status st = manager.ReleaseChunks(c, kAllTypes); !st.ok()) return st;
    }
    if (absl::Status st = manager.EndIteration(); !st.ok()) return st;
    if (it == 1) first_loss = loss;
    if (it == 1 || it % 10 == 0) std::printf("iteration %2d: loss %.6f\n", it, loss);
  }
  const ps::ChunkManagerCounters c = manager.counters();
  std::printf("chunk traffic: %s\n", c.DebugString().c_str());
  if (!(loss < first_loss / 100)) {
    return absl::InternalError(absl::StrCat("the loss did not fall: ", first_loss, " -> ", loss));
  }
  if (c.Total().loads == 0) return absl::InternalError("no chunk moved: the example is too roomy");
  std::printf("ok: loss %.6f -> %.6f with %lld chunk loads\n", first_loss, loss,
              static_cast<long long>(c.Total().loads));
  return absl::OkStatus();
}

}  // namespace

int main() {
  const absl::Status status = Run();
  if (!status.ok()) {
    std::fprintf(stderr, "adam_on_chunks: %s\n", std::string(status.message()).c_str());
    return 1;
  }
  return 0;
}
