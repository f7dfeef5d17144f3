// deploy/secured/cluster.yaml, the shipped secured example (issue #32,
// item 5): it is deploy/local/cluster.yaml secured, key by key (every key
// and value of the local example, plus router.api_keys_file and the
// cluster secret), and under `tandem up` (a temporary copy with its fixed
// ports made ephemeral and its secret and keys files written to a
// temporary directory) it serves HTTP with a Bearer key and refuses
// without one (401 in OpenAI's error shape), serves gRPC with the key over
// a remote prefill (every RPC and KV HELLO signed), says
// `cluster_auth: hmac-sha256`, and its workers serve /metrics.
#include <grpcpp/grpcpp.h>
#include <yaml-cpp/yaml.h>

#include <fstream>
#include <map>
#include <regex>
#include <set>
#include <sstream>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_replace.h"
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
using nlohmann::json;

constexpr char kKey[] = "sk-test-secured-example";
// printf %s sk-test-secured-example | sha256sum
constexpr char kKeySha[] = "6361c0c546fafcab898cb14bd6f3027712db69e7e14a9d6bd30b7f0981306a98";

std::string ReadSource(const std::string& relative) {
  std::ifstream in(std::string(TANDEM_SOURCE_DIR) + "/" + relative);
  std::ostringstream text;
  text << in.rdbuf();
  EXPECT_FALSE(text.str().empty()) << "cannot read " << relative;
  return text.str();
}

// Every scalar of a YAML document by its path ("router.listen",
// "decode_workers[0].kv_listen"); an empty map or list counts as a leaf.
void Flatten(const YAML::Node& node, const std::string& path,
             std::map<std::string, std::string>* out) {
  if (node.IsMap() && node.size() > 0) {
    for (const auto& kv : node) {
      Flatten(kv.second, path.empty() ? kv.first.Scalar() : path + "." + kv.first.Scalar(), out);
    }
  } else if (node.IsSequence() && node.size() > 0) {
    for (size_t i = 0; i < node.size(); ++i) Flatten(node[i], absl::StrCat(path, "[", i, "]"), out);
  } else {
    (*out)[path] = node.IsScalar() ? node.Scalar() : (node.IsSequence() ? "[]" : "{}");
  }
}

std::map<std::string, std::string> Keys(const std::string& relative) {
  std::map<std::string, std::string> keys;
  Flatten(YAML::Load(ReadSource(relative)), "", &keys);
  return keys;
}

// A key added to the local example must reach the secured one (and no key
// but the security ones may differ): the secured example stays "the local
// cluster, secured" as both files change.
TEST(SecuredExampleTest, IsTheLocalExampleKeyByKeyPlusSecurity) {
  const std::map<std::string, std::string> local = Keys("deploy/local/cluster.yaml");
  const std::map<std::string, std::string> secured = Keys("deploy/secured/cluster.yaml");
  ASSERT_FALSE(local.empty());
  const std::map<std::string, std::string> security = {
      {"router.api_keys_file", "deploy/secured/api-keys.yaml"},
      {"cluster.secret_file", "deploy/secured/cluster.secret"},
      {"cluster.auth_max_skew_ms", "30000"},
  };
  std::vector<std::string> missing, differ, extra;
  for (const auto& [key, value] : local) {
    auto it = secured.find(key);
    if (it == secured.end()) {
      missing.push_back(key);
    } else if (it->second != value) {
      differ.push_back(absl::StrCat(key, ": ", value, " vs ", it->second));
    }
  }
  for (const auto& [key, value] : secured) {
    if (local.count(key)) continue;
    auto it = security.find(key);
    if (it == security.end() || it->second != value) {
      extra.push_back(absl::StrCat(key, ": ", value));
    }
  }
  EXPECT_TRUE(missing.empty()) << "in deploy/local/cluster.yaml, not in deploy/secured/: "
                               << absl::StrJoin(missing, ", ");
  EXPECT_TRUE(differ.empty()) << "local vs secured: " << absl::StrJoin(differ, "; ");
  EXPECT_TRUE(extra.empty()) << "only in deploy/secured/ (not a security key): "
                             << absl::StrJoin(extra, ", ");
  for (const auto& [key, value] : security) {
    EXPECT_EQ(secured.count(key) ? secured.at(key) : "<absent>", value) << key;
  }
  // What issue #32 found missing.
  EXPECT_EQ(secured.count("router.http_listen"), 1u);
  EXPECT_EQ(secured.count("prefill_workers[0].metrics_listen"), 1u);
  EXPECT_EQ(secured.count("decode_workers[0].metrics_listen"), 1u);
}

// One gRPC Generate with `authorization: Bearer key`, read to its end.
struct Call {
  grpc::Status status;
  std::string route;
  size_t tokens = 0;
};
Call GenerateWithKey(v1::Generation::Stub& stub, const v1::GenerateRequest& request) {
  grpc::ClientContext context;
  context.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(30));
  context.AddMetadata("authorization", absl::StrCat("Bearer ", kKey));
  Call call;
  auto reader = stub.Generate(&context, request);
  v1::GenerateResponse msg;
  while (reader->Read(&msg)) {
    if (!msg.route().empty()) call.route = msg.route();
    call.tokens += static_cast<size_t>(msg.tokens_size());
  }
  call.status = reader->Finish();
  return call;
}

TEST(SecuredExampleTest, ServesHttpWithABearerKeyAndRefusesWithout) {
  const std::string dir = MakeTempDir();
  ASSERT_FALSE(dir.empty());
  const std::string secret = dir + "/cluster.secret";
  const std::string keys = dir + "/api-keys.yaml";
  ASSERT_TRUE(WriteFile(secret, std::string(64, 'e') + "\n"));
  // As the README makes it: the key's SHA-256, the README's limits.
  ASSERT_TRUE(WriteFile(keys, absl::StrCat("keys:\n  - name: team-a\n    sha256: ",
                                           kKeySha,
                                           "\n    tokens_per_minute: 60000\n"
                                           "    max_concurrent_requests: 8\n")));
  UpClusterOptions options;
  options.prefill_workers = 1;
  options.decode_workers = 1;
  // The shipped file; fixed ports made ephemeral, the secret and keys
  // files (relative to the repository root there) in the temporary dir.
  options.config_yaml = absl::StrReplaceAll(
      ReadSource("deploy/secured/cluster.yaml"),
      {{"127.0.0.1:50051", "127.0.0.1:0"},
       {"127.0.0.1:8000", "127.0.0.1:0"},
       {"127.0.0.1:9101", "127.0.0.1:0"},
       {"127.0.0.1:9102", "127.0.0.1:0"},
       {"deploy/secured/cluster.secret", secret},
       {"deploy/secured/api-keys.yaml", keys}});
  ASSERT_THAT(options.config_yaml, HasSubstr("secret_file: " + secret));
  ASSERT_THAT(options.config_yaml, HasSubstr("api_keys_file: " + keys));
  setenv("TANDEM_API_KEY", kKey, 1);  // tandem up's readiness polls
  absl::StatusOr<std::unique_ptr<UpCluster>> started = UpCluster::Start(options);
  unsetenv("TANDEM_API_KEY");
  ASSERT_TRUE(started.ok()) << started.status();
  UpCluster& up = **started;
  const std::string http = up.http_address();
  ASSERT_FALSE(http.empty()) << "no HTTP front door: router.http_listen missing";

  // No key, a wrong key: 401 in OpenAI's error shape, on every /v1 route.
  const std::string body =
      R"({"model":"stories260K","prompt":"Once upon a time","max_tokens":8,"temperature":0,)"
      R"("ignore_eos":true})";
  auto expect_401 = [&](const HttpResult& r, const std::string& message) {
    EXPECT_EQ(r.status, 401) << r.body;
    const json e = json::parse(r.body, nullptr, false);
    ASSERT_TRUE(e.is_object() && e.contains("error")) << r.body;
    EXPECT_EQ(e["error"]["message"], message) << r.body;
    EXPECT_EQ(e["error"]["type"], "authentication_error") << r.body;
    EXPECT_EQ(e["error"]["code"], "invalid_api_key") << r.body;
    EXPECT_TRUE(e["error"].contains("param") && e["error"]["param"].is_null()) << r.body;
  };
  const std::string missing = "missing API key (authorization: Bearer ...)";
  expect_401(HttpCall(http, "POST", "/v1/completions", body), missing);
  expect_401(HttpCall(http, "POST", "/v1/completions", body,
                      {{"Authorization", "Bearer sk-test-not-a-key"}}),
             "invalid API key");
  expect_401(HttpCall(http, "GET", "/v1/models"), missing);
  EXPECT_EQ(HttpCall(http, "GET", "/health").status, 200);
  EXPECT_EQ(HttpCall(http, "GET", "/ready").status, 200);

  // With the key (the README's curl command): served.
  const std::vector<std::pair<std::string, std::string>> auth = {
      {"Authorization", absl::StrCat("Bearer ", kKey)}};
  HttpResult ok = HttpCall(http, "POST", "/v1/completions", body, auth);
  ASSERT_EQ(ok.status, 200) << ok.body;
  const json completion = json::parse(ok.body, nullptr, false);
  ASSERT_TRUE(completion.is_object()) << ok.body;
  EXPECT_EQ(completion["usage"]["completion_tokens"], 8) << ok.body;
  EXPECT_FALSE(completion["choices"][0]["text"].get<std::string>().empty()) << ok.body;
  EXPECT_EQ(HttpCall(http, "GET", "/v1/models", "", auth).status, 200);

  // gRPC with the key, prefilled on the prefill worker: the router's calls
  // and the workers' KV HELLO are signed with the secret.
  v1::GenerateRequest remote = MakeRequest("Once upon a time there was a little girl named Lily. "
                                           "She loved to play outside in the park with her dog.",
                                           8, v1::ROUTE_REMOTE);
  const Call grpc_call = GenerateWithKey(up.stub(), remote);
  ASSERT_TRUE(grpc_call.status.ok()) << grpc_call.status.error_message();
  EXPECT_EQ(grpc_call.route, "remote");
  EXPECT_EQ(grpc_call.tokens, 8u);
  EXPECT_EQ(RunGenerate(up.stub(), remote).status.error_code(), grpc::StatusCode::UNAUTHENTICATED);
  {
    grpc::ClientContext context;
    context.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(10));
    context.AddMetadata("authorization", absl::StrCat("Bearer ", kKey));
    v1::ClusterStatus status;
    ASSERT_TRUE(up.stub().GetStatus(&context, {}, &status).ok());
    EXPECT_EQ(status.cluster_auth(), "hmac-sha256");
    EXPECT_TRUE(status.api_keys_required());
  }

  // Both workers serve /metrics (metrics_listen), without a key.
  ASSERT_TRUE(up.WaitForStderr("metrics: serving http://", absl::Seconds(10)));
  const std::string log = up.Stderr();
  const std::regex serving("metrics: serving http://([0-9.]+:[0-9]+)/metrics");
  std::set<std::string> metrics;
  for (auto it = std::sregex_iterator(log.begin(), log.end(), serving);
       it != std::sregex_iterator(); ++it) {
    metrics.insert((*it)[1]);
  }
  EXPECT_EQ(metrics.size(), 2u) << log;
  for (const std::string& at : metrics) {
    HttpResult m = HttpCall(at, "GET", "/metrics");
    EXPECT_EQ(m.status, 200) << at;
    EXPECT_THAT(m.body, HasSubstr("# TYPE ")) << at;
  }
  EXPECT_EQ(up.Stop(), "exited with status 0");
}

}  // namespace
}  // namespace tandem::testing
