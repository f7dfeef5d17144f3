#include "engine/kv/kv_storage.h"

namespace tandem::kv {

int32_t BlocksForTokens(int32_t n_tokens, int32_t block_size) {
  return (n_tokens + block_size - 1) / block_size;
}

}  // namespace tandem::kv
