"""`gradserve graph`: a GradRequest drawn as Graphviz DOT, SVG and PNG; with --with_gradients,
the gradients' norms on the inputs' edges from a real server, and the op that a failed
request's error names drawn red.

Run: GRADSERVE_SERVER=... GRADSERVE_CLI=... GRADSERVE_PY_STUBS=... /usr/bin/python3 \
  tests/python/test_graph_picture.py
"""

import json
import os
import shutil
import subprocess
import tempfile
import unittest

import numpy as np

from server_fixture import REPO, ServerProcess

CLI = os.environ.get("GRADSERVE_CLI") or os.path.join(REPO, "build", "release", "client",
                                                      "gradserve")
MLP = os.path.join(REPO, "examples", "mlp.json")


def graph(*args, stdin=None):
    return subprocess.run([CLI, "graph", *args], input=stdin, capture_output=True, timeout=60)


class GraphPictureTest(unittest.TestCase):

    def test_dot_names_leaves_ops_and_calls(self):
        run = graph("--format=dot", MLP)
        self.assertEqual(run.returncode, 0, run.stderr)
        dot = run.stdout.decode()
        with open(MLP) as f:
            request = json.load(f)
        self.assertTrue(dot.startswith("digraph gradserve {"), dot[:100])
        for leaf in request["graph"]["leaves"]:
            self.assertIn(f'"{leaf["name"]}\\n', dot)
        for i, op in enumerate(request["graph"]["ops"]):
            self.assertIn(f'"op #{i}\\n{op["op"]}', dot)
        self.assertIn('call0 [shape=diamond', dot)
        self.assertIn("requires grad", dot)

    @unittest.skipUnless(shutil.which("dot"), "Graphviz's dot not found (apt-get install graphviz)")
    def test_svg_and_png(self):
        run = graph("--format=svg", MLP)
        self.assertEqual(run.returncode, 0, run.stderr)
        self.assertIn(b"<svg", run.stdout)
        with tempfile.TemporaryDirectory() as tmp:
            out = os.path.join(tmp, "g.png")
            run = graph("--format=png", f"--out={out}", MLP)
            self.assertEqual(run.returncode, 0, run.stderr)
            with open(out, "rb") as f:
                self.assertEqual(f.read(8), b"\x89PNG\r\n\x1a\n")

    def test_bad_arguments(self):
        self.assertEqual(graph("--format=gif", MLP).returncode, 2)
        self.assertEqual(graph("--format=dot", "/nonexistent.json").returncode, 1)
        self.assertEqual(graph("--format=dot", "-", stdin=b"{not json").returncode, 2)

    def test_with_gradients_and_a_failed_request(self):
        with ServerProcess() as server:
            x = [0.5, -1.0, 2.0]
            ok = {"graph": {"leaves": [{"name": "x", "requiresGrad": True, "value": {
                "dtype": "DTYPE_FLOAT64", "shape": ["3"], "values": {"doubles": x}}}],
                "ops": [{"op": "mul", "inputs": ["x", "x"], "outputs": ["y"]},
                        {"op": "sum", "inputs": ["y"], "outputs": ["loss"]}]},
                "calls": [{"roots": ["loss"], "inputs": ["x"]}]}
            run = graph("--format=dot", "--with_gradients", f"--target={server.address}", "-",
                        stdin=json.dumps(ok).encode())
            self.assertEqual(run.returncode, 0, run.stderr)
            norm = float(np.linalg.norm(2 * np.array(x)))
            self.assertIn(f"|grad| {norm:.4g}", run.stdout.decode())

            bad = json.loads(json.dumps(ok))
            bad["graph"]["ops"][1]["op"] = "frobnicate"
            run = graph("--format=dot", "--with_gradients", f"--target={server.address}", "-",
                        stdin=json.dumps(bad).encode())
            self.assertEqual(run.returncode, 0, run.stderr)
            dot = run.stdout.decode()
            self.assertIn('op1 [shape=ellipse, label="op #1\\nfrobnicate", style=filled, '
                          'fillcolor="#f8d7da", color=red', dot)
            self.assertIn("INVALID_ARGUMENT", dot)
            self.assertIn(b"the request failed", run.stderr)


if __name__ == "__main__":
    unittest.main()
