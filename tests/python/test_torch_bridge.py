"""gradserve.torch.to_graph against local autograd: an MLP, a small CNN and a transformer block,
traced with torch.fx, run on a real server, their parameters' gradients compared with
loss.backward() in float64; a function with an input that requires grad; and a module with an
op gradserve lacks, which must be named.

Run: GRADSERVE_SERVER=... GRADSERVE_PY_STUBS=... /usr/bin/python3 tests/python/test_torch_bridge.py
"""

import math
import unittest

import numpy as np
import torch
import torch.nn.functional as F
from torch import nn

from server_fixture import ServerProcess  # first: puts client/python on sys.path
import gradserve.torch as gtorch


class Mlp(nn.Module):
    def __init__(self):
        super().__init__()
        self.net = nn.Sequential(nn.Linear(8, 16), nn.GELU(), nn.Linear(16, 16), nn.Tanh(),
                                 nn.Dropout(0.1), nn.Linear(16, 4))

    def forward(self, x, target):
        return F.cross_entropy(self.net(x), target)


class SmallCnn(nn.Module):
    def __init__(self):
        super().__init__()
        self.conv1 = nn.Conv2d(1, 4, 3, padding=1)
        self.conv2 = nn.Conv2d(4, 6, 3, stride=2)
        self.flatten = nn.Flatten()
        self.fc = nn.Linear(6 * 3 * 3, 3)

    def forward(self, x, target):
        h = torch.relu(self.conv1(x))
        h = F.softplus(self.conv2(h))
        logits = self.fc(self.flatten(h))
        return F.mse_loss(logits.softmax(dim=-1), target)


class TransformerBlock(nn.Module):
    def __init__(self, d=8, hidden=16):
        super().__init__()
        self.ln1 = nn.LayerNorm(d)
        self.q = nn.Linear(d, d)
        self.k = nn.Linear(d, d)
        self.v = nn.Linear(d, d)
        self.proj = nn.Linear(d, d)
        self.ln2 = nn.LayerNorm(d)
        self.fc1 = nn.Linear(d, hidden)
        self.fc2 = nn.Linear(hidden, d)
        self.scale = 1 / math.sqrt(d)

    def forward(self, x):
        h = self.ln1(x)
        scores = self.q(h) @ self.k(h).transpose(-2, -1) * self.scale
        attn = torch.softmax(scores, dim=-1) @ self.v(h)
        x = x + self.proj(attn)
        x = x + self.fc2(F.gelu(self.fc1(self.ln2(x))))
        return (x * x).mean()


class Sorting(nn.Module):
    def forward(self, x):
        return torch.sort(x).values.sum()


def local_gradients(module, inputs):
    module.zero_grad()
    module(*inputs).backward()
    return {name: p.grad.clone() for name, p in module.named_parameters()}


class TorchBridgeTest(unittest.TestCase):

    @classmethod
    def setUpClass(cls):
        cls.server = ServerProcess().start()
        cls.client = cls.server.client()

    @classmethod
    def tearDownClass(cls):
        cls.client.close()
        cls.server.stop()

    def check_module(self, module, inputs):
        module = module.double().eval()
        torch.manual_seed(1)
        traced = gtorch.to_graph(module, inputs)
        self.assertEqual(sorted(traced.parameters), sorted(n for n, _ in module.named_parameters()))
        result = self.client.grad(traced.request().return_values(*traced.outputs))
        with torch.no_grad():
            expected_loss = module(*inputs)
        np.testing.assert_allclose(result.values[traced.outputs[0]], expected_loss.numpy(),
                                   rtol=1e-10)
        remote = traced.gradients(result)
        local = local_gradients(module, inputs)
        self.assertEqual(set(remote), set(local))
        for name, grad in local.items():
            self.assertEqual(remote[name].shape, grad.shape, name)
            np.testing.assert_allclose(remote[name].numpy(), grad.numpy(), rtol=1e-9,
                                       atol=1e-12, err_msg=name)

    def test_mlp(self):
        torch.manual_seed(0)
        self.check_module(Mlp(), (torch.randn(5, 8, dtype=torch.float64),
                                  torch.tensor([0, 3, 1, 2, 3])))

    def test_small_cnn(self):
        torch.manual_seed(0)
        self.check_module(SmallCnn(), (torch.randn(2, 1, 8, 8, dtype=torch.float64),
                                       torch.rand(2, 3, dtype=torch.float64)))

    def test_transformer_block(self):
        torch.manual_seed(0)
        self.check_module(TransformerBlock(), (torch.randn(2, 5, 8, dtype=torch.float64),))

    def test_mlp_in_bfloat16(self):
        # A bfloat16 model travels as bfloat16 and its gradients come back as torch.bfloat16,
        # within bfloat16's precision of PyTorch's own (Debian's PyTorch computes it on the CPU).
        torch.manual_seed(0)
        module = Mlp().to(torch.bfloat16).eval()
        inputs = (torch.randn(5, 8).to(torch.bfloat16), torch.tensor([0, 3, 1, 2, 3]))
        traced = gtorch.to_graph(module, inputs)
        result = self.client.grad(traced.request())
        remote = traced.gradients(result)
        local = local_gradients(module, inputs)
        self.assertEqual(set(remote), set(local))
        for name, grad in local.items():
            self.assertEqual(remote[name].dtype, torch.bfloat16, name)
            scale = max(float(grad.float().abs().max()), 1e-3)
            err = float((remote[name].float() - grad.float()).abs().max()) / scale
            self.assertLessEqual(err, 4e-2, name)

    def test_function_with_an_input_that_requires_grad(self):
        x = torch.randn(3, 4, dtype=torch.float64, requires_grad=True)
        w = torch.randn(4, 2, dtype=torch.float64)

        def f(x, w):
            return (1.0 - torch.tanh(x @ w) / 2).sum()

        traced = gtorch.to_graph(f, (x, w))
        self.assertEqual(traced.parameters, {})
        remote = traced.gradients(self.client.grad(traced.request()))
        f(x, w).backward()
        np.testing.assert_allclose(remote["x"].numpy(), x.grad.numpy(), rtol=1e-10)

    def test_unsupported_op_is_named(self):
        with self.assertRaises(gtorch.UnsupportedError) as caught:
            gtorch.to_graph(Sorting(), (torch.randn(4),))
        self.assertIn("sort", str(caught.exception))
        self.assertIn("supported:", str(caught.exception))


if __name__ == "__main__":
    unittest.main()
