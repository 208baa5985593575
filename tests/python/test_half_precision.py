"""float16 and bfloat16 through a real server, versus PyTorch.

The server stores 16-bit tensors in 16 bits and computes each op in float32, rounding its
result once (docs/requests.md, "Half precision"). Each case sends a graph on 16-bit leaves and
compares the values and gradients, which come back in the leaves' dtypes, with two references:
PyTorch in float32 on the same (already rounded) values, the gradcheck-style reference, and for
bfloat16 PyTorch's own bfloat16 on the CPU (Debian's PyTorch has no float16 matmul on the CPU;
the GPU check, scripts/gpu/check, compares float16 with PyTorch CUDA). The error
max|got - ref| / max|ref| must be within a few units in the last place of the 16-bit type.

Run: GRADSERVE_SERVER=... GRADSERVE_PY_STUBS=... /usr/bin/python3 tests/python/test_half_precision.py
(CTest sets both; see CMakeLists.txt)
"""

import unittest

import numpy as np
import torch

import server_fixture  # noqa: F401  (first: puts client/python on sys.path)
from gradserve import BFLOAT16, GraphBuilder, from_bfloat16, to_bfloat16
from test_parity import ServerTestCase

# Relative error allowed against a reference, per dtype: float16 keeps 11 significant bits,
# bfloat16 8; a graph of a few ops loses a few of them.
TOLERANCE = {torch.float16: 1e-2, torch.bfloat16: 4e-2}
WIRE = {torch.float16: "float16", torch.bfloat16: "bfloat16"}


def to_wire(a, dtype):
    """A float array as the numpy array the client sends for dtype."""
    return to_bfloat16(a) if dtype == torch.bfloat16 else np.asarray(a, dtype=np.float16)


def as_float32(a):
    """A float16, BFLOAT16 or float array as float32."""
    return from_bfloat16(a) if a.dtype == BFLOAT16 else a.astype(np.float32)


def relative_error(got, ref):
    ref = ref.detach().float().numpy() if isinstance(ref, torch.Tensor) else ref
    scale = max(float(np.max(np.abs(ref))), 1e-6)
    return float(np.max(np.abs(as_float32(got) - ref))) / scale


class HalfPrecisionTest(ServerTestCase):

    def leaves(self, dtype, shapes, seed=0):
        """Random leaves: {name: (the array sent, its exact float32 values)}."""
        rng = np.random.default_rng(seed)
        out = {}
        for name, shape in shapes.items():
            sent = to_wire(rng.uniform(-1, 1, size=shape).astype(np.float32), dtype)
            out[name] = (sent, as_float32(sent))
        return out

    def check(self, dtype, got, refs, what):
        """got (the server's array) against each (label, reference tensor) in refs."""
        wire_dtype = BFLOAT16 if dtype == torch.bfloat16 else np.dtype(np.float16)
        self.assertEqual(got.dtype, wire_dtype, what)
        for label, ref in refs:
            err = relative_error(got, ref)
            self.assertLessEqual(err, TOLERANCE[dtype], f"{what} vs {label}: error {err:.2e}")

    def test_values_round_as_torch_does(self):
        # Ties, overflow, subnormals and NaN, given as numbers (values.doubles) and converted
        # by the server, then converted again by an op from float32.
        values = [1.0, 1 + 2.0**-11, 1 + 3 * 2.0**-11, 1 + 2.0**-8, 1 + 3 * 2.0**-8, 65504.0,
                  65520.0, 70000.0, 2.0**-24, 2.0**-25, 3 * 2.0**-26, -0.0, 1e30, float("nan")]
        for dtype in (torch.float16, torch.bfloat16):
            with self.subTest(dtype=str(dtype)):
                b = GraphBuilder()
                b.leaf("f", np.array(values, dtype=np.float32))
                b.op("to", ["f"], out="h", dtype=WIRE[dtype])
                b.return_values("h")
                result = self.client.grad(b)
                want = torch.tensor(values, dtype=torch.float32).to(dtype)
                got = result.values["h"]
                bits = got.view("<u2") if dtype == torch.bfloat16 else got.view(np.uint16)
                want_bits = want.view(torch.int16).numpy().view(np.uint16)
                # Bit for bit, but for the NaN, whose sign and payload PyTorch leaves open.
                self.assertTrue(np.isnan(as_float32(got[-1:]))[0])
                self.assertEqual(bits[:-1].tolist(), want_bits[:-1].tolist())
                # The client's own rounding is torch's too.
                if dtype == torch.bfloat16:
                    self.assertEqual(to_bfloat16(np.array(values, np.float32)).view(
                        "<u2")[:-1].tolist(), bits[:-1].tolist())

    def mlp(self, dtype):
        """A two-layer MLP with a log_softmax loss; returns the builder, leaves and names."""
        leaves = self.leaves(dtype, {"x": (8, 16), "w1": (32, 16), "b1": (32,), "w2": (4, 32)},
                             seed=int(dtype == torch.bfloat16))
        b = GraphBuilder()
        for name, (sent, _) in leaves.items():
            b.leaf(name, sent, requires_grad=True)
        b.op("linear", ["x", "w1", "b1"], out="h")
        b.op("gelu", ["h"], out="a")
        b.op("linear", ["a", "w2"], out="y")
        b.op("log_softmax", ["y"], out="ls", dim=1)
        b.op("mul", ["ls", "ls"], out="sq")
        b.op("mean", ["sq"], out="loss")
        b.backward_call("loss", inputs=list(leaves))
        b.return_values("y", "loss")
        return b, leaves

    @staticmethod
    def torch_mlp(leaves, dtype):
        t = {name: torch.tensor(exact).to(dtype).requires_grad_() for name, (_, exact)
             in leaves.items()}
        h = torch.nn.functional.linear(t["x"], t["w1"], t["b1"])
        y = torch.nn.functional.linear(torch.nn.functional.gelu(h), t["w2"])
        ls = torch.log_softmax(y, dim=1)
        loss = (ls * ls).mean()
        grads = torch.autograd.grad(loss, list(t.values()))
        return y, loss, dict(zip(t, grads))

    def test_mlp_matches_float32_and_torch_bfloat16(self):
        for dtype in (torch.float16, torch.bfloat16):
            with self.subTest(dtype=str(dtype)):
                b, leaves = self.mlp(dtype)
                result = self.client.grad(b)
                refs = [("float32", self.torch_mlp(leaves, torch.float32))]
                if dtype == torch.bfloat16:
                    refs.append(("torch bfloat16", self.torch_mlp(leaves, torch.bfloat16)))
                for label, (y, loss, grads) in refs:
                    self.check(dtype, result.values["y"], [(label, y)], "y")
                    self.check(dtype, result.values["loss"], [(label, loss)], "loss")
                    for name, grad in grads.items():
                        self.check(dtype, result.calls[0].gradients[name], [(label, grad)],
                                   f"grad {name}")

    def test_conv_norm_and_in_place_ops(self):
        for dtype in (torch.float16, torch.bfloat16):
            with self.subTest(dtype=str(dtype)):
                leaves = self.leaves(dtype, {"img": (2, 3, 6, 6), "k": (4, 3, 3, 3),
                                             "g": (4, 4, 4), "s": (2, 4, 4, 4)}, seed=3)
                b = GraphBuilder()
                for name, (sent, _) in leaves.items():
                    b.leaf(name, sent, requires_grad=True)
                b.op("conv2d", ["img", "k"], out="c")
                b.op("relu_", ["c"], out=[])
                b.op("layer_norm", ["c", "g"], out="n", normalized_shape=[4, 4, 4])
                b.op("transpose", ["n"], out="nt", dim0=2, dim1=3)
                b.op("softmax", ["nt"], out="p", dim=-1)
                b.op("mul", ["p", "s"], out="ps")
                b.op("sum", ["ps"], out="loss")
                b.backward_call("loss", inputs=list(leaves))
                b.return_values("loss")
                result = self.client.grad(b)
                t = {name: torch.tensor(exact).requires_grad_() for name, (_, exact)
                     in leaves.items()}
                c = torch.relu(torch.nn.functional.conv2d(t["img"], t["k"]))
                n = torch.nn.functional.layer_norm(c, [4, 4, 4], t["g"])
                loss = (torch.softmax(n.transpose(2, 3), dim=-1) * t["s"]).sum()
                grads = torch.autograd.grad(loss, list(t.values()))
                self.check(dtype, result.values["loss"], [("float32", loss)], "loss")
                for name, grad in zip(t, grads):
                    self.check(dtype, result.calls[0].gradients[name], [("float32", grad)],
                               f"grad {name}")

    def test_mixed_dtypes_promote_and_gradients_keep_each_leafs_dtype(self):
        b = GraphBuilder()
        b.leaf("h", np.array([1.5, -2.0], np.float16), requires_grad=True)
        b.leaf("bf", to_bfloat16([0.5, 4.0]), requires_grad=True)
        b.leaf("f", np.array([2.0, 3.0], np.float32), requires_grad=True)
        b.op("mul", ["h", "bf"], out="hb")        # float16 with bfloat16: float32
        b.op("add", ["hb", "f"], out="y")
        b.op("sum", ["y"], out="loss")
        b.backward_call("loss", inputs=["h", "bf", "f"])
        b.return_values("hb")
        result = self.client.grad(b)
        self.assertEqual(result.values["hb"].dtype, np.float32)
        grads = result.calls[0].gradients
        self.assertEqual(grads["h"].dtype, np.float16)
        self.assertEqual(grads["bf"].dtype, BFLOAT16)
        self.assertEqual(grads["f"].dtype, np.float32)
        np.testing.assert_array_equal(grads["h"], np.array([0.5, 4.0], np.float16))
        np.testing.assert_array_equal(from_bfloat16(grads["bf"]), np.array([1.5, -2.0]))

    def test_allow_tf32_is_accepted_and_changes_nothing_on_the_cpu(self):
        rng = np.random.default_rng(5)
        a = rng.uniform(-1, 1, size=(16, 32)).astype(np.float32)
        w = rng.uniform(-1, 1, size=(32, 8)).astype(np.float32)
        results = []
        for allow in (False, True):
            b = GraphBuilder()
            b.leaf("a", a, requires_grad=True)
            b.leaf("w", w, requires_grad=True)
            b.op("matmul", ["a", "w"], out="y")
            b.op("sum", ["y"], out="loss")
            b.backward_call("loss", inputs=["a", "w"])
            b.return_values("y")
            b.allow_tf32(allow)
            self.assertEqual(b.request().allow_tf32, allow)
            results.append(self.client.grad(b))
        np.testing.assert_array_equal(results[0].values["y"], results[1].values["y"])
        for name in ("a", "w"):
            np.testing.assert_array_equal(results[0].calls[0].gradients[name],
                                          results[1].calls[0].gradients[name])


if __name__ == "__main__":
    unittest.main()
