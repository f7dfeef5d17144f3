// The issue #12 scenarios on a cluster started as users start one:
// `tandem up --prefill-workers 2 --decode-workers 2` on a model slow enough
// on the CPU (about 27M parameters, written by `tandem synth-model`) that a
// remote prefill and a stream are still running when the test acts.
// - SIGKILL of the prefill worker during a remote prefill: the request
//   completes on the other prefill worker (on_prefill_failure: retry) with
//   the ids of an undisturbed run.
// - SIGKILL of the decode worker mid-stream: the router migrates the stream
//   to the other decode worker; the client sees the ids of an undisturbed
//   run, without a gap.
// - SIGSTOP of one decode worker while the (one) prefill worker sends it KV: the
//   prefill worker's queue for it fills (kv.send_buffer_bytes) and only its
//   request waits; a request for the other decode worker completes.
// After each, `tandem status --check-idle` exits 0 (dead workers are
// dropped from the registry after router.drop_after_ms).
#include <signal.h>

#include <filesystem>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "gtest/gtest.h"
#include "tests/integration/cluster_fixture.h"
#include "tests/integration/generate_client.h"
#include "tests/integration/up_fixture.h"

namespace tandem::testing {
namespace {

class UpFailoverTest : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = MakeTempDir();
    model_ = WriteSlowModel(dir_);
    ASSERT_FALSE(model_.empty());
  }
  void TearDown() override {
    cluster_.reset();
    std::filesystem::remove_all(dir_);
  }

  // `prefill_workers` prefill + 2 decode workers; `send_buffer_bytes` is
  // kv.send_buffer_bytes.
  void Start(int prefill_workers = 2, int64_t send_buffer_bytes = 268435456) {
    UpClusterOptions o;
    o.prefill_workers = prefill_workers;
    o.cluster.model = model_;
    o.cluster.on_prefill_failure = "retry";
    o.cluster.enable_prefix_caching = false;  // undisturbed runs leave no cached prefix
    o.cluster.transfer_timeout_ms = 30000;
    o.cluster.drop_after_ms = 500;
    o.config_yaml = ClusterYaml(o.cluster);
    if (send_buffer_bytes != 268435456) {
      const std::string kv = "kv:\n";
      o.config_yaml.replace(o.config_yaml.find(kv), kv.size(),
                            absl::StrCat(kv, "  send_buffer_bytes: ", send_buffer_bytes, "\n"));
    }
    o.start_timeout = absl::Seconds(60);
    absl::StatusOr<std::unique_ptr<UpCluster>> started = UpCluster::Start(o);
    ASSERT_TRUE(started.ok()) << started.status();
    cluster_ = *std::move(started);
  }

  // A seeded request with a `prompt_tokens`-token prompt.
  v1::GenerateRequest Request(size_t prompt_tokens, uint32_t max_tokens, uint64_t seed) {
    absl::StatusOr<std::string> prompt = PromptWithTokenCount(cluster_->stub(), prompt_tokens);
    EXPECT_TRUE(prompt.ok()) << prompt.status();
    v1::GenerateRequest r = MakeRequest(prompt.value_or(""), max_tokens);
    SetSeededSampling(&r, 0.9f, seed);
    r.set_ignore_eos(true);
    return r;
  }

  // The worker of `role` the router sees holding KV blocks ("" if none
  // within `timeout`).
  std::string BusyWorker(v1::WorkerRole role, absl::Duration timeout) {
    std::string name;
    PollUntil(timeout, [&] {
      absl::StatusOr<v1::ClusterStatus> s = cluster_->ClusterStatus(absl::Seconds(1));
      if (!s.ok()) return false;
      for (const v1::WorkerStatus& w : s->workers()) {
        if (w.role() == role && w.kv_blocks_in_use() > 0) name = w.name();
      }
      return !name.empty();
    });
    return name;
  }

  // `tandem status --check-idle` exits 0 (within a few seconds: a killed
  // worker leaves the registry after drop_after_ms).
  void ExpectCheckIdle() {
    ProcessResult last;
    const bool idle = PollUntil(absl::Seconds(10), [&] {
      last = RunProcess({BinaryPath("tandem"), "status", "--check-idle", "--router",
                         cluster_->router_address()},
                        absl::Seconds(10));
      return last.exited && last.exit_code == 0;
    }, absl::Milliseconds(200));
    EXPECT_TRUE(idle) << last.Describe() << "\n" << last.out;
  }

  std::string dir_;
  std::string model_;
  std::unique_ptr<UpCluster> cluster_;
};

TEST_F(UpFailoverTest, KilledPrefillWorkerAndKilledDecodeWorkerKeepEveryId) {
  ASSERT_NO_FATAL_FAILURE(Start());
  // Undisturbed runs first (D prefills the long prompt itself: route LOCAL).
  v1::GenerateRequest remote = Request(400, 16, 11);
  v1::GenerateRequest local_ref = remote;
  local_ref.set_route_override(v1::ROUTE_LOCAL);
  const StreamResult remote_ref = RunGenerate(cluster_->stub(), local_ref, absl::Seconds(60));
  ASSERT_TRUE(remote_ref.status.ok()) << remote_ref.status.error_message();
  const v1::GenerateRequest stream = Request(8, 120, 12);
  const StreamResult stream_ref = RunGenerate(cluster_->stub(), stream, absl::Seconds(60));
  ASSERT_TRUE(stream_ref.status.ok()) << stream_ref.status.error_message();

  // A prefill worker dies during the remote prefill.
  {
    GenerateStream s(cluster_->stub(), remote, absl::Seconds(60));
    const std::string victim = BusyWorker(v1::ROLE_PREFILL, absl::Seconds(20));
    ASSERT_FALSE(victim.empty()) << "no prefill worker ever held the request's KV";
    ASSERT_EQ(kill(cluster_->pid(victim), SIGKILL), 0);
    const StreamResult& r = s.Finish();
    ASSERT_TRUE(r.status.ok()) << r.status.error_message();
    EXPECT_EQ(r.route, "remote");
    EXPECT_EQ(r.token_ids, remote_ref.token_ids);
    EXPECT_TRUE(cluster_->WaitForStderr(absl::StrCat(victim, " (pid"), absl::Seconds(5)));
  }
  ExpectCheckIdle();

  // A decode worker dies mid-stream.
  {
    GenerateStream s(cluster_->stub(), stream, absl::Seconds(60));
    while (s.result().token_ids.size() < 8 && s.ReadOne()) {
    }
    ASSERT_GE(s.result().token_ids.size(), 8u);
    const std::string victim = s.result().decode_worker;
    ASSERT_EQ(kill(cluster_->pid(victim), SIGKILL), 0);
    const StreamResult& r = s.Finish();
    ASSERT_TRUE(r.status.ok()) << r.status.error_message();
    EXPECT_EQ(r.token_ids, stream_ref.token_ids);
    EXPECT_TRUE(r.IndicesAreSequential());
    EXPECT_EQ(r.text, stream_ref.text);
    EXPECT_TRUE(cluster_->WaitForStderr("migrating to decode-", absl::Seconds(5)));
  }
  ExpectCheckIdle();
}

TEST_F(UpFailoverTest, StoppedDecodeWorkerDelaysOnlyItsOwnRemotePrefills) {
  // 1 MiB per destination: about 32 tokens of this model's KV (8 layers x
  // K and V x 512 floats), far less than one 700-token prompt.
  // One prefill worker serves both decode workers.
  ASSERT_NO_FATAL_FAILURE(Start(1, 1 << 20));
  const v1::GenerateRequest first = Request(700, 4, 21);
  const v1::GenerateRequest second = Request(600, 4, 22);
  GenerateStream blocked(cluster_->stub(), first, absl::Seconds(60));
  // Its decode worker holds the reservation; P computes and sends.
  const std::string stopped = BusyWorker(v1::ROLE_DECODE, absl::Seconds(20));
  ASSERT_FALSE(stopped.empty());
  ASSERT_EQ(kill(cluster_->pid(stopped), SIGSTOP), 0);
  ASSERT_TRUE(WaitStopped(cluster_->pid(stopped), absl::Seconds(5)));
  // The router now sends the next request to the other decode worker (it
  // has fewer requests); the same prefill worker serves it.
  const StreamResult r = RunGenerate(cluster_->stub(), second, absl::Seconds(40));
  EXPECT_TRUE(r.status.ok()) << r.status.error_message();
  EXPECT_EQ(r.route, "remote");
  EXPECT_NE(r.decode_worker, stopped);
  EXPECT_EQ(r.token_ids.size(), 4u);
  ASSERT_EQ(kill(cluster_->pid(stopped), SIGCONT), 0);
  blocked.Cancel();
  blocked.Finish();
  ExpectCheckIdle();
}

}  // namespace
}  // namespace tandem::testing
