// Tests for router/chat_template: rendering against the Qwen3 goldens in
// ../shared/goldens/qwen2-tiny-synth_chat.json, format detection and
// rendering against llama.cpp's tests/test-chat-template.cpp (its real
// templates and the outputs it expects from llm_chat_apply_template), the
// Qwen3 reasoning rule against Python jinja2 renderings of the template in
// qwen2-tiny-synth.gguf, roles, and template resolution.
#include "router/chat_template.h"

#include <fstream>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "common/cluster_config.h"
#include "engine/gguf/gguf_file.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "tests/test_util.h"

namespace tandem::router {
namespace {

using ::testing::HasSubstr;
using ::testing::StartsWith;
using tandem::testing::ReadFileOrDie;
using tandem::testing::SharedPath;

std::string Render(ChatFormat format, const std::vector<ChatMessage>& messages,
                   bool add_generation_prompt = true) {
  absl::StatusOr<std::string> text = RenderChat(format, messages, add_generation_prompt);
  EXPECT_TRUE(text.ok()) << text.status();
  return text.value_or("");
}

// --- Goldens: Qwen3's template (qwen2-tiny-synth.gguf) ----------------------

struct GoldenCase {
  std::string name;
  std::vector<ChatMessage> messages;
  bool add_generation_prompt = true;
  std::string rendered;
  std::vector<int32_t> token_ids;
};

std::vector<GoldenCase> LoadGoldens() {
  const nlohmann::json j =
      nlohmann::json::parse(ReadFileOrDie(SharedPath("goldens/qwen2-tiny-synth_chat.json")));
  std::vector<GoldenCase> cases;
  for (const nlohmann::json& c : j.at("cases")) {
    GoldenCase g;
    g.name = c.at("name").get<std::string>();
    for (const nlohmann::json& m : c.at("messages")) {
      g.messages.push_back({m.at("role").get<std::string>(), m.at("content").get<std::string>()});
    }
    g.add_generation_prompt = c.at("add_generation_prompt").get<bool>();
    g.rendered = c.at("rendered").get<std::string>();
    g.token_ids = c.at("token_ids").get<std::vector<int32_t>>();
    cases.push_back(std::move(g));
  }
  return cases;
}

TEST(ChatTemplateGoldenTest, QwenModelTemplateIsRecognisedAsQwen3) {
  absl::StatusOr<std::unique_ptr<gguf::GgufFile>> file =
      gguf::GgufFile::Open(SharedPath("models/qwen2-tiny-synth.gguf"));
  ASSERT_TRUE(file.ok()) << file.status();
  absl::StatusOr<ChatTemplate> t = ChatTemplate::FromGguf(**file, "");
  ASSERT_TRUE(t.ok()) << t.status();
  EXPECT_TRUE(t->status().ok()) << t->status();
  EXPECT_EQ(t->format(), ChatFormat::kQwen3);
  EXPECT_EQ(t->format_name(), "qwen3");
}

TEST(ChatTemplateGoldenTest, RendersEveryGoldenCaseExactly) {
  absl::StatusOr<std::unique_ptr<gguf::GgufFile>> file =
      gguf::GgufFile::Open(SharedPath("models/qwen2-tiny-synth.gguf"));
  ASSERT_TRUE(file.ok()) << file.status();
  absl::StatusOr<ChatTemplate> t = ChatTemplate::FromGguf(**file, "");
  ASSERT_TRUE(t.ok()) << t.status();
  const std::vector<GoldenCase> cases = LoadGoldens();
  ASSERT_EQ(cases.size(), 6u);
  for (const GoldenCase& c : cases) {
    absl::StatusOr<std::string> text = t->Apply(c.messages, c.add_generation_prompt);
    ASSERT_TRUE(text.ok()) << c.name << ": " << text.status();
    EXPECT_EQ(*text, c.rendered) << c.name;
  }
}

// --- Qwen3's reasoning rule --------------------------------------------------
// Expected texts: Python jinja2 3.1.6 (trim_blocks, lstrip_blocks) rendering
// of qwen2-tiny-synth.gguf's tokenizer.chat_template, as the goldens were made.

TEST(Qwen3Test, EarlierAssistantReasoningIsDropped) {
  EXPECT_EQ(Render(ChatFormat::kQwen3, {{"user", "Q1"},
                                        {"assistant", "<think>\nreasoning A\n</think>\n\nAnswer A"},
                                        {"user", "Q2"}}),
            "<|im_start|>user\nQ1<|im_end|>\n<|im_start|>assistant\nAnswer A<|im_end|>\n"
            "<|im_start|>user\nQ2<|im_end|>\n<|im_start|>assistant\n");
}

TEST(Qwen3Test, LastAssistantKeepsItsReasoning) {
  EXPECT_EQ(Render(ChatFormat::kQwen3,
                   {{"user", "Q1"}, {"assistant", "<think>\nr\n</think>\n\nA"}}, false),
            "<|im_start|>user\nQ1<|im_end|>\n<|im_start|>assistant\n<think>\nr\n</think>\n\n"
            "A<|im_end|>\n");
}

TEST(Qwen3Test, LastAssistantWithoutReasoningGetsAnEmptyThinkBlock) {
  EXPECT_EQ(Render(ChatFormat::kQwen3, {{"user", "Q1"}, {"assistant", "plain"}}, false),
            "<|im_start|>user\nQ1<|im_end|>\n<|im_start|>assistant\n<think>\n\n</think>\n\n"
            "plain<|im_end|>\n");
}

TEST(Qwen3Test, ToolResponseUserTurnIsNotAQuery) {
  EXPECT_EQ(Render(ChatFormat::kQwen3, {{"user", "Q1"},
                                        {"assistant", "<think>r1</think>a1"},
                                        {"user", "<tool_response>t</tool_response>"},
                                        {"assistant", "no reasoning"},
                                        {"user", "<tool_response>u</tool_response>"}}),
            "<|im_start|>user\nQ1<|im_end|>\n<|im_start|>assistant\n<think>\nr1\n</think>\n\n"
            "a1<|im_end|>\n<|im_start|>user\n<tool_response>t</tool_response><|im_end|>\n"
            "<|im_start|>assistant\nno reasoning<|im_end|>\n<|im_start|>user\n"
            "<tool_response>u</tool_response><|im_end|>\n<|im_start|>assistant\n");
}

TEST(Qwen3Test, NestedAndRepeatedThinkTagsSplitAsPythonDoes) {
  const std::string content = "x<think>a<think>\n\nb\n\n</think>mid</think>\n\n\nend";
  EXPECT_EQ(Render(ChatFormat::kQwen3, {{"system", "S"},
                                        {"user", "Q"},
                                        {"assistant", content},
                                        {"user", "Q2"},
                                        {"assistant", content}},
                   false),
            "<|im_start|>system\nS<|im_end|>\n<|im_start|>user\nQ<|im_end|>\n"
            "<|im_start|>assistant\nend<|im_end|>\n<|im_start|>user\nQ2<|im_end|>\n"
            "<|im_start|>assistant\n<think>\nb\n</think>\n\nend<|im_end|>\n");
}

TEST(Qwen3Test, SystemTurnAfterTheFirst) {
  EXPECT_EQ(Render(ChatFormat::kQwen3, {{"user", "Q"}, {"system", "S2"}}),
            "<|im_start|>user\nQ<|im_end|>\n<|im_start|>system\nS2<|im_end|>\n"
            "<|im_start|>assistant\n");
}

// --- llama.cpp's templates and expected outputs ------------------------------
// tests/test-chat-template.cpp: every case renders this conversation and
// compares with the output of llm_chat_apply_template (add_ass = true).

const std::vector<ChatMessage>& LlamaCppConversation() {
  static const std::vector<ChatMessage> conversation = {
      {"system", "You are a helpful assistant"},
      {"user", "Hello"},
      {"assistant", "Hi there"},
      {"user", "Who are you"},
      {"assistant", "   I am an assistant   "},
      {"user", "Another question"},
  };
  return conversation;
}

struct LlamaCppCase {
  const char* name;
  const char* template_text;
  ChatFormat format;
  const char* expected;
};

// teknium/OpenHermes-2.5-Mistral-7B
constexpr char kOpenHermes[] =
    R"({% for message in messages %}{{'<|im_start|>' + message['role'] + '\n' + message['content'] + '<|im_end|>' + '\n'}}{% endfor %}{% if add_generation_prompt %}{{ '<|im_start|>assistant\n' }}{% endif %})";

// mistralai/Mistral-7B-Instruct-v0.2 (old, before Mistral's v1 template).
constexpr char kMistral7BV02[] =
    R"({{ bos_token }}{% for message in messages %}{% if (message['role'] == 'user') != (loop.index0 % 2 == 0) %}{{ raise_exception('Conversation roles must alternate user/assistant/user/assistant/...') }}{% endif %}{% if message['role'] == 'user' %}{{ '[INST] ' + message['content'] + ' [/INST]' }}{% elif message['role'] == 'assistant' %}{{ message['content'] + eos_token}}{% else %}{{ raise_exception('Only user and assistant roles are supported!') }}{% endif %}{% endfor %})";

// TheBloke/FusionNet_34Bx2_MoE-AWQ
constexpr char kFusionNet[] =
    "{%- for idx in range(0, messages|length) -%}\n"
    "{%- if messages[idx]['role'] == 'user' -%}\n"
    "{%- if idx > 1 -%}\n"
    "{{- bos_token + '[INST] ' + messages[idx]['content'] + ' [/INST]' -}}\n"
    "{%- else -%}\n"
    "{{- messages[idx]['content'] + ' [/INST]' -}}\n"
    "{%- endif -%}\n"
    "{% elif messages[idx]['role'] == 'system' %}\n"
    "{{- '[INST] <<SYS>>\\n' + messages[idx]['content'] + '\\n<</SYS>>\\n\\n' -}}\n"
    "{%- elif messages[idx]['role'] == 'assistant' -%}\n"
    "{{- ' '  + messages[idx]['content'] + ' ' + eos_token -}}\n"
    "{% endif %}\n"
    "{% endfor %}";

// bofenghuang/vigogne-2-70b-chat
constexpr char kVigogne[] =
    R"({{ bos_token }}{% if messages[0]['role'] == 'system' %}{% set loop_messages = messages[1:] %}{% set system_message = messages[0]['content'] %}{% elif true == true and not '<<SYS>>' in messages[0]['content'] %}{% set loop_messages = messages %}{% set system_message = 'Vous êtes Vigogne, un assistant IA créé par Zaion Lab. Vous suivez extrêmement bien les instructions. Aidez autant que vous le pouvez.' %}{% else %}{% set loop_messages = messages %}{% set system_message = false %}{% endif %}{% for message in loop_messages %}{% if (message['role'] == 'user') != (loop.index0 % 2 == 0) %}{{ raise_exception('Conversation roles must alternate user/assistant/user/assistant/...') }}{% endif %}{% if loop.index0 == 0 and system_message != false %}{% set content = '<<SYS>>\n' + system_message + '\n<</SYS>>\n\n' + message['content'] %}{% else %}{% set content = message['content'] %}{% endif %}{% if message['role'] == 'user' %}{{ '[INST] ' + content.strip() + ' [/INST]' }}{% elif message['role'] == 'system' %}{{ '<<SYS>>\n' + content.strip() + '\n<</SYS>>\n\n' }}{% elif message['role'] == 'assistant' %}{{ ' '  + content.strip() + ' ' + eos_token }}{% endif %}{% endfor %})";

// Llama-3
constexpr char kLlama3[] =
    "{% set loop_messages = messages %}{% for message in loop_messages %}{% set content = "
    "'<|start_header_id|>' + message['role'] + '<|end_header_id|>\n\n'+ message['content'] | trim "
    "+ '<|eot_id|>' %}{% if loop.index0 == 0 %}{% set content = bos_token + content %}{% endif "
    "%}{{ content }}{% endfor %}{{ '<|start_header_id|>assistant<|end_header_id|>\n\n' }}";

// mistralai/Mistral-7B-Instruct-v0.2 (Mistral's 'v1' template with a system prompt)
constexpr char kMistralV1[] = R"({%- if messages[0]['role'] == 'system' %}
    {%- set system_message = messages[0]['content'] %}
    {%- set loop_messages = messages[1:] %}
{%- else %}
    {%- set loop_messages = messages %}
{%- endif %}

{{- bos_token }}
{%- for message in loop_messages %}
    {%- if (message['role'] == 'user') != (loop.index0 % 2 == 0) %}
        {{- raise_exception('After the optional system message, conversation roles must alternate user/assistant/user/assistant/...') }}
    {%- endif %}
    {%- if message['role'] == 'user' %}
        {%- if loop.first and system_message is defined %}
            {{- ' [INST] ' + system_message + '\n\n' + message['content'] + ' [/INST]' }}
        {%- else %}
            {{- ' [INST] ' + message['content'] + ' [/INST]' }}
        {%- endif %}
    {%- elif message['role'] == 'assistant' %}
        {{- ' ' + message['content'] + eos_token}}
    {%- else %}
        {{- raise_exception('Only user and assistant roles are supported, with the exception of an initial optional system message!') }}
    {%- endif %}
{%- endfor %}
)";

// Mistral-Large-Instruct-2407 (Mistral's 'v3' template; system prompt moved
// to the start, as in llama.cpp's test).
constexpr char kMistralV3[] = R"({%- if messages[0]["role"] == "system" %}
    {%- set system_message = messages[0]["content"] %}
    {%- set loop_messages = messages[1:] %}
{%- else %}
    {%- set loop_messages = messages %}
{%- endif %}
{%- if not tools is defined %}
    {%- set tools = none %}
{%- endif %}
{%- set user_messages = loop_messages | selectattr("role", "equalto", "user") | list %}

{#- This block checks for alternating user/assistant messages, skipping tool calling messages #}
{%- set ns = namespace() %}
{%- set ns.index = 0 %}
{%- for message in loop_messages %}
    {%- if not (message.role == "tool" or message.role == "tool_results" or (message.tool_calls is defined and message.tool_calls is not none)) %}
        {%- if (message["role"] == "user") != (ns.index % 2 == 0) %}
            {{- raise_exception("After the optional system message, conversation roles must alternate user/assistant/user/assistant/...") }}
        {%- endif %}
        {%- set ns.index = ns.index + 1 %}
    {%- endif %}
{%- endfor %}

{{- bos_token }}
{%- for message in loop_messages %}
    {%- if message["role"] == "user" %}
        {%- if tools is not none and (message == user_messages[-1]) %}
            {{- "[AVAILABLE_TOOLS] [" }}
            {%- for tool in tools %}
                {%- set tool = tool.function %}
                {{- '{"type": "function", "function": {' }}
                {%- for key, val in tool.items() if key != "return" %}
                    {%- if val is string %}
                        {{- '"' + key + '": "' + val + '"' }}
                    {%- else %}
                        {{- '"' + key + '": ' + val|tojson }}
                    {%- endif %}
                    {%- if not loop.last %}
                        {{- ", " }}
                    {%- endif %}
                {%- endfor %}
                {{- "}}" }}
                {%- if not loop.last %}
                    {{- ", " }}
                {%- else %}
                    {{- "]" }}
                {%- endif %}
            {%- endfor %}
            {{- "[/AVAILABLE_TOOLS]" }}
            {%- endif %}
        {%- if loop.last and system_message is defined %}
            {{- "[INST] " + system_message + "\n\n" + message["content"] + "[/INST]" }}
        {%- else %}
            {{- "[INST] " + message["content"] + "[/INST]" }}
        {%- endif %}
    {%- elif message.tool_calls is defined and message.tool_calls is not none %}
        {{- "[TOOL_CALLS] [" }}
        {%- for tool_call in message.tool_calls %}
            {%- set out = tool_call.function|tojson %}
            {{- out[:-1] }}
            {%- if not tool_call.id is defined or tool_call.id|length != 9 %}
                {{- raise_exception("Tool call IDs should be alphanumeric strings with length 9!") }}
            {%- endif %}
            {{- ', "id": "' + tool_call.id + '"}' }}
            {%- if not loop.last %}
                {{- ", " }}
            {%- else %}
                {{- "]" + eos_token }}
            {%- endif %}
        {%- endfor %}
    {%- elif message["role"] == "assistant" %}
        {{- " " + message["content"]|trim + eos_token}}
    {%- elif message["role"] == "tool_results" or message["role"] == "tool" %}
        {%- if message.content is defined and message.content.content is defined %}
            {%- set content = message.content.content %}
        {%- else %}
            {%- set content = message.content %}
        {%- endif %}
        {{- '[TOOL_RESULTS] {"content": ' + content|string + ", " }}
        {%- if not message.tool_call_id is defined or message.tool_call_id|length != 9 %}
            {{- raise_exception("Tool call IDs should be alphanumeric strings with length 9!") }}
        {%- endif %}
        {{- '"call_id": "' + message.tool_call_id + '"}[/TOOL_RESULTS]' }}
    {%- else %}
        {{- raise_exception("Only user and assistant roles are supported, with the exception of an initial optional system message!") }}
    {%- endif %}
{%- endfor %}
)";

// Mistral-Nemo-Instruct-2407 (Mistral's 'v3-tekken' template): the parts
// that differ from v3 ("[INST]" without spaces, no trim of the answer).
constexpr char kMistralV3Tekken[] = R"({{- bos_token }}
{%- for message in loop_messages %}
    {%- if message["role"] == "user" %}
        {%- if tools is not none and (message == user_messages[-1]) %}
            {{- "[AVAILABLE_TOOLS][" }}
            {{- "[/AVAILABLE_TOOLS]" }}
            {%- endif %}
        {%- if loop.last and system_message is defined %}
            {{- "[INST]" + system_message + "\n\n" + message["content"] + "[/INST]" }}
        {%- else %}
            {{- "[INST]" + message["content"] + "[/INST]" }}
        {%- endif %}
    {%- elif message["role"] == "assistant" %}
        {{- message["content"] + eos_token}}
    {%- endif %}
{%- endfor %}
)";

// mistralai/Mistral-Large-Instruct-2411 (Mistral's 'v7' template)
constexpr char kMistralV7[] =
    R"({{ bos_token }}{% for message in messages %}{% if message['role'] == 'user' %}{{ '[INST] ' + message['content'] + '[/INST]' }}{% elif message['role'] == 'system' %}{{ '[SYSTEM_PROMPT] ' + message['content'] + '[/SYSTEM_PROMPT]' }}{% elif message['role'] == 'assistant' %}{{ ' ' + message['content'] + eos_token }}{% else %}{{ raise_exception('Only user, system and assistant roles are supported!') }}{% endif %}{% endfor %})";

const std::vector<LlamaCppCase>& LlamaCppCases() {
  static const std::vector<LlamaCppCase> cases = {
      {"OpenHermes-2.5-Mistral-7B", kOpenHermes, ChatFormat::kChatMl,
       "<|im_start|>system\nYou are a helpful assistant<|im_end|>\n<|im_start|>user\nHello<|im_end|>"
       "\n<|im_start|>assistant\nHi there<|im_end|>\n<|im_start|>user\nWho are you<|im_end|>\n"
       "<|im_start|>assistant\n   I am an assistant   <|im_end|>\n<|im_start|>user\nAnother "
       "question<|im_end|>\n<|im_start|>assistant\n"},
      {"Mistral-7B-Instruct-v0.2", kMistral7BV02, ChatFormat::kLlama2,
       "[INST] You are a helpful assistant\nHello [/INST]Hi there</s>[INST] Who are you [/INST]   "
       "I am an assistant   </s>[INST] Another question [/INST]"},
      {"FusionNet_34Bx2_MoE", kFusionNet, ChatFormat::kLlama2SysBos,
       "[INST] <<SYS>>\nYou are a helpful assistant\n<</SYS>>\n\nHello [/INST]Hi there</s><s>[INST] "
       "Who are you [/INST]   I am an assistant   </s><s>[INST] Another question [/INST]"},
      {"vigogne-2-70b-chat", kVigogne, ChatFormat::kLlama2SysStrip,
       "[INST] <<SYS>>\nYou are a helpful assistant\n<</SYS>>\n\nHello [/INST]Hi there</s>[INST] "
       "Who are you [/INST]I am an assistant</s>[INST] Another question [/INST]"},
      {"Llama-3", kLlama3, ChatFormat::kLlama3,
       "<|start_header_id|>system<|end_header_id|>\n\nYou are a helpful assistant<|eot_id|>"
       "<|start_header_id|>user<|end_header_id|>\n\nHello<|eot_id|><|start_header_id|>assistant"
       "<|end_header_id|>\n\nHi there<|eot_id|><|start_header_id|>user<|end_header_id|>\n\nWho are "
       "you<|eot_id|><|start_header_id|>assistant<|end_header_id|>\n\nI am an assistant<|eot_id|>"
       "<|start_header_id|>user<|end_header_id|>\n\nAnother question<|eot_id|><|start_header_id|>"
       "assistant<|end_header_id|>\n\n"},
      {"Mistral v1", kMistralV1, ChatFormat::kMistralV1,
       " [INST] You are a helpful assistant\n\nHello [/INST] Hi there</s> [INST] Who are you "
       "[/INST]    I am an assistant   </s> [INST] Another question [/INST]"},
      {"Mistral v3", kMistralV3, ChatFormat::kMistralV3,
       "[INST] You are a helpful assistant\n\nHello[/INST] Hi there</s>[INST] Who are you[/INST] I "
       "am an assistant</s>[INST] Another question[/INST]"},
      {"Mistral v3-tekken", kMistralV3Tekken, ChatFormat::kMistralV3Tekken,
       "[INST]You are a helpful assistant\n\nHello[/INST]Hi there</s>[INST]Who are you[/INST]   I "
       "am an assistant   </s>[INST]Another question[/INST]"},
      {"Mistral v7", kMistralV7, ChatFormat::kMistralV7,
       "[SYSTEM_PROMPT] You are a helpful assistant[/SYSTEM_PROMPT][INST] Hello[/INST] Hi "
       "there</s>[INST] Who are you[/INST]    I am an assistant   </s>[INST] Another "
       "question[/INST]"},
  };
  return cases;
}

TEST(LlamaCppTemplatesTest, DetectsEachFormat) {
  for (const LlamaCppCase& c : LlamaCppCases()) {
    EXPECT_EQ(DetectChatFormat(c.template_text), c.format) << c.name;
  }
}

TEST(LlamaCppTemplatesTest, RendersLlamaCppsExpectedOutput) {
  for (const LlamaCppCase& c : LlamaCppCases()) {
    EXPECT_EQ(Render(c.format, LlamaCppConversation()), c.expected) << c.name;
  }
}

// llama2-sys and mistral-v7-tekken have no case in llama.cpp's test; these
// expectations follow llm_chat_apply_template's code for those variants.
TEST(LlamaCppTemplatesTest, VariantsWithoutALlamaCppCase) {
  EXPECT_EQ(DetectChatFormat("{% if m['role'] == 'system' %}{{ '<<SYS>>\\n' + m['content'] + "
                             "'\\n<</SYS>>\\n\\n' }}{% else %}{{ '[INST] ' + m['content'] + ' "
                             "[/INST]' }}{% endif %}"),
            ChatFormat::kLlama2Sys);
  EXPECT_EQ(Render(ChatFormat::kLlama2Sys, LlamaCppConversation()),
            "[INST] <<SYS>>\nYou are a helpful assistant\n<</SYS>>\n\nHello [/INST]Hi "
            "there</s>[INST] Who are you [/INST]   I am an assistant   </s>[INST] Another "
            "question [/INST]");
  EXPECT_EQ(Render(ChatFormat::kMistralV7Tekken, LlamaCppConversation()),
            "[SYSTEM_PROMPT]You are a helpful assistant[/SYSTEM_PROMPT][INST]Hello[/INST]Hi "
            "there</s>[INST]Who are you[/INST]   I am an assistant   </s>[INST]Another "
            "question[/INST]");
}

TEST(DetectChatFormatTest, NamesAndNonChatMlUsersOfImStart) {
  for (ChatFormat f : AllChatFormats()) {
    EXPECT_EQ(DetectChatFormat(ChatFormatName(f)), f) << ChatFormatName(f);
  }
  // phi-4 and SmolVLM write <|im_start|> but are not ChatML (llama.cpp).
  EXPECT_EQ(DetectChatFormat("{{'<|im_start|>system<|im_sep|>' + message['content']}}"),
            std::nullopt);
  EXPECT_EQ(DetectChatFormat("<|im_start|>{{ 'User: ' + c + '<end_of_utterance>' }}"),
            std::nullopt);
  // Gemma's template is none of Tandem's formats.
  EXPECT_EQ(DetectChatFormat("{{ '<start_of_turn>' + role + '\\n' }}"), std::nullopt);
  EXPECT_EQ(DetectChatFormat(""), std::nullopt);
  // A ChatML template with <think> handling but not Qwen3's rule stays chatml.
  EXPECT_EQ(DetectChatFormat("{{'<|im_start|>' + m.content.split('</think>')[-1] + '<think>'}}"),
            ChatFormat::kChatMl);
}

TEST(ChatFormatNameTest, MatchesTheConfigList) {
  // common/cluster_config.h validates chat_template against its own list.
  ASSERT_EQ(AllChatFormats().size(), kChatTemplateNames.size());
  for (size_t i = 0; i < kChatTemplateNames.size(); ++i) {
    EXPECT_EQ(ChatFormatName(AllChatFormats()[i]), kChatTemplateNames[i]);
    EXPECT_EQ(ChatFormatFromName(kChatTemplateNames[i]), AllChatFormats()[i]);
  }
  EXPECT_EQ(ChatFormatFromName("ChatML"), std::nullopt);  // exact names only
}

// --- Roles -------------------------------------------------------------------

TEST(RenderChatTest, DeveloperIsReadAsSystem) {
  for (ChatFormat f : AllChatFormats()) {
    EXPECT_EQ(Render(f, {{"developer", "Be brief."}, {"user", "Hi"}}),
              Render(f, {{"system", "Be brief."}, {"user", "Hi"}}))
        << ChatFormatName(f);
  }
  EXPECT_EQ(Render(ChatFormat::kChatMl, {{"developer", "D"}}, false),
            "<|im_start|>system\nD<|im_end|>\n");
}

TEST(RenderChatTest, UnknownRoleNamesTheMessage) {
  absl::StatusOr<std::string> r =
      RenderChat(ChatFormat::kChatMl, {{"user", "a"}, {"assistant", "b"}, {"tool", "c"}}, true);
  ASSERT_FALSE(r.ok());
  EXPECT_EQ(r.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(r.status().message(),
            "messages[2].role: must be system, developer, user or assistant, got 'tool'");
  // Roles are case-sensitive, as in the templates.
  r = RenderChat(ChatFormat::kLlama3, {{"User", "a"}}, true);
  ASSERT_FALSE(r.ok());
  EXPECT_THAT(std::string(r.status().message()), HasSubstr("messages[0].role"));
  r = RenderChat(ChatFormat::kLlama3, {{"", "a"}}, true);
  ASSERT_FALSE(r.ok());
  EXPECT_THAT(std::string(r.status().message()), HasSubstr("got ''"));
}

TEST(RenderChatTest, NoMessages) {
  absl::StatusOr<std::string> r = RenderChat(ChatFormat::kChatMl, {}, true);
  ASSERT_FALSE(r.ok());
  EXPECT_EQ(r.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(std::string(r.status().message()), HasSubstr("messages"));
}

TEST(RenderChatTest, GenerationPromptFlag) {
  EXPECT_EQ(Render(ChatFormat::kLlama3, {{"user", " Hi "}}, false),
            "<|start_header_id|>user<|end_header_id|>\n\nHi<|eot_id|>");
  // [INST] formats have no generation prompt: the flag changes nothing.
  EXPECT_EQ(Render(ChatFormat::kMistralV7, {{"user", "Hi"}}, false),
            Render(ChatFormat::kMistralV7, {{"user", "Hi"}}, true));
  EXPECT_EQ(Render(ChatFormat::kLlama2, {{"user", "Hi"}}, false), "[INST] Hi [/INST]");
}

// --- Resolution --------------------------------------------------------------

TEST(ChatTemplateTest, UnknownTemplateIsFailedPreconditionNamingIt) {
  const std::string gemma =
      "{% if messages[0]['role'] == 'system' %}{{ raise_exception('System role not supported') "
      "}}{% endif %}{% for message in messages %}<start_of_turn>";
  absl::StatusOr<ChatTemplate> t = ChatTemplate::Resolve(gemma, "");
  ASSERT_TRUE(t.ok()) << t.status();  // not an error at start-up
  EXPECT_EQ(t->format(), std::nullopt);
  EXPECT_EQ(t->format_name(), "");
  EXPECT_EQ(t->status().code(), absl::StatusCode::kFailedPrecondition);
  // The first 60 bytes, C-escaped, and the config key that overrides it.
  EXPECT_THAT(std::string(t->status().message()),
              HasSubstr(R"('{% if messages[0][\'role\'] == \'system\' %}{{ )"
                        R"(raise_exception(\'...')"));
  EXPECT_THAT(std::string(t->status().message()), HasSubstr("chat_template"));
  absl::StatusOr<std::string> r = t->Apply({{"user", "Hi"}}, true);
  ASSERT_FALSE(r.ok());
  EXPECT_EQ(r.status(), t->status());
}

TEST(ChatTemplateTest, NoTemplate) {
  absl::StatusOr<ChatTemplate> t = ChatTemplate::Resolve(std::nullopt, "");
  ASSERT_TRUE(t.ok());
  EXPECT_EQ(t->status().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_THAT(std::string(t->status().message()), HasSubstr("no chat template"));
  // stories260K.gguf has no tokenizer.chat_template.
  absl::StatusOr<std::unique_ptr<gguf::GgufFile>> file =
      gguf::GgufFile::Open(SharedPath("models/stories260K.gguf"));
  ASSERT_TRUE(file.ok()) << file.status();
  absl::StatusOr<ChatTemplate> stories = ChatTemplate::FromGguf(**file, "");
  ASSERT_TRUE(stories.ok()) << stories.status();
  EXPECT_EQ(stories->status().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_EQ(stories->Apply({{"user", "Hi"}}, true).status().code(),
            absl::StatusCode::kFailedPrecondition);
}

TEST(ChatTemplateTest, ConfigOverrideWinsOverDetection) {
  absl::StatusOr<ChatTemplate> t = ChatTemplate::Resolve(kOpenHermes, "llama3");
  ASSERT_TRUE(t.ok()) << t.status();
  EXPECT_EQ(t->format(), ChatFormat::kLlama3);
  EXPECT_TRUE(t->status().ok());
  // And gives a model without a template a format.
  absl::StatusOr<ChatTemplate> none = ChatTemplate::Resolve(std::nullopt, "chatml");
  ASSERT_TRUE(none.ok()) << none.status();
  EXPECT_EQ(none->format_name(), "chatml");
  EXPECT_EQ(none->Apply({{"user", "Hi"}}, true).value_or(""),
            "<|im_start|>user\nHi<|im_end|>\n<|im_start|>assistant\n");
  absl::StatusOr<ChatTemplate> bad = ChatTemplate::Resolve(kOpenHermes, "chatml3");
  ASSERT_FALSE(bad.ok());
  EXPECT_EQ(bad.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(std::string(bad.status().message()),
              StartsWith("chat_template: unknown format 'chatml3'"));
}

}  // namespace
}  // namespace tandem::router
