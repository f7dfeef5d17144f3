// Batch invariance and the per-layer hook: a sequence's logits are
// bit-identical alone, batched with others, and with any prefill chunking
// (DESIGN.md, Engine: batch-invariant numerics).
#include <algorithm>
#include <cstring>
#include <span>
#include <tuple>
#include <vector>

#include "engine/kv/block_pool.h"
#include "engine/model/llama_model.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "tests/engine/model/model_test_util.h"

namespace tandem::model {
namespace {

using testing::Argmax;
using testing::LoadedModel;
using testing::LoadSharedModel;

constexpr int32_t kBlockSize = 16;
constexpr int kDecodeSteps = 6;

// One sequence driven by RunSchedule: prefill in chunks of `chunk` tokens
// (0 = all at once), then greedy decode.
struct Seq {
  std::vector<int32_t> prompt;
  int32_t chunk = 0;
  std::vector<int32_t> table;
  int32_t fed = 0;
  std::vector<int32_t> generated;
  std::vector<std::vector<float>> logits;  // one per generated token
};

// Steps every sequence forward together (continuous batching: prefill
// chunks of some sequences beside decode tokens of others) until each has
// kDecodeSteps tokens.
void RunSchedule(const LlamaModel& model, kv::BlockPool& pool, std::vector<Seq>& seqs) {
  for (Seq& s : seqs) {
    auto t = pool.Allocate(kv::BlocksForTokens(
        static_cast<int32_t>(s.prompt.size()) + kDecodeSteps, kBlockSize));
    ASSERT_TRUE(t.has_value());
    s.table = *t;
  }
  for (;;) {
    std::vector<SequenceBatch> batch;
    std::vector<Seq*> owners;
    for (Seq& s : seqs) {
      if (static_cast<int>(s.generated.size()) == kDecodeSteps) continue;
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
    model.Forward(batch, pool, &logits);
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

class LlamaBatchTest : public ::testing::Test {
 protected:
  void SetUp() override {
    loaded_ = LoadSharedModel("stories260K.gguf");
    ASSERT_NE(loaded_.model, nullptr);
    const nlohmann::json goldens = testing::LoadStoriesGoldens();
    for (const nlohmann::json& c : goldens["cases"]) {
      prompts_.push_back(c["prompt_token_ids_with_bos"].get<std::vector<int32_t>>());
    }
    ASSERT_EQ(prompts_.size(), 6u);
  }
  const LlamaModel& model() const { return *loaded_.model; }

  // Logits of prompt i alone, prefilled at once.
  std::vector<std::vector<float>> Alone(size_t i) {
    kv::BlockPool pool(model().kv_shape(kBlockSize), 64);
    std::vector<Seq> seqs(1);
    seqs[0].prompt = prompts_[i];
    RunSchedule(model(), pool, seqs);
    return seqs[0].logits;
  }

  LoadedModel loaded_;
  std::vector<std::vector<int32_t>> prompts_;
};

TEST_F(LlamaBatchTest, LogitsIdenticalAloneBatchedAndChunked) {
  // Prompts 0 (5 tokens), 1 (12) and 3 (313) under several chunkings, all
  // in one batch and interleaved with each other's decode steps.
  const std::vector<size_t> which = {0, 1, 3};
  std::vector<std::vector<std::vector<float>>> alone;
  for (size_t i : which) alone.push_back(Alone(i));

  for (int32_t chunk : {1, 7, 0}) {
    SCOPED_TRACE(::testing::Message() << "chunk " << chunk);
    kv::BlockPool pool(model().kv_shape(kBlockSize), 64);
    std::vector<Seq> seqs(which.size());
    for (size_t j = 0; j < which.size(); ++j) {
      seqs[j].prompt = prompts_[which[j]];
      // The first sequence always prefills at once, so it decodes while the
      // others are still prefilling.
      seqs[j].chunk = j == 0 ? 0 : chunk;
    }
    RunSchedule(model(), pool, seqs);
    for (size_t j = 0; j < which.size(); ++j) {
      ASSERT_EQ(seqs[j].logits.size(), alone[j].size());
      for (size_t step = 0; step < alone[j].size(); ++step) {
        EXPECT_TRUE(BitIdentical(seqs[j].logits[step], alone[j][step]))
            << "prompt " << which[j] << " step " << step;
      }
    }
  }
}

TEST_F(LlamaBatchTest, HookSeesEveryLayerAfterItsKvIsWritten) {
  const kv::KvShape shape = model().kv_shape(4);
  kv::BlockPool pool(shape, 16);
  const std::vector<int32_t> table_a = *pool.Allocate(2);  // blocks 0, 1
  const std::vector<int32_t> table_b = *pool.Allocate(3);  // blocks 2, 3, 4
  const std::vector<int32_t>& prompt_a = prompts_[0];      // 5 tokens
  const std::vector<int32_t>& prompt_b = prompts_[1];      // 12 tokens
  std::vector<float> logits;

  // B's first 3 tokens go in beforehand, so its chunk starts at position 3.
  SequenceBatch first;
  first.tokens = std::span<const int32_t>(prompt_b).first(3);
  first.block_table = &table_b;
  first.want_logits = false;
  model().Forward(std::span<const SequenceBatch>(&first, 1), pool, &logits);
  EXPECT_TRUE(logits.empty());

  std::vector<SequenceBatch> batch(2);
  batch[0].tokens = prompt_a;
  batch[0].block_table = &table_a;
  batch[1].tokens = std::span<const int32_t>(prompt_b).subspan(3, 6);  // positions 3..8
  batch[1].start_pos = 3;
  batch[1].block_table = &table_b;

  std::vector<std::tuple<size_t, int32_t, int32_t, int32_t>> calls;
  const size_t dim = static_cast<size_t>(shape.kv_dim());
  LayerHook hook = [&](size_t seq, int32_t layer, int32_t start, int32_t count) {
    calls.emplace_back(seq, layer, start, count);
    // This layer's rows are in the cache; the next layer's are not yet.
    const std::vector<int32_t>& table = seq == 0 ? table_a : table_b;
    std::vector<float> k(static_cast<size_t>(count) * dim), v(k.size());
    kv::ReadKvRows(pool, table, layer, start, count, k.data(), v.data());
    EXPECT_TRUE(std::any_of(k.begin(), k.end(), [](float x) { return x != 0.0f; }));
    if (layer + 1 < shape.n_layers) {
      kv::ReadKvRows(pool, table, layer + 1, start, count, k.data(), v.data());
      EXPECT_TRUE(std::all_of(k.begin(), k.end(), [](float x) { return x == 0.0f; }));
    }
  };
  model().Forward(batch, pool, &logits, &hook);
  EXPECT_EQ(logits.size(), 2u * static_cast<size_t>(model().config().vocab_size));

  std::vector<std::tuple<size_t, int32_t, int32_t, int32_t>> expected;
  for (int32_t layer = 0; layer < shape.n_layers; ++layer) {
    expected.emplace_back(0, layer, 0, 5);
    expected.emplace_back(1, layer, 3, 6);
  }
  EXPECT_EQ(calls, expected);
}

}  // namespace
}  // namespace tandem::model
