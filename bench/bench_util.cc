#include "bench/bench_util.h"

#include <cstdlib>
#include <map>
#include <memory>
#include <optional>
#include <random>
#include <utility>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "engine/gguf/gguf_file.h"

namespace tandem::bench {
namespace {

struct LoadedModel {
  std::unique_ptr<gguf::GgufFile> file;  // outlives `model`
  std::unique_ptr<model::LlamaModel> model;
};

}  // namespace

std::string ModelPath() {
  const char* env = std::getenv("TANDEM_MODEL");
  if (env != nullptr && env[0] != '\0') return env;
  return std::string(TANDEM_BENCH_SHARED_DIR) + "/models/stories260K.gguf";
}

absl::StatusOr<model::Q8MatMul> BenchQ8MatMul() {
  const char* env = std::getenv("TANDEM_BENCH_Q8_MATMUL");
  const std::string value = env == nullptr ? "" : env;
  if (value.empty() || value == "exact") return model::Q8MatMul::kExact;
  if (value == "int8") return model::Q8MatMul::kInt8;
  return absl::InvalidArgumentError(
      absl::StrCat("TANDEM_BENCH_Q8_MATMUL: expected exact or int8, got '", value, "'"));
}

absl::StatusOr<kv::KvDtype> BenchKvDtype() {
  const char* env = std::getenv("TANDEM_BENCH_KV_DTYPE");
  const std::string value = env == nullptr ? "" : env;
  if (value.empty()) return kv::KvDtype::kF32;
  for (kv::KvDtype d : {kv::KvDtype::kF32, kv::KvDtype::kF16, kv::KvDtype::kBF16}) {
    if (value == kv::KvDtypeName(d)) return d;
  }
  return absl::InvalidArgumentError(
      absl::StrCat("TANDEM_BENCH_KV_DTYPE: expected f32, f16 or bf16, got '", value, "'"));
}

absl::StatusOr<const model::LlamaModel*> GetModel(int32_t num_threads) {
  static auto* cache = new std::map<int32_t, LoadedModel>();
  auto it = cache->find(num_threads);
  if (it != cache->end()) return it->second.model.get();
  LoadedModel loaded;
  auto file = gguf::GgufFile::Open(ModelPath());
  if (!file.ok()) return file.status();
  loaded.file = *std::move(file);
  absl::StatusOr<model::Q8MatMul> q8 = BenchQ8MatMul();
  if (!q8.ok()) return q8.status();
  model::LlamaModelOptions options;
  options.num_threads = num_threads;
  options.q8_matmul = *q8;
  auto m = model::LlamaModel::Load(*loaded.file, options);
  if (!m.ok()) return m.status();
  loaded.model = *std::move(m);
  const model::LlamaModel* result = loaded.model.get();
  cache->emplace(num_threads, std::move(loaded));
  return result;
}

absl::StatusOr<MatMulWeights> GetMatMulWeights(const model::LlamaConfig& config) {
  static auto* cache = new std::optional<MatMulWeights>();
  if (cache->has_value()) return **cache;
  auto file = gguf::GgufFile::Open(ModelPath());
  if (!file.ok()) return file.status();
  const int64_t embd = config.n_embd;
  const int64_t q_dim = static_cast<int64_t>(config.n_head) * config.head_dim;
  const int64_t kv_dim = static_cast<int64_t>(config.n_head_kv) * config.head_dim;
  const int64_t ff = config.n_ff;
  MatMulWeights out;
  // Adds tensor `name` of `elements` weights (the shape `config` implies).
  auto add = [&](const std::string& name, int64_t elements) -> absl::Status {
    const gguf::TensorInfo* t = (*file)->FindTensor(name);
    if (t == nullptr) {
      return absl::InvalidArgumentError(absl::StrCat(ModelPath(), ": tensor ", name, " missing"));
    }
    if (static_cast<int64_t>(t->NumElements()) != elements) {
      return absl::InvalidArgumentError(absl::StrCat(ModelPath(), ": tensor ", name, " has ",
                                                     t->NumElements(), " elements, config implies ",
                                                     elements));
    }
    if (out.type.empty()) out.type = std::string(gguf::TensorTypeName(t->type));
    out.params += elements;
    out.bytes += static_cast<int64_t>(t->n_bytes);
    return absl::OkStatus();
  };
  for (int32_t l = 0; l < config.n_layers; ++l) {
    const std::string p = absl::StrCat("blk.", l, ".");
    for (const auto& [name, elements] :
         {std::pair<std::string, int64_t>{"attn_q.weight", embd * q_dim},
          {"attn_k.weight", embd * kv_dim},
          {"attn_v.weight", embd * kv_dim},
          {"attn_output.weight", q_dim * embd},
          {"ffn_gate.weight", embd * ff},
          {"ffn_up.weight", embd * ff},
          {"ffn_down.weight", ff * embd}}) {
      if (absl::Status s = add(p + name, elements); !s.ok()) return s;
    }
  }
  const std::string output =
      (*file)->FindTensor("output.weight") != nullptr ? "output.weight" : "token_embd.weight";
  if (absl::Status s = add(output, static_cast<int64_t>(config.vocab_size) * embd); !s.ok()) {
    return s;
  }
  *cache = out;
  return out;
}

std::vector<int32_t> RandomTokens(size_t n, int32_t vocab_size, uint32_t seed) {
  std::mt19937 gen(seed);
  std::uniform_int_distribution<int32_t> dist(0, vocab_size - 1);
  std::vector<int32_t> out(n);
  for (auto& t : out) t = dist(gen);
  return out;
}

std::vector<float> RandomFloats(size_t n, uint32_t seed) {
  std::mt19937 gen(seed);
  std::uniform_real_distribution<float> dist(-1.0f, 1.0f);
  std::vector<float> out(n);
  for (auto& v : out) v = dist(gen);
  return out;
}

}  // namespace tandem::bench
