// Helpers shared by the Llama model tests: loading the shared test models
// and goldens, and a small greedy driver over a KV cache.
#ifndef TANDEM_TESTS_ENGINE_MODEL_MODEL_TEST_UTIL_H_
#define TANDEM_TESTS_ENGINE_MODEL_MODEL_TEST_UTIL_H_

#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "engine/gguf/gguf_file.h"
#include "engine/kv/block_pool.h"
#include "engine/kv/cpu_kv_storage.h"
#include "engine/model/llama_model.h"
#include "nlohmann/json.hpp"

namespace tandem::model::testing {

// An opened GGUF file and the model built from it (the file outlives it).
struct LoadedModel {
  std::unique_ptr<gguf::GgufFile> file;
  std::unique_ptr<LlamaModel> model;
};

// Opens and loads ../shared/models/<name> with a pool of `num_threads`
// threads; fails the test (and returns nulls) on error.
LoadedModel LoadSharedModel(const std::string& name, int32_t num_threads = 1);

// ../shared/goldens/stories260K_greedy.json, parsed.
nlohmann::json LoadStoriesGoldens();

// ../shared/goldens/<name>, parsed.
nlohmann::json LoadGoldens(const std::string& name);

// Lowest id among the largest values.
int32_t Argmax(const std::vector<float>& logits);

// Greedy decoding of one sequence alone: prefills `prompt` in one step
// through `table` of blocks in `kv` (which must cover prompt + n_new
// tokens), then decodes
// until n_new tokens exist. Returns the generated ids; `step_logits`, when
// not null, receives the logits that chose each of them.
std::vector<int32_t> GreedyDecode(const LlamaModel& model, kv::CpuKvStorage& kv,
                                  const std::vector<int32_t>& table,
                                  const std::vector<int32_t>& prompt, int n_new,
                                  std::vector<std::vector<float>>* step_logits = nullptr);

// One sequence driven by RunSchedule: prefill in chunks of `chunk` tokens
// (0 = all at once), then greedy decode.
struct ScheduledSeq {
  std::vector<int32_t> prompt;
  int32_t chunk = 0;
  std::vector<int32_t> table;
  int32_t fed = 0;
  std::vector<int32_t> generated;
  std::vector<std::vector<float>> logits;  // one per generated token
};

// Steps every sequence forward together (continuous batching: prefill
// chunks of some sequences beside decode tokens of others) until each has
// `decode_steps` tokens. Block tables (of `block_size` tokens) come from
// `blocks`, the K/V memory from `kv`.
void RunSchedule(const LlamaModel& model, kv::CpuKvStorage& kv, kv::BlockPool& blocks,
                 std::vector<ScheduledSeq>& seqs, int32_t block_size, int decode_steps);

// Greedy-decodes goldens case `c` (prompt_token_ids, generated_token_ids,
// strict_prefix_len, steps[].top5 {id, logit}) with `model` alone, prompt
// ids fed directly, and expects the ids up to strict_prefix_len exactly and
// each of those steps' top-5 logits within tolerance(id).
void ExpectGreedyGoldenCase(const LlamaModel& model, const nlohmann::json& c,
                            const std::function<double(size_t)>& tolerance);

// Batch invariance of ../shared/models/<model>: every prompt, prefilled in
// chunks of 1, 7 or at once beside the others' decode steps, on 1 thread
// and on 2 threads with every kernel split, gives the logits of the prompt
// alone (1 thread, prefilled at once) bit for bit at each of 4 steps, with
// the KV cache in `kv_dtype`.
void ExpectBatchInvariant(const std::string& model, const std::vector<std::vector<int32_t>>& prompts,
                          kv::KvDtype kv_dtype = kv::KvDtype::kF32);

// The same over models already loaded: `one` on 1 thread, `two` on 2
// (whose kernels this splits: set_min_parallel_work_for_testing(0)).
void ExpectBatchInvariantModels(const LlamaModel& one, LlamaModel& two,
                                const std::vector<std::vector<int32_t>>& prompts,
                                kv::KvDtype kv_dtype = kv::KvDtype::kF32);

// Same size and same bytes.
bool BitIdentical(const std::vector<float>& a, const std::vector<float>& b);

}  // namespace tandem::model::testing

#endif  // TANDEM_TESTS_ENGINE_MODEL_MODEL_TEST_UTIL_H_
