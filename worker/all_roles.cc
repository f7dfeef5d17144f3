#include "worker/all_roles.h"

#include "decode_worker/decode_role.h"
#include "prefill_worker/prefill_role.h"

namespace tandem {

std::vector<WorkerRoleSpec> AllWorkerRoles() {
  return {prefill::PrefillRole(), decode::DecodeRole()};
}

int RunWorkerBinary(int argc, char** argv, v1::WorkerRole role, const std::string& program) {
  return RunWorkerMain(argc, argv, AllWorkerRoles(), role, program);
}

}  // namespace tandem
