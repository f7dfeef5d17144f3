// Dequantization of Q4_0, Q4_1, Q5_0, Q5_1, Q4_K, Q5_K and Q6_K against
// llama.cpp's own to_float: ../shared/models/kq-tiny-*.dequant-ref.gguf
// hold rows of every quantized tensor of kq-tiny-*.gguf dequantized by
// llama.cpp c392e50 (keys tandem.source_type.<tensor>, tandem.rows.<tensor>).
// Every ISA path must give those bits exactly (memcmp).
#include <cstring>
#include <string>
#include <vector>

#include "engine/gguf/gguf_file.h"
#include "engine/model/quant_blocks.h"
#include "engine/model/weight_matrix.h"
#include "gtest/gtest.h"
#include "tests/test_util.h"

namespace tandem::model::internal {
namespace {

using gguf::GgufFile;

class DequantRefTest : public ::testing::TestWithParam<std::string> {};

TEST_P(DequantRefTest, EveryIsaMatchesLlamaCppBitForBit) {
  const std::string model = testing::SharedPath("models/kq-tiny-" + GetParam() + ".gguf");
  const std::string ref = testing::SharedPath("models/kq-tiny-" + GetParam() + ".dequant-ref.gguf");
  absl::StatusOr<std::unique_ptr<GgufFile>> src = GgufFile::Open(model);
  absl::StatusOr<std::unique_ptr<GgufFile>> want = GgufFile::Open(ref);
  ASSERT_TRUE(src.ok()) << src.status();
  ASSERT_TRUE(want.ok()) << want.status();
  int tensors = 0;
  for (const gguf::TensorInfo& r : (*want)->tensors()) {
    SCOPED_TRACE(r.name);
    const gguf::TensorInfo* s = (*src)->FindTensor(r.name);
    ASSERT_NE(s, nullptr);
    absl::StatusOr<std::string> type = (*want)->GetString("tandem.source_type." + r.name);
    absl::StatusOr<uint64_t> rows = (*want)->GetUint("tandem.rows." + r.name);
    ASSERT_TRUE(type.ok() && rows.ok());
    EXPECT_EQ(gguf::TensorTypeName(s->type), *type);
    EXPECT_TRUE(IsQuantized(s->type));
    ASSERT_EQ(r.type, gguf::TensorType::kF32);
    ASSERT_EQ(r.dims.size(), 2u);
    ASSERT_EQ(r.dims[0], s->dims[0]);
    ASSERT_EQ(r.dims[1], *rows);
    const size_t n = r.dims[0] * r.dims[1];  // the first `rows` rows
    for (DequantIsa isa : {DequantIsa::kGeneric, DequantIsa::kAvx2, DequantIsa::kAvx512}) {
      std::vector<float> got(n, -1.0f);
      if (!ConvertToF32With(isa, s->type, s->data, n, got.data())) continue;  // not on this CPU
      EXPECT_EQ(std::memcmp(got.data(), r.data, n * sizeof(float)), 0)
          << "isa " << static_cast<int>(isa);
    }
    // One weight at a time (the kernels' scalar tail) agrees too.
    const size_t block = gguf::TensorBlockSize(s->type);
    const size_t block_bytes = gguf::TensorBlockBytes(s->type);
    const float* want_f = reinterpret_cast<const float*>(r.data);
    for (size_t e = 0; e < n; e += 97) {
      const float one = DequantizeOne(s->type, s->data + e / block * block_bytes, e % block);
      ASSERT_EQ(std::memcmp(&one, want_f + e, sizeof one), 0) << "weight " << e;
    }
    ++tensors;
  }
  EXPECT_GE(tensors, 16);
}

INSTANTIATE_TEST_SUITE_P(KqTiny, DequantRefTest,
                         ::testing::Values("q4_k_m", "q5_k_m", "q4_0", "legacy"));

}  // namespace
}  // namespace tandem::model::internal
