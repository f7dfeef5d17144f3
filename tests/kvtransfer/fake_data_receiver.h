// A host-memory stand-in for a device data path's receiving end
// (KvDataReceiver, data_plane.h), for the KV connection's control-plane
// tests: Receive "moves" a frame by copying its rows out of a shared host
// buffer (RefKv, what the sender would have sent) into a VectorKvWriter (D's
// blocks), on its own worker thread, never inline. Jobs run in order; the
// test can hold them (to look at the state while receives are in flight),
// fail a chosen frame, or make OpenTransfer fail. CloseTransfer's
// `quiesced` runs on the worker thread after every job queued before it
// (frames of a closed key complete with CANCELLED, nothing copied), so a
// held worker also holds `quiesced`.
//
// Every call is logged in order ("open r/1", "receive r/1 #0",
// "received r/1 #0 OK" just before that frame's `done`, "close r/1",
// "quiesced r/1") for ordering checks; `done` callbacks the
// test records can append to the same log (Log).
#ifndef TANDEM_TESTS_KVTRANSFER_FAKE_DATA_RECEIVER_H_
#define TANDEM_TESTS_KVTRANSFER_FAKE_DATA_RECEIVER_H_

#include <chrono>
#include <cstdint>
#include <deque>
#include <functional>
#include <map>
#include <optional>
#include <set>
#include <string>
#include <thread>
#include <vector>

#include "absl/status/status.h"
#include "absl/synchronization/mutex.h"
#include "kvtransfer/data_plane.h"
#include "kvtransfer/send_queue.h"
#include "tests/kvtransfer/kv_test_util.h"

namespace tandem::kvtransfer::testing {

// A KvWriter whose rows go "to the device": device_target() is set, and
// WriteRows (the tcp path) must not be called. `rows` is where the fake
// data receiver copies to.
class DeviceWriter : public KvWriter {
 public:
  DeviceWriter(const KvLayout& layout, uint32_t prompt_len)
      : rows(layout, prompt_len), target_{nullptr, {0, 1, 2}} {}
  const DeviceKvTarget* device_target() const override { return &target_; }
  void WriteRows(uint32_t, uint32_t, uint32_t, const char*, const char*) override {
    ADD_FAILURE() << "WriteRows on a device writer";
  }
  VectorKvWriter rows;

 private:
  DeviceKvTarget target_;
};

class FakeDataReceiver : public KvDataReceiver {
 public:
  // Frames are copied from `source` into `dest` (both must outlive it).
  FakeDataReceiver(KvTransport transport, const RefKv* source, VectorKvWriter* dest);
  ~FakeDataReceiver() override;  // runs the jobs left, then stops

  KvTransport transport() const override { return transport_; }
  absl::Status OpenTransfer(const TransferKey& key, std::string_view transport_setup,
                            const DeviceKvTarget& target) override;
  void Receive(const TransferKey& key, const FrameDescriptor& frame,
               std::function<void(absl::Status)> done) override;
  void CloseTransfer(const TransferKey& key, std::function<void()> quiesced) override;
  uint64_t bytes_total() const override;

  // Test controls.
  void Hold();     // the worker stops before its next job
  void Release();  // ... and goes on
  void FailOpen(absl::Status s);
  // The frame with this index (0-based, over all Receive calls) completes
  // with `s`, nothing copied.
  void FailFrame(int index, absl::Status s);
  void Log(const std::string& line);

  // Waits (bounded) until `n` Receive / CloseTransfer calls were made.
  bool WaitFrames(size_t n, std::chrono::milliseconds timeout = std::chrono::seconds(5));
  bool WaitCloses(size_t n, std::chrono::milliseconds timeout = std::chrono::seconds(5));

  std::vector<FrameDescriptor> frames() const;
  std::vector<std::string> setups() const;       // OpenTransfer's, in order
  std::vector<std::string> log() const;
  int closes() const;
  const DeviceKvTarget* last_target() const;

 private:
  struct Job {
    int index = -1;  // frames: the Receive call's index
    TransferKey key;
    FrameDescriptor frame;
    std::function<void(absl::Status)> done;  // a frame
    std::function<void()> quiesced;          // a close
    absl::Status fail;
  };
  void Run();
  static std::string Name(const TransferKey& k);

  const KvTransport transport_;
  const RefKv* source_;
  VectorKvWriter* dest_;
  mutable absl::Mutex mu_;
  bool held_ ABSL_GUARDED_BY(mu_) = false;
  bool stop_ ABSL_GUARDED_BY(mu_) = false;
  absl::Status open_error_ ABSL_GUARDED_BY(mu_);
  std::map<int, absl::Status> fail_ ABSL_GUARDED_BY(mu_);
  std::deque<Job> jobs_ ABSL_GUARDED_BY(mu_);
  std::set<std::string> closed_ ABSL_GUARDED_BY(mu_);
  std::vector<FrameDescriptor> frames_ ABSL_GUARDED_BY(mu_);
  std::vector<std::string> setups_ ABSL_GUARDED_BY(mu_);
  std::vector<std::string> log_ ABSL_GUARDED_BY(mu_);
  int closes_ ABSL_GUARDED_BY(mu_) = 0;
  uint64_t bytes_ ABSL_GUARDED_BY(mu_) = 0;
  const DeviceKvTarget* target_ ABSL_GUARDED_BY(mu_) = nullptr;
  std::thread worker_;
};

// The queue's result for `id` once known, polling every millisecond for
// at most `timeout`; nullopt if it is still running then.
std::optional<absl::Status> WaitQueueResult(
    KvSendQueue& queue, KvSendQueue::TransferId id,
    std::chrono::milliseconds timeout = std::chrono::seconds(10));

// Index of the first entry equal to `entry` in `log`, or -1.
int LogPos(const std::vector<std::string>& log, const std::string& entry);

}  // namespace tandem::kvtransfer::testing

#endif  // TANDEM_TESTS_KVTRANSFER_FAKE_DATA_RECEIVER_H_
