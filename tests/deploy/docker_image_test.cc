// deploy/docker's Dockerfiles checked without a Docker engine (none here):
// every COPY source exists in the build context (the repository root) and
// survives .dockerignore; the image's command uses only flags the real
// binary accepts; the runtime stage installs the package of every library
// `ldd build/<binary>` lists (Debian's through `dpkg -S`, NVIDIA's through
// kCudaPackages); the image runs as uid 10001, holds no model and exposes
// the ports deploy/k8s uses. The parser itself: tests/deploy/dockerfile.h.
#include <algorithm>
#include <filesystem>
#include <map>
#include <set>
#include <string>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"
#include "absl/strings/strip.h"
#include "absl/strings/ascii.h"
#include "absl/time/time.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "tests/deploy/dockerfile.h"
#include "tests/process_util.h"
#include "tests/test_util.h"

namespace tandem::testing {
namespace {

namespace fs = std::filesystem;
using ::testing::ElementsAre;
using ::testing::IsEmpty;

constexpr char kSourceDir[] = TANDEM_SOURCE_DIR;
constexpr char kBinaryDir[] = TANDEM_BINARY_DIR;
constexpr char kCpuImage[] = "deploy/docker/Dockerfile.cpu";
constexpr char kCudaImage[] = "deploy/docker/Dockerfile.cuda";
const char* const kImages[] = {kCpuImage, kCudaImage};
// The binaries an image holds (in /usr/local/bin), as built in build/.
const char* const kBinaries[] = {"tandem", "tandem-router", "tandem-worker",
                                 "tandem-prefill-worker", "tandem-decode-worker"};
// Where the image expects the cluster file (a Kubernetes ConfigMap mount).
constexpr char kConfigPath[] = "/etc/tandem/cluster.yaml";
// Router gRPC, router HTTP, prefill gRPC, decode gRPC, decode KV receiver,
// worker metrics: the ports deploy/k8s's manifests use.
const std::set<int> kPorts = {50051, 8000, 50052, 50053, 50054, 9101, 9102};
// ldd, dpkg -S and a binary that stops at its config file take well under
// a second; a hung one is killed.
constexpr absl::Duration kProcessTimeout = absl::Seconds(30);

// Packages every Debian image (debian:bookworm-slim included) holds, which
// a runtime stage need not name: libc6, zlib1g (pre-dependencies of the
// Essential dpkg), libpcre2-8-0 (of the Essential grep), libgcc-s1 and
// libstdc++6 (dependencies of apt).
const std::set<std::string> kInEveryDebianImage = {"libc6", "zlib1g", "libpcre2-8-0",
                                                   "libgcc-s1", "libstdc++6"};

// NVIDIA's libraries, by soname, and the package of NVIDIA's debian12 CUDA
// repository that ships each. By soname, not path: the build machine may
// hold them outside dpkg (/usr/local/cuda from a runfile). libcuda.so.1 is
// not here: the NVIDIA Container Toolkit mounts the host driver's.
const std::map<std::string, std::string> kCudaPackages = {
    {"libcudart.so.13", "cuda-cudart-13-0"},
    {"libcublas.so.13", "libcublas-13-0"},
    {"libcublasLt.so.13", "libcublas-13-0"},
    {"libnccl.so.2", "libnccl2"},
};

Dockerfile LoadImage(const std::string& relative) {
  absl::StatusOr<Dockerfile> file =
      ParseDockerfile(ReadFileOrDie(absl::StrCat(kSourceDir, "/", relative)));
  EXPECT_TRUE(file.ok()) << relative << ": " << file.status();
  return file.ok() ? *file : Dockerfile{};
}

std::vector<const DockerInstruction*> Instructions(const DockerStage& stage,
                                                   absl::string_view keyword) {
  std::vector<const DockerInstruction*> found;
  for (const DockerInstruction& i : stage.instructions) {
    if (i.keyword == keyword) found.push_back(&i);
  }
  return found;
}

// The command the image runs: ENTRYPOINT's words followed by CMD's (both
// exec form; the last of each counts, as in Docker).
std::vector<std::string> ImageCommand(const DockerStage& stage) {
  std::vector<std::string> command;
  for (const char* keyword : {"ENTRYPOINT", "CMD"}) {
    std::vector<const DockerInstruction*> found = Instructions(stage, keyword);
    if (found.empty()) continue;
    absl::StatusOr<std::vector<std::string>> words = ParseExecForm(found.back()->args);
    EXPECT_TRUE(words.ok()) << keyword << " (line " << found.back()->line
                            << "): " << words.status();
    if (words.ok()) command.insert(command.end(), words->begin(), words->end());
  }
  return command;
}

// Every package the stage's RUNs give `apt-get install`, including list
// files COPYed into the stage and fed to `xargs apt-get install`.
std::set<std::string> InstalledPackages(const DockerStage& stage) {
  std::set<std::string> packages;
  for (const DockerInstruction* run : Instructions(stage, "RUN")) {
    for (const std::string& p : AptInstallPackages(run->args)) packages.insert(p);
    if (!absl::StrContains(run->args, "xargs apt-get install")) continue;
    for (const DockerInstruction* copy : Instructions(stage, "COPY")) {
      absl::StatusOr<DockerCopy> parsed = ParseCopy(copy->args);
      if (!parsed.ok() || !parsed->from.empty() || parsed->sources.size() != 1 ||
          !absl::StrContains(run->args, parsed->destination)) {
        continue;
      }
      const std::string list = ReadFileOrDie(absl::StrCat(kSourceDir, "/", parsed->sources[0]));
      for (const std::string& p : PackageListWords(list)) packages.insert(p);
    }
  }
  return packages;
}

// `ldd`'s resolved paths of `binary`'s libraries (the loader included;
// linux-vdso has no file). A library ldd cannot find fails the test.
std::vector<std::string> LinkedLibraries(const std::string& binary) {
  const ProcessResult ldd = RunProcess({"/usr/bin/ldd", binary}, kProcessTimeout);
  EXPECT_EQ(ldd.exit_code, 0) << ldd.Describe();
  std::vector<std::string> paths;
  for (absl::string_view line : absl::StrSplit(ldd.out, '\n', absl::SkipWhitespace())) {
    EXPECT_FALSE(absl::StrContains(line, "not found")) << binary << ": " << line;
    const size_t arrow = line.find("=> ");
    absl::string_view path = arrow == absl::string_view::npos ? line : line.substr(arrow + 3);
    path = absl::StripLeadingAsciiWhitespace(path);
    path = path.substr(0, path.find(" ("));
    if (absl::StartsWith(path, "/")) paths.emplace_back(path);
  }
  return paths;
}

// The Debian package owning each of `paths`, by `dpkg -S`; a path no
// package owns is missing from the result. dpkg records a file under the
// name the package shipped, so the path as ldd printed it, its real path
// and their /lib <-> /usr/lib twins (Debian 12 merges /usr) are all asked.
std::map<std::string, std::string> OwningPackages(const std::vector<std::string>& paths) {
  std::map<std::string, std::string> candidate_of;  // candidate path -> ldd path
  for (const std::string& path : paths) {
    std::error_code ec;
    for (std::string p : {path, fs::canonical(path, ec).string()}) {
      if (p.empty()) continue;
      candidate_of.emplace(p, path);
      if (absl::StartsWith(p, "/usr/lib/")) candidate_of.emplace(p.substr(4), path);
      if (absl::StartsWith(p, "/lib")) candidate_of.emplace("/usr" + p, path);
    }
  }
  std::vector<std::string> command = {"/usr/bin/dpkg", "-S"};
  for (const auto& [candidate, path] : candidate_of) command.push_back(candidate);
  // Exit status 1 when some path is not owned: those are left out.
  const ProcessResult dpkg = RunProcess(command, kProcessTimeout);
  EXPECT_TRUE(dpkg.exited) << dpkg.Describe();
  std::map<std::string, std::string> owner;
  for (absl::string_view line : absl::StrSplit(dpkg.out, '\n', absl::SkipEmpty())) {
    const size_t colon = line.find(": /");
    if (colon == absl::string_view::npos || absl::StartsWith(line, "diversion")) continue;
    const auto it = candidate_of.find(std::string(line.substr(colon + 2)));
    if (it == candidate_of.end()) continue;
    absl::string_view package = line.substr(0, line.find_first_of(":,"));
    owner.emplace(it->second, std::string(package));
  }
  return owner;
}

TEST(DockerImageTest, ParserJoinsContinuationsSkipsCommentsAndSplitsStages) {
  absl::StatusOr<Dockerfile> file = ParseDockerfile(
      "# syntax=docker/dockerfile:1\n"
      "ARG BASE=debian\n"
      "FROM debian:bookworm AS build\n"
      "run apt-get update \\\n"
      "  # a comment Docker drops\n"
      " && apt-get install -y --no-install-recommends a b=1.2 \\\n"
      "    -o Dpkg::Options::=--force-confold c\n"
      "FROM debian:bookworm-slim\n"
      "CMD [\"x\", \"--config\", \"/c\"]\n");
  ASSERT_TRUE(file.ok()) << file.status();
  ASSERT_EQ(file->preamble.size(), 1u);
  ASSERT_EQ(file->stages.size(), 2u);
  EXPECT_EQ(file->stages[0].name, "build");
  EXPECT_EQ(file->stages[1].name, "");
  EXPECT_EQ(file->stages[1].base, "debian:bookworm-slim");
  ASSERT_EQ(file->stages[0].instructions.size(), 1u);
  const DockerInstruction& run = file->stages[0].instructions[0];
  EXPECT_EQ(run.keyword, "RUN");
  EXPECT_EQ(run.line, 4);
  EXPECT_EQ(run.args,
            "apt-get update && apt-get install -y --no-install-recommends a b=1.2 "
            "-o Dpkg::Options::=--force-confold c");
  EXPECT_THAT(AptInstallPackages(run.args), ElementsAre("a", "b", "c"));
  EXPECT_THAT(*ParseExecForm(file->stages[1].instructions[0].args),
              ElementsAre("x", "--config", "/c"));
  EXPECT_FALSE(ParseExecForm("x --config /c").ok());
  EXPECT_FALSE(ParseDockerfile("RUN true\n").ok());
  EXPECT_FALSE(ParseDockerfile("FROM a\nRUN true \\\n").ok());
  EXPECT_THAT(PackageListWords("# list\na b # c\n\nd\n"), ElementsAre("a", "b", "d"));
}

TEST(DockerImageTest, DockerIgnoreMatchesLikeDocker) {
  const DockerIgnore ignore("# c\n.git\nbuild*\n**/*.gguf\ndocs\n!docs/keep.md\n");
  EXPECT_TRUE(ignore.Excludes(".git/HEAD"));
  EXPECT_TRUE(ignore.Excludes("build-asan/tandem"));
  EXPECT_TRUE(ignore.Excludes("a/b/m.gguf"));
  EXPECT_TRUE(ignore.Excludes("m.gguf"));
  EXPECT_TRUE(ignore.Excludes("docs/x.md"));
  EXPECT_FALSE(ignore.Excludes("docs/keep.md"));
  EXPECT_FALSE(ignore.Excludes("tools/build.cc"));  // patterns are anchored at the root
  EXPECT_FALSE(ignore.Excludes("scripts/setup"));
}

// A renamed or ignored source would fail `docker build` at that COPY.
TEST(DockerImageTest, EveryCopySourceExistsAndIsInTheBuildContext) {
  const DockerIgnore ignore(ReadFileOrDie(absl::StrCat(kSourceDir, "/.dockerignore")));
  for (const char* image : kImages) {
    SCOPED_TRACE(image);
    const Dockerfile file = LoadImage(image);
    std::set<std::string> stages_so_far;
    int sources = 0;
    for (const DockerStage& stage : file.stages) {
      for (const DockerInstruction& i : stage.instructions) {
        if (i.keyword != "COPY" && i.keyword != "ADD") continue;
        absl::StatusOr<DockerCopy> copy = ParseCopy(i.args);
        ASSERT_TRUE(copy.ok()) << "line " << i.line << ": " << copy.status();
        if (!copy->from.empty()) {
          EXPECT_TRUE(stages_so_far.count(copy->from))
              << "line " << i.line << ": --from=" << copy->from << " names no earlier stage";
          continue;
        }
        for (const std::string& source : copy->sources) {
          if (absl::StrContains(source, "://")) continue;  // ADD of a URL
          ++sources;
          EXPECT_TRUE(fs::exists(absl::StrCat(kSourceDir, "/", source)))
              << "line " << i.line << ": " << source << " is not in the repository";
          EXPECT_FALSE(ignore.Excludes(source))
              << "line " << i.line << ": " << source << " is excluded by .dockerignore";
        }
      }
      stages_so_far.insert(stage.name);
    }
    EXPECT_GT(sources, 0);
  }
}

// The build stage copies every file the top-level CMakeLists.txt
// include()s (cmake/*.cmake): without one, the image's cmake fails.
TEST(DockerImageTest, BuildStageCopiesEveryIncludedCmakeFile) {
  std::vector<std::string> included;
  for (absl::string_view line :
       absl::StrSplit(ReadFileOrDie(absl::StrCat(kSourceDir, "/CMakeLists.txt")), '\n')) {
    line = absl::StripAsciiWhitespace(line);
    if (!absl::ConsumePrefix(&line, "include(") || !absl::ConsumeSuffix(&line, ")")) continue;
    if (absl::EndsWith(line, ".cmake")) included.emplace_back(line);
  }
  ASSERT_THAT(included, ::testing::Contains("cmake/precompiled_headers.cmake"));  // the parse works
  for (const char* image : kImages) {
    SCOPED_TRACE(image);
    const Dockerfile file = LoadImage(image);
    ASSERT_FALSE(file.stages.empty());
    std::vector<std::string> copied;  // sources of the build stage's COPYs
    for (const DockerInstruction& i : file.stages.front().instructions) {
      if (i.keyword != "COPY") continue;
      absl::StatusOr<DockerCopy> copy = ParseCopy(i.args);
      ASSERT_TRUE(copy.ok()) << "line " << i.line << ": " << copy.status();
      if (copy->from.empty()) copied.insert(copied.end(), copy->sources.begin(), copy->sources.end());
    }
    for (const std::string& file_name : included) {
      const bool found = std::any_of(copied.begin(), copied.end(), [&](const std::string& src) {
        return file_name == src || absl::StartsWith(file_name, absl::StrCat(src, "/"));
      });
      EXPECT_TRUE(found) << file_name << " is included by CMakeLists.txt but not copied";
    }
  }
}

// The command's binary, run with its flags (--config pointed at a file that
// does not exist), gets past flag parsing and stops at the config file.
TEST(DockerImageTest, CommandFlagsAreOnesTheBinaryAccepts) {
  const std::string missing =
      (fs::temp_directory_path() / "docker_image_test-no-such.yaml").string();
  for (const char* image : kImages) {
    SCOPED_TRACE(image);
    const Dockerfile file = LoadImage(image);
    ASSERT_FALSE(file.stages.empty());
    std::vector<std::string> command = ImageCommand(file.stages.back());
    ASSERT_FALSE(command.empty()) << "no ENTRYPOINT or CMD";
    EXPECT_EQ(command[0], "tandem-router");
    const std::string binary = fs::path(command[0]).filename().string();
    ASSERT_TRUE(std::find(std::begin(kBinaries), std::end(kBinaries), binary) !=
                std::end(kBinaries))
        << command[0] << " is none of the image's binaries";
    std::vector<std::string> argv = {absl::StrCat(kBinaryDir, "/", binary)};
    int configs = 0;
    for (size_t i = 1; i < command.size(); ++i) {
      argv.push_back(command[i]);
      if (command[i] == "--config" && i + 1 < command.size()) {
        EXPECT_EQ(command[++i], kConfigPath);
        argv.push_back(missing);
        ++configs;
      } else if (absl::StartsWith(command[i], "--config=")) {
        EXPECT_EQ(command[i].substr(9), kConfigPath);
        argv.back() = "--config=" + missing;
        ++configs;
      }
    }
    EXPECT_EQ(configs, 1) << "the command must name --config " << kConfigPath;
    const std::string shown = absl::StrJoin(argv, " ");
    const ProcessResult run = RunProcess(argv, kProcessTimeout);
    EXPECT_EQ(run.exit_code, 1) << shown << ": " << run.Describe();
    EXPECT_EQ(run.err,
              absl::StrCat("cannot read cluster config '", missing, "': No such file or directory\n"))
        << shown;
    EXPECT_EQ(run.out, "") << shown;
  }
}

// `ldd build/<binary>`'s libraries -> packages, each in the runtime stage's
// install list: the CUDA image needs all, the CPU image every non-NVIDIA one
// (its build has no CUDA backend).
TEST(DockerImageTest, RuntimeStageInstallsThePackageOfEveryLinkedLibrary) {
  if (!fs::exists("/usr/bin/dpkg")) GTEST_SKIP() << "no dpkg: not a Debian machine";
  std::map<std::string, std::set<std::string>> needed_by;  // package -> libraries
  std::set<std::string> cuda_packages, unowned;
  for (const char* binary : kBinaries) {
    const std::vector<std::string> libraries =
        LinkedLibraries(absl::StrCat(kBinaryDir, "/", binary));
    EXPECT_FALSE(libraries.empty()) << binary;
    std::vector<std::string> debian;
    for (const std::string& library : libraries) {
      const auto cuda = kCudaPackages.find(fs::path(library).filename().string());
      if (cuda != kCudaPackages.end()) {
        cuda_packages.insert(cuda->second);
        needed_by[cuda->second].insert(library);
      } else if (absl::StartsWith(library, "/usr/local/cuda")) {
        ADD_FAILURE() << binary << " links " << library << ": add its soname to kCudaPackages";
      } else {
        debian.push_back(library);
      }
    }
    const std::map<std::string, std::string> owner = OwningPackages(debian);
    for (const std::string& library : debian) {
      const auto it = owner.find(library);
      if (it == owner.end()) {
        unowned.insert(library);
      } else {
        needed_by[it->second].insert(library);
      }
    }
  }
  EXPECT_THAT(unowned, IsEmpty()) << "libraries no Debian package owns";
  for (const char* image : kImages) {
    SCOPED_TRACE(image);
    const Dockerfile file = LoadImage(image);
    ASSERT_FALSE(file.stages.empty());
    const std::set<std::string> installed = InstalledPackages(file.stages.back());
    for (const auto& [package, libraries] : needed_by) {
      if (kInEveryDebianImage.count(package)) continue;
      if (std::string(image) == kCpuImage && cuda_packages.count(package)) continue;
      EXPECT_TRUE(installed.count(package))
          << "the runtime stage does not install " << package << ", which ships "
          << absl::StrJoin(libraries, ", ");
    }
  }
}

// Non-root (uid 10001, numeric for Kubernetes' runAsNonRoot), no model in
// the image, and the ports the manifests use.
TEST(DockerImageTest, RunsAsUser10001WithoutAModelAndExposesThePorts) {
  for (const char* image : kImages) {
    SCOPED_TRACE(image);
    const Dockerfile file = LoadImage(image);
    ASSERT_FALSE(file.stages.empty());
    const DockerStage& runtime = file.stages.back();
    EXPECT_EQ(runtime.base, "debian:bookworm-slim");
    std::vector<const DockerInstruction*> users = Instructions(runtime, "USER");
    ASSERT_FALSE(users.empty());
    EXPECT_EQ(users.back()->args, "10001:10001");
    std::set<int> ports;
    for (const DockerInstruction* expose : Instructions(runtime, "EXPOSE")) {
      for (absl::string_view port : absl::StrSplit(expose->args, ' ', absl::SkipEmpty())) {
        int value = 0;
        EXPECT_TRUE(absl::SimpleAtoi(port, &value)) << port;
        ports.insert(value);
      }
    }
    EXPECT_EQ(ports, kPorts);
    for (const DockerStage& stage : file.stages) {
      for (const DockerInstruction& i : stage.instructions) {
        if (i.keyword != "COPY" && i.keyword != "ADD") continue;
        EXPECT_FALSE(absl::StrContains(i.args, ".gguf") || absl::StrContains(i.args, "models"))
            << "line " << i.line << " copies a model into the image: " << i.args;
      }
    }
  }
}

}  // namespace
}  // namespace tandem::testing
