// Chat templates rendered in C++: the conversation text a Hugging Face model directory's Jinja
// `chat_template` renders (transformers' apply_chat_template, add_generation_prompt=False, no
// tools), byte for byte, with the byte spans that answer-only training trains on.
//
// Families (names for --chat_template), each rendering exactly one real template committed under
// testdata/chat/ (SOURCES.md names where each was found):
//   llama3   Llama-3.1/3.2 Instruct: bos, a system header that always carries "Cutting Knowledge
//            Date: December 2023" and "Today Date: <date_string>" (the templates' default
//            "26 Jul 2024"; Llama-3.2's template uses the current date when transformers provides
//            strftime_now — pass the date you want with ChatRenderOptions::date_string), then
//            each message as <|start_header_id|>role<|end_header_id|>\n\n + content|trim +
//            <|eot_id|>. The system message is trimmed too; none gives an empty one.
//   qwen2    Qwen2-Instruct ChatML: "You are a helpful assistant." as the system turn when the
//            first message is not a system message.
//   qwen2.5  Qwen2.5-Instruct ChatML: "You are Qwen, created by Alibaba Cloud. You are a helpful
//            assistant." when there is no system message.
//   qwen3    Qwen3 ChatML, no default system turn. An assistant message's "<think>...</think>" is
//            split off: assistant turns after the last user message are rendered with the
//            reasoning as "<think>\n" + reasoning + "\n</think>\n\n" + answer (the last one
//            always, an earlier one only if its reasoning is non-empty); turns before it lose the
//            reasoning. `enable_thinking` only changes the generation prompt, which training data
//            never renders, so it is not an option here.
//   mistral  Mistral-7B-Instruct-v0.3's template as Hugging Face's own Jinja test suite carries
//            it (huggingface.js): "<s>", then " [INST] " + user + " [/INST]" and " " + answer +
//            " </s>". That template drops system messages silently; RenderChat refuses them.
//   gpt2     no template (GPT-2 has none): transformers' former default for GPT-2, each
//            message's content followed by eos ("<|endoftext|>"), roles not written.
//
// Trained spans (axolotl's train_on_eos: turn): for each assistant message, the bytes of its
// content as rendered (after trimming or reasoning handling; for qwen3 everything after the
// "<|im_start|>assistant\n" header) through its end-of-turn token (<|eot_id|>, <|im_end|>, </s>,
// eos). Scaffolding, headers and the newline after an end-of-turn token are not trained.
//
// Thread safety: pure functions.
#ifndef PATRICKSTAR_TRAINER_DATA_CHAT_TEMPLATE_H_
#define PATRICKSTAR_TRAINER_DATA_CHAT_TEMPLATE_H_

#include <cstddef>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "absl/types/span.h"

namespace ps {

enum class ChatFamily { kLlama3, kQwen2, kQwen25, kQwen3, kMistral, kGpt2 };

// "llama3", "qwen2", "qwen2.5", "qwen3", "mistral", "gpt2".
absl::string_view ChatFamilyName(ChatFamily family);
// Every name, comma-separated, for messages.
std::string KnownChatFamilyNames();
// InvalidArgument naming `name` and the known names.
[[nodiscard]] absl::StatusOr<ChatFamily> ChatFamilyFromName(absl::string_view name);

// The family a Jinja chat template belongs to, by markers each family's template has and the
// others lack (chat_template.cc lists them). Anything else (Llama-3.0 without the date header,
// other ChatML templates, Mistral templates other than the one rendered) is InvalidArgument naming
// `source` (e.g. "'dir/tokenizer_config.json'"), what was found and the known names.
[[nodiscard]] absl::StatusOr<ChatFamily> RecognizeChatTemplate(absl::string_view jinja,
                                                               absl::string_view source);

struct ChatMessage {
  std::string role;     // "system", "user" or "assistant"
  std::string content;  // any UTF-8
};

struct ChatRenderOptions {
  std::string date_string = "26 Jul 2024";  // llama3's "Today Date"
  // The directory's special tokens (tokenizer_config.json); empty means the family's own
  // ("<|begin_of_text|>", "<s>" / "</s>", "<|endoftext|>").
  std::string bos_token;
  std::string eos_token;
};

// Byte range [begin, end) of the rendered text.
struct ByteSpan {
  size_t begin = 0;
  size_t end = 0;
};

struct RenderedChat {
  std::string text;
  // One per assistant message, in order: its trained bytes (see the file comment).
  std::vector<ByteSpan> assistant_spans;
  // The special-token strings the rendering uses (for tokenizers that need them cut out).
  std::vector<std::string> special_tokens;
};

// Renders `messages` (roles system/user/assistant; anything else is InvalidArgument). Errors:
// InvalidArgument for a role the family cannot render (mistral: system).
[[nodiscard]] absl::StatusOr<RenderedChat> RenderChat(ChatFamily family,
                                                      absl::Span<const ChatMessage> messages,
                                                      const ChatRenderOptions& options);

// Python's str.strip() with no argument (Jinja's `trim`): removes leading and trailing characters
// for which str.isspace() is true. Exposed for tests.
absl::string_view PyStrip(absl::string_view s);

}  // namespace ps

#endif  // PATRICKSTAR_TRAINER_DATA_CHAT_TEMPLATE_H_
