#include "kvtransfer/message_reader.h"

#include <errno.h>
#include <sys/socket.h>

#include <algorithm>
#include <cstring>

#include "absl/strings/str_cat.h"

namespace tandem::kvtransfer {

absl::Status MessageReader::ReadSome(int fd, uint64_t max_payload, size_t budget,
                                     Progress* progress) {
  *progress = Progress{};
  while (!complete_ && progress->bytes < budget) {
    const bool in_header = header_got_ < wire::kHeaderBytes;
    char* dst = in_header ? header_ + header_got_ : payload_.data() + payload_got_;
    const size_t want =
        in_header ? wire::kHeaderBytes - header_got_ : size_t{length_} - payload_got_;
    const ssize_t r = ::recv(fd, dst, std::min(want, budget - progress->bytes), 0);
    if (r == 0) {
      const uint64_t total = wire::kHeaderBytes + (in_header ? 0 : length_);
      return absl::UnavailableError(absl::StrCat("KV peer closed the connection after ",
                                                 header_got_ + payload_got_, " of ", total,
                                                 " bytes"));
    }
    if (r < 0) {
      if (errno == EINTR) continue;
      if (errno == EAGAIN || errno == EWOULDBLOCK) break;
      return absl::UnavailableError(
          absl::StrCat("KV peer connection failed while receiving: ", std::strerror(errno)));
    }
    progress->bytes += static_cast<size_t>(r);
    if (!in_header) {
      payload_got_ += static_cast<size_t>(r);
    } else if ((header_got_ += static_cast<size_t>(r)) == wire::kHeaderBytes) {
      wire::GetHeader(header_, &type_, &length_);
      if (length_ > max_payload) {
        return absl::DataLossError(
            absl::StrCat("KV message ", wire::MessageTypeName(type_), " declares ", length_,
                         " payload bytes, more than the ", max_payload, " allowed here"));
      }
      payload_.resize(length_);
    }
    complete_ = header_got_ == wire::kHeaderBytes && payload_got_ == length_;
  }
  progress->complete = complete_;
  return absl::OkStatus();
}

void MessageReader::Next() {
  header_got_ = 0;
  type_ = 0;
  length_ = 0;
  payload_got_ = 0;
  complete_ = false;
  payload_.clear();
}

}  // namespace tandem::kvtransfer
