"""Random graphs over gradserve's whole op set (DESIGN.md section 4), with their PyTorch
reference, for the parity tests.

RandomGraph(seed, dtype).build() grows a DualGraph (dual_graph.py) op by op: each step picks an
op family (binary elementwise with broadcasting, scalar operands, unary, where, reductions,
matmul in every rank combination, shape ops, NN ops) and inputs from the float values made so
far, creating leaves where an op needs a particular shape (a broadcasting partner, a matmul
operand, indices, targets, conv weights). Shapes have ranks 0 to 4 and sizes 1 to 4, so 0-d
tensors, size-1 dims and broadcasting are common. Since PyTorch evaluates each op as it is
added, the generator knows every value and keeps the graph numerically tame: log, sqrt, rsqrt
and pow get positive inputs, div a denominator away from zero, clamp bounds that no value
equals, layer_norm only well-conditioned groups, and an op whose result is not finite or
exceeds MAX_ABS is dropped.

In-place ops (add_, mul_, relu_, copy_, masked_fill_, index_put_, ...) write into a fresh
intermediate (a copy that no earlier op saved, so PyTorch's version checks pass) or into a view
of it (narrow, select, slice with a step, transpose, permute, reshape, unsqueeze); another view
of the same copy, made before the write, is kept for later ops, so the graph reads the write
through the base (CopySlices) and through views whose history is replayed.

Then it adds one or two backward calls: grad semantics over one to three roots with random
seeds, returning gradients for every grad leaf and some intermediate values (allow_unused),
and sometimes a backward-semantics call over other roots; in float64, sometimes a second-order
call through an in-graph grad op (a Hessian-vector product).

Everything is drawn from numpy's Generator seeded with `seed`, so a graph is reproducible from
(seed, dtype). Threading: one RandomGraph per thread.
"""

import numpy as np
import torch

from dual_graph import DualGraph, TORCH_OPS, to_numpy

MAX_ABS = 1e3
MAX_OPS = 9
MIN_NORM_VARIANCE = 0.05  # layer_norm groups; see well_conditioned_norm
MAX_PAIR_VARIANCE = 1.0  # layer_norm groups of two elements; likewise
BOUND_GAP = 1e-5  # clamp bounds; see bounds_between_values


class RandomGraph:
    """One random graph; build() returns (DualGraph, expected forward values {name: array})."""

    def __init__(self, seed, dtype, ops=None):
        self.rng = np.random.default_rng(seed)
        self.dtype = np.dtype(dtype)
        self.g = DualGraph()
        self.floats = []  # names of float values, in creation order
        self.allowed = set(ops) if ops is not None else None
        self.ops_used = []
        self._families = [
            (self.binary, 4), (self.scalar_operand, 1), (self.unary, 4), (self.where, 1),
            (self.reduction, 2), (self.matmul, 2), (self.shape_op, 4), (self.nn_op, 3),
            (self.in_place, 3)]

    # -- helpers -------------------------------------------------------------------------

    def choice(self, items):
        return items[int(self.rng.integers(len(items)))]

    def coin(self, p=0.5):
        return bool(self.rng.random() < p)

    def random_shape(self, max_rank=4):
        rank = int(self.rng.integers(0, max_rank + 1))
        return tuple(int(s) for s in self.rng.integers(1, 5, size=rank))

    def partner(self, shape):
        """A shape that broadcasts with `shape`: dims set to 1, leading dims dropped or added."""
        dims = [1 if self.coin(0.3) else s for s in shape]
        if dims and self.coin(0.3):
            dims = dims[int(self.rng.integers(1, len(dims) + 1)):]
        if len(dims) < 4 and self.coin(0.2):
            dims = [int(self.rng.integers(1, 4))] + dims
        return tuple(dims)

    def leaf(self, shape, requires_grad=None, low=-1.5, high=1.5, positive=False, away=False):
        """A new float leaf; away: values with |v| in [0.5, 1.5] (denominators)."""
        if positive:
            data = self.rng.uniform(0.5, 1.5, size=shape)
        elif away:
            data = self.rng.uniform(0.5, 1.5, size=shape) * self.rng.choice([-1, 1], size=shape)
        else:
            data = self.rng.uniform(low, high, size=shape)
        if requires_grad is None:
            requires_grad = self.coin(0.85)
        name = self.g.leaf(np.asarray(data, dtype=self.dtype), requires_grad)
        self.floats.append(name)
        return name

    def index_leaf(self, shape, high, low=0):
        return self.g.leaf(self.rng.integers(low, high, size=shape).astype(np.int64))

    def value(self, name):
        return self.g.values[name]

    def shape(self, name):
        return tuple(self.value(name).shape)

    def pick(self, min_rank=0, max_rank=4):
        """A float value with a rank in range, favouring recent ones; None if there is none."""
        names = [n for n in self.floats if min_rank <= self.value(n).dim() <= max_rank]
        if not names:
            return None
        weights = np.arange(1, len(names) + 1, dtype=np.float64) ** 2
        return names[int(self.rng.choice(len(names), p=weights / weights.sum()))]

    def pick_shaped(self, shape):
        """An existing float value of exactly this shape, or a new leaf with it."""
        names = [n for n in self.floats if self.shape(n) == tuple(shape)]
        return self.choice(names) if names and self.coin(0.5) else self.leaf(shape)

    def try_op(self, op, inputs, no_grad=False, **attrs):
        """Adds op if the server has it, PyTorch accepts it and its result is tame."""
        if self.allowed is not None and op not in self.allowed:
            return None
        try:
            with torch.set_grad_enabled(not no_grad):
                result = self.g.evaluate(op, inputs, attrs)
        except (RuntimeError, IndexError, ValueError):
            return None
        if result.is_floating_point():
            r = result.detach()
            if not torch.isfinite(r).all() or (r.numel() and r.abs().max() > MAX_ABS):
                return None
        name = self.g.add(op, inputs, result, no_grad=no_grad, **attrs)
        self.ops_used.append(op)
        if result.is_floating_point():
            self.floats.append(name)
        return name

    def positive(self, x):
        """x mapped to positive values (at least ~0.1) through differentiable ops."""
        v = self.value(x).detach()
        if v.numel() and v.min() > 0.2:
            return x
        kind = self.choice(["abs", "sigmoid", "softplus", "exp"])
        if kind == "exp" and v.numel() and v.max() > 2:
            kind = "softplus"
        y = self.try_op(kind, [x])
        return y and self.try_op("add", [y], other=0.25 if kind != "abs" else 0.5)

    # -- op families; each returns the new value's name or None ----------------------------

    def binary(self):
        op = self.choice(["add", "sub", "mul", "div", "pow"])
        x = self.pick()
        if x is None:
            return None
        y = self.pick_shaped(self.partner(self.shape(x)))
        attrs = {}
        if op in ("add", "sub") and self.coin(0.3):
            attrs["alpha"] = float(self.choice([0.5, -2.0, 3.0]))
        if op == "div":
            yv = self.value(y).detach()
            if yv.numel() and yv.abs().min() < 0.3:
                y = self.leaf(self.shape(y), away=True)
        if op == "pow":
            x = self.positive(x)
            y = self.leaf(self.shape(y), low=-2, high=2)
        if x is None:
            return None
        return self.try_op(op, [x, y] if not self.coin(0.3) or op in ("div", "pow")
                           else [y, x], **attrs)

    def scalar_operand(self):
        op = self.choice(["add", "sub", "mul", "div", "pow"])
        x = self.pick()
        if x is None:
            return None
        if op == "pow":
            exponent = self.choice([2, 3, 2.0, -1.0, 0.5, 1.5, -0.5])
            if not (isinstance(exponent, int) or exponent in (2.0, -1.0)):
                x = self.positive(x)
            return x and self.try_op("pow", [x], exponent=exponent)
        other = self.choice([2, -3, 0.5, 1.25, -0.75])
        attrs = {"other": other}
        if op in ("add", "sub") and self.coin(0.3):
            attrs["alpha"] = 2.0
        return self.try_op(op, [x], **attrs)

    def unary(self):
        op = self.choice(["neg", "exp", "log", "sqrt", "rsqrt", "abs", "sin", "cos", "tanh",
                          "sigmoid", "relu", "gelu", "softplus", "clamp", "detach"])
        x = self.pick()
        if x is None:
            return None
        v = self.value(x).detach()
        attrs = {}
        if op in ("log", "sqrt", "rsqrt"):
            x = self.positive(x)
        elif op == "exp" and v.numel() and v.max() > 3:
            return None
        elif op == "gelu" and self.coin(0.6):
            attrs["approximate"] = self.choice(["none", "tanh"])
        elif op == "softplus":
            if self.coin(0.5):
                attrs["beta"] = float(self.choice([0.5, 2.0]))
            if self.coin(0.5):
                attrs["threshold"] = float(self.choice([0.5, 1.0, 20.0]))
        elif op == "clamp":
            lo, hi = self.bounds_between_values(to_numpy(v))
            which = self.choice(["min", "max", "both"])
            if which in ("min", "both"):
                attrs["min"] = float(lo)
            if which in ("max", "both"):
                attrs["max"] = float(hi)
        return x and self.try_op(op, [x], **attrs)

    def bounds_between_values(self, values):
        """Two clamp bounds, each midway between values at least BOUND_GAP apart (relatively),
        so that no value lies on or next to a bound: a bound within rounding of a computed
        value would make the gradient depend on the last bits of that value, which may differ
        between any two implementations. (Midway between float32 values an ulp apart, in
        float32, is one of them: a float32 softmax that rounded correctly where PyTorch's did
        not sat on such a bound; diff_fuzz.py seed 206124671, graph 809.) Where no two values
        are that far apart, the bounds enclose them all."""
        points = np.unique(np.asarray(values, dtype=np.float64))
        if points.size == 0:
            return -0.25, 0.25
        gaps = np.diff(points) > BOUND_GAP * np.maximum(np.abs(points[:-1]), np.abs(points[1:]))
        mids = ((points[:-1] + points[1:]) / 2)[gaps]
        if mids.size == 0:
            margin = 0.25 + BOUND_GAP * float(np.abs(points).max())
            return float(points[0]) - margin, float(points[-1]) + margin
        lo, hi = sorted(self.rng.choice(mids, size=2))
        return float(lo), float(hi)

    def where(self):
        x = self.pick()
        if x is None:
            return None
        y = self.pick_shaped(self.partner(self.shape(x)))
        cond = self.g.leaf(self.rng.random(self.partner(self.shape(x))) < 0.5)
        return self.try_op("where", [cond, x, y])

    def reduction(self):
        op = self.choice(["sum", "mean", "amax"])
        x = self.pick()
        if x is None:
            return None
        rank = self.value(x).dim()
        attrs = {}
        if rank and self.coin(0.7):
            k = int(self.rng.integers(1, rank + 1))
            dims = self.rng.choice(rank, size=k, replace=False)
            attrs["dim"] = [int(d) - rank if self.coin(0.3) else int(d) for d in dims]
        if self.coin(0.4):
            attrs["keepdim"] = self.coin()
        return self.try_op(op, [x], **attrs)

    def matmul(self):
        x = self.pick(min_rank=1)
        if x is None:
            return None
        sx = self.shape(x)
        m = int(self.rng.integers(1, 5))
        if self.coin(0.6):  # x @ other
            k = sx[-1]
            kind = self.choice(["vec", "mat", "batch"])
            if kind == "vec":
                so = (k,)
            elif kind == "mat":
                so = (k, m)
            else:
                so = self.partner(sx[:-2]) + (k, m) if len(sx) > 2 else (2, k, m)
            return self.try_op("matmul", [x, self.pick_shaped(so)])
        k = sx[0] if len(sx) == 1 else sx[-2]
        kind = self.choice(["vec", "mat", "batch"])
        if kind == "vec":
            so = (k,)
        elif kind == "mat":
            so = (m, k)
        else:
            so = self.partner(sx[:-2]) + (m, k) if len(sx) > 2 else (3, m, k)
        return self.try_op("matmul", [self.pick_shaped(so), x])

    def shape_op(self):
        op = self.choice(["reshape", "transpose", "permute", "expand", "squeeze", "unsqueeze",
                          "cat", "stack", "narrow", "select", "index_select", "gather"])
        x = self.pick(min_rank=0 if op in ("reshape", "expand", "squeeze", "unsqueeze",
                                           "stack") else 1)
        if x is None:
            return None
        s = self.shape(x)
        rank = len(s)
        dim = int(self.rng.integers(-rank, rank)) if rank else 0
        if op == "reshape":
            return self.try_op(op, [x], shape=self.reshape_target(s))
        if op == "transpose":
            return self.try_op(op, [x], dim0=dim, dim1=int(self.rng.integers(-rank, rank)))
        if op == "permute":
            return self.try_op(op, [x], dims=[int(d) for d in self.rng.permutation(rank)])
        if op == "expand":
            size = [int(self.rng.integers(1, 4)) if d == 1 else self.choice([d, -1]) for d in s]
            lead = [int(self.rng.integers(1, 3)) for _ in range(int(self.rng.integers(0, 2)))]
            return self.try_op(op, [x], size=lead + size)
        if op == "squeeze":
            if not rank or self.coin(0.3):
                return self.try_op(op, [x])
            ones = [i for i, d in enumerate(s) if d == 1]
            return self.try_op(op, [x], dim=self.choice(ones) if ones and self.coin(0.8) else dim)
        if op == "unsqueeze":
            return self.try_op(op, [x], dim=int(self.rng.integers(-rank - 1, rank + 1)))
        if op in ("cat", "stack"):
            parts = [x]
            for _ in range(int(self.rng.integers(1, 3))):
                if self.coin(0.3):
                    parts.append(x)  # fan-in: the same value twice
                elif op == "cat":
                    shape = list(s)
                    shape[dim] = int(self.rng.integers(1, 4))
                    parts.append(self.pick_shaped(tuple(shape)))
                else:
                    parts.append(self.pick_shaped(s))
            if op == "stack":
                dim = int(self.rng.integers(-rank - 1, rank + 1))
            return self.try_op(op, parts, dim=dim)
        size = s[dim]
        if op == "narrow":
            length = int(self.rng.integers(1, size + 1))
            start = int(self.rng.integers(0, size - length + 1))
            return self.try_op(op, [x], dim=dim, start=start, length=length)
        if op == "select":
            return self.try_op(op, [x], dim=dim, index=int(self.rng.integers(-size, size)))
        if op == "index_select":
            shape = () if self.coin(0.2) else (int(self.rng.integers(1, 6)),)
            return self.try_op(op, [x, self.index_leaf(shape, size)], dim=dim)
        shape = [int(self.rng.integers(1, d + 1)) for d in s]  # gather
        shape[dim] = int(self.rng.integers(1, 5))
        return self.try_op(op, [x, self.index_leaf(tuple(shape), size)], dim=dim)

    IN_PLACE_OPS = ["add_", "sub_", "mul_", "div_", "relu_", "sigmoid_", "tanh_", "clamp_",
                    "copy_", "masked_fill_", "fill_", "zero_", "index_put_"]

    def view_of(self, x):
        """A random view op over x (rank >= 1 for most); returns (op, attrs) or None."""
        s = self.shape(x)
        rank = len(s)
        if rank == 0:
            return ("unsqueeze", {"dim": 0}) if self.coin(0.5) else None
        dim = int(self.rng.integers(-rank, rank))
        size = s[dim]
        kind = self.choice(["narrow", "select", "slice", "transpose", "permute", "reshape",
                            "unsqueeze"])
        if kind == "narrow":
            length = int(self.rng.integers(1, size + 1))
            return kind, {"dim": dim, "start": int(self.rng.integers(0, size - length + 1)),
                          "length": length}
        if kind == "select":
            return kind, {"dim": dim, "index": int(self.rng.integers(-size, size))}
        if kind == "slice":
            return kind, {"dim": dim, "start": int(self.rng.integers(0, size)),
                          "step": int(self.rng.integers(1, 3))}
        if kind == "transpose":
            return kind, {"dim0": dim, "dim1": int(self.rng.integers(-rank, rank))}
        if kind == "permute":
            return kind, {"dims": [int(d) for d in self.rng.permutation(rank)]}
        if kind == "reshape":
            return kind, {"shape": self.reshape_target(s)}
        return kind, {"dim": int(self.rng.integers(-rank - 1, rank + 1))}

    def in_place(self):
        """An in-place op on a fresh copy of an intermediate or on a view of it."""
        x = self.pick()
        if x is None or not self.value(x).requires_grad:
            return None
        base = self.try_op("mul", [x], other=1.0)  # saved by nobody: PyTorch's checks pass
        if base is None:
            return None
        target = base
        if self.coin(0.6):
            view = self.view_of(base)
            target = view and self.try_op(view[0], [base], **view[1])
            if target is None:
                return None
            if self.coin(0.5):  # another view of the base, made before the write
                other = self.view_of(base)
                if other is not None:
                    self.try_op(other[0], [base], **other[1])
        op = self.choice(self.IN_PLACE_OPS)
        s = self.shape(target)
        storage = self.value(base).storage().data_ptr()

        def operand(shape):
            """pick_shaped, but never a tensor sharing the base's elements: PyTorch would save
            it for the gradient and then refuse the backward once the write changed it."""
            name = self.pick_shaped(shape)
            if self.value(name).storage().data_ptr() == storage:
                name = self.leaf(shape)
            return name

        inputs, attrs = [target], {}
        if op in ("add_", "sub_", "mul_", "div_"):
            if self.coin(0.3):
                attrs["other"] = float(self.choice([2, -3, 0.5, 1.25]))
            elif op == "div_":
                inputs.append(self.leaf(self.partner(s), away=True))
            else:
                inputs.append(operand(self.partner(s)))
        elif op == "clamp_":
            lo, hi = self.bounds_between_values(to_numpy(self.value(target).detach()))
            attrs = {"min": float(lo), "max": float(hi)}
        elif op == "copy_":
            inputs.append(operand(self.partner(s)))
        elif op == "masked_fill_":
            inputs.append(self.g.leaf(self.rng.random(self.partner(s)) < 0.5))
            attrs["value"] = float(self.choice([0.0, -1.5, 2.0]))
        elif op == "fill_":
            attrs["value"] = float(self.choice([0.0, 0.5, -2.0]))
        elif op == "index_put_":
            if not s:
                return None
            k = int(self.rng.integers(1, min(len(s), 4) + 1))  # the op takes up to four
            n = int(self.rng.integers(1, 4))
            # Distinct positions: without accumulate a repeated one is refused (and undefined
            # in PyTorch).
            flat = self.rng.choice(int(np.prod(s[:k])), size=min(n, int(np.prod(s[:k]))),
                                   replace=False)
            positions = np.unravel_index(flat, s[:k])
            accumulate = self.coin(0.3)
            if accumulate and self.coin(0.5):
                positions = tuple(np.concatenate([p, p[:1]]) for p in positions)
            values_shape = (len(positions[0]),) + s[k:]
            inputs.append(operand(values_shape if self.coin(0.7) else values_shape[1:]))
            inputs += [self.g.leaf(p.astype(np.int64)) for p in positions]
            if accumulate:
                attrs["accumulate"] = True
        if self.allowed is not None and op not in self.allowed:
            return None
        # gradserve refuses an in-place result of another dtype where PyTorch converts it
        # (Note [In-place ops]): operands of another float dtype are not drawn.
        if any(self.value(i).is_floating_point() and self.value(i).dtype != self.value(target).dtype
               for i in inputs[1:]):
            return None
        # The value check of try_op, on copies first: a write PyTorch made could not be undone.
        try:
            trial = TORCH_OPS[op](*[self.value(i).detach().clone() for i in inputs], **attrs)
        except (RuntimeError, IndexError, ValueError):
            return None
        if not torch.isfinite(trial).all() or (trial.numel() and trial.abs().max() > MAX_ABS):
            return None
        return self.try_op(op, inputs, **attrs)

    def reshape_target(self, s):
        numel = int(np.prod(s, dtype=np.int64))
        dims = []
        rest = numel
        for _ in range(int(self.rng.integers(0, 4))):
            divisors = [d for d in range(1, rest + 1) if rest % d == 0]
            d = self.choice(divisors)
            dims.append(d)
            rest //= d
        dims.append(rest)
        self.rng.shuffle(dims)
        if self.coin(0.3):
            dims[int(self.rng.integers(len(dims)))] = -1
        return [int(d) for d in dims]

    def nn_op(self):
        op = self.choice(["softmax", "log_softmax", "cross_entropy", "mse_loss", "layer_norm",
                          "embedding", "conv2d"])
        if op in ("softmax", "log_softmax"):
            x = self.pick()
            if x is None:
                return None
            rank = self.value(x).dim()
            dim = int(self.rng.integers(-rank, rank)) if rank else self.choice([0, -1])
            return self.try_op(op, [x], dim=dim)
        if op == "cross_entropy":
            return self.cross_entropy()
        if op == "mse_loss":
            x = self.pick()
            if x is None:
                return None
            attrs = {"reduction": self.choice(["none", "mean", "sum"])} if self.coin(0.7) else {}
            return self.try_op(op, [x, self.pick_shaped(self.shape(x))], **attrs)
        if op == "layer_norm":
            x = self.pick(min_rank=1)
            if x is None:
                return None
            s = self.shape(x)
            k = int(self.rng.integers(1, min(len(s), 2) + 1))
            norm = list(s[-k:])
            if not self.well_conditioned_norm(x, k):
                return None
            inputs = [x]
            if self.coin(0.7):
                inputs.append(self.leaf(tuple(norm), requires_grad=True))
                if self.coin(0.6):
                    inputs.append(self.leaf(tuple(norm), requires_grad=True))
            attrs = {"eps": 1e-3} if self.coin(0.3) else {}
            return self.try_op(op, inputs, normalized_shape=norm, **attrs)
        if op == "embedding":
            weight = self.pick(min_rank=2, max_rank=2) if self.coin(0.5) else None
            if weight is None:
                weight = self.leaf((int(self.rng.integers(2, 6)), int(self.rng.integers(1, 4))),
                                   requires_grad=True)
            vocab = self.shape(weight)[0]
            indices = self.index_leaf(self.random_shape(max_rank=2), vocab)
            attrs = {}
            if self.coin(0.3):
                attrs["padding_idx"] = int(self.rng.integers(-vocab, vocab))
            return self.try_op(op, [weight, indices], **attrs)
        return self.conv2d()

    def well_conditioned_norm(self, x, k):
        """Whether every group layer_norm would normalize over x's last k dims has a variance of
        at least MIN_NORM_VARIANCE. Below it 1/sqrt(var + eps) amplifies float32 rounding past
        the tolerance, and a single-element group's output is rounding noise in PyTorch where
        gradserve gives an exact 0: abs or relu after it then take different branches. A pair's
        variance must also be at most MAX_PAIR_VARIANCE: a pair normalizes to +-1 whatever its
        values, so its input's gradient is eps / (var + eps) times terms of rstd * grad, a
        cancellation that leaves float64 rounding of about 1e-16 * var / eps relative in any
        formula (a pair 80 apart: gradserve 3e-7 and PyTorch's float64 reference 8e-8 from the
        exact value; diff_fuzz.py seed 1979925486, graph 5) and float32 an exact 0."""
        v = self.value(x).detach().double()
        if v.numel() == 0:
            return True
        dims = tuple(range(v.dim() - k, v.dim()))
        var = v.var(dim=dims, unbiased=False)
        if int(np.prod(v.shape[v.dim() - k:])) == 2 and var.max() > MAX_PAIR_VARIANCE:
            return False
        return bool(var.min() >= MIN_NORM_VARIANCE)

    def cross_entropy(self):
        x = self.pick(min_rank=1)
        if x is None:
            return None
        s = self.shape(x)
        classes = s[0] if len(s) == 1 else s[1]
        target_shape = () if len(s) == 1 else (s[0],) + s[2:]
        target = self.rng.integers(0, classes, size=target_shape).astype(np.int64)
        attrs = {}
        if self.coin(0.3):
            ignore = int(self.rng.integers(0, classes))
            attrs["ignore_index"] = ignore
            if target.size and (target == ignore).all():
                attrs.pop("ignore_index")
        if self.coin(0.6):
            attrs["reduction"] = self.choice(["none", "mean", "sum"])
        probabilities = self.coin(0.2)
        if probabilities:  # a target of the input's shape, maybe a leaf that requires grad
            probs = self.rng.uniform(0.05, 1, size=s)
            probs /= probs.sum(axis=0 if len(s) == 1 else 1, keepdims=True)
            inputs = [self.g.leaf(probs.astype(self.dtype), requires_grad=self.coin(0.5))]
            attrs.pop("ignore_index", None)
        else:
            inputs = [self.g.leaf(target)]
        if self.coin(0.3):  # class weights, away from 0 so that "mean" divides by no near-0 sum
            weight = self.rng.uniform(0.25, 2, size=(classes,)).astype(self.dtype)
            inputs.append(self.g.leaf(weight))
        if not probabilities and self.coin(0.25):  # nll_loss on log-probabilities: PyTorch's
            # cross_entropy in two ops
            y = self.try_op("log_softmax", [x], dim=0 if len(s) == 1 else 1)
            return y and self.try_op("nll_loss", [y] + inputs, **attrs)
        if self.coin(0.3):
            attrs["label_smoothing"] = 0.1
        return self.try_op("cross_entropy", [x] + inputs, **attrs)

    def conv2d(self):
        x = self.pick(min_rank=3, max_rank=4) if self.coin(0.5) else None
        groups = self.choice([1, 1, 2])
        if x is None:
            c = groups * int(self.rng.integers(1, 3))
            x = self.leaf((int(self.rng.integers(1, 3)), c, int(self.rng.integers(3, 7)),
                           int(self.rng.integers(3, 7))))
        c = self.shape(x)[-3]
        if c % groups:
            groups = 1
        out = groups * int(self.rng.integers(1, 3))
        kh, kw = int(self.rng.integers(1, 4)), int(self.rng.integers(1, 4))
        inputs = [x, self.leaf((out, c // groups, kh, kw), requires_grad=True)]
        if self.coin(0.5):
            inputs.append(self.leaf((out,), requires_grad=True))
        attrs = {}
        if self.coin(0.5):
            attrs["stride"] = [int(self.rng.integers(1, 3)), int(self.rng.integers(1, 3))]
        if self.coin(0.5):
            attrs["padding"] = [int(self.rng.integers(0, 2)), int(self.rng.integers(0, 2))]
        elif "stride" not in attrs and self.coin(0.4):  # "same" is for stride 1 only
            attrs["padding"] = self.choice(["same", "valid"])
        if self.coin(0.3):
            attrs["dilation"] = [int(self.rng.integers(1, 3)), int(self.rng.integers(1, 3))]
        if groups > 1:
            attrs["groups"] = groups
        return self.try_op("conv2d", inputs, **attrs)

    # -- the graph -----------------------------------------------------------------------

    def build(self):
        """Grows the graph and adds its backward calls; returns (DualGraph, {root: value})."""
        for _ in range(int(self.rng.integers(1, 4))):
            self.leaf(self.random_shape(), requires_grad=True)
        weights = np.array([w for _, w in self._families], dtype=np.float64)
        target = int(self.rng.integers(2, MAX_OPS + 1))
        for _ in range(4 * MAX_OPS):  # bounded: families may decline
            if len(self.ops_used) >= target:
                break
            family = self._families[int(self.rng.choice(len(weights), p=weights / weights.sum()))]
            family[0]()
        candidates = [n for n in self.floats
                      if self.value(n).requires_grad and not self.value(n).is_leaf]
        if not candidates:
            return None, None
        roots = [candidates[-1]] + [self.choice(candidates) for _ in range(self.rng.integers(0, 3))]
        roots = list(dict.fromkeys(roots))
        seeds = {r: self.seed_for(r) for r in roots if self.value(r).numel() != 1 or self.coin()}
        leaves = [n for n, t in self.g.values.items() if t.is_leaf and t.requires_grad]
        extra = [self.choice(candidates) for _ in range(self.rng.integers(0, 3))]
        inputs = list(dict.fromkeys(leaves + extra))
        second = self.coin(0.4)
        hvp = self.dtype == np.float64 and self.coin(0.3)
        self.g.grad_call(roots, inputs, seeds, retain_graph=second or hvp)
        if second:
            others = list(dict.fromkeys(self.choice(candidates) for _ in range(2)))
            self.g.backward_call(others, {r: self.seed_for(r) for r in others},
                                 retain_graph=hvp)
        if hvp:
            self.hessian_vector(roots[0], leaves)
        values = {r: to_numpy(self.value(r)) for r in roots}
        for r in roots:
            self.g.builder.return_values(r)
        return self.g, values

    def seed_for(self, root):
        return self.rng.uniform(-1, 1, size=self.shape(root)).astype(self.dtype)

    def hessian_vector(self, root, leaves):
        """Adds g = grad(root, leaves) inside the graph, then a call differentiating
        sum(g_i * v_i): a Hessian-vector product per leaf."""
        if self.allowed is not None and not {"grad", "mul", "sum", "add"} <= self.allowed:
            return
        seed = self.g.leaf(self.seed_for(root))
        grads = self.g.grad_op([root], leaves, [seed])
        # sum(root * seed) keeps the total differentiable where every second derivative is
        # structurally zero: PyTorch then still marks the gradients as requiring grad (its
        # backward ops take inputs they do not depend on), gradserve does not.
        total = self.g.op("sum", [self.g.op("mul", [root, seed])])
        for name, g in zip(leaves, grads):
            v = self.g.leaf(self.seed_for(name))
            total = self.g.op("add", [total, self.g.op("sum", [self.g.op("mul", [g, v])])])
        self.g.grad_call([total], leaves, none_as_zero=True)
