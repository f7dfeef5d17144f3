#include "tests/engine/model/model_test_util.h"

#include <algorithm>
#include <cstring>
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

nlohmann::json LoadStoriesGoldens() { return LoadGoldens("stories260K_greedy.json"); }

nlohmann::json LoadGoldens(const std::string& name) {
  return nlohmann::json::parse(
      tandem::testing::ReadFileOrDie(tandem::testing::SharedPath("goldens/" + name)));
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

void RunSchedule(const LlamaModel& model, kv::CpuKvStorage& kv, kv::BlockPool& blocks,
                 std::vector<ScheduledSeq>& seqs, int32_t block_size, int decode_steps) {
  for (ScheduledSeq& s : seqs) {
    auto t = blocks.Allocate(kv::BlocksForTokens(
        static_cast<int32_t>(s.prompt.size()) + decode_steps, block_size));
    ASSERT_TRUE(t.has_value());
    s.table = *t;
  }
  for (;;) {
    std::vector<SequenceBatch> batch;
    std::vector<ScheduledSeq*> owners;
    for (ScheduledSeq& s : seqs) {
      if (static_cast<int>(s.generated.size()) == decode_steps) continue;
      SequenceBatch e;
      e.block_table = &s.table;
      const int32_t prompt_len = static_cast<int32_t>(s.prompt.size());
      if (s.fed < prompt_len) {
        const int32_t n = s.chunk > 0 ? std::min(s.chunk, prompt_len - s.fed)
                                      : prompt_len - s.fed;
        e.tokens = std::span<const int32_t>(s.prompt).subspan(static_cast<size_t>(s.fed),
                                                               static_cast<size_t>(n));
        e.start_pos = s.fed;
        e.want_logits = (s.fed + n == prompt_len);
        s.fed += n;
      } else {
        e.tokens = std::span<const int32_t>(&s.generated.back(), 1);
        e.start_pos = prompt_len + static_cast<int32_t>(s.generated.size()) - 1;
      }
      batch.push_back(e);
      owners.push_back(&s);
    }
    if (batch.empty()) return;
    std::vector<float> logits;
    model.Forward(batch, kv, &logits);
    const size_t vocab = static_cast<size_t>(model.config().vocab_size);
    size_t out = 0;
    for (size_t i = 0; i < batch.size(); ++i) {
      if (!batch[i].want_logits) continue;
      std::vector<float> row(logits.begin() + static_cast<std::ptrdiff_t>(out * vocab),
                             logits.begin() + static_cast<std::ptrdiff_t>((out + 1) * vocab));
      ++out;
      owners[i]->generated.push_back(Argmax(row));
      owners[i]->logits.push_back(std::move(row));
    }
    ASSERT_EQ(out * vocab, logits.size());
  }
}

bool BitIdentical(const std::vector<float>& a, const std::vector<float>& b) {
  return a.size() == b.size() && std::memcmp(a.data(), b.data(), a.size() * sizeof(float)) == 0;
}

void ExpectGreedyGoldenCase(const LlamaModel& model, const nlohmann::json& c,
                            const std::function<double(size_t)>& tolerance) {
  constexpr int32_t kBlockSize = 16;
  SCOPED_TRACE(c["name"].get<std::string>());
  const auto prompt = c["prompt_token_ids"].get<std::vector<int32_t>>();
  const auto expected = c["generated_token_ids"].get<std::vector<int32_t>>();
  const size_t strict = c["strict_prefix_len"].get<size_t>();
  ASSERT_LE(strict, expected.size());
  ASSERT_LE(strict, c["steps"].size());

  const int32_t tokens = static_cast<int32_t>(prompt.size() + expected.size());
  const int32_t n_blocks = kv::BlocksForTokens(tokens, kBlockSize);
  kv::CpuKvStorage kv(model.kv_shape(kBlockSize), n_blocks);
  kv::BlockPool blocks(n_blocks);
  auto table = blocks.Allocate(n_blocks);
  ASSERT_TRUE(table.has_value());

  // Decode as far as the ids are strict: past that, llama.cpp's own choice
  // was within 1e-2 of a tie.
  std::vector<std::vector<float>> logits;
  const std::vector<int32_t> got =
      GreedyDecode(model, kv, *table, prompt, static_cast<int>(strict), &logits);
  EXPECT_EQ(got, std::vector<int32_t>(expected.begin(), expected.begin() + strict));
  for (size_t step = 0; step < strict && step < logits.size(); ++step) {
    for (const nlohmann::json& top : c["steps"][step]["top5"]) {
      const size_t id = top["id"].get<size_t>();
      ASSERT_LT(id, logits[step].size());
      EXPECT_NEAR(logits[step][id], top["logit"].get<double>(), tolerance(id))
          << "step " << step << " token " << id;
    }
  }
}

void ExpectBatchInvariant(const std::string& model, const std::vector<std::vector<int32_t>>& prompts,
                          kv::KvDtype kv_dtype) {
  LoadedModel one = LoadSharedModel(model, 1);
  ASSERT_NE(one.model, nullptr);
  LoadedModel two = LoadSharedModel(model, 2);
  ASSERT_NE(two.model, nullptr);
  ExpectBatchInvariantModels(*one.model, *two.model, prompts, kv_dtype);
}

void ExpectBatchInvariantModels(const LlamaModel& one, LlamaModel& two,
                                const std::vector<std::vector<int32_t>>& prompts,
                                kv::KvDtype kv_dtype) {
  constexpr int32_t kBlockSize = 16;
  constexpr int kDecodeSteps = 4;
  std::vector<std::vector<std::vector<float>>> alone;
  for (const std::vector<int32_t>& p : prompts) {
    kv::CpuKvStorage kv(one.kv_shape(kBlockSize), 16, kv_dtype);
    kv::BlockPool blocks(16);
    std::vector<ScheduledSeq> seqs(1);
    seqs[0].prompt = p;
    RunSchedule(one, kv, blocks, seqs, kBlockSize, kDecodeSteps);
    alone.push_back(seqs[0].logits);
  }

  two.set_min_parallel_work_for_testing(0);
  for (const LlamaModel* m : {&one, static_cast<const LlamaModel*>(&two)}) {
    for (int32_t chunk : {1, 7, 0}) {
      SCOPED_TRACE(::testing::Message() << m->num_threads() << " threads, chunk " << chunk);
      kv::CpuKvStorage kv(m->kv_shape(kBlockSize), 64, kv_dtype);
      kv::BlockPool blocks(64);
      std::vector<ScheduledSeq> seqs(prompts.size());
      for (size_t j = 0; j < prompts.size(); ++j) {
        seqs[j].prompt = prompts[j];
        // The first sequence prefills at once, so it decodes while the
        // others are still prefilling.
        seqs[j].chunk = j == 0 ? 0 : chunk;
      }
      RunSchedule(*m, kv, blocks, seqs, kBlockSize, kDecodeSteps);
      for (size_t j = 0; j < prompts.size(); ++j) {
        ASSERT_EQ(seqs[j].logits.size(), alone[j].size());
        for (size_t step = 0; step < alone[j].size(); ++step) {
          EXPECT_TRUE(BitIdentical(seqs[j].logits[step], alone[j][step]))
              << "prompt " << j << " step " << step;
        }
      }
    }
  }
}

}  // namespace tandem::model::testing
