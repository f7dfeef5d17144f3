// SampleFromView(BuildSamplingView(row)) against a reference sampler, written
// here, that follows SampleFromView's contract (sampler.h) with the whole
// vocabulary sorted: same ids, bit-identical logprobs.
#include "engine/sampling/sampling_view.h"

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <numeric>
#include <random>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "engine/sampling/logits_processor.h"
#include "engine/sampling/sampler.h"
#include "gtest/gtest.h"

namespace tandem::sampling {
namespace {

constexpr float kInf = std::numeric_limits<float>::infinity();
constexpr float kNaN = std::numeric_limits<float>::quiet_NaN();

bool SameBits(float a, float b) { return std::memcmp(&a, &b, sizeof a) == 0; }
bool SameBits(double a, double b) { return std::memcmp(&a, &b, sizeof a) == 0; }

// The candidate order, written out again: larger logit first (NaN as
// -inf), then lower id.
bool Before(const std::vector<float>& l, int32_t a, int32_t b) {
  const float ka = std::isnan(l[a]) ? -kInf : l[a];
  const float kb = std::isnan(l[b]) ? -kInf : l[b];
  return ka > kb || (ka == kb && a < b);
}

std::vector<int32_t> SortedIds(const std::vector<float>& l) {
  std::vector<int32_t> order(l.size());
  std::iota(order.begin(), order.end(), 0);
  std::sort(order.begin(), order.end(),
            [&l](int32_t a, int32_t b) { return Before(l, a, b); });
  return order;
}

// Everything the reference needs about one (row, processors): the whole
// vocabulary sorted, p over it, and the sums, computed once and shared by
// every (min_p, top_k, top_p) combination.
struct Reference {
  std::vector<float> raw;
  std::vector<float> processed;
  std::vector<int32_t> order;  // whole vocabulary, candidate order of processed
  std::vector<double> p;       // p[j] = exp(l'[order[j]] - l'[order[0]])
  double normaliser = 0;       // index order, whole vocabulary
  double raw_max = 0;
  double raw_log_sum = 0;
};

// `processing`: the options' processors (temperature, penalties, biases,
// min_tokens mask) over `history`; its draw fields are ignored.
void Prepare(const std::vector<float>& raw, const SamplingOptions& processing,
             const TokenHistory& history, Reference* ref) {
  ref->raw = raw;
  ref->processed = raw;
  ApplyLogitsProcessors(processing, history, ref->processed);
  ref->order = SortedIds(ref->processed);
  const double l0 = ref->processed[ref->order[0]];
  ref->p.resize(raw.size());
  for (size_t j = 0; j < raw.size(); ++j) {
    ref->p[j] = std::exp(static_cast<double>(ref->processed[ref->order[j]]) - l0);
  }
  ref->normaliser = 0;
  for (float l : ref->processed) ref->normaliser += std::exp(static_cast<double>(l) - l0);
  int32_t raw_first = 0;
  for (int32_t i = 1; i < static_cast<int32_t>(raw.size()); ++i) {
    if (Before(raw, i, raw_first)) raw_first = i;
  }
  ref->raw_max = raw[raw_first];
  double sum = 0;
  for (float l : raw) sum += std::exp(static_cast<double>(l) - ref->raw_max);
  ref->raw_log_sum = std::log(sum);
}

void Prepare(const std::vector<float>& raw, float temperature, Reference* ref) {
  SamplingOptions o;
  o.temperature = temperature;
  Prepare(raw, o, TokenHistory{}, ref);
}

float RawLogprob(const Reference& ref, int32_t id) {
  return static_cast<float>(static_cast<double>(ref.raw[id]) - ref.raw_max - ref.raw_log_sum);
}

// The contract of SampleFromView over the whole sorted vocabulary.
SampledToken ReferenceSample(const Reference& ref, const SamplingOptions& o,
                             uint32_t output_index) {
  const size_t vocab = ref.order.size();
  if (o.temperature == 0.0f) return {ref.order[0], RawLogprob(ref, ref.order[0]), {}};
  // min_p first: every id with p >= min_p (a prefix of the order, cut at
  // the first that fails), then top_k of those.
  size_t kept = vocab;
  if (o.min_p > 0.0f) {
    kept = 1;
    while (kept < vocab && ref.p[kept] >= static_cast<double>(o.min_p)) ++kept;
  }
  if (o.top_k > 0) kept = std::min(static_cast<size_t>(o.top_k), kept);
  double total = ref.normaliser;
  if (o.top_k > 0 || o.min_p > 0.0f) {
    total = 0;
    for (size_t j = 0; j < kept; ++j) total += ref.p[j];
  }
  if (o.top_p < 1.0f) {
    const double target = static_cast<double>(o.top_p) * total;
    double cumulative = 0;
    size_t n = 0;
    while (n < kept) {
      cumulative += ref.p[n++];
      if (cumulative >= target) break;
    }
    kept = n;
  }
  double kept_mass = 0;
  for (size_t j = 0; j < kept; ++j) kept_mass += ref.p[j];
  const double threshold = UniformDraw(o.seed, output_index) * kept_mass;
  size_t chosen = kept - 1;
  double cumulative = 0;
  for (size_t j = 0; j < kept; ++j) {
    cumulative += ref.p[j];
    if (cumulative > threshold) {
      chosen = j;
      break;
    }
  }
  return {ref.order[chosen], RawLogprob(ref, ref.order[chosen]), {}};
}

// Random rows, cycling through shapes that stress the view: spread and
// peaked logits, many ties, flat rows (the nucleus needs more than 64
// candidates), one dominant logit, -inf entries (some rows with fewer
// finite entries than 64), rows of equal logits and -inf whose masses are
// whole numbers (top_p lands exactly on cumulative-mass edges), NaNs.
std::vector<float> RandomRow(size_t vocab, uint64_t row, std::mt19937_64& rng) {
  std::vector<float> l(vocab);
  std::normal_distribution<float> normal(0.0f, 1.0f);
  std::uniform_int_distribution<size_t> any_id(0, vocab - 1);
  switch (row % 10) {
    case 0:
      for (float& x : l) x = normal(rng);
      break;
    case 1:
      for (float& x : l) x = 4.0f * normal(rng);
      break;
    case 2: {  // few distinct values: many ties, and -0 ties with +0
      std::uniform_int_distribution<int> level(-2, 2);
      for (float& x : l) x = 0.75f * static_cast<float>(level(rng));
      for (size_t i = 0; i < vocab; i += 2) l[i] = l[i] == 0.0f ? -0.0f : l[i];
      break;
    }
    case 3:
      std::fill(l.begin(), l.end(), 1.5f);
      break;
    case 4:
      for (float& x : l) x = 0.02f * normal(rng);
      break;
    case 5:
      for (float& x : l) x = normal(rng);
      l[any_id(rng)] = 25.0f;
      break;
    case 6: {
      std::bernoulli_distribution drop(0.3);
      for (float& x : l) x = drop(rng) ? -kInf : 2.0f * normal(rng);
      break;
    }
    case 7: {  // a handful of finite entries, the rest -inf
      std::fill(l.begin(), l.end(), -kInf);
      std::uniform_int_distribution<int> n(1, 12);
      for (int i = n(rng); i > 0; --i) l[any_id(rng)] = normal(rng);
      break;
    }
    case 8: {  // m equal logits, rest -inf: masses are whole numbers
      std::fill(l.begin(), l.end(), -kInf);
      std::uniform_int_distribution<size_t> m(1, std::min<size_t>(vocab, 300));
      for (size_t i = m(rng); i > 0; --i) l[any_id(rng)] = -3.0f;
      break;
    }
    case 9: {
      for (float& x : l) x = normal(rng);
      std::uniform_int_distribution<int> n(0, 3);
      for (int i = n(rng); i > 0; --i) l[any_id(rng)] = kNaN;
      break;
    }
  }
  return l;
}

// The first K ids of the order, as the view must hold them.
void ExpectViewMatches(const Reference& ref, const SamplingView& view, const SamplingOptions& o,
                       int* failures) {
  const size_t vocab = ref.order.size();
  const size_t n = view.candidates.size();
  bool ok = n >= 1 && n <= vocab && view.complete == (n == vocab) &&
            SameBits(view.raw_max, ref.raw_max) && SameBits(view.raw_log_sum, ref.raw_log_sum);
  // Greedy: the first id only; otherwise max(top_k, 64) before widening.
  const size_t base_k =
      o.temperature == 0.0f
          ? 1
          : std::min(vocab, std::max<size_t>(kMinViewCandidates, o.top_k > 0 ? o.top_k : 0));
  if (o.top_k > 0 || o.temperature == 0.0f) {
    ok = ok && n == base_k && view.normaliser == 0.0;
  } else if (o.min_p > 0.0f) {
    // Widening: 64, 256, 1024, ... (capped at vocab) until the last
    // candidate's p is below min_p; no normaliser.
    size_t want = base_k;
    while (want < vocab && ref.p[want - 1] >= static_cast<double>(o.min_p)) {
      want = std::min(4 * want, vocab);
    }
    ok = ok && view.normaliser == 0.0 && n == want;
  } else {
    // Widening: 64, 256, 1024, ... (capped at vocab) until the mass in
    // candidate order reaches top_p * normaliser; everything for top_p 1.
    size_t want = o.top_p == 1.0f ? vocab : base_k;
    double mass = 0;
    size_t summed = 0;
    while (want < vocab) {
      for (; summed < want; ++summed) mass += ref.p[summed];
      if (mass >= static_cast<double>(o.top_p) * ref.normaliser) break;
      want = std::min(4 * want, vocab);
    }
    ok = ok && SameBits(view.normaliser, ref.normaliser) && n == want;
  }
  for (size_t j = 0; ok && j < n; ++j) {
    const Candidate& c = view.candidates[j];
    ok = c.id == ref.order[j] && SameBits(c.logit, ref.processed[c.id]) &&
         SameBits(c.raw_logit, ref.raw[c.id]);
  }
  if (!ok && ++*failures <= 5) {
    ADD_FAILURE() << "view differs: T=" << o.temperature << " min_p=" << o.min_p
                  << " top_k=" << o.top_k << " top_p=" << o.top_p << " candidates=" << n
                  << " vocab=" << vocab;
  }
}

struct SweepParam {
  size_t vocab;
  float temperature;
  int rows;
};

class SamplingViewSweepTest : public ::testing::TestWithParam<SweepParam> {};

// The processors of one sweep row: every third row penalises a random
// history (repetition, frequency, presence), biases two ids and, every
// sixth, masks a few ids under min_tokens; the others run temperature
// only. Fills `prompt` and `generated` (which `history` then views).
SamplingOptions RowProcessors(size_t vocab, uint64_t row, float temperature,
                              std::mt19937_64& rng, std::vector<int32_t>* prompt,
                              std::vector<int32_t>* generated) {
  SamplingOptions o;
  o.temperature = temperature;
  prompt->clear();
  generated->clear();
  if (row % 3 != 2) return o;
  // Ids from a small range, so that ids repeat.
  const int32_t last_id = static_cast<int32_t>(std::min<size_t>(vocab, 40) - 1);
  std::uniform_int_distribution<int32_t> id(0, last_id);
  for (int i = 0; i < 20; ++i) prompt->push_back(id(rng));
  for (int i = 0; i < 10; ++i) generated->push_back(id(rng));
  o.repetition_penalty = 1.3f;
  o.frequency_penalty = 0.4f;
  o.presence_penalty = -0.2f;
  o.logit_bias = {{1, 3.0f}, {static_cast<int32_t>(vocab) - 1, -2.5f}};
  if (row % 6 == 5) {
    o.min_tokens = 11;  // 10 generated: the mask applies
    o.min_tokens_masked_ids = {0, 2, 7};
  }
  return o;
}

// `rows` random rows per (min_p, top_k, top_p) combination at this vocab
// and temperature; every combination sees the same rows.
TEST_P(SamplingViewSweepTest, MatchesFullReferenceSampler) {
  const auto [vocab, temperature, rows] = GetParam();
  const int32_t v = static_cast<int32_t>(vocab);
  const float min_ps[] = {0.0f, 0.05f, 0.3f};
  const int32_t top_ks[] = {0, 1, 5, 64, 100, v + 3};
  const float top_ps[] = {1.0f, 0.95f, 0.5f, 1e-6f};
  std::mt19937_64 rng(vocab * 1000003u + static_cast<uint64_t>(temperature * 1000));
  Reference ref;
  SamplingView view;
  std::vector<float> scratch;
  std::vector<int32_t> prompt, generated;
  int failures = 0, widened = 0, min_p_widened = 0, min_p_partial = 0;
  for (uint64_t row = 0; row < static_cast<uint64_t>(rows); ++row) {
    const std::vector<float> raw = RandomRow(vocab, row, rng);
    const SamplingOptions processing =
        RowProcessors(vocab, row, temperature, rng, &prompt, &generated);
    const TokenHistory history{prompt, generated};
    Prepare(raw, processing, history, &ref);
    for (float min_p : min_ps) {
      for (int32_t top_k : top_ks) {
        for (float top_p : top_ps) {
          SamplingOptions o = processing;
          o.min_p = min_p;
          o.top_k = top_k;
          o.top_p = top_p;
          o.seed = rng();
          const uint32_t index = static_cast<uint32_t>(rng() % 4096);
          ASSERT_TRUE(Validate(o, v).ok());
          BuildSamplingView(raw, o, history, &view, &scratch);
          ExpectViewMatches(ref, view, o, &failures);
          const bool widened_view = view.candidates.size() > kMinViewCandidates && top_k <= 0;
          widened += widened_view && min_p == 0.0f && top_p < 1.0f;
          min_p_widened += widened_view && min_p > 0.0f;
          min_p_partial += min_p > 0.0f && top_k <= 0 && top_p == 1.0f && !view.complete;
          const SampledToken got = SampleFromView(view, o, index);
          const SampledToken want = ReferenceSample(ref, o, index);
          if ((got.token_id != want.token_id || !SameBits(got.logprob, want.logprob)) &&
              ++failures <= 5) {
            ADD_FAILURE() << "row " << row << " (shape " << row % 10 << ") T=" << temperature
                          << " min_p=" << min_p << " top_k=" << top_k << " top_p=" << top_p
                          << ": got " << got.token_id << " " << got.logprob << ", want "
                          << want.token_id << " " << want.logprob;
          }
        }
      }
    }
  }
  EXPECT_EQ(failures, 0);
  // The flat shapes must have exercised widening, for top_p and for min_p,
  // and peaked ones min_p views short of the vocabulary at top_p 1.
  if (temperature > 0.0f) {
    EXPECT_GT(widened, 0);
    EXPECT_GT(min_p_widened, 0);
    EXPECT_GT(min_p_partial, 0);
  }
}

std::string SweepName(const ::testing::TestParamInfo<SweepParam>& info) {
  const long tenths = std::lround(info.param.temperature * 10);  // 0.3 -> "T0_3"
  return absl::StrCat("V", info.param.vocab, "_T", tenths / 10, "_", tenths % 10);
}

// 10,000 rows per combination at vocab 512 (the view's selection always
// radix-sorts), 4,000 at 2500 (the first 64 come from the bounded heap and
// widening radix-sorts; its rows cost 5x as much).
INSTANTIATE_TEST_SUITE_P(Vocab, SamplingViewSweepTest,
                         ::testing::Values(SweepParam{512, 0.0f, 10000},
                                           SweepParam{512, 0.3f, 10000},
                                           SweepParam{512, 1.0f, 10000},
                                           SweepParam{512, 2.5f, 10000},
                                           SweepParam{2500, 0.0f, 4000},
                                           SweepParam{2500, 0.3f, 4000},
                                           SweepParam{2500, 1.0f, 4000},
                                           SweepParam{2500, 2.5f, 4000}),
                         SweepName);

// A vocab large enough for the bounded-heap path (first selection and the
// first widening), fewer rows.
INSTANTIATE_TEST_SUITE_P(HeapPath, SamplingViewSweepTest,
                         ::testing::Values(SweepParam{20000, 0.0f, 100},
                                           SweepParam{20000, 0.3f, 100},
                                           SweepParam{20000, 1.0f, 100},
                                           SweepParam{20000, 2.5f, 100}),
                         SweepName);

// The definition Sample used before the view: argmax by first strictly
// greater (lowest id on ties), log-softmax in double in index order.
TEST(SamplingViewTest, GreedyEqualsOldDefinition) {
  std::mt19937_64 rng(11);
  for (uint64_t row = 0; row < 2000; ++row) {
    std::vector<float> l = RandomRow(700, row, rng);
    if (row % 10 == 9) continue;  // NaN rows: the old argmax had no defined order
    int32_t best = 0;
    for (size_t i = 1; i < l.size(); ++i) {
      if (l[i] > l[best]) best = static_cast<int32_t>(i);
    }
    const double max = l[best];
    double sum = 0;
    for (float x : l) sum += std::exp(static_cast<double>(x) - max);
    const float logprob = static_cast<float>(static_cast<double>(l[best]) - max - std::log(sum));

    SamplingOptions o;
    o.top_k = static_cast<int32_t>(row % 7);  // ignored by greedy
    o.top_p = row % 2 ? 1.0f : 0.5f;
    const SampledToken t = Sample(l, o, static_cast<uint32_t>(row));
    ASSERT_EQ(t.token_id, best) << row;
    ASSERT_TRUE(SameBits(t.logprob, logprob)) << row << ": " << t.logprob << " vs " << logprob;
  }
}

TEST(SamplingViewTest, GreedyViewHasReferenceRawStats) {
  std::mt19937_64 rng(5);
  SamplingView view;
  for (uint64_t row = 0; row < 200; ++row) {
    const std::vector<float> l = RandomRow(1000, row, rng);
    Reference ref;
    Prepare(l, 0.0f, &ref);
    BuildSamplingView(l, SamplingOptions{}, {}, &view);
    EXPECT_TRUE(SameBits(view.raw_max, ref.raw_max)) << row;
    EXPECT_TRUE(SameBits(view.raw_log_sum, ref.raw_log_sum)) << row;
    EXPECT_EQ(view.normaliser, 0.0);
    ASSERT_EQ(view.candidates.size(), 1u);  // greedy draws nothing
    EXPECT_FALSE(view.complete);
    EXPECT_EQ(view.candidates[0].id, ref.order[0]);
    EXPECT_TRUE(view.raw_top.empty());
  }
}

TEST(SamplingViewTest, RawTopMatchesSortedReference) {
  std::mt19937_64 rng(9);
  SamplingView view;
  for (uint64_t row = 0; row < 500; ++row) {
    const std::vector<float> l = RandomRow(800, row, rng);
    Reference ref;
    Prepare(l, 0.0f, &ref);
    const std::vector<int32_t> raw_order = SortedIds(l);
    SamplingOptions o;
    o.temperature = row % 3 == 0 ? 0.0f : 0.7f;  // raw_top ignores the processors
    o.top_k = row % 4 == 1 ? 3 : 0;
    o.top_logprobs = 5;
    o.seed = row;
    BuildSamplingView(l, o, {}, &view);
    ASSERT_EQ(view.raw_top.size(), 5u);
    for (size_t j = 0; j < 5; ++j) {
      EXPECT_EQ(view.raw_top[j].id, raw_order[j]) << row << " " << j;
      EXPECT_TRUE(SameBits(view.raw_top[j].logprob, RawLogprob(ref, raw_order[j])))
          << row << " " << j;
    }
    const SampledToken t = SampleFromView(view, o, 0);
    ASSERT_EQ(t.top_logprobs.size(), 5u);
    EXPECT_EQ(t.top_logprobs[0].id, raw_order[0]);
  }
}

TEST(SamplingViewTest, RawTopCappedAtVocab) {
  const std::vector<float> l = {0.5f, 2.0f, 2.0f};
  SamplingOptions o;
  o.top_logprobs = 20;
  const SampledToken t = Sample(l, o, 0);
  ASSERT_EQ(t.top_logprobs.size(), 3u);
  EXPECT_EQ(t.top_logprobs[0].id, 1);
  EXPECT_EQ(t.top_logprobs[1].id, 2);
  EXPECT_EQ(t.top_logprobs[2].id, 0);
  EXPECT_EQ(t.top_logprobs[0].logprob, t.logprob);
  EXPECT_NEAR(t.top_logprobs[2].logprob,
              0.5 - std::log(std::exp(0.5) + 2 * std::exp(2.0)), 1e-6);
}

// top_p 0.3 of 3000 equal logits needs 900 candidates: 64 -> 256 -> 1024.
// top_p 0.95 needs 2850: the view widens to the whole vocabulary.
TEST(SamplingViewTest, FlatRowWidensByFour) {
  const std::vector<float> l(3000, 0.25f);
  SamplingOptions o;
  o.temperature = 1.0f;
  o.top_p = 0.3f;
  SamplingView view;
  BuildSamplingView(l, o, {}, &view);
  EXPECT_EQ(view.candidates.size(), 1024u);
  EXPECT_FALSE(view.complete);
  EXPECT_EQ(view.normaliser, 3000.0);
  o.top_p = 0.95f;
  BuildSamplingView(l, o, {}, &view);
  EXPECT_EQ(view.candidates.size(), 3000u);
  EXPECT_TRUE(view.complete);
  for (size_t j = 0; j < 3000; ++j) ASSERT_EQ(view.candidates[j].id, static_cast<int32_t>(j));
}

TEST(SamplingViewTest, CandidateCountFollowsTopK) {
  std::vector<float> l(1000);
  for (size_t i = 0; i < l.size(); ++i) l[i] = std::sin(static_cast<float>(i));
  SamplingView view;
  SamplingOptions o;
  o.temperature = 0.8f;
  o.top_k = 5;
  BuildSamplingView(l, o, {}, &view);
  EXPECT_EQ(view.candidates.size(), 64u);
  o.top_k = 300;
  BuildSamplingView(l, o, {}, &view);
  EXPECT_EQ(view.candidates.size(), 300u);
  o.top_k = 5000;
  BuildSamplingView(l, o, {}, &view);
  EXPECT_EQ(view.candidates.size(), 1000u);
  EXPECT_TRUE(view.complete);
  o.top_k = 0;  // top_p == 1: every id is kept
  BuildSamplingView(l, o, {}, &view);
  EXPECT_TRUE(view.complete);
  // Greedy: the first id only, whatever top_k says.
  o.temperature = 0.0f;
  o.top_k = 300;
  BuildSamplingView(l, o, {}, &view);
  ASSERT_EQ(view.candidates.size(), 1u);
  EXPECT_FALSE(view.complete);
  // Vocab below 64: always complete.
  o.temperature = 0.5f;
  o.top_k = 0;
  o.top_p = 0.9f;
  BuildSamplingView(std::vector<float>{1.0f, 3.0f, 2.0f}, o, {}, &view);
  ASSERT_EQ(view.candidates.size(), 3u);
  EXPECT_TRUE(view.complete);
  EXPECT_EQ(view.candidates[0].id, 1);
  EXPECT_EQ(view.candidates[1].id, 2);
  EXPECT_EQ(view.candidates[2].id, 0);
}

// min_p with top_p 1 keeps only the survivors, so a peaked row needs no
// more than the first 64 candidates (before min_p the whole vocabulary).
TEST(SamplingViewTest, MinPViewOfPeakedRowIsNotComplete) {
  std::vector<float> l(5000);
  for (size_t i = 0; i < l.size(); ++i) l[i] = std::sin(static_cast<float>(i));
  l[123] = 12.0f;  // every other p is below exp(1 - 12) < 2e-5
  SamplingOptions o;
  o.temperature = 1.0f;
  o.min_p = 0.01f;
  SamplingView view;
  BuildSamplingView(l, o, {}, &view);
  EXPECT_EQ(view.candidates.size(), kMinViewCandidates);
  EXPECT_FALSE(view.complete);
  EXPECT_EQ(view.normaliser, 0.0);
  EXPECT_EQ(view.candidates[0].id, 123);
  for (uint32_t i = 0; i < 50; ++i) EXPECT_EQ(SampleFromView(view, o, i).token_id, 123);
  o.min_p = 0.0f;
  BuildSamplingView(l, o, {}, &view);
  EXPECT_TRUE(view.complete);
}

// 100 ids at logit 0 and the rest at -10 (p = e^-10 < 0.01): with min_p
// 0.01 the 64th candidate survives, so the view widens to 256, whose last
// does not; draws take only the 100.
TEST(SamplingViewTest, MinPWidensUntilTheLastCandidateFails) {
  std::vector<float> l(3000, -10.0f);
  for (size_t i = 0; i < 100; ++i) l[i * 29] = 0.0f;
  SamplingOptions o;
  o.temperature = 1.0f;
  o.min_p = 0.01f;
  SamplingView view;
  BuildSamplingView(l, o, {}, &view);
  EXPECT_EQ(view.candidates.size(), 256u);
  EXPECT_FALSE(view.complete);
  std::vector<bool> drawn(l.size(), false);
  for (uint32_t i = 0; i < 2000; ++i) {
    const int32_t id = SampleFromView(view, o, i).token_id;
    ASSERT_EQ(id % 29, 0) << id;
    ASSERT_LT(id, 29 * 100) << id;
    drawn[static_cast<size_t>(id)] = true;
  }
  EXPECT_EQ(std::count(drawn.begin(), drawn.end(), true), 100);
  // top_k caps the survivors; the view is then max(top_k, 64) as before.
  o.top_k = 10;
  BuildSamplingView(l, o, {}, &view);
  EXPECT_EQ(view.candidates.size(), kMinViewCandidates);
  for (uint32_t i = 0; i < 200; ++i) {
    EXPECT_LT(SampleFromView(view, o, i).token_id, 29 * 10);
  }
  // Every id survives a flat row: the view widens to the vocabulary.
  o.top_k = 0;
  o.min_p = 0.5f;
  BuildSamplingView(std::vector<float>(3000, 0.25f), o, {}, &view);
  EXPECT_TRUE(view.complete);
}

// The view of a row with penalties holds the processed logits of
// ApplyLogitsProcessors and the raw ones, and greedy takes the processed
// argmax even at temperature 0 (no identity shortcut).
TEST(SamplingViewTest, ViewCarriesProcessedAndRawLogits) {
  const std::vector<float> l = {4.0f, 3.0f, -1.0f, 0.5f};
  const std::vector<int32_t> prompt = {0, 2};
  const std::vector<int32_t> generated = {3, 3};
  SamplingOptions o;
  o.repetition_penalty = 2.0f;  // 4 -> 2, -1 -> -2, 0.5 -> 0.25
  o.frequency_penalty = 0.5f;   // id 3: 0.25 - 0.5 * 2 = -0.75
  o.logit_bias = {{1, -0.5f}};  // 3 -> 2.5
  SamplingView view;
  BuildSamplingView(l, o, TokenHistory{prompt, generated}, &view);
  ASSERT_EQ(view.candidates.size(), 1u);
  EXPECT_EQ(view.candidates[0].id, 1);
  EXPECT_EQ(view.candidates[0].logit, 2.5f);
  EXPECT_EQ(view.candidates[0].raw_logit, 3.0f);
  EXPECT_EQ(view.raw_max, 4.0);
  o.temperature = 0.5f;
  o.top_k = 4;
  BuildSamplingView(l, o, TokenHistory{prompt, generated}, &view);
  ASSERT_EQ(view.candidates.size(), 4u);
  const int32_t ids[] = {1, 0, 3, 2};
  const float logits[] = {5.0f, 4.0f, -1.5f, -4.0f};
  for (size_t j = 0; j < 4; ++j) {
    EXPECT_EQ(view.candidates[j].id, ids[j]) << j;
    EXPECT_EQ(view.candidates[j].logit, logits[j]) << j;
    EXPECT_EQ(view.candidates[j].raw_logit, l[static_cast<size_t>(ids[j])]) << j;
  }
}

// With a reused view and scratch, a second build of the same shape finds
// every buffer large enough and allocates nothing.
TEST(SamplingViewTest, ReusedViewAndScratchKeepTheirBuffers) {
  std::mt19937_64 rng(3);
  SamplingOptions o;
  o.temperature = 1.0f;
  o.top_p = 0.9f;
  o.top_logprobs = 4;
  SamplingView view;
  std::vector<float> scratch;
  BuildSamplingView(RandomRow(4096, 0, rng), o, {}, &view, &scratch);
  const float* row = scratch.data();
  const Candidate* candidates = view.candidates.data();
  const TokenLogprob* top = view.raw_top.data();
  BuildSamplingView(RandomRow(4096, 0, rng), o, {}, &view, &scratch);
  EXPECT_EQ(scratch.data(), row);
  EXPECT_EQ(view.candidates.data(), candidates);
  EXPECT_EQ(view.raw_top.data(), top);
}

// A production-sized vocabulary (Qwen2's 152064) against the reference.
TEST(SamplingViewTest, LargeVocabMatchesReference) {
  std::mt19937_64 rng(17);
  Reference ref;
  SamplingView view;
  std::vector<float> scratch;
  for (uint64_t row : {0, 1, 4, 5, 6}) {
    const std::vector<float> raw = RandomRow(152064, row, rng);
    for (float temperature : {0.0f, 0.7f, 1.0f}) {
      Prepare(raw, temperature, &ref);
      for (float min_p : {0.0f, 0.05f}) {
        for (int32_t top_k : {0, 40}) {
          for (float top_p : {1.0f, 0.9f}) {
            SamplingOptions o;
            o.temperature = temperature;
            o.min_p = min_p;
            o.top_k = top_k;
            o.top_p = top_p;
            o.seed = rng();
            BuildSamplingView(raw, o, {}, &view, &scratch);
            const SampledToken got = SampleFromView(view, o, 7);
            const SampledToken want = ReferenceSample(ref, o, 7);
            EXPECT_EQ(got.token_id, want.token_id) << row << " " << temperature << " " << min_p;
            EXPECT_TRUE(SameBits(got.logprob, want.logprob)) << row << " " << temperature;
          }
        }
      }
    }
  }
}

}  // namespace
}  // namespace tandem::sampling
