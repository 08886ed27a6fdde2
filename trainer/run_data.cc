#include "trainer/run_data.h"

#include <optional>
#include <string>
#include <utility>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/string_view.h"
#include "base/status_macros.h"
#include "trainer/data/data_loader.h"
#include "trainer/data/example_file.h"
#include "trainer/data/packed_loader.h"
#include "trainer/data/synthetic_corpus.h"
#include "trainer/data/token_file.h"

namespace ps {
namespace trainer_internal {

namespace {

// `what` ("training data" / "validation data") before a loader's error.
absl::Status Prefixed(const absl::Status& s, absl::string_view what) {
  if (s.ok()) return s;
  return absl::Status(s.code(), absl::StrCat(what, ": ", s.message()));
}

// Opens the example file `path` into `file` and its PackedLoader into `loader`.
absl::Status OpenExamples(const TrainRun& run, const std::string& path, bool validation,
                          std::optional<ExampleFile>& file, std::optional<PackedLoader>& loader) {
  const absl::string_view what = validation ? "validation data" : "training data";
  ASSIGN_OR_RETURN(ExampleFile f, ExampleFile::Open(path));
  RETURN_IF_ERROR(f.CheckVocabSize(run.resolved.gpt.vocab_size));
  file.emplace(std::move(f));
  PackedLoaderOptions options;
  options.batch_size = run.shape.micro_batch;
  options.seq_len = run.shape.seq_len;
  options.vocab_size = run.resolved.gpt.vocab_size;
  options.packing = run.config.data.packing;
  // Validation reads every row in order.
  options.shuffle = validation ? false : run.config.data.shuffle;
  options.seed = run.config.data.seed;
  options.rank = run.shape.rank;
  options.world_size = run.shape.world;
  absl::StatusOr<PackedLoader> l = PackedLoader::Create(file->view(), options);
  if (!l.ok()) return Prefixed(l.status(), absl::StrCat(what, " '", path, "'"));
  loader.emplace(std::move(*l));
  return absl::OkStatus();
}

// The kind of the data file `path` (its magic), the error naming the key.
absl::StatusOr<DataFileKind> Kind(const std::string& path, absl::string_view key) {
  absl::StatusOr<DataFileKind> kind = SniffDataFile(path);
  if (!kind.ok()) return Prefixed(kind.status(), key);
  return kind;
}

}  // namespace

absl::Status LoadData(const TrainRun& run, RunData& data) {
  DataLoaderOptions options;
  options.batch_size = run.shape.micro_batch;
  options.seq_len = run.shape.seq_len;
  options.vocab_size = run.resolved.gpt.vocab_size;
  options.shuffle = run.config.data.shuffle;
  options.seed = run.config.data.seed;
  options.rank = run.shape.rank;
  options.world_size = run.shape.world;
  TokenSpan train, val;
  if (run.config.data.train_path.empty()) {
    if (run.resolved.gpt.vocab_size < SyntheticCorpus::kVocabSize) {
      return absl::InvalidArgumentError(
          absl::StrCat("the built-in synthetic corpus is byte-level (", SyntheticCorpus::kVocabSize,
                       " tokens) but model.vocab_size is ", run.resolved.gpt.vocab_size,
                       "; use vocab_size >= 256 or give data.train (--train_data)"));
    }
    SyntheticCorpusOptions corpus_options;
    corpus_options.seed = run.config.data.seed;
    ASSIGN_OR_RETURN(SyntheticCorpus corpus, GenerateSyntheticCorpus(corpus_options));
    data.synthetic_train = std::move(corpus.train);
    data.synthetic_val = std::move(corpus.val);
    data.unigram_entropy = corpus.train_unigram_entropy_nats;
    data.entropy_rate = corpus.entropy_rate_nats;
    train = data.synthetic_train;
    if (run.config.data.val_path.empty()) val = data.synthetic_val;
  } else {
    const std::string& path = run.config.data.train_path;
    ASSIGN_OR_RETURN(const DataFileKind kind, Kind(path, "data.train (--train_data)"));
    if (kind == DataFileKind::kExamples) {
      RETURN_IF_ERROR(
          OpenExamples(run, path, /*validation=*/false, data.train_examples, data.train_packed));
    } else {
      ASSIGN_OR_RETURN(TokenFile file, TokenFile::Open(path));
      RETURN_IF_ERROR(file.CheckVocabSize(run.resolved.gpt.vocab_size));
      data.train_file.emplace(std::move(file));
      train = data.train_file->tokens();
    }
  }
  if (!run.config.data.val_path.empty()) {
    const std::string& path = run.config.data.val_path;
    ASSIGN_OR_RETURN(const DataFileKind kind, Kind(path, "data.val (--val_data)"));
    if (kind == DataFileKind::kExamples) {
      RETURN_IF_ERROR(
          OpenExamples(run, path, /*validation=*/true, data.val_examples, data.val_packed));
    } else {
      ASSIGN_OR_RETURN(TokenFile file, TokenFile::Open(path));
      RETURN_IF_ERROR(file.CheckVocabSize(run.resolved.gpt.vocab_size));
      data.val_file.emplace(std::move(file));
      val = data.val_file->tokens();
    }
  }
  if (!data.train_packed.has_value()) {
    absl::StatusOr<DataLoader> loader = DataLoader::Create(train, options);
    if (!loader.ok()) return Prefixed(loader.status(), "training data");
    data.train_loader.emplace(std::move(*loader));
  }
  if (!val.empty()) {
    DataLoaderOptions val_options = options;
    val_options.shuffle = false;
    absl::StatusOr<DataLoader> loader = DataLoader::Create(val, val_options);
    if (!loader.ok()) return Prefixed(loader.status(), "validation data");
    data.val_loader.emplace(std::move(*loader));
  }
  return absl::OkStatus();
}

}  // namespace trainer_internal
}  // namespace ps
