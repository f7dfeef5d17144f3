// `tandem bench`: a serving benchmark against a Tandem router, modelled on
// vLLM's `vllm bench serve` (benchmarks/serve.py): the same flags where they
// exist there, the same header lines, result table and JSON field names.
//
//   flags -> BenchOptions -> GetModelInfo (router) -> LoadDataset ->
//   ArrivalTimes -> RunBenchmark (backend) -> ComputeMetrics -> table on
//   stdout, ResultJson to --save-result
//
// Where the model's facts come from: the router's gRPC API (--router,
// Generation.GetModelInfo: vocabulary size, BOS/EOS/EOG ids, context length,
// name; Generation.Tokenize for ShareGPT's lengths), with either backend.
// vLLM's client loads the model's tokenizer itself (--model / --tokenizer);
// Tandem's client has no tokenizer of its own, so the router is its
// tokenizer. The OpenAI port gives only the served model's name (GET
// /v1/models), which --backend openai sends as "model" unless --model names
// it. So `--backend openai` needs both ports (`tandem up` opens both).
#ifndef TANDEM_TOOLS_BENCH_BENCH_CLI_H_
#define TANDEM_TOOLS_BENCH_BENCH_CLI_H_

#include <cstdint>
#include <limits>
#include <optional>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "tools/bench/datasets.h"
#include "tools/bench/metrics.h"

namespace tandem::cli {

// The largest --num-prompts (a run is planned in memory before it starts).
inline constexpr int32_t kMaxNumPrompts = 10'000'000;

// Where the requests go (--backend).
enum class BenchBackendKind {
  kTandem,  // "tandem": tandem.v1.Generation.Generate on --router (gRPC)
  kOpenAi,  // "openai": POST --base-url/v1/completions, "stream": true
};

// Everything `tandem bench` was asked to do. Defaults are vLLM's `bench
// serve` defaults where the flag exists there.
struct BenchOptions {
  std::string router = "127.0.0.1:50051";  // --router: the gRPC API (model info, tandem backend)
  BenchBackendKind backend = BenchBackendKind::kTandem;  // --backend tandem|openai
  // --base-url: the router's OpenAI HTTP port, "http://HOST:PORT" (no path);
  // used by --backend openai only. Default: deploy/local/cluster.yaml's
  // router.http_listen (vLLM's default is the same port, 8000).
  std::string base_url = "http://127.0.0.1:8000";
  std::string api_key;  // --api-key, else $TANDEM_API_KEY; "" = none (both ports)
  // --model: the "model" field of OpenAI requests and the result's
  // model_id; "" = GET /v1/models' first id (openai) or GetModelInfo.name,
  // the GGUF's general.name (tandem: the router serves one model, so the
  // name is only reported).
  std::string model;

  // --dataset, --dataset-path, --num-prompts (1000), --seed (0) and each
  // dataset's flags; vocab_size, special_token_ids and context_length are
  // filled from GetModelInfo by RunBench, not by flags.
  bench::DatasetOptions dataset;

  // --request-rate, requests/s: +inf (the default, "inf") sends every
  // request at once; otherwise finite > 0.
  double request_rate = std::numeric_limits<double>::infinity();
  // true for --dataset mooncake without --request-rate: each request is
  // sent at its trace timestamp (the JSON's request_rate then says inf);
  // with --request-rate the trace's requests follow the arrival process.
  bool trace_timestamps = false;
  double burstiness = 1;                   // --burstiness: gamma shape, finite > 0; 1 = Poisson
  std::optional<int32_t> max_concurrency;  // --max-concurrency: >= 1; absent = unbounded
  int32_t num_warmups = 0;                 // --num-warmups: >= 0, not measured
  std::optional<bench::SloSpec> goodput;   // --goodput ttft:MS [tpot:MS] [e2el:MS]
  std::vector<double> percentiles = {99};  // --metric-percentiles, vLLM's default "99"
  std::string save_result;                 // --save-result FILE; "" = not saved
  bool progress = true;                    // false with --no-progress
  int64_t timeout_ms = 600000;             // --timeout-ms: per request deadline; 0 = none
};

// Parses the arguments after "bench". `--goodput` takes every following
// argument up to the next one starting with "--" (one or more items, as
// vLLM's nargs="+"). Errors, INVALID_ARGUMENT naming the flag: an unknown
// flag, a value that does not parse, a flag given twice, an argument that
// belongs to no flag, and out of range: --num-prompts, --random-input-len,
// --random-output-len, --prefix-repetition-num-prefixes,
// --prefix-repetition-output-len, --sharegpt-output-len,
// --mooncake-block-size, --max-concurrency < 1; --random-prefix-len,
// --prefix-repetition-prefix-len, --prefix-repetition-suffix-len,
// --num-warmups, --timeout-ms < 0; integers over int32; --random-range-ratio
// outside [0, 1); --request-rate not "inf" nor > 0; --burstiness not > 0;
// --dataset not a kDatasetNames entry ("--dataset: unknown 'x' (expected
// random, prefix-repetition, sharegpt or mooncake)"); sharegpt or mooncake
// without --dataset-path; --backend not tandem or openai; --base-url not
// "http://HOST:PORT"; --router not HOST:PORT; an empty --api-key, --model or
// --save-result; --goodput / --metric-percentiles items as metrics.h's
// ParseGoodput / ParsePercentiles reject them.
[[nodiscard]] absl::StatusOr<BenchOptions> ParseBenchArgs(const std::vector<std::string>& args);

// `tandem bench --help`: the usage, one line or more per flag (every flag
// ParseBenchArgs accepts), with defaults and exit statuses.
const char* BenchUsage();

// vLLM's lines before a run, each ending in "\n":
//   Traffic request rate: R            (Python's float repr: "inf", "20.0", "2.5";
//                                       "trace timestamps" with trace_timestamps)
//   Burstiness factor: B (Poisson process)   (B == 1; else "(Gamma distribution)")
//   Maximum request concurrency: N     ("None" when unbounded)
std::string FormatRunHeader(const BenchOptions& options);

// Python's repr of a float as vLLM prints it: "inf", "20.0", "0.5", "1e-05".
std::string PythonFloat(double value);

// Runs `tandem bench`: returns the exit status. 0: the run finished (failed
// requests are counted, not fatal); 1: it could not run (router
// unreachable, GetModelInfo refused, a dataset error such as a malformed
// trace line, --save-result not writable); 2: a bad flag, including a
// combination LoadDataset refuses with INVALID_ARGUMENT naming a flag
// ("--num-prompts: 3 is fewer than --prefix-repetition-num-prefixes 10"). Errors are one
// line on stderr, "tandem bench: ..."; the header lines and the result
// table go to stdout, the progress bar to stderr.
int RunBench(const std::vector<std::string>& args);

}  // namespace tandem::cli

#endif  // TANDEM_TOOLS_BENCH_BENCH_CLI_H_
