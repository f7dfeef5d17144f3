// CpuKvStorage in F16 and BF16 (cpu_kv_storage.h): half the bytes of F32,
// WriteKvRows rounds each float as kv_convert.h says (ggml's rounding),
// ReadKvRows widens exactly, ReadTokens / WriteTokens move the raw 16-bit
// rows (what the KV transfer sends) and token addressing crosses blocks as
// in F32.
#include <cstdint>
#include <cstring>
#include <vector>

#include "engine/gguf/half.h"
#include "engine/kv/cpu_kv_storage.h"
#include "engine/kv/kv_convert.h"
#include "gtest/gtest.h"

namespace tandem::kv {
namespace {

KvShape Shape() {
  KvShape s;
  s.n_layers = 2;
  s.n_kv_heads = 2;
  s.head_dim = 3;
  s.block_size = 4;
  return s;
}

// A float that needs rounding in both 16-bit types (and some that tie).
float Value(size_t i) {
  return (static_cast<float>(i) + 0.3f) * (i % 2 == 0 ? 1.0f : -1.0f) / 7.0f +
         (i % 5 == 0 ? 1.0f + 0x1p-11f : 0.0f);
}

// The element of `dtype` a float rounds to, widened back.
float Rounded(KvDtype dtype, float x) {
  switch (dtype) {
    case KvDtype::kF32: return x;
    case KvDtype::kF16: return gguf::HalfToFloat(FloatToF16(x));
    case KvDtype::kBF16: return Bf16ToFloat(FloatToBf16(x));
  }
  return x;
}

class CpuKvStorageDtypeTest : public ::testing::TestWithParam<KvDtype> {};

TEST_P(CpuKvStorageDtypeTest, SizesFollowTheDtype) {
  const KvDtype dtype = GetParam();
  CpuKvStorage storage(Shape(), 5, dtype);
  EXPECT_EQ(storage.dtype(), dtype);
  EXPECT_EQ(storage.row_bytes(), 6u * KvDtypeBytes(dtype));
  // 5 blocks x 2 layers x (K + V) x 4 slots x 6 elements.
  EXPECT_EQ(CpuKvStorage::BytesFor(Shape(), 5, dtype), 5u * 2 * 2 * 4 * 6 * KvDtypeBytes(dtype));
  EXPECT_EQ(CpuKvStorage::BytesFor(Shape(), 5, KvDtype::kF16) * 2,
            CpuKvStorage::BytesFor(Shape(), 5, KvDtype::kF32));
  // Slabs are laid out as the header says: V right after K, then the next layer.
  EXPECT_EQ(storage.VData(1, 0) - storage.KData(1, 0), 24 * KvDtypeBytes(dtype));
  EXPECT_EQ(storage.KData(1, 1) - storage.KData(1, 0), 48 * KvDtypeBytes(dtype));
  EXPECT_EQ(storage.KData(2, 0) - storage.KData(1, 0), 96 * KvDtypeBytes(dtype));
}

TEST_P(CpuKvStorageDtypeTest, FloatRowsRoundOnWriteAndWidenOnRead) {
  const KvDtype dtype = GetParam();
  CpuKvStorage storage(Shape(), 6, dtype);
  const std::vector<int32_t> table = {5, 1, 3};
  const int32_t start = 2, count = 7;  // spans all three blocks
  std::vector<float> k(static_cast<size_t>(count) * 6), v(k.size());
  for (size_t i = 0; i < k.size(); ++i) {
    k[i] = Value(i);
    v[i] = Value(i + 1000);
  }
  WriteKvRows(storage, table, 1, start, count, k.data(), v.data());
  std::vector<float> k2(k.size(), -1.0f), v2(v.size(), -1.0f);
  ReadKvRows(storage, table, 1, start, count, k2.data(), v2.data());
  for (size_t i = 0; i < k.size(); ++i) {
    ASSERT_EQ(k2[i], Rounded(dtype, k[i])) << i;
    ASSERT_EQ(v2[i], Rounded(dtype, v[i])) << i;
  }
  // Token 4 is slot 0 of block 1; its bytes are the rounded elements.
  std::vector<char> want(6 * KvDtypeBytes(dtype));
  FloatsToKv(dtype, &k[2 * 6], 6, want.data());
  EXPECT_EQ(std::memcmp(storage.KData(1, 1), want.data(), want.size()), 0);
  // Layer 0 and token 9 stay zero.
  std::vector<char> zero(6 * KvDtypeBytes(dtype), 0);
  EXPECT_EQ(std::memcmp(storage.KData(5, 0) + 2 * zero.size(), zero.data(), zero.size()), 0);
  EXPECT_EQ(std::memcmp(storage.KData(3, 1) + zero.size(), zero.data(), zero.size()), 0);
}

// What a KV transfer does: raw rows out of one storage, into another, and
// the second reads the same floats.
TEST_P(CpuKvStorageDtypeTest, TokenBytesRoundTripBetweenStorages) {
  const KvDtype dtype = GetParam();
  CpuKvStorage sender(Shape(), 4, dtype);
  KvShape other = Shape();
  other.block_size = 3;  // token addressing: block sizes may differ
  CpuKvStorage receiver(other, 8, dtype);
  const std::vector<int32_t> send_table = {2, 0, 3};
  const std::vector<int32_t> recv_table = {7, 1, 4, 6};
  std::vector<float> k(11 * 6), v(k.size());
  for (size_t i = 0; i < k.size(); ++i) {
    k[i] = Value(3 * i);
    v[i] = Value(3 * i + 1);
  }
  WriteKvRows(sender, send_table, 0, 0, 11, k.data(), v.data());
  const size_t bytes = 11 * sender.row_bytes();
  std::vector<char> kb(bytes), vb(bytes);
  sender.ReadTokens(send_table, 0, 0, 11, kb.data(), vb.data());
  receiver.WriteTokens(recv_table, 0, 0, 11, kb.data(), vb.data());
  std::vector<char> kb2(bytes), vb2(bytes);
  receiver.ReadTokens(recv_table, 0, 0, 11, kb2.data(), vb2.data());
  EXPECT_EQ(kb, kb2);
  EXPECT_EQ(vb, vb2);
  std::vector<float> k2(k.size()), v2(v.size());
  ReadKvRows(receiver, recv_table, 0, 0, 11, k2.data(), v2.data());
  for (size_t i = 0; i < k.size(); ++i) {
    ASSERT_EQ(k2[i], Rounded(dtype, k[i])) << i;
    ASSERT_EQ(v2[i], Rounded(dtype, v[i])) << i;
  }
}

INSTANTIATE_TEST_SUITE_P(Dtypes, CpuKvStorageDtypeTest,
                         ::testing::Values(KvDtype::kF32, KvDtype::kF16, KvDtype::kBF16),
                         [](const ::testing::TestParamInfo<KvDtype>& info) {
                           return std::string(KvDtypeName(info.param));
                         });

TEST(CpuKvStorageDtypeDeathTest, FloatAccessorsAbortOnA16BitStorage) {
  CpuKvStorage storage(Shape(), 1, KvDtype::kF16);
  EXPECT_DEATH(storage.K(0, 0), "");
}

}  // namespace
}  // namespace tandem::kv
