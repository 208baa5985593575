// The C++ client's graph sessions (client::Session) against real servers: values and gradients
// equal the one-shot request's, Extend, a session's calls stay on the server that answered its
// Forward when the target lists several, and the destructor releases.

#include <memory>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "client/library/gradserve_client.h"
#include "gtest/gtest.h"
#include "tests/client/load_test_util.h"

namespace gradserve::client {
namespace {

using ::gradserve::testing::LocalServer;

// x [3] requires grad; y = x * x; loss = sum(y). Its backward call keeps the graph.
v1::GradRequest Model() {
  RequestBuilder b;
  b.Leaf("x", HostTensor::Float32({1, 2, 3}, {3}), true)
      .Op("mul", {"x", "x"}, {"y"})
      .Op("sum", {"y"}, {"loss"})
      .ReturnValue("y");
  b.Grad({"loss"}, {"x"}).set_retain_graph(true);
  return b.request();
}

std::vector<v1::BackwardCall> Calls() {
  const v1::GradRequest model = Model();
  return {model.calls().begin(), model.calls().end()};
}

int64_t Sessions(LocalServer& server) { return server.server().service().sessions().size(); }

TEST(SessionClientTest, ForwardBackwardExtendAndReleaseOnDestruction) {
  LocalServer server;
  std::unique_ptr<Client> client = Client::Connect(server.target());
  absl::StatusOr<GradResult> one_shot = client->Grad(Model());
  ASSERT_TRUE(one_shot.ok()) << one_shot.status();
  {
    absl::StatusOr<std::unique_ptr<Session>> session = client->Forward(Model());
    ASSERT_TRUE(session.ok()) << session.status();
    EXPECT_EQ((*session)->id().size(), 32u);
    ASSERT_EQ((*session)->values().size(), 1u);
    EXPECT_EQ((*session)->values()[0].first, "y");
    EXPECT_EQ((*session)->values()[0].second.ToDoubles(), (std::vector<double>{1, 4, 9}));
    EXPECT_EQ(Sessions(server), 1);
    const std::vector<v1::BackwardCall> calls = Calls();
    for (int i = 0; i < 3; ++i) {
      absl::StatusOr<std::vector<CallGradients>> grads = (*session)->Backward(calls);
      ASSERT_TRUE(grads.ok()) << grads.status();
      EXPECT_EQ((*grads)[0].gradients[0].value->ToDoubles(),
                one_shot->calls[0].gradients[0].value->ToDoubles());
    }
    // Extend: loss2 = sum(y * t), chosen after a look at y.
    RequestBuilder extension;
    extension.Leaf("t", HostTensor::Float32({-1, 0, 1}, {3}))
        .Op("mul", {"y", "t"}, {"yt"})
        .Op("sum", {"yt"}, {"loss2"});
    absl::StatusOr<std::vector<std::pair<std::string, HostTensor>>> values =
        (*session)->Extend(extension.request().graph(), {"loss2"});
    ASSERT_TRUE(values.ok()) << values.status();
    ASSERT_EQ(values->size(), 1u);
    EXPECT_EQ((*values)[0].second.ToDoubles(), (std::vector<double>{8}));  // -1 + 9
    v1::BackwardCall call;
    call.add_roots("loss2");
    call.add_inputs("x");
    absl::StatusOr<std::vector<CallGradients>> grads = (*session)->Backward({call});
    ASSERT_TRUE(grads.ok()) << grads.status();
    EXPECT_EQ((*grads)[0].gradients[0].value->ToDoubles(), (std::vector<double>{-2, 0, 6}));
    // A repeated name is refused, naming it.
    absl::StatusOr<std::vector<std::pair<std::string, HostTensor>>> repeated =
        (*session)->Extend(extension.request().graph());
    EXPECT_EQ(repeated.status().code(), absl::StatusCode::kInvalidArgument);
    EXPECT_NE(repeated.status().message().find("'t'"), std::string::npos) << repeated.status();
  }
  EXPECT_EQ(Sessions(server), 0);  // the destructor released it
  EXPECT_EQ(server.server().service().memory()->used(), 0);
}

TEST(SessionClientTest, CallsStayOnTheServerThatAnsweredTheForward) {
  LocalServer a, b;
  // round_robin for the one-shot calls, one connection for the sessions'.
  std::unique_ptr<Client> client = Client::Connect(absl::StrCat(a.target(), ",", b.target()));
  std::vector<std::unique_ptr<Session>> sessions;
  for (int i = 0; i < 4; ++i) {
    absl::StatusOr<std::unique_ptr<Session>> s = client->Forward(Model());
    ASSERT_TRUE(s.ok()) << s.status();
    sessions.push_back(*std::move(s));
  }
  const std::vector<v1::BackwardCall> calls = Calls();
  for (int round = 0; round < 5; ++round) {
    for (const std::unique_ptr<Session>& s : sessions) {
      absl::StatusOr<std::vector<CallGradients>> grads = s->Backward(calls);
      ASSERT_TRUE(grads.ok()) << grads.status();  // never NOT_FOUND from the other server
    }
  }
  EXPECT_EQ(Sessions(a) + Sessions(b), 4);
  ASSERT_TRUE(sessions[0]->Release().ok());
  EXPECT_TRUE(sessions[0]->Release().ok());  // a second Release sends nothing
  sessions.clear();
  EXPECT_EQ(Sessions(a) + Sessions(b), 0);
  // The one-shot calls still go round robin over both.
  for (int i = 0; i < 10; ++i) ASSERT_TRUE(client->Grad(Model()).ok());
  EXPECT_GT(a.server().service().counters().requests_total(), 0);
  EXPECT_GT(b.server().service().counters().requests_total(), 0);
}

TEST(SessionClientTest, AnEndedSessionIsNotFound) {
  LocalServer server;
  std::unique_ptr<Client> client = Client::Connect(server.target());
  absl::StatusOr<std::unique_ptr<Session>> session = client->Forward(Model());
  ASSERT_TRUE(session.ok()) << session.status();
  ASSERT_TRUE((*session)->Release().ok());
  const std::vector<v1::BackwardCall> calls = Calls();
  absl::StatusOr<std::vector<CallGradients>> grads = (*session)->Backward(calls);
  EXPECT_EQ(grads.status().code(), absl::StatusCode::kNotFound);
  EXPECT_NE(grads.status().message().find((*session)->id()), std::string::npos);
}

}  // namespace
}  // namespace gradserve::client
