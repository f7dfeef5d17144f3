// A StepModel fitted to known step times for scheduler tests: 1 ms per
// step + 0.01 ms per prefill token + 0.5 ms per decode sequence (no
// attention terms), from warm-up (anchor) steps over a grid of shapes.
#ifndef TANDEM_TESTS_ENGINE_SCHEDULER_KNOWN_STEP_MODEL_H_
#define TANDEM_TESTS_ENGINE_SCHEDULER_KNOWN_STEP_MODEL_H_

#include "engine/scheduler/step_model.h"

namespace tandem::scheduler {

inline StepModel KnownStepModel() {
  StepModel model;
  for (int32_t tokens : {0, 16, 64, 256, 512}) {
    for (int32_t decodes : {0, 1, 4, 16}) {
      if (tokens == 0 && decodes == 0) continue;
      for (int32_t start : {0, 300}) {
        StepShape shape;
        if (tokens > 0) shape.AddChunk(start, tokens);
        for (int d = 0; d < decodes; ++d) shape.AddChunk(start + 40 * d, 1);
        model.Observe(shape, 1.0 + 0.01 * tokens + 0.5 * decodes, /*anchor=*/true);
      }
    }
  }
  return model;
}

}  // namespace tandem::scheduler

#endif  // TANDEM_TESTS_ENGINE_SCHEDULER_KNOWN_STEP_MODEL_H_
