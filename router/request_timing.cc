#include "router/request_timing.h"

#include <algorithm>

namespace tandem::router {
namespace {

// The part of `want` (clamped to >= 0) that fits in `*left`, taken from it.
double Take(double want, double* left) {
  const double got = std::clamp(want, 0.0, *left);
  *left -= got;
  return got;
}

}  // namespace

v1::RequestTiming AssembleRequestTiming(const RequestMarks& marks, const v1::WorkerPhases& decode,
                                        const v1::WorkerPhases& prefill) {
  v1::RequestTiming t;
  const double ttft = std::max(marks.first_token_ms, 0.0);
  t.set_ttft_ms(ttft);
  t.set_e2e_ms(std::max(marks.last_message_ms, ttft));
  double left = ttft;
  t.set_router_queue_ms(Take(marks.decode_call_ms, &left));
  if (marks.prefill_call_ms.has_value()) {
    t.set_placement_ms(Take(*marks.prefill_call_ms - marks.decode_call_ms, &left));
    t.set_prefill_queue_ms(Take(prefill.prefill_queue_ms(), &left));
    t.set_kv_transfer_ms(std::max(decode.kv_transfer_ms(), 0.0));
    t.set_decode_admission_ms(std::max(decode.decode_admission_ms(), 0.0));
    t.set_first_decode_ms(std::max(decode.first_decode_ms(), 0.0));
  } else {
    t.set_placement_ms(Take(decode.placement_ms(), &left));
    t.set_prefill_queue_ms(Take(decode.prefill_queue_ms(), &left));
  }
  t.set_prefill_ms(left);
  return t;
}

v1::Placement PlacementOf(const v1::Placement* reported, bool remote) {
  v1::Placement p;
  if (reported != nullptr) p = *reported;
  p.set_decision(remote ? "remote" : "local");
  return p;
}

void RequestTimingRecorder::DecodeStarted(int stream, Clock::time_point now) {
  if (first_token_.has_value()) return;
  stream_ = stream;
  decode_start_ = now;
  prefill_start_.reset();
  decode_phases_.Clear();
  prefill_phases_.Clear();
  placement_.reset();
}

void RequestTimingRecorder::DecodeReported(int stream, const v1::WorkerPhases* phases,
                                           const v1::Placement* placement) {
  if (stream != stream_) return;
  if (phases != nullptr) decode_phases_ = *phases;
  if (placement != nullptr) placement_ = *placement;
}

void RequestTimingRecorder::PrefillDelivered(Clock::time_point call_start,
                                             const v1::WorkerPhases& phases) {
  if (first_token_.has_value()) return;
  prefill_start_ = call_start;
  prefill_phases_ = phases;
}

void RequestTimingRecorder::TokenSent(Clock::time_point now) {
  if (!first_token_.has_value()) first_token_ = now;
}

double RequestTimingRecorder::MsSinceArrival(Clock::time_point t) const {
  return std::chrono::duration<double, std::milli>(t - arrival_).count();
}

v1::RequestTiming RequestTimingRecorder::Timing(Clock::time_point now) const {
  RequestMarks marks;
  marks.decode_call_ms = MsSinceArrival(decode_start_);
  if (prefill_start_.has_value()) marks.prefill_call_ms = MsSinceArrival(*prefill_start_);
  marks.first_token_ms = MsSinceArrival(first_token_.value_or(now));
  marks.last_message_ms = MsSinceArrival(now);
  return AssembleRequestTiming(marks, decode_phases_, prefill_phases_);
}

v1::Placement RequestTimingRecorder::Placement(bool remote) const {
  return PlacementOf(placement_.has_value() ? &*placement_ : nullptr, remote);
}

}  // namespace tandem::router
