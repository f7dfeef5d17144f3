// Tests for router/sample_output: a request's per-sample output on recorded
// token streams. The streams are llama.cpp's tokenizations of the texts in
// ../shared/models/qwen2-tiny-synth.gguf.inp/.out (llama.cpp c392e50), so
// each stream's expected text is the .inp text it came from; token bytes
// and a control token's text come from the tokenizer's own vocabulary
// (TokenBytes, the tokenizer tests' Decode). Stop-string expectations are
// cuts of those texts at the string's first occurrence.
#include "router/sample_output.h"

#include <algorithm>
#include <cstdint>
#include <optional>
#include <random>
#include <string>
#include <vector>

#include "engine/tokenizer/utf8.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "tests/engine/tokenizer/tokenizer_test_util.h"

namespace tandem::router {
namespace {

using ::testing::ElementsAre;
using ::testing::ElementsAreArray;
using ::testing::IsEmpty;
using tokenizer::testing::Decode;
using tokenizer::testing::Loaded;
using tokenizer::testing::VocabInputs;
using tokenizer::testing::VocabOutputs;

constexpr char kModel[] = "qwen2-tiny-synth.gguf";
// Cases of qwen2-tiny-synth.gguf.inp (0-based).
constexpr int kHelloWorld = 11;        // "Hello world": 9707 1879
constexpr int kHelloCommaWorld = 16;   // "Hello, world!": 9707 11 1879 0
constexpr int kLlama = 18;             // " this is 🦙.cpp": 🦙 spans 11162 99 247
constexpr int kCyrillic = 20;          // "нещо на Български"
constexpr int kKhmer = 21;             // multi-byte characters split across tokens

// A worker's token as recorded: the caller's token type (v1::TokenOutput in
// the router) needs only these three accessors.
struct RecordedToken {
  uint32_t sample = 0;
  uint32_t position = 0;
  int32_t id = 0;
  uint32_t sample_index() const { return sample; }
  uint32_t index() const { return position; }
  int32_t token_id() const { return id; }
};
using Outputs = SampleOutputs<RecordedToken>;
using Emission = Outputs::Emission;

// Sample `s`'s tokens `ids` at output indices 0, 1, ...
std::vector<RecordedToken> Stream(const std::vector<int32_t>& ids, uint32_t s = 0) {
  std::vector<RecordedToken> tokens;
  for (uint32_t i = 0; i < ids.size(); ++i) tokens.push_back({s, i, ids[i]});
  return tokens;
}

class SampleOutputTest : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    model_ = new Loaded(tokenizer::testing::Load("models/" + std::string(kModel)));
    inputs_ = new std::vector<std::string>(VocabInputs(kModel));
    outputs_ = new std::vector<std::vector<int32_t>>(VocabOutputs(kModel));
  }
  static void TearDownTestSuite() {
    delete model_;
    delete inputs_;
    delete outputs_;
  }
  void SetUp() override {
    ASSERT_NE(model_->tokenizer, nullptr);
    ASSERT_GT(inputs_->size(), static_cast<size_t>(kKhmer));
    ASSERT_GT(outputs_->size(), static_cast<size_t>(kKhmer));
  }

  const tokenizer::Tokenizer& tok() const { return *model_->tokenizer; }
  static const std::string& Text(int c) { return (*inputs_)[c]; }
  static const std::vector<int32_t>& Ids(int c) { return (*outputs_)[c]; }

  // How many of `ids` it takes for their bytes to reach `bytes` bytes.
  int TokensCovering(const std::vector<int32_t>& ids, size_t bytes) const {
    size_t have = 0;
    for (size_t i = 0; i < ids.size(); ++i) {
      have += tok().TokenBytes(ids[i]).size();
      if (have >= bytes) return static_cast<int>(i) + 1;
    }
    return -1;
  }

  static Loaded* model_;
  static std::vector<std::string>* inputs_;
  static std::vector<std::vector<int32_t>>* outputs_;
};
Loaded* SampleOutputTest::model_ = nullptr;
std::vector<std::string>* SampleOutputTest::inputs_ = nullptr;
std::vector<std::vector<int32_t>>* SampleOutputTest::outputs_ = nullptr;

// Everything one sample was sent, in order.
struct Received {
  std::vector<int32_t> ids;
  std::vector<uint32_t> indices;
  std::string text;
  int64_t charge = 0;  // sum of tokens.size(): what the API key is charged
  int emissions = 0;
  std::optional<SampleEnd> end;
  uint32_t completion_tokens = 0;
};

// Appends emissions to `received` (indexed by sample), checking what holds
// for every emission: its text is whole UTF-8 characters, its tokens follow
// the sample's earlier ones in index order, completion_tokens counts them,
// and nothing follows the sample's last emission.
void Collect(const std::vector<Emission>& emissions, std::vector<Received>* received) {
  for (const Emission& e : emissions) {
    ASSERT_LT(e.sample_index, received->size());
    Received& r = (*received)[e.sample_index];
    EXPECT_FALSE(r.end.has_value()) << "sample " << e.sample_index << " sent after its end";
    EXPECT_EQ(tokenizer::FindInvalidUtf8(e.text), std::nullopt) << e.text;
    for (const RecordedToken& t : e.tokens) {
      EXPECT_EQ(t.sample, e.sample_index);
      EXPECT_EQ(t.position, r.indices.size()) << "sample " << e.sample_index;
      r.indices.push_back(t.position);
      r.ids.push_back(t.id);
    }
    r.text += e.text;
    r.charge += static_cast<int64_t>(e.tokens.size());
    ++r.emissions;
    EXPECT_EQ(e.completion_tokens, r.indices.size());
    r.completion_tokens = e.completion_tokens;
    if (e.end.has_value()) r.end = e.end;
  }
}
void Collect(std::optional<Emission> emission, std::vector<Received>* received) {
  if (emission.has_value()) Collect(std::vector<Emission>{std::move(*emission)}, received);
}

// One sample's whole stream in order, then the worker's end `finish`.
Received RunOne(Outputs& outputs, const std::vector<int32_t>& ids,
                SampleFinish finish = SampleFinish::kLength) {
  std::vector<Received> received(1);
  for (const RecordedToken& t : Stream(ids)) {
    Collect(outputs.Deliver(t), &received);
  }
  Collect(outputs.Finish(0, finish), &received);
  return received[0];
}

TEST_F(SampleOutputTest, EveryRecordedStreamDetokenizesToItsText) {
  // No stop strings: each llama.cpp tokenization, streamed one token per
  // Deliver, comes back as the .inp text (multi-byte characters split
  // across tokens included: the Khmer, Cyrillic and emoji cases).
  for (size_t c = 0; c < outputs_->size() && c < inputs_->size(); ++c) {
    if (Ids(c).empty()) continue;
    SCOPED_TRACE(::testing::Message() << "case " << c);
    Outputs outputs(tok(), {});
    const Received r = RunOne(outputs, Ids(c));
    EXPECT_EQ(r.text, Text(c));
    EXPECT_THAT(r.ids, ElementsAreArray(Ids(c)));
    EXPECT_EQ(r.charge, static_cast<int64_t>(Ids(c).size()));
    ASSERT_TRUE(r.end.has_value());
    EXPECT_EQ(r.end->finish, SampleFinish::kLength);
    EXPECT_FALSE(r.end->stop_string.has_value());
    EXPECT_FALSE(r.end->stop_token_id.has_value());
    EXPECT_EQ(outputs.samples_left(), 0u);
    EXPECT_EQ(outputs.sent(0), SampleFinish::kLength);
    EXPECT_THAT(outputs.emitted(0), ElementsAreArray(Ids(c)));
  }
}

TEST_F(SampleOutputTest, StopStringAcrossTokens) {
  // ", wor" starts in token 11 (",") and ends inside token 1879 (" world").
  const std::string& text = Text(kHelloCommaWorld);
  const std::vector<int32_t>& ids = Ids(kHelloCommaWorld);
  ASSERT_THAT(ids, ElementsAre(9707, 11, 1879, 0));
  const std::string stop = ", wor";
  const size_t at = text.find(stop);
  ASSERT_NE(at, std::string::npos);
  const int covering = TokensCovering(ids, at + stop.size());
  ASSERT_EQ(covering, 3);

  for (bool include : {false, true}) {
    SCOPED_TRACE(include ? "include_stop_str_in_output" : "stop string cut");
    SampleOutputOptions options;
    options.stop = {"never", stop};
    options.include_stop_str_in_output = include;
    Outputs outputs(tok(), options);
    std::vector<Received> received(1);
    for (const RecordedToken& t : Stream(ids)) Collect(outputs.Deliver(t), &received);
    const Received& r = received[0];
    EXPECT_EQ(r.text, include ? text.substr(0, at + stop.size()) : text.substr(0, at));
    // The token that completed the match is sent with the end; "!" after
    // it never is.
    EXPECT_THAT(r.ids, ElementsAre(9707, 11, 1879));
    EXPECT_EQ(r.charge, covering);
    EXPECT_EQ(r.completion_tokens, 3u);
    ASSERT_TRUE(r.end.has_value());
    EXPECT_EQ(r.end->finish, SampleFinish::kStop);
    EXPECT_EQ(r.end->stop_string, stop);
    EXPECT_FALSE(r.end->stop_token_id.has_value());
    EXPECT_TRUE(r.end->stopped_early);
    EXPECT_EQ(r.emissions, 3);  // one per token: each released in turn
    EXPECT_EQ(outputs.samples_left(), 0u);
    // The worker's own end, after the match, changes nothing.
    EXPECT_EQ(outputs.Finish(0, SampleFinish::kLength), std::nullopt);
    EXPECT_EQ(outputs.sent(0), SampleFinish::kStop);
  }
}

TEST_F(SampleOutputTest, StopStringHeldBackUntilTheEnd) {
  // ", world!!" never completes: ", world!" is held back while it could
  // still start a match, and goes out with the sample's last message.
  const std::string& text = Text(kHelloCommaWorld);
  SampleOutputOptions options;
  options.stop = {", world!!"};
  Outputs outputs(tok(), options);
  std::vector<Received> received(1);
  for (const RecordedToken& t : Stream(Ids(kHelloCommaWorld))) {
    Collect(outputs.Deliver(t), &received);
  }
  EXPECT_EQ(received[0].text, text.substr(0, text.find(',')));
  std::optional<Emission> last = outputs.Finish(0, SampleFinish::kLength);
  ASSERT_TRUE(last.has_value());
  EXPECT_THAT(last->tokens, IsEmpty());
  EXPECT_EQ(last->text, text.substr(text.find(',')));
  Collect(std::move(last), &received);
  EXPECT_EQ(received[0].text, text);
  EXPECT_EQ(received[0].end->finish, SampleFinish::kLength);
  EXPECT_FALSE(received[0].end->stop_string.has_value());
}

TEST_F(SampleOutputTest, StopStringAcrossUtf8BytesOfTokens) {
  // 🦙 (F0 9F A6 99) is split across tokens 11162, 99 and 247: no token
  // holds the whole character.
  const std::string& text = Text(kLlama);
  const std::vector<int32_t>& ids = Ids(kLlama);
  const std::string llama = "\xF0\x9F\xA6\x99";
  const size_t at = text.find(llama);
  ASSERT_NE(at, std::string::npos);
  const int first = TokensCovering(ids, at + 1);
  const int last = TokensCovering(ids, at + llama.size());
  ASSERT_GT(last, first) << "the character must span tokens";
  for (int32_t id : ids) {
    ASSERT_EQ(tok().TokenBytes(id).find(llama), std::string::npos);
  }

  struct Case {
    std::string stop;
    std::string released;  // the text before the match
    int tokens;            // tokens sent: through the one completing the match
  };
  const std::string llama_dot = llama + ".";
  const std::vector<Case> cases = {
      {llama, text.substr(0, at), last},
      {llama_dot, text.substr(0, at), TokensCovering(ids, at + llama_dot.size())},
      {".cpp", text.substr(0, text.find(".cpp")), static_cast<int>(ids.size())},
  };
  for (const Case& c : cases) {
    SCOPED_TRACE(c.stop);
    SampleOutputOptions options;
    options.stop = {c.stop};
    Outputs outputs(tok(), options);
    std::vector<Received> received(1);
    for (const RecordedToken& t : Stream(ids)) Collect(outputs.Deliver(t), &received);
    const Received& r = received[0];
    EXPECT_EQ(r.text, c.released);
    EXPECT_EQ(r.charge, c.tokens);
    EXPECT_THAT(r.ids, ElementsAreArray(ids.begin(), ids.begin() + c.tokens));
    ASSERT_TRUE(r.end.has_value());
    EXPECT_EQ(r.end->stop_string, c.stop);
  }
}

TEST_F(SampleOutputTest, StopStringMatchesTheReplacementOfAnIncompleteTail) {
  // The stream ends inside 🦙: the decoder's flush turns the incomplete
  // tail into U+FFFD (the tokenizer's own decoding), which a stop string
  // may match at the sample's end.
  const std::vector<int32_t>& all = Ids(kLlama);
  const std::string& text = Text(kLlama);
  const int first = TokensCovering(all, text.find("\xF0\x9F\xA6\x99") + 1);
  const std::vector<int32_t> ids(all.begin(), all.begin() + first);
  const std::string decoded = Decode(tok(), ids);
  const std::string replacement = "\xEF\xBF\xBD";
  const size_t at = decoded.find(replacement);
  ASSERT_NE(at, std::string::npos) << decoded;

  SampleOutputOptions options;
  options.stop = {replacement};
  Outputs outputs(tok(), options);
  const Received r = RunOne(outputs, ids, SampleFinish::kLength);
  EXPECT_EQ(r.text, decoded.substr(0, at));
  ASSERT_TRUE(r.end.has_value());
  EXPECT_EQ(r.end->finish, SampleFinish::kStop);
  EXPECT_EQ(r.end->stop_string, replacement);
  EXPECT_FALSE(r.end->stopped_early);  // the worker had ended it already
  EXPECT_EQ(r.charge, first);
}

TEST_F(SampleOutputTest, SamplesInterleavedAndOutOfOrderComeOutInIndexOrder) {
  // Three samples' streams, shuffled together (a fixed seed), with every
  // third token sent twice (a resend after a reorder): each sample comes
  // out in index order with its own text, each token charged once.
  const std::vector<int> cases = {kHelloCommaWorld, kCyrillic, kKhmer};
  std::vector<RecordedToken> arrivals;
  for (uint32_t s = 0; s < cases.size(); ++s) {
    for (const RecordedToken& t : Stream(Ids(cases[s]), s)) {
      arrivals.push_back(t);
      if (t.position % 3 == 1) arrivals.push_back(t);
    }
  }
  std::mt19937 rng(33);
  std::shuffle(arrivals.begin(), arrivals.end(), rng);

  SampleOutputOptions options;
  options.n = 3;
  Outputs outputs(tok(), options);
  std::vector<Received> received(3);
  for (const RecordedToken& t : arrivals) Collect(outputs.Deliver(t), &received);
  for (uint32_t s = 0; s < 3; ++s) {
    EXPECT_FALSE(received[s].end.has_value());
    Collect(outputs.Finish(s, SampleFinish::kLength), &received);
  }
  for (uint32_t s = 0; s < 3; ++s) {
    SCOPED_TRACE(::testing::Message() << "sample " << s);
    const Received& r = received[s];
    EXPECT_EQ(r.text, Text(cases[s]));
    EXPECT_THAT(r.ids, ElementsAreArray(Ids(cases[s])));
    EXPECT_EQ(r.charge, static_cast<int64_t>(Ids(cases[s]).size()));
    ASSERT_TRUE(r.end.has_value());
    EXPECT_EQ(r.end->finish, SampleFinish::kLength);
  }
  EXPECT_EQ(outputs.samples_left(), 0u);
}

TEST_F(SampleOutputTest, EarlyTokensWaitForTheirPredecessors) {
  // As GenerateCall streams them: a token released with the ones before it
  // in one emission; a remote token 0 that arrives after D's tokens and
  // after D reported the end releases everything, then the last message.
  const std::vector<int32_t>& a = Ids(kHelloCommaWorld);  // 9707 11 1879 0
  const std::vector<int32_t>& b = Ids(kHelloWorld);       // 9707 1879
  SampleOutputOptions options;
  options.n = 2;
  Outputs outputs(tok(), options);

  EXPECT_THAT(outputs.Deliver({0, 1, a[1]}), IsEmpty());
  EXPECT_THAT(outputs.Deliver({1, 1, b[1]}), IsEmpty());
  EXPECT_THAT(outputs.Deliver({0, 3, a[3]}), IsEmpty());
  EXPECT_EQ(outputs.Finish(1, SampleFinish::kLength), std::nullopt);  // waits for token 0
  EXPECT_FALSE(outputs.progressed());

  std::vector<Emission> e = outputs.Deliver({0, 0, a[0]});
  ASSERT_EQ(e.size(), 1u);
  EXPECT_EQ(e[0].sample_index, 0u);
  ASSERT_EQ(e[0].tokens.size(), 2u);
  EXPECT_EQ(e[0].tokens[0].position, 0u);
  EXPECT_EQ(e[0].tokens[1].position, 1u);
  EXPECT_EQ(e[0].text, "Hello,");
  EXPECT_EQ(e[0].completion_tokens, 2u);
  EXPECT_FALSE(e[0].end.has_value());
  EXPECT_TRUE(outputs.progressed());

  e = outputs.Deliver({1, 0, b[0]});  // sample 1's token 0, its end already known
  ASSERT_EQ(e.size(), 2u);
  EXPECT_EQ(e[0].sample_index, 1u);
  EXPECT_EQ(e[0].tokens.size(), 2u);
  EXPECT_EQ(e[0].text, Text(kHelloWorld));
  EXPECT_FALSE(e[0].end.has_value());
  EXPECT_THAT(e[1].tokens, IsEmpty());
  EXPECT_EQ(e[1].text, "");
  ASSERT_TRUE(e[1].end.has_value());
  EXPECT_EQ(e[1].end->finish, SampleFinish::kLength);
  EXPECT_EQ(e[1].completion_tokens, 2u);
  EXPECT_EQ(outputs.samples_left(), 1u);

  // A duplicate, a token of an ended sample and an unknown sample index
  // release nothing.
  EXPECT_THAT(outputs.Deliver({0, 1, a[1]}), IsEmpty());
  EXPECT_THAT(outputs.Deliver({1, 2, 0}), IsEmpty());
  EXPECT_THAT(outputs.Deliver({2, 0, a[0]}), IsEmpty());
  EXPECT_EQ(outputs.Finish(2, SampleFinish::kLength), std::nullopt);

  e = outputs.Deliver({0, 2, a[2]});
  ASSERT_EQ(e.size(), 1u);
  EXPECT_EQ(e[0].tokens.size(), 2u);  // 2 and the buffered 3
  EXPECT_EQ(e[0].text, " world!");
  EXPECT_EQ(outputs.next_index(0), 4u);
  EXPECT_EQ(outputs.reported(0), SampleFinish::kNone);
}

TEST_F(SampleOutputTest, RestartForgetsBufferedTokensAndReportedEnds) {
  // A migration: the new decode stream resends from the first unreleased
  // index and says again how the sample ends.
  const std::vector<int32_t>& ids = Ids(kCyrillic);
  ASSERT_GE(ids.size(), 4u);
  Outputs outputs(tok(), {});
  std::vector<Received> received(1);
  Collect(outputs.Deliver({0, 0, ids[0]}), &received);
  Collect(outputs.Deliver({0, 2, ids[2]}), &received);  // buffered, then lost
  EXPECT_EQ(outputs.Finish(0, SampleFinish::kLength), std::nullopt);
  outputs.Restart();
  EXPECT_EQ(outputs.reported(0), SampleFinish::kNone);
  EXPECT_THAT(outputs.emitted(0), ElementsAre(ids[0]));
  for (uint32_t i = 1; i < ids.size(); ++i) Collect(outputs.Deliver({0, i, ids[i]}), &received);
  EXPECT_FALSE(received[0].end.has_value());  // the old stream's end was forgotten
  Collect(outputs.Finish(0, SampleFinish::kContext), &received);
  EXPECT_EQ(received[0].text, Text(kCyrillic));
  EXPECT_EQ(received[0].charge, static_cast<int64_t>(ids.size()));
  ASSERT_TRUE(received[0].end.has_value());
  EXPECT_EQ(received[0].end->finish, SampleFinish::kContext);
}

TEST_F(SampleOutputTest, EndOfGenerationTokenHasNoStopReason) {
  // "Hello world" then an end-of-generation token: the token is sent (and
  // charged) and, as vLLM, an EOS stop has no stop reason.
  ASSERT_FALSE(tok().eog_ids().empty());
  const int32_t eog = tok().eog_ids().front();
  std::vector<int32_t> ids = Ids(kHelloWorld);
  ids.push_back(eog);
  SampleOutputOptions options;
  options.stop_token_ids = {eog};  // listed too: still an end-of-generation stop
  Outputs outputs(tok(), options);
  const Received r = RunOne(outputs, ids, SampleFinish::kStop);
  EXPECT_EQ(r.text, Text(kHelloWorld));
  EXPECT_THAT(r.ids, ElementsAreArray(ids));
  EXPECT_EQ(r.charge, 3);
  ASSERT_TRUE(r.end.has_value());
  EXPECT_EQ(r.end->finish, SampleFinish::kStop);
  EXPECT_FALSE(r.end->stop_string.has_value());
  EXPECT_FALSE(r.end->stop_token_id.has_value());

  // With ignore_eos it is an ordinary token: a stop_token_ids stop.
  options.ignore_eos = true;
  Outputs ignoring(tok(), options);
  const Received i = RunOne(ignoring, ids, SampleFinish::kStop);
  EXPECT_EQ(i.text, Text(kHelloWorld) + Decode(tok(), {eog}));
  EXPECT_EQ(i.end->stop_token_id, eog);
}

TEST_F(SampleOutputTest, StopTokenKeepsItsIdButNotItsText) {
  // stop_token_ids {1879}: " world" ends "Hello, world!" as a stop token.
  // Its id is sent (and charged), its text is not, and it is the stop
  // reason.
  const std::vector<int32_t>& all = Ids(kHelloCommaWorld);
  const std::vector<int32_t> ids(all.begin(), all.begin() + 3);  // 9707 11 1879
  ASSERT_THAT(ids, ElementsAre(9707, 11, 1879));
  const std::string& text = Text(kHelloCommaWorld);
  const std::string with_token = text.substr(0, text.find('!'));  // "Hello, world"
  const std::string without = text.substr(0, text.find(" world"));  // "Hello,"
  SampleOutputOptions options;
  options.stop_token_ids = {151643, 1879};
  {
    Outputs outputs(tok(), options);
    const Received r = RunOne(outputs, ids, SampleFinish::kStop);
    EXPECT_EQ(r.text, without);
    EXPECT_THAT(r.ids, ElementsAreArray(ids));
    EXPECT_EQ(r.charge, 3);
    ASSERT_TRUE(r.end.has_value());
    EXPECT_EQ(r.end->finish, SampleFinish::kStop);
    EXPECT_EQ(r.end->stop_token_id, 1879);
    EXPECT_FALSE(r.end->stop_string.has_value());
    EXPECT_FALSE(r.end->stopped_early);
  }
  {
    SCOPED_TRACE("include_stop_str_in_output: the token's text is kept");
    SampleOutputOptions include = options;
    include.include_stop_str_in_output = true;
    Outputs outputs(tok(), include);
    const Received r = RunOne(outputs, ids, SampleFinish::kStop);
    EXPECT_EQ(r.text, with_token);
    EXPECT_EQ(r.end->stop_token_id, 1879);
  }
  {
    SCOPED_TRACE("before min_tokens it is an ordinary token");
    SampleOutputOptions min = options;
    min.min_tokens = 4;
    Outputs outputs(tok(), min);
    EXPECT_EQ(RunOne(outputs, ids, SampleFinish::kLength).text, with_token);
  }
  {
    SCOPED_TRACE("a length end on that token (the worker's word): no stop reason");
    Outputs outputs(tok(), options);
    const Received r = RunOne(outputs, ids, SampleFinish::kLength);
    EXPECT_EQ(r.text, without);
    EXPECT_EQ(r.end->finish, SampleFinish::kLength);
    EXPECT_FALSE(r.end->stop_token_id.has_value());
  }
}

TEST_F(SampleOutputTest, StopStringBeforeMinTokensDoesNotMatch) {
  // The first "Hello" of "    Hello\n    Hello" completes with the second
  // token, before min_tokens 3: it is not checked, and the second "Hello"
  // ends the sample instead.
  const int c = 28;  // "    Hello\n    Hello": 262 21927 198 262 21927
  const std::string& text = Text(c);
  ASSERT_EQ(text, "    Hello\n    Hello");
  SampleOutputOptions options;
  options.stop = {"Hello"};
  options.min_tokens = 3;
  Outputs outputs(tok(), options);
  std::vector<Received> received(1);
  for (const RecordedToken& t : Stream(Ids(c))) Collect(outputs.Deliver(t), &received);
  EXPECT_EQ(received[0].text, text.substr(0, text.rfind("Hello")));
  EXPECT_EQ(received[0].charge, static_cast<int64_t>(Ids(c).size()));
  ASSERT_TRUE(received[0].end.has_value());
  EXPECT_EQ(received[0].end->stop_string, "Hello");
}

TEST_F(SampleOutputTest, StopStringInOneSampleLeavesTheOthersRunning) {
  // n = 2, both "Hello, world!": sample 1 alone stops on "!", sample 0
  // (three tokens) goes on to its own end, and each is charged what it
  // was sent.
  const std::vector<int32_t>& ids = Ids(kHelloCommaWorld);
  const std::string& text = Text(kHelloCommaWorld);
  SampleOutputOptions options;
  options.n = 2;
  options.stop = {"!"};
  Outputs outputs(tok(), options);
  std::vector<Received> received(2);
  // Sample 1 runs ahead; its "!" arrives before sample 0's first token.
  for (const RecordedToken& t : Stream(ids, 1)) Collect(outputs.Deliver(t), &received);
  EXPECT_EQ(outputs.samples_left(), 1u);
  EXPECT_TRUE(outputs.done(1));
  for (const RecordedToken& t : Stream({ids[0], ids[1], ids[2]}, 0)) {
    Collect(outputs.Deliver(t), &received);
  }
  Collect(outputs.Finish(0, SampleFinish::kLength), &received);
  EXPECT_EQ(received[1].text, text.substr(0, text.find('!')));
  EXPECT_EQ(received[1].charge, 4);
  EXPECT_TRUE(received[1].end->stopped_early);
  EXPECT_EQ(received[0].text, text.substr(0, text.find('!')));
  EXPECT_EQ(received[0].charge, 3);
  EXPECT_EQ(received[0].end->finish, SampleFinish::kLength);
  EXPECT_EQ(outputs.samples_left(), 0u);
}

}  // namespace
}  // namespace tandem::router
