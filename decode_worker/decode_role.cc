#include "decode_worker/decode_role.h"

#include <utility>

#include "absl/strings/str_cat.h"
#include "decode_worker/decode_service.h"
#include "worker/worker_main.h"

namespace tandem::decode {
namespace {

// The KV receiver on the entry's kv_listen: the core's remote KV loader.
[[nodiscard]] absl::StatusOr<std::unique_ptr<core::RemoteKvLoader>> MakeKvReceiver(
    const WorkerContext& ctx, const SharedCoreParts& shared) {
  kvtransfer::KvReceiver::Options kv_options =
      ReceiverKvLoader::OptionsFromConfig(ctx.worker->kv_listen, ctx.config->kv);
  kv_options.auth = ctx.auth;  // HELLOs must carry the cluster credential
  auto receiver = ReceiverKvLoader::Start(kv_options, shared.layout, shared.planes);
  const std::string& key = ctx.key_prefix;
  if (!receiver.ok()) {
    return absl::Status(receiver.status().code(),
                        absl::StrCat(key, "kv_listen: ", receiver.status().message()));
  }
  auto kv_address =
      AdvertisedAddress(ctx.worker->kv_listen, (*receiver)->port(), ctx.worker->kv_advertise,
                        key + "kv_listen", key + "kv_advertise");
  if (!kv_address.ok()) return kv_address.status();
  (*receiver)->set_endpoint(kv_address->ToString());
  (*receiver)->set_bit_exact_class(shared.bit_exact_class);
  return std::unique_ptr<core::RemoteKvLoader>(*std::move(receiver));
}

[[nodiscard]] absl::StatusOr<std::unique_ptr<WorkerRuntime>> MakeDecodeRuntime(
    const WorkerContext& ctx, const SharedCoreParts& shared) {
  // The core's loader is the receiver MakeKvReceiver built (this role's).
  const auto* receiver = static_cast<const ReceiverKvLoader*>(shared.core->loader());
  return std::make_unique<DecodeService>(shared.core, receiver, shared.bit_exact_class, ctx.status,
                                         ctx.auth, ctx.gate);
}

}  // namespace

WorkerRoleSpec DecodeRole() { return {v1::ROLE_DECODE, {}, MakeKvReceiver, MakeDecodeRuntime}; }

}  // namespace tandem::decode
