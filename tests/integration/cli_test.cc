// The real tandem CLI (build/tandem) against the real cluster.
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "tests/integration/cluster_fixture.h"
#include "tests/integration/generate_client.h"

namespace tandem::testing {
namespace {

using ::testing::ElementsAreArray;

using CliTest = DefaultClusterSuite;

TEST_F(CliTest, StatusCheckIdleExitsZeroAfterRequests) {
  // Requests on both routes first; finished requests must leave nothing
  // held (no blocks, transfers or running requests).
  for (const char* name : {"once_upon_a_time", "long_repeated_313tok"}) {
    const GoldenCase& g = Golden(name);
    StreamResult r = RunGenerate(cluster().stub(), MakeRequest(g.prompt, kGoldenMaxTokens));
    ASSERT_TRUE(r.status.ok()) << name << ": " << r.status.error_message();
  }
  ProcessResult status = RunProcess(
      {BinaryPath("tandem"), "status", "--check-idle", "--router", cluster().router_address()},
      absl::Seconds(20));
  EXPECT_TRUE(status.exited && status.exit_code == 0) << status.Describe() << status.out;
}

TEST_F(CliTest, GenerateJsonPrintsOneLineWithGoldenIds) {
  const GoldenCase& g = Golden("once_upon_a_time");
  ProcessResult run = RunProcess({BinaryPath("tandem"), "generate", "--json", "--max-tokens", "32",
                                  "--temperature", "0", "--router", cluster().router_address(),
                                  g.prompt},
                                 absl::Seconds(30));
  ASSERT_TRUE(run.exited && run.exit_code == 0) << run.Describe();
  const std::vector<std::string> lines = Lines(run.out);
  ASSERT_EQ(lines.size(), 1u) << run.out;
  nlohmann::json j;
  try {
    j = nlohmann::json::parse(lines[0]);
    EXPECT_EQ(j.at("route").get<std::string>(), "local");
    EXPECT_THAT(j.at("prompt_token_ids").get<std::vector<int32_t>>(),
                ElementsAreArray(g.prompt_ids));
    const std::vector<int32_t> ids = j.at("token_ids").get<std::vector<int32_t>>();
    ASSERT_GE(ids.size(), g.strict_prefix_len);
    EXPECT_LE(ids.size(), kGoldenMaxTokens);
    EXPECT_THAT(std::vector<int32_t>(ids.begin(), ids.begin() + static_cast<ptrdiff_t>(
                                                                    g.strict_prefix_len)),
                ElementsAreArray(g.StrictIds()));
  } catch (const nlohmann::json::exception& e) {
    FAIL() << e.what() << " in: " << lines[0];
  }
}

}  // namespace
}  // namespace tandem::testing
