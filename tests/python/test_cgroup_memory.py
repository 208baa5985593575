"""The server in a container with a small memory limit: refused, never OOM-killed.

Note [Sizing the server's memory] (server/limits/server_memory.h): a server whose container
has a 300 MiB memory limit used to be OOM-killed by 10 concurrent 24 MB requests. This test
makes such a container, a cgroup of its own with a 300 MiB limit, starts gradserve-server in
it, checks that the server sized its budget from that limit, sends the 10 requests at once
and checks that each is answered (OK, or RESOURCE_EXHAUSTED naming the limit), that the
kernel killed nothing, and that the server still serves afterwards.

Needs root and a writable cgroup memory controller (v1's /sys/fs/cgroup/memory, or v2 with
the memory controller); exits 77 (skipped) without them. The cgroup is removed at the end.

Run: GRADSERVE_SERVER=... GRADSERVE_PY_STUBS=... /usr/bin/python3 tests/python/test_cgroup_memory.py
"""

import concurrent.futures
import os
import re
import sys
import time
import unittest

import grpc
import numpy as np

from server_fixture import ServerProcess  # first: puts client/python on sys.path
from gradserve import GradserveError, GraphBuilder

LIMIT_BYTES = 300 << 20
REQUEST_FLOATS = 6 << 20  # 24 MiB of float32
CALLS = 10


def make_cgroup():
    """A new cgroup with a LIMIT_BYTES memory limit: (directory, limit file, procs file)."""
    name = f"gradserve_test_{os.getpid()}"
    v1 = "/sys/fs/cgroup/memory"
    if os.path.isfile(os.path.join(v1, "memory.limit_in_bytes")):
        path = os.path.join(v1, name)
        os.mkdir(path)
        with open(os.path.join(path, "memory.limit_in_bytes"), "w") as f:
            f.write(str(LIMIT_BYTES))
        swap = os.path.join(path, "memory.memsw.limit_in_bytes")
        if os.path.exists(swap):  # no swapping out of the limit either
            with open(swap, "w") as f:
                f.write(str(LIMIT_BYTES))
        return path
    v2 = "/sys/fs/cgroup"
    with open(os.path.join(v2, "cgroup.subtree_control")) as f:
        if "memory" not in f.read().split():
            raise OSError("the cgroup v2 memory controller is not enabled")
    path = os.path.join(v2, name)
    os.mkdir(path)
    for file in ("memory.max", "memory.swap.max"):
        if os.path.exists(os.path.join(path, file)):
            with open(os.path.join(path, file), "w") as f:
                f.write(str(LIMIT_BYTES) if file == "memory.max" else "0")
    return path


def oom_kills(path):
    """How many processes the kernel killed in the cgroup for memory."""
    for file, key in (("memory.oom_control", "oom_kill"), ("memory.events", "oom_kill")):
        try:
            with open(os.path.join(path, file)) as f:
                for line in f:
                    name, _, value = line.partition(" ")
                    if name == key:
                        return int(value)
        except OSError:
            pass
    return 0


def big_request():
    """x (24 MiB) requiring grad; y = x * 2; loss = sum(y); the gradient of loss for x."""
    g = GraphBuilder()
    g.leaf("x", np.ones(REQUEST_FLOATS, dtype=np.float32), requires_grad=True)
    g.leaf("two", np.array(2.0, dtype=np.float32))
    g.op("mul", ["x", "two"], out="y")
    g.op("sum", ["y"], out="loss")
    g.backward_call(["loss"], inputs=["x"])
    return g


class CgroupMemoryTest(unittest.TestCase):

    @classmethod
    def setUpClass(cls):
        try:
            cls.cgroup = make_cgroup()
        except OSError as e:
            print(f"SKIP: cannot make a cgroup with a memory limit here ({e})")
            sys.exit(77)

    @classmethod
    def tearDownClass(cls):
        for _ in range(50):  # the server's exit empties it
            try:
                os.rmdir(cls.cgroup)
                return
            except OSError:
                time.sleep(0.1)

    def test_ten_concurrent_24mb_requests_in_300mib(self):
        procs = os.path.join(self.cgroup, "cgroup.procs")

        def join_cgroup():
            with open(procs, "w") as f:
                f.write(str(os.getpid()))

        server = ServerProcess("--worker_threads=4", "--max_in_flight=16",
                               preexec_fn=join_cgroup).start()
        try:
            log = server.log()
            self.assertRegex(log, r"of 300 MiB \(cgroup memory\.(limit_in_bytes|max)\)", log)
            client = server.client(timeout=60)
            request = big_request()

            def call(_):
                try:
                    client.grad(request, stream=False)
                    return "OK"
                except GradserveError as e:
                    return e

            with concurrent.futures.ThreadPoolExecutor(CALLS) as pool:
                results = list(pool.map(call, range(CALLS)))
            refused = [r for r in results if r != "OK"]
            for r in refused:
                self.assertEqual(r.code, grpc.StatusCode.RESOURCE_EXHAUSTED, f"{r}\n{server.log()}")
                # Refused by the server's budget (naming it), or before the bytes reached the
                # service by gRPC's resource quota (--grpc_memory_bytes), which resets the
                # stream with HTTP/2's ENHANCE_YOUR_CALM (code 11).
                self.assertRegex(str(r), r"--max_server_memory_bytes|RST_STREAM with error code 11",
                                 str(r))
            self.assertTrue(server.alive(), "the server died:\n" + server.log())
            self.assertEqual(oom_kills(self.cgroup), 0, server.log())
            print(f"{CALLS - len(refused)} of {CALLS} calls OK, {len(refused)} refused")
            # Still serving, and a request that fits is answered once the burst's memory is
            # back: the refused calls' bytes return to gRPC's quota and the answered ones' to
            # the budget when their teardown ends (Note [Teardown after the reply]), which on a
            # loaded host can lag the replies by a moment.
            self.assertEqual(client.ping(b"alive"), b"alive")
            deadline = time.monotonic() + 10
            while True:
                try:
                    client.grad(request, stream=False)
                    break
                except GradserveError as e:
                    if e.code != grpc.StatusCode.RESOURCE_EXHAUSTED or time.monotonic() > deadline:
                        raise
                    time.sleep(0.1)
            client.close()
        finally:
            server.stop()


if __name__ == "__main__":
    unittest.main(verbosity=2)
