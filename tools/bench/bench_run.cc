// RunBench: `tandem bench` from parsed flags to the table and the JSON
// (the flags themselves are bench_cli.cc's).
#include <httplib.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <fstream>
#include <iostream>
#include <memory>

#include <nlohmann/json.hpp>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "tools/bench/arrivals.h"
#include "tools/bench/bench_cli.h"
#include "tools/bench/grpc_backend.h"
#include "tools/bench/openai_backend.h"
#include "tools/bench/runner.h"
#include "tools/router_client.h"

namespace tandem::cli {
namespace {

constexpr char kUsageHint[] = " (usage: tandem bench --help)";
// Deadline of the set-up RPCs (GetModelInfo, Tokenize) and GET /v1/models.
constexpr int kSetupTimeoutS = 10;

void SetSetupDeadline(grpc::ClientContext* context) {
  context->set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(kSetupTimeoutS));
}

// Generation.GetModelInfo on --router; the error names the flag and address.
[[nodiscard]] absl::StatusOr<v1::GetModelInfoResponse> GetModelInfo(v1::Generation::Stub& stub,
                                                                    const BenchOptions& o) {
  grpc::ClientContext context;
  SetApiKey(&context, o.api_key);
  SetSetupDeadline(&context);
  v1::GetModelInfoResponse info;
  const grpc::Status status = stub.GetModelInfo(&context, v1::GetModelInfoRequest(), &info);
  if (!status.ok()) {
    return absl::UnavailableError(
        absl::StrCat("GetModelInfo on --router ", o.router, " failed: ", GrpcStatusText(status)));
  }
  return info;
}

// The served model's name from GET {base_url}/v1/models (the first entry's
// "id"), as vLLM's bench serve does without --model.
[[nodiscard]] absl::StatusOr<std::string> FirstServedModel(const BenchOptions& o) {
  httplib::Client client(o.base_url);
  client.set_connection_timeout(kSetupTimeoutS, 0);
  client.set_read_timeout(kSetupTimeoutS, 0);
  httplib::Headers headers;
  if (!o.api_key.empty()) headers.emplace("Authorization", "Bearer " + o.api_key);
  const httplib::Result r = client.Get("/v1/models", headers);
  const std::string where = absl::StrCat("GET ", o.base_url, "/v1/models (--base-url)");
  if (!r) {
    return absl::UnavailableError(absl::StrCat(where, " failed: ", httplib::to_string(r.error())));
  }
  if (r->status != 200) {
    return absl::UnavailableError(
        absl::StrCat(where, " answered HTTP ", r->status, ": ", r->body.substr(0, 200)));
  }
  const nlohmann::json body = nlohmann::json::parse(r->body, nullptr, /*allow_exceptions=*/false);
  if (!body.is_object() || !body.contains("data") || !body["data"].is_array() ||
      body["data"].empty() || !body["data"][0].is_object() || !body["data"][0].contains("id") ||
      !body["data"][0]["id"].is_string()) {
    return absl::UnavailableError(
        absl::StrCat(where, ": no model id in the answer (give --model)"));
  }
  return body["data"][0]["id"].get<std::string>();
}

// Fills the model's facts into the dataset options: vocabulary, special
// ids (the negative "none" ids dropped), context length.
void SetModelFacts(const v1::GetModelInfoResponse& info, bench::DatasetOptions* d) {
  d->vocab_size = static_cast<int32_t>(info.vocab_size());
  d->context_length = static_cast<int32_t>(info.context_length());
  std::vector<int32_t> special = {info.bos_token_id(), info.eos_token_id()};
  special.insert(special.end(), info.eog_token_ids().begin(), info.eog_token_ids().end());
  special.erase(std::remove_if(special.begin(), special.end(), [](int32_t id) { return id < 0; }),
                special.end());
  std::sort(special.begin(), special.end());
  special.erase(std::unique(special.begin(), special.end()), special.end());
  d->special_token_ids = special;
}

// The ShareGPT tokenizer: Generation.Tokenize (add_bos true) on --router.
bench::Tokenizer RouterTokenizer(v1::Generation::Stub* stub, const BenchOptions& o) {
  return [stub, &o](const std::string& text) -> absl::StatusOr<std::vector<int32_t>> {
    grpc::ClientContext context;
    SetApiKey(&context, o.api_key);
    SetSetupDeadline(&context);
    v1::TokenizeRequest request;
    request.set_text(text);
    request.set_add_bos(true);
    v1::TokenizeResponse response;
    const grpc::Status status = stub->Tokenize(&context, request, &response);
    if (!status.ok()) {
      return absl::UnavailableError(
          absl::StrCat("Tokenize on --router ", o.router, " failed: ", GrpcStatusText(status)));
    }
    return std::vector<int32_t>(response.token_ids().begin(), response.token_ids().end());
  };
}

[[nodiscard]] absl::StatusOr<std::unique_ptr<bench::BenchBackend>> MakeBackend(
    const BenchOptions& o, const std::string& model) {
  switch (o.backend) {
    case BenchBackendKind::kTandem: {
      absl::StatusOr<std::unique_ptr<bench::GrpcBackend>> b = bench::GrpcBackend::Create(
          {.router = o.router, .api_key = o.api_key, .timeout_ms = o.timeout_ms});
      if (!b.ok()) return b.status();
      return std::unique_ptr<bench::BenchBackend>(std::move(*b));
    }
    case BenchBackendKind::kOpenAi: {
      absl::StatusOr<std::unique_ptr<bench::OpenAiBackend>> b =
          bench::OpenAiBackend::Create({.base_url = o.base_url,
                                        .model = model,
                                        .api_key = o.api_key,
                                        .timeout_ms = o.timeout_ms});
      if (!b.ok()) return b.status();
      return std::unique_ptr<bench::BenchBackend>(std::move(*b));
    }
  }
  return absl::InternalError("unknown backend");
}

// vLLM's "%Y%m%d-%H%M%S", local time.
std::string NowDate() {
  const std::time_t now = std::time(nullptr);
  std::tm local{};
  localtime_r(&now, &local);
  char buf[32];
  std::strftime(buf, sizeof(buf), "%Y%m%d-%H%M%S", &local);
  return buf;
}

// The run after the flags: exit 0 or 1 (the error printed).
int Run(const BenchOptions& options) {
  auto fail = [](const absl::Status& s) {
    std::cerr << "tandem bench: " << s.message() << "\n";
    return 1;
  };
  std::unique_ptr<v1::Generation::Stub> stub = MakeGenerationStub(options.router);
  absl::StatusOr<v1::GetModelInfoResponse> info = GetModelInfo(*stub, options);
  if (!info.ok()) return fail(info.status());
  // The run's model_id: --model, else what the backend's API calls the
  // model (the OpenAI port's served name; GetModelInfo's GGUF general.name).
  std::string model = options.model.empty() ? info->name() : options.model;
  if (options.backend == BenchBackendKind::kOpenAi && options.model.empty()) {
    absl::StatusOr<std::string> served = FirstServedModel(options);
    if (!served.ok()) return fail(served.status());
    model = *served;
  }

  bench::DatasetOptions dataset = options.dataset;
  SetModelFacts(*info, &dataset);
  absl::StatusOr<std::vector<bench::BenchRequest>> requests =
      bench::LoadDataset(dataset, RouterTokenizer(stub.get(), options));
  if (!requests.ok()) {
    // A combination of flags only the dataset can judge ("--num-prompts: 3
    // is fewer than --prefix-repetition-num-prefixes 10") is a bad flag;
    // a file's or the model's problem is not.
    const absl::Status& s = requests.status();
    if (s.code() == absl::StatusCode::kInvalidArgument && absl::StartsWith(s.message(), "--")) {
      std::cerr << "tandem bench: " << s.message() << kUsageHint << "\n";
      return 2;
    }
    return fail(s);
  }

  bench::RunOptions run;
  run.max_concurrency = options.max_concurrency.value_or(0);
  run.num_warmups = options.num_warmups;
  run.progress = options.progress;
  if (!options.trace_timestamps) {
    absl::StatusOr<std::vector<double>> times =
        bench::ArrivalTimes(static_cast<int32_t>(requests->size()), options.request_rate,
                            options.burstiness, dataset.seed);
    if (!times.ok()) return fail(times.status());
    run.send_times_s = *std::move(times);
  }

  // Opened before the run, so a path that cannot be written fails at once.
  std::ofstream save;
  if (!options.save_result.empty()) {
    save.open(options.save_result, std::ios::trunc);
    if (!save) {
      return fail(absl::NotFoundError(
          absl::StrCat("--save-result: cannot write '", options.save_result, "'")));
    }
  }
  // A run that fails from here leaves no empty result file behind.
  auto fail_unsaved = [&](const absl::Status& s) {
    if (save.is_open()) {
      save.close();
      std::remove(options.save_result.c_str());
    }
    return fail(s);
  };
  absl::StatusOr<std::unique_ptr<bench::BenchBackend>> backend = MakeBackend(options, model);
  if (!backend.ok()) return fail_unsaved(backend.status());

  std::fputs(FormatRunHeader(options).c_str(), stdout);
  std::fflush(stdout);
  absl::StatusOr<bench::RunResult> result = bench::RunBenchmark(**backend, *requests, run);
  backend->reset();  // waits for every stream: nothing runs past this point
  if (!result.ok()) return fail_unsaved(result.status());

  const bench::BenchmarkMetrics metrics = bench::ComputeMetrics(
      result->outputs, result->duration_s, options.goodput, options.percentiles);
  bench::RunInfo run_info;
  run_info.date = NowDate();
  run_info.backend = options.backend == BenchBackendKind::kTandem ? "tandem-grpc" : "openai";
  run_info.model_id = model;
  run_info.dataset = dataset.name;
  run_info.num_prompts = static_cast<int32_t>(requests->size());
  run_info.request_rate = options.request_rate;
  run_info.burstiness = options.burstiness;
  run_info.max_concurrency = options.max_concurrency;
  run_info.goodput = options.goodput;
  std::fputs(bench::FormatResultTable(metrics, run_info).c_str(), stdout);
  std::fflush(stdout);
  if (metrics.failed > 0) {
    const auto first = std::find_if(result->outputs.begin(), result->outputs.end(),
                                    [](const bench::RequestOutput& r) { return !r.success; });
    std::cerr << "tandem bench: " << metrics.failed << " of " << result->outputs.size()
              << " requests failed; the first: " << first->error << "\n";
  }
  if (save.is_open()) {
    save << bench::ResultJson(metrics, result->outputs, run_info)
                .dump(-1, ' ', false, nlohmann::json::error_handler_t::replace)
         << "\n";
    save.close();
    if (!save) {
      return fail(absl::DataLossError(
          absl::StrCat("--save-result: writing '", options.save_result, "' failed")));
    }
  }
  return 0;
}

}  // namespace

int RunBench(const std::vector<std::string>& args) {
  absl::StatusOr<BenchOptions> options = ParseBenchArgs(args);
  if (!options.ok()) {
    std::cerr << "tandem bench: " << options.status().message() << kUsageHint << "\n";
    return 2;
  }
  return Run(*options);
}

}  // namespace tandem::cli
