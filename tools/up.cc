// `tandem up`'s flags, its stdout lines (FormatUpProcess / ParseUpProcess,
// WaitForUpReady), the model it serves; the run itself is UpRun (up_run.h).
#include "tools/up.h"

#include <cstdlib>
#include <iostream>
#include <optional>
#include <utility>

#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "common/cluster_config.h"
#include "tools/cli_args.h"
#include "tools/synth_model.h"
#include "tools/up_cluster.h"
#include "tools/up_nccl.h"
#include "tools/up_run.h"

namespace tandem::cli {
namespace {

// Parses one worker-count flag: nullopt when absent; INVALID_ARGUMENT
// naming it when not an integer in [min, kMaxWorkersPerRole].
[[nodiscard]] absl::StatusOr<std::optional<int>> WorkerCount(const ParsedArgs& parsed,
                                                             const std::string& flag, int min) {
  if (!parsed.Has(flag)) return std::optional<int>();
  absl::StatusOr<int64_t> n = parsed.GetInt(flag, 0);
  if (!n.ok()) return n.status();
  if (*n < min || *n > kMaxWorkersPerRole) {
    return absl::InvalidArgumentError(
        absl::StrCat("--", flag, ": must be in ", min, "..", kMaxWorkersPerRole, ", got ", *n));
  }
  return std::optional<int>(static_cast<int>(*n));
}

}  // namespace

absl::StatusOr<UpOptions> ParseUpArgs(const std::vector<std::string>& args) {
  absl::StatusOr<ParsedArgs> parsed =
      ParseArgs(args, {{"config"},
                       {"model"},
                       {"ready-timeout-s"},
                       {"prefill-workers"},
                       {"decode-workers"},
                       {"ephemeral-ports", /*takes_value=*/false},
                       {kNcclOneGpuTestFlag, /*takes_value=*/false}});
  if (!parsed.ok()) return parsed.status();
  if (!parsed->positional().empty()) {
    return absl::InvalidArgumentError(
        absl::StrCat("unexpected argument '", parsed->positional()[0], "'"));
  }
  UpOptions o;
  o.config = parsed->GetString("config", o.config);
  o.model = parsed->GetString("model", "");
  absl::StatusOr<int64_t> ready = parsed->GetInt("ready-timeout-s", 60);
  if (!ready.ok()) return ready.status();
  if (*ready <= 0) {
    return absl::InvalidArgumentError(absl::StrCat("--ready-timeout-s: must be > 0, got ", *ready));
  }
  o.ready_timeout = absl::Seconds(*ready);
  absl::StatusOr<std::optional<int>> prefill = WorkerCount(*parsed, "prefill-workers", 0);
  if (!prefill.ok()) return prefill.status();
  o.prefill_workers = *prefill;
  absl::StatusOr<std::optional<int>> decode = WorkerCount(*parsed, "decode-workers", 1);
  if (!decode.ok()) return decode.status();
  o.decode_workers = *decode;
  o.nccl_one_gpu_test = parsed->Has(kNcclOneGpuTestFlag);
  o.ephemeral_ports = parsed->Has("ephemeral-ports");
  return o;
}

std::string FormatUpProcess(const UpProcess& p) {
  std::string line = absl::StrCat(kUpProcessPrefix, p.name, " role=", p.role, " pid=", p.pid,
                                  " address=", p.address);
  for (const auto& [key, value] : {std::pair<const char*, const std::string*>{"kv", &p.kv_endpoint},
                                   {"http", &p.http_address},
                                   {"metrics", &p.metrics_address}}) {
    if (!value->empty()) absl::StrAppend(&line, " ", key, "=", *value);
  }
  return line;
}

absl::StatusOr<UpProcess> ParseUpProcess(const std::string& text) {
  auto bad = [&] {
    return absl::InvalidArgumentError(absl::StrCat("not a tandem up process line: '", text, "'"));
  };
  const std::vector<std::string> fields = absl::StrSplit(text, ' ');
  if (fields.size() < 4) return bad();
  UpProcess p;
  p.name = fields[0];
  // The keys in FormatUpProcess's order; role, pid and address always, the
  // others only when set.
  std::string UpProcess::*const kFields[] = {&UpProcess::role,         nullptr,
                                             &UpProcess::address,      &UpProcess::kv_endpoint,
                                             &UpProcess::http_address, &UpProcess::metrics_address};
  static constexpr const char* kKeys[] = {"role", "pid", "address", "kv", "http", "metrics"};
  size_t next = 0;  // the first key the next field may have
  for (size_t i = 1; i < fields.size(); ++i) {
    const std::pair<std::string, std::string> kv =
        absl::StrSplit(fields[i], absl::MaxSplits('=', 1));
    while (next < std::size(kKeys) && kv.first != kKeys[next] && next >= 3) ++next;
    if (next >= std::size(kKeys) || kv.first != kKeys[next] || kv.second.empty()) return bad();
    if (kFields[next] != nullptr) {
      p.*kFields[next] = kv.second;
    } else if (!absl::SimpleAtoi(kv.second, &p.pid)) {
      return bad();
    }
    ++next;
  }
  if (p.name.empty() || p.role.empty() || p.address.empty() || p.pid <= 0) return bad();
  return p;
}

std::string DialAddress(const std::string& listening) {
  absl::StatusOr<HostPort> hp = ParseHostPort(listening, "address");
  if (!hp.ok()) return listening;
  if (hp->host == "0.0.0.0") hp->host = "127.0.0.1";
  if (hp->host == "::") hp->host = "::1";
  return hp->ToString();
}

absl::StatusOr<std::string> ResolveUpModel(const std::string& flag_value,
                                           const ClusterConfig& config, std::string* notice) {
  notice->clear();
  absl::StatusOr<std::string> model = ResolveModelPath(flag_value, config);
  if (model.ok() || !absl::IsNotFound(model.status())) return model;
  const char* env = std::getenv("TANDEM_MODEL");
  const bool explicit_choice =
      !flag_value.empty() || (env != nullptr && *env != '\0') || !config.model.empty();
  if (explicit_choice) return model;
  absl::StatusOr<bool> wrote = EnsureSynthModel(OfflineModelOptions(kOfflineModelPath));
  if (!wrote.ok()) return wrote.status();
  *notice = absl::StrCat(
      "tandem: no model found; serving a small synthetic model with random weights "
      "(its text is random): ",
      kOfflineModelPath);
  return std::string(kOfflineModelPath);
}

const UpProcess* UpReady::Find(const std::string& name) const {
  for (const UpProcess& p : processes) {
    if (p.name == name) return &p;
  }
  return nullptr;
}

absl::StatusOr<UpReady> WaitForUpReady(ProcessGroup& group, int index, absl::Duration timeout) {
  // Every kind of line (process, HTTP, ready) starts with "tandem: ";
  // nothing else of tandem up goes to its stdout.
  constexpr absl::string_view kLine = "tandem: ";
  const absl::string_view process = absl::string_view(kUpProcessPrefix).substr(kLine.size());
  const absl::string_view ready = absl::string_view(kUpReadyPrefix).substr(kLine.size());
  const absl::string_view http = absl::string_view(kUpHttpPrefix).substr(kLine.size());
  const absl::Time deadline = absl::Now() + timeout;
  UpReady out;
  for (;;) {
    absl::StatusOr<std::string> line = group.WaitForLine(index, kLine, deadline - absl::Now());
    if (!line.ok()) return line.status();
    if (absl::StartsWith(*line, ready)) {
      out.router_address = line->substr(ready.size());
      return out;
    }
    if (absl::StartsWith(*line, http)) {
      const std::string rest = line->substr(http.size());
      out.http_address = rest.substr(0, rest.find(' '));
      continue;
    }
    if (!absl::StartsWith(*line, process)) {
      return absl::InvalidArgumentError(absl::StrCat("unexpected line from tandem up: ", *line));
    }
    absl::StatusOr<UpProcess> p = ParseUpProcess(line->substr(process.size()));
    if (!p.ok()) return p.status();
    out.processes.push_back(*std::move(p));
  }
}

int RunUp(const std::vector<std::string>& args) {
  absl::StatusOr<UpOptions> options = ParseUpArgs(args);
  if (!options.ok()) {
    std::cerr << "tandem up: " << options.status().message() << kUpUsageHint << "\n";
    return 2;
  }
  return UpRun(*std::move(options)).Run();
}

}  // namespace tandem::cli
