// tools/bench/datasets.h: the file datasets, ShareGPT (a JSON list, a fake
// tokenizer: one token per space-separated word plus BOS) and Mooncake
// (JSONL traces), written to temporary files.
#include <stdlib.h>

#include <cstdint>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <map>
#include <set>
#include <string>
#include <system_error>
#include <vector>

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "tools/bench/datasets.h"

namespace tandem::bench {
namespace {

using ::testing::HasSubstr;
using ::testing::StartsWith;

// A directory of this process's files, removed at exit.
const std::string& TempFilesDir() {
  static const std::string dir = [] {
    std::string pattern = ::testing::TempDir() + "/bench_datasets_XXXXXX";
    if (mkdtemp(pattern.data()) == nullptr) return ::testing::TempDir();
    static std::string to_remove;
    to_remove = pattern;
    std::atexit([] {
      std::error_code ec;
      std::filesystem::remove_all(to_remove, ec);
    });
    return pattern;
  }();
  return dir;
}

std::string WriteTemp(const std::string& name, const std::string& content) {
  const std::string path = TempFilesDir() + "/" + name;
  std::ofstream(path, std::ios::binary) << content;
  return path;
}

std::vector<int32_t> Slice(const std::vector<int32_t>& ids, size_t begin, size_t end) {
  return std::vector<int32_t>(ids.begin() + begin, ids.begin() + end);
}

// --- Mooncake -------------------------------------------------------------

DatasetOptions MooncakeOptions(const std::string& path) {
  DatasetOptions o;
  o.name = "mooncake";
  o.path = path;
  o.vocab_size = 32000;
  o.special_token_ids = {0, 1, 2};
  o.seed = 7;
  o.mooncake_block_size = 4;
  return o;
}

// Block size 4. Line 1: blocks 1, 2 (8 tokens) + 2 of its own. Line 3
// (after a blank line; an unknown key): block 1, then block 3 cut to 2.
// Line 4: block 1 cut to 3 (blocks 2, 9 unused). Line 5: as line 1, with
// its own 2-token tail. Line 6: no blocks, 5 tokens of its own. CRLF ends.
constexpr char kTrace[] =
    "{\"timestamp\": 1000, \"input_length\": 10, \"output_length\": 5, \"hash_ids\": [1, 2]}\n"
    "\n"
    "{\"timestamp\": 1500, \"input_length\": 6, \"output_length\": 3, \"hash_ids\": [1, 3], "
    "\"extra\": {\"x\": 1}}\r\n"
    "{\"timestamp\": 1500, \"input_length\": 3, \"output_length\": 1, \"hash_ids\": [1, 2, 9]}\n"
    "{\"timestamp\": 2500.5, \"input_length\": 10, \"output_length\": 2, \"hash_ids\": [1, 2]}\n"
    "  {\"timestamp\": 3000, \"input_length\": 5, \"output_length\": 4, \"hash_ids\": []}";

TEST(BenchDatasetsTest, MooncakeLengthsAndTimestamps) {
  auto got = LoadDataset(MooncakeOptions(WriteTemp("trace.jsonl", kTrace)), nullptr);
  ASSERT_TRUE(got.ok()) << got.status();
  ASSERT_EQ(got->size(), 5u);
  const std::vector<int32_t> prompt_lens = {10, 6, 3, 10, 5};
  const std::vector<int32_t> output_lens = {5, 3, 1, 2, 4};
  const std::vector<double> times = {0, 0.5, 0.5, 1.5005, 2.0};
  for (size_t i = 0; i < got->size(); ++i) {
    const BenchRequest& r = (*got)[i];
    EXPECT_EQ(r.prompt_len, prompt_lens[i]) << i;
    EXPECT_EQ(r.prompt_token_ids.size(), static_cast<size_t>(prompt_lens[i])) << i;
    EXPECT_EQ(r.output_len, output_lens[i]) << i;
    ASSERT_TRUE(r.timestamp_s.has_value());
    EXPECT_DOUBLE_EQ(*r.timestamp_s, times[i]) << i;
    EXPECT_TRUE(r.prompt.empty());
    for (int32_t id : r.prompt_token_ids) {
      EXPECT_GE(id, 3);  // 0, 1, 2 are special
      EXPECT_LT(id, 32000);
    }
  }
}

TEST(BenchDatasetsTest, MooncakeEqualHashIdsGiveEqualBlocks) {
  auto got = LoadDataset(MooncakeOptions(WriteTemp("trace.jsonl", kTrace)), nullptr);
  ASSERT_TRUE(got.ok()) << got.status();
  const auto& l1 = (*got)[0].prompt_token_ids;
  const auto& l3 = (*got)[1].prompt_token_ids;
  const auto& l4 = (*got)[2].prompt_token_ids;
  const auto& l5 = (*got)[3].prompt_token_ids;
  const auto& l6 = (*got)[4].prompt_token_ids;
  // Block 1 everywhere, cut in line 4.
  EXPECT_EQ(Slice(l3, 0, 4), Slice(l1, 0, 4));
  EXPECT_EQ(Slice(l5, 0, 4), Slice(l1, 0, 4));
  EXPECT_EQ(l4, Slice(l1, 0, 3));
  // Block 2 in lines 1 and 5; block 3 differs from it.
  EXPECT_EQ(Slice(l5, 4, 8), Slice(l1, 4, 8));
  EXPECT_NE(Slice(l3, 4, 6), Slice(l1, 4, 6));
  // Each line's own tail is its own, even with equal hash ids.
  EXPECT_NE(Slice(l5, 8, 10), Slice(l1, 8, 10));
  EXPECT_NE(Slice(l6, 0, 4), Slice(l1, 0, 4));

  // A block depends on its hash id, not on its place or the file: block 3
  // first, then block 1, in another trace.
  auto other = LoadDataset(
      MooncakeOptions(WriteTemp(
          "other.jsonl",
          "{\"timestamp\": 0, \"input_length\": 8, \"output_length\": 1, \"hash_ids\": [3, 1]}\n")),
      nullptr);
  ASSERT_TRUE(other.ok()) << other.status();
  const auto& o1 = (*other)[0].prompt_token_ids;
  EXPECT_EQ(Slice(o1, 0, 2), Slice(l3, 4, 6));
  EXPECT_EQ(Slice(o1, 4, 8), Slice(l1, 0, 4));
}

TEST(BenchDatasetsTest, MooncakeIsDeterministicPerSeed) {
  const std::string path = WriteTemp("trace.jsonl", kTrace);
  DatasetOptions o = MooncakeOptions(path);
  auto a = LoadDataset(o, nullptr);
  auto b = LoadDataset(o, nullptr);
  o.seed = 8;
  auto c = LoadDataset(o, nullptr);
  ASSERT_TRUE(a.ok() && b.ok() && c.ok());
  for (size_t i = 0; i < a->size(); ++i) {
    EXPECT_EQ((*a)[i].prompt_token_ids, (*b)[i].prompt_token_ids);
    EXPECT_NE((*a)[i].prompt_token_ids, (*c)[i].prompt_token_ids);
  }
}

TEST(BenchDatasetsTest, MooncakeTakesTheFirstNumPromptsLines) {
  DatasetOptions o = MooncakeOptions(WriteTemp("trace.jsonl", kTrace));
  o.num_prompts = 2;
  auto got = LoadDataset(o, nullptr);
  ASSERT_TRUE(got.ok()) << got.status();
  ASSERT_EQ(got->size(), 2u);
  EXPECT_EQ((*got)[0].prompt_len, 10);
  EXPECT_EQ((*got)[1].prompt_len, 6);
}

TEST(BenchDatasetsTest, MooncakeOverContextLengthNamesTheLine) {
  const std::string path = WriteTemp("trace.jsonl", kTrace);
  DatasetOptions o = MooncakeOptions(path);
  o.context_length = 14;  // line 1: 10 + 5 = 15
  auto got = LoadDataset(o, nullptr);
  ASSERT_EQ(got.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(got.status().message(),
            absl::StrCat("request 0 (", path,
                         ":1): prompt_len 10 + output_len 5 = 15 tokens exceeds the model's "
                         "context length 14; lower --num-prompts to stop before this line, or "
                         "serve a model with a longer context"));
}

// Each bad line is line 3 (after a good line and a blank one); the error
// is "PATH:3: " and names the field.
TEST(BenchDatasetsTest, MooncakeMalformedLinesNameLineAndField) {
  const std::string good =
      "{\"timestamp\": 100, \"input_length\": 4, \"output_length\": 1, \"hash_ids\": []}\n\n";
  const std::map<std::string, std::string> cases = {
      {R"({"timestamp": 200, "input_length": "x", "output_length": 1, "hash_ids": []})",
       R"(input_length: expected an integer in [1, 16777216], got "x")"},
      {R"({"timestamp": 200, "input_length": 0, "output_length": 1, "hash_ids": []})",
       "input_length: expected an integer in [1, 16777216], got 0"},
      {R"({"timestamp": 200, "input_length": 1.5, "output_length": 1, "hash_ids": []})",
       "input_length: expected an integer in [1, 16777216], got 1.5"},
      {R"({"timestamp": 200, "input_length": 16777217, "output_length": 1, "hash_ids": []})",
       "input_length: expected an integer in [1, 16777216], got 16777217"},
      {R"({"timestamp": 200, "output_length": 1, "hash_ids": []})", "input_length: missing"},
      {R"({"timestamp": 200, "input_length": 4, "output_length": -1, "hash_ids": []})",
       "output_length: expected an integer in [1, 16777216], got -1"},
      {R"({"timestamp": 200, "input_length": 4, "hash_ids": []})", "output_length: missing"},
      {R"({"timestamp": 200, "input_length": 4, "output_length": 1, "hash_ids": "a"})",
       R"(hash_ids: expected a list of integers, got "a")"},
      {R"({"timestamp": 200, "input_length": 4, "output_length": 1, "hash_ids": [1, "b"]})",
       R"(hash_ids[1]: expected an integer, got "b")"},
      {R"({"timestamp": 200, "input_length": 4, "output_length": 1})",
       "hash_ids: missing (a list of integers, possibly empty)"},
      {R"({"input_length": 4, "output_length": 1, "hash_ids": []})", "timestamp: missing"},
      {R"({"timestamp": -5, "input_length": 4, "output_length": 1, "hash_ids": []})",
       "timestamp: expected a number of ms >= 0, got -5"},
      {R"({"timestamp": "soon", "input_length": 4, "output_length": 1, "hash_ids": []})",
       R"(timestamp: expected a number of ms >= 0, got "soon")"},
      {R"({"timestamp": 50, "input_length": 4, "output_length": 1, "hash_ids": []})",
       "timestamp: 50 ms is before line 1's 100 ms (timestamps must not decrease)"},
      {R"({"timestamp": 200, "input_length": 4,)", "not JSON: parse error at column 38: syntax error while parsing object key - unexpected "
       "end of input; expected string literal"},
      {"[1, 2]", "expected a JSON object, got [1,2]"},
  };
  for (const auto& [line, message] : cases) {
    const std::string path = WriteTemp("bad.jsonl", good + line + "\n" + good);
    auto got = LoadDataset(MooncakeOptions(path), nullptr);
    ASSERT_EQ(got.status().code(), absl::StatusCode::kInvalidArgument) << line;
    EXPECT_EQ(std::string(got.status().message()), absl::StrCat(path, ":3: ", message)) << line;
  }
}

TEST(BenchDatasetsTest, MooncakeTimestampPastTheHorizonIsRefused) {
  // 1e15 ms after line 1 is past kMaxSendTimeS (1e8 s): refused naming the
  // line, not sent at once through an overflowed clock.
  const std::string path = WriteTemp(
      "far.jsonl",
      "{\"timestamp\": 0, \"input_length\": 4, \"output_length\": 1, \"hash_ids\": []}\n"
      "{\"timestamp\": 1e15, \"input_length\": 4, \"output_length\": 1, \"hash_ids\": []}\n");
  auto got = LoadDataset(MooncakeOptions(path), nullptr);
  ASSERT_EQ(got.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(std::string(got.status().message()), StartsWith(path + ":2: timestamp: "));
  EXPECT_THAT(std::string(got.status().message()), HasSubstr("s after line 1's"));
}

TEST(BenchDatasetsTest, MooncakeFileErrors) {
  DatasetOptions o = MooncakeOptions(::testing::TempDir() + "/no_such_trace.jsonl");
  auto missing = LoadDataset(o, nullptr);
  EXPECT_EQ(missing.status().code(), absl::StatusCode::kNotFound);
  EXPECT_THAT(std::string(missing.status().message()), StartsWith(o.path + ": cannot read ("));

  o.path = ::testing::TempDir();
  auto dir = LoadDataset(o, nullptr);
  EXPECT_EQ(dir.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(std::string(dir.status().message()), HasSubstr("is a directory"));

  o.path = WriteTemp("blank.jsonl", "\n  \n\r\n");
  auto empty = LoadDataset(o, nullptr);
  EXPECT_EQ(empty.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(empty.status().message(), o.path + ": no requests (an empty trace)");

  o.path = WriteTemp("trace.jsonl", kTrace);
  o.mooncake_block_size = 0;
  EXPECT_THAT(std::string(LoadDataset(o, nullptr).status().message()),
              HasSubstr("--mooncake-block-size: must be >= 1, got 0"));
}

// --- ShareGPT -------------------------------------------------------------

// One token per space-separated word, plus BOS; "FAIL" fails.
absl::StatusOr<std::vector<int32_t>> WordTokenizer(const std::string& text) {
  if (text == "FAIL") return absl::UnavailableError("tokenizer down");
  std::vector<int32_t> ids = {1};
  for (absl::string_view word : absl::StrSplit(text, ' ', absl::SkipEmpty())) {
    ids.push_back(static_cast<int32_t>(word.size()));
  }
  return ids;
}

// A text of n words whose first word is `tag`.
std::string Words(const std::string& tag, int n) {
  std::string text = tag;
  for (int i = 1; i < n; ++i) text += " w";
  return text;
}

std::string Pair(const std::string& prompt, const std::string& reply) {
  return absl::StrCat(R"({"conversations": [{"from": "human", "value": ")", prompt,
                      R"("}, {"from": "gpt", "value": ")", reply, R"("}]})");
}

// Tokens = words + 1. A: 6 + 5, kept. B: prompt 3 < 4. C: reply 3 < 4
// (kept when the output is fixed). D: prompt 1101 > 1024. E: 1001 + 1101
// > 2048 (kept with a fixed output of 3). F: one turn. G: 4 + 4, the low
// edges. H: 1024 + 1024 = 2048, the high edges. I: 5 + 5, with a third
// turn that is not an object (not read).
std::string ShareGptFile() {
  return absl::StrCat(
      "[", Pair(Words("A", 5), Words("a", 4)), ",", Pair(Words("B", 2), Words("b", 10)), ",",
      Pair(Words("C", 5), Words("c", 2)), ",", Pair(Words("D", 1100), Words("d", 10)), ",",
      Pair(Words("E", 1000), Words("e", 1100)), ",",
      R"({"conversations": [{"from": "human", "value": "F w w w w"}]},)",
      Pair(Words("G", 3), Words("g", 3)), ",", Pair(Words("H", 1023), Words("h", 1023)), ",",
      R"({"id": "i", "conversations": [{"from": "human", "value": "I w w w"},)",
      R"({"from": "gpt", "value": "i w w w"}, 5]})", "]");
}

DatasetOptions ShareGptOptions(const std::string& path) {
  DatasetOptions o;
  o.name = "sharegpt";
  o.path = path;
  o.seed = 11;
  o.num_prompts = 100;
  return o;
}

// Tag (first word of the prompt) -> {prompt_len, output_len}.
std::map<std::string, std::pair<int32_t, int32_t>> ByTag(const std::vector<BenchRequest>& requests) {
  std::map<std::string, std::pair<int32_t, int32_t>> by_tag;
  for (const BenchRequest& r : requests) {
    EXPECT_TRUE(r.prompt_token_ids.empty());
    EXPECT_FALSE(r.timestamp_s.has_value());
    by_tag[r.prompt.substr(0, r.prompt.find(' '))] = {r.prompt_len, r.output_len};
  }
  return by_tag;
}

TEST(BenchDatasetsTest, ShareGptAppliesVllmsFilter) {
  auto got = LoadDataset(ShareGptOptions(WriteTemp("sharegpt.json", ShareGptFile())), WordTokenizer);
  ASSERT_TRUE(got.ok()) << got.status();
  ASSERT_EQ(got->size(), 4u);
  const std::map<std::string, std::pair<int32_t, int32_t>> want = {
      {"A", {6, 5}}, {"G", {4, 4}}, {"H", {1024, 1024}}, {"I", {5, 5}}};
  EXPECT_EQ(ByTag(*got), want);
}

TEST(BenchDatasetsTest, ShareGptFixedOutputLenSkipsTheReplyCheck) {
  DatasetOptions o = ShareGptOptions(WriteTemp("sharegpt.json", ShareGptFile()));
  o.sharegpt_output_len = 3;
  auto got = LoadDataset(o, WordTokenizer);
  ASSERT_TRUE(got.ok()) << got.status();
  const std::map<std::string, std::pair<int32_t, int32_t>> want = {
      {"A", {6, 3}}, {"C", {6, 3}}, {"E", {1001, 3}}, {"G", {4, 3}}, {"H", {1024, 3}},
      {"I", {5, 3}}};
  EXPECT_EQ(ByTag(*got), want);
}

TEST(BenchDatasetsTest, ShareGptTakesASeededShuffledSubset) {
  DatasetOptions o = ShareGptOptions(WriteTemp("sharegpt.json", ShareGptFile()));
  o.num_prompts = 2;
  std::set<std::string> firsts;
  for (uint64_t seed = 0; seed < 20; ++seed) {
    o.seed = seed;
    auto got = LoadDataset(o, WordTokenizer);
    auto again = LoadDataset(o, WordTokenizer);
    ASSERT_TRUE(got.ok() && again.ok());
    ASSERT_EQ(got->size(), 2u);
    EXPECT_EQ((*got)[0].prompt, (*again)[0].prompt);
    EXPECT_EQ((*got)[1].prompt, (*again)[1].prompt);
    EXPECT_NE((*got)[0].prompt, (*got)[1].prompt);
    firsts.insert((*got)[0].prompt.substr(0, 1));
  }
  // The first request is not always the file's first usable entry.
  EXPECT_GT(firsts.size(), 1u);
  for (const std::string& tag : firsts) EXPECT_THAT("AGHI", HasSubstr(tag));
}

TEST(BenchDatasetsTest, ShareGptMalformedEntriesNameTheIndex) {
  const std::string ok = Pair(Words("A", 5), Words("a", 4));
  const std::map<std::string, std::string> cases = {
      {R"({"a": 1})", ": expected a JSON list of conversations, got a JSON object"},
      {"[" + ok + ", 5]", ": entry 1: expected an object, got 5"},
      {"[" + ok + ", " + ok + R"(, {"id": "x"}])", ": entry 2: no \"conversations\""},
      {R"([{"conversations": "hi"}])", R"(: entry 0: conversations: expected a list, got "hi")"},
      {R"([{"conversations": [{"from": "human", "value": "a b c d"}, {"from": "gpt"}]}])",
       R"(: entry 0: conversations[1]: expected an object with a string "value", got {"from":"gpt"})"},
      {R"([{"conversations": [{"value": 5}, {"value": "a b c d"}]}])",
       R"(: entry 0: conversations[0]: expected an object with a string "value", got {"value":5})"},
      {"[", ": not JSON: parse error at line 1, column 2"},
  };
  for (const auto& [text, message] : cases) {
    const std::string path = WriteTemp("bad.json", text);
    auto got = LoadDataset(ShareGptOptions(path), WordTokenizer);
    ASSERT_EQ(got.status().code(), absl::StatusCode::kInvalidArgument) << text;
    EXPECT_THAT(std::string(got.status().message()), StartsWith(path + message)) << text;
  }
}

TEST(BenchDatasetsTest, ShareGptOtherErrors) {
  DatasetOptions o = ShareGptOptions(::testing::TempDir() + "/no_such_sharegpt.json");
  auto missing = LoadDataset(o, WordTokenizer);
  EXPECT_EQ(missing.status().code(), absl::StatusCode::kNotFound);
  EXPECT_THAT(std::string(missing.status().message()), StartsWith(o.path + ": cannot read ("));

  o.path = WriteTemp("filtered.json", "[" + Pair(Words("B", 2), Words("b", 10)) + "]");
  auto none = LoadDataset(o, WordTokenizer);
  EXPECT_EQ(none.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(std::string(none.status().message()), StartsWith(o.path + ": no usable conversation"));

  o.path = WriteTemp("one.json", "[" + Pair(Words("A", 5), Words("a", 4)) + "]");
  o.context_length = 10;  // 6 + 5 = 11
  auto too_long = LoadDataset(o, WordTokenizer);
  EXPECT_EQ(too_long.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(too_long.status().message(),
            absl::StrCat("request 0 (", o.path,
                         " entry 0): prompt_len 6 + output_len 5 = 11 tokens exceeds the model's "
                         "context length 10; lower --sharegpt-output-len, or serve a model with a "
                         "longer context"));
  o.context_length = 11;
  EXPECT_TRUE(LoadDataset(o, WordTokenizer).ok());

  o.sharegpt_output_len = 0;
  EXPECT_THAT(std::string(LoadDataset(o, WordTokenizer).status().message()),
              HasSubstr("--sharegpt-output-len: must be >= 1, got 0"));
  o.sharegpt_output_len.reset();

  EXPECT_EQ(LoadDataset(o, nullptr).status().code(), absl::StatusCode::kFailedPrecondition);

  o.path = WriteTemp("fail.json", "[" + Pair("FAIL", Words("a", 4)) + "]");
  auto failed = LoadDataset(o, WordTokenizer);
  EXPECT_EQ(failed.status(), absl::UnavailableError("tokenizer down"));
}

}  // namespace
}  // namespace tandem::bench
