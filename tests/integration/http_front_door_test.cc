// The router's HTTP front door against clients that misbehave (issue #32):
// requests whose headers or body never finish arriving get 408 within
// router.http_read_timeout_ms, a declared body over
// router.http_max_body_bytes gets 413 before any of it is sent, both in
// OpenAI's error shape, and the connection closes.
#include <string>

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

}  // namespace
}  // namespace tandem::testing
