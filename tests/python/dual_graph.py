"""A graph built twice at once: as a gradserve request and as the same computation in PyTorch.

DualGraph records every leaf and op into a gradserve.GraphBuilder and evaluates it eagerly with
PyTorch (TORCH_OPS maps each gradserve op and its attributes to the PyTorch call with the same
meaning), so that the reference for any graph, random or hand-written, comes from one
description. Backward calls are likewise run in PyTorch and added to the request; compare()
then checks the server's response against them.

Error measure (per gradient or value): max|got - ref| / max(max|ref|, 1), the infinity-norm
error relative to the reference's magnitude, floored at 1 so that tiny references are compared
absolutely. Thresholds: TOLERANCE by dtype.

Threading: a DualGraph belongs to one thread.
"""

import contextlib
import math

import numpy as np
import torch
import torch.nn.functional as F

import server_fixture  # noqa: F401  (puts the client on sys.path)
from gradserve import GraphBuilder

TOLERANCE = {np.dtype(np.float64): 1e-10, np.dtype(np.float32): 1e-5}


@contextlib.contextmanager
def no_grad_leaks(values, keep=()):
    """Leaves every leaf's .grad in values (but those of the tensors in keep) as it was.
    PyTorch 1.13's grad() through a CopySlices (an in-place op on a view), and backward() with
    inputs, also accumulate into the .grad of the leaves the in-place op's other inputs reach,
    which neither must do and gradserve does not; a later backward-semantics call would
    otherwise expect that leak."""
    leaves = [t for t in values.values()
              if t.is_leaf and t.requires_grad and not any(t is k for k in keep)]
    before = [t.grad for t in leaves]
    try:
        yield
    finally:
        for t, g in zip(leaves, before):
            t.grad = g


def _baddbmm(x, batch1, batch2, beta, alpha):
    """torch.baddbmm, except with beta 0: there Debian's PyTorch 1.13 CPU kernel reads its own
    uninitialized output (beta times it), so a NaN left in freed memory comes through and the
    reference turns NaN now and then. The same values and gradients (the input's is zero) for
    the finite inputs the tests use, without it."""
    if beta == 0:
        return alpha * torch.bmm(batch1, batch2) + 0.0 * x
    return torch.baddbmm(x, batch1, batch2, beta=beta, alpha=alpha)


def _reduce(fn):
    def run(x, dim=None, keepdim=False):
        dims = tuple(dim) if dim else tuple(range(x.dim()))
        return fn(x, dim=dims, keepdim=keepdim) if dims or keepdim else fn(x)
    return run


def _operand(fn, name):
    """A binary op whose second operand is a tensor input or the scalar attribute `name`."""
    def run(x, y=None, **attrs):
        other = attrs.pop(name) if y is None else y
        return fn(x, other, **attrs)
    return run


def _gelu(x, approximate="none"):
    y = F.gelu(x, approximate=approximate)
    if y.requires_grad:
        # Debian's PyTorch 1.13 computes float32 gelu_backward (approximate="none") wrongly
        # when the incoming gradient is not contiguous (e.g. from matmul with a 1-d operand);
        # handing it a contiguous copy gives PyTorch's own formula on correct data.
        y.register_hook(lambda grad: grad.contiguous())
    return y


def _mse_loss(x, target, reduction="mean"):
    # PyTorch promotes mse_loss's operands (to promote_types of the two: it broadcasts them
    # first, so a 0-d target counts as dimensioned), but Debian's 1.13 then fails in backward
    # ("Found dtype Double but expected Float"); converting first gives the same forward and
    # the gradients that promotion means.
    dtype = torch.promote_types(x.dtype, target.dtype)
    return F.mse_loss(x.to(dtype), target.to(dtype), reduction=reduction)


def _squeeze(x, dim=None):
    return x.squeeze() if dim is None else x.squeeze(dim)


def _layer_norm(x, weight=None, bias=None, normalized_shape=(), eps=1e-5):
    return F.layer_norm(x, list(normalized_shape), weight, bias, eps)


def _conv2d(x, weight, bias=None, stride=(1, 1), padding=(0, 0), dilation=(1, 1), groups=1):
    padding = padding if isinstance(padding, str) else tuple(padding)  # or "same", "valid"
    return F.conv2d(x, weight, bias, tuple(stride), padding, tuple(dilation), groups)


def _dims(x, dim):
    """A reduction's dim attribute as PyTorch takes it: None or [] means every dim."""
    return tuple(dim) if dim else tuple(range(x.dim()))


def _masked_fill(x, mask, value_tensor=None, value=None):
    return x.masked_fill(mask, value if value_tensor is None else value_tensor)


def _var_or_std(fn):
    def run(x, dim=None, correction=None, unbiased=None, keepdim=False):
        if correction is None:
            correction = 1 if unbiased is None else int(unbiased)
        return fn(x, dim=_dims(x, dim), correction=correction, keepdim=keepdim)
    return run


def _batch_norm(x, running_mean=None, running_var=None, weight=None, bias=None,
                training=False, momentum=0.1, eps=1e-5):
    """F.batch_norm on copies of the running statistics, returning (output, running_mean,
    running_var) as gradserve's op does: the updated copies, or without running statistics
    the batch's mean and unbiased variance."""
    mean = None if running_mean is None else running_mean.detach().clone()
    var = None if running_var is None else running_var.detach().clone()
    out = F.batch_norm(x, mean, var, weight, bias, training, momentum, eps)
    if mean is None:
        dims = [0] + list(range(2, x.dim()))
        mean = x.detach().mean(dims)
        var = x.detach().var(dims, unbiased=True)
    return out, mean, var


def _mt19937_64(seed):
    """std::mt19937_64 seeded with seed, as an endless generator of 64-bit outputs."""
    n, m, mask = 312, 156, (1 << 64) - 1
    state = [seed & mask]
    for i in range(1, n):
        state.append((6364136223846793005 * (state[-1] ^ (state[-1] >> 62)) + i) & mask)
    while True:
        for i in range(n):
            y = (state[i] & 0xFFFFFFFF80000000) | (state[(i + 1) % n] & 0x7FFFFFFF)
            v = state[(i + m) % n] ^ (y >> 1) ^ (0xB5026F5AA96619E9 if y & 1 else 0)
            state[i] = v
            v ^= (v >> 29) & 0x5555555555555555
            v ^= (v << 17) & 0x71D67FFFEDA60000
            v ^= (v << 37) & 0xFFF7EEE000000000
            v ^= v >> 43
            yield v


def _dropout(x, p=0.5, training=True, seed=0):
    """gradserve's seeded dropout (engine/ops/dropout.h): element i is kept when the i-th
    draw of std::mt19937_64(seed), divided by 2^64, is at least p; then x * mask / (1 - p)."""
    if not training or p == 0:
        return x, torch.ones(x.shape, dtype=torch.bool)
    draws = _mt19937_64(seed)
    mask = torch.tensor([next(draws) / 2.0**64 >= p for _ in range(x.numel())],
                        dtype=torch.bool).reshape(x.shape)
    return x * (mask.to(x.dtype) * (0.0 if p == 1 else 1.0 / (1.0 - p))), mask


def _sdpa(q, k, v, attn_mask=None, dropout_p=0.0, is_causal=False, scale=None):
    """PyTorch 2's math path of scaled_dot_product_attention (1.13 has none)."""
    scores = q @ k.transpose(-2, -1) * (1 / math.sqrt(q.size(-1)) if scale is None else scale)
    if is_causal:
        keep = torch.ones(q.size(-2), k.size(-2), dtype=torch.bool).tril()
        scores = scores.masked_fill(~keep, float("-inf"))
    elif attn_mask is not None and attn_mask.dtype == torch.bool:
        scores = scores.masked_fill(~attn_mask, float("-inf"))
    elif attn_mask is not None:
        scores = scores + attn_mask
    return torch.softmax(scores, -1) @ v


def _embedding(weight, indices, padding_idx=None):
    # gradserve follows aten's torch.embedding(weight, indices) argument order.
    return F.embedding(indices, weight, padding_idx=padding_idx)


# gradserve op name -> PyTorch function of (inputs..., **attrs).
TORCH_OPS = {
    "add": _operand(torch.add, "other"),
    "sub": _operand(torch.sub, "other"),
    "mul": _operand(torch.mul, "other"),
    "div": _operand(torch.div, "other"),
    "pow": _operand(torch.pow, "exponent"),
    "neg": torch.neg, "exp": torch.exp, "log": torch.log, "sqrt": torch.sqrt,
    "rsqrt": torch.rsqrt, "abs": torch.abs, "sin": torch.sin, "cos": torch.cos,
    "tanh": torch.tanh, "sigmoid": torch.sigmoid, "relu": torch.relu,
    "gelu": _gelu,
    "softplus": lambda x, beta=1.0, threshold=20.0: F.softplus(x, beta, threshold),
    "clamp": lambda x, min=None, max=None: torch.clamp(x, min, max),
    "where": torch.where,
    "sum": _reduce(torch.sum), "mean": _reduce(torch.mean), "amax": _reduce(torch.amax),
    "matmul": torch.matmul,
    "reshape": lambda x, shape: x.reshape(list(shape)),
    "transpose": lambda x, dim0, dim1: x.transpose(dim0, dim1),
    "permute": lambda x, dims: x.permute(list(dims)),
    "expand": lambda x, size: x.expand(list(size)),
    "squeeze": _squeeze,
    "unsqueeze": lambda x, dim: x.unsqueeze(dim),
    "cat": lambda *xs, dim=0: torch.cat(xs, dim),
    "stack": lambda *xs, dim=0: torch.stack(xs, dim),
    "narrow": lambda x, dim, start, length: x.narrow(dim, start, length),
    "select": lambda x, dim, index: x.select(dim, index),
    "index_select": lambda x, index, dim: x.index_select(dim, index),
    "gather": lambda x, index, dim: x.gather(dim, index),
    "softmax": lambda x, dim: torch.softmax(x, dim),
    "log_softmax": lambda x, dim: torch.log_softmax(x, dim),
    "cross_entropy": lambda x, target, weight=None, reduction="mean", ignore_index=-100,
    label_smoothing=0.0: F.cross_entropy(x, target, weight=weight, reduction=reduction,
                                         ignore_index=ignore_index,
                                         label_smoothing=label_smoothing),
    "nll_loss": lambda x, target, weight=None, reduction="mean", ignore_index=-100: F.nll_loss(
        x, target, weight=weight, reduction=reduction, ignore_index=ignore_index),
    "mse_loss": _mse_loss,
    "layer_norm": _layer_norm,
    "embedding": _embedding,
    "conv2d": _conv2d,
    "detach": torch.Tensor.detach,
    "sign": torch.sign,
    "to": lambda x, dtype=None, device=None: x.to(getattr(torch, dtype)) if dtype else x,
    # The ops real models need (issue 28); max and min return (values, indices).
    "erf": torch.erf, "silu": F.silu,
    "leaky_relu": lambda x, negative_slope=0.01: F.leaky_relu(x, negative_slope),
    "elu": lambda x, alpha=1.0: F.elu(x, alpha),
    "maximum": torch.maximum, "minimum": torch.minimum,
    "masked_fill": _masked_fill,
    "tril": lambda x, diagonal=0: torch.tril(x, diagonal),
    "triu": lambda x, diagonal=0: torch.triu(x, diagonal),
    "logsumexp": lambda x, dim, keepdim=False: torch.logsumexp(x, _dims(x, dim), keepdim),
    "var": _var_or_std(torch.var), "std": _var_or_std(torch.std),
    "amin": _reduce(torch.amin),
    "max": lambda x, dim, keepdim=False: tuple(torch.max(x, dim, keepdim)),
    "min": lambda x, dim, keepdim=False: tuple(torch.min(x, dim, keepdim)),
    "linear": lambda x, weight, bias=None: F.linear(x, weight, bias),
    "bmm": torch.bmm,
    "baddbmm": lambda x, batch1, batch2, beta=1.0, alpha=1.0: _baddbmm(
        x, batch1, batch2, beta, alpha),
    "flip": lambda x, dims: torch.flip(x, list(dims)),
    "roll": lambda x, shifts, dims=None: torch.roll(x, list(shifts), list(dims) if dims else None),
    "slice": lambda x, dim=0, start=None, end=None, step=1: x[
        (slice(None),) * (dim % x.dim()) + (slice(start, end, step),)],
    "scatter_add": lambda x, index, src, dim: torch.scatter_add(x, dim, index, src),
    "index_add": lambda x, index, source, dim, alpha=1.0: torch.index_add(
        x, dim, index, source, alpha=alpha),
    "cumsum": lambda x, dim: torch.cumsum(x, dim),
    "max_pool2d": lambda x, kernel_size, stride=None, padding=0, dilation=1, ceil_mode=False:
    F.max_pool2d(x, kernel_size, stride or kernel_size, padding, dilation, ceil_mode),
    "avg_pool2d": lambda x, kernel_size, stride=None, padding=0, ceil_mode=False,
    count_include_pad=True, divisor_override=None: F.avg_pool2d(
        x, kernel_size, stride or kernel_size, padding, ceil_mode, count_include_pad,
        divisor_override),
    "adaptive_avg_pool2d": lambda x, output_size: F.adaptive_avg_pool2d(
        x, output_size[0] if len(output_size) == 1 else tuple(output_size)),
    "batch_norm": _batch_norm,
    "group_norm": lambda x, weight=None, bias=None, num_groups=1, eps=1e-5: F.group_norm(
        x, num_groups, weight, bias, eps),
    "dropout": _dropout,
    "scaled_dot_product_attention": _sdpa,
    # In-place ops: they write and return their first input (the same torch tensor).
    "add_": _operand(torch.Tensor.add_, "other"),
    "sub_": _operand(torch.Tensor.sub_, "other"),
    "mul_": _operand(torch.Tensor.mul_, "other"),
    "div_": _operand(torch.Tensor.div_, "other"),
    "relu_": torch.Tensor.relu_, "sigmoid_": torch.Tensor.sigmoid_, "tanh_": torch.Tensor.tanh_,
    "clamp_": lambda x, min=None, max=None: x.clamp_(min, max),
    "fill_": lambda x, value: x.fill_(value),
    "zero_": torch.Tensor.zero_,
    "copy_": torch.Tensor.copy_,
    "masked_fill_": lambda x, mask, value: x.masked_fill_(mask, value),
    "index_copy": lambda x, index, source, dim: torch.index_copy(x, dim, index, source),
    "index_copy_": lambda x, index, source, dim: x.index_copy_(dim, index, source),
    "index_put": lambda x, values, *indices, accumulate=False: torch.index_put(
        x, indices, values, accumulate),
    "index_put_": lambda x, values, *indices, accumulate=False: x.index_put_(
        indices, values, accumulate),
}


def to_numpy(t):
    """A copy (PyTorch may later update .grad in place) as a numpy array."""
    return t.detach().cpu().numpy().copy()


class DualGraph:
    """Records leaves and ops into a GraphBuilder and evaluates them in PyTorch.

    values: name -> torch tensor. log: one line per leaf and op, for failure messages.
    """

    def __init__(self, builder=None):
        self.builder = builder or GraphBuilder()
        self.values = {}
        self.log = []
        self.calls = []  # (kind, expected {name: array or None})
        self._counter = 0

    def fresh(self, prefix="v"):
        self._counter += 1
        return f"{prefix}{self._counter}"

    def leaf(self, array, requires_grad=False, name=None):
        name = name or self.fresh("x")
        array = np.asarray(array)
        self.builder.leaf(name, array, requires_grad=requires_grad)
        self.values[name] = torch.from_numpy(array.copy()).requires_grad_(requires_grad)
        self.log.append(f"{name} = leaf {array.dtype}{list(array.shape)}"
                        f"{' requires_grad' if requires_grad else ''}")
        return name

    def evaluate(self, op, inputs, attrs):
        """The PyTorch result of op on named values, without recording anything."""
        return TORCH_OPS[op](*[self.values[i] for i in inputs], **attrs)

    def add(self, op, inputs, result, name=None, no_grad=False, **attrs):
        """Records op whose PyTorch result is already computed (see evaluate)."""
        name = name or self.fresh()
        self.builder.op(op, inputs, out=name, no_grad=no_grad, **attrs)
        self.values[name] = result
        self.log.append(f"{name} = {op}({', '.join(inputs)}{_attr_text(attrs)})"
                        f" -> {list(result.shape)}{' no_grad' if no_grad else ''}")
        return name

    def op(self, op, inputs, name=None, no_grad=False, **attrs):
        """Records op and evaluates it in PyTorch; returns the output's name."""
        with torch.set_grad_enabled(not no_grad):
            result = self.evaluate(op, inputs, attrs)
        return self.add(op, inputs, result, name=name, no_grad=no_grad, **attrs)

    def torch_grad(self, *args, **kwargs):
        """torch.autograd.grad over self.values, without its leak (no_grad_leaks)."""
        with no_grad_leaks(self.values):
            return torch.autograd.grad(*args, **kwargs)

    def grad_op(self, roots, wrt, grad_outputs, names=None):
        """Records an in-graph grad op (create_graph, allow_unused, materialize_grads) and its
        PyTorch counterpart; returns the names of the gradients, one per wrt."""
        names = names or [self.fresh("g") for _ in wrt]
        grads = self.torch_grad([self.values[r] for r in roots],
                                [self.values[w] for w in wrt],
                                [self.values[s] for s in grad_outputs],
                                create_graph=True, allow_unused=True)
        self.builder.op("grad", roots, out=names, wrt=wrt,
                        grad_outputs=grad_outputs, allow_unused=True, materialize_grads=True)
        for name, w, g in zip(names, wrt, grads):
            self.values[name] = torch.zeros_like(self.values[w]) if g is None else g
        self.log.append(f"{names} = grad({roots} wrt {wrt}, grad_outputs={grad_outputs})")
        return names

    def grad_call(self, roots, inputs, seeds=None, retain_graph=False, none_as_zero=False):
        """A grad-semantics backward call, run in PyTorch and added to the request.

        seeds: {root: array}; roots without one must have one element. none_as_zero:
        materialize_grads (PyTorch's None becomes zeros).
        """
        seeds = seeds or {}
        tensors = [self.values[r] for r in roots]
        grad_outputs = [torch.from_numpy(np.asarray(seeds[r]).copy()) if r in seeds
                        else torch.ones_like(t) for r, t in zip(roots, tensors)]
        grads = self.torch_grad(tensors, [self.values[i] for i in inputs], grad_outputs,
                                retain_graph=True, allow_unused=True)
        expected = {}
        for name, g in zip(inputs, grads):
            if g is None and none_as_zero:
                g = torch.zeros_like(self.values[name])
            expected[name] = None if g is None else to_numpy(g)
        self.builder.backward_call(roots, seeds, inputs, retain_graph=retain_graph,
                                   allow_unused=True, materialize_grads=none_as_zero)
        self.calls.append(expected)
        return expected

    def backward_call(self, roots, seeds=None, retain_graph=False):
        """A backward-semantics call (accumulate into .grad), returning every grad leaf."""
        seeds = seeds or {}
        tensors = [self.values[r] for r in roots]
        grad_tensors = [torch.from_numpy(np.asarray(seeds[r]).copy()) if r in seeds
                        else torch.ones_like(t) for r, t in zip(roots, tensors)]
        torch.autograd.backward(tensors, grad_tensors, retain_graph=True)
        expected = {}
        for name, t in self.values.items():
            if t.is_leaf and t.requires_grad:
                expected[name] = None if t.grad is None else to_numpy(t.grad)
        self.builder.backward_call(roots, seeds, accumulate_grad=True, retain_graph=retain_graph)
        self.calls.append(expected)
        return expected

    def describe(self):
        return "\n".join("    " + line for line in self.log)


def _attr_text(attrs):
    return "".join(f", {k}={v!r}" for k, v in attrs.items())


def relative_error(got, ref):
    """max|got - ref| / max(max|ref|, 1); inf if shapes differ or got has NaN where ref does
    not."""
    got = np.asarray(got, dtype=np.float64)
    ref = np.asarray(ref, dtype=np.float64)
    if got.shape != ref.shape:
        return float("inf")
    if got.size == 0:
        return 0.0
    same_nan = np.isnan(got) == np.isnan(ref)
    if not same_nan.all():
        return float("inf")
    diff = np.where(np.isnan(ref), 0.0, np.abs(got - ref))
    scale = max(float(np.nanmax(np.abs(ref), initial=0.0)), 1.0)
    return float(diff.max()) / scale


def compare(result, expected_calls, expected_values):
    """Checks a GradResult against PyTorch's answers.

    Returns (worst error, problems): problems is a list of strings, one per gradient or value
    that is missing, wrongly (dis)connected, of the wrong dtype or shape, or over TOLERANCE.
    """
    worst = 0.0
    problems = []

    def check(label, got, ref):
        nonlocal worst
        if got is None or ref is None:
            if (got is None) != (ref is None):
                problems.append(f"{label}: gradserve {'None' if got is None else 'a tensor'}, "
                                f"PyTorch {'None' if ref is None else 'a tensor'}")
            return
        if got.dtype != ref.dtype or got.shape != ref.shape:
            problems.append(f"{label}: gradserve {got.dtype}{list(got.shape)}, "
                            f"PyTorch {ref.dtype}{list(ref.shape)}")
            return
        err = relative_error(got, ref)
        worst = max(worst, err)
        if not err <= TOLERANCE.get(ref.dtype, 0.0):
            problems.append(f"{label}: relative error {err:.3g} (max |ref| "
                            f"{np.abs(ref).max(initial=0):.3g})")

    if len(result.calls) != len(expected_calls):
        problems.append(f"{len(result.calls)} call results for {len(expected_calls)} calls")
    for i, (call, expected) in enumerate(zip(result.calls, expected_calls)):
        for name, ref in expected.items():
            if name not in call.gradients:
                problems.append(f"call {i}: no gradient for {name}")
                continue
            check(f"call {i} grad {name}", call.gradients[name], ref)
    for name, ref in expected_values.items():
        check(f"value {name}", result.values.get(name), ref)
    return worst, problems
