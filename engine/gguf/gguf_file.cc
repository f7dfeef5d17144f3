// GGUF v3 reader: mmap + a bounds-checked cursor over the header, metadata
// and tensor infos (layout in gguf_file.h, from ggml/docs/gguf.md).
#include "engine/gguf/gguf_file.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <bit>
#include <cerrno>
#include <cstring>
#include <limits>
#include <type_traits>
#include <utility>

#include "absl/status/status.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_format.h"

namespace tandem::gguf {

static_assert(std::endian::native == std::endian::little,
              "GGUF is little-endian; this reader memcpy's fields directly");

namespace {

#define GGUF_RETURN_IF_ERROR(expr)               \
  do {                                           \
    absl::Status gguf_status_ = (expr);          \
    if (!gguf_status_.ok()) return gguf_status_; \
  } while (0)

constexpr uint32_t kMagic = 0x46554747;  // "GGUF" read as little-endian u32
constexpr uint32_t kVersion = 3;
constexpr uint32_t kMaxDims = 4;  // GGML_MAX_DIMS
constexpr uint32_t kDefaultAlignment = 32;

// GGUF metadata value types (gguf.md, enum gguf_type).
enum class ValueType : uint32_t {
  kUint8 = 0,
  kInt8 = 1,
  kUint16 = 2,
  kInt16 = 3,
  kUint32 = 4,
  kInt32 = 5,
  kFloat32 = 6,
  kBool = 7,
  kString = 8,
  kArray = 9,
  kUint64 = 10,
  kInt64 = 11,
  kFloat64 = 12,
};

// A cursor over the mapped bytes. Every read checks the remaining length and
// fails with INVALID_ARGUMENT naming the file, the field and the offset.
class Reader {
 public:
  Reader(const std::string& path, const uint8_t* data, uint64_t size)
      : path_(path), data_(data), size_(size) {}

  uint64_t pos() const { return pos_; }
  uint64_t remaining() const { return size_ - pos_; }

  [[nodiscard]] absl::Status Error(absl::string_view what) const {
    return absl::InvalidArgumentError(
        absl::StrCat(path_, ": ", what, " (at byte offset ", pos_, ")"));
  }

  [[nodiscard]] absl::Status Truncated(absl::string_view field, uint64_t need) const {
    return absl::InvalidArgumentError(
        absl::StrFormat("%s: GGUF file truncated at %s: needs %d bytes at offset %d, only %d "
                        "remain (file size %d)",
                        path_, field, need, pos_, remaining(), size_));
  }

  template <typename T>
  [[nodiscard]] absl::Status Read(absl::string_view field, T* out) {
    static_assert(std::is_trivially_copyable_v<T>);
    if (remaining() < sizeof(T)) return Truncated(field, sizeof(T));
    std::memcpy(out, data_ + pos_, sizeof(T));
    pos_ += sizeof(T);
    return absl::OkStatus();
  }

  [[nodiscard]] absl::Status ReadString(absl::string_view field, std::string* out) {
    uint64_t len = 0;
    GGUF_RETURN_IF_ERROR(Read(absl::StrCat(field, " (string length)"), &len));
    if (len > remaining()) {
      return Truncated(absl::StrCat(field, " (string bytes)"), len);
    }
    out->assign(reinterpret_cast<const char*>(data_ + pos_), len);
    pos_ += len;
    return absl::OkStatus();
  }

 private:
  const std::string& path_;
  const uint8_t* data_;
  uint64_t size_;
  uint64_t pos_ = 0;
};

// Reads one scalar of type T; bools are read as a byte (any bytes are valid).
template <typename T>
[[nodiscard]] absl::Status ReadScalar(Reader& r, absl::string_view field, T* out) {
  if constexpr (std::is_same_v<T, bool>) {
    uint8_t b = 0;
    GGUF_RETURN_IF_ERROR(r.Read(field, &b));
    *out = b != 0;
    return absl::OkStatus();
  } else if constexpr (std::is_same_v<T, std::string>) {
    return r.ReadString(field, out);
  } else {
    return r.Read(field, out);
  }
}

// Smallest encoded size of one element of T (a string is at least its u64
// length), used to reject array counts that cannot fit in the file.
template <typename T>
constexpr uint64_t MinEncodedSize() {
  if constexpr (std::is_same_v<T, std::string>)
    return sizeof(uint64_t);
  else if constexpr (std::is_same_v<T, bool>)
    return 1;
  else
    return sizeof(T);
}

template <typename T>
[[nodiscard]] absl::Status ReadArray(Reader& r, absl::string_view field, uint64_t count,
                                     MetadataValue* out) {
  if (count > r.remaining() / MinEncodedSize<T>()) {
    return r.Error(absl::StrCat(field, ": array of ", count,
                                " elements cannot fit in the remaining ", r.remaining(),
                                " bytes (truncated file?)"));
  }
  std::vector<T> values(count);
  for (uint64_t i = 0; i < count; ++i) {
    T v{};
    GGUF_RETURN_IF_ERROR(ReadScalar(r, field, &v));
    values[i] = std::move(v);
  }
  *out = std::move(values);
  return absl::OkStatus();
}

template <typename T>
[[nodiscard]] absl::Status ReadOne(Reader& r, absl::string_view field, MetadataValue* out) {
  T v{};
  GGUF_RETURN_IF_ERROR(ReadScalar(r, field, &v));
  *out = std::move(v);
  return absl::OkStatus();
}

// Dispatches on a GGUF value type. kArray is handled by the caller.
template <template <typename> class Fn, typename... Args>
[[nodiscard]] absl::Status DispatchValueType(Reader& r, uint32_t type, absl::string_view field,
                                             Args&&... args) {
  switch (static_cast<ValueType>(type)) {
    case ValueType::kUint8:
      return Fn<uint8_t>::Run(r, field, args...);
    case ValueType::kInt8:
      return Fn<int8_t>::Run(r, field, args...);
    case ValueType::kUint16:
      return Fn<uint16_t>::Run(r, field, args...);
    case ValueType::kInt16:
      return Fn<int16_t>::Run(r, field, args...);
    case ValueType::kUint32:
      return Fn<uint32_t>::Run(r, field, args...);
    case ValueType::kInt32:
      return Fn<int32_t>::Run(r, field, args...);
    case ValueType::kFloat32:
      return Fn<float>::Run(r, field, args...);
    case ValueType::kBool:
      return Fn<bool>::Run(r, field, args...);
    case ValueType::kString:
      return Fn<std::string>::Run(r, field, args...);
    case ValueType::kUint64:
      return Fn<uint64_t>::Run(r, field, args...);
    case ValueType::kInt64:
      return Fn<int64_t>::Run(r, field, args...);
    case ValueType::kFloat64:
      return Fn<double>::Run(r, field, args...);
    case ValueType::kArray:
      break;
  }
  return r.Error(absl::StrCat(field, ": unknown or unsupported value type ", type,
                              static_cast<ValueType>(type) == ValueType::kArray
                                  ? " (nested arrays are not supported)"
                                  : ""));
}

template <typename T>
struct ScalarFn {
  [[nodiscard]] static absl::Status Run(Reader& r, absl::string_view field, MetadataValue* out) {
    return ReadOne<T>(r, field, out);
  }
};
template <typename T>
struct ArrayFn {
  [[nodiscard]] static absl::Status Run(Reader& r, absl::string_view field, uint64_t count,
                                        MetadataValue* out) {
    return ReadArray<T>(r, field, count, out);
  }
};

[[nodiscard]] absl::Status ReadValue(Reader& r, absl::string_view field, MetadataValue* out) {
  uint32_t type = 0;
  GGUF_RETURN_IF_ERROR(r.Read(absl::StrCat(field, " (value type)"), &type));
  if (static_cast<ValueType>(type) != ValueType::kArray) {
    return DispatchValueType<ScalarFn>(r, type, field, out);
  }
  uint32_t elem_type = 0;
  uint64_t count = 0;
  GGUF_RETURN_IF_ERROR(r.Read(absl::StrCat(field, " (array element type)"), &elem_type));
  GGUF_RETURN_IF_ERROR(r.Read(absl::StrCat(field, " (array length)"), &count));
  return DispatchValueType<ArrayFn>(r, elem_type, absl::StrCat(field, " (array)"), count, out);
}

uint64_t AlignUp(uint64_t x, uint64_t a) { return (x + a - 1) / a * a; }

}  // namespace

namespace {

// One row of the supported-type table.
struct TypeTraits {
  TensorType type;
  std::string_view name;
  uint64_t block_size;
  uint64_t block_bytes;
};

constexpr TypeTraits kTypes[] = {
    {TensorType::kF32, "F32", 1, 4},       {TensorType::kF16, "F16", 1, 2},
    {TensorType::kQ4_0, "Q4_0", 32, 18},   {TensorType::kQ4_1, "Q4_1", 32, 20},
    {TensorType::kQ5_0, "Q5_0", 32, 22},   {TensorType::kQ5_1, "Q5_1", 32, 24},
    {TensorType::kQ8_0, "Q8_0", 32, 34},   {TensorType::kQ4_K, "Q4_K", 256, 144},
    {TensorType::kQ5_K, "Q5_K", 256, 176}, {TensorType::kQ6_K, "Q6_K", 256, 210},
    {TensorType::kBF16, "BF16", 1, 2},
};

const TypeTraits* Traits(uint32_t t) {
  for (const TypeTraits& traits : kTypes) {
    if (static_cast<uint32_t>(traits.type) == t) return &traits;
  }
  return nullptr;
}

// "F32, F16, Q4_0, ...": the names of kTypes, for error messages.
std::string SupportedTypeNames() {
  std::string names;
  for (const TypeTraits& traits : kTypes) {
    names.append(names.empty() ? "" : ", ").append(traits.name);
  }
  return names;
}

}  // namespace

bool IsSupportedTensorType(uint32_t t) { return Traits(t) != nullptr; }

std::string GgmlTypeName(uint32_t t) {
  // ggml.h's enum ggml_type; 4, 5 (Q4_2, Q4_3) and 31-33, 36-38 are removed
  // or reserved values.
  static constexpr std::string_view kNames[] = {
      "F32",     "F16",    "Q4_0",    "Q4_1",  "",       "",      "Q5_0",  "Q5_1",
      "Q8_0",    "Q8_1",   "Q2_K",    "Q3_K",  "Q4_K",   "Q5_K",  "Q6_K",  "Q8_K",
      "IQ2_XXS", "IQ2_XS", "IQ3_XXS", "IQ1_S", "IQ4_NL", "IQ3_S", "IQ2_S", "IQ4_XS",
      "I8",      "I16",    "I32",     "I64",   "F64",    "IQ1_M", "BF16",  "",
      "",        "",       "TQ1_0",   "TQ2_0", "",       "",      "",      "MXFP4"};
  if (t < std::size(kNames) && !kNames[t].empty()) return std::string(kNames[t]);
  return absl::StrCat("type ", t);
}

uint64_t TensorBlockSize(TensorType type) {
  const TypeTraits* traits = Traits(static_cast<uint32_t>(type));
  return traits == nullptr ? 0 : traits->block_size;
}

uint64_t TensorBlockBytes(TensorType type) {
  const TypeTraits* traits = Traits(static_cast<uint32_t>(type));
  return traits == nullptr ? 0 : traits->block_bytes;
}

std::optional<uint64_t> TensorBytes(TensorType type, uint64_t n_elements) {
  const uint64_t block = TensorBlockSize(type);
  const uint64_t block_bytes = TensorBlockBytes(type);
  if (block == 0 || n_elements % block != 0) return std::nullopt;
  const uint64_t n_blocks = n_elements / block;
  if (n_blocks > std::numeric_limits<uint64_t>::max() / block_bytes) {
    return std::nullopt;
  }
  return n_blocks * block_bytes;
}

std::string_view TensorTypeName(TensorType type) {
  const TypeTraits* traits = Traits(static_cast<uint32_t>(type));
  return traits == nullptr ? "unknown" : traits->name;
}

uint64_t TensorInfo::NumElements() const {
  uint64_t n = 1;
  for (uint64_t d : dims) n *= d;  // overflow rejected at parse time
  return n;
}

absl::StatusOr<std::unique_ptr<GgufFile>> GgufFile::Open(const std::string& path) {
  std::unique_ptr<GgufFile> f(new GgufFile());
  f->path_ = path;

  const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) {
    const int err = errno;
    std::string msg = absl::StrCat(path, ": cannot open GGUF file: ", std::strerror(err));
    if (err == ENOENT) return absl::NotFoundError(msg);
    return absl::FailedPreconditionError(msg);
  }
  f->fd_ = fd;  // closed by the destructor
  struct stat st;
  if (::fstat(fd, &st) != 0) {
    return absl::FailedPreconditionError(
        absl::StrCat(path, ": fstat failed: ", std::strerror(errno)));
  }
  if (!S_ISREG(st.st_mode)) {
    return absl::InvalidArgumentError(absl::StrCat(path, ": not a regular file"));
  }
  f->size_ = static_cast<uint64_t>(st.st_size);
  if (f->size_ > 0) {
    void* p = ::mmap(nullptr, f->size_, PROT_READ, MAP_PRIVATE, fd, 0);
    if (p == MAP_FAILED) {
      return absl::FailedPreconditionError(
          absl::StrCat(path, ": mmap failed: ", std::strerror(errno)));
    }
    f->base_ = static_cast<const uint8_t*>(p);
  }

  Reader r(f->path_, f->base_, f->size_);

  // Header.
  uint32_t magic = 0;
  GGUF_RETURN_IF_ERROR(r.Read("magic", &magic));
  if (magic != kMagic) {
    return absl::InvalidArgumentError(
        absl::StrFormat("%s: not a GGUF file (bad magic 0x%08x, expected \"GGUF\")", path, magic));
  }
  GGUF_RETURN_IF_ERROR(r.Read("version", &f->version_));
  if (f->version_ != kVersion) {
    return absl::InvalidArgumentError(absl::StrFormat(
        "%s: unsupported GGUF version %d (only version 3 is supported)", path, f->version_));
  }
  uint64_t n_tensors = 0, n_kv = 0;
  GGUF_RETURN_IF_ERROR(r.Read("tensor count", &n_tensors));
  GGUF_RETURN_IF_ERROR(r.Read("metadata count", &n_kv));

  // Metadata. A count too large for the file fails at the first missing
  // field (each pair consumes at least 13 bytes, so the loop is bounded).
  for (uint64_t i = 0; i < n_kv; ++i) {
    std::string key;
    GGUF_RETURN_IF_ERROR(r.ReadString(absl::StrCat("metadata key #", i), &key));
    MetadataValue value;
    GGUF_RETURN_IF_ERROR(ReadValue(r, absl::StrCat("metadata value of '", key, "'"), &value));
    if (!f->metadata_.emplace(key, std::move(value)).second) {
      return r.Error(absl::StrCat("duplicate metadata key '", key, "'"));
    }
    f->metadata_keys_.push_back(std::move(key));
  }

  if (const MetadataValue* a = f->Find("general.alignment")) {
    const uint32_t* align = std::get_if<uint32_t>(a);
    if (align == nullptr) {
      return absl::InvalidArgumentError(
          absl::StrCat(path, ": general.alignment must be a uint32 (GGUF type 4)"));
    }
    if (*align == 0 || (*align & (*align - 1)) != 0) {
      return absl::InvalidArgumentError(
          absl::StrCat(path, ": general.alignment ", *align, " is not a power of two"));
    }
    f->alignment_ = *align;
  } else {
    f->alignment_ = kDefaultAlignment;
  }

  // Tensor infos: at least 24 bytes each (name length, n_dims, type, offset),
  // which bounds the reservation; a short file fails at the missing field.
  const uint64_t max_tensors = std::min<uint64_t>(n_tensors, r.remaining() / 24);
  f->tensors_.reserve(max_tensors);
  std::vector<uint64_t> rel_offsets;
  rel_offsets.reserve(max_tensors);
  for (uint64_t i = 0; i < n_tensors; ++i) {
    TensorInfo t{};
    GGUF_RETURN_IF_ERROR(r.ReadString(absl::StrCat("tensor #", i, " name"), &t.name));
    const std::string field = absl::StrCat("tensor '", t.name, "'");
    uint32_t n_dims = 0;
    GGUF_RETURN_IF_ERROR(r.Read(absl::StrCat(field, " n_dims"), &n_dims));
    if (n_dims > kMaxDims) {
      return r.Error(
          absl::StrCat(field, " has n_dims ", n_dims, " (at most ", kMaxDims, " supported)"));
    }
    t.dims.resize(n_dims);
    uint64_t n_elements = 1;
    for (uint32_t d = 0; d < n_dims; ++d) {
      GGUF_RETURN_IF_ERROR(r.Read(absl::StrCat(field, " ne[", d, "]"), &t.dims[d]));
      // ggml stores ne as int64; products must fit in int64 too.
      const uint64_t kMax = static_cast<uint64_t>(std::numeric_limits<int64_t>::max());
      if (t.dims[d] > kMax || (t.dims[d] != 0 && n_elements > kMax / t.dims[d])) {
        return r.Error(absl::StrCat(field, " element count overflows int64: ne[0..", d, "] = [",
                                    absl::StrJoin(t.dims.begin(), t.dims.begin() + d + 1, ", "),
                                    "]"));
      }
      n_elements *= t.dims[d];
    }
    uint32_t type = 0;
    GGUF_RETURN_IF_ERROR(r.Read(absl::StrCat(field, " type"), &type));
    if (!IsSupportedTensorType(type)) {
      const std::string name = GgmlTypeName(type);
      const std::string what =
          absl::StartsWith(name, "type ")
              ? absl::StrCat(" has ggml tensor type ", type, ", which ggml does not define")
              : absl::StrCat(" has ggml tensor type ", name, " (", type,
                             "), which Tandem does not read");
      return r.Error(absl::StrCat(field, what, " (supported: ", SupportedTypeNames(), ")"));
    }
    t.type = static_cast<TensorType>(type);
    const uint64_t block = TensorBlockSize(t.type);
    if (n_dims > 0 && t.dims[0] % block != 0) {
      return r.Error(absl::StrCat(field, " ne[0] = ", t.dims[0], " is not a multiple of the ",
                                  std::string(TensorTypeName(t.type)), " block size ", block));
    }
    std::optional<uint64_t> bytes = TensorBytes(t.type, n_elements);
    if (!bytes) {
      return r.Error(absl::StrCat(field, " byte size overflows or is not whole blocks"));
    }
    t.n_bytes = *bytes;
    uint64_t rel = 0;
    GGUF_RETURN_IF_ERROR(r.Read(absl::StrCat(field, " data offset"), &rel));
    if (rel % f->alignment_ != 0) {
      return r.Error(absl::StrCat(field, " data offset ", rel, " is not a multiple of alignment ",
                                  f->alignment_));
    }
    if (!f->tensor_index_.emplace(t.name, f->tensors_.size()).second) {
      return r.Error(absl::StrCat("duplicate tensor name '", t.name, "'"));
    }
    rel_offsets.push_back(rel);
    f->tensors_.push_back(std::move(t));
  }

  // Tensor data: starts at the next multiple of the alignment. A file with no
  // tensors (vocab-only) may end right after the infos, without padding.
  const uint64_t data_start = AlignUp(r.pos(), f->alignment_);
  if (n_tensors > 0 && data_start > f->size_) {
    return absl::InvalidArgumentError(
        absl::StrCat(path, ": GGUF file truncated at tensor data section: starts at ", data_start,
                     " but file size is ", f->size_));
  }
  for (size_t i = 0; i < f->tensors_.size(); ++i) {
    TensorInfo& t = f->tensors_[i];
    const uint64_t avail = f->size_ - std::min(data_start, f->size_);
    if (rel_offsets[i] > avail || t.n_bytes > avail - rel_offsets[i]) {
      return absl::InvalidArgumentError(
          absl::StrCat(path, ": tensor '", t.name, "' data [", rel_offsets[i], ", +", t.n_bytes,
                       ") relative to the data section at ", data_start,
                       " is out of range (file size ", f->size_, ")"));
    }
    t.offset = data_start + rel_offsets[i];
    t.data = f->base_ + t.offset;
  }
  // Overlapping tensor data means a corrupt (or hostile) file.
  std::vector<const TensorInfo*> by_offset;
  by_offset.reserve(f->tensors_.size());
  for (const TensorInfo& t : f->tensors_) by_offset.push_back(&t);
  std::sort(by_offset.begin(), by_offset.end(),
            [](const TensorInfo* a, const TensorInfo* b) { return a->offset < b->offset; });
  for (size_t i = 1; i < by_offset.size(); ++i) {
    const TensorInfo* prev = by_offset[i - 1];
    if (prev->offset + prev->n_bytes > by_offset[i]->offset) {
      return absl::InvalidArgumentError(absl::StrCat(path, ": tensor data of '", prev->name,
                                                     "' and '", by_offset[i]->name, "' overlap"));
    }
  }
  return f;
}

GgufFile::~GgufFile() {
  if (base_ != nullptr) ::munmap(const_cast<uint8_t*>(base_), size_);
  if (fd_ >= 0) ::close(fd_);
}

const MetadataValue* GgufFile::Find(std::string_view key) const {
  auto it = metadata_.find(std::string(key));
  return it == metadata_.end() ? nullptr : &it->second;
}

const TensorInfo* GgufFile::FindTensor(std::string_view name) const {
  auto it = tensor_index_.find(name);
  return it == tensor_index_.end() ? nullptr : &tensors_[it->second];
}

namespace {

[[nodiscard]] absl::Status Missing(const std::string& path, std::string_view key) {
  return absl::NotFoundError(absl::StrCat(
      path, ": metadata key '", absl::string_view(key.data(), key.size()), "' not found"));
}

[[nodiscard]] absl::Status Mismatch(const std::string& path, std::string_view key,
                                    absl::string_view want) {
  return absl::InvalidArgumentError(absl::StrCat(
      path, ": metadata key '", absl::string_view(key.data(), key.size()), "' is not ", want));
}

}  // namespace

absl::StatusOr<std::string> GgufFile::GetString(std::string_view key) const {
  const MetadataValue* v = Find(key);
  if (v == nullptr) return Missing(path_, key);
  if (const auto* s = std::get_if<std::string>(v)) return *s;
  return Mismatch(path_, key, "a string");
}

absl::StatusOr<uint64_t> GgufFile::GetUint(std::string_view key) const {
  const MetadataValue* v = Find(key);
  if (v == nullptr) return Missing(path_, key);
  std::optional<uint64_t> out;
  bool negative = false;
  std::visit(
      [&](const auto& x) {
        using T = std::decay_t<decltype(x)>;
        if constexpr (std::is_integral_v<T> && !std::is_same_v<T, bool>) {
          if constexpr (std::is_signed_v<T>) {
            if (x < 0) {
              negative = true;
              return;
            }
          }
          out = static_cast<uint64_t>(x);
        }
      },
      *v);
  if (negative) return Mismatch(path_, key, "a non-negative integer");
  if (!out) return Mismatch(path_, key, "an integer");
  return *out;
}

absl::StatusOr<float> GgufFile::GetFloat(std::string_view key) const {
  const MetadataValue* v = Find(key);
  if (v == nullptr) return Missing(path_, key);
  if (const auto* x = std::get_if<float>(v)) return *x;
  if (const auto* x = std::get_if<double>(v)) return static_cast<float>(*x);
  return Mismatch(path_, key, "a float32/float64");
}

absl::StatusOr<bool> GgufFile::GetBool(std::string_view key) const {
  const MetadataValue* v = Find(key);
  if (v == nullptr) return Missing(path_, key);
  if (const auto* x = std::get_if<bool>(v)) return *x;
  return Mismatch(path_, key, "a bool");
}

}  // namespace tandem::gguf
