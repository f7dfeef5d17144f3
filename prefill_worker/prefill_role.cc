#include "prefill_worker/prefill_role.h"

#include <utility>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "prefill_worker/prefill_service.h"
#include "worker/worker_main.h"

namespace tandem::prefill {
namespace {

// The tests-only --fault-* flags into `send`.
[[nodiscard]] absl::Status ApplyFaultFlags(const std::map<std::string, std::string>& flags,
                                           KvSendOptions* send) {
  auto it = flags.find("fault-stall-after-frames");
  if (it != flags.end() && !absl::SimpleAtoi(it->second, &send->fault_stall_after_frames)) {
    return absl::InvalidArgumentError("--fault-stall-after-frames: not an integer");
  }
  if (auto fail = flags.find("fault-fail-reply"); fail != flags.end()) {
    if (fail->second != "true" && fail->second != "false") {
      return absl::InvalidArgumentError(
          absl::StrCat("--fault-fail-reply: expected true or false, got '", fail->second, "'"));
    }
    send->fault_fail_reply = fail->second == "true";
  }
  return absl::OkStatus();
}

[[nodiscard]] absl::StatusOr<std::unique_ptr<WorkerRuntime>> MakePrefillRuntime(
    const WorkerContext& ctx, const SharedCoreParts& shared) {
  KvSendOptions send;
  send.layout = shared.layout;
  send.bit_exact_class = shared.bit_exact_class;
  send.transfer_timeout_ms = ctx.config->kv.transfer_timeout_ms;
  send.send_buffer_bytes = ctx.config->kv.send_buffer_bytes;
  send.auth = ctx.auth;
  send.planes = shared.planes;
  if (absl::Status s = ApplyFaultFlags(*ctx.flags, &send); !s.ok()) return s;
  if (absl::Status started = StartKvSendQueue(&send); !started.ok()) return started;
  return std::make_unique<PrefillService>(shared.core, std::move(send), ctx.status, ctx.auth,
                                          ctx.gate);
}

}  // namespace

WorkerRoleSpec PrefillRole() {
  return {v1::ROLE_PREFILL,
          {"fault-stall-after-frames", "fault-fail-reply"},
          nullptr,
          MakePrefillRuntime};
}

}  // namespace tandem::prefill
