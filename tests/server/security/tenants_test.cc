// Tenants' shares (Note [Tenants' shares] in server/security/tenants.h): one tenant at its
// share of slots or memory is refused, naming its limit, while another is served.

#include <atomic>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/synchronization/notification.h"
#include "absl/time/clock.h"
#include "gtest/gtest.h"
#include "server/service/grad_server.h"
#include "tests/server/security/test_pki.h"
#include "tests/server/test_util.h"

namespace gradserve::testing {
namespace {

constexpr char kAcme[] = "acme-token-Lr5tG8";
constexpr char kBeta[] = "beta-token-Mc3uD6";

class TenantsTest : public ::testing::Test {
 protected:
  void Start(server::ServerOptions options) {
    pki_.Write("tokens", absl::StrCat("a1 acme ", TokenDigest(kAcme), " all\nb1 beta ",
                                      TokenDigest(kBeta), " all\n"));
    pki_.ServeTlsWithTokens(options);
    absl::StatusOr<std::unique_ptr<server::GradServer>> server = server::GradServer::Start(options);
    ASSERT_TRUE(server.ok()) << server.status();
    server_ = *std::move(server);
  }

  std::unique_ptr<client::Client> Client(const std::string& token) {
    return pki_.TokenClient(server_->port(), token);
  }

  static client::CallOptions Quick() {
    client::CallOptions options;
    options.timeout = absl::Seconds(30);
    return options;
  }

  TestPki pki_;
  std::unique_ptr<server::GradServer> server_;
};

TEST_F(TenantsTest, ATenantAtItsSlotsIsRefusedWhileAnotherIsServed) {
  auto release = std::make_shared<absl::Notification>();
  auto held = std::make_shared<std::atomic<int>>(0);
  server::ServerOptions options = TestOptions();
  options.max_in_flight = 16;
  options.security.tenant_max_in_flight = 2;
  // Held calls wait on workers, not on gRPC's threads (Note [Inline or pool]); two workers are
  // left for the other tenant.
  options.max_inline_cost = 0;
  options.worker_threads = 4;
  options.before_run_for_testing = [release, held](const v1::GradRequest& request,
                                                   const autograd::CancellationToken&) {
    if (request.request_id() != "held") return;
    held->fetch_add(1);
    release->WaitForNotificationWithTimeout(absl::Seconds(30));
  };
  Start(options);
  std::vector<std::unique_ptr<client::Client>> acme;
  for (int i = 0; i < 4; ++i) acme.push_back(Client(kAcme));
  std::vector<std::thread> holders;
  std::vector<absl::Status> held_status(2);
  for (int i = 0; i < 2; ++i) {
    holders.emplace_back([&, i] {
      v1::GradRequest request = SquareRequest();
      request.set_request_id("held");
      held_status[i] = acme[i]->ComputeGradients(request, Quick()).status();
    });
  }
  for (int i = 0; i < 500 && held->load() < 2; ++i) absl::SleepFor(absl::Milliseconds(10));
  ASSERT_EQ(held->load(), 2);

  const absl::Status refused = acme[2]->ComputeGradients(SquareRequest(), Quick()).status();
  EXPECT_EQ(refused.code(), absl::StatusCode::kResourceExhausted);
  EXPECT_NE(refused.message().find("tenant acme"), absl::string_view::npos) << refused;
  EXPECT_NE(refused.message().find("--tenant_max_in_flight"), absl::string_view::npos);
  // The other tenant is served meanwhile, with slots to spare.
  auto beta = Client(kBeta);
  for (int i = 0; i < 3; ++i) {
    const absl::Status served = beta->ComputeGradients(SquareRequest(), Quick()).status();
    EXPECT_TRUE(served.ok()) << served;
  }

  release->Notify();
  for (std::thread& t : holders) t.join();
  for (const absl::Status& s : held_status) EXPECT_TRUE(s.ok()) << s;
  EXPECT_TRUE(acme[3]->ComputeGradients(SquareRequest(), Quick()).ok());  // slots given back
}

TEST_F(TenantsTest, ATenantOverItsMemoryShareIsRefusedWhileAnotherIsServed) {
  server::ServerOptions options = TestOptions();
  options.max_server_memory_bytes = int64_t{128} << 20;
  options.security.tenant_memory_share = 0.125;  // 16 MiB each
  Start(options);
  // w = [2800, 2800] float32: 31 MiB, within the server's budget and the request's limit.
  const absl::Status refused =
      Client(kAcme)->ComputeGradients(SlowRequest(1, 2800), Quick()).status();
  EXPECT_EQ(refused.code(), absl::StatusCode::kResourceExhausted);
  EXPECT_NE(refused.message().find("tenant acme's memory share (--tenant_memory_share)"),
            absl::string_view::npos)
      << refused;
  const absl::Status served = Client(kBeta)->ComputeGradients(SquareRequest(), Quick()).status();
  EXPECT_TRUE(served.ok()) << served;
  // Within its share, the same tenant is served.
  EXPECT_TRUE(Client(kAcme)->ComputeGradients(SlowRequest(1, 1024), Quick()).ok());
}

TEST(NoTenantsTest, WithoutATokenFileTheServersBoundsAloneApply) {
  server::ServerOptions options = TestOptions();
  options.security.tenant_max_in_flight = 1;  // ignored: one implicit tenant
  TestServer server(options);
  SlowCallInFlight slow(server.client());
  ASSERT_TRUE(WaitForInFlight(server.client(), 1, absl::Seconds(10)));
  EXPECT_TRUE(server.client().ComputeGradients(SquareRequest()).ok());
}

}  // namespace
}  // namespace gradserve::testing
