// Cluster configuration (deploy/local/cluster.yaml), read once at start-up.
//
// Owns: parsing and validating the YAML into plain structs. Does not touch:
// sockets, models. Threads: pure functions.
//
// Schema (unknown keys anywhere are errors naming the key path):
//   model: PATH                       # optional; --model / $TANDEM_MODEL win
//   chat_template: NAME               # optional; one of kChatTemplateNames
//   router: {name, listen: "host:port", advertise: "host[:port]",
//            poll_interval_ms: 500, unhealthy_after_missed_polls: 3,
//            rpc_timeout_ms: 2000, max_inflight: 512, max_queued: 512,
//            max_migrations: 1, drop_after_ms: 30000, api_keys_file: PATH,
//            role_drain_timeout_ms: 1000,
//            policy: kv_aware,   # kv_aware | least_loaded | round_robin
//            kv_aware: {prefix_weight: 1.0, free_blocks_weight: 0.25,
//                       load_weight: 1.0, prefill_queue_weight: 1.0},
//            http_listen: "host:port", served_model_name: NAME,
//            http_max_streams: 1024, http_max_body_bytes: 8388608,
//            http_read_timeout_ms: 30000, metrics_listen: "host:port"}
//   prefill_workers: [{name, listen, advertise, kv_listen, kv_advertise,
//                      metrics_listen, device}]
//   decode_workers:  [{name, listen, advertise, kv_listen, kv_advertise,
//                      metrics_listen, device}]
//   # every worker has a KV receiver (kv_listen default 127.0.0.1:0): a
//   # prefill worker may become a decode worker at run time (`tandem role`)
//   engine: {block_size: 16, num_kv_blocks: 2048, max_num_seqs: 64,
//            threads: 1, max_num_batched_tokens: 2048,
//            prefill_chunk_tokens: 512, enable_prefix_caching: true,
//            kernel_isa: auto, q8_matmul: exact,   # exact | int8
//            device: cpu, kv_cache_dtype: <by device>,
//            gpu_memory_fraction: 0.9, batch_invariant: true}
//   conditional: {max_local_prefill_tokens: 32,   # integer >= 0 | unbounded
//                 placement: <by slo>,         # threshold | slo
//                 on_prefill_failure: retry}   # fail | retry | local
//   slo: {ttft_ms: 2000, tpot_ms: 50}   # each optional, a number > 0 (ms)
//   # Colocated mode (deploy/local/colocated.yaml): prefill_workers: [] and
//   # max_local_prefill_tokens: unbounded; decode workers prefill everything.
//   kv: {transfer_timeout_ms: 5000, handshake_timeout_ms: 5000,
//        max_prefill_attempts: 2, send_buffer_bytes: 268435456,
//        transport: auto,   # auto | tcp | nccl | cuda_ipc
//        nccl_socket_ifname: "", nccl_init_timeout_ms: 10000}
//   planner: {mode: off, interval_s: 5, cooldown_s: 30,   # common/planner_config.h
//             min_prefill_workers: 1, min_decode_workers: 1, flip_roles: true}
//   shutdown_grace_s: 5
//   cluster: {secret_file: PATH, auth_max_skew_ms: 30000,
//             accepted_secret_files: [PATH, ...]}   # rotation, see below
// Ports may be 0 (ephemeral).
#ifndef TANDEM_COMMON_CLUSTER_CONFIG_H_
#define TANDEM_COMMON_CLUSTER_CONFIG_H_

#include <array>
#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "common/host_port.h"
#include "common/planner_config.h"
#include "engine/backend/device.h"
#include "engine/kv/kv_dtype.h"
#include "engine/forward_options.h"
#include "kvtransfer/transport.h"

namespace tandem {

// How the router picks a worker for a request (router/routing_policy.h,
// docs/architecture.md "Choosing workers: the routing score").
enum class RouterPolicy {
  kKvAware,      // highest score from cached prefix, free KV blocks, load
  kLeastLoaded,  // least load: running + waiting + router in-flight requests
  kRoundRobin,   // each routable worker of the role in turn
};

// The weights of router.policy kv_aware (router.kv_aware.*): each a finite
// number >= 0; each term they multiply is normalised to about [0, 1].
struct KvAwareWeights {
  // x (cached prefix tokens of the prompt / prompt tokens); D and P.
  double prefix_weight = 1.0;
  // x (free KV blocks / total KV blocks); D.
  double free_blocks_weight = 0.25;
  // x load / engine.max_num_seqs (running + waiting + router in-flight
  // requests, router/routing_policy.h), subtracted; D (P: router in-flight
  // requests only).
  double load_weight = 1.0;
  // x (queued prefill tokens / engine.max_num_batched_tokens), subtracted; P.
  double prefill_queue_weight = 1.0;
};

struct RouterConfig {
  std::string name = "router";
  HostPort listen{"127.0.0.1", 50051};
  Advertise advertise;             // what status reports; see AdvertisedAddress
  int32_t poll_interval_ms = 500;  // GetStatus poll period per worker
  int32_t unhealthy_after_missed_polls = 3;
  int32_t rpc_timeout_ms = 2000;  // deadline of control RPCs
  // Generate streams running at once; more wait in a FIFO of max_queued;
  // beyond both: RESOURCE_EXHAUSTED with trailing metadata retry-after-ms.
  int32_t max_inflight = 512;
  int32_t max_queued = 512;
  // Times one stream may move to another decode worker when its decode
  // worker dies mid-stream (0: the stream fails with UNAVAILABLE).
  int32_t max_migrations = 1;
  // A role change (`tandem role`, the planner) of a decode worker: how
  // long the router waits for its running decodes to finish before it
  // migrates the streams still there (identical tokens, like a dead decode
  // worker's); a prefill worker's in-flight prefills always finish and
  // ship. ms in [0, 600000].
  int32_t role_drain_timeout_ms = 1000;
  // A worker unhealthy (missed polls, no re-registration) this long is
  // dropped from the registry; it must register again to get requests.
  int32_t drop_after_ms = 30000;
  // Client API keys and their quotas (router/api_keys.h); a path as
  // written, relative to the router's working directory like `model`.
  // Empty (default): Generation is open, no key required. Read by the
  // router only, at start (an unreadable or invalid file stops it).
  std::string api_keys_file;
  RouterPolicy policy = RouterPolicy::kKvAware;  // router.policy
  // router.kv_aware; setting it under another policy is an error.
  KvAwareWeights kv_aware;
  // The OpenAI-compatible HTTP front door (router/openai): POST
  // /v1/completions, /v1/chat/completions, GET /v1/models, /health, /ready,
  // /metrics (behind the API keys when api_keys_file is set, like /v1/*).
  // Unset: no HTTP listener (gRPC only).
  std::optional<HostPort> http_listen;
  // Where the router serves GET /metrics (Prometheus text format) on its
  // own listener, with no API key, as workers' metrics_listen; flag
  // --metrics-listen wins. Unset: none (the client port's /metrics only).
  std::optional<HostPort> metrics_listen;
  // The model name clients send (`model`) and GET /v1/models lists; empty:
  // the model file's stem ("stories260K" for stories260K.gguf).
  std::string served_model_name;
  // Open streaming (SSE) responses at once; beyond: 503. One event-loop
  // thread serves them all.
  int32_t http_max_streams = 1024;
  // Largest request body in bytes; larger: 413 (>= 1024), answered as soon
  // as the headers declare it, before the body is read.
  int32_t http_max_body_bytes = 8 << 20;
  // Milliseconds an HTTP request may take to arrive: its headers from its
  // first byte, then its body from the end of the headers, each this long
  // (>= 1); late: 408 and the connection closes.
  int32_t http_read_timeout_ms = 30000;
};

// "kv_aware", "least_loaded" or "round_robin" (as router.policy spells it).
const char* RouterPolicyName(RouterPolicy policy);

struct WorkerConfig {
  std::string name;
  HostPort listen;      // gRPC
  Advertise advertise;  // the gRPC address registered with the router
  // The KV receiver. Every worker has one (a prefill worker may become a
  // decode worker at run time); default 127.0.0.1:0.
  HostPort kv_listen;
  // The KV endpoint prefill workers dial; unset: the host of `advertise`
  // (if set) with the bound KV port.
  Advertise kv_advertise;
  // Where the worker serves GET /metrics (Prometheus text format) over
  // HTTP; flag --metrics-listen wins. Unset: no metrics server. A wildcard
  // host is fine (Prometheus scrapes it; no peer in the cluster dials it).
  std::optional<HostPort> metrics_listen;
  // `device: cpu | cuda:N`: this worker's compute device, overriding
  // engine.device (a cluster may mix CPU and GPU workers). Unset: engine.device.
  std::optional<backend::DeviceSpec> device;
};

struct EngineConfig {
  int32_t block_size = 16;                // tokens per KV block
  int32_t num_kv_blocks = 2048;           // KV pool size per worker, blocks
  int32_t max_num_seqs = 64;              // decode batch cap, sequences
  int32_t threads = 1;                    // compute threads per worker
  int32_t max_num_batched_tokens = 2048;  // token budget per engine step
  int32_t prefill_chunk_tokens = 512;     // prefill tokens per sequence per step
  bool enable_prefix_caching = true;      // reuse full KV blocks across requests
  // GEMM instruction set: auto (best this CPU runs), avx512, avx2 or
  // generic. Part of the KV numerics id: pin it when workers run on
  // different CPUs so prefill and decode compute K/V with the same bits.
  std::string kernel_isa = "auto";
  // engine.q8_matmul: how Q8_0 weight matrices are multiplied on the CPU:
  // exact (dequantized to F32) or int8 (activations quantized to Q8_0,
  // integer dot products, as llama.cpp; its own bit-exact class). No effect
  // on a model without Q8_0 matrices; a CUDA worker refuses int8.
  model::Q8MatMul q8_matmul = model::Q8MatMul::kExact;
  // engine.device: cpu or cuda:N, for every worker without its own
  // `device:`.
  backend::DeviceSpec device;
  // engine.kv_cache_dtype: f32, f16 or bf16; unset: each worker's device's
  // default (WorkerKvDtype). Both backends hold all three (the CPU's
  // f16/bf16 halve its KV memory and the bytes attention reads).
  std::optional<kv::KvDtype> kv_cache_dtype;
  // engine.gpu_memory_fraction, in (0, 1]: the share of a GPU's total
  // memory a CUDA worker may use in all (weights, activations, workspaces,
  // KV pool); `tandem up` divides it among the workers sharing one GPU.
  // Setting it when no worker runs on cuda:N is an error.
  double gpu_memory_fraction = 0.9;
  // engine.batch_invariant: CUDA workers give bit-identical results across
  // batch composition (one GEMM algorithm, split-K 1, fixed attention
  // split). The CPU backend always is; false on a CPU worker is refused at
  // its start.
  bool batch_invariant = true;
  // Whether engine.num_kv_blocks was given: on cuda:N it then caps the
  // planned KV pool (unset: the pool is what gpu_memory_fraction leaves).
  bool num_kv_blocks_set = false;
};

enum class OnPrefillFailure { kFail, kRetry, kLocal };

// conditional.max_local_prefill_tokens: unbounded. The scheduler's rule
// (engine/scheduler/prefill_placement.h) sends a prompt to a prefill worker
// when L - hit > max_local_prefill_tokens; with L and hit int32 and
// 0 <= hit <= L, L - hit never exceeds INT32_MAX (no overflow), so every
// ROUTE_AUTO prompt is prefilled by its decode worker (colocated mode).
inline constexpr int32_t kUnboundedLocalPrefillTokens = INT32_MAX;

// conditional.placement: how a ROUTE_AUTO prompt with more than
// max_local_prefill_tokens to compute is placed
// (engine/scheduler/prefill_placement.h). Under both, a prompt with
// <= max_local_prefill_tokens tokens to compute (after the local prefix
// hit) is always prefilled by its decode worker, and `unbounded` still
// means colocated: the threshold is a floor below which nothing is
// predicted.
enum class PlacementMode {
  kThreshold,  // always a prefill worker (the rule before issue #34)
  kSlo,        // the placement with the lower predicted SLO miss
};

// "threshold" or "slo" (as conditional.placement spells it).
const char* PlacementModeName(PlacementMode mode);

// slo: the cluster's latency objectives (Prometheus/bench naming: TTFT,
// TPOT), ms; unset = none. Each, when given, is a finite number > 0
// (integers and decimals alike); `slo` must be a mapping with no other
// keys. They steer conditional.placement slo (its default when either is
// set) and, with tpot_ms, the prefill chunk budget of a worker running
// decodes; the router reports them (GetModelInfo, GetStatus).
struct SloConfig {
  std::optional<double> ttft_ms;
  std::optional<double> tpot_ms;
  bool any() const { return ttft_ms.has_value() || tpot_ms.has_value(); }
};

struct ConditionalConfig {
  // L - hit <= this -> local prefill; an integer >= 0, or `unbounded`
  // (kUnboundedLocalPrefillTokens): every prompt local unless a request
  // sets route_override REMOTE. Above it, `placement` decides. Under
  // placement slo it stays a floor: at or below it a prompt is local
  // whatever the predictions say.
  int32_t max_local_prefill_tokens = 32;
  // threshold | slo; unset: slo when the config's `slo` has ttft_ms or
  // tpot_ms, else threshold (ParseClusterConfig resolves it). slo with
  // neither is refused ("conditional.placement: slo needs slo.ttft_ms or
  // slo.tpot_ms").
  PlacementMode placement = PlacementMode::kThreshold;
  // retry: another prefill worker, then (retries exhausted) the decode
  // worker prefills; the default of the code and of every example config.
  OnPrefillFailure on_prefill_failure = OnPrefillFailure::kRetry;
};

struct KvConfig {
  int32_t transfer_timeout_ms = 5000;   // max stall of a running transfer
  int32_t handshake_timeout_ms = 5000;  // NeedRemotePrefill -> HELLO
  // Remote prefill attempts per request under on_prefill_failure: retry
  // (attempt 1 included); after the last one fails the request fails.
  int32_t max_prefill_attempts = 2;
  // Prefill worker, per decode worker it sends to: KV bytes queued but not
  // yet written to the socket. A request whose decode worker is at it
  // waits (others run), so a slow decode worker never stalls the prefill
  // worker. In [kMinSendBufferBytes, kMaxSendBufferBytes].
  uint64_t send_buffer_bytes = 268435456;                           // 256 MiB
  static constexpr int64_t kMinSendBufferBytes = 1 << 20;           // 1 MiB
  static constexpr int64_t kMaxSendBufferBytes = int64_t{1} << 40;  // 1 TiB
  // kv.transport (issue #16; kvtransfer/transport.h): auto (cuda_ipc
  // between GPU workers of one host, else nccl, else tcp) or one fixed
  // transport for every worker. Parsed by kvtransfer::
  // ParseKvTransportSetting. A fixed nccl or cuda_ipc with any worker on
  // cpu is refused when the file is read (its KV is in host memory).
  kvtransfer::KvTransportSetting transport;
  // kv.nccl_socket_ifname: the network interface NCCL bootstraps over
  // (NCCL_SOCKET_IFNAME; the interface of `advertise`). Empty: NCCL's own
  // choice.
  std::string nccl_socket_ifname;
  // kv.nccl_init_timeout_ms: the bound on creating one P-D communicator
  // (non-blocking ncclCommInitRank polled until done), ms, > 0.
  int32_t nccl_init_timeout_ms = 10000;
};

// The chat formats the router renders (router/chat_template.h, whose
// ChatFormatName() spells each of them; tests/router checks the two lists
// agree). The config's `chat_template` must be one of them.
inline constexpr std::array<absl::string_view, 12> kChatTemplateNames = {
    "chatml",           "qwen3",
    "llama3",           "llama2",
    "llama2-sys",       "llama2-sys-bos",
    "llama2-sys-strip", "mistral-v1",
    "mistral-v3",       "mistral-v3-tekken",
    "mistral-v7",       "mistral-v7-tekken"};

// Peer authentication (auth/cluster_auth.h). No secret_file: the
// cluster runs open (any host that reaches a worker port can call it).
struct ClusterAuthConfig {
  // A file holding the shared secret (>= 32 bytes, trailing newline
  // trimmed); relative paths from the working directory, like `model`.
  std::string secret_file;
  // Secrets also accepted when verifying (never used to sign), each file
  // read like secret_file; only with secret_file. A rolling rotation to a
  // new secret (auth/cluster_auth.h): secret_file OLD + accepted
  // [NEW] everywhere, then NEW + [OLD], then NEW + [].
  std::vector<std::string> accepted_secret_files;
  // Largest accepted |sender's clock - receiver's clock| of a credential;
  // nonces are remembered this long. In [1000, 600000].
  int32_t auth_max_skew_ms = 30000;
};

struct ClusterConfig {
  std::string model;  // as written in the file (may be empty)
  // The chat format GenerateRequest.messages are rendered with, overriding
  // the router's detection from the model's tokenizer.chat_template; empty
  // (default) = detect.
  std::string chat_template;
  RouterConfig router;
  std::vector<WorkerConfig> prefill_workers;
  std::vector<WorkerConfig> decode_workers;
  EngineConfig engine;
  ConditionalConfig conditional;
  SloConfig slo;
  PlannerConfig planner;  // the router's role planner (router/planner.h)
  KvConfig kv;
  int32_t shutdown_grace_s = 5;
  ClusterAuthConfig cluster;

  // The entry named `name` in prefill_workers or decode_workers, or nullptr.
  const WorkerConfig* FindWorker(const std::string& name) const;

  // The device `worker` runs on: its entry's `device:`, else engine.device.
  backend::DeviceSpec WorkerDevice(const WorkerConfig& worker) const;
  // The key WorkerDevice read, for messages: "decode_workers[decode-0].device"
  // (the entry's, named by the worker's name) or "engine.device".
  std::string WorkerDeviceKey(const WorkerConfig& worker) const;
  // The KV dtype `worker` holds: engine.kv_cache_dtype, else its device's
  // default (f32 on cpu, bf16 on cuda:N).
  kv::KvDtype WorkerKvDtype(const WorkerConfig& worker) const;
};

// Parses YAML text. Errors: INVALID_ARGUMENT naming the key path
// ("engine.block_size: must be > 0", "unknown key 'kv.foo'"), YAML syntax
// errors with line/column. Cross-field: with prefill workers, every worker
// must resolve to one KV dtype (KV moves from each prefill worker to each
// decode worker; the message names a pair that differs and
// engine.kv_cache_dtype); engine.gpu_memory_fraction set while no worker
// runs on cuda:N is refused; kv.transport nccl or cuda_ipc with a worker on
// cpu is refused naming the key and the worker.
[[nodiscard]] absl::StatusOr<ClusterConfig> ParseClusterConfig(const std::string& yaml_text);
// One line for the router's start-up log saying where prompts are
// prefilled under this config (docs/architecture.md, "Colocated mode").
// Workers not in the config may still register with the router, so:
//   no prefill workers, unbounded: "prefill placement: colocated (no
//     prefill workers, conditional.max_local_prefill_tokens unbounded: every
//     prompt is prefilled by its decode worker)";
//   no prefill workers, finite N: "prefill placement: colocated while no
//     prefill worker registers (none in the config;
//     conditional.max_local_prefill_tokens N applies to any that does)";
//   prefill workers, finite N: "prefill placement: conditional (local when
//     prompt tokens - cached prefix <= N, else a prefill worker)";
//     under conditional.placement slo the end is "else local or a prefill
//     worker by predicted SLO miss: ttft 2000 ms, tpot 50 ms)" (the
//     objectives set), and the no-prefill-workers, finite N line ends
//     "conditional.max_local_prefill_tokens N and placement by predicted
//     SLO miss (ttft 2000 ms) apply to any that does)";
//   prefill workers, unbounded (allowed, not refused: a request may still
//     ask for route_override REMOTE): "warning:
//     conditional.max_local_prefill_tokens is unbounded, so the K prefill
//     workers get only requests with route_override REMOTE".
std::string PrefillPlacementSummary(const ClusterConfig& config);

// The config every binary reads without --config (relative to the working
// directory: the repository root for scripts/up and the tests).
inline constexpr char kDefaultConfigPath[] = "deploy/local/cluster.yaml";

// Reads and parses a file. NOT_FOUND with the OS's reason if it cannot be
// read: "cannot read cluster config 'x.yaml': No such file or directory".
[[nodiscard]] absl::StatusOr<ClusterConfig> LoadClusterConfig(const std::string& path);

// Model path resolution (issue #2): the first explicit choice of the flag,
// $TANDEM_MODEL and the config's `model` wins and must be a readable file
// (NOT_FOUND naming it and the OS's reason otherwise: "--model /tmp: cannot
// read model file: Is a directory (pass --model PATH)"); with none given, models/stories260K.gguf, then
// ../shared/models/stories260K.gguf. NOT_FOUND with one line naming the
// --model flag when neither default exists.
[[nodiscard]] absl::StatusOr<std::string> ResolveModelPath(const std::string& flag_value,
                                                           const ClusterConfig& config);

}  // namespace tandem

#endif  // TANDEM_COMMON_CLUSTER_CONFIG_H_
