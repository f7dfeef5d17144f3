// The engine core's measurements (issue #34): the start-up warm-up that
// seeds the step model, each step fed to it, and each request's phases
// (RequestOutput::OnPhases).
#include <algorithm>
#include <chrono>
#include <string>
#include <utility>
#include <vector>

#include "engine/core/engine_core.h"
#include "engine/core/engine_core_request.h"

namespace tandem::core {
namespace {

using Clock = std::chrono::steady_clock;

double MsBetween(Clock::time_point from, Clock::time_point to) {
  return std::max(0.0, std::chrono::duration<double, std::milli>(to - from).count());
}

// The reference chunk of the step model's reported prefill rate.
int32_t ReferenceChunk(const scheduler::SchedulerOptions& o) {
  return std::max(2, std::min({512, o.prefill_chunk_tokens, o.max_num_batched_tokens}));
}

}  // namespace

void EngineCore::WarmUp() {
  const scheduler::SchedulerOptions& o = options_.scheduler;
  const int32_t big =
      std::max(2, std::min({256, o.prefill_chunk_tokens, o.max_num_batched_tokens}));
  const int32_t small = std::max(2, std::min(32, big / 2));
  const int32_t batch = std::max(1, std::min({8, o.max_num_seqs, o.max_num_batched_tokens}));
  const int32_t context_limit = backend_->config().context_length - 1;
  // One prefill chunk [start, start + count) (count 0: none) and `decodes`
  // one-token sequences at position `context`. Each shape runs twice and
  // only the second run is fitted: the first touches the blocks' memory
  // and the weights' caches, a cost serving steps do not pay again.
  struct Shape {
    int32_t start, count, decodes, context;
  };
  const std::vector<Shape> shapes = {
      {0, small, 0, 0},     {0, big, 0, 0},     {big, small, 0, 0},      {0, 0, 1, small},
      {0, 0, batch, small}, {0, 0, batch, big}, {0, small, batch, small}};
  const std::vector<int32_t> tokens(static_cast<size_t>(big), 0);
  int64_t next_id = -1;  // warm-up sequences: negative ids, never the loop's
  for (const Shape& shape : shapes) {
    if (std::max(shape.start + shape.count, shape.context + 1) > context_limit) continue;
    std::vector<std::pair<int32_t, int32_t>> chunks;  // (start, count)
    if (shape.count > 0) chunks.emplace_back(shape.start, shape.count);
    for (int32_t d = 0; d < shape.decodes; ++d) chunks.emplace_back(shape.context, 1);
    std::vector<int64_t> ids;
    std::vector<backend::ForwardEntry> entries;
    scheduler::StepShape step;
    bool fits = true;
    for (const auto& [start, count] : chunks) {
      const int64_t id = next_id--;
      kv_.StartSequence(id, kv::PrefixHit{});
      ids.push_back(id);
      if (!kv_.AllocateSlots(id, start + count)) {
        fits = false;  // a pool too small for this shape: skip it
        break;
      }
      backend::ForwardEntry entry;
      entry.tokens = std::span<const int32_t>(tokens.data(), static_cast<size_t>(count));
      entry.start_pos = start;
      entry.block_table = &kv_.BlockTable(id);
      entries.push_back(entry);
      step.AddChunk(start, count);
    }
    for (int run = 0; fits && run < 2; ++run) {
      std::vector<sampling::SamplingView> views;
      const Clock::time_point begin = Clock::now();
      const absl::Status forward = backend_->Forward(entries, nullptr, &views);
      const double ms = MsBetween(begin, Clock::now());
      if (!forward.ok()) fits = false;
      if (fits && run == 1) step_model_.Observe(step, ms, /*anchor=*/true);
    }
    // Nothing was committed: the blocks go back unpublished.
    for (int64_t id : ids) kv_.FreeSequence(id);
    if (backend_->device_lost()) break;
  }
  absl::MutexLock lock(&mu_);
  stats_.step_model = step_model_.Snapshot(ReferenceChunk(options_.scheduler));
}

void EngineCore::ObserveStep(const scheduler::StepPlan& plan, Clock::time_point step_start) {
  const Clock::time_point now = Clock::now();
  step_model_.Observe(scheduler::ShapeOf(plan), MsBetween(step_start, now));
  {
    absl::MutexLock lock(&mu_);
    stats_.step_model = step_model_.Snapshot(ReferenceChunk(options_.scheduler));
  }
  if (options_.step_observer) {
    options_.step_observer(std::chrono::duration<double>(now - step_start).count());
  }
}

void EngineCore::NoteFirstChunk(Request& r, const scheduler::ScheduledChunk& chunk,
                                const scheduler::SeqState& s) {
  if (!r.clock.first_chunk.has_value() && chunk.start < s.num_prompt_tokens) {
    r.clock.first_chunk = step_start_;
  }
}

void EngineCore::ReportPhases(Request& r) {
  if (r.clock.reported) return;
  r.clock.reported = true;
  const Clock::time_point now = Clock::now();
  const RequestClock& c = r.clock;
  RequestPhases phases;
  PlacementReport placement;
  if (r.placement.has_value()) {
    placement.ttft_local_ms = r.placement->ttft_local_ms;
    placement.ttft_remote_ms = r.placement->ttft_remote_ms;
  }
  const Clock::time_point placed = c.placed.value_or(c.submitted);
  if (r.req.kv_export == nullptr) phases.placement_ms = MsBetween(c.submitted, placed);
  if (c.load_done.has_value()) {
    // Remote: token 0 came from the prefill worker; this is token 1.
    placement.remote = true;
    if (c.load_started.has_value())
      phases.kv_transfer_ms = MsBetween(*c.load_started, *c.load_done);
    const Clock::time_point first_decode = c.first_decode.value_or(step_start_);
    phases.decode_admission_ms = MsBetween(*c.load_done, first_decode);
    phases.first_decode_ms = MsBetween(first_decode, now);
  } else {
    const Clock::time_point first_chunk = c.first_chunk.value_or(step_start_);
    phases.prefill_queue_ms = MsBetween(placed, first_chunk);
    phases.prefill_ms = MsBetween(first_chunk, now);
  }
  if (options_.phase_observer) options_.phase_observer(phases);
  r.req.output->OnPhases(phases, placement);
}

void EngineCore::ObserveTransfer(const Request& r, const RemotePrefillResult& result) {
  // The stream spans P's prefill and the tail: at this rate a prompt's
  // bytes "take" its prefill plus tail, which PlaceBySlo turns back into
  // the tail (transfer - prefill). A load's start -> done would also count
  // P's queue.
  step_model_.ObserveTransfer(
      r.req.remote_estimate.has_value() ? r.req.remote_estimate->prefill_worker : "",
      result.kv_bytes, result.stream_seconds);
}

}  // namespace tandem::core
