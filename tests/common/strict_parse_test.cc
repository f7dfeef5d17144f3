// rpc::ParseStrict on hand-encoded wire bytes (tests/test_util.h): the path
// it names for every shape of field, what it leaves unchecked, malformed
// bytes, the grpc::ByteBuffer overload, and the tandem.v1 requests.
#include "common/server/strict_parse.h"

#include <grpcpp/support/byte_buffer.h>
#include <grpcpp/support/slice.h>

#include <cstdint>
#include <cstring>
#include <string>
#include <vector>

#include "gtest/gtest.h"
#include "tandem/v1/generation.pb.h"
#include "tandem/v1/worker.pb.h"
#include "tests/common/strict_parse_test.pb.h"
#include "tests/test_util.h"

namespace tandem::rpc {
namespace {

using ::tandem::testing::WireLen;
using ::tandem::testing::WireTag;
using ::tandem::testing::WireUint;
using ::tandem::testing::WireVarint;

constexpr char kNotATree[] = "request: not a valid tandem.test.Tree message";

// The status ParseStrict gives `wire` as a Tree.
absl::Status ParseTree(const std::string& wire) {
  test::Tree tree;
  return ParseStrict(wire, &tree);
}

std::string Fixed32(float value) {
  std::string out(4, '\0');
  std::memcpy(out.data(), &value, 4);  // little-endian host
  return out;
}

TEST(ParseStrictTest, ValidMessageParses) {
  const std::string wire = WireLen(1, "h\xC3\xA9llo") + WireLen(2, "a") +
                           WireLen(2, "\xE2\x82\xAC") +
                           WireLen(3, WireLen(1, "x") + WireLen(2, "\xFF") + WireUint(3, 7)) +
                           WireLen(5, WireLen(1, "k") + WireLen(2, WireLen(1, "v"))) +
                           WireLen(6, WireUint(1, 5) + WireLen(2, "five")) +
                           WireLen(12, WireVarint(1) + WireVarint(300)) + WireLen(99, "\xFF");
  test::Tree tree;
  ASSERT_TRUE(ParseStrict(wire, &tree).ok()) << ParseStrict(wire, &tree);
  EXPECT_EQ(tree.name(), "h\xC3\xA9llo");
  ASSERT_EQ(tree.tags_size(), 2);
  EXPECT_EQ(tree.tags(1), "\xE2\x82\xAC");
  EXPECT_EQ(tree.leaf().text(), "x");
  EXPECT_EQ(tree.leaf().raw(), "\xFF");
  EXPECT_EQ(tree.leaf().number(), 7);
  ASSERT_EQ(tree.by_name().count("k"), 1u);
  EXPECT_EQ(tree.by_name().at("k").text(), "v");
  ASSERT_EQ(tree.labels().count(5), 1u);
  EXPECT_EQ(tree.labels().at(5), "five");
  ASSERT_EQ(tree.numbers_size(), 2);
  EXPECT_EQ(tree.numbers(1), 300);
}

TEST(ParseStrictTest, EmptyBytesAreTheDefaultMessage) {
  test::Tree tree;
  tree.set_name("stale");
  ASSERT_TRUE(ParseStrict("", &tree).ok());
  EXPECT_EQ(tree.name(), "");  // cleared first
}

struct PathCase {
  std::string wire;
  std::string message;
};

TEST(ParseStrictTest, NamesTheFieldPath) {
  std::string deep = WireLen(1, "ok\xFF");  // 60 levels of child, then name
  std::string deep_path = "name";
  for (int i = 0; i < 60; ++i) {
    deep = WireLen(9, deep);
    deep_path = "child." + deep_path;
  }
  const std::vector<PathCase> cases = {
      {WireLen(1, "\xFF"), "name: not valid UTF-8 (byte 0xff at offset 0)"},
      // Repeated: the index counts occurrences of that field only.
      {WireLen(2, "ok") + WireLen(1, "fine") + WireLen(2, "ab\xC0\xAF"),
       "tags[1]: not valid UTF-8 (byte 0xc0 at offset 2)"},
      {WireLen(3, WireLen(1, "\xED\xA0\x80")),
       "leaf.text: not valid UTF-8 (byte 0xed at offset 0)"},
      {WireLen(4, WireLen(1, "a")) + WireLen(4, WireUint(3, 1)) +
           WireLen(4, WireLen(1, "xyz\xF4\x90\x80\x80")),
       "leaves[2].text: not valid UTF-8 (byte 0xf4 at offset 3)"},
      {WireLen(9, WireLen(9, WireLen(4, WireLen(1, "\x80")))),
       "child.child.leaves[0].text: not valid UTF-8 (byte 0x80 at offset 0)"},
      {deep, deep_path + ": not valid UTF-8 (byte 0xff at offset 2)"},
      // Maps: a value by its key; a key that is not UTF-8 itself.
      {WireLen(5, WireLen(1, "k\"1") + WireLen(2, WireLen(1, "\xFF"))),
       "by_name[\"k\\\"1\"].text: not valid UTF-8 (byte 0xff at offset 0)"},
      {WireLen(5, WireLen(2, WireLen(1, "\xFF")) + WireLen(1, "late")),
       "by_name[\"late\"].text: not valid UTF-8 (byte 0xff at offset 0)"},
      {WireLen(5, WireLen(1, "x\xC3") + WireLen(2, "")),
       "by_name.key: not valid UTF-8 (byte 0xc3 at offset 1)"},
      {WireLen(6, WireUint(1, 5) + WireLen(2, "\xFF")),
       "labels[5]: not valid UTF-8 (byte 0xff at offset 0)"},
      // int32 -3 is sent as a 10-byte varint of its 64-bit two's complement.
      {WireLen(6, WireUint(1, static_cast<uint64_t>(int64_t{-3})) + WireLen(2, "\xFF")),
       "labels[-3]: not valid UTF-8 (byte 0xff at offset 0)"},
      {WireLen(6, WireLen(2, "\xFF")), "labels[0]: not valid UTF-8 (byte 0xff at offset 0)"},
      // sint64 -2 is ZigZag 3.
      {WireLen(7, WireUint(1, 3) + WireLen(2, "\xFF")),
       "signed_labels[-2]: not valid UTF-8 (byte 0xff at offset 0)"},
      {WireLen(8, WireUint(1, 1) + WireLen(2, "\xFF")),
       "flags[true]: not valid UTF-8 (byte 0xff at offset 0)"},
      {WireLen(10, "\xFF"), "alt_text: not valid UTF-8 (byte 0xff at offset 0)"},
      {WireLen(11, WireLen(1, "\xFF")), "alt_leaf.text: not valid UTF-8 (byte 0xff at offset 0)"},
      // The first bad string on the wire is the one named.
      {WireLen(2, "\xFE") + WireLen(1, "\xFF"), "tags[0]: not valid UTF-8 (byte 0xfe at offset 0)"},
  };
  for (const PathCase& c : cases) {
    const absl::Status s = ParseTree(c.wire);
    EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument) << c.message;
    EXPECT_EQ(s.message(), c.message);
  }
}

TEST(ParseStrictTest, LeavesBytesUnknownAndMistypedFieldsUnchecked) {
  test::Tree tree;
  // bytes; an unknown field; name sent as a varint (protobuf keeps it as
  // an unknown field); a group (unknown) holding a bad string.
  const std::string wire = WireLen(3, WireLen(2, "\xFF")) + WireLen(99, "\xFF") + WireUint(1, 3) +
                           WireTag(50, 3) + WireLen(1, "\xFF") + WireTag(50, 4);
  ASSERT_TRUE(ParseStrict(wire, &tree).ok()) << ParseStrict(wire, &tree);
  EXPECT_EQ(tree.leaf().raw(), "\xFF");
  EXPECT_EQ(tree.name(), "");
}

TEST(ParseStrictTest, MalformedBytesAreNotAMessage) {
  std::string too_deep = WireLen(1, "fine");
  for (int i = 0; i < 101; ++i) too_deep = WireLen(9, too_deep);
  const std::vector<std::string> cases = {
      WireTag(1, 2) + WireVarint(5) + "ab",  // length past the end
      WireTag(3, 0) + "\x80",                // varint cut short
      WireTag(1, 2),                         // no length
      std::string("\x00", 1),                // tag 0
      WireTag(0, 2) + WireVarint(0),         // field number 0
      WireTag(1, 4),                         // end group outside a group
      WireTag(1, 7),                         // wire type 7
      WireTag(5, 3) + WireLen(1, "x"),       // group never ended
      // Inside leaf, a string runs past leaf's end (the outer bytes go on).
      WireLen(3, WireTag(1, 2) + WireVarint(4) + "ab") + WireUint(12, 1) + WireUint(12, 2),
      too_deep,
  };
  for (const std::string& wire : cases) {
    const absl::Status s = ParseTree(wire);
    EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument) << ::testing::PrintToString(wire);
    EXPECT_EQ(s.message(), kNotATree) << ::testing::PrintToString(wire);
  }
  // 99 levels are fine (protobuf's limit is 100).
  std::string deep = WireLen(1, "fine");
  for (int i = 0; i < 99; ++i) deep = WireLen(9, deep);
  EXPECT_TRUE(ParseTree(deep).ok()) << ParseTree(deep);
}

grpc::ByteBuffer TwoSlices(const std::string& wire, size_t cut) {
  grpc::Slice slices[2] = {grpc::Slice(wire.substr(0, cut)), grpc::Slice(wire.substr(cut))};
  return grpc::ByteBuffer(slices, 2);
}

TEST(ParseStrictTest, ByteBufferInSeveralSlices) {
  // The cuts fall inside the UTF-8 character and inside the bad string.
  const std::string good = WireLen(1, "\xE2\x82\xAC") + WireLen(2, "b");
  test::Tree tree;
  ASSERT_TRUE(ParseStrict(TwoSlices(good, 3), &tree).ok());
  EXPECT_EQ(tree.name(), "\xE2\x82\xAC");
  EXPECT_EQ(tree.tags(0), "b");
  const std::string bad = WireLen(1, "ok") + WireLen(3, WireLen(1, "abc\xFF"));
  EXPECT_EQ(ParseStrict(TwoSlices(bad, 9), &tree).message(),
            "leaf.text: not valid UTF-8 (byte 0xff at offset 3)");
  // An empty message is an empty buffer; an invalid buffer is no message.
  grpc::Slice empty;
  EXPECT_TRUE(ParseStrict(grpc::ByteBuffer(&empty, 1), &tree).ok());
  EXPECT_EQ(ParseStrict(grpc::ByteBuffer(), &tree).message(), kNotATree);
}

TEST(ParseStrictTest, TandemRequests) {
  const std::string user_hi = WireLen(6, WireLen(1, "user") + WireLen(2, "hi"));
  v1::GenerateRequest generate;
  EXPECT_EQ(
      ParseStrict(user_hi + user_hi + WireLen(6, WireLen(1, "user") + WireLen(2, "a\xED\xA0\x80")),
                  &generate)
          .message(),
      "messages[2].content: not valid UTF-8 (byte 0xed at offset 1)");
  EXPECT_EQ(ParseStrict(WireLen(1, "Once") + WireLen(8, "\xF4\x90\x80\x80"), &generate).message(),
            "stop[0]: not valid UTF-8 (byte 0xf4 at offset 0)");
  EXPECT_EQ(ParseStrict(WireLen(5, "id\xFF"), &generate).message(),
            "client_request_id: not valid UTF-8 (byte 0xff at offset 2)");
  // A valid request with a logit_bias map (int32 -> float: nothing to check).
  const std::string sampling = WireLen(10, WireUint(1, 7) + WireTag(2, 5) + Fixed32(2.5f));
  ASSERT_TRUE(ParseStrict(WireLen(1, "Once") + WireUint(2, 4) + WireLen(3, sampling) +
                              WireLen(8, "The end"),
                          &generate)
                  .ok());
  EXPECT_EQ(generate.prompt(), "Once");
  EXPECT_EQ(generate.max_tokens(), 4u);
  EXPECT_EQ(generate.sampling().logit_bias().at(7), 2.5f);
  EXPECT_EQ(generate.stop(0), "The end");

  v1::TokenizeRequest tokenize;
  EXPECT_EQ(ParseStrict(WireLen(1, "\xC0\xAF"), &tokenize).message(),
            "text: not valid UTF-8 (byte 0xc0 at offset 0)");
  v1::PrefillRequest prefill;
  EXPECT_EQ(
      ParseStrict(WireLen(1, "r1") + WireLen(5, WireLen(1, "127.0.0.1:\xFF")), &prefill).message(),
      "kv_target.endpoint: not valid UTF-8 (byte 0xff at offset 10)");
  EXPECT_EQ(ParseStrict(WireLen(5, WireLen(2, "\xFF")), &prefill).message(),
            "kv_target.request_id: not valid UTF-8 (byte 0xff at offset 0)");
  v1::DecodeGenerateRequest decode;
  EXPECT_EQ(ParseStrict(WireLen(1, "\xFF"), &decode).message(),
            "request_id: not valid UTF-8 (byte 0xff at offset 0)");
  v1::RegisterWorkerRequest reg;
  EXPECT_EQ(ParseStrict(WireLen(1, "w") + WireLen(5, "fp\x80"), &reg).message(),
            "model_fingerprint: not valid UTF-8 (byte 0x80 at offset 2)");
  EXPECT_EQ(ParseStrict(WireTag(1, 2) + WireVarint(3), &reg).message(),
            "request: not a valid tandem.v1.RegisterWorkerRequest message");
}

}  // namespace
}  // namespace tandem::rpc
