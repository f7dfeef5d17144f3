// LlamaModel::Load: hyperparameters, tensor checks, weight conversion, the
// model fingerprint.
#include <cmath>
#include <cstdint>
#include <cstring>
#include <fstream>
#include <span>
#include <string>
#include <vector>

#include "engine/gguf/gguf_file.h"
#include "engine/kv/block_pool.h"
#include "engine/kv/cpu_kv_storage.h"
#include "engine/model/llama_model.h"
#include "engine/model/llama_weights.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "tests/engine/model/model_test_util.h"
#include "tests/test_util.h"
#include "xxhash.h"

namespace tandem::model {
namespace {

using ::testing::HasSubstr;
using testing::LoadSharedModel;

// Values from ../shared/models/README.md.
TEST(LlamaLoaderTest, StoriesConfigFromMetadata) {
  testing::LoadedModel m = LoadSharedModel("stories260K.gguf");
  ASSERT_NE(m.model, nullptr);
  const LlamaConfig& c = m.model->config();
  EXPECT_EQ(c.architecture, "llama");
  EXPECT_EQ(c.name, "llama");
  EXPECT_EQ(c.context_length, 2048);
  EXPECT_EQ(c.n_embd, 64);
  EXPECT_EQ(c.n_layers, 5);
  EXPECT_EQ(c.n_ff, 172);
  EXPECT_EQ(c.n_head, 8);
  EXPECT_EQ(c.n_head_kv, 4);
  EXPECT_EQ(c.head_dim, 8);
  EXPECT_EQ(c.rope_dim, 8);
  EXPECT_EQ(c.rope_freq_base, 10000.0f);  // absent key: llama.cpp's default
  EXPECT_FLOAT_EQ(c.rms_norm_eps, 1e-5f);
  EXPECT_EQ(c.vocab_size, 512);  // tokenizer.ggml.tokens; no llama.vocab_size
  const kv::KvShape shape = m.model->kv_shape(32);
  EXPECT_EQ(shape.n_layers, 5);
  EXPECT_EQ(shape.n_kv_heads, 4);
  EXPECT_EQ(shape.head_dim, 8);
  EXPECT_EQ(shape.block_size, 32);
}

TEST(LlamaLoaderTest, TinyRandomF16LoadsAndRunsWithoutNaN) {
  testing::LoadedModel m = LoadSharedModel("llama-2-tiny-random.gguf");
  ASSERT_NE(m.model, nullptr);
  const LlamaConfig& c = m.model->config();
  EXPECT_EQ(c.name, "LLaMA v2");
  EXPECT_EQ(c.n_embd, 8);
  EXPECT_EQ(c.n_layers, 1);
  EXPECT_EQ(c.n_ff, 32);
  EXPECT_EQ(c.n_head, 2);
  EXPECT_EQ(c.n_head_kv, 2);
  EXPECT_EQ(c.head_dim, 4);
  EXPECT_EQ(c.vocab_size, 32000);

  kv::CpuKvStorage kv(m.model->kv_shape(16), 4);
  kv::BlockPool blocks(4);
  const std::vector<int32_t> table = *blocks.Allocate(1);
  const std::vector<int32_t> prompt = {1, 9038, 2501, 263, 931, 31999};
  SequenceBatch entry;
  entry.tokens = prompt;
  entry.block_table = &table;
  std::vector<float> logits;
  m.model->Forward(std::span<const SequenceBatch>(&entry, 1), kv, &logits);
  ASSERT_EQ(logits.size(), 32000u);
  for (float x : logits) ASSERT_TRUE(std::isfinite(x));
  // Random weights still give a non-constant logit vector.
  EXPECT_NE(*std::min_element(logits.begin(), logits.end()),
            *std::max_element(logits.begin(), logits.end()));
}

TEST(LlamaLoaderTest, VocabOnlyFileFailsNamingTheFirstTensor) {
  absl::StatusOr<std::unique_ptr<gguf::GgufFile>> file = gguf::GgufFile::Open(
      tandem::testing::SharedPath("models/ggml-vocab-llama-spm.gguf"));
  ASSERT_TRUE(file.ok()) << file.status();
  absl::StatusOr<std::unique_ptr<LlamaModel>> model = LlamaModel::Load(**file);
  EXPECT_EQ(model.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(model.status().message(), HasSubstr("missing tensor 'token_embd.weight'"));
}

// stories260K.gguf with `from` replaced by `to` (same length) at its first
// occurrence after `anchor`, written to a temp file; returns the path.
std::string PatchedStories(const std::string& anchor, const std::string& from,
                           const std::string& to, const std::string& out_name) {
  std::string bytes =
      tandem::testing::ReadFileOrDie(tandem::testing::SharedPath("models/stories260K.gguf"));
  const size_t at = bytes.find(anchor);
  const size_t pos = at == std::string::npos ? at : bytes.find(from, at);
  EXPECT_NE(pos, std::string::npos) << anchor << " / " << from;
  EXPECT_EQ(from.size(), to.size());
  if (pos != std::string::npos) bytes.replace(pos, from.size(), to);
  const std::string path = ::testing::TempDir() + "/" + out_name;
  std::ofstream(path, std::ios::binary) << bytes;
  return path;
}

absl::Status LoadStatus(const std::string& path) {
  absl::StatusOr<std::unique_ptr<gguf::GgufFile>> file = gguf::GgufFile::Open(path);
  if (!file.ok()) return file.status();
  return LlamaModel::Load(**file).status();
}

TEST(LlamaLoaderTest, WrongArchitectureIsInvalidArgument) {
  // The value string of general.architecture: u32 type 8, u64 length 5.
  // (qwen2 is served now: see arch_loader_test.cc.)
  const std::string path = PatchedStories("general.architecture", "llama", "qwen3",
                                          "wrong_arch.gguf");
  absl::Status s = LoadStatus(path);
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(s.message(), HasSubstr("'general.architecture' is 'qwen3'"));
  EXPECT_THAT(s.message(), HasSubstr("llama, qwen2"));
}

TEST(LlamaLoaderTest, MissingTensorIsInvalidArgumentNamingIt) {
  const std::string path = PatchedStories("blk.2.ffn_up.weight", "blk.2.ffn_up.weight",
                                          "blk.2.ffn_up.weighx", "missing_tensor.gguf");
  absl::Status s = LoadStatus(path);
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(s.message(), HasSubstr("missing tensor 'blk.2.ffn_up.weight'"));
}

TEST(LlamaLoaderTest, WrongShapeIsInvalidArgumentNamingTensorAndShapes) {
  // llama.feed_forward_length is u32 172 (0xAC); 171 makes ffn_gate wrong.
  const std::string path =
      PatchedStories("llama.feed_forward_length", std::string("\xAC\x00\x00\x00", 4),
                     std::string("\xAB\x00\x00\x00", 4), "wrong_shape.gguf");
  absl::Status s = LoadStatus(path);
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(s.message(), HasSubstr("tensor 'blk.0.ffn_gate.weight' has shape [64, 172], "
                                     "expected [64, 171]"));
}

TEST(LlamaLoaderTest, MissingMetadataKeyIsInvalidArgumentNamingIt) {
  const std::string path = PatchedStories("llama.block_count", "llama.block_count",
                                          "llama.block_xxxxx", "missing_key.gguf");
  absl::Status s = LoadStatus(path);
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(s.message(), HasSubstr("llama.block_count"));
}

// Bit patterns from IEEE 754 binary16 / bfloat16 and ggml's block_q8_0.
TEST(LlamaLoaderTest, ConvertsF16Bf16AndQ8_0) {
  const uint16_t f16[] = {0x3C00, 0xC000, 0x7BFF, 0x0001, 0x8000, 0x3555};
  std::vector<float> out(6);
  internal::ConvertToF32(gguf::TensorType::kF16, reinterpret_cast<const uint8_t*>(f16), 6,
                         out.data());
  EXPECT_EQ(out[0], 1.0f);
  EXPECT_EQ(out[1], -2.0f);
  EXPECT_EQ(out[2], 65504.0f);
  EXPECT_EQ(out[3], std::ldexp(1.0f, -24));
  EXPECT_EQ(out[4], 0.0f);
  EXPECT_TRUE(std::signbit(out[4]));
  EXPECT_EQ(out[5], 0.333251953125f);

  const uint16_t bf16[] = {0x3F80, 0xC0A0};
  internal::ConvertToF32(gguf::TensorType::kBF16, reinterpret_cast<const uint8_t*>(bf16), 2,
                         out.data());
  EXPECT_EQ(out[0], 1.0f);
  EXPECT_EQ(out[1], -5.0f);

  uint8_t q8[34] = {0x00, 0x38};  // d = f16 0x3800 = 0.5
  for (int j = 0; j < 32; ++j) q8[2 + j] = static_cast<uint8_t>(static_cast<int8_t>(j - 16));
  q8[2 + 31] = 0x80;  // -128
  std::vector<float> q(32);
  internal::ConvertToF32(gguf::TensorType::kQ8_0, q8, 32, q.data());
  EXPECT_EQ(q[0], -8.0f);
  EXPECT_EQ(q[16], 0.0f);
  EXPECT_EQ(q[17], 0.5f);
  EXPECT_EQ(q[31], -64.0f);
}

std::string OneShotXxh128Hex(const std::string& bytes) {
  XXH128_canonical_t canonical;
  XXH128_canonicalFromHash(&canonical, XXH3_128bits(bytes.data(), bytes.size()));
  std::string hex;
  for (unsigned char b : canonical.digest) {
    static constexpr char kHex[] = "0123456789abcdef";
    hex += kHex[b >> 4];
    hex += kHex[b & 0xf];
  }
  return hex;
}

TEST(LlamaLoaderTest, FingerprintIsXxh128OfTheWholeFile) {
  for (const char* name : {"stories260K.gguf", "llama-2-tiny-random.gguf"}) {
    const std::string path = tandem::testing::SharedPath(std::string("models/") + name);
    absl::StatusOr<std::unique_ptr<gguf::GgufFile>> file = gguf::GgufFile::Open(path);
    ASSERT_TRUE(file.ok()) << file.status();
    absl::StatusOr<std::string> fp = ModelFingerprint(**file);
    ASSERT_TRUE(fp.ok()) << fp.status();
    EXPECT_THAT(*fp, ::testing::MatchesRegex("[0-9a-f]{32}"));
    EXPECT_EQ(*fp, OneShotXxh128Hex(tandem::testing::ReadFileOrDie(path)));
  }
}

}  // namespace
}  // namespace tandem::model

namespace tandem::model {
namespace {

// engine.kernel_isa: names are checked, and once the process has chosen
// its ISA, only that one can be pinned (the numerics id must not change).
TEST(KernelIsaPinTest, NamesAreCheckedAndTheChoiceIsFixed) {
  EXPECT_EQ(PinKernelIsa("sse9").code(), absl::StatusCode::kInvalidArgument);
  EXPECT_TRUE(PinKernelIsa("auto").ok());
  const std::string active = KernelIsa();  // fixes the process's choice
  EXPECT_TRUE(PinKernelIsa(active).ok());
  const std::string other = active == "generic" ? "avx512" : "generic";
  absl::Status s = PinKernelIsa(other);
  EXPECT_EQ(s.code(), absl::StatusCode::kFailedPrecondition) << s;
  EXPECT_EQ(std::string(KernelIsa()), active);
}

}  // namespace
}  // namespace tandem::model
