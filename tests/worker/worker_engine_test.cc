// ExpectedKvLayout (what the router requires of every worker) against the
// layout a worker really has: KvLayoutFor of the backend it builds;
// StatusFromCore's copy of the core's counters; WithBackendFault (the
// workers' --fault-backend-error) over the CPU backend under a real core.
#include "worker/worker_engine.h"

#include "absl/strings/str_cat.h"
#include "engine/backend/fault_injecting_backend.h"
#include "engine/scheduler/prefill_placement.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "tests/engine/backend/fake_device_query.h"
#include "tests/engine/core/recording_sink.h"
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
      const WorkerConfig worker;
      auto backend = BackendFromConfig(config, **model, worker);
      ASSERT_TRUE(backend.ok()) << backend.status();
      EXPECT_EQ((*backend)->kv_storage().num_blocks(), 4);
      const kvtransfer::KvLayout built =
          KvLayoutFor((*backend)->kv_storage(), (*model)->fingerprint);
      const kvtransfer::KvLayout expected = ExpectedKvLayout(config, **model, worker);
      EXPECT_TRUE(kvtransfer::CheckCompatible(expected, built).ok());
      EXPECT_EQ(expected.LayoutId(), built.LayoutId());
    }
  }
  // Both spell the model: one model's id is not another's.
  auto a = LoadModelBundle(testing::SharedPath("models/stories260K.gguf"));
  auto b = LoadModelBundle(testing::SharedPath("models/llama3-tiny-synth.gguf"));
  ASSERT_TRUE(a.ok() && b.ok());
  EXPECT_NE(ExpectedKvLayout(ClusterConfig(), **a, WorkerConfig()).LayoutId(),
            ExpectedKvLayout(ClusterConfig(), **b, WorkerConfig()).LayoutId());
  EXPECT_EQ(ExpectedKvLayout(ClusterConfig(), **a, WorkerConfig()).LayoutId(),
            "kv4/" + (*a)->fingerprint + "/L5.H4.D8/f32");
}

// A mixed cluster: each worker's expected layout follows its own entry's
// device (cuda: bf16 unless engine.kv_cache_dtype says otherwise).
TEST(ExpectedKvLayoutTest, FollowsEachWorkersDeviceAndKvDtype) {
  auto model = LoadModelBundle(testing::SharedPath("models/stories260K.gguf"));
  ASSERT_TRUE(model.ok()) << model.status();
  auto config = ParseClusterConfig(
      "decode_workers:\n  - {name: gpu, device: \"cuda:0\"}\n  - {name: host}\n");
  ASSERT_TRUE(config.ok()) << config.status();
  const std::string prefix = "kv4/" + (*model)->fingerprint + "/L5.H4.D8/";
  EXPECT_EQ(ExpectedKvLayout(*config, **model, *config->FindWorker("gpu")).LayoutId(),
            prefix + "bf16");
  EXPECT_EQ(ExpectedKvLayout(*config, **model, *config->FindWorker("host")).LayoutId(),
            prefix + "f32");
  EXPECT_EQ(ExpectedKvLayout(*config, **model, WorkerConfig()).LayoutId(), prefix + "f32");
  config->engine.kv_cache_dtype = kv::KvDtype::kF16;
  EXPECT_EQ(ExpectedKvLayout(*config, **model, *config->FindWorker("gpu")).LayoutId(),
            prefix + "f16");
}

// CPU workers hold engine.kv_cache_dtype (f16/bf16 since issue #19): the
// layout a CPU backend really has names its dtype, so a prefill worker
// with F32 KV and a decode worker with F16 KV are refused by the KV
// handshake's layout check (FAILED_PRECONDITION naming the dtype field).
TEST(ExpectedKvLayoutTest, CpuWorkersWithDifferentKvDtypesAreIncompatible) {
  auto model = LoadModelBundle(testing::SharedPath("models/stories260K.gguf"));
  ASSERT_TRUE(model.ok()) << model.status();
  const std::string prefix = "kv4/" + (*model)->fingerprint + "/L5.H4.D8/";
  std::vector<kvtransfer::KvLayout> layouts;
  for (kv::KvDtype dtype : {kv::KvDtype::kF32, kv::KvDtype::kF16, kv::KvDtype::kBF16}) {
    ClusterConfig config;
    config.engine.num_kv_blocks = 4;
    config.engine.kv_cache_dtype = dtype;
    const WorkerConfig worker;
    auto backend = BackendFromConfig(config, **model, worker);
    ASSERT_TRUE(backend.ok()) << backend.status();
    EXPECT_EQ((*backend)->kv_storage().dtype(), dtype);
    layouts.push_back(KvLayoutFor((*backend)->kv_storage(), (*model)->fingerprint));
    EXPECT_EQ(layouts.back().LayoutId(), prefix + kv::KvDtypeName(dtype));
    EXPECT_EQ(ExpectedKvLayout(config, **model, worker).LayoutId(), layouts.back().LayoutId());
  }
  const absl::Status f32_vs_f16 = kvtransfer::CheckCompatible(layouts[0], layouts[1]);
  EXPECT_EQ(f32_vs_f16.code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_EQ(f32_vs_f16.message(), "KV layout mismatch in field 'dtype': local f32, remote f16");
  EXPECT_EQ(kvtransfer::CheckCompatible(layouts[1], layouts[2]).message(),
            "KV layout mismatch in field 'dtype': local f16, remote bf16");
  EXPECT_TRUE(kvtransfer::CheckCompatible(layouts[1], layouts[1]).ok());
}

TEST(BackendOptionsFromConfigTest, CopiesTheWorkersDeviceAndEngineKeys) {
  auto config = ParseClusterConfig(R"(
decode_workers:
  - {name: d0, device: "cuda:1"}
  - {name: d1}
engine: {block_size: 8, num_kv_blocks: 100, max_num_seqs: 3, max_num_batched_tokens: 99,
         gpu_memory_fraction: 0.5}
)");
  ASSERT_TRUE(config.ok()) << config.status();
  config->engine.batch_invariant = false;  // (the file may not say so with a cpu worker)
  backend::BackendOptions o = BackendOptionsFromConfig(*config, config->decode_workers[0]);
  EXPECT_EQ(o.device.ToString(), "cuda:1");
  EXPECT_EQ(o.device_key, "decode_workers[d0].device");
  EXPECT_EQ(o.kv_cache_dtype, kv::KvDtype::kBF16);
  EXPECT_EQ(o.block_size, 8);
  EXPECT_EQ(o.num_kv_blocks, 100);
  EXPECT_TRUE(o.num_kv_blocks_set);
  EXPECT_EQ(o.gpu_memory_fraction, 0.5);
  EXPECT_FALSE(o.batch_invariant);
  EXPECT_EQ(o.max_num_batched_tokens, 99);
  EXPECT_EQ(o.max_num_seqs, 3);
  EXPECT_EQ(o.q8_matmul, model::Q8MatMul::kExact);
  EXPECT_NE(o.log, nullptr);
  o = BackendOptionsFromConfig(*config, config->decode_workers[1]);
  EXPECT_EQ(o.device.ToString(), "cpu");
  EXPECT_EQ(o.device_key, "engine.device");
  EXPECT_EQ(o.kv_cache_dtype, kv::KvDtype::kF32);
  config->engine.q8_matmul = model::Q8MatMul::kInt8;
  EXPECT_EQ(BackendOptionsFromConfig(*config, config->decode_workers[1]).q8_matmul,
            model::Q8MatMul::kInt8);
}

TEST(BackendFromConfigTest, RefusalsNameTheKeyInOneLine) {
  auto model = LoadModelBundle(testing::SharedPath("models/stories260K.gguf"));
  ASSERT_TRUE(model.ok()) << model.status();
  // The config file refuses this too (cluster_config_test); the factory
  // is the last line for configurations built in code.
  auto variant = ParseClusterConfig("decode_workers: [{name: d}]\n");
  ASSERT_TRUE(variant.ok()) << variant.status();
  variant->engine.batch_invariant = false;
  auto refused = BackendFromConfig(*variant, **model, variant->decode_workers[0]);
  ASSERT_FALSE(refused.ok());
  EXPECT_EQ(refused.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(refused.status().message(),
            "engine.batch_invariant: false on engine.device cpu, but the CPU backend is always "
            "batch-invariant (remove the key or set it true)");

  auto gpu = ParseClusterConfig("decode_workers: [{name: d, device: \"cuda:2\"}]\n");
  ASSERT_TRUE(gpu.ok()) << gpu.status();
  backend::FakeDeviceQuery one({backend::FakeH200(0)});
  auto missing = BackendFromConfig(*gpu, **model, gpu->decode_workers[0], one);
  ASSERT_FALSE(missing.ok());
  EXPECT_EQ(missing.status().code(), absl::StatusCode::kFailedPrecondition);
  if (backend::HasCudaBackend()) {
    EXPECT_EQ(missing.status().message(),
              "decode_workers[d].device: cuda:2, but this machine has 1 CUDA GPU (cuda:0)");
  }
}

// On this machine (no GPU): engine.device cuda:0 is refused with the real
// device query, naming engine.device.
TEST(BackendFromConfigTest, Cuda0WithoutAGpuIsRefused) {
  if (backend::SystemDeviceQuery().DeviceCount(nullptr) > 0) {
    GTEST_SKIP() << "a CUDA GPU is present";
  }
  auto model = LoadModelBundle(testing::SharedPath("models/stories260K.gguf"));
  ASSERT_TRUE(model.ok()) << model.status();
  auto config = ParseClusterConfig("decode_workers: [{name: d}]\nengine: {device: \"cuda:0\"}\n");
  ASSERT_TRUE(config.ok()) << config.status();
  auto refused = BackendFromConfig(*config, **model, config->decode_workers[0]);
  ASSERT_FALSE(refused.ok());
  EXPECT_EQ(refused.status().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_THAT(std::string(refused.status().message()),
              ::testing::StartsWith("engine.device: cuda:0, but this "));
  EXPECT_THAT(std::string(refused.status().message()), ::testing::Not(::testing::HasSubstr("\n")));
}

TEST(ParseGpuMemoryFractionFlagTest, InZeroOneOnACudaWorkerOnly) {
  const backend::DeviceSpec cuda{backend::DeviceSpec::Kind::kCuda, 0};
  auto half = ParseGpuMemoryFractionFlag("0.45", cuda);
  ASSERT_TRUE(half.ok()) << half.status();
  EXPECT_EQ(*half, 0.45);
  EXPECT_EQ(*ParseGpuMemoryFractionFlag("1", cuda), 1.0);
  for (const char* bad : {"0", "-0.1", "1.5"}) {
    EXPECT_EQ(ParseGpuMemoryFractionFlag(bad, cuda).status().message(),
              absl::StrCat("--gpu-memory-fraction: must be in (0, 1], got ", bad));
  }
  for (const char* bad : {"", "half", "nan", "inf", "0.5x"}) {
    EXPECT_EQ(ParseGpuMemoryFractionFlag(bad, cuda).status().message(),
              absl::StrCat("--gpu-memory-fraction: expected a number, got '", bad, "'"));
  }
  EXPECT_EQ(ParseGpuMemoryFractionFlag("0.5", backend::DeviceSpec{}).status().message(),
            "--gpu-memory-fraction: this worker runs on cpu (no GPU memory to divide)");
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

// conditional.placement and slo reach the scheduler (issue #34): the
// parsed config's placement as the scheduler's policy, each objective in
// ms, 0 for one not set.
TEST(CoreOptionsFromConfigTest, PlacementAndSloReachTheScheduler) {
  auto model = LoadModelBundle(testing::SharedPath("models/stories260K.gguf"));
  ASSERT_TRUE(model.ok()) << model.status();
  struct Case {
    const char* yaml;
    scheduler::PlacementPolicy placement;
    double ttft_ms;
    double tpot_ms;
  };
  const Case cases[] = {
      {"", scheduler::PlacementPolicy::kThreshold, 0, 0},
      {"slo: {ttft_ms: 2000, tpot_ms: 50}\n", scheduler::PlacementPolicy::kSlo, 2000, 50},
      {"slo: {tpot_ms: 12.5}\n", scheduler::PlacementPolicy::kSlo, 0, 12.5},
      {"slo: {ttft_ms: 800}\nconditional: {placement: threshold}\n",
       scheduler::PlacementPolicy::kThreshold, 800, 0},
  };
  for (const Case& c : cases) {
    absl::StatusOr<ClusterConfig> config =
        ParseClusterConfig(std::string("decode_workers: [{name: d}]\n") + c.yaml);
    ASSERT_TRUE(config.ok()) << c.yaml << ": " << config.status();
    const core::EngineCoreOptions o = CoreOptionsFromConfig(*config, **model, "decode worker");
    EXPECT_EQ(o.scheduler.placement, c.placement) << c.yaml;
    EXPECT_EQ(o.scheduler.slo_ttft_ms, c.ttft_ms) << c.yaml;
    EXPECT_EQ(o.scheduler.slo_tpot_ms, c.tpot_ms) << c.yaml;
  }
}

// The CPU backend a worker of `config` builds (engine.device cpu).
std::unique_ptr<backend::ModelBackend> CpuBackendForTest(const ClusterConfig& config,
                                                         const ModelBundle& model) {
  auto backend = BackendFromConfig(config, model, WorkerConfig{});
  EXPECT_TRUE(backend.ok()) << backend.status();
  return backend.ok() ? *std::move(backend) : nullptr;
}

TEST(WithBackendFaultTest, WithoutTheFlagTheBackendIsUnchanged) {
  auto model = LoadModelBundle(testing::SharedPath("models/stories260K.gguf"));
  ASSERT_TRUE(model.ok()) << model.status();
  std::unique_ptr<backend::ModelBackend> cpu = CpuBackendForTest(ClusterConfig(), **model);
  backend::ModelBackend* raw = cpu.get();
  auto same = WithBackendFault({{"name", "decode-0"}}, std::move(cpu));
  ASSERT_TRUE(same.ok()) << same.status();
  EXPECT_EQ(same->get(), raw);
}

TEST(WithBackendFaultTest, BadValueIsRefusedNamingTheFlag) {
  auto model = LoadModelBundle(testing::SharedPath("models/stories260K.gguf"));
  ASSERT_TRUE(model.ok()) << model.status();
  auto refused = WithBackendFault({{"fault-backend-error", "internal@zero"}},
                                  CpuBackendForTest(ClusterConfig(), **model));
  ASSERT_FALSE(refused.ok());
  EXPECT_EQ(refused.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(refused.status().message(),
            "--fault-backend-error: 'internal@zero': N 'zero' is not an integer >= 1; "
            "expected KIND@N with KIND oom, internal or sticky and N >= 1 (the N-th forward "
            "call fails), or slow@N (N >= 1 ms added to every forward call)");
}

// Greedy ids of `prompts` (one running sequence at a time, in order) from a
// core over the CPU backend built as a worker builds it, with `flags`.
std::vector<std::shared_ptr<core::testing::RecordingSink>> RunCore(
    const ModelBundle& model, const std::map<std::string, std::string>& flags,
    const std::vector<std::vector<int32_t>>& prompts, core::CoreStats* stats) {
  ClusterConfig config;
  config.engine.num_kv_blocks = 32;
  auto backend = WithBackendFault(flags, CpuBackendForTest(config, model));
  EXPECT_TRUE(backend.ok()) << backend.status();
  core::EngineCoreOptions options = CoreOptionsFromConfig(config, model, "decode worker");
  options.scheduler.max_num_seqs = 1;  // the others wait outside the failing step
  core::EngineCore core(options, *std::move(backend), nullptr);
  std::vector<std::shared_ptr<core::testing::RecordingSink>> sinks;
  for (size_t i = 0; i < prompts.size(); ++i) {
    auto sink = std::make_shared<core::testing::RecordingSink>();
    core::EngineRequest r;
    r.request_id = "r" + std::to_string(i);
    r.prompt = prompts[i];
    r.max_tokens = 6;
    r.controls.ignore_eos = true;
    r.output = sink;
    const absl::Status submitted = core.Submit(std::move(r));
    EXPECT_TRUE(submitted.ok()) << submitted;
    sinks.push_back(sink);
  }
  for (const auto& sink : sinks) EXPECT_TRUE(sink->WaitFinish(absl::Seconds(30)));
  // The last OnFinish runs after the blocks are freed.
  *stats = core.GetStats();
  return sinks;
}

// internal@3: the first request's third forward (its second decode) fails
// with INTERNAL after two tokens; the second request, not in that step,
// gets exactly the ids it gets without the fault; every block comes back.
TEST(WithBackendFaultTest, CoreOverTheCpuBackendFailsOnlyTheFaultedStep) {
  auto model = LoadModelBundle(testing::SharedPath("models/stories260K.gguf"));
  ASSERT_TRUE(model.ok()) << model.status();
  const std::vector<std::vector<int32_t>> prompts = {{1, 403, 407, 263}, {1, 365, 251, 289}};
  core::CoreStats clean_stats, faulty_stats;
  auto clean = RunCore(**model, {}, prompts, &clean_stats);
  auto faulty =
      RunCore(**model, {{"fault-backend-error", "internal@3"}}, prompts, &faulty_stats);
  ASSERT_EQ(clean[0]->token_ids().size(), 6u);
  ASSERT_EQ(clean[1]->token_ids().size(), 6u);
  ASSERT_TRUE(faulty[0]->finish().has_value());
  EXPECT_EQ(faulty[0]->finish()->status.code(), absl::StatusCode::kInternal)
      << faulty[0]->finish()->status;
  const std::vector<int32_t> clean0 = clean[0]->token_ids();
  EXPECT_EQ(faulty[0]->token_ids(), std::vector<int32_t>(clean0.begin(), clean0.begin() + 2));
  ASSERT_TRUE(faulty[1]->finish().has_value());
  EXPECT_TRUE(faulty[1]->finish()->status.ok()) << faulty[1]->finish()->status;
  EXPECT_EQ(faulty[1]->token_ids(), clean[1]->token_ids());
  EXPECT_EQ(faulty_stats.kv_blocks_in_use, 0u);
  EXPECT_EQ(faulty_stats.running_requests, 0u);
  EXPECT_EQ(faulty_stats.forward_errors_total, 1u);
  EXPECT_EQ(clean_stats.forward_errors_total, 0u);
}

}  // namespace
}  // namespace tandem
