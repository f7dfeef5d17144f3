// The HELLO's transport_setup for `nccl` (opaque to the KV connection):
// which communicator of the P-D pair a transfer uses.
//
// Layout (little-endian):
//   "NCL1"  magic, 4 bytes
//   u64     generation (1, 2, ... per P-D pair; a failed communicator is
//           replaced by the next generation)
//   u32 n,  n bytes: P's instance id (NewInstanceId-style, per process)
//   u32 m,  m bytes: the ncclUniqueId (m = 0 or kNcclUniqueIdBytes); sent
//           while P's communicator of that generation is still initializing,
//           so whichever HELLO of the generation reaches D first lets D join.
// Threads: pure functions.
#ifndef TANDEM_KVTRANSFER_NCCL_TRANSPORT_SETUP_H_
#define TANDEM_KVTRANSFER_NCCL_TRANSPORT_SETUP_H_

#include <cstdint>
#include <string>
#include <string_view>

#include "absl/status/statusor.h"

namespace tandem::kvtransfer::nccl {

// Ends the message of every error caused by a failed, replaced or unknown
// communicator (D's REJECT at OpenTransfer, D's failed Receives, the
// watchdog's aborts). D's message reaches P as the transfer's control
// status (KvDataSender::Poll); P then drops that communicator and the next
// OpenTransfer to the pair makes a new generation, so P never keeps using
// a communicator D has given up on.
inline constexpr char kCommunicatorLost[] = "[nccl communicator lost]";
// `status` with kCommunicatorLost at the end of its message (once).
[[nodiscard]] absl::Status CommunicatorLost(const absl::Status& status);
// Whether `status`'s message carries kCommunicatorLost.
bool IsCommunicatorLost(const absl::Status& status);

struct NcclSetup {
  uint64_t generation = 0;
  std::string p_instance;  // P's instance id, at most 256 bytes
  std::string unique_id;   // empty or kNcclUniqueIdBytes bytes
};

std::string EncodeNcclSetup(const NcclSetup& setup);
// Errors: FAILED_PRECONDITION "malformed nccl transport_setup: <what>"
// (wrong magic, truncated, generation 0, empty or oversized instance id,
// a unique id that is neither empty nor 128 bytes, trailing bytes).
[[nodiscard]] absl::StatusOr<NcclSetup> DecodeNcclSetup(std::string_view bytes);

}  // namespace tandem::kvtransfer::nccl

#endif  // TANDEM_KVTRANSFER_NCCL_TRANSPORT_SETUP_H_
