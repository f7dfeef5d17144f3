// KvLayout helpers (kv_transfer.h).
#include <string>

#include "absl/strings/str_cat.h"
#include "kvtransfer/kv_transfer.h"

namespace tandem::kvtransfer {
namespace {

// The dtype's name, or "unknown(N)" so that two unknown values still print
// (and compare in LayoutId) differently.
std::string DtypeLabel(KvDtype dtype) {
  if (IsKnownKvDtype(static_cast<uint32_t>(dtype))) return KvDtypeName(dtype);
  return absl::StrCat("unknown(", static_cast<uint32_t>(dtype), ")");
}

[[nodiscard]] absl::Status MismatchError(const char* field, const std::string& local,
                                         const std::string& remote) {
  return absl::FailedPreconditionError(absl::StrCat("KV layout mismatch in field '", field,
                                                    "': local ", local, ", remote ", remote));
}

[[nodiscard]] absl::Status Mismatch(const char* field, uint32_t local, uint32_t remote) {
  return MismatchError(field, absl::StrCat(local), absl::StrCat(remote));
}

[[nodiscard]] absl::Status Mismatch(const char* field, const std::string& local,
                                    const std::string& remote) {
  return MismatchError(field, absl::StrCat("\"", local, "\""), absl::StrCat("\"", remote, "\""));
}

[[nodiscard]] absl::Status Mismatch(const char* field, KvDtype local, KvDtype remote) {
  return MismatchError(field, DtypeLabel(local), DtypeLabel(remote));
}

}  // namespace

uint64_t KvLayout::RowBytes() const {
  // In 64 bits: kv_dim() itself is u32, but kv_dim * 4 may not be.
  return uint64_t{n_kv_heads} * head_dim * KvDtypeBytes(dtype);
}

uint64_t KvLayout::FrameBytes(uint32_t token_count) const {
  return 2 * uint64_t{token_count} * RowBytes();
}

std::string KvLayout::LayoutId() const {
  return absl::StrCat("kv", kKvProtocolVersion, "/", model_fingerprint, "/L", n_layers, ".H",
                      n_kv_heads, ".D", head_dim, "/", DtypeLabel(dtype));
}

[[nodiscard]] absl::Status CheckCompatible(const KvLayout& local, const KvLayout& remote) {
  // Fields in wire order, so the first difference named is stable. Keep in
  // step with LayoutId: OK here iff the layout ids are equal.
#define TANDEM_CHECK_FIELD(f) \
  if (local.f != remote.f) return Mismatch(#f, local.f, remote.f)
  TANDEM_CHECK_FIELD(model_fingerprint);
  TANDEM_CHECK_FIELD(n_layers);
  TANDEM_CHECK_FIELD(n_kv_heads);
  TANDEM_CHECK_FIELD(head_dim);
  TANDEM_CHECK_FIELD(dtype);
#undef TANDEM_CHECK_FIELD
  return absl::OkStatus();
}

}  // namespace tandem::kvtransfer
