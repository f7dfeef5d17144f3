// Tests for tools/cli_args: the hand-rolled flag parser of the tandem CLI.
#include "tools/cli_args.h"

#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace tandem::cli {
namespace {

using ::testing::ElementsAre;
using ::testing::HasSubstr;

const std::vector<FlagSpec> kSpec = {{"router"}, {"max-tokens"}, {"json", false}};

TEST(CliArgsTest, AcceptsBothValueFormsBooleansAndPositionals) {
  absl::StatusOr<ParsedArgs> a =
      ParseArgs({"hello", "--router", "h:1", "--max-tokens=7", "--json", "world"}, kSpec);
  ASSERT_TRUE(a.ok()) << a.status();
  EXPECT_EQ(a->GetString("router", "x"), "h:1");
  EXPECT_EQ(a->GetInt("max-tokens", 0).value_or(-1), 7);
  EXPECT_TRUE(a->Has("json"));
  EXPECT_THAT(a->positional(), ElementsAre("hello", "world"));
}

TEST(CliArgsTest, AbsentFlagsGiveFallbacks) {
  absl::StatusOr<ParsedArgs> a = ParseArgs({}, kSpec);
  ASSERT_TRUE(a.ok());
  EXPECT_FALSE(a->Has("json"));
  EXPECT_EQ(a->GetString("router", "d:2"), "d:2");
  EXPECT_EQ(a->GetInt("max-tokens", 32).value_or(-1), 32);
  EXPECT_EQ(a->GetDouble("max-tokens", 0.5).value_or(-1), 0.5);
  EXPECT_TRUE(a->positional().empty());
}

TEST(CliArgsTest, DoubleDashEndsFlags) {
  absl::StatusOr<ParsedArgs> a = ParseArgs({"--json", "--", "--router", "-x"}, kSpec);
  ASSERT_TRUE(a.ok()) << a.status();
  EXPECT_FALSE(a->Has("router"));
  EXPECT_THAT(a->positional(), ElementsAre("--router", "-x"));
}

TEST(CliArgsTest, SingleDashWordsArePositional) {
  absl::StatusOr<ParsedArgs> a = ParseArgs({"-", "-5"}, kSpec);
  ASSERT_TRUE(a.ok()) << a.status();
  EXPECT_THAT(a->positional(), ElementsAre("-", "-5"));
}

TEST(CliArgsTest, ValueMayStartWithDashes) {
  absl::StatusOr<ParsedArgs> a = ParseArgs({"--router", "--json"}, kSpec);
  ASSERT_TRUE(a.ok()) << a.status();
  EXPECT_EQ(a->GetString("router", ""), "--json");
  EXPECT_FALSE(a->Has("json"));
}

TEST(CliArgsTest, Errors) {
  struct Case {
    std::vector<std::string> args;
    const char* message;
  } cases[] = {
      {{"--bogus"}, "unknown flag --bogus (known: --router --max-tokens --json)"},
      {{"--router"}, "--router: missing value"},
      {{"--json=1"}, "--json: takes no value"},
      {{"--json", "--json"}, "--json: given more than once"},
  };
  for (const Case& c : cases) {
    absl::StatusOr<ParsedArgs> a = ParseArgs(c.args, kSpec);
    ASSERT_FALSE(a.ok()) << c.message;
    EXPECT_EQ(a.status().code(), absl::StatusCode::kInvalidArgument);
    EXPECT_EQ(a.status().message(), c.message);
  }
}

TEST(CliArgsTest, RepeatableFlagsKeepEveryValueInOrder) {
  const std::vector<FlagSpec> spec = {{"stop", true, true}, {"v", false, true}, {"router"}};
  absl::StatusOr<ParsedArgs> a =
      ParseArgs({"--stop", "a", "p", "--stop=b", "--v", "--stop", "a", "--v"}, spec);
  ASSERT_TRUE(a.ok()) << a.status();
  EXPECT_THAT(a->GetAll("stop"), ElementsAre("a", "b", "a"));
  EXPECT_EQ(a->GetString("stop", ""), "a");  // the last one
  EXPECT_THAT(a->GetAll("v"), ElementsAre("", ""));
  EXPECT_TRUE(a->GetAll("router").empty());
  EXPECT_THAT(a->positional(), ElementsAre("p"));
  // A flag that is not repeatable still may not repeat.
  absl::StatusOr<ParsedArgs> twice = ParseArgs({"--router", "a:1", "--router", "b:2"}, spec);
  ASSERT_FALSE(twice.ok());
  EXPECT_EQ(twice.status().message(), "--router: given more than once");
}

TEST(CliArgsTest, ValueParsersNameTheFlag) {
  EXPECT_EQ(ParseIntValue("id", "-12").value_or(0), -12);
  EXPECT_EQ(ParseIntValue("id", "1x").status().message(), "--id: expected an integer, got '1x'");
  EXPECT_EQ(ParseDoubleValue("bias", "-2.5").value_or(0), -2.5);
  EXPECT_EQ(ParseDoubleValue("bias", "inf").status().message(),
            "--bias: expected a finite number, got 'inf'");
}

TEST(CliArgsTest, TypedGettersNameTheFlag) {
  absl::StatusOr<ParsedArgs> a = ParseArgs({"--max-tokens", "12x", "--router", "-3"}, kSpec);
  ASSERT_TRUE(a.ok());
  EXPECT_EQ(a->GetInt("max-tokens", 0).status().message(),
            "--max-tokens: expected an integer, got '12x'");
  EXPECT_EQ(a->GetDouble("max-tokens", 0).status().message(),
            "--max-tokens: expected a finite number, got '12x'");
  EXPECT_EQ(a->GetUint("router", 0).status().message(),
            "--router: expected an unsigned integer, got '-3'");
  EXPECT_EQ(a->GetInt("router", 0).value_or(0), -3);
  absl::StatusOr<ParsedArgs> nan = ParseArgs({"--max-tokens", "nan"}, kSpec);
  EXPECT_THAT(nan->GetDouble("max-tokens", 0).status().message(), HasSubstr("finite"));
}

}  // namespace
}  // namespace tandem::cli
