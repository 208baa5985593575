"""The Python client as a package: `pip install client/python` into a fresh virtual environment
(with Debian's site packages, offline: --no-build-isolation --no-index), then, from that
environment's python with no PYTHONPATH and no GRADSERVE_PY_STUBS, the blocking client, the
asyncio client (several calls at once, unary and streamed) and the PyTorch bridge against a
real server.

The package is built from a copy of client/python and proto/ in a temporary folder, so the
source tree stays clean. Exits 77 (SKIP) without python3-venv or pip.

Run: GRADSERVE_SERVER=... GRADSERVE_PY_STUBS=... /usr/bin/python3 tests/python/test_package.py
"""

import importlib.util
import os
import shutil
import subprocess
import sys
import tempfile
import textwrap
import unittest

from server_fixture import REPO, ServerProcess

SCRIPT = textwrap.dedent("""
    import asyncio, os, sys
    import numpy as np
    import torch
    import gradserve, gradserve.torch
    from gradserve import Client, GraphBuilder
    from gradserve.aio import AsyncClient

    assert gradserve.__file__.startswith(sys.prefix), gradserve.__file__
    address = sys.argv[1]
    x = np.array([0.5, -1.0, 2.0])
    g = (GraphBuilder().leaf("x", x, requires_grad=True)
         .op("mul", ["x", "x"], out="y").op("sum", ["y"], out="loss")
         .backward_call("loss", inputs=["x"]))
    with Client(address, timeout=30) as client:
        np.testing.assert_allclose(client.grad(g).calls[0]["x"], 2 * x)

    async def main():
        async with AsyncClient(address, timeout=30) as client:
            results = await asyncio.gather(*[client.grad(g, stream=i % 2 == 1) for i in range(6)])
            for r in results:
                np.testing.assert_allclose(r.calls[0]["x"], 2 * x)
            assert await client.ping(b"aio") == b"aio"
            assert await client.health() == "SERVING"
            try:
                await client.grad(GraphBuilder().leaf("x", x, requires_grad=True)
                                  .op("frobnicate", ["x"], out="y")
                                  .backward_call("y", inputs=["x"]))
            except gradserve.GradserveError as e:
                assert e.code.name == "INVALID_ARGUMENT" and "frobnicate" in e.message, e
            else:
                raise AssertionError("an unknown op was accepted")

    asyncio.run(main())

    class WithSum(torch.nn.Module):
        def __init__(self, m):
            super().__init__()
            self.m = m

        def forward(self, v):
            return self.m(v).sum()

    model = torch.nn.Sequential(torch.nn.Linear(3, 2), torch.nn.Tanh()).double()
    inp = torch.randn(4, 3, dtype=torch.float64)
    traced = gradserve.torch.to_graph(WithSum(model), (inp,))
    with Client(address, timeout=30) as client:
        remote = traced.gradients(client.grad(traced.request()))
    model(inp).sum().backward()
    for name, p in model.named_parameters():
        np.testing.assert_allclose(remote["m." + name], p.grad.numpy(), rtol=1e-10)
    print("package OK")
""")


def venv_available():
    return all(importlib.util.find_spec(m) is not None for m in ("ensurepip", "pip", "setuptools"))


class PackageTest(unittest.TestCase):

    def test_pip_install_then_use_without_pythonpath(self):
        tmp = tempfile.mkdtemp(prefix="gradserve-py-package-")
        try:
            src = os.path.join(tmp, "src")
            shutil.copytree(os.path.join(REPO, "client", "python"),
                            os.path.join(src, "client", "python"),
                            ignore=shutil.ignore_patterns("build", "*.egg-info", "__pycache__"))
            shutil.copytree(os.path.join(REPO, "proto"), os.path.join(src, "proto"))
            venv = os.path.join(tmp, "venv")
            subprocess.run([sys.executable, "-m", "venv", "--system-site-packages", venv],
                           check=True)
            python = os.path.join(venv, "bin", "python")
            env = {k: v for k, v in os.environ.items()
                   if k not in ("PYTHONPATH", "GRADSERVE_PY_STUBS", "PIP_INDEX_URL")}
            install = subprocess.run(
                [python, "-m", "pip", "install", "--no-build-isolation", "--no-index",
                 "--disable-pip-version-check", os.path.join(src, "client", "python")],
                env=env, capture_output=True, text=True)
            self.assertEqual(install.returncode, 0, install.stdout + install.stderr)
            with ServerProcess() as server:
                run = subprocess.run([python, "-c", SCRIPT, server.address], env=env, cwd=tmp,
                                     capture_output=True, text=True, timeout=240)
            self.assertEqual(run.returncode, 0, run.stdout + run.stderr)
            self.assertIn("package OK", run.stdout)
        finally:
            shutil.rmtree(tmp, ignore_errors=True)


if __name__ == "__main__":
    if not venv_available():
        print("SKIP: python3-venv, python3-pip or python3-setuptools missing; apt-get install "
              "python3-venv python3-pip python3-setuptools")
        sys.exit(77)
    unittest.main()
