// tandem selftest without a GPU: its flags, the one-line exit 77 (through
// a fake DeviceQuery and through the real binary with no visible device),
// a device index the machine does not have, and every check of the
// harness run with the CPU backend standing in for the CUDA one (goldens
// parsed, strict prefixes, teacher forcing, the batched/chunked mix), where
// each must pass.
#include "tools/selftest.h"

#include <sys/wait.h>
#include <unistd.h>

#include <cstdio>
#include <filesystem>
#include <string>
#include <vector>

#include "absl/strings/str_split.h"
#include "engine/backend/backend_factory.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "tests/test_util.h"
#include "tools/synth_model.h"

namespace tandem::cli {
namespace {

using ::testing::HasSubstr;
using ::testing::StartsWith;
using ::tandem::testing::SharedPath;

// `count` devices, each an 80 GB "Fake GPU".
class FakeQuery final : public backend::DeviceQuery {
 public:
  explicit FakeQuery(int32_t count) : count_(count) {}
  int32_t DeviceCount(std::string* why_none) const override {
    if (count_ == 0 && why_none != nullptr) *why_none = "fake: no device";
    return count_;
  }
  absl::StatusOr<backend::GpuInfo> Info(int32_t index) const override {
    backend::GpuInfo info;
    info.index = index;
    info.name = "Fake GPU";
    info.total_bytes = info.free_bytes = 80ull << 30;
    info.compute_capability = 90;
    return info;
  }

 private:
  int32_t count_;
};

TEST(SelftestArgsTest, DefaultsAndFlags) {
  absl::StatusOr<SelftestOptions> o = ParseSelftestArgs({});
  ASSERT_TRUE(o.ok()) << o.status();
  EXPECT_TRUE(o->device.is_cuda());
  EXPECT_EQ(o->device.index, 0);
  EXPECT_TRUE(o->models.empty());
  const std::string a = SharedPath("models/stories260K.gguf");
  const std::string b = SharedPath("models/qwen2-tiny-synth.gguf");
  const std::string shared = SharedPath("");
  o = ParseSelftestArgs({"--device", "cuda:2", "--model", a, "--model", b, "--shared", shared});
  ASSERT_TRUE(o.ok()) << o.status();
  EXPECT_EQ(o->device.index, 2);
  EXPECT_EQ(o->models, (std::vector<std::string>{a, b}));
  EXPECT_EQ(o->shared_dir, shared);
}

// Paths on the command line are checked before the GPU is looked for: a
// typo is an error (exit 2) on a machine without a GPU too, not exit 77.
TEST(SelftestArgsTest, MissingPathsAreRefusedBeforeTheGpuCheck) {
  absl::Status s = ParseSelftestArgs({"--model", "/nonexistent.gguf"}).status();
  EXPECT_EQ(s.message(), "--model: '/nonexistent.gguf' is not a readable file");
  s = ParseSelftestArgs({"--shared", "/nonexistent-dir"}).status();
  EXPECT_EQ(s.message(), "--shared: '/nonexistent-dir' is not a directory");
  ::testing::internal::CaptureStderr();
  EXPECT_EQ(RunSelftest({"--model", "/nonexistent.gguf"}, FakeQuery(0)), 2);
  EXPECT_THAT(::testing::internal::GetCapturedStderr(), HasSubstr("--model"));
}

TEST(SelftestArgsTest, BadFlagsNameTheFlag) {
  struct Case {
    std::vector<std::string> args;
    std::string flag;
  };
  const Case cases[] = {
      {{"--device", "cpu"}, "--device"},
      {{"--device", "gpu0"}, "--device"},
      {{"--device", "cuda:"}, "--device"},
      {{"--device", "cuda:x"}, "--device"},
      {{"--model", ""}, "--model"},
      {{"--shared", ""}, "--shared"},
      {{"--bogus", "1"}, "--bogus"},
      {{"--device"}, "--device"},
  };
  for (const Case& c : cases) {
    absl::Status s = ParseSelftestArgs(c.args).status();
    EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument) << c.flag;
    EXPECT_THAT(s.message(), HasSubstr(c.flag)) << s;
    ::testing::internal::CaptureStderr();
    EXPECT_EQ(RunSelftest(c.args, FakeQuery(1)), 2) << c.flag;
    EXPECT_THAT(::testing::internal::GetCapturedStderr(), HasSubstr(c.flag));
  }
  EXPECT_FALSE(ParseSelftestArgs({"stray"}).ok());
}

TEST(SelftestTest, NoGpuPrintsOneLineAndExits77) {
  ::testing::internal::CaptureStdout();
  EXPECT_EQ(RunSelftest({"--device", "cuda:0"}, FakeQuery(0)), 77);
  const std::string out = ::testing::internal::GetCapturedStdout();
  if (backend::HasCudaBackend()) {
    EXPECT_EQ(out, "selftest: no CUDA GPU (fake: no device); nothing to check\n");
  } else {
    EXPECT_EQ(out,
              "selftest: no CUDA GPU (this build has no CUDA backend (TANDEM_ENABLE_CUDA is "
              "OFF)); nothing to check\n");
  }
}

TEST(SelftestTest, DeviceIndexBeyondTheMachineFails) {
  if (!backend::HasCudaBackend()) GTEST_SKIP() << "this build has no CUDA backend";
  ::testing::internal::CaptureStderr();
  EXPECT_EQ(RunSelftest({"--device", "cuda:3"}, FakeQuery(1)), 1);
  const std::string err = ::testing::internal::GetCapturedStderr();
  EXPECT_THAT(err, HasSubstr("--device"));
  EXPECT_THAT(err, HasSubstr("cuda:3"));
}

// The real binary with no visible device (CUDA_VISIBLE_DEVICES empty, so
// the same on a GPU machine): exactly one line, exit 77.
TEST(SelftestTest, BinaryWithoutGpuExits77WithOneLine) {
  const std::string cmd = std::string("CUDA_VISIBLE_DEVICES= ") + TANDEM_CLI_PATH +
                          " selftest --device cuda:0 2>&1";
  FILE* p = popen(cmd.c_str(), "r");
  ASSERT_NE(p, nullptr);
  std::string out;
  char buf[512];
  while (size_t n = fread(buf, 1, sizeof(buf), p)) out.append(buf, n);
  const int status = pclose(p);
  ASSERT_TRUE(WIFEXITED(status)) << status;
  EXPECT_EQ(WEXITSTATUS(status), 77) << out;
  const std::vector<std::string> lines = absl::StrSplit(out, '\n', absl::SkipEmpty());
  ASSERT_EQ(lines.size(), 1u) << out;
  EXPECT_THAT(lines[0], StartsWith("selftest: no CUDA GPU ("));
  EXPECT_THAT(lines[0], ::testing::EndsWith("); nothing to check"));
  EXPECT_EQ(out.back(), '\n');
}

// The harness with the CPU backend on both sides: 6 golden cases of each
// default model in f32 and bf16 plus 2 mixes = 14 rows a model, all ok.
TEST(SelftestTest, EveryCheckPassesWithTheCpuStandingIn) {
  ::testing::internal::CaptureStdout();
  const int status = RunSelftestOnCpuForTesting({}, SharedPath(""));
  const std::string out = ::testing::internal::GetCapturedStdout();
  EXPECT_EQ(status, 0) << out;
  EXPECT_THAT(out, HasSubstr("selftest: 42 of 42 checks passed")) << out;
  EXPECT_THAT(out, ::testing::Not(HasSubstr("FAIL"))) << out;
  // stories260K's F32-KV goldens: 32 strict ids in its first case.
  EXPECT_THAT(out, ::testing::ContainsRegex("stories260K +once_upon_a_time +f32 +32/32 yes"))
      << out;
  EXPECT_THAT(out, ::testing::ContainsRegex("qwen2-tiny-synth +mix\\(4 seqs, chunk 7\\) +bf16 "
                                            "+16/16 rows bit-identical"))
      << out;
}

// A model without goldens: the CPU's own greedy references (3 prompts).
TEST(SelftestTest, ModelWithoutGoldensUsesCpuReferences) {
  const std::string path = (std::filesystem::temp_directory_path() /
                            ("selftest_synth." + std::to_string(::getpid()) + ".gguf"))
                               .string();
  ASSERT_TRUE(WriteSynthModel(OfflineModelOptions(path)).ok());
  ::testing::internal::CaptureStdout();
  const int status = RunSelftestOnCpuForTesting({path}, SharedPath(""));
  const std::string out = ::testing::internal::GetCapturedStdout();
  std::filesystem::remove(path);
  EXPECT_EQ(status, 0) << out;
  EXPECT_THAT(out, HasSubstr("selftest: 8 of 8 checks passed")) << out;
  EXPECT_THAT(out, HasSubstr("prompt40")) << out;
}

TEST(SelftestTest, MissingModelFails) {
  ::testing::internal::CaptureStdout();
  ::testing::internal::CaptureStderr();
  const int status = RunSelftestOnCpuForTesting({"/nonexistent/m.gguf"}, SharedPath(""));
  ::testing::internal::GetCapturedStdout();
  const std::string err = ::testing::internal::GetCapturedStderr();
  EXPECT_EQ(status, 1);
  EXPECT_THAT(err, HasSubstr("/nonexistent/m.gguf"));
}

}  // namespace
}  // namespace tandem::cli
