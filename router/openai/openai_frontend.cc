#include "router/openai/openai_frontend.h"

#include <optional>

#include <chrono>
#include <ctime>

#include "absl/random/random.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/time/clock.h"
#include "common/server/log.h"
#include "nlohmann/json.hpp"

namespace tandem::router::openai {
namespace {

constexpr char kJson[] = "application/json";
constexpr size_t kMaxClientIdBytes = 128;

// X-Request-Id: visible ASCII only (it is logged and echoed in a header).
bool ValidClientId(const std::string& id) {
  if (id.empty() || id.size() > kMaxClientIdBytes) return false;
  for (unsigned char c : id) {
    if (c < 0x21 || c > 0x7e) return false;
  }
  return true;
}

std::string MintClientId() {
  static absl::Mutex mu;
  static absl::BitGen gen;
  absl::MutexLock lock(&mu);
  return absl::StrFormat("http-%016x%016x", absl::Uniform<uint64_t>(gen),
                         absl::Uniform<uint64_t>(gen));
}

// Answers `error` in OpenAI's shape (Retry-After in whole seconds, rounded
// up, when the router gave a hint).
void RespondError(http::Exchange& exchange, const ApiError& error, const std::string& client_id) {
  http::Headers headers = {{"Content-Type", kJson}};
  if (!client_id.empty()) headers.push_back({"X-Request-Id", client_id});
  if (error.retry_after_ms >= 0) {
    headers.push_back({"Retry-After", absl::StrCat((error.retry_after_ms + 999) / 1000)});
  }
  exchange.Respond(error.http_status, std::move(headers), ErrorBody(error));
}

ApiError FromStatus(const absl::Status& status) {
  return FromRpcError(static_cast<int>(status.code()),
                      std::string_view(status.message().data(), status.message().size()), -1);
}

int64_t UnixSeconds() { return absl::ToUnixSeconds(absl::Now()); }

// The served model as OpenAI's model object (vLLM's max_model_len added).
nlohmann::json ModelJson(const ModelLimits& limits, int64_t created_s) {
  return {{"id", limits.served_model_name},
          {"object", "model"},
          {"created", created_s},
          {"owned_by", "tandem"},
          {"max_model_len", limits.context_length}};
}

// GET /v1/models: the list of the one served model.
std::string ModelsBody(const ModelLimits& limits, int64_t created_s) {
  return nlohmann::json{{"object", "list"},
                        {"data", nlohmann::json::array({ModelJson(limits, created_s)})}}
      .dump();
}

}  // namespace

// One HTTP generation request as a gRPC Generate client call. Owns itself
// from Start to OnDone (self_).
class OpenAiFrontend::Call final : public grpc::ClientReadReactor<v1::GenerateResponse>,
                                   public std::enable_shared_from_this<Call> {
 public:
  Call(ParsedRequest parsed, std::shared_ptr<http::Exchange> exchange, std::string client_id,
       std::string model, TokenBytes token_bytes, std::shared_ptr<std::atomic<int>> open_streams,
       std::shared_ptr<std::atomic<int>> calls)
      : parsed_(std::move(parsed)),
        exchange_(std::move(exchange)),
        client_id_(std::move(client_id)),
        builder_(parsed_, UnixSeconds(), std::move(model), std::move(token_bytes)),
        open_streams_(std::move(open_streams)),
        calls_(std::move(calls)),
        last_send_(absl::Now()) {}

  void Start(v1::Generation::Stub* stub, const std::string& authorization) {
    self_ = shared_from_this();
    calls_->fetch_add(1);
    if (!authorization.empty()) context_.AddMetadata("authorization", authorization);
    stub->async()->Generate(&context_, &parsed_.request, this);
    StartRead(&message_);
    StartCall();
  }

  // The client went away (or the server stops): the router cancels the
  // request on P and D.
  void Cancel() { context_.TryCancel(); }

  // The client went away: logged, then Cancel.
  void ClientGone() {
    rpc::Log(absl::StrCat("http request ", client_id_, ": the client went away; cancelling"));
    Cancel();
  }

  // The router stops: the call ends now, answered 503 (OnDone).
  void Shutdown() {
    {
      absl::MutexLock lock(&mu_);
      shutting_down_ = true;
    }
    Cancel();
  }

  bool stream() const { return parsed_.stream; }

  // Keep-alive tick: a stream quiet for `period` gets a comment (starting
  // the SSE response first if no message came yet).
  void KeepAlive(absl::Duration period) {
    absl::MutexLock lock(&mu_);
    if (done_ || !parsed_.stream || absl::Now() - last_send_ < period) return;
    StartStreamLocked();
    SendLocked(": keep-alive\n\n");
  }

  void OnReadDone(bool ok) override {
    if (!ok) return;  // OnDone follows
    {
      absl::MutexLock lock(&mu_);
      if (parsed_.stream) {
        StartStreamLocked();
        for (std::string& chunk : builder_.Chunks(message_)) {
          SendLocked(absl::StrCat("data: ", chunk, "\n\n"));
        }
      } else {
        builder_.Add(message_);
      }
    }
    StartRead(&message_);
  }

  void OnDone(const grpc::Status& status) override {
    std::shared_ptr<Call> self;
    {
      absl::MutexLock lock(&mu_);
      done_ = true;
      self = std::move(self_);
      if (status.ok()) {
        FinishOkLocked();
      } else {
        int64_t retry_after_ms = -1;
        const auto& trailers = context_.GetServerTrailingMetadata();
        if (auto it = trailers.find("retry-after-ms"); it != trailers.end()) {
          int64_t v = 0;
          if (absl::SimpleAtoi(absl::string_view(it->second.data(), it->second.size()), &v)) {
            retry_after_ms = v;
          }
        }
        ApiError error = FromRpcError(status.error_code(), status.error_message(), retry_after_ms);
        if (shutting_down_) {
          error = ApiError();
          error.http_status = 503;
          error.type = "server_error";
          error.message = "router is shutting down";
        }
        if (exchange_->open()) {
          rpc::Log(absl::StrCat("http request ", client_id_, ": ", error.http_status, " ",
                                error.message));
        }
        if (started_) {
          // After the 200: the error as one event, then the stream ends.
          SendLocked(absl::StrCat("data: ", ErrorBody(error), "\n\n"));
          exchange_->EndStream();
        } else {
          RespondError(*exchange_, error, client_id_);
        }
      }
    }
    if (parsed_.stream) open_streams_->fetch_sub(1);
    calls_->fetch_sub(1);
  }

 private:
  void FinishOkLocked() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    if (!parsed_.stream) {
      exchange_->Respond(200, {{"Content-Type", kJson}, {"X-Request-Id", client_id_}},
                         builder_.Body());
      return;
    }
    StartStreamLocked();
    if (parsed_.include_usage) SendLocked(absl::StrCat("data: ", builder_.UsageChunk(), "\n\n"));
    SendLocked("data: [DONE]\n\n");
    exchange_->EndStream();
  }

  void StartStreamLocked() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    if (started_) return;
    started_ = true;
    exchange_->StartStream(200, {{"Content-Type", "text/event-stream"},
                                 {"Cache-Control", "no-cache"},
                                 {"X-Accel-Buffering", "no"},
                                 {"X-Request-Id", client_id_}});
  }

  void SendLocked(std::string chunk) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    last_send_ = absl::Now();
    if (!exchange_->Send(std::move(chunk))) context_.TryCancel();
  }

  ParsedRequest parsed_;
  const std::shared_ptr<http::Exchange> exchange_;
  const std::string client_id_;
  grpc::ClientContext context_;
  v1::GenerateResponse message_;  // the read in flight (one at a time)

  absl::Mutex mu_;
  ResponseBuilder builder_ ABSL_GUARDED_BY(mu_);
  bool started_ ABSL_GUARDED_BY(mu_) = false;  // SSE headers sent
  bool done_ ABSL_GUARDED_BY(mu_) = false;
  bool shutting_down_ ABSL_GUARDED_BY(mu_) = false;
  const std::shared_ptr<std::atomic<int>> open_streams_;
  const std::shared_ptr<std::atomic<int>> calls_;
  absl::Time last_send_ ABSL_GUARDED_BY(mu_);
  std::shared_ptr<Call> self_;  // set by Start, released by OnDone
};

OpenAiFrontend::OpenAiFrontend(Options options, Router router)
    : options_(std::move(options)),
      router_(std::move(router)),
      started_s_(UnixSeconds()),
      stub_(v1::Generation::NewStub(router_.channel)),
      server_(std::make_unique<http::HttpServer>(options_.http)),
      open_streams_(std::make_shared<std::atomic<int>>(0)),
      calls_(std::make_shared<std::atomic<int>>(0)),
      workers_(std::make_unique<WorkQueue>(options_.request_threads)) {
  const std::string models_prefix = "/v1/models/";
  // The HTTP server's own answers: 404, 405, 408 (read timeout), 413
  // (body over router.http_max_body_bytes).
  server_->set_fallback_body(
      [models_prefix](int status, const std::string& path, const std::string& message) {
        ApiError e;
        e.http_status = status;
        if (status == 404 && path.rfind(models_prefix, 0) == 0) {
          // GET /v1/models/{id} of a model this router does not serve.
          e.param = "model";
          e.code = "model_not_found";
          e.message =
              absl::StrCat("The model '", path.substr(models_prefix.size()), "' does not exist");
          return ErrorBody(e);
        }
        if (status == 401) return ErrorBody(FromStatus(absl::UnauthenticatedError(message)));
        e.type = status == 404 ? "not_found_error" : "invalid_request_error";
        switch (status) {
          case 404:
            e.message = absl::StrCat("no route ", path);
            break;
          case 405:
            e.message = absl::StrCat("method not allowed for ", path);
            break;
          case 408:
            e.message = absl::StrCat(message, " (router.http_read_timeout_ms)");
            e.code = "request_timeout";
            break;
          case 413:
            e.message = absl::StrCat(message, " (router.http_max_body_bytes)");
            e.code = "request_too_large";
            break;
          default:
            e.message = message;
            break;
        }
        return ErrorBody(e);
      });
  // With API keys, a request no route takes (an unknown path or model, a
  // wrong method) is refused 401 without a valid key, as OpenAI does: a
  // 404 would tell a client without a key which models exist.
  server_->set_unrouted_guard(
      [this](const std::string&,
             const std::string* authorization) -> std::optional<std::pair<int, std::string>> {
        if (!router_.authenticate) return std::nullopt;
        absl::Status s = router_.authenticate(authorization);
        if (s.ok()) return std::nullopt;
        return std::make_pair(401, std::string(s.message()));
      });
  // GET /v1/models/{id} (OpenAI's "retrieve model") for the served model.
  server_->Handle("GET", models_prefix + options_.limits.served_model_name,
                  [this](std::shared_ptr<http::Exchange> e) { HandleModels(std::move(e), true); });
  server_->Handle("POST", "/v1/completions", [this](std::shared_ptr<http::Exchange> e) {
    QueueGenerate(Endpoint::kCompletions, std::move(e));
  });
  server_->Handle("POST", "/v1/chat/completions", [this](std::shared_ptr<http::Exchange> e) {
    QueueGenerate(Endpoint::kChatCompletions, std::move(e));
  });
  server_->Handle("GET", "/v1/models",
                  [this](std::shared_ptr<http::Exchange> e) { HandleModels(std::move(e), false); });
  server_->Handle("GET", "/health", [](std::shared_ptr<http::Exchange> e) {
    e->Respond(200, {{"Content-Type", kJson}}, R"({"status":"ok"})");
  });
  server_->Handle("GET", "/ready", [this](std::shared_ptr<http::Exchange> e) {
    const std::string reason = router_.not_ready();
    e->Respond(reason.empty() ? 200 : 503, {{"Content-Type", kJson}},
               reason.empty() ? std::string(R"({"status":"ready"})")
                              : nlohmann::json{{"status", "not ready"}, {"reason", reason}}.dump());
  });
}

OpenAiFrontend::~OpenAiFrontend() { Stop(); }

absl::StatusOr<int> OpenAiFrontend::Start(const std::string& host, int port) {
  absl::StatusOr<int> bound = server_->Start(host, port);
  if (!bound.ok()) return bound;
  keepalive_ = std::thread([this] { KeepAliveLoop(); });
  return bound;
}

void OpenAiFrontend::Stop() {
  {
    absl::MutexLock lock(&mu_);
    if (stopping_) return;
    stopping_ = true;
  }
  if (keepalive_.joinable()) keepalive_.join();
  // Requests still queued are answered 503 (HandleGenerate sees
  // stopping_); one being parsed starts no call.
  workers_->Stop();
  std::vector<std::shared_ptr<Call>> live;
  {
    absl::MutexLock lock(&mu_);
    for (const std::weak_ptr<Call>& weak : live_calls_) {
      if (std::shared_ptr<Call> call = weak.lock()) live.push_back(std::move(call));
    }
    live_calls_.clear();
  }
  for (const std::shared_ptr<Call>& call : live) call->Shutdown();
  live.clear();
  // The calls end on gRPC threads, answering 503 through the loop thread,
  // which must still run to write it; they hold no pointer to this object.
  const absl::Time deadline = absl::Now() + absl::Seconds(2);
  while (calls_->load() > 0 && absl::Now() < deadline) absl::SleepFor(absl::Milliseconds(5));
  absl::SleepFor(absl::Milliseconds(100));  // the loop thread writes the answers
  server_->Stop();
}

void OpenAiFrontend::KeepAliveLoop() {
  const absl::Duration period = absl::Milliseconds(options_.keepalive_ms);
  absl::MutexLock lock(&mu_);
  while (!stopping_) {
    mu_.AwaitWithTimeout(absl::Condition(&stopping_), period / 4);
    if (stopping_) break;
    std::vector<std::shared_ptr<Call>> live;
    for (auto it = live_calls_.begin(); it != live_calls_.end();) {
      if (std::shared_ptr<Call> call = it->lock()) {
        if (call->stream()) live.push_back(std::move(call));
        ++it;
      } else {
        it = live_calls_.erase(it);
      }
    }
    mu_.Unlock();
    for (const std::shared_ptr<Call>& call : live) call->KeepAlive(period);
    live.clear();
    mu_.Lock();
  }
}

void OpenAiFrontend::QueueGenerate(Endpoint endpoint, std::shared_ptr<http::Exchange> exchange) {
  if (workers_->Post([this, endpoint, exchange] { HandleGenerate(endpoint, exchange); })) return;
  RefuseShuttingDown(*exchange, "");
}

void OpenAiFrontend::HandleGenerate(Endpoint endpoint, std::shared_ptr<http::Exchange> exchange) {
  {
    absl::MutexLock lock(&mu_);
    if (stopping_) {
      RefuseShuttingDown(*exchange, "");
      return;
    }
  }
  if (!exchange->open()) {
    // Gone while its request waited for a worker: nothing to parse.
    if (router_.refused) router_.refused(absl::StatusCode::kCancelled);
    rpc::Log("http request -: the client went away before its request was read");
    return;
  }
  std::string client_id = exchange->header("X-Request-Id");
  if (!client_id.empty() && !ValidClientId(client_id)) {
    ApiError e;
    e.param = "X-Request-Id";
    e.message =
        absl::StrCat("X-Request-Id: must be 1..", kMaxClientIdBytes, " visible ASCII characters");
    Refuse(*exchange, e, "");
    return;
  }
  if (client_id.empty()) client_id = MintClientId();
  const std::string authorization = exchange->header("Authorization");
  if (router_.authenticate) {
    absl::Status s = router_.authenticate(authorization.empty() ? nullptr : &authorization);
    if (!s.ok()) {
      Refuse(*exchange, FromStatus(s), client_id);
      return;
    }
  }
  std::variant<ParsedRequest, ApiError> parsed =
      ParseRequest(endpoint, exchange->body(), options_.limits);
  if (const ApiError* e = std::get_if<ApiError>(&parsed)) {
    Refuse(*exchange, *e, client_id);
    return;
  }
  ParsedRequest request = std::get<ParsedRequest>(std::move(parsed));
  request.request.set_client_request_id(client_id);
  if (request.request.max_tokens() == 0) {
    // Chat without max_tokens: up to the context (OpenAI's default). The
    // ids replace the messages, so the router does not render and
    // tokenize them again.
    absl::StatusOr<std::vector<int32_t>> ids = router_.prompt_tokens(request.request);
    if (!ids.ok()) {
      Refuse(*exchange, FromStatus(ids.status()), client_id);
      return;
    }
    const int prompt_tokens = static_cast<int>(ids->size());
    const int remaining = options_.limits.context_length - prompt_tokens;
    if (remaining < 1) {
      ApiError e;
      e.param = "messages";
      e.code = "context_length_exceeded";
      e.message = absl::StrCat("messages: the prompt is ", prompt_tokens,
                               " tokens, which leaves no room to generate in the context of ",
                               options_.limits.context_length, " tokens");
      Refuse(*exchange, e, client_id);
      return;
    }
    request.request.set_max_tokens(remaining);
    request.request.clear_messages();
    request.request.mutable_prompt_token_ids()->Assign(ids->begin(), ids->end());
  }
  const bool stream = request.stream;
  if (stream && open_streams_->fetch_add(1) >= options_.http.max_streams) {
    open_streams_->fetch_sub(1);
    ApiError e;
    e.http_status = 503;
    e.type = "server_error";
    e.message = absl::StrCat("too many open streams: ", options_.http.max_streams,
                             " (router.http_max_streams); retry later");
    e.retry_after_ms = 1000;
    Refuse(*exchange, e, client_id);
    return;
  }
  auto call = std::make_shared<Call>(std::move(request), exchange, client_id,
                                     options_.limits.served_model_name, router_.token_bytes,
                                     open_streams_, calls_);
  bool stopping = false;
  {
    absl::MutexLock lock(&mu_);
    stopping = stopping_;
    if (!stopping) live_calls_.push_back(call);
  }
  if (stopping) {  // Stop began while this request was parsed
    if (stream) open_streams_->fetch_sub(1);
    RefuseShuttingDown(*exchange, client_id);
    return;
  }
  exchange->OnClose([weak = std::weak_ptr<Call>(call)] {
    if (std::shared_ptr<Call> c = weak.lock()) c->ClientGone();
  });
  call->Start(stub_.get(), authorization);
}

void OpenAiFrontend::RefuseShuttingDown(http::Exchange& exchange, const std::string& client_id) {
  ApiError e;
  e.http_status = 503;
  e.type = "server_error";
  e.message = "router is shutting down";
  Refuse(exchange, e, client_id);
}

void OpenAiFrontend::Refuse(http::Exchange& exchange, const ApiError& error,
                            const std::string& client_id) {
  if (router_.refused) {
    absl::StatusCode code = absl::StatusCode::kInvalidArgument;
    switch (error.http_status) {
      case 401:
        code = absl::StatusCode::kUnauthenticated;
        break;
      case 404:
        code = absl::StatusCode::kNotFound;
        break;
      case 429:
        code = absl::StatusCode::kResourceExhausted;
        break;
      case 503:
        code = absl::StatusCode::kUnavailable;
        break;
      default:
        break;
    }
    router_.refused(code);
  }
  rpc::Log(absl::StrCat("http request ", client_id.empty() ? "-" : client_id, ": ",
                        error.http_status, " ", error.message));
  RespondError(exchange, error, client_id);
}

bool OpenAiFrontend::Authenticated(http::Exchange& exchange) {
  if (!router_.authenticate) return true;
  const std::string authorization = exchange.header("Authorization");
  absl::Status s = router_.authenticate(authorization.empty() ? nullptr : &authorization);
  if (s.ok()) return true;
  RespondError(exchange, FromStatus(s), "");
  return false;
}

void OpenAiFrontend::HandleBehindKeys(const std::string& method, const std::string& path,
                                      http::Handler handler) {
  server_->Handle(method, path,
                  [this, handler = std::move(handler)](std::shared_ptr<http::Exchange> e) {
                    if (Authenticated(*e)) handler(std::move(e));
                  });
}

void OpenAiFrontend::HandleModels(std::shared_ptr<http::Exchange> exchange, bool one) {
  if (!Authenticated(*exchange)) return;
  exchange->Respond(200, {{"Content-Type", kJson}},
                    one ? ModelJson(options_.limits, started_s_).dump()
                        : ModelsBody(options_.limits, started_s_));
}

}  // namespace tandem::router::openai
