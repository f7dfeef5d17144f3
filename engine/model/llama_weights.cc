#include "engine/model/llama_weights.h"

#include "engine/model/quant_blocks.h"

#include <cmath>
#include <cstring>
#include <functional>
#include <limits>
#include <set>
#include <string>
#include <variant>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "engine/model/model_arch.h"

namespace tandem::model::internal {
namespace {

// Upper bound for hidden sizes and head counts: keeps every product of two
// of them far inside int64 and each size inside int32.
constexpr uint64_t kMaxDim = uint64_t{1} << 20;
constexpr uint64_t kMaxVocab = uint64_t{1} << 24;

// The metadata value under `key` as an int32 in [1, max], or INVALID_ARGUMENT
// naming the key (a missing key included).
[[nodiscard]] absl::StatusOr<int32_t> RequiredDim(const gguf::GgufFile& file,
                                                  const std::string& key, uint64_t max) {
  absl::StatusOr<uint64_t> v = file.GetUint(key);
  if (!v.ok()) return absl::InvalidArgumentError(v.status().message());
  if (*v == 0 || *v > max) {
    return absl::InvalidArgumentError(absl::StrCat(file.path(), ": metadata key '", key,
                                                   "' must be in [1, ", max, "], got ", *v));
  }
  return static_cast<int32_t>(*v);
}

// Like RequiredDim, but `fallback` when the key is absent.
[[nodiscard]] absl::StatusOr<int32_t> OptionalDim(const gguf::GgufFile& file,
                                                  const std::string& key, uint64_t max,
                                                  int32_t fallback) {
  if (file.Find(key) == nullptr) return fallback;
  return RequiredDim(file, key, max);
}

// A finite float > 0 under `key`; `fallback` when absent unless required.
[[nodiscard]] absl::StatusOr<float> PositiveFloat(const gguf::GgufFile& file,
                                                  const std::string& key,
                                                  std::optional<float> fallback) {
  if (file.Find(key) == nullptr && fallback.has_value()) return *fallback;
  absl::StatusOr<float> v = file.GetFloat(key);
  if (!v.ok()) return absl::InvalidArgumentError(v.status().message());
  if (!(std::isfinite(*v) && *v > 0.0f)) {
    return absl::InvalidArgumentError(
        absl::StrCat(file.path(), ": metadata key '", key, "' must be finite and > 0, got ", *v));
  }
  return *v;
}

[[nodiscard]] absl::Status ConfigError(const gguf::GgufFile& file, absl::string_view what) {
  return absl::InvalidArgumentError(absl::StrCat(file.path(), ": ", what));
}

constexpr char kRopeFreqs[] = "rope_freqs.weight";

// RoPE scaling keys (llama.cpp's load_hparams): the type defaults to
// "linear" when absent, and then rope.scaling.factor (or the older
// rope.scale_linear) f scales every angle by 1/f; "none" never scales;
// rope.scaling.attn_factor multiplies cos and sin. Only unscaled RoPE is
// supported: anything that would scale is refused, naming the key.
[[nodiscard]] absl::Status CheckNoRopeScaling(const gguf::GgufFile& file, const ArchInfo& arch) {
  const std::string type_key = ArchKey(arch, "rope.scaling.type");
  bool type_absent = true;
  if (file.Find(type_key) != nullptr) {
    absl::StatusOr<std::string> type = file.GetString(type_key);
    if (!type.ok()) return absl::InvalidArgumentError(type.status().message());
    if (*type != "none") {
      return ConfigError(file, absl::StrCat("metadata key '", type_key, "' is '", *type,
                                            "': only 'none' (or no key) is supported"));
    }
    type_absent = false;
  }
  for (const char* suffix : {"rope.scaling.factor", "rope.scale_linear"}) {
    const std::string key = ArchKey(arch, suffix);
    if (file.Find(key) == nullptr) continue;
    absl::StatusOr<float> factor = file.GetFloat(key);
    if (!factor.ok()) return absl::InvalidArgumentError(factor.status().message());
    // llama.cpp reads 0 as "no scaling"; with type "none" the factor is unused.
    if (type_absent && *factor != 0.0f && *factor != 1.0f) {
      return ConfigError(file, absl::StrCat("metadata key '", key, "' is ", *factor,
                                            " (linear RoPE scaling, llama.cpp's default when ",
                                            type_key, " is absent): only 1 is supported"));
    }
    break;  // llama.cpp reads rope.scale_linear only without rope.scaling.factor
  }
  const std::string attn_key = ArchKey(arch, "rope.scaling.attn_factor");
  if (file.Find(attn_key) != nullptr) {
    absl::StatusOr<float> attn = file.GetFloat(attn_key);
    if (!attn.ok()) return absl::InvalidArgumentError(attn.status().message());
    if (*attn != 1.0f) {
      return ConfigError(
          file, absl::StrCat("metadata key '", attn_key, "' is ", *attn, ": only 1 is supported"));
    }
  }
  return absl::OkStatus();
}

std::string ShapeString(const std::vector<uint64_t>& dims) {
  return absl::StrCat("[", absl::StrJoin(dims, ", "), "]");
}

// The tensor `name` with exactly `dims` (ne0 first), checked against its
// type's byte size; INVALID_ARGUMENT naming it otherwise.
[[nodiscard]] absl::StatusOr<const gguf::TensorInfo*> FindTensor(
    const gguf::GgufFile& file, const std::string& name, const std::vector<uint64_t>& dims) {
  const gguf::TensorInfo* info = file.FindTensor(name);
  if (info == nullptr) {
    return absl::InvalidArgumentError(absl::StrCat(file.path(), ": missing tensor '", name, "'"));
  }
  if (info->dims != dims) {
    return absl::InvalidArgumentError(absl::StrCat(file.path(), ": tensor '", name, "' has shape ",
                                                   ShapeString(info->dims), ", expected ",
                                                   ShapeString(dims)));
  }
  // Rows must be whole blocks (ne0 a multiple of 32 for Q8_0) for a row to
  // start at a block boundary; TensorBytes checks that of ne0 alone.
  const std::optional<uint64_t> row_bytes = gguf::TensorBytes(info->type, dims[0]);
  const std::optional<uint64_t> bytes = gguf::TensorBytes(info->type, info->NumElements());
  if (!row_bytes.has_value() || !bytes.has_value() || *bytes != info->n_bytes) {
    return absl::InvalidArgumentError(absl::StrCat(
        file.path(), ": tensor '", name, "' of type ",
        std::string(gguf::TensorTypeName(info->type)), " has ", info->n_bytes,
        " bytes and rows of ", dims[0], " elements, which do not match its type's block size"));
  }
  // A NaN or infinite block scale would poison every weight of its block.
  const uint64_t n_blocks = info->NumElements() / gguf::TensorBlockSize(info->type);
  if (std::optional<uint64_t> bad = FindNonFiniteScale(info->type, info->data, n_blocks)) {
    return absl::InvalidArgumentError(absl::StrCat(
        file.path(), ": tensor '", name, "' of type ",
        std::string(gguf::TensorTypeName(info->type)), " has a non-finite scale in block ", *bad,
        " (weights ", *bad * gguf::TensorBlockSize(info->type), "..)"));
  }
  return info;
}

// A NaN or infinity in a norm weight or bias would turn every logit into
// NaN; refused like a non-finite block scale.
[[nodiscard]] absl::Status CheckFinite(const gguf::GgufFile& file, const std::string& name,
                                       const float* v, uint64_t n) {
  for (uint64_t i = 0; i < n; ++i) {
    if (!std::isfinite(v[i])) {
      return absl::InvalidArgumentError(absl::StrCat(file.path(), ": tensor '", name, "' element ",
                                                     i, " is ", v[i], ", expected a finite value"));
    }
  }
  return absl::OkStatus();
}

[[nodiscard]] absl::StatusOr<Tensor> LoadVector(const gguf::GgufFile& file, const std::string& name,
                                                uint64_t n) {
  absl::StatusOr<const gguf::TensorInfo*> info = FindTensor(file, name, {n});
  if (!info.ok()) return info.status();
  Tensor t;
  if ((*info)->type == gguf::TensorType::kF32 &&
      reinterpret_cast<uintptr_t>((*info)->data) % alignof(float) == 0) {
    t.data = reinterpret_cast<const float*>((*info)->data);
  } else {
    t.owned.resize(n);
    ConvertToF32((*info)->type, (*info)->data, n, t.owned.data());
    t.data = t.owned.data();
  }
  if (absl::Status s = CheckFinite(file, name, t.data, n); !s.ok()) return s;
  return t;
}

// The matrix `name` of GGUF dims [in, out], in its storage type.
[[nodiscard]] absl::StatusOr<Matrix> LoadMatrix(const gguf::GgufFile& file, const std::string& name,
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
  absl::StatusOr<std::string> arch_name = file.GetString("general.architecture");
  if (!arch_name.ok()) return absl::InvalidArgumentError(arch_name.status().message());
  const ArchInfo* arch = FindArch(*arch_name);
  if (arch == nullptr) {
    return ConfigError(
        file, absl::StrCat("metadata key 'general.architecture' is '", *arch_name,
                           "', not a supported architecture (", SupportedArchNames(), ")"));
  }
  c.architecture = *arch_name;
  c.arch = arch->arch;
  c.rope_type = arch->rope_type;
  if (absl::StatusOr<std::string> name = file.GetString("general.name"); name.ok()) {
    c.name = *name;
  }
  // "<arch>.<suffix>", e.g. "qwen2.context_length".
  auto key = [&](const char* suffix) { return ArchKey(*arch, suffix); };

  auto dim = [&](const char* suffix, uint64_t max) { return RequiredDim(file, key(suffix), max); };
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
  if (!(v = OptionalDim(file, key("attention.head_count_kv"), kMaxDim, c.n_head)).ok()) {
    return v.status();
  }
  c.n_head_kv = *v;
  if (c.n_embd % c.n_head != 0) {
    return ConfigError(
        file, absl::StrCat(key("embedding_length"), " ", c.n_embd, " is not a multiple of ",
                           key("attention.head_count"), " ", c.n_head));
  }
  if (c.n_head % c.n_head_kv != 0) {
    return ConfigError(
        file, absl::StrCat(key("attention.head_count"), " ", c.n_head, " is not a multiple of ",
                           key("attention.head_count_kv"), " ", c.n_head_kv));
  }
  c.head_dim = c.n_embd / c.n_head;
  // llama.cpp reads explicit head sizes (n_embd_head_k / n_embd_head_v);
  // the forward assumes n_embd / n_head for both, so any other value is
  // refused rather than ignored.
  for (const char* suffix : {"attention.key_length", "attention.value_length"}) {
    if (file.Find(key(suffix)) == nullptr) continue;
    absl::StatusOr<uint64_t> len = file.GetUint(key(suffix));
    if (!len.ok()) return absl::InvalidArgumentError(len.status().message());
    if (*len != static_cast<uint64_t>(c.head_dim)) {
      return ConfigError(file,
                         absl::StrCat("metadata key '", key(suffix), "' is ", *len,
                                      ": only n_embd / n_head = ", c.head_dim, " is supported"));
    }
  }
  if (!(v = OptionalDim(file, key("rope.dimension_count"), kMaxDim, c.head_dim)).ok()) {
    return v.status();
  }
  c.rope_dim = *v;
  if (c.rope_dim > c.head_dim || c.rope_dim % 2 != 0) {
    return ConfigError(file, absl::StrCat(key("rope.dimension_count"), " ", c.rope_dim,
                                          " must be even and <= head dim ", c.head_dim));
  }
  absl::StatusOr<float> f = PositiveFloat(file, key("rope.freq_base"), 10000.0f);
  if (!f.ok()) return f.status();
  c.rope_freq_base = *f;
  f = PositiveFloat(file, key("attention.layer_norm_rms_epsilon"), std::nullopt);
  if (!f.ok()) return f.status();
  c.rms_norm_eps = *f;
  if (absl::Status s = CheckNoRopeScaling(file, *arch); !s.ok()) return s;
  if (file.Find(key("expert_count")) != nullptr) {
    absl::StatusOr<uint64_t> experts = file.GetUint(key("expert_count"));
    if (!experts.ok()) return absl::InvalidArgumentError(experts.status().message());
    if (*experts > 0) {
      return ConfigError(file,
                         absl::StrCat("metadata key '", key("expert_count"), "' is ", *experts,
                                      ": mixture-of-experts models are not "
                                      "supported"));
    }
  }

  // Vocabulary: the tokenizer's token list, else <arch>.vocab_size.
  const gguf::MetadataValue* tokens = file.Find("tokenizer.ggml.tokens");
  if (tokens != nullptr) {
    const auto* list = std::get_if<std::vector<std::string>>(tokens);
    if (list == nullptr) {
      return ConfigError(file, "metadata key 'tokenizer.ggml.tokens' is not a string array");
    }
    if (list->empty() || list->size() > kMaxVocab) {
      return ConfigError(file,
                         absl::StrCat("metadata key 'tokenizer.ggml.tokens' has ", list->size(),
                                      " entries, expected [1, ", kMaxVocab, "]"));
    }
    c.vocab_size = static_cast<int32_t>(list->size());
  } else {
    if (!(v = RequiredDim(file, key("vocab_size"), kMaxVocab)).ok()) return v.status();
    c.vocab_size = *v;
  }

  // Optional tensors of the row (LoadLlamaWeights checks their shapes).
  switch (arch->qkv_bias) {
    case TensorRule::kAbsent:
      c.qkv_bias = false;
      break;
    case TensorRule::kOptional:
      c.qkv_bias = file.FindTensor("blk.0.attn_q.bias") != nullptr;
      break;
    case TensorRule::kRequired:
      c.qkv_bias = true;
      break;
  }
  const bool has_rope_freqs = file.FindTensor(kRopeFreqs) != nullptr;
  switch (arch->rope_freqs) {
    case TensorRule::kAbsent:
      if (has_rope_freqs) {
        return ConfigError(file, absl::StrCat("tensor '", kRopeFreqs,
                                              "' is not used by "
                                              "architecture '",
                                              arch->name, "'"));
      }
      c.rope_freq_factors = false;
      break;
    case TensorRule::kOptional:
      c.rope_freq_factors = has_rope_freqs;
      break;
    case TensorRule::kRequired:
      c.rope_freq_factors = true;
      break;
  }
  return c;
}

absl::StatusOr<std::unique_ptr<ModelWeights>> LoadLlamaWeights(const gguf::GgufFile& file,
                                                               const LlamaConfig& c) {
  const uint64_t embd = static_cast<uint64_t>(c.n_embd);
  const uint64_t q_dim = static_cast<uint64_t>(c.n_head) * static_cast<uint64_t>(c.head_dim);
  const uint64_t kv_dim = static_cast<uint64_t>(c.n_head_kv) * static_cast<uint64_t>(c.head_dim);
  const uint64_t ff = static_cast<uint64_t>(c.n_ff);
  const uint64_t vocab = static_cast<uint64_t>(c.vocab_size);

  auto w = std::make_unique<ModelWeights>();
  absl::Status status;
  std::set<std::string, std::less<>> used;  // tensor names the graph reads
  // Loads one tensor into `dst`, remembering the first error.
  auto keep = [&](auto& dst, auto loaded) {
    if (!status.ok()) return;
    if (loaded.ok()) {
      dst = *std::move(loaded);
    } else {
      status = loaded.status();
    }
  };
  auto vec = [&](Tensor& dst, const std::string& name, uint64_t n) {
    used.insert(name);
    if (status.ok()) keep(dst, LoadVector(file, name, n));
  };
  auto mat = [&](Matrix& dst, const std::string& name, uint64_t in, uint64_t out) {
    used.insert(name);
    if (status.ok()) keep(dst, LoadMatrix(file, name, in, out));
  };
  mat(w->token_embd, "token_embd.weight", embd, vocab);
  vec(w->output_norm, "output_norm.weight", embd);
  if (file.FindTensor("output.weight") != nullptr || !GetArchInfo(c.arch).output_may_be_tied) {
    mat(w->output, "output.weight", embd, vocab);
  } else {
    w->output.view = w->token_embd.view;  // tied embeddings
  }
  if (c.rope_freq_factors) {
    const uint64_t pairs = static_cast<uint64_t>(c.rope_dim) / 2;
    vec(w->rope_freqs, kRopeFreqs, pairs);
    // Divisors of the angle: 0, a negative or a non-finite value would give
    // NaN or reversed rotations.
    for (uint64_t i = 0; status.ok() && i < pairs; ++i) {
      const float x = w->rope_freqs.data[i];
      if (!(std::isfinite(x) && x > 0.0f)) {
        status = ConfigError(file, absl::StrCat("tensor '", kRopeFreqs, "' element ", i, " is ", x,
                                                ", expected finite and > 0"));
      }
    }
  }
  w->layers.resize(static_cast<size_t>(c.n_layers));
  for (int32_t i = 0; i < c.n_layers; ++i) {
    LayerWeights& l = w->layers[static_cast<size_t>(i)];
    const std::string p = absl::StrCat("blk.", i, ".");
    vec(l.attn_norm, p + "attn_norm.weight", embd);
    mat(l.wq, p + "attn_q.weight", embd, q_dim);
    mat(l.wk, p + "attn_k.weight", embd, kv_dim);
    mat(l.wv, p + "attn_v.weight", embd, kv_dim);
    if (c.qkv_bias) {
      vec(l.bq, p + "attn_q.bias", q_dim);
      vec(l.bk, p + "attn_k.bias", kv_dim);
      vec(l.bv, p + "attn_v.bias", kv_dim);
    }
    mat(l.wo, p + "attn_output.weight", q_dim, embd);
    vec(l.ffn_norm, p + "ffn_norm.weight", embd);
    mat(l.w_gate, p + "ffn_gate.weight", embd, ff);
    mat(l.w_up, p + "ffn_up.weight", embd, ff);
    mat(l.w_down, p + "ffn_down.weight", ff, embd);
  }
  if (!status.ok()) return status;
  // A tensor the graph does not read would change the math if it were
  // meant to be used (an output bias, FFN biases, experts): refuse it.
  for (const gguf::TensorInfo& t : file.tensors()) {
    if (!used.contains(t.name)) {
      return ConfigError(file, absl::StrCat("tensor '", t.name, "' is not used by the '",
                                            c.architecture, "' graph (unsupported feature)"));
    }
  }
  return w;
}

namespace {
// The matrices Forward multiplies: each layer's seven and the output.
template <typename Fn>
void ForEachMultiplied(ModelWeights* weights, Fn fn) {
  for (LayerWeights& l : weights->layers) {
    for (Matrix* m : {&l.wq, &l.wk, &l.wv, &l.wo, &l.w_gate, &l.w_up, &l.w_down}) fn(*m);
  }
  fn(weights->output);
}

// Packs `m` when it is Q8_0; returns whether it was.
bool PackMatrix(Matrix& m) {
  if (m.view.type != gguf::TensorType::kQ8_0) return false;
  m.int8 = Q8Int8Matrix::Pack(m.view);
  m.view.int8 = m.int8.get();
  return true;
}
}  // namespace

bool PackQ8Int8(ModelWeights* weights) {
  bool all = true;
  ForEachMultiplied(weights, [&](Matrix& m) { all = PackMatrix(m) && all; });
  return all;
}

bool PackF32Panels(ModelWeights* weights) {
  bool all = true;
  ForEachMultiplied(weights, [&](Matrix& m) {
    if (m.view.type != gguf::TensorType::kF32) {
      all = false;
      return;
    }
    m.f32_panels = F32PanelMatrix::Pack(m.view);
    m.view.f32_panels = m.f32_panels.get();
  });
  return all;
}

}  // namespace tandem::model::internal
