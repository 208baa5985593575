"""A DualGraph with a float64 twin, and the comparison that holds gradserve to PyTorch's own error.

ShadowGraph records a graph as DualGraph does (the gradserve request and PyTorch's eager result
in the graph's own dtypes) and runs the same graph a third time in PyTorch with every floating
leaf converted to float64: the reference. Leaves are drawn in their own dtype first, so the
reference sees exactly the values gradserve and PyTorch see; only the arithmetic differs.

Note [PyTorch's own error as the tolerance]
For every value and gradient the check compares three results of one graph: gradserve's (got),
PyTorch's in the graph's dtypes (torch) and PyTorch's in float64 (ref). The error of a result is
    E(x) = max |x - ref| / max |ref|        (absolute, max |x - ref|, where ref is all zero)
and gradserve passes when E(got) <= max(SLACK * own, FLOOR[dtype]): it may be as wrong as
PyTorch (times a small factor for rounding in another order), never more. own is the larger of
E(torch), E(perturbed), perturbed being the float64 reference run again on leaves moved by
PERTURBATION (a few float64 ulps), and E(single), single being PyTorch's run of the graph in
float32 on leaves moved by PERTURBATION32 (a few float32 ulps; scaled by EPS_RATIO in a float64
graph). In a float64 graph E(torch) is 0 by construction, and what two sound float64
implementations may differ by is the results' sensitivity to rounding of the inputs (the
perturbed run) and to rounding inside the computation, which PyTorch's float32 error, scaled by
the ratio of the dtypes' epsilons (2^-29), estimates: a result that is pure rounding residue (a
Hessian-vector product through a saturated softmax, 1e-16 where the exact value is 0) usually
shows as such in float32 too. Where it does not (float32 rounds it to an exact 0), a result
also passes when it is within ABS_FLOOR[dtype] (float64: about 45 ulps of 1; float32: about 2)
of the reference absolutely, for references of magnitude below 1 (relatively above it):
rounding residue of terms of magnitude 1 that cancel, no digit of a real value. In a float32
graph the same holds where PyTorch happens to get an exact 0 and gradserve a residue.
FLOOR absorbs summation order and a float32 graph's last bits; a float64 graph that computes in
float32 anywhere (a float32 leaf, or `to` float32) gets float32's FLOOR: PyTorch's own float32
rounding there may be lucky (diff_fuzz.py seed 17026474, graph 263: PyTorch's float32 sum of
three seeds of a float32 root fell 1e-8 from the float64 sum of the unrounded seeds, gradserve's
correctly rounded sum of the rounded seeds 5e-8). Non-finite elements: where ref is NaN or
infinite, got must be too (with the same sign of infinity) or the difference counts as
infinite; a result that is non-finite where ref is finite has infinite error, and passes only if
PyTorch's has too (PyTorch overflowed as well).

Note [A second sample of float32 rounding]
In a float32 graph E(torch) alone is one sample of float32 rounding, and where a result is
ill-conditioned that sample can be lucky: cos of a float32 dot product near 4e5 (an ulp of it
is 0.03) is noise in its second digit in any float32 evaluation, and a sum of such terms was
8e-5 off in PyTorch and 8e-3 in gradserve, whose dot products were as accurate (diff_fuzz.py
seed 1636175704, graph 728); log_softmax of 34 times sin of float32 means of 100s, whose
rounding errors happened to cancel in PyTorch's difference of two logits, likewise
(972751686/672: 1e-5 off in PyTorch, 1.5e-4 in gradserve, whose means were the more
accurate). So single, PyTorch's float32 run on leaves moved by a few float32 ulps, is a second
sample: it adds that rounding noise at a neighbouring input and the results' sensitivity to
float32-sized changes of the inputs (the backward error a float32 computation commits anyway).
Each leaf element is moved by a factor that depends on its value alone (a hash of its bits), so
exact zeros, ties (amax's shared maxima) and signs stay as they are. A well-conditioned result's
E(single) is a few float32 ulps, below FLOOR: the check stays as strict there.

Threading: a ShadowGraph belongs to one thread.
"""

import numpy as np
import torch

from dual_graph import TORCH_OPS, DualGraph, no_grad_leaks, to_numpy

FLOOR = {np.dtype(np.float32): 1e-5, np.dtype(np.float64): 1e-10}
SLACK = 4.0
PERTURBATION = 4 * np.finfo(np.float64).eps
PERTURBATION32 = 4 * float(np.finfo(np.float32).eps)
ABS_FLOOR = {np.dtype(np.float32): 1e-7, np.dtype(np.float64): 1e-14}
EPS_RATIO = float(np.finfo(np.float64).eps / np.finfo(np.float32).eps)


def _as64(t):
    """A float64 copy of a floating tensor (same requires_grad, a leaf); others unchanged."""
    if not t.is_floating_point():
        return t
    return t.detach().to(torch.float64).requires_grad_(t.requires_grad)


def _perturbed32(t, salt):
    """A float32 copy of a floating tensor (same requires_grad, a leaf) with each element moved
    by up to PERTURBATION32 of its magnitude, by a factor that is a function of its value and
    salt (Note [A second sample of float32 rounding]); others unchanged."""
    if not t.is_floating_point():
        return t
    t64 = t.detach().to(torch.float64)
    bits = t64.numpy().reshape(-1).view(np.uint64) ^ np.uint64(salt)
    with np.errstate(over="ignore"):
        mixed = bits * np.uint64(0x9E3779B97F4A7C15)
    u = (mixed >> np.uint64(11)).astype(np.float64) / 2.0**52 - 1.0  # in [-1, 1)
    moved = t64 * (1 + PERTURBATION32 * torch.from_numpy(u).reshape(t64.shape))
    return moved.to(torch.float32).requires_grad_(t.requires_grad)


def _perturbed64(t, rng):
    """_as64(t) with each element moved by up to PERTURBATION of its magnitude."""
    t = _as64(t)
    if not t.is_floating_point():
        return t
    u = torch.from_numpy(rng.uniform(-1, 1, size=tuple(t.shape)))
    return (t.detach() * (1 + PERTURBATION * u)).requires_grad_(t.requires_grad)


class ShadowGraph(DualGraph):
    """DualGraph plus two float64 twins of the same graph: values64 / calls64 (the reference)
    and values64p / calls64p (the reference on leaves perturbed by a few float64 ulps: the
    conditioning of each result, which bounds what any two sound float64 implementations may
    differ by; Note [PyTorch's own error as the tolerance]), and a float32 one, values32 /
    calls32, on leaves moved by a few float32 ulps (Note [A second sample of float32
    rounding])."""

    def __init__(self, builder=None, seed=0):
        super().__init__(builder)
        self.values64, self.calls64 = {}, []
        self.values64p, self.calls64p = {}, []
        self.values32, self.calls32 = {}, []
        self.hooks = {}  # value name -> the gradient hooks on it, in order
        self.leaf_names = []
        self._rng = np.random.default_rng(seed)
        self._salt = (seed * 0x2545F4914F6CDD1D + 1) % 2**64

    def _twins(self):
        return ((self.values64, self.calls64), (self.values64p, self.calls64p),
                (self.values32, self.calls32))

    def leaf(self, array, requires_grad=False, name=None):
        name = super().leaf(array, requires_grad, name)
        self.leaf_names.append(name)
        self.values64[name] = _as64(self.values[name])
        self.values64p[name] = _perturbed64(self.values[name], self._rng)
        self.values32[name] = _perturbed32(self.values[name], self._salt)
        return name

    def add(self, op, inputs, result, name=None, no_grad=False, **attrs):
        name = super().add(op, inputs, result, name=name, no_grad=no_grad, **attrs)
        with torch.set_grad_enabled(not no_grad):
            for values, _ in self._twins():
                twin_attrs = attrs
                if op == "to" and attrs.get("dtype") in ("float32", "float64"):
                    # Each twin stays in its one float dtype.
                    twin_attrs = dict(attrs, dtype="float32" if values is self.values32
                                      else "float64")
                values[name] = TORCH_OPS[op](*[values[i] for i in inputs], **twin_attrs)
        return name

    def _hooked(self, values, name, g):
        """g after the hooks of value `name` (Note [Hooks and captured gradients]). A value
        PyTorch's `to` returned as it was is the same tensor as another, with its hooks."""
        for hooked, fns in self.hooks.items() if g is not None else []:
            if values[hooked] is values[name]:
                for hook in fns:
                    g = hook(g)
        return g

    def grad_op(self, roots, wrt, grad_outputs, names=None):
        names = DualGraph.grad_op(self, roots, wrt, grad_outputs, names)
        for values in (self.values,) + tuple(v for v, _ in self._twins()):
            with no_grad_leaks(values):
                grads = torch.autograd.grad([values[r] for r in roots],
                                            [values[w] for w in wrt],
                                            [values[s] for s in grad_outputs],
                                            create_graph=True, allow_unused=True)
            for name, w, g in zip(names, wrt, grads):
                g = self._hooked(values, w, g)
                values[name] = torch.zeros_like(values[w]) if g is None else g
        return names

    def hook(self, name, kind, **attrs):
        """A named server-side hook on value `name` and its PyTorch counterpart."""
        self.builder.op("hook", [name], out=[], kind=kind, **attrs)
        fns = {"scale": lambda g: g * attrs["factor"],
               "clamp": lambda g: g.clamp(attrs.get("min"), attrs.get("max")),
               "zero": lambda g: torch.zeros_like(g)}
        for values in (self.values, self.values64, self.values64p, self.values32):
            values[name].register_hook(fns[kind])
        self.hooks.setdefault(name, []).append(fns[kind])
        self.log.append(f"hook {kind} on {name} {attrs}")

    def checkpoint(self, inputs, build_body):
        """A checkpoint op over inputs; build_body(body, formal names) -> output name. PyTorch
        runs the body inline: a checkpoint changes memory, not results."""
        from gradserve import GraphBuilder
        formal = [self.fresh("f") for _ in inputs]
        body = ShadowGraph(GraphBuilder(inputs=formal))
        body._counter = self._counter + 1000
        body._rng = self._rng
        for f, i in zip(formal, inputs):
            for mine, theirs in ((body.values, self.values), (body.values64, self.values64),
                                 (body.values64p, self.values64p),
                                 (body.values32, self.values32)):
                mine[f] = theirs[i]
        out = build_body(body, formal)
        body.builder.outputs(out)
        self._counter = body._counter
        name = self.fresh("ck")
        self.builder.op("checkpoint", inputs, out=[name], body=body.builder)
        self.values[name] = body.values[out]
        self.values64[name] = body.values64[out]
        self.values64p[name] = body.values64p[out]
        self.values32[name] = body.values32[out]
        self.log.append(f"{name} = checkpoint({inputs}) body:\n" + body.describe())
        return name

    def _seeds(self, values, roots, seeds):
        out = []
        for r in roots:
            t = values[r]
            out.append(torch.from_numpy(np.asarray(seeds[r]).copy()).to(t.dtype) if r in seeds
                       else torch.ones_like(t))
        return out

    def grad_call(self, roots, inputs, seeds=None, retain_graph=False, none_as_zero=False,
                  create_graph=False):
        seeds = seeds or {}
        expected = {}
        for values, calls in ((self.values, self.calls),) + self._twins():
            with no_grad_leaks(values):
                grads = torch.autograd.grad([values[r] for r in roots],
                                            [values[i] for i in inputs],
                                            self._seeds(values, roots, seeds), retain_graph=True,
                                            allow_unused=True, create_graph=create_graph)
            expected = {}
            for name, g in zip(inputs, grads):
                # Note [Hooks and captured gradients]: gradserve's engine captures a value's
                # gradient after the value's hooks (function_hook.h), as PyTorch 2 does; Debian's
                # PyTorch 1.13 captures it before them, so the hooks are applied here.
                g = self._hooked(values, name, g)
                if g is None and none_as_zero:
                    g = torch.zeros_like(values[name])
                expected[name] = None if g is None else to_numpy(g)
            calls.append(expected)
        self.builder.backward_call(roots, seeds, inputs, retain_graph=retain_graph,
                                   allow_unused=True, materialize_grads=none_as_zero,
                                   create_graph=create_graph)
        return self.calls[-1]

    def backward_call(self, roots, seeds=None, retain_graph=False, inputs=()):
        """backward() semantics: accumulate into .grad of inputs (every grad leaf if none),
        which may be non-leaves (PyTorch's backward(inputs=...) retains their grad)."""
        seeds = seeds or {}
        for values, calls in ((self.values, self.calls),) + self._twins():
            keep = [values[i] for i in inputs] or list(values.values())
            with no_grad_leaks(values, keep):
                torch.autograd.backward([values[r] for r in roots],
                                        self._seeds(values, roots, seeds), retain_graph=True,
                                        inputs=[values[i] for i in inputs] or None)
            # Every leaf of the graph that requires grad (not values PyTorch's `to` returned
            # as they were, which are the same tensors as leaves).
            names = list(inputs) or [n for n in self.leaf_names if values[n].requires_grad]
            calls.append({n: None if values[n].grad is None else to_numpy(values[n].grad)
                          for n in names})
        self.builder.backward_call(roots, seeds, list(inputs), accumulate_grad=True,
                                   retain_graph=retain_graph)
        return self.calls[-1]


def _error(x, ref):
    """E(x) of the Note, elementwise non-finite handling included. Differences within the
    subnormal range of x's dtype count as none: such values keep too few digits to compare."""
    xd = np.asarray(x).dtype
    tiny = float(np.finfo(xd).tiny) if xd.kind == "f" else 0.0
    x = np.asarray(x, dtype=np.float64)
    ref = np.asarray(ref, dtype=np.float64)
    if x.shape != ref.shape:
        return float("inf")
    if x.size == 0:
        return 0.0
    finite = np.isfinite(ref)
    same_special = (np.isnan(x) & np.isnan(ref)) | (np.isinf(ref) & (x == ref))
    if not (finite | same_special).all() or not np.isfinite(x[finite]).all():
        return float("inf")
    if not finite.any():
        return 0.0
    diff = max(float(np.abs(x[finite] - ref[finite]).max()) - tiny, 0.0)
    scale = np.abs(ref[finite]).max()
    return float(diff / scale) if scale > 0 else float(diff)


def _single_error(single, ref):
    """E(single) scaled to float64: the error PyTorch makes in float32, times the ratio of the
    dtypes' epsilons; 0 where float32 overflowed but float64 did not (no estimate there)."""
    if single is None:
        return 0.0
    err = _error(single, ref)
    return err * EPS_RATIO if np.isfinite(err) else 0.0


def check_tensor(label, got, torch_result, ref, perturbed, single=None, floor=None):
    """(error, tolerance, problem or None) for one value or gradient (the Note)."""
    if got is None or torch_result is None:
        if (got is None) != (torch_result is None):
            return 0.0, 0.0, (f"{label}: gradserve {'None' if got is None else 'a tensor'}, "
                              f"PyTorch {'None' if torch_result is None else 'a tensor'}")
        return 0.0, 0.0, None
    if got.dtype != torch_result.dtype or got.shape != torch_result.shape:
        return 0.0, 0.0, (f"{label}: gradserve {got.dtype}{list(got.shape)}, PyTorch "
                          f"{torch_result.dtype}{list(torch_result.shape)}")
    err = _error(got, ref)
    own = max(_error(torch_result, ref), _error(perturbed, ref) if perturbed is not None else 0)
    if np.dtype(torch_result.dtype) == np.float64:
        own = max(own, _single_error(single, ref))
    elif single is not None:  # Note [A second sample of float32 rounding]
        own = max(own, _error(single, ref))
    if floor is None:
        floor = FLOOR.get(np.dtype(torch_result.dtype), 0.0)
    tol = max(SLACK * own, floor)
    abs_floor = ABS_FLOOR.get(np.dtype(torch_result.dtype), 0.0)
    if not err <= tol and np.isfinite(err):
        # Rounding residue (see the Note): absolutely within ABS_FLOOR of the larger of the
        # reference's magnitude and 1.
        ref_max = float(np.nanmax(np.abs(np.asarray(ref, np.float64)), initial=0.0))
        if err * max(ref_max, 1e-300) <= abs_floor * max(ref_max, 1.0):
            return err, err, None
    if not err <= tol:
        return err, tol, (f"{label}: error {err:.3g} against float64, PyTorch's {own:.3g} "
                          f"(tolerance {tol:.3g}; max |ref| "
                          f"{np.nanmax(np.abs(np.asarray(ref, np.float64)), initial=0):.3g})")
    return err, tol, None


def compare_shadow(result, g, value_names=()):
    """Checks a GradResult against g's PyTorch results with g's float64 twin as the reference.
    Returns (worst error / tolerance ratio, problems)."""
    worst = 0.0
    problems = []

    # A float64 result computed partly in float32 (a float32 leaf or value: a mixed graph, or
    # `to` float32) gets float32's floor.
    floor = None
    if any(v.dtype == torch.float32 for v in g.values.values()):
        floor = FLOOR[np.dtype(np.float32)]

    def check(label, got, mine, ref, perturbed, single):
        nonlocal worst
        err, tol, problem = check_tensor(label, got, mine, ref, perturbed, single, floor)
        if problem:
            problems.append(problem)
        elif tol > 0:
            worst = max(worst, err / tol)

    if len(result.calls) != len(g.calls):
        problems.append(f"{len(result.calls)} call results for {len(g.calls)} calls")
    for i, (call, mine, ref, perturbed, single) in enumerate(
            zip(result.calls, g.calls, g.calls64, g.calls64p, g.calls32)):
        for name, expected in mine.items():
            if name not in call.gradients:
                problems.append(f"call {i}: no gradient for {name}")
                continue
            check(f"call {i} grad {name}", call.gradients[name], expected, ref[name],
                  perturbed[name], single[name])
    for name in value_names:
        check(f"value {name}", result.values.get(name), to_numpy(g.values[name]),
              to_numpy(g.values64[name]), to_numpy(g.values64p[name]),
              to_numpy(g.values32[name]))
    return worst, problems
