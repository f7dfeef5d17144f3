// Tokenizer: llama.cpp's test-tokenizer-0 pairs for the Llama-2 SPM vocab
// (../shared/models/ggml-vocab-llama-spm.gguf.{inp,out}) and the
// stories260K goldens (../shared/goldens/stories260K_greedy.json).
#include "engine/tokenizer/tokenizer.h"

#include <unistd.h>

#include <algorithm>
#include <cstdint>
#include <filesystem>
#include <fstream>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "nlohmann/json.hpp"
#include "tests/engine/tokenizer/tokenizer_test_util.h"
#include "tests/test_util.h"

namespace tandem::tokenizer {
namespace {

using ::testing::ElementsAreArray;
using ::testing::HasSubstr;
using ::tandem::testing::ReadFileOrDie;
using ::tandem::testing::SharedPath;
using ::tandem::tokenizer::testing::Decode;
using ::tandem::tokenizer::testing::kNumVocabCases;
using ::tandem::tokenizer::testing::Load;
using ::tandem::tokenizer::testing::Loaded;

constexpr char kSpmVocab[] = "ggml-vocab-llama-spm.gguf";

std::vector<std::string> VocabInputs() { return testing::VocabInputs(kSpmVocab); }
std::vector<std::vector<int32_t>> VocabOutputs() { return testing::VocabOutputs(kSpmVocab); }

// Id of `piece` read straight from the file's token list.
int32_t PieceId(const gguf::GgufFile& f, const std::string& piece) {
  const auto& tokens = std::get<std::vector<std::string>>(*f.Find("tokenizer.ggml.tokens"));
  for (size_t i = 0; i < tokens.size(); ++i) {
    if (tokens[i] == piece) return static_cast<int32_t>(i);
  }
  ADD_FAILURE() << "no piece " << piece;
  return -1;
}

TEST(VocabFileTest, HasAllCases) {
  const std::vector<std::string> in = VocabInputs();
  ASSERT_EQ(in.size(), kNumVocabCases + 1u);
  EXPECT_EQ(in.back(), "");  // the file ends with a separator
  EXPECT_EQ(VocabOutputs().size(), static_cast<size_t>(kNumVocabCases));
}

// One ctest entry per .inp/.out case, on the vocab-only file and on
// llama-2-tiny-random.gguf (the same Llama-2 vocabulary).
class LlamaSpmCaseTest : public ::testing::TestWithParam<std::tuple<std::string, int>> {};

TEST_P(LlamaSpmCaseTest, MatchesLlamaCpp) {
  const auto& [model, i] = GetParam();
  static const std::vector<std::string> inputs = VocabInputs();
  static const std::vector<std::vector<int32_t>> outputs = VocabOutputs();
  ASSERT_LT(static_cast<size_t>(i), outputs.size());
  Loaded l = Load(model);
  ASSERT_NE(l.tokenizer, nullptr);
  const std::string& text = inputs[i];
  EXPECT_THAT(l.tokenizer->Encode(text, /*add_bos=*/false), ElementsAreArray(outputs[i]))
      << "case " << i << ": \"" << text << "\"";
  // With BOS: the same ids after id 1.
  std::vector<int32_t> with_bos = {1};
  with_bos.insert(with_bos.end(), outputs[i].begin(), outputs[i].end());
  EXPECT_THAT(l.tokenizer->Encode(text, /*add_bos=*/true), ElementsAreArray(with_bos));
  // Byte fallback makes SPM lossless up to the added space prefix.
  EXPECT_EQ(Decode(*l.tokenizer, outputs[i]), text.empty() ? "" : " " + text)
      << "case " << i;
}

INSTANTIATE_TEST_SUITE_P(
    VocabCases, LlamaSpmCaseTest,
    ::testing::Combine(::testing::Values(std::string("models/") + kSpmVocab,
                                         "models/llama-2-tiny-random.gguf"),
                       ::testing::Range(0, kNumVocabCases)),
    [](const ::testing::TestParamInfo<LlamaSpmCaseTest::ParamType>& info) {
      const std::string& m = std::get<0>(info.param);
      return std::string(m.find("tiny") != std::string::npos ? "TinyRandom" : "VocabSpm") +
             "_Case" + std::to_string(std::get<1>(info.param));
    });

nlohmann::json Goldens() {
  return nlohmann::json::parse(ReadFileOrDie(SharedPath("goldens/stories260K_greedy.json")));
}

TEST(Stories260KTest, Properties) {
  Loaded l = Load("models/stories260K.gguf");
  ASSERT_NE(l.tokenizer, nullptr);
  const nlohmann::json g = Goldens()["tokenizer"];
  EXPECT_EQ(l.tokenizer->vocab_size(), 512);
  EXPECT_EQ(l.tokenizer->bos_id(), g["bos_id"].get<int32_t>());
  EXPECT_EQ(l.tokenizer->eos_id(), g["eos_id"].get<int32_t>());
  EXPECT_EQ(l.tokenizer->add_bos(), g["add_bos"].get<bool>());
  EXPECT_EQ(l.tokenizer->TokenBytes(1), "");   // <s>
  EXPECT_EQ(l.tokenizer->TokenBytes(2), "");   // </s>
  EXPECT_EQ(l.tokenizer->TokenBytes(0), "");   // <unk>
  EXPECT_EQ(l.tokenizer->TokenBytes(PieceId(*l.file, "<0x0A>")), "\n");
  EXPECT_EQ(l.tokenizer->TokenBytes(-1), "");
  EXPECT_EQ(l.tokenizer->TokenBytes(512), "");
  EXPECT_EQ(l.tokenizer->Encode("", true), std::vector<int32_t>{1});
  EXPECT_TRUE(l.tokenizer->Encode("", false).empty());
  EXPECT_EQ(l.tokenizer->vocab_type(), VocabType::kSpm);
  EXPECT_EQ(l.tokenizer->pre_tokenizer(), "default");
  // llama.cpp's end-of-generation set: only eos (no end-marker texts here).
  EXPECT_EQ(l.tokenizer->eog_ids(), std::vector<int32_t>{2});
  EXPECT_TRUE(l.tokenizer->IsEog(2));
  EXPECT_FALSE(l.tokenizer->IsEog(1));
  EXPECT_TRUE(l.tokenizer->IsControl(1));
  EXPECT_FALSE(l.tokenizer->IsControl(PieceId(*l.file, "<0x0A>")));
  EXPECT_EQ(l.tokenizer->token_type(0), TokenType::kUnknown);
  EXPECT_EQ(l.tokenizer->token_type(PieceId(*l.file, "<0x0A>")), TokenType::kByte);
}

// llama.cpp's SPM partition: with parse_special, <s> and </s> written in the
// text become their ids and each raw fragment after a special token gets
// its own space prefix; without it they are plain text.
TEST(SpmSpecialTokensTest, ParseSpecialSplitsControlTokens) {
  Loaded l = Load(std::string("models/") + kSpmVocab);
  ASSERT_NE(l.tokenizer, nullptr);
  const Tokenizer& t = *l.tokenizer;
  std::vector<int32_t> want = {1};
  for (int32_t id : t.Encode("Hello", false)) want.push_back(id);
  want.push_back(2);
  for (int32_t id : t.Encode("world", false)) want.push_back(id);
  EXPECT_EQ(t.Encode("<s>Hello</s>world", EncodeOptions{false, true}), want);
  const std::vector<int32_t> plain = t.Encode("<s>Hello</s>world", EncodeOptions{});
  EXPECT_EQ(std::count(plain.begin(), plain.end(), 1), 0);
  EXPECT_EQ(std::count(plain.begin(), plain.end(), 2), 0);
  EXPECT_EQ(Decode(t, plain), " <s>Hello</s>world");
  // BOS from the options comes before a parsed one.
  EXPECT_EQ(t.Encode("<s>", EncodeOptions{true, true}), (std::vector<int32_t>{1, 1}));
}

TEST(Stories260KTest, GoldenPrompts) {
  Loaded l = Load("models/stories260K.gguf");
  ASSERT_NE(l.tokenizer, nullptr);
  const nlohmann::json cases = Goldens()["cases"];
  ASSERT_FALSE(cases.empty());
  for (const nlohmann::json& c : cases) {
    const std::string name = c["name"].get<std::string>();
    const std::string prompt = c["prompt"].get<std::string>();
    EXPECT_THAT(l.tokenizer->Encode(prompt, true),
                ElementsAreArray(c["prompt_token_ids_with_bos"].get<std::vector<int32_t>>()))
        << name;
    // The boundary_* cases carry only the BOS-prefixed ids.
    if (!c.contains("prompt_token_ids_no_bos")) continue;
    EXPECT_THAT(l.tokenizer->Encode(prompt, false),
                ElementsAreArray(c["prompt_token_ids_no_bos"].get<std::vector<int32_t>>()))
        << name;
    // prompt_pieces render U+2581 as a space and BOS as "<s>".
    const auto ids = c["prompt_token_ids_with_bos"].get<std::vector<int32_t>>();
    const auto pieces = c["prompt_pieces"].get<std::vector<std::string>>();
    ASSERT_EQ(ids.size(), pieces.size()) << name;
    for (size_t i = 1; i < ids.size(); ++i) {
      EXPECT_EQ(l.tokenizer->TokenBytes(ids[i]), pieces[i]) << name << " piece " << i;
    }
  }
}

TEST(Stories260KTest, GoldenGeneratedText) {
  Loaded l = Load("models/stories260K.gguf");
  ASSERT_NE(l.tokenizer, nullptr);
  const nlohmann::json goldens = Goldens();
  for (const nlohmann::json& c : goldens["cases"]) {
    const std::string want = c["generated_text"].get<std::string>();
    for (const char* key : {"generated_token_ids", "generated_token_ids_f32kv"}) {
      EXPECT_EQ(Decode(*l.tokenizer, c[key].get<std::vector<int32_t>>()), want)
          << c["name"].get<std::string>() << " " << key;
    }
  }
}

TEST(IncrementalDecoderTest, HoldsBackSplitMultibyteChar) {
  Loaded l = Load("models/stories260K.gguf");
  ASSERT_NE(l.tokenizer, nullptr);
  const gguf::GgufFile& f = *l.file;
  IncrementalDecoder d(*l.tokenizer);
  // "é" = C3 A9.
  EXPECT_EQ(d.Push(PieceId(f, "<0xC3>")), "");
  EXPECT_EQ(d.Push(PieceId(f, "<0xA9>")), "\xC3\xA9");
  // "🚀" = F0 9F 9A 80, then an ASCII piece releases everything.
  EXPECT_EQ(d.Push(PieceId(f, "<0xF0>")), "");
  EXPECT_EQ(d.Push(PieceId(f, "<0x9F>")), "");
  EXPECT_EQ(d.Push(PieceId(f, "<0x9A>")), "");
  EXPECT_EQ(d.Push(PieceId(f, "<0x80>")), "\xF0\x9F\x9A\x80");
  EXPECT_EQ(d.Push(PieceId(f, "<0x41>")), "A");
  // An incomplete tail comes out of Flush() as U+FFFD; control tokens add
  // nothing.
  EXPECT_EQ(d.Push(PieceId(f, "<0xE2>")), "");
  EXPECT_EQ(d.Push(1), "");
  EXPECT_EQ(d.Flush(), "\xEF\xBF\xBD");
  EXPECT_EQ(d.Flush(), "");
  // A stray continuation byte is not held: it becomes U+FFFD.
  EXPECT_EQ(d.Push(PieceId(f, "<0x80>")), "\xEF\xBF\xBD");
}

// Regression: sampled byte tokens that form no valid UTF-8 reached the
// router's protobuf `text` field, which failed to serialize and hung the
// client. Output is always valid UTF-8 (Unicode Table 3-7).
TEST(SanitizeUtf8Test, ReplacesEachIllFormedByte) {
  const std::string r = "\xEF\xBF\xBD";
  EXPECT_EQ(SanitizeUtf8("abc"), "abc");
  EXPECT_EQ(SanitizeUtf8("caf\xC3\xA9"), "caf\xC3\xA9");
  EXPECT_EQ(SanitizeUtf8("\xF0\x9F\x9A\x80"), "\xF0\x9F\x9A\x80");
  EXPECT_EQ(SanitizeUtf8("\xFF"), r);
  EXPECT_EQ(SanitizeUtf8("\x80x"), r + "x");
  EXPECT_EQ(SanitizeUtf8("\xC0\xAF"), r + r);          // overlong '/'
  EXPECT_EQ(SanitizeUtf8("\xED\xA0\x80"), r + r + r);  // surrogate U+D800
  EXPECT_EQ(SanitizeUtf8("\xF4\x90\x80\x80"), r + r + r + r);  // > U+10FFFF
  EXPECT_EQ(SanitizeUtf8("\xE2\x82"), r + r);          // cut short
  EXPECT_EQ(SanitizeUtf8(std::string("a\0b", 3)), std::string("a\0b", 3));
}

TEST(IncrementalDecoderTest, EmojiByteFallbackRoundTrip) {
  Loaded l = Load("models/ggml-vocab-llama-spm.gguf");
  ASSERT_NE(l.tokenizer, nullptr);
  const std::string text = "\xF0\x9F\xA6\x99 caf\xC3\xA9 \xE2\x9C\x85";  // 🦙 café ✅
  const std::vector<int32_t> ids = l.tokenizer->Encode(text, true);
  IncrementalDecoder d(*l.tokenizer);
  std::string got;
  for (int32_t id : ids) {
    const std::string piece = d.Push(id);
    // Every released chunk ends on a character boundary.
    if (!piece.empty()) {
      EXPECT_NE(static_cast<uint8_t>(piece.back()) & 0xC0, 0xC0);
    }
    got += piece;
  }
  got += d.Flush();
  EXPECT_EQ(got, " " + text);
}

TEST(TokenizerErrorTest, RejectsMissingKeys) {
  char tmpl[] = "/tmp/tokenizer_test_XXXXXX";
  ASSERT_NE(mkdtemp(tmpl), nullptr);
  const std::string path = std::string(tmpl) + "/empty.gguf";
  {
    // GGUF v3 with no tensors and no metadata (gguf.md layout).
    std::string b = "GGUF";
    const uint32_t version = 3;
    const uint64_t zero = 0;
    b.append(reinterpret_cast<const char*>(&version), 4);
    b.append(reinterpret_cast<const char*>(&zero), 8);
    b.append(reinterpret_cast<const char*>(&zero), 8);
    std::ofstream(path, std::ios::binary) << b;
  }
  auto f = gguf::GgufFile::Open(path);
  ASSERT_TRUE(f.ok()) << f.status();
  auto t = Tokenizer::FromGguf(**f);
  EXPECT_EQ(t.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(std::string(t.status().message()), HasSubstr("tokenizer.ggml.model"));
  std::filesystem::remove_all(tmpl);
}

}  // namespace
}  // namespace tandem::tokenizer
