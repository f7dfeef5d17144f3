// Conversions between tandem.v1 messages and engine types, shared by the
// router and both workers.
#ifndef TANDEM_COMMON_SERVER_PROTO_CONVERT_H_
#define TANDEM_COMMON_SERVER_PROTO_CONVERT_H_

#include <algorithm>
#include <cstdint>
#include <optional>

#include "absl/status/statusor.h"
#include "absl/strings/str_cat.h"
#include "engine/core/kv_target.h"
#include "engine/core/request.h"
#include "engine/sampling/sampler.h"
#include "engine/scheduler/step_model.h"
#include "tandem/v1/common.pb.h"
#include "tandem/v1/worker.pb.h"

namespace tandem {

// The engine's enums mirror the proto's value for value.
static_assert(static_cast<int>(core::FinishReason::kNone) == v1::FINISH_NONE &&
              static_cast<int>(core::FinishReason::kLength) == v1::FINISH_LENGTH &&
              static_cast<int>(core::FinishReason::kStop) == v1::FINISH_STOP &&
              static_cast<int>(core::FinishReason::kContext) == v1::FINISH_CONTEXT &&
              static_cast<int>(core::FinishReason::kCancelled) == v1::FINISH_CANCELLED);
static_assert(static_cast<int>(core::RouteChoice::kAuto) == v1::ROUTE_AUTO &&
              static_cast<int>(core::RouteChoice::kLocal) == v1::ROUTE_LOCAL &&
              static_cast<int>(core::RouteChoice::kRemote) == v1::ROUTE_REMOTE);

inline v1::FinishReason FinishReasonToProto(core::FinishReason reason) {
  return static_cast<v1::FinishReason>(reason);
}

// INVALID_ARGUMENT for a value outside tandem.v1.RouteOverride (proto3
// keeps unknown enum numbers).
[[nodiscard]] inline absl::StatusOr<core::RouteChoice> RouteFromProto(int route) {
  if (route < v1::ROUTE_AUTO || route > v1::ROUTE_REMOTE) {
    return absl::InvalidArgumentError(
        absl::StrCat("route_override: unknown value ", route, " (expected 0, 1 or 2)"));
  }
  return static_cast<core::RouteChoice>(route);
}

// Unset top_p and repetition_penalty mean 1 (off); logit_bias is sorted by
// id; `logprobs` is the request's top-n (GenerateRequest.logprobs or
// EngineControls.logprobs). Range checks happen in sampling::Validate.
inline sampling::SamplingOptions SamplingFromProto(const v1::SamplingParams& p, uint32_t logprobs) {
  sampling::SamplingOptions o;
  o.temperature = p.temperature();
  o.top_k = p.top_k();
  o.top_p = p.has_top_p() ? p.top_p() : 1.0f;
  o.seed = p.seed();
  o.min_p = p.min_p();
  o.repetition_penalty = p.has_repetition_penalty() ? p.repetition_penalty() : 1.0f;
  o.presence_penalty = p.presence_penalty();
  o.frequency_penalty = p.frequency_penalty();
  o.logit_bias.assign(p.logit_bias().begin(), p.logit_bias().end());
  std::sort(o.logit_bias.begin(), o.logit_bias.end());
  o.top_logprobs = logprobs;  // whole, so an error names the value sent
  return o;
}

// The generation controls of an engine request from the wire (n = 0 is
// read as 1; ranges are checked by core::ValidateControls).
inline core::GenerationControls ControlsFromProto(const v1::EngineControls& c) {
  core::GenerationControls out;
  out.stop_token_ids.assign(c.stop_token_ids().begin(), c.stop_token_ids().end());
  out.ignore_eos = c.ignore_eos();
  out.min_tokens = c.min_tokens();
  out.n = c.n() == 0 ? 1 : int64_t{c.n()};  // whole, so an error names the value sent
  return out;
}

// One sampled token on the wire, with its top-n alternatives.
inline void TokenToProto(uint32_t sample_index, uint32_t index, const sampling::SampledToken& token,
                         v1::TokenOutput* out) {
  out->set_sample_index(sample_index);
  out->set_index(index);
  out->set_token_id(token.token_id);
  out->set_logprob(token.logprob);
  for (const sampling::TokenLogprob& t : token.top_logprobs) {
    v1::TopLogprob* top = out->add_top_logprobs();
    top->set_token_id(t.id);
    top->set_logprob(t.logprob);
  }
}

// The KV target on the wire and back (tandem.v1.KvTarget <->
// core::KvTarget, field for field): the one converter pair of the record D
// sends in NeedRemotePrefill and P reads from PrefillRequest (issue #33).
inline void KvTargetToProto(const core::KvTarget& target, v1::KvTarget* out) {
  out->set_endpoint(target.endpoint);
  out->set_request_id(target.request_id);
  out->set_attempt(target.attempt);
  out->set_hit_tokens(target.hit_tokens);
  out->mutable_kv_transports()->Assign(target.kv_transports.begin(), target.kv_transports.end());
  out->set_kv_host_id(target.kv_host_id);
  out->set_kv_instance_id(target.kv_instance_id);
}

inline core::KvTarget KvTargetFromProto(const v1::KvTarget& target) {
  core::KvTarget out;
  out.endpoint = target.endpoint();
  out.request_id = target.request_id();
  out.attempt = target.attempt();
  out.hit_tokens = target.hit_tokens();
  out.kv_transports.assign(target.kv_transports().begin(), target.kv_transports().end());
  out.kv_host_id = target.kv_host_id();
  out.kv_instance_id = target.kv_instance_id();
  return out;
}

// The step model's snapshot as tandem.v1.StepModel.
inline void StepModelToProto(const scheduler::StepModelSnapshot& s, v1::StepModel* out) {
  out->set_samples(s.samples);
  out->set_base_ms(s.coefficients.base_ms);
  out->set_prefill_ms_per_token(s.coefficients.prefill_ms_per_token);
  out->set_prefill_ms_per_kilo_pair(s.coefficients.prefill_ms_per_kilo_pair);
  out->set_decode_ms_per_seq(s.coefficients.decode_ms_per_seq);
  out->set_decode_ms_per_kilo_context(s.coefficients.decode_ms_per_kilo_context);
  out->set_prefill_tokens_per_s(s.prefill_tokens_per_s);
  out->set_decode_step_ms(s.decode_step_ms);
  out->set_mean_abs_error_ms(s.mean_abs_error_ms);
  for (const auto& [peer, rate] : s.kv_link_bytes_per_s) {
    (*out->mutable_kv_link_bytes_per_s())[peer] = rate;
  }
}

// A worker's phases of one request as tandem.v1.WorkerPhases.
inline void PhasesToProto(const core::RequestPhases& p, v1::WorkerPhases* out) {
  out->set_placement_ms(p.placement_ms);
  out->set_prefill_queue_ms(p.prefill_queue_ms);
  out->set_prefill_ms(p.prefill_ms);
  out->set_kv_transfer_ms(p.kv_transfer_ms);
  out->set_decode_admission_ms(p.decode_admission_ms);
  out->set_first_decode_ms(p.first_decode_ms);
}

// A placement as tandem.v1.Placement ("local" | "remote").
inline void PlacementToProto(const core::PlacementReport& p, v1::Placement* out) {
  out->set_decision(p.remote ? "remote" : "local");
  out->set_ttft_local_ms(p.ttft_local_ms);
  out->set_ttft_remote_ms(p.ttft_remote_ms);
}

// DecodeGenerateRequest.prefill_estimate, when set (a prefill worker named).
inline std::optional<scheduler::RemotePrefillEstimate> EstimateFromProto(
    const v1::DecodeGenerateRequest& request) {
  if (!request.has_prefill_estimate()) return std::nullopt;
  const v1::PrefillEstimate& e = request.prefill_estimate();
  return scheduler::RemotePrefillEstimate{e.prefill_worker(), std::max(0.0, e.queue_ms()),
                                          std::max(0.0, e.prefill_ms())};
}

// max_tokens from the wire, kept whole so an error names the value sent
// (core::ValidateGeneration checks it against the context length).
inline int64_t MaxTokensFromProto(uint32_t max_tokens) { return max_tokens; }

}  // namespace tandem

#endif  // TANDEM_COMMON_SERVER_PROTO_CONVERT_H_
