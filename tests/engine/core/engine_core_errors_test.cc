// Backend errors in the engine core (DESIGN.md, GPU workers: errors), with
// the fake backend wrapped in backend::FaultInjectingBackend: a failed
// Forward fails exactly the requests of that step, with the error's code,
// and frees their blocks, while the others go on with the tokens they
// would have had anyway; a lost device fails every request with
// UNAVAILABLE, refuses new ones and calls on_device_lost once. Also the
// decorator itself and its flag parser.
#include <memory>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/clock.h"
#include "absl/time/time.h"
#include "engine/backend/fault_injecting_backend.h"
#include "engine/core/engine_core.h"
#include "gtest/gtest.h"
#include "tests/engine/core/core_harness.h"
#include "tests/engine/core/fake_backend.h"
#include "tests/engine/core/recording_sink.h"

namespace tandem::core {
namespace {

using backend::BackendFault;
using backend::FaultInjectingBackend;
using backend::ParseBackendFault;
using testing::FakeBackend;
using testing::FakeExport;
using testing::FakeGenerate;
using testing::FakeLoader;
using testing::FakePrompt;
using testing::Harness;
using testing::Options;
using testing::RecordingSink;

BackendFault Fault(BackendFault::Kind kind, int64_t call) {
  BackendFault f;
  f.kind = kind;
  f.call = call;
  return f;
}

// The request ended once, with `code`, and its message has `part`.
void ExpectFailed(const RecordingSink& sink, absl::StatusCode code, const std::string& part) {
  std::optional<testing::SinkEvent> f = sink.finish();
  ASSERT_TRUE(f.has_value());
  EXPECT_EQ(f->status.code(), code) << f->status;
  EXPECT_NE(f->status.message().find(part), absl::string_view::npos) << f->status;
  EXPECT_EQ(sink.finish_calls(), 1);
}

void ExpectOk(const RecordingSink& sink) {
  std::optional<testing::SinkEvent> f = sink.finish();
  ASSERT_TRUE(f.has_value());
  EXPECT_TRUE(f->status.ok()) << f->status;
}

TEST(BackendFaultTest, ParsesKindAndCall) {
  absl::StatusOr<BackendFault> f = ParseBackendFault("oom@3", "--fault-backend-error");
  ASSERT_TRUE(f.ok()) << f.status();
  EXPECT_EQ(f->kind, BackendFault::Kind::kOom);
  EXPECT_EQ(f->call, 3);
  f = ParseBackendFault("internal@1", "--f");
  ASSERT_TRUE(f.ok()) << f.status();
  EXPECT_EQ(f->kind, BackendFault::Kind::kInternal);
  EXPECT_EQ(f->call, 1);
  f = ParseBackendFault("sticky@12", "--f");
  ASSERT_TRUE(f.ok()) << f.status();
  EXPECT_EQ(f->kind, BackendFault::Kind::kSticky);
  EXPECT_EQ(f->call, 12);
  EXPECT_EQ(backend::BackendFaultToString(*f), "sticky@12");
  f = ParseBackendFault("slow@250", "--f");
  ASSERT_TRUE(f.ok()) << f.status();
  EXPECT_EQ(f->kind, BackendFault::Kind::kSlow);
  EXPECT_EQ(f->call, 250);
  EXPECT_EQ(backend::BackendFaultToString(*f), "slow@250");
}

TEST(BackendFaultTest, RefusesBadValuesNamingTheFlag) {
  for (const char* bad : {"", "oom", "oom@", "oom@0", "oom@-1", "oom@x", "oom@2x", "OOM@1",
                          "crash@1", "@1", "oom@1@2", "slow@0"}) {
    absl::StatusOr<BackendFault> f = ParseBackendFault(bad, "--fault-backend-error");
    ASSERT_FALSE(f.ok()) << bad;
    EXPECT_EQ(f.status().code(), absl::StatusCode::kInvalidArgument) << bad;
    EXPECT_NE(f.status().message().find("--fault-backend-error: '"), absl::string_view::npos)
        << f.status();
    EXPECT_NE(f.status().message().find("KIND@N"), absl::string_view::npos) << f.status();
  }
}

// Forward over an empty batch: only the decorator's call counting matters.
absl::Status Call(FaultInjectingBackend& b) {
  std::vector<sampling::SamplingView> views;
  return b.Forward({}, nullptr, &views);
}

TEST(FaultInjectingBackendTest, RecoverableFaultsFailOnlyTheNthCall) {
  for (const auto& [kind, code] :
       {std::pair{BackendFault::Kind::kOom, absl::StatusCode::kResourceExhausted},
        std::pair{BackendFault::Kind::kInternal, absl::StatusCode::kInternal}}) {
    auto fake = std::make_unique<FakeBackend>(4, 8);
    FakeBackend* inner = fake.get();
    FaultInjectingBackend b(std::move(fake), Fault(kind, 2));
    EXPECT_TRUE(Call(b).ok());
    const absl::Status failed = Call(b);
    EXPECT_EQ(failed.code(), code) << failed;
    EXPECT_NE(failed.message().find("forward call 2"), absl::string_view::npos) << failed;
    EXPECT_FALSE(b.device_lost());
    EXPECT_TRUE(Call(b).ok());
    EXPECT_FALSE(b.device_lost());
    EXPECT_EQ(inner->forward_calls(), 2);  // the failed call computed nothing
    EXPECT_EQ(b.forward_calls(), 3);
  }
}

TEST(FaultInjectingBackendTest, StickyFaultFailsEveryLaterCallAndLosesTheDevice) {
  auto fake = std::make_unique<FakeBackend>(4, 8);
  FakeBackend* inner = fake.get();
  FaultInjectingBackend b(std::move(fake), Fault(BackendFault::Kind::kSticky, 2));
  EXPECT_TRUE(Call(b).ok());
  EXPECT_FALSE(b.device_lost());
  EXPECT_EQ(Call(b).code(), absl::StatusCode::kInternal);
  EXPECT_TRUE(b.device_lost());
  EXPECT_EQ(Call(b).code(), absl::StatusCode::kInternal);
  EXPECT_TRUE(b.device_lost());
  EXPECT_EQ(inner->forward_calls(), 1);
  EXPECT_EQ(b.kv_storage().num_blocks(), 8);
  EXPECT_EQ(b.bit_exact_class(), "fake/v1");
}

TEST(FaultInjectingBackendTest, SlowFaultDelaysEveryCallAndComputesIt) {
  auto fake = std::make_unique<FakeBackend>(4, 8);
  FakeBackend* inner = fake.get();
  FaultInjectingBackend b(std::move(fake), Fault(BackendFault::Kind::kSlow, 30));
  for (int i = 0; i < 3; ++i) {
    const absl::Time start = absl::Now();
    EXPECT_TRUE(Call(b).ok());
    EXPECT_GE(absl::Now() - start, absl::Milliseconds(30));
  }
  EXPECT_FALSE(b.device_lost());
  EXPECT_EQ(inner->forward_calls(), 3);  // every call computed
}

// One running sequence at a time: "b" waits in the queue while "a" runs,
// so the failing step (a's first decode) holds "a" alone. "a" fails with
// INTERNAL after its token 0, "b" then generates exactly what the model
// gives alone, and no block is left in use.
TEST(EngineCoreErrorsTest, RecoverableErrorFailsOnlyThatStepsRequests) {
  EngineCoreOptions o = Options();
  o.scheduler.max_num_seqs = 1;
  std::vector<std::string> lines;
  absl::Mutex lines_mu;
  o.log = [&](const std::string& line) {
    absl::MutexLock lock(&lines_mu);
    lines.push_back(line);
  };
  Harness h(64, nullptr, o, Fault(BackendFault::Kind::kInternal, 2));
  const std::vector<int32_t> a_prompt = FakePrompt(10, 1);
  const std::vector<int32_t> b_prompt = FakePrompt(10, 2);
  auto a = h.Submit("a", a_prompt, 8);
  auto b = h.Submit("b", b_prompt, 8);
  ASSERT_TRUE(a->WaitFinish());
  ASSERT_TRUE(b->WaitFinish());
  ExpectFailed(*a, absl::StatusCode::kInternal, "test worker: device error in a forward step: ");
  ExpectFailed(*a, absl::StatusCode::kInternal, "forward call 2");
  EXPECT_EQ(a->token_ids(), FakeGenerate(a_prompt, 1));
  ExpectOk(*b);
  EXPECT_EQ(b->token_ids(), FakeGenerate(b_prompt, 8));
  ASSERT_TRUE(h.WaitIdle());
  const CoreStats s = h.core->GetStats();
  EXPECT_EQ(s.kv_blocks_in_use, 0u);
  EXPECT_EQ(s.running_requests, 0u);
  EXPECT_EQ(s.forward_errors_total, 1u);
  EXPECT_FALSE(s.device_lost);
  // a: 1 step; b: 8 steps; the failed one is not counted.
  EXPECT_EQ(s.engine_steps_total, 9u);
  EXPECT_EQ(h.faulty->forward_calls(), 10);
  absl::MutexLock lock(&lines_mu);
  ASSERT_EQ(lines.size(), 1u);
  EXPECT_NE(lines[0].find("failing 1 request(s): a"), std::string::npos) << lines[0];
}

// Both requests in the failing step end with RESOURCE_EXHAUSTED; a request
// submitted afterwards runs normally, and the blocks all came back.
TEST(EngineCoreErrorsTest, OutOfMemoryFailsEveryRequestOfTheStep) {
  Harness h(64, nullptr, Options(), Fault(BackendFault::Kind::kOom, 2));
  const std::vector<int32_t> a_prompt = FakePrompt(6, 3);
  const std::vector<int32_t> b_prompt = FakePrompt(7, 4);
  auto a = std::make_shared<RecordingSink>();
  a->GateAtToken(0);  // the loop waits inside step 1 (a's prefill)
  EngineRequest ra;
  ra.request_id = "a";
  ra.prompt = a_prompt;
  ra.max_tokens = 8;
  ra.output = a;
  ASSERT_TRUE(h.core->Submit(std::move(ra)).ok());
  ASSERT_TRUE(a->WaitGated());
  auto b = h.Submit("b", b_prompt, 8);  // joins step 2 with a's decode
  a->Release();
  ASSERT_TRUE(a->WaitFinish());
  ASSERT_TRUE(b->WaitFinish());
  ExpectFailed(*a, absl::StatusCode::kResourceExhausted, "out of memory");
  ExpectFailed(*b, absl::StatusCode::kResourceExhausted, "out of memory");
  EXPECT_EQ(a->token_ids(), FakeGenerate(a_prompt, 1));
  EXPECT_TRUE(b->token_ids().empty());
  ASSERT_TRUE(h.WaitIdle());
  EXPECT_EQ(h.core->GetStats().kv_blocks_in_use, 0u);
  auto c = h.Submit("c", b_prompt, 5);
  ASSERT_TRUE(c->WaitFinish());
  ExpectOk(*c);
  EXPECT_EQ(c->token_ids(), FakeGenerate(b_prompt, 5));
  ASSERT_TRUE(h.WaitIdle());
  EXPECT_EQ(h.core->GetStats().forward_errors_total, 1u);
}

// A prefill-only request whose step fails: its export is closed without a
// Finish (the receiver sees the transfer fail), its blocks are freed, and
// the next prefill-only request exports normally.
TEST(EngineCoreErrorsTest, FailedStepClosesAPrefillOnlyRequestsExport) {
  Harness h(64, nullptr, Options(), Fault(BackendFault::Kind::kInternal, 1));
  auto submit = [&](const std::string& id, std::shared_ptr<FakeExport> kv_export) {
    auto sink = std::make_shared<RecordingSink>();
    EngineRequest r;
    r.request_id = id;
    r.prompt = FakePrompt(30, 5);  // two chunks of 16: fails in the first
    r.max_tokens = 5;
    r.output = sink;
    r.kv_export = std::move(kv_export);
    EXPECT_TRUE(h.core->Submit(std::move(r)).ok());
    return sink;
  };
  auto failed_export = std::make_shared<FakeExport>(0);
  auto failed = submit("p1", failed_export);
  ASSERT_TRUE(failed->WaitFinish());
  ExpectFailed(*failed, absl::StatusCode::kInternal, "device error in a forward step");
  EXPECT_EQ(failed_export->finishes(), 0);
  EXPECT_EQ(failed_export->closes(), 1);
  ASSERT_TRUE(h.WaitIdle());
  EXPECT_EQ(h.core->GetStats().transfers_in_flight, 0u);

  auto ok_export = std::make_shared<FakeExport>(0);
  auto ok = submit("p2", ok_export);
  ASSERT_TRUE(ok->WaitFinish());
  ExpectOk(*ok);
  EXPECT_EQ(ok_export->finishes(), 1);
  EXPECT_EQ(ok_export->finished_token().token_id, FakeGenerate(FakePrompt(30, 5), 1)[0]);
  ASSERT_TRUE(h.WaitIdle());
}

// A request waiting for remote KV has no chunk in the failing step: it is
// untouched and decodes normally once its KV arrives.
TEST(EngineCoreErrorsTest, RecoverableErrorLeavesARemoteWaitAlone) {
  Harness h(64, std::make_unique<FakeLoader>(), Options(),
            Fault(BackendFault::Kind::kInternal, 1));
  const std::vector<int32_t> remote_prompt = FakePrompt(40, 6);  // > 32: remote
  const std::vector<int32_t> ref = FakeGenerate(remote_prompt, 6);
  auto remote = h.Submit("remote", remote_prompt, 6);
  ASSERT_TRUE(h.loader->WaitStarted("remote"));
  auto local = h.Submit("local", FakePrompt(8, 7), 4);
  ASSERT_TRUE(local->WaitFinish());
  ExpectFailed(*local, absl::StatusCode::kInternal, "device error");
  EXPECT_FALSE(remote->finish().has_value());
  h.loader->Complete("remote", remote_prompt, ref[0]);
  ASSERT_TRUE(remote->WaitFinish());
  ExpectOk(*remote);
  EXPECT_EQ(remote->token_ids(), std::vector<int32_t>(ref.begin() + 1, ref.end()));
  ASSERT_TRUE(h.WaitIdle());
}

// A sticky error: the running request, the one waiting for remote KV (once
// its load quiesced) and the queued one all end with UNAVAILABLE "device
// lost: ...", on_device_lost runs once after all of them, no block stays
// in use, the backend is never called again and new requests are refused.
TEST(EngineCoreErrorsTest, DeviceLostFailsEveryRequestAndRefusesNewOnes) {
  EngineCoreOptions o = Options();
  o.scheduler.max_num_seqs = 2;  // the remote wait and "a": "b" queues
  absl::Mutex mu;
  std::vector<absl::Status> lost;
  std::vector<std::shared_ptr<RecordingSink>> sinks;
  int finished_at_callback = -1;
  o.on_device_lost = [&](const absl::Status& status) {
    absl::MutexLock lock(&mu);
    lost.push_back(status);
    finished_at_callback = 0;
    for (const auto& s : sinks) finished_at_callback += s->finish_calls();
  };
  FakeLoader::Options loader_options;
  loader_options.quiesce_on_cancel = true;
  Harness h(64, std::make_unique<FakeLoader>(loader_options), o,
            Fault(BackendFault::Kind::kSticky, 2));
  auto remote = h.Submit("remote", FakePrompt(40, 8), 6);
  ASSERT_TRUE(h.loader->WaitStarted("remote"));
  auto a = std::make_shared<RecordingSink>();
  a->GateAtToken(0);
  EngineRequest ra;
  ra.request_id = "a";
  ra.prompt = FakePrompt(8, 9);
  ra.max_tokens = 8;
  ra.output = a;
  ASSERT_TRUE(h.core->Submit(std::move(ra)).ok());
  ASSERT_TRUE(a->WaitGated());
  auto b = h.Submit("b", FakePrompt(8, 10), 8);
  {
    absl::MutexLock lock(&mu);
    sinks = {remote, a, b};
  }
  a->Release();
  for (const auto& s : {remote, a, b}) {
    ASSERT_TRUE(s->WaitFinish());
    ExpectFailed(*s, absl::StatusCode::kUnavailable, "device lost: test worker: ");
    ExpectFailed(*s, absl::StatusCode::kUnavailable, "illegal memory access");
  }
  EXPECT_TRUE(h.loader->cancel_requested("remote"));
  ASSERT_TRUE(h.WaitIdle());
  const CoreStats s = h.core->GetStats();
  EXPECT_TRUE(s.device_lost);
  EXPECT_EQ(s.forward_errors_total, 1u);
  EXPECT_EQ(s.kv_blocks_in_use, 0u);
  EXPECT_EQ(h.faulty->forward_calls(), 2);
  EXPECT_EQ(h.backend->forward_calls(), 1);

  EngineRequest late;
  late.request_id = "late";
  late.prompt = FakePrompt(4, 11);
  late.max_tokens = 2;
  late.output = std::make_shared<RecordingSink>();
  const absl::Status refused = h.core->Submit(std::move(late));
  EXPECT_EQ(refused.code(), absl::StatusCode::kUnavailable);
  EXPECT_NE(refused.message().find("device lost: "), absl::string_view::npos) << refused;

  h.core.reset();  // joins the loop: the callback has run by now
  absl::MutexLock lock(&mu);
  ASSERT_EQ(lost.size(), 1u);
  EXPECT_EQ(lost[0].code(), absl::StatusCode::kUnavailable);
  EXPECT_NE(lost[0].message().find("device lost: test worker: illegal memory access"),
            absl::string_view::npos)
      << lost[0];
  EXPECT_EQ(finished_at_callback, 3);
}

// A lost device during a prefill-only request's step: the request ends
// with UNAVAILABLE, its export is closed without a Finish, its blocks are
// freed, and on_device_lost runs.
TEST(EngineCoreErrorsTest, DeviceLostClosesAPrefillOnlyRequestsExport) {
  EngineCoreOptions o = Options();
  absl::Mutex mu;
  int lost_calls = 0;
  o.on_device_lost = [&](const absl::Status&) {
    absl::MutexLock lock(&mu);
    ++lost_calls;
  };
  Harness h(64, nullptr, o, Fault(BackendFault::Kind::kSticky, 1));
  auto kv_export = std::make_shared<FakeExport>(0);
  auto sink = std::make_shared<RecordingSink>();
  EngineRequest r;
  r.request_id = "p";
  r.prompt = FakePrompt(30, 12);
  r.max_tokens = 5;
  r.output = sink;
  r.kv_export = kv_export;
  ASSERT_TRUE(h.core->Submit(std::move(r)).ok());
  ASSERT_TRUE(sink->WaitFinish());
  ExpectFailed(*sink, absl::StatusCode::kUnavailable, "device lost: ");
  EXPECT_EQ(kv_export->finishes(), 0);
  EXPECT_EQ(kv_export->closes(), 1);
  ASSERT_TRUE(h.WaitIdle());
  EXPECT_EQ(h.core->GetStats().transfers_in_flight, 0u);
  h.core.reset();
  absl::MutexLock lock(&mu);
  EXPECT_EQ(lost_calls, 1);
}

}  // namespace
}  // namespace tandem::core
