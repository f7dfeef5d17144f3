// The OpenAI-compatible HTTP front door (issue #14) through a running
// cluster: completions and chat, stream and not, equal to the gRPC result
// of the same request; stop strings and logprobs; errors in OpenAI's shape
// beside a good stream; many concurrent streams; the stream limit; a
// client that hangs up during a remote prefill.
#include <signal.h>

#include <string>
#include <thread>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "nlohmann/json.hpp"
#include "tests/common/prometheus_text.h"
#include "tests/integration/cluster_fixture.h"
#include "tests/integration/generate_client.h"
#include "tests/integration/http_client.h"

namespace tandem::testing {
namespace {

using nlohmann::json;
using ::testing::HasSubstr;
using ::testing::Not;

json Parse(const std::string& text) {
  json j = json::parse(text, nullptr, /*allow_exceptions=*/false);
  EXPECT_FALSE(j.is_discarded()) << "not JSON: " << text;
  return j;
}

// The text of every chunk of a completions (or chat) stream, joined, and
// the finish reason of its last choice chunk. Expects [DONE] last.
struct StreamText {
  std::string text;
  std::string finish_reason;
  int chunks = 0;
  json usage;  // the usage chunk's, when sent
};

StreamText JoinStream(const std::vector<std::string>& events, bool chat) {
  StreamText out;
  EXPECT_FALSE(events.empty());
  if (events.empty()) return out;
  EXPECT_EQ(events.back(), "[DONE]");
  for (size_t i = 0; i + 1 < events.size(); ++i) {
    json chunk = Parse(events[i]);
    EXPECT_EQ(chunk.value("object", ""), chat ? "chat.completion.chunk" : "text_completion");
    if (chunk.contains("usage") && chunk["usage"].is_object()) out.usage = chunk["usage"];
    for (const json& choice : chunk["choices"]) {
      ++out.chunks;
      EXPECT_EQ(choice.value("index", -1), 0);
      if (chat) {
        if (choice["delta"].contains("content") && choice["delta"]["content"].is_string()) {
          out.text += choice["delta"]["content"].get<std::string>();
        }
      } else {
        out.text += choice.value("text", "");
      }
      if (choice["finish_reason"].is_string()) out.finish_reason = choice["finish_reason"];
    }
  }
  return out;
}

// A usage object's Tandem fields (router/openai/openai_protocol.h): the
// placement names `route`, the phases are >= 0 and add up to ttft_ms
// within a millisecond.
void ExpectUsagePlacementAndTiming(const json& usage, const std::string& route) {
  ASSERT_TRUE(usage.contains("placement")) << usage.dump();
  EXPECT_EQ(usage["placement"]["decision"], route);
  EXPECT_TRUE(usage["placement"]["ttft_local_ms"].is_number());
  EXPECT_TRUE(usage["placement"]["ttft_remote_ms"].is_number());
  ASSERT_TRUE(usage.contains("timing")) << usage.dump();
  const json& t = usage["timing"];
  double sum = 0;
  for (const char* f : {"router_queue_ms", "placement_ms", "prefill_queue_ms", "prefill_ms"}) {
    ASSERT_TRUE(t[f].is_number()) << f << " in " << t.dump();
    EXPECT_GE(t[f].get<double>(), 0) << f;
    sum += t[f].get<double>();
  }
  for (const char* f : {"kv_transfer_ms", "decode_admission_ms", "first_decode_ms"}) {
    ASSERT_TRUE(t[f].is_number()) << f << " in " << t.dump();
    EXPECT_GE(t[f].get<double>(), 0) << f;
  }
  ASSERT_TRUE(t["ttft_ms"].is_number() && t["e2e_ms"].is_number()) << t.dump();
  EXPECT_GT(t["ttft_ms"].get<double>(), 0);
  EXPECT_GE(t["e2e_ms"].get<double>(), t["ttft_ms"].get<double>());
  EXPECT_NEAR(sum, t["ttft_ms"].get<double>(), 1.0) << t.dump();
}

// The default cluster with the HTTP front door on an ephemeral port.
class HttpTest : public ClusterSuite {
 protected:
  static void SetUpTestSuite() {
    ClusterOptions options;
    options.http_listen = "127.0.0.1:0";
    StartSuiteCluster(options);
  }
  static std::string http() { return cluster().http_address(); }
};

TEST_F(HttpTest, CompletionsEqualTheGrpcResultAndTheGolden) {
  const GoldenCase& g = Golden("once_upon_a_time");
  StreamResult grpc = RunGenerate(cluster().stub(), MakeRequest(g.prompt, 16));
  ASSERT_TRUE(grpc.status.ok()) << grpc.status.error_message();
  ASSERT_GE(grpc.token_ids.size(), g.StrictIds().size() < 16 ? g.StrictIds().size() : 16);
  for (size_t i = 0; i < std::min<size_t>(16, g.StrictIds().size()); ++i) {
    EXPECT_EQ(grpc.token_ids[i], g.StrictIds()[i]) << "at " << i;
  }
  const std::string body =
      R"({"model":"stories260K","prompt":"Once upon a time","max_tokens":16,"temperature":0})";
  HttpResult r = HttpCall(http(), "POST", "/v1/completions", body, {{"X-Request-Id", "abc-1"}});
  ASSERT_EQ(r.status, 200) << r.error << r.body;
  EXPECT_EQ(r.headers["x-request-id"], "abc-1");
  json j = Parse(r.body);
  EXPECT_EQ(j["object"], "text_completion");
  EXPECT_EQ(j["model"], "stories260K");
  EXPECT_THAT(j["id"].get<std::string>(), ::testing::StartsWith("cmpl-"));
  ASSERT_EQ(j["choices"].size(), 1u);
  EXPECT_EQ(j["choices"][0]["text"], grpc.text);
  EXPECT_EQ(j["choices"][0]["finish_reason"], "length");
  EXPECT_EQ(j["usage"]["prompt_tokens"], grpc.prompt_tokens);
  EXPECT_EQ(j["usage"]["completion_tokens"], 16);
  EXPECT_EQ(j["usage"]["total_tokens"], grpc.prompt_tokens + 16);
  EXPECT_TRUE(j["usage"]["prompt_tokens_details"]["cached_tokens"].is_number());
  ExpectUsagePlacementAndTiming(j["usage"], grpc.served_route);

  // The same request streamed: the same text, chunk by chunk, then [DONE].
  const std::string stream_body =
      R"({"model":"stories260K","prompt":"Once upon a time","max_tokens":16,"temperature":0,)"
      R"("stream":true,"stream_options":{"include_usage":true}})";
  absl::StatusOr<SseStream> s = SseStream::Open(http(), "/v1/completions", stream_body);
  ASSERT_TRUE(s.ok()) << s.status();
  EXPECT_EQ(s->status(), 200);
  EXPECT_EQ(s->headers().at("content-type"), "text/event-stream");
  absl::StatusOr<std::vector<std::string>> events = s->ReadAll();
  ASSERT_TRUE(events.ok()) << events.status();
  StreamText st = JoinStream(*events, /*chat=*/false);
  EXPECT_EQ(st.text, grpc.text);
  EXPECT_EQ(st.finish_reason, "length");
  EXPECT_GE(st.chunks, 2);
  ASSERT_TRUE(st.usage.is_object()) << "no usage chunk with include_usage";
  EXPECT_EQ(st.usage["completion_tokens"], 16);
  ExpectUsagePlacementAndTiming(st.usage, grpc.served_route);
}

TEST_F(HttpTest, PromptAsTokenIdsEqualsThePromptText) {
  const GoldenCase& g = Golden("the_little_dog");
  json ids = g.prompt_ids;
  HttpResult text = HttpCall(http(), "POST", "/v1/completions",
                             json{{"model", "stories260K"}, {"prompt", g.prompt},
                                  {"max_tokens", 8}, {"temperature", 0}}.dump());
  HttpResult by_ids = HttpCall(http(), "POST", "/v1/completions",
                               json{{"model", "stories260K"}, {"prompt", ids},
                                    {"max_tokens", 8}, {"temperature", 0}}.dump());
  ASSERT_EQ(text.status, 200) << text.body;
  ASSERT_EQ(by_ids.status, 200) << by_ids.body;
  EXPECT_EQ(Parse(by_ids.body)["choices"][0]["text"], Parse(text.body)["choices"][0]["text"]);
  EXPECT_EQ(Parse(by_ids.body)["usage"]["prompt_tokens"], g.prompt_ids.size());
}

TEST_F(HttpTest, StopStringsAndLogprobsMatchGrpc) {
  const GoldenCase& g = Golden("lily_and_ben");
  v1::GenerateRequest request = MakeRequest(g.prompt, 24);
  request.add_stop("park");
  request.set_logprobs(3);
  StreamResult grpc = RunGenerate(cluster().stub(), request);
  ASSERT_TRUE(grpc.status.ok()) << grpc.status.error_message();

  json body = {{"model", "stories260K"}, {"prompt", g.prompt}, {"max_tokens", 24},
               {"temperature", 0}, {"stop", {"park"}}, {"logprobs", 3}};
  HttpResult r = HttpCall(http(), "POST", "/v1/completions", body.dump());
  ASSERT_EQ(r.status, 200) << r.body;
  json choice = Parse(r.body)["choices"][0];
  EXPECT_EQ(choice["text"], grpc.text);
  EXPECT_EQ(choice["finish_reason"], grpc.finish_reason == v1::FINISH_STOP ? "stop" : "length");
  const json& lp = choice["logprobs"];
  ASSERT_TRUE(lp.is_object()) << choice.dump();
  ASSERT_EQ(lp["token_logprobs"].size(), grpc.logprobs.size());
  for (size_t i = 0; i < grpc.logprobs.size(); ++i) {
    EXPECT_EQ(static_cast<float>(lp["token_logprobs"][i].get<double>()), grpc.logprobs[i])
        << "at " << i;
    EXPECT_EQ(lp["top_logprobs"][i].size(), 3u) << "at " << i;
  }
  EXPECT_EQ(lp["tokens"].size(), grpc.logprobs.size());
  EXPECT_EQ(lp["text_offset"].size(), grpc.logprobs.size());
  if (grpc.finish_reason == v1::FINISH_STOP) EXPECT_EQ(choice["stop_reason"], "park");
}

TEST_F(HttpTest, ModelsHealthReadyAndUnknownRoutes) {
  HttpResult models = HttpCall(http(), "GET", "/v1/models");
  ASSERT_EQ(models.status, 200) << models.body;
  json m = Parse(models.body);
  EXPECT_EQ(m["object"], "list");
  ASSERT_EQ(m["data"].size(), 1u);
  EXPECT_EQ(m["data"][0]["id"], "stories260K");
  HttpResult one = HttpCall(http(), "GET", "/v1/models/stories260K");
  ASSERT_EQ(one.status, 200) << one.body;
  EXPECT_EQ(Parse(one.body)["id"], "stories260K");
  HttpResult other = HttpCall(http(), "GET", "/v1/models/gpt-4");
  EXPECT_EQ(other.status, 404);
  EXPECT_EQ(Parse(other.body)["error"]["code"], "model_not_found");
  EXPECT_EQ(HttpCall(http(), "GET", "/health").status, 200);
  EXPECT_EQ(HttpCall(http(), "GET", "/ready").status, 200);
  HttpResult missing = HttpCall(http(), "GET", "/v1/nothing");
  EXPECT_EQ(missing.status, 404);
  EXPECT_TRUE(Parse(missing.body).contains("error"));
  HttpResult wrong_model = HttpCall(http(), "POST", "/v1/completions",
                                    R"({"model":"gpt-4","prompt":"Hi","max_tokens":2})");
  EXPECT_EQ(wrong_model.status, 404);
  EXPECT_EQ(Parse(wrong_model.body)["error"]["code"], "model_not_found");
}

// The router's /metrics, read by python3-prometheus-client, agrees with its
// GetStatus counters and with what the HTTP clients were sent.
// The router's /metrics as python3-prometheus-client reads it: a map
// from `name{labels}` to the sample, and the router's GetStatus taken
// right after (idle: nothing changes in between).
struct RouterScrape {
  std::map<std::string, PromSample> samples;
  v1::WorkerStatus status;
  double requests = 0;  // tandem_requests_total over every label set

  double operator[](const std::string& key) const {
    auto it = samples.find(key);
    EXPECT_NE(it, samples.end()) << key;
    return it == samples.end() ? -1.0 : it->second.value;
  }
};

RouterScrape ScrapeRouter(LocalCluster& cluster) {
  RouterScrape out;
  HttpResult m = HttpCall(cluster.http_address(), "GET", "/metrics");
  EXPECT_EQ(m.status, 200);
  EXPECT_THAT(m.headers["content-type"], HasSubstr("text/plain"));
  absl::StatusOr<std::map<std::string, PromSample>> samples = ParsePrometheusText(m.body);
  EXPECT_TRUE(samples.ok()) << samples.status();
  if (samples.ok()) out.samples = *std::move(samples);
  absl::StatusOr<v1::ClusterStatus> status = cluster.ClusterStatus();
  EXPECT_TRUE(status.ok()) << status.status();
  if (status.ok()) out.status = status->router();
  for (const auto& [key, sample] : out.samples) {
    if (absl::StartsWith(key, "tandem_requests_total{")) out.requests += sample.value;
    EXPECT_THAT(key, Not(HasSubstr("request_id")));
  }
  return out;
}

// The router's /metrics agrees with its GetStatus counters, and grows by
// exactly what the HTTP clients were sent.
TEST_F(HttpTest, MetricsAgreeWithGetStatusAndTheClients) {
  const GoldenCase& g = Golden("once_upon_a_time");
  const RouterScrape before = ScrapeRouter(cluster());
  const json plain = {{"model", "stories260K"}, {"prompt", g.prompt}, {"max_tokens", 8},
                      {"temperature", 0}, {"ignore_eos", true}};
  json streamed = plain;
  streamed["stream"] = true;
  HttpResult a = HttpCall(http(), "POST", "/v1/completions", plain.dump());
  ASSERT_EQ(a.status, 200) << a.body;
  absl::StatusOr<SseStream> s = SseStream::Open(http(), "/v1/completions", streamed.dump());
  ASSERT_TRUE(s.ok()) << s.status();
  ASSERT_TRUE(s->ReadAll().ok());
  HttpResult bad = HttpCall(http(), "POST", "/v1/completions", R"({"model":"stories260K"})");
  ASSERT_EQ(bad.status, 400);
  const RouterScrape after = ScrapeRouter(cluster());

  for (const RouterScrape* r : {&before, &after}) {
    EXPECT_EQ(r->requests, r->status.router_requests_total());
    EXPECT_EQ((*r)["tandem_generation_tokens_total{}"], r->status.router_generation_tokens_total());
    EXPECT_EQ((*r)["tandem_prompt_tokens_total{}"], r->status.router_prompt_tokens_total());
    EXPECT_EQ((*r)["tandem_num_requests_running{}"], 0);
    EXPECT_EQ(r->samples.at("tandem_time_to_first_token_seconds_count{}").type, "histogram");
  }
  auto grew = [&](const std::string& key) { return after[key] - before[key]; };
  EXPECT_EQ(after.requests - before.requests, 3);  // the two served, the one refused
  EXPECT_EQ(grew("tandem_generation_tokens_total{}"), 16);  // 8 + 8 sent to the clients
  EXPECT_EQ(grew("tandem_prompt_tokens_total{}"), 2.0 * g.prompt_ids.size());
  EXPECT_EQ(grew("tandem_time_to_first_token_seconds_count{}"), 2);
  EXPECT_EQ(grew("tandem_e2e_request_latency_seconds_count{}"), 2);
  EXPECT_EQ(grew("tandem_request_queue_time_seconds_count{}"), 2);
  EXPECT_EQ(grew("tandem_time_per_output_token_seconds_count{}"), 2);
  // Where their TTFT went: once per request, on its route (local: the
  // prompt is shorter than max_local_prefill_tokens).
  for (const char* phase : {"router_queue", "placement", "prefill_queue", "prefill"}) {
    EXPECT_EQ(grew(absl::StrCat("tandem_request_phase_seconds_count{phase=\"", phase, "\"}")), 2)
        << phase;
  }
  EXPECT_EQ(grew("tandem_request_phase_seconds_count{phase=\"kv_transfer\"}"), 0);
}

TEST_F(HttpTest, ChatWithoutATemplateIs400NamingIt) {
  HttpResult r = HttpCall(http(), "POST", "/v1/chat/completions",
                          R"({"model":"stories260K","messages":[{"role":"user","content":"Hi"}]})");
  EXPECT_EQ(r.status, 400) << r.body;
  json e = Parse(r.body)["error"];
  EXPECT_THAT(e["message"].get<std::string>(), HasSubstr("chat template"));
}

// Every bad request gets its OpenAI error while a good stream runs beside
// it and ends with the gRPC reference text.
TEST_F(HttpTest, BadInputGetsOpenAiErrorsBesideAGoodStream) {
  const GoldenCase& g = Golden("long_repeated_313tok");
  StreamResult reference = RunGenerate(cluster().stub(), MakeRequest(g.prompt, 200));
  ASSERT_TRUE(reference.status.ok());
  absl::StatusOr<SseStream> good = SseStream::Open(
      http(), "/v1/completions",
      json{{"model", "stories260K"}, {"prompt", g.prompt}, {"max_tokens", 200},
           {"temperature", 0}, {"stream", true}}.dump());
  ASSERT_TRUE(good.ok()) << good.status();

  struct Bad {
    std::string path, body;
    int status;
    std::string param;
  };
  std::string stops = "[";
  for (int i = 0; i < 1000; ++i) absl::StrAppend(&stops, i ? "," : "", "\"s", i, "\"");
  stops += "]";
  std::string huge_prompt;  // ~3000 tokens: over the 2048-token context
  for (int i = 0; i < 600; ++i) huge_prompt += "Once upon a time ";
  const std::vector<Bad> cases = {
      {"/v1/completions", R"({"model":"stories260K","prompt":"Hi",)", 400, ""},
      {"/v1/completions", R"({"model":"stories260K","prompt":"Hi","temperature":"hot"})", 400,
       "temperature"},
      {"/v1/completions", R"({"model":"stories260K","prompt":"Hi","temperature":NaN})", 400, ""},
      {"/v1/completions", R"({"model":"stories260K","prompt":"Hi","logprobs":21})", 400,
       "logprobs"},
      {"/v1/chat/completions",
       R"({"model":"stories260K","messages":[{"role":"user","content":"Hi"}],"top_logprobs":2})",
       400, "top_logprobs"},
      {"/v1/chat/completions", R"({"model":"stories260K","messages":[]})", 400, "messages"},
      {"/v1/completions", absl::StrCat(R"({"model":"stories260K","prompt":"Hi","stop":)", stops,
                                       "}"),
       400, "stop"},
      {"/v1/completions",
       absl::StrCat(R"({"model":"stories260K","max_tokens":16,"prompt":")", huge_prompt, "\"}"),
       400, ""},
      {"/v1/completions", R"({"model":"stories260K","prompt":"Hi","frobnicate":1})", 400,
       "frobnicate"},
      {"/v1/completions", R"({"model":"stories260K","prompt":"Hi","echo":true})", 400, "echo"},
      {"/v1/completions", std::string(10 << 20, ' '), 413, ""},
  };
  for (const Bad& c : cases) {
    SCOPED_TRACE(c.body.substr(0, 120));
    HttpResult r = HttpCall(http(), "POST", c.path, c.body);
    EXPECT_EQ(r.status, c.status) << r.error << " " << r.body.substr(0, 300);
    if (c.status == 413) continue;
    json e = Parse(r.body);
    ASSERT_TRUE(e.contains("error")) << r.body;
    EXPECT_TRUE(e["error"]["message"].is_string());
    EXPECT_TRUE(e["error"]["type"].is_string());
    if (!c.param.empty()) EXPECT_EQ(e["error"]["param"], c.param) << r.body;
  }
  absl::StatusOr<std::vector<std::string>> events = good->ReadAll();
  ASSERT_TRUE(events.ok()) << events.status();
  EXPECT_EQ(JoinStream(*events, false).text, reference.text);
}

TEST_F(HttpTest, ManyConcurrentStreamsComplete) {
  constexpr int kStreams = 256;
  const GoldenCase& g = Golden("the_little_dog");
  StreamResult reference = RunGenerate(cluster().stub(), MakeRequest(g.prompt, 24));
  ASSERT_TRUE(reference.status.ok());
  const std::string body = json{{"model", "stories260K"}, {"prompt", g.prompt},
                                {"max_tokens", 24}, {"temperature", 0}, {"stream", true}}
                               .dump();
  std::vector<std::string> texts(kStreams);
  std::vector<std::string> errors(kStreams);
  std::vector<std::thread> clients;
  for (int i = 0; i < kStreams; ++i) {
    clients.emplace_back([&, i] {
      absl::StatusOr<SseStream> s = SseStream::Open(http(), "/v1/completions", body);
      if (!s.ok()) {
        errors[i] = std::string(s.status().message());
        return;
      }
      if (s->status() != 200) {
        errors[i] = absl::StrCat("status ", s->status(), " ", s->rest());
        return;
      }
      absl::StatusOr<std::vector<std::string>> events = s->ReadAll();
      if (!events.ok()) {
        errors[i] = std::string(events.status().message());
        return;
      }
      texts[i] = JoinStream(*events, false).text;
    });
  }
  for (std::thread& t : clients) t.join();
  for (int i = 0; i < kStreams; ++i) {
    EXPECT_EQ(errors[i], "") << "stream " << i;
    EXPECT_EQ(texts[i], reference.text) << "stream " << i;
  }
}

// Chat on a model with a chat template (qwen2-tiny-synth: ChatML, the real
// Qwen vocabulary, random weights).
class HttpChatTest : public ClusterSuite {
 protected:
  static void SetUpTestSuite() {
    ClusterOptions options;
    options.model = "qwen2-tiny-synth.gguf";
    options.http_listen = "127.0.0.1:0";
    // The name clients send, and a small body limit.
    options.served_model_name = "qwen-chat";
    options.http_max_body_bytes = 64 << 10;
    StartSuiteCluster(options);
  }
  static std::string http() { return cluster().http_address(); }
};

TEST_F(HttpChatTest, ChatEqualsGrpcMessagesStreamedAndNot) {
  const std::string question = "What is the capital of France?";
  v1::GenerateRequest request;
  request.set_max_tokens(12);
  request.mutable_sampling()->set_temperature(0);
  request.set_logprobs(2);
  v1::ChatMessage* m = request.add_messages();
  m->set_role("user");
  m->set_content(question);
  StreamResult grpc = RunGenerate(cluster().stub(), request);
  ASSERT_TRUE(grpc.status.ok()) << grpc.status.error_message();
  // The ChatML rendering of ../shared/goldens/qwen2-tiny-synth_chat.json's
  // single_user case: 15 tokens.
  EXPECT_EQ(grpc.prompt_tokens, 15u);

  // Content as text parts, split in two: the same prompt.
  json body = {{"model", "qwen-chat"},
               {"messages", {{{"role", "user"},
                              {"content", {{{"type", "text"}, {"text", "What is the capital"}},
                                           {{"type", "text"}, {"text", " of France?"}}}}}}},
               {"max_tokens", 12}, {"temperature", 0}, {"logprobs", true},
               {"top_logprobs", 2}};
  HttpResult r = HttpCall(http(), "POST", "/v1/chat/completions", body.dump());
  ASSERT_EQ(r.status, 200) << r.body;
  json j = Parse(r.body);
  EXPECT_EQ(j["object"], "chat.completion");
  EXPECT_THAT(j["id"].get<std::string>(), ::testing::StartsWith("chatcmpl-"));
  const json& choice = j["choices"][0];
  EXPECT_EQ(choice["message"]["role"], "assistant");
  EXPECT_EQ(choice["message"]["content"], grpc.text);
  EXPECT_EQ(j["usage"]["prompt_tokens"], 15);
  const json& content = choice["logprobs"]["content"];
  ASSERT_EQ(content.size(), grpc.logprobs.size());
  for (size_t i = 0; i < content.size(); ++i) {
    EXPECT_EQ(static_cast<float>(content[i]["logprob"].get<double>()), grpc.logprobs[i]);
    EXPECT_EQ(content[i]["top_logprobs"].size(), 2u);
    EXPECT_TRUE(content[i]["bytes"].is_array());
  }

  body["stream"] = true;
  absl::StatusOr<SseStream> s = SseStream::Open(http(), "/v1/chat/completions", body.dump());
  ASSERT_TRUE(s.ok()) << s.status();
  absl::StatusOr<std::vector<std::string>> events = s->ReadAll();
  ASSERT_TRUE(events.ok()) << events.status();
  ASSERT_GE(events->size(), 2u);
  json first = Parse(events->front());
  EXPECT_EQ(first["choices"][0]["delta"]["role"], "assistant");
  EXPECT_EQ(JoinStream(*events, /*chat=*/true).text, grpc.text);

  // Without max_tokens a chat generates up to the context: accepted.
  json open_ended = {{"model", "qwen-chat"},
                     {"messages", {{{"role", "user"}, {"content", question}}}},
                     {"temperature", 0}, {"stop", {"a", "e", "i", "o", "u"}}};
  HttpResult r2 = HttpCall(http(), "POST", "/v1/chat/completions", open_ended.dump());
  EXPECT_EQ(r2.status, 200) << r2.body;
  HttpResult tools = HttpCall(
      http(), "POST", "/v1/chat/completions",
      R"({"model":"qwen-chat","messages":[{"role":"user","content":"Hi"}],"tools":[{"type":"function","function":{"name":"f"}}]})");
  EXPECT_EQ(tools.status, 400);
  EXPECT_EQ(Parse(tools.body)["error"]["param"], "tools");
}

// router.served_model_name is the only model served; router.http_max_body_bytes
// bounds bodies.
TEST_F(HttpChatTest, ServedModelNameAndBodyLimit) {
  HttpResult models = HttpCall(http(), "GET", "/v1/models");
  ASSERT_EQ(models.status, 200) << models.body;
  EXPECT_EQ(Parse(models.body)["data"][0]["id"], "qwen-chat");
  // The file's stem is not a name this router answers to.
  HttpResult stem = HttpCall(
      http(), "POST", "/v1/chat/completions",
      R"({"model":"qwen2-tiny-synth","messages":[{"role":"user","content":"Hi"}],"max_tokens":2})");
  EXPECT_EQ(stem.status, 404) << stem.body;
  // 64 KiB is the limit: a 70 KB body gets 413, a 60 KB one is not refused
  // for its size.
  json big = {{"model", "qwen-chat"},
              {"messages", {{{"role", "user"}, {"content", std::string(70000, ' ')}}}},
              {"max_tokens", 1}};
  EXPECT_EQ(HttpCall(http(), "POST", "/v1/chat/completions", big.dump()).status, 413);
  big["messages"][0]["content"] = std::string(60000, ' ');
  HttpResult fits = HttpCall(http(), "POST", "/v1/chat/completions", big.dump());
  EXPECT_NE(fits.status, 413) << fits.body;
}

// Every remote prefill stalls after two KV frames (until cancelled or the
// 20 s transfer timeout), so streams stay open as long as the test wants.
class HttpStallTest : public ClusterSuite {
 protected:
  static constexpr int kMaxStreams = 8;
  static void SetUpTestSuite() {
    ClusterOptions options;
    options.http_listen = "127.0.0.1:0";
    options.http_max_streams = kMaxStreams;
    options.prefill_fault_stall_after_frames = 2;
    options.transfer_timeout_ms = 20000;
    options.handshake_timeout_ms = 20000;
    StartSuiteCluster(options);
  }
  static std::string http() { return cluster().http_address(); }
  static std::string RemoteStreamBody() {
    return json{{"model", "stories260K"}, {"prompt", Golden("long_repeated_313tok").prompt},
                {"max_tokens", 16}, {"temperature", 0}, {"stream", true}, {"route", "remote"}}
        .dump();
  }
};

TEST_F(HttpStallTest, HangingUpDuringRemotePrefillFreesBlocksOnPAndD) {
  absl::StatusOr<SseStream> s = SseStream::Open(http(), "/v1/completions", RemoteStreamBody());
  ASSERT_TRUE(s.ok()) << s.status();
  // No token can come: the first thing after the headers is a keep-alive.
  EXPECT_EQ(s->status(), 200);
  absl::StatusOr<std::string> first = s->Next();
  ASSERT_TRUE(first.ok()) << first.status();
  EXPECT_EQ(*first, ": keep-alive");
  absl::StatusOr<v1::WorkerStatus> d = cluster().DecodeStatus();
  absl::StatusOr<v1::WorkerStatus> p = cluster().PrefillStatus();
  ASSERT_TRUE(d.ok() && p.ok());
  EXPECT_GT(d->kv_blocks_in_use(), 0u);
  EXPECT_GT(p->kv_blocks_in_use(), 0u);

  s->Close();
  v1::ClusterStatus last;
  EXPECT_TRUE(cluster().WaitForIdleWorkers(absl::Seconds(5), &last))
      << "blocks still held 5 s after the client hung up (the transfer timeout is 20 s): "
      << last.DebugString();
}

TEST_F(HttpStallTest, StreamsBeyondTheLimitGet503AndNoHang) {
  // kMaxStreams stalled streams, opened together (each answers its
  // headers with the first keep-alive, after 2 s).
  std::vector<std::unique_ptr<SseStream>> open(kMaxStreams);
  std::vector<std::string> open_errors(kMaxStreams);
  {
    std::vector<std::thread> openers;
    for (int i = 0; i < kMaxStreams; ++i) {
      openers.emplace_back([&, i] {
        absl::StatusOr<SseStream> s =
            SseStream::Open(http(), "/v1/completions", RemoteStreamBody());
        if (s.ok()) {
          open[i] = std::make_unique<SseStream>(*std::move(s));
        } else {
          open_errors[i] = s.status().ToString();
        }
      });
    }
    for (std::thread& t : openers) t.join();
  }
  for (int i = 0; i < kMaxStreams; ++i) {
    ASSERT_NE(open[i], nullptr) << open_errors[i];
    ASSERT_EQ(open[i]->status(), 200);
  }
  // 300 more clients at once: each is refused at once with 503.
  constexpr int kBeyond = 300;
  std::vector<int> statuses(kBeyond, 0);
  std::vector<std::string> bodies(kBeyond);
  std::vector<std::thread> clients;
  const absl::Time start = absl::Now();
  for (int i = 0; i < kBeyond; ++i) {
    clients.emplace_back([&, i] {
      absl::StatusOr<SseStream> s = SseStream::Open(http(), "/v1/completions",
                                                    RemoteStreamBody(), {}, absl::Seconds(15));
      if (!s.ok()) return;
      statuses[i] = s->status();
      (void)s->ReadAll();
      bodies[i] = s->rest();
    });
  }
  for (std::thread& t : clients) t.join();
  EXPECT_LT(absl::Now() - start, absl::Seconds(15));
  for (int i = 0; i < kBeyond; ++i) {
    EXPECT_EQ(statuses[i], 503) << "client " << i;
    EXPECT_THAT(bodies[i], HasSubstr("http_max_streams")) << "client " << i;
  }
  for (std::unique_ptr<SseStream>& s : open) s->Close();
  v1::ClusterStatus last;
  EXPECT_TRUE(cluster().WaitForIdleWorkers(absl::Seconds(5), &last)) << last.DebugString();
}

// SIGTERM with requests still running past the drain (stalled remote
// prefills): each is answered "router is shutting down", a stream as its
// error event, a plain request as a 503.
TEST_F(HttpStallTest, ShutdownAnswersRunningRequests503) {
  absl::StatusOr<SseStream> stream =
      SseStream::Open(http(), "/v1/completions", RemoteStreamBody());
  ASSERT_TRUE(stream.ok()) << stream.status();
  ASSERT_EQ(stream->status(), 200);
  json plain_body = json::parse(RemoteStreamBody());
  plain_body["stream"] = false;
  HttpResult plain;
  std::thread client([&] { plain = HttpCall(http(), "POST", "/v1/completions", plain_body.dump()); });
  absl::SleepFor(absl::Milliseconds(500));  // both are waiting for their KV
  ASSERT_EQ(kill(cluster().router_pid(), SIGTERM), 0);
  client.join();
  EXPECT_EQ(plain.status, 503) << plain.error << plain.body;
  EXPECT_THAT(plain.body, HasSubstr("router is shutting down"));
  absl::StatusOr<std::vector<std::string>> events = stream->ReadAll();
  ASSERT_TRUE(events.ok()) << events.status();
  ASSERT_FALSE(events->empty());
  EXPECT_THAT(events->back(), HasSubstr("router is shutting down"));
  EXPECT_TRUE(Parse(events->back()).contains("error"));
}

}  // namespace
}  // namespace tandem::testing
