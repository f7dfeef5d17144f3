#include "tools/up_cluster.h"

#include <yaml-cpp/yaml.h>

#include <cmath>
#include <map>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "common/cluster_config.h"
#include "engine/backend/gpu_memory_plan.h"

namespace tandem::cli {
namespace {

// "host:port" -> "host:0"; text that does not parse is returned unchanged
// (the caller's ParseClusterConfig names it).
std::string EphemeralListen(const std::string& text) {
  absl::StatusOr<HostPort> hp = ParseHostPort(text, "listen");
  if (!hp.ok()) return text;
  hp->port = 0;
  return hp->ToString();
}

// "host[:port]" -> "host" (bracketed when IPv6): the port then follows the
// one the listener bound. Text that does not parse is returned unchanged.
std::string BareAdvertiseHost(const std::string& text) {
  absl::StatusOr<Advertise> a = ParseAdvertise(text, "advertise");
  if (!a.ok()) return text;
  return a->host.find(':') != std::string::npos ? absl::StrCat("[", a->host, "]") : a->host;
}

// Where a listen key lives in a cluster config.
enum class Section { kRouter, kWorker };

// Every listen address of a cluster config (common/cluster_config.h), with
// the advertise key whose port follows it (nullptr: none). The rewrites
// below (--ephemeral-ports, the extra entries of a resized list) read only
// this table: a new listen key is one row.
struct ListenKey {
  Section section;
  const char* listen;
  const char* advertise;
};
constexpr ListenKey kListenKeys[] = {
    {Section::kRouter, "listen", "advertise"},       {Section::kRouter, "http_listen", nullptr},
    {Section::kRouter, "metrics_listen", nullptr},   {Section::kWorker, "listen", "advertise"},
    {Section::kWorker, "kv_listen", "kv_advertise"}, {Section::kWorker, "metrics_listen", nullptr},
};

// The cluster config text as a YAML map. Errors: INVALID_ARGUMENT "cluster
// config: YAML error: ..." or "cluster config: expected a map".
[[nodiscard]] absl::StatusOr<YAML::Node> LoadConfigMap(const std::string& yaml_text) {
  YAML::Node root;
  try {
    root = YAML::Load(yaml_text);
  } catch (const YAML::Exception& e) {
    return absl::InvalidArgumentError(absl::StrCat("cluster config: YAML error: ", e.msg));
  }
  if (!root.IsMap()) return absl::InvalidArgumentError("cluster config: expected a map");
  return root;
}

// `root` as YAML text (INTERNAL if the emitter fails).
[[nodiscard]] absl::StatusOr<std::string> EmitConfig(const YAML::Node& root) {
  YAML::Emitter out;
  out << root;
  if (!out.good()) return absl::InternalError(absl::StrCat("YAML emitter: ", out.GetLastError()));
  return absl::StrCat(out.c_str(), "\n");
}

// In `node` (the router map, or one worker entry), makes every listen key
// of `section` whose port is not 0 port 0, and its advertise key (when it
// has a port) the bare host. With `every_advertise`, each advertise key of
// the section becomes its bare host even where its listener already had
// port 0 (copies of one entry must not advertise one port). Values that
// do not parse are left for ParseClusterConfig to name.
void MakePortsEphemeral(YAML::Node node, Section section, bool every_advertise) {
  for (const ListenKey& k : kListenKeys) {
    if (k.section != section) continue;
    bool changed = false;
    if (node[k.listen] && node[k.listen].IsScalar()) {
      const std::string text = node[k.listen].as<std::string>();
      const std::string ephemeral = EphemeralListen(text);
      changed = ephemeral != text;
      node[k.listen] = ephemeral;
    }
    if (k.advertise != nullptr && (changed || every_advertise) && node[k.advertise] &&
        node[k.advertise].IsScalar()) {
      node[k.advertise] = BareAdvertiseHost(node[k.advertise].as<std::string>());
    }
  }
}

// A deep copy of `entry` with every port made ephemeral.
YAML::Node EphemeralCopy(const YAML::Node& entry) {
  YAML::Node copy = YAML::Clone(entry);
  MakePortsEphemeral(copy, Section::kWorker, /*every_advertise=*/true);
  return copy;
}

// The template of extra entries of a role with no listed entry: the
// other role's first entry's listen host and advertise host.
YAML::Node EntryFromOtherRole(const YAML::Node& other) {
  YAML::Node entry(YAML::NodeType::Map);
  entry["listen"] = "127.0.0.1:0";
  if (!other.IsSequence() || other.size() == 0 || !other[0].IsMap()) return entry;
  const YAML::Node first = EphemeralCopy(other[0]);
  if (first["listen"]) entry["listen"] = first["listen"];
  if (first["advertise"]) entry["advertise"] = first["advertise"];
  return entry;
}

// The resized list of one role: `count` entries named "<role>-i".
[[nodiscard]] absl::StatusOr<YAML::Node> ResizeList(const YAML::Node& listed,
                                                    const YAML::Node& other,
                                                    const std::string& list_name,
                                                    const std::string& role, int count) {
  if (!listed.IsNull() && !listed.IsSequence()) {
    return absl::InvalidArgumentError(absl::StrCat(list_name, ": expected a list"));
  }
  std::vector<YAML::Node> entries;
  if (listed.IsSequence()) {
    for (size_t i = 0; i < listed.size(); ++i) {
      if (!listed[i].IsMap()) {
        return absl::InvalidArgumentError(absl::StrCat(list_name, "[", i, "]: expected a map"));
      }
      entries.push_back(listed[i]);
    }
  }
  const YAML::Node extra =
      entries.empty() ? EntryFromOtherRole(other) : EphemeralCopy(entries.back());
  YAML::Node out(YAML::NodeType::Sequence);
  for (int i = 0; i < count; ++i) {
    YAML::Node entry = YAML::Clone(static_cast<size_t>(i) < entries.size() ? entries[i] : extra);
    // The name first, as in the files people write.
    YAML::Node named(YAML::NodeType::Map);
    named["name"] = absl::StrCat(role, "-", i);
    for (const auto& kv : entry) {
      const std::string key = kv.first.as<std::string>();
      if (key != "name") named[key] = kv.second;
    }
    out.push_back(named);
  }
  return out;
}

// A deep copy of root[key]; a null node when the key is absent.
YAML::Node CloneKey(const YAML::Node& root, const char* key) {
  const YAML::Node value = root[key];
  return value.IsDefined() ? YAML::Clone(value) : YAML::Node();
}

}  // namespace

absl::StatusOr<std::string> ResizeWorkerLists(const std::string& yaml_text,
                                              std::optional<int> prefill,
                                              std::optional<int> decode) {
  if (prefill && (*prefill < 0 || *prefill > kMaxWorkersPerRole)) {
    return absl::InvalidArgumentError(absl::StrCat("prefill worker count must be in 0..",
                                                   kMaxWorkersPerRole, ", got ", *prefill));
  }
  if (decode && (*decode < 1 || *decode > kMaxWorkersPerRole)) {
    return absl::InvalidArgumentError(
        absl::StrCat("decode worker count must be in 1..", kMaxWorkersPerRole, ", got ", *decode));
  }
  absl::StatusOr<YAML::Node> loaded = LoadConfigMap(yaml_text);
  if (!loaded.ok()) return loaded.status();
  YAML::Node root = *std::move(loaded);
  // Both new lists are computed from the original ones before either is set.
  const YAML::Node prefill_listed = CloneKey(root, "prefill_workers");
  const YAML::Node decode_listed = CloneKey(root, "decode_workers");
  if (prefill) {
    absl::StatusOr<YAML::Node> list =
        ResizeList(prefill_listed, decode_listed, "prefill_workers", "prefill", *prefill);
    if (!list.ok()) return list.status();
    root["prefill_workers"] = *list;
  }
  if (decode) {
    absl::StatusOr<YAML::Node> list =
        ResizeList(decode_listed, prefill_listed, "decode_workers", "decode", *decode);
    if (!list.ok()) return list.status();
    root["decode_workers"] = *list;
  }
  return EmitConfig(root);
}

absl::StatusOr<std::string> EphemeralPorts(const std::string& yaml_text) {
  absl::StatusOr<YAML::Node> loaded = LoadConfigMap(yaml_text);
  if (!loaded.ok()) return loaded.status();
  YAML::Node root = *std::move(loaded);
  if (root["router"].IsNull() || !root["router"].IsDefined()) {
    root["router"] = YAML::Node(YAML::NodeType::Map);
  }
  YAML::Node router = root["router"];
  if (!router.IsMap()) return absl::InvalidArgumentError("router: expected a map");
  // An absent router.listen is its default, 127.0.0.1:50051: written out.
  if (!router["listen"]) router["listen"] = RouterConfig().listen.ToString();
  MakePortsEphemeral(router, Section::kRouter, /*every_advertise=*/false);
  for (const char* list : {"prefill_workers", "decode_workers"}) {
    YAML::Node workers = root[list];
    if (!workers.IsDefined() || workers.IsNull()) continue;
    if (!workers.IsSequence()) {
      return absl::InvalidArgumentError(absl::StrCat(list, ": expected a list"));
    }
    for (size_t i = 0; i < workers.size(); ++i) {
      if (!workers[i].IsMap()) {
        return absl::InvalidArgumentError(absl::StrCat(list, "[", i, "]: expected a map"));
      }
      MakePortsEphemeral(workers[i], Section::kWorker, /*every_advertise=*/false);
    }
  }
  return EmitConfig(root);
}

std::vector<GpuShare> SplitGpuMemory(const ClusterConfig& config) {
  std::map<int32_t, GpuShare> by_index;
  for (const auto* list : {&config.prefill_workers, &config.decode_workers}) {
    for (const WorkerConfig& w : *list) {
      const backend::DeviceSpec device = config.WorkerDevice(w);
      if (!device.is_cuda()) continue;
      GpuShare& share = by_index[device.index];
      share.device = device.ToString();
      share.workers.push_back(w.name);
    }
  }
  std::vector<GpuShare> shared;
  for (auto& [index, share] : by_index) {
    if (share.workers.size() < 2) continue;
    share.fraction = backend::SplitGpuMemoryFraction(config.engine.gpu_memory_fraction,
                                                     static_cast<int32_t>(share.workers.size()));
    shared.push_back(std::move(share));
  }
  return shared;
}

std::string FormatGpuShare(const GpuShare& share, double configured) {
  return absl::StrFormat(
      "GPU %s: %d workers (%s), engine.gpu_memory_fraction %s split as "
      "%s each",
      share.device, share.workers.size(), absl::StrJoin(share.workers, ", "),
      absl::StrCat(configured), GpuShareFlagValue(share.fraction));
}

std::string GpuShareFlagValue(double fraction) {
  if (!(fraction > 0)) return "0";
  // Rounded down to six significant digits: never above the share, never 0
  // for a tiny one. The small epsilon keeps 0.45 (0.44999999999999996 *
  // 1e6 = 449999.99...) from becoming 0.449999.
  const double scale = std::pow(10.0, 5 - std::floor(std::log10(fraction)));
  return absl::StrCat(std::floor(fraction * scale + 1e-6) / scale);
}

}  // namespace tandem::cli
