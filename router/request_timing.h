// Where one request's time went (issue #34; docs/architecture.md, "Where
// TTFT goes"): the router's own marks on its steady clock joined with the
// workers' reports (WorkerPhases) into the RequestTiming and Placement that
// each sample's last message carries (proto/tandem/v1/generation.proto).
//
// The phases on the first token's path add up to ttft_ms by construction:
//   ttft_ms = router_queue_ms + placement_ms + prefill_queue_ms + prefill_ms
//   router_queue_ms  = the decode call started - arrival (admission queue,
//                      validation, the decode worker pick)
//   local prefill (D's):
//     placement_ms, prefill_queue_ms  D's WorkerPhases
//     prefill_ms       = (first token sent - decode call started)
//                        - placement_ms - prefill_queue_ms: D's prefill and
//                        both RPC transits
//   remote prefill (P's token 0):
//     placement_ms     = the Prefill call started - the decode call
//                        started: D's decision, its NeedRemotePrefill, the
//                        prefill worker pick (and any failed attempt)
//     prefill_queue_ms = P's WorkerPhases.prefill_queue_ms
//     prefill_ms       = (first token sent - the Prefill call started)
//                        - prefill_queue_ms: P's prefill and the RPC
//     kv_transfer_ms, decode_admission_ms, first_decode_ms: D's
//                        WorkerPhases (after token 0, not in the sum)
// The last phase of the sum ends at the first token sent, not at token 0's
// arrival: the two are the same instant unless a stop string holds token 0
// back, and this way the sum is exact. Each phase is clamped to >= 0; a
// worker's report larger than the time the router saw is shrunk (later
// phases first in the order above) so the sum still equals ttft_ms.
//
// Retries, fallback and migration: the path is the one that produced the
// first token sent: the decode stream current at that moment and, on the
// remote route, the Prefill call whose reply delivered token 0. A failed
// prefill attempt before it falls into placement_ms; a decode stream
// started after the first token (a migration) changes nothing.
//
// Owns: one request's marks. Does not touch: gRPC, the samples' output.
// Threads: none; not thread-safe (GenerateCall calls it under its lock).
#ifndef TANDEM_ROUTER_REQUEST_TIMING_H_
#define TANDEM_ROUTER_REQUEST_TIMING_H_

#include <chrono>
#include <optional>

#include "tandem/v1/common.pb.h"
#include "tandem/v1/generation.pb.h"
#include "tandem/v1/worker.pb.h"

namespace tandem::router {

// What the router saw on the first token's path, in ms since the request's
// arrival at the router (steady clock).
struct RequestMarks {
  // The decode call that produced the first token started.
  double decode_call_ms = 0;
  // Remote prefill: the Prefill call whose reply delivered token 0
  // started; absent: D prefilled the prompt.
  std::optional<double> prefill_call_ms;
  // The first message with tokens was queued for the client.
  double first_token_ms = 0;
  // This sample's last message (with finish_reason).
  double last_message_ms = 0;
};

// The RequestTiming of `marks` with the decode worker's report `decode`
// and, on the remote route, the prefill worker's `prefill` (the rules
// above; an unreported phase is 0). ttft_ms = first_token_ms, e2e_ms =
// last_message_ms (each at least 0, e2e at least ttft).
v1::RequestTiming AssembleRequestTiming(const RequestMarks& marks, const v1::WorkerPhases& decode,
                                        const v1::WorkerPhases& prefill);

// The Placement a sample's last message carries: the decode worker's
// `reported` one (null: it sent none, and the predictions are 0), its
// decision set to where the prompt was prefilled ("remote" if `remote`,
// else "local"), which differs from D's only after a fallback.
v1::Placement PlacementOf(const v1::Placement* reported, bool remote);

// One request's marks as GenerateCall sees them, turned into each sample's
// RequestTiming and Placement.
class RequestTimingRecorder {
 public:
  using Clock = std::chrono::steady_clock;

  // `arrival`: when the request reached the router (the start of TTFT).
  explicit RequestTimingRecorder(Clock::time_point arrival) : arrival_(arrival) {}

  // Decode stream number `stream` (the request's 1st, 2nd, ...) started at
  // `now`. Before the first token, a new stream replaces the path so far
  // (its own decision and prefill follow); after it, changes nothing.
  void DecodeStarted(int stream, Clock::time_point now);
  // Decode stream `stream` sent `phases` / `placement` (either may be null:
  // not in that message). Kept if the stream is, or may still become,
  // the first token's.
  void DecodeReported(int stream, const v1::WorkerPhases* phases, const v1::Placement* placement);
  // The Prefill call started at `call_start` answered with token 0 and
  // P's `phases` (before the first token: later calls do nothing).
  void PrefillDelivered(Clock::time_point call_start, const v1::WorkerPhases& phases);
  // A message with tokens was queued for the client at `now`; the first
  // fixes the path.
  void TokenSent(Clock::time_point now);

  // A sample's last message, sent at `now` (if no token was sent before,
  // `now` is the first token's time too).
  v1::RequestTiming Timing(Clock::time_point now) const;
  // Its placement; `remote`: the route the message names.
  v1::Placement Placement(bool remote) const;

 private:
  double MsSinceArrival(Clock::time_point t) const;

  const Clock::time_point arrival_;
  int stream_ = 0;  // the current (after the first token: the first token's) decode stream
  Clock::time_point decode_start_{};
  std::optional<Clock::time_point> prefill_start_;  // remote: the delivering call's start
  v1::WorkerPhases decode_phases_;
  v1::WorkerPhases prefill_phases_;
  std::optional<v1::Placement> placement_;  // D's, when it sent one
  std::optional<Clock::time_point> first_token_;
};

}  // namespace tandem::router

#endif  // TANDEM_ROUTER_REQUEST_TIMING_H_
