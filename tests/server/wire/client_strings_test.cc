// Client strings on the wire (issue 24, item 8; Note [Quoting client strings] in
// engine/util/quote.h): every string of a request is bounded by --max_name_bytes, over it
// INVALID_ARGUMENT with a short message, never the client's RESOURCE_EXHAUSTED "received
// initial metadata size exceeds limit"; control bytes in names come back escaped; and no status
// message, however many names it quotes, nears gRPC's 8 KiB of metadata. Both ways in: the
// unary call and the stream.

#include <functional>
#include <string>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "gtest/gtest.h"
#include "tests/server/test_util.h"

namespace gradserve::testing {
namespace {

// Whether s has a byte that is not printable ASCII.
bool HasRawByte(const std::string& s) {
  for (char c : s) {
    if (static_cast<unsigned char>(c) < 0x20 || static_cast<unsigned char>(c) >= 0x7f) return true;
  }
  return false;
}

// Where a request carries a client string: the request with s there.
struct Place {
  std::string name;
  std::function<v1::GradRequest(const std::string& s)> make;
};

std::vector<Place> Places() {
  auto square = [](auto edit) {
    return [edit](const std::string& s) {
      v1::GradRequest r = SquareRequest();
      edit(r, s);
      return r;
    };
  };
  std::vector<Place> places;
  places.push_back({"op", square([](v1::GradRequest& r, const std::string& s) {
                      r.mutable_graph()->mutable_ops(0)->set_op(s);
                    })});
  places.push_back({"op_output", square([](v1::GradRequest& r, const std::string& s) {
                      r.mutable_graph()->mutable_ops(0)->set_outputs(0, s);
                    })});
  places.push_back({"op_input", square([](v1::GradRequest& r, const std::string& s) {
                      r.mutable_graph()->mutable_ops(0)->set_inputs(1, s);
                    })});
  places.push_back({"leaf", square([](v1::GradRequest& r, const std::string& s) {
                      r.mutable_graph()->mutable_leaves(0)->set_name(s);
                    })});
  places.push_back({"attribute_name", square([](v1::GradRequest& r, const std::string& s) {
                      (*r.mutable_graph()->mutable_ops(1)->mutable_attrs())[s].set_i(0);
                    })});
  places.push_back({"string_attribute", square([](v1::GradRequest& r, const std::string& s) {
                      v1::Op* gelu = r.mutable_graph()->add_ops();
                      gelu->set_op("gelu");
                      gelu->add_inputs("x");
                      gelu->add_outputs("g");
                      (*gelu->mutable_attrs())["approximate"].set_s(s);
                    })});
  places.push_back({"device", square([](v1::GradRequest& r, const std::string& s) {
                      r.mutable_graph()->mutable_leaves(0)->mutable_value()->set_device(s);
                    })});
  places.push_back({"request_id",
                    square([](v1::GradRequest& r, const std::string& s) { r.set_request_id(s); })});
  places.push_back({"return_value", square([](v1::GradRequest& r, const std::string& s) {
                      r.add_return_values(s);
                    })});
  places.push_back({"call_root", square([](v1::GradRequest& r, const std::string& s) {
                      r.mutable_calls(0)->set_roots(0, s);
                    })});
  places.push_back({"call_input", square([](v1::GradRequest& r, const std::string& s) {
                      r.mutable_calls(0)->set_inputs(0, s);
                    })});
  places.push_back({"seed_name", square([](v1::GradRequest& r, const std::string& s) {
                      HostTensor::Float32({1}, {}).ToProto(
                          &(*r.mutable_calls(0)->mutable_seeds())[s]);
                    })});
  places.push_back({"hook_kind", square([](v1::GradRequest& r, const std::string& s) {
                      v1::Op* hook = r.mutable_graph()->add_ops();
                      hook->set_op("hook");
                      hook->add_inputs("x");
                      (*hook->mutable_attrs())["kind"].set_s(s);
                    })});
  places.push_back({"body_input", square([](v1::GradRequest& r, const std::string& s) {
                      v1::Op* c = r.mutable_graph()->add_ops();
                      c->set_op("checkpoint");
                      c->add_inputs("x");
                      c->add_outputs("c");
                      v1::Graph* body = c->mutable_body();
                      body->add_inputs(s);
                      body->add_outputs(s);
                    })});
  return places;
}

// bytes as one streamed call, in chunks of at most 256 KiB.
std::vector<std::string> Chunks(const std::string& bytes) {
  std::vector<std::string> chunks;
  for (size_t at = 0; at == 0 || at < bytes.size(); at += 256 << 10) {
    v1::Chunk chunk;
    chunk.set_data(bytes.substr(at, 256 << 10));
    if (at == 0) chunk.set_total_bytes(static_cast<int64_t>(bytes.size()));
    chunks.push_back(chunk.SerializeAsString());
  }
  return chunks;
}

class ClientStringsTest : public ::testing::Test {
 protected:
  // The request sent both ways, the status of each.
  std::vector<grpc::Status> SendBothWays(const v1::GradRequest& request) {
    const std::string bytes = request.SerializeAsString();
    return {SendUnaryBytes(server_.client().channel(), bytes),
            SendStreamMessages(server_.client().channel(), Chunks(bytes))};
  }

  TestServer server_;
};

// Note [Attributes in a deterministic order]: an op with several bad attributes names the first
// by name, every time (the fuzzer sent the same bytes twice and got 'dim' once, 'length' once).
TEST_F(ClientStringsTest, SeveralBadAttributesAlwaysNameTheFirstByName) {
  v1::GradRequest r = SquareRequest();
  v1::Op* op = r.mutable_graph()->mutable_ops(0);
  for (const char* name : {"length", "dim", "start", "zeta", "alpha_not_set"}) {
    (*op->mutable_attrs())[name];  // an AttrValue with no value set
  }
  for (int i = 0; i < 20; ++i) {
    for (const grpc::Status& status : SendBothWays(r)) {
      EXPECT_EQ(status.error_code(), grpc::StatusCode::INVALID_ARGUMENT) << status.error_message();
      EXPECT_TRUE(
          absl::StrContains(status.error_message(), "attribute 'alpha_not_set' has no value"))
          << status.error_message();
    }
  }
}

// The same for a call's seeds: several seeds for names that are not roots name the first by
// name (the fuzzer's second find of this kind: 'rsqrt' once, 'bn2_bias' once).
TEST_F(ClientStringsTest, SeveralSeedsForNoRootAlwaysNameTheFirstByName) {
  v1::GradRequest r = SquareRequest();
  ASSERT_GT(r.calls_size(), 0);
  for (const char* name : {"rsqrt", "bn2_bias", "zz", "b_first", "mid"}) {
    v1::Tensor& seed = (*r.mutable_calls(0)->mutable_seeds())[name];
    seed.set_dtype(v1::DTYPE_FLOAT32);
  }
  for (int i = 0; i < 20; ++i) {
    for (const grpc::Status& status : SendBothWays(r)) {
      EXPECT_EQ(status.error_code(), grpc::StatusCode::INVALID_ARGUMENT) << status.error_message();
      EXPECT_TRUE(absl::StrContains(status.error_message(), "seed given for 'b_first'"))
          << status.error_message();
    }
  }
}

TEST_F(ClientStringsTest, LongNamesAreInvalidArgumentWithAShortMessage) {
  for (const size_t length : {size_t{4} << 10, size_t{1} << 20}) {
    for (const Place& place : Places()) {
      SCOPED_TRACE(absl::StrCat(place.name, ", ", length, " bytes"));
      for (const grpc::Status& status : SendBothWays(place.make(std::string(length, 'n')))) {
        EXPECT_EQ(status.error_code(), grpc::StatusCode::INVALID_ARGUMENT)
            << status.error_message();
        EXPECT_TRUE(absl::StrContains(status.error_message(), "--max_name_bytes"))
            << status.error_message();
        EXPECT_TRUE(absl::StrContains(status.error_message(), absl::StrCat("(", length, " bytes)")))
            << status.error_message();
        EXPECT_LT(status.error_message().size(), 512u) << status.error_message();
      }
    }
  }
  // The client library says the same.
  v1::GradRequest r = SquareRequest();
  r.mutable_graph()->mutable_ops(0)->set_op(std::string(4 << 10, 'o'));
  absl::StatusOr<v1::GradResponse> response = server_.client().ComputeGradients(r);
  EXPECT_EQ(response.status().code(), absl::StatusCode::kInvalidArgument) << response.status();
  EXPECT_TRUE(CheckSquareWorks(server_.client()).ok());
}

TEST_F(ClientStringsTest, NamesAtTheLimitAreFine) {
  const std::string name(256, 'x');
  v1::GradRequest r = SquareRequest();
  r.set_request_id(name);
  r.mutable_graph()->mutable_leaves(0)->set_name(name);
  for (v1::Op& op : *r.mutable_graph()->mutable_ops()) {
    for (std::string& input : *op.mutable_inputs()) {
      if (input == "x") input = name;
    }
  }
  r.mutable_calls(0)->set_inputs(0, name);
  absl::StatusOr<v1::GradResponse> response = server_.client().ComputeGradients(r);
  ASSERT_TRUE(response.ok()) << response.status();
  EXPECT_EQ(response->request_id(), name);
}

TEST_F(ClientStringsTest, ControlBytesComeBackEscaped) {
  static constexpr char kEvil[] = "x\n1999-12-31T23:59:59.000+00:00 forged\r\x1b[2J\t\x7f";
  const std::string evil(kEvil, sizeof(kEvil) - 1);
  int failed = 0, quoted = 0;
  for (const Place& place : Places()) {
    SCOPED_TRACE(place.name);
    for (const grpc::Status& status : SendBothWays(place.make(evil))) {
      // Some places take any name (a request id); others fail on another name (a leaf renamed
      // leaves its readers dangling).
      if (status.ok()) continue;
      ++failed;
      EXPECT_EQ(status.error_code(), grpc::StatusCode::INVALID_ARGUMENT) << status.error_message();
      EXPECT_FALSE(HasRawByte(status.error_message())) << status.error_message();
      quoted += absl::StrContains(status.error_message(),
                                  "'x\\n1999-12-31T23:59:59.000+00:00 "
                                  "forged\\r\\x1b[2J\\t\\x7f'");
    }
  }
  EXPECT_GE(failed, 20);
  EXPECT_GE(quoted, 16);
  // An op whose attribute the op itself reads: reduction, checked when the op runs.
  RequestBuilder b;
  b.Leaf("x", HostTensor::Float32({1, 2}, {2}), true)
      .Leaf("t", HostTensor::Float32({0, 1}, {2}))
      .Op("mse_loss", {"x", "t"}, {"loss"});
  (*b.mutable_request()->mutable_graph()->mutable_ops(0)->mutable_attrs())["reduction"].set_s(evil);
  b.Grad({"loss"}, {"x"});
  for (const grpc::Status& status : SendBothWays(b.request())) {
    EXPECT_EQ(status.error_code(), grpc::StatusCode::INVALID_ARGUMENT) << status.error_message();
    EXPECT_FALSE(HasRawByte(status.error_message())) << status.error_message();
  }
}

// A message that names a lot (here the 100,000 sizes of a shape) is cut, far below the 8 KiB a
// client takes in metadata.
TEST_F(ClientStringsTest, LongMessagesAreCut) {
  RequestBuilder b;
  b.Leaf("x", HostTensor::Float32({1, 2}, {2}), true);
  v1::Op* reshape = b.mutable_request()->mutable_graph()->add_ops();
  reshape->set_op("reshape");
  reshape->add_inputs("x");
  reshape->add_outputs("y");
  v1::IntList* shape = (*reshape->mutable_attrs())["shape"].mutable_ints();
  for (int i = 0; i < 100'000; ++i) shape->add_values(1);
  shape->add_values(-7);
  for (const grpc::Status& status : SendBothWays(b.request())) {
    EXPECT_EQ(status.error_code(), grpc::StatusCode::INVALID_ARGUMENT) << status.error_message();
    EXPECT_LE(status.error_message().size(), 2048u);
    EXPECT_TRUE(absl::StrContains(status.error_message(), "(message cut, "))
        << status.error_message();
  }
}

}  // namespace
}  // namespace gradserve::testing
