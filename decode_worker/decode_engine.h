// The decode worker's engine: admission, conditional local/remote prefill,
// and the continuous-batching loop over a paged KV cache.
//
// Owns: the KV block pool, every running sequence and its block table, the
// KV receiver, and the engine-loop thread. Does not touch: gRPC (requests
// arrive as DecodeRequest, results leave through DecodeSink), routing.
// Threads: one engine-loop thread runs every forward step and owns the
// sequences and the pool's free list; Submit/Cancel/GetStats are callable
// from any thread and only touch the inbox (guarded by mu_). KV receiver
// threads write K/V rows into blocks reserved for a remote transfer (never
// touched by the loop until the transfer is done) and post completions.
//
// Flow (DESIGN.md, steps 2-7): Submit validates and queues. The loop looks
// the prompt up in the prefix cache and decides: if L - hit <=
// max_local_prefill_tokens (or route LOCAL) the sequence goes to the
// scheduler for local (chunked) prefill; otherwise it reserves blocks for
// L + 1 tokens (FCFS; the head waits for blocks), the sink gets
// NeedRemotePrefill{hit} and the sequence waits for the KV receiver, then
// joins the scheduler as a decoding sequence. Each step runs one batched
// forward over what the scheduler planned (engine/scheduler: decode first,
// prefill chunks under the token budget, preemption by recompute when
// blocks run out).
#ifndef TANDEM_DECODE_WORKER_DECODE_ENGINE_H_
#define TANDEM_DECODE_WORKER_DECODE_ENGINE_H_

#include <atomic>
#include <cstdint>
#include <deque>
#include <map>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "common/serving_types.h"
#include "engine/kv/block_pool.h"
#include "engine/kv/kv_cache_manager.h"
#include "engine/model/llama_model.h"
#include "engine/sampling/sampler.h"
#include "engine/scheduler/scheduler.h"
#include "kvtransfer/kv_transfer.h"

namespace tandem::decode {

struct DecodeRequest {
  std::string request_id;
  std::vector<int32_t> prompt;  // BOS included; L = prompt.size()
  int32_t max_tokens = 1;       // >= 1
  sampling::SamplingOptions sampling;
  RouteChoice route = RouteChoice::kAuto;
};

// Where one request's results go (the gRPC stream). Called from the engine
// loop thread only, in this order: [NeedRemotePrefill] Token* Finish.
class DecodeSink {
 public:
  virtual ~DecodeSink() = default;
  virtual void NeedRemotePrefill(const std::string& kv_endpoint,
                                 uint32_t hit_tokens, uint32_t attempt) = 0;
  // prompt_tokens_computed: tokens this worker prefilled (first token only).
  virtual void Token(uint32_t index, int32_t token_id, float logprob,
                     uint32_t prompt_tokens_computed) = 0;
  // status OK with a reason, or the error that ended the request. Called
  // after the request's blocks and id are released.
  virtual void Finish(const absl::Status& status, FinishReason reason) = 0;
};

struct DecodeEngineOptions {
  std::string kv_host = "127.0.0.1";
  int kv_port = 0;                         // 0 = ephemeral
  int32_t block_size = 16;                 // tokens per KV block
  int32_t num_kv_blocks = 2048;            // pool size, blocks
  int32_t max_num_seqs = 64;               // max sequences per step
  int32_t max_num_batched_tokens = 2048;   // token budget per step
  int32_t prefill_chunk_tokens = 512;      // prefill tokens per sequence per step
  bool enable_prefix_caching = true;
  int32_t max_local_prefill_tokens = 32;   // conditional disaggregation
  int32_t handshake_timeout_ms = 5000;
  int32_t transfer_timeout_ms = 5000;
  int32_t eos_token_id = 2;
  std::string model_fingerprint;
};

struct DecodeStats {
  uint32_t running_requests = 0;   // admitted or waiting, not finished
  uint32_t kv_blocks_in_use = 0;   // ref count > 0
  uint32_t kv_blocks_cached = 0;   // findable in the prefix cache
  uint32_t kv_blocks_total = 0;
  uint32_t transfers_in_flight = 0;
  uint64_t prefill_tokens_computed_total = 0;
  uint64_t kv_bytes_received_total = 0;
  uint64_t decode_tokens_total = 0;
  uint32_t max_decode_batch_size = 0;  // sequences in the largest step
  uint64_t preemptions_total = 0;
};

class DecodeEngine {
 public:
  // Allocates the pool, starts the KV receiver and the loop. `model` must
  // outlive the engine. Errors: UNAVAILABLE when the KV port cannot be bound.
  static absl::StatusOr<std::unique_ptr<DecodeEngine>> Create(
      const DecodeEngineOptions& options, const model::LlamaModel* model);
  ~DecodeEngine();  // Shutdown(), then joins the loop

  // Queues a request. Errors (nothing queued, sink untouched):
  // INVALID_ARGUMENT for an empty prompt, max_tokens < 1, prompt +
  // max_tokens over the context length, a token id outside the vocabulary,
  // bad sampling options; RESOURCE_EXHAUSTED when it can never fit the
  // pool; ALREADY_EXISTS for a live request id; UNAVAILABLE after Shutdown.
  absl::Status Submit(DecodeRequest request, std::shared_ptr<DecodeSink> sink);
  // Ends the request with CANCELLED and frees its blocks (once nothing
  // writes into them). Unknown ids are ignored.
  void Cancel(const std::string& request_id);
  // Ends every request with UNAVAILABLE and refuses new ones.
  void Shutdown();

  DecodeStats GetStats() const;
  // host:port of the KV receiver.
  std::string kv_endpoint() const;

 private:
  enum class SeqState {
    kNew,          // submitted; local/remote not decided yet
    kWaitingForBlocks,  // remote: waiting for L + 1 tokens of blocks
    kScheduled,    // owned by the scheduler (local prefill or decoding)
    kWaitingForKv, // remote prefill: KV transfer expected / receiving
    kAborting,     // cancelled while receiving; blocks freed at quiesce
  };
  struct Sequence;
  struct TransferDone {
    std::string request_id;
    absl::Status status;
    kvtransfer::TransferResult result;
  };
  class BlockTableWriter;

  DecodeEngine(const DecodeEngineOptions& options, const model::LlamaModel* model);
  void Loop();
  // Engine-thread helpers (no lock needed: only the loop touches these).
  void Admit();
  bool StartRemote(Sequence& seq);
  void HandleTransferDone(const TransferDone& done);
  // Ends a request early with `status`, freeing its blocks once safe.
  void Abort(const std::string& request_id, const absl::Status& status);
  void RunStep();
  void FinishSequence(const std::string& request_id, const absl::Status& status,
                      FinishReason reason);
  bool HasRunnableWork() const;
  void UpdateKvStats() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);

  // Const after construction.
  const DecodeEngineOptions options_;
  const model::LlamaModel* const model_;
  std::unique_ptr<kvtransfer::KvReceiver> receiver_;

  // Engine-loop thread only (KV receiver threads write rows into blocks of
  // kWaitingForKv sequences, which nothing else touches meanwhile).
  kv::BlockPool pool_;
  kv::KvCacheManager kv_;
  scheduler::Scheduler scheduler_;
  int64_t next_seq_id_ = 1;
  std::map<std::string, std::unique_ptr<Sequence>> sequences_;
  std::map<int64_t, Sequence*> by_seq_id_;
  std::deque<std::string> admission_;  // kNew / kWaitingForBlocks, FCFS
  std::vector<float> logits_;

  mutable absl::Mutex mu_;
  absl::CondVar cv_;
  bool stop_ ABSL_GUARDED_BY(mu_) = false;
  std::vector<std::unique_ptr<Sequence>> inbox_new_ ABSL_GUARDED_BY(mu_);
  std::vector<std::string> inbox_cancel_ ABSL_GUARDED_BY(mu_);
  std::vector<TransferDone> inbox_done_ ABSL_GUARDED_BY(mu_);
  std::map<std::string, bool> live_ids_ ABSL_GUARDED_BY(mu_);
  DecodeStats stats_ ABSL_GUARDED_BY(mu_);

  std::thread loop_;
};

}  // namespace tandem::decode

#endif  // TANDEM_DECODE_WORKER_DECODE_ENGINE_H_
