// Failover and migration across real processes (issue #12, item 4;
// docs/architecture.md, Failures): a prefill worker SIGKILLed during a
// remote prefill (retry on another prefill worker, local prefill, fail),
// no healthy prefill worker at all (D prefills long prompts itself), and a
// decode worker SIGKILLed mid-stream (the router migrates the stream to
// another decode worker, which continues at the next index). Each outcome
// is compared with an undisturbed run of the same seeded request on the
// same cluster: failover must not change a single id.
#include <signal.h>

#include <filesystem>
#include <memory>
#include <string>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "gtest/gtest.h"
#include "tests/integration/cluster_fixture.h"
#include "tests/integration/generate_client.h"

namespace tandem::testing {
namespace {

constexpr char kOtherPrefill[] = "prefill-1";

// Prefill workers prefill-0 (which stalls after its first KV frame, so a
// remote prefill is reliably in progress when the test kills it) and
// prefill-1, one decode worker; `policy` is conditional.on_prefill_failure.
ClusterOptions TwoPrefillOptions(const std::string& policy) {
  ClusterOptions o;
  o.num_prefill_workers = 2;
  o.on_prefill_failure = policy;
  o.prefill_fault_stall_after_frames = 1;
  // Only the kill may end the stalled transfer.
  o.transfer_timeout_ms = 30000;
  // The undisturbed run must not leave the prompt in D's prefix cache (D
  // would then prefill the second run itself).
  o.enable_prefix_caching = false;
  o.capture_stderr = true;
  return o;
}

// A seeded request whose 100-token prompt is prefilled remotely
// (max_local_prefill_tokens is 32 in the fixture).
v1::GenerateRequest LongRequest(LocalCluster& cluster) {
  absl::StatusOr<std::string> prompt = PromptWithTokenCount(cluster.stub(), 100);
  EXPECT_TRUE(prompt.ok()) << prompt.status();
  v1::GenerateRequest r = MakeRequest(prompt.value_or(""), 24);
  SetSeededSampling(&r, 0.8f, 4242);
  return r;
}

// The request prefilled by the decode worker itself: the undisturbed run
// (the CPU backend's local and remote prefill are bit-identical).
StreamResult Undisturbed(LocalCluster& cluster, v1::GenerateRequest request) {
  request.set_route_override(v1::ROUTE_LOCAL);
  return RunGenerate(cluster.stub(), request);
}

// The router's view of worker `name` (an empty status if it has none).
v1::WorkerStatus WorkerView(LocalCluster& cluster, const std::string& name) {
  absl::StatusOr<v1::ClusterStatus> status = cluster.ClusterStatus();
  if (status.ok()) {
    for (const v1::WorkerStatus& w : status->workers()) {
      if (w.name() == name) return w;
    }
  }
  return v1::WorkerStatus();
}

// Every healthy worker ends with no KV block in use and no transfer.
void ExpectHealthyWorkersIdle(LocalCluster& cluster) {
  v1::ClusterStatus last;
  const bool idle = PollUntil(absl::Seconds(10), [&] {
    absl::StatusOr<v1::ClusterStatus> status = cluster.ClusterStatus(absl::Seconds(1));
    if (!status.ok()) return false;
    last = *status;
    for (const v1::WorkerStatus& w : status->workers()) {
      if (w.healthy() && (w.kv_blocks_in_use() != 0 || w.transfers_in_flight() != 0)) {
        return false;
      }
    }
    return true;
  });
  EXPECT_TRUE(idle) << last.DebugString();
}

// Starts `request`, waits until prefill-0 holds its KV (stalled after the
// first frame), SIGKILLs prefill-0 and returns the finished stream.
StreamResult RunAndKillPrefill(LocalCluster& cluster, const v1::GenerateRequest& request) {
  GenerateStream stream(cluster.stub(), request);
  const bool prefilling = PollUntil(absl::Seconds(20), [&] {
    absl::StatusOr<v1::WorkerStatus> p = cluster.PrefillStatus(absl::Seconds(1));
    return p.ok() && p->kv_blocks_in_use() > 0;
  });
  EXPECT_TRUE(prefilling) << "prefill-0 never started the remote prefill";
  EXPECT_EQ(kill(cluster.worker_pid(LocalCluster::kPrefillName), SIGKILL), 0);
  return stream.Finish();
}

class PrefillFailoverTest : public OwnClusterTest {};

TEST_F(PrefillFailoverTest, RetryRunsTheNextAttemptOnAnotherPrefillWorkerWithTheSameIds) {
  ASSERT_NO_FATAL_FAILURE(StartCluster(TwoPrefillOptions("retry")));
  const v1::GenerateRequest request = LongRequest(cluster());
  const StreamResult reference = Undisturbed(cluster(), request);
  ASSERT_TRUE(reference.status.ok()) << reference.status.error_message();
  ASSERT_EQ(reference.token_ids.size(), 24u);

  const StreamResult r = RunAndKillPrefill(cluster(), request);
  ASSERT_TRUE(r.status.ok()) << r.status.error_message();
  EXPECT_EQ(r.route, "remote");
  EXPECT_EQ(r.prefill_worker, LocalCluster::kPrefillName);  // the first attempt's
  // The last message names who served: attempt 2's prefill worker.
  EXPECT_EQ(r.served_route, "remote");
  EXPECT_EQ(r.served_prefill_worker, kOtherPrefill);
  EXPECT_EQ(r.served_decode_worker, LocalCluster::kDecodeName);
  EXPECT_EQ(r.token_ids, reference.token_ids);
  EXPECT_TRUE(r.IndicesAreSequential());
  // Attempt 2 was prefilled by the other prefill worker.
  EXPECT_TRUE(PollUntil(absl::Seconds(5), [&] {
    return WorkerView(cluster(), kOtherPrefill).prefill_tokens_computed_total() > 0;
  }));
  ExpectHealthyWorkersIdle(cluster());
}

TEST_F(PrefillFailoverTest, LocalPolicyPrefillsOnTheDecodeWorkerWithTheSameIds) {
  ASSERT_NO_FATAL_FAILURE(StartCluster(TwoPrefillOptions("local")));
  const v1::GenerateRequest request = LongRequest(cluster());
  const StreamResult reference = Undisturbed(cluster(), request);
  ASSERT_TRUE(reference.status.ok()) << reference.status.error_message();

  const StreamResult r = RunAndKillPrefill(cluster(), request);
  ASSERT_TRUE(r.status.ok()) << r.status.error_message();
  EXPECT_EQ(r.token_ids, reference.token_ids);
  // The header named prefill-0; the decode worker prefilled in the end.
  EXPECT_EQ(r.prefill_worker, LocalCluster::kPrefillName);
  EXPECT_EQ(r.served_route, "local");
  EXPECT_EQ(r.served_prefill_worker, "");
  EXPECT_EQ(WorkerView(cluster(), kOtherPrefill).prefill_tokens_computed_total(), 0u);
  ExpectHealthyWorkersIdle(cluster());
}

TEST_F(PrefillFailoverTest, FailPolicyEndsTheRequestUnavailableNamingTheAttempt) {
  ASSERT_NO_FATAL_FAILURE(StartCluster(TwoPrefillOptions("fail")));
  const StreamResult r = RunAndKillPrefill(cluster(), LongRequest(cluster()));
  EXPECT_EQ(r.status.error_code(), grpc::StatusCode::UNAVAILABLE);
  EXPECT_TRUE(absl::StrContains(r.status.error_message(), "remote prefill failed (attempt 1)"))
      << r.status.error_message();
  ExpectHealthyWorkersIdle(cluster());
}

TEST_F(PrefillFailoverTest, NoHealthyPrefillWorkerMeansLongPromptsArePrefilledLocally) {
  ClusterOptions o;  // one prefill worker, on_prefill_failure: fail
  o.enable_prefix_caching = false;
  o.capture_stderr = true;
  ASSERT_NO_FATAL_FAILURE(StartCluster(o));
  const v1::GenerateRequest request = LongRequest(cluster());
  const StreamResult reference = Undisturbed(cluster(), request);
  ASSERT_TRUE(reference.status.ok()) << reference.status.error_message();

  ASSERT_EQ(kill(cluster().prefill_pid(), SIGKILL), 0);
  // The registry marks it unhealthy after unhealthy_after_missed_polls
  // failed polls (each fails at once: connection refused).
  absl::SleepFor(absl::Milliseconds(o.poll_interval_ms * (o.unhealthy_after_missed_polls + 2)));
  ASSERT_TRUE(PollUntil(absl::Seconds(10), [&] {
    absl::StatusOr<v1::ClusterStatus> s = cluster().ClusterStatus(absl::Seconds(1));
    if (!s.ok() || !s->can_serve()) return false;
    for (const v1::WorkerStatus& w : s->workers()) {
      if (w.name() == LocalCluster::kPrefillName && w.healthy()) return false;
    }
    return true;
  })) << "the router did not mark prefill-0 unhealthy while still serving";

  const StreamResult r = RunGenerate(cluster().stub(), request);
  ASSERT_TRUE(r.status.ok()) << r.status.error_message();
  EXPECT_EQ(r.route, "local");
  EXPECT_EQ(r.token_ids, reference.token_ids);
  ExpectHealthyWorkersIdle(cluster());
}

// P writes FINAL and then its reply is lost (--fault-fail-reply): D holds
// the KV and decodes from index 1 while token 0 never reaches the router,
// unless D saw the router's AbortTransfer first and prefilled itself.
// Either way the client gets the undisturbed ids (the router runs the
// request again when it is left without token 0).
TEST_F(PrefillFailoverTest, ReplyLostAfterFinalStillGivesTheSameIds) {
  ClusterOptions o;
  o.on_prefill_failure = "retry";
  o.prefill_fault_fail_reply = true;
  o.enable_prefix_caching = false;
  o.capture_stderr = true;
  ASSERT_NO_FATAL_FAILURE(StartCluster(o));
  const v1::GenerateRequest request = LongRequest(cluster());
  const StreamResult reference = Undisturbed(cluster(), request);
  ASSERT_TRUE(reference.status.ok()) << reference.status.error_message();
  for (int i = 0; i < 3; ++i) {
    const StreamResult r = RunGenerate(cluster().stub(), request);
    ASSERT_TRUE(r.status.ok()) << r.status.error_message();
    EXPECT_EQ(r.token_ids, reference.token_ids) << "run " << i;
    EXPECT_TRUE(r.IndicesAreSequential());
  }
  ExpectHealthyWorkersIdle(cluster());
}

// ---- Migration -----------------------------------------------------------------

class MigrationE2ETest : public SlowModelClusterTest {
 protected:
  ClusterOptions Options(int32_t max_migrations) const {
    ClusterOptions o;
    o.model = model_;
    o.num_prefill_workers = 0;
    o.num_decode_workers = 2;
    o.max_migrations = max_migrations;
    o.capture_stderr = true;
    o.start_timeout = absl::Seconds(60);
    return o;
  }
  // Seeded sampling over 160 tokens of a short prompt.
  static v1::GenerateRequest Request() {
    v1::GenerateRequest r = MakeRequest("Once upon a time, there was", 160);
    SetSeededSampling(&r, 0.9f, 77);
    r.mutable_sampling()->set_top_k(40);
    r.set_ignore_eos(true);
    return r;
  }
  // Reads until `k` tokens arrived, SIGKILLs the stream's decode worker
  // and reads the rest.
  StreamResult RunAndKillDecode(size_t k) {
    GenerateStream stream(cluster().stub(), Request(), absl::Seconds(120));
    while (stream.result().token_ids.size() < k && stream.ReadOne()) {
    }
    EXPECT_GE(stream.result().token_ids.size(), k) << "the stream ended before the kill";
    victim_ = stream.result().decode_worker;
    EXPECT_EQ(kill(cluster().worker_pid(victim_), SIGKILL), 0);
    return stream.Finish();
  }

  std::string victim_;  // the decode worker RunAndKillDecode killed
};

TEST_F(MigrationE2ETest, DecodeWorkerKilledMidStreamContinuesOnAnotherWithTheSameIds) {
  ASSERT_NO_FATAL_FAILURE(StartCluster(Options(1)));
  const StreamResult reference = RunGenerate(cluster().stub(), Request(), absl::Seconds(120));
  ASSERT_TRUE(reference.status.ok()) << reference.status.error_message();
  ASSERT_EQ(reference.token_ids.size(), 160u);

  const StreamResult r = RunAndKillDecode(8);
  ASSERT_TRUE(r.status.ok()) << r.status.error_message();
  EXPECT_EQ(r.token_ids, reference.token_ids);  // no gap, no duplicate, same ids
  EXPECT_TRUE(r.IndicesAreSequential());
  EXPECT_EQ(r.text, reference.text);
  EXPECT_EQ(r.finish_reason, v1::FINISH_LENGTH);
  const std::string survivor = victim_ == "decode-0" ? "decode-1" : "decode-0";
  EXPECT_EQ(r.decode_worker, victim_);          // the header's first pick
  EXPECT_EQ(r.served_decode_worker, survivor);  // who finished it
  EXPECT_TRUE(absl::StrContains(cluster().CapturedStderr(), "migrating to " + survivor))
      << cluster().CapturedStderr();
  ExpectHealthyWorkersIdle(cluster());
}

// Two of three decode workers die at once: a stream may first be moved to
// the other dying worker (not yet known dead); that stream breaks before it
// answers, which costs no migration, and the request lands on the survivor.
TEST_F(MigrationE2ETest, TwoDecodeWorkersKilledAtOnceEveryStreamEndsOnTheThird) {
  ClusterOptions o = Options(1);
  o.num_decode_workers = 3;
  ASSERT_NO_FATAL_FAILURE(StartCluster(o));
  const StreamResult reference = RunGenerate(cluster().stub(), Request(), absl::Seconds(120));
  ASSERT_TRUE(reference.status.ok()) << reference.status.error_message();

  std::vector<std::unique_ptr<GenerateStream>> streams;
  for (int i = 0; i < 6; ++i) {
    streams.push_back(
        std::make_unique<GenerateStream>(cluster().stub(), Request(), absl::Seconds(120)));
  }
  for (auto& s : streams) {
    while (s->result().token_ids.size() < 4 && s->ReadOne()) {
    }
  }
  ASSERT_EQ(kill(cluster().worker_pid("decode-0"), SIGKILL), 0);
  ASSERT_EQ(kill(cluster().worker_pid("decode-1"), SIGKILL), 0);
  for (size_t i = 0; i < streams.size(); ++i) {
    const StreamResult& r = streams[i]->Finish();
    ASSERT_TRUE(r.status.ok()) << "stream " << i << ": " << r.status.error_message();
    EXPECT_EQ(r.token_ids, reference.token_ids) << "stream " << i;
  }
  ExpectHealthyWorkersIdle(cluster());
}

// A rolling update: the stream's decode worker gets SIGTERM and drains for
// shutdown_grace_s (1 s), shorter than the stream; the stream it then ends
// ("shutting down") moves to the other decode worker instead of failing,
// with the same ids.
TEST_F(MigrationE2ETest, DecodeWorkerDrainingPastItsGraceHandsTheStreamOver) {
  ASSERT_NO_FATAL_FAILURE(StartCluster(Options(1)));
  // Long enough to outlast the 1 s grace on a fast core (~5 ms a token).
  v1::GenerateRequest request = Request();
  request.set_max_tokens(600);
  const StreamResult reference = RunGenerate(cluster().stub(), request, absl::Seconds(120));
  ASSERT_TRUE(reference.status.ok()) << reference.status.error_message();

  GenerateStream stream(cluster().stub(), request, absl::Seconds(120));
  while (stream.result().token_ids.size() < 8 && stream.ReadOne()) {
  }
  ASSERT_GE(stream.result().token_ids.size(), 8u) << "the stream ended before the SIGTERM";
  const std::string victim = stream.result().decode_worker;
  ASSERT_EQ(kill(cluster().worker_pid(victim), SIGTERM), 0);
  const StreamResult& r = stream.Finish();
  ASSERT_TRUE(r.status.ok()) << r.status.error_message();
  EXPECT_EQ(r.token_ids, reference.token_ids);
  EXPECT_TRUE(r.IndicesAreSequential());
  const std::string survivor = victim == "decode-0" ? "decode-1" : "decode-0";
  const std::string log = cluster().CapturedStderr();
  // The router saw the stream end "shutting down" and found the worker
  // gone (probe failed) or going (answered with ready = false): either way
  // the stream moved on, naming why.
  bool moved = false;
  for (const std::string& line : Lines(log)) {
    moved |= absl::StrContains(line, "decode worker " + victim) &&
             absl::StrContains(line, "shutting down") &&
             absl::StrContains(line, "migrating to " + survivor);
  }
  EXPECT_TRUE(moved) << log;
}

// n > 1 (issue #32): every sample migrates with its own tokens so far and
// each ends exactly as in an undisturbed run (seeded sampling: sample s
// draws with its own seed on whichever decode worker runs it).
TEST_F(MigrationE2ETest, EverySampleOfAnNRequestContinuesOnAnotherWithTheSameIds) {
  ASSERT_NO_FATAL_FAILURE(StartCluster(Options(1)));
  v1::GenerateRequest request = Request();
  request.set_max_tokens(64);
  request.set_n(4);
  const StreamResult reference = RunGenerate(cluster().stub(), request, absl::Seconds(120));
  ASSERT_TRUE(reference.status.ok()) << reference.status.error_message();
  ASSERT_EQ(reference.samples.size(), 4u);

  GenerateStream stream(cluster().stub(), request, absl::Seconds(120));
  while (stream.result().token_ids.size() < 12 && stream.ReadOne()) {
  }
  ASSERT_GE(stream.result().token_ids.size(), 12u) << "the stream ended before the kill";
  victim_ = stream.result().decode_worker;
  ASSERT_EQ(kill(cluster().worker_pid(victim_), SIGKILL), 0);
  const StreamResult& r = stream.Finish();
  ASSERT_TRUE(r.status.ok()) << r.status.error_message();
  ASSERT_EQ(r.samples.size(), 4u);
  for (size_t s = 0; s < 4; ++s) {
    SCOPED_TRACE(s);
    EXPECT_EQ(r.samples[s].token_ids, reference.samples[s].token_ids);
    EXPECT_TRUE(r.samples[s].IndicesAreSequential());
    EXPECT_EQ(r.samples[s].text, reference.samples[s].text);
    EXPECT_EQ(r.samples[s].finish_reason, v1::FINISH_LENGTH);
  }
  const std::string survivor = victim_ == "decode-0" ? "decode-1" : "decode-0";
  EXPECT_EQ(r.served_decode_worker, survivor);
  EXPECT_TRUE(absl::StrContains(cluster().CapturedStderr(), "migrating to " + survivor))
      << cluster().CapturedStderr();
  ExpectHealthyWorkersIdle(cluster());
}

TEST_F(MigrationE2ETest, WithoutMigrationsTheStreamEndsUnavailableNamingTheWorker) {
  ASSERT_NO_FATAL_FAILURE(StartCluster(Options(0)));
  const StreamResult r = RunAndKillDecode(8);
  EXPECT_EQ(r.status.error_code(), grpc::StatusCode::UNAVAILABLE);
  EXPECT_TRUE(absl::StrContains(r.status.error_message(), "decode worker " + victim_))
      << r.status.error_message();
}

}  // namespace
}  // namespace tandem::testing
