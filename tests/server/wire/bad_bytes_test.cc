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
// Under CI's AddressSanitizer build, a mutation that reads out of bounds fails here too.

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <functional>
#include <map>
#include <memory>
#include <random>
#include <sstream>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "client/load/scenarios.h"
#include "google/protobuf/message.h"
#include "google/protobuf/util/json_util.h"
#include "gradserve/v1/gradserve.pb.h"
#include "gtest/gtest.h"
#include "tests/server/test_util.h"

namespace gradserve::testing {
namespace {

std::vector<std::string> SeedRequests() {
  std::vector<std::string> seeds = {load::GradTinyRequest().SerializeAsString(),
                                    load::PayloadRequest(20 << 10)->SerializeAsString()};
  std::vector<std::filesystem::path> files = {GRADSERVE_TEST_DATA_DIR "/every_op.json"};
  std::vector<std::filesystem::path> examples;
  for (const auto& entry : std::filesystem::directory_iterator(GRADSERVE_EXAMPLES_DIR)) {
    if (entry.path().extension() == ".json") examples.push_back(entry.path());
  }
  std::sort(examples.begin(), examples.end());  // a seed picks the same requests everywhere
  files.insert(files.end(), examples.begin(), examples.end());
  for (const std::filesystem::path& path : files) {
    std::stringstream json;
    json << std::ifstream(path).rdbuf();
    v1::GradRequest request;
    EXPECT_TRUE(google::protobuf::util::JsonStringToMessage(json.str(), &request).ok()) << path;
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
  const std::vector<std::string> seeds = SeedRequests();
  ASSERT_GE(seeds.size(), 5u);
  std::map<grpc::StatusCode, int> codes =
      SendAll([&] { return Mutate(seeds[rng_() % seeds.size()], rng_); });
  // Most mutations break the request; some leave it valid.
  EXPECT_GT(codes[grpc::StatusCode::INVALID_ARGUMENT], calls_ / 4);
}

// Every field of message and the messages below it, with the index of a repeated one's element
// (-1 for a singular field), and the repeated fields themselves (index -2).
struct FieldRef {
  google::protobuf::Message* message;
  const google::protobuf::FieldDescriptor* field;
  int index;
};
void CollectFields(google::protobuf::Message* message, std::vector<FieldRef>* out) {
  const google::protobuf::Reflection* r = message->GetReflection();
  std::vector<const google::protobuf::FieldDescriptor*> fields;
  r->ListFields(*message, &fields);
  for (const google::protobuf::FieldDescriptor* f : fields) {
    if (!f->is_repeated()) {
      out->push_back({message, f, -1});
      if (f->cpp_type() == google::protobuf::FieldDescriptor::CPPTYPE_MESSAGE) {
        CollectFields(r->MutableMessage(message, f), out);
      }
      continue;
    }
    out->push_back({message, f, -2});
    for (int i = 0; i < r->FieldSize(*message, f); ++i) {
      out->push_back({message, f, i});
      if (f->cpp_type() == google::protobuf::FieldDescriptor::CPPTYPE_MESSAGE) {
        CollectFields(r->MutableRepeatedMessage(message, f, i), out);
      }
    }
  }
}

// Every string of the seeds (value names, op names, attribute names and values): what a
// mutated string field is set to, so that a name can point at another definition.
void CollectWords(const google::protobuf::Message& message, std::vector<std::string>* words) {
  std::vector<FieldRef> fields;
  std::unique_ptr<google::protobuf::Message> copy(message.New());
  copy->CopyFrom(message);
  CollectFields(copy.get(), &fields);
  for (const FieldRef& f : fields) {
    if (f.field->type() != google::protobuf::FieldDescriptor::TYPE_STRING || f.index == -2) {
      continue;
    }
    const google::protobuf::Reflection* r = f.message->GetReflection();
    words->push_back(f.index < 0 ? r->GetString(*f.message, f.field)
                                 : r->GetRepeatedString(*f.message, f.field, f.index));
  }
}

// One edit through reflection, of a field picked at random anywhere in the request: a number
// set to an edge (0, 1, -1, the type's extremes) or at random, a string set to another of the
// seeds' strings, bytes cut or lengthened, an enum to any number, a message cleared, a
// repeated field's element removed or repeated.
void MutateField(google::protobuf::Message* request, const std::vector<std::string>& words,
                 std::mt19937_64& rng) {
  using google::protobuf::FieldDescriptor;
  std::vector<FieldRef> fields;
  CollectFields(request, &fields);
  if (fields.empty()) return;
  const FieldRef f = fields[rng() % fields.size()];
  const google::protobuf::Reflection* r = f.message->GetReflection();
  if (f.index == -2) {
    const int n = r->FieldSize(*f.message, f.field);
    if (n == 0) return;
    if (rng() % 2) {
      r->SwapElements(f.message, f.field, static_cast<int>(rng() % n), n - 1);
      r->RemoveLast(f.message, f.field);
    } else if (f.field->cpp_type() == FieldDescriptor::CPPTYPE_MESSAGE) {
      r->AddMessage(f.message, f.field)->CopyFrom(r->GetRepeatedMessage(*f.message, f.field, 0));
    }
    return;
  }
  const int64_t edges[] = {
      0, 1, -1, 2, INT32_MAX, INT32_MIN, INT64_MAX, INT64_MIN, static_cast<int64_t>(rng() % 64)};
  const int64_t v = edges[rng() % (sizeof(edges) / sizeof(edges[0]))];
  const bool repeated = f.index >= 0;
  switch (f.field->cpp_type()) {
    case FieldDescriptor::CPPTYPE_INT64:
      repeated ? r->SetRepeatedInt64(f.message, f.field, f.index, v)
               : r->SetInt64(f.message, f.field, v);
      break;
    case FieldDescriptor::CPPTYPE_INT32:
      repeated ? r->SetRepeatedInt32(f.message, f.field, f.index, static_cast<int32_t>(v))
               : r->SetInt32(f.message, f.field, static_cast<int32_t>(v));
      break;
    case FieldDescriptor::CPPTYPE_UINT64:
    case FieldDescriptor::CPPTYPE_UINT32:
      break;  // none in the contract
    case FieldDescriptor::CPPTYPE_DOUBLE: {
      const double d[] = {0, -1, 1e308, -1e308, NAN, INFINITY, static_cast<double>(v)};
      const double x = d[rng() % 7];
      repeated ? r->SetRepeatedDouble(f.message, f.field, f.index, x)
               : r->SetDouble(f.message, f.field, x);
      break;
    }
    case FieldDescriptor::CPPTYPE_FLOAT: {
      const float x = rng() % 2 ? NAN : static_cast<float>(v);
      repeated ? r->SetRepeatedFloat(f.message, f.field, f.index, x)
               : r->SetFloat(f.message, f.field, x);
      break;
    }
    case FieldDescriptor::CPPTYPE_BOOL:
      repeated ? r->SetRepeatedBool(f.message, f.field, f.index, rng() % 2)
               : r->SetBool(f.message, f.field, rng() % 2);
      break;
    case FieldDescriptor::CPPTYPE_ENUM:
      repeated ? r->SetRepeatedEnumValue(f.message, f.field, f.index, static_cast<int>(v % 8))
               : r->SetEnumValue(f.message, f.field, static_cast<int>(v % 8));
      break;
    case FieldDescriptor::CPPTYPE_STRING: {
      std::string x;
      if (f.field->type() == FieldDescriptor::TYPE_BYTES) {
        x = repeated ? r->GetRepeatedString(*f.message, f.field, f.index)
                     : r->GetString(*f.message, f.field);
        x.resize(rng() % 2 ? x.size() / 2 : x.size() + 1 + rng() % 8, '\x7f');
      } else if (!words.empty()) {
        x = words[rng() % words.size()];
      }
      repeated ? r->SetRepeatedString(f.message, f.field, f.index, x)
               : r->SetString(f.message, f.field, x);
      break;
    }
    case FieldDescriptor::CPPTYPE_MESSAGE:
      if (!repeated) r->ClearField(f.message, f.field);
      break;
  }
}

// The same promise for requests that parse, with their fields made wrong: names that point at
// the wrong value or at none, shapes, dtypes and attributes at their edges, tensors' bytes of
// the wrong length, ops and leaves removed or repeated. These reach the checks behind the
// parse (graph::Validate, the ops' argument checks, the limits) rather than the parse itself.
TEST_F(BadBytesTest, MutatedFieldsGetAClientStatusAndHarmNothing) {
  std::vector<v1::GradRequest> seeds;
  std::vector<std::string> words;
  for (const std::string& bytes : SeedRequests()) {
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
