// rpc::SignCall hashes request.SerializeAsString(); the server hashes the
// bytes gRPC's protobuf codec put on the wire. For one message instance
// they are the same bytes, map fields (no canonical order) included.
#include <grpcpp/impl/codegen/proto_utils.h>

#include <string>

#include "auth/cluster_auth.h"
#include "common/server/raw_call.h"
#include "gtest/gtest.h"
#include "tandem/v1/worker.pb.h"

namespace tandem {
namespace {

std::string WireBytes(const google::protobuf::Message& m) {
  grpc::ByteBuffer buffer;
  EXPECT_TRUE(rpc::SerializeToBuffer(m, &buffer).ok());
  grpc::Slice slice;
  EXPECT_TRUE(buffer.DumpToSingleSlice(&slice).ok());
  return std::string(reinterpret_cast<const char*>(slice.begin()), slice.size());
}

TEST(AuthCallTest, SerializeAsStringIsWhatTheStubSendsWithAMap) {
  v1::DecodeGenerateRequest req;
  req.set_request_id("r1");
  for (int i = 0; i < 500; ++i) req.add_prompt_token_ids(i);
  // Keys inserted out of order, many of them: a hash map's iteration order.
  for (int i = 0; i < 300; ++i) {
    (*req.mutable_sampling()->mutable_logit_bias())[(i * 7919) % 1000] = 0.5f * i;
  }
  const std::string signed_bytes = req.SerializeAsString();
  EXPECT_EQ(WireBytes(req), signed_bytes);
  EXPECT_EQ(WireBytes(req), signed_bytes);  // and again: stable per instance
  // So a credential over the client's bytes verifies over the wire bytes.
  auth::ClusterAuth::Options o;
  o.secret = std::string(32, 'k');
  auth::ClusterAuth a(std::move(o));
  const auth::Credential c = a.Sign("/tandem.v1.DecodeWorker/Generate", signed_bytes);
  EXPECT_TRUE(a.Verify("/tandem.v1.DecodeWorker/Generate", WireBytes(req), c).ok());
}

}  // namespace
}  // namespace tandem
