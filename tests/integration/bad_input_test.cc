// Bad requests (the generation controls of issue #11 among them) are
// refused with INVALID_ARGUMENT naming the field, while a good stream is
// running, and neither that stream nor the next request is
// disturbed. A chat request to a model without a chat template is refused
// with FAILED_PRECONDITION.
#include <chrono>
#include <cmath>
#include <functional>
#include <limits>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "tests/integration/cluster_fixture.h"
#include "tests/integration/generate_client.h"

namespace tandem::testing {
namespace {

using ::testing::HasSubstr;

struct BadCase {
  std::string name;
  // Turns a valid greedy request into the bad one.
  std::function<void(v1::GenerateRequest&)> spoil;
  // Every string the error message must contain.
  std::vector<std::string> mentions;
};

std::vector<BadCase> BadCases() {
  const std::string long_prompt = Golden("long_repeated_313tok").prompt;  // 313 tokens
  return {
      {"EmptyPrompt", [](v1::GenerateRequest& r) { r.set_prompt(""); }, {"prompt"}},
      {"PromptPlusMaxTokensOverContext",
       [long_prompt](v1::GenerateRequest& r) {
         r.set_prompt(long_prompt);
         r.set_max_tokens(kContextLength - 313 + 1);  // 313 + 1736 = 2049 > 2048
       },
       {"313", "1736", "2048"}},
      {"MaxTokensZero", [](v1::GenerateRequest& r) { r.set_max_tokens(0); }, {"max_tokens"}},
      {"TemperatureNegative",
       [](v1::GenerateRequest& r) { r.mutable_sampling()->set_temperature(-1.0f); },
       {"temperature"}},
      {"TemperatureNaN",
       [](v1::GenerateRequest& r) {
         r.mutable_sampling()->set_temperature(std::numeric_limits<float>::quiet_NaN());
       },
       {"temperature"}},
      {"TopPZero", [](v1::GenerateRequest& r) { r.mutable_sampling()->set_top_p(0.0f); },
       {"top_p"}},
      {"TopPOverOne", [](v1::GenerateRequest& r) { r.mutable_sampling()->set_top_p(1.5f); },
       {"top_p"}},
      // proto3 keeps unknown enum numbers: the router must not pass them on.
      {"RouteOverrideUnknown",
       [](v1::GenerateRequest& r) { r.set_route_override(static_cast<v1::RouteOverride>(7)); },
       {"route_override", "7"}},
      // ---- Generation controls (issue #11) ----
      {"SeventeenStopStrings",
       [](v1::GenerateRequest& r) {
         for (int i = 0; i < 17; ++i) r.add_stop(absl::StrCat("s", i));
       },
       {"stop", "16", "17"}},
      {"EmptyStopString",
       [](v1::GenerateRequest& r) {
         r.add_stop("ok");
         r.add_stop("");
       },
       {"stop[1]", "0"}},
      {"StopString257Bytes", [](v1::GenerateRequest& r) { r.add_stop(std::string(257, 'a')); },
       {"stop[0]", "257"}},
      {"MinPNegative", [](v1::GenerateRequest& r) { r.mutable_sampling()->set_min_p(-0.1f); },
       {"min_p"}},
      {"MinPOverOne", [](v1::GenerateRequest& r) { r.mutable_sampling()->set_min_p(1.5f); },
       {"min_p", "1.5"}},
      {"MinPNaN",
       [](v1::GenerateRequest& r) {
         r.mutable_sampling()->set_min_p(std::numeric_limits<float>::quiet_NaN());
       },
       {"min_p"}},
      {"RepetitionPenaltyZero",
       [](v1::GenerateRequest& r) { r.mutable_sampling()->set_repetition_penalty(0.0f); },
       {"repetition_penalty"}},
      {"RepetitionPenaltyNegative",
       [](v1::GenerateRequest& r) { r.mutable_sampling()->set_repetition_penalty(-1.0f); },
       {"repetition_penalty", "-1"}},
      {"RepetitionPenaltyNaN",
       [](v1::GenerateRequest& r) {
         r.mutable_sampling()->set_repetition_penalty(std::numeric_limits<float>::quiet_NaN());
       },
       {"repetition_penalty"}},
      {"PresencePenaltyOverTwo",
       [](v1::GenerateRequest& r) { r.mutable_sampling()->set_presence_penalty(2.5f); },
       {"presence_penalty", "2.5"}},
      {"PresencePenaltyNaN",
       [](v1::GenerateRequest& r) {
         r.mutable_sampling()->set_presence_penalty(std::numeric_limits<float>::quiet_NaN());
       },
       {"presence_penalty"}},
      {"FrequencyPenaltyUnderMinusTwo",
       [](v1::GenerateRequest& r) { r.mutable_sampling()->set_frequency_penalty(-3.0f); },
       {"frequency_penalty", "-3"}},
      // stories260K has 512 tokens.
      {"LogitBiasIdIsVocabSize",
       [](v1::GenerateRequest& r) { (*r.mutable_sampling()->mutable_logit_bias())[512] = 1.0f; },
       {"logit_bias", "512"}},
      {"LogitBiasNaN",
       [](v1::GenerateRequest& r) {
         (*r.mutable_sampling()->mutable_logit_bias())[5] =
             std::numeric_limits<float>::quiet_NaN();
       },
       {"logit_bias[5]"}},
      {"LogitBiasInfinite",
       [](v1::GenerateRequest& r) {
         (*r.mutable_sampling()->mutable_logit_bias())[5] = -std::numeric_limits<float>::infinity();
       },
       {"logit_bias[5]"}},
      {"Logprobs21", [](v1::GenerateRequest& r) { r.set_logprobs(21); }, {"logprobs", "21"}},
      {"NZero", [](v1::GenerateRequest& r) { r.set_n(0); }, {"n: ", "got 0"}},
      {"NSeventeen", [](v1::GenerateRequest& r) { r.set_n(17); }, {"n: ", "17"}},
      {"MinTokensOverMaxTokens", [](v1::GenerateRequest& r) { r.set_min_tokens(33); },
       {"min_tokens", "33"}},
      {"StopTokenIdOutsideVocab", [](v1::GenerateRequest& r) { r.add_stop_token_ids(512); },
       {"stop_token_ids[0]", "512"}},
      {"StopTokenIdNegative",
       [](v1::GenerateRequest& r) {
         r.add_stop_token_ids(13);
         r.add_stop_token_ids(-1);
       },
       {"stop_token_ids[1]", "-1"}},
  };
}

class BadInputTest : public DefaultClusterSuite,
                     public ::testing::WithParamInterface<size_t> {};

TEST_P(BadInputTest, RefusedWhileAGoodStreamRuns) {
  const BadCase bad = BadCases()[GetParam()];
  // Alternate the good stream's route between cases.
  const bool remote = GetParam() % 2 == 0;
  const GoldenCase& good = Golden(remote ? "boundary_33tok" : "lily_and_ben");
  // The route is forced: with the suite's shared cluster the prefix cache
  // may already hold the prompt, and AUTO would then prefill it locally.
  // Long (hundreds of milliseconds of decoding), so that it is still
  // decoding when the bad request is answered.
  constexpr uint32_t kGoodMaxTokens = 512;
  GenerateStream stream(cluster().stub(),
                        MakeRequest(good.prompt, kGoodMaxTokens,
                                    remote ? v1::ROUTE_REMOTE : v1::ROUTE_LOCAL));
  // The good stream is under way once its first token is here.
  ASSERT_TRUE(stream.ReadUntilFirstToken()) << stream.Finish().status.error_message();

  v1::GenerateRequest request = MakeRequest("Once upon a time", kGoldenMaxTokens);
  bad.spoil(request);
  StreamResult refused = RunGenerate(cluster().stub(), request, absl::Seconds(10));
  EXPECT_EQ(refused.status.error_code(), grpc::StatusCode::INVALID_ARGUMENT)
      << refused.status.error_message();
  for (const std::string& word : bad.mentions) {
    EXPECT_THAT(refused.status.error_message(), HasSubstr(word));
  }
  EXPECT_TRUE(refused.token_ids.empty());
  absl::StatusOr<v1::WorkerStatus> decode = cluster().DecodeStatus();
  ASSERT_TRUE(decode.ok()) << decode.status();
  EXPECT_EQ(decode->running_requests(), 1u) << "the good stream was not running beside";

  ExpectGolden(stream.Finish(), good, remote ? "remote" : "local", kGoodMaxTokens);
  // And the cluster serves the next request.
  const GoldenCase& next = Golden("the_little_dog");
  ExpectGolden(RunGenerate(cluster().stub(), MakeRequest(next.prompt, kGoldenMaxTokens)), next,
               "local");
}

INSTANTIATE_TEST_SUITE_P(Cases, BadInputTest, ::testing::Range<size_t>(0, BadCases().size()),
                         [](const ::testing::TestParamInfo<size_t>& info) {
                           return BadCases()[info.param].name;
                         });

// stories260K.gguf has no tokenizer.chat_template: a chat request is
// refused with FAILED_PRECONDITION naming that, GetModelInfo reports no chat
// format, and a prompt request is served as before.
class ChatWithoutTemplateTest : public DefaultClusterSuite {};

TEST_F(ChatWithoutTemplateTest, MessagesAreRefusedWithFailedPrecondition) {
  v1::GenerateRequest chat = MakeRequest("", kGoldenMaxTokens);
  v1::ChatMessage* message = chat.add_messages();
  message->set_role("user");
  message->set_content("Once upon a time");
  StreamResult refused = RunGenerate(cluster().stub(), chat, absl::Seconds(10));
  EXPECT_EQ(refused.status.error_code(), grpc::StatusCode::FAILED_PRECONDITION)
      << refused.status.error_message();
  EXPECT_THAT(refused.status.error_message(), HasSubstr("chat template"));
  EXPECT_TRUE(refused.token_ids.empty());

  grpc::ClientContext context;
  context.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(10));
  v1::GetModelInfoResponse info;
  ASSERT_TRUE(cluster().stub().GetModelInfo(&context, v1::GetModelInfoRequest(), &info).ok());
  EXPECT_EQ(info.chat_format(), "");
  // tokenizer.ggml.eos_token_id = 2 is the vocabulary's only end-of-generation token.
  EXPECT_THAT(info.eog_token_ids(), ::testing::ElementsAre(2));

  const GoldenCase& next = Golden("the_little_dog");
  ExpectGolden(RunGenerate(cluster().stub(), MakeRequest(next.prompt, kGoldenMaxTokens)), next,
               "local");
}

}  // namespace
}  // namespace tandem::testing
