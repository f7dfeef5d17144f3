// The engine core over a FakeBackend for the core's tests: the suites'
// default options and a harness that submits requests and waits for the
// core to go idle.
#ifndef TANDEM_TESTS_ENGINE_CORE_CORE_HARNESS_H_
#define TANDEM_TESTS_ENGINE_CORE_CORE_HARNESS_H_

#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "absl/time/clock.h"
#include "engine/backend/fault_injecting_backend.h"
#include "engine/core/engine_core.h"
#include "gtest/gtest.h"
#include "tests/engine/core/fake_backend.h"
#include "tests/engine/core/recording_sink.h"

namespace tandem::core::testing {

constexpr int32_t kBlockSize = 4;

// Budget 64 tokens, 8 sequences, chunks of 16, prefix caching on, remote
// prefill above 32 tokens, EOS = kFakeUnusedToken.
inline EngineCoreOptions Options() {
  EngineCoreOptions o;
  o.scheduler.max_num_batched_tokens = 64;
  o.scheduler.max_num_seqs = 8;
  o.scheduler.prefill_chunk_tokens = 16;
  o.scheduler.enable_prefix_caching = true;
  o.scheduler.max_local_prefill_tokens = 32;
  o.eog_token_ids = {testing::kFakeUnusedToken};
  o.model_fingerprint = "fake-model";
  o.worker_label = "test worker";
  return o;
}

// The core over a FakeBackend of `num_blocks` blocks, with `loader` (may be
// null) and, with `fault`, the fake wrapped in a FaultInjectingBackend.
// Keeps raw pointers to the fakes, which the core owns.
struct Harness {
  explicit Harness(int32_t num_blocks, std::unique_ptr<FakeLoader> fake_loader = nullptr,
                   EngineCoreOptions options = Options(),
                   std::optional<backend::BackendFault> fault = std::nullopt) {
    auto b = std::make_unique<FakeBackend>(kBlockSize, num_blocks);
    backend = b.get();
    loader = fake_loader.get();
    std::unique_ptr<backend::ModelBackend> top = std::move(b);
    if (fault.has_value()) {
      auto f = std::make_unique<backend::FaultInjectingBackend>(std::move(top), *fault);
      faulty = f.get();
      top = std::move(f);
    }
    core = std::make_unique<EngineCore>(options, std::move(top), std::move(fake_loader));
  }

  std::shared_ptr<RecordingSink> Submit(const std::string& id, std::vector<int32_t> prompt,
                                        int32_t max_tokens,
                                        RouteChoice route = RouteChoice::kAuto) {
    auto sink = std::make_shared<RecordingSink>();
    EngineRequest r;
    r.request_id = id;
    r.prompt = std::move(prompt);
    r.max_tokens = max_tokens;
    r.route = route;
    r.output = sink;
    absl::Status s = core->Submit(std::move(r));
    EXPECT_TRUE(s.ok()) << id << ": " << s;
    return sink;
  }

  // Waits (bounded) until the core holds no KV block and no request.
  bool WaitIdle() {
    const absl::Time deadline = absl::Now() + absl::Seconds(3);
    while (absl::Now() < deadline) {
      CoreStats s = core->GetStats();
      if (s.kv_blocks_in_use == 0 && s.running_requests == 0) return true;
      absl::SleepFor(absl::Milliseconds(1));
    }
    return false;
  }

  FakeBackend* backend = nullptr;
  backend::FaultInjectingBackend* faulty = nullptr;  // with a fault
  FakeLoader* loader = nullptr;
  std::unique_ptr<EngineCore> core;
};

}  // namespace tandem::core::testing

#endif  // TANDEM_TESTS_ENGINE_CORE_CORE_HARNESS_H_
