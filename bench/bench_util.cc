#include "bench/bench_util.h"

#include <cstdlib>
#include <map>
#include <memory>
#include <random>

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

absl::StatusOr<const model::LlamaModel*> GetModel(int32_t num_threads) {
  static auto* cache = new std::map<int32_t, LoadedModel>();
  auto it = cache->find(num_threads);
  if (it != cache->end()) return it->second.model.get();
  LoadedModel loaded;
  auto file = gguf::GgufFile::Open(ModelPath());
  if (!file.ok()) return file.status();
  loaded.file = *std::move(file);
  auto m = model::LlamaModel::Load(*loaded.file, num_threads);
  if (!m.ok()) return m.status();
  loaded.model = *std::move(m);
  const model::LlamaModel* result = loaded.model.get();
  cache->emplace(num_threads, std::move(loaded));
  return result;
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
