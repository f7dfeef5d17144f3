// The router's HTTP front door against clients that misbehave or are just
// large (issue #32): requests whose headers or body never finish arriving
// get 408 within router.http_read_timeout_ms, a declared body over
// router.http_max_body_bytes gets 413 before any of it is sent, both in
// OpenAI's error shape, and the connection closes; big bodies are parsed
// and tokenized off the HTTP loop, which keeps answering /health.
#include <algorithm>
#include <atomic>
#include <string>
#include <thread>
#include <vector>

#include "absl/strings/str_cat.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "nlohmann/json.hpp"
#include "tests/integration/cluster_fixture.h"
#include "tests/integration/http_client.h"

namespace tandem::testing {
namespace {

using nlohmann::json;
using ::testing::HasSubstr;

constexpr int kReadTimeoutMs = 300;

// The default cluster, its HTTP front door with a short read timeout.
class HttpReadLimitsTest : public ClusterSuite {
 protected:
  static void SetUpTestSuite() {
    ClusterOptions options;
    options.http_listen = "127.0.0.1:0";
    options.http_read_timeout_ms = kReadTimeoutMs;
    StartSuiteCluster(options);
  }
  static std::string http() { return cluster().http_address(); }

  // The OpenAI error of a refusal the server made itself (it closes the
  // connection, within `within`).
  static json ErrorOf(const RawHttpResult& r, absl::Duration within) {
    EXPECT_TRUE(r.closed) << "the connection was held past the timeout";
    EXPECT_LT(r.took, within);
    EXPECT_EQ(r.headers.count("content-type") ? r.headers.at("content-type") : "",
              "application/json");
    json j = json::parse(r.body, nullptr, /*allow_exceptions=*/false);
    EXPECT_TRUE(j.is_object() && j.contains("error")) << r.body;
    return j.is_object() && j.contains("error") ? j["error"] : json();
  }
};

TEST_F(HttpReadLimitsTest, HeadersThatNeverEndGet408AndTheConnectionCloses) {
  RawHttpResult r = RawHttp(http(), "POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Ty",
                            absl::Seconds(20));
  ASSERT_TRUE(r.error.empty()) << r.error;
  EXPECT_EQ(r.status, 408) << r.body;
  EXPECT_GE(r.took, absl::Milliseconds(kReadTimeoutMs));
  json e = ErrorOf(r, absl::Seconds(5));
  EXPECT_EQ(e["type"], "invalid_request_error");
  EXPECT_EQ(e["code"], "request_timeout");
  EXPECT_THAT(e["message"].get<std::string>(),
              HasSubstr(absl::StrCat("request headers incomplete after ", kReadTimeoutMs,
                                     " ms (router.http_read_timeout_ms)")));
}

TEST_F(HttpReadLimitsTest, ABodyThatNeverComesGets408) {
  RawHttpResult r = RawHttp(http(),
                            "POST /v1/completions HTTP/1.1\r\nHost: x\r\n"
                            "Content-Type: application/json\r\nContent-Length: 100\r\n\r\n{\"mo",
                            absl::Seconds(20));
  ASSERT_TRUE(r.error.empty()) << r.error;
  EXPECT_EQ(r.status, 408) << r.body;
  json e = ErrorOf(r, absl::Seconds(5));
  EXPECT_THAT(e["message"].get<std::string>(), HasSubstr("request body incomplete after"));
}

TEST_F(HttpReadLimitsTest, ADeclaredBodyOverTheLimitGets413BeforeItIsSent) {
  RawHttpResult r = RawHttp(http(),
                            "POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\n"
                            "Content-Type: application/json\r\nContent-Length: 9999999999\r\n\r\n",
                            absl::Seconds(20));
  ASSERT_TRUE(r.error.empty()) << r.error;
  EXPECT_EQ(r.status, 413) << r.body;
  json e = ErrorOf(r, absl::Seconds(5));
  EXPECT_EQ(e["type"], "invalid_request_error");
  EXPECT_EQ(e["code"], "request_too_large");
  EXPECT_EQ(e["message"],
            "request body of 9999999999 bytes is over the limit of 8388608 bytes "
            "(router.http_max_body_bytes)");
  // The front door still serves.
  EXPECT_EQ(HttpCall(http(), "GET", "/health").status, 200);
}

// A model with a chat template; three ~7 MB chat requests without
// max_tokens at once, each rendered and tokenized for seconds (issue #32).
class HttpLoopTest : public ClusterSuite {
 protected:
  static void SetUpTestSuite() {
    ClusterOptions options;
    options.model = "qwen2-tiny-synth.gguf";
    options.http_listen = "127.0.0.1:0";
    StartSuiteCluster(options);
  }
  static std::string http() { return cluster().http_address(); }
};

// The HTTP loop stays responsive: GET /health, probed every 20 ms, answers
// each probe within 250 ms while the big requests are parsed and
// tokenized (before: on the loop thread, 1-4 s each, every probe and
// stream stalled).
TEST_F(HttpLoopTest, HealthAnswersWithin250MsWhileThreeBigChatsAreTokenized) {
  // ~7 MB of ordinary words (under the 8 MiB body limit).
  std::string content;
  while (content.size() < 7'000'000) content += "The quick brown fox jumps over the lazy dog. ";
  const std::string body =
      json{{"model", "qwen2-tiny-synth"},
           {"messages", {{{"role", "user"}, {"content", content}}}}}
          .dump();
  ASSERT_LT(body.size(), size_t{8} << 20);
  ASSERT_GT(body.size(), size_t{6'900'000});
  std::atomic<int> done{0};
  std::vector<HttpResult> results(3);
  std::vector<std::thread> senders;
  for (int i = 0; i < 3; ++i) {
    senders.emplace_back([&, i] {
      results[i] = HttpCall(http(), "POST", "/v1/chat/completions", body);
      done.fetch_add(1);
    });
  }
  // Probe until every big request was answered (and at least 1 s).
  std::vector<absl::Duration> slow;
  int probes = 0;
  const absl::Time start = absl::Now();
  absl::Time next = start;
  while (done.load() < 3 || absl::Now() - start < absl::Seconds(1)) {
    const absl::Time t0 = absl::Now();
    HttpResult h = HttpCall(http(), "GET", "/health");
    const absl::Duration took = absl::Now() - t0;
    ++probes;
    EXPECT_EQ(h.status, 200) << h.error;
    if (took > absl::Milliseconds(250)) slow.push_back(took);
    next += absl::Milliseconds(20);
    if (absl::Now() < next) absl::SleepFor(next - absl::Now());
    ASSERT_LT(absl::Now() - start, absl::Seconds(120)) << "the big requests never finished";
  }
  for (std::thread& t : senders) t.join();
  EXPECT_TRUE(slow.empty()) << slow.size() << " of " << probes
                            << " probes took over 250 ms; the slowest "
                            << absl::FormatDuration(*std::max_element(slow.begin(), slow.end()));
  // Each big request was rendered and tokenized: far over the context.
  for (const HttpResult& r : results) {
    EXPECT_EQ(r.status, 400) << r.error << r.body.substr(0, 300);
    json j = json::parse(r.body, nullptr, /*allow_exceptions=*/false);
    ASSERT_TRUE(j.is_object()) << r.body.substr(0, 300);
    EXPECT_EQ(j["error"]["code"], "context_length_exceeded") << r.body.substr(0, 300);
  }
}

}  // namespace
}  // namespace tandem::testing
