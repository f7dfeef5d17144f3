// GGUF v3 writer (layout in gguf_file.h, from ggml/docs/gguf.md).
#include "engine/gguf/gguf_writer.h"

#include <bit>
#include <cerrno>
#include <cstdio>
#include <cstring>
#include <limits>
#include <memory>
#include <optional>
#include <type_traits>
#include <variant>

#include "absl/strings/str_cat.h"

namespace tandem::gguf {

static_assert(std::endian::native == std::endian::little,
              "GGUF is little-endian; this writer memcpy's fields directly");

namespace {

constexpr uint32_t kMagic = 0x46554747;  // "GGUF" as a little-endian u32
constexpr uint32_t kVersion = 3;
constexpr uint32_t kArrayType = 9;
constexpr size_t kMaxDims = 4;

// GGUF value type (gguf.md, enum gguf_type) of a scalar C++ type.
template <typename T>
constexpr uint32_t ValueTypeOf() {
  if constexpr (std::is_same_v<T, uint8_t>)
    return 0;
  else if constexpr (std::is_same_v<T, int8_t>)
    return 1;
  else if constexpr (std::is_same_v<T, uint16_t>)
    return 2;
  else if constexpr (std::is_same_v<T, int16_t>)
    return 3;
  else if constexpr (std::is_same_v<T, uint32_t>)
    return 4;
  else if constexpr (std::is_same_v<T, int32_t>)
    return 5;
  else if constexpr (std::is_same_v<T, float>)
    return 6;
  else if constexpr (std::is_same_v<T, bool>)
    return 7;
  else if constexpr (std::is_same_v<T, std::string>)
    return 8;
  else if constexpr (std::is_same_v<T, uint64_t>)
    return 10;
  else if constexpr (std::is_same_v<T, int64_t>)
    return 11;
  else if constexpr (std::is_same_v<T, double>)
    return 12;
  else
    static_assert(sizeof(T) == 0, "not a GGUF scalar type");
}

template <typename T>
struct IsVector : std::false_type {};
template <typename T>
struct IsVector<std::vector<T>> : std::true_type {};

template <typename T>
void Put(std::string& out, T v) {
  static_assert(std::is_trivially_copyable_v<T>);
  char buf[sizeof(T)];
  std::memcpy(buf, &v, sizeof(T));
  out.append(buf, sizeof(T));
}

void PutString(std::string& out, const std::string& s) {
  Put<uint64_t>(out, s.size());
  out.append(s);
}

template <typename T>
void PutScalar(std::string& out, const T& v) {
  if constexpr (std::is_same_v<T, std::string>) {
    PutString(out, v);
  } else if constexpr (std::is_same_v<T, bool>) {
    Put<uint8_t>(out, v ? 1 : 0);
  } else {
    Put<T>(out, v);
  }
}

// u32 value type | value (arrays: u32 element type | u64 count | elements).
void PutValue(std::string& out, const MetadataValue& value) {
  std::visit(
      [&](const auto& v) {
        using V = std::decay_t<decltype(v)>;
        if constexpr (IsVector<V>::value) {
          using E = typename V::value_type;
          Put<uint32_t>(out, kArrayType);
          Put<uint32_t>(out, ValueTypeOf<E>());
          Put<uint64_t>(out, v.size());
          for (const auto& e : v) PutScalar<E>(out, E(e));
        } else {
          Put<uint32_t>(out, ValueTypeOf<V>());
          PutScalar<V>(out, v);
        }
      },
      value);
}

uint64_t AlignUp(uint64_t x, uint64_t a) { return (x + a - 1) / a * a; }

}  // namespace

absl::Status GgufWriter::CheckAlignment() const {
  if (alignment_ == 0 || (alignment_ & (alignment_ - 1)) != 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("GGUF writer: alignment ", alignment_, " is not a power of two"));
  }
  return absl::OkStatus();
}

absl::Status GgufWriter::AddMetadata(std::string key, MetadataValue value) {
  if (absl::Status s = CheckAlignment(); !s.ok()) return s;
  if (key == "general.alignment") {
    const uint32_t* a = std::get_if<uint32_t>(&value);
    if (a == nullptr || *a != alignment_) {
      return absl::InvalidArgumentError(absl::StrCat(
          "GGUF writer: metadata key 'general.alignment' must be a uint32 equal to the "
          "writer's alignment ",
          alignment_));
    }
  }
  if (!keys_.insert(key).second) {
    return absl::InvalidArgumentError(
        absl::StrCat("GGUF writer: duplicate metadata key '", key, "'"));
  }
  metadata_.emplace_back(std::move(key), std::move(value));
  return absl::OkStatus();
}

absl::Status GgufWriter::Add(std::string name, TensorType type, std::vector<uint64_t> dims,
                             FillFn fill, const uint64_t* expected_bytes) {
  if (absl::Status s = CheckAlignment(); !s.ok()) return s;
  const std::string field = absl::StrCat("GGUF writer: tensor '", name, "'");
  if (dims.size() > kMaxDims) {
    return absl::InvalidArgumentError(
        absl::StrCat(field, " has ", dims.size(), " dims (at most ", kMaxDims, ")"));
  }
  const uint64_t kMax = static_cast<uint64_t>(std::numeric_limits<int64_t>::max());
  uint64_t n = 1;
  for (uint64_t d : dims) {
    if (d > kMax || (d != 0 && n > kMax / d)) {
      return absl::InvalidArgumentError(absl::StrCat(field, " element count overflows"));
    }
    n *= d;
  }
  const uint64_t block = type == TensorType::kQ8_0 ? 32 : 1;
  std::optional<uint64_t> bytes = TensorBytes(type, n);
  if (!bytes || (!dims.empty() && dims[0] % block != 0)) {
    return absl::InvalidArgumentError(
        absl::StrCat(field, " of type ", std::string(TensorTypeName(type)),
                     ": ne[0] is not a multiple of the block size ", block));
  }
  if (expected_bytes != nullptr && *expected_bytes != *bytes) {
    return absl::InvalidArgumentError(
        absl::StrCat(field, " has ", *expected_bytes, " bytes of data, its shape needs ", *bytes));
  }
  if (names_.count(name) > 0) {
    return absl::InvalidArgumentError(absl::StrCat("GGUF writer: duplicate tensor '", name, "'"));
  }
  names_.insert(name);
  Tensor t{std::move(name), type, std::move(dims), *bytes, data_size_, std::move(fill)};
  data_size_ += AlignUp(*bytes, alignment_);
  tensors_.push_back(std::move(t));
  return absl::OkStatus();
}

absl::Status GgufWriter::AddTensor(std::string name, TensorType type, std::vector<uint64_t> dims,
                                   std::string bytes) {
  const uint64_t size = bytes.size();
  auto owned = std::make_shared<const std::string>(std::move(bytes));
  return Add(
      std::move(name), type, std::move(dims),
      [owned](uint8_t* out) { std::memcpy(out, owned->data(), owned->size()); }, &size);
}

absl::Status GgufWriter::AddTensorView(std::string name, TensorType type,
                                       std::vector<uint64_t> dims, const uint8_t* data) {
  const std::optional<uint64_t> n = [&]() -> std::optional<uint64_t> {
    uint64_t e = 1;
    for (uint64_t d : dims) e *= d;  // overflow is rejected by Add
    return TensorBytes(type, e);
  }();
  const uint64_t size = n.value_or(0);
  return Add(
      std::move(name), type, std::move(dims),
      [data, size](uint8_t* out) { std::memcpy(out, data, size); }, nullptr);
}

absl::Status GgufWriter::AddTensorFill(std::string name, TensorType type,
                                       std::vector<uint64_t> dims, FillFn fill) {
  return Add(std::move(name), type, std::move(dims), std::move(fill), nullptr);
}

std::string GgufWriter::Header() const {
  std::string out;
  Put<uint32_t>(out, kMagic);
  Put<uint32_t>(out, kVersion);
  Put<uint64_t>(out, tensors_.size());
  Put<uint64_t>(out, metadata_.size());
  for (const auto& [key, value] : metadata_) {
    PutString(out, key);
    PutValue(out, value);
  }
  for (const Tensor& t : tensors_) {
    PutString(out, t.name);
    Put<uint32_t>(out, static_cast<uint32_t>(t.dims.size()));
    for (uint64_t d : t.dims) Put<uint64_t>(out, d);
    Put<uint32_t>(out, static_cast<uint32_t>(t.type));
    Put<uint64_t>(out, t.offset);
  }
  // A file with no tensors ends after the infos (as ggml writes vocab-only
  // files); otherwise pad up to the data section.
  if (!tensors_.empty()) out.resize(AlignUp(out.size(), alignment_), '\0');
  return out;
}

uint64_t GgufWriter::FileSize() const { return Header().size() + data_size_; }

std::string GgufWriter::Serialize() const {
  std::string out = Header();
  const uint64_t data_start = out.size();
  out.resize(data_start + data_size_, '\0');
  for (const Tensor& t : tensors_) {
    t.fill(reinterpret_cast<uint8_t*>(out.data()) + data_start + t.offset);
  }
  return out;
}

absl::Status GgufWriter::WriteFile(const std::string& path) const {
  std::unique_ptr<std::FILE, int (*)(std::FILE*)> f(std::fopen(path.c_str(), "wb"), &std::fclose);
  if (f == nullptr) {
    return absl::FailedPreconditionError(
        absl::StrCat(path, ": cannot create GGUF file: ", std::strerror(errno)));
  }
  auto write = [&](const uint8_t* p, size_t n) -> absl::Status {
    if (n > 0 && std::fwrite(p, 1, n, f.get()) != n) {
      return absl::UnavailableError(absl::StrCat(path, ": write failed: ", std::strerror(errno)));
    }
    return absl::OkStatus();
  };
  const std::string header = Header();
  absl::Status s = write(reinterpret_cast<const uint8_t*>(header.data()), header.size());
  std::vector<uint8_t> buf;
  for (size_t i = 0; s.ok() && i < tensors_.size(); ++i) {
    const Tensor& t = tensors_[i];
    buf.assign(AlignUp(t.n_bytes, alignment_), 0);
    t.fill(buf.data());
    s = write(buf.data(), buf.size());
  }
  std::FILE* raw = f.release();
  if (std::fclose(raw) != 0 && s.ok()) {
    s = absl::UnavailableError(absl::StrCat(path, ": close failed: ", std::strerror(errno)));
  }
  return s;
}

}  // namespace tandem::gguf
