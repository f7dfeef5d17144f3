#include "engine/model/llama_weights.h"

#include <bit>
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

static_assert(std::endian::native == std::endian::little,
              "GGUF tensor data is little-endian; big-endian hosts need byte swaps");

// Upper bound for hidden sizes and head counts: keeps every product of two
// of them far inside int64 and each size inside int32.
constexpr uint64_t kMaxDim = uint64_t{1} << 20;
constexpr uint64_t kMaxVocab = uint64_t{1} << 24;

// IEEE 754 binary16 -> binary32 (exact).
float HalfToFloat(uint16_t h) {
  const uint32_t sign = static_cast<uint32_t>(h & 0x8000u) << 16;
  const uint32_t exp = (h >> 10) & 0x1fu;
  const uint32_t mant = h & 0x3ffu;
  if (exp == 0) {  // zero or subnormal: mant * 2^-24
    const float v = std::ldexp(static_cast<float>(mant), -24);
    return sign != 0 ? -v : v;
  }
  if (exp == 31) return std::bit_cast<float>(sign | 0x7f800000u | (mant << 13));
  return std::bit_cast<float>(sign | ((exp + 112u) << 23) | (mant << 13));
}

uint16_t LoadU16(const uint8_t* p) {
  uint16_t v;
  std::memcpy(&v, p, sizeof v);
  return v;
}

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

// The tensor `name` with exactly `dims` (ne0 first), as F32.
absl::StatusOr<Tensor> LoadTensor(const gguf::GgufFile& file, const std::string& name,
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
  const uint64_t n = info->NumElements();
  const std::optional<uint64_t> bytes = gguf::TensorBytes(info->type, n);
  if (!bytes.has_value() || *bytes != info->n_bytes) {
    return absl::InvalidArgumentError(
        absl::StrCat(file.path(), ": tensor '", name, "' of type ",
                     std::string(gguf::TensorTypeName(info->type)), " has ", info->n_bytes,
                     " bytes, which does not match its shape"));
  }
  Tensor t;
  if (info->type == gguf::TensorType::kF32 &&
      reinterpret_cast<uintptr_t>(info->data) % alignof(float) == 0) {
    t.data = reinterpret_cast<const float*>(info->data);
    return t;
  }
  t.owned.resize(n);
  ConvertToF32(info->type, info->data, n, t.owned.data());
  t.data = t.owned.data();
  return t;
}

}  // namespace

void ConvertToF32(gguf::TensorType type, const uint8_t* data, size_t n, float* out) {
  switch (type) {
    case gguf::TensorType::kF32:
      std::memcpy(out, data, n * sizeof(float));
      return;
    case gguf::TensorType::kF16:
      for (size_t i = 0; i < n; ++i) out[i] = HalfToFloat(LoadU16(data + 2 * i));
      return;
    case gguf::TensorType::kBF16:
      for (size_t i = 0; i < n; ++i) {
        out[i] = std::bit_cast<float>(static_cast<uint32_t>(LoadU16(data + 2 * i)) << 16);
      }
      return;
    case gguf::TensorType::kQ8_0:
      // ggml block_q8_0: {f16 d; int8 q[32]}, x = q * d.
      for (size_t b = 0; b < n / 32; ++b) {
        const uint8_t* block = data + 34 * b;
        const float d = HalfToFloat(LoadU16(block));
        for (size_t j = 0; j < 32; ++j) {
          out[32 * b + j] = static_cast<float>(static_cast<int8_t>(block[2 + j])) * d;
        }
      }
      return;
  }
}

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
  auto load = [&](Tensor& dst, const std::string& name, std::vector<uint64_t> dims) {
    if (!status.ok()) return;
    absl::StatusOr<Tensor> t = LoadTensor(file, name, dims);
    if (t.ok()) {
      dst = std::move(*t);
    } else {
      status = t.status();
    }
  };
  load(w->token_embd, "token_embd.weight", {embd, vocab});
  load(w->output_norm, "output_norm.weight", {embd});
  if (file.FindTensor("output.weight") != nullptr) {
    load(w->output, "output.weight", {embd, vocab});
  } else {
    w->output.data = w->token_embd.data;  // tied embeddings
  }
  w->layers.resize(static_cast<size_t>(c.n_layers));
  for (int32_t i = 0; i < c.n_layers; ++i) {
    LayerWeights& l = w->layers[static_cast<size_t>(i)];
    const std::string p = absl::StrCat("blk.", i, ".");
    load(l.attn_norm, p + "attn_norm.weight", {embd});
    load(l.wq, p + "attn_q.weight", {embd, q_dim});
    load(l.wk, p + "attn_k.weight", {embd, kv_dim});
    load(l.wv, p + "attn_v.weight", {embd, kv_dim});
    load(l.wo, p + "attn_output.weight", {q_dim, embd});
    load(l.ffn_norm, p + "ffn_norm.weight", {embd});
    load(l.w_gate, p + "ffn_gate.weight", {embd, ff});
    load(l.w_up, p + "ffn_up.weight", {embd, ff});
    load(l.w_down, p + "ffn_down.weight", {ff, embd});
  }
  if (!status.ok()) return status;
  return w;
}

}  // namespace tandem::model::internal
