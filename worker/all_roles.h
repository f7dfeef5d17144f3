// Every role a worker hosts (issue #35: one worker runs both roles on one
// engine core and serves one at a time): the one place besides the binary
// that names prefill_worker/ and decode_worker/.
#ifndef TANDEM_WORKER_ALL_ROLES_H_
#define TANDEM_WORKER_ALL_ROLES_H_

#include <string>
#include <vector>

#include "worker/worker_main.h"

namespace tandem {

// PrefillRole() and DecodeRole().
std::vector<WorkerRoleSpec> AllWorkerRoles();

// RunWorkerMain with AllWorkerRoles(), starting in `role`.
int RunWorkerBinary(int argc, char** argv, v1::WorkerRole role, const std::string& program);

}  // namespace tandem

#endif  // TANDEM_WORKER_ALL_ROLES_H_
