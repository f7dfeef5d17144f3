#include "common/server/strict_parse.h"

#include <google/protobuf/descriptor.h>
#include <google/protobuf/io/coded_stream.h>
#include <google/protobuf/wire_format_lite.h>

#include <climits>
#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "absl/functional/function_ref.h"
#include "absl/strings/escaping.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "engine/tokenizer/utf8.h"

namespace tandem::rpc {
namespace {

using google::protobuf::Descriptor;
using google::protobuf::FieldDescriptor;
using google::protobuf::internal::WireFormatLite;
using google::protobuf::io::CodedInputStream;

// protobuf's default recursion limit (io::CodedInputStream).
constexpr int kMaxDepth = 100;

enum class Outcome { kOk, kBadText, kMalformed };

// The first string field that is not UTF-8.
struct BadText {
  std::string path;
  tokenizer::Utf8Error error;
};

// One field occurrence read from the wire. Groups are skipped, not visited.
struct WireField {
  int number = 0;
  WireFormatLite::WireType wire_type = WireFormatLite::WIRETYPE_VARINT;
  uint64_t scalar = 0;        // VARINT, FIXED32, FIXED64
  absl::string_view payload;  // LENGTH_DELIMITED
};

// Calls `visit` on every field of the serialized message `bytes`, in wire
// order, until it returns something other than kOk. kMalformed when the
// bytes are not a sequence of well-formed fields.
Outcome ForEachField(absl::string_view bytes, absl::FunctionRef<Outcome(const WireField&)> visit) {
  if (bytes.size() > static_cast<size_t>(INT_MAX)) return Outcome::kMalformed;
  const int size = static_cast<int>(bytes.size());
  CodedInputStream in(reinterpret_cast<const uint8_t*>(bytes.data()), size);
  in.PushLimit(size);
  for (;;) {
    const uint32_t tag = in.ReadTag();
    if (tag == 0) return in.BytesUntilLimit() == 0 ? Outcome::kOk : Outcome::kMalformed;
    WireField field;
    field.number = WireFormatLite::GetTagFieldNumber(tag);
    field.wire_type = WireFormatLite::GetTagWireType(tag);
    if (field.number == 0) return Outcome::kMalformed;
    bool ok = true;
    switch (field.wire_type) {
      case WireFormatLite::WIRETYPE_VARINT:
        ok = in.ReadVarint64(&field.scalar);
        break;
      case WireFormatLite::WIRETYPE_FIXED32: {
        uint32_t v = 0;
        ok = in.ReadLittleEndian32(&v);
        field.scalar = v;
        break;
      }
      case WireFormatLite::WIRETYPE_FIXED64:
        ok = in.ReadLittleEndian64(&field.scalar);
        break;
      case WireFormatLite::WIRETYPE_LENGTH_DELIMITED: {
        int length = 0;
        ok = in.ReadVarintSizeAsInt(&length) && length <= in.BytesUntilLimit();
        if (ok) {
          field.payload =
              bytes.substr(static_cast<size_t>(in.CurrentPosition()), static_cast<size_t>(length));
          ok = in.Skip(length);
        }
        break;
      }
      case WireFormatLite::WIRETYPE_START_GROUP:
        if (!WireFormatLite::SkipField(&in, tag)) return Outcome::kMalformed;
        continue;
      default:  // END_GROUP outside a group, wire types 6 and 7
        return Outcome::kMalformed;
    }
    if (!ok) return Outcome::kMalformed;
    if (Outcome o = visit(field); o != Outcome::kOk) return o;
  }
}

Outcome CheckText(absl::string_view text, std::string path, BadText* bad) {
  std::optional<tokenizer::Utf8Error> error = tokenizer::FindInvalidUtf8(text);
  if (!error.has_value()) return Outcome::kOk;
  bad->path = std::move(path);
  bad->error = *error;
  return Outcome::kBadText;
}

std::string Join(const std::string& path, absl::string_view name) {
  return path.empty() ? std::string(name) : absl::StrCat(path, ".", name);
}

bool IsLengthDelimitedWithText(const FieldDescriptor& field) {
  return field.type() == FieldDescriptor::TYPE_STRING ||
         field.type() == FieldDescriptor::TYPE_MESSAGE;
}

Outcome CheckMessage(absl::string_view bytes, const Descriptor& type, const std::string& path,
                     int depth, BadText* bad);

// The wire type a map key of `key`'s type is written with.
WireFormatLite::WireType KeyWireType(const FieldDescriptor& key) {
  return WireFormatLite::WireTypeForFieldType(static_cast<WireFormatLite::FieldType>(key.type()));
}

// A map key as path text (see ParseStrict); `field` is the key as read.
std::string KeyText(const FieldDescriptor& key, const WireField& field) {
  const uint64_t v = field.scalar;
  switch (key.type()) {
    case FieldDescriptor::TYPE_STRING:
      return absl::StrCat("\"", absl::CEscape(field.payload), "\"");
    case FieldDescriptor::TYPE_BOOL:
      return v != 0 ? "true" : "false";
    case FieldDescriptor::TYPE_INT32:
    case FieldDescriptor::TYPE_SFIXED32:
      return absl::StrCat(static_cast<int32_t>(static_cast<uint32_t>(v)));
    case FieldDescriptor::TYPE_SINT32:
      return absl::StrCat(WireFormatLite::ZigZagDecode32(static_cast<uint32_t>(v)));
    case FieldDescriptor::TYPE_INT64:
    case FieldDescriptor::TYPE_SFIXED64:
      return absl::StrCat(static_cast<int64_t>(v));
    case FieldDescriptor::TYPE_SINT64:
      return absl::StrCat(WireFormatLite::ZigZagDecode64(v));
    case FieldDescriptor::TYPE_UINT32:
    case FieldDescriptor::TYPE_FIXED32:
      return absl::StrCat(static_cast<uint32_t>(v));
    default:  // UINT64, FIXED64
      return absl::StrCat(v);
  }
}

// One entry of map field `map` (whose path is `path`): its key first (the
// last one on the wire wins, as when parsing), then every value.
Outcome CheckMapEntry(absl::string_view bytes, const FieldDescriptor& map, const std::string& path,
                      int depth, BadText* bad) {
  const Descriptor& entry = *map.message_type();
  const FieldDescriptor& key = *entry.map_key();
  const FieldDescriptor& value = *entry.map_value();
  WireField key_field;  // default: 0, false or ""
  Outcome o = ForEachField(bytes, [&](const WireField& f) {
    if (f.number != key.number() || f.wire_type != KeyWireType(key)) return Outcome::kOk;
    key_field = f;
    if (key.type() != FieldDescriptor::TYPE_STRING) return Outcome::kOk;
    return CheckText(f.payload, Join(path, "key"), bad);
  });
  if (o != Outcome::kOk || !IsLengthDelimitedWithText(value)) return o;
  const std::string value_path = absl::StrCat(path, "[", KeyText(key, key_field), "]");
  return ForEachField(bytes, [&](const WireField& f) {
    if (f.number != value.number() || f.wire_type != WireFormatLite::WIRETYPE_LENGTH_DELIMITED) {
      return Outcome::kOk;
    }
    if (value.type() == FieldDescriptor::TYPE_STRING) return CheckText(f.payload, value_path, bad);
    return CheckMessage(f.payload, *value.message_type(), value_path, depth + 1, bad);
  });
}

// Checks every string field of the serialized `type` message `bytes` whose
// path is `path` ("" at the top).
Outcome CheckMessage(absl::string_view bytes, const Descriptor& type, const std::string& path,
                     int depth, BadText* bad) {
  if (depth > kMaxDepth) return Outcome::kMalformed;
  std::vector<int> seen(static_cast<size_t>(type.field_count()), 0);  // occurrences by index
  return ForEachField(bytes, [&](const WireField& f) {
    const FieldDescriptor* field = type.FindFieldByNumber(f.number);
    // Anything else is a scalar, bytes, a packed array or, for a wire type
    // that does not match, an unknown field to protobuf.
    if (field == nullptr || f.wire_type != WireFormatLite::WIRETYPE_LENGTH_DELIMITED ||
        !IsLengthDelimitedWithText(*field)) {
      return Outcome::kOk;
    }
    if (field->is_map())
      return CheckMapEntry(f.payload, *field, Join(path, field->name()), depth + 1, bad);
    std::string field_path = Join(path, field->name());
    if (field->is_repeated()) {
      absl::StrAppend(&field_path, "[", seen[static_cast<size_t>(field->index())]++, "]");
    }
    if (field->type() == FieldDescriptor::TYPE_STRING) {
      return CheckText(f.payload, std::move(field_path), bad);
    }
    return CheckMessage(f.payload, *field->message_type(), field_path, depth + 1, bad);
  });
}

[[nodiscard]] absl::Status NotAMessage(const Descriptor& type) {
  return absl::InvalidArgumentError(
      absl::StrCat("request: not a valid ", type.full_name(), " message"));
}

}  // namespace

absl::Status ParseStrict(absl::string_view wire, google::protobuf::Message* out) {
  const Descriptor& type = *out->GetDescriptor();
  BadText bad;
  switch (CheckMessage(wire, type, "", 0, &bad)) {
    case Outcome::kOk:
      break;
    case Outcome::kBadText:
      return absl::InvalidArgumentError(
          absl::StrFormat("%s: not valid UTF-8 (byte 0x%02x at offset %d)", bad.path,
                          bad.error.byte, bad.error.offset));
    case Outcome::kMalformed:
      return NotAMessage(type);
  }
  // CheckMessage refused sizes over INT_MAX.
  if (!out->ParseFromArray(wire.data(), static_cast<int>(wire.size()))) return NotAMessage(type);
  return absl::OkStatus();
}

absl::Status ParseStrict(const grpc::ByteBuffer& buffer, google::protobuf::Message* out) {
  // An invalid buffer is no message at all (an empty message is a valid,
  // empty buffer); typed methods refuse that too.
  grpc::Slice slice;
  if (!buffer.Valid() || !buffer.DumpToSingleSlice(&slice).ok()) {
    return NotAMessage(*out->GetDescriptor());
  }
  return ParseStrict(absl::string_view(reinterpret_cast<const char*>(slice.begin()), slice.size()),
                     out);
}

}  // namespace tandem::rpc
