// KvLayout helpers (kv_transfer.h).
#include <string>

#include "absl/strings/str_cat.h"
#include "kvtransfer/kv_transfer.h"

namespace tandem::kvtransfer {
namespace {

template <typename T>
absl::Status Mismatch(const char* field, const T& local, const T& remote) {
  return absl::FailedPreconditionError(
      absl::StrCat("KV layout mismatch in field '", field, "': local ", local,
                   ", remote ", remote));
}

absl::Status Mismatch(const char* field, const std::string& local,
                      const std::string& remote) {
  return absl::FailedPreconditionError(
      absl::StrCat("KV layout mismatch in field '", field, "': local \"", local,
                   "\", remote \"", remote, "\""));
}

}  // namespace

uint64_t KvLayout::FrameBytes(uint32_t token_count) const {
  return 2ull * token_count * kv_dim() * sizeof(float);
}

absl::Status CheckCompatible(const KvLayout& local, const KvLayout& remote) {
  // Fields in wire order, so the first difference named is stable.
#define TANDEM_CHECK_FIELD(f) \
  if (local.f != remote.f) return Mismatch(#f, local.f, remote.f)
  TANDEM_CHECK_FIELD(model_fingerprint);
  TANDEM_CHECK_FIELD(n_layers);
  TANDEM_CHECK_FIELD(n_kv_heads);
  TANDEM_CHECK_FIELD(head_dim);
  TANDEM_CHECK_FIELD(dtype);
  TANDEM_CHECK_FIELD(rope_freq_base);
  TANDEM_CHECK_FIELD(rope_dim);
  TANDEM_CHECK_FIELD(rope_type);
  TANDEM_CHECK_FIELD(numerics_id);
#undef TANDEM_CHECK_FIELD
  return absl::OkStatus();
}

}  // namespace tandem::kvtransfer
