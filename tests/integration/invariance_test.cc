// Batch-invariant numerics through the whole cluster (DESIGN.md, Engine;
// issue #3): every golden case gives the same token ids and the same bits
// of its first token's logprob alone or among 15 concurrent random
// requests, with prefill chunks of 1, 7 or 64 tokens, with 1 or 2 compute
// threads, and by local or remote prefill. Seeded sampling (randomness of
// output index i = f(seed, i)) gives the same ids beside an unseeded
// request and on both routes.
//
// The reference of every comparison is the same request run alone, one
// after another, on a cluster with the default engine settings and prefix
// caching off (nothing but the request itself in any step); the greedy ids
// are also checked against the goldens.
#include <map>
#include <memory>
#include <ostream>
#include <random>
#include <string>
#include <vector>

#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "tests/integration/cluster_fixture.h"
#include "tests/integration/generate_client.h"

namespace tandem::testing {
namespace {

// What the invariance contract compares for one request.
struct Answer {
  std::vector<int32_t> ids;
  uint32_t first_logprob_bits = 0;  // FloatBits(TokenOutput.logprob of index 0)

  bool operator==(const Answer& other) const {
    return ids == other.ids && first_logprob_bits == other.first_logprob_bits;
  }
};

void PrintTo(const Answer& a, std::ostream* os) {
  *os << "{ids " << ::testing::PrintToString(a.ids) << ", first logprob bits 0x" << std::hex
      << a.first_logprob_bits << std::dec << "}";
}

// The answer of a finished stream; a test failure (and {}) if it failed.
Answer AnswerOf(const StreamResult& r) {
  if (!r.status.ok() || r.logprobs.empty()) {
    ADD_FAILURE() << "request failed: " << r.status.error_code() << ": "
                  << r.status.error_message() << " (" << r.token_ids.size() << " tokens)";
    return {};
  }
  return Answer{r.token_ids, FloatBits(r.logprobs[0])};
}

// "<golden>_<route>" -> answer.
using Answers = std::map<std::string, Answer>;

std::string Key(const GoldenCase& g, v1::RouteOverride route) {
  return g.name + "_" + RouteName(route);
}

constexpr v1::RouteOverride kRoutes[] = {v1::ROUTE_LOCAL, v1::ROUTE_REMOTE};

// Every golden case on both routes, alone and one after another (LOCAL
// first), each checked against its golden ids.
Answers RunGoldensAlone(LocalCluster& cluster) {
  Answers answers;
  for (const GoldenCase& g : Goldens()) {
    for (v1::RouteOverride route : kRoutes) {
      const StreamResult r =
          RunGenerate(cluster.stub(), MakeRequest(g.prompt, kGoldenMaxTokens, route));
      ExpectGolden(r, g, RouteName(route));
      answers[Key(g, route)] = AnswerOf(r);
    }
  }
  return answers;
}

// The reference cluster: default engine settings, prefix caching off.
ClusterOptions ReferenceOptions() {
  ClusterOptions options;
  options.enable_prefix_caching = false;
  return options;
}

using InvarianceTest = OwnClusterTest;

TEST_F(InvarianceTest, LocalAndRemoteGiveSameIdsAndFirstLogprobBits) {
  ASSERT_NO_FATAL_FAILURE(StartCluster(ReferenceOptions()));
  const Answers answers = RunGoldensAlone(cluster());
  for (const GoldenCase& g : Goldens()) {
    EXPECT_EQ(answers.at(Key(g, v1::ROUTE_REMOTE)), answers.at(Key(g, v1::ROUTE_LOCAL)))
        << g.name;
  }
}

TEST_F(InvarianceTest, AloneAndAmongFifteenConcurrentRandomRequestsAgree) {
  ASSERT_NO_FATAL_FAILURE(StartCluster(ReferenceOptions()));
  const Answers alone = RunGoldensAlone(cluster());
  std::mt19937_64 rng(20240603);
  constexpr size_t kOthers = 15;
  constexpr size_t kGoldenSlot = 7;  // mid-batch: others both before and after it
  for (const GoldenCase& g : Goldens()) {
    for (v1::RouteOverride route : kRoutes) {
      std::vector<v1::GenerateRequest> requests;
      for (size_t i = 0; i < kOthers; ++i) {
        requests.push_back(RandomRequest(rng, kRoutes[i % 2]));
      }
      requests.insert(requests.begin() + kGoldenSlot,
                      MakeRequest(g.prompt, kGoldenMaxTokens, route));
      const std::vector<StreamResult> results = RunConcurrently(cluster().stub(), requests);
      for (const StreamResult& r : results) {
        EXPECT_TRUE(r.status.ok()) << r.status.error_code() << ": " << r.status.error_message();
      }
      EXPECT_EQ(AnswerOf(results[kGoldenSlot]), alone.at(Key(g, route)))
          << g.name << " on " << RouteName(route) << " among " << kOthers << " others";
    }
  }
  absl::StatusOr<v1::WorkerStatus> d = cluster().DecodeStatus();
  ASSERT_TRUE(d.ok()) << d.status();
  EXPECT_GT(d->max_decode_batch_size(), 1u) << "the requests never shared a decode step";
  v1::ClusterStatus last;
  EXPECT_TRUE(cluster().WaitForIdleWorkers(absl::Seconds(2), &last)) << last.DebugString();
}

// ---- Engine settings ----------------------------------------------------------------

struct EngineVariant {
  std::string name;
  int32_t prefill_chunk_tokens;
  int32_t threads;
};

void PrintTo(const EngineVariant& v, std::ostream* os) { *os << v.name; }

class EngineSettingsInvarianceTest : public OwnClusterTest,
                                     public ::testing::WithParamInterface<EngineVariant> {};

// The variant runs with prefix caching on: a REMOTE run after the LOCAL one
// finds the prompt in D's cache, so hits are part of what must not matter.
TEST_P(EngineSettingsInvarianceTest, MatchesReferenceClusterBitForBit) {
  ASSERT_NO_FATAL_FAILURE(StartCluster(ReferenceOptions()));
  const Answers reference = RunGoldensAlone(cluster());
  StopCluster();

  ClusterOptions options;
  options.prefill_chunk_tokens = GetParam().prefill_chunk_tokens;
  options.threads = GetParam().threads;
  options.max_num_batched_tokens = 2048;  // >= any chunk: the chunk size is what varies
  ASSERT_NO_FATAL_FAILURE(StartCluster(options));
  const Answers variant = RunGoldensAlone(cluster());
  for (const auto& [key, answer] : reference) {
    ASSERT_EQ(variant.count(key), 1u) << key;
    EXPECT_EQ(variant.at(key), answer) << key << " with " << GetParam().name;
  }
}

INSTANTIATE_TEST_SUITE_P(Settings, EngineSettingsInvarianceTest,
                         ::testing::Values(EngineVariant{"chunk1", 1, 1},
                                           EngineVariant{"chunk7", 7, 1},
                                           EngineVariant{"chunk64", 64, 1},
                                           EngineVariant{"threads2", 512, 2}),
                         [](const ::testing::TestParamInfo<EngineVariant>& info) {
                           return info.param.name;
                         });

// ---- Seeded sampling --------------------------------------------------------------

constexpr uint64_t kSeed = 4242;
constexpr float kTemperature = 0.8f;
// A short prompt (local under ROUTE_AUTO) and a long one (remote).
constexpr const char* kSeededCases[] = {"lily_and_ben", "long_repeated_313tok"};

v1::GenerateRequest Seeded(const GoldenCase& g, v1::RouteOverride route) {
  v1::GenerateRequest request = MakeRequest(g.prompt, kGoldenMaxTokens, route);
  SetSeededSampling(&request, kTemperature, kSeed);
  return request;
}

// The ids of `request` alone; a test failure if it fails.
std::vector<int32_t> IdsAlone(LocalCluster& cluster, const v1::GenerateRequest& request) {
  const StreamResult r = RunGenerate(cluster.stub(), request);
  EXPECT_TRUE(r.status.ok()) << r.status.error_message();
  EXPECT_EQ(r.seed, kSeed);
  EXPECT_EQ(r.token_ids.size(), kGoldenMaxTokens);
  return r.token_ids;
}

using SeededSamplingInvarianceTest = OwnClusterTest;

TEST_F(SeededSamplingInvarianceTest, SameIdsBesideUnseededRequests) {
  ASSERT_NO_FATAL_FAILURE(StartCluster(ClusterOptions()));
  for (const char* name : kSeededCases) {
    const GoldenCase& g = Golden(name);
    const std::vector<int32_t> alone = IdsAlone(cluster(), Seeded(g, v1::ROUTE_AUTO));

    // Unseeded requests (the router draws their seeds) that are decoding
    // when the seeded one starts: each has streamed a token and has up to
    // 1000 to go. Several, so that one running to EOS early cannot leave
    // the seeded request alone.
    v1::GenerateRequest unseeded =
        MakeRequest(Golden("once_upon_a_time").prompt, 1000, v1::ROUTE_LOCAL);
    unseeded.mutable_sampling()->set_temperature(kTemperature);
    std::vector<std::unique_ptr<GenerateStream>> others;
    for (int i = 0; i < 4; ++i) {
      others.push_back(std::make_unique<GenerateStream>(cluster().stub(), unseeded));
      ASSERT_TRUE(others.back()->ReadUntilFirstToken())
          << others.back()->Finish().status.error_message();
    }
    const StreamResult seeded = RunGenerate(cluster().stub(), Seeded(g, v1::ROUTE_AUTO));
    int still_running = 0;
    for (auto& other : others) {
      other->Cancel();
      const StreamResult& o = other->Finish();
      EXPECT_NE(o.seed, kSeed);
      if (o.status.error_code() == grpc::StatusCode::CANCELLED) {
        ++still_running;
      } else {
        EXPECT_TRUE(o.status.ok()) << o.status.error_message();
      }
    }
    ASSERT_TRUE(seeded.status.ok()) << seeded.status.error_message();
    EXPECT_EQ(seeded.seed, kSeed);
    EXPECT_EQ(seeded.token_ids, alone) << name;
    EXPECT_GT(still_running, 0) << "every unseeded request ended before the seeded one did";
  }
  absl::StatusOr<v1::WorkerStatus> d = cluster().DecodeStatus();
  ASSERT_TRUE(d.ok()) << d.status();
  EXPECT_GT(d->max_decode_batch_size(), 1u) << "the requests never shared a decode step";
  v1::ClusterStatus last;
  EXPECT_TRUE(cluster().WaitForIdleWorkers(absl::Seconds(2), &last)) << last.DebugString();
}

TEST_F(SeededSamplingInvarianceTest, SameIdsForcedLocalAndForcedRemote) {
  ASSERT_NO_FATAL_FAILURE(StartCluster(ClusterOptions()));
  for (const char* name : kSeededCases) {
    const GoldenCase& g = Golden(name);
    const std::vector<int32_t> alone = IdsAlone(cluster(), Seeded(g, v1::ROUTE_AUTO));
    EXPECT_EQ(IdsAlone(cluster(), Seeded(g, v1::ROUTE_LOCAL)), alone) << name << " local";
    EXPECT_EQ(IdsAlone(cluster(), Seeded(g, v1::ROUTE_REMOTE)), alone) << name << " remote";
  }
}

}  // namespace
}  // namespace tandem::testing
