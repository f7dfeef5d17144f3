#include "common/server/server_util.h"

#include <arpa/inet.h>
#include <netinet/in.h>
#include <signal.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cstdio>

#include "absl/strings/str_cat.h"

namespace tandem::rpc {
namespace {
sigset_t TerminationSignals() {
  sigset_t set;
  sigemptyset(&set);
  sigaddset(&set, SIGINT);
  sigaddset(&set, SIGTERM);
  return set;
}
// True when `listen` can be bound right now (as gRPC binds: SO_REUSEADDR,
// no SO_REUSEPORT). Lets a busy port fail with our one-line message before
// gRPC logs its own multi-line error.
bool CanBind(const HostPort& listen) {
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_port = htons(static_cast<uint16_t>(listen.port));
  if (inet_pton(AF_INET, listen.host.c_str(), &addr.sin_addr) != 1) {
    return true;  // not an IPv4 literal (e.g. a name): let gRPC resolve it
  }
  int fd = socket(AF_INET, SOCK_STREAM, 0);
  if (fd < 0) return true;
  int one = 1;
  setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof(one));
  const bool ok = bind(fd, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)) == 0;
  close(fd);
  return ok;
}

}  // namespace

void BlockTerminationSignals() {
  sigset_t set = TerminationSignals();
  pthread_sigmask(SIG_BLOCK, &set, nullptr);
  // A closed pipe must show up as an error from write(), not kill us.
  signal(SIGPIPE, SIG_IGN);
}

int WaitForTerminationSignal() {
  sigset_t set = TerminationSignals();
  int sig = 0;
  while (sigwait(&set, &sig) != 0) {
  }
  return sig;
}

absl::StatusOr<std::unique_ptr<grpc::Server>> BuildAndStart(grpc::ServerBuilder& builder,
                                                            const HostPort& listen,
                                                            const std::string& config_key,
                                                            int* bound_port) {
  *bound_port = 0;
  const std::string busy = absl::StrCat(config_key, ": address ", listen.ToString(),
                                        " is already in use or cannot be bound");
  if (!CanBind(listen)) return absl::UnavailableError(busy);
  builder.AddChannelArgument(GRPC_ARG_ALLOW_REUSEPORT, 0);
  builder.AddListeningPort(listen.ToString(), grpc::InsecureServerCredentials(), bound_port);
  std::unique_ptr<grpc::Server> server = builder.BuildAndStart();
  if (server == nullptr || *bound_port == 0) {
    return absl::UnavailableError(busy);
  }
  return server;
}

void AnnounceListening(const std::string& host, int port) {
  std::printf("TANDEM_LISTENING %s:%d\n", host.c_str(), port);
  std::fflush(stdout);
}

void AnnounceMetricsListening(const std::string& host, int port) {
  std::printf("TANDEM_METRICS_LISTENING %s:%d\n", host.c_str(), port);
  std::fflush(stdout);
}

std::shared_ptr<grpc::Channel> MakeChannel(const std::string& address) {
  grpc::ChannelArguments args;
  args.SetInt(GRPC_ARG_INITIAL_RECONNECT_BACKOFF_MS, 100);
  // GRPC_ARG_MIN_RECONNECT_BACKOFF_MS stays at gRPC's default (20 s): gRPC
  // also uses it as the connect timeout, and 100 ms made busy-machine
  // connects fail with "timed out before receiving SETTINGS frame".
  args.SetInt(GRPC_ARG_MAX_RECONNECT_BACKOFF_MS, 1000);
  return grpc::CreateCustomChannel(address, grpc::InsecureChannelCredentials(), args);
}

std::chrono::system_clock::time_point DeadlineFromNow(int timeout_ms) {
  return std::chrono::system_clock::now() + std::chrono::milliseconds(timeout_ms);
}

}  // namespace tandem::rpc
