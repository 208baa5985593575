// Note [Sizing the server's memory] and Note [Budgets within a budget]: the server's budget is
// sized from its cgroup, and what all requests hold together stays within it.

#include "server/limits/server_memory.h"

#include <unistd.h>

#include <cstdlib>
#include <future>
#include <string>
#include <thread>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "gmock/gmock.h"
#include "grpcpp/create_channel.h"
#include "grpcpp/security/credentials.h"
#include "grpcpp/support/channel_arguments.h"
#include "gtest/gtest.h"
#include "tests/server/test_util.h"

namespace gradserve::testing {
namespace {

using ::testing::HasSubstr;

server::MemorySize Detect(const FakeCgroup& cgroup) {
  return server::DetectMemory(cgroup.paths().root, cgroup.paths().self);
}

TEST(ServerMemoryTest, CgroupV2LimitOfTheProcessOrAnAncestor) {
  FakeCgroup cgroup;
  cgroup.Write("/self", "0::/pods/app\n");
  cgroup.Write("/fs/pods/app/memory.max", "max\n");
  cgroup.Write("/fs/pods/memory.max", "314572800\n");
  const server::MemorySize size = Detect(cgroup);
  EXPECT_EQ(size.bytes, 314572800);
  EXPECT_EQ(size.source, "cgroup memory.max");
  EXPECT_EQ(server::DefaultServerMemoryBytes(size), 188743680);  // 60%
  EXPECT_EQ(server::DefaultGrpcMemoryBytes(size), 47185920);     // 15%
}

TEST(ServerMemoryTest, CgroupV1MemoryHierarchy) {
  FakeCgroup cgroup;
  cgroup.Write("/self", "5:cpu,cpuacct:/x\n4:memory:/job/7\n0::/\n");
  cgroup.Write("/fs/memory/job/7/memory.limit_in_bytes", "9223372036854771712\n");  // none
  cgroup.Write("/fs/memory/job/memory.limit_in_bytes", "1073741824\n");
  const server::MemorySize size = Detect(cgroup);
  EXPECT_EQ(size.bytes, 1073741824);
  EXPECT_EQ(size.source, "cgroup memory.limit_in_bytes");
}

TEST(ServerMemoryTest, NoLimitMeansPhysicalMemory) {
  FakeCgroup cgroup;
  cgroup.Write("/self", "0::/\n");
  cgroup.Write("/fs/memory.max", "max\n");
  const server::MemorySize size = Detect(cgroup);
  EXPECT_EQ(size.source, "physical memory");
  EXPECT_EQ(size.bytes, static_cast<int64_t>(sysconf(_SC_PHYS_PAGES)) * sysconf(_SC_PAGE_SIZE));
  // Unreadable files are no limit either.
  EXPECT_EQ(server::DetectMemory("/nonexistent", "/nonexistent").source, "physical memory");
}

// x (n floats) requiring grad, y = x * 2, loss = sum(y); grad of loss for x. n floats go in,
// n come back.
v1::GradRequest BigRequest(int64_t n) {
  RequestBuilder b;
  b.Leaf("x", HostTensor::Float32(std::vector<float>(n, 1.0f), {n}), /*requires_grad=*/true);
  b.Leaf("two", HostTensor::Float32({2.0f}, {}));
  b.Op("mul", {"x", "two"}, {"y"});
  b.Op("sum", {"y"}, {"loss"});
  b.Grad({"loss"}, {"x"});
  return b.request();
}

TEST(ServerMemoryTest, ConcurrentRequestsShareTheServersBudget) {
  server::ServerOptions options = TestOptions();
  options.max_in_flight = 8;
  options.worker_threads = 8;
  // One request holds its 16 MiB upload, then x, y and x's gradient (16 MiB each) and the
  // response: about 80 MiB at its peak. Eight at once cannot all fit in 128 MiB.
  options.max_server_memory_bytes = 128 << 20;
  options.limits.max_memory_bytes = 96 << 20;
  options.limits.max_tensor_elements = 8 << 20;
  TestServer server(options);
  constexpr int64_t kElements = 4 << 20;  // 16 MiB in, 16 out, and the tensors between
  std::vector<std::future<absl::Status>> calls;
  for (int i = 0; i < 8; ++i) {
    calls.push_back(std::async(std::launch::async, [&] {
      return server.client().ComputeGradients(BigRequest(kElements)).status();
    }));
  }
  int ok = 0, refused = 0;
  for (auto& call : calls) {
    const absl::Status status = call.get();
    if (status.ok()) {
      ++ok;
    } else {
      EXPECT_EQ(status.code(), absl::StatusCode::kResourceExhausted) << status;
      EXPECT_THAT(status.message(), HasSubstr("--max_server_memory_bytes"));
      ++refused;
    }
  }
  EXPECT_GT(refused, 0) << "8 requests of about 80 MiB each all fit in 128 MiB?";
  EXPECT_GE(ok + refused, 8);
  // Everything given back once the calls are done, and the server still serves.
  const absl::Time deadline = absl::Now() + absl::Seconds(5);
  while (server.server().service().memory()->used() != 0 && absl::Now() < deadline) {
    absl::SleepFor(absl::Milliseconds(10));
  }
  EXPECT_EQ(server.server().service().memory()->used(), 0);
  EXPECT_LE(server.server().service().memory()->peak(), 128 << 20);
  EXPECT_TRUE(server.client().ComputeGradients(BigRequest(kElements)).ok());
}

// A server whose requests may hold 24 MiB, and a request builder with x, 4 MiB of ones
// requiring grad, for the response tests below.
server::ServerOptions Budget24MiB() {
  server::ServerOptions options = TestOptions();
  options.limits.max_memory_bytes = 24 << 20;
  return options;
}
RequestBuilder WithFourMibLeaf() {
  RequestBuilder b;
  b.Leaf("x", HostTensor::Float32(std::vector<float>(1 << 20, 1.0f), {1 << 20}),
         /*requires_grad=*/true);
  return b;
}

TEST(ServerMemoryTest, TheResponseCountsAgainstTheRequestsBudget) {
  TestServer server(Budget24MiB());
  // x (4 MiB) fits, and y is a view of it; y sent back three times (8 MiB each) fills the
  // request's 24 MiB, and its serialized form does not fit beside them.
  RequestBuilder b = WithFourMibLeaf();
  b.Op("expand", {"x"}, {"y"}, {{"size", client::IntsAttr({2, 1 << 20})}});
  b.ReturnValue("y").ReturnValue("y").ReturnValue("y");
  const absl::StatusOr<v1::GradResponse> response = server.client().ComputeGradients(b.request());
  ASSERT_FALSE(response.ok());
  EXPECT_EQ(response.status().code(), absl::StatusCode::kResourceExhausted);
  EXPECT_THAT(response.status().message(), HasSubstr("request memory limit"));
  EXPECT_THAT(response.status().message(), HasSubstr("the response"));
}

TEST(ServerMemoryTest, ATensorTheResponseHandsOverIsChargedOnce) {
  TestServer server(Budget24MiB());
  // y = 2x (4 MiB, contiguous) returned five times, and x's gradient (4 MiB): the response
  // hands gRPC the tensors themselves (Note [Tensor bytes left in the chunks]), so the request
  // holds 8 MiB, not the 48 that charging each copy in the response and again in its
  // serialized form came to.
  RequestBuilder b = WithFourMibLeaf();
  b.Op("mul", {"x"}, {"y"}, {{"other", client::FloatAttr(2)}}).Op("sum", {"y"}, {"loss"});
  for (int i = 0; i < 5; ++i) b.ReturnValue("y");
  b.Grad({"loss"}, {"x"});
  const absl::StatusOr<v1::GradResponse> response = server.client().ComputeGradients(b.request());
  ASSERT_TRUE(response.ok()) << response.status();
  ASSERT_EQ(response->values_size(), 5);
  EXPECT_EQ(response->values(4).value().data().size(), size_t{4} << 20);
  EXPECT_EQ(response->calls(0).gradients(0).value().data().size(), size_t{4} << 20);
}

TEST(ServerMemoryTest, TheLeavesCountAgainstTheRequestsBudget) {
  TestServer server(Budget24MiB());
  // x (16 MiB) and y = 2x (16 MiB): each fits the request's 24 MiB, both together do not.
  RequestBuilder b;
  b.Leaf("x", HostTensor::Float32(std::vector<float>(4 << 20, 1.0f), {4 << 20}),
         /*requires_grad=*/true);
  b.Op("mul", {"x"}, {"y"}, {{"other", client::FloatAttr(2)}}).Op("sum", {"y"}, {"loss"});
  b.Grad({"loss"}, {"x"});
  client::CallOptions options;
  options.timeout = absl::Seconds(60);
  // y read by the sum alone is never stored (Note [A scaled sum in one pass]): x alone fits.
  const absl::StatusOr<v1::GradResponse> summed =
      server.client().ComputeGradients(b.request(), options);
  ASSERT_TRUE(summed.ok()) << summed.status();
  // Returned, y is stored beside x.
  b.ReturnValue("y");
  const absl::StatusOr<v1::GradResponse> response =
      server.client().ComputeGradients(b.request(), options);
  ASSERT_FALSE(response.ok()) << "the leaf was not counted";
  EXPECT_EQ(response.status().code(), absl::StatusCode::kResourceExhausted);
  EXPECT_THAT(response.status().message(), HasSubstr("op #0 (mul -> 'y')"));
  EXPECT_THAT(response.status().message(), HasSubstr("request memory limit"));
}

TEST(ServerMemoryTest, CompressedRequestsCanBeRefused) {
  for (bool accept : {true, false}) {
    server::ServerOptions options = TestOptions();
    options.accept_compressed = accept;
    TestServer server(options);
    grpc::ChannelArguments args;
    args.SetCompressionAlgorithm(GRPC_COMPRESS_GZIP);
    const grpc::Status status = SendUnaryBytes(
        grpc::CreateCustomChannel(server.target(), grpc::InsecureChannelCredentials(), args),
        SquareRequest().SerializeAsString());
    if (accept) {
      EXPECT_TRUE(status.ok()) << status.error_message();
    } else {
      EXPECT_EQ(status.error_code(), grpc::StatusCode::UNIMPLEMENTED) << status.error_message();
    }
  }
}

}  // namespace
}  // namespace gradserve::testing
