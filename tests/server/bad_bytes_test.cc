// Bytes no client should send, made by mutating good requests at random: whatever the bytes,
// the server answers with a status a client can act on, never INTERNAL or UNKNOWN (DESIGN.md
// section 5: INTERNAL is a bug, never the client's input), does not crash, and goes on serving
// good requests. Both ways in are tried: the unary call (UnaryMessages' parse) and the stream,
// cut into chunks at random (ChunkedRequest's walk over the chunks). The seeds are the load
// tester's grad_tiny, a 20 KiB payload (big enough for the stream to leave its bytes in the
// chunks) and every request of examples/ (checkpoints, grad ops, conv2d, cross_entropy, ...).
// Bounded: a fixed count of calls with a fixed seed, small limits, each call under a deadline
// (GRADSERVE_BAD_BYTES_SEED and GRADSERVE_BAD_BYTES_CALLS set others, for a longer search).
// Under CI's AddressSanitizer build, a mutation that reads out of bounds fails here too.

#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <map>
#include <random>
#include <sstream>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "client/load/scenarios.h"
#include "google/protobuf/util/json_util.h"
#include "gradserve/v1/gradserve.pb.h"
#include "gtest/gtest.h"
#include "tests/server/test_util.h"

namespace gradserve::testing {
namespace {

std::vector<std::string> SeedRequests() {
  std::vector<std::string> seeds = {load::GradTinyRequest().SerializeAsString(),
                                    load::PayloadRequest(20 << 10)->SerializeAsString()};
  for (const auto& entry : std::filesystem::directory_iterator(GRADSERVE_EXAMPLES_DIR)) {
    if (entry.path().extension() != ".json") continue;
    std::stringstream json;
    json << std::ifstream(entry.path()).rdbuf();
    v1::GradRequest request;
    EXPECT_TRUE(google::protobuf::util::JsonStringToMessage(json.str(), &request).ok())
        << entry.path();
    seeds.push_back(request.SerializeAsString());
  }
  return seeds;
}

// One to four random edits: a bit flipped, a byte set (often to 0x00, 0x7f, 0x80 or 0xff, the
// edges of varints and lengths), bytes inserted, a range deleted or repeated, the end cut off.
std::string Mutate(std::string bytes, std::mt19937_64& rng) {
  auto pick = [&rng](size_t n) { return n == 0 ? size_t{0} : size_t(rng() % n); };
  const int edits = 1 + static_cast<int>(rng() % 4);
  for (int e = 0; e < edits; ++e) {
    const size_t at = pick(bytes.size());
    switch (rng() % 6) {
      case 0:
        if (!bytes.empty()) bytes[at] ^= static_cast<char>(1 << (rng() % 8));
        break;
      case 1: {
        static constexpr char kEdges[] = {'\x00', '\x7f', '\x80', '\xff'};
        if (!bytes.empty()) bytes[at] = rng() % 2 ? kEdges[rng() % 4] : static_cast<char>(rng());
        break;
      }
      case 2:
        bytes.insert(at, std::string(1 + pick(8), static_cast<char>(rng())));
        break;
      case 3:
        bytes.erase(at, 1 + pick(16));
        break;
      case 4: {
        const size_t n = std::min<size_t>(1 + pick(64), bytes.size() - at);
        bytes.insert(at, bytes.substr(at, n));
        break;
      }
      default:
        bytes.resize(at);
    }
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

TEST(BadBytesTest, MutatedRequestsGetAClientStatusAndHarmNothing) {
  server::ServerOptions options = TestOptions();
  options.limits.max_tensor_elements = 1 << 16;  // a mutated shape cannot ask for much work
  options.limits.max_memory_bytes = 32 << 20;
  TestServer server(options);
  const std::vector<std::string> seeds = SeedRequests();
  ASSERT_GE(seeds.size(), 5u);
  // A longer search: GRADSERVE_BAD_BYTES_SEED and GRADSERVE_BAD_BYTES_CALLS in the environment.
  const char* seed = std::getenv("GRADSERVE_BAD_BYTES_SEED");
  const char* calls = std::getenv("GRADSERVE_BAD_BYTES_CALLS");
  std::mt19937_64 rng(seed != nullptr ? std::strtoull(seed, nullptr, 10) : 20261124);
  const int kCalls = calls != nullptr ? std::atoi(calls) : 4000;
  std::map<grpc::StatusCode, int> codes;
  for (int i = 0; i < kCalls; ++i) {
    const std::string bytes = Mutate(seeds[rng() % seeds.size()], rng);
    const bool streamed = i % 3 == 2;
    const grpc::Status status =
        streamed ? SendStreamMessages(server.client().channel(), AsChunks(bytes, rng))
                 : SendUnaryBytes(server.client().channel(), bytes);
    ++codes[status.error_code()];
    EXPECT_NE(status.error_code(), grpc::StatusCode::INTERNAL)
        << (streamed ? "stream" : "unary") << " call " << i << ": " << status.error_message();
    EXPECT_NE(status.error_code(), grpc::StatusCode::UNKNOWN)
        << (streamed ? "stream" : "unary") << " call " << i << ": " << status.error_message();
    if (i % 200 == 199) {
      ASSERT_TRUE(CheckSquareWorks(server.client()).ok()) << "after call " << i;
    }
  }
  std::string summary = "status codes (code: calls):";
  for (const auto& [code, n] : codes) absl::StrAppend(&summary, " ", code, ": ", n);
  std::printf("%s\n", summary.c_str());
  // Most mutations break the request; some leave it valid.
  EXPECT_GT(codes[grpc::StatusCode::INVALID_ARGUMENT], kCalls / 4) << summary;
  EXPECT_TRUE(CheckSquareWorks(server.client()).ok());
}

}  // namespace
}  // namespace gradserve::testing
