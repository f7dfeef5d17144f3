#include "kvtransfer/cuda_ipc/ipc_codec.h"

#include <cstring>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"

namespace tandem::kvtransfer::cuda_ipc {
namespace {

static_assert(__BYTE_ORDER__ == __ORDER_LITTLE_ENDIAN__, "the codec writes host order");

void PutU32(std::string* out, uint32_t v) { out->append(reinterpret_cast<char*>(&v), 4); }
void PutU64(std::string* out, uint64_t v) { out->append(reinterpret_cast<char*>(&v), 8); }
void PutStr(std::string* out, std::string_view s) {
  PutU32(out, static_cast<uint32_t>(s.size()));
  out->append(s);
}

// Bounds-checked reads; the first failure names its field and sticks.
class Reader {
 public:
  explicit Reader(std::string_view in) : in_(in) {}
  bool U32(const char* field, uint32_t* v) { return Raw(field, v, 4); }
  bool U64(const char* field, uint64_t* v) { return Raw(field, v, 8); }
  bool Str(const char* field, std::string* s) {
    uint32_t n = 0;
    if (!U32(field, &n)) return false;
    if (n > in_.size() - pos_) return Fail(field, "truncated");
    s->assign(in_.substr(pos_, n));
    pos_ += n;
    return true;
  }
  size_t left() const { return in_.size() - pos_; }
  const std::string& error() const { return error_; }
  bool Fail(const char* field, absl::string_view what) {
    if (error_.empty()) error_ = absl::StrCat("field '", field, "' ", what);
    return false;
  }

 private:
  bool Raw(const char* field, void* v, size_t n) {
    if (!error_.empty()) return false;
    if (left() < n) return Fail(field, "truncated");
    std::memcpy(v, in_.data() + pos_, n);
    pos_ += n;
    return true;
  }
  std::string_view in_;
  size_t pos_ = 0;
  std::string error_;
};

std::string EncodeSetupWith(const IpcSetup& s, bool with_events) {
  std::string out;
  PutU32(&out, kCodecVersion);
  PutStr(&out, s.host_id);
  PutU64(&out, static_cast<uint64_t>(s.pid));
  PutStr(&out, s.instance_id);
  PutU32(&out, static_cast<uint32_t>(s.device_ordinal));
  PutStr(&out, s.k_handle);
  PutStr(&out, s.v_handle);
  PutU64(&out, s.pool_bytes);
  PutU32(&out, static_cast<uint32_t>(s.n_layers));
  PutU32(&out, static_cast<uint32_t>(s.layer_blocks));
  PutU32(&out, static_cast<uint32_t>(s.block_size));
  PutU32(&out, static_cast<uint32_t>(s.kv_dim));
  PutU32(&out, static_cast<uint32_t>(s.dtype));
  PutU32(&out, static_cast<uint32_t>(s.n_layers));
  for (int32_t l = 0; l < s.n_layers; ++l) {
    bool have = with_events && static_cast<size_t>(l) < s.event_handles.size();
    PutStr(&out, have ? std::string_view(s.event_handles[l]) : std::string_view());
  }
  return out;
}

}  // namespace

std::string EncodeSetup(const IpcSetup& setup, bool* events_dropped) {
  std::string out = EncodeSetupWith(setup, /*with_events=*/true);
  bool dropped = out.size() > kMaxSetupBytes;
  if (dropped) out = EncodeSetupWith(setup, /*with_events=*/false);
  if (events_dropped != nullptr) *events_dropped = dropped;
  return out;
}

absl::StatusOr<IpcSetup> DecodeSetup(std::string_view bytes) {
  auto bad = [](absl::string_view what) {
    return absl::FailedPreconditionError(
        absl::StrCat("malformed cuda_ipc transport_setup: ", what));
  };
  if (bytes.size() > kMaxSetupBytes) {
    return bad(absl::StrCat(bytes.size(), " bytes (at most ", kMaxSetupBytes, ")"));
  }
  Reader r(bytes);
  IpcSetup s;
  uint32_t version = 0, device = 0, n_layers = 0, layer_blocks = 0, block_size = 0, kv_dim = 0,
           dtype = 0, n_events = 0;
  uint64_t pid = 0;
  if (r.U32("version", &version) && version != kCodecVersion) {
    return bad(
        absl::StrCat("field 'version' ", version, " (this worker speaks ", kCodecVersion, ")"));
  }
  r.Str("host_id", &s.host_id) && r.U64("pid", &pid) && r.Str("instance_id", &s.instance_id) &&
      r.U32("device_ordinal", &device) && r.Str("k_handle", &s.k_handle) &&
      r.Str("v_handle", &s.v_handle) && r.U64("pool_bytes", &s.pool_bytes) &&
      r.U32("n_layers", &n_layers) && r.U32("layer_blocks", &layer_blocks) &&
      r.U32("block_size", &block_size) && r.U32("kv_dim", &kv_dim) && r.U32("dtype", &dtype) &&
      r.U32("n_events", &n_events);
  if (!r.error().empty()) return bad(r.error());
  constexpr uint32_t kMaxShape = 1u << 30;
  struct {
    const char* name;
    uint32_t value;
  } shapes[] = {{"n_layers", n_layers},
                {"layer_blocks", layer_blocks},
                {"block_size", block_size},
                {"kv_dim", kv_dim}};
  for (const auto& f : shapes) {
    if (f.value == 0 || f.value > kMaxShape) {
      return bad(absl::StrCat("field '", f.name, "' ", f.value, " outside [1, ", kMaxShape, "]"));
    }
  }
  if (!kv::IsKnownKvDtype(dtype)) return bad(absl::StrCat("field 'dtype' unknown value ", dtype));
  if (n_events != n_layers) {
    return bad(absl::StrCat("field 'n_events' ", n_events, " != n_layers ", n_layers));
  }
  s.event_handles.resize(n_events);
  for (uint32_t l = 0; l < n_events; ++l) {
    if (!r.Str("event_handle", &s.event_handles[l])) return bad(r.error());
  }
  if (r.left() != 0) return bad(absl::StrCat(r.left(), " trailing bytes"));
  s.pid = static_cast<int64_t>(pid);
  s.device_ordinal = static_cast<int32_t>(device);
  s.n_layers = static_cast<int32_t>(n_layers);
  s.layer_blocks = static_cast<int32_t>(layer_blocks);
  s.block_size = static_cast<int32_t>(block_size);
  s.kv_dim = static_cast<int32_t>(kv_dim);
  s.dtype = static_cast<kv::KvDtype>(dtype);
  return s;
}

std::string EncodeLocator(const IpcLocator& locator) {
  std::string out;
  PutU32(&out, kCodecVersion);
  PutU32(&out, locator.first_block);
  PutStr(&out, locator.event_handle);
  PutU32(&out, static_cast<uint32_t>(locator.blocks.size()));
  for (int32_t b : locator.blocks) PutU32(&out, static_cast<uint32_t>(b));
  return out;
}

absl::StatusOr<IpcLocator> DecodeLocator(std::string_view bytes) {
  auto bad = [](absl::string_view what) {
    return absl::DataLossError(absl::StrCat("malformed cuda_ipc locator: ", what));
  };
  if (bytes.size() > kMaxLocatorBytes) {
    return bad(absl::StrCat(bytes.size(), " bytes (at most ", kMaxLocatorBytes, ")"));
  }
  Reader r(bytes);
  IpcLocator loc;
  uint32_t version = 0, n_blocks = 0;
  if (r.U32("version", &version) && version != kCodecVersion) {
    return bad(absl::StrCat("field 'version' ", version, " (expected ", kCodecVersion, ")"));
  }
  r.U32("first_block", &loc.first_block) && r.Str("event_handle", &loc.event_handle) &&
      r.U32("n_blocks", &n_blocks);
  if (!r.error().empty()) return bad(r.error());
  if (n_blocks == 0) return bad("field 'n_blocks' 0");
  if (static_cast<uint64_t>(n_blocks) * 4 != r.left()) {
    return bad(absl::StrCat("field 'n_blocks' ", n_blocks, " needs ",
                            static_cast<uint64_t>(n_blocks) * 4, " bytes, ", r.left(), " left"));
  }
  loc.blocks.resize(n_blocks);
  for (uint32_t i = 0; i < n_blocks; ++i) {
    uint32_t b = 0;
    r.U32("blocks", &b);
    if (b > static_cast<uint32_t>(INT32_MAX)) {
      return bad(absl::StrCat("field 'blocks[", i, "]' ", b, " is not a block id"));
    }
    loc.blocks[i] = static_cast<int32_t>(b);
  }
  return loc;
}

}  // namespace tandem::kvtransfer::cuda_ipc
