#include "engine/sampling/logits_processor.h"

#include <algorithm>
#include <cassert>
#include <limits>
#include <vector>

namespace tandem::sampling {
namespace {

bool MinTokensMaskApplies(const SamplingOptions& options, const TokenHistory& history) {
  return !options.min_tokens_masked_ids.empty() &&
         history.generated.size() < static_cast<size_t>(std::max(options.min_tokens, 0));
}

bool RepetitionApplies(const SamplingOptions& options, const TokenHistory& history) {
  return options.repetition_penalty != 1.0f &&
         !(history.prompt.empty() && history.generated.empty());
}

bool FrequencyPresenceApplies(const SamplingOptions& options, const TokenHistory& history) {
  return (options.frequency_penalty != 0.0f || options.presence_penalty != 0.0f) &&
         !history.generated.empty();
}

// One int32 per vocabulary id, all zero between calls (each use resets the
// entries it set by walking the same ids again).
std::vector<int32_t>& ZeroedMarks(size_t vocab) {
  thread_local std::vector<int32_t> marks;
  if (marks.size() < vocab) marks.resize(vocab, 0);
  return marks;
}

#ifndef NDEBUG
bool AllInVocab(std::span<const int32_t> ids, size_t vocab) {
  for (int32_t id : ids) {
    if (id < 0 || static_cast<size_t>(id) >= vocab) return false;
  }
  return true;
}
#endif

}  // namespace

void ApplyLogitsProcessors(const SamplingOptions& options, const TokenHistory& history,
                           std::span<float> logits) {
  const size_t vocab = logits.size();
  assert(AllInVocab(history.prompt, vocab) && AllInVocab(history.generated, vocab));
  // a. min_tokens mask.
  if (MinTokensMaskApplies(options, history)) {
    assert(AllInVocab(options.min_tokens_masked_ids, vocab));
    for (int32_t id : options.min_tokens_masked_ids) {
      logits[static_cast<size_t>(id)] = -std::numeric_limits<float>::infinity();
    }
  }
  // b. logit_bias.
  for (const auto& [id, bias] : options.logit_bias) {
    assert(id >= 0 && static_cast<size_t>(id) < vocab);
    float& l = logits[static_cast<size_t>(id)];
    l = l + bias;
  }
  // c. Repetition penalty, once per distinct id of prompt ∪ generated.
  if (RepetitionApplies(options, history)) {
    std::vector<int32_t>& seen = ZeroedMarks(vocab);
    const float p = options.repetition_penalty;
    for (std::span<const int32_t> ids : {history.prompt, history.generated}) {
      for (int32_t id : ids) {
        if (seen[static_cast<size_t>(id)] != 0) continue;
        seen[static_cast<size_t>(id)] = 1;
        float& l = logits[static_cast<size_t>(id)];
        l = l > 0.0f ? l / p : l * p;
      }
    }
    for (std::span<const int32_t> ids : {history.prompt, history.generated}) {
      for (int32_t id : ids) seen[static_cast<size_t>(id)] = 0;
    }
  }
  // d. Frequency then presence penalty, once per distinct generated id.
  if (FrequencyPresenceApplies(options, history)) {
    std::vector<int32_t>& count = ZeroedMarks(vocab);
    for (int32_t id : history.generated) ++count[static_cast<size_t>(id)];
    const float frequency = options.frequency_penalty;
    const float presence = options.presence_penalty;
    for (int32_t id : history.generated) {
      const int32_t c = count[static_cast<size_t>(id)];
      if (c == 0) continue;  // already applied
      count[static_cast<size_t>(id)] = 0;
      float& l = logits[static_cast<size_t>(id)];
      if (frequency != 0.0f) {
        const float penalty = frequency * static_cast<float>(c);
        l = l - penalty;
      }
      if (presence != 0.0f) l = l - presence;
    }
  }
  // e. Temperature. Division (not multiplication by 1/T) so that the
  //    contract is one correctly rounded float operation a GPU kernel can
  //    reproduce exactly.
  if (options.temperature > 0.0f) {
    const float temperature = options.temperature;
    for (float& l : logits) l = l / temperature;
  }
}

bool LogitsProcessorsAreIdentity(const SamplingOptions& options, const TokenHistory& history) {
  if (MinTokensMaskApplies(options, history) || !options.logit_bias.empty() ||
      RepetitionApplies(options, history) || FrequencyPresenceApplies(options, history)) {
    return false;
  }
  return options.temperature == 0.0f || options.temperature == 1.0f;
}

}  // namespace tandem::sampling
