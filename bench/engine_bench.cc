// Engine micro-benchmarks on stories260K (or $TANDEM_MODEL): prefill and
// decode tokens/s of the raw LlamaModel::Forward over a paged KV cache, and
// the decode worker's serving loop (DecodeEngine, no gRPC, no-op sink) at
// the same batch sizes, so that the difference is the loop's own overhead
// (admission, scheduling, sampling, block-table bookkeeping, sink calls).
// All use real (wall-clock) time: Forward may run on a thread pool.
#include <algorithm>
#include <chrono>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/synchronization/mutex.h"
#include "benchmark/benchmark.h"
#include "bench/bench_util.h"
#include "decode_worker/decode_engine.h"
#include "engine/kv/block_pool.h"
#include "engine/model/llama_model.h"

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

// Prefill: one Forward over a 512-token prompt of random ids (clamped to
// the context length) at positions [0, 512), logits of the last token only.
// Arg: threads.
void BM_Prefill(benchmark::State& state) {
  const model::LlamaModel* m = ModelOrSkip(state, static_cast<int32_t>(state.range(0)));
  if (m == nullptr) return;
  const int32_t n = std::min(kPrefillTokens, m->config().context_length);
  kv::BlockPool pool(m->kv_shape(kBlockSize), kv::BlocksForTokens(n, kBlockSize));
  const std::vector<int32_t> table = *pool.Allocate(pool.num_blocks());
  const std::vector<int32_t> tokens = RandomTokens(n, m->config().vocab_size, 7);
  model::SequenceBatch seq;
  seq.tokens = tokens;
  seq.block_table = &table;
  std::vector<float> logits;
  for (auto _ : state) {
    m->Forward({&seq, 1}, pool, &logits);
    benchmark::DoNotOptimize(logits.data());
  }
  state.counters["tokens/s"] =
      benchmark::Counter(n, benchmark::Counter::kIsIterationInvariantRate);
}
BENCHMARK(BM_Prefill)->ArgName("threads")->Arg(1)->Arg(2)->UseRealTime()->Unit(
    benchmark::kMillisecond);

// Decode: `batch` sequences, each with kDecodeContext - 1 tokens already in
// its own blocks, each step feeds one token per sequence at position
// kDecodeContext - 1 (rewritten every step, so the context stays at
// kDecodeContext) and wants its logits. Args: batch, threads.
void BM_Decode(benchmark::State& state) {
  const int32_t batch = static_cast<int32_t>(state.range(0));
  const model::LlamaModel* m = ModelOrSkip(state, static_cast<int32_t>(state.range(1)));
  if (m == nullptr) return;
  const int32_t per_seq = kv::BlocksForTokens(kDecodeContext, kBlockSize);
  kv::BlockPool pool(m->kv_shape(kBlockSize), batch * per_seq);
  std::vector<std::vector<int32_t>> tables;
  std::vector<std::vector<int32_t>> history;
  std::vector<std::vector<int32_t>> next;
  for (int32_t b = 0; b < batch; ++b) {
    tables.push_back(*pool.Allocate(per_seq));
    history.push_back(RandomTokens(kDecodeContext - 1, m->config().vocab_size, 100 + b));
    next.push_back(RandomTokens(1, m->config().vocab_size, 1000 + b));
  }
  std::vector<model::SequenceBatch> prefill(batch), step(batch);
  for (int32_t b = 0; b < batch; ++b) {
    prefill[b].tokens = history[b];
    prefill[b].block_table = &tables[b];
    prefill[b].want_logits = false;
    step[b].tokens = next[b];
    step[b].start_pos = kDecodeContext - 1;
    step[b].block_table = &tables[b];
  }
  std::vector<float> logits;
  m->Forward(prefill, pool, nullptr);
  for (auto _ : state) {
    m->Forward(step, pool, &logits);
    benchmark::DoNotOptimize(logits.data());
  }
  state.counters["tokens/s"] =
      benchmark::Counter(batch, benchmark::Counter::kIsIterationInvariantRate);
}
void DecodeArgs(benchmark::internal::Benchmark* b) {
  b->ArgNames({"batch", "threads"});
  for (int threads : {1, 2}) {
    for (int batch : {1, 8, 32}) b->Args({batch, threads});
  }
}
BENCHMARK(BM_Decode)->Apply(DecodeArgs)->UseRealTime();

// Serving loop: collects the time of every request's first and last token.
class TimingSink : public decode::DecodeSink {
 public:
  using Clock = std::chrono::steady_clock;
  struct Shared {
    absl::Mutex mu;
    int32_t finished ABSL_GUARDED_BY(mu) = 0;
    int32_t errors ABSL_GUARDED_BY(mu) = 0;
    Clock::time_point last_first_token ABSL_GUARDED_BY(mu);  // latest token 0
    Clock::time_point last_token ABSL_GUARDED_BY(mu);
    int64_t tokens ABSL_GUARDED_BY(mu) = 0;  // tokens with index > 0
    int32_t expected = 0;                      // requests submitted
    bool AllFinished() const ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu) {
      return finished >= expected;
    }
  };
  // Every sink of a round holds `shared`, so it outlives the last Finish.
  explicit TimingSink(std::shared_ptr<Shared> shared) : shared_(std::move(shared)) {}
  void NeedRemotePrefill(const std::string&, uint32_t, uint32_t) override {}
  void Token(uint32_t index, int32_t, float, uint32_t) override {
    const Clock::time_point now = Clock::now();
    absl::MutexLock lock(&shared_->mu);
    if (index == 0) {
      shared_->last_first_token = std::max(shared_->last_first_token, now);
    } else {
      ++shared_->tokens;
    }
    shared_->last_token = std::max(shared_->last_token, now);
  }
  void Finish(const absl::Status& status, FinishReason) override {
    absl::MutexLock lock(&shared_->mu);
    ++shared_->finished;
    if (!status.ok()) ++shared_->errors;
  }

 private:
  std::shared_ptr<Shared> shared_;
};

// `batch` requests, each a random prompt of kPromptTokens and
// kServeNewTokens greedy tokens (EOS disabled, local prefill), submitted
// together to a DecodeEngine. The timed window (manual time) runs from the
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
  decode::DecodeEngineOptions options;
  options.block_size = kBlockSize;
  options.num_kv_blocks =
      batch * kv::BlocksForTokens(kPromptTokens + kServeNewTokens, kBlockSize) + 8;
  options.max_num_seqs = std::max(batch, 1);
  options.enable_prefix_caching = false;
  options.max_local_prefill_tokens = kPromptTokens;
  options.eos_token_id = -1;  // never stop early
  auto engine = decode::DecodeEngine::Create(options, m);
  if (!engine.ok()) {
    state.SkipWithError(engine.status().ToString().c_str());
    return;
  }
  uint32_t round = 0;
  int64_t tokens = 0;
  for (auto _ : state) {
    auto shared = std::make_shared<TimingSink::Shared>();
    shared->expected = batch;
    for (int32_t b = 0; b < batch; ++b) {
      decode::DecodeRequest request;
      request.request_id = absl::StrCat("r", round, "-", b);
      request.prompt = RandomTokens(kPromptTokens, m->config().vocab_size, round * 1000 + b);
      request.max_tokens = kServeNewTokens;
      request.route = RouteChoice::kLocal;
      const absl::Status st =
          (*engine)->Submit(std::move(request), std::make_shared<TimingSink>(shared));
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

}  // namespace
}  // namespace tandem::bench

BENCHMARK_MAIN();
