// The OpenAI JSON protocol alone: request bodies -> GenerateRequest, gRPC
// errors -> OpenAI errors, GenerateResponse messages -> response bodies and
// SSE chunks (parsed back with nlohmann and checked field by field).
#include "router/openai/openai_protocol.h"

#include <grpcpp/support/status_code_enum.h>

#include <map>
#include <string>
#include <variant>

#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "nlohmann/json.hpp"

namespace tandem::router::openai {
namespace {

using ::nlohmann::json;
using ::testing::HasSubstr;

const ModelLimits kLimits{"stories260K", 512, 512};

ParsedRequest ParseOk(Endpoint endpoint, const std::string& body) {
  auto result = ParseRequest(endpoint, body, kLimits);
  if (const ApiError* e = std::get_if<ApiError>(&result)) {
    ADD_FAILURE() << "refused " << body << ": " << e->message;
    return {};
  }
  return std::get<ParsedRequest>(std::move(result));
}

ApiError ParseError(Endpoint endpoint, const std::string& body) {
  auto result = ParseRequest(endpoint, body, kLimits);
  if (!std::holds_alternative<ApiError>(result)) {
    ADD_FAILURE() << "accepted " << body;
    return {};
  }
  return std::get<ApiError>(result);
}

ParsedRequest Completions(const std::string& fields) {
  return ParseOk(Endpoint::kCompletions,
                 R"({"model":"stories260K","prompt":"Once")" + fields + "}");
}
ParsedRequest Chat(const std::string& fields) {
  return ParseOk(Endpoint::kChatCompletions,
                 R"({"model":"stories260K","messages":[{"role":"user","content":"Hi"}])" +
                     fields + "}");
}

TEST(OpenAiParseTest, CompletionsDefaults) {
  const ParsedRequest p = Completions("");
  EXPECT_EQ(p.endpoint, Endpoint::kCompletions);
  EXPECT_EQ(p.request.prompt(), "Once");
  EXPECT_EQ(p.request.prompt_token_ids_size(), 0);
  EXPECT_EQ(p.request.messages_size(), 0);
  EXPECT_EQ(p.request.max_tokens(), 16u);
  EXPECT_EQ(p.request.sampling().temperature(), 1.0f);
  EXPECT_FALSE(p.request.sampling().has_top_p());
  EXPECT_EQ(p.request.sampling().top_k(), 0);
  EXPECT_FALSE(p.request.sampling().has_seed());
  EXPECT_FALSE(p.request.sampling().has_repetition_penalty());
  EXPECT_FALSE(p.request.has_n());
  EXPECT_EQ(p.request.logprobs(), 0u);
  EXPECT_EQ(p.request.route_override(), v1::ROUTE_AUTO);
  EXPECT_FALSE(p.stream);
  EXPECT_FALSE(p.include_usage);
  EXPECT_FALSE(p.logprobs);
  // null reads as "not given".
  const ParsedRequest nulls = Completions(R"(,"max_tokens":null,"temperature":null,"logprobs":null,
      "stop":null,"seed":null,"suffix":null,"echo":false,"best_of":null,"user":"u1")");
  EXPECT_EQ(nulls.request.max_tokens(), 16u);
  EXPECT_EQ(nulls.request.sampling().temperature(), 1.0f);
  EXPECT_FALSE(nulls.logprobs);
  EXPECT_EQ(nulls.request.stop_size(), 0);
}

TEST(OpenAiParseTest, CompletionsEveryField) {
  const ParsedRequest p = Completions(R"(,"max_tokens":7,"temperature":0,"top_p":0.5,"n":3,
      "stream":true,"stream_options":{"include_usage":true},"logprobs":2,"stop":["a","bc"],
      "presence_penalty":-1.5,"frequency_penalty":2,"best_of":3,"logit_bias":{"5":-100,"7":2.5},
      "seed":42,"top_k":40,"min_p":0.1,"repetition_penalty":1.2,"stop_token_ids":[3,4],
      "ignore_eos":true,"min_tokens":2,"include_stop_str_in_output":true,
      "skip_special_tokens":true,"route":"remote","echo":false,"suffix":"")");
  const v1::GenerateRequest& r = p.request;
  EXPECT_EQ(r.max_tokens(), 7u);
  EXPECT_EQ(r.sampling().temperature(), 0.0f);
  ASSERT_TRUE(r.sampling().has_top_p());
  EXPECT_EQ(r.sampling().top_p(), 0.5f);
  ASSERT_TRUE(r.has_n());
  EXPECT_EQ(r.n(), 3u);
  EXPECT_TRUE(p.stream);
  EXPECT_TRUE(p.include_usage);
  EXPECT_TRUE(p.logprobs);
  EXPECT_EQ(r.logprobs(), 2u);
  EXPECT_THAT(r.stop(), ::testing::ElementsAre("a", "bc"));
  EXPECT_EQ(r.sampling().presence_penalty(), -1.5f);
  EXPECT_EQ(r.sampling().frequency_penalty(), 2.0f);
  ASSERT_EQ(r.sampling().logit_bias_size(), 2);
  EXPECT_EQ(r.sampling().logit_bias().at(5), -100.0f);
  EXPECT_EQ(r.sampling().logit_bias().at(7), 2.5f);
  EXPECT_TRUE(r.sampling().has_seed());
  EXPECT_EQ(r.sampling().seed(), 42u);
  EXPECT_EQ(r.sampling().top_k(), 40);
  EXPECT_EQ(r.sampling().min_p(), 0.1f);
  ASSERT_TRUE(r.sampling().has_repetition_penalty());
  EXPECT_EQ(r.sampling().repetition_penalty(), 1.2f);
  EXPECT_THAT(r.stop_token_ids(), ::testing::ElementsAre(3, 4));
  EXPECT_TRUE(r.ignore_eos());
  EXPECT_EQ(r.min_tokens(), 2u);
  EXPECT_TRUE(r.include_stop_str_in_output());
  EXPECT_EQ(r.route_override(), v1::ROUTE_REMOTE);
}

TEST(OpenAiParseTest, SmallValueMappings) {
  EXPECT_EQ(Completions(R"(,"stop":"\n")").request.stop(0), "\n");
  EXPECT_EQ(Completions(R"(,"top_k":-1)").request.sampling().top_k(), 0);
  EXPECT_EQ(Completions(R"(,"route":"local")").request.route_override(), v1::ROUTE_LOCAL);
  EXPECT_EQ(Completions(R"(,"route":"auto")").request.route_override(), v1::ROUTE_AUTO);
  EXPECT_EQ(Completions(R"(,"max_tokens":16.0)").request.max_tokens(), 16u);
  // logprobs 0: the sampled token's logprob only.
  const ParsedRequest zero = Completions(R"(,"logprobs":0)");
  EXPECT_TRUE(zero.logprobs);
  EXPECT_EQ(zero.request.logprobs(), 0u);
  // A negative seed is its two's complement.
  const ParsedRequest neg = Completions(R"(,"seed":-1)");
  EXPECT_TRUE(neg.request.sampling().has_seed());
  EXPECT_EQ(neg.request.sampling().seed(), 0xFFFFFFFFFFFFFFFFull);
  EXPECT_EQ(Completions(R"(,"seed":9223372036854775807)").request.sampling().seed(),
            9223372036854775807ull);
}

TEST(OpenAiParseTest, PromptForms) {
  const ParsedRequest ids = ParseOk(Endpoint::kCompletions,
                                    R"({"model":"stories260K","prompt":[1, 400, 2]})");
  EXPECT_EQ(ids.request.prompt(), "");
  EXPECT_THAT(ids.request.prompt_token_ids(), ::testing::ElementsAre(1, 400, 2));
  const ParsedRequest one_ids = ParseOk(Endpoint::kCompletions,
                                        R"({"model":"stories260K","prompt":[[5, 6]]})");
  EXPECT_THAT(one_ids.request.prompt_token_ids(), ::testing::ElementsAre(5, 6));
  const ParsedRequest one_text = ParseOk(Endpoint::kCompletions,
                                         R"({"model":"stories260K","prompt":["Hi there"]})");
  EXPECT_EQ(one_text.request.prompt(), "Hi there");
}

// OpenAI's stored completions: Tandem stores nothing, so store: false (as
// frameworks send it) and null are accepted; store: true and metadata are
// refused by name.
TEST(OpenAiParseTest, StoreFalseIsAcceptedStoreTrueIsNot) {
  const std::string head = R"({"model":"stories260K","messages":[{"role":"user","content":"Hi"}],)";
  ParseOk(Endpoint::kChatCompletions, head + R"("store":false})");
  ParseOk(Endpoint::kChatCompletions, head + R"("store":null,"metadata":null})");
  ApiError e = ParseError(Endpoint::kChatCompletions, head + R"("store":true})");
  EXPECT_EQ(e.http_status, 400);
  EXPECT_EQ(e.param, "store");
  e = ParseError(Endpoint::kChatCompletions, head + R"("metadata":{"a":"b"}})");
  EXPECT_EQ(e.param, "metadata");
  e = ParseError(Endpoint::kChatCompletions, head + R"("store":"no"})");
  EXPECT_EQ(e.param, "store");
}

TEST(OpenAiParseTest, ChatDefaultsAndMessages) {
  const ParsedRequest p = ParseOk(Endpoint::kChatCompletions, R"({"model":"stories260K",
      "messages":[{"role":"system","content":"Be brief."},
                  {"role":"developer","content":[{"type":"text","text":"A"},
                                                  {"type":"text","text":"B"}]},
                  {"role":"user","content":"Hi","name":null},
                  {"role":"assistant","content":null,"tool_calls":null},
                  {"role":"user","content":""}]})");
  EXPECT_EQ(p.endpoint, Endpoint::kChatCompletions);
  EXPECT_EQ(p.request.max_tokens(), 0u);  // the caller fills in context - prompt
  EXPECT_EQ(p.request.sampling().temperature(), 1.0f);
  EXPECT_EQ(p.request.prompt(), "");
  ASSERT_EQ(p.request.messages_size(), 5);
  EXPECT_EQ(p.request.messages(0).role(), "system");
  EXPECT_EQ(p.request.messages(0).content(), "Be brief.");
  EXPECT_EQ(p.request.messages(1).role(), "developer");
  EXPECT_EQ(p.request.messages(1).content(), "AB");
  EXPECT_EQ(p.request.messages(2).content(), "Hi");
  EXPECT_EQ(p.request.messages(3).role(), "assistant");
  EXPECT_EQ(p.request.messages(3).content(), "");
  EXPECT_EQ(p.request.messages(4).content(), "");
  EXPECT_FALSE(p.logprobs);

  EXPECT_EQ(Chat(R"(,"max_tokens":9)").request.max_tokens(), 9u);
  EXPECT_EQ(Chat(R"(,"max_tokens":9,"max_completion_tokens":5)").request.max_tokens(), 5u);
  const ParsedRequest lp = Chat(R"(,"logprobs":true,"top_logprobs":3)");
  EXPECT_TRUE(lp.logprobs);
  EXPECT_EQ(lp.request.logprobs(), 3u);
  const ParsedRequest lp0 = Chat(R"(,"logprobs":true)");
  EXPECT_TRUE(lp0.logprobs);
  EXPECT_EQ(lp0.request.logprobs(), 0u);
  EXPECT_FALSE(Chat(R"(,"logprobs":false)").logprobs);
  EXPECT_FALSE(Chat(R"(,"response_format":{"type":"text"})").stream);
}

struct BadCase {
  Endpoint endpoint;
  std::string body;
  int status;
  std::string param;  // "" = null
  std::string message_part;
  std::string code = "";
};

TEST(OpenAiParseTest, BadInputNamesTheField) {
  const Endpoint kC = Endpoint::kCompletions;
  const Endpoint kChat = Endpoint::kChatCompletions;
  const std::string c = R"({"model":"stories260K","prompt":"x",)";
  const std::string m = R"({"model":"stories260K","messages":[{"role":"user","content":"x"}],)";
  const std::vector<BadCase> cases = {
      // JSON itself.
      {kC, R"({"model":"stories260K",)", 400, "", "could not parse the JSON body"},
      {kC, R"({"model":"stories260K","prompt":"x","temperature":NaN})", 400, "",
       "could not parse the JSON body"},
      {kC, "{\"model\":\"stories260K\",\"prompt\":\"\xff\"}", 400, "",
       "could not parse the JSON body"},
      {kC, "[1,2]", 400, "", "must be a JSON object, got an array"},
      {kC, "", 400, "", "could not parse the JSON body"},
      // Model.
      {kC, R"({"model":"gpt-4","prompt":"x"})", 404, "model", "\"gpt-4\" does not exist",
       "model_not_found"},
      {kC, R"({"prompt":"x"})", 400, "model", "model: required"},
      {kC, R"({"model":7,"prompt":"x"})", 400, "model", "model: expected a string, got an integer"},
      // Types and ranges.
      {kC, c + R"("temperature":"hot"})", 400, "temperature",
       "temperature: expected a number, got a string"},
      {kC, c + R"("temperature":2.5})", 400, "temperature", "temperature: must be in [0, 2]"},
      {kC, c + R"("temperature":1e400})", 400, "", "could not parse the JSON body"},
      {kC, c + R"("max_tokens":1e30})", 400, "max_tokens", "max_tokens: must be an integer in"},
      {kC, c + R"("max_tokens":99999999999999999999})", 400, "max_tokens",
       "max_tokens: must be an integer in"},
      {kC, c + R"("max_tokens":0})", 400, "max_tokens", "max_tokens: must be an integer in [1, "},
      {kC, c + R"("max_tokens":1.5})", 400, "max_tokens",
       "max_tokens: expected an integer, got a number"},
      {kC, c + R"("top_p":0})", 400, "top_p", "top_p: must be in (0, 1]"},
      {kC, c + R"("n":17})", 400, "n", "n: must be an integer in [1, 16], got 17"},
      {kC, c + R"("presence_penalty":-2.5})", 400, "presence_penalty", "must be in [-2, 2]"},
      {kC, c + R"("stream":"yes"})", 400, "stream", "stream: expected a boolean, got a string"},
      {kC, c + R"("logprobs":21})", 400, "logprobs",
       "logprobs: must be an integer in [0, 20], got 21"},
      {kC, c + R"("logprobs":true})", 400, "logprobs", "expected an integer, got a boolean"},
      {kC, c + R"("stop":["a",3]})", 400, "stop[1]", "stop[1]: expected a string, got an integer"},
      {kC, c + R"("stop":5})", 400, "stop", "expected a string or an array of strings"},
      {kC, c + R"("logit_bias":{"5":101}})", 400, "logit_bias.5", "must be in [-100, 100]"},
      {kC, c + R"("logit_bias":{"512":1}})", 400, "logit_bias.512", "not a token id in [0, 512)"},
      {kC, c + R"("logit_bias":{"-1":1}})", 400, "logit_bias.-1", "not a token id"},
      {kC, c + R"("logit_bias":{"a":1}})", 400, "logit_bias.a", "not a token id"},
      {kC, c + R"("seed":"1"})", 400, "seed", "seed: expected an integer"},
      {kC, c + R"("seed":18446744073709551615})", 400, "seed", "seed: must be an integer in"},
      {kC, c + R"("top_k":-2})", 400, "top_k", "top_k: must be an integer in [-1, "},
      {kC, c + R"("min_p":1.5})", 400, "min_p", "min_p: must be in [0, 1]"},
      {kC, c + R"("repetition_penalty":0})", 400, "repetition_penalty", "must be in [0.01"},
      {kC, c + R"("stop_token_ids":[1,512]})", 400, "stop_token_ids[1]",
       "stop_token_ids[1]: must be an integer in [0, 511], got 512"},
      {kC, c + R"("min_tokens":-1})", 400, "min_tokens", "min_tokens: must be an integer in [0, "},
      {kC, c + R"("route":"fast"})", 400, "route",
       "route: must be \"auto\", \"local\" or \"remote\", got \"fast\""},
      {kC, c + R"("user":5})", 400, "user", "user: expected a string"},
      // A long value is quoted cut between characters (59 ASCII bytes, then é).
      {kC, c + R"("route":")" + std::string(59, 'a') + "\xC3\xA9\xC3\xA9\"}", 400, "route",
       "got \"" + std::string(59, 'a') + "..."},
      {kC, c + R"("skip_special_tokens":false})", 400, "skip_special_tokens", "not supported"},
      // Stream options.
      {kC, c + R"("stream_options":{"include_usage":true}})", 400, "stream_options",
       "only allowed with \"stream\": true"},
      {kC, c + R"("stream":true,"stream_options":{"continuous_usage_stats":true}})", 400,
       "stream_options.continuous_usage_stats", "Unrecognized request argument supplied"},
      // Unknown and unimplemented fields.
      {kC, c + R"("frobnicate":1})", 400, "frobnicate",
       "Unrecognized request argument supplied: frobnicate"},
      {kC, c + R"("messages":[]})", 400, "messages", "Unrecognized request argument supplied"},
      {kChat, m + R"("prompt":"x"})", 400, "prompt", "Unrecognized request argument supplied"},
      {kChat, m + R"("echo":true})", 400, "echo", "Unrecognized request argument supplied"},
      {kC, c + R"("echo":true})", 400, "echo", "echo: true is not supported"},
      {kC, c + R"("suffix":"end"})", 400, "suffix", "suffix: not supported"},
      {kC, c + R"("best_of":2})", 400, "best_of", "only best_of == n (1) is supported, got 2"},
      // Prompts.
      {kC, R"({"model":"stories260K","prompt":["a","b"]})", 400, "prompt",
       "batch prompts are not supported"},
      {kC, R"({"model":"stories260K","prompt":[[1],[2]]})", 400, "prompt",
       "batch prompts are not supported"},
      {kC, R"({"model":"stories260K","prompt":""})", 400, "prompt", "prompt: must not be empty"},
      {kC, R"({"model":"stories260K","prompt":[]})", 400, "prompt", "prompt: must not be empty"},
      {kC, R"({"model":"stories260K"})", 400, "prompt", "prompt: required"},
      {kC, R"({"model":"stories260K","prompt":[1,512]})", 400, "prompt[1]",
       "prompt[1]: must be an integer in [0, 511], got 512"},
      {kC, R"({"model":"stories260K","prompt":[1,"a"]})", 400, "prompt[1]",
       "expected an integer"},
      {kC, R"({"model":"stories260K","prompt":[[1,512]]})", 400, "prompt[0][1]",
       "prompt[0][1]: must be an integer in [0, 511], got 512"},
      {kC, R"({"model":"stories260K","prompt":[""]})", 400, "prompt[0]",
       "prompt[0]: must not be empty"},
      {kC, R"({"model":"stories260K","prompt":[[]]})", 400, "prompt[0]",
       "prompt[0]: must not be empty"},
      {kC, R"({"model":"stories260K","prompt":{}})", 400, "prompt",
       "expected a string or an array of token ids, got an object"},
      // Chat.
      {kChat, R"({"model":"stories260K","messages":[]})", 400, "messages",
       "messages: must not be empty"},
      {kChat, R"({"model":"stories260K"})", 400, "messages", "messages: required"},
      {kChat, R"({"model":"stories260K","messages":"hi"})", 400, "messages",
       "expected an array"},
      {kChat, R"({"model":"stories260K","messages":[{"role":"tool","content":"x"}]})", 400,
       "messages[0].role", "must be system, developer, user or assistant, got \"tool\""},
      {kChat, R"({"model":"stories260K","messages":[{"content":"x"}]})", 400, "messages[0].role",
       "messages[0].role: required"},
      {kChat, R"({"model":"stories260K","messages":[{"role":"user"}]})", 400,
       "messages[0].content", "messages[0].content: required"},
      {kChat, R"({"model":"stories260K","messages":[{"role":"user","content":"a","name":"bob"}]})",
       400, "messages[0].name", "not supported"},
      {kChat,
       R"({"model":"stories260K","messages":[{"role":"user","content":"a"},)"
       R"({"role":"user","content":[{"type":"text","text":"a"},)"
       R"({"type":"image_url","image_url":{"url":"x"}}]}]})",
       400, "messages[1].content[1].type", "only \"text\" parts are supported, got \"image_url\""},
      {kChat,
       R"({"model":"stories260K","messages":[{"role":"user","content":[{"type":"image_url"}]}]})",
       400, "messages[0].content[0].type", "only \"text\" parts are supported"},
      {kChat, m + R"("top_logprobs":2})", 400, "top_logprobs", "requires \"logprobs\": true"},
      {kChat, m + R"("logprobs":false,"top_logprobs":2})", 400, "top_logprobs",
       "requires \"logprobs\": true"},
      {kChat, m + R"("logprobs":true,"top_logprobs":21})", 400, "top_logprobs",
       "must be an integer in [0, 20]"},
      {kChat, m + R"("logprobs":1})", 400, "logprobs", "expected a boolean"},
      {kChat, m + R"("response_format":{"type":"json_object"}})", 400, "response_format",
       "only {\"type\": \"text\"} is supported, got type \"json_object\""},
      {kChat, m + R"("response_format":{"type":"json_schema","json_schema":{}}})", 400,
       "response_format", "got type \"json_schema\""},
      {kChat, m + R"("response_format":{"type":"text","strict":true}})", 400, "response_format",
       "only {\"type\": \"text\"} is supported"},
      {kChat, m + R"("response_format":"text"})", 400, "response_format", "got \"text\""},
      {kChat, m + R"("tools":[{"type":"function","function":{"name":"f"}}]})", 400, "tools",
       "tools: tool and function calling is not supported"},
      {kChat, m + R"("tool_choice":"none"})", 400, "tool_choice", "not supported"},
      {kChat, m + R"("functions":[]})", 400, "functions", "not supported"},
      {kChat, m + R"("function_call":"auto"})", 400, "function_call", "not supported"},
      {kChat, m + R"("parallel_tool_calls":false})", 400, "parallel_tool_calls", "not supported"},
      {kChat, m + R"("max_completion_tokens":0})", 400, "max_completion_tokens",
       "must be an integer in [1, "},
  };
  for (const BadCase& bad : cases) {
    SCOPED_TRACE(bad.body);
    const ApiError e = ParseError(bad.endpoint, bad.body);
    EXPECT_EQ(e.http_status, bad.status);
    EXPECT_EQ(e.param, bad.param);
    EXPECT_THAT(e.message, HasSubstr(bad.message_part));
    EXPECT_EQ(e.type, "invalid_request_error");
    EXPECT_EQ(e.code, bad.code);
    // The body is valid JSON in OpenAI's shape.
    const json body = json::parse(ErrorBody(e));
    EXPECT_EQ(body["error"]["message"], e.message);
    if (bad.param.empty()) {
      EXPECT_TRUE(body["error"]["param"].is_null());
    } else {
      EXPECT_EQ(body["error"]["param"], bad.param);
    }
  }
}

TEST(OpenAiParseTest, DeepNestingIsRefusedWithoutRecursion) {
  const std::string deep = std::string(200000, '[') + std::string(200000, ']');
  const ApiError format = ParseError(
      Endpoint::kChatCompletions,
      R"({"model":"stories260K","messages":[{"role":"user","content":"x"}],"response_format":)" +
          deep + "}");
  EXPECT_EQ(format.param, "response_format");
  EXPECT_THAT(format.message, HasSubstr("got an array"));
  const ApiError prompt =
      ParseError(Endpoint::kCompletions, R"({"model":"stories260K","prompt":)" + deep + "}");
  EXPECT_EQ(prompt.param, "prompt[0][0]");
  EXPECT_EQ(prompt.message, "prompt[0][0]: expected an integer, got an array");
  const ApiError model = ParseError(Endpoint::kCompletions, R"({"model":)" + deep + "}");
  EXPECT_EQ(model.message, "model: expected a string, got an array");
}

TEST(OpenAiErrorTest, ErrorBodyShape) {
  ApiError e;
  e.http_status = 404;
  e.message = "The model \"x\" does not exist";
  e.param = "model";
  e.code = "model_not_found";
  EXPECT_EQ(ErrorBody(e),
            R"({"error":{"message":"The model \"x\" does not exist",)"
            R"("type":"invalid_request_error",)"
            R"("param":"model","code":"model_not_found"}})");
  ApiError plain;
  plain.message = "bad \xff byte";  // never throws: invalid UTF-8 is replaced
  EXPECT_EQ(ErrorBody(plain),
            "{\"error\":{\"message\":\"bad \xEF\xBF\xBD byte\",\"type\":\"invalid_request_error\","
            "\"param\":null,\"code\":null}}");
}

TEST(OpenAiErrorTest, FromRpcErrorOnRouterTexts) {
  struct Case {
    grpc::StatusCode code;
    std::string message;
    int status;
    std::string type;
    std::string param;
    std::string code_name;
  };
  const std::vector<Case> cases = {
      // engine/core/request_validation.cc
      {grpc::StatusCode::INVALID_ARGUMENT,
       "prompt (500 tokens) + max_tokens (16) = 516 exceeds the model's context length (512 "
       "tokens)",
       400, "invalid_request_error", "", "context_length_exceeded"},
      {grpc::StatusCode::INVALID_ARGUMENT, "max_tokens: must be >= 1, got 0", 400,
       "invalid_request_error", "max_tokens", ""},
      {grpc::StatusCode::INVALID_ARGUMENT,
       "prompt_token_ids[4]: 600 is not in [0, 512)", 400, "invalid_request_error", "prompt[4]",
       ""},
      {grpc::StatusCode::INVALID_ARGUMENT, "min_tokens: must be in [0, max_tokens = 4], got 9",
       400, "invalid_request_error", "min_tokens", ""},
      // engine/sampling/sampling_options.cc (and a sampling.-prefixed name)
      {grpc::StatusCode::INVALID_ARGUMENT,
       "temperature: must be 0 (greedy) or in [1e-05, inf), got 1e-06",
       400, "invalid_request_error", "temperature", ""},
      {grpc::StatusCode::INVALID_ARGUMENT, "sampling.temperature: must be >= 0", 400,
       "invalid_request_error", "temperature", ""},
      {grpc::StatusCode::INVALID_ARGUMENT,
       "repetition_penalty: must be in [0.01, 100], got 200", 400, "invalid_request_error",
       "repetition_penalty", ""},
      // router/stop_strings.cc
      {grpc::StatusCode::INVALID_ARGUMENT, "stop: at most 16 strings, got 1000", 400,
       "invalid_request_error", "stop", ""},
      {grpc::StatusCode::INVALID_ARGUMENT, "stop[3]: must be 1 to 256 bytes, got 0", 400,
       "invalid_request_error", "stop[3]", ""},
      // common/server/proto_convert.h, router/chat_template.cc
      {grpc::StatusCode::INVALID_ARGUMENT, "route_override: unknown value 7 (expected 0, 1 or 2)",
       400, "invalid_request_error", "route", ""},
      {grpc::StatusCode::INVALID_ARGUMENT,
       "messages[0].role: must be system, developer, user or assistant, got 'tool'", 400,
       "invalid_request_error", "messages[0].role", ""},
      {grpc::StatusCode::FAILED_PRECONDITION,
       "messages: the model has no chat template (tokenizer.chat_template); set x", 400,
       "invalid_request_error", "messages", ""},
      {grpc::StatusCode::INVALID_ARGUMENT,
       "prompt, prompt_token_ids, messages: set exactly one of them, got prompt messages", 400,
       "invalid_request_error", "", ""},
      // router/admission.cc, router/api_keys.cc
      // RESOURCE_EXHAUSTED without a retry-after hint: never servable.
      {grpc::StatusCode::RESOURCE_EXHAUSTED,
       "API key 'alice': the prompt's 300 tokens exceed its tokens_per_minute of 120; this "
       "request can never be admitted",
       400, "invalid_request_error", "", ""},
      {grpc::StatusCode::RESOURCE_EXHAUSTED,
       "request needs up to 2304 KV blocks (4095 tokens x 9 samples) but the decode worker's "
       "pool has only 2048",
       400, "invalid_request_error", "", ""},
      // engine/core/engine_core.cc: a device out of memory in one step.
      {grpc::StatusCode::RESOURCE_EXHAUSTED,
       "decode worker: device error in a forward step: out of memory (cudaMalloc)", 503,
       "server_error", "", ""},
      {grpc::StatusCode::RESOURCE_EXHAUSTED,
       "Received message larger than max (6000053 vs. 4194304)", 413, "invalid_request_error", "",
       "request_too_large"},
      {grpc::StatusCode::UNAUTHENTICATED, "invalid API key", 401, "authentication_error", "",
       "invalid_api_key"},
      {grpc::StatusCode::PERMISSION_DENIED, "no", 403, "permission_error", "", ""},
      {grpc::StatusCode::NOT_FOUND, "gone", 404, "not_found_error", "", ""},
      {grpc::StatusCode::UNAVAILABLE, "no healthy decode worker", 503, "server_error", "", ""},
      {grpc::StatusCode::DEADLINE_EXCEEDED, "Deadline Exceeded", 504, "server_error", "",
       "timeout"},
      {grpc::StatusCode::CANCELLED, "request cancelled", 499, "server_error", "", "cancelled"},
      {grpc::StatusCode::INTERNAL, "boom: x", 500, "server_error", "", ""},
      {grpc::StatusCode::UNKNOWN, "?", 500, "server_error", "", ""},
  };
  for (const Case& c : cases) {
    SCOPED_TRACE(c.message);
    const ApiError e = FromRpcError(static_cast<int>(c.code), c.message, -1);
    EXPECT_EQ(e.http_status, c.status);
    EXPECT_EQ(e.type, c.type);
    EXPECT_EQ(e.param, c.param);
    EXPECT_EQ(e.code, c.code_name);
    EXPECT_EQ(e.message, c.message);
    EXPECT_EQ(e.retry_after_ms, -1);
  }
  // With a retry-after hint (router admission, an API key's quota): 429.
  const ApiError limited = FromRpcError(
      static_cast<int>(grpc::StatusCode::RESOURCE_EXHAUSTED),
      "router at capacity: 4 running, 8 queued (router.max_inflight, router.max_queued)", 1500);
  EXPECT_EQ(limited.http_status, 429);
  EXPECT_EQ(limited.type, "rate_limit_error");
  EXPECT_EQ(limited.code, "rate_limit_exceeded");
  EXPECT_EQ(limited.retry_after_ms, 1500);
}

// ---- ResponseBuilder ----

// Token bytes of a tiny vocabulary: 12 and 13 are the two halves of the
// euro sign U+20AC (E2 82 | AC).
std::string FakeTokenBytes(int32_t id) {
  static const std::map<int32_t, std::string> vocab = {
      {10, "Hello"}, {11, " world"}, {12, "\xE2\x82"}, {13, "\xAC"}, {14, "!"},
      {15, " there"}, {16, "\xC3\xA9t\xC3\xA9"}, {2, "</s>"}};
  auto it = vocab.find(id);
  return it == vocab.end() ? "?" : it->second;
}

v1::TokenOutput Token(uint32_t index, int32_t id, float logprob, uint32_t sample,
                      std::vector<std::pair<int32_t, float>> top = {}) {
  v1::TokenOutput t;
  t.set_index(index);
  t.set_token_id(id);
  t.set_logprob(logprob);
  t.set_sample_index(sample);
  for (auto [tid, lp] : top) {
    v1::TopLogprob* a = t.add_top_logprobs();
    a->set_token_id(tid);
    a->set_logprob(lp);
  }
  return t;
}

v1::GenerateResponse Header() {
  v1::GenerateResponse m;
  m.set_request_id("abc123");
  m.set_route("local");
  m.set_prompt_tokens(5);
  m.set_seed(7);
  return m;
}

v1::GenerateResponse Step(uint32_t sample, std::string text, std::vector<v1::TokenOutput> tokens,
                          uint32_t completion_tokens) {
  v1::GenerateResponse m;
  m.set_sample_index(sample);
  m.set_text(std::move(text));
  for (auto& t : tokens) *m.add_tokens() = std::move(t);
  m.set_completion_tokens(completion_tokens);
  return m;
}

v1::GenerateResponse Finish(v1::GenerateResponse m, v1::FinishReason reason,
                            uint32_t cached = 4) {
  m.set_finish_reason(reason);
  m.set_prompt_tokens(5);
  m.set_cached_prompt_tokens(cached);
  return m;
}

// Two samples interleaved: sample 0 stops on the stop string "!" (its
// text cut before it), sample 1 runs to max_tokens through a euro sign
// split over two tokens (the router's text holds the partial character
// back: "" then "€").
std::vector<v1::GenerateResponse> Script() {
  std::vector<v1::GenerateResponse> s;
  s.push_back(Header());
  s.push_back(Step(0, "Hello", {Token(0, 10, -0.5f, 0, {{10, -0.5f}, {15, -1.25f}})}, 1));
  s.push_back(Step(1, "", {Token(0, 12, -0.75f, 1, {{12, -0.75f}, {10, -2.0f}})}, 1));
  s.push_back(Step(1, "\xE2\x82\xAC", {Token(1, 13, -0.125f, 1, {{14, -3.0f}, {13, -0.125f}})}, 2));
  v1::GenerateResponse stop =
      Step(0, " world",
           {Token(1, 11, -1.0f, 0, {{11, -1.0f}, {14, -1.5f}}),
            Token(2, 14, -0.25f, 0, {{14, -0.25f}, {10, -4.0f}})},
           3);
  stop.mutable_stop_reason()->set_text("!");
  s.push_back(Finish(stop, v1::FINISH_STOP));
  s.push_back(Finish(Step(1, "", {}, 2), v1::FINISH_LENGTH));
  return s;
}

ParsedRequest Request(Endpoint endpoint, bool stream, bool include_usage, bool logprobs,
                      uint32_t top) {
  ParsedRequest p;
  p.endpoint = endpoint;
  p.stream = stream;
  p.include_usage = include_usage;
  p.logprobs = logprobs;
  p.request.set_logprobs(top);
  p.request.set_n(2);
  return p;
}

// text_offset follows the text the router sends: an invalid byte pair is
// two U+FFFD there, so the next token starts 2 code points later.
TEST(OpenAiResponseTest, TextOffsetsCountInvalidBytesAsTheTextShowsThem) {
  ParsedRequest p;
  p.logprobs = true;
  p.request.set_logprobs(0);
  const std::map<int32_t, std::string> pieces = {{1, "a"}, {2, "\xE5\x8D"}, {3, "bc"}, {4, "d"}};
  ResponseBuilder b(p, 1, "m", [&](int32_t id) { return pieces.at(id); });
  v1::GenerateResponse m;
  m.set_request_id("r");
  for (int32_t id : {1, 2, 3, 4}) m.add_tokens()->set_token_id(id);
  m.set_text("a\xEF\xBF\xBD\xEF\xBF\xBD" "bcd");
  m.set_finish_reason(v1::FINISH_LENGTH);
  b.Add(m);
  const json j = json::parse(b.Body());
  // a at 0; the pair at 1; bc (which showed the pair as two U+FFFD) points
  // at them; d at 1 + 2 + 2 = 5.
  EXPECT_EQ(j["choices"][0]["logprobs"]["text_offset"], json({0, 1, 1, 5}));
}

TEST(OpenAiResponseTest, CompletionsBodyWithLogprobs) {
  ResponseBuilder b(Request(Endpoint::kCompletions, false, false, true, 2), 1700000000,
                    "stories260K", FakeTokenBytes);
  for (const auto& m : Script()) b.Add(m);
  const json j = json::parse(b.Body());
  EXPECT_EQ(j["id"], "cmpl-abc123");
  EXPECT_EQ(j["object"], "text_completion");
  EXPECT_EQ(j["created"], 1700000000);
  EXPECT_EQ(j["model"], "stories260K");
  ASSERT_EQ(j["choices"].size(), 2u);
  const json& c0 = j["choices"][0];
  EXPECT_EQ(c0["index"], 0);
  EXPECT_EQ(c0["text"], "Hello world");
  EXPECT_EQ(c0["finish_reason"], "stop");
  EXPECT_EQ(c0["stop_reason"], "!");
  EXPECT_EQ(c0["logprobs"]["tokens"], json({"Hello", " world", "!"}));
  EXPECT_EQ(c0["logprobs"]["token_logprobs"], json({-0.5, -1.0, -0.25}));
  EXPECT_EQ(c0["logprobs"]["text_offset"], json({0, 5, 11}));
  EXPECT_EQ(c0["logprobs"]["top_logprobs"][0], json({{"Hello", -0.5}, {" there", -1.25}}));
  EXPECT_EQ(c0["logprobs"]["top_logprobs"][2], json({{"!", -0.25}, {"Hello", -4.0}}));
  const json& c1 = j["choices"][1];
  EXPECT_EQ(c1["index"], 1);
  EXPECT_EQ(c1["text"], "\xE2\x82\xAC");
  EXPECT_EQ(c1["finish_reason"], "length");
  EXPECT_TRUE(c1["stop_reason"].is_null());
  EXPECT_EQ(c1["logprobs"]["tokens"], json({"bytes:\\xe2\\x82", "bytes:\\xac"}));
  EXPECT_EQ(c1["logprobs"]["token_logprobs"], json({-0.75, -0.125}));
  // Offsets in code points of the decoded text: the euro sign starts at 0
  // and the token that completes it points at it too.
  EXPECT_EQ(c1["logprobs"]["text_offset"], json({0, 0}));
  EXPECT_EQ(c1["logprobs"]["top_logprobs"][1], json({{"!", -3.0}, {"bytes:\\xac", -0.125}}));
  EXPECT_EQ(j["usage"]["prompt_tokens"], 5);
  EXPECT_EQ(j["usage"]["completion_tokens"], 5);  // 3 + 2
  EXPECT_EQ(j["usage"]["total_tokens"], 10);
  EXPECT_EQ(j["usage"]["prompt_tokens_details"]["cached_tokens"], 4);
}

TEST(OpenAiResponseTest, CompletionsLogprobsZeroGivesTheSampledToken) {
  ParsedRequest p = Request(Endpoint::kCompletions, false, false, true, 0);
  p.request.clear_n();
  ResponseBuilder b(p, 1, "m", FakeTokenBytes);
  b.Add(Header());
  b.Add(Finish(Step(0, "Hello", {Token(0, 10, -0.5f, 0)}, 1), v1::FINISH_LENGTH, 0));
  const json j = json::parse(b.Body());
  ASSERT_EQ(j["choices"].size(), 1u);
  EXPECT_EQ(j["choices"][0]["logprobs"]["top_logprobs"], json::parse(R"([{"Hello":-0.5}])"));
  EXPECT_EQ(j["usage"]["prompt_tokens_details"]["cached_tokens"], 0);
}

TEST(OpenAiResponseTest, ChatBodyWithLogprobs) {
  ResponseBuilder b(Request(Endpoint::kChatCompletions, false, false, true, 2), 42, "stories260K",
                    FakeTokenBytes);
  for (const auto& m : Script()) b.Add(m);
  const json j = json::parse(b.Body());
  EXPECT_EQ(j["id"], "chatcmpl-abc123");
  EXPECT_EQ(j["object"], "chat.completion");
  ASSERT_EQ(j["choices"].size(), 2u);
  const json& c0 = j["choices"][0];
  EXPECT_EQ(c0["message"], json({{"role", "assistant"}, {"content", "Hello world"}}));
  EXPECT_EQ(c0["finish_reason"], "stop");
  EXPECT_EQ(c0["stop_reason"], "!");
  ASSERT_EQ(c0["logprobs"]["content"].size(), 3u);
  const json& t0 = c0["logprobs"]["content"][0];
  EXPECT_EQ(t0["token"], "Hello");
  EXPECT_EQ(t0["logprob"], -0.5);
  EXPECT_EQ(t0["bytes"], json({72, 101, 108, 108, 111}));
  EXPECT_EQ(t0["top_logprobs"],
            json::parse(R"([{"token":"Hello","logprob":-0.5,"bytes":[72,101,108,108,111]},
                {"token":" there","logprob":-1.25,"bytes":[32,116,104,101,114,101]}])"));
  const json& c1 = j["choices"][1];
  EXPECT_EQ(c1["message"]["content"], "\xE2\x82\xAC");
  EXPECT_EQ(c1["logprobs"]["content"][0]["token"], "bytes:\\xe2\\x82");
  EXPECT_EQ(c1["logprobs"]["content"][0]["bytes"], json({0xE2, 0x82}));
  EXPECT_EQ(c1["logprobs"]["content"][1]["bytes"], json({0xAC}));
  EXPECT_EQ(c1["logprobs"]["content"][1]["top_logprobs"][0]["token"], "!");
  EXPECT_EQ(j["usage"]["completion_tokens"], 5);
}

TEST(OpenAiResponseTest, BodyWithoutLogprobsHasNull) {
  ResponseBuilder b(Request(Endpoint::kChatCompletions, false, false, false, 0), 42, "m",
                    FakeTokenBytes);
  for (const auto& m : Script()) b.Add(m);
  const json j = json::parse(b.Body());
  EXPECT_TRUE(j["choices"][0]["logprobs"].is_null());
  EXPECT_TRUE(j["choices"][1]["logprobs"].is_null());
}

std::vector<json> AllChunks(ResponseBuilder& b) {
  std::vector<json> out;
  for (const auto& m : Script()) {
    for (const std::string& c : b.Chunks(m)) out.push_back(json::parse(c));
  }
  return out;
}

TEST(OpenAiResponseTest, ChatStreamChunks) {
  ResponseBuilder b(Request(Endpoint::kChatCompletions, true, true, false, 0), 42, "stories260K",
                    FakeTokenBytes);
  const std::vector<json> chunks = AllChunks(b);
  // role 0, "Hello", role 1, (sample 1's "" without logprobs: none), "€",
  // sample 0's " world"+stop, sample 1's finish.
  ASSERT_EQ(chunks.size(), 6u);
  for (const json& c : chunks) {
    EXPECT_EQ(c["id"], "chatcmpl-abc123");
    EXPECT_EQ(c["object"], "chat.completion.chunk");
    EXPECT_EQ(c["created"], 42);
    EXPECT_EQ(c["model"], "stories260K");
    ASSERT_EQ(c["choices"].size(), 1u);
    EXPECT_TRUE(c.contains("usage"));
    EXPECT_TRUE(c["usage"].is_null());
    EXPECT_TRUE(c["choices"][0]["logprobs"].is_null());
  }
  auto choice = [&](size_t i) { return chunks[i]["choices"][0]; };
  EXPECT_EQ(choice(0)["index"], 0);
  EXPECT_EQ(choice(0)["delta"], json({{"role", "assistant"}, {"content", ""}}));
  EXPECT_TRUE(choice(0)["finish_reason"].is_null());
  EXPECT_EQ(choice(1)["index"], 0);
  EXPECT_EQ(choice(1)["delta"], json({{"content", "Hello"}}));
  EXPECT_EQ(choice(2)["index"], 1);
  EXPECT_EQ(choice(2)["delta"], json({{"role", "assistant"}, {"content", ""}}));
  EXPECT_EQ(choice(3)["index"], 1);
  EXPECT_EQ(choice(3)["delta"], json({{"content", "\xE2\x82\xAC"}}));
  EXPECT_TRUE(choice(3)["finish_reason"].is_null());
  EXPECT_EQ(choice(4)["index"], 0);
  EXPECT_EQ(choice(4)["delta"], json({{"content", " world"}}));
  EXPECT_EQ(choice(4)["finish_reason"], "stop");
  EXPECT_EQ(choice(4)["stop_reason"], "!");
  EXPECT_EQ(choice(5)["index"], 1);
  EXPECT_EQ(choice(5)["delta"], json::object());
  EXPECT_EQ(choice(5)["finish_reason"], "length");
  EXPECT_TRUE(choice(5)["stop_reason"].is_null());

  const json usage = json::parse(b.UsageChunk());
  EXPECT_EQ(usage["id"], "chatcmpl-abc123");
  EXPECT_EQ(usage["object"], "chat.completion.chunk");
  EXPECT_EQ(usage["choices"], json::array());
  EXPECT_EQ(usage["usage"]["prompt_tokens"], 5);
  EXPECT_EQ(usage["usage"]["completion_tokens"], 5);
  EXPECT_EQ(usage["usage"]["total_tokens"], 10);
  EXPECT_EQ(usage["usage"]["prompt_tokens_details"]["cached_tokens"], 4);
}

// Script() with the router's placement and timing on each sample's last
// message; sample 1's differ, and sample 0's are the request's.
std::vector<v1::GenerateResponse> ScriptWithTiming() {
  std::vector<v1::GenerateResponse> s = Script();
  for (v1::GenerateResponse& m : s) {
    if (m.finish_reason() == v1::FINISH_NONE) continue;
    const bool first = m.sample_index() == 0;
    m.mutable_placement()->set_decision(first ? "remote" : "local");
    m.mutable_placement()->set_ttft_local_ms(first ? 120.5 : 1);
    m.mutable_placement()->set_ttft_remote_ms(first ? 80.25 : 1);
    v1::RequestTiming* t = m.mutable_timing();
    t->set_ttft_ms(first ? 20 : 99);
    t->set_e2e_ms(first ? 50 : 99);
    t->set_router_queue_ms(first ? 2 : 99);
    t->set_placement_ms(first ? 3 : 99);
    t->set_prefill_queue_ms(first ? 4 : 99);
    t->set_prefill_ms(first ? 11 : 99);
    t->set_kv_transfer_ms(first ? 3.5 : 99);
    t->set_decode_admission_ms(first ? 1 : 99);
    t->set_first_decode_ms(first ? 2.25 : 99);
  }
  return s;
}

constexpr char kSampleZeroPlacement[] =
    R"({"decision":"remote","ttft_local_ms":120.5,"ttft_remote_ms":80.25})";
constexpr char kSampleZeroTiming[] =
    R"({"ttft_ms":20.0,"e2e_ms":50.0,"router_queue_ms":2.0,"placement_ms":3.0,)"
    R"("prefill_queue_ms":4.0,"prefill_ms":11.0,"kv_transfer_ms":3.5,)"
    R"("decode_admission_ms":1.0,"first_decode_ms":2.25})";

TEST(OpenAiResponseTest, BodyUsageCarriesSampleZerosPlacementAndTiming) {
  for (Endpoint endpoint : {Endpoint::kCompletions, Endpoint::kChatCompletions}) {
    ResponseBuilder b(Request(endpoint, false, false, false, 0), 42, "m", FakeTokenBytes);
    for (const auto& m : ScriptWithTiming()) b.Add(m);
    const json usage = json::parse(b.Body())["usage"];
    EXPECT_EQ(usage["placement"], json::parse(kSampleZeroPlacement));
    EXPECT_EQ(usage["timing"], json::parse(kSampleZeroTiming));
    EXPECT_EQ(usage["completion_tokens"], 5);
  }
}

TEST(OpenAiResponseTest, StreamUsageChunkCarriesSampleZerosPlacementAndTiming) {
  ResponseBuilder b(Request(Endpoint::kChatCompletions, true, true, false, 0), 42, "m",
                    FakeTokenBytes);
  for (const auto& m : ScriptWithTiming()) {
    for (const std::string& c : b.Chunks(m)) EXPECT_TRUE(json::parse(c)["usage"].is_null());
  }
  const json usage = json::parse(b.UsageChunk())["usage"];
  EXPECT_EQ(usage["placement"], json::parse(kSampleZeroPlacement));
  EXPECT_EQ(usage["timing"], json::parse(kSampleZeroTiming));
}

TEST(OpenAiResponseTest, UsageWithoutTheRoutersTimingHasNeither) {
  ResponseBuilder b(Request(Endpoint::kCompletions, false, false, false, 0), 42, "m",
                    FakeTokenBytes);
  for (const auto& m : Script()) b.Add(m);
  const json usage = json::parse(b.Body())["usage"];
  EXPECT_FALSE(usage.contains("placement"));
  EXPECT_FALSE(usage.contains("timing"));
}

TEST(OpenAiResponseTest, CompletionsStreamChunksWithLogprobs) {
  ResponseBuilder b(Request(Endpoint::kCompletions, true, false, true, 2), 42, "stories260K",
                    FakeTokenBytes);
  const std::vector<json> chunks = AllChunks(b);
  // "Hello", sample 1's "" (its token's logprobs), "€", " world"+stop,
  // sample 1's finish.
  ASSERT_EQ(chunks.size(), 5u);
  for (const json& c : chunks) {
    EXPECT_EQ(c["id"], "cmpl-abc123");
    EXPECT_EQ(c["object"], "text_completion");
    EXPECT_FALSE(c.contains("usage"));
  }
  auto choice = [&](size_t i) { return chunks[i]["choices"][0]; };
  EXPECT_EQ(choice(0)["text"], "Hello");
  EXPECT_EQ(choice(0)["logprobs"]["tokens"], json({"Hello"}));
  EXPECT_EQ(choice(0)["logprobs"]["text_offset"], json({0}));
  EXPECT_EQ(choice(1)["index"], 1);
  EXPECT_EQ(choice(1)["text"], "");
  EXPECT_EQ(choice(1)["logprobs"]["tokens"], json({"bytes:\\xe2\\x82"}));
  EXPECT_EQ(choice(2)["text"], "\xE2\x82\xAC");
  // Continues the sample's offsets: the token completing the euro sign
  // points where it starts.
  EXPECT_EQ(choice(2)["logprobs"]["text_offset"], json({0}));
  EXPECT_EQ(choice(3)["index"], 0);
  EXPECT_EQ(choice(3)["text"], " world");
  EXPECT_EQ(choice(3)["logprobs"]["tokens"], json({" world", "!"}));
  EXPECT_EQ(choice(3)["logprobs"]["text_offset"], json({5, 11}));
  EXPECT_EQ(choice(3)["finish_reason"], "stop");
  EXPECT_EQ(choice(3)["stop_reason"], "!");
  EXPECT_EQ(choice(4)["index"], 1);
  EXPECT_EQ(choice(4)["text"], "");
  EXPECT_TRUE(choice(4)["logprobs"].is_null());
  EXPECT_EQ(choice(4)["finish_reason"], "length");
}

TEST(OpenAiResponseTest, FinishReasonsAndStopTokenId) {
  ParsedRequest p = Request(Endpoint::kCompletions, false, false, false, 0);
  p.request.clear_n();
  struct Case {
    v1::FinishReason reason;
    const char* name;
  };
  for (const Case& c : std::vector<Case>{{v1::FINISH_STOP, "stop"},
                                         {v1::FINISH_LENGTH, "length"},
                                         {v1::FINISH_CONTEXT, "length"},
                                         {v1::FINISH_CANCELLED, "abort"}}) {
    ResponseBuilder b(p, 1, "m", FakeTokenBytes);
    b.Add(Header());
    v1::GenerateResponse last = Finish(Step(0, "x", {}, 1), c.reason);
    if (c.reason == v1::FINISH_STOP) last.mutable_stop_reason()->set_token_id(2);
    b.Add(last);
    const json j = json::parse(b.Body());
    EXPECT_EQ(j["choices"][0]["finish_reason"], c.name);
    if (c.reason == v1::FINISH_STOP) {
      EXPECT_EQ(j["choices"][0]["stop_reason"], 2);
    } else {
      EXPECT_TRUE(j["choices"][0]["stop_reason"].is_null());
    }
  }
}

TEST(OpenAiResponseTest, InvalidUtf8TextNeverThrows) {
  ParsedRequest p = Request(Endpoint::kChatCompletions, true, false, false, 0);
  p.request.clear_n();
  ResponseBuilder b(p, 1, "m", FakeTokenBytes);
  b.Chunks(Header());
  const std::vector<std::string> chunks = b.Chunks(Step(0, "a\xE2\x82", {}, 1));
  ASSERT_EQ(chunks.size(), 1u);
  EXPECT_EQ(json::parse(chunks[0])["choices"][0]["delta"]["content"], "a\xEF\xBF\xBD");
}

}  // namespace
}  // namespace tandem::router::openai
