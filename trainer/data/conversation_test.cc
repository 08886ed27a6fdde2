// JSON Lines shapes to examples: each shape, each refusal reason, and the trained flags of the
// shapes that are not plain conversations (prompt/completion, Alpaca, text, train_on_prompt).
#include "trainer/data/conversation.h"

#include <algorithm>
#include <cstdlib>
#include <memory>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "base/testing/status_matchers.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "trainer/data/tokenizer.h"

namespace ps {
namespace {

using ::testing::HasSubstr;

std::string ChatPath(const std::string& name) {
  const char* dir = std::getenv("TEST_SRCDIR");
  return absl::StrCat(dir != nullptr ? dir : ".", "/patrickstar_cc/trainer/data/testdata/chat/",
                      name);
}

std::string Reason(absl::string_view line) {
  LineProblem p;
  EXPECT_FALSE(ParseExampleLine(line, &p).has_value()) << line;
  EXPECT_FALSE(p.message.empty());
  return p.reason;
}

TEST(ConversationTest, ParsesEveryShape) {
  LineProblem p;
  auto m = ParseExampleLine(
      R"({"messages": [{"role": "system", "content": "s"}, {"role": "user", "content": "u"},)"
      R"( {"role": "assistant", "content": "a"}], "id": 7})",
      &p);
  ASSERT_TRUE(m.has_value()) << p.message;
  EXPECT_EQ(m->shape, ExampleShape::kMessages);
  ASSERT_EQ(m->messages.size(), 3u);
  EXPECT_EQ(m->trainable, (std::vector<bool>{false, false, true}));

  auto pc = ParseExampleLine(R"({"prompt": "p", "completion": "c"})", &p);
  ASSERT_TRUE(pc.has_value()) << p.message;
  EXPECT_EQ(pc->messages[0].role, "user");
  EXPECT_EQ(pc->messages[1].role, "assistant");
  EXPECT_EQ(pc->trainable, (std::vector<bool>{false, true}));

  // Conversational prompt/completion: an assistant message in the prompt is not trained.
  auto pcl = ParseExampleLine(
      R"({"prompt": [{"role": "user", "content": "a"}, {"role": "assistant", "content": "b"},)"
      R"( {"role": "user", "content": "c"}], "completion": [{"role": "assistant", "content": "d"}]})",
      &p);
  ASSERT_TRUE(pcl.has_value()) << p.message;
  EXPECT_EQ(pcl->trainable, (std::vector<bool>{false, false, false, true}));

  auto al = ParseExampleLine(R"({"instruction": "Do X.", "input": "data", "output": "done"})", &p);
  ASSERT_TRUE(al.has_value()) << p.message;
  EXPECT_EQ(al->messages[0].content, "Do X.\n\ndata");
  EXPECT_EQ(al->messages[1].content, "done");
  auto al2 = ParseExampleLine(R"({"instruction": "Do X.", "input": "", "output": "done"})", &p);
  ASSERT_TRUE(al2.has_value());
  EXPECT_EQ(al2->messages[0].content, "Do X.");

  auto t = ParseExampleLine(R"({"text": "hello \u00e9"})", &p);
  ASSERT_TRUE(t.has_value());
  EXPECT_EQ(t->text, "hello \xc3\xa9");
}

TEST(ConversationTest, RefusesBadLinesWithAReason) {
  EXPECT_EQ(Reason("{\"text\": \"\xff\"}"), "not_utf8");
  EXPECT_EQ(Reason("not json"), "not_json");
  EXPECT_EQ(Reason("{\"text\": \"a\"} trailing"), "not_json");
  EXPECT_EQ(Reason(R"({"text": "\ud800"})"), "not_json");  // unpaired surrogate
  EXPECT_EQ(Reason("[1, 2]"), "no_known_shape");
  EXPECT_EQ(Reason(R"({"foo": 1})"), "no_known_shape");
  EXPECT_EQ(Reason(R"({"text": "a", "messages": []})"), "no_known_shape");
  EXPECT_EQ(Reason(R"({"text": 3})"), "bad_field");
  EXPECT_EQ(Reason(R"({"messages": {}})"), "bad_field");
  EXPECT_EQ(Reason(R"({"messages": [{"role": "user"}]})"), "bad_field");
  EXPECT_EQ(Reason(R"({"messages": [{"role": "user", "content": null}]})"), "bad_field");
  EXPECT_EQ(Reason(R"({"messages": [{"role": "tool", "content": "x"}]})"), "unknown_role");
  EXPECT_EQ(Reason(R"({"messages": []})"), "empty_conversation");
  EXPECT_EQ(Reason(R"({"messages": [{"role": "user", "content": "x"}]})"), "no_assistant");
  EXPECT_EQ(Reason(R"({"prompt": [], "completion": [{"role": "user", "content": "x"}]})"),
            "no_assistant");
  EXPECT_EQ(Reason(R"({"instruction": "a", "input": 1, "output": "b"})"), "bad_field");
}

class TokenizeTest : public ::testing::Test {
 protected:
  void SetUp() override {
    absl::StatusOr<std::unique_ptr<BpeTokenizer>> t =
        BpeTokenizer::LoadTokenizerJson(ChatPath("qwen_chat_tokenizer.json"));
    ASSERT_TRUE(t.ok()) << t.status();
    tok_ = std::move(*t);
  }
  TokenizedExample Run(absl::string_view line, ExampleOptions options) {
    LineProblem p;
    std::optional<ParsedExample> ex = ParseExampleLine(line, &p);
    EXPECT_TRUE(ex.has_value()) << p.message;
    ExampleTokenizer et(tok_.get(), options);
    TokenizedExample out;
    EXPECT_TRUE(et.Tokenize(*ex, &out, &p)) << p.message;
    rendering_ = et.last_rendering();
    return out;
  }
  // The decoded text of the trained tokens.
  std::string Trained(const TokenizedExample& ex) {
    std::vector<uint32_t> t;
    for (size_t i = 0; i < ex.tokens.size(); ++i) {
      if (ex.trained[i]) t.push_back(ex.tokens[i]);
    }
    return *tok_->Decode(t);
  }
  std::unique_ptr<BpeTokenizer> tok_;
  std::string rendering_;
};

TEST_F(TokenizeTest, PromptCompletionTrainsTheCompletionOnly) {
  ExampleOptions o;
  o.family = ChatFamily::kQwen25;
  TokenizedExample ex = Run(R"({"prompt": "What is 2+2?", "completion": "4"})", o);
  EXPECT_EQ(Trained(ex), "4<|im_end|>");
  EXPECT_EQ(ex.trained[0], 0);
}

TEST_F(TokenizeTest, AlpacaIsOneUserTurnAndOneAnswer) {
  ExampleOptions o;
  o.family = ChatFamily::kQwen2;
  TokenizedExample ex = Run(R"({"instruction": "Reverse", "input": "abc", "output": "cba"})", o);
  EXPECT_EQ(rendering_,
            "<|im_start|>system\nYou are a helpful assistant.<|im_end|>\n<|im_start|>user\n"
            "Reverse\n\nabc<|im_end|>\n<|im_start|>assistant\ncba<|im_end|>\n");
  EXPECT_EQ(Trained(ex), "cba<|im_end|>");
}

TEST_F(TokenizeTest, TrainOnPromptTrainsAllButTheFirstToken) {
  ExampleOptions o;
  o.family = ChatFamily::kQwen3;
  o.train_on_prompt = true;
  TokenizedExample ex = Run(R"({"prompt": "hi", "completion": "yo"})", o);
  ASSERT_GT(ex.tokens.size(), 3u);
  EXPECT_EQ(ex.trained[0], 0);
  for (size_t i = 1; i < ex.trained.size(); ++i) EXPECT_EQ(ex.trained[i], 1) << i;
}

TEST_F(TokenizeTest, TextGetsTheDocumentTokenAndTrainsTheRest) {
  ExampleOptions o;  // no chat template needed
  TokenizedExample ex = Run(R"({"text": "plain <|im_end|> text"})", o);
  ASSERT_TRUE(tok_->document_token().has_value());
  EXPECT_EQ(ex.tokens[0], *tok_->document_token());
  // The special-token string inside text is ordinary text, not the special token.
  EXPECT_EQ(*tok_->Decode(absl::MakeConstSpan(ex.tokens).subspan(1)), "plain <|im_end|> text");
  EXPECT_EQ(std::count(ex.tokens.begin(), ex.tokens.end(), *tok_->TokenId("<|im_end|>")), 0);
  EXPECT_EQ(ex.trained[0], 0);
  for (size_t i = 1; i < ex.trained.size(); ++i) EXPECT_EQ(ex.trained[i], 1);
}

TEST_F(TokenizeTest, ConversationWithoutTemplateIsRefused) {
  ExampleOptions o;
  LineProblem p;
  std::optional<ParsedExample> ex = ParseExampleLine(R"({"prompt": "a", "completion": "b"})", &p);
  ASSERT_TRUE(ex.has_value());
  ExampleTokenizer et(tok_.get(), o);
  TokenizedExample out;
  EXPECT_FALSE(et.Tokenize(*ex, &out, &p));
  EXPECT_EQ(p.reason, "no_chat_template");
  EXPECT_THAT(p.message, HasSubstr("--chat_template"));
}

TEST_F(TokenizeTest, NfcNormalizedContentKeepsItsSpan) {
  // The Qwen tokenizer normalizes NFC: "e" + U+0301 becomes one character; the trained span still
  // covers exactly the answer.
  ExampleOptions o;
  o.family = ChatFamily::kQwen25;
  TokenizedExample ex = Run("{\"prompt\": \"cafe\\u0301?\", \"completion\": \"cafe\\u0301!\"}", o);
  EXPECT_EQ(Trained(ex), "caf\xc3\xa9!<|im_end|>");
}

}  // namespace
}  // namespace ps
