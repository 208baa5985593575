"""bench/torch_grad_tiny.py computes what the requests it prints ask of gradserve.

docs/benchmarks.md sets PyTorch's instructions for grad_tiny (that script, in process) beside
the server's for the load tool's grad_tiny request, and the server's for the script's chains
of other lengths (--request); the comparisons hold only if both sides do the same work. So the
script's values must be the load tool's (client/load/scenarios.cc), and the gradient a real
server returns for its --request the one its --print gives, within float32 parity
(test_parity.py's 1e-5), for grad_tiny itself and a shorter and a longer chain. Its flags are
checked too: --iterations runs, and out-of-range counts are usage errors (exit status 2).

Run: GRADSERVE_SERVER=... GRADSERVE_PY_STUBS=... GRADSERVE_CLI=...
     /usr/bin/python3 tests/python/test_bench_grad_tiny.py   (CTest sets all three)
"""

import base64
import json
import os
import subprocess
import sys
import unittest

import numpy as np

from server_fixture import REPO, ServerProcess  # first: puts client/python on sys.path

SCRIPT = os.path.join(REPO, "bench", "torch_grad_tiny.py")


def script(*args):
    return subprocess.run([sys.executable, SCRIPT, *args], capture_output=True, text=True,
                          timeout=120)


class TorchGradTinyTest(unittest.TestCase):

    @classmethod
    def setUpClass(cls):
        cls.server = ServerProcess().start()

    @classmethod
    def tearDownClass(cls):
        cls.server.stop()

    def test_the_values_are_the_load_tools(self):
        request = json.loads(script("--request").stdout)
        self.assertEqual(request["request_id"], "grad_tiny")
        x = np.frombuffer(base64.b64decode(request["graph"]["leaves"][0]["value"]["data"]),
                          "<f4")
        # The first two of DeterministicValues(8, 1, 1), as the C++ prints them with %.9g.
        np.testing.assert_array_equal(x[:2], np.float32([0.018814886, 0.296718776]))
        self.assertEqual([op["op"] for op in request["graph"]["ops"]],
                         ["mul", "tanh", "add", "sin", "mul", "sigmoid", "sub", "exp", "relu",
                          "sum"])

    def test_the_servers_gradient_is_pytorchs(self):
        for ops in ("9", "3", "30"):
            with self.subTest(ops=ops):
                printed = script("--print", "--ops", ops)
                self.assertEqual(printed.returncode, 0, printed.stderr)
                want = np.array(printed.stdout.split(), np.float32)
                request = script("--request", "--ops", ops)
                self.assertEqual(request.returncode, 0, request.stderr)
                answer = subprocess.run(
                    [os.environ["GRADSERVE_CLI"], "grad", f"--target={self.server.address}",
                     "--output=-", "-"], input=request.stdout, capture_output=True, text=True,
                    timeout=60)
                self.assertEqual(answer.returncode, 0, answer.stderr)
                tensor = json.loads(answer.stdout)["calls"][0]["gradients"][0]["value"]
                got = np.frombuffer(base64.b64decode(tensor["data"]), "<f4")
                self.assertEqual(got.shape, want.shape)
                error = np.max(np.abs(got - want)) / max(np.max(np.abs(want)), 1.0)
                self.assertLessEqual(error, 1e-5, f"server {got} against PyTorch's {want}")

    def test_flags(self):
        self.assertEqual(script("--iterations", "3", "--ops", "2").returncode, 0)
        for flags, message in ((["--iterations", "-1"], "--iterations must be at least 0"),
                               (["--ops", "-1"], "--ops must be from 0 to 1000"),
                               (["--print", "--request"], "not allowed with")):
            with self.subTest(flags=flags):
                bad = script(*flags)
                self.assertEqual(bad.returncode, 2)
                self.assertIn(message, bad.stderr)


if __name__ == "__main__":
    unittest.main()
