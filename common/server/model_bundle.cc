#include "common/server/model_bundle.h"

#include "absl/strings/str_cat.h"

namespace tandem {

absl::StatusOr<std::unique_ptr<ModelBundle>> LoadModelBundle(const std::string& path,
                                                             int32_t num_threads) {
  auto bundle = std::make_unique<ModelBundle>();
  auto file = gguf::GgufFile::Open(path);
  if (!file.ok()) return file.status();
  bundle->file = std::move(*file);
  auto model = model::LlamaModel::Load(*bundle->file, num_threads);
  if (!model.ok()) {
    return absl::Status(model.status().code(),
                        absl::StrCat(path, ": ", model.status().message()));
  }
  bundle->model = std::move(*model);
  auto tok = tokenizer::Tokenizer::FromGguf(*bundle->file);
  if (!tok.ok()) {
    return absl::Status(tok.status().code(),
                        absl::StrCat(path, ": ", tok.status().message()));
  }
  bundle->tokenizer = std::move(*tok);
  auto fp = model::ModelFingerprint(*bundle->file);
  if (!fp.ok()) return fp.status();
  bundle->fingerprint = *fp;
  return bundle;
}

}  // namespace tandem
