#include "tests/decode_worker/worker_test_util.h"

#include <algorithm>
#include <span>
#include <utility>

#include "engine/backend/cpu_backend.h"
#include "gtest/gtest.h"
#include "nlohmann/json.hpp"
#include "tests/test_util.h"

namespace tandem::worker_testing {

void ExpectStoriesShape(const model::LlamaConfig& c) {
  EXPECT_EQ(c.n_layers, kStoriesLayers);
  EXPECT_EQ(c.n_head_kv, kStoriesKvHeads);
  EXPECT_EQ(c.head_dim, kStoriesHeadDim);
  EXPECT_EQ(c.vocab_size, kStoriesVocab);
  EXPECT_EQ(c.context_length, kStoriesContext);
}

TestModel LoadStories() {
  TestModel out;
  auto file = gguf::GgufFile::Open(tandem::testing::SharedPath("models/stories260K.gguf"));
  if (!file.ok()) {
    ADD_FAILURE() << file.status();
    return out;
  }
  out.file = *std::move(file);
  auto model = model::LlamaModel::Load(*out.file);
  if (!model.ok()) {
    ADD_FAILURE() << model.status();
    out.file.reset();
    return out;
  }
  out.model = *std::move(model);
  return out;
}

void StoriesTest::SetUp() {
  loaded_ = LoadStories();
  ASSERT_NE(loaded_.model, nullptr);
  ExpectStoriesShape(loaded_.model->config());
}

namespace {

std::vector<GoldenCase> ParseGoldens() {
  std::vector<GoldenCase> cases;
  try {
    const nlohmann::json j = nlohmann::json::parse(tandem::testing::ReadFileOrDie(
        tandem::testing::SharedPath("goldens/stories260K_greedy.json")));
    for (const nlohmann::json& c : j.at("cases")) {
      GoldenCase g;
      g.name = c.at("name").get<std::string>();
      g.prompt = c.at("prompt_token_ids_with_bos").get<std::vector<int32_t>>();
      g.generated = c.at("generated_token_ids_f32kv").get<std::vector<int32_t>>();
      g.strict = c.at("strict_prefix_len_f32kv").get<size_t>();
      cases.push_back(std::move(g));
    }
  } catch (const nlohmann::json::exception& e) {
    ADD_FAILURE() << "stories260K_greedy.json: " << e.what();
    cases.clear();
  }
  return cases;
}

}  // namespace

const std::vector<GoldenCase>& GoldenCases() {
  static const std::vector<GoldenCase>* cases = new std::vector<GoldenCase>(ParseGoldens());
  return *cases;
}

GoldenCase Golden(const std::string& name) {
  for (const GoldenCase& c : GoldenCases()) {
    if (c.name == name) return c;
  }
  ADD_FAILURE() << "golden case " << name << " not found";
  return GoldenCase{};
}

std::vector<int32_t> Prefix(const std::vector<int32_t>& ids, size_t n) {
  return std::vector<int32_t>(ids.begin(), ids.begin() + std::min(n, ids.size()));
}

PromptKv ComputePromptKv(const model::LlamaModel& model, const std::vector<int32_t>& prompt,
                         int32_t block_size) {
  PromptKv out;
  const int32_t blocks = kv::BlocksForTokens(static_cast<int32_t>(prompt.size()), block_size);
  out.pool = std::make_unique<kv::CpuKvStorage>(model.kv_shape(block_size), blocks);
  for (int32_t b = 0; b < blocks; ++b) out.table.push_back(b);
  model::SequenceBatch entry;
  entry.tokens = prompt;
  entry.start_pos = 0;
  entry.block_table = &out.table;
  entry.want_logits = true;
  model.Forward(std::span<const model::SequenceBatch>(&entry, 1), *out.pool, &out.logits);
  return out;
}

std::vector<float> LayerRows(const kv::KvStorage& pool, const std::vector<int32_t>& table,
                             int32_t layer, int32_t start, int32_t count) {
  const size_t n = static_cast<size_t>(count) * static_cast<size_t>(pool.shape().kv_dim());
  std::vector<float> rows(2 * n);
  kv::ReadKvRows(pool, table, layer, start, count, rows.data(), rows.data() + n);
  return rows;
}

absl::Status SendPromptKv(kvtransfer::KvSender& sender, const PromptKv& kv,
                          int32_t n_layers, int32_t start, int32_t end) {
  const size_t n = static_cast<size_t>(end - start) *
                   static_cast<size_t>(kv.pool->shape().kv_dim());
  for (int32_t layer = 0; layer < n_layers; ++layer) {
    std::vector<float> rows = LayerRows(*kv.pool, kv.table, layer, start, end - start);
    absl::Status s = sender.SendFrame(static_cast<uint32_t>(layer),
                                      static_cast<uint32_t>(start),
                                      static_cast<uint32_t>(end - start), rows.data(),
                                      rows.data() + n);
    if (!s.ok()) return s;
  }
  return absl::OkStatus();
}

void PoolKvWriter::WriteRows(uint32_t layer, uint32_t token_start, uint32_t token_count,
                             const char* k, const char* v) {
  pool_->WriteTokens(table_, static_cast<int32_t>(layer), static_cast<int32_t>(token_start),
                     static_cast<int32_t>(token_count), k, v);
}

kvtransfer::KvLayout StoriesLayout(const model::LlamaModel& model,
                                   const std::string& fingerprint) {
  kvtransfer::KvLayout layout;
  layout.model_fingerprint = fingerprint;
  layout.n_layers = static_cast<uint32_t>(model.config().n_layers);
  layout.n_kv_heads = static_cast<uint32_t>(model.config().n_head_kv);
  layout.head_dim = static_cast<uint32_t>(model.config().head_dim);
  layout.dtype = kvtransfer::KvDtype::kF32;
  return layout;
}

core::EngineCoreOptions CoreOptions(const WorkerOptions& o, const std::string& label) {
  core::EngineCoreOptions c;
  c.scheduler.max_local_prefill_tokens = o.max_local_prefill_tokens;
  c.eog_token_ids = {2};  // stories260K's end-of-generation set: its EOS
  c.model_fingerprint = o.fingerprint;
  c.worker_label = label;
  return c;
}

std::unique_ptr<TestDecodeWorker> TestDecodeWorker::Create(const WorkerOptions& options,
                                                           const model::LlamaModel* model) {
  kvtransfer::KvReceiver::Options r;
  r.handshake_timeout_ms = options.handshake_timeout_ms;
  r.transfer_timeout_ms = options.transfer_timeout_ms;
  auto receiver =
      decode::ReceiverKvLoader::Start(r, StoriesLayout(*model, options.fingerprint));
  if (!receiver.ok()) {
    ADD_FAILURE() << receiver.status();
    return nullptr;
  }
  auto worker = std::make_unique<TestDecodeWorker>();
  worker->receiver_ = receiver->get();
  worker->core_ = std::make_unique<core::EngineCore>(
      CoreOptions(options, "decode worker"),
      std::make_unique<backend::CpuBackend>(model, options.block_size, options.num_kv_blocks),
      *std::move(receiver));
  return worker;
}

absl::Status TestDecodeWorker::Submit(core::EngineRequest request,
                                      std::shared_ptr<core::RequestOutput> output) {
  request.output = std::move(output);
  return core_->Submit(std::move(request));
}

TestPrefillWorker::TestPrefillWorker(const WorkerOptions& options,
                                     const model::LlamaModel* model) {
  send_.layout = StoriesLayout(*model, options.fingerprint);
  send_.bit_exact_class = backend::CpuBitExactClass(*model, kv::KvDtype::kF32);
  send_.transfer_timeout_ms = options.transfer_timeout_ms;
  send_.fault_stall_after_frames = options.fault_stall_after_frames;
  send_.send_buffer_bytes = options.send_buffer_bytes;
  const absl::Status started = prefill::StartKvSendQueue(&send_);
  EXPECT_TRUE(started.ok()) << started;
  core_ = std::make_unique<core::EngineCore>(
      CoreOptions(options, "prefill worker"),
      std::make_unique<backend::CpuBackend>(model, options.block_size, options.num_kv_blocks),
      nullptr);
}

prefill::PrefillDone PrefillDoneRecorder::Callback() {
  return [this](absl::StatusOr<prefill::PrefillResult> result) {
    absl::MutexLock lock(&mu_);
    ++calls_;
    result_ = std::move(result);
  };
}

std::optional<absl::StatusOr<prefill::PrefillResult>> PrefillDoneRecorder::Wait(
    absl::Duration timeout) {
  absl::MutexLock lock(&mu_);
  auto ready = [this]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) { return result_.has_value(); };
  mu_.AwaitWithTimeout(absl::Condition(&ready), timeout);
  return result_;
}

int PrefillDoneRecorder::calls() const {
  absl::MutexLock lock(&mu_);
  return calls_;
}

kvtransfer::KvReceiver::DoneCallback KvDoneRecorder::Callback() {
  return [this](absl::Status status, const kvtransfer::TransferResult& result) {
    absl::MutexLock lock(&mu_);
    ++calls_;
    status_ = std::move(status);
    result_ = result;
  };
}

bool KvDoneRecorder::Wait(absl::Duration timeout) {
  absl::MutexLock lock(&mu_);
  auto ready = [this]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) { return calls_ > 0; };
  return mu_.AwaitWithTimeout(absl::Condition(&ready), timeout);
}

int KvDoneRecorder::calls() const {
  absl::MutexLock lock(&mu_);
  return calls_;
}

absl::Status KvDoneRecorder::status() const {
  absl::MutexLock lock(&mu_);
  return status_;
}

kvtransfer::TransferResult KvDoneRecorder::result() const {
  absl::MutexLock lock(&mu_);
  return result_;
}

}  // namespace tandem::worker_testing
