// A GenerateRequest's prompt token ids: its `prompt` text, or its
// `messages` rendered with the model's chat template, tokenized the way
// llama.cpp's server and vLLM do. No gRPC: RouterService::Validate calls it
// and tests/router checks it against the chat goldens without a model.
//
// Owns: the tokenization rules of a request (BOS, special-token parsing).
// Does not touch: the other request fields (max_tokens, sampling, route).
// Threads: pure functions.
#ifndef TANDEM_ROUTER_REQUEST_PROMPT_H_
#define TANDEM_ROUTER_REQUEST_PROMPT_H_

#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "engine/gguf/gguf_file.h"
#include "engine/tokenizer/tokenizer.h"
#include "router/chat_template.h"
#include "tandem/v1/generation.pb.h"

namespace tandem::router {

// The vocabulary text of token `bos_id` (tokenizer.ggml.tokens[bos_id] in
// `file`, e.g. "<s>", "<|begin_of_text|>"; Tokenizer::TokenBytes gives ""
// for control tokens). "" when bos_id < 0 or the file has no such entry.
std::string BosTokenText(const gguf::GgufFile& file, int32_t bos_id);

// Prompt ids of `request`:
//   prompt:   Encode(prompt, {add_bos = tokenizer.add_bos(),
//                             parse_special = !split_special_tokens})
//   messages: text = chat_template.Apply(messages, add_generation_prompt =
//             true); Encode(text, {add_bos = tokenizer.add_bos() and text
//             does not start with `bos_text` (no double BOS; "" never
//             matches), parse_special = true})
//   prompt_token_ids: the ids as given (each in [0, vocab_size))
// Errors: INVALID_ARGUMENT "prompt: must not be empty (...)" when none
// is set, "prompt, prompt_token_ids, messages: ..." when several are,
// "prompt_token_ids[i]: ..." for an id outside the vocabulary, "split_special_tokens:
// ..." with messages (the template's own control tokens must be parsed),
// and ChatTemplate::Apply's errors (INVALID_ARGUMENT naming
// messages[i].role; FAILED_PRECONDITION when the model has no chat format).
[[nodiscard]] absl::StatusOr<std::vector<int32_t>> TokenizeRequestPrompt(
    const v1::GenerateRequest& request, const tokenizer::Tokenizer& tokenizer,
    const ChatTemplate& chat_template, absl::string_view bos_text);

}  // namespace tandem::router

#endif  // TANDEM_ROUTER_REQUEST_PROMPT_H_
