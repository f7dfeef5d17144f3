// Issue #16, engine side: a prefill-only request's K/V leave layer by layer
// while the later layers compute (KvTransportOverlapTest), on the host
// path (ReadTokens + SendLayer) and on the device path (SendDeviceRows on
// a kv::DeviceKvAccess storage, here a host-memory stand-in); the engine
// thread only enqueues sends, so a stalled transport holds neither the
// step nor other requests. KvTransportLoadStatsTest: the D side's count of
// the time from a remote load's done to the first decode step.
#include <cstring>
#include <deque>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/synchronization/mutex.h"
#include "engine/core/engine_core.h"
#include "gtest/gtest.h"
#include "tests/engine/core/core_harness.h"
#include "tests/engine/core/fake_backend.h"
#include "tests/engine/core/recording_sink.h"

namespace tandem::core {
namespace {

using testing::EventLog;
using testing::FakeBackend;
using testing::FakeGenerate;
using testing::FakePrompt;
using testing::HostDeviceKvStorage;
using testing::kBlockSize;
using testing::kFakeLayers;
using testing::Options;
using testing::RecordingSink;

// One frame as the transport would carry it: K rows then V rows of the
// fake's 2-float rows.
struct Frame {
  int32_t layer = 0, start = 0, count = 0;
  std::vector<float> rows;  // [2][count][2]
};

// A KvExport whose sends only queue a frame (SendLayer copies the host
// rows; SendDeviceRows gathers them from the storage, synchronous on the
// host stand-in, a kernel on a stream with CudaKvStorage) and return; a
// transport thread delivers the queue once the test opens its gate.
// Result() is OK once Finish ran and every frame was delivered.
class QueuedExport final : public KvExport {
 public:
  QueuedExport(bool device_rows, EventLog* log, int32_t first_token_to_send = 0)
      : device_rows_(device_rows), log_(log), first_(first_token_to_send) {
    transport_ = std::thread([this] { Deliver(); });
  }
  ~QueuedExport() override {
    {
      absl::MutexLock lock(&mu_);
      stop_ = true;
    }
    transport_.join();
  }

  int32_t first_token_to_send() const override { return first_; }
  absl::Status Open(std::shared_ptr<const CancelFlag>, Wake wake) override {
    absl::MutexLock lock(&mu_);
    wake_ = std::move(wake);
    return absl::OkStatus();
  }
  absl::StatusOr<bool> Ready() override { return true; }
  bool sends_device_rows() const override { return device_rows_; }
  absl::Status SendLayer(int32_t layer, int32_t token_start, int32_t count, const char* k,
                         const char* v) override {
    Frame f{layer, token_start, count, std::vector<float>(static_cast<size_t>(count) * 4)};
    const size_t half = static_cast<size_t>(count) * 2 * sizeof(float);
    std::memcpy(f.rows.data(), k, half);
    std::memcpy(reinterpret_cast<char*>(f.rows.data()) + half, v, half);
    Queue(std::move(f), "host");
    return absl::OkStatus();
  }
  absl::Status SendDeviceRows(kv::DeviceKvAccess& kv, std::span<const int32_t> block_table,
                              int32_t layer, int32_t token_start, int32_t count) override {
    Frame f{layer, token_start, count, std::vector<float>(static_cast<size_t>(count) * 4)};
    if (absl::Status s =
            kv.GatherRows(block_table, layer, token_start, count, f.rows.data(), nullptr);
        !s.ok()) {
      return s;
    }
    Queue(std::move(f), "device");
    return absl::OkStatus();
  }
  absl::Status Finish(const std::vector<SampleStart>&) override {
    absl::MutexLock lock(&mu_);
    finished_ = true;
    return absl::OkStatus();
  }
  std::optional<absl::Status> Result() override {
    absl::MutexLock lock(&mu_);
    if (!finished_ || !queue_.empty()) return std::nullopt;
    return absl::OkStatus();
  }
  void Close() override {
    absl::MutexLock lock(&mu_);
    wake_ = nullptr;
  }
  uint64_t bytes_sent() const override { return 0; }

  // Delivery without the wake, as a device data path (KvDataSender::Poll)
  // finishes without telling anyone.
  void SetSilent() {
    absl::MutexLock lock(&mu_);
    silent_ = true;
  }
  // Lets the transport deliver (it is stalled until then).
  void OpenGate() {
    absl::MutexLock lock(&mu_);
    gate_open_ = true;
  }
  int queued() const {
    absl::MutexLock lock(&mu_);
    return static_cast<int>(queue_.size());
  }
  std::vector<Frame> delivered() const {
    absl::MutexLock lock(&mu_);
    return delivered_;
  }
  bool finished() const {
    absl::MutexLock lock(&mu_);
    return finished_;
  }

 private:
  void Queue(Frame f, const char* path) {
    log_->Add(absl::StrCat("send L", f.layer, " [", f.start, ",+", f.count, ") ", path));
    absl::MutexLock lock(&mu_);
    queue_.push_back(std::move(f));
  }
  // The transport thread: stalled until the gate opens, then moves every
  // queued frame to delivered_ and wakes the core (outside the lock).
  void Deliver() {
    for (;;) {
      Wake wake;
      {
        absl::MutexLock lock(&mu_);
        auto more = [this]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
          return stop_ || (gate_open_ && !queue_.empty());
        };
        mu_.Await(absl::Condition(&more));
        if (stop_) return;
        while (!queue_.empty()) {
          delivered_.push_back(std::move(queue_.front()));
          queue_.pop_front();
        }
        if (!silent_) wake = wake_;
      }
      if (wake) wake();
    }
  }

  const bool device_rows_;
  EventLog* const log_;
  const int32_t first_;
  mutable absl::Mutex mu_;
  std::deque<Frame> queue_ ABSL_GUARDED_BY(mu_);
  std::vector<Frame> delivered_ ABSL_GUARDED_BY(mu_);
  Wake wake_ ABSL_GUARDED_BY(mu_);
  bool finished_ ABSL_GUARDED_BY(mu_) = false;
  bool stop_ ABSL_GUARDED_BY(mu_) = false;
  bool gate_open_ ABSL_GUARDED_BY(mu_) = false;
  bool silent_ ABSL_GUARDED_BY(mu_) = false;
  std::thread transport_;
};

struct Core {
  explicit Core(bool device_kv, int32_t num_blocks = 64) {
    auto b = std::make_unique<FakeBackend>(kBlockSize, num_blocks, 1024, device_kv);
    backend = b.get();
    backend->set_event_log(&log);
    core = std::make_unique<EngineCore>(Options(), std::move(b), nullptr);
  }
  std::shared_ptr<RecordingSink> Submit(const std::string& id, std::vector<int32_t> prompt,
                                        int32_t max_tokens,
                                        std::shared_ptr<KvExport> kv_export = nullptr) {
    auto sink = std::make_shared<RecordingSink>();
    EngineRequest r;
    r.request_id = id;
    r.prompt = std::move(prompt);
    r.max_tokens = max_tokens;
    r.output = sink;
    r.kv_export = std::move(kv_export);
    EXPECT_TRUE(core->Submit(std::move(r)).ok()) << id;
    return sink;
  }
  EventLog log;
  FakeBackend* backend = nullptr;
  std::unique_ptr<EngineCore> core;
};

size_t IndexOf(const std::vector<std::string>& events, const std::string& prefix) {
  for (size_t i = 0; i < events.size(); ++i) {
    if (events[i].rfind(prefix, 0) == 0) return i;
  }
  ADD_FAILURE() << "no event starting with \"" << prefix << "\"";
  return events.size();
}

// Every delivered frame holds exactly the fake's rows {token, position} of
// its tokens, K then V; per layer the frames cover [0, prompt) once.
void ExpectFramesCoverPrompt(const std::vector<Frame>& frames,
                             const std::vector<int32_t>& prompt) {
  const int32_t n = static_cast<int32_t>(prompt.size());
  for (int32_t layer = 0; layer < kFakeLayers; ++layer) {
    std::vector<int> seen(static_cast<size_t>(n), 0);
    for (const Frame& f : frames) {
      if (f.layer != layer) continue;
      for (int32_t i = 0; i < f.count; ++i) {
        const int32_t t = f.start + i;
        ASSERT_LT(t, n);
        ++seen[static_cast<size_t>(t)];
        float row[2];
        FakeBackend::KvRow(prompt[static_cast<size_t>(t)], t, row);
        for (int kv = 0; kv < 2; ++kv) {
          const float* got = f.rows.data() + (static_cast<size_t>(kv) * f.count + i) * 2;
          EXPECT_EQ(got[0], row[0]) << "layer " << layer << " token " << t << " kv " << kv;
          EXPECT_EQ(got[1], row[1]) << "layer " << layer << " token " << t << " kv " << kv;
        }
      }
    }
    EXPECT_EQ(seen, std::vector<int>(static_cast<size_t>(n), 1)) << "layer " << layer;
  }
}

class KvTransportOverlapTest : public ::testing::TestWithParam<bool> {};

// Layer l's send is queued after layer l's compute and before layer l+1's,
// with the exact rows, on both paths.
TEST_P(KvTransportOverlapTest, LayerSendPrecedesNextLayersCompute) {
  const bool device_rows = GetParam();
  Core c(device_rows);
  const std::vector<int32_t> prompt = FakePrompt(12, 3);  // one chunk
  auto kv_export = std::make_shared<QueuedExport>(device_rows, &c.log);
  kv_export->OpenGate();
  auto sink = c.Submit("p", prompt, 4, kv_export);
  ASSERT_TRUE(sink->WaitFinish());
  ASSERT_TRUE(sink->finish().has_value());
  EXPECT_TRUE(sink->finish()->status.ok()) << sink->finish()->status;
  const std::vector<std::string> events = c.log.events();
  const char* path = device_rows ? "device" : "host";
  for (int32_t l = 0; l < kFakeLayers; ++l) {
    const size_t send = IndexOf(events, absl::StrCat("send L", l, " [0,+12) ", path));
    EXPECT_LT(IndexOf(events, absl::StrCat("compute L", l, " E0")), send);
    if (l + 1 < kFakeLayers) {
      EXPECT_LT(send, IndexOf(events, absl::StrCat("compute L", l + 1, " E0")));
    }
  }
  ExpectFramesCoverPrompt(kv_export->delivered(), prompt);
  if (device_rows) {
    auto* storage = dynamic_cast<HostDeviceKvStorage*>(&c.backend->kv_storage());
    ASSERT_NE(storage, nullptr);
    EXPECT_EQ(storage->gathers(), kFakeLayers);
  }
}

// A prompt whose first blocks are cached here: the rows [0, hit) go out
// (the same path) before the chunk computes, then the chunk's rows per
// layer; together they are the prompt, each row once.
TEST_P(KvTransportOverlapTest, CachedRowsGoTheSameWay) {
  const bool device_rows = GetParam();
  Core c(device_rows);
  const std::vector<int32_t> base = FakePrompt(12, 4);
  ASSERT_TRUE(c.Submit("warm", base, 2)->WaitFinish());
  std::vector<int32_t> prompt = base;
  for (int32_t t : FakePrompt(6, 9)) prompt.push_back(t);  // hit 12 of 18
  auto kv_export = std::make_shared<QueuedExport>(device_rows, &c.log);
  kv_export->OpenGate();
  auto sink = c.Submit("p", prompt, 4, kv_export);
  ASSERT_TRUE(sink->WaitFinish());
  EXPECT_TRUE(sink->finish()->status.ok()) << sink->finish()->status;
  const std::vector<std::string> events = c.log.events();
  const char* path = device_rows ? "device" : "host";
  const size_t cached0 = IndexOf(events, absl::StrCat("send L0 [0,+12) ", path));
  const size_t cached1 = IndexOf(events, absl::StrCat("send L1 [0,+12) ", path));
  const size_t chunk0 = IndexOf(events, absl::StrCat("send L0 [12,+6) ", path));
  const size_t chunk1 = IndexOf(events, absl::StrCat("send L1 [12,+6) ", path));
  EXPECT_LT(cached1, chunk0);
  EXPECT_LT(cached0, cached1);
  EXPECT_LT(chunk0, chunk1);
  ExpectFramesCoverPrompt(kv_export->delivered(), prompt);
}

// The transport delivers nothing until the end: the exporting request's
// step finishes with every frame queued (Finish ran), and another request
// decodes to its end meanwhile. Opening the gate ends the export OK.
TEST_P(KvTransportOverlapTest, StalledTransportBlocksNeitherStepNorOthers) {
  const bool device_rows = GetParam();
  Core c(device_rows);
  const std::vector<int32_t> prompt = FakePrompt(12, 5);
  auto kv_export = std::make_shared<QueuedExport>(device_rows, &c.log);
  auto exporting = c.Submit("p", prompt, 4, kv_export);
  const std::vector<int32_t> other_prompt = FakePrompt(8, 6);
  auto other = c.Submit("d", other_prompt, 6);
  ASSERT_TRUE(other->WaitFinish());
  EXPECT_TRUE(other->finish()->status.ok()) << other->finish()->status;
  EXPECT_EQ(other->token_ids(), FakeGenerate(other_prompt, 6));
  // Bounded wait for the exporting step's end (Finish), not for delivery.
  for (int i = 0; i < 3000 && !kv_export->finished(); ++i) absl::SleepFor(absl::Milliseconds(1));
  EXPECT_TRUE(kv_export->finished());
  EXPECT_EQ(kv_export->queued(), kFakeLayers);
  EXPECT_TRUE(kv_export->delivered().empty());
  EXPECT_FALSE(exporting->finish().has_value());  // waits for the transfer

  kv_export->OpenGate();
  ASSERT_TRUE(exporting->WaitFinish());
  EXPECT_TRUE(exporting->finish()->status.ok()) << exporting->finish()->status;
  ExpectFramesCoverPrompt(kv_export->delivered(), prompt);
}

// A device-path export whose last frames go out without a wake (the data
// path has none) still ends: the core polls a draining device export
// rather than sleeping until the next arrival.
TEST(KvTransportDeviceDrainTest, DrainWithoutWakeStillEnds) {
  Core c(/*device_kv=*/true);
  const std::vector<int32_t> prompt = FakePrompt(12, 5);
  auto kv_export = std::make_shared<QueuedExport>(true, &c.log);
  kv_export->SetSilent();
  auto exporting = c.Submit("p", prompt, 4, kv_export);
  for (int i = 0; i < 3000 && !kv_export->finished(); ++i) absl::SleepFor(absl::Milliseconds(1));
  ASSERT_TRUE(kv_export->finished());
  absl::SleepFor(absl::Milliseconds(20));  // the core has gone idle
  kv_export->OpenGate();                   // delivers, wakes no one
  ASSERT_TRUE(exporting->WaitFinish());
  EXPECT_TRUE(exporting->finish()->status.ok()) << exporting->finish()->status;
  ExpectFramesCoverPrompt(kv_export->delivered(), prompt);
}

INSTANTIATE_TEST_SUITE_P(Paths, KvTransportOverlapTest, ::testing::Bool(),
                         [](const ::testing::TestParamInfo<bool>& info) {
                           return info.param ? std::string("DeviceRows")
                                             : std::string("HostRows");
                         });

// An export that needs device rows on a worker whose KV cache is on the
// host ends with FAILED_PRECONDITION naming it, and frees its blocks.
TEST(KvTransportDeviceRowsTest, HostStorageRefusesDeviceRows) {
  Core c(/*device_kv=*/false);
  auto kv_export = std::make_shared<QueuedExport>(true, &c.log);
  kv_export->OpenGate();
  auto sink = c.Submit("p", FakePrompt(12, 7), 4, kv_export);
  ASSERT_TRUE(sink->WaitFinish());
  ASSERT_TRUE(sink->finish().has_value());
  EXPECT_EQ(sink->finish()->status.code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_EQ(sink->finish()->status.message(),
            "KV export needs device rows but this worker's KV cache is on the host");
  EXPECT_TRUE(kv_export->delivered().empty());
  for (int i = 0; i < 3000 && c.core->GetStats().kv_blocks_in_use != 0; ++i) {
    absl::SleepFor(absl::Milliseconds(1));
  }
  EXPECT_EQ(c.core->GetStats().kv_blocks_in_use, 0u);
}

// One remote prefill that decodes counts once in
// kv_load_to_first_decode_*; one that ends with token 0 (max_tokens 1)
// and a local request count nothing.
TEST(KvTransportLoadStatsTest, LoadToFirstDecodeCountsEachRemoteDecodeOnce) {
  testing::Harness h(64, std::make_unique<testing::FakeLoader>());
  const std::vector<int32_t> prompt = FakePrompt(40, 8);
  auto remote = h.Submit("remote", prompt, 4, RouteChoice::kRemote);
  ASSERT_TRUE(h.loader->WaitStarted("remote"));
  EXPECT_EQ(h.core->GetStats().kv_load_to_first_decode_total, 0u);
  h.loader->Complete("remote", prompt, FakeGenerate(prompt, 1)[0]);
  ASSERT_TRUE(remote->WaitFinish());
  // Token 0 came with the prefill (the router streams it); 1..3 decoded here.
  const std::vector<int32_t> ref = FakeGenerate(prompt, 4);
  EXPECT_EQ(remote->token_ids(), std::vector<int32_t>(ref.begin() + 1, ref.end()));
  CoreStats s = h.core->GetStats();
  EXPECT_EQ(s.kv_load_to_first_decode_total, 1u);
  EXPECT_GE(s.kv_load_to_first_decode_seconds_total, 0.0);
  EXPECT_LT(s.kv_load_to_first_decode_seconds_total, 60.0);
  const double first = s.kv_load_to_first_decode_seconds_total;

  const std::vector<int32_t> short_prompt = FakePrompt(40, 9);
  auto one = h.Submit("one", short_prompt, 1, RouteChoice::kRemote);
  ASSERT_TRUE(h.loader->WaitStarted("one"));
  h.loader->Complete("one", short_prompt, FakeGenerate(short_prompt, 1)[0]);
  ASSERT_TRUE(one->WaitFinish());
  ASSERT_TRUE(h.Submit("local", FakePrompt(8, 10), 3, RouteChoice::kLocal)->WaitFinish());
  ASSERT_TRUE(h.WaitIdle());
  s = h.core->GetStats();
  EXPECT_EQ(s.kv_load_to_first_decode_total, 1u);
  EXPECT_EQ(s.kv_load_to_first_decode_seconds_total, first);
}

// The count runs from the load's done, not from when the loop takes the
// done in: a load that completes while the loop is inside another
// request's forward, held 50 ms, counts at least those 50 ms.
TEST(KvTransportLoadStatsTest, LoadToFirstDecodeRunsFromTheLoadsDone) {
  testing::Harness h(64, std::make_unique<testing::FakeLoader>());
  const std::vector<int32_t> prompt = FakePrompt(40, 11);
  auto remote = h.Submit("remote", prompt, 3, RouteChoice::kRemote);
  ASSERT_TRUE(h.loader->WaitStarted("remote"));
  h.backend->PauseNextForward();
  auto busy = h.Submit("busy", FakePrompt(8, 12), 3, RouteChoice::kLocal);
  ASSERT_TRUE(h.backend->WaitPaused());
  h.loader->Complete("remote", prompt, FakeGenerate(prompt, 1)[0]);
  absl::SleepFor(absl::Milliseconds(50));
  h.backend->Resume();
  ASSERT_TRUE(remote->WaitFinish());
  ASSERT_TRUE(busy->WaitFinish());
  const CoreStats s = h.core->GetStats();
  EXPECT_EQ(s.kv_load_to_first_decode_total, 1u);
  EXPECT_GE(s.kv_load_to_first_decode_seconds_total, 0.050);
}

}  // namespace
}  // namespace tandem::core
