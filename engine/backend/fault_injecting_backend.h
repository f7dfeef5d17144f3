// A ModelBackend decorator that makes one Forward call fail the way a
// device backend's would (tests only: the workers' --fault-backend-error
// KIND@N), so that the engine core's and the workers' error paths
// (DESIGN.md, GPU workers: errors) run without a GPU; or that makes every
// Forward call take longer (slow@MS: a busy worker whose steps are long,
// for the tests of issue #32's timeouts).
//
// Owns: the wrapped backend and a count of Forward calls. Does not touch:
// anything the wrapped backend does on the calls it lets through.
// Threads: as the wrapped backend (the engine loop calls Forward);
// device_lost() may be read from any thread.
#ifndef TANDEM_ENGINE_BACKEND_FAULT_INJECTING_BACKEND_H_
#define TANDEM_ENGINE_BACKEND_FAULT_INJECTING_BACKEND_H_

#include <atomic>
#include <cstdint>
#include <memory>
#include <string>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "engine/backend/model_backend.h"

namespace tandem::backend {

// Which Forward call fails, and how.
struct BackendFault {
  enum class Kind {
    kOom,       // that call: RESOURCE_EXHAUSTED (device out of memory)
    kInternal,  // that call: INTERNAL (a recoverable device error)
    kSticky,    // that call and every later one: INTERNAL, device_lost() true
    kSlow,      // every call: computes normally after `call` ms of sleep
  };
  Kind kind = Kind::kInternal;
  int64_t call = 1;  // 1-based: the call-th Forward fails; kSlow: ms per call
};

// Parses "KIND@N": KIND one of oom, internal, sticky (N an integer >= 1:
// the N-th forward call fails) or slow (N >= 1 ms added to every call).
// Errors: INVALID_ARGUMENT naming `flag` (e.g. "--fault-backend-error"),
// the value and what is expected.
[[nodiscard]] absl::StatusOr<BackendFault> ParseBackendFault(absl::string_view spec,
                                                             absl::string_view flag);

// "oom@3", as parsed.
std::string BackendFaultToString(const BackendFault& fault);

class FaultInjectingBackend final : public ModelBackend {
 public:
  FaultInjectingBackend(std::unique_ptr<ModelBackend> inner, const BackendFault& fault);

  const model::LlamaConfig& config() const override { return inner_->config(); }
  kv::KvStorage& kv_storage() override { return inner_->kv_storage(); }
  std::string bit_exact_class() const override { return inner_->bit_exact_class(); }
  // Calls the wrapped backend, except on the fault's call (and, for
  // kSticky, every later one): then returns the fault's error without
  // computing anything (no hook call; *views untouched), as a device step
  // that did not complete. The message names the injected fault. kSlow:
  // sleeps fault.call ms, then calls the wrapped backend.
  [[nodiscard]] absl::Status Forward(std::span<const ForwardEntry> batch, const LayerHook* hook,
                                     std::vector<sampling::SamplingView>* views) override;
  // True from the failing call of a kSticky fault on.
  bool device_lost() const override { return lost_.load(); }

  // Forward calls so far, failed ones included.
  int64_t forward_calls() const { return calls_; }

 private:
  const std::unique_ptr<ModelBackend> inner_;
  const BackendFault fault_;
  int64_t calls_ = 0;
  std::atomic<bool> lost_{false};
};

}  // namespace tandem::backend

#endif  // TANDEM_ENGINE_BACKEND_FAULT_INJECTING_BACKEND_H_
