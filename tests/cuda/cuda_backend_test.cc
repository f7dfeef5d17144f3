// The CUDA backend on stories260K (../shared/models) in the accuracy mode
// (F32 weights kept F32, F32 KV, batch-invariant GEMMs): greedy ids equal
// llama.cpp's F32-KV goldens, a sequence's logits are bit-identical alone
// and in a batch, decode steps as CUDA graphs equal the same steps launched
// kernel by kernel, and the device sampling reduction builds the view the
// CPU's BuildSamplingView builds from the same row. Skips without a GPU.
#include <cuda_runtime.h>

#include <cmath>
#include <cstdint>
#include <cstring>
#include <memory>
#include <string>
#include <vector>

#include "engine/backend/cuda/cuda_backend.h"
#include "engine/backend/cuda/device_sampling.h"
#include "engine/kv/block_pool.h"
#include "engine/sampling/sampling_view.h"
#include "gtest/gtest.h"
#include "tests/engine/model/model_test_util.h"

namespace tandem::backend::cuda {
namespace {

using model::testing::LoadedModel;
using model::testing::LoadSharedModel;

constexpr int32_t kBlockSize = 16;
constexpr int32_t kBlocks = 512;

// Empty when a CUDA device is there, else why not.
std::string NoGpuReason() {
  int count = 0;
  const cudaError_t e = cudaGetDeviceCount(&count);
  if (e != cudaSuccess) return cudaGetErrorString(e);
  if (count == 0) return "no CUDA device";
  return "";
}

bool BitIdentical(const float* a, const float* b, size_t n) {
  return std::memcmp(a, b, n * sizeof(float)) == 0;
}

// One sequence driven step by step through a backend.
struct Seq {
  std::vector<int32_t> prompt;
  std::vector<int32_t> table;
  std::vector<int32_t> generated;
  int32_t fed = 0;  // tokens whose K/V are in the cache
  std::vector<std::vector<float>> logits;  // per generated token
};

class CudaBackendTest : public ::testing::Test {
 protected:
  void SetUp() override {
    const std::string why = NoGpuReason();
    if (!why.empty()) GTEST_SKIP() << "no CUDA GPU: " << why;
    loaded_ = LoadSharedModel("stories260K.gguf");
    ASSERT_NE(loaded_.model, nullptr);
    goldens_ = model::testing::LoadStoriesGoldens();
    ASSERT_TRUE(goldens_.contains("cases"));
    BackendOptions o;
    o.device = DeviceSpec{DeviceSpec::Kind::kCuda, 0};
    o.kv_cache_dtype = kv::KvDtype::kF32;
    o.block_size = kBlockSize;
    o.num_kv_blocks = kBlocks;
    o.num_kv_blocks_set = true;
    o.batch_invariant = true;
    o.keep_f32_weights = true;
    o.max_num_batched_tokens = 512;
    o.max_num_seqs = 8;
    absl::StatusOr<std::unique_ptr<CudaBackend>> b = CudaBackend::Create(*loaded_.model, o);
    ASSERT_TRUE(b.ok()) << b.status();
    backend_ = *std::move(b);
    ASSERT_EQ(backend_->kv_storage().num_blocks(), kBlocks);
    pool_ = std::make_unique<kv::BlockPool>(kBlocks);
    greedy_.temperature = 0.0f;
  }

  void NewSeq(Seq* s, const std::vector<int32_t>& prompt, int32_t n_new) {
    s->prompt = prompt;
    auto table = pool_->Allocate(kv::BlocksForTokens(
        static_cast<int32_t>(prompt.size()) + n_new, kBlockSize));
    ASSERT_TRUE(table.has_value());
    s->table = *table;
  }

  // One greedy step over `seqs`: each prefills its whole prompt (first
  // step) or decodes its last generated token; appends the chosen id and
  // the row's logits.
  void Step(std::vector<Seq*> seqs) {
    std::vector<ForwardEntry> batch(seqs.size());
    std::vector<std::vector<int32_t>> inputs(seqs.size());
    for (size_t i = 0; i < seqs.size(); ++i) {
      Seq& s = *seqs[i];
      if (s.fed == 0) {
        inputs[i] = s.prompt;
      } else {
        inputs[i] = {s.generated.back()};
      }
      batch[i].tokens = inputs[i];
      batch[i].start_pos = s.fed;
      batch[i].block_table = &s.table;
      batch[i].sampling = &greedy_;
    }
    std::vector<sampling::SamplingView> views;
    ASSERT_TRUE(backend_->Forward(batch, nullptr, &views).ok());
    ASSERT_EQ(views.size(), seqs.size());
    absl::StatusOr<std::vector<float>> logits = backend_->LastLogitsForTesting();
    ASSERT_TRUE(logits.ok()) << logits.status();
    const size_t vocab = static_cast<size_t>(backend_->config().vocab_size);
    ASSERT_EQ(logits->size(), seqs.size() * vocab);
    for (size_t i = 0; i < seqs.size(); ++i) {
      Seq& s = *seqs[i];
      s.fed += static_cast<int32_t>(inputs[i].size());
      ASSERT_EQ(views[i].candidates.size(), 1u);
      const float* row = logits->data() + i * vocab;
      // Greedy: the view's one candidate is the row's argmax (lowest id).
      const int32_t argmax = model::testing::Argmax(std::vector<float>(row, row + vocab));
      EXPECT_EQ(views[i].candidates[0].id, argmax);
      s.generated.push_back(views[i].candidates[0].id);
      s.logits.emplace_back(row, row + vocab);
    }
  }

  LoadedModel loaded_;
  nlohmann::json goldens_;
  std::unique_ptr<CudaBackend> backend_;
  std::unique_ptr<kv::BlockPool> pool_;
  sampling::SamplingOptions greedy_;
};

TEST_F(CudaBackendTest, GreedyIdsEqualF32KvGoldens) {
  for (const nlohmann::json& c : goldens_["cases"]) {
    SCOPED_TRACE(c["name"].get<std::string>());
    const auto prompt = c["prompt_token_ids_with_bos"].get<std::vector<int32_t>>();
    const auto expected = c["generated_token_ids_f32kv"].get<std::vector<int32_t>>();
    const size_t strict = c["strict_prefix_len_f32kv"].get<size_t>();
    Seq s;
    NewSeq(&s, prompt, static_cast<int32_t>(expected.size()));
    while (s.generated.size() < expected.size()) {
      Step({&s});
      if (::testing::Test::HasFatalFailure()) return;
    }
    EXPECT_EQ(std::vector<int32_t>(s.generated.begin(), s.generated.begin() + strict),
              std::vector<int32_t>(expected.begin(), expected.begin() + strict));
    for (const nlohmann::json& top : c["first_token_top5_f32kv"]) {
      const size_t id = top["id"].get<size_t>();
      ASSERT_LT(id, s.logits[0].size());
      EXPECT_NEAR(s.logits[0][id], top["logit"].get<double>(), 1e-2) << "token " << id;
    }
    // Every step of the strict prefix has llama.cpp's top-5 logits too.
    for (size_t step = 0; step < strict && step < c["steps"].size(); ++step) {
      if (!c["steps"][step].contains("top5_f32kv")) continue;
      for (const nlohmann::json& pair : c["steps"][step]["top5_f32kv"]) {
        const size_t id = pair[0].get<size_t>();
        ASSERT_LT(id, s.logits[step].size());
        EXPECT_NEAR(s.logits[step][id], pair[1].get<double>(), 1e-2)
            << "step " << step << " token " << id;
      }
    }
    pool_->Free(s.table);
  }
}

// Three sequences prefilled in one step and decoded together give each
// one's logits alone, bit for bit (batch_invariant); the decode steps
// together run as a CUDA graph of bucket 4 (one padding row), alone as
// graphs of bucket 1.
TEST_F(CudaBackendTest, BatchOfThreeEqualsEachAlone) {
  constexpr int kSteps = 4;
  std::vector<std::vector<int32_t>> prompts;
  for (size_t i = 0; i < 3; ++i) {
    prompts.push_back(
        goldens_["cases"][i]["prompt_token_ids_with_bos"].get<std::vector<int32_t>>());
  }
  std::vector<Seq> alone(3), together(3);
  for (size_t i = 0; i < 3; ++i) {
    NewSeq(&alone[i], prompts[i], kSteps);
    for (int step = 0; step < kSteps; ++step) Step({&alone[i]});
  }
  for (size_t i = 0; i < 3; ++i) NewSeq(&together[i], prompts[i], kSteps);
  for (int step = 0; step < kSteps; ++step) Step({&together[0], &together[1], &together[2]});
  for (size_t i = 0; i < 3; ++i) {
    ASSERT_EQ(together[i].generated, alone[i].generated) << "sequence " << i;
    for (int step = 0; step < kSteps; ++step) {
      const std::vector<float>& a = alone[i].logits[static_cast<size_t>(step)];
      const std::vector<float>& b = together[i].logits[static_cast<size_t>(step)];
      ASSERT_EQ(a.size(), b.size());
      EXPECT_TRUE(BitIdentical(a.data(), b.data(), a.size()))
          << "sequence " << i << " step " << step;
    }
  }
}

// Create captured every decode bucket (issue #16: no capture once NCCL
// runs): max_num_seqs 8 gives buckets 1, 2, 4, 8; CaptureGraphs again adds
// none, and decode steps of every size reuse them.
TEST_F(CudaBackendTest, CreateCapturesEveryGraphBucket) {
  EXPECT_EQ(backend_->captured_graphs(), GraphBuckets(8).size());
  EXPECT_EQ(backend_->captured_graphs(), 4u);
  ASSERT_TRUE(backend_->CaptureGraphs().ok());
  EXPECT_EQ(backend_->captured_graphs(), 4u);
  std::vector<Seq> seqs(5);
  std::vector<Seq*> all;
  for (size_t i = 0; i < seqs.size(); ++i) {
    NewSeq(&seqs[i], {1, static_cast<int32_t>(10 + i)}, 2);
    all.push_back(&seqs[i]);
  }
  Step(all);  // prefill
  Step(all);  // a decode of 5: bucket 8
  EXPECT_EQ(backend_->captured_graphs(), 4u);
}

// The same decode schedule with and without CUDA graphs (bucket 4, one
// padding row): same ids, same logits bit for bit. The 313-token prompt
// attends over two chunks.
TEST_F(CudaBackendTest, GraphsEqualKernelByKernel) {
  constexpr int kSteps = 6;
  std::vector<std::vector<Seq>> runs(2, std::vector<Seq>(3));
  for (int graphs = 0; graphs < 2; ++graphs) {
    backend_->set_use_cuda_graphs(graphs == 1);
    std::vector<Seq>& seqs = runs[static_cast<size_t>(graphs)];
    for (size_t i = 0; i < seqs.size(); ++i) {
      NewSeq(&seqs[i], goldens_["cases"][i + 1]["prompt_token_ids_with_bos"]
                           .get<std::vector<int32_t>>(),
             kSteps);
    }
    for (int step = 0; step < kSteps; ++step) Step({&seqs[0], &seqs[1], &seqs[2]});
  }
  for (size_t i = 0; i < 3; ++i) {
    EXPECT_EQ(runs[0][i].generated, runs[1][i].generated);
    for (int step = 0; step < kSteps; ++step) {
      const std::vector<float>& a = runs[0][i].logits[static_cast<size_t>(step)];
      const std::vector<float>& b = runs[1][i].logits[static_cast<size_t>(step)];
      EXPECT_TRUE(BitIdentical(a.data(), b.data(), a.size()))
          << "sequence " << i << " step " << step;
    }
  }
}

// The views the device reduction builds equal BuildSamplingView's on the
// same row, field by field (raw_log_sum to rounding: the device sums in a
// tree order); rows the device cannot serve are counted as fallbacks.
TEST_F(CudaBackendTest, DeviceViewsEqualHostViews) {
  const auto prompt =
      goldens_["cases"][0]["prompt_token_ids_with_bos"].get<std::vector<int32_t>>();
  std::vector<sampling::SamplingOptions> options(5);
  options[0].temperature = 0.0f;  // greedy, with logprobs
  options[0].top_logprobs = 5;
  options[1].temperature = 0.7f;  // top_k, temperature only
  options[1].top_k = 40;
  options[1].top_logprobs = 3;
  options[2].temperature = 1.0f;  // min_p widening
  options[2].min_p = 0.001f;
  options[3].temperature = 1.0f;  // top_p alone: the host's
  options[3].top_p = 0.9f;
  options[4].temperature = 0.8f;  // a penalty: the host's
  options[4].top_k = 10;
  options[4].repetition_penalty = 1.3f;
  std::vector<std::vector<int32_t>> tables;
  std::vector<ForwardEntry> batch(options.size());
  for (size_t i = 0; i < options.size(); ++i) {
    auto table =
        pool_->Allocate(kv::BlocksForTokens(static_cast<int32_t>(prompt.size()), kBlockSize));
    ASSERT_TRUE(table.has_value());
    tables.push_back(*table);
  }
  for (size_t i = 0; i < options.size(); ++i) {
    batch[i].tokens = prompt;
    batch[i].block_table = &tables[i];
    batch[i].sampling = &options[i];
    batch[i].history.prompt = prompt;
  }
  const int64_t fallbacks = backend_->host_sampling_fallbacks();
  std::vector<sampling::SamplingView> views;
  ASSERT_TRUE(backend_->Forward(batch, nullptr, &views).ok());
  EXPECT_EQ(backend_->host_sampling_fallbacks() - fallbacks, 2);
  absl::StatusOr<std::vector<float>> logits = backend_->LastLogitsForTesting();
  ASSERT_TRUE(logits.ok()) << logits.status();
  const size_t vocab = static_cast<size_t>(backend_->config().vocab_size);
  for (size_t i = 0; i < options.size(); ++i) {
    SCOPED_TRACE(::testing::Message() << "options " << i);
    sampling::SamplingView host;
    sampling::BuildSamplingView(std::span<const float>(logits->data() + i * vocab, vocab),
                                options[i], batch[i].history, &host);
    const sampling::SamplingView& dev = views[i];
    ASSERT_EQ(dev.candidates.size(), host.candidates.size());
    for (size_t j = 0; j < host.candidates.size(); ++j) {
      EXPECT_EQ(dev.candidates[j].id, host.candidates[j].id) << j;
      EXPECT_EQ(dev.candidates[j].logit, host.candidates[j].logit) << j;
      EXPECT_EQ(dev.candidates[j].raw_logit, host.candidates[j].raw_logit) << j;
    }
    EXPECT_EQ(dev.complete, host.complete);
    EXPECT_EQ(dev.raw_max, host.raw_max);
    EXPECT_NEAR(dev.raw_log_sum, host.raw_log_sum, 1e-12);
    EXPECT_EQ(dev.normaliser == 0.0, host.normaliser == 0.0);
    ASSERT_EQ(dev.raw_top.size(), host.raw_top.size());
    for (size_t j = 0; j < host.raw_top.size(); ++j) {
      EXPECT_EQ(dev.raw_top[j].id, host.raw_top[j].id) << j;
      EXPECT_NEAR(dev.raw_top[j].logprob, host.raw_top[j].logprob, 1e-6) << j;
    }
  }
}

// The per-layer hook runs once per (layer, entry) in that order, and a
// ReadTokens inside it sees exactly what the layer wrote (it waits for the
// layer's event): the same bytes as a read after the step.
TEST_F(CudaBackendTest, HookReadsEachLayerAsWritten) {
  const auto p0 = goldens_["cases"][1]["prompt_token_ids_with_bos"].get<std::vector<int32_t>>();
  const auto p1 = goldens_["cases"][3]["prompt_token_ids_with_bos"].get<std::vector<int32_t>>();
  Seq a, b;
  NewSeq(&a, p0, 1);
  NewSeq(&b, p1, 1);
  std::vector<ForwardEntry> batch(2);
  batch[0].tokens = p0;
  batch[0].block_table = &a.table;
  batch[1].tokens = p1;
  batch[1].block_table = &b.table;
  batch[1].sampling = &greedy_;
  kv::KvStorage& storage = backend_->kv_storage();
  const int32_t layers = backend_->config().n_layers;
  const size_t row = storage.row_bytes();
  std::vector<std::vector<char>> during(2 * static_cast<size_t>(layers));
  std::vector<std::string> calls;
  LayerHook hook = [&](size_t entry, int32_t layer, int32_t start, int32_t count) {
    calls.push_back(std::to_string(layer) + ":" + std::to_string(entry) + ":" +
                    std::to_string(start) + ":" + std::to_string(count));
    std::vector<char>& out = during[static_cast<size_t>(layer) * 2 + entry];
    out.resize(2 * static_cast<size_t>(count) * row);
    storage.ReadTokens(*batch[entry].block_table, layer, start, count, out.data(),
                       out.data() + static_cast<size_t>(count) * row);
  };
  std::vector<sampling::SamplingView> views;
  ASSERT_TRUE(backend_->Forward(batch, &hook, &views).ok());
  ASSERT_EQ(views.size(), 1u);
  std::vector<std::string> expected;
  for (int32_t l = 0; l < layers; ++l) {
    expected.push_back(std::to_string(l) + ":0:0:" + std::to_string(p0.size()));
    expected.push_back(std::to_string(l) + ":1:0:" + std::to_string(p1.size()));
  }
  EXPECT_EQ(calls, expected);
  for (int32_t l = 0; l < layers; ++l) {
    for (size_t e = 0; e < 2; ++e) {
      const size_t count = batch[e].tokens.size();
      std::vector<char> after(2 * count * row);
      storage.ReadTokens(*batch[e].block_table, l, 0, static_cast<int32_t>(count), after.data(),
                         after.data() + count * row);
      EXPECT_EQ(during[static_cast<size_t>(l) * 2 + e], after) << "layer " << l << " entry " << e;
    }
  }
}

TEST_F(CudaBackendTest, ReportsItsClassAndPlan) {
  const std::string cls = backend_->bit_exact_class();
  EXPECT_EQ(cls.rfind("tandem-cuda/sm_", 0), 0u) << cls;
  EXPECT_NE(cls.find("/bi/f32/v1"), std::string::npos) << cls;
  EXPECT_EQ(backend_->memory_plan().num_blocks, kBlocks);
  EXPECT_FALSE(backend_->device_lost());
}

}  // namespace
}  // namespace tandem::backend::cuda
