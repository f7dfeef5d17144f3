// Where a remote prefill worker sends a prompt's KV: the one record that
// crosses engine -> proto -> router -> prefill worker (issue #33). The
// decode worker's RemoteKvLoader fills it, the core hands it to
// RequestOutput::OnRemotePrefill, the decode worker sends it as
// tandem.v1.NeedRemotePrefill.kv_target, the router forwards that message
// untouched in PrefillRequest.kv_target, and the prefill worker reads it
// back (KvTargetToProto / KvTargetFromProto, common/server/proto_convert.h,
// the one converter pair). Fields mirror tandem.v1.KvTarget one for one.
#ifndef TANDEM_ENGINE_CORE_KV_TARGET_H_
#define TANDEM_ENGINE_CORE_KV_TARGET_H_

#include <cstdint>
#include <string>
#include <vector>

namespace tandem::core {

struct KvTarget {
  std::string endpoint;     // host:port of the decode worker's KV receiver
  std::string request_id;   // the decode worker's request id (its receiver's key)
  uint32_t attempt = 1;     // remote prefill attempt, 1, 2, ...
  uint32_t hit_tokens = 0;  // D_hit: tokens the receiver holds; P sends [hit_tokens, L)
  // The receiver's transport offer (kvtransfer/transport.h, TransportOffer):
  // transport names most preferred first ("cuda_ipc", "nccl", "tcp"; empty =
  // tcp only), its host id (cuda_ipc only between equal ones) and its process
  // instance id (a restarted decode worker is a new peer).
  std::vector<std::string> kv_transports;
  std::string kv_host_id;
  std::string kv_instance_id;

  bool operator==(const KvTarget&) const = default;
};

}  // namespace tandem::core

#endif  // TANDEM_ENGINE_CORE_KV_TARGET_H_
