#include "tools/bench/bench_cli.h"

#include <charconv>
#include <cmath>
#include <cstdio>
#include <iostream>
#include <limits>

#include "absl/strings/ascii.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "tools/cli_args.h"
#include "tools/router_client.h"

namespace tandem::cli {
namespace {

constexpr char kUsage[] =
    "usage: tandem bench [--router H:P] [--backend tandem|openai] [--base-url http://H:P]\n"
    "                    [--api-key KEY] [--model NAME]\n"
    "                    [--dataset random|prefix-repetition|sharegpt|mooncake] [--dataset-path "
    "F]\n"
    "                    [--num-prompts N] [--seed S]\n"
    "                    [--random-input-len N] [--random-output-len N] [--random-range-ratio R]\n"
    "                    [--random-prefix-len N]\n"
    "                    [--prefix-repetition-prefix-len N] [--prefix-repetition-suffix-len N]\n"
    "                    [--prefix-repetition-num-prefixes N] [--prefix-repetition-output-len N]\n"
    "                    [--sharegpt-output-len N] [--mooncake-block-size N]\n"
    "                    [--request-rate R|inf] [--burstiness B] [--max-concurrency N]\n"
    "                    [--num-warmups N] [--goodput ttft:MS [tpot:MS] [e2el:MS]]\n"
    "                    [--metric-percentiles 50,90,99] [--save-result FILE] [--no-progress]\n"
    "                    [--timeout-ms MS]\n"
    "A serving benchmark, as vLLM's `vllm bench serve` (same flags, table and JSON fields).\n"
    "  --router H:P          the router's gRPC API (default 127.0.0.1:50051): model info and\n"
    "                        tokenizer for every backend, and the requests of --backend tandem\n"
    "  --backend B           tandem (gRPC Generate, default) or openai (POST --base-url\n"
    "                        /v1/completions, streamed); openai still needs --router\n"
    "  --base-url URL        the OpenAI port, http://HOST:PORT (default http://127.0.0.1:8000)\n"
    "  --api-key KEY         sent as `authorization: Bearer KEY` (default $TANDEM_API_KEY)\n"
    "  --model NAME          the result's model_id and openai's \"model\" (default: GET\n"
    "                        /v1/models' first id; tandem: GetModelInfo's name)\n"
    "  --dataset D           random (default), prefix-repetition, sharegpt (--dataset-path\n"
    "                        a ShareGPT JSON file) or mooncake (--dataset-path a JSONL trace:\n"
    "                        timestamp, input_length, output_length, hash_ids; sent at its\n"
    "                        timestamps)\n"
    "  --num-prompts N       requests (default 1000); --seed S (default 0) fixes them all\n"
    "  --random-input-len N / --random-output-len N   tokens (default 1024 / 128), drawn from\n"
    "                        [N*(1-R), N*(1+R)] with --random-range-ratio R in [0,1) (default\n"
    "                        0), after --random-prefix-len shared tokens (default 0)\n"
    "  --prefix-repetition-prefix-len N / -suffix-len N / -num-prefixes N / -output-len N\n"
    "                        shared prefixes (default 256 / 256 / 10 / 128)\n"
    "  --sharegpt-output-len N  output tokens of every ShareGPT request (default: the reply's)\n"
    "  --mooncake-block-size N  tokens per hash id of a Mooncake trace (default 512)\n"
    "  --request-rate R      requests/s (default inf: all at once; mooncake: the trace's\n"
    "                        timestamps), gaps from a gamma distribution of shape\n"
    "                        --burstiness B (default 1: Poisson)\n"
    "  --max-concurrency N   at most N requests in flight (default: unbounded)\n"
    "  --num-warmups N       requests sent first and not measured (default 0)\n"
    "  --goodput ttft:MS [tpot:MS] [e2el:MS]   SLOs of request_goodput (one or more items)\n"
    "  --metric-percentiles P,...   percentiles reported (default 99)\n"
    "  --save-result FILE    the result JSON (vLLM's field names)\n"
    "  --no-progress         no progress bar (on stderr)\n"
    "  --timeout-ms MS       per-request deadline (default 600000; 0 = none)\n"
    "exit: 0 the run finished (failed requests are counted), 1 it could not run (router\n"
    "unreachable, dataset or trace error), 2 bad flag\n";

constexpr char kUsageHint[] = " (usage: tandem bench --help)";

constexpr int32_t kInt32Max = std::numeric_limits<int32_t>::max();

// The value of integer flag `name` (absent: `fallback`) if it lies in
// [lo, int32 max]; INVALID_ARGUMENT "--<name>: must be in LO..MAX, got V".
[[nodiscard]] absl::StatusOr<int32_t> Int32Flag(const ParsedArgs& parsed, const std::string& name,
                                                int32_t fallback, int32_t lo) {
  absl::StatusOr<int64_t> value = parsed.GetInt(name, fallback);
  if (!value.ok()) return value.status();
  if (*value < lo || *value > kInt32Max) {
    return absl::InvalidArgumentError(
        absl::StrCat("--", name, ": must be in ", lo, "..", kInt32Max, ", got ", *value));
  }
  return static_cast<int32_t>(*value);
}

// Rewrites "--goodput A B C" (vLLM's nargs="+") into "--goodput=A
// --goodput=B --goodput=C" for ParseArgs, where --goodput is repeatable;
// a second --goodput flag or one with no item is an error here.
[[nodiscard]] absl::StatusOr<std::vector<std::string>> ExpandGoodput(
    const std::vector<std::string>& args) {
  std::vector<std::string> out;
  bool seen = false;
  for (size_t i = 0; i < args.size(); ++i) {
    const std::string& arg = args[i];
    if (arg == "--") {
      out.insert(out.end(), args.begin() + i, args.end());
      break;
    }
    const bool bare = arg == "--goodput";
    if (!bare && arg.rfind("--goodput=", 0) != 0) {
      out.push_back(arg);
      continue;
    }
    if (seen) return absl::InvalidArgumentError("--goodput: given more than once");
    seen = true;
    size_t items = 0;
    if (!bare) {
      out.push_back(arg);
      ++items;
    }
    while (i + 1 < args.size() && args[i + 1].rfind("--", 0) != 0) {
      out.push_back("--goodput=" + args[++i]);
      ++items;
    }
    if (items == 0) {
      return absl::InvalidArgumentError(
          "--goodput: expected one or more items (ttft:MS tpot:MS e2el:MS)");
    }
  }
  return out;
}

[[nodiscard]] absl::Status ParseDatasetFlags(const ParsedArgs& parsed, bench::DatasetOptions* d) {
  d->name = parsed.GetString("dataset", d->name);
  bool known = false;
  for (const char* name : bench::kDatasetNames) known = known || d->name == name;
  if (!known) {
    return absl::InvalidArgumentError(
        absl::StrCat("--dataset: unknown '", d->name,
                     "' (expected random, prefix-repetition, sharegpt or mooncake)"));
  }
  d->path = parsed.GetString("dataset-path", "");
  if ((d->name == "sharegpt" || d->name == "mooncake") && d->path.empty()) {
    return absl::InvalidArgumentError(
        absl::StrCat("--dataset-path: required with --dataset ", d->name));
  }
  absl::StatusOr<uint64_t> seed = parsed.GetUint("seed", d->seed);
  if (!seed.ok()) return seed.status();
  d->seed = *seed;

  struct IntFlag {
    const char* name;
    int32_t lo;
    int32_t* field;
  };
  for (const IntFlag& f :
       {IntFlag{"num-prompts", 1, &d->num_prompts},
        IntFlag{"random-input-len", 1, &d->random_input_len},
        IntFlag{"random-output-len", 1, &d->random_output_len},
        IntFlag{"random-prefix-len", 0, &d->random_prefix_len},
        IntFlag{"prefix-repetition-prefix-len", 0, &d->prefix_repetition_prefix_len},
        IntFlag{"prefix-repetition-suffix-len", 0, &d->prefix_repetition_suffix_len},
        IntFlag{"prefix-repetition-num-prefixes", 1, &d->prefix_repetition_num_prefixes},
        IntFlag{"prefix-repetition-output-len", 1, &d->prefix_repetition_output_len},
        IntFlag{"mooncake-block-size", 1, &d->mooncake_block_size}}) {
    absl::StatusOr<int32_t> value = Int32Flag(parsed, f.name, *f.field, f.lo);
    if (!value.ok()) return value.status();
    *f.field = *value;
  }
  // Each request costs the client a few hundred bytes before the first is
  // sent (the whole schedule is built up front): a cap keeps a typo from
  // ending in std::bad_alloc.
  if (d->num_prompts > kMaxNumPrompts) {
    return absl::InvalidArgumentError(
        absl::StrCat("--num-prompts: at most ", kMaxNumPrompts, ", got ", d->num_prompts));
  }
  if (parsed.Has("sharegpt-output-len")) {
    absl::StatusOr<int32_t> value = Int32Flag(parsed, "sharegpt-output-len", 0, 1);
    if (!value.ok()) return value.status();
    d->sharegpt_output_len = *value;
  }
  absl::StatusOr<double> ratio = parsed.GetDouble("random-range-ratio", d->random_range_ratio);
  if (!ratio.ok()) return ratio.status();
  if (!(*ratio >= 0 && *ratio < 1)) {
    return absl::InvalidArgumentError(
        absl::StrCat("--random-range-ratio: must be in [0, 1), got ", *ratio));
  }
  d->random_range_ratio = *ratio;
  return absl::OkStatus();
}

[[nodiscard]] absl::Status ParseTrafficFlags(const ParsedArgs& parsed, BenchOptions* o) {
  const std::string rate = parsed.GetString("request-rate", "inf");
  if (absl::AsciiStrToLower(rate) == "inf") {
    o->request_rate = std::numeric_limits<double>::infinity();
  } else {
    absl::StatusOr<double> value = ParseDoubleValue("request-rate", rate);
    if (!value.ok()) return value.status();
    if (!(*value > 0)) {
      return absl::InvalidArgumentError(
          absl::StrCat("--request-rate: must be > 0 or inf, got '", rate, "'"));
    }
    o->request_rate = *value;
  }
  absl::StatusOr<double> burstiness = parsed.GetDouble("burstiness", o->burstiness);
  if (!burstiness.ok()) return burstiness.status();
  if (!(*burstiness > 0)) {
    return absl::InvalidArgumentError(absl::StrCat("--burstiness: must be > 0, got ", *burstiness));
  }
  o->burstiness = *burstiness;
  if (parsed.Has("max-concurrency")) {
    absl::StatusOr<int32_t> value = Int32Flag(parsed, "max-concurrency", 0, 1);
    if (!value.ok()) return value.status();
    o->max_concurrency = *value;
  }
  absl::StatusOr<int32_t> warmups = Int32Flag(parsed, "num-warmups", o->num_warmups, 0);
  if (!warmups.ok()) return warmups.status();
  o->num_warmups = *warmups;
  absl::StatusOr<int64_t> timeout_ms = parsed.GetInt("timeout-ms", o->timeout_ms);
  if (!timeout_ms.ok()) return timeout_ms.status();
  if (*timeout_ms < 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("--timeout-ms: must be >= 0, got ", *timeout_ms));
  }
  o->timeout_ms = *timeout_ms;
  return absl::OkStatus();
}

// OK for "http://HOST:PORT" with a port in 1..65535 (a trailing "/" allowed).
[[nodiscard]] absl::Status CheckBaseUrl(const std::string& url) {
  constexpr char kScheme[] = "http://";
  std::string rest = url.rfind(kScheme, 0) == 0 ? url.substr(sizeof(kScheme) - 1) : "";
  if (!rest.empty() && rest.back() == '/') rest.pop_back();
  const size_t colon = rest.rfind(':');
  int64_t port = 0;
  if (rest.empty() || colon == std::string::npos || colon == 0 ||
      rest.find('/') != std::string::npos ||
      !ParseIntValue("base-url", rest.substr(colon + 1)).ok() ||
      (port = *ParseIntValue("base-url", rest.substr(colon + 1))) < 1 || port > 65535) {
    return absl::InvalidArgumentError(
        absl::StrCat("--base-url: expected http://HOST:PORT, got '", url, "'"));
  }
  return absl::OkStatus();
}

}  // namespace

const char* BenchUsage() { return kUsage; }

absl::StatusOr<BenchOptions> ParseBenchArgs(const std::vector<std::string>& args) {
  absl::StatusOr<std::vector<std::string>> expanded = ExpandGoodput(args);
  if (!expanded.ok()) return expanded.status();
  std::vector<FlagSpec> spec = {{"router"},
                                {"backend"},
                                {"base-url"},
                                {"api-key"},
                                {"model"},
                                {"dataset"},
                                {"dataset-path"},
                                {"num-prompts"},
                                {"seed"},
                                {"random-input-len"},
                                {"random-output-len"},
                                {"random-range-ratio"},
                                {"random-prefix-len"},
                                {"prefix-repetition-prefix-len"},
                                {"prefix-repetition-suffix-len"},
                                {"prefix-repetition-num-prefixes"},
                                {"prefix-repetition-output-len"},
                                {"sharegpt-output-len"},
                                {"mooncake-block-size"},
                                {"request-rate"},
                                {"burstiness"},
                                {"max-concurrency"},
                                {"num-warmups"},
                                {"goodput", true, true},
                                {"metric-percentiles"},
                                {"save-result"},
                                {"no-progress", false},
                                {"timeout-ms"}};
  absl::StatusOr<ParsedArgs> parsed = ParseArgs(*expanded, spec);
  if (!parsed.ok()) return parsed.status();
  if (!parsed->positional().empty()) {
    return absl::InvalidArgumentError(
        absl::StrCat("unexpected argument '", parsed->positional().front(), "'"));
  }
  BenchOptions o;
  o.router = parsed->GetString("router", o.router);
  if (absl::Status s = CheckRouterAddress(o.router); !s.ok()) return s;
  const std::string backend = parsed->GetString("backend", "tandem");
  if (backend == "tandem") {
    o.backend = BenchBackendKind::kTandem;
  } else if (backend == "openai") {
    o.backend = BenchBackendKind::kOpenAi;
  } else {
    return absl::InvalidArgumentError(
        absl::StrCat("--backend: expected tandem or openai, got '", backend, "'"));
  }
  o.base_url = parsed->GetString("base-url", o.base_url);
  if (absl::Status s = CheckBaseUrl(o.base_url); !s.ok()) return s;
  if (!o.base_url.empty() && o.base_url.back() == '/') o.base_url.pop_back();
  for (const char* name : {"api-key", "model", "save-result"}) {
    if (parsed->Has(name) && parsed->GetString(name, "").empty()) {
      return absl::InvalidArgumentError(absl::StrCat("--", name, ": must not be empty"));
    }
  }
  absl::StatusOr<std::string> api_key = ResolveApiKey(parsed->GetString("api-key", ""));
  if (!api_key.ok()) return api_key.status();
  o.api_key = *api_key;
  o.model = parsed->GetString("model", "");
  if (absl::Status s = ParseDatasetFlags(*parsed, &o.dataset); !s.ok()) return s;
  if (absl::Status s = ParseTrafficFlags(*parsed, &o); !s.ok()) return s;
  if (parsed->Has("goodput")) {
    absl::StatusOr<bench::SloSpec> slo = bench::ParseGoodput(parsed->GetAll("goodput"));
    if (!slo.ok()) return slo.status();
    o.goodput = *slo;
  }
  if (parsed->Has("metric-percentiles")) {
    absl::StatusOr<std::vector<double>> p =
        bench::ParsePercentiles(parsed->GetString("metric-percentiles", ""));
    if (!p.ok()) return p.status();
    o.percentiles = *p;
  }
  o.trace_timestamps = o.dataset.name == "mooncake" && !parsed->Has("request-rate");
  o.save_result = parsed->GetString("save-result", "");
  o.progress = !parsed->Has("no-progress");
  return o;
}

std::string PythonFloat(double value) {
  if (std::isinf(value)) return value > 0 ? "inf" : "-inf";
  if (std::isnan(value)) return "nan";
  char buf[64];
  const std::to_chars_result end = std::to_chars(buf, buf + sizeof(buf), value);
  std::string text(buf, end.ptr);
  if (text.find_first_of(".e") == std::string::npos) text += ".0";
  return text;
}

std::string FormatRunHeader(const BenchOptions& options) {
  return absl::StrCat(
      "Traffic request rate: ",
      options.trace_timestamps ? "trace timestamps" : PythonFloat(options.request_rate), "\n",
      "Burstiness factor: ", PythonFloat(options.burstiness),
      options.burstiness == 1 ? " (Poisson process)" : " (Gamma distribution)", "\n",
      "Maximum request concurrency: ",
      options.max_concurrency.has_value() ? absl::StrCat(*options.max_concurrency) : "None", "\n");
}

}  // namespace tandem::cli
