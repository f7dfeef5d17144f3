// Tests for tools/up's pure parts: flags and the dial address.
#include "tools/up.h"

#include "gtest/gtest.h"

namespace tandem::cli {
namespace {

TEST(UpArgsTest, DefaultsAndFlags) {
  absl::StatusOr<UpOptions> o = ParseUpArgs({});
  ASSERT_TRUE(o.ok());
  EXPECT_EQ(o->config, "deploy/local/cluster.yaml");
  EXPECT_EQ(o->model, "");
  EXPECT_EQ(o->listen_timeout, absl::Seconds(30));
  EXPECT_EQ(o->ready_timeout, absl::Seconds(60));
  o = ParseUpArgs({"--config", "c.yaml", "--model=m.gguf", "--ready-timeout-s", "5"});
  ASSERT_TRUE(o.ok()) << o.status();
  EXPECT_EQ(o->config, "c.yaml");
  EXPECT_EQ(o->model, "m.gguf");
  EXPECT_EQ(o->ready_timeout, absl::Seconds(5));
  EXPECT_EQ(ParseUpArgs({"now"}).status().message(), "unexpected argument 'now'");
  EXPECT_EQ(ParseUpArgs({"--ready-timeout-s", "0"}).status().message(),
            "--ready-timeout-s: must be > 0, got 0");
}

TEST(DialAddressTest, WildcardsBecomeLoopback) {
  EXPECT_EQ(DialAddress("0.0.0.0:50051"), "127.0.0.1:50051");
  EXPECT_EQ(DialAddress("[::]:7"), "[::1]:7");
  EXPECT_EQ(DialAddress("127.0.0.1:40000"), "127.0.0.1:40000");
  EXPECT_EQ(DialAddress("router.svc:1"), "router.svc:1");
  EXPECT_EQ(DialAddress("garbage"), "garbage");
}

}  // namespace
}  // namespace tandem::cli
