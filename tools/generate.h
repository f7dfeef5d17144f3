// `tandem generate`: one streaming Generation.Generate call.
//
//   tandem generate [--router H:P] [--max-tokens N] [--temperature T]
//                   [--top-k K] [--top-p P] [--seed S]
//                   [--route auto|local|remote] [--chat] [--json]
//                   [--timeout-ms MS] PROMPT...
//
// --chat sends PROMPT as one user message (GenerateRequest.messages), which
// the router renders with the model's chat template; without it PROMPT is
// the raw prompt text.
//
// Without --json the text is written to stdout as it arrives (then a
// newline). With --json exactly one JSON line is printed at the end (see
// GenerateResult::ToJson). A failed RPC prints "tandem: CODE: message" to
// stderr and exits 1; a bad flag exits 2.
#ifndef TANDEM_TOOLS_GENERATE_H_
#define TANDEM_TOOLS_GENERATE_H_

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "tandem/v1/generation.pb.h"

namespace tandem::cli {

struct GenerateOptions {
  std::string router = "127.0.0.1:50051";  // router's gRPC address
  uint32_t max_tokens = 32;                // the router requires >= 1
  float temperature = 0;                   // 0 = greedy (also when the flag is absent)
  int32_t top_k = 0;                       // <= 0 = off
  std::optional<float> top_p;              // absent: unset (the router reads it as 1)
  std::optional<uint64_t> seed;            // absent: the router draws one
  tandem::v1::RouteOverride route = tandem::v1::ROUTE_AUTO;
  bool json = false;
  int64_t timeout_ms = 300000;             // RPC deadline; 0 = none
  std::string prompt;                      // positional arguments joined by ' '
  bool chat = false;                       // --chat: send `prompt` as one user message
};

// Parses the arguments after "generate". INVALID_ARGUMENT naming the flag
// (also for a missing PROMPT, or --max-tokens outside 0..2^32-1). Value
// ranges of the request (max_tokens >= 1, temperature >= 0, ...) are left
// to the router, one place for every client.
absl::StatusOr<GenerateOptions> ParseGenerateArgs(const std::vector<std::string>& args);

// The request `options` describe (has_seed set iff --seed was given):
// `prompt`, or with --chat `messages` = [{role: "user", content: prompt}].
tandem::v1::GenerateRequest BuildGenerateRequest(const GenerateOptions& options);

// "length" | "stop" | "context" | "cancelled"; "" for FINISH_NONE.
std::string FinishReasonName(tandem::v1::FinishReason reason);

// Folds the stream of GenerateResponse messages of one call into the JSON
// summary printed by --json. Times are measured by the caller from the call
// start (client side).
class GenerateResult {
 public:
  // Adds one message received `since_start` after the call started. The
  // first message that carries a token fixes ttft.
  void Add(const tandem::v1::GenerateResponse& response, absl::Duration since_start);
  // Records the end of the call (status received) for e2e.
  void Finish(absl::Duration since_start) { e2e_ = since_start; }

  // One object with, in this order: request_id, route, prefill_worker,
  // decode_worker, prompt_token_ids (BOS included), token_ids, text,
  // finish_reason (null when the stream carried none), usage
  // {prompt_tokens, completion_tokens}, timing {ttft_ms, e2e_ms} (null
  // when unknown), seed. Metadata comes from the first message that sets
  // it; usage from the server's last non-zero counts, else from the ids.
  nlohmann::ordered_json ToJson() const;
  // ToJson() on one line; invalid UTF-8 in text is replaced (U+FFFD).
  std::string ToJsonLine() const;

 private:
  bool seen_first_ = false;
  tandem::v1::GenerateResponse meta_;  // metadata fields only
  std::vector<int32_t> token_ids_;
  std::string text_;
  tandem::v1::FinishReason finish_reason_ = tandem::v1::FINISH_NONE;
  uint32_t prompt_tokens_ = 0;
  uint32_t completion_tokens_ = 0;
  uint32_t cached_prompt_tokens_ = 0;
  std::optional<absl::Duration> ttft_;
  std::optional<absl::Duration> e2e_;
};

// Runs the subcommand; returns the process exit status (0, 1, 2).
int RunGenerate(const std::vector<std::string>& args);

}  // namespace tandem::cli

#endif  // TANDEM_TOOLS_GENERATE_H_
