// Generation controls through a running cluster (issue #11): stop strings
// (across tokens, at the P -> D handoff, inside multi-byte characters),
// stop_token_ids, ignore_eos, min_tokens, logprobs, penalties / min_p /
// logit_bias (route and preemption invariant), n > 1 (seeds, block
// sharing, admission) and the CLI's flags, each on the real processes.
//
// Expected values never come from the code under test: a stop-string case
// is derived from the unconstrained greedy run of the same prompt (whose
// ids the golden tests check against llama.cpp): the text up to the first
// occurrence, and the ids up to the token whose text completes it (the
// router emits one message per token, so the messages give the token
// boundaries). Logprobs are checked against llama.cpp's top-5 in
// ../shared/goldens/stories260K_greedy.json; a banned or masked token is
// replaced by the runner-up the unconstrained run's top_logprobs name.
#include <algorithm>
#include <cmath>
#include <iostream>
#include <map>
#include <optional>
#include <set>
#include <string>
#include <vector>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "nlohmann/json.hpp"
#include "tests/integration/cluster_fixture.h"
#include "tests/integration/generate_client.h"

namespace tandem::testing {
namespace {

using ::testing::ElementsAreArray;
using ::testing::HasSubstr;

constexpr int32_t kEosId = 2;        // stories260K's tokenizer.ggml.eos_token_id
constexpr int32_t kVocabSize = 512;  // stories260K's vocabulary
constexpr v1::RouteOverride kRoutes[] = {v1::ROUTE_LOCAL, v1::ROUTE_REMOTE};

// ---- Reference runs -------------------------------------------------------------------

// One sample of an unconstrained run (no stop strings), split into
// tokens: what every expectation is derived from.
struct Reference {
  std::vector<int32_t> ids;
  std::vector<std::string> texts;  // texts[i]: the text the message of token i carried
  std::vector<size_t> ends;        // ends[i]: bytes of text through token i
  std::string full;                // the whole text
  std::vector<std::vector<v1::TopLogprob>> top;  // per token, with request.logprobs
  std::vector<float> logprobs;
  v1::FinishReason finish = v1::FINISH_NONE;
  v1::StopReason stop_reason;
};

// Splits sample `s` per token. A message must carry at most one token (a
// message without tokens adds its text to the last token); a test failure
// and an empty Reference otherwise.
Reference ReferenceOf(const SampleResult& s) {
  Reference ref;
  for (const StreamMessage& m : s.messages) {
    if (m.token_ids.size() > 1) {
      ADD_FAILURE() << "reference: a message carries " << m.token_ids.size()
                    << " tokens; token boundaries are unknown";
      return Reference();
    }
    if (m.token_ids.empty()) {
      if (m.text.empty()) continue;
      if (ref.texts.empty()) {
        ADD_FAILURE() << "reference: text before the first token";
        return Reference();
      }
      ref.texts.back() += m.text;
      continue;
    }
    ref.texts.push_back(m.text);
  }
  ref.ids = s.token_ids;
  ref.top = s.top_logprobs;
  ref.logprobs = s.logprobs;
  ref.finish = s.finish_reason;
  ref.stop_reason = s.stop_reason;
  for (const std::string& t : ref.texts) {
    ref.full += t;
    ref.ends.push_back(ref.full.size());
  }
  EXPECT_EQ(ref.full, s.text);
  EXPECT_EQ(ref.texts.size(), ref.ids.size());
  return ref;
}

// Runs `request` (n = 1, no stop strings) and splits its text per token.
// `request` on the local route: there each message carries one token (on
// the remote route the router may deliver D's tokens in one message when
// they overtake the prefill worker's reply), and the ids are the same.
v1::GenerateRequest OnLocalRoute(v1::GenerateRequest request) {
  request.set_route_override(v1::ROUTE_LOCAL);
  return request;
}

Reference RunReference(LocalCluster& cluster, const v1::GenerateRequest& request) {
  const StreamResult r = RunGenerate(cluster.stub(), OnLocalRoute(request));
  EXPECT_TRUE(r.status.ok()) << "reference: " << r.status.error_code() << ": "
                             << r.status.error_message();
  if (!r.status.ok() || r.samples.size() != 1) {
    ADD_FAILURE() << "reference: " << r.samples.size() << " samples";
    return Reference();
  }
  return ReferenceOf(r.samples[0]);
}

// What a list of stop strings must give on the reference's prompt.
struct StopExpectation {
  std::string stop;          // the string that matches
  std::string text;          // the released text
  std::vector<int32_t> ids;  // through the token completing the match
  size_t match_begin = 0;    // byte offsets of the match in ref.full
  size_t match_end = 0;
  size_t begin_token = 0;  // the token whose text holds match_begin
  size_t match_token = 0;  // the token whose text completes the match
};

// The index of the token whose text holds byte `offset` of ref.full
// (offset < ref.full.size()).
size_t TokenAtByte(const Reference& ref, size_t offset) {
  return static_cast<size_t>(std::upper_bound(ref.ends.begin(), ref.ends.end(), offset) -
                             ref.ends.begin());
}

// The expectation of `stops` (router/stop_strings.h's rule): among the
// occurrences starting at byte `from` or later, the one that completes
// first, then the one starting first, then the lower index; nullopt when
// none occurs.
std::optional<StopExpectation> ExpectStop(const Reference& ref,
                                          const std::vector<std::string>& stops, bool include,
                                          size_t from = 0) {
  std::optional<StopExpectation> best;
  for (const std::string& stop : stops) {
    const size_t pos = stop.empty() ? std::string::npos : ref.full.find(stop, from);
    if (pos == std::string::npos) continue;
    const size_t end = pos + stop.size();
    if (best.has_value() &&
        (end > best->match_end || (end == best->match_end && pos >= best->match_begin))) {
      continue;
    }
    StopExpectation e;
    e.stop = stop;
    e.match_begin = pos;
    e.match_end = end;
    e.begin_token = TokenAtByte(ref, pos);
    e.match_token = TokenAtByte(ref, end - 1);
    e.text = ref.full.substr(0, include ? end : pos);
    e.ids.assign(ref.ids.begin(), ref.ids.begin() + static_cast<ptrdiff_t>(e.match_token + 1));
    best = e;
  }
  return best;
}

std::optional<StopExpectation> ExpectStop(const Reference& ref, const std::string& stop,
                                          bool include) {
  return ExpectStop(ref, std::vector<std::string>{stop}, include);
}

// Checks sample `s` of a request with stop strings (the longest of
// `longest` bytes) against `e`: text, ids, completion_tokens, FINISH_STOP
// with stop_reason.text, one finishing message; and the stream: nothing
// at or after the match (after its end with `include`) is ever released,
// and before the match at most longest - 1 bytes are held back (none with
// `include`).
void ExpectStopped(const SampleResult& s, const Reference& ref, const StopExpectation& e,
                   size_t longest, bool include) {
  SCOPED_TRACE(absl::StrCat("stop \"", e.stop, "\"", include ? " (included)" : ""));
  EXPECT_EQ(s.text, e.text);
  EXPECT_THAT(s.token_ids, ElementsAreArray(e.ids));
  EXPECT_TRUE(s.IndicesAreSequential()) << ::testing::PrintToString(s.indices);
  EXPECT_EQ(s.completion_tokens, e.ids.size());
  EXPECT_EQ(s.finish_reason, v1::FINISH_STOP);
  EXPECT_EQ(s.finish_messages, 1);
  EXPECT_FALSE(s.tokens_after_finish);
  EXPECT_EQ(s.stop_reason_messages, 1);
  EXPECT_EQ(s.stop_reason.kind_case(), v1::StopReason::kText);
  EXPECT_EQ(s.stop_reason.text(), e.stop);
  size_t tokens = 0;
  std::string released;
  for (size_t m = 0; m < s.messages.size(); ++m) {
    tokens += s.messages[m].token_ids.size();
    released += s.messages[m].text;
    EXPECT_LE(released.size(), e.text.size())
        << "message " << m << " released bytes at or after the match: \"" << released << "\"";
    EXPECT_EQ(e.text.substr(0, released.size()), released) << "message " << m;
    if (tokens == 0 || tokens > e.match_token) continue;  // the match's message
    // Every token before the one completing the match is known not to
    // start a match but for a pending prefix of a stop string.
    const size_t known = ref.ends[tokens - 1];
    if (include) {
      EXPECT_EQ(released.size(), known) << "message " << m << " held bytes back";
    } else {
      EXPECT_GE(released.size() + (longest - 1), known)
          << "message " << m << " held back more than " << longest - 1 << " bytes";
    }
  }
  EXPECT_EQ(released, s.text);
}

void ExpectStopped(const SampleResult& s, const Reference& ref, const StopExpectation& e,
                   bool include) {
  ExpectStopped(s, ref, e, e.stop.size(), include);
}

// Whether `text` is well-formed UTF-8 (RFC 3629: no overlongs, no
// surrogates, nothing above U+10FFFF).
bool IsUtf8(const std::string& text) {
  size_t i = 0;
  while (i < text.size()) {
    const unsigned char c = static_cast<unsigned char>(text[i]);
    size_t len;
    uint32_t cp;
    if (c < 0x80) {
      len = 1;
      cp = c;
    } else if (c >= 0xC2 && c <= 0xDF) {
      len = 2;
      cp = c & 0x1F;
    } else if (c >= 0xE0 && c <= 0xEF) {
      len = 3;
      cp = c & 0x0F;
    } else if (c >= 0xF0 && c <= 0xF4) {
      len = 4;
      cp = c & 0x07;
    } else {
      return false;
    }
    if (i + len > text.size()) return false;
    for (size_t k = 1; k < len; ++k) {
      const unsigned char cc = static_cast<unsigned char>(text[i + k]);
      if ((cc & 0xC0) != 0x80) return false;
      cp = (cp << 6) | (cc & 0x3F);
    }
    if ((len == 3 && (cp < 0x800 || (cp >= 0xD800 && cp <= 0xDFFF))) ||
        (len == 4 && (cp < 0x10000 || cp > 0x10FFFF))) {
      return false;
    }
    i += len;
  }
  return true;
}

// Bytes of the UTF-8 character starting with lead byte `c`.
size_t Utf8Length(unsigned char c) {
  if (c < 0x80) return 1;
  if (c >= 0xF0) return 4;
  if (c >= 0xE0) return 3;
  return 2;
}

// A finished n = 1 stream that must have succeeded; its one sample.
const SampleResult& OnlySample(const StreamResult& r) {
  static const SampleResult* empty = new SampleResult();
  EXPECT_TRUE(r.status.ok()) << r.status.error_code() << ": " << r.status.error_message();
  EXPECT_EQ(r.samples.size(), 1u);
  return r.samples.empty() ? *empty : r.samples[0];
}

v1::GenerateRequest WithStop(v1::GenerateRequest request, const std::string& stop,
                             bool include = false) {
  request.add_stop(stop);
  request.set_include_stop_str_in_output(include);
  return request;
}

// Every token of `s` carries `n` alternatives of one distribution, the
// raw one (GenerateRequest.logprobs): most likely first (ties -> lower
// id), each <= 0; the sampled token's own logprob is its entry's when it
// is listed and no more than the last entry's when it is not.
void ExpectLogprobsConsistent(const SampleResult& s, size_t n) {
  ASSERT_EQ(s.top_logprobs.size(), s.token_ids.size());
  for (size_t i = 0; i < s.token_ids.size(); ++i) {
    SCOPED_TRACE(absl::StrCat("token ", i));
    const std::vector<v1::TopLogprob>& top = s.top_logprobs[i];
    ASSERT_EQ(top.size(), n);
    for (size_t k = 1; k < top.size(); ++k) {
      EXPECT_TRUE(
          top[k - 1].logprob() > top[k].logprob() ||
          (top[k - 1].logprob() == top[k].logprob() && top[k - 1].token_id() < top[k].token_id()))
          << "entries " << k - 1 << " and " << k << " out of order";
    }
    for (const v1::TopLogprob& t : top) EXPECT_LE(t.logprob(), 0.0f);
    if (n == 0) continue;
    const auto listed = std::find_if(top.begin(), top.end(), [&](const v1::TopLogprob& t) {
      return t.token_id() == s.token_ids[i];
    });
    if (listed != top.end()) {
      EXPECT_EQ(FloatBits(listed->logprob()), FloatBits(s.logprobs[i]));
    } else {
      EXPECT_LE(s.logprobs[i], top.back().logprob());
    }
  }
}

// ---- Stop strings, stop ids, EOS, min_tokens, logprobs, n: the default cluster ----------

using ControlsTest = DefaultClusterSuite;

// A stop string made of the tail of token i's text, all of token i+1's
// and the head of token i+2's, whose first occurrence starts in token i
// and completes in token i+2: local and remote, with and without
// include_stop_str_in_output.
TEST_F(ControlsTest, StopStringSpanningThreeTokens) {
  const GoldenCase& g = Golden("once_upon_a_time");
  const Reference ref =
      RunReference(cluster(), MakeRequest(g.prompt, kGoldenMaxTokens, v1::ROUTE_LOCAL));
  ASSERT_EQ(ref.ids.size(), kGoldenMaxTokens);
  ASSERT_THAT(std::vector<int32_t>(ref.ids.begin(), ref.ids.begin() + g.strict_prefix_len),
              ElementsAreArray(g.StrictIds()));
  std::string stop;
  for (size_t i = 1; i + 2 < ref.texts.size() && stop.empty(); ++i) {
    const std::string& a = ref.texts[i];
    const std::string& b = ref.texts[i + 1];
    const std::string& c = ref.texts[i + 2];
    if (a.size() < 2 || b.empty() || c.size() < 2) continue;
    // At most 2 bytes of each neighbour, and never all of it.
    const size_t tail = std::min<size_t>(2, a.size() - 1);
    const size_t head = std::min<size_t>(2, c.size() - 1);
    const std::string candidate = a.substr(a.size() - tail) + b + c.substr(0, head);
    const std::optional<StopExpectation> e = ExpectStop(ref, candidate, false);
    if (e.has_value() && e->begin_token == i && e->match_token == i + 2) stop = candidate;
  }
  ASSERT_FALSE(stop.empty()) << "no three-token stop string in \"" << ref.full << "\"";
  for (v1::RouteOverride route : kRoutes) {
    SCOPED_TRACE(RouteName(route));
    const v1::GenerateRequest request = MakeRequest(g.prompt, kGoldenMaxTokens, route);
    if (route == v1::ROUTE_REMOTE) {
      // The reference's ids hold on either route.
      EXPECT_EQ(OnlySample(RunGenerate(cluster().stub(), request)).token_ids, ref.ids);
    }
    for (bool include : {false, true}) {
      const std::optional<StopExpectation> e = ExpectStop(ref, stop, include);
      ASSERT_TRUE(e.has_value());
      const StreamResult r = RunGenerate(cluster().stub(), WithStop(request, stop, include));
      EXPECT_EQ(r.route, RouteName(route));
      ExpectStopped(OnlySample(r), ref, *e, include);
      if (include) {
        EXPECT_TRUE(OnlySample(r).text.ends_with(stop));
      }
      // The match completes with the last token max_tokens allows: the
      // stop string, not the length, ends the sample.
      v1::GenerateRequest last = WithStop(request, stop, include);
      last.set_max_tokens(static_cast<uint32_t>(e->match_token) + 1);
      ExpectStopped(OnlySample(RunGenerate(cluster().stub(), last)), ref, *e, include);
    }
  }
}

// Overlapping stop strings: the match that completes first wins; of two
// completing at the same byte, the one starting first (router/
// stop_strings.h). W is 6 bytes of the text spanning token boundaries.
TEST_F(ControlsTest, OverlappingStopStringsTheEarliestCompletionWins) {
  const GoldenCase& g = Golden("once_upon_a_time");
  const Reference ref =
      RunReference(cluster(), MakeRequest(g.prompt, kGoldenMaxTokens, v1::ROUTE_LOCAL));
  ASSERT_EQ(ref.ids.size(), kGoldenMaxTokens);
  // The first 6-byte window at or after token 4 whose first occurrence is
  // there and spans a token boundary.
  std::string w;
  for (size_t pos = ref.ends[3]; pos + 6 <= ref.full.size() && w.empty(); ++pos) {
    const std::string candidate = ref.full.substr(pos, 6);
    if (ref.full.find(candidate) == pos && TokenAtByte(ref, pos) != TokenAtByte(ref, pos + 5)) {
      w = candidate;
    }
  }
  ASSERT_FALSE(w.empty());
  const std::vector<std::vector<std::string>> lists = {
      {w, w.substr(0, 3)},         // the head completes first
      {w.substr(2), w},            // same end: w starts first
      {w.substr(3), w.substr(1)},  // same end: the longer
      {w, w},                      // duplicates
  };
  for (const std::vector<std::string>& stops : lists) {
    for (v1::RouteOverride route : kRoutes) {
      SCOPED_TRACE(absl::StrCat(RouteName(route), " stops \"", stops[0], "\", \"", stops[1], "\""));
      const std::optional<StopExpectation> e = ExpectStop(ref, stops, false);
      ASSERT_TRUE(e.has_value());
      v1::GenerateRequest request = MakeRequest(g.prompt, kGoldenMaxTokens, route);
      for (const std::string& stop : stops) request.add_stop(stop);
      ExpectStopped(OnlySample(RunGenerate(cluster().stub(), request)), ref, *e, w.size(), false);
    }
  }
}

// A pending prefix of a stop string held back when the sample ends
// otherwise (max_tokens) is released: the text is the whole unconstrained
// text, FINISH_LENGTH without a stop_reason; the held bytes come only with
// the last message. At token 0 on the remote route too.
TEST_F(ControlsTest, HeldBackStopPrefixIsReleasedAtTheEnd) {
  const GoldenCase& g = Golden("once_upon_a_time");
  const Reference ref =
      RunReference(cluster(), MakeRequest(g.prompt, kGoldenMaxTokens, v1::ROUTE_LOCAL));
  ASSERT_EQ(ref.ids.size(), kGoldenMaxTokens);
  for (size_t j : {size_t{0}, size_t{4}}) {
    ASSERT_GE(ref.texts[j].size(), 1u);
    // The last byte of token j, then bytes the text never holds.
    const std::string stop = ref.texts[j].substr(ref.texts[j].size() - 1) + "#~#";
    ASSERT_EQ(ref.full.find(stop), std::string::npos);
    for (v1::RouteOverride route : kRoutes) {
      SCOPED_TRACE(absl::StrCat(RouteName(route), ", end at token ", j));
      v1::GenerateRequest request =
          WithStop(MakeRequest(g.prompt, static_cast<uint32_t>(j) + 1, route), stop);
      const SampleResult s = OnlySample(RunGenerate(cluster().stub(), request));
      EXPECT_EQ(s.text, ref.full.substr(0, ref.ends[j]));
      EXPECT_THAT(s.token_ids,
                  ElementsAreArray(std::vector<int32_t>(
                      ref.ids.begin(), ref.ids.begin() + static_cast<ptrdiff_t>(j + 1))));
      EXPECT_EQ(s.finish_reason, v1::FINISH_LENGTH);
      EXPECT_EQ(s.finish_messages, 1);
      EXPECT_EQ(s.stop_reason_messages, 0);
      ASSERT_FALSE(s.messages.empty());
      EXPECT_TRUE(s.messages.back().has_finish);
      EXPECT_TRUE(s.messages.back().text.ends_with(stop.substr(0, 1)))
          << "the held byte came before the end: \"" << s.messages.back().text << "\"";
    }
  }
}

// Stop strings are matched on the generated text only: a string made of
// the prompt's end and the output's start does not match.
TEST_F(ControlsTest, StopStringDoesNotReachIntoThePrompt) {
  const GoldenCase& g = Golden("once_upon_a_time");  // "... time" + ", there ..."
  const Reference ref =
      RunReference(cluster(), MakeRequest(g.prompt, kGoldenMaxTokens, v1::ROUTE_LOCAL));
  ASSERT_EQ(ref.ids.size(), kGoldenMaxTokens);
  const std::string stop = g.prompt.substr(g.prompt.size() - 2) + ref.full.substr(0, 1);
  ASSERT_EQ(ref.full.find(stop), std::string::npos) << stop;
  for (v1::RouteOverride route : kRoutes) {
    const SampleResult s = OnlySample(RunGenerate(
        cluster().stub(), WithStop(MakeRequest(g.prompt, kGoldenMaxTokens, route), stop)));
    EXPECT_EQ(s.token_ids, ref.ids) << RouteName(route);
    EXPECT_EQ(s.text, ref.full) << RouteName(route);
    EXPECT_EQ(s.finish_reason, v1::FINISH_LENGTH) << RouteName(route);
  }
}

// Stop strings are not checked before min_tokens tokens: an occurrence
// starting in the text of the first min_tokens - 1 tokens does not count,
// the next one does.
TEST_F(ControlsTest, StopStringIsNotCheckedBeforeMinTokens) {
  const GoldenCase& g = Golden("once_upon_a_time");
  const Reference ref =
      RunReference(cluster(), MakeRequest(g.prompt, kGoldenMaxTokens, v1::ROUTE_LOCAL));
  ASSERT_EQ(ref.ids.size(), kGoldenMaxTokens);
  const std::string stop = ".";
  const std::optional<StopExpectation> first = ExpectStop(ref, stop, false);
  ASSERT_TRUE(first.has_value());
  // Checking starts with token min_tokens - 1: the first occurrence lies
  // before it.
  const uint32_t min_tokens = static_cast<uint32_t>(first->match_token) + 3;
  const std::optional<StopExpectation> e =
      ExpectStop(ref, std::vector<std::string>{stop}, false, ref.ends[min_tokens - 2]);
  ASSERT_TRUE(e.has_value()) << "no \"" << stop << "\" after token " << min_tokens - 1;
  ASSERT_GT(e->match_begin, first->match_begin);
  for (v1::RouteOverride route : kRoutes) {
    SCOPED_TRACE(RouteName(route));
    v1::GenerateRequest request = WithStop(MakeRequest(g.prompt, kGoldenMaxTokens, route), stop);
    request.set_min_tokens(min_tokens);
    ExpectStopped(OnlySample(RunGenerate(cluster().stub(), request)), ref, *e, false);
  }
}

// Several stop strings (the earliest completion wins) on 16 samples: every
// sample gives what its own unconstrained run predicts, and both routes
// give the same samples.
TEST_F(ControlsTest, SixteenSamplesWithStopStrings) {
  const GoldenCase& g = Golden("the_little_dog");
  const std::vector<std::string> stops = {"e", " a", "id."};
  std::vector<SampleResult> by_route[2];
  for (size_t r = 0; r < 2; ++r) {
    SCOPED_TRACE(RouteName(kRoutes[r]));
    v1::GenerateRequest request = MakeRequest(g.prompt, 16, kRoutes[r]);
    SetSeededSampling(&request, 1.0f, 16016);
    request.set_n(16);
    request.set_logprobs(3);
    const StreamResult plain = RunGenerate(cluster().stub(), OnLocalRoute(request));
    ASSERT_TRUE(plain.status.ok()) << plain.status.error_message();
    ASSERT_EQ(plain.samples.size(), 16u);
    for (const std::string& stop : stops) request.add_stop(stop);
    const StreamResult stopped = RunGenerate(cluster().stub(), request);
    ASSERT_TRUE(stopped.status.ok()) << stopped.status.error_message();
    ASSERT_EQ(stopped.samples.size(), 16u);
    int matched = 0;
    for (size_t s = 0; s < 16; ++s) {
      SCOPED_TRACE(absl::StrCat("sample ", s));
      const Reference ref = ReferenceOf(plain.samples[s]);
      const std::optional<StopExpectation> e = ExpectStop(ref, stops, false);
      const SampleResult& x = stopped.samples[s];
      EXPECT_EQ(x.foreign_tokens, 0);
      ExpectLogprobsConsistent(x, 3);
      if (e.has_value()) {
        ++matched;
        ExpectStopped(x, ref, *e, 3, false);
      } else {
        EXPECT_EQ(x.token_ids, ref.ids);
        EXPECT_EQ(x.text, ref.full);
        EXPECT_EQ(x.finish_reason, ref.finish);
        EXPECT_EQ(x.finish_messages, 1);
      }
    }
    EXPECT_GT(matched, 8) << "the stop strings ended few samples";
    by_route[r] = stopped.samples;
  }
  for (size_t s = 0; s < 16; ++s) {
    EXPECT_EQ(by_route[1][s].token_ids, by_route[0][s].token_ids) << "sample " << s;
    EXPECT_EQ(by_route[1][s].text, by_route[0][s].text) << "sample " << s;
    ASSERT_EQ(by_route[1][s].top_logprobs.size(), by_route[0][s].top_logprobs.size());
    for (size_t i = 0; i < by_route[0][s].top_logprobs.size(); ++i) {
      EXPECT_EQ(FloatBits(by_route[1][s].logprobs[i]), FloatBits(by_route[0][s].logprobs[i]))
          << "sample " << s << " token " << i;
      for (size_t k = 0; k < by_route[0][s].top_logprobs[i].size(); ++k) {
        EXPECT_EQ(FloatBits(by_route[1][s].top_logprobs[i][k].logprob()),
                  FloatBits(by_route[0][s].top_logprobs[i][k].logprob()))
            << "sample " << s << " token " << i << " rank " << k;
      }
    }
  }
  v1::ClusterStatus last;
  EXPECT_TRUE(cluster().WaitForIdleWorkers(absl::Seconds(5), &last)) << last.DebugString();
}

// Stop strings ending in the text of token 0 (from the prefill worker) and
// spanning tokens 0 and 1: the decode worker is told to stop (its
// request is gone long before max_tokens) and holds nothing afterwards.
TEST_F(ControlsTest, StopStringAtThePrefillToDecodeHandoff) {
  const GoldenCase& g = Golden("the_little_dog");
  const Reference ref =
      RunReference(cluster(), MakeRequest(g.prompt, kGoldenMaxTokens, v1::ROUTE_LOCAL));
  ASSERT_GE(ref.texts.size(), 2u);
  ASSERT_GE(ref.texts[0].size(), 2u) << "token 0's text \"" << ref.texts[0] << "\"";
  ASSERT_FALSE(ref.texts[1].empty());
  const std::string& t0 = ref.texts[0];
  const std::string& t1 = ref.texts[1];
  struct Case {
    std::string stop;
    size_t match_token;
  };
  const Case cases[] = {
      {t0.substr(1), 0},  // inside token 0
      {t0.substr(t0.size() - 1) + t1.substr(0, std::min<size_t>(2, t1.size())), 1},  // 0 and 1
  };
  // Long enough that a decode worker left running would decode for a
  // while: ignore_eos and everything the context allows.
  const uint32_t max_tokens = kContextLength - static_cast<uint32_t>(g.prompt_ids.size());
  for (const Case& c : cases) {
    for (bool include : {false, true}) {
      SCOPED_TRACE(absl::StrCat("stop \"", c.stop, "\"", include ? " included" : ""));
      const std::optional<StopExpectation> e = ExpectStop(ref, c.stop, include);
      ASSERT_TRUE(e.has_value());
      ASSERT_EQ(e->match_token, c.match_token);
      ASSERT_EQ(e->begin_token, 0u);
      absl::StatusOr<v1::WorkerStatus> before = cluster().DecodeStatus();
      ASSERT_TRUE(before.ok()) << before.status();
      v1::GenerateRequest request = MakeRequest(g.prompt, max_tokens, v1::ROUTE_REMOTE);
      request.set_ignore_eos(true);
      const StreamResult r = RunGenerate(cluster().stub(), WithStop(request, c.stop, include));
      EXPECT_EQ(r.route, "remote");
      EXPECT_EQ(r.prefill_worker, LocalCluster::kPrefillName);
      ExpectStopped(OnlySample(r), ref, *e, include);

      v1::WorkerStatus after;
      EXPECT_TRUE(PollUntil(absl::Seconds(5),
                            [&] {
                              absl::StatusOr<v1::WorkerStatus> d = cluster().DecodeStatus();
                              if (!d.ok()) return false;
                              after = *d;
                              return d->running_requests() == 0;
                            }))
          << "the decode worker still runs the request: " << after.DebugString();
      v1::ClusterStatus last;
      EXPECT_TRUE(cluster().WaitForIdleWorkers(absl::Seconds(5), &last)) << last.DebugString();
      // A worker left running would decode max_tokens - 1 tokens; the
      // cancel's latency (a few ms) is worth a few decode steps, so the
      // bound is generous for a loaded machine.
      EXPECT_LT(after.decode_tokens_total() - before->decode_tokens_total(), max_tokens / 2)
          << "the decode worker went on decoding after the stop string";
    }
  }
}

// logprobs = 5: every token carries 5 alternatives, most likely first
// (ties -> lower id), the greedy token is the first with the same
// logprob, llama.cpp's top-5 ids and logprobs (token 0: log of its
// softmax probabilities; later tokens: logit differences), and the local
// and remote routes agree bit for bit on every token. logprobs = 0 gives
// no alternatives.
TEST_F(ControlsTest, TopLogprobsMatchLlamaCppAndAgreeAcrossRoutes) {
  const GoldenCase& g = Golden("once_upon_a_time");
  std::map<v1::RouteOverride, SampleResult> by_route;
  for (v1::RouteOverride route : kRoutes) {
    SCOPED_TRACE(RouteName(route));
    v1::GenerateRequest request = MakeRequest(g.prompt, kGoldenMaxTokens, route);
    request.set_logprobs(5);
    const StreamResult r = RunGenerate(cluster().stub(), request);
    ASSERT_TRUE(r.status.ok()) << r.status.error_message();
    EXPECT_EQ(r.route, RouteName(route));
    const SampleResult& s = OnlySample(r);
    ASSERT_EQ(s.token_ids.size(), kGoldenMaxTokens);
    ASSERT_EQ(s.top_logprobs.size(), s.token_ids.size());
    ExpectLogprobsConsistent(s, 5);
    for (size_t i = 0; i < s.token_ids.size(); ++i) {
      SCOPED_TRACE(absl::StrCat("token ", i));
      const std::vector<v1::TopLogprob>& top = s.top_logprobs[i];
      ASSERT_EQ(top.size(), 5u);
      // Greedy: the sampled token is the most likely one.
      EXPECT_EQ(top[0].token_id(), s.token_ids[i]);
      EXPECT_EQ(FloatBits(top[0].logprob()), FloatBits(s.logprobs[i]));
      if (i < g.strict_prefix_len && i < g.steps_top5_logits.size()) {
        const auto& golden = g.steps_top5_logits[i];
        for (size_t k = 0; k < golden.size(); ++k) {
          // Ids are compared where llama.cpp's logits are not within the
          // 1e-3 tolerance of a neighbour.
          const bool distinct =
              (k == 0 || golden[k - 1].second - golden[k].second > 2e-3) &&
              (k + 1 == golden.size() || golden[k].second - golden[k + 1].second > 2e-3);
          if (distinct) {
            EXPECT_EQ(top[k].token_id(), golden[k].first) << "rank " << k;
          }
          EXPECT_NEAR(top[k].logprob() - top[0].logprob(), golden[k].second - golden[0].second,
                      2e-3)
              << "rank " << k;
        }
      }
    }
    ASSERT_EQ(g.first_token_top5_probs.size(), 5u);
    for (size_t k = 0; k < 5; ++k) {
      EXPECT_EQ(s.top_logprobs[0][k].token_id(), g.first_token_top5_probs[k].first);
      EXPECT_NEAR(s.top_logprobs[0][k].logprob(), std::log(g.first_token_top5_probs[k].second),
                  1e-3)
          << "token 0, rank " << k;
    }
    by_route[route] = s;
  }
  const SampleResult& local = by_route[v1::ROUTE_LOCAL];
  const SampleResult& remote = by_route[v1::ROUTE_REMOTE];
  ASSERT_EQ(local.token_ids, remote.token_ids);
  ASSERT_EQ(local.top_logprobs.size(), remote.top_logprobs.size());
  for (size_t i = 0; i < local.token_ids.size(); ++i) {
    EXPECT_EQ(FloatBits(local.logprobs[i]), FloatBits(remote.logprobs[i])) << "token " << i;
    ASSERT_EQ(local.top_logprobs[i].size(), remote.top_logprobs[i].size());
    for (size_t k = 0; k < local.top_logprobs[i].size(); ++k) {
      EXPECT_EQ(local.top_logprobs[i][k].token_id(), remote.top_logprobs[i][k].token_id())
          << "token " << i << " rank " << k;
      EXPECT_EQ(FloatBits(local.top_logprobs[i][k].logprob()),
                FloatBits(remote.top_logprobs[i][k].logprob()))
          << "token " << i << " rank " << k;
    }
  }

  for (v1::RouteOverride route : kRoutes) {
    v1::GenerateRequest request = MakeRequest(g.prompt, 8, route);
    request.set_logprobs(0);
    const SampleResult s = OnlySample(RunGenerate(cluster().stub(), request));
    ASSERT_EQ(s.token_ids.size(), 8u);
    for (size_t i = 0; i < s.top_logprobs.size(); ++i) {
      EXPECT_TRUE(s.top_logprobs[i].empty()) << RouteName(route) << " token " << i;
      EXPECT_EQ(FloatBits(s.logprobs[i]), FloatBits(local.logprobs[i]))
          << RouteName(route) << " token " << i;
    }
  }
}

// The penalized, biased, min_p-filtered request of the penalty tests:
// temperature 0.8 with `seed`.
v1::GenerateRequest Penalized(const std::string& prompt, uint32_t max_tokens,
                              v1::RouteOverride route, uint64_t seed, int32_t banned,
                              int32_t favoured) {
  v1::GenerateRequest request = MakeRequest(prompt, max_tokens, route);
  SetSeededSampling(&request, 0.8f, seed);
  v1::SamplingParams* p = request.mutable_sampling();
  p->set_repetition_penalty(1.3f);
  p->set_presence_penalty(0.5f);
  p->set_frequency_penalty(0.4f);
  p->set_min_p(0.05f);
  (*p->mutable_logit_bias())[banned] = -100.0f;
  (*p->mutable_logit_bias())[favoured] = 2.0f;
  return request;
}

// Penalties and min_p give the same ids on both routes, change the ids
// (the same request without them differs), and a bias of -100 bans a
// token: greedy, it is replaced where the unbiased run had it by the
// runner-up of that step.
TEST_F(ControlsTest, PenaltiesAndLogitBiasAreRouteInvariantAndAct) {
  const GoldenCase& g = Golden("lily_and_ben");  // a repetitive greedy continuation
  constexpr uint32_t kMaxTokens = 48;
  v1::GenerateRequest plain = MakeRequest(g.prompt, kMaxTokens, v1::ROUTE_LOCAL);
  plain.set_logprobs(2);
  const Reference ref = RunReference(cluster(), plain);
  ASSERT_EQ(ref.ids.size(), kMaxTokens);
  // The banned token: one the greedy run generates, first at index k > 0.
  const int32_t banned = ref.ids[1];
  const size_t k = 1;
  const int32_t favoured = 294;
  ASSERT_NE(ref.ids[0], banned);

  std::vector<int32_t> ids_by_route[2];
  for (size_t r = 0; r < 2; ++r) {
    v1::GenerateRequest penalized =
        Penalized(g.prompt, kMaxTokens, kRoutes[r], 1234, banned, favoured);
    penalized.set_logprobs(4);
    const StreamResult result = RunGenerate(cluster().stub(), penalized);
    ExpectLogprobsConsistent(OnlySample(result), 4);
    EXPECT_EQ(result.route, RouteName(kRoutes[r]));
    ids_by_route[r] = OnlySample(result).token_ids;
    EXPECT_EQ(ids_by_route[r].size(), kMaxTokens) << RouteName(kRoutes[r]);
    EXPECT_THAT(ids_by_route[r], ::testing::Not(::testing::Contains(banned)))
        << RouteName(kRoutes[r]);
  }
  EXPECT_EQ(ids_by_route[1], ids_by_route[0]) << "remote and local differ";
  // Each sample has its own history: sample 0 of n = 2 is the n = 1 stream.
  for (v1::RouteOverride route : kRoutes) {
    v1::GenerateRequest two = Penalized(g.prompt, kMaxTokens, route, 1234, banned, favoured);
    two.set_n(2);
    const StreamResult r = RunGenerate(cluster().stub(), two);
    ASSERT_TRUE(r.status.ok()) << r.status.error_message();
    ASSERT_EQ(r.samples.size(), 2u);
    EXPECT_EQ(r.samples[0].token_ids, ids_by_route[0]) << RouteName(route);
    EXPECT_NE(r.samples[1].token_ids, ids_by_route[0]) << RouteName(route);
    EXPECT_THAT(r.samples[1].token_ids, ::testing::Not(::testing::Contains(banned)));
  }

  v1::GenerateRequest unpenalized =
      Penalized(g.prompt, kMaxTokens, v1::ROUTE_LOCAL, 1234, banned, favoured);
  unpenalized.mutable_sampling()->clear_repetition_penalty();
  unpenalized.mutable_sampling()->set_presence_penalty(0);
  unpenalized.mutable_sampling()->set_frequency_penalty(0);
  EXPECT_NE(OnlySample(RunGenerate(cluster().stub(), unpenalized)).token_ids, ids_by_route[0])
      << "the penalties changed nothing";

  // Greedy with the ban alone: the runner-up of step k replaces it.
  ASSERT_EQ(ref.top.size(), ref.ids.size());
  ASSERT_EQ(ref.top[k].size(), 2u);
  ASSERT_EQ(ref.top[k][0].token_id(), banned);
  for (v1::RouteOverride route : kRoutes) {
    v1::GenerateRequest banning = MakeRequest(g.prompt, kMaxTokens, route);
    (*banning.mutable_sampling()->mutable_logit_bias())[banned] = -100.0f;
    banning.set_logprobs(2);
    const SampleResult s = OnlySample(RunGenerate(cluster().stub(), banning));
    ASSERT_GT(s.token_ids.size(), k) << RouteName(route);
    EXPECT_THAT(s.token_ids, ::testing::Not(::testing::Contains(banned))) << RouteName(route);
    EXPECT_THAT(std::vector<int32_t>(s.token_ids.begin(), s.token_ids.begin() + k),
                ElementsAreArray(std::vector<int32_t>(ref.ids.begin(), ref.ids.begin() + k)))
        << RouteName(route);
    EXPECT_EQ(s.token_ids[k], ref.top[k][1].token_id()) << RouteName(route);
    // Logprobs are of the raw distribution (before the bias): step k's
    // are the unbiased run's, the banned id still first among them.
    ASSERT_GT(s.logprobs.size(), k);
    EXPECT_EQ(FloatBits(s.logprobs[k]), FloatBits(ref.top[k][1].logprob())) << RouteName(route);
    ASSERT_EQ(s.top_logprobs[k].size(), 2u);
    for (size_t rank = 0; rank < 2; ++rank) {
      EXPECT_EQ(s.top_logprobs[k][rank].token_id(), ref.top[k][rank].token_id());
      EXPECT_EQ(FloatBits(s.top_logprobs[k][rank].logprob()),
                FloatBits(ref.top[k][rank].logprob()));
    }
  }
}

// Greedy ids under repetition / frequency / presence penalties, computed
// from llama.cpp's raw logits of the unpenalized greedy path (the golden
// steps' top-5): Hugging Face's repetition penalty over prompt and output
// ids (l > 0: l / p, else l x p), then OpenAI's frequency (count x f) and
// presence (f if count > 0) penalties over output ids (vLLM v1's order).
// Penalties never raise a logit, so an id outside the top-5 stays below
// the raw 5th. Follows the golden path while the penalized argmax agrees
// with it, and returns it up to and including the first step where it does
// not (the penalties' first visible effect); {} when a step's winner is
// within 1e-2 of the runner-up (llama.cpp's logits match ours within 1e-3)
// or the path never diverges within strict_prefix_len.
std::vector<int32_t> PenalizedGreedyReference(const GoldenCase& g, float repetition,
                                              float frequency, float presence) {
  std::map<int32_t, int> counts;
  const std::set<int32_t> prompt(g.prompt_ids.begin(), g.prompt_ids.end());
  std::vector<int32_t> ids;
  for (size_t i = 0; i < g.strict_prefix_len && i < g.steps_top5_logits.size(); ++i) {
    std::vector<std::pair<double, int32_t>> penalized;
    for (const auto& [id, raw] : g.steps_top5_logits[i]) {
      const int n = counts[id];
      double l = raw;
      if (prompt.count(id) != 0 || n > 0) l = l > 0 ? l / repetition : l * repetition;
      l -= frequency * n;
      if (n > 0) l -= presence;
      penalized.emplace_back(l, id);
    }
    std::sort(penalized.rbegin(), penalized.rend());
    const double others = g.steps_top5_logits[i].back().second;  // bound of ids outside
    if (penalized[0].first - std::max(penalized[1].first, others) < 1e-2) return {};
    ids.push_back(penalized[0].second);
    if (ids.back() != g.generated_ids[i]) return ids;
    ++counts[ids.back()];
  }
  return {};
}

// Greedy with penalties: the ids PenalizedGreedyReference computes from
// llama.cpp's logits, through the first step the penalties change, on both
// routes; each penalty alone and together.
TEST_F(ControlsTest, GreedyPenaltiesMatchAReferenceOnLlamaCppLogits) {
  struct Penalties {
    float repetition, frequency, presence;
  };
  const Penalties configs[] = {{1.3f, 0, 0}, {1, 1.0f, 0}, {1, 0, 1.5f}, {1.3f, 0.4f, 0.5f}};
  int checked = 0;
  for (const GoldenCase& g : Goldens()) {
    for (const Penalties& p : configs) {
      const std::vector<int32_t> expected =
          PenalizedGreedyReference(g, p.repetition, p.frequency, p.presence);
      if (expected.empty()) continue;
      ++checked;
      for (v1::RouteOverride route : kRoutes) {
        SCOPED_TRACE(absl::StrCat(g.name, " ", RouteName(route), ": repetition ", p.repetition,
                                  " frequency ", p.frequency, " presence ", p.presence));
        v1::GenerateRequest request =
            MakeRequest(g.prompt, static_cast<uint32_t>(expected.size()), route);
        if (p.repetition != 1) request.mutable_sampling()->set_repetition_penalty(p.repetition);
        request.mutable_sampling()->set_frequency_penalty(p.frequency);
        request.mutable_sampling()->set_presence_penalty(p.presence);
        EXPECT_EQ(OnlySample(RunGenerate(cluster().stub(), request)).token_ids, expected);
      }
    }
  }
  EXPECT_GE(checked, 12) << "too few cases where the reference is determined";
}

// min_p = 1 keeps only the most likely token: any temperature samples the
// greedy ids (llama.cpp's goldens).
TEST_F(ControlsTest, MinPOfOneSamplesTheGreedyIds) {
  for (const char* name : {"once_upon_a_time", "lily_and_ben"}) {
    const GoldenCase& g = Golden(name);
    for (v1::RouteOverride route : kRoutes) {
      v1::GenerateRequest request = MakeRequest(g.prompt, kGoldenMaxTokens, route);
      SetSeededSampling(&request, 1.5f, 2718);
      request.mutable_sampling()->set_min_p(1.0f);
      const SampleResult s = OnlySample(RunGenerate(cluster().stub(), request));
      ASSERT_GE(s.token_ids.size(), g.strict_prefix_len) << name;
      EXPECT_THAT(
          std::vector<int32_t>(s.token_ids.begin(),
                               s.token_ids.begin() + static_cast<ptrdiff_t>(g.strict_prefix_len)),
          ElementsAreArray(g.StrictIds()))
          << name << " " << RouteName(route);
    }
  }
}

// stop_token_ids: an id the greedy run generates first at index k ends the
// stream there (the id returned, stop_reason.token_id); at index 0 on the
// remote route, the prefill worker's token. The text is vLLM's: the stop
// token's own text is left out unless include_stop_str_in_output (vLLM v1
// engine/detokenizer.py, IncrementalDetokenizer.update: a stop-terminated
// step does not detokenize its last token; v0's StopChecker removes its
// characters). Before min_tokens the id is masked.
TEST_F(ControlsTest, StopTokenIdEndsTheSampleWhereTheGreedyRunHasIt) {
  const GoldenCase& g = Golden("once_upon_a_time");
  v1::GenerateRequest plain = MakeRequest(g.prompt, kGoldenMaxTokens, v1::ROUTE_LOCAL);
  plain.set_logprobs(2);
  const Reference ref = RunReference(cluster(), plain);
  ASSERT_EQ(ref.ids.size(), kGoldenMaxTokens);
  // Index 6 and index 0, each the id's first occurrence.
  for (size_t k : {size_t{6}, size_t{0}}) {
    const int32_t id = ref.ids[k];
    ASSERT_EQ(std::find(ref.ids.begin(), ref.ids.end(), id) - ref.ids.begin(),
              static_cast<ptrdiff_t>(k));
    ASSERT_FALSE(ref.texts[k].empty());
    for (v1::RouteOverride route : kRoutes) {
      SCOPED_TRACE(absl::StrCat(RouteName(route), ", stop id ", id, " at index ", k));
      v1::GenerateRequest request = MakeRequest(g.prompt, kGoldenMaxTokens, route);
      request.add_stop_token_ids(id);
      request.add_stop_token_ids(kVocabSize - 1);  // never generated here
      for (bool include : {false, true}) {
        SCOPED_TRACE(include ? "include_stop_str_in_output" : "");
        request.set_include_stop_str_in_output(include);
        const StreamResult r = RunGenerate(cluster().stub(), request);
        EXPECT_EQ(r.route, RouteName(route));
        const SampleResult& s = OnlySample(r);
        EXPECT_THAT(s.token_ids,
                    ElementsAreArray(std::vector<int32_t>(
                        ref.ids.begin(), ref.ids.begin() + static_cast<ptrdiff_t>(k + 1))));
        EXPECT_EQ(s.completion_tokens, k + 1);
        EXPECT_EQ(s.finish_reason, v1::FINISH_STOP);
        EXPECT_EQ(s.finish_messages, 1);
        EXPECT_EQ(s.stop_reason.kind_case(), v1::StopReason::kTokenId);
        EXPECT_EQ(s.stop_reason.token_id(), id);
        const size_t kept = include ? ref.ends[k] : ref.ends[k] - ref.texts[k].size();
        EXPECT_EQ(s.text, ref.full.substr(0, kept));
      }
      request.set_include_stop_str_in_output(false);

      // Before min_tokens the id is masked: the runner-up of step k
      // replaces it (the raw top_logprobs of the reference name it).
      request.set_min_tokens(static_cast<uint32_t>(k) + 2);
      const SampleResult m = OnlySample(RunGenerate(cluster().stub(), request));
      ASSERT_GT(m.token_ids.size(), k + 1);
      EXPECT_THAT(std::vector<int32_t>(m.token_ids.begin(),
                                       m.token_ids.begin() + static_cast<ptrdiff_t>(k)),
                  ElementsAreArray(std::vector<int32_t>(
                      ref.ids.begin(), ref.ids.begin() + static_cast<ptrdiff_t>(k))));
      ASSERT_EQ(ref.top[k].size(), 2u);
      ASSERT_EQ(ref.top[k][0].token_id(), id);
      EXPECT_EQ(m.token_ids[k], ref.top[k][1].token_id());
      EXPECT_NE(m.token_ids[k + 1], id);
    }
  }
}

// ignore_eos, min_tokens and EOS in stop_token_ids. stories260K's greedy
// runs never end with EOS (its stories end with BOS), so an EOS-ending run
// is made with a logit bias on EOS alone: the smallest of a few biases
// that makes greedy end with EOS at index k, once with k >= 2 and once at
// k = 0 (on the remote route the prefill worker's token). On both routes:
// with ignore_eos the same request runs to max_tokens (FINISH_LENGTH)
// through the same EOS at k; with min_tokens = k + 4 EOS is masked: the
// first min_tokens ids are the unbiased greedy run's (llama.cpp's golden
// ids); EOS in stop_token_ids gives stop_reason.token_id only with
// ignore_eos (as vLLM: an end-of-generation stop has no stop_reason).
TEST_F(ControlsTest, IgnoreEosMinTokensAndEosAsStopTokenId) {
  const GoldenCase& g = Golden("once_upon_a_time");
  constexpr uint32_t kMaxTokens = 32;
  struct Search {
    std::vector<float> biases;
    size_t min_k, max_k;  // EOS's index must lie in [min_k, max_k]
  };
  const Search searches[] = {{{20, 21, 22, 23, 24, 25}, 2, 20}, {{30, 40, 60, 100}, 0, 0}};
  for (const Search& search : searches) {
    v1::GenerateRequest request;
    Reference ref;
    for (float bias : search.biases) {
      request = MakeRequest(g.prompt, kMaxTokens, v1::ROUTE_LOCAL);
      (*request.mutable_sampling()->mutable_logit_bias())[kEosId] = bias;
      ref = RunReference(cluster(), request);
      if (!ref.ids.empty() && ref.ids.back() == kEosId && ref.ids.size() - 1 >= search.min_k &&
          ref.ids.size() - 1 <= search.max_k) {
        break;
      }
      ref = Reference();
    }
    ASSERT_FALSE(ref.ids.empty()) << "no bias made the greedy run end with EOS at " << search.min_k
                                  << ".." << search.max_k;
    const size_t k = ref.ids.size() - 1;  // EOS's index
    EXPECT_EQ(ref.finish, v1::FINISH_STOP);
    EXPECT_EQ(ref.stop_reason.kind_case(), v1::StopReason::KIND_NOT_SET);
    // Before EOS, the bias changed nothing: the golden ids.
    ASSERT_LE(k + 4, g.strict_prefix_len);
    EXPECT_THAT(std::vector<int32_t>(ref.ids.begin(), ref.ids.begin() + static_cast<ptrdiff_t>(k)),
                ElementsAreArray(std::vector<int32_t>(
                    g.generated_ids.begin(), g.generated_ids.begin() + static_cast<ptrdiff_t>(k))));

    for (v1::RouteOverride route : kRoutes) {
      SCOPED_TRACE(absl::StrCat(RouteName(route), ", EOS at ", k));
      v1::GenerateRequest ignoring = request;
      ignoring.set_route_override(route);
      ignoring.set_ignore_eos(true);
      const SampleResult s = OnlySample(RunGenerate(cluster().stub(), ignoring));
      ASSERT_EQ(s.token_ids.size(), kMaxTokens);
      EXPECT_THAT(std::vector<int32_t>(s.token_ids.begin(),
                                       s.token_ids.begin() + static_cast<ptrdiff_t>(k + 1)),
                  ElementsAreArray(ref.ids));
      EXPECT_EQ(s.finish_reason, v1::FINISH_LENGTH);
      EXPECT_EQ(s.stop_reason.kind_case(), v1::StopReason::KIND_NOT_SET);
      EXPECT_EQ(s.completion_tokens, kMaxTokens);

      v1::GenerateRequest min_tokens = request;
      min_tokens.set_route_override(route);
      const uint32_t min = static_cast<uint32_t>(k) + 4;
      min_tokens.set_min_tokens(min);
      const SampleResult m = OnlySample(RunGenerate(cluster().stub(), min_tokens));
      ASSERT_GE(m.token_ids.size(), min);
      const std::vector<int32_t> first(m.token_ids.begin(), m.token_ids.begin() + min);
      EXPECT_THAT(first, ::testing::Not(::testing::Contains(kEosId)));
      EXPECT_THAT(first, ElementsAreArray(std::vector<int32_t>(g.generated_ids.begin(),
                                                               g.generated_ids.begin() + min)));

      for (bool ignore_eos : {false, true}) {
        v1::GenerateRequest stop_id = request;
        stop_id.set_route_override(route);
        stop_id.add_stop_token_ids(kEosId);
        stop_id.set_ignore_eos(ignore_eos);
        const SampleResult x = OnlySample(RunGenerate(cluster().stub(), stop_id));
        EXPECT_EQ(x.token_ids, ref.ids) << "ignore_eos " << ignore_eos;
        EXPECT_EQ(x.finish_reason, v1::FINISH_STOP) << "ignore_eos " << ignore_eos;
        if (ignore_eos) {
          EXPECT_EQ(x.stop_reason.kind_case(), v1::StopReason::kTokenId);
          EXPECT_EQ(x.stop_reason.token_id(), kEosId);
        } else {
          EXPECT_EQ(x.stop_reason.kind_case(), v1::StopReason::KIND_NOT_SET);
        }
      }
    }
  }
}

// n = 3 with a seed at temperature 1: sample 0 is the n = 1 stream, the
// same request gives the same samples again and on the other route, each
// sample streams its own messages and ends with exactly one finishing
// message, and the samples are not all alike.
TEST_F(ControlsTest, ThreeSeededSamples) {
  const GoldenCase& g = Golden("the_little_dog");
  constexpr uint32_t kMaxTokens = 24;
  constexpr uint64_t kSeed = 777;
  std::vector<SampleResult> first_route_samples;
  for (v1::RouteOverride route : kRoutes) {
    SCOPED_TRACE(RouteName(route));
    v1::GenerateRequest one = MakeRequest(g.prompt, kMaxTokens, route);
    SetSeededSampling(&one, 1.0f, kSeed);
    one.set_logprobs(3);
    const SampleResult single = OnlySample(RunGenerate(cluster().stub(), one));
    ASSERT_FALSE(single.token_ids.empty());

    v1::GenerateRequest three = one;
    three.set_n(3);
    const StreamResult a = RunGenerate(cluster().stub(), three);
    const StreamResult b = RunGenerate(cluster().stub(), three);
    ASSERT_TRUE(a.status.ok()) << a.status.error_message();
    ASSERT_TRUE(b.status.ok()) << b.status.error_message();
    EXPECT_EQ(a.route, RouteName(route));
    EXPECT_LT(a.max_sample_index, 3u);
    ASSERT_EQ(a.samples.size(), 3u) << "a message named a sample_index >= 3 or a sample is silent";
    ASSERT_EQ(b.samples.size(), 3u);
    for (size_t s = 0; s < 3; ++s) {
      SCOPED_TRACE(absl::StrCat("sample ", s));
      const SampleResult& x = a.samples[s];
      EXPECT_FALSE(x.token_ids.empty());
      EXPECT_TRUE(x.IndicesAreSequential()) << ::testing::PrintToString(x.indices);
      EXPECT_EQ(x.foreign_tokens, 0);
      EXPECT_EQ(x.finish_messages, 1);
      EXPECT_FALSE(x.tokens_after_finish);
      EXPECT_TRUE(x.messages.back().has_finish);
      EXPECT_NE(x.finish_reason, v1::FINISH_NONE);
      EXPECT_EQ(x.completion_tokens, x.token_ids.size());
      if (x.finish_reason == v1::FINISH_LENGTH) {
        EXPECT_EQ(x.token_ids.size(), kMaxTokens);
      }
      ExpectLogprobsConsistent(x, 3);
      // Token 0 of every sample comes from the same distribution.
      ASSERT_FALSE(x.top_logprobs.empty());
      ASSERT_EQ(x.top_logprobs[0].size(), single.top_logprobs[0].size());
      for (size_t k = 0; k < x.top_logprobs[0].size(); ++k) {
        EXPECT_EQ(x.top_logprobs[0][k].token_id(), single.top_logprobs[0][k].token_id());
        EXPECT_EQ(FloatBits(x.top_logprobs[0][k].logprob()),
                  FloatBits(single.top_logprobs[0][k].logprob()));
      }
      EXPECT_EQ(x.token_ids, b.samples[s].token_ids) << "the same request twice";
      EXPECT_EQ(x.text, b.samples[s].text);
      if (!first_route_samples.empty()) {
        EXPECT_EQ(x.token_ids, first_route_samples[s].token_ids) << "local and remote differ";
      }
    }
    EXPECT_EQ(a.samples[0].token_ids, single.token_ids) << "sample 0 differs from n = 1";
    EXPECT_EQ(a.samples[0].text, single.text);
    std::vector<uint32_t> bits, single_bits;
    for (float f : a.samples[0].logprobs) bits.push_back(FloatBits(f));
    for (float f : single.logprobs) single_bits.push_back(FloatBits(f));
    EXPECT_EQ(bits, single_bits);
    const std::set<std::vector<int32_t>> distinct = {a.samples[0].token_ids, a.samples[1].token_ids,
                                                     a.samples[2].token_ids};
    EXPECT_GE(distinct.size(), 2u) << "three samples at temperature 1 are identical";
    if (first_route_samples.empty()) first_route_samples = a.samples;
  }
  v1::ClusterStatus last;
  EXPECT_TRUE(cluster().WaitForIdleWorkers(absl::Seconds(5), &last)) << last.DebugString();
}

// n > 1 with a stop string that ends one sample early: that sample stops
// with its stop_reason, the others go on, and nothing is held afterwards.
TEST_F(ControlsTest, StopStringEndsOneSampleOfThree) {
  const GoldenCase& g = Golden("the_little_dog");
  constexpr uint32_t kMaxTokens = 24;
  for (v1::RouteOverride route : kRoutes) {
    SCOPED_TRACE(RouteName(route));
    v1::GenerateRequest three = MakeRequest(g.prompt, kMaxTokens, route);
    SetSeededSampling(&three, 1.0f, 31337);
    three.set_n(3);
    const StreamResult plain = RunGenerate(cluster().stub(), OnLocalRoute(three));
    ASSERT_TRUE(plain.status.ok()) << plain.status.error_message();
    ASSERT_EQ(plain.samples.size(), 3u);
    // A stop string from sample 1's text that no other sample holds earlier.
    std::string stop;
    size_t stopped = 1;
    for (size_t s = 0; s < 3 && stop.empty(); ++s) {
      const std::string& text = plain.samples[s].text;
      for (size_t pos = 4; pos + 3 <= text.size() && stop.empty(); ++pos) {
        const std::string candidate = text.substr(pos, 3);
        bool unique = true;
        for (size_t o = 0; o < 3; ++o) {
          if (o != s && plain.samples[o].text.find(candidate) != std::string::npos) unique = false;
        }
        if (unique) {
          stop = candidate;
          stopped = s;
        }
      }
    }
    ASSERT_FALSE(stop.empty());
    // Each sample's expectation comes from its own unconstrained messages.
    const StreamResult r = RunGenerate(cluster().stub(), WithStop(three, stop));
    ASSERT_TRUE(r.status.ok()) << r.status.error_message();
    ASSERT_EQ(r.samples.size(), 3u);
    for (size_t s = 0; s < 3; ++s) {
      SCOPED_TRACE(absl::StrCat("sample ", s, " stop \"", stop, "\""));
      if (s != stopped) {
        EXPECT_EQ(r.samples[s].token_ids, plain.samples[s].token_ids);
        EXPECT_EQ(r.samples[s].text, plain.samples[s].text);
        EXPECT_EQ(r.samples[s].finish_reason, plain.samples[s].finish_reason);
        continue;
      }
      const Reference ref = ReferenceOf(plain.samples[s]);
      const std::optional<StopExpectation> e = ExpectStop(ref, stop, false);
      ASSERT_TRUE(e.has_value());
      ExpectStopped(r.samples[s], ref, *e, false);
    }
  }
  v1::ClusterStatus last;
  EXPECT_TRUE(cluster().WaitForIdleWorkers(absl::Seconds(5), &last)) << last.DebugString();
}

// A stop string ending one sample of two early: the decode worker stops
// decoding that sample (DecodeWorker.CancelSample) while the other runs
// to max_tokens: it decodes about max_tokens tokens in all, not twice as
// many; the other sample is unchanged.
TEST_F(ControlsTest, StoppedSampleIsNoLongerDecoded) {
  const GoldenCase& g = Golden("the_little_dog");
  constexpr uint32_t kMaxTokens = 400;
  for (v1::RouteOverride route : kRoutes) {
    SCOPED_TRACE(RouteName(route));
    v1::GenerateRequest two = MakeRequest(g.prompt, kMaxTokens, route);
    SetSeededSampling(&two, 1.0f, 2024);
    two.set_n(2);
    two.set_ignore_eos(true);
    const StreamResult plain = RunGenerate(cluster().stub(), OnLocalRoute(two));
    ASSERT_TRUE(plain.status.ok()) << plain.status.error_message();
    ASSERT_EQ(plain.samples.size(), 2u);
    ASSERT_EQ(plain.samples[0].token_ids.size(), kMaxTokens);
    // 5 bytes early in sample 1's text that sample 0's text never holds.
    const std::string& text1 = plain.samples[1].text;
    std::string stop;
    for (size_t pos = 0; pos + 5 <= std::min<size_t>(text1.size(), 30) && stop.empty(); ++pos) {
      const std::string candidate = text1.substr(pos, 5);
      if (plain.samples[0].text.find(candidate) == std::string::npos) stop = candidate;
    }
    ASSERT_FALSE(stop.empty()) << "sample 1 \"" << text1.substr(0, 30) << "\"";
    const Reference ref1 = ReferenceOf(plain.samples[1]);
    const std::optional<StopExpectation> e = ExpectStop(ref1, stop, false);
    ASSERT_TRUE(e.has_value());

    absl::StatusOr<v1::WorkerStatus> before = cluster().DecodeStatus();
    ASSERT_TRUE(before.ok()) << before.status();
    const StreamResult r = RunGenerate(cluster().stub(), WithStop(two, stop));
    ASSERT_TRUE(r.status.ok()) << r.status.error_message();
    ASSERT_EQ(r.samples.size(), 2u);
    EXPECT_EQ(r.samples[0].token_ids, plain.samples[0].token_ids);
    EXPECT_EQ(r.samples[0].finish_reason, v1::FINISH_LENGTH);
    ExpectStopped(r.samples[1], ref1, *e, false);
    v1::ClusterStatus last;
    EXPECT_TRUE(cluster().WaitForIdleWorkers(absl::Seconds(5), &last)) << last.DebugString();
    absl::StatusOr<v1::WorkerStatus> after = cluster().DecodeStatus();
    ASSERT_TRUE(after.ok()) << after.status();
    // Both samples left running would decode 2 x 400 tokens; sample 0
    // alone 400 plus sample 1's few (with slack for the cancel's latency).
    EXPECT_LT(after->decode_tokens_total() - before->decode_tokens_total(), kMaxTokens * 7 / 4)
        << "the stopped sample went on decoding";
  }
}

// A client cancelling an n = 3 request mid-stream frees every sample's
// KV on the decode worker (the shared prompt blocks too), on both routes.
TEST_F(ControlsTest, CancellingThreeSamplesFreesTheirBlocks) {
  const GoldenCase& g = Golden("boundary_33tok");  // 2 full prompt blocks to share
  for (v1::RouteOverride route : kRoutes) {
    SCOPED_TRACE(RouteName(route));
    v1::GenerateRequest request =
        MakeRequest(g.prompt, kContextLength - static_cast<uint32_t>(g.prompt_ids.size()), route);
    SetSeededSampling(&request, 1.0f, 5);
    request.set_n(3);
    request.set_ignore_eos(true);
    GenerateStream stream(cluster().stub(), request);
    ASSERT_TRUE(stream.ReadUntilFirstToken()) << stream.Finish().status.error_message();
    stream.Cancel();
    const StreamResult& r = stream.Finish();
    EXPECT_EQ(r.status.error_code(), grpc::StatusCode::CANCELLED) << r.status.error_message();
    v1::WorkerStatus d;
    EXPECT_TRUE(PollUntil(absl::Seconds(5), [&] {
      absl::StatusOr<v1::WorkerStatus> status = cluster().DecodeStatus();
      if (!status.ok()) return false;
      d = *status;
      return d.running_requests() == 0;
    })) << d.DebugString();
    v1::ClusterStatus last;
    EXPECT_TRUE(cluster().WaitForIdleWorkers(absl::Seconds(5), &last)) << last.DebugString();
  }
}

// A request with none of the new fields set: n = 1 (one sample, every
// message sample_index 0), the golden greedy ids.
TEST_F(ControlsTest, OmittedNAndRepetitionPenaltyMeanOneSampleUnpenalized) {
  const GoldenCase& g = Golden("lily_and_ben");
  v1::GenerateRequest request = MakeRequest(g.prompt, kGoldenMaxTokens, v1::ROUTE_LOCAL);
  ASSERT_FALSE(request.has_n());
  ASSERT_FALSE(request.sampling().has_repetition_penalty());
  const StreamResult r = RunGenerate(cluster().stub(), request);
  ExpectGolden(r, g, "local");
  ASSERT_EQ(r.samples.size(), 1u);
  EXPECT_EQ(r.samples[0].finish_messages, 1);
  EXPECT_EQ(r.samples[0].token_ids, r.token_ids);
}

// The CLI's flags reach the router: `tandem generate --json --stop X
// --logprobs 2 --n 2` prints what the gRPC stream of the same request
// gives, sample by sample.
TEST_F(ControlsTest, CliFlagsGiveTheGrpcResult) {
  const GoldenCase& g = Golden("once_upon_a_time");
  constexpr uint64_t kSeed = 99;
  v1::GenerateRequest request = MakeRequest(g.prompt, 24, v1::ROUTE_LOCAL);
  SetSeededSampling(&request, 1.0f, kSeed);
  request.set_n(2);
  request.set_logprobs(2);
  const std::string stop = ".";
  request.add_stop(stop);
  const StreamResult r = RunGenerate(cluster().stub(), request);
  ASSERT_TRUE(r.status.ok()) << r.status.error_message();
  ASSERT_EQ(r.samples.size(), 2u);

  ProcessResult run = RunProcess({BinaryPath("tandem"),
                                  "generate",
                                  "--json",
                                  "--stop",
                                  stop,
                                  "--logprobs",
                                  "2",
                                  "--n",
                                  "2",
                                  "--seed",
                                  absl::StrCat(kSeed),
                                  "--temperature",
                                  "1",
                                  "--max-tokens",
                                  "24",
                                  "--route",
                                  "local",
                                  "--router",
                                  cluster().router_address(),
                                  g.prompt},
                                 absl::Seconds(30));
  ASSERT_TRUE(run.exited && run.exit_code == 0) << run.Describe();
  const std::vector<std::string> lines = Lines(run.out);
  ASSERT_EQ(lines.size(), 1u) << run.out;
  auto finish_name = [](v1::FinishReason f) -> std::string {
    return f == v1::FINISH_STOP ? "stop" : f == v1::FINISH_LENGTH ? "length" : "other";
  };
  try {
    const nlohmann::json j = nlohmann::json::parse(lines[0]);
    EXPECT_EQ(j.at("seed").get<uint64_t>(), kSeed);
    EXPECT_EQ(j.at("text").get<std::string>(), r.samples[0].text);
    EXPECT_EQ(j.at("token_ids").get<std::vector<int32_t>>(), r.samples[0].token_ids);
    ASSERT_EQ(j.at("samples").size(), 2u);
    for (size_t s = 0; s < 2; ++s) {
      SCOPED_TRACE(absl::StrCat("sample ", s));
      const nlohmann::json& js = j.at("samples")[s];
      const SampleResult& x = r.samples[s];
      EXPECT_EQ(js.at("sample_index").get<size_t>(), s);
      EXPECT_EQ(js.at("text").get<std::string>(), x.text);
      EXPECT_EQ(js.at("token_ids").get<std::vector<int32_t>>(), x.token_ids);
      EXPECT_EQ(js.at("finish_reason").get<std::string>(), finish_name(x.finish_reason));
      if (x.stop_reason.kind_case() == v1::StopReason::kText) {
        EXPECT_EQ(js.at("stop_reason").get<std::string>(), stop);
      } else {
        EXPECT_TRUE(js.at("stop_reason").is_null());
      }
      EXPECT_EQ(js.at("completion_tokens").get<size_t>(), x.token_ids.size());
      const nlohmann::json& logprobs = js.at("logprobs");
      ASSERT_EQ(logprobs.size(), x.token_ids.size());
      for (size_t i = 0; i < logprobs.size(); ++i) {
        EXPECT_EQ(logprobs[i].at("token_id").get<int32_t>(), x.token_ids[i]);
        EXPECT_EQ(logprobs[i].at("top_logprobs").size(), 2u);
      }
    }
  } catch (const nlohmann::json::exception& e) {
    FAIL() << e.what() << " in: " << lines[0];
  }
}

// ---- Multi-byte characters: Qwen's byte-level BPE vocabulary -----------------------------

class QwenControlsTest : public ClusterSuite {
 protected:
  static void SetUpTestSuite() {
    ClusterOptions options;
    options.model = "qwen2-tiny-synth.gguf";
    options.num_kv_blocks = 64;
    StartSuiteCluster(options);
  }
};

// A stop string on a multi-byte character whose bytes the model generated
// in two tokens (the first one's message has empty text: it completed no
// character), alone and with the character before it: the text is cut
// right before it, as valid UTF-8, on both routes.
//
// With random weights a partial token is nearly always followed by one
// that does not complete it (U+FFFD); a whole character split over tokens
// is rare. A search of 55 short prompts x 400 greedy tokens found one:
// prompt "a", whose tokens 240 (bytes E8 95) and 241 (82 A8) give U+8542
// and a stray byte. The test takes the first such character of the run,
// so another split would do as well.
TEST_F(QwenControlsTest, StopStringOnACharacterSplitAcrossTokens) {
  const v1::GenerateRequest request = MakeRequest("a", 256, v1::ROUTE_LOCAL);
  const Reference ref = RunReference(cluster(), request);
  ASSERT_FALSE(ref.ids.empty());
  std::string character;  // the first split character
  for (size_t i = 0; i + 1 < ref.texts.size() && character.empty(); ++i) {
    if (!ref.texts[i].empty()) continue;
    // The next non-empty text starts with the character token i began.
    size_t m = i + 1;
    while (m < ref.texts.size() && ref.texts[m].empty()) ++m;
    if (m == ref.texts.size()) break;
    const unsigned char lead = static_cast<unsigned char>(ref.texts[m][0]);
    const std::string c = ref.texts[m].substr(0, Utf8Length(lead));
    if (lead >= 0x80 && c != "\xEF\xBF\xBD") character = c;  // not ASCII, not U+FFFD
  }
  if (character.empty()) {
    // The greedy path of random weights depends on the kernels' ISA class
    // (bit-exact within one): where it splits no character, stop on the
    // first multi-byte character instead (the matcher's byte splits are
    // covered by tests/router/stop_strings_test.cc).
    for (size_t i = 0; i < ref.full.size() && character.empty(); ++i) {
      const unsigned char lead = static_cast<unsigned char>(ref.full[i]);
      const std::string c = ref.full.substr(i, Utf8Length(lead));
      if (lead >= 0xC0 && c != "\xEF\xBF\xBD") character = c;
    }
    std::cerr << "no character split across tokens on this ISA: stopping on a multi-byte one\n";
  }
  ASSERT_FALSE(character.empty()) << "no multi-byte character in 256 tokens";
  ASSERT_TRUE(IsUtf8(ref.full));
  const size_t pos = ref.full.find(character);
  ASSERT_NE(pos, std::string::npos);
  std::vector<std::string> stops = {character};
  if (pos > 0) {
    size_t before = pos - 1;  // the character before: back to its lead byte
    while (before > 0 && (static_cast<unsigned char>(ref.full[before]) & 0xC0) == 0x80) --before;
    stops.push_back(ref.full.substr(before, pos - before) + character);
  }
  for (const std::string& stop : stops) {
    for (v1::RouteOverride route : kRoutes) {
      for (bool include : {false, true}) {
        SCOPED_TRACE(absl::StrCat(RouteName(route), " stop \"", stop, "\""));
        const std::optional<StopExpectation> e = ExpectStop(ref, stop, include);
        ASSERT_TRUE(e.has_value());
        EXPECT_TRUE(IsUtf8(e->text));
        EXPECT_TRUE(include ? e->text.ends_with(character) : !e->text.ends_with(character));
        v1::GenerateRequest stopping = WithStop(request, stop, include);
        stopping.set_route_override(route);
        const StreamResult r = RunGenerate(cluster().stub(), stopping);
        EXPECT_EQ(r.route, RouteName(route));
        const SampleResult& s = OnlySample(r);
        ExpectStopped(s, ref, *e, include);
        EXPECT_TRUE(IsUtf8(s.text));
        for (const StreamMessage& m : s.messages) EXPECT_TRUE(IsUtf8(m.text));
      }
    }
  }
}

// Every end-of-generation id of the model (llama.cpp's eog_ids in the
// golden file: EOS and the end-of-turn tokens) ends a sample without a
// stop_reason; ignore_eos lets it run to max_tokens; min_tokens masks it
// (the first min_tokens ids are then llama.cpp's greedy ids). Each id is
// made the argmax with a logit bias of 100; on both routes.
TEST_F(QwenControlsTest, EveryEndOfGenerationIdStopsUnlessIgnoredAndIsMaskedBeforeMinTokens) {
  const ModelGoldens goldens = ReadGoldens("qwen2-tiny-synth_greedy.json");
  ASSERT_GE(goldens.eog_ids.size(), 2u);
  ASSERT_FALSE(goldens.cases.empty());
  const ModelGolden& g = goldens.cases[0];
  constexpr uint32_t kMinTokens = 3;
  constexpr uint32_t kMaxTokens = 6;
  ASSERT_GE(g.strict_prefix_len, kMinTokens);
  const std::vector<int32_t> greedy(g.generated_ids.begin(), g.generated_ids.begin() + kMinTokens);
  for (int32_t eog : goldens.eog_ids) {
    for (v1::RouteOverride route : kRoutes) {
      SCOPED_TRACE(absl::StrCat("eog id ", eog, " ", RouteName(route)));
      v1::GenerateRequest request = MakeRequest(g.prompt, kMaxTokens, route);
      (*request.mutable_sampling()->mutable_logit_bias())[eog] = 100.0f;
      const SampleResult stopped = OnlySample(RunGenerate(cluster().stub(), request));
      EXPECT_THAT(stopped.token_ids, ElementsAreArray({eog}));
      EXPECT_EQ(stopped.finish_reason, v1::FINISH_STOP);
      EXPECT_EQ(stopped.stop_reason_messages, 0);
      EXPECT_EQ(stopped.text, "");

      v1::GenerateRequest ignoring = request;
      ignoring.set_ignore_eos(true);
      const SampleResult ignored = OnlySample(RunGenerate(cluster().stub(), ignoring));
      EXPECT_EQ(ignored.token_ids, std::vector<int32_t>(kMaxTokens, eog));
      EXPECT_EQ(ignored.finish_reason, v1::FINISH_LENGTH);

      v1::GenerateRequest masked = request;
      masked.set_min_tokens(kMinTokens);
      const SampleResult m = OnlySample(RunGenerate(cluster().stub(), masked));
      ASSERT_EQ(m.token_ids.size(), kMinTokens + 1);
      EXPECT_EQ(std::vector<int32_t>(m.token_ids.begin(), m.token_ids.begin() + kMinTokens),
                greedy);
      EXPECT_EQ(m.token_ids.back(), eog);
      EXPECT_EQ(m.finish_reason, v1::FINISH_STOP);
    }
  }
}

// ---- Preemption (recompute) with penalties ---------------------------------------------

using ControlsPreemptionTest = OwnClusterTest;

// Penalized, biased, min_p-filtered requests on a decode pool of 8 blocks
// of 16 tokens: each fits alone, together they force preemption; every
// request gives the ids it gives alone (the penalty state is rebuilt from
// prompt + generated tokens).
TEST_F(ControlsPreemptionTest, PenaltiesSurvivePreemption) {
  ClusterOptions options;
  options.num_kv_blocks = 8;
  options.block_size = 16;
  ASSERT_NO_FATAL_FAILURE(StartCluster(options));
  const char* goldens[] = {"once_upon_a_time", "the_little_dog", "lily_and_ben",
                           "once_upon_a_time", "the_little_dog", "lily_and_ben"};
  std::vector<v1::GenerateRequest> requests;
  for (size_t i = 0; i < 6; ++i) {
    const GoldenCase& g = Golden(goldens[i]);
    const uint32_t max_tokens = 128 - 16 - static_cast<uint32_t>(g.prompt_ids.size());
    requests.push_back(Penalized(g.prompt, max_tokens, kRoutes[i % 2], 500 + i, 261, 294));
  }
  std::vector<std::vector<int32_t>> alone;
  for (const v1::GenerateRequest& request : requests) {
    alone.push_back(OnlySample(RunGenerate(cluster().stub(), request)).token_ids);
    EXPECT_EQ(alone.back().size(), request.max_tokens());
  }
  absl::StatusOr<v1::WorkerStatus> d0 = cluster().DecodeStatus();
  ASSERT_TRUE(d0.ok()) << d0.status();
  EXPECT_EQ(d0->preemptions_total(), 0u) << "a request alone was preempted";

  const std::vector<StreamResult> together = RunConcurrently(cluster().stub(), requests);
  for (size_t i = 0; i < requests.size(); ++i) {
    ASSERT_TRUE(together[i].status.ok()) << i << ": " << together[i].status.error_message();
    EXPECT_EQ(together[i].route, RouteName(requests[i].route_override()));
    EXPECT_EQ(together[i].token_ids, alone[i]) << "request " << i << " (" << goldens[i] << ")";
  }
  absl::StatusOr<v1::WorkerStatus> d1 = cluster().DecodeStatus();
  ASSERT_TRUE(d1.ok()) << d1.status();
  EXPECT_GT(d1->preemptions_total(), 0u) << "the pool never ran out: nothing was preempted";
  v1::ClusterStatus last;
  EXPECT_TRUE(cluster().WaitForIdleWorkers(absl::Seconds(5), &last)) << last.DebugString();

  // n > 1 among them: each request alone fills at most the pool (n x
  // ceil((L + max_tokens - 1) / 16) blocks, no full prompt block to share
  // with L < 16), together they are preempted; every sample is as alone.
  struct Multi {
    const char* golden;
    uint32_t n;
    uint32_t max_tokens;
    v1::RouteOverride route;
  };
  const Multi multis[] = {{"once_upon_a_time", 2, 59, v1::ROUTE_LOCAL},
                          {"the_little_dog", 3, 27, v1::ROUTE_REMOTE},
                          {"lily_and_ben", 2, 52, v1::ROUTE_REMOTE},
                          {"the_little_dog", 1, 100, v1::ROUTE_LOCAL}};
  std::vector<v1::GenerateRequest> multi_requests;
  for (size_t i = 0; i < std::size(multis); ++i) {
    const GoldenCase& g = Golden(multis[i].golden);
    const int64_t blocks =
        (static_cast<int64_t>(g.prompt_ids.size()) + multis[i].max_tokens - 1 + 15) / 16 *
        multis[i].n;
    ASSERT_LE(blocks, 8) << multis[i].golden;
    v1::GenerateRequest request =
        Penalized(g.prompt, multis[i].max_tokens, multis[i].route, 900 + i, 261, 294);
    request.set_n(multis[i].n);
    multi_requests.push_back(request);
  }
  std::vector<StreamResult> multi_alone;
  for (const v1::GenerateRequest& request : multi_requests) {
    multi_alone.push_back(RunGenerate(cluster().stub(), request));
    ASSERT_TRUE(multi_alone.back().status.ok()) << multi_alone.back().status.error_message();
  }
  absl::StatusOr<v1::WorkerStatus> d2 = cluster().DecodeStatus();
  ASSERT_TRUE(d2.ok()) << d2.status();
  EXPECT_EQ(d2->preemptions_total(), d1->preemptions_total()) << "a request alone was preempted";
  const std::vector<StreamResult> multi_together =
      RunConcurrently(cluster().stub(), multi_requests);
  for (size_t i = 0; i < multi_requests.size(); ++i) {
    ASSERT_TRUE(multi_together[i].status.ok())
        << i << ": " << multi_together[i].status.error_message();
    ASSERT_EQ(multi_together[i].samples.size(), multis[i].n);
    ASSERT_EQ(multi_alone[i].samples.size(), multis[i].n);
    for (size_t s = 0; s < multis[i].n; ++s) {
      EXPECT_EQ(multi_together[i].samples[s].token_ids, multi_alone[i].samples[s].token_ids)
          << "request " << i << " (" << multis[i].golden << ") sample " << s;
      EXPECT_EQ(multi_together[i].samples[s].finish_messages, 1);
    }
  }
  absl::StatusOr<v1::WorkerStatus> d3 = cluster().DecodeStatus();
  ASSERT_TRUE(d3.ok()) << d3.status();
  EXPECT_GT(d3->preemptions_total(), d2->preemptions_total())
      << "the n > 1 requests were never preempted";
  EXPECT_TRUE(cluster().WaitForIdleWorkers(absl::Seconds(5), &last)) << last.DebugString();
}

// ---- n > 1 block sharing and admission --------------------------------------------------

// The integers in `text`.
std::set<int64_t> NumbersIn(const std::string& text) {
  std::set<int64_t> numbers;
  for (absl::string_view word : absl::StrSplit(text, absl::ByAnyChar(" ,;:()[]/=x"))) {
    int64_t n;
    if (absl::SimpleAtoi(word, &n)) numbers.insert(n);
  }
  return numbers;
}

using ControlsBlockSharingTest = OwnClusterTest;

// A 33-token prompt and 16 tokens: one sample needs S = ceil((33 + 16 -
// 1) / 16) = 3 blocks; n samples share the 2 full prompt blocks and need
// ceil((48 - 32) / 16) = 1 block each: n = 3 needs 2 + 3 = 5 < 3 S = 9.
// On a pool of 5 blocks n = 3 is served (both routes), and its sample 0 is
// the n = 1 stream; n = 4 needs 6 and is refused with RESOURCE_EXHAUSTED
// naming 6 and 5.
TEST_F(ControlsBlockSharingTest, ThreeSamplesFitOnlyBySharingPromptBlocks) {
  constexpr int32_t kBlock = 16;
  const GoldenCase& g = Golden("boundary_33tok");
  const int64_t prompt_len = static_cast<int64_t>(g.prompt_ids.size());
  ASSERT_EQ(prompt_len, 33);
  constexpr uint32_t kMaxTokens = 16;
  auto ceil_div = [](int64_t a, int64_t b) { return (a + b - 1) / b; };
  const int64_t single = ceil_div(prompt_len + kMaxTokens - 1, kBlock);
  const int64_t shared = prompt_len / kBlock;
  auto needed = [&](int64_t n) {
    return shared + n * ceil_div(prompt_len + kMaxTokens - 1 - kBlock * shared, kBlock);
  };
  const int64_t pool = needed(3);
  ASSERT_LT(pool, 3 * single);
  ASSERT_GT(needed(4), pool);
  ClusterOptions options;
  options.num_kv_blocks = static_cast<int32_t>(pool);
  options.block_size = kBlock;
  ASSERT_NO_FATAL_FAILURE(StartCluster(options));

  for (v1::RouteOverride route : kRoutes) {
    SCOPED_TRACE(RouteName(route));
    v1::GenerateRequest request = MakeRequest(g.prompt, kMaxTokens, route);
    SetSeededSampling(&request, 1.0f, 4321);
    const SampleResult single_run = OnlySample(RunGenerate(cluster().stub(), request));
    request.set_n(3);
    const StreamResult r = RunGenerate(cluster().stub(), request);
    ASSERT_TRUE(r.status.ok()) << r.status.error_code() << ": " << r.status.error_message();
    ASSERT_EQ(r.samples.size(), 3u);
    for (const SampleResult& s : r.samples) {
      EXPECT_EQ(s.finish_messages, 1);
      EXPECT_EQ(s.token_ids.size(), kMaxTokens);
    }
    EXPECT_EQ(r.samples[0].token_ids, single_run.token_ids);
    v1::ClusterStatus last;
    EXPECT_TRUE(cluster().WaitForIdleWorkers(absl::Seconds(5), &last)) << last.DebugString();
  }
  v1::GenerateRequest four = MakeRequest(g.prompt, kMaxTokens);
  SetSeededSampling(&four, 1.0f, 4321);
  four.set_n(4);
  const StreamResult refused = RunGenerate(cluster().stub(), four);
  EXPECT_EQ(refused.status.error_code(), grpc::StatusCode::RESOURCE_EXHAUSTED)
      << refused.status.error_code() << ": " << refused.status.error_message();
  EXPECT_TRUE(refused.token_ids.empty());
  const std::set<int64_t> numbers = NumbersIn(refused.status.error_message());
  EXPECT_EQ(numbers.count(needed(4)), 1u) << refused.status.error_message();
  EXPECT_EQ(numbers.count(pool), 1u) << refused.status.error_message();
  v1::ClusterStatus last;
  EXPECT_TRUE(cluster().WaitForIdleWorkers(absl::Seconds(5), &last)) << last.DebugString();
}

}  // namespace
}  // namespace tandem::testing
