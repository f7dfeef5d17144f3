// D's NCCL data path (KvDataReceiver, rank 1 of each pair's communicator).
//
// OpenTransfer reads the transport_setup: the P instance's cached
// communicator of that generation is reused; a newer generation (with its
// ncclUniqueId) replaces and aborts an older one; anything else is
// refused (UNAVAILABLE, the REJECT). Receive queues the frame under its
// comm_seq; the NCCL thread posts ncclRecv into a staging buffer strictly
// in comm_seq order (Channel) and then DeviceKvAccess::ScatterRows into the
// target's blocks on the same stream; `done` runs when the group's event
// fired. CloseTransfer cancels: frames not yet posted are still received,
// into a staging buffer that is not scattered (the discard buffer), so the
// communicator stays in step; `quiesced` runs once no scatter into the
// target is pending.
//
// Threads: receiver I/O thread for the KvDataReceiver calls; Tick, `done`
// and (unless inline) `quiesced` on the NCCL thread; state under
// NcclEndpoint::mu_.
#ifndef TANDEM_KVTRANSFER_NCCL_NCCL_RECEIVER_H_
#define TANDEM_KVTRANSFER_NCCL_NCCL_RECEIVER_H_

#include <deque>
#include <memory>
#include <string>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "kvtransfer/data_plane.h"
#include "kvtransfer/nccl/nccl_endpoint.h"

namespace tandem::kvtransfer::nccl {

class NcclReceiver final : public KvDataReceiver, public NcclEndpoint {
 public:
  NcclReceiver(const NcclDataPlaneOptions& options, std::shared_ptr<NcclCommFactory> factory,
               std::shared_ptr<DeviceOps> device);

  KvTransport transport() const override { return KvTransport::kNccl; }
  [[nodiscard]] absl::Status OpenTransfer(const TransferKey& key, std::string_view transport_setup,
                                          const DeviceKvTarget& target) override;
  void Receive(const TransferKey& key, const FrameDescriptor& frame,
               std::function<void(absl::Status)> done) override;
  void CloseTransfer(const TransferKey& key, std::function<void()> quiesced) override;
  uint64_t bytes_total() const override { return bytes_total_.load(); }

 private:
  // One Receive: its `done` runs once.
  struct Entry {
    std::function<void(absl::Status)> done;
    uint64_t bytes = 0;
    bool scattered = false;  // a ScatterRows into the target is enqueued
  };
  struct Transfer {
    std::shared_ptr<Channel> channel;
    DeviceKvTarget target;
    kv::DevicePoolInfo pool;  // the target's, for frame sizes after close
    bool closed = false;
    int writing = 0;  // entries with a scatter not yet released
    std::vector<std::shared_ptr<Entry>> entries;
    std::function<void()> quiesced;
  };

  void Report(Entry& entry, absl::Status status) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  void ForgetAll() override ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);

  // P instance id -> its communicator (the newest generation seen).
  absl::flat_hash_map<std::string, std::shared_ptr<Channel>> peers_ ABSL_GUARDED_BY(mu_);
  absl::flat_hash_map<TransferKey, std::shared_ptr<Transfer>> transfers_ ABSL_GUARDED_BY(mu_);
  // The last kClosedMemory closed transfers: a FRAME_DESC that still
  // arrives for one (announced before the cancel reached P) is received
  // into the discard buffer, so the channel stays in step.
  static constexpr size_t kClosedMemory = 4096;
  absl::flat_hash_map<TransferKey, std::shared_ptr<Transfer>> closed_ ABSL_GUARDED_BY(mu_);
  std::deque<TransferKey> closed_order_ ABSL_GUARDED_BY(mu_);
};

}  // namespace tandem::kvtransfer::nccl

#endif  // TANDEM_KVTRANSFER_NCCL_NCCL_RECEIVER_H_
