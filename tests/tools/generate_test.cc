// Tests for tools/generate: flag parsing, the request built from it, and the
// --json summary folded from a GenerateResponse stream.
#include "tools/generate.h"

#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace tandem::cli {
namespace {

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
  // 0 is passed on for the router to reject (INVALID_ARGUMENT, exit 1).
  EXPECT_EQ(BuildGenerateRequest(*ParseGenerateArgs({"--max-tokens", "0", "p"})).max_tokens(), 0u);
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
      {{"--max-tokens", "-1", "p"}, "--max-tokens: must be in 0..4294967295, got -1"},
      {{"--max-tokens", "4294967296", "p"}, "--max-tokens: must be in 0..4294967295, got 4294967296"},
      {{"--seed", "-1", "p"}, "--seed: expected an unsigned integer, got '-1'"},
      {{"--temperature", "warm", "p"}, "--temperature: expected a finite number, got 'warm'"},
      {{"--top-k", "9999999999", "p"}, "--top-k: out of range, got 9999999999"},
      {{"--timeout-ms", "-5", "p"}, "--timeout-ms: must be >= 0, got -5"},
      {{"--stream", "p"}, "unknown flag --stream"},
  };
  for (const Case& c : cases) {
    absl::StatusOr<GenerateOptions> o = ParseGenerateArgs(c.args);
    ASSERT_FALSE(o.ok()) << c.message;
    EXPECT_EQ(o.status().code(), absl::StatusCode::kInvalidArgument);
    EXPECT_THAT(o.status().message(), HasSubstr(c.message));
  }
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
            R"("finish_reason":"length","usage":{"prompt_tokens":3,"completion_tokens":3,"cached_prompt_tokens":0},)"
            R"("timing":{"ttft_ms":5.0,"e2e_ms":10.25},"seed":7})");
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
            R"("usage":{"prompt_tokens":2,"completion_tokens":2,"cached_prompt_tokens":0},)"
            R"("timing":{"ttft_ms":4.0,"e2e_ms":6.0},"seed":0})");
}

TEST(GenerateResultTest, NoTokensGivesNullTtftAndInvalidUtf8IsReplaced) {
  tandem::v1::GenerateResponse only = Message({}, "x\xff");
  only.set_finish_reason(tandem::v1::FINISH_CANCELLED);
  GenerateResult result;
  result.Add(only, absl::Milliseconds(1));
  const std::string line = result.ToJsonLine();
  EXPECT_THAT(line, HasSubstr("\"text\":\"x\xef\xbf\xbd\""));
  EXPECT_THAT(line, HasSubstr(R"("finish_reason":"cancelled")"));
  EXPECT_THAT(line, HasSubstr(R"("timing":{"ttft_ms":null,"e2e_ms":null})"));
}

}  // namespace
}  // namespace tandem::cli
