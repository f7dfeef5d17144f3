#include "tools/bench/openai_backend.h"

#include <httplib.h>

#include <chrono>
#include <system_error>
#include <thread>
#include <utility>

#include "absl/status/status.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "absl/strings/string_view.h"
#include "common/host_port.h"
#include "nlohmann/json.hpp"
#include "tools/bench/clock.h"

namespace tandem::bench {
namespace {

constexpr size_t kExcerptBytes = 200;  // of an error body or a bad chunk

std::string Excerpt(absl::string_view text) { return std::string(text.substr(0, kExcerptBytes)); }

// What one request's stream has read so far.
struct StreamState {
  Clock::time_point start;
  Clock::time_point last_chunk;
  int32_t chunks = 0;         // token-bearing chunks
  int32_t usage_tokens = -1;  // usage.completion_tokens, when seen
  bool saw_done = false;
  std::string failure;  // "" or the output's error
  std::string pending;  // bytes after the last complete event
};

// Handles one complete SSE event (the lines between blank lines).
void OnEvent(absl::string_view event, RequestOutput* out, StreamState* s) {
  for (absl::string_view line : absl::StrSplit(event, '\n')) {
    if (!line.empty() && line.back() == '\r') line.remove_suffix(1);
    if (!absl::ConsumePrefix(&line, "data:")) continue;  // comments, other fields
    absl::ConsumePrefix(&line, " ");
    absl::StatusOr<SseChunk> chunk = ParseSseChunk(std::string(line));
    if (!chunk.ok()) {
      s->failure = absl::StrCat("INTERNAL: ", chunk.status().message());
      return;
    }
    if (chunk->done) {
      s->saw_done = true;
      return;
    }
    if (!chunk->error.empty()) {
      s->failure = absl::StrCat("INTERNAL: ", chunk->error);
      return;
    }
    if (chunk->token_bearing()) {
      const Clock::time_point now = Clock::now();
      if (s->chunks == 0) {
        out->ttft_s = SecondsBetween(s->start, now);
      } else {
        out->itl_s.push_back(SecondsBetween(s->last_chunk, now));
      }
      s->last_chunk = now;
      ++s->chunks;
      out->generated_text += chunk->text;
    }
    if (chunk->completion_tokens >= 0) s->usage_tokens = chunk->completion_tokens;
    if (chunk->prompt_tokens >= 0) out->prompt_len = chunk->prompt_tokens;
  }
}

}  // namespace

absl::StatusOr<SseChunk> ParseSseChunk(const std::string& payload) {
  SseChunk c;
  if (payload == "[DONE]") {
    c.done = true;
    return c;
  }
  const nlohmann::json j = nlohmann::json::parse(payload, nullptr, /*allow_exceptions=*/false);
  if (!j.is_object()) {
    return absl::InvalidArgumentError(
        absl::StrCat("server-sent event is not a JSON object: ", Excerpt(payload)));
  }
  if (auto e = j.find("error"); e != j.end() && !e->is_null()) {
    c.error = e->is_object() && e->contains("message") && (*e)["message"].is_string()
                  ? (*e)["message"].get<std::string>()
                  : Excerpt(e->dump());
    return c;
  }
  if (auto ch = j.find("choices"); ch != j.end() && ch->is_array() && !ch->empty()) {
    c.has_choice = true;
    const nlohmann::json& first = (*ch)[0];
    if (first.is_object() && first.contains("text") && first["text"].is_string()) {
      c.text = first["text"].get<std::string>();
    }
    c.finished =
        first.is_object() && first.contains("finish_reason") && !first["finish_reason"].is_null();
  }
  if (auto u = j.find("usage"); u != j.end() && u->is_object()) {
    if (u->contains("completion_tokens") && (*u)["completion_tokens"].is_number_integer()) {
      c.completion_tokens = (*u)["completion_tokens"].get<int32_t>();
    }
    if (u->contains("prompt_tokens") && (*u)["prompt_tokens"].is_number_integer()) {
      c.prompt_tokens = (*u)["prompt_tokens"].get<int32_t>();
    }
  }
  return c;
}

absl::StatusOr<std::unique_ptr<OpenAiBackend>> OpenAiBackend::Create(
    const OpenAiBackendOptions& options) {
  absl::string_view rest = options.base_url;
  if (!absl::ConsumePrefix(&rest, "http://")) {
    return absl::InvalidArgumentError(
        absl::StrCat("--base-url: expected http://HOST:PORT (https is not supported), got '",
                     options.base_url, "'"));
  }
  absl::ConsumeSuffix(&rest, "/");
  absl::StatusOr<HostPort> hp = ParseHostPort(std::string(rest), "--base-url");
  if (!hp.ok()) return hp.status();
  if (hp->port == 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("--base-url: port must be in 1..65535, got '", options.base_url, "'"));
  }
  if (options.model.empty()) {
    return absl::InvalidArgumentError(
        "--model: required with --backend openai (see GET /v1/models)");
  }
  if (options.timeout_ms < 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("--timeout-ms: must be >= 0, got ", options.timeout_ms));
  }
  OpenAiBackendOptions o = options;
  o.base_url = absl::StrCat("http://", rest);
  return std::unique_ptr<OpenAiBackend>(new OpenAiBackend(o));
}

OpenAiBackend::~OpenAiBackend() {
  absl::MutexLock lock(&mu_);
  mu_.Await(absl::Condition(
      +[](int64_t* n) { return *n == 0; }, &in_flight_));
}

void OpenAiBackend::Send(const BenchRequest& request, std::function<void(RequestOutput)> done) {
  {
    absl::MutexLock lock(&mu_);
    ++in_flight_;
  }
  // `done` is shared so that it is still ours when std::thread throws.
  auto shared_done = std::make_shared<std::function<void(RequestOutput)>>(std::move(done));
  try {
    std::thread([this, request, shared_done] {
      (*shared_done)(Run(request));
      absl::MutexLock lock(&mu_);
      --in_flight_;
    }).detach();
  } catch (const std::system_error& e) {  // out of threads (ulimit -u, memory)
    RequestOutput out;
    out.prompt_len = request.prompt_len;
    out.error = absl::StrCat("RESOURCE_EXHAUSTED: cannot start a request thread: ", e.what());
    (*shared_done)(std::move(out));
    absl::MutexLock lock(&mu_);
    --in_flight_;
  }
}

RequestOutput OpenAiBackend::Run(const BenchRequest& request) const {
  RequestOutput out;
  out.prompt_len = request.prompt_len;
  nlohmann::json body = {{"model", options_.model}, {"max_tokens", request.output_len},
                         {"temperature", 0},        {"ignore_eos", true},
                         {"stream", true},          {"stream_options", {{"include_usage", true}}}};
  if (!request.prompt_token_ids.empty()) {
    body["prompt"] = request.prompt_token_ids;
  } else {
    body["prompt"] = request.prompt;
  }

  httplib::Client client(options_.base_url);
  // 0 = no deadline: a day stands in for "none" (cpp-httplib's default read
  // timeout is 5 s, shorter than a long generation's gaps may be).
  const std::chrono::milliseconds limit(options_.timeout_ms > 0 ? options_.timeout_ms
                                                                : 24 * 3600 * 1000);
  client.set_connection_timeout(limit);
  client.set_read_timeout(limit);
  client.set_write_timeout(limit);
  if (!options_.api_key.empty()) client.set_bearer_token_auth(options_.api_key);

  StreamState s;
  std::string error_body;
  int status = 0;
  httplib::Request req;
  req.method = "POST";
  req.path = "/v1/completions";
  req.body = body.dump();
  req.set_header("Content-Type", "application/json");
  req.set_header("Accept", "text/event-stream");
  req.response_handler = [&](const httplib::Response& r) {
    status = r.status;
    return true;
  };
  s.start = Clock::now();
  const Clock::time_point deadline = s.start + limit;
  req.content_receiver = [&](const char* data, size_t n, uint64_t, uint64_t) {
    if (status != 200) {
      if (error_body.size() < kExcerptBytes) error_body.append(data, n);
      return true;
    }
    s.pending.append(data, n);
    size_t end;
    while (s.failure.empty() && !s.saw_done &&
           (end = s.pending.find("\n\n")) != std::string::npos) {
      OnEvent(absl::string_view(s.pending).substr(0, end), &out, &s);
      s.pending.erase(0, end + 2);
    }
    if (s.failure.empty() && Clock::now() > deadline) {
      s.failure =
          absl::StrCat("DEADLINE_EXCEEDED: no end of stream within ", options_.timeout_ms, " ms");
    }
    return s.failure.empty() && !s.saw_done;  // false: hang up now
  };
  httplib::Response res;
  httplib::Error error = httplib::Error::Success;
  const bool sent = client.send(req, res, error);
  out.latency_s = SecondsBetween(s.start, Clock::now());

  if (status != 0 && status != 200) {
    out.error = absl::StrCat("HTTP ", status, ": ", Excerpt(error_body));
  } else if (!s.failure.empty()) {
    out.error = s.failure;
  } else if (s.saw_done) {
    out.success = true;  // we hung up after [DONE] (cpp-httplib reports Canceled)
  } else if (!sent && Clock::now() >= deadline) {
    out.error = absl::StrCat("DEADLINE_EXCEEDED: no end of stream within ", options_.timeout_ms,
                             " ms (", httplib::to_string(error), ")");
  } else if (!sent || status == 0) {
    out.error = absl::StrCat("UNAVAILABLE: ", options_.base_url, ": ", httplib::to_string(error));
  } else {
    out.error = "DATA_LOSS: stream ended before [DONE]";
  }
  if (!out.success) return out;
  out.output_tokens = s.usage_tokens >= 0 ? s.usage_tokens : s.chunks;
  return out;
}

}  // namespace tandem::bench
