// The engine core both workers run (vLLM v1's EngineCore): one loop thread
// that admits requests, schedules a step, runs it on the backend and
// updates every request from the step's output, with the wait for a remote
// prefill's KV as a scheduler state (WAITING_FOR_REMOTE_KV).
//
// Owns: the requests (their outputs, sampling, stop decisions), the KV
// cache manager and block free list, the scheduler, the loop thread, the
// counters; it owns the backend and the remote KV loader it is given.
// Does not touch: gRPC, sockets (a RemoteKvLoader or KvExport moves KV in
// or out), routing, detokenization.
// Threads: Submit/Cancel/Shutdown/GetStats are thread-safe and only touch
// the inbox and counters under mu_. The loop thread alone runs steps and
// calls RequestOutput, KvExport, RemoteKvLoader (StartLoad, CancelLoad)
// and the backend. A loader's `done` may run on any thread: it only posts
// to the inbox. Remote loads write into blocks of sequences in
// WAITING_FOR_REMOTE_KV, which the loop leaves alone until `done`.
//
// One step (DESIGN.md, Engine; engine/scheduler/scheduler.h has the
// policy): Schedule() -> start the remote loads it admitted -> one
// backend Forward over the planned chunks (a per-layer hook streams the KV
// of prefill-only requests out) -> for each chunk that samples: draw from
// the backend's SamplingView, stream the token, check stops (one place:
// stop_checker.h) -> scheduler.OnStepDone -> finish what stopped.
// A prefill-only request (EngineRequest::kv_export) ends after token 0,
// once its export's Result() says the transfer ended (its KV blocks stay
// pinned until then). Before every step the core asks each export
// Ready(): a request whose receiver has no room is not admitted yet, or
// gets no chunk this step (Scheduler::Schedule's `held`), while others run.
// An export's Wake posts to the loop like an inbox message.
// A remote prefill's token 0 comes from the prefill worker (the router
// streams it); this core streams from index 1 and computes token 0's K/V
// in its first decode step.
//
// n > 1 (parallel sampling): sample 0 is the request's one sequence until
// its token 0 is drawn; then n tokens are drawn from that one view (sample
// s with seed sampling::SampleSeed(seed, s)) and samples 1.. are forked
// (Scheduler::Fork: full prompt blocks shared, the partial last block
// recomputed). A prefill-only request draws the n tokens and sends them
// all in FINAL; the decode worker forks when the KV arrives. A migrated
// n > 1 request (EngineRequest::migrated_samples) forks nothing: each
// unfinished sample arrives as its own sequence.
#ifndef TANDEM_ENGINE_CORE_ENGINE_CORE_H_
#define TANDEM_ENGINE_CORE_ENGINE_CORE_H_

#include <chrono>
#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <set>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/synchronization/mutex.h"
#include "engine/backend/model_backend.h"
#include "engine/core/request.h"
#include "engine/core/stop_checker.h"
#include "engine/kv/block_pool.h"
#include "engine/kv/kv_cache_manager.h"
#include "engine/scheduler/scheduler.h"
#include "engine/scheduler/step_model.h"

namespace tandem::core {

// What a decode worker does when a remote prefill attempt fails (the
// transfer failed or timed out here, or the router said the attempt will
// not deliver: AbortRemotePrefill); conditional.on_prefill_failure.
enum class PrefillFailurePolicy {
  kFail,   // the request ends with UNAVAILABLE
  kRetry,  // same blocks, attempt + 1 (OnRemotePrefill again), up to
           // max_prefill_attempts; after the last one the prompt is
           // prefilled here (kLocal), or, for route kRemote, the request
           // fails
  kLocal,  // the prompt is prefilled here
};

struct EngineCoreOptions {
  // Token budget, running-set cap, chunk size, prefix caching, and the
  // conditional-disaggregation threshold. remote_prefill_available is set
  // by the core (a loader was given), whatever this says.
  scheduler::SchedulerOptions scheduler;
  // End-of-generation ids (any ends generation with FinishReason::kStop);
  // sorted by the core. Default: {2}, SPM's EOS.
  std::vector<int32_t> eog_token_ids = {2};
  std::string model_fingerprint;  // mixed into every prefix-cache block hash
  // Names this worker in errors ("decode worker", "prefill worker").
  std::string worker_label = "engine";
  // Remote prefill failover (DESIGN.md, failures). A request whose route is
  // kRemote (the client asked for a remote prefill) is never prefilled
  // here: kLocal and "no prefill worker" fail it instead.
  PrefillFailurePolicy on_prefill_failure = PrefillFailurePolicy::kFail;
  int32_t max_prefill_attempts = 2;  // >= 1, attempt 1 included (kRetry)
  // One line per failover decision (which request, attempt, cause, what
  // now); called on the loop thread. May be empty.
  std::function<void(const std::string&)> log;
  // KV events (docs/architecture.md, "KV events and the router's prefix
  // index"): when set and scheduler.enable_prefix_caching is on, the KV
  // cache manager records block stored/removed events and the loop thread
  // hands them here after each loop iteration that produced some (never an
  // empty batch), oldest first; every event since construction goes
  // through, so replaying them gives the prefix cache's set of hashes. Runs
  // on the loop thread: it must not block. Empty (default): nothing is
  // recorded.
  std::function<void(std::vector<kv::KvCacheEvent>)> kv_event_sink;
  // Called on the loop thread for each step that ran the model (one
  // backend Forward), with its wall time in seconds (steady clock) from
  // the step's start (export polls, Schedule) through the forward, the
  // sampling, the token outputs and stop checks, before the requests it
  // finished are freed; CoreStats::engine_steps_total counts the same
  // steps and is incremented first. Must not block (a metrics histogram's
  // Observe). Empty (default): not called.
  std::function<void(double seconds)> step_observer;
  // Called once, on the loop thread, after the backend lost its device
  // (a Forward failed and backend->device_lost() is true; DESIGN.md, GPU
  // workers: errors) and every request has ended with `status`
  // (UNAVAILABLE "device lost: <the backend's error>"); the core refuses
  // new requests with it and its loop ends. The worker exits so that it is
  // restarted. Must not block. Empty (default): not called.
  std::function<void(const absl::Status& status)> on_device_lost;
  // Before serving, the loop times a few forward steps of synthetic
  // shapes (prefill chunks, decode batches; garbage K/V in blocks that are
  // freed unpublished) to seed the step model, so the first placement and
  // chunk decisions are not blind. Off by default (tests count forwards);
  // the workers turn it on.
  bool warmup = false;
  // Called on the loop thread with each request's phases, when its output
  // gets them (RequestOutput::OnPhases). Must not block (a metrics
  // histogram's Observe). Empty (default): not called.
  std::function<void(const RequestPhases& phases)> phase_observer;
};

struct CoreStats {
  uint32_t running_requests = 0;  // accepted, not finished (waiting ones included)
  // Of running_requests: those not yet arrived at the loop, or with a
  // sequence in the scheduler's waiting queue (new, preempted, or a forked
  // sample), or a prefill-only request whose export has no room yet.
  uint32_t waiting_requests = 0;
  // Prompt tokens not yet computed here, summed over those waiting
  // sequences and the running ones still prefilling: prompt length minus
  // num_computed (a waiting prompt counts whole, its prefix-cache hit is
  // looked up at admission). Sequences prefilled remotely
  // (WAITING_FOR_REMOTE_KV) and the recomputation of generated tokens
  // (preemption, migration) are not counted.
  uint64_t queued_prefill_tokens = 0;
  uint32_t kv_blocks_in_use = 0;  // ref count > 0
  uint32_t kv_blocks_cached = 0;  // findable in the prefix cache
  uint32_t kv_blocks_total = 0;
  // Remote KV loads in flight (loader) plus open KV exports.
  uint32_t transfers_in_flight = 0;
  uint64_t prefill_tokens_computed_total = 0;
  uint64_t decode_tokens_total = 0;
  uint32_t max_decode_batch_size = 0;  // decode sequences in the largest step
  uint64_t preemptions_total = 0;
  uint64_t kv_bytes_sent_total = 0;      // by finished KV exports
  uint64_t kv_bytes_received_total = 0;  // by the remote KV loader
  kv::PrefixCacheStats prefix_cache;     // lookups, queried and hit tokens
  // tandem.v1.WorkerStatus fields 30-39 document these.
  uint64_t prompt_tokens_total = 0;               // of accepted requests (Submit OK)
  uint64_t prompt_tokens_cached_total = 0;        // prefix-cache hit at first admission
  uint64_t generation_tokens_total = 0;           // tokens drawn here, every sample
  uint64_t engine_steps_total = 0;                // steps that ran the model
  uint64_t kv_transfers_sent_total = 0;           // KV exports ended (opened ones)
  uint64_t kv_transfers_received_total = 0;       // remote KV load attempts ended
  double kv_transfer_seconds_sent_total = 0;      // Open .. end, summed
  double kv_transfer_seconds_received_total = 0;  // StartLoad .. done, summed
  // Remote prefills that reached their first decode step here, and the
  // seconds from each load's done (the FINAL checked out, every K/V row
  // in) to the start of the forward of that step, summed (issue #16: KV
  // that sits idle before decoding shows here).
  uint64_t kv_load_to_first_decode_total = 0;
  double kv_load_to_first_decode_seconds_total = 0;
  // Backend Forward calls that failed (each failed its step's requests).
  uint64_t forward_errors_total = 0;
  // The backend lost its device: every request failed, new ones are
  // refused (EngineCoreOptions::on_device_lost).
  bool device_lost = false;
  // The step model (engine/scheduler/step_model.h) after the last step.
  scheduler::StepModelSnapshot step_model;
};

class EngineCore {
 public:
  // Starts the loop. `backend` holds the model and the KV memory (its
  // storage's block count and size are the pool's); `loader` (may be null:
  // then every prompt is prefilled here) brings remote prefills' KV in.
  EngineCore(const EngineCoreOptions& options, std::unique_ptr<backend::ModelBackend> backend,
             std::unique_ptr<RemoteKvLoader> loader);
  // Shutdown(), joins the loop (which waits for aborted remote loads to
  // quiesce), then destroys the loader and the backend.
  ~EngineCore();
  EngineCore(const EngineCore&) = delete;
  EngineCore& operator=(const EngineCore&) = delete;

  // A backend Forward that fails (a device error) fails exactly the
  // requests with a chunk in that step, with the error's code
  // (RESOURCE_EXHAUSTED, INTERNAL) and a message naming it, and frees their
  // blocks; the other requests go on and the next step runs normally. When
  // the backend reports device_lost() after the failure, every request
  // ends with UNAVAILABLE "device lost: ...", new ones are refused with it
  // and options.on_device_lost is called.
  //
  // Queues a request. Errors (nothing queued, output untouched):
  // INVALID_ARGUMENT for an empty prompt, max_tokens < 1, prompt +
  // max_tokens over the context length, a token id outside the vocabulary,
  // bad sampling options; FAILED_PRECONDITION for route kRemote without a
  // loader or with a kv_export; RESOURCE_EXHAUSTED when its KV can never
  // fit the pool; ALREADY_EXISTS for a live request id; UNAVAILABLE after
  // Shutdown or once the device is lost ("device lost: ..."); the error of
  // a kv_export's Open (called here, on the caller's thread, so the
  // receiver hears from this worker on receipt).
  [[nodiscard]] absl::Status Submit(EngineRequest request);
  // Ends the request with CANCELLED and frees its blocks once nothing
  // writes into them; its KvExport is closed (the transfer cancelled).
  // Unknown ids are ignored.
  void Cancel(const std::string& request_id);
  // Ends one sample of a request with FinishReason::kCancelled (its blocks
  // freed, the other samples untouched; the request ends OK when its last
  // sample does). A sample whose token 0 is not drawn yet ends right after
  // it is. Unknown ids, indices >= n and finished samples are ignored.
  void CancelSample(const std::string& request_id, uint32_t sample_index);
  // The router's word that remote prefill attempt `attempt` of
  // `request_id` will not deliver (its Prefill call failed: `reason`; or no
  // prefill worker is healthy: `no_prefill_worker`). If the request still
  // waits for that attempt, its load is cancelled and, once it quiesced,
  // options.on_prefill_failure decides (no_prefill_worker: prefill here
  // whatever the policy, unless the route is kRemote). Anything else (an
  // unknown id, another attempt, a load already done) is ignored.
  // Thread-safe.
  void AbortRemotePrefill(const std::string& request_id, uint32_t attempt,
                          const std::string& reason, bool no_prefill_worker);
  // Ends every request with UNAVAILABLE and refuses new ones.
  void Shutdown();

  CoreStats GetStats() const;
  // The loader given at construction (null if none); lives as long as the
  // core.
  RemoteKvLoader* loader() const { return loader_.get(); }

 private:
  // A request's state (engine_core_request.h): what every request holds,
  // plus its role's, if any: a prefill-only request's KV export (P,
  // ExportState, handled in engine_core_export.cc) or a remote prefill's
  // load (D, RemoteLoadState, engine_core_remote_load.cc).
  struct Request;
  struct ExportState;
  struct RemoteLoadState;
  // One sequence: sample `index` of `request`.
  struct Sample {
    Request* request = nullptr;
    uint32_t index = 0;
    int32_t num_generated = 0;  // output indices produced so far
  };
  struct RemoteDone {
    int64_t seq_id;
    absl::Status status;
    RemotePrefillResult result;
    std::chrono::steady_clock::time_point done_at;  // when the loader ran done
  };
  struct RemoteAbort {
    std::string request_id;
    uint32_t attempt;
    std::string reason;
    bool no_prefill_worker;
  };
  // A sample that ends after this step (`status` not OK: the request does).
  struct Ending {
    std::string request_id;
    uint32_t sample_index;
    FinishReason reason;
    absl::Status status;
  };

  void Loop();
  // Loop-thread helpers.
  void Arrive(std::unique_ptr<Request> request);
  // Arrive for an n > 1 migration: one sequence per unfinished sample.
  void ArriveMigratedSamples(std::unique_ptr<Request> request);

  // ---- D's remote load (engine_core_remote_load.cc) ----
  // A sequence the scheduler put in WAITING_FOR_REMOTE_KV: creates its
  // request's remote load state and starts attempt 1.
  void StartRemoteLoad(const scheduler::RemoteKvStart& start);
  // A load's done: ends a request aborted while loading, fails over a
  // failed attempt, or checks token 0 of every sample and starts decoding.
  void HandleRemoteDone(RemoteDone done);
  // The router's AbortRemotePrefill: cancels the awaited attempt's load
  // (its done then brings the failover with the router's reason).
  void HandleRemoteAbort(const RemoteAbort& abort);
  // A failed remote prefill attempt of `r` (sequence `seq_id`, still
  // WAITING_FOR_REMOTE_KV, its load quiesced): retry, prefill here, or end
  // the request, per options_.on_prefill_failure.
  void FailOver(Request& r, int64_t seq_id, const std::string& cause, bool no_prefill_worker);
  // Starts the next attempt of `seq_id`'s remote prefill into its
  // blocks and tells the output; on a start error ends the request.
  void StartLoadAttempt(Request& r, int64_t seq_id, int32_t hit_tokens);
  // Before the forward: counts a remote prefill's first decode step
  // (CoreStats::kv_load_to_first_decode_*) when `chunk` of `s` is it.
  void NoteFirstDecode(Request& r, const scheduler::ScheduledChunk& chunk,
                       const scheduler::SeqState& s);

  // ---- P's KV export (engine_core_export.cc) ----
  // In Submit, on the caller's thread: creates r.export_state and opens
  // the transfer (its Wake posts to the loop). Returns Open's error.
  [[nodiscard]] absl::Status OpenExport(Request& r);
  // In Arrive: the prefill-only request's sequence `s` waits outside the
  // scheduler until its export has room (PollExports).
  void ArriveExporting(Request& r, scheduler::SeqState s);
  // Before every step: adds prefill-only requests whose export has room to
  // the scheduler, ends those whose transfer failed or (draining) ended,
  // and returns the running sequences whose export has no room now.
  std::set<int64_t> PollExports();
  // In Execute, for the request's first chunk: K/V of [D_hit, chunk.start)
  // from cached blocks go out first (DESIGN.md, step 5).
  void ExportCachedRows(Request& r, const scheduler::ScheduledChunk& chunk);
  // A prefill-only request's sampled row: token 0 of every sample is drawn
  // and queued behind the frames (KvExport::Finish); each sample ends with
  // it (kNone: the decode worker goes on), or the request with the
  // export's error. Appends to *sampled, *generated and *endings.
  void FinishExport(Request& r, const sampling::SamplingView& row, uint32_t prompt_computed,
                    std::vector<int32_t>* sampled, uint64_t* generated,
                    std::vector<Ending>* endings);
  // A prefill-only request whose samples all ended OK: pins its blocks,
  // removes its sequence and waits for the export's Result (`last`, the
  // last sample's finish, is told then).
  void StartDraining(Request& r, const Ending* last);
  // Ships K/V of tokens [from, to) of `layer` of `seq_id` through the
  // request's export: SendDeviceRows on the backend's device KV storage
  // when the export sends device rows (FAILED_PRECONDITION when the
  // storage is on the host), else ReadTokens to the host and SendLayer.
  // The first error is kept in the export state; nothing runs after it.
  void ExportRows(Request& r, int64_t seq_id, int32_t layer, int32_t from, int32_t to);

  // ---- Every request (engine_core.cc) ----
  void Abort(const std::string& request_id, const absl::Status& status);
  void AbortSample(const std::string& request_id, uint32_t sample_index);
  // schedule -> execute -> update from output. Returns whether the step
  // changed anything (see StepPlan::progress).
  bool Step();
  // Runs the backend forward over the plan's chunks (exporting KV of
  // prefill-only requests as it goes); views_ holds the sampled rows.
  // Returns the backend's error (the step did not complete).
  [[nodiscard]] absl::Status Execute(const scheduler::StepPlan& plan);
  // After a failed Forward: ends every request with a chunk in `plan` with
  // `error`'s code (their blocks freed); if the device is lost, stops the
  // core instead (LoseDevice).
  void FailStep(const scheduler::StepPlan& plan, const absl::Status& error);
  // Records the lost device: refuses new requests, and makes the loop end
  // every request with UNAVAILABLE "device lost: <error>", call
  // options_.on_device_lost and return.
  void LoseDevice(const absl::Status& error);
  // Samples, streams, checks stops, tells the scheduler, forks, finishes.
  // `step_start`: when this Step() began (the step_observer's duration).
  void UpdateFromOutput(const scheduler::StepPlan& plan,
                        std::chrono::steady_clock::time_point step_start);
  // Token 0 of every sample of `r` from one view (sample s: draw with its
  // own seed), stop-checked, streamed unless `stream` is false.
  std::vector<SampleStart> DrawFirstTokens(Request& r, const sampling::SamplingView& view,
                                           uint32_t prompt_computed, bool stream);
  // Forks samples 1.. of `r` from sequence `parent` (token 0 drawn, its
  // prompt computed) and queues in *endings every sample that ends with
  // its token 0 (or was cancelled before it).
  void StartSamples(Request& r, int64_t parent, const std::vector<SampleStart>& starts,
                    std::vector<Ending>* endings);
  // Ends one sample; the request ends (OK) with its last one.
  void FinishSample(const std::string& request_id, uint32_t sample_index, FinishReason reason);
  // Ends the request: frees every sequence left, then tells the output
  // (OnSampleFinish for `last`, if given, then OnFinish(status)).
  void EndRequest(const std::string& request_id, const absl::Status& status,
                  const Ending* last = nullptr);
  // Refreshes the KV gauges and the queue gauges (waiting_requests and
  // queued_prefill_tokens of the requests that reached the loop) in stats_.
  void UpdateKvStats() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Hands the KV cache manager's recorded events to options_.kv_event_sink.
  void PublishKvEvents();

  // ---- The step model and phases (engine_core_timing.cc) ----
  // EngineCoreOptions::warmup: times synthetic steps as anchors of the
  // step model. Before the loop serves anything.
  void WarmUp();
  // Feeds a step that ran (`plan`, begun at `step_start`) to the step model
  // and copies its snapshot into stats_.
  void ObserveStep(const scheduler::StepPlan& plan,
                   std::chrono::steady_clock::time_point step_start);
  // Calls r's OnPhases once, before the first token of sample 0 this worker
  // streams.
  void ReportPhases(Request& r);
  // In Execute: the chunk's step is its request's first prefill chunk.
  void NoteFirstChunk(Request& r, const scheduler::ScheduledChunk& chunk,
                      const scheduler::SeqState& s);
  // A remote load of `r` ended OK with `result`: its streaming rate (bytes
  // over first frame .. FINAL) goes to the step model's link rates.
  void ObserveTransfer(const Request& r, const RemotePrefillResult& result);

  // Const after construction.
  const EngineCoreOptions options_;
  const StopCriteria stop_;
  std::unique_ptr<backend::ModelBackend> backend_;
  std::unique_ptr<RemoteKvLoader> loader_;

  // Loop thread only.
  kv::BlockPool pool_;
  kv::KvCacheManager kv_;
  scheduler::StepModel step_model_;  // read by the scheduler
  scheduler::Scheduler scheduler_;
  std::chrono::steady_clock::time_point step_start_;  // of the step running
  int64_t next_seq_id_ = 1;
  std::map<std::string, std::unique_ptr<Request>> requests_;  // by request id
  std::map<int64_t, Sample> samples_;                         // by seq id
  std::vector<backend::ForwardEntry> entries_;                // this step's batch
  std::vector<Sample*> entry_samples_;                        // the sample of each entry
  std::vector<sampling::SamplingView> views_;                 // one per sampled entry
  std::vector<char> k_rows_, v_rows_;

  mutable absl::Mutex mu_;
  absl::CondVar cv_;
  bool stop_requested_ ABSL_GUARDED_BY(mu_) = false;
  // Not OK once the device is lost: why requests end and Submit refuses.
  absl::Status device_lost_ ABSL_GUARDED_BY(mu_);
  std::vector<std::unique_ptr<Request>> inbox_new_ ABSL_GUARDED_BY(mu_);
  std::vector<std::string> inbox_cancel_ ABSL_GUARDED_BY(mu_);
  std::vector<std::pair<std::string, uint32_t>> inbox_cancel_sample_ ABSL_GUARDED_BY(mu_);
  std::vector<RemoteDone> inbox_done_ ABSL_GUARDED_BY(mu_);
  std::vector<RemoteAbort> inbox_abort_ ABSL_GUARDED_BY(mu_);
  // Live request ids and their cancel flags.
  std::map<std::string, std::shared_ptr<CancelFlag>> live_ ABSL_GUARDED_BY(mu_);
  uint32_t open_exports_ ABSL_GUARDED_BY(mu_) = 0;
  // An export's Wake ran: poll the exports (PollExports) before waiting.
  bool export_wake_ ABSL_GUARDED_BY(mu_) = false;
  // A draining request's device-path export said "not yet" at the last
  // PollExports: the loop polls again every millisecond (the data path
  // has no wake).
  bool device_drain_pending_ ABSL_GUARDED_BY(mu_) = false;
  CoreStats stats_ ABSL_GUARDED_BY(mu_);

  std::thread loop_;
};

}  // namespace tandem::core

#endif  // TANDEM_ENGINE_CORE_ENGINE_CORE_H_
