#include "engine/ops/linalg.h"

#include <algorithm>
#include <array>
#include <cstdint>
#include <limits>
#include <optional>
#include <string>
#include <utility>

#include "engine/autograd/saved_variable.h"
#include "engine/kernels/basic_kernels.h"
#include "engine/kernels/kernel_stub.h"
#include "engine/kernels/op_kernels.h"
#include "engine/ops/broadcast.h"
#include "engine/ops/elementwise.h"
#include "engine/ops/nn_kernels.h"
#include "engine/ops/op_registry.h"
#include "engine/ops/record.h"
#include "engine/util/cancellation.h"
#include "engine/util/math_mode.h"
#include "engine/util/wrapping.h"

namespace gradserve::ops {
namespace {

using autograd::SavedVariable;

// How the last two dims of a tensor (a stored matrix X of shape [R, C]) are handed to a
// row-major gemm computing with op(X) = trans ? X^T : X.
struct BlasMatrix {
  bool trans;
  int64_t ld;
};

// The gemm description of t's last two dims when its strides are row-major or column-major
// (a column-major X is a row-major X^T, so trans flips); nullopt otherwise.
std::optional<BlasMatrix> AsBlas(const Tensor& t, bool trans) {
  const int64_t rank = t.dim();
  const int64_t rows = t.shape()[rank - 2], cols = t.shape()[rank - 1];
  const int64_t row_stride = t.strides()[rank - 2], col_stride = t.strides()[rank - 1];
  if (col_stride == 1 || cols == 1) {
    const int64_t ld = rows == 1 ? std::max<int64_t>(cols, 1) : row_stride;
    if (ld >= std::max<int64_t>(cols, 1)) return BlasMatrix{trans, ld};
  }
  if (row_stride == 1 || rows == 1) {
    const int64_t ld = cols == 1 ? std::max<int64_t>(rows, 1) : col_stride;
    if (ld >= std::max<int64_t>(rows, 1)) return BlasMatrix{!trans, ld};
  }
  return std::nullopt;
}

Shape BatchShape(const Tensor& t) { return Shape(t.shape().begin(), t.shape().end() - 2); }
Strides BatchStrides(const Tensor& t) {
  return Strides(t.strides().begin(), t.strides().end() - 2);
}

template <typename T>
void GemmBatchCpuTyped(const GemmBatch& g) {
  const T* const pa = static_cast<const T*>(g.a);
  const T* const pb = static_cast<const T*>(g.b);
  T* const pc = static_cast<T*>(g.c);
  const T beta = g.beta_one ? T(1) : T(0);
  // Note [Matrix products in tiles]: one meter over the batch, so that many small products
  // are checked as one big one is.
  WorkMeter meter;
  for (int64_t j = 0; j < g.count; ++j) {
    ops::Gemm<T>(g.ta, g.tb, g.m, g.n, g.k, T(1), pa + j * g.stride_a, g.lda, pb + j * g.stride_b,
                 g.ldb, beta, pc + j * g.stride_c, g.ldc, meter);
  }
}

void GemmBatchCpu(const GemmBatch& g) {
  if (g.dtype == DType::kFloat32) {
    GemmBatchCpuTyped<float>(g);
  } else {
    GemmBatchCpuTyped<double>(g);
  }
}

// The integer product over any strides (BLAS has no integer gemm; no GPU kernel yet):
// out [batch..., m, n] contiguous, a and b with their own strides, batch broadcast. Each
// multiply-add counts as a unit of work, so the current token is checked every kWorkPerCheck
// of them (Note [Stopping a running op]): a row of C goes in blocks of columns.
void MatmulInt64Cpu(const Tensor& a, const Tensor& b, bool ta, bool tb, const Tensor& out) {
  using T = int64_t;
  const int64_t ra = a.dim(), rb = b.dim();
  const int64_t m = out.shape()[out.dim() - 2], n = out.shape()[out.dim() - 1];
  const int64_t k = ta ? a.shape()[ra - 2] : a.shape()[ra - 1];
  const Shape a_batch = BatchShape(a), b_batch = BatchShape(b);
  const Shape batch(out.shape().begin(), out.shape().end() - 2);
  Strides o_steps = ContiguousStrides(out.shape());
  o_steps.resize(batch.size());
  T* const po = out.data<T>();
  const Strides sa = BroadcastStrides(a_batch, BatchStrides(a), batch);
  const Strides sb = BroadcastStrides(b_batch, BatchStrides(b), batch);
  const int64_t a_row = a.strides()[ra - 2], a_col = a.strides()[ra - 1];
  const int64_t b_row = b.strides()[rb - 2], b_col = b.strides()[rb - 1];
  // Steps along op(X)'s rows (i) and inner dim (p).
  const int64_t ai = ta ? a_col : a_row, ap = ta ? a_row : a_col;
  const int64_t bp = tb ? b_col : b_row, bj = tb ? b_row : b_col;
  const T* const pa = a.data<T>();
  const T* const pb = b.data<T>();
  // Columns per block: about kWorkPerCheck multiply-adds (k > 0 of them per element of C).
  const int64_t columns = std::max<int64_t>(1, kWorkPerCheck / k);
  WorkMeter meter;
  ForEachRow<3>(
      batch, {absl::Span<const int64_t>(sa), sb, o_steps},
      [&](const std::array<int64_t, 3>& off, const std::array<int64_t, 3>& step, int64_t count) {
        for (int64_t t = 0; t < count; ++t) {
          const T* x = pa + off[0] + t * step[0];
          const T* y = pb + off[1] + t * step[1];
          T* z = po + off[2] + t * step[2];
          for (int64_t i = 0; i < m; ++i) {
            for (int64_t begin = 0; begin < n; begin += columns) {
              const int64_t end = std::min(n, begin + columns);
              for (int64_t j = begin; j < end; ++j) {
                T acc = 0;
                // Note [Integer tensors wrap around]: int64 sums modulo 2^64, as PyTorch's.
                for (int64_t p = 0; p < k; ++p) {
                  acc = WrapMulAdd(acc, x[i * ai + p * ap], y[p * bp + j * bj]);
                }
                z[i * n + j] = acc;
              }
              meter.Add((end - begin) * k);
            }
          }
        }
      });
}

using MatmulInt64Fn = void(const Tensor& a, const Tensor& b, bool ta, bool tb, const Tensor& out);
const KernelStub<MatmulInt64Fn> matmul_int64_stub("matmul (int64)", MatmulInt64Cpu);

// op(a) @ op(b) for a, b of rank >= 2 and one numeric dtype, broadcasting the batch dims:
// out has shape [batch..., M, N] (contiguous). No autograd; sizes already checked.
Tensor MatmulKernel(Tensor a, Tensor b, bool ta, bool tb) {
  const int64_t ra = a.dim(), rb = b.dim();
  const int64_t m = ta ? a.shape()[ra - 1] : a.shape()[ra - 2];
  const int64_t k = ta ? a.shape()[ra - 2] : a.shape()[ra - 1];
  const int64_t n = tb ? b.shape()[rb - 2] : b.shape()[rb - 1];
  const Shape a_batch = BatchShape(a), b_batch = BatchShape(b);
  const Shape batch = BroadcastShapesOrThrow("matmul", a_batch, b_batch);
  Shape out_shape = batch;
  out_shape.push_back(m);
  out_shape.push_back(n);
  Tensor out = Tensor::Empty(out_shape, a.dtype(), a.device());
  if (out.numel() == 0) return out;
  if (k == 0) {
    Fill(out, 0);
    return out;
  }
  if (a.dtype() == DType::kInt64) {
    matmul_int64_stub(out.device(), a, b, ta, tb, out);
    return out;
  }
  std::optional<BlasMatrix> ma = AsBlas(a, ta);
  if (!ma) ma = AsBlas(a = a.contiguous(), ta);
  std::optional<BlasMatrix> mb = AsBlas(b, tb);
  if (!mb) mb = AsBlas(b = b.contiguous(), tb);
  constexpr int64_t kMaxBlas = std::numeric_limits<int>::max();
  GS_CHECK_ARG(std::max({m, n, k, ma->ld, mb->ld}) <= kMaxBlas,
               "matmul: matrix sizes beyond 2^31 - 1 are not supported");
  Strides o_steps = ContiguousStrides(out_shape);
  o_steps.resize(batch.size());
  const Strides sa = BroadcastStrides(a_batch, BatchStrides(a), batch);
  const Strides sb = BroadcastStrides(b_batch, BatchStrides(b), batch);
  GemmBatch args;
  args.device_index = out.device().index;
  args.dtype = a.dtype();
  args.allow_tf32 = CurrentMathMode().allow_tf32;
  args.ta = ma->trans;
  args.tb = mb->trans;
  args.m = m;
  args.n = n;
  args.k = k;
  args.lda = ma->ld;
  args.ldb = mb->ld;
  args.ldc = n;
  const size_t element = ElementSize(a.dtype());
  const char* const pa = static_cast<const char*>(a.raw_data());
  const char* const pb = static_cast<const char*>(b.raw_data());
  char* const po = static_cast<char*>(out.raw_data());
  // Each row of the batch walk is one strided batch of products.
  ForEachRow<3>(
      batch, {absl::Span<const int64_t>(sa), sb, o_steps},
      [&](const std::array<int64_t, 3>& off, const std::array<int64_t, 3>& step, int64_t count) {
        args.a = pa + off[0] * element;
        args.b = pb + off[1] * element;
        args.c = po + off[2] * element;
        args.stride_a = step[0];
        args.stride_b = step[1];
        args.stride_c = step[2];
        args.count = count;
        gemm_batch_stub(out.device(), args);
      });
  return out;
}

Tensor MatrixProduct(const Tensor& a, const Tensor& b, bool ta, bool tb);

// Backward of op(a) @ op(b) for operands of rank >= 2: the gradients are matrix products with
// the other operand (transposed as needed), summed over broadcast batch dims.
class MatrixProductBackward final : public autograd::Node {
 public:
  MatrixProductBackward(bool ta, bool tb, Shape a_shape, Shape b_shape)
      : ta_(ta), tb_(tb), a_shape_(std::move(a_shape)), b_shape_(std::move(b_shape)) {}

  TensorList apply(TensorList&& grads) override {
    TensorList r(2);
    const Tensor& g = grads[0];
    if (!g.defined()) return r;
    if (should_compute_output(0)) {
      const Tensor b = b_.unpack(this);
      // d op(a) = g op(b)^T; for ta, da = (g op(b)^T)^T = op(b) g^T.
      r[0] =
          sum_to(ta_ ? MatrixProduct(b, g, tb_, true) : MatrixProduct(g, b, false, !tb_), a_shape_);
    }
    if (should_compute_output(1)) {
      const Tensor a = a_.unpack(this);
      // d op(b) = op(a)^T g; for tb, db = g^T op(a).
      r[1] =
          sum_to(tb_ ? MatrixProduct(g, a, true, ta_) : MatrixProduct(a, g, !ta_, false), b_shape_);
    }
    return r;
  }
  std::string name() const override {
    return a_shape_.size() == 2 && b_shape_.size() == 2 ? "MmBackward0" : "BmmBackward0";
  }
  void release_variables() override {
    a_.reset();
    b_.reset();
  }

  SavedVariable a_;
  SavedVariable b_;

 private:
  const bool ta_, tb_;
  const Shape a_shape_, b_shape_;
};

Tensor MatrixProduct(const Tensor& a, const Tensor& b, bool ta, bool tb) {
  Tensor out = MatmulKernel(a, b, ta, tb);
  if (auto node = RecordOp<MatrixProductBackward>(out, {a, b}, ta, tb, a.shape(), b.shape())) {
    if (node->should_compute_output(1)) node->a_ = SavedVariable(a, false);
    if (node->should_compute_output(0)) node->b_ = SavedVariable(b, false);
  }
  return out;
}

enum class VectorCase { kDot, kMatVec, kVecMat };

// The layout that sums `shape` over the marked dims and drops them.
ReductionLayout ReduceDims(absl::Span<const int64_t> shape, absl::InlinedVector<bool, 6> reduced) {
  return MakeReductionLayout(shape, reduced, /*keepdim=*/false);
}

// Note [Contracting with a vector in float64]
// The gradient of matmul's vector operand contracts the other operand with g: a sum of
// products. As mul then a sum, each float32 product would be rounded before the (float64)
// sum, so a sum of products that cancel is off by more than an ulp: 616.57745 where the
// correctly rounded sum is 616.5775 (PyTorch's gemv: 0.4 ulp off), and x / x's two gradients,
// computed from it, left a residue of 3e-5 where PyTorch's cancelled (diff_fuzz.py seed
// 1142901977, graph 254). float32 operands are multiplied in float64 (exactly) and the sum
// rounded once, as PyTorch's float32 gemv accumulates each product unrounded.
Tensor SumOfProducts(const Tensor& g, const Tensor& x, const ReductionLayout* layout,
                     absl::Span<const int64_t> shape) {
  const bool widen = x.dtype() == DType::kFloat32;
  const Tensor product = widen ? mul(to(g, DType::kFloat64), to(x, DType::kFloat64)) : mul(g, x);
  const Tensor total =
      layout != nullptr ? SumOver(product, *layout, "SumBackward1") : sum_to(product, shape);
  return widen ? to(total, DType::kFloat32) : total;
}

// Backward of matmul with a 1-d operand, written with broadcasting elementwise ops and
// reductions (each gradient is an outer product or a contraction with one vector).
class VectorProductBackward final : public autograd::Node {
 public:
  explicit VectorProductBackward(VectorCase kind) : kind_(kind) {}

  TensorList apply(TensorList&& grads) override {
    TensorList r(2);
    const Tensor& g = grads[0];
    if (!g.defined()) return r;
    const Tensor a = a_.unpack(this);
    const Tensor b = b_.unpack(this);
    switch (kind_) {
      case VectorCase::kDot:
        if (should_compute_output(0)) r[0] = mul(g, b);
        if (should_compute_output(1)) r[1] = mul(g, a);
        break;
      case VectorCase::kMatVec: {
        // a [..., M, K], b [K], g [..., M]: g repeated along K.
        absl::InlinedVector<bool, 6> last(a.dim(), false);
        last.back() = true;
        const Tensor ge = ExpandOver(g, ReduceDims(a.shape(), last));
        if (should_compute_output(0)) r[0] = mul(ge, b);
        if (should_compute_output(1)) r[1] = SumOfProducts(ge, a, nullptr, b.shape());
        break;
      }
      case VectorCase::kVecMat: {
        // a [K], b [..., K, N], g [..., N]: g repeated along K.
        absl::InlinedVector<bool, 6> rows(b.dim(), false);
        rows[b.dim() - 2] = true;
        const Tensor ge = ExpandOver(g, ReduceDims(b.shape(), rows));
        if (should_compute_output(0)) {
          absl::InlinedVector<bool, 6> all_but_rows(b.dim(), true);
          all_but_rows[b.dim() - 2] = false;
          const ReductionLayout layout = ReduceDims(b.shape(), all_but_rows);
          r[0] = SumOfProducts(ge, b, &layout, a.shape());
        }
        if (should_compute_output(1)) {
          // a as a column [K, N], broadcast over b's batch dims.
          const int64_t k = a.shape()[0], n = b.shape()[b.dim() - 1];
          const Tensor column = ExpandOver(a, ReduceDims({k, n}, {false, true}));
          r[1] = mul(ge, column);
        }
        break;
      }
    }
    return r;
  }
  std::string name() const override {
    switch (kind_) {
      case VectorCase::kDot:
        return "DotBackward0";
      case VectorCase::kMatVec:
        return "MvBackward0";
      case VectorCase::kVecMat:
        break;
    }
    return "MmBackward0";
  }
  void release_variables() override {
    a_.reset();
    b_.reset();
  }

  SavedVariable a_;
  SavedVariable b_;

 private:
  const VectorCase kind_;
};

// A 1-d tensor viewed as a [1, K] row (as_row) or a [K, 1] column; no autograd.
Tensor VectorAsMatrix(const Tensor& v, bool as_row) {
  const int64_t k = v.shape()[0], s = v.strides()[0];
  if (as_row) return v.AsStrided({1, k}, {k * s, s}, v.storage_offset());
  return v.AsStrided({k, 1}, {s, 1}, v.storage_offset());
}

}  // namespace

KernelStub<GemmBatchFn> gemm_batch_stub("gemm", GemmBatchCpu);

Tensor matmul(const Tensor& input, const Tensor& other) {
  constexpr const char* kOp = "matmul";
  RequireDefined(kOp, "input", input);
  RequireDefined(kOp, "other", other);
  RequireSameDevice(kOp, "input", input, "other", other);
  GS_CHECK_ARG(input.dim() >= 1 && other.dim() >= 1,
               "matmul: both arguments need at least 1 dimension, got shapes ",
               ShapeToString(input.shape()), " and ", ShapeToString(other.shape()));
  GS_CHECK_ARG(input.dtype() == other.dtype(),
               "matmul: input and other must have the same dtype, got ", DTypeName(input.dtype()),
               " and ", DTypeName(other.dtype()));
  GS_CHECK_ARG(input.dtype() != DType::kBool, "matmul: bool tensors are not supported");
  const int64_t ra = input.dim(), rb = other.dim();
  if (IsHalfFloating(input.dtype()) &&
      (ra < 2 || rb < 2 || input.device().type != DeviceType::kCUDA)) {
    // Note [Ops on 16-bit floats]: matrix products of 16-bit tensors on a GPU run as they are,
    // on tensor cores; the others, like every op, in float32.
    return to(matmul(to(input, DType::kFloat32), to(other, DType::kFloat32)), input.dtype());
  }
  const int64_t k_input = input.shape()[ra - 1];
  const int64_t k_other = rb == 1 ? other.shape()[0] : other.shape()[rb - 2];
  GS_CHECK_ARG(k_input == k_other, "matmul: shapes ", ShapeToString(input.shape()), " and ",
               ShapeToString(other.shape()), " cannot be multiplied (", k_input, " != ", k_other,
               ")");
  if (ra >= 2 && rb >= 2) {
    // The batch dims must broadcast; say so with matmul's own message.
    BroadcastShapesOrThrow(kOp, BatchShape(input), BatchShape(other));
    return MatrixProduct(input, other, false, false);
  }
  const Tensor a = ra == 1 ? VectorAsMatrix(input, /*as_row=*/true) : input;
  const Tensor b = rb == 1 ? VectorAsMatrix(other, /*as_row=*/false) : other;
  const Tensor full = MatmulKernel(a, b, false, false);
  // Drop the size-1 dims that stood for the vectors.
  Shape shape(full.shape().begin(), full.shape().end() - 2);
  if (ra >= 2) shape.push_back(full.shape()[full.dim() - 2]);
  if (rb >= 2) shape.push_back(full.shape()[full.dim() - 1]);
  Tensor out = full.AsStrided(shape, ContiguousStrides(shape), 0);
  const VectorCase kind = ra == 1 && rb == 1 ? VectorCase::kDot
                          : ra == 1          ? VectorCase::kVecMat
                                             : VectorCase::kMatVec;
  if (auto node = RecordOp<VectorProductBackward>(out, {input, other}, kind)) {
    node->a_ = SavedVariable(input, false);
    node->b_ = SavedVariable(other, false);
  }
  return out;
}

void RegisterLinalgOps(OpRegistry& registry) {
  OpSchema schema;
  schema.name = "matmul";
  schema.doc =
      "torch.matmul: dot, matrix-vector, matrix and batched products, broadcasting batch dims";
  schema.input_names = {"input", "other"};
  schema.dtypes = {DType::kFloat32, DType::kFloat64, DType::kInt64};
  schema.run = [](const TensorList& in, const Attrs&) { return TensorList{matmul(in[0], in[1])}; };
  registry.Add(std::move(schema));
}

}  // namespace gradserve::ops
