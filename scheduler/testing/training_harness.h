// TrainingHarness: drives a ChunkManager the way a model and an optimizer would, on the emulated
// accelerator, and checks everything it can after every step. Test-only.
//
// The model: operators with one f32 tensor each, packed into chunks by ChunkLayout (f32 compute,
// so every chunk type has the same size). A *program* is a list of steps; each step accesses one
// operator in a stage, checks that every tensor of the operator holds exactly the bytes the
// harness last wrote there (a pattern derived from (type, tensor, version)), optionally writes new
// bytes (gradients in BWD), allocates and frees non-model memory from the accelerator's caching
// allocator (the "tide"), optionally sleeps (compute), and releases. An optional ADAM phase runs
// BeginAdam and, for every chunk index, accesses all four chunk types on the device the placement
// names, checks them and writes new versions.
//
// Checked after every access: the resident bytes stay under the manager's limit and, once the
// trace is known, under the chunkable memory of the moment; the accelerator's model bytes equal
// the resident chunks; the backend never holds more than its cap (which it enforces: any
// over-commit shows up as a failed allocation, and every failure fails the test).
//
// Thread safety: thread-compatible.
#ifndef PATRICKSTAR_SCHEDULER_TESTING_TRAINING_HARNESS_H_
#define PATRICKSTAR_SCHEDULER_TESTING_TRAINING_HARNESS_H_

#include <cstdint>
#include <memory>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "absl/status/status.h"
#include "absl/time/time.h"
#include "chunk/chunk_layout.h"
#include "chunk/chunk_store.h"
#include "chunk/chunk_type.h"
#include "memory/backend.h"
#include "memory/device_memory.h"
#include "scheduler/chunk_manager.h"
#include "scheduler/metronome.h"

namespace ps {

struct HarnessModel {
  int64_t chunk_elems = 1024;
  // Elements of each operator's single tensor (each <= chunk_elems).
  std::vector<int64_t> op_numels = {};
  // Operators whose index is listed here are frozen (OperatorSpec::trainable = false): their
  // chunks hold only params, the optimizer phase skips them.
  std::vector<OperatorId> frozen_ops = {};
};

struct HarnessStep {
  OperatorId op = 0;
  Stage stage = Stage::kForward;
  // Non-model bytes allocated after the access and kept until a later step frees them
  // (`free_kept_of`), e.g. an activation kept from forward to backward.
  int64_t keep_bytes = 0;
  // Non-model bytes allocated and freed inside the step (workspace).
  int64_t temp_bytes = 0;
  // Frees the bytes kept by the step of this operator (-1: none).
  OperatorId free_kept_of = -1;
  // Writes new bytes into the operator's tensors (gradients).
  bool write = false;
};

struct HarnessProgram {
  std::vector<HarnessStep> steps;
  // Run the optimizer phase after the steps.
  bool adam = false;
  // Run the chunks the placement names on the accelerator (otherwise all on the host).
  bool adam_on_accelerator = true;
};

struct HarnessConfig {
  int64_t cap_bytes = 0;
  double copy_bandwidth_bytes_per_s = 0;
  ChunkManagerOptions options;
  // Sleep inside each step, standing in for the operator's compute.
  absl::Duration compute = absl::ZeroDuration();
  // Check and write tensor bytes. Off for timing runs: the checks copy over the emulated link.
  bool verify = true;
  // Give the manager the harness's compute stream (stream-ordered accesses); without it the
  // manager's callers compute on the host.
  bool give_compute_stream = true;
  // CpuBackendOptions::stall_streams_until_host_waits: every stream (the manager's copy streams
  // included) holds its work until the host next waits for the backend.
  bool stall_streams_until_host_waits = false;
};

class TrainingHarness {
 public:
  // Builds the backend, memories, chunks and manager. Errors from any of them.
  static absl::StatusOr<std::unique_ptr<TrainingHarness>> Create(const HarnessModel& model,
                                                                 const HarnessConfig& config);
  ~TrainingHarness();

  // Writes version-1 bytes into every tensor of every chunk type the chunk has (a frozen chunk:
  // its params only), on the host (untracked).
  [[nodiscard]] absl::Status Initialize();
  // One iteration of `program` between BeginIteration and EndIteration.
  [[nodiscard]] absl::Status RunIteration(const HarnessProgram& program);

  ChunkManager& manager() { return *manager_; }
  ChunkStore& store() { return *store_; }
  Backend& backend() { return *backend_; }
  DeviceMemory& accelerator() { return *accel_; }
  DeviceMemory& host() { return *host_; }
  // The stream the harness's "kernels" run on (the manager's compute_stream).
  Stream& compute_stream() { return *compute_; }
  int64_t chunk_bytes() const { return chunk_bytes_; }
  // The bytes the harness last wrote into tensor `id` of `type` (what VerifyTensor expects).
  std::vector<uint8_t> ExpectedBytes(ChunkType type, TensorId id) const;
  // Destroys the manager now (for tests of its destructor); manager() is invalid afterwards.
  void DestroyManager() { manager_.reset(); }
  // Tensors whose bytes were verified.
  int64_t verified_tensors() const { return verified_tensors_; }
  // Highest resident bytes seen.
  int64_t peak_resident_bytes() const { return peak_resident_bytes_; }
  // Time of each iteration run, on the manager's clock (ChunkManager::clock).
  const std::vector<absl::Duration>& iteration_times() const { return iteration_times_; }

 private:
  TrainingHarness() = default;

  absl::Status RunStep(const HarnessStep& step);
  absl::Status RunAdam(bool on_accelerator);
  absl::Status CheckInvariants(const char* where);
  absl::Status VerifyTensor(ChunkType type, TensorId id);
  absl::Status WriteTensor(ChunkType type, TensorId id);
  absl::StatusOr<void*> AllocateScratch(int64_t bytes);
  absl::Status FreeScratch(void* ptr, int64_t bytes);

  HarnessConfig config_;
  int64_t chunk_bytes_ = 0;
  std::unique_ptr<Backend> backend_;
  std::unique_ptr<Stream> compute_;
  std::unique_ptr<DeviceMemory> accel_;
  std::unique_ptr<DeviceMemory> host_;
  std::unique_ptr<ChunkStore> store_;
  std::unique_ptr<ChunkManager> manager_;
  // version_[type][tensor id]: the version last written.
  std::vector<std::vector<uint64_t>> version_;
  absl::flat_hash_map<OperatorId, std::pair<void*, int64_t>> kept_;
  int64_t verified_tensors_ = 0;
  int64_t peak_resident_bytes_ = 0;
  std::vector<absl::Duration> iteration_times_;
};

}  // namespace ps

#endif  // PATRICKSTAR_SCHEDULER_TESTING_TRAINING_HARNESS_H_
