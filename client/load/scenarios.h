// The built-in requests of `gradserve load`: the service scenarios of DESIGN.md section 6
// (ping, grad_tiny, a payload of a given size) and its engine scenarios sent as requests
// (chain_10k, fanin_2k, mlp_b256_w1024_d4), built with the client library's RequestBuilder.
// Tensor values are deterministic (a fixed pseudo-random sequence), so every run sends the
// same bytes.

#ifndef GRADSERVE_CLIENT_LOAD_SCENARIOS_H_
#define GRADSERVE_CLIENT_LOAD_SCENARIOS_H_

#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "client/library/gradserve_client.h"
#include "client/library/shared_memory.h"

namespace gradserve::load {

namespace v1 = ::gradserve::v1;

// x and w, float32 [8]; ten ops (mul, tanh, add, sin, mul, sigmoid, sub, exp, relu, sum);
// the gradient of the sum with respect to x.
v1::GradRequest GradTinyRequest();

// x = [0.5] float32; 10 000 times y = tanh(y * 1.0001); loss = y.sum(); d loss / d x.
v1::GradRequest Chain10kRequest();

// x float32 [16]; acc = x * 0; 2000 times acc = acc + sin(x * (1 + i * 1e-3));
// loss = acc.sum(); d loss / d x.
v1::GradRequest Fanin2kRequest();

// x [256, 1024] float32 (no grad); four [1024, 1024] weights; h = relu(h @ w) for each;
// loss = h.sum(); the gradients of the four weights.
v1::GradRequest MlpRequest();

// x float32 [bytes / 4]; loss = (x * 2).sum(); d loss / d x, a gradient of `bytes` bytes.
// INVALID_ARGUMENT unless bytes is a positive multiple of 4.
absl::StatusOr<v1::GradRequest> PayloadRequest(int64_t bytes);
// The same with x's values read from the shared-memory region `in` (offset 0, which must hold
// PayloadValues(bytes)) and its gradient written to region `out` (offset 0): scenario
// payload_shm (load_regions.h).
absl::StatusOr<v1::GradRequest> PayloadShmRequest(int64_t bytes, const std::string& in,
                                                  const std::string& out);
// payload's x: float32 [bytes / 4], deterministic. INVALID_ARGUMENT unless bytes is a positive
// multiple of 4.
absl::StatusOr<client::HostTensor> PayloadValues(int64_t bytes);

}  // namespace gradserve::load

#endif  // GRADSERVE_CLIENT_LOAD_SCENARIOS_H_
