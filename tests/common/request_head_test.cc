// RequestHead (common/http/request_head.h): where a request head ends, fed
// in any pieces, and the declared body length by RFC 9112 and evhttp 2.1's
// reading of it (only POST, PUT, PATCH carry a body; chunked wins over
// Content-Length; the first Content-Length counts).
#include "common/http/request_head.h"

#include <cstdint>
#include <limits>
#include <string>

#include "gtest/gtest.h"

namespace tandem::http {
namespace {

// Feeds `text` one byte at a time; returns the bytes taken by the head.
size_t FeedBytewise(RequestHead* head, const std::string& text) {
  size_t taken = 0;
  for (char c : text) taken += head->Feed(std::string_view(&c, 1));
  return taken;
}

int64_t Declared(const std::string& head_text) {
  RequestHead head(1 << 16);
  head.Feed(head_text);
  EXPECT_TRUE(head.complete()) << head_text;
  return head.declared_body_bytes();
}

TEST(RequestHeadTest, EndsAtTheFirstEmptyLineWithCrlfOrLf) {
  const std::string head = "POST /v1/x HTTP/1.1\r\nHost: a\r\nContent-Length: 5\r\n\r\n";
  RequestHead h(1 << 16);
  EXPECT_EQ(h.Feed(head + "hello"), head.size());  // the body is not the head's
  EXPECT_TRUE(h.complete());
  EXPECT_EQ(h.Feed("more"), 0u);

  RequestHead split(1 << 16);
  EXPECT_EQ(FeedBytewise(&split, head), head.size());
  EXPECT_TRUE(split.complete());
  EXPECT_EQ(split.declared_body_bytes(), 5);

  RequestHead lf(1 << 16);
  EXPECT_EQ(lf.Feed("GET / HTTP/1.1\nHost: a\n\nGET"), 24u);
  EXPECT_TRUE(lf.complete());

  RequestHead partial(1 << 16);
  partial.Feed("GET / HTTP/1.1\r\nHost: a\r\n");
  EXPECT_FALSE(partial.complete());
  partial.Reset();
  partial.Feed("\r\n");  // an empty first line is no request line (evhttp: 400)
  EXPECT_FALSE(partial.complete());
  // A CR inside a line is data: "X: \r" is not an empty line.
  RequestHead cr(1 << 16);
  cr.Feed("GET / HTTP/1.1\r\n\r\r\n");
  EXPECT_FALSE(cr.complete());
}

TEST(RequestHeadTest, DeclaredBodyFollowsEvhttp) {
  EXPECT_EQ(Declared("POST / HTTP/1.1\r\ncontent-length:   9999999999  \r\n\r\n"), 9999999999);
  EXPECT_EQ(Declared("PUT / HTTP/1.1\r\nContent-Length: 0\r\n\r\n"), 0);
  EXPECT_EQ(Declared("PATCH / HTTP/1.1\r\nContent-Length: +12\r\n\r\n"), 12);  // strtoll's sign
  EXPECT_EQ(Declared("POST / HTTP/1.1\r\nContent-Length: 99999999999999999999999\r\n\r\n"),
            std::numeric_limits<int64_t>::max());
  // The first Content-Length counts.
  EXPECT_EQ(Declared("POST / HTTP/1.1\r\nContent-Length: 7\r\nContent-Length: 9\r\n\r\n"), 7);
  // No body: methods without one, no length, chunked, values evhttp refuses.
  EXPECT_EQ(Declared("GET / HTTP/1.1\r\nContent-Length: 9999999999\r\n\r\n"), -1);
  EXPECT_EQ(Declared("POST / HTTP/1.1\r\nHost: a\r\n\r\n"), -1);
  EXPECT_EQ(Declared("POST / HTTP/1.1\r\nTransfer-Encoding: Chunked\r\nContent-Length: 9999999999\r\n\r\n"),
            -1);
  EXPECT_EQ(Declared("POST / HTTP/1.1\r\nContent-Length: 12abc\r\n\r\n"), -1);
  EXPECT_EQ(Declared("POST / HTTP/1.1\r\nContent-Length: -1\r\n\r\n"), -1);
  EXPECT_EQ(Declared("POST / HTTP/1.1\r\nContent-Length:\r\n\r\n"), -1);
  // A Transfer-Encoding other than chunked leaves Content-Length in force.
  EXPECT_EQ(Declared("POST / HTTP/1.1\r\nTransfer-Encoding: gzip\r\nContent-Length: 3\r\n\r\n"), 3);
  // A continuation line joins the value (evhttp then refuses "3 4").
  EXPECT_EQ(Declared("POST / HTTP/1.1\r\nContent-Length: 3\r\n 4\r\n\r\n"), -1);
}

TEST(RequestHeadTest, AHeadLongerThanTheLimitDeclaresNothing) {
  RequestHead h(32);
  h.Feed("POST / HTTP/1.1\r\nX-Pad: " + std::string(64, 'p') + "\r\nContent-Length: 5\r\n\r\n");
  EXPECT_TRUE(h.complete());
  EXPECT_EQ(h.declared_body_bytes(), -1);
}

}  // namespace
}  // namespace tandem::http
