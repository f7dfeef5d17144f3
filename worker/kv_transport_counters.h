// What a worker's KV data paths have done, per transport (issue #16), for
// its Prometheus metrics (worker_metrics.h): a plain snapshot the worker
// fills from its sources at scrape time.
//
// Sources (connected by the worker's wiring, worker_main / the runtime):
//   bytes_sent[t]       P: payload bytes sent over transport t (tcp: the
//                       KV send queue's FRAME payloads; nccl / cuda_ipc:
//                       KvDataSender::bytes_total() of that transport);
//   bytes_received[t]   D: KvReceiver::kv_bytes_received(t);
//   transfer_seconds_sum, transfers
//                       D: KvReceiver::transfer_seconds_total() and
//                       transfers_completed_total(): per completed transfer,
//                       the time from its first frame (FRAME or FRAME_DESC)
//                       to its FINAL, summed, and how many;
//   load_to_first_decode_seconds_sum, loads
//                       D: the engine core's stats: per remote KV load, the
//                       time from the FINAL that completed it to the
//                       sequence's first decode step, summed, and how many.
// Every field is monotonic (a counter). The sums over t of bytes_sent /
// bytes_received are what WorkerStatus calls kv_bytes_sent_total /
// kv_bytes_received_total. A worker without device data paths (a CPU
// worker) moves everything over tcp: WorkerMetrics builds its snapshot from
// the status then (CountersFromStatus).
//
// Owns: the struct and the label names. Does not touch: the counting.
// Threads: a value type.
#ifndef TANDEM_WORKER_KV_TRANSPORT_COUNTERS_H_
#define TANDEM_WORKER_KV_TRANSPORT_COUNTERS_H_

#include <array>
#include <cstdint>
#include <string_view>

#include "kvtransfer/transport.h"
#include "tandem/v1/common.pb.h"

namespace tandem {

// The metric label of each transport, indexed by kvtransfer::KvTransport's
// number (the same spelling as KvTransportName).
inline constexpr std::array<std::string_view, kvtransfer::kNumKvTransports> kKvTransportLabels = {
    "tcp", "nccl", "cuda_ipc"};
static_assert(static_cast<int>(kvtransfer::KvTransport::kTcp) == 0 &&
              static_cast<int>(kvtransfer::KvTransport::kNccl) == 1 &&
              static_cast<int>(kvtransfer::KvTransport::kCudaIpc) == 2);

struct KvTransportCounters {
  // Payload bytes (K/V rows, no headers) by transport, indexed by
  // static_cast<int>(kvtransfer::KvTransport).
  std::array<uint64_t, kvtransfer::kNumKvTransports> bytes_sent{};
  std::array<uint64_t, kvtransfer::kNumKvTransports> bytes_received{};
  // D: first frame .. FINAL of each completed transfer, seconds, summed;
  // and the number of those transfers.
  double transfer_seconds_sum = 0;
  uint64_t transfers = 0;
  // D: FINAL .. the sequence's first decode step, seconds, summed; and the
  // number of such loads.
  double load_to_first_decode_seconds_sum = 0;
  uint64_t loads = 0;

  uint64_t& sent(kvtransfer::KvTransport t) { return bytes_sent[static_cast<int>(t)]; }
  uint64_t& received(kvtransfer::KvTransport t) { return bytes_received[static_cast<int>(t)]; }
};

// The counters of a worker whose KV moves over tcp only: `status`'s
// kv_bytes_sent_total / kv_bytes_received_total as tcp's, the rest 0.
inline KvTransportCounters CountersFromStatus(const v1::WorkerStatus& status) {
  KvTransportCounters c;
  c.sent(kvtransfer::KvTransport::kTcp) = status.kv_bytes_sent_total();
  c.received(kvtransfer::KvTransport::kTcp) = status.kv_bytes_received_total();
  return c;
}

}  // namespace tandem

#endif  // TANDEM_WORKER_KV_TRANSPORT_COUNTERS_H_
