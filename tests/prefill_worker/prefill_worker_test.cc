// The prefill worker's engine (the engine core with Prefill calls through
// SubmitPrefill and the KV sender as their export, as
// prefill_worker/main.cc builds it) with a real KvReceiver in the test
// playing the decode worker: token 0 against stories260K's goldens, the K/V
// bytes against a plain LlamaModel::Forward, and the failure paths (no
// listener, layout mismatch, cancel during a stalled transfer).
#include "prefill_worker/prefill_call.h"

#include <cstring>
#include <memory>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "absl/time/time.h"
#include "gtest/gtest.h"
#include "kvtransfer/kv_transfer.h"
#include "kvtransfer/tcp.h"
#include "tests/decode_worker/worker_test_util.h"

namespace tandem::prefill {
namespace {

using worker_testing::Golden;
using worker_testing::GoldenCase;
using worker_testing::KvDoneRecorder;
using worker_testing::PrefillDoneRecorder;
using worker_testing::StoriesKvBytes;
using core::FinishReason;
using PrefillStats = core::CoreStats;
using PrefillEngine = worker_testing::TestPrefillWorker;
using PrefillEngineOptions = worker_testing::WorkerOptions;

constexpr char kFingerprint[] = "stories260K-test-fingerprint";
// D's block size differs from P's (16) on purpose: the wire format is
// token-addressed.
constexpr int32_t kReceiverBlockSize = 7;

// The test's decode side: a KvReceiver writing into its own KV storage.
// `receiver` is declared last so it is destroyed first: its destructor runs
// `done` for a pending transfer, which needs the writer and the recorder.
struct TestReceiver {
  std::unique_ptr<kv::CpuKvStorage> pool;
  std::unique_ptr<worker_testing::PoolKvWriter> writer;
  KvDoneRecorder done;
  std::unique_ptr<kvtransfer::KvReceiver> receiver;

  std::string endpoint() const { return absl::StrCat("127.0.0.1:", receiver->port()); }
};

class PrefillWorkerTest : public worker_testing::StoriesTest {
 protected:
  static PrefillEngineOptions Options() {
    PrefillEngineOptions o;
    o.block_size = 16;
    o.num_kv_blocks = 64;
    o.transfer_timeout_ms = 2000;
    o.fingerprint = kFingerprint;
    return o;
  }

  // Starts a receiver with `fingerprint` and expects (id, 1, hit, L).
  std::unique_ptr<TestReceiver> StartReceiver(const std::string& id, uint32_t prompt_len,
                                              uint32_t hit_tokens,
                                              const std::string& fingerprint = kFingerprint) {
    auto r = std::make_unique<TestReceiver>();
    kvtransfer::KvReceiver::Options options;
    options.handshake_timeout_ms = 2000;
    options.transfer_timeout_ms = 2000;
    auto receiver = kvtransfer::KvReceiver::Start(
        options, worker_testing::StoriesLayout(model(), fingerprint));
    EXPECT_TRUE(receiver.ok()) << receiver.status();
    if (!receiver.ok()) return nullptr;
    r->receiver = *std::move(receiver);
    const int32_t blocks =
        kv::BlocksForTokens(static_cast<int32_t>(prompt_len), kReceiverBlockSize);
    r->pool = std::make_unique<kv::CpuKvStorage>(model().kv_shape(kReceiverBlockSize), blocks);
    std::vector<int32_t> table;
    for (int32_t b = blocks - 1; b >= 0; --b) table.push_back(b);  // any order works
    r->writer = std::make_unique<worker_testing::PoolKvWriter>(r->pool.get(), table);
    absl::Status s = r->receiver->Expect(id, 1, hit_tokens, prompt_len, r->writer.get(),
                                         r->done.Callback());
    EXPECT_TRUE(s.ok()) << s;
    return r;
  }

  static PrefillRequest Request(const std::string& id, const GoldenCase& c, int32_t max_tokens,
                                const std::string& endpoint, uint32_t hit_tokens = 0) {
    PrefillRequest r;
    r.request_id = id;
    r.prompt = c.prompt;
    r.max_tokens = max_tokens;
    r.kv_target.endpoint = endpoint;
    r.kv_target.attempt = 1;
    r.kv_target.hit_tokens = hit_tokens;
    return r;
  }

  // Every layer's K/V rows of [from, L) in the receiver's pool equal the
  // reference forward's, bit for bit; rows below `from` were never written
  // (the pool starts zeroed).
  void ExpectReceivedRowsMatch(const TestReceiver& r, const GoldenCase& c, int32_t from) {
    const int32_t len = static_cast<int32_t>(c.prompt.size());
    worker_testing::PromptKv ref = worker_testing::ComputePromptKv(model(), c.prompt, 16);
    for (int32_t layer = 0; layer < model().config().n_layers; ++layer) {
      SCOPED_TRACE(absl::StrCat("layer ", layer));
      std::vector<float> want = worker_testing::LayerRows(*ref.pool, ref.table, layer, from,
                                                          len - from);
      std::vector<float> got = worker_testing::LayerRows(*r.pool, r.writer->table(), layer,
                                                         from, len - from);
      ASSERT_EQ(got.size(), want.size());
      EXPECT_EQ(std::memcmp(got.data(), want.data(), got.size() * sizeof(float)), 0);
      if (from > 0) {
        std::vector<float> below =
            worker_testing::LayerRows(*r.pool, r.writer->table(), layer, 0, from);
        EXPECT_EQ(below, std::vector<float>(below.size(), 0.0f));
      }
    }
  }
};

TEST_F(PrefillWorkerTest, StreamsPromptKvAndReturnsGoldenFirstToken) {
  PrefillEngine engine(Options(), &model());
  uint64_t bytes_total = 0;
  for (const char* name : {"once_upon_a_time", "long_repeated_313tok"}) {
    SCOPED_TRACE(name);
    const GoldenCase c = Golden(name);
    const uint32_t len = static_cast<uint32_t>(c.prompt.size());
    auto r = StartReceiver(name, len, 0);
    ASSERT_NE(r, nullptr);
    PrefillDoneRecorder done;
    engine.Submit(Request(name, c, 32, r->endpoint()), done.Callback());
    auto result = done.Wait();
    ASSERT_TRUE(result.has_value());
    ASSERT_TRUE(result->ok()) << result->status();
    EXPECT_EQ((*result)->samples.at(0).token.token_id, c.generated[0]);
    EXPECT_EQ((*result)->samples.at(0).finish_reason, FinishReason::kNone);
    EXPECT_EQ((*result)->prompt_tokens_computed, len);
    EXPECT_EQ((*result)->kv_bytes_sent, StoriesKvBytes(len));

    ASSERT_TRUE(r->done.Wait());
    ASSERT_TRUE(r->done.status().ok()) << r->done.status();
    kvtransfer::TransferResult final = r->done.result();
    ASSERT_EQ(final.samples.size(), 1u);
    EXPECT_EQ(final.samples[0].token, c.generated[0]);
    EXPECT_EQ(final.samples[0].logprob, (*result)->samples.at(0).token.logprob);
    EXPECT_EQ(final.samples[0].finish_reason, 0u);
    EXPECT_TRUE(final.samples[0].top_logprobs.empty());  // logprobs 0
    EXPECT_EQ(final.frames, static_cast<uint64_t>(worker_testing::kStoriesLayers));
    EXPECT_EQ(final.kv_bytes, StoriesKvBytes(len));
    EXPECT_EQ(r->receiver->kv_bytes_received_total(), StoriesKvBytes(len));
    ExpectReceivedRowsMatch(*r, c, 0);
    bytes_total += StoriesKvBytes(len);
  }
  PrefillStats stats = engine.GetStats();
  EXPECT_EQ(stats.kv_blocks_in_use, 0u);
  EXPECT_EQ(stats.kv_blocks_total, 64u);
  EXPECT_EQ(stats.transfers_in_flight, 0u);
  EXPECT_EQ(stats.running_requests, 0u);
  EXPECT_EQ(stats.prefill_tokens_computed_total, 5u + 313u);
  EXPECT_EQ(stats.kv_bytes_sent_total, bytes_total);
}

TEST_F(PrefillWorkerTest, HitTokensLimitWhatIsSent) {
  PrefillEngine engine(Options(), &model());
  const GoldenCase c = Golden("boundary_33tok");
  const uint32_t len = static_cast<uint32_t>(c.prompt.size());
  ASSERT_EQ(len, 33u);
  auto r = StartReceiver("hit", len, 16);
  ASSERT_NE(r, nullptr);
  PrefillDoneRecorder done;
  engine.Submit(Request("hit", c, 32, r->endpoint(), 16), done.Callback());
  auto result = done.Wait();
  ASSERT_TRUE(result.has_value());
  ASSERT_TRUE(result->ok()) << result->status();
  EXPECT_EQ((*result)->samples.at(0).token.token_id, c.generated[0]);
  EXPECT_EQ((*result)->prompt_tokens_computed, len);  // P computes all of [0, L)
  EXPECT_EQ((*result)->kv_bytes_sent, StoriesKvBytes(len - 16));
  ASSERT_TRUE(r->done.Wait());
  ASSERT_TRUE(r->done.status().ok()) << r->done.status();
  EXPECT_EQ(r->done.result().kv_bytes, StoriesKvBytes(len - 16));
  EXPECT_EQ(r->receiver->kv_bytes_received_total(), StoriesKvBytes(len - 16));
  ExpectReceivedRowsMatch(*r, c, 16);
}

TEST_F(PrefillWorkerTest, MaxTokensOneFinishesWithLength) {
  PrefillEngine engine(Options(), &model());
  const GoldenCase c = Golden("lily_and_ben");
  auto r = StartReceiver("one", static_cast<uint32_t>(c.prompt.size()), 0);
  ASSERT_NE(r, nullptr);
  PrefillDoneRecorder done;
  engine.Submit(Request("one", c, 1, r->endpoint()), done.Callback());
  auto result = done.Wait();
  ASSERT_TRUE(result.has_value());
  ASSERT_TRUE(result->ok()) << result->status();
  EXPECT_EQ((*result)->samples.at(0).token.token_id, c.generated[0]);
  EXPECT_EQ((*result)->samples.at(0).finish_reason, FinishReason::kLength);
  ASSERT_TRUE(r->done.Wait());
  ASSERT_TRUE(r->done.status().ok()) << r->done.status();
  const kvtransfer::TransferResult final = r->done.result();
  ASSERT_EQ(final.samples.size(), 1u);
  EXPECT_EQ(final.samples[0].token, c.generated[0]);
  EXPECT_EQ(final.samples[0].finish_reason, static_cast<uint32_t>(FinishReason::kLength));
}

TEST_F(PrefillWorkerTest, NothingListeningIsUnavailable) {
  PrefillEngine engine(Options(), &model());
  std::string endpoint;
  {
    // A port that was just ours and is closed now.
    auto r = StartReceiver("gone", 5, 0);
    ASSERT_NE(r, nullptr);
    endpoint = r->endpoint();
  }
  PrefillDoneRecorder done;
  engine.Submit(Request("gone", Golden("once_upon_a_time"), 4, endpoint), done.Callback());
  auto result = done.Wait();
  ASSERT_TRUE(result.has_value());
  EXPECT_EQ(result->status().code(), absl::StatusCode::kUnavailable) << result->status();
  EXPECT_EQ(engine.GetStats().kv_blocks_in_use, 0u);
  EXPECT_EQ(engine.GetStats().transfers_in_flight, 0u);
}

TEST_F(PrefillWorkerTest, LayoutMismatchIsFailedPrecondition) {
  PrefillEngine engine(Options(), &model());
  const GoldenCase c = Golden("once_upon_a_time");
  auto r = StartReceiver("mismatch", static_cast<uint32_t>(c.prompt.size()), 0,
                         "another-model-fingerprint");
  ASSERT_NE(r, nullptr);
  PrefillDoneRecorder done;
  engine.Submit(Request("mismatch", c, 4, r->endpoint()), done.Callback());
  auto result = done.Wait();
  ASSERT_TRUE(result.has_value());
  EXPECT_EQ(result->status().code(), absl::StatusCode::kFailedPrecondition)
      << result->status();
  EXPECT_EQ(engine.GetStats().kv_blocks_in_use, 0u);
  EXPECT_EQ(r->receiver->kv_bytes_received_total(), 0u);
}

// Issue #16: D offers only what this worker (tcp only, no data planes)
// lacks: the request fails FAILED_PRECONDITION naming both, before any
// HELLO, and holds no block.
TEST_F(PrefillWorkerTest, NoCommonKvTransportFailsTheRequest) {
  PrefillEngine engine(Options(), &model());
  const GoldenCase c = Golden("once_upon_a_time");
  auto r = StartReceiver("nccl-only", static_cast<uint32_t>(c.prompt.size()), 0);
  ASSERT_NE(r, nullptr);
  PrefillRequest req = Request("nccl-only", c, 4, r->endpoint());
  req.kv_target.kv_transports = {"nccl"};
  req.kv_target.kv_host_id = "another-host";
  PrefillDoneRecorder done;
  engine.Submit(std::move(req), done.Callback());
  auto result = done.Wait();
  ASSERT_TRUE(result.has_value());
  EXPECT_EQ(result->status().code(), absl::StatusCode::kFailedPrecondition)
      << result->status();
  EXPECT_EQ(result->status().message(),
            absl::StrCat("KV transport for ", r->endpoint(),
                         ": no common KV transport: this prefill worker supports tcp, the "
                         "decode worker offers nccl"));
  EXPECT_EQ(r->done.calls(), 0);  // no HELLO reached D
  EXPECT_EQ(engine.GetStats().kv_blocks_in_use, 0u);
  // An offer with tcp in it is served over tcp.
  PrefillRequest both = Request("nccl-only", c, 4, r->endpoint());
  both.kv_target.kv_transports = {"nccl", "tcp"};
  PrefillDoneRecorder served;
  engine.Submit(std::move(both), served.Callback());
  auto ok = served.Wait();
  ASSERT_TRUE(ok.has_value());
  ASSERT_TRUE(ok->ok()) << ok->status();
  ASSERT_TRUE(r->done.Wait());
  EXPECT_TRUE(r->done.status().ok()) << r->done.status();
}

TEST_F(PrefillWorkerTest, InvalidRequestsFailWithoutConnecting) {
  PrefillEngine engine(Options(), &model());
  const GoldenCase c = Golden("once_upon_a_time");
  auto r = StartReceiver("never", static_cast<uint32_t>(c.prompt.size()), 0);
  ASSERT_NE(r, nullptr);
  std::vector<PrefillRequest> bad;
  bad.push_back(Request("never", c, 0, r->endpoint()));                      // max_tokens
  bad.push_back(Request("never", c, 4, r->endpoint(), 6));                   // hit > L
  bad.push_back(Request("never", c, 4, r->endpoint()));
  bad.back().prompt.push_back(worker_testing::kStoriesVocab);                // token id
  bad.push_back(Request("never", c, 4, r->endpoint()));
  bad.back().prompt.clear();                                                 // empty
  for (PrefillRequest& req : bad) {
    PrefillDoneRecorder done;
    engine.Submit(std::move(req), done.Callback());
    auto result = done.Wait();
    ASSERT_TRUE(result.has_value());
    EXPECT_EQ(result->status().code(), absl::StatusCode::kInvalidArgument)
        << result->status();
  }
  EXPECT_EQ(r->receiver->kv_bytes_received_total(), 0u);
  EXPECT_EQ(r->done.calls(), 0);  // no HELLO ever reached D
  EXPECT_EQ(engine.GetStats().kv_blocks_in_use, 0u);
}

TEST_F(PrefillWorkerTest, CancelDuringStalledTransferIsCancelled) {
  PrefillEngineOptions options = Options();
  options.fault_stall_after_frames = 1;
  PrefillEngine engine(options, &model());
  const GoldenCase c = Golden("lily_and_ben");
  const uint32_t len = static_cast<uint32_t>(c.prompt.size());
  auto r = StartReceiver("stall", len, 0);
  ASSERT_NE(r, nullptr);
  PrefillDoneRecorder done;
  engine.Submit(Request("stall", c, 4, r->endpoint()), done.Callback());
  // Wait (bounded) until exactly one layer's frame has arrived.
  const absl::Time deadline = absl::Now() + absl::Seconds(2);
  while (r->receiver->kv_bytes_received_total() < StoriesKvBytes(len) / 5 &&
         absl::Now() < deadline) {
    absl::SleepFor(absl::Milliseconds(5));
  }
  ASSERT_EQ(r->receiver->kv_bytes_received_total(), StoriesKvBytes(len) / 5);
  EXPECT_EQ(done.calls(), 0);  // stalled, not finished
  engine.Cancel("stall");
  auto result = done.Wait(absl::Seconds(1));
  ASSERT_TRUE(result.has_value());
  EXPECT_EQ(result->status().code(), absl::StatusCode::kCancelled) << result->status();
  EXPECT_EQ(engine.GetStats().kv_blocks_in_use, 0u);
  EXPECT_EQ(engine.GetStats().transfers_in_flight, 0u);
  // D sees the transfer end without FINAL.
  ASSERT_TRUE(r->done.Wait());
  EXPECT_FALSE(r->done.status().ok());
}

// One decode worker that never answers (its listener never accepts: the
// HELLO sits in the kernel, no ACCEPT comes) fills its send budget; a
// second request to it waits without computing, and a request to another
// decode worker completes meanwhile. The engine loop never blocks on the
// silent one.
TEST_F(PrefillWorkerTest, StalledDecodeWorkerDoesNotBlockAnother) {
  const GoldenCase stuck_case = Golden("lily_and_ben");
  const uint32_t stuck_len = static_cast<uint32_t>(stuck_case.prompt.size());
  PrefillEngineOptions options = Options();
  options.transfer_timeout_ms = 10000;  // the silent receiver is cancelled long before
  // Half a prompt's K/V: the first request's frames fill it (they are all
  // queued in one step, whatever the budget), the second must wait.
  options.send_buffer_bytes = StoriesKvBytes(stuck_len) / 2;
  PrefillEngine engine(options, &model());
  int silent_port = 0;
  auto silent = kvtransfer::tcp::Listen("127.0.0.1", 0, &silent_port);
  ASSERT_TRUE(silent.ok()) << silent.status();
  const std::string silent_endpoint = absl::StrCat("127.0.0.1:", silent_port);

  PrefillDoneRecorder stuck, waiting;
  engine.Submit(Request("stuck", stuck_case, 4, silent_endpoint), stuck.Callback());
  // Once its frames are queued (a request asked for room in the same step
  // would get it too: the budget is checked per step).
  const absl::Time deadline = absl::Now() + absl::Seconds(3);
  while (engine.GetStats().prefill_tokens_computed_total < stuck_len &&
         absl::Now() < deadline) {
    absl::SleepFor(absl::Milliseconds(1));
  }
  ASSERT_EQ(engine.GetStats().prefill_tokens_computed_total, stuck_len);
  engine.Submit(Request("waiting", Golden("long_repeated_313tok"), 4, silent_endpoint),
                waiting.Callback());
  const GoldenCase c = Golden("once_upon_a_time");
  const uint32_t len = static_cast<uint32_t>(c.prompt.size());
  auto r = StartReceiver("fine", len, 0);
  ASSERT_NE(r, nullptr);
  PrefillDoneRecorder fine;
  engine.Submit(Request("fine", c, 4, r->endpoint()), fine.Callback());
  auto result = fine.Wait();
  ASSERT_TRUE(result.has_value());
  ASSERT_TRUE(result->ok()) << result->status();
  EXPECT_EQ((*result)->samples.at(0).token.token_id, c.generated[0]);
  ASSERT_TRUE(r->done.Wait());
  ASSERT_TRUE(r->done.status().ok()) << r->done.status();
  ExpectReceivedRowsMatch(*r, c, 0);

  // "stuck" computed its prompt and holds its blocks until its transfer
  // ends; "waiting" computed nothing. Neither finished.
  EXPECT_EQ(stuck.calls(), 0);
  EXPECT_EQ(waiting.calls(), 0);
  PrefillStats stats = engine.GetStats();
  EXPECT_EQ(stats.prefill_tokens_computed_total, stuck_len + len);
  EXPECT_EQ(stats.kv_blocks_in_use,
            static_cast<uint32_t>(kv::BlocksForTokens(static_cast<int32_t>(stuck_len), 16)));
  EXPECT_EQ(stats.running_requests, 2u);
  EXPECT_EQ(stats.transfers_in_flight, 2u);

  engine.Cancel("stuck");
  engine.Cancel("waiting");
  for (PrefillDoneRecorder* d : {&stuck, &waiting}) {
    auto cancelled = d->Wait();
    ASSERT_TRUE(cancelled.has_value());
    EXPECT_EQ(cancelled->status().code(), absl::StatusCode::kCancelled) << cancelled->status();
  }
  stats = engine.GetStats();
  EXPECT_EQ(stats.kv_blocks_in_use, 0u);
  EXPECT_EQ(stats.transfers_in_flight, 0u);
}

TEST_F(PrefillWorkerTest, ShutdownEndsQueuedRequestsWithUnavailable) {
  PrefillEngineOptions options = Options();
  options.fault_stall_after_frames = 1;
  PrefillEngine engine(options, &model());
  const GoldenCase c = Golden("once_upon_a_time");
  const uint32_t len = static_cast<uint32_t>(c.prompt.size());
  auto r = StartReceiver("running", len, 0);
  ASSERT_NE(r, nullptr);
  PrefillDoneRecorder running;
  engine.Submit(Request("running", c, 4, r->endpoint()), running.Callback());
  const absl::Time deadline = absl::Now() + absl::Seconds(2);
  while (r->receiver->kv_bytes_received_total() == 0 && absl::Now() < deadline) {
    absl::SleepFor(absl::Milliseconds(5));
  }
  ASSERT_EQ(r->receiver->kv_bytes_received_total(), StoriesKvBytes(len) / 5);
  // Another request, to a port where nothing listens: it fails or is shut
  // down, whichever comes first, both UNAVAILABLE.
  PrefillDoneRecorder queued;
  engine.Submit(Request("queued", c, 4, "127.0.0.1:1"), queued.Callback());
  engine.Shutdown();
  auto queued_result = queued.Wait();
  ASSERT_TRUE(queued_result.has_value());
  EXPECT_EQ(queued_result->status().code(), absl::StatusCode::kUnavailable);
  auto running_result = running.Wait();
  ASSERT_TRUE(running_result.has_value());
  EXPECT_FALSE(running_result->ok());
  // After Shutdown, Submit answers at once.
  PrefillDoneRecorder late;
  engine.Submit(Request("late", c, 4, "127.0.0.1:1"), late.Callback());
  auto late_result = late.Wait(absl::Milliseconds(1));
  ASSERT_TRUE(late_result.has_value());
  EXPECT_EQ(late_result->status().code(), absl::StatusCode::kUnavailable);
  EXPECT_EQ(running.calls() + queued.calls() + late.calls(), 3);
}

}  // namespace
}  // namespace tandem::prefill
