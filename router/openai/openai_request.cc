// openai_protocol.h, the request side: ParseRequest (OpenAI request
// bodies -> GenerateRequest, every field checked and named in errors).
#include "router/openai/openai_protocol.h"

#include <cmath>
#include <limits>
#include <map>
#include <optional>
#include <set>
#include <utility>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "engine/core/request.h"
#include "engine/sampling/sampling_options.h"
#include "nlohmann/json.hpp"

namespace tandem::router::openai {
namespace {

using Json = nlohmann::json;  // request bodies

// The engine's limits that OpenAI's API shares (the router checks them
// again); the others (stop list size, context length) come back from the
// router.
constexpr int64_t kMaxLogprobs = sampling::kMaxTopLogprobs;  // OpenAI: 5 (completions) / 20
constexpr int64_t kMaxN = core::kMaxSamples;
constexpr double kMaxPenalty = sampling::kMaxAbsPenalty;
constexpr double kMaxLogitBias = sampling::kMaxAbsLogitBias;

// The fields each endpoint accepts; any other is refused by name.
const std::set<std::string>& CommonFields() {
  static const auto* fields = new std::set<std::string>{
      "model", "max_tokens", "temperature", "top_p", "n", "stream", "stream_options", "stop",
      "presence_penalty", "frequency_penalty", "logit_bias", "logprobs", "user", "seed",
      // vLLM's extras, and Tandem's route.
      "top_k", "min_p", "repetition_penalty", "stop_token_ids", "ignore_eos", "min_tokens",
      "include_stop_str_in_output", "skip_special_tokens", "route"};
  return *fields;
}
const std::set<std::string>& CompletionsFields() {
  static const auto* fields = new std::set<std::string>{"prompt", "echo", "suffix", "best_of"};
  return *fields;
}
const std::set<std::string>& ChatFields() {
  static const auto* fields = new std::set<std::string>{"messages",
                                                        "max_completion_tokens",
                                                        "top_logprobs",
                                                        "response_format",
                                                        "tools",
                                                        "tool_choice",
                                                        "functions",
                                                        "function_call",
                                                        "parallel_tool_calls",
                                                        "store",
                                                        "metadata"};
  return *fields;
}

ApiError BadRequest(std::string param, std::string message) {
  ApiError e;
  e.http_status = 400;
  e.param = std::move(param);
  e.message = std::move(message);
  return e;
}

const char* TypeName(const Json& v) {
  switch (v.type()) {
    case Json::value_t::null:
      return "null";
    case Json::value_t::boolean:
      return "a boolean";
    case Json::value_t::number_integer:
    case Json::value_t::number_unsigned:
      return "an integer";
    case Json::value_t::number_float:
      return "a number";
    case Json::value_t::string:
      return "a string";
    case Json::value_t::array:
      return "an array";
    case Json::value_t::object:
      return "an object";
    default:
      return "an unsupported value";
  }
}

ApiError WrongType(const std::string& param, const char* expected, const Json& v) {
  return BadRequest(param, absl::StrCat(param, ": expected ", expected, ", got ", TypeName(v)));
}

// A JSON value as the message quotes it: a scalar's JSON cut to at most 64
// bytes between characters (the parser refuses invalid UTF-8), an array or object
// by its type (never dumped: its nesting depth is the client's choice).
std::string Quote(const Json& v) {
  if (v.is_structured()) return TypeName(v);
  std::string s = v.dump();
  if (s.size() > 64) {
    size_t cut = 61;
    while (cut > 0 && (static_cast<unsigned char>(s[cut]) & 0xC0) == 0x80) --cut;  // whole chars
    s = s.substr(0, cut) + "...";
  }
  return s;
}

// Reads one request body; the first error wins and stops the parse.
class BodyReader {
 public:
  explicit BodyReader(const Json& body) : body_(body) {}

  const std::optional<ApiError>& error() const { return error_; }
  bool ok() const { return !error_.has_value(); }
  void Fail(ApiError e) {
    if (!error_) error_ = std::move(e);
  }

  // The field, or nullptr when absent or null (OpenAI reads null as "not
  // given").
  const Json* Get(const std::string& name) const {
    auto it = body_.find(name);
    if (it == body_.end() || it->is_null()) return nullptr;
    return &*it;
  }

  std::optional<bool> Bool(const Json* v, const std::string& param) {
    if (v == nullptr || !ok()) return std::nullopt;
    if (!v->is_boolean()) {
      Fail(WrongType(param, "a boolean", *v));
      return std::nullopt;
    }
    return v->get<bool>();
  }
  std::optional<bool> Bool(const std::string& name) { return Bool(Get(name), name); }

  // An integer in [lo, hi]; a float with an integral value (16.0) counts.
  std::optional<int64_t> Int(const Json* v, const std::string& param, int64_t lo, int64_t hi) {
    if (v == nullptr || !ok()) return std::nullopt;
    std::optional<int64_t> value;
    bool in_int64 = true;
    if (v->is_number_unsigned()) {
      const uint64_t u = v->get<uint64_t>();
      if (u > static_cast<uint64_t>(std::numeric_limits<int64_t>::max())) {
        in_int64 = false;
      } else {
        value = static_cast<int64_t>(u);
      }
    } else if (v->is_number_integer()) {
      value = v->get<int64_t>();
    } else if (v->is_number_float()) {
      const double d = v->get<double>();
      if (std::trunc(d) != d) {
        Fail(WrongType(param, "an integer", *v));
        return std::nullopt;
      }
      if (d >= -9.2e18 && d <= 9.2e18) {
        value = static_cast<int64_t>(d);
      } else {
        in_int64 = false;
      }
    } else {
      Fail(WrongType(param, "an integer", *v));
      return std::nullopt;
    }
    if (!in_int64 || *value < lo || *value > hi) {
      Fail(BadRequest(param, absl::StrCat(param, ": must be an integer in [", lo, ", ", hi,
                                          "], got ", Quote(*v))));
      return std::nullopt;
    }
    return value;
  }
  std::optional<int64_t> Int(const std::string& name, int64_t lo, int64_t hi) {
    return Int(Get(name), name, lo, hi);
  }

  // A number in [lo, hi] (lo_open: (lo, hi]). JSON has no NaN or infinity;
  // a literal too large for a double is out of range.
  std::optional<double> Number(const Json* v, const std::string& param, double lo, double hi,
                               bool lo_open = false) {
    if (v == nullptr || !ok()) return std::nullopt;
    if (!v->is_number()) {
      Fail(WrongType(param, "a number", *v));
      return std::nullopt;
    }
    const double d = v->get<double>();
    if (!std::isfinite(d) || (lo_open ? d <= lo : d < lo) || d > hi) {
      Fail(BadRequest(param, absl::StrCat(param, ": must be in ", lo_open ? "(" : "[", lo, ", ", hi,
                                          "], got ", Quote(*v))));
      return std::nullopt;
    }
    return d;
  }
  std::optional<double> Number(const std::string& name, double lo, double hi,
                               bool lo_open = false) {
    return Number(Get(name), name, lo, hi, lo_open);
  }

  std::optional<std::string> String(const Json* v, const std::string& param) {
    if (v == nullptr || !ok()) return std::nullopt;
    if (!v->is_string()) {
      Fail(WrongType(param, "a string", *v));
      return std::nullopt;
    }
    return v->get<std::string>();
  }
  std::optional<std::string> String(const std::string& name) { return String(Get(name), name); }

  // Refuses a field that is present and not null (OpenAI features Tandem
  // does not implement).
  void Unsupported(const std::string& name, const std::string& what) {
    if (ok() && Get(name) != nullptr) {
      Fail(BadRequest(name, absl::StrCat(name, ": ", what, " is not supported")));
    }
  }

 private:
  const Json& body_;
  std::optional<ApiError> error_;
};

// Token ids (prompt or stop_token_ids), each in [0, vocab_size).
bool ReadIds(BodyReader& r, const Json& array, const std::string& param, int32_t vocab_size,
             google::protobuf::RepeatedField<int32_t>* out) {
  for (size_t i = 0; i < array.size(); ++i) {
    std::optional<int64_t> id =
        r.Int(&array[i], absl::StrCat(param, "[", i, "]"), 0, int64_t{vocab_size} - 1);
    if (!id) return false;
    out->Add(static_cast<int32_t>(*id));
  }
  return true;
}

void ReadPrompt(BodyReader& r, const Json* prompt, const ModelLimits& limits,
                v1::GenerateRequest* request) {
  if (!r.ok()) return;
  if (prompt == nullptr) {
    r.Fail(BadRequest("prompt", "prompt: required (a string or an array of token ids)"));
    return;
  }
  const Json* p = prompt;
  std::string param = "prompt";
  // A batch of one is that prompt.
  if (p->is_array() && p->size() == 1 && ((*p)[0].is_string() || (*p)[0].is_array())) {
    p = &(*p)[0];
    param = "prompt[0]";
  }
  if (p->is_string()) {
    if (p->get_ref<const std::string&>().empty()) {
      r.Fail(BadRequest(param, param + ": must not be empty"));
      return;
    }
    request->set_prompt(p->get<std::string>());
    return;
  }
  if (!p->is_array()) {
    r.Fail(WrongType(param, "a string or an array of token ids", *p));
    return;
  }
  if (p->empty()) {
    r.Fail(BadRequest(param, param + ": must not be empty"));
    return;
  }
  if (p == prompt && ((*p)[0].is_string() || (*p)[0].is_array())) {
    r.Fail(BadRequest("prompt", absl::StrCat("prompt: batch prompts are not supported (got ",
                                             p->size(), " prompts); send one per request")));
    return;
  }
  ReadIds(r, *p, param, limits.vocab_size, request->mutable_prompt_token_ids());
}

// messages[i].content: a string, or text parts concatenated.
std::optional<std::string> ReadContent(BodyReader& r, const Json& message, const std::string& param,
                                       bool may_be_null) {
  auto it = message.find("content");
  if (it == message.end() || it->is_null()) {
    if (may_be_null) return std::string();
    r.Fail(BadRequest(param, absl::StrCat(param, ": required")));
    return std::nullopt;
  }
  if (it->is_string()) return it->get<std::string>();
  if (!it->is_array()) {
    r.Fail(WrongType(param, "a string or an array of content parts", *it));
    return std::nullopt;
  }
  std::string text;
  for (size_t j = 0; j < it->size(); ++j) {
    const Json& part = (*it)[j];
    const std::string part_param = absl::StrCat(param, "[", j, "]");
    if (!part.is_object()) {
      r.Fail(WrongType(part_param, "an object", part));
      return std::nullopt;
    }
    auto type_it = part.find("type");
    const std::string type_param = absl::StrCat(part_param, ".type");
    if (type_it == part.end() || !type_it->is_string()) {
      r.Fail(BadRequest(type_param, absl::StrCat(type_param, ": required (\"text\")")));
      return std::nullopt;
    }
    if (*type_it != "text") {
      r.Fail(BadRequest(
          type_param,
          absl::StrCat(type_param, ": only \"text\" parts are supported, got ", Quote(*type_it))));
      return std::nullopt;
    }
    for (const auto& [key, value] : part.items()) {
      if (key != "type" && key != "text") {
        r.Fail(BadRequest(absl::StrCat(part_param, ".", key),
                          absl::StrCat(part_param, ".", key, ": unrecognized field")));
        return std::nullopt;
      }
    }
    auto text_it = part.find("text");
    const std::string text_param = absl::StrCat(part_param, ".text");
    if (text_it == part.end() || !text_it->is_string()) {
      r.Fail(text_it == part.end() ? BadRequest(text_param, absl::StrCat(text_param, ": required"))
                                   : WrongType(text_param, "a string", *text_it));
      return std::nullopt;
    }
    text += text_it->get_ref<const std::string&>();
  }
  return text;
}

void ReadMessages(BodyReader& r, const Json* messages, v1::GenerateRequest* request) {
  if (!r.ok()) return;
  if (messages == nullptr) {
    r.Fail(BadRequest("messages", "messages: required (a non-empty array)"));
    return;
  }
  if (!messages->is_array()) {
    r.Fail(WrongType("messages", "an array", *messages));
    return;
  }
  if (messages->empty()) {
    r.Fail(BadRequest("messages", "messages: must not be empty"));
    return;
  }
  for (size_t i = 0; i < messages->size(); ++i) {
    const Json& m = (*messages)[i];
    const std::string param = absl::StrCat("messages[", i, "]");
    if (!m.is_object()) {
      r.Fail(WrongType(param, "an object", m));
      return;
    }
    for (const auto& [key, value] : m.items()) {
      if (key == "role" || key == "content" || value.is_null()) continue;
      // name, tool_calls, tool_call_id, refusal, audio, ...: Tandem's chat
      // templates render role and content only.
      r.Fail(BadRequest(absl::StrCat(param, ".", key),
                        absl::StrCat(param, ".", key, ": not supported (role and content only)")));
      return;
    }
    const std::string role_param = param + ".role";
    auto role_it = m.find("role");
    if (role_it == m.end() || role_it->is_null()) {
      r.Fail(BadRequest(role_param, role_param + ": required"));
      return;
    }
    std::optional<std::string> role = r.String(&*role_it, role_param);
    if (!role) return;
    if (*role != "system" && *role != "developer" && *role != "user" && *role != "assistant") {
      r.Fail(BadRequest(
          role_param,
          absl::StrCat(role_param, ": must be system, developer, user or assistant, got ",
                       Quote(*role_it))));
      return;
    }
    std::optional<std::string> content =
        ReadContent(r, m, param + ".content", /*may_be_null=*/*role == "assistant");
    if (!content) return;
    v1::ChatMessage* out = request->add_messages();
    out->set_role(*role);
    out->set_content(std::move(*content));
  }
}

void ReadStop(BodyReader& r, v1::GenerateRequest* request) {
  const Json* stop = r.Get("stop");
  if (stop == nullptr || !r.ok()) return;
  if (stop->is_string()) {
    request->add_stop(stop->get<std::string>());
    return;
  }
  if (!stop->is_array()) {
    r.Fail(WrongType("stop", "a string or an array of strings", *stop));
    return;
  }
  for (size_t i = 0; i < stop->size(); ++i) {
    std::optional<std::string> s = r.String(&(*stop)[i], absl::StrCat("stop[", i, "]"));
    if (!s) return;
    request->add_stop(std::move(*s));
  }
}

void ReadLogitBias(BodyReader& r, const ModelLimits& limits, v1::SamplingParams* sampling) {
  const Json* bias = r.Get("logit_bias");
  if (bias == nullptr || !r.ok()) return;
  if (!bias->is_object()) {
    r.Fail(WrongType("logit_bias", "an object (token id -> bias)", *bias));
    return;
  }
  for (const auto& [key, value] : bias->items()) {
    const std::string param = absl::StrCat("logit_bias.", key);
    int32_t id = 0;
    // Decimal digits only ("+5", " 5", "5.0" are not token ids).
    const bool digits = !key.empty() && key.size() <= 10 &&
                        key.find_first_not_of("0123456789") == std::string::npos;
    if (!digits || !absl::SimpleAtoi(key, &id) || id >= limits.vocab_size) {
      r.Fail(BadRequest(param, absl::StrCat("logit_bias: key '", key, "' is not a token id in [0, ",
                                            limits.vocab_size, ")")));
      return;
    }
    std::optional<double> b = r.Number(&value, param, -kMaxLogitBias, kMaxLogitBias);
    if (!b) return;
    (*sampling->mutable_logit_bias())[id] = static_cast<float>(*b);
  }
}

void ReadRoute(BodyReader& r, v1::GenerateRequest* request) {
  std::optional<std::string> route = r.String("route");
  if (!route) return;
  if (*route == "auto") {
    request->set_route_override(v1::ROUTE_AUTO);
  } else if (*route == "local") {
    request->set_route_override(v1::ROUTE_LOCAL);
  } else if (*route == "remote") {
    request->set_route_override(v1::ROUTE_REMOTE);
  } else {
    r.Fail(BadRequest("route", absl::StrCat("route: must be \"auto\", \"local\" or "
                                            "\"remote\", got ",
                                            Quote(*r.Get("route")))));
  }
}

// The fields both endpoints share (sampling, stop, stream, extras).
void ReadCommon(BodyReader& r, const ModelLimits& limits, ParsedRequest* out) {
  v1::GenerateRequest* request = &out->request;
  v1::SamplingParams* sampling = request->mutable_sampling();
  // OpenAI's range for temperature; Tandem itself accepts any value >= 0.
  sampling->set_temperature(static_cast<float>(r.Number("temperature", 0, 2).value_or(1.0)));
  if (auto top_p = r.Number("top_p", 0, 1, /*lo_open=*/true)) {
    sampling->set_top_p(static_cast<float>(*top_p));
  }
  if (auto n = r.Int("n", 1, kMaxN)) request->set_n(static_cast<uint32_t>(*n));
  out->stream = r.Bool("stream").value_or(false);
  if (const Json* options = r.Get("stream_options"); options != nullptr && r.ok()) {
    if (!out->stream) {
      r.Fail(BadRequest("stream_options", "stream_options: only allowed with \"stream\": true"));
    } else if (!options->is_object()) {
      r.Fail(WrongType("stream_options", "an object", *options));
    } else {
      for (const auto& [key, value] : options->items()) {
        if (key != "include_usage") {
          const std::string param = "stream_options." + key;
          r.Fail(BadRequest(param, "Unrecognized request argument supplied: " + param));
          return;
        }
      }
      auto it = options->find("include_usage");
      if (it != options->end() && !it->is_null()) {
        out->include_usage = r.Bool(&*it, "stream_options.include_usage").value_or(false);
      }
    }
  }
  ReadStop(r, request);
  if (auto p = r.Number("presence_penalty", -kMaxPenalty, kMaxPenalty)) {
    sampling->set_presence_penalty(static_cast<float>(*p));
  }
  if (auto f = r.Number("frequency_penalty", -kMaxPenalty, kMaxPenalty)) {
    sampling->set_frequency_penalty(static_cast<float>(*f));
  }
  ReadLogitBias(r, limits, sampling);
  r.String("user");  // accepted, unused (OpenAI: an end-user id for abuse monitoring)
  if (auto seed =
          r.Int("seed", std::numeric_limits<int64_t>::min(), std::numeric_limits<int64_t>::max())) {
    // A negative seed is its 64-bit two's complement: every int64 is a seed.
    sampling->set_seed(static_cast<uint64_t>(*seed));
    sampling->set_has_seed(true);
  }
  // vLLM's extras.
  if (auto k = r.Int("top_k", -1, std::numeric_limits<int32_t>::max())) {
    sampling->set_top_k(*k < 0 ? 0 : static_cast<int32_t>(*k));
  }
  if (auto min_p = r.Number("min_p", 0, 1)) sampling->set_min_p(static_cast<float>(*min_p));
  if (auto rp = r.Number("repetition_penalty", sampling::kMinRepetitionPenalty,
                         sampling::kMaxRepetitionPenalty)) {
    sampling->set_repetition_penalty(static_cast<float>(*rp));
  }
  if (const Json* ids = r.Get("stop_token_ids"); ids != nullptr && r.ok()) {
    if (!ids->is_array()) {
      r.Fail(WrongType("stop_token_ids", "an array of token ids", *ids));
    } else {
      ReadIds(r, *ids, "stop_token_ids", limits.vocab_size, request->mutable_stop_token_ids());
    }
  }
  request->set_ignore_eos(r.Bool("ignore_eos").value_or(false));
  if (auto m = r.Int("min_tokens", 0, std::numeric_limits<int32_t>::max())) {
    request->set_min_tokens(static_cast<uint32_t>(*m));
  }
  request->set_include_stop_str_in_output(r.Bool("include_stop_str_in_output").value_or(false));
  // The router's detokenizer always drops control tokens' text.
  if (r.Bool("skip_special_tokens") == false) {
    r.Fail(BadRequest("skip_special_tokens",
                      "skip_special_tokens: false is not supported (special tokens are always "
                      "skipped)"));
  }
  ReadRoute(r, request);
}

void ReadCompletions(BodyReader& r, const ModelLimits& limits, ParsedRequest* out) {
  v1::GenerateRequest* request = &out->request;
  ReadPrompt(r, r.Get("prompt"), limits, request);
  request->set_max_tokens(static_cast<uint32_t>(
      r.Int("max_tokens", 1, std::numeric_limits<int32_t>::max()).value_or(16)));
  if (auto logprobs = r.Int("logprobs", 0, kMaxLogprobs)) {
    out->logprobs = true;
    request->set_logprobs(static_cast<uint32_t>(*logprobs));
  }
  if (r.Bool("echo") == true) {
    r.Fail(BadRequest("echo", "echo: true is not supported"));
  }
  if (auto suffix = r.String("suffix"); suffix && !suffix->empty()) {
    r.Fail(BadRequest("suffix", "suffix: not supported"));
  }
  if (auto best_of = r.Int("best_of", 1, kMaxN)) {
    const int64_t n = request->has_n() ? request->n() : 1;
    if (*best_of != n) {
      r.Fail(BadRequest("best_of", absl::StrCat("best_of: only best_of == n (", n,
                                                ") is supported, got ", *best_of)));
    }
  }
}

void ReadChat(BodyReader& r, ParsedRequest* out) {
  v1::GenerateRequest* request = &out->request;
  ReadMessages(r, r.Get("messages"), request);
  // max_completion_tokens replaces the deprecated max_tokens (vLLM: it wins).
  std::optional<int64_t> max_tokens = r.Int("max_tokens", 1, std::numeric_limits<int32_t>::max());
  if (auto m = r.Int("max_completion_tokens", 1, std::numeric_limits<int32_t>::max())) {
    max_tokens = m;
  }
  request->set_max_tokens(static_cast<uint32_t>(max_tokens.value_or(0)));
  out->logprobs = r.Bool("logprobs").value_or(false);
  if (auto top = r.Int("top_logprobs", 0, kMaxLogprobs)) {
    if (!out->logprobs) {
      r.Fail(BadRequest("top_logprobs", "top_logprobs: requires \"logprobs\": true"));
    } else {
      request->set_logprobs(static_cast<uint32_t>(*top));
    }
  }
  if (const Json* format = r.Get("response_format"); format != nullptr && r.ok()) {
    // {"type": "json_object"} names its type; any other value its JSON type.
    auto type = format->is_object() ? format->find("type") : format->end();
    const bool has_type = format->is_object() && type != format->end();
    if (!has_type || *type != "text" || format->size() != 1) {
      r.Fail(BadRequest("response_format",
                        absl::StrCat("response_format: only {\"type\": \"text\"} is supported, "
                                     "got ",
                                     has_type ? "type " + Quote(*type) : Quote(*format))));
    }
  }
  for (const char* name :
       {"tools", "tool_choice", "functions", "function_call", "parallel_tool_calls"}) {
    r.Unsupported(name, "tool and function calling");
  }
  // OpenAI's stored completions: Tandem stores nothing, so `store: false`
  // (what frameworks send) is what it does anyway; `metadata` only tags
  // stored ones.
  if (r.Bool("store") == true) {
    r.Fail(BadRequest("store", "store: true is not supported (Tandem stores no completions)"));
  }
  r.Unsupported("metadata", "metadata (for stored completions)");
}

// `s` with every byte outside printable ASCII written \xNN (nlohmann's
// parse errors quote the bytes last read, which may be ill-formed UTF-8).
std::string AsciiOnly(std::string_view s) {
  std::string out;
  for (size_t i = 0; i < s.size(); ++i) {
    const unsigned char c = s[i];
    if (c >= 0x20 && c < 0x7F) {
      out += s[i];
    } else {
      static const char kHex[] = "0123456789abcdef";
      out += "\\x";
      out += kHex[c >> 4];
      out += kHex[c & 15];
    }
  }
  return out;
}

}  // namespace

std::variant<ParsedRequest, ApiError> ParseRequest(Endpoint endpoint, std::string_view body,
                                                   const ModelLimits& limits) {
  Json json;
  try {
    json = Json::parse(body.begin(), body.end());
  } catch (const Json::exception& e) {
    // parse_error (syntax, ill-formed UTF-8), out_of_range (a number
    // beyond a double: 1e400).
    ApiError error;
    error.message =
        absl::StrCat("We could not parse the JSON body of your request: ", AsciiOnly(e.what()));
    return error;
  }
  if (!json.is_object()) {
    return BadRequest("",
                      absl::StrCat("the request body must be a JSON object, got ", TypeName(json)));
  }
  const auto& own = endpoint == Endpoint::kCompletions ? CompletionsFields() : ChatFields();
  for (const auto& [key, value] : json.items()) {
    if (!CommonFields().contains(key) && !own.contains(key)) {
      return BadRequest(key, "Unrecognized request argument supplied: " + key);
    }
  }
  BodyReader r(json);
  const Json* model = r.Get("model");
  if (model == nullptr) {
    return BadRequest("model", "model: required (the served model's name, see GET /v1/models)");
  }
  if (!model->is_string()) return WrongType("model", "a string", *model);
  if (model->get_ref<const std::string&>() != limits.served_model_name) {
    ApiError e;
    e.http_status = 404;
    e.param = "model";
    e.code = "model_not_found";
    e.message = absl::StrCat("The model ", Quote(*model), " does not exist (this server serves \"",
                             limits.served_model_name, "\")");
    return e;
  }
  ParsedRequest out;
  out.endpoint = endpoint;
  ReadCommon(r, limits, &out);
  if (endpoint == Endpoint::kCompletions) {
    ReadCompletions(r, limits, &out);
  } else {
    ReadChat(r, &out);
  }
  if (!r.ok()) return *r.error();
  return out;
}

}  // namespace tandem::router::openai
