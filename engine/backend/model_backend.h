// The backend seam under the engine core (DESIGN.md, GPU workers): "run one
// forward step over a flattened batch with block tables, calling the
// per-layer hook" plus the KV cache memory (kv::KvStorage). The CPU backend
// (cpu_backend.h) is the first implementation; a CUDA backend is the next.
// Nothing above this seam reaches into a model or its KV memory another
// way (llama.cpp's ggml backend interface is as small: buffers + compute).
//
// Owns (an implementation): the model's weights on its device, the KV
// memory, the forward pass, and the reduction of each sampled row's logits
// to a sampling::SamplingView. Does not touch: which blocks are free or
// whose they are (the KV cache manager), scheduling, the random draw
// (the host sampler picks from the view with the counter-based draw).
// Threads: an implementation is not thread-safe; the engine loop calls it.
#ifndef TANDEM_ENGINE_BACKEND_MODEL_BACKEND_H_
#define TANDEM_ENGINE_BACKEND_MODEL_BACKEND_H_

#include <cstddef>
#include <cstdint>
#include <functional>
#include <span>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "engine/kv/kv_storage.h"
#include "engine/model/llama_model.h"
#include "engine/sampling/sampler.h"
#include "engine/sampling/sampling_view.h"

namespace tandem::backend {

// One sequence's slice of a flattened batch: tokens at absolute positions
// [start_pos, start_pos + tokens.size()). The block table must cover
// start_pos + tokens.size() tokens; K/V of positions < start_pos must
// already be in the cache.
struct ForwardEntry {
  std::span<const int32_t> tokens;
  int32_t start_pos = 0;
  const std::vector<int32_t>* block_table = nullptr;
  // Non-null: reduce the logits of this slice's last token to a
  // SamplingView built with these options (logit processors included).
  const sampling::SamplingOptions* sampling = nullptr;
  // With `sampling`: the sequence's prompt and generated tokens, the
  // input of the penalties and the min_tokens mask (sampling::TokenHistory;
  // the output index sampled is history.generated.size()). The spans must
  // stay valid until Forward returns.
  sampling::TokenHistory history;
};

// Called after layer `layer` has written K/V of tokens [token_start,
// token_start + token_count) of batch entry `entry` into the KV storage,
// before the next layer runs. A GPU backend calls it once the layer's
// writes are visible to a KvStorage::ReadTokens.
// Same signature as model::LayerHook: (entry, layer, token_start,
// token_count).
using LayerHook = model::LayerHook;

class ModelBackend {
 public:
  virtual ~ModelBackend() = default;

  // The model's hyperparameters (vocab_size, context_length, layers, ...).
  virtual const model::LlamaConfig& config() const = 0;
  // The KV memory the forward reads and writes, allocated by the backend
  // at construction (num_blocks blocks of block_size tokens).
  virtual kv::KvStorage& kv_storage() = 0;
  // What must match for two processes to produce bit-identical results
  // (backend, ISA, arithmetic version), e.g. "tandem-cpu/avx512/v2".
  virtual std::string bit_exact_class() const = 0;

  // Runs one forward step over `batch` and, in batch order, one view per
  // entry with `sampling` set into *views (resized). `hook` (may be null)
  // runs on the calling thread. Preconditions (caller bugs, abort): block
  // tables cover their entries and name blocks of kv_storage(); token ids
  // are in [0, vocab_size).
  // Errors (a device backend; the CPU backend never fails): the step did
  // not complete, *views and the K/V this step wrote are garbage, and the
  // caller fails the step's requests (and frees their blocks).
  // RESOURCE_EXHAUSTED (device out of memory) or INTERNAL (another
  // recoverable device error): later steps may succeed. After a sticky
  // error (e.g. an illegal address: the device context is lost),
  // device_lost() is true and every later Forward fails too.
  [[nodiscard]] virtual absl::Status Forward(std::span<const ForwardEntry> batch,
                                             const LayerHook* hook,
                                             std::vector<sampling::SamplingView>* views) = 0;

  // True once a sticky device error has happened: the backend can never
  // compute again, and the process must exit so that it is restarted
  // (DESIGN.md, GPU workers: errors).
  virtual bool device_lost() const { return false; }
};

}  // namespace tandem::backend

#endif  // TANDEM_ENGINE_BACKEND_MODEL_BACKEND_H_
