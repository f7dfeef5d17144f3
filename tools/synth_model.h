// `tandem synth-model`: writes a GGUF model (llama or qwen2 architecture)
// of a given shape with seeded random weights and the tokenizer of another
// GGUF file.
//
//   tandem synth-model --out PATH (--vocab-from GGUF | --vocab byte)
//       [--arch llama|qwen2]
//       [--preset 15M|110M|1B|llama3.2-1b | --dim N --layers N --heads N [--kv-heads N]
//        --ff N [--context N]]
//       [--type f32|f16|bf16|q8_0|q4_0|q4_k|q5_k|q6_k|q4_k_m|q5_k_m] [--seed S]
//
// Metadata: general.architecture (--arch, default llama), general.name,
// general.file_type, the architecture's keys (llama: the llama.* keys
// stories260K has plus rope.freq_base 10000 (the llama3.2-1b preset:
// 500000) and rms eps 1e-5; qwen2: the
// qwen2.* keys llama.cpp's converter writes for Qwen2, no
// rope.dimension_count, rope.freq_base 1e6, rms eps 1e-6),
// tandem.synth.seed, then every tokenizer.* key of --vocab-from in its file
// order (tokenizer.ggml.* and e.g. tokenizer.chat_template; or, with
// --vocab byte, ByteVocabMetadata()).
// Tensors, in stories260K's order: token_embd, output_norm, output (llama
// only: qwen2 ties the output to token_embd, as Qwen2.5-0.5B), then per
// layer attn_q, attn_k, attn_v (qwen2: each followed by its .bias),
// attn_output, attn_norm, ffn_gate, ffn_down, ffn_up, ffn_norm. Norm
// weights are 1 and always F32; biases are always F32; every other value is
// SynthWeight(seed, index of the tensor in that order, i), stored as --type
// (quantize.h: F16 IEEE half, BF16 the high half of a binary32, both
// rounding to nearest even; Q8_0, Q4_0, Q4_K,
// Q5_K, Q6_K by ggml's quantize_row_*_ref, the bytes llama-quantize
// writes). q4_k_m / q5_k_m are llama.cpp's mixes (MixTensorType: Q4_K /
// Q5_K, with Q6_K for output.weight and some attn_v / ffn_down; qwen2's
// tied token_embd counts as the output); every other quantized --type is
// pure (token_embd and output too). general.file_type is llama.cpp's
// llama_ftype (LlamaFileType). Same flags -> identical bytes (and --arch
// llama writes what the tool wrote before --arch existed).
// Exit status: 0 written, 1 I/O or vocabulary error, 2 bad flag.
#ifndef TANDEM_TOOLS_SYNTH_MODEL_H_
#define TANDEM_TOOLS_SYNTH_MODEL_H_

#include <cstdint>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "engine/gguf/gguf_file.h"
#include "engine/gguf/gguf_writer.h"
#include "tools/quantize.h"  // FloatToHalf, QuantizeRowQ8_0, ... (declared there)

namespace tandem::cli {

// The architecture written (general.architecture): the llama graph, or
// qwen2 (Q/K/V biases, NEOX RoPE, tied output). engine/model's table has
// the rules of each; this enum only picks what to write.
enum class SynthArch { kLlama, kQwen2 };

// "llama" or "qwen2".
const char* SynthArchName(SynthArch arch);

// A model shape. head_dim = dim / heads; rope dims = head_dim.
struct SynthShape {
  int32_t dim = 0;
  int32_t layers = 0;
  int32_t heads = 0;
  int32_t kv_heads = 0;
  int32_t ff = 0;
  int32_t context = 0;
  // <arch>.rope.freq_base; 0: the architecture's default (llama 10000,
  // qwen2 1e6). Only presets set it.
  float rope_freq_base = 0.0f;
};

struct SynthModelOptions {
  std::string out;
  std::string vocab_from;              // "" when byte_vocab
  bool byte_vocab = false;             // --vocab byte: ByteVocabMetadata() instead
  SynthArch arch = SynthArch::kLlama;  // --arch
  std::string preset;                  // "" for an explicit shape
  SynthShape shape;
  // --type: every 2-D weight's type (mix kPure), or the base type of the
  // mix (q4_k_m: Q4_K, q5_k_m: Q5_K, mix kKQuantM).
  gguf::TensorType type = gguf::TensorType::kF32;
  QuantMix mix = QuantMix::kPure;
  uint64_t seed = 0;
};

// The --type value of (type, mix): "f32", "q4_k_m", ...
std::string SynthTypeName(gguf::TensorType type, QuantMix mix);

// The presets: "15M" and "110M" as llama2.c's stories15M / stories110M
// (dim 288, 6 layers, 6 heads, ff 768, context 256; dim 768, 12 layers,
// 12 heads, ff 2048, context 1024), "1B" a TinyLlama-1.1B-like shape
// (dim 2048, 16 layers, 32 heads, 8 KV heads, ff 5632, context 2048),
// "llama3.2-1b" Llama 3.2 1B's shape (dim 2048, 16 layers, 32 heads, 8 KV
// heads, ff 8192, context 8192, rope base 500000; meant with the 32000-token
// SPM vocabulary of ggml-vocab-llama-spm.gguf, not Llama 3's 128k BPE one;
// untied output, no rope_freqs scaling). INVALID_ARGUMENT naming --preset for another name.
[[nodiscard]] absl::StatusOr<SynthShape> SynthPreset(const std::string& name);

// Parses the arguments after "synth-model" and checks the shape:
// INVALID_ARGUMENT naming the flag for a missing --out, neither or both of
// --vocab-from and --vocab, a --vocab other than "byte", an --arch other
// than llama or qwen2, a
// --preset mixed with shape flags, a missing shape flag, a value out of
// [1, 65536] (layers [1, 1024]), dim % heads != 0, heads % kv-heads != 0,
// an odd head dim (RoPE rotates pairs), an unknown --type, or dim or ff
// not a multiple of the --type's block (blocks run along each row: dim is
// the row length of token_embd, output and the attention / ffn_gate /
// ffn_up weights, ff that of ffn_down): 32 for q8_0 and q4_0, 256 for
// q4_k, q5_k, q6_k, q4_k_m and q5_k_m (so the 15M preset, dim 288, is
// refused for those), naming --dim or --ff.
[[nodiscard]] absl::StatusOr<SynthModelOptions> ParseSynthModelArgs(
    const std::vector<std::string>& args);

// Element i of the tensor with index `tensor` (order above): a normal
// sample with mean 0 and standard deviation 0.02 from a counter-based
// generator, so any element can be computed alone. With
// mix(z) = SplitMix64's finalizer of z + 0x9e3779b97f4a7c15 and
// s = mix(seed ^ mix(tensor)): a = mix(s + 2i), b = mix(s + 2i + 1),
// u1 = ((a >> 11) + 1) / 2^53 in (0, 1], u2 = (b >> 11) / 2^53, and
// (Box-Muller, in double) x = 0.02 * sqrt(-2 ln u1) * cos(2 pi u2),
// rounded to float.
float SynthWeight(uint64_t seed, uint64_t tensor, uint64_t i);

// Tokenizer metadata, in file order: key and value.
using TokenizerMetadata = std::vector<std::pair<std::string, gguf::MetadataValue>>;

// Every tokenizer.* pair of `vocab` in file order: tokenizer.ggml.* (model,
// pre, tokens, scores or merges, token_type, which marks added tokens as
// control / user-defined, special ids, add_bos/add_eos) and the others,
// e.g. tokenizer.chat_template, so a BPE vocabulary is copied whole.
TokenizerMetadata TokenizerMetadataOf(const gguf::GgufFile& vocab);

// Tandem's own byte-level SentencePiece vocabulary (no file needed), for
// models whose text does not matter. 260 tokens: <unk> (id 0, type 2
// unknown), <s> (1, type 3 control), </s> (2, control), <0x00>..<0xFF>
// (ids 3..258, type 6 byte) and U+2581 "▁" (259, type 1 normal: the
// SPM tokenizer escapes every space to it before byte fallback, so without
// it a space would come back as the three bytes of U+2581). Scores 0.
// Keys: tokenizer.ggml.model "llama", tokens, scores, token_type,
// bos_token_id 1, eos_token_id 2, unknown_token_id 0 (uint32),
// add_bos_token true, add_space_prefix false (so decode(encode(t)) == t
// for any UTF-8 text without U+2581). Types and defaults as llama.cpp's
// llama_token_type and llm_tokenizer_spm.
TokenizerMetadata ByteVocabMetadata();

// The model's writer (tensors are filled at write time). `vocab` is the
// --vocab-from file; it must outlive the writer; its tokenizer.* pairs are
// TokenizerMetadataOf(vocab). Errors: INVALID_ARGUMENT naming the file when
// the servers cannot build its tokenizer (tokenizer::Tokenizer::FromGguf,
// e.g. a WordPiece "bert" vocabulary) or it has no tokenizer.ggml.tokens
// string array.
[[nodiscard]] absl::StatusOr<gguf::GgufWriter> BuildSynthModel(const SynthModelOptions& options,
                                                               const gguf::GgufFile& vocab);
// The same with the tokenizer.* pairs given directly (e.g.
// ByteVocabMetadata(), TokenizerMetadataOf(file); pairs with another
// prefix are skipped). INVALID_ARGUMENT when they hold no non-empty
// tokenizer.ggml.tokens string array.
[[nodiscard]] absl::StatusOr<gguf::GgufWriter> BuildSynthModel(const SynthModelOptions& options,
                                                               const TokenizerMetadata& tokenizer);

// Opens --vocab-from (unless byte_vocab), builds and writes --out. Errors
// from GgufFile::Open, BuildSynthModel and GgufWriter::WriteFile.
[[nodiscard]] absl::Status WriteSynthModel(const SynthModelOptions& options);

// The model `tandem up` serves when there is no model at all: dim 64,
// 2 layers, 4 heads, 2 KV heads, ff 128, context 2048, F32, seed 0, byte
// vocabulary, written to `out`.
SynthModelOptions OfflineModelOptions(const std::string& out);

// Makes sure `options.out` holds exactly the bytes WriteSynthModel would
// write: leaves an identical file alone, otherwise (missing, or different
// bytes) creates its parent directories and writes it. Returns whether it
// wrote. Errors: FAILED_PRECONDITION naming the directory or file that
// cannot be created or read, and those of WriteSynthModel.
[[nodiscard]] absl::StatusOr<bool> EnsureSynthModel(const SynthModelOptions& options);

// The subcommand: parses, writes, prints one line "tandem: wrote PATH
// (N bytes, ...)". Returns the exit status (see top of file).
int RunSynthModel(const std::vector<std::string>& args);

}  // namespace tandem::cli

#endif  // TANDEM_TOOLS_SYNTH_MODEL_H_
