#include "decode_worker/remote_kv_loader.h"

#include <string_view>
#include <utility>

#include "absl/strings/str_cat.h"
#include "common/server/log.h"
#include "engine/kv/device_kv.h"
#include "kvtransfer/data_plane.h"

namespace tandem::decode {
namespace {

// Writes received K/V rows into a sequence's blocks (token addressing, so
// the prefill worker's block size does not matter). A storage on a GPU
// (kv::DeviceKvAccess) is also a device target for nccl / cuda_ipc.
class BlockTableWriter : public kvtransfer::KvWriter {
 public:
  BlockTableWriter(kv::KvStorage* storage, std::vector<int32_t> table)
      : storage_(storage), table_(std::move(table)) {
    device_.kv = dynamic_cast<kv::DeviceKvAccess*>(storage);
    if (device_.kv != nullptr) device_.block_table = table_;
  }
  const kvtransfer::DeviceKvTarget* device_target() const override {
    return device_.kv != nullptr ? &device_ : nullptr;
  }
  void WriteRows(uint32_t layer, uint32_t token_start, uint32_t token_count, const char* k,
                 const char* v) override {
    storage_->WriteTokens(table_, static_cast<int32_t>(layer), static_cast<int32_t>(token_start),
                          static_cast<int32_t>(token_count), k, v);
  }

 private:
  kv::KvStorage* const storage_;
  const std::vector<int32_t> table_;   // a copy: the manager's may grow later
  kvtransfer::DeviceKvTarget device_;  // kv null: a host storage
};

}  // namespace

absl::StatusOr<std::unique_ptr<ReceiverKvLoader>> ReceiverKvLoader::Start(
    const kvtransfer::KvReceiver::Options& options, const kvtransfer::KvLayout& layout,
    std::shared_ptr<const KvDataPlanes> planes) {
  kvtransfer::KvReceiver::Options o = options;
  if (planes != nullptr && !planes->transports.empty()) {
    o.transports = planes->transports;
    o.data_receivers = planes->receivers;
  }
  kvtransfer::TransportOffer offer;
  offer.transports =
      o.transports.empty() ? std::vector{kvtransfer::KvTransport::kTcp} : o.transports;
  offer.host_id = kvtransfer::LocalHostId();
  offer.instance_id = kvtransfer::NewInstanceId();
  auto receiver = kvtransfer::KvReceiver::Start(o, layout);
  if (!receiver.ok()) return receiver.status();
  return std::unique_ptr<ReceiverKvLoader>(new ReceiverKvLoader(
      std::move(planes), std::move(*receiver), options.host, layout, std::move(offer)));
}

kvtransfer::KvReceiver::Options ReceiverKvLoader::OptionsFromConfig(const HostPort& kv_listen,
                                                                    const KvConfig& kv) {
  kvtransfer::KvReceiver::Options o;
  o.host = kv_listen.host;
  o.port = kv_listen.port;
  o.handshake_timeout_ms = kv.handshake_timeout_ms;
  o.transfer_timeout_ms = kv.transfer_timeout_ms;
  // kvtransfer does not depend on common/server: its lines come here.
  o.log = [](std::string_view line) { rpc::Log(absl::string_view(line.data(), line.size())); };
  return o;
}

ReceiverKvLoader::ReceiverKvLoader(std::shared_ptr<const KvDataPlanes> planes,
                                   std::unique_ptr<kvtransfer::KvReceiver> receiver,
                                   std::string host, kvtransfer::KvLayout layout,
                                   kvtransfer::TransportOffer offer)
    : planes_(std::move(planes)),
      receiver_(std::move(receiver)),
      host_(std::move(host)),
      layout_(std::move(layout)),
      offer_(std::move(offer)) {}

std::optional<std::string> PeerClassNotes::Note(const std::string& peer_class) {
  if (peer_class.empty() || peer_class == local_) return std::nullopt;
  absl::MutexLock lock(&mu_);
  if (!noted_.insert(peer_class).second) return std::nullopt;
  return absl::StrCat("KV from a prefill worker of bit-exact class ", peer_class,
                      ", but this decode worker's is ", local_,
                      ": a request prefilled there may differ in its last bits from one "
                      "prefilled here (check engine.q8_matmul, engine.kernel_isa and "
                      "engine.kv_cache_dtype on both; logged once per class)");
}

std::string ReceiverKvLoader::endpoint() const {
  if (!endpoint_.empty()) return endpoint_;
  return absl::StrCat(host_, ":", receiver_->port());
}

int ReceiverKvLoader::port() const { return receiver_->port(); }

absl::StatusOr<core::KvTarget> ReceiverKvLoader::StartLoad(
    const std::string& request_id, uint32_t attempt, int32_t hit_tokens, int32_t prompt_tokens,
    kv::KvStorage* storage, std::vector<int32_t> block_table, Done done) {
  // The writer lives in the receiver's callback, which it keeps until it
  // has run: nothing writes into it afterwards.
  auto writer = std::make_shared<BlockTableWriter>(storage, std::move(block_table));
  kvtransfer::KvWriter* raw_writer = writer.get();
  absl::Status expect = receiver_->Expect(
      request_id, attempt, static_cast<uint32_t>(hit_tokens), static_cast<uint32_t>(prompt_tokens),
      raw_writer,
      [writer, notes = class_notes_, done = std::move(done)](absl::Status status,
                                                             const kvtransfer::TransferResult& r) {
        if (notes != nullptr && status.ok()) {
          if (std::optional<std::string> line = notes->Note(r.peer_bit_exact_class)) {
            rpc::Log(*line);
          }
        }
        core::RemotePrefillResult result;
        result.peer_bit_exact_class = r.peer_bit_exact_class;
        result.kv_bytes = r.kv_bytes;
        result.stream_seconds = r.stream_seconds;
        for (size_t i = 0; status.ok() && i < r.samples.size(); ++i) {
          if (r.samples[i].finish_reason > static_cast<uint32_t>(core::FinishReason::kContext)) {
            status =
                absl::DataLossError(absl::StrCat("KV transfer FINAL carried samples[", i,
                                                 "].finish_reason ", r.samples[i].finish_reason));
          }
        }
        for (const kvtransfer::FinalSample& s : r.samples) {
          core::SampleStart& start = result.samples.emplace_back();
          start.token.token_id = s.token;
          start.token.logprob = s.logprob;
          for (const kvtransfer::FinalTopLogprob& top : s.top_logprobs) {
            start.token.top_logprobs.push_back({top.token_id, top.logprob});
          }
          start.finish_reason = static_cast<core::FinishReason>(s.finish_reason);
        }
        done(std::move(status), std::move(result));
      });
  if (!expect.ok()) return expect;
  core::KvTarget target;
  target.endpoint = endpoint();
  target.request_id = request_id;
  target.attempt = attempt;
  target.hit_tokens = static_cast<uint32_t>(hit_tokens);
  SetTransportOffer(offer_, &target);
  return target;
}

void ReceiverKvLoader::CancelLoad(const std::string& request_id) { receiver_->Cancel(request_id); }

uint32_t ReceiverKvLoader::loads_in_flight() const { return receiver_->transfers_in_flight(); }

uint64_t ReceiverKvLoader::bytes_received_total() const {
  return receiver_->kv_bytes_received_total();
}

uint64_t ReceiverKvLoader::bytes_received_total(kvtransfer::KvTransport transport) const {
  return receiver_->kv_bytes_received(transport);
}

uint64_t ReceiverKvLoader::transfers_completed_total() const {
  return receiver_->transfers_completed_total();
}

double ReceiverKvLoader::transfer_seconds_total() const {
  return receiver_->transfer_seconds_total();
}

}  // namespace tandem::decode
