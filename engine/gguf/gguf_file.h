// GGUF v3 reader over mmap.
//
// Owns: the mapped file and the parsed header (metadata KV pairs, tensor
// infos). Does not touch: model semantics (see engine/model), tokenization.
// Threads: immutable after Open(); safe to share across threads.
//
// File layout (GGUF spec, ggml/docs/gguf.md, little-endian):
//   u32 magic "GGUF" | u32 version (3) | u64 n_tensors | u64 n_kv
//   n_kv x { gguf_string key | u32 value_type | value }
//   n_tensors x { gguf_string name | u32 n_dims | u64 ne[n_dims] |
//                 u32 ggml_type | u64 offset (relative to data section) }
//   padding to `general.alignment` (default 32) | tensor data
//   gguf_string = u64 length | bytes (not NUL-terminated)
// A 2-D tensor has ne = [ne0, ne1] = [in, out]: row r (an output) is ne0
// contiguous elements. Every offset and length read from the file is bounds-
// checked; failures return INVALID_ARGUMENT naming the file and the field.
#ifndef TANDEM_ENGINE_GGUF_GGUF_FILE_H_
#define TANDEM_ENGINE_GGUF_GGUF_FILE_H_

#include <cstddef>
#include <cstdint>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <variant>
#include <vector>

#include "absl/status/statusor.h"

namespace tandem::gguf {

// ggml tensor types Tandem reads (values from ggml.h's enum ggml_type).
// Block layouts (ggml-common.h; parsed and documented in
// engine/model/quant_blocks.h): a block of `TensorBlockSize` weights takes
// `TensorBlockBytes` bytes, and a row is whole blocks.
enum class TensorType : uint32_t {
  kF32 = 0,
  kF16 = 1,
  kQ4_0 = 2,   // blocks of 32: {f16 d; u8 qs[16]} = 18 bytes
  kQ4_1 = 3,   // blocks of 32: {f16 d, m; u8 qs[16]} = 20 bytes
  kQ5_0 = 6,   // blocks of 32: {f16 d; u8 qh[4]; u8 qs[16]} = 22 bytes
  kQ5_1 = 7,   // blocks of 32: {f16 d, m; u8 qh[4]; u8 qs[16]} = 24 bytes
  kQ8_0 = 8,   // blocks of 32: {f16 d; int8 q[32]} = 34 bytes
  kQ4_K = 12,  // super-blocks of 256: {f16 d, dmin; u8 scales[12]; u8 qs[128]} = 144
  kQ5_K = 13,  // super-blocks of 256: {f16 d, dmin; u8 scales[12]; qh[32]; qs[128]} = 176
  kQ6_K = 14,  // super-blocks of 256: {u8 ql[128], qh[64]; i8 scales[16]; f16 d} = 210
  kBF16 = 30,
};

// Whether `t` is one of the TensorType values above.
bool IsSupportedTensorType(uint32_t t);

// ggml's name of any ggml_type value ("Q2_K", "IQ4_XS", "TQ1_0", ...), or
// "type <t>" for a value ggml does not define. For error messages.
std::string GgmlTypeName(uint32_t t);

// Weights per block (1 for F32/F16/BF16, 32 for the legacy types and Q8_0,
// 256 for the K-quants) and bytes per block, of a supported type.
uint64_t TensorBlockSize(TensorType type);
uint64_t TensorBlockBytes(TensorType type);

// Bytes for `n_elements` of `type`; n_elements must be a multiple of the
// type's block size. Returns nullopt when it is not (or on overflow).
std::optional<uint64_t> TensorBytes(TensorType type, uint64_t n_elements);
std::string_view TensorTypeName(TensorType type);

// One metadata value. Arrays hold their elements as a vector of the element
// type (nested arrays are rejected as unsupported).
using MetadataValue =
    std::variant<uint8_t, int8_t, uint16_t, int16_t, uint32_t, int32_t, float, bool, std::string,
                 uint64_t, int64_t, double, std::vector<std::string>, std::vector<float>,
                 std::vector<int32_t>, std::vector<uint32_t>, std::vector<int64_t>,
                 std::vector<uint64_t>, std::vector<uint8_t>, std::vector<int8_t>,
                 std::vector<bool>, std::vector<double>, std::vector<int16_t>,
                 std::vector<uint16_t>>;

struct TensorInfo {
  std::string name;
  TensorType type;
  std::vector<uint64_t> dims;  // ne0 first (innermost)
  uint64_t offset;             // absolute file offset of the data
  uint64_t n_bytes;
  const uint8_t* data;  // points into the mapping
  uint64_t NumElements() const;
};

class GgufFile {
 public:
  // Maps and parses `path`. Errors: NOT_FOUND (missing file),
  // FAILED_PRECONDITION (cannot open/stat/mmap, e.g. permissions),
  // INVALID_ARGUMENT (bad magic, version != 3, truncation naming the field,
  // unknown tensor type naming tensor and type number, n_dims > 4, element
  // count overflow, out-of-range offset, overlapping/misaligned data,
  // duplicate key/tensor, nested array, bad general.alignment), each message
  // naming the file.
  [[nodiscard]] static absl::StatusOr<std::unique_ptr<GgufFile>> Open(const std::string& path);
  ~GgufFile();
  GgufFile(const GgufFile&) = delete;
  GgufFile& operator=(const GgufFile&) = delete;

  const std::string& path() const { return path_; }
  uint32_t version() const { return version_; }
  uint64_t file_size() const { return size_; }
  uint32_t alignment() const { return alignment_; }

  const std::map<std::string, MetadataValue>& metadata() const { return metadata_; }
  // Metadata keys in file order (metadata() is sorted by key), e.g. for
  // rewriting a file with GgufWriter.
  const std::vector<std::string>& metadata_keys() const { return metadata_keys_; }
  const MetadataValue* Find(std::string_view key) const;

  // Typed getters: NOT_FOUND if absent, INVALID_ARGUMENT on a type mismatch.
  // GetUint accepts any unsigned/signed integer type holding a value >= 0.
  [[nodiscard]] absl::StatusOr<std::string> GetString(std::string_view key) const;
  [[nodiscard]] absl::StatusOr<uint64_t> GetUint(std::string_view key) const;
  [[nodiscard]] absl::StatusOr<float> GetFloat(std::string_view key) const;  // f32 or f64
  [[nodiscard]] absl::StatusOr<bool> GetBool(std::string_view key) const;

  const std::vector<TensorInfo>& tensors() const { return tensors_; }
  const TensorInfo* FindTensor(std::string_view name) const;

 private:
  GgufFile() = default;
  std::string path_;
  int fd_ = -1;
  const uint8_t* base_ = nullptr;
  uint64_t size_ = 0;
  uint32_t version_ = 0;
  uint32_t alignment_ = 32;
  std::map<std::string, MetadataValue> metadata_;
  std::vector<std::string> metadata_keys_;  // file order
  std::vector<TensorInfo> tensors_;
  std::map<std::string, size_t, std::less<>> tensor_index_;
};

}  // namespace tandem::gguf

#endif  // TANDEM_ENGINE_GGUF_GGUF_FILE_H_
