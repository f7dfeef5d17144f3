// Exit statuses of the worker processes (tandem-prefill-worker,
// tandem-decode-worker) that mean something to whoever supervises them
// (Kubernetes, `tandem up`). Header only, so tools can name them without
// linking the servers.
#ifndef TANDEM_COMMON_SERVER_EXIT_CODES_H_
#define TANDEM_COMMON_SERVER_EXIT_CODES_H_

namespace tandem {

// 0: stopped by a signal after draining. 1: a start-up error or the
// router refused the registration (one line on stderr).
//
// The worker's backend lost its device (a sticky device error, e.g. an
// illegal memory access: backend::ModelBackend::device_lost()); every
// request failed with UNAVAILABLE, health went NOT_SERVING, and the
// process exited so that it is restarted. 75 is sysexits.h's EX_TEMPFAIL
// ("try again later"); no Tandem binary exits with it otherwise.
inline constexpr int kExitDeviceLost = 75;

}  // namespace tandem

#endif  // TANDEM_COMMON_SERVER_EXIT_CODES_H_
