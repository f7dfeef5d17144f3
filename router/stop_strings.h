// Stop strings of one sample (GenerateRequest.stop): the matcher the router
// runs on each sample's detokenized text, on the local and the remote route
// alike.
//
// Semantics (vLLM's stop strings, sampling_params.stop, made byte-exact for
// streaming):
//   - The text is matched as bytes, across push boundaries. The match that
//     completes first in the text ends the sample; of matches completing at
//     the same byte the one starting earliest (the longest) wins, then the
//     lower index in the list (duplicates).
//   - Released text: everything before the match; with
//     include_stop_str_in_output the matched string too. Nothing after the
//     match is ever released.
//   - Hold-back: without include_stop_str_in_output only the longest suffix
//     of the unreleased text that is a proper prefix of some stop string is
//     kept back (at most longest stop - 1 bytes); with it nothing is kept
//     back (the match is released anyway). Flush() returns what is held.
//   - Streamed and whole-text results are identical: for any split of a text
//     into pushes (with the same `check` flag), the concatenation of what
//     Push and Flush release, and the match, equal those of one Push of the
//     whole text.
//   - min_tokens: text pushed with check = false (vLLM checks no stop string
//     before min_tokens tokens were generated) is released at once, together
//     with anything held back, and never takes part in a match: a stop
//     string whose first byte lies in such text does not match, even when
//     its end arrives checked. (vLLM's find() window may reach back into
//     text from before min_tokens; here checking starts fresh.)
// Differences from vLLM (v1 engine/detokenizer.py, check_stop_strings): vLLM
// takes the first string in list order that occurs in the new text window,
// not the earliest completion; and its streams hold back a fixed
// (longest - 1) characters instead of only a pending prefix.
//
// UTF-8: the router feeds tokenizer::IncrementalDecoder::Push output, which
// is always whole, well-formed UTF-8 characters (an incomplete tail is held
// in the decoder, ill-formed bytes become U+FFFD). Stop strings are valid
// UTF-8 (validated by the router), so a match or a held prefix starts at a
// lead byte, i.e. at a character boundary, and what is released is whole
// characters too.
//
// Implementation: an Aho-Corasick automaton over the stop strings (A. V. Aho,
// M. J. Corasick, "Efficient string matching", CACM 18(6), 1975), so a push
// costs O(bytes pushed) amortized; its state is exactly the longest suffix
// of the checked text that is a prefix of a stop string.
//
// Owns: one sample's matching state and held-back bytes. The automaton is
// immutable and shared between copies, so the router builds one matcher per
// request and copies it per sample. Threads: not thread-safe; one sample's
// pushes come from one thread (or under the caller's lock).
#ifndef TANDEM_ROUTER_STOP_STRINGS_H_
#define TANDEM_ROUTER_STOP_STRINGS_H_

#include <cstdint>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "absl/status/status.h"

namespace tandem::router {

// GenerateRequest.stop's limits.
inline constexpr size_t kMaxStopStrings = 16;
inline constexpr size_t kMaxStopStringBytes = 256;

// INVALID_ARGUMENT "stop: at most 16 strings, got N" or "stop[i]: must be 1
// to 256 bytes, got N". (Their UTF-8 is checked when the request is
// parsed.)
[[nodiscard]] absl::Status ValidateStopStrings(const std::vector<std::string>& stops);

// What one StopStringMatcher::Push releases.
struct StopPush {
  // Bytes that may be sent to the client now (possibly empty).
  std::string text;
  // Index into the matcher's stop list of the string that ended the sample
  // in this push; -1 when none did.
  int stop_index = -1;

  bool stopped() const { return stop_index >= 0; }
};

class StopStringMatcher {
 public:
  // `stops`: GenerateRequest.stop as validated by the router (1..16 strings
  // of 1..256 bytes). An empty list never matches (every byte is released
  // at once). Precondition: no string is empty (an empty one is ignored).
  StopStringMatcher(const std::vector<std::string>& stops, bool include_stop_str_in_output);

  // Appends `new_text` (the next detokenized bytes of the sample) and
  // returns what may be released now and whether a stop string matched.
  // `check` false (fewer than min_tokens tokens generated so far): the held
  // bytes and `new_text` are released at once and can start no match.
  // After a match every later Push and Flush returns nothing.
  StopPush Push(std::string_view new_text, bool check = true);

  // End of a sample that did not stop (length, end-of-generation token,
  // stop token id, context): returns the held-back bytes and forgets any
  // partial match. "" after a match.
  std::string Flush();

  // Whether a stop string has matched; which one (-1 when none).
  bool stopped() const { return stop_index_ >= 0; }
  int stop_index() const { return stop_index_; }
  // The stop strings, in the constructor's order (index = stop_index).
  const std::vector<std::string>& stops() const;
  // The bytes currently held back: the longest suffix of the unreleased
  // checked text that is a proper prefix of some stop string; always empty
  // with include_stop_str_in_output.
  const std::string& held() const { return held_; }

 private:
  struct Automaton;

  std::shared_ptr<const Automaton> automaton_;
  bool include_;
  int32_t state_ = 0;  // automaton node: longest suffix of checked text that prefixes a stop
  std::string held_;   // unreleased bytes (the node's string, without include_)
  int stop_index_ = -1;
};

}  // namespace tandem::router

#endif  // TANDEM_ROUTER_STOP_STRINGS_H_
