// KV events through real processes (docs/architecture.md, "KV events and
// the router's prefix index"): each worker's KvEvents stream fills the
// router's prefix index (ClusterStatus kv_index_blocks equals the worker's
// own kv_blocks_cached once the events arrived), and a worker that is
// SIGKILLed and started again has no index entries until it caches
// something again (its stream ended, the new instance's snapshot is empty).
#include <signal.h>

#include <string>

#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "tests/integration/cluster_fixture.h"
#include "tests/integration/generate_client.h"

namespace tandem::testing {
namespace {

using KvEventsTest = OwnClusterTest;

// The router's view of worker `name` in `status`; nullptr if not listed.
const v1::WorkerStatus* Find(const v1::ClusterStatus& status, const std::string& name) {
  for (const v1::WorkerStatus& w : status.workers()) {
    if (w.name() == name) return &w;
  }
  return nullptr;
}

TEST_F(KvEventsTest, RouterIndexFollowsTheWorkersCachesAndEmptiesOnRestart) {
  ClusterOptions options;
  options.capture_stderr = true;
  ASSERT_NO_FATAL_FAILURE(StartCluster(options));
  const GoldenCase& g = Golden("long_repeated_313tok");
  ASSERT_EQ(g.prompt_ids.size(), 313u);  // 19 full blocks of 16
  const StreamResult first = RunGenerate(cluster().stub(), MakeRequest(g.prompt, kGoldenMaxTokens));
  ExpectGolden(first, g, "remote");

  // Each worker's index count reaches its own cached count: P computed the
  // prompt (19 blocks), D received them and decoded on.
  v1::ClusterStatus last;
  auto index_matches = [&](const std::string& name, uint32_t* blocks) {
    absl::StatusOr<v1::ClusterStatus> status = cluster().ClusterStatus();
    if (!status.ok()) return false;
    last = *status;
    const v1::WorkerStatus* w = Find(last, name);
    if (w == nullptr || w->kv_blocks_cached() == 0) return false;
    *blocks = w->kv_index_blocks();
    return w->kv_index_blocks() == w->kv_blocks_cached();
  };
  uint32_t prefill_blocks = 0, decode_blocks = 0;
  ASSERT_TRUE(PollUntil(absl::Seconds(10), [&] {
    return index_matches(LocalCluster::kPrefillName, &prefill_blocks);
  })) << last.DebugString();
  EXPECT_EQ(prefill_blocks, 19u);
  ASSERT_TRUE(PollUntil(absl::Seconds(10), [&] {
    return index_matches(LocalCluster::kDecodeName, &decode_blocks);
  })) << last.DebugString();
  EXPECT_GE(decode_blocks, 19u);

  // decode-0 dies: its stream ends and the router drops its entries.
  ASSERT_EQ(kill(cluster().decode_pid(), SIGKILL), 0);
  auto decode_index = [&](uint32_t* blocks) {
    absl::StatusOr<v1::ClusterStatus> status = cluster().ClusterStatus();
    if (!status.ok()) return false;
    last = *status;
    const v1::WorkerStatus* w = Find(last, LocalCluster::kDecodeName);
    if (w == nullptr) return false;
    *blocks = w->kv_index_blocks();
    return true;
  };
  uint32_t blocks = 1;
  ASSERT_TRUE(PollUntil(absl::Seconds(10), [&] { return decode_index(&blocks) && blocks == 0; }))
      << last.DebugString();

  // Started again (a new instance at a new port, an empty cache): still
  // nothing once it serves, while prefill-0's entries are untouched.
  ASSERT_TRUE(cluster().RestartWorker(LocalCluster::kDecodeName).ok());
  ASSERT_TRUE(PollUntil(absl::Seconds(15), [&] {
    if (!decode_index(&blocks)) return false;
    const v1::WorkerStatus* d = Find(last, LocalCluster::kDecodeName);
    return last.can_serve() && d->healthy() && d->address() == cluster().decode_address();
  })) << last.DebugString();
  EXPECT_EQ(blocks, 0u);
  EXPECT_EQ(Find(last, LocalCluster::kDecodeName)->kv_blocks_cached(), 0u);
  EXPECT_EQ(Find(last, LocalCluster::kPrefillName)->kv_index_blocks(), prefill_blocks);

  // It caches again (a local prefill of the same prompt): the index follows
  // the new instance.
  const StreamResult again =
      RunGenerate(cluster().stub(), MakeRequest(g.prompt, kGoldenMaxTokens, v1::ROUTE_LOCAL));
  ExpectGolden(again, g, "local");
  ASSERT_TRUE(PollUntil(absl::Seconds(10), [&] {
    return index_matches(LocalCluster::kDecodeName, &decode_blocks);
  })) << last.DebugString();
  EXPECT_GE(decode_blocks, 19u);

  const std::string log = cluster().CapturedStderr();
  EXPECT_THAT(log, ::testing::HasSubstr("kv index: worker decode-0: "));
  EXPECT_THAT(log, ::testing::HasSubstr("blocks dropped (event stream ended"));
}

}  // namespace
}  // namespace tandem::testing
