#include "tests/integration/up_fixture.h"

#include <grpcpp/grpcpp.h>
#include <signal.h>
#include <unistd.h>

#include <cerrno>
#include <chrono>
#include <filesystem>
#include <fstream>
#include <iostream>
#include <iterator>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "gtest/gtest.h"
#include "tests/test_util.h"

namespace tandem::testing {

bool ProcessGone(pid_t pid) { return kill(pid, 0) != 0 && errno == ESRCH; }

absl::StatusOr<std::unique_ptr<UpCluster>> UpCluster::Start(const UpClusterOptions& options) {
  std::unique_ptr<UpCluster> cluster(new UpCluster());
  if (absl::Status s = cluster->StartProcess(options); !s.ok()) return s;
  return cluster;
}

absl::Status UpCluster::StartProcess(const UpClusterOptions& options) {
  dir_ = MakeTempDir();
  if (dir_.empty()) return absl::InternalError("cannot create a temporary directory");
  config_path_ = dir_ + "/cluster.yaml";
  stderr_path_ = dir_ + "/up.stderr";
  const std::string yaml =
      options.config_yaml.empty() ? ClusterYaml(options.cluster) : options.config_yaml;
  if (!WriteFile(config_path_, yaml)) {
    return absl::InternalError(absl::StrCat("cannot write ", config_path_));
  }
  std::vector<std::string> argv = {BinaryPath("tandem"),
                                   "up",
                                   "--config",
                                   config_path_,
                                   "--model",
                                   absl::StartsWith(options.cluster.model, "/")
                                       ? options.cluster.model
                                       : SharedPath("models/" + options.cluster.model),
                                   "--ready-timeout-s",
                                   absl::StrCat(absl::ToInt64Seconds(options.start_timeout))};
  if (options.prefill_workers.has_value()) {
    argv.insert(argv.end(), {"--prefill-workers", absl::StrCat(*options.prefill_workers)});
  }
  if (options.decode_workers.has_value()) {
    argv.insert(argv.end(), {"--decode-workers", absl::StrCat(*options.decode_workers)});
  }
  argv.insert(argv.end(), options.extra_args.begin(), options.extra_args.end());
  cli::ProcessGroup::SpawnOptions spawn;
  spawn.stderr_path = stderr_path_;
  absl::StatusOr<int> up = group_.Spawn("tandem-up", argv, spawn);
  if (!up.ok()) return up.status();
  // A little beyond tandem up's own --ready-timeout-s, so that its message
  // says what was missing.
  absl::StatusOr<cli::UpReady> ready =
      cli::WaitForUpReady(group_, *up, options.start_timeout + absl::Seconds(5));
  if (!ready.ok()) {
    const std::string err = Stderr();
    return absl::Status(ready.status().code(),
                        absl::StrCat(ready.status().message(), "; tandem up's stderr ends:\n",
                                     err.substr(err.size() > 4000 ? err.size() - 4000 : 0)));
  }
  ready_ = *std::move(ready);
  stub_ = v1::Generation::NewStub(
      grpc::CreateChannel(ready_.router_address, grpc::InsecureChannelCredentials()));
  return absl::OkStatus();
}

UpCluster::~UpCluster() {
  Stop();
  if (::testing::Test::HasFailure() && !stderr_path_.empty()) {
    std::cerr << "---- tandem up's stderr ----\n" << Stderr() << "---- end ----\n";
  }
  if (!dir_.empty()) {
    std::error_code ignored;
    std::filesystem::remove_all(dir_, ignored);
  }
}

std::optional<std::string> UpCluster::WaitForExit(absl::Duration timeout) {
  if (exit_.has_value()) return exit_;
  if (group_.size() == 0) return std::nullopt;
  const absl::Time deadline = absl::Now() + timeout;
  for (;;) {
    group_.ForwardOutput();  // its stdout: nothing after the ready line
    if (std::optional<cli::ProcessGroup::Exit> e = group_.ReapExited()) {
      exit_ = cli::DescribeWaitStatus(e->wait_status);
      return exit_;
    }
    if (absl::Now() >= deadline) return std::nullopt;
    absl::SleepFor(absl::Milliseconds(10));
  }
}

std::string UpCluster::Stop(absl::Duration timeout) {
  stub_.reset();
  if (group_.size() == 0) return "not started";
  if (!exit_.has_value() && group_.running(0)) {
    kill(group_.pid(0), SIGTERM);
    if (!WaitForExit(timeout).has_value()) {
      group_.StopAll(absl::ZeroDuration());  // SIGKILL; its children get PDEATHSIG
      exit_ = cli::DescribeWaitStatus(group_.wait_status(0));
    }
  }
  if (!exit_.has_value()) exit_ = cli::DescribeWaitStatus(group_.wait_status(0));
  return *exit_;
}

pid_t UpCluster::pid(const std::string& name) const {
  const cli::UpProcess* p = ready_.Find(name);
  return p == nullptr ? -1 : p->pid;
}

absl::StatusOr<v1::ClusterStatus> UpCluster::ClusterStatus(absl::Duration timeout) {
  if (stub_ == nullptr) return absl::FailedPreconditionError("the cluster is stopped");
  grpc::ClientContext context;
  context.set_deadline(std::chrono::system_clock::now() +
                       std::chrono::milliseconds(absl::ToInt64Milliseconds(timeout)));
  v1::ClusterStatus status;
  grpc::Status s = stub_->GetStatus(&context, v1::GetStatusRequest(), &status);
  if (!s.ok()) {
    return absl::Status(static_cast<absl::StatusCode>(s.error_code()), s.error_message());
  }
  return status;
}

std::string UpCluster::Stderr() const {
  std::ifstream in(stderr_path_, std::ios::binary);
  return std::string(std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>());
}

bool UpCluster::WaitForStderr(const std::string& text, absl::Duration timeout) const {
  return PollUntil(
      timeout, [&] { return Stderr().find(text) != std::string::npos; }, absl::Milliseconds(20));
}

}  // namespace tandem::testing
