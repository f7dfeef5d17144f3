// CheckStop's order and boundaries (DESIGN.md, request flow step 7).
#include "engine/core/stop_checker.h"

#include "gtest/gtest.h"

namespace tandem::core {
namespace {

TEST(StopCheckerTest, EosThenLengthThenContext) {
  const StopCriteria c{/*eog_token_ids=*/{2}, /*context_length=*/16};
  EXPECT_EQ(CheckStop(c, 5, 1, 4, 8), FinishReason::kNone);
  // EOS wins over length and context.
  EXPECT_EQ(CheckStop(c, 2, 4, 4, 16), FinishReason::kStop);
  EXPECT_EQ(CheckStop(c, 5, 4, 4, 16), FinishReason::kLength);
  EXPECT_EQ(CheckStop(c, 5, 3, 4, 16), FinishReason::kContext);
  EXPECT_EQ(CheckStop(c, 5, 3, 4, 15), FinishReason::kNone);
  // BOS (1 here) is an ordinary token.
  EXPECT_EQ(CheckStop(c, 1, 1, 4, 8), FinishReason::kNone);
}

// Every id of the end-of-generation set stops (Qwen's: <|endoftext|>,
// <|im_end|>, and the FIM end markers), nothing else does.
TEST(StopCheckerTest, AnyEndOfGenerationIdStops) {
  const StopCriteria c{{151643, 151645, 151662, 151663, 151664}, 4096};
  for (int32_t id : {151643, 151645, 151662, 151663, 151664}) {
    EXPECT_EQ(CheckStop(c, id, 1, 8, 10), FinishReason::kStop) << id;
  }
  for (int32_t id : {0, 151644, 151646, 151665}) {
    EXPECT_EQ(CheckStop(c, id, 1, 8, 10), FinishReason::kNone) << id;
  }
  EXPECT_EQ(CheckStop(StopCriteria{{}, 4096}, 2, 1, 8, 10), FinishReason::kNone);
}

}  // namespace
}  // namespace tandem::core
