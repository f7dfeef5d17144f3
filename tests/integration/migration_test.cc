// Migration at the decode worker (issue #12, item 4): a DecodeGenerateRequest
// carrying the k tokens another decode worker streamed before it died
// (generated_token_ids, first_output_index = k) continues at output index k
// with the ids of an undisturbed run, on the real model: seeded sampling
// with penalties and min_tokens, which must count the generated tokens as
// generated. The reference is the same worker's own undisturbed run of the
// same request, so this checks the continuation, not the model.
#include <grpcpp/grpcpp.h>

#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "gtest/gtest.h"
#include "tandem/v1/worker.grpc.pb.h"
#include "tests/integration/cluster_fixture.h"

namespace tandem::testing {
namespace {

struct Streamed {
  std::vector<uint32_t> indices;
  std::vector<int32_t> ids;
  grpc::Status status;
};

Streamed RunOnDecode(LocalCluster& cluster, const v1::DecodeGenerateRequest& request) {
  grpc::ClientContext context;
  context.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(20));
  auto reader = cluster.decode_stub().Generate(&context, request);
  Streamed out;
  v1::DecodeGenerateResponse msg;
  while (reader->Read(&msg)) {
    for (const v1::TokenOutput& t : msg.tokens()) {
      out.indices.push_back(t.index());
      out.ids.push_back(t.token_id());
    }
  }
  out.status = reader->Finish();
  return out;
}

v1::DecodeGenerateRequest Request(const std::string& id, uint32_t max_tokens) {
  v1::DecodeGenerateRequest r;
  r.set_request_id(id);
  // BOS and a few stories260K ids; short: D prefills it itself.
  for (int32_t t : {1, 403, 407, 261, 421, 365, 263}) r.add_prompt_token_ids(t);
  r.set_max_tokens(max_tokens);
  r.set_route_override(v1::ROUTE_LOCAL);
  v1::SamplingParams* s = r.mutable_sampling();
  s->set_temperature(0.9f);
  s->set_top_k(40);
  s->set_seed(1234);
  s->set_has_seed(true);
  s->set_repetition_penalty(1.3f);
  s->set_presence_penalty(0.4f);
  s->set_frequency_penalty(0.2f);
  r.mutable_controls()->set_min_tokens(12);
  r.mutable_controls()->set_ignore_eos(false);
  return r;
}

TEST(MigrationTest, DecodeWorkerContinuesAtIndexKWithTheUndisturbedIds) {
  auto cluster = LocalCluster::Start(ClusterOptions{});
  ASSERT_TRUE(cluster.ok()) << cluster.status();
  constexpr uint32_t kMaxTokens = 24;
  const Streamed whole = RunOnDecode(**cluster, Request("00000000000000000000000000000a01",
                                                        kMaxTokens));
  ASSERT_TRUE(whole.status.ok()) << whole.status.error_message();
  ASSERT_GT(whole.ids.size(), 12u);  // min_tokens 12
  for (const uint32_t k : {1u, 5u, 11u}) {
    v1::DecodeGenerateRequest r =
        Request(absl::StrCat("00000000000000000000000000000b0", k), kMaxTokens);
    for (uint32_t i = 0; i < k; ++i) r.add_generated_token_ids(whole.ids[i]);
    r.set_first_output_index(k);
    const Streamed rest = RunOnDecode(**cluster, r);
    ASSERT_TRUE(rest.status.ok()) << "k=" << k << ": " << rest.status.error_message();
    EXPECT_EQ(rest.ids, std::vector<int32_t>(whole.ids.begin() + k, whole.ids.end())) << k;
    ASSERT_FALSE(rest.indices.empty());
    EXPECT_EQ(rest.indices.front(), k);
  }
  // first_output_index must say how many tokens were generated.
  v1::DecodeGenerateRequest bad = Request("00000000000000000000000000000c01", kMaxTokens);
  bad.add_generated_token_ids(whole.ids[0]);
  bad.set_first_output_index(2);
  const Streamed refused = RunOnDecode(**cluster, bad);
  EXPECT_EQ(refused.status.error_code(), grpc::StatusCode::INVALID_ARGUMENT);
  EXPECT_EQ(refused.status.error_message(),
            "first_output_index: must equal the number of generated_token_ids (1), got 2");
}

}  // namespace
}  // namespace tandem::testing
