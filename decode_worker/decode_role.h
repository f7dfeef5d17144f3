// The decode role of the worker runtime (worker/worker_main.h): its KV
// receiver (ReceiverKvLoader on the entry's kv_listen) as the engine core's
// remote KV loader, and DecodeService as the runtime.
#ifndef TANDEM_DECODE_WORKER_DECODE_ROLE_H_
#define TANDEM_DECODE_WORKER_DECODE_ROLE_H_

#include "worker/worker_main.h"

namespace tandem::decode {

// ROLE_DECODE, no extra flags, and the factory that builds the decode
// runtime. Its errors name the key: "decode_workers[NAME].kv_listen: ...",
// "decode_workers[NAME].kv_advertise: ..." (prefill_workers[NAME] for a
// worker that starts as a prefill worker).
WorkerRoleSpec DecodeRole();

}  // namespace tandem::decode

#endif  // TANDEM_DECODE_WORKER_DECODE_ROLE_H_
