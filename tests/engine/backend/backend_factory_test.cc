// CreateBackend (engine/backend/backend_factory.h): the CPU backend and its
// refusals, the device checks before the CUDA backend (fake DeviceQuery),
// and the real system query on this machine.
#include "engine/backend/backend_factory.h"

#include <gtest/gtest.h>

#include "absl/strings/match.h"
#include "engine/gguf/gguf_file.h"
#include "tests/engine/backend/fake_device_query.h"
#include "tests/test_util.h"

namespace tandem::backend {
namespace {

class BackendFactoryTest : public ::testing::Test {
 protected:
  void SetUp() override {
    auto file = gguf::GgufFile::Open(tandem::testing::SharedPath("models/stories260K.gguf"));
    ASSERT_TRUE(file.ok()) << file.status();
    file_ = *std::move(file);
    auto model = model::LlamaModel::Load(*file_);
    ASSERT_TRUE(model.ok()) << model.status();
    model_ = *std::move(model);
  }

  static BackendOptions Cuda(int32_t index) {
    BackendOptions o;
    o.device = DeviceSpec{DeviceSpec::Kind::kCuda, index};
    o.kv_cache_dtype = kv::KvDtype::kBF16;
    return o;
  }

  std::unique_ptr<gguf::GgufFile> file_;
  std::unique_ptr<model::LlamaModel> model_;
};

TEST_F(BackendFactoryTest, CpuBackendHoldsTheConfiguredPool) {
  BackendOptions options;
  options.block_size = 8;
  options.num_kv_blocks = 5;
  FakeDeviceQuery none({});
  absl::StatusOr<std::unique_ptr<ModelBackend>> backend = CreateBackend(*model_, options, none);
  ASSERT_TRUE(backend.ok()) << backend.status();
  EXPECT_EQ((*backend)->kv_storage().num_blocks(), 5);
  EXPECT_EQ((*backend)->kv_storage().dtype(), kv::KvDtype::kF32);
  EXPECT_EQ((*backend)->kv_storage().shape().block_size, 8);
  EXPECT_TRUE(absl::StartsWith((*backend)->bit_exact_class(), "tandem-cpu/"));
}

// engine.kv_cache_dtype f16 / bf16 on the CPU: the pool holds that dtype,
// half the bytes per row of F32.
TEST_F(BackendFactoryTest, CpuHoldsEveryKvDtype) {
  for (kv::KvDtype dtype : {kv::KvDtype::kF32, kv::KvDtype::kF16, kv::KvDtype::kBF16}) {
    BackendOptions options;
    options.kv_cache_dtype = dtype;
    options.num_kv_blocks = 3;
    absl::StatusOr<std::unique_ptr<ModelBackend>> backend =
        CreateBackend(*model_, options, FakeDeviceQuery({}));
    ASSERT_TRUE(backend.ok()) << backend.status();
    const kv::KvStorage& storage = (*backend)->kv_storage();
    EXPECT_EQ(storage.dtype(), dtype);
    EXPECT_EQ(storage.row_bytes(),
              static_cast<size_t>(storage.shape().kv_dim()) * kv::KvDtypeBytes(dtype));
  }
}

TEST_F(BackendFactoryTest, CpuRefusesAKvDtypeOutsideTheEnum) {
  BackendOptions options;
  options.kv_cache_dtype = static_cast<kv::KvDtype>(7);
  absl::StatusOr<std::unique_ptr<ModelBackend>> backend =
      CreateBackend(*model_, options, FakeDeviceQuery({}));
  ASSERT_FALSE(backend.ok());
  EXPECT_EQ(backend.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(backend.status().message(), "engine.kv_cache_dtype: 7 is not f32, f16 or bf16");
}

TEST_F(BackendFactoryTest, CpuRefusesBatchInvariantFalse) {
  BackendOptions options;
  options.batch_invariant = false;
  options.device_key = "prefill_workers[0].device";
  absl::StatusOr<std::unique_ptr<ModelBackend>> backend =
      CreateBackend(*model_, options, FakeDeviceQuery({}));
  ASSERT_FALSE(backend.ok());
  EXPECT_EQ(backend.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(backend.status().message(),
            "engine.batch_invariant: false on prefill_workers[0].device cpu, but the CPU "
            "backend is always batch-invariant (remove the key or set it true)");
}

// engine.q8_matmul: int8 is a CPU path; a CUDA worker refuses it before
// looking at the device, and a CPU backend takes only the model's own mode.
TEST_F(BackendFactoryTest, Q8MatMulInt8IsRefusedOnCudaAndMustMatchTheModel) {
  BackendOptions cuda = Cuda(0);
  cuda.q8_matmul = model::Q8MatMul::kInt8;
  absl::StatusOr<std::unique_ptr<ModelBackend>> refused =
      CreateBackend(*model_, cuda, FakeDeviceQuery({FakeH200(0)}));
  ASSERT_FALSE(refused.ok());
  EXPECT_EQ(refused.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(refused.status().message(),
            "engine.q8_matmul: int8 on engine.device cuda:0, but the CUDA backend multiplies "
            "Q8_0 weights only as exact (set engine.q8_matmul: exact, or run this worker on "
            "cpu)");
  BackendOptions cpu;
  cpu.q8_matmul = model::Q8MatMul::kInt8;  // model_ was loaded with exact
  absl::StatusOr<std::unique_ptr<ModelBackend>> mismatch =
      CreateBackend(*model_, cpu, FakeDeviceQuery({}));
  ASSERT_FALSE(mismatch.ok());
  EXPECT_EQ(mismatch.status().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_EQ(mismatch.status().message(),
            "engine.q8_matmul: int8 on engine.device cpu, but the model was loaded with exact "
            "(LlamaModelOptions::q8_matmul)");
  model::LlamaModelOptions int8_options;
  int8_options.q8_matmul = model::Q8MatMul::kInt8;
  absl::StatusOr<std::unique_ptr<model::LlamaModel>> int8 =
      model::LlamaModel::Load(*file_, int8_options);
  ASSERT_TRUE(int8.ok()) << int8.status();
  EXPECT_TRUE(CreateBackend(**int8, cpu, FakeDeviceQuery({})).ok());
}

// A model loaded for another device (no F32 panel packing) cannot run on
// the CPU backend, whose bit-exact class names the panel GEMM's numerics.
TEST_F(BackendFactoryTest, CpuRefusesAModelLoadedWithoutF32Panels) {
  model::LlamaModelOptions options;
  options.f32_panels = false;
  absl::StatusOr<std::unique_ptr<model::LlamaModel>> unpacked =
      model::LlamaModel::Load(*file_, options);
  ASSERT_TRUE(unpacked.ok()) << unpacked.status();
  EXPECT_FALSE((*unpacked)->f32_panels());
  BackendOptions cpu;
  cpu.device_key = "decode_workers[0].device";
  absl::StatusOr<std::unique_ptr<ModelBackend>> refused =
      CreateBackend(**unpacked, cpu, FakeDeviceQuery({}));
  ASSERT_FALSE(refused.ok());
  EXPECT_EQ(refused.status().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_EQ(refused.status().message(),
            "decode_workers[0].device cpu: the model was loaded without its F32 panel "
            "packing (LlamaModelOptions::f32_panels false, a load for another device)");
  EXPECT_TRUE(model_->f32_panels());
  EXPECT_TRUE(CreateBackend(*model_, cpu, FakeDeviceQuery({})).ok());
}

TEST_F(BackendFactoryTest, CudaWithoutSuchDeviceNamesTheKey) {
  FakeDeviceQuery none({}, "no CUDA-capable device is detected");
  absl::StatusOr<std::unique_ptr<ModelBackend>> backend = CreateBackend(*model_, Cuda(0), none);
  ASSERT_FALSE(backend.ok());
  EXPECT_EQ(backend.status().code(), absl::StatusCode::kFailedPrecondition);
  BackendOptions three = Cuda(3);
  three.device_key = "decode_workers[1].device";
  absl::StatusOr<std::unique_ptr<ModelBackend>> beyond =
      CreateBackend(*model_, three, FakeDeviceQuery({FakeH200(0)}));
  ASSERT_FALSE(beyond.ok());
  EXPECT_EQ(beyond.status().code(), absl::StatusCode::kFailedPrecondition);
  if (HasCudaBackend()) {
    EXPECT_EQ(backend.status().message(),
              "engine.device: cuda:0, but this machine has no CUDA GPU (no CUDA-capable device "
              "is detected)");
    EXPECT_EQ(beyond.status().message(),
              "decode_workers[1].device: cuda:3, but this machine has 1 CUDA GPU (cuda:0)");
  } else {
    EXPECT_EQ(backend.status().message(),
              "engine.device: cuda:0, but this build has no CUDA backend (TANDEM_ENABLE_CUDA "
              "is OFF)");
  }
}

// A device that passes the check is described in the start-up log before
// the CUDA backend is built (which, without a real GPU, then fails).
TEST_F(BackendFactoryTest, CudaDeviceIsDescribedBeforeTheBackendIsBuilt) {
  if (!HasCudaBackend()) GTEST_SKIP() << "this build has no CUDA backend";
  if (SystemDeviceQuery().DeviceCount(nullptr) > 0) {
    GTEST_SKIP() << "a CUDA GPU is present: the fake device would reach the real backend";
  }
  std::vector<std::string> lines;
  BackendOptions options = Cuda(0);
  options.log = [&lines](const std::string& line) { lines.push_back(line); };
  absl::StatusOr<std::unique_ptr<ModelBackend>> backend =
      CreateBackend(*model_, options, FakeDeviceQuery({FakeH200(0)}));
  EXPECT_FALSE(backend.ok());
  ASSERT_FALSE(lines.empty());
  EXPECT_EQ(lines[0], "device cuda:0: NVIDIA H200, 141.00 GiB (141.00 GiB free), sm_90");
}

TEST_F(BackendFactoryTest, HasCudaBackendFollowsTheBuild) {
#ifdef TANDEM_HAVE_CUDA
  EXPECT_TRUE(HasCudaBackend());
#else
  EXPECT_FALSE(HasCudaBackend());
  std::string why;
  EXPECT_EQ(SystemDeviceQuery().DeviceCount(&why), 0);
  EXPECT_EQ(why, "this build has no CUDA backend (TANDEM_ENABLE_CUDA is OFF)");
#endif
}

// The real query on this machine: without a GPU, cuda:0 is refused at
// start in one line naming engine.device.
TEST_F(BackendFactoryTest, SystemQueryWithoutGpuRefusesCuda0) {
  std::string why;
  const int32_t count = SystemDeviceQuery().DeviceCount(&why);
  if (count > 0) GTEST_SKIP() << "a CUDA GPU is present (" << count << " devices)";
  EXPECT_FALSE(why.empty());
  absl::StatusOr<std::unique_ptr<ModelBackend>> backend = CreateBackend(*model_, Cuda(0));
  ASSERT_FALSE(backend.ok());
  EXPECT_EQ(backend.status().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_TRUE(absl::StartsWith(backend.status().message(), "engine.device: cuda:0, but this "))
      << backend.status();
  EXPECT_TRUE(absl::StrContains(backend.status().message(), why)) << backend.status();
  EXPECT_FALSE(absl::StrContains(backend.status().message(), "\n"));
}

// On a GPU machine: the real query answers for every device it counts.
TEST_F(BackendFactoryTest, SystemQueryDescribesEachGpu) {
  const int32_t count = SystemDeviceQuery().DeviceCount(nullptr);
  if (count == 0) GTEST_SKIP() << "no CUDA GPU: nothing to describe";
  for (int32_t i = 0; i < count; ++i) {
    absl::StatusOr<GpuInfo> info = SystemDeviceQuery().Info(i);
    ASSERT_TRUE(info.ok()) << info.status();
    EXPECT_EQ(info->index, i);
    EXPECT_FALSE(info->name.empty());
    EXPECT_GT(info->total_bytes, 0u);
    EXPECT_LE(info->free_bytes, info->total_bytes);
    EXPECT_GE(info->compute_capability, 50);
  }
}

}  // namespace
}  // namespace tandem::backend
