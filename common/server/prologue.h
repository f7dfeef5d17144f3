// The start-up steps the router and every worker share once their settings
// are resolved: the cluster credential (cluster.secret_file) and the model
// (--model or the config's, engine.kernel_isa pinned before it is loaded).
//
// Owns: nothing after it returns (the caller holds the result). Threads: the
// main thread, before any server starts.
#ifndef TANDEM_COMMON_SERVER_PROLOGUE_H_
#define TANDEM_COMMON_SERVER_PROLOGUE_H_

#include <memory>
#include <string>

#include "absl/status/statusor.h"
#include "common/cluster_config.h"
#include "common/server/model_bundle.h"

namespace tandem {
namespace auth {
class ClusterAuth;
}  // namespace auth

// How the model is loaded (LoadModelBundle's arguments).
struct PrologueOptions {
  int32_t num_threads = 1;                              // engine.threads
  model::Q8MatMul q8_matmul = model::Q8MatMul::kExact;  // engine.q8_matmul
  bool cpu_forward = true;      // false: a GPU forward, or none (the router)
  bool pin_kernel_isa = false;  // true: engine.kernel_isa first (workers)
};

// What the prologue made; the caller keeps it for the process's life.
struct Prologue {
  Prologue();
  ~Prologue();
  Prologue(Prologue&&);
  Prologue& operator=(Prologue&&);
  // The cluster credential checker/signer (open without cluster.secret_file).
  std::unique_ptr<auth::ClusterAuth> auth;
  std::string model_path;  // the resolved --model or config model
  std::unique_ptr<ModelBundle> bundle;
};

// Loads the cluster credential, resolves the model path (`model_flag`, ""
// for none: ResolveModelPath), pins engine.kernel_isa when asked, and loads
// the model. Errors are one line naming the key or file: cluster.secret_file
// unreadable or short, model not found or not GGUF, "engine.kernel_isa: ...".
[[nodiscard]] absl::StatusOr<Prologue> RunPrologue(const ClusterConfig& config,
                                                   const std::string& model_flag,
                                                   const PrologueOptions& options);

}  // namespace tandem

#endif  // TANDEM_COMMON_SERVER_PROLOGUE_H_
