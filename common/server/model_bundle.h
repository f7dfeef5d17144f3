// A model file opened for serving: the GGUF mapping, the Llama weights, the
// tokenizer and the file's fingerprint, loaded once per process.
#ifndef TANDEM_COMMON_SERVER_MODEL_BUNDLE_H_
#define TANDEM_COMMON_SERVER_MODEL_BUNDLE_H_

#include <memory>
#include <string>

#include "absl/status/statusor.h"
#include "engine/gguf/gguf_file.h"
#include "engine/model/llama_model.h"
#include "engine/tokenizer/tokenizer.h"

namespace tandem {

struct ModelBundle {
  std::unique_ptr<gguf::GgufFile> file;
  std::unique_ptr<model::LlamaModel> model;
  std::unique_ptr<tokenizer::Tokenizer> tokenizer;
  std::string fingerprint;  // hex XXH3-128 of the file
};

// Opens `path` and loads everything; the forward pass uses `num_threads`
// compute threads (engine.threads) and multiplies Q8_0 matrices as
// `q8_matmul` says (engine.q8_matmul; int8 packs them at load). With
// `cpu_forward` false (the forward runs on a GPU, or not at all: the
// router) the F32 panel packing for the CPU forward is skipped
// (LlamaModelOptions::f32_panels). Errors carry the path and the cause
// (NOT_FOUND, INVALID_ARGUMENT for a non-GGUF or truncated file, ...).
[[nodiscard]] absl::StatusOr<std::unique_ptr<ModelBundle>> LoadModelBundle(
    const std::string& path, int32_t num_threads = 1,
    model::Q8MatMul q8_matmul = model::Q8MatMul::kExact, bool cpu_forward = true);

}  // namespace tandem

#endif  // TANDEM_COMMON_SERVER_MODEL_BUNDLE_H_
