"""Error statuses as a Python user of gradserve sees them (DESIGN.md section 5).

Each bad request must fail with its gRPC status code and a message that names the culprit
(the op, value, leaf or node), and the server must keep answering correctly afterwards: every
test ends by checking that a ping and a small, valid gradient request still succeed.

Run: GRADSERVE_SERVER=... GRADSERVE_PY_STUBS=... /usr/bin/python3 tests/python/test_errors.py
"""

import time
import unittest

import grpc
import numpy as np

from server_fixture import ServerProcess  # first: puts client/python on sys.path
from gradserve import GradserveError, GraphBuilder
from gradserve.v1 import tensor_pb2

INVALID_ARGUMENT = grpc.StatusCode.INVALID_ARGUMENT


class ErrorStatusTest(unittest.TestCase):

    @classmethod
    def setUpClass(cls):
        cls.server = ServerProcess("--worker_threads=2").start()
        cls.client = cls.server.client()

    @classmethod
    def tearDownClass(cls):
        cls.client.close()
        cls.server.stop()

    def tearDown(self):
        self.assert_still_serving()

    def assert_still_serving(self):
        self.assertTrue(self.server.alive(), "the server exited:\n" + self.server.log())
        self.assertEqual(self.client.ping(b"still there?"), b"still there?")
        g = GraphBuilder().leaf("x", np.array([1.0, 2.0]), requires_grad=True)
        g.op("mul", ["x", "x"], out="y").op("sum", ["y"], out="loss")
        g.backward_call("loss", inputs=["x"])
        np.testing.assert_array_equal(self.client.grad(g).calls[0]["x"], [2.0, 4.0])

    def assert_fails(self, request, code, *culprits, timeout=None):
        """Sends request; asserts the status code and that the message names every culprit."""
        with self.assertRaises(GradserveError) as cm:
            self.client.grad(request, timeout=timeout)
        e = cm.exception
        self.assertEqual(e.code, code, e.message)
        for culprit in culprits:
            self.assertIn(culprit, e.message)
        return e

    @staticmethod
    def graph():
        return GraphBuilder().leaf("x", np.ones((2, 3), np.float32), requires_grad=True)

    def test_bytes_that_are_no_request(self):
        """Raw bytes that do not parse as a GradRequest: INVALID_ARGUMENT, as on the stream."""
        with grpc.insecure_channel(self.server.address) as channel:
            call = channel.unary_unary("/gradserve.v1.GradService/ComputeGradients")
            with self.assertRaises(grpc.RpcError) as cm:
                call(b"\xff\xff\xff\xff\x0f garbage", timeout=30)
        self.assertEqual(cm.exception.code(), INVALID_ARGUMENT, cm.exception.details())
        self.assertIn("malformed request", cm.exception.details())

    def test_bad_values_in_a_graph_the_server_has_seen(self):
        """Note [Reusing a validated graph]: a graph the server's threads have just checked,
        sent again with leaf values that are wrong for it, fails as it would the first time,
        and the good graph works again afterwards."""
        def seen(x, w):
            g = GraphBuilder().leaf("x", x, requires_grad=True).leaf("w", w)
            g.op("mul", ["x", "w"], out="y").op("sum", ["y"], out="loss")
            return g.backward_call("loss", inputs=["x"])

        good = seen(np.ones(3), np.full(3, 2.0))
        for _ in range(4):
            np.testing.assert_array_equal(self.client.grad(good).calls[0]["x"], [2, 2, 2])
        e = self.assert_fails(seen(np.ones(3, np.int64), np.ones(3)), INVALID_ARGUMENT,
                              "leaf #0 'x'", "floating dtype")
        self.assertIn("int64", e.message)
        self.assert_fails(seen(np.ones(3), np.ones(4)), INVALID_ARGUMENT, "op #0", "'y'")
        for _ in range(4):
            np.testing.assert_array_equal(self.client.grad(good).calls[0]["x"], [2, 2, 2])

    def test_unknown_op(self):
        g = self.graph().op("frobnicate", ["x"], out="y").op("sum", ["y"], out="loss")
        g.backward_call("loss", inputs=["x"])
        self.assert_fails(g, INVALID_ARGUMENT, "frobnicate")

    def test_dangling_reference(self):
        g = self.graph().op("mul", ["x", "nowhere"], out="y").op("sum", ["y"], out="loss")
        g.backward_call("loss", inputs=["x"])
        self.assert_fails(g, INVALID_ARGUMENT, "nowhere")

    def test_byte_length_mismatch(self):
        request = self.graph().op("sum", ["x"], out="loss").backward_call(
            "loss", inputs=["x"]).request()
        bad = request.graph.leaves.add(name="short", requires_grad=False)
        bad.value.CopyFrom(tensor_pb2.Tensor(dtype=tensor_pb2.DTYPE_FLOAT64, shape=[4],
                                             data=b"\0" * 31))
        e = self.assert_fails(request, INVALID_ARGUMENT, "short")
        self.assertRegex(e.message, "31|32")

    def test_shape_overflow(self):
        request = self.graph().op("sum", ["x"], out="loss").backward_call(
            "loss", inputs=["x"]).request()
        huge = request.graph.leaves.add(name="huge")
        huge.value.CopyFrom(tensor_pb2.Tensor(dtype=tensor_pb2.DTYPE_FLOAT32,
                                              shape=[1 << 40, 1 << 40], data=b""))
        self.assert_fails(request, INVALID_ARGUMENT, "huge")

    def test_shape_over_the_element_limit(self):
        request = self.graph().op("sum", ["x"], out="loss").backward_call(
            "loss", inputs=["x"]).request()
        big = request.graph.leaves.add(name="big")
        big.value.CopyFrom(tensor_pb2.Tensor(dtype=tensor_pb2.DTYPE_FLOAT32,
                                             shape=[1 << 20, 1 << 20], data=b""))
        self.assert_fails(request, grpc.StatusCode.RESOURCE_EXHAUSTED, "big")

    def test_nan_under_anomaly_mode(self):
        g = GraphBuilder().leaf("x", np.array([4.0, -1.0]), requires_grad=True)
        g.op("sqrt", ["x"], out="root").op("sum", ["root"], out="loss")
        g.backward_call("loss", inputs=["x"], retain_graph=True)  # NaN, but no anomaly mode
        g.backward_call("loss", inputs=["x"], detect_anomaly=True)
        e = self.assert_fails(g, INVALID_ARGUMENT)
        self.assertRegex(e.message, "(?i)sqrt")
        self.assertRegex(e.message, "(?i)nan")
        g = GraphBuilder().leaf("x", np.array([4.0, -1.0]), requires_grad=True)
        g.op("sqrt", ["x"], out="root").op("sum", ["root"], out="loss")
        grad = self.client.grad(g.backward_call("loss", inputs=["x"])).calls[0]["x"]
        self.assertEqual(grad[0], 0.25)
        self.assertTrue(np.isnan(grad[1]))

    def test_freed_graph(self):
        g = self.graph().op("exp", ["x"], out="y").op("sum", ["y"], out="loss")
        g.backward_call("loss", inputs=["x"])  # frees the saved tensors
        g.backward_call("loss", inputs=["x"])
        e = self.assert_fails(g, grpc.StatusCode.FAILED_PRECONDITION)
        self.assertRegex(e.message, "(?i)exp|retain_graph")

    def test_unused_input_without_allow_unused(self):
        g = self.graph().leaf("spare", np.ones(2), requires_grad=True)
        g.op("sum", ["x"], out="loss").backward_call("loss", inputs=["x", "spare"])
        self.assert_fails(g, INVALID_ARGUMENT, "spare")

    def test_expired_deadline(self):
        """A long graph under a short deadline: DEADLINE_EXCEEDED, and the server stops the
        work (nothing stays in flight)."""
        rng = np.random.default_rng(0)
        g = GraphBuilder().leaf("h0", rng.uniform(-1, 1, (384, 384)).astype(np.float32),
                                requires_grad=True)
        g.leaf("w", rng.uniform(-0.05, 0.05, (384, 384)).astype(np.float32), requires_grad=True)
        for i in range(400):
            g.op("matmul", [f"h{i}", "w"], out=f"m{i}")
            g.op("tanh", [f"m{i}"], out=f"h{i + 1}")
        g.op("sum", ["h400"], out="loss").backward_call("loss", inputs=["h0", "w"])
        start = time.monotonic()
        self.assert_fails(g, grpc.StatusCode.DEADLINE_EXCEEDED, timeout=0.3)
        self.assertLess(time.monotonic() - start, 5)
        deadline = time.monotonic() + 20
        while self.client.info().counters.in_flight > 0:
            self.assertLess(time.monotonic(), deadline, "the expired request kept running")
            time.sleep(0.05)


if __name__ == "__main__":
    unittest.main(verbosity=2)
