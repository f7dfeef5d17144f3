// What a worker hands the engine core for one request, and the small
// interfaces through which the core reports back and moves KV in or out of
// the worker (vLLM v1's EngineCoreRequest / KVConnector, split by role).
//
// Threads: the core calls RequestOutput, KvExport and RemoteKvLoader on its
// loop thread only, except where a method says otherwise.
#ifndef TANDEM_ENGINE_CORE_REQUEST_H_
#define TANDEM_ENGINE_CORE_REQUEST_H_

#include <atomic>
#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "engine/core/kv_target.h"
#include "engine/kv/device_kv.h"
#include "engine/kv/kv_storage.h"
#include "engine/sampling/sampler.h"
#include "engine/scheduler/prefill_placement.h"

namespace tandem::core {

using scheduler::RouteChoice;

// Why a request stopped; values equal tandem.v1.FinishReason.
enum class FinishReason : uint32_t {
  kNone = 0,     // still running (for a prefill-only request: the decode
                 // worker continues)
  kLength = 1,   // max_tokens reached
  kStop = 2,     // EOS
  kContext = 3,  // context length reached
  kCancelled = 4,
};

// Most samples per request (EngineRequest::n), as the public API's n.
inline constexpr int32_t kMaxSamples = 16;

// Token 0 of one sample and why the sample ends with it (kNone: it goes on).
struct SampleStart {
  sampling::SampledToken token;
  FinishReason finish_reason = FinishReason::kNone;
};

// Where one request's time went on this worker, ms of its steady clock
// (tandem.v1.WorkerPhases documents each; 0 = not on this path).
struct RequestPhases {
  double placement_ms = 0;         // Submit -> handed to the scheduler (placed)
  double prefill_queue_ms = 0;     // placed (P: Submit) -> its first prefill chunk's step
  double prefill_ms = 0;           // that step's start -> token 0 drawn
  double kv_transfer_ms = 0;       // remote: the awaited load's start -> its done
  double decode_admission_ms = 0;  // remote: done -> its first decode step's start
  double first_decode_ms = 0;      // remote: that step's start -> its token
};

// Where a request's prompt was prefilled (tandem.v1.Placement): the
// predictions are those of placement kSlo (0 when it did not decide).
struct PlacementReport {
  bool remote = false;
  double ttft_local_ms = 0;
  double ttft_remote_ms = 0;
};

// Results of one request, in this order: [OnRemotePrefill], then for each
// sample (interleaved across samples) OnToken* and at most one
// OnSampleFinish, then OnFinish (exactly once). OnPhases comes once,
// right before the first OnToken of sample 0 this worker streams (token 0
// after a local prefill or on a prefill worker; token 1 after a remote
// prefill; never for a request that ends before).
class RequestOutput {
 public:
  virtual ~RequestOutput() = default;
  // This worker's phases of the request and its placement.
  virtual void OnPhases(const RequestPhases& phases, const PlacementReport& placement) {
    (void)phases, (void)placement;
  }
  // The prompt waits for a remote prefill (never called for requests whose
  // prompt is prefilled here).
  virtual void OnRemotePrefill(const KvTarget& target) = 0;
  // Output token `index` (0-based) of sample `sample_index`.
  // prompt_tokens_computed: prompt tokens this worker prefilled, on the
  // first token sample 0 streams (else 0).
  virtual void OnToken(uint32_t sample_index, uint32_t index, const sampling::SampledToken& token,
                       uint32_t prompt_tokens_computed) = 0;
  // Sample `sample_index` ended with `reason` (kCancelled after
  // EngineCore::CancelSample). Every sample of a request that ends OK gets
  // exactly one; none follow an error.
  virtual void OnSampleFinish(uint32_t sample_index, FinishReason reason) = 0;
  // OK once every sample has finished, or the error that ended the request
  // (CANCELLED, UNAVAILABLE, ...). Called after the request's KV blocks and
  // id are released (a new request may reuse the id at once).
  virtual void OnFinish(const absl::Status& status) = 0;
};

// Set from any thread when a request is cancelled or the core shuts down;
// read by long-running KvExport calls that must give up.
using CancelFlag = std::atomic<bool>;

// Where a prefill-only request's KV goes (the prefill worker's KV sender).
// The core sends K/V of tokens [first_token_to_send(), L) of every layer:
// first the rows its prefix cache already holds, then each layer of each
// chunk as soon as the forward has written it; after token 0 is sampled it
// calls Finish, keeps the request's KV blocks until Result() says the
// transfer ended, then calls Close. Bytes are in the KV storage's dtype.
// No method waits for the network: the export queues what it is given and
// a sender elsewhere writes it (kvtransfer::KvSendQueue), so one slow
// receiver never stalls the loop.
class KvExport {
 public:
  // Called from any thread, at any time until Close returns, when Ready()
  // or Result() may say something new; the core then asks again.
  using Wake = std::function<void()>;

  virtual ~KvExport() = default;
  // Tokens the receiver already holds (D_hit): nothing before it is sent.
  virtual int32_t first_token_to_send() const = 0;
  // Starts the transfer (the handshake runs on without the caller); called
  // once, by EngineCore::Submit on the submitting thread, so the receiver
  // hears from this worker as soon as the request arrives (the other
  // methods run on the loop thread, after Submit handed the request over).
  // An error fails Submit with it. `cancelled` outlives the export.
  [[nodiscard]] virtual absl::Status Open(std::shared_ptr<const CancelFlag> cancelled,
                                          Wake wake) = 0;
  // Asked before each step that could compute the request: true when its
  // next chunk may run; false when the receiver's send buffer is full ("not
  // now": the sequence is skipped this step, others run, and `wake`
  // follows); an error (the transfer failed: REJECT, UNAVAILABLE,
  // DEADLINE_EXCEEDED, ...) ends the request with it.
  [[nodiscard]] virtual absl::StatusOr<bool> Ready() = 0;
  // K and V of tokens [token_start, token_start + count) of `layer`,
  // count * row_bytes bytes each, copied before it returns (within a step
  // that Ready() allowed it is always taken, even past the buffer's
  // budget). An error ends the request at the end of the step (no later
  // call but Close).
  [[nodiscard]] virtual absl::Status SendLayer(int32_t layer, int32_t token_start, int32_t count,
                                               const char* k, const char* v) = 0;
  // True when this export moves rows on a device data path (NCCL, CUDA
  // IPC: kvtransfer/data_plane.h): the core then calls SendDeviceRows, with
  // the rows left in device memory, instead of reading them to the host
  // for SendLayer. Fixed for the export's life.
  virtual bool sends_device_rows() const { return false; }
  // The device path's SendLayer: tokens [token_start, token_start + count)
  // of `layer` of the sequence with `block_table` in `kv` (the backend's
  // KV storage). Must not wait for the device or the network: the layer's
  // event orders the copy after the layer's writes. Errors: as SendLayer.
  // Only called when sends_device_rows(); the default refuses.
  [[nodiscard]] virtual absl::Status SendDeviceRows(kv::DeviceKvAccess& kv,
                                                    std::span<const int32_t> block_table,
                                                    int32_t layer, int32_t token_start,
                                                    int32_t count) {
    (void)kv, (void)block_table, (void)layer, (void)token_start, (void)count;
    return absl::UnimplementedError("this KV export has no device data path");
  }
  // Token 0 of every sample, in sample order, and why each ends with it
  // (kNone: the receiver decodes on); queued after the frames.
  [[nodiscard]] virtual absl::Status Finish(const std::vector<SampleStart>& samples) = 0;
  // After Finish: nullopt while the transfer's last bytes are still going
  // out; then OK once the FINAL was written, or the error that ended the
  // transfer. The request ends with it.
  virtual std::optional<absl::Status> Result() = 0;
  // Ends the transfer (after Result, or early on any failure or cancel:
  // then the receiver sees the connection close).
  virtual void Close() = 0;
  // K+V payload bytes handed over so far.
  virtual uint64_t bytes_sent() const = 0;
};

// What a remote prefill delivers besides the KV: token 0 of every sample
// (sampled by the prefill worker, in sample order) with why each ends with
// it (kNone: decode on), and the prefill worker's bit-exact class.
struct RemotePrefillResult {
  std::vector<SampleStart> samples;
  std::string peer_bit_exact_class;
  // K+V payload bytes received and the seconds from their first frame to
  // the FINAL (the prefill worker streams layers as it computes them, so
  // this is its prefill plus the transfer's tail); 0 when unknown.
  uint64_t kv_bytes = 0;
  double stream_seconds = 0;
};

// Brings a prompt's KV in from a prefill worker (the decode worker's KV
// receiver). Methods are called on the core's loop thread.
class RemoteKvLoader {
 public:
  // Runs exactly once per successful StartLoad, from any thread, once
  // nothing writes into the load's blocks any more.
  using Done = std::function<void(absl::Status status, RemotePrefillResult result)>;

  virtual ~RemoteKvLoader() = default;
  // Expects K/V of tokens [hit_tokens, prompt_tokens) of request
  // `request_id`, attempt `attempt` (1, 2, ... : a retried remote prefill
  // is a new attempt into the same blocks; bytes of an earlier attempt that
  // arrive late are discarded), written into `storage` through
  // `block_table` (which covers them). Returns where the prefill worker
  // must send it. Errors: the load did not start (`done` will not run),
  // e.g. ALREADY_EXISTS.
  [[nodiscard]] virtual absl::StatusOr<KvTarget> StartLoad(
      const std::string& request_id, uint32_t attempt, int32_t hit_tokens, int32_t prompt_tokens,
      kv::KvStorage* storage, std::vector<int32_t> block_table, Done done) = 0;
  // Aborts the request's load in flight; its `done` still runs (with an
  // error) once nothing writes any more. No-op for unknown ids.
  virtual void CancelLoad(const std::string& request_id) = 0;
  // Loads started whose `done` has not been queued yet. Any thread.
  virtual uint32_t loads_in_flight() const = 0;
  // K+V payload bytes received so far. Any thread.
  virtual uint64_t bytes_received_total() const = 0;
};

// Generation controls (tandem.v1.GenerateRequest documents each; vLLM's
// semantics).
struct GenerationControls {
  // Ids that end a sample once min_tokens are generated (any order).
  std::vector<int32_t> stop_token_ids;
  // The model's end-of-generation ids neither stop nor are masked.
  bool ignore_eos = false;
  // Stop ids and (unless ignore_eos) end-of-generation ids are masked, and
  // stop checks skipped, until this many tokens are generated; <= max_tokens.
  int64_t min_tokens = 0;
  // Samples of the prompt, 1..kMaxSamples. Samples 1.. are forked from
  // sample 0 when its token 0 is drawn: they share its full prompt blocks
  // and recompute the partial last block (scheduler::Scheduler::Fork).
  int64_t n = 1;
};

// One request for the engine core.
struct EngineRequest {
  std::string request_id;
  std::vector<int32_t> prompt;  // BOS included; L = prompt.size()
  int64_t max_tokens = 1;       // >= 1; prompt + max_tokens <= context length
  // Sampling options of sample 0 (top_logprobs = the request's logprobs;
  // the core fills min_tokens and min_tokens_masked_ids from the fields
  // below, and gives sample s the seed sampling::SampleSeed(seed, s)).
  sampling::SamplingOptions sampling;
  GenerationControls controls;
  // Where the prompt is prefilled: kRemote needs a RemoteKvLoader.
  RouteChoice route = RouteChoice::kAuto;
  // The router's prediction of a remote prefill (tandem.v1.PrefillEstimate):
  // the input of placement kSlo, and the prefill worker a remote load's
  // measured link rate is credited to. Unset: none.
  std::optional<scheduler::RemotePrefillEstimate> remote_estimate;
  // Migration (tandem.v1.DecodeGenerateRequest.generated_token_ids): output
  // tokens 0..k-1 another decode worker already streamed before it died.
  // The core prefills prompt + generated here (route kLocal), streams from
  // output index k, and counts them as generated for max_tokens, penalties,
  // min_tokens and stops, so with the counter-based sampler the ids equal
  // an undisturbed run's. Needs n = 1 and k < max_tokens.
  std::vector<int32_t> generated;
  // Migration of an n > 1 request (DecodeGenerateRequest.migrated_samples),
  // instead of `generated`: one entry per sample, in sample order (exactly
  // n). Each unfinished sample is its own sequence over prompt + its
  // generated tokens (k_s < max_tokens), streamed from output index k_s:
  // no fork, and a sample with k_s = 0 draws its token 0 at index 0 with
  // its own seed from the prompt's row, as the fork would have. Finished
  // samples are done at once (nothing is streamed for them). At least one
  // sample must be unfinished.
  struct MigratedSample {
    std::vector<int32_t> generated;
    bool finished = false;
  };
  std::vector<MigratedSample> migrated_samples;
  std::shared_ptr<RequestOutput> output;  // required
  // Set: a prefill-only request (the prefill worker): its KV goes out
  // through the export, it is prefilled here, never preempted, and it ends
  // after token 0 with the reason the stop checks give (kNone: the decode
  // worker continues).
  std::shared_ptr<KvExport> kv_export;
};

}  // namespace tandem::core

#endif  // TANDEM_ENGINE_CORE_REQUEST_H_
