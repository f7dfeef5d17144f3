// PlanGpuMemory, GpuMemoryPlan::Describe and SplitGpuMemoryFraction
// (engine/backend/gpu_memory_plan.h) with exact numbers.
#include "engine/backend/gpu_memory_plan.h"

#include <gtest/gtest.h>

#include <cmath>
#include <limits>

#include "absl/strings/match.h"

namespace tandem::backend {
namespace {

constexpr uint64_t kMiB = uint64_t{1} << 20;
constexpr uint64_t kGiB = uint64_t{1} << 30;

// 16 GiB device, all free, half of it for the worker: budget 8 GiB; fixed
// parts 5 GiB; 2 MiB blocks.
GpuMemoryInputs HalfOf16GiB() {
  GpuMemoryInputs in;
  in.device_total_bytes = 16 * kGiB;
  in.device_free_bytes = 16 * kGiB;
  in.gpu_memory_fraction = 0.5;
  in.weight_bytes = 4 * kGiB;
  in.activation_peak_bytes = 512 * kMiB;
  in.workspace_bytes = 32 * kMiB;
  in.transfer_buffer_bytes = 256 * kMiB;
  in.other_bytes = 224 * kMiB;
  in.block_bytes = 2 * kMiB;
  return in;
}

TEST(PlanGpuMemoryTest, KvPoolGetsTheRestOfTheBudget) {
  const GpuMemoryInputs in = HalfOf16GiB();
  absl::StatusOr<GpuMemoryPlan> plan = PlanGpuMemory(in);
  ASSERT_TRUE(plan.ok()) << plan.status();
  EXPECT_EQ(plan->budget_bytes, 8 * kGiB);
  EXPECT_EQ(plan->num_blocks, 1536);  // (8 - 5) GiB / 2 MiB
  EXPECT_EQ(plan->kv_bytes, 3 * kGiB);
  EXPECT_EQ(plan->Describe(in),
            "GPU memory: budget 8.00 GiB (0.50 of 16.00 GiB): weights 4.00 GiB, activations "
            "512.00 MiB, workspace 32.00 MiB, transfer 256.00 MiB, other 224.00 MiB; KV 3.00 "
            "GiB = 1536 blocks of 2.00 MiB");
}

TEST(PlanGpuMemoryTest, BudgetIsFlooredAndPartialBlocksDropped) {
  GpuMemoryInputs in;
  in.device_total_bytes = 1001;
  in.device_free_bytes = 1001;
  in.gpu_memory_fraction = 0.5;  // 500.5 -> 500
  in.block_bytes = 100;
  absl::StatusOr<GpuMemoryPlan> plan = PlanGpuMemory(in);
  ASSERT_TRUE(plan.ok()) << plan.status();
  EXPECT_EQ(plan->budget_bytes, 500u);
  EXPECT_EQ(plan->num_blocks, 5);
  EXPECT_EQ(plan->kv_bytes, 500u);
  in.other_bytes = 1;  // 499 left: 4 whole blocks
  plan = PlanGpuMemory(in);
  ASSERT_TRUE(plan.ok()) << plan.status();
  EXPECT_EQ(plan->num_blocks, 4);
  EXPECT_EQ(plan->kv_bytes, 400u);
  EXPECT_EQ(plan->Describe(in),
            "GPU memory: budget 500 bytes (0.50 of 1001 bytes): weights 0 bytes, activations 0 "
            "bytes, workspace 0 bytes, transfer 0 bytes, other 1 bytes; KV 400 bytes = 4 "
            "blocks of 100 bytes");
}

TEST(PlanGpuMemoryTest, FullDeviceAtFractionOne) {
  GpuMemoryInputs in = HalfOf16GiB();
  in.gpu_memory_fraction = 1.0;
  absl::StatusOr<GpuMemoryPlan> plan = PlanGpuMemory(in);
  ASSERT_TRUE(plan.ok()) << plan.status();
  EXPECT_EQ(plan->budget_bytes, 16 * kGiB);
  EXPECT_EQ(plan->num_blocks, 5632);  // 11 GiB / 2 MiB
}

TEST(PlanGpuMemoryTest, NumKvBlocksCapsThePool) {
  GpuMemoryInputs in = HalfOf16GiB();
  in.max_blocks = 1000;
  absl::StatusOr<GpuMemoryPlan> plan = PlanGpuMemory(in);
  ASSERT_TRUE(plan.ok()) << plan.status();
  EXPECT_EQ(plan->num_blocks, 1000);
  EXPECT_EQ(plan->kv_bytes, 1000 * 2 * kMiB);
  EXPECT_EQ(plan->Describe(in),
            "GPU memory: budget 8.00 GiB (0.50 of 16.00 GiB): weights 4.00 GiB, activations "
            "512.00 MiB, workspace 32.00 MiB, transfer 256.00 MiB, other 224.00 MiB; KV 1.95 "
            "GiB = 1000 blocks of 2.00 MiB (capped by engine.num_kv_blocks 1000)");
  in.max_blocks = 5000;  // above what fits: no effect
  plan = PlanGpuMemory(in);
  ASSERT_TRUE(plan.ok()) << plan.status();
  EXPECT_EQ(plan->num_blocks, 1536);
}

TEST(PlanGpuMemoryTest, ModelThatDoesNotFitNamesTheKeyAndTheNumbers) {
  GpuMemoryInputs in;
  in.device_total_bytes = 16 * kGiB;
  in.device_free_bytes = 16 * kGiB;
  in.gpu_memory_fraction = 0.9;  // 14.40 GiB
  in.weight_bytes = 15 * kGiB;
  in.activation_peak_bytes = 256 * kMiB;
  in.block_bytes = kMiB;
  absl::StatusOr<GpuMemoryPlan> plan = PlanGpuMemory(in);
  ASSERT_FALSE(plan.ok());
  EXPECT_EQ(plan.status().code(), absl::StatusCode::kResourceExhausted);
  EXPECT_EQ(plan.status().message(),
            "the model does not fit: weights 15.00 GiB + activations 256.00 MiB + workspace 0 "
            "bytes + transfer 0 bytes + other 0 bytes = 15.25 GiB > "
            "engine.gpu_memory_fraction 0.90 of 16.00 GiB (14.40 GiB)");
}

TEST(PlanGpuMemoryTest, FixedPartsDoNotWrapAround) {
  GpuMemoryInputs in = HalfOf16GiB();
  in.weight_bytes = std::numeric_limits<uint64_t>::max();
  absl::StatusOr<GpuMemoryPlan> plan = PlanGpuMemory(in);
  ASSERT_FALSE(plan.ok());
  EXPECT_EQ(plan.status().code(), absl::StatusCode::kResourceExhausted);
}

TEST(PlanGpuMemoryTest, FractionLeavingNoBlockNamesTheKey) {
  GpuMemoryInputs in;
  in.device_total_bytes = 16 * kGiB;
  in.device_free_bytes = 16 * kGiB;
  in.gpu_memory_fraction = 0.05;  // 858993459 bytes
  in.weight_bytes = 818 * kMiB;   // leaves 1258291 bytes
  in.block_bytes = 4 * kMiB;
  absl::StatusOr<GpuMemoryPlan> plan = PlanGpuMemory(in);
  ASSERT_FALSE(plan.ok());
  EXPECT_EQ(plan.status().code(), absl::StatusCode::kResourceExhausted);
  EXPECT_EQ(plan.status().message(),
            "engine.gpu_memory_fraction 0.05 leaves 1.20 MiB for the KV cache, less than one "
            "block of 4.00 MiB");
  in.block_bytes = 1258291;  // exactly one block fits
  plan = PlanGpuMemory(in);
  ASSERT_TRUE(plan.ok()) << plan.status();
  EXPECT_EQ(plan->num_blocks, 1);
}

TEST(PlanGpuMemoryTest, BudgetBeyondFreeMemoryIsRefused) {
  GpuMemoryInputs in = HalfOf16GiB();
  in.gpu_memory_fraction = 0.9;
  in.device_free_bytes = 10 * kGiB;  // others hold 6 GiB
  absl::StatusOr<GpuMemoryPlan> plan = PlanGpuMemory(in);
  ASSERT_FALSE(plan.ok());
  EXPECT_EQ(plan.status().code(), absl::StatusCode::kResourceExhausted);
  EXPECT_EQ(plan.status().message(),
            "engine.gpu_memory_fraction 0.90 of 16.00 GiB is 14.40 GiB, but only 10.00 GiB of "
            "the device was free at start (other processes hold the rest); lower "
            "engine.gpu_memory_fraction");
  in.gpu_memory_fraction = 0.5;  // 8 GiB fits in the 10 free
  EXPECT_TRUE(PlanGpuMemory(in).ok());
}

TEST(PlanGpuMemoryTest, RefusesFractionOutsideZeroOneAndZeroBlock) {
  for (double f : {0.0, -0.1, 1.5, std::nan("")}) {
    GpuMemoryInputs in = HalfOf16GiB();
    in.gpu_memory_fraction = f;
    absl::StatusOr<GpuMemoryPlan> plan = PlanGpuMemory(in);
    ASSERT_FALSE(plan.ok()) << f;
    EXPECT_EQ(plan.status().code(), absl::StatusCode::kInvalidArgument);
    EXPECT_TRUE(absl::StartsWith(plan.status().message(),
                                 "engine.gpu_memory_fraction: must be in (0, 1], got "))
        << plan.status();
  }
  GpuMemoryInputs in = HalfOf16GiB();
  in.gpu_memory_fraction = 1.5;
  EXPECT_EQ(PlanGpuMemory(in).status().message(),
            "engine.gpu_memory_fraction: must be in (0, 1], got 1.5");
  in = HalfOf16GiB();
  in.block_bytes = 0;
  EXPECT_EQ(PlanGpuMemory(in).status().code(), absl::StatusCode::kInvalidArgument);
}

TEST(SplitGpuMemoryFractionTest, EachWorkerGetsAnEqualShare) {
  EXPECT_DOUBLE_EQ(SplitGpuMemoryFraction(0.9, 1), 0.9);
  EXPECT_DOUBLE_EQ(SplitGpuMemoryFraction(0.9, 2), 0.45);
  EXPECT_DOUBLE_EQ(SplitGpuMemoryFraction(0.9, 3), 0.3);
  EXPECT_DOUBLE_EQ(SplitGpuMemoryFraction(1.0, 4), 0.25);
}

}  // namespace
}  // namespace tandem::backend
