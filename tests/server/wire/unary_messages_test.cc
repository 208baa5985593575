// Note [Unary messages reused]: a holder the thread used before reads each request as a fresh
// parse would, whatever the request before it held.

#include "server/wire/unary_messages.h"

#include <random>
#include <string>
#include <vector>

#include "absl/strings/match.h"
#include "google/protobuf/io/coded_stream.h"
#include "google/protobuf/io/zero_copy_stream_impl_lite.h"
#include "google/protobuf/stubs/logging.h"
#include "google/protobuf/text_format.h"
#include "google/protobuf/util/message_differencer.h"
#include "google/protobuf/wire_format_lite.h"
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
        allow_tf32: true
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
  EXPECT_EQ(v1::GradRequest::descriptor()->field_count(), 5)
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

// Encodes a length-delimited field, for requests whose bytes a protobuf serializer would not
// write in that order.
std::string Field(int number, const std::string& payload) {
  std::string out;
  {
    google::protobuf::io::StringOutputStream stream(&out);
    google::protobuf::io::CodedOutputStream coded(&stream);
    google::protobuf::internal::WireFormatLite::WriteBytes(number, payload, &coded);
  }
  return out;
}

grpc::ByteBuffer Bytes(const std::string& wire) {
  grpc::Slice slice(wire);
  return grpc::ByteBuffer(&slice, 1);
}

// Note [Ops parsed once]: a holder that keeps its last request's ops reads every request as a
// fresh parse does, in any order: the same ops, other ops, the same ops with other leaves, ops
// spread among the graph's other fields, the graph field twice, no graph, and bytes that do
// not parse at all.
TEST(UnaryMessagesTest, KeptOpsReadAsAFreshParse) {
  const v1::GradRequest everything = Everything();
  v1::GradRequest other_leaves = everything;
  other_leaves.mutable_graph()->mutable_leaves(0)->set_name("renamed");
  other_leaves.set_request_id("other leaves");
  other_leaves.mutable_calls(0)->set_retain_graph(false);
  v1::GradRequest other_op = everything;
  other_op.mutable_graph()->mutable_ops(0)->set_op("add");  // as long as "mul"
  v1::GradRequest one_op = everything;
  one_op.mutable_graph()->mutable_ops()->RemoveLast();
  v1::GradRequest empty_graph;
  empty_graph.mutable_graph()->add_outputs("y");
  v1::GradRequest no_graph;
  no_graph.set_request_id("no graph");
  v1::GradRequest big = everything;  // parsed from gRPC's slices, not split
  big.mutable_graph()->mutable_leaves(0)->mutable_value()->set_data(
      std::string(UnaryMessages::kMaxReusedBytes, '\0'));

  // The graph's fields with ops among the leaves and outputs, and the graph field twice.
  const v1::Graph& g = everything.graph();
  auto graph_bytes = [](auto fill) {
    v1::Graph part;
    fill(part);
    return part.SerializeAsString();
  };
  const std::string op0 = graph_bytes([&](v1::Graph& p) { *p.add_ops() = g.ops(0); });
  const std::string op1 = graph_bytes([&](v1::Graph& p) { *p.add_ops() = g.ops(1); });
  const std::string leaves = graph_bytes([&](v1::Graph& p) { *p.mutable_leaves() = g.leaves(); });
  const std::string outputs =
      graph_bytes([&](v1::Graph& p) { *p.mutable_outputs() = g.outputs(); });
  v1::GradRequest rest = everything;
  rest.clear_graph();
  const std::string interleaved = Field(2, op1 + leaves + op0 + outputs) + rest.SerializeAsString();
  const std::string graph_twice =
      Field(2, op0 + leaves) + rest.SerializeAsString() + Field(2, op1 + outputs);
  static constexpr char kGarbage[] = "\x12\x05\x1a\x03\xff\xff";  // an op cut short

  const std::vector<std::string> requests = {
      everything.SerializeAsString(),
      everything.SerializeAsString(),
      other_leaves.SerializeAsString(),
      everything.SerializeAsString(),
      other_op.SerializeAsString(),
      other_op.SerializeAsString(),
      one_op.SerializeAsString(),
      everything.SerializeAsString(),
      interleaved,
      interleaved,
      everything.SerializeAsString(),
      graph_twice,
      graph_twice,
      kGarbage,
      everything.SerializeAsString(),
      empty_graph.SerializeAsString(),
      no_graph.SerializeAsString(),
      empty_graph.SerializeAsString(),
      big.SerializeAsString(),
      everything.SerializeAsString(),
      everything.SerializeAsString(),
      kGarbage,
      everything.SerializeAsString(),
  };
  for (size_t i = 0; i < requests.size(); ++i) {
    SCOPED_TRACE(testing::Message() << "request " << i);
    v1::GradRequest fresh;
    const bool parses = fresh.ParseFromString(requests[i]);
    UnaryMessages::Ptr messages = UnaryMessages::Take();
    const absl::Status parsed = messages->ParseRequest(Bytes(requests[i]));
    ASSERT_EQ(parsed.ok(), parses) << parsed;
    if (!parses) continue;
    EXPECT_TRUE(ReadsAs(messages->request(), fresh));
    // The op records it reports, for the graph cache, are those of the request's ops; only
    // the requests not split have none.
    const bool split = requests[i] != graph_twice && requests[i] != big.SerializeAsString();
    ASSERT_EQ(messages->op_records() != nullptr, split);
    if (split) {
      v1::GradRequest from_records;
      ASSERT_TRUE(from_records.mutable_graph()->ParseFromString(*messages->op_records()));
      v1::GradRequest ops_only;
      *ops_only.mutable_graph()->mutable_ops() = fresh.graph().ops();
      EXPECT_TRUE(ReadsAs(from_records, ops_only));
    }
  }
}

// Note [Ops parsed once], against bytes no serializer writes: each of 2,000 damaged copies of
// a request (a byte changed, bytes cut out, bytes repeated; from a fixed seed) is parsed by a
// holder that has just parsed the undamaged request, so its ops are kept, and reads as a
// fresh parse of the same bytes does, or fails where that fails.
TEST(UnaryMessagesTest, DamagedBytesReadAsAFreshParse) {
  const std::string good = Everything().SerializeAsString();
  const google::protobuf::LogSilencer quiet;  // protobuf logs each string that is not UTF-8
  std::mt19937 random(20261123);
  auto below = [&random](size_t n) { return static_cast<size_t>(random() % n); };
  int parsed = 0;
  for (int i = 0; i < 2000; ++i) {
    std::string damaged = good;
    switch (i % 3) {
      case 0:
        damaged[below(damaged.size())] = static_cast<char>(random());
        break;
      case 1:
        damaged.erase(below(damaged.size()), 1 + below(8));
        break;
      default: {
        const size_t at = below(damaged.size());
        damaged.insert(at, damaged.substr(at, 1 + below(8)));
        break;
      }
    }
    SCOPED_TRACE(testing::Message() << "damaged copy " << i);
    {
      UnaryMessages::Ptr messages = UnaryMessages::Take();
      ASSERT_TRUE(messages->ParseRequest(Bytes(good)).ok());
    }
    v1::GradRequest fresh;
    const bool parses = fresh.ParseFromString(damaged);
    UnaryMessages::Ptr messages = UnaryMessages::Take();
    const absl::Status status = messages->ParseRequest(Bytes(damaged));
    ASSERT_EQ(status.ok(), parses) << status;
    if (parses) {
      ++parsed;
      ASSERT_TRUE(ReadsAs(messages->request(), fresh));
    }
  }
  // Both outcomes were seen: the damage was not all fatal, nor all harmless.
  EXPECT_GT(parsed, 100);
  EXPECT_LT(parsed, 1900);
}

TEST(UnaryMessagesTest, TheSameOpsAreParsedOnce) {
  const v1::GradRequest request = Everything();
  UnaryMessages::Ptr first = UnaryMessages::Take();
  ASSERT_TRUE(first->ParseRequest(Bytes(request)).ok());
  const v1::Op* const parsed_op = &first->request().graph().ops(0);
  const UnaryMessages* const held = first.get();
  first.reset();

  v1::GradRequest new_leaves = request;
  new_leaves.mutable_graph()->mutable_leaves(0)->mutable_value()->set_data(std::string(8, '\1'));
  UnaryMessages::Ptr second = UnaryMessages::Take();
  ASSERT_EQ(second.get(), held);
  ASSERT_TRUE(second->ParseRequest(Bytes(new_leaves, 2)).ok());
  EXPECT_TRUE(ReadsAs(second->request(), new_leaves));
  EXPECT_EQ(&second->request().graph().ops(0), parsed_op) << "the kept op, not parsed again";
}

// The request log's id for a request that is not parsed: request_id if it comes first and
// whole in the first slice, at most kMaxPeekedIdBytes of it; else empty.
TEST(UnaryMessagesTest, PeekRequestIdReadsOnlyALeadingId) {
  v1::GradRequest request = Everything();
  EXPECT_EQ(UnaryMessages::PeekRequestId(Bytes(request)), "everything");
  // Garbage after the id does not matter: nothing else is read.
  EXPECT_EQ(UnaryMessages::PeekRequestId(Bytes(Field(1, "first") + "\xff\xff")), "first");
  request.set_request_id(std::string(100, 'i'));
  EXPECT_EQ(UnaryMessages::PeekRequestId(Bytes(request)),
            std::string(UnaryMessages::kMaxPeekedIdBytes, 'i'));
  request.clear_request_id();
  EXPECT_EQ(UnaryMessages::PeekRequestId(Bytes(request)), "");
  EXPECT_EQ(UnaryMessages::PeekRequestId(Bytes(std::string("\xff\xff\xff"))), "");
  EXPECT_EQ(UnaryMessages::PeekRequestId(Bytes(std::string("\x0a\x10"
                                                           "cut"))),
            "");
  // An id cut between two slices (of more than gRPC's 23 inlined bytes, so not merged).
  const std::string split = Field(1, std::string(60, 's'));
  const grpc::Slice halves[] = {grpc::Slice(split.substr(0, 30)), grpc::Slice(split.substr(30))};
  EXPECT_EQ(UnaryMessages::PeekRequestId(grpc::ByteBuffer(halves, 2)), "");
  const grpc::Slice whole[] = {grpc::Slice(split), grpc::Slice(std::string(30, '\xff'))};
  EXPECT_EQ(UnaryMessages::PeekRequestId(grpc::ByteBuffer(whole, 2)), std::string(60, 's'));
}

}  // namespace
}  // namespace gradserve::server
