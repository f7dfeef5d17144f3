// Test helper: parses Prometheus text exposition with an independent
// parser, python3-prometheus-client's text_string_to_metric_families (run
// as `python3 -c`), so tests check what a real scraper reads.
#ifndef TANDEM_TESTS_COMMON_PROMETHEUS_TEXT_H_
#define TANDEM_TESTS_COMMON_PROMETHEUS_TEXT_H_

#include <map>
#include <string>

#include "absl/status/statusor.h"

namespace tandem::testing {

// One sample as the parser reports it.
struct PromSample {
  std::string type;  // its family's type: "counter", "gauge", "histogram", ...
  double value = 0;
};

// Samples of `text` keyed `name{label="value",...}` (labels sorted by name;
// "name{}" without labels). Histogram samples appear as name_bucket{le=...},
// name_count{}, name_sum{}; counters under their sample name (..._total).
// Errors: INTERNAL with python's stderr when the text does not parse.
absl::StatusOr<std::map<std::string, PromSample>> ParsePrometheusText(const std::string& text);

}  // namespace tandem::testing

#endif  // TANDEM_TESTS_COMMON_PROMETHEUS_TEXT_H_
