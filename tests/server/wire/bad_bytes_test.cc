// Bytes no client should send, made by mutating good requests at random: whatever the bytes,
// the server answers with a status a client can act on, never INTERNAL or UNKNOWN (DESIGN.md
// section 5: INTERNAL is a bug, never the client's input), does not crash, and goes on serving
// good requests. Both ways in are tried: the unary call (UnaryMessages' parse) and the stream,
// cut into chunks at random (ChunkedRequest's walk over the chunks). The seeds are the load
// tester's grad_tiny, a 20 KiB payload (big enough for the stream to leave its bytes in the
// chunks), every request of examples/ (checkpoints, grad ops, conv2d, cross_entropy, ...) and
// tests/server/data/every_op.json (every other op, a hook, detach, two backward calls).
// Bounded: a fixed count of calls with a fixed seed, small limits, each call under a deadline
// (GRADSERVE_BAD_BYTES_SEED and GRADSERVE_BAD_BYTES_CALLS set others, for a longer search).
// Under CI's AddressSanitizer build, a mutation that reads out of bounds fails here too. The
// seeds and mutations are the fuzzer's (Note [Mutating requests] in
// tests/fuzz/request_mutator.h), which searches the same ground coverage-guided.

#include <algorithm>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <functional>
#include <map>
#include <random>
#include <string>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "gradserve/v1/gradserve.pb.h"
#include "gtest/gtest.h"
#include "tests/fuzz/request_mutator.h"
#include "tests/server/test_util.h"

namespace gradserve::testing {
namespace {

// The seeds' bytes (Note [Mutating requests] in tests/fuzz/request_mutator.h).
std::vector<std::string> SeedBytes() {
  absl::StatusOr<std::vector<SeedRequest>> seeds =
      SeedRequests(GRADSERVE_EXAMPLES_DIR, GRADSERVE_TEST_DATA_DIR);
  EXPECT_TRUE(seeds.ok()) << seeds.status();
  std::vector<std::string> bytes;
  if (seeds.ok()) {
    for (SeedRequest& seed : *seeds) bytes.push_back(std::move(seed.bytes));
  }
  return bytes;
}

// bytes as the serialized Chunks of a stream, cut at random sizes.
std::vector<std::string> AsChunks(const std::string& bytes, std::mt19937_64& rng) {
  std::vector<std::string> chunks;
  size_t start = 0;
  do {
    const size_t n = std::min<size_t>(1 + rng() % 4096, bytes.size() - start);
    v1::Chunk chunk;
    chunk.set_data(bytes.substr(start, n));
    if (start == 0) chunk.set_total_bytes(static_cast<int64_t>(bytes.size()));
    chunks.push_back(chunk.SerializeAsString());
    start += n;
  } while (start < bytes.size());
  return chunks;
}

// The server both tests send their requests to, and the loop they share.
class BadBytesTest : public ::testing::Test {
 protected:
  BadBytesTest() : server_(Options()) {
    // A longer search: GRADSERVE_BAD_BYTES_SEED and GRADSERVE_BAD_BYTES_CALLS in the environment.
    const char* seed = std::getenv("GRADSERVE_BAD_BYTES_SEED");
    const char* calls = std::getenv("GRADSERVE_BAD_BYTES_CALLS");
    rng_.seed(seed != nullptr ? std::strtoull(seed, nullptr, 10) : 20261124);
    calls_ = calls != nullptr ? std::atoi(calls) : 4000;
  }

  static server::ServerOptions Options() {
    server::ServerOptions options = TestOptions();
    options.limits.max_tensor_elements = 1 << 16;  // a mutated shape cannot ask for much work
    options.limits.max_memory_bytes = 32 << 20;
    options.log_requests =
        server::ServerOptions::LogRequests::kNone;  // thousands of failures by design
    return options;
  }

  // Sends calls_ requests made by make(rng_), every third one streamed in random chunks;
  // expects none to be INTERNAL or UNKNOWN and the server to serve a good request every 200
  // calls and at the end. Returns the calls by status code, also printed.
  std::map<grpc::StatusCode, int> SendAll(const std::function<std::string()>& make) {
    std::map<grpc::StatusCode, int> codes;
    for (int i = 0; i < calls_; ++i) {
      const std::string bytes = make();
      const bool streamed = i % 3 == 2;
      const grpc::Status status =
          streamed ? SendStreamMessages(server_.client().channel(), AsChunks(bytes, rng_))
                   : SendUnaryBytes(server_.client().channel(), bytes);
      ++codes[status.error_code()];
      const grpc::StatusCode code = status.error_code();
      EXPECT_TRUE(code != grpc::StatusCode::INTERNAL && code != grpc::StatusCode::UNKNOWN)
          << (streamed ? "stream" : "unary") << " call " << i << ": " << code << " "
          << status.error_message();
      if (i % 200 == 199) {
        EXPECT_TRUE(CheckSquareWorks(server_.client()).ok()) << "after call " << i;
      }
    }
    EXPECT_TRUE(CheckSquareWorks(server_.client()).ok());
    std::string summary = "status codes (code: calls):";
    for (const auto& [code, n] : codes) absl::StrAppend(&summary, " ", code, ": ", n);
    std::printf("%s\n", summary.c_str());
    return codes;
  }

  TestServer server_;
  std::mt19937_64 rng_;
  int calls_;
};

TEST_F(BadBytesTest, MutatedRequestsGetAClientStatusAndHarmNothing) {
  const std::vector<std::string> seeds = SeedBytes();
  ASSERT_GE(seeds.size(), 5u);
  std::map<grpc::StatusCode, int> codes =
      SendAll([&] { return MutateBytes(seeds[rng_() % seeds.size()], rng_); });
  // Most mutations break the request; some leave it valid.
  EXPECT_GT(codes[grpc::StatusCode::INVALID_ARGUMENT], calls_ / 4);
}

// The same promise for requests that parse, with their fields made wrong: names that point at
// the wrong value or at none, shapes, dtypes and attributes at their edges, tensors' bytes of
// the wrong length, ops and leaves removed or repeated. These reach the checks behind the
// parse (graph::Validate, the ops' argument checks, the limits) rather than the parse itself.
TEST_F(BadBytesTest, MutatedFieldsGetAClientStatusAndHarmNothing) {
  std::vector<v1::GradRequest> seeds;
  std::vector<std::string> words;
  for (const std::string& bytes : SeedBytes()) {
    ASSERT_TRUE(seeds.emplace_back().ParseFromString(bytes));
    CollectWords(seeds.back(), &words);
  }
  std::map<grpc::StatusCode, int> codes = SendAll([&] {
    v1::GradRequest request = seeds[rng_() % seeds.size()];
    for (int e = 1 + static_cast<int>(rng_() % 3); e > 0; --e) MutateField(&request, words, rng_);
    return request.SerializeAsString();
  });
  EXPECT_GT(codes[grpc::StatusCode::INVALID_ARGUMENT], calls_ / 4);
  EXPECT_GT(codes[grpc::StatusCode::OK], calls_ / 20);
}

}  // namespace
}  // namespace gradserve::testing
