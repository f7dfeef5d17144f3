// GGUF v3 writer: the inverse of GgufFile (layout in gguf_file.h, from
// ggml/docs/gguf.md).
//
// Owns: an ordered list of metadata key/values and tensor descriptions.
// Writes them in the order they were added (metadata keys, then tensor
// infos), the data section starting at the first multiple of the alignment
// after the infos, each tensor's data at the next aligned offset after the
// previous one and followed by zero padding up to the alignment (as ggml's
// gguf_write_to_buf). Re-adding every key and tensor of a GGUF file in file
// order (GgufFile::metadata_keys(), GgufFile::tensors()) therefore
// reproduces a file written by ggml byte for byte.
// Does not touch: model semantics, quantization (callers pass bytes).
// Threads: not thread-safe while being built; Serialize/WriteFile are const.
#ifndef TANDEM_ENGINE_GGUF_GGUF_WRITER_H_
#define TANDEM_ENGINE_GGUF_GGUF_WRITER_H_

#include <cstdint>
#include <functional>
#include <set>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "engine/gguf/gguf_file.h"

namespace tandem::gguf {

class GgufWriter {
 public:
  // Fills exactly the tensor's byte size (TensorBytes of its type and
  // element count) at `out`; called once per Serialize/WriteFile, in
  // tensor order, so large models need only one tensor in memory.
  using FillFn = std::function<void(uint8_t* out)>;

  // `alignment`: of the data section and of every tensor's offset; must be
  // a power of two (a bad value is reported by the first Add* call).
  explicit GgufWriter(uint32_t alignment = 32) : alignment_(alignment) {}

  uint32_t alignment() const { return alignment_; }

  // Appends one metadata pair. Errors: INVALID_ARGUMENT naming the key for a
  // duplicate key, or a "general.alignment" that is not a uint32 equal to
  // the writer's alignment (readers would place the data elsewhere).
  [[nodiscard]] absl::Status AddMetadata(std::string key, MetadataValue value);

  // Appends one tensor; `dims` ne0 first, at most 4. Errors:
  // INVALID_ARGUMENT naming the tensor for a duplicate name, more than 4
  // dims, ne0 not a multiple of the type's block size, an element count
  // overflowing int64, or (AddTensor) `bytes` of the wrong size.
  // AddTensor copies `bytes`; AddTensorView keeps `data` (n bytes of the
  // tensor's size), which must outlive the writer's last use;
  // AddTensorFill calls `fill` at write time.
  [[nodiscard]] absl::Status AddTensor(std::string name, TensorType type,
                                       std::vector<uint64_t> dims, std::string bytes);
  [[nodiscard]] absl::Status AddTensorView(std::string name, TensorType type,
                                           std::vector<uint64_t> dims, const uint8_t* data);
  [[nodiscard]] absl::Status AddTensorFill(std::string name, TensorType type,
                                           std::vector<uint64_t> dims, FillFn fill);

  // The whole file in memory.
  std::string Serialize() const;
  // Streams the file to `path` (created or truncated). Errors:
  // FAILED_PRECONDITION naming the path when it cannot be opened, UNAVAILABLE
  // when a write fails (e.g. disk full).
  [[nodiscard]] absl::Status WriteFile(const std::string& path) const;

  // Size in bytes of the file Serialize/WriteFile produce.
  uint64_t FileSize() const;

  // The file's first bytes: header, metadata, tensor infos and the padding
  // up to the data section (FileSize() minus the data section). Calls no
  // fill function, so a large model's layout can be checked without
  // computing its tensors.
  std::string Header() const;

 private:
  struct Tensor {
    std::string name;
    TensorType type;
    std::vector<uint64_t> dims;
    uint64_t n_bytes = 0;
    uint64_t offset = 0;  // relative to the data section
    FillFn fill;
  };

  [[nodiscard]] absl::Status CheckAlignment() const;
  // Validates and appends; computes n_bytes and offset.
  [[nodiscard]] absl::Status Add(std::string name, TensorType type, std::vector<uint64_t> dims,
                                 FillFn fill, const uint64_t* expected_bytes);
  uint32_t alignment_;
  std::vector<std::pair<std::string, MetadataValue>> metadata_;
  std::set<std::string, std::less<>> keys_;
  std::vector<Tensor> tensors_;
  std::set<std::string, std::less<>> names_;
  uint64_t data_size_ = 0;  // data section, padding included
};

}  // namespace tandem::gguf

#endif  // TANDEM_ENGINE_GGUF_GGUF_WRITER_H_
