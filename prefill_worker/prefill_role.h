// The prefill role of the worker runtime (worker/worker_main.h): its KV
// sender (KvSendQueue over the worker's data planes) as the engine core's
// KV export, and PrefillService as the runtime.
#ifndef TANDEM_PREFILL_WORKER_PREFILL_ROLE_H_
#define TANDEM_PREFILL_WORKER_PREFILL_ROLE_H_

#include "worker/worker_main.h"

namespace tandem::prefill {

// ROLE_PREFILL and the factory that builds the prefill runtime.
// kv.send_buffer_bytes and kv.transfer_timeout_ms configure the KV sender
// (kvtransfer::KvSendQueue: one thread for every transfer); kv.transport
// its transports (worker/kv_data_planes.h). Extra flags, tests only:
// --fault-stall-after-frames N stalls the KV send after N frames (to
// exercise the decode worker's transfer timeout); --fault-fail-reply true
// answers every Prefill whose KV transfer succeeded with UNAVAILABLE (a
// reply lost after FINAL). A bad value is INVALID_ARGUMENT naming the flag.
WorkerRoleSpec PrefillRole();

}  // namespace tandem::prefill

#endif  // TANDEM_PREFILL_WORKER_PREFILL_ROLE_H_
