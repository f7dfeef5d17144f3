#include "decode_worker/remote_kv_loader.h"

#include <string_view>
#include <utility>

#include "absl/strings/str_cat.h"
#include "common/server/log.h"

namespace tandem::decode {
namespace {

// Writes received K/V rows into a sequence's blocks (token addressing, so
// the prefill worker's block size does not matter).
class BlockTableWriter : public kvtransfer::KvWriter {
 public:
  BlockTableWriter(kv::KvStorage* storage, std::vector<int32_t> table)
      : storage_(storage), table_(std::move(table)) {}
  void WriteRows(uint32_t layer, uint32_t token_start, uint32_t token_count, const char* k,
                 const char* v) override {
    storage_->WriteTokens(table_, static_cast<int32_t>(layer), static_cast<int32_t>(token_start),
                          static_cast<int32_t>(token_count), k, v);
  }

 private:
  kv::KvStorage* const storage_;
  const std::vector<int32_t> table_;  // a copy: the manager's may grow later
};

}  // namespace

absl::StatusOr<std::unique_ptr<ReceiverKvLoader>> ReceiverKvLoader::Start(
    const kvtransfer::KvReceiver::Options& options, const kvtransfer::KvLayout& layout) {
  auto receiver = kvtransfer::KvReceiver::Start(options, layout);
  if (!receiver.ok()) return receiver.status();
  return std::unique_ptr<ReceiverKvLoader>(
      new ReceiverKvLoader(std::move(*receiver), options.host, layout));
}

kvtransfer::KvReceiver::Options ReceiverKvLoader::OptionsFromConfig(const HostPort& kv_listen,
                                                                    const KvConfig& kv) {
  kvtransfer::KvReceiver::Options o;
  o.host = kv_listen.host;
  o.port = kv_listen.port;
  o.handshake_timeout_ms = kv.handshake_timeout_ms;
  o.transfer_timeout_ms = kv.transfer_timeout_ms;
  // kvtransfer does not depend on common/server: its lines come here.
  o.log = [](std::string_view line) {
    rpc::Log(absl::string_view(line.data(), line.size()));
  };
  return o;
}

ReceiverKvLoader::ReceiverKvLoader(std::unique_ptr<kvtransfer::KvReceiver> receiver,
                                   std::string host, kvtransfer::KvLayout layout)
    : receiver_(std::move(receiver)), host_(std::move(host)), layout_(std::move(layout)) {}

std::string ReceiverKvLoader::endpoint() const {
  if (!endpoint_.empty()) return endpoint_;
  return absl::StrCat(host_, ":", receiver_->port());
}

int ReceiverKvLoader::port() const { return receiver_->port(); }

absl::StatusOr<core::RemotePrefillTarget> ReceiverKvLoader::StartLoad(
    const std::string& request_id, uint32_t attempt, int32_t hit_tokens, int32_t prompt_tokens,
    kv::KvStorage* storage, std::vector<int32_t> block_table, Done done) {
  // The writer lives in the receiver's callback, which it keeps until it
  // has run: nothing writes into it afterwards.
  auto writer = std::make_shared<BlockTableWriter>(storage, std::move(block_table));
  kvtransfer::KvWriter* raw_writer = writer.get();
  absl::Status expect = receiver_->Expect(
      request_id, attempt, static_cast<uint32_t>(hit_tokens),
      static_cast<uint32_t>(prompt_tokens), raw_writer,
      [writer, done = std::move(done)](absl::Status status,
                                       const kvtransfer::TransferResult& r) {
        core::RemotePrefillResult result;
        result.peer_bit_exact_class = r.peer_bit_exact_class;
        for (size_t i = 0; status.ok() && i < r.samples.size(); ++i) {
          if (r.samples[i].finish_reason > static_cast<uint32_t>(core::FinishReason::kContext)) {
            status = absl::DataLossError(absl::StrCat("KV transfer FINAL carried samples[", i,
                                                      "].finish_reason ",
                                                      r.samples[i].finish_reason));
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
  return core::RemotePrefillTarget{endpoint(), hit_tokens, attempt};
}

void ReceiverKvLoader::CancelLoad(const std::string& request_id) {
  receiver_->Cancel(request_id);
}

uint32_t ReceiverKvLoader::loads_in_flight() const { return receiver_->transfers_in_flight(); }

uint64_t ReceiverKvLoader::bytes_received_total() const {
  return receiver_->kv_bytes_received_total();
}

}  // namespace tandem::decode
