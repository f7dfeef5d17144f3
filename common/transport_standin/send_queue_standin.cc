// TEMPORARY stand-in for KvSendQueue::OpenWithTransport and
// EnqueueDescriptor (declared in kvtransfer/send_queue.h for issue #16,
// implemented by the control-plane branch), compiled only while no
// kvtransfer/*.cc defines KvSendQueue::OpenWithTransport
// (common/CMakeLists.txt), so
// the wiring branch links before that branch is merged. tcp is exactly
// Open; a device transport is UNIMPLEMENTED. Delete with its CMake lines
// once the real ones are in.
#include "absl/status/status.h"
#include "kvtransfer/send_queue.h"

namespace tandem::kvtransfer {

absl::StatusOr<KvSendQueue::TransferId> KvSendQueue::OpenWithTransport(
    const std::string& endpoint, const std::string& request_id, uint32_t attempt,
    const KvLayout& layout, const std::string& bit_exact_class, KvTransport transport,
    const std::string& transport_setup, Notify notify) {
  (void)transport_setup;
  if (transport == KvTransport::kTcp) {
    return Open(endpoint, request_id, attempt, layout, bit_exact_class, std::move(notify));
  }
  return absl::UnimplementedError(
      "KvSendQueue::OpenWithTransport stand-in: device transports need the issue #16 control "
      "plane");
}

absl::Status KvSendQueue::EnqueueDescriptor(TransferId id, const FrameDescriptor& frame) {
  (void)id, (void)frame;
  return absl::UnimplementedError(
      "KvSendQueue::EnqueueDescriptor stand-in: device transports need the issue #16 control "
      "plane");
}

}  // namespace tandem::kvtransfer
