#include "tests/integration/generate_client.h"

#include <chrono>

#include <nlohmann/json.hpp>

#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "tests/integration/cluster_fixture.h"
#include "tests/test_util.h"

namespace tandem::testing {
namespace {

// Parses the golden file; {} (with a test failure) on any problem.
std::vector<GoldenCase> LoadGoldens() {
  const std::string path = SharedPath("goldens/stories260K_greedy.json");
  const std::string text = ReadFileOrDie(path);
  if (text.empty()) return {};
  std::vector<GoldenCase> cases;
  try {
    const nlohmann::json j = nlohmann::json::parse(text);
    for (const nlohmann::json& c : j.at("cases")) {
      GoldenCase g;
      g.name = c.at("name").get<std::string>();
      g.prompt = c.at("prompt").get<std::string>();
      g.prompt_ids = c.at("prompt_token_ids_with_bos").get<std::vector<int32_t>>();
      g.generated_ids = c.at("generated_token_ids_f32kv").get<std::vector<int32_t>>();
      g.strict_prefix_len = c.at("strict_prefix_len_f32kv").get<size_t>();
      if (g.strict_prefix_len > g.generated_ids.size()) {
        ADD_FAILURE() << path << ": case " << g.name << ": strict_prefix_len_f32kv "
                      << g.strict_prefix_len << " > " << g.generated_ids.size() << " ids";
        return {};
      }
      cases.push_back(std::move(g));
    }
  } catch (const nlohmann::json::exception& e) {
    ADD_FAILURE() << path << ": " << e.what();
    return {};
  }
  return cases;
}

}  // namespace

std::vector<int32_t> GoldenCase::StrictIds() const {
  return std::vector<int32_t>(generated_ids.begin(),
                              generated_ids.begin() + static_cast<ptrdiff_t>(strict_prefix_len));
}

const std::vector<GoldenCase>& Goldens() {
  static const std::vector<GoldenCase>* goldens = new std::vector<GoldenCase>(LoadGoldens());
  return *goldens;
}

const GoldenCase& Golden(const std::string& name) {
  for (const GoldenCase& g : Goldens()) {
    if (g.name == name) return g;
  }
  ADD_FAILURE() << "no golden case named " << name;
  static const GoldenCase* empty = new GoldenCase();
  return *empty;
}

v1::GenerateRequest MakeRequest(const std::string& prompt, uint32_t max_tokens,
                                v1::RouteOverride route) {
  v1::GenerateRequest request;
  request.set_prompt(prompt);
  request.set_max_tokens(max_tokens);
  request.set_route_override(route);
  request.mutable_sampling()->set_temperature(0);
  return request;
}

std::string RouteName(v1::RouteOverride route) {
  return route == v1::ROUTE_REMOTE ? "remote" : "local";
}

void StreamResult::Add(const v1::GenerateResponse& r) {
  if (messages++ == 0) seed = r.seed();
  if (request_id.empty()) request_id = r.request_id();
  if (route.empty()) route = r.route();
  if (prefill_worker.empty()) prefill_worker = r.prefill_worker();
  if (decode_worker.empty()) decode_worker = r.decode_worker();
  if (r.prompt_token_ids_size() > 0) {
    if (messages == 1) first_message_has_prompt_ids = true;
    if (prompt_ids_messages++ == 0) {
      prompt_token_ids.assign(r.prompt_token_ids().begin(), r.prompt_token_ids().end());
    }
  }
  for (const v1::TokenOutput& t : r.tokens()) {
    token_ids.push_back(t.token_id());
    indices.push_back(t.index());
  }
  text += r.text();
  if (r.finish_reason() != v1::FINISH_NONE) finish_reason = r.finish_reason();
  if (r.prompt_tokens() != 0) prompt_tokens = r.prompt_tokens();
  if (r.completion_tokens() != 0) completion_tokens = r.completion_tokens();
}

bool StreamResult::IndicesAreSequential() const {
  for (size_t i = 0; i < indices.size(); ++i) {
    if (indices[i] != i) return false;
  }
  return true;
}

GenerateStream::GenerateStream(v1::Generation::Stub& stub, const v1::GenerateRequest& request,
                               absl::Duration timeout) {
  context_.set_deadline(std::chrono::system_clock::now() +
                        std::chrono::milliseconds(absl::ToInt64Milliseconds(timeout)));
  reader_ = stub.Generate(&context_, request);
}

bool GenerateStream::ReadOne() {
  if (done_) return false;
  v1::GenerateResponse response;
  if (!reader_->Read(&response)) {
    done_ = true;
    return false;
  }
  result_.Add(response);
  return true;
}

bool GenerateStream::ReadUntilFirstToken() {
  while (result_.token_ids.empty()) {
    if (!ReadOne()) return false;
  }
  return true;
}

const StreamResult& GenerateStream::Finish() {
  if (reader_ == nullptr) return result_;  // finished before
  while (ReadOne()) {
  }
  result_.status = reader_->Finish();
  reader_.reset();
  return result_;
}

void ExpectGolden(const StreamResult& r, const GoldenCase& g, const std::string& route) {
  using ::testing::ElementsAreArray;
  ASSERT_TRUE(r.status.ok()) << r.status.error_code() << ": " << r.status.error_message();
  EXPECT_EQ(r.route, route);
  EXPECT_EQ(r.decode_worker, LocalCluster::kDecodeName);
  EXPECT_EQ(r.prefill_worker, route == "remote" ? LocalCluster::kPrefillName : "");
  EXPECT_TRUE(r.first_message_has_prompt_ids);
  EXPECT_EQ(r.prompt_ids_messages, 1);
  EXPECT_THAT(r.prompt_token_ids, ElementsAreArray(g.prompt_ids));
  EXPECT_TRUE(r.IndicesAreSequential()) << ::testing::PrintToString(r.indices);
  EXPECT_EQ(r.prompt_tokens, g.prompt_ids.size());
  EXPECT_EQ(r.completion_tokens, r.token_ids.size());
  ASSERT_GE(r.token_ids.size(), g.strict_prefix_len) << ::testing::PrintToString(r.token_ids);
  EXPECT_LE(r.token_ids.size(), kGoldenMaxTokens);
  const std::vector<int32_t> prefix(
      r.token_ids.begin(), r.token_ids.begin() + static_cast<ptrdiff_t>(g.strict_prefix_len));
  EXPECT_THAT(prefix, ElementsAreArray(g.StrictIds())) << "case " << g.name << " on " << route;
  if (r.token_ids.size() == kGoldenMaxTokens) {
    EXPECT_EQ(r.finish_reason, v1::FINISH_LENGTH);
  }
}

StreamResult RunGenerate(v1::Generation::Stub& stub, const v1::GenerateRequest& request,
                         absl::Duration timeout) {
  GenerateStream stream(stub, request, timeout);
  return stream.Finish();
}

}  // namespace tandem::testing
