// ResolveWorkerSettings: a worker's flags over its config entry (issue #33:
// flag beats config, a missing key names the key).
#include "worker/worker_settings.h"

#include <map>
#include <string>

#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace tandem {
namespace {

using ::testing::HasSubstr;

constexpr char kConfig[] = R"(
model: /m/x.gguf
router: {name: r, listen: "127.0.0.1:7000"}
prefill_workers: [{name: p0, listen: "127.0.0.1:7001", metrics_listen: "127.0.0.1:9101"}]
decode_workers: [{name: d0, listen: "127.0.0.1:7002", kv_listen: "127.0.0.1:7003"},
                 {name: wild, listen: "0.0.0.0:7004", kv_listen: "0.0.0.0:7005"},
                 {name: kvwild, listen: "127.0.0.1:7006", kv_listen: "0.0.0.0:7007"}]
)";

absl::StatusOr<WorkerSettings> Resolve(v1::WorkerRole role,
                                       std::map<std::string, std::string> flags) {
  absl::StatusOr<ClusterConfig> config = ParseClusterConfig(kConfig);
  if (!config.ok()) return config.status();
  return ResolveWorkerSettings(role, std::move(flags), *std::move(config), "cluster.yaml");
}

TEST(WorkerSettingsTest, ConfigValuesWithoutFlags) {
  absl::StatusOr<WorkerSettings> s = Resolve(v1::ROLE_PREFILL, {{"name", "p0"}});
  ASSERT_TRUE(s.ok()) << s.status();
  EXPECT_EQ(s->name, "p0");
  EXPECT_EQ(s->entry_name, "p0");
  EXPECT_EQ(s->key_prefix, "prefill_workers[p0].");
  EXPECT_EQ(s->router, "127.0.0.1:7000");
  EXPECT_EQ(s->model_flag, "");
  ASSERT_TRUE(s->worker.metrics_listen.has_value());
  EXPECT_EQ(s->worker.metrics_listen->ToString(), "127.0.0.1:9101");
  EXPECT_TRUE(s->worker.advertise.empty());
}

TEST(WorkerSettingsTest, FlagBeatsConfig) {
  absl::StatusOr<WorkerSettings> s =
      Resolve(v1::ROLE_PREFILL, {{"name", "pod-7"},
                                 {"config-entry", "p0"},
                                 {"router", "router.svc:7100"},
                                 {"advertise", "10.1.2.3:7001"},
                                 {"metrics-listen", "127.0.0.1:9200"},
                                 {"model", "/other.gguf"}});
  ASSERT_TRUE(s.ok()) << s.status();
  EXPECT_EQ(s->name, "pod-7");
  EXPECT_EQ(s->entry_name, "p0");
  EXPECT_EQ(s->router, "router.svc:7100");
  EXPECT_EQ(s->worker.advertise.host, "10.1.2.3");
  ASSERT_TRUE(s->worker.metrics_listen.has_value());
  EXPECT_EQ(s->worker.metrics_listen->ToString(), "127.0.0.1:9200");
  EXPECT_EQ(s->model_flag, "/other.gguf");
}

TEST(WorkerSettingsTest, DecodeKvAdvertiseTakesTheAdvertiseHost) {
  absl::StatusOr<WorkerSettings> s =
      Resolve(v1::ROLE_DECODE, {{"name", "wild"}, {"advertise", "10.0.0.9"}});
  ASSERT_TRUE(s.ok()) << s.status();
  EXPECT_EQ(s->worker.kv_advertise.host, "10.0.0.9");
  s = Resolve(v1::ROLE_DECODE,
              {{"name", "wild"}, {"advertise", "10.0.0.9"}, {"kv-advertise", "10.0.0.10"}});
  ASSERT_TRUE(s.ok()) << s.status();
  EXPECT_EQ(s->worker.kv_advertise.host, "10.0.0.10");
}

TEST(WorkerSettingsTest, MissingNameNamesTheFlag) {
  absl::StatusOr<WorkerSettings> s = Resolve(v1::ROLE_DECODE, {});
  ASSERT_FALSE(s.ok());
  EXPECT_EQ(s.status().message(), "--name is required");
}

TEST(WorkerSettingsTest, MissingEntryNamesTheFlagAndTheList) {
  absl::StatusOr<WorkerSettings> s = Resolve(v1::ROLE_DECODE, {{"name", "p0"}});
  ASSERT_FALSE(s.ok());
  EXPECT_EQ(s.status().message(), "--name p0: no such entry in decode_workers of cluster.yaml");
  s = Resolve(v1::ROLE_PREFILL, {{"name", "x"}, {"config-entry", "gone"}});
  ASSERT_FALSE(s.ok());
  EXPECT_EQ(s.status().message(),
            "--config-entry gone: no such entry in prefill_workers of cluster.yaml");
}

TEST(WorkerSettingsTest, WildcardWithoutAdvertiseNamesTheKey) {
  absl::StatusOr<WorkerSettings> s = Resolve(v1::ROLE_DECODE, {{"name", "wild"}});
  ASSERT_FALSE(s.ok());
  EXPECT_THAT(s.status().message(), HasSubstr("decode_workers[wild].advertise"));
  s = Resolve(v1::ROLE_DECODE, {{"name", "kvwild"}});
  ASSERT_FALSE(s.ok());
  EXPECT_THAT(s.status().message(), HasSubstr("decode_workers[kvwild].kv_advertise"));
}

TEST(WorkerSettingsTest, BadFlagValuesNameTheFlag) {
  absl::StatusOr<WorkerSettings> s =
      Resolve(v1::ROLE_PREFILL, {{"name", "p0"}, {"router", "127.0.0.1:0"}});
  ASSERT_FALSE(s.ok());
  EXPECT_THAT(s.status().message(), HasSubstr("--router: port 0 cannot be dialled"));
  s = Resolve(v1::ROLE_PREFILL, {{"name", "p0"}, {"metrics-listen", "nope"}});
  ASSERT_FALSE(s.ok());
  EXPECT_THAT(s.status().message(), HasSubstr("--metrics-listen"));
  s = Resolve(v1::ROLE_PREFILL, {{"name", "p0"}, {"gpu-memory-fraction", "0.5"}});
  ASSERT_FALSE(s.ok());
  EXPECT_THAT(s.status().message(), HasSubstr("--gpu-memory-fraction"));
}

TEST(WorkerSettingsTest, EveryRoleTakesTheKvFlags) {
  // Every worker has a KV receiver: a prefill worker may become a decode
  // worker at run time (issue #35).
  const std::vector<std::string> names = WorkerFlagNames();
  EXPECT_THAT(names, ::testing::Contains("kv-advertise"));
  EXPECT_THAT(names, ::testing::Contains("name"));
}

TEST(WorkerSettingsTest, PrefillWorkerKvAdvertiseTakesTheAdvertiseHost) {
  ClusterConfig config;
  WorkerConfig p;
  p.name = "pw";
  p.listen = HostPort{"0.0.0.0", 0};
  p.kv_listen = HostPort{"0.0.0.0", 0};
  config.prefill_workers.push_back(p);
  auto s = ResolveWorkerSettings(v1::ROLE_PREFILL, {{"name", "pw"}, {"advertise", "10.0.0.9"}},
                                 config, "c.yaml");
  ASSERT_TRUE(s.ok()) << s.status();
  EXPECT_EQ(s->worker.kv_advertise.host, "10.0.0.9");
  s = ResolveWorkerSettings(v1::ROLE_PREFILL,
                            {{"name", "pw"}, {"advertise", "10.0.0.9"}, {"kv-advertise", "10.0.0.7"}},
                            config, "c.yaml");
  ASSERT_TRUE(s.ok()) << s.status();
  EXPECT_EQ(s->worker.kv_advertise.host, "10.0.0.7");
}

}  // namespace
}  // namespace tandem
