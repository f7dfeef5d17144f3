// RequestHead: see request_head.h.
#include "common/http/request_head.h"

#include <algorithm>
#include <cstdint>
#include <limits>
#include <optional>
#include <utility>
#include <vector>

#include "absl/strings/ascii.h"
#include "absl/strings/match.h"
#include "absl/strings/str_split.h"

namespace tandem::http {
namespace {

// evhttp's value of a header: leading spaces and trailing blanks dropped.
absl::string_view Trimmed(absl::string_view v) {
  while (!v.empty() && v.front() == ' ') v.remove_prefix(1);
  while (!v.empty() && (v.back() == ' ' || v.back() == '\t' || v.back() == '\r')) {
    v.remove_suffix(1);
  }
  return v;
}

// evutil_strtoll(v, &end, 10) accepted whole and >= 0, as evhttp reads
// Content-Length; INT64_MAX when it does not fit (strtoll saturates); -1
// when evhttp refuses it.
int64_t ContentLength(absl::string_view v) {
  while (!v.empty() && absl::ascii_isspace(static_cast<unsigned char>(v.front()))) {
    v.remove_prefix(1);
  }
  if (!v.empty() && v.front() == '+') v.remove_prefix(1);
  if (v.empty()) return -1;
  int64_t n = 0;
  for (char c : v) {
    if (c < '0' || c > '9') return -1;
    const int digit = c - '0';
    if (n > (std::numeric_limits<int64_t>::max() - digit) / 10) {
      n = std::numeric_limits<int64_t>::max();
    } else if (n != std::numeric_limits<int64_t>::max()) {
      n = n * 10 + digit;
    }
  }
  return n;
}

}  // namespace

size_t RequestHead::Feed(std::string_view bytes) {
  if (complete_) return 0;
  size_t i = 0;
  for (; i < bytes.size() && !complete_; ++i) {
    const char c = bytes[i];
    if (c == '\n') {
      if (line_bytes_ == 0 && first_line_done_) complete_ = true;
      first_line_done_ = true;
      line_bytes_ = 0;
      pending_cr_ = false;
    } else if (c == '\r') {
      if (pending_cr_) ++line_bytes_;  // the earlier CR was data
      pending_cr_ = true;
    } else {
      line_bytes_ += pending_cr_ ? 2 : 1;
      pending_cr_ = false;
    }
  }
  const size_t room = max_bytes_ - head_.size();
  if (i > room) truncated_ = true;
  head_.append(bytes.data(), std::min(i, room));
  return i;
}

namespace {

// The head's method and its header lines as (name, value) in order; a line
// starting with a blank continues the previous value (evhttp appends it
// after a space). False when a header line has no colon (evhttp: 400).
bool ParseHead(absl::string_view head, absl::string_view* method,
               std::vector<std::pair<absl::string_view, std::string>>* headers) {
  std::vector<absl::string_view> lines = absl::StrSplit(head, '\n');
  if (lines.empty()) return false;
  const absl::string_view request_line = lines[0];
  *method = request_line.substr(0, request_line.find(' '));
  for (size_t i = 1; i < lines.size(); ++i) {
    absl::string_view line = lines[i];
    if (!line.empty() && line.back() == '\r') line.remove_suffix(1);
    if (line.empty()) break;
    if (line.front() == ' ' || line.front() == '\t') {
      if (!headers->empty()) {
        headers->back().second += ' ';
        headers->back().second += std::string(absl::StripAsciiWhitespace(line));
      }
      continue;
    }
    const size_t colon = line.find(':');
    if (colon == absl::string_view::npos) return false;
    headers->emplace_back(line.substr(0, colon), std::string(line.substr(colon + 1)));
  }
  return true;
}

}  // namespace

int64_t RequestHead::declared_body_bytes() const {
  if (!complete_ || truncated_) return -1;
  absl::string_view method;
  std::vector<std::pair<absl::string_view, std::string>> headers;
  if (!ParseHead(head_, &method, &headers)) return -1;
  if (method != "POST" && method != "PUT" && method != "PATCH") return -1;
  const std::string* length = nullptr;
  for (const auto& [name, value] : headers) {
    if (absl::EqualsIgnoreCase(name, "Transfer-Encoding")) {
      if (absl::EqualsIgnoreCase(Trimmed(value), "chunked")) return -1;
      break;  // the first one decides
    }
  }
  for (const auto& [name, value] : headers) {
    if (absl::EqualsIgnoreCase(name, "Content-Length")) {
      length = &value;
      break;
    }
  }
  return length == nullptr ? -1 : ContentLength(Trimmed(*length));
}

bool RequestHead::conflicting_lengths() const {
  if (!complete_ || truncated_) return false;
  absl::string_view method;
  std::vector<std::pair<absl::string_view, std::string>> headers;
  if (!ParseHead(head_, &method, &headers)) return false;
  std::optional<absl::string_view> first;
  for (const auto& [name, value] : headers) {
    if (!absl::EqualsIgnoreCase(name, "Content-Length")) continue;
    const absl::string_view v = Trimmed(value);
    if (first.has_value() && *first != v) return true;
    first = v;
  }
  return false;
}

void RequestHead::Reset() {
  head_.clear();
  truncated_ = false;
  line_bytes_ = 0;
  pending_cr_ = false;
  first_line_done_ = false;
  complete_ = false;
}

}  // namespace tandem::http
