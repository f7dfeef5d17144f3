#include "kvtransfer/nccl/nccl_data_plane.h"

#include <cstdlib>
#include <utility>

#include "absl/random/random.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "kvtransfer/nccl/nccl_receiver.h"
#include "kvtransfer/nccl/nccl_sender.h"
#include "kvtransfer/nccl/nccl_thread.h"

namespace tandem::kvtransfer::nccl {
namespace {

[[nodiscard]] absl::Status ValidateOptions(const NcclDataPlaneOptions& options) {
  if (options.device < 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("nccl data plane: 'device' ", options.device, " must be >= 0"));
  }
  if (options.transfer_timeout_ms <= 0) {
    return absl::InvalidArgumentError(absl::StrCat("nccl data plane: 'transfer_timeout_ms' ",
                                                   options.transfer_timeout_ms, " must be > 0"));
  }
  if (options.init_timeout_ms <= 0) {
    return absl::InvalidArgumentError(absl::StrCat("nccl data plane: 'init_timeout_ms' ",
                                                   options.init_timeout_ms, " must be > 0"));
  }
  return absl::OkStatus();
}

// P's instance id in the transport_setup: 32 random hex digits per plane
// (the same form as transport.h's NewInstanceId), so D tells a restarted
// P from the old one.
std::string PlaneInstanceId() {
  absl::BitGen gen;
  return absl::StrFormat("%016x%016x", absl::Uniform<uint64_t>(gen), absl::Uniform<uint64_t>(gen));
}

std::string EnvOrUnset(const char* name) {
  const char* value = std::getenv(name);
  return value == nullptr ? "(unset)" : value;
}

}  // namespace

absl::StatusOr<std::string> ApplyNcclEnvironment(const NcclDataPlaneOptions& options) {
  if (absl::Status valid = ValidateOptions(options); !valid.ok()) return valid;
  std::string note;
  if (!options.socket_ifname.empty()) {
    if (std::getenv("NCCL_SOCKET_IFNAME") == nullptr) {
      if (setenv("NCCL_SOCKET_IFNAME", options.socket_ifname.c_str(), 1) != 0) {
        return absl::InternalError("setenv NCCL_SOCKET_IFNAME failed");
      }
    } else if (EnvOrUnset("NCCL_SOCKET_IFNAME") != options.socket_ifname) {
      note = absl::StrCat(" (the environment's NCCL_SOCKET_IFNAME wins over '",
                          options.socket_ifname, "')");
    }
  }
  return absl::StrCat("kv nccl: NCCL_SOCKET_IFNAME=", EnvOrUnset("NCCL_SOCKET_IFNAME"), note,
                      " NCCL_HOSTID=", EnvOrUnset("NCCL_HOSTID"),
                      " NCCL_NET=", EnvOrUnset("NCCL_NET"),
                      " NCCL_IB_DISABLE=", EnvOrUnset("NCCL_IB_DISABLE"));
}

NcclDataPlane::NcclDataPlane() = default;

NcclDataPlane::~NcclDataPlane() {
  // Stop the NCCL thread first; then nothing else calls NCCL or the device.
  thread_.reset();
  sender_->Shutdown();
  receiver_->Shutdown();
}

KvDataSender* NcclDataPlane::sender() { return sender_.get(); }
KvDataReceiver* NcclDataPlane::receiver() { return receiver_.get(); }

absl::StatusOr<std::unique_ptr<NcclDataPlane>> NcclDataPlane::CreateForTesting(
    const NcclDataPlaneOptions& options, std::shared_ptr<NcclCommFactory> factory,
    std::shared_ptr<DeviceOps> device) {
  if (absl::Status valid = ValidateOptions(options); !valid.ok()) return valid;
  if (factory == nullptr || device == nullptr) {
    return absl::InvalidArgumentError("nccl data plane: 'factory' and 'device' must be set");
  }
  std::unique_ptr<NcclDataPlane> plane(new NcclDataPlane());
  plane->sender_ = std::make_unique<NcclSender>(options, factory, device, PlaneInstanceId());
  plane->receiver_ = std::make_unique<NcclReceiver>(options, factory, device);
  NcclSender* sender = plane->sender_.get();
  NcclReceiver* receiver = plane->receiver_.get();
  plane->thread_ = std::make_unique<NcclThread>(
      [device] { return device->BindThread(); },
      std::vector<NcclThread::Tick>{[sender] { return sender->Tick(); },
                                    [receiver] { return receiver->Tick(); }},
      options.log);
  sender->set_thread(plane->thread_.get());
  receiver->set_thread(plane->thread_.get());
  return plane;
}

}  // namespace tandem::kvtransfer::nccl
