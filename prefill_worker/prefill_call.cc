#include "prefill_worker/prefill_call.h"

#include <memory>
#include <utility>

#include "absl/strings/str_cat.h"
#include "worker/kv_data_planes.h"

namespace tandem::prefill {
namespace {

// Collects token 0 and turns the finish into the call's one result.
class PrefillOutput : public core::RequestOutput {
 public:
  PrefillOutput(std::shared_ptr<const SenderKvExport> kv_export, PrefillDone done,
                bool fault_fail_reply)
      : export_(std::move(kv_export)),
        done_(std::move(done)),
        fault_fail_reply_(fault_fail_reply) {}
  void OnRemotePrefill(const core::KvTarget&) override {}  // never: P prefills
  void OnPhases(const core::RequestPhases& phases, const core::PlacementReport&) override {
    result_.phases = phases;
  }
  void OnToken(uint32_t sample_index, uint32_t, const sampling::SampledToken& token,
               uint32_t prompt_tokens_computed) override {
    Slot(sample_index).token = token;
    if (sample_index == 0) result_.prompt_tokens_computed = prompt_tokens_computed;
  }
  void OnSampleFinish(uint32_t sample_index, core::FinishReason reason) override {
    Slot(sample_index).finish_reason = reason;
  }
  void OnFinish(const absl::Status& status) override {
    if (!status.ok()) {
      done_(status);
      return;
    }
    if (fault_fail_reply_) {
      // The KV and FINAL went out; the reply is what goes missing.
      done_(absl::UnavailableError(
          "fault injection (--fault-fail-reply): the reply is lost after the KV transfer"));
      return;
    }
    result_.kv_bytes_sent = export_->bytes_sent();
    done_(result_);
  }

 private:
  core::SampleStart& Slot(uint32_t sample_index) {
    if (result_.samples.size() <= sample_index) result_.samples.resize(sample_index + 1);
    return result_.samples[sample_index];
  }

  const std::shared_ptr<const SenderKvExport> export_;
  const PrefillDone done_;
  const bool fault_fail_reply_;
  PrefillResult result_;
};

}  // namespace

void SubmitPrefill(core::EngineCore& core, const KvSendOptions& send, PrefillRequest request,
                   PrefillDone done) {
  const core::KvTarget& target = request.kv_target;
  if (target.hit_tokens > request.prompt.size()) {
    done(absl::InvalidArgumentError(absl::StrCat("kv_target.hit_tokens: ", target.hit_tokens,
                                                 " exceeds the prompt length ",
                                                 request.prompt.size())));
    return;
  }
  absl::StatusOr<kvtransfer::TransportOffer> offer =
      TransportOfferFromTarget(target, send.transports());
  if (!offer.ok()) {
    done(absl::Status(offer.status().code(), absl::StrCat("KV transport for ", target.endpoint,
                                                          ": ", offer.status().message())));
    return;
  }
  auto kv_export =
      std::make_shared<SenderKvExport>(send, target.endpoint, request.request_id, target.attempt,
                                       static_cast<int32_t>(target.hit_tokens), *std::move(offer));
  core::EngineRequest req;
  req.request_id = std::move(request.request_id);
  req.prompt = std::move(request.prompt);
  req.max_tokens = request.max_tokens;
  req.sampling = request.sampling;
  req.controls = std::move(request.controls);
  req.route = core::RouteChoice::kLocal;
  req.output = std::make_shared<PrefillOutput>(kv_export, done, send.fault_fail_reply);
  req.kv_export = std::move(kv_export);
  absl::Status submitted = core.Submit(std::move(req));
  if (!submitted.ok()) done(submitted);
}

}  // namespace tandem::prefill
