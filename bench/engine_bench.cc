// Engine micro-benchmarks on stories260K (or $TANDEM_MODEL): prefill and
// decode tokens/s of the raw LlamaModel::Forward over a paged KV cache, and
// the decode worker's serving loop (the engine core over the CPU backend,
// no gRPC, no-op output) at
// the same batch sizes, so that the difference is the loop's own overhead
// (admission, scheduling, sampling, block-table bookkeeping, sink calls).
// All use real (wall-clock) time: Forward may run on a thread pool.
// $TANDEM_BENCH_Q8_MATMUL (exact | int8) and $TANDEM_BENCH_KV_DTYPE
// (f32 | f16 | bf16) set engine.q8_matmul and engine.kv_cache_dtype
// (bench_util.h); defaults exact and f32 (also when set but empty). A bad
// value, or a $TANDEM_MODEL that cannot be read, exits 2 before any run.
// BM_Prefill and BM_Decode also publish the model's matrix weights as
// counters (params_matmul, weight_bytes; see MatMulWeights) and its weight
// type as the label, from which bench/report.py derives GFLOP/s and GB/s.
#include <algorithm>
#include <cerrno>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <map>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/synchronization/mutex.h"
#include "benchmark/benchmark.h"
#include "bench/bench_util.h"
#include "engine/backend/cpu_backend.h"
#include "engine/core/engine_core.h"
#include "engine/kv/block_pool.h"
#include "engine/kv/cpu_kv_storage.h"
#include "engine/model/llama_model.h"
#include "engine/sampling/sampler.h"
#include "engine/sampling/sampling_view.h"

namespace tandem::bench {
namespace {

constexpr int32_t kBlockSize = 16;
constexpr int32_t kPrefillTokens = 512;
// Decode context: every decode benchmark keeps ~kDecodeContext tokens of
// history per sequence.
constexpr int32_t kDecodeContext = 128;

// Loads the model or marks the benchmark skipped (returns null).
const model::LlamaModel* ModelOrSkip(benchmark::State& state, int32_t threads) {
  auto m = GetModel(threads);
  if (!m.ok()) {
    state.SkipWithError(absl::StrCat("model ", ModelPath(), ": ", m.status().ToString()).c_str());
    return nullptr;
  }
  return *m;
}

// BenchKvDtype(), or kF32 after marking the benchmark skipped (with the
// variable's error) when it is set to something else; *ok says which.
kv::KvDtype KvDtypeOrSkip(benchmark::State& state, bool* ok) {
  absl::StatusOr<kv::KvDtype> d = BenchKvDtype();
  *ok = d.ok();
  if (!d.ok()) state.SkipWithError(d.status().ToString().c_str());
  return d.ok() ? *d : kv::KvDtype::kF32;
}

// Publishes MatMulWeights of `m` on `state`: counters params_matmul
// (weights) and weight_bytes (bytes as stored), label = weight type. Marks
// the benchmark skipped and returns false when they cannot be read.
bool SetWeightCounters(benchmark::State& state, const model::LlamaModel& m) {
  auto w = GetMatMulWeights(m.config());
  if (!w.ok()) {
    state.SkipWithError(w.status().ToString().c_str());
    return false;
  }
  state.counters["params_matmul"] = benchmark::Counter(static_cast<double>(w->params));
  state.counters["weight_bytes"] = benchmark::Counter(static_cast<double>(w->bytes));
  state.SetLabel(w->type);
  return true;
}

// Prefill: one Forward over a 512-token prompt of random ids (clamped to
// the context length) at positions [0, 512), logits of the last token only.
// Arg: threads. Counters: tokens/s, GFLOP/s (the pass's exact work, below).
void BM_Prefill(benchmark::State& state) {
  const model::LlamaModel* m = ModelOrSkip(state, static_cast<int32_t>(state.range(0)));
  if (m == nullptr) return;
  const int32_t n = std::min(kPrefillTokens, m->config().context_length);
  const int32_t num_blocks = kv::BlocksForTokens(n, kBlockSize);
  bool dtype_ok = false;
  const kv::KvDtype dtype = KvDtypeOrSkip(state, &dtype_ok);
  if (!dtype_ok) return;
  kv::CpuKvStorage kv(m->kv_shape(kBlockSize), num_blocks, dtype);
  kv::BlockPool blocks(num_blocks);
  const std::vector<int32_t> table = *blocks.Allocate(num_blocks);
  const std::vector<int32_t> tokens = RandomTokens(n, m->config().vocab_size, 7);
  model::SequenceBatch seq;
  seq.tokens = tokens;
  seq.block_table = &table;
  std::vector<float> logits;
  for (auto _ : state) {
    m->Forward({&seq, 1}, kv, &logits);
    benchmark::DoNotOptimize(logits.data());
  }
  state.counters["tokens/s"] = benchmark::Counter(n, benchmark::Counter::kIsIterationInvariantRate);
  // The pass's floating-point work: 2 per multiply-add of every MatMul but
  // the output projection for n tokens, the output projection for the last
  // token, and attention (QK and PV: 4 q_dim per key, token t has t + 1
  // keys, every layer).
  const model::LlamaConfig& c = m->config();
  const double output = static_cast<double>(c.vocab_size) * c.n_embd;
  const double q_dim = static_cast<double>(c.n_head) * c.head_dim;
  if (auto w = GetMatMulWeights(c); w.ok()) {
    const double flops = 2.0 * n * (static_cast<double>(w->params) - output) + 2.0 * output +
                         4.0 * q_dim * c.n_layers * (static_cast<double>(n) * (n + 1) / 2);
    state.counters["GFLOP/s"] =
        benchmark::Counter(flops * 1e-9, benchmark::Counter::kIsIterationInvariantRate);
  }
  SetWeightCounters(state, *m);
}
BENCHMARK(BM_Prefill)
    ->ArgName("threads")
    ->Arg(1)
    ->Arg(2)
    ->UseRealTime()
    ->Unit(benchmark::kMillisecond);

// The KV cache BM_Decode reads: `batch` sequences of
// BlocksForTokens(kDecodeContext) blocks each, positions
// [0, kDecodeContext - 1) filled. Sequence 0's history (random ids) is
// prefilled by one Forward and copied block by block into every other
// sequence's own blocks, so each sequence still reads its own K/V (the same
// traffic and work as distinct histories: attention does not depend on the
// values) while a 110M-class model needs one 127-token prefill instead of
// `batch` of them. Built once per batch size and kept for the process
// (every thread count loads the same file, so the cache is the same).
struct DecodeCache {
  std::unique_ptr<kv::CpuKvStorage> storage;
  std::vector<std::vector<int32_t>> tables;
};

DecodeCache& GetDecodeCache(const model::LlamaModel& m, int32_t batch, kv::KvDtype dtype) {
  static auto* caches = new std::map<int32_t, DecodeCache>();
  auto it = caches->find(batch);
  if (it != caches->end()) return it->second;
  const int32_t per_seq = kv::BlocksForTokens(kDecodeContext, kBlockSize);
  DecodeCache c;
  c.storage = std::make_unique<kv::CpuKvStorage>(m.kv_shape(kBlockSize), batch * per_seq, dtype);
  kv::BlockPool blocks(batch * per_seq);
  for (int32_t b = 0; b < batch; ++b) c.tables.push_back(*blocks.Allocate(per_seq));
  const std::vector<int32_t> history = RandomTokens(kDecodeContext - 1, m.config().vocab_size, 100);
  model::SequenceBatch prefill;
  prefill.tokens = history;
  prefill.block_table = &c.tables[0];
  prefill.want_logits = false;
  m.Forward({&prefill, 1}, *c.storage, nullptr);
  const kv::KvShape& shape = c.storage->shape();
  const size_t block_bytes =
      static_cast<size_t>(shape.block_size) * shape.kv_dim() * kv::KvDtypeBytes(dtype);
  for (int32_t b = 1; b < batch; ++b) {
    for (int32_t i = 0; i < per_seq; ++i) {
      const int32_t from = c.tables[0][i], to = c.tables[b][i];
      for (int32_t l = 0; l < shape.n_layers; ++l) {
        std::memcpy(c.storage->KData(to, l), c.storage->KData(from, l), block_bytes);
        std::memcpy(c.storage->VData(to, l), c.storage->VData(from, l), block_bytes);
      }
    }
  }
  return caches->emplace(batch, std::move(c)).first->second;
}

// Decode: `batch` sequences, each with kDecodeContext - 1 tokens of history
// (GetDecodeCache), each step feeds one random token per sequence at
// position kDecodeContext - 1 (rewritten every step, so the context stays
// at kDecodeContext) and wants its logits. Args: batch, threads.
void BM_Decode(benchmark::State& state) {
  const int32_t batch = static_cast<int32_t>(state.range(0));
  const model::LlamaModel* m = ModelOrSkip(state, static_cast<int32_t>(state.range(1)));
  if (m == nullptr) return;
  bool dtype_ok = false;
  const kv::KvDtype dtype = KvDtypeOrSkip(state, &dtype_ok);
  if (!dtype_ok) return;
  DecodeCache& cache = GetDecodeCache(*m, batch, dtype);
  std::vector<std::vector<int32_t>> next;
  for (int32_t b = 0; b < batch; ++b) {
    next.push_back(RandomTokens(1, m->config().vocab_size, 1000 + b));
  }
  std::vector<model::SequenceBatch> step(batch);
  for (int32_t b = 0; b < batch; ++b) {
    step[b].tokens = next[b];
    step[b].start_pos = kDecodeContext - 1;
    step[b].block_table = &cache.tables[b];
  }
  std::vector<float> logits;
  for (auto _ : state) {
    m->Forward(step, *cache.storage, &logits);
    benchmark::DoNotOptimize(logits.data());
  }
  state.counters["tokens/s"] =
      benchmark::Counter(batch, benchmark::Counter::kIsIterationInvariantRate);
  SetWeightCounters(state, *m);
}
void DecodeArgs(benchmark::internal::Benchmark* b) {
  b->ArgNames({"batch", "threads"});
  for (int threads : {1, 2}) {
    for (int batch : {1, 8, 32}) b->Args({batch, threads});
  }
}
BENCHMARK(BM_Decode)->Apply(DecodeArgs)->UseRealTime();

// Sampling on the host: BuildSamplingView + SampleFromView of one row of
// the model's own logits (the last token of a random 32-token prompt), as
// the CPU backend and the engine core do for every sampled sequence each
// step. Args: mode 0 greedy, 1 temperature 0.8 + top_k 40, 2 temperature
// 0.8 + top_p 0.95, 3 temperature 1 (top_k off, top_p 1: the whole
// vocabulary is sorted). rows/s = sampled sequences per second.
void BM_Sample(benchmark::State& state) {
  const model::LlamaModel* m = ModelOrSkip(state, 1);
  if (m == nullptr) return;
  const std::vector<int32_t> prompt = RandomTokens(32, m->config().vocab_size, 5);
  kv::CpuKvStorage storage(m->kv_shape(kBlockSize), kv::BlocksForTokens(32, kBlockSize));
  std::vector<int32_t> table;
  for (int32_t b = 0; b < storage.num_blocks(); ++b) table.push_back(b);
  model::SequenceBatch entry;
  entry.tokens = prompt;
  entry.block_table = &table;
  std::vector<float> logits;
  m->Forward({&entry, 1}, storage, &logits);
  sampling::SamplingOptions options;
  switch (state.range(0)) {
    case 0:
      break;
    case 1:
      options.temperature = 0.8f;
      options.top_k = 40;
      break;
    case 2:
      options.temperature = 0.8f;
      options.top_p = 0.95f;
      break;
    default:
      options.temperature = 1.0f;
      break;
  }
  sampling::SamplingView view;
  std::vector<float> scratch;
  uint32_t index = 0;
  for (auto _ : state) {
    sampling::BuildSamplingView(logits, options, sampling::TokenHistory{}, &view, &scratch);
    benchmark::DoNotOptimize(sampling::SampleFromView(view, options, index++).token_id);
  }
  state.counters["rows/s"] = benchmark::Counter(1, benchmark::Counter::kIsIterationInvariantRate);
  state.SetLabel(absl::StrCat("vocab ", m->config().vocab_size));
}
BENCHMARK(BM_Sample)->ArgName("mode")->DenseRange(0, 3)->Unit(benchmark::kMicrosecond);

// Serving loop: collects the time of every request's first and last token.
class TimingSink : public core::RequestOutput {
 public:
  using Clock = std::chrono::steady_clock;
  struct Shared {
    absl::Mutex mu;
    int32_t finished ABSL_GUARDED_BY(mu) = 0;
    int32_t errors ABSL_GUARDED_BY(mu) = 0;
    Clock::time_point last_first_token ABSL_GUARDED_BY(mu);  // latest token 0
    Clock::time_point last_token ABSL_GUARDED_BY(mu);
    int64_t tokens ABSL_GUARDED_BY(mu) = 0;  // tokens with index > 0
    int32_t expected = 0;                    // requests submitted
    bool AllFinished() const ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu) { return finished >= expected; }
  };
  // Every sink of a round holds `shared`, so it outlives the last Finish.
  explicit TimingSink(std::shared_ptr<Shared> shared) : shared_(std::move(shared)) {}
  void OnRemotePrefill(const core::KvTarget&) override {}
  void OnToken(uint32_t, uint32_t index, const sampling::SampledToken&, uint32_t) override {
    const Clock::time_point now = Clock::now();
    absl::MutexLock lock(&shared_->mu);
    if (index == 0) {
      shared_->last_first_token = std::max(shared_->last_first_token, now);
    } else {
      ++shared_->tokens;
    }
    shared_->last_token = std::max(shared_->last_token, now);
  }
  void OnSampleFinish(uint32_t, core::FinishReason) override {}
  void OnFinish(const absl::Status& status) override {
    absl::MutexLock lock(&shared_->mu);
    ++shared_->finished;
    if (!status.ok()) ++shared_->errors;
  }

 private:
  std::shared_ptr<Shared> shared_;
};

// `batch` requests, each a random prompt of kPromptTokens and
// kServeNewTokens greedy tokens (EOS disabled, local prefill), submitted
// together to an engine core. The timed window (manual time) runs from the
// last request's first token to the last token of all, so it covers decode
// steps with the whole batch running (mean context ~kDecodeContext, as
// BM_Decode). tokens/s counts the tokens after each request's first.
// Args: batch, threads.
constexpr int32_t kPromptTokens = 64;
constexpr int32_t kServeNewTokens = 129;

void BM_ServingLoop(benchmark::State& state) {
  const int32_t batch = static_cast<int32_t>(state.range(0));
  const model::LlamaModel* m = ModelOrSkip(state, static_cast<int32_t>(state.range(1)));
  if (m == nullptr) return;
  bool dtype_ok = false;
  const kv::KvDtype dtype = KvDtypeOrSkip(state, &dtype_ok);
  if (!dtype_ok) return;
  core::EngineCoreOptions options;
  options.scheduler.max_num_seqs = std::max(batch, 1);
  options.scheduler.enable_prefix_caching = false;
  options.eog_token_ids = {};  // never stop early
  const int32_t num_blocks =
      batch * kv::BlocksForTokens(kPromptTokens + kServeNewTokens, kBlockSize) + 8;
  auto engine = std::make_unique<core::EngineCore>(
      options, std::make_unique<backend::CpuBackend>(m, kBlockSize, num_blocks, dtype), nullptr);
  uint32_t round = 0;
  int64_t tokens = 0;
  for (auto _ : state) {
    auto shared = std::make_shared<TimingSink::Shared>();
    shared->expected = batch;
    for (int32_t b = 0; b < batch; ++b) {
      core::EngineRequest request;
      request.request_id = absl::StrCat("r", round, "-", b);
      request.prompt = RandomTokens(kPromptTokens, m->config().vocab_size, round * 1000 + b);
      request.max_tokens = kServeNewTokens;
      request.route = core::RouteChoice::kLocal;
      request.output = std::make_shared<TimingSink>(shared);
      const absl::Status st = engine->Submit(std::move(request));
      if (!st.ok()) {
        state.SkipWithError(st.ToString().c_str());
        return;
      }
    }
    ++round;
    absl::MutexLock lock(&shared->mu);
    shared->mu.Await(absl::Condition(shared.get(), &TimingSink::Shared::AllFinished));
    if (shared->errors > 0) {
      state.SkipWithError("a request finished with an error");
      return;
    }
    tokens += shared->tokens;
    state.SetIterationTime(
        std::chrono::duration<double>(shared->last_token - shared->last_first_token).count());
  }
  state.counters["tokens/s"] =
      benchmark::Counter(static_cast<double>(tokens), benchmark::Counter::kIsRate);
}
void ServingArgs(benchmark::internal::Benchmark* b) {
  b->ArgNames({"batch", "threads"});
  for (int threads : {1, 2}) {
    for (int batch : {1, 8, 32}) b->Args({batch, threads});
  }
}
BENCHMARK(BM_ServingLoop)->Apply(ServingArgs)->UseManualTime()->Unit(benchmark::kMillisecond);

// The environment's settings, checked before any benchmark runs: a bad
// value (or a model file that is not there) is one line naming it and exit
// 2, rather than every benchmark skipped with exit 0.
[[nodiscard]] absl::Status CheckEnvironment() {
  if (absl::Status s = BenchQ8MatMul().status(); !s.ok()) return s;
  if (absl::Status s = BenchKvDtype().status(); !s.ok()) return s;
  if (FILE* f = std::fopen(ModelPath().c_str(), "rb")) {
    std::fclose(f);
    return absl::OkStatus();
  }
  return absl::NotFoundError(
      absl::StrCat("TANDEM_MODEL: cannot read '", ModelPath(), "': ", std::strerror(errno)));
}

}  // namespace
}  // namespace tandem::bench

int main(int argc, char** argv) {
  benchmark::Initialize(&argc, argv);
  if (benchmark::ReportUnrecognizedArguments(argc, argv)) return 1;
  if (absl::Status s = tandem::bench::CheckEnvironment(); !s.ok()) {
    std::fprintf(stderr, "tandem_bench_engine: %s\n", std::string(s.message()).c_str());
    return 2;
  }
  benchmark::RunSpecifiedBenchmarks();
  benchmark::Shutdown();
  return 0;
}
