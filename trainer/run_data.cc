#include "trainer/run_data.h"

#include <utility>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/str_cat.h"
#include "base/status_macros.h"
#include "trainer/data/data_loader.h"
#include "trainer/data/synthetic_corpus.h"
#include "trainer/data/token_file.h"

namespace ps {
namespace trainer_internal {

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
    ASSIGN_OR_RETURN(TokenFile file, TokenFile::Open(run.config.data.train_path));
    RETURN_IF_ERROR(file.CheckVocabSize(run.resolved.gpt.vocab_size));
    data.train_file.emplace(std::move(file));
    train = data.train_file->tokens();
  }
  if (!run.config.data.val_path.empty()) {
    ASSIGN_OR_RETURN(TokenFile file, TokenFile::Open(run.config.data.val_path));
    RETURN_IF_ERROR(file.CheckVocabSize(run.resolved.gpt.vocab_size));
    data.val_file.emplace(std::move(file));
    val = data.val_file->tokens();
  }
  {
    absl::StatusOr<DataLoader> loader = DataLoader::Create(train, options);
    if (!loader.ok()) {
      return absl::Status(loader.status().code(),
                          absl::StrCat("training data: ", loader.status().message()));
    }
    data.train_loader.emplace(std::move(*loader));
  }
  if (!val.empty()) {
    DataLoaderOptions val_options = options;
    val_options.shuffle = false;
    absl::StatusOr<DataLoader> loader = DataLoader::Create(val, val_options);
    if (!loader.ok()) {
      return absl::Status(loader.status().code(),
                          absl::StrCat("validation data: ", loader.status().message()));
    }
    data.val_loader.emplace(std::move(*loader));
  }
  return absl::OkStatus();
}

}  // namespace trainer_internal
}  // namespace ps
