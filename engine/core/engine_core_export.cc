// P's side of the engine core: a prefill-only request's KV export
// (EngineRequest::kv_export) through its ExportPhase lifecycle
// (engine_core_request.h): opened in Submit, held outside the scheduler
// until the receiver has room, rows sent per layer as the forward writes
// them, token 0 queued behind them, then drained until the transfer's
// Result() with the blocks pinned.
#include <chrono>
#include <cstdlib>
#include <optional>
#include <set>
#include <string>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "engine/core/engine_core.h"
#include "engine/core/engine_core_request.h"
#include "engine/kv/device_kv.h"

namespace tandem::core {
namespace {

// The moves the ExportPhase diagram allows.
bool ExportMoveAllowed(ExportPhase from, ExportPhase to) {
  if (to == ExportPhase::kDone) return from != ExportPhase::kDone;
  switch (from) {
    case ExportPhase::kWaitingForRoom:
      return to == ExportPhase::kScheduled;
    case ExportPhase::kScheduled:
      return to == ExportPhase::kSending;
    case ExportPhase::kSending:
      return to == ExportPhase::kDraining;
    case ExportPhase::kDraining:
    case ExportPhase::kDone:
      return false;
  }
  return false;
}

}  // namespace

void EngineCore::ExportState::Enter(ExportPhase next) {
  if (!ExportMoveAllowed(phase, next)) std::abort();  // a programmer error
  phase = next;
}

absl::Status EngineCore::OpenExport(Request& r) {
  // The transfer opens on receipt, not when the loop gets to the request
  // (a long step may run first): the receiver hears HELLO at once, and
  // the export keeps the connection alive while the request waits
  // (kvtransfer/send_queue.h, keepalive).
  ExportState& e = r.export_state.emplace();
  e.opened = std::chrono::steady_clock::now();
  absl::Status open = r.req.kv_export->Open(r.cancelled, [this] {
    absl::MutexLock lock(&mu_);
    export_wake_ = true;
    cv_.Signal();
  });
  if (!open.ok()) r.export_state.reset();
  return open;
}

void EngineCore::ArriveExporting(Request& r, scheduler::SeqState s) {
  // A prefill-only request (its export opened in Submit) joins the
  // scheduler once its export has room (PollExports, before every step).
  ExportState& e = *r.export_state;
  e.unscheduled = std::move(s);
  if (r.cancelled->load()) {
    // Cancelled (or shutting down) before it got here: the Abort that
    // follows ends it (and closes the export).
    e.error = absl::CancelledError("request cancelled");
  }
}

std::set<int64_t> EngineCore::PollExports() {
  std::set<int64_t> held;
  bool device_drain_pending = false;
  std::vector<std::pair<std::string, absl::Status>> ended;
  for (auto& [id, rp] : requests_) {
    Request& r = *rp;
    if (!r.export_state.has_value()) continue;
    ExportState& e = *r.export_state;
    switch (e.phase) {
      case ExportPhase::kDraining: {
        std::optional<absl::Status> result = r.req.kv_export->Result();
        if (result.has_value()) {
          ended.emplace_back(id, *std::move(result));
        } else if (r.req.kv_export->sends_device_rows()) {
          device_drain_pending = true;
        }
        continue;
      }
      case ExportPhase::kDone:  // EndRequest has ended it
        continue;
      case ExportPhase::kWaitingForRoom:
      case ExportPhase::kScheduled:
      case ExportPhase::kSending:
        break;
    }
    if (!e.error.ok()) continue;  // ends at the end of its step
    absl::StatusOr<bool> ready = r.req.kv_export->Ready();
    if (!ready.ok()) {
      ended.emplace_back(id, ready.status());
      continue;
    }
    if (!*ready) {
      if (e.phase != ExportPhase::kWaitingForRoom) held.insert(r.seq_ids[0]);
      continue;
    }
    if (e.phase == ExportPhase::kWaitingForRoom) {
      scheduler_.Add(std::move(e.unscheduled));
      e.Enter(ExportPhase::kScheduled);
    }
  }
  {
    absl::MutexLock lock(&mu_);
    device_drain_pending_ = device_drain_pending;
  }
  for (auto& [id, status] : ended) {
    auto it = requests_.find(id);
    if (it == requests_.end()) continue;
    ExportState& e = *it->second->export_state;
    e.Enter(ExportPhase::kDone);
    if (status.ok() && e.drain_last.has_value()) {
      const Ending last = *e.drain_last;
      EndRequest(id, status, &last);
    } else {
      EndRequest(id, status);
    }
  }
  return held;
}

void EngineCore::ExportCachedRows(Request& r, const scheduler::ScheduledChunk& chunk) {
  ExportState& e = *r.export_state;
  if (e.phase != ExportPhase::kScheduled) return;
  // The first chunk starts at this worker's prefix hit: K/V of
  // [D_hit, hit) come from cached blocks (DESIGN.md, step 5).
  e.Enter(ExportPhase::kSending);
  const int32_t n_layers = backend_->config().n_layers;
  for (int32_t layer = 0; layer < n_layers; ++layer) {
    ExportRows(r, chunk.id, layer, r.req.kv_export->first_token_to_send(), chunk.start);
  }
}

void EngineCore::FinishExport(Request& r, const sampling::SamplingView& row,
                              uint32_t prompt_computed, std::vector<int32_t>* sampled,
                              uint64_t* generated, std::vector<Ending>* endings) {
  // Prefill-only: the request ends with the samples' token 0 here;
  // kNone tells the decode worker to go on.
  ExportState& e = *r.export_state;
  const std::string& id = r.req.request_id;
  std::vector<SampleStart> starts = DrawFirstTokens(r, row, prompt_computed, false);
  *generated += starts.size();
  sampled->push_back(starts[0].token.token_id);
  if (e.error.ok()) e.error = r.req.kv_export->Finish(starts);
  if (!e.error.ok()) {
    endings->push_back({id, 0, FinishReason::kNone, e.error});
    return;
  }
  for (size_t k = 0; k < starts.size(); ++k) {
    r.req.output->OnToken(static_cast<uint32_t>(k), 0, starts[k].token,
                          k == 0 ? prompt_computed : 0);
    endings->push_back({id, static_cast<uint32_t>(k), starts[k].finish_reason, absl::OkStatus()});
  }
}

void EngineCore::StartDraining(Request& r, const Ending* last) {
  // The sequence leaves the scheduler; its blocks stay pinned until the
  // transfer's last frame is written (or it failed).
  ExportState& e = *r.export_state;
  const int64_t seq0 = r.seq_ids[0];
  if (seq0 != 0) {
    e.pinned = kv_.BlockTable(seq0);
    kv_.Pin(e.pinned);
    scheduler_.Remove(seq0);
    samples_.erase(seq0);
    r.seq_ids[0] = 0;
  }
  e.Enter(ExportPhase::kDraining);
  if (last != nullptr) e.drain_last = *last;
  absl::MutexLock lock(&mu_);
  export_wake_ = true;  // its result may be in already
  UpdateKvStats();
}

void EngineCore::ExportRows(Request& r, int64_t seq_id, int32_t layer, int32_t from, int32_t to) {
  absl::Status& error = r.export_state->error;
  if (!error.ok() || from >= to) return;
  if (r.cancelled->load()) {
    error = absl::CancelledError("request cancelled");
    return;
  }
  kv::KvStorage& storage = backend_->kv_storage();
  if (r.req.kv_export->sends_device_rows()) {
    // The rows stay in device memory: the export enqueues their copy after
    // the layer's event and returns.
    auto* device = dynamic_cast<kv::DeviceKvAccess*>(&storage);
    if (device == nullptr) {
      error = absl::FailedPreconditionError(
          "KV export needs device rows but this worker's KV cache is on the host");
      return;
    }
    error =
        r.req.kv_export->SendDeviceRows(*device, kv_.BlockTable(seq_id), layer, from, to - from);
    return;
  }
  const size_t n = static_cast<size_t>(to - from) * storage.row_bytes();
  k_rows_.resize(n);
  v_rows_.resize(n);
  storage.ReadTokens(kv_.BlockTable(seq_id), layer, from, to - from, k_rows_.data(),
                     v_rows_.data());
  error = r.req.kv_export->SendLayer(layer, from, to - from, k_rows_.data(), v_rows_.data());
}

}  // namespace tandem::core
