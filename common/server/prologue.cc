#include "common/server/prologue.h"

#include "absl/strings/str_cat.h"
#include "common/server/auth_call.h"

namespace tandem {

Prologue::Prologue() = default;
Prologue::~Prologue() = default;
Prologue::Prologue(Prologue&&) = default;
Prologue& Prologue::operator=(Prologue&&) = default;

absl::StatusOr<Prologue> RunPrologue(const ClusterConfig& config, const std::string& model_flag,
                                     const PrologueOptions& options) {
  Prologue p;
  auto cluster_auth =
      auth::ClusterAuth::Load(config.cluster.secret_file, config.cluster.auth_max_skew_ms,
                              config.cluster.accepted_secret_files);
  if (!cluster_auth.ok()) return cluster_auth.status();
  p.auth = *std::move(cluster_auth);
  auto model_path = ResolveModelPath(model_flag, config);
  if (!model_path.ok()) return model_path.status();
  p.model_path = *model_path;
  if (options.pin_kernel_isa) {
    if (absl::Status s = model::PinKernelIsa(config.engine.kernel_isa); !s.ok()) {
      return absl::Status(s.code(), absl::StrCat("engine.kernel_isa: ", s.message()));
    }
  }
  auto bundle =
      LoadModelBundle(p.model_path, options.num_threads, options.q8_matmul, options.cpu_forward);
  if (!bundle.ok()) return bundle.status();
  p.bundle = *std::move(bundle);
  return p;
}

}  // namespace tandem
