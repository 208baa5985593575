#include "engine/ops/linear.h"

#include "engine/kernels/op_kernels.h"
#include "engine/ops/elementwise.h"
#include "engine/ops/linalg.h"
#include "engine/ops/shape.h"

namespace gradserve::ops {
namespace {

void Check3d(const char* op, const char* arg, const Tensor& t) {
  RequireDefined(op, arg, t);
  GS_CHECK_ARG(t.dim() == 3, op, ": ", arg,
               " must be a 3-d tensor [batch, rows, columns], got shape ",
               ShapeToString(t.shape()));
}

}  // namespace

Tensor linear(const Tensor& input, const Tensor& weight, const Tensor& bias) {
  RequireDefined("linear", "input", input);
  RequireDefined("linear", "weight", weight);
  GS_CHECK_ARG(weight.dim() == 1 || weight.dim() == 2,
               "linear: weight must be [out_features, in_features] or [in_features], got shape ",
               ShapeToString(weight.shape()));
  GS_CHECK_ARG(input.dim() >= 1, "linear: input must have at least one dimension, got shape []");
  GS_CHECK_ARG(input.size(-1) == weight.size(-1), "linear: input with shape ",
               ShapeToString(input.shape()), " has ", input.size(-1),
               " features, but weight with shape ", ShapeToString(weight.shape()), " takes ",
               weight.size(-1));
  const Tensor out = matmul(input, weight.dim() == 2 ? transpose(weight, 0, 1) : weight);
  if (!bias.defined()) return out;
  GS_CHECK_ARG(bias.dim() <= 1 && bias.numel() == (weight.dim() == 2 ? weight.size(0) : 1),
               "linear: bias has shape ", ShapeToString(bias.shape()), " but weight with shape ",
               ShapeToString(weight.shape()), " has ", weight.dim() == 2 ? weight.size(0) : 1,
               " output features");
  GS_CHECK_ARG(bias.dtype() == out.dtype(), "linear: bias is ", DTypeName(bias.dtype()),
               " but input and weight are ", DTypeName(out.dtype()));
  return add(out, bias);
}

Tensor bmm(const Tensor& input, const Tensor& mat2) {
  Check3d("bmm", "input", input);
  Check3d("bmm", "mat2", mat2);
  GS_CHECK_ARG(input.size(0) == mat2.size(0) && input.size(2) == mat2.size(1), "bmm: shapes ",
               ShapeToString(input.shape()), " and ", ShapeToString(mat2.shape()),
               " cannot be multiplied (the batch sizes must be equal and input's columns equal "
               "mat2's rows)");
  return matmul(input, mat2);
}

Tensor baddbmm(const Tensor& input, const Tensor& batch1, const Tensor& batch2, double beta,
               double alpha) {
  RequireDefined("baddbmm", "input", input);
  Check3d("baddbmm", "batch1", batch1);
  Check3d("baddbmm", "batch2", batch2);
  GS_CHECK_ARG(batch1.size(0) == batch2.size(0) && batch1.size(2) == batch2.size(1),
               "baddbmm: batch1 with shape ", ShapeToString(batch1.shape()),
               " and batch2 with shape ", ShapeToString(batch2.shape()),
               " cannot be multiplied (the batch sizes must be equal and batch1's columns equal "
               "batch2's rows)");
  const Shape shape = {batch1.size(0), batch1.size(1), batch2.size(2)};
  GS_CHECK_ARG(BroadcastShapesOrThrow("baddbmm", input.shape(), shape) == shape,
               "baddbmm: input with shape ", ShapeToString(input.shape()),
               " does not broadcast to the product's shape ", ShapeToString(shape));
  GS_CHECK_ARG(input.dtype() == batch1.dtype(), "baddbmm: input is ", DTypeName(input.dtype()),
               " but batch1 is ", DTypeName(batch1.dtype()));
  Tensor product = matmul(batch1, batch2);
  if (alpha != 1) product = mul(product, alpha);
  if (beta == 0) {
    // PyTorch ignores input then: zeros of its shape that stay connected to it.
    const Tensor never = Tensor::Zeros(input.shape(), DType::kBool, input.device());
    return add(product, where(never, input, Tensor::Scalar(0, input.dtype(), input.device())));
  }
  return add(beta == 1 ? input : mul(input, beta), product);
}

}  // namespace gradserve::ops
