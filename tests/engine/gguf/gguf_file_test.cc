// GgufFile: the real test models (expected metadata from
// ../shared/models/README.md) and crafted broken files.
#include "engine/gguf/gguf_file.h"

#include <unistd.h>

#include <cstdint>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "tests/test_util.h"

namespace tandem::gguf {
namespace {

using ::testing::ElementsAre;
using ::testing::HasSubstr;
using ::tandem::testing::ReadFileOrDie;
using ::tandem::testing::SharedPath;

const std::string kStories = "models/stories260K.gguf";

// ---- Writing GGUF bytes by hand (layout from ggml/docs/gguf.md). ----

template <typename T>
void Put(std::string& b, T v) {
  b.append(reinterpret_cast<const char*>(&v), sizeof(v));
}
void PutStr(std::string& b, const std::string& s) {
  Put<uint64_t>(b, s.size());
  b += s;
}

struct CraftTensor {
  std::string name;
  std::vector<uint64_t> dims;
  uint32_t type;
  uint64_t rel_offset;
};

// A GGUF file: header, `kv` (already-encoded pairs), tensor infos, padding
// to `alignment`, then `data_bytes` zero bytes of tensor data.
std::string Craft(uint32_t version, uint64_t n_kv, const std::string& kv,
                  const std::vector<CraftTensor>& tensors, uint64_t data_bytes,
                  uint64_t alignment = 32) {
  std::string b = "GGUF";
  Put<uint32_t>(b, version);
  Put<uint64_t>(b, tensors.size());
  Put<uint64_t>(b, n_kv);
  b += kv;
  for (const CraftTensor& t : tensors) {
    PutStr(b, t.name);
    Put<uint32_t>(b, t.dims.size());
    for (uint64_t d : t.dims) Put<uint64_t>(b, d);
    Put<uint32_t>(b, t.type);
    Put<uint64_t>(b, t.rel_offset);
  }
  while (b.size() % alignment != 0) b.push_back('\0');
  b.append(data_bytes, '\0');
  return b;
}

class GgufFileTest : public ::testing::Test {
 protected:
  void SetUp() override {
    char tmpl[] = "/tmp/gguf_file_test_XXXXXX";
    ASSERT_NE(mkdtemp(tmpl), nullptr);
    dir_ = tmpl;
  }
  void TearDown() override { std::filesystem::remove_all(dir_); }

  // Writes `bytes` to a file in the temp dir and opens it.
  absl::StatusOr<std::unique_ptr<GgufFile>> OpenBytes(const std::string& bytes,
                                                      const std::string& name = "x.gguf") {
    const std::string path = dir_ + "/" + name;
    std::ofstream(path, std::ios::binary) << bytes;
    return GgufFile::Open(path);
  }

  // Asserts INVALID_ARGUMENT whose message names the file and contains each
  // of `parts`.
  void ExpectInvalid(const std::string& bytes, const std::vector<std::string>& parts) {
    auto f = OpenBytes(bytes, "bad.gguf");
    ASSERT_FALSE(f.ok());
    EXPECT_EQ(f.status().code(), absl::StatusCode::kInvalidArgument) << f.status();
    EXPECT_THAT(std::string(f.status().message()), HasSubstr("bad.gguf"));
    for (const std::string& p : parts) {
      EXPECT_THAT(std::string(f.status().message()), HasSubstr(p));
    }
  }

  std::string dir_;
};

// ---- Real files. ----

TEST_F(GgufFileTest, Stories260KMetadata) {
  auto f = GgufFile::Open(SharedPath(kStories));
  ASSERT_TRUE(f.ok()) << f.status();
  const GgufFile& g = **f;
  EXPECT_EQ(g.version(), 3u);
  EXPECT_EQ(g.file_size(), 1185376u);
  EXPECT_EQ(g.alignment(), 32u);
  EXPECT_EQ(g.metadata().size(), 19u);
  EXPECT_EQ(*g.GetString("general.architecture"), "llama");
  EXPECT_EQ(*g.GetString("general.name"), "llama");
  EXPECT_EQ(*g.GetUint("llama.context_length"), 2048u);
  EXPECT_EQ(*g.GetUint("llama.embedding_length"), 64u);
  EXPECT_EQ(*g.GetUint("llama.block_count"), 5u);
  EXPECT_EQ(*g.GetUint("llama.feed_forward_length"), 172u);
  EXPECT_EQ(*g.GetUint("llama.attention.head_count"), 8u);
  EXPECT_EQ(*g.GetUint("llama.attention.head_count_kv"), 4u);
  EXPECT_EQ(*g.GetUint("llama.rope.dimension_count"), 8u);
  EXPECT_FLOAT_EQ(*g.GetFloat("llama.attention.layer_norm_rms_epsilon"), 1e-5f);
  EXPECT_EQ(*g.GetString("tokenizer.ggml.model"), "llama");
  EXPECT_EQ(*g.GetUint("tokenizer.ggml.bos_token_id"), 1u);
  EXPECT_EQ(*g.GetUint("tokenizer.ggml.eos_token_id"), 2u);
  EXPECT_EQ(*g.GetUint("tokenizer.ggml.unknown_token_id"), 0u);
  EXPECT_EQ(*g.GetUint("tokenizer.ggml.seperator_token_id"), 4294967295u);
  EXPECT_EQ(*g.GetUint("tokenizer.ggml.padding_token_id"), 4294967295u);
  const auto* tokens = std::get_if<std::vector<std::string>>(g.Find("tokenizer.ggml.tokens"));
  ASSERT_NE(tokens, nullptr);
  ASSERT_EQ(tokens->size(), 512u);
  EXPECT_EQ((*tokens)[1], "<s>");
  EXPECT_EQ((*tokens)[3], "<0x00>");
  EXPECT_EQ((*tokens)[258], "<0xFF>");
  EXPECT_EQ(std::get<std::vector<float>>(*g.Find("tokenizer.ggml.scores")).size(), 512u);
  EXPECT_EQ(std::get<std::vector<int32_t>>(*g.Find("tokenizer.ggml.token_type")).size(), 512u);
  EXPECT_EQ(g.Find("tokenizer.ggml.add_bos_token"), nullptr);
  EXPECT_EQ(g.Find("general.alignment"), nullptr);
  EXPECT_EQ(g.GetUint("llama.vocab_size").status().code(), absl::StatusCode::kNotFound);
}

TEST_F(GgufFileTest, Stories260KTensors) {
  auto f = GgufFile::Open(SharedPath(kStories));
  ASSERT_TRUE(f.ok()) << f.status();
  const GgufFile& g = **f;
  ASSERT_EQ(g.tensors().size(), 48u);
  uint64_t params = 0;
  for (const TensorInfo& t : g.tensors()) {
    EXPECT_EQ(t.type, TensorType::kF32) << t.name;
    EXPECT_EQ(t.n_bytes, 4 * t.NumElements()) << t.name;
    EXPECT_EQ(t.offset % 32, 0u) << t.name;
    EXPECT_LE(t.offset + t.n_bytes, g.file_size()) << t.name;
    params += t.NumElements();
  }
  EXPECT_EQ(params, 292800u);
  auto dims = [&](const std::string& name) {
    const TensorInfo* t = g.FindTensor(name);
    EXPECT_NE(t, nullptr) << name;
    return t == nullptr ? std::vector<uint64_t>{} : t->dims;
  };
  EXPECT_THAT(dims("token_embd.weight"), ElementsAre(64, 512));
  EXPECT_THAT(dims("output_norm.weight"), ElementsAre(64));
  EXPECT_THAT(dims("output.weight"), ElementsAre(64, 512));
  for (int i = 0; i < 5; ++i) {
    const std::string p = "blk." + std::to_string(i) + ".";
    EXPECT_THAT(dims(p + "attn_q.weight"), ElementsAre(64, 64));
    EXPECT_THAT(dims(p + "attn_k.weight"), ElementsAre(64, 32));
    EXPECT_THAT(dims(p + "attn_v.weight"), ElementsAre(64, 32));
    EXPECT_THAT(dims(p + "attn_output.weight"), ElementsAre(64, 64));
    EXPECT_THAT(dims(p + "attn_norm.weight"), ElementsAre(64));
    EXPECT_THAT(dims(p + "ffn_gate.weight"), ElementsAre(64, 172));
    EXPECT_THAT(dims(p + "ffn_up.weight"), ElementsAre(64, 172));
    EXPECT_THAT(dims(p + "ffn_down.weight"), ElementsAre(172, 64));
    EXPECT_THAT(dims(p + "ffn_norm.weight"), ElementsAre(64));
  }
  EXPECT_EQ(g.FindTensor("blk.5.attn_q.weight"), nullptr);

  // The data pointer addresses the same bytes as the file at that offset.
  const std::string bytes = ReadFileOrDie(SharedPath(kStories));
  const TensorInfo* norm = g.FindTensor("output_norm.weight");
  ASSERT_NE(norm, nullptr);
  EXPECT_EQ(std::memcmp(norm->data, bytes.data() + norm->offset, norm->n_bytes), 0);
}

TEST_F(GgufFileTest, TinyRandomF16) {
  auto f = GgufFile::Open(SharedPath("models/llama-2-tiny-random.gguf"));
  ASSERT_TRUE(f.ok()) << f.status();
  const GgufFile& g = **f;
  EXPECT_EQ(g.metadata().size(), 18u);
  EXPECT_EQ(*g.GetString("general.name"), "LLaMA v2");
  EXPECT_EQ(*g.GetUint("general.file_type"), 1u);
  EXPECT_EQ(*g.GetUint("llama.context_length"), 4096u);
  EXPECT_EQ(*g.GetUint("llama.embedding_length"), 8u);
  ASSERT_EQ(g.tensors().size(), 12u);
  uint64_t params = 0;
  for (const TensorInfo& t : g.tensors()) {
    params += t.NumElements();
    const TensorType want = t.dims.size() == 2 ? TensorType::kF16 : TensorType::kF32;
    EXPECT_EQ(t.type, want) << t.name;
    EXPECT_EQ(*TensorBytes(t.type, t.NumElements()), t.n_bytes) << t.name;
  }
  EXPECT_EQ(params, 513048u);
  const TensorInfo* emb = g.FindTensor("token_embd.weight");
  ASSERT_NE(emb, nullptr);
  EXPECT_THAT(emb->dims, ElementsAre(8, 32000));
  EXPECT_EQ(emb->n_bytes, 8u * 32000u * 2u);
  EXPECT_EQ(std::get<std::vector<std::string>>(*g.Find("tokenizer.ggml.tokens")).size(), 32000u);
}

TEST_F(GgufFileTest, VocabOnlyHasNoTensors) {
  auto f = GgufFile::Open(SharedPath("models/ggml-vocab-llama-spm.gguf"));
  ASSERT_TRUE(f.ok()) << f.status();
  const GgufFile& g = **f;
  EXPECT_EQ(g.metadata().size(), 22u);
  EXPECT_TRUE(g.tensors().empty());
  EXPECT_EQ(*g.GetString("general.name"), "llama-spm");
  EXPECT_EQ(*g.GetUint("llama.vocab_size"), 32000u);
  EXPECT_EQ(*g.GetString("tokenizer.ggml.pre"), "default");
  EXPECT_TRUE(*g.GetBool("tokenizer.ggml.add_bos_token"));
  EXPECT_FALSE(*g.GetBool("tokenizer.ggml.add_eos_token"));
  EXPECT_EQ(*g.GetUint("llama.block_count"), 32u);
  EXPECT_EQ(*g.GetUint("llama.feed_forward_length"), 11008u);
}

TEST_F(GgufFileTest, GetterErrors) {
  auto f = GgufFile::Open(SharedPath(kStories));
  ASSERT_TRUE(f.ok()) << f.status();
  EXPECT_EQ((*f)->GetString("no.such.key").status().code(), absl::StatusCode::kNotFound);
  auto s = (*f)->GetUint("general.architecture");
  EXPECT_EQ(s.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(std::string(s.status().message()), HasSubstr("general.architecture"));
  EXPECT_EQ((*f)->GetBool("llama.block_count").status().code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_EQ((*f)->GetFloat("general.name").status().code(),
            absl::StatusCode::kInvalidArgument);
}

TEST(TensorBytesTest, BlockSizes) {
  EXPECT_EQ(TensorBytes(TensorType::kF32, 10), 40u);
  EXPECT_EQ(TensorBytes(TensorType::kF16, 10), 20u);
  EXPECT_EQ(TensorBytes(TensorType::kBF16, 10), 20u);
  EXPECT_EQ(TensorBytes(TensorType::kQ8_0, 64), 68u);
  EXPECT_EQ(TensorBytes(TensorType::kQ8_0, 33), std::nullopt);
  EXPECT_EQ(TensorBytes(TensorType::kF32, UINT64_MAX / 2), std::nullopt);
  EXPECT_EQ(TensorTypeName(TensorType::kQ8_0), "Q8_0");
  EXPECT_EQ(TensorTypeName(TensorType::kBF16), "BF16");
}

// ---- Crafted files. ----

TEST_F(GgufFileTest, MissingFileIsNotFound) {
  auto f = GgufFile::Open(dir_ + "/does_not_exist.gguf");
  EXPECT_EQ(f.status().code(), absl::StatusCode::kNotFound);
  EXPECT_THAT(std::string(f.status().message()), HasSubstr("does_not_exist.gguf"));
}

// Every GGUF value type, general.alignment = 64 and Q8_0 + BF16 tensors.
std::string CraftAllTypes() {
  std::string kv;
  auto key = [&](const std::string& k, uint32_t type) { PutStr(kv, k); Put<uint32_t>(kv, type); };
  key("u8", 0); Put<uint8_t>(kv, 200);
  key("i8", 1); Put<int8_t>(kv, -5);
  key("u16", 2); Put<uint16_t>(kv, 60000);
  key("i16", 3); Put<int16_t>(kv, -300);
  key("u32", 4); Put<uint32_t>(kv, 4000000000u);
  key("i32", 5); Put<int32_t>(kv, -7);
  key("f32", 6); Put<float>(kv, 1.5f);
  key("bool", 7); Put<uint8_t>(kv, 1);
  key("str", 8); PutStr(kv, "hello");
  key("u64", 10); Put<uint64_t>(kv, 1ull << 40);
  key("i64", 11); Put<int64_t>(kv, -9);
  key("f64", 12); Put<double>(kv, 0.25);
  key("general.alignment", 4); Put<uint32_t>(kv, 64);
  key("arr_str", 9); Put<uint32_t>(kv, 8); Put<uint64_t>(kv, 2); PutStr(kv, "a"); PutStr(kv, "");
  key("arr_i32", 9); Put<uint32_t>(kv, 5); Put<uint64_t>(kv, 3);
  for (int32_t v : {1, -2, 3}) Put<int32_t>(kv, v);
  key("arr_bool", 9); Put<uint32_t>(kv, 7); Put<uint64_t>(kv, 2); Put<uint8_t>(kv, 0); Put<uint8_t>(kv, 1);
  key("arr_f64", 9); Put<uint32_t>(kv, 12); Put<uint64_t>(kv, 0);
  // Q8_0 [64, 2]: 4 blocks of 34 bytes = 136; BF16 [3] = 6 bytes at 192.
  return Craft(3, 17, kv, {{"q", {64, 2}, 8, 0}, {"b", {3}, 30, 192}}, 256, 64);
}

TEST_F(GgufFileTest, AllValueTypesAndCustomAlignment) {
  auto f = OpenBytes(CraftAllTypes());
  ASSERT_TRUE(f.ok()) << f.status();
  const GgufFile& g = **f;
  EXPECT_EQ(g.alignment(), 64u);
  EXPECT_EQ(std::get<uint8_t>(*g.Find("u8")), 200);
  EXPECT_EQ(std::get<int8_t>(*g.Find("i8")), -5);
  EXPECT_EQ(std::get<uint16_t>(*g.Find("u16")), 60000);
  EXPECT_EQ(std::get<int16_t>(*g.Find("i16")), -300);
  EXPECT_EQ(*g.GetUint("u32"), 4000000000u);
  EXPECT_EQ(g.GetUint("i32").status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(*g.GetFloat("f32"), 1.5f);
  EXPECT_TRUE(*g.GetBool("bool"));
  EXPECT_EQ(*g.GetString("str"), "hello");
  EXPECT_EQ(*g.GetUint("u64"), 1ull << 40);
  EXPECT_EQ(std::get<int64_t>(*g.Find("i64")), -9);
  EXPECT_EQ(*g.GetFloat("f64"), 0.25f);
  EXPECT_THAT(std::get<std::vector<std::string>>(*g.Find("arr_str")), ElementsAre("a", ""));
  EXPECT_THAT(std::get<std::vector<int32_t>>(*g.Find("arr_i32")), ElementsAre(1, -2, 3));
  EXPECT_THAT(std::get<std::vector<bool>>(*g.Find("arr_bool")), ElementsAre(false, true));
  EXPECT_TRUE(std::get<std::vector<double>>(*g.Find("arr_f64")).empty());
  ASSERT_EQ(g.tensors().size(), 2u);
  const TensorInfo* q = g.FindTensor("q");
  ASSERT_NE(q, nullptr);
  EXPECT_EQ(q->type, TensorType::kQ8_0);
  EXPECT_EQ(q->n_bytes, 136u);
  EXPECT_EQ(q->offset % 64, 0u);
  const TensorInfo* b = g.FindTensor("b");
  ASSERT_NE(b, nullptr);
  EXPECT_EQ(b->type, TensorType::kBF16);
  EXPECT_EQ(b->offset, q->offset + 192);
  EXPECT_EQ(b->n_bytes, 6u);
}

TEST_F(GgufFileTest, BadMagic) {
  std::string bytes = Craft(3, 0, "", {}, 0);
  bytes[0] = 'X';
  ExpectInvalid(bytes, {"not a GGUF file"});
  ExpectInvalid("hello world, this is text", {"not a GGUF file"});
}

TEST_F(GgufFileTest, Version2Rejected) {
  ExpectInvalid(Craft(2, 0, "", {}, 0), {"version 2"});
}

TEST_F(GgufFileTest, EmptyFileIsTruncatedAtMagic) {
  ExpectInvalid("", {"truncated", "magic"});
}

// Cut stories260K at points found from the GGUF layout and the bytes of the
// real file; each names the field it stopped in.
TEST_F(GgufFileTest, TruncatedStories260K) {
  const std::string bytes = ReadFileOrDie(SharedPath(kStories));
  ASSERT_EQ(bytes.size(), 1185376u);
  ExpectInvalid(bytes.substr(0, 2), {"truncated", "magic"});
  ExpectInvalid(bytes.substr(0, 6), {"truncated", "version"});
  ExpectInvalid(bytes.substr(0, 12), {"truncated", "tensor count"});
  ExpectInvalid(bytes.substr(0, 20), {"truncated", "metadata count"});
  // Cut inside the first key's string (24 = header; key length u64 follows).
  ExpectInvalid(bytes.substr(0, 24 + 4), {"truncated", "metadata key #0"});
  ExpectInvalid(bytes.substr(0, 24 + 8 + 3), {"truncated", "metadata key #0"});
  // Right after the key "tokenizer.ggml.tokens": its value type is missing.
  const std::string tokens_key = "tokenizer.ggml.tokens";
  const size_t key_at = bytes.find(tokens_key);
  ASSERT_NE(key_at, std::string::npos);
  ExpectInvalid(bytes.substr(0, key_at + tokens_key.size()),
                {"truncated", "tokenizer.ggml.tokens", "value type"});
  // Mid-array: the 512-token array cannot fit.
  ExpectInvalid(bytes.substr(0, key_at + tokens_key.size() + 4 + 4 + 8 + 100),
                {"tokenizer.ggml.tokens"});
  // Inside a tensor info: after the name of blk.0.attn_k.weight.
  const std::string tname = "blk.0.attn_k.weight";
  const size_t name_at = bytes.find(tname);
  ASSERT_NE(name_at, std::string::npos);
  ExpectInvalid(bytes.substr(0, name_at + tname.size() + 2),
                {"truncated", "blk.0.attn_k.weight", "n_dims"});
  // Data section cut: the last tensor's data no longer fits.
  ExpectInvalid(bytes.substr(0, bytes.size() - 1), {"out of range"});
  ExpectInvalid(bytes.substr(0, 20000), {"out of range"});
}

TEST_F(GgufFileTest, UnknownTensorTypeNamesTensorAndType) {
  // Q2_K (10) is a ggml type Tandem does not read: named by ggml's name.
  ExpectInvalid(Craft(3, 0, "", {{"blk.0.attn_q.weight", {256, 4}, 10, 0}}, 4096),
                {"blk.0.attn_q.weight", "type Q2_K (10)"});
  ExpectInvalid(Craft(3, 0, "", {{"w", {4}, 99, 0}}, 64), {"'w'", "type 99"});
}

TEST_F(GgufFileTest, TensorOffsetPastEndOfFile) {
  ExpectInvalid(Craft(3, 0, "", {{"w", {8}, 0, 4096}}, 64), {"'w'", "out of range"});
  // Fits the offset but not the size.
  ExpectInvalid(Craft(3, 0, "", {{"w", {100}, 0, 0}}, 64), {"'w'", "out of range"});
  // Offset near 2^64 must not wrap around.
  ExpectInvalid(Craft(3, 0, "", {{"w", {8}, 0, UINT64_MAX - 31}}, 64), {"'w'", "out of range"});
}

TEST_F(GgufFileTest, MisalignedTensorOffset) {
  ExpectInvalid(Craft(3, 0, "", {{"w", {4}, 0, 4}}, 64), {"'w'", "alignment"});
}

TEST_F(GgufFileTest, OverlappingTensors) {
  ExpectInvalid(Craft(3, 0, "", {{"a", {16}, 0, 0}, {"b", {8}, 0, 32}}, 128), {"overlap"});
}

TEST_F(GgufFileTest, TooManyDims) {
  ExpectInvalid(Craft(3, 0, "", {{"w", {1, 1, 1, 1, 1}, 0, 0}}, 64), {"'w'", "n_dims 5"});
}

TEST_F(GgufFileTest, ElementCountOverflow) {
  ExpectInvalid(Craft(3, 0, "", {{"w", {1ull << 32, 1ull << 32}, 0, 0}}, 64),
                {"'w'", "overflow", "ne[0..1] = [4294967296, 4294967296]"});
  // The dims read so far are all named, the huge one first here.
  ExpectInvalid(Craft(3, 0, "", {{"w", {1ull << 62, 288}, 0, 0}}, 64),
                {"'w'", "ne[0..1] = [4611686018427387904, 288]"});
}

TEST_F(GgufFileTest, Q8RowNotWholeBlocks) {
  ExpectInvalid(Craft(3, 0, "", {{"w", {48, 2}, 8, 0}}, 256), {"'w'", "block size"});
}

TEST_F(GgufFileTest, DuplicateTensorName) {
  ExpectInvalid(Craft(3, 0, "", {{"w", {8}, 0, 0}, {"w", {8}, 0, 32}}, 64), {"duplicate", "'w'"});
}

TEST_F(GgufFileTest, HugeStringLength) {
  std::string kv;
  PutStr(kv, "k");
  Put<uint32_t>(kv, 8);
  Put<uint64_t>(kv, UINT64_MAX);  // string length
  ExpectInvalid(Craft(3, 1, kv, {}, 0), {"truncated", "'k'", "string bytes"});
}

TEST_F(GgufFileTest, HugeArrayCount) {
  std::string kv;
  PutStr(kv, "arr");
  Put<uint32_t>(kv, 9);
  Put<uint32_t>(kv, 4);
  Put<uint64_t>(kv, 1ull << 62);
  ExpectInvalid(Craft(3, 1, kv, {}, 0), {"'arr'", "cannot fit"});
}

TEST_F(GgufFileTest, HugeCounts) {
  std::string b = "GGUF";
  Put<uint32_t>(b, 3);
  Put<uint64_t>(b, 0);
  Put<uint64_t>(b, UINT64_MAX);
  ExpectInvalid(b, {"truncated", "metadata key #0"});
  b = "GGUF";
  Put<uint32_t>(b, 3);
  Put<uint64_t>(b, UINT64_MAX);
  Put<uint64_t>(b, 0);
  ExpectInvalid(b, {"truncated", "tensor #0 name"});
}

TEST_F(GgufFileTest, NestedArrayAndUnknownValueType) {
  std::string kv;
  PutStr(kv, "nested");
  Put<uint32_t>(kv, 9);
  Put<uint32_t>(kv, 9);
  Put<uint64_t>(kv, 1);
  ExpectInvalid(Craft(3, 1, kv, {}, 0), {"'nested'", "nested arrays"});
  kv.clear();
  PutStr(kv, "odd");
  Put<uint32_t>(kv, 77);
  ExpectInvalid(Craft(3, 1, kv, {}, 0), {"'odd'", "value type 77"});
}

TEST_F(GgufFileTest, BadAlignmentAndDuplicateKey) {
  std::string kv;
  PutStr(kv, "general.alignment");
  Put<uint32_t>(kv, 4);
  Put<uint32_t>(kv, 48);
  ExpectInvalid(Craft(3, 1, kv, {}, 0), {"general.alignment", "power of two"});
  kv.clear();
  for (int i = 0; i < 2; ++i) {
    PutStr(kv, "k");
    Put<uint32_t>(kv, 4);
    Put<uint32_t>(kv, 1);
  }
  ExpectInvalid(Craft(3, 2, kv, {}, 0), {"duplicate", "'k'"});
}

// Robustness: every proper prefix of a valid file is rejected cleanly, and
// flipped bytes never crash the parser (run under ASan/UBSan in CI).
TEST_F(GgufFileTest, EveryPrefixIsRejected) {
  const std::string bytes = CraftAllTypes();
  // The last tensor ("b", 6 bytes at +192) ends 58 bytes before the end.
  const size_t needed = bytes.size() - 256 + 198;
  for (size_t n = 0; n < needed; ++n) {
    auto f = OpenBytes(bytes.substr(0, n));
    ASSERT_FALSE(f.ok()) << "prefix of " << n << " bytes";
    EXPECT_EQ(f.status().code(), absl::StatusCode::kInvalidArgument) << n;
  }
  EXPECT_TRUE(OpenBytes(bytes.substr(0, needed)).ok());
}

TEST_F(GgufFileTest, CorruptedBytesNeverCrash) {
  const std::string good = CraftAllTypes();
  uint32_t state = 12345;  // fixed LCG: reproducible corruption
  for (int iter = 0; iter < 500; ++iter) {
    std::string bytes = good;
    for (int k = 0; k < 3; ++k) {
      state = state * 1664525u + 1013904223u;
      bytes[(state >> 8) % bytes.size()] = static_cast<char>(state >> 24);
    }
    auto f = OpenBytes(bytes);
    if (!f.ok()) {
      EXPECT_EQ(f.status().code(), absl::StatusCode::kInvalidArgument);
    }
  }
}

}  // namespace
}  // namespace tandem::gguf
