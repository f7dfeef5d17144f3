// The architecture table at load time: per-architecture keys and tensors,
// the config each file gives, keys and tensors that change the math read or
// refused (never ignored), and the optional llama pieces (Q/K/V biases,
// rope_freqs.weight) that are neutral when their values are.
#include <unistd.h>

#include <cmath>
#include <cstdint>
#include <cstring>
#include <filesystem>
#include <limits>
#include <map>
#include <memory>
#include <set>
#include <span>
#include <string>
#include <utility>
#include <vector>

#include "engine/gguf/gguf_file.h"
#include "engine/gguf/gguf_writer.h"
#include "engine/kv/block_pool.h"
#include "engine/kv/cpu_kv_storage.h"
#include "engine/model/llama_model.h"
#include "engine/model/model_arch.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "tests/engine/model/model_test_util.h"
#include "tests/test_util.h"

namespace tandem::model {
namespace {

using ::testing::HasSubstr;
using testing::LoadSharedModel;

TEST(ArchTableTest, RowsFollowLlamaCpp) {
  ASSERT_EQ(Architectures().size(), 2u);
  const ArchInfo& llama = GetArchInfo(ModelArch::kLlama);
  EXPECT_STREQ(llama.name, "llama");
  EXPECT_EQ(llama.rope_type, RopeType::kNorm);
  EXPECT_EQ(llama.qkv_bias, TensorRule::kOptional);
  EXPECT_EQ(llama.rope_freqs, TensorRule::kOptional);
  EXPECT_TRUE(llama.output_may_be_tied);
  const ArchInfo& qwen2 = GetArchInfo(ModelArch::kQwen2);
  EXPECT_STREQ(qwen2.name, "qwen2");
  EXPECT_EQ(qwen2.rope_type, RopeType::kNeox);
  EXPECT_EQ(qwen2.qkv_bias, TensorRule::kRequired);
  EXPECT_EQ(qwen2.rope_freqs, TensorRule::kAbsent);
  EXPECT_TRUE(qwen2.output_may_be_tied);
  EXPECT_EQ(FindArch("qwen2"), &qwen2);
  EXPECT_EQ(FindArch("qwen3"), nullptr);
  EXPECT_EQ(FindArch("Llama"), nullptr);
  EXPECT_EQ(SupportedArchNames(), "llama, qwen2");
  EXPECT_EQ(ArchKey(qwen2, "rope.freq_base"), "qwen2.rope.freq_base");
}

// Values from ../shared/models/README.md.
TEST(ArchConfigTest, Qwen2TinySynth) {
  testing::LoadedModel m = LoadSharedModel("qwen2-tiny-synth.gguf");
  ASSERT_NE(m.model, nullptr);
  const LlamaConfig& c = m.model->config();
  EXPECT_EQ(c.architecture, "qwen2");
  EXPECT_EQ(c.arch, ModelArch::kQwen2);
  EXPECT_EQ(c.rope_type, RopeType::kNeox);
  EXPECT_TRUE(c.qkv_bias);
  EXPECT_FALSE(c.rope_freq_factors);
  EXPECT_EQ(c.context_length, 4096);
  EXPECT_EQ(c.n_embd, 64);
  EXPECT_EQ(c.n_layers, 4);
  EXPECT_EQ(c.n_ff, 192);
  EXPECT_EQ(c.n_head, 4);
  EXPECT_EQ(c.n_head_kv, 2);
  EXPECT_EQ(c.head_dim, 16);
  EXPECT_EQ(c.rope_dim, 16);  // no qwen2.rope.dimension_count: head dim
  EXPECT_EQ(c.rope_freq_base, 1e6f);
  EXPECT_FLOAT_EQ(c.rms_norm_eps, 1e-6f);
  EXPECT_EQ(c.vocab_size, 151669);
}

TEST(ArchConfigTest, Llama3TinySynth) {
  testing::LoadedModel m = LoadSharedModel("llama3-tiny-synth.gguf");
  ASSERT_NE(m.model, nullptr);
  const LlamaConfig& c = m.model->config();
  EXPECT_EQ(c.architecture, "llama");
  EXPECT_EQ(c.arch, ModelArch::kLlama);
  EXPECT_EQ(c.rope_type, RopeType::kNorm);
  EXPECT_FALSE(c.qkv_bias);
  EXPECT_TRUE(c.rope_freq_factors);
  EXPECT_EQ(c.context_length, 8192);
  EXPECT_EQ(c.rope_dim, 16);
  EXPECT_EQ(c.rope_freq_base, 500000.0f);
  EXPECT_EQ(c.vocab_size, 151669);
}

TEST(ArchConfigTest, StoriesIsPlainLlama) {
  testing::LoadedModel m = LoadSharedModel("stories260K.gguf");
  ASSERT_NE(m.model, nullptr);
  const LlamaConfig& c = m.model->config();
  EXPECT_EQ(c.arch, ModelArch::kLlama);
  EXPECT_EQ(c.rope_type, RopeType::kNorm);
  EXPECT_FALSE(c.qkv_bias);
  EXPECT_FALSE(c.rope_freq_factors);
}

// A copy of a shared model with some metadata and tensors changed.
struct Edit {
  std::map<std::string, gguf::MetadataValue> set;  // replaced in place, else appended
  std::set<std::string> drop_keys;
  std::set<std::string> drop_tensors;
  std::vector<std::pair<std::string, std::vector<float>>> add_f32;  // 1-D F32 tensors
};

// Writes ../shared/models/<model> with `edit` applied to a temp file;
// returns its path.
std::string Rewrite(const std::string& model, const Edit& edit, const std::string& out_name) {
  absl::StatusOr<std::unique_ptr<gguf::GgufFile>> f =
      gguf::GgufFile::Open(tandem::testing::SharedPath("models/" + model));
  EXPECT_TRUE(f.ok()) << f.status();
  if (!f.ok()) return "";
  gguf::GgufWriter w((*f)->alignment());
  std::set<std::string> done;
  for (const std::string& key : (*f)->metadata_keys()) {
    if (edit.drop_keys.contains(key)) continue;
    auto it = edit.set.find(key);
    EXPECT_TRUE(w.AddMetadata(key, it != edit.set.end() ? it->second : *(*f)->Find(key)).ok());
    done.insert(key);
  }
  for (const auto& [key, value] : edit.set) {
    if (!done.contains(key)) {
      EXPECT_TRUE(w.AddMetadata(key, value).ok()) << key;
    }
  }
  for (const gguf::TensorInfo& t : (*f)->tensors()) {
    if (edit.drop_tensors.contains(t.name)) continue;
    EXPECT_TRUE(w.AddTensorView(t.name, t.type, t.dims, t.data).ok()) << t.name;
  }
  for (const auto& [name, values] : edit.add_f32) {
    EXPECT_TRUE(w.AddTensor(name, gguf::TensorType::kF32, {values.size()},
                            std::string(reinterpret_cast<const char*>(values.data()),
                                        values.size() * sizeof(float)))
                    .ok())
        << name;
  }
  const std::string path = (std::filesystem::temp_directory_path() /
                            (out_name + "." + std::to_string(::getpid()) + ".gguf"))
                               .string();
  EXPECT_TRUE(w.WriteFile(path).ok());
  return path;
}

// The file and model loaded from `path` (the file is removed once mapped).
struct Loaded {
  std::unique_ptr<gguf::GgufFile> file;
  absl::StatusOr<std::unique_ptr<LlamaModel>> model = absl::UnknownError("not loaded");
};

Loaded LoadPath(const std::string& path) {
  Loaded l;
  absl::StatusOr<std::unique_ptr<gguf::GgufFile>> f = gguf::GgufFile::Open(path);
  std::filesystem::remove(path);
  EXPECT_TRUE(f.ok()) << f.status();
  if (!f.ok()) return l;
  l.file = std::move(*f);
  l.model = LlamaModel::Load(*l.file);
  return l;
}

absl::Status LoadStatus(const std::string& model, const Edit& edit, const std::string& name) {
  return LoadPath(Rewrite(model, edit, name)).model.status();
}

void ExpectRefused(const absl::Status& s, const std::vector<std::string>& parts) {
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument) << s;
  for (const std::string& p : parts) EXPECT_THAT(s.message(), HasSubstr(p));
}

TEST(ArchLoaderTest, UnsupportedArchitectureNamesItAndTheSupportedOnes) {
  Edit e;
  e.set["general.architecture"] = std::string("qwen3");
  ExpectRefused(LoadStatus("stories260K.gguf", e, "qwen3"),
                {"'general.architecture' is 'qwen3'", "llama, qwen2"});
}

TEST(ArchLoaderTest, KeysAreReadWithTheArchitecturePrefix) {
  // qwen2-tiny-synth without qwen2.block_count: the qwen2 key is required,
  // a llama one does not stand in for it.
  Edit e;
  e.drop_keys.insert("qwen2.block_count");
  e.set["llama.block_count"] = uint32_t{4};
  ExpectRefused(LoadStatus("qwen2-tiny-synth.gguf", e, "qwen2_no_block_count"),
                {"qwen2.block_count"});
}

TEST(ArchLoaderTest, HeadLengthsOtherThanEmbdOverHeadsAreRefused) {
  for (const char* key : {"llama.attention.key_length", "llama.attention.value_length"}) {
    Edit e;
    e.set[key] = uint32_t{16};  // stories: head dim 8
    ExpectRefused(LoadStatus("stories260K.gguf", e, "head_length"), {key, "16"});
    e.set[key] = uint32_t{8};  // stated, and what the forward assumes
    EXPECT_TRUE(LoadStatus("stories260K.gguf", e, "head_length_ok").ok()) << key;
  }
  Edit e;
  e.set["qwen2.attention.key_length"] = uint32_t{32};  // head dim 16
  ExpectRefused(LoadStatus("qwen2-tiny-synth.gguf", e, "qwen2_key_length"),
                {"qwen2.attention.key_length", "32"});
}

TEST(ArchLoaderTest, RopeScalingOtherThanNoneIsRefused) {
  for (const char* type : {"linear", "yarn", "longrope"}) {
    Edit e;
    e.set["llama.rope.scaling.type"] = std::string(type);
    ExpectRefused(LoadStatus("stories260K.gguf", e, "scaling_type"),
                  {"llama.rope.scaling.type", std::string("'") + type + "'"});
  }
  Edit yarn;
  yarn.set["qwen2.rope.scaling.type"] = std::string("yarn");
  yarn.set["qwen2.rope.scaling.factor"] = 4.0f;
  ExpectRefused(LoadStatus("qwen2-tiny-synth.gguf", yarn, "qwen2_yarn"),
                {"qwen2.rope.scaling.type", "'yarn'"});

  // "none" never scales in llama.cpp, whatever the factor says.
  Edit none;
  none.set["llama.rope.scaling.type"] = std::string("none");
  none.set["llama.rope.scaling.factor"] = 8.0f;
  EXPECT_TRUE(LoadStatus("stories260K.gguf", none, "scaling_none").ok());
  // Without a type llama.cpp scales linearly by the factor: refused unless 1.
  for (const char* key : {"llama.rope.scaling.factor", "llama.rope.scale_linear"}) {
    Edit e;
    e.set[key] = 2.0f;
    ExpectRefused(LoadStatus("stories260K.gguf", e, "scaling_factor"), {key, "2"});
    e.set[key] = 1.0f;
    EXPECT_TRUE(LoadStatus("stories260K.gguf", e, "scaling_factor_one").ok()) << key;
  }
  Edit attn;
  attn.set["llama.rope.scaling.attn_factor"] = 0.5f;
  ExpectRefused(LoadStatus("stories260K.gguf", attn, "attn_factor"),
                {"llama.rope.scaling.attn_factor"});
}

TEST(ArchLoaderTest, ExpertsAreRefused) {
  Edit e;
  e.set["llama.expert_count"] = uint32_t{8};
  e.set["llama.expert_used_count"] = uint32_t{2};
  ExpectRefused(LoadStatus("stories260K.gguf", e, "experts"), {"llama.expert_count", "8"});
}

TEST(ArchLoaderTest, TensorsTheGraphDoesNotUseAreRefused) {
  Edit out_bias;
  out_bias.add_f32.push_back({"blk.0.attn_output.bias", std::vector<float>(64, 0.0f)});
  ExpectRefused(LoadStatus("stories260K.gguf", out_bias, "attn_output_bias"),
                {"tensor 'blk.0.attn_output.bias'", "'llama'"});
  // Only a K bias: without blk.0.attn_q.bias the llama file has no Q/K/V
  // biases, so this one is unused.
  Edit k_bias;
  k_bias.add_f32.push_back({"blk.3.attn_k.bias", std::vector<float>(32, 0.0f)});
  ExpectRefused(LoadStatus("stories260K.gguf", k_bias, "lonely_k_bias"),
                {"tensor 'blk.3.attn_k.bias'"});
  // qwen2 has no rope_freqs in llama.cpp.
  Edit freqs;
  freqs.add_f32.push_back({"rope_freqs.weight", std::vector<float>(8, 1.0f)});
  ExpectRefused(LoadStatus("qwen2-tiny-synth.gguf", freqs, "qwen2_rope_freqs"),
                {"tensor 'rope_freqs.weight'", "'qwen2'"});
}

TEST(ArchLoaderTest, Qwen2BiasesAreRequired) {
  Edit e;
  e.drop_tensors.insert("blk.1.attn_k.bias");
  ExpectRefused(LoadStatus("qwen2-tiny-synth.gguf", e, "qwen2_no_bias"),
                {"missing tensor 'blk.1.attn_k.bias'"});
}

TEST(ArchLoaderTest, RopeFreqsMustBePositiveFiniteWithRopeDimOverTwoValues) {
  Edit wrong_size;
  wrong_size.add_f32.push_back({"rope_freqs.weight", std::vector<float>(8, 1.0f)});
  ExpectRefused(LoadStatus("stories260K.gguf", wrong_size, "freqs_size"),  // rope dim 8
                {"tensor 'rope_freqs.weight' has shape [8], expected [4]"});
  for (float bad : {0.0f, -1.0f, std::numeric_limits<float>::quiet_NaN(),
                    std::numeric_limits<float>::infinity()}) {
    Edit e;
    e.add_f32.push_back({"rope_freqs.weight", {1.0f, 1.0f, bad, 1.0f}});
    ExpectRefused(LoadStatus("stories260K.gguf", e, "freqs_bad"),
                  {"tensor 'rope_freqs.weight' element 2"});
  }
}

// Greedy logits of a few stories prompts, one vector per step.
std::vector<std::vector<float>> StoriesLogits(const LlamaModel& m) {
  std::vector<std::vector<float>> all;
  const nlohmann::json goldens = testing::LoadStoriesGoldens();
  for (size_t i = 0; i < 3; ++i) {
    const auto prompt =
        goldens["cases"][i]["prompt_token_ids_with_bos"].get<std::vector<int32_t>>();
    kv::CpuKvStorage kv(m.kv_shape(16), 4);
    kv::BlockPool blocks(4);
    const std::vector<int32_t> table = *blocks.Allocate(4);
    std::vector<std::vector<float>> steps;
    testing::GreedyDecode(m, kv, table, prompt, 6, &steps);
    for (std::vector<float>& s : steps) all.push_back(std::move(s));
  }
  return all;
}

// rope_freqs.weight of ones and Q/K/V biases of zeros are the identity:
// the llama graph with them gives stories' logits exactly; other values
// change them. (x / 1 and x + 0 are exact.)
TEST(ArchLoaderTest, NeutralFreqFactorsAndZeroBiasesKeepStoriesLogits) {
  testing::LoadedModel plain = LoadSharedModel("stories260K.gguf");
  ASSERT_NE(plain.model, nullptr);
  const std::vector<std::vector<float>> want = StoriesLogits(*plain.model);

  auto with = [](std::vector<float> freqs, float bias) {
    Edit e;
    e.add_f32.push_back({"rope_freqs.weight", std::move(freqs)});
    for (int l = 0; l < 5; ++l) {
      const std::string p = "blk." + std::to_string(l) + ".";
      e.add_f32.push_back({p + "attn_q.bias", std::vector<float>(64, bias)});
      e.add_f32.push_back({p + "attn_k.bias", std::vector<float>(32, bias)});
      e.add_f32.push_back({p + "attn_v.bias", std::vector<float>(32, bias)});
    }
    return e;
  };
  Loaded neutral = LoadPath(Rewrite("stories260K.gguf", with({1, 1, 1, 1}, 0.0f), "neutral"));
  ASSERT_TRUE(neutral.model.ok()) << neutral.model.status();
  EXPECT_TRUE((*neutral.model)->config().qkv_bias);
  EXPECT_TRUE((*neutral.model)->config().rope_freq_factors);
  const std::vector<std::vector<float>> got = StoriesLogits(**neutral.model);
  ASSERT_EQ(got.size(), want.size());
  for (size_t i = 0; i < got.size(); ++i) EXPECT_EQ(got[i], want[i]) << "step " << i;

  for (const Edit& e : {with({1, 1, 2, 8}, 0.0f), with({1, 1, 1, 1}, 0.05f)}) {
    Loaded changed = LoadPath(Rewrite("stories260K.gguf", e, "changed"));
    ASSERT_TRUE(changed.model.ok()) << changed.model.status();
    EXPECT_NE(StoriesLogits(**changed.model), want);
  }
}

}  // namespace
}  // namespace tandem::model
