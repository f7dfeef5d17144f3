// The cluster secret with real processes (issue #13, Trust): a cluster
// with cluster.secret_file serves local and remote (KV HELLO signed both
// ways) requests, also ones with a logit_bias map (the HMAC covers the
// bytes the router's stub sends, map order included); a direct call to a
// worker without the router's credential is UNAUTHENTICATED, with it OK;
// a decode worker with another secret is refused at registration
// (UNAUTHENTICATED), exits 1 and never gets a request; a decode worker
// with a secret refuses an open router and exits 1; `tandem status`
// says authenticated, or open without a secret; a cluster caught in the
// middle of a secret rotation (cluster.accepted_secret_files: router and
// one decode worker rolled to the new secret, the others not) serves
// remote-prefill requests with every RPC, registration and KV HELLO
// verified across the two secrets; a short accepted secret stops the
// router naming cluster.accepted_secret_files[0].
#include <filesystem>
#include <map>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "auth/cluster_auth.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "tests/integration/cluster_fixture.h"
#include "tests/integration/generate_client.h"

namespace tandem::testing {
namespace {

using ::testing::HasSubstr;
using ::testing::Not;

class TrustTest : public OwnClusterTest {
 protected:
  void SetUp() override {
    dir_ = MakeTempDir();
    ASSERT_FALSE(dir_.empty());
    secret_ = dir_ + "/cluster.secret";
    ASSERT_TRUE(WriteFile(secret_, std::string(64, 'c') + "\n"));
    wrong_secret_ = dir_ + "/wrong.secret";
    ASSERT_TRUE(WriteFile(wrong_secret_, std::string(64, 'w') + "\n"));
  }
  void TearDown() override {
    StopCluster();
    std::error_code ignored;
    std::filesystem::remove_all(dir_, ignored);
  }
  ClusterOptions Secured() {
    ClusterOptions o;
    o.secret_file = secret_;
    o.capture_stderr = true;
    return o;
  }
  // `tandem status` against the cluster's router: its last line.
  std::string StatusAuthLine() {
    ProcessResult r = RunProcess(
        {BinaryPath("tandem"), "status", "--router", cluster().router_address()},
        absl::Seconds(20));
    EXPECT_TRUE(r.exited && r.exit_code == 0) << r.Describe();
    const std::vector<std::string> lines = Lines(r.out);
    return lines.empty() ? "" : lines.back();
  }

  // Runs one more decode worker, "decode-1", against the running cluster's
  // router with cluster.secret_file `secret_file` (empty: none) in its own
  // config; returns once it exits (30 s at most).
  ProcessResult RunExtraDecodeWorker(const std::string& secret_file) {
    ClusterOptions extra = cluster().options();
    extra.secret_file = secret_file;
    extra.num_decode_workers = 2;  // it runs as decode-1
    const std::string config = dir_ + "/extra.yaml";
    EXPECT_TRUE(WriteFile(config, ClusterYaml(extra)));
    ProcessResult r = RunProcess({BinaryPath("tandem-decode-worker"), "--config", config,
                                  "--name", "decode-1", "--model", ModelPath(), "--router",
                                  cluster().router_address()},
                                 absl::Seconds(30));
    EXPECT_FALSE(r.timed_out);
    EXPECT_TRUE(r.exited && r.exit_code == 1) << r.Describe();
    return r;
  }

  std::string dir_, secret_, wrong_secret_;
};

TEST_F(TrustTest, SecuredClusterServesLocalAndRemoteAndSaysSo) {
  ASSERT_NO_FATAL_FAILURE(StartCluster(Secured()));
  const GoldenCase& g = Golden("once_upon_a_time");
  ExpectGolden(RunGenerate(cluster().stub(), MakeRequest(g.prompt, kGoldenMaxTokens,
                                                         v1::ROUTE_LOCAL)),
               g, "local");
  ExpectGolden(RunGenerate(cluster().stub(), MakeRequest(g.prompt, kGoldenMaxTokens,
                                                         v1::ROUTE_REMOTE)),
               g, "remote");
  // A map field (no canonical order): 64 zero biases change no logit, so
  // the output stays the golden one, and both P and D verify the bytes.
  v1::GenerateRequest biased = MakeRequest(g.prompt, kGoldenMaxTokens, v1::ROUTE_REMOTE);
  for (int id = 100; id < 164; ++id) (*biased.mutable_sampling()->mutable_logit_bias())[id] = 0.0f;
  ExpectGolden(RunGenerate(cluster().stub(), biased), g, "remote");

  // The router's signed KvEvents.Watch streams are accepted: its prefix
  // index follows the decode worker's cache (19 full blocks of this one).
  const StreamResult long_one =
      RunGenerate(cluster().stub(), MakeRequest(Golden("long_repeated_313tok").prompt, 4));
  ASSERT_TRUE(long_one.status.ok()) << long_one.status.error_message();
  absl::StatusOr<v1::ClusterStatus> status;
  EXPECT_TRUE(PollUntil(absl::Seconds(10), [&] {
    status = cluster().ClusterStatus();
    if (!status.ok()) return false;
    for (const v1::WorkerStatus& w : status->workers()) {
      if (w.role() == v1::ROLE_DECODE) {
        return w.kv_blocks_cached() > 0 && w.kv_index_blocks() == w.kv_blocks_cached();
      }
    }
    return false;
  }));
  ASSERT_TRUE(status.ok()) << status.status();
  EXPECT_EQ(status->cluster_auth(), "hmac-sha256");
  EXPECT_EQ(StatusAuthLine(), "cluster: authenticated (HMAC-SHA256)");
  EXPECT_THAT(cluster().CapturedStderr(), Not(HasSubstr("refused /tandem.v1.")));
}

TEST_F(TrustTest, DirectWorkerCallsNeedTheClusterCredential) {
  ASSERT_NO_FATAL_FAILURE(StartCluster(Secured()));
  const std::string missing =
      "missing x-tandem-auth credential (this cluster requires the cluster secret)";
  {  // DecodeWorker.Generate, no credential.
    grpc::ClientContext ctx;
    ctx.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(5));
    v1::DecodeGenerateRequest req;
    req.set_request_id("intruder");
    req.add_prompt_token_ids(1);
    req.set_max_tokens(4);
    auto reader = cluster().decode_stub().Generate(&ctx, req);
    v1::DecodeGenerateResponse msg;
    EXPECT_FALSE(reader->Read(&msg));
    grpc::Status s = reader->Finish();
    EXPECT_EQ(s.error_code(), grpc::StatusCode::UNAUTHENTICATED);
    EXPECT_EQ(s.error_message(), missing);
  }
  {  // PrefillWorker.Prefill, no credential.
    auto prefill = v1::PrefillWorker::NewStub(
        grpc::CreateChannel(cluster().prefill_address(), grpc::InsecureChannelCredentials()));
    grpc::ClientContext ctx;
    ctx.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(5));
    v1::PrefillRequest req;
    req.set_request_id("intruder");
    req.add_prompt_token_ids(1);
    v1::PrefillResponse resp;
    grpc::Status s = prefill->Prefill(&ctx, req, &resp);
    EXPECT_EQ(s.error_code(), grpc::StatusCode::UNAUTHENTICATED);
    EXPECT_EQ(s.error_message(), missing);
  }
  {  // KvEvents.Watch (the prefix-cache events), no credential.
    auto events = v1::KvEvents::NewStub(
        grpc::CreateChannel(cluster().decode_address(), grpc::InsecureChannelCredentials()));
    grpc::ClientContext ctx;
    ctx.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(5));
    auto reader = events->Watch(&ctx, v1::WatchKvEventsRequest());
    v1::KvEventBatch batch;
    EXPECT_FALSE(reader->Read(&batch));
    grpc::Status s = reader->Finish();
    EXPECT_EQ(s.error_code(), grpc::StatusCode::UNAUTHENTICATED);
    EXPECT_EQ(s.error_message(), missing);
  }
  // GetStatus: without a credential refused; with one made from the
  // cluster secret answered (so the refusal above is the credential's).
  {
    grpc::ClientContext ctx;
    ctx.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(5));
    v1::WorkerStatus status;
    grpc::Status s = cluster().decode_stub().GetStatus(&ctx, v1::GetStatusRequest(), &status);
    EXPECT_EQ(s.error_code(), grpc::StatusCode::UNAUTHENTICATED);
  }
  absl::StatusOr<v1::WorkerStatus> signed_status = cluster().DecodeStatus();
  ASSERT_TRUE(signed_status.ok()) << signed_status.status();
  EXPECT_EQ(signed_status->name(), LocalCluster::kDecodeName);
  {  // A credential for another method does not open this one.
    grpc::ClientContext ctx;
    ctx.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(5));
    const v1::GetStatusRequest req;
    cluster().Sign(&ctx, "/tandem.v1.PrefillWorker/GetStatus", req);
    v1::WorkerStatus status;
    grpc::Status s = cluster().decode_stub().GetStatus(&ctx, req, &status);
    EXPECT_EQ(s.error_code(), grpc::StatusCode::UNAUTHENTICATED);
    EXPECT_EQ(s.error_message(),
              "bad signature (another cluster secret, or the message was altered)");
  }
  const std::string log = cluster().CapturedStderr();
  EXPECT_THAT(log, HasSubstr("refused /tandem.v1.DecodeWorker/Generate from "));
  EXPECT_THAT(log, HasSubstr("refused /tandem.v1.PrefillWorker/Prefill from "));
  EXPECT_THAT(log, HasSubstr("refused /tandem.v1.KvEvents/Watch from "));
  EXPECT_THAT(log, Not(HasSubstr("sig=")));
}

TEST_F(TrustTest, DecodeWorkerWithAnotherSecretCannotRegister) {
  ASSERT_NO_FATAL_FAILURE(StartCluster(Secured()));
  const ProcessResult r = RunExtraDecodeWorker(wrong_secret_);
  EXPECT_THAT(r.err, HasSubstr(absl::StrCat(
                         "router ", cluster().router_address(),
                         " refused registration: bad signature (another cluster secret, or the "
                         "message was altered)")))
      << r.err;
  EXPECT_THAT(cluster().CapturedStderr(),
              HasSubstr("refused /tandem.v1.Registry/RegisterWorker from "));
  absl::StatusOr<v1::ClusterStatus> status = cluster().ClusterStatus();
  ASSERT_TRUE(status.ok()) << status.status();
  for (const v1::WorkerStatus& w : status->workers()) EXPECT_NE(w.name(), "decode-1");
  EXPECT_EQ(status->workers_size(), 2);
}

// The reverse of an open worker at a secured router (UNAUTHENTICATED
// above): the open router accepts the registration, but would never sign
// its polls or watches, so the worker refuses to join and exits 1.
TEST_F(TrustTest, DecodeWorkerWithASecretRefusesAnOpenRouter) {
  ClusterOptions open;
  open.capture_stderr = true;
  ASSERT_NO_FATAL_FAILURE(StartCluster(open));
  const ProcessResult r = RunExtraDecodeWorker(secret_);
  EXPECT_THAT(r.err, HasSubstr(absl::StrCat(
                         "router ", cluster().router_address(),
                         " runs an open cluster (no cluster.secret_file) but this worker has "
                         "one: refusing to join")))
      << r.err;
  absl::StatusOr<v1::ClusterStatus> status = cluster().ClusterStatus();
  ASSERT_TRUE(status.ok()) << status.status();
  EXPECT_EQ(status->cluster_auth(), "open");
  EXPECT_TRUE(status->can_serve());
}

TEST_F(TrustTest, OpenClusterSaysSo) {
  ClusterOptions o;
  ASSERT_NO_FATAL_FAILURE(StartCluster(o));
  absl::StatusOr<v1::ClusterStatus> status = cluster().ClusterStatus();
  ASSERT_TRUE(status.ok()) << status.status();
  EXPECT_EQ(status->cluster_auth(), "open");
  EXPECT_EQ(StatusAuthLine(),
            "cluster: open (no cluster.secret_file: any host that reaches a worker port can "
            "register or call it)");
}

// Step 1 -> 2 of a rotation (auth/cluster_auth.h) half done: the
// router and decode-1 already run NEW (accepting OLD); prefill-0 and
// decode-0 still run OLD (accepting NEW). Registrations (OLD at a NEW
// router), polls and watches (NEW at OLD workers), Prefill calls and the
// KV HELLO / ACCEPT both ways (prefill-0 OLD to decode-0 OLD and to
// decode-1 NEW) are all accepted: every remote request is served and
// nothing is refused.
TEST_F(TrustTest, MidRotationClusterServesRemotePrefillAcrossSecrets) {
  const std::string old_secret = secret_;
  const std::string new_secret = dir_ + "/new.secret";
  ASSERT_TRUE(WriteFile(new_secret, std::string(64, 'n') + "\n"));
  ClusterOptions o = Secured();
  o.secret_file = old_secret;
  o.accepted_secret_files = {new_secret};
  o.secrets_by_process["router"] = {new_secret, {old_secret}};
  o.secrets_by_process["decode-1"] = {new_secret, {old_secret}};
  o.num_decode_workers = 2;
  o.router_policy = "round_robin";
  ASSERT_NO_FATAL_FAILURE(StartCluster(o));

  // Remote requests until each decode worker received KV from prefill-0
  // (round_robin takes them in turn), each the golden output.
  const GoldenCase& g = Golden("once_upon_a_time");
  std::map<std::string, uint64_t> received;
  std::map<std::string, int> served;  // decode worker -> requests
  uint64_t sent = 0;
  int requests = 0;
  while (requests < 8 && (received["decode-0"] == 0 || received["decode-1"] == 0)) {
    ++requests;
    const StreamResult r =
        RunGenerate(cluster().stub(), MakeRequest(g.prompt, kGoldenMaxTokens, v1::ROUTE_REMOTE));
    ASSERT_TRUE(r.status.ok()) << r.status.error_code() << ": " << r.status.error_message();
    EXPECT_EQ(r.route, "remote");
    EXPECT_EQ(r.prefill_worker, LocalCluster::kPrefillName);
    ++served[r.decode_worker];
    ASSERT_GE(r.token_ids.size(), g.strict_prefix_len);
    EXPECT_EQ(std::vector<int32_t>(r.token_ids.begin(),
                                   r.token_ids.begin() + static_cast<ptrdiff_t>(g.strict_prefix_len)),
              g.StrictIds())
        << "on " << r.decode_worker;
    absl::StatusOr<v1::ClusterStatus> status = cluster().ClusterStatus();
    ASSERT_TRUE(status.ok()) << status.status();
    EXPECT_EQ(status->cluster_auth(), "hmac-sha256");
    for (const v1::WorkerStatus& w : status->workers()) {
      if (w.role() == v1::ROLE_DECODE) received[w.name()] = w.kv_transfers_received_total();
      if (w.role() == v1::ROLE_PREFILL) sent = w.kv_transfers_sent_total();
    }
  }
  EXPECT_GE(received["decode-0"], 1u) << "after " << requests << " requests";
  EXPECT_GE(received["decode-1"], 1u) << "after " << requests << " requests";
  EXPECT_EQ(sent, static_cast<uint64_t>(requests));
  EXPECT_EQ(received["decode-0"], static_cast<uint64_t>(served["decode-0"]));
  EXPECT_EQ(received["decode-1"], static_cast<uint64_t>(served["decode-1"]));
  const std::string log = cluster().CapturedStderr();
  EXPECT_THAT(log, HasSubstr("peer authentication: HMAC-SHA256 (cluster.secret_file; also "
                             "accepting the 1 secret(s) of cluster.accepted_secret_files)"));
  EXPECT_THAT(log, Not(HasSubstr("refused /tandem.v1.")));
  EXPECT_THAT(log, Not(HasSubstr("bad signature")));
  EXPECT_THAT(log, Not(HasSubstr("did not prove the cluster secret")));
}

// A secret under 32 bytes, as the secret or as an accepted one: the router
// refuses to start with one line naming the key (and never the bytes).
TEST_F(TrustTest, ShortSecretIsAStartUpErrorNamingTheKey) {
  const std::string short_secret = dir_ + "/short.secret";
  ASSERT_TRUE(WriteFile(short_secret, "too-short\n"));
  for (const bool accepted : {false, true}) {
    SCOPED_TRACE(accepted ? "accepted_secret_files" : "secret_file");
    ClusterOptions o;
    o.secret_file = accepted ? secret_ : short_secret;
    if (accepted) o.accepted_secret_files = {short_secret};
    const std::string config = dir_ + "/short.yaml";
    ASSERT_TRUE(WriteFile(config, ClusterYaml(o)));
    ProcessResult r = RunProcess(
        {BinaryPath("tandem-router"), "--config", config, "--model", ModelPath()},
        absl::Seconds(20));
    EXPECT_TRUE(r.exited && r.exit_code == 1) << r.Describe();
    EXPECT_THAT(r.err, HasSubstr(absl::StrCat(
                           accepted ? "cluster.accepted_secret_files[0]" : "cluster.secret_file",
                           ": '", short_secret,
                           "' holds a secret of 9 bytes; at least 32 are required")));
    EXPECT_THAT(r.err, Not(HasSubstr("too-short")));
  }
}

}  // namespace
}  // namespace tandem::testing
