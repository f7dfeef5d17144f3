// A P plane and a D plane joined by one FakeNcclFactory (the KV connection
// between them is played by the test: it hands P's setup and descriptors
// to D), with host KV on both sides and a recorder for `done`.
#ifndef TANDEM_TESTS_KVTRANSFER_NCCL_NCCL_PAIR_H_
#define TANDEM_TESTS_KVTRANSFER_NCCL_NCCL_PAIR_H_

#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "absl/synchronization/mutex.h"
#include "gtest/gtest.h"
#include "kvtransfer/nccl/nccl_data_plane.h"
#include "kvtransfer/nccl/transport_setup.h"
#include "nccl_test_util.h"

namespace tandem::kvtransfer::nccl::testing {

// Collects `done` results and the threads they ran on.
class DoneRecorder {
 public:
  std::function<void(absl::Status)> Callback() {
    return [this](absl::Status status) {
      absl::MutexLock lock(&mu_);
      statuses_.push_back(std::move(status));
      threads_.push_back(std::this_thread::get_id());
    };
  }
  // Waits for `n` results (generous bound); returns them.
  std::vector<absl::Status> Wait(size_t n) {
    WaitFor([&] { return size() >= n; });
    absl::MutexLock lock(&mu_);
    return statuses_;
  }
  size_t size() {
    absl::MutexLock lock(&mu_);
    return statuses_.size();
  }
  std::vector<std::thread::id> threads() {
    absl::MutexLock lock(&mu_);
    return threads_;
  }

 private:
  absl::Mutex mu_;
  std::vector<absl::Status> statuses_;
  std::vector<std::thread::id> threads_;
};

class NcclPairTest : public ::testing::Test {
 protected:
  static constexpr int kLayers = 3;

  // Generous deadlines unless a test lowers them (watchdog tests).
  void MakePlanes(int transfer_timeout_ms = 20000, int init_timeout_ms = 20000) {
    NcclDataPlaneOptions options;
    options.transfer_timeout_ms = transfer_timeout_ms;
    options.init_timeout_ms = init_timeout_ms;
    options.log = [this](std::string_view line) {
      absl::MutexLock lock(&log_mu_);
      log_.emplace_back(line);
    };
    auto p = NcclDataPlane::CreateForTesting(options, factory_, device_);
    auto d = NcclDataPlane::CreateForTesting(options, factory_, device_);
    ASSERT_TRUE(p.ok()) << p.status();
    ASSERT_TRUE(d.ok()) << d.status();
    p_ = *std::move(p);
    d_ = *std::move(d);
  }
  void SetUp() override {
    p_kv_.FillRandom(7);
    MakePlanes();
  }
  void TearDown() override {
    p_.reset();
    d_.reset();
    // Every staging buffer and stream was given back.
    EXPECT_EQ(device_->live_buffers(), 0);
    EXPECT_EQ(device_->live_streams(), 0);
  }

  KvDataSender& sender() { return *p_->sender(); }
  KvDataReceiver& receiver() { return *d_->receiver(); }

  // P's OpenTransfer to the test's D, decoded.
  NcclSetup Open(const TransferKey& key, const std::string& d_instance = "d-instance") {
    auto setup = sender().OpenTransfer(key, TransportPeer{"127.0.0.1:9000", "host", d_instance});
    EXPECT_TRUE(setup.ok()) << setup.status();
    raw_setup_ = setup.ok() ? *setup : "";
    auto decoded = DecodeNcclSetup(raw_setup_);
    EXPECT_TRUE(decoded.ok()) << decoded.status();
    return decoded.ok() ? *decoded : NcclSetup{};
  }
  absl::Status OpenD(const TransferKey& key) {
    return receiver().OpenTransfer(key, raw_setup_, DeviceKvTarget{&d_kv_, d_table_});
  }
  absl::StatusOr<FrameDescriptor> Send(const TransferKey& key, int layer, int start, int count) {
    return sender().SendRows(key, p_kv_, p_table_, layer, start, count);
  }
  // Whether D's rows equal P's for [start, start + count) of every layer.
  bool SameRows(int start, int count) {
    for (int layer = 0; layer < kLayers; ++layer) {
      if (p_kv_.Rows(p_table_, layer, start, count) != d_kv_.Rows(d_table_, layer, start, count)) {
        return false;
      }
    }
    return true;
  }
  // P's Poll until it gives a value.
  absl::Status PollUntilDone(const TransferKey& key, const absl::Status& control) {
    std::optional<absl::Status> result;
    WaitFor([&] { return (result = sender().Poll(key, control)).has_value(); });
    return result.value_or(absl::InternalError("test: Poll never gave a value"));
  }

  std::shared_ptr<FakeNcclFactory> factory_ = std::make_shared<FakeNcclFactory>();
  std::shared_ptr<HostDeviceOps> device_ = std::make_shared<HostDeviceOps>();
  // P: blocks of 4 tokens; D: blocks of 8 (token addressing on both sides).
  HostKv p_kv_{kLayers, 16, 4, 8, kv::KvDtype::kF32};
  HostKv d_kv_{kLayers, 16, 8, 8, kv::KvDtype::kF32};
  std::vector<int32_t> p_table_{5, 2, 9, 14, 0};  // 20 tokens
  std::vector<int32_t> d_table_{3, 11, 6};        // 24 tokens
  std::string raw_setup_;
  std::unique_ptr<NcclDataPlane> p_;
  std::unique_ptr<NcclDataPlane> d_;
  absl::Mutex log_mu_;
  std::vector<std::string> log_;
};

}  // namespace tandem::kvtransfer::nccl::testing

#endif  // TANDEM_TESTS_KVTRANSFER_NCCL_NCCL_PAIR_H_
