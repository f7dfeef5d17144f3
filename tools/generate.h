// `tandem generate`: one streaming Generation.Generate call.
//
//   tandem generate [--router H:P] [--api-key KEY] [--max-tokens N] [--temperature T]
//                   [--top-k K] [--top-p P] [--min-p P] [--seed S]
//                   [--repetition-penalty P] [--presence-penalty P]
//                   [--frequency-penalty P] [--logit-bias ID=BIAS]...
//                   [--stop STR]... [--stop-token-id ID]...
//                   [--include-stop-str] [--ignore-eos] [--min-tokens N]
//                   [--logprobs N] [--n N]
//                   [--route auto|local|remote] [--chat] [--json]
//                   [--timeout-ms MS] PROMPT...
//
// --api-key (else $TANDEM_API_KEY) is sent as `authorization: Bearer KEY`
// (a router with router.api_keys_file requires it). --chat sends PROMPT as one user message (GenerateRequest.messages), which
// the router renders with the model's chat template; without it PROMPT is
// the raw prompt text. The generation flags map one to one onto
// GenerateRequest (stop, stop_token_ids, include_stop_str_in_output,
// ignore_eos, min_tokens, logprobs, n) and SamplingParams (min_p,
// repetition_penalty, presence_penalty, frequency_penalty, logit_bias);
// "..." marks a flag that may be repeated. A flag not given leaves its
// field unset (proto default; n and repetition_penalty are absent).
//
// Without --json and with n = 1 the text is written to stdout as it
// arrives (then a newline). With --n > 1 each sample's whole text is
// printed when that sample finishes, as one "[sample S] TEXT" line (in
// finishing order; after a successful call, a sample the stream ended
// without finishing is printed at the end). With --json exactly one JSON
// line is printed at the end (see GenerateResult::ToJson). A failed RPC
// prints "tandem: CODE: message" to stderr and exits 1; a bad flag (a
// value that does not parse, or that the router would refuse) exits 2.
#ifndef TANDEM_TOOLS_GENERATE_H_
#define TANDEM_TOOLS_GENERATE_H_

#include <cstdint>
#include <map>
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
  std::string api_key;                     // --api-key, else $TANDEM_API_KEY; "" = none
  uint32_t max_tokens = 32;                // the router requires >= 1
  float temperature = 0;                   // 0 = greedy (also when the flag is absent)
  int32_t top_k = 0;                       // <= 0 = off
  std::optional<float> top_p;              // absent: unset (the router reads it as 1)
  std::optional<uint64_t> seed;            // absent: the router draws one
  tandem::v1::RouteOverride route = tandem::v1::ROUTE_AUTO;
  bool json = false;
  int64_t timeout_ms = 300000;  // RPC deadline; 0 = none
  std::string prompt;           // positional arguments joined by ' '
  bool chat = false;            // --chat: send `prompt` as one user message

  // Generation controls (GenerateRequest); empty / false / 0 = not sent.
  std::vector<std::string> stop;        // --stop, in order (UTF-8)
  std::vector<int32_t> stop_token_ids;  // --stop-token-id, in order
  bool include_stop_str = false;        // --include-stop-str
  bool ignore_eos = false;              // --ignore-eos
  uint32_t min_tokens = 0;              // --min-tokens
  std::optional<uint32_t> logprobs;     // --logprobs; absent: not sent, no "logprobs" in JSON
  std::optional<uint32_t> n;            // --n; absent: unset (the router reads it as 1)
  // Sampling (SamplingParams); 0 = off as the proto says.
  float min_p = 0;                          // --min-p
  std::optional<float> repetition_penalty;  // --repetition-penalty; absent: unset (= 1)
  float presence_penalty = 0;               // --presence-penalty
  float frequency_penalty = 0;              // --frequency-penalty
  std::map<int32_t, float> logit_bias;      // --logit-bias ID=BIAS, one per id
};

// Parses the arguments after "generate". INVALID_ARGUMENT naming the flag
// for a value that does not parse or fit its proto field: --max-tokens,
// --min-tokens, --logprobs, --n outside 0..2^32-1; --top-k, --stop-token-id
// or a --logit-bias id outside int32; --logit-bias not ID=BIAS or an id
// given twice; --stop or PROMPT not valid UTF-8; a missing PROMPT; and a
// value the router refuses, checked by the servers' own functions
// (sampling::Validate, core::ValidateControls, as RouterService::Validate)
// with the message naming the flag: "--max-tokens: must be >= 1, got 0",
// "--top-p: must be in (0, 1], got 2", "--n: must be in [1, 16], got 0",
// "--min-tokens: must be in [0, max_tokens = 4], got 5". Only what needs
// the model is left to the router: prompt + max_tokens against the context
// length, token ids against the vocabulary size (here: ids >= 0).
[[nodiscard]] absl::StatusOr<GenerateOptions> ParseGenerateArgs(
    const std::vector<std::string>& args);

// The request `options` describe (has_seed set iff --seed was given):
// `prompt`, or with --chat `messages` = [{role: "user", content: prompt}];
// n, top_p and repetition_penalty set iff their flags were given, the
// other generation fields as given (their defaults are the proto's).
tandem::v1::GenerateRequest BuildGenerateRequest(const GenerateOptions& options);

// "length" | "stop" | "context" | "cancelled"; "" for FINISH_NONE.
std::string FinishReasonName(tandem::v1::FinishReason reason);

// Folds the stream of GenerateResponse messages of one call into the JSON
// summary printed by --json, per sample (GenerateResponse.sample_index).
// Times are measured by the caller from the call start (client side).
class GenerateResult {
 public:
  // `n`: the samples requested (GenerateOptions::n, 1 when absent); n > 1
  // adds "samples" to the JSON. `with_logprobs`: --logprobs was given; adds
  // "logprobs".
  explicit GenerateResult(uint32_t n = 1, bool with_logprobs = false)
      : n_(n), with_logprobs_(with_logprobs) {}

  // Adds one message received `since_start` after the call started; its
  // tokens, text, counts, finish and stop reason belong to sample
  // `response.sample_index()`. The first message that carries a token (of
  // any sample) fixes ttft.
  void Add(const tandem::v1::GenerateResponse& response, absl::Duration since_start);
  // Records the end of the call (status received) for e2e.
  void Finish(absl::Duration since_start) { e2e_ = since_start; }

  // The text of sample `sample` received so far ("" for one never seen),
  // and its finish reason (FINISH_NONE until its last message).
  std::string text(uint32_t sample) const;
  tandem::v1::FinishReason finish_reason(uint32_t sample) const;

  // One object with, in this order: request_id, route, prefill_worker,
  // decode_worker, prompt_token_ids (BOS included), then sample 0's
  // token_ids, text, finish_reason (null when the stream carried none),
  // stop_reason (the stop string, the stop token id, or null), logprobs
  // (only with_logprobs: one {token_id, logprob, top_logprobs: [{token_id,
  // logprob}]} per token), usage {prompt_tokens, completion_tokens (of
  // sample 0), cached_prompt_tokens}, placement {decision, ttft_local_ms,
  // ttft_remote_ms} (where the server prefilled the prompt and its
  // predictions; null when the server sent none), timing {ttft_ms, e2e_ms
  // (measured here, from the call start; null when unknown), then the
  // server's view of the same request (RequestTiming of sample 0's last
  // message, null each when the server sent none): server_ttft_ms,
  // router_queue_ms, placement_ms, prefill_queue_ms, prefill_ms (these
  // four add up to server_ttft_ms), kv_transfer_ms, decode_admission_ms,
  // first_decode_ms}, seed, and when n > 1 samples: one {sample_index, token_ids,
  // text, finish_reason, stop_reason, completion_tokens[, logprobs]} per
  // sample 0..n-1 (and any higher index the stream carried). Metadata comes
  // from the first message that sets it; counts from the server's last
  // non-zero values, else from the ids. Logprobs are written as the float's
  // shortest round-trip decimal (std::to_chars), so -0.1f prints -0.1; a
  // non-finite one prints null.
  nlohmann::ordered_json ToJson() const;
  // ToJson() on one line; invalid UTF-8 in text is replaced (U+FFFD).
  std::string ToJsonLine() const;

 private:
  struct Sample {
    std::vector<tandem::v1::TokenOutput> tokens;
    std::string text;
    tandem::v1::FinishReason finish_reason = tandem::v1::FINISH_NONE;
    tandem::v1::StopReason stop_reason;  // kind unset: none
    uint32_t completion_tokens = 0;      // the server's last non-zero count
  };
  // Adds token_ids, text, finish_reason, stop_reason of `s` to `j`.
  static void AddSampleFields(const Sample& s, nlohmann::ordered_json* j);
  // [{token_id, logprob, top_logprobs: [{token_id, logprob}]}] of `s`.
  static nlohmann::ordered_json LogprobsJson(const Sample& s);
  // Sample `sample`; an empty one when the stream carried none.
  const Sample& SampleAt(uint32_t sample) const;
  // The server's count for `s`, else the number of its tokens.
  static size_t CompletionTokens(const Sample& s);

  uint32_t n_;
  bool with_logprobs_;
  bool seen_first_ = false;
  tandem::v1::GenerateResponse meta_;  // metadata fields only
  std::vector<Sample> samples_;        // by sample_index
  uint32_t prompt_tokens_ = 0;
  uint32_t cached_prompt_tokens_ = 0;
  std::optional<absl::Duration> ttft_;
  std::optional<absl::Duration> e2e_;
  // From sample 0's last message, when the server sent them.
  std::optional<tandem::v1::Placement> placement_;
  std::optional<tandem::v1::RequestTiming> server_timing_;
};

// Runs the subcommand; returns the process exit status (0, 1, 2).
int RunGenerate(const std::vector<std::string>& args);

}  // namespace tandem::cli

#endif  // TANDEM_TOOLS_GENERATE_H_
