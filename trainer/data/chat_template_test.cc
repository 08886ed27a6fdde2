// Chat templates against Python's jinja2 running the real templates (testdata/chat/SOURCES.md),
// byte for byte, then tokens and trained flags against the `tokenizers` library
// (testdata/chat/make_chat_vectors.py); recognition of the real templates and refusal of others.
#include "trainer/data/chat_template.h"

#include <cstdlib>
#include <fstream>
#include <iterator>
#include <memory>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "base/testing/status_matchers.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "nlohmann/json.hpp"
#include "trainer/data/conversation.h"
#include "trainer/data/tokenizer.h"

namespace ps {
namespace {

using ::testing::HasSubstr;
using Json = nlohmann::json;

std::string ChatPath(const std::string& name) {
  const char* dir = std::getenv("TEST_SRCDIR");
  return absl::StrCat(dir != nullptr ? dir : ".", "/patrickstar_cc/trainer/data/testdata/chat/",
                      name);
}

std::string ReadFileOrDie(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  EXPECT_TRUE(in.good()) << path;
  return std::string(std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>());
}

const Json& Vectors() {
  static const Json* const v = new Json(Json::parse(ReadFileOrDie(ChatPath("vectors.json"))));
  return *v;
}

ChatFamily FamilyOf(const std::string& vector_family) {
  if (vector_family == "llama3-3.2") return ChatFamily::kLlama3;
  absl::StatusOr<ChatFamily> f = ChatFamilyFromName(vector_family);
  EXPECT_TRUE(f.ok()) << vector_family;
  return *f;
}

std::vector<ChatMessage> MessagesOf(const Json& c) {
  std::vector<ChatMessage> out;
  for (const Json& m : c["messages"]) {
    out.push_back({m["role"].get<std::string>(), m["content"].get<std::string>()});
  }
  return out;
}

TEST(ChatTemplateTest, RendersEveryCaseByteForByteAsJinja) {
  int rendered = 0, refused = 0;
  for (const Json& c : Vectors()["cases"]) {
    const std::string label = absl::StrCat(c["family"].get<std::string>(), "/",
                                           c["name"].get<std::string>(), "/",
                                           c["date"].get<std::string>());
    ChatRenderOptions options;
    options.date_string = c["date"].get<std::string>();
    absl::StatusOr<RenderedChat> r = RenderChat(FamilyOf(c["family"]), MessagesOf(c), options);
    if (c.contains("error")) {
      EXPECT_FALSE(r.ok()) << label;
      ++refused;
      continue;
    }
    ASSERT_TRUE(r.ok()) << label << ": " << r.status();
    EXPECT_EQ(r->text, c["text"].get<std::string>()) << label;
    ++rendered;
  }
  // Seven templates (two Llama), eleven conversations, Llama twice for the date.
  EXPECT_EQ(rendered + refused, 99);
  EXPECT_GT(refused, 0);
}

TEST(ChatTemplateTest, TokensAndTrainedFlagsMatchTokenizersLibrary) {
  int checked = 0;
  for (const Json& c : Vectors()["cases"]) {
    if (!c.contains("ids")) continue;
    const std::string label = absl::StrCat(c["family"].get<std::string>(), "/",
                                           c["name"].get<std::string>());
    const std::string tok_name = c["tokenizer"].get<std::string>();
    absl::StatusOr<std::unique_ptr<BpeTokenizer>> tok =
        BpeTokenizer::LoadTokenizerJson(ChatPath(tok_name));
    ASSERT_TRUE(tok.ok()) << tok.status();
    for (bool last : {false, true}) {
      ExampleOptions options;
      options.family = FamilyOf(c["family"]);
      options.render.date_string = c["date"].get<std::string>();
      options.train_on = last ? TrainOn::kLastAssistant : TrainOn::kAllAssistant;
      ExampleTokenizer et(tok->get(), options);
      ParsedExample ex;
      ex.messages = MessagesOf(c);
      for (const ChatMessage& m : ex.messages) ex.trainable.push_back(m.role == "assistant");
      TokenizedExample out;
      LineProblem problem;
      ASSERT_TRUE(et.Tokenize(ex, &out, &problem)) << label << ": " << problem.message;
      EXPECT_EQ(et.last_rendering(), c["text"].get<std::string>()) << label;
      EXPECT_EQ(out.tokens, c["ids"].get<std::vector<uint32_t>>()) << label;
      EXPECT_EQ(out.trained,
                c[last ? "trained_last" : "trained"].get<std::vector<uint8_t>>())
          << label << (last ? " (last assistant)" : "");
      ++checked;
    }
  }
  EXPECT_GT(checked, 100);
}

TEST(ChatTemplateTest, RecognizesEachCommittedTemplate) {
  const std::pair<const char*, ChatFamily> files[] = {
      {"llama3.1-8b-instruct.jinja", ChatFamily::kLlama3},
      {"llama3.2-3b-instruct.jinja", ChatFamily::kLlama3},
      {"qwen2-0.5b-instruct.jinja", ChatFamily::kQwen2},
      {"qwen2.5-7b-instruct.jinja", ChatFamily::kQwen25},
      {"qwen3-0.6b.jinja", ChatFamily::kQwen3},
      {"mistral-7b-instruct-v0.3.jinja", ChatFamily::kMistral},
      {"gpt2-default.jinja", ChatFamily::kGpt2},
  };
  for (const auto& [file, family] : files) {
    absl::StatusOr<ChatFamily> f = RecognizeChatTemplate(ReadFileOrDie(ChatPath(file)), file);
    ASSERT_TRUE(f.ok()) << file << ": " << f.status();
    EXPECT_EQ(*f, family) << file;
  }
}

TEST(ChatTemplateTest, RefusesUnknownTemplatesNamingTheKnownOnes) {
  const char* unknown[] = {
      // Llama-3.0 (no date header).
      "{% set loop_messages = messages %}{% for message in loop_messages %}{% set content = "
      "'<|start_header_id|>' + message['role'] + '<|end_header_id|>\n\n'+ message['content'] | "
      "trim + '<|eot_id|>' %}{{ content }}{% endfor %}",
      // Plain ChatML.
      "{% for message in messages %}{{'<|im_start|>' + message['role'] + '\n' + "
      "message['content'] + '<|im_end|>' + '\n'}}{% endfor %}",
      // Mixtral's [INST] template.
      "{{ bos_token }}{% for message in messages %}{% if message['role'] == 'user' %}{{ '[INST] "
      "' + message['content'] + ' [/INST]' }}{% endif %}{% endfor %}",
      "",
  };
  for (const char* t : unknown) {
    absl::StatusOr<ChatFamily> f = RecognizeChatTemplate(t, "'x/tokenizer_config.json'");
    ASSERT_FALSE(f.ok()) << t;
    EXPECT_THAT(std::string(f.status().message()),
                HasSubstr("known templates: llama3, qwen2, qwen2.5, qwen3, mistral, gpt2"));
    EXPECT_THAT(std::string(f.status().message()), HasSubstr("x/tokenizer_config.json"));
  }
  EXPECT_FALSE(ChatFamilyFromName("chatml").ok());
  EXPECT_EQ(*ChatFamilyFromName("qwen2.5"), ChatFamily::kQwen25);
}

TEST(ChatTemplateTest, PyStripMatchesPythonWhitespace) {
  EXPECT_EQ(PyStrip(" \t\n\r\x0b\x0c\x1c\x1d\x1e\x1f a b \xc2\x85\xc2\xa0"), "a b");
  EXPECT_EQ(PyStrip("\xe3\x80\x80x\xe2\x80\xa8"), "x");            // U+3000, U+2028
  EXPECT_EQ(PyStrip("\xe2\x80\x8bx\xe2\x80\x8b"), "\xe2\x80\x8bx\xe2\x80\x8b");  // U+200B is not
  EXPECT_EQ(PyStrip("   "), "");
  EXPECT_EQ(PyStrip(""), "");
}

TEST(ChatTemplateTest, RefusesRolesTheFamilyCannotRender) {
  EXPECT_FALSE(RenderChat(ChatFamily::kQwen25, {{"tool", "x"}}, {}).ok());
  absl::StatusOr<RenderedChat> r =
      RenderChat(ChatFamily::kMistral, {{"system", "s"}, {"user", "u"}}, {});
  ASSERT_FALSE(r.ok());
  EXPECT_THAT(std::string(r.status().message()), HasSubstr("drops"));
}

}  // namespace
}  // namespace ps
