// Note [Unary messages reused]: a holder the thread used before reads each request as a fresh
// parse would, whatever the request before it held.

#include "server/unary_messages.h"

#include <string>
#include <vector>

#include "absl/strings/match.h"
#include "google/protobuf/text_format.h"
#include "google/protobuf/util/message_differencer.h"
#include "gtest/gtest.h"

namespace gradserve::server {
namespace {

// The serialized message in `pieces` slices of about equal size, as gRPC may deliver it.
grpc::ByteBuffer Bytes(const google::protobuf::MessageLite& message, size_t pieces = 1) {
  const std::string all = message.SerializeAsString();
  std::vector<grpc::Slice> slices;
  const size_t step = all.size() / pieces + 1;
  for (size_t at = 0; at < all.size(); at += step) {
    slices.emplace_back(all.substr(at, step));
  }
  return grpc::ByteBuffer(slices.data(), slices.size());
}

// A request with every field of GradRequest set, a checkpoint body, attributes, seeds and a
// field this server does not know.
v1::GradRequest Everything() {
  v1::GradRequest r;
  const bool parsed = google::protobuf::TextFormat::ParseFromString(
      R"pb(
        request_id: "everything"
        graph {
          leaves {
            name: "x"
            requires_grad: true
            value { dtype: DTYPE_FLOAT32 shape: 2 data: "\0\0\0\0\0\0\0\0" }
          }
          ops {
            op: "mul"
            inputs: "x"
            outputs: "y"
            attrs {
              key: "other"
              value { f: 2 }
            }
          }
          ops {
            op: "checkpoint"
            inputs: "y"
            outputs: "z"
            body {
              inputs: "a"
              ops { op: "tanh" inputs: "a" outputs: "b" }
              outputs: "b"
            }
          }
          outputs: "z"
        }
        calls {
          roots: "z"
          inputs: "x"
          seeds {
            key: "z"
            value {
              dtype: DTYPE_FLOAT64
              shape: 2
              values { doubles: [ 1, 1 ] }
            }
          }
          retain_graph: true
          create_graph: true
        }
        return_values: "y"
      )pb",
      &r);
  EXPECT_TRUE(parsed);
  r.GetReflection()->MutableUnknownFields(&r)->AddVarint(1000, 7);
  return r;
}

// Equal as a server reads them: an absent graph and an empty one are the same.
bool ReadsAs(const v1::GradRequest& got, v1::GradRequest want) {
  v1::GradRequest normalized = got;
  if (normalized.has_graph() && normalized.graph().ByteSizeLong() == 0) normalized.clear_graph();
  if (want.has_graph() && want.graph().ByteSizeLong() == 0) want.clear_graph();
  return google::protobuf::util::MessageDifferencer::Equals(normalized, want);
}

TEST(UnaryMessagesTest, EveryFieldOfTheRequestIsReset) {
  // Reset names GradRequest's fields one by one, to keep the objects under them: a field added
  // to the message must be added there too, or it would leak from one call into the next.
  EXPECT_EQ(v1::GradRequest::descriptor()->field_count(), 4)
      << "UnaryMessages::Reset must empty every field of gradserve.v1.GradRequest";
}

TEST(UnaryMessagesTest, AReusedHolderReadsEachRequestAsAFreshParse) {
  const v1::GradRequest everything = Everything();
  v1::GradRequest other;
  ASSERT_TRUE(google::protobuf::TextFormat::ParseFromString(R"pb(request_id: "other"
                                                                 calls { roots: "w" }
                                                                 return_values: "w")pb",
                                                            &other));

  UnaryMessages::Ptr first = UnaryMessages::Take();
  ASSERT_TRUE(first->ParseRequest(Bytes(everything, 3)).ok());
  EXPECT_TRUE(ReadsAs(first->request(), everything));
  EXPECT_EQ(first->request_bytes(), static_cast<int64_t>(everything.ByteSizeLong()));
  first->response()->set_request_id("answer");
  first->response()->add_calls()->add_gradients()->set_name("x");
  grpc::ByteBuffer sent;
  ASSERT_TRUE(first->SerializeResponse(&sent).ok());
  v1::GradResponse response;
  std::vector<grpc::Slice> slices;
  ASSERT_TRUE(sent.Dump(&slices).ok());
  std::string wire;
  for (const grpc::Slice& s : slices)
    wire.append(reinterpret_cast<const char*>(s.begin()), s.size());
  ASSERT_TRUE(response.ParseFromString(wire));
  EXPECT_EQ(response.request_id(), "answer");
  const UnaryMessages* const held = first.get();
  first.reset();  // back to this thread's cache

  UnaryMessages::Ptr second = UnaryMessages::Take();
  ASSERT_EQ(second.get(), held) << "the thread's cached holder";
  EXPECT_TRUE(ReadsAs(second->request(), v1::GradRequest()));
  EXPECT_EQ(second->response()->ByteSizeLong(), 0u);
  ASSERT_TRUE(second->ParseRequest(Bytes(other)).ok());
  EXPECT_TRUE(ReadsAs(second->request(), other));
  second.reset();

  UnaryMessages::Ptr third = UnaryMessages::Take();
  ASSERT_EQ(third.get(), held);
  ASSERT_TRUE(third->ParseRequest(Bytes(everything)).ok());
  EXPECT_TRUE(ReadsAs(third->request(), everything));
}

TEST(UnaryMessagesTest, MalformedBytesAreInvalidArgument) {
  UnaryMessages::Ptr messages = UnaryMessages::Take();
  static constexpr char kGarbage[] = "\xff\xff\xff\xff\x0f garbage";
  grpc::Slice slice(kGarbage, sizeof(kGarbage) - 1);
  absl::Status s = messages->ParseRequest(grpc::ByteBuffer(&slice, 1));
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument) << s;
  EXPECT_TRUE(absl::StrContains(s.message(), "malformed request: the 13 bytes")) << s;
  // What the failed parse left is reset with the holder.
  const UnaryMessages* const held = messages.get();
  messages.reset();
  UnaryMessages::Ptr again = UnaryMessages::Take();
  ASSERT_EQ(again.get(), held);
  v1::GradRequest small;
  small.set_request_id("after garbage");
  ASSERT_TRUE(again->ParseRequest(Bytes(small)).ok());
  EXPECT_TRUE(ReadsAs(again->request(), small));
}

}  // namespace
}  // namespace gradserve::server
