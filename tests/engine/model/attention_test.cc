// Paged attention (attention.h): every ISA build equals, bit for bit, the
// documented formula written out here as plain scalar code over a
// contiguous copy of the keys and values, for head dims with and without
// vector tails, GQA head offsets, positions inside and across blocks.
#include "engine/model/attention.h"

#include <cmath>
#include <cstring>
#include <random>
#include <utility>
#include <vector>

#include "engine/kv/block_pool.h"
#include "engine/kv/cpu_kv_storage.h"
#include "gtest/gtest.h"

namespace tandem::model::internal {
namespace {

// exp as attention.h documents it, one float at a time: Cody-Waite
// reduction with ln2 = 0.693359375 - 2.12194440e-4, Cephes expf's
// polynomial, times 2^n; 0 below -87.
float CephesExp(float x) {
  if (!(x > -87.0f)) return 0.0f;
  const float fx = x * 1.44269504088896341f + 0.5f;
  const float n = std::floor(fx);
  float r = x - n * 0.693359375f;
  r = r - n * -2.12194440e-4f;
  float p = 1.9875691500e-4f;
  p = p * r + 1.3981999507e-3f;
  p = p * r + 8.3334519073e-3f;
  p = p * r + 4.1665795894e-2f;
  p = p * r + 1.6666665459e-1f;
  p = p * r + 5.0000001201e-1f;
  p = p * (r * r) + r + 1.0f;
  return std::ldexp(p, static_cast<int>(n));
}

// One layer of two KV heads of head_dim in a `dtype` cache: 80 positions
// of random K and V written by WriteKvRows into five 16-row blocks, taken
// out of order from the pool. k and v keep the rows as written (F32).
struct RandomCache {
  static constexpr int32_t kPositions = 80;
  static kv::KvShape Shape(int32_t head_dim) {
    kv::KvShape shape;
    shape.n_layers = 1;
    shape.n_kv_heads = 2;
    shape.head_dim = head_dim;
    shape.block_size = 16;
    return shape;
  }
  RandomCache(kv::KvDtype dtype, int32_t head_dim, std::mt19937& rng)
      : kv(Shape(head_dim), 8, dtype), blocks(8), table(*blocks.Allocate(5)) {
    std::swap(table[0], table[3]);
    std::normal_distribution<float> normal(0.0f, 1.0f);
    k.resize(kPositions * 2 * static_cast<size_t>(head_dim));
    v.resize(k.size());
    for (float& x : k) x = normal(rng);
    for (float& x : v) x = normal(rng);
    kv::WriteKvRows(kv, table, 0, 0, kPositions, k.data(), v.data());
  }
  kv::CpuKvStorage kv;
  kv::BlockPool blocks;
  std::vector<int32_t> table;
  std::vector<float> k, v;
};

TEST(AttentionTest, CephesExpIsWithinTwoUlpOfExp) {
  EXPECT_EQ(CephesExp(0.0f), 1.0f);
  for (float x = -86.9f; x <= 0.0f; x += 0.0137f) {
    const float got = CephesExp(x), want = std::exp(x);
    EXPECT_LE(std::fabs(got - want), 2.0f * (std::nextafter(want, INFINITY) - want)) << x;
  }
  EXPECT_EQ(CephesExp(-88.0f), 0.0f);
}

// The order attention.h documents: s_j = (q . k_j) * scale (16 lanes (i mod
// 16) folded l + l+8 for head_dim >= 16, else 8 lanes (i mod 8); combined
// ((0+4)+(2+6))+((1+5)+(3+7)); tail in index order);
// e_j = CephesExp(s_j - max); sum in double over 4 lanes (j mod 4),
// combined (0+2)+(1+3); out[d] = sum_j (e_j * inv) v_j[d].
std::vector<float> Reference(const std::vector<std::vector<float>>& keys,
                             const std::vector<std::vector<float>>& values,
                             const std::vector<float>& q, float scale) {
  const size_t n = q.size();
  std::vector<float> s(keys.size());
  float max = -INFINITY;
  const size_t width = n >= 16 ? 16 : 8, nl = n / width * width;
  for (size_t j = 0; j < keys.size(); ++j) {
    float lane[16] = {};
    for (size_t i = 0; i < nl; ++i) lane[i % width] = lane[i % width] + q[i] * keys[j][i];
    float l8[8];
    for (size_t t = 0; t < 8; ++t) l8[t] = width == 16 ? lane[t] + lane[t + 8] : lane[t];
    float dot = ((l8[0] + l8[4]) + (l8[2] + l8[6])) + ((l8[1] + l8[5]) + (l8[3] + l8[7]));
    for (size_t i = nl; i < n; ++i) dot = dot + q[i] * keys[j][i];
    s[j] = dot * scale;
    max = std::max(max, s[j]);
  }
  double lanes[4] = {};
  for (size_t j = 0; j < s.size(); ++j) {
    s[j] = CephesExp(s[j] - max);
    lanes[j % 4] += s[j];
  }
  const double sum = (lanes[0] + lanes[2]) + (lanes[1] + lanes[3]);
  const float inv = static_cast<float>(1.0 / sum);
  std::vector<float> out(n, 0.0f);
  for (size_t j = 0; j < keys.size(); ++j) {
    const float p = s[j] * inv;
    for (size_t d = 0; d < n; ++d) out[d] = out[d] + p * values[j][d];
  }
  return out;
}

TEST(AttentionTest, EveryIsaEqualsTheScalarReference) {
  std::mt19937 rng(9);
  std::normal_distribution<float> normal(0.0f, 1.0f);
  for (int32_t head_dim : {8, 64, 72, 100, 128}) {
    kv::KvShape shape;
    shape.n_layers = 2;
    shape.n_kv_heads = 2;
    shape.head_dim = head_dim;
    shape.block_size = 16;
    kv::CpuKvStorage kv(shape, 8);
    kv::BlockPool blocks(8);
    std::vector<int32_t> table = *blocks.Allocate(5);
    std::swap(table[0], table[3]);  // blocks out of order in the storage
    const size_t kv_dim = 2 * static_cast<size_t>(head_dim);
    for (int32_t b : table) {
      for (int32_t l = 0; l < 2; ++l) {
        for (size_t i = 0; i < 16 * kv_dim; ++i) {
          kv.K(b, l)[i] = normal(rng);
          kv.V(b, l)[i] = normal(rng);
        }
      }
    }
    std::vector<float> q(static_cast<size_t>(head_dim));
    for (float& v : q) v = normal(rng);
    const float scale = 1.0f / std::sqrt(static_cast<float>(head_dim));
    for (int32_t pos : {0, 5, 15, 16, 47, 79}) {
      for (int32_t kv_head : {0, 1}) {
        std::vector<std::vector<float>> keys, values;
        for (int32_t j = 0; j <= pos; ++j) {
          const size_t row = static_cast<size_t>(j % 16) * kv_dim +
                             static_cast<size_t>(kv_head * head_dim);
          const int32_t b = table[static_cast<size_t>(j / 16)];
          keys.emplace_back(kv.K(b, 1) + row, kv.K(b, 1) + row + head_dim);
          values.emplace_back(kv.V(b, 1) + row, kv.V(b, 1) + row + head_dim);
        }
        const std::vector<float> want = Reference(keys, values, q, scale);
        AttentionSpan span{&kv, table, 1, kv_head, pos};
        for (KernelIsaKind isa :
             {KernelIsaKind::kGeneric, KernelIsaKind::kAvx2, KernelIsaKind::kAvx512}) {
          if (!KernelIsaSupported(isa)) continue;
          std::vector<float> out(static_cast<size_t>(head_dim), -1.0f);
          std::vector<float> scores(static_cast<size_t>(pos) + 1);
          AttendHeadWithIsa(isa, span, q.data(), scale, out.data(), scores.data());
          EXPECT_EQ(std::memcmp(out.data(), want.data(), want.size() * sizeof(float)), 0)
              << "head_dim " << head_dim << " pos " << pos << " kv_head " << kv_head << " "
              << KernelIsaName(isa);
        }
      }
    }
  }
}

// A 16-bit cache (F16, BF16): every ISA build, widening as it reads, equals
// the same scalar reference over the cache's values widened to F32
// (ReadKvRows), bit for bit, so the dtype changes the values and never the
// arithmetic.
TEST(AttentionTest, SixteenBitCachesEqualTheReferenceOverWidenedRows) {
  std::mt19937 rng(11);
  std::normal_distribution<float> normal(0.0f, 1.0f);
  for (kv::KvDtype dtype : {kv::KvDtype::kF16, kv::KvDtype::kBF16}) {
    for (int32_t head_dim : {8, 20, 64, 72, 128}) {
      RandomCache cache(dtype, head_dim, rng);
      kv::CpuKvStorage& kv = cache.kv;
      const std::vector<int32_t>& table = cache.table;
      const size_t kv_dim = 2 * static_cast<size_t>(head_dim);
      std::vector<float>& k = cache.k;
      std::vector<float>& v = cache.v;
      kv::ReadKvRows(kv, table, 0, 0, 80, k.data(), v.data());  // the rounded values
      std::vector<float> q(static_cast<size_t>(head_dim));
      for (float& x : q) x = normal(rng);
      const float scale = 1.0f / std::sqrt(static_cast<float>(head_dim));
      for (int32_t pos : {0, 3, 16, 47, 79}) {
        for (int32_t kv_head : {0, 1}) {
          std::vector<std::vector<float>> keys, values;
          for (int32_t j = 0; j <= pos; ++j) {
            const size_t row = static_cast<size_t>(j) * kv_dim +
                               static_cast<size_t>(kv_head * head_dim);
            keys.emplace_back(k.begin() + row, k.begin() + row + head_dim);
            values.emplace_back(v.begin() + row, v.begin() + row + head_dim);
          }
          const std::vector<float> want = Reference(keys, values, q, scale);
          AttentionSpan span{&kv, table, 0, kv_head, pos};
          for (KernelIsaKind isa :
               {KernelIsaKind::kGeneric, KernelIsaKind::kAvx2, KernelIsaKind::kAvx512}) {
            if (!KernelIsaSupported(isa)) continue;
            std::vector<float> out(static_cast<size_t>(head_dim), -1.0f);
            std::vector<float> scores(static_cast<size_t>(pos) + 1);
            AttendHeadWithIsa(isa, span, q.data(), scale, out.data(), scores.data());
            EXPECT_EQ(std::memcmp(out.data(), want.data(), want.size() * sizeof(float)), 0)
                << kv::KvDtypeName(dtype) << " head_dim " << head_dim << " pos " << pos
                << " kv_head " << kv_head << " " << KernelIsaName(isa);
          }
        }
      }
    }
  }
}

// AttendRow (every query head of a decode row, each K/V row read once)
// equals AttendHead head by head, bit for bit: each dtype, grouped-query
// (4 query heads per KV head) and plain, head_dims with and without a tail
// past the 16-lane loops, positions inside and across blocks, every ISA.
TEST(AttentionTest, AttendRowEqualsAttendHeadForEveryHead) {
  std::mt19937 rng(13);
  std::normal_distribution<float> normal(0.0f, 1.0f);
  for (kv::KvDtype dtype : {kv::KvDtype::kF32, kv::KvDtype::kF16, kv::KvDtype::kBF16}) {
    for (int32_t head_dim : {8, 20, 64}) {
      for (size_t group : {1, 4}) {
        RandomCache cache(dtype, head_dim, rng);
        const kv::CpuKvStorage& kv = cache.kv;
        const std::vector<int32_t>& table = cache.table;
        const size_t n_head = 2 * group, hd = static_cast<size_t>(head_dim);
        std::vector<float> q(n_head * hd);
        for (float& x : q) x = normal(rng);
        const float scale = 1.0f / std::sqrt(static_cast<float>(head_dim));
        for (int32_t pos : {0, 3, 15, 16, 47, 79}) {
          for (KernelIsaKind isa :
               {KernelIsaKind::kGeneric, KernelIsaKind::kAvx2, KernelIsaKind::kAvx512}) {
            if (!KernelIsaSupported(isa)) continue;
            std::vector<float> want(n_head * hd), got(n_head * hd, -1.0f);
            std::vector<float> scores(n_head * (static_cast<size_t>(pos) + 2));
            for (size_t h = 0; h < n_head; ++h) {
              AttentionSpan span{&kv, table, 0, static_cast<int32_t>(h / group), pos};
              AttendHeadWithIsa(isa, span, q.data() + h * hd, scale, want.data() + h * hd,
                                scores.data());
            }
            AttentionSpan row{&kv, table, 0, 0, pos};
            AttendRowWithIsa(isa, row, n_head, q.data(), scale, got.data(), scores.data());
            EXPECT_EQ(std::memcmp(got.data(), want.data(), want.size() * sizeof(float)), 0)
                << kv::KvDtypeName(dtype) << " head_dim " << head_dim << " group " << group
                << " pos " << pos << " " << KernelIsaName(isa);
          }
        }
      }
    }
  }
}

// AttendHeadPair (two rows of one head sharing their K/V reads) equals
// AttendHead row by row, bit for bit: each dtype, head_dims with and
// without tails, both KV heads, the rows at equal, adjacent and distant
// positions, inside and across blocks and 4-key groups, every ISA.
TEST(AttentionTest, AttendHeadPairEqualsAttendHeadForEachRow) {
  std::mt19937 rng(17);
  std::normal_distribution<float> normal(0.0f, 1.0f);
  const std::pair<int32_t, int32_t> positions[] = {{0, 0},   {0, 1},   {2, 3},  {3, 4},
                                                   {14, 15}, {15, 16}, {16, 16}, {30, 47},
                                                   {0, 79},  {78, 79}};
  for (kv::KvDtype dtype : {kv::KvDtype::kF32, kv::KvDtype::kF16, kv::KvDtype::kBF16}) {
    for (int32_t head_dim : {8, 20, 64, 72}) {
      RandomCache cache(dtype, head_dim, rng);
      const size_t hd = static_cast<size_t>(head_dim);
      std::vector<float> q(2 * hd);
      for (float& x : q) x = normal(rng);
      const float scale = 1.0f / std::sqrt(static_cast<float>(head_dim));
      for (const auto& [pos0, pos1] : positions) {
        for (int32_t kv_head : {0, 1}) {
          for (KernelIsaKind isa :
               {KernelIsaKind::kGeneric, KernelIsaKind::kAvx2, KernelIsaKind::kAvx512}) {
            if (!KernelIsaSupported(isa)) continue;
            std::vector<float> want(2 * hd), got(2 * hd, -1.0f);
            std::vector<float> scores(2 * (static_cast<size_t>(pos1) + 1));
            AttentionSpan first{&cache.kv, cache.table, 0, kv_head, pos0};
            AttendHeadWithIsa(isa, first, q.data(), scale, want.data(), scores.data());
            AttentionSpan second{&cache.kv, cache.table, 0, kv_head, pos1};
            AttendHeadWithIsa(isa, second, q.data() + hd, scale, want.data() + hd,
                              scores.data());
            AttendHeadPairWithIsa(isa, second, pos0, q.data(), q.data() + hd, scale,
                                  got.data(), got.data() + hd, scores.data());
            EXPECT_EQ(std::memcmp(got.data(), want.data(), want.size() * sizeof(float)), 0)
                << kv::KvDtypeName(dtype) << " head_dim " << head_dim << " positions " << pos0
                << ", " << pos1 << " kv_head " << kv_head << " " << KernelIsaName(isa);
          }
        }
      }
    }
  }
}

}  // namespace
}  // namespace tandem::model::internal
