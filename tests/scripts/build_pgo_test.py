#!/usr/bin/python3
"""Tests of scripts/build_pgo's training step (the builds themselves are too slow for every run:
the README names the command, and deploy/check runs it inside the image build).

The training mix runs against this tree's own server and tool and passes; a server that does
not start, or that exits with a non-zero code, fails the training with its log printed; an
unknown argument exits 2.

Usage: build_pgo_test.py REPO_ROOT BUILD_DIR
"""

import os
import shutil
import stat
import subprocess
import sys
import tempfile
import unittest

ROOT = os.path.abspath(sys.argv.pop(1))
BUILD = os.path.abspath(sys.argv.pop(1))
SCRIPT = os.path.join(ROOT, "scripts", "build_pgo")


def run(*args):
    return subprocess.run([SCRIPT, *args], capture_output=True, text=True, timeout=300)


class BuildPgoTest(unittest.TestCase):
    def train_with_server(self, server_body):
        """--train-only on a tree whose server is a shell script and whose tool is the real
        one; asserts that the training fails, and returns the result."""
        tree = tempfile.mkdtemp(prefix="build_pgo_")
        self.addCleanup(shutil.rmtree, tree)
        os.makedirs(os.path.join(tree, "server"))
        os.makedirs(os.path.join(tree, "client"))
        server = os.path.join(tree, "server", "gradserve-server")
        with open(server, "w") as f:
            f.write("#!/bin/sh\n" + server_body + "\n")
        os.chmod(server, stat.S_IRWXU)
        os.symlink(os.path.join(BUILD, "client", "gradserve"),
                   os.path.join(tree, "client", "gradserve"))
        result = run("--train-only", f"--build-dir={tree}")
        self.assertEqual(result.returncode, 1, result.stdout + result.stderr)
        return result

    def test_the_training_mix_runs_against_this_tree(self):
        result = run("--train-only", f"--build-dir={BUILD}")
        self.assertEqual(result.returncode, 0, result.stdout + result.stderr)
        self.assertIn("the training mix ran", result.stdout)

    def test_a_server_that_does_not_start_fails_with_its_log(self):
        result = self.train_with_server("echo 'no such flag: --listen' >&2; exit 1")
        self.assertIn("the server did not start", result.stderr)
        self.assertIn("no such flag: --listen", result.stderr)

    def test_a_server_that_fails_its_calls_fails_the_training(self):
        # It says it listens, but nothing answers there.
        result = self.train_with_server("echo 'listening on 127.0.0.1:9' >&2; exec sleep 60")
        self.assertIn("training load 'ping 1 1500' failed", result.stderr)
        self.assertIn("training failed", result.stderr)

    def test_an_unknown_argument_exits_2(self):
        result = run("--frobnicate")
        self.assertEqual(result.returncode, 2)
        self.assertIn("unknown argument '--frobnicate'", result.stderr)


if __name__ == "__main__":
    unittest.main()
