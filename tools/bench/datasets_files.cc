// The file datasets of `tandem bench` (datasets.h): ShareGPT and Mooncake.
//
// ShareGPT (vLLM benchmarks/datasets.py, ShareGPTDataset): one JSON list;
// entry i (0-based) is an object whose "conversations" is a list of
// {"from", "value"} turns. Entries with fewer than two turns are skipped (as
// in vLLM); a malformed entry (not an object, no "conversations", not a
// list, one of the first two turns without a string "value") is an error
// naming it, checked for every entry before any is used so the error does
// not depend on --seed or --num-prompts. Later turns are not read.
//
// Mooncake (github.com/kvcache-ai/Mooncake, FAST'25 traces): JSONL, one
// object per line, blank lines skipped, other keys ignored:
//   {"timestamp": 27482, "input_length": 6955, "output_length": 52,
//    "hash_ids": [46, 47, 48, 49, 50, 51, 52, 53, 54, 55, 56, 57, 2353, 2354]}
//   timestamp      ms, a number >= 0, non-decreasing down the file
//   input_length   prompt tokens, an integer in [1, 2^24]
//   output_length  tokens to generate, an integer in [1, 2^24]
//   hash_ids       a list of integers (possibly empty): block k of the
//                  prompt is --mooncake-block-size tokens drawn from
//                  SeededRng(seed, kMooncakeBlock, hash_ids[k]); blocks are
//                  used until input_length tokens are reached, the last one
//                  cut; tokens still missing come from SeededRng(seed,
//                  kMooncakeLine, the line's 1-based number)
// Every line is checked (errors "PATH:LINE: FIELD: ..."), then the first
// --num-prompts lines become requests.
#include <algorithm>
#include <cctype>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include <nlohmann/json.hpp>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "tools/bench/dataset_sampling.h"
#include "tools/bench/datasets_internal.h"

namespace tandem::bench {
namespace {

using json = nlohmann::json;

// A value as JSON text, cut to 40 characters for an error message.
std::string Shown(const json& value) {
  std::string text = value.dump();
  if (text.size() > 40) text = text.substr(0, 37) + "...";
  return text;
}

// nlohmann's parse error without its "[json.exception.parse_error.101] ";
// for one trace line, without its "line 1, " (the file's line is named).
std::string ParseErrorText(const json::parse_error& e, bool one_line) {
  std::string text = e.what();
  if (const size_t end = text.find("] "); end != std::string::npos) text.erase(0, end + 2);
  if (const size_t at = text.find("at line 1, column "); one_line && at != std::string::npos) {
    text.erase(at + 3, 8);
  }
  return text;
}

// vLLM's is_valid_sequence (benchmarks/datasets.py) with its defaults:
// min_len 4, max_prompt_len 1024, max_total_len 2048; the output's minimum
// is not checked when --sharegpt-output-len fixes it.
bool IsValidShareGptPair(int64_t prompt_len, int64_t output_len, bool fixed_output) {
  if (prompt_len < 4 || prompt_len > 1024) return false;
  if (!fixed_output && output_len < 4) return false;
  return prompt_len + output_len <= 2048;
}

struct ShareGptPair {
  size_t entry;
  const std::string* prompt;
  const std::string* reply;
};

// One Mooncake line, checked.
struct TraceLine {
  int64_t line = 0;  // 1-based
  double timestamp_ms = 0;
  std::string timestamp_text;  // as written, for messages
  int64_t input_length = 0;
  int64_t output_length = 0;
  std::vector<uint64_t> hash_ids;
};

[[nodiscard]] absl::Status TraceLengthField(const json& object, const char* field, int64_t* out) {
  const auto it = object.find(field);
  if (it == object.end()) {
    return absl::InvalidArgumentError(absl::StrCat(field, ": missing"));
  }
  // nlohmann parses integers >= 0 as unsigned (negative ones as signed,
  // fractions as floats: all refused).
  const bool in_range = it->is_number_unsigned() && it->get<uint64_t>() >= 1 &&
                        it->get<uint64_t>() <= static_cast<uint64_t>(kMaxRequestTokens);
  if (!in_range) {
    return absl::InvalidArgumentError(absl::StrCat(field, ": expected an integer in [1, ",
                                                   kMaxRequestTokens, "], got ", Shown(*it)));
  }
  *out = static_cast<int64_t>(it->get<uint64_t>());
  return absl::OkStatus();
}

// Parses one non-blank line; errors name the field, without the
// "PATH:LINE: " prefix.
[[nodiscard]] absl::StatusOr<TraceLine> ParseTraceLine(std::string_view text, int64_t line_no) {
  json object;
  try {
    object = json::parse(text);
  } catch (const json::parse_error& e) {
    return absl::InvalidArgumentError(absl::StrCat("not JSON: ", ParseErrorText(e, true)));
  }
  if (!object.is_object()) {
    return absl::InvalidArgumentError(absl::StrCat("expected a JSON object, got ", Shown(object)));
  }
  TraceLine line;
  line.line = line_no;
  const auto ts = object.find("timestamp");
  if (ts == object.end()) return absl::InvalidArgumentError("timestamp: missing");
  if (!ts->is_number() || ts->get<double>() < 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("timestamp: expected a number of ms >= 0, got ", Shown(*ts)));
  }
  line.timestamp_ms = ts->get<double>();
  line.timestamp_text = Shown(*ts);
  if (auto s = TraceLengthField(object, "input_length", &line.input_length); !s.ok()) return s;
  if (auto s = TraceLengthField(object, "output_length", &line.output_length); !s.ok()) return s;
  const auto ids = object.find("hash_ids");
  if (ids == object.end()) {
    return absl::InvalidArgumentError("hash_ids: missing (a list of integers, possibly empty)");
  }
  if (!ids->is_array()) {
    return absl::InvalidArgumentError(
        absl::StrCat("hash_ids: expected a list of integers, got ", Shown(*ids)));
  }
  line.hash_ids.reserve(ids->size());
  for (size_t k = 0; k < ids->size(); ++k) {
    const json& id = (*ids)[k];
    if (!id.is_number_integer()) {
      return absl::InvalidArgumentError(
          absl::StrCat("hash_ids[", k, "]: expected an integer, got ", Shown(id)));
    }
    line.hash_ids.push_back(id.is_number_unsigned() ? id.get<uint64_t>()
                                                    : static_cast<uint64_t>(id.get<int64_t>()));
  }
  return line;
}

bool IsBlank(std::string_view text) {
  return std::all_of(text.begin(), text.end(),
                     [](unsigned char c) { return std::isspace(c) != 0; });
}

}  // namespace

[[nodiscard]] absl::StatusOr<std::vector<BenchRequest>> LoadShareGpt(const DatasetOptions& o,
                                                                     const Tokenizer& tokenizer) {
  const bool fixed_output = o.sharegpt_output_len.has_value();
  if (fixed_output && *o.sharegpt_output_len < 1) {
    return absl::InvalidArgumentError(
        absl::StrCat("--sharegpt-output-len: must be >= 1, got ", *o.sharegpt_output_len));
  }
  absl::StatusOr<std::string> text = ReadWholeFile(o.path);
  if (!text.ok()) return text.status();
  json doc;
  try {
    doc = json::parse(*text);
  } catch (const json::parse_error& e) {
    return absl::InvalidArgumentError(
        absl::StrCat(o.path, ": not JSON: ", ParseErrorText(e, false)));
  }
  if (!doc.is_array()) {
    return absl::InvalidArgumentError(absl::StrCat(
        o.path, ": expected a JSON list of conversations, got a JSON ", doc.type_name()));
  }
  std::vector<ShareGptPair> pairs;
  for (size_t i = 0; i < doc.size(); ++i) {
    const json& entry = doc[i];
    const std::string where = absl::StrCat(o.path, ": entry ", i, ": ");
    if (!entry.is_object()) {
      return absl::InvalidArgumentError(
          absl::StrCat(where, "expected an object, got ", Shown(entry)));
    }
    const auto turns = entry.find("conversations");
    if (turns == entry.end()) {
      return absl::InvalidArgumentError(absl::StrCat(where, "no \"conversations\""));
    }
    if (!turns->is_array()) {
      return absl::InvalidArgumentError(
          absl::StrCat(where, "conversations: expected a list, got ", Shown(*turns)));
    }
    if (turns->size() < 2) continue;  // vLLM's filter: a prompt and a reply
    const std::string* values[2];
    for (size_t t = 0; t < 2; ++t) {
      const json& turn = (*turns)[t];
      const auto value = turn.is_object() ? turn.find("value") : turn.end();
      if (!turn.is_object() || value == turn.end() || !value->is_string()) {
        return absl::InvalidArgumentError(
            absl::StrCat(where, "conversations[", t,
                         "]: expected an object with a string \"value\", got ", Shown(turn)));
      }
      values[t] = value->get_ptr<const std::string*>();
    }
    pairs.push_back({i, values[0], values[1]});
  }
  std::mt19937_64 rng = SeededRng(o.seed, RngStream::kShareGpt);
  Shuffle(pairs, rng);

  std::vector<BenchRequest> requests;
  for (const ShareGptPair& pair : pairs) {
    if (requests.size() >= static_cast<size_t>(o.num_prompts)) break;
    absl::StatusOr<std::vector<int32_t>> prompt_ids = tokenizer(*pair.prompt);
    if (!prompt_ids.ok()) return prompt_ids.status();
    const auto prompt_len = static_cast<int64_t>(prompt_ids->size());
    int64_t output_len = 0;
    if (fixed_output) {
      output_len = *o.sharegpt_output_len;
    } else {
      absl::StatusOr<std::vector<int32_t>> reply_ids = tokenizer(*pair.reply);
      if (!reply_ids.ok()) return reply_ids.status();
      output_len = static_cast<int64_t>(reply_ids->size());
    }
    if (!IsValidShareGptPair(prompt_len, output_len, fixed_output)) continue;
    if (auto s = CheckContextLength(
            absl::StrCat("request ", requests.size(), " (", o.path, " entry ", pair.entry, ")"),
            prompt_len, output_len, o.context_length,
            "--sharegpt-output-len, or serve a model with a longer context");
        !s.ok()) {
      return s;
    }
    BenchRequest& r = requests.emplace_back();
    r.prompt = *pair.prompt;
    r.prompt_len = static_cast<int32_t>(prompt_len);
    r.output_len = static_cast<int32_t>(output_len);
  }
  if (requests.empty()) {
    return absl::InvalidArgumentError(
        absl::StrCat(o.path,
                     ": no usable conversation (vLLM's filter: two turns, a prompt of 4..1024 "
                     "tokens, a reply of >= 4, prompt + output <= 2048)"));
  }
  return requests;
}

[[nodiscard]] absl::StatusOr<std::vector<BenchRequest>> LoadMooncake(const DatasetOptions& o,
                                                                     const TokenSampler& sampler) {
  if (o.mooncake_block_size < 1) {
    return absl::InvalidArgumentError(
        absl::StrCat("--mooncake-block-size: must be >= 1, got ", o.mooncake_block_size));
  }
  absl::StatusOr<std::string> text = ReadWholeFile(o.path);
  if (!text.ok()) return text.status();
  std::vector<TraceLine> lines;
  const std::string_view all = *text;
  int64_t line_no = 0;
  for (size_t start = 0; start < all.size();) {
    size_t end = all.find('\n', start);
    if (end == std::string_view::npos) end = all.size();
    std::string_view line = all.substr(start, end - start);
    start = end + 1;
    ++line_no;
    if (IsBlank(line)) continue;
    absl::StatusOr<TraceLine> parsed = ParseTraceLine(line, line_no);
    if (!parsed.ok()) {
      return absl::InvalidArgumentError(
          absl::StrCat(o.path, ":", line_no, ": ", parsed.status().message()));
    }
    if (!lines.empty() && parsed->timestamp_ms < lines.back().timestamp_ms) {
      return absl::InvalidArgumentError(
          absl::StrCat(o.path, ":", line_no, ": timestamp: ", parsed->timestamp_text,
                       " ms is before line ", lines.back().line, "'s ", lines.back().timestamp_text,
                       " ms (timestamps must not decrease)"));
    }
    if (!lines.empty() &&
        (parsed->timestamp_ms - lines.front().timestamp_ms) / 1000.0 > kMaxSendTimeS) {
      return absl::InvalidArgumentError(absl::StrCat(
          o.path, ":", line_no, ": timestamp: ", parsed->timestamp_text, " ms is more than ",
          kMaxSendTimeS, " s after line ", lines.front().line, "'s"));
    }
    lines.push_back(std::move(*parsed));
  }
  if (lines.empty()) {
    return absl::InvalidArgumentError(absl::StrCat(o.path, ": no requests (an empty trace)"));
  }
  if (lines.size() > static_cast<size_t>(o.num_prompts)) lines.resize(o.num_prompts);

  int64_t total = 0;
  for (size_t i = 0; i < lines.size(); ++i) {
    if (auto s = CheckContextLength(
            absl::StrCat("request ", i, " (", o.path, ":", lines[i].line, ")"),
            lines[i].input_length, lines[i].output_length, o.context_length,
            "--num-prompts to stop before this line, or serve a model with a longer context");
        !s.ok()) {
      return s;
    }
    total += lines[i].input_length;
  }
  if (auto s = CheckDatasetSize(total, "--num-prompts"); !s.ok()) return s;

  const double t0_ms = lines.front().timestamp_ms;
  std::vector<BenchRequest> requests(lines.size());
  for (size_t i = 0; i < lines.size(); ++i) {
    const TraceLine& line = lines[i];
    BenchRequest& r = requests[i];
    r.prompt_token_ids.reserve(static_cast<size_t>(line.input_length));
    int64_t missing = line.input_length;
    for (size_t k = 0; k < line.hash_ids.size() && missing > 0; ++k) {
      std::mt19937_64 block_rng = SeededRng(o.seed, RngStream::kMooncakeBlock, line.hash_ids[k]);
      const int64_t take = std::min<int64_t>(missing, o.mooncake_block_size);
      sampler.Append(block_rng, take, r.prompt_token_ids);
      missing -= take;
    }
    if (missing > 0) {
      std::mt19937_64 own_rng =
          SeededRng(o.seed, RngStream::kMooncakeLine, static_cast<uint64_t>(line.line));
      sampler.Append(own_rng, missing, r.prompt_token_ids);
    }
    r.prompt_len = static_cast<int32_t>(line.input_length);
    r.output_len = static_cast<int32_t>(line.output_length);
    r.timestamp_s = (line.timestamp_ms - t0_ms) / 1000.0;
  }
  return requests;
}

}  // namespace tandem::bench
