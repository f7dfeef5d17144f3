// Live reload of router.api_keys_file: Kubernetes updates a mounted Secret
// by swapping a symlink, so the file's bytes change under a running router.
//
// Every kApiKeysReloadInterval the file is read again (symlinks followed):
// - the same bytes as the table in use: nothing happens;
// - other bytes that parse (ParseApiKeys): ApiKeys::Replace swaps them in
//   (kept names keep their state; removed names stop authenticating, their
//   running requests finish) and one line is logged:
//     "api keys: reloaded PATH (N keys)"
// - other bytes that do not parse, or a file that cannot be read: the
//   table in use stays, and one line is logged per distinct bad content
//   (or distinct read error), not on every check:
//     "api keys: PATH: <error>; keeping the N keys loaded before"
// A reload cannot turn keys off: an empty `keys` list does not parse.
//
// Owns: the bytes of the table in use, what was last reported bad, the
// checking thread. Does not touch: gRPC, the keys' state (ApiKeys).
// Threads: Start runs Check on its own thread every interval until the
// destructor stops and joins it; Check is also callable directly (tests)
// and serialised by mu_.
#ifndef TANDEM_ROUTER_API_KEYS_RELOADER_H_
#define TANDEM_ROUTER_API_KEYS_RELOADER_H_

#include <functional>
#include <string>
#include <thread>

#include "absl/base/thread_annotations.h"
#include "absl/strings/string_view.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "router/api_keys.h"

namespace tandem::router {

// How often a running router re-reads router.api_keys_file (Kubernetes
// itself propagates a changed Secret to the pod within about a minute).
inline constexpr absl::Duration kApiKeysReloadInterval = absl::Seconds(5);

class ApiKeysReloader {
 public:
  using LogFn = std::function<void(absl::string_view line)>;

  // Watches `path` for `keys`, which were built from `loaded_text` (the
  // bytes LoadApiKeys read at start). `keys` must outlive this object.
  // `log` gets each line above (the router passes rpc::Log).
  ApiKeysReloader(ApiKeys* keys, std::string path, std::string loaded_text, LogFn log);
  ApiKeysReloader(const ApiKeysReloader&) = delete;
  ApiKeysReloader& operator=(const ApiKeysReloader&) = delete;
  ~ApiKeysReloader();  // stops and joins the thread Start began, if any

  // Starts the thread that calls Check every `interval` (> 0). Once.
  void Start(absl::Duration interval = kApiKeysReloadInterval);

  // One check of the file, as described at the top.
  void Check();

 private:
  // Logs "api keys: PATH: <error>; keeping ..." unless `fingerprint` (the
  // bad bytes' SHA-256, or the read error) was the last one reported.
  void ReportBad(const std::string& fingerprint, absl::string_view error)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);

  // Const after construction.
  ApiKeys* const keys_;
  const std::string path_;
  const LogFn log_;

  absl::Mutex mu_;
  std::string loaded_text_ ABSL_GUARDED_BY(mu_);   // bytes of the table in use
  std::string reported_bad_ ABSL_GUARDED_BY(mu_);  // "" after a good check

  absl::Mutex stop_mu_;
  bool stop_ ABSL_GUARDED_BY(stop_mu_) = false;
  std::thread thread_;  // joinable once started
};

}  // namespace tandem::router

#endif  // TANDEM_ROUTER_API_KEYS_RELOADER_H_
