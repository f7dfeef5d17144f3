#include "engine/model/llama_model.h"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <vector>

#include "absl/strings/str_cat.h"
#include "engine/model/attention.h"
#include "engine/model/cpu_kernels.h"
#include "engine/model/llama_weights.h"
#include "engine/model/thread_pool.h"
#include "xxhash.h"

namespace tandem::model {
namespace {

using internal::AddBias;
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

// The unit of attention work: one query head of `n_rows` (1 or 2)
// consecutive rows of one entry from `row` on, or every head of one row
// (head kAllHeads).
struct HeadRow {
  static constexpr uint32_t kAllHeads = ~uint32_t{0};
  uint32_t row;
  uint32_t head;
  uint32_t n_rows = 1;
};

// The attention work, entry by entry. A prefill chunk (an entry of several
// rows) gives its rows in pairs (AttendHeadPair: a pair reads its K/V
// rows once), head-major, so the chunk reads one head's K/V slice while it
// is in cache; a decode entry (one row) gives one kAllHeads unit, which
// reads its K/V rows once, whole (AttendRow), rather than one strided
// slice per head.
std::vector<HeadRow> AttentionOrder(const std::vector<Row>& rows, size_t n_head) {
  std::vector<HeadRow> order;
  order.reserve(rows.size() * n_head);
  for (size_t first = 0; first < rows.size();) {
    size_t last = first;
    while (last < rows.size() && rows[last].entry == rows[first].entry) ++last;
    if (last == first + 1) {
      order.push_back({static_cast<uint32_t>(first), HeadRow::kAllHeads});
    } else {
      for (size_t h = 0; h < n_head; ++h) {
        for (size_t r = first; r < last; r += 2) {
          order.push_back(
              {static_cast<uint32_t>(r), static_cast<uint32_t>(h), r + 1 < last ? 2u : 1u});
        }
      }
    }
    first = last;
  }
  return order;
}

// Splits `order` into `parts` contiguous ranges of about equal attention
// cost (a head of a row at position pos costs pos + 1, a kAllHeads unit
// n_head times that, a pair the sum of its rows'), so causal prefill rows,
// whose cost grows with position, still share the work evenly. Returns
// parts + 1 boundaries.
std::vector<size_t> BalancedBounds(const std::vector<HeadRow>& order, const std::vector<Row>& rows,
                                   size_t n_head, size_t parts) {
  auto cost = [&](const HeadRow& p) {
    size_t positions = 0;
    for (uint32_t i = 0; i < p.n_rows; ++i) {
      positions += static_cast<size_t>(rows[p.row + i].pos) + 1;
    }
    return positions * (p.head == HeadRow::kAllHeads ? n_head : 1);
  };
  size_t total = 0;
  for (const HeadRow& p : order) total += cost(p);
  std::vector<size_t> bounds(parts + 1, order.size());
  bounds[0] = 0;
  size_t part = 1, done = 0;
  for (size_t p = 0; p < order.size() && part < parts; ++p) {
    // Unit p starts the next part once the parts before it hold their share.
    while (part < parts && done >= total * part / parts) bounds[part++] = p;
    done += cost(order[p]);
  }
  return bounds;
}

// Forward's activation buffers, reused from call to call on one thread.
struct ForwardScratch {
  std::vector<float> x, norm, tmp, q, attn, k, v, gate, up, rope;
};

// `buffer` with at least n elements (contents unspecified).
std::vector<float>& AtLeast(std::vector<float>& buffer, size_t n) {
  if (buffer.size() < n) buffer.resize(n);
  return buffer;
}

}  // namespace

LlamaModel::LlamaModel() : min_parallel_work_(internal::kMinParallelWork) {}
LlamaModel::~LlamaModel() = default;

absl::StatusOr<std::unique_ptr<LlamaModel>> LlamaModel::Load(const gguf::GgufFile& file) {
  return Load(file, 1);
}

absl::StatusOr<std::unique_ptr<LlamaModel>> LlamaModel::Load(const gguf::GgufFile& file,
                                                             int32_t num_threads) {
  LlamaModelOptions options;
  options.num_threads = num_threads;
  return Load(file, options);
}

absl::StatusOr<std::unique_ptr<LlamaModel>> LlamaModel::Load(const gguf::GgufFile& file,
                                                             const LlamaModelOptions& options) {
  const int32_t num_threads = options.num_threads;
  if (num_threads < 1 || num_threads > kMaxThreads) {
    return absl::InvalidArgumentError(
        absl::StrCat("num_threads is ", num_threads, ", expected 1 to ", kMaxThreads));
  }
  absl::StatusOr<LlamaConfig> config = internal::ReadLlamaConfig(file);
  if (!config.ok()) return config.status();
  absl::StatusOr<std::unique_ptr<internal::ModelWeights>> weights =
      internal::LoadLlamaWeights(file, *config);
  if (!weights.ok()) return weights.status();
  const bool all_int8 =
      options.q8_matmul == Q8MatMul::kInt8 && internal::PackQ8Int8(weights->get());
  const bool all_f32_panels = options.f32_panels && internal::PackF32Panels(weights->get());
  std::unique_ptr<LlamaModel> model(new LlamaModel());
  model->all_matmuls_f32_panels_ = all_f32_panels;
  model->all_matmuls_int8_ = all_int8;
  model->f32_panels_ = options.f32_panels;
  model->q8_matmul_ = options.q8_matmul;
  model->config_ = *std::move(config);
  model->w_ = std::move(*weights);
  model->num_threads_ = num_threads;
  if (num_threads > 1) model->pool_ = std::make_unique<ThreadPool>(num_threads);
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

void LlamaModel::For(size_t n, size_t work, const std::function<void(size_t, size_t)>& fn) const {
  MaybeParallelFor(pool_.get(), n, work, min_parallel_work_, fn);
}

void LlamaModel::Forward(std::span<const SequenceBatch> batch, kv::CpuKvStorage& kv,
                         std::vector<float>* logits, const LayerHook* hook) const {
  const LlamaConfig& c = config_;
  const kv::KvShape& ks = kv.shape();
  Require(ks.n_layers == c.n_layers && ks.n_kv_heads == c.n_head_kv && ks.head_dim == c.head_dim,
          "KV pool shape differs from the model's kv_shape()");

  // Flatten the batch; row r of every activation buffer is rows[r].
  std::vector<Row> rows;
  std::vector<size_t> logit_rows;  // last row of each entry that wants logits
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
    if (sb.want_logits && n > 0) logit_rows.push_back(rows.size() - 1);
  }
  Require(logits != nullptr || logit_rows.empty(), "logits is null but an entry wants logits");

  const size_t T = rows.size();
  const size_t embd = static_cast<size_t>(c.n_embd);
  const size_t n_head = static_cast<size_t>(c.n_head);
  const size_t hd = static_cast<size_t>(c.head_dim);
  const size_t q_dim = n_head * hd;
  const size_t kv_dim = static_cast<size_t>(c.n_head_kv) * hd;
  const size_t ff = static_cast<size_t>(c.n_ff);
  const size_t vocab = static_cast<size_t>(c.vocab_size);
  const internal::ModelWeights& w = *w_;
  ThreadPool* const pool = pool_.get();
  const size_t min_work = min_parallel_work_;

  // Activations, kept per calling thread across calls: large prefills would
  // otherwise map (and page-fault in) fresh buffers every step. Every
  // element used is written before it is read.
  thread_local ForwardScratch scratch;
  std::vector<float>& x = AtLeast(scratch.x, T * embd);
  std::vector<float>& norm = AtLeast(scratch.norm, T * embd);
  std::vector<float>& tmp = AtLeast(scratch.tmp, T * embd);
  std::vector<float>& q = AtLeast(scratch.q, T * q_dim);
  std::vector<float>& attn = AtLeast(scratch.attn, T * q_dim);
  std::vector<float>& k = AtLeast(scratch.k, T * kv_dim);
  std::vector<float>& v = AtLeast(scratch.v, T * kv_dim);
  std::vector<float>& gate = AtLeast(scratch.gate, T * ff);
  std::vector<float>& up = AtLeast(scratch.up, T * ff);
  int32_t max_pos = 0;
  size_t attn_work = 0;  // multiply-adds of one layer's attention
  for (size_t r = 0; r < T; ++r) {
    internal::DequantizeRows(w.token_embd.view, static_cast<size_t>(rows[r].token), 1,
                             &x[r * embd]);
    max_pos = std::max(max_pos, rows[r].pos);
    attn_work += (static_cast<size_t>(rows[r].pos) + 1) * 2 * q_dim;
  }
  const size_t attn_parts = pool == nullptr ? 1 : static_cast<size_t>(num_threads_);
  const size_t group = n_head / static_cast<size_t>(c.n_head_kv);
  const float attn_scale = 1.0f / std::sqrt(static_cast<float>(c.head_dim));
  // RoPE's cos/sin per row, once for all layers (a pow and a sincos per
  // pair, ~16 multiply-adds).
  const size_t rope_dim = static_cast<size_t>(c.rope_dim);
  const float* const freq_factors = c.rope_freq_factors ? w.rope_freqs.data : nullptr;
  std::vector<float>& rope = AtLeast(scratch.rope, T * rope_dim);
  For(T, T * rope_dim * 8, [&](size_t begin, size_t end) {
    for (size_t r = begin; r < end; ++r) {
      internal::RopeAngles(rows[r].pos, rope_dim, c.rope_freq_base, freq_factors,
                           &rope[r * rope_dim]);
    }
  });
  const std::vector<HeadRow> attn_order = AttentionOrder(rows, n_head);
  const std::vector<size_t> attn_bounds = BalancedBounds(attn_order, rows, n_head, attn_parts);
  // Scores per attention part: a pair of rows' (max_pos + 1 keys each, +1
  // spare), or every head's where a decode row is attended whole
  // (AttendRow).
  const bool any_all_heads =
      std::any_of(attn_order.begin(), attn_order.end(),
                  [](const HeadRow& p) { return p.head == HeadRow::kAllHeads; });
  const size_t scores_size =
      std::max<size_t>(any_all_heads ? n_head : 1, 2) * (static_cast<size_t>(max_pos) + 2);

  // RoPE of one row's n heads in the architecture's pairing.
  auto rope_apply = [&](float* x, size_t n, const float* cs) {
    switch (c.rope_type) {
      case RopeType::kNorm:
        internal::RopeApply(x, n, hd, rope_dim, cs);
        return;
      case RopeType::kNeox:
        internal::RopeApplyNeox(x, n, hd, rope_dim, cs);
        return;
    }
  };

  // Row-wise RMSNorm of x into norm; each row is computed alone.
  auto rms_norm = [&](const internal::Tensor& weight) {
    For(T, T * embd, [&](size_t begin, size_t end) {
      RmsNorm(&x[begin * embd], weight.data, end - begin, embd, c.rms_norm_eps,
              &norm[begin * embd]);
    });
  };

  for (int32_t l = 0; l < c.n_layers; ++l) {
    const internal::LayerWeights& lw = w.layers[static_cast<size_t>(l)];
    rms_norm(lw.attn_norm);
    MatMul(norm.data(), lw.wq.view, T, q.data(), pool, min_work);
    MatMul(norm.data(), lw.wk.view, T, k.data(), pool, min_work);
    MatMul(norm.data(), lw.wv.view, T, v.data(), pool, min_work);
    // Biases, then RoPE: elementwise, row by row.
    For(T, T * (q_dim + 2 * kv_dim), [&](size_t begin, size_t end) {
      if (c.qkv_bias) {
        AddBias(&q[begin * q_dim], lw.bq.data, end - begin, q_dim);
        AddBias(&k[begin * kv_dim], lw.bk.data, end - begin, kv_dim);
        AddBias(&v[begin * kv_dim], lw.bv.data, end - begin, kv_dim);
      }
      for (size_t r = begin; r < end; ++r) {
        rope_apply(&q[r * q_dim], n_head, &rope[r * rope_dim]);
        rope_apply(&k[r * kv_dim], static_cast<size_t>(c.n_head_kv), &rope[r * rope_dim]);
      }
    });
    // New K/V into the cache first, so rows attend to their own chunk; the
    // hook then sees this layer complete. Both on the calling thread.
    size_t first = 0;
    for (size_t e = 0; e < batch.size(); ++e) {
      const int32_t n = static_cast<int32_t>(batch[e].tokens.size());
      kv::WriteKvRows(kv, *batch[e].block_table, l, batch[e].start_pos, n, &k[first * kv_dim],
                      &v[first * kv_dim]);
      first += static_cast<size_t>(n);
    }
    if (hook != nullptr && *hook) {
      for (size_t e = 0; e < batch.size(); ++e) {
        (*hook)(e, l, batch[e].start_pos, static_cast<int32_t>(batch[e].tokens.size()));
      }
    }
    For(attn_parts, attn_work, [&](size_t part_begin, size_t part_end) {
      // Per worker thread, reused across layers and calls.
      thread_local std::vector<float> scores_buffer;
      std::vector<float>& scores = AtLeast(scores_buffer, scores_size);
      for (size_t p = attn_bounds[part_begin]; p < attn_bounds[part_end]; ++p) {
        const size_t r = attn_order[p].row, h = attn_order[p].head;
        const Row& row = rows[r];
        internal::AttentionSpan span;
        span.pool = &kv;
        span.block_table = *batch[row.entry].block_table;
        span.layer = l;
        span.pos = row.pos;
        if (h == HeadRow::kAllHeads) {
          internal::AttendRow(span, n_head, &q[r * q_dim], attn_scale, &attn[r * q_dim],
                              scores.data());
          continue;
        }
        span.kv_head = static_cast<int32_t>(h / group);
        if (attn_order[p].n_rows == 2) {
          span.pos = rows[r + 1].pos;
          internal::AttendHeadPair(
              span, row.pos, &q[r * q_dim + h * hd], &q[(r + 1) * q_dim + h * hd], attn_scale,
              &attn[r * q_dim + h * hd], &attn[(r + 1) * q_dim + h * hd], scores.data());
          continue;
        }
        internal::AttendHead(span, &q[r * q_dim + h * hd], attn_scale, &attn[r * q_dim + h * hd],
                             scores.data());
      }
    });
    MatMul(attn.data(), lw.wo.view, T, tmp.data(), pool, min_work);
    AddInPlace(x.data(), tmp.data(), T * embd);

    rms_norm(lw.ffn_norm);
    MatMul(norm.data(), lw.w_gate.view, T, gate.data(), pool, min_work);
    MatMul(norm.data(), lw.w_up.view, T, up.data(), pool, min_work);
    // SwiGLU costs an exp and a division per element, ~8 multiply-adds.
    For(T * ff, T * ff * 8,
        [&](size_t begin, size_t end) { internal::SwiGlu(&gate[begin], &up[begin], end - begin); });
    MatMul(gate.data(), lw.w_down.view, T, tmp.data(), pool, min_work);
    AddInPlace(x.data(), tmp.data(), T * embd);
  }

  if (logits == nullptr) return;
  // The wanted rows, normed and projected together: each logit still follows
  // MatMul's fixed per-element order over its own row, so batching them
  // changes no bit.
  const size_t n_logits = logit_rows.size();
  for (size_t i = 0; i < n_logits; ++i) {
    RmsNorm(&x[logit_rows[i] * embd], w.output_norm.data, 1, embd, c.rms_norm_eps, &norm[i * embd]);
  }
  logits->resize(n_logits * vocab);
  MatMul(norm.data(), w.output.view, n_logits, logits->data(), pool, min_work);
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
    return absl::DataLossError(
        absl::StrCat(file.path(), ": file is ", total, " bytes, the mapping ", file.file_size()));
  }
  static constexpr char kHex[] = "0123456789abcdef";
  std::string hex;
  for (unsigned char byte : canonical.digest) {
    hex.push_back(kHex[byte >> 4]);
    hex.push_back(kHex[byte & 0xf]);
  }
  return hex;
}

const char* KernelIsa() { return internal::KernelIsa(); }

absl::Status PinKernelIsa(const std::string& name) {
  using internal::KernelIsaKind;
  if (name == "auto") return absl::OkStatus();
  KernelIsaKind isa;
  if (name == "avx512") {
    isa = KernelIsaKind::kAvx512;
  } else if (name == "avx2") {
    isa = KernelIsaKind::kAvx2;
  } else if (name == "generic") {
    isa = KernelIsaKind::kGeneric;
  } else {
    return absl::InvalidArgumentError(
        absl::StrCat("kernel ISA must be auto, avx512, avx2 or generic, got '", name, "'"));
  }
  if (!internal::PinKernelIsa(isa)) {
    return absl::FailedPreconditionError(
        absl::StrCat("kernel ISA ", name, " is not available (this CPU runs up to ",
                     internal::KernelIsaSupported(KernelIsaKind::kAvx512) ? "avx512"
                     : internal::KernelIsaSupported(KernelIsaKind::kAvx2) ? "avx2"
                                                                          : "generic",
                     "; in use: ", internal::KernelIsa(), ")"));
  }
  return absl::OkStatus();
}

}  // namespace tandem::model
