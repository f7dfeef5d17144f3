// Tests of the CUDA backend's device resources: the KV copy runs (pure
// host logic, everywhere), and on a GPU the KV storage, the GEMM runner and
// the weight upload. Without a GPU the device tests skip with "no CUDA GPU".
#include <cuda_runtime.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "absl/status/status.h"
#include "engine/backend/cuda/cuda_kv_storage.h"
#include "engine/backend/cuda/device_weights.h"
#include "engine/backend/cuda/gemm.h"
#include "engine/backend/cuda/kv_copy_runs.h"
#include "engine/gguf/gguf_file.h"
#include "engine/gguf/half.h"
#include "engine/model/llama_model.h"
#include "engine/model/llama_weights.h"
#include "engine/model/weight_matrix.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "tests/test_util.h"

namespace tandem::backend::cuda {
namespace {

using ::testing::AnyOf;
using ::testing::ElementsAre;
using ::testing::HasSubstr;

// ---------------------------------------------------------------------------
// Pure host logic.

TEST(KvCopyRunsTest, SplitsAtBlocksAndMergesAdjacentBlockIds) {
  // block_size 4, blocks per layer 11, layer 1: tokens [2, 13).
  // Tokens 2-3 in block 5 (slots 2-3), 4-7 in block 2, 8-11 in block 3
  // (follows block 2 in the pool: one run), 12 in block 9.
  const std::vector<int32_t> table = {5, 2, 3, 9};
  std::string error;
  const std::vector<KvCopyRun> runs =
      SplitKvCopyRuns(table, /*layer=*/1, /*layer_blocks=*/11, /*max_block=*/10,
                      /*block_size=*/4, /*token_start=*/2, /*count=*/11, &error);
  EXPECT_EQ(error, "");
  EXPECT_THAT(runs, ElementsAre(KvCopyRun{(11 + 5) * 4 + 2, 0, 2},
                                KvCopyRun{(11 + 2) * 4, 2, 8},
                                KvCopyRun{(11 + 9) * 4, 10, 1}));
}

TEST(KvCopyRunsTest, RangeInsideOneBlockAndEmptyRange) {
  const std::vector<int32_t> table = {7, 0};
  std::string error;
  EXPECT_THAT(SplitKvCopyRuns(table, 0, 8, 8, 16, 17, 3, &error),
              ElementsAre(KvCopyRun{0 * 16 + 1, 0, 3}));
  EXPECT_EQ(error, "");
  EXPECT_TRUE(SplitKvCopyRuns(table, 0, 8, 8, 16, 5, 0, &error).empty());
  EXPECT_EQ(error, "");
}

TEST(KvCopyRunsTest, DescendingBlockIdsAreNotMerged) {
  const std::vector<int32_t> table = {3, 2};
  std::string error;
  EXPECT_THAT(SplitKvCopyRuns(table, 0, 4, 4, 2, 0, 4, &error),
              ElementsAre(KvCopyRun{6, 0, 2}, KvCopyRun{4, 2, 2}));
}

TEST(KvCopyRunsTest, CallerBugsAreNamed) {
  const std::vector<int32_t> table = {1, 6};
  std::string error;
  EXPECT_TRUE(SplitKvCopyRuns(table, 0, 8, 6, 4, 6, 3, &error).empty());
  EXPECT_THAT(error, HasSubstr("does not cover tokens [6, 9)"));
  EXPECT_TRUE(SplitKvCopyRuns(table, 0, 8, 6, 4, 3, 2, &error).empty());
  EXPECT_THAT(error, HasSubstr("block id 6 of token 4 is outside [0, 6)"));
  EXPECT_TRUE(SplitKvCopyRuns(table, 0, 8, 6, 4, -1, 2, &error).empty());
  EXPECT_THAT(error, HasSubstr("bad KV token range"));
}

TEST(CudaKvStorageTest, BlockBytes) {
  kv::KvShape shape;
  shape.n_layers = 3;
  shape.n_kv_heads = 2;
  shape.head_dim = 8;
  shape.block_size = 16;
  EXPECT_EQ(CudaKvStorage::BlockBytes(shape, kv::KvDtype::kBF16), 2u * 3 * 16 * 16 * 2);
  EXPECT_EQ(CudaKvStorage::BlockBytes(shape, kv::KvDtype::kF32), 2u * 3 * 16 * 16 * 4);
}

// ---------------------------------------------------------------------------
// Device tests.

bool HaveGpu(std::string* why) {
  int count = 0;
  const cudaError_t error = cudaGetDeviceCount(&count);
  if (error != cudaSuccess) {
    (void)cudaGetLastError();
    *why = std::string(cudaGetErrorName(error)) + " (" + cudaGetErrorString(error) + ")";
    return false;
  }
  if (count == 0) {
    *why = "cudaGetDeviceCount is 0";
    return false;
  }
  return true;
}

#define SKIP_WITHOUT_GPU()                        \
  do {                                            \
    std::string why;                              \
    if (!HaveGpu(&why)) {                         \
      GTEST_SKIP() << "no CUDA GPU: " << why;     \
    }                                             \
  } while (0)

// Host round to nearest even F32 -> BF16 bits (finite inputs).
uint16_t ToBf16(float f) {
  uint32_t bits;
  std::memcpy(&bits, &f, 4);
  bits += 0x7fffu + ((bits >> 16) & 1u);
  return static_cast<uint16_t>(bits >> 16);
}

float FromBf16(uint16_t h) {
  const uint32_t bits = uint32_t{h} << 16;
  float f;
  std::memcpy(&f, &bits, 4);
  return f;
}

// `values` encoded as `dtype` bytes (rounded to nearest even).
std::vector<char> Encode(const std::vector<float>& values, kv::KvDtype dtype) {
  std::vector<char> out(values.size() * kv::KvDtypeBytes(dtype));
  for (size_t i = 0; i < values.size(); ++i) {
    if (dtype == kv::KvDtype::kF32) {
      std::memcpy(out.data() + 4 * i, &values[i], 4);
    } else {
      const uint16_t h =
          dtype == kv::KvDtype::kF16 ? gguf::FloatToHalf(values[i]) : ToBf16(values[i]);
      std::memcpy(out.data() + 2 * i, &h, 2);
    }
  }
  return out;
}

float Decode(const char* bytes, size_t i, kv::KvDtype dtype) {
  if (dtype == kv::KvDtype::kF32) {
    float f;
    std::memcpy(&f, bytes + 4 * i, 4);
    return f;
  }
  uint16_t h;
  std::memcpy(&h, bytes + 2 * i, 2);
  return dtype == kv::KvDtype::kF16 ? gguf::HalfToFloat(h) : FromBf16(h);
}

std::vector<float> TokenValues(int32_t token_start, int32_t count, int32_t kv_dim, float scale) {
  std::vector<float> v(static_cast<size_t>(count) * kv_dim);
  for (int32_t t = 0; t < count; ++t) {
    for (int32_t j = 0; j < kv_dim; ++j) {
      v[static_cast<size_t>(t) * kv_dim + j] =
          scale * (static_cast<float>((token_start + t) * 100 + j) * 0.37f - 5.0f);
    }
  }
  return v;
}

TEST(DeviceBufferTest, AllocatesMovesAndNamesAnAllocationThatDoesNotFit) {
  SKIP_WITHOUT_GPU();
  absl::StatusOr<DeviceBuffer> empty = DeviceBuffer::Allocate(0, "nothing");
  ASSERT_TRUE(empty.ok()) << empty.status();
  EXPECT_EQ(empty->get(), nullptr);
  EXPECT_EQ(empty->bytes(), 0u);
  absl::StatusOr<DeviceBuffer> one = DeviceBuffer::Allocate(1000, "a test buffer");
  ASSERT_TRUE(one.ok()) << one.status();
  EXPECT_NE(one->get(), nullptr);
  DeviceBuffer moved = *std::move(one);
  EXPECT_EQ(moved.bytes(), 1000u);
  EXPECT_EQ(one->get(), nullptr);
  // 1 PiB fits no device: RESOURCE_EXHAUSTED naming the buffer, and the
  // error does not linger for the next launcher's cudaGetLastError.
  absl::StatusOr<DeviceBuffer> huge = DeviceBuffer::Allocate(size_t{1} << 50, "a huge buffer");
  EXPECT_EQ(huge.status().code(), absl::StatusCode::kResourceExhausted);
  EXPECT_THAT(huge.status().message(), HasSubstr("a huge buffer"));
  EXPECT_EQ(cudaGetLastError(), cudaSuccess);
}

kv::KvShape SmallShape() {
  kv::KvShape shape;
  shape.n_layers = 3;
  shape.n_kv_heads = 2;
  shape.head_dim = 8;
  shape.block_size = 4;
  return shape;
}

TEST(CudaKvStorageTest, CreateRefusesBadShape) {
  SKIP_WITHOUT_GPU();
  kv::KvShape shape = SmallShape();
  EXPECT_EQ(CudaKvStorage::Create(shape, kv::KvDtype::kBF16, 0).status().code(),
            absl::StatusCode::kInvalidArgument);
  shape.head_dim = 0;
  EXPECT_EQ(CudaKvStorage::Create(shape, kv::KvDtype::kBF16, 4).status().code(),
            absl::StatusCode::kInvalidArgument);
}

TEST(CudaKvStorageTest, RoundTripAcrossBlocksEveryDtype) {
  SKIP_WITHOUT_GPU();
  const kv::KvShape shape = SmallShape();
  const int32_t kv_dim = shape.kv_dim();
  for (kv::KvDtype dtype : {kv::KvDtype::kF32, kv::KvDtype::kF16, kv::KvDtype::kBF16}) {
    SCOPED_TRACE(kv::KvDtypeName(dtype));
    absl::StatusOr<std::unique_ptr<CudaKvStorage>> storage =
        CudaKvStorage::Create(shape, dtype, 6);
    ASSERT_TRUE(storage.ok()) << storage.status();
    CudaKvStorage& s = **storage;
    EXPECT_EQ(s.num_blocks(), 6);
    EXPECT_EQ(s.scratch_block(), 6);
    EXPECT_EQ(s.paged().num_blocks, 7);
    EXPECT_EQ(s.dtype(), dtype);
    EXPECT_EQ(s.row_bytes(), static_cast<size_t>(kv_dim) * kv::KvDtypeBytes(dtype));

    // Tokens [3, 14) of layer 1: blocks 4 (slot 3), 1, 2 (adjacent), 5.
    const std::vector<int32_t> table = {4, 1, 2, 5};
    const std::vector<float> kf = TokenValues(3, 11, kv_dim, 1.0f);
    const std::vector<float> vf = TokenValues(3, 11, kv_dim, -0.5f);
    const std::vector<char> k = Encode(kf, dtype);
    const std::vector<char> v = Encode(vf, dtype);
    s.WriteTokens(table, 1, 3, 11, k.data(), v.data());

    std::vector<char> k_out(k.size()), v_out(v.size());
    s.ReadTokens(table, 1, 3, 11, k_out.data(), v_out.data());
    EXPECT_EQ(k_out, k);
    EXPECT_EQ(v_out, v);
    // The values survive up to the dtype's rounding (exact for F32).
    const float tol = dtype == kv::KvDtype::kF32 ? 0.0f
                      : dtype == kv::KvDtype::kF16 ? 1.0f / 1024
                                                   : 1.0f / 128;
    for (size_t i = 0; i < kf.size(); ++i) {
      ASSERT_LE(std::fabs(Decode(k_out.data(), i, dtype) - kf[i]), tol * std::fabs(kf[i]))
          << i;
    }

    // A sub-range crossing the block 1 -> 2 boundary.
    std::vector<char> k_sub(6 * s.row_bytes()), v_sub(6 * s.row_bytes());
    s.ReadTokens(table, 1, 6, 6, k_sub.data(), v_sub.data());
    EXPECT_EQ(0, std::memcmp(k_sub.data(), k.data() + 3 * s.row_bytes(), k_sub.size()));
    EXPECT_EQ(0, std::memcmp(v_sub.data(), v.data() + 3 * s.row_bytes(), v_sub.size()));

    // Layer 0 and 2 are untouched: zero.
    for (int32_t layer : {0, 2}) {
      s.ReadTokens(table, layer, 3, 11, k_out.data(), v_out.data());
      EXPECT_EQ(k_out, std::vector<char>(k.size(), 0)) << layer;
      EXPECT_EQ(v_out, std::vector<char>(v.size(), 0)) << layer;
    }

    // The pool layout the kernels read (cuda_kernels.h): token 9 is block
    // table[2] = 2, slot 1, of layer 1.
    const PagedKv& p = s.paged();
    const size_t elem = ((size_t{1} * p.num_blocks + 2) * p.block_size + 1) * p.kv_dim;
    std::vector<char> row(s.row_bytes());
    ASSERT_EQ(cudaMemcpy(row.data(), static_cast<const char*>(p.k) + elem * kv::KvDtypeBytes(dtype),
                         row.size(), cudaMemcpyDeviceToHost),
              cudaSuccess);
    EXPECT_EQ(0, std::memcmp(row.data(), k.data() + 6 * s.row_bytes(), row.size()));
  }
}

TEST(CudaKvStorageTest, LongRangeIsCopiedInChunks) {
  SKIP_WITHOUT_GPU();
  // Rows of 16 KiB: the 4 MiB staging holds 256 tokens, so 600 tokens take
  // three chunks.
  kv::KvShape shape;
  shape.n_layers = 2;
  shape.n_kv_heads = 32;
  shape.head_dim = 128;
  shape.block_size = 16;
  absl::StatusOr<std::unique_ptr<CudaKvStorage>> storage =
      CudaKvStorage::Create(shape, kv::KvDtype::kF32, 40);
  ASSERT_TRUE(storage.ok()) << storage.status();
  std::vector<int32_t> table;
  for (int32_t b = 39; b >= 0; --b) table.push_back(b);  // no two runs merge
  const std::vector<char> k = Encode(TokenValues(5, 600, shape.kv_dim(), 1.0f), kv::KvDtype::kF32);
  const std::vector<char> v = Encode(TokenValues(5, 600, shape.kv_dim(), 2.0f), kv::KvDtype::kF32);
  (*storage)->WriteTokens(table, 1, 5, 600, k.data(), v.data());
  std::vector<char> k_out(k.size()), v_out(v.size());
  (*storage)->ReadTokens(table, 1, 5, 600, k_out.data(), v_out.data());
  EXPECT_EQ(k_out, k);
  EXPECT_EQ(v_out, v);
}

TEST(CudaKvStorageTest, ReadWaitsForTheLayerEvent) {
  SKIP_WITHOUT_GPU();
  const kv::KvShape shape = SmallShape();
  absl::StatusOr<std::unique_ptr<CudaKvStorage>> storage =
      CudaKvStorage::Create(shape, kv::KvDtype::kF32, 2);
  ASSERT_TRUE(storage.ok()) << storage.status();
  CudaKvStorage& s = **storage;
  cudaStream_t compute = nullptr;
  ASSERT_EQ(cudaStreamCreateWithFlags(&compute, cudaStreamNonBlocking), cudaSuccess);
  cudaEvent_t layer_done = nullptr;
  ASSERT_EQ(cudaEventCreateWithFlags(&layer_done, cudaEventDisableTiming), cudaSuccess);
  float* pinned = nullptr;
  ASSERT_EQ(cudaHostAlloc(reinterpret_cast<void**>(&pinned), s.row_bytes(), cudaHostAllocDefault),
            cudaSuccess);
  for (int32_t j = 0; j < shape.kv_dim(); ++j) pinned[j] = 1.5f + j;
  // The "layer" (a copy into token 0 of layer 2, block 0) is held back on
  // the compute stream by a host function, so only a read that waits for
  // the event sees it.
  ASSERT_EQ(cudaLaunchHostFunc(
                compute,
                [](void*) { std::this_thread::sleep_for(std::chrono::milliseconds(200)); },
                nullptr),
            cudaSuccess);
  const size_t offset = (size_t{2} * s.paged().num_blocks + 0) * shape.block_size * shape.kv_dim();
  ASSERT_EQ(cudaMemcpyAsync(static_cast<float*>(s.paged().k) + offset, pinned, s.row_bytes(),
                            cudaMemcpyHostToDevice, compute),
            cudaSuccess);
  ASSERT_EQ(cudaEventRecord(layer_done, compute), cudaSuccess);
  s.SetLayerEvent(2, layer_done);
  const std::vector<int32_t> table = {0};
  std::vector<float> k(shape.kv_dim()), v(shape.kv_dim());
  s.ReadTokens(table, 2, 0, 1, reinterpret_cast<char*>(k.data()),
               reinterpret_cast<char*>(v.data()));
  for (int32_t j = 0; j < shape.kv_dim(); ++j) EXPECT_EQ(k[j], 1.5f + j) << j;
  s.SetLayerEvent(2, nullptr);
  ASSERT_EQ(cudaStreamSynchronize(compute), cudaSuccess);
  cudaFreeHost(pinned);
  cudaEventDestroy(layer_done);
  cudaStreamDestroy(compute);
}

// Pseudo-random values in [-1, 1).
std::vector<float> Random(size_t n, uint64_t seed) {
  std::vector<float> v(n);
  uint64_t x = seed * 0x9E3779B97F4A7C15ULL + 1;
  for (float& f : v) {
    x ^= x << 13;
    x ^= x >> 7;
    x ^= x << 17;
    f = static_cast<float>(x >> 40) / static_cast<float>(1 << 24) * 2.0f - 1.0f;
  }
  return v;
}

// A device copy of host bytes, freed with the object.
struct DeviceCopy {
  DeviceBuffer buffer;
  explicit DeviceCopy(const void* data, size_t bytes) {
    absl::StatusOr<DeviceBuffer> b = DeviceBuffer::Allocate(bytes, "test");
    EXPECT_TRUE(b.ok()) << b.status();
    if (!b.ok()) return;
    buffer = *std::move(b);
    EXPECT_EQ(cudaMemcpy(buffer.get(), data, bytes, cudaMemcpyHostToDevice), cudaSuccess);
  }
};

std::vector<float> ToHost(const float* device, size_t n) {
  std::vector<float> out(n);
  EXPECT_EQ(cudaMemcpy(out.data(), device, n * sizeof(float), cudaMemcpyDeviceToHost),
            cudaSuccess);
  return out;
}

// out[m][n] = sum_k a[m][k] w[n][k] in double, from the values as stored.
std::vector<double> Reference(const std::vector<float>& a, const std::vector<float>& w,
                              int32_t m, int32_t n, int32_t k) {
  std::vector<double> out(static_cast<size_t>(m) * n);
  for (int32_t i = 0; i < m; ++i) {
    for (int32_t j = 0; j < n; ++j) {
      double sum = 0;
      for (int32_t t = 0; t < k; ++t) {
        sum += static_cast<double>(a[static_cast<size_t>(i) * k + t]) *
               w[static_cast<size_t>(j) * k + t];
      }
      out[static_cast<size_t>(i) * n + j] = sum;
    }
  }
  return out;
}

// The values after rounding to `dtype` (what the GEMM reads).
std::vector<float> Rounded(const std::vector<float>& v, kv::KvDtype dtype) {
  const std::vector<char> bytes = Encode(v, dtype);
  std::vector<float> out(v.size());
  for (size_t i = 0; i < v.size(); ++i) out[i] = Decode(bytes.data(), i, dtype);
  return out;
}

TEST(GemmRunnerTest, MatchesHostReferenceAndAccumulates) {
  SKIP_WITHOUT_GPU();
  const int32_t max_m = 40;
  for (kv::KvDtype dtype : {kv::KvDtype::kBF16, kv::KvDtype::kF16, kv::KvDtype::kF32}) {
    for (bool batch_invariant : {false, true}) {
      SCOPED_TRACE(std::string(kv::KvDtypeName(dtype)) + (batch_invariant ? " bi" : " default"));
      absl::StatusOr<std::unique_ptr<GemmRunner>> gemm = GemmRunner::Create(
          dtype, {{48, 64}, {300, 96}}, max_m, batch_invariant, /*stream=*/nullptr);
      ASSERT_TRUE(gemm.ok()) << gemm.status();
      for (auto [n, k] : {std::pair{48, 64}, std::pair{300, 96}}) {
        const std::vector<float> a = Rounded(Random(size_t{max_m} * k, 1), dtype);
        const std::vector<float> w = Rounded(Random(size_t(n) * k, 2), dtype);
        const std::vector<char> a_bytes = Encode(a, dtype), w_bytes = Encode(w, dtype);
        DeviceCopy a_dev(a_bytes.data(), a_bytes.size());
        DeviceCopy w_dev(w_bytes.data(), w_bytes.size());
        const std::vector<float> base = Random(size_t{max_m} * n, 3);
        DeviceCopy out(base.data(), base.size() * sizeof(float));
        // F32 accumulation of k products of magnitude <= 1.
        const double tol = 1e-5 * k;
        for (int32_t m : {1, 7, max_m}) {
          const std::vector<double> ref = Reference(a, w, m, n, k);
          ASSERT_TRUE((*gemm)->Run(a_dev.buffer.get(), w_dev.buffer.get(), m, n, k,
                                   out.buffer.as<float>(), false, nullptr).ok());
          std::vector<float> got = ToHost(out.buffer.as<float>(), ref.size());
          for (size_t i = 0; i < ref.size(); ++i) {
            ASSERT_NEAR(got[i], ref[i], tol) << "m=" << m << " i=" << i;
          }
          // Accumulate: out += a . w^T.
          ASSERT_TRUE((*gemm)->Run(a_dev.buffer.get(), w_dev.buffer.get(), m, n, k,
                                   out.buffer.as<float>(), true, nullptr).ok());
          std::vector<float> twice = ToHost(out.buffer.as<float>(), ref.size());
          for (size_t i = 0; i < ref.size(); ++i) {
            ASSERT_NEAR(twice[i], 2 * ref[i], 2 * tol) << "m=" << m << " i=" << i;
          }
        }
      }
    }
  }
}

TEST(GemmRunnerTest, RefusesUnknownShapeBadMAndMisalignedPointers) {
  SKIP_WITHOUT_GPU();
  absl::StatusOr<std::unique_ptr<GemmRunner>> gemm =
      GemmRunner::Create(kv::KvDtype::kF32, {{16, 16}}, 8, false, nullptr);
  ASSERT_TRUE(gemm.ok()) << gemm.status();
  absl::StatusOr<DeviceBuffer> buf = DeviceBuffer::Allocate(4096, "test");
  ASSERT_TRUE(buf.ok());
  float* p = buf->as<float>();
  absl::Status s = (*gemm)->Run(p, p, 1, 32, 16, p, false, nullptr);
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(s.message(), HasSubstr("n=32 k=16"));
  s = (*gemm)->Run(p, p, 9, 16, 16, p, false, nullptr);
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(s.message(), HasSubstr("max_m = 8"));
  s = (*gemm)->Run(p + 1, p, 1, 16, 16, p, false, nullptr);
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(s.message(), HasSubstr("16-byte aligned"));
  EXPECT_EQ(GemmRunner::Create(kv::KvDtype::kF32, {{0, 16}}, 8, false, nullptr).status().code(),
            absl::StatusCode::kInvalidArgument);
}

TEST(GemmRunnerTest, InvarianceCheckReportAndBatchInvariantRows) {
  SKIP_WITHOUT_GPU();
  const int32_t max_m = 100;  // checks m = 1, 2, 3, 8, 17, 64
  for (bool batch_invariant : {true, false}) {
    SCOPED_TRACE(batch_invariant ? "bi" : "default");
    absl::StatusOr<std::unique_ptr<GemmRunner>> gemm = GemmRunner::Create(
        kv::KvDtype::kBF16, {{256, 64}, {64, 256}, {256, 64}}, max_m, batch_invariant, nullptr);
    ASSERT_TRUE(gemm.ok()) << gemm.status();
    ASSERT_EQ((*gemm)->reports().size(), 2u);  // the duplicate shape counted once
    for (const GemmShapeReport& r : (*gemm)->reports()) EXPECT_TRUE(r.invariant.empty());
    ASSERT_TRUE((*gemm)->CheckInvariance().ok());
    for (const GemmShapeReport& r : (*gemm)->reports()) {
      SCOPED_TRACE(::testing::Message() << "n=" << r.n << " k=" << r.k);
      EXPECT_THAT(r.engine, AnyOf("cublaslt", "fixed-tile"));
      if (!batch_invariant) {
        EXPECT_EQ(r.engine, "cublaslt");
      }
      if (r.invariant.empty()) {
        // Only a batch-invariant shape without any cuBLASLt algorithm.
        EXPECT_TRUE(batch_invariant);
        EXPECT_EQ(r.engine, "fixed-tile");
        continue;
      }
      ASSERT_EQ(r.invariant.size(), 6u);
      EXPECT_TRUE(r.invariant[0]);  // m = 1 against itself
      const bool all = std::find(r.invariant.begin(), r.invariant.end(), false) ==
                       r.invariant.end();
      if (batch_invariant) {
        EXPECT_EQ(r.engine, all ? "cublaslt" : "fixed-tile");
      }
    }
    if (!batch_invariant) continue;
    // After the check, row 0 has the same bits at every m, whichever engine.
    for (auto [n, k] : {std::pair{256, 64}, std::pair{64, 256}}) {
      const std::vector<char> a = Encode(Random(size_t{max_m} * k, 7), kv::KvDtype::kBF16);
      const std::vector<char> w = Encode(Random(size_t(n) * k, 8), kv::KvDtype::kBF16);
      DeviceCopy a_dev(a.data(), a.size());
      DeviceCopy w_dev(w.data(), w.size());
      absl::StatusOr<DeviceBuffer> out =
          DeviceBuffer::Allocate(size_t{max_m} * n * sizeof(float), "test");
      ASSERT_TRUE(out.ok());
      std::vector<float> first;
      for (int32_t m : {1, 5, 33, max_m}) {
        ASSERT_TRUE((*gemm)->Run(a_dev.buffer.get(), w_dev.buffer.get(), m, n, k,
                                 out->as<float>(), false, nullptr).ok());
        const std::vector<float> row = ToHost(out->as<float>(), static_cast<size_t>(n));
        if (m == 1) first = row;
        EXPECT_EQ(0, std::memcmp(first.data(), row.data(), row.size() * sizeof(float)))
            << "n=" << n << " k=" << k << " m=" << m;
      }
    }
  }
}

// A shared model, opened and loaded.
struct Loaded {
  std::unique_ptr<gguf::GgufFile> file;
  std::unique_ptr<model::LlamaModel> model;
};

Loaded LoadShared(const std::string& name) {
  Loaded s;
  absl::StatusOr<std::unique_ptr<gguf::GgufFile>> file =
      gguf::GgufFile::Open(tandem::testing::SharedPath("models/" + name));
  EXPECT_TRUE(file.ok()) << file.status();
  if (!file.ok()) return s;
  s.file = *std::move(file);
  absl::StatusOr<std::unique_ptr<model::LlamaModel>> m = model::LlamaModel::Load(*s.file);
  EXPECT_TRUE(m.ok()) << m.status();
  if (m.ok()) s.model = *std::move(m);
  return s;
}

// Row `row` of `m` from the device, as floats.
std::vector<float> DeviceRow(const DeviceMatrix& m, kv::KvDtype dtype, int32_t row) {
  const size_t elem = kv::KvDtypeBytes(dtype);
  std::vector<char> bytes(static_cast<size_t>(m.cols) * elem);
  EXPECT_EQ(cudaMemcpy(bytes.data(),
                       static_cast<const char*>(m.data) + static_cast<size_t>(row) * bytes.size(),
                       bytes.size(), cudaMemcpyDeviceToHost),
            cudaSuccess);
  std::vector<float> out(static_cast<size_t>(m.cols));
  for (size_t i = 0; i < out.size(); ++i) out[i] = Decode(bytes.data(), i, dtype);
  return out;
}

// Row `row` of a host matrix as DequantizeRows gives it, rounded to dtype.
std::vector<float> HostRow(const model::internal::Matrix& m, size_t row, kv::KvDtype dtype) {
  std::vector<float> out(m.view.in);
  model::internal::DequantizeRows(m.view, row, 1, out.data());
  return Rounded(out, dtype);
}

std::vector<float> HostVector(const model::internal::Tensor& t, size_t n) {
  return std::vector<float>(t.data, t.data + n);
}

// Uploads ../shared/models/<name> and compares rows of every matrix (each
// part of the fused ones at its row offset) and the vectors with the host
// weights, converted to `expected` (F32: the exact host floats).
void CheckUpload(const std::string& name, bool keep_f32, kv::KvDtype expected) {
  SCOPED_TRACE(name + (keep_f32 ? " keep_f32_weights" : ""));
  Loaded st = LoadShared(name);
  ASSERT_NE(st.model, nullptr);
  const model::LlamaConfig& c = st.model->config();
  const model::internal::ModelWeights& hw = st.model->weights_for_device_upload();
  const int32_t q_dim = c.n_head * c.head_dim;
  const int32_t kv_dim = c.n_head_kv * c.head_dim;
  cudaStream_t stream = nullptr;
  ASSERT_EQ(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking), cudaSuccess);
  absl::StatusOr<DeviceWeights> dw = UploadWeights(*st.model, keep_f32, stream);
  cudaStreamDestroy(stream);
  ASSERT_TRUE(dw.ok()) << dw.status();
  const kv::KvDtype dtype = expected;
  ASSERT_EQ(dw->dtype, dtype);
  EXPECT_GT(dw->bytes, 0u);
  ASSERT_EQ(dw->layers.size(), static_cast<size_t>(c.n_layers));
  EXPECT_EQ(dw->token_embd.rows, c.vocab_size);
  EXPECT_EQ(dw->token_embd.cols, c.n_embd);
  if (hw.output.view.data == hw.token_embd.view.data) {
    EXPECT_EQ(dw->output.data, dw->token_embd.data);  // tied: aliased
  } else {
    EXPECT_NE(dw->output.data, dw->token_embd.data);
    EXPECT_EQ(DeviceRow(dw->output, dtype, 3), HostRow(hw.output, 3, dtype));
  }
  EXPECT_EQ(DeviceRow(dw->token_embd, dtype, 0), HostRow(hw.token_embd, 0, dtype));
  EXPECT_EQ(DeviceRow(dw->token_embd, dtype, c.vocab_size - 1),
            HostRow(hw.token_embd, c.vocab_size - 1, dtype));
  EXPECT_EQ(ToHost(dw->output_norm, c.n_embd), HostVector(hw.output_norm, c.n_embd));
  EXPECT_EQ(dw->rope_freqs == nullptr, !c.rope_freq_factors);
  if (c.rope_freq_factors) {
    EXPECT_EQ(ToHost(dw->rope_freqs, c.rope_dim / 2), HostVector(hw.rope_freqs, c.rope_dim / 2));
  }
  for (int32_t li : {0, c.n_layers - 1}) {
    SCOPED_TRACE(::testing::Message() << "layer " << li);
    const DeviceLayer& d = dw->layers[li];
    const model::internal::LayerWeights& l = hw.layers[li];
    EXPECT_EQ(d.wqkv.rows, q_dim + 2 * kv_dim);
    EXPECT_EQ(d.wqkv.cols, c.n_embd);
    EXPECT_EQ(DeviceRow(d.wqkv, dtype, 0), HostRow(l.wq, 0, dtype));
    EXPECT_EQ(DeviceRow(d.wqkv, dtype, q_dim - 1), HostRow(l.wq, q_dim - 1, dtype));
    EXPECT_EQ(DeviceRow(d.wqkv, dtype, q_dim), HostRow(l.wk, 0, dtype));
    EXPECT_EQ(DeviceRow(d.wqkv, dtype, q_dim + kv_dim), HostRow(l.wv, 0, dtype));
    EXPECT_EQ(DeviceRow(d.wqkv, dtype, q_dim + 2 * kv_dim - 1),
              HostRow(l.wv, kv_dim - 1, dtype));
    EXPECT_EQ(d.w_gate_up.rows, 2 * c.n_ff);
    EXPECT_EQ(DeviceRow(d.w_gate_up, dtype, 1), HostRow(l.w_gate, 1, dtype));
    EXPECT_EQ(DeviceRow(d.w_gate_up, dtype, c.n_ff + 1), HostRow(l.w_up, 1, dtype));
    EXPECT_EQ(d.wo.rows, c.n_embd);
    EXPECT_EQ(DeviceRow(d.wo, dtype, 2), HostRow(l.wo, 2, dtype));
    EXPECT_EQ(d.w_down.cols, c.n_ff);
    EXPECT_EQ(DeviceRow(d.w_down, dtype, c.n_embd - 1), HostRow(l.w_down, c.n_embd - 1, dtype));
    EXPECT_EQ(ToHost(d.attn_norm, c.n_embd), HostVector(l.attn_norm, c.n_embd));
    EXPECT_EQ(ToHost(d.ffn_norm, c.n_embd), HostVector(l.ffn_norm, c.n_embd));
    EXPECT_EQ(d.bqkv == nullptr, !c.qkv_bias);
    if (c.qkv_bias) {
      std::vector<float> bias = HostVector(l.bq, q_dim);
      for (const auto* b : {&l.bk, &l.bv}) {
        bias.insert(bias.end(), b->data, b->data + kv_dim);
      }
      EXPECT_EQ(ToHost(d.bqkv, q_dim + 2 * kv_dim), bias);
    }
  }
}

// stories260K is all F32: kept F32 (the accuracy mode: exact), else BF16.
TEST(UploadWeightsTest, Stories260KF32Exact) {
  SKIP_WITHOUT_GPU();
  CheckUpload("stories260K.gguf", true, kv::KvDtype::kF32);
}

TEST(UploadWeightsTest, Stories260KBf16) {
  SKIP_WITHOUT_GPU();
  CheckUpload("stories260K.gguf", false, kv::KvDtype::kBF16);
}

// Every matrix F16: F16 on the device.
TEST(UploadWeightsTest, AllF16ModelStaysF16) {
  SKIP_WITHOUT_GPU();
  CheckUpload("llama-2-tiny-random.gguf", false, kv::KvDtype::kF16);
}

// Mixed types are BF16: K-quants (dequantized on the host), qwen2 (fused
// Q/K/V biases, tied output), llama3 (rope_freqs, tied output).
TEST(UploadWeightsTest, MixedModelsAreBf16) {
  SKIP_WITHOUT_GPU();
  CheckUpload("kq-tiny-q4_k_m.gguf", false, kv::KvDtype::kBF16);
  CheckUpload("qwen2-tiny-synth.gguf", false, kv::KvDtype::kBF16);
  CheckUpload("llama3-tiny-synth.gguf", false, kv::KvDtype::kBF16);
}

}  // namespace
}  // namespace tandem::backend::cuda
