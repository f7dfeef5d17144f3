// The TCP-staged KV path (issue #16): a CUDA worker's rows cross to and
// from the KV transfer's host buffers through CudaKvStorage's pinned
// staging, in chunks (kv_staging.h, the loop CudaKvStorage::ReadTokens /
// WriteTokens run). Here the "device" is host memory and its copies are
// deferred until the wait, as an asynchronous stream's would be, so a loop
// that reused the staging too early or read it before the wait would copy
// wrong bytes. Runs without a GPU.
#include <cstdint>
#include <cstring>
#include <numeric>
#include <vector>

#include "engine/backend/cuda/kv_staging.h"
#include "gtest/gtest.h"

namespace tandem::backend::cuda {
namespace {

constexpr int32_t kBlockSize = 4;
constexpr int32_t kLayers = 2;
constexpr int32_t kLayerBlocks = 7;  // the last one is the scratch block
constexpr int32_t kMaxBlock = 6;
constexpr size_t kRowBytes = 12;  // e.g. 6 BF16 elements

// K and V pools in the layout of cuda_kernels.h's PagedKv, with deferred
// copies, plus a staging of `staging_bytes` per pool.
class HostStandIn {
 public:
  explicit HostStandIn(size_t staging_bytes)
      : staging_bytes_(staging_bytes),
        stage_{std::vector<char>(staging_bytes), std::vector<char>(staging_bytes)} {
    const size_t pool_bytes = static_cast<size_t>(kLayers) * kLayerBlocks * kBlockSize * kRowBytes;
    for (int kv = 0; kv < 2; ++kv) {
      pool_[kv].resize(pool_bytes);
      // Every pool byte distinct per pool and position.
      for (size_t i = 0; i < pool_bytes; ++i) {
        pool_[kv][i] = static_cast<char>((i * 7 + static_cast<size_t>(kv) * 101) % 251);
      }
    }
  }

  absl::Status Copy(const KvStagingRange& r, bool to_device, char* host_k, char* host_v) {
    char* const stage[2] = {stage_[0].data(), stage_[1].data()};
    char* const host[2] = {host_k, host_v};
    return CopyKvThroughStaging(
        r, to_device, stage, staging_bytes_, host,
        [&](int kv, size_t pool_offset, size_t stage_offset, size_t bytes) {
          EXPECT_LE(stage_offset + bytes, staging_bytes_) << "a copy past the staging";
          EXPECT_LE(pool_offset + bytes, pool_[kv].size()) << "a copy past the pool";
          pending_.push_back({to_device, kv, pool_offset, stage_offset, bytes});
          ++copies_;
        },
        [&] {
          size_t chunk_bytes = 0;
          for (const Pending& p : pending_) {
            char* pool = pool_[p.kv].data() + p.pool_offset;
            char* stage = stage_[p.kv].data() + p.stage_offset;
            if (p.to_device) {
              std::memcpy(pool, stage, p.bytes);
            } else {
              std::memcpy(stage, pool, p.bytes);
            }
            if (p.kv == 0) chunk_bytes += p.bytes;
          }
          pending_.clear();
          chunk_rows_.push_back(static_cast<int32_t>(chunk_bytes / kRowBytes));
        });
  }

  // The pool row (layer, block, slot) of K (kv 0) or V.
  const char* Row(int kv, int32_t layer, int32_t block, int32_t slot) const {
    return pool_[kv].data() +
           ((static_cast<size_t>(layer) * kLayerBlocks + block) * kBlockSize + slot) * kRowBytes;
  }
  const std::vector<char>& pool(int kv) const { return pool_[kv]; }
  std::vector<int32_t> chunk_rows() const { return chunk_rows_; }
  int copies() const { return copies_; }

 private:
  struct Pending {
    bool to_device;
    int kv;
    size_t pool_offset, stage_offset, bytes;
  };
  const size_t staging_bytes_;
  std::vector<char> pool_[2];
  std::vector<char> stage_[2];
  std::vector<Pending> pending_;
  std::vector<int32_t> chunk_rows_;
  int copies_ = 0;
};

KvStagingRange Range(const std::vector<int32_t>& table, int32_t layer, int32_t start,
                     int32_t count) {
  KvStagingRange r;
  r.block_table = table;
  r.layer = layer;
  r.layer_blocks = kLayerBlocks;
  r.max_block = kMaxBlock;
  r.block_size = kBlockSize;
  r.token_start = start;
  r.count = count;
  r.row_bytes = kRowBytes;
  return r;
}

// Reading 14 tokens (from slot 3 of the first block, across five blocks,
// two of them consecutive) through a staging of 5 rows: chunks of 5, 5, 4
// rows, and every host row is exactly its pool row.
TEST(KvTransportTcpStagedTest, ReadLargerThanStagingAcrossBlocks) {
  HostStandIn dev(5 * kRowBytes);
  const std::vector<int32_t> table = {4, 1, 2, 0, 5};
  const int32_t start = 3, count = 14;
  std::vector<char> k(count * kRowBytes), v(count * kRowBytes);
  ASSERT_TRUE(dev.Copy(Range(table, 1, start, count), false, k.data(), v.data()).ok());
  EXPECT_EQ(dev.chunk_rows(), (std::vector<int32_t>{5, 5, 4}));
  for (int32_t i = 0; i < count; ++i) {
    const int32_t t = start + i;
    const int32_t block = table[static_cast<size_t>(t / kBlockSize)];
    EXPECT_EQ(std::memcmp(k.data() + i * kRowBytes, dev.Row(0, 1, block, t % kBlockSize),
                          kRowBytes),
              0)
        << "K token " << t;
    EXPECT_EQ(std::memcmp(v.data() + i * kRowBytes, dev.Row(1, 1, block, t % kBlockSize),
                          kRowBytes),
              0)
        << "V token " << t;
  }
}

// A staging that is not a whole number of rows (70 bytes: 5 rows of 12):
// chunks of 5 rows, chunk boundaries inside blocks (tokens 7 and 12: slot
// 3 of the second block, slot 0 of the fourth), exact bytes written, every
// other pool byte kept.
TEST(KvTransportTcpStagedTest, WriteChunksOnRowBoundariesAndTouchesOnlyItsRows) {
  HostStandIn dev(70);
  const std::vector<int32_t> table = {3, 2, 1, 0};
  const int32_t start = 2, count = 13;  // tokens [2, 15)
  std::vector<char> k(count * kRowBytes), v(count * kRowBytes);
  std::iota(k.begin(), k.end(), static_cast<char>(1));
  std::iota(v.begin(), v.end(), static_cast<char>(-100));
  const std::vector<char> k_before = dev.pool(0), v_before = dev.pool(1);
  ASSERT_TRUE(dev.Copy(Range(table, 0, start, count), true, k.data(), v.data()).ok());
  EXPECT_EQ(dev.chunk_rows(), (std::vector<int32_t>{5, 5, 3}));
  std::vector<char> k_want = k_before, v_want = v_before;
  for (int32_t i = 0; i < count; ++i) {
    const int32_t t = start + i;
    const size_t row =
        (static_cast<size_t>(table[static_cast<size_t>(t / kBlockSize)]) * kBlockSize +
         t % kBlockSize) *
        kRowBytes;  // layer 0
    std::memcpy(k_want.data() + row, k.data() + i * kRowBytes, kRowBytes);
    std::memcpy(v_want.data() + row, v.data() + i * kRowBytes, kRowBytes);
  }
  EXPECT_EQ(dev.pool(0), k_want);
  EXPECT_EQ(dev.pool(1), v_want);

  // And reading it back gives the same rows.
  std::vector<char> k_back(k.size()), v_back(v.size());
  ASSERT_TRUE(dev.Copy(Range(table, 0, start, count), false, k_back.data(), v_back.data()).ok());
  EXPECT_EQ(k_back, k);
  EXPECT_EQ(v_back, v);
}

// Consecutive block ids make one copy per pool for the whole chunk; a
// staging larger than the range is one chunk.
TEST(KvTransportTcpStagedTest, ConsecutiveBlocksAreOneCopyPerPool) {
  HostStandIn dev(64 * kRowBytes);
  const std::vector<int32_t> table = {1, 2, 3};
  std::vector<char> k(12 * kRowBytes), v(12 * kRowBytes);
  ASSERT_TRUE(dev.Copy(Range(table, 1, 0, 12), false, k.data(), v.data()).ok());
  EXPECT_EQ(dev.chunk_rows(), (std::vector<int32_t>{12}));
  EXPECT_EQ(dev.copies(), 2);
  EXPECT_EQ(std::memcmp(k.data(), dev.Row(0, 1, 1, 0), 12 * kRowBytes), 0);
  EXPECT_EQ(std::memcmp(v.data(), dev.Row(1, 1, 1, 0), 12 * kRowBytes), 0);
}

// Bad ranges copy nothing and name the problem; count 0 copies nothing.
TEST(KvTransportTcpStagedTest, BadRangesCopyNothing) {
  HostStandIn dev(5 * kRowBytes);
  std::vector<char> k(64 * kRowBytes), v(64 * kRowBytes);
  const std::vector<int32_t> table = {0, 1};
  absl::Status s = dev.Copy(Range(table, 0, 4, 5), false, k.data(), v.data());  // 9 > 8 tokens
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(s.message().find("does not cover tokens [4, 9)"), std::string::npos) << s;
  const std::vector<int32_t> bad_block = {0, kMaxBlock};  // the scratch block
  s = dev.Copy(Range(bad_block, 0, 0, 8), true, k.data(), v.data());
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(s.message().find("block id 6 of token 4"), std::string::npos) << s;
  HostStandIn tiny(kRowBytes - 1);
  s = tiny.Copy(Range(table, 0, 0, 1), false, k.data(), v.data());
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(s.message().find("holds no row of 12 bytes"), std::string::npos) << s;
  EXPECT_EQ(dev.copies() + tiny.copies(), 0);
  EXPECT_TRUE(dev.chunk_rows().empty());

  ASSERT_TRUE(dev.Copy(Range(table, 0, 3, 0), false, k.data(), v.data()).ok());
  EXPECT_EQ(dev.copies(), 0);
  EXPECT_TRUE(dev.chunk_rows().empty());
}

}  // namespace
}  // namespace tandem::backend::cuda
