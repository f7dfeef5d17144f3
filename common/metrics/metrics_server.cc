#include "common/metrics/metrics_server.h"

#include <utility>

#include "prometheus/metric_family.h"
#include "prometheus/text_serializer.h"

namespace tandem::metrics {

std::string Scrape(const std::vector<std::weak_ptr<prometheus::Collectable>>& collectables) {
  std::vector<prometheus::MetricFamily> families;
  for (const std::weak_ptr<prometheus::Collectable>& weak : collectables) {
    std::shared_ptr<prometheus::Collectable> collectable = weak.lock();
    if (collectable == nullptr) continue;
    std::vector<prometheus::MetricFamily> more = collectable->Collect();
    for (prometheus::MetricFamily& f : more) families.push_back(std::move(f));
  }
  return prometheus::TextSerializer().Serialize(families);
}

http::Handler MetricsHandler(std::vector<std::weak_ptr<prometheus::Collectable>> collectables) {
  return [collectables = std::move(collectables)](std::shared_ptr<http::Exchange> ex) {
    ex->Respond(200, {{"Content-Type", kContentType}}, Scrape(collectables));
  };
}

void ServeMetrics(http::HttpServer* server,
                  std::vector<std::weak_ptr<prometheus::Collectable>> collectables) {
  server->Handle("GET", "/metrics", MetricsHandler(std::move(collectables)));
}

}  // namespace tandem::metrics
