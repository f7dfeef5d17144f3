// Tests for tools/bench/bench_cli: `tandem bench`'s flags (defaults as
// vLLM's `bench serve`, every value, every bad value's one-line error), its
// --help text and the header lines it prints before a run.
#include "tools/bench/bench_cli.h"

#include <cmath>
#include <cstdlib>

#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace tandem::cli {
namespace {

using ::testing::ElementsAre;
using ::testing::HasSubstr;

// Every flag of the `tandem bench` contract (the rules file, which
// scripts/bench-serving relies on), written out here rather than taken
// from the code.
const char* const kAllFlags[] = {
    "router", "backend", "base-url", "api-key", "model", "dataset", "dataset-path",
    "num-prompts", "seed", "random-input-len", "random-output-len", "random-range-ratio",
    "random-prefix-len", "prefix-repetition-prefix-len", "prefix-repetition-suffix-len",
    "prefix-repetition-num-prefixes", "prefix-repetition-output-len", "sharegpt-output-len",
    "mooncake-block-size", "request-rate", "burstiness", "max-concurrency", "num-warmups",
    "goodput", "metric-percentiles", "save-result", "no-progress", "timeout-ms"};

class BenchCliTest : public ::testing::Test {
 protected:
  // The tests must not see a key from the environment.
  void SetUp() override { unsetenv("TANDEM_API_KEY"); }
};

TEST_F(BenchCliTest, DefaultsAreVllmBenchServes) {
  absl::StatusOr<BenchOptions> o = ParseBenchArgs({});
  ASSERT_TRUE(o.ok()) << o.status();
  EXPECT_EQ(o->router, "127.0.0.1:50051");
  EXPECT_EQ(o->backend, BenchBackendKind::kTandem);
  EXPECT_EQ(o->base_url, "http://127.0.0.1:8000");
  EXPECT_EQ(o->api_key, "");
  EXPECT_EQ(o->model, "");
  EXPECT_EQ(o->dataset.name, "random");
  EXPECT_EQ(o->dataset.path, "");
  EXPECT_EQ(o->dataset.num_prompts, 1000);
  EXPECT_EQ(o->dataset.seed, 0u);
  EXPECT_EQ(o->dataset.random_input_len, 1024);
  EXPECT_EQ(o->dataset.random_output_len, 128);
  EXPECT_EQ(o->dataset.random_range_ratio, 0.0);
  EXPECT_EQ(o->dataset.random_prefix_len, 0);
  EXPECT_EQ(o->dataset.prefix_repetition_prefix_len, 256);
  EXPECT_EQ(o->dataset.prefix_repetition_suffix_len, 256);
  EXPECT_EQ(o->dataset.prefix_repetition_num_prefixes, 10);
  EXPECT_EQ(o->dataset.prefix_repetition_output_len, 128);
  EXPECT_FALSE(o->dataset.sharegpt_output_len.has_value());
  EXPECT_EQ(o->dataset.mooncake_block_size, 512);
  EXPECT_TRUE(std::isinf(o->request_rate) && o->request_rate > 0);
  EXPECT_EQ(o->burstiness, 1.0);
  EXPECT_FALSE(o->max_concurrency.has_value());
  EXPECT_EQ(o->num_warmups, 0);
  EXPECT_FALSE(o->goodput.has_value());
  EXPECT_THAT(o->percentiles, ElementsAre(99.0));
  EXPECT_EQ(o->save_result, "");
  EXPECT_TRUE(o->progress);
  EXPECT_EQ(o->timeout_ms, 600000);
}

TEST_F(BenchCliTest, EveryFlagSetsItsField) {
  absl::StatusOr<BenchOptions> o = ParseBenchArgs(
      {"--router", "10.0.0.2:6000", "--backend", "openai", "--base-url", "http://10.0.0.2:8080/",
       "--api-key", "k-1", "--model", "stories", "--dataset", "mooncake", "--dataset-path",
       "/tmp/trace.jsonl", "--num-prompts", "40", "--seed", "18446744073709551615",
       "--random-input-len", "32", "--random-output-len", "8", "--random-range-ratio", "0.25",
       "--random-prefix-len", "5", "--prefix-repetition-prefix-len", "0",
       "--prefix-repetition-suffix-len", "7", "--prefix-repetition-num-prefixes", "3",
       "--prefix-repetition-output-len", "9", "--sharegpt-output-len", "11",
       "--mooncake-block-size", "16", "--request-rate", "2.5", "--burstiness", "0.5",
       "--max-concurrency", "4", "--num-warmups", "2", "--goodput", "ttft:500", "tpot:50",
       "--metric-percentiles", "50,90,99.9", "--save-result", "out.json", "--no-progress",
       "--timeout-ms=0"});
  ASSERT_TRUE(o.ok()) << o.status();
  EXPECT_EQ(o->router, "10.0.0.2:6000");
  EXPECT_EQ(o->backend, BenchBackendKind::kOpenAi);
  EXPECT_EQ(o->base_url, "http://10.0.0.2:8080");  // the trailing '/' dropped
  EXPECT_EQ(o->api_key, "k-1");
  EXPECT_EQ(o->model, "stories");
  EXPECT_EQ(o->dataset.name, "mooncake");
  EXPECT_EQ(o->dataset.path, "/tmp/trace.jsonl");
  EXPECT_EQ(o->dataset.num_prompts, 40);
  EXPECT_EQ(o->dataset.seed, 18446744073709551615u);
  EXPECT_EQ(o->dataset.random_input_len, 32);
  EXPECT_EQ(o->dataset.random_output_len, 8);
  EXPECT_EQ(o->dataset.random_range_ratio, 0.25);
  EXPECT_EQ(o->dataset.random_prefix_len, 5);
  EXPECT_EQ(o->dataset.prefix_repetition_prefix_len, 0);
  EXPECT_EQ(o->dataset.prefix_repetition_suffix_len, 7);
  EXPECT_EQ(o->dataset.prefix_repetition_num_prefixes, 3);
  EXPECT_EQ(o->dataset.prefix_repetition_output_len, 9);
  EXPECT_EQ(o->dataset.sharegpt_output_len, 11);
  EXPECT_EQ(o->dataset.mooncake_block_size, 16);
  EXPECT_EQ(o->request_rate, 2.5);
  EXPECT_FALSE(o->trace_timestamps);  // --request-rate given: the arrival process
  EXPECT_EQ(o->burstiness, 0.5);
  EXPECT_EQ(o->max_concurrency, 4);
  EXPECT_EQ(o->num_warmups, 2);
  ASSERT_TRUE(o->goodput.has_value());
  EXPECT_EQ(o->goodput->ttft_ms, 500.0);
  EXPECT_EQ(o->goodput->tpot_ms, 50.0);
  EXPECT_FALSE(o->goodput->e2el_ms.has_value());
  EXPECT_THAT(o->percentiles, ElementsAre(50.0, 90.0, 99.9));
  EXPECT_EQ(o->save_result, "out.json");
  EXPECT_FALSE(o->progress);
  EXPECT_EQ(o->timeout_ms, 0);
}

TEST_F(BenchCliTest, AMooncakeTraceWithoutARateIsSentAtItsTimestamps) {
  absl::StatusOr<BenchOptions> o = ParseBenchArgs({"--dataset", "mooncake", "--dataset-path", "t"});
  ASSERT_TRUE(o.ok()) << o.status();
  EXPECT_TRUE(o->trace_timestamps);
  EXPECT_EQ(FormatRunHeader(*o),
            "Traffic request rate: trace timestamps\n"
            "Burstiness factor: 1.0 (Poisson process)\n"
            "Maximum request concurrency: None\n");
  o = ParseBenchArgs({"--dataset", "random"});
  ASSERT_TRUE(o.ok()) << o.status();
  EXPECT_FALSE(o->trace_timestamps);
}

TEST_F(BenchCliTest, RequestRateInfInAnyCase) {
  for (const char* inf : {"inf", "INF", "Inf"}) {
    absl::StatusOr<BenchOptions> o = ParseBenchArgs({"--request-rate", inf});
    ASSERT_TRUE(o.ok()) << inf << ": " << o.status();
    EXPECT_TRUE(std::isinf(o->request_rate)) << inf;
  }
}

TEST_F(BenchCliTest, ApiKeyFromTheEnvironment) {
  setenv("TANDEM_API_KEY", "env-key", 1);
  absl::StatusOr<BenchOptions> o = ParseBenchArgs({});
  ASSERT_TRUE(o.ok()) << o.status();
  EXPECT_EQ(o->api_key, "env-key");
  o = ParseBenchArgs({"--api-key", "flag-key"});
  ASSERT_TRUE(o.ok()) << o.status();
  EXPECT_EQ(o->api_key, "flag-key");
}

TEST_F(BenchCliTest, GoodputTakesTheItemsUpToTheNextFlag) {
  absl::StatusOr<BenchOptions> o =
      ParseBenchArgs({"--goodput", "e2el:2000", "ttft:5", "tpot:1.5", "--num-prompts", "3"});
  ASSERT_TRUE(o.ok()) << o.status();
  ASSERT_TRUE(o->goodput.has_value());
  EXPECT_EQ(o->goodput->ttft_ms, 5.0);
  EXPECT_EQ(o->goodput->tpot_ms, 1.5);
  EXPECT_EQ(o->goodput->e2el_ms, 2000.0);
  EXPECT_EQ(o->dataset.num_prompts, 3);

  // One item, last on the line; and the "=" form followed by more items.
  o = ParseBenchArgs({"--num-prompts", "3", "--goodput", "ttft:7"});
  ASSERT_TRUE(o.ok()) << o.status();
  EXPECT_EQ(o->goodput->ttft_ms, 7.0);
  EXPECT_FALSE(o->goodput->tpot_ms.has_value());
  o = ParseBenchArgs({"--goodput=ttft:7", "tpot:3"});
  ASSERT_TRUE(o.ok()) << o.status();
  EXPECT_EQ(o->goodput->ttft_ms, 7.0);
  EXPECT_EQ(o->goodput->tpot_ms, 3.0);
}

// Each bad flag is refused with one message that names it.
TEST_F(BenchCliTest, EveryBadValueNamesItsFlag) {
  struct Case {
    std::vector<std::string> args;
    const char* flag;  // the message starts with it
  } cases[] = {
      {{"--router", "nohost"}, "--router"},
      {{"--router", "h:70000"}, "--router"},
      {{"--backend", "vllm"}, "--backend"},
      {{"--base-url", "127.0.0.1:8000"}, "--base-url"},
      {{"--base-url", "https://h:8000"}, "--base-url"},
      {{"--base-url", "http://h:0"}, "--base-url"},
      {{"--base-url", "http://h:8000/v1"}, "--base-url"},
      {{"--base-url", "http://:8000"}, "--base-url"},
      {{"--api-key", ""}, "--api-key"},
      {{"--api-key", "a b"}, "--api-key"},
      {{"--model", ""}, "--model"},
      {{"--dataset", "sonnet"}, "--dataset"},
      {{"--dataset", "sharegpt"}, "--dataset-path"},
      {{"--dataset", "mooncake"}, "--dataset-path"},
      {{"--num-prompts", "0"}, "--num-prompts"},
      {{"--num-prompts", "x"}, "--num-prompts"},
      {{"--num-prompts", "2147483648"}, "--num-prompts"},
      {{"--num-prompts", "10000001"}, "--num-prompts"},  // over kMaxNumPrompts
      {{"--seed", "-1"}, "--seed"},
      {{"--random-input-len", "0"}, "--random-input-len"},
      {{"--random-output-len", "0"}, "--random-output-len"},
      {{"--random-range-ratio", "1"}, "--random-range-ratio"},
      {{"--random-range-ratio", "-0.1"}, "--random-range-ratio"},
      {{"--random-range-ratio", "nan"}, "--random-range-ratio"},
      {{"--random-prefix-len", "-1"}, "--random-prefix-len"},
      {{"--prefix-repetition-prefix-len", "-1"}, "--prefix-repetition-prefix-len"},
      {{"--prefix-repetition-suffix-len", "-1"}, "--prefix-repetition-suffix-len"},
      {{"--prefix-repetition-num-prefixes", "0"}, "--prefix-repetition-num-prefixes"},
      {{"--prefix-repetition-output-len", "0"}, "--prefix-repetition-output-len"},
      {{"--sharegpt-output-len", "0"}, "--sharegpt-output-len"},
      {{"--mooncake-block-size", "0"}, "--mooncake-block-size"},
      {{"--request-rate", "0"}, "--request-rate"},
      {{"--request-rate", "-2"}, "--request-rate"},
      {{"--request-rate", "fast"}, "--request-rate"},
      {{"--burstiness", "0"}, "--burstiness"},
      {{"--burstiness", "inf"}, "--burstiness"},
      {{"--max-concurrency", "0"}, "--max-concurrency"},
      {{"--num-warmups", "-1"}, "--num-warmups"},
      {{"--goodput"}, "--goodput"},
      {{"--goodput", "--num-prompts", "3"}, "--goodput"},
      {{"--goodput", "ttft:5", "--goodput", "tpot:5"}, "--goodput"},
      {{"--metric-percentiles", "50,x"}, "--metric-percentiles"},
      {{"--save-result", ""}, "--save-result"},
      {{"--no-progress=1"}, "--no-progress"},
      {{"--timeout-ms", "-5"}, "--timeout-ms"},
      {{"--num-prompts", "1", "--num-prompts", "2"}, "--num-prompts"},
  };
  for (const Case& c : cases) {
    absl::StatusOr<BenchOptions> o = ParseBenchArgs(c.args);
    ASSERT_FALSE(o.ok()) << c.args.front() << " " << (c.args.size() > 1 ? c.args[1] : "");
    EXPECT_EQ(o.status().code(), absl::StatusCode::kInvalidArgument);
    EXPECT_THAT(std::string(o.status().message()), ::testing::StartsWith(std::string(c.flag)))
        << c.args.front();
    EXPECT_EQ(std::string(o.status().message()).find('\n'), std::string::npos);
  }
}

TEST_F(BenchCliTest, GoodputItemsAreCheckedByName) {
  // The item errors are metrics.h's ParseGoodput's; the CLI passes the
  // items through in order, so each bad one reaches it.
  for (std::vector<std::string> args :
       {std::vector<std::string>{"--goodput", "ttft"}, {"--goodput", "ttft:5", "latency:9"},
        {"--goodput", "ttft:5", "ttft:6"}, {"--goodput", "tpot:-1"}}) {
    absl::StatusOr<BenchOptions> o = ParseBenchArgs(args);
    ASSERT_FALSE(o.ok()) << args.back();
    EXPECT_EQ(o.status().code(), absl::StatusCode::kInvalidArgument) << args.back();
  }
}

TEST_F(BenchCliTest, ExactMessagesOfTheCommonMistakes) {
  EXPECT_EQ(ParseBenchArgs({"--dataset", "sonnet"}).status().message(),
            "--dataset: unknown 'sonnet' (expected random, prefix-repetition, sharegpt or "
            "mooncake)");
  EXPECT_EQ(ParseBenchArgs({"--dataset", "mooncake"}).status().message(),
            "--dataset-path: required with --dataset mooncake");
  EXPECT_EQ(ParseBenchArgs({"--num-prompts", "0"}).status().message(),
            "--num-prompts: must be in 1..2147483647, got 0");
  EXPECT_EQ(ParseBenchArgs({"--request-rate", "0"}).status().message(),
            "--request-rate: must be > 0 or inf, got '0'");
  EXPECT_EQ(ParseBenchArgs({"--goodput"}).status().message(),
            "--goodput: expected one or more items (ttft:MS tpot:MS e2el:MS)");
  EXPECT_EQ(ParseBenchArgs({"40"}).status().message(), "unexpected argument '40'");
  EXPECT_THAT(std::string(ParseBenchArgs({"--rate", "1"}).status().message()),
              ::testing::StartsWith("unknown flag --rate (known: --router "));
}

TEST_F(BenchCliTest, HelpListsEveryFlag) {
  const std::string usage = BenchUsage();
  EXPECT_THAT(usage, ::testing::StartsWith("usage: tandem bench "));
  for (const char* flag : kAllFlags) {
    EXPECT_THAT(usage, HasSubstr(std::string("[--") + flag)) << flag;
  }
}

TEST_F(BenchCliTest, EveryListedFlagIsAccepted) {
  // The other half of HelpListsEveryFlag: the parser knows each flag (an
  // unknown one would say "unknown flag").
  for (const char* flag : kAllFlags) {
    absl::StatusOr<BenchOptions> o = ParseBenchArgs({std::string("--") + flag});
    if (!o.ok()) {
      EXPECT_THAT(std::string(o.status().message()), ::testing::Not(HasSubstr("unknown flag")))
          << flag;
    }
  }
}

TEST_F(BenchCliTest, HeaderLinesAreVllms) {
  // vLLM prints Python floats: `f"Traffic request rate: {request_rate}"`.
  BenchOptions o;
  EXPECT_EQ(FormatRunHeader(o),
            "Traffic request rate: inf\n"
            "Burstiness factor: 1.0 (Poisson process)\n"
            "Maximum request concurrency: None\n");
  o.request_rate = 20;
  o.burstiness = 0.5;
  o.max_concurrency = 8;
  EXPECT_EQ(FormatRunHeader(o),
            "Traffic request rate: 20.0\n"
            "Burstiness factor: 0.5 (Gamma distribution)\n"
            "Maximum request concurrency: 8\n");
}

TEST_F(BenchCliTest, PythonFloatRepr) {
  // Python 3: repr(x) for each x.
  EXPECT_EQ(PythonFloat(1), "1.0");
  EXPECT_EQ(PythonFloat(2.5), "2.5");
  EXPECT_EQ(PythonFloat(0.1), "0.1");
  EXPECT_EQ(PythonFloat(100), "100.0");
  EXPECT_EQ(PythonFloat(1e-05), "1e-05");
  EXPECT_EQ(PythonFloat(std::numeric_limits<double>::infinity()), "inf");
}

}  // namespace
}  // namespace tandem::cli
