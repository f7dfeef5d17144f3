#include "kvtransfer/nccl/nccl_sender.h"

#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "kvtransfer/kv_transfer.h"
#include "kvtransfer/nccl/transport_setup.h"

namespace tandem::kvtransfer::nccl {
namespace {

std::string Describe(const TransferKey& key) {
  return absl::StrCat("request ", key.request_id, " attempt ", key.attempt);
}

}  // namespace

// The K+V bytes of `count` tokens in `kv`'s layout: KvLayout::FrameBytes
// (2 * count * kv_dim * dtype bytes), the TCP FRAME payload size.
uint64_t DeviceFrameBytes(const kv::DevicePoolInfo& pool, uint32_t count) {
  KvLayout layout;
  layout.n_kv_heads = 1;
  layout.head_dim = static_cast<uint32_t>(pool.kv_dim);
  layout.dtype = pool.dtype;
  return layout.FrameBytes(count);
}

NcclSender::NcclSender(const NcclDataPlaneOptions& options,
                       std::shared_ptr<NcclCommFactory> factory, std::shared_ptr<DeviceOps> device,
                       std::string instance_id)
    : NcclEndpoint(options, std::move(factory), std::move(device), /*rank=*/0),
      instance_id_(std::move(instance_id)) {}

absl::StatusOr<std::string> NcclSender::OpenTransfer(const TransferKey& key,
                                                     const TransportPeer& peer) {
  if (peer.kv_endpoint.empty() || peer.instance_id.empty()) {
    return absl::InvalidArgumentError(
        absl::StrCat("nccl transfer for ", Describe(key),
                     ": the peer's 'kv_endpoint' and 'instance_id' must "
                     "be set (got '",
                     peer.kv_endpoint, "', '", peer.instance_id, "')"));
  }
  const std::string pair = absl::StrCat(peer.kv_endpoint, "#", peer.instance_id);
  absl::MutexLock create(&create_mu_);
  uint64_t generation = 0;
  {
    absl::MutexLock lock(&mu_);
    if (transfers_.contains(key)) {
      return absl::InvalidArgumentError(
          absl::StrCat("nccl transfer for ", Describe(key), " is already open"));
    }
    Peer& known = peers_[pair];
    if (known.channel != nullptr && !known.channel->failed()) {
      transfers_[key] = NewTransfer(known.channel);
      NcclSetup setup{known.channel->generation(), instance_id_, ""};
      // Until D joined, every HELLO of the generation carries the id, so
      // whichever reaches D first lets it join.
      if (!known.channel->ready()) setup.unique_id = known.channel->unique_id();
      return EncodeNcclSetup(setup);
    }
    generation = known.generation + 1;
  }
  // A new communicator for the pair; create_mu_ keeps it to one at a time.
  std::string unique_id;
  absl::Status made = thread_->RunSync(
      "ncclGetUniqueId",
      [&]() -> absl::Status {
        auto id = factory_->GetUniqueId();
        if (!id.ok()) return id.status();
        unique_id = *std::move(id);
        return absl::OkStatus();
      },
      absl::Milliseconds(options_.init_timeout_ms));
  if (!made.ok()) {
    return absl::UnavailableError(absl::StrCat("no NCCL communicator with decode worker ",
                                               peer.kv_endpoint, ": ", made.message()));
  }
  absl::MutexLock lock(&mu_);
  auto channel =
      NewChannel(absl::StrCat("decode worker ", peer.kv_endpoint), generation, unique_id);
  if (!channel.ok()) return channel.status();
  peers_[pair] = Peer{*channel, generation};
  transfers_[key] = NewTransfer(*channel);
  return EncodeNcclSetup(NcclSetup{generation, instance_id_, unique_id});
}

absl::StatusOr<FrameDescriptor> NcclSender::SendRows(const TransferKey& key, kv::DeviceKvAccess& kv,
                                                     std::span<const int32_t> block_table,
                                                     int32_t layer, int32_t token_start,
                                                     int32_t count) {
  const kv::DevicePoolInfo pool = kv.pool_info();
  if (layer < 0 || layer >= pool.n_layers || token_start < 0 || count <= 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("nccl SendRows for ", Describe(key), ": bad range layer ", layer, " (of ",
                     pool.n_layers, "), token_start ", token_start, ", count ", count));
  }
  std::shared_ptr<Transfer> transfer;
  {
    absl::MutexLock lock(&mu_);
    auto it = transfers_.find(key);
    if (it == transfers_.end()) {
      return absl::FailedPreconditionError(
          absl::StrCat("nccl SendRows: no open transfer for ", Describe(key)));
    }
    transfer = it->second;
    if (!transfer->error.ok()) return transfer->error;
    if (transfer->channel->failed()) return transfer->channel->error();
  }
  Channel& channel = *transfer->channel;
  const uint64_t bytes = DeviceFrameBytes(pool, static_cast<uint32_t>(count));
  auto buffer = device_->Allocate(bytes, channel.stream());
  if (!buffer.ok()) return buffer.status();
  absl::Status gathered =
      kv.GatherRows(block_table, layer, token_start, count, *buffer, channel.stream());
  if (!gathered.ok()) {
    device_->Free(*buffer, channel.stream());
    return gathered;
  }
  FrameDescriptor frame{key.request_id,
                        key.attempt,
                        static_cast<uint32_t>(layer),
                        static_cast<uint32_t>(token_start),
                        static_cast<uint32_t>(count),
                        0,
                        ""};
  {
    absl::MutexLock lock(&mu_);
    if (channel.failed()) {
      device_->Free(*buffer, channel.stream());
      return channel.error();
    }
    frame.comm_seq = channel.TakeSendSeq();
    ++transfer->outstanding;
    FrameOp op;
    op.comm_seq = frame.comm_seq;
    op.bytes = bytes;
    op.buffer = *buffer;
    op.on_result = [this, transfer, bytes](const absl::Status& status) {
      if (status.ok()) {
        bytes_total_ += bytes;
      } else if (transfer->error.ok()) {
        transfer->error = status;
      }
    };
    op.on_release = [transfer] { --transfer->outstanding; };
    channel.Enqueue(std::move(op));
  }
  thread_->Wake();
  return frame;
}

std::optional<absl::Status> NcclSender::Poll(const TransferKey& key, const absl::Status& control) {
  absl::MutexLock lock(&mu_);
  auto it = transfers_.find(key);
  if (it == transfers_.end()) {
    return absl::FailedPreconditionError(
        absl::StrCat("nccl Poll: no open transfer for ", Describe(key)));
  }
  const Transfer& transfer = *it->second;
  if (IsCommunicatorLost(control) && !transfer.channel->failed()) {
    // D gave up on (or never had) this communicator: so does P; the next
    // OpenTransfer to the pair makes a new generation.
    transfer.channel->Fail(
        absl::UnavailableError(
            absl::StrCat("the decode worker lost the NCCL communicator: ", control.message())),
        absl::Now());
    thread_->Wake();
  }
  if (transfer.outstanding > 0) return std::nullopt;
  if (!transfer.error.ok()) return transfer.error;
  return control;
}

void NcclSender::CloseTransfer(const TransferKey& key) {
  absl::MutexLock lock(&mu_);
  // Sends already queued stay queued (D was told about them, or will time
  // out waiting for them): the channel keeps its order either way.
  transfers_.erase(key);
}

void NcclSender::ForgetAll() {
  peers_.clear();
  transfers_.clear();
}

}  // namespace tandem::kvtransfer::nccl
