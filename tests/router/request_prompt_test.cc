// Tests for router/request_prompt: the prompt ids the router computes for a
// GenerateRequest. Token ids are checked against
// ../shared/goldens/qwen2-tiny-synth_chat.json (llama.cpp c392e50's
// tokenization of the rendered text, special tokens parsed, no BOS) and
// against the vocabularies of the shared models (token texts and ids read
// from their tokenizer.ggml.tokens).
#include "router/request_prompt.h"

#include <algorithm>
#include <memory>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "tests/test_util.h"

namespace tandem::router {
namespace {

using ::testing::Contains;
using ::testing::ElementsAre;
using ::testing::HasSubstr;
using ::testing::Not;
using tandem::testing::ReadFileOrDie;
using tandem::testing::SharedPath;

// qwen2-tiny-synth.gguf's vocabulary: <|endoftext|> (BOS), <|im_start|>.
constexpr int32_t kQwenEndOfText = 151643;
constexpr int32_t kQwenImStart = 151644;
// stories260K.gguf: <s>.
constexpr int32_t kStoriesBos = 1;

// A model's file, tokenizer, resolved chat template and BOS text, as the
// router holds them.
struct Model {
  std::unique_ptr<gguf::GgufFile> file;
  std::unique_ptr<tokenizer::Tokenizer> tokenizer;
  std::optional<ChatTemplate> chat_template;
  std::string bos_text;

  absl::StatusOr<std::vector<int32_t>> Tokenize(const v1::GenerateRequest& request) const {
    return TokenizeRequestPrompt(request, *tokenizer, *chat_template, bos_text);
  }
};

Model Load(const std::string& name, absl::string_view chat_template_override = "") {
  Model m;
  absl::StatusOr<std::unique_ptr<gguf::GgufFile>> file =
      gguf::GgufFile::Open(SharedPath("models/" + name));
  EXPECT_TRUE(file.ok()) << file.status();
  if (!file.ok()) return m;
  m.file = std::move(*file);
  absl::StatusOr<std::unique_ptr<tokenizer::Tokenizer>> tok =
      tokenizer::Tokenizer::FromGguf(*m.file);
  EXPECT_TRUE(tok.ok()) << tok.status();
  if (!tok.ok()) return m;
  m.tokenizer = std::move(*tok);
  absl::StatusOr<ChatTemplate> t = ChatTemplate::FromGguf(*m.file, chat_template_override);
  EXPECT_TRUE(t.ok()) << t.status();
  if (t.ok()) m.chat_template = *t;
  m.bos_text = BosTokenText(*m.file, m.tokenizer->bos_id());
  return m;
}

v1::GenerateRequest Chat(const std::vector<std::pair<std::string, std::string>>& messages) {
  v1::GenerateRequest r;
  for (const auto& [role, content] : messages) {
    v1::ChatMessage* m = r.add_messages();
    m->set_role(role);
    m->set_content(content);
  }
  return r;
}

v1::GenerateRequest Prompt(const std::string& text, bool split_special_tokens = false) {
  v1::GenerateRequest r;
  r.set_prompt(text);
  r.set_split_special_tokens(split_special_tokens);
  return r;
}

TEST(BosTokenTextTest, ReadsTheVocabulary) {
  Model qwen = Load("qwen2-tiny-synth.gguf");
  ASSERT_NE(qwen.tokenizer, nullptr);
  EXPECT_EQ(qwen.bos_text, "<|endoftext|>");
  EXPECT_EQ(BosTokenText(*qwen.file, kQwenImStart), "<|im_start|>");
  EXPECT_EQ(BosTokenText(*qwen.file, -1), "");
  EXPECT_EQ(BosTokenText(*qwen.file, 151669), "");  // one past the vocabulary
  Model stories = Load("stories260K.gguf");
  ASSERT_NE(stories.tokenizer, nullptr);
  EXPECT_EQ(stories.bos_text, "<s>");
}

TEST(RequestPromptTest, ChatGoldensTokenizeExactly) {
  Model qwen = Load("qwen2-tiny-synth.gguf");
  ASSERT_NE(qwen.tokenizer, nullptr);
  ASSERT_TRUE(qwen.chat_template->status().ok()) << qwen.chat_template->status();
  const nlohmann::json j =
      nlohmann::json::parse(ReadFileOrDie(SharedPath("goldens/qwen2-tiny-synth_chat.json")));
  int checked = 0;
  for (const nlohmann::json& c : j.at("cases")) {
    const std::string name = c.at("name").get<std::string>();
    const std::vector<int32_t> expected = c.at("token_ids").get<std::vector<int32_t>>();
    std::vector<ChatMessage> messages;
    for (const nlohmann::json& m : c.at("messages")) {
      messages.push_back({m.at("role").get<std::string>(), m.at("content").get<std::string>()});
    }
    if (c.at("add_generation_prompt").get<bool>()) {
      // What the router sends: the request path end to end.
      v1::GenerateRequest r;
      for (const ChatMessage& m : messages) {
        v1::ChatMessage* pm = r.add_messages();
        pm->set_role(m.role);
        pm->set_content(m.content);
      }
      absl::StatusOr<std::vector<int32_t>> ids = qwen.Tokenize(r);
      ASSERT_TRUE(ids.ok()) << name << ": " << ids.status();
      EXPECT_EQ(*ids, expected) << name;
    } else {
      // The router always adds the generation prompt; the rest of the rule
      // (special tokens parsed, BOS per the model: none here) is the same.
      absl::StatusOr<std::string> text = qwen.chat_template->Apply(messages, false);
      ASSERT_TRUE(text.ok()) << name << ": " << text.status();
      tokenizer::EncodeOptions options;
      options.add_bos = qwen.tokenizer->add_bos();
      options.parse_special = true;
      EXPECT_EQ(qwen.tokenizer->Encode(*text, options), expected) << name;
    }
    ++checked;
  }
  EXPECT_EQ(checked, 6);
}

TEST(RequestPromptTest, PromptParsesControlTokensUnlessSplit) {
  Model qwen = Load("qwen2-tiny-synth.gguf");
  ASSERT_NE(qwen.tokenizer, nullptr);
  // The golden "single_user" text as a raw prompt: the same ids as chat.
  const std::string text =
      "<|im_start|>user\nWhat is the capital of France?<|im_end|>\n<|im_start|>assistant\n";
  absl::StatusOr<std::vector<int32_t>> parsed = qwen.Tokenize(Prompt(text));
  ASSERT_TRUE(parsed.ok()) << parsed.status();
  EXPECT_EQ(*parsed, (std::vector<int32_t>{151644, 872, 198, 3838, 374, 279, 6722, 315, 9625, 30,
                                           151645, 198, 151644, 77091, 198}));
  absl::StatusOr<std::vector<int32_t>> split = qwen.Tokenize(Prompt(text, true));
  ASSERT_TRUE(split.ok()) << split.status();
  EXPECT_THAT(*split, Not(Contains(kQwenImStart)));
  EXPECT_GT(split->size(), parsed->size());
}

TEST(RequestPromptTest, PromptAndMessagesExactlyOne) {
  Model stories = Load("stories260K.gguf", "chatml");
  ASSERT_NE(stories.tokenizer, nullptr);
  absl::StatusOr<std::vector<int32_t>> neither = stories.Tokenize(v1::GenerateRequest());
  ASSERT_FALSE(neither.ok());
  EXPECT_EQ(neither.status().code(), absl::StatusCode::kInvalidArgument);
  // The pre-chat message stays first: clients and tests match on it.
  EXPECT_THAT(std::string(neither.status().message()),
              ::testing::StartsWith("prompt: must not be empty"));
  EXPECT_THAT(std::string(neither.status().message()), HasSubstr("messages"));

  v1::GenerateRequest both = Chat({{"user", "Hi"}});
  both.set_prompt("Hi");
  absl::StatusOr<std::vector<int32_t>> r = stories.Tokenize(both);
  ASSERT_FALSE(r.ok());
  EXPECT_EQ(r.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(r.status().message(),
            "prompt, prompt_token_ids, messages: set exactly one of them, got prompt messages");

  v1::GenerateRequest split = Chat({{"user", "Hi"}});
  split.set_split_special_tokens(true);
  r = stories.Tokenize(split);
  ASSERT_FALSE(r.ok());
  EXPECT_EQ(r.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(std::string(r.status().message()), HasSubstr("split_special_tokens"));
}

TEST(RequestPromptTest, PromptTokenIdsAreUsedAsGiven) {
  Model stories = Load("stories260K.gguf");
  ASSERT_NE(stories.tokenizer, nullptr);
  v1::GenerateRequest ids;
  for (int32_t id : {1, 403, 407, 261}) ids.add_prompt_token_ids(id);
  absl::StatusOr<std::vector<int32_t>> r = stories.Tokenize(ids);
  ASSERT_TRUE(r.ok()) << r.status();
  EXPECT_EQ(*r, (std::vector<int32_t>{1, 403, 407, 261}));  // no second BOS, nothing merged

  ids.add_prompt_token_ids(512);  // stories260K's vocabulary has 512 ids
  r = stories.Tokenize(ids);
  ASSERT_FALSE(r.ok());
  EXPECT_EQ(r.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(r.status().message(), "prompt_token_ids[4]: 512 is not in [0, 512)");

  v1::GenerateRequest both = Prompt("Hi");
  both.add_prompt_token_ids(1);
  r = stories.Tokenize(both);
  ASSERT_FALSE(r.ok());
  EXPECT_EQ(r.status().message(),
            "prompt, prompt_token_ids, messages: set exactly one of them, got prompt "
            "prompt_token_ids ");
}

TEST(RequestPromptTest, BadRoleAndNoTemplate) {
  Model stories = Load("stories260K.gguf");  // no tokenizer.chat_template
  ASSERT_NE(stories.tokenizer, nullptr);
  absl::StatusOr<std::vector<int32_t>> r = stories.Tokenize(Chat({{"user", "Hi"}}));
  ASSERT_FALSE(r.ok());
  EXPECT_EQ(r.status().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_THAT(std::string(r.status().message()), HasSubstr("no chat template"));
  // A prompt is served as before.
  r = stories.Tokenize(Prompt("Once upon a time"));
  ASSERT_TRUE(r.ok()) << r.status();
  EXPECT_EQ(r->front(), kStoriesBos);

  Model qwen = Load("qwen2-tiny-synth.gguf");
  ASSERT_NE(qwen.tokenizer, nullptr);
  r = qwen.Tokenize(Chat({{"user", "Hi"}, {"tool", "42"}}));
  ASSERT_FALSE(r.ok());
  EXPECT_EQ(r.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(std::string(r.status().message()), HasSubstr("messages[1].role"));
}

TEST(RequestPromptTest, BosIsAddedOnceForChat) {
  // stories260K adds BOS (<s>); mistral-v7-tekken writes an assistant turn's
  // content first, so a conversation can open with "<s>" as text.
  Model stories = Load("stories260K.gguf", "mistral-v7-tekken");
  ASSERT_NE(stories.tokenizer, nullptr);
  ASSERT_TRUE(stories.tokenizer->add_bos());
  absl::StatusOr<std::vector<int32_t>> plain = stories.Tokenize(Chat({{"assistant", "Hi"}}));
  ASSERT_TRUE(plain.ok()) << plain.status();
  absl::StatusOr<std::vector<int32_t>> with_bos =
      stories.Tokenize(Chat({{"assistant", "<s>Hi"}}));
  ASSERT_TRUE(with_bos.ok()) << with_bos.status();
  EXPECT_EQ(plain->front(), kStoriesBos);
  EXPECT_EQ(*with_bos, *plain);  // "<s>" parsed as BOS, and no second one added
  EXPECT_EQ(std::count(with_bos->begin(), with_bos->end(), kStoriesBos), 1);

  // qwen2-tiny-synth does not add BOS: the chat starts at <|im_start|>.
  Model qwen = Load("qwen2-tiny-synth.gguf");
  ASSERT_NE(qwen.tokenizer, nullptr);
  absl::StatusOr<std::vector<int32_t>> q = qwen.Tokenize(Chat({{"user", "Hi"}}));
  ASSERT_TRUE(q.ok()) << q.status();
  EXPECT_EQ(q->front(), kQwenImStart);
  EXPECT_THAT(*q, Not(Contains(kQwenEndOfText)));
}

TEST(RequestPromptTest, ModelThatAddsBosGetsItBeforeTheChat) {
  // llama3-tiny-synth.gguf: add_bos_token true, BOS <|endoftext|>, and the
  // same Qwen3 template.
  Model m = Load("llama3-tiny-synth.gguf");
  ASSERT_NE(m.tokenizer, nullptr);
  ASSERT_TRUE(m.tokenizer->add_bos());
  EXPECT_EQ(m.chat_template->format_name(), "qwen3");
  absl::StatusOr<std::vector<int32_t>> ids = m.Tokenize(Chat({{"user", "Hi"}}));
  ASSERT_TRUE(ids.ok()) << ids.status();
  ASSERT_GE(ids->size(), 2u);
  EXPECT_THAT(std::vector<int32_t>(ids->begin(), ids->begin() + 2),
              ElementsAre(kQwenEndOfText, kQwenImStart));
}

}  // namespace
}  // namespace tandem::router
