#include "engine/sampling/logits_processor.h"

namespace tandem::sampling {

void ApplyLogitsProcessors(const SamplingOptions& options, std::span<float> logits) {
  // 1. Penalties / logit biases: none yet.
  // 2. Temperature. Division (not multiplication by 1/T) so that the
  //    contract is one correctly rounded float operation a GPU kernel can
  //    reproduce exactly.
  if (options.temperature > 0.0f) {
    const float temperature = options.temperature;
    for (float& l : logits) l = l / temperature;
  }
}

bool LogitsProcessorsAreIdentity(const SamplingOptions& options) {
  return options.temperature == 0.0f || options.temperature == 1.0f;
}

}  // namespace tandem::sampling
