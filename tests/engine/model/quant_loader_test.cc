// What the loader refuses in a quantized file, naming the tensor: a type
// Tandem does not read (by ggml's name), a row length that is not whole
// blocks (32 for the legacy types, 256 for the K-quants), tensor data that
// does not fit the file, and a non-finite block scale. Each case patches a
// byte copy of a ../shared kq-tiny file.
#include <cstdint>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <limits>
#include <string>

#include "engine/gguf/gguf_file.h"
#include "engine/model/llama_model.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "tests/test_util.h"

namespace tandem::model {
namespace {

using ::testing::HasSubstr;

std::string ReadShared(const std::string& model) {
  std::ifstream in(tandem::testing::SharedPath("models/" + model), std::ios::binary);
  return std::string(std::istreambuf_iterator<char>(in), {});
}

// Opens and loads `bytes` as a GGUF file; the first error.
absl::Status LoadBytes(const std::string& bytes, const std::string& name) {
  const std::string path = ::testing::TempDir() + "/" + name + ".gguf";
  std::ofstream(path, std::ios::binary) << bytes;
  absl::StatusOr<std::unique_ptr<gguf::GgufFile>> f = gguf::GgufFile::Open(path);
  std::filesystem::remove(path);
  if (!f.ok()) return f.status();
  return LlamaModel::Load(**f).status();
}

// Byte offset of tensor `name`'s info record's field after its name: the
// GGUF tensor info is {u64 len; name; u32 n_dims; u64 ne[n_dims]; u32 type;
// u64 offset} (GGUF spec, "tensor_info_t").
size_t InfoAfterName(const std::string& bytes, const std::string& name) {
  const std::string key = std::string(1, static_cast<char>(name.size())) +
                          std::string(7, '\0') + name;
  const size_t pos = bytes.find(key);
  EXPECT_NE(pos, std::string::npos) << name;
  return pos + key.size();
}

template <typename T>
void Put(std::string& bytes, size_t at, T v) {
  std::memcpy(&bytes[at], &v, sizeof v);
}

// Absolute file offset of tensor `name`'s data.
uint64_t DataOffset(const std::string& model, const std::string& name) {
  absl::StatusOr<std::unique_ptr<gguf::GgufFile>> f =
      gguf::GgufFile::Open(tandem::testing::SharedPath("models/" + model));
  EXPECT_TRUE(f.ok()) << f.status();
  const gguf::TensorInfo* t = (*f)->FindTensor(name);
  EXPECT_NE(t, nullptr) << name;
  return t->offset;
}

TEST(QuantLoaderTest, UnsupportedTypesAreRefusedByName) {
  const std::string base = ReadShared("kq-tiny-q4_k_m.gguf");
  const size_t type_at = InfoAfterName(base, "blk.1.attn_q.weight") + 4 + 2 * 8;
  for (auto [type, name] : {std::pair<uint32_t, const char*>{10, "Q2_K"},
                            {11, "Q3_K"},
                            {23, "IQ4_XS"},
                            {34, "TQ1_0"},
                            {200, "200, which ggml does not define"}}) {
    std::string bytes = base;
    Put<uint32_t>(bytes, type_at, type);
    const absl::Status s = LoadBytes(bytes, "unsupported");
    EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument) << s;
    EXPECT_THAT(s.message(), HasSubstr("tensor 'blk.1.attn_q.weight'"));
    EXPECT_THAT(s.message(), HasSubstr(absl::StrCat("tensor type ", name)));
    EXPECT_THAT(s.message(), HasSubstr("Q4_K, Q5_K, Q6_K"));
  }
}

TEST(QuantLoaderTest, RowsThatAreNotWholeBlocksAreRefused) {
  // [256, 128] -> [128, 256]: the same bytes, rows of 128 < 256 (Q4_K).
  std::string k = ReadShared("kq-tiny-q4_k_m.gguf");
  const size_t k_dims = InfoAfterName(k, "blk.0.attn_k.weight") + 4;
  Put<uint64_t>(k, k_dims, 128);
  Put<uint64_t>(k, k_dims + 8, 256);
  absl::Status s = LoadBytes(k, "k_rows");
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument) << s;
  EXPECT_THAT(s.message(), HasSubstr("tensor 'blk.0.attn_k.weight' ne[0] = 128 is not a "
                                     "multiple of the Q4_K block size 256"));
  // Q4_1 (legacy file): rows of 16 < 32.
  std::string legacy = ReadShared("kq-tiny-legacy.gguf");
  const size_t l_dims = InfoAfterName(legacy, "blk.0.attn_k.weight") + 4;
  Put<uint64_t>(legacy, l_dims, 16);
  Put<uint64_t>(legacy, l_dims + 8, 2048);
  s = LoadBytes(legacy, "legacy_rows");
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument) << s;
  EXPECT_THAT(s.message(), HasSubstr("tensor 'blk.0.attn_k.weight' ne[0] = 16 is not a "
                                     "multiple of the Q4_1 block size 32"));
}

TEST(QuantLoaderTest, DataThatDoesNotFitTheFileIsRefused) {
  std::string bytes = ReadShared("kq-tiny-q5_k_m.gguf");
  // The last tensor's data runs past a file cut 100 bytes short.
  bytes.resize(bytes.size() - 100);
  const absl::Status s = LoadBytes(bytes, "short");
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument) << s;
  EXPECT_THAT(s.message(), HasSubstr("out of range"));
  EXPECT_THAT(s.message(), HasSubstr("tensor '"));
}

TEST(QuantLoaderTest, NonFiniteScalesAreRefusedNamingTensorAndBlock) {
  struct Case {
    const char* model;
    const char* tensor;
    const char* type;
    size_t block_bytes;
    size_t scale_at;  // within the block
    uint16_t value;   // f16 +inf or a NaN
  };
  for (const Case& c : {Case{"kq-tiny-q4_k_m.gguf", "blk.1.attn_q.weight", "Q4_K", 144, 0, 0x7c00},
                        Case{"kq-tiny-q4_k_m.gguf", "blk.1.attn_q.weight", "Q4_K", 144, 2, 0x7e00},
                        Case{"kq-tiny-q5_k_m.gguf", "blk.2.ffn_up.weight", "Q5_K", 176, 2, 0xfc00},
                        Case{"kq-tiny-q4_k_m.gguf", "output.weight", "Q6_K", 210, 208, 0x7c00},
                        Case{"kq-tiny-q4_0.gguf", "blk.0.ffn_gate.weight", "Q4_0", 18, 0, 0x7c01},
                        Case{"kq-tiny-legacy.gguf", "blk.3.attn_v.weight", "Q4_1", 20, 2, 0x7c00},
                        Case{"kq-tiny-legacy.gguf", "token_embd.weight", "Q5_0", 22, 0, 0x7c00},
                        Case{"kq-tiny-legacy.gguf", "output.weight", "Q5_1", 24, 2, 0x7c00}}) {
    SCOPED_TRACE(absl::StrCat(c.model, " ", c.tensor, " at ", c.scale_at));
    std::string bytes = ReadShared(c.model);
    const uint64_t at = DataOffset(c.model, c.tensor) + 5 * c.block_bytes + c.scale_at;
    Put<uint16_t>(bytes, at, c.value);
    const absl::Status s = LoadBytes(bytes, "scale");
    EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument) << s;
    EXPECT_THAT(s.message(), HasSubstr(absl::StrCat("tensor '", c.tensor, "' of type ", c.type,
                                                    " has a non-finite scale in block 5")));
  }
}

// Norm weights and biases are F32 vectors: a NaN or infinity there is
// refused too, naming the tensor and the element.
TEST(QuantLoaderTest, NonFiniteNormWeightsAreRefused) {
  for (float bad : {std::numeric_limits<float>::quiet_NaN(), std::numeric_limits<float>::infinity()}) {
    std::string bytes = ReadShared("kq-tiny-q4_k_m.gguf");
    const uint64_t at = DataOffset("kq-tiny-q4_k_m.gguf", "blk.0.ffn_norm.weight") + 3 * sizeof(float);
    Put<float>(bytes, at, bad);
    const absl::Status s = LoadBytes(bytes, "norm");
    EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument) << s;
    EXPECT_THAT(s.message(),
                HasSubstr("tensor 'blk.0.ffn_norm.weight' element 3 is "));
    EXPECT_THAT(s.message(), HasSubstr("expected a finite value"));
  }
}

}  // namespace
}  // namespace tandem::model
