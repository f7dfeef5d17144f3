#include "prefill_worker/kv_export.h"

#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"

namespace tandem::prefill {

SenderKvExport::SenderKvExport(const KvSendOptions& options, std::string endpoint,
                               std::string request_id, uint32_t attempt, int32_t hit_tokens)
    : options_(options),
      endpoint_(std::move(endpoint)),
      request_id_(std::move(request_id)),
      attempt_(attempt),
      hit_tokens_(hit_tokens) {}

absl::Status SenderKvExport::Open(std::shared_ptr<const core::CancelFlag> cancelled) {
  cancelled_ = std::move(cancelled);
  auto sender = kvtransfer::KvSender::Connect(endpoint_, request_id_, attempt_, options_.layout,
                                              options_.bit_exact_class,
                                              options_.transfer_timeout_ms);
  if (!sender.ok()) {
    return absl::Status(sender.status().code(), absl::StrCat("KV handshake with ", endpoint_,
                                                             ": ", sender.status().message()));
  }
  sender_ = std::move(*sender);
  return absl::OkStatus();
}

absl::Status SenderKvExport::SendLayer(int32_t layer, int32_t token_start, int32_t count,
                                       const char* k, const char* v) {
  if (options_.fault_stall_after_frames >= 0 && frames_ >= options_.fault_stall_after_frames) {
    // Injected stall: hold the connection open and send nothing.
    while (!cancelled_->load()) absl::SleepFor(absl::Milliseconds(20));
    return absl::CancelledError("request cancelled during injected stall");
  }
  ++frames_;
  absl::Status sent = sender_->SendFrame(static_cast<uint32_t>(layer),
                                         static_cast<uint32_t>(token_start),
                                         static_cast<uint32_t>(count), k, v);
  bytes_sent_ = sender_->bytes_sent();
  return sent;
}

absl::Status SenderKvExport::Finish(const std::vector<core::SampleStart>& samples) {
  std::vector<kvtransfer::FinalSample> final_samples;
  final_samples.reserve(samples.size());
  for (const core::SampleStart& start : samples) {
    kvtransfer::FinalSample& sample = final_samples.emplace_back();
    sample.token = start.token.token_id;
    sample.logprob = start.token.logprob;
    sample.finish_reason = static_cast<uint32_t>(start.finish_reason);
    for (const sampling::TokenLogprob& top : start.token.top_logprobs) {
      sample.top_logprobs.push_back({top.id, top.logprob});
    }
  }
  return sender_->SendFinal(final_samples);
}

void SenderKvExport::Close() {
  sender_.reset();  // closes the connection (after FINAL, if sent)
}

}  // namespace tandem::prefill
