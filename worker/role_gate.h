// Which role a worker serves now (issue #35): both roles' services run on
// one engine core, and the gate says which of them takes new requests.
// A request already running, of either role, is never stopped by it.
//
// Owns: the worker's current role. Threads: every method is thread-safe
// (gRPC threads read it, WorkerAdmin.SetRole writes it).
#ifndef TANDEM_WORKER_ROLE_GATE_H_
#define TANDEM_WORKER_ROLE_GATE_H_

#include <atomic>
#include <string>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "tandem/v1/common.pb.h"

namespace tandem {

// "prefill" or "decode" ("unspecified" otherwise).
inline const char* WorkerRoleName(v1::WorkerRole role) {
  return role == v1::ROLE_PREFILL ? "prefill" : role == v1::ROLE_DECODE ? "decode" : "unspecified";
}

class RoleGate {
 public:
  explicit RoleGate(v1::WorkerRole role) : role_(role) {}
  RoleGate(const RoleGate&) = delete;
  RoleGate& operator=(const RoleGate&) = delete;

  v1::WorkerRole role() const { return role_.load(); }
  // Returns the previous role.
  v1::WorkerRole set_role(v1::WorkerRole role) { return role_.exchange(role); }

  // OK when a new request of `role` may start here; else UNAVAILABLE
  // "this worker serves the decode role now" (the router routes it
  // elsewhere: a decode stream that never answered is re-routed, a failed
  // prefill fails over).
  absl::Status Admit(v1::WorkerRole role) const {
    const v1::WorkerRole now = role_.load();
    if (now == role) return absl::OkStatus();
    return absl::UnavailableError(absl::StrCat("this worker serves the ", WorkerRoleName(now),
                                               " role now, not ", WorkerRoleName(role)));
  }

 private:
  std::atomic<v1::WorkerRole> role_;
};

}  // namespace tandem

#endif  // TANDEM_WORKER_ROLE_GATE_H_
