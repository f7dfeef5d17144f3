// Serves Prometheus metrics over HTTP: GET /metrics answers with the text
// exposition format (version 0.0.4) of every collectable's metrics,
// collected at scrape time.
//
// Owns: the /metrics route and serialization. Does not touch: what is
// measured (the router's and the workers' collectables), sockets and HTTP
// (common/http).
// Threads: the handler runs on the HTTP server's loop thread; collectables
// must be thread-safe (prometheus-cpp's Registry, Counter, Gauge and
// Histogram are) and quick (a status snapshot, no network).
#ifndef TANDEM_COMMON_METRICS_METRICS_SERVER_H_
#define TANDEM_COMMON_METRICS_METRICS_SERVER_H_

#include <memory>
#include <string>
#include <vector>

#include "common/http/http_server.h"
#include "prometheus/collectable.h"

namespace tandem::metrics {

// The Content-Type of a /metrics answer.
inline constexpr char kContentType[] = "text/plain; version=0.0.4; charset=utf-8";

// The text exposition of every live collectable's Collect(), in order
// (expired weak pointers are skipped). A family name that several
// collectables report is written once per collectable: callers keep names
// disjoint.
std::string Scrape(const std::vector<std::weak_ptr<prometheus::Collectable>>& collectables);

// The handler of GET /metrics: 200 with kContentType and
// Scrape(collectables) as the body. For a caller that puts its own check
// in front (the router's client port, behind its API keys).
http::Handler MetricsHandler(std::vector<std::weak_ptr<prometheus::Collectable>> collectables);

// Registers GET /metrics on `server` (before its Start): MetricsHandler.
// Other methods on the path get the server's 405.
void ServeMetrics(http::HttpServer* server,
                  std::vector<std::weak_ptr<prometheus::Collectable>> collectables);

}  // namespace tandem::metrics

#endif  // TANDEM_COMMON_METRICS_METRICS_SERVER_H_
