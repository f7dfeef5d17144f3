#include "worker/worker_main.h"

#include <cstdio>

#include "absl/strings/str_cat.h"
#include "common/server/log.h"
#include "common/server/prologue.h"
#include "common/server/server_util.h"
#include "worker/worker_process.h"
#include "worker/worker_settings.h"

namespace tandem {
namespace {

int Fail(const absl::Status& status) {
  std::fprintf(stderr, "%s\n", std::string(status.message()).c_str());
  return 1;
}

// The workers' --help text (flags as RunWorkerMain reads them).
void PrintWorkerUsage(const std::string& program, const WorkerRoleSpec& spec) {
  const bool decode = spec.role == v1::ROLE_DECODE;
  std::printf(
      "usage: %s --name NAME [flags]\n"
      "Serves one worker of a Tandem cluster, first as a %s worker (it hosts both\n"
      "roles; `tandem role` changes the one it serves), and registers it with the\n"
      "router (docs/operations.md).\n\n"
      "  --config PATH         cluster YAML (default %s)\n"
      "  --name NAME           the name registered with the router and logged (required)\n"
      "  --config-entry ENTRY  the %s entry whose settings to use (default: --name)\n"
      "  --model PATH          GGUF model file (default: the config's model)\n"
      "  --router HOST:PORT    the router to register with (default: router.listen)\n"
      "  --advertise HOST[:PORT]  the gRPC address peers dial (default: the entry's advertise)\n",
      program.c_str(), decode ? "decode" : "prefill", kDefaultConfigPath,
      WorkerListName(spec.role));
  if (program.find("--role") != std::string::npos) {
    std::printf("  --role prefill|decode  the role this worker serves first (required)\n");
  }
  std::printf(
      "  --kv-advertise HOST[:PORT]  the KV address prefill workers dial while this worker "
      "decodes\n");
  std::printf(
      "  --metrics-listen HOST:PORT  the Prometheus /metrics listener (default: the entry's)\n"
      "  --gpu-memory-fraction F    share of the GPU's memory for weights and KV (cuda only)\n"
      "  --help                this text\n"
      "Tests only: --fault-kv-layout-id ID, --fault-backend-error SPEC");
  for (const std::string& f : spec.extra_flags) std::printf(", --%s V", f.c_str());
  std::printf("\n");
}

// Flags and config file into the worker's settings.
[[nodiscard]] absl::StatusOr<WorkerSettings> LoadWorkerSettings(int argc, char** argv,
                                                                const WorkerRoleSpec& spec) {
  std::vector<std::string> allowed = WorkerFlagNames();
  allowed.insert(allowed.end(), spec.extra_flags.begin(), spec.extra_flags.end());
  auto flags = ParseFlags(argc, argv, allowed);
  if (!flags.ok()) return flags.status();
  const std::string config_path = FlagOr(*flags, "config", kDefaultConfigPath);
  auto config = LoadClusterConfig(config_path);
  if (!config.ok()) return config.status();
  return ResolveWorkerSettings(spec.role, *std::move(flags), *std::move(config), config_path);
}

}  // namespace

int RunWorkerMain(int argc, char** argv, const std::vector<WorkerRoleSpec>& roles,
                  v1::WorkerRole start_role, const std::string& program) {
  const WorkerRoleSpec* found = nullptr;
  for (const WorkerRoleSpec& spec : roles) {
    if (spec.role == start_role) found = &spec;
  }
  if (found == nullptr) return Fail(absl::InvalidArgumentError("--role: no such role here"));
  const WorkerRoleSpec& role = *found;
  if (HelpRequested(argc, argv)) {
    PrintWorkerUsage(program, role);
    return 0;
  }
  rpc::BlockTerminationSignals();
  absl::StatusOr<WorkerSettings> settings = LoadWorkerSettings(argc, argv, role);
  if (!settings.ok()) return Fail(settings.status());
  rpc::SetLogComponent(settings->name);
  PrologueOptions options;
  options.num_threads = settings->config.engine.threads;
  options.q8_matmul = settings->config.engine.q8_matmul;
  options.cpu_forward = !settings->config.WorkerDevice(settings->worker).is_cuda();
  options.pin_kernel_isa = true;
  absl::StatusOr<Prologue> prologue = RunPrologue(settings->config, settings->model_flag, options);
  if (!prologue.ok()) return Fail(prologue.status());
  rpc::Log(absl::StrCat("loaded ", prologue->model_path, " (",
                        prologue->bundle->model->config().name, ")"));
  WorkerProcess process(*settings, *prologue);
  return process.Run(roles);
}

}  // namespace tandem
