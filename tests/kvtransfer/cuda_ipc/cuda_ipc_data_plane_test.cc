// P's CudaIpcDataPlane sender and D's receiver over the host stand-ins
// (host_ipc.h): one registry plays the GPU both processes share.
#include "kvtransfer/cuda_ipc/cuda_ipc_data_plane.h"

#include <algorithm>
#include <memory>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include "absl/synchronization/mutex.h"
#include "absl/time/clock.h"
#include "gtest/gtest.h"
#include "kvtransfer/cuda_ipc/ipc_codec.h"
#include "kvtransfer/cuda_ipc/ipc_receiver.h"
#include "tests/kvtransfer/cuda_ipc/host_ipc.h"

namespace tandem::kvtransfer::cuda_ipc {
namespace {

using testing::HostIpcApi;
using testing::HostIpcRegistry;
using testing::HostKv;

constexpr int32_t kLayers = 3;
constexpr int32_t kKvDim = 8;
constexpr int32_t kLayerBlocks = 64;
// Bounded waits for callbacks (never a timing assertion).
constexpr absl::Duration kWait = absl::Seconds(20);

// What `done` and `quiesced` reported, in order, and from which thread.
class Recorder {
 public:
  struct Entry {
    std::string tag;
    absl::Status status;
    std::thread::id thread;
  };
  std::function<void(absl::Status)> Done(std::string tag) {
    return [this, tag](absl::Status s) { Add(tag, std::move(s)); };
  }
  std::function<void()> Quiesced() {
    return [this] { Add("quiesced", absl::OkStatus()); };
  }
  bool WaitFor(size_t n) {
    absl::MutexLock lock(&mu_);
    auto enough = [&]() ABSL_NO_THREAD_SAFETY_ANALYSIS { return entries_.size() >= n; };
    return mu_.AwaitWithTimeout(absl::Condition(&enough), kWait);
  }
  std::vector<Entry> entries() {
    absl::MutexLock lock(&mu_);
    return entries_;
  }

 private:
  void Add(std::string tag, absl::Status s) {
    absl::MutexLock lock(&mu_);
    entries_.push_back({std::move(tag), std::move(s), std::this_thread::get_id()});
  }
  absl::Mutex mu_;
  std::vector<Entry> entries_ ABSL_GUARDED_BY(mu_);
};

// One simulated worker process.
struct Proc {
  std::shared_ptr<HostIpcApi> api;
  std::unique_ptr<HostKv> kv;
  std::unique_ptr<CudaIpcDataPlane> plane;
};

Proc MakeProc(const std::shared_ptr<HostIpcRegistry>& registry, std::string host,
              std::string instance, int32_t block_size, int timeout_ms = 5000) {
  Proc p;
  p.api = std::make_shared<HostIpcApi>(registry, std::move(host), std::move(instance), 100);
  p.kv = std::make_unique<HostKv>(kLayers, kLayerBlocks, block_size, kKvDim);
  CudaIpcDataPlaneOptions o;
  o.kv = p.kv.get();
  o.transfer_timeout_ms = timeout_ms;
  absl::StatusOr<std::unique_ptr<CudaIpcDataPlane>> plane =
      CudaIpcDataPlane::CreateForTesting(o, p.api);
  EXPECT_TRUE(plane.ok()) << plane.status();
  if (plane.ok()) p.plane = *std::move(plane);
  return p;
}

// Random K/V bytes for tokens [0, n) of every layer, written into P.
std::vector<std::vector<uint8_t>> FillRows(HostKv& kv, const std::vector<int32_t>& table, int32_t n,
                                           uint32_t seed) {
  std::mt19937 rng(seed);
  std::vector<std::vector<uint8_t>> rows(kLayers);
  for (int32_t l = 0; l < kLayers; ++l) {
    rows[l].resize(2 * n * kv.row_bytes());
    for (uint8_t& b : rows[l]) b = static_cast<uint8_t>(rng());
    EXPECT_TRUE(kv.ScatterRows(table, l, 0, n, rows[l].data(), nullptr).ok());
  }
  return rows;
}

// K rows then V rows of tokens [start, start + count) of `layer` of `kv`.
std::vector<uint8_t> Gather(HostKv& kv, const std::vector<int32_t>& table, int32_t layer,
                            int32_t start, int32_t count) {
  std::vector<uint8_t> out(2 * count * kv.row_bytes());
  EXPECT_TRUE(kv.GatherRows(table, layer, start, count, out.data(), nullptr).ok());
  return out;
}

// The same bytes as FillRows' `all` for tokens [start, start + count).
std::vector<uint8_t> Expected(const std::vector<uint8_t>& all, int32_t n, uint64_t row_bytes,
                              int32_t start, int32_t count) {
  std::vector<uint8_t> out;
  out.insert(out.end(), all.begin() + start * row_bytes, all.begin() + (start + count) * row_bytes);
  out.insert(out.end(), all.begin() + (n + start) * row_bytes,
             all.begin() + (n + start + count) * row_bytes);
  return out;
}

std::vector<int32_t> Blocks(std::initializer_list<int32_t> ids) { return ids; }

class CudaIpcDataPlaneTest : public ::testing::Test {
 protected:
  std::shared_ptr<HostIpcRegistry> registry_ = std::make_shared<HostIpcRegistry>();
  const TransferKey key_{"req-7", 2};
  const TransportPeer peer_{"127.0.0.1:9000", "host-a", "d-inst"};
};

TEST_F(CudaIpcDataPlaneTest, CopiesIdenticalBytesAcrossBlockSizes) {
  struct Case {
    int32_t p_bs, d_bs;
  } cases[] = {{4, 16}, {16, 4}, {8, 8}, {3, 5}};
  for (const Case& c : cases) {
    SCOPED_TRACE(::testing::Message() << "P block size " << c.p_bs << ", D " << c.d_bs);
    Proc p = MakeProc(registry_, "host-a", "p-inst", c.p_bs);
    Proc d = MakeProc(registry_, "host-a", "d-inst", c.d_bs);
    constexpr int32_t kTokens = 37, kHit = 3, kChunk = 5;
    std::vector<int32_t> p_table, d_table;
    for (int32_t i = 0; i * c.p_bs < kTokens; ++i) p_table.push_back(kLayerBlocks - 1 - 2 * i);
    for (int32_t i = 0; i * c.d_bs < kTokens; ++i) d_table.push_back(2 * i + 1);
    auto rows = FillRows(*p.kv, p_table, kTokens, /*seed=*/c.p_bs * 100 + c.d_bs);

    absl::StatusOr<std::string> setup = p.plane->sender()->OpenTransfer(key_, peer_);
    ASSERT_TRUE(setup.ok()) << setup.status();
    ASSERT_TRUE(p.plane->sender()->OpenTransfer({"other", 1}, peer_).ok());
    ASSERT_TRUE(d.plane->receiver()->OpenTransfer(key_, *setup, {d.kv.get(), d_table}).ok());
    Recorder rec;
    size_t frames = 0;
    for (int32_t l = 0; l < kLayers; ++l) {
      for (int32_t t = kHit; t < kTokens; t += kChunk) {
        int32_t n = std::min(kChunk, kTokens - t);
        absl::StatusOr<FrameDescriptor> desc =
            p.plane->sender()->SendRows(key_, *p.kv, p_table, l, t, n);
        ASSERT_TRUE(desc.ok()) << desc.status();
        EXPECT_EQ(desc->comm_seq, frames);
        d.plane->receiver()->Receive(key_, *desc, rec.Done(absl::StrCat(l, "/", t)));
        ++frames;
      }
    }
    ASSERT_TRUE(rec.WaitFor(frames));
    for (const Recorder::Entry& e : rec.entries()) {
      EXPECT_TRUE(e.status.ok()) << e.tag << ": " << e.status;
      EXPECT_NE(e.thread, std::this_thread::get_id()) << e.tag << " ran inline";
    }
    const uint64_t rb = p.kv->row_bytes();
    for (int32_t l = 0; l < kLayers; ++l) {
      EXPECT_EQ(Gather(*d.kv, d_table, l, kHit, kTokens - kHit),
                Expected(rows[l], kTokens, rb, kHit, kTokens - kHit))
          << "layer " << l;
      // Tokens below the hit were not asked for and stay untouched (zero).
      EXPECT_EQ(Gather(*d.kv, d_table, l, 0, kHit), std::vector<uint8_t>(2 * kHit * rb, 0));
    }
    // 3 layers x 34 tokens x 2 (K, V) x 8 x 4 bytes on both sides.
    EXPECT_EQ(p.plane->sender()->bytes_total(), 3u * 34 * 2 * 8 * 4);
    EXPECT_EQ(d.plane->receiver()->bytes_total(), 3u * 34 * 2 * 8 * 4);
    Recorder closed;
    d.plane->receiver()->CloseTransfer(key_, closed.Quiesced());
    ASSERT_TRUE(closed.WaitFor(1));
  }
}

TEST_F(CudaIpcDataPlaneTest, SetupFromAnotherHostIsRefused) {
  Proc p = MakeProc(registry_, "host-a", "p-inst", 4);
  Proc d = MakeProc(registry_, "host-b", "d-inst", 4);
  absl::StatusOr<std::string> setup =
      p.plane->sender()->OpenTransfer(key_, {"d:1", /*host_id=*/"", "d-inst"});
  ASSERT_TRUE(setup.ok()) << setup.status();
  absl::Status s = d.plane->receiver()->OpenTransfer(key_, *setup, {d.kv.get(), Blocks({0})});
  EXPECT_EQ(s.code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_EQ(s.message(),
            "cuda_ipc needs one host: the prefill worker is on host host-a, this decode worker "
            "is on host host-b");
  EXPECT_EQ(registry_->counts().mem_opens, 0);
}

TEST_F(CudaIpcDataPlaneTest, MismatchedPoolShapeIsRefusedNamingTheField) {
  Proc p = MakeProc(registry_, "host-a", "p-inst", 4);
  Proc d = MakeProc(registry_, "host-a", "d-inst", 4);
  HostKv wide(kLayers, kLayerBlocks, 4, kKvDim * 2);
  absl::StatusOr<std::string> setup = p.plane->sender()->OpenTransfer(key_, peer_);
  ASSERT_TRUE(setup.ok());
  absl::Status s = d.plane->receiver()->OpenTransfer(key_, *setup, {&wide, Blocks({0})});
  EXPECT_EQ(s.code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_EQ(s.message(), "cuda_ipc: the prefill pools' 'kv_dim' is 8, this decode worker's 16");
  EXPECT_EQ(d.plane->receiver()->OpenTransfer(key_, "junk", {d.kv.get(), Blocks({0})}).code(),
            absl::StatusCode::kFailedPrecondition);
}

TEST_F(CudaIpcDataPlaneTest, MalformedLocatorIsDataLossNamingTheFrame) {
  Proc p = MakeProc(registry_, "host-a", "p-inst", 4);
  Proc d = MakeProc(registry_, "host-a", "d-inst", 4);
  absl::StatusOr<std::string> setup = p.plane->sender()->OpenTransfer(key_, peer_);
  ASSERT_TRUE(setup.ok());
  ASSERT_TRUE(d.plane->receiver()->OpenTransfer(key_, *setup, {d.kv.get(), Blocks({0, 1})}).ok());
  absl::StatusOr<FrameDescriptor> good =
      p.plane->sender()->SendRows(key_, *p.kv, Blocks({5, 6}), 1, 2, 4);
  ASSERT_TRUE(good.ok());
  FrameDescriptor garbage = *good;
  garbage.locator = "xyz";
  FrameDescriptor shifted = *good;  // names table index 0, the range starts in 0 but ends in 1
  IpcLocator loc = *DecodeLocator(good->locator);
  loc.blocks.pop_back();
  shifted.locator = EncodeLocator(loc);
  FrameDescriptor outside = *good;
  loc = *DecodeLocator(good->locator);
  loc.blocks[0] = kLayerBlocks;
  outside.locator = EncodeLocator(loc);
  Recorder rec;
  d.plane->receiver()->Receive(key_, garbage, rec.Done("garbage"));
  d.plane->receiver()->Receive(key_, shifted, rec.Done("shifted"));
  d.plane->receiver()->Receive(key_, outside, rec.Done("outside"));
  ASSERT_TRUE(rec.WaitFor(3));
  std::vector<Recorder::Entry> e = rec.entries();
  for (const auto& entry : e) {
    EXPECT_EQ(entry.status.code(), absl::StatusCode::kDataLoss) << entry.tag;
    EXPECT_NE(entry.thread, std::this_thread::get_id());
  }
  EXPECT_EQ(e[0].status.message(),
            "frame of request req-7 attempt 2 layer 1 tokens [2, 6): malformed cuda_ipc "
            "locator: field 'version' truncated");
  EXPECT_EQ(e[1].status.message(),
            "frame of request req-7 attempt 2 layer 1 tokens [2, 6): cuda_ipc locator names "
            "blocks 0..+1, the range needs 0..+2 (block size 4)");
  EXPECT_EQ(e[2].status.message(),
            "frame of request req-7 attempt 2 layer 1 tokens [2, 6): cuda_ipc locator block 64 "
            "outside [0, 64)");
  EXPECT_EQ(p.kv->copies() + d.kv->copies(), 0);
  EXPECT_EQ(d.plane->receiver()->bytes_total(), 0u);
}

TEST_F(CudaIpcDataPlaneTest, ReceiveForAKeyNotOpenFailsOffTheCallersThread) {
  Proc d = MakeProc(registry_, "host-a", "d-inst", 4);
  FrameDescriptor f;
  f.request_id = "ghost";
  f.attempt = 1;
  f.token_count = 1;
  Recorder rec;
  d.plane->receiver()->Receive({"ghost", 1}, f, rec.Done("ghost"));
  ASSERT_TRUE(rec.WaitFor(1));
  EXPECT_EQ(rec.entries()[0].status.code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_NE(rec.entries()[0].thread, std::this_thread::get_id());
}

TEST_F(CudaIpcDataPlaneTest, CopyThatNeverCompletesMissesItsDeadlineAndClosesTheHandles) {
  Proc p = MakeProc(registry_, "host-a", "p-inst", 4);
  Proc d = MakeProc(registry_, "host-a", "d-inst", 4, /*timeout_ms=*/100);
  p.kv->SetLayerEventFired(0, false);  // P died before layer 0's event fired
  absl::StatusOr<std::string> setup = p.plane->sender()->OpenTransfer(key_, peer_);
  ASSERT_TRUE(setup.ok());
  ASSERT_TRUE(d.plane->receiver()->OpenTransfer(key_, *setup, {d.kv.get(), Blocks({0, 1})}).ok());
  Recorder rec;
  for (int32_t l : {0, 1}) {  // layer 1 queues behind layer 0 on P's stream
    absl::StatusOr<FrameDescriptor> desc =
        p.plane->sender()->SendRows(key_, *p.kv, Blocks({5, 6}), l, 0, 8);
    ASSERT_TRUE(desc.ok());
    d.plane->receiver()->Receive(key_, *desc, rec.Done(absl::StrCat("layer ", l)));
  }
  d.plane->receiver()->CloseTransfer(key_, rec.Quiesced());
  ASSERT_TRUE(rec.WaitFor(3));
  std::vector<Recorder::Entry> e = rec.entries();
  EXPECT_EQ(e[0].tag, "layer 0");
  EXPECT_EQ(e[0].status.code(), absl::StatusCode::kDeadlineExceeded);
  EXPECT_EQ(e[0].status.message(),
            "cuda_ipc: the frame of request req-7 attempt 2 layer 0 tokens [0, 8) did not "
            "complete within 100 ms (prefill worker pid 100 instance p-inst may have stopped)");
  // Layer 1 was queued behind it: DEADLINE_EXCEEDED with it (or, had this
  // thread stalled past the deadline before its Receive, UNAVAILABLE: the
  // instance already timed out). Either way quiesced comes after layer 0.
  auto layer1 = std::find_if(e.begin(), e.end(), [](const auto& x) { return x.tag == "layer 1"; });
  ASSERT_NE(layer1, e.end());
  EXPECT_TRUE(layer1->status.code() == absl::StatusCode::kDeadlineExceeded ||
              layer1->status.code() == absl::StatusCode::kUnavailable)
      << layer1->status;
  EXPECT_TRUE(e[1].tag == "quiesced" || e[2].tag == "quiesced");
  HostIpcRegistry::Counts c = registry_->counts();
  EXPECT_EQ(c.mem_opens, 2);
  EXPECT_EQ(c.mem_closes, 2);
  EXPECT_EQ(c.event_opens, kLayers);
  EXPECT_EQ(c.event_closes, kLayers);
  EXPECT_EQ(d.api->live_streams(), 0);
  EXPECT_EQ(d.api->live_events(), 0);  // the abandoned copies' events are gone
  EXPECT_EQ(d.plane->receiver()->bytes_total(), 0u);
}

TEST_F(CudaIpcDataPlaneTest, PollAfterAFailureGivesAValueOnlyOnceTheTimeoutPassed) {
  constexpr int kTimeoutMs = 50;
  Proc p = MakeProc(registry_, "host-a", "p-inst", 4, kTimeoutMs);
  ASSERT_TRUE(p.plane->sender()->OpenTransfer(key_, peer_).ok());
  ASSERT_TRUE(p.plane->sender()->SendRows(key_, *p.kv, Blocks({1}), 0, 0, 4).ok());
  const absl::Status failed = absl::UnavailableError("KV connection closed");
  const absl::Time before = absl::Now();
  std::optional<absl::Status> got;
  while (!(got = p.plane->sender()->Poll(key_, failed)).has_value() &&
         absl::Now() - before < kWait) {
    absl::SleepFor(absl::Milliseconds(1));
  }
  ASSERT_TRUE(got.has_value());
  EXPECT_EQ(*got, failed);
  // The failure was first seen after `before`, and the value needs the
  // whole timeout since then.
  EXPECT_GE(absl::Now() - before, absl::Milliseconds(kTimeoutMs));
}

TEST_F(CudaIpcDataPlaneTest, HandlesExportedOncePerProcessAndOpenedOncePerPrefillInstance) {
  Proc p1 = MakeProc(registry_, "host-a", "p-one", 4);
  Proc p2 = MakeProc(registry_, "host-a", "p-two", 8);
  Proc d = MakeProc(registry_, "host-a", "d-inst", 4);
  std::vector<int32_t> d_table = {2, 3};
  for (uint32_t attempt = 1; attempt <= 3; ++attempt) {
    for (Proc* p : {&p1, &p2}) {
      TransferKey key{p == &p1 ? "from-one" : "from-two", attempt};
      absl::StatusOr<std::string> setup = p->plane->sender()->OpenTransfer(key, peer_);
      ASSERT_TRUE(setup.ok());
      ASSERT_TRUE(d.plane->receiver()->OpenTransfer(key, *setup, {d.kv.get(), d_table}).ok());
      absl::StatusOr<FrameDescriptor> desc =
          p->plane->sender()->SendRows(key, *p->kv, Blocks({9, 10}), 2, 1, 6);
      ASSERT_TRUE(desc.ok()) << desc.status();
      Recorder rec;
      d.plane->receiver()->Receive(key, *desc, rec.Done("copy"));
      ASSERT_TRUE(rec.WaitFor(1));
      EXPECT_TRUE(rec.entries()[0].status.ok()) << rec.entries()[0].status;
      d.plane->receiver()->CloseTransfer(key, rec.Quiesced());
      ASSERT_TRUE(rec.WaitFor(2));
      p->plane->sender()->CloseTransfer(key);
    }
  }
  HostIpcRegistry::Counts c = registry_->counts();
  EXPECT_EQ(c.mem_exports, 2 * 2);          // K, V per prefill process
  EXPECT_EQ(c.event_exports, 2 * kLayers);  // each layer's event per process
  EXPECT_EQ(c.mem_opens, 2 * 2);            // per prefill instance
  EXPECT_EQ(c.event_opens, 2 * kLayers);
  EXPECT_EQ(c.mem_closes, 0);           // still cached (idle < idle_close_ms)
  EXPECT_EQ(d.api->live_streams(), 2);  // one copy stream per prefill instance
  EXPECT_EQ(d.plane->receiver()->bytes_total(), 6u * 6 * 2 * kKvDim * 4);
  d.plane.reset();  // closes every mapping
  c = registry_->counts();
  EXPECT_EQ(c.mem_closes, 4);
  EXPECT_EQ(c.event_closes, 2 * kLayers);
  EXPECT_EQ(d.api->live_streams(), 0);
  EXPECT_EQ(d.api->live_events(), 0);
}

TEST_F(CudaIpcDataPlaneTest, CancelMidStreamQuiescesOnlyAfterTheCopiesInFlightEnd) {
  Proc p = MakeProc(registry_, "host-a", "p-inst", 4);
  Proc d = MakeProc(registry_, "host-a", "d-inst", 4, /*timeout_ms=*/600000);
  std::vector<int32_t> p_table = {7, 8}, d_table = {0, 1};
  auto rows = FillRows(*p.kv, p_table, 8, /*seed=*/5);
  absl::StatusOr<std::string> setup = p.plane->sender()->OpenTransfer(key_, peer_);
  ASSERT_TRUE(setup.ok());
  ASSERT_TRUE(d.plane->receiver()->OpenTransfer(key_, *setup, {d.kv.get(), d_table}).ok());
  Recorder rec;
  absl::StatusOr<FrameDescriptor> l0 = p.plane->sender()->SendRows(key_, *p.kv, p_table, 0, 0, 8);
  ASSERT_TRUE(l0.ok());
  d.plane->receiver()->Receive(key_, *l0, rec.Done("layer 0"));
  ASSERT_TRUE(rec.WaitFor(1));
  p.kv->SetLayerEventFired(1, false);  // layer 1 still being computed on P
  absl::StatusOr<FrameDescriptor> l1 = p.plane->sender()->SendRows(key_, *p.kv, p_table, 1, 0, 8);
  ASSERT_TRUE(l1.ok());
  d.plane->receiver()->Receive(key_, *l1, rec.Done("layer 1"));
  d.plane->receiver()->CloseTransfer(key_, rec.Quiesced());  // the request is cancelled
  // Later descriptors of the closed key are refused, off the caller's thread.
  d.plane->receiver()->Receive(key_, *l1, rec.Done("late"));
  ASSERT_TRUE(rec.WaitFor(2));
  EXPECT_EQ(rec.entries()[1].tag, "late");
  EXPECT_EQ(rec.entries()[1].status.code(), absl::StatusCode::kFailedPrecondition);
  p.kv->SetLayerEventFired(1, true);  // P's layer 1 completes: the copy runs out
  ASSERT_TRUE(rec.WaitFor(4));
  std::vector<Recorder::Entry> e = rec.entries();
  EXPECT_EQ(e[0].tag, "layer 0");
  EXPECT_TRUE(e[0].status.ok());
  EXPECT_EQ(e[2].tag, "layer 1");
  EXPECT_TRUE(e[2].status.ok()) << e[2].status;
  EXPECT_EQ(e[3].tag, "quiesced");
  EXPECT_EQ(Gather(*d.kv, d_table, 1, 0, 8), Expected(rows[1], 8, p.kv->row_bytes(), 0, 8));
}

TEST_F(CudaIpcDataPlaneTest, CreateForTestingRefusesMissingPieces) {
  HostKv kv(kLayers, kLayerBlocks, 4, kKvDim);
  auto api = std::make_shared<HostIpcApi>(registry_, "h", "i", 1);
  CudaIpcDataPlaneOptions o;
  EXPECT_EQ(CudaIpcDataPlane::CreateForTesting(o, api).status().message(),
            "cuda_ipc: 'kv' is null");
  o.kv = &kv;
  EXPECT_EQ(CudaIpcDataPlane::CreateForTesting(o, nullptr).status().message(),
            "cuda_ipc: 'api' is null");
  o.transfer_timeout_ms = 0;
  EXPECT_EQ(CudaIpcDataPlane::CreateForTesting(o, api).status().message(),
            "cuda_ipc: 'transfer_timeout_ms' 0 < 1");
}

TEST(CudaIpcReceiverTest, IdlePrefillInstanceIsUnmapped) {
  auto registry = std::make_shared<HostIpcRegistry>();
  Proc p = MakeProc(registry, "host-a", "p-inst", 4);
  Proc d = MakeProc(registry, "host-a", "d-inst", 4);
  CudaIpcReceiver::Options o;
  o.api = d.api;
  o.idle_close_ms = 1;
  std::vector<std::string> log;
  absl::Mutex log_mu;
  o.log = [&](std::string_view line) {
    absl::MutexLock lock(&log_mu);
    log.emplace_back(line);
  };
  CudaIpcReceiver receiver(std::move(o));
  const TransferKey key{"req", 1};
  absl::StatusOr<std::string> setup =
      p.plane->sender()->OpenTransfer(key, {"d:1", "host-a", "d-inst"});
  ASSERT_TRUE(setup.ok());
  ASSERT_TRUE(receiver.OpenTransfer(key, *setup, {d.kv.get(), Blocks({0})}).ok());
  bool quiesced = false;
  receiver.CloseTransfer(key, [&] { quiesced = true; });
  EXPECT_TRUE(quiesced);  // nothing in flight: inline
  const absl::Time start = absl::Now();
  auto log_lines = [&] {
    absl::MutexLock lock(&log_mu);
    return log.size();
  };
  // The close is logged after it is done.
  while (log_lines() < 2 && absl::Now() - start < kWait) absl::SleepFor(absl::Milliseconds(5));
  HostIpcRegistry::Counts c = registry->counts();
  EXPECT_EQ(c.mem_closes, 2);
  EXPECT_EQ(c.event_closes, kLayers);
  EXPECT_EQ(d.api->live_streams(), 0);
  absl::MutexLock lock(&log_mu);
  EXPECT_EQ(log, (std::vector<std::string>{
                     "cuda_ipc: mapped the KV pools of prefill worker pid 100 instance p-inst",
                     "cuda_ipc: closed the handles of prefill worker pid 100 instance p-inst "
                     "(idle)"}));
}

#ifndef TANDEM_HAVE_CUDA
TEST(CudaIpcStubTest, CreateIsUnimplementedWithoutCuda) {
  HostKv kv(kLayers, kLayerBlocks, 4, kKvDim);
  CudaIpcDataPlaneOptions o;
  o.kv = &kv;
  absl::StatusOr<std::unique_ptr<CudaIpcDataPlane>> plane = CudaIpcDataPlane::Create(o);
  EXPECT_EQ(plane.status().code(), absl::StatusCode::kUnimplemented);
  EXPECT_EQ(plane.status().message(), "cuda_ipc data path: built without CUDA");
  EXPECT_FALSE(CudaIpcDataPlaneAvailable());
}
#endif

}  // namespace
}  // namespace tandem::kvtransfer::cuda_ipc
