// tandem synth-model: flags, the number formats (checked against IEEE 754
// binary16 and ggml's Q8_0 definitions), and small synthetic models that
// load with LlamaModel and the tokenizer, whose F16 / Q8_0 logits stay close
// to the F32 model's; the built-in byte vocabulary (round trip of UTF-8
// text through the tokenizer) and the offline model of `tandem up`; --arch
// qwen2 (its keys, Q/K/V biases, tied output; it loads, runs and is batch
// invariant) and the copy of every tokenizer.* key of a BPE vocabulary;
// the block-quantized types' shape rules and a Q4_K_M model's tensor types
// and sizes (their bytes: tests/tools/quantize_test.cc).
#include "tools/synth_model.h"

#include <unistd.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <limits>
#include <memory>
#include <random>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "engine/gguf/gguf_file.h"
#include "engine/kv/block_pool.h"
#include "engine/kv/cpu_kv_storage.h"
#include "engine/model/llama_model.h"
#include "engine/tokenizer/tokenizer.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "tests/test_util.h"

namespace tandem::cli {
namespace {

using ::testing::HasSubstr;
using ::tandem::testing::ReadFileOrDie;
using ::tandem::testing::SharedPath;

std::string Vocab() { return SharedPath("models/ggml-vocab-llama-spm.gguf"); }

std::string TempPath(const std::string& name) {
  return (std::filesystem::temp_directory_path() /
          (name + "." + std::to_string(::getpid()) + ".gguf"))
      .string();
}

// dim 64, 2 layers, 4 heads, 2 KV heads, ff 128 with the SPM vocabulary.
std::vector<std::string> SmallArgs(const std::string& out, const std::string& type,
                                   const std::string& seed) {
  return {"--out", out, "--vocab-from", Vocab(), "--dim", "64", "--layers", "2",
          "--heads", "4", "--kv-heads", "2", "--ff", "128", "--context", "64",
          "--type", type, "--seed", seed};
}

std::string WriteSmall(const std::string& type, const std::string& seed) {
  const std::string out = TempPath("synth_" + type + "_" + seed);
  absl::StatusOr<SynthModelOptions> o = ParseSynthModelArgs(SmallArgs(out, type, seed));
  EXPECT_TRUE(o.ok()) << o.status();
  if (!o.ok()) return "";
  absl::Status s = WriteSynthModel(*o);
  EXPECT_TRUE(s.ok()) << s;
  return out;
}

float HalfToFloat(uint16_t h) {  // IEEE 754 binary16, by its definition
  const int e = (h >> 10) & 0x1f;
  const int m = h & 0x3ff;
  const float sign = (h & 0x8000) ? -1.0f : 1.0f;
  if (e == 0) return sign * std::ldexp(static_cast<float>(m), -24);
  if (e == 31) return m ? std::numeric_limits<float>::quiet_NaN()
                        : sign * std::numeric_limits<float>::infinity();
  return sign * std::ldexp(static_cast<float>(m + 1024), e - 25);
}

TEST(SynthModelFormatsTest, FloatToHalfMatchesBinary16) {
  // Known encodings (IEEE 754-2008 binary16 table).
  EXPECT_EQ(FloatToHalf(0.0f), 0x0000);
  EXPECT_EQ(FloatToHalf(-0.0f), 0x8000);
  EXPECT_EQ(FloatToHalf(1.0f), 0x3c00);
  EXPECT_EQ(FloatToHalf(-2.0f), 0xc000);
  EXPECT_EQ(FloatToHalf(65504.0f), 0x7bff);
  EXPECT_EQ(FloatToHalf(65520.0f), 0x7c00);  // rounds up to infinity
  EXPECT_EQ(FloatToHalf(std::ldexp(1.0f, -14)), 0x0400);  // smallest normal
  EXPECT_EQ(FloatToHalf(std::ldexp(1.0f, -24)), 0x0001);  // smallest subnormal
  EXPECT_EQ(FloatToHalf(std::ldexp(1.0f, -25)), 0x0000);  // tie -> even (0)
  EXPECT_EQ(FloatToHalf(std::ldexp(3.0f, -25)), 0x0002);  // tie -> even (2)
  EXPECT_EQ(FloatToHalf(1.0f + std::ldexp(1.0f, -11)), 0x3c00);  // tie -> even
  EXPECT_EQ(FloatToHalf(1.0f + std::ldexp(3.0f, -11)), 0x3c02);  // tie -> even
  EXPECT_EQ(FloatToHalf(std::numeric_limits<float>::infinity()), 0x7c00);
  EXPECT_EQ(FloatToHalf(std::numeric_limits<float>::quiet_NaN()) & 0x7e00, 0x7e00);
  // Every finite half converts back to itself, and is the nearest half.
  for (uint32_t h = 0; h < 0x10000; ++h) {
    if (((h >> 10) & 0x1f) == 0x1f) continue;
    const float f = HalfToFloat(static_cast<uint16_t>(h));
    ASSERT_EQ(FloatToHalf(f), h) << h;
  }
}

TEST(SynthModelFormatsTest, FloatToBf16RoundsToNearestEven) {
  auto bits = [](uint32_t u) {
    float f;
    std::memcpy(&f, &u, 4);
    return FloatToBf16(f);
  };
  EXPECT_EQ(FloatToBf16(1.0f), 0x3f80);
  EXPECT_EQ(FloatToBf16(-2.5f), 0xc020);
  EXPECT_EQ(FloatToBf16(0.0f), 0x0000);
  EXPECT_EQ(FloatToBf16(-0.0f), 0x8000);
  EXPECT_EQ(bits(0x3f808000u), 0x3f80);  // tie -> even (down)
  EXPECT_EQ(bits(0x3f818000u), 0x3f82);  // tie -> even (up)
  EXPECT_EQ(bits(0x3f808001u), 0x3f81);  // above the tie
  EXPECT_EQ(bits(0x3f807fffu), 0x3f80);  // below the tie
  EXPECT_EQ(bits(0x7f7fffffu), 0x7f80);  // FLT_MAX rounds to infinity
  EXPECT_EQ(bits(0xff800000u), 0xff80);  // -infinity stays
  EXPECT_EQ(bits(0x7f800001u), 0x7fc0);  // signalling NaN -> quiet NaN
  EXPECT_EQ(bits(0xffc12345u), 0xffc1);  // NaN keeps sign and top payload
  EXPECT_EQ(bits(0x00000001u), 0x0000);  // smallest subnormal rounds to 0
  // Every finite bf16 is exact as a float and converts back to itself.
  for (uint32_t b = 0; b < 0x10000; ++b) {
    if (((b >> 7) & 0xff) == 0xff) continue;
    ASSERT_EQ(bits(b << 16), b) << b;
  }
}

TEST(SynthModelFormatsTest, QuantizeRowQ8_0FollowsGgml) {
  std::vector<float> x(64);
  for (int j = 0; j < 32; ++j) x[j] = (j - 16) * 0.01f;  // max |x| = 0.16
  uint8_t out[68];
  QuantizeRowQ8_0(x.data(), 64, out);  // second block all zero
  uint16_t d0 = 0, d1 = 0;
  std::memcpy(&d0, out, 2);
  std::memcpy(&d1, out + 34, 2);
  EXPECT_EQ(d0, FloatToHalf(0.16f / 127.0f));
  EXPECT_EQ(d1, 0);
  EXPECT_EQ(static_cast<int8_t>(out[2]), -127);      // -0.16 / d
  EXPECT_EQ(static_cast<int8_t>(out[2 + 16]), 0);
  EXPECT_EQ(static_cast<int8_t>(out[2 + 17]), 8);    // 0.01 / (0.16/127) = 7.94
  EXPECT_EQ(static_cast<int8_t>(out[2 + 31]), 119);  // 0.15 / d = 119.06
  for (int j = 0; j < 32; ++j) EXPECT_EQ(out[36 + j], 0);
}

TEST(SynthModelFormatsTest, SynthWeightIsNormalWithStdDev002) {
  double sum = 0, sum_sq = 0;
  const int n = 200000;
  for (int i = 0; i < n; ++i) {
    const double w = SynthWeight(7, 3, static_cast<uint64_t>(i));
    sum += w;
    sum_sq += w * w;
  }
  const double mean = sum / n;
  const double sd = std::sqrt(sum_sq / n - mean * mean);
  EXPECT_NEAR(mean, 0.0, 0.0005);  // 5 standard errors (0.02 / sqrt(n))
  EXPECT_NEAR(sd, 0.02, 0.0002);
  EXPECT_EQ(SynthWeight(7, 3, 11), SynthWeight(7, 3, 11));
  EXPECT_NE(SynthWeight(7, 3, 11), SynthWeight(8, 3, 11));
  EXPECT_NE(SynthWeight(7, 3, 11), SynthWeight(7, 4, 11));
}

TEST(SynthModelArgsTest, PresetsAndDefaults) {
  absl::StatusOr<SynthModelOptions> o =
      ParseSynthModelArgs({"--out", "x", "--vocab-from", "v", "--preset", "1B", "--type", "q8_0"});
  ASSERT_TRUE(o.ok()) << o.status();
  EXPECT_EQ(o->shape.dim, 2048);
  EXPECT_EQ(o->shape.layers, 16);
  EXPECT_EQ(o->shape.heads, 32);
  EXPECT_EQ(o->shape.kv_heads, 8);
  EXPECT_EQ(o->shape.ff, 5632);
  EXPECT_EQ(o->shape.context, 2048);
  EXPECT_EQ(o->type, gguf::TensorType::kQ8_0);
  EXPECT_EQ(o->seed, 0u);
  o = ParseSynthModelArgs({"--out", "x", "--vocab-from", "v", "--preset", "15M"});
  ASSERT_TRUE(o.ok()) << o.status();
  EXPECT_EQ(o->shape.dim, 288);
  EXPECT_EQ(o->shape.kv_heads, 6);
  EXPECT_EQ(o->shape.context, 256);
  o = ParseSynthModelArgs({"--out", "x", "--vocab-from", "v", "--preset", "110M"});
  ASSERT_TRUE(o.ok()) << o.status();
  EXPECT_EQ(o->shape.ff, 2048);
  EXPECT_EQ(o->shape.layers, 12);
  o = ParseSynthModelArgs(
      {"--out", "x", "--vocab-from", "v", "--dim", "8", "--layers", "1", "--heads", "2",
       "--ff", "4"});
  ASSERT_TRUE(o.ok()) << o.status();
  EXPECT_EQ(o->shape.kv_heads, 2);  // defaults to --heads
  EXPECT_EQ(o->shape.context, 256);
  EXPECT_EQ(o->type, gguf::TensorType::kF32);
  EXPECT_EQ(o->arch, SynthArch::kLlama);
  o = ParseSynthModelArgs({"--out", "x", "--vocab", "byte", "--arch", "qwen2", "--preset", "15M"});
  ASSERT_TRUE(o.ok()) << o.status();
  EXPECT_EQ(o->arch, SynthArch::kQwen2);
  EXPECT_STREQ(SynthArchName(o->arch), "qwen2");
}

// The llama3.2-1b preset as BF16 with the SPM vocabulary: its header (every
// metadata value, tensor type and shape) through GgufFile, with the 2.2 GB
// data section left a hole (the header, then a sparse file of FileSize()).
TEST(SynthModelArgsTest, Llama32_1bPresetBf16Layout) {
  const std::string out = TempPath("synth_llama32_1b_header");
  absl::StatusOr<SynthModelOptions> o = ParseSynthModelArgs(
      {"--out", out, "--vocab-from", Vocab(), "--preset", "llama3.2-1b", "--type", "BF16"});
  ASSERT_TRUE(o.ok()) << o.status();
  EXPECT_EQ(o->shape.dim, 2048);
  EXPECT_EQ(o->shape.layers, 16);
  EXPECT_EQ(o->shape.heads, 32);
  EXPECT_EQ(o->shape.kv_heads, 8);
  EXPECT_EQ(o->shape.ff, 8192);
  EXPECT_EQ(o->shape.context, 8192);
  EXPECT_EQ(o->shape.rope_freq_base, 500000.0f);
  EXPECT_EQ(o->type, gguf::TensorType::kBF16);
  EXPECT_EQ(SynthTypeName(o->type, o->mix), "bf16");
  absl::StatusOr<std::unique_ptr<gguf::GgufFile>> vocab = gguf::GgufFile::Open(Vocab());
  ASSERT_TRUE(vocab.ok()) << vocab.status();
  absl::StatusOr<gguf::GgufWriter> w = BuildSynthModel(*o, **vocab);
  ASSERT_TRUE(w.ok()) << w.status();
  // 2-D weights: token_embd and output 2048 x 32000, per layer q and o
  // 2048 x 2048, k and v 2048 x 512, gate/up/down 2048 x 8192, 2 bytes
  // each; 33 F32 norms of 2048 (every size a multiple of the alignment).
  const uint64_t data = 2ull * (2ull * 32000 * 2048 +
                                16ull * (2 * 2048 * 2048 + 2 * 2048 * 512 + 3 * 2048 * 8192)) +
                        33ull * 2048 * 4;
  EXPECT_EQ(data, 2208571392ull);
  const std::string header = w->Header();
  EXPECT_EQ(w->FileSize(), header.size() + data);
  {
    std::ofstream f(out, std::ios::binary);
    f.write(header.data(), static_cast<std::streamsize>(header.size()));
  }
  std::filesystem::resize_file(out, w->FileSize());  // a hole: no 2 GB written
  absl::StatusOr<std::unique_ptr<gguf::GgufFile>> f = gguf::GgufFile::Open(out);
  std::filesystem::remove(out);
  ASSERT_TRUE(f.ok()) << f.status();
  const gguf::GgufFile& file = **f;
  EXPECT_EQ(*file.GetString("general.architecture"), "llama");
  EXPECT_EQ(*file.GetString("general.name"), "tandem-synth-llama3.2-1b");
  EXPECT_EQ(*file.GetUint("general.file_type"), 32u);
  EXPECT_EQ(*file.GetUint("llama.context_length"), 8192u);
  EXPECT_EQ(*file.GetUint("llama.embedding_length"), 2048u);
  EXPECT_EQ(*file.GetUint("llama.feed_forward_length"), 8192u);
  EXPECT_EQ(*file.GetUint("llama.attention.head_count"), 32u);
  EXPECT_EQ(*file.GetUint("llama.attention.head_count_kv"), 8u);
  EXPECT_EQ(*file.GetUint("llama.block_count"), 16u);
  EXPECT_EQ(*file.GetUint("llama.rope.dimension_count"), 64u);
  EXPECT_EQ(*file.GetFloat("llama.rope.freq_base"), 500000.0f);
  EXPECT_EQ(*file.GetFloat("llama.attention.layer_norm_rms_epsilon"), 1e-5f);
  EXPECT_EQ(*file.GetString("tokenizer.ggml.model"), "llama");
  const auto* tokens =
      std::get_if<std::vector<std::string>>(file.Find("tokenizer.ggml.tokens"));
  ASSERT_NE(tokens, nullptr);
  EXPECT_EQ(tokens->size(), 32000u);
  ASSERT_EQ(file.tensors().size(), 3u + 16u * 9u);
  struct Want {
    const char* name;
    gguf::TensorType type;
    std::vector<uint64_t> dims;
  };
  const gguf::TensorType bf = gguf::TensorType::kBF16, f32 = gguf::TensorType::kF32;
  for (const Want& want : {Want{"token_embd.weight", bf, {2048, 32000}},
                           Want{"output_norm.weight", f32, {2048}},
                           Want{"output.weight", bf, {2048, 32000}},
                           Want{"blk.0.attn_q.weight", bf, {2048, 2048}},
                           Want{"blk.0.attn_k.weight", bf, {2048, 512}},
                           Want{"blk.0.attn_v.weight", bf, {2048, 512}},
                           Want{"blk.15.attn_output.weight", bf, {2048, 2048}},
                           Want{"blk.15.attn_norm.weight", f32, {2048}},
                           Want{"blk.15.ffn_gate.weight", bf, {2048, 8192}},
                           Want{"blk.15.ffn_down.weight", bf, {8192, 2048}},
                           Want{"blk.15.ffn_up.weight", bf, {2048, 8192}},
                           Want{"blk.15.ffn_norm.weight", f32, {2048}}}) {
    const gguf::TensorInfo* t = file.FindTensor(want.name);
    ASSERT_NE(t, nullptr) << want.name;
    EXPECT_EQ(t->type, want.type) << want.name;
    EXPECT_EQ(t->dims, want.dims) << want.name;
  }
}

TEST(SynthModelArgsTest, BadFlagsNameTheFlag) {
  const std::vector<std::string> base = {"--out", "x", "--vocab-from", "v"};
  auto parse = [&](std::vector<std::string> extra) {
    std::vector<std::string> a = base;
    a.insert(a.end(), extra.begin(), extra.end());
    return ParseSynthModelArgs(a).status();
  };
  const std::vector<std::string> shape = {"--dim", "64", "--layers", "2", "--heads", "4",
                                          "--ff", "128"};
  auto with = [&](std::vector<std::string> extra) {
    std::vector<std::string> a = shape;
    a.insert(a.end(), extra.begin(), extra.end());
    return parse(a);
  };
  struct Case {
    absl::Status status;
    std::string flag;
  };
  const Case cases[] = {
      {ParseSynthModelArgs({"--vocab-from", "v", "--preset", "15M"}).status(), "--out"},
      {ParseSynthModelArgs({"--out", "x", "--preset", "15M"}).status(), "--vocab-from"},
      {parse({"--preset", "7B"}), "--preset"},
      {parse({"--preset", "15M", "--dim", "8"}), "--dim"},
      {parse({"--dim", "64", "--heads", "4", "--ff", "128"}), "--layers"},
      {with({"--type", "q4_1"}), "--type"},
      {with({"--type", "q4_k_s"}), "--type"},
      {with({"--seed", "-1"}), "--seed"},
      {with({"--kv-heads", "3"}), "--kv-heads"},
      {with({"--context", "0"}), "--context"},
      {parse({"--dim", "60", "--layers", "2", "--heads", "8", "--ff", "128"}), "--heads"},
      {parse({"--dim", "12", "--layers", "2", "--heads", "4", "--ff", "128"}), "--heads"},
      {parse({"--dim", "48", "--layers", "2", "--heads", "4", "--ff", "128", "--type",
              "q8_0"}),
       "--dim"},
      {parse({"--dim", "64", "--layers", "2", "--heads", "4", "--ff", "100", "--type",
              "q8_0"}),
       "--ff"},
      {with({"--bogus", "1"}), "--bogus"},
      {with({"--arch", "qwen3"}), "--arch"},
  };
  for (const Case& c : cases) {
    EXPECT_EQ(c.status.code(), absl::StatusCode::kInvalidArgument) << c.flag;
    EXPECT_THAT(c.status.message(), HasSubstr(c.flag)) << c.status;
  }
}

TEST(SynthModelTest, MissingOrBadVocabFails) {
  const std::string out = TempPath("synth_bad_vocab");
  absl::StatusOr<SynthModelOptions> o = ParseSynthModelArgs(SmallArgs(out, "f32", "1"));
  ASSERT_TRUE(o.ok());
  o->vocab_from = "/nonexistent/vocab.gguf";
  EXPECT_EQ(WriteSynthModel(*o).code(), absl::StatusCode::kNotFound);
  // A model without a tokenizer array: write one, then use it as the vocab.
  o->vocab_from = Vocab();
  ASSERT_TRUE(WriteSynthModel(*o).ok());
  gguf::GgufWriter empty;
  const std::string no_vocab = TempPath("synth_no_vocab");
  ASSERT_TRUE(empty.WriteFile(no_vocab).ok());
  o->vocab_from = no_vocab;
  absl::Status s = WriteSynthModel(*o);
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(s.message(), HasSubstr("--vocab-from"));
  // A tokenizer the servers cannot build (a WordPiece "bert" vocabulary) is
  // refused up front, naming its type.
  gguf::GgufWriter bert;
  ASSERT_TRUE(bert.AddMetadata("tokenizer.ggml.model", std::string("bert")).ok());
  ASSERT_TRUE(bert.AddMetadata("tokenizer.ggml.tokens",
                               std::vector<std::string>{"[PAD]", "a", "b"})
                  .ok());
  const std::string bert_vocab = TempPath("synth_bert_vocab");
  ASSERT_TRUE(bert.WriteFile(bert_vocab).ok());
  o->vocab_from = bert_vocab;
  s = WriteSynthModel(*o);
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(s.message(), HasSubstr("--vocab-from"));
  EXPECT_THAT(s.message(), HasSubstr("bert"));
  // A byte-level BPE vocabulary (gpt2) is served, so it is taken.
  o->vocab_from = SharedPath("models/ggml-vocab-gpt-2.gguf");
  EXPECT_TRUE(WriteSynthModel(*o).ok());
  std::filesystem::remove(out);
  std::filesystem::remove(no_vocab);
  std::filesystem::remove(bert_vocab);
}

TEST(SynthModelTest, SameSeedSameBytesOtherSeedOtherBytes) {
  const std::string a = WriteSmall("q8_0", "5");
  const std::string a_bytes = ReadFileOrDie(a);
  std::filesystem::remove(a);
  const std::string b = WriteSmall("q8_0", "5");
  EXPECT_TRUE(ReadFileOrDie(b) == a_bytes);
  std::filesystem::remove(b);
  const std::string c = WriteSmall("q8_0", "6");
  const std::string c_bytes = ReadFileOrDie(c);
  EXPECT_EQ(c_bytes.size(), a_bytes.size());
  EXPECT_FALSE(c_bytes == a_bytes);
  std::filesystem::remove(c);
}

TEST(SynthModelTest, RunSynthModelExitStatus) {
  const std::string out = TempPath("synth_run");
  EXPECT_EQ(RunSynthModel({"--out", out}), 2);  // no --vocab-from
  EXPECT_FALSE(std::filesystem::exists(out));
  std::vector<std::string> args = SmallArgs(out, "f16", "3");
  EXPECT_EQ(RunSynthModel(args), 0);
  EXPECT_TRUE(std::filesystem::exists(out));
  args[3] = "/nonexistent/vocab.gguf";
  EXPECT_EQ(RunSynthModel(args), 1);
  std::filesystem::remove(out);
}

// One small synthetic model, opened and loaded.
struct Synth {
  std::unique_ptr<gguf::GgufFile> file;
  std::unique_ptr<model::LlamaModel> model;
};

Synth LoadSmall(const std::string& type) {
  Synth s;
  const std::string path = WriteSmall(type, "42");
  absl::StatusOr<std::unique_ptr<gguf::GgufFile>> f = gguf::GgufFile::Open(path);
  std::filesystem::remove(path);  // the mapping stays valid
  EXPECT_TRUE(f.ok()) << f.status();
  if (!f.ok()) return s;
  s.file = std::move(*f);
  absl::StatusOr<std::unique_ptr<model::LlamaModel>> m = model::LlamaModel::Load(*s.file);
  EXPECT_TRUE(m.ok()) << m.status();
  if (m.ok()) s.model = std::move(*m);
  return s;
}

// Logits of every step of `ids` fed one prefill (ids[0..n_prompt)) and then
// one token at a time (teacher forcing, so all models see the same input).
std::vector<std::vector<float>> StepLogits(const model::LlamaModel& m,
                                           const std::vector<int32_t>& ids, size_t n_prompt) {
  kv::CpuKvStorage kv(m.kv_shape(16), 4);
  kv::BlockPool blocks(4);
  const std::vector<int32_t> table = *blocks.Allocate(4);
  std::vector<std::vector<float>> out;
  std::vector<float> logits;
  model::SequenceBatch e;
  e.block_table = &table;
  e.tokens = std::span<const int32_t>(ids.data(), n_prompt);
  m.Forward(std::span<const model::SequenceBatch>(&e, 1), kv, &logits);
  out.push_back(logits);
  for (size_t i = n_prompt; i < ids.size(); ++i) {
    e.tokens = std::span<const int32_t>(&ids[i], 1);
    e.start_pos = static_cast<int32_t>(i);
    m.Forward(std::span<const model::SequenceBatch>(&e, 1), kv, &logits);
    out.push_back(logits);
  }
  return out;
}

int32_t Argmax(const std::vector<float>& v) {
  return static_cast<int32_t>(std::max_element(v.begin(), v.end()) - v.begin());
}

// Top-1 minus top-2.
float Margin(std::vector<float> v) {
  std::partial_sort(v.begin(), v.begin() + 2, v.end(), std::greater<float>());
  return v[0] - v[1];
}

TEST(SynthModelTest, QuantizedModelsTrackF32) {
  Synth f32 = LoadSmall("f32");
  Synth f16 = LoadSmall("f16");
  Synth q8 = LoadSmall("q8_0");
  Synth bf16 = LoadSmall("bf16");
  ASSERT_TRUE(f32.model && f16.model && q8.model && bf16.model);
  const model::LlamaConfig& c = f32.model->config();
  EXPECT_EQ(c.n_embd, 64);
  EXPECT_EQ(c.n_layers, 2);
  EXPECT_EQ(c.n_head, 4);
  EXPECT_EQ(c.n_head_kv, 2);
  EXPECT_EQ(c.n_ff, 128);
  EXPECT_EQ(c.context_length, 64);
  EXPECT_EQ(c.vocab_size, 32000);
  EXPECT_EQ(f16.file->FindTensor("blk.1.ffn_down.weight")->type, gguf::TensorType::kF16);
  EXPECT_EQ(q8.file->FindTensor("output.weight")->type, gguf::TensorType::kQ8_0);
  EXPECT_EQ(q8.file->FindTensor("output_norm.weight")->type, gguf::TensorType::kF32);
  EXPECT_EQ(*bf16.file->GetUint("general.file_type"), 32u);  // LLAMA_FTYPE_MOSTLY_BF16
  EXPECT_EQ(bf16.file->FindTensor("output_norm.weight")->type, gguf::TensorType::kF32);
  {  // token_embd (2M values, filled on several threads where the machine
     // has several cores) is element i = SynthWeight(42, 0, i), so the
     // thread split changes no byte.
    const gguf::TensorInfo* t = f32.file->FindTensor("token_embd.weight");
    ASSERT_EQ(t->NumElements(), 64u * 32000u);
    for (uint64_t i = 0; i < t->NumElements(); i += 997) {
      float x;
      std::memcpy(&x, t->data + 4 * i, 4);
      ASSERT_EQ(x, SynthWeight(42, 0, i)) << i;
    }
  }
  {  // BF16 weights are FloatToBf16 of the F32 model's, element for element.
    const gguf::TensorInfo* t = bf16.file->FindTensor("blk.1.ffn_down.weight");
    const gguf::TensorInfo* r = f32.file->FindTensor("blk.1.ffn_down.weight");
    ASSERT_EQ(t->type, gguf::TensorType::kBF16);
    ASSERT_EQ(t->n_bytes, 128u * 64u * 2u);
    for (uint64_t i = 0; i < t->NumElements(); ++i) {
      uint16_t b;
      float x;
      std::memcpy(&b, t->data + 2 * i, 2);
      std::memcpy(&x, r->data + 4 * i, 4);
      ASSERT_EQ(b, FloatToBf16(x)) << i;
    }
  }

  // The tokenizer is the SPM vocabulary's (its .inp/.out reference pair).
  absl::StatusOr<std::unique_ptr<tokenizer::Tokenizer>> tok =
      tokenizer::Tokenizer::FromGguf(*f32.file);
  ASSERT_TRUE(tok.ok()) << tok.status();
  absl::StatusOr<std::unique_ptr<gguf::GgufFile>> vocab = gguf::GgufFile::Open(Vocab());
  ASSERT_TRUE(vocab.ok());
  absl::StatusOr<std::unique_ptr<tokenizer::Tokenizer>> ref =
      tokenizer::Tokenizer::FromGguf(**vocab);
  ASSERT_TRUE(ref.ok());
  const std::string prompt = "Once upon a time, there was a little";
  std::vector<int32_t> ids = (*tok)->Encode(prompt, /*add_bos=*/true);
  EXPECT_EQ(ids, (*ref)->Encode(prompt, true));
  const size_t n_prompt = ids.size();

  // Greedy continuation by the F32 model, then all three models see it.
  const int kSteps = 8;
  for (int i = 0; i < kSteps; ++i) {
    ids.push_back(Argmax(StepLogits(*f32.model, ids, ids.size()).back()));
  }
  const auto ref_logits = StepLogits(*f32.model, ids, n_prompt);
  // Tolerances on |logit - f32 logit| (the F32 logits have a spread of
  // about 0.2 here): F16 rounds each weight by <= 2^-11 relative, Q8_0 by
  // <= max|block| / 254 (about 1% of a weight of typical size), BF16 by
// <= 2^-9 relative (4 times F16's bound on the weights).
  struct Variant {
    const char* name;
    const model::LlamaModel* m;
    float tol;
  };
  for (const Variant& v : {Variant{"f16", f16.model.get(), 2e-3f},
                           Variant{"q8_0", q8.model.get(), 2e-2f},
                           Variant{"bf16", bf16.model.get(), 1e-2f}}) {
    const auto logits = StepLogits(*v.m, ids, n_prompt);
    ASSERT_EQ(logits.size(), ref_logits.size());
    int compared_ids = 0;
    float worst = 0;
    for (size_t s = 0; s < logits.size(); ++s) {
      float max_diff = 0;
      for (size_t k = 0; k < logits[s].size(); ++k) {
        max_diff = std::max(max_diff, std::fabs(logits[s][k] - ref_logits[s][k]));
      }
      EXPECT_LE(max_diff, v.tol) << v.name << " step " << s;
      worst = std::max(worst, max_diff);
      if (Margin(ref_logits[s]) > 2 * v.tol) {
        EXPECT_EQ(Argmax(logits[s]), Argmax(ref_logits[s])) << v.name << " step " << s;
        ++compared_ids;
      }
    }
    std::printf("%s: max |logit diff| %g (tolerance %g); greedy ids compared at %d of %zu "
                "steps\n",
                v.name, worst, v.tol, compared_ids, logits.size());
    EXPECT_GT(compared_ids, 0) << v.name;
  }
}

// --- The built-in byte vocabulary and the offline model of `tandem up`. ---

TEST(ByteVocabTest, ParsesAsAlternativeToVocabFrom) {
  const std::vector<std::string> shape = {"--dim", "64", "--layers", "1", "--heads", "4",
                                          "--ff", "64"};
  auto with = [&](std::vector<std::string> extra) {
    extra.insert(extra.end(), shape.begin(), shape.end());
    return ParseSynthModelArgs(extra);
  };
  absl::StatusOr<SynthModelOptions> o = with({"--out", "x.gguf", "--vocab", "byte"});
  ASSERT_TRUE(o.ok()) << o.status();
  EXPECT_TRUE(o->byte_vocab);
  EXPECT_EQ(o->vocab_from, "");
  EXPECT_THAT(with({"--out", "x", "--vocab", "word"}).status().message(), HasSubstr("--vocab:"));
  EXPECT_THAT(with({"--out", "x", "--vocab", "byte", "--vocab-from", Vocab()}).status().message(),
              HasSubstr("--vocab:"));
  EXPECT_THAT(with({"--out", "x"}).status().message(), HasSubstr("--vocab-from:"));
}

// The pieces llama.cpp's SPM conventions call for (see synth_model.h).
TEST(ByteVocabTest, PiecesTypesAndIds) {
  const TokenizerMetadata m = ByteVocabMetadata();
  auto find = [&](const std::string& key) -> const gguf::MetadataValue* {
    for (const auto& [k, v] : m) {
      if (k == key) return &v;
    }
    return nullptr;
  };
  ASSERT_NE(find("tokenizer.ggml.tokens"), nullptr);
  const auto& tokens = std::get<std::vector<std::string>>(*find("tokenizer.ggml.tokens"));
  const auto& types = std::get<std::vector<int32_t>>(*find("tokenizer.ggml.token_type"));
  const auto& scores = std::get<std::vector<float>>(*find("tokenizer.ggml.scores"));
  ASSERT_EQ(tokens.size(), 260u);
  ASSERT_EQ(types.size(), 260u);
  EXPECT_EQ(scores, std::vector<float>(260, 0.0f));
  EXPECT_EQ(tokens[0], "<unk>");
  EXPECT_EQ(tokens[1], "<s>");
  EXPECT_EQ(tokens[2], "</s>");
  EXPECT_EQ(tokens[3], "<0x00>");
  EXPECT_EQ(tokens[3 + 0x41], "<0x41>");
  EXPECT_EQ(tokens[258], "<0xFF>");
  EXPECT_EQ(tokens[259], "\xE2\x96\x81");
  EXPECT_EQ(types[0], 2);
  EXPECT_EQ(types[1], 3);
  EXPECT_EQ(types[2], 3);
  for (int i = 3; i < 259; ++i) EXPECT_EQ(types[i], 6) << i;
  EXPECT_EQ(types[259], 1);
  EXPECT_EQ(std::get<std::string>(*find("tokenizer.ggml.model")), "llama");
  EXPECT_EQ(std::get<bool>(*find("tokenizer.ggml.add_bos_token")), true);
}

// `n` random code points (no surrogates, no U+2581) as UTF-8, 1 to 4 bytes.
std::string RandomUtf8(std::mt19937* rng, int n) {
  std::string out;
  const uint32_t limits[] = {0x7f, 0x7ff, 0xffff, 0x10ffff};
  for (int i = 0; i < n; ++i) {
    uint32_t cp = std::uniform_int_distribution<uint32_t>(1, limits[(*rng)() % 4])(*rng);
    if ((cp >= 0xd800 && cp <= 0xdfff) || cp == 0x2581) cp = 'x';
    if (cp < 0x80) {
      out += static_cast<char>(cp);
    } else if (cp < 0x800) {
      out += static_cast<char>(0xc0 | (cp >> 6));
      out += static_cast<char>(0x80 | (cp & 0x3f));
    } else if (cp < 0x10000) {
      out += static_cast<char>(0xe0 | (cp >> 12));
      out += static_cast<char>(0x80 | ((cp >> 6) & 0x3f));
      out += static_cast<char>(0x80 | (cp & 0x3f));
    } else {
      out += static_cast<char>(0xf0 | (cp >> 18));
      out += static_cast<char>(0x80 | ((cp >> 12) & 0x3f));
      out += static_cast<char>(0x80 | ((cp >> 6) & 0x3f));
      out += static_cast<char>(0x80 | (cp & 0x3f));
    }
  }
  return out;
}

// The offline model of `tandem up`, written into a fresh directory that
// EnsureSynthModel has to create.
class OfflineModelTest : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = TempPath("offline_model_dir");
    path_ = dir_ + "/models/tandem-synthetic-byte.gguf";
  }
  void TearDown() override { std::filesystem::remove_all(dir_); }
  std::string dir_, path_;
};

TEST_F(OfflineModelTest, WritesOnceReusesAndRepairs) {
  const SynthModelOptions o = OfflineModelOptions(path_);
  absl::StatusOr<bool> wrote = EnsureSynthModel(o);
  ASSERT_TRUE(wrote.ok()) << wrote.status();
  EXPECT_TRUE(*wrote);
  const std::string bytes = ReadFileOrDie(path_);
  wrote = EnsureSynthModel(o);
  ASSERT_TRUE(wrote.ok()) << wrote.status();
  EXPECT_FALSE(*wrote);  // same bytes: reused
  {
    std::fstream f(path_, std::ios::in | std::ios::out | std::ios::binary);
    f.seekp(static_cast<std::streamoff>(bytes.size() - 1));
    f.put(static_cast<char>(bytes.back() ^ 1));
  }
  wrote = EnsureSynthModel(o);
  ASSERT_TRUE(wrote.ok()) << wrote.status();
  EXPECT_TRUE(*wrote);
  EXPECT_TRUE(ReadFileOrDie(path_) == bytes);
  // The same flags through the CLI give the same bytes.
  const std::string cli = dir_ + "/cli.gguf";
  EXPECT_EQ(RunSynthModel({"--out", cli, "--vocab", "byte", "--dim", "64", "--layers", "2",
                           "--heads", "4", "--kv-heads", "2", "--ff", "128", "--context",
                           "2048"}),
            0);
  EXPECT_TRUE(ReadFileOrDie(cli) == bytes);
}

TEST_F(OfflineModelTest, LoadsAndTokenizerRoundTripsUtf8) {
  ASSERT_TRUE(EnsureSynthModel(OfflineModelOptions(path_)).ok());
  absl::StatusOr<std::unique_ptr<gguf::GgufFile>> file = gguf::GgufFile::Open(path_);
  ASSERT_TRUE(file.ok()) << file.status();
  absl::StatusOr<std::unique_ptr<model::LlamaModel>> m = model::LlamaModel::Load(**file);
  ASSERT_TRUE(m.ok()) << m.status();
  const model::LlamaConfig& c = (*m)->config();
  EXPECT_EQ(c.n_embd, 64);
  EXPECT_EQ(c.n_layers, 2);
  EXPECT_EQ(c.n_head, 4);
  EXPECT_EQ(c.n_head_kv, 2);
  EXPECT_EQ(c.n_ff, 128);
  EXPECT_EQ(c.context_length, 2048);
  EXPECT_EQ(c.vocab_size, 260);

  absl::StatusOr<std::unique_ptr<tokenizer::Tokenizer>> tok =
      tokenizer::Tokenizer::FromGguf(**file);
  ASSERT_TRUE(tok.ok()) << tok.status();
  const tokenizer::Tokenizer& t = **tok;
  EXPECT_EQ(t.vocab_size(), 260);
  EXPECT_EQ(t.bos_id(), 1);
  EXPECT_EQ(t.eos_id(), 2);
  EXPECT_TRUE(t.add_bos());
  // UTF-8 bytes of "h\u00e9 \u4e16": each byte b is id 3 + b, a space U+2581's id.
  EXPECT_EQ(t.Encode("h\xC3\xA9 \xE4\xB8\x96", true),
            (std::vector<int32_t>{1, 3 + 0x68, 3 + 0xC3, 3 + 0xA9, 259, 3 + 0xE4, 3 + 0xB8,
                                  3 + 0x96}));

  std::mt19937 rng(7);
  std::vector<std::string> texts = {"Once upon a time", " two  spaces ", "\n\t{}\x01",
                                    "\xF0\x9F\x99\x82 smile"};
  for (int i = 0; i < 50; ++i) texts.push_back(RandomUtf8(&rng, 1 + i));
  for (const std::string& text : texts) {
    const std::vector<int32_t> ids = t.Encode(text, /*add_bos=*/true);
    ASSERT_FALSE(ids.empty());
    EXPECT_EQ(ids[0], 1);
    tokenizer::IncrementalDecoder decoder(t);
    std::string decoded;
    for (size_t i = 1; i < ids.size(); ++i) decoded += decoder.Push(ids[i]);
    decoded += decoder.Flush();
    EXPECT_TRUE(decoded == text) << "text of " << text.size() << " bytes";
  }

  // One forward step gives finite logits over the 260 tokens.
  const std::vector<float> logits = StepLogits(**m, t.Encode("hi", true), 3).back();
  ASSERT_EQ(logits.size(), 260u);
  for (float x : logits) EXPECT_TRUE(std::isfinite(x));
}

// --- --arch qwen2 and the tokenizer.* copy. ---

// dim 64, 2 layers, 4 heads, 2 KV heads, ff 128, byte vocabulary.
std::vector<std::string> Qwen2Args(const std::string& out) {
  return {"--out", out, "--vocab", "byte", "--arch", "qwen2", "--dim", "64", "--layers", "2",
          "--heads", "4", "--kv-heads", "2", "--ff", "128", "--context", "512", "--seed", "9"};
}

// Logits of `prompt` prefilled in chunks of `chunk` tokens, in the same
// Forward calls as `other` (prefilled at once, then decoding its greedy
// tokens), with `threads` threads; the last logits of `prompt`.
std::vector<float> LastLogitsBeside(const gguf::GgufFile& file, int32_t threads,
                                    const std::vector<int32_t>& prompt, size_t chunk,
                                    const std::vector<int32_t>* other) {
  absl::StatusOr<std::unique_ptr<model::LlamaModel>> m = model::LlamaModel::Load(file, threads);
  EXPECT_TRUE(m.ok()) << m.status();
  if (!m.ok()) return {};
  if (threads > 1) (*m)->set_min_parallel_work_for_testing(0);
  kv::CpuKvStorage kv((*m)->kv_shape(16), 16);
  kv::BlockPool blocks(16);
  const std::vector<int32_t> table = *blocks.Allocate(8);  // 128 tokens each
  const std::vector<int32_t> other_table = *blocks.Allocate(8);
  std::vector<float> logits, last;
  int32_t other_fed = 0, other_next = 0;
  const size_t vocab = static_cast<size_t>((*m)->config().vocab_size);
  for (size_t fed = 0; fed < prompt.size();) {
    const size_t n = std::min(chunk, prompt.size() - fed);
    std::vector<model::SequenceBatch> batch(1);
    batch[0].tokens = std::span<const int32_t>(prompt).subspan(fed, n);
    batch[0].start_pos = static_cast<int32_t>(fed);
    batch[0].block_table = &table;
    batch[0].want_logits = fed + n == prompt.size();
    if (other != nullptr) {
      model::SequenceBatch o;
      o.block_table = &other_table;
      if (other_fed == 0) {
        o.tokens = *other;
      } else {
        o.tokens = std::span<const int32_t>(&other_next, 1);
      }
      o.start_pos = other_fed;
      batch.push_back(o);
    }
    (*m)->Forward(batch, kv, &logits);
    if (batch[0].want_logits) last.assign(logits.begin(), logits.begin() + vocab);
    if (other != nullptr) {
      const size_t row = batch[0].want_logits ? 1 : 0;
      const auto begin = logits.begin() + static_cast<std::ptrdiff_t>(row * vocab);
      other_next = static_cast<int32_t>(std::max_element(begin, begin + vocab) - begin);
      other_fed += static_cast<int32_t>(batch.back().tokens.size());
    }
    fed += n;
  }
  return last;
}

TEST(SynthQwen2Test, WritesQwen2KeysBiasesAndATiedOutput) {
  const std::string out = TempPath("synth_qwen2_keys");
  absl::StatusOr<SynthModelOptions> o = ParseSynthModelArgs(Qwen2Args(out));
  ASSERT_TRUE(o.ok()) << o.status();
  ASSERT_TRUE(WriteSynthModel(*o).ok());
  absl::StatusOr<std::unique_ptr<gguf::GgufFile>> f = gguf::GgufFile::Open(out);
  std::filesystem::remove(out);
  ASSERT_TRUE(f.ok()) << f.status();
  const gguf::GgufFile& file = **f;
  EXPECT_EQ(*file.GetString("general.architecture"), "qwen2");
  EXPECT_EQ(*file.GetUint("qwen2.block_count"), 2u);
  EXPECT_EQ(*file.GetUint("qwen2.attention.head_count_kv"), 2u);
  EXPECT_EQ(*file.GetFloat("qwen2.rope.freq_base"), 1e6f);
  EXPECT_EQ(*file.GetFloat("qwen2.attention.layer_norm_rms_epsilon"), 1e-6f);
  EXPECT_EQ(file.Find("qwen2.rope.dimension_count"), nullptr);
  EXPECT_EQ(file.Find("llama.block_count"), nullptr);
  EXPECT_EQ(file.FindTensor("output.weight"), nullptr);
  for (const char* name : {"blk.1.attn_q.bias", "blk.1.attn_k.bias", "blk.1.attn_v.bias"}) {
    const gguf::TensorInfo* t = file.FindTensor(name);
    ASSERT_NE(t, nullptr) << name;
    EXPECT_EQ(t->type, gguf::TensorType::kF32) << name;
    EXPECT_EQ(t->dims, (std::vector<uint64_t>{std::string(name).find("_q") != std::string::npos
                                                  ? 64u
                                                  : 32u}))
        << name;
  }
  // Tensors in the documented order: each bias right after its weight.
  std::vector<std::string> names;
  for (const gguf::TensorInfo& t : file.tensors()) names.push_back(t.name);
  ASSERT_GE(names.size(), 8u);
  EXPECT_EQ(std::vector<std::string>(names.begin(), names.begin() + 8),
            (std::vector<std::string>{"token_embd.weight", "output_norm.weight",
                                      "blk.0.attn_q.weight", "blk.0.attn_q.bias",
                                      "blk.0.attn_k.weight", "blk.0.attn_k.bias",
                                      "blk.0.attn_v.weight", "blk.0.attn_v.bias"}));
  EXPECT_EQ(names.size(), 2u + 2u * 12u);
}

TEST(SynthQwen2Test, LoadsRunsAndIsBatchInvariant) {
  const std::string out = TempPath("synth_qwen2_run");
  absl::StatusOr<SynthModelOptions> o = ParseSynthModelArgs(Qwen2Args(out));
  ASSERT_TRUE(o.ok()) << o.status();
  ASSERT_TRUE(WriteSynthModel(*o).ok());
  absl::StatusOr<std::unique_ptr<gguf::GgufFile>> f = gguf::GgufFile::Open(out);
  std::filesystem::remove(out);
  ASSERT_TRUE(f.ok()) << f.status();
  absl::StatusOr<std::unique_ptr<model::LlamaModel>> m = model::LlamaModel::Load(**f);
  ASSERT_TRUE(m.ok()) << m.status();
  const model::LlamaConfig& c = (*m)->config();
  EXPECT_EQ(c.architecture, "qwen2");
  EXPECT_EQ(c.arch, model::ModelArch::kQwen2);
  EXPECT_EQ(c.rope_type, model::RopeType::kNeox);
  EXPECT_TRUE(c.qkv_bias);
  EXPECT_EQ(c.n_embd, 64);
  EXPECT_EQ(c.n_head_kv, 2);
  EXPECT_EQ(c.rope_dim, 16);
  EXPECT_EQ(c.vocab_size, 260);

  absl::StatusOr<std::unique_ptr<tokenizer::Tokenizer>> tok =
      tokenizer::Tokenizer::FromGguf(**f);
  ASSERT_TRUE(tok.ok()) << tok.status();
  const std::vector<int32_t> prompt = (*tok)->Encode("Once upon a time, in a qwen2 graph", true);
  const std::vector<int32_t> other = (*tok)->Encode("another sequence beside it", true);
  ASSERT_GT(prompt.size(), 20u);

  const std::vector<float> alone = LastLogitsBeside(**f, 1, prompt, prompt.size(), nullptr);
  ASSERT_EQ(alone.size(), 260u);
  for (float x : alone) EXPECT_TRUE(std::isfinite(x));
  EXPECT_NE(*std::min_element(alone.begin(), alone.end()),
            *std::max_element(alone.begin(), alone.end()));
  for (int32_t threads : {1, 2}) {
    for (size_t chunk : {size_t{1}, size_t{7}, prompt.size()}) {
      const std::vector<float> got = LastLogitsBeside(**f, threads, prompt, chunk, &other);
      ASSERT_EQ(got.size(), alone.size());
      EXPECT_EQ(std::memcmp(got.data(), alone.data(), alone.size() * sizeof(float)), 0)
          << threads << " threads, chunk " << chunk;
    }
  }
}

// A BPE vocabulary (the Qwen one of qwen2-tiny-synth.gguf) keeps every
// tokenizer.* key: merges, pre, token types (its added tokens), special
// ids, add_bos, and the chat template. (--vocab-from still refuses it until
// the servers build BPE tokenizers; the writer underneath copies it whole.)
TEST(SynthQwen2Test, CopiesEveryTokenizerKeyOfABpeVocabulary) {
  absl::StatusOr<std::unique_ptr<gguf::GgufFile>> vocab =
      gguf::GgufFile::Open(SharedPath("models/qwen2-tiny-synth.gguf"));
  ASSERT_TRUE(vocab.ok()) << vocab.status();
  const TokenizerMetadata copied = TokenizerMetadataOf(**vocab);
  std::vector<std::string> want;
  for (const std::string& key : (*vocab)->metadata_keys()) {
    if (key.rfind("tokenizer.", 0) == 0) want.push_back(key);
  }
  std::vector<std::string> got;
  for (const auto& [key, value] : copied) got.push_back(key);
  EXPECT_EQ(got, want);
  for (const char* key : {"tokenizer.ggml.merges", "tokenizer.ggml.pre",
                          "tokenizer.ggml.token_type", "tokenizer.chat_template"}) {
    EXPECT_NE(std::find(got.begin(), got.end(), key), got.end()) << key;
  }

  const std::string out = TempPath("synth_bpe_vocab");
  absl::StatusOr<SynthModelOptions> o = ParseSynthModelArgs(
      {"--out", out, "--vocab", "byte", "--arch", "qwen2", "--dim", "32", "--layers", "1",
       "--heads", "2", "--ff", "32", "--type", "f16"});
  ASSERT_TRUE(o.ok()) << o.status();
  absl::StatusOr<gguf::GgufWriter> w = BuildSynthModel(*o, copied);
  ASSERT_TRUE(w.ok()) << w.status();
  ASSERT_TRUE(w->WriteFile(out).ok());
  absl::StatusOr<std::unique_ptr<gguf::GgufFile>> f = gguf::GgufFile::Open(out);
  std::filesystem::remove(out);
  ASSERT_TRUE(f.ok()) << f.status();
  for (const std::string& key : want) {
    ASSERT_NE((*f)->Find(key), nullptr) << key;
    EXPECT_TRUE(*(*f)->Find(key) == *(*vocab)->Find(key)) << key;
  }
  // And the model loads with the full vocabulary (tied F16 token_embd).
  absl::StatusOr<std::unique_ptr<model::LlamaModel>> m = model::LlamaModel::Load(**f);
  ASSERT_TRUE(m.ok()) << m.status();
  EXPECT_EQ((*m)->config().vocab_size, 151669);
}

TEST(SynthQwen2Test, DefaultArchIsLlamaWithTheSameBytes) {
  const std::string a = TempPath("synth_default_arch");
  const std::string b = TempPath("synth_llama_arch");
  std::vector<std::string> args = Qwen2Args(a);
  args.erase(args.begin() + 4, args.begin() + 6);  // drop --arch qwen2
  EXPECT_EQ(RunSynthModel(args), 0);
  args[1] = b;
  args.push_back("--arch");
  args.push_back("llama");
  EXPECT_EQ(RunSynthModel(args), 0);
  const std::string bytes = ReadFileOrDie(a);
  EXPECT_TRUE(bytes == ReadFileOrDie(b));
  absl::StatusOr<std::unique_ptr<gguf::GgufFile>> f = gguf::GgufFile::Open(a);
  ASSERT_TRUE(f.ok()) << f.status();
  EXPECT_EQ(*(*f)->GetString("general.architecture"), "llama");
  EXPECT_NE((*f)->FindTensor("output.weight"), nullptr);
  EXPECT_EQ((*f)->FindTensor("blk.0.attn_q.bias"), nullptr);
  std::filesystem::remove(a);
  std::filesystem::remove(b);
}

// --- Block-quantized types (q4_0, the K-quants and their mixes). ---

std::vector<std::string> ShapeArgs(const std::string& type, const std::string& dim,
                                   const std::string& ff) {
  return {"--out", "x", "--vocab", "byte", "--dim", dim, "--layers", "2", "--heads", "4",
          "--ff", ff, "--type", type};
}

TEST(SynthQuantTypesTest, RowsMustBeWholeBlocks) {
  // Rows run along dim (token_embd, output, attention, ffn_gate / ffn_up)
  // and ff (ffn_down): K-quant blocks are 256 weights, Q4_0's 32.
  for (const char* type : {"q4_k", "q5_k", "q6_k", "q4_k_m", "q5_k_m"}) {
    SCOPED_TRACE(type);
    absl::StatusOr<SynthModelOptions> o =
        ParseSynthModelArgs({"--out", "x", "--vocab", "byte", "--preset", "15M", "--type", type});
    EXPECT_EQ(o.status().code(), absl::StatusCode::kInvalidArgument);
    for (const char* part : {"--dim", "multiple of 256", type, "288", "--preset 15M"}) {
      EXPECT_THAT(o.status().message(), HasSubstr(part));
    }
    EXPECT_THAT(ParseSynthModelArgs(ShapeArgs(type, "64", "512")).status().message(),
                HasSubstr("--dim"));
    EXPECT_THAT(ParseSynthModelArgs(ShapeArgs(type, "256", "640")).status().message(),
                HasSubstr("--ff"));
    EXPECT_TRUE(ParseSynthModelArgs(ShapeArgs(type, "256", "512")).ok());
    EXPECT_TRUE(
        ParseSynthModelArgs({"--out", "x", "--vocab", "byte", "--preset", "110M", "--type", type})
            .ok());
  }
  EXPECT_THAT(ParseSynthModelArgs(ShapeArgs("q4_0", "48", "128")).status().message(),
              HasSubstr("--dim"));
  EXPECT_THAT(ParseSynthModelArgs(ShapeArgs("q4_0", "64", "100")).status().message(),
              HasSubstr("--ff"));
  EXPECT_TRUE(
      ParseSynthModelArgs({"--out", "x", "--vocab", "byte", "--preset", "15M", "--type", "q4_0"})
          .ok());
  EXPECT_EQ(RunSynthModel({"--out", TempPath("synth_15m_q4k"), "--vocab", "byte", "--preset",
                           "15M", "--type", "q4_k_m"}),
            2);
}

TEST(SynthQuantTypesTest, ParsesTypeAndMix) {
  struct Case {
    const char* flag;
    gguf::TensorType type;
    QuantMix mix;
  };
  for (const Case& c : {Case{"q4_0", gguf::TensorType::kQ4_0, QuantMix::kPure},
                        Case{"q4_k", gguf::TensorType::kQ4_K, QuantMix::kPure},
                        Case{"q5_k", gguf::TensorType::kQ5_K, QuantMix::kPure},
                        Case{"q6_k", gguf::TensorType::kQ6_K, QuantMix::kPure},
                        Case{"q4_k_m", gguf::TensorType::kQ4_K, QuantMix::kKQuantM},
                        Case{"q5_k_m", gguf::TensorType::kQ5_K, QuantMix::kKQuantM}}) {
    absl::StatusOr<SynthModelOptions> o = ParseSynthModelArgs(ShapeArgs(c.flag, "256", "512"));
    ASSERT_TRUE(o.ok()) << c.flag << ": " << o.status();
    EXPECT_EQ(o->type, c.type) << c.flag;
    EXPECT_EQ(o->mix, c.mix) << c.flag;
    EXPECT_EQ(SynthTypeName(o->type, o->mix), c.flag);
  }
  // llama.cpp's spelling, upper case, is the same type.
  absl::StatusOr<SynthModelOptions> upper = ParseSynthModelArgs(ShapeArgs("Q4_K_M", "256", "512"));
  ASSERT_TRUE(upper.ok()) << upper.status();
  EXPECT_EQ(upper->type, gguf::TensorType::kQ4_K);
  EXPECT_EQ(upper->mix, QuantMix::kKQuantM);
}

// A Q4_K_M model of dim 256, 2 layers (kv dim 128), ff 512, the byte
// vocabulary (260 tokens): llama.cpp's mix for 2 layers puts output and
// layer 1's attn_v and ffn_down (use_more_bits(1, 2): 1 >= 7 * 2 / 8) in
// Q6_K, the rest in Q4_K; norms F32. Bytes: weights / 256 * 144 (Q4_K) or
// 210 (Q6_K), ggml-common.h's block sizes. qwen2 ties the output to
// token_embd, which takes the output's Q6_K.
TEST(SynthQuantTypesTest, Q4_KMTinyModelTypesAndSizes) {
  for (const char* arch : {"llama", "qwen2"}) {
    SCOPED_TRACE(arch);
    const bool qwen2 = std::string(arch) == "qwen2";
    const std::string out = TempPath(std::string("synth_q4km_") + arch);
    std::vector<std::string> args = ShapeArgs("q4_k_m", "256", "512");
    args[1] = out;
    args.insert(args.end(), {"--kv-heads", "2", "--arch", arch});
    EXPECT_EQ(RunSynthModel(args), 0);
    absl::StatusOr<std::unique_ptr<gguf::GgufFile>> f = gguf::GgufFile::Open(out);
    ASSERT_TRUE(f.ok()) << f.status();
    EXPECT_EQ(*(*f)->GetUint("general.file_type"), 15u);  // LLAMA_FTYPE_MOSTLY_Q4_K_M
    const gguf::TensorType k4 = gguf::TensorType::kQ4_K, k6 = gguf::TensorType::kQ6_K;
    struct Want {
      std::string name;
      gguf::TensorType type;
      uint64_t bytes;
    };
    std::vector<Want> want = {{"token_embd.weight", qwen2 ? k6 : k4, qwen2 ? 54600u : 37440u},
                              {"output_norm.weight", gguf::TensorType::kF32, 1024}};
    if (!qwen2) want.push_back({"output.weight", k6, 260 * 210});
    for (int l = 0; l < 2; ++l) {
      const std::string p = "blk." + std::to_string(l) + ".";
      want.push_back({p + "attn_q.weight", k4, 256 * 144});
      want.push_back({p + "attn_k.weight", k4, 128 * 144});
      want.push_back({p + "attn_v.weight", l == 1 ? k6 : k4, l == 1 ? 128u * 210 : 128u * 144});
      want.push_back({p + "attn_output.weight", k4, 256 * 144});
      want.push_back({p + "attn_norm.weight", gguf::TensorType::kF32, 1024});
      want.push_back({p + "ffn_gate.weight", k4, 512 * 144});
      want.push_back({p + "ffn_down.weight", l == 1 ? k6 : k4, l == 1 ? 512u * 210 : 512u * 144});
      want.push_back({p + "ffn_up.weight", k4, 512 * 144});
      if (qwen2) want.push_back({p + "attn_v.bias", gguf::TensorType::kF32, 512});
    }
    for (const Want& w : want) {
      const gguf::TensorInfo* t = (*f)->FindTensor(w.name);
      ASSERT_NE(t, nullptr) << w.name;
      EXPECT_EQ(t->type, w.type) << w.name;
      EXPECT_EQ(t->n_bytes, w.bytes) << w.name;
    }
    EXPECT_EQ((*f)->tensors().size(), qwen2 ? 2u + 2u * 12u : 3u + 2u * 9u);
    absl::StatusOr<std::unique_ptr<model::LlamaModel>> m = model::LlamaModel::Load(**f);
    EXPECT_TRUE(m.ok()) << m.status();
    std::filesystem::remove(out);
  }
}

}  // namespace
}  // namespace tandem::cli
