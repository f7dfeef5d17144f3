// Conversions between tandem.v1 messages and engine types, shared by the
// router and both workers.
#ifndef TANDEM_COMMON_SERVER_PROTO_CONVERT_H_
#define TANDEM_COMMON_SERVER_PROTO_CONVERT_H_

#include <cstdint>

#include "absl/status/statusor.h"
#include "absl/strings/str_cat.h"
#include "engine/core/request.h"
#include "engine/sampling/sampler.h"
#include "tandem/v1/common.pb.h"

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
inline absl::StatusOr<core::RouteChoice> RouteFromProto(int route) {
  if (route < v1::ROUTE_AUTO || route > v1::ROUTE_REMOTE) {
    return absl::InvalidArgumentError(
        absl::StrCat("route_override: unknown value ", route, " (expected 0, 1 or 2)"));
  }
  return static_cast<core::RouteChoice>(route);
}

// Unset top_p means 1 (off). Range checks happen in sampling::Validate.
inline sampling::SamplingOptions SamplingFromProto(const v1::SamplingParams& p) {
  sampling::SamplingOptions o;
  o.temperature = p.temperature();
  o.top_k = p.top_k();
  o.top_p = p.has_top_p() ? p.top_p() : 1.0f;
  o.seed = p.seed();
  return o;
}

// max_tokens from the wire, kept whole so an error names the value sent
// (core::ValidateGeneration checks it against the context length).
inline int64_t MaxTokensFromProto(uint32_t max_tokens) { return max_tokens; }

}  // namespace tandem

#endif  // TANDEM_COMMON_SERVER_PROTO_CONVERT_H_
