// ResolveRouterSettings: the router's flags over router.* (issue #33: flag
// beats config, a bad or missing value names the key).
#include "router/router_settings.h"

#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace tandem::router {
namespace {

using ::testing::HasSubstr;

absl::StatusOr<RouterSettings> Resolve(const std::map<std::string, std::string>& flags,
                                       const char* yaml = R"(
model: /m/x.gguf
router: {name: r, listen: "127.0.0.1:7000", http_listen: "127.0.0.1:8000"}
decode_workers: [{name: d0, listen: "127.0.0.1:7002", kv_listen: "127.0.0.1:7003"}]
)") {
  absl::StatusOr<ClusterConfig> config = ParseClusterConfig(yaml);
  if (!config.ok()) return config.status();
  return ResolveRouterSettings(flags, *std::move(config));
}

TEST(RouterSettingsTest, ConfigValuesWithoutFlags) {
  absl::StatusOr<RouterSettings> s = Resolve({});
  ASSERT_TRUE(s.ok()) << s.status();
  EXPECT_EQ(s->name, "r");
  EXPECT_EQ(s->listen.ToString(), "127.0.0.1:7000");
  EXPECT_EQ(s->listen_key, "router.listen");
  ASSERT_TRUE(s->http_listen.has_value());
  EXPECT_EQ(s->http_listen->ToString(), "127.0.0.1:8000");
  EXPECT_EQ(s->http_listen_key, "router.http_listen");
  EXPECT_FALSE(s->metrics_listen.has_value());
  EXPECT_EQ(s->model_flag, "");
}

TEST(RouterSettingsTest, FlagBeatsConfig) {
  const std::map<std::string, std::string> flags = {
      {"name", "r2"}, {"listen", "127.0.0.1:7100"}, {"http-listen", "127.0.0.1:8100"},
      {"metrics-listen", "127.0.0.1:9100"}, {"model", "/o.gguf"}};
  absl::StatusOr<RouterSettings> s = Resolve(flags);
  ASSERT_TRUE(s.ok()) << s.status();
  EXPECT_EQ(s->name, "r2");
  EXPECT_EQ(s->listen.ToString(), "127.0.0.1:7100");
  EXPECT_EQ(s->listen_key, "--listen");
  EXPECT_EQ(s->http_listen->ToString(), "127.0.0.1:8100");
  EXPECT_EQ(s->http_listen_key, "--http-listen");
  EXPECT_EQ(s->metrics_listen->ToString(), "127.0.0.1:9100");
  EXPECT_EQ(s->metrics_listen_key, "--metrics-listen");
  EXPECT_EQ(s->model_flag, "/o.gguf");
}

TEST(RouterSettingsTest, WildcardListenWithoutAdvertiseNamesTheKey) {
  absl::StatusOr<RouterSettings> s = Resolve({{"listen", "0.0.0.0:7000"}});
  ASSERT_FALSE(s.ok());
  EXPECT_THAT(s.status().message(), HasSubstr("--advertise"));
  s = Resolve({{"listen", "0.0.0.0:7000"}, {"advertise", "10.0.0.1"}});
  ASSERT_TRUE(s.ok()) << s.status();
  EXPECT_EQ(s->advertise_key, "--advertise");
}

TEST(RouterSettingsTest, BadFlagValueNamesTheFlag) {
  absl::StatusOr<RouterSettings> s = Resolve({{"http-listen", "nope"}});
  ASSERT_FALSE(s.ok());
  EXPECT_THAT(s.status().message(), HasSubstr("--http-listen"));
}

}  // namespace
}  // namespace tandem::router
