// A busy prefill worker is not a failed one (issue #32, item 0; KV
// protocol v4): requests queued behind long steps on P must complete, with
// KV timeouts far shorter than the wait. P's every forward step takes
// 600 ms longer (--fault-backend-error slow@600) and takes one prompt per
// step (max_num_batched_tokens 128), so the last of eight concurrent
// remote prefills waits about 5 s on P; D's handshake and silence bounds
// are 300 ms and conditional.on_prefill_failure is `fail`, so any timeout
// would surface as a failed request instead of hiding behind a retry.
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "gtest/gtest.h"
#include "tests/integration/cluster_fixture.h"
#include "tests/integration/generate_client.h"

namespace tandem::testing {
namespace {

class BusyPrefillTest : public OwnClusterTest {};

TEST_F(BusyPrefillTest, QueuedRemotePrefillsOutwaitEveryKvTimeout) {
  ClusterOptions o;
  o.prefill_fault_backend_error = "slow@600";
  o.max_num_batched_tokens = 128;
  o.prefill_chunk_tokens = 128;
  o.transfer_timeout_ms = 300;
  o.handshake_timeout_ms = 300;
  o.on_prefill_failure = "fail";
  o.enable_prefix_caching = false;
  StartCluster(o);
  std::vector<v1::GenerateRequest> requests;
  for (int i = 0; i < 8; ++i) {
    // Prompts of about 100 tokens (over max_local_prefill_tokens 32), each
    // its own: one step of P apiece.
    absl::StatusOr<std::string> prompt =
        PromptWithTokenCount(cluster().stub(), 90 + i);
    ASSERT_TRUE(prompt.ok()) << prompt.status();
    requests.push_back(MakeRequest(*prompt, 4, v1::ROUTE_REMOTE));
  }
  const std::vector<StreamResult> results = RunConcurrently(cluster().stub(), requests);
  for (size_t i = 0; i < results.size(); ++i) {
    const StreamResult& r = results[i];
    EXPECT_TRUE(r.status.ok()) << "request " << i << ": " << r.status.error_message();
    EXPECT_EQ(r.route, "remote") << "request " << i;
    EXPECT_EQ(r.token_ids.size(), 4u) << "request " << i;
  }
}

}  // namespace
}  // namespace tandem::testing
