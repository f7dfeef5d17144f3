// The forward pass of Llama-family models (llama, qwen2: the table in
// model_arch.h) on the CPU over a paged KV cache.
//
// Owns: the model's weights (matrices in their GGUF type, F32/F16/BF16/Q8_0,
// read in place from the mapping; under LlamaModelOptions::q8_matmul int8
// also a packed copy of each Q8_0 matrix; norm, bias and RoPE
// frequency-factor vectors as F32), the forward computation and its thread pool. Does not
// touch: allocation of KV blocks (the caller passes block tables),
// sampling, scheduling.
// Threads: a model built with num_threads = N owns a ThreadPool of N
// threads (N - 1 workers plus the thread calling Forward). Forward splits
// each MatMul over output columns, attention over (token, head) pairs and
// the row/element-wise ops over rows/elements, each only when the kernel is
// big enough to be worth waking the workers (cpu_kernels.h,
// kMinParallelWork). No reduction is ever split, so the logits are
// bit-identical for every N (DESIGN.md, batch-invariant numerics). The
// caller serializes Forward calls on one model instance (the engine loop
// does); a concurrent call is still computed correctly, but its parallel
// sections wait for the other call's (the pool runs one loop at a time),
// and the two must not use the same KV blocks.
//
// Graph: one forward for every architecture of the table (model_arch.h),
// llama.cpp's llm_build_llama and llm_build_qwen2, which differ only in the
// row's choices. x = token_embd[t]; per layer:
//   n = RMSNorm(x)·attn_norm
//   q = Wq·n (+ bq), k = Wk·n (+ bk), v = Wv·n (+ bv)   biases: qkv_bias
//   h = x + Wo·Attn(RoPE(q), RoPE(k), v)
//   m = RMSNorm(h)·ffn_norm
//   x = h + Wdown·(SiLU(Wgate·m) ⊙ Wup·m)
// logits = output·(RMSNorm(x)·output_norm), output = token_embd when the
// file has no output.weight (tied).
//   llama: RoPE NORM, Q/K/V biases used when the file has them, optional
//          rope_freqs.weight (Llama 3.1 scaling).
//   qwen2: RoPE NEOX, Q/K/V biases required, no rope_freqs.
// RoPE rotates pair i (0 <= i < rope_dim / 2) of every head of q and k by
//   theta_i = pos · freq_base^(-2i/rope_dim) / freq_factors[i]
// (freq_factors = rope_freqs.weight, else 1; ggml's rope_f32 with src2),
// (x0, x1) -> (x0 cos - x1 sin, x0 sin + x1 cos), where the pair is
// (2i, 2i + 1) in NORM mode and (i, i + rope_dim/2) in NEOX mode;
// dimensions >= rope_dim are left as they are. GQA: query head h reads KV
// head h / (n_head / n_head_kv). Attention scale 1/sqrt(head_dim), causal.
// The bias adds and both rotations are elementwise, so they keep the
// batch-invariant numerics (cpu_kernels.h).
#ifndef TANDEM_ENGINE_MODEL_LLAMA_MODEL_H_
#define TANDEM_ENGINE_MODEL_LLAMA_MODEL_H_

#include <cstddef>
#include <cstdint>
#include <functional>
#include <memory>
#include <span>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "engine/gguf/gguf_file.h"
#include "engine/kv/cpu_kv_storage.h"
#include "engine/model/model_arch.h"
#include "engine/forward_options.h"

namespace tandem::model {
class ThreadPool;
namespace internal {
struct ModelWeights;
}  // namespace internal

// Hyperparameters from GGUF metadata ("<arch>.*" keys, e.g. llama.* or
// qwen2.*), with llama.cpp's defaults where a key is absent
// (rope.freq_base 10000, rope dims = head_dim, n_head_kv = n_head, vocab =
// tokenizer.ggml.tokens size), plus the architecture's row (model_arch.h)
// and which optional tensors the file has. Default-constructed: llama with
// no optional tensors.
struct LlamaConfig {
  std::string architecture;              // general.architecture: "llama" or "qwen2"
  ModelArch arch = ModelArch::kLlama;    // the table row of `architecture`
  RopeType rope_type = RopeType::kNorm;  // the row's RoPE pairing
  // blk.N.attn_{q,k,v}.bias are in the file (qwen2: always; llama: when
  // present) and are added after Wq/Wk/Wv.
  bool qkv_bias = false;
  // rope_freqs.weight is in the file (llama only): theta_i is divided by
  // its element i.
  bool rope_freq_factors = false;
  std::string name;  // general.name
  int32_t context_length = 0;
  int32_t n_embd = 0;
  int32_t n_layers = 0;
  int32_t n_ff = 0;
  int32_t n_head = 0;
  int32_t n_head_kv = 0;
  int32_t head_dim = 0;
  int32_t rope_dim = 0;
  float rope_freq_base = 10000.0f;
  float rms_norm_eps = 1e-5f;
  int32_t vocab_size = 0;
};

// One sequence's slice of a flattened batch: tokens at absolute positions
// [start_pos, start_pos + n_tokens). Its block table must cover
// start_pos + n_tokens tokens; K/V of positions < start_pos must already be
// in the cache.
struct SequenceBatch {
  std::span<const int32_t> tokens;
  int32_t start_pos = 0;
  const std::vector<int32_t>* block_table = nullptr;
  bool want_logits = true;  // logits of this slice's last token
};

// Called after layer `layer` has written K/V for tokens
// [token_start, token_start + token_count) of batch entry `seq_index`.
using LayerHook =
    std::function<void(size_t seq_index, int32_t layer, int32_t token_start, int32_t token_count)>;

// Load options; defaults: 1 thread, exact Q8_0.
struct LlamaModelOptions {
  // Threads Forward uses, the caller's included: [1, LlamaModel::kMaxThreads].
  int32_t num_threads = 1;
  // kInt8 repacks every Q8_0 matrix Forward multiplies (the layers' and
  // the output; token_embd is only looked up) once at load, 1.125 bytes
  // per weight beside the mapping's (engine/forward_options.h). A model without Q8_0
  // matrices is unchanged.
  Q8MatMul q8_matmul = Q8MatMul::kExact;
  // Packs every F32 matrix Forward multiplies into column panels once at
  // load (f32_panels.h: 4 bytes per weight beside the mapping's), so
  // MatMul runs the outer-product GEMM, whose numerics (one fma chain per
  // element) the CPU backend's bit-exact class names. False only for a
  // model whose forward runs elsewhere (the CUDA backend, the router's
  // tokenizer-only load): the CPU backend refuses it.
  bool f32_panels = true;
};

class LlamaModel {
 public:
  // Builds from an open GGUF file (which must outlive the model). Errors:
  // INVALID_ARGUMENT for an architecture outside the table (the message
  // names it and lists the supported ones), a missing/ill-shaped tensor or
  // metadata key, a key whose value changes the math in a way not
  // supported (key_length/value_length other than n_embd / n_head, RoPE
  // scaling other than none, experts), a tensor the architecture does not
  // use, an unsupported type (each named in the message).
  // Same as Load(file, 1): Forward runs on the calling thread alone.
  [[nodiscard]] static absl::StatusOr<std::unique_ptr<LlamaModel>> Load(const gguf::GgufFile& file);
  // As above, with a pool of num_threads threads for Forward (the calling
  // thread counts as one, so 1 starts no thread). Errors as above, plus
  // INVALID_ARGUMENT when num_threads is outside [1, kMaxThreads].
  [[nodiscard]] static absl::StatusOr<std::unique_ptr<LlamaModel>> Load(const gguf::GgufFile& file,
                                                                        int32_t num_threads);
  // As above with `options` (num_threads checked as above).
  [[nodiscard]] static absl::StatusOr<std::unique_ptr<LlamaModel>> Load(
      const gguf::GgufFile& file, const LlamaModelOptions& options);
  static constexpr int32_t kMaxThreads = kMaxForwardThreads;

  ~LlamaModel();
  LlamaModel(const LlamaModel&) = delete;
  LlamaModel& operator=(const LlamaModel&) = delete;

  const LlamaConfig& config() const { return config_; }
  // Threads Forward uses, the caller's included (>= 1).
  int32_t num_threads() const { return num_threads_; }
  // How Q8_0 matrices are multiplied (LlamaModelOptions::q8_matmul), and
  // its name, "exact" or "int8", for the bit-exact class.
  Q8MatMul q8_matmul() const { return q8_matmul_; }
  const char* q8_matmul_name() const { return Q8MatMulName(q8_matmul_); }
  // True when q8_matmul() is int8 and every matrix Forward multiplies is
  // Q8_0: no MatMul then runs the ISA-dependent float order, so the
  // forward's bits do not depend on the kernel ISA (the bit-exact class
  // says "int8" instead of the ISA).
  bool all_matmuls_int8() const { return all_matmuls_int8_; }
  // LlamaModelOptions::f32_panels as loaded.
  bool f32_panels() const { return f32_panels_; }
  // True when f32_panels() and every matrix Forward multiplies is F32: each
  // MatMul is then one fma chain per element (f32_panels.h), the same bits
  // on every ISA (the bit-exact class says "fma" instead of the ISA).
  bool all_matmuls_f32_panels() const { return all_matmuls_f32_panels_; }
  kv::KvShape kv_shape(int32_t block_size) const;

  // Runs one forward step over all entries. Resizes `logits` to
  // (number of entries with want_logits) * vocab_size and writes each such
  // entry's last-token logits there, entries in batch order (`logits` may
  // be null when no entry wants logits). Bit-identical per entry for any
  // batch composition or chunking (DESIGN.md rules; see cpu_kernels.h).
  // For each layer, an entry's new K/V rows are written into `kv` before any
  // entry attends, then `hook` (if any) is called once per entry.
  // The hook runs on the calling thread, between layers, while no worker
  // is busy. Preconditions (programmer errors, abort): `kv` has kv_shape()'s
  // layers, heads and head dim; every block table covers start_pos +
  // n_tokens; token ids are in [0, vocab_size) (callers validate request
  // tokens first). See "Threads" above for concurrent calls.
  void Forward(std::span<const SequenceBatch> batch, kv::CpuKvStorage& kv,
               std::vector<float>* logits, const LayerHook* hook = nullptr) const;

  // The host weights (llama_weights.h), for a device backend that uploads
  // them once at start-up (backend/cuda/device_weights.h) and for its
  // tests; valid while the model (and its GGUF file) lives. Nothing else
  // reads them: the CPU forward is Forward.
  const internal::ModelWeights& weights_for_device_upload() const { return *w_; }

  // Tests only: the least work for which Forward splits a kernel across
  // threads (default internal::kMinParallelWork; 0 splits every kernel).
  // Changes speed, never bits. Not to be called while Forward runs.
  void set_min_parallel_work_for_testing(size_t work) { min_parallel_work_ = work; }

 private:
  LlamaModel();
  // fn over [0, n) on the pool when `work` >= min_parallel_work_.
  void For(size_t n, size_t work, const std::function<void(size_t, size_t)>& fn) const;

  LlamaConfig config_;
  std::shared_ptr<const internal::ModelWeights> w_;  // see llama_weights.h
  int32_t num_threads_ = 1;
  Q8MatMul q8_matmul_ = Q8MatMul::kExact;
  bool all_matmuls_int8_ = false;
  bool f32_panels_ = false;
  bool all_matmuls_f32_panels_ = false;
  std::unique_ptr<ThreadPool> pool_;  // null when num_threads_ == 1
  size_t min_parallel_work_;
};

// The instruction set of the GEMM kernels this process uses ("avx512",
// "avx2" or "generic"), chosen once at start-up from the CPU. Part of the
// numerics id: results are bit-identical for every batch size and thread
// count within one ISA, not across ISAs.
const char* KernelIsa();

// Pins the kernel ISA by name before any forward runs (engine.kernel_isa):
// "auto" (the best this CPU runs: no-op), "avx512", "avx2" or "generic".
// Errors: INVALID_ARGUMENT for another name, FAILED_PRECONDITION when this
// CPU cannot run it or another ISA is already in use.
[[nodiscard]] absl::Status PinKernelIsa(const std::string& name);

// XXH3-128 (xxHash 0.8) of the whole model file, as 32 lowercase hex digits
// in xxHash's canonical (big-endian) form, as `xxhsum -H2` prints it:
// identifies the exact weights. Streams the file at file.path() again.
// Errors: UNAVAILABLE when it cannot be read, DATA_LOSS when its size no
// longer matches the mapping.
[[nodiscard]] absl::StatusOr<std::string> ModelFingerprint(const gguf::GgufFile& file);

}  // namespace tandem::model

#endif  // TANDEM_ENGINE_MODEL_LLAMA_MODEL_H_
