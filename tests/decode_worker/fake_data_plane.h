// Recording fakes of the issue #16 device data path (kvtransfer/data_plane.h)
// for the workers' tests: a KvDataSender whose Poll answers what the test
// scripts, a KvDataReceiver that completes every Receive on a thread of its
// own, and a DeviceKvAccess that does nothing. Header only; no CUDA.
#ifndef TANDEM_TESTS_DECODE_WORKER_FAKE_DATA_PLANE_H_
#define TANDEM_TESTS_DECODE_WORKER_FAKE_DATA_PLANE_H_

#include <functional>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include "absl/synchronization/mutex.h"
#include "engine/kv/device_kv.h"
#include "kvtransfer/data_plane.h"
#include "kvtransfer/kv_transfer.h"

namespace tandem::worker_testing {

// The small layout both ends of these tests use: 2 layers, 1 KV head of
// dim 4, f32, fingerprint "fp" (FrameBytes(n) = 2 * n * 16 bytes).
inline kvtransfer::KvLayout SmallLayout() {
  kvtransfer::KvLayout layout;
  layout.model_fingerprint = "fp";
  layout.n_layers = 2;
  layout.n_kv_heads = 1;
  layout.head_dim = 4;
  layout.dtype = kv::KvDtype::kF32;
  return layout;
}

// A device KV that is never touched (the fakes do not read it).
class NoDeviceKv : public kv::DeviceKvAccess {
 public:
  int device_ordinal() const override { return 0; }
  kv::DevicePoolInfo pool_info() const override { return {}; }
  absl::Status GatherRows(std::span<const int32_t>, int32_t, int32_t, int32_t, void*,
                          void*) override {
    return absl::OkStatus();
  }
  absl::Status ScatterRows(std::span<const int32_t>, int32_t, int32_t, int32_t, const void*,
                           void*) override {
    return absl::OkStatus();
  }
  absl::Status CopyFromPeer(const kv::DevicePoolInfo&, std::span<const int32_t>,
                            std::span<const int32_t>, int32_t, int32_t, int32_t,
                            void*) override {
    return absl::OkStatus();
  }
  void* layer_event(int32_t) const override { return nullptr; }
};

// P's side: records every call (engine loop thread: the test's); SendRows
// numbers its descriptors 0, 1, 2, ...; Poll answers poll_answer.
class FakeSender : public kvtransfer::KvDataSender {
 public:
  explicit FakeSender(kvtransfer::KvTransport transport) : transport_(transport) {}
  kvtransfer::KvTransport transport() const override { return transport_; }
  absl::StatusOr<std::string> OpenTransfer(const kvtransfer::TransferKey& key,
                                           const kvtransfer::TransportPeer& peer) override {
    opened.push_back(key);
    peers.push_back(peer);
    return std::string("setup-bytes");
  }
  absl::StatusOr<kvtransfer::FrameDescriptor> SendRows(const kvtransfer::TransferKey& key,
                                                       kv::DeviceKvAccess&,
                                                       std::span<const int32_t> table,
                                                       int32_t layer, int32_t token_start,
                                                       int32_t count) override {
    tables.emplace_back(table.begin(), table.end());
    kvtransfer::FrameDescriptor d;
    d.request_id = key.request_id;
    d.attempt = key.attempt;
    d.layer = static_cast<uint32_t>(layer);
    d.token_start = static_cast<uint32_t>(token_start);
    d.token_count = static_cast<uint32_t>(count);
    d.comm_seq = next_seq++;
    return d;
  }
  std::optional<absl::Status> Poll(const kvtransfer::TransferKey&,
                                   const absl::Status& control) override {
    polled_with.push_back(control);
    return poll_answer;
  }
  void CloseTransfer(const kvtransfer::TransferKey& key) override { closed.push_back(key); }
  uint64_t bytes_total() const override { return 0; }

  std::vector<kvtransfer::TransferKey> opened, closed;
  std::vector<kvtransfer::TransportPeer> peers;
  std::vector<std::vector<int32_t>> tables;
  std::vector<absl::Status> polled_with;
  std::optional<absl::Status> poll_answer;
  uint64_t next_seq = 0;

 private:
  const kvtransfer::KvTransport transport_;
};

// D's side: records OpenTransfer's setup and target and every descriptor
// (receiver threads); each Receive is `done` OK, on a thread of its own
// (never inline), joined by the destructor; bytes_total is `bytes`.
class FakeDataReceiver : public kvtransfer::KvDataReceiver {
 public:
  explicit FakeDataReceiver(kvtransfer::KvTransport t) : transport_(t) {}
  ~FakeDataReceiver() override {
    absl::MutexLock lock(&mu);
    for (std::thread& t : threads_) t.join();
  }
  kvtransfer::KvTransport transport() const override { return transport_; }
  absl::Status OpenTransfer(const kvtransfer::TransferKey& key, std::string_view setup,
                            const kvtransfer::DeviceKvTarget& target) override {
    absl::MutexLock lock(&mu);
    opened.push_back(key);
    setups.emplace_back(setup);
    targets.push_back(target);
    return absl::OkStatus();
  }
  void Receive(const kvtransfer::TransferKey&, const kvtransfer::FrameDescriptor& frame,
               std::function<void(absl::Status)> done) override {
    absl::MutexLock lock(&mu);
    frames.push_back(frame);
    threads_.emplace_back([done = std::move(done)] { done(absl::OkStatus()); });
  }
  void CloseTransfer(const kvtransfer::TransferKey& key, std::function<void()> quiesced) override {
    {
      absl::MutexLock lock(&mu);
      closed.push_back(key);
    }
    quiesced();
  }
  uint64_t bytes_total() const override { return bytes; }

  absl::Mutex mu;
  std::vector<kvtransfer::TransferKey> opened, closed;
  std::vector<std::string> setups;
  std::vector<kvtransfer::DeviceKvTarget> targets;
  std::vector<kvtransfer::FrameDescriptor> frames;
  uint64_t bytes = 0;

 private:
  const kvtransfer::KvTransport transport_;
  std::vector<std::thread> threads_;  // guarded by mu
};

}  // namespace tandem::worker_testing

#endif  // TANDEM_TESTS_DECODE_WORKER_FAKE_DATA_PLANE_H_
