#include "engine/sampling/sampling_view.h"

#include <algorithm>
#include <array>
#include <bit>
#include <cassert>
#include <cmath>
#include <cstring>
#include <limits>
#include <utility>

#include "engine/sampling/logits_processor.h"

namespace tandem::sampling {
namespace {

constexpr size_t kWidenFactor = 4;
// AppendNext uses a bounded heap for count <= kHeapMaxCount ids when
// count * kHeapRatio <= ids left, else a radix sort of every id left. A
// radix sort is ~5 passes over the ids; the heap is one pass plus
// replacements that grow with count. Measured at vocab 152064 (Gaussian
// logits, top_p 0.9, widening up to the whole vocabulary) a limit of 1024
// beats ~9000 (heap replacements dominate) and ~600 (a radix pass, ~1 ms,
// for the second widening already).
constexpr size_t kHeapMaxCount = 1024;
constexpr size_t kHeapRatio = 16;
// ... except that up to this many ids left, count <= kHeapMaxCount picks
// with nth_element + a sort of the kept ids instead of radix-sorting all
// of them (a vocabulary of a few hundred ids, read every decode step).
constexpr size_t kSelectMaxIds = 4096;

// Sort key: NaN ranks as -inf, so the candidate order is total.
inline float Key(float logit) {
  return std::isnan(logit) ? -std::numeric_limits<float>::infinity() : logit;
}

// (key_a, id_a) strictly before (key_b, id_b) in the candidate order.
inline bool Before(float key_a, int32_t id_a, float key_b, int32_t id_b) {
  return key_a > key_b || (key_a == key_b && id_a < id_b);
}

struct CandidateBefore {
  bool operator()(const Candidate& a, const Candidate& b) const {
    return Before(Key(a.logit), a.id, Key(b.logit), b.id);
  }
};

// The candidate order's key as an unsigned integer that sorts ascending
// when the logit sorts descending: NaN becomes -inf and -0 becomes +0 (the
// floats compare equal, so they must tie), then the usual monotone map of
// float bits to unsigned, complemented.
inline uint32_t DescendingKey(float logit) {
  uint32_t u = std::bit_cast<uint32_t>(logit);
  const uint32_t magnitude = u & 0x7fffffffu;
  u = magnitude > 0x7f800000u ? 0xff800000u : u;
  u = magnitude == 0 ? 0u : u;
  // Branch-free (the sign is a coin flip for real logits): negative floats
  // flip every bit, positive ones the sign bit; then complement.
  const uint32_t negative = static_cast<uint32_t>(static_cast<int32_t>(u) >> 31);
  return ~(u ^ (negative | 0x80000000u));
}

// Stable LSD radix sort of data[0, n) by DescendingKey (4 passes of 8
// bits, a pass skipped when every key shares its byte), with tmp[0, n) as
// the other buffer. Stability keeps equal logits in input order, so input
// in ascending id order comes out in the candidate order. O(n).
void RadixSort(Candidate* data, Candidate* tmp, size_t n) {
  std::array<std::array<uint32_t, 256>, 4> count{};
  for (size_t i = 0; i < n; ++i) {
    const uint32_t key = DescendingKey(data[i].logit);
    for (int b = 0; b < 4; ++b) ++count[b][(key >> (8 * b)) & 0xffu];
  }
  Candidate* src = data;
  Candidate* dst = tmp;
  for (int b = 0; b < 4; ++b) {
    std::array<uint32_t, 256>& offset = count[b];
    if (std::find(offset.begin(), offset.end(), static_cast<uint32_t>(n)) != offset.end()) {
      continue;
    }
    uint32_t sum = 0;
    for (uint32_t& c : offset) sum += std::exchange(c, sum);
    for (size_t i = 0; i < n; ++i) {
      dst[offset[(DescendingKey(src[i].logit) >> (8 * b)) & 0xffu]++] = src[i];
    }
    std::swap(src, dst);
  }
  if (src != data) std::copy(src, src + n, data);
}

// Appends to `out` at least the next `count` ids of the candidate order of
// `processed`, sorted. `out` must hold exactly the first out->size() ids of
// that order, and count <= vocab - out->size(): the ids still to come are
// then exactly those after out->back().
//
// Small count (see kHeapMaxCount): appends exactly count, in one pass with
// a bounded heap whose front is the worst kept: O(V + m log count), m the
// replacements (about count * ln(V / count) for logits in no particular
// order); almost every id fails one comparison against the front.
// Small count over few ids left (kSelectMaxIds): nth_element over every id
// left and a sort of the count kept, O(V + count log count) whatever the
// order of the logits (a heap degrades when they rise with the id, as a
// small SPM vocabulary's byte pieces then words make them).
// Otherwise appends every id left, radix-sorted: O(V), with a temporary
// second half of `out` (its capacity reaches 2V).
void AppendNext(std::span<const float> processed, std::span<const float> raw, size_t count,
                std::vector<Candidate>* out) {
  const size_t vocab = processed.size();
  const size_t base = out->size();
  const size_t left = vocab - base;
  assert(count <= left);
  if (count == 0) return;
  const bool bounded = base > 0;
  const float bound_key = bounded ? Key(out->back().logit) : 0.0f;
  const int32_t bound_id = bounded ? out->back().id : -1;
  const auto after_bound = [&](float key, int32_t id) {
    return !bounded || Before(bound_key, bound_id, key, id);
  };

  if (count <= kHeapMaxCount && count * kHeapRatio > left && left <= kSelectMaxIds) {
    // A small vocabulary: partition every id left around the count-th
    // (introselect, O(left) whatever the order of the logits) and sort only
    // the kept ones. Each id is packed as DescendingKey << 32 | id, so the
    // candidate order is plain unsigned order (no NaN branches).
    thread_local std::vector<uint64_t> keys;
    keys.clear();
    for (size_t i = 0; i < vocab; ++i) {
      const int32_t id = static_cast<int32_t>(i);
      if (after_bound(Key(processed[i]), id)) {
        keys.push_back(static_cast<uint64_t>(DescendingKey(processed[i])) << 32 |
                       static_cast<uint32_t>(id));
      }
    }
    assert(keys.size() == left);
    const auto nth = keys.begin() + static_cast<std::ptrdiff_t>(count);
    std::nth_element(keys.begin(), nth, keys.end());
    std::sort(keys.begin(), nth);
    out->reserve(base + count);
    for (auto it = keys.begin(); it != nth; ++it) {
      const size_t id = static_cast<size_t>(*it & 0xffffffffu);
      out->push_back({static_cast<int32_t>(id), processed[id], raw[id]});
    }
    return;
  }
  if (count > kHeapMaxCount || count * kHeapRatio > left) {
    out->reserve(base + 2 * left);
    for (size_t i = 0; i < vocab; ++i) {
      const int32_t id = static_cast<int32_t>(i);
      if (after_bound(Key(processed[i]), id)) out->push_back({id, processed[i], raw[i]});
    }
    assert(out->size() == vocab);
    out->resize(base + 2 * left);
    RadixSort(out->data() + base, out->data() + base + left, left);
    out->resize(vocab);
    return;
  }

  const CandidateBefore before;
  out->reserve(base + count);
  const auto first = out->begin() + static_cast<std::ptrdiff_t>(base);
  size_t i = 0;
  for (; out->size() - base < count; ++i) {
    const int32_t id = static_cast<int32_t>(i);
    if (after_bound(Key(processed[i]), id)) out->push_back({id, processed[i], raw[i]});
  }
  std::make_heap(first, out->end(), before);
  // Ids rise through the loop, so an id whose key equals the front's (or
  // a NaN, whose key is -inf) comes after the front: one comparison
  // rejects almost every id.
  float worst_key = Key(first->logit);
  for (; i < vocab; ++i) {
    const float logit = processed[i];
    if (!(logit > worst_key)) continue;
    const int32_t id = static_cast<int32_t>(i);
    if (!after_bound(logit, id)) continue;
    std::pop_heap(first, out->end(), before);
    out->back() = {id, logit, raw[i]};
    std::push_heap(first, out->end(), before);
    worst_key = Key(first->logit);
  }
  std::sort_heap(first, out->end(), before);
}

// The first `count` ids of the candidate order of the raw row, their raw
// logit parked in `logprob` (bounded heap; count <= kMaxTopLogprobs).
void SelectRawTop(std::span<const float> raw, size_t count, std::vector<TokenLogprob>* out) {
  const auto before = [](const TokenLogprob& a, const TokenLogprob& b) {
    return Before(Key(a.logprob), a.id, Key(b.logprob), b.id);
  };
  out->clear();
  if (count == 0) return;
  out->reserve(count);
  for (size_t i = 0; i < raw.size(); ++i) {
    const TokenLogprob t{static_cast<int32_t>(i), raw[i]};
    if (out->size() < count) {
      out->push_back(t);
      if (out->size() == count) std::make_heap(out->begin(), out->end(), before);
      continue;
    }
    if (!before(t, out->front())) continue;
    std::pop_heap(out->begin(), out->end(), before);
    out->back() = t;
    std::push_heap(out->begin(), out->end(), before);
  }
  std::sort_heap(out->begin(), out->end(), before);
}

}  // namespace

void BuildSamplingView(std::span<const float> raw_logits, const SamplingOptions& options,
                       const TokenHistory& history, SamplingView* view,
                       std::vector<float>* scratch) {
  assert(!raw_logits.empty());
  const size_t vocab = raw_logits.size();
  // The processed row: the raw one itself when the processors would not
  // change a bit (greedy or temperature 1 with no other processor), else a
  // processed copy.
  const bool identity = LogitsProcessorsAreIdentity(options, history);
  std::vector<float> local;
  std::span<const float> processed = raw_logits;
  if (!identity) {
    std::vector<float>& copy = scratch != nullptr ? *scratch : local;
    copy.assign(raw_logits.begin(), raw_logits.end());
    ApplyLogitsProcessors(options, history, copy);
    processed = copy;
  }

  // Candidates: the first k ids of the processed order (widened below).
  // `candidates` may run ahead of k with more ids of the order, already
  // sorted (AppendNext's radix path); it is cut back to k at the end.
  std::vector<Candidate>& candidates = view->candidates;
  const auto ensure = [&](size_t want) {
    if (want > candidates.size()) {
      AppendNext(processed, raw_logits, want - candidates.size(), &candidates);
    }
  };
  const bool top_k_on = options.top_k > 0;
  // Greedy takes the first id; a draw needs room for what it keeps.
  const bool greedy = options.temperature == 0.0f;
  // With top_k off, the view widens until it holds the min_p survivors
  // (min_p > 0) or the top_p nucleus (min_p == 0).
  const bool widen_min_p = !top_k_on && !greedy && options.min_p > 0.0f;
  const bool widen_top_p = !top_k_on && !greedy && options.min_p == 0.0f;
  size_t k = greedy ? 1 : kMinViewCandidates;
  if (top_k_on && !greedy) k = std::max(k, static_cast<size_t>(options.top_k));
  // top_p == 1 with min_p off keeps every id (the draw sums p over the
  // whole sorted vocabulary), so no smaller view could serve it.
  if (widen_top_p && options.top_p == 1.0f) k = vocab;
  k = std::min(k, vocab);
  candidates.clear();
  ensure(k);

  // Raw statistics. The max is the first id of the raw order, which is
  // today's argmax (first strictly greater, lowest id) for NaN-free rows
  // (a NaN compares false, i.e. ranks as -inf); the sum reproduces the
  // log-softmax the sampler has always reported. With identity processors
  // the first candidate is that id already.
  size_t best = identity ? static_cast<size_t>(candidates[0].id) : 0;
  if (!identity) {
    float best_key = Key(raw_logits[0]);
    for (size_t i = 1; i < vocab; ++i) {
      if (raw_logits[i] > best_key) {
        best = i;
        best_key = raw_logits[i];
      }
    }
  }
  view->raw_max = raw_logits[best];
  double raw_sum = 0.0;
  for (float l : raw_logits) raw_sum += std::exp(static_cast<double>(l) - view->raw_max);
  view->raw_log_sum = std::log(raw_sum);

  view->normaliser = 0.0;
  if (widen_min_p) {
    // Widen until the last candidate fails the min_p test, computed exactly
    // as SampleFromView computes it, so its survivor walk stops within the
    // candidates. A NaN p fails it (the walk stops there too).
    const double l0 = candidates[0].logit;
    const double min_p = options.min_p;
    while (k < vocab && std::exp(static_cast<double>(candidates[k - 1].logit) - l0) >= min_p) {
      k = std::min(kWidenFactor * k, vocab);
      ensure(k);
    }
  }
  if (widen_top_p) {
    const double l0 = candidates[0].logit;
    if (identity) {
      // Temperature 1: candidates[0] is the raw first id, l0 == raw_max,
      // and this is the same sum.
      view->normaliser = raw_sum;
    } else {
      double sum = 0.0;
      for (float l : processed) sum += std::exp(static_cast<double>(l) - l0);
      view->normaliser = sum;
    }
    // Widen until the candidates carry the nucleus. `mass` is summed
    // exactly as SampleFromView accumulates it, so "mass >= target" here
    // means its nucleus walk stops within the candidates. A NaN normaliser
    // (NaN logits) never satisfies it and widens to the whole vocabulary,
    // where the walk ends anyway.
    const double target = static_cast<double>(options.top_p) * view->normaliser;
    double mass = 0.0;
    size_t summed = 0;
    while (k < vocab) {
      for (; summed < k; ++summed) {
        mass += std::exp(static_cast<double>(candidates[summed].logit) - l0);
      }
      if (mass >= target) break;
      k = std::min(kWidenFactor * k, vocab);
      ensure(k);
    }
  }
  candidates.resize(k);
  view->complete = k == vocab;

  const size_t top_n = std::min(
      static_cast<size_t>(std::clamp<int64_t>(options.top_logprobs, 0, kMaxTopLogprobs)), vocab);
  SelectRawTop(raw_logits, top_n, &view->raw_top);
  for (TokenLogprob& t : view->raw_top) {
    t.logprob =
        static_cast<float>(static_cast<double>(t.logprob) - view->raw_max - view->raw_log_sum);
  }
}

}  // namespace tandem::sampling
