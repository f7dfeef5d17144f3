#include "engine/backend/fault_injecting_backend.h"

#include <chrono>
#include <thread>
#include <utility>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"

namespace tandem::backend {
namespace {

struct KindName {
  BackendFault::Kind kind;
  const char* name;
};
constexpr KindName kKinds[] = {{BackendFault::Kind::kOom, "oom"},
                               {BackendFault::Kind::kInternal, "internal"},
                               {BackendFault::Kind::kSticky, "sticky"},
                               {BackendFault::Kind::kSlow, "slow"}};

}  // namespace

absl::StatusOr<BackendFault> ParseBackendFault(absl::string_view spec, absl::string_view flag) {
  auto bad = [&](absl::string_view why) {
    return absl::InvalidArgumentError(
        absl::StrCat(flag, ": '", spec, "': ", why,
                     "; expected KIND@N with KIND oom, internal or sticky and N >= 1 "
                     "(the N-th forward call fails), or slow@N (N >= 1 ms added to every "
                     "forward call)"));
  };
  const size_t at = spec.find('@');
  if (at == absl::string_view::npos) return bad("no '@'");
  const absl::string_view kind = spec.substr(0, at);
  BackendFault fault;
  bool known = false;
  for (const KindName& k : kKinds) {
    if (kind == k.name) {
      fault.kind = k.kind;
      known = true;
    }
  }
  if (!known) return bad(absl::StrCat("unknown KIND '", kind, "'"));
  if (!absl::SimpleAtoi(spec.substr(at + 1), &fault.call) || fault.call < 1) {
    return bad(absl::StrCat("N '", spec.substr(at + 1), "' is not an integer >= 1"));
  }
  return fault;
}

std::string BackendFaultToString(const BackendFault& fault) {
  const char* name = "";
  for (const KindName& k : kKinds) {
    if (k.kind == fault.kind) name = k.name;
  }
  return absl::StrCat(name, "@", fault.call);
}

FaultInjectingBackend::FaultInjectingBackend(std::unique_ptr<ModelBackend> inner,
                                             const BackendFault& fault)
    : inner_(std::move(inner)), fault_(fault) {}

absl::Status FaultInjectingBackend::Forward(std::span<const ForwardEntry> batch,
                                            const LayerHook* hook,
                                            std::vector<sampling::SamplingView>* views) {
  const int64_t call = ++calls_;
  if (fault_.kind == BackendFault::Kind::kSlow) {
    std::this_thread::sleep_for(std::chrono::milliseconds(fault_.call));
    return inner_->Forward(batch, hook, views);
  }
  const bool sticky = fault_.kind == BackendFault::Kind::kSticky;
  if (call != fault_.call && !(sticky && call > fault_.call)) {
    return inner_->Forward(batch, hook, views);
  }
  const std::string what = absl::StrCat(" (injected: fault ", BackendFaultToString(fault_),
                                        ", forward call ", call, ")");
  switch (fault_.kind) {
    case BackendFault::Kind::kOom:
      return absl::ResourceExhaustedError(absl::StrCat("out of memory", what));
    case BackendFault::Kind::kInternal:
      return absl::InternalError(absl::StrCat("device error", what));
    case BackendFault::Kind::kSticky:
      lost_.store(true);
      return absl::InternalError(absl::StrCat("illegal memory access", what));
    case BackendFault::Kind::kSlow:
      break;  // handled above
  }
  return absl::InternalError(absl::StrCat("unknown fault", what));
}

}  // namespace tandem::backend
