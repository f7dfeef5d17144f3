#include "common/server/model_bundle.h"

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"

namespace tandem {
namespace {

// `status` with its message prefixed by the model path, unless the message
// already names the file (the GGUF and weight loaders do).
[[nodiscard]] absl::Status WithPath(const std::string& path, const absl::Status& status) {
  if (absl::StartsWith(status.message(), path)) return status;
  return absl::Status(status.code(), absl::StrCat(path, ": ", status.message()));
}

}  // namespace

absl::StatusOr<std::unique_ptr<ModelBundle>> LoadModelBundle(const std::string& path,
                                                             int32_t num_threads,
                                                             model::Q8MatMul q8_matmul,
                                                             bool cpu_forward) {
  auto bundle = std::make_unique<ModelBundle>();
  auto file = gguf::GgufFile::Open(path);
  if (!file.ok()) return file.status();
  bundle->file = std::move(*file);
  model::LlamaModelOptions options;
  options.num_threads = num_threads;
  options.q8_matmul = q8_matmul;
  options.f32_panels = cpu_forward;
  auto model = model::LlamaModel::Load(*bundle->file, options);
  if (!model.ok()) return WithPath(path, model.status());
  bundle->model = std::move(*model);
  auto tok = tokenizer::Tokenizer::FromGguf(*bundle->file);
  if (!tok.ok()) return WithPath(path, tok.status());
  bundle->tokenizer = std::move(*tok);
  auto fp = model::ModelFingerprint(*bundle->file);
  if (!fp.ok()) return fp.status();
  bundle->fingerprint = *fp;
  return bundle;
}

}  // namespace tandem
