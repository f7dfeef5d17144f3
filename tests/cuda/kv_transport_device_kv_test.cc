// CudaKvStorage as a kv::DeviceKvAccess (issue #16): GatherRows /
// ScatterRows / CopyFromPeer against the host path (WriteTokens /
// ReadTokens) byte for byte, ranges longer than one kernel's span, block
// sizes that differ between the peers, and the errors. Skips without a
// GPU.
#include <cuda_runtime.h>

#include <cstdint>
#include <cstring>
#include <initializer_list>
#include <memory>
#include <vector>

#include "engine/backend/cuda/cuda_kernels.h"
#include "engine/backend/cuda/cuda_kv_storage.h"
#include "gtest/gtest.h"
#include "tests/cuda/cuda_test_util.h"

namespace tandem::backend::cuda {
namespace {

std::unique_ptr<CudaKvStorage> Make(int32_t block_size, int32_t num_blocks, kv::KvDtype dtype,
                                    int32_t head_dim = 8) {
  absl::StatusOr<std::unique_ptr<CudaKvStorage>> s =
      CudaKvStorage::Create(kv::KvShape{2, 2, head_dim, block_size}, dtype, num_blocks);
  EXPECT_TRUE(s.ok()) << s.status();
  return s.ok() ? *std::move(s) : nullptr;
}

// count rows of `row_bytes` bytes, distinct per token and `salt`.
std::vector<char> Rows(int32_t count, size_t row_bytes, int salt) {
  std::vector<char> rows(static_cast<size_t>(count) * row_bytes);
  for (size_t i = 0; i < rows.size(); ++i) {
    rows[i] = static_cast<char>((i * 13 + static_cast<size_t>(salt) * 29 + i / row_bytes) % 253);
  }
  return rows;
}

std::vector<int32_t> Table(std::initializer_list<int32_t> ids) { return ids; }

// A device frame buffer with a stream.
struct Frame {
  explicit Frame(size_t bytes) : bytes(bytes) {
    EXPECT_EQ(cudaMalloc(&dev, bytes == 0 ? 1 : bytes), cudaSuccess);
    EXPECT_EQ(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking), cudaSuccess);
  }
  ~Frame() {
    cudaStreamDestroy(stream);
    cudaFree(dev);
  }
  std::vector<char> Download() {
    std::vector<char> host(bytes);
    EXPECT_EQ(cudaStreamSynchronize(stream), cudaSuccess);
    EXPECT_EQ(cudaMemcpy(host.data(), dev, bytes, cudaMemcpyDeviceToHost), cudaSuccess);
    return host;
  }
  void Upload(const std::vector<char>& host) {
    ASSERT_EQ(host.size(), bytes);
    ASSERT_EQ(cudaMemcpy(dev, host.data(), bytes, cudaMemcpyHostToDevice), cudaSuccess);
  }
  size_t bytes;
  void* dev = nullptr;
  cudaStream_t stream = nullptr;
};

void GatherScatterRoundTrip(kv::KvDtype dtype, int32_t head_dim) {
  auto kv = Make(4, 16, dtype, head_dim);
  ASSERT_NE(kv, nullptr);
  const size_t rb = kv->row_bytes();
  const std::vector<int32_t> a = Table({7, 3, 4, 0, 12});
  const int32_t start = 2, count = 15;  // tokens [2, 17): five blocks
  const std::vector<char> k = Rows(count, rb, 1), v = Rows(count, rb, 2);
  kv->WriteTokens(a, 1, start, count, k.data(), v.data());
  Frame frame(2 * count * rb);
  ASSERT_TRUE(kv->GatherRows(a, 1, start, count, frame.dev, frame.stream).ok());
  std::vector<char> want = k;
  want.insert(want.end(), v.begin(), v.end());
  EXPECT_EQ(frame.Download(), want);

  // Scatter into other blocks at the same token positions.
  const std::vector<int32_t> b = Table({1, 2, 9, 10, 11});
  ASSERT_TRUE(kv->ScatterRows(b, 1, start, count, frame.dev, frame.stream).ok());
  ASSERT_EQ(cudaStreamSynchronize(frame.stream), cudaSuccess);
  std::vector<char> k_back(k.size()), v_back(v.size());
  kv->ReadTokens(b, 1, start, count, k_back.data(), v_back.data());
  EXPECT_EQ(k_back, k);
  EXPECT_EQ(v_back, v);
  // Layer 0 of b is untouched (zeroed at Create).
  kv->ReadTokens(b, 0, start, count, k_back.data(), v_back.data());
  EXPECT_EQ(k_back, std::vector<char>(k.size(), 0));
}

TEST(KvTransportDeviceKvTest, GatherScatterRoundTripBf16) {
  TANDEM_REQUIRE_GPU();
  GatherScatterRoundTrip(kv::KvDtype::kBF16, 8);  // 32-byte rows: 16-byte words
}

TEST(KvTransportDeviceKvTest, GatherScatterRoundTripOddRows) {
  TANDEM_REQUIRE_GPU();
  GatherScatterRoundTrip(kv::KvDtype::kF16, 3);  // 12-byte rows: 4-byte words
}

// 1000 tokens of one-token blocks: three kernel spans (kKvSpanBlocks).
TEST(KvTransportDeviceKvTest, RangeLongerThanOneSpan) {
  TANDEM_REQUIRE_GPU();
  auto kv = Make(1, 1100, kv::KvDtype::kF32, 2);
  ASSERT_NE(kv, nullptr);
  const size_t rb = kv->row_bytes();
  const int32_t count = 1000;
  ASSERT_GT(count, 2 * kKvSpanBlocks);
  std::vector<int32_t> table(count);
  for (int32_t i = 0; i < count; ++i) table[static_cast<size_t>(i)] = (i * 7) % 1100;
  const std::vector<char> k = Rows(count, rb, 3), v = Rows(count, rb, 4);
  kv->WriteTokens(table, 0, 0, count, k.data(), v.data());
  Frame frame(2 * count * rb);
  ASSERT_TRUE(kv->GatherRows(table, 0, 0, count, frame.dev, frame.stream).ok());
  std::vector<char> want = k;
  want.insert(want.end(), v.begin(), v.end());
  EXPECT_EQ(frame.Download(), want);
}

// Token addressing on both sides: a peer with blocks of 8 tokens into
// blocks of 4, a range starting mid-block on both.
TEST(KvTransportDeviceKvTest, CopyFromPeerAcrossBlockSizes) {
  TANDEM_REQUIRE_GPU();
  auto peer = Make(8, 8, kv::KvDtype::kBF16);
  auto own = Make(4, 16, kv::KvDtype::kBF16);
  ASSERT_NE(peer, nullptr);
  ASSERT_NE(own, nullptr);
  const size_t rb = own->row_bytes();
  const std::vector<int32_t> peer_table = Table({5, 2, 6});      // 24 tokens
  const std::vector<int32_t> own_table = Table({9, 1, 3, 8, 0, 15});  // 24 tokens
  const int32_t start = 3, count = 19;
  const std::vector<char> k = Rows(count, rb, 5), v = Rows(count, rb, 6);
  peer->WriteTokens(peer_table, 1, start, count, k.data(), v.data());
  Frame frame(0);
  ASSERT_TRUE(own->CopyFromPeer(peer->pool_info(), peer_table, own_table, 1, start, count,
                                frame.stream)
                  .ok());
  ASSERT_EQ(cudaStreamSynchronize(frame.stream), cudaSuccess);
  std::vector<char> k_back(k.size()), v_back(v.size());
  own->ReadTokens(own_table, 1, start, count, k_back.data(), v_back.data());
  EXPECT_EQ(k_back, k);
  EXPECT_EQ(v_back, v);
}

TEST(KvTransportDeviceKvTest, PoolInfoAndLayerEvents) {
  TANDEM_REQUIRE_GPU();
  auto kv = Make(4, 16, kv::KvDtype::kBF16);
  ASSERT_NE(kv, nullptr);
  const kv::DevicePoolInfo info = kv->pool_info();
  EXPECT_EQ(info.k, kv->paged().k);
  EXPECT_EQ(info.v, kv->paged().v);
  EXPECT_EQ(info.layer_blocks, 17);  // the scratch block counted
  EXPECT_EQ(info.n_layers, 2);
  EXPECT_EQ(info.block_size, 4);
  EXPECT_EQ(info.kv_dim, 16);
  EXPECT_EQ(info.pool_bytes, uint64_t{2} * 17 * 4 * 16 * 2);
  int device = -1;
  ASSERT_EQ(cudaGetDevice(&device), cudaSuccess);
  EXPECT_EQ(kv->device_ordinal(), device);
  EXPECT_EQ(kv->layer_event(0), nullptr);
  cudaEvent_t event = nullptr;
  ASSERT_EQ(cudaEventCreateWithFlags(&event, cudaEventInterprocess | cudaEventDisableTiming),
            cudaSuccess);
  kv->SetLayerEvent(1, event);
  EXPECT_EQ(kv->layer_event(1), static_cast<void*>(event));
  EXPECT_EQ(kv->layer_event(2), nullptr);
  cudaIpcEventHandle_t handle;
  EXPECT_EQ(cudaIpcGetEventHandle(&handle, event), cudaSuccess);
  // A gather of layer 1 after the event's record runs.
  Frame frame(2 * 4 * kv->row_bytes());
  ASSERT_EQ(cudaEventRecord(event, frame.stream), cudaSuccess);
  EXPECT_TRUE(kv->GatherRows(Table({3}), 1, 0, 4, frame.dev, frame.stream).ok());
  EXPECT_EQ(frame.Download(), std::vector<char>(frame.bytes, 0));
  kv->SetLayerEvent(1, nullptr);
  cudaEventDestroy(event);
}

TEST(KvTransportDeviceKvTest, BadArgumentsEnqueueNothing) {
  TANDEM_REQUIRE_GPU();
  auto kv = Make(4, 16, kv::KvDtype::kBF16);
  auto f16 = Make(4, 16, kv::KvDtype::kF16);
  ASSERT_NE(kv, nullptr);
  ASSERT_NE(f16, nullptr);
  Frame frame(2 * 8 * kv->row_bytes());
  absl::Status s = kv->GatherRows(Table({1}), 0, 2, 4, frame.dev, frame.stream);  // 6 > 4
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(s.message().find("does not cover tokens [2, 6)"), std::string::npos) << s;
  s = kv->ScatterRows(Table({16}), 0, 0, 4, frame.dev, frame.stream);  // the scratch block
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(s.message().find("block id 16"), std::string::npos) << s;
  s = kv->GatherRows(Table({1}), 2, 0, 4, frame.dev, frame.stream);
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(s.message().find("layer 2 outside [0, 2)"), std::string::npos) << s;
  s = kv->CopyFromPeer(f16->pool_info(), Table({1}), Table({1}), 0, 0, 4, frame.stream);
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(s.message().find("dtype f16"), std::string::npos) << s;
  kv::DevicePoolInfo wide = kv->pool_info();
  wide.kv_dim = 32;
  s = kv->CopyFromPeer(wide, Table({1}), Table({1}), 0, 0, 4, frame.stream);
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(s.message().find("kv_dim 32"), std::string::npos) << s;
  s = kv->CopyFromPeer(kv->pool_info(), Table({1}), Table({1}), 0, 0, 8, frame.stream);
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(s.message().find("peer table"), std::string::npos) << s;
  EXPECT_EQ(cudaStreamQuery(frame.stream), cudaSuccess);  // nothing enqueued
}

}  // namespace
}  // namespace tandem::backend::cuda
