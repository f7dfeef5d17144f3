// CheckStop's order and boundaries (DESIGN.md, request flow step 7; the
// order of vLLM's StopChecker).
#include "engine/core/stop_checker.h"

#include "gtest/gtest.h"

namespace tandem::core {
namespace {

RequestStops Stops(int64_t max_tokens) {
  RequestStops s;
  s.max_tokens = max_tokens;
  return s;
}

TEST(StopCheckerTest, EosThenLengthThenContext) {
  const StopCriteria c{/*eog_token_ids=*/{2}, /*context_length=*/16};
  EXPECT_EQ(CheckStop(c, Stops(4), 5, 1, 8), FinishReason::kNone);
  // EOS wins over length and context.
  EXPECT_EQ(CheckStop(c, Stops(4), 2, 4, 16), FinishReason::kStop);
  EXPECT_EQ(CheckStop(c, Stops(4), 5, 4, 16), FinishReason::kLength);
  EXPECT_EQ(CheckStop(c, Stops(4), 5, 3, 16), FinishReason::kContext);
  EXPECT_EQ(CheckStop(c, Stops(4), 5, 3, 15), FinishReason::kNone);
  // BOS (1 here) is an ordinary token.
  EXPECT_EQ(CheckStop(c, Stops(4), 1, 1, 8), FinishReason::kNone);
}

// Every id of the end-of-generation set stops (Qwen's: <|endoftext|>,
// <|im_end|>, and the FIM end markers), nothing else does.
TEST(StopCheckerTest, AnyEndOfGenerationIdStops) {
  const StopCriteria c{{151643, 151645, 151662, 151663, 151664}, 4096};
  for (int32_t id : {151643, 151645, 151662, 151663, 151664}) {
    EXPECT_EQ(CheckStop(c, Stops(8), id, 1, 10), FinishReason::kStop) << id;
  }
  for (int32_t id : {0, 151644, 151646, 151665}) {
    EXPECT_EQ(CheckStop(c, Stops(8), id, 1, 10), FinishReason::kNone) << id;
  }
  EXPECT_EQ(CheckStop(StopCriteria{{}, 4096}, Stops(8), 2, 1, 10), FinishReason::kNone);
}

TEST(StopCheckerTest, StopTokenIdsStopAndIgnoreEosKeepsThem) {
  const StopCriteria c{{2}, 64};
  const std::vector<int32_t> ids = {7, 9};
  RequestStops s = Stops(8);
  s.stop_token_ids = ids;
  EXPECT_EQ(CheckStop(c, s, 7, 1, 10), FinishReason::kStop);
  EXPECT_EQ(CheckStop(c, s, 9, 1, 10), FinishReason::kStop);
  EXPECT_EQ(CheckStop(c, s, 8, 1, 10), FinishReason::kNone);
  s.ignore_eos = true;
  EXPECT_EQ(CheckStop(c, s, 2, 1, 10), FinishReason::kNone);  // EOS is ordinary now
  EXPECT_EQ(CheckStop(c, s, 9, 1, 10), FinishReason::kStop);  // stop ids still stop
  EXPECT_EQ(CheckStop(c, s, 2, 8, 10), FinishReason::kLength);
}

// vLLM: no stop check while the output holds fewer than min_tokens tokens
// (num_generated counts the new token); length still applies.
TEST(StopCheckerTest, MinTokensDefersEosAndStopIds) {
  const StopCriteria c{{2}, 64};
  const std::vector<int32_t> ids = {7};
  RequestStops s = Stops(5);
  s.stop_token_ids = ids;
  s.min_tokens = 3;
  EXPECT_EQ(CheckStop(c, s, 2, 1, 10), FinishReason::kNone);
  EXPECT_EQ(CheckStop(c, s, 7, 2, 10), FinishReason::kNone);
  EXPECT_EQ(CheckStop(c, s, 2, 3, 10), FinishReason::kStop);
  EXPECT_EQ(CheckStop(c, s, 7, 3, 10), FinishReason::kStop);
  s.min_tokens = 5;
  EXPECT_EQ(CheckStop(c, s, 4, 5, 10), FinishReason::kLength);
}

TEST(StopCheckerTest, MinTokensMaskedIdsAreStopIdsAndEogUnlessIgnored) {
  const StopCriteria c{{2, 30}, 64};
  EXPECT_EQ(MinTokensMaskedIds(c, std::vector<int32_t>{9, 2, 9}, false),
            (std::vector<int32_t>{2, 9, 30}));
  EXPECT_EQ(MinTokensMaskedIds(c, std::vector<int32_t>{9}, true), (std::vector<int32_t>{9}));
  EXPECT_EQ(MinTokensMaskedIds(c, {}, true), (std::vector<int32_t>{}));
}

}  // namespace
}  // namespace tandem::core
