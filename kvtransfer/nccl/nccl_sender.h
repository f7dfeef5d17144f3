// P's NCCL data path (KvDataSender, rank 0 of each pair's communicator).
//
// OpenTransfer finds the pair's live communicator (key: D's KV endpoint
// and instance id) or makes the next generation: one creation per pair at
// a time (create_mu_), with a new ncclUniqueId (made on the NCCL thread).
// The transport_setup carries P's instance id, the generation and, while
// that communicator is still initializing, its unique id.
// SendRows gathers the rows into a send buffer on the channel's transfer
// stream (DeviceKvAccess::GatherRows waits for the layer's event itself),
// takes the next comm_seq and queues the send for the NCCL thread: it
// never waits for the device or the peer. Poll is nullopt until the
// events behind every send of the transfer fired (or, after an abort,
// until the device let go of the buffers).
//
// Threads: engine loop thread for the KvDataSender calls; Tick on the
// NCCL thread; state under NcclEndpoint::mu_.
#ifndef TANDEM_KVTRANSFER_NCCL_NCCL_SENDER_H_
#define TANDEM_KVTRANSFER_NCCL_NCCL_SENDER_H_

#include <memory>
#include <string>

#include "absl/container/flat_hash_map.h"
#include "kvtransfer/data_plane.h"
#include "kvtransfer/nccl/nccl_endpoint.h"

namespace tandem::kvtransfer::nccl {

class NcclSender final : public KvDataSender, public NcclEndpoint {
 public:
  // `instance_id`: this process's id, sent in every setup.
  NcclSender(const NcclDataPlaneOptions& options, std::shared_ptr<NcclCommFactory> factory,
             std::shared_ptr<DeviceOps> device, std::string instance_id);

  KvTransport transport() const override { return KvTransport::kNccl; }
  [[nodiscard]] absl::StatusOr<std::string> OpenTransfer(const TransferKey& key,
                                                         const TransportPeer& peer) override;
  [[nodiscard]] absl::StatusOr<FrameDescriptor> SendRows(const TransferKey& key,
                                                         kv::DeviceKvAccess& kv,
                                                         std::span<const int32_t> block_table,
                                                         int32_t layer, int32_t token_start,
                                                         int32_t count) override;
  std::optional<absl::Status> Poll(const TransferKey& key, const absl::Status& control) override;
  void CloseTransfer(const TransferKey& key) override;
  uint64_t bytes_total() const override { return bytes_total_.load(); }

 private:
  struct Transfer {
    std::shared_ptr<Channel> channel;
    int outstanding = 0;  // sends not yet released
    absl::Status error;   // first data-path error
  };
  struct Peer {
    std::shared_ptr<Channel> channel;
    uint64_t generation = 0;  // the last one made
  };

  static std::shared_ptr<Transfer> NewTransfer(std::shared_ptr<Channel> channel) {
    auto transfer = std::make_shared<Transfer>();
    transfer->channel = std::move(channel);
    return transfer;
  }
  void ForgetAll() override ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);

  const std::string instance_id_;
  absl::Mutex create_mu_ ABSL_ACQUIRED_BEFORE(mu_);
  absl::flat_hash_map<std::string, Peer> peers_ ABSL_GUARDED_BY(mu_);
  absl::flat_hash_map<TransferKey, std::shared_ptr<Transfer>> transfers_ ABSL_GUARDED_BY(mu_);
};

}  // namespace tandem::kvtransfer::nccl

#endif  // TANDEM_KVTRANSFER_NCCL_NCCL_SENDER_H_
