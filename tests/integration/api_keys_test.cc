// API keys and token quotas (issue #13, item 4) on a real cluster whose
// router has router.api_keys_file with two keys: alice (tokens_per_minute
// 120: 2 tokens a second, so a spent bucket refills within seconds) and
// bob (no limits). Every Generation call needs `authorization: Bearer`;
// the gRPC health service stays open; alice is served until her bucket is
// spent, then refused with retry-after-ms while bob is served, then served
// again once it refilled; GetStatus reports per key exactly the prompt and
// generated tokens the client was sent. Each request reserves prompt +
// max_tokens x n at admission (issue #32): concurrent requests never drive
// the bucket below 0 and no refusal names a negative balance; a request
// that may use more than the whole minute is refused at once (HTTP 400,
// not a 429 a client would retry forever). A running router re-reads its keys
// file (router/api_keys_reloader.h): a file swapped by rename to other
// keys takes effect, a broken one is logged and the keys stay.
#include <grpcpp/generic/generic_stub.h>
#include <grpcpp/grpcpp.h>
#include <signal.h>
#include <stdlib.h>

#include <cstdio>
#include <atomic>
#include <map>
#include <mutex>
#include <regex>
#include <string>
#include <thread>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/synchronization/notification.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "nlohmann/json.hpp"
#include "tests/integration/cluster_fixture.h"
#include "tests/integration/generate_client.h"
#include "tests/integration/http_client.h"
#include "tests/integration/up_fixture.h"

namespace tandem::testing {
namespace {

using ::testing::HasSubstr;
using ::testing::Not;

// printf %s KEY | sha256sum
constexpr char kAliceKey[] = "sk-test-alice";
constexpr char kAliceSha[] = "4d692786b022a5d5a48381dcaf1e5e346366feb5579a1d699de2991d153b05f9";
constexpr char kBobKey[] = "sk-test-bob";
constexpr char kBobSha[] = "126fa001bf47b8fca67b958c7cdb3745b15c8eab28dd77b91a53305b5f90632f";
constexpr int64_t kAliceTokensPerMinute = 120;
constexpr char kPrompt[] = "Once upon a time";
constexpr uint32_t kMaxTokens = 10;

// One Generate call with `key` ("" = no metadata), read to its end.
struct Call {
  grpc::Status status;
  uint32_t prompt_tokens = 0;
  uint64_t generated = 0;        // tokens received, every sample
  int64_t retry_after_ms = -1;   // the trailer; -1 when absent
};

Call Generate(LocalCluster& cluster, const std::string& key, const v1::GenerateRequest& request,
              absl::Duration timeout = absl::Seconds(30)) {
  grpc::ClientContext context;
  context.set_deadline(absl::ToChronoTime(absl::Now() + timeout));
  if (!key.empty()) context.AddMetadata("authorization", absl::StrCat("Bearer ", key));
  Call call;
  auto reader = cluster.stub().Generate(&context, request);
  v1::GenerateResponse msg;
  while (reader->Read(&msg)) {
    if (msg.prompt_tokens() != 0) call.prompt_tokens = msg.prompt_tokens();
    call.generated += static_cast<uint64_t>(msg.tokens_size());
  }
  call.status = reader->Finish();
  const auto& trailers = context.GetServerTrailingMetadata();
  if (auto it = trailers.find("retry-after-ms"); it != trailers.end()) {
    int64_t ms = 0;
    EXPECT_TRUE(absl::SimpleAtoi(std::string(it->second.data(), it->second.size()), &ms));
    call.retry_after_ms = ms;
  }
  return call;
}

// Exactly kMaxTokens generated tokens (no early end of generation).
v1::GenerateRequest Request(const std::string& prompt = kPrompt) {
  v1::GenerateRequest r = MakeRequest(prompt, kMaxTokens);
  r.set_ignore_eos(true);
  return r;
}

// One key's usage from the router's GetStatus (sent with bob's key).
v1::ApiKeyUsage Usage(LocalCluster& cluster, const std::string& name) {
  absl::StatusOr<v1::ClusterStatus> s = cluster.ClusterStatus();
  EXPECT_TRUE(s.ok()) << s.status();
  if (!s.ok()) return {};
  EXPECT_TRUE(s->api_keys_required());
  for (const v1::ApiKeyUsage& u : s->api_keys()) {
    if (u.name() == name) return u;
  }
  ADD_FAILURE() << "no usage for key " << name;
  return {};
}

class ApiKeysTest : public OwnClusterTest {
 protected:
  void SetUp() override {
    dir_ = MakeTempDir();
    ASSERT_FALSE(dir_.empty());
    const std::string keys = dir_ + "/keys.yaml";
    ASSERT_TRUE(WriteFile(keys, absl::StrCat("keys:\n"
                                             "  - name: alice\n"
                                             "    sha256: ", kAliceSha, "\n",
                                             "    tokens_per_minute: ", kAliceTokensPerMinute, "\n",
                                             "  - name: bob\n"
                                             "    sha256: ", kBobSha, "\n",
                                             "    admin: true\n")));
    ClusterOptions o;
    o.api_keys_file = keys;
    o.api_key = kBobKey;
    o.http_listen = "127.0.0.1:0";
    o.router_metrics_listen = "127.0.0.1:0";
    ASSERT_NO_FATAL_FAILURE(StartCluster(o));
  }
  std::string dir_;
};

TEST_F(ApiKeysTest, MissingOrInvalidKeyIsUnauthenticatedHealthStaysOpen) {
  const std::string missing = "missing API key (authorization: Bearer ...)";
  Call none = Generate(cluster(), "", Request());
  EXPECT_EQ(none.status.error_code(), grpc::StatusCode::UNAUTHENTICATED);
  EXPECT_EQ(none.status.error_message(), missing);
  Call wrong = Generate(cluster(), "sk-test-carol", Request());
  EXPECT_EQ(wrong.status.error_code(), grpc::StatusCode::UNAUTHENTICATED);
  EXPECT_EQ(wrong.status.error_message(), "invalid API key");

  // The unary methods too.
  {
    grpc::ClientContext context;
    v1::TokenizeRequest request;
    request.set_text(kPrompt);
    v1::TokenizeResponse response;
    grpc::Status s = cluster().stub().Tokenize(&context, request, &response);
    EXPECT_EQ(s.error_code(), grpc::StatusCode::UNAUTHENTICATED);
    EXPECT_EQ(s.error_message(), missing);
  }
  {
    grpc::ClientContext context;
    context.AddMetadata("authorization", "Bearer sk-test-carol");
    v1::GetModelInfoResponse response;
    grpc::Status s = cluster().stub().GetModelInfo(&context, {}, &response);
    EXPECT_EQ(s.error_code(), grpc::StatusCode::UNAUTHENTICATED);
    EXPECT_EQ(s.error_message(), "invalid API key");
  }
  {
    grpc::ClientContext context;
    v1::ClusterStatus response;
    grpc::Status s = cluster().stub().GetStatus(&context, {}, &response);
    EXPECT_EQ(s.error_code(), grpc::StatusCode::UNAUTHENTICATED);
  }
  {
    grpc::ClientContext context;
    context.AddMetadata("authorization", absl::StrCat("Bearer ", kAliceKey));
    v1::GetModelInfoResponse response;
    grpc::Status s = cluster().stub().GetModelInfo(&context, {}, &response);
    EXPECT_TRUE(s.ok()) << s.error_message();
  }

  // grpc.health.v1.Health/Check needs no key: SERVING (status = 1, the
  // message's bytes 08 01).
  auto channel = grpc::CreateChannel(cluster().router_address(), grpc::InsecureChannelCredentials());
  grpc::GenericStub generic(channel);
  grpc::ClientContext context;
  context.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(10));
  grpc::ByteBuffer request;  // HealthCheckRequest{} serializes to no bytes
  grpc::Slice empty;
  request = grpc::ByteBuffer(&empty, 1);
  grpc::ByteBuffer response;
  grpc::Status health;
  absl::Notification done;
  generic.UnaryCall(&context, "/grpc.health.v1.Health/Check", grpc::StubOptions(), &request,
                    &response, [&](grpc::Status s) {
                      health = s;
                      done.Notify();
                    });
  done.WaitForNotification();
  ASSERT_TRUE(health.ok()) << health.error_message();
  std::vector<grpc::Slice> slices;
  ASSERT_TRUE(response.Dump(&slices).ok());
  std::string bytes;
  for (const grpc::Slice& s : slices) bytes.append(reinterpret_cast<const char*>(s.begin()), s.size());
  EXPECT_EQ(bytes, std::string("\x08\x01", 2));

  // Nothing was charged or counted for the refused calls.
  const v1::ApiKeyUsage alice = Usage(cluster(), "alice");
  EXPECT_EQ(alice.requests(), 0u);
  EXPECT_EQ(alice.refused(), 0u);
  EXPECT_EQ(alice.tokens_available(), kAliceTokensPerMinute);
}

TEST_F(ApiKeysTest, SpentKeyRefusedWithRetryAfterOtherKeyServedThenRefilled) {
  uint64_t served = 0, refused = 0, prompt_tokens = 0, generated = 0;
  // Alice's bucket (120) runs out after a few requests of ~5 + 10 tokens.
  Call last;
  for (int i = 0; i < 40; ++i) {
    last = Generate(cluster(), kAliceKey, Request());
    if (!last.status.ok()) break;
    ++served;
    prompt_tokens += last.prompt_tokens;
    generated += last.generated;
    EXPECT_EQ(last.generated, kMaxTokens);
  }
  ASSERT_EQ(last.status.error_code(), grpc::StatusCode::RESOURCE_EXHAUSTED)
      << last.status.error_message();
  ++refused;
  EXPECT_GE(served, 3u);
  EXPECT_THAT(last.status.error_message(), HasSubstr("API key 'alice': "));
  EXPECT_THAT(last.status.error_message(), HasSubstr("; tokens_per_minute 120)"));
  // The wait for at most the whole reservation (prompt + max_tokens) at 2
  // tokens a second.
  const uint32_t prompt_len = static_cast<uint32_t>(prompt_tokens / served);
  EXPECT_THAT(last.status.error_message(),
              HasSubstr(absl::StrCat(" tokens available, this request reserves ",
                                     prompt_len + kMaxTokens, " (prompt ", prompt_len,
                                     " + max_tokens ", kMaxTokens, ";")));
  EXPECT_GT(last.retry_after_ms, 0);
  EXPECT_LE(last.retry_after_ms, int64_t{prompt_len + kMaxTokens} * 500);

  // Bob is served meanwhile.
  Call bob = Generate(cluster(), kBobKey, Request());
  ASSERT_TRUE(bob.status.ok()) << bob.status.error_message();
  EXPECT_EQ(bob.generated, kMaxTokens);

  // Alice again once the bucket refilled (about retry_after_ms later).
  Call again;
  ASSERT_TRUE(PollUntil(
      absl::Seconds(20),
      [&] {
        again = Generate(cluster(), kAliceKey, Request());
        if (again.status.error_code() == grpc::StatusCode::RESOURCE_EXHAUSTED) ++refused;
        return again.status.ok();
      },
      absl::Milliseconds(100)))
      << again.status.error_message();
  ++served;
  prompt_tokens += again.prompt_tokens;
  generated += again.generated;

  // Usage per key: exactly what the clients were sent.
  v1::ApiKeyUsage alice;
  ASSERT_TRUE(PollUntil(absl::Seconds(10), [&] {
    alice = Usage(cluster(), "alice");
    return alice.in_flight() == 0;
  }));
  EXPECT_EQ(alice.requests(), served);
  EXPECT_EQ(alice.refused(), refused);
  EXPECT_EQ(alice.prompt_tokens(), prompt_tokens);
  EXPECT_EQ(alice.generated_tokens(), generated);
  EXPECT_EQ(alice.tokens_per_minute(), 120u);
  EXPECT_EQ(alice.max_concurrent_requests(), 0u);
  EXPECT_LT(alice.tokens_available(), int64_t{prompt_len} + kMaxTokens);
  EXPECT_GE(alice.tokens_available(), 0);
  const v1::ApiKeyUsage b = Usage(cluster(), "bob");
  EXPECT_EQ(b.requests(), 1u);
  EXPECT_EQ(b.refused(), 0u);
  EXPECT_EQ(b.prompt_tokens(), bob.prompt_tokens);
  EXPECT_EQ(b.generated_tokens(), kMaxTokens);
  EXPECT_EQ(b.tokens_available(), 0);  // unlimited: no bucket
}

// A request that may use more than the key's whole minute (a long prompt,
// or a short one with a large max_tokens x n) can never run: refused at
// once, naming the numbers and what to lower, without retry-after-ms
// (gRPC) and as 400 on HTTP (a 429 would be retried forever by clients).
TEST_F(ApiKeysTest, RequestOverTheMinuteIsNeverAdmittedAndCliSendsTheKey) {
  std::string long_prompt;
  for (int i = 0; i < 150; ++i) absl::StrAppend(&long_prompt, i ? " " : "", "a");
  Call big = Generate(cluster(), kAliceKey, Request(long_prompt));
  ASSERT_EQ(big.status.error_code(), grpc::StatusCode::RESOURCE_EXHAUSTED);
  std::smatch m;
  const std::string big_message = big.status.error_message();
  ASSERT_TRUE(std::regex_match(
      big_message, m,
      std::regex("API key 'alice': this request may use ([0-9]+) tokens \\(prompt ([0-9]+) \\+ "
                 "max_tokens 10\\), more than its tokens_per_minute of 120; lower max_tokens or "
                 "n, or shorten the prompt")))
      << big_message;
  EXPECT_GT(std::stoi(m[2]), 120);  // 150 "a"s: over the minute by itself
  EXPECT_EQ(std::stoi(m[1]), std::stoi(m[2]) + 10);
  EXPECT_EQ(big.retry_after_ms, -1);  // no point retrying
  // A short prompt whose samples may use more than the minute: 4 x 40.
  v1::GenerateRequest samples = MakeRequest(kPrompt, 40);
  samples.set_n(4);
  Call many = Generate(cluster(), kAliceKey, samples);
  ASSERT_EQ(many.status.error_code(), grpc::StatusCode::RESOURCE_EXHAUSTED);
  EXPECT_THAT(many.status.error_message(), HasSubstr(" + max_tokens 40 x n 4), more than its "
                                                     "tokens_per_minute of 120"));
  EXPECT_EQ(many.retry_after_ms, -1);
  // HTTP: 400 in OpenAI's error shape, no Retry-After.
  HttpResult http = HttpCall(
      cluster().http_address(), "POST", "/v1/completions",
      R"({"model":"stories260K","prompt":"Once upon a time","max_tokens":200})",
      {{"Authorization", absl::StrCat("Bearer ", kAliceKey)}});
  EXPECT_EQ(http.status, 400) << http.body;
  EXPECT_EQ(http.headers.count("retry-after"), 0u);
  const nlohmann::json e = nlohmann::json::parse(http.body, nullptr, false);
  ASSERT_TRUE(e.contains("error")) << http.body;
  EXPECT_EQ(e["error"]["type"], "invalid_request_error") << http.body;
  EXPECT_THAT(e["error"]["message"].get<std::string>(),
              HasSubstr(" + max_tokens 200), more than its tokens_per_minute of 120; lower "
                        "max_tokens or n, or shorten the prompt"));
  EXPECT_EQ(Usage(cluster(), "alice").tokens_available(), kAliceTokensPerMinute);

  // tandem generate / status with --api-key, and without.
  const std::string router = cluster().router_address();
  unsetenv("TANDEM_API_KEY");
  ProcessResult no_key = RunProcess(
      {BinaryPath("tandem"), "generate", "--router", router, "--max-tokens", "4", kPrompt},
      absl::Seconds(30));
  EXPECT_EQ(no_key.exit_code, 1) << no_key.Describe();
  EXPECT_EQ(no_key.err,
            "tandem: UNAUTHENTICATED: missing API key (authorization: Bearer ...)\n");
  ProcessResult gen = RunProcess({BinaryPath("tandem"), "generate", "--router", router,
                                  "--api-key", kBobKey, "--max-tokens", "4", "--ignore-eos",
                                  "--json", kPrompt},
                                 absl::Seconds(30));
  ASSERT_EQ(gen.exit_code, 0) << gen.Describe();
  ASSERT_TRUE(PollUntil(absl::Seconds(10), [&] { return Usage(cluster(), "bob").in_flight() == 0; }));
  setenv("TANDEM_API_KEY", kBobKey, 1);
  ProcessResult status = RunProcess({BinaryPath("tandem"), "status", "--router", router},
                                    absl::Seconds(30));
  unsetenv("TANDEM_API_KEY");
  ASSERT_EQ(status.exit_code, 0) << status.Describe();
  EXPECT_THAT(status.out, HasSubstr("\napi_key alice requests=0 refused=3 prompt_tokens=0 "
                                    "generated_tokens=0 in_flight=0 tokens_available=120 "
                                    "tokens_per_minute=120 max_concurrent_requests=unlimited\n"));
  EXPECT_THAT(status.out, HasSubstr("\napi_key bob requests=1 refused=0 "));
  EXPECT_THAT(status.out, HasSubstr(" generated_tokens=4 in_flight=0 tokens_available=unlimited "
                                    "tokens_per_minute=unlimited "
                                    "max_concurrent_requests=unlimited\n"));
  // A key without `admin: true` sees its own usage, nothing of another
  // tenant's.
  ProcessResult own = RunProcess(
      {BinaryPath("tandem"), "status", "--router", router, "--api-key", kAliceKey},
      absl::Seconds(30));
  ASSERT_EQ(own.exit_code, 0) << own.Describe();
  EXPECT_THAT(own.out, HasSubstr("\napi_key alice requests=0 refused=3 "));
  EXPECT_THAT(own.out, Not(HasSubstr("api_key bob")));
}

// Issue #32: a refusal said "-12 tokens available" (generated tokens were
// charged after the fact, so each request could overshoot the minute by
// its max_tokens). Ten clients at once, gRPC and HTTP, against alice's 120
// tokens a minute, each request reserving its prompt + 30: only as many
// run at once as their reservations fit, the others are refused
// (RESOURCE_EXHAUSTED / 429) naming a balance that is never negative, and
// GetStatus, polled all along, never shows one.
TEST_F(ApiKeysTest, ConcurrentRequestsNeverDriveTheBalanceNegative) {
  constexpr uint32_t kLong = 30;
  std::mutex mu;
  std::vector<std::string> refusals;  // every refusal's message
  int served = 0;
  auto record = [&](bool ok, const std::string& message) {
    std::lock_guard<std::mutex> lock(mu);
    if (ok) {
      ++served;
    } else {
      refusals.push_back(message);
    }
  };
  std::atomic<bool> done{false};
  int64_t lowest = kAliceTokensPerMinute;
  int polls = 0;
  std::thread watcher([&] {
    while (!done.load()) {
      lowest = std::min<int64_t>(lowest, Usage(cluster(), "alice").tokens_available());
      ++polls;
      absl::SleepFor(absl::Milliseconds(5));  // the polling cadence
    }
  });
  std::vector<std::thread> clients;
  for (int i = 0; i < 6; ++i) {
    clients.emplace_back([&] {
      for (int j = 0; j < 3; ++j) {
        v1::GenerateRequest r = MakeRequest(kPrompt, kLong);
        r.set_ignore_eos(true);
        Call c = Generate(cluster(), kAliceKey, r);
        if (c.status.ok()) {
          EXPECT_EQ(c.generated, kLong);
        } else {
          EXPECT_EQ(c.status.error_code(), grpc::StatusCode::RESOURCE_EXHAUSTED)
              << c.status.error_message();
          EXPECT_GT(c.retry_after_ms, 0) << c.status.error_message();
        }
        record(c.status.ok(), c.status.error_message());
      }
    });
  }
  const std::string body = absl::StrCat(R"({"model":"stories260K","prompt":")", kPrompt,
                                        R"(","max_tokens":)", kLong, R"(,"ignore_eos":true})");
  for (int i = 0; i < 4; ++i) {
    clients.emplace_back([&] {
      for (int j = 0; j < 3; ++j) {
        HttpResult h = HttpCall(cluster().http_address(), "POST", "/v1/completions", body,
                                {{"Authorization", absl::StrCat("Bearer ", kAliceKey)}});
        if (h.status == 200) {
          record(true, "");
          continue;
        }
        EXPECT_EQ(h.status, 429) << h.body;
        EXPECT_EQ(h.headers.count("retry-after"), 1u) << h.body;
        const nlohmann::json e = nlohmann::json::parse(h.body, nullptr, false);
        const bool shaped = e.is_object() && e.contains("error") && e["error"].is_object();
        EXPECT_TRUE(shaped) << h.body;
        EXPECT_EQ(shaped ? e["error"].value("type", "") : "", "rate_limit_error") << h.body;
        record(false, shaped ? e["error"].value("message", h.body) : h.body);
      }
    });
  }
  for (std::thread& t : clients) t.join();
  done.store(true);
  watcher.join();

  EXPECT_GE(served, 3);
  EXPECT_FALSE(refusals.empty());  // 10 x (prompt + 30) at once cannot fit in 120
  EXPECT_GT(polls, 0);
  EXPECT_GE(lowest, 0);
  const std::regex available("^API key 'alice': ([0-9]+) tokens available, this request reserves "
                             "([0-9]+) \\(prompt ([0-9]+) \\+ max_tokens 30; tokens_per_minute "
                             "120\\)$");
  for (const std::string& message : refusals) {
    EXPECT_THAT(message, Not(HasSubstr("-"))) << "a negative number";
    std::smatch m;
    ASSERT_TRUE(std::regex_match(message, m, available)) << message;
    EXPECT_LT(std::stoi(m[1]), std::stoi(m[2])) << message;
    EXPECT_EQ(std::stoi(m[2]), std::stoi(m[3]) + 30) << message;
  }
  v1::ApiKeyUsage alice;
  ASSERT_TRUE(PollUntil(absl::Seconds(10), [&] {
    alice = Usage(cluster(), "alice");
    return alice.in_flight() == 0;
  }));
  EXPECT_GE(alice.tokens_available(), 0);
  EXPECT_LE(alice.tokens_available(), kAliceTokensPerMinute);
  EXPECT_EQ(alice.requests(), static_cast<uint64_t>(served));
  EXPECT_EQ(alice.refused(), refusals.size());
  EXPECT_EQ(alice.generated_tokens(), uint64_t{kLong} * served);
}

// The key's limits come before the router's admission (router.max_inflight
// 1, router.max_queued 1, the decode worker stopped so the first request
// holds the only slot): a request refused by its key takes no queue place;
// one the router refuses, or drops from its queue, is refunded in full and
// not counted; an invalid request costs nothing.
TEST(ApiKeysAdmissionTest, KeyRefusalHoldsNoSlotRouterRefusalRefunds) {
  const std::string dir = MakeTempDir();
  ASSERT_FALSE(dir.empty());
  const std::string keys = dir + "/keys.yaml";
  // bob: 60 tokens a minute, so a missing refund shows for a minute.
  ASSERT_TRUE(WriteFile(keys, absl::StrCat("keys:\n"
                                           "  - name: alice\n"
                                           "    sha256: ", kAliceSha, "\n",
                                           "    max_concurrent_requests: 1\n"
                                           "  - name: bob\n"
                                           "    sha256: ", kBobSha, "\n",
                                           "    tokens_per_minute: 60\n",
                                           "    admin: true\n")));  // reads alice's usage
  ClusterOptions o;
  o.api_keys_file = keys;
  o.api_key = kBobKey;
  o.max_inflight = 1;
  o.max_queued = 1;
  // As admission_test: no health poll while the decode worker is stopped.
  o.poll_interval_ms = 600000;
  o.rpc_timeout_ms = 300;
  absl::StatusOr<std::unique_ptr<LocalCluster>> started = LocalCluster::Start(o);
  ASSERT_TRUE(started.ok()) << started.status();
  LocalCluster& cluster = **started;

  // Invalid: INVALID_ARGUMENT, nothing charged or counted.
  v1::GenerateRequest invalid = Request();
  invalid.set_max_tokens(0);
  Call bad = Generate(cluster, kBobKey, invalid);
  EXPECT_EQ(bad.status.error_code(), grpc::StatusCode::INVALID_ARGUMENT);
  v1::ApiKeyUsage bob = Usage(cluster, "bob");
  EXPECT_EQ(bob.tokens_available(), 60);
  EXPECT_EQ(bob.refused(), 0u);
  EXPECT_EQ(bob.in_flight(), 0u);

  ASSERT_EQ(kill(cluster.decode_pid(), SIGSTOP), 0);
  ASSERT_TRUE(WaitStopped(cluster.decode_pid(), absl::Seconds(5)));
  auto router_counts = [&] {
    absl::StatusOr<v1::ClusterStatus> s = cluster.ClusterStatus();
    if (!s.ok()) return std::make_pair(-1, -1);
    return std::make_pair(static_cast<int>(s->router().running_requests()),
                          static_cast<int>(s->router().queued_requests()));
  };
  Call a1;
  std::thread first([&] { a1 = Generate(cluster, kAliceKey, Request()); });
  EXPECT_TRUE(PollUntil(absl::Seconds(20), [&] { return router_counts() == std::make_pair(1, 0); }));

  // Alice's second request: refused by her key, not queued.
  Call a2 = Generate(cluster, kAliceKey, Request());
  EXPECT_EQ(a2.status.error_code(), grpc::StatusCode::RESOURCE_EXHAUSTED);
  EXPECT_EQ(a2.status.error_message(),
            "API key 'alice': 1 requests in flight (max_concurrent_requests 1)");
  EXPECT_EQ(a2.retry_after_ms, 10000);  // none of her requests has ended yet
  EXPECT_EQ(router_counts(), std::make_pair(1, 0));

  // Bob's first request takes the queue place (deadline 1.5 s) ...
  Call b1;
  std::thread queued([&] { b1 = Generate(cluster, kBobKey, Request(), absl::Milliseconds(1500)); });
  EXPECT_TRUE(PollUntil(absl::Seconds(20), [&] { return router_counts() == std::make_pair(1, 1); }));
  // ... his second is refused by the router, refunded, not counted.
  Call b2 = Generate(cluster, kBobKey, Request());
  EXPECT_EQ(b2.status.error_code(), grpc::StatusCode::RESOURCE_EXHAUSTED);
  EXPECT_THAT(b2.status.error_message(), HasSubstr("router at capacity"));
  bob = Usage(cluster, "bob");
  EXPECT_EQ(bob.in_flight(), 1u);  // b1, queued
  EXPECT_EQ(bob.refused(), 0u);
  queued.join();
  EXPECT_EQ(b1.status.error_code(), grpc::StatusCode::DEADLINE_EXCEEDED);
  // b1 left the queue without running: refunded too, so the bucket is
  // full again (without the refunds it would be two reservations short).
  EXPECT_TRUE(PollUntil(absl::Seconds(10), [&] {
    bob = Usage(cluster, "bob");
    return bob.in_flight() == 0;
  }));
  EXPECT_EQ(bob.tokens_available(), 60);
  EXPECT_EQ(bob.requests(), 0u);
  EXPECT_EQ(bob.prompt_tokens(), 0u);

  ASSERT_EQ(kill(cluster.decode_pid(), SIGCONT), 0);
  first.join();
  ASSERT_TRUE(a1.status.ok()) << a1.status.error_message();
  v1::ApiKeyUsage alice;
  EXPECT_TRUE(PollUntil(absl::Seconds(10), [&] {
    alice = Usage(cluster, "alice");
    return alice.in_flight() == 0;
  }));
  EXPECT_EQ(alice.requests(), 1u);
  EXPECT_EQ(alice.refused(), 1u);
  EXPECT_EQ(alice.prompt_tokens(), a1.prompt_tokens);
  EXPECT_EQ(alice.generated_tokens(), a1.generated);
  EXPECT_EQ(a1.generated, kMaxTokens);
}

// Every emitted token is charged once, over n samples and when a stop
// string ends a sample mid-message (tokens after the match never reach the
// client and are not charged).
TEST_F(ApiKeysTest, EveryEmittedTokenOfEverySampleIsCharged) {
  v1::GenerateRequest three = Request();
  three.set_n(3);
  three.mutable_sampling()->set_temperature(0.8f);
  three.mutable_sampling()->set_seed(5);
  three.mutable_sampling()->set_has_seed(true);
  Call samples = Generate(cluster(), kBobKey, three);
  ASSERT_TRUE(samples.status.ok()) << samples.status.error_message();
  EXPECT_EQ(samples.generated, 3 * kMaxTokens);

  // A stop string from the middle of the greedy text.
  StreamResult greedy = RunGenerate(cluster().stub(), Request());  // no key: refused
  EXPECT_EQ(greedy.status.error_code(), grpc::StatusCode::UNAUTHENTICATED);
  grpc::ClientContext context;
  context.AddMetadata("authorization", absl::StrCat("Bearer ", kBobKey));
  v1::GenerateRequest plain = Request();
  plain.set_max_tokens(20);
  auto reader = cluster().stub().Generate(&context, plain);
  std::string text;
  uint64_t plain_tokens = 0;
  v1::GenerateResponse msg;
  while (reader->Read(&msg)) {
    text += msg.text();
    plain_tokens += static_cast<uint64_t>(msg.tokens_size());
  }
  ASSERT_TRUE(reader->Finish().ok());
  ASSERT_GE(text.size(), 12u) << text;
  v1::GenerateRequest stopped = plain;
  stopped.add_stop(text.substr(text.size() / 2, 3));
  Call stop = Generate(cluster(), kBobKey, stopped);
  ASSERT_TRUE(stop.status.ok()) << stop.status.error_message();
  EXPECT_LT(stop.generated, 20u) << "the stop string '" << stopped.stop(0) << "' never matched";

  v1::ApiKeyUsage bob;
  ASSERT_TRUE(PollUntil(absl::Seconds(10), [&] {
    bob = Usage(cluster(), "bob");
    return bob.in_flight() == 0;
  }));
  EXPECT_EQ(bob.requests(), 3u);
  EXPECT_EQ(bob.generated_tokens(), samples.generated + plain_tokens + stop.generated);
  EXPECT_EQ(bob.prompt_tokens(), 3u * samples.prompt_tokens);
}

// `tandem up` polls GetStatus with $TANDEM_API_KEY: without it a router
// with keys never gets ready, so start-up fails before any process starts,
// naming the variable; a wrong key ends it at the first poll; with a valid
// one the cluster comes up.
TEST(ApiKeysUpTest, TandemUpSendsTheEnvironmentsKey) {
  const std::string dir = MakeTempDir();
  ASSERT_FALSE(dir.empty());
  const std::string keys = dir + "/keys.yaml";
  ASSERT_TRUE(WriteFile(keys, absl::StrCat("keys:\n  - name: bob\n    sha256: ", kBobSha, "\n")));
  UpClusterOptions o;
  o.prefill_workers = 0;
  o.decode_workers = 1;
  o.cluster.api_keys_file = keys;
  unsetenv("TANDEM_API_KEY");
  absl::StatusOr<std::unique_ptr<UpCluster>> refused = UpCluster::Start(o);
  ASSERT_FALSE(refused.ok());
  EXPECT_THAT(refused.status().message(),
              HasSubstr(absl::StrCat("tandem: router.api_keys_file is set (", keys,
                                     "): set $TANDEM_API_KEY to one of its keys, which tandem "
                                     "up sends to check readiness")));
  EXPECT_THAT(refused.status().message(), Not(HasSubstr("router listening")));
  setenv("TANDEM_API_KEY", "not-a-key", 1);
  absl::StatusOr<std::unique_ptr<UpCluster>> wrong = UpCluster::Start(o);
  ASSERT_FALSE(wrong.ok());
  EXPECT_THAT(wrong.status().message(),
              HasSubstr("\ntandem: UNAUTHENTICATED: invalid API key (the router requires an API "
                        "key: set $TANDEM_API_KEY to one of router.api_keys_file's keys)"));
  setenv("TANDEM_API_KEY", kBobKey, 1);
  absl::StatusOr<std::unique_ptr<UpCluster>> up = UpCluster::Start(o);
  unsetenv("TANDEM_API_KEY");
  ASSERT_TRUE(up.ok()) << up.status();
}

// The HTTP front door takes the same keys (Authorization: Bearer), as
// OpenAI's API does, on every /v1 route; /health, /ready stay open.
TEST_F(ApiKeysTest, HttpNeedsTheKeyToo) {
  const std::string http = cluster().http_address();
  const std::string body =
      R"({"model":"stories260K","prompt":"Once upon a time","max_tokens":4,"temperature":0})";
  HttpResult none = HttpCall(http, "POST", "/v1/completions", body);
  EXPECT_EQ(none.status, 401) << none.body;
  EXPECT_THAT(none.body, HasSubstr("missing API key"));
  HttpResult wrong = HttpCall(http, "POST", "/v1/completions", body,
                              {{"Authorization", "Bearer sk-test-carol"}});
  EXPECT_EQ(wrong.status, 401) << wrong.body;
  EXPECT_THAT(wrong.body, HasSubstr("invalid API key"));
  EXPECT_EQ(HttpCall(http, "GET", "/v1/models").status, 401);
  EXPECT_EQ(HttpCall(http, "GET", "/health").status, 200);
  EXPECT_EQ(HttpCall(http, "GET", "/ready").status, 200);

  const v1::ApiKeyUsage before = Usage(cluster(), "bob");
  HttpResult ok = HttpCall(http, "POST", "/v1/completions", body,
                           {{"Authorization", absl::StrCat("Bearer ", kBobKey)}});
  ASSERT_EQ(ok.status, 200) << ok.body;
  EXPECT_EQ(HttpCall(http, "GET", "/v1/models", "",
                     {{"Authorization", absl::StrCat("Bearer ", kBobKey)}})
                .status,
            200);
  // Charged to bob like a gRPC call: the prompt and the 4 tokens.
  const v1::ApiKeyUsage after = Usage(cluster(), "bob");
  EXPECT_EQ(after.requests() - before.requests(), 1u);
  EXPECT_EQ(after.generated_tokens() - before.generated_tokens(), 4u);
}

// Issue #32: with keys, GET /metrics on the client port needs one (401 in
// OpenAI's shape without); router.metrics_listen serves it with none, for
// Prometheus. Both are the same registry.
TEST_F(ApiKeysTest, ClientPortMetricsNeedAKeyTheMetricsPortDoesNot) {
  const std::string http = cluster().http_address();
  HttpResult none = HttpCall(http, "GET", "/metrics");
  EXPECT_EQ(none.status, 401) << none.body;
  EXPECT_THAT(none.body, HasSubstr("missing API key"));
  EXPECT_THAT(none.body, HasSubstr("\"type\":\"authentication_error\""));
  EXPECT_THAT(none.body, Not(HasSubstr("tandem_requests_total")));
  HttpResult wrong =
      HttpCall(http, "GET", "/metrics", "", {{"Authorization", "Bearer sk-test-carol"}});
  EXPECT_EQ(wrong.status, 401) << wrong.body;
  HttpResult keyed = HttpCall(http, "GET", "/metrics", "",
                              {{"Authorization", absl::StrCat("Bearer ", kBobKey)}});
  ASSERT_EQ(keyed.status, 200) << keyed.body;
  EXPECT_EQ(keyed.headers["content-type"], "text/plain; version=0.0.4; charset=utf-8");
  EXPECT_THAT(keyed.body, HasSubstr("tandem_requests_total"));

  ASSERT_FALSE(cluster().router_metrics_address().empty());
  HttpResult scraped = HttpCall(cluster().router_metrics_address(), "GET", "/metrics");
  ASSERT_EQ(scraped.status, 200) << scraped.body;
  EXPECT_EQ(scraped.headers["content-type"], "text/plain; version=0.0.4; charset=utf-8");
  EXPECT_THAT(scraped.body, HasSubstr("tandem_requests_total"));
  // Only /metrics there: the API is not reachable through the metrics port.
  EXPECT_EQ(HttpCall(cluster().router_metrics_address(), "GET", "/v1/models").status, 404);
}

// Issue #32: without a key, a path or model id the router does not serve
// is 401 like every other /v1 route (a 404 would tell which models exist);
// with one, 404 as before. A wrong method is 401 too.
TEST_F(ApiKeysTest, UnknownRoutesNeedAKeyBeforeTheyAre404) {
  const std::string http = cluster().http_address();
  for (const auto& [method, path] :
       std::vector<std::pair<std::string, std::string>>{{"GET", "/v1/models/nope"},
                                                        {"GET", "/v1/models/"},
                                                        {"GET", "/v1/chat/completions"},
                                                        {"GET", "/nowhere"}}) {
    HttpResult none = HttpCall(http, method, path);
    EXPECT_EQ(none.status, 401) << path << ": " << none.body;
    EXPECT_THAT(none.body, HasSubstr("\"type\":\"authentication_error\"")) << path;
  }
  HttpResult keyed = HttpCall(http, "GET", "/v1/models/nope", "",
                              {{"Authorization", absl::StrCat("Bearer ", kBobKey)}});
  EXPECT_EQ(keyed.status, 404) << keyed.body;
  EXPECT_THAT(keyed.body, HasSubstr("model_not_found"));
  // /health and /ready stay open.
  EXPECT_EQ(HttpCall(http, "GET", "/health").status, 200);
}

// Kubernetes swaps a mounted Secret's file under the running router: the
// router re-reads router.api_keys_file every kApiKeysReloadInterval (5 s).
// Replaced by rename (atomic, like the kubelet's symlink swap) with {bob}:
// alice is refused, bob served; replaced with a broken file: logged, and
// both keep their answers.
TEST(ApiKeysReloadTest, SwappedFileTakesEffectBrokenOneIsLoggedAndIgnored) {
  const std::string dir = MakeTempDir();
  ASSERT_FALSE(dir.empty());
  const std::string keys = dir + "/keys.yaml";
  // Write-then-rename: the router never sees a half-written file.
  auto swap_in = [&](const std::string& text) {
    ASSERT_TRUE(WriteFile(dir + "/keys.yaml.tmp", text));
    ASSERT_EQ(std::rename((dir + "/keys.yaml.tmp").c_str(), keys.c_str()), 0);
  };
  swap_in(absl::StrCat("keys:\n  - name: alice\n    sha256: ", kAliceSha, "\n"));
  ClusterOptions o;
  o.api_keys_file = keys;
  o.api_key = kAliceKey;  // the fixture's start-up status calls
  o.num_prefill_workers = 0;
  o.capture_stderr = true;
  absl::StatusOr<std::unique_ptr<LocalCluster>> started = LocalCluster::Start(o);
  ASSERT_TRUE(started.ok()) << started.status();
  LocalCluster& cluster = **started;
  ASSERT_TRUE(Generate(cluster, kAliceKey, Request()).status.ok());
  EXPECT_EQ(Generate(cluster, kBobKey, Request()).status.error_code(),
            grpc::StatusCode::UNAUTHENTICATED);

  swap_in(absl::StrCat("keys:\n  - name: bob\n    sha256: ", kBobSha, "\n"));
  Call alice, bob;
  ASSERT_TRUE(PollUntil(
      absl::Seconds(15),
      [&] {
        alice = Generate(cluster, kAliceKey, Request());
        bob = Generate(cluster, kBobKey, Request());
        return alice.status.error_code() == grpc::StatusCode::UNAUTHENTICATED && bob.status.ok();
      },
      absl::Milliseconds(200)))
      << "alice: " << alice.status.error_message() << "; bob: " << bob.status.error_message();
  EXPECT_EQ(alice.status.error_message(), "invalid API key");
  EXPECT_EQ(bob.generated, kMaxTokens);
  EXPECT_THAT(cluster.CapturedStderr(),
              HasSubstr(absl::StrCat("api keys: reloaded ", keys, " (1 keys)")));

  swap_in("keys:\n  - name: bob\n    sha256: not-a-hash\n");
  const std::string logged =
      absl::StrCat("api keys: ", keys,
                   ": keys[0] (bob).sha256: expected the key's SHA-256 as 64 hex digits "
                   "(printf %s KEY | sha256sum), got 10 characters, not all hex (the value is "
                   "not shown: it may be the key itself); keeping the 1 keys loaded before");
  EXPECT_TRUE(PollUntil(absl::Seconds(15),
                        [&] { return absl::StrContains(cluster.CapturedStderr(), logged); },
                        absl::Milliseconds(200)))
      << cluster.CapturedStderr();
  EXPECT_EQ(Generate(cluster, kAliceKey, Request()).status.error_message(), "invalid API key");
  bob = Generate(cluster, kBobKey, Request());
  EXPECT_TRUE(bob.status.ok()) << bob.status.error_message();
  EXPECT_EQ(bob.generated, kMaxTokens);
}

}  // namespace
}  // namespace tandem::testing
