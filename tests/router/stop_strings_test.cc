// Tests for router/stop_strings: the per-sample stop-string matcher. Exact
// expectations are worked out by hand; the randomized tests compare against
// a naive reference (every end position, every string) written below.
#include "router/stop_strings.h"

#include <algorithm>
#include <random>

#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace tandem::router {
namespace {

// Pushes every chunk (checked); returns the concatenated release (with
// Flush when nothing matched) and the stop index.
std::pair<std::string, int> PushAll(StopStringMatcher m, const std::vector<std::string>& chunks) {
  std::string out;
  for (const std::string& c : chunks) {
    StopPush p = m.Push(c);
    out += p.text;
    if (p.stopped()) return {out, p.stop_index};
  }
  out += m.Flush();
  return {out, -1};
}

TEST(StopStringsTest, StopSpanningThreePushes) {
  StopStringMatcher m({"STOP"}, false);
  StopPush p = m.Push("ab ST");
  EXPECT_EQ(p.text, "ab ");
  EXPECT_FALSE(p.stopped());
  EXPECT_EQ(m.held(), "ST");
  p = m.Push("O");
  EXPECT_EQ(p.text, "");
  EXPECT_EQ(m.held(), "STO");
  p = m.Push("Pxyz");
  EXPECT_EQ(p.text, "");
  EXPECT_EQ(p.stop_index, 0);
  EXPECT_TRUE(m.stopped());
  EXPECT_EQ(m.held(), "");
  EXPECT_EQ(m.Flush(), "");
}

TEST(StopStringsTest, MatchInsideOnePushCutsWhatFollows) {
  StopStringMatcher m({"END"}, false);
  StopPush p = m.Push("hello END world");
  EXPECT_EQ(p.text, "hello ");
  EXPECT_EQ(p.stop_index, 0);
  // Nothing after the match is ever released.
  EXPECT_EQ(m.Push("more END").text, "");
  EXPECT_EQ(m.Push("x", false).text, "");
  EXPECT_EQ(m.Flush(), "");
  EXPECT_EQ(m.stop_index(), 0);
}

TEST(StopStringsTest, EarliestCompletionWinsOverEarliestStartAndListOrder) {
  // "abcdef" starts first (at 0) but "cd" completes first (at byte 4).
  StopStringMatcher m({"abcdef", "cd"}, false);
  EXPECT_EQ(PushAll(m, {"abcdefg"}), std::make_pair(std::string("ab"), 1));
  StopStringMatcher split = m;
  StopPush p = split.Push("abc");
  EXPECT_EQ(p.text, "");
  EXPECT_EQ(split.held(), "abc");
  p = split.Push("defg");
  EXPECT_EQ(p.text, "ab");
  EXPECT_EQ(p.stop_index, 1);
  // The same end byte: the earlier start (the longer string) wins, whatever
  // the list order; identical strings: the lower index.
  EXPECT_EQ(PushAll(StopStringMatcher({"cd", "bcd"}, false), {"abcd"}),
            std::make_pair(std::string("a"), 1));
  EXPECT_EQ(PushAll(StopStringMatcher({"bcd", "cd"}, false), {"ab", "cd"}),
            std::make_pair(std::string("a"), 0));
  EXPECT_EQ(PushAll(StopStringMatcher({"x", "y", "x"}, false), {"abxx"}),
            std::make_pair(std::string("ab"), 0));
}

TEST(StopStringsTest, OverlappingPrefixes) {
  // After "abab" only the second "ab" can still start "abac".
  StopStringMatcher m({"abac"}, false);
  StopPush p = m.Push("abab");
  EXPECT_EQ(p.text, "ab");
  EXPECT_EQ(m.held(), "ab");
  p = m.Push("ac!");
  EXPECT_EQ(p.text, "");
  EXPECT_EQ(p.stop_index, 0);
  // "aaab" with stop "aab": the first 'a' is released when the third shows
  // it cannot start the match; the match then starts at byte 1.
  StopStringMatcher n({"aab"}, false);
  EXPECT_EQ(n.Push("a").text, "");
  EXPECT_EQ(n.Push("a").text, "");
  EXPECT_EQ(n.held(), "aa");
  EXPECT_EQ(n.Push("a").text, "a");
  EXPECT_EQ(n.held(), "aa");
  p = n.Push("b");
  EXPECT_EQ(p.text, "");
  EXPECT_TRUE(p.stopped());
}

TEST(StopStringsTest, HoldsBackOnlyAPendingPrefix) {
  // The longest stop has 5 bytes, but only a suffix that can still start a
  // stop is held, never more than 4 bytes.
  StopStringMatcher m({"hello", "help"}, false);
  EXPECT_EQ(m.Push("xyz").text, "xyz");
  EXPECT_EQ(m.held(), "");
  EXPECT_EQ(m.Push("x hel").text, "x ");
  EXPECT_EQ(m.held(), "hel");
  EXPECT_EQ(m.Push("d").text, "held");
  EXPECT_EQ(m.held(), "");
  EXPECT_EQ(m.Push("hell").text, "");
  EXPECT_EQ(m.held(), "hell");
  // "hellh": "hell" + 'h' can no longer be "hello"; only "h" stays.
  EXPECT_EQ(m.Push("h").text, "hell");
  EXPECT_EQ(m.held(), "h");
  StopPush p = m.Push("elp");
  EXPECT_EQ(p.text, "");
  EXPECT_EQ(p.stop_index, 1);
}

TEST(StopStringsTest, IncludeStopStringKeepsTheMatchAndHoldsNothing) {
  StopStringMatcher m({"END"}, true);
  StopPush p = m.Push("a EN");
  EXPECT_EQ(p.text, "a EN");
  EXPECT_EQ(m.held(), "");
  p = m.Push("Dxx");
  EXPECT_EQ(p.text, "D");
  EXPECT_EQ(p.stop_index, 0);
  EXPECT_EQ(PushAll(StopStringMatcher({"END"}, true), {"a END b"}),
            std::make_pair(std::string("a END"), 0));
  EXPECT_EQ(PushAll(StopStringMatcher({"END"}, true), {"a EN"}),
            std::make_pair(std::string("a EN"), -1));
}

TEST(StopStringsTest, MultiByteUtf8Stops) {
  // "日本" = E6 97 A5 E6 9C AC, pushed a character at a time as the
  // incremental decoder releases them.
  StopStringMatcher m({"日本"}, false);
  EXPECT_EQ(m.Push("今日").text, "今");
  EXPECT_EQ(m.held(), "日");
  StopPush p = m.Push("本語");
  EXPECT_EQ(p.text, "");
  EXPECT_EQ(p.stop_index, 0);
  // The matcher is byte-exact, so a split inside a character works too.
  StopStringMatcher e({"é"}, false);  // C3 A9
  EXPECT_EQ(e.Push("caf\xC3").text, "caf");
  EXPECT_EQ(e.held(), "\xC3");
  p = e.Push("\xA9!");
  EXPECT_EQ(p.text, "");
  EXPECT_TRUE(p.stopped());
  // No normalization: 'e' + U+0301 (combining acute) is not "é".
  EXPECT_EQ(PushAll(StopStringMatcher({"é"}, false), {"cafe\xCC\x81"}),
            std::make_pair(std::string("cafe\xCC\x81"), -1));
  // "本" alone after "日本" text elsewhere: the 3-byte prefix of "日本" is held
  // and released once "語" shows it is no match.
  StopStringMatcher j({"日本"}, false);
  EXPECT_EQ(j.Push("日").text, "");
  EXPECT_EQ(j.Push("語").text, "日語");
}

TEST(StopStringsTest, UncheckedTextIsReleasedAndNeverMatches) {
  StopStringMatcher m({"ab"}, false);
  EXPECT_EQ(m.Push("xa", /*check=*/false).text, "xa");
  EXPECT_EQ(m.held(), "");
  // 'a' was unchecked, so "ab" spanning the boundary is no match.
  StopPush p = m.Push("b", true);
  EXPECT_EQ(p.text, "b");
  EXPECT_FALSE(p.stopped());
  p = m.Push("ab", true);
  EXPECT_EQ(p.text, "");
  EXPECT_TRUE(p.stopped());
  // A whole stop string inside unchecked text is released as text.
  StopStringMatcher u({"ab"}, false);
  EXPECT_EQ(u.Push("cabc", false).text, "cabc");
  EXPECT_FALSE(u.stopped());
  // An unchecked push also releases what was held and resets the match.
  StopStringMatcher h({"ab"}, false);
  EXPECT_EQ(h.Push("xa").text, "x");
  EXPECT_EQ(h.held(), "a");
  EXPECT_EQ(h.Push("b", false).text, "ab");
  EXPECT_EQ(h.held(), "");
  EXPECT_FALSE(h.Push("b").stopped());
}

TEST(StopStringsTest, FlushWithoutAMatchReturnsTheHeldBytes) {
  StopStringMatcher m({"STOP"}, false);
  EXPECT_EQ(m.Push("xx ST").text, "xx ");
  EXPECT_EQ(m.Flush(), "ST");
  EXPECT_EQ(m.held(), "");
  EXPECT_FALSE(m.stopped());
  EXPECT_EQ(m.Flush(), "");
  // Flush forgets the partial match.
  EXPECT_EQ(m.Push("OP").text, "OP");
}

TEST(StopStringsTest, NoStopsReleasesEverything) {
  StopStringMatcher m({}, false);
  EXPECT_EQ(m.Push("abc").text, "abc");
  EXPECT_EQ(m.Flush(), "");
}

// ---- Randomized: against a naive reference ----

struct Expected {
  std::string released;  // everything released (Flush included when no match)
  int stop_index = -1;
};

// The whole-text result by definition: the first end position at which any
// stop ends; of those ending there, the longest, then the lowest index.
Expected Reference(const std::string& text, const std::vector<std::string>& stops,
                   bool include) {
  for (size_t end = 1; end <= text.size(); ++end) {
    int best = -1;
    for (size_t i = 0; i < stops.size(); ++i) {
      const std::string& s = stops[i];
      if (s.size() > end || text.compare(end - s.size(), s.size(), s) != 0) continue;
      if (best < 0 || s.size() > stops[static_cast<size_t>(best)].size()) {
        best = static_cast<int>(i);
      }
    }
    if (best >= 0) {
      const size_t start = end - stops[static_cast<size_t>(best)].size();
      return {text.substr(0, include ? end : start), best};
    }
  }
  return {text, -1};
}

// The longest suffix of `text` that is a proper prefix of some stop.
std::string PendingPrefix(const std::string& text, const std::vector<std::string>& stops) {
  for (size_t len = text.size(); len > 0; --len) {
    const std::string suffix = text.substr(text.size() - len);
    for (const std::string& s : stops) {
      if (s.size() > len && s.compare(0, len, suffix) == 0) return suffix;
    }
  }
  return "";
}

std::string RandomText(std::mt19937& rng, size_t max_len, const std::string& alphabet) {
  std::uniform_int_distribution<size_t> len(0, max_len);
  std::uniform_int_distribution<size_t> pick(0, alphabet.size() - 1);
  std::string s(len(rng), ' ');
  for (char& c : s) c = alphabet[pick(rng)];
  return s;
}

// Pushes `text` cut at `cuts` (ascending), checking after every push that
// the held bytes are exactly the pending prefix of the unreleased text
// (never more than longest - 1 bytes) and that released + held is
// everything pushed.
Expected RunChunked(const std::string& text, const std::vector<size_t>& cuts,
                    const std::vector<std::string>& stops, bool include) {
  StopStringMatcher m(stops, include);
  size_t longest = 0;
  for (const std::string& s : stops) longest = std::max(longest, s.size());
  Expected got;
  size_t begin = 0;
  for (size_t k = 0; k <= cuts.size(); ++k) {
    const size_t end = k < cuts.size() ? cuts[k] : text.size();
    StopPush p = m.Push(std::string_view(text).substr(begin, end - begin));
    got.released += p.text;
    begin = end;
    if (p.stopped()) {
      got.stop_index = p.stop_index;
      return got;
    }
    const std::string pushed = text.substr(0, end);
    if (include) {
      EXPECT_EQ(m.held(), "");
      EXPECT_EQ(got.released, pushed);
    } else {
      EXPECT_EQ(got.released + m.held(), pushed);
      EXPECT_EQ(m.held(), PendingPrefix(pushed, stops)) << "text '" << pushed << "'";
      EXPECT_LE(m.held().size(), longest - 1);
    }
  }
  got.released += m.Flush();
  return got;
}

TEST(StopStringsTest, EverySplitPositionGivesTheWholeTextResult) {
  std::mt19937 rng(1);
  for (int trial = 0; trial < 300; ++trial) {
    std::vector<std::string> stops;
    const int n = 1 + static_cast<int>(rng() % 3);
    for (int i = 0; i < n; ++i) stops.push_back(RandomText(rng, 4, "ab") + "a");
    const std::string text = RandomText(rng, 12, "abc");
    for (bool include : {false, true}) {
      const Expected want = Reference(text, stops, include);
      const Expected whole = RunChunked(text, {}, stops, include);
      ASSERT_EQ(whole.released, want.released) << text;
      ASSERT_EQ(whole.stop_index, want.stop_index) << text;
      for (size_t cut = 0; cut <= text.size(); ++cut) {
        const Expected got = RunChunked(text, {cut}, stops, include);
        ASSERT_EQ(got.released, want.released) << text << " cut " << cut;
        ASSERT_EQ(got.stop_index, want.stop_index) << text << " cut " << cut;
      }
    }
  }
}

TEST(StopStringsTest, RandomChunkingsGiveTheWholeTextResult) {
  std::mt19937 rng(2);
  int matched = 0;
  for (int trial = 0; trial < 2000; ++trial) {
    std::vector<std::string> stops;
    const int n = 1 + static_cast<int>(rng() % 4);
    for (int i = 0; i < n; ++i) {
      stops.push_back(std::string(1, 'b').append(RandomText(rng, 5, "abc")));
    }
    const std::string text = RandomText(rng, 40, "abc");
    std::vector<size_t> cuts;
    for (size_t i = 1; i < text.size(); ++i) {
      if (rng() % 3 == 0) cuts.push_back(i);
    }
    for (bool include : {false, true}) {
      const Expected want = Reference(text, stops, include);
      const Expected got = RunChunked(text, cuts, stops, include);
      ASSERT_EQ(got.released, want.released) << text;
      ASSERT_EQ(got.stop_index, want.stop_index) << text;
      matched += want.stop_index >= 0;
    }
  }
  // Both outcomes are exercised.
  EXPECT_GT(matched, 500);
  EXPECT_LT(matched, 3500);
}

}  // namespace
}  // namespace tandem::router
