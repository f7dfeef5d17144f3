#include "kvtransfer/nccl/transport_setup.h"

#include <cstring>

#include "absl/status/status.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "kvtransfer/nccl/nccl_comm.h"

namespace tandem::kvtransfer::nccl {
namespace {

constexpr std::string_view kMagic = "NCL1";
constexpr size_t kMaxInstanceBytes = 256;

void PutLe(uint64_t value, int bytes, std::string* out) {
  for (int i = 0; i < bytes; ++i) out->push_back(static_cast<char>((value >> (8 * i)) & 0xff));
}

// Reads `bytes` little-endian bytes; false when `in` is too short.
bool GetLe(std::string_view* in, int bytes, uint64_t* value) {
  if (in->size() < static_cast<size_t>(bytes)) return false;
  *value = 0;
  for (int i = 0; i < bytes; ++i) {
    *value |= uint64_t{static_cast<unsigned char>((*in)[i])} << (8 * i);
  }
  in->remove_prefix(bytes);
  return true;
}

bool GetStr(std::string_view* in, size_t max, std::string* out) {
  uint64_t n = 0;
  if (!GetLe(in, 4, &n) || n > max || in->size() < n) return false;
  out->assign(in->data(), n);
  in->remove_prefix(n);
  return true;
}

[[nodiscard]] absl::Status Malformed(const std::string& what) {
  return absl::FailedPreconditionError(absl::StrCat("malformed nccl transport_setup: ", what));
}

}  // namespace

absl::Status CommunicatorLost(const absl::Status& status) {
  if (status.ok() || IsCommunicatorLost(status)) return status;
  return absl::Status(status.code(), absl::StrCat(status.message(), " ", kCommunicatorLost));
}

bool IsCommunicatorLost(const absl::Status& status) {
  return absl::StrContains(status.message(), kCommunicatorLost);
}

std::string EncodeNcclSetup(const NcclSetup& setup) {
  std::string out(kMagic);
  PutLe(setup.generation, 8, &out);
  PutLe(setup.p_instance.size(), 4, &out);
  out += setup.p_instance;
  PutLe(setup.unique_id.size(), 4, &out);
  out += setup.unique_id;
  return out;
}

absl::StatusOr<NcclSetup> DecodeNcclSetup(std::string_view in) {
  if (in.substr(0, kMagic.size()) != kMagic) return Malformed("bad magic");
  in.remove_prefix(kMagic.size());
  NcclSetup setup;
  if (!GetLe(&in, 8, &setup.generation)) return Malformed("truncated generation");
  if (setup.generation == 0) return Malformed("generation 0");
  if (!GetStr(&in, kMaxInstanceBytes, &setup.p_instance) || setup.p_instance.empty()) {
    return Malformed("bad 'p_instance'");
  }
  if (!GetStr(&in, kNcclUniqueIdBytes, &setup.unique_id) ||
      (!setup.unique_id.empty() && setup.unique_id.size() != kNcclUniqueIdBytes)) {
    return Malformed(absl::StrCat("'unique_id' must be empty or ", kNcclUniqueIdBytes, " bytes"));
  }
  if (!in.empty()) return Malformed(absl::StrCat(in.size(), " trailing bytes"));
  return setup;
}

}  // namespace tandem::kvtransfer::nccl
