#!/usr/bin/python3
"""Tests of scripts/check_layers: the real tree passes; each kind of violation fails, naming it.

Usage: check_layers_test.py [REPO_ROOT]
"""

import os
import shutil
import subprocess
import sys
import tempfile
import unittest

ROOT = os.path.abspath(sys.argv.pop(1)) if len(sys.argv) > 1 else os.path.dirname(
    os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
CHECK = os.path.join(ROOT, "scripts", "check_layers")


def run(*args):
    return subprocess.run([CHECK, *args], capture_output=True, text=True, timeout=60)


class CheckLayersTest(unittest.TestCase):
    def setUp(self):
        # A copy of the checked folders (sources and READMEs), to break on purpose.
        self.tmp = tempfile.mkdtemp(prefix="check_layers_")
        for top in ("program", "engine", "server", "client"):
            shutil.copytree(os.path.join(ROOT, top), os.path.join(self.tmp, top),
                            ignore=shutil.ignore_patterns("node_modules", "__pycache__"))

    def tearDown(self):
        shutil.rmtree(self.tmp)

    def append_line(self, rel, line):
        with open(os.path.join(self.tmp, rel), "a", encoding="utf-8") as f:
            f.write(line + "\n")
        with open(os.path.join(self.tmp, rel), encoding="utf-8") as f:
            return sum(1 for _ in f)

    def test_this_tree_holds_its_layers(self):
        result = run("--root", ROOT)
        self.assertEqual(result.returncode, 0, result.stdout + result.stderr)
        self.assertIn(" 0 include(s) against the layers", result.stdout)

    def test_the_copy_holds_them_too(self):
        result = run("--root", self.tmp)
        self.assertEqual(result.returncode, 0, result.stdout + result.stderr)

    def test_an_include_up_a_layer_fails_naming_file_line_and_rule(self):
        line = self.append_line("engine/tensor/tensor.cc", '#include "engine/autograd/node.h"')
        result = run("--root", self.tmp)
        self.assertEqual(result.returncode, 1, result.stdout + result.stderr)
        self.assertIn(f"engine/tensor/tensor.cc:{line}: includes \"engine/autograd/node.h\" "
                      f"from engine/autograd, which engine/tensor may not include",
                      result.stdout)
        self.assertIn("engine/tensor/README.md", result.stdout)

    def test_the_engine_never_includes_grpc(self):
        line = self.append_line("engine/graph/graph.h", "#include <grpcpp/grpcpp.h>")
        result = run("--root", self.tmp, "engine")
        self.assertEqual(result.returncode, 1, result.stdout + result.stderr)
        self.assertIn(f"engine/graph/graph.h:{line}: includes grpcpp/grpcpp.h, and engine/graph "
                      f"never includes grpcpp", result.stdout)

    def test_a_client_never_includes_the_server(self):
        client_sources = []
        for dirpath, _, files in os.walk(os.path.join(self.tmp, "client")):
            client_sources += [os.path.join(dirpath, f) for f in files if f.endswith(".cc")]
        rel = os.path.relpath(sorted(client_sources)[0], self.tmp)
        line = self.append_line(rel, '#include "engine/tensor/tensor.h"')
        result = run("--root", self.tmp, "client")
        self.assertEqual(result.returncode, 1, result.stdout + result.stderr)
        self.assertIn(f"{rel}:{line}: includes \"engine/tensor/tensor.h\"", result.stdout)

    def test_a_folder_without_its_readme_line_is_a_usage_error(self):
        os.remove(os.path.join(self.tmp, "engine", "ops", "README.md"))
        os.remove(os.path.join(self.tmp, "engine", "README.md"))
        result = run("--root", self.tmp, "engine")
        self.assertEqual(result.returncode, 2, result.stdout + result.stderr)
        self.assertIn("no folder above it has a README.md with a 'May include:' line",
                      result.stderr)


if __name__ == "__main__":
    unittest.main(verbosity=2)
