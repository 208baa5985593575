// Elementwise ops with PyTorch's names, argument names, dtype rules and broadcasting.
//
// Dtypes: float32 and float64 are differentiable. Binary ops promote their operands as
// PyTorch's result_type does (ResultType in op_kernels.h): float32 with float64 gives float64,
// except that a dimensioned tensor wins over a 0-d tensor of the same category (float32[3] with
// float64[] gives float32). The promotion is itself a differentiable cast (`to`), so each input's
// gradient comes back in its own dtype. int64 computes in int64 where PyTorch does (add, sub,
// mul, neg, abs, relu, clamp with integral bounds, pow with an int64 exponent, where); ops that
// are floating by nature (div, exp, log, ..., and any op with a float scalar) turn int64 and bool
// into float32. bool is accepted by add and mul (logical or / and, as in PyTorch), by where and
// by the floating ops; other arithmetic refuses it, as PyTorch does.
//
// Autograd: each op records its backward Node (PyTorch's names: MulBackward0, TanhBackward0, ...)
// when grad mode is on and an input requires grad. The backward formulas are written with these
// same ops, so with create_graph they record too and can be differentiated again. Without
// create_graph (grad mode off in the backward) the formulas with more than one step run as one
// fused loop instead.
//
// Errors: StatusError(INVALID_ARGUMENT) whose message names the op, the argument and the shapes
// or dtypes, e.g. "mul: shapes [2, 3] and [4] cannot be broadcast".
// Thread safety: stateless; concurrent calls are safe, also on the same inputs.

#ifndef GRADSERVE_ENGINE_OPS_ELEMENTWISE_H_
#define GRADSERVE_ENGINE_OPS_ELEMENTWISE_H_

#include <cstdint>
#include <optional>

#include "absl/strings/string_view.h"
#include "absl/types/span.h"
#include "engine/tensor/tensor.h"

namespace gradserve::ops {

// --- Binary arithmetic. The double overloads take `other` as a Python float scalar. ---

// input + alpha * other. AddBackward0 (AddBackward1 for a scalar other).
Tensor add(const Tensor& input, const Tensor& other, double alpha = 1);
Tensor add(const Tensor& input, double other, double alpha = 1);
// input - alpha * other. SubBackward0 (SubBackward1). bool operands are refused.
Tensor sub(const Tensor& input, const Tensor& other, double alpha = 1);
Tensor sub(const Tensor& input, double other, double alpha = 1);
// other - alpha * input (torch.rsub). RsubBackward1.
Tensor rsub(const Tensor& input, double other, double alpha = 1);
// input * other. MulBackward0.
Tensor mul(const Tensor& input, const Tensor& other);
Tensor mul(const Tensor& input, double other);

// Note [A scaled sum in one pass]
// sum(mul(x, s)) reads x, writes the product, then reads the product back: three passes over
// memory for one of work, and a product as big as x, when the product's MulBackward0 saves
// nothing of it and nothing else reads it. ScaledSum adds up the products as it makes them,
// stores none, and records the two Nodes that mul and sum would (MulBackward0 with s, on a
// stand-in for the product of its shape, dtype and device but one element; SumBackward0 on
// that), so the autograd graph and the gradient are the same. Each product is rounded to
// float32 before it is added, in the lanes and chunks of Note [Reducing a row in lanes]: the
// sum has the bits of mul then sum. The interpreter calls it when a graph's mul by a scalar is
// read by a whole sum alone and would be dropped after it (Note [Values freed after their
// last use] in engine/graph/interpreter.h), for float32 only: the one-pass sum tells an
// element from a partial sum by its type, float against double. On the 2-CPU VM the 64 MiB
// payload request's shared-memory call went from 9.7-10.6 ms to 6.6-7.9 ms, and it no longer
// holds the 64 MiB product. A deadline that stops the pass names the mul.
//
// True for what ScaledSum takes: a contiguous float32 CPU tensor.
bool TakesScaledSum(const Tensor& x);
// sum(mul(x, scale)) as a 0-d float32 tensor, x as TakesScaledSum says.
Tensor ScaledSum(const Tensor& x, double scale);

// Note [Elementwise chains]
// A small request's graph is mostly elementwise ops on tensors of a few elements, each read by
// the next op alone: grad_tiny is mul, tanh, add, sin, mul, sigmoid, sub, exp and relu on two
// [8] leaves. For such tensors an op's work is its bookkeeping, not its arithmetic: the output
// tensor, the Node with its edges and metadata, and in the backward the Engine's scheduling of
// that Node and the gradient tensors it makes, about 5.6k instructions an op (callgrind,
// docs/benchmarks.md) where its arithmetic is a few dozen. RunChain runs a chain of such ops
// as one: one loop per op over the elements, every op's output kept in one buffer, and one
// Node, ElementwiseChainBackward, whose backward runs the ops' gradient formulas in reverse
// over that buffer.
//
// What a caller sees does not change. Each element is computed by the very functors that the
// ops and their backward formulas use, in the same order and dtype, so values and gradients
// have the same bits. The Node's edges go, in order, to what the ops' Nodes' edges would
// have reached, by the last op first: a tensor that several of the ops read gets its
// gradients from them in the order the Engine would have delivered them (the later op's
// first), and sums them the same way. The interpreter counts the Node as the ops it stands for
// (num_nodes). What differs is what the ops' values were for the caller to name: the
// intermediate values do not exist, so the interpreter uses a chain only where nothing names
// them (Note [Values freed after their last use] in engine/graph/interpreter.h), and only
// where its Node is never differentiated again or checked for NaN per op: one call, without
// create_graph or anomaly mode, and no in-graph grad or checkpoint. An error inside a chain
// names the chain's first op when the forward pass raises it (the memory budget), and
// ElementwiseChainBackward labelled with the chain's last op when the backward does (a
// deadline, the memory budget). A chain uses no more memory than its ops would: the buffer
// holds what their Nodes would have saved.
//
// What takes part: float32 or float64 operands, all of one dtype and shape, contiguous, on
// the CPU, with at most kMaxChainElements elements each and at most kMaxChainOps ops; add and
// sub of two tensors without alpha, mul of two tensors, neg, exp, tanh, sigmoid, sin, cos and
// relu.
enum class ChainOp : uint8_t { kAdd, kSub, kMul, kNeg, kExp, kTanh, kSigmoid, kSin, kCos, kRelu };
inline constexpr int64_t kMaxChainElements = int64_t{1} << 12;
inline constexpr int64_t kMaxChainOps = 64;

// The chain op of that registry name, if it has one.
std::optional<ChainOp> ChainOpNamed(absl::string_view name);
// 2 for add, sub and mul, 1 for the others.
int ChainOpArity(ChainOp op);

// Whether t may be an operand of a chain whose head is head (pass head itself for the head):
// float32 or float64, contiguous, on the CPU, with 1 to kMaxChainElements elements, of head's
// dtype and shape.
bool FitsChain(const Tensor& t, const Tensor& head);

// One op of a chain. The chain's value (the previous op's output, or the head for the first
// op) is operand chain_operand (0 for a unary op); a binary op's other operand is other.
struct ChainLink {
  ChainOp op;
  int chain_operand = 0;
  Tensor other;
};

// Note [Elementwise chains]: the ops of links applied in turn from head, their Node recorded
// if grad mode is on and an operand requires grad; *recorded is set to how many Nodes the ops
// would have recorded (0 if none). Returns an undefined tensor, having done nothing, when the
// operands do not qualify. Throws StatusError as the ops would (the memory budget).
Tensor RunChain(const Tensor& head, absl::Span<const ChainLink> links, int64_t* recorded);

// input / other, true division (integers divide as float32). DivBackward0 (DivBackward1).
Tensor div(const Tensor& input, const Tensor& other);
Tensor div(const Tensor& input, double other);
// input ** exponent. PowBackward1 (tensor exponent) / PowBackward0 (scalar exponent). int64
// with an int64 exponent stays int64 (a negative exponent is then an error, as in PyTorch).
Tensor pow(const Tensor& input, const Tensor& exponent);
Tensor pow(const Tensor& input, double exponent);

// --- Unary. ---

Tensor neg(const Tensor& input);      // NegBackward0; not bool.
Tensor sign(const Tensor& input);     // SignBackward0: zero derivative, but recorded; not bool.
Tensor abs(const Tensor& input);      // AbsBackward0; not bool. Gradient 0 at 0, as PyTorch's.
Tensor exp(const Tensor& input);      // ExpBackward0
Tensor log(const Tensor& input);      // LogBackward0
Tensor sqrt(const Tensor& input);     // SqrtBackward0
Tensor rsqrt(const Tensor& input);    // RsqrtBackward0
Tensor sin(const Tensor& input);      // SinBackward0
Tensor cos(const Tensor& input);      // CosBackward0
Tensor tanh(const Tensor& input);     // TanhBackward0
Tensor sigmoid(const Tensor& input);  // SigmoidBackward0
Tensor erf(const Tensor& input);      // ErfBackward0 (a building block of gelu's backward)
// max(input, 0); int64 stays int64. ReluBackward0; not bool.
Tensor relu(const Tensor& input);
// x * Phi(x) with approximate "none", or the tanh approximation with "tanh". GeluBackward0.
Tensor gelu(const Tensor& input, absl::string_view approximate = "none");
// log(1 + exp(beta * x)) / beta, or x itself where beta * x > threshold. SoftplusBackward0.
Tensor softplus(const Tensor& input, double beta = 1, double threshold = 20);
// min(max(input, min), max); at least one bound must be given. int64 input with integral
// bounds stays int64 when `integral_bounds` (the bounds were ints); otherwise float rules apply.
// ClampBackward1. The gradient flows where min <= input <= max.
Tensor clamp(const Tensor& input, std::optional<double> min, std::optional<double> max,
             bool integral_bounds = false);

// condition ? input : other, broadcasting all three; condition must be bool. WhereBackward0.
Tensor where(const Tensor& condition, const Tensor& input, const Tensor& other);

// --- In-place forms (Note [In-place ops] in engine/ops/inplace.h). ---
// Each writes its result into self and returns self; no new output is allocated. The result's
// shape must be self's (only the operands broadcast to it) and its dtype self's. They record
// the same Nodes as their out-of-place forms, plus FillBackward2, ZeroBackward0, CopyBackwards
// and MaskedFillBackward0. With grad mode on, self must not be a leaf that requires grad, nor
// a view when anything involved requires grad.

Tensor add_(const Tensor& self, const Tensor& other, double alpha = 1);
Tensor add_(const Tensor& self, double other, double alpha = 1);
Tensor sub_(const Tensor& self, const Tensor& other, double alpha = 1);
Tensor sub_(const Tensor& self, double other, double alpha = 1);
Tensor mul_(const Tensor& self, const Tensor& other);
Tensor mul_(const Tensor& self, double other);
Tensor div_(const Tensor& self, const Tensor& other);
Tensor div_(const Tensor& self, double other);
Tensor tanh_(const Tensor& self);
Tensor sigmoid_(const Tensor& self);
Tensor relu_(const Tensor& self);
Tensor clamp_(const Tensor& self, std::optional<double> min, std::optional<double> max,
              bool integral_bounds = false);
// Every element set to value (converted to self's dtype).
Tensor fill_(const Tensor& self, double value);
Tensor zero_(const Tensor& self);
// self = src, src broadcast to self's shape and converted to its dtype; gradients flow to src.
Tensor copy_(const Tensor& self, const Tensor& src);
// value where mask (bool, broadcast to self's shape) is set.
Tensor masked_fill_(const Tensor& self, const Tensor& mask, double value);

// input converted to dtype (Tensor.to(dtype)); input itself if it already has it. Differentiable
// between floating dtypes: ToCopyBackward0 converts the gradient back.
Tensor to(const Tensor& input, DType dtype);

}  // namespace gradserve::ops

#endif  // GRADSERVE_ENGINE_OPS_ELEMENTWISE_H_
