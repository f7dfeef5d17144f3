// Helpers shared by the decode and prefill worker tests: the stories260K
// model and its greedy goldens (../shared), reference K/V computed by a
// plain LlamaModel::Forward, a KvWriter over a test KV storage, each
// worker's engine without gRPC (built as the worker mains build them), and
// recorders for the asynchronous `done` callbacks of SubmitPrefill and
// KvReceiver.
#ifndef TANDEM_TESTS_DECODE_WORKER_WORKER_TEST_UTIL_H_
#define TANDEM_TESTS_DECODE_WORKER_WORKER_TEST_UTIL_H_

#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "gtest/gtest.h"
#include "decode_worker/remote_kv_loader.h"
#include "engine/core/engine_core.h"
#include "engine/gguf/gguf_file.h"
#include "engine/kv/cpu_kv_storage.h"
#include "engine/model/llama_model.h"
#include "kvtransfer/kv_transfer.h"
#include "prefill_worker/prefill_call.h"

namespace tandem::worker_testing {

// stories260K's shape, from its GGUF metadata (llama.block_count,
// llama.attention.head_count_kv, embedding_length / head_count), vocabulary
// and context length. Tests assert the loaded config matches before using
// these to compute expected byte counts.
inline constexpr int32_t kStoriesLayers = 5;
inline constexpr int32_t kStoriesKvHeads = 4;
inline constexpr int32_t kStoriesHeadDim = 8;
inline constexpr int32_t kStoriesVocab = 512;
inline constexpr int32_t kStoriesContext = 2048;

// K+V payload bytes for `tokens` tokens of every stories260K layer:
// layers * tokens * 2 (K, V) * kv_heads * head_dim * 4 (f32).
inline uint64_t StoriesKvBytes(int64_t tokens) {
  return static_cast<uint64_t>(kStoriesLayers) * static_cast<uint64_t>(tokens) * 2 *
         kStoriesKvHeads * kStoriesHeadDim * 4;
}

// An opened GGUF file and the model built from it (the file outlives it).
struct TestModel {
  std::unique_ptr<gguf::GgufFile> file;
  std::unique_ptr<model::LlamaModel> model;
};

// Opens and loads ../shared/models/stories260K.gguf; fails the current test
// (ADD_FAILURE) and returns nulls on error.
TestModel LoadStories();

// Checks (EXPECT) that `config` has stories260K's shape, which the byte
// counts and token ids in the worker tests assume.
void ExpectStoriesShape(const model::LlamaConfig& config);

// Fixture: stories260K loaded for each test and its shape checked.
class StoriesTest : public ::testing::Test {
 protected:
  void SetUp() override;
  const model::LlamaModel& model() const { return *loaded_.model; }

 private:
  TestModel loaded_;
};

// One case of ../shared/goldens/stories260K_greedy.json (F32 KV variant).
struct GoldenCase {
  std::string name;
  std::vector<int32_t> prompt;     // prompt_token_ids_with_bos
  std::vector<int32_t> generated;  // generated_token_ids_f32kv
  size_t strict = 0;               // strict_prefix_len_f32kv
};

// Every golden case, parsed once per process; empty (with ADD_FAILURE) when
// the file cannot be read or parsed.
const std::vector<GoldenCase>& GoldenCases();
// The case called `name`; fails the test and returns an empty case when
// absent.
GoldenCase Golden(const std::string& name);

// The first `n` entries of `ids` (all of them when shorter).
std::vector<int32_t> Prefix(const std::vector<int32_t>& ids, size_t n);

// A prompt's KV cache computed by one plain forward in a private storage:
// the reference both for what P must send and for what D must hold.
struct PromptKv {
  std::unique_ptr<kv::CpuKvStorage> pool;
  std::vector<int32_t> table;
  std::vector<float> logits;  // last prompt token's logits, vocab entries
};
PromptKv ComputePromptKv(const model::LlamaModel& model,
                         const std::vector<int32_t>& prompt, int32_t block_size);

// K and V rows of tokens [start, start + count) of one layer, concatenated
// (K then V), [count][kv_dim] floats each, for memcmp comparisons.
std::vector<float> LayerRows(const kv::KvStorage& pool, const std::vector<int32_t>& table,
                             int32_t layer, int32_t start, int32_t count);

// The KV layout of stories260K's F32 cache under `fingerprint` (what both
// workers of a test offer).
kvtransfer::KvLayout StoriesLayout(const model::LlamaModel& model,
                                   const std::string& fingerprint);

// Sends tokens [start, end) of every layer of `kv` as one frame per layer.
absl::Status SendPromptKv(kvtransfer::KvSender& sender, const PromptKv& kv,
                          int32_t n_layers, int32_t start, int32_t end);

// KvWriter over a test KV storage and a block table (what D does).
class PoolKvWriter : public kvtransfer::KvWriter {
 public:
  PoolKvWriter(kv::KvStorage* pool, std::vector<int32_t> table)
      : pool_(pool), table_(std::move(table)) {}
  void WriteRows(uint32_t layer, uint32_t token_start, uint32_t token_count,
                 const char* k, const char* v) override;
  const std::vector<int32_t>& table() const { return table_; }

 private:
  kv::KvStorage* pool_;
  std::vector<int32_t> table_;
};

// What a worker's config sets for its engine, with the tests' defaults.
struct WorkerOptions {
  int32_t block_size = 16;
  int32_t num_kv_blocks = 256;
  int32_t max_local_prefill_tokens = 32;
  int32_t handshake_timeout_ms = 2000;
  int32_t transfer_timeout_ms = 2000;
  int32_t fault_stall_after_frames = -1;  // prefill only
  uint64_t send_buffer_bytes = 268435456;  // prefill only: per decode worker
  std::string fingerprint = "stories260K-test-fingerprint";
};

// The engine core's options for `o` (the config defaults otherwise: token
// budget 2048, 64 sequences, chunks of 512, prefix caching on), EOS 2.
core::EngineCoreOptions CoreOptions(const WorkerOptions& o, const std::string& label);

// The decode worker's engine without gRPC, as decode_worker/main.cc builds
// it: the engine core over the CPU backend with the KV receiver as its
// remote KV loader. Submit sets the request's output.
class TestDecodeWorker {
 public:
  // Null (with ADD_FAILURE) when the receiver cannot start.
  static std::unique_ptr<TestDecodeWorker> Create(const WorkerOptions& options,
                                                  const model::LlamaModel* model);
  absl::Status Submit(core::EngineRequest request, std::shared_ptr<core::RequestOutput> output);
  void Cancel(const std::string& id) { core_->Cancel(id); }
  void Shutdown() { core_->Shutdown(); }
  core::CoreStats GetStats() const { return core_->GetStats(); }
  std::string kv_endpoint() const { return receiver_->endpoint(); }

 private:
  std::unique_ptr<core::EngineCore> core_;
  const decode::ReceiverKvLoader* receiver_ = nullptr;
};

// The prefill worker's engine without gRPC, as prefill_worker/main.cc
// builds it: the engine core over the CPU backend, Prefill calls through
// prefill::SubmitPrefill.
class TestPrefillWorker {
 public:
  TestPrefillWorker(const WorkerOptions& options, const model::LlamaModel* model);
  void Submit(prefill::PrefillRequest request, prefill::PrefillDone done) {
    prefill::SubmitPrefill(*core_, send_, std::move(request), std::move(done));
  }
  void Cancel(const std::string& id) { core_->Cancel(id); }
  void Shutdown() { core_->Shutdown(); }
  core::CoreStats GetStats() const { return core_->GetStats(); }

 private:
  prefill::KvSendOptions send_;
  std::unique_ptr<core::EngineCore> core_;
};

// Records the one call of a prefill::PrefillDone (any thread).
class PrefillDoneRecorder {
 public:
  prefill::PrefillDone Callback();
  // The result, or nullopt when `done` has not run within `timeout`.
  std::optional<absl::StatusOr<prefill::PrefillResult>> Wait(
      absl::Duration timeout = absl::Seconds(3));
  int calls() const;

 private:
  mutable absl::Mutex mu_;
  int calls_ ABSL_GUARDED_BY(mu_) = 0;
  std::optional<absl::StatusOr<prefill::PrefillResult>> result_ ABSL_GUARDED_BY(mu_);
};

// Records the one call of a KvReceiver::DoneCallback (receiver thread).
class KvDoneRecorder {
 public:
  kvtransfer::KvReceiver::DoneCallback Callback();
  // True once `done` has run (within `timeout`).
  bool Wait(absl::Duration timeout = absl::Seconds(3));
  int calls() const;
  absl::Status status() const;
  kvtransfer::TransferResult result() const;

 private:
  mutable absl::Mutex mu_;
  int calls_ ABSL_GUARDED_BY(mu_) = 0;
  absl::Status status_ ABSL_GUARDED_BY(mu_);
  kvtransfer::TransferResult result_ ABSL_GUARDED_BY(mu_);
};

}  // namespace tandem::worker_testing

#endif  // TANDEM_TESTS_DECODE_WORKER_WORKER_TEST_UTIL_H_
