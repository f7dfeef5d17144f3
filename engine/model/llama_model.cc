#include "engine/model/llama_model.h"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <vector>

#include "absl/strings/str_cat.h"
#include "engine/model/cpu_kernels.h"
#include "engine/model/llama_weights.h"
#include "xxhash.h"

namespace tandem::model {
namespace {

using internal::AddInPlace;
using internal::MatMul;
using internal::RmsNorm;

// Aborts on a broken precondition of Forward (a caller bug, never input
// bytes): continuing would read or write outside the KV pool.
void Require(bool ok, const char* what) {
  if (!ok) {
    std::fprintf(stderr, "LlamaModel::Forward: precondition failed: %s\n", what);
    std::abort();
  }
}

// One row of the flattened batch.
struct Row {
  int32_t token;
  int32_t pos;
  size_t entry;
};

// Causal attention of one query row over positions [0, pos] of its
// sequence, reading K/V from the paged cache. q: [n_head][head_dim];
// out: [n_head][head_dim]; scores: scratch of at least pos + 1 floats.
// Per head: s_j = Dot(q, k_j) * scale; p_j = exp(s_j - max) / sum (sum in
// double, j ascending); out = sum_j p_j * v_j (j ascending). The order
// depends only on pos, so every batch shape gives the same bits.
void AttendRow(const LlamaConfig& c, const kv::BlockPool& pool,
               const std::vector<int32_t>& table, int32_t layer, int32_t pos,
               const float* q, float* out, std::vector<float>& scores) {
  const size_t hd = static_cast<size_t>(c.head_dim);
  const size_t kv_dim = static_cast<size_t>(c.n_head_kv) * hd;
  const int32_t bs = pool.shape().block_size;
  const int32_t group = c.n_head / c.n_head_kv;
  const float scale = 1.0f / std::sqrt(static_cast<float>(c.head_dim));
  for (int32_t h = 0; h < c.n_head; ++h) {
    const size_t kv_off = static_cast<size_t>(h / group) * hd;
    const float* qh = q + static_cast<size_t>(h) * hd;
    float max = -INFINITY;
    for (int32_t j = 0; j <= pos; ++j) {
      const float* k = pool.K(table[static_cast<size_t>(j / bs)], layer) +
                       static_cast<size_t>(j % bs) * kv_dim + kv_off;
      const float s = internal::Dot(qh, k, hd) * scale;
      scores[static_cast<size_t>(j)] = s;
      max = std::max(max, s);
    }
    double sum = 0.0;
    for (int32_t j = 0; j <= pos; ++j) {
      const float e = std::exp(scores[static_cast<size_t>(j)] - max);
      scores[static_cast<size_t>(j)] = e;
      sum += e;
    }
    const float inv = static_cast<float>(1.0 / sum);
    float* oh = out + static_cast<size_t>(h) * hd;
    std::fill(oh, oh + hd, 0.0f);
    for (int32_t j = 0; j <= pos; ++j) {
      const float p = scores[static_cast<size_t>(j)] * inv;
      const float* v = pool.V(table[static_cast<size_t>(j / bs)], layer) +
                       static_cast<size_t>(j % bs) * kv_dim + kv_off;
      for (size_t d = 0; d < hd; ++d) oh[d] += p * v[d];
    }
  }
}

}  // namespace

absl::StatusOr<std::unique_ptr<LlamaModel>> LlamaModel::Load(const gguf::GgufFile& file) {
  absl::StatusOr<LlamaConfig> config = internal::ReadLlamaConfig(file);
  if (!config.ok()) return config.status();
  absl::StatusOr<std::unique_ptr<internal::ModelWeights>> weights =
      internal::LoadLlamaWeights(file, *config);
  if (!weights.ok()) return weights.status();
  std::unique_ptr<LlamaModel> model(new LlamaModel());
  model->config_ = *std::move(config);
  model->w_ = std::move(*weights);
  return model;
}

kv::KvShape LlamaModel::kv_shape(int32_t block_size) const {
  kv::KvShape s;
  s.n_layers = config_.n_layers;
  s.n_kv_heads = config_.n_head_kv;
  s.head_dim = config_.head_dim;
  s.block_size = block_size;
  return s;
}

void LlamaModel::Forward(std::span<const SequenceBatch> batch, kv::BlockPool& kv,
                         std::vector<float>* logits, const LayerHook* hook) const {
  const LlamaConfig& c = config_;
  const kv::KvShape& ks = kv.shape();
  Require(ks.n_layers == c.n_layers && ks.n_kv_heads == c.n_head_kv &&
              ks.head_dim == c.head_dim,
          "KV pool shape differs from the model's kv_shape()");

  // Flatten the batch; row r of every activation buffer is rows[r].
  std::vector<Row> rows;
  size_t n_logits = 0;
  for (size_t e = 0; e < batch.size(); ++e) {
    const SequenceBatch& sb = batch[e];
    const int32_t n = static_cast<int32_t>(sb.tokens.size());
    Require(sb.block_table != nullptr, "block_table is null");
    Require(sb.start_pos >= 0, "start_pos < 0");
    Require(static_cast<int64_t>(sb.block_table->size()) * ks.block_size >=
                static_cast<int64_t>(sb.start_pos) + n,
            "block table does not cover start_pos + n_tokens");
    for (int32_t b : *sb.block_table) {
      Require(b >= 0 && b < kv.num_blocks(), "block id outside the KV pool");
    }
    for (int32_t i = 0; i < n; ++i) {
      const int32_t t = sb.tokens[static_cast<size_t>(i)];
      Require(t >= 0 && t < c.vocab_size, "token id outside [0, vocab_size)");
      rows.push_back({t, sb.start_pos + i, e});
    }
    if (sb.want_logits && n > 0) ++n_logits;
  }
  Require(logits != nullptr || n_logits == 0, "logits is null but an entry wants logits");

  const size_t T = rows.size();
  const size_t embd = static_cast<size_t>(c.n_embd);
  const size_t hd = static_cast<size_t>(c.head_dim);
  const size_t q_dim = static_cast<size_t>(c.n_head) * hd;
  const size_t kv_dim = static_cast<size_t>(c.n_head_kv) * hd;
  const size_t ff = static_cast<size_t>(c.n_ff);
  const size_t vocab = static_cast<size_t>(c.vocab_size);
  const internal::ModelWeights& w = *w_;

  std::vector<float> x(T * embd), norm(T * embd), tmp(T * embd);
  std::vector<float> q(T * q_dim), attn(T * q_dim), k(T * kv_dim), v(T * kv_dim);
  std::vector<float> gate(T * ff), up(T * ff);
  int32_t max_pos = 0;
  for (size_t r = 0; r < T; ++r) {
    const float* emb = w.token_embd.data + static_cast<size_t>(rows[r].token) * embd;
    std::copy(emb, emb + embd, x.begin() + static_cast<std::ptrdiff_t>(r * embd));
    max_pos = std::max(max_pos, rows[r].pos);
  }
  std::vector<float> scores(static_cast<size_t>(max_pos) + 1);

  for (int32_t l = 0; l < c.n_layers; ++l) {
    const internal::LayerWeights& lw = w.layers[static_cast<size_t>(l)];
    RmsNorm(x.data(), lw.attn_norm.data, T, embd, c.rms_norm_eps, norm.data());
    MatMul(norm.data(), lw.wq.data, T, embd, q_dim, q.data());
    MatMul(norm.data(), lw.wk.data, T, embd, kv_dim, k.data());
    MatMul(norm.data(), lw.wv.data, T, embd, kv_dim, v.data());
    for (size_t r = 0; r < T; ++r) {
      internal::RopeNorm(&q[r * q_dim], static_cast<size_t>(c.n_head), hd,
                         static_cast<size_t>(c.rope_dim), rows[r].pos, c.rope_freq_base);
      internal::RopeNorm(&k[r * kv_dim], static_cast<size_t>(c.n_head_kv), hd,
                         static_cast<size_t>(c.rope_dim), rows[r].pos, c.rope_freq_base);
    }
    // New K/V into the cache first, so rows attend to their own chunk.
    size_t first = 0;
    for (size_t e = 0; e < batch.size(); ++e) {
      const int32_t n = static_cast<int32_t>(batch[e].tokens.size());
      kv::WriteKvRows(kv, *batch[e].block_table, l, batch[e].start_pos, n,
                      &k[first * kv_dim], &v[first * kv_dim]);
      first += static_cast<size_t>(n);
    }
    if (hook != nullptr && *hook) {
      for (size_t e = 0; e < batch.size(); ++e) {
        (*hook)(e, l, batch[e].start_pos, static_cast<int32_t>(batch[e].tokens.size()));
      }
    }
    for (size_t r = 0; r < T; ++r) {
      AttendRow(c, kv, *batch[rows[r].entry].block_table, l, rows[r].pos, &q[r * q_dim],
                &attn[r * q_dim], scores);
    }
    MatMul(attn.data(), lw.wo.data, T, q_dim, embd, tmp.data());
    AddInPlace(x.data(), tmp.data(), T * embd);

    RmsNorm(x.data(), lw.ffn_norm.data, T, embd, c.rms_norm_eps, norm.data());
    MatMul(norm.data(), lw.w_gate.data, T, embd, ff, gate.data());
    MatMul(norm.data(), lw.w_up.data, T, embd, ff, up.data());
    internal::SwiGlu(gate.data(), up.data(), T * ff);
    MatMul(gate.data(), lw.w_down.data, T, ff, embd, tmp.data());
    AddInPlace(x.data(), tmp.data(), T * embd);
  }

  if (logits == nullptr) return;
  logits->assign(n_logits * vocab, 0.0f);
  size_t first = 0, out = 0;
  for (const SequenceBatch& sb : batch) {
    first += sb.tokens.size();
    if (!sb.want_logits || sb.tokens.empty()) continue;
    const float* last = &x[(first - 1) * embd];
    RmsNorm(last, w.output_norm.data, 1, embd, c.rms_norm_eps, norm.data());
    MatMul(norm.data(), w.output.data, 1, embd, vocab, logits->data() + out * vocab);
    ++out;
  }
}

absl::StatusOr<std::string> ModelFingerprint(const gguf::GgufFile& file) {
  std::ifstream in(file.path(), std::ios::binary);
  if (!in) return absl::UnavailableError(absl::StrCat(file.path(), ": cannot read model file"));
  XXH3_state_t* state = XXH3_createState();
  if (state == nullptr) return absl::ResourceExhaustedError("XXH3_createState failed");
  XXH3_128bits_reset(state);
  std::vector<char> buf(1 << 20);
  uint64_t total = 0;
  while (in) {
    in.read(buf.data(), static_cast<std::streamsize>(buf.size()));
    const std::streamsize got = in.gcount();
    if (got <= 0) break;
    XXH3_128bits_update(state, buf.data(), static_cast<size_t>(got));
    total += static_cast<uint64_t>(got);
  }
  const bool read_error = in.bad();
  XXH128_canonical_t canonical;
  XXH128_canonicalFromHash(&canonical, XXH3_128bits_digest(state));
  XXH3_freeState(state);
  if (read_error) {
    return absl::UnavailableError(absl::StrCat(file.path(), ": error reading model file"));
  }
  if (total != file.file_size()) {
    return absl::DataLossError(absl::StrCat(file.path(), ": file is ", total,
                                            " bytes, the mapping ", file.file_size()));
  }
  static constexpr char kHex[] = "0123456789abcdef";
  std::string hex;
  for (unsigned char byte : canonical.digest) {
    hex.push_back(kHex[byte >> 4]);
    hex.push_back(kHex[byte & 0xf]);
  }
  return hex;
}

}  // namespace tandem::model
