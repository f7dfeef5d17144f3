#include "router/api_keys_reloader.h"

#include <utility>

#include "absl/strings/str_cat.h"

namespace tandem::router {

ApiKeysReloader::ApiKeysReloader(ApiKeys* keys, std::string path, std::string loaded_text,
                                 LogFn log)
    : keys_(keys),
      path_(std::move(path)),
      log_(std::move(log)),
      loaded_text_(std::move(loaded_text)) {}

ApiKeysReloader::~ApiKeysReloader() {
  {
    absl::MutexLock lock(&stop_mu_);
    stop_ = true;
  }
  if (thread_.joinable()) thread_.join();
}

void ApiKeysReloader::Start(absl::Duration interval) {
  thread_ = std::thread([this, interval] {
    for (;;) {
      {
        absl::MutexLock lock(&stop_mu_);
        stop_mu_.AwaitWithTimeout(absl::Condition(&stop_), interval);
        if (stop_) return;
      }
      Check();
    }
  });
}

void ApiKeysReloader::Check() {
  absl::MutexLock lock(&mu_);
  absl::StatusOr<std::string> text = ReadApiKeysFile(path_);
  if (!text.ok()) {
    ReportBad(std::string(text.status().message()), text.status().message());
    return;
  }
  if (*text == loaded_text_) {
    reported_bad_.clear();  // back to the table in use: a later bad file is news again
    return;
  }
  absl::StatusOr<std::vector<ApiKeyEntry>> entries = ParseApiKeys(*text);
  if (!entries.ok()) {
    ReportBad(Sha256Hex(*text), entries.status().message());
    return;
  }
  keys_->Replace(*entries);
  loaded_text_ = *std::move(text);
  reported_bad_.clear();
  log_(absl::StrCat("api keys: reloaded ", path_, " (", entries->size(), " keys)"));
}

void ApiKeysReloader::ReportBad(const std::string& fingerprint, absl::string_view error) {
  if (fingerprint == reported_bad_) return;
  reported_bad_ = fingerprint;
  log_(absl::StrCat("api keys: ", path_, ": ", error, "; keeping the ", keys_->size(),
                    " keys loaded before"));
}

}  // namespace tandem::router
