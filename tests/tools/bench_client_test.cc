// tandem bench's request side: RunBenchmark's schedule with a fake backend
// (concurrency, send times, warm-ups), and GrpcBackend / OpenAiBackend
// against a real cluster on stories260K (tests/integration's LocalCluster
// with the router's HTTP front door) and against a closed port.
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <memory>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/synchronization/mutex.h"
#include "gtest/gtest.h"
#include "grpcpp/grpcpp.h"
#include "httplib.h"
#include "nlohmann/json.hpp"
#include "tests/integration/cluster_fixture.h"
#include "tools/bench/grpc_backend.h"
#include "tools/bench/openai_backend.h"
#include "tools/bench/runner.h"

namespace tandem::bench {
namespace {


// Completes each request after `delay` on its own thread, recording the
// most requests it ever had in flight and the prompt_len of each Send
// (the tests number their requests through prompt_len).
class FakeBackend : public BenchBackend {
 public:
  explicit FakeBackend(std::chrono::milliseconds delay, bool fail = false)
      : delay_(delay), fail_(fail) {}
  ~FakeBackend() override {
    absl::MutexLock lock(&mu_);
    mu_.Await(absl::Condition(+[](int* n) { return *n == 0; }, &in_flight_));
  }
  void Send(const BenchRequest& request, std::function<void(RequestOutput)> done) override {
    {
      absl::MutexLock lock(&mu_);
      ++in_flight_;
      max_in_flight_ = std::max(max_in_flight_, in_flight_);
      sent_ids_.push_back(request.prompt_len);
    }
    std::thread([this, done = std::move(done), output_len = request.output_len] {
      std::this_thread::sleep_for(delay_);
      RequestOutput o;
      o.success = !fail_;
      if (fail_) o.error = "UNAVAILABLE: fake";
      o.output_tokens = output_len;
      {
        absl::MutexLock lock(&mu_);
        --in_flight_;
      }
      done(std::move(o));  // the last use of `this`: the runner then returns
    }).detach();
  }
  int max_in_flight() {
    absl::MutexLock lock(&mu_);
    return max_in_flight_;
  }
  std::vector<int32_t> sent_ids() {
    absl::MutexLock lock(&mu_);
    return sent_ids_;
  }

 private:
  const std::chrono::milliseconds delay_;
  const bool fail_;
  absl::Mutex mu_;
  int in_flight_ = 0;
  int max_in_flight_ = 0;
  std::vector<int32_t> sent_ids_;
};

std::vector<BenchRequest> NumberedRequests(int n) {
  std::vector<BenchRequest> requests(n);
  for (int i = 0; i < n; ++i) {
    requests[i].prompt_token_ids = {1, 2, 3};
    requests[i].prompt_len = 100 + i;  // the request's number, for FakeBackend
    requests[i].output_len = 4;
  }
  return requests;
}

TEST(BenchClientTest, ProgressBarLayout) {
  // 30 * 37 / 40 = 27.75: 27 cells filled.
  EXPECT_EQ(ProgressBar(37, 40, 12.9),
            "  37/40 [" + std::string(27, '#') + std::string(3, '.') + "] 00:12");
  EXPECT_EQ(ProgressBar(3, 40, 0), "   3/40 [##" + std::string(28, '.') + "] 00:00");
  // 3725 s = 1 h 2 min 5 s.
  EXPECT_EQ(ProgressBar(0, 5, 3725.0), "  0/5 [" + std::string(30, '.') + "] 01:02:05");
  EXPECT_EQ(ProgressBar(5, 5, 61), "  5/5 [" + std::string(30, '#') + "] 01:01");
}

TEST(BenchClientTest, MaxConcurrencyTwoNeverHasMoreThanTwoInFlight) {
  FakeBackend backend(std::chrono::milliseconds(100));
  RunOptions options;
  options.max_concurrency = 2;
  options.progress = false;
  absl::StatusOr<RunResult> r = RunBenchmark(backend, NumberedRequests(6), options);
  ASSERT_TRUE(r.ok()) << r.status();
  ASSERT_EQ(r->outputs.size(), 6u);
  for (const RequestOutput& o : r->outputs) EXPECT_TRUE(o.success);
  EXPECT_EQ(backend.max_in_flight(), 2);
  // Sent in request order.
  EXPECT_EQ(backend.sent_ids(), (std::vector<int32_t>{100, 101, 102, 103, 104, 105}));
  // Three waves of two 100 ms requests: requests 2.. start after a slot freed.
  EXPECT_GE(r->outputs[2].start_s, 0.1);
  EXPECT_GE(r->outputs[4].start_s, 0.2);
  EXPECT_GE(r->duration_s, 0.3);
}

TEST(BenchClientTest, NoRequestStartsBeforeItsSendTime) {
  FakeBackend backend(std::chrono::milliseconds(1));
  RunOptions options;
  options.progress = false;
  options.send_times_s = {0.0, 0.05, 0.05, 0.15, 0.3};
  absl::StatusOr<RunResult> r = RunBenchmark(backend, NumberedRequests(5), options);
  ASSERT_TRUE(r.ok()) << r.status();
  ASSERT_EQ(r->outputs.size(), 5u);
  for (size_t i = 0; i < 5; ++i) {
    EXPECT_GE(r->outputs[i].start_s, options.send_times_s[i]) << "request " << i;
  }
  // From the first send (at 0) to the last completion (after 0.3 s).
  EXPECT_GE(r->duration_s, 0.3);
}

TEST(BenchClientTest, TraceTimestampsAreTheSendTimesWhenNoneAreGiven) {
  FakeBackend backend(std::chrono::milliseconds(1));
  std::vector<BenchRequest> requests = NumberedRequests(3);
  requests[1].timestamp_s = 0.1;
  requests[2].timestamp_s = 0.2;
  RunOptions options;
  options.progress = false;
  absl::StatusOr<RunResult> r = RunBenchmark(backend, requests, options);
  ASSERT_TRUE(r.ok()) << r.status();
  EXPECT_GE(r->outputs[1].start_s, 0.1);
  EXPECT_GE(r->outputs[2].start_s, 0.2);
}

TEST(BenchClientTest, WarmupsGoFirstOneAtATimeAndAreNotInTheOutputs) {
  FakeBackend backend(std::chrono::milliseconds(5));
  RunOptions options;
  options.progress = false;
  options.num_warmups = 3;
  options.max_concurrency = 1;  // so max_in_flight also shows the warm-ups' one at a time
  absl::StatusOr<RunResult> r = RunBenchmark(backend, NumberedRequests(2), options);
  ASSERT_TRUE(r.ok()) << r.status();
  EXPECT_EQ(r->outputs.size(), 2u);
  EXPECT_EQ(backend.sent_ids(), (std::vector<int32_t>{100, 100, 100, 100, 101}));
  EXPECT_EQ(backend.max_in_flight(), 1);
}

TEST(BenchClientTest, FailedWarmupEndsTheRunUnavailable) {
  FakeBackend backend(std::chrono::milliseconds(1), /*fail=*/true);
  RunOptions options;
  options.progress = false;
  options.num_warmups = 1;
  absl::StatusOr<RunResult> r = RunBenchmark(backend, NumberedRequests(2), options);
  ASSERT_EQ(r.status().code(), absl::StatusCode::kUnavailable);
  EXPECT_EQ(r.status().message(), "warm-up request failed: UNAVAILABLE: fake");
  EXPECT_EQ(backend.sent_ids().size(), 1u);
}

TEST(BenchClientTest, BadOptionsNameTheField) {
  FakeBackend backend(std::chrono::milliseconds(1));
  RunOptions options;
  options.send_times_s = {0.0};
  EXPECT_EQ(RunBenchmark(backend, NumberedRequests(2), options).status().message(),
            "send_times_s: 1 times for 2 requests");
  options.send_times_s = {0.0, -1.0};
  EXPECT_EQ(RunBenchmark(backend, NumberedRequests(2), options).status().message(),
            "send_times_s[1]: must be in [0, 1e+08] s, got -1");
  options.send_times_s = {};
  options.max_concurrency = -1;
  EXPECT_EQ(RunBenchmark(backend, NumberedRequests(2), options).status().message(),
            "--max-concurrency: must be >= 0, got -1");
  EXPECT_TRUE(backend.sent_ids().empty());
}

TEST(BenchClientTest, SseChunksAsTheRouterWritesThem) {
  absl::StatusOr<SseChunk> c = ParseSseChunk(
      R"({"id":"cmpl-1","object":"text_completion","created":1,"model":"m",)"
      R"("choices":[{"index":0,"text":" upon","logprobs":null,"finish_reason":null}],"usage":null})");
  ASSERT_TRUE(c.ok()) << c.status();
  EXPECT_TRUE(c->has_choice);
  EXPECT_EQ(c->text, " upon");
  EXPECT_EQ(c->completion_tokens, -1);
  EXPECT_TRUE(c->token_bearing());
  // A bare finish (the router's last message carried no token): no token.
  c = ParseSseChunk(
      R"({"choices":[{"index":0,"text":"","logprobs":null,"finish_reason":"length","stop_reason":null}],"usage":null})");
  ASSERT_TRUE(c.ok()) << c.status();
  EXPECT_TRUE(c->has_choice);
  EXPECT_TRUE(c->finished);
  EXPECT_FALSE(c->token_bearing());
  // An empty text without a finish: a token with no text of its own (vLLM counts it).
  c = ParseSseChunk(R"({"choices":[{"index":0,"text":"","finish_reason":null}]})");
  ASSERT_TRUE(c.ok()) << c.status();
  EXPECT_TRUE(c->token_bearing());
  c = ParseSseChunk(
      R"({"id":"cmpl-1","choices":[],"usage":{"prompt_tokens":5,"completion_tokens":12,"total_tokens":17}})");
  ASSERT_TRUE(c.ok()) << c.status();
  EXPECT_FALSE(c->has_choice);
  EXPECT_EQ(c->completion_tokens, 12);
  EXPECT_EQ(c->prompt_tokens, 5);
  c = ParseSseChunk(R"({"error":{"message":"decode worker lost","type":"server_error"}})");
  ASSERT_TRUE(c.ok());
  EXPECT_EQ(c->error, "decode worker lost");
  c = ParseSseChunk("[DONE]");
  ASSERT_TRUE(c.ok());
  EXPECT_TRUE(c->done);
  EXPECT_EQ(ParseSseChunk("{not json").status().code(), absl::StatusCode::kInvalidArgument);
}

TEST(BenchClientTest, BackendsRejectBadAddresses) {
  EXPECT_EQ(GrpcBackend::Create({"127.0.0.1:0", "", 0}).status().message(),
            "--router: port must be in 1..65535, got '127.0.0.1:0'");
  EXPECT_EQ(OpenAiBackend::Create({"https://h:1", "m", "", 0}).status().message(),
            "--base-url: expected http://HOST:PORT (https is not supported), got 'https://h:1'");
  EXPECT_EQ(OpenAiBackend::Create({"http://h:1", "", "", 0}).status().message(),
            "--model: required with --backend openai (see GET /v1/models)");
}

// A Generation service with one canned stream: a metadata message, then
// token-bearing messages of 1, 2 and 1 tokens (3 chunks, 4 tokens) and the
// last with prompt_tokens 7; prompt "fail" -> RESOURCE_EXHAUSTED after the
// first token. Records the last request and its authorization header.
class CannedGeneration final : public v1::Generation::Service {
 public:
  grpc::Status Generate(grpc::ServerContext* context, const v1::GenerateRequest* request,
                        grpc::ServerWriter<v1::GenerateResponse>* writer) override {
    {
      absl::MutexLock lock(&mu_);
      last_ = *request;
      auto it = context->client_metadata().find("authorization");
      auth_ = it == context->client_metadata().end() ? "" : std::string(it->second.data(), it->second.size());
    }
    v1::GenerateResponse meta;
    meta.set_request_id("r1");
    writer->Write(meta);
    if (request->prompt() == "stall") {  // a token only after 2 s
      std::this_thread::sleep_for(std::chrono::seconds(2));
    }
    int32_t next = 10;
    for (int n : {1, 2, 1}) {
      v1::GenerateResponse m;
      for (int k = 0; k < n; ++k) m.add_tokens()->set_token_id(next++);
      m.set_text(absl::StrCat(" t", n));
      if (next == 14) {  // the last message: the placement behind the prompt
        m.set_prompt_tokens(7);
        if (request->prompt() == "local") {  // no prediction made (threshold)
          m.mutable_placement()->set_decision("local");
        } else {
          m.mutable_placement()->set_decision("remote");
          m.mutable_placement()->set_ttft_local_ms(80);
          m.mutable_placement()->set_ttft_remote_ms(250);
        }
      }
      writer->Write(m);
      if (request->prompt() == "fail") {
        return grpc::Status(grpc::StatusCode::RESOURCE_EXHAUSTED, "no blocks");
      }
    }
    return grpc::Status::OK;
  }
  v1::GenerateRequest last() {
    absl::MutexLock lock(&mu_);
    return last_;
  }
  std::string auth() {
    absl::MutexLock lock(&mu_);
    return auth_;
  }

 private:
  absl::Mutex mu_;
  v1::GenerateRequest last_;
  std::string auth_;
};

// Runs one request through `backend` and returns its output.
RequestOutput RunOne(BenchBackend& backend, const BenchRequest& request) {
  RunOptions options;
  options.progress = false;
  absl::StatusOr<RunResult> r = RunBenchmark(backend, {request}, options);
  EXPECT_TRUE(r.ok()) << r.status();
  return r.ok() ? r->outputs[0] : RequestOutput();
}

TEST(BenchClientTest, GrpcBackendTimesTokenBearingMessages) {
  CannedGeneration service;
  int port = 0;
  grpc::ServerBuilder builder;
  builder.AddListeningPort("127.0.0.1:0", grpc::InsecureServerCredentials(), &port);
  builder.RegisterService(&service);
  std::unique_ptr<grpc::Server> server = builder.BuildAndStart();
  ASSERT_GT(port, 0);
  absl::StatusOr<std::unique_ptr<GrpcBackend>> backend =
      GrpcBackend::Create({absl::StrCat("127.0.0.1:", port), "k3y", 10000});
  ASSERT_TRUE(backend.ok()) << backend.status();

  BenchRequest request;
  request.prompt_token_ids = {5, 6, 7};
  request.prompt_len = 3;
  request.output_len = 4;
  RequestOutput o = RunOne(**backend, request);
  ASSERT_TRUE(o.success) << o.error;
  EXPECT_EQ(o.output_tokens, 4);
  EXPECT_EQ(o.prompt_len, 7);  // the server's count wins
  EXPECT_EQ(o.itl_s.size(), 2u);  // 3 token-bearing chunks
  EXPECT_EQ(o.generated_text, " t1 t2 t1");
  EXPECT_LE(o.ttft_s, o.latency_s);
  EXPECT_EQ(o.placement, "remote");
  ASSERT_TRUE(o.predicted_ttft_s.has_value());
  EXPECT_DOUBLE_EQ(*o.predicted_ttft_s, 0.25);  // the remote prediction, 250 ms
  const v1::GenerateRequest sent = service.last();
  EXPECT_EQ(std::vector<int32_t>(sent.prompt_token_ids().begin(), sent.prompt_token_ids().end()),
            (std::vector<int32_t>{5, 6, 7}));
  EXPECT_EQ(sent.prompt(), "");
  EXPECT_EQ(sent.max_tokens(), 4u);
  EXPECT_TRUE(sent.ignore_eos());
  EXPECT_EQ(sent.sampling().temperature(), 0.0f);
  EXPECT_EQ(service.auth(), "Bearer k3y");

  request.prompt_token_ids.clear();
  request.prompt = "local";  // both predictions 0: placement without a prediction
  o = RunOne(**backend, request);
  ASSERT_TRUE(o.success) << o.error;
  EXPECT_EQ(o.placement, "local");
  EXPECT_FALSE(o.predicted_ttft_s.has_value());

  request.prompt = "fail";
  o = RunOne(**backend, request);
  EXPECT_FALSE(o.success);
  EXPECT_EQ(o.error, "RESOURCE_EXHAUSTED: no blocks");
  EXPECT_EQ(service.last().prompt(), "fail");

  absl::StatusOr<std::unique_ptr<GrpcBackend>> impatient =
      GrpcBackend::Create({absl::StrCat("127.0.0.1:", port), "", 200});
  ASSERT_TRUE(impatient.ok()) << impatient.status();
  request.prompt = "stall";
  o = RunOne(**impatient, request);
  EXPECT_FALSE(o.success);
  EXPECT_TRUE(absl::StartsWith(o.error, "DEADLINE_EXCEEDED: ")) << o.error;
  EXPECT_EQ(o.output_tokens, 0);
  server->Shutdown();
}

// An OpenAI-compatible server with canned /v1/completions streams, keyed
// by the request's prompt (see the cases below); the stream is written in
// pieces that split events, as TCP may deliver them.
class CannedOpenAi {
 public:
  CannedOpenAi() {
    server_.Post("/v1/completions", [this](const httplib::Request& req, httplib::Response& res) {
      const nlohmann::json body = nlohmann::json::parse(req.body);
      {
        absl::MutexLock lock(&mu_);
        last_body_ = body;
        auth_ = req.get_header_value("Authorization");
      }
      const std::string c = R"({"choices":[{"index":0,"text":"%s"}],"usage":null})";
      auto chunk = [&](const std::string& text) {
        std::string j = c;
        j.replace(j.find("%s"), 2, text);
        return "data: " + j + "\n\n";
      };
      std::string stream;
      if (body["prompt"].is_array()) {  // 3 chunks (one empty), a bare finish, usage, [DONE]
        stream = chunk("A") + ": keep-alive\n\n" + chunk("") + chunk("B") +
                 "data: {\"choices\":[{\"index\":0,\"text\":\"\",\"finish_reason\":\"length\"}]}\n\n" +
                 "data: {\"choices\":[],\"usage\":{\"prompt_tokens\":9,\"completion_tokens\":5}}\n\n" +
                 "data: [DONE]\n\n";
      } else if (body["prompt"] == "nousage") {
        stream = chunk("A") + chunk("B") + "data: [DONE]\n\n";
      } else if (body["prompt"] == "error") {
        stream = chunk("A") + "data: {\"error\":{\"message\":\"boom\"}}\n\n";
      } else if (body["prompt"] == "stall") {  // the first chunk only after 2 s
        std::this_thread::sleep_for(std::chrono::seconds(2));
        stream = chunk("A") + "data: [DONE]\n\n";
      } else if (body["prompt"] == "cut") {
        stream = chunk("A");
      } else {
        res.status = 503;
        res.set_content("overloaded", "text/plain");
        return;
      }
      res.set_chunked_content_provider(
          "text/event-stream", [stream](size_t offset, httplib::DataSink& sink) {
            if (offset < stream.size()) {
              sink.write(stream.data() + offset, std::min<size_t>(7, stream.size() - offset));
            } else {
              sink.done();
            }
            return true;
          });
    });
    port_ = server_.bind_to_any_port("127.0.0.1");
    thread_ = std::thread([this] { server_.listen_after_bind(); });
  }
  ~CannedOpenAi() {
    server_.stop();
    thread_.join();
  }
  std::string url() const { return absl::StrCat("http://127.0.0.1:", port_); }
  nlohmann::json last_body() {
    absl::MutexLock lock(&mu_);
    return last_body_;
  }
  std::string auth() {
    absl::MutexLock lock(&mu_);
    return auth_;
  }

 private:
  httplib::Server server_;
  int port_ = 0;
  std::thread thread_;
  absl::Mutex mu_;
  nlohmann::json last_body_;
  std::string auth_;
};

TEST(BenchClientTest, OpenAiBackendReadsTheEventStream) {
  CannedOpenAi server;
  absl::StatusOr<std::unique_ptr<OpenAiBackend>> backend =
      OpenAiBackend::Create({server.url(), "m1", "k3y", 10000});
  ASSERT_TRUE(backend.ok()) << backend.status();
  BenchRequest request;
  request.prompt_token_ids = {5, 6, 7};
  request.prompt_len = 3;
  request.output_len = 5;
  RequestOutput o = RunOne(**backend, request);
  ASSERT_TRUE(o.success) << o.error;
  EXPECT_EQ(o.output_tokens, 5);   // usage.completion_tokens
  EXPECT_EQ(o.prompt_len, 9);      // usage.prompt_tokens
  EXPECT_EQ(o.itl_s.size(), 2u);   // 3 chunks with a choice (vLLM counts the empty one)
  EXPECT_EQ(o.generated_text, "AB");
  EXPECT_LE(o.ttft_s, o.latency_s);
  EXPECT_EQ(server.last_body(), nlohmann::json::parse(R"({"model":"m1","prompt":[5,6,7],
      "max_tokens":5,"temperature":0,"ignore_eos":true,"stream":true,
      "stream_options":{"include_usage":true}})"));
  EXPECT_EQ(server.auth(), "Bearer k3y");

  request.prompt_token_ids.clear();
  request.prompt = "nousage";
  o = RunOne(**backend, request);
  ASSERT_TRUE(o.success) << o.error;
  EXPECT_EQ(o.output_tokens, 2);  // one per chunk without usage
  EXPECT_EQ(o.prompt_len, 3);     // the request's own
  EXPECT_EQ(server.last_body()["prompt"], "nousage");

  request.prompt = "error";
  o = RunOne(**backend, request);
  EXPECT_FALSE(o.success);
  EXPECT_EQ(o.error, "INTERNAL: boom");
  request.prompt = "cut";
  o = RunOne(**backend, request);
  EXPECT_FALSE(o.success);
  EXPECT_EQ(o.error, "DATA_LOSS: stream ended before [DONE]");
  request.prompt = "busy";
  o = RunOne(**backend, request);
  EXPECT_FALSE(o.success);
  EXPECT_EQ(o.error, "HTTP 503: overloaded");

  absl::StatusOr<std::unique_ptr<OpenAiBackend>> impatient =
      OpenAiBackend::Create({server.url(), "m1", "", 200});
  ASSERT_TRUE(impatient.ok()) << impatient.status();
  request.prompt = "stall";
  o = RunOne(**impatient, request);
  EXPECT_FALSE(o.success);
  EXPECT_TRUE(absl::StartsWith(o.error, "DEADLINE_EXCEEDED: no end of stream within 200 ms"))
      << o.error;
}

// A port nobody listens on: bound, then closed.
int ClosedPort() {
  const int fd = socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  bind(fd, reinterpret_cast<sockaddr*>(&addr), sizeof(addr));
  socklen_t len = sizeof(addr);
  getsockname(fd, reinterpret_cast<sockaddr*>(&addr), &len);
  close(fd);
  return ntohs(addr.sin_port);
}

TEST(BenchClientTest, RouterNotListeningFailsEveryRequestUnavailable) {
  const std::string address = absl::StrCat("127.0.0.1:", ClosedPort());
  RunOptions options;
  options.progress = false;
  absl::StatusOr<std::unique_ptr<GrpcBackend>> grpc = GrpcBackend::Create({address, "", 10000});
  ASSERT_TRUE(grpc.ok()) << grpc.status();
  absl::StatusOr<std::unique_ptr<OpenAiBackend>> http =
      OpenAiBackend::Create({"http://" + address, "stories260K", "", 10000});
  ASSERT_TRUE(http.ok()) << http.status();
  for (BenchBackend* backend : {static_cast<BenchBackend*>(grpc->get()),
                                static_cast<BenchBackend*>(http->get())}) {
    absl::StatusOr<RunResult> r = RunBenchmark(*backend, NumberedRequests(3), options);
    ASSERT_TRUE(r.ok()) << r.status();
    ASSERT_EQ(r->outputs.size(), 3u);
    for (const RequestOutput& o : r->outputs) {
      EXPECT_FALSE(o.success);
      EXPECT_TRUE(absl::StartsWith(o.error, "UNAVAILABLE: ")) << o.error;
      EXPECT_EQ(o.output_tokens, 0);
    }
  }
}

// 10 requests of random ids (stories260K's vocabulary is 512 tokens),
// prompts of 20..80 tokens, outputs of 4..16 tokens (seeded).
std::vector<BenchRequest> RandomRequests() {
  std::mt19937 rng(17);
  std::vector<BenchRequest> requests(10);
  for (BenchRequest& r : requests) {
    r.prompt_len = std::uniform_int_distribution<int32_t>(20, 80)(rng);
    r.output_len = std::uniform_int_distribution<int32_t>(4, 16)(rng);
    for (int32_t i = 0; i < r.prompt_len; ++i) {
      r.prompt_token_ids.push_back(std::uniform_int_distribution<int32_t>(3, 511)(rng));
    }
  }
  return requests;
}

class BenchClientClusterTest : public testing::ClusterSuite {
 protected:
  static void SetUpTestSuite() {
    testing::ClusterOptions options;
    options.http_listen = "127.0.0.1:0";
    StartSuiteCluster(options);
  }

  // Every request succeeded with exactly its output_len tokens.
  static void ExpectExact(const std::vector<BenchRequest>& requests, const RunResult& r) {
    ASSERT_EQ(r.outputs.size(), requests.size());
    for (size_t i = 0; i < requests.size(); ++i) {
      const RequestOutput& o = r.outputs[i];
      ASSERT_TRUE(o.success) << "request " << i << ": " << o.error;
      EXPECT_EQ(o.output_tokens, requests[i].output_len) << "request " << i;
      EXPECT_EQ(o.prompt_len, requests[i].prompt_len) << "request " << i;
      EXPECT_GT(o.ttft_s, 0) << "request " << i;
      EXPECT_LE(o.ttft_s, o.latency_s) << "request " << i;
      // The router may carry several tokens in one message (a stream that
      // fell behind): one gap per later token-bearing chunk, so at most
      // output_len - 1, and the gaps fit between the first token and the end.
      EXPECT_LE(o.itl_s.size(), static_cast<size_t>(requests[i].output_len - 1)) << "request " << i;
      double gaps = 0;
      for (double g : o.itl_s) gaps += g;
      EXPECT_LE(o.ttft_s + gaps, o.latency_s + 1e-9) << "request " << i;
      EXPECT_GE(o.start_s, 0);
      EXPECT_LE(o.latency_s, r.duration_s) << "request " << i;  // within first start .. last end
    }
    EXPECT_GT(r.duration_s, 0);
  }
};

TEST_F(BenchClientClusterTest, GrpcBackendRunsTenRandomRequestsExactly) {
  absl::StatusOr<std::unique_ptr<GrpcBackend>> backend =
      GrpcBackend::Create({cluster().router_address(), "", 60000});
  ASSERT_TRUE(backend.ok()) << backend.status();
  const std::vector<BenchRequest> requests = RandomRequests();
  RunOptions options;
  options.num_warmups = 1;
  absl::StatusOr<RunResult> r = RunBenchmark(**backend, requests, options);
  ASSERT_TRUE(r.ok()) << r.status();
  ExpectExact(requests, *r);
}

TEST_F(BenchClientClusterTest, OpenAiBackendRunsTenRandomRequestsExactly) {
  absl::StatusOr<std::unique_ptr<OpenAiBackend>> backend = OpenAiBackend::Create(
      {"http://" + cluster().http_address(), "stories260K", "", 60000});
  ASSERT_TRUE(backend.ok()) << backend.status();
  const std::vector<BenchRequest> requests = RandomRequests();
  RunOptions options;
  options.max_concurrency = 4;
  absl::StatusOr<RunResult> r = RunBenchmark(**backend, requests, options);
  ASSERT_TRUE(r.ok()) << r.status();
  ExpectExact(requests, *r);
}

TEST_F(BenchClientClusterTest, WrongModelIsAnHttpError) {
  absl::StatusOr<std::unique_ptr<OpenAiBackend>> backend =
      OpenAiBackend::Create({"http://" + cluster().http_address(), "nope", "", 60000});
  ASSERT_TRUE(backend.ok()) << backend.status();
  RunOptions options;
  options.progress = false;
  absl::StatusOr<RunResult> r = RunBenchmark(**backend, RandomRequests(), options);
  ASSERT_TRUE(r.ok()) << r.status();
  for (const RequestOutput& o : r->outputs) {
    EXPECT_FALSE(o.success);
    EXPECT_TRUE(absl::StartsWith(o.error, "HTTP 404: ")) << o.error;
  }
}

}  // namespace
}  // namespace tandem::bench
