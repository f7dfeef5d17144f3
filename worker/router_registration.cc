#include "worker/router_registration.h"

#include <netdb.h>
#include <sys/socket.h>

#include <algorithm>
#include <set>
#include <utility>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "common/cluster_config.h"
#include "common/server/auth_call.h"
#include "common/server/log.h"
#include "common/server/server_util.h"

namespace tandem {

absl::StatusOr<std::vector<std::string>> ResolveRouterAddresses(const std::string& router) {
  absl::StatusOr<HostPort> parsed = ParseHostPort(router, "router");
  if (!parsed.ok()) return parsed.status();
  addrinfo hints{};
  hints.ai_family = AF_UNSPEC;
  hints.ai_socktype = SOCK_STREAM;
  addrinfo* found = nullptr;
  const int rc = getaddrinfo(parsed->host.c_str(), nullptr, &hints, &found);
  if (rc != 0) return absl::UnavailableError(gai_strerror(rc));
  std::set<std::string> addresses;
  for (const addrinfo* a = found; a != nullptr; a = a->ai_next) {
    char host[NI_MAXHOST];
    if (getnameinfo(a->ai_addr, a->ai_addrlen, host, sizeof(host), nullptr, 0, NI_NUMERICHOST) !=
        0) {
      continue;
    }
    addresses.insert(HostPort{host, parsed->port}.ToString());
  }
  freeaddrinfo(found);
  if (addresses.empty()) return absl::UnavailableError("no address");
  return std::vector<std::string>(addresses.begin(), addresses.end());
}

RouterRegistration::RouterRegistration(RouterRegistrationOptions options)
    : options_([&] {
        if (!options.resolve) options.resolve = ResolveRouterAddresses;
        if (!options.log) options.log = [](const std::string& line) { rpc::Log(line); };
        return std::move(options);
      }()) {}

RouterRegistration::~RouterRegistration() { Stop(); }

void RouterRegistration::Start() {
  resolver_ = std::thread([this] { ResolveLoop(); });
}

void RouterRegistration::Stop() {
  if (!stop_.HasBeenNotified()) stop_.Notify();
  if (resolver_.joinable()) resolver_.join();
  for (auto& [address, peer] : peers_) {
    if (!peer->stop.HasBeenNotified()) peer->stop.Notify();
  }
  for (auto& [address, peer] : peers_) {
    if (peer->thread.joinable()) peer->thread.join();
  }
  peers_.clear();
}

void RouterRegistration::SetRole(v1::WorkerRole role) {
  absl::MutexLock lock(&mu_);
  role_ = role;
}

std::string RouterRegistration::refusal() const {
  absl::MutexLock lock(&mu_);
  return refusal_;
}

int RouterRegistration::registered_routers() const {
  absl::MutexLock lock(&mu_);
  return registered_;
}

void RouterRegistration::SetRegistered(bool now, bool* was) {
  if (now == *was) return;
  *was = now;
  absl::MutexLock lock(&mu_);
  registered_ += now ? 1 : -1;
  const bool crossed = now ? registered_ == 1 : registered_ == 0;
  if (crossed && options_.on_registered_change) options_.on_registered_change(now);
}

std::string RouterRegistration::Label(const std::string& address) const {
  return address == options_.router ? address : absl::StrCat(options_.router, " (", address, ")");
}

void RouterRegistration::ResolveLoop() {
  bool unresolved = false;  // the last answer was an error (logged once)
  do {
    absl::StatusOr<std::vector<std::string>> answer = options_.resolve(options_.router);
    if (!answer.ok()) {
      // Registered peers keep their loops: a DNS hiccup is no reason to
      // stop heartbeating routers that were there a moment ago.
      if (!unresolved) {
        options_.log(absl::StrCat("router ", options_.router,
                                  " does not resolve: ", answer.status().message(), "; retrying"));
      }
      unresolved = true;
      continue;
    }
    unresolved = false;
    const std::set<std::string> now(answer->begin(), answer->end());
    for (auto it = peers_.begin(); it != peers_.end();) {
      if (now.count(it->first) != 0) {
        ++it;
        continue;
      }
      options_.log(absl::StrCat("router ", options_.router, " no longer resolves to ", it->first,
                                "; stopped registering there"));
      it->second->stop.Notify();
      it->second->thread.join();
      it = peers_.erase(it);
    }
    for (const std::string& address : now) {
      if (peers_.count(address) != 0) continue;
      auto peer = std::make_unique<Peer>();
      peer->thread =
          std::thread([this, address, stop = &peer->stop] { RegisterLoop(address, stop); });
      peers_[address] = std::move(peer);
    }
  } while (!stop_.WaitForNotificationWithTimeout(options_.resolve_interval));
}

// Today's single-router loop, per address. A refusal that cannot heal by
// retrying ends this loop and goes to on_refusal; ALREADY_EXISTS (another
// healthy process holds this worker's name) is logged once and retried
// every second: the name frees when the holder dies. Every attempt is
// signed afresh (rpc::SignCall).
void RouterRegistration::RegisterLoop(const std::string& address, absl::Notification* stop) {
  const std::string label = Label(address);
  auto stub = v1::Registry::NewStub(rpc::MakeChannel(address));
  const auth::ClusterAuth* auth = options_.auth;
  bool registered = false;
  bool held_elsewhere = false;  // the last answer was ALREADY_EXISTS
  bool failure_logged = false;  // since the last success
  auto refuse = [&](const std::string& reason) {
    SetRegistered(false, &registered);
    {
      absl::MutexLock lock(&mu_);
      if (!refusal_.empty()) return;
      refusal_ = reason;
    }
    if (options_.on_refusal) options_.on_refusal(reason);
  };
  do {
    v1::RegisterWorkerRequest request;
    {
      absl::MutexLock lock(&mu_);
      request = options_.request;
      request.set_role(role_);
    }
    grpc::ClientContext ctx;
    ctx.set_deadline(rpc::DeadlineFromNow(1000));
    rpc::SignCall(auth, &ctx, rpc::kRegisterWorkerMethod, request);
    v1::RegisterWorkerResponse response;
    grpc::Status s = stub->RegisterWorker(&ctx, request, &response);
    if (s.error_code() == grpc::StatusCode::FAILED_PRECONDITION ||
        s.error_code() == grpc::StatusCode::INVALID_ARGUMENT ||
        s.error_code() == grpc::StatusCode::UNAUTHENTICATED || (s.ok() && !response.accepted())) {
      const std::string reason = s.ok() ? response.reason() : s.error_message();
      options_.log(absl::StrCat("router ", label, " refused registration: ", reason));
      refuse(reason);
      return;
    }
    if (s.ok() && auth != nullptr && !auth->open() && response.cluster_auth() != "hmac-sha256") {
      const std::string reason = absl::StrCat(
          "router ", label,
          " runs an open cluster (no cluster.secret_file) but this worker has one: refusing to "
          "join");
      options_.log(reason);
      refuse(reason);
      return;
    }
    if (s.error_code() == grpc::StatusCode::ALREADY_EXISTS) {
      if (!held_elsewhere) {
        options_.log(absl::StrCat("router ", label, " refused registration: ", s.error_message(),
                                  " (retrying until the name frees)"));
      }
      held_elsewhere = true;
    } else {
      held_elsewhere = false;
    }
    if (s.ok() && !registered) options_.log(absl::StrCat("registered with router ", label));
    if (s.ok()) {
      failure_logged = false;
    } else if (!held_elsewhere && !failure_logged) {
      options_.log(
          absl::StrCat("router ", label, ": cannot register (",
                       absl::StatusCodeToString(static_cast<absl::StatusCode>(s.error_code())),
                       ": ", s.error_message(), "); retrying"));
      failure_logged = true;
    }
    SetRegistered(s.ok(), &registered);
  } while (!stop->WaitForNotificationWithTimeout(
      absl::Milliseconds(registered || held_elsewhere ? 1000 : 200)));
  SetRegistered(false, &registered);  // stopped, or the address left the answer
}

}  // namespace tandem
