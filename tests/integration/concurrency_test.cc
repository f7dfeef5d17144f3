// No thread per request (issue #12, item 2): 1,000 concurrent Generate
// streams, half of them with prompts long enough for a remote prefill,
// started at once by an asynchronous client (gRPC callback reactors, no
// thread per stream), all complete with the ids of a sequential run, while
// the router's and the decode worker's thread counts (/proc/PID/status
// Threads:) stay bounded.
#include <sys/types.h>

#include <atomic>
#include <fstream>
#include <iostream>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "absl/strings/numbers.h"
#include "absl/strings/match.h"
#include "absl/synchronization/mutex.h"
#include "absl/synchronization/notification.h"
#include "gtest/gtest.h"
#include "tests/integration/cluster_fixture.h"
#include "tests/integration/generate_client.h"

namespace tandem::testing {
namespace {

constexpr int kStreams = 1000;
constexpr int kMaxThreads = 64;

// Threads of process `pid` (/proc/<pid>/status "Threads:"), -1 if unreadable.
int ThreadCount(pid_t pid) {
  std::ifstream in("/proc/" + std::to_string(pid) + "/status");
  std::string line;
  while (std::getline(in, line)) {
    if (!absl::StartsWith(line, "Threads:")) continue;
    int n = -1;
    return absl::SimpleAtoi(line.substr(8), &n) ? n : -1;
  }
  return -1;
}

// One asynchronous Generate stream: collects its token ids and status.
class AsyncStream final : public grpc::ClientReadReactor<v1::GenerateResponse> {
 public:
  AsyncStream(v1::Generation::Stub& stub, v1::GenerateRequest request,
              std::function<void()> on_done)
      : request_(std::move(request)), on_done_(std::move(on_done)) {
    context_.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(120));
    stub.async()->Generate(&context_, &request_, this);
    StartRead(&msg_);
    StartCall();
  }
  void OnReadDone(bool ok) override {
    if (!ok) return;
    for (const v1::TokenOutput& t : msg_.tokens()) ids_.push_back(t.token_id());
    StartRead(&msg_);
  }
  void OnDone(const grpc::Status& status) override {
    status_ = status;
    on_done_();
  }
  const std::vector<int32_t>& ids() const { return ids_; }
  const grpc::Status& status() const { return status_; }

 private:
  grpc::ClientContext context_;
  const v1::GenerateRequest request_;
  v1::GenerateResponse msg_;
  std::vector<int32_t> ids_;
  grpc::Status status_;
  std::function<void()> on_done_;
};

class ConcurrencyTest : public OwnClusterTest {};

TEST_F(ConcurrencyTest, ThousandStreamsHalfRemoteCompleteWithBoundedThreads) {
  ClusterOptions o;
  o.num_kv_blocks = 2048;
  o.max_num_seqs = 128;
  o.enable_prefix_caching = false;  // every long prompt goes remote
  ASSERT_NO_FATAL_FAILURE(StartCluster(o));
  absl::StatusOr<std::string> long_prompt = PromptWithTokenCount(cluster().stub(), 48);
  ASSERT_TRUE(long_prompt.ok()) << long_prompt.status();
  const v1::GenerateRequest short_request = MakeRequest("Once upon a time", 8);
  const v1::GenerateRequest long_request = MakeRequest(*long_prompt, 8);
  const StreamResult short_ref = RunGenerate(cluster().stub(), short_request);
  const StreamResult long_ref = RunGenerate(cluster().stub(), long_request);
  ASSERT_TRUE(short_ref.status.ok() && long_ref.status.ok());
  ASSERT_EQ(long_ref.route, "remote");

  std::atomic<int> left{kStreams};
  absl::Notification all_done;
  std::vector<std::unique_ptr<AsyncStream>> streams;
  streams.reserve(kStreams);
  for (int i = 0; i < kStreams; ++i) {
    streams.push_back(std::make_unique<AsyncStream>(
        cluster().stub(), i % 2 == 0 ? short_request : long_request, [&] {
          if (--left == 0) all_done.Notify();
        }));
  }
  int max_router = 0, max_decode = 0;
  while (!all_done.WaitForNotificationWithTimeout(absl::Milliseconds(20))) {
    max_router = std::max(max_router, ThreadCount(cluster().router_pid()));
    max_decode = std::max(max_decode, ThreadCount(cluster().decode_pid()));
  }
  ASSERT_TRUE(all_done.WaitForNotificationWithTimeout(absl::Seconds(120)));
  int ok = 0;
  for (int i = 0; i < kStreams; ++i) {
    const AsyncStream& s = *streams[i];
    ASSERT_TRUE(s.status().ok()) << "stream " << i << ": " << s.status().error_message();
    EXPECT_EQ(s.ids(), i % 2 == 0 ? short_ref.token_ids : long_ref.token_ids) << "stream " << i;
    ++ok;
  }
  EXPECT_EQ(ok, kStreams);
  EXPECT_GT(max_router, 0);
  EXPECT_LE(max_router, kMaxThreads) << "router threads";
  EXPECT_GT(max_decode, 0);
  EXPECT_LE(max_decode, kMaxThreads) << "decode worker threads";
  std::cerr << "max threads: router " << max_router << ", decode worker " << max_decode << "\n";
  v1::ClusterStatus last;
  EXPECT_TRUE(cluster().WaitForIdleWorkers(absl::Seconds(10), &last)) << last.DebugString();
}

}  // namespace
}  // namespace tandem::testing
