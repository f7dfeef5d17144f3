// CheckStop's order and boundaries (DESIGN.md, request flow step 7).
#include "engine/core/stop_checker.h"

#include "gtest/gtest.h"

namespace tandem::core {
namespace {

TEST(StopCheckerTest, EosThenLengthThenContext) {
  const StopCriteria c{/*eos_token_id=*/2, /*context_length=*/16};
  EXPECT_EQ(CheckStop(c, 5, 1, 4, 8), FinishReason::kNone);
  // EOS wins over length and context.
  EXPECT_EQ(CheckStop(c, 2, 4, 4, 16), FinishReason::kStop);
  EXPECT_EQ(CheckStop(c, 5, 4, 4, 16), FinishReason::kLength);
  EXPECT_EQ(CheckStop(c, 5, 3, 4, 16), FinishReason::kContext);
  EXPECT_EQ(CheckStop(c, 5, 3, 4, 15), FinishReason::kNone);
  // BOS (1 here) is an ordinary token.
  EXPECT_EQ(CheckStop(c, 1, 1, 4, 8), FinishReason::kNone);
}

}  // namespace
}  // namespace tandem::core
