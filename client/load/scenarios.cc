#include "client/load/scenarios.h"

#include <cstdint>
#include <vector>

#include "absl/strings/str_cat.h"

namespace gradserve::load {
namespace {

using client::FloatAttr;
using client::HostTensor;
using client::RequestBuilder;

// n floats uniform in [-scale, scale) from a fixed linear congruential sequence.
std::vector<float> DeterministicValues(int64_t n, float scale, uint64_t seed) {
  std::vector<float> values(static_cast<size_t>(n));
  uint64_t state = seed * 6364136223846793005ULL + 1442695040888963407ULL;
  for (float& v : values) {
    state = state * 6364136223846793005ULL + 1442695040888963407ULL;
    const double unit = static_cast<double>(state >> 11) * 0x1.0p-53;  // [0, 1)
    v = static_cast<float>((2 * unit - 1) * scale);
  }
  return values;
}

}  // namespace

v1::GradRequest GradTinyRequest() {
  RequestBuilder b;
  b.Leaf("x", HostTensor::Float32(DeterministicValues(8, 1, 1), {8}), /*requires_grad=*/true)
      .Leaf("w", HostTensor::Float32(DeterministicValues(8, 1, 2), {8}))
      .Op("mul", {"x", "w"}, {"a"})
      .Op("tanh", {"a"}, {"b"})
      .Op("add", {"b", "x"}, {"c"})
      .Op("sin", {"c"}, {"d"})
      .Op("mul", {"d", "w"}, {"e"})
      .Op("sigmoid", {"e"}, {"f"})
      .Op("sub", {"f", "x"}, {"g"})
      .Op("exp", {"g"}, {"h"})
      .Op("relu", {"h"}, {"i"})
      .Op("sum", {"i"}, {"loss"});
  b.Grad({"loss"}, {"x"});
  b.RequestId("grad_tiny");
  return b.request();
}

v1::GradRequest Chain10kRequest() {
  RequestBuilder b;
  b.Leaf("x", HostTensor::Float32({0.5f}, {1}), /*requires_grad=*/true);
  std::string y = "x";
  for (int i = 0; i < 10'000; ++i) {
    const std::string scaled = absl::StrCat("s", i);
    const std::string next = absl::StrCat("y", i);
    b.Op("mul", {y}, {scaled}, {{"other", FloatAttr(1.0001)}});
    b.Op("tanh", {scaled}, {next});
    y = next;
  }
  b.Op("sum", {y}, {"loss"});
  b.Grad({"loss"}, {"x"});
  b.RequestId("chain_10k");
  return b.request();
}

v1::GradRequest Fanin2kRequest() {
  RequestBuilder b;
  b.Leaf("x", HostTensor::Float32(DeterministicValues(16, 1, 3), {16}), /*requires_grad=*/true);
  b.Op("mul", {"x"}, {"acc"}, {{"other", FloatAttr(0)}});
  std::string acc = "acc";
  for (int i = 0; i < 2000; ++i) {
    const std::string scaled = absl::StrCat("s", i);
    const std::string sine = absl::StrCat("sin", i);
    const std::string next = absl::StrCat("acc", i);
    b.Op("mul", {"x"}, {scaled}, {{"other", FloatAttr(1 + i * 1e-3)}});
    b.Op("sin", {scaled}, {sine});
    b.Op("add", {acc, sine}, {next});
    acc = next;
  }
  b.Op("sum", {acc}, {"loss"});
  b.Grad({"loss"}, {"x"});
  b.RequestId("fanin_2k");
  return b.request();
}

v1::GradRequest MlpRequest() {
  constexpr int64_t kBatch = 256, kWidth = 1024;
  RequestBuilder b;
  b.Leaf("x", HostTensor::Float32(DeterministicValues(kBatch * kWidth, 1, 4), {kBatch, kWidth}));
  std::string h = "x";
  std::vector<std::string> weights;
  for (int layer = 0; layer < 4; ++layer) {
    const std::string w = absl::StrCat("w", layer);
    // Scaled by 1/sqrt(width), so that activations stay of order one through the layers.
    b.Leaf(w,
           HostTensor::Float32(DeterministicValues(kWidth * kWidth, 1.0f / 32, 10 + layer),
                               {kWidth, kWidth}),
           /*requires_grad=*/true);
    weights.push_back(w);
    const std::string product = absl::StrCat("m", layer);
    const std::string next = absl::StrCat("h", layer);
    b.Op("matmul", {h, w}, {product});
    b.Op("relu", {product}, {next});
    h = next;
  }
  b.Op("sum", {h}, {"loss"});
  b.Grad({"loss"}, weights);
  b.RequestId("mlp_b256_w1024_d4");
  return b.request();
}

absl::StatusOr<HostTensor> PayloadValues(int64_t bytes) {
  if (bytes <= 0 || bytes % 4 != 0) {
    return absl::InvalidArgumentError(absl::StrCat(
        "the payload scenarios need a positive multiple of 4 bytes (float32); got ", bytes));
  }
  const int64_t n = bytes / 4;
  return HostTensor::Float32(DeterministicValues(n, 1, 5), {n});
}

absl::StatusOr<v1::GradRequest> PayloadRequest(int64_t bytes) {
  absl::StatusOr<HostTensor> x = PayloadValues(bytes);
  if (!x.ok()) return x.status();
  RequestBuilder b;
  b.Leaf("x", *x, /*requires_grad=*/true)
      .Op("mul", {"x"}, {"y"}, {{"other", FloatAttr(2)}})
      .Op("sum", {"y"}, {"loss"});
  b.Grad({"loss"}, {"x"});
  b.RequestId(absl::StrCat("payload_", bytes));
  return b.request();
}

absl::StatusOr<v1::GradRequest> PayloadShmRequest(int64_t bytes, const std::string& in,
                                                  const std::string& out) {
  absl::StatusOr<v1::GradRequest> request = PayloadRequest(bytes);
  if (!request.ok()) return request.status();
  request->set_request_id(absl::StrCat("payload_shm_", bytes));
  v1::Tensor* x = request->mutable_graph()->mutable_leaves(0)->mutable_value();
  x->clear_data();
  *x->mutable_shared_memory() = client::SharedMemory::Range(in, 0, bytes);
  (*request->mutable_calls(0)->mutable_gradient_destinations())["x"] =
      client::SharedMemory::Range(out, 0, bytes);
  return request;
}

}  // namespace gradserve::load
