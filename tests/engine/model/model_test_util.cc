#include "tests/engine/model/model_test_util.h"

#include <algorithm>
#include <span>

#include "gtest/gtest.h"
#include "tests/test_util.h"

namespace tandem::model::testing {

LoadedModel LoadSharedModel(const std::string& name, int32_t num_threads) {
  LoadedModel out;
  absl::StatusOr<std::unique_ptr<gguf::GgufFile>> file =
      gguf::GgufFile::Open(tandem::testing::SharedPath("models/" + name));
  if (!file.ok()) {
    ADD_FAILURE() << file.status();
    return out;
  }
  out.file = *std::move(file);
  absl::StatusOr<std::unique_ptr<LlamaModel>> model = LlamaModel::Load(*out.file, num_threads);
  if (!model.ok()) {
    ADD_FAILURE() << model.status();
    return out;
  }
  out.model = *std::move(model);
  return out;
}

nlohmann::json LoadStoriesGoldens() {
  return nlohmann::json::parse(tandem::testing::ReadFileOrDie(
      tandem::testing::SharedPath("goldens/stories260K_greedy.json")));
}

int32_t Argmax(const std::vector<float>& logits) {
  return static_cast<int32_t>(std::max_element(logits.begin(), logits.end()) -
                              logits.begin());
}

std::vector<int32_t> GreedyDecode(const LlamaModel& model, kv::CpuKvStorage& kv,
                                  const std::vector<int32_t>& table,
                                  const std::vector<int32_t>& prompt, int n_new,
                                  std::vector<std::vector<float>>* step_logits) {
  std::vector<int32_t> generated;
  std::vector<float> logits;
  SequenceBatch entry;
  entry.tokens = prompt;
  entry.start_pos = 0;
  entry.block_table = &table;
  model.Forward(std::span<const SequenceBatch>(&entry, 1), kv, &logits);
  generated.push_back(Argmax(logits));
  if (step_logits != nullptr) step_logits->push_back(logits);
  while (static_cast<int>(generated.size()) < n_new) {
    entry.tokens = std::span<const int32_t>(&generated.back(), 1);
    entry.start_pos = static_cast<int32_t>(prompt.size() + generated.size() - 1);
    model.Forward(std::span<const SequenceBatch>(&entry, 1), kv, &logits);
    generated.push_back(Argmax(logits));
    if (step_logits != nullptr) step_logits->push_back(logits);
  }
  return generated;
}

}  // namespace tandem::model::testing
