// A whole Q8_0 model under LlamaModelOptions::q8_matmul = kInt8: the
// logits are bit-identical alone and batched (chunked prefill beside
// decode), on 1 and 2 threads; close to the exact path; and a model without
// Q8_0 matrices computes exactly as with kExact.
#include <algorithm>
#include <cmath>
#include <cstdio>
#include <filesystem>
#include <iterator>
#include <memory>
#include <set>
#include <string>
#include <vector>

#include <unistd.h>

#include "engine/backend/cpu_backend.h"
#include "engine/gguf/gguf_file.h"
#include "engine/model/llama_model.h"
#include "gtest/gtest.h"
#include "tests/engine/model/model_test_util.h"
#include "tests/test_util.h"
#include "tools/synth_model.h"

namespace tandem::model {
namespace {

std::string TempModel(const std::string& name) {
  return (std::filesystem::temp_directory_path() /
          (name + "." + std::to_string(::getpid()) + ".gguf"))
      .string();
}

// A small synthetic llama (byte vocabulary of 260 tokens: the output matrix
// ends in a partial group of 16 columns): dim 96 (3 blocks), 2 layers, 4
// heads, 2 KV heads, ff 160, every matrix `type`.
class SynthFile {
 public:
  explicit SynthFile(gguf::TensorType type) {
    cli::SynthModelOptions o = cli::OfflineModelOptions(
        TempModel(std::string("q8int8-") + std::string(gguf::TensorTypeName(type))));
    o.shape = cli::SynthShape{96, 2, 4, 2, 160, 256};
    o.type = type;
    o.seed = 19;
    path_ = o.out;
    EXPECT_TRUE(cli::WriteSynthModel(o).ok());
    absl::StatusOr<std::unique_ptr<gguf::GgufFile>> f = gguf::GgufFile::Open(path_);
    EXPECT_TRUE(f.ok()) << f.status();
    if (f.ok()) file_ = std::move(*f);
  }
  ~SynthFile() { std::filesystem::remove(path_); }

  std::unique_ptr<LlamaModel> Load(Q8MatMul mode, int32_t threads) const {
    if (file_ == nullptr) return nullptr;
    LlamaModelOptions options;
    options.num_threads = threads;
    options.q8_matmul = mode;
    absl::StatusOr<std::unique_ptr<LlamaModel>> m = LlamaModel::Load(*file_, options);
    EXPECT_TRUE(m.ok()) << m.status();
    return m.ok() ? std::move(*m) : nullptr;
  }

 private:
  std::string path_;
  std::unique_ptr<gguf::GgufFile> file_;
};

const std::vector<std::vector<int32_t>>& Prompts() {
  static const std::vector<std::vector<int32_t>> prompts = {
      {1, 40, 73, 120, 5, 99, 201, 17, 33, 250, 8, 61, 77, 140, 3, 19, 200, 45},
      {1, 100, 101, 102},
      {1, 7, 9, 11, 13, 15, 17, 19, 21, 23, 25, 27, 29, 31, 33, 35, 37, 39, 41, 43, 45, 47,
       49, 51, 53, 55, 57, 59, 61, 63, 65, 67, 69, 71, 73}};
  return prompts;
}

// Each step's logits of `prompt` alone (prefilled at once, then decoded).
std::vector<std::vector<float>> Alone(const LlamaModel& m, const std::vector<int32_t>& prompt) {
  kv::CpuKvStorage kv(m.kv_shape(16), 16);
  kv::BlockPool blocks(16);
  std::vector<testing::ScheduledSeq> seqs(1);
  seqs[0].prompt = prompt;
  testing::RunSchedule(m, kv, blocks, seqs, 16, 4);
  return seqs[0].logits;
}

TEST(Q8Int8ModelTest, NamesItsMode) {
  SynthFile f(gguf::TensorType::kQ8_0);
  EXPECT_STREQ(f.Load(Q8MatMul::kInt8, 1)->q8_matmul_name(), "int8");
  EXPECT_STREQ(f.Load(Q8MatMul::kExact, 1)->q8_matmul_name(), "exact");
  EXPECT_EQ(LlamaModel::Load(*gguf::GgufFile::Open(
                                  tandem::testing::SharedPath("models/stories260K.gguf"))
                                  .value())
                .value()
                ->q8_matmul(),
            Q8MatMul::kExact);
}

TEST(Q8Int8ModelTest, LogitsAreBatchAndThreadInvariant) {
  SynthFile f(gguf::TensorType::kQ8_0);
  std::unique_ptr<LlamaModel> one = f.Load(Q8MatMul::kInt8, 1);
  std::unique_ptr<LlamaModel> two = f.Load(Q8MatMul::kInt8, 2);
  ASSERT_NE(one, nullptr);
  ASSERT_NE(two, nullptr);
  testing::ExpectBatchInvariantModels(*one, *two, Prompts());
}

// Measured on this model: max |int8 - exact| over every step's logits,
// relative to the largest |logit| of the step.
TEST(Q8Int8ModelTest, LogitsAreCloseToTheExactPath) {
  SynthFile f(gguf::TensorType::kQ8_0);
  std::unique_ptr<LlamaModel> int8 = f.Load(Q8MatMul::kInt8, 1);
  std::unique_ptr<LlamaModel> exact = f.Load(Q8MatMul::kExact, 1);
  ASSERT_NE(int8, nullptr);
  ASSERT_NE(exact, nullptr);
  double worst_abs = 0, worst_rel = 0;
  bool any_differs = false;
  for (const std::vector<int32_t>& p : Prompts()) {
    const std::vector<std::vector<float>> a = Alone(*int8, p), b = Alone(*exact, p);
    ASSERT_EQ(a.size(), b.size());
    for (size_t s = 0; s < a.size(); ++s) {
      ASSERT_EQ(a[s].size(), b[s].size());
      double diff = 0, scale = 0;
      for (size_t i = 0; i < a[s].size(); ++i) {
        diff = std::max(diff, std::fabs(static_cast<double>(a[s][i]) - b[s][i]));
        scale = std::max(scale, std::fabs(static_cast<double>(b[s][i])));
      }
      any_differs = any_differs || diff > 0;
      worst_abs = std::max(worst_abs, diff);
      worst_rel = std::max(worst_rel, diff / scale);
    }
  }
  std::printf("int8 vs exact logits: max abs diff %.3g, max relative to the step's max "
              "|logit| %.3g\n",
              worst_abs, worst_rel);
  EXPECT_TRUE(any_differs);  // the int8 path did run
  EXPECT_LE(worst_rel, 2e-2);
}

TEST(Q8Int8ModelTest, ModelWithoutQ8_0IsUnchanged) {
  SynthFile f(gguf::TensorType::kF16);
  std::unique_ptr<LlamaModel> int8 = f.Load(Q8MatMul::kInt8, 1);
  std::unique_ptr<LlamaModel> exact = f.Load(Q8MatMul::kExact, 1);
  ASSERT_NE(int8, nullptr);
  ASSERT_NE(exact, nullptr);
  const std::vector<std::vector<float>> a = Alone(*int8, Prompts()[0]);
  const std::vector<std::vector<float>> b = Alone(*exact, Prompts()[0]);
  ASSERT_EQ(a.size(), b.size());
  for (size_t s = 0; s < a.size(); ++s) EXPECT_TRUE(testing::BitIdentical(a[s], b[s]));
}

// The CPU backend's bit-exact class names each numerics option: the float
// MatMul's ISA (or int8 when every multiplied matrix is Q8_0 under int8, fma
// when every one is F32 on the panel GEMM),
// engine.q8_matmul and the KV dtype; every combination is its own class.
TEST(CpuBitExactClassTest, NamesTheMatmulIsaTheQ8PathAndTheKvDtype) {
  const SynthFile q8(gguf::TensorType::kQ8_0);
  const SynthFile f16(gguf::TensorType::kF16);
  const SynthFile f32(gguf::TensorType::kF32);
  const std::string isa = KernelIsa();
  struct Case {
    const SynthFile* file;
    Q8MatMul mode;
    kv::KvDtype dtype;
    std::string want;
  };
  const Case cases[] = {
      {&q8, Q8MatMul::kExact, kv::KvDtype::kF32, "tandem-cpu/" + isa + "/exact/f32/v4"},
      {&q8, Q8MatMul::kExact, kv::KvDtype::kF16, "tandem-cpu/" + isa + "/exact/f16/v4"},
      {&q8, Q8MatMul::kInt8, kv::KvDtype::kF32, "tandem-cpu/int8/int8/f32/v4"},
      {&q8, Q8MatMul::kInt8, kv::KvDtype::kBF16, "tandem-cpu/int8/int8/bf16/v4"},
      // An F16 model has no Q8_0 matrix: its MatMuls stay on the ISA.
      {&f16, Q8MatMul::kInt8, kv::KvDtype::kF32, "tandem-cpu/" + isa + "/int8/f32/v4"},
      // An F32 model runs every MatMul on the panel GEMM's fma chain,
      // whatever the ISA (f32_panels.h).
      {&f32, Q8MatMul::kExact, kv::KvDtype::kF32, "tandem-cpu/fma/exact/f32/v4"},
      {&f32, Q8MatMul::kInt8, kv::KvDtype::kBF16, "tandem-cpu/fma/int8/bf16/v4"},
  };
  std::set<std::string> seen;
  for (const Case& c : cases) {
    std::unique_ptr<LlamaModel> m = c.file->Load(c.mode, 1);
    ASSERT_NE(m, nullptr);
    backend::CpuBackend b(m.get(), 16, 2, c.dtype);
    EXPECT_EQ(b.bit_exact_class(), c.want);
    seen.insert(b.bit_exact_class());
  }
  EXPECT_EQ(seen.size(), std::size(cases));
}

}  // namespace
}  // namespace tandem::model
