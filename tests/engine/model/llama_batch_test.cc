// Batch invariance and the per-layer hook: a sequence's logits are
// bit-identical alone, batched with others, with any prefill chunking and
// with any thread count (DESIGN.md, Engine: batch-invariant numerics).
#include <algorithm>
#include <cstring>
#include <memory>
#include <random>
#include <span>
#include <string>
#include <thread>
#include <tuple>
#include <vector>

#include "absl/strings/str_cat.h"

#include "engine/kv/block_pool.h"
#include "engine/kv/cpu_kv_storage.h"
#include "engine/model/llama_model.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "tests/engine/model/model_test_util.h"
#include "tests/test_util.h"

namespace tandem::model {
namespace {

using testing::LoadedModel;
using testing::LoadSharedModel;

constexpr int32_t kBlockSize = 16;
constexpr int kDecodeSteps = 6;

using Seq = testing::ScheduledSeq;
using testing::BitIdentical;

void RunSchedule(const LlamaModel& model, kv::CpuKvStorage& kv, kv::BlockPool& blocks,
                 std::vector<Seq>& seqs) {
  testing::RunSchedule(model, kv, blocks, seqs, kBlockSize, kDecodeSteps);
}

// A model configuration for the thread tests: thread count, and whether
// every kernel is split however small (min parallel work 0), so that even
// decode-size matrices and uneven splits run on several threads.
struct ThreadConfig {
  int32_t threads;
  bool split_everything;
};

std::string Describe(const ThreadConfig& t) {
  return absl::StrCat(t.threads, " threads", t.split_everything ? ", every kernel split" : "");
}

constexpr ThreadConfig kThreadConfigs[] = {{1, false}, {2, false}, {2, true}, {3, true}};

LoadedModel LoadWithThreads(const ThreadConfig& t) {
  LoadedModel m = LoadSharedModel("stories260K.gguf", t.threads);
  if (m.model != nullptr) {
    EXPECT_EQ(m.model->num_threads(), t.threads);
    if (t.split_everything) m.model->set_min_parallel_work_for_testing(0);
  }
  return m;
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
  std::vector<std::vector<float>> Alone(size_t i) { return Alone(model(), prompts_[i]); }
  static std::vector<std::vector<float>> Alone(const LlamaModel& m,
                                               const std::vector<int32_t>& prompt) {
    kv::CpuKvStorage kv(m.kv_shape(kBlockSize), 64);
    kv::BlockPool blocks(64);
    std::vector<Seq> seqs(1);
    seqs[0].prompt = prompt;
    RunSchedule(m, kv, blocks, seqs);
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
    kv::CpuKvStorage kv(model().kv_shape(kBlockSize), 64);
    kv::BlockPool blocks(64);
    std::vector<Seq> seqs(which.size());
    for (size_t j = 0; j < which.size(); ++j) {
      seqs[j].prompt = prompts_[which[j]];
      // The first sequence always prefills at once, so it decodes while the
      // others are still prefilling.
      seqs[j].chunk = j == 0 ? 0 : chunk;
    }
    RunSchedule(model(), kv, blocks, seqs);
    for (size_t j = 0; j < which.size(); ++j) {
      ASSERT_EQ(seqs[j].logits.size(), alone[j].size());
      for (size_t step = 0; step < alone[j].size(); ++step) {
        EXPECT_TRUE(BitIdentical(seqs[j].logits[step], alone[j][step]))
            << "prompt " << which[j] << " step " << step;
      }
    }
  }
}

// With any thread count the hook runs on the calling thread, in entry
// order, after each layer's K/V is in the cache and before the next layer's.
TEST_F(LlamaBatchTest, HookSeesEveryLayerAfterItsKvIsWritten) {
  for (const ThreadConfig& t : kThreadConfigs) {
    SCOPED_TRACE(Describe(t));
    LoadedModel loaded = LoadWithThreads(t);
    ASSERT_NE(loaded.model, nullptr);
    const LlamaModel& m = *loaded.model;
    const kv::KvShape shape = m.kv_shape(4);
    kv::CpuKvStorage kv(shape, 16);
    kv::BlockPool blocks(16);
    const std::vector<int32_t> table_a = *blocks.Allocate(2);  // blocks 0, 1
    const std::vector<int32_t> table_b = *blocks.Allocate(3);  // blocks 2, 3, 4
    const std::vector<int32_t>& prompt_a = prompts_[0];      // 5 tokens
    const std::vector<int32_t>& prompt_b = prompts_[1];      // 12 tokens
    std::vector<float> logits;

    // B's first 3 tokens go in beforehand, so its chunk starts at position 3.
    SequenceBatch first;
    first.tokens = std::span<const int32_t>(prompt_b).first(3);
    first.block_table = &table_b;
    first.want_logits = false;
    m.Forward(std::span<const SequenceBatch>(&first, 1), kv, &logits);
    EXPECT_TRUE(logits.empty());

    std::vector<SequenceBatch> batch(2);
    batch[0].tokens = prompt_a;
    batch[0].block_table = &table_a;
    batch[1].tokens = std::span<const int32_t>(prompt_b).subspan(3, 6);  // positions 3..8
    batch[1].start_pos = 3;
    batch[1].block_table = &table_b;

    std::vector<std::tuple<size_t, int32_t, int32_t, int32_t>> calls;
    const std::thread::id caller = std::this_thread::get_id();
    const size_t dim = static_cast<size_t>(shape.kv_dim());
    LayerHook hook = [&](size_t seq, int32_t layer, int32_t start, int32_t count) {
      calls.emplace_back(seq, layer, start, count);
      EXPECT_EQ(std::this_thread::get_id(), caller);
      // This layer's rows are in the cache; the next layer's are not yet.
      const std::vector<int32_t>& table = seq == 0 ? table_a : table_b;
      std::vector<float> k(static_cast<size_t>(count) * dim), v(k.size());
      kv::ReadKvRows(kv, table, layer, start, count, k.data(), v.data());
      EXPECT_TRUE(std::any_of(k.begin(), k.end(), [](float x) { return x != 0.0f; }));
      if (layer + 1 < shape.n_layers) {
        kv::ReadKvRows(kv, table, layer + 1, start, count, k.data(), v.data());
        EXPECT_TRUE(std::all_of(k.begin(), k.end(), [](float x) { return x == 0.0f; }));
      }
    };
    m.Forward(batch, kv, &logits, &hook);
    EXPECT_EQ(logits.size(), 2u * static_cast<size_t>(m.config().vocab_size));

    std::vector<std::tuple<size_t, int32_t, int32_t, int32_t>> expected;
    for (int32_t layer = 0; layer < shape.n_layers; ++layer) {
      expected.emplace_back(0, layer, 0, 5);
      expected.emplace_back(1, layer, 3, 6);
    }
    EXPECT_EQ(calls, expected);
  }
}

// n prompts of BOS plus 0..47 random token ids (fixed seed).
std::vector<std::vector<int32_t>> RandomPrompts(size_t n, int32_t vocab) {
  std::mt19937 rng(20240603);
  std::uniform_int_distribution<int32_t> len(1, 48), id(0, vocab - 1);
  std::vector<std::vector<int32_t>> prompts(n);
  for (std::vector<int32_t>& p : prompts) {
    p.push_back(1);
    const int32_t extra = len(rng) - 1;
    for (int32_t i = 0; i < extra; ++i) p.push_back(id(rng));
  }
  return prompts;
}

TEST_F(LlamaBatchTest, LogitsIdenticalAloneForAnyThreadCount) {
  std::vector<std::vector<std::vector<float>>> reference;
  for (size_t i = 0; i < prompts_.size(); ++i) reference.push_back(Alone(i));
  for (const ThreadConfig& t : kThreadConfigs) {
    SCOPED_TRACE(Describe(t));
    LoadedModel m = LoadWithThreads(t);
    ASSERT_NE(m.model, nullptr);
    for (size_t i = 0; i < prompts_.size(); ++i) {
      const std::vector<std::vector<float>> got = Alone(*m.model, prompts_[i]);
      ASSERT_EQ(got.size(), reference[i].size());
      for (size_t step = 0; step < got.size(); ++step) {
        EXPECT_TRUE(BitIdentical(got[step], reference[i][step]))
            << "prompt " << i << " step " << step;
      }
    }
  }
}

// Every golden prompt and 15 random ones run together, all prefilled in
// chunks of 1, 7 or 64 tokens beside each other's decode steps, with 1, 2
// and 3 threads: each sequence's logits at every step equal, bit for bit,
// those of the prompt alone, prefilled at once, with 1 thread.
TEST_F(LlamaBatchTest, LogitsIdenticalBatchedWithRandomPromptsChunkedAndThreaded) {
  std::vector<std::vector<int32_t>> prompts = prompts_;
  for (std::vector<int32_t>& p : RandomPrompts(15, model().config().vocab_size)) {
    prompts.push_back(std::move(p));
  }
  std::vector<std::vector<std::vector<float>>> reference;
  for (const std::vector<int32_t>& p : prompts) reference.push_back(Alone(model(), p));

  for (const ThreadConfig& t : kThreadConfigs) {
    LoadedModel m = LoadWithThreads(t);
    ASSERT_NE(m.model, nullptr);
    for (int32_t chunk : {1, 7, 64}) {
      SCOPED_TRACE(::testing::Message() << Describe(t) << ", chunk " << chunk);
      kv::CpuKvStorage kv(m.model->kv_shape(kBlockSize), 256);
      kv::BlockPool blocks(256);
      std::vector<Seq> seqs(prompts.size());
      for (size_t j = 0; j < prompts.size(); ++j) {
        seqs[j].prompt = prompts[j];
        seqs[j].chunk = chunk;
      }
      RunSchedule(*m.model, kv, blocks, seqs);
      for (size_t j = 0; j < prompts.size(); ++j) {
        ASSERT_EQ(seqs[j].logits.size(), reference[j].size());
        for (size_t step = 0; step < reference[j].size(); ++step) {
          EXPECT_TRUE(BitIdentical(seqs[j].logits[step], reference[j][step]))
              << "prompt " << j << " step " << step;
        }
      }
    }
  }
}

TEST(LlamaModelThreadsTest, NumThreadsOutsideOneTo256IsInvalidArgument) {
  absl::StatusOr<std::unique_ptr<gguf::GgufFile>> file =
      gguf::GgufFile::Open(tandem::testing::SharedPath("models/stories260K.gguf"));
  ASSERT_TRUE(file.ok()) << file.status();
  for (int32_t n : {0, -1, 257}) {
    absl::StatusOr<std::unique_ptr<LlamaModel>> model = LlamaModel::Load(**file, n);
    EXPECT_EQ(model.status().code(), absl::StatusCode::kInvalidArgument) << n;
    EXPECT_THAT(model.status().message(), ::testing::HasSubstr("num_threads")) << n;
  }
  absl::StatusOr<std::unique_ptr<LlamaModel>> one = LlamaModel::Load(**file);
  ASSERT_TRUE(one.ok()) << one.status();
  EXPECT_EQ((*one)->num_threads(), 1);
  absl::StatusOr<std::unique_ptr<LlamaModel>> most = LlamaModel::Load(**file, 256);
  ASSERT_TRUE(most.ok()) << most.status();
  EXPECT_EQ((*most)->num_threads(), 256);
}

}  // namespace
}  // namespace tandem::model
