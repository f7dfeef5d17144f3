// `tandem role` (issue #35): its arguments, and the planner's line of
// `tandem status`.
#include "tools/role.h"

#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "tools/status.h"

namespace tandem::cli {
namespace {

using ::testing::HasSubstr;

TEST(RoleArgsTest, NameAndRole) {
  absl::StatusOr<RoleOptions> o =
      ParseRoleArgs({"--router", "10.0.0.2:50051", "--timeout-ms", "900", "prefill-0", "decode"});
  ASSERT_TRUE(o.ok()) << o.status();
  EXPECT_EQ(o->router, "10.0.0.2:50051");
  EXPECT_EQ(o->timeout_ms, 900);
  EXPECT_EQ(o->name, "prefill-0");
  EXPECT_EQ(o->role, tandem::v1::ROLE_DECODE);
  o = ParseRoleArgs({"decode-1", "prefill"});
  ASSERT_TRUE(o.ok()) << o.status();
  EXPECT_EQ(o->role, tandem::v1::ROLE_PREFILL);
  EXPECT_EQ(o->router, "127.0.0.1:50051");
}

TEST(RoleArgsTest, BadArgumentsNameWhatIsWrong) {
  auto error = [](std::vector<std::string> args) {
    absl::StatusOr<RoleOptions> o = ParseRoleArgs(args);
    return o.ok() ? std::string("(accepted)") : std::string(o.status().message());
  };
  EXPECT_THAT(error({"prefill-0"}), HasSubstr("expected a worker name and a role"));
  EXPECT_THAT(error({"prefill-0", "decode", "extra"}), HasSubstr("got 3 argument(s)"));
  EXPECT_THAT(error({"prefill-0", "router"}),
              HasSubstr("role: expected prefill or decode, got 'router'"));
  EXPECT_THAT(error({"", "decode"}), HasSubstr("name: must not be empty"));
  EXPECT_THAT(error({"--timeout-ms", "0", "p", "decode"}), HasSubstr("--timeout-ms: must be > 0"));
  EXPECT_THAT(error({"--router", "nowhere", "p", "decode"}), HasSubstr("--router"));
  EXPECT_THAT(error({"--api-key=", "p", "decode"}), HasSubstr("--api-key: must not be empty"));
  EXPECT_THAT(error({"--bogus", "p", "decode"}), HasSubstr("--bogus"));
}

TEST(PlannerLineTest, OffAndOn) {
  tandem::v1::PlannerStatus p;
  p.set_mode("off");
  EXPECT_EQ(FormatPlannerLine(p), "planner: off");
  p.set_mode("slo");
  p.set_interval_s(5);
  p.set_cooldown_s(30);
  p.set_desired_prefill_workers(0);
  p.set_desired_decode_workers(2);
  p.set_role_changes_total(3);
  p.set_flip_roles(true);
  p.set_seconds_since_last_flip(-1);
  p.set_last_decision("slo: ...");
  EXPECT_EQ(FormatPlannerLine(p),
            "planner: slo every 5 s, cooldown 30 s; wants 0 prefill + 2 decode; flips=3; last: "
            "slo: ...");
  p.set_flip_roles(false);
  p.set_seconds_since_last_flip(2.25);
  EXPECT_THAT(FormatPlannerLine(p), HasSubstr("decode (export only); flips=3; last role change "
                                              "2.2 s ago"));
}

}  // namespace
}  // namespace tandem::cli
