"""bench/torch_grad_tiny.py computes what a grad_tiny request asks of gradserve.

docs/benchmarks.md sets PyTorch's instructions for grad_tiny (that script, in process) beside
the server's for the load tool's grad_tiny request; the comparison holds only if both do the
same work. So the script's values must be the load tool's (client/load/scenarios.cc), and its
gradient the server's for that graph, within float32 parity (test_parity.py's 1e-5). The
script's flags are checked too: --iterations runs, a negative count is a usage error (2).

Run: GRADSERVE_SERVER=... GRADSERVE_PY_STUBS=... /usr/bin/python3 tests/python/test_bench_grad_tiny.py
"""

import importlib.util
import os
import subprocess
import sys
import unittest

import numpy as np

from server_fixture import REPO, ServerProcess  # first: puts client/python on sys.path
from gradserve import GraphBuilder

SCRIPT = os.path.join(REPO, "bench", "torch_grad_tiny.py")


def load_script():
    spec = importlib.util.spec_from_file_location("torch_grad_tiny", SCRIPT)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


class TorchGradTinyTest(unittest.TestCase):

    def test_the_gradient_is_the_servers(self):
        script = load_script()
        x = script.deterministic_values(8, 1.0, 1)
        w = script.deterministic_values(8, 1.0, 2)
        # client/load/scenarios.cc's first values of seed 1 (a change there must show here).
        # The first two of DeterministicValues(8, 1, 1), as the C++ prints them with %.9g.
        np.testing.assert_array_equal(x[:2].numpy(), np.float32([0.018814886, 0.296718776]))
        g = GraphBuilder().leaf("x", x.numpy(), requires_grad=True).leaf("w", w.numpy())
        for op, inputs, out in (("mul", ["x", "w"], "a"), ("tanh", ["a"], "b"),
                                ("add", ["b", "x"], "c"), ("sin", ["c"], "d"),
                                ("mul", ["d", "w"], "e"), ("sigmoid", ["e"], "f"),
                                ("sub", ["f", "x"], "g"), ("exp", ["g"], "h"),
                                ("relu", ["h"], "i"), ("sum", ["i"], "loss")):
            g.op(op, inputs, out=out)
        g.backward_call("loss", inputs=["x"])
        with ServerProcess() as server:
            got = server.client().grad(g).calls[0]["x"]
        want = script.grad_tiny(x, w).numpy()
        self.assertEqual(got.dtype, np.float32)
        error = np.max(np.abs(got - want)) / max(np.max(np.abs(want)), 1.0)
        self.assertLessEqual(error, 1e-5, f"server {got} against the script's {want}")

    def test_flags(self):
        run = [sys.executable, SCRIPT]
        self.assertEqual(subprocess.run(run + ["--iterations", "3"], timeout=120).returncode, 0)
        printed = subprocess.run(run + ["--print"], capture_output=True, text=True, timeout=120)
        self.assertEqual(printed.returncode, 0)
        self.assertEqual(len(printed.stdout.split()), 8)
        bad = subprocess.run(run + ["--iterations", "-1"], capture_output=True, text=True,
                             timeout=120)
        self.assertEqual(bad.returncode, 2)
        self.assertIn("--iterations must be at least 0", bad.stderr)


if __name__ == "__main__":
    unittest.main()
