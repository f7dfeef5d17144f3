#include "tests/integration/generate_client.h"

#include <algorithm>
#include <chrono>
#include <cstring>
#include <thread>

#include <nlohmann/json.hpp>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"
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
      for (const nlohmann::json& t : c.at("first_token_top5_f32kv")) {
        g.first_token_top5_probs.emplace_back(t.at("id").get<int32_t>(),
                                              t.at("prob").get<double>());
      }
      for (const nlohmann::json& step : c.at("steps")) {
        std::vector<std::pair<int32_t, double>> top5;
        for (const nlohmann::json& t : step.at("top5_f32kv")) {
          top5.emplace_back(t.at(0).get<int32_t>(), t.at(1).get<double>());
        }
        g.steps_top5_logits.push_back(std::move(top5));
      }
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

// True when `indices` are exactly 0, 1, ..., n-1.
bool AreSequential(const std::vector<uint32_t>& indices) {
  for (size_t i = 0; i < indices.size(); ++i) {
    if (indices[i] != i) return false;
  }
  return true;
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

ModelGoldens ReadGoldens(const std::string& file, const std::string& cases) {
  ModelGoldens out;
  try {
    const nlohmann::json j = nlohmann::json::parse(ReadFileOrDie(SharedPath("goldens/" + file)));
    if (j.at("model").contains("eog_ids")) {
      out.eog_ids = j.at("model").at("eog_ids").get<std::vector<int32_t>>();
    }
    for (const nlohmann::json& c : j.at(nlohmann::json::json_pointer(cases))) {
      ModelGolden g;
      g.name = c.at("name").get<std::string>();
      g.prompt = c.at("prompt").get<std::string>();
      g.prompt_ids = c.at("prompt_token_ids").get<std::vector<int32_t>>();
      g.generated_ids = c.at("generated_token_ids").get<std::vector<int32_t>>();
      g.strict_prefix_len = c.at("strict_prefix_len").get<size_t>();
      out.cases.push_back(std::move(g));
    }
  } catch (const nlohmann::json::exception& e) {
    ADD_FAILURE() << file << ": " << e.what();
  }
  return out;
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

void SetSeededSampling(v1::GenerateRequest* request, float temperature, uint64_t seed) {
  request->mutable_sampling()->set_temperature(temperature);
  request->mutable_sampling()->set_seed(seed);
  request->mutable_sampling()->set_has_seed(true);
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
  if (r.finish_reason() != v1::FINISH_NONE) {
    served_route = r.route();
    served_prefill_worker = r.prefill_worker();
    served_decode_worker = r.decode_worker();
  }
  if (r.prompt_token_ids_size() > 0) {
    if (messages == 1) first_message_has_prompt_ids = true;
    if (prompt_ids_messages++ == 0) {
      prompt_token_ids.assign(r.prompt_token_ids().begin(), r.prompt_token_ids().end());
    }
  }
  for (const v1::TokenOutput& t : r.tokens()) {
    token_ids.push_back(t.token_id());
    indices.push_back(t.index());
    logprobs.push_back(t.logprob());
  }
  text += r.text();
  max_sample_index = std::max(max_sample_index, r.sample_index());
  if (r.tokens_size() > 0 || !r.text().empty() || r.finish_reason() != v1::FINISH_NONE ||
      r.has_stop_reason()) {
    if (samples.size() <= r.sample_index()) samples.resize(r.sample_index() + 1);
    SampleResult& s = samples[r.sample_index()];
    StreamMessage m;
    for (const v1::TokenOutput& t : r.tokens()) {
      s.token_ids.push_back(t.token_id());
      s.indices.push_back(t.index());
      s.logprobs.push_back(t.logprob());
      s.top_logprobs.emplace_back(t.top_logprobs().begin(), t.top_logprobs().end());
      if (t.sample_index() != r.sample_index()) ++s.foreign_tokens;
      m.token_ids.push_back(t.token_id());
    }
    if (r.tokens_size() > 0 && s.finish_messages > 0) s.tokens_after_finish = true;
    s.text += r.text();
    m.text = r.text();
    m.has_finish = r.finish_reason() != v1::FINISH_NONE;
    if (m.has_finish) {
      s.finish_reason = r.finish_reason();
      ++s.finish_messages;
      if (r.has_placement()) s.placement = r.placement();
      if (r.has_timing()) s.timing = r.timing();
    }
    if (r.has_stop_reason()) {
      s.stop_reason = r.stop_reason();
      ++s.stop_reason_messages;
    }
    if (r.completion_tokens() != 0) s.completion_tokens = r.completion_tokens();
    s.messages.push_back(std::move(m));
  }
  if (r.finish_reason() != v1::FINISH_NONE) finish_reason = r.finish_reason();
  if (r.prompt_tokens() != 0) prompt_tokens = r.prompt_tokens();
  if (r.completion_tokens() != 0) completion_tokens = r.completion_tokens();
  if (r.cached_prompt_tokens() != 0) cached_prompt_tokens = r.cached_prompt_tokens();
}

bool StreamResult::IndicesAreSequential() const { return AreSequential(indices); }

bool SampleResult::IndicesAreSequential() const { return AreSequential(indices); }

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

void ExpectGolden(const StreamResult& r, const GoldenCase& g, const std::string& route,
                  uint32_t max_tokens) {
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
  EXPECT_LE(r.token_ids.size(), max_tokens);
  const std::vector<int32_t> prefix(
      r.token_ids.begin(), r.token_ids.begin() + static_cast<ptrdiff_t>(g.strict_prefix_len));
  EXPECT_THAT(prefix, ElementsAreArray(g.StrictIds())) << "case " << g.name << " on " << route;
  if (r.token_ids.size() == max_tokens) {
    EXPECT_EQ(r.finish_reason, v1::FINISH_LENGTH);
  }
}

StreamResult RunGenerate(v1::Generation::Stub& stub, const v1::GenerateRequest& request,
                         absl::Duration timeout) {
  GenerateStream stream(stub, request, timeout);
  return stream.Finish();
}

std::vector<StreamResult> RunConcurrently(v1::Generation::Stub& stub,
                                          const std::vector<v1::GenerateRequest>& requests,
                                          absl::Duration timeout) {
  std::vector<std::unique_ptr<GenerateStream>> streams;
  streams.reserve(requests.size());
  for (const v1::GenerateRequest& request : requests) {
    streams.push_back(std::make_unique<GenerateStream>(stub, request, timeout));
  }
  std::vector<std::thread> readers;
  readers.reserve(streams.size());
  for (auto& stream : streams) {
    readers.emplace_back([s = stream.get()] { s->Finish(); });
  }
  for (std::thread& t : readers) t.join();
  std::vector<StreamResult> results;
  results.reserve(streams.size());
  for (auto& stream : streams) results.push_back(stream->result());
  return results;
}

uint32_t FloatBits(float f) {
  uint32_t bits;
  static_assert(sizeof(bits) == sizeof(f));
  std::memcpy(&bits, &f, sizeof(bits));
  return bits;
}

absl::StatusOr<std::vector<int32_t>> Tokenize(v1::Generation::Stub& stub,
                                              const std::string& text) {
  grpc::ClientContext context;
  context.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(5));
  v1::TokenizeRequest request;
  request.set_text(text);
  request.set_add_bos(true);
  v1::TokenizeResponse response;
  grpc::Status s = stub.Tokenize(&context, request, &response);
  if (!s.ok()) {
    return absl::Status(static_cast<absl::StatusCode>(s.error_code()),
                        absl::StrCat("Tokenize: ", s.error_message()));
  }
  return std::vector<int32_t>(response.token_ids().begin(), response.token_ids().end());
}

absl::StatusOr<std::string> PromptWithTokenCount(v1::Generation::Stub& stub,
                                                 size_t num_tokens) {
  const std::vector<std::string> words =
      absl::StrSplit(Golden("long_repeated_313tok").prompt, ' ', absl::SkipEmpty());
  std::string best;  // the longest word prefix with <= num_tokens tokens
  size_t count = 0;
  for (size_t n = 1; n <= words.size(); ++n) {
    const std::string text =
        absl::StrJoin(words.begin(), words.begin() + static_cast<ptrdiff_t>(n), " ");
    absl::StatusOr<std::vector<int32_t>> ids = Tokenize(stub, text);
    if (!ids.ok()) return ids.status();
    if (ids->size() > num_tokens) break;
    best = text;
    count = ids->size();
  }
  while (count < num_tokens) {
    best += " a";
    absl::StatusOr<std::vector<int32_t>> ids = Tokenize(stub, best);
    if (!ids.ok()) return ids.status();
    count = ids->size();
  }
  if (count != num_tokens) {
    return absl::FailedPreconditionError(absl::StrCat(
        "no prompt of exactly ", num_tokens, " tokens: \"", best, "\" has ", count));
  }
  return best;
}

std::string RandomPrompt(std::mt19937_64& rng, size_t min_words, size_t max_words) {
  static const std::vector<std::string>* words = [] {
    auto* all = new std::vector<std::string>();
    for (const GoldenCase& g : Goldens()) {
      for (absl::string_view w : absl::StrSplit(g.prompt, ' ', absl::SkipEmpty())) {
        all->emplace_back(w);
      }
    }
    return all;
  }();
  if (words->empty()) return "Once upon a time";  // Goldens() has failed the test
  std::uniform_int_distribution<size_t> length(min_words, max_words);
  std::uniform_int_distribution<size_t> pick(0, words->size() - 1);
  std::vector<std::string> chosen(length(rng));
  for (std::string& w : chosen) w = (*words)[pick(rng)];
  return absl::StrJoin(chosen, " ");
}

v1::GenerateRequest RandomRequest(std::mt19937_64& rng, v1::RouteOverride route) {
  const std::string prompt = RandomPrompt(rng, 3, 60);
  const uint32_t max_tokens = std::uniform_int_distribution<uint32_t>(8, 32)(rng);
  v1::GenerateRequest request = MakeRequest(prompt, max_tokens, route);
  if (std::bernoulli_distribution(0.5)(rng)) SetSeededSampling(&request, 0.8f, rng());
  return request;
}

}  // namespace tandem::testing
