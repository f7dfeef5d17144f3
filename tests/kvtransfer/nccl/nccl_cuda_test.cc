// The real NCCL data path on one GPU, two processes (issue #16 item 6):
// the test forks before any CUDA call; the parent is P, the child D, each
// with its own NCCL_HOSTID (NCCL refuses two ranks on one GPU of one host)
// and NCCL's socket transport over loopback. The KV connection is played
// by two pipes (setup, descriptors, D's received rows). Skips without an
// NVIDIA device node; needs nothing but CUDA and NCCL.
#include <fcntl.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cuda_runtime.h>

#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <optional>
#include <random>
#include <string>
#include <vector>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/clock.h"
#include "gtest/gtest.h"
#include "kvtransfer/nccl/nccl_data_plane.h"

namespace tandem::kvtransfer::nccl {
namespace {

constexpr int kLayers = 2, kBlocks = 8, kBlockSize = 4, kKvDim = 16, kTokens = 12;
constexpr uint64_t kRowBytes = kKvDim * 4;  // f32

// Device KV for the test: pools from cudaMalloc, rows moved with one
// cudaMemcpyAsync each (the real storage uses one kernel).
class CudaTestKv final : public kv::DeviceKvAccess {
 public:
  CudaTestKv() {
    bytes_ = uint64_t{kLayers} * kBlocks * kBlockSize * kRowBytes;
    cudaMalloc(&k_, bytes_);
    cudaMalloc(&v_, bytes_);
    cudaMemset(k_, 0, bytes_);
    cudaMemset(v_, 0, bytes_);
  }
  ~CudaTestKv() override {
    cudaFree(k_);
    cudaFree(v_);
  }
  void Fill(uint32_t seed) {
    std::vector<char> host(bytes_);
    std::mt19937 rng(seed);
    for (char& c : host) c = static_cast<char>(rng());
    cudaMemcpy(k_, host.data(), bytes_, cudaMemcpyHostToDevice);
    for (char& c : host) c = static_cast<char>(rng());
    cudaMemcpy(v_, host.data(), bytes_, cudaMemcpyHostToDevice);
  }
  // Every (layer, token < kTokens) row of `table`, K then V, on the host.
  std::string Rows(const std::vector<int32_t>& table) {
    std::string out(kLayers * 2 * kTokens * kRowBytes, '\0');
    char* frame = nullptr;
    cudaMalloc(&frame, out.size());
    for (int layer = 0; layer < kLayers; ++layer) {
      absl::Status gathered =
          GatherRows(table, layer, 0, kTokens, frame + layer * 2 * kTokens * kRowBytes, nullptr);
      if (!gathered.ok()) out = "ERR gather";
    }
    cudaDeviceSynchronize();
    cudaMemcpy(out.data(), frame, out.size(), cudaMemcpyDeviceToHost);
    cudaFree(frame);
    return out;
  }

  int device_ordinal() const override { return 0; }
  kv::DevicePoolInfo pool_info() const override {
    return kv::DevicePoolInfo{k_, v_, bytes_, kLayers, kBlocks, kBlockSize, kKvDim,
                              kv::KvDtype::kF32};
  }
  absl::Status GatherRows(std::span<const int32_t> table, int32_t layer, int32_t start,
                          int32_t count, void* dst, void* stream) override {
    return Copy(table, layer, start, count, static_cast<char*>(dst), stream, true);
  }
  absl::Status ScatterRows(std::span<const int32_t> table, int32_t layer, int32_t start,
                           int32_t count, const void* src, void* stream) override {
    return Copy(table, layer, start, count, static_cast<char*>(const_cast<void*>(src)), stream,
                false);
  }
  absl::Status CopyFromPeer(const kv::DevicePoolInfo&, std::span<const int32_t>,
                            std::span<const int32_t>, int32_t, int32_t, int32_t,
                            void*) override {
    return absl::UnimplementedError("not used");
  }
  void* layer_event(int32_t) const override { return nullptr; }

 private:
  absl::Status Copy(std::span<const int32_t> table, int32_t layer, int32_t start, int32_t count,
                    char* frame, void* stream, bool gather) {
    for (int32_t i = 0; i < count; ++i) {
      const int32_t t = start + i;
      const uint64_t row =
          (uint64_t{static_cast<uint32_t>(layer)} * kBlocks + table[t / kBlockSize]) * kBlockSize +
          t % kBlockSize;
      char* pool_k = k_ + row * kRowBytes;
      char* pool_v = v_ + row * kRowBytes;
      char* fk = frame + i * kRowBytes;
      char* fv = frame + (count + i) * kRowBytes;
      auto s = static_cast<cudaStream_t>(stream);
      cudaError_t e1 = cudaMemcpyAsync(gather ? fk : pool_k, gather ? pool_k : fk, kRowBytes,
                                       cudaMemcpyDeviceToDevice, s);
      cudaError_t e2 = cudaMemcpyAsync(gather ? fv : pool_v, gather ? pool_v : fv, kRowBytes,
                                       cudaMemcpyDeviceToDevice, s);
      if (e1 != cudaSuccess || e2 != cudaSuccess) return absl::InternalError("cudaMemcpyAsync");
    }
    return absl::OkStatus();
  }

  uint64_t bytes_ = 0;
  char* k_ = nullptr;
  char* v_ = nullptr;
};

// Length-prefixed messages over a pipe.
bool WriteMessage(int fd, const std::string& message) {
  uint64_t n = message.size();
  std::string out(reinterpret_cast<const char*>(&n), sizeof(n));
  out += message;
  size_t done = 0;
  while (done < out.size()) {
    ssize_t w = write(fd, out.data() + done, out.size() - done);
    if (w <= 0) return false;
    done += static_cast<size_t>(w);
  }
  return true;
}

std::optional<std::string> ReadMessage(int fd) {
  auto read_all = [fd](char* p, size_t n) {
    size_t done = 0;
    while (done < n) {
      ssize_t r = read(fd, p + done, n - done);
      if (r <= 0) return false;
      done += static_cast<size_t>(r);
    }
    return true;
  };
  uint64_t n = 0;
  if (!read_all(reinterpret_cast<char*>(&n), sizeof(n)) || n > (64u << 20)) return std::nullopt;
  std::string message(n, '\0');
  if (!read_all(message.data(), n)) return std::nullopt;
  return message;
}

const std::vector<int32_t> kPTable{6, 1, 3};
const std::vector<int32_t> kDTable{2, 7, 0};

// D, in the child: returns the exit code.
int RunDecode(int from_p, int to_p) {
  setenv("NCCL_HOSTID", "tandem-nccl-test-d", 1);
  CudaTestKv kv;
  NcclDataPlaneOptions options;
  options.transfer_timeout_ms = 60000;
  options.init_timeout_ms = 60000;
  auto plane = NcclDataPlane::Create(options);
  if (!plane.ok()) {
    WriteMessage(to_p, absl::StrCat("ERR D Create: ", plane.status().ToString()));
    return 1;
  }
  auto setup = ReadMessage(from_p);
  if (!setup) return 2;
  const TransferKey key{"cuda-req", 1};
  absl::Status opened =
      (*plane)->receiver()->OpenTransfer(key, *setup, DeviceKvTarget{&kv, kDTable});
  WriteMessage(to_p, opened.ok() ? "OK" : absl::StrCat("ERR D open: ", opened.ToString()));
  if (!opened.ok()) return 3;
  absl::Mutex mu;
  int dones = 0;
  absl::Status first_error;
  for (int i = 0; i < kLayers; ++i) {
    auto line = ReadMessage(from_p);
    if (!line) return 4;
    std::vector<std::string> f = absl::StrSplit(*line, ' ');
    FrameDescriptor frame{key.request_id, key.attempt, 0, 0, 0, 0, ""};
    if (f.size() != 4 || !absl::SimpleAtoi(f[0], &frame.layer) ||
        !absl::SimpleAtoi(f[1], &frame.token_start) ||
        !absl::SimpleAtoi(f[2], &frame.token_count) || !absl::SimpleAtoi(f[3], &frame.comm_seq)) {
      return 5;
    }
    (*plane)->receiver()->Receive(key, frame, [&](absl::Status status) {
      absl::MutexLock lock(&mu);
      ++dones;
      if (!status.ok() && first_error.ok()) first_error = status;
    });
  }
  {
    absl::MutexLock lock(&mu);
    auto all = [&] { return dones == kLayers; };
    mu.AwaitWithTimeout(absl::Condition(&all), absl::Seconds(120));
  }
  if (!first_error.ok() || dones != kLayers) {
    WriteMessage(to_p, absl::StrCat("ERR D receive: ", first_error.ToString(), " dones ", dones));
    return 6;
  }
  (*plane)->receiver()->CloseTransfer(key, [] {});
  WriteMessage(to_p, kv.Rows(kDTable));
  return 0;
}

TEST(NcclCudaTest, NcclTwoProcessesOnOneGpuMoveIdenticalBytes) {
  if (access("/dev/nvidiactl", F_OK) != 0) GTEST_SKIP() << "no CUDA GPU: no /dev/nvidiactl";
  // tandem up's one-GPU test mode, for this process pair only.
  setenv("NCCL_NET", "Socket", 1);
  setenv("NCCL_IB_DISABLE", "1", 1);
  setenv("NCCL_SOCKET_IFNAME", "lo", 1);
  int p_to_d[2], d_to_p[2];
  ASSERT_EQ(pipe(p_to_d), 0);
  ASSERT_EQ(pipe(d_to_p), 0);
  pid_t child = fork();
  ASSERT_GE(child, 0);
  if (child == 0) {
    close(p_to_d[1]);
    close(d_to_p[0]);
    _exit(RunDecode(p_to_d[0], d_to_p[1]));
  }
  close(p_to_d[0]);
  close(d_to_p[1]);
  setenv("NCCL_HOSTID", "tandem-nccl-test-p", 1);
  int count = 0;
  if (cudaGetDeviceCount(&count) != cudaSuccess || count == 0) {
    kill(child, SIGKILL);
    waitpid(child, nullptr, 0);
    GTEST_SKIP() << "no CUDA GPU";
  }
  CudaTestKv kv;
  kv.Fill(5);
  NcclDataPlaneOptions options;
  options.transfer_timeout_ms = 60000;
  options.init_timeout_ms = 60000;
  auto plane = NcclDataPlane::Create(options);
  ASSERT_TRUE(plane.ok()) << plane.status();
  const TransferKey key{"cuda-req", 1};
  auto setup = (*plane)->sender()->OpenTransfer(key, TransportPeer{"d:1", "host", "d-inst"});
  ASSERT_TRUE(setup.ok()) << setup.status();
  ASSERT_TRUE(WriteMessage(p_to_d[1], *setup));
  auto opened = ReadMessage(d_to_p[0]);
  ASSERT_TRUE(opened.has_value());
  ASSERT_EQ(*opened, "OK");
  for (int layer = 0; layer < kLayers; ++layer) {
    auto frame = (*plane)->sender()->SendRows(key, kv, kPTable, layer, 0, kTokens);
    ASSERT_TRUE(frame.ok()) << frame.status();
    ASSERT_TRUE(WriteMessage(p_to_d[1], absl::StrCat(frame->layer, " ", frame->token_start, " ",
                                                      frame->token_count, " ", frame->comm_seq)));
  }
  auto rows = ReadMessage(d_to_p[0]);
  ASSERT_TRUE(rows.has_value());
  EXPECT_EQ(rows->substr(0, 4) == "ERR " ? *rows : "", "");
  EXPECT_TRUE(*rows == kv.Rows(kPTable)) << "D's rows differ from P's";
  std::optional<absl::Status> result;
  const absl::Time deadline = absl::Now() + absl::Seconds(60);
  while (!(result = (*plane)->sender()->Poll(key, absl::OkStatus())) && absl::Now() < deadline) {
    absl::SleepFor(absl::Milliseconds(1));
  }
  ASSERT_TRUE(result.has_value());
  EXPECT_TRUE(result->ok()) << *result;
  EXPECT_EQ((*plane)->sender()->bytes_total(), kLayers * 2 * kTokens * kRowBytes);
  (*plane)->sender()->CloseTransfer(key);
  int status = 0;
  waitpid(child, &status, 0);
  EXPECT_TRUE(WIFEXITED(status) && WEXITSTATUS(status) == 0) << "D exit status " << status;
}

}  // namespace
}  // namespace tandem::kvtransfer::nccl
