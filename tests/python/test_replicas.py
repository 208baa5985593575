"""The Python client with several servers (Note [Several replicas],
client/python/gradserve/targets.py): a list target spreads one Client's calls over three real
servers on loopback (round_robin), and calls keep succeeding while one server of the list is
killed (SIGKILL: calls in flight there end UNAVAILABLE and are retried on another) or drained
(SIGTERM). Bounded: about 15 s in all.

Run: GRADSERVE_SERVER=... GRADSERVE_PY_STUBS=... /usr/bin/python3 tests/python/test_replicas.py
"""

import signal
import threading
import time
import unittest

import numpy as np

from server_fixture import ServerProcess  # first: puts client/python on sys.path
from gradserve import Client, GraphBuilder
from gradserve.targets import grpc_target

CALLS = 60


def square():
    return (GraphBuilder()
            .leaf("x", np.array([1.0, 2.0, 3.0]), requires_grad=True)
            .op("mul", ["x", "x"], out="y")
            .op("sum", ["y"], out="loss")
            .backward_call("loss", inputs=["x"]))


def requests_total(server):
    with server.client(timeout=10) as c:
        return c.info().counters.requests_total


class TargetsTest(unittest.TestCase):

    def test_lists_of_addresses_become_grpc_lists(self):
        self.assertEqual(grpc_target("10.0.0.1:1, 10.0.0.2:1"), "ipv4:10.0.0.1:1,10.0.0.2:1")
        self.assertEqual(grpc_target("[::1]:1,[::1]:2"), "ipv6:[::1]:1,[::1]:2")
        for same in ("localhost:50051", "dns:///gradserve:50051", "ipv4:1.2.3.4:1,1.2.3.4:2"):
            self.assertEqual(grpc_target(same), same)

    def test_bad_lists_are_refused_naming_the_entry(self):
        with self.assertRaisesRegex(ValueError, r"'a\.example:1'.*dns:///NAME:PORT"):
            grpc_target("a.example:1,b.example:1")
        with self.assertRaisesRegex(ValueError, "mixes IPv4 and IPv6"):
            grpc_target("10.0.0.1:1,[::1]:2")
        for bad in ("", "10.0.0.1,10.0.0.2:1", "10.0.0.1:1,", "10.0.0.1:1,10.0.0.2:123456"):
            with self.assertRaises(ValueError, msg=bad):
                grpc_target(bad)
        with self.assertRaises(ValueError):
            Client("a.example:1,b.example:1")


class ReplicasTest(unittest.TestCase):

    def setUp(self):
        self.servers = [ServerProcess("--worker_threads=1", "--blas_threads=1").start()
                        for _ in range(3)]
        self.target = ",".join(s.address for s in self.servers)

    def tearDown(self):
        for s in self.servers:
            s.stop()

    def test_one_client_spreads_its_calls_over_every_server(self):
        with Client(self.target, timeout=10) as client:
            client.wait_ready(10)
            for _ in range(CALLS):
                np.testing.assert_allclose(client.grad(square()).calls[0]["x"], [2, 4, 6])
        counts = [requests_total(s) for s in self.servers]
        print("calls per server:", counts)
        self.assertEqual(sum(counts), CALLS)
        for n in counts:  # a third each once every connection is up; the first calls may not wait
            self.assertGreaterEqual(n, CALLS // 3 - 5, counts)

    def run_while_one_stops(self, sig):
        """Four threads call for 5 s; after 1.5 s one server gets sig. Every call must succeed."""
        failures, done = [], [0]
        lock = threading.Lock()
        stop_at = time.monotonic() + 5
        with Client(self.target, timeout=20) as client:
            client.wait_ready(10)

            def work():
                while time.monotonic() < stop_at:
                    try:
                        client.grad(square())
                        with lock:
                            done[0] += 1
                    except Exception as e:  # noqa: BLE001: every failure is the test's failure
                        with lock:
                            failures.append(repr(e))

            threads = [threading.Thread(target=work) for _ in range(4)]
            for t in threads:
                t.start()
            time.sleep(1.5)
            self.servers[1].send_signal(sig)
            for t in threads:
                t.join()
        print(f"{sig.name}: {done[0]} calls, {len(failures)} failed")
        self.assertEqual(failures, [])
        self.assertGreater(done[0], 100)

    def test_calls_keep_succeeding_when_a_server_is_killed(self):
        self.run_while_one_stops(signal.SIGKILL)

    def test_calls_keep_succeeding_when_a_server_drains(self):
        self.run_while_one_stops(signal.SIGTERM)


if __name__ == "__main__":
    unittest.main(verbosity=2)
