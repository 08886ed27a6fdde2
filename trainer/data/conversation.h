// Fine-tuning examples from JSON Lines: the shapes people have, rendered through a chat template
// (chat_template.h) and tokenized on the whole rendered string, with a trained flag per token.
//
// Shapes (one JSON object per line; exactly one shape's keys, other keys are ignored):
//   {"messages": [{"role": "system"|"user"|"assistant", "content": string}, ...]}
//   {"prompt": P, "completion": C}  P, C strings or message lists; a string prompt is one user
//       message, a string completion one assistant message. Only the completion's assistant
//       messages are trained (TRL's completion-only loss).
//   {"instruction": string, "input": string (optional), "output": string}  (Alpaca): one user
//       message, instruction + "\n\n" + input (just instruction when input is absent or ""),
//       and one assistant message, output.
//   {"text": string}  plain text: the tokenizer's document token (Llama-3's <|begin_of_text|>,
//       GPT-2's and Qwen's <|endoftext|>; none for others) then the text's tokens, special-token
//       strings in the text kept as ordinary text (as llm.c's data scripts and text_to_bin encode),
//       no eos appended. Every token but the first is trained.
// A conversation must have at least one message and at least one trained assistant message.
//
// Trained flags for conversations: token i is trained iff its bytes overlap a trained byte span
// of the rendering (chat_template.h: each assistant message's content and end-of-turn token)
// — TRL's assistant-mask rule, char_to_token over the span. Options: only the last trained
// assistant message (TrainOn::kLastAssistant), or every token (train_on_prompt). Token 0 is never
// trained (nothing precedes it in its example).
//
// Thread safety: ParseExampleLine is pure; ExampleTokenizer uses one Tokenizer (not thread-safe).
#ifndef PATRICKSTAR_TRAINER_DATA_CONVERSATION_H_
#define PATRICKSTAR_TRAINER_DATA_CONVERSATION_H_

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "trainer/data/chat_template.h"
#include "trainer/data/tokenizer.h"

namespace ps {

enum class ExampleShape { kMessages, kPromptCompletion, kAlpaca, kText };
absl::string_view ExampleShapeName(ExampleShape shape);

struct ParsedExample {
  ExampleShape shape = ExampleShape::kMessages;
  std::vector<ChatMessage> messages;  // conversations
  std::vector<bool> trainable;        // per message: an assistant message whose tokens may train
  std::string text;                   // kText
};

// Why a line was refused: a short key for the summary's skip counts, and the message.
struct LineProblem {
  std::string reason;  // not_utf8, not_json, no_known_shape, bad_field, unknown_role,
                       // empty_conversation, no_assistant, empty_text
  std::string message;
};

// Parses one line (without its newline). On failure returns nullopt and fills *problem.
std::optional<ParsedExample> ParseExampleLine(absl::string_view line, LineProblem* problem);

enum class TrainOn { kAllAssistant, kLastAssistant };

struct ExampleOptions {
  // Needed for conversation shapes; absent -> those lines are refused (reason no_chat_template).
  std::optional<ChatFamily> family;
  ChatRenderOptions render;
  TrainOn train_on = TrainOn::kAllAssistant;
  bool train_on_prompt = false;
};

struct TokenizedExample {
  std::vector<uint32_t> tokens;
  std::vector<uint8_t> trained;  // 0/1 per token
};

// Renders and tokenizes parsed examples. For a BpeTokenizer the whole rendering is encoded with
// special tokens parsed (as `tokenizer(text, add_special_tokens=False)` in transformers) and
// each token's bytes are found by decoding it; for other tokenizers (SentencePiece) the rendering
// is cut at the template's special-token strings, each piece encoded on its own and each token
// given its piece's bytes — not verified against Hugging Face (no reference tokenizer here).
class ExampleTokenizer {
 public:
  // `tokenizer` must outlive this object.
  ExampleTokenizer(Tokenizer* tokenizer, ExampleOptions options);

  // Fills *out. On failure returns false and fills *problem (reasons: no_chat_template,
  // unknown_role for roles the family cannot render, empty_text, tokenizer).
  bool Tokenize(const ParsedExample& example, TokenizedExample* out, LineProblem* problem);

  // The rendering of the last conversation tokenized (for tests and --print_examples).
  const std::string& last_rendering() const { return last_rendering_; }

 private:
  bool TokenizeText(absl::string_view text, TokenizedExample* out, LineProblem* problem);
  bool EncodeWithSpans(const RenderedChat& chat, std::vector<uint32_t>* tokens,
                       std::vector<ByteSpan>* token_bytes, LineProblem* problem);

  Tokenizer* tokenizer_;
  BpeTokenizer* bpe_;  // tokenizer_ if it is one, else null
  ExampleOptions options_;
  std::string last_rendering_;
};

}  // namespace ps

#endif  // PATRICKSTAR_TRAINER_DATA_CONVERSATION_H_
