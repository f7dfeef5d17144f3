// Helpers for the KV transfer tests: reference K/V data, in-memory and
// block-pool KvWriters, a recorder for `done`, and a raw-socket peer that
// speaks the wire format byte by byte (to send malformed input).
#ifndef TANDEM_TESTS_KVTRANSFER_KV_TEST_UTIL_H_
#define TANDEM_TESTS_KVTRANSFER_KV_TEST_UTIL_H_

#include <chrono>
#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "engine/kv/block_pool.h"
#include "kvtransfer/kv_transfer.h"
#include "kvtransfer/tcp.h"
#include "kvtransfer/wire.h"

namespace tandem::kvtransfer::testing {

// Layout with the given shape; the other fields are fixed test values.
KvLayout TestLayout(uint32_t n_layers, uint32_t n_kv_heads, uint32_t head_dim);

// K and V for every (layer, token) of a prompt: random 32-bit patterns
// (NaNs and denormals included), so any bit flip or misplacement shows.
class RefKv {
 public:
  RefKv(const KvLayout& layout, uint32_t prompt_len, uint32_t seed);
  const float* K(uint32_t layer, uint32_t token) const;
  const float* V(uint32_t layer, uint32_t token) const;
  uint32_t kv_dim() const { return kv_dim_; }

 private:
  uint32_t kv_dim_;
  uint32_t prompt_len_;
  std::vector<float> k_, v_;  // [layer][token][kv_dim]
};

// Sends tokens [start, end) of every layer in chunks of `chunk` tokens,
// chunk-major (the order a chunked prefill produces them). Stops at the
// first error.
absl::Status SendRange(KvSender& sender, const RefKv& ref, uint32_t n_layers,
                       uint32_t start, uint32_t end, uint32_t chunk);

// KvWriter over dense [layer][token][kv_dim] vectors. If a gate is armed,
// WriteRows blocks until Release() (to cancel during a write).
class VectorKvWriter : public KvWriter {
 public:
  VectorKvWriter(const KvLayout& layout, uint32_t prompt_len);
  void WriteRows(uint32_t layer, uint32_t token_start, uint32_t token_count,
                 const float* k, const float* v) override;
  const float* K(uint32_t layer, uint32_t token) const;
  const float* V(uint32_t layer, uint32_t token) const;

  void ArmGate();
  // Waits until a write is blocked at the gate.
  bool WaitBlocked(std::chrono::milliseconds timeout);
  void Release();
  int writes_started() const;
  int writes_finished() const;

 private:
  uint32_t kv_dim_;
  uint32_t prompt_len_;
  std::vector<float> k_, v_;
  mutable absl::Mutex mu_;
  bool gate_armed_ ABSL_GUARDED_BY(mu_) = false;
  bool blocked_ ABSL_GUARDED_BY(mu_) = false;
  int started_ ABSL_GUARDED_BY(mu_) = 0;
  int finished_ ABSL_GUARDED_BY(mu_) = 0;
};

// KvWriter over a BlockPool and a block table (what D does).
class BlockPoolWriter : public KvWriter {
 public:
  BlockPoolWriter(kv::BlockPool* pool, std::vector<int32_t> block_table)
      : pool_(pool), table_(std::move(block_table)) {}
  void WriteRows(uint32_t layer, uint32_t token_start, uint32_t token_count,
                 const float* k, const float* v) override;
  const std::vector<int32_t>& block_table() const { return table_; }

 private:
  kv::BlockPool* pool_;
  std::vector<int32_t> table_;
};

// Records every call of a DoneCallback.
class DoneRecorder {
 public:
  // `on_done` (optional) runs inside the callback, before it is recorded.
  KvReceiver::DoneCallback Callback(std::function<void()> on_done = nullptr);
  // True once the callback ran (within `timeout`).
  bool Wait(std::chrono::milliseconds timeout = std::chrono::seconds(5));
  int calls() const;
  absl::Status status() const;
  TransferResult result() const;

 private:
  mutable absl::Mutex mu_;
  int calls_ ABSL_GUARDED_BY(mu_) = 0;
  absl::Status status_ ABSL_GUARDED_BY(mu_);
  TransferResult result_ ABSL_GUARDED_BY(mu_);
};

// A client socket to 127.0.0.1:port that sends raw bytes.
class RawPeer {
 public:
  static absl::StatusOr<RawPeer> Connect(int port);
  absl::Status Send(const std::string& bytes);
  // Next message within timeout.
  absl::Status Read(uint32_t* type, std::string* payload,
                    std::chrono::milliseconds timeout = std::chrono::seconds(3));
  // Reads the next message: a REJECT as is, an ACCEPT as code OK; anything
  // else is INTERNAL.
  absl::StatusOr<wire::Reject> ReadVerdict();
  // Sends HELLO and returns the verdict (code OK for ACCEPT).
  absl::StatusOr<wire::Reject> Hello(const std::string& request_id,
                                     uint32_t attempt, const KvLayout& layout);

 private:
  explicit RawPeer(tcp::ScopedFd fd) : fd_(std::move(fd)) {}
  tcp::ScopedFd fd_;
};

}  // namespace tandem::kvtransfer::testing

#endif  // TANDEM_TESTS_KVTRANSFER_KV_TEST_UTIL_H_
