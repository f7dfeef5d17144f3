// tools/bench/datasets.h: the random and prefix-repetition datasets, option
// checks, and the seed-stable draws of dataset_sampling.h. The file datasets
// (ShareGPT, Mooncake) are in bench_dataset_files_test.cc.
#include <cmath>
#include <cstdint>
#include <functional>
#include <limits>
#include <map>
#include <random>
#include <set>
#include <string>
#include <vector>

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include "tools/bench/dataset_sampling.h"
#include "tools/bench/datasets.h"

namespace tandem::bench {
namespace {

using ::testing::HasSubstr;

DatasetOptions RandomOptions() {
  DatasetOptions o;
  o.name = "random";
  o.vocab_size = 32000;
  o.num_prompts = 200;
  o.seed = 1;
  o.random_input_len = 64;
  o.random_output_len = 16;
  return o;
}

std::set<int64_t> Range(int64_t lo, int64_t hi) {
  std::set<int64_t> values;
  for (int64_t v = lo; v <= hi; ++v) values.insert(v);
  return values;
}

// --- dataset_sampling.h ---------------------------------------------------

// C++ [rand.predef]: the 10000th output of a default-constructed
// std::mt19937_64 is 9981545732273789042. 2^64 mod 1000 = 616 <= it, so it
// is accepted and 9981545732273789042 mod 1000 = 42; for n = 2^63 + 1 the
// threshold is 2^63 - 1 and the value is 758173695419013233 (Python).
TEST(BenchDatasetsTest, UniformBelowMapsTheStandardReferenceValue) {
  std::mt19937_64 rng;
  rng.discard(9999);
  EXPECT_EQ(UniformBelow(rng, 1000), 42u);
  std::mt19937_64 rng2;
  rng2.discard(9999);
  EXPECT_EQ(UniformBelow(rng2, (uint64_t{1} << 63) + 1), 758173695419013233u);
}

// A draw under 2^64 mod n is rejected and the next one used: for a seed
// whose first raw draw x0 is under 2^62, n = 2^64 - 1 - x0 (> 2^63) has
// 2^64 mod n = x0 + 1, so x0 is rejected and x1 mod n returned.
TEST(BenchDatasetsTest, UniformBelowRejectsDrawsUnderTheThreshold) {
  uint64_t seed = 0, x0 = 0, x1 = 0;
  for (;; ++seed) {
    std::mt19937_64 raw(seed);
    x0 = raw();
    x1 = raw();
    if (x0 < (uint64_t{1} << 62) && x1 > x0) break;
  }
  const uint64_t n = std::numeric_limits<uint64_t>::max() - x0;
  std::mt19937_64 rng(seed);
  EXPECT_EQ(UniformBelow(rng, n), x1 % n);
}

TEST(BenchDatasetsTest, ShuffleIsAPermutationAndReachesEveryOrder) {
  std::set<std::vector<int>> orders;
  for (uint64_t seed = 0; seed < 200; ++seed) {
    std::vector<int> items = {0, 1, 2};
    std::mt19937_64 rng = SeededRng(seed, RngStream::kShareGpt);
    Shuffle(items, rng);
    EXPECT_EQ(std::multiset<int>(items.begin(), items.end()), (std::multiset<int>{0, 1, 2}));
    orders.insert(items);
  }
  EXPECT_EQ(orders.size(), 6u);
}

TEST(BenchDatasetsTest, SeededRngSeparatesSeedsStreamsAndKeys) {
  const uint64_t a = SeededRng(1, RngStream::kRandom)();
  EXPECT_EQ(a, SeededRng(1, RngStream::kRandom)());
  EXPECT_NE(a, SeededRng(2, RngStream::kRandom)());
  EXPECT_NE(a, SeededRng(1, RngStream::kPrefixRepetition)());
  EXPECT_NE(SeededRng(1, RngStream::kMooncakeBlock, 7)(),
            SeededRng(1, RngStream::kMooncakeBlock, 8)());
  // The key's high half counts too.
  EXPECT_NE(SeededRng(1, RngStream::kMooncakeBlock, 7)(),
            SeededRng(1, RngStream::kMooncakeBlock, 7 + (uint64_t{1} << 32))());
}

// --- random -------------------------------------------------------------

TEST(BenchDatasetsTest, UnknownDatasetIsTheHeadersError) {
  DatasetOptions o = RandomOptions();
  o.name = "squad";
  auto got = LoadDataset(o, nullptr);
  ASSERT_EQ(got.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(got.status().message(),
            "--dataset: unknown 'squad' (expected random, prefix-repetition, sharegpt or "
            "mooncake)");
}

// Ranges from Python, as vLLM computes them: math.floor(10 * (1 - 0.8)) = 1
// (10 * 0.19999999999999996 in double; exactly it would be 2) and
// math.ceil(10 * 1.8) = 18; for 20: [3, 36] (exactly: 4). Every value of a
// range shows up in 3000 draws, and none outside it.
TEST(BenchDatasetsTest, RandomLengthsCoverVllmsRangeExactly) {
  DatasetOptions o = RandomOptions();
  o.num_prompts = 3000;
  o.random_input_len = 10;
  o.random_output_len = 20;
  o.random_range_ratio = 0.8;
  auto got = LoadDataset(o, nullptr);
  ASSERT_TRUE(got.ok()) << got.status();
  ASSERT_EQ(got->size(), 3000u);
  std::set<int64_t> inputs, outputs;
  for (const BenchRequest& r : *got) {
    EXPECT_EQ(r.prompt_len, static_cast<int32_t>(r.prompt_token_ids.size()));
    EXPECT_TRUE(r.prompt.empty());
    EXPECT_FALSE(r.timestamp_s.has_value());
    inputs.insert(r.prompt_len);
    outputs.insert(r.output_len);
  }
  EXPECT_EQ(inputs, Range(1, 18));
  EXPECT_EQ(outputs, Range(3, 36));
}

// floor(5 * 0.2) is 0 in double (0.9999999999999998): raised to 1.
TEST(BenchDatasetsTest, RandomLowEndIsAtLeastOne) {
  DatasetOptions o = RandomOptions();
  o.num_prompts = 1000;
  o.random_input_len = 5;
  o.random_output_len = 5;
  o.random_range_ratio = 0.8;
  auto got = LoadDataset(o, nullptr);
  ASSERT_TRUE(got.ok()) << got.status();
  std::set<int64_t> inputs, outputs;
  for (const BenchRequest& r : *got) {
    inputs.insert(r.prompt_len);
    outputs.insert(r.output_len);
  }
  EXPECT_EQ(inputs, Range(1, 9));
  EXPECT_EQ(outputs, Range(1, 9));
}

TEST(BenchDatasetsTest, RandomRatioZeroGivesExactLengths) {
  DatasetOptions o = RandomOptions();
  auto got = LoadDataset(o, nullptr);
  ASSERT_TRUE(got.ok()) << got.status();
  ASSERT_EQ(got->size(), 200u);
  for (const BenchRequest& r : *got) {
    EXPECT_EQ(r.prompt_len, 64);
    EXPECT_EQ(r.prompt_token_ids.size(), 64u);
    EXPECT_EQ(r.output_len, 16);
  }
}

TEST(BenchDatasetsTest, RandomIsDeterministicPerSeed) {
  DatasetOptions o = RandomOptions();
  o.random_range_ratio = 0.5;
  auto a = LoadDataset(o, nullptr);
  auto b = LoadDataset(o, nullptr);
  o.seed = 2;
  auto c = LoadDataset(o, nullptr);
  ASSERT_TRUE(a.ok() && b.ok() && c.ok());
  bool any_differs = false;
  for (size_t i = 0; i < a->size(); ++i) {
    EXPECT_EQ((*a)[i].prompt_token_ids, (*b)[i].prompt_token_ids);
    EXPECT_EQ((*a)[i].output_len, (*b)[i].output_len);
    any_differs |= (*a)[i].prompt_token_ids != (*c)[i].prompt_token_ids;
  }
  EXPECT_TRUE(any_differs);
}

// Vocabulary 8 with specials 0, 3, 7 (100 and -1 are outside it, ignored):
// ids are exactly {1, 2, 4, 5, 6}, each reached.
TEST(BenchDatasetsTest, RandomNeverDrawsSpecialIds) {
  DatasetOptions o = RandomOptions();
  o.vocab_size = 8;
  o.special_token_ids = {0, 3, 7, 100, -1, 3};
  o.random_prefix_len = 5;
  auto got = LoadDataset(o, nullptr);
  ASSERT_TRUE(got.ok()) << got.status();
  std::set<int32_t> ids;
  for (const BenchRequest& r : *got) ids.insert(r.prompt_token_ids.begin(), r.prompt_token_ids.end());
  EXPECT_EQ(ids, (std::set<int32_t>{1, 2, 4, 5, 6}));
}

TEST(BenchDatasetsTest, RandomPrefixIsSharedAndCountsInPromptLen) {
  DatasetOptions o = RandomOptions();
  o.num_prompts = 50;
  o.random_prefix_len = 16;
  o.random_input_len = 20;
  o.random_range_ratio = 0.5;  // inputs in [10, 30]
  auto got = LoadDataset(o, nullptr);
  ASSERT_TRUE(got.ok()) << got.status();
  const std::vector<int32_t> prefix((*got)[0].prompt_token_ids.begin(),
                                    (*got)[0].prompt_token_ids.begin() + 16);
  std::set<std::vector<int32_t>> suffixes;
  for (const BenchRequest& r : *got) {
    ASSERT_GE(r.prompt_len, 16 + 10);
    ASSERT_LE(r.prompt_len, 16 + 30);
    ASSERT_EQ(r.prompt_token_ids.size(), static_cast<size_t>(r.prompt_len));
    EXPECT_EQ(std::vector<int32_t>(r.prompt_token_ids.begin(), r.prompt_token_ids.begin() + 16),
              prefix);
    suffixes.insert(std::vector<int32_t>(r.prompt_token_ids.begin() + 16, r.prompt_token_ids.end()));
  }
  EXPECT_EQ(suffixes.size(), 50u);  // after the prefix, every prompt is its own
}

TEST(BenchDatasetsTest, RandomOverContextLengthNamesTheRequest) {
  DatasetOptions o = RandomOptions();
  o.random_input_len = 100;
  o.random_output_len = 50;
  o.context_length = 150;
  EXPECT_TRUE(LoadDataset(o, nullptr).ok());
  o.context_length = 149;
  auto got = LoadDataset(o, nullptr);
  ASSERT_EQ(got.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(got.status().message(),
            "request 0: prompt_len 100 + output_len 50 = 150 tokens exceeds the model's context "
            "length 149; lower --random-input-len, --random-prefix-len or --random-output-len");
}

// With varying lengths, the first request over the limit is the one named.
TEST(BenchDatasetsTest, RandomNamesTheFirstRequestOverContextLength) {
  DatasetOptions o = RandomOptions();
  o.random_range_ratio = 0.5;  // inputs 32..96, outputs 8..24
  auto all = LoadDataset(o, nullptr);
  ASSERT_TRUE(all.ok());
  const int32_t limit = 100;
  size_t first = all->size();
  for (size_t i = 0; i < all->size(); ++i) {
    if ((*all)[i].prompt_len + (*all)[i].output_len > limit) {
      first = i;
      break;
    }
  }
  ASSERT_LT(first, all->size());
  o.context_length = limit;
  auto got = LoadDataset(o, nullptr);
  EXPECT_THAT(std::string(got.status().message()), HasSubstr("request " + std::to_string(first) + ": "));
}

struct BadOption {
  std::string name;
  std::function<void(DatasetOptions&)> change;
  std::string message;  // a substring of the error
};

TEST(BenchDatasetsTest, BadOptionsNameTheFlag) {
  const std::vector<BadOption> cases = {
      {"num_prompts", [](DatasetOptions& o) { o.num_prompts = 0; },
       "--num-prompts: must be >= 1, got 0"},
      {"input", [](DatasetOptions& o) { o.random_input_len = 0; },
       "--random-input-len: must be >= 1, got 0"},
      {"output", [](DatasetOptions& o) { o.random_output_len = -3; },
       "--random-output-len: must be >= 1, got -3"},
      {"prefix", [](DatasetOptions& o) { o.random_prefix_len = -1; },
       "--random-prefix-len: must be >= 0, got -1"},
      {"ratio1", [](DatasetOptions& o) { o.random_range_ratio = 1; },
       "--random-range-ratio: must be in [0, 1), got 1"},
      {"ratio-", [](DatasetOptions& o) { o.random_range_ratio = -0.25; },
       "--random-range-ratio: must be in [0, 1), got -0.25"},
      {"ratioNaN", [](DatasetOptions& o) { o.random_range_ratio = std::nan(""); },
       "--random-range-ratio: must be in [0, 1)"},
      {"vocab", [](DatasetOptions& o) { o.vocab_size = 1; },
       "vocab_size: must be >= 2 (the model's vocabulary), got 1"},
      {"all special",
       [](DatasetOptions& o) {
         o.vocab_size = 3;
         o.special_token_ids = {2, 0, 1};
       },
       "vocab_size: all 3 ids are special tokens"},
      {"huge prompt", [](DatasetOptions& o) { o.random_input_len = 1 << 30; },
       "--random-input-len / --random-prefix-len: prompts of up to 1073741824 tokens are over "
       "the limit of 16777216"},
      {"huge output", [](DatasetOptions& o) { o.random_output_len = 1 << 25; },
       "--random-output-len: outputs of up to 33554432 tokens are over the limit"},
      // 100000 prompts of 16000 tokens: 1.6e9 ids, over 2^28.
      {"huge dataset",
       [](DatasetOptions& o) {
         o.num_prompts = 100000;
         o.random_input_len = 16000;
       },
       "the dataset would hold 1600000000 prompt tokens, over the limit of 268435456; lower "
       "--num-prompts or --random-input-len"},
      {"pr prefix",
       [](DatasetOptions& o) {
         o.name = "prefix-repetition";
         o.prefix_repetition_prefix_len = 0;
       },
       "--prefix-repetition-prefix-len: must be >= 1, got 0"},
      {"pr suffix",
       [](DatasetOptions& o) {
         o.name = "prefix-repetition";
         o.prefix_repetition_suffix_len = -1;
       },
       "--prefix-repetition-suffix-len: must be >= 0, got -1"},
      {"pr num prefixes",
       [](DatasetOptions& o) {
         o.name = "prefix-repetition";
         o.prefix_repetition_num_prefixes = 0;
       },
       "--prefix-repetition-num-prefixes: must be >= 1, got 0"},
      {"pr output",
       [](DatasetOptions& o) {
         o.name = "prefix-repetition";
         o.prefix_repetition_output_len = 0;
       },
       "--prefix-repetition-output-len: must be >= 1, got 0"},
      {"pr too few prompts",
       [](DatasetOptions& o) {
         o.name = "prefix-repetition";
         o.num_prompts = 3;
       },
       "--num-prompts: 3 is fewer than --prefix-repetition-num-prefixes 10"},
      {"sharegpt path", [](DatasetOptions& o) { o.name = "sharegpt"; },
       "--dataset-path: required with --dataset sharegpt"},
      {"mooncake path", [](DatasetOptions& o) { o.name = "mooncake"; },
       "--dataset-path: required with --dataset mooncake"},
  };
  for (const BadOption& c : cases) {
    DatasetOptions o = RandomOptions();
    c.change(o);
    auto got = LoadDataset(o, nullptr);
    EXPECT_EQ(got.status().code(), absl::StatusCode::kInvalidArgument) << c.name;
    EXPECT_THAT(std::string(got.status().message()), HasSubstr(c.message)) << c.name;
  }
}

// --- prefix-repetition ----------------------------------------------------

DatasetOptions PrefixOptions() {
  DatasetOptions o;
  o.name = "prefix-repetition";
  o.vocab_size = 32000;
  o.seed = 3;
  o.num_prompts = 23;
  o.prefix_repetition_num_prefixes = 5;
  o.prefix_repetition_prefix_len = 8;
  o.prefix_repetition_suffix_len = 4;
  o.prefix_repetition_output_len = 9;
  return o;
}

// 23 requests over 5 prefixes, i mod 5: prefixes used 5, 5, 5, 4, 4 times.
TEST(BenchDatasetsTest, PrefixRepetitionUsesEachPrefixInTurn) {
  auto got = LoadDataset(PrefixOptions(), nullptr);
  ASSERT_TRUE(got.ok()) << got.status();
  ASSERT_EQ(got->size(), 23u);
  std::map<std::vector<int32_t>, int> uses;
  std::set<std::vector<int32_t>> suffixes;
  for (const BenchRequest& r : *got) {
    ASSERT_EQ(r.prompt_token_ids.size(), 12u);
    EXPECT_EQ(r.prompt_len, 12);
    EXPECT_EQ(r.output_len, 9);
    ++uses[std::vector<int32_t>(r.prompt_token_ids.begin(), r.prompt_token_ids.begin() + 8)];
    suffixes.insert(std::vector<int32_t>(r.prompt_token_ids.begin() + 8, r.prompt_token_ids.end()));
  }
  ASSERT_EQ(uses.size(), 5u);
  std::multiset<int> counts;
  for (const auto& [prefix, n] : uses) counts.insert(n);
  EXPECT_EQ(counts, (std::multiset<int>{4, 4, 5, 5, 5}));
  EXPECT_EQ(suffixes.size(), 23u);  // each suffix drawn fresh
}

// Shuffled: the prefixes do not come in the cyclic order 0,1,2,3,4,0,...
TEST(BenchDatasetsTest, PrefixRepetitionIsShuffledDeterministically) {
  auto got = LoadDataset(PrefixOptions(), nullptr);
  auto again = LoadDataset(PrefixOptions(), nullptr);
  ASSERT_TRUE(got.ok() && again.ok());
  std::map<std::vector<int32_t>, int> group;  // prefix -> order of first use
  std::vector<int> sequence;
  for (size_t i = 0; i < got->size(); ++i) {
    const auto& ids = (*got)[i].prompt_token_ids;
    EXPECT_EQ(ids, (*again)[i].prompt_token_ids);
    std::vector<int32_t> prefix(ids.begin(), ids.begin() + 8);
    group.emplace(prefix, static_cast<int>(group.size()));
    sequence.push_back(group[prefix]);
  }
  std::vector<int> cyclic;
  for (int i = 0; i < 23; ++i) cyclic.push_back(i % 5);
  EXPECT_NE(sequence, cyclic);
}

TEST(BenchDatasetsTest, PrefixRepetitionOverContextLengthNamesTheFlags) {
  DatasetOptions o = PrefixOptions();
  o.context_length = 20;
  auto got = LoadDataset(o, nullptr);
  ASSERT_EQ(got.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(got.status().message(),
            "request 0: prompt_len 12 + output_len 9 = 21 tokens exceeds the model's context "
            "length 20; lower --prefix-repetition-prefix-len, --prefix-repetition-suffix-len or "
            "--prefix-repetition-output-len");
}

}  // namespace
}  // namespace tandem::bench
