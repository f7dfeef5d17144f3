#include "worker/worker_settings.h"

#include <utility>

#include "absl/strings/str_cat.h"
#include "common/server/flags.h"
#include "worker/worker_engine.h"

namespace tandem {
namespace {

// The entry `settings->entry_name` of the role's list, copied into
// settings->worker. NOT_FOUND naming the flag that chose it.
[[nodiscard]] absl::Status FindEntry(WorkerSettings* s, bool by_entry) {
  const auto& entries =
      s->role == v1::ROLE_DECODE ? s->config.decode_workers : s->config.prefill_workers;
  for (const WorkerConfig& w : entries) {
    if (w.name == s->entry_name) {
      s->worker = w;
      return absl::OkStatus();
    }
  }
  return absl::NotFoundError(absl::StrCat(by_entry ? "--config-entry " : "--name ", s->entry_name,
                                          ": no such entry in ", WorkerListName(s->role), " of ",
                                          s->config_path));
}

// --router, checked only when given (the config's router.listen was
// checked when the config loaded).
[[nodiscard]] absl::Status ResolveRouter(WorkerSettings* s) {
  auto it = s->flags.find("router");
  if (it == s->flags.end()) {
    s->router = s->config.router.listen.ToString();
    return absl::OkStatus();
  }
  s->router = it->second;
  auto parsed = ParseHostPort(s->router, "--router");
  if (!parsed.ok()) return parsed.status();
  if (parsed->port == 0) {
    return absl::InvalidArgumentError(absl::StrCat(
        "--router: port 0 cannot be dialled; give the router's port (got '", s->router, "')"));
  }
  return absl::OkStatus();
}

// --advertise, --kv-advertise, --metrics-listen and --gpu-memory-fraction
// over the entry's (and engine's) values.
[[nodiscard]] absl::Status ApplyAddressFlags(WorkerSettings* s) {
  for (const auto& [flag, target] :
       {std::pair<const char*, Advertise*>{"advertise", &s->worker.advertise},
        std::pair<const char*, Advertise*>{"kv-advertise", &s->worker.kv_advertise}}) {
    auto it = s->flags.find(flag);
    if (it == s->flags.end()) continue;
    auto parsed = ParseAdvertise(it->second, absl::StrCat("--", flag));
    if (!parsed.ok()) return parsed.status();
    *target = *parsed;
  }
  if (auto it = s->flags.find("metrics-listen"); it != s->flags.end()) {
    auto parsed = ParseHostPort(it->second, "--metrics-listen");
    if (!parsed.ok()) return parsed.status();
    s->worker.metrics_listen = *parsed;
  }
  if (auto it = s->flags.find("gpu-memory-fraction"); it != s->flags.end()) {
    auto fraction = ParseGpuMemoryFractionFlag(it->second, s->config.WorkerDevice(s->worker));
    if (!fraction.ok()) return fraction.status();
    s->config.engine.gpu_memory_fraction = *fraction;
  }
  return absl::OkStatus();
}

// Every address peers dial exists: a wildcard listen has its advertise.
[[nodiscard]] absl::Status CheckAdvertised(const WorkerSettings& s) {
  const WorkerConfig& w = s.worker;
  if (auto a = AdvertisedAddress(w.listen, 0, w.advertise, s.key_prefix + "listen",
                                 s.key_prefix + "advertise");
      !a.ok()) {
    return a.status();
  }
  return AdvertisedAddress(w.kv_listen, 0, w.kv_advertise, s.key_prefix + "kv_listen",
                           s.key_prefix + "kv_advertise")
      .status();
}

}  // namespace

std::vector<std::string> WorkerFlagNames() {
  std::vector<std::string> names = {"config",
                                    "name",
                                    "config-entry",
                                    "model",
                                    "router",
                                    "advertise",
                                    "metrics-listen",
                                    "fault-kv-layout-id",
                                    "gpu-memory-fraction",
                                    "fault-backend-error",
                                    "kv-advertise"};
  return names;
}

const char* WorkerListName(v1::WorkerRole role) {
  return role == v1::ROLE_DECODE ? "decode_workers" : "prefill_workers";
}

absl::StatusOr<WorkerSettings> ResolveWorkerSettings(v1::WorkerRole role,
                                                     std::map<std::string, std::string> flags,
                                                     ClusterConfig config,
                                                     const std::string& config_path) {
  WorkerSettings s;
  s.role = role;
  s.config_path = config_path;
  s.config = std::move(config);
  s.flags = std::move(flags);
  auto name = s.flags.find("name");
  if (name == s.flags.end()) return absl::InvalidArgumentError("--name is required");
  s.name = name->second;
  // The replicas of a Kubernetes Deployment share one entry under pod names.
  const bool by_entry = s.flags.count("config-entry") != 0;
  s.entry_name = by_entry ? s.flags.at("config-entry") : s.name;
  if (absl::Status found = FindEntry(&s, by_entry); !found.ok()) return found;
  if (absl::Status router = ResolveRouter(&s); !router.ok()) return router;
  s.key_prefix = absl::StrCat(WorkerListName(role), "[", s.entry_name, "].");
  if (absl::Status applied = ApplyAddressFlags(&s); !applied.ok()) return applied;
  // The KV endpoint takes the gRPC advertise host unless it has its own.
  if (s.worker.kv_advertise.empty() && !s.worker.advertise.empty()) {
    s.worker.kv_advertise.host = s.worker.advertise.host;
  }
  if (absl::Status checked = CheckAdvertised(s); !checked.ok()) return checked;
  s.model_flag = FlagOr(s.flags, "model", "");
  return s;
}

}  // namespace tandem
