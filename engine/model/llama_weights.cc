#include "engine/model/llama_weights.h"

#include <cmath>
#include <cstring>
#include <limits>
#include <string>
#include <variant>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"

namespace tandem::model::internal {
namespace {

// Upper bound for hidden sizes and head counts: keeps every product of two
// of them far inside int64 and each size inside int32.
constexpr uint64_t kMaxDim = uint64_t{1} << 20;
constexpr uint64_t kMaxVocab = uint64_t{1} << 24;

// The metadata value under `key` as an int32 in [1, max], or INVALID_ARGUMENT
// naming the key (a missing key included).
absl::StatusOr<int32_t> RequiredDim(const gguf::GgufFile& file, const std::string& key,
                                    uint64_t max) {
  absl::StatusOr<uint64_t> v = file.GetUint(key);
  if (!v.ok()) return absl::InvalidArgumentError(v.status().message());
  if (*v == 0 || *v > max) {
    return absl::InvalidArgumentError(absl::StrCat(file.path(), ": metadata key '", key,
                                                   "' must be in [1, ", max, "], got ", *v));
  }
  return static_cast<int32_t>(*v);
}

// Like RequiredDim, but `fallback` when the key is absent.
absl::StatusOr<int32_t> OptionalDim(const gguf::GgufFile& file, const std::string& key,
                                    uint64_t max, int32_t fallback) {
  if (file.Find(key) == nullptr) return fallback;
  return RequiredDim(file, key, max);
}

// A finite float > 0 under `key`; `fallback` when absent unless required.
absl::StatusOr<float> PositiveFloat(const gguf::GgufFile& file, const std::string& key,
                                    std::optional<float> fallback) {
  if (file.Find(key) == nullptr && fallback.has_value()) return *fallback;
  absl::StatusOr<float> v = file.GetFloat(key);
  if (!v.ok()) return absl::InvalidArgumentError(v.status().message());
  if (!(std::isfinite(*v) && *v > 0.0f)) {
    return absl::InvalidArgumentError(absl::StrCat(
        file.path(), ": metadata key '", key, "' must be finite and > 0, got ", *v));
  }
  return *v;
}

absl::Status ConfigError(const gguf::GgufFile& file, absl::string_view what) {
  return absl::InvalidArgumentError(absl::StrCat(file.path(), ": ", what));
}

std::string ShapeString(const std::vector<uint64_t>& dims) {
  return absl::StrCat("[", absl::StrJoin(dims, ", "), "]");
}

// The tensor `name` with exactly `dims` (ne0 first), checked against its
// type's byte size; INVALID_ARGUMENT naming it otherwise.
absl::StatusOr<const gguf::TensorInfo*> FindTensor(const gguf::GgufFile& file,
                                                   const std::string& name,
                                                   const std::vector<uint64_t>& dims) {
  const gguf::TensorInfo* info = file.FindTensor(name);
  if (info == nullptr) {
    return absl::InvalidArgumentError(
        absl::StrCat(file.path(), ": missing tensor '", name, "'"));
  }
  if (info->dims != dims) {
    return absl::InvalidArgumentError(absl::StrCat(file.path(), ": tensor '", name,
                                                   "' has shape ", ShapeString(info->dims),
                                                   ", expected ", ShapeString(dims)));
  }
  // Rows must be whole blocks (ne0 a multiple of 32 for Q8_0) for a row to
  // start at a block boundary; TensorBytes checks that of ne0 alone.
  const std::optional<uint64_t> row_bytes = gguf::TensorBytes(info->type, dims[0]);
  const std::optional<uint64_t> bytes = gguf::TensorBytes(info->type, info->NumElements());
  if (!row_bytes.has_value() || !bytes.has_value() || *bytes != info->n_bytes) {
    return absl::InvalidArgumentError(
        absl::StrCat(file.path(), ": tensor '", name, "' of type ",
                     std::string(gguf::TensorTypeName(info->type)), " has ", info->n_bytes,
                     " bytes and rows of ", dims[0],
                     " elements, which do not match its type's block size"));
  }
  return info;
}

absl::StatusOr<Tensor> LoadVector(const gguf::GgufFile& file, const std::string& name,
                                  uint64_t n) {
  absl::StatusOr<const gguf::TensorInfo*> info = FindTensor(file, name, {n});
  if (!info.ok()) return info.status();
  Tensor t;
  if ((*info)->type == gguf::TensorType::kF32 &&
      reinterpret_cast<uintptr_t>((*info)->data) % alignof(float) == 0) {
    t.data = reinterpret_cast<const float*>((*info)->data);
    return t;
  }
  t.owned.resize(n);
  ConvertToF32((*info)->type, (*info)->data, n, t.owned.data());
  t.data = t.owned.data();
  return t;
}

// The matrix `name` of GGUF dims [in, out], in its storage type.
absl::StatusOr<Matrix> LoadMatrix(const gguf::GgufFile& file, const std::string& name,
                                  uint64_t in, uint64_t out) {
  absl::StatusOr<const gguf::TensorInfo*> info = FindTensor(file, name, {in, out});
  if (!info.ok()) return info.status();
  Matrix m;
  m.view = {(*info)->type, (*info)->data, in, out};
  if ((*info)->type == gguf::TensorType::kF32 &&
      reinterpret_cast<uintptr_t>((*info)->data) % alignof(float) != 0) {
    m.owned.resize(in * out);
    std::memcpy(m.owned.data(), (*info)->data, in * out * sizeof(float));
    m.view.data = reinterpret_cast<const uint8_t*>(m.owned.data());
  }
  return m;
}

}  // namespace

absl::StatusOr<LlamaConfig> ReadLlamaConfig(const gguf::GgufFile& file) {
  LlamaConfig c;
  absl::StatusOr<std::string> arch = file.GetString("general.architecture");
  if (!arch.ok()) return absl::InvalidArgumentError(arch.status().message());
  if (*arch != "llama") {
    return ConfigError(file, absl::StrCat("metadata key 'general.architecture' is '", *arch,
                                          "', expected 'llama'"));
  }
  c.architecture = *arch;
  if (absl::StatusOr<std::string> name = file.GetString("general.name"); name.ok()) {
    c.name = *name;
  }

  auto dim = [&](const char* suffix, uint64_t max) {
    return RequiredDim(file, absl::StrCat("llama.", suffix), max);
  };
  absl::StatusOr<int32_t> v = dim("context_length", std::numeric_limits<int32_t>::max());
  if (!v.ok()) return v.status();
  c.context_length = *v;
  if (!(v = dim("embedding_length", kMaxDim)).ok()) return v.status();
  c.n_embd = *v;
  if (!(v = dim("block_count", kMaxDim)).ok()) return v.status();
  c.n_layers = *v;
  if (!(v = dim("feed_forward_length", kMaxDim)).ok()) return v.status();
  c.n_ff = *v;
  if (!(v = dim("attention.head_count", kMaxDim)).ok()) return v.status();
  c.n_head = *v;
  if (!(v = OptionalDim(file, "llama.attention.head_count_kv", kMaxDim, c.n_head)).ok()) {
    return v.status();
  }
  c.n_head_kv = *v;
  if (c.n_embd % c.n_head != 0) {
    return ConfigError(file, absl::StrCat("llama.embedding_length ", c.n_embd,
                                          " is not a multiple of llama.attention.head_count ",
                                          c.n_head));
  }
  if (c.n_head % c.n_head_kv != 0) {
    return ConfigError(file, absl::StrCat("llama.attention.head_count ", c.n_head,
                                          " is not a multiple of "
                                          "llama.attention.head_count_kv ",
                                          c.n_head_kv));
  }
  c.head_dim = c.n_embd / c.n_head;
  if (!(v = OptionalDim(file, "llama.rope.dimension_count", kMaxDim, c.head_dim)).ok()) {
    return v.status();
  }
  c.rope_dim = *v;
  if (c.rope_dim > c.head_dim || c.rope_dim % 2 != 0) {
    return ConfigError(file, absl::StrCat("llama.rope.dimension_count ", c.rope_dim,
                                          " must be even and <= head dim ", c.head_dim));
  }
  absl::StatusOr<float> f = PositiveFloat(file, "llama.rope.freq_base", 10000.0f);
  if (!f.ok()) return f.status();
  c.rope_freq_base = *f;
  f = PositiveFloat(file, "llama.attention.layer_norm_rms_epsilon", std::nullopt);
  if (!f.ok()) return f.status();
  c.rms_norm_eps = *f;

  // Vocabulary: the tokenizer's token list, else llama.vocab_size.
  const gguf::MetadataValue* tokens = file.Find("tokenizer.ggml.tokens");
  if (tokens != nullptr) {
    const auto* list = std::get_if<std::vector<std::string>>(tokens);
    if (list == nullptr) {
      return ConfigError(file, "metadata key 'tokenizer.ggml.tokens' is not a string array");
    }
    if (list->empty() || list->size() > kMaxVocab) {
      return ConfigError(file, absl::StrCat("metadata key 'tokenizer.ggml.tokens' has ",
                                            list->size(), " entries, expected [1, ",
                                            kMaxVocab, "]"));
    }
    c.vocab_size = static_cast<int32_t>(list->size());
  } else {
    if (!(v = RequiredDim(file, "llama.vocab_size", kMaxVocab)).ok()) return v.status();
    c.vocab_size = *v;
  }
  return c;
}

absl::StatusOr<std::unique_ptr<ModelWeights>> LoadLlamaWeights(const gguf::GgufFile& file,
                                                               const LlamaConfig& c) {
  const uint64_t embd = static_cast<uint64_t>(c.n_embd);
  const uint64_t q_dim = static_cast<uint64_t>(c.n_head) * static_cast<uint64_t>(c.head_dim);
  const uint64_t kv_dim =
      static_cast<uint64_t>(c.n_head_kv) * static_cast<uint64_t>(c.head_dim);
  const uint64_t ff = static_cast<uint64_t>(c.n_ff);
  const uint64_t vocab = static_cast<uint64_t>(c.vocab_size);

  auto w = std::make_unique<ModelWeights>();
  absl::Status status;
  // Loads one tensor into `dst`, remembering the first error.
  auto keep = [&](auto& dst, auto loaded) {
    if (!status.ok()) return;
    if (loaded.ok()) {
      dst = *std::move(loaded);
    } else {
      status = loaded.status();
    }
  };
  auto vec = [&](Tensor& dst, const std::string& name) {
    if (status.ok()) keep(dst, LoadVector(file, name, embd));
  };
  auto mat = [&](Matrix& dst, const std::string& name, uint64_t in, uint64_t out) {
    if (status.ok()) keep(dst, LoadMatrix(file, name, in, out));
  };
  mat(w->token_embd, "token_embd.weight", embd, vocab);
  vec(w->output_norm, "output_norm.weight");
  if (file.FindTensor("output.weight") != nullptr) {
    mat(w->output, "output.weight", embd, vocab);
  } else {
    w->output.view = w->token_embd.view;  // tied embeddings
  }
  w->layers.resize(static_cast<size_t>(c.n_layers));
  for (int32_t i = 0; i < c.n_layers; ++i) {
    LayerWeights& l = w->layers[static_cast<size_t>(i)];
    const std::string p = absl::StrCat("blk.", i, ".");
    vec(l.attn_norm, p + "attn_norm.weight");
    mat(l.wq, p + "attn_q.weight", embd, q_dim);
    mat(l.wk, p + "attn_k.weight", embd, kv_dim);
    mat(l.wv, p + "attn_v.weight", embd, kv_dim);
    mat(l.wo, p + "attn_output.weight", q_dim, embd);
    vec(l.ffn_norm, p + "ffn_norm.weight");
    mat(l.w_gate, p + "ffn_gate.weight", embd, ff);
    mat(l.w_up, p + "ffn_up.weight", embd, ff);
    mat(l.w_down, p + "ffn_down.weight", ff, embd);
  }
  if (!status.ok()) return status;
  return w;
}

}  // namespace tandem::model::internal
