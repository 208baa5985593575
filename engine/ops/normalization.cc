#include "engine/ops/normalization.h"

#include <vector>

#include "engine/autograd/grad_mode.h"
#include "engine/kernels/op_kernels.h"
#include "engine/ops/elementwise.h"
#include "engine/ops/reductions.h"
#include "engine/ops/shape.h"
#include "engine/ops/shape_common.h"
#include "engine/ops/statistics.h"

namespace gradserve::ops {
namespace {

// A per-channel [C] tensor shaped to broadcast against [N, C, ...] of rank `rank`.
Tensor PerChannel(const Tensor& t, int64_t rank) {
  std::vector<int64_t> shape(static_cast<size_t>(rank - 1), 1);
  shape[0] = t.numel();
  return reshape(t, shape);
}

// Checks an optional per-channel argument of op: [C], the input's dtype and device.
void CheckChannelArg(const char* op, const char* arg, const Tensor& t, const Tensor& input) {
  if (!t.defined()) return;
  GS_CHECK_ARG(t.dim() == 1 && t.size(0) == input.size(1), op, ": ", arg, " has shape ",
               ShapeToString(t.shape()), " but input with shape ", ShapeToString(input.shape()),
               " has ", input.size(1), " channels: it must be [", input.size(1), "]");
  CheckSameDTypeAndDevice(op, "input", input, arg, t);
}

// x * weight + bias per channel, each optional.
Tensor Affine(const Tensor& x, const Tensor& weight, const Tensor& bias) {
  Tensor out = x;
  if (weight.defined()) out = mul(out, PerChannel(weight, x.dim()));
  if (bias.defined()) out = add(out, PerChannel(bias, x.dim()));
  return out;
}

void CheckNormInput(const char* op, const Tensor& input) {
  RequireFloating(op, "input", input);
  GS_CHECK_ARG(input.dim() >= 2, op, ": input must be [N, C, ...], got shape ",
               ShapeToString(input.shape()));
}

}  // namespace

BatchNormResult batch_norm(const Tensor& input, const Tensor& running_mean,
                           const Tensor& running_var, const Tensor& weight, const Tensor& bias,
                           bool training, double momentum, double eps) {
  CheckNormInput("batch_norm", input);
  CheckChannelArg("batch_norm", "running_mean", running_mean, input);
  CheckChannelArg("batch_norm", "running_var", running_var, input);
  CheckChannelArg("batch_norm", "weight", weight, input);
  CheckChannelArg("batch_norm", "bias", bias, input);
  GS_CHECK_ARG(running_mean.defined() == running_var.defined(),
               "batch_norm: give both running_mean and running_var, or neither");
  const int64_t rank = input.dim();
  BatchNormResult r;
  if (!training) {
    GS_CHECK_ARG(running_mean.defined(),
                 "batch_norm: eval (training = false) needs running_mean and running_var");
    const Tensor scale = rsqrt(add(PerChannel(running_var, rank), eps));
    r.output = Affine(mul(sub(input, PerChannel(running_mean, rank)), scale), weight, bias);
    r.running_mean = running_mean;
    r.running_var = running_var;
    return r;
  }
  std::vector<int64_t> dims = {0};
  for (int64_t d = 2; d < rank; ++d) dims.push_back(d);
  const int64_t count = input.numel() / input.size(1);
  GS_CHECK_ARG(count > 1,
               "batch_norm: expected more than 1 value per channel when training, got "
               "input shape ",
               ShapeToString(input.shape()));
  const Tensor mu = mean(input, dims, /*keepdim=*/true);
  const Tensor variance = var(input, dims, /*correction=*/0, /*keepdim=*/true);
  r.output = Affine(mul(sub(input, mu), rsqrt(add(variance, eps))), weight, bias);
  autograd::NoGradGuard no_grad;
  const Tensor batch_mean = reshape(mu.detach(), {input.size(1)});
  const Tensor batch_var = mul(reshape(variance.detach(), {input.size(1)}),
                               static_cast<double>(count) / static_cast<double>(count - 1));
  if (!running_mean.defined()) {
    r.running_mean = batch_mean;
    r.running_var = batch_var;
  } else {
    r.running_mean = add(mul(running_mean.detach(), 1 - momentum), mul(batch_mean, momentum));
    r.running_var = add(mul(running_var.detach(), 1 - momentum), mul(batch_var, momentum));
  }
  return r;
}

Tensor group_norm(const Tensor& input, int64_t num_groups, const Tensor& weight, const Tensor& bias,
                  double eps) {
  CheckNormInput("group_norm", input);
  const int64_t channels = input.size(1);
  GS_CHECK_ARG(num_groups >= 1 && channels % num_groups == 0,
               "group_norm: num_groups = ", num_groups, " must divide the ", channels,
               " channels of input with shape ", ShapeToString(input.shape()));
  CheckChannelArg("group_norm", "weight", weight, input);
  CheckChannelArg("group_norm", "bias", bias, input);
  const int64_t n = input.size(0);
  const int64_t per_group = n == 0 ? 0 : input.numel() / (n * num_groups);
  const Tensor grouped = reshape(input, {n, num_groups, per_group});
  const int64_t dims[] = {2};
  const Tensor mu = mean(grouped, dims, /*keepdim=*/true);
  const Tensor variance = var(grouped, dims, /*correction=*/0, /*keepdim=*/true);
  const Tensor normalized = mul(sub(grouped, mu), rsqrt(add(variance, eps)));
  return Affine(reshape(normalized, input.shape()), weight, bias);
}

}  // namespace gradserve::ops
