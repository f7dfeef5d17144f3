// Per-sample output assembly of one Generate request (n samples): what the
// router sends the client for the tokens the workers stream. No gRPC and
// no proto: tokens come in as the caller's token type, messages go out as
// plain structs (GenerateCall turns them into GenerateResponse messages).
//
// For each sample, in this order:
//   - Index order: a token is buffered until every token before it (by
//     output index) arrived, then released with them; tokens arrive per
//     sample in any order and interleaved across samples (D's token 1 may
//     overtake P's token 0). A token at an index already released, or of
//     an ended sample or unknown sample index, is dropped.
//   - Incremental detokenization (tokenizer::IncrementalDecoder): released
//     text is whole UTF-8 characters; an incomplete tail waits for its
//     bytes and is flushed at the sample's end.
//   - Stop-token text: a token that ends the sample as a stop token (an
//     end-of-generation id unless ignore_eos, or a stop_token_ids id, once
//     min_tokens tokens were generated: core::CheckStop's kStop) keeps its
//     id but not its text, unless include_stop_str_in_output (vLLM's
//     detokenizer skips it).
//   - Stop strings (router/stop_strings.h, checked once min_tokens tokens
//     were generated, as vLLM): a match ends the sample at once with the
//     tokens released so far (the one that completed the match included);
//     buffered and later tokens never reach the client.
//   - End: the sample's last emission goes out once the worker reported
//     the end (Finish) and every token before it was released; it carries
//     the held-back text, the finish reason, and the stop reason (the stop
//     string, or the stop_token_ids id that ended it; none for an
//     end-of-generation id, as vLLM).
//   - Token charge: every released token is in exactly one emission, so
//     the sum of `tokens.size()` over emissions is what the client was
//     sent (the API key's generated-token charge, RequestTimer's counts).
//
// Owns: each sample's buffered tokens, decoder, stop-string matcher,
// released count and ids, reported and sent ends, and the number of
// samples left. Does not touch: workers, the sink, timing. Threads: not
// thread-safe; the caller serializes (GenerateCall: under its mu_).
#ifndef TANDEM_ROUTER_SAMPLE_OUTPUT_H_
#define TANDEM_ROUTER_SAMPLE_OUTPUT_H_

#include <cstdint>
#include <map>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "engine/core/stop_checker.h"
#include "engine/tokenizer/tokenizer.h"
#include "router/stop_strings.h"

namespace tandem::router {

// How a sample ended. The values are v1::FinishReason's (generate_call.cc
// checks them with static_assert).
enum class SampleFinish : int32_t {
  kNone = 0,
  kLength = 1,   // max_tokens reached
  kStop = 2,     // an end-of-generation token, a stop_token_ids id or a stop string
  kContext = 3,  // context length reached
  kCancelled = 4,
};

// The request's fields that shape its samples' output (GenerateRequest's,
// as validated by the router).
struct SampleOutputOptions {
  uint32_t n = 1;                 // samples; at least 1
  std::vector<std::string> stop;  // stop strings (1..256 bytes each)
  bool include_stop_str_in_output = false;
  std::vector<int32_t> stop_token_ids;  // any order
  bool ignore_eos = false;              // end-of-generation ids are ordinary tokens
  int64_t min_tokens = 0;               // no stop string or stop token before this many tokens
};

// How a sample's last emission ends it.
struct SampleEnd {
  SampleFinish finish = SampleFinish::kNone;  // never kNone in an emission
  // With kStop: the stop string that matched, or the stop_token_ids id
  // that ended the sample (at most one is set; neither for an
  // end-of-generation id).
  std::optional<std::string> stop_string;
  std::optional<int32_t> stop_token_id;
  // A stop string ended the sample before the worker reported its end:
  // the worker may drop the sample now (DecodeWorker.CancelSample).
  bool stopped_early = false;
};

// One message's worth of a sample's output.
template <class Token>
struct SampleEmission {
  uint32_t sample_index = 0;
  std::vector<Token> tokens;       // released now, in index order (possibly none)
  std::string text;                // their text, after stop-string hold-back
  uint32_t completion_tokens = 0;  // tokens of the sample released so far, these included
  std::optional<SampleEnd> end;    // set on the sample's last emission
};

// The non-template part of SampleOutputs: each sample's text, stop state,
// counts and end, fed one token id at a time in index order.
class SampleTexts {
 public:
  // `tokenizer` must outlive this object (its decoders point to it).
  SampleTexts(const tokenizer::Tokenizer& tokenizer, const SampleOutputOptions& options);
  SampleTexts(const SampleTexts&) = delete;
  SampleTexts& operator=(const SampleTexts&) = delete;

  // The request's n.
  uint32_t size() const { return static_cast<uint32_t>(samples_.size()); }
  // Samples whose last emission was not produced yet.
  uint32_t samples_left() const { return samples_left_; }
  // Sample s's next output index to release (= tokens released so far).
  uint32_t next_index(uint32_t s) const { return samples_[s].next_index; }
  // The ids of sample s's released tokens, in index order (a migration
  // sends them to the next decode worker).
  const std::vector<int32_t>& emitted(uint32_t s) const { return samples_[s].emitted; }
  // Whether sample s's last emission was produced.
  bool done(uint32_t s) const { return samples_[s].done; }
  // How the worker said sample s ends (kNone: not yet, or not since the
  // last Restart).
  SampleFinish reported(uint32_t s) const { return samples_[s].reported; }
  // The finish reason of sample s's last emission (kNone before it).
  SampleFinish sent(uint32_t s) const { return samples_[s].sent; }
  // Whether any sample released a token or ended.
  bool progressed() const;

 protected:
  // Whether a token of sample `s` at output index `index` is still wanted.
  bool Wanted(uint32_t s, uint32_t index) const {
    return s < samples_.size() && !samples_[s].done && index >= samples_[s].next_index;
  }
  // Releases `token_id` as sample s's next token: appends its text to
  // `*text`. Returns the end when a stop string completed in it (the
  // sample is then done).
  std::optional<SampleEnd> Release(uint32_t s, int32_t token_id, std::string* text);
  // Records the worker's end of sample s (ignored once it is done).
  void Report(uint32_t s, SampleFinish finish);
  // Ends sample s if the worker reported its end, it released at least one
  // token (a remote token 0 may still be on its way) and `nothing_buffered`:
  // appends the held-back text to `*text` and returns the end.
  std::optional<SampleEnd> MaybeEnd(uint32_t s, bool nothing_buffered, std::string* text);
  // Forgets the reported end of every sample that is not done.
  void ForgetReportedEnds();

 private:
  struct Sample {
    Sample(const tokenizer::Tokenizer& tokenizer, const StopStringMatcher& stops)
        : decoder(tokenizer), matcher(stops) {}
    tokenizer::IncrementalDecoder decoder;
    StopStringMatcher matcher;
    uint32_t next_index = 0;
    std::vector<int32_t> emitted;
    int32_t last_token = -1;
    SampleFinish reported = SampleFinish::kNone;
    SampleFinish sent = SampleFinish::kNone;
    bool done = false;
  };
  // Marks sample s done with `end`.
  SampleEnd Ended(uint32_t s, SampleEnd end);

  const std::vector<int32_t> eog_ids_;  // the tokenizer's, unsorted
  // The stop-token rule (core::CheckStop's kStop part).
  core::StopCriteria stop_criteria_;
  std::vector<int32_t> stop_token_ids_;  // sorted
  const SampleOutputOptions options_;
  std::vector<Sample> samples_;
  uint32_t samples_left_ = 0;
};

// Every sample's output of one request. `Token` is the worker's token
// record (v1::TokenOutput in the router), carried through untouched; it
// has `uint32_t sample_index()`, `uint32_t index()` and `int32_t
// token_id()`.
template <class Token>
class SampleOutputs : public SampleTexts {
 public:
  using Emission = SampleEmission<Token>;

  SampleOutputs(const tokenizer::Tokenizer& tokenizer, const SampleOutputOptions& options)
      : SampleTexts(tokenizer, options), buffered_(options.n) {}

  // A token from a worker. Returns, in order: an emission with the tokens
  // now released (its `end` set if a stop string matched in them), then
  // the sample's last emission if the worker had already reported its end
  // and this completed it; nothing for a token that releases nothing. A
  // token at an index still buffered replaces the buffered one.
  std::vector<Emission> Deliver(Token token) {
    const uint32_t s = token.sample_index();
    const uint32_t index = token.index();
    if (!Wanted(s, index)) return {};
    std::map<uint32_t, Token>& buffered = buffered_[s];
    buffered.insert_or_assign(index, std::move(token));
    std::vector<Emission> out;
    Emission released;
    released.sample_index = s;
    while (!buffered.empty() && buffered.begin()->first == next_index(s)) {
      Token next = std::move(buffered.begin()->second);
      buffered.erase(buffered.begin());
      released.end = Release(s, next.token_id(), &released.text);
      released.tokens.push_back(std::move(next));
      if (released.end.has_value()) {
        buffered.clear();  // tokens after the match never reach the client
        break;
      }
    }
    const bool stopped = released.end.has_value();
    if (!released.tokens.empty()) {
      released.completion_tokens = next_index(s);
      out.push_back(std::move(released));
    }
    if (!stopped) {
      if (std::optional<Emission> last = End(s)) out.push_back(std::move(*last));
    }
    return out;
  }

  // The worker reported sample s's end: its last emission, if every token
  // up to the end was released (else a later Deliver returns it).
  std::optional<Emission> Finish(uint32_t s, SampleFinish finish) {
    if (s >= size() || done(s)) return std::nullopt;
    Report(s, finish);
    return End(s);
  }

  // A new decode stream follows (a migration or a restart): it sends every
  // token not yet released again and says again how unfinished samples
  // end, so the buffered tokens and those ends are forgotten.
  void Restart() {
    for (std::map<uint32_t, Token>& buffered : buffered_) buffered.clear();
    ForgetReportedEnds();
  }

 private:
  std::optional<Emission> End(uint32_t s) {
    Emission last;
    last.sample_index = s;
    last.end = MaybeEnd(s, buffered_[s].empty(), &last.text);
    if (!last.end.has_value()) return std::nullopt;
    last.completion_tokens = next_index(s);
    return last;
  }

  std::vector<std::map<uint32_t, Token>> buffered_;  // per sample: arrived early
};

}  // namespace tandem::router

#endif  // TANDEM_ROUTER_SAMPLE_OUTPUT_H_
