// Conversions between tandem.v1 messages and engine types, shared by the
// router and both workers.
#ifndef TANDEM_COMMON_SERVER_PROTO_CONVERT_H_
#define TANDEM_COMMON_SERVER_PROTO_CONVERT_H_

#include <algorithm>
#include <cstdint>

#include "engine/sampling/sampler.h"
#include "tandem/v1/common.pb.h"

namespace tandem {

// Unset top_p means 1 (off). Range checks happen in sampling::Validate.
inline sampling::SamplingOptions SamplingFromProto(const v1::SamplingParams& p) {
  sampling::SamplingOptions o;
  o.temperature = p.temperature();
  o.top_k = p.top_k();
  o.top_p = p.has_top_p() ? p.top_p() : 1.0f;
  o.seed = p.seed();
  return o;
}

// max_tokens from the wire, clamped so int32 arithmetic cannot overflow
// (anything this large fails the context-length check anyway).
inline int32_t MaxTokensFromProto(uint32_t max_tokens) {
  return static_cast<int32_t>(std::min<uint32_t>(max_tokens, 1u << 30));
}

}  // namespace tandem

#endif  // TANDEM_COMMON_SERVER_PROTO_CONVERT_H_
