// The prefill worker's KV sender (kvtransfer::KvSender) as the engine
// core's KvExport: HELLO when the request reaches the core, one FRAME per
// (layer, token range) as the forward writes it, FINAL with token 0
// (DESIGN.md, steps 4-6).
//
// Owns: one request's connection to the decode worker's KV receiver.
// Does not touch: KV memory (the core reads the rows and hands them over),
// scheduling, gRPC.
// Threads: the core's loop thread calls every method.
#ifndef TANDEM_PREFILL_WORKER_KV_EXPORT_H_
#define TANDEM_PREFILL_WORKER_KV_EXPORT_H_

#include <cstdint>
#include <memory>
#include <string>

#include "engine/core/request.h"
#include "kvtransfer/kv_transfer.h"

namespace tandem::prefill {

// What every export of this worker shares.
struct KvSendOptions {
  kvtransfer::KvLayout layout;  // this worker's KV layout (KvLayoutFor)
  std::string bit_exact_class;  // reported in HELLO
  int32_t transfer_timeout_ms = 5000;  // handshake and each send (kv.transfer_timeout_ms)
  // Fault injection for tests (--fault-stall-after-frames): after this
  // many frames, stop sending (as if the link stalled) until the request is
  // cancelled. < 0 = off.
  int32_t fault_stall_after_frames = -1;
};

class SenderKvExport final : public core::KvExport {
 public:
  // Sends tokens [hit_tokens, L) of request `request_id` to `endpoint`
  // (the decode worker's KV receiver) as transfer attempt `attempt`.
  SenderKvExport(const KvSendOptions& options, std::string endpoint, std::string request_id,
                 uint32_t attempt, int32_t hit_tokens);

  int32_t first_token_to_send() const override { return hit_tokens_; }
  // Errors: as KvSender::Connect, the message prefixed "KV handshake with
  // <endpoint>: ".
  absl::Status Open(std::shared_ptr<const core::CancelFlag> cancelled) override;
  absl::Status SendLayer(int32_t layer, int32_t token_start, int32_t count, const char* k,
                         const char* v) override;
  absl::Status Finish(const std::vector<core::SampleStart>& samples) override;
  void Close() override;
  uint64_t bytes_sent() const override { return bytes_sent_; }

 private:
  const KvSendOptions options_;
  const std::string endpoint_;
  const std::string request_id_;
  const uint32_t attempt_;
  const int32_t hit_tokens_;
  std::shared_ptr<const core::CancelFlag> cancelled_;
  std::unique_ptr<kvtransfer::KvSender> sender_;
  int64_t frames_ = 0;
  uint64_t bytes_sent_ = 0;
};

}  // namespace tandem::prefill

#endif  // TANDEM_PREFILL_WORKER_KV_EXPORT_H_
