#include "common/server/log.h"

#include <unistd.h>

#include <string>

#include "absl/strings/str_cat.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/clock.h"
#include "absl/time/time.h"

namespace tandem::rpc {
namespace {
absl::Mutex g_mu;
std::string* g_component ABSL_GUARDED_BY(g_mu) = nullptr;
}  // namespace

void SetLogComponent(absl::string_view name) {
  absl::MutexLock lock(&g_mu);
  delete g_component;
  g_component = new std::string(name);
}

void Log(absl::string_view message) {
  std::string line;
  {
    absl::MutexLock lock(&g_mu);
    line = absl::StrCat(absl::FormatTime("%H:%M:%E3S", absl::Now(), absl::LocalTimeZone()), " ",
                        g_component != nullptr ? *g_component : std::string("tandem"), ": ",
                        message, "\n");
  }
  // One write per line keeps lines whole when several threads log.
  ssize_t unused = ::write(STDERR_FILENO, line.data(), line.size());
  (void)unused;
}

}  // namespace tandem::rpc
