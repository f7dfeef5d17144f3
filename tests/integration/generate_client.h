// Client-side helpers of the integration tests: the golden cases of
// ../shared/goldens/stories260K_greedy.json (and of the other models'
// <model>_greedy.json) and a Generation.Generate stream folded into plain
// values, per sample.
//
// Owns: nothing beyond one call's ClientContext. Threads: one GenerateStream
// per thread; Cancel() may be called from another thread.
#ifndef TANDEM_TESTS_INTEGRATION_GENERATE_CLIENT_H_
#define TANDEM_TESTS_INTEGRATION_GENERATE_CLIENT_H_

#include <cstdint>
#include <memory>
#include <optional>
#include <random>
#include <string>
#include <utility>
#include <vector>

#include <grpcpp/grpcpp.h>

#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "tandem/v1/generation.grpc.pb.h"

namespace tandem::testing {

// One case of stories260K_greedy.json (llama.cpp, greedy, 32 tokens).
struct GoldenCase {
  std::string name;                       // "once_upon_a_time", ...
  std::string prompt;
  std::vector<int32_t> prompt_ids;        // prompt_token_ids_with_bos
  std::vector<int32_t> generated_ids;     // generated_token_ids_f32kv
  size_t strict_prefix_len = 0;           // strict_prefix_len_f32kv
  // llama.cpp's five most likely ids of token 0 with their probability
  // (softmax of the raw logits): first_token_top5_f32kv {id, prob}.
  std::vector<std::pair<int32_t, double>> first_token_top5_probs;
  // Per generated position, llama.cpp's five most likely ids with their raw
  // logits, most likely first: steps[i].top5_f32kv [id, logit].
  std::vector<std::vector<std::pair<int32_t, double>>> steps_top5_logits;
  // The first strict_prefix_len generated ids: what must match exactly.
  std::vector<int32_t> StrictIds() const;
};

// Every case of the golden file, in file order. Fails the current test
// (ADD_FAILURE) and returns {} when the file cannot be read or parsed.
const std::vector<GoldenCase>& Goldens();
// The case named `name`; fails the current test if there is none.
const GoldenCase& Golden(const std::string& name);

// One case of ../shared/goldens/<model>_greedy.json (llama.cpp, greedy).
struct ModelGolden {
  std::string name;
  std::string prompt;
  std::vector<int32_t> prompt_ids;     // prompt_token_ids: BOS per add_bos, specials parsed
  std::vector<int32_t> generated_ids;  // F32 KV cache
  size_t strict_prefix_len = 0;
};

struct ModelGoldens {
  std::vector<int32_t> eog_ids;  // model.eog_ids, where the file has them
  std::vector<ModelGolden> cases;
};

// The cases at JSON pointer `cases` of ../shared/goldens/<file> (and the
// model's eog_ids where the file has them). Fails the current test
// (ADD_FAILURE) on a file that cannot be read or parsed.
ModelGoldens ReadGoldens(const std::string& file, const std::string& cases = "/cases");

// The model's context length: stories260K.gguf's llama.context_length
// (also the golden file's runtime n_ctx).
inline constexpr uint32_t kContextLength = 2048;
inline constexpr int32_t kBosId = 1;  // the golden file's tokenizer.bos_id
inline constexpr uint32_t kGoldenMaxTokens = 32;  // the golden file's n_predict

// A request for `prompt`: greedy (temperature 0), `max_tokens`, `route`.
v1::GenerateRequest MakeRequest(const std::string& prompt, uint32_t max_tokens,
                                v1::RouteOverride route = v1::ROUTE_AUTO);

// Switches `request` to temperature sampling with `seed` (SamplingParams
// has_seed = true).
void SetSeededSampling(v1::GenerateRequest* request, float temperature, uint64_t seed);

// Route as the router names it: "local" / "remote".
std::string RouteName(v1::RouteOverride route);

// One streamed message of one sample: its tokens and text.
struct StreamMessage {
  std::vector<int32_t> token_ids;
  std::string text;
  bool has_finish = false;  // carries a finish_reason
};

// Everything one Generate call returned for one sample (sample_index).
struct SampleResult {
  std::vector<int32_t> token_ids;   // in stream order
  std::vector<uint32_t> indices;    // TokenOutput.index, stream order
  std::vector<float> logprobs;      // TokenOutput.logprob, stream order
  // TokenOutput.top_logprobs of each token, stream order.
  std::vector<std::vector<v1::TopLogprob>> top_logprobs;
  std::string text;                 // the concatenation of its messages' text
  v1::FinishReason finish_reason = v1::FINISH_NONE;  // the last one seen
  int finish_messages = 0;          // messages carrying a finish_reason
  // GenerateResponse.placement / timing of the last message with a
  // finish_reason that had them (absent: none did).
  std::optional<v1::Placement> placement;
  std::optional<v1::RequestTiming> timing;
  bool tokens_after_finish = false;  // a message with tokens came after the finish
  v1::StopReason stop_reason;       // of the message that carried one
  int stop_reason_messages = 0;     // messages carrying a stop_reason
  uint32_t completion_tokens = 0;   // last non-zero completion_tokens
  // Tokens whose TokenOutput.sample_index differs from their message's.
  int foreign_tokens = 0;
  std::vector<StreamMessage> messages;  // every message of this sample but the header

  // True when indices are exactly 0, 1, ..., n-1.
  bool IndicesAreSequential() const;
};

// Everything one Generate call returned.
struct StreamResult {
  grpc::Status status;
  int messages = 0;
  std::string request_id;               // first non-empty
  std::string route;                    // first non-empty
  std::string prefill_worker;           // first non-empty (the header's first pick)
  std::string decode_worker;
  // From the last message with a finish_reason: the workers that served
  // the request after any retry, local fallback or migration.
  std::string served_route;
  std::string served_prefill_worker;
  std::string served_decode_worker;
  std::vector<int32_t> prompt_token_ids;  // from the first message that has them
  int prompt_ids_messages = 0;            // messages carrying prompt_token_ids
  bool first_message_has_prompt_ids = false;
  std::vector<int32_t> token_ids;         // in stream order
  std::vector<uint32_t> indices;          // TokenOutput.index, stream order
  std::vector<float> logprobs;            // TokenOutput.logprob, stream order
  uint64_t seed = 0;                      // from the first message
  v1::FinishReason finish_reason = v1::FINISH_NONE;
  uint32_t prompt_tokens = 0;      // last non-zero GenerateResponse.prompt_tokens
  uint32_t completion_tokens = 0;  // last non-zero completion_tokens
  uint32_t cached_prompt_tokens = 0;  // last non-zero cached_prompt_tokens
  std::string text;
  // Per sample: samples[s] holds what the messages with sample_index s
  // carried (the header, which has no tokens, text or finish_reason, is
  // not counted). token_ids, indices, logprobs and text above are those of
  // every sample together, in stream order.
  std::vector<SampleResult> samples;
  uint32_t max_sample_index = 0;  // the largest sample_index of any message

  // Folds one message in.
  void Add(const v1::GenerateResponse& response);
  // True when indices are exactly 0, 1, ..., n-1.
  bool IndicesAreSequential() const;
};

// One streaming call on `stub`. The call starts in the constructor.
class GenerateStream {
 public:
  GenerateStream(v1::Generation::Stub& stub, const v1::GenerateRequest& request,
                 absl::Duration timeout = absl::Seconds(60));
  GenerateStream(const GenerateStream&) = delete;
  GenerateStream& operator=(const GenerateStream&) = delete;

  // Reads one message into result(); false at the end of the stream.
  bool ReadOne();
  // Reads until the result holds at least one token; false if the stream
  // ended first.
  bool ReadUntilFirstToken();
  // Reads the rest and the final status (into result().status).
  const StreamResult& Finish();
  // ClientContext::TryCancel.
  void Cancel() { context_.TryCancel(); }

  const StreamResult& result() const { return result_; }

 private:
  grpc::ClientContext context_;
  std::unique_ptr<grpc::ClientReader<v1::GenerateResponse>> reader_;
  StreamResult result_;
  bool done_ = false;
};

// Checks a finished greedy stream of `max_tokens` (>= strict_prefix_len)
// against golden case `g` on `route` ("local" / "remote") served by
// LocalCluster's workers: OK status, route and worker names,
// prompt_token_ids once in the first message, sequential indices, at most
// max_tokens ids (FINISH_LENGTH when all of them), and the first
// strict_prefix_len ids.
void ExpectGolden(const StreamResult& r, const GoldenCase& g, const std::string& route,
                  uint32_t max_tokens = kGoldenMaxTokens);

// A whole call: GenerateStream(...).Finish().
StreamResult RunGenerate(v1::Generation::Stub& stub, const v1::GenerateRequest& request,
                         absl::Duration timeout = absl::Seconds(60));

// All `requests` at once: every call is started before any is read, then
// each stream is read to its end on its own thread. Results in request
// order.
std::vector<StreamResult> RunConcurrently(v1::Generation::Stub& stub,
                                          const std::vector<v1::GenerateRequest>& requests,
                                          absl::Duration timeout = absl::Seconds(60));

// The IEEE-754 bits of `f`, so logprobs compare bit for bit (and print as
// integers in failure messages).
uint32_t FloatBits(float f);

// Generation.Tokenize on the router with BOS: the prompt ids a Generate of
// `text` would use.
absl::StatusOr<std::vector<int32_t>> Tokenize(v1::Generation::Stub& stub,
                                              const std::string& text);

// Text whose tokenization (BOS included) has exactly `num_tokens` tokens:
// the longest word prefix of the golden long_repeated_313tok prompt with at
// most num_tokens tokens, padded with " a" words, each count checked with
// Tokenize. FAILED_PRECONDITION when padding cannot reach the count.
absl::StatusOr<std::string> PromptWithTokenCount(v1::Generation::Stub& stub,
                                                 size_t num_tokens);

// `min_words`..`max_words` words drawn by `rng` from the words of the
// golden prompts, joined by spaces: roughly 1-3 tokens a word (about 1.7
// on average), so 3-60 words make prompts of about 5-120 tokens.
// Deterministic for a seeded rng.
std::string RandomPrompt(std::mt19937_64& rng, size_t min_words, size_t max_words);

// A request drawn by `rng` on `route`: RandomPrompt(rng, 3, 60), max_tokens
// in [8, 32], and either greedy or temperature 0.8 with a drawn seed (even
// odds), so the same rng state gives the same request.
v1::GenerateRequest RandomRequest(std::mt19937_64& rng, v1::RouteOverride route);

}  // namespace tandem::testing

#endif  // TANDEM_TESTS_INTEGRATION_GENERATE_CLIENT_H_
