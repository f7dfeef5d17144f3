#include "tools/generate.h"

#include <algorithm>
#include <charconv>
#include <cmath>
#include <cstdio>
#include <iostream>
#include <limits>
#include <utility>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "common/server/proto_convert.h"
#include "engine/core/request_validation.h"
#include "engine/sampling/sampling_options.h"
#include "engine/tokenizer/tokenizer.h"
#include "router/stop_strings.h"
#include "tools/cli_args.h"
#include "tools/router_client.h"

namespace tandem::cli {
namespace {

constexpr char kUsage[] =
    "usage: tandem generate [--router H:P] [--api-key KEY] [--max-tokens N] [--temperature T] "
    "[--top-k K]\n"
    "                       [--top-p P] [--min-p P] [--seed S] [--repetition-penalty P]\n"
    "                       [--presence-penalty P] [--frequency-penalty P]\n"
    "                       [--logit-bias ID=BIAS]... [--stop STR]... [--stop-token-id ID]...\n"
    "                       [--include-stop-str] [--ignore-eos] [--min-tokens N]\n"
    "                       [--logprobs N] [--n N] [--route auto|local|remote] [--chat]\n"
    "                       [--json] [--timeout-ms MS] PROMPT\n"
    "  --chat: send PROMPT as one user message, rendered with the model's chat template\n"
    "  ...: the flag may be repeated; values outside the router's ranges are refused here\n"
    "  --n N > 1 without --json: one \"[sample S] TEXT\" line per sample as it finishes\n";

double ToMs(absl::Duration d) { return absl::ToDoubleMilliseconds(d); }

// `value` of flag `name` if it lies in [lo, hi] (the proto field's type);
// INVALID_ARGUMENT "--<name>: must be in LO..HI, got V" otherwise.
[[nodiscard]] absl::StatusOr<int64_t> CheckRange(const std::string& name, int64_t value, int64_t lo,
                                                 int64_t hi) {
  if (value < lo || value > hi) {
    return absl::InvalidArgumentError(
        absl::StrCat("--", name, ": must be in ", lo, "..", hi, ", got ", value));
  }
  return value;
}

// A uint32 field's flag (any value of the field; CheckRanges has the
// router's ranges).
[[nodiscard]] absl::StatusOr<std::optional<uint32_t>> OptionalUint32(const ParsedArgs& parsed,
                                                                     const std::string& name) {
  if (!parsed.Has(name)) return std::optional<uint32_t>();
  absl::StatusOr<int64_t> value = parsed.GetInt(name, 0);
  if (!value.ok()) return value.status();
  if (name == "max-tokens" && *value < 0) {
    // Said as CheckRanges says 0 (core::ValidateGeneration's rule), not as
    // the field's type would.
    return absl::InvalidArgumentError(absl::StrCat("--max-tokens: must be >= 1, got ", *value));
  }
  value = CheckRange(name, *value, 0, std::numeric_limits<uint32_t>::max());
  if (!value.ok()) return value.status();
  return std::optional<uint32_t>(static_cast<uint32_t>(*value));
}

// An int32 field's value of flag `name`.
[[nodiscard]] absl::StatusOr<int32_t> Int32Value(const std::string& name, const std::string& text) {
  absl::StatusOr<int64_t> value = ParseIntValue(name, text);
  if (!value.ok()) return value.status();
  value = CheckRange(name, *value, std::numeric_limits<int32_t>::min(),
                     std::numeric_limits<int32_t>::max());
  if (!value.ok()) return value.status();
  return static_cast<int32_t>(*value);
}

// A float flag; `*out` is left alone when the flag is absent.
template <typename T>
[[nodiscard]] absl::Status GetFloat(const ParsedArgs& parsed, const std::string& name, T* out) {
  if (!parsed.Has(name)) return absl::OkStatus();
  absl::StatusOr<double> value = parsed.GetDouble(name, 0);
  if (!value.ok()) return value.status();
  *out = static_cast<float>(*value);
  return absl::OkStatus();
}

// "ID=BIAS" values of --logit-bias into `out`, one per id.
[[nodiscard]] absl::Status ParseLogitBias(const std::vector<std::string>& values,
                                          std::map<int32_t, float>* out) {
  for (const std::string& v : values) {
    const size_t eq = v.find('=');
    if (eq == std::string::npos) {
      return absl::InvalidArgumentError(
          absl::StrCat("--logit-bias: expected ID=BIAS, got '", v, "'"));
    }
    absl::StatusOr<int32_t> id = Int32Value("logit-bias", v.substr(0, eq));
    if (!id.ok()) return id.status();
    absl::StatusOr<double> bias = ParseDoubleValue("logit-bias", v.substr(eq + 1));
    if (!bias.ok()) return bias.status();
    if (!out->emplace(*id, static_cast<float>(*bias)).second) {
      return absl::InvalidArgumentError(
          absl::StrCat("--logit-bias: token id ", *id, " given more than once"));
    }
  }
  return absl::OkStatus();
}

// The JSON of a logprob: the float's shortest round-trip decimal as a
// double (so -0.1f is written -0.1, not -0.10000000149011612); null when
// not finite.
nlohmann::ordered_json FloatJson(float v) {
  if (!std::isfinite(v)) return nullptr;
  char buf[32];
  const std::to_chars_result end = std::to_chars(buf, buf + sizeof(buf), v);
  double d = v;
  std::from_chars(buf, end.ptr, d);
  return d;
}

// The flag of each GenerateRequest field that the servers' range checks
// name at the start of their messages.
constexpr std::pair<absl::string_view, absl::string_view> kFieldFlags[] = {
    {"max_tokens", "max-tokens"},
    {"temperature", "temperature"},
    {"top_p", "top-p"},
    {"min_p", "min-p"},
    {"repetition_penalty", "repetition-penalty"},
    {"presence_penalty", "presence-penalty"},
    {"frequency_penalty", "frequency-penalty"},
    {"logprobs", "logprobs"},
    {"logit_bias", "logit-bias"},
    {"n", "n"},
    {"min_tokens", "min-tokens"},
    {"stop_token_ids", "stop-token-id"},
    {"stop", "stop"}};

// A server check's INVALID_ARGUMENT with its field named by the flag:
// "top_p: must be in (0, 1], got 2" -> "--top-p: must be in (0, 1], got 2";
// "logit_bias[5]: ..." -> "--logit-bias: logit_bias[5]: ...".
[[nodiscard]] absl::Status NameTheFlag(const absl::Status& s) {
  const absl::string_view m = s.message();
  for (const auto& [field, flag] : kFieldFlags) {
    if (absl::StartsWith(m, absl::StrCat(field, ": "))) {
      return absl::InvalidArgumentError(absl::StrCat("--", flag, m.substr(field.size())));
    }
    if (absl::StartsWith(m, absl::StrCat(field, "["))) {
      return absl::InvalidArgumentError(absl::StrCat("--", flag, ": ", m));
    }
  }
  return s;
}

// The router's range checks on `r` (RouterService::Validate runs the same
// functions, in this order), minus what needs the model: the context
// length and the vocabulary's upper bound. Token ids are checked for >= 0.
[[nodiscard]] absl::Status CheckRanges(const tandem::v1::GenerateRequest& r) {
  if (r.max_tokens() < 1) {
    // core::ValidateGeneration's first range check; the rest of it needs
    // the tokenized prompt.
    return absl::InvalidArgumentError(
        absl::StrCat("--max-tokens: must be >= 1, got ", r.max_tokens()));
  }
  for (int32_t id : r.stop_token_ids()) {
    if (id < 0) {
      return absl::InvalidArgumentError(
          absl::StrCat("--stop-token-id: a token id is >= 0, got ", id));
    }
  }
  for (const auto& entry : r.sampling().logit_bias()) {
    if (entry.first < 0) {
      return absl::InvalidArgumentError(
          absl::StrCat("--logit-bias: a token id is >= 0, got ", entry.first));
    }
  }
  // Every id the flags can carry lies in a vocabulary this large.
  constexpr int32_t kAnyVocabulary = std::numeric_limits<int32_t>::max();
  absl::Status s =
      sampling::Validate(SamplingFromProto(r.sampling(), r.logprobs()), kAnyVocabulary);
  if (s.ok()) s = router::ValidateStopStrings({r.stop().begin(), r.stop().end()});
  if (s.ok()) {
    const std::vector<int32_t> stop_ids(r.stop_token_ids().begin(), r.stop_token_ids().end());
    s = core::ValidateControls(r.has_n() ? int64_t{r.n()} : 1, r.min_tokens(), r.max_tokens(),
                               stop_ids, kAnyVocabulary);
  }
  return s.ok() ? s : NameTheFlag(s);
}

nlohmann::ordered_json StopReasonJson(const tandem::v1::StopReason& r) {
  switch (r.kind_case()) {
    case tandem::v1::StopReason::kText:
      return r.text();
    case tandem::v1::StopReason::kTokenId:
      return r.token_id();
    case tandem::v1::StopReason::KIND_NOT_SET:
      break;
  }
  return nullptr;
}

}  // namespace

absl::StatusOr<GenerateOptions> ParseGenerateArgs(const std::vector<std::string>& args) {
  absl::StatusOr<ParsedArgs> parsed = ParseArgs(args, {{"router"},
                                                       {"api-key"},
                                                       {"max-tokens"},
                                                       {"temperature"},
                                                       {"top-k"},
                                                       {"top-p"},
                                                       {"seed"},
                                                       {"route"},
                                                       {"chat", false},
                                                       {"json", false},
                                                       {"timeout-ms"},
                                                       {"stop", true, true},
                                                       {"stop-token-id", true, true},
                                                       {"include-stop-str", false},
                                                       {"ignore-eos", false},
                                                       {"min-tokens"},
                                                       {"logprobs"},
                                                       {"n"},
                                                       {"min-p"},
                                                       {"repetition-penalty"},
                                                       {"presence-penalty"},
                                                       {"frequency-penalty"},
                                                       {"logit-bias", true, true}});
  if (!parsed.ok()) return parsed.status();
  GenerateOptions o;
  if (absl::Status s = ReadRouterFlags(*parsed, &o.router, &o.api_key); !s.ok()) return s;
  o.json = parsed->Has("json");
  o.chat = parsed->Has("chat");
  o.include_stop_str = parsed->Has("include-stop-str");
  o.ignore_eos = parsed->Has("ignore-eos");

  // The syntax and the field's type here; the router's value ranges at the
  // end (CheckRanges), on the request that would be sent.
  absl::StatusOr<std::optional<uint32_t>> max_tokens = OptionalUint32(*parsed, "max-tokens");
  if (!max_tokens.ok()) return max_tokens.status();
  o.max_tokens = max_tokens->value_or(o.max_tokens);
  absl::StatusOr<std::optional<uint32_t>> min_tokens = OptionalUint32(*parsed, "min-tokens");
  if (!min_tokens.ok()) return min_tokens.status();
  o.min_tokens = min_tokens->value_or(0);
  absl::StatusOr<std::optional<uint32_t>> logprobs = OptionalUint32(*parsed, "logprobs");
  if (!logprobs.ok()) return logprobs.status();
  o.logprobs = *logprobs;
  absl::StatusOr<std::optional<uint32_t>> n = OptionalUint32(*parsed, "n");
  if (!n.ok()) return n.status();
  o.n = *n;

  for (absl::Status s : {GetFloat(*parsed, "temperature", &o.temperature),
                         GetFloat(*parsed, "top-p", &o.top_p), GetFloat(*parsed, "min-p", &o.min_p),
                         GetFloat(*parsed, "repetition-penalty", &o.repetition_penalty),
                         GetFloat(*parsed, "presence-penalty", &o.presence_penalty),
                         GetFloat(*parsed, "frequency-penalty", &o.frequency_penalty)}) {
    if (!s.ok()) return s;
  }
  if (parsed->Has("top-k")) {
    absl::StatusOr<int32_t> top_k = Int32Value("top-k", parsed->GetString("top-k", ""));
    if (!top_k.ok()) return top_k.status();
    o.top_k = *top_k;
  }
  if (parsed->Has("seed")) {
    absl::StatusOr<uint64_t> seed = parsed->GetUint("seed", 0);
    if (!seed.ok()) return seed.status();
    o.seed = *seed;
  }
  absl::StatusOr<int64_t> timeout_ms = parsed->GetInt("timeout-ms", o.timeout_ms);
  if (!timeout_ms.ok()) return timeout_ms.status();
  if (*timeout_ms < 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("--timeout-ms: must be >= 0, got ", *timeout_ms));
  }
  o.timeout_ms = *timeout_ms;

  for (const std::string& id : parsed->GetAll("stop-token-id")) {
    absl::StatusOr<int32_t> value = Int32Value("stop-token-id", id);
    if (!value.ok()) return value.status();
    o.stop_token_ids.push_back(*value);
  }
  if (absl::Status s = ParseLogitBias(parsed->GetAll("logit-bias"), &o.logit_bias); !s.ok()) {
    return s;
  }
  o.stop = parsed->GetAll("stop");
  // A protobuf string must be UTF-8: catch it here with one clear line.
  for (const std::string& stop : o.stop) {
    if (tandem::tokenizer::SanitizeUtf8(stop) != stop) {
      return absl::InvalidArgumentError("--stop: not valid UTF-8");
    }
  }

  const std::string route = parsed->GetString("route", "auto");
  if (route == "auto") {
    o.route = tandem::v1::ROUTE_AUTO;
  } else if (route == "local") {
    o.route = tandem::v1::ROUTE_LOCAL;
  } else if (route == "remote") {
    o.route = tandem::v1::ROUTE_REMOTE;
  } else {
    return absl::InvalidArgumentError(
        absl::StrCat("--route: expected auto, local or remote, got '", route, "'"));
  }
  if (parsed->positional().empty()) return absl::InvalidArgumentError("missing PROMPT");
  o.prompt = absl::StrJoin(parsed->positional(), " ");
  if (o.prompt.empty() && !o.chat) {
    // The router's own rule (router/request_prompt.cc).
    return absl::InvalidArgumentError("PROMPT: must not be empty");
  }
  if (tandem::tokenizer::SanitizeUtf8(o.prompt) != o.prompt) {
    return absl::InvalidArgumentError("PROMPT: not valid UTF-8");
  }
  if (absl::Status s = CheckRanges(BuildGenerateRequest(o)); !s.ok()) return s;
  return o;
}

tandem::v1::GenerateRequest BuildGenerateRequest(const GenerateOptions& options) {
  tandem::v1::GenerateRequest request;
  if (options.chat) {
    tandem::v1::ChatMessage* message = request.add_messages();
    message->set_role("user");
    message->set_content(options.prompt);
  } else {
    request.set_prompt(options.prompt);
  }
  request.set_max_tokens(options.max_tokens);
  request.set_route_override(options.route);
  tandem::v1::SamplingParams* sampling = request.mutable_sampling();
  sampling->set_temperature(options.temperature);
  sampling->set_top_k(options.top_k);
  if (options.top_p.has_value()) sampling->set_top_p(*options.top_p);
  if (options.seed.has_value()) {
    sampling->set_seed(*options.seed);
    sampling->set_has_seed(true);
  }
  sampling->set_min_p(options.min_p);
  if (options.repetition_penalty.has_value()) {
    sampling->set_repetition_penalty(*options.repetition_penalty);
  }
  sampling->set_presence_penalty(options.presence_penalty);
  sampling->set_frequency_penalty(options.frequency_penalty);
  sampling->mutable_logit_bias()->insert(options.logit_bias.begin(), options.logit_bias.end());

  request.mutable_stop()->Add(options.stop.begin(), options.stop.end());
  request.mutable_stop_token_ids()->Add(options.stop_token_ids.begin(),
                                        options.stop_token_ids.end());
  request.set_include_stop_str_in_output(options.include_stop_str);
  request.set_ignore_eos(options.ignore_eos);
  request.set_min_tokens(options.min_tokens);
  request.set_logprobs(options.logprobs.value_or(0));
  if (options.n.has_value()) request.set_n(*options.n);
  return request;
}

std::string FinishReasonName(tandem::v1::FinishReason reason) {
  switch (reason) {
    case tandem::v1::FINISH_LENGTH:
      return "length";
    case tandem::v1::FINISH_STOP:
      return "stop";
    case tandem::v1::FINISH_CONTEXT:
      return "context";
    case tandem::v1::FINISH_CANCELLED:
      return "cancelled";
    case tandem::v1::FINISH_NONE:
    case tandem::v1::FinishReason_INT_MIN_SENTINEL_DO_NOT_USE_:
    case tandem::v1::FinishReason_INT_MAX_SENTINEL_DO_NOT_USE_:
      break;
  }
  return "";
}

void GenerateResult::Add(const tandem::v1::GenerateResponse& r, absl::Duration since_start) {
  if (!seen_first_) {
    seen_first_ = true;
    meta_.set_seed(r.seed());  // the seed is on the first message
  }
  if (meta_.request_id().empty()) meta_.set_request_id(r.request_id());
  if (meta_.route().empty()) meta_.set_route(r.route());
  if (meta_.prefill_worker().empty()) meta_.set_prefill_worker(r.prefill_worker());
  if (meta_.decode_worker().empty()) meta_.set_decode_worker(r.decode_worker());
  if (r.finish_reason() != tandem::v1::FINISH_NONE && !r.route().empty()) {
    // A sample's last message names the workers that served it (after a
    // retry or migration the header's first picks are out of date).
    meta_.set_route(r.route());
    meta_.set_prefill_worker(r.prefill_worker());
    meta_.set_decode_worker(r.decode_worker());
  }
  if (meta_.prompt_token_ids().empty()) *meta_.mutable_prompt_token_ids() = r.prompt_token_ids();
  if (!ttft_.has_value() && r.tokens_size() > 0) ttft_ = since_start;
  if (r.prompt_tokens() != 0) prompt_tokens_ = r.prompt_tokens();
  if (r.cached_prompt_tokens() != 0) cached_prompt_tokens_ = r.cached_prompt_tokens();

  if (r.sample_index() >= samples_.size()) samples_.resize(r.sample_index() + size_t{1});
  Sample& s = samples_[r.sample_index()];
  s.tokens.insert(s.tokens.end(), r.tokens().begin(), r.tokens().end());
  s.text += r.text();
  if (r.finish_reason() != tandem::v1::FINISH_NONE) s.finish_reason = r.finish_reason();
  if (r.finish_reason() != tandem::v1::FINISH_NONE && r.sample_index() == 0) {
    if (r.has_placement()) placement_ = r.placement();
    if (r.has_timing()) server_timing_ = r.timing();
  }
  if (r.has_stop_reason()) s.stop_reason = r.stop_reason();
  if (r.completion_tokens() != 0) s.completion_tokens = r.completion_tokens();
}

const GenerateResult::Sample& GenerateResult::SampleAt(uint32_t sample) const {
  static const Sample* const kEmpty = new Sample();
  return sample < samples_.size() ? samples_[sample] : *kEmpty;
}

std::string GenerateResult::text(uint32_t sample) const { return SampleAt(sample).text; }

tandem::v1::FinishReason GenerateResult::finish_reason(uint32_t sample) const {
  return SampleAt(sample).finish_reason;
}

size_t GenerateResult::CompletionTokens(const Sample& s) {
  return s.completion_tokens != 0 ? s.completion_tokens : s.tokens.size();
}

void GenerateResult::AddSampleFields(const Sample& s, nlohmann::ordered_json* j) {
  std::vector<int32_t> ids;
  for (const tandem::v1::TokenOutput& t : s.tokens) ids.push_back(t.token_id());
  (*j)["token_ids"] = ids;
  (*j)["text"] = s.text;
  const std::string finish = FinishReasonName(s.finish_reason);
  (*j)["finish_reason"] =
      finish.empty() ? nlohmann::ordered_json(nullptr) : nlohmann::ordered_json(finish);
  (*j)["stop_reason"] = StopReasonJson(s.stop_reason);
}

nlohmann::ordered_json GenerateResult::LogprobsJson(const Sample& s) {
  nlohmann::ordered_json logprobs = nlohmann::ordered_json::array();
  for (const tandem::v1::TokenOutput& t : s.tokens) {
    nlohmann::ordered_json top = nlohmann::ordered_json::array();
    for (const tandem::v1::TopLogprob& alt : t.top_logprobs()) {
      top.push_back({{"token_id", alt.token_id()}, {"logprob", FloatJson(alt.logprob())}});
    }
    logprobs.push_back(
        {{"token_id", t.token_id()}, {"logprob", FloatJson(t.logprob())}, {"top_logprobs", top}});
  }
  return logprobs;
}

nlohmann::ordered_json GenerateResult::ToJson() const {
  nlohmann::ordered_json j;
  j["request_id"] = meta_.request_id();
  j["route"] = meta_.route();
  j["prefill_worker"] = meta_.prefill_worker();
  j["decode_worker"] = meta_.decode_worker();
  j["prompt_token_ids"] =
      std::vector<int32_t>(meta_.prompt_token_ids().begin(), meta_.prompt_token_ids().end());
  const Sample& first = SampleAt(0);
  AddSampleFields(first, &j);
  if (with_logprobs_) j["logprobs"] = LogprobsJson(first);
  j["usage"] = {
      {"prompt_tokens", prompt_tokens_ != 0 ? prompt_tokens_ : meta_.prompt_token_ids_size()},
      {"completion_tokens", CompletionTokens(first)},
      {"cached_prompt_tokens", cached_prompt_tokens_}};
  auto ms = [](const std::optional<absl::Duration>& d) {
    return d.has_value() ? nlohmann::ordered_json(ToMs(*d)) : nlohmann::ordered_json(nullptr);
  };
  if (placement_.has_value()) {
    j["placement"] = {{"decision", placement_->decision()},
                      {"ttft_local_ms", placement_->ttft_local_ms()},
                      {"ttft_remote_ms", placement_->ttft_remote_ms()}};
  } else {
    j["placement"] = nullptr;
  }
  nlohmann::ordered_json timing = {{"ttft_ms", ms(ttft_)}, {"e2e_ms", ms(e2e_)}};
  // The server's phases, by RequestTiming field.
  using Field = double (tandem::v1::RequestTiming::*)() const;
  const std::pair<const char*, Field> server_fields[] = {
      {"server_ttft_ms", &tandem::v1::RequestTiming::ttft_ms},
      {"router_queue_ms", &tandem::v1::RequestTiming::router_queue_ms},
      {"placement_ms", &tandem::v1::RequestTiming::placement_ms},
      {"prefill_queue_ms", &tandem::v1::RequestTiming::prefill_queue_ms},
      {"prefill_ms", &tandem::v1::RequestTiming::prefill_ms},
      {"kv_transfer_ms", &tandem::v1::RequestTiming::kv_transfer_ms},
      {"decode_admission_ms", &tandem::v1::RequestTiming::decode_admission_ms},
      {"first_decode_ms", &tandem::v1::RequestTiming::first_decode_ms}};
  for (const auto& [name, field] : server_fields) {
    timing[name] = server_timing_.has_value() ? nlohmann::ordered_json(((*server_timing_).*field)())
                                              : nlohmann::ordered_json(nullptr);
  }
  j["timing"] = std::move(timing);
  j["seed"] = meta_.seed();
  if (n_ > 1) {
    nlohmann::ordered_json samples = nlohmann::ordered_json::array();
    const size_t count = std::max<size_t>(n_, samples_.size());
    for (size_t i = 0; i < count; ++i) {
      const Sample& s = SampleAt(static_cast<uint32_t>(i));
      nlohmann::ordered_json one;
      one["sample_index"] = i;
      AddSampleFields(s, &one);
      one["completion_tokens"] = CompletionTokens(s);
      if (with_logprobs_) one["logprobs"] = LogprobsJson(s);
      samples.push_back(std::move(one));
    }
    j["samples"] = std::move(samples);
  }
  return j;
}

std::string GenerateResult::ToJsonLine() const {
  return ToJson().dump(-1, ' ', false, nlohmann::ordered_json::error_handler_t::replace);
}

int RunGenerate(const std::vector<std::string>& args) {
  absl::StatusOr<GenerateOptions> options = ParseGenerateArgs(args);
  if (!options.ok()) {
    std::cerr << "tandem generate: " << options.status().message() << "\n" << kUsage;
    return 2;
  }
  std::unique_ptr<tandem::v1::Generation::Stub> stub = MakeGenerationStub(options->router);
  grpc::ClientContext context;
  SetApiKey(&context, options->api_key);
  if (options->timeout_ms > 0) {
    context.set_deadline(std::chrono::system_clock::now() +
                         std::chrono::milliseconds(options->timeout_ms));
  }
  const absl::Time start = absl::Now();
  std::unique_ptr<grpc::ClientReader<tandem::v1::GenerateResponse>> reader =
      stub->Generate(&context, BuildGenerateRequest(*options));
  const uint32_t n = options->n.value_or(1);
  GenerateResult result(n, options->logprobs.has_value());
  // n > 1: "[sample S] TEXT" once per sample, when its last message comes.
  const bool per_sample = !options->json && n > 1;
  std::vector<bool> printed;
  auto print_sample = [&](uint32_t sample) {
    if (sample >= printed.size()) printed.resize(sample + size_t{1}, false);
    if (printed[sample]) return;
    printed[sample] = true;
    const std::string line = absl::StrCat("[sample ", sample, "] ", result.text(sample), "\n");
    std::fwrite(line.data(), 1, line.size(), stdout);
    std::fflush(stdout);
  };
  tandem::v1::GenerateResponse response;
  bool wrote_text = false;
  while (reader->Read(&response)) {
    result.Add(response, absl::Now() - start);
    if (per_sample) {
      if (response.finish_reason() != tandem::v1::FINISH_NONE) {
        print_sample(response.sample_index());
      }
    } else if (!options->json && !response.text().empty()) {
      std::fwrite(response.text().data(), 1, response.text().size(), stdout);
      std::fflush(stdout);
      wrote_text = true;
    }
  }
  const grpc::Status status = reader->Finish();
  result.Finish(absl::Now() - start);
  if (!options->json && wrote_text) {
    std::fputc('\n', stdout);
    std::fflush(stdout);
  }
  if (!status.ok()) {
    std::cerr << GrpcErrorLine(status);
    // The router's admission control says when to come back.
    const auto& trailers = context.GetServerTrailingMetadata();
    if (auto it = trailers.find("retry-after-ms"); it != trailers.end()) {
      std::cerr << " (retry after " << std::string(it->second.data(), it->second.size()) << " ms)";
    }
    std::cerr << "\n";
    return 1;
  }
  if (per_sample) {
    // Samples the stream ended without finishing, in index order.
    for (uint32_t s = 0; s < n; ++s) print_sample(s);
  }
  if (options->json) {
    std::fprintf(stdout, "%s\n", result.ToJsonLine().c_str());
    std::fflush(stdout);
  }
  return 0;
}

}  // namespace tandem::cli
