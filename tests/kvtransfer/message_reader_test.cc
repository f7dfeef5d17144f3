// MessageReader over a socketpair: messages arriving a byte at a time or
// back to back, the byte budget, a huge length prefix and a peer closing
// mid-message.
#include "kvtransfer/message_reader.h"

#include <sys/socket.h>
#include <unistd.h>

#include <string>

#include "gtest/gtest.h"
#include "kvtransfer/tcp.h"
#include "kvtransfer/wire.h"

namespace tandem::kvtransfer {
namespace {

class MessageReaderTest : public ::testing::Test {
 protected:
  void SetUp() override {
    int sv[2];
    ASSERT_EQ(::socketpair(AF_UNIX, SOCK_STREAM | SOCK_NONBLOCK, 0, sv), 0);
    in_ = tcp::ScopedFd(sv[0]);
    out_ = tcp::ScopedFd(sv[1]);
  }
  void Write(const std::string& bytes) {
    ASSERT_EQ(::write(out_.get(), bytes.data(), bytes.size()),
              static_cast<ssize_t>(bytes.size()));
  }
  // A message of `type` with `payload` (prefix included).
  static std::string Message(wire::MessageType type, const std::string& payload) {
    std::string m(wire::kHeaderBytes, '\0');
    wire::PutHeader(type, static_cast<uint32_t>(payload.size()), m.data());
    return m + payload;
  }

  tcp::ScopedFd in_, out_;
  MessageReader reader_;
};

TEST_F(MessageReaderTest, ByteAtATimeCompletesExactlyAtTheLastByte) {
  const std::string msg = Message(wire::MessageType::kFrame, "0123456789");
  for (size_t i = 0; i < msg.size(); ++i) {
    Write(msg.substr(i, 1));
    MessageReader::Progress p;
    ASSERT_TRUE(reader_.ReadSome(in_.get(), 64, 1 << 20, &p).ok());
    EXPECT_EQ(p.bytes, 1u) << "at byte " << i;
    EXPECT_EQ(p.complete, i + 1 == msg.size()) << "at byte " << i;
    EXPECT_EQ(reader_.mid_message(), i + 1 < msg.size()) << "at byte " << i;
  }
  EXPECT_EQ(reader_.type(), static_cast<uint32_t>(wire::MessageType::kFrame));
  EXPECT_EQ(reader_.payload(), "0123456789");
  // Nothing more to read: not complete again until the next message.
  reader_.Next();
  MessageReader::Progress p;
  ASSERT_TRUE(reader_.ReadSome(in_.get(), 64, 1 << 20, &p).ok());
  EXPECT_EQ(p.bytes, 0u);
  EXPECT_FALSE(p.complete);
  EXPECT_FALSE(reader_.mid_message());
}

TEST_F(MessageReaderTest, BackToBackMessagesComeOneAtATime) {
  Write(Message(wire::MessageType::kAccept, "") +
        Message(wire::MessageType::kFinal, "abc"));
  MessageReader::Progress p;
  ASSERT_TRUE(reader_.ReadSome(in_.get(), 64, 1 << 20, &p).ok());
  EXPECT_TRUE(p.complete);
  EXPECT_EQ(p.bytes, 8u);  // the empty ACCEPT only
  EXPECT_EQ(reader_.type(), static_cast<uint32_t>(wire::MessageType::kAccept));
  EXPECT_EQ(reader_.payload(), "");
  // Complete stays complete (and reads nothing) until Next().
  ASSERT_TRUE(reader_.ReadSome(in_.get(), 64, 1 << 20, &p).ok());
  EXPECT_TRUE(p.complete);
  EXPECT_EQ(p.bytes, 0u);
  reader_.Next();
  ASSERT_TRUE(reader_.ReadSome(in_.get(), 64, 1 << 20, &p).ok());
  EXPECT_TRUE(p.complete);
  EXPECT_EQ(p.bytes, 11u);
  EXPECT_EQ(reader_.type(), static_cast<uint32_t>(wire::MessageType::kFinal));
  EXPECT_EQ(reader_.payload(), "abc");
}

TEST_F(MessageReaderTest, BudgetBoundsOneCall) {
  Write(Message(wire::MessageType::kFrame, std::string(100, 'x')));
  MessageReader::Progress p;
  ASSERT_TRUE(reader_.ReadSome(in_.get(), 1000, 30, &p).ok());
  EXPECT_EQ(p.bytes, 30u);
  EXPECT_FALSE(p.complete);
  ASSERT_TRUE(reader_.ReadSome(in_.get(), 1000, 30, &p).ok());
  EXPECT_EQ(p.bytes, 30u);
  ASSERT_TRUE(reader_.ReadSome(in_.get(), 1000, 1000, &p).ok());
  EXPECT_EQ(p.bytes, 48u);  // 108 - 60
  EXPECT_TRUE(p.complete);
  EXPECT_EQ(reader_.payload(), std::string(100, 'x'));
}

TEST_F(MessageReaderTest, LengthAboveLimitIsDataLossBeforeThePayload) {
  std::string header(wire::kHeaderBytes, '\0');
  wire::PutHeader(wire::MessageType::kFrame, 65, header.data());
  Write(header);
  MessageReader::Progress p;
  absl::Status s = reader_.ReadSome(in_.get(), 64, 1 << 20, &p);
  EXPECT_EQ(s, absl::DataLossError("KV message FRAME declares 65 payload "
                                   "bytes, more than the 64 allowed here"));
  EXPECT_EQ(p.bytes, 8u);
}

TEST_F(MessageReaderTest, PeerClosingInTheHeaderIsUnavailableCountingBytes) {
  Write(Message(wire::MessageType::kHello, "abcd").substr(0, 5));
  out_.Reset();
  MessageReader::Progress p;
  EXPECT_EQ(reader_.ReadSome(in_.get(), 64, 1 << 20, &p),
            absl::UnavailableError(
                "KV peer closed the connection after 5 of 8 bytes"));
}

TEST_F(MessageReaderTest, PeerClosingInThePayloadIsUnavailableCountingBytes) {
  Write(Message(wire::MessageType::kHello, "abcd").substr(0, 10));
  out_.Reset();
  MessageReader::Progress p;
  EXPECT_EQ(reader_.ReadSome(in_.get(), 64, 1 << 20, &p),
            absl::UnavailableError(
                "KV peer closed the connection after 10 of 12 bytes"));
}

}  // namespace
}  // namespace tandem::kvtransfer
