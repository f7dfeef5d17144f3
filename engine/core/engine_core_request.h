// EngineCore's per-request state, shared by engine_core.cc (every
// request), engine_core_export.cc (P's KV export) and
// engine_core_remote_load.cc (D's remote load). Internal to those files:
// nothing outside engine/core includes it.
//
// A request holds what every request needs, plus the state of its role, if
// any: ExportState for a prefill-only request (EngineRequest::kv_export),
// RemoteLoadState once a remote prefill started. Threads: the loop thread
// only (OpenExport runs in Submit, before the request is handed over).
#ifndef TANDEM_ENGINE_CORE_ENGINE_CORE_REQUEST_H_
#define TANDEM_ENGINE_CORE_ENGINE_CORE_REQUEST_H_

#include <chrono>
#include <cstdint>
#include <memory>
#include <optional>
#include <vector>

#include "absl/status/status.h"
#include "engine/core/engine_core.h"

namespace tandem::core {

// The lifecycle of a prefill-only request's KV export. The phase changes
// only in ExportState::Enter, which allows exactly these moves:
//
//   kWaitingForRoom -> kScheduled -> kSending -> kDraining -> kDone
//   (any phase but kDone) -> kDone   the transfer ended early (an error)
enum class ExportPhase {
  // Open ran in Submit; the sequence waits outside the scheduler
  // (ExportState::unscheduled) until the export's Ready() first says yes.
  kWaitingForRoom,
  // In the scheduler; no row sent yet.
  kScheduled,
  // The first chunk ran: the rows the prefix cache held went out, and each
  // computed layer follows as the forward writes it.
  kSending,
  // Every sample ended OK (token 0 queued with Finish): the sequence left
  // the scheduler, its blocks are pinned until the export's Result().
  kDraining,
  // The transfer ended (Result(), or Ready()'s error): EndRequest ends the
  // request for good.
  kDone,
};

// P's role state: the request's KV export (req.kv_export).
struct EngineCore::ExportState {
  ExportPhase phase = ExportPhase::kWaitingForRoom;
  std::chrono::steady_clock::time_point opened;  // when Open ran
  absl::Status error;                            // the first failure; the request ends with it
  // kWaitingForRoom: the request's sequence, handed to the scheduler on
  // leaving that phase.
  scheduler::SeqState unscheduled;
  // kDraining, kDone: the blocks kept for the transfer (unpinned at the end).
  std::vector<int32_t> pinned;
  // kDraining: the last sample's finish, told when the transfer ends OK.
  std::optional<Ending> drain_last;

  // The one place the phase changes; `next` must be a move the diagram
  // above allows (anything else aborts: a programmer error).
  void Enter(ExportPhase next);
};

// D's role state: the remote prefill of the request's prompt. Where the
// sequence stands (WAITING_FOR_REMOTE_KV, ABORTING) is the scheduler's
// SeqStatus; this holds what the core adds to it.
struct EngineCore::RemoteLoadState {
  uint32_t attempt = 0;  // the remote prefill attempt awaited (1, 2, ...)
  // Why a request aborted while loading ends, once its load quiesced.
  absl::Status abort_status;
  // AbortRemotePrefill for the awaited attempt: its load was cancelled;
  // when its done arrives this is the cause the failover acts on.
  std::optional<RemoteAbort> router_abort;
  // When the load's done ran, until the first decode step
  // (CoreStats::kv_load_to_first_decode_seconds_total).
  std::optional<std::chrono::steady_clock::time_point> load_done_at;
};

// When a request passed each point of its path on this worker
// (RequestPhases is computed from them).
struct RequestClock {
  using TimePoint = std::chrono::steady_clock::time_point;
  TimePoint submitted;                    // Submit accepted it
  std::optional<TimePoint> placed;        // handed to the scheduler
  std::optional<TimePoint> first_chunk;   // the step of its first prefill chunk began
  std::optional<TimePoint> load_started;  // the awaited remote load attempt started
  std::optional<TimePoint> load_done;     // its done ran (every K/V row in)
  std::optional<TimePoint> first_decode;  // the step of its first decode after the load began
  bool reported = false;                  // OnPhases was called
};

struct EngineCore::Request {
  EngineRequest req;  // controls.stop_token_ids sorted and unique
  RequestClock clock;
  // Placement kSlo's decision for sample 0's sequence (set in Arrive).
  std::optional<scheduler::PlacementPrediction> placement;
  std::shared_ptr<CancelFlag> cancelled;
  std::vector<sampling::SamplingOptions> sampling;  // per sample (its seed)
  std::vector<int64_t> seq_ids;                     // per sample: its live sequence, 0 if none
  std::vector<bool> sample_done;                    // per sample: finished
  std::vector<bool> cancel_requested;               // per sample: CancelSample before token 0
  int32_t samples_left = 0;                         // samples not finished
  // An n > 1 migration (EngineRequest::migrated_samples): every sample is
  // its own sequence from arrival on; nothing is forked.
  bool independent_samples = false;
  // Role state: set iff req.kv_export (from Submit on).
  std::optional<ExportState> export_state;
  // Role state: set from the first remote prefill attempt on.
  std::optional<RemoteLoadState> remote_load;

  RequestStops stops() const {
    return RequestStops{req.controls.stop_token_ids, req.controls.ignore_eos,
                        req.controls.min_tokens, req.max_tokens};
  }
  // The export failed (it ends at the end of its step).
  bool export_failed() const { return export_state.has_value() && !export_state->error.ok(); }
};

}  // namespace tandem::core

#endif  // TANDEM_ENGINE_CORE_ENGINE_CORE_REQUEST_H_
