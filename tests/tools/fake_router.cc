// A stand-in for tandem-router in the CLI tests: the same command line and
// start-up contract (one "TANDEM_LISTENING host:port" line on stdout, exit on
// SIGTERM), and a canned tandem.v1.Generation service, so `tandem up`,
// `tandem generate` and `tandem status` run end to end without a model.
//
//   --listen H:P (default 127.0.0.1:0); --config/--name/--model accepted.
// It writes its arguments to <dir of this executable>/<name>.args and its
// pid to <name>.pid.
// GetStatus lists every worker of its --config as registered and healthy
// (address 127.0.0.1:1; decode workers kv_blocks_total 2048), prefill
// workers first; without --config, decode-0 alone; no slo, placement
// threshold (a config without `slo`).
// Environment knobs: FAKE_ROUTER_NOT_READY=1 -> can_serve false;
// FAKE_ROUTER_BUSY=1 -> decode-0 reports kv_blocks_in_use 3;
// FAKE_ROUTER_BAD_MODEL=1 -> as the router with a model it cannot load:
// "<--model>: not a GGUF file" on stderr, exit 1, nothing on stdout.
//
// Generate: prompt "fail" -> INVALID_ARGUMENT "prompt: rejected by the fake
// router". Otherwise one metadata message (request_id "fake-1", prompt ids
// [1, prompt length], seed = the request's or 4242, route "local" for
// ROUTE_LOCAL else "remote" with prefill_worker "prefill-0"), then one
// message per token i < max_tokens and sample s < n (request n, 1 when
// unset), samples in descending order within a step, so sample 0 finishes
// last: token_id 100 + 1000 s + i, text " t<i>" (sample 0) or " s<s>t<i>",
// logprob -0.5 and, with request logprobs k, k alternatives (id + j,
// logprob -0.5 - j for j < k). A sample's last message carries
// FINISH_LENGTH, or with request stop strings FINISH_STOP and stop_reason =
// the first of them, and the usage counts.
#include <grpcpp/grpcpp.h>
#include <signal.h>
#include <unistd.h>

#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <string>
#include <utility>
#include <vector>

#include "common/cluster_config.h"
#include "tandem/v1/generation.grpc.pb.h"

namespace {

bool Env(const char* name) {
  const char* v = std::getenv(name);
  return v != nullptr && std::string(v) == "1";
}

class FakeGeneration final : public tandem::v1::Generation::Service {
 public:
  // `workers`: (name, role) of every worker GetStatus reports.
  FakeGeneration(std::string name,
                 std::vector<std::pair<std::string, tandem::v1::WorkerRole>> workers)
      : name_(std::move(name)), workers_(std::move(workers)) {}
  void set_address(const std::string& address) { address_ = address; }

  grpc::Status Generate(grpc::ServerContext*, const tandem::v1::GenerateRequest* request,
                        grpc::ServerWriter<tandem::v1::GenerateResponse>* writer) override {
    if (request->prompt() == "fail") {
      return grpc::Status(grpc::StatusCode::INVALID_ARGUMENT,
                          "prompt: rejected by the fake router");
    }
    const bool local = request->route_override() == tandem::v1::ROUTE_LOCAL;
    tandem::v1::GenerateResponse meta;
    meta.set_request_id("fake-1");
    meta.set_route(local ? "local" : "remote");
    if (!local) meta.set_prefill_worker("prefill-0");
    meta.set_decode_worker("decode-0");
    meta.add_prompt_token_ids(1);
    meta.add_prompt_token_ids(static_cast<int32_t>(request->prompt().size()));
    meta.set_seed(request->sampling().has_seed() ? request->sampling().seed() : 4242);
    writer->Write(meta);
    const uint32_t n = request->has_n() && request->n() > 0 ? request->n() : 1;
    for (uint32_t i = 0; i < request->max_tokens(); ++i) {
      for (uint32_t s = n; s-- > 0;) {
        tandem::v1::GenerateResponse r;
        r.set_sample_index(s);
        tandem::v1::TokenOutput* t = r.add_tokens();
        t->set_index(i);
        t->set_sample_index(s);
        t->set_token_id(static_cast<int32_t>(100 + 1000 * s + i));
        t->set_logprob(-0.5f);
        for (uint32_t j = 0; j < request->logprobs(); ++j) {
          tandem::v1::TopLogprob* alt = t->add_top_logprobs();
          alt->set_token_id(t->token_id() + static_cast<int32_t>(j));
          alt->set_logprob(-0.5f - static_cast<float>(j));
        }
        r.set_text((s == 0 ? " t" : " s" + std::to_string(s) + "t") + std::to_string(i));
        if (i + 1 == request->max_tokens()) {
          if (request->stop_size() > 0) {
            r.set_finish_reason(tandem::v1::FINISH_STOP);
            r.mutable_stop_reason()->set_text(request->stop(0));
          } else {
            r.set_finish_reason(tandem::v1::FINISH_LENGTH);
          }
          r.set_prompt_tokens(2);
          r.set_completion_tokens(request->max_tokens());
        }
        writer->Write(r);
      }
    }
    return grpc::Status::OK;
  }

  grpc::Status GetStatus(grpc::ServerContext*, const tandem::v1::GetStatusRequest*,
                         tandem::v1::ClusterStatus* status) override {
    tandem::v1::WorkerStatus* router = status->mutable_router();
    router->set_name(name_);
    router->set_role(tandem::v1::ROLE_ROUTER);
    router->set_address(address_);
    router->set_ready(true);
    router->set_healthy(true);
    for (const auto& [name, role] : workers_) {
      tandem::v1::WorkerStatus* w = status->add_workers();
      w->set_name(name);
      w->set_role(role);
      w->set_address("127.0.0.1:1");
      w->set_ready(true);
      w->set_healthy(true);
      if (role != tandem::v1::ROLE_DECODE) continue;
      w->set_kv_blocks_total(2048);
      w->set_kv_blocks_in_use(name == "decode-0" && Env("FAKE_ROUTER_BUSY") ? 3 : 0);
    }
    status->set_can_serve(!Env("FAKE_ROUTER_NOT_READY"));
    status->set_cluster_auth("open");
    status->set_placement("threshold");
    return grpc::Status::OK;
  }

 private:
  const std::string name_;
  const std::vector<std::pair<std::string, tandem::v1::WorkerRole>> workers_;
  std::string address_;
};

}  // namespace

int main(int argc, char** argv) {
  std::string listen = "127.0.0.1:0";
  std::string name = "router";
  std::string config_path;
  std::string model;
  std::string all_args;
  for (int i = 1; i < argc; ++i) {
    const std::string arg = argv[i];
    all_args += (i > 1 ? " " : "") + arg;
    if (i + 1 < argc && arg == "--listen") listen = argv[i + 1];
    if (i + 1 < argc && arg == "--name") name = argv[i + 1];
    if (i + 1 < argc && arg == "--config") config_path = argv[i + 1];
    if (i + 1 < argc && arg == "--model") model = argv[i + 1];
  }
  if (Env("FAKE_ROUTER_BAD_MODEL")) {
    std::fprintf(stderr, "%s: not a GGUF file\n", model.c_str());
    return 1;
  }
  std::vector<std::pair<std::string, tandem::v1::WorkerRole>> workers = {
      {"decode-0", tandem::v1::ROLE_DECODE}};
  if (!config_path.empty()) {
    absl::StatusOr<tandem::ClusterConfig> config = tandem::LoadClusterConfig(config_path);
    if (!config.ok()) {
      std::fprintf(stderr, "%s\n", std::string(config.status().message()).c_str());
      return 1;
    }
    workers.clear();
    for (const tandem::WorkerConfig& w : config->prefill_workers) {
      workers.emplace_back(w.name, tandem::v1::ROLE_PREFILL);
    }
    for (const tandem::WorkerConfig& w : config->decode_workers) {
      workers.emplace_back(w.name, tandem::v1::ROLE_DECODE);
    }
  }
  const std::filesystem::path dir = std::filesystem::read_symlink("/proc/self/exe").parent_path();
  std::ofstream(dir / (name + ".args")) << all_args << "\n";
  std::ofstream(dir / (name + ".pid")) << getpid() << "\n";

  // Blocked before gRPC starts its threads, so sigwait below receives them.
  sigset_t stop;
  sigemptyset(&stop);
  sigaddset(&stop, SIGTERM);
  sigaddset(&stop, SIGINT);
  pthread_sigmask(SIG_BLOCK, &stop, nullptr);

  FakeGeneration service(name, std::move(workers));
  int port = 0;
  grpc::ServerBuilder builder;
  builder.AddListeningPort(listen, grpc::InsecureServerCredentials(), &port);
  builder.RegisterService(&service);
  std::unique_ptr<grpc::Server> server = builder.BuildAndStart();
  if (server == nullptr || port == 0) {
    std::fprintf(stderr, "router.listen: cannot bind %s\n", listen.c_str());
    return 1;
  }
  const std::string address = listen.substr(0, listen.rfind(':')) + ":" + std::to_string(port);
  service.set_address(address);
  std::printf("TANDEM_LISTENING %s\n", address.c_str());
  std::fflush(stdout);
  int sig = 0;
  sigwait(&stop, &sig);
  server->Shutdown(std::chrono::system_clock::now() + std::chrono::seconds(1));
  return 0;
}
