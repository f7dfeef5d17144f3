// Strict parsing of request bytes: every proto `string` field must hold
// well-formed UTF-8 (RFC 3629; engine/tokenizer/utf8.h), and a request that
// breaks this is refused with INVALID_ARGUMENT naming the field, instead of
// the protobuf runtime's silent parse failure (which gRPC turns into an
// empty UNIMPLEMENTED / INTERNAL status and a logged error).
//
// The check walks the protobuf wire format (protobuf.dev, "Encoding")
// guided by the message's Descriptor, so the public .proto keeps `string`
// and needs no mirror message with `bytes` fields.
//
// Threads: pure functions.
#ifndef TANDEM_COMMON_SERVER_STRICT_PARSE_H_
#define TANDEM_COMMON_SERVER_STRICT_PARSE_H_

#include <google/protobuf/message.h>
#include <grpcpp/support/byte_buffer.h>

#include "absl/status/status.h"
#include "absl/strings/string_view.h"

namespace tandem::rpc {

// Parses `wire` (a serialized message of out's type) into `out`.
//
// First every length-delimited occurrence of a TYPE_STRING field is checked,
// recursing into message fields, repeated fields and maps; the first one
// that is not well-formed UTF-8 gives INVALID_ARGUMENT
//   "PATH: not valid UTF-8 (byte 0xff at offset N)"
// where N and the byte are those of the first ill-formed subsequence within
// that string (tokenizer::FindInvalidUtf8) and PATH names the field:
//   prompt                     a singular field
//   stop[0]                    element 0 of a repeated field
//   messages[2].content        a field of element 2 of a repeated message
//   kv_target.endpoint         a field of a singular message
//   labels["k"], ids[5]        the value of a map entry, by its key (string
//                              keys C-escaped and quoted, integers decimal,
//                              bools true/false)
//   labels.key                 a map key that is itself not UTF-8
// Indexes count the field's occurrences on the wire, which is the element's
// index after parsing. Unknown fields, `bytes` fields and proto2 groups are
// not checked (protobuf does not check them either).
//
// Then `out` is cleared and parsed from the same bytes. Malformed wire data
// (a truncated field, a length past the end, a bad tag, nesting deeper than
// 100, or anything else protobuf refuses) gives INVALID_ARGUMENT
//   "request: not a valid tandem.v1.GenerateRequest message"
// (the full name of out's type). Nothing is logged.
[[nodiscard]] absl::Status ParseStrict(absl::string_view wire, google::protobuf::Message* out);

// The same for a message received by a raw gRPC method (flattened into one
// slice first when it arrived in several).
[[nodiscard]] absl::Status ParseStrict(const grpc::ByteBuffer& buffer,
                                       google::protobuf::Message* out);

}  // namespace tandem::rpc

#endif  // TANDEM_COMMON_SERVER_STRICT_PARSE_H_
