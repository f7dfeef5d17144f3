// ExpectedKvLayout (what the router requires of every worker) against the
// layout a worker really has: KvLayoutFor of the backend it builds; and
// StatusFromCore's copy of the core's counters.
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

// Every counter the router reads lands in its WorkerStatus field (each
// value distinct, so a swapped field shows).
TEST(StatusFromCoreTest, CopiesTheCoreCounters) {
  core::CoreStats stats;
  stats.running_requests = 7;
  stats.waiting_requests = 3;
  stats.queued_prefill_tokens = 5000000000ull;  // past 32 bits
  stats.kv_blocks_in_use = 11;
  stats.kv_blocks_total = 13;
  stats.kv_blocks_cached = 17;
  stats.transfers_in_flight = 19;
  stats.prefill_tokens_computed_total = 23;
  stats.kv_bytes_sent_total = 29;
  stats.kv_bytes_received_total = 31;
  stats.decode_tokens_total = 37;
  stats.max_decode_batch_size = 41;
  stats.preemptions_total = 43;
  stats.prompt_tokens_total = 47;
  stats.prompt_tokens_cached_total = 53;
  stats.generation_tokens_total = 59;
  stats.prefix_cache.queried_tokens = 61;
  stats.prefix_cache.hit_tokens = 67;
  stats.prefix_cache.lookups = 71;
  stats.engine_steps_total = 73;
  stats.kv_transfers_sent_total = 79;
  stats.kv_transfers_received_total = 83;
  stats.kv_transfer_seconds_sent_total = 0.125;
  stats.kv_transfer_seconds_received_total = 2.5;
  const v1::WorkerStatus s = StatusFromCore(stats, "layout", "class");
  EXPECT_EQ(s.running_requests(), 7u);
  EXPECT_EQ(s.waiting_requests(), 3u);
  EXPECT_EQ(s.queued_prefill_tokens(), 5000000000ull);
  EXPECT_EQ(s.kv_blocks_in_use(), 11u);
  EXPECT_EQ(s.kv_blocks_total(), 13u);
  EXPECT_EQ(s.kv_blocks_cached(), 17u);
  EXPECT_EQ(s.transfers_in_flight(), 19u);
  EXPECT_EQ(s.prefill_tokens_computed_total(), 23u);
  EXPECT_EQ(s.kv_bytes_sent_total(), 29u);
  EXPECT_EQ(s.kv_bytes_received_total(), 31u);
  EXPECT_EQ(s.decode_tokens_total(), 37u);
  EXPECT_EQ(s.max_decode_batch_size(), 41u);
  EXPECT_EQ(s.preemptions_total(), 43u);
  EXPECT_EQ(s.prompt_tokens_total(), 47u);
  EXPECT_EQ(s.prompt_tokens_cached_total(), 53u);
  EXPECT_EQ(s.generation_tokens_total(), 59u);
  EXPECT_EQ(s.prefix_cache_queried_tokens_total(), 61u);
  EXPECT_EQ(s.prefix_cache_hit_tokens_total(), 67u);
  EXPECT_EQ(s.engine_steps_total(), 73u);
  EXPECT_EQ(s.kv_transfers_sent_total(), 79u);
  EXPECT_EQ(s.kv_transfers_received_total(), 83u);
  EXPECT_EQ(s.kv_transfer_seconds_sent_total(), 0.125);
  EXPECT_EQ(s.kv_transfer_seconds_received_total(), 2.5);
  EXPECT_EQ(s.kv_layout_id(), "layout");
  EXPECT_EQ(s.bit_exact_class(), "class");
}

// The router's prefix index hashes prompts with the model file's
// fingerprint (RegistryOptions::model_fingerprint = ModelBundle::
// fingerprint): the workers' engines must mix in exactly that string. KV
// events are wired only with prefix caching on.
TEST(CoreOptionsFromConfigTest, FingerprintIsTheModelFilesAndEventsNeedPrefixCaching) {
  auto model = LoadModelBundle(testing::SharedPath("models/stories260K.gguf"));
  ASSERT_TRUE(model.ok()) << model.status();
  ClusterConfig config;
  KvEventPublisher publisher(KvEventPublisherOptions{config.engine.block_size, 1});
  config.engine.enable_prefix_caching = true;
  core::EngineCoreOptions on = CoreOptionsFromConfig(config, **model, "decode worker", &publisher);
  EXPECT_EQ(on.model_fingerprint, (*model)->fingerprint);
  ASSERT_TRUE(on.kv_event_sink != nullptr);
  on.kv_event_sink({{kv::KvCacheEvent::Kind::kStored, kv::BlockHash{1, 2}}});
  EXPECT_EQ(publisher.last_sequence(), 1u);
  EXPECT_EQ(publisher.num_cached(), 1u);
  EXPECT_EQ(CoreOptionsFromConfig(config, **model, "decode worker").kv_event_sink, nullptr);
  config.engine.enable_prefix_caching = false;
  EXPECT_EQ(CoreOptionsFromConfig(config, **model, "decode worker", &publisher).kv_event_sink,
            nullptr);
}

}  // namespace
}  // namespace tandem
