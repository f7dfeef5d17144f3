// Weights stay in their GGUF type: stories260K rewritten with its weight
// matrices as F16, BF16 or Q8_0 gives, bit for bit, the logits of the same
// model written as F32 with those matrices' exact values (the F16/BF16/Q8_0
// values are built here from their formats' definitions, not by the engine's
// decoder), in prefill, in decode, on 1 and 2 threads. Both load without
// the F32 panel packing (LlamaModelOptions::f32_panels false), so every
// matrix runs the dot-product kernels that F16/BF16/Q8_0 matrices run: the
// packed F32 GEMM has its own order (f32_panels.h).
#include <bit>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <filesystem>
#include <memory>
#include <string>
#include <vector>

#include <unistd.h>

#include "engine/gguf/gguf_file.h"
#include "engine/gguf/gguf_writer.h"
#include "engine/kv/block_pool.h"
#include "engine/kv/cpu_kv_storage.h"
#include "engine/model/llama_model.h"
#include "gtest/gtest.h"
#include "tests/engine/model/model_test_util.h"
#include "tests/test_util.h"

namespace tandem::model {
namespace {

using gguf::TensorType;

// One float as `type`: the bytes to store and the exact value they stand
// for. F16 / BF16 truncate the mantissa (values below F16's normal range
// become signed zero); Q8_0 (whole blocks of 32, handled by the caller)
// uses a fixed scale d = 2^-7, q = clamp(round(x / d), -127, 127).
constexpr float kQ8Scale = 0.0078125f;     // 2^-7
constexpr uint16_t kQ8ScaleHalf = 0x2000;  // binary16 of 2^-7: exponent 8 - 15

uint16_t TruncateToHalf(float x, float* value) {
  const uint32_t b = std::bit_cast<uint32_t>(x);
  const uint32_t sign = b & 0x80000000u;
  const int exp = static_cast<int>((b >> 23) & 0xff) - 127;
  if (exp < -14) {  // below binary16's normal range: signed zero
    *value = std::bit_cast<float>(sign);
    return static_cast<uint16_t>(sign >> 16);
  }
  EXPECT_LE(exp, 15) << "weight " << x << " out of binary16 range";
  *value = std::bit_cast<float>(b & 0xffffe000u);  // mantissa cut to 10 bits
  return static_cast<uint16_t>((sign >> 16) | static_cast<uint32_t>(exp + 15) << 10 |
                               ((b >> 13) & 0x3ffu));
}

// The bytes of `n` floats stored as `type`, and their exact values.
void Encode(TensorType type, const float* x, size_t n, std::string* bytes,
            std::vector<float>* values) {
  values->resize(n);
  if (type == TensorType::kQ8_0) {
    for (size_t b = 0; b < n / 32; ++b) {
      bytes->append(reinterpret_cast<const char*>(&kQ8ScaleHalf), 2);
      for (size_t j = 0; j < 32; ++j) {
        const long q = std::lround(x[32 * b + j] / kQ8Scale);
        const int8_t q8 = static_cast<int8_t>(q < -127 ? -127 : q > 127 ? 127 : q);
        bytes->push_back(static_cast<char>(q8));
        (*values)[32 * b + j] = static_cast<float>(q8) * kQ8Scale;
      }
    }
    return;
  }
  for (size_t i = 0; i < n; ++i) {
    uint16_t h;
    if (type == TensorType::kF16) {
      h = TruncateToHalf(x[i], &(*values)[i]);
    } else {
      h = static_cast<uint16_t>(std::bit_cast<uint32_t>(x[i]) >> 16);
      (*values)[i] = std::bit_cast<float>(static_cast<uint32_t>(h) << 16);
    }
    bytes->append(reinterpret_cast<const char*>(&h), 2);
  }
}

std::string TempPath(const std::string& name) {
  return (std::filesystem::temp_directory_path() /
          (name + "." + std::to_string(::getpid()) + ".gguf"))
      .string();
}

// Writes stories260K with every 2-D weight whose rows suit `type` (Q8_0:
// ne0 a multiple of 32) as `type` to `typed`, and the same model with
// those matrices' exact values as F32 to `twin`. Returns how many tensors
// were stored as `type`.
int WriteTypedAndTwin(TensorType type, const std::string& typed, const std::string& twin) {
  absl::StatusOr<std::unique_ptr<gguf::GgufFile>> f =
      gguf::GgufFile::Open(tandem::testing::SharedPath("models/stories260K.gguf"));
  EXPECT_TRUE(f.ok()) << f.status();
  if (!f.ok()) return 0;
  gguf::GgufWriter a((*f)->alignment()), b((*f)->alignment());
  for (const std::string& key : (*f)->metadata_keys()) {
    EXPECT_TRUE(a.AddMetadata(key, *(*f)->Find(key)).ok());
    EXPECT_TRUE(b.AddMetadata(key, *(*f)->Find(key)).ok());
  }
  int converted = 0;
  for (const gguf::TensorInfo& t : (*f)->tensors()) {
    const std::string raw(reinterpret_cast<const char*>(t.data), t.n_bytes);
    const bool convert = t.type == TensorType::kF32 && t.dims.size() == 2 &&
                         (type != TensorType::kQ8_0 || t.dims[0] % 32 == 0);
    if (!convert) {
      EXPECT_TRUE(a.AddTensor(t.name, t.type, t.dims, raw).ok());
      EXPECT_TRUE(b.AddTensor(t.name, t.type, t.dims, raw).ok());
      continue;
    }
    std::vector<float> x(t.NumElements()), values;
    std::memcpy(x.data(), t.data, t.n_bytes);
    std::string bytes;
    Encode(type, x.data(), x.size(), &bytes, &values);
    EXPECT_TRUE(a.AddTensor(t.name, type, t.dims, bytes).ok()) << t.name;
    EXPECT_TRUE(b.AddTensor(t.name, TensorType::kF32, t.dims,
                            std::string(reinterpret_cast<const char*>(values.data()),
                                        values.size() * sizeof(float)))
                    .ok());
    ++converted;
  }
  EXPECT_TRUE(a.WriteFile(typed).ok());
  EXPECT_TRUE(b.WriteFile(twin).ok());
  return converted;
}

struct Opened {
  std::unique_ptr<gguf::GgufFile> file;
  std::unique_ptr<LlamaModel> model;
};

Opened Open(const std::string& path, int32_t threads) {
  LlamaModelOptions options;
  options.num_threads = threads;
  options.f32_panels = false;
  Opened o;
  absl::StatusOr<std::unique_ptr<gguf::GgufFile>> f = gguf::GgufFile::Open(path);
  EXPECT_TRUE(f.ok()) << f.status();
  if (!f.ok()) return o;
  o.file = std::move(*f);
  absl::StatusOr<std::unique_ptr<LlamaModel>> m = LlamaModel::Load(*o.file, options);
  EXPECT_TRUE(m.ok()) << m.status();
  if (m.ok()) o.model = std::move(*m);
  return o;
}

// Greedy prefill of a 20-token prompt and 12 decode steps; every step's logits.
std::vector<std::vector<float>> StepLogits(const LlamaModel& m) {
  kv::CpuKvStorage kv(m.kv_shape(16), 2);
  kv::BlockPool blocks(2);
  const std::vector<int32_t> table = *blocks.Allocate(2);
  std::vector<int32_t> prompt = {1};
  for (int32_t i = 0; i < 19; ++i) prompt.push_back(20 + 23 * i % 480);
  std::vector<std::vector<float>> logits;
  testing::GreedyDecode(m, kv, table, prompt, 12, &logits);
  return logits;
}

class StorageTypeTest : public ::testing::TestWithParam<TensorType> {};

TEST_P(StorageTypeTest, LogitsEqualTheF32TwinBitForBit) {
  const TensorType type = GetParam();
  const std::string name(gguf::TensorTypeName(type));
  const std::string typed = TempPath("stories260K-" + name);
  const std::string twin = TempPath("stories260K-" + name + "-twin");
  const int converted = WriteTypedAndTwin(type, typed, twin);
  // stories260K has 7 matrices per layer x 5 layers, the embedding and the
  // output matrix; Q8_0 leaves out the 5 ffn_down (ne0 = 172).
  EXPECT_EQ(converted, type == TensorType::kQ8_0 ? 32 : 37);
  for (int32_t threads : {1, 2}) {
    Opened a = Open(typed, threads), b = Open(twin, threads);
    ASSERT_TRUE(a.model && b.model);
    EXPECT_EQ(a.file->FindTensor("blk.0.attn_q.weight")->type, type);
    EXPECT_LT(a.file->file_size(), b.file->file_size());
    const auto got = StepLogits(*a.model), want = StepLogits(*b.model);
    ASSERT_EQ(got.size(), want.size());
    for (size_t s = 0; s < got.size(); ++s) {
      ASSERT_EQ(got[s].size(), want[s].size());
      EXPECT_EQ(std::memcmp(got[s].data(), want[s].data(), got[s].size() * sizeof(float)), 0)
          << name << " threads " << threads << " step " << s;
    }
  }
  std::filesystem::remove(typed);
  std::filesystem::remove(twin);
}

INSTANTIATE_TEST_SUITE_P(Types, StorageTypeTest,
                         ::testing::Values(TensorType::kF16, TensorType::kBF16,
                                           TensorType::kQ8_0),
                         [](const ::testing::TestParamInfo<TensorType>& info) {
                           return std::string(gguf::TensorTypeName(info.param));
                         });

}  // namespace
}  // namespace tandem::model
