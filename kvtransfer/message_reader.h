// Incremental reader of framed KV messages (u32 type | u32 length |
// payload; wire.h) from a non-blocking socket: each call takes what the
// socket has right now and returns once a whole message is buffered, the
// socket would block, or the call's byte budget is spent. KvReceiver's
// poll loop keeps one per connection, so no thread ever waits on a
// half-sent message.
//
// Owns: the bytes of the message being read. Does not touch: message
// semantics (the caller decodes the payload), deadlines (the caller's).
// Threads: not thread-safe; one reader per socket, used by one thread.
#ifndef TANDEM_KVTRANSFER_MESSAGE_READER_H_
#define TANDEM_KVTRANSFER_MESSAGE_READER_H_

#include <cstddef>
#include <cstdint>
#include <string>

#include "absl/status/status.h"
#include "kvtransfer/wire.h"

namespace tandem::kvtransfer {

class MessageReader {
 public:
  // What one ReadSome call did.
  struct Progress {
    size_t bytes = 0;       // bytes taken from the socket by this call
    bool complete = false;  // a whole message is buffered (type(), payload())
  };

  // Reads from non-blocking `fd` until a message is complete, recv() would
  // block, or `budget` bytes (> 0) were read. A length prefix above
  // `max_payload` is DATA_LOSS ("KV message FRAME declares N payload bytes,
  // more than the M allowed here", the text of tcp::ReadMessage) before
  // anything is allocated for it. Errors: UNAVAILABLE when the peer closed
  // ("KV peer closed the connection after k of n bytes" of the message in
  // progress, header included) or recv() failed; DATA_LOSS as above. Once
  // a message is complete, further calls read nothing until Next().
  [[nodiscard]] absl::Status ReadSome(int fd, uint64_t max_payload, size_t budget,
                                      Progress* progress);

  // The buffered message; valid once ReadSome reported `complete`.
  uint32_t type() const { return type_; }
  const std::string& payload() const { return payload_; }
  // Drops the buffered message (the payload's capacity is kept) and starts
  // on the next one.
  void Next();
  // True when part of a message has arrived but not all of it.
  bool mid_message() const { return header_got_ > 0 && !complete_; }

 private:
  char header_[wire::kHeaderBytes] = {};
  size_t header_got_ = 0;
  uint32_t type_ = 0;
  uint32_t length_ = 0;
  size_t payload_got_ = 0;
  bool complete_ = false;
  std::string payload_;
};

}  // namespace tandem::kvtransfer

#endif  // TANDEM_KVTRANSFER_MESSAGE_READER_H_
