// The KV cache's memory behind a small interface: the block pool seam of a
// backend (DESIGN.md, GPU workers; llama.cpp's ggml backend buffers play
// the same part).
//
// Owns: nothing itself; an implementation owns the K/V bytes of
// num_blocks() blocks. Does not touch: which blocks are free (BlockPool),
// which sequence holds which block (KvCacheManager), scheduling.
// Threads: an implementation is not thread-safe; the engine loop calls it,
// and a KV receiver may write blocks that nothing else touches meanwhile.
//
// Addressing is by token (DESIGN.md, KV transfer): token t of a sequence
// lives in block block_table[t / block_size], slot t % block_size, so the
// two ends of a KV transfer may use different block sizes. One token's K
// (or V) of one layer is row_bytes() bytes in the storage's dtype: kv_dim
// elements, KV head after KV head, head_dim elements each.
#ifndef TANDEM_ENGINE_KV_KV_STORAGE_H_
#define TANDEM_ENGINE_KV_KV_STORAGE_H_

#include <cstddef>
#include <cstdint>
#include <span>

#include "engine/kv/kv_dtype.h"

namespace tandem::kv {

// Shape of a KV cache: per layer, n_kv_heads * head_dim elements of K and
// as many of V per token; block_size token slots per block.
struct KvShape {
  int32_t n_layers = 0;
  int32_t n_kv_heads = 0;
  int32_t head_dim = 0;
  int32_t block_size = 16;  // token slots per block
  int32_t kv_dim() const { return n_kv_heads * head_dim; }
};

class KvStorage {
 public:
  virtual ~KvStorage() = default;

  virtual const KvShape& shape() const = 0;
  virtual KvDtype dtype() const = 0;
  virtual int32_t num_blocks() const = 0;
  // Bytes of one token's K (or V) of one layer: kv_dim * element bytes.
  size_t row_bytes() const { return static_cast<size_t>(shape().kv_dim()) * KvDtypeBytes(dtype()); }

  // Copies K and V of tokens [token_start, token_start + count) of `layer`
  // of the sequence with `block_table` into k_out and v_out, count *
  // row_bytes() bytes each, token after token. The table must cover
  // token_start + count tokens and name blocks < num_blocks() (a caller
  // bug otherwise).
  virtual void ReadTokens(std::span<const int32_t> block_table, int32_t layer, int32_t token_start,
                          int32_t count, char* k_out, char* v_out) const = 0;
  // The reverse: writes count * row_bytes() bytes of each of k and v.
  virtual void WriteTokens(std::span<const int32_t> block_table, int32_t layer, int32_t token_start,
                           int32_t count, const char* k, const char* v) = 0;
};

// Number of blocks needed to hold n_tokens: ceil(n_tokens / block_size).
int32_t BlocksForTokens(int32_t n_tokens, int32_t block_size);

}  // namespace tandem::kv

#endif  // TANDEM_ENGINE_KV_KV_STORAGE_H_
