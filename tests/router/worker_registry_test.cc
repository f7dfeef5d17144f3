// WorkerRegistry against fake workers: in-process gRPC servers whose
// GetStatus answers, or holds every call unanswered ("frozen"). Covers
// Pick (scores from polled load and in-flight requests, ties in turn, avoid,
// the policies), serving with no prefill worker (and its log lines), layout
// id refusal, drop_after_ms, polls that a frozen worker does not delay, and
// the prefix index fed by each registered worker's KvEvents stream.
#include "router/worker_registry.h"

#include "router/generate_call.h"

#include <grpcpp/grpcpp.h>

#include <functional>
#include <future>
#include <limits>
#include <memory>
#include <numeric>
#include <string>
#include <vector>

#include "absl/strings/match.h"
#include "absl/synchronization/mutex.h"
#include "absl/synchronization/notification.h"
#include "absl/time/clock.h"
#include "worker/kv_event_publisher.h"
#include "engine/kv/kv_cache_manager.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace tandem::router {
namespace {

using ::testing::HasSubstr;

constexpr char kFingerprint[] = "test-fp";
constexpr char kLayout[] = "kv3/test-fp/L5.H4.D8/f32";

// A worker's GetStatus on 127.0.0.1 (both worker services, so either role
// can be polled) and its KvEvents (a real publisher, block size 4).
class FakeWorker {
 public:
  FakeWorker() : decode_(this), prefill_(this), kv_events_(KvEventPublisherOptions{4}) {
    grpc::ServerBuilder builder;
    int port = 0;
    builder.AddListeningPort("127.0.0.1:0", grpc::InsecureServerCredentials(), &port);
    builder.RegisterService(&decode_);
    builder.RegisterService(&prefill_);
    builder.RegisterService(kv_events_.service());
    server_ = builder.BuildAndStart();
    address_ = "127.0.0.1:" + std::to_string(port);
  }
  ~FakeWorker() {
    Unfreeze();
    server_->Shutdown(std::chrono::system_clock::now() + std::chrono::seconds(1));
  }

  const std::string& address() const { return address_; }
  KvEventPublisher& kv_events() { return kv_events_; }
  void SetReady(bool ready) {
    absl::MutexLock lock(&mu_);
    ready_ = ready;
  }
  // What GetStatus reports from now on (its load and KV block fields).
  void SetLoad(const v1::WorkerStatus& load) {
    absl::MutexLock lock(&mu_);
    load_ = load;
  }
  // From now on GetStatus calls are held, unanswered.
  void Freeze() {
    absl::MutexLock lock(&mu_);
    frozen_ = true;
  }
  // Answers the held calls with UNAVAILABLE; later calls are answered.
  void Unfreeze() {
    std::vector<grpc::ServerUnaryReactor*> held;
    {
      absl::MutexLock lock(&mu_);
      frozen_ = false;
      held.swap(held_);
    }
    for (auto* r : held) r->Finish(grpc::Status(grpc::StatusCode::UNAVAILABLE, "was frozen"));
  }

 private:
  grpc::ServerUnaryReactor* Answer(grpc::CallbackServerContext* context,
                                   v1::WorkerStatus* response) {
    auto* reactor = context->DefaultReactor();
    absl::MutexLock lock(&mu_);
    if (frozen_) {
      held_.push_back(reactor);
      return reactor;
    }
    *response = load_;
    response->set_ready(ready_);
    reactor->Finish(grpc::Status::OK);
    return reactor;
  }

  struct Decode final : v1::DecodeWorker::CallbackService {
    explicit Decode(FakeWorker* w) : worker(w) {}
    grpc::ServerUnaryReactor* GetStatus(grpc::CallbackServerContext* context,
                                        const v1::GetStatusRequest*,
                                        v1::WorkerStatus* response) override {
      return worker->Answer(context, response);
    }
    FakeWorker* worker;
  };
  struct Prefill final : v1::PrefillWorker::CallbackService {
    explicit Prefill(FakeWorker* w) : worker(w) {}
    grpc::ServerUnaryReactor* GetStatus(grpc::CallbackServerContext* context,
                                        const v1::GetStatusRequest*,
                                        v1::WorkerStatus* response) override {
      return worker->Answer(context, response);
    }
    FakeWorker* worker;
  };

  Decode decode_;
  Prefill prefill_;
  KvEventPublisher kv_events_;
  std::unique_ptr<grpc::Server> server_;
  std::string address_;
  absl::Mutex mu_;
  bool frozen_ ABSL_GUARDED_BY(mu_) = false;
  bool ready_ ABSL_GUARDED_BY(mu_) = true;
  v1::WorkerStatus load_ ABSL_GUARDED_BY(mu_);
  std::vector<grpc::ServerUnaryReactor*> held_ ABSL_GUARDED_BY(mu_);
};

v1::RegisterWorkerRequest Registration(const std::string& name, v1::WorkerRole role,
                                       const std::string& address) {
  v1::RegisterWorkerRequest r;
  r.set_name(name);
  r.set_role(role);
  r.set_address(address);
  r.set_model_fingerprint(kFingerprint);
  r.set_kv_layout_id(kLayout);
  return r;
}

// Pick's worker for a 3-token prompt of `role` outside `avoid` (null: none).
std::shared_ptr<WorkerHandle> PickOf(WorkerRegistry& registry, v1::WorkerRole role,
                                     std::vector<std::string> avoid = {}) {
  static const std::vector<int32_t> kPrompt = {1, 2, 3};
  PickRequest request;
  request.role = role;
  request.prompt = kPrompt;
  request.avoid = std::move(avoid);
  return registry.Pick(request).worker;
}

// Polls `condition` every 5 ms; false if it is still false after `timeout`.
bool WaitFor(const std::function<bool()>& condition, absl::Duration timeout) {
  const absl::Time deadline = absl::Now() + timeout;
  while (!condition()) {
    if (absl::Now() > deadline) return false;
    absl::SleepFor(absl::Milliseconds(5));
  }
  return true;
}

// The registry's log lines and health changes, captured.
struct Recorder {
  absl::Mutex mu;
  std::vector<std::string> lines;
  std::vector<bool> health;
  int Count(const std::string& needle) {
    absl::MutexLock lock(&mu);
    int n = 0;
    for (const std::string& l : lines) n += l.find(needle) != std::string::npos;
    return n;
  }
};

RegistryOptions Options(Recorder* recorder) {
  RegistryOptions o;
  o.model_fingerprint = kFingerprint;
  o.kv_layout_id = kLayout;
  o.poll_interval_ms = 20;
  o.unhealthy_after_missed_polls = 2;
  o.rpc_timeout_ms = 100;
  o.drop_after_ms = 60000;
  o.log = [recorder](const std::string& line) {
    absl::MutexLock lock(&recorder->mu);
    recorder->lines.push_back(line);
  };
  return o;
}

std::function<void(bool)> HealthTo(Recorder* recorder) {
  return [recorder](bool serving) {
    absl::MutexLock lock(&recorder->mu);
    recorder->health.push_back(serving);
  };
}

TEST(WorkerRegistryTest, PickTakesEqualWorkersInTurnCountsInFlightAndSkipsAvoided) {
  Recorder rec;
  RegistryOptions o = Options(&rec);
  o.poll_interval_ms = 600000;  // no poll during the test: no status, all idle
  WorkerRegistry registry(o, HealthTo(&rec));
  for (const char* name : {"d2", "d0", "d1"}) {
    ASSERT_TRUE(registry.Register(Registration(name, v1::ROLE_DECODE, "127.0.0.1:1")).ok());
  }
  ASSERT_TRUE(registry.Register(Registration("p0", v1::ROLE_PREFILL, "127.0.0.1:1")).ok());

  // All equal: in turn, in name order.
  std::vector<std::string> names;
  for (int i = 0; i < 4; ++i) names.push_back(PickOf(registry, v1::ROLE_DECODE)->name);
  EXPECT_EQ(names, (std::vector<std::string>{"d0", "d1", "d2", "d0"}));
  // d0 has two of this router's requests in flight: the others alternate.
  std::shared_ptr<WorkerHandle> d0 = PickOf(registry, v1::ROLE_DECODE, {"d1", "d2"});
  ASSERT_NE(d0, nullptr);
  EXPECT_EQ(d0->name, "d0");
  d0->active_requests = 2;
  names.clear();
  for (int i = 0; i < 2; ++i) names.push_back(PickOf(registry, v1::ROLE_DECODE)->name);
  EXPECT_THAT(names, ::testing::UnorderedElementsAre("d1", "d2"));
  EXPECT_EQ(PickOf(registry, v1::ROLE_DECODE, {"d1"})->name, "d2");
  // Busy, but the only one left; the result says why it scored so.
  PickRequest only;
  only.role = v1::ROLE_DECODE;
  const std::vector<int32_t> prompt = {1, 2, 3, 4};
  only.prompt = prompt;
  only.avoid = {"d1", "d2"};
  const PickResult result = registry.Pick(only);
  ASSERT_NE(result.worker, nullptr);
  EXPECT_EQ(result.worker->name, "d0");
  EXPECT_EQ(result.score, 0.25 - 2.0 / 64);
  EXPECT_EQ(result.explanation,
            "kv_aware score 0.22: 0/4 prompt tokens cached, blocks not polled yet, 0 running, "
            "0 waiting, 2 in flight");
  EXPECT_EQ(PickOf(registry, v1::ROLE_DECODE, {"d0", "d1", "d2"}), nullptr);
  EXPECT_EQ(PickOf(registry, v1::ROLE_PREFILL)->name, "p0");
  EXPECT_EQ(PickOf(registry, v1::ROLE_PREFILL, {"p0"}), nullptr);
  EXPECT_EQ(PickOf(registry, v1::ROLE_ROUTER), nullptr);
  EXPECT_TRUE(registry.HasRoutable(v1::ROLE_DECODE));
  EXPECT_TRUE(registry.HasRoutable(v1::ROLE_PREFILL));
  EXPECT_FALSE(registry.HasRoutable(v1::ROLE_ROUTER));
  // The prefix index is another component's (issue #13, item 1).
  EXPECT_EQ(registry.CachedPrefixTokens("d0", prompt), 0);
}

// The polled status is the score's input: KV blocks, running and waiting
// requests for decode workers, queued prefill tokens for prefill workers.
TEST(WorkerRegistryTest, PickScoresTheLastPolledLoad) {
  Recorder rec;
  FakeWorker busy_d, idle_d, busy_p, idle_p;
  v1::WorkerStatus load;
  load.set_kv_blocks_total(2048);
  idle_d.SetLoad(load);
  idle_p.SetLoad(load);
  load.set_kv_blocks_in_use(1024);
  load.set_running_requests(10);  // 4 of them waiting
  load.set_waiting_requests(4);
  busy_d.SetLoad(load);
  load.set_queued_prefill_tokens(1024);
  busy_p.SetLoad(load);
  WorkerRegistry registry(Options(&rec), HealthTo(&rec));
  ASSERT_TRUE(registry.Register(Registration("d-busy", v1::ROLE_DECODE, busy_d.address())).ok());
  ASSERT_TRUE(registry.Register(Registration("d-idle", v1::ROLE_DECODE, idle_d.address())).ok());
  ASSERT_TRUE(registry.Register(Registration("p-busy", v1::ROLE_PREFILL, busy_p.address())).ok());
  ASSERT_TRUE(registry.Register(Registration("p-idle", v1::ROLE_PREFILL, idle_p.address())).ok());
  const std::vector<int32_t> prompt = {1, 2, 3, 4};
  PickRequest request;
  request.prompt = prompt;
  request.role = v1::ROLE_DECODE;
  request.avoid = {"d-idle"};
  PickResult result;
  ASSERT_TRUE(WaitFor(
      [&] {
        result = registry.Pick(request);
        return result.explanation.find("blocks free") != std::string::npos;
      },
      absl::Seconds(5)));
  EXPECT_EQ(result.score, 0.25 * 0.5 - 10.0 / 64);
  EXPECT_EQ(result.explanation,
            "kv_aware score -0.03: 0/4 prompt tokens cached, 1024/2048 blocks free, 6 running, "
            "4 waiting, 0 in flight");
  request.role = v1::ROLE_PREFILL;
  request.avoid = {"p-idle"};
  ASSERT_TRUE(WaitFor(
      [&] {
        result = registry.Pick(request);
        return result.explanation.find("1024 queued") != std::string::npos;
      },
      absl::Seconds(5)));
  EXPECT_EQ(result.score, -0.5);
  EXPECT_EQ(result.explanation,
            "kv_aware score -0.50: 0/4 prompt tokens cached, 1024 queued prefill tokens, "
            "0 in flight");
  // Once the idle ones were polled too, every pick goes to them.
  ASSERT_TRUE(WaitFor(
      [&] {
        return registry.Pick({v1::ROLE_DECODE, prompt, {"d-busy"}, ""}).explanation.find(
                   "2048/2048 blocks free") != std::string::npos;
      },
      absl::Seconds(5)));
  for (int i = 0; i < 4; ++i) {
    EXPECT_EQ(registry.Pick({v1::ROLE_DECODE, prompt, {}, ""}).worker->name, "d-idle");
    EXPECT_EQ(registry.Pick({v1::ROLE_PREFILL, prompt, {}, ""}).worker->name, "p-idle");
  }
}

// Issue #32: a prefill worker whose queue cannot start the request before
// its deadline is not picked; the rate comes from the worker's own polls
// (tokens computed while prefill was queued), and with no such worker
// left the explanation says why.
TEST(WorkerRegistryTest, PrefillPickSkipsAQueueThatOutlastsTheRequest) {
  Recorder rec;
  FakeWorker p;
  v1::WorkerStatus load;
  load.set_kv_blocks_total(2048);
  load.set_queued_prefill_tokens(1000000);
  p.SetLoad(load);
  WorkerRegistry registry(Options(&rec), HealthTo(&rec));
  ASSERT_TRUE(registry.Register(Registration("p0", v1::ROLE_PREFILL, p.address())).ok());
  const std::vector<int32_t> prompt = {1, 2, 3, 4};
  PickRequest request;
  request.prompt = prompt;
  request.role = v1::ROLE_PREFILL;
  request.max_queue_wait_s = 0.5;
  // No rate measured yet: the worker is taken to start at once.
  ASSERT_TRUE(WaitFor([&] { return registry.Pick(request).explanation.find("1000000 queued") !=
                                   std::string::npos; },
                      absl::Seconds(5)));
  EXPECT_EQ(registry.Pick(request).worker->name, "p0");
  // It computes 100 tokens between polls (20 ms apart: ~5000 tokens/s),
  // so a million queued tokens take minutes.
  uint64_t computed = 0;
  PickResult result;
  ASSERT_TRUE(WaitFor(
      [&] {
        computed += 100;
        load.set_prefill_tokens_computed_total(computed);
        p.SetLoad(load);
        result = registry.Pick(request);
        return result.worker == nullptr;
      },
      absl::Seconds(5)));
  EXPECT_TRUE(absl::StartsWith(result.explanation,
                               "every prefill worker's queue outlasts the 0.5 s left to the "
                               "request: p0 ~"))
      << result.explanation;
  EXPECT_NE(result.explanation.find("(1000000 queued prefill tokens at "), std::string::npos)
      << result.explanation;
  // Without the bound it is still picked.
  request.max_queue_wait_s = std::numeric_limits<double>::infinity();
  result = registry.Pick(request);
  ASSERT_NE(result.worker, nullptr);
  EXPECT_EQ(result.worker->name, "p0");
}

// least_loaded and round_robin over the same polled load.
TEST(WorkerRegistryTest, OtherPoliciesChooseAsDocumented) {
  for (const RouterPolicy policy : {RouterPolicy::kLeastLoaded, RouterPolicy::kRoundRobin}) {
    SCOPED_TRACE(RouterPolicyName(policy));
    Recorder rec;
    FakeWorker busy, idle;
    v1::WorkerStatus load;
    load.set_running_requests(3);
    load.set_waiting_requests(1);
    busy.SetLoad(load);
    RegistryOptions o = Options(&rec);
    o.routing.policy = policy;
    WorkerRegistry registry(o, HealthTo(&rec));
    ASSERT_TRUE(registry.Register(Registration("a", v1::ROLE_DECODE, busy.address())).ok());
    ASSERT_TRUE(registry.Register(Registration("b", v1::ROLE_DECODE, idle.address())).ok());
    const std::vector<int32_t> prompt = {1};
    if (policy == RouterPolicy::kLeastLoaded) {
      ASSERT_TRUE(WaitFor(
          [&] {
            return registry.Pick({v1::ROLE_DECODE, prompt, {"b"}, ""}).explanation ==
                   "least_loaded: 2 running, 1 waiting, 0 in flight";
          },
          absl::Seconds(5)));
    }
    std::vector<std::string> names;
    for (int i = 0; i < 4; ++i) names.push_back(PickOf(registry, v1::ROLE_DECODE)->name);
    if (policy == RouterPolicy::kLeastLoaded) {
      EXPECT_EQ(names, (std::vector<std::string>{"b", "b", "b", "b"}));
    } else {
      // In turn whatever the load (the cursor continues from nothing picked).
      EXPECT_THAT(names, ::testing::ElementsAre("a", "b", "a", "b"));
    }
  }
}

TEST(WorkerRegistryTest, ServesWithoutPrefillWorkersAndLogsEachPrefillTransitionOnce) {
  Recorder rec;
  FakeWorker decode, prefill;
  WorkerRegistry registry(Options(&rec), HealthTo(&rec));
  EXPECT_FALSE(registry.CanServe());
  ASSERT_TRUE(registry.Register(Registration("d0", v1::ROLE_DECODE, decode.address())).ok());
  EXPECT_TRUE(registry.CanServe());  // no prefill worker needed
  EXPECT_EQ(rec.Count("prefill worker"), 0);

  ASSERT_TRUE(registry.Register(Registration("p0", v1::ROLE_PREFILL, prefill.address())).ok());
  ASSERT_TRUE(registry.Register(Registration("p0", v1::ROLE_PREFILL, prefill.address())).ok());
  EXPECT_EQ(rec.Count("prefill worker(s) available"), 1);

  prefill.Freeze();
  ASSERT_TRUE(WaitFor([&] { return PickOf(registry, v1::ROLE_PREFILL) == nullptr; },
                      absl::Seconds(5)));
  EXPECT_TRUE(registry.CanServe());
  // A few more failed polls: still one line.
  absl::SleepFor(absl::Milliseconds(150));
  EXPECT_EQ(rec.Count("no healthy prefill worker: long prompts are prefilled on the decode "
                      "workers"),
            1);

  prefill.Unfreeze();
  ASSERT_TRUE(WaitFor([&] { return PickOf(registry, v1::ROLE_PREFILL) != nullptr; },
                      absl::Seconds(5)));
  EXPECT_EQ(rec.Count("prefill worker(s) available"), 2);
  EXPECT_EQ(rec.Count("no healthy prefill worker"), 1);
  absl::MutexLock lock(&rec.mu);
  EXPECT_EQ(rec.health, std::vector<bool>{true});  // CanServe flipped once
}

TEST(WorkerRegistryTest, NoDecodeWorkerCannotServeAndHealthFollows) {
  Recorder rec;
  FakeWorker decode;
  WorkerRegistry registry(Options(&rec), HealthTo(&rec));
  ASSERT_TRUE(registry.Register(Registration("p0", v1::ROLE_PREFILL, "127.0.0.1:1")).ok());
  EXPECT_FALSE(registry.CanServe());
  ASSERT_TRUE(registry.Register(Registration("d0", v1::ROLE_DECODE, decode.address())).ok());
  EXPECT_TRUE(registry.CanServe());
  decode.Freeze();
  ASSERT_TRUE(WaitFor([&] { return !registry.CanServe(); }, absl::Seconds(5)));
  absl::MutexLock lock(&rec.mu);
  EXPECT_EQ(rec.health, (std::vector<bool>{true, false}));
}

TEST(WorkerRegistryTest, RefusesAnotherKvLayoutNamingBothIds) {
  Recorder rec;
  WorkerRegistry registry(Options(&rec), HealthTo(&rec));
  v1::RegisterWorkerRequest r = Registration("d0", v1::ROLE_DECODE, "127.0.0.1:1");
  r.set_kv_layout_id("kv3/test-fp/L5.H4.D8/f16");
  const absl::Status s = registry.Register(r);
  EXPECT_EQ(s.code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_EQ(s.message(),
            "kv_layout_id: worker d0 has KV layout \"kv3/test-fp/L5.H4.D8/f16\" but the "
            "router's model and configuration give \"kv3/test-fp/L5.H4.D8/f32\"");
  EXPECT_FALSE(registry.Contains("d0"));
  EXPECT_FALSE(registry.CanServe());

  r.clear_kv_layout_id();  // a worker that sends none is refused too
  EXPECT_EQ(registry.Register(r).code(), absl::StatusCode::kFailedPrecondition);

  // The fingerprint is checked first: it says more.
  r.set_model_fingerprint("other-fp");
  EXPECT_THAT(registry.Register(r).message(), HasSubstr("model_fingerprint: worker d0 serves "
                                                        "other-fp but the router serves test-fp"));
}

// A cluster mixing CPU and GPU workers: each listed worker is held to the
// layout of its own entry (its device's KV dtype), others to the default.
TEST(WorkerRegistryTest, ListedWorkersAreHeldToTheirOwnKvLayout) {
  Recorder rec;
  RegistryOptions options = Options(&rec);
  const std::string bf16 = "kv3/test-fp/L5.H4.D8/bf16";
  options.kv_layout_ids = {{"gpu", bf16}, {"host", kLayout}};
  WorkerRegistry registry(options, HealthTo(&rec));
  v1::RegisterWorkerRequest gpu = Registration("gpu", v1::ROLE_DECODE, "127.0.0.1:1");
  EXPECT_EQ(registry.Register(gpu).message(),
            "kv_layout_id: worker gpu has KV layout \"kv3/test-fp/L5.H4.D8/f32\" but the "
            "router's model and configuration give \"kv3/test-fp/L5.H4.D8/bf16\"");
  gpu.set_kv_layout_id(bf16);
  EXPECT_TRUE(registry.Register(gpu).ok());
  v1::RegisterWorkerRequest host = Registration("host", v1::ROLE_DECODE, "127.0.0.1:2");
  EXPECT_TRUE(registry.Register(host).ok());
  v1::RegisterWorkerRequest other = Registration("unlisted", v1::ROLE_DECODE, "127.0.0.1:3");
  other.set_kv_layout_id(bf16);
  EXPECT_EQ(registry.Register(other).code(), absl::StatusCode::kFailedPrecondition);
  other.set_kv_layout_id(kLayout);
  EXPECT_TRUE(registry.Register(other).ok());
}

TEST(WorkerRegistryTest, DropsAWorkerUnhealthyForDropAfterMsAndTakesItBack) {
  Recorder rec;
  RegistryOptions o = Options(&rec);
  o.drop_after_ms = 300;
  FakeWorker decode;
  WorkerRegistry registry(o, HealthTo(&rec));
  ASSERT_TRUE(registry.Register(Registration("d0", v1::ROLE_DECODE, decode.address())).ok());
  std::shared_ptr<WorkerHandle> held = PickOf(registry, v1::ROLE_DECODE);
  ASSERT_NE(held, nullptr);
  absl::Notification lost;
  absl::Time lost_at;
  const uint64_t token = held->AddLostCallback([&] {
    lost_at = absl::Now();
    lost.Notify();
  });

  decode.Freeze();
  ASSERT_TRUE(lost.WaitForNotificationWithTimeout(absl::Seconds(5)));
  EXPECT_TRUE(registry.Contains("d0"));  // unhealthy, not yet dropped
  ASSERT_TRUE(WaitFor([&] { return !registry.Contains("d0"); }, absl::Seconds(5)));
  EXPECT_GE(absl::Now() - lost_at, absl::Milliseconds(300));
  EXPECT_EQ(rec.Count("worker d0 unhealthy for "), 1);
  EXPECT_EQ(rec.Count(" ms: dropped from the registry"), 1);
  // The handle stays usable by the requests that hold it.
  EXPECT_EQ(held->name, "d0");
  EXPECT_NE(held->decode_stub, nullptr);
  held->RemoveLostCallback(token);

  decode.Unfreeze();
  ASSERT_TRUE(registry.Register(Registration("d0", v1::ROLE_DECODE, decode.address())).ok());
  std::shared_ptr<WorkerHandle> again = PickOf(registry, v1::ROLE_DECODE);
  ASSERT_NE(again, nullptr);
  EXPECT_NE(again, held);  // a fresh entry
  EXPECT_TRUE(registry.CanServe());
}

// A worker that registers at an address nobody can reach (a wrong
// advertise) keeps heartbeating: only a poll that reaches it may make it
// healthy again, so its missed polls stand.
TEST(WorkerRegistryTest, HeartbeatsDoNotMakeAnUnreachableWorkerHealthy) {
  Recorder rec;
  FakeWorker good;
  WorkerRegistry registry(Options(&rec), HealthTo(&rec));
  ASSERT_TRUE(registry.Register(Registration("d0", v1::ROLE_DECODE, "127.0.0.1:1")).ok());
  ASSERT_TRUE(registry.Register(Registration("d1", v1::ROLE_DECODE, good.address())).ok());
  ASSERT_TRUE(WaitFor([&] { return rec.Count("worker d0 missed 2 polls") == 1; },
                      absl::Seconds(5)));
  for (int i = 0; i < 5; ++i) {
    ASSERT_TRUE(registry.Register(Registration("d0", v1::ROLE_DECODE, "127.0.0.1:1")).ok());
    EXPECT_EQ(PickOf(registry, v1::ROLE_DECODE)->name, "d1") << "heartbeat " << i;
    absl::SleepFor(absl::Milliseconds(30));
  }
  EXPECT_EQ(rec.Count("worker d0 missed"), 1);  // it stayed unhealthy
}

// A request that found a worker unreachable marks it unhealthy at once (its
// other requests are told); a successful poll brings it back.
TEST(WorkerRegistryTest, ReportUnreachableMarksUnhealthyUntilAPollSucceeds) {
  Recorder rec;
  RegistryOptions o = Options(&rec);
  FakeWorker decode0, decode1;
  WorkerRegistry registry(o, HealthTo(&rec));
  ASSERT_TRUE(registry.Register(Registration("d0", v1::ROLE_DECODE, decode0.address())).ok());
  ASSERT_TRUE(registry.Register(Registration("d1", v1::ROLE_DECODE, decode1.address())).ok());
  std::shared_ptr<WorkerHandle> d0 = PickOf(registry, v1::ROLE_DECODE);
  ASSERT_EQ(d0->name, "d0");
  absl::Notification lost;
  const uint64_t token = d0->AddLostCallback([&] { lost.Notify(); });
  decode0.Freeze();  // polls of d0 now time out, but slower than the report
  registry.ReportUnreachable(d0, "stream broke");
  EXPECT_TRUE(lost.HasBeenNotified());
  EXPECT_EQ(rec.Count("worker d0 unreachable (stream broke): unhealthy"), 1);
  EXPECT_EQ(PickOf(registry, v1::ROLE_DECODE)->name, "d1");
  registry.ReportUnreachable(d0, "again");  // already unhealthy: nothing
  EXPECT_EQ(rec.Count("unreachable"), 1);
  d0->RemoveLostCallback(token);
  decode0.Unfreeze();
  ASSERT_TRUE(WaitFor([&] { return rec.Count("worker d0 answers polls again: healthy") == 1; },
                      absl::Seconds(5)));
  d0->active_requests = 0;
  EXPECT_EQ(PickOf(registry, v1::ROLE_DECODE, {"d1"})->name, "d0");
}

// A worker's own UNAVAILABLE answer (e.g. "device lost: ...") is kept for a
// request whose stream then breaks without one, but only while it is
// recent: an old answer says nothing of a later failure.
TEST(WorkerHandleTest, LastUnavailableIsKeptOnlyWithinTheWindow) {
  WorkerHandle h;
  EXPECT_EQ(h.last_unavailable(absl::Seconds(10)), "");
  h.NoteUnavailable("device lost: decode-0: illegal memory access");
  EXPECT_EQ(h.last_unavailable(absl::Seconds(10)),
            "device lost: decode-0: illegal memory access");
  absl::SleepFor(absl::Milliseconds(30));
  EXPECT_EQ(h.last_unavailable(absl::Milliseconds(5)), "");
  h.NoteUnavailable("decode-0 is shutting down");
  EXPECT_EQ(h.last_unavailable(absl::Seconds(10)), "decode-0 is shutting down");
  EXPECT_EQ(h.lost_reason(), "");  // a separate record from NotifyLost's
}

// Another process now answers at a registered worker's address (a pod IP
// reused within drop_after_ms): the worker is unhealthy at once, its
// requests are told why, and the impostor's answers never make it healthy.
TEST(WorkerRegistryTest, AnotherWorkerAnsweringAtTheAddressMakesItUnhealthy) {
  Recorder rec;
  FakeWorker decode0;
  WorkerRegistry registry(Options(&rec), HealthTo(&rec));
  ASSERT_TRUE(registry.Register(Registration("d0", v1::ROLE_DECODE, decode0.address())).ok());
  std::shared_ptr<WorkerHandle> d0 = PickOf(registry, v1::ROLE_DECODE);
  ASSERT_NE(d0, nullptr);
  absl::Notification lost;
  const uint64_t token = d0->AddLostCallback([&] { lost.Notify(); });
  v1::WorkerStatus other;
  other.set_name("tandem-decode-7c9f-x2k4");
  decode0.SetLoad(other);
  const std::string line = absl::StrCat("worker d0's address ", decode0.address(),
                                        " answers as worker tandem-decode-7c9f-x2k4: unhealthy");
  ASSERT_TRUE(WaitFor([&] { return rec.Count(line) == 1; }, absl::Seconds(5)));
  EXPECT_TRUE(lost.WaitForNotificationWithTimeout(absl::Seconds(5)));
  EXPECT_THAT(d0->lost_reason(), ::testing::HasSubstr("answers as worker tandem-decode-7c9f-x2k4"));
  EXPECT_EQ(PickOf(registry, v1::ROLE_DECODE), nullptr);
  absl::SleepFor(absl::Milliseconds(300));  // more polls: still unhealthy, logged once
  EXPECT_EQ(rec.Count("answers polls again"), 0);
  EXPECT_EQ(rec.Count(line), 1);
  d0->RemoveLostCallback(token);
}

TEST(WorkerRegistryTest, AFrozenWorkerDelaysNoOtherWorkersPolls) {
  Recorder rec;
  RegistryOptions o = Options(&rec);
  o.rpc_timeout_ms = 30000;  // the frozen worker's polls hang for the whole test
  o.unhealthy_after_missed_polls = 1;
  FakeWorker frozen, live;
  frozen.Freeze();
  WorkerRegistry registry(o, HealthTo(&rec));
  // "a" sorts first: polled one after the other, "b" would wait 30 s.
  ASSERT_TRUE(registry.Register(Registration("a", v1::ROLE_DECODE, frozen.address())).ok());
  ASSERT_TRUE(registry.Register(Registration("b", v1::ROLE_DECODE, live.address())).ok());
  absl::SleepFor(absl::Milliseconds(100));  // "a"'s first poll is in flight
  live.SetReady(false);                     // "b" starts draining
  EXPECT_TRUE(WaitFor([&] { return PickOf(registry, v1::ROLE_DECODE, {"a"}) == nullptr; },
                      absl::Seconds(3)));
  live.SetReady(true);
  EXPECT_TRUE(WaitFor([&] { return PickOf(registry, v1::ROLE_DECODE, {"a"}) != nullptr; },
                      absl::Seconds(3)));
}

TEST(WorkerRegistryTest, StatusAllAsyncAnswersWithinTheDeadlineWithAFrozenWorker) {
  Recorder rec;
  RegistryOptions o = Options(&rec);
  o.poll_interval_ms = 600000;
  o.rpc_timeout_ms = 200;
  FakeWorker frozen, live;
  frozen.Freeze();
  v1::WorkerStatus load;
  load.set_running_requests(3);
  live.SetLoad(load);
  WorkerRegistry registry(o, HealthTo(&rec));
  ASSERT_TRUE(registry.Register(Registration("a", v1::ROLE_PREFILL, frozen.address())).ok());
  ASSERT_TRUE(registry.Register(Registration("b", v1::ROLE_DECODE, live.address())).ok());

  absl::Notification done;
  std::vector<v1::WorkerStatus> got;
  const absl::Time start = absl::Now();
  registry.StatusAllAsync([&](std::vector<v1::WorkerStatus> all) {
    got = std::move(all);
    done.Notify();
  });
  ASSERT_TRUE(done.WaitForNotificationWithTimeout(absl::Seconds(5)));
  EXPECT_LT(absl::Now() - start, absl::Seconds(2));
  ASSERT_EQ(got.size(), 2u);
  EXPECT_EQ(got[0].name(), "a");
  EXPECT_EQ(got[0].role(), v1::ROLE_PREFILL);
  EXPECT_EQ(got[0].address(), frozen.address());
  EXPECT_FALSE(got[0].healthy());
  EXPECT_EQ(got[1].running_requests(), 3u);
  EXPECT_TRUE(got[1].healthy());

  WorkerRegistry empty(o, nullptr);
  bool called = false;
  empty.StatusAllAsync([&](std::vector<v1::WorkerStatus> all) {
    called = true;
    EXPECT_TRUE(all.empty());
  });
  EXPECT_TRUE(called);  // no worker: answered at once, on this thread
}

std::string DuplicateMessage(const std::string& holder, const std::string& other) {
  return "worker name 'd0' is held by a healthy worker at " + holder +
         "; another process registered with the same name from " + other;
}

// Two processes started with one name: the second is refused while the
// first is healthy, the entry (and its handle) stay the first's, and the
// refusal is logged once however often the second retries.
TEST(WorkerRegistryTest, ANameHeldByAHealthyWorkerElsewhereIsRefused) {
  Recorder rec;
  FakeWorker first, second;
  WorkerRegistry registry(Options(&rec), HealthTo(&rec));
  ASSERT_TRUE(registry.Register(Registration("d0", v1::ROLE_DECODE, first.address())).ok());
  std::shared_ptr<WorkerHandle> held = PickOf(registry, v1::ROLE_DECODE);
  ASSERT_NE(held, nullptr);
  for (int i = 0; i < 3; ++i) {
    const absl::Status s =
        registry.Register(Registration("d0", v1::ROLE_DECODE, second.address()));
    EXPECT_EQ(s.code(), absl::StatusCode::kAlreadyExists);
    EXPECT_EQ(s.message(), DuplicateMessage(first.address(), second.address()));
    // The holder's heartbeats still go through.
    ASSERT_TRUE(registry.Register(Registration("d0", v1::ROLE_DECODE, first.address())).ok());
  }
  EXPECT_EQ(rec.Count("refused worker d0: " + DuplicateMessage(first.address(), second.address())),
            1);
  EXPECT_EQ(rec.Count("worker d0 (ROLE_DECODE) at "), 1);  // only the first's registration
  held->active_requests = 0;
  EXPECT_EQ(PickOf(registry, v1::ROLE_DECODE), held);  // the same entry, at first
  EXPECT_EQ(held->address, first.address());
}

// A holder that stopped answering polls (its process died) is taken over
// by the process that registers the name elsewhere; the old process, if
// it comes back, is then the duplicate (logged again: a new holder).
TEST(WorkerRegistryTest, AnUnhealthyHolderIsTakenOver) {
  Recorder rec;
  FakeWorker first, second;
  WorkerRegistry registry(Options(&rec), HealthTo(&rec));
  ASSERT_TRUE(registry.Register(Registration("d0", v1::ROLE_DECODE, first.address())).ok());
  ASSERT_EQ(registry.Register(Registration("d0", v1::ROLE_DECODE, second.address())).code(),
            absl::StatusCode::kAlreadyExists);
  first.Freeze();
  ASSERT_TRUE(WaitFor([&] { return rec.Count("worker d0 missed 2 polls") == 1; },
                      absl::Seconds(5)));
  ASSERT_TRUE(registry.Register(Registration("d0", v1::ROLE_DECODE, second.address())).ok());
  EXPECT_EQ(rec.Count("worker d0 (ROLE_DECODE) at " + second.address() + " registered"), 1);
  std::shared_ptr<WorkerHandle> now = PickOf(registry, v1::ROLE_DECODE);
  ASSERT_NE(now, nullptr);
  EXPECT_EQ(now->address, second.address());

  first.Unfreeze();
  const absl::Status s = registry.Register(Registration("d0", v1::ROLE_DECODE, first.address()));
  EXPECT_EQ(s.code(), absl::StatusCode::kAlreadyExists);
  EXPECT_EQ(s.message(), DuplicateMessage(second.address(), first.address()));
  EXPECT_EQ(rec.Count("refused worker d0: " + DuplicateMessage(second.address(), first.address())),
            1);
}

// KV events: a registered worker's events reach the registry's prefix
// index (CachedPrefixTokens, kv_index_blocks), and a re-registration at
// another address follows the new process.
TEST(WorkerRegistryTest, PrefixIndexFollowsEachRegisteredWorkersEvents) {
  Recorder rec;
  RegistryOptions o = Options(&rec);
  o.poll_interval_ms = 600000;  // no poll during the test
  WorkerRegistry registry(o, HealthTo(&rec));
  std::vector<int32_t> prompt(10);
  std::iota(prompt.begin(), prompt.end(), 100);  // 2 full blocks of 4 + 2
  const std::vector<kv::BlockHash> h = kv::HashFullBlocks(prompt, 4, kFingerprint);
  auto stored = [](const kv::BlockHash& hash) {
    return kv::KvCacheEvent{kv::KvCacheEvent::Kind::kStored, hash};
  };
  FakeWorker first, second;
  first.kv_events().Publish({stored(h[0])});
  second.kv_events().Publish({stored(h[0]), stored(h[1])});
  ASSERT_TRUE(registry.Register(Registration("d0", v1::ROLE_DECODE, first.address())).ok());
  ASSERT_TRUE(WaitFor([&] { return registry.CachedPrefixTokens("d0", prompt) == 4; },
                      absl::Seconds(10)));
  first.kv_events().Publish({stored(h[1])});
  ASSERT_TRUE(WaitFor([&] { return registry.CachedPrefixTokens("d0", prompt) == 8; },
                      absl::Seconds(10)));
  EXPECT_EQ(registry.CachedPrefixTokens("d1", prompt), 0);  // unknown worker
  std::promise<std::vector<v1::WorkerStatus>> statuses;
  registry.StatusAllAsync(
      [&](std::vector<v1::WorkerStatus> s) { statuses.set_value(std::move(s)); });
  const std::vector<v1::WorkerStatus> s = statuses.get_future().get();
  ASSERT_EQ(s.size(), 1u);
  EXPECT_EQ(s[0].kv_index_blocks(), 2u);

  // d0's process dies (a request found it unreachable) and a new one
  // registers at another address: the index follows the new process
  // (first's later events no longer count).
  std::shared_ptr<WorkerHandle> old_d0 = PickOf(registry, v1::ROLE_DECODE);
  ASSERT_NE(old_d0, nullptr);
  registry.ReportUnreachable(old_d0, "process died");
  ASSERT_TRUE(registry.Register(Registration("d0", v1::ROLE_DECODE, second.address())).ok());
  ASSERT_TRUE(WaitFor([&] { return second.kv_events().num_subscribers() == 1; },
                      absl::Seconds(10)));
  ASSERT_TRUE(WaitFor([&] { return registry.CachedPrefixTokens("d0", prompt) == 8; },
                      absl::Seconds(10)));
  first.kv_events().Publish({{kv::KvCacheEvent::Kind::kRemoved, h[0]}});
  second.kv_events().Publish({{kv::KvCacheEvent::Kind::kRemoved, h[1]}});
  ASSERT_TRUE(WaitFor([&] { return registry.CachedPrefixTokens("d0", prompt) == 4; },
                      absl::Seconds(10)));
  EXPECT_EQ(rec.Count("kv index: worker d0: 2 blocks dropped (re-registered at " +
                      second.address() + ")"),
            1);
}

// Issue #16: a prefill worker is picked for a decode worker only with an
// equal KV layout id; with none, Pick finds nothing (D then prefills
// itself: the router's AbortTransfer with no_prefill_worker).
TEST(KvTransportRoutingTest, PrefillWorkersArePairedByTheDecodeWorkersLayoutId) {
  Recorder rec;
  RegistryOptions o = Options(&rec);
  o.poll_interval_ms = 600000;  // no poll: all idle, ties in name order
  const std::string bf16 = "kv2/test-fp/L5.H4.D8/bf16";
  o.kv_layout_ids = {{"p-gpu", bf16}, {"d-gpu", bf16}};
  WorkerRegistry registry(o, HealthTo(&rec));
  v1::RegisterWorkerRequest p_gpu = Registration("p-gpu", v1::ROLE_PREFILL, "127.0.0.1:1");
  p_gpu.set_kv_layout_id(bf16);
  ASSERT_TRUE(registry.Register(p_gpu).ok());
  ASSERT_TRUE(registry.Register(Registration("p-host", v1::ROLE_PREFILL, "127.0.0.1:2")).ok());
  ASSERT_TRUE(registry.Register(Registration("d-host", v1::ROLE_DECODE, "127.0.0.1:3")).ok());

  auto pick = [&](const std::string& layout, std::vector<std::string> avoid = {}) {
    static const std::vector<int32_t> kPrompt = {1, 2, 3};
    PickRequest request;
    request.role = v1::ROLE_PREFILL;
    request.prompt = kPrompt;
    request.avoid = std::move(avoid);
    request.kv_layout_id = layout;
    std::shared_ptr<WorkerHandle> w = registry.Pick(request).worker;
    return w == nullptr ? std::string("none") : w->name;
  };
  // The handle keeps the layout id it registered with.
  std::shared_ptr<WorkerHandle> d = PickOf(registry, v1::ROLE_DECODE);
  ASSERT_NE(d, nullptr);
  EXPECT_EQ(d->kv_layout_id, kLayout);
  for (int i = 0; i < 3; ++i) {
    EXPECT_EQ(pick(d->kv_layout_id), "p-host");
    EXPECT_EQ(pick(bf16), "p-gpu");
  }
  // The only P with D's layout failed the request: none left for it, even
  // though another P is healthy.
  EXPECT_EQ(pick(kLayout, {"p-host"}), "none");
  EXPECT_EQ(pick("kv2/other/L1.H1.D1/f32"), "none");
  EXPECT_TRUE(registry.HasRoutable(v1::ROLE_PREFILL));
  // No layout asked: any P, in turn.
  std::vector<std::string> names = {pick(""), pick("")};
  EXPECT_THAT(names, ::testing::UnorderedElementsAre("p-gpu", "p-host"));
}

}  // namespace
}  // namespace tandem::router
