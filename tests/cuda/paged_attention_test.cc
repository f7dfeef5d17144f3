// LaunchKvWrite and LaunchPagedAttention (cuda_kernels.h) against host
// references on a paged pool with scrambled block tables: sequences of
// several chunks (kAttentionChunk), a prefill chunk crossing a chunk
// boundary next to decode tokens, GQA, head_dim from 4 (the tiny goldens)
// to 256, every KV dtype; and the batch-invariance claim, bit for bit.
#include <cuda_runtime.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <numeric>
#include <random>
#include <string>
#include <vector>

#include "engine/backend/cuda/cuda_kernels.h"
#include "tests/cuda/cuda_test_util.h"

namespace tandem::backend::cuda {
namespace {

using testing::Bits;
using testing::Decode;
using testing::DeviceArray;
using testing::Encode;
using testing::kAllDtypes;
using testing::RandomFloats;
using testing::SyncOrFail;

constexpr int32_t kBlockSize = 16;
constexpr int32_t kLayers = 2;

// A pool holding sequences of the given lengths through shuffled block
// tables, and a batch of (sequence, position) tokens with random qkv rows.
struct Scenario {
  int32_t n_head = 0, n_head_kv = 0, head_dim = 0;
  Dtype dtype = Dtype::kF32;
  int32_t num_blocks = 0, max_blocks = 0;
  std::vector<int32_t> tables;  // [n_seqs][max_blocks]
  std::vector<float> k, v;      // whole pools, the values the dtype holds
  std::vector<int32_t> token_seq, token_pos;
  std::vector<float> qkv;  // [n_tokens][width]

  int32_t q_dim() const { return n_head * head_dim; }
  int32_t kv_dim() const { return n_head_kv * head_dim; }
  int32_t width() const { return q_dim() + 2 * kv_dim(); }
  int32_t n_tokens() const { return static_cast<int32_t>(token_seq.size()); }
  int32_t n_seqs() const { return static_cast<int32_t>(tables.size() / max_blocks); }
  // Offset of (layer, seq, position)'s K/V row in the pools.
  size_t Row(int32_t layer, int32_t seq, int32_t pos) const {
    const size_t block = static_cast<size_t>(tables[static_cast<size_t>(seq) * max_blocks +
                                                    pos / kBlockSize]);
    return ((static_cast<size_t>(layer) * num_blocks + block) * kBlockSize + pos % kBlockSize) *
           static_cast<size_t>(kv_dim());
  }
};

Scenario MakeScenario(std::mt19937& rng, int32_t n_head, int32_t n_head_kv, int32_t head_dim,
                      Dtype dtype, const std::vector<int32_t>& seq_lens,
                      const std::vector<std::pair<int32_t, int32_t>>& tokens) {
  Scenario s;
  s.n_head = n_head;
  s.n_head_kv = n_head_kv;
  s.head_dim = head_dim;
  s.dtype = dtype;
  int32_t used = 0;
  for (int32_t len : seq_lens) {
    const int32_t blocks = (len + kBlockSize - 1) / kBlockSize;
    s.max_blocks = std::max(s.max_blocks, blocks);
    used += blocks;
  }
  s.num_blocks = used + 3;  // a few blocks nobody owns
  std::vector<int32_t> ids(static_cast<size_t>(s.num_blocks));
  std::iota(ids.begin(), ids.end(), 0);
  std::shuffle(ids.begin(), ids.end(), rng);
  s.tables.assign(seq_lens.size() * s.max_blocks, -1);
  size_t next = 0;
  for (size_t q = 0; q < seq_lens.size(); ++q) {
    for (int32_t b = 0; b * kBlockSize < seq_lens[q]; ++b) {
      s.tables[q * s.max_blocks + b] = ids[next++];
    }
  }
  const size_t pool = static_cast<size_t>(kLayers) * s.num_blocks * kBlockSize * s.kv_dim();
  s.k = testing::RoundTo(RandomFloats(rng, pool), dtype);
  s.v = testing::RoundTo(RandomFloats(rng, pool), dtype);
  for (const auto& [seq, pos] : tokens) {
    s.token_seq.push_back(seq);
    s.token_pos.push_back(pos);
  }
  s.qkv = RandomFloats(rng, static_cast<size_t>(s.n_tokens()) * s.width(), -2.0f, 2.0f);
  return s;
}

// Causal softmax attention in double: out[t][h][d].
std::vector<float> ReferenceAttention(const Scenario& s, int32_t layer, float scale) {
  const int32_t hd = s.head_dim, group = s.n_head / s.n_head_kv;
  std::vector<float> out(static_cast<size_t>(s.n_tokens()) * s.q_dim());
  for (int32_t t = 0; t < s.n_tokens(); ++t) {
    const int32_t pos = s.token_pos[t];
    for (int32_t h = 0; h < s.n_head; ++h) {
      const float* q = &s.qkv[static_cast<size_t>(t) * s.width() + static_cast<size_t>(h) * hd];
      const size_t head = static_cast<size_t>(h / group) * hd;
      std::vector<double> p(static_cast<size_t>(pos) + 1);
      double max = -INFINITY;
      for (int32_t j = 0; j <= pos; ++j) {
        const float* k = &s.k[s.Row(layer, s.token_seq[t], j) + head];
        double dot = 0.0;
        for (int32_t d = 0; d < hd; ++d) dot += static_cast<double>(q[d]) * k[d];
        p[j] = dot * scale;
        max = std::max(max, p[j]);
      }
      double sum = 0.0;
      for (double& x : p) sum += (x = std::exp(x - max));
      for (int32_t d = 0; d < hd; ++d) {
        double acc = 0.0;
        for (int32_t j = 0; j <= pos; ++j) {
          acc += p[j] * s.v[s.Row(layer, s.token_seq[t], j) + head + d];
        }
        out[static_cast<size_t>(t) * s.q_dim() + static_cast<size_t>(h) * hd + d] =
            static_cast<float>(acc / sum);
      }
    }
  }
  return out;
}

// `bytes` after `pad` zero bytes.
std::vector<uint8_t> Padded(std::vector<uint8_t> bytes, size_t pad) {
  bytes.insert(bytes.begin(), pad, 0);
  return bytes;
}

// The scenario's pools, tables and qkv on the device. With `misalign`,
// the pools start one element past an aligned address (the kernel's
// scalar loads).
struct DeviceScenario {
  explicit DeviceScenario(const Scenario& s, bool misalign = false)
      : pad(misalign ? kv::KvDtypeBytes(s.dtype) : 0),
        k(Padded(Encode(s.k, s.dtype), pad)),
        v(Padded(Encode(s.v, s.dtype), pad)),
        tables(s.tables),
        qkv(s.qkv) {}
  size_t pad;
  DeviceArray<uint8_t> k, v;
  DeviceArray<int32_t> tables;
  DeviceArray<float> qkv;

  PagedKv Kv(const Scenario& s) const {
    PagedKv kv;
    kv.k = k.get() + pad;
    kv.v = v.get() + pad;
    kv.dtype = s.dtype;
    kv.n_layers = kLayers;
    kv.num_blocks = s.num_blocks;
    kv.block_size = kBlockSize;
    kv.kv_dim = s.kv_dim();
    return kv;
  }
};

// Runs attention over the tokens `which` (indices into s's tokens) of
// layer 1 and returns their rows of the output, decoded to floats.
std::vector<float> RunAttention(const Scenario& s, const DeviceScenario& dev,
                                const std::vector<int32_t>& which, int32_t max_context,
                                Dtype out_dtype) {
  std::vector<int32_t> seq, pos;
  std::vector<float> qkv;
  for (int32_t t : which) {
    seq.push_back(s.token_seq[t]);
    pos.push_back(s.token_pos[t]);
    qkv.insert(qkv.end(), s.qkv.begin() + static_cast<size_t>(t) * s.width(),
               s.qkv.begin() + static_cast<size_t>(t + 1) * s.width());
  }
  const int32_t n = static_cast<int32_t>(which.size());
  DeviceArray<int32_t> d_seq(seq), d_pos(pos);
  DeviceArray<float> d_qkv(qkv);
  BatchMeta batch;
  batch.n_tokens = n;
  batch.n_seqs = s.n_seqs();
  batch.token_seq = d_seq.get();
  batch.token_pos = d_pos.get();
  batch.block_tables = dev.tables.get();
  batch.max_blocks_per_seq = s.max_blocks;
  DeviceArray<uint8_t> workspace(
      PagedAttentionWorkspaceBytes(n, s.n_head, s.head_dim, max_context));
  DeviceArray<uint8_t> out(static_cast<size_t>(n) * s.q_dim() * kv::KvDtypeBytes(out_dtype));
  const float scale = 1.0f / std::sqrt(static_cast<float>(s.head_dim));
  EXPECT_EQ(LaunchPagedAttention(d_qkv.get(), batch, dev.Kv(s), 1, s.n_head, s.n_head_kv,
                                 s.head_dim, scale, max_context, workspace.get(), out.get(),
                                 out_dtype, nullptr),
            cudaSuccess);
  SyncOrFail();
  return Decode(out.Download(), out_dtype);
}

// Decode tokens deep into three chunks, a first token, a prefill run
// 250..256 crossing the first chunk boundary (keys past each token's
// position are in the pool and must stay unseen), and both sides of the
// boundary of a long sequence.
const std::vector<int32_t> kSeqLens = {600, 1, 257, 300};
const std::vector<std::pair<int32_t, int32_t>> kTokens = {
    {0, 599}, {1, 0},   {2, 250}, {2, 251}, {2, 252}, {2, 253}, {2, 254},
    {2, 255}, {2, 256}, {3, 299}, {0, 255}, {0, 256}, {0, 511}, {0, 512}};

struct HeadShape {
  int32_t n_head, n_head_kv, head_dim;
};

// stories260K (8/4 heads of 8), llama-2-tiny (head dim 4), the tiny synth
// models (16), a non-power-of-two head, 64 / 128 / 256 with GQA, Qwen2.5's
// group of 7, and a group of 10 (more than one block's 8 heads).
const HeadShape kShapes[] = {{8, 4, 8},   {2, 2, 4},   {4, 2, 16}, {4, 2, 40}, {8, 2, 64},
                             {4, 1, 128}, {2, 1, 256}, {14, 2, 64}, {20, 2, 32}};

// F32 output: within 2e-5 of the double reference (outputs are averages
// of values in [-1, 1]; float dots, expf and FMA sums over <= 600 keys).
// BF16 output: one rounding more (8e-3 relative).
TEST(CudaPagedAttentionTest, MatchesDoubleReference) {
  TANDEM_REQUIRE_GPU();
  std::mt19937 rng(11);
  for (const HeadShape& shape : kShapes) {
    for (Dtype dtype : kAllDtypes) {
      const Scenario s = MakeScenario(rng, shape.n_head, shape.n_head_kv, shape.head_dim, dtype,
                                      kSeqLens, kTokens);
      const DeviceScenario dev(s);
      const std::vector<float> want =
          ReferenceAttention(s, 1, 1.0f / std::sqrt(static_cast<float>(s.head_dim)));
      std::vector<int32_t> all(static_cast<size_t>(s.n_tokens()));
      std::iota(all.begin(), all.end(), 0);
      const std::string what = "head_dim " + std::to_string(shape.head_dim) + " heads " +
                               std::to_string(shape.n_head) + "/" +
                               std::to_string(shape.n_head_kv) + " kv " +
                               kv::KvDtypeName(dtype);
      for (Dtype out_dtype : {Dtype::kF32, Dtype::kBF16}) {
        const std::vector<float> got = RunAttention(s, dev, all, 1024, out_dtype);
        ASSERT_EQ(got.size(), want.size());
        const float rel = out_dtype == Dtype::kF32 ? 0.0f : 8e-3f;
        int failures = 0;
        for (size_t i = 0; i < got.size() && failures < 5; ++i) {
          const float tol = rel * std::fabs(want[i]) + 2e-5f;
          if (!(std::fabs(got[i] - want[i]) <= tol)) {
            ++failures;
            ADD_FAILURE() << what << " out " << kv::KvDtypeName(out_dtype) << " token "
                          << i / s.q_dim() << " element " << i % s.q_dim() << ": got "
                          << got[i] << ", want " << want[i];
          }
        }
      }
    }
  }
}

// A token's output bits are the same alone, in a batch in another order,
// and with another grid size (max_context: the position + 1, or 8192).
TEST(CudaPagedAttentionTest, TokenBitsDoNotDependOnTheBatch) {
  TANDEM_REQUIRE_GPU();
  std::mt19937 rng(12);
  for (const HeadShape& shape : {kShapes[0], kShapes[4], kShapes[5], kShapes[8]}) {
    const Scenario s = MakeScenario(rng, shape.n_head, shape.n_head_kv, shape.head_dim,
                                    Dtype::kBF16, kSeqLens, kTokens);
    const DeviceScenario dev(s);
    std::vector<int32_t> all(static_cast<size_t>(s.n_tokens()));
    std::iota(all.begin(), all.end(), 0);
    const std::vector<float> batch = RunAttention(s, dev, all, 1024, Dtype::kF32);
    std::vector<int32_t> reversed(all.rbegin(), all.rend());
    const std::vector<float> back = RunAttention(s, dev, reversed, 8192, Dtype::kF32);
    const size_t q_dim = static_cast<size_t>(s.q_dim());
    for (int32_t t = 0; t < s.n_tokens(); ++t) {
      const std::vector<float> want(batch.begin() + t * q_dim, batch.begin() + (t + 1) * q_dim);
      const size_t r = static_cast<size_t>(s.n_tokens() - 1 - t);
      const std::vector<float> in_reverse(back.begin() + r * q_dim, back.begin() + (r + 1) * q_dim);
      for (int32_t max_context : {s.token_pos[t] + 1, 8192}) {
        const std::vector<float> alone = RunAttention(s, dev, {t}, max_context, Dtype::kF32);
        for (size_t i = 0; i < q_dim; ++i) {
          ASSERT_EQ(Bits(alone[i]), Bits(want[i]))
              << "head_dim " << shape.head_dim << " token " << t << " alone, max_context "
              << max_context << ", element " << i;
        }
      }
      for (size_t i = 0; i < q_dim; ++i) {
        ASSERT_EQ(Bits(in_reverse[i]), Bits(want[i]))
            << "head_dim " << shape.head_dim << " token " << t << " reversed, element " << i;
      }
    }
  }
}

// Keys read with 16-byte loads (aligned pools) and element by element
// (pools one element off alignment) follow the same FMA chain: same bits.
TEST(CudaPagedAttentionTest, AlignedAndUnalignedPoolsGiveTheSameBits) {
  TANDEM_REQUIRE_GPU();
  std::mt19937 rng(14);
  for (Dtype dtype : kAllDtypes) {
    const Scenario s = MakeScenario(rng, 8, 2, 64, dtype, kSeqLens, kTokens);
    const DeviceScenario aligned(s), unaligned(s, /*misalign=*/true);
    std::vector<int32_t> all(static_cast<size_t>(s.n_tokens()));
    std::iota(all.begin(), all.end(), 0);
    const std::vector<float> want = RunAttention(s, aligned, all, 1024, Dtype::kF32);
    const std::vector<float> got = RunAttention(s, unaligned, all, 1024, Dtype::kF32);
    ASSERT_EQ(got.size(), want.size());
    for (size_t i = 0; i < got.size(); ++i) {
      ASSERT_EQ(Bits(got[i]), Bits(want[i])) << kv::KvDtypeName(dtype) << " element " << i;
    }
  }
}

// Each token's K and V land at (layer, block_table[pos / block_size],
// pos % block_size) as the dtype's rounding of the qkv values; every other
// element of the pools is untouched.
TEST(CudaKvWriteTest, WritesEachTokenAtItsSlotOnly) {
  TANDEM_REQUIRE_GPU();
  std::mt19937 rng(13);
  for (Dtype dtype : kAllDtypes) {
    const Scenario s = MakeScenario(rng, 4, 2, 8, dtype, {40, 20}, {{0, 0}, {0, 17}, {0, 39},
                                                                   {1, 15}, {1, 16}});
    const DeviceScenario dev(s);
    BatchMeta batch;
    DeviceArray<int32_t> d_seq(s.token_seq), d_pos(s.token_pos);
    batch.n_tokens = s.n_tokens();
    batch.n_seqs = s.n_seqs();
    batch.token_seq = d_seq.get();
    batch.token_pos = d_pos.get();
    batch.block_tables = dev.tables.get();
    batch.max_blocks_per_seq = s.max_blocks;
    const int32_t layer = 1;
    ASSERT_EQ(LaunchKvWrite(dev.qkv.get(), s.q_dim(), batch, dev.Kv(s), layer, nullptr),
              cudaSuccess);
    SyncOrFail();
    std::vector<float> want_k = s.k, want_v = s.v;
    const std::vector<float> rounded = testing::RoundTo(s.qkv, dtype);
    for (int32_t t = 0; t < s.n_tokens(); ++t) {
      const size_t row = s.Row(layer, s.token_seq[t], s.token_pos[t]);
      const size_t src = static_cast<size_t>(t) * s.width() + s.q_dim();
      for (int32_t j = 0; j < s.kv_dim(); ++j) {
        want_k[row + j] = rounded[src + j];
        want_v[row + j] = rounded[src + s.kv_dim() + j];
      }
    }
    const std::vector<float> got_k = Decode(dev.k.Download(), dtype);
    const std::vector<float> got_v = Decode(dev.v.Download(), dtype);
    ASSERT_EQ(got_k.size(), want_k.size());
    for (size_t i = 0; i < got_k.size(); ++i) {
      ASSERT_EQ(Bits(got_k[i]), Bits(want_k[i])) << kv::KvDtypeName(dtype) << " K " << i;
      ASSERT_EQ(Bits(got_v[i]), Bits(want_v[i])) << kv::KvDtypeName(dtype) << " V " << i;
    }
  }
}

// Workspace: none while every token fits in one chunk; else per token,
// head and chunk, head_dim accumulators plus (max, sum).
TEST(CudaPagedAttentionTest, WorkspaceBytes) {
  EXPECT_EQ(PagedAttentionWorkspaceBytes(64, 32, 64, kAttentionChunk), 0u);
  EXPECT_EQ(PagedAttentionWorkspaceBytes(2, 4, 64, 1000), size_t{2} * 4 * 4 * (64 + 2) * 4);
  EXPECT_EQ(PagedAttentionWorkspaceBytes(128, 32, 64, 8192), size_t{128} * 32 * 32 * 66 * 4);
}

// Shapes the kernel cannot run are refused before any launch (no GPU
// needed): head_dim over 256, heads not a multiple of KV heads, a kv_dim
// that disagrees, a missing workspace for a multi-chunk grid.
TEST(CudaPagedAttentionTest, RefusesBadShapes) {
  BatchMeta batch;
  batch.n_tokens = 1;
  PagedKv kv;
  kv.n_layers = 1;
  kv.num_blocks = 1;
  kv.kv_dim = 2 * 257;
  int dummy = 0;
  EXPECT_EQ(LaunchPagedAttention(nullptr, batch, kv, 0, 2, 2, 257, 1.0f, 16, &dummy, &dummy,
                                 Dtype::kF32, nullptr),
            cudaErrorInvalidValue);
  kv.kv_dim = 2 * 64;
  EXPECT_EQ(LaunchPagedAttention(nullptr, batch, kv, 0, 3, 2, 64, 1.0f, 16, &dummy, &dummy,
                                 Dtype::kF32, nullptr),
            cudaErrorInvalidValue);
  EXPECT_EQ(LaunchPagedAttention(nullptr, batch, kv, 0, 4, 1, 64, 1.0f, 16, &dummy, &dummy,
                                 Dtype::kF32, nullptr),
            cudaErrorInvalidValue);
  EXPECT_EQ(LaunchPagedAttention(nullptr, batch, kv, 0, 4, 2, 64, 1.0f, 4096, nullptr, &dummy,
                                 Dtype::kF32, nullptr),
            cudaErrorInvalidValue);
  EXPECT_EQ(LaunchPagedAttention(nullptr, batch, kv, 1, 4, 2, 64, 1.0f, 16, &dummy, &dummy,
                                 Dtype::kF32, nullptr),
            cudaErrorInvalidValue);  // layer 1 of 1
}

}  // namespace
}  // namespace tandem::backend::cuda
