// HTTP clients of the integration tests: whole requests through
// cpp-httplib, and a server-sent-events reader on a plain socket that reads
// one event at a time and can hang up mid-stream (a client going away).
//
// Owns: one connection per object. Threads: one object per thread.
#ifndef TANDEM_TESTS_INTEGRATION_HTTP_CLIENT_H_
#define TANDEM_TESTS_INTEGRATION_HTTP_CLIENT_H_

#include <map>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/time/time.h"

namespace tandem::testing {

struct HttpResult {
  int status = 0;                              // 0: no response (error says why)
  std::map<std::string, std::string> headers;  // names lowercased
  std::string body;
  std::string error;
};

// One request to "host:port" with a 60 s timeout. `headers`: extra
// request headers; POST bodies are sent as application/json.
HttpResult HttpCall(const std::string& address, const std::string& method,
                    const std::string& path, const std::string& body = "",
                    const std::vector<std::pair<std::string, std::string>>& headers = {});

// What RawHttp saw.
struct RawHttpResult {
  int status = 0;                              // 0: no status line came
  std::map<std::string, std::string> headers;  // names lowercased
  std::string body;                            // every byte after the headers
  bool closed = false;  // the server closed the connection before the timeout
  absl::Duration took;  // from the first byte sent to the close (or the timeout)
  std::string error;    // connect or send failures
};

// Sends `request` as is (bytes a well-behaved client never sends: a head
// that never ends, a body that never comes) on a new connection, then
// reads until the server closes it or `timeout` passes.
RawHttpResult RawHttp(const std::string& address, const std::string& request,
                      absl::Duration timeout);

// A POST whose response is read incrementally (chunked or not).
class SseStream {
 public:
  // Connects and sends the request (Connection: close); reads the status
  // line and headers. Errors: UNAVAILABLE (connect/IO), DEADLINE_EXCEEDED.
  static absl::StatusOr<SseStream> Open(
      const std::string& address, const std::string& path, const std::string& body,
      const std::vector<std::pair<std::string, std::string>>& headers = {},
      absl::Duration timeout = absl::Seconds(60));
  SseStream(SseStream&& other) noexcept;
  SseStream& operator=(SseStream&&) = delete;
  ~SseStream();

  int status() const { return status_; }
  const std::map<std::string, std::string>& headers() const { return headers_; }

  // The next event: the text of one "data: ..." event (without "data: "),
  // or a comment line as ":<text>". NOT_FOUND at the end of the body
  // (then rest() holds any bytes that were not an event, e.g. an error
  // body of a non-200 answer); DEADLINE_EXCEEDED past the timeout.
  absl::StatusOr<std::string> Next();
  // Every remaining "data:" event (comments dropped) until the end.
  absl::StatusOr<std::vector<std::string>> ReadAll();
  const std::string& rest() const { return body_; }

  // Hangs up now (no more reads).
  void Close();

 private:
  SseStream() = default;
  // Reads more bytes into raw_ (false at EOF or error); absl status on error.
  absl::StatusOr<bool> Fill();
  // Moves whole chunks (or all bytes, unchunked) from raw_ to body_.
  void Dechunk();

  int fd_ = -1;
  absl::Time deadline_;
  int status_ = 0;
  std::map<std::string, std::string> headers_;
  bool chunked_ = false;
  bool eof_ = false;
  bool body_done_ = false;
  std::string raw_;   // bytes as received, after the headers
  std::string body_;  // dechunked bytes not yet returned as events
};

}  // namespace tandem::testing

#endif  // TANDEM_TESTS_INTEGRATION_HTTP_CLIENT_H_
