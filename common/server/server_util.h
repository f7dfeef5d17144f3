// Process plumbing shared by the three server binaries: signals, binding,
// channels with short reconnect backoff, the readiness line.
#ifndef TANDEM_COMMON_SERVER_SERVER_UTIL_H_
#define TANDEM_COMMON_SERVER_SERVER_UTIL_H_

#include <grpcpp/grpcpp.h>

#include <memory>
#include <string>

#include "absl/status/statusor.h"
#include "common/cluster_config.h"

namespace tandem::rpc {

// The grpc.health.v1 service name that answers "is this process alive"
// (Kubernetes' livenessProbe): SERVING from the moment the gRPC server of
// the router or a worker is up until the process exits, also while the
// router cannot serve, a worker is not ready, and during the SIGTERM drain.
// The service "" keeps meaning "can take work" (readinessProbe): the
// router's is SERVING only while the cluster can serve, a worker's while it
// is ready, NOT_SERVING from its termination signal on. Both are set with
// HealthCheckServiceInterface::SetServingStatus(name, ...), never the
// all-services overload, which would take liveness down with readiness.
inline constexpr char kLivenessHealthService[] = "liveness";

// Blocks SIGINT and SIGTERM in the calling thread and every thread it
// creates afterwards; call first thing in main(). WaitForTerminationSignal
// then receives them synchronously (sigwait) and returns the signal number.
void BlockTerminationSignals();
int WaitForTerminationSignal();

// Binds `builder` to `listen` (port 0 = ephemeral) with SO_REUSEPORT off, so
// a busy port fails instead of being shared, and starts the server.
// Errors: UNAVAILABLE "<config_key>: address H:P is already in use or
// cannot be bound". On success *bound_port holds the real port.
[[nodiscard]] absl::StatusOr<std::unique_ptr<grpc::Server>> BuildAndStart(
    grpc::ServerBuilder& builder, const HostPort& listen, const std::string& config_key,
    int* bound_port);

// Prints "TANDEM_LISTENING host:port" on stdout and flushes: the one line
// `tandem up` and tests wait for.
void AnnounceListening(const std::string& host, int port);

// Prints "TANDEM_METRICS_LISTENING host:port" on stdout and flushes: where
// the process's GET /metrics server bound (a port 0 in the config becomes
// the real one), printed before its TANDEM_LISTENING line. `tandem up`
// reads it for the "metrics=" of its process table.
void AnnounceMetricsListening(const std::string& host, int port);

// An insecure channel to `address` with reconnect backoff ~100 ms initial,
// 1 s max (DESIGN.md: a restarted worker is seen at once).
std::shared_ptr<grpc::Channel> MakeChannel(const std::string& address);

// A deadline `timeout_ms` from now, for ClientContext::set_deadline.
std::chrono::system_clock::time_point DeadlineFromNow(int timeout_ms);

}  // namespace tandem::rpc

#endif  // TANDEM_COMMON_SERVER_SERVER_UTIL_H_
