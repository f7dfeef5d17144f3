// `tandem bench` end to end: the real build/tandem binary as a process
// against a real cluster (stories260K, one prefill and one decode worker,
// the OpenAI HTTP port open), as a user runs it. Checks the exit status,
// stdout's header lines and table, and the --save-result JSON (vLLM's field
// names, exact counts), ShareGPT's lengths (the router's tokenizer), a
// Mooncake trace replayed at its timestamps; the one-line errors of an unknown dataset, a
// malformed Mooncake trace line and an unreachable router.
#include <filesystem>
#include <fstream>
#include <sstream>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "tests/integration/cluster_fixture.h"

namespace tandem::testing {
namespace {

using ::testing::Each;
using ::testing::HasSubstr;
using ::testing::StartsWith;
using json = nlohmann::json;

class BenchE2eTest : public ClusterSuite {
 protected:
  static void SetUpTestSuite() {
    ClusterOptions options;
    options.http_listen = "127.0.0.1:0";
    StartSuiteCluster(options);
  }

  void SetUp() override {
    ClusterSuite::SetUp();
    dir_ = MakeTempDir();
  }
  void TearDown() override {
    std::error_code ignored;
    if (!dir_.empty()) std::filesystem::remove_all(dir_, ignored);
  }

  // Runs `tandem bench --router <the cluster> <args>` to completion.
  static ProcessResult Bench(const std::vector<std::string>& args) {
    std::vector<std::string> argv = {BinaryPath("tandem"), "bench", "--router",
                                     cluster().router_address(), "--no-progress"};
    argv.insert(argv.end(), args.begin(), args.end());
    return RunProcess(argv, absl::Seconds(45));
  }

  // The JSON in `path`; a null json (and a failure) when it does not parse.
  static json ReadJson(const std::string& path) {
    std::ifstream in(path);
    std::stringstream text;
    text << in.rdbuf();
    json j = json::parse(text.str(), nullptr, /*allow_exceptions=*/false);
    if (j.is_discarded()) {
      ADD_FAILURE() << path << " is not JSON: " << text.str();
      return json();
    }
    return j;
  }

  std::string dir_;  // this test's files, removed after it
};

// The issue's acceptance run: 40 random requests at 20 requests/s.
TEST_F(BenchE2eTest, RandomRunCompletesEveryRequestWithVllmFields) {
  const std::string out = dir_ + "/out.json";
  ProcessResult run = Bench({"--dataset", "random", "--num-prompts", "40", "--request-rate", "20",
                             "--random-input-len", "32", "--random-output-len", "8",
                             "--save-result", out, "--seed", "1"});
  ASSERT_TRUE(run.exited && run.exit_code == 0) << run.Describe() << run.out;
  EXPECT_THAT(run.out, StartsWith("Traffic request rate: 20.0\n"
                                  "Burstiness factor: 1.0 (Poisson process)\n"
                                  "Maximum request concurrency: None\n"));
  EXPECT_THAT(run.out, HasSubstr("Serving Benchmark Result"));
  EXPECT_EQ(run.err.find("failed"), std::string::npos) << run.err;

  const json j = ReadJson(out);
  ASSERT_TRUE(j.is_object());
  EXPECT_EQ(j.value("completed", -1), 40);
  EXPECT_EQ(j.value("failed", -1), 0);
  EXPECT_EQ(j.value("num_prompts", -1), 40);
  EXPECT_EQ(j.value("backend", ""), "tandem-grpc");
  // model_id: what GetModelInfo calls the model (the GGUF's general.name).
  grpc::ClientContext context;
  v1::GetModelInfoResponse info;
  ASSERT_TRUE(cluster().stub().GetModelInfo(&context, v1::GetModelInfoRequest(), &info).ok());
  EXPECT_EQ(j.value("model_id", ""), info.name());
  EXPECT_EQ(j.value("dataset", ""), "random");
  EXPECT_EQ(j.value("request_rate", 0.0), 20.0);
  EXPECT_EQ(j.value("burstiness", 0.0), 1.0);
  EXPECT_TRUE(j.contains("max_concurrency") && j["max_concurrency"].is_null());
  // Every request: exactly 32 prompt ids (range ratio 0) and, with
  // ignore_eos, exactly 8 generated tokens.
  EXPECT_EQ(j.value("total_input_tokens", -1), 40 * 32);
  EXPECT_EQ(j.value("total_output_tokens", -1), 40 * 8);
  ASSERT_TRUE(j["input_lens"].is_array() && j["output_lens"].is_array());
  EXPECT_EQ(j["input_lens"].size(), 40u);
  EXPECT_EQ(j["output_lens"].size(), 40u);
  EXPECT_THAT(j["input_lens"].get<std::vector<int>>(), Each(32));
  EXPECT_THAT(j["output_lens"].get<std::vector<int>>(), Each(8));
  EXPECT_EQ(j["ttfts"].size(), 40u);
  EXPECT_EQ(j["itls"].size(), 40u);
  // No --goodput: the field is there, null (vLLM writes None).
  EXPECT_TRUE(j.contains("request_goodput") && j["request_goodput"].is_null());
  // 40 requests over the run's duration.
  const double duration = j.value("duration", 0.0);
  ASSERT_GT(duration, 0);
  EXPECT_DOUBLE_EQ(j.value("request_throughput", 0.0), 40 / duration);
  EXPECT_DOUBLE_EQ(j.value("output_throughput", 0.0), 320 / duration);
  EXPECT_DOUBLE_EQ(j.value("total_token_throughput", 0.0), (1280 + 320) / duration);
  for (const char* m : {"ttft", "tpot", "itl", "e2el"}) {
    for (const char* stat : {"mean_", "median_", "std_", "p99_"}) {
      const std::string key = std::string(stat) + m + "_ms";
      ASSERT_TRUE(j.contains(key) && j[key].is_number()) << key;
      EXPECT_GE(j[key].get<double>(), 0) << key;
    }
  }
  // A request's latency covers its first token.
  EXPECT_GE(j.value("mean_e2el_ms", 0.0), j.value("mean_ttft_ms", 1e18));
}

TEST_F(BenchE2eTest, GoodputCountsTheRequestsMeetingTheSlos) {
  const std::string& dir = dir_;
  // SLOs of 10 minutes: every request meets them, so goodput = throughput.
  ProcessResult run = Bench({"--num-prompts", "10", "--random-input-len", "16",
                             "--random-output-len", "4", "--goodput", "ttft:600000",
                             "tpot:600000", "--save-result", dir + "/met.json"});
  ASSERT_TRUE(run.exited && run.exit_code == 0) << run.Describe();
  json j = ReadJson(dir + "/met.json");
  ASSERT_TRUE(j.is_object());
  EXPECT_EQ(j.value("completed", -1), 10);
  ASSERT_TRUE(j["request_goodput"].is_number()) << j.dump();
  EXPECT_DOUBLE_EQ(j["request_goodput"].get<double>(), j.value("request_throughput", -1.0));
  // A TTFT under a microsecond: no request meets it, goodput 0.
  run = Bench({"--num-prompts", "10", "--random-input-len", "16", "--random-output-len", "4",
               "--goodput", "ttft:0.001", "--save-result", dir + "/none.json"});
  ASSERT_TRUE(run.exited && run.exit_code == 0) << run.Describe();
  j = ReadJson(dir + "/none.json");
  ASSERT_TRUE(j.is_object());
  EXPECT_EQ(j.value("completed", -1), 10);
  EXPECT_EQ(j.value("request_goodput", -1.0), 0.0);
}

TEST_F(BenchE2eTest, OpenAiBackendThroughTheHttpPort) {
  const std::string out = dir_ + "/openai.json";
  // No --model: the name comes from GET /v1/models.
  ProcessResult run = Bench({"--backend", "openai", "--base-url",
                             "http://" + cluster().http_address(), "--num-prompts", "20",
                             "--request-rate", "20", "--random-input-len", "32",
                             "--random-output-len", "8", "--save-result", out});
  ASSERT_TRUE(run.exited && run.exit_code == 0) << run.Describe() << run.out;
  const json j = ReadJson(out);
  ASSERT_TRUE(j.is_object());
  EXPECT_EQ(j.value("backend", ""), "openai");
  EXPECT_EQ(j.value("model_id", ""), "stories260K");
  EXPECT_EQ(j.value("completed", -1), 20);
  EXPECT_EQ(j.value("failed", -1), 0);
  EXPECT_EQ(j.value("total_output_tokens", -1), 20 * 8);
  EXPECT_THAT(j["input_lens"].get<std::vector<int>>(), Each(32));
}

// ShareGPT prompts are text: their lengths come from the router's
// Tokenize (with BOS), the output length from --sharegpt-output-len.
TEST_F(BenchE2eTest, ShareGptLengthsAreTheRoutersTokenization) {
  const std::vector<std::string> prompts = {"Once upon a time there was a little dog.",
                                            "Tom and Lily went to the park to play."};
  json file = json::array();
  for (const std::string& p : prompts) {
    file.push_back({{"conversations",
                     {{{"from", "human"}, {"value", p}},
                      {{"from", "gpt"}, {"value", "They played all day and were happy."}}}}});
  }
  const std::string path = dir_ + "/sharegpt.json";
  ASSERT_TRUE(WriteFile(path, file.dump()));
  std::vector<int> expected_lens;
  for (const std::string& p : prompts) {
    grpc::ClientContext context;
    v1::TokenizeRequest request;
    request.set_text(p);
    request.set_add_bos(true);
    v1::TokenizeResponse response;
    ASSERT_TRUE(cluster().stub().Tokenize(&context, request, &response).ok());
    expected_lens.push_back(response.token_ids_size());
  }
  const std::string out = dir_ + "/sharegpt-out.json";
  ProcessResult run = Bench({"--dataset", "sharegpt", "--dataset-path", path, "--num-prompts",
                             "2", "--sharegpt-output-len", "5", "--save-result", out});
  ASSERT_TRUE(run.exited && run.exit_code == 0) << run.Describe();
  const json j = ReadJson(out);
  ASSERT_TRUE(j.is_object());
  EXPECT_EQ(j.value("completed", -1), 2);
  EXPECT_THAT(j["output_lens"].get<std::vector<int>>(), Each(5));
  // The order is the dataset's shuffle: compare as multisets.
  EXPECT_THAT(j["input_lens"].get<std::vector<int>>(),
              ::testing::UnorderedElementsAreArray(expected_lens));
}

// A Mooncake trace without --request-rate is replayed at its timestamps:
// no request starts before its own (100 ms apart here).
TEST_F(BenchE2eTest, MooncakeTraceIsReplayedAtItsTimestamps) {
  const std::string path = dir_ + "/trace.jsonl";
  ASSERT_TRUE(WriteFile(
      path, R"({"timestamp": 0, "input_length": 40, "output_length": 3, "hash_ids": [1, 2, 3]})"
            "\n"
            R"({"timestamp": 100, "input_length": 40, "output_length": 3, "hash_ids": [1, 2, 4]})"
            "\n"
            R"({"timestamp": 200, "input_length": 20, "output_length": 3, "hash_ids": [1, 2]})"
            "\n"));
  const std::string out = dir_ + "/trace-out.json";
  ProcessResult run = Bench({"--dataset", "mooncake", "--dataset-path", path,
                             "--mooncake-block-size", "16", "--save-result", out});
  ASSERT_TRUE(run.exited && run.exit_code == 0) << run.Describe();
  EXPECT_THAT(run.out, StartsWith("Traffic request rate: trace timestamps\n"));
  const json j = ReadJson(out);
  ASSERT_TRUE(j.is_object());
  EXPECT_EQ(j.value("completed", -1), 3);
  EXPECT_EQ(j["input_lens"].get<std::vector<int>>(), (std::vector<int>{40, 40, 20}));
  EXPECT_EQ(j["output_lens"].get<std::vector<int>>(), (std::vector<int>{3, 3, 3}));
  const std::vector<double> starts = j["start_times"].get<std::vector<double>>();
  ASSERT_EQ(starts.size(), 3u);
  EXPECT_GE(starts[1], 0.1 - 1e-6);
  EXPECT_GE(starts[2], 0.2 - 1e-6);
}

TEST_F(BenchE2eTest, UnknownDatasetIsOneLineAndExitTwo) {
  ProcessResult run = Bench({"--dataset", "sonnet"});
  EXPECT_TRUE(run.exited && run.exit_code == 2) << run.Describe();
  EXPECT_EQ(run.err,
            "tandem bench: --dataset: unknown 'sonnet' (expected random, prefix-repetition, "
            "sharegpt or mooncake) (usage: tandem bench --help)\n");
  EXPECT_EQ(run.out, "");
}

TEST_F(BenchE2eTest, AFlagCombinationTheDatasetRefusesIsExitTwo) {
  ProcessResult run = Bench({"--dataset", "prefix-repetition", "--num-prompts", "3",
                             "--prefix-repetition-num-prefixes", "10"});
  EXPECT_TRUE(run.exited && run.exit_code == 2) << run.Describe();
  EXPECT_THAT(run.err, StartsWith("tandem bench: --num-prompts: "));
  EXPECT_THAT(run.err, HasSubstr("--prefix-repetition-num-prefixes"));
  EXPECT_EQ(Lines(run.err).size(), 1u) << run.err;
}

TEST_F(BenchE2eTest, MalformedTraceLinesAreNamedByNumber) {
  const std::string& dir = dir_;
  const std::string good =
      R"({"timestamp": 0, "input_length": 20, "output_length": 4, "hash_ids": [1]})";
  struct Case {
    std::string bad_line;
    const char* field;  // the message names it ("" for a line that is not JSON)
  } cases[] = {
      {"{not json", ""},
      {R"({"timestamp": 5, "output_length": 4, "hash_ids": [1]})", "input_length"},
      {R"({"timestamp": 5, "input_length": 20, "output_length": 4, "hash_ids": ["a"]})",
       "hash_ids"},
  };
  for (const Case& c : cases) {
    const std::string path = dir + "/trace.jsonl";
    ASSERT_TRUE(WriteFile(path, good + "\n" + good + "\n" + c.bad_line + "\n" + good + "\n"));
    ProcessResult run = Bench({"--dataset", "mooncake", "--dataset-path", path,
                               "--mooncake-block-size", "16"});
    EXPECT_TRUE(run.exited && run.exit_code == 1) << c.bad_line << ": " << run.Describe();
    EXPECT_THAT(run.err, StartsWith("tandem bench: " + path + ":3: ")) << c.bad_line;
    EXPECT_THAT(run.err, HasSubstr(c.field));
    EXPECT_EQ(Lines(run.err).size(), 1u) << run.err;
    EXPECT_EQ(run.out, "") << c.bad_line;  // nothing ran
  }
}

TEST_F(BenchE2eTest, UnreachableRouterIsOneLineAndExitOne) {
  ProcessResult run = RunProcess(
      {BinaryPath("tandem"), "bench", "--router", "127.0.0.1:1", "--num-prompts", "1"},
      absl::Seconds(30));
  EXPECT_TRUE(run.exited && run.exit_code == 1) << run.Describe();
  EXPECT_THAT(run.err,
              StartsWith("tandem bench: GetModelInfo on --router 127.0.0.1:1 failed: UNAVAILABLE: "));
  EXPECT_EQ(Lines(run.err).size(), 1u) << run.err;
}

}  // namespace
}  // namespace tandem::testing
