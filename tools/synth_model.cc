// `tandem synth-model` (see synth_model.h).
#include "tools/synth_model.h"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <iostream>
#include <memory>
#include <numbers>
#include <thread>
#include <utility>
#include <variant>

#include "absl/strings/ascii.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "engine/tokenizer/tokenizer.h"
#include "tools/cli_args.h"

namespace tandem::cli {
namespace {

constexpr char kUsage[] =
    "usage: tandem synth-model --out PATH (--vocab-from GGUF | --vocab byte)\n"
    "           [--arch llama|qwen2]\n"
    "           [--preset 15M|110M|1B|llama3.2-1b | --dim N --layers N --heads N [--kv-heads N]\n"
    "            --ff N [--context N]]\n"
    "           [--type f32|f16|bf16|q8_0|q4_0|q4_k|q5_k|q6_k|q4_k_m|q5_k_m] [--seed S]\n";

constexpr float kStdDev = 0.02f;

// Hyperparameters that are not flags, per architecture: llama's are
// stories260K's (rope base: llama.cpp's default), qwen2's Qwen2.5's.
struct ArchConstants {
  float rms_eps;
  float rope_freq_base;
};

ArchConstants ConstantsOf(SynthArch arch) {
  switch (arch) {
    case SynthArch::kLlama:
      return {1e-5f, 10000.0f};
    case SynthArch::kQwen2:
      return {1e-6f, 1000000.0f};
  }
  return {1e-5f, 10000.0f};
}

uint64_t Mix(uint64_t z) {  // SplitMix64 (Steele, Lea, Flood 2014)
  z += 0x9e3779b97f4a7c15ull;
  z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
  z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
  return z ^ (z >> 31);
}

[[nodiscard]] absl::Status FlagError(const std::string& flag, const std::string& what) {
  return absl::InvalidArgumentError(absl::StrCat("--", flag, ": ", what));
}

// One weight tensor of the model, in file order.
struct TensorSpec {
  std::string name;
  std::vector<uint64_t> dims;  // ne0 first
  bool norm = false;           // all ones, F32
  bool bias = false;           // random, F32
};

std::vector<TensorSpec> TensorSpecs(SynthArch arch, const SynthShape& s, uint64_t vocab) {
  const uint64_t dim = static_cast<uint64_t>(s.dim);
  const uint64_t kv_dim = dim / static_cast<uint64_t>(s.heads) * static_cast<uint64_t>(s.kv_heads);
  const uint64_t ff = static_cast<uint64_t>(s.ff);
  const bool qwen2 = arch == SynthArch::kQwen2;
  std::vector<TensorSpec> specs = {{"token_embd.weight", {dim, vocab}},
                                   {"output_norm.weight", {dim}, true}};
  if (!qwen2) specs.push_back({"output.weight", {dim, vocab}});  // qwen2: tied
  for (int32_t l = 0; l < s.layers; ++l) {
    const std::string p = absl::StrCat("blk.", l, ".");
    specs.push_back({p + "attn_q.weight", {dim, dim}});
    if (qwen2) specs.push_back({p + "attn_q.bias", {dim}, false, true});
    specs.push_back({p + "attn_k.weight", {dim, kv_dim}});
    if (qwen2) specs.push_back({p + "attn_k.bias", {kv_dim}, false, true});
    specs.push_back({p + "attn_v.weight", {dim, kv_dim}});
    if (qwen2) specs.push_back({p + "attn_v.bias", {kv_dim}, false, true});
    specs.push_back({p + "attn_output.weight", {dim, dim}});
    specs.push_back({p + "attn_norm.weight", {dim}, true});
    specs.push_back({p + "ffn_gate.weight", {dim, ff}});
    specs.push_back({p + "ffn_down.weight", {ff, dim}});
    specs.push_back({p + "ffn_up.weight", {dim, ff}});
    specs.push_back({p + "ffn_norm.weight", {dim}, true});
  }
  return specs;
}

// The --type values: name, (base) type, mix.
struct TypeFlag {
  const char* name;
  gguf::TensorType type;
  QuantMix mix;
};
constexpr TypeFlag kTypeFlags[] = {
    {"f32", gguf::TensorType::kF32, QuantMix::kPure},
    {"f16", gguf::TensorType::kF16, QuantMix::kPure},
    {"bf16", gguf::TensorType::kBF16, QuantMix::kPure},
    {"q8_0", gguf::TensorType::kQ8_0, QuantMix::kPure},
    {"q4_0", gguf::TensorType::kQ4_0, QuantMix::kPure},
    {"q4_k", gguf::TensorType::kQ4_K, QuantMix::kPure},
    {"q5_k", gguf::TensorType::kQ5_K, QuantMix::kPure},
    {"q6_k", gguf::TensorType::kQ6_K, QuantMix::kPure},
    {"q4_k_m", gguf::TensorType::kQ4_K, QuantMix::kKQuantM},
    {"q5_k_m", gguf::TensorType::kQ5_K, QuantMix::kKQuantM},
};

[[nodiscard]] absl::Status CheckShape(const SynthShape& s, gguf::TensorType type, QuantMix mix,
                                      const std::string& preset) {
  const std::pair<const char*, int32_t> dims[] = {{"dim", s.dim},     {"layers", s.layers},
                                                  {"heads", s.heads}, {"kv-heads", s.kv_heads},
                                                  {"ff", s.ff},       {"context", s.context}};
  for (const auto& [flag, v] : dims) {
    const int32_t max = std::string(flag) == "layers" ? 1024 : 65536;
    if (v < 1 || v > max)
      return FlagError(flag, absl::StrCat("must be in [1, ", max, "], got ", v));
  }
  if (s.dim % s.heads != 0) {
    return FlagError("heads", absl::StrCat("dim ", s.dim, " is not a multiple of heads ", s.heads));
  }
  if (s.heads % s.kv_heads != 0) {
    return FlagError(
        "kv-heads", absl::StrCat("heads ", s.heads, " is not a multiple of kv-heads ", s.kv_heads));
  }
  if ((s.dim / s.heads) % 2 != 0) {
    return FlagError(
        "heads", absl::StrCat("head dim ", s.dim / s.heads, " must be even (RoPE rotates pairs)"));
  }
  // Blocks run along rows (dim or ff long); a mix's Q6_K has the same
  // 256-weight blocks as its base type.
  const int32_t block = static_cast<int32_t>(gguf::TensorBlockSize(type));
  const std::pair<const char*, int32_t> rows[] = {{"dim", s.dim}, {"ff", s.ff}};
  for (const auto& [flag, v] : rows) {
    if (v % block == 0) continue;
    return FlagError(flag, absl::StrCat("must be a multiple of ", block, " for --type ",
                                        SynthTypeName(type, mix), ", got ", v,
                                        preset.empty() ? "" : " (from --preset " + preset + ")"));
  }
  return absl::OkStatus();
}

// Fills rows [row_begin, row_end) of tensor `index` of `spec` (rows of
// dims[0] values, a multiple of the type's block) at `out` in `type`.
void FillRows(const TensorSpec& spec, uint64_t index, uint64_t seed, gguf::TensorType type,
              uint64_t row_begin, uint64_t row_end, uint8_t* out) {
  const uint64_t row = spec.dims[0];
  const uint64_t row_bytes = *gguf::TensorBytes(type, row);
  std::vector<float> x(row);
  for (uint64_t r = row_begin; r < row_end; ++r) {
    for (uint64_t j = 0; j < row; ++j) {
      x[j] = spec.norm ? 1.0f : SynthWeight(seed, index, r * row + j);
    }
    ConvertFromF32(type, x.data(), row, out + r * row_bytes);
  }
}

// Fills `out` with tensor `index` of `spec` in `type`: rows split over up
// to 16 threads (each element is computed alone, so the bytes do not
// depend on the split).
void FillTensor(const TensorSpec& spec, uint64_t index, uint64_t seed, gguf::TensorType type,
                uint8_t* out) {
  uint64_t rows = 1;
  for (size_t d = 1; d < spec.dims.size(); ++d) rows *= spec.dims[d];
  const uint64_t n = rows * spec.dims[0];
  const uint64_t hw = std::max(1u, std::thread::hardware_concurrency());
  const uint64_t threads = n < (1u << 16) ? 1 : std::min<uint64_t>({hw, 16, rows});
  if (threads <= 1) return FillRows(spec, index, seed, type, 0, rows, out);
  std::vector<std::thread> pool;
  for (uint64_t t = 0; t < threads; ++t) {
    pool.emplace_back(FillRows, std::cref(spec), index, seed, type, rows * t / threads,
                      rows * (t + 1) / threads, out);
  }
  for (std::thread& th : pool) th.join();
}

}  // namespace

std::string SynthTypeName(gguf::TensorType type, QuantMix mix) {
  for (const TypeFlag& f : kTypeFlags) {
    if (f.type == type && f.mix == mix) return f.name;
  }
  return std::string(gguf::TensorTypeName(type));
}

const char* SynthArchName(SynthArch arch) {
  switch (arch) {
    case SynthArch::kLlama:
      return "llama";
    case SynthArch::kQwen2:
      return "qwen2";
  }
  return "llama";
}

absl::StatusOr<SynthShape> SynthPreset(const std::string& name) {
  if (name == "15M") return SynthShape{288, 6, 6, 6, 768, 256};
  if (name == "110M") return SynthShape{768, 12, 12, 12, 2048, 1024};
  if (name == "1B") return SynthShape{2048, 16, 32, 8, 5632, 2048};
  if (name == "llama3.2-1b") return SynthShape{2048, 16, 32, 8, 8192, 8192, 500000.0f};
  return FlagError("preset",
                   absl::StrCat("unknown preset '", name, "' (15M, 110M, 1B or llama3.2-1b)"));
}

absl::StatusOr<SynthModelOptions> ParseSynthModelArgs(const std::vector<std::string>& args) {
  absl::StatusOr<ParsedArgs> parsed = ParseArgs(args, {{"out"},
                                                       {"vocab-from"},
                                                       {"vocab"},
                                                       {"arch"},
                                                       {"preset"},
                                                       {"dim"},
                                                       {"layers"},
                                                       {"heads"},
                                                       {"kv-heads"},
                                                       {"ff"},
                                                       {"context"},
                                                       {"type"},
                                                       {"seed"}});
  if (!parsed.ok()) return parsed.status();
  if (!parsed->positional().empty()) {
    return absl::InvalidArgumentError(
        absl::StrCat("unexpected argument '", parsed->positional()[0], "'"));
  }
  SynthModelOptions o;
  o.out = parsed->GetString("out", "");
  if (o.out.empty()) return FlagError("out", "required");
  o.vocab_from = parsed->GetString("vocab-from", "");
  if (parsed->Has("vocab")) {
    if (parsed->Has("vocab-from")) {
      return FlagError("vocab", "cannot be combined with --vocab-from");
    }
    const std::string vocab = parsed->GetString("vocab", "");
    if (vocab != "byte") {
      return FlagError("vocab", absl::StrCat("expected byte, got '", vocab, "'"));
    }
    o.byte_vocab = true;
  } else if (o.vocab_from.empty()) {
    return FlagError("vocab-from", "required (a GGUF with a tokenizer), or --vocab byte");
  }
  const std::string arch = parsed->GetString("arch", "llama");
  if (arch == "llama") {
    o.arch = SynthArch::kLlama;
  } else if (arch == "qwen2") {
    o.arch = SynthArch::kQwen2;
  } else {
    return FlagError("arch", absl::StrCat("expected llama or qwen2, got '", arch, "'"));
  }
  // Case-insensitive: llama.cpp's users write Q4_K_M.
  const std::string type = absl::AsciiStrToLower(parsed->GetString("type", "f32"));
  const TypeFlag* type_flag = nullptr;
  std::string names;
  for (const TypeFlag& f : kTypeFlags) {
    if (type == f.name) type_flag = &f;
    absl::StrAppend(&names, names.empty() ? "" : ", ", f.name);
  }
  if (type_flag == nullptr) {
    return FlagError("type", absl::StrCat("expected one of ", names, "; got '", type, "'"));
  }
  o.type = type_flag->type;
  o.mix = type_flag->mix;
  absl::StatusOr<uint64_t> seed = parsed->GetUint("seed", 0);
  if (!seed.ok()) return seed.status();
  o.seed = *seed;

  const char* kShapeFlags[] = {"dim", "layers", "heads", "kv-heads", "ff", "context"};
  if (parsed->Has("preset")) {
    for (const char* f : kShapeFlags) {
      if (parsed->Has(f)) return FlagError(f, "cannot be combined with --preset");
    }
    o.preset = parsed->GetString("preset", "");
    absl::StatusOr<SynthShape> shape = SynthPreset(o.preset);
    if (!shape.ok()) return shape.status();
    o.shape = *shape;
  } else {
    int32_t* fields[] = {&o.shape.dim,      &o.shape.layers, &o.shape.heads,
                         &o.shape.kv_heads, &o.shape.ff,     &o.shape.context};
    for (size_t i = 0; i < 6; ++i) {
      const std::string f = kShapeFlags[i];
      if (!parsed->Has(f) && f != "kv-heads" && f != "context") {
        return FlagError(f, "required without --preset");
      }
      const int64_t fallback = f == "context" ? 256 : f == "kv-heads" ? o.shape.heads : 0;
      absl::StatusOr<int64_t> v = parsed->GetInt(f, fallback);
      if (!v.ok()) return v.status();
      if (*v < 0 || *v > 1 << 30) return FlagError(f, absl::StrCat("out of range: ", *v));
      *fields[i] = static_cast<int32_t>(*v);
    }
  }
  if (absl::Status s = CheckShape(o.shape, o.type, o.mix, o.preset); !s.ok()) return s;
  return o;
}

float SynthWeight(uint64_t seed, uint64_t tensor, uint64_t i) {
  const uint64_t s = Mix(seed ^ Mix(tensor));
  const uint64_t a = Mix(s + 2 * i);
  const uint64_t b = Mix(s + 2 * i + 1);
  const double u1 = static_cast<double>((a >> 11) + 1) * 0x1p-53;
  const double u2 = static_cast<double>(b >> 11) * 0x1p-53;
  const double z = std::sqrt(-2.0 * std::log(u1)) * std::cos(2.0 * std::numbers::pi * u2);
  return static_cast<float>(static_cast<double>(kStdDev) * z);
}

TokenizerMetadata ByteVocabMetadata() {
  // llama.cpp's llama_token_type: 1 normal, 2 unknown, 3 control, 6 byte.
  std::vector<std::string> tokens = {"<unk>", "<s>", "</s>"};
  std::vector<int32_t> types = {2, 3, 3};
  for (int b = 0; b < 256; ++b) {
    char piece[8];
    std::snprintf(piece, sizeof(piece), "<0x%02X>", b);
    tokens.push_back(piece);
    types.push_back(6);
  }
  tokens.push_back("\xE2\x96\x81");  // U+2581, SPM's escaped space
  types.push_back(1);
  std::vector<float> scores(tokens.size(), 0.0f);
  TokenizerMetadata m;
  m.emplace_back("tokenizer.ggml.model", std::string("llama"));
  m.emplace_back("tokenizer.ggml.tokens", std::move(tokens));
  m.emplace_back("tokenizer.ggml.scores", std::move(scores));
  m.emplace_back("tokenizer.ggml.token_type", std::move(types));
  m.emplace_back("tokenizer.ggml.bos_token_id", uint32_t{1});
  m.emplace_back("tokenizer.ggml.eos_token_id", uint32_t{2});
  m.emplace_back("tokenizer.ggml.unknown_token_id", uint32_t{0});
  m.emplace_back("tokenizer.ggml.add_bos_token", true);
  m.emplace_back("tokenizer.ggml.add_space_prefix", false);
  return m;
}

TokenizerMetadata TokenizerMetadataOf(const gguf::GgufFile& vocab) {
  TokenizerMetadata tokenizer;
  for (const std::string& key : vocab.metadata_keys()) {
    if (absl::StartsWith(key, "tokenizer.")) tokenizer.emplace_back(key, *vocab.Find(key));
  }
  return tokenizer;
}

absl::StatusOr<gguf::GgufWriter> BuildSynthModel(const SynthModelOptions& o,
                                                 const gguf::GgufFile& vocab) {
  // The tokenizer the servers will build from the model: refuse one they
  // cannot (e.g. a WordPiece "bert" vocabulary) now, not at serving time.
  if (absl::StatusOr<std::unique_ptr<tokenizer::Tokenizer>> t =
          tokenizer::Tokenizer::FromGguf(vocab);
      !t.ok()) {
    return absl::InvalidArgumentError(absl::StrCat(
        vocab.path(), ": --vocab-from: its tokenizer cannot be served: ", t.status().message()));
  }
  absl::StatusOr<gguf::GgufWriter> w = BuildSynthModel(o, TokenizerMetadataOf(vocab));
  if (!w.ok()) {
    return absl::InvalidArgumentError(
        absl::StrCat(vocab.path(), ": --vocab-from ", w.status().message()));
  }
  return w;
}

absl::StatusOr<gguf::GgufWriter> BuildSynthModel(const SynthModelOptions& o,
                                                 const TokenizerMetadata& tokenizer) {
  const std::vector<std::string>* tokens = nullptr;
  for (const auto& [key, value] : tokenizer) {
    if (key == "tokenizer.ggml.tokens") tokens = std::get_if<std::vector<std::string>>(&value);
  }
  if (tokens == nullptr || tokens->empty()) {
    return absl::InvalidArgumentError("has no tokenizer.ggml.tokens string array");
  }
  const SynthShape& s = o.shape;
  const std::string arch = SynthArchName(o.arch);
  const ArchConstants constants = ConstantsOf(o.arch);
  gguf::GgufWriter w;
  auto add = [&](std::string key, gguf::MetadataValue v) {
    absl::Status st = w.AddMetadata(std::move(key), std::move(v));
    (void)st;  // fresh, distinct keys: cannot fail
  };
  const std::string shape_name =
      o.preset.empty() ? absl::StrCat(s.dim, "d", s.layers, "l") : o.preset;
  add("general.architecture", arch);
  // llama keeps the name it always had, so its files stay byte-identical.
  add("general.name",
      absl::StrCat("tandem-synth-", o.arch == SynthArch::kLlama ? "" : arch + "-", shape_name));
  add("general.file_type", LlamaFileType(o.type, o.mix));
  add(arch + ".context_length", static_cast<uint32_t>(s.context));
  add(arch + ".embedding_length", static_cast<uint32_t>(s.dim));
  add(arch + ".feed_forward_length", static_cast<uint32_t>(s.ff));
  add(arch + ".attention.head_count", static_cast<uint32_t>(s.heads));
  add(arch + ".attention.head_count_kv", static_cast<uint32_t>(s.kv_heads));
  add(arch + ".block_count", static_cast<uint32_t>(s.layers));
  if (o.arch == SynthArch::kLlama) {
    add(arch + ".rope.dimension_count", static_cast<uint32_t>(s.dim / s.heads));
  }
  add(arch + ".rope.freq_base",
      s.rope_freq_base > 0.0f ? s.rope_freq_base : constants.rope_freq_base);
  add(arch + ".attention.layer_norm_rms_epsilon", constants.rms_eps);
  add("tandem.synth.seed", o.seed);
  for (const auto& [key, value] : tokenizer) {
    if (absl::StartsWith(key, "tokenizer.")) add(key, value);
  }

  const std::vector<TensorSpec> specs = TensorSpecs(o.arch, s, tokens->size());
  for (uint64_t i = 0; i < specs.size(); ++i) {
    const TensorSpec& spec = specs[i];
    const gguf::TensorType type =
        spec.norm || spec.bias
            ? gguf::TensorType::kF32
            : MixTensorType(o.type, o.mix, spec.name, s.layers, o.arch == SynthArch::kLlama);
    auto fill = [spec, i, seed = o.seed, type](uint8_t* out) {
      FillTensor(spec, i, seed, type, out);
    };
    if (absl::Status st = w.AddTensorFill(spec.name, type, spec.dims, fill); !st.ok()) {
      return st;
    }
  }
  return w;
}

namespace {

// The writer for `options`: its vocabulary from --vocab-from or built in.
// `vocab` keeps the opened file alive as long as the writer.
[[nodiscard]] absl::StatusOr<gguf::GgufWriter> BuildFromOptions(
    const SynthModelOptions& options, std::unique_ptr<gguf::GgufFile>* vocab) {
  if (options.byte_vocab) return BuildSynthModel(options, ByteVocabMetadata());
  absl::StatusOr<std::unique_ptr<gguf::GgufFile>> file = gguf::GgufFile::Open(options.vocab_from);
  if (!file.ok()) return file.status();
  *vocab = std::move(*file);
  return BuildSynthModel(options, **vocab);
}

// Writes `w` to `out` through a temporary file beside it, renamed into
// place once complete: a failed or interrupted write leaves no partial
// model under `out`.
[[nodiscard]] absl::Status WriteAtomically(const gguf::GgufWriter& w, const std::string& out) {
  const std::string tmp = out + ".tmp";
  if (absl::Status s = w.WriteFile(tmp); !s.ok()) {
    std::error_code ignored;
    std::filesystem::remove(tmp, ignored);
    return s;
  }
  std::error_code ec;
  std::filesystem::rename(tmp, out, ec);
  if (ec) {
    std::filesystem::remove(tmp, ec);
    return absl::FailedPreconditionError(
        absl::StrCat(out, ": cannot rename ", tmp, " into place: ", ec.message()));
  }
  return absl::OkStatus();
}

}  // namespace

absl::Status WriteSynthModel(const SynthModelOptions& options) {
  std::unique_ptr<gguf::GgufFile> vocab;
  absl::StatusOr<gguf::GgufWriter> w = BuildFromOptions(options, &vocab);
  if (!w.ok()) return w.status();
  return WriteAtomically(*w, options.out);
}

SynthModelOptions OfflineModelOptions(const std::string& out) {
  SynthModelOptions o;
  o.out = out;
  o.byte_vocab = true;
  o.shape = SynthShape{64, 2, 4, 2, 128, 2048};
  o.type = gguf::TensorType::kF32;
  o.seed = 0;
  return o;
}

absl::StatusOr<bool> EnsureSynthModel(const SynthModelOptions& options) {
  std::unique_ptr<gguf::GgufFile> vocab;
  absl::StatusOr<gguf::GgufWriter> w = BuildFromOptions(options, &vocab);
  if (!w.ok()) return w.status();
  const std::filesystem::path out(options.out);
  std::error_code ec;
  if (std::filesystem::exists(out, ec)) {
    // Sizes first: a file of another size cannot hold the same bytes.
    const uintmax_t size = std::filesystem::file_size(out, ec);
    if (!ec && size == w->FileSize()) {
      std::ifstream in(out, std::ios::binary);
      if (!in) return absl::FailedPreconditionError(absl::StrCat(options.out, ": cannot read"));
      const std::string have((std::istreambuf_iterator<char>(in)),
                             std::istreambuf_iterator<char>());
      if (have == w->Serialize()) return false;
    }
  } else if (out.has_parent_path()) {
    std::filesystem::create_directories(out.parent_path(), ec);
    if (ec) {
      return absl::FailedPreconditionError(
          absl::StrCat(out.parent_path().string(), ": cannot create directory: ", ec.message()));
    }
  }
  if (absl::Status s = WriteAtomically(*w, options.out); !s.ok()) return s;
  return true;
}

int RunSynthModel(const std::vector<std::string>& args) {
  absl::StatusOr<SynthModelOptions> options = ParseSynthModelArgs(args);
  if (!options.ok()) {
    std::cerr << "tandem synth-model: " << options.status().message() << "\n" << kUsage;
    return 2;
  }
  if (absl::Status s = WriteSynthModel(*options); !s.ok()) {
    std::cerr << "tandem synth-model: " << s << "\n";
    return 1;
  }
  const SynthShape& s = options->shape;
  std::printf(
      "tandem: wrote %s (%s, dim %d, %d layers, %d heads, %d kv heads, ff %d, "
      "context %d, %s, seed %llu%s; random weights: its text is noise)\n",
      options->out.c_str(), SynthArchName(options->arch), s.dim, s.layers, s.heads, s.kv_heads,
      s.ff, s.context, absl::AsciiStrToUpper(SynthTypeName(options->type, options->mix)).c_str(),
      static_cast<unsigned long long>(options->seed),
      options->byte_vocab ? ", byte vocabulary" : "");
  return 0;
}

}  // namespace tandem::cli
