#include "router/sample_output.h"

#include <algorithm>
#include <limits>

namespace tandem::router {

SampleTexts::SampleTexts(const tokenizer::Tokenizer& tokenizer, const SampleOutputOptions& options)
    : eog_ids_(tokenizer.eog_ids()), options_(options) {
  stop_criteria_.eog_token_ids = eog_ids_;
  std::sort(stop_criteria_.eog_token_ids.begin(), stop_criteria_.eog_token_ids.end());
  // Only the stop-token part of CheckStop is asked here.
  stop_criteria_.context_length = std::numeric_limits<int32_t>::max();
  stop_token_ids_ = options_.stop_token_ids;
  std::sort(stop_token_ids_.begin(), stop_token_ids_.end());
  const StopStringMatcher stops(options_.stop, options_.include_stop_str_in_output);
  samples_.reserve(options_.n);
  for (uint32_t s = 0; s < options_.n; ++s) samples_.emplace_back(tokenizer, stops);
  samples_left_ = options_.n;
}

bool SampleTexts::progressed() const {
  return std::any_of(samples_.begin(), samples_.end(),
                     [](const Sample& s) { return s.next_index > 0 || s.done; });
}

std::optional<SampleEnd> SampleTexts::Release(uint32_t s, int32_t token_id, std::string* text) {
  Sample& sample = samples_[s];
  sample.last_token = token_id;
  sample.emitted.push_back(token_id);
  const int64_t min_tokens = options_.min_tokens;
  // vLLM checks stop strings once the output holds min_tokens tokens.
  const int64_t num_generated = static_cast<int64_t>(sample.next_index) + 1;
  const bool check = num_generated >= min_tokens;
  // A token that ends the sample as a stop token keeps its id but not its
  // text, unless include_stop_str_in_output (vLLM's detokenizer skips it).
  const core::RequestStops stops{stop_token_ids_, options_.ignore_eos, min_tokens,
                                 std::numeric_limits<int64_t>::max()};
  const bool stop_token = !options_.include_stop_str_in_output &&
                          core::CheckStop(stop_criteria_, stops, token_id, num_generated, 0) ==
                              core::FinishReason::kStop;
  StopPush pushed =
      sample.matcher.Push(stop_token ? std::string() : sample.decoder.Push(token_id), check);
  ++sample.next_index;
  text->append(pushed.text);
  if (!pushed.stopped()) return std::nullopt;
  SampleEnd end;
  end.finish = SampleFinish::kStop;
  end.stop_string = sample.matcher.stops()[pushed.stop_index];
  end.stopped_early = true;
  return Ended(s, std::move(end));
}

void SampleTexts::Report(uint32_t s, SampleFinish finish) {
  if (!samples_[s].done) samples_[s].reported = finish;
}

std::optional<SampleEnd> SampleTexts::MaybeEnd(uint32_t s, bool nothing_buffered,
                                               std::string* text) {
  Sample& sample = samples_[s];
  // D reports a sample's end after its tokens; only a remote token 0 (from
  // P's reply) may still be on its way.
  if (sample.done || sample.reported == SampleFinish::kNone || !nothing_buffered ||
      sample.next_index == 0) {
    return std::nullopt;
  }
  StopPush pushed = sample.matcher.Push(
      sample.decoder.Flush(), static_cast<int64_t>(sample.next_index) >= options_.min_tokens);
  SampleEnd end;
  if (pushed.stopped()) {
    text->append(pushed.text);
    end.finish = SampleFinish::kStop;
    end.stop_string = sample.matcher.stops()[pushed.stop_index];
    return Ended(s, std::move(end));
  }
  text->append(pushed.text);
  text->append(sample.matcher.Flush());
  end.finish = sample.reported;
  const bool eog_stop = !options_.ignore_eos && std::find(eog_ids_.begin(), eog_ids_.end(),
                                                          sample.last_token) != eog_ids_.end();
  const std::vector<int32_t>& stop_ids = options_.stop_token_ids;
  if (sample.reported == SampleFinish::kStop && !eog_stop &&
      std::find(stop_ids.begin(), stop_ids.end(), sample.last_token) != stop_ids.end()) {
    end.stop_token_id = sample.last_token;  // as vLLM: an EOS stop has no stop_reason
  }
  return Ended(s, std::move(end));
}

void SampleTexts::ForgetReportedEnds() {
  for (Sample& sample : samples_) {
    if (!sample.done) sample.reported = SampleFinish::kNone;
  }
}

SampleEnd SampleTexts::Ended(uint32_t s, SampleEnd end) {
  samples_[s].done = true;
  samples_[s].sent = end.finish;
  --samples_left_;
  return end;
}

}  // namespace tandem::router
