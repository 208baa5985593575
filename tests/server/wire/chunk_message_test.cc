// Note [Chunks sent without a copy] (server/wire/chunk_message.h): a chunk written by hand is
// byte for byte what protobuf writes, and parses back; bytes that are no Chunk are refused, on
// the wire as INVALID_ARGUMENT naming the chunk.

#include "server/wire/chunk_message.h"

#include <string>
#include <vector>

#include "absl/strings/match.h"
#include "gradserve/v1/gradserve.pb.h"
#include "gtest/gtest.h"
#include "proto/chunk_slices.h"
#include "tests/server/test_util.h"

namespace gradserve::testing {
namespace {

using server::ParseChunk;

TEST(ChunkMessageTest, WrittenAsProtobufWritesIt) {
  const std::string big(size_t{1} << 20, 'x');
  const struct {
    std::string data;
    int64_t total_bytes;
  } cases[] = {{"", 0}, {"abc", 0}, {"abc", 12345}, {"", 7}, {big, int64_t{1} << 40}, {big, 0}};
  for (const auto& c : cases) {
    v1::Chunk expected;
    expected.set_data(c.data);
    expected.set_total_bytes(c.total_bytes);
    // The data in two slices, as a response's are (a tensor's bytes and their neighbours).
    std::vector<grpc::Slice> data;
    if (!c.data.empty()) {
      data.emplace_back(c.data.substr(0, 1));
      data.emplace_back(c.data.substr(1));
    }
    grpc::ByteBuffer written = chunking::ChunkFrame(std::move(data), c.total_bytes);
    EXPECT_EQ(Flatten(written), expected.SerializeAsString())
        << c.data.size() << " bytes, total " << c.total_bytes;
    v1::Chunk parsed;
    parsed.set_data("left over from an earlier chunk");
    ASSERT_TRUE(ParseChunk(&written, &parsed));
    EXPECT_EQ(parsed.data(), c.data);
    EXPECT_EQ(parsed.total_bytes(), c.total_bytes);
  }
}

TEST(ChunkMessageTest, BytesThatAreNoChunkDoNotParse) {
  grpc::Slice garbage(std::string("\xff\xff\xff\xff\x0f garbage"));
  grpc::ByteBuffer bytes(&garbage, 1);
  v1::Chunk chunk;
  EXPECT_FALSE(ParseChunk(&bytes, &chunk));
}

TEST(ChunkMessageTest, AMalformedChunkIsInvalidArgumentNamingIt) {
  TestServer server;
  v1::Chunk good;
  good.set_data("\x0a\x03");  // the start of a GradRequest, never finished
  const grpc::Status status = SendStreamMessages(
      server.client().channel(), {good.SerializeAsString(), "\xff\xff\xff\xff\x0f garbage"});
  EXPECT_EQ(status.error_code(), grpc::StatusCode::INVALID_ARGUMENT) << status.error_message();
  EXPECT_TRUE(absl::StrContains(status.error_message(), "chunk 2 of the stream is malformed"))
      << status.error_message();
  EXPECT_TRUE(CheckSquareWorks(server.client()).ok());
}

// A stream that half-closes before any chunk carries the empty request, which asks for
// nothing and gets an empty response, as the same zero bytes do as a unary call.
TEST(ChunkMessageTest, AStreamWithoutChunksIsTheEmptyRequest) {
  TestServer server;
  const grpc::Status streamed = SendStreamMessages(server.client().channel(), {});
  EXPECT_TRUE(streamed.ok()) << streamed.error_message();
  EXPECT_TRUE(SendUnaryBytes(server.client().channel(), "").ok());
  EXPECT_TRUE(CheckSquareWorks(server.client()).ok());
}

// gRPC still bounds each raw chunk by --max_message_bytes before the server sees it.
TEST(ChunkMessageTest, AChunkOverTheMessageLimitIsRefused) {
  server::ServerOptions options = TestOptions();
  options.max_message_bytes = 64 << 10;
  options.chunk_bytes = 32 << 10;
  TestServer server(options);
  v1::Chunk big;
  big.set_data(std::string(100 << 10, 'x'));
  const grpc::Status status =
      SendStreamMessages(server.client().channel(), {big.SerializeAsString()});
  EXPECT_EQ(status.error_code(), grpc::StatusCode::RESOURCE_EXHAUSTED) << status.error_message();
  EXPECT_TRUE(CheckSquareWorks(server.client()).ok());
}

}  // namespace
}  // namespace gradserve::testing
