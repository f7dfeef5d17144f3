#include "tools/bench/grpc_backend.h"

#include <chrono>
#include <utility>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "tools/bench/clock.h"
#include "tools/router_client.h"

namespace tandem::bench {

// One Generate stream: owns its context, request and the message being
// read; deletes itself after calling `done` from OnDone.
class GrpcBackend::Call final : public grpc::ClientReadReactor<tandem::v1::GenerateResponse> {
 public:
  Call(GrpcBackend* backend, const BenchRequest& request, std::function<void(RequestOutput)> done)
      : backend_(backend), done_(std::move(done)) {
    if (!request.prompt_token_ids.empty()) {
      request_.mutable_prompt_token_ids()->Assign(request.prompt_token_ids.begin(),
                                                  request.prompt_token_ids.end());
    } else {
      request_.set_prompt(request.prompt);
    }
    request_.set_max_tokens(static_cast<uint32_t>(request.output_len));
    request_.set_ignore_eos(true);
    request_.mutable_sampling()->set_temperature(0);  // greedy
    output_.prompt_len = request.prompt_len;
    cli::SetApiKey(&context_, backend->options_.api_key);
  }

  void Start() {
    start_ = Clock::now();
    if (backend_->options_.timeout_ms > 0) {
      // gRPC deadlines are on the system clock.
      context_.set_deadline(std::chrono::system_clock::now() +
                            std::chrono::milliseconds(backend_->options_.timeout_ms));
    }
    backend_->stub_->async()->Generate(&context_, &request_, this);
    StartRead(&message_);
    StartCall();
  }

  void OnReadDone(bool ok) override {
    if (!ok) return;  // OnDone follows
    const Clock::time_point now = Clock::now();
    if (message_.tokens_size() > 0) {
      if (output_.output_tokens == 0) {
        output_.ttft_s = SecondsBetween(start_, now);
      } else {
        output_.itl_s.push_back(SecondsBetween(last_token_, now));
      }
      last_token_ = now;
      output_.output_tokens += message_.tokens_size();
    }
    if (message_.prompt_tokens() > 0)
      output_.prompt_len = static_cast<int32_t>(message_.prompt_tokens());
    output_.generated_text += message_.text();
    if (message_.has_placement() && !message_.placement().decision().empty()) {
      RecordPlacement(message_.placement());
    }
    StartRead(&message_);
  }

  void OnDone(const grpc::Status& status) override {
    output_.latency_s = SecondsBetween(start_, Clock::now());
    output_.success = status.ok();
    if (!status.ok()) output_.error = cli::GrpcStatusText(status);
    std::function<void(RequestOutput)> done = std::move(done_);
    GrpcBackend* backend = backend_;
    RequestOutput output = std::move(output_);
    delete this;  // the context goes before the backend may
    done(std::move(output));
    backend->CallEnded();
  }

 private:
  // Keeps the latest placement (the sample's last message carries it) and
  // the prediction of the placement chosen.
  void RecordPlacement(const tandem::v1::Placement& placement) {
    output_.placement = placement.decision();
    output_.predicted_ttft_s.reset();
    if (placement.ttft_local_ms() == 0 && placement.ttft_remote_ms() == 0) return;
    const double chosen_ms =
        placement.decision() == "remote" ? placement.ttft_remote_ms() : placement.ttft_local_ms();
    output_.predicted_ttft_s = chosen_ms / 1000.0;
  }

  GrpcBackend* const backend_;
  std::function<void(RequestOutput)> done_;
  grpc::ClientContext context_;
  tandem::v1::GenerateRequest request_;
  tandem::v1::GenerateResponse message_;
  RequestOutput output_;
  Clock::time_point start_;
  Clock::time_point last_token_;
};

absl::StatusOr<std::unique_ptr<GrpcBackend>> GrpcBackend::Create(
    const GrpcBackendOptions& options) {
  if (absl::Status s = cli::CheckRouterAddress(options.router); !s.ok()) return s;
  if (options.timeout_ms < 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("--timeout-ms: must be >= 0, got ", options.timeout_ms));
  }
  return std::unique_ptr<GrpcBackend>(new GrpcBackend(options));
}

GrpcBackend::GrpcBackend(const GrpcBackendOptions& options)
    : options_(options), stub_(cli::MakeGenerationStub(options.router)) {}

GrpcBackend::~GrpcBackend() {
  absl::MutexLock lock(&mu_);
  mu_.Await(absl::Condition(
      +[](int64_t* n) { return *n == 0; }, &in_flight_));
}

void GrpcBackend::Send(const BenchRequest& request, std::function<void(RequestOutput)> done) {
  {
    absl::MutexLock lock(&mu_);
    ++in_flight_;
  }
  (new Call(this, request, std::move(done)))->Start();
}

void GrpcBackend::CallEnded() {
  absl::MutexLock lock(&mu_);
  --in_flight_;
}

}  // namespace tandem::bench
