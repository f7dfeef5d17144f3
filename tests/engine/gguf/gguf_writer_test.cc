// GgufWriter: rewriting the shared models (written by ggml/llama.cpp)
// reproduces them byte for byte; every metadata type survives a round trip
// through GgufFile; bad input is rejected.
#include "engine/gguf/gguf_writer.h"

#include <unistd.h>

#include <algorithm>
#include <cstdint>
#include <cstring>
#include <filesystem>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "engine/gguf/gguf_file.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "tests/test_util.h"

namespace tandem::gguf {
namespace {

using ::testing::ElementsAre;
using ::testing::HasSubstr;
using ::tandem::testing::ReadFileOrDie;
using ::tandem::testing::SharedPath;

// Copies every key (file order) and tensor (file order, same bytes) of
// `file` into a writer with the file's alignment.
GgufWriter Copy(const GgufFile& file) {
  GgufWriter w(file.alignment());
  for (const std::string& key : file.metadata_keys()) {
    EXPECT_TRUE(w.AddMetadata(key, *file.Find(key)).ok()) << key;
  }
  for (const TensorInfo& t : file.tensors()) {
    EXPECT_TRUE(w.AddTensorView(t.name, t.type, t.dims, t.data).ok()) << t.name;
  }
  return w;
}

std::string TempPath(const std::string& name) {
  return (std::filesystem::temp_directory_path() /
          (name + "." + std::to_string(::getpid()) + ".gguf"))
      .string();
}

void ExpectRewriteIsIdentical(const std::string& model) {
  const std::string path = SharedPath("models/" + model);
  absl::StatusOr<std::unique_ptr<GgufFile>> f = GgufFile::Open(path);
  ASSERT_TRUE(f.ok()) << f.status();
  const std::string original = ReadFileOrDie(path);
  GgufWriter w = Copy(**f);
  EXPECT_EQ(w.FileSize(), original.size());
  const std::string bytes = w.Serialize();
  ASSERT_EQ(bytes.size(), original.size());
  EXPECT_TRUE(bytes == original) << "first difference at byte "
                                 << (std::mismatch(bytes.begin(), bytes.end(),
                                                   original.begin()).first -
                                     bytes.begin());
  // WriteFile streams the same bytes.
  const std::string out = TempPath(model);
  ASSERT_TRUE(w.WriteFile(out).ok());
  EXPECT_TRUE(ReadFileOrDie(out) == original);
  std::filesystem::remove(out);
}

TEST(GgufWriterTest, RewritesStories260KByteForByte) {
  ExpectRewriteIsIdentical("stories260K.gguf");
}

TEST(GgufWriterTest, RewritesLlama2TinyRandomByteForByte) {
  ExpectRewriteIsIdentical("llama-2-tiny-random.gguf");
}

TEST(GgufWriterTest, RewritesVocabOnlyFileByteForByte) {
  ExpectRewriteIsIdentical("ggml-vocab-llama-spm.gguf");
}

TEST(GgufWriterTest, EveryMetadataTypeRoundTripsInOrder) {
  GgufWriter w(64);
  const std::vector<std::pair<std::string, MetadataValue>> kv = {
      {"z.u8", uint8_t{200}},
      {"a.i8", int8_t{-5}},
      {"m.u16", uint16_t{60000}},
      {"b.i16", int16_t{-30000}},
      {"c.u32", uint32_t{4000000000u}},
      {"d.i32", int32_t{-2000000000}},
      {"e.f32", 1.5f},
      {"f.bool", true},
      {"g.str", std::string("h\xc3\xa9llo")},
      {"h.u64", uint64_t{1} << 60},
      {"i.i64", int64_t{-(int64_t{1} << 60)}},
      {"j.f64", 0.1},
      {"general.alignment", uint32_t{64}},
      {"k.astr", std::vector<std::string>{"", "x", "yz"}},
      {"l.af32", std::vector<float>{1.0f, -2.5f}},
      {"n.ai32", std::vector<int32_t>{-1, 2}},
      {"o.au32", std::vector<uint32_t>{7}},
      {"p.ai64", std::vector<int64_t>{-9}},
      {"q.au64", std::vector<uint64_t>{9}},
      {"r.au8", std::vector<uint8_t>{1, 255}},
      {"s.ai8", std::vector<int8_t>{-128}},
      {"t.abool", std::vector<bool>{true, false, true}},
      {"u.af64", std::vector<double>{2.25}},
      {"v.ai16", std::vector<int16_t>{-3}},
      {"w.au16", std::vector<uint16_t>{3}},
      {"x.empty", std::vector<float>{}},
  };
  for (const auto& [k, v] : kv) ASSERT_TRUE(w.AddMetadata(k, v).ok()) << k;
  // Odd sizes force padding between tensors.
  const std::string a(4 * 3, '\x11');
  const std::string b(2 * 5, '\x22');
  std::string q(34, '\0');
  q[0] = '\x01';
  q[33] = '\x7f';
  ASSERT_TRUE(w.AddTensor("a", TensorType::kF32, {3}, a).ok());
  ASSERT_TRUE(w.AddTensor("b", TensorType::kF16, {5, 1}, b).ok());
  ASSERT_TRUE(w.AddTensorFill("q", TensorType::kQ8_0, {32},
                              [&](uint8_t* out) { std::memcpy(out, q.data(), 34); })
                  .ok());
  const std::string path = TempPath("every_type");
  ASSERT_TRUE(w.WriteFile(path).ok());
  absl::StatusOr<std::unique_ptr<GgufFile>> f = GgufFile::Open(path);
  ASSERT_TRUE(f.ok()) << f.status();
  EXPECT_EQ((*f)->alignment(), 64u);
  ASSERT_EQ((*f)->metadata_keys().size(), kv.size());
  for (size_t i = 0; i < kv.size(); ++i) {
    EXPECT_EQ((*f)->metadata_keys()[i], kv[i].first);
    ASSERT_NE((*f)->Find(kv[i].first), nullptr);
    EXPECT_TRUE(*(*f)->Find(kv[i].first) == kv[i].second) << kv[i].first;
  }
  const std::vector<TensorInfo>& t = (*f)->tensors();
  ASSERT_EQ(t.size(), 3u);
  EXPECT_EQ(t[0].name, "a");
  EXPECT_EQ(t[1].name, "b");
  EXPECT_THAT(t[1].dims, ElementsAre(5, 1));
  EXPECT_EQ(t[2].type, TensorType::kQ8_0);
  EXPECT_EQ(t[1].offset - t[0].offset, 64u);
  EXPECT_EQ(t[2].offset - t[1].offset, 64u);
  EXPECT_EQ(std::string(reinterpret_cast<const char*>(t[0].data), 12), a);
  EXPECT_EQ(std::string(reinterpret_cast<const char*>(t[1].data), 10), b);
  EXPECT_EQ(std::string(reinterpret_cast<const char*>(t[2].data), 34), q);
  // Serialize and WriteFile agree; the last tensor is padded to 64 too.
  EXPECT_EQ(ReadFileOrDie(path), w.Serialize());
  EXPECT_EQ((*f)->file_size() % 64, 0u);
  std::filesystem::remove(path);
}

TEST(GgufWriterTest, RejectsBadInput) {
  GgufWriter w;
  ASSERT_TRUE(w.AddMetadata("k", uint32_t{1}).ok());
  absl::Status s = w.AddMetadata("k", uint32_t{2});
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(s.message(), HasSubstr("'k'"));
  s = w.AddMetadata("general.alignment", uint32_t{64});
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(s.message(), HasSubstr("general.alignment"));
  EXPECT_EQ(w.AddMetadata("general.alignment", uint64_t{32}).code(),
            absl::StatusCode::kInvalidArgument);

  ASSERT_TRUE(w.AddTensor("t", TensorType::kF32, {2}, std::string(8, '\0')).ok());
  s = w.AddTensor("t", TensorType::kF32, {2}, std::string(8, '\0'));
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(s.message(), HasSubstr("duplicate tensor 't'"));
  s = w.AddTensor("u", TensorType::kF32, {3}, std::string(8, '\0'));
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(s.message(), HasSubstr("'u'"));
  s = w.AddTensor("v", TensorType::kQ8_0, {16}, std::string(17, '\0'));
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(s.message(), HasSubstr("block size 32"));
  EXPECT_EQ(w.AddTensor("w", TensorType::kF32, {1, 1, 1, 1, 1}, std::string(4, '\0')).code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(w.AddTensorFill("x", TensorType::kF32, {uint64_t{1} << 62, 4}, nullptr).code(),
            absl::StatusCode::kInvalidArgument);

  GgufWriter bad(48);
  EXPECT_EQ(bad.AddMetadata("k", uint32_t{1}).code(), absl::StatusCode::kInvalidArgument);

  EXPECT_EQ(w.WriteFile("/nonexistent-dir/x.gguf").code(),
            absl::StatusCode::kFailedPrecondition);
}

}  // namespace
}  // namespace tandem::gguf
