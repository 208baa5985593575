// The coverage-guided fuzzer of a grad request's way through the server (issue 24): bytes as a
// unary ComputeGradients call receives them, parsed (UnaryMessages), converted and checked
// (FromProto's census, graph::Validate), recorded and differentiated (RequestRunner), the
// response serialized, and the status made gRPC's (ToGrpcStatus); all in-process, without a
// network, under small limits.
//
// Note [What the fuzzer holds the server to]
// For any input it aborts (a crash libFuzzer keeps) when
//   1. the status is INTERNAL or UNKNOWN: a bug, never the client's input (DESIGN.md
//      section 5);
//   2. the message, before ToGrpcStatus, has a byte outside printable ASCII: a client string
//      that reached it unquoted (Note [Quoting client strings] in engine/util/quote.h);
//   3. the message gRPC would carry is over kMaxMessageBytes;
//   4. the same bytes sent again, on the same thread, get another status or response: the
//      second time the thread's caches are warm (Note [Unary messages reused], Note [Ops
//      parsed once], Note [Reusing a validated graph]), which must not change an answer.
//      Timings are left out, and a run stopped by its deadline is not compared.
// AddressSanitizer, UndefinedBehaviorSanitizer and LeakSanitizer (libFuzzer's -detect_leaks)
// add memory errors, undefined behaviour and leaks. The custom mutator (Note [Mutating
// requests] in request_mutator.h) keeps most mutants well-formed GradRequests, so that they
// reach past the parse.
//
// Thread safety: libFuzzer calls the entry points from one thread.

#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <random>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "engine/autograd/cancellation.h"
#include "engine/util/quote.h"
#include "google/protobuf/stubs/logging.h"
#include "gradserve/v1/gradserve.pb.h"
#include "grpcpp/support/byte_buffer.h"
#include "grpcpp/support/slice.h"
#include "server/run/request_runner.h"
#include "server/service/grpc_status.h"
#include "server/service/server_info.h"
#include "server/service/server_options.h"
#include "server/wire/unary_messages.h"
#include "tests/fuzz/request_mutator.h"

extern "C" size_t LLVMFuzzerMutate(uint8_t* data, size_t size, size_t max_size);

namespace gradserve::testing {
namespace {

using server::RequestRunner;
using server::UnaryMessages;

// Small, so that a mutant cannot ask for much work, and a name limit that mutants reach.
graph::Limits FuzzLimits() {
  graph::Limits limits;
  limits.max_ops = 128;
  limits.max_leaves = 16;
  limits.max_tensor_elements = 8192;
  limits.max_memory_bytes = 4 << 20;
  limits.max_nesting = 3;
  limits.max_backward_calls = 4;
  limits.max_name_bytes = 64;
  return limits;
}

// What one run of the bytes gave.
struct Outcome {
  absl::Status status;
  std::string response;  // serialized, without timings; only when status is OK
};

[[noreturn]] void Fail(const std::string& what, const absl::Status& status) {
  std::fprintf(stderr, "request_fuzzer: %s: %s\n", what.c_str(),
               ClientMessage(status.ToString(), 4096).c_str());
  std::abort();
}

// The unary path of GradService::ComputeGradients, on this thread (as an inline call runs).
Outcome Run(const uint8_t* data, size_t size) {
  grpc::Slice slice(data, size);
  const grpc::ByteBuffer bytes(&slice, 1);
  UnaryMessages::Ptr messages = UnaryMessages::Take();
  Outcome outcome;
  outcome.status = messages->ParseRequest(bytes);
  if (!outcome.status.ok()) return outcome;
  {
    RequestRunner runner;  // gives the graph back to the thread's cache when destroyed
    auto cancel = std::make_shared<autograd::CancellationToken>(absl::Now() + absl::Seconds(10));
    outcome.status = runner.Run(messages->request(), FuzzLimits(), cancel, absl::Now(),
                                messages->response(), nullptr, nullptr, messages->op_records());
  }
  if (!outcome.status.ok()) return outcome;
  messages->response()->clear_timings();
  grpc::ByteBuffer response;
  outcome.status = messages->SerializeResponse(&response);
  if (outcome.status.ok()) {
    std::vector<grpc::Slice> slices;
    if (!response.Dump(&slices).ok()) Fail("the response could not be read back", outcome.status);
    for (const grpc::Slice& s : slices) {
      outcome.response.append(reinterpret_cast<const char*>(s.begin()), s.size());
    }
  }
  return outcome;
}

// Note [What the fuzzer holds the server to], 1 to 3.
void CheckStatus(const absl::Status& status) {
  if (status.code() == absl::StatusCode::kInternal || status.code() == absl::StatusCode::kUnknown) {
    Fail("INTERNAL or UNKNOWN", status);
  }
  for (const char c : status.message()) {
    if (static_cast<unsigned char>(c) < 0x20 || static_cast<unsigned char>(c) >= 0x7f) {
      Fail("a byte outside printable ASCII in the message (an unquoted client string?)", status);
    }
  }
  if (server::ToGrpcStatus(status).error_message().size() > kMaxMessageBytes) {
    Fail("the gRPC status message is over kMaxMessageBytes", status);
  }
}

bool Stopped(const absl::Status& status) {
  return status.code() == absl::StatusCode::kDeadlineExceeded ||
         status.code() == absl::StatusCode::kCancelled;
}

// The strings MutateField sets string fields to, besides the request's own: every op's name,
// its inputs' and attributes' names (ServerInfo lists them all), the keywords string
// attributes take, devices, and strings at and past the limits.
const std::vector<std::string>& Dictionary() {
  static const std::vector<std::string>* const words = [] {
    auto* w = new std::vector<std::string>{"",
                                           "none",
                                           "mean",
                                           "sum",
                                           "tanh",
                                           "valid",
                                           "same",
                                           "scale",
                                           "clamp",
                                           "zero",
                                           "nan_to_num",
                                           "float32",
                                           "float64",
                                           "int64",
                                           "bool",
                                           "cpu",
                                           "cpu:0",
                                           "cpu:1",
                                           "cuda:0",
                                           "sim:0",
                                           "sim:-1",
                                           "cuda:99999999999",
                                           "x",
                                           "loss",
                                           "a\nb",
                                           "\x1b[2J",
                                           "it's",
                                           std::string(64, 'n'),
                                           std::string(65, 'n'),
                                           std::string(300, '\n')};
    const v1::ServerInfo info = server::DescribeServer(server::ServerOptions());
    for (const v1::OpInfo& op : info.ops()) {
      w->push_back(op.name());
      for (const std::string& input : op.inputs()) w->push_back(input);
      for (const v1::AttrInfo& attr : op.attrs()) w->push_back(attr.name());
    }
    return w;
  }();
  return *words;
}

}  // namespace
}  // namespace gradserve::testing

extern "C" int LLVMFuzzerInitialize(int* /*argc*/, char*** /*argv*/) {
  // Else protobuf logs a line for every string that is not UTF-8.
  google::protobuf::SetLogHandler(nullptr);
  gradserve::testing::Dictionary();
  return 0;
}

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  using gradserve::testing::Outcome;
  const Outcome first = gradserve::testing::Run(data, size);
  gradserve::testing::CheckStatus(first.status);
  // Note [What the fuzzer holds the server to], 4: again, with this thread's caches warm.
  const Outcome second = gradserve::testing::Run(data, size);
  gradserve::testing::CheckStatus(second.status);
  if (gradserve::testing::Stopped(first.status) || gradserve::testing::Stopped(second.status)) {
    return 0;
  }
  if (first.status != second.status) {
    gradserve::testing::Fail(
        absl::StrCat("the same request again got another status; first ", first.status.ToString()),
        second.status);
  }
  if (first.response != second.response) {
    gradserve::testing::Fail("the same request again got another response", second.status);
  }
  return 0;
}

// Note [Mutating requests]: three times in four a field edit of the parsed request, when the
// bytes parse; else (or when the edit would not fit) libFuzzer's own byte mutations.
extern "C" size_t LLVMFuzzerCustomMutator(uint8_t* data, size_t size, size_t max_size,
                                          unsigned int seed) {
  std::mt19937_64 rng(seed);
  gradserve::v1::GradRequest request;
  if (rng() % 4 != 0 && request.ParseFromArray(data, static_cast<int>(size))) {
    std::vector<std::string> words = gradserve::testing::Dictionary();
    gradserve::testing::CollectWords(request, &words);
    for (int e = 1 + static_cast<int>(rng() % 3); e > 0; --e) {
      gradserve::testing::MutateField(&request, words, rng);
    }
    const std::string out = request.SerializeAsString();
    if (out.size() <= max_size) {
      std::memcpy(data, out.data(), out.size());
      return out.size();
    }
  }
  return LLVMFuzzerMutate(data, size, max_size);
}
