// Kernel and memory micro-benchmarks: the machine's FMA peak, the model's
// MatMul (engine/model/cpu_kernels.h) GFLOP/s, the F32 GEMM against
// OpenBLAS SGEMM, Q8_0 exact against int8
// (engine.q8_matmul), memcpy GB/s and the KV copy
// functions (engine/kv/cpu_kv_storage.h) GB/s, and paged attention GB/s. Every benchmark uses real
// (wall-clock) time, because the pooled ones run on more than one thread.
#include <bit>
#include <cstdint>
#include <cstring>
#include <memory>
#include <thread>
#include <vector>

#include "benchmark/benchmark.h"
#include "bench/bench_util.h"
#include "engine/gguf/gguf_file.h"
#include "engine/kv/block_pool.h"
#include "engine/kv/cpu_kv_storage.h"
#include "engine/model/attention.h"
#include "engine/model/cpu_kernels.h"
#include "engine/model/f32_panels.h"
#include "engine/model/q8_int8.h"
#include "engine/model/quant_blocks.h"
#include "engine/model/thread_pool.h"
#include "tools/quantize.h"

#if defined(__x86_64__)
#include <immintrin.h>
#endif

#ifdef TANDEM_BENCH_OPENBLAS
#include <cblas.h>
extern "C" void openblas_set_num_threads(int num_threads);
#endif

namespace tandem::bench {
namespace {

// ---------------------------------------------------------------------------
// Peak FMA throughput. kAcc independent accumulator registers, each updated
// by one explicit fused multiply-add per step (explicit intrinsics, so
// -ffp-contract=off does not apply), enough independent chains to cover the
// FMA latency (4 cycles) on two FMA ports. FLOPs per step: kAcc * lanes * 2.
// This is the machine's float32 compute ceiling for the roofline, not
// something a real GEMM reaches.
constexpr int kAcc = 12;
constexpr int64_t kFmaSteps = 1 << 20;

#if defined(__x86_64__)
__attribute__((target("avx512f"))) float FmaLoopAvx512(int64_t steps) {
  __m512 acc[kAcc];
  for (int i = 0; i < kAcc; ++i) acc[i] = _mm512_set1_ps(0.001f * static_cast<float>(i));
  const __m512 a = _mm512_set1_ps(0.999999f);
  const __m512 b = _mm512_set1_ps(1e-7f);
  for (int64_t s = 0; s < steps; ++s) {
    for (int i = 0; i < kAcc; ++i) acc[i] = _mm512_fmadd_ps(acc[i], a, b);
  }
  __m512 sum = acc[0];
  for (int i = 1; i < kAcc; ++i) sum = _mm512_add_ps(sum, acc[i]);
  float out[16];
  _mm512_storeu_ps(out, sum);
  float total = 0.0f;
  for (float v : out) total += v;
  return total;
}

__attribute__((target("avx2,fma"))) float FmaLoopAvx2(int64_t steps) {
  __m256 acc[kAcc];
  for (int i = 0; i < kAcc; ++i) acc[i] = _mm256_set1_ps(0.001f * static_cast<float>(i));
  const __m256 a = _mm256_set1_ps(0.999999f);
  const __m256 b = _mm256_set1_ps(1e-7f);
  for (int64_t s = 0; s < steps; ++s) {
    for (int i = 0; i < kAcc; ++i) acc[i] = _mm256_fmadd_ps(acc[i], a, b);
  }
  __m256 sum = acc[0];
  for (int i = 1; i < kAcc; ++i) sum = _mm256_add_ps(sum, acc[i]);
  float out[8];
  _mm256_storeu_ps(out, sum);
  return out[0] + out[1] + out[2] + out[3] + out[4] + out[5] + out[6] + out[7];
}
#endif

// Runs the widest FMA loop the CPU supports on one thread; returns the
// float lanes per vector (0 when there is no FMA unit to measure).
int FmaLoop(int64_t steps, float* sink) {
#if defined(__x86_64__)
  if (__builtin_cpu_supports("avx512f")) {
    *sink = FmaLoopAvx512(steps);
    return 16;
  }
  if (__builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma")) {
    *sink = FmaLoopAvx2(steps);
    return 8;
  }
#endif
  return 0;
}

// Arg 0: threads (each runs the loop; one is the benchmark's own thread).
void BM_FmaPeak(benchmark::State& state) {
  const int threads = static_cast<int>(state.range(0));
  float sinks[64] = {};
  int lanes = 0;
  for (auto _ : state) {
    std::vector<std::thread> workers;
    for (int t = 1; t < threads; ++t) {
      workers.emplace_back([&sinks, t] { FmaLoop(kFmaSteps, &sinks[t]); });
    }
    lanes = FmaLoop(kFmaSteps, &sinks[0]);
    for (auto& w : workers) w.join();
    benchmark::DoNotOptimize(sinks);
  }
  if (lanes == 0) {
    state.SkipWithError("no AVX2/AVX-512 FMA on this CPU");
    return;
  }
  const double flops = 2.0 * kAcc * lanes * static_cast<double>(kFmaSteps) * threads;
  state.counters["GFLOP/s"] =
      benchmark::Counter(flops * 1e-9, benchmark::Counter::kIsIterationInvariantRate);
  state.SetLabel(lanes == 16 ? "avx512" : "avx2");
}
BENCHMARK(BM_FmaPeak)->ArgName("threads")->Arg(1)->Arg(2)->UseRealTime();

// ---------------------------------------------------------------------------
// MatMul (the model's kernel): y[M][N] = x[M][K] * W[N][K]^T.
// W of n rows x k as GGUF `type` bytes (k whole blocks): F32 and F16
// values from RandomFloats, Q8_0 blocks of random int8 with scale 2^-7,
// the other quantized types as tandem synth-model writes them (ggml's
// reference quantizers, tools/quantize.h) from RandomFloats.
std::vector<uint8_t> RandomWeights(gguf::TensorType type, size_t n, size_t k) {
  const std::vector<float> w = RandomFloats(n * k, 2);
  const model::internal::WeightMatrix shape{type, nullptr, k, n};
  std::vector<uint8_t> bytes(shape.RowBytes() * n);
  if (model::internal::IsQuantized(type) && type != gguf::TensorType::kQ8_0) {
    for (size_t o = 0; o < n; ++o) {
      cli::ConvertFromF32(type, &w[o * k], k, &bytes[o * shape.RowBytes()]);
    }
    return bytes;
  }
  for (size_t i = 0; i < n * k; ++i) {
    switch (type) {
      case gguf::TensorType::kF32:
        std::memcpy(&bytes[4 * i], &w[i], 4);
        break;
      case gguf::TensorType::kF16: {
        // Truncated to binary16 (|w| < 1; tiny values flush to zero).
        const uint32_t b = std::bit_cast<uint32_t>(w[i]);
        const int e = static_cast<int>((b >> 23) & 0xff) - 127;
        const uint16_t h = e < -14 ? static_cast<uint16_t>((b >> 16) & 0x8000)
                                   : static_cast<uint16_t>(((b >> 16) & 0x8000) | (e + 15) << 10 |
                                                           ((b >> 13) & 0x3ff));
        std::memcpy(&bytes[2 * i], &h, 2);
        break;
      }
      case gguf::TensorType::kQ8_0: {
        const size_t block = i / 32, j = i % 32;
        const uint16_t d = 0x2000;  // 2^-7
        if (j == 0) std::memcpy(&bytes[34 * block], &d, 2);
        bytes[34 * block + 2 + j] = static_cast<uint8_t>(static_cast<int8_t>(w[i] * 127.0f));
        break;
      }
      default:
        break;
    }
  }
  return bytes;
}

// Args: M, K, N, threads, wtype (GGUF type id: 0 F32, 1 F16, 8 Q8_0,
// 2 Q4_0, 12 Q4_K, 13 Q5_K, 14 Q6_K).
// Counters: GFLOP/s (2MKN per call) and GB/s of the minimal traffic (x, W
// as stored and y once each).
void BM_MatMul(benchmark::State& state) {
  const size_t m = static_cast<size_t>(state.range(0));
  const size_t k = static_cast<size_t>(state.range(1));
  const size_t n = static_cast<size_t>(state.range(2));
  const int32_t threads = static_cast<int32_t>(state.range(3));
  const auto type = static_cast<gguf::TensorType>(state.range(4));
  const std::vector<float> x = RandomFloats(m * k, 1);
  const std::vector<uint8_t> w = RandomWeights(type, n, k);
  model::internal::WeightMatrix matrix{type, w.data(), k, n};
  // An F32 matrix runs as the model runs it: on its panel packing.
  std::unique_ptr<model::internal::F32PanelMatrix> panels;
  if (type == gguf::TensorType::kF32) {
    panels = model::internal::F32PanelMatrix::Pack(matrix);
    matrix.f32_panels = panels.get();
  }
  std::vector<float> y(m * n);
  model::ThreadPool pool(threads);
  for (auto _ : state) {
    model::internal::MatMul(x.data(), matrix, m, y.data(), &pool);
    benchmark::DoNotOptimize(y.data());
    benchmark::ClobberMemory();
  }
  const double flops = 2.0 * static_cast<double>(m * k * n);
  const double bytes = 4.0 * static_cast<double>(m * k + m * n) + static_cast<double>(w.size());
  state.counters["GFLOP/s"] =
      benchmark::Counter(flops * 1e-9, benchmark::Counter::kIsIterationInvariantRate);
  state.counters["GB/s"] =
      benchmark::Counter(bytes * 1e-9, benchmark::Counter::kIsIterationInvariantRate);
  state.counters["flop_per_byte"] = flops / bytes;
}
void MatMulArgs(benchmark::internal::Benchmark* b) {
  b->ArgNames({"M", "K", "N", "threads", "wtype"});
  for (int threads : {1, 2}) {
    for (int m : {1, 32, 512}) {
      b->Args({m, 768, 768, threads, 0});
      b->Args({m, 768, 2048, threads, 0});
    }
    for (int type : {1, 8, 2, 12, 13, 14}) {
      for (int m : {1, 512}) b->Args({m, 768, 2048, threads, type});
    }
    // 768 x 256 stays in L2 in every type: the cost of widening a weight
    // inside the tile, without the memory.
    for (int type : {0, 1, 8, 2, 12, 13, 14}) b->Args({1, 768, 256, threads, type});
    // A 110M-class output matrix (32000 x 768): batch-1 decode streams it
    // from memory, in each storage type.
    for (int type : {0, 1, 8, 12, 14}) b->Args({1, 768, 32000, threads, type});
  }
}
BENCHMARK(BM_MatMul)->Apply(MatMulArgs)->UseRealTime();

// The F32 GEMM y[M][N] = x[M][K] * W[N][K]^T three ways in one run:
// impl 0 = the dot-product kernels (cpu_kernels.h, an F32 WeightMatrix
// without panels: F16/Q8_0 prefill still runs them), 1 = the panel GEMM
// the model runs for F32 matrices (f32_panels.h), 2 = OpenBLAS
// cblas_sgemm (Debian libopenblas-dev; a reference for speed only, never
// in the forward: its blocking depends on M, so its bits do too), on the
// same threads. Skipped (2) when the build found no OpenBLAS.
void BM_F32Gemm(benchmark::State& state) {
  const size_t m = static_cast<size_t>(state.range(0));
  const size_t k = static_cast<size_t>(state.range(1));
  const size_t n = static_cast<size_t>(state.range(2));
  const int32_t threads = static_cast<int32_t>(state.range(3));
  const int64_t impl = state.range(4);
  const std::vector<float> x = RandomFloats(m * k, 1);
  const std::vector<float> w = RandomFloats(n * k, 2);
  std::vector<float> y(m * n);
  model::internal::WeightMatrix matrix = model::internal::WeightMatrix::F32(w.data(), k, n);
  std::unique_ptr<model::internal::F32PanelMatrix> panels;
  if (impl == 1) {
    panels = model::internal::F32PanelMatrix::Pack(matrix);
    matrix.f32_panels = panels.get();
  }
#ifdef TANDEM_BENCH_OPENBLAS
  if (impl == 2) openblas_set_num_threads(threads);
#else
  if (impl == 2) {
    state.SkipWithError("built without OpenBLAS (libopenblas-dev)");
    return;
  }
#endif
  model::ThreadPool pool(threads);
  for (auto _ : state) {
    if (impl == 2) {
#ifdef TANDEM_BENCH_OPENBLAS
      cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, static_cast<int>(m), static_cast<int>(n),
                  static_cast<int>(k), 1.0f, x.data(), static_cast<int>(k), w.data(),
                  static_cast<int>(k), 0.0f, y.data(), static_cast<int>(n));
#endif
    } else {
      model::internal::MatMul(x.data(), matrix, m, y.data(), &pool);
    }
    benchmark::DoNotOptimize(y.data());
    benchmark::ClobberMemory();
  }
  state.counters["GFLOP/s"] = benchmark::Counter(2.0 * static_cast<double>(m * k * n) * 1e-9,
                                                 benchmark::Counter::kIsIterationInvariantRate);
  state.SetLabel(impl == 0 ? "tandem-dot" : impl == 1 ? "tandem-panels" : "openblas");
}
void F32GemmArgs(benchmark::internal::Benchmark* b) {
  b->ArgNames({"M", "K", "N", "threads", "impl"});
  for (int threads : {1, 2}) {
    // The 110M model's shapes (K x N: QKV/O 768 x 768, FFN up 768 x 2048,
    // FFN down 2048 x 768) at prefill (512 rows) and batched decode sizes.
    for (int m : {8, 32, 64, 512}) {
      for (auto [k, n] : {std::pair{768, 768}, std::pair{768, 2048}, std::pair{2048, 768}}) {
        for (int impl : {0, 1, 2}) b->Args({m, k, n, threads, impl});
      }
    }
  }
}
BENCHMARK(BM_F32Gemm)->Apply(F32GemmArgs)->UseRealTime();

// engine.q8_matmul on a Q8_0 matrix (RandomWeights): exact (dequantized
// F32 GEMM) against int8 (activations quantized per row, integer dot
// products; q8_int8.h, on the best int8 ISA here). Args: M, K, N, int8
// (0 exact, 1 int8), threads. GFLOP/s counts 2MKN per call.
void BM_Q8MatMul(benchmark::State& state) {
  const size_t m = static_cast<size_t>(state.range(0));
  const size_t k = static_cast<size_t>(state.range(1));
  const size_t n = static_cast<size_t>(state.range(2));
  const bool int8 = state.range(3) != 0;
  const int32_t threads = static_cast<int32_t>(state.range(4));
  const std::vector<float> x = RandomFloats(m * k, 1);
  const std::vector<uint8_t> w = RandomWeights(gguf::TensorType::kQ8_0, n, k);
  model::internal::WeightMatrix matrix{gguf::TensorType::kQ8_0, w.data(), k, n};
  const std::unique_ptr<model::internal::Q8Int8Matrix> packed =
      model::internal::Q8Int8Matrix::Pack(matrix);
  if (int8) matrix.int8 = packed.get();
  std::vector<float> y(m * n);
  model::ThreadPool pool(threads);
  for (auto _ : state) {
    model::internal::MatMul(x.data(), matrix, m, y.data(), &pool);
    benchmark::DoNotOptimize(y.data());
    benchmark::ClobberMemory();
  }
  state.counters["GFLOP/s"] = benchmark::Counter(2e-9 * static_cast<double>(m * k * n),
                                                 benchmark::Counter::kIsIterationInvariantRate);
  state.SetLabel(int8 ? model::internal::Int8IsaName(model::internal::BestInt8Isa())
                      : model::internal::KernelIsa());
}
void Q8MatMulArgs(benchmark::internal::Benchmark* b) {
  b->ArgNames({"M", "K", "N", "int8", "threads"});
  for (int n : {768, 2048}) {
    for (int m : {1, 8, 32, 512}) {
      for (int int8 : {0, 1}) b->Args({m, 768, n, int8, 1});
    }
  }
}
BENCHMARK(BM_Q8MatMul)->Apply(Q8MatMulArgs)->UseRealTime();

// ---------------------------------------------------------------------------
// memcpy of range(0) MiB between two buffers. GB/s counts the bytes copied
// (the memory traffic is twice that: one read, one write).
void BM_Memcpy(benchmark::State& state) {
  const size_t bytes = static_cast<size_t>(state.range(0)) << 20;
  std::vector<char> src(bytes, 1);
  std::vector<char> dst(bytes, 0);
  for (auto _ : state) {
    std::memcpy(dst.data(), src.data(), bytes);
    benchmark::DoNotOptimize(dst.data());
    benchmark::ClobberMemory();
  }
  state.counters["GB/s"] = benchmark::Counter(static_cast<double>(bytes) * 1e-9,
                                              benchmark::Counter::kIsIterationInvariantRate);
}
BENCHMARK(BM_Memcpy)->ArgName("MiB")->Arg(1)->Arg(16)->Arg(256)->UseRealTime();

// ---------------------------------------------------------------------------
// KV copy: ReadKvRows / WriteKvRows of `count` tokens for every layer of a
// cache of kv_dim floats a row (32 = stories260K, 768 = a 110M-class model),
// block size 16, into/out of contiguous buffers, as the KV sender/receiver
// do. GB/s counts the K and V bytes copied.
constexpr int32_t kKvLayers = 12;
constexpr int32_t kKvBlockSize = 16;

template <bool kWrite>
void BM_KvCopy(benchmark::State& state) {
  const int32_t kv_dim = static_cast<int32_t>(state.range(0));
  const int32_t count = static_cast<int32_t>(state.range(1));
  kv::KvShape shape;
  shape.n_layers = kKvLayers;
  shape.n_kv_heads = kv_dim / 32;
  shape.head_dim = 32;
  shape.block_size = kKvBlockSize;
  const int32_t num_blocks = kv::BlocksForTokens(count, kKvBlockSize);
  kv::CpuKvStorage kv(shape, num_blocks);
  kv::BlockPool blocks(num_blocks);
  const std::vector<int32_t> table = *blocks.Allocate(num_blocks);
  std::vector<float> k = RandomFloats(static_cast<size_t>(count) * kv_dim, 3);
  std::vector<float> v = RandomFloats(static_cast<size_t>(count) * kv_dim, 4);
  for (auto _ : state) {
    for (int32_t layer = 0; layer < kKvLayers; ++layer) {
      if constexpr (kWrite) {
        kv::WriteKvRows(kv, table, layer, 0, count, k.data(), v.data());
      } else {
        kv::ReadKvRows(kv, table, layer, 0, count, k.data(), v.data());
      }
    }
    benchmark::DoNotOptimize(k.data());
    benchmark::ClobberMemory();
  }
  const double bytes = 2.0 * 4.0 * kKvLayers * static_cast<double>(count) * kv_dim;
  state.counters["GB/s"] =
      benchmark::Counter(bytes * 1e-9, benchmark::Counter::kIsIterationInvariantRate);
}
void KvArgs(benchmark::internal::Benchmark* b) {
  b->ArgNames({"kv_dim", "tokens"});
  for (int kv_dim : {32, 768}) {
    for (int count : {128, 2048}) b->Args({kv_dim, count});
  }
}
BENCHMARK_TEMPLATE(BM_KvCopy, false)->Name("BM_ReadKvRows")->Apply(KvArgs)->UseRealTime();
BENCHMARK_TEMPLATE(BM_KvCopy, true)->Name("BM_WriteKvRows")->Apply(KvArgs)->UseRealTime();

// ---------------------------------------------------------------------------
// Paged attention (engine/model/attention.h): one decode step's attention,
// every query head of one token at position ctx - 1 over ctx cached tokens,
// 110M-class shape (12 heads of 64, no GQA), block size 16, one thread.
// GB/s counts the K and V bytes read (2 x 4 x ctx x 768 per step), the
// traffic that bounds decode attention; FLOPs are 4 x ctx x 768.
void BM_Attention(benchmark::State& state) {
  const int32_t ctx = static_cast<int32_t>(state.range(0));
  kv::KvShape shape;
  shape.n_layers = 1;
  shape.n_kv_heads = 12;
  shape.head_dim = 64;
  shape.block_size = kKvBlockSize;
  const int32_t num_blocks = kv::BlocksForTokens(ctx, kKvBlockSize);
  kv::CpuKvStorage kv(shape, num_blocks);
  kv::BlockPool blocks(num_blocks);
  const std::vector<int32_t> table = *blocks.Allocate(num_blocks);
  const std::vector<float> kv_rows = RandomFloats(static_cast<size_t>(ctx) * 768, 5);
  kv::WriteKvRows(kv, table, 0, 0, ctx, kv_rows.data(), kv_rows.data());
  const std::vector<float> q = RandomFloats(768, 6);
  std::vector<float> out(768), scores(static_cast<size_t>(ctx));
  const float scale = 0.125f;
  for (auto _ : state) {
    for (int32_t h = 0; h < 12; ++h) {
      model::internal::AttentionSpan span{&kv, table, 0, h, ctx - 1};
      model::internal::AttendHead(span, q.data() + 64 * h, scale, out.data() + 64 * h,
                                  scores.data());
    }
    benchmark::DoNotOptimize(out.data());
  }
  const double bytes = 2.0 * 4.0 * ctx * 768;
  state.counters["GB/s"] =
      benchmark::Counter(bytes * 1e-9, benchmark::Counter::kIsIterationInvariantRate);
  state.counters["GFLOP/s"] =
      benchmark::Counter(4.0 * ctx * 768 * 1e-9, benchmark::Counter::kIsIterationInvariantRate);
}
BENCHMARK(BM_Attention)->ArgName("ctx")->Arg(128)->Arg(512)->Arg(2048)->UseRealTime();

}  // namespace
}  // namespace tandem::bench

BENCHMARK_MAIN();
