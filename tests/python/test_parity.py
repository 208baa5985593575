"""Parity of gradserve's gradients with PyTorch's, through a real server.

RandomGraphParityTest sends GRADSERVE_PARITY_GRAPHS (default 1500) random graphs over the whole
op set (graph_gen.py), half float32 and half float64, seeded from GRADSERVE_PARITY_SEED
(default 0), and compares every gradient and root value with PyTorch's: the error
max|got - ref| / max(max|ref|, 1) must be at most 1e-10 in float64 and 1e-5 in float32. The
figures (graphs run, gradients compared, worst error per dtype, op coverage) are printed at the
end. HandWrittenParityTest covers the constructs one at a time: broadcasting, fan-in, several
roots with seeds, captured intermediates, unused inputs, double backward, Hessian-vector
products, checkpoints (nested), hooks, no-grad regions and .grad accumulation.

Run: GRADSERVE_SERVER=build/py/server/gradserve-server GRADSERVE_PY_STUBS=<stubs>
     /usr/bin/python3 tests/python/test_parity.py   (CTest sets both; see CMakeLists.txt)
"""

import collections
import os
import sys
import time
import unittest
import unittest.mock
import warnings

import numpy as np
import torch

from server_fixture import ServerProcess  # first: puts client/python on sys.path
from dual_graph import DualGraph, TOLERANCE, compare
from gradserve import GradserveError, GraphBuilder
from graph_gen import RandomGraph
from shadow_graph import ShadowGraph

# PyTorch warns about mse_loss's broadcasting and such; the comparison is what matters.
warnings.simplefilter("ignore", UserWarning)

DESIGN_OPS = """add sub mul div neg pow exp log sqrt rsqrt abs sin cos tanh sigmoid relu gelu
softplus clamp where sum mean amax matmul reshape transpose permute expand squeeze unsqueeze cat
stack narrow select index_select gather softmax log_softmax cross_entropy mse_loss layer_norm
embedding conv2d""".split()
GRAPH_LEVEL_OPS = {"grad", "checkpoint", "hook", "detach"}


class ServerTestCase(unittest.TestCase):
    """Starts one server for the class; self.client talks to it."""

    @classmethod
    def setUpClass(cls):
        cls.server = ServerProcess("--worker_threads=2").start()
        cls.client = cls.server.client()

    @classmethod
    def tearDownClass(cls):
        cls.client.close()
        cls.server.stop()

    def run_dual(self, g, values=None):
        """Sends g's request and asserts that every gradient and value matches PyTorch."""
        for name in values or {}:
            g.builder.return_values(name)
        result = self.client.grad(g.builder)
        worst, problems = compare(result, g.calls, values or {})
        self.assertFalse(problems, "\n".join(problems) + "\n  graph:\n" + g.describe())
        return result


class RandomGraphParityTest(ServerTestCase):
    GRAPHS = int(os.environ.get("GRADSERVE_PARITY_GRAPHS", "1500"))
    SEED = int(os.environ.get("GRADSERVE_PARITY_SEED", "0"))
    TIME_LIMIT_S = 300  # a bound, not an expectation: the run takes seconds

    def test_server_lists_every_op(self):
        names = {op.name for op in self.client.info().ops}
        missing = [op for op in DESIGN_OPS if op not in names]
        self.assertFalse(missing, f"GetServerInfo does not list {missing}")

    def test_random_graphs(self):
        available = {op.name for op in self.client.info().ops} | GRAPH_LEVEL_OPS
        start = time.monotonic()
        stats = {dt: {"graphs": 0, "gradients": 0, "worst": 0.0}
                 for dt in (np.dtype(np.float32), np.dtype(np.float64))}
        coverage = collections.Counter()
        failures = []
        for i in range(self.GRAPHS):
            if time.monotonic() - start > self.TIME_LIMIT_S:
                failures.append(f"time limit reached after {i} graphs")
                break
            seed = self.SEED + i
            dtype = np.dtype(np.float64 if i % 2 else np.float32)
            gen = RandomGraph(seed, dtype, available)
            g, values = gen.build()
            if g is None:
                continue
            coverage.update(gen.ops_used)
            label = f"graph seed={seed} dtype={dtype}"
            try:
                result = self.client.grad(g.builder, request_id=label)
            except GradserveError as e:
                failures.append(f"{label}: {e}\n{g.describe()}")
                continue
            worst, problems = compare(result, g.calls, values)
            s = stats[dtype]
            s["graphs"] += 1
            s["gradients"] += sum(len(c) for c in g.calls) + len(values)
            s["worst"] = max(s["worst"], worst)
            if problems:
                failures.append(f"{label}:\n  " + "\n  ".join(problems) + "\n" + g.describe())
        elapsed = time.monotonic() - start
        print(f"\nparity: {sum(s['graphs'] for s in stats.values())} random graphs in "
              f"{elapsed:.1f} s (seed {self.SEED}), {len(failures)} failing", file=sys.stderr)
        for dtype, s in stats.items():
            print(f"parity: {dtype}: {s['graphs']} graphs, {s['gradients']} tensors compared, "
                  f"worst relative error {s['worst']:.3g} (limit {TOLERANCE[dtype]:g})",
                  file=sys.stderr)
        print("parity: op coverage: " + ", ".join(
            f"{op} {n}" for op, n in sorted(coverage.items())), file=sys.stderr)
        if failures:
            self.fail(f"{len(failures)} graphs differ from PyTorch; first ones:\n"
                      + "\n".join(failures[:8]))


def leaf(g, shape, seed, dtype=np.float64, requires_grad=True, name=None):
    rng = np.random.default_rng(seed)
    return g.leaf(rng.uniform(-1, 1, size=shape).astype(dtype), requires_grad, name=name)


class HandWrittenParityTest(ServerTestCase):

    def test_broadcasting(self):
        for dtype in (np.float32, np.float64):
            g = DualGraph()
            x = leaf(g, (3, 1, 4), 1, dtype)
            y = leaf(g, (2, 1), 2, dtype)
            z = leaf(g, (), 3, dtype)
            h = g.op("mul", [g.op("add", [x, y]), z])
            w = g.op("div", [h, g.op("add", [g.op("exp", [y])], other=1.0)])
            seed = np.random.default_rng(4).uniform(-1, 1, size=(3, 2, 4)).astype(dtype)
            g.grad_call([w], [x, y, z], {w: seed})
            self.run_dual(g, {w: g.values[w].detach().numpy()})

    def test_one_graph_sent_again_with_new_values(self):
        """Note [Reusing a validated graph]: each server thread keeps the last graph it checked.
        The same graph sent again with new leaf values, shapes and dtypes, in turn with another
        graph, must still give PyTorch's gradients."""
        def same_graph(step, shape, dtype):
            g = DualGraph()
            x = leaf(g, shape, 100 + step, dtype, name="x")
            w = leaf(g, shape, 200 + step, dtype, requires_grad=False, name="w")
            h = g.op("tanh", [g.op("mul", [x, w])])
            loss = g.op("sum", [g.op("add", [h, g.op("mul", [x], other=0.5)])])
            g.grad_call([loss], [x])
            return g

        def other_graph(step):
            g = DualGraph()
            x = leaf(g, (4,), 300 + step, name="x")
            g.grad_call([g.op("sum", [g.op("sin", [x])])], [x])
            return g

        steps = [((8,), np.float32), ((8,), np.float32), ((3, 2), np.float64), ((), np.float64),
                 ((8,), np.float32)]
        for step, (shape, dtype) in enumerate(steps * 4):
            self.run_dual(same_graph(step, shape, dtype))
            if step % 3 == 2:
                self.run_dual(other_graph(step))

    def test_fan_in(self):
        g = DualGraph()
        x = leaf(g, (5,), 5)
        terms = [g.op("mul", [x, x]), g.op("sin", [x]), x, g.op("tanh", [x])]
        total = terms[0]
        for t in terms[1:]:
            total = g.op("add", [total, t])
        loss = g.op("sum", [g.op("cat", [total, x, x], dim=0)])
        g.grad_call([loss], [x])
        self.run_dual(g)

    def test_several_roots_with_seeds(self):
        g = DualGraph()
        x = leaf(g, (2, 3), 6)
        w = leaf(g, (3, 4), 7)
        a = g.op("matmul", [x, w])
        b = g.op("sum", [g.op("relu", [a])])
        c = g.op("mean", [g.op("mul", [x, x])], dim=[0])
        rng = np.random.default_rng(8)
        seeds = {a: rng.normal(size=(2, 4)), c: rng.normal(size=(3,))}
        g.grad_call([a, b, c], [x, w], seeds)  # b is seeded with ones
        self.run_dual(g)

    def test_captured_intermediates(self):
        g = DualGraph()
        x = leaf(g, (4, 3), 9)
        h = g.op("sigmoid", [x])
        k = g.op("softmax", [h], dim=1)
        loss = g.op("sum", [g.op("mul", [k, h])])
        g.grad_call([loss], [h, x, k])  # gradients with respect to values inside the graph
        self.run_dual(g)

    def test_unused_inputs(self):
        g = DualGraph()
        x = leaf(g, (3,), 10)
        unused = leaf(g, (2, 2), 11)
        loss = g.op("sum", [g.op("exp", [x])])
        g.grad_call([loss], [x, unused], retain_graph=True)
        g.grad_call([loss], [x, unused], none_as_zero=True)
        result = self.run_dual(g)
        self.assertEqual(result.calls[0].connected, {x: True, unused: False})
        self.assertIsNone(result.calls[0][unused])
        np.testing.assert_array_equal(result.calls[1][unused], np.zeros((2, 2)))
        # Without allow_unused the server refuses, naming the input.
        b = GraphBuilder().leaf("x", np.ones(3), requires_grad=True)
        b.leaf("unused", np.ones(2), requires_grad=True).op("sum", ["x"], out="loss")
        b.backward_call("loss", inputs=["x", "unused"])
        with self.assertRaises(GradserveError) as cm:
            self.client.grad(b)
        self.assertEqual(cm.exception.code.name, "INVALID_ARGUMENT")
        self.assertIn("unused", cm.exception.message)

    def test_double_backward(self):
        """d/dx of (dy/dx . v) through an in-graph grad op, and a call with create_graph."""
        g = DualGraph()
        x = leaf(g, (3,), 12)
        y = g.op("mul", [g.op("pow", [x], exponent=3), g.op("sin", [x])])
        v = leaf(g, (3,), 13, requires_grad=False)
        (dx,) = g.grad_op([y], [x], [v])
        g.grad_call([dx], [x], {dx: np.ones(3)}, retain_graph=True)
        # create_graph on a call returns the same first-order gradients.
        g.builder.backward_call([y], {y: np.ones(3)}, [x], create_graph=True, retain_graph=True)
        g.calls.append({x: torch.autograd.grad(g.values[y], g.values[x], torch.ones(3),
                                               retain_graph=True)[0].numpy()})
        self.run_dual(g)

    def test_hessian_vector_product(self):
        g = DualGraph()
        x = leaf(g, (4,), 14)
        a = leaf(g, (4, 4), 15, requires_grad=False)
        # f(x) = sum(tanh(A x) * x) + logsumexp-ish terms: a non-trivial Hessian.
        ax = g.op("matmul", [a, x])
        f = g.op("add", [g.op("sum", [g.op("mul", [g.op("tanh", [ax]), x])]),
                         g.op("sum", [g.op("log_softmax", [x], dim=0)])])
        one = g.leaf(np.array(1.0))
        (grad,) = g.grad_op([f], [x], [one])
        v = leaf(g, (4,), 16, requires_grad=False)
        hv_root = g.op("sum", [g.op("mul", [grad, v])])
        g.grad_call([hv_root], [x])
        result = self.run_dual(g)
        # Cross-check against an explicit Hessian.
        xt = g.values[x].detach()
        hessian = torch.autograd.functional.hessian(
            lambda t: (torch.tanh(g.values[a] @ t) * t).sum() + torch.log_softmax(t, 0).sum(), xt)
        np.testing.assert_allclose(result.calls[0][x], (hessian @ g.values[v]).numpy(),
                                   rtol=1e-10, atol=1e-12)

    def test_second_derivatives_of_layer_norm_and_conv2d_weights(self):
        """PyTorch records the backward of layer_norm and of conv2d as one function, so under
        create_graph their weight and bias gradients require grad even for a constant input,
        and differentiating them again gives None, not an error (Note [Gradients PyTorch
        computes in one function])."""
        cases = [("layer_norm", (2, 3), (3,), {"normalized_shape": [3]}),
                 ("conv2d", (1, 2, 4, 4), (3, 2, 3, 3), {})]
        for seed, (op, x_shape, w_shape, attrs) in enumerate(cases):
            with self.subTest(op=op):
                g = DualGraph()
                x = leaf(g, x_shape, 20 + seed, requires_grad=False)
                w = leaf(g, w_shape, 30 + seed)
                b = leaf(g, (w_shape[0],), 40 + seed)
                loss = g.op("sum", [g.op(op, [x, w, b], **attrs)])
                gw, gb = g.grad_op([loss], [w, b], [g.leaf(np.array(1.0))])
                self.assertTrue(g.values[gw].requires_grad and g.values[gb].requires_grad)
                root = g.op("add", [g.op("sum", [gw]), g.op("sum", [gb])])
                g.grad_call([root], [w, b], retain_graph=True)
                g.grad_call([root], [w, b], none_as_zero=True)
                result = self.run_dual(g)
                self.assertIsNone(result.calls[0][w])
                np.testing.assert_array_equal(result.calls[1][b], np.zeros(w_shape[0]))

    def test_in_place_ops(self):
        """In-place chains as PyTorch runs them: a name refers to the written tensor."""
        for dtype in (np.float32, np.float64):
            with self.subTest(dtype=np.dtype(dtype).name):
                g = DualGraph()
                x = leaf(g, (2, 3), 40, dtype)
                w = leaf(g, (3,), 41, dtype)
                g.op("mul_", [w], no_grad=True, other=0.5)  # an optimizer-style update
                c = leaf(g, (2, 3), 42, dtype, requires_grad=False)
                mask = g.leaf(np.array([True, False, True]))
                h = g.op("mul", [x, w])
                g.op("add_", [h, x], alpha=0.5)
                g.op("mul_", [h, w])
                g.op("div_", [h, g.op("add", [w], other=2.0)])
                g.op("sub_", [h], other=0.25)
                g.op("clamp_", [h], min=-0.4, max=0.6)
                g.builder.op("sigmoid_", [h], out=[])  # the unnamed form
                g.values[h].sigmoid_()
                k = g.op("mul", [h], other=1.0)
                g.op("masked_fill_", [k, mask], value=0.0)
                g.op("tanh_", [k])
                g.op("copy_", [c, k])  # a constant leaf takes k's history
                g.op("relu_", [c])
                loss = g.op("sum", [g.op("mul", [c, x])])
                g.grad_call([loss], [x, w, h])
                self.run_dual(g, {c: g.values[c].detach().numpy(), h: g.values[h].detach().numpy()})

    def test_in_place_on_views(self):
        """Writes into views as PyTorch runs them (CopySlices): slice assignment into a buffer
        that requires no grad, a write into a transposed view of an intermediate read through
        its base and through another view made before the write, and index_put_."""
        for dtype in (np.float32, np.float64):
            with self.subTest(dtype=np.dtype(dtype).name):
                g = DualGraph()
                x = leaf(g, (3, 4), 50, dtype)
                y = leaf(g, (3,), 51, dtype)
                w = leaf(g, (4,), 52, dtype)
                buf = leaf(g, (3, 4), 53, dtype, requires_grad=False)
                buf_h = g.op("mul", [buf], other=0.0)  # a buffer: buf_h[:, 0] = y
                g.op("copy_", [g.op("select", [buf_h], dim=1, index=0), y])
                g.op("copy_", [g.op("narrow", [buf_h], dim=1, start=1, length=3),
                               g.op("narrow", [g.op("tanh", [x])], dim=1, start=1, length=3)])
                h = g.op("mul", [x], other=1.5)
                col = g.op("select", [h], dim=1, index=2)  # made before the write
                t = g.op("narrow", [g.op("transpose", [h], dim0=0, dim1=1)], dim=0, start=1,
                         length=2)
                g.op("mul_", [t, g.op("narrow", [w], dim=0, start=0, length=3)])
                g.op("sigmoid_", [t])
                rows = g.leaf(np.array([2, 0]))
                g.op("index_put_", [buf_h, g.op("mul", [w], other=2.0), rows])
                loss = g.op("sum", [g.op("mul", [g.op("add", [h, buf_h]), buf_h])])
                loss2 = g.op("sum", [g.op("exp", [col])])
                g.grad_call([loss, loss2], [x, y, w, h], retain_graph=True)
                self.run_dual(g, {h: g.values[h].detach().numpy(),
                                  buf_h: g.values[buf_h].detach().numpy()})

    def test_in_place_results_in_a_wider_dtype(self):
        """add_, sub_, mul_ and div_ of a float32 tensor by float64 ones, on the tensor and on
        a view of it: PyTorch computes each in float64 and writes float32 (Note [In-place
        results in a wider dtype]); the gradients keep each leaf's dtype. The float64 leaves'
        gradients pass through float32 values, so they are held to float32's tolerance (PyTorch
        sums w's gradient in float32 before the cast, gradserve after it)."""
        g = DualGraph()
        x = leaf(g, (3, 4), 70, np.float32)
        w = leaf(g, (4,), 71)
        v = leaf(g, (3, 1), 72)
        h = g.op("mul", [x], other=1.5)
        g.op("add_", [h, w], alpha=2.0)
        g.op("mul_", [h, v])
        g.op("div_", [g.op("select", [h], dim=0, index=1), g.op("add", [w], other=3.0)])
        g.op("sub_", [h, w])
        loss = g.op("sum", [g.op("mul", [h, h])])
        g.grad_call([loss], [x, w, v])
        with unittest.mock.patch.dict(TOLERANCE, {np.dtype(np.float64): 1e-5}):
            result = self.run_dual(g, {h: g.values[h].detach().numpy()})
        self.assertEqual(result.values[h].dtype, np.float32)

    def test_pytorch_in_place_view_cases(self):
        """PyTorch's test_autograd.py cases of in-place ops on views (test_inplace_on_view_*),
        as requests: clone is mul by 1, view_as is reshape, x[0][0] = 3 is fill_ of a select
        of a select; PyTorch computes each expected gradient from the same graph."""
        def clone(g, x):
            return g.op("mul", [x], other=1.0)

        cases = {}

        def backward_of_a_narrow(g):  # test_inplace_on_view_backward
            root = leaf(g, (1, 2), 60)
            x = clone(g, root)
            g.op("mul_", [g.op("narrow", [x], dim=1, start=0, length=1)], other=2.0)
            return g.op("sum", [x]), [root]
        cases["backward"] = backward_of_a_narrow

        def view_of_view(g):  # test_inplace_on_view_of_view
            root = leaf(g, (2, 2), 61)
            x = clone(g, root)
            v1 = g.op("narrow", [x], dim=0, start=0, length=1)
            g.op("mul_", [g.op("narrow", [v1], dim=1, start=1, length=1)], other=2.0)
            return g.op("sum", [x]), [root]
        cases["of_view"] = view_of_view

        def then_no_grad(g):  # test_inplace_on_view_then_no_grad
            a = g.leaf(np.ones((3, 1)), True)
            b = g.op("mul", [a], other=2.0)
            c = g.op("reshape", [b], shape=[3, 1])
            row = g.op("select", [c], dim=0, index=0)
            g.op("fill_", [g.op("select", [row], dim=0, index=0)], value=3.0)
            return g.op("sum", [c]), [a]
        cases["then_no_grad"] = then_no_grad

        def gradcheck_func(g):  # test_inplace_on_view_gradcheck's func
            root = leaf(g, (4, 4), 62)
            b = leaf(g, (2, 2), 63)
            x = clone(g, root)
            for start in (2, 0):
                block = g.op("narrow", [g.op("narrow", [x], dim=1, start=start, length=2)],
                             dim=0, start=1, length=2)
                g.op("mul_", [block, b])
            return g.op("sum", [g.op("mul", [x, x])]), [root, b]
        cases["gradcheck"] = gradcheck_func

        def makes_base_require_grad(g):  # test_inplace_on_view_makes_base_require_grad
            a = leaf(g, (4, 4), 64, requires_grad=False)
            b = leaf(g, (4, 2), 65)
            x = clone(g, a)
            g.op("add_", [g.op("narrow", [x], dim=1, start=2, length=2), b])
            return g.op("sum", [g.op("mul", [x, x])]), [b]
        cases["makes_base_require_grad"] = makes_base_require_grad

        for name, build in cases.items():
            with self.subTest(case=name):
                g = DualGraph()
                loss, wrt = build(g)
                g.grad_call([loss], wrt)
                self.run_dual(g)

        # test_inplace_on_view_leaf_errors: a view of a leaf that requires grad.
        g = DualGraph()
        x = leaf(g, (1,), 66)
        y = g.op("reshape", [x], shape=[1])
        with self.assertRaisesRegex(RuntimeError, "a view of a leaf Variable"):
            g.values[y].add_(1)
        g.builder.op("add_", [y], out=[], other=1.0)
        g.builder.op("sum", [y], out="loss")
        g.builder.backward_call(["loss"], {}, [x])
        with self.assertRaises(GradserveError) as cm:
            self.client.grad(g.builder)
        self.assertEqual(cm.exception.code.name, "INVALID_ARGUMENT")
        self.assertIn("a view of a leaf Variable that requires grad", cm.exception.message)

    def test_in_place_write_of_a_saved_value_fails_as_in_pytorch(self):
        g = DualGraph()
        x = leaf(g, (3,), 43)
        h = g.op("mul", [x], other=2.0)
        s = g.op("sigmoid", [h])
        g.op("mul_", [s], other=2.0)
        loss = g.op("sum", [s])
        with self.assertRaisesRegex(RuntimeError, "modified by an inplace operation"):
            torch.autograd.grad(g.values[loss], g.values[x])
        g.builder.backward_call([loss], {}, [x])
        with self.assertRaises(GradserveError) as cm:
            self.client.grad(g.builder)
        self.assertEqual(cm.exception.code.name, "FAILED_PRECONDITION")
        self.assertIn("modified by an inplace operation", cm.exception.message)
        self.assertIn("SigmoidBackward0", cm.exception.message)
        self.assertIn("is at version 1; expected version 0", cm.exception.message)

    def test_in_place_on_a_leaf_that_requires_grad_is_refused_as_in_pytorch(self):
        g = DualGraph()
        x = leaf(g, (3,), 44)
        with self.assertRaisesRegex(RuntimeError, "a leaf Variable that requires grad"):
            g.values[x].relu_()
        g.builder.op("relu_", [x], out=[])
        g.builder.op("sum", [x], out="loss")
        g.builder.backward_call(["loss"], {}, [x])
        with self.assertRaises(GradserveError) as cm:
            self.client.grad(g.builder)
        self.assertEqual(cm.exception.code.name, "INVALID_ARGUMENT")
        self.assertIn("a leaf Variable that requires grad", cm.exception.message)

    def checkpointed(self, g, inputs, build_body):
        """Records a checkpoint op over inputs; build_body(body, formal names) -> output name.
        In PyTorch the body just runs inline: a checkpoint changes memory, not gradients."""
        formal = [g.fresh("f") for _ in inputs]
        body = DualGraph(GraphBuilder(inputs=formal))
        body._counter = g._counter + 1000  # distinct names inside the body
        for f, i in zip(formal, inputs):
            body.values[f] = g.values[i]
        out = build_body(body, formal)
        body.builder.outputs(out)
        g._counter = body._counter
        name = g.fresh("ck")
        g.builder.op("checkpoint", inputs, out=[name], body=body.builder)
        g.values[name] = body.values[out]
        g.log.append(f"{name} = checkpoint({inputs}) body:\n" + body.describe())
        return name

    def test_checkpoint(self):
        g = DualGraph()
        x = leaf(g, (2, 3), 17)
        w = leaf(g, (3, 3), 18)

        def layer(body, formal):
            return body.op("gelu", [body.op("matmul", [formal[0], formal[1]])])

        h = self.checkpointed(g, [x, w], layer)
        h = self.checkpointed(g, [h, w], layer)
        loss = g.op("sum", [g.op("mul", [h, h])])
        g.grad_call([loss], [x, w])
        self.run_dual(g, {h: g.values[h].detach().numpy()})

    def test_nested_checkpoints(self):
        g = DualGraph()
        x = leaf(g, (3,), 19)

        def nest(depth):
            def build(body, formal):
                inner = body.op("sin", formal)
                if depth:
                    inner = self.checkpointed(body, [inner], nest(depth - 1))
                return body.op("mul", [inner, formal[0]])
            return build

        y = self.checkpointed(g, [x], nest(6))
        g.grad_call([g.op("sum", [y])], [x])
        self.run_dual(g)

    def test_hooks(self):
        g = DualGraph()
        x = leaf(g, (4,), 20)
        h = g.op("exp", [x])
        g.builder.op("hook", [h], out=[], kind="scale", factor=3.0)
        g.values[h].register_hook(lambda grad: grad * 3.0)
        k = g.op("tanh", [h])
        g.builder.op("hook", [k], out=[], kind="clamp", min=-0.1, max=0.2)
        g.values[k].register_hook(lambda grad: grad.clamp(-0.1, 0.2))
        loss = g.op("sum", [g.op("mul", [k, x])])
        g.grad_call([loss], [x])
        self.run_dual(g)

    def test_no_grad_and_detach(self):
        g = DualGraph()
        x = leaf(g, (3,), 21)
        frozen = g.op("mul", [x, x], no_grad=True)
        cut = g.op("detach", [g.op("exp", [x])])
        loss = g.op("sum", [g.op("mul", [g.op("add", [frozen, cut]), x])])
        g.grad_call([loss], [x])
        self.run_dual(g)

    def test_grad_accumulates_across_backward_calls(self):
        g = DualGraph()
        x = leaf(g, (2, 2), 22)
        y = g.op("sum", [g.op("cos", [x])])
        z = g.op("sum", [g.op("mul", [x, x])])
        g.backward_call([y], retain_graph=True)
        g.backward_call([z, y])  # .grad now holds dy + dz + dy
        self.run_dual(g)

    def test_backward_into_non_leaves(self):
        """backward(inputs=[h]) for a non-leaf h sums into h.grad (PyTorch retains h's grad),
        from then on in every later call that reaches h, after h's hooks (Note [backward()
        into a non-leaf])."""
        g = ShadowGraph()
        x = leaf(g, (2, 3), 23)
        h = g.op("tanh", [g.op("mul", [x, x])])
        g.hook(h, "scale", factor=2.0)
        k = g.op("sin", [h])
        loss = g.op("sum", [g.op("mul", [k, h])])
        other = g.op("sum", [g.op("exp", [h])])
        g.backward_call([loss], retain_graph=True, inputs=[h])
        g.backward_call([loss], retain_graph=True, inputs=[h, x])
        g.backward_call([other], retain_graph=True, inputs=[x])  # h's .grad grows unseen
        g.backward_call([loss, other], inputs=[k, h])
        self.run_dual(g)

    def test_hooks_in_checkpoint_bodies(self):
        """A hook inside a checkpoint body acts when the body is recomputed, as the same hook in
        PyTorch with the body inline (Note [Hooks in checkpoint bodies]); nested bodies and a
        second-order call through the checkpoint included."""
        g = ShadowGraph()
        x = leaf(g, (2, 3), 24)
        w = leaf(g, (3, 3), 25)

        def inner(body, formal):
            h = body.op("tanh", [formal[0]])
            body.hook(h, "clamp", min=-0.05, max=0.3)
            return body.op("mul", [h, formal[0]])

        def layer(body, formal):
            h = body.op("matmul", [formal[0], formal[1]])
            body.hook(h, "scale", factor=-2.0)
            k = body.checkpoint([h], inner)
            return body.op("sigmoid", [k])

        y = g.checkpoint([x, w], layer)
        loss = g.op("sum", [g.op("mul", [y, y])])
        g.grad_call([loss], [x, w], retain_graph=True)
        g.backward_call([loss])
        self.run_dual(g, {y: g.values[y].detach().numpy()})
        # Second order: with a linear hook (scale) only; see the Note for clamp.
        g = ShadowGraph()
        x = leaf(g, (2, 3), 26)
        w = leaf(g, (3, 3), 27)

        def scaled(body, formal):
            h = body.op("matmul", [formal[0], formal[1]])
            body.hook(h, "scale", factor=-2.0)
            return body.op("sigmoid", [body.op("mul", [body.op("tanh", [h]), h])])

        y = g.checkpoint([x, w], scaled)
        loss = g.op("sum", [g.op("mul", [y, y])])
        (gx,) = g.grad_op([loss], [x], [g.leaf(np.array(1.0))])
        g.grad_call([g.op("sum", [g.op("mul", [gx, gx])])], [x, w])
        self.run_dual(g)
        # A hook on a body's formal input is refused.
        body = GraphBuilder(inputs=["f"])
        body.op("hook", ["f"], out=[], kind="scale", factor=2.0)
        body.op("exp", ["f"], out="e").outputs("e")
        b = GraphBuilder().leaf("x", np.ones(2), requires_grad=True)
        b.op("checkpoint", ["x"], out=["y"], body=body).op("sum", ["y"], out="loss")
        b.backward_call("loss", inputs=["x"])
        with self.assertRaises(GradserveError) as cm:
            self.client.grad(b)
        self.assertEqual(cm.exception.code.name, "INVALID_ARGUMENT")
        self.assertIn("hook inside a checkpoint body must be on a value", cm.exception.message)

    def test_found_by_the_differential_fuzzer(self):
        """Graphs diff_fuzz.py found gradserve wrong on, made small (each failed before)."""
        # index_select's backward into an empty gradient was INTERNAL.
        g = ShadowGraph()
        x = leaf(g, (2, 0), 30)
        y = g.op("index_select", [x, g.leaf(np.array(1, np.int64))], dim=0)
        g.grad_call([g.op("sum", [y])], [x])
        self.run_dual(g)
        # embedding's backward with an embedding_dim of 0 reshaped to [-1, 0].
        g = ShadowGraph()
        w = leaf(g, (3, 0), 35)
        y = g.op("embedding", [w, g.leaf(np.array([[0, 2]], np.int64))])
        g.grad_call([g.op("sum", [y])], [w])
        self.run_dual(g)
        # A hook on a checkpoint's input ran twice on its gradient under create_graph.
        g = ShadowGraph()
        x = leaf(g, (3,), 31)
        h = g.op("mul", [x, x])
        y = g.checkpoint([h], lambda body, f: body.op("sin", f))
        g.hook(h, "scale", factor=0.5)
        (gh,) = g.grad_op([g.op("sum", [y])], [h], [g.leaf(np.array(1.0))])
        g.grad_call([g.op("sum", [g.op("mul", [gh, gh])])], [x])
        self.run_dual(g)
        # cross_entropy with class probabilities promotes a weight of another dtype.
        g = ShadowGraph()
        x = leaf(g, (2, 3), 32, np.float64)
        p = np.random.default_rng(33).uniform(0.1, 1, size=(2, 3))
        t = g.leaf((p / p.sum(1, keepdims=True)).astype(np.float64))
        w = leaf(g, (3,), 34, np.float32)
        g.grad_call([g.op("cross_entropy", [x, t, w])], [x, w])
        self.run_dual(g)

    def test_conv2d_degenerate_sizes_as_pytorch(self):
        """conv2d over an empty batch or zero input channels gives what PyTorch gives (an input
        of zero channels an output of zero channels and zero gradients: Note [conv2d over zero
        channels]; diff_fuzz.py found such a weight refused), values, gradients and second
        order; fewer out_channels than groups are refused as PyTorch refuses them."""
        cases = [((2, 0, 4, 4), (3, 0, 2, 2), True, {}),
                 ((2, 0, 4, 4), (3, 0, 2, 2), False, {}),
                 ((2, 0, 5, 4), (4, 0, 2, 2), False, {"groups": 2, "stride": [2, 1]}),
                 ((2, 0, 4, 4), (3, 0, 3, 2), True, {"padding": "same", "dilation": [1, 2]}),
                 ((0, 4, 4), (3, 0, 2, 2), True, {"padding": [1, 0]}),
                 ((0, 2, 4, 4), (3, 2, 2, 2), True, {"dilation": [1, 2]}),
                 ((0, 0, 4, 4), (2, 0, 1, 1), False, {})]
        for seed, (x_shape, w_shape, bias, attrs) in enumerate(cases):
            with self.subTest(x=x_shape, w=w_shape, bias=bias, attrs=attrs):
                g = DualGraph()
                inputs = [leaf(g, x_shape, 60 + seed), leaf(g, w_shape, 70 + seed)]
                if bias:
                    inputs.append(leaf(g, (w_shape[0],), 80 + seed))
                y = g.op("conv2d", inputs, **attrs)
                loss = g.op("sum", [g.op("mul", [y, y])])
                g.grad_call([loss], inputs, retain_graph=True)
                # PyTorch 1.13's double backward of a zero-channel input with a bias fails
                # (it expands the bias's gradient to the empty output).
                if not (bias and x_shape[-3] == 0):
                    gx, gw = g.grad_op([loss], inputs[:2], [g.leaf(np.array(1.0))])
                    root = g.op("add", [g.op("sum", [gx]), g.op("sum", [gw])])
                    g.grad_call([root], inputs, none_as_zero=True)
                self.run_dual(g, {y: g.values[y].detach().numpy()})
        for w_shape, groups in (((0, 2, 2, 2), 1), ((0, 1, 2, 2), 2), ((1, 1, 2, 2), 2)):
            with self.subTest(w=w_shape, groups=groups):
                g = DualGraph()
                names = [leaf(g, (1, 2, 4, 4), 90), leaf(g, w_shape, 91)]
                with self.assertRaises(RuntimeError):
                    g.evaluate("conv2d", names, {"groups": groups})
                g.builder.op("conv2d", names, out="y", groups=groups)
                g.builder.op("sum", ["y"], out="loss")
                g.builder.backward_call("loss", inputs=[names[0]])
                with self.assertRaises(GradserveError) as cm:
                    self.client.grad(g.builder)
                self.assertEqual(cm.exception.code.name, "INVALID_ARGUMENT")
                self.assertIn(f"groups = {groups}", cm.exception.message)

    def test_seeds_of_another_dtype_are_converted(self):
        """A seed may have any floating dtype: it is converted to its root's (the proto's
        BackwardCall.seeds), as PyTorch converts grad_outputs."""
        for root_dtype, seed_dtype in ((np.float64, np.float32), (np.float32, np.float64)):
            g = DualGraph()
            x = leaf(g, (3,), 28, root_dtype)
            y = g.op("exp", [x])
            seed = np.random.default_rng(29).uniform(-1, 1, size=3).astype(seed_dtype)
            expected = torch.autograd.grad(g.values[y], g.values[x],
                                           torch.from_numpy(seed).to(g.values[y].dtype))[0]
            g.builder.backward_call([y], {y: seed}, [x])
            g.calls.append({x: expected.numpy()})
            self.run_dual(g)

    def test_mixed_dtypes_promote_as_pytorch(self):
        """Ops of several tensors make their result in torch.result_type's dtype (cat and
        stack over the list, mse_loss after broadcasting), and each input's gradient comes back
        in its own dtype."""
        cases = [
            ("cat", [((2, 3), np.float32), ((1, 3), np.float64)], {"dim": 0}),
            ("cat", [((2,), np.float64), ((3,), np.float32), ((0,), np.float32)], {}),
            ("cat", [((2, 2), np.float32), ((0,), np.float64)], {"dim": 1}),  # legacy empty
            ("stack", [((2, 3), np.float64), ((2, 3), np.float32)], {"dim": 1}),
            ("mse_loss", [((3, 2), np.float32), ((3, 2), np.float64)], {}),
            ("mse_loss", [((3, 2), np.float64), ((2,), np.float32)], {"reduction": "sum"}),
            ("mse_loss", [((3,), np.float32), ((), np.float64)], {"reduction": "none"}),
            ("add", [((3,), np.float32), ((), np.float64)], {}),
            ("where", [((3,), np.bool_), ((3,), np.float32), ((3,), np.float64)], {}),
        ]
        for seed, (op, specs, attrs) in enumerate(cases):
            with self.subTest(op=op, specs=specs):
                g = DualGraph()
                names = []
                for i, (shape, dtype) in enumerate(specs):
                    if dtype == np.bool_:
                        names.append(g.leaf(np.arange(int(np.prod(shape))).reshape(shape) % 2 == 0))
                    else:
                        names.append(leaf(g, shape, 50 + 3 * seed + i, dtype))
                y = g.op(op, names, **attrs)
                seed_value = np.random.default_rng(seed).uniform(-1, 1, size=g.values[y].shape)
                wrt = [n for n in names if g.values[n].requires_grad]
                g.grad_call([y], wrt, {y: seed_value.astype(g.values[y].detach().numpy().dtype)})
                self.run_dual(g, {y: g.values[y].detach().numpy()})

    def test_mixed_dtypes_refused_as_pytorch(self):
        """Where PyTorch itself refuses mixed dtypes (matmul, conv2d, layer_norm's and the
        losses' class weights, an in-place result self cannot hold), gradserve refuses too,
        naming the dtypes."""
        f32 = lambda shape: np.ones(shape, np.float32)  # noqa: E731
        f64 = lambda shape: np.ones(shape, np.float64)  # noqa: E731
        target = np.array([0, 1], np.int64)
        cases = [
            ("matmul", [f32((2, 2)), f64((2, 2))], {}),
            ("conv2d", [f32((1, 1, 3, 3)), f64((1, 1, 2, 2))], {}),
            ("layer_norm", [f32((2, 3)), f64((3,))], {"normalized_shape": [3]}),
            ("cross_entropy", [f32((2, 3)), target, f64((3,))], {}),
            ("nll_loss", [f32((2, 3)), target, f64((3,))], {}),
            # In place, a result that self's dtype cannot hold (Note [In-place results in a
            # wider dtype]).
            ("add_", [np.ones((2,), np.int64), f64((2,))], {}),
            ("div_", [np.ones((2,), np.int64), target], {}),
        ]
        for op, arrays, attrs in cases:
            with self.subTest(op=op):
                g = DualGraph()
                names = [g.leaf(a, requires_grad=a.dtype != np.int64) for a in arrays]
                with self.assertRaises(RuntimeError):
                    g.evaluate(op, names, attrs)
                g.builder.op(op, names, out="y", **attrs)
                g.builder.op("sum", ["y"], out="loss")
                g.builder.backward_call("loss", inputs=[names[0]])
                with self.assertRaises(GradserveError) as cm:
                    self.client.grad(g.builder)
                self.assertEqual(cm.exception.code.name, "INVALID_ARGUMENT")
                self.assertRegex(cm.exception.message, "float64|can't be cast")


if __name__ == "__main__":
    unittest.main(verbosity=2)
