// ExpectedKvLayout (what the router requires of every worker) against the
// layout a worker really has: KvLayoutFor of the backend it builds.
#include "common/server/worker_engine.h"

#include "gtest/gtest.h"
#include "tests/test_util.h"

namespace tandem {
namespace {

TEST(ExpectedKvLayoutTest, EqualsTheLayoutOfTheBackendAWorkerBuilds) {
  for (const char* name : {"stories260K.gguf", "llama3-tiny-synth.gguf"}) {
    SCOPED_TRACE(name);
    auto model = LoadModelBundle(testing::SharedPath(std::string("models/") + name));
    ASSERT_TRUE(model.ok()) << model.status();
    for (int32_t block_size : {1, 16, 32}) {
      ClusterConfig config;
      config.engine.block_size = block_size;
      config.engine.num_kv_blocks = 4;
      std::unique_ptr<backend::ModelBackend> backend = CpuBackendFromConfig(config, **model);
      const kvtransfer::KvLayout worker =
          KvLayoutFor(backend->kv_storage(), (*model)->fingerprint);
      const kvtransfer::KvLayout expected = ExpectedKvLayout(config, **model);
      EXPECT_TRUE(kvtransfer::CheckCompatible(expected, worker).ok());
      EXPECT_EQ(expected.LayoutId(), worker.LayoutId());
    }
  }
  // Both spell the model: one model's id is not another's.
  auto a = LoadModelBundle(testing::SharedPath("models/stories260K.gguf"));
  auto b = LoadModelBundle(testing::SharedPath("models/llama3-tiny-synth.gguf"));
  ASSERT_TRUE(a.ok() && b.ok());
  EXPECT_NE(ExpectedKvLayout(ClusterConfig(), **a).LayoutId(),
            ExpectedKvLayout(ClusterConfig(), **b).LayoutId());
  EXPECT_EQ(ExpectedKvLayout(ClusterConfig(), **a).LayoutId(),
            "kv2/" + (*a)->fingerprint + "/L5.H4.D8/f32");
}

}  // namespace
}  // namespace tandem
