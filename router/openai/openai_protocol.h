// OpenAI's HTTP API mapped onto Tandem's gRPC Generate: request bodies of
// POST /v1/completions and /v1/chat/completions parsed into a
// GenerateRequest, GenerateResponse messages turned into OpenAI response
// bodies and server-sent-event chunks, and errors in OpenAI's shape.
//
// Reference: the OpenAI API reference (Completions, Chat Completions,
// "Streaming", error codes) and vLLM's OpenAI server (its extra request
// fields: top_k, min_p, repetition_penalty, stop_token_ids, ignore_eos,
// min_tokens, include_stop_str_in_output; Tandem adds `route`).
//
// Owns: JSON in and out (nlohmann-json). Does not touch: sockets, gRPC
// calls, tokenization (the caller passes what it needs).
// Threads: pure functions; a ResponseBuilder belongs to one request.
#ifndef TANDEM_ROUTER_OPENAI_OPENAI_PROTOCOL_H_
#define TANDEM_ROUTER_OPENAI_OPENAI_PROTOCOL_H_

#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <string_view>
#include <variant>
#include <vector>

#include "tandem/v1/generation.pb.h"

namespace tandem::router::openai {

// An error as OpenAI sends it: HTTP status and
// {"error": {"message", "type", "param", "code"}} (param / code null when
// empty).
struct ApiError {
  int http_status = 400;
  std::string message;
  // invalid_request_error (400, 404 model, 413), authentication_error (401),
  // not_found_error (404 path), rate_limit_error (429), server_error (5xx).
  std::string type = "invalid_request_error";
  // The offending field as the client wrote it ("temperature",
  // "messages[0].content").
  std::string param;
  std::string code;             // e.g. "model_not_found", "context_length_exceeded"
  int64_t retry_after_ms = -1;  // >= 0: the caller sends Retry-After (seconds, rounded up)
};

// The JSON body of `error` (one line, no trailing newline).
std::string ErrorBody(const ApiError& error);

enum class Endpoint { kCompletions, kChatCompletions };

// What parsing needs to know about the served model.
struct ModelLimits {
  std::string served_model_name;  // the only `model` accepted (another: 404 model_not_found)
  int32_t context_length = 0;     // tokens
  int32_t vocab_size = 0;         // token ids and logit_bias keys are < this
};

struct ParsedRequest {
  Endpoint endpoint = Endpoint::kCompletions;
  // prompt (string), prompt_token_ids (id array) or messages set; sampling
  // with OpenAI's defaults (temperature 1, top_p 1); max_tokens as given,
  // completions default 16; 0 for a chat request without max_tokens /
  // max_completion_tokens: the caller sets context_length - prompt tokens.
  v1::GenerateRequest request;
  bool stream = false;
  bool include_usage = false;  // stream_options.include_usage (stream only)
  // Completions: `logprobs` given (0..20; request.logprobs = it).
  // Chat: `logprobs: true` (request.logprobs = top_logprobs, 0..20).
  bool logprobs = false;
};

// Parses and validates `body` for `endpoint`. Errors (ApiError, 400 with
// param naming the field unless said): malformed JSON (param null); a body
// that is not an object; a field of the wrong type or value out of range
// (NaN too); an unknown field, or an OpenAI field Tandem does not
// implement (echo: true, suffix, best_of != n, tools, functions,
// tool_choice, a response_format other than text, batch prompts, ...);
// another `model` (404, code model_not_found); an empty prompt or
// messages; logprobs > 20; top_logprobs without logprobs: true. `user` is
// accepted and unused. Limits checked later by the router (context length,
// stop list size, ...) come back as its gRPC errors (FromRpcError).
//
// Decisions (README.md of this directory lists every field and range):
// - null is "not given" for every optional field.
// - integers: a JSON integer, or a float with an integral value (16.0).
// - temperature in [0, 2] (OpenAI's range; the engine itself takes any
//   value >= 0); top_p (0, 1]; n 1..16; presence/frequency_penalty
//   [-2, 2]; logit_bias keys decimal token ids < vocab_size, values
//   [-100, 100] (param "logit_bias.<key>"); repetition_penalty [0.01, 100];
//   min_p [0, 1]; top_k -1 or >= 0 (-1 and 0: off).
// - seed: any int64; a negative seed is its 64-bit two's complement.
// - prompt: a string, an id array, or a batch of one of them ([..] of
//   length 1; errors then name prompt[0]); a longer batch -> 400.
// - messages[i]: role and content only (name, tool_calls, ... non-null ->
//   400 naming messages[i].<key>); content a string or "text" parts; null
//   content only for role assistant ("").
// - skip_special_tokens: true (the router always drops control tokens'
//   text) or 400; echo: false; suffix: null or ""; best_of: == n;
//   response_format: {"type": "text"}; stream_options only with stream.
// - chat: max_completion_tokens wins over max_tokens.
// - A malformed body's error quotes no byte outside printable ASCII.
std::variant<ParsedRequest, ApiError> ParseRequest(Endpoint endpoint, std::string_view body,
                                                   const ModelLimits& limits);

// A failed gRPC Generate as an OpenAI error. `grpc_code`: grpc::StatusCode
// as int. INVALID_ARGUMENT, FAILED_PRECONDITION, OUT_OF_RANGE -> 400 (param:
// the field named before the message's first ':', mapped to the OpenAI
// name, e.g. "sampling.temperature" -> "temperature"; code
// context_length_exceeded when the prompt and max_tokens exceed the
// context); UNAUTHENTICATED 401; PERMISSION_DENIED 403; NOT_FOUND 404;
// RESOURCE_EXHAUSTED 429 with a retry-after hint (a limit that frees up),
// else 413 for gRPC's message size limit and 400 for a request that can
// never be served as sent (more KV blocks than a worker has); UNAVAILABLE 503; DEADLINE_EXCEEDED 504;
// CANCELLED 499; anything else 500. `message` is kept as is; param is
// empty when the text before ':' is not a field path ("router at
// capacity: ...", the context-length message). Other field names map as
// prompt_token_ids[i] -> prompt[i], route_override -> route. Types:
// 400 invalid_request_error, 401 authentication_error (code
// invalid_api_key), 403 permission_error, 404 not_found_error, 429
// rate_limit_error (code rate_limit_exceeded), 499 / 5xx server_error
// (codes cancelled, timeout for 499, 504).
ApiError FromRpcError(int grpc_code, std::string_view message, int64_t retry_after_ms);

// A token's bytes (its text piece; may be part of a UTF-8 character).
// Called on the thread that calls the builder.
using TokenBytes = std::function<std::string(int32_t token_id)>;

// Builds the response of one request from its GenerateResponse messages
// (as the router streams them: any order of samples, one finish message
// per sample). The response id is "cmpl-<request_id>" /
// "chatcmpl-<request_id>" (from the first message).
//
// finish_reason: FINISH_STOP "stop", FINISH_LENGTH and FINISH_CONTEXT
// "length", FINISH_CANCELLED "abort" (vLLM's); stop_reason (vLLM's): the
// stop string, the stop_token_ids id, or null (end-of-generation token,
// length). Logprobs: a token whose bytes are not valid UTF-8 is written
// "bytes:\xNN..." in `tokens` / `token` (chat also gives `bytes`); a -inf
// logprob is written -9999.0 (vLLM). Completions' top_logprobs hold the
// request's top-n and the sampled token (so logprobs: 0 gives
// {sampled: logprob}, as vLLM); a text seen twice keeps the more likely
// entry. text_offset: the Unicode code points (UTF-8 lead bytes) of the
// sample's token bytes before each token, continuing across chunks; a stop
// token's bytes count though its text is not in `text`. usage:
// prompt_tokens, completion_tokens summed over the samples, total_tokens,
// prompt_tokens_details.cached_tokens, then Tandem's placement {decision,
// ttft_local_ms, ttft_remote_ms} and timing {ttft_ms, e2e_ms,
// router_queue_ms, placement_ms, prefill_queue_ms, prefill_ms,
// kv_transfer_ms, decode_admission_ms, first_decode_ms} from sample 0's
// last message (GenerateResponse.placement / timing; each left out when
// that message has none); no system_fingerprint. Output is
// dumped with invalid UTF-8 replaced by U+FFFD (never throws).
class ResponseBuilder {
 public:
  // `created_s`: Unix seconds; `model`: the served model name.
  ResponseBuilder(const ParsedRequest& request, int64_t created_s, std::string model,
                  TokenBytes token_bytes);

  // stream: true. The JSON payloads (without "data: ") of the SSE events
  // for one message (zero, one or two): chat sends
  // {"delta":{"role":"assistant","content":""}} first for each sample (with
  // that sample's first message; sample 0's with the metadata message),
  // then one chunk per message with text, with tokens when logprobs are
  // on, or with finish_reason: delta {"content": text} (or {} for a bare
  // finish), choice "text" for completions. The finish chunk carries the
  // message's last text and tokens too, finish_reason and stop_reason.
  // With include_usage every chunk has "usage": null.
  std::vector<std::string> Chunks(const v1::GenerateResponse& message);
  // With include_usage, after the last message: {"choices": [], "usage": {...}}.
  std::string UsageChunk() const;

  // stream: false. Add every message, then Body(): the whole response
  // (choices by index, usage with prompt_tokens_details.cached_tokens).
  void Add(const v1::GenerateResponse& message);
  std::string Body() const;

 private:
  struct Impl;
  std::shared_ptr<Impl> impl_;
};

}  // namespace tandem::router::openai

#endif  // TANDEM_ROUTER_OPENAI_OPENAI_PROTOCOL_H_
