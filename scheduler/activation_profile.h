// ActivationProfile: what a model allocates on the accelerator beside its chunks — activations,
// gradients of activations, workspaces, f32 copies of 16-bit parameters — and when, relative to
// its operator accesses, during one training iteration and one evaluation pass. It is the one
// model-specific input of the memory plan (scheduler/memory_plan.h), which replays it to predict
// the non-model tide before anything is allocated.
//
// A profile is a program-order list of events:
//   kAlloc(id, bytes)   an allocation of the accelerator's scratch allocator (the request's bytes)
//   kFree(id)           its release
//   kAccess(op, stage)  ChunkManager::Access(op, stage): one moment of the iteration
//   kRelease(op, stage) ChunkManager::Release
// where op indexes the model's operator list (the OperatorSpecs its chunk layout is built from).
// The model library writes it from the same buffer sizes and in the same order its model
// allocates (model/gpt_activation_profile.h for GptModel); a test replays a real warm-up against
// the profile's prediction moment by moment, so the two cannot drift apart unnoticed.
//
// ActivationProfileBuilder records the events, naming operators by name.
//
// Thread safety: value types; the builder is thread-compatible.
#ifndef PATRICKSTAR_SCHEDULER_ACTIVATION_PROFILE_H_
#define PATRICKSTAR_SCHEDULER_ACTIVATION_PROFILE_H_

#include <cstdint>
#include <string>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "absl/strings/string_view.h"
#include "absl/types/span.h"
#include "chunk/operator_spec.h"
#include "scheduler/metronome.h"

namespace ps {

struct ActivationEvent {
  enum class Kind : uint8_t { kAlloc, kFree, kAccess, kRelease };
  Kind kind = Kind::kAlloc;
  // kAlloc / kFree: the buffer (unique among the buffers live at once).
  int64_t buffer = -1;
  // kAlloc: the requested bytes (> 0).
  int64_t bytes = 0;
  // kAccess / kRelease: the operator's index in the model's operator list, and the stage.
  int64_t op = -1;
  Stage stage = Stage::kForward;
};

struct ActivationProfile {
  // One training iteration's forward and backward (between BeginIteration and BeginAdam).
  std::vector<ActivationEvent> iteration;
  // One evaluation pass (forward only, outside an iteration).
  std::vector<ActivationEvent> evaluation;
};

// Records events; operators are named by their OperatorSpec names.
class ActivationProfileBuilder {
 public:
  // REQUIRES: operator names are unique.
  explicit ActivationProfileBuilder(absl::Span<const OperatorSpec> ops);

  // A new buffer of `bytes` (> 0); returns its id.
  int64_t Alloc(int64_t bytes);
  // Frees a live buffer; -1 is ignored (a buffer never allocated, as an empty GptModel::Buffer).
  void Free(int64_t buffer);
  // CHECK-fails for an unknown operator name (a programming error of the profile's author).
  void Access(absl::string_view op, Stage stage);
  void Release(absl::string_view op, Stage stage);
  // Access then Release with no allocation in between.
  void Touch(absl::string_view op, Stage stage) {
    Access(op, stage);
    Release(op, stage);
  }

  // The events so far (and clears them; buffer ids keep counting).
  std::vector<ActivationEvent> Take();

 private:
  int64_t OpIndex(absl::string_view op) const;

  absl::flat_hash_map<std::string, int64_t> op_index_;
  std::vector<ActivationEvent> events_;
  int64_t next_buffer_ = 0;
};

}  // namespace ps

#endif  // PATRICKSTAR_SCHEDULER_ACTIVATION_PROFILE_H_
