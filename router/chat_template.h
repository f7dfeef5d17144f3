// Chat templates: recognising a model's chat template among the formats
// Tandem renders natively, and rendering a conversation into prompt text.
//
// There is no Jinja interpreter. Like llama.cpp's llm_chat_detect_template
// and llm_chat_apply_template (src/llama-chat.cpp), the template text (GGUF
// metadata `tokenizer.chat_template`, a Jinja string from Hugging Face's
// tokenizer_config.json) is matched by marker substrings to a known format,
// and each format is rendered by hand. Formats and what they write
// (`{role}`: system | user | assistant; `add_generation_prompt`: G):
//
//   chatml      <|im_start|>{role}\n{content}<|im_end|>\n ...   G: <|im_start|>assistant\n
//   qwen3       chatml, and Qwen3's reasoning rule for assistant turns
//               (below)                                         G: <|im_start|>assistant\n
//   llama3      <|start_header_id|>{role}<|end_header_id|>\n\n{trim(content)}<|eot_id|> ...
//                                     G: <|start_header_id|>assistant<|end_header_id|>\n\n
//   llama2      [INST] {system}\n{user} [/INST]{assistant}</s>[INST] {user} [/INST]...
//   llama2-sys  as llama2 with the system turn as <<SYS>>\n{system}\n<</SYS>>\n\n
//   llama2-sys-bos    as llama2-sys, later turns open with <s>[INST]
//   llama2-sys-strip  as llama2-sys, every content trimmed
//   mistral-v1  " [INST] {system}\n\n{user} [/INST] {assistant}</s>..."
//   mistral-v3  "[INST] {system}\n\n{user}[/INST] {trim(assistant)}</s>..."
//   mistral-v3-tekken "[INST]{system}\n\n{user}[/INST]{assistant}</s>..."
//   mistral-v7  "[SYSTEM_PROMPT] {system}[/SYSTEM_PROMPT][INST] {user}[/INST] {assistant}</s>"
//   mistral-v7-tekken as mistral-v7 without the spaces after the tags
// trim() strips ASCII whitespace (as llama.cpp's trim). The llama2 and
// mistral templates have no generation prompt (a user turn ends with
// [/INST]), so G changes nothing there. No format writes BOS: the tokenizer
// adds it per the model (tokenizer.ggml.add_bos_token), as llama.cpp does.
//
// qwen3 follows the template in Qwen3's tokenizer_config.json (no tools, no
// `reasoning_content` field, enable_thinking undefined): let q be the index
// of the last user message whose content is not wrapped in
// <tool_response>...</tool_response> (q = n - 1 when there is none). An
// assistant content containing "</think>" splits into reasoning (the text
// before the first </think>, after the last <think> in it, outer newlines
// removed) and answer (the text after the last </think>, leading newlines
// removed). Assistant turns up to q keep only the answer; a later one is
// written "<think>\n{reasoning}\n</think>\n\n{answer}" when it is the last
// message or has reasoning, else as its answer.
//
// Owns: format recognition and rendering. Does not touch: tokenization
// (the caller tokenizes the text with special-token parsing), gRPC.
// Threads: pure functions; a ChatTemplate is immutable and thread-safe.
#ifndef TANDEM_ROUTER_CHAT_TEMPLATE_H_
#define TANDEM_ROUTER_CHAT_TEMPLATE_H_

#include <optional>
#include <string>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "absl/types/span.h"
#include "engine/gguf/gguf_file.h"

namespace tandem::router {

// The formats Tandem renders. Names (ChatFormatName) are llama.cpp's where
// llama.cpp has the format; "qwen3" is Tandem's.
enum class ChatFormat {
  kChatMl,
  kQwen3,
  kLlama3,
  kLlama2,
  kLlama2Sys,
  kLlama2SysBos,
  kLlama2SysStrip,
  kMistralV1,
  kMistralV3,
  kMistralV3Tekken,
  kMistralV7,
  kMistralV7Tekken,
};

// "chatml", "qwen3", "llama3", "llama2", "llama2-sys", "llama2-sys-bos",
// "llama2-sys-strip", "mistral-v1", "mistral-v3", "mistral-v3-tekken",
// "mistral-v7", "mistral-v7-tekken": the values of the cluster config's
// `chat_template` key and of GetModelInfoResponse.chat_format.
absl::string_view ChatFormatName(ChatFormat format);
// Every format, in enum order.
absl::Span<const ChatFormat> AllChatFormats();
// The format named `name` (exact, as ChatFormatName writes it), or nullopt.
std::optional<ChatFormat> ChatFormatFromName(absl::string_view name);

// Recognises a chat template's text; nullopt when it matches no format.
// Rules, in order (llama.cpp's llm_chat_detect_template, restricted to the
// formats above):
//   1. the text is a format name                   -> that format
//   2. contains <|im_start|>: with <|im_sep|> (Phi-4) or <end_of_utterance>
//      (SmolVLM) -> none; with <think>, </think> and last_query_index
//      (Qwen3's reasoning rule) -> qwen3; else chatml
//   3. starts with "mistral" or contains [INST]:
//      [SYSTEM_PROMPT] -> mistral-v7;
//      "' [INST] ' + system_message" or [AVAILABLE_TOOLS] (Mistral's
//      official v1/v3 templates) -> mistral-v1 if " [INST]" occurs, else
//      mistral-v3-tekken if "\"[INST]\"" occurs, else mistral-v3;
//      otherwise llama2: content.strip() -> llama2-sys-strip,
//      "bos_token + '[INST]" -> llama2-sys-bos, <<SYS>> -> llama2-sys,
//      else llama2
//   4. contains <|start_header_id|> and <|end_header_id|> -> llama3
// mistral-v7-tekken is chosen by name only (as in llama.cpp).
std::optional<ChatFormat> DetectChatFormat(absl::string_view template_text);

// One message of a conversation.
struct ChatMessage {
  std::string role;     // system | developer (read as system) | user | assistant
  std::string content;  // written as is (llama3, mistral-v3 and llama2-sys-strip trim it)
};

// Renders `messages` in `format` (layouts in the file comment), appending
// the assistant's generation prompt when `add_generation_prompt`.
// INVALID_ARGUMENT "messages: must not be empty" for no messages, and
// "messages[i].role: ..." naming the index and the role for a role other
// than system, developer, user and assistant.
[[nodiscard]] absl::StatusOr<std::string> RenderChat(ChatFormat format,
                                                     absl::Span<const ChatMessage> messages,
                                                     bool add_generation_prompt);

// A model's chat template as the router resolved it at start-up: a format,
// or the reason there is none.
class ChatTemplate {
 public:
  // The format named `override_name` when it is non-empty (the cluster
  // config's `chat_template`), else DetectChatFormat(*template_text);
  // nullopt template_text = the model has none. INVALID_ARGUMENT
  // "chat_template: unknown format 'x' (known: ...)" for an unknown
  // override. An unrecognised or absent template is not an error here: the
  // result has no format, and status()/Apply() say why.
  [[nodiscard]] static absl::StatusOr<ChatTemplate> Resolve(
      std::optional<absl::string_view> template_text, absl::string_view override_name);
  // Resolve() with the GGUF metadata string `tokenizer.chat_template` of
  // `file` (absent -> none). INVALID_ARGUMENT naming the file and the key
  // when the value is not a string.
  [[nodiscard]] static absl::StatusOr<ChatTemplate> FromGguf(const gguf::GgufFile& file,
                                                             absl::string_view override_name);

  const std::optional<ChatFormat>& format() const { return format_; }
  // ChatFormatName(*format()), or "" without a format.
  absl::string_view format_name() const;
  // OK with a format. Otherwise FAILED_PRECONDITION "messages: ..." naming
  // the unrecognised template (its first 60 bytes, C-escaped) or its
  // absence, and the config key that overrides detection.
  const absl::Status& status() const { return status_; }

  // RenderChat() with this format; status() when there is none.
  [[nodiscard]] absl::StatusOr<std::string> Apply(absl::Span<const ChatMessage> messages,
                                                  bool add_generation_prompt) const;

 private:
  ChatTemplate(std::optional<ChatFormat> format, absl::Status status)
      : format_(format), status_(std::move(status)) {}

  std::optional<ChatFormat> format_;
  absl::Status status_;
};

}  // namespace tandem::router

#endif  // TANDEM_ROUTER_CHAT_TEMPLATE_H_
