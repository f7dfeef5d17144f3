// Minimal process logging to stderr: "<time> <component>: <message>".
// Stdout is reserved for machine-read lines (TANDEM_LISTENING).
#ifndef TANDEM_COMMON_SERVER_LOG_H_
#define TANDEM_COMMON_SERVER_LOG_H_

#include "absl/strings/string_view.h"

namespace tandem::rpc {

// Sets the component name printed before every line (e.g. "decode-0").
void SetLogComponent(absl::string_view name);
// Writes one line to stderr (thread-safe, one write(2) per line).
void Log(absl::string_view message);

}  // namespace tandem::rpc

#endif  // TANDEM_COMMON_SERVER_LOG_H_
