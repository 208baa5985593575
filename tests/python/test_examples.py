"""Every request in examples/ against a real server, its gradients and returned values against
PyTorch's for the same graph.

The examples are where the README sends a new user first, so each one must run and give
PyTorch's answer. The reference reads the request itself: leaves become tensors, each op runs
through dual_graph.TORCH_OPS with its attributes, the graph-level ops an example uses (grad,
checkpoint) run as PyTorch's torch.autograd.grad and an inline body, and each backward call
runs as torch.autograd.grad (grad semantics) or torch.autograd.backward (accumulate_grad,
reading .grad). A graph-level op the reference does not know fails the test, naming it.

Run: GRADSERVE_SERVER=... GRADSERVE_PY_STUBS=... /usr/bin/python3 tests/python/test_examples.py
With GRADSERVE_TARGET=HOST:PORT it checks a server that already runs there instead of starting
one (deploy/check points it at the container image).
"""

import glob
import os
import unittest

import torch
from google.protobuf import json_format

from server_fixture import REPO, ServerProcess  # first: puts client/python on sys.path
from dual_graph import TORCH_OPS, compare
import gradserve
from gradserve import from_tensor
from gradserve.v1 import gradserve_pb2

EXAMPLES = sorted(glob.glob(os.path.join(REPO, "examples", "*.json")))


def attr(value):
    """An AttrValue as the Python value TORCH_OPS takes."""
    kind = value.WhichOneof("value")
    if kind in ("ints", "floats", "strings"):
        return list(getattr(value, kind).values)
    return getattr(value, kind)


def run_graph(graph, env):
    """Runs a Graph message's leaves and ops in PyTorch, binding each value in env."""
    for leaf in graph.leaves:
        env[leaf.name] = torch.from_numpy(from_tensor(leaf.value)).requires_grad_(
            leaf.requires_grad)
    for op in graph.ops:
        inputs = [env[name] for name in op.inputs]
        attrs = {name: attr(value) for name, value in op.attrs.items()}
        if op.op == "grad":
            wrt = [env[name] for name in attrs["wrt"]]
            seeds = [env[name] for name in attrs.get("grad_outputs", [])] or None
            outputs = torch.autograd.grad(inputs, wrt, seeds, retain_graph=True,
                                          create_graph=attrs.get("create_graph", False),
                                          allow_unused=attrs.get("allow_unused", False))
        elif op.op == "checkpoint":  # gradients as if the body ran inline
            body_env = dict(zip(op.body.inputs, inputs))
            run_graph(op.body, body_env)
            outputs = [body_env[name] for name in op.body.outputs]
        elif op.op in TORCH_OPS:
            outputs = TORCH_OPS[op.op](*inputs, **attrs)
            outputs = list(outputs) if isinstance(outputs, tuple) else [outputs]
        else:
            raise NotImplementedError(f"the reference does not run op '{op.op}'")
        env.update(zip(op.outputs, outputs))


def torch_reference(request):
    """PyTorch's (calls, values) for a GradRequest: calls holds one {input: array or None} per
    backward call, values {name: array} for return_values."""
    env = {}
    run_graph(request.graph, env)
    calls = []
    for call in request.calls:
        roots = [env[name] for name in call.roots]
        seeds = [torch.from_numpy(from_tensor(call.seeds[name])) if name in call.seeds
                 else torch.ones_like(env[name]) for name in call.roots]
        names = list(call.inputs) or [leaf.name for leaf in request.graph.leaves
                                      if leaf.requires_grad]
        if call.accumulate_grad:
            torch.autograd.backward(roots, seeds, retain_graph=True,
                                    create_graph=call.create_graph)
            grads = [env[name].grad for name in names]
        else:
            grads = torch.autograd.grad(roots, [env[name] for name in names], seeds,
                                        retain_graph=True, create_graph=call.create_graph,
                                        allow_unused=call.allow_unused)
        calls.append({name: None if g is None else g.detach().numpy()
                      for name, g in zip(names, grads)})
    values = {name: env[name].detach().numpy() for name in request.return_values}
    return calls, values


class ExamplesTest(unittest.TestCase):

    @classmethod
    def setUpClass(cls):
        target = os.environ.get("GRADSERVE_TARGET")
        if target:
            cls.server = None
            cls.client = gradserve.Client(target, timeout=30)
            cls.client.wait_ready(30)
        else:
            cls.server = ServerProcess().start()
            cls.client = cls.server.client()

    @classmethod
    def tearDownClass(cls):
        cls.client.close()
        if cls.server is not None:
            cls.server.stop()

    def test_there_are_examples(self):
        self.assertGreaterEqual(len(EXAMPLES), 5)

    def test_every_example_matches_pytorch(self):
        for path in EXAMPLES:
            name = os.path.basename(path)
            with self.subTest(example=name):
                with open(path) as f:
                    request = json_format.Parse(f.read(), gradserve_pb2.GradRequest())
                calls, values = torch_reference(request)
                result = self.client.grad(request)
                for c, got in enumerate(result.calls[:len(calls)]):
                    self.assertEqual(set(got.gradients), set(calls[c]), name)
                _, problems = compare(result, calls, values)  # as test_parity compares
                self.assertFalse(problems, f"{name}:\n" + "\n".join(problems))


if __name__ == "__main__":
    unittest.main(verbosity=2)
