#include "engine/backend/cpu_backend.h"

#include "absl/strings/str_cat.h"

namespace tandem::backend {

std::string CpuBitExactClass(const model::LlamaModel& model, kv::KvDtype kv_dtype) {
  const char* matmul = model.all_matmuls_int8()         ? "int8"
                       : model.all_matmuls_f32_panels() ? "fma"
                                                        : model::KernelIsa();
  return absl::StrCat("tandem-cpu/", matmul, "/", model.q8_matmul_name(), "/",
                      kv::KvDtypeName(kv_dtype), "/v4");
}

CpuBackend::CpuBackend(const model::LlamaModel* model, int32_t block_size, int32_t num_blocks,
                       kv::KvDtype kv_dtype)
    : model_(model), storage_(model->kv_shape(block_size), num_blocks, kv_dtype) {}

absl::Status CpuBackend::Forward(std::span<const ForwardEntry> batch, const LayerHook* hook,
                                 std::vector<sampling::SamplingView>* views) {
  entries_.clear();
  size_t num_views = 0;
  for (const ForwardEntry& e : batch) {
    model::SequenceBatch sb;
    sb.tokens = e.tokens;
    sb.start_pos = e.start_pos;
    sb.block_table = e.block_table;
    sb.want_logits = e.sampling != nullptr;
    num_views += sb.want_logits ? 1 : 0;
    entries_.push_back(sb);
  }
  model_->Forward(entries_, storage_, num_views > 0 ? &logits_ : nullptr, hook);
  views->resize(num_views);
  const size_t vocab = static_cast<size_t>(model_->config().vocab_size);
  size_t row = 0;
  for (const ForwardEntry& e : batch) {
    if (e.sampling == nullptr) continue;
    sampling::BuildSamplingView(std::span<const float>(logits_.data() + row * vocab, vocab),
                                *e.sampling, e.history, &(*views)[row], &scratch_);
    ++row;
  }
  return absl::OkStatus();
}

}  // namespace tandem::backend
