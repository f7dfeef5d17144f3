#include "decode_worker/decode_role.h"

#include <utility>

#include "absl/strings/str_cat.h"
#include "decode_worker/decode_service.h"
#include "worker/worker_parts.h"

namespace tandem::decode {
namespace {

[[nodiscard]] absl::StatusOr<std::unique_ptr<WorkerRuntime>> MakeDecodeRuntime(
    const WorkerContext& ctx) {
  absl::StatusOr<WorkerBackendParts> parts = BuildWorkerBackendParts(ctx);
  if (!parts.ok()) return parts.status();
  kvtransfer::KvReceiver::Options kv_options =
      ReceiverKvLoader::OptionsFromConfig(ctx.worker->kv_listen, ctx.config->kv);
  kv_options.auth = ctx.auth;  // HELLOs must carry the cluster credential
  auto receiver = ReceiverKvLoader::Start(kv_options, parts->layout, parts->planes);
  const std::string key = absl::StrCat("decode_workers[", ctx.worker->name, "].");
  if (!receiver.ok()) {
    return absl::Status(receiver.status().code(),
                        absl::StrCat(key, "kv_listen: ", receiver.status().message()));
  }
  auto kv_address =
      AdvertisedAddress(ctx.worker->kv_listen, (*receiver)->port(), ctx.worker->kv_advertise,
                        key + "kv_listen", key + "kv_advertise");
  if (!kv_address.ok()) return kv_address.status();
  (*receiver)->set_endpoint(kv_address->ToString());
  ReceiverKvLoader* loader = receiver->get();
  loader->set_bit_exact_class(parts->bit_exact_class);
  auto core = MakeWorkerCore(ctx, "decode worker", std::move(parts->backend), *std::move(receiver));
  return std::make_unique<DecodeService>(std::move(core), loader, parts->bit_exact_class,
                                         ctx.status, ctx.auth);
}

}  // namespace

WorkerRoleSpec DecodeRole() { return {v1::ROLE_DECODE, {}, MakeDecodeRuntime}; }

}  // namespace tandem::decode
