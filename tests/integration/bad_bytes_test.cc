// Text that is not UTF-8 in any request field, to the router and straight
// to each worker: INVALID_ARGUMENT naming the field (rpc::ParseStrict),
// nothing in the servers' logs, and the cluster serves on (a good stream
// running meanwhile finishes with its golden tokens). The requests are
// hand-encoded (tests/test_util.h) and sent with grpc::GenericStub, since a
// typed stub would not serialize such text.
#include <grpcpp/generic/generic_stub.h>
#include <grpcpp/grpcpp.h>

#include <chrono>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "absl/strings/ascii.h"
#include "absl/strings/match.h"
#include "absl/strings/str_split.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "tandem/v1/generation.pb.h"
#include "tests/integration/cluster_fixture.h"
#include "tests/integration/generate_client.h"
#include "tests/test_util.h"

namespace tandem::testing {
namespace {

using ::testing::ElementsAreArray;
using ::testing::IsEmpty;

// What a raw call returned.
struct RawResult {
  grpc::Status status;
  std::vector<std::string> responses;  // serialized messages, in order
};

// Calls `method` (e.g. "/tandem.v1.Generation/Tokenize") at `address` with
// the serialized request `wire` through grpc::GenericStub, and reads every
// response until the server ends the call (unary and server-streaming
// methods alike).
RawResult RawCall(const std::string& address, const std::string& method, const std::string& wire,
                  absl::Duration timeout = absl::Seconds(30)) {
  grpc::GenericStub stub(grpc::CreateChannel(address, grpc::InsecureChannelCredentials()));
  grpc::ClientContext context;
  context.set_deadline(std::chrono::system_clock::now() +
                       std::chrono::milliseconds(absl::ToInt64Milliseconds(timeout)));
  grpc::CompletionQueue cq;
  // Waits for the operation tagged `tag`; whether it succeeded.
  auto wait = [&cq](intptr_t tag) {
    void* got = nullptr;
    bool ok = false;
    if (!cq.Next(&got, &ok)) return false;
    EXPECT_EQ(reinterpret_cast<intptr_t>(got), tag);
    return ok;
  };
  RawResult result;
  std::unique_ptr<grpc::GenericClientAsyncReaderWriter> call =
      stub.PrepareCall(&context, method, &cq);
  call->StartCall(reinterpret_cast<void*>(1));
  if (wait(1)) {
    grpc::Slice slice(wire);
    call->WriteLast(grpc::ByteBuffer(&slice, 1), grpc::WriteOptions(), reinterpret_cast<void*>(2));
    if (wait(2)) {
      for (;;) {
        grpc::ByteBuffer response;
        call->Read(&response, reinterpret_cast<void*>(3));
        if (!wait(3)) break;
        grpc::Slice bytes;
        EXPECT_TRUE(response.DumpToSingleSlice(&bytes).ok());
        result.responses.emplace_back(reinterpret_cast<const char*>(bytes.begin()), bytes.size());
      }
    }
  }
  call->Finish(&result.status, reinterpret_cast<void*>(4));
  wait(4);
  cq.Shutdown();
  void* ignored_tag;
  bool ignored_ok;
  while (cq.Next(&ignored_tag, &ignored_ok)) {
  }
  return result;
}

// Lines of a server log that report an error: protobuf's "[libprotobuf
// ERROR ...]", gRPC's "E0102 12:00:00..." lines, Tandem's "request ...
// failed: ...", or anything about UTF-8.
std::vector<std::string> ErrorLines(const std::string& log) {
  std::vector<std::string> errors;
  for (absl::string_view line : absl::StrSplit(log, '\n', absl::SkipEmpty())) {
    const bool grpc_error = line.size() > 5 && line[0] == 'E' && absl::ascii_isdigit(line[1]) &&
                            absl::ascii_isdigit(line[4]);
    if (grpc_error || absl::StrContains(line, "ERROR") || absl::StrContains(line, " failed: ") ||
        absl::StrContains(line, "UTF-8")) {
      errors.emplace_back(line);
    }
  }
  return errors;
}

// One request with text that is not UTF-8, and the error it must get.
struct BadBytesCase {
  std::string name;
  std::string method;
  std::string wire;
  std::string message;  // the whole INVALID_ARGUMENT message
};

enum class Target { kRouter, kDecode, kPrefill };

class BadBytesTest : public ClusterSuite {
 protected:
  static void SetUpTestSuite() {
    ClusterOptions options;
    options.capture_stderr = true;
    StartSuiteCluster(options);
  }

  // Sends every case to `target`: each must fail with INVALID_ARGUMENT and
  // its message, with no response message and no error in the servers'
  // logs.
  void ExpectRefused(Target target, const std::vector<BadBytesCase>& cases) {
    const std::string address = target == Target::kRouter   ? cluster().router_address()
                                : target == Target::kDecode ? cluster().decode_address()
                                                            : cluster().prefill_address();
    const size_t log_start = cluster().CapturedStderr().size();
    for (const BadBytesCase& c : cases) {
      SCOPED_TRACE(c.name);
      const RawResult r = RawCall(address, c.method, c.wire);
      EXPECT_EQ(r.status.error_code(), grpc::StatusCode::INVALID_ARGUMENT)
          << r.status.error_message();
      EXPECT_EQ(r.status.error_message(), c.message);
      EXPECT_THAT(r.responses, IsEmpty());
    }
    EXPECT_THAT(ErrorLines(cluster().CapturedStderr().substr(log_start)), IsEmpty());
  }
};

// GenerateRequest fields: prompt 1, max_tokens 2, route_override 4,
// client_request_id 5, messages 6 (role 1, content 2), stop 8.
std::string GenerateWire(const std::string& prompt) {
  return WireLen(1, prompt) + WireUint(2, kGoldenMaxTokens) + WireUint(4, v1::ROUTE_LOCAL);
}

TEST_F(BadBytesTest, RouterNamesTheFieldWhileAGoodStreamRuns) {
  const GoldenCase& good = Golden("lily_and_ben");
  GenerateStream stream(cluster().stub(),
                        MakeRequest(good.prompt, kGoldenMaxTokens, v1::ROUTE_REMOTE));
  ASSERT_TRUE(stream.ReadOne()) << stream.Finish().status.error_message();

  const std::string generate = "/tandem.v1.Generation/Generate";
  const std::string user = WireLen(1, "user");
  ExpectRefused(
      Target::kRouter,
      {
          {"Prompt", generate, GenerateWire("\xFF"),
           "prompt: not valid UTF-8 (byte 0xff at offset 0)"},
          {"PromptTail", generate, GenerateWire("Once upon a time\xE2\x82"),
           "prompt: not valid UTF-8 (byte 0xe2 at offset 16)"},
          {"TokenizeOverlong", "/tandem.v1.Generation/Tokenize",
           WireLen(1, "\xC0\xAF") + WireUint(2, 1),
           "text: not valid UTF-8 (byte 0xc0 at offset 0)"},
          {"MessageContentSurrogate", generate,
           WireUint(2, 4) + WireLen(6, user + WireLen(2, "\xED\xA0\x80")),
           "messages[0].content: not valid UTF-8 (byte 0xed at offset 0)"},
          {"MessageRole", generate,
           WireUint(2, 4) + WireLen(6, user + WireLen(2, "hi")) + WireLen(6, WireLen(1, "\x80")),
           "messages[1].role: not valid UTF-8 (byte 0x80 at offset 0)"},
          {"StopAboveU10FFFF", generate, GenerateWire("Once") + WireLen(8, "\xF4\x90\x80\x80"),
           "stop[0]: not valid UTF-8 (byte 0xf4 at offset 0)"},
          {"ClientRequestId", generate, GenerateWire("Once") + WireLen(5, "id-\xFE"),
           "client_request_id: not valid UTF-8 (byte 0xfe at offset 3)"},
          {"RegisterWorkerName", "/tandem.v1.Registry/RegisterWorker",
           WireLen(1, "w\xFF") + WireUint(2, v1::ROLE_DECODE),
           "name: not valid UTF-8 (byte 0xff at offset 1)"},
          {"Truncated", generate, WireTag(1, 2) + WireVarint(10) + "Once",
           "request: not a valid tandem.v1.GenerateRequest message"},
      });

  ExpectGolden(stream.Finish(), good, "remote");
}

TEST_F(BadBytesTest, WorkersNameTheField) {
  // DecodeGenerateRequest: request_id 1, prompt_token_ids 2 (packed),
  // max_tokens 3. PrefillRequest: request_id 1, prompt_token_ids 2,
  // max_tokens 3, kv_target 5 (endpoint 1, request_id 2).
  const std::string ids = WireLen(2, WireVarint(1) + WireVarint(400) + WireVarint(30));
  ExpectRefused(
      Target::kDecode,
      {
          {"GenerateRequestId", "/tandem.v1.DecodeWorker/Generate",
           WireLen(1, "\xFF") + ids + WireUint(3, 4),
           "request_id: not valid UTF-8 (byte 0xff at offset 0)"},
          {"CancelSampleRequestId", "/tandem.v1.DecodeWorker/CancelSample", WireLen(1, "r\xC1\x81"),
           "request_id: not valid UTF-8 (byte 0xc1 at offset 1)"},
          {"GenerateTruncated", "/tandem.v1.DecodeWorker/Generate", WireLen(1, "r") + WireTag(3, 0),
           "request: not a valid tandem.v1.DecodeGenerateRequest message"},
      });
  ExpectRefused(Target::kPrefill,
                {
                    {"PrefillRequestId", "/tandem.v1.PrefillWorker/Prefill",
                     WireLen(1, "\xFF") + ids + WireUint(3, 4),
                     "request_id: not valid UTF-8 (byte 0xff at offset 0)"},
                    {"PrefillKvEndpoint", "/tandem.v1.PrefillWorker/Prefill",
                     WireLen(1, "r1") + ids + WireLen(5, WireLen(1, "127.0.0.1:\xFF")),
                     "kv_target.endpoint: not valid UTF-8 (byte 0xff at offset 10)"},
                    {"PrefillKvRequestId", "/tandem.v1.PrefillWorker/Prefill",
                     WireLen(1, "r1") + ids + WireLen(5, WireLen(2, "\xED\xBF\xBF")),
                     "kv_target.request_id: not valid UTF-8 (byte 0xed at offset 0)"},
                });
  // A well-formed CancelSample reaches its body: a request the worker does
  // not run is a no-op (OK, an empty response).
  const RawResult cancel =
      RawCall(cluster().decode_address(), "/tandem.v1.DecodeWorker/CancelSample", WireLen(1, "r"));
  EXPECT_EQ(cancel.status.error_code(), grpc::StatusCode::OK) << cancel.status.error_message();
  EXPECT_EQ(cancel.responses, std::vector<std::string>{""});
}

TEST_F(BadBytesTest, WellFormedRequestsAreServed) {
  const size_t log_start = cluster().CapturedStderr().size();
  // A hand-encoded Generate through the raw method: the golden tokens.
  const GoldenCase& good = Golden("the_little_dog");
  const RawResult raw = RawCall(cluster().router_address(), "/tandem.v1.Generation/Generate",
                                GenerateWire(good.prompt));
  StreamResult folded;
  folded.status = raw.status;
  for (const std::string& bytes : raw.responses) {
    v1::GenerateResponse response;
    ASSERT_TRUE(response.ParseFromString(bytes));
    folded.Add(response);
  }
  ExpectGolden(folded, good, "local");

  // Typed stubs: Tokenize (the golden prompt ids, and an empty request,
  // which is an empty message on the wire) and a Generate with UTF-8 text
  // of every length.
  absl::StatusOr<std::vector<int32_t>> ids = Tokenize(cluster().stub(), good.prompt);
  ASSERT_TRUE(ids.ok()) << ids.status();
  EXPECT_THAT(*ids, ElementsAreArray(good.prompt_ids));
  grpc::ClientContext context;
  context.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(10));
  v1::TokenizeResponse empty;
  EXPECT_TRUE(cluster().stub().Tokenize(&context, v1::TokenizeRequest(), &empty).ok());
  v1::GenerateRequest request =
      MakeRequest("caf\xC3\xA9 \xE2\x82\xAC \xF0\x9F\x9A\x80 \xF4\x8F\xBF\xBF", 4);
  request.add_stop("\xEF\xBF\xBF");
  const StreamResult r = RunGenerate(cluster().stub(), request);
  EXPECT_TRUE(r.status.ok()) << r.status.error_message();
  EXPECT_FALSE(r.token_ids.empty());
  EXPECT_THAT(ErrorLines(cluster().CapturedStderr().substr(log_start)), IsEmpty());
}

// Server reflection (router/main.cc) still describes the real services
// and their typed messages although Generate and Tokenize are raw methods.
// grpc.reflection.v1alpha.ServerReflectionRequest: list_services 7,
// file_containing_symbol 4; the answers are searched for the names.
TEST_F(BadBytesTest, ReflectionDescribesTheTypedServices) {
  const std::string method = "/grpc.reflection.v1alpha.ServerReflection/ServerReflectionInfo";
  const RawResult list = RawCall(cluster().router_address(), method, WireLen(7, ""));
  ASSERT_TRUE(list.status.ok()) << list.status.error_message();
  ASSERT_EQ(list.responses.size(), 1u);
  EXPECT_TRUE(absl::StrContains(list.responses[0], "tandem.v1.Generation"));
  EXPECT_TRUE(absl::StrContains(list.responses[0], "tandem.v1.Registry"));
  const RawResult file =
      RawCall(cluster().router_address(), method, WireLen(4, "tandem.v1.Generation"));
  ASSERT_TRUE(file.status.ok()) << file.status.error_message();
  ASSERT_EQ(file.responses.size(), 1u);
  // The method's input and output types in generation.proto's descriptor.
  EXPECT_TRUE(absl::StrContains(file.responses[0], ".tandem.v1.GenerateRequest"));
  EXPECT_TRUE(absl::StrContains(file.responses[0], ".tandem.v1.GenerateResponse"));
  EXPECT_TRUE(absl::StrContains(file.responses[0], ".tandem.v1.TokenizeRequest"));
}

}  // namespace
}  // namespace tandem::testing
