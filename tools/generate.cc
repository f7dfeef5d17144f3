#include "tools/generate.h"

#include <cstdio>
#include <iostream>
#include <limits>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "tools/cli_args.h"
#include "engine/tokenizer/tokenizer.h"
#include "tools/router_client.h"

namespace tandem::cli {
namespace {

constexpr char kUsage[] =
    "usage: tandem generate [--router H:P] [--max-tokens N] [--temperature T] [--top-k K]\n"
    "                       [--top-p P] [--seed S] [--route auto|local|remote] [--chat]\n"
    "                       [--json] [--timeout-ms MS] PROMPT\n"
    "  --chat: send PROMPT as one user message, rendered with the model's chat template\n";

double ToMs(absl::Duration d) { return absl::ToDoubleMilliseconds(d); }

}  // namespace

absl::StatusOr<GenerateOptions> ParseGenerateArgs(const std::vector<std::string>& args) {
  absl::StatusOr<ParsedArgs> parsed =
      ParseArgs(args, {{"router"}, {"max-tokens"}, {"temperature"}, {"top-k"}, {"top-p"},
                       {"seed"}, {"route"}, {"chat", false}, {"json", false}, {"timeout-ms"}});
  if (!parsed.ok()) return parsed.status();
  GenerateOptions o;
  o.router = parsed->GetString("router", o.router);
  if (absl::Status s = CheckRouterAddress(o.router); !s.ok()) return s;
  o.json = parsed->Has("json");
  o.chat = parsed->Has("chat");

  absl::StatusOr<int64_t> max_tokens = parsed->GetInt("max-tokens", o.max_tokens);
  if (!max_tokens.ok()) return max_tokens.status();
  // 0 fits the field and is the router's to reject, like every other range.
  if (*max_tokens < 0 || *max_tokens > std::numeric_limits<uint32_t>::max()) {
    return absl::InvalidArgumentError(
        absl::StrCat("--max-tokens: must be in 0..4294967295, got ", *max_tokens));
  }
  o.max_tokens = static_cast<uint32_t>(*max_tokens);

  // Range checks of the sampling values are the router's (one place for
  // every client); here only the syntax.
  absl::StatusOr<double> temperature = parsed->GetDouble("temperature", 0);
  if (!temperature.ok()) return temperature.status();
  o.temperature = static_cast<float>(*temperature);
  if (parsed->Has("top-p")) {
    absl::StatusOr<double> top_p = parsed->GetDouble("top-p", 0);
    if (!top_p.ok()) return top_p.status();
    o.top_p = static_cast<float>(*top_p);
  }
  absl::StatusOr<int64_t> top_k = parsed->GetInt("top-k", 0);
  if (!top_k.ok()) return top_k.status();
  if (*top_k > std::numeric_limits<int32_t>::max() || *top_k < std::numeric_limits<int32_t>::min()) {
    return absl::InvalidArgumentError(absl::StrCat("--top-k: out of range, got ", *top_k));
  }
  o.top_k = static_cast<int32_t>(*top_k);
  if (parsed->Has("seed")) {
    absl::StatusOr<uint64_t> seed = parsed->GetUint("seed", 0);
    if (!seed.ok()) return seed.status();
    o.seed = *seed;
  }
  absl::StatusOr<int64_t> timeout_ms = parsed->GetInt("timeout-ms", o.timeout_ms);
  if (!timeout_ms.ok()) return timeout_ms.status();
  if (*timeout_ms < 0) {
    return absl::InvalidArgumentError(absl::StrCat("--timeout-ms: must be >= 0, got ", *timeout_ms));
  }
  o.timeout_ms = *timeout_ms;

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
  // A protobuf string must be UTF-8: catch it here with one clear line.
  if (tandem::tokenizer::SanitizeUtf8(o.prompt) != o.prompt) {
    return absl::InvalidArgumentError("PROMPT: not valid UTF-8");
  }
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
  if (meta_.prompt_token_ids().empty()) *meta_.mutable_prompt_token_ids() = r.prompt_token_ids();
  for (const tandem::v1::TokenOutput& t : r.tokens()) token_ids_.push_back(t.token_id());
  if (!ttft_.has_value() && r.tokens_size() > 0) ttft_ = since_start;
  text_ += r.text();
  if (r.finish_reason() != tandem::v1::FINISH_NONE) finish_reason_ = r.finish_reason();
  if (r.prompt_tokens() != 0) prompt_tokens_ = r.prompt_tokens();
  if (r.completion_tokens() != 0) completion_tokens_ = r.completion_tokens();
  if (r.cached_prompt_tokens() != 0) cached_prompt_tokens_ = r.cached_prompt_tokens();
}

nlohmann::ordered_json GenerateResult::ToJson() const {
  nlohmann::ordered_json j;
  j["request_id"] = meta_.request_id();
  j["route"] = meta_.route();
  j["prefill_worker"] = meta_.prefill_worker();
  j["decode_worker"] = meta_.decode_worker();
  j["prompt_token_ids"] =
      std::vector<int32_t>(meta_.prompt_token_ids().begin(), meta_.prompt_token_ids().end());
  j["token_ids"] = token_ids_;
  j["text"] = text_;
  const std::string finish = FinishReasonName(finish_reason_);
  j["finish_reason"] = finish.empty() ? nlohmann::ordered_json(nullptr) : nlohmann::ordered_json(finish);
  j["usage"] = {
      {"prompt_tokens", prompt_tokens_ != 0 ? prompt_tokens_ : meta_.prompt_token_ids_size()},
      {"completion_tokens", completion_tokens_ != 0 ? completion_tokens_ : token_ids_.size()},
      {"cached_prompt_tokens", cached_prompt_tokens_}};
  auto ms = [](const std::optional<absl::Duration>& d) {
    return d.has_value() ? nlohmann::ordered_json(ToMs(*d)) : nlohmann::ordered_json(nullptr);
  };
  j["timing"] = {{"ttft_ms", ms(ttft_)}, {"e2e_ms", ms(e2e_)}};
  j["seed"] = meta_.seed();
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
  if (options->timeout_ms > 0) {
    context.set_deadline(std::chrono::system_clock::now() +
                         std::chrono::milliseconds(options->timeout_ms));
  }
  const absl::Time start = absl::Now();
  std::unique_ptr<grpc::ClientReader<tandem::v1::GenerateResponse>> reader =
      stub->Generate(&context, BuildGenerateRequest(*options));
  GenerateResult result;
  tandem::v1::GenerateResponse response;
  bool wrote_text = false;
  while (reader->Read(&response)) {
    result.Add(response, absl::Now() - start);
    if (!options->json && !response.text().empty()) {
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
    std::cerr << GrpcErrorLine(status) << "\n";
    return 1;
  }
  if (options->json) {
    std::fprintf(stdout, "%s\n", result.ToJsonLine().c_str());
    std::fflush(stdout);
  }
  return 0;
}

}  // namespace tandem::cli
