// Helpers for the KV transfer tests: reference K/V data, in-memory and
// block-pool KvWriters, a recorder for `done`, and a raw-socket peer that
// speaks the wire format byte by byte (to send malformed input).
#ifndef TANDEM_TESTS_KVTRANSFER_KV_TEST_UTIL_H_
#define TANDEM_TESTS_KVTRANSFER_KV_TEST_UTIL_H_

#include <chrono>
#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "gtest/gtest.h"
#include "engine/kv/block_pool.h"
#include "engine/kv/cpu_kv_storage.h"
#include "kvtransfer/kv_transfer.h"
#include "kvtransfer/tcp.h"
#include "kvtransfer/wire.h"

namespace tandem::kvtransfer::testing {

// The bit-exact class the test senders announce unless a test says else.
inline constexpr char kTestBitExactClass[] = "tandem-test/x86_64/v2";
// Deadline of the test senders' handshakes and sends.
inline constexpr int kSenderTimeoutMs = 2000;

// Layout with the given shape and dtype; the fingerprint is a fixed test
// value ("test-model-fp").
KvLayout TestLayout(uint32_t n_layers, uint32_t n_kv_heads, uint32_t head_dim,
                    KvDtype dtype = KvDtype::kF32);

// FINAL samples: one sample, no top logprobs.
std::vector<FinalSample> OneSample(int32_t token = 0, float logprob = 0.0f,
                                   uint32_t finish_reason = 0);
// FINAL samples, sample i with n_tops[i] top logprobs; every token,
// logprob and finish_reason is drawn from `seed` (ints over their whole
// range, negatives included; floats as random finite bit patterns, so
// signs, denormals and -0 show), so any swap or misplacement shows.
std::vector<FinalSample> RandomSamples(const std::vector<uint32_t>& n_tops,
                                       uint32_t seed);
// Success iff `got` equals `want` field by field, floats bit for bit;
// otherwise names the first differing field, e.g.
// "samples[1].top_logprobs[3].logprob: got bits 0x..., want 0x...".
::testing::AssertionResult SameSamples(const std::vector<FinalSample>& got,
                                       const std::vector<FinalSample>& want);

// K and V for every (layer, token) of a prompt as raw bytes in the layout's
// dtype: random bit patterns (for f32 NaNs and denormals included), so any
// bit flip or misplacement shows. Each row is layout.RowBytes() bytes.
class RefKv {
 public:
  RefKv(const KvLayout& layout, uint32_t prompt_len, uint32_t seed);
  // Row of (layer, token); rows of consecutive tokens are contiguous.
  const char* K(uint32_t layer, uint32_t token) const;
  const char* V(uint32_t layer, uint32_t token) const;
  uint64_t row_bytes() const { return row_bytes_; }

 private:
  uint64_t row_bytes_;
  uint32_t prompt_len_;
  std::vector<char> k_, v_;  // [layer][token][row_bytes]
};

// Sends tokens [start, end) of every layer in chunks of `chunk` tokens,
// chunk-major (the order a chunked prefill produces them). Stops at the
// first error.
absl::Status SendRange(KvSender& sender, const RefKv& ref, uint32_t n_layers,
                       uint32_t start, uint32_t end, uint32_t chunk);

// KvWriter over dense [layer][token][row_bytes] byte vectors (zeros until
// written). If a gate is armed, WriteRows blocks until Release() (to cancel
// during a write).
class VectorKvWriter : public KvWriter {
 public:
  VectorKvWriter(const KvLayout& layout, uint32_t prompt_len);
  void WriteRows(uint32_t layer, uint32_t token_start, uint32_t token_count,
                 const char* k, const char* v) override;
  const char* K(uint32_t layer, uint32_t token) const;
  const char* V(uint32_t layer, uint32_t token) const;

  void ArmGate();
  // Waits until a write is blocked at the gate.
  bool WaitBlocked(std::chrono::milliseconds timeout);
  void Release();
  int writes_started() const;
  int writes_finished() const;

 private:
  uint64_t row_bytes_;
  uint32_t prompt_len_;
  std::vector<char> k_, v_;
  mutable absl::Mutex mu_;
  bool gate_armed_ ABSL_GUARDED_BY(mu_) = false;
  bool blocked_ ABSL_GUARDED_BY(mu_) = false;
  int started_ ABSL_GUARDED_BY(mu_) = 0;
  int finished_ ABSL_GUARDED_BY(mu_) = 0;
};

// KvWriter over a KV storage and a block table (what D does); the
// storage's dtype must be the layout's.
class StorageWriter : public KvWriter {
 public:
  StorageWriter(kv::KvStorage* pool, std::vector<int32_t> block_table)
      : pool_(pool), table_(std::move(block_table)) {}
  void WriteRows(uint32_t layer, uint32_t token_start, uint32_t token_count,
                 const char* k, const char* v) override;
  const std::vector<int32_t>& block_table() const { return table_; }

 private:
  kv::KvStorage* pool_;
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
  // Sends HELLO (v3, transport tcp, class kTestBitExactClass) and returns the verdict
  // (code OK for ACCEPT).
  absl::StatusOr<wire::Reject> Hello(const std::string& request_id,
                                     uint32_t attempt, const KvLayout& layout);
  // Sends `hello` as it is (any version or dtype) and returns the verdict.
  absl::StatusOr<wire::Reject> Hello(const wire::Hello& hello);

 private:
  explicit RawPeer(tcp::ScopedFd fd) : fd_(std::move(fd)) {}
  tcp::ScopedFd fd_;
};

// Fixture with one KvReceiver on 127.0.0.1 (ephemeral port) per test.
class ReceiverTest : public ::testing::Test {
 protected:
  // Starts the receiver for `layout` with the given timeouts (ms) and
  // Options::log (empty: none).
  void Start(const KvLayout& layout, int handshake_ms = 2000, int transfer_ms = 2000,
             std::function<void(std::string_view)> log = nullptr);
  std::string Endpoint() const;
  // A sender of layout_ and kTestBitExactClass for (id, attempt).
  absl::StatusOr<std::unique_ptr<KvSender>> Connect(const std::string& id, uint32_t attempt);

  KvLayout layout_;
  std::unique_ptr<KvReceiver> receiver_;
};

}  // namespace tandem::kvtransfer::testing

#endif  // TANDEM_TESTS_KVTRANSFER_KV_TEST_UTIL_H_
