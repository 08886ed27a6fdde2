// Includes sentencepiece_processor.h and no Abseil header (see sentencepiece_shim.h).
#include "trainer/data/internal/sentencepiece_shim.h"

#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "sentencepiece_processor.h"

namespace ps::data_internal {

SentencePieceShim::SentencePieceShim()
    : processor_(std::make_unique<sentencepiece::SentencePieceProcessor>()) {}

SentencePieceShim::~SentencePieceShim() = default;

std::string SentencePieceShim::LoadFromSerializedProto(std::string_view model_proto) {
  const sentencepiece::util::Status status = processor_->LoadFromSerializedProto(model_proto);
  return status.ok() ? std::string() : status.ToString();
}

std::string SentencePieceShim::Encode(std::string_view text, std::vector<int>* ids) const {
  const sentencepiece::util::Status status = processor_->Encode(text, ids);
  return status.ok() ? std::string() : status.ToString();
}

std::string SentencePieceShim::Decode(const std::vector<int>& ids, std::string* text) const {
  const sentencepiece::util::Status status = processor_->Decode(ids, text);
  return status.ok() ? std::string() : status.ToString();
}

int SentencePieceShim::PieceSize() const { return processor_->GetPieceSize(); }

int SentencePieceShim::PieceToId(std::string_view piece) const {
  return processor_->PieceToId(piece);
}

std::string SentencePieceShim::IdToPiece(int id) const { return processor_->IdToPiece(id); }

bool SentencePieceShim::IsByte(int id) const { return processor_->IsByte(id); }

int SentencePieceShim::bos_id() const { return processor_->bos_id(); }

}  // namespace ps::data_internal
