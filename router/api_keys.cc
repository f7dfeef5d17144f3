// API keys: the keys file parser (yaml-cpp; every call into it inside one
// try-block, scalars converted by hand so messages name our fields), the
// SHA-256 of a presented key (OpenSSL), per-key admission and counters.
#include "router/api_keys.h"

#include <yaml-cpp/yaml.h>

#include <algorithm>
#include <chrono>
#include <fstream>
#include <cerrno>
#include <cstring>
#include <filesystem>
#include <set>
#include <sstream>

#include "absl/strings/ascii.h"
#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "auth/crypto.h"
#include "router/admission.h"

namespace tandem::router {

std::string Sha256Hex(absl::string_view data) { return auth::Hex(auth::Sha256(data)); }

namespace {

[[nodiscard]] absl::Status Invalid(const std::string& field, absl::string_view what) {
  return absl::InvalidArgumentError(absl::StrCat(field, ": ", what));
}

// A name as it may appear in status lines and logs.
bool ValidName(const std::string& name) {
  return !name.empty() && std::all_of(name.begin(), name.end(), [](char c) {
    return absl::ascii_isalnum(c) || c == '.' || c == '_' || c == '-';
  });
}

// map[key] as an integer in [0, max] into *out when present.
template <typename T>
[[nodiscard]] absl::Status ReadLimit(const YAML::Node& map, const char* key,
                                     const std::string& path, int64_t max, T* out) {
  const YAML::Node node = map[key];
  if (!node.IsDefined()) return absl::OkStatus();
  const std::string field = absl::StrCat(path, ".", key);
  int64_t value = 0;
  if (!node.IsScalar() || !absl::SimpleAtoi(node.Scalar(), &value) || value < 0 || value > max) {
    return Invalid(field, absl::StrCat("expected an integer in [0, ", max, "], got '",
                                       node.IsScalar() ? node.Scalar() : "<not a scalar>", "'"));
  }
  *out = static_cast<T>(value);
  return absl::OkStatus();
}

[[nodiscard]] absl::StatusOr<ApiKeyEntry> ParseEntry(const YAML::Node& item, size_t index) {
  std::string path = absl::StrCat("keys[", index, "]");
  if (!item.IsMap()) return Invalid(path, "expected a mapping");
  ApiKeyEntry e;
  const YAML::Node name = item["name"];
  if (!name.IsDefined() || !name.IsScalar() || !ValidName(name.Scalar())) {
    return Invalid(path + ".name", "required, letters, digits, '.', '_' or '-'");
  }
  e.name = name.Scalar();
  path = absl::StrCat(path, " (", e.name, ")");
  static const std::set<std::string> kKnown = {"name", "sha256", "tokens_per_minute",
                                               "max_concurrent_requests", "admin"};
  std::set<std::string> seen;
  for (const auto& kv : item) {
    const std::string key = kv.first.IsScalar() ? kv.first.Scalar() : "<not a scalar>";
    if (!seen.insert(key).second) {
      return Invalid(path, absl::StrCat("duplicate key '", key, "'"));
    }
    if (!kKnown.count(key)) {
      return Invalid(path, absl::StrCat("unknown key '", key,
                                        "' (known: name, sha256, tokens_per_minute, "
                                        "max_concurrent_requests, admin)"));
    }
  }
  const YAML::Node hash = item["sha256"];
  const std::string hash_text = hash.IsDefined() && hash.IsScalar() ? hash.Scalar() : "";
  if (hash_text.size() != 64 ||
      !std::all_of(hash_text.begin(), hash_text.end(), absl::ascii_isxdigit)) {
    return Invalid(
        path + ".sha256",
        absl::StrCat("expected the key's SHA-256 as 64 hex digits "
                     "(printf %s KEY | sha256sum), got ",
                     hash_text.size(), " characters",
                     std::all_of(hash_text.begin(), hash_text.end(), absl::ascii_isxdigit)
                         ? ""
                         : ", not all hex",
                     " (the value is not shown: it may be the key itself)"));
  }
  e.sha256_hex = absl::AsciiStrToLower(hash_text);
  if (absl::Status s = ReadLimit(item, "tokens_per_minute", path, TokenBucket::kMaxTokensPerMinute,
                                 &e.tokens_per_minute);
      !s.ok()) {
    return s;
  }
  if (absl::Status s =
          ReadLimit(item, "max_concurrent_requests", path, INT32_MAX, &e.max_concurrent_requests);
      !s.ok()) {
    return s;
  }
  if (const YAML::Node admin = item["admin"]; admin.IsDefined()) {
    const std::string text = admin.IsScalar() ? admin.Scalar() : "";
    if (text != "true" && text != "false") {
      return Invalid(path + ".admin", absl::StrCat("expected true or false, got '", text, "'"));
    }
    e.admin = text == "true";
  }
  return e;
}

}  // namespace

absl::StatusOr<std::vector<ApiKeyEntry>> ParseApiKeys(const std::string& yaml_text) {
  std::vector<ApiKeyEntry> entries;
  try {
    const YAML::Node root = YAML::Load(yaml_text);
    if (!root.IsMap()) return Invalid("api keys file", "expected a mapping with 'keys'");
    int keys_seen = 0;
    for (const auto& kv : root) {
      const std::string key = kv.first.IsScalar() ? kv.first.Scalar() : "<not a scalar>";
      if (key != "keys") return Invalid("api keys file", absl::StrCat("unknown key '", key, "'"));
      if (++keys_seen > 1) return Invalid("api keys file", "duplicate key 'keys'");
    }
    const YAML::Node keys = root["keys"];
    if (!keys.IsDefined() || !keys.IsSequence() || keys.size() == 0) {
      return Invalid("keys", "expected a non-empty list of keys");
    }
    std::map<std::string, std::string> names_by_hash;
    std::set<std::string> names;
    for (size_t i = 0; i < keys.size(); ++i) {
      absl::StatusOr<ApiKeyEntry> e = ParseEntry(keys[i], i);
      if (!e.ok()) return e.status();
      if (!names.insert(e->name).second) {
        return Invalid(absl::StrCat("keys[", i, "].name"),
                       absl::StrCat("duplicate name '", e->name, "'"));
      }
      auto [it, inserted] = names_by_hash.emplace(e->sha256_hex, e->name);
      if (!inserted) {
        return Invalid(absl::StrCat("keys[", i, "] (", e->name, ").sha256"),
                       absl::StrCat("the same hash as key '", it->second, "'"));
      }
      entries.push_back(*std::move(e));
    }
  } catch (const YAML::Exception& e) {
    std::string where;
    if (!e.mark.is_null()) {
      where = absl::StrCat(" at line ", e.mark.line + 1, ", column ", e.mark.column + 1);
    }
    return absl::InvalidArgumentError(absl::StrCat("YAML error", where, ": ", e.msg));
  }
  return entries;
}

absl::StatusOr<std::string> ReadApiKeysFile(const std::string& path) {
  std::error_code ec;
  if (std::filesystem::is_directory(path, ec)) {
    return absl::InvalidArgumentError(
        absl::StrCat("API keys file '", path, "' is a directory, not a file"));
  }
  std::ifstream in(path, std::ios::binary);
  if (!in) {
    return absl::NotFoundError(
        absl::StrCat("cannot read API keys file '", path, "': ", std::strerror(errno)));
  }
  std::ostringstream text;
  text << in.rdbuf();
  return text.str();
}

absl::StatusOr<std::vector<ApiKeyEntry>> LoadApiKeys(const std::string& path, std::string* text) {
  absl::StatusOr<std::string> bytes = ReadApiKeysFile(path);
  if (!bytes.ok()) return bytes.status();
  absl::StatusOr<std::vector<ApiKeyEntry>> entries = ParseApiKeys(*bytes);
  if (!entries.ok()) {
    return absl::Status(entries.status().code(),
                        absl::StrCat(path, ": ", entries.status().message()));
  }
  if (text != nullptr) *text = *std::move(bytes);
  return entries;
}

ApiKeys::Clock ApiKeys::MonotonicClock() {
  return [] {
    return absl::FromUnixNanos(std::chrono::duration_cast<std::chrono::nanoseconds>(
                                   std::chrono::steady_clock::now().time_since_epoch())
                                   .count());
  };
}

ApiKeys::Key::Key(const ApiKeyEntry& e, absl::Time now) : entry(e) {
  if (e.tokens_per_minute > 0) bucket.emplace(e.tokens_per_minute, now);
}

void ApiKeys::Key::Update(const ApiKeyEntry& e, absl::Time now) {
  if (e.tokens_per_minute != entry.tokens_per_minute) {
    if (e.tokens_per_minute == 0) {
      bucket.reset();
    } else if (!bucket) {
      bucket.emplace(e.tokens_per_minute, now);  // a new limit starts full
    } else {
      const int64_t level = bucket->Available(now);
      bucket.emplace(e.tokens_per_minute, now);
      // Full now, so taking the difference (<= the capacity) always works.
      if (level < e.tokens_per_minute) (void)bucket->TryTake(e.tokens_per_minute - level, now);
    }
  }
  entry = e;
}

ApiKeys::ApiKeys(const std::vector<ApiKeyEntry>& entries, Clock clock) : clock_(std::move(clock)) {
  Replace(entries);
}

void ApiKeys::Replace(const std::vector<ApiKeyEntry>& entries) {
  const absl::Time now = clock_();
  absl::MutexLock lock(&table_mu_);
  by_hash_.clear();
  current_.clear();
  for (const ApiKeyEntry& e : entries) {
    auto [it, added] = by_name_.emplace(e.name, static_cast<int>(keys_.size()));
    if (added) {
      keys_.push_back(std::make_unique<Key>(e, now));
    } else {
      Key& k = *keys_[it->second];
      absl::MutexLock key_lock(&k.mu);
      k.Update(e, now);
    }
    by_hash_[e.sha256_hex] = it->second;
    current_.push_back(it->second);
  }
}

ApiKeys::Key& ApiKeys::At(int id) const {
  absl::ReaderMutexLock lock(&table_mu_);
  return *keys_[id];
}

int ApiKeys::size() const {
  absl::ReaderMutexLock lock(&table_mu_);
  return static_cast<int>(current_.size());
}

absl::StatusOr<int> ApiKeys::Authenticate(const std::string* value) const {
  constexpr char kMissing[] = "missing API key (authorization: Bearer ...)";
  if (value == nullptr) return absl::UnauthenticatedError(kMissing);
  absl::string_view v = absl::StripAsciiWhitespace(*value);
  constexpr absl::string_view kScheme = "bearer";
  if (v.size() < kScheme.size() || !absl::EqualsIgnoreCase(v.substr(0, kScheme.size()), kScheme)) {
    return absl::UnauthenticatedError("invalid API key");
  }
  v.remove_prefix(kScheme.size());
  if (!v.empty() && !absl::ascii_isspace(static_cast<unsigned char>(v[0]))) {
    return absl::UnauthenticatedError("invalid API key");  // "Bearerxyz"
  }
  const absl::string_view key = absl::StripAsciiWhitespace(v);
  if (key.empty()) return absl::UnauthenticatedError(kMissing);
  const std::string hash = Sha256Hex(key);
  absl::ReaderMutexLock lock(&table_mu_);
  auto it = by_hash_.find(hash);
  if (it == by_hash_.end()) return absl::UnauthenticatedError("invalid API key");
  return it->second;
}

namespace {

// "prompt 10 + max_tokens 100" or "prompt 10 + max_tokens 100 x n 4".
std::string ReservationTerms(const ApiKeys::Reservation& r) {
  std::string terms = absl::StrCat("prompt ", r.prompt_tokens, " + max_tokens ", r.max_tokens);
  if (r.n > 1) absl::StrAppend(&terms, " x n ", r.n);
  return terms;
}

}  // namespace

ApiKeys::Decision ApiKeys::Admit(int id, const Reservation& r) {
  Key& k = At(id);
  const absl::Time now = clock_();
  absl::MutexLock lock(&k.mu);
  const std::string& name = k.entry.name;
  const int64_t tokens = r.tokens();
  Decision d;
  if (k.bucket && tokens > k.bucket->capacity()) {
    ++k.refused;
    d.status = absl::ResourceExhaustedError(
        absl::StrCat("API key '", name, "': this request may use ", tokens, " tokens (",
                     ReservationTerms(r), "), more than its tokens_per_minute of ",
                     k.bucket->capacity(), "; lower max_tokens or n, or shorten the prompt"));
    return d;
  }
  const int64_t token_wait = k.bucket ? k.bucket->MsUntil(tokens, now) : 0;
  const int32_t max = k.entry.max_concurrent_requests;
  if (max > 0 && k.in_flight >= max) {
    while (!k.completions.empty() && now - k.completions.front() > Admission::kRateHorizon) {
      k.completions.pop_front();
    }
    const absl::Duration span =
        k.completions.empty() ? absl::ZeroDuration() : now - k.completions.front();
    ++k.refused;
    d.retry_after_ms = std::max(
        Admission::RetryAfterMs(0, static_cast<int>(k.completions.size()), span), token_wait);
    d.status = absl::ResourceExhaustedError(
        absl::StrCat("API key '", name, "': ", k.in_flight,
                     " requests in flight (max_concurrent_requests ", max, ")"));
    return d;
  }
  if (k.bucket && !k.bucket->TryTake(tokens, now)) {
    ++k.refused;
    d.retry_after_ms = token_wait;
    d.status = absl::ResourceExhaustedError(
        absl::StrCat("API key '", name, "': ", k.bucket->Available(now),
                     " tokens available, this request reserves ", tokens, " (", ReservationTerms(r),
                     "; tokens_per_minute ", k.bucket->capacity(), ")"));
    return d;
  }
  ++k.in_flight;
  return d;
}

void ApiKeys::Refund(int id, const Reservation& r) {
  Key& k = At(id);
  const absl::Time now = clock_();
  absl::MutexLock lock(&k.mu);
  if (k.bucket) k.bucket->Give(r.tokens(), now);
  --k.in_flight;
}

void ApiKeys::Started(int id, int64_t prompt_tokens) {
  Key& k = At(id);
  absl::MutexLock lock(&k.mu);
  ++k.requests;
  k.prompt_tokens += static_cast<uint64_t>(prompt_tokens);
}

void ApiKeys::Generated(int id, int64_t tokens) {
  Key& k = At(id);
  absl::MutexLock lock(&k.mu);
  k.generated_tokens += static_cast<uint64_t>(tokens);
}

void ApiKeys::Ended(int id, const Reservation& r, int64_t generated) {
  Key& k = At(id);
  const absl::Time now = clock_();
  absl::MutexLock lock(&k.mu);
  if (k.bucket && generated < r.generation()) k.bucket->Give(r.generation() - generated, now);
  --k.in_flight;
  k.completions.push_back(now);
  while (k.completions.size() > static_cast<size_t>(Admission::kRateWindow)) {
    k.completions.pop_front();
  }
}

bool ApiKeys::IsAdmin(int id) const {
  absl::ReaderMutexLock table_lock(&table_mu_);
  if (id < 0 || id >= static_cast<int>(keys_.size()) ||
      std::find(current_.begin(), current_.end(), id) == current_.end()) {
    return false;
  }
  absl::MutexLock lock(&keys_[id]->mu);
  return keys_[id]->entry.admin;
}

std::vector<ApiKeys::Usage> ApiKeys::SnapshotFor(int id) const {
  std::string name;
  {
    absl::ReaderMutexLock table_lock(&table_mu_);
    if (id < 0 || id >= static_cast<int>(keys_.size()) ||
        std::find(current_.begin(), current_.end(), id) == current_.end()) {
      return {};
    }
    if (!keys_[id]->entry.admin) name = keys_[id]->entry.name;
  }
  std::vector<Usage> all = Snapshot();
  if (name.empty()) return all;
  std::vector<Usage> own;
  for (Usage& u : all) {
    if (u.name == name) own.push_back(std::move(u));
  }
  return own;
}

std::vector<ApiKeys::Usage> ApiKeys::Snapshot() const {
  const absl::Time now = clock_();
  std::vector<Usage> out;
  absl::ReaderMutexLock table_lock(&table_mu_);
  for (int id : current_) {
    Key& k = *keys_[id];
    absl::MutexLock lock(&k.mu);
    Usage u;
    u.name = k.entry.name;
    u.requests = k.requests;
    u.refused = k.refused;
    u.prompt_tokens = k.prompt_tokens;
    u.generated_tokens = k.generated_tokens;
    u.in_flight = k.in_flight;
    u.tokens_available = k.bucket ? k.bucket->Available(now) : 0;
    u.tokens_per_minute = k.entry.tokens_per_minute;
    u.max_concurrent_requests = k.entry.max_concurrent_requests;
    out.push_back(std::move(u));
  }
  return out;
}

}  // namespace tandem::router
