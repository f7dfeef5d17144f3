// openai_protocol.h, the response side: ErrorBody, FromRpcError and
// ResponseBuilder (GenerateResponse messages -> OpenAI bodies and SSE chunks).
#include "router/openai/openai_protocol.h"

#include <grpcpp/support/status_code_enum.h>

#include <charconv>
#include <cmath>
#include <map>
#include <optional>
#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "engine/tokenizer/tokenizer.h"
#include "engine/tokenizer/utf8.h"
#include "nlohmann/json.hpp"

namespace tandem::router::openai {
namespace {

using OJson = nlohmann::ordered_json;  // response bodies (fields in OpenAI's order)

// The param of a router error: the field before the message's first ':'
// (an identifier path such as "stop[3]" or "messages[0].role"), in the
// client's terms. Empty when the message names no field.
std::string ParamOf(std::string_view message) {
  const size_t colon = message.find(':');
  if (colon == std::string_view::npos || colon == 0) return "";
  std::string_view field = message.substr(0, colon);
  for (char c : field) {
    const bool ok = (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') ||
                    c == '_' || c == '.' || c == '[' || c == ']';
    if (!ok) return "";
  }
  if (field.substr(0, 9) == "sampling.") field.remove_prefix(9);
  if (field.substr(0, 14) == "route_override") {
    return "route" + std::string(field.substr(14));
  }
  // The client wrote the ids as `prompt`.
  if (field.substr(0, 16) == "prompt_token_ids") {
    return "prompt" + std::string(field.substr(16));
  }
  return std::string(field);
}

// The JSON of a logprob: the float's shortest round-trip decimal (-0.1f is
// written -0.1); -inf (a token the model gives probability 0) as vLLM's
// -9999.0; NaN (never expected) as null.
OJson LogprobJson(float v) {
  if (std::isnan(v)) return nullptr;
  if (!std::isfinite(v)) return -9999.0;
  char buf[32];
  const std::to_chars_result end = std::to_chars(buf, buf + sizeof(buf), v);
  double d = v;
  std::from_chars(buf, end.ptr, d);
  return d;
}

// Every byte of `bytes` as \xNN (lower-case hex).
std::string HexBytes(std::string_view bytes) {
  static const char kHex[] = "0123456789abcdef";
  std::string out;
  for (unsigned char c : bytes) {
    out += "\\x";
    out += kHex[c >> 4];
    out += kHex[c & 15];
  }
  return out;
}

// A token's text for `tokens` / `token`: its bytes when they are valid
// UTF-8, otherwise "bytes:\xNN..." (as OpenAI writes a partial character).
std::string TokenText(const std::string& bytes) {
  if (!tokenizer::FindInvalidUtf8(bytes).has_value()) return bytes;
  return "bytes:" + HexBytes(bytes);
}

// Completions' text_offset: where each token's text starts in the
// choice's text, in Unicode code points (as Python indexes the decoded
// string). The text is decoded as the router decodes it
// (tokenizer::IncrementalDecoder: one U+FFFD per invalid byte, a character
// split across tokens counted once, when complete), so text[offset:]
// starts with the token's text.
struct TextOffsets {
  int64_t code_points = 0;  // of the text decoded so far
  tokenizer::IncrementalDecoder decoder;

  // The offset of the token whose bytes are `bytes`; then moves past it.
  int64_t Next(const std::string& bytes) {
    const int64_t at = code_points;
    // Valid UTF-8: one lead byte (not 10xxxxxx) per code point.
    for (unsigned char c : decoder.PushBytes(bytes)) code_points += (c & 0xC0) != 0x80;
    return at;
  }
};

OJson ByteArray(const std::string& bytes) {
  OJson a = OJson::array();
  for (unsigned char c : bytes) a.push_back(static_cast<int>(c));
  return a;
}

const char* FinishName(v1::FinishReason reason) {
  switch (reason) {
    case v1::FINISH_STOP:
      return "stop";
    case v1::FINISH_LENGTH:
    case v1::FINISH_CONTEXT:
      return "length";
    case v1::FINISH_CANCELLED:
      return "abort";
    default:
      return nullptr;
  }
}

OJson FinishJson(v1::FinishReason reason) {
  const char* name = FinishName(reason);
  return name == nullptr ? OJson(nullptr) : OJson(name);
}

OJson StopReasonJson(const v1::StopReason& r) {
  switch (r.kind_case()) {
    case v1::StopReason::kText:
      return r.text();
    case v1::StopReason::kTokenId:
      return r.token_id();
    default:
      return nullptr;
  }
}

std::string Dump(const OJson& j) { return j.dump(-1, ' ', false, OJson::error_handler_t::replace); }

}  // namespace

std::string ErrorBody(const ApiError& error) {
  OJson inner;
  inner["message"] = error.message;
  inner["type"] = error.type;
  inner["param"] = error.param.empty() ? OJson(nullptr) : OJson(error.param);
  inner["code"] = error.code.empty() ? OJson(nullptr) : OJson(error.code);
  OJson body;
  body["error"] = std::move(inner);
  return Dump(body);
}

ApiError FromRpcError(int grpc_code, std::string_view message, int64_t retry_after_ms) {
  ApiError e;
  e.message = std::string(message);
  e.retry_after_ms = retry_after_ms;
  switch (static_cast<grpc::StatusCode>(grpc_code)) {
    case grpc::StatusCode::INVALID_ARGUMENT:
    case grpc::StatusCode::FAILED_PRECONDITION:
    case grpc::StatusCode::OUT_OF_RANGE:
      e.http_status = 400;
      e.param = ParamOf(message);
      if (message.find("exceeds the model's context length") != std::string_view::npos) {
        e.code = "context_length_exceeded";
      }
      break;
    case grpc::StatusCode::UNAUTHENTICATED:
      e.http_status = 401;
      e.type = "authentication_error";
      e.code = "invalid_api_key";
      break;
    case grpc::StatusCode::PERMISSION_DENIED:
      e.http_status = 403;
      e.type = "permission_error";
      break;
    case grpc::StatusCode::NOT_FOUND:
      e.http_status = 404;
      e.type = "not_found_error";
      break;
    case grpc::StatusCode::RESOURCE_EXHAUSTED:
      if (retry_after_ms >= 0) {
        // A limit that frees up: router admission, an API key's quota.
        e.http_status = 429;
        e.type = "rate_limit_error";
        e.code = "rate_limit_exceeded";
      } else if (message.find("device error in a forward step") != std::string_view::npos) {
        // A worker's device ran out of memory in one step (engine core):
        // the server's trouble, and a retry may succeed.
        e.http_status = 503;
        e.type = "server_error";
      } else if (message.find("larger than max") != std::string_view::npos) {
        // gRPC's message size limit.
        e.http_status = 413;
        e.code = "request_too_large";
      } else {
        // Never servable as sent (more KV blocks than a worker has, a
        // prompt over an API key's whole minute): retrying cannot help.
        e.http_status = 400;
      }
      break;
    case grpc::StatusCode::UNAVAILABLE:
      e.http_status = 503;
      e.type = "server_error";
      break;
    case grpc::StatusCode::DEADLINE_EXCEEDED:
      e.http_status = 504;
      e.type = "server_error";
      e.code = "timeout";
      break;
    case grpc::StatusCode::CANCELLED:
      e.http_status = 499;  // nginx's "client closed request"
      e.type = "server_error";
      e.code = "cancelled";
      break;
    default:
      e.http_status = 500;
      e.type = "server_error";
      break;
  }
  return e;
}

struct ResponseBuilder::Impl {
  // One choice (sample) of the response.
  struct Sample {
    bool seen = false;                    // a chat role chunk was sent
    std::string text;                     // stream: false
    std::vector<v1::TokenOutput> tokens;  // stream: false, with logprobs
    TextOffsets offsets;                  // stream: true, completions logprobs
    v1::FinishReason finish = v1::FINISH_NONE;
    v1::StopReason stop_reason;
    uint32_t completion_tokens = 0;
  };

  bool chat = false;
  bool logprobs = false;
  bool include_usage = false;
  int64_t created_s = 0;
  uint32_t n = 1;
  std::string model;
  TokenBytes token_bytes;
  std::string id;
  uint32_t prompt_tokens = 0;
  uint32_t cached_prompt_tokens = 0;
  std::map<uint32_t, Sample> samples;
  // From sample 0's last message, when the router sent them.
  std::optional<v1::Placement> placement;
  std::optional<v1::RequestTiming> timing;

  // Records what every message says about the request and its sample.
  Sample& Note(const v1::GenerateResponse& m) {
    if (id.empty() && !m.request_id().empty()) {
      id = absl::StrCat(chat ? "chatcmpl-" : "cmpl-", m.request_id());
    }
    if (m.prompt_tokens() != 0) prompt_tokens = m.prompt_tokens();
    if (m.cached_prompt_tokens() != 0) cached_prompt_tokens = m.cached_prompt_tokens();
    Sample& s = samples[m.sample_index()];
    s.completion_tokens = std::max(s.completion_tokens, m.completion_tokens());
    if (m.finish_reason() != v1::FINISH_NONE) {
      s.finish = m.finish_reason();
      s.stop_reason = m.stop_reason();
      if (m.sample_index() == 0 && m.has_placement()) placement = m.placement();
      if (m.sample_index() == 0 && m.has_timing()) timing = m.timing();
    }
    return s;
  }

  OJson Usage() const {
    uint64_t completion = 0;
    for (const auto& [index, s] : samples) completion += s.completion_tokens;
    OJson usage;
    usage["prompt_tokens"] = prompt_tokens;
    usage["completion_tokens"] = completion;
    usage["total_tokens"] = prompt_tokens + completion;
    usage["prompt_tokens_details"] = {{"cached_tokens", cached_prompt_tokens}};
    if (placement.has_value()) {
      usage["placement"] = {{"decision", placement->decision()},
                            {"ttft_local_ms", placement->ttft_local_ms()},
                            {"ttft_remote_ms", placement->ttft_remote_ms()}};
    }
    if (timing.has_value()) {
      const v1::RequestTiming& t = *timing;
      usage["timing"] = {{"ttft_ms", t.ttft_ms()},
                         {"e2e_ms", t.e2e_ms()},
                         {"router_queue_ms", t.router_queue_ms()},
                         {"placement_ms", t.placement_ms()},
                         {"prefill_queue_ms", t.prefill_queue_ms()},
                         {"prefill_ms", t.prefill_ms()},
                         {"kv_transfer_ms", t.kv_transfer_ms()},
                         {"decode_admission_ms", t.decode_admission_ms()},
                         {"first_decode_ms", t.first_decode_ms()}};
    }
    return usage;
  }

  // Completions' logprobs of `tokens`; text_offset continues `offsets`.
  OJson CompletionLogprobs(const std::vector<v1::TokenOutput>& tokens,
                           TextOffsets* text_offsets) const {
    OJson texts = OJson::array(), lps = OJson::array(), tops = OJson::array(),
          offsets = OJson::array();
    for (const v1::TokenOutput& t : tokens) {
      const std::string bytes = token_bytes(t.token_id());
      const std::string text = TokenText(bytes);
      texts.push_back(text);
      lps.push_back(LogprobJson(t.logprob()));
      // As vLLM: the top alternatives, and the sampled token (so logprobs: 0
      // gives the sampled token alone); a text seen twice keeps the first
      // (more likely) entry.
      OJson top = OJson::object();
      for (const v1::TopLogprob& alt : t.top_logprobs()) {
        const std::string alt_text = TokenText(token_bytes(alt.token_id()));
        if (!top.contains(alt_text)) top[alt_text] = LogprobJson(alt.logprob());
      }
      if (!top.contains(text)) top[text] = LogprobJson(t.logprob());
      tops.push_back(std::move(top));
      offsets.push_back(text_offsets->Next(bytes));
    }
    OJson j;
    j["tokens"] = std::move(texts);
    j["token_logprobs"] = std::move(lps);
    j["top_logprobs"] = std::move(tops);
    j["text_offset"] = std::move(offsets);
    return j;
  }

  OJson ChatLogprobs(const std::vector<v1::TokenOutput>& tokens) const {
    OJson content = OJson::array();
    for (const v1::TokenOutput& t : tokens) {
      const std::string bytes = token_bytes(t.token_id());
      OJson top = OJson::array();
      for (const v1::TopLogprob& alt : t.top_logprobs()) {
        const std::string alt_bytes = token_bytes(alt.token_id());
        OJson a;
        a["token"] = TokenText(alt_bytes);
        a["logprob"] = LogprobJson(alt.logprob());
        a["bytes"] = ByteArray(alt_bytes);
        top.push_back(std::move(a));
      }
      OJson one;
      one["token"] = TokenText(bytes);
      one["logprob"] = LogprobJson(t.logprob());
      one["bytes"] = ByteArray(bytes);
      one["top_logprobs"] = std::move(top);
      content.push_back(std::move(one));
    }
    return {{"content", std::move(content)}};
  }

  OJson LogprobsOf(const std::vector<v1::TokenOutput>& tokens, TextOffsets* offsets) const {
    if (!logprobs) return nullptr;
    return chat ? ChatLogprobs(tokens) : CompletionLogprobs(tokens, offsets);
  }

  // A response or chunk with its header fields and `choices`.
  OJson Envelope(const char* object, OJson choices) const {
    OJson j;
    j["id"] = id;
    j["object"] = object;
    j["created"] = created_s;
    j["model"] = model;
    j["choices"] = std::move(choices);
    return j;
  }

  std::string Chunk(OJson choice) const {
    OJson choices = OJson::array();
    choices.push_back(std::move(choice));
    OJson j = Envelope(chat ? "chat.completion.chunk" : "text_completion", std::move(choices));
    if (include_usage) j["usage"] = nullptr;
    return Dump(j);
  }
};

ResponseBuilder::ResponseBuilder(const ParsedRequest& request, int64_t created_s, std::string model,
                                 TokenBytes token_bytes)
    : impl_(std::make_shared<Impl>()) {
  impl_->chat = request.endpoint == Endpoint::kChatCompletions;
  impl_->logprobs = request.logprobs;
  impl_->include_usage = request.include_usage;
  impl_->created_s = created_s;
  impl_->n = request.request.has_n() ? request.request.n() : 1;
  impl_->model = std::move(model);
  impl_->token_bytes = std::move(token_bytes);
}

std::vector<std::string> ResponseBuilder::Chunks(const v1::GenerateResponse& message) {
  Impl& b = *impl_;
  Impl::Sample& s = b.Note(message);
  const uint32_t index = message.sample_index();
  std::vector<std::string> out;
  if (b.chat && !s.seen) {
    OJson choice;
    choice["index"] = index;
    choice["delta"] = {{"role", "assistant"}, {"content", ""}};
    choice["logprobs"] = nullptr;
    choice["finish_reason"] = nullptr;
    out.push_back(b.Chunk(std::move(choice)));
  }
  s.seen = true;
  const bool finished = message.finish_reason() != v1::FINISH_NONE;
  const bool with_logprobs = b.logprobs && message.tokens_size() > 0;
  if (message.text().empty() && !with_logprobs && !finished) return out;
  const std::vector<v1::TokenOutput> tokens(message.tokens().begin(), message.tokens().end());
  OJson choice;
  choice["index"] = index;
  if (b.chat) {
    OJson delta = OJson::object();
    if (!message.text().empty() || with_logprobs) delta["content"] = message.text();
    choice["delta"] = std::move(delta);
  } else {
    choice["text"] = message.text();
  }
  choice["logprobs"] = with_logprobs ? b.LogprobsOf(tokens, &s.offsets) : OJson(nullptr);
  choice["finish_reason"] = FinishJson(message.finish_reason());
  if (finished) choice["stop_reason"] = StopReasonJson(message.stop_reason());
  out.push_back(b.Chunk(std::move(choice)));
  return out;
}

std::string ResponseBuilder::UsageChunk() const {
  const Impl& b = *impl_;
  OJson j = b.Envelope(b.chat ? "chat.completion.chunk" : "text_completion", OJson::array());
  j["usage"] = b.Usage();
  return Dump(j);
}

void ResponseBuilder::Add(const v1::GenerateResponse& message) {
  Impl::Sample& s = impl_->Note(message);
  s.text += message.text();
  if (impl_->logprobs)
    s.tokens.insert(s.tokens.end(), message.tokens().begin(), message.tokens().end());
}

std::string ResponseBuilder::Body() const {
  const Impl& b = *impl_;
  OJson choices = OJson::array();
  const uint32_t count =
      std::max<uint32_t>(b.n, b.samples.empty() ? 0 : b.samples.rbegin()->first + 1);
  for (uint32_t i = 0; i < count; ++i) {
    auto it = b.samples.find(i);
    const Impl::Sample empty;
    const Impl::Sample& s = it == b.samples.end() ? empty : it->second;
    OJson choice;
    choice["index"] = i;
    if (b.chat) {
      choice["message"] = {{"role", "assistant"}, {"content", s.text}};
    } else {
      choice["text"] = s.text;
    }
    TextOffsets offsets;
    choice["logprobs"] = b.LogprobsOf(s.tokens, &offsets);
    choice["finish_reason"] = FinishJson(s.finish);
    choice["stop_reason"] = StopReasonJson(s.stop_reason);
    choices.push_back(std::move(choice));
  }
  OJson j = b.Envelope(b.chat ? "chat.completion" : "text_completion", std::move(choices));
  j["usage"] = b.Usage();
  return Dump(j);
}

}  // namespace tandem::router::openai
