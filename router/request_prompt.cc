#include "router/request_prompt.h"

#include <variant>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"

namespace tandem::router {

std::string BosTokenText(const gguf::GgufFile& file, int32_t bos_id) {
  const gguf::MetadataValue* tokens = file.Find("tokenizer.ggml.tokens");
  const auto* list = tokens == nullptr ? nullptr : std::get_if<std::vector<std::string>>(tokens);
  if (list == nullptr || bos_id < 0 || static_cast<size_t>(bos_id) >= list->size()) return "";
  return (*list)[bos_id];
}

absl::StatusOr<std::vector<int32_t>> TokenizeRequestPrompt(const v1::GenerateRequest& request,
                                                           const tokenizer::Tokenizer& tokenizer,
                                                           const ChatTemplate& chat_template,
                                                           absl::string_view bos_text) {
  const bool chat = request.messages_size() > 0;
  const bool ids = request.prompt_token_ids_size() > 0;
  const bool has_text = !request.prompt().empty();
  if (int(chat) + int(ids) + int(has_text) > 1) {
    return absl::InvalidArgumentError(absl::StrCat(
        "prompt, prompt_token_ids, messages: set exactly one of them, got ",
        has_text ? "prompt " : "", ids ? "prompt_token_ids " : "", chat ? "messages" : ""));
  }
  if (!chat && !ids && !has_text) {
    return absl::InvalidArgumentError(
        "prompt: must not be empty (set exactly one of prompt, prompt_token_ids and messages)");
  }
  if (ids) {
    if (request.split_special_tokens()) {
      return absl::InvalidArgumentError(
          "split_special_tokens: applies to prompt text only, not to prompt_token_ids");
    }
    for (int i = 0; i < request.prompt_token_ids_size(); ++i) {
      const int32_t id = request.prompt_token_ids(i);
      if (id < 0 || id >= tokenizer.vocab_size()) {
        return absl::InvalidArgumentError(absl::StrCat(
            "prompt_token_ids[", i, "]: ", id, " is not in [0, ", tokenizer.vocab_size(), ")"));
      }
    }
    return std::vector<int32_t>(request.prompt_token_ids().begin(),
                                request.prompt_token_ids().end());
  }
  tokenizer::EncodeOptions options;
  if (!chat) {
    options.add_bos = tokenizer.add_bos();
    options.parse_special = !request.split_special_tokens();
    return tokenizer.Encode(request.prompt(), options);
  }
  if (request.split_special_tokens()) {
    // Splitting the template's own control tokens would give the model a
    // conversation it was never trained on.
    return absl::InvalidArgumentError(
        "split_special_tokens: applies to prompt only, not to messages");
  }
  std::vector<ChatMessage> messages;
  messages.reserve(request.messages_size());
  for (const v1::ChatMessage& m : request.messages()) messages.push_back({m.role(), m.content()});
  absl::StatusOr<std::string> text = chat_template.Apply(messages, /*add_generation_prompt=*/true);
  if (!text.ok()) return text.status();
  options.add_bos =
      tokenizer.add_bos() && !(!bos_text.empty() && absl::StartsWith(*text, bos_text));
  options.parse_special = true;
  return tokenizer.Encode(*text, options);
}

}  // namespace tandem::router
