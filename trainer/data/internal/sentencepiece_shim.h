// A thin wrapper of libsentencepiece's SentencePieceProcessor in standard-library types only.
//
// Why: Debian's sentencepiece_processor.h declares `namespace absl { using std::string_view; }`,
// which collides with Debian's Abseil (whose absl::string_view is its own class). So the
// library's header is included by exactly one file, sentencepiece_shim.cc, which includes no
// Abseil header; everything else talks to this wrapper.
//
// Errors are returned as messages: an empty string means success.
// Thread safety: after LoadFromSerializedProto, const methods may be called concurrently.
#ifndef PATRICKSTAR_TRAINER_DATA_INTERNAL_SENTENCEPIECE_SHIM_H_
#define PATRICKSTAR_TRAINER_DATA_INTERNAL_SENTENCEPIECE_SHIM_H_

#include <memory>
#include <string>
#include <string_view>
#include <vector>

namespace sentencepiece {
class SentencePieceProcessor;
}  // namespace sentencepiece

namespace ps::data_internal {

class SentencePieceShim {
 public:
  SentencePieceShim();
  ~SentencePieceShim();
  SentencePieceShim(const SentencePieceShim&) = delete;
  SentencePieceShim& operator=(const SentencePieceShim&) = delete;

  // Parses a serialized ModelProto (the bytes of a tokenizer.model).
  std::string LoadFromSerializedProto(std::string_view model_proto);
  // The ids of `text` (no BOS/EOS), appended to nothing: `ids` is overwritten.
  std::string Encode(std::string_view text, std::vector<int>* ids) const;
  // The text of `ids`. REQUIRES: 0 <= id < PieceSize() for each.
  std::string Decode(const std::vector<int>& ids, std::string* text) const;
  int PieceSize() const;
  // The id of `piece`, or the unknown id if it is not a piece.
  int PieceToId(std::string_view piece) const;
  // REQUIRES: 0 <= id < PieceSize().
  std::string IdToPiece(int id) const;
  bool IsByte(int id) const;
  // -1 if the model has none.
  int bos_id() const;

 private:
  std::unique_ptr<sentencepiece::SentencePieceProcessor> processor_;
};

}  // namespace ps::data_internal

#endif  // PATRICKSTAR_TRAINER_DATA_INTERNAL_SENTENCEPIECE_SHIM_H_
