// Shared memory on a real server (Note [Shared-memory regions] in
// server/shared_memory/registry.h) with the C++ client's SharedMemory: leaves, seeds and
// gradients through a region give what the same request gives inline; every bad range, region
// and object is a clear status that harms nothing; regions of another tenant are
// PERMISSION_DENIED; draining ends them; counters and memory follow them.

#include "client/library/shared_memory.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <unistd.h>

#include <atomic>
#include <cstring>
#include <memory>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "absl/time/time.h"
#include "engine/tensor/memory_budget.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "server/service/grad_server.h"
#include "tests/server/security/test_pki.h"
#include "tests/server/test_util.h"

namespace gradserve::testing {
namespace {

using client::SharedMemory;

constexpr char kPrefix[] = "/gradserve_stest";

std::string NewKey() {
  static std::atomic<int> counter{0};
  return absl::StrCat(kPrefix, "_", getpid(), "_", counter.fetch_add(1));
}

server::ServerOptions ShmOptions() {
  server::ServerOptions options = TestOptions();
  options.shared_memory.prefix = kPrefix;
  options.shared_memory.max_per_tenant = 4;
  return options;
}

// y = x * w; loss = sum(y * y): gradients for x [n] and w [n].
v1::GradRequest Model(const v1::Tensor& x, const v1::Tensor& w) {
  v1::GradRequest request;
  request.set_request_id("shm-model");
  v1::Graph* g = request.mutable_graph();
  v1::Leaf* lx = g->add_leaves();
  lx->set_name("x");
  lx->set_requires_grad(true);
  *lx->mutable_value() = x;
  v1::Leaf* lw = g->add_leaves();
  lw->set_name("w");
  lw->set_requires_grad(true);
  *lw->mutable_value() = w;
  auto op = [&](const char* name, std::vector<std::string> in, const char* out) {
    v1::Op* o = g->add_ops();
    o->set_op(name);
    for (const std::string& i : in) o->add_inputs(i);
    o->add_outputs(out);
  };
  op("mul", {"x", "w"}, "y");
  op("mul", {"y", "y"}, "yy");
  op("sum", {"yy"}, "loss");
  v1::BackwardCall* call = request.add_calls();
  call->add_roots("loss");
  call->add_inputs("x");
  call->add_inputs("w");
  return request;
}

std::vector<float> Ramp(int n, float scale) {
  std::vector<float> v(n);
  for (int i = 0; i < n; ++i) v[i] = scale * static_cast<float>(i % 17 - 8);
  return v;
}

v1::Tensor Inline(const HostTensor& t) {
  v1::Tensor out;
  t.ToProto(&out);
  return out;
}

class SharedMemoryTest : public ::testing::Test {
 protected:
  static constexpr int kN = 4096;
  static constexpr int64_t kBytes = kN * 4;

  SharedMemoryTest() : server_(ShmOptions()) {}

  // A region of `bytes`, registered as name.
  std::unique_ptr<SharedMemory> Region(const std::string& name, int64_t bytes, bool writable) {
    absl::StatusOr<std::unique_ptr<SharedMemory>> shm = SharedMemory::Create(NewKey(), bytes);
    EXPECT_TRUE(shm.ok()) << shm.status();
    if (!shm.ok()) return nullptr;
    absl::StatusOr<absl::Duration> ttl =
        server_.client().RegisterSharedMemory(name, (*shm)->key(), bytes, writable);
    EXPECT_TRUE(ttl.ok()) << ttl.status();
    return *std::move(shm);
  }

  absl::Status Send(const v1::GradRequest& request) {
    return server_.client().ComputeGradients(request).status();
  }

  TestServer server_;
};

TEST_F(SharedMemoryTest, LeavesAndGradientsThroughARegionMatchTheInlineRequest) {
  const HostTensor x = HostTensor::Float32(Ramp(kN, 0.25f), {kN});
  const HostTensor w = HostTensor::Float32(Ramp(kN, -0.5f), {kN});
  absl::StatusOr<client::GradResult> inline_result =
      server_.client().Grad(Model(Inline(x), Inline(w)));
  ASSERT_TRUE(inline_result.ok()) << inline_result.status();

  auto in = Region("in", 2 * kBytes, /*writable=*/false);
  auto out = Region("out", 2 * kBytes, /*writable=*/true);
  ASSERT_TRUE(in && out);
  absl::StatusOr<v1::Tensor> xs = in->Put("in", 0, x);
  absl::StatusOr<v1::Tensor> ws = in->Put("in", kBytes, w);
  ASSERT_TRUE(xs.ok() && ws.ok());
  v1::GradRequest request = Model(*xs, *ws);
  auto* destinations = request.mutable_calls(0)->mutable_gradient_destinations();
  (*destinations)["x"] = SharedMemory::Range("out", 0, kBytes);
  (*destinations)["w"] = SharedMemory::Range("out", kBytes, kBytes);
  absl::StatusOr<v1::GradResponse> response = server_.client().ComputeGradients(request);
  ASSERT_TRUE(response.ok()) << response.status();
  // The gradients' bytes are not in the response: only where they are.
  EXPECT_LT(response->ByteSizeLong(), 512u);
  absl::StatusOr<client::GradResult> result = client::FromProto(*response);
  ASSERT_TRUE(result.ok());
  for (int k = 0; k < 2; ++k) {
    const client::Gradient& g = result->calls[0].gradients[k];
    ASSERT_TRUE(g.in_shared_memory.has_value()) << g.name;
    EXPECT_FALSE(g.value.has_value());
    EXPECT_EQ(g.in_shared_memory->shared_memory().region(), "out");
    absl::StatusOr<HostTensor> got = out->Get(*g.in_shared_memory);
    ASSERT_TRUE(got.ok()) << got.status();
    EXPECT_EQ(got->shape, std::vector<int64_t>{kN});
    EXPECT_EQ(got->data, inline_result->calls[0].gradients[k].value->data) << g.name;
  }
  // Without destinations, gradients come back in the response as usual.
  absl::StatusOr<client::GradResult> mixed = server_.client().Grad(Model(*xs, Inline(w)));
  ASSERT_TRUE(mixed.ok()) << mixed.status();
  EXPECT_EQ(mixed->calls[0].gradients[0].value->data,
            inline_result->calls[0].gradients[0].value->data);

  absl::StatusOr<v1::ServerInfo> info = server_.client().GetServerInfo();
  ASSERT_TRUE(info.ok());
  EXPECT_EQ(info->counters().shared_memory_regions(), 2);
  EXPECT_EQ(info->counters().shared_memory_bytes(), 4 * kBytes);
  EXPECT_EQ(info->limits().shared_memory_prefix(), kPrefix);
  const std::string metrics = server_.server().service().MetricsText();
  EXPECT_NE(metrics.find("\ngradserve_shared_memory_regions 2\n"), std::string::npos) << metrics;
  EXPECT_NE(metrics.find(absl::StrCat("\ngradserve_shared_memory_bytes ", 4 * kBytes, "\n")),
            std::string::npos);
  // Charged to the server's memory while registered, and only until then. A call's memory is
  // freed after its reply when it ran on a worker (Note [Teardown after the reply]): wait
  // for the last call's to settle first.
  const std::shared_ptr<MemoryBudget>& memory = server_.server().service().memory();
  int64_t held = memory->used();
  for (const absl::Time give_up = absl::Now() + absl::Seconds(10); absl::Now() < give_up;) {
    absl::SleepFor(absl::Milliseconds(50));
    const int64_t now = memory->used();
    if (now == held) break;
    held = now;
  }
  EXPECT_GE(held, 4 * kBytes);
  EXPECT_TRUE(server_.client().UnregisterSharedMemory("in").ok());
  EXPECT_TRUE(server_.client().UnregisterSharedMemory("out").ok());
  EXPECT_EQ(server_.server().service().memory()->used(), held - 4 * kBytes);
  EXPECT_EQ(server_.client().UnregisterSharedMemory("out").code(), absl::StatusCode::kNotFound);
}

TEST_F(SharedMemoryTest, AGradientOfOneValueFillsItsRangeAsInline) {
  // loss = sum(x * 3): x's gradient is one value, 3, expanded (Note [A gradient of one value]),
  // written into the range as a fill; it must equal the inline request's, every element.
  constexpr int n = 3 * kN;
  RequestBuilder b;
  b.Leaf("x", HostTensor::Float32(Ramp(n, 0.25f), {n}), /*requires_grad=*/true)
      .Op("mul", {"x"}, {"y"}, {{"other", client::FloatAttr(3)}})
      .Op("sum", {"y"}, {"loss"});
  b.Grad({"loss"}, {"x"});
  absl::StatusOr<client::GradResult> inline_result = server_.client().Grad(b.request());
  ASSERT_TRUE(inline_result.ok()) << inline_result.status();
  const HostTensor& expected = *inline_result->calls[0].gradients[0].value;

  // A wider region, filled with -1 first: the fill writes its range and nothing past it.
  auto out = Region("out", (n + 2) * 4, /*writable=*/true);
  ASSERT_TRUE(out);
  ASSERT_TRUE(out->Put("out", 0, HostTensor::Float32(std::vector<float>(n + 2, -1), {n + 2})).ok());
  v1::GradRequest request = b.request();
  (*request.mutable_calls(0)->mutable_gradient_destinations())["x"] =
      SharedMemory::Range("out", 4, n * 4);
  absl::StatusOr<client::GradResult> result = server_.client().Grad(request);
  ASSERT_TRUE(result.ok()) << result.status();
  const client::Gradient& g = result->calls[0].gradients[0];
  ASSERT_TRUE(g.in_shared_memory.has_value());
  absl::StatusOr<HostTensor> got = out->Get(*g.in_shared_memory);
  ASSERT_TRUE(got.ok()) << got.status();
  EXPECT_EQ(got->data, expected.data);
  std::vector<float> all(n + 2);
  absl::StatusOr<HostTensor> whole = out->Get([&] {
    v1::Tensor t;
    t.set_dtype(v1::DTYPE_FLOAT32);
    t.add_shape(n + 2);
    *t.mutable_shared_memory() = SharedMemory::Range("out", 0, (n + 2) * 4);
    return t;
  }());
  ASSERT_TRUE(whole.ok()) << whole.status();
  std::memcpy(all.data(), whole->data.data(), all.size() * 4);
  EXPECT_EQ(all.front(), -1);
  EXPECT_EQ(all.back(), -1);
  EXPECT_THAT(std::vector<float>(all.begin() + 1, all.end() - 1), ::testing::Each(3.0f));
}

TEST_F(SharedMemoryTest, SessionsTakeRegionsForLeavesSeedsAndGradients) {
  auto buf = Region("buf", 4 * kBytes, /*writable=*/true);
  ASSERT_TRUE(buf);
  const HostTensor x = HostTensor::Float32(Ramp(kN, 0.5f), {kN});
  const HostTensor w = HostTensor::Float32(Ramp(kN, 0.125f), {kN});
  absl::StatusOr<v1::Tensor> xs = buf->Put("buf", 0, x);
  ASSERT_TRUE(xs.ok());
  v1::GradRequest model = Model(*xs, Inline(w));
  model.clear_calls();
  absl::StatusOr<std::unique_ptr<client::Session>> session = server_.client().Forward(model);
  ASSERT_TRUE(session.ok()) << session.status();

  // Seed for y (not the scalar loss): ones, from the region.
  absl::StatusOr<v1::Tensor> seed =
      buf->Put("buf", kBytes, HostTensor::Float32(std::vector<float>(kN, 1.0f), {kN}));
  ASSERT_TRUE(seed.ok());
  v1::BackwardCall call;
  call.add_roots("y");
  (*call.mutable_seeds())["y"] = *seed;
  call.add_inputs("x");
  (*call.mutable_gradient_destinations())["x"] = SharedMemory::Range("buf", 2 * kBytes, kBytes);
  absl::StatusOr<std::vector<client::CallGradients>> grads = (*session)->Backward({call});
  ASSERT_TRUE(grads.ok()) << grads.status();
  ASSERT_TRUE((*grads)[0].gradients[0].in_shared_memory.has_value());
  absl::StatusOr<HostTensor> dx = buf->Get(*(*grads)[0].gradients[0].in_shared_memory);
  ASSERT_TRUE(dx.ok()) << dx.status();
  EXPECT_EQ(dx->ToDoubles(), w.ToDoubles());  // d(sum(x * w * 1))/dx = w
}

TEST_F(SharedMemoryTest, BadRangesAndRegionsAreClearErrorsThatHarmNothing) {
  auto in = Region("in", kBytes, /*writable=*/false);
  auto out = Region("out", kBytes, /*writable=*/true);
  ASSERT_TRUE(in && out);
  const HostTensor x = HostTensor::Float32(Ramp(kN, 1), {kN});
  absl::StatusOr<v1::Tensor> xs = in->Put("in", 0, x);
  ASSERT_TRUE(xs.ok());
  auto with_x = [&](auto change) {
    v1::Tensor t = *xs;
    change(t);
    return Model(t, Inline(x));
  };
  struct Case {
    const char* what;
    v1::GradRequest request;
    absl::StatusCode code;
    const char* message;
  };
  std::vector<Case> cases;
  cases.push_back({"unregistered",
                   with_x([](v1::Tensor& t) { t.mutable_shared_memory()->set_region("nope"); }),
                   absl::StatusCode::kInvalidArgument,
                   "leaf 'x': shared-memory region 'nope' is not registered"});
  cases.push_back({"past the end",
                   with_x([](v1::Tensor& t) { t.mutable_shared_memory()->set_offset(4); }),
                   absl::StatusCode::kInvalidArgument, "is not within shared-memory region 'in'"});
  cases.push_back({"negative",
                   with_x([](v1::Tensor& t) { t.mutable_shared_memory()->set_offset(-8); }),
                   absl::StatusCode::kInvalidArgument, "is not within"});
  cases.push_back({"wrong size",
                   with_x([](v1::Tensor& t) { t.mutable_shared_memory()->set_byte_size(12); }),
                   absl::StatusCode::kInvalidArgument, "shared_memory.byte_size is 12"});
  cases.push_back({"shape too big", with_x([](v1::Tensor& t) {
                     t.set_shape(0, kN * 2);
                     t.mutable_shared_memory()->set_byte_size(0);  // the shape's size
                   }),
                   absl::StatusCode::kInvalidArgument, "is not within"});
  {
    v1::GradRequest r = Model(Inline(x), Inline(x));
    (*r.mutable_calls(0)->mutable_gradient_destinations())["x"] =
        SharedMemory::Range("in", 0, kBytes);
    cases.push_back({"read-only destination", r, absl::StatusCode::kInvalidArgument,
                     "was registered read-only"});
  }
  {
    v1::GradRequest r = Model(Inline(x), Inline(x));
    (*r.mutable_calls(0)->mutable_gradient_destinations())["x"] =
        SharedMemory::Range("out", 0, kBytes - 4);
    cases.push_back({"destination of the wrong size", r, absl::StatusCode::kInvalidArgument,
                     "but its destination range has 16380"});
  }
  {
    v1::GradRequest r = Model(Inline(x), Inline(x));
    (*r.mutable_calls(0)->mutable_gradient_destinations())["z"] =
        SharedMemory::Range("out", 0, kBytes);
    cases.push_back({"destination for no input", r, absl::StatusCode::kInvalidArgument,
                     "not one of the call's inputs"});
  }
  for (const Case& c : cases) {
    const absl::Status s = Send(c.request);
    EXPECT_EQ(s.code(), c.code) << c.what << ": " << s;
    EXPECT_NE(s.message().find(c.message), std::string::npos) << c.what << ": " << s;
  }
  EXPECT_TRUE(CheckSquareWorks(server_.client()).ok());

  // Registrations the server refuses.
  client::Client& client = server_.client();
  EXPECT_EQ(client.RegisterSharedMemory("x", "/elsewhere_1", 16, false).status().code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(
      client.RegisterSharedMemory("x", absl::StrCat(kPrefix, "_absent"), 16, false).status().code(),
      absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(client.RegisterSharedMemory("in", in->key(), kBytes, false).status().code(),
            absl::StatusCode::kAlreadyExists);
  EXPECT_EQ(client.RegisterSharedMemory("big", in->key(), kBytes + 1, false).status().code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_TRUE(CheckSquareWorks(client).ok());
}

TEST_F(SharedMemoryTest, AnObjectShrunkUnderTheServerIsInvalidArgumentNeverAFault) {
  auto buf = Region("buf", 2 * kBytes, /*writable=*/true);
  ASSERT_TRUE(buf);
  const HostTensor x = HostTensor::Float32(Ramp(kN, 1), {kN});
  absl::StatusOr<v1::Tensor> xs = buf->Put("buf", kBytes, x);
  ASSERT_TRUE(xs.ok());
  // The client shrinks its object after registering it: the server's mapping outlives it.
  const int fd = shm_open(buf->key().c_str(), O_RDWR, 0);
  ASSERT_GE(fd, 0);
  ASSERT_EQ(ftruncate(fd, kBytes / 2), 0);
  close(fd);
  const absl::Status read = Send(Model(*xs, Inline(x)));
  EXPECT_EQ(read.code(), absl::StatusCode::kInvalidArgument) << read;
  EXPECT_NE(read.message().find("the client shrank it"), std::string::npos) << read;
  v1::GradRequest write = Model(Inline(x), Inline(x));
  (*write.mutable_calls(0)->mutable_gradient_destinations())["w"] =
      SharedMemory::Range("buf", kBytes, kBytes);
  const absl::Status written = Send(write);
  EXPECT_EQ(written.code(), absl::StatusCode::kInvalidArgument) << written;
  EXPECT_TRUE(CheckSquareWorks(server_.client()).ok());
}

TEST(SharedMemoryOffTest, RegisteringIsFailedPreconditionByDefault) {
  TestServer server;  // TestOptions: no prefix
  absl::StatusOr<std::unique_ptr<SharedMemory>> shm = SharedMemory::Create(NewKey(), 64);
  ASSERT_TRUE(shm.ok());
  const absl::Status off =
      server.client().RegisterSharedMemory("buf", (*shm)->key(), 64, true).status();
  EXPECT_EQ(off.code(), absl::StatusCode::kFailedPrecondition) << off;
  // A request naming a region is refused, not faulted.
  v1::Tensor t;
  t.set_dtype(v1::DTYPE_FLOAT32);
  t.add_shape(16);
  *t.mutable_shared_memory() = SharedMemory::Range("buf", 0, 64);
  const absl::Status refused = server.client().ComputeGradients(Model(t, t)).status();
  EXPECT_EQ(refused.code(), absl::StatusCode::kInvalidArgument) << refused;
  EXPECT_NE(refused.message().find("shared memory is off on this server"), std::string::npos)
      << refused;
}

// A region lives on the server that registered it; a client of two replicas sends the calls
// that name it there too (over its session channel), where round robin would send every
// other call to the replica that has no such region.
TEST(SharedMemoryReplicasTest, CallsNamingARegionReachTheServerThatHoldsIt) {
  TestServer a(ShmOptions());
  TestServer b(ShmOptions());
  std::unique_ptr<client::Client> both =
      client::Client::Connect(absl::StrCat(a.target(), ",", b.target()));
  constexpr int kN = 256;
  absl::StatusOr<std::unique_ptr<SharedMemory>> shm = SharedMemory::Create(NewKey(), 2 * kN * 4);
  ASSERT_TRUE(shm.ok()) << shm.status();
  ASSERT_TRUE(both->RegisterSharedMemory("buf", (*shm)->key(), 2 * kN * 4, true).ok());
  EXPECT_EQ(
      a.server().service().shared_memory().size() + b.server().service().shared_memory().size(), 1);
  const HostTensor x = HostTensor::Float32(Ramp(kN, 0.5f), {kN});
  absl::StatusOr<v1::Tensor> xs = (*shm)->Put("buf", 0, x);
  ASSERT_TRUE(xs.ok()) << xs.status();
  v1::GradRequest request = Model(*xs, Inline(x));
  (*request.mutable_calls(0)->mutable_gradient_destinations())["x"] =
      SharedMemory::Range("buf", kN * 4, kN * 4);
  for (int i = 0; i < 8; ++i) {
    const absl::Status status = both->ComputeGradients(request).status();
    EXPECT_TRUE(status.ok()) << "call " << i << ": " << status;
  }
  // Calls that name no region are still spread over both.
  const v1::GradRequest inline_request = Model(Inline(x), Inline(x));
  for (int i = 0; i < 8; ++i) EXPECT_TRUE(both->ComputeGradients(inline_request).ok());
}

TEST(SharedMemoryDrainTest, DrainingEndsEveryRegion) {
  TestServer server(ShmOptions());
  absl::StatusOr<std::unique_ptr<SharedMemory>> shm = SharedMemory::Create(NewKey(), 64);
  ASSERT_TRUE(shm.ok());
  ASSERT_TRUE(server.client().RegisterSharedMemory("buf", (*shm)->key(), 64, true).ok());
  const int64_t held = server.server().service().memory()->used();
  server.server().service().StartDraining();
  EXPECT_EQ(server.server().service().shared_memory().size(), 0);
  EXPECT_EQ(server.server().service().memory()->used(), held - 64);
  EXPECT_EQ(server.client().RegisterSharedMemory("b2", (*shm)->key(), 64, true).status().code(),
            absl::StatusCode::kUnavailable);
}

constexpr char kAcme[] = "acme-token-Sh7mQ2";
constexpr char kBeta[] = "beta-token-Pw4nK9";

TEST(SharedMemoryTenantsTest, AnotherTenantsRegionsAndObjectsArePermissionDenied) {
  TestPki pki;
  pki.Write("tokens", absl::StrCat("a1 acme ", TokenDigest(kAcme), " all\nb1 beta ",
                                   TokenDigest(kBeta), " all\n"));
  server::ServerOptions options = ShmOptions();
  pki.ServeTlsWithTokens(options);
  absl::StatusOr<std::unique_ptr<server::GradServer>> server = server::GradServer::Start(options);
  ASSERT_TRUE(server.ok()) << server.status();
  auto acme = pki.TokenClient((*server)->port(), kAcme);
  auto beta = pki.TokenClient((*server)->port(), kBeta);

  absl::StatusOr<std::unique_ptr<SharedMemory>> shm = SharedMemory::Create(NewKey(), 64);
  ASSERT_TRUE(shm.ok());
  ASSERT_TRUE(acme->RegisterSharedMemory("acme-buf", (*shm)->key(), 64, true).ok());
  absl::StatusOr<v1::Tensor> x =
      (*shm)->Put("acme-buf", 0, HostTensor::Float32(std::vector<float>(16, 1), {16}));
  ASSERT_TRUE(x.ok());
  EXPECT_TRUE(acme->ComputeGradients(Model(*x, *x)).ok());
  const absl::Status used = beta->ComputeGradients(Model(*x, *x)).status();
  EXPECT_EQ(used.code(), absl::StatusCode::kPermissionDenied) << used;
  EXPECT_EQ(beta->RegisterSharedMemory("beta-buf", (*shm)->key(), 64, false).status().code(),
            absl::StatusCode::kPermissionDenied);
  EXPECT_EQ(beta->UnregisterSharedMemory("acme-buf").code(), absl::StatusCode::kPermissionDenied);
  EXPECT_TRUE(acme->UnregisterSharedMemory("acme-buf").ok());
}

}  // namespace
}  // namespace gradserve::testing
