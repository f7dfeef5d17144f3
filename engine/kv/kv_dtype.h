// Element type of a KV cache, shared by the engine's KV storage and the KV
// wire protocol (header only: kvtransfer/ uses it without linking the
// engine). Values are ggml's `enum ggml_type` numbers (ggml.h:
// GGML_TYPE_F32 = 0, GGML_TYPE_F16 = 1, GGML_TYPE_BF16 = 30), which is also
// what travels on the wire. Threads: pure functions.
#ifndef TANDEM_ENGINE_KV_KV_DTYPE_H_
#define TANDEM_ENGINE_KV_KV_DTYPE_H_

#include <cstdint>

namespace tandem::kv {

enum class KvDtype : uint32_t { kF32 = 0, kF16 = 1, kBF16 = 30 };

// True for the three values of KvDtype (a u32 read from the wire may be
// anything).
inline bool IsKnownKvDtype(uint32_t value) {
  switch (static_cast<KvDtype>(value)) {
    case KvDtype::kF32:
    case KvDtype::kF16:
    case KvDtype::kBF16:
      return true;
  }
  return false;
}

// "f32", "f16", "bf16"; "unknown" for a value outside the enum.
inline const char* KvDtypeName(KvDtype dtype) {
  switch (dtype) {
    case KvDtype::kF32:
      return "f32";
    case KvDtype::kF16:
      return "f16";
    case KvDtype::kBF16:
      return "bf16";
  }
  return "unknown";
}

// Bytes per element: 4, 2, 2; 0 for a value outside the enum.
inline uint32_t KvDtypeBytes(KvDtype dtype) {
  switch (dtype) {
    case KvDtype::kF32:
      return 4;
    case KvDtype::kF16:
      return 2;
    case KvDtype::kBF16:
      return 2;
  }
  return 0;
}

}  // namespace tandem::kv

#endif  // TANDEM_ENGINE_KV_KV_DTYPE_H_
