// Tests for tools/generate: flag parsing, the request built from it, and the
// --json summary folded from a GenerateResponse stream.
#include "tools/generate.h"

#include <stdlib.h>

#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace tandem::cli {
namespace {

using ::testing::ElementsAre;
using ::testing::HasSubstr;

TEST(GenerateArgsTest, Defaults) {
  absl::StatusOr<GenerateOptions> o = ParseGenerateArgs({"Once", "upon"});
  ASSERT_TRUE(o.ok()) << o.status();
  EXPECT_EQ(o->router, "127.0.0.1:50051");
  EXPECT_EQ(o->max_tokens, 32u);
  EXPECT_EQ(o->temperature, 0.0f);
  EXPECT_EQ(o->top_k, 0);
  EXPECT_FALSE(o->top_p.has_value());
  EXPECT_FALSE(o->seed.has_value());
  EXPECT_EQ(o->route, tandem::v1::ROUTE_AUTO);
  EXPECT_FALSE(o->json);
  EXPECT_EQ(o->prompt, "Once upon");

  const tandem::v1::GenerateRequest r = BuildGenerateRequest(*o);
  EXPECT_EQ(r.prompt(), "Once upon");
  EXPECT_EQ(r.max_tokens(), 32u);
  EXPECT_EQ(r.sampling().temperature(), 0.0f);  // greedy
  EXPECT_FALSE(r.sampling().has_top_p());
  EXPECT_FALSE(r.sampling().has_seed());
  EXPECT_EQ(r.route_override(), tandem::v1::ROUTE_AUTO);
  // Generation controls not given: nothing sent (proto defaults, optionals
  // absent), and no logprobs in the JSON.
  EXPECT_FALSE(o->logprobs.has_value());
  EXPECT_EQ(r.stop_size(), 0);
  EXPECT_EQ(r.stop_token_ids_size(), 0);
  EXPECT_FALSE(r.include_stop_str_in_output());
  EXPECT_FALSE(r.ignore_eos());
  EXPECT_EQ(r.min_tokens(), 0u);
  EXPECT_EQ(r.logprobs(), 0u);
  EXPECT_FALSE(r.has_n());
  EXPECT_EQ(r.sampling().min_p(), 0.0f);
  EXPECT_FALSE(r.sampling().has_repetition_penalty());
  EXPECT_EQ(r.sampling().presence_penalty(), 0.0f);
  EXPECT_EQ(r.sampling().frequency_penalty(), 0.0f);
  EXPECT_TRUE(r.sampling().logit_bias().empty());
}

TEST(GenerateArgsTest, GenerationControls) {
  absl::StatusOr<GenerateOptions> o = ParseGenerateArgs(
      {"--stop", "\n\n", "--stop-token-id", "7", "--stop=END", "--stop-token-id=3",
       "--stop", "--json", "--include-stop-str", "--ignore-eos", "--min-tokens", "4",
       "--logprobs", "5", "--n", "3", "--min-p", "0.05", "--repetition-penalty", "1.25",
       "--presence-penalty", "-0.5", "--frequency-penalty=1.5", "--logit-bias", "42=-100",
       "--logit-bias=7=2.5", "--stop", "日本", "p"});
  ASSERT_TRUE(o.ok()) << o.status();
  EXPECT_FALSE(o->json);  // "--json" was the value of --stop
  const tandem::v1::GenerateRequest r = BuildGenerateRequest(*o);
  EXPECT_THAT(r.stop(), ElementsAre("\n\n", "END", "--json", "日本"));  // in order
  EXPECT_THAT(r.stop_token_ids(), ElementsAre(7, 3));
  EXPECT_TRUE(r.include_stop_str_in_output());
  EXPECT_TRUE(r.ignore_eos());
  EXPECT_EQ(r.min_tokens(), 4u);
  EXPECT_EQ(r.logprobs(), 5u);
  ASSERT_TRUE(r.has_n());
  EXPECT_EQ(r.n(), 3u);
  EXPECT_EQ(r.sampling().min_p(), 0.05f);
  ASSERT_TRUE(r.sampling().has_repetition_penalty());
  EXPECT_EQ(r.sampling().repetition_penalty(), 1.25f);
  EXPECT_EQ(r.sampling().presence_penalty(), -0.5f);
  EXPECT_EQ(r.sampling().frequency_penalty(), 1.5f);
  ASSERT_EQ(r.sampling().logit_bias().size(), 2u);
  EXPECT_EQ(r.sampling().logit_bias().at(42), -100.0f);
  EXPECT_EQ(r.sampling().logit_bias().at(7), 2.5f);
  EXPECT_EQ(r.prompt(), "p");

  // The edges of the router's ranges parse and are sent as given (--n 1
  // and --repetition-penalty 1 set).
  const tandem::v1::GenerateRequest edge = BuildGenerateRequest(*ParseGenerateArgs(
      {"--n", "16", "--logprobs", "20", "--min-p", "1", "--repetition-penalty", "1",
       "--logit-bias", "0=-100", "--top-p", "1", "--temperature", "0.00001", "--max-tokens",
       "1", "--min-tokens", "1", "--presence-penalty", "-2", "--frequency-penalty", "2",
       "--stop", std::string(256, 'x'), "p"}));
  ASSERT_TRUE(edge.has_n());
  EXPECT_EQ(edge.n(), 16u);
  EXPECT_EQ(edge.logprobs(), 20u);
  EXPECT_EQ(edge.sampling().min_p(), 1.0f);
  ASSERT_TRUE(edge.sampling().has_repetition_penalty());
  EXPECT_EQ(edge.sampling().repetition_penalty(), 1.0f);
  EXPECT_EQ(edge.sampling().logit_bias().at(0), -100.0f);
  EXPECT_EQ(edge.min_tokens(), 1u);
  EXPECT_THAT(edge.stop(), ElementsAre(std::string(256, 'x')));
  EXPECT_TRUE(ParseGenerateArgs({"--logprobs", "0", "p"})->logprobs.has_value());
}

TEST(GenerateArgsTest, EveryFlag) {
  absl::StatusOr<GenerateOptions> o = ParseGenerateArgs(
      {"--router", "10.0.0.2:7000", "--max-tokens", "5", "--temperature", "0.75", "--top-k", "40",
       "--top-p=0.5", "--seed", "18446744073709551615", "--route", "remote", "--json",
       "--timeout-ms", "1500", "--", "--not-a-flag"});
  ASSERT_TRUE(o.ok()) << o.status();
  EXPECT_EQ(o->router, "10.0.0.2:7000");
  EXPECT_TRUE(o->json);
  EXPECT_EQ(o->timeout_ms, 1500);
  const tandem::v1::GenerateRequest r = BuildGenerateRequest(*o);
  EXPECT_EQ(r.prompt(), "--not-a-flag");
  EXPECT_EQ(r.max_tokens(), 5u);
  EXPECT_EQ(r.sampling().temperature(), 0.75f);
  EXPECT_EQ(r.sampling().top_k(), 40);
  EXPECT_TRUE(r.sampling().has_top_p());
  EXPECT_EQ(r.sampling().top_p(), 0.5f);
  EXPECT_TRUE(r.sampling().has_seed());
  EXPECT_EQ(r.sampling().seed(), 18446744073709551615ull);
  EXPECT_EQ(r.route_override(), tandem::v1::ROUTE_REMOTE);
  EXPECT_EQ(BuildGenerateRequest(*ParseGenerateArgs({"--route", "local", "p"})).route_override(),
            tandem::v1::ROUTE_LOCAL);
  // --seed 0 is a real seed, not "unset".
  const tandem::v1::GenerateRequest zero = BuildGenerateRequest(*ParseGenerateArgs({"--seed", "0", "p"}));
  EXPECT_TRUE(zero.sampling().has_seed());
  EXPECT_EQ(zero.sampling().seed(), 0u);
}

TEST(GenerateArgsTest, ChatSendsOneUserMessage) {
  absl::StatusOr<GenerateOptions> o =
      ParseGenerateArgs({"--chat", "What is", "the capital?", "--max-tokens", "4"});
  ASSERT_TRUE(o.ok()) << o.status();
  EXPECT_TRUE(o->chat);
  const tandem::v1::GenerateRequest r = BuildGenerateRequest(*o);
  EXPECT_EQ(r.prompt(), "");  // exactly one of prompt and messages
  ASSERT_EQ(r.messages_size(), 1);
  EXPECT_EQ(r.messages(0).role(), "user");
  EXPECT_EQ(r.messages(0).content(), "What is the capital?");
  EXPECT_EQ(r.max_tokens(), 4u);
  EXPECT_FALSE(r.split_special_tokens());
  // Without --chat the text is the prompt and there are no messages.
  const tandem::v1::GenerateRequest plain = BuildGenerateRequest(*ParseGenerateArgs({"hi"}));
  EXPECT_FALSE(ParseGenerateArgs({"hi"})->chat);
  EXPECT_EQ(plain.prompt(), "hi");
  EXPECT_EQ(plain.messages_size(), 0);
}

TEST(GenerateArgsTest, ApiKeyFromFlagOrEnvironment) {
  unsetenv("TANDEM_API_KEY");
  EXPECT_EQ(ParseGenerateArgs({"p"})->api_key, "");  // none: nothing sent
  EXPECT_EQ(ParseGenerateArgs({"--api-key", "sk-1", "p"})->api_key, "sk-1");
  setenv("TANDEM_API_KEY", "sk-env", 1);
  EXPECT_EQ(ParseGenerateArgs({"p"})->api_key, "sk-env");
  EXPECT_EQ(ParseGenerateArgs({"--api-key=sk-1", "p"})->api_key, "sk-1");  // the flag wins
  // Not visible ASCII: refused naming the source and the byte, never the key.
  setenv("TANDEM_API_KEY", "sk-env\n", 1);
  EXPECT_EQ(ParseGenerateArgs({"p"}).status().message(),
            "$TANDEM_API_KEY: an API key is visible ASCII only (no spaces, newlines or other "
            "control characters); byte 7 of 7 is 0x0a");
  unsetenv("TANDEM_API_KEY");
  for (const std::string bad : {"ab cd", "cl\xc3\xa9", "a\tb"}) {
    absl::StatusOr<GenerateOptions> o = ParseGenerateArgs({"--api-key", bad, "p"});
    ASSERT_FALSE(o.ok()) << bad;
    const std::string message(o.status().message());
    EXPECT_THAT(message, ::testing::StartsWith("--api-key: an API key is visible"));
    EXPECT_THAT(message, ::testing::Not(::testing::HasSubstr(bad)));
  }
}

TEST(GenerateArgsTest, Errors) {
  struct Case {
    std::vector<std::string> args;
    const char* message;
  } cases[] = {
      {{}, "missing PROMPT"},
      {{"--json"}, "missing PROMPT"},
      {{"--chat"}, "missing PROMPT"},
      {{"--chat=yes", "p"}, "--chat: takes no value"},
      {{"--route", "sideways", "p"}, "--route: expected auto, local or remote, got 'sideways'"},
      {{"--max-tokens", "-1", "p"}, "--max-tokens: must be >= 1, got -1"},
      {{"--max-tokens", "4294967296", "p"}, "--max-tokens: must be in 0..4294967295, got 4294967296"},
      {{"--seed", "-1", "p"}, "--seed: expected an unsigned integer, got '-1'"},
      {{"--temperature", "warm", "p"}, "--temperature: expected a finite number, got 'warm'"},
      {{"--top-k", "9999999999", "p"},
       "--top-k: must be in -2147483648..2147483647, got 9999999999"},
      {{"--timeout-ms", "-5", "p"}, "--timeout-ms: must be >= 0, got -5"},
      {{"--stream", "p"}, "unknown flag --stream"},
      {{"--api-key", "", "p"}, "--api-key: must not be empty"},
      {{"--n", "two", "p"}, "--n: expected an integer, got 'two'"},
      {{"--n", "-1", "p"}, "--n: must be in 0..4294967295, got -1"},
      {{"--n", "1", "--n", "2", "p"}, "--n: given more than once"},
      {{"--logprobs", "4294967296", "p"},
       "--logprobs: must be in 0..4294967295, got 4294967296"},
      {{"--min-tokens", "1.5", "p"}, "--min-tokens: expected an integer, got '1.5'"},
      {{"--stop-token-id", "1", "--stop-token-id", "x", "p"},
       "--stop-token-id: expected an integer, got 'x'"},
      {{"--stop-token-id", "2147483648", "p"},
       "--stop-token-id: must be in -2147483648..2147483647, got 2147483648"},
      {{"--stop", "\xff", "p"}, "--stop: not valid UTF-8"},
      {{"--stop"}, "--stop: missing value"},
      {{"--include-stop-str=1", "p"}, "--include-stop-str: takes no value"},
      {{"--ignore-eos", "--ignore-eos", "p"}, "--ignore-eos: given more than once"},
      {{"--min-p", "nan", "p"}, "--min-p: expected a finite number, got 'nan'"},
      {{"--repetition-penalty", "", "p"},
       "--repetition-penalty: expected a finite number, got ''"},
      {{"--presence-penalty", "inf", "p"},
       "--presence-penalty: expected a finite number, got 'inf'"},
      {{"--frequency-penalty", "x", "p"}, "--frequency-penalty: expected a finite number, got 'x'"},
      {{"--logit-bias", "5", "p"}, "--logit-bias: expected ID=BIAS, got '5'"},
      {{"--logit-bias", "a=1", "p"}, "--logit-bias: expected an integer, got 'a'"},
      {{"--logit-bias", "5=", "p"}, "--logit-bias: expected a finite number, got ''"},
      {{"--logit-bias", "9999999999=1", "p"},
       "--logit-bias: must be in -2147483648..2147483647, got 9999999999"},
      {{"--logit-bias", "5=1", "--logit-bias", "5=2", "p"},
       "--logit-bias: token id 5 given more than once"},
  };
  for (const Case& c : cases) {
    absl::StatusOr<GenerateOptions> o = ParseGenerateArgs(c.args);
    ASSERT_FALSE(o.ok()) << c.message;
    EXPECT_EQ(o.status().code(), absl::StatusCode::kInvalidArgument);
    EXPECT_THAT(o.status().message(), HasSubstr(c.message));
  }
}

// Issue #32: a value the router refuses is refused here, as a bad flag
// naming it, with the router's range (engine/sampling/sampling_options.h,
// engine/core/request_validation.h; vLLM's and OpenAI's ranges).
TEST(GenerateArgsTest, ValuesOutsideTheRoutersRangesAreBadFlags) {
  struct Case {
    std::vector<std::string> args;
    const char* message;
  } cases[] = {
      {{"--max-tokens", "0", "p"}, "--max-tokens: must be >= 1, got 0"},
      {{"--temperature", "-1", "p"}, "--temperature: must be 0 (greedy) or in [1e-05, inf), got -1"},
      {{"--temperature", "1e-6", "p"},
       "--temperature: must be 0 (greedy) or in [1e-05, inf), got 1e-06"},
      {{"--top-p", "0", "p"}, "--top-p: must be in (0, 1], got 0"},
      {{"--top-p", "1.5", "p"}, "--top-p: must be in (0, 1], got 1.5"},
      {{"--min-p", "7", "p"}, "--min-p: must be in [0, 1], got 7"},
      {{"--min-p", "-0.5", "p"}, "--min-p: must be in [0, 1], got -0.5"},
      {{"--repetition-penalty", "0", "p"},
       "--repetition-penalty: must be in [0.01, 100], got 0"},
      {{"--repetition-penalty", "101", "p"},
       "--repetition-penalty: must be in [0.01, 100], got 101"},
      {{"--presence-penalty", "-2.5", "p"}, "--presence-penalty: must be in [-2, 2], got -2.5"},
      {{"--frequency-penalty", "3", "p"}, "--frequency-penalty: must be in [-2, 2], got 3"},
      {{"--logprobs", "21", "p"}, "--logprobs: must be in [0, 20], got 21"},
      {{"--logit-bias", "5=101", "p"},
       "--logit-bias: logit_bias[5]: bias must be in [-100, 100], got 101"},
      {{"--logit-bias", "-1=1", "p"}, "--logit-bias: a token id is >= 0, got -1"},
      {{"--n", "0", "p"}, "--n: must be in [1, 16], got 0"},
      {{"--n", "17", "p"}, "--n: must be in [1, 16], got 17"},
      {{"--min-tokens", "5", "--max-tokens", "4", "p"},
       "--min-tokens: must be in [0, max_tokens = 4], got 5"},
      {{"--stop-token-id", "-3", "p"}, "--stop-token-id: a token id is >= 0, got -3"},
      {{"--stop", "", "p"}, "--stop: stop[0]: must be 1 to 256 bytes, got 0"},
      {{"--stop", std::string(257, 'x'), "p"},
       "--stop: stop[0]: must be 1 to 256 bytes, got 257"},
      {{""}, "PROMPT: must not be empty"},
  };
  for (const Case& c : cases) {
    absl::StatusOr<GenerateOptions> o = ParseGenerateArgs(c.args);
    ASSERT_FALSE(o.ok()) << c.message;
    EXPECT_EQ(o.status().code(), absl::StatusCode::kInvalidArgument);
    EXPECT_EQ(o.status().message(), c.message);
  }
  // 257 stop token ids: more than the router takes (kMaxStopTokenIds).
  std::vector<std::string> many;
  for (int i = 0; i < 257; ++i) many.insert(many.end(), {"--stop-token-id", std::to_string(i)});
  many.push_back("p");
  EXPECT_EQ(ParseGenerateArgs(many).status().message(),
            "--stop-token-id: at most 256 ids, got 257");
}

TEST(GenerateArgsTest, ErrorsKeepTheirOrder) {
  // The syntax is checked before the ranges: one line, the first problem.
  EXPECT_EQ(ParseGenerateArgs({"--max-tokens", "0", "--route", "x", "p"}).status().message(),
            "--route: expected auto, local or remote, got 'x'");
}

TEST(FinishReasonNameTest, MatchesTheDocumentedStrings) {
  EXPECT_EQ(FinishReasonName(tandem::v1::FINISH_LENGTH), "length");
  EXPECT_EQ(FinishReasonName(tandem::v1::FINISH_STOP), "stop");
  EXPECT_EQ(FinishReasonName(tandem::v1::FINISH_CONTEXT), "context");
  EXPECT_EQ(FinishReasonName(tandem::v1::FINISH_CANCELLED), "cancelled");
  EXPECT_EQ(FinishReasonName(tandem::v1::FINISH_NONE), "");
}

tandem::v1::GenerateResponse Message(std::vector<std::pair<uint32_t, int32_t>> tokens,
                                     const std::string& text) {
  tandem::v1::GenerateResponse r;
  for (auto [index, id] : tokens) {
    tandem::v1::TokenOutput* t = r.add_tokens();
    t->set_index(index);
    t->set_token_id(id);
  }
  r.set_text(text);
  return r;
}

// The server's timing fields of a stream that carried no RequestTiming.
const std::string kNoServerTiming =
    R"("server_ttft_ms":null,"router_queue_ms":null,"placement_ms":null,)"
    R"("prefill_queue_ms":null,"prefill_ms":null,"kv_transfer_ms":null,)"
    R"("decode_admission_ms":null,"first_decode_ms":null)";

TEST(GenerateResultTest, RemoteStreamToJsonLine) {
  tandem::v1::GenerateResponse first = Message({{0, 42}}, "Once");
  first.set_request_id("0123456789abcdef0123456789abcdef");
  first.set_route("remote");
  first.set_prefill_worker("prefill-0");
  first.set_decode_worker("decode-0");
  for (int id : {1, 500, 600}) first.add_prompt_token_ids(id);
  first.set_seed(7);
  tandem::v1::GenerateResponse last = Message({{2, 44}}, " a");
  last.set_finish_reason(tandem::v1::FINISH_LENGTH);
  last.set_prompt_tokens(3);
  last.set_completion_tokens(3);

  GenerateResult result;
  result.Add(first, absl::Milliseconds(5));
  result.Add(Message({{1, 43}}, " upon"), absl::Milliseconds(7));
  result.Add(last, absl::Microseconds(9500));
  result.Finish(absl::Microseconds(10250));
  EXPECT_EQ(result.ToJsonLine(),
            R"({"request_id":"0123456789abcdef0123456789abcdef","route":"remote",)"
            R"("prefill_worker":"prefill-0","decode_worker":"decode-0",)"
            R"("prompt_token_ids":[1,500,600],"token_ids":[42,43,44],"text":"Once upon a",)"
            R"("finish_reason":"length","stop_reason":null,)"
            R"("usage":{"prompt_tokens":3,"completion_tokens":3,"cached_prompt_tokens":0},)"
            R"("placement":null,"timing":{"ttft_ms":5.0,"e2e_ms":10.25,)" +
                kNoServerTiming + R"(},"seed":7})");
}

TEST(GenerateResultTest, TtftIsTheFirstMessageWithATokenAndCountsFallBack) {
  // A metadata-only first message (local route), then tokens, no counts, and
  // a stream that ended without a finish reason.
  tandem::v1::GenerateResponse meta;
  meta.set_request_id("r1");
  meta.set_route("local");
  meta.set_decode_worker("decode-0");
  meta.add_prompt_token_ids(1);
  meta.add_prompt_token_ids(9);
  meta.set_seed(0);
  GenerateResult result;
  result.Add(meta, absl::Milliseconds(2));
  tandem::v1::GenerateResponse second = Message({{0, 5}, {1, 6}}, "ab");
  second.set_seed(99);          // only the first message's seed counts
  second.set_route("remote");   // metadata is fixed by the first message that has it
  result.Add(second, absl::Milliseconds(4));
  result.Finish(absl::Milliseconds(6));
  EXPECT_EQ(result.ToJsonLine(),
            R"({"request_id":"r1","route":"local","prefill_worker":"","decode_worker":"decode-0",)"
            R"("prompt_token_ids":[1,9],"token_ids":[5,6],"text":"ab","finish_reason":null,)"
            R"("stop_reason":null,)"
            R"("usage":{"prompt_tokens":2,"completion_tokens":2,"cached_prompt_tokens":0},)"
            R"("placement":null,"timing":{"ttft_ms":4.0,"e2e_ms":6.0,)" +
                kNoServerTiming + R"(},"seed":0})");
}

TEST(GenerateResultTest, ServerPlacementAndPhasesComeFromSampleZerosLastMessage) {
  tandem::v1::GenerateResponse meta;
  meta.set_request_id("r3");
  meta.set_route("remote");
  meta.add_prompt_token_ids(1);
  // n = 2: sample 1 ends first with other values; sample 0's are printed.
  tandem::v1::GenerateResponse s1_last = Message({{0, 8}}, "b");
  s1_last.set_sample_index(1);
  s1_last.set_finish_reason(tandem::v1::FINISH_LENGTH);
  s1_last.mutable_placement()->set_decision("local");
  s1_last.mutable_timing()->set_ttft_ms(99);
  tandem::v1::GenerateResponse s0_last = Message({{0, 7}}, "a");
  s0_last.set_finish_reason(tandem::v1::FINISH_LENGTH);
  tandem::v1::Placement* p = s0_last.mutable_placement();
  p->set_decision("remote");
  p->set_ttft_local_ms(120.5);
  p->set_ttft_remote_ms(80.25);
  tandem::v1::RequestTiming* t = s0_last.mutable_timing();
  t->set_ttft_ms(20);
  t->set_e2e_ms(50);
  t->set_router_queue_ms(2);
  t->set_placement_ms(3);
  t->set_prefill_queue_ms(4);
  t->set_prefill_ms(11);
  t->set_kv_transfer_ms(3.5);
  t->set_decode_admission_ms(1);
  t->set_first_decode_ms(2.25);
  GenerateResult result(/*n=*/2);
  result.Add(meta, absl::Milliseconds(1));
  result.Add(s1_last, absl::Milliseconds(22));
  result.Add(s0_last, absl::Milliseconds(23));
  result.Finish(absl::Milliseconds(60));
  const nlohmann::ordered_json j = result.ToJson();
  EXPECT_EQ(j["placement"].dump(),
            R"({"decision":"remote","ttft_local_ms":120.5,"ttft_remote_ms":80.25})");
  EXPECT_EQ(j["timing"].dump(),
            R"({"ttft_ms":22.0,"e2e_ms":60.0,"server_ttft_ms":20.0,"router_queue_ms":2.0,)"
            R"("placement_ms":3.0,"prefill_queue_ms":4.0,"prefill_ms":11.0,)"
            R"("kv_transfer_ms":3.5,"decode_admission_ms":1.0,"first_decode_ms":2.25})");
}

// One token with its logprob and top alternatives ({id, logprob} pairs).
tandem::v1::TokenOutput Token(uint32_t index, int32_t id, float logprob,
                              std::vector<std::pair<int32_t, float>> top) {
  tandem::v1::TokenOutput t;
  t.set_index(index);
  t.set_token_id(id);
  t.set_logprob(logprob);
  for (auto [alt, lp] : top) {
    tandem::v1::TopLogprob* a = t.add_top_logprobs();
    a->set_token_id(alt);
    a->set_logprob(lp);
  }
  return t;
}

tandem::v1::GenerateResponse SampleMessage(uint32_t sample, tandem::v1::TokenOutput token,
                                           const std::string& text) {
  tandem::v1::GenerateResponse r;
  r.set_sample_index(sample);
  token.set_sample_index(sample);
  *r.add_tokens() = std::move(token);
  r.set_text(text);
  return r;
}

TEST(GenerateResultTest, TwoSamplesWithStopReasonsAndTopLogprobs) {
  // Interleaved samples; sample 1 finishes last with the larger count, so
  // usage must take sample 0's count, not the last message's.
  tandem::v1::GenerateResponse meta;
  meta.set_request_id("r2");
  meta.set_route("local");
  meta.set_decode_worker("decode-0");
  meta.add_prompt_token_ids(1);
  meta.add_prompt_token_ids(9);
  meta.set_seed(3);
  tandem::v1::GenerateResponse s0_last =
      SampleMessage(0, Token(1, 13, -0.1f, {{13, -0.1f}, {11, -3.0f}}), "y");
  s0_last.set_finish_reason(tandem::v1::FINISH_STOP);
  s0_last.mutable_stop_reason()->set_text("!");
  s0_last.set_completion_tokens(2);
  s0_last.set_prompt_tokens(2);
  s0_last.set_cached_prompt_tokens(1);
  tandem::v1::GenerateResponse s1_last = SampleMessage(1, Token(2, 2, -0.5f, {}), "");
  s1_last.set_finish_reason(tandem::v1::FINISH_STOP);
  s1_last.mutable_stop_reason()->set_token_id(2);
  s1_last.set_completion_tokens(3);

  const std::vector<tandem::v1::GenerateResponse> stream = {
      meta,
      SampleMessage(0, Token(0, 11, -0.25f, {{11, -0.25f}, {12, -1.5f}}), "He"),
      SampleMessage(1, Token(0, 12, -1.5f, {{11, -0.25f}, {12, -1.5f}}), "Hi"),
      s0_last,
      SampleMessage(1, Token(1, 14, -2.0f, {{11, -0.25f}}), "!"),
      s1_last,
  };
  GenerateResult result(/*n=*/2, /*with_logprobs=*/true);
  for (size_t i = 0; i < stream.size(); ++i) {
    result.Add(stream[i], absl::Milliseconds(2 + 2 * static_cast<int64_t>(i)));
  }
  result.Finish(absl::Milliseconds(20));
  EXPECT_EQ(result.text(0), "Hey");
  EXPECT_EQ(result.text(1), "Hi!");
  EXPECT_EQ(result.text(2), "");
  EXPECT_EQ(result.finish_reason(1), tandem::v1::FINISH_STOP);
  EXPECT_EQ(result.finish_reason(2), tandem::v1::FINISH_NONE);
  const std::string lp0 =
      R"([{"token_id":11,"logprob":-0.25,"top_logprobs":[{"token_id":11,"logprob":-0.25},)"
      R"({"token_id":12,"logprob":-1.5}]},{"token_id":13,"logprob":-0.1,"top_logprobs":)"
      R"([{"token_id":13,"logprob":-0.1},{"token_id":11,"logprob":-3.0}]}])";
  const std::string lp1 =
      R"([{"token_id":12,"logprob":-1.5,"top_logprobs":[{"token_id":11,"logprob":-0.25},)"
      R"({"token_id":12,"logprob":-1.5}]},{"token_id":14,"logprob":-2.0,"top_logprobs":)"
      R"([{"token_id":11,"logprob":-0.25}]},{"token_id":2,"logprob":-0.5,"top_logprobs":[]}])";
  EXPECT_EQ(result.ToJsonLine(),
            R"({"request_id":"r2","route":"local","prefill_worker":"","decode_worker":"decode-0",)"
            R"("prompt_token_ids":[1,9],"token_ids":[11,13],"text":"Hey","finish_reason":"stop",)"
            R"("stop_reason":"!","logprobs":)" + lp0 +
            R"(,"usage":{"prompt_tokens":2,"completion_tokens":2,"cached_prompt_tokens":1},)"
            R"("placement":null,"timing":{"ttft_ms":4.0,"e2e_ms":20.0,)" + kNoServerTiming +
            R"(},"seed":3,"samples":[)"
            R"({"sample_index":0,"token_ids":[11,13],"text":"Hey","finish_reason":"stop",)"
            R"("stop_reason":"!","completion_tokens":2,"logprobs":)" + lp0 + "},"
            R"({"sample_index":1,"token_ids":[12,14,2],"text":"Hi!","finish_reason":"stop",)"
            R"("stop_reason":2,"completion_tokens":3,"logprobs":)" + lp1 + "}]}");

  // Without --logprobs no "logprobs"; every requested sample is listed, one
  // the stream never carried as empty.
  GenerateResult three(/*n=*/3);
  for (const tandem::v1::GenerateResponse& r : stream) three.Add(r, absl::Milliseconds(1));
  const nlohmann::ordered_json j = three.ToJson();
  EXPECT_FALSE(j.contains("logprobs"));
  ASSERT_EQ(j["samples"].size(), 3u);
  EXPECT_FALSE(j["samples"][1].contains("logprobs"));
  EXPECT_EQ(j["samples"][2].dump(),
            R"({"sample_index":2,"token_ids":[],"text":"","finish_reason":null,)"
            R"("stop_reason":null,"completion_tokens":0})");
  // n = 1 (the default): sample 0's fields only, no "samples".
  GenerateResult one;
  for (const tandem::v1::GenerateResponse& r : stream) one.Add(r, absl::Milliseconds(1));
  EXPECT_FALSE(one.ToJson().contains("samples"));
  EXPECT_EQ(one.ToJson()["text"], "Hey");
}

TEST(GenerateResultTest, NoTokensGivesNullTtftAndInvalidUtf8IsReplaced) {
  tandem::v1::GenerateResponse only = Message({}, "x\xff");
  only.set_finish_reason(tandem::v1::FINISH_CANCELLED);
  GenerateResult result;
  result.Add(only, absl::Milliseconds(1));
  const std::string line = result.ToJsonLine();
  EXPECT_THAT(line, HasSubstr("\"text\":\"x\xef\xbf\xbd\""));
  EXPECT_THAT(line, HasSubstr(R"("finish_reason":"cancelled")"));
  EXPECT_THAT(line, HasSubstr(R"("placement":null,"timing":{"ttft_ms":null,"e2e_ms":null,)" +
                              kNoServerTiming + R"(})"));
}

}  // namespace
}  // namespace tandem::cli
