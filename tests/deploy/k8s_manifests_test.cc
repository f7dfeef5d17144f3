// The Kubernetes manifests (deploy/k8s) against the code they deploy.
//
// Each overlay is rendered with `kubectl kustomize` (the test skips, saying
// so, where kubectl is absent; `kubectl apply --dry-run` would need an API
// server). The rendered objects are parsed and checked: apiVersion, kind
// and the fields each kind needs; the cluster YAML in the ConfigMap loads
// with the real config parser; ports, probe services, Secret mounts,
// metrics annotations and the grace period agree with that config and the
// code's defaults; and every container's command line, run with the
// rendered config, passes every start-up check of the real binary up to
// the first file only the pod has (its cluster secret). The model-download
// component (deploy/k8s/components/model-download) is rendered on the gpu
// overlay as docs/operations.md says to use it: /models an emptyDir that
// fetch-model fills where TANDEM_MODEL points, and its script is run here
// (a file:// URL; the checksum checked; a finished file kept). The
// autoscaling overlay's KEDA ScaledObjects scale the worker Deployments to
// the series the router's planner exports (checked against the planner
// itself), with the planner in export-only mode.
#include <sys/stat.h>

#include <filesystem>
#include <fstream>
#include <iterator>
#include <map>
#include <set>
#include <string>
#include <vector>

#include <prometheus/registry.h>

#include "absl/strings/escaping.h"
#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_replace.h"
#include "absl/strings/str_split.h"
#include "auth/cluster_auth.h"
#include "common/cluster_config.h"
#include "common/server/server_util.h"  // rpc::kLivenessHealthService
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "router/api_keys.h"
#include "router/planner.h"
#include "tests/process_util.h"
#include "tests/test_util.h"
#include "yaml-cpp/yaml.h"

namespace tandem::testing {
namespace {

using ::testing::HasSubstr;
using ::testing::Not;

const std::string kSource = TANDEM_SOURCE_DIR;
const std::string kBinaries = TANDEM_BINARY_DIR;
// What a process may still take after SIGTERM beyond its drain
// (shutdown_grace_s), seconds: a worker flushes its ended streams (up to
// 1 s) and shuts its gRPC server down (1 s deadline,
// worker/worker_main.cc); the router shuts its server down (1 s)
// and waits for its request threads (2 s, router/main.cc).
constexpr int kServerShutdownS = 3;

// kubectl on PATH, or "".
std::string FindKubectl() {
  const char* path = std::getenv("PATH");
  if (path == nullptr) return "";
  for (absl::string_view dir : absl::StrSplit(path, ':')) {
    const std::string candidate = absl::StrCat(dir, "/kubectl");
    if (access(candidate.c_str(), X_OK) == 0) return candidate;
  }
  return "";
}

// The objects of one rendered overlay, by kind and name (generated names
// keep their prefix: "tandem-config-<hash>").
struct Rendered {
  std::vector<YAML::Node> objects;

  // The one object of `kind` whose name is `name` or starts with
  // "<name>-" followed by kustomize's hash; a null node if none.
  // Returned const: yaml-cpp's non-const operator[] would add missing keys.
  const YAML::Node Get(const std::string& kind, const std::string& name) const {
    for (const YAML::Node& o : objects) {
      if (o["kind"].as<std::string>() != kind) continue;
      const std::string n = o["metadata"]["name"].as<std::string>();
      if (n == name || (absl::StartsWith(n, name + "-") &&
                        n.size() == name.size() + 11)) {  // "-" + 10-char hash
        return o;
      }
    }
    return YAML::Node(YAML::NodeType::Undefined);
  }
};

// Renders deploy/k8s/overlays/<overlay> (GTEST_SKIP without kubectl).
#define RENDER_OR_SKIP(var, overlay)                                              \
  const std::string kubectl_##var = FindKubectl();                                \
  if (kubectl_##var.empty()) GTEST_SKIP() << "kubectl not found on PATH: cannot " \
                                             "render deploy/k8s (not checked)";   \
  Rendered var;                                                                   \
  ASSERT_NO_FATAL_FAILURE(Render(kubectl_##var, overlay, &var))

// Renders the kustomization in `dir`.
void RenderDir(const std::string& kubectl, const std::string& dir, Rendered* out) {
  ProcessResult r = RunProcess({kubectl, "kustomize", dir}, absl::Seconds(60));
  ASSERT_TRUE(r.exited && r.exit_code == 0) << "kubectl kustomize " << dir << ": "
                                            << r.Describe();
  out->objects = YAML::LoadAll(r.out);
  ASSERT_FALSE(out->objects.empty());
}

void Render(const std::string& kubectl, const std::string& overlay, Rendered* out) {
  RenderDir(kubectl, absl::StrCat(kSource, "/deploy/k8s/overlays/", overlay), out);
}

std::string Str(const YAML::Node& n) { return n.IsDefined() && !n.IsNull() ? n.as<std::string>() : ""; }

// The container of a one-container Deployment.
const YAML::Node Container(const YAML::Node& deployment) {
  return deployment["spec"]["template"]["spec"]["containers"][0];
}

// The container's port named `name` (0 if none).
int ContainerPort(const YAML::Node& container, const std::string& name) {
  for (const YAML::Node& p : container["ports"]) {
    if (Str(p["name"]) == name) return p["containerPort"].as<int>();
  }
  return 0;
}

// The value following `flag` in the container's args ("" if absent).
std::string Arg(const YAML::Node& container, const std::string& flag) {
  const YAML::Node args = container["args"];
  for (size_t i = 0; i + 1 < args.size(); ++i) {
    if (args[i].as<std::string>() == flag) return args[i + 1].as<std::string>();
  }
  return "";
}

// The fieldRef path of env var `name` ("" if it has none).
std::string EnvFieldRef(const YAML::Node& container, const std::string& name) {
  for (const YAML::Node& e : container["env"]) {
    if (Str(e["name"]) == name) return Str(e["valueFrom"]["fieldRef"]["fieldPath"]);
  }
  return "";
}

std::string EnvValue(const YAML::Node& container, const std::string& name) {
  for (const YAML::Node& e : container["env"]) {
    if (Str(e["name"]) == name) return Str(e["value"]);
  }
  return "";
}

// The pod volume named `name` (undefined if none).
const YAML::Node Volume(const YAML::Node& deployment, const std::string& name) {
  for (const YAML::Node& v : deployment["spec"]["template"]["spec"]["volumes"]) {
    if (Str(v["name"]) == name) return v;
  }
  return YAML::Node(YAML::NodeType::Undefined);
}

// The volume mounted at `path` (exactly, or as the directory of `path`),
// with the file's key inside it: {volume name, key or subPath}.
std::pair<std::string, std::string> MountOf(const YAML::Node& container, const std::string& path) {
  for (const YAML::Node& m : container["volumeMounts"]) {
    const std::string at = Str(m["mountPath"]);
    if (at == path) return {Str(m["name"]), Str(m["subPath"])};
    if (absl::StartsWith(path, at + "/")) return {Str(m["name"]), path.substr(at.size() + 1)};
  }
  return {"", ""};
}

// The container's mount of volume `name` (undefined if none).
const YAML::Node MountNamed(const YAML::Node& container, const std::string& name) {
  for (const YAML::Node& m : container["volumeMounts"]) {
    if (Str(m["name"]) == name) return m;
  }
  return YAML::Node(YAML::NodeType::Undefined);
}

// The cluster config of the rendered ConfigMap tandem-config, loaded by
// the real parser (written to a temporary file first).
ClusterConfig LoadRenderedConfig(const Rendered& r, std::string* text) {
  const YAML::Node cm = r.Get("ConfigMap", "tandem-config");
  EXPECT_TRUE(cm.IsDefined()) << "no ConfigMap tandem-config";
  if (!cm.IsDefined()) return ClusterConfig{};
  *text = Str(cm["data"]["cluster.yaml"]);
  const std::string path = absl::StrCat(::testing::TempDir(), "/k8s-cluster-", getpid(), ".yaml");
  std::ofstream(path) << *text;
  absl::StatusOr<ClusterConfig> config = LoadClusterConfig(path);
  std::filesystem::remove(path);
  EXPECT_TRUE(config.ok()) << "ConfigMap tandem-config cluster.yaml: " << config.status();
  return config.ok() ? *config : ClusterConfig{};
}

const WorkerConfig* Entry(const std::vector<WorkerConfig>& entries, const std::string& name) {
  for (const WorkerConfig& w : entries) {
    if (w.name == name) return &w;
  }
  return nullptr;
}

// Every object: a known apiVersion/kind pair and a name; Deployments'
// selectors select their own pod template.
void CheckObjectShapes(const Rendered& r) {
  const std::set<std::pair<std::string, std::string>> known = {
      {"apps/v1", "Deployment"}, {"v1", "Service"}, {"v1", "ConfigMap"},
      {"v1", "Secret"}, {"policy/v1", "PodDisruptionBudget"},
      {"v1", "PersistentVolumeClaim"}, {"keda.sh/v1alpha1", "ScaledObject"}};
  for (const YAML::Node& o : r.objects) {
    const std::string kind = Str(o["kind"]);
    SCOPED_TRACE(absl::StrCat(kind, " ", Str(o["metadata"]["name"])));
    EXPECT_TRUE(known.count({Str(o["apiVersion"]), kind})) << "apiVersion " << Str(o["apiVersion"]);
    EXPECT_FALSE(Str(o["metadata"]["name"]).empty());
    if (kind == "Deployment") {
      const YAML::Node labels = o["spec"]["template"]["metadata"]["labels"];
      ASSERT_TRUE(o["spec"]["selector"]["matchLabels"].IsMap());
      for (const auto& kv : o["spec"]["selector"]["matchLabels"]) {
        EXPECT_EQ(Str(labels[kv.first.as<std::string>()]), kv.second.as<std::string>());
      }
      EXPECT_EQ(o["spec"]["template"]["spec"]["containers"].size(), 1u);
      EXPECT_FALSE(Str(Container(o)["image"]).empty());
    }
    if (kind == "Service") {
      EXPECT_TRUE(o["spec"]["ports"].IsSequence());
    }
    if (kind == "ScaledObject") {
      EXPECT_FALSE(Str(o["spec"]["scaleTargetRef"]["name"]).empty());
    }
    if (kind == "Secret" || kind == "ConfigMap") {
      EXPECT_TRUE(o["data"].IsMap());
    }
  }
}

// The command line of `deployment`'s container, with the rendered cluster
// YAML, passes every check of the real binary up to the first file only
// the pod has: flags, config keys, this entry, listen/advertise (a wildcard
// listener needs --advertise), ... The process gets the downward-API
// values filled in and the ConfigMap's cluster.yaml at a temporary path;
// it must then fail reading the cluster secret (mounted from a Secret in
// the pod, absent here), which every process loads before its model.
void CheckStartsUpToThePodsFiles(const YAML::Node& deployment, const std::string& config_text,
                                 const ClusterConfig& config) {
  const YAML::Node c = Container(deployment);
  ASSERT_EQ(c["command"].size(), 1u);
  ASSERT_FALSE(config.cluster.secret_file.empty());
  ASSERT_FALSE(std::filesystem::exists(config.cluster.secret_file))
      << "this test needs " << config.cluster.secret_file << " to be absent";
  const std::string config_path =
      absl::StrCat(::testing::TempDir(), "/k8s-run-", getpid(), "-cluster.yaml");
  std::ofstream(config_path) << config_text;
  std::vector<std::string> argv = {absl::StrCat(kBinaries, "/", c["command"][0].as<std::string>())};
  bool config_next = false;
  for (const YAML::Node& a : c["args"]) {
    std::string arg = a.as<std::string>();
    if (config_next) arg = config_path;
    config_next = arg == "--config";
    arg = absl::StrReplaceAll(arg, {{"$(POD_NAME)", "tandem-pod-0"}, {"$(POD_IP)", "10.1.2.3"}});
    argv.push_back(arg);
  }
  ProcessResult r = RunProcess(argv, absl::Seconds(20));
  std::filesystem::remove(config_path);
  const std::string line = absl::StrJoin(argv, " ");
  EXPECT_TRUE(r.exited && r.exit_code == 1) << line << ": " << r.Describe();
  EXPECT_THAT(r.err, HasSubstr("cluster.secret_file")) << line;
  EXPECT_THAT(r.err, HasSubstr(config.cluster.secret_file)) << line;
}

// The probes of a gRPC server on `port`: readiness on "" (can serve),
// liveness and startup on the liveness service; all on the container's
// port named grpc.
void CheckProbes(const YAML::Node& c, int port) {
  EXPECT_EQ(ContainerPort(c, "grpc"), port);
  EXPECT_EQ(c["readinessProbe"]["grpc"]["port"].as<int>(), port);
  EXPECT_EQ(Str(c["readinessProbe"]["grpc"]["service"]), "");
  for (const char* probe : {"livenessProbe", "startupProbe"}) {
    SCOPED_TRACE(probe);
    EXPECT_EQ(c[probe]["grpc"]["port"].as<int>(), port);
    EXPECT_EQ(Str(c[probe]["grpc"]["service"]), rpc::kLivenessHealthService);
  }
  // The startupProbe allows a long model load before liveness starts.
  EXPECT_GE(c["startupProbe"]["periodSeconds"].as<int>() *
                c["startupProbe"]["failureThreshold"].as<int>(),
            300);
}

// SIGTERM handling: the grace period covers preStop, the drain
// (shutdown_grace_s) and the server's shutdown.
void CheckGrace(const YAML::Node& deployment, const ClusterConfig& config) {
  const YAML::Node spec = deployment["spec"]["template"]["spec"];
  int pre_stop = 0;
  const YAML::Node cmd = Container(deployment)["lifecycle"]["preStop"]["exec"]["command"];
  if (cmd.IsDefined()) {
    ASSERT_EQ(cmd.size(), 2u);
    EXPECT_EQ(cmd[0].as<std::string>(), "sleep");
    ASSERT_TRUE(absl::SimpleAtoi(cmd[1].as<std::string>(), &pre_stop));
  }
  EXPECT_GT(spec["terminationGracePeriodSeconds"].as<int>(),
            pre_stop + config.shutdown_grace_s + kServerShutdownS);
}

void CheckMetricsAnnotations(const YAML::Node& deployment, int port) {
  const YAML::Node a = deployment["spec"]["template"]["metadata"]["annotations"];
  EXPECT_EQ(Str(a["prometheus.io/scrape"]), "true");
  EXPECT_EQ(Str(a["prometheus.io/port"]), absl::StrCat(port));
  EXPECT_EQ(Str(a["prometheus.io/path"]), "/metrics");
}

// `file` (a path in the config) is mounted from a Secret volume whose
// Secret is `secret` (rendered with that key, or created by the operator).
void CheckSecretFile(const Rendered& r, const YAML::Node& deployment, const std::string& file,
                     const std::string& secret) {
  SCOPED_TRACE(file);
  const auto [volume, key] = MountOf(Container(deployment), file);
  ASSERT_FALSE(volume.empty()) << "nothing mounted at " << file;
  const YAML::Node v = Volume(deployment, volume);
  const std::string name = Str(v["secret"]["secretName"]);
  const YAML::Node rendered = r.Get("Secret", secret);
  if (rendered.IsDefined()) {
    EXPECT_EQ(name, Str(rendered["metadata"]["name"]));
    EXPECT_TRUE(rendered["data"][key].IsDefined()) << "Secret " << name << " has no key " << key;
  } else {
    EXPECT_EQ(name, secret);  // the operator creates it under this name
  }
}

// The parts every overlay shares: the router, both worker Deployments,
// the Services, the PDBs, the config and the Secrets.
void CheckCommon(const Rendered& r, ClusterConfig* out_config) {
  CheckObjectShapes(r);
  std::string text;
  const ClusterConfig config = LoadRenderedConfig(r, &text);
  *out_config = config;
  const YAML::Node cm = r.Get("ConfigMap", "tandem-config");
  const YAML::Node env = r.Get("ConfigMap", "tandem-env");
  ASSERT_TRUE(env.IsDefined()) << "no ConfigMap tandem-env";
  EXPECT_TRUE(absl::StartsWith(Str(env["data"]["TANDEM_MODEL"]), "/models/"));

  const YAML::Node router = r.Get("Deployment", "tandem-router");
  ASSERT_TRUE(router.IsDefined());
  const YAML::Node rc = Container(router);
  EXPECT_EQ(Str(rc["command"][0]), "tandem-router");
  CheckProbes(rc, config.router.listen.port);
  ASSERT_TRUE(config.router.http_listen.has_value());
  EXPECT_EQ(ContainerPort(rc, "http"), config.router.http_listen->port);
  // Prometheus scrapes the metrics port: the client port's /metrics needs
  // an API key (router.api_keys_file is set, below).
  ASSERT_TRUE(config.router.metrics_listen.has_value());
  EXPECT_EQ(ContainerPort(rc, "metrics"), config.router.metrics_listen->port);
  CheckMetricsAnnotations(router, config.router.metrics_listen->port);
  CheckGrace(router, config);
  CheckStartsUpToThePodsFiles(router, text, config);
  EXPECT_EQ(EnvFieldRef(rc, "POD_NAME"), "metadata.name");
  EXPECT_EQ(Arg(rc, "--advertise"), "$(POD_IP)");
  EXPECT_EQ(EnvFieldRef(rc, "POD_IP"), "status.podIP");

  // The client Service: gRPC and HTTP on the config's ports, to routers.
  const YAML::Node svc = r.Get("Service", "tandem-router");
  ASSERT_TRUE(svc.IsDefined());
  std::map<std::string, int> svc_ports;
  for (const YAML::Node& p : svc["spec"]["ports"]) {
    svc_ports[Str(p["name"])] = p["port"].as<int>();
    EXPECT_GT(ContainerPort(rc, Str(p["targetPort"])), 0) << "targetPort " << Str(p["targetPort"]);
  }
  EXPECT_EQ(svc_ports["grpc"], config.router.listen.port);
  EXPECT_EQ(svc_ports["http"], config.router.http_listen->port);
  EXPECT_EQ(svc_ports.count("metrics"), 0u) << "the metrics port is for Prometheus, not clients";
  const YAML::Node router_labels = router["spec"]["selector"]["matchLabels"];
  for (const YAML::Node& s : {svc, r.Get("Service", "tandem-router-peers")}) {
    ASSERT_TRUE(s.IsDefined());
    for (const auto& kv : router_labels) {
      EXPECT_EQ(Str(s["spec"]["selector"][kv.first.as<std::string>()]),
                kv.second.as<std::string>());
    }
  }
  // Workers resolve every router pod, ready or not, through the headless
  // Service.
  const YAML::Node peers = r.Get("Service", "tandem-router-peers");
  EXPECT_EQ(Str(peers["spec"]["clusterIP"]), "None");
  EXPECT_TRUE(peers["spec"]["publishNotReadyAddresses"].as<bool>());
  EXPECT_EQ(peers["spec"]["ports"][0]["port"].as<int>(), config.router.listen.port);

  for (const std::string role : {"prefill", "decode"}) {
    SCOPED_TRACE(role);
    const bool decode = role == "decode";
    const YAML::Node d = r.Get("Deployment", "tandem-" + role);
    ASSERT_TRUE(d.IsDefined());
    const YAML::Node c = Container(d);
    EXPECT_EQ(Str(c["command"][0]), "tandem-worker");
    EXPECT_EQ(Arg(c, "--role"), role);
    const std::string entry_name = Arg(c, "--config-entry");
    const WorkerConfig* entry =
        Entry(decode ? config.decode_workers : config.prefill_workers, entry_name);
    ASSERT_NE(entry, nullptr) << "--config-entry " << entry_name << " is not in the config";
    CheckProbes(c, entry->listen.port);
    EXPECT_EQ(entry->listen.host, "0.0.0.0");
    // Every worker has a KV receiver (a prefill worker may turn decode:
    // `tandem role`), reachable at the pod IP.
    EXPECT_EQ(ContainerPort(c, "kv"), entry->kv_listen.port);
    EXPECT_EQ(entry->kv_listen.host, "0.0.0.0");
    ASSERT_TRUE(entry->metrics_listen.has_value());
    EXPECT_EQ(ContainerPort(c, "metrics"), entry->metrics_listen->port);
    CheckMetricsAnnotations(d, entry->metrics_listen->port);
    CheckGrace(d, config);
    CheckStartsUpToThePodsFiles(d, text, config);
    // Name, advertised address and router from the downward API and the
    // headless Service.
    EXPECT_EQ(Arg(c, "--name"), "$(POD_NAME)");
    EXPECT_EQ(EnvFieldRef(c, "POD_NAME"), "metadata.name");
    EXPECT_EQ(Arg(c, "--advertise"), "$(POD_IP)");
    EXPECT_EQ(EnvFieldRef(c, "POD_IP"), "status.podIP");
    EXPECT_EQ(Arg(c, "--router"),
              absl::StrCat(Str(peers["metadata"]["name"]), ":", config.router.listen.port));
    EXPECT_EQ(Arg(c, "--config"), "/etc/tandem/cluster.yaml");
    // One PDB per role, selecting exactly the Deployment's pods.
    const YAML::Node pdb = r.Get("PodDisruptionBudget", "tandem-" + role);
    ASSERT_TRUE(pdb.IsDefined());
    EXPECT_EQ(YAML::Dump(pdb["spec"]["selector"]["matchLabels"]),
              YAML::Dump(d["spec"]["selector"]["matchLabels"]));
    if (!config.cluster.secret_file.empty()) {
      CheckSecretFile(r, d, config.cluster.secret_file, "tandem-cluster-secret");
    }
  }
  const YAML::Node pdb = r.Get("PodDisruptionBudget", "tandem-router");
  ASSERT_TRUE(pdb.IsDefined());
  EXPECT_EQ(YAML::Dump(pdb["spec"]["selector"]["matchLabels"]), YAML::Dump(router_labels));

  // Config, Secrets and the model as every Deployment mounts them.
  for (const char* name : {"tandem-router", "tandem-prefill", "tandem-decode"}) {
    SCOPED_TRACE(name);
    const YAML::Node d = r.Get("Deployment", name);
    const YAML::Node c = Container(d);
    const auto [volume, key] = MountOf(c, "/etc/tandem/cluster.yaml");
    EXPECT_EQ(key, "cluster.yaml");
    EXPECT_EQ(Str(Volume(d, volume)["configMap"]["name"]), Str(cm["metadata"]["name"]));
    EXPECT_EQ(Str(c["envFrom"][0]["configMapRef"]["name"]), Str(env["metadata"]["name"]));
    EXPECT_FALSE(MountOf(c, Str(env["data"]["TANDEM_MODEL"])).first.empty())
        << "the model path is not on a mounted volume";
    const YAML::Node security = d["spec"]["template"]["spec"]["securityContext"];
    EXPECT_TRUE(security["runAsNonRoot"].as<bool>());
    // The images' user (deploy/docker, DockerImageTest checks its USER).
    EXPECT_EQ(security["runAsUser"].as<int>(), 10001);
  }
  ASSERT_FALSE(config.cluster.secret_file.empty()) << "the cluster runs open";
  CheckSecretFile(r, router, config.cluster.secret_file, "tandem-cluster-secret");
  ASSERT_FALSE(config.router.api_keys_file.empty());
  CheckSecretFile(r, router, config.router.api_keys_file, "tandem-api-keys");
}

TEST(DeployK8sTest, CpuDemoRendersAndMatchesTheCode) {
  RENDER_OR_SKIP(r, "cpu-demo");
  ClusterConfig config;
  ASSERT_NO_FATAL_FAILURE(CheckCommon(r, &config));
  EXPECT_FALSE(config.engine.device.is_cuda());
  // stories260K from the node's directory; 1 prefill + 1 decode worker.
  EXPECT_EQ(Str(r.Get("ConfigMap", "tandem-env")["data"]["TANDEM_MODEL"]),
            "/models/stories260K.gguf");
  EXPECT_TRUE(std::filesystem::exists(SharedPath("models/stories260K.gguf")));
  for (const char* name : {"tandem-prefill", "tandem-decode", "tandem-router"}) {
    const YAML::Node d = r.Get("Deployment", name);
    EXPECT_EQ(d["spec"]["replicas"].as<int>(), 1) << name;
    EXPECT_EQ(Str(Volume(d, "models")["hostPath"]["path"]), "/var/lib/tandem/models") << name;
    EXPECT_FALSE(Volume(d, "models")["persistentVolumeClaim"].IsDefined()) << name;
    EXPECT_EQ(Str(Container(d)["image"]), "tandem-cpu:dev") << name;
  }
  EXPECT_FALSE(r.Get("PersistentVolumeClaim", "tandem-models").IsDefined());
  // The demo Secrets are what the processes accept: a cluster secret the
  // auth loader takes, an API-key file the router parses.
  const YAML::Node secret = r.Get("Secret", "tandem-cluster-secret");
  std::string bytes;
  ASSERT_TRUE(absl::Base64Unescape(Str(secret["data"]["cluster-secret"]), &bytes));
  const std::string secret_path = absl::StrCat(::testing::TempDir(), "/k8s-secret-", getpid());
  std::ofstream(secret_path) << bytes;
  chmod(secret_path.c_str(), 0600);
  absl::StatusOr<std::string> loaded = auth::LoadSecretFile(secret_path);
  std::filesystem::remove(secret_path);
  EXPECT_TRUE(loaded.ok()) << loaded.status();
  std::string keys;
  ASSERT_TRUE(absl::Base64Unescape(
      Str(r.Get("Secret", "tandem-api-keys")["data"]["api-keys.yaml"]), &keys));
  absl::StatusOr<std::vector<router::ApiKeyEntry>> parsed = router::ParseApiKeys(keys);
  ASSERT_TRUE(parsed.ok()) << parsed.status();
  EXPECT_EQ(parsed->size(), 1u);
}

TEST(DeployK8sTest, GpuOverlayRendersAndMatchesTheCode) {
  RENDER_OR_SKIP(r, "gpu");
  ClusterConfig config;
  ASSERT_NO_FATAL_FAILURE(CheckCommon(r, &config));
  EXPECT_TRUE(config.engine.device.is_cuda());
  // The operator creates the Secrets; the model is on the base's claim.
  EXPECT_FALSE(r.Get("Secret", "tandem-cluster-secret").IsDefined());
  EXPECT_TRUE(r.Get("PersistentVolumeClaim", "tandem-models").IsDefined());
  for (const char* name : {"tandem-prefill", "tandem-decode"}) {
    SCOPED_TRACE(name);
    const YAML::Node d = r.Get("Deployment", name);
    const YAML::Node c = Container(d);
    EXPECT_EQ(Str(c["image"]), "tandem-cuda:dev");
    EXPECT_EQ(Str(c["resources"]["limits"]["nvidia.com/gpu"]), "1");
    EXPECT_EQ(EnvValue(c, "NCCL_SOCKET_IFNAME"), "eth0");
    EXPECT_EQ(Str(Volume(d, "dshm")["emptyDir"]["medium"]), "Memory");
    EXPECT_EQ(Str(Volume(d, "models")["persistentVolumeClaim"]["claimName"]), "tandem-models");
  }
  // The router needs no GPU.
  const YAML::Node rc = Container(r.Get("Deployment", "tandem-router"));
  const YAML::Node limits = rc["resources"]["limits"];
  EXPECT_FALSE(limits.IsDefined() && limits["nvidia.com/gpu"].IsDefined());
}

// The role label values of the planner's tandem_planner_desired_workers,
// as the router's Planner registers them (the series KEDA's query reads).
std::set<std::string> PlannerDesiredWorkersRoles() {
  auto registry = std::make_shared<prometheus::Registry>();
  router::PlannerOptions options;
  options.config.mode = PlannerMode::kLoad;
  options.log = [](const std::string&) {};
  router::Planner planner(
      options, [](absl::Time) { return router::PlannerInputs{}; },
      [](const std::string&, v1::WorkerRole) { return absl::OkStatus(); }, registry);
  std::set<std::string> roles;
  for (const prometheus::MetricFamily& f : registry->Collect()) {
    if (f.name != "tandem_planner_desired_workers") continue;
    for (const prometheus::ClientMetric& m : f.metric) {
      for (const prometheus::ClientMetric::Label& l : m.label) {
        if (l.name == "role") roles.insert(l.value);
      }
    }
  }
  return roles;
}

// deploy/k8s/overlays/autoscaling: the CPU demo with two routers whose
// planners only export the split they want (planner.flip_roles false; the
// rest of the config the demo's), and one KEDA ScaledObject per worker
// Deployment setting its replicas to max over routers of
// tandem_planner_desired_workers{role=<its --role>} (AverageValue,
// threshold 1), polled every planner.interval_s and paced by cooldown_s.
TEST(DeployK8sTest, AutoscalingOverlayScalesWorkersFromThePlanner) {
  RENDER_OR_SKIP(r, "autoscaling");
  ClusterConfig config;
  ASSERT_NO_FATAL_FAILURE(CheckCommon(r, &config));
  EXPECT_NE(config.planner.mode, PlannerMode::kOff);
  EXPECT_FALSE(config.planner.flip_roles) << "the autoscaler moves workers, not the planner";
  // The config is the parent's (cpu-demo) plus `planner`.
  Rendered parent;
  ASSERT_NO_FATAL_FAILURE(Render(kubectl_r, "cpu-demo", &parent));
  YAML::Node mine = YAML::Load(Str(r.Get("ConfigMap", "tandem-config")["data"]["cluster.yaml"]));
  const YAML::Node theirs =
      YAML::Load(Str(parent.Get("ConfigMap", "tandem-config")["data"]["cluster.yaml"]));
  EXPECT_FALSE(theirs["planner"].IsDefined());
  mine.remove("planner");
  EXPECT_EQ(YAML::Dump(mine), YAML::Dump(theirs));
  // Two routers, each running a planner; the replicas of the workers are
  // the autoscaler's alone.
  EXPECT_EQ(r.Get("Deployment", "tandem-router")["spec"]["replicas"].as<int>(), 2);

  const std::set<std::string> exported = PlannerDesiredWorkersRoles();
  EXPECT_EQ(exported, (std::set<std::string>{"prefill", "decode"}));
  std::map<std::string, int> scaled;  // Deployment -> ScaledObjects targeting it
  for (const YAML::Node& o : r.objects) {
    if (Str(o["kind"]) != "ScaledObject") continue;
    const std::string target = Str(o["spec"]["scaleTargetRef"]["name"]);
    SCOPED_TRACE(absl::StrCat("ScaledObject ", Str(o["metadata"]["name"]), " -> ", target));
    ++scaled[target];
    const YAML::Node d = r.Get("Deployment", target);
    ASSERT_TRUE(d.IsDefined()) << "no Deployment " << target;
    EXPECT_EQ(Str(d["metadata"]["name"]), target);
    const YAML::Node ref = o["spec"]["scaleTargetRef"];
    EXPECT_TRUE(Str(ref["kind"]).empty() || Str(ref["kind"]) == "Deployment");
    const std::string role = Arg(Container(d), "--role");
    ASSERT_TRUE(role == "prefill" || role == "decode") << "--role " << role;
    EXPECT_FALSE(d["spec"]["replicas"].IsDefined()) << "a replica count kubectl apply would reset";
    const int min = o["spec"]["minReplicaCount"].as<int>();
    const int max = o["spec"]["maxReplicaCount"].as<int>();
    EXPECT_GE(min, 1);
    EXPECT_LE(min, max);
    EXPECT_GE(min, role == "prefill" ? config.planner.min_prefill_workers
                                     : config.planner.min_decode_workers);
    EXPECT_EQ(o["spec"]["pollingInterval"].as<double>(), config.planner.interval_s);
    const YAML::Node behavior = o["spec"]["advanced"]["horizontalPodAutoscalerConfig"]["behavior"];
    for (const char* way : {"scaleUp", "scaleDown"}) {
      SCOPED_TRACE(way);
      EXPECT_EQ(behavior[way]["stabilizationWindowSeconds"].as<double>(),
                config.planner.cooldown_s);
      ASSERT_EQ(behavior[way]["policies"].size(), 1u);
      EXPECT_EQ(Str(behavior[way]["policies"][0]["type"]), "Pods");
      EXPECT_EQ(behavior[way]["policies"][0]["value"].as<int>(), 1);
      EXPECT_EQ(behavior[way]["policies"][0]["periodSeconds"].as<double>(),
                config.planner.cooldown_s);
    }
    ASSERT_EQ(o["spec"]["triggers"].size(), 1u);
    const YAML::Node trigger = o["spec"]["triggers"][0];
    EXPECT_EQ(Str(trigger["type"]), "prometheus");
    // replicas = ceil(value / threshold) = the wanted number.
    EXPECT_EQ(Str(trigger["metricType"]), "AverageValue");
    EXPECT_EQ(Str(trigger["metadata"]["threshold"]), "1");
    EXPECT_TRUE(absl::StartsWith(Str(trigger["metadata"]["serverAddress"]), "http"));
    EXPECT_TRUE(exported.count(role)) << "the planner exports no role=\"" << role << "\"";
    EXPECT_EQ(Str(trigger["metadata"]["query"]),
              absl::StrCat("max(tandem_planner_desired_workers{role=\"", role, "\"})"));
  }
  // One ScaledObject per worker Deployment, none for the router.
  std::map<std::string, int> workers;
  for (const YAML::Node& o : r.objects) {
    if (Str(o["kind"]) == "Deployment" && Str(Container(o)["command"][0]) == "tandem-worker") {
      workers[Str(o["metadata"]["name"])] = 1;
    }
  }
  EXPECT_EQ(scaled, workers);
  EXPECT_EQ(workers.size(), 2u);
}

// Where no ReadOnlyMany storage holds the model (issue #32: the base claim
// is ReadOnlyMany, so no pod can fill it through that claim), each pod
// downloads it: deploy/k8s/components/model-download on the gpu overlay,
// in a kustomization written as docs/operations.md shows. Rendered: no
// claim; in every Deployment /models is an emptyDir that the init
// container fetch-model mounts read-write and the process read-only, and
// TANDEM_MODEL (the --model every process reads) is on it; fetch-model
// reads TANDEM_MODEL and the source from the rendered ConfigMaps. Its
// script, run here on a file:// URL of stories260K: a wrong MODEL_SHA256
// leaves no file; the right one puts the exact bytes at TANDEM_MODEL; a
// restarted init container finds the finished file and downloads nothing.
TEST(DeployK8sTest, ModelDownloadComponentFillsAnEmptyDirForEveryProcess) {
  const std::string kubectl = FindKubectl();
  if (kubectl.empty()) GTEST_SKIP() << "kubectl not found on PATH: cannot render deploy/k8s";
  const std::filesystem::path dir =
      absl::StrCat(::testing::TempDir(), "/k8s-model-download-", getpid());
  std::filesystem::remove_all(dir);
  std::filesystem::create_directories(dir / "models");
  // kustomize takes relative paths only.
  auto rel = [&](const std::string& p) {
    return std::filesystem::relative(kSource + "/" + p, dir).string();
  };
  std::ofstream(dir / "kustomization.yaml")
      << "apiVersion: kustomize.config.k8s.io/v1beta1\nkind: Kustomization\n"
      << "resources: [" << rel("deploy/k8s/overlays/gpu") << "]\n"
      << "components: [" << rel("deploy/k8s/components/model-download") << "]\n"
      << "configMapGenerator:\n  - name: tandem-model-source\n    literals:\n"
      << "      - MODEL_URL=https://models.example/model.gguf\n      - MODEL_SHA256=\n";
  Rendered r;
  ASSERT_NO_FATAL_FAILURE(RenderDir(kubectl, dir.string(), &r));
  ClusterConfig config;
  ASSERT_NO_FATAL_FAILURE(CheckCommon(r, &config));
  EXPECT_FALSE(r.Get("PersistentVolumeClaim", "tandem-models").IsDefined());
  const YAML::Node env = r.Get("ConfigMap", "tandem-env");
  const YAML::Node source = r.Get("ConfigMap", "tandem-model-source");
  ASSERT_TRUE(source.IsDefined());
  EXPECT_EQ(Str(source["data"]["MODEL_URL"]), "https://models.example/model.gguf");
  const std::string model = Str(env["data"]["TANDEM_MODEL"]);
  EXPECT_EQ(model, "/models/model.gguf");  // the gpu overlay keeps the base's
  std::string script;
  for (const char* name : {"tandem-router", "tandem-prefill", "tandem-decode"}) {
    SCOPED_TRACE(name);
    const YAML::Node d = r.Get("Deployment", name);
    const YAML::Node models = Volume(d, "models");
    EXPECT_TRUE(models["emptyDir"].IsMap());
    EXPECT_FALSE(models["persistentVolumeClaim"].IsDefined());
    const YAML::Node c = Container(d);
    EXPECT_EQ(MountOf(c, model).first, "models");
    EXPECT_TRUE(MountNamed(c, "models")["readOnly"].as<bool>());
    const YAML::Node inits = d["spec"]["template"]["spec"]["initContainers"];
    ASSERT_EQ(inits.size(), 1u);
    const YAML::Node init = inits[0];
    EXPECT_EQ(Str(init["name"]), "fetch-model");
    EXPECT_EQ(MountOf(init, model).first, "models");
    const YAML::Node mount = MountNamed(init, "models");
    EXPECT_EQ(Str(mount["mountPath"]), Str(MountNamed(c, "models")["mountPath"]));
    EXPECT_FALSE(mount["readOnly"].IsDefined() && mount["readOnly"].as<bool>());
    std::set<std::string> refs;
    for (const YAML::Node& e : init["envFrom"]) refs.insert(Str(e["configMapRef"]["name"]));
    EXPECT_EQ(refs, (std::set<std::string>{Str(env["metadata"]["name"]),
                                           Str(source["metadata"]["name"])}));
    EXPECT_FALSE(init["securityContext"]["allowPrivilegeEscalation"].as<bool>());
    ASSERT_EQ(init["command"].size(), 3u);
    EXPECT_EQ(Str(init["command"][0]), "sh");
    EXPECT_EQ(Str(init["command"][1]), "-c");
    if (script.empty()) script = Str(init["command"][2]);
    EXPECT_EQ(Str(init["command"][2]), script) << "one script for every process";
  }

  // fetch-model's script, with curl and sha256sum from this machine.
  const std::string stories = SharedPath("models/stories260K.gguf");
  ProcessResult sum = RunProcess({"/usr/bin/sha256sum", stories}, absl::Seconds(20));
  ASSERT_EQ(sum.exit_code, 0) << sum.Describe();
  const std::string sha = sum.out.substr(0, 64);
  const std::string target = (dir / "models/sub/stories260K.gguf").string();
  auto fetch = [&](const std::string& url, const std::string& expected_sha) {
    return RunProcess({"/usr/bin/env", "-i", absl::StrCat("PATH=", std::getenv("PATH")),
                       "TANDEM_MODEL=" + target, "MODEL_URL=" + url,
                       "MODEL_SHA256=" + expected_sha, "sh", "-c", script},
                      absl::Seconds(60));
  };
  const std::string wrong(64, '0');
  ProcessResult bad = fetch("file://" + stories, wrong);
  EXPECT_EQ(bad.exit_code, 1) << bad.Describe();
  EXPECT_THAT(bad.err, HasSubstr(absl::StrCat("has SHA-256 ", sha, ", expected MODEL_SHA256 ",
                                              wrong)));
  EXPECT_FALSE(std::filesystem::exists(target));
  EXPECT_FALSE(std::filesystem::exists(target + ".partial"));
  ProcessResult good = fetch("file://" + stories, sha);
  ASSERT_EQ(good.exit_code, 0) << good.Describe();
  EXPECT_THAT(good.out, HasSubstr(absl::StrCat("fetch-model: ", target, " ready (")));
  auto bytes = [](const std::string& path) {
    std::ifstream in(path, std::ios::binary);
    return std::string(std::istreambuf_iterator<char>(in), {});
  };
  EXPECT_EQ(bytes(target), bytes(stories));
  // A restarted init container: the finished file stays, nothing fetched.
  ProcessResult again = fetch("file:///nonexistent/model.gguf", sha);
  EXPECT_EQ(again.exit_code, 0) << again.Describe();
  EXPECT_THAT(again.out, HasSubstr("is already here"));
  std::filesystem::remove_all(dir);
}

}  // namespace
}  // namespace tandem::testing
