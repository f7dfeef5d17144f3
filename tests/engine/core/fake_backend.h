// Test doubles for the engine core's seams.
//
// FakeBackend: a ModelBackend whose "model" is a pure function of the
// sequence (FakeNextToken). Its forward writes each token's id and position
// into the KV cache and, to sample, reads the sequence's ids back from the
// cache: like a real model, its output depends on the KV it finds, so KV
// that a remote load, the prefix cache or preemption got wrong changes the
// tokens. The logits put 8.0 on the next token and small hashed values
// elsewhere, and go through the real sampling reduction.
//
// EventLog: an ordered, thread-safe record of what the fake backend
// computed and what exports sent (overlap tests).
// HostDeviceKvStorage: the shared host-memory kv::DeviceKvAccess
// (host_device_kv.h) that is also a kv::KvStorage: the core's device-rows
// export path without a GPU.
//
// FakeLoader: a RemoteKvLoader the test drives (complete, fail, quiesce).
// FakeExport: a KvExport that records what the core sends; the test says
// when its receiver has room (SetRoom) and when the transfer's result
// arrives (HoldResult / ReleaseResult), and each change wakes the core.
#ifndef TANDEM_TESTS_ENGINE_CORE_FAKE_BACKEND_H_
#define TANDEM_TESTS_ENGINE_CORE_FAKE_BACKEND_H_

#include <atomic>
#include <cstdint>
#include <map>
#include <memory>
#include <span>
#include <string>
#include <thread>
#include <vector>

#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "engine/backend/model_backend.h"
#include "engine/core/request.h"
#include "engine/kv/cpu_kv_storage.h"
#include "engine/kv/device_kv.h"
#include "tests/engine/kv/host_device_kv.h"

namespace tandem::core::testing {

inline constexpr int32_t kFakeVocab = 64;
inline constexpr int32_t kFakeLayers = 2;
// Token the fake never generates (the tests' EOS unless they pick one).
inline constexpr int32_t kFakeUnusedToken = 1;
// Generated when the KV cache does not hold the sequence it should.
inline constexpr int32_t kFakeCorruptKvToken = 0;

// Next token after `tokens`, in [2, kFakeVocab).
int32_t FakeNextToken(std::span<const int32_t> tokens);
// The first n tokens the fake model generates after `prompt`, alone.
std::vector<int32_t> FakeGenerate(const std::vector<int32_t>& prompt, int32_t n);
// A prompt of n tokens in [2, kFakeVocab). Seeds 0..61 start with different
// tokens, so two seeds never share a cached prefix block.
std::vector<int32_t> FakePrompt(int32_t n, int32_t seed);

class EventLog {
 public:
  void Add(std::string event);
  std::vector<std::string> events() const;

 private:
  mutable absl::Mutex mu_;
  std::vector<std::string> events_ ABSL_GUARDED_BY(mu_);
};

// The shared host KV (tests/engine/kv/host_device_kv.h, F32, PagedKv
// pools in host memory, synchronous copies, no layer events) behind
// kv::KvStorage too: layer_blocks = num_blocks. gathers() counts the
// GatherRows calls that passed their checks.
class HostDeviceKvStorage final : public kv::KvStorage, public kv::testing::HostDeviceKv {
 public:
  HostDeviceKvStorage(const kv::KvShape& shape, int32_t num_blocks)
      : HostDeviceKv(shape.n_layers, num_blocks, shape.block_size, shape.kv_dim(),
                     kv::KvDtype::kF32),
        shape_(shape),
        num_blocks_(num_blocks) {}

  using kv::KvStorage::row_bytes;
  const kv::KvShape& shape() const override { return shape_; }
  kv::KvDtype dtype() const override { return kv::KvDtype::kF32; }
  int32_t num_blocks() const override { return num_blocks_; }
  void ReadTokens(std::span<const int32_t> block_table, int32_t layer, int32_t token_start,
                  int32_t count, char* k_out, char* v_out) const override {
    HostDeviceKv::ReadTokens(block_table, layer, token_start, count, k_out, v_out);
  }
  void WriteTokens(std::span<const int32_t> block_table, int32_t layer, int32_t token_start,
                   int32_t count, const char* k, const char* v) override {
    HostDeviceKv::WriteTokens(block_table, layer, token_start, count, k, v);
  }

 private:
  const kv::KvShape shape_;
  const int32_t num_blocks_;
};

class FakeBackend final : public backend::ModelBackend {
 public:
  // With `device_kv`, the KV cache is a HostDeviceKvStorage (the device
  // rows export path); else a CpuKvStorage.
  FakeBackend(int32_t block_size, int32_t num_blocks, int32_t context_length = 1024,
              bool device_kv = false);

  const model::LlamaConfig& config() const override { return config_; }
  kv::KvStorage& kv_storage() override { return *storage_; }
  std::string bit_exact_class() const override { return "fake/v1"; }
  // Never fails (OK), like the CPU backend.
  absl::Status Forward(std::span<const backend::ForwardEntry> batch,
                       const backend::LayerHook* hook,
                       std::vector<sampling::SamplingView>* views) override;

  // K and V row of one token as the fake writes them: {token id, position}.
  static void KvRow(int32_t token, int32_t pos, float* row);

  int forward_calls() const { return forward_calls_.load(); }
  // Forward adds "compute L<layer> E<entry>" to `log` (may be null: none)
  // when it has written that layer of that entry, before the layer hook
  // runs for it. Set before the core's first step.
  void set_event_log(EventLog* log) { log_ = log; }
  // Test controls (any thread): the next Forward waits, before computing,
  // until Resume(); WaitPaused (bounded) is true once it waits.
  void PauseNextForward();
  bool WaitPaused(absl::Duration timeout = absl::Seconds(3));
  void Resume();

 private:
  model::LlamaConfig config_;
  std::unique_ptr<kv::KvStorage> storage_;
  EventLog* log_ = nullptr;
  absl::Mutex gate_mu_;
  bool pause_next_ ABSL_GUARDED_BY(gate_mu_) = false;
  bool paused_ ABSL_GUARDED_BY(gate_mu_) = false;
  std::atomic<int> forward_calls_{0};
};

// Writes the fake's K/V of tokens[start, end) into `table`'s blocks.
void WriteFakeKv(kv::KvStorage& storage, const std::vector<int32_t>& table,
                 std::span<const int32_t> tokens, int32_t start, int32_t end);

// With `complete_with` set, StartLoad itself writes the prompt's KV and
// runs done(OK, token 0 = FakeNextToken(prompt)) before returning, so the
// load is complete at the core's next loop turn.
struct FakeLoaderOptions {
  std::map<std::string, std::vector<int32_t>> complete_with;  // id -> prompt
  bool quiesce_on_cancel = false;  // CancelLoad runs done(CANCELLED) on a thread
  absl::Status start_error;        // StartLoad fails with it (when not OK)
};

class FakeLoader final : public RemoteKvLoader {
 public:
  struct Load {
    std::string request_id;
    uint32_t attempt = 0;
    int32_t hit_tokens = 0;
    int32_t prompt_tokens = 0;
    kv::KvStorage* storage = nullptr;
    std::vector<int32_t> block_table;
    Done done;
    bool cancel_requested = false;
    bool done_called = false;
  };

  using Options = FakeLoaderOptions;
  explicit FakeLoader(Options options = {});
  ~FakeLoader() override;  // joins the quiesce threads

  absl::StatusOr<KvTarget> StartLoad(const std::string& request_id, uint32_t attempt,
                                     int32_t hit_tokens, int32_t prompt_tokens,
                                     kv::KvStorage* storage, std::vector<int32_t> block_table,
                                     Done done) override;
  void CancelLoad(const std::string& request_id) override;
  uint32_t loads_in_flight() const override;
  uint64_t bytes_received_total() const override { return 0; }

  // Waits (bounded) for StartLoad of `request_id` (of attempt >= `attempt`);
  // false on timeout.
  bool WaitStarted(const std::string& request_id, absl::Duration timeout = absl::Seconds(3),
                   uint32_t attempt = 1);
  // Writes the fake KV of prompt[hit, L) and runs done(OK, token 0 =
  // `first_token`, `reason`).
  void Complete(const std::string& request_id, const std::vector<int32_t>& prompt,
                int32_t first_token, FinishReason reason = FinishReason::kNone);
  // As Complete, with token 0 of every sample (n > 1).
  void CompleteSamples(const std::string& request_id, const std::vector<int32_t>& prompt,
                       std::vector<SampleStart> samples);
  // Runs done(status) with nothing written.
  void Fail(const std::string& request_id, const absl::Status& status);
  Load load(const std::string& request_id) const;  // a copy
  int starts() const;
  bool cancel_requested(const std::string& request_id) const;

 private:
  // Marks the load done and returns its callback (empty if already done).
  Done TakeDone(const std::string& request_id);

  const Options options_;
  mutable absl::Mutex mu_;
  std::map<std::string, Load> loads_ ABSL_GUARDED_BY(mu_);
  int starts_ ABSL_GUARDED_BY(mu_) = 0;
  std::vector<std::thread> threads_ ABSL_GUARDED_BY(mu_);
};

class FakeExport final : public KvExport {
 public:
  struct Sent {
    int32_t layer, start, count;
    std::vector<float> k, v;  // count rows of the fake's 2-float K/V
  };
  FakeExport(int32_t first_token_to_send, absl::Status open_status = absl::OkStatus(),
             int fail_send_at = -1)
      : first_(first_token_to_send), open_status_(open_status), fail_send_at_(fail_send_at) {}

  int32_t first_token_to_send() const override { return first_; }
  absl::Status Open(std::shared_ptr<const CancelFlag> cancelled, Wake wake) override;
  // Ready(): the room set by SetRoom (true at first).
  absl::StatusOr<bool> Ready() override;
  absl::Status SendLayer(int32_t layer, int32_t token_start, int32_t count, const char* k,
                         const char* v) override;
  // Records samples[0] as token() / finished_reason() and every sample.
  absl::Status Finish(const std::vector<SampleStart>& samples) override;
  // Result(): after Finish, `result` (OK unless the test said otherwise),
  // unless held.
  std::optional<absl::Status> Result() override;
  void Close() override;
  uint64_t bytes_sent() const override;

  // Test controls (any thread); each runs the core's wake.
  void SetRoom(bool room);
  // After `n` more SendLayer calls, Ready() says false (no wake).
  void FullAfterSends(int n);
  void HoldResult();
  void ReleaseResult(absl::Status result = absl::OkStatus());
  // How often the core asked Ready().
  int ready_calls() const;

  // Snapshots (any thread).
  std::vector<Sent> sent() const;
  int opens() const;
  int finishes() const;
  int closes() const;
  sampling::SampledToken finished_token() const;
  FinishReason finished_reason() const;
  std::vector<SampleStart> finished_samples() const;

 private:
  const int32_t first_;
  const absl::Status open_status_;
  const int fail_send_at_;  // the SendLayer call (0-based) that fails; < 0: none
  mutable absl::Mutex mu_;
  std::vector<Sent> sent_ ABSL_GUARDED_BY(mu_);
  int opens_ ABSL_GUARDED_BY(mu_) = 0;
  int finishes_ ABSL_GUARDED_BY(mu_) = 0;
  int closes_ ABSL_GUARDED_BY(mu_) = 0;
  Wake wake_ ABSL_GUARDED_BY(mu_);
  bool room_ ABSL_GUARDED_BY(mu_) = true;
  int full_after_ ABSL_GUARDED_BY(mu_) = -1;  // sent_.size() at which room_ goes false
  int ready_calls_ ABSL_GUARDED_BY(mu_) = 0;
  bool hold_result_ ABSL_GUARDED_BY(mu_) = false;
  absl::Status result_ ABSL_GUARDED_BY(mu_);
  uint64_t bytes_ ABSL_GUARDED_BY(mu_) = 0;
  sampling::SampledToken token_ ABSL_GUARDED_BY(mu_){};
  FinishReason reason_ ABSL_GUARDED_BY(mu_) = FinishReason::kCancelled;
  std::vector<SampleStart> samples_ ABSL_GUARDED_BY(mu_);
};

}  // namespace tandem::core::testing

#endif  // TANDEM_TESTS_ENGINE_CORE_FAKE_BACKEND_H_
