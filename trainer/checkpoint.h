// Training checkpoints: everything a run needs to continue bit for bit.
//
// A checkpoint is a directory `<root>/step-<N>` written atomically by trainer/io/checkpoint_dir.h
// (a temporary directory, fsync'ed and renamed; a crash, even kill -9, leaves the previous
// checkpoints intact; the last K are kept). It holds
//   state.safetensors  f32 tensors "master/<name>", "momentum/<name>", "variance/<name>" for every
//                      parameter (Hugging Face GPT-2 names), flat, as the optimizer keeps them;
//                      the param chunks are not stored: they are the master values rounded to
//                      the compute dtype, exactly what the optimizer step leaves there;
//   manifest.json      per-file sizes and CRC-32C checksums (verified on load), and the state:
//                      the step, Adam's step count, the loss scaler, the data cursor, the
//                      identity of the run (model dimensions, compute dtype, world size, micro
//                      batch, sequence length, data shuffle and seed) and the config as JSON.
// LoRA (CheckpointIdentity::lora set): state.safetensors holds the trainable tensors only (the
// adapters and modules_to_save: GptModel::VisitTrainingState's), and the identity adds the LoRA
// configuration ("lora": r, lora_alpha, lora_dropout, target_modules, bias, modules_to_save)
// and the base's fingerprint and source ("base_fingerprint", "base_source"). Resuming refuses
// another base (FailedPrecondition naming both fingerprints and both sources) before any other
// identity field, and another LoRA configuration naming the key ("lora.r 4 (this run: 8)").
// A 4-bit base (CheckpointIdentity::quant4 set) adds "quantization" (load_in_4bit and
// BitsAndBytesConfig's keys), compared key by key the same way.
// Loading refuses, before touching the model, a checkpoint whose identity differs from the
// run's (FailedPrecondition naming every field that differs), a missing one (NotFound), and a
// damaged one (DataLoss naming the file and what is wrong): a checksum mismatch, a manifest
// value of the wrong type or out of range (the manifest itself is not checksummed), a manifest
// listing files other than state.safetensors, a state file whose tensors are not exactly the
// model's (missing, extra, another shape or dtype), or a tensor holding Inf or NaN (named, with
// the element). Writing refuses a state that is not finite.
//
// ZeRO (world size N > 1): every rank writes its own complete checkpoint directory under its own
// root, RankCheckpointRoot(root, rank): rank 0 under `root` itself (so a world-of-one run finds
// it where it always is, and refuses it naming world_size), rank r under `root`/rank-<r>. Each
// holds the tensors of the chunks that rank owns (GptModel::HoldsTrainingState) and a manifest
// with the same state (step, Adam step, loss scaler, data cursor — ranks step in lockstep — and
// the identity, whose world_size is N). A run resumes from the newest step every rank has
// committed (a crash between two ranks' commits leaves one rank a step ahead; the trainer agrees
// on the minimum), and only with the same world size: the identity check refuses any other.
//
// Thread safety: thread-compatible.
#ifndef PATRICKSTAR_TRAINER_CHECKPOINT_H_
#define PATRICKSTAR_TRAINER_CHECKPOINT_H_

#include <cstdint>
#include <optional>
#include <string>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "memory/dtype.h"
#include "model/gpt_model.h"
#include "model/lora_config.h"
#include "model/quant4_config.h"
#include "optimizer/loss_scaler.h"
#include "trainer/data/data_loader.h"

namespace ps {

// What must match for a checkpoint to continue this run.
struct CheckpointIdentity {
  int64_t vocab_size = 0;
  int64_t max_seq_len = 0;
  int64_t hidden = 0;
  int64_t num_layers = 0;
  int64_t num_heads = 0;
  DType compute_dtype = DType::kF32;
  int world_size = 1;
  int64_t micro_batch = 0;
  int64_t seq_len = 0;
  bool shuffle = false;
  uint64_t data_seed = 0;
  // LoRA: the adapters' configuration (nullopt: full training). A checkpoint of a LoRA run holds
  // only the trainable tensors (adapters, modules_to_save) and their optimizer state; the base
  // comes from checkpoint.init_from (or the seed) again when it is resumed, so the checkpoint
  // records which base it belongs to: base_fingerprint (GptModel::BaseFingerprint; empty when
  // not computed, i.e. under ZeRO, where it is not checked) and, for the error message only,
  // base_source (checkpoint.init_from, or "seed N"), which is not compared: the same base may be
  // read from another path.
  std::optional<LoraConfig> lora;
  std::string base_fingerprint;
  std::string base_source;
  // The training data's kind: "" for token data (an llm.c token file or the synthetic corpus; the
  // manifest then has neither key, as before example files existed), "examples" for an example
  // file, whose rows depend on data.packing too (the data cursor counts rows of one packing at one
  // seq_len). Resuming on the other kind, or with the other packing, is refused naming both.
  std::string data_format;
  bool packing = false;  // examples only; false for token data
  // QLoRA's 4-bit base (nullopt: none). Recorded as the run's "quantization" section
  // (load_in_4bit true and BitsAndBytesConfig's other keys); resuming with another one — or
  // with none, or a 4-bit run from a 16-bit checkpoint — is refused naming the key
  // ("quantization.bnb_4bit_quant_type \"nf4\" (this run: \"fp4\")"), as for lora; named
  // before the base fingerprint, which another quantization changes too.
  std::optional<Quant4Config> quant4;

  // Every field but base_source.
  friend bool operator==(const CheckpointIdentity& a, const CheckpointIdentity& b) {
    return a.vocab_size == b.vocab_size && a.max_seq_len == b.max_seq_len && a.hidden == b.hidden &&
           a.num_layers == b.num_layers && a.num_heads == b.num_heads &&
           a.compute_dtype == b.compute_dtype && a.world_size == b.world_size &&
           a.micro_batch == b.micro_batch && a.seq_len == b.seq_len && a.shuffle == b.shuffle &&
           a.data_seed == b.data_seed && a.lora == b.lora &&
           a.base_fingerprint == b.base_fingerprint && a.data_format == b.data_format &&
           a.packing == b.packing && a.quant4 == b.quant4;
  }
};

struct TrainingCheckpointState {
  // Trainer steps taken (the next step is step + 1).
  int64_t step = 0;
  // HybridAdam::step() (skipped steps do not count).
  int64_t adam_step = 0;
  LossScalerState loss_scaler;
  // Where the training data continues.
  DataCursor data_cursor;
  // The loss of the last step, for the record.
  double last_loss = 0;
  // fp16: steps skipped in a row for Inf/NaN gradients up to this one (HybridAdam's count, so the
  // fp16.max_consecutive_skipped_steps limit spans a resume). Absent in older checkpoints: 0.
  int64_t consecutive_skipped_steps = 0;
  CheckpointIdentity identity;
  // TrainConfigToJson of the run that wrote it.
  std::string config_json;
};

// Writes a checkpoint of `model` (outside an iteration) and `state` under `root` as step
// `state.step`, keeping the newest `keep_last` checkpoints. Returns the checkpoint's directory.
// Errors: I/O errors naming the path; AlreadyExists if that step was already committed;
// FailedPrecondition naming the tensor and element when a master weight, momentum or variance
// is Inf or NaN — a diverged state is never committed (the temporary directory is removed, the
// earlier checkpoints are untouched and nothing is pruned).
absl::StatusOr<std::string> WriteTrainingCheckpoint(const std::string& root, int64_t keep_last,
                                                    const TrainingCheckpointState& state,
                                                    const GptModel& model);

// The checkpoint root of `rank` (see the file comment).
std::string RankCheckpointRoot(const std::string& root, int rank);

// The committed checkpoint of step `step` under `root`; NotFound naming the root otherwise.
absl::StatusOr<std::string> TrainingCheckpointAtStep(const std::string& root, int64_t step);

// The newest committed checkpoint under `root`. NotFound naming the root when there is none.
absl::StatusOr<std::string> LatestTrainingCheckpoint(const std::string& root);

// Verifies the checkpoint directory `dir`, checks its identity against `expected` and loads its
// tensors into `model` (GptModel::LoadTrainingState). Returns its state. Errors: see the file
// comment; on an identity mismatch or a damaged file the model is not touched.
absl::StatusOr<TrainingCheckpointState> ReadTrainingCheckpoint(const std::string& dir,
                                                               const CheckpointIdentity& expected,
                                                               GptModel* model);

}  // namespace ps

#endif  // PATRICKSTAR_TRAINER_CHECKPOINT_H_
