// Byte-level BPE tokenizer (tokenizer.ggml.model = gpt2): llama.cpp's
// test-tokenizer-0 pairs for the GPT-2, DeepSeek-LLM, Qwen2 and
// llama3-tiny-synth vocabularies (../shared/models/*.inp/.out, no BOS, no
// special-token parsing), the prompt ids of the qwen2/llama3 goldens and
// chat renderings (../shared/goldens), end-of-generation sets and add_bos
// defaults by llama.cpp's rules, and the load-time refusals.
#include <cctype>
#include <map>
#include <cstdint>
#include <filesystem>
#include <string>
#include <tuple>
#include <vector>

#include "absl/status/status.h"
#include "engine/gguf/gguf_file.h"
#include "engine/gguf/gguf_writer.h"
#include "engine/tokenizer/tokenizer.h"
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
using ::tandem::tokenizer::testing::RawBytes;
using ::tandem::tokenizer::testing::VocabInputs;
using ::tandem::tokenizer::testing::VocabOutputs;

constexpr char kGpt2[] = "ggml-vocab-gpt-2.gguf";
constexpr char kDeepseek[] = "ggml-vocab-deepseek-llm.gguf";
constexpr char kQwen2[] = "qwen2-tiny-synth.gguf";
constexpr char kLlama3[] = "llama3-tiny-synth.gguf";

// Tokenizers are loaded once per model (the Qwen vocab is 151k tokens);
// nullptr (after a test failure) when the model does not load.
const Tokenizer* Cached(const std::string& model) {
  static auto* cache = new std::map<std::string, Loaded>();
  auto it = cache->find(model);
  if (it == cache->end()) it = cache->emplace(model, Load("models/" + model)).first;
  return it->second.tokenizer.get();
}

TEST(BpeVocabFilesTest, HaveAllCases) {
  for (const char* model : {kGpt2, kDeepseek, kQwen2, kLlama3}) {
    const std::vector<std::string> in = VocabInputs(model);
    ASSERT_EQ(in.size(), kNumVocabCases + 1u) << model;
    EXPECT_EQ(in.back(), "") << model;  // the file ends with a separator
    const std::vector<std::vector<int32_t>> out = VocabOutputs(model);
    ASSERT_GE(out.size(), static_cast<size_t>(kNumVocabCases)) << model;
    // llama3-tiny-synth.gguf.out ends with one extra blank line.
    for (size_t i = kNumVocabCases; i < out.size(); ++i) EXPECT_TRUE(out[i].empty()) << model;
  }
}

// One ctest entry per model and .inp/.out case.
class BpeCaseTest : public ::testing::TestWithParam<std::tuple<std::string, int>> {};

TEST_P(BpeCaseTest, MatchesLlamaCpp) {
  const auto& [model, i] = GetParam();
  const std::vector<std::string> inputs = VocabInputs(model);
  const std::vector<std::vector<int32_t>> outputs = VocabOutputs(model);
  ASSERT_LT(static_cast<size_t>(i), std::min(inputs.size(), outputs.size()));
  const Tokenizer* tp = Cached(model);
  ASSERT_NE(tp, nullptr) << model;
  const Tokenizer& t = *tp;
  const std::string& text = inputs[i];
  const std::vector<int32_t> ids = t.Encode(text, EncodeOptions{});
  EXPECT_THAT(ids, ElementsAreArray(outputs[i])) << model << " case " << i << ": \"" << text
                                                 << "\"";
  // Byte-level BPE is lossless: the reference ids decode to the input.
  EXPECT_EQ(RawBytes(t, outputs[i]), text) << model << " case " << i;
  EXPECT_EQ(Decode(t, outputs[i]), text) << model << " case " << i;
}

INSTANTIATE_TEST_SUITE_P(
    VocabCases, BpeCaseTest,
    ::testing::Combine(::testing::Values(kGpt2, kDeepseek, kQwen2, kLlama3),
                       ::testing::Range(0, kNumVocabCases)),
    [](const ::testing::TestParamInfo<BpeCaseTest::ParamType>& info) {
      std::string name = std::get<0>(info.param);
      name = name.substr(0, name.find(".gguf"));
      for (char& c : name) {
        if (!std::isalnum(static_cast<unsigned char>(c))) c = '_';
      }
      return name + "_Case" + std::to_string(std::get<1>(info.param));
    });

nlohmann::json ReadJson(const std::string& relative) {
  return nlohmann::json::parse(ReadFileOrDie(SharedPath(relative)));
}

// Every case of the greedy goldens: prompt_token_ids are BOS per add_bos
// with special parsing on; prompt_token_ids_plain_text no BOS, parsing off.
class GoldenPromptTest : public ::testing::TestWithParam<std::string> {};

TEST_P(GoldenPromptTest, PromptIdsMatchLlamaCpp) {
  const std::string& model = GetParam();
  const std::string golden = "goldens/" + model.substr(0, model.find(".gguf")) + "_greedy.json";
  const nlohmann::json g = ReadJson(golden);
  const Tokenizer* tp = Cached(model);
  ASSERT_NE(tp, nullptr) << model;
  const Tokenizer& t = *tp;
  EXPECT_EQ(t.add_bos(), g["model"]["add_bos"].get<bool>());
  EXPECT_EQ(t.bos_id(), g["model"]["bos"].get<int32_t>());
  EXPECT_EQ(t.eos_id(), g["model"]["eos"].get<int32_t>());
  EXPECT_EQ(t.vocab_size(), g["model"]["vocab"].get<int32_t>());
  EXPECT_EQ(t.pre_tokenizer(), g["model"]["pre_tokenizer"].get<std::string>());
  EXPECT_EQ(t.eog_ids(), g["model"]["eog_ids"].get<std::vector<int32_t>>());
  ASSERT_FALSE(g["cases"].empty());
  for (const nlohmann::json& c : g["cases"]) {
    const std::string name = c["name"].get<std::string>();
    const std::string prompt = c["prompt"].get<std::string>();
    EXPECT_THAT(t.Encode(prompt, EncodeOptions{t.add_bos(), /*parse_special=*/true}),
                ElementsAreArray(c["prompt_token_ids"].get<std::vector<int32_t>>()))
        << name;
    EXPECT_THAT(t.Encode(prompt, EncodeOptions{}),
                ElementsAreArray(c["prompt_token_ids_plain_text"].get<std::vector<int32_t>>()))
        << name;
  }
}

INSTANTIATE_TEST_SUITE_P(Goldens, GoldenPromptTest, ::testing::Values(kQwen2, kLlama3),
                         [](const ::testing::TestParamInfo<std::string>& info) {
                           return std::string(info.param.find("qwen2") == 0 ? "Qwen2"
                                                                            : "Llama3");
                         });

// The Qwen3 chat template renderings: special parsing on, no BOS.
TEST(ChatGoldenTest, RenderedTextTokenizesAsLlamaCpp) {
  const nlohmann::json g = ReadJson("goldens/qwen2-tiny-synth_chat.json");
  const Tokenizer* tp = Cached(kQwen2);
  ASSERT_NE(tp, nullptr) << kQwen2;
  const Tokenizer& t = *tp;
  ASSERT_FALSE(g["cases"].empty());
  for (const nlohmann::json& c : g["cases"]) {
    const std::string rendered = c["rendered"].get<std::string>();
    const std::vector<int32_t> ids = t.Encode(rendered, EncodeOptions{false, true});
    EXPECT_THAT(ids, ElementsAreArray(c["token_ids"].get<std::vector<int32_t>>()))
        << c["name"].get<std::string>();
  }
}

// llama.cpp's end-of-generation rule: eos/eot/eom ids, the FIM pad, repo and
// file-separator tokens (<|fim_pad|> 151662, <|repo_name|> 151663,
// <|file_sep|> 151664), and the end-marker texts (<|endoftext|> 151643,
// <|im_end|> 151645). GPT-2: eos = <|endoftext|> = 50256 only.
TEST(EogTest, MatchesLlamaCppRule) {
  for (const char* m : {kGpt2, kDeepseek, kQwen2, kLlama3}) ASSERT_NE(Cached(m), nullptr) << m;
  const std::vector<int32_t> qwen = {151643, 151645, 151662, 151663, 151664};
  EXPECT_EQ(Cached(kQwen2)->eog_ids(), qwen);
  EXPECT_EQ(Cached(kLlama3)->eog_ids(), qwen);
  EXPECT_EQ(Cached(kGpt2)->eog_ids(), std::vector<int32_t>{50256});
  EXPECT_TRUE(Cached(kQwen2)->IsEog(151645));
  EXPECT_FALSE(Cached(kQwen2)->IsEog(151644));
}

// add_bos: the GGUF key when present; else llama.cpp's default (false for
// BPE with the gpt-2 pre-tokenizer).
TEST(AddBosTest, PerModel) {
  for (const char* m : {kGpt2, kDeepseek, kQwen2, kLlama3}) ASSERT_NE(Cached(m), nullptr) << m;
  EXPECT_FALSE(Cached(kQwen2)->add_bos());
  EXPECT_TRUE(Cached(kLlama3)->add_bos());
  EXPECT_FALSE(Cached(kGpt2)->add_bos());
  EXPECT_TRUE(Cached(kDeepseek)->add_bos());  // tokenizer.ggml.add_bos_token = true
  EXPECT_EQ(Cached(kGpt2)->Encode("Hello", EncodeOptions{true, false}).front(), 50256);
}

TEST(BpeAccessorsTest, TypesAndRendering) {
  for (const char* m : {kGpt2, kDeepseek, kQwen2, kLlama3}) ASSERT_NE(Cached(m), nullptr) << m;
  const Tokenizer* tp = Cached(kQwen2);
  ASSERT_NE(tp, nullptr) << kQwen2;
  const Tokenizer& t = *tp;
  EXPECT_EQ(t.vocab_type(), VocabType::kBpe);
  EXPECT_EQ(t.pre_tokenizer(), "qwen2");
  EXPECT_EQ(Cached(kLlama3)->pre_tokenizer(), "llama-bpe");
  EXPECT_EQ(Cached(kDeepseek)->pre_tokenizer(), "deepseek-llm");
  // CONTROL in the file.
  EXPECT_TRUE(t.IsControl(151644));  // <|im_start|>
  // USER_DEFINED in the file, made CONTROL by llama.cpp's FIM detection.
  EXPECT_TRUE(t.IsControl(151659));  // <|fim_prefix|>
  EXPECT_TRUE(t.IsControl(151664));  // <|file_sep|>
  EXPECT_EQ(t.token_type(151667), TokenType::kUserDefined);  // <think>
  EXPECT_FALSE(t.IsControl(151667));
  EXPECT_FALSE(t.IsControl(-1));
  EXPECT_FALSE(t.IsControl(t.vocab_size()));
  // Rendering: normal tokens byte-decoded, user-defined as stored, control
  // as nothing.
  EXPECT_EQ(t.TokenBytes(9707), "Hello");
  EXPECT_EQ(t.TokenBytes(1879), " world");
  EXPECT_EQ(t.TokenBytes(198), "\n");
  EXPECT_EQ(t.TokenBytes(151667), "<think>");
  EXPECT_EQ(t.TokenBytes(151644), "");
  EXPECT_EQ(t.TokenBytes(151643), "");
}

// GPT-2's byte stand-ins: ' ' is U+0120 'Ġ', '\n' U+010A 'Ċ', 0xA0 U+0142.
TEST(BpeAccessorsTest, ByteTokensDecodeToBytes) {
  const Loaded l = Load(std::string("models/") + kGpt2);
  ASSERT_NE(l.tokenizer, nullptr);
  const auto& tokens =
      std::get<std::vector<std::string>>(*l.file->Find("tokenizer.ggml.tokens"));
  auto id_of = [&](const std::string& text) {
    for (size_t i = 0; i < tokens.size(); ++i) {
      if (tokens[i] == text) return static_cast<int32_t>(i);
    }
    ADD_FAILURE() << "no token " << text;
    return -1;
  };
  EXPECT_EQ(l.tokenizer->TokenBytes(id_of("\xC4\xA0")), " ");
  EXPECT_EQ(l.tokenizer->TokenBytes(id_of("\xC4\x8A")), "\n");
  EXPECT_EQ(l.tokenizer->TokenBytes(id_of("\xC5\x82")), "\xA0");
  EXPECT_EQ(l.tokenizer->TokenBytes(id_of("!")), "!");
}

// Bytes that are not UTF-8 never match a pre-tokenizer regex; they still
// become their byte tokens, so nothing is lost. (Not DeepSeek: its vocab
// repeats byte stand-ins such as "\xC3\xBF" (for 0xFF) as USER_DEFINED
// tokens, which win the text lookup, as in llama.cpp, and render as text.)
TEST(BpeEncodeTest, InvalidUtf8KeepsEveryByte) {
  for (const char* model : {kGpt2, kQwen2, kLlama3}) {
    const Tokenizer* tp = Cached(model);
    ASSERT_NE(tp, nullptr) << model;
    const Tokenizer& t = *tp;
    const std::string text = "ab\xFF\xC3 cd\xE2\x82 \x80\x80x";
    EXPECT_EQ(RawBytes(t, t.Encode(text, EncodeOptions{})), text) << model;
  }
}

// Regression for the rewritten \s*[\r\n]+ alternative: a long whitespace run
// splits into whitespace pieces and round-trips. (With the regex as written
// upstream, PCRE2 backtracks quadratically here; this test then runs into
// ctest's timeout instead of passing in milliseconds. No wall-clock
// assertion: speed is for benchmarks.)
TEST(BpeEncodeTest, LongWhitespaceRunRoundTrips) {
  const std::string text = std::string(200000, ' ') + "x" + std::string(100000, '\t') + "\n";
  for (const char* model : {kQwen2, kLlama3, kGpt2, kDeepseek}) {
    const Tokenizer* tp = Cached(model);
    ASSERT_NE(tp, nullptr) << model;
    const Tokenizer& t = *tp;
    const std::vector<int32_t> ids = t.Encode(text, EncodeOptions{});
    EXPECT_EQ(RawBytes(t, ids), text) << model;
  }
}

// Writes a small GGUF with the given tokenizer metadata to a temp dir.
class SmallVocab {
 public:
  explicit SmallVocab(std::vector<std::pair<std::string, gguf::MetadataValue>> kv) {
    char tmpl[] = "/tmp/bpe_test_XXXXXX";
    dir_ = mkdtemp(tmpl);
    gguf::GgufWriter w;
    for (auto& [k, v] : kv) EXPECT_TRUE(w.AddMetadata(k, v).ok()) << k;
    EXPECT_TRUE(w.WriteFile(dir_ + "/v.gguf").ok());
  }
  ~SmallVocab() { std::filesystem::remove_all(dir_); }
  absl::StatusOr<std::unique_ptr<Tokenizer>> Build() {
    auto f = gguf::GgufFile::Open(dir_ + "/v.gguf");
    if (!f.ok()) return f.status();
    return Tokenizer::FromGguf(**f);
  }

 private:
  std::string dir_;
};

std::vector<std::string> TinyTokens() { return {"a", "b", "ab", "\xC4\xA0", "<|endoftext|>"}; }

TEST(BpeLoadTest, TinyVocabMergesByRank) {
  SmallVocab v({{"tokenizer.ggml.model", std::string("gpt2")},
                {"tokenizer.ggml.pre", std::string("gpt-2")},
                {"tokenizer.ggml.tokens", TinyTokens()},
                {"tokenizer.ggml.merges", std::vector<std::string>{"a b"}}});
  auto t = v.Build();
  ASSERT_TRUE(t.ok()) << t.status();
  EXPECT_EQ((*t)->Encode("abab a", false), (std::vector<int32_t>{2, 2, 3, 0}));
  // BPE defaults: BOS/EOS 11 are outside this vocabulary, so none.
  EXPECT_EQ((*t)->bos_id(), -1);
  EXPECT_EQ((*t)->eog_ids(), std::vector<int32_t>{4});  // <|endoftext|> by its text
  EXPECT_TRUE((*t)->IsControl(4));
}

// llama.cpp's ignore_merges (llama3 family): a piece that is itself a token
// is emitted whole even where the merge ranks would split it ("b c" ranks
// before "a b" and there is no merge "a bc"). The llama3 family also adds
// BOS by default.
TEST(BpeLoadTest, IgnoreMergesForLlama3Family) {
  const std::vector<std::string> tokens = {"a", "b", "c", "ab", "bc", "abc", "<|endoftext|>"};
  const std::vector<std::string> merges = {"b c", "a b"};
  SmallVocab gpt2({{"tokenizer.ggml.model", std::string("gpt2")},
                   {"tokenizer.ggml.pre", std::string("gpt-2")},
                   {"tokenizer.ggml.tokens", tokens},
                   {"tokenizer.ggml.merges", merges},
                   {"tokenizer.ggml.bos_token_id", uint32_t{6}}});
  SmallVocab llama3({{"tokenizer.ggml.model", std::string("gpt2")},
                     {"tokenizer.ggml.pre", std::string("llama-bpe")},
                     {"tokenizer.ggml.tokens", tokens},
                     {"tokenizer.ggml.merges", merges},
                     {"tokenizer.ggml.bos_token_id", uint32_t{6}}});
  auto merged = gpt2.Build();
  auto whole = llama3.Build();
  ASSERT_TRUE(merged.ok()) << merged.status();
  ASSERT_TRUE(whole.ok()) << whole.status();
  EXPECT_EQ((*merged)->Encode("abc", false), (std::vector<int32_t>{0, 4}));
  EXPECT_EQ((*whole)->Encode("abc", false), std::vector<int32_t>{5});
  EXPECT_FALSE((*merged)->add_bos());
  EXPECT_TRUE((*whole)->add_bos());
  EXPECT_EQ((*whole)->Encode("abc", EncodeOptions{true, false}), (std::vector<int32_t>{6, 5}));
}

// tokenizer.ggml.pre absent: llama.cpp's "default" regexes (punctuation runs,
// then GPT-2's split, then digit runs, then groups of three ASCII digits),
// so "1234" becomes 123 | 4 where the gpt-2 split keeps it whole.
TEST(BpeLoadTest, MissingPreTokenizerIsDefault) {
  const std::vector<std::string> tokens = {"1", "2", "3", "4", "12", "123", "1234"};
  const std::vector<std::string> merges = {"1 2", "12 3", "123 4"};
  SmallVocab absent({{"tokenizer.ggml.model", std::string("gpt2")},
                     {"tokenizer.ggml.tokens", tokens},
                     {"tokenizer.ggml.merges", merges}});
  SmallVocab gpt2({{"tokenizer.ggml.model", std::string("gpt2")},
                   {"tokenizer.ggml.pre", std::string("gpt-2")},
                   {"tokenizer.ggml.tokens", tokens},
                   {"tokenizer.ggml.merges", merges}});
  auto t = absent.Build();
  auto g = gpt2.Build();
  ASSERT_TRUE(t.ok()) << t.status();
  ASSERT_TRUE(g.ok()) << g.status();
  EXPECT_EQ((*t)->pre_tokenizer(), "default");
  EXPECT_EQ((*t)->Encode("1234", false), (std::vector<int32_t>{5, 3}));
  EXPECT_EQ((*g)->Encode("1234", false), std::vector<int32_t>{6});
}

TEST(BpeLoadTest, RejectsUnknownModel) {
  SmallVocab v({{"tokenizer.ggml.model", std::string("bert")},
                {"tokenizer.ggml.tokens", TinyTokens()}});
  auto t = v.Build();
  ASSERT_EQ(t.status().code(), absl::StatusCode::kInvalidArgument);
  const std::string m(t.status().message());
  EXPECT_THAT(m, HasSubstr("tokenizer.ggml.model"));
  EXPECT_THAT(m, HasSubstr("'bert'"));
  EXPECT_THAT(m, HasSubstr("'llama'"));
  EXPECT_THAT(m, HasSubstr("'gpt2'"));
  EXPECT_EQ(m.find('\n'), std::string::npos);
}

TEST(BpeLoadTest, RejectsUnknownPreTokenizer) {
  SmallVocab v({{"tokenizer.ggml.model", std::string("gpt2")},
                {"tokenizer.ggml.pre", std::string("no-such-pre")},
                {"tokenizer.ggml.tokens", TinyTokens()},
                {"tokenizer.ggml.merges", std::vector<std::string>{"a b"}}});
  auto t = v.Build();
  ASSERT_EQ(t.status().code(), absl::StatusCode::kInvalidArgument);
  const std::string m(t.status().message());
  EXPECT_THAT(m, HasSubstr("tokenizer.ggml.pre"));
  EXPECT_THAT(m, HasSubstr("'no-such-pre'"));
  EXPECT_THAT(m, HasSubstr("default, gpt-2"));
  EXPECT_THAT(m, HasSubstr("qwen2"));
  EXPECT_THAT(m, HasSubstr("llama-bpe"));
  EXPECT_EQ(m.find('\n'), std::string::npos);
}

TEST(BpeLoadTest, RejectsMissingMerges) {
  SmallVocab v({{"tokenizer.ggml.model", std::string("gpt2")},
                {"tokenizer.ggml.pre", std::string("qwen2")},
                {"tokenizer.ggml.tokens", TinyTokens()}});
  auto t = v.Build();
  ASSERT_EQ(t.status().code(), absl::StatusCode::kInvalidArgument);
  const std::string m(t.status().message());
  EXPECT_THAT(m, HasSubstr("tokenizer.ggml.merges"));
  EXPECT_THAT(m, HasSubstr("missing"));
  EXPECT_EQ(m.find('\n'), std::string::npos);
}

// llama.cpp ignores tokenizer.ggml.pre for SPM vocabularies.
TEST(BpeLoadTest, SpmIgnoresPreTokenizer) {
  SmallVocab v({{"tokenizer.ggml.model", std::string("llama")},
                {"tokenizer.ggml.pre", std::string("no-such-pre")},
                {"tokenizer.ggml.tokens", std::vector<std::string>{"<unk>", "<s>", "</s>", "a"}}});
  auto t = v.Build();
  ASSERT_TRUE(t.ok()) << t.status();
  EXPECT_EQ((*t)->pre_tokenizer(), "default");
}

}  // namespace
}  // namespace tandem::tokenizer
