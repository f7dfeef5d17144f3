#include "prefill_worker/kv_export.h"

#include <utility>

#include "absl/strings/str_cat.h"

namespace tandem::prefill {

std::vector<kvtransfer::KvTransport> KvSendOptions::transports() const {
  if (planes == nullptr || planes->transports.empty()) return {kvtransfer::KvTransport::kTcp};
  return planes->transports;
}

absl::Status StartKvSendQueue(KvSendOptions* options) {
  if (options->host_id.empty()) options->host_id = kvtransfer::LocalHostId();
  if (options->bytes_by_transport == nullptr) {
    options->bytes_by_transport = std::make_shared<KvTransportBytes>();
  }
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
                               std::string request_id, uint32_t attempt, int32_t hit_tokens,
                               kvtransfer::TransportOffer offer)
    : options_(options),
      endpoint_(std::move(endpoint)),
      request_id_(std::move(request_id)),
      attempt_(attempt),
      hit_tokens_(hit_tokens),
      offer_(std::move(offer)) {}

SenderKvExport::~SenderKvExport() { Close(); }

absl::Status SenderKvExport::Open(std::shared_ptr<const core::CancelFlag>, Wake wake) {
  absl::StatusOr<kvtransfer::KvTransport> chosen =
      kvtransfer::ChooseTransport(options_.transports(), offer_, options_.host_id);
  if (!chosen.ok()) {
    return absl::Status(chosen.status().code(), absl::StrCat("KV transport for ", endpoint_, ": ",
                                                             chosen.status().message()));
  }
  auto handshake_error = [&](const absl::Status& s) {
    return absl::Status(s.code(), absl::StrCat("KV handshake with ", endpoint_, ": ", s.message()));
  };
  transport_ = *chosen;
  absl::StatusOr<kvtransfer::KvSendQueue::TransferId> id;
  if (transport_ == kvtransfer::KvTransport::kTcp) {
    id = options_.queue->Open(endpoint_, request_id_, attempt_, options_.layout,
                              options_.bit_exact_class, std::move(wake));
  } else {
    kvtransfer::KvDataSender* sender =
        options_.planes != nullptr ? options_.planes->sender(transport_) : nullptr;
    if (sender == nullptr) {  // planes->transports lists only what has a sender
      return absl::InternalError(absl::StrCat("KV transport ",
                                              std::string(kvtransfer::KvTransportName(transport_)),
                                              " chosen but this worker has no data path for it"));
    }
    const kvtransfer::TransferKey key{request_id_, attempt_};
    absl::StatusOr<std::string> setup =
        sender->OpenTransfer(key, {endpoint_, offer_.host_id, offer_.instance_id});
    if (!setup.ok()) return handshake_error(setup.status());
    id = options_.queue->OpenWithTransport(endpoint_, request_id_, attempt_, options_.layout,
                                           options_.bit_exact_class, transport_, *setup,
                                           std::move(wake));
    if (!id.ok()) {
      sender->CloseTransfer(key);
    } else {
      data_ = sender;
    }
  }
  if (!id.ok()) return handshake_error(id.status());
  id_ = *id;
  return absl::OkStatus();
}

bool SenderKvExport::Stalled() const {
  return options_.fault_stall_after_frames >= 0 && frames_ >= options_.fault_stall_after_frames;
}

absl::StatusOr<bool> SenderKvExport::Ready() { return options_.queue->HasRoom(*id_); }

void SenderKvExport::CountFrame(int32_t count) {
  bytes_sent_ += options_.layout.FrameBytes(static_cast<uint32_t>(count));
}

absl::Status SenderKvExport::SendDeviceRows(kv::DeviceKvAccess& kv,
                                            std::span<const int32_t> block_table, int32_t layer,
                                            int32_t token_start, int32_t count) {
  if (data_ == nullptr) {
    return absl::FailedPreconditionError("SendDeviceRows: this KV export sends over tcp");
  }
  if (Stalled()) return absl::OkStatus();  // injected stall: the frame never leaves
  ++frames_;
  absl::StatusOr<kvtransfer::FrameDescriptor> frame =
      data_->SendRows({request_id_, attempt_}, kv, block_table, layer, token_start, count);
  if (!frame.ok()) return frame.status();
  if (absl::Status s = options_.queue->EnqueueDescriptor(*id_, *frame); !s.ok()) return s;
  CountFrame(count);
  return absl::OkStatus();
}

absl::Status SenderKvExport::SendLayer(int32_t layer, int32_t token_start, int32_t count,
                                       const char* k, const char* v) {
  if (data_ != nullptr) {
    return absl::FailedPreconditionError(
        absl::StrCat("SendLayer: this KV export sends over ",
                     std::string(kvtransfer::KvTransportName(transport_)), " (device rows)"));
  }
  if (Stalled()) return absl::OkStatus();  // injected stall: the frame never leaves
  ++frames_;
  // The core asked Ready() before this step: the frame goes whatever the
  // budget, so a step is never half sent.
  absl::StatusOr<bool> queued = options_.queue->EnqueueFrame(
      *id_, static_cast<uint32_t>(layer), static_cast<uint32_t>(token_start),
      static_cast<uint32_t>(count), k, v, kvtransfer::KvSendQueue::Admit::kAlways);
  if (!queued.ok()) return queued.status();
  CountFrame(count);
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

std::optional<absl::Status> SenderKvExport::Result() {
  if (data_ == nullptr) return options_.queue->Result(*id_);
  if (result_.has_value()) return result_;
  std::optional<absl::Status> control = options_.queue->Result(*id_);
  if (!control.has_value()) return std::nullopt;
  std::optional<absl::Status> data = data_->Poll({request_id_, attempt_}, *control);
  if (!data.has_value()) return std::nullopt;  // the data path still reads our blocks
  result_ = !data->ok() ? *data : *control;
  return result_;
}

void SenderKvExport::Close() {
  // Counted per transport when the export ends, as the engine counts
  // kv_bytes_sent_total (from bytes_sent() after Close), so the two agree.
  if (!counted_ && options_.bytes_by_transport != nullptr) {
    options_.bytes_by_transport->Add(transport_, bytes_sent_);
  }
  counted_ = true;
  if (!id_.has_value()) return;
  options_.queue->Close(*id_);  // cancels it unless the FINAL went out
  id_.reset();
  // Frames already announced still complete on the data path. (id_ guards
  // a second Close; data_ stays: sends_device_rows is fixed for life.)
  if (data_ != nullptr) data_->CloseTransfer({request_id_, attempt_});
}

}  // namespace tandem::prefill
