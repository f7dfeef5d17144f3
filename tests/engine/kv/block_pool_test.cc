#include "engine/kv/block_pool.h"

#include "engine/kv/cpu_kv_storage.h"

#include <algorithm>
#include <cstring>
#include <numeric>
#include <vector>

#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace tandem::kv {
namespace {

using ::testing::ElementsAre;

KvShape SmallShape() {
  KvShape shape;
  shape.n_layers = 2;
  shape.n_kv_heads = 2;
  shape.head_dim = 3;
  shape.block_size = 4;
  return shape;
}

TEST(BlockPoolTest, AllocatesInFifoOrder) {
  BlockPool pool(5);
  EXPECT_EQ(pool.num_blocks(), 5);
  EXPECT_EQ(pool.num_free(), 5);
  auto a = pool.Allocate(2);
  ASSERT_TRUE(a.has_value());
  EXPECT_THAT(*a, ElementsAre(0, 1));
  auto b = pool.Allocate(2);
  ASSERT_TRUE(b.has_value());
  EXPECT_THAT(*b, ElementsAre(2, 3));
  EXPECT_EQ(pool.num_free(), 1);
  EXPECT_EQ(pool.num_in_use(), 4);

  // Freed blocks go to the tail, behind block 4.
  pool.Free({3, 0});
  EXPECT_EQ(pool.num_free(), 3);
  auto c = pool.Allocate(3);
  ASSERT_TRUE(c.has_value());
  EXPECT_THAT(*c, ElementsAre(4, 3, 0));
  EXPECT_EQ(pool.num_free(), 0);
}

TEST(BlockPoolTest, ZeroBlocksIsEmptyAllocation) {
  BlockPool pool(2);
  auto a = pool.Allocate(0);
  ASSERT_TRUE(a.has_value());
  EXPECT_TRUE(a->empty());
  EXPECT_EQ(pool.num_free(), 2);
}

TEST(BlockPoolTest, FailedAllocationLeavesPoolUnchanged) {
  BlockPool pool(3);
  ASSERT_TRUE(pool.Allocate(1).has_value());  // takes 0
  EXPECT_FALSE(pool.Allocate(3).has_value());
  EXPECT_EQ(pool.num_free(), 2);
  EXPECT_EQ(pool.num_in_use(), 1);
  auto a = pool.Allocate(2);
  ASSERT_TRUE(a.has_value());
  EXPECT_THAT(*a, ElementsAre(1, 2));
}

TEST(CpuKvStorageTest, StartsZeroedAndBlocksDoNotOverlap) {
  const KvShape shape = SmallShape();
  CpuKvStorage pool(shape, 3);
  const int32_t slab = shape.block_size * shape.kv_dim();
  for (int32_t b = 0; b < 3; ++b) {
    for (int32_t l = 0; l < shape.n_layers; ++l) {
      for (int32_t i = 0; i < slab; ++i) {
        ASSERT_EQ(pool.K(b, l)[i], 0.0f);
        ASSERT_EQ(pool.V(b, l)[i], 0.0f);
      }
    }
  }
  // Fill every slab with a distinct value; each must keep its own.
  for (int32_t b = 0; b < 3; ++b) {
    for (int32_t l = 0; l < shape.n_layers; ++l) {
      std::fill(pool.K(b, l), pool.K(b, l) + slab, static_cast<float>(b * 10 + l * 2));
      std::fill(pool.V(b, l), pool.V(b, l) + slab, static_cast<float>(b * 10 + l * 2 + 1));
    }
  }
  const CpuKvStorage& cpool = pool;
  for (int32_t b = 0; b < 3; ++b) {
    for (int32_t l = 0; l < shape.n_layers; ++l) {
      for (int32_t i = 0; i < slab; ++i) {
        ASSERT_EQ(cpool.K(b, l)[i], static_cast<float>(b * 10 + l * 2));
        ASSERT_EQ(cpool.V(b, l)[i], static_cast<float>(b * 10 + l * 2 + 1));
      }
    }
  }
}

TEST(KvStorageTest, BlocksForTokens) {
  EXPECT_EQ(BlocksForTokens(0, 16), 0);
  EXPECT_EQ(BlocksForTokens(1, 16), 1);
  EXPECT_EQ(BlocksForTokens(16, 16), 1);
  EXPECT_EQ(BlocksForTokens(17, 16), 2);
  EXPECT_EQ(BlocksForTokens(313, 16), 20);
}

TEST(CpuKvStorageTest, KvRowsRoundTripAcrossBlockBoundaries) {
  const KvShape shape = SmallShape();  // block_size 4, kv_dim 6
  CpuKvStorage pool(shape, 6);
  const std::vector<int32_t> table = {5, 1, 3};  // tokens 0..11
  const int32_t dim = shape.kv_dim();
  const int32_t start = 2, count = 7;  // spans all three blocks
  std::vector<float> k(static_cast<size_t>(count * dim)), v(k.size());
  std::iota(k.begin(), k.end(), 100.0f);
  std::iota(v.begin(), v.end(), 500.0f);
  WriteKvRows(pool, table, /*layer=*/1, start, count, k.data(), v.data());

  // Token addressing: token t is in block table[t / 4], slot t % 4.
  EXPECT_EQ(pool.K(5, 1)[2 * dim], 100.0f);          // token 2
  EXPECT_EQ(pool.K(1, 1)[0], 100.0f + 2 * dim);      // token 4
  EXPECT_EQ(pool.V(3, 1)[0 * dim + 1], 501.0f + 6 * dim);  // token 8
  EXPECT_EQ(pool.K(5, 0)[2 * dim], 0.0f);            // other layer untouched
  EXPECT_EQ(pool.K(3, 1)[1 * dim], 0.0f);            // token 9 untouched

  std::vector<float> k2(k.size(), -1.0f), v2(v.size(), -1.0f);
  ReadKvRows(pool, table, 1, start, count, k2.data(), v2.data());
  EXPECT_EQ(k2, k);
  EXPECT_EQ(v2, v);

  // A sub-range read returns the matching slice.
  std::vector<float> k3(static_cast<size_t>(2 * dim)), v3(k3.size());
  ReadKvRows(pool, table, 1, 3, 2, k3.data(), v3.data());
  EXPECT_EQ(k3, std::vector<float>(k.begin() + dim, k.begin() + 3 * dim));
  EXPECT_EQ(v3, std::vector<float>(v.begin() + dim, v.begin() + 3 * dim));
}

// The byte interface (what KV transfer and other backends use) moves the
// same bytes as the float helpers: row_bytes() per token and layer.
TEST(CpuKvStorageTest, TokenBytesAreTheF32Rows) {
  const KvShape shape = SmallShape();
  CpuKvStorage storage(shape, 4);
  const KvStorage& as_interface = storage;
  EXPECT_EQ(as_interface.dtype(), KvDtype::kF32);
  EXPECT_EQ(as_interface.row_bytes(), 6u * sizeof(float));
  EXPECT_STREQ(KvDtypeName(as_interface.dtype()), "f32");
  const std::vector<int32_t> table = {2, 0};
  std::vector<float> k(3 * 6), v(3 * 6);
  std::iota(k.begin(), k.end(), 1.0f);
  std::iota(v.begin(), v.end(), 50.0f);
  storage.WriteTokens(table, 0, 3, 3, reinterpret_cast<const char*>(k.data()),
                      reinterpret_cast<const char*>(v.data()));
  EXPECT_EQ(storage.K(2, 0)[3 * 6], 1.0f);  // token 3: block 2, slot 3
  EXPECT_EQ(storage.V(0, 0)[0], 50.0f + 6);  // token 4: block 0, slot 0
  std::vector<char> kb(k.size() * sizeof(float)), vb(kb.size());
  storage.ReadTokens(table, 0, 3, 3, kb.data(), vb.data());
  EXPECT_EQ(std::memcmp(kb.data(), k.data(), kb.size()), 0);
  EXPECT_EQ(std::memcmp(vb.data(), v.data(), vb.size()), 0);
}

TEST(BlockPoolDeathTest, DoubleFreeAborts) {
  BlockPool pool(2);
  auto a = pool.Allocate(1);
  ASSERT_TRUE(a.has_value());
  pool.Free(*a);
  EXPECT_DEATH(pool.Free(*a), "");
}

}  // namespace
}  // namespace tandem::kv
