#include "prefill_worker/kv_export.h"

#include <utility>

#include "absl/strings/str_cat.h"

namespace tandem::prefill {

absl::Status StartKvSendQueue(KvSendOptions* options) {
  kvtransfer::KvSendQueue::Options q;
  q.send_buffer_bytes = options->send_buffer_bytes;
  q.transfer_timeout_ms = options->transfer_timeout_ms;
  q.auth = options->auth;
  absl::StatusOr<std::unique_ptr<kvtransfer::KvSendQueue>> queue =
      kvtransfer::KvSendQueue::Start(q);
  if (!queue.ok()) return queue.status();
  options->queue = *std::move(queue);
  return absl::OkStatus();
}

SenderKvExport::SenderKvExport(const KvSendOptions& options, std::string endpoint,
                               std::string request_id, uint32_t attempt, int32_t hit_tokens)
    : options_(options),
      endpoint_(std::move(endpoint)),
      request_id_(std::move(request_id)),
      attempt_(attempt),
      hit_tokens_(hit_tokens) {}

SenderKvExport::~SenderKvExport() { Close(); }

absl::Status SenderKvExport::Open(std::shared_ptr<const core::CancelFlag>, Wake wake) {
  absl::StatusOr<kvtransfer::KvSendQueue::TransferId> id = options_.queue->Open(
      endpoint_, request_id_, attempt_, options_.layout, options_.bit_exact_class,
      std::move(wake));
  if (!id.ok()) {
    return absl::Status(id.status().code(), absl::StrCat("KV handshake with ", endpoint_, ": ",
                                                         id.status().message()));
  }
  id_ = *id;
  return absl::OkStatus();
}

bool SenderKvExport::Stalled() const {
  return options_.fault_stall_after_frames >= 0 && frames_ >= options_.fault_stall_after_frames;
}

absl::StatusOr<bool> SenderKvExport::Ready() { return options_.queue->HasRoom(*id_); }

absl::Status SenderKvExport::SendLayer(int32_t layer, int32_t token_start, int32_t count,
                                       const char* k, const char* v) {
  if (Stalled()) return absl::OkStatus();  // injected stall: the frame never leaves
  ++frames_;
  // The core asked Ready() before this step: the frame goes whatever the
  // budget, so a step is never half sent.
  absl::StatusOr<bool> queued = options_.queue->EnqueueFrame(
      *id_, static_cast<uint32_t>(layer), static_cast<uint32_t>(token_start),
      static_cast<uint32_t>(count), k, v, kvtransfer::KvSendQueue::Admit::kAlways);
  if (!queued.ok()) return queued.status();
  bytes_sent_ += options_.layout.FrameBytes(static_cast<uint32_t>(count));
  return absl::OkStatus();
}

absl::Status SenderKvExport::Finish(const std::vector<core::SampleStart>& samples) {
  // Injected stall: no FINAL; the connection stays open until the request
  // is cancelled or the receiver times out (its REJECT ends the transfer).
  if (Stalled()) return absl::OkStatus();
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
  return options_.queue->EnqueueFinal(*id_, final_samples);
}

std::optional<absl::Status> SenderKvExport::Result() { return options_.queue->Result(*id_); }

void SenderKvExport::Close() {
  if (!id_.has_value()) return;
  options_.queue->Close(*id_);  // cancels it unless the FINAL went out
  id_.reset();
}

}  // namespace tandem::prefill
