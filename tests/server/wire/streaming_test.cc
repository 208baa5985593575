// ComputeGradientsStream without joining chunks: the request parsed from its chunks with big
// tensor bytes left in place, the response spliced from the engine's tensors into its chunks
// (Note [Tensor bytes left in the chunks], Note [Zero-copy streaming]), and the stream limits.

#include <atomic>
#include <chrono>
#include <cstring>
#include <memory>
#include <optional>
#include <set>
#include <string>
#include <thread>
#include <vector>

#include "absl/strings/match.h"
#include "engine/util/parallel.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "proto/chunk_slices.h"
#include "proto/chunking.h"
#include "server/wire/chunked_request.h"
#include "server/wire/unary_messages.h"
#include "server/wire/wire.h"
#include "tests/server/test_util.h"

namespace gradserve::testing {
namespace {

using ::testing::ElementsAre;

std::vector<float> Ramp(int n, float scale) {
  std::vector<float> v(n);
  for (int i = 0; i < n; ++i) v[i] = static_cast<float>(i % 997) * scale - 3;
  return v;
}

// Cuts bytes into chunks of the given sizes, cycling through them.
server::ChunkedRequest Cut(const std::string& bytes, const std::vector<size_t>& sizes) {
  server::ChunkedRequest chunked;
  size_t offset = 0;
  for (size_t i = 0; offset < bytes.size(); ++i) {
    const size_t n = std::min(sizes[i % sizes.size()], bytes.size() - offset);
    chunked.Append(bytes.substr(offset, n));
    offset += n;
  }
  return chunked;
}

std::string Gather(const server::ChunkedRequest::Bytes& bytes) {
  std::string out;
  for (const auto& piece : bytes.pieces) out.append(piece.data(), piece.size);
  return out;
}

// A request with big tensors in a leaf, in a checkpoint body's leaf and in a seed (a map
// value), and a small one that stays inline.
v1::GradRequest BigRequest(int n) {
  RequestBuilder b;
  b.Leaf("x", HostTensor::Float32(Ramp(n, 0.5f), {n}), true)
      .Leaf("small", HostTensor::Float32({1, 2, 3}, {3}))
      .Op("mul", {"x"}, {"y"}, {{"other", client::FloatAttr(3)}});
  v1::BackwardCall& call = b.Grad({"y"}, {"x"});
  HostTensor::Float32(Ramp(n, 0.25f), {n}).ToProto(&(*call.mutable_seeds())["y"]);
  b.ReturnValue("y");
  return b.request();
}

// BigRequest(n)'s result: x's gradient is 3 * the seed, y is 3 * x, each exactly.
void ExpectBigResult(const client::GradResult& r, int n) {
  const std::vector<float> x = Ramp(n, 0.5f), seed = Ramp(n, 0.25f);
  const std::vector<double> g = r.calls[0].gradients[0].value->ToDoubles();
  const std::vector<double> y = r.values[0].second.ToDoubles();
  ASSERT_EQ(g.size(), static_cast<size_t>(n));
  ASSERT_EQ(y.size(), static_cast<size_t>(n));
  for (int i = 0; i < n; ++i) {
    ASSERT_EQ(g[i], static_cast<float>(3 * seed[i])) << i;
    ASSERT_EQ(y[i], static_cast<float>(3 * x[i])) << i;
  }
}

TEST(ChunkedRequestTest, BigTensorBytesStayInTheChunksAcrossOddBoundaries) {
  const int n = 10007;  // 40 028 bytes: over kMinExternalBytes
  const v1::GradRequest request = BigRequest(n);
  const std::string bytes = request.SerializeAsString();
  for (const std::vector<size_t>& sizes :
       std::vector<std::vector<size_t>>{{1}, {7, 3}, {333}, {4096, 1, 13}, {bytes.size()}}) {
    server::ChunkedRequest chunked = Cut(bytes, sizes);
    v1::GradRequest parsed;
    ASSERT_TRUE(chunked.Parse(&parsed).ok()) << sizes[0];
    const v1::Tensor& x = parsed.graph().leaves(0).value();
    const server::ChunkedRequest::Bytes* x_bytes = chunked.Find(x);
    ASSERT_NE(x_bytes, nullptr);
    EXPECT_EQ(Gather(*x_bytes), request.graph().leaves(0).value().data());
    const v1::Tensor& seed = parsed.calls(0).seeds().at("y");
    ASSERT_NE(chunked.Find(seed), nullptr);
    EXPECT_EQ(Gather(*chunked.Find(seed)), request.calls(0).seeds().at("y").data());
    // The small tensor is inline, and everything else is as sent.
    EXPECT_EQ(chunked.Find(parsed.graph().leaves(1).value()), nullptr);
    v1::GradRequest expected = request;
    expected.mutable_graph()->mutable_leaves(0)->mutable_value()->clear_data();
    (*expected.mutable_calls(0)->mutable_seeds())["y"].clear_data();
    v1::GradRequest skeleton = parsed;
    skeleton.mutable_graph()->mutable_leaves(0)->mutable_value()->DiscardUnknownFields();
    (*skeleton.mutable_calls(0)->mutable_seeds())["y"].DiscardUnknownFields();
    expected.mutable_graph()->mutable_leaves(0)->mutable_value()->set_data("");
    (*expected.mutable_calls(0)->mutable_seeds())["y"].set_data("");
    EXPECT_EQ(skeleton.SerializeAsString(), expected.SerializeAsString());

    // The engine's tensors get the same values as from the unary form.
    absl::StatusOr<server::EngineRequest> engine =
        server::FromProto(parsed, graph::Limits(), &chunked);
    ASSERT_TRUE(engine.ok()) << engine.status();
    const Tensor& leaf = engine->graph->leaves[0].value;
    ASSERT_EQ(leaf.numel(), n);
    EXPECT_EQ(std::memcmp(leaf.raw_data(), request.graph().leaves(0).value().data().data(),
                          leaf.nbytes()),
              0);
    // One piece: adopted where it lies, if aligned; several: gathered into a tensor of its own.
    if (x_bytes->pieces.size() > 1) {
      EXPECT_FALSE(leaf.storage()->adopted());
    }
  }
}

// Note [Gathered bytes split over threads]: a tensor of kParallelMinUnits bytes or more, in
// pieces cut at boundaries that do not line up with the copy's own chunks, gets every byte in
// its place, with one thread or several.
TEST(ChunkedRequestTest, BigTensorsGatheredByTheIntraOpThreadsKeepEveryByte) {
  const int n = 300007;  // 1.2 MB each for x and the seed: over kParallelMinUnits bytes
  static_assert(int64_t{300007} * 4 > kParallelMinUnits);
  const v1::GradRequest request = BigRequest(n);
  const std::string bytes = request.SerializeAsString();
  const int threads = IntraOpThreads();
  for (int use : {1, 2, 4}) {
    SetIntraOpThreads(use);
    for (const std::vector<size_t>& sizes : std::vector<std::vector<size_t>>{
             {1 << 20}, {65537, 1, 4099}, {(1 << 18) + 3}, {bytes.size()}}) {
      server::ChunkedRequest chunked = Cut(bytes, sizes);
      v1::GradRequest parsed;
      ASSERT_TRUE(chunked.Parse(&parsed).ok());
      absl::StatusOr<server::EngineRequest> engine =
          server::FromProto(parsed, graph::Limits(), &chunked);
      ASSERT_TRUE(engine.ok()) << engine.status();
      const Tensor& leaf = engine->graph->leaves[0].value;
      ASSERT_EQ(leaf.nbytes(), request.graph().leaves(0).value().data().size());
      EXPECT_EQ(std::memcmp(leaf.raw_data(), request.graph().leaves(0).value().data().data(),
                            leaf.nbytes()),
                0)
          << use << " threads, chunks of " << sizes[0];
      const Tensor& seed = engine->calls[0].seeds.at(0);
      const std::string& sent = request.calls(0).seeds().at("y").data();
      ASSERT_EQ(seed.nbytes(), sent.size());
      EXPECT_EQ(std::memcmp(seed.raw_data(), sent.data(), sent.size()), 0)
          << use << " threads, chunks of " << sizes[0];
    }
  }
  SetIntraOpThreads(threads);
}

TEST(ChunkedRequestTest, LastDataFieldWinsAndClientMarkersAreDropped) {
  v1::Tensor t;
  t.set_dtype(v1::DTYPE_FLOAT32);
  t.add_shape(1);
  // A client's own marker field, a big data field, then an inline one that replaces it.
  t.GetReflection()->MutableUnknownFields(&t)->AddVarint(server::ChunkedRequest::kExternalDataField,
                                                         1);
  std::string wire = t.SerializeAsString();
  v1::Tensor big;
  big.set_data(std::string(server::ChunkedRequest::kMinExternalBytes, 'a'));
  v1::Tensor small;
  small.set_data(std::string("\0\0\x80\x3f", 4));  // 1.0f
  wire += big.SerializeAsString() + small.SerializeAsString();
  v1::GradRequest request;
  v1::Leaf* leaf = request.mutable_graph()->add_leaves();
  leaf->set_name("x");
  const std::string leaf_head = leaf->SerializeAsString();
  // Leaf{name, value=wire}, inside GradRequest.graph.leaves.
  std::string leaf_bytes = leaf_head;
  leaf_bytes += '\x12';  // Leaf.value, length-delimited
  google::protobuf::io::StringOutputStream sink(&leaf_bytes);
  {
    google::protobuf::io::CodedOutputStream out(&sink);
    out.WriteVarint32(static_cast<uint32_t>(wire.size()));
    out.WriteString(wire);
  }
  v1::Graph graph_shell;
  std::string graph_bytes = "\x12";  // Graph.leaves
  {
    google::protobuf::io::StringOutputStream s(&graph_bytes);
    google::protobuf::io::CodedOutputStream out(&s);
    out.WriteVarint32(static_cast<uint32_t>(leaf_bytes.size()));
    out.WriteString(leaf_bytes);
  }
  std::string request_bytes = "\x12";  // GradRequest.graph
  {
    google::protobuf::io::StringOutputStream s(&request_bytes);
    google::protobuf::io::CodedOutputStream out(&s);
    out.WriteVarint32(static_cast<uint32_t>(graph_bytes.size()));
    out.WriteString(graph_bytes);
  }
  v1::GradRequest direct;
  ASSERT_TRUE(direct.ParseFromString(request_bytes));
  ASSERT_EQ(direct.graph().leaves(0).value().data().size(), 4u);

  server::ChunkedRequest chunked = Cut(request_bytes, {5});
  v1::GradRequest parsed;
  ASSERT_TRUE(chunked.Parse(&parsed).ok());
  const v1::Tensor& value = parsed.graph().leaves(0).value();
  EXPECT_EQ(value.data(), direct.graph().leaves(0).value().data());
  EXPECT_EQ(chunked.Find(value), nullptr);
}

// Messages within messages are rewritten in place, their lengths patched: a big leaf at the
// bottom of nested checkpoint bodies comes through, and nesting past protobuf's limit is refused.
TEST(ChunkedRequestTest, NestedMessagesKeepTheirBytesAndDepthIsBounded) {
  auto nested = [](int depth) {
    v1::GradRequest request;
    v1::Graph* g = request.mutable_graph();
    for (int i = 0; i < depth; ++i) {
      v1::Op* op = g->add_ops();
      op->set_op("checkpoint");
      g = op->mutable_body();
    }
    v1::Leaf* leaf = g->add_leaves();
    leaf->set_name("deep");
    HostTensor::Float32(Ramp(5000, 1), {5000}).ToProto(leaf->mutable_value());
    return request;
  };
  const v1::GradRequest request = nested(40);
  server::ChunkedRequest chunked = Cut(request.SerializeAsString(), {999});
  v1::GradRequest parsed;
  ASSERT_TRUE(chunked.Parse(&parsed).ok());
  const v1::Graph* g = &parsed.graph();
  const v1::Graph* original = &request.graph();
  for (int i = 0; i < 40; ++i) {
    g = &g->ops(0).body();
    original = &original->ops(0).body();
  }
  ASSERT_NE(chunked.Find(g->leaves(0).value()), nullptr);
  EXPECT_EQ(Gather(*chunked.Find(g->leaves(0).value())), original->leaves(0).value().data());

  server::ChunkedRequest too_deep = Cut(nested(60).SerializeAsString(), {999});
  absl::Status s = too_deep.Parse(&parsed);
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument) << s;
  EXPECT_TRUE(absl::StrContains(s.message(), "nested too deep")) << s;
}

TEST(ChunkedRequestTest, MalformedStreamsAreInvalidArgument) {
  const std::string bytes = BigRequest(5000).SerializeAsString();
  for (size_t cut : {size_t{1}, size_t{7}, bytes.size() / 2, bytes.size() - 1}) {
    server::ChunkedRequest chunked = Cut(bytes.substr(0, cut), {100});
    v1::GradRequest parsed;
    absl::Status s = chunked.Parse(&parsed);
    EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument) << cut;
    EXPECT_TRUE(absl::StrContains(s.message(), "malformed")) << s;
  }
  server::ChunkedRequest group = Cut(std::string("\x0b\x0c", 2), {1});  // a group
  v1::GradRequest parsed;
  EXPECT_EQ(group.Parse(&parsed).code(), absl::StatusCode::kInvalidArgument);
}

// Note [Unary tensor bytes taken]: a request protobuf parsed whole gives its big strings'
// buffers to the side table (no copy), and a client's own markers never name another tensor's
// bytes.
TEST(ChunkedRequestTest, TakeFromMovesBigBytesAndDropsClientMarkers) {
  const int n = 10007;
  v1::GradRequest request = BigRequest(n);
  // A client's marker on the small tensor, and on a tensor with no bytes: neither may come to
  // stand for the big leaf's bytes (marker 1).
  v1::Tensor* small = request.mutable_graph()->mutable_leaves(1)->mutable_value();
  small->GetReflection()->MutableUnknownFields(small)->AddVarint(
      server::ChunkedRequest::kExternalDataField, 1);
  v1::Leaf* empty = request.mutable_graph()->add_leaves();
  empty->set_name("empty");
  empty->mutable_value()->set_dtype(v1::DTYPE_FLOAT32);
  empty->mutable_value()->add_shape(n);
  empty->mutable_value()->set_data("");
  empty->mutable_value()
      ->GetReflection()
      ->MutableUnknownFields(empty->mutable_value())
      ->AddVarint(server::ChunkedRequest::kExternalDataField, 1);
  const std::string x_bytes = request.graph().leaves(0).value().data();
  const char* x_buffer = request.graph().leaves(0).value().data().data();
  const std::string seed_bytes = request.calls(0).seeds().at("y").data();

  server::ChunkedRequest taken;
  EXPECT_EQ(taken.TakeFrom(&request), 2);
  const v1::Tensor& x = request.graph().leaves(0).value();
  EXPECT_TRUE(x.data().empty());
  const server::ChunkedRequest::Bytes* found = taken.Find(x);
  ASSERT_NE(found, nullptr);
  ASSERT_EQ(found->pieces.size(), 1u);
  EXPECT_EQ(found->pieces[0].data(), x_buffer);  // moved, not copied
  EXPECT_EQ(Gather(*found), x_bytes);
  ASSERT_NE(taken.Find(request.calls(0).seeds().at("y")), nullptr);
  EXPECT_EQ(Gather(*taken.Find(request.calls(0).seeds().at("y"))), seed_bytes);
  EXPECT_EQ(taken.Find(request.graph().leaves(1).value()), nullptr);
  EXPECT_EQ(taken.Find(request.graph().leaves(2).value()), nullptr);

  // The leaf adopts the moved buffer; the empty tensor's bytes are missing, not x's.
  absl::StatusOr<server::EngineRequest> engine =
      server::FromProto(request, graph::Limits(), &taken);
  ASSERT_FALSE(engine.ok());
  EXPECT_EQ(engine.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(std::string(engine.status().message()), ::testing::HasSubstr("'empty'"));
  request.mutable_graph()->mutable_leaves()->RemoveLast();
  engine = server::FromProto(request, graph::Limits(), &taken);
  ASSERT_TRUE(engine.ok()) << engine.status();
  const Tensor& leaf = engine->graph->leaves[0].value;
  EXPECT_TRUE(leaf.storage()->adopted());
  EXPECT_EQ(leaf.raw_data(), x_buffer);
  EXPECT_EQ(std::memcmp(leaf.raw_data(), x_bytes.data(), x_bytes.size()), 0);
}

TEST(ChunkedResponseTest, SlicesCarryTheTensorsWithoutACopy) {
  const int n = 12345;
  Tensor grad = Tensor::FromVector(Ramp(n, 2), {n});
  const void* grad_memory = grad.raw_data();
  v1::GradResponse response;
  response.set_request_id("r");
  auto deferred = std::make_unique<server::ChunkedResponse>();
  server::ToProto(grad, response.add_calls()->add_gradients()->mutable_value(), deferred.get());
  server::ToProto(Tensor::FromVector<float>({1, 2}, {2}),
                  response.mutable_calls(0)->add_gradients()->mutable_value(), deferred.get());
  response.mutable_calls(0)->mutable_gradients(0)->set_name("x");
  response.set_num_nodes(3);
  EXPECT_FALSE(deferred->empty());
  v1::GradResponse expected = response;
  v1::Tensor* expected_value = expected.mutable_calls(0)->mutable_gradients(0)->mutable_value();
  expected_value->DiscardUnknownFields();
  server::ToProto(grad, expected_value);

  std::vector<grpc::Slice> slices;
  ASSERT_TRUE(deferred->SerializeToSlices(response, &slices));
  // The slices own their tensor: the gradient and the deferral may go first.
  deferred.reset();
  grad = Tensor();
  std::string joined;
  bool tensor_in_place = false;
  for (const grpc::Slice& slice : slices) {
    tensor_in_place |= static_cast<const void*>(slice.begin()) == grad_memory &&
                       slice.size() == static_cast<size_t>(n) * 4;
    joined.append(reinterpret_cast<const char*>(slice.begin()), slice.size());
  }
  EXPECT_TRUE(tensor_in_place);
  // The data field comes where the marker was (after device): the same message.
  v1::GradResponse parsed;
  ASSERT_TRUE(parsed.ParseFromString(joined));
  EXPECT_EQ(joined.size(), expected.ByteSizeLong());
  EXPECT_EQ(parsed.SerializeAsString(), expected.SerializeAsString());
}

TEST(ChunkedResponseTest, ATensorOfOneValueIsSlicesOfOneBlock) {
  // Note [A gradient of one value]: 70001 doubles of 0.25, every stride 0; 560 008 bytes are
  // two whole blocks and a part of one.
  const int n = 70001;
  const Tensor grad = Tensor::FromVector<double>({0.25}, {1}).AsStrided({n}, {0}, 0);
  ASSERT_TRUE(grad.repeats_one_value());
  const size_t block = server::ChunkedResponse::RepeatedBlockBytes(grad.nbytes());
  EXPECT_EQ(block, size_t{256} << 10);
  v1::GradResponse response;
  auto deferred = std::make_unique<server::ChunkedResponse>();
  // What the response makes: the block, where packing it made all of it.
  EXPECT_EQ(server::ToProtoNewBytes(grad, deferred.get()), static_cast<int64_t>(block));
  EXPECT_EQ(server::ToProtoNewBytes(grad, nullptr), static_cast<int64_t>(grad.nbytes()));
  server::ToProto(grad, response.add_calls()->add_gradients()->mutable_value(), deferred.get());
  EXPECT_EQ(deferred->DeferredBytes(), grad.nbytes());
  v1::GradResponse expected = response;
  v1::Tensor* expected_value = expected.mutable_calls(0)->mutable_gradients(0)->mutable_value();
  expected_value->DiscardUnknownFields();
  server::ToProto(grad, expected_value);  // packed

  std::vector<grpc::Slice> slices;
  ASSERT_TRUE(deferred->SerializeToSlices(response, &slices));
  deferred.reset();
  std::string joined;
  std::set<const void*> block_starts;
  size_t in_blocks = 0;
  for (const grpc::Slice& slice : slices) {
    if (slice.size() >= (size_t{16} << 10)) {
      block_starts.insert(slice.begin());
      in_blocks += slice.size();
    }
    joined.append(reinterpret_cast<const char*>(slice.begin()), slice.size());
  }
  EXPECT_EQ(block_starts.size(), 1u) << "every slice of the tensor is the one block";
  EXPECT_EQ(in_blocks, grad.nbytes());
  v1::GradResponse parsed;
  ASSERT_TRUE(parsed.ParseFromString(joined));
  EXPECT_EQ(joined.size(), expected.ByteSizeLong());
  EXPECT_TRUE(parsed.SerializeAsString() == expected.SerializeAsString());
}

// One value's gradient, streamed in small chunks and taken from a unary call: every element.
TEST(StreamingTest, AGradientOfOneValueRoundTripsWhole) {
  server::ServerOptions options = TestOptions();
  options.chunk_bytes = 100003;
  TestServer server(options);
  const int n = 300007;  // 1.2 MB: four blocks and a part
  RequestBuilder b;
  b.Leaf("x", HostTensor::Float32(Ramp(n, 0.5f), {n}), true)
      .Op("mul", {"x"}, {"y"}, {{"other", client::FloatAttr(3)}})
      .Op("sum", {"y"}, {"loss"});
  b.Grad({"loss"}, {"x"});
  for (const auto transport :
       {client::CallOptions::Transport::kUnary, client::CallOptions::Transport::kStream}) {
    client::CallOptions call;
    call.transport = transport;
    absl::StatusOr<client::GradResult> r = server.client().Grad(b.request(), call);
    ASSERT_TRUE(r.ok()) << r.status();
    const std::vector<double> g = r->calls[0].gradients[0].value->ToDoubles();
    ASSERT_EQ(g.size(), static_cast<size_t>(n));
    EXPECT_THAT(g, ::testing::Each(3.0));
  }
}

// End to end over a unary call big enough to have its bytes taken (Note [Unary tensor bytes
// taken]): the same gradients and values as the streamed form, bit for bit.
TEST(StreamingTest, BigUnaryRequestWithTakenBytesRoundTrip) {
  TestServer server;
  auto client = client::Client::Connect(server.target());
  const int n = 300007;  // 1.2 MB: over UnaryMessages::kMinTakenBytes
  const v1::GradRequest request = BigRequest(n);
  ASSERT_GE(request.ByteSizeLong(), server::UnaryMessages::kMinTakenBytes);
  client::CallOptions unary;
  unary.transport = client::CallOptions::Transport::kUnary;
  for (int round = 0; round < 3; ++round) {  // and a holder of the thread's used again
    absl::StatusOr<client::GradResult> r = client->Grad(request, unary);
    ASSERT_TRUE(r.ok()) << r.status();
    ExpectBigResult(*r, n);
  }
}

// Note [Zero-copy streaming]: a message serialized into slices, cut into Chunk frames, read
// back from the frames and parsed is the message; its big bytes are slices over its own
// strings, held until every slice is let go; each frame is the bytes protobuf writes for it.
TEST(ChunkingTest, SlicesCutIntoChunksAndReadBackAcrossChunkSizes) {
  const v1::GradRequest request = BigRequest(3001);  // 12 KB tensors: copied into blocks
  const v1::GradRequest big = BigRequest(30001);     // 120 KB tensors: aliased
  for (const v1::GradRequest* message : {&request, &big}) {
    for (int64_t chunk_bytes : {int64_t{1}, int64_t{17}, int64_t{65536}, int64_t{1} << 30}) {
      chunking::AliasedSlices aliased;
      std::vector<grpc::Slice> slices;
      ASSERT_TRUE(chunking::SerializeToSlices(*message, &aliased, &slices));
      std::string joined;
      bool aliases_leaf = false;
      const std::string& leaf = message->graph().leaves(0).value().data();
      for (const grpc::Slice& slice : slices) {
        joined.append(reinterpret_cast<const char*>(slice.begin()), slice.size());
        aliases_leaf |= reinterpret_cast<const char*>(slice.begin()) == leaf.data();
      }
      ASSERT_EQ(joined, message->SerializeAsString());
      EXPECT_EQ(aliases_leaf, leaf.size() > chunking::kSliceBlockBytes) << leaf.size();

      const int64_t total = static_cast<int64_t>(joined.size());
      std::vector<grpc::ByteBuffer> frames = chunking::CutIntoChunks(slices, chunk_bytes, total);
      slices.clear();
      EXPECT_EQ(frames.size(), static_cast<size_t>((total + chunk_bytes - 1) / chunk_bytes));
      std::vector<grpc::Slice> data;
      for (size_t k = 0; k < frames.size(); ++k) {
        v1::Chunk expected;
        expected.set_data(joined.substr(k * chunk_bytes, chunk_bytes));
        expected.set_total_bytes(k == 0 ? total : 0);
        ASSERT_EQ(Flatten(frames[k]), expected.SerializeAsString()) << k;
        ASSERT_TRUE(chunking::AppendChunkData(frames[k], &data));
      }
      frames.clear();
      v1::GradRequest parsed;
      ASSERT_TRUE(chunking::ParseFromSlices(data, &parsed));
      EXPECT_EQ(parsed.SerializeAsString(), joined) << chunk_bytes;
    }  // ~AliasedSlices: every slice was let go, so this returns
  }
  // An empty message is one empty frame, which reads back as the empty message.
  chunking::AliasedSlices aliased;
  std::vector<grpc::Slice> slices;
  ASSERT_TRUE(chunking::SerializeToSlices(v1::GradResponse(), &aliased, &slices));
  std::vector<grpc::ByteBuffer> frames = chunking::CutIntoChunks(slices, 10, 0);
  ASSERT_EQ(frames.size(), 1u);
  EXPECT_EQ(Flatten(frames[0]), "");
  std::vector<grpc::Slice> data;
  ASSERT_TRUE(chunking::AppendChunkData(frames[0], &data));
  v1::GradResponse parsed;
  parsed.set_request_id("left over");
  EXPECT_TRUE(chunking::ParseFromSlices(data, &parsed));
  EXPECT_EQ(parsed.SerializeAsString(), "");
}

// AliasedSlices waits for a slice that is still held elsewhere (as a gRPC thread may hold one
// a little after a call ends) and returns once it is let go.
TEST(ChunkingTest, AliasedSlicesWaitForTheLastSlice) {
  const std::string bytes(100, 'x');
  std::optional<grpc::Slice> held;
  std::atomic<bool> released{false};
  std::thread holder;
  {
    chunking::AliasedSlices aliased;
    held = aliased.Alias(bytes.data(), bytes.size());
    holder = std::thread([&] {
      std::this_thread::sleep_for(std::chrono::milliseconds(100));
      released = true;
      held.reset();
    });
  }
  EXPECT_TRUE(released);
  holder.join();
}

// Received frames are read as protobuf reads a Chunk: unknown fields skipped, the last data
// field kept; bytes that are no Chunk refused.
TEST(ChunkingTest, ChunkDataIsReadAsProtobufReadsIt) {
  auto frame = [](const std::string& bytes) {
    grpc::Slice slice(bytes);
    return grpc::ByteBuffer(&slice, 1);
  };
  v1::Chunk chunk;
  chunk.set_data("first");
  std::string bytes = chunk.SerializeAsString();
  bytes += std::string("\x18\x05", 2);              // field 3, varint 5
  bytes += std::string("\x25\x01\x02\x03\x04", 5);  // field 4, fixed32
  chunk.set_data("second");
  chunk.set_total_bytes(99);
  bytes += chunk.SerializeAsString();  // a second data field: it wins
  v1::Chunk parsed;
  ASSERT_TRUE(parsed.ParseFromString(bytes));
  std::vector<grpc::Slice> data;
  ASSERT_TRUE(chunking::AppendChunkData(frame(bytes), &data));
  std::string got;
  for (const grpc::Slice& s : data) got.append(reinterpret_cast<const char*>(s.begin()), s.size());
  EXPECT_EQ(got, parsed.data());
  for (const std::string& bad : {std::string("\xff\xff\xff\xff\x0f garbage"),
                                 std::string("\x0a\x05"
                                             "abc"),             // data cut short
                                 std::string("\x0b", 1),         // a group
                                 std::string("\x00\x01", 2)}) {  // field number 0
    EXPECT_FALSE(chunking::AppendChunkData(frame(bad), &data)) << bad;
  }
}

TEST(ChunkingTest, BufferPoolKeepsBigBuffersWithinItsBound) {
  chunking::BufferPool pool;
  EXPECT_EQ(pool.Take().capacity(), std::string().capacity());  // empty pool: a plain string
  std::string small;
  small.reserve(100);
  pool.Give(std::move(small));  // too small to keep
  EXPECT_LT(pool.Take().capacity(), chunking::BufferPool::kMinBytes);
  std::string big(chunking::BufferPool::kMinBytes * 2, 'x');
  const char* buffer = big.data();
  pool.Give(std::move(big));
  std::string reused = pool.Take();
  EXPECT_TRUE(reused.empty());
  EXPECT_EQ(reused.data(), buffer);
  // No more than kPoolBytes are kept.
  const size_t each = chunking::BufferPool::kMaxBytes;
  const size_t fits = chunking::BufferPool::kPoolBytes / each;
  for (size_t i = 0; i < fits + 2; ++i) {
    std::string s;
    s.reserve(each);
    pool.Give(std::move(s));
  }
  size_t kept = 0;
  while (pool.Take().capacity() >= chunking::BufferPool::kMinBytes) ++kept;
  EXPECT_EQ(kept, fits);
}

// End to end: many small, odd-sized chunks each way, through the real client and server.
TEST(StreamingTest, MultiChunkRequestAndResponseRoundTrip) {
  server::ServerOptions options = TestOptions();
  options.chunk_bytes = 3001;
  TestServer server(options);
  client::ClientOptions client_options;
  client_options.chunk_bytes = 1013;
  auto client = client::Client::Connect(server.target(), client_options);
  const int n = 20011;
  const v1::GradRequest request = BigRequest(n);
  client::CallOptions stream;
  stream.transport = client::CallOptions::Transport::kStream;
  absl::StatusOr<client::GradResult> r = client->Grad(request, stream);
  ASSERT_TRUE(r.ok()) << r.status();
  ExpectBigResult(*r, n);
}

TEST(StreamingTest, BoolBytesAcrossChunksAreChecked) {
  TestServer server;
  const int n = 40000;
  std::vector<bool> mask(n, true);
  RequestBuilder b;
  b.Leaf("x", HostTensor::Float32(std::vector<float>(n, 1), {n}), true)
      .Leaf("m", HostTensor::Bool(mask, {n}))
      .Op("where", {"m", "x", "x"}, {"y"})
      .Op("sum", {"y"}, {"loss"});
  b.Grad({"loss"}, {"x"});
  (*b.mutable_request()->mutable_graph()->mutable_leaves(1)->mutable_value()->mutable_data())[n -
                                                                                              2] =
      2;
  client::CallOptions stream;
  stream.transport = client::CallOptions::Transport::kStream;
  absl::StatusOr<v1::GradResponse> r = server.client().ComputeGradients(b.request(), stream);
  EXPECT_EQ(r.status().code(), absl::StatusCode::kInvalidArgument) << r.status();
  EXPECT_TRUE(absl::StrContains(r.status().message(), absl::StrCat("byte ", n - 2))) << r.status();
}

// Sends chunks by hand, with the total_bytes claimed; returns the call's status.
grpc::Status SendChunks(TestServer& server, int64_t claimed_total, int chunks, size_t chunk_size) {
  auto stub = v1::GradService::NewStub(server.client().channel());
  grpc::ClientContext context;
  context.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(30));
  auto stream = stub->ComputeGradientsStream(&context);
  v1::Chunk chunk;
  for (int i = 0; i < chunks; ++i) {
    chunk.Clear();
    if (i == 0) chunk.set_total_bytes(claimed_total);
    chunk.set_data(std::string(chunk_size, '\0'));
    if (!stream->Write(chunk)) break;
  }
  stream->WritesDone();
  while (stream->Read(&chunk)) {
  }
  return stream->Finish();
}

TEST(StreamingTest, OversizedStreamsAreRefusedWhateverTheyClaim) {
  server::ServerOptions options = TestOptions();
  options.max_request_bytes = 1 << 20;
  TestServer server(options);
  // Claims to be small, then sends more than the limit.
  grpc::Status lying = SendChunks(server, 100, 12, 100 << 10);
  EXPECT_EQ(lying.error_code(), grpc::StatusCode::RESOURCE_EXHAUSTED) << lying.error_message();
  EXPECT_TRUE(absl::StrContains(lying.error_message(), "--max_request_bytes"));
  // Claims more than the limit (nothing is reserved for it): refused on the first chunk.
  grpc::Status huge = SendChunks(server, int64_t{1} << 40, 1, 10);
  EXPECT_EQ(huge.error_code(), grpc::StatusCode::RESOURCE_EXHAUSTED) << huge.error_message();
  EXPECT_TRUE(CheckSquareWorks(server.client()).ok());
}

}  // namespace
}  // namespace gradserve::testing
