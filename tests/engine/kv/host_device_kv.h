// HostDeviceKv: a kv::DeviceKvAccess over host memory for tests, the one
// host stand-in for a GPU KV cache that the NCCL, CUDA IPC and engine core
// tests share (issue #16).
//
// The K and V pools are host byte arrays with PagedKv's layout
// (device_kv.h): element (layer, block, slot, j) at ((layer * layer_blocks
// + block) * block_size + slot) * kv_dim + j, in `dtype`; both start zeroed.
// A frame is K rows then V rows, [2][count][kv_dim] elements, as on the
// device. Addressing is by token on both sides of CopyFromPeer, so the two
// block sizes may differ (as CudaKvStorage's kernels).
//
// Streams: GatherRows / ScatterRows / CopyFromPeer check their arguments at
// the call, then hand the copy to Run(stream, copy), which runs it at once
// (the stream is ignored). A subclass that models stream order (the NCCL
// tests' HostStream) overrides Run; the copy then reads its table from a
// copy the closure owns. layer_event() is null (no events); a subclass with
// events overrides it.
//
// Owns: the two pools. Threads: the counters are atomic; the pools are not
// locked (the tests touch disjoint rows or one thread at a time).
#ifndef TANDEM_TESTS_ENGINE_KV_HOST_DEVICE_KV_H_
#define TANDEM_TESTS_ENGINE_KV_HOST_DEVICE_KV_H_

#include <atomic>
#include <cstdint>
#include <functional>
#include <span>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "engine/kv/device_kv.h"
#include "engine/kv/kv_dtype.h"

namespace tandem::kv::testing {

class HostDeviceKv : public DeviceKvAccess {
 public:
  // Pools of n_layers * layer_blocks blocks of block_size token slots, each
  // slot kv_dim elements of `dtype` (all four counts > 0), every byte 0.
  HostDeviceKv(int32_t n_layers, int32_t layer_blocks, int32_t block_size, int32_t kv_dim,
               KvDtype dtype);

  // Bytes of one token's K (or V) of one layer: kv_dim * element bytes.
  uint64_t row_bytes() const { return row_bytes_; }

  // Fills both pools with bytes drawn from std::mt19937(seed), K first.
  void FillRandom(uint32_t seed);
  // The frame (K rows then V rows, 2 * count * row_bytes() bytes) of tokens
  // [start, start + count) of `layer`, read now. The range must pass
  // CheckRange (a test bug otherwise: aborts).
  std::string Rows(std::span<const int32_t> table, int32_t layer, int32_t start,
                   int32_t count) const;
  // KvStorage::ReadTokens / WriteTokens over the pools, now: count *
  // row_bytes() bytes of each of K and V, token after token. Same
  // precondition as Rows.
  void ReadTokens(std::span<const int32_t> table, int32_t layer, int32_t start, int32_t count,
                  char* k_out, char* v_out) const;
  void WriteTokens(std::span<const int32_t> table, int32_t layer, int32_t start, int32_t count,
                   const char* k, const char* v);

  // OK when `layer` is in [0, n_layers), start >= 0, count >= 0, `table`
  // covers tokens [start, start + count) at this block size and names only
  // blocks in [0, layer_blocks); else INVALID_ARGUMENT naming `what` and
  // the field.
  absl::Status CheckRange(std::span<const int32_t> table, int32_t layer, int32_t start,
                          int32_t count, const char* what) const;

  // Calls of GatherRows / ScatterRows / CopyFromPeer that passed their
  // checks (the copy was handed to Run).
  int gathers() const { return gathers_.load(); }
  int scatters() const { return scatters_.load(); }
  int copies() const { return copies_.load(); }

  // kv::DeviceKvAccess. Errors: INVALID_ARGUMENT from CheckRange; for
  // CopyFromPeer also a peer whose n_layers, kv_dim or dtype differ from
  // this one's, whose pools are not set or are smaller than its shape, or
  // a null stream (the data path copies on its own stream). count 0 is OK
  // and copies nothing.
  int device_ordinal() const override { return 0; }
  DevicePoolInfo pool_info() const override;
  absl::Status GatherRows(std::span<const int32_t> block_table, int32_t layer,
                          int32_t token_start, int32_t count, void* dst, void* stream) override;
  absl::Status ScatterRows(std::span<const int32_t> block_table, int32_t layer,
                           int32_t token_start, int32_t count, const void* src,
                           void* stream) override;
  absl::Status CopyFromPeer(const DevicePoolInfo& peer, std::span<const int32_t> peer_table,
                            std::span<const int32_t> block_table, int32_t layer,
                            int32_t token_start, int32_t count, void* stream) override;
  void* layer_event(int32_t layer) const override { return nullptr; }

 protected:
  // Runs `copy` in `stream`'s order. Here: at once, whatever the stream.
  virtual void Run(void* stream, std::function<void()> copy) { copy(); }

 private:
  // GatherRows (gather) and ScatterRows: checks, counts, then Run.
  absl::Status MoveRows(bool gather, std::span<const int32_t> block_table, int32_t layer,
                        int32_t token_start, int32_t count, void* frame, void* stream);
  // CheckRange, aborting with its message on an error (a test bug).
  void CheckOrAbort(std::span<const int32_t> table, int32_t layer, int32_t start, int32_t count,
                    const char* what) const;

  DevicePoolInfo shape_;  // the shape; k, v null (pool_info() fills them)
  const uint64_t row_bytes_;
  std::vector<char> k_, v_;
  std::atomic<int> gathers_{0}, scatters_{0}, copies_{0};
};

}  // namespace tandem::kv::testing

#endif  // TANDEM_TESTS_ENGINE_KV_HOST_DEVICE_KV_H_
