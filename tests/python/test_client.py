"""The Python client itself: tensor conversion, the graph builder, and each RPC against a real
server (ping, info, health, unary and streamed grad, return values, error mapping).

Run: GRADSERVE_SERVER=... GRADSERVE_PY_STUBS=... /usr/bin/python3 tests/python/test_client.py
"""

import asyncio
import threading
import time
import unittest

import grpc
import numpy as np

from server_fixture import ServerProcess  # first: puts client/python on sys.path
from gradserve import GradserveError, GraphBuilder, attr_value, chunks, from_tensor, to_tensor
from gradserve.aio import AsyncClient
from gradserve.v1 import gradserve_pb2, tensor_pb2


class TensorConversionTest(unittest.TestCase):

    def test_round_trip_keeps_dtype_shape_and_values(self):
        arrays = [np.array(2.5, np.float32), np.arange(6, dtype=np.float64).reshape(2, 3).T,
                  np.array([[-1, 2**40]], np.int64), np.array([True, False, True]),
                  np.array([1.5, -2.0], dtype=">f8"), np.zeros((0, 3), np.float32)]
        for a in arrays:
            t = to_tensor(a)
            self.assertEqual(list(t.shape), list(a.shape))
            b = from_tensor(t)
            self.assertEqual(b.shape, a.shape)
            self.assertEqual(b.dtype, a.dtype.newbyteorder("="))
            np.testing.assert_array_equal(b, a)
            self.assertTrue(b.flags.writeable)

    def test_little_endian_bytes(self):
        self.assertEqual(to_tensor(np.array([1.0], np.float32)).data, b"\x00\x00\x80\x3f")
        self.assertEqual(to_tensor(np.array([1], np.int64)).data, b"\x01" + b"\x00" * 7)

    def test_rejects_other_dtypes_and_bad_contents(self):
        with self.assertRaises(TypeError):
            to_tensor(np.array([1], np.int32))
        with self.assertRaises(ValueError):
            from_tensor(tensor_pb2.Tensor(dtype=tensor_pb2.DTYPE_FLOAT32, shape=[2], data=b"1"))
        with self.assertRaises(ValueError):
            from_tensor(tensor_pb2.Tensor(shape=[1], data=b"1234"))

    def test_hand_written_values(self):
        t = tensor_pb2.Tensor(dtype=tensor_pb2.DTYPE_FLOAT32, shape=[2],
                              values=tensor_pb2.TensorValues(doubles=[0.5, 2]))
        np.testing.assert_array_equal(from_tensor(t), np.array([0.5, 2], np.float32))

    def test_attr_values(self):
        self.assertEqual(attr_value(True).WhichOneof("value"), "b")
        self.assertEqual(attr_value(3).i, 3)
        self.assertEqual(attr_value(np.int64(3)).i, 3)
        self.assertEqual(attr_value(0.5).f, 0.5)
        self.assertEqual(attr_value("mean").s, "mean")
        self.assertEqual(list(attr_value([0, -1]).ints.values), [0, -1])
        self.assertEqual(list(attr_value([0.5, 1]).floats.values), [0.5, 1.0])
        self.assertEqual(list(attr_value(["a", "b"]).strings.values), ["a", "b"])
        with self.assertRaises(TypeError):
            attr_value({"a": 1})

    def test_builder_rejects_duplicate_names(self):
        g = GraphBuilder().leaf("x", np.ones(2))
        with self.assertRaises(ValueError):
            g.op("neg", ["x"], out="x")

    def test_a_leaf_of_a_bad_dtype_adds_nothing(self):
        g = GraphBuilder().leaf("x", np.ones(2))
        with self.assertRaises(TypeError):
            g.leaf("y", np.ones(2, np.int32))
        self.assertEqual([leaf.name for leaf in g.graph().leaves], ["x"])
        g.leaf("y", np.ones(2, np.int64))  # the name is still free
        self.assertEqual(list(g.graph().leaves[1].value.shape), [2])


class ChunkBytesTest(unittest.TestCase):
    """gradserve/chunks.py: Chunks written as protobuf writes them, and read back."""

    def test_chunks_are_written_as_protobuf_writes_them(self):
        for payload, size in ((b"", 4), (b"abc", 4), (bytes(range(256)) * 40, 1000),
                              (b"x" * 300, 300), (b"x" * 301, 300)):
            messages = list(chunks.chunk_messages(payload, size))
            expected = [gradserve_pb2.Chunk(data=payload[i:i + size],
                                            total_bytes=len(payload) if i == 0 else 0)
                        for i in range(0, max(len(payload), 1), size)]
            self.assertEqual(messages, [c.SerializeToString() for c in expected])
            self.assertEqual(chunks.join_data(messages), payload)

    def test_received_chunks_are_read_as_protobuf_reads_them(self):
        odd = gradserve_pb2.Chunk(data=b"first", total_bytes=-5).SerializeToString()
        odd += b"\x0a\x04last" + b"\x19" + b"\x00" * 8 + b"\x25" + b"\x00" * 4  # later data wins
        self.assertEqual(gradserve_pb2.Chunk.FromString(odd).data, b"last")
        self.assertEqual(chunks.join_data([odd, gradserve_pb2.Chunk().SerializeToString()]),
                         b"last")
        for bad in (b"\x0a\x05abc", b"\x0a", b"\xff" * 11, b"\x0b"):
            with self.assertRaises(ValueError):
                chunks.join_data([bad])


class ClientRpcTest(unittest.TestCase):

    @classmethod
    def setUpClass(cls):
        # A small message limit, so that a modest request must be streamed.
        cls.server = ServerProcess("--worker_threads=2", "--max_message_bytes=6000000",
                                   "--chunk_bytes=1000000").start()
        cls.client = cls.server.client()

    @classmethod
    def tearDownClass(cls):
        cls.client.close()
        cls.server.stop()

    def test_ping_info_health(self):
        self.assertEqual(self.client.ping(b"abc"), b"abc")
        info = self.client.info()
        self.assertTrue(info.version)
        self.assertEqual(info.limits.max_message_bytes, 6000000)
        self.assertIn("cpu", [d.name for d in info.devices])
        self.assertIn("matmul", [op.name for op in info.ops])
        self.assertEqual(self.client.health(), "SERVING")

    def test_grad_with_return_values_and_timings(self):
        g = GraphBuilder().leaf("x", np.array([1.0, 2.0, 3.0]), requires_grad=True)
        g.leaf("w", np.array([0.5, -1.0, 2.0], np.float64), requires_grad=True)
        g.op("mul", ["x", "w"], out="h").op("sum", ["h"], out="loss")
        g.backward_call("loss", inputs=["x", "w"]).return_values("h")
        r = self.client.grad(g, request_id="client-test")
        self.assertEqual(r.request_id, "client-test")
        np.testing.assert_array_equal(r.calls[0]["x"], [0.5, -1.0, 2.0])
        np.testing.assert_array_equal(r.calls[0]["w"], [1.0, 2.0, 3.0])
        self.assertEqual(r.calls[0].connected, {"x": True, "w": True})
        np.testing.assert_array_equal(r.values["h"], [0.5, -2.0, 6.0])
        self.assertGreater(r.num_nodes, 0)
        self.assertGreaterEqual(r.timings["total_us"], r.timings["backward_us"])

    def test_large_request_is_streamed(self):
        x = np.random.default_rng(0).uniform(-1, 1, (2, 1_000_000)).astype(np.float32)
        g = GraphBuilder().leaf("x", x, requires_grad=True)
        g.op("mul", ["x"], out="y", other=3.0).op("sum", ["y"], out="loss")
        g.backward_call("loss", inputs=["x"])
        with self.assertRaises(GradserveError) as cm:
            self.client.grad(g, stream=False)
        self.assertEqual(cm.exception.code, grpc.StatusCode.RESOURCE_EXHAUSTED)
        grad = self.client.grad(g).calls[0]["x"]  # picks the stream by itself
        self.assertEqual(grad.shape, x.shape)
        self.assertTrue((grad == 3.0).all())

    def test_concurrent_calls_share_a_client(self):
        errors = []

        def work(k):
            try:
                for _ in range(5):
                    g = GraphBuilder().leaf("x", np.full(4, float(k)), requires_grad=True)
                    g.op("mul", ["x", "x"], out="y").op("sum", ["y"], out="l")
                    grad = self.client.grad(g.backward_call("l", inputs=["x"])).calls[0]["x"]
                    np.testing.assert_array_equal(grad, np.full(4, 2.0 * k))
            except Exception as e:  # reported below, in the test's thread
                errors.append(e)

        threads = [threading.Thread(target=work, args=(k,)) for k in range(4)]
        for t in threads:
            t.start()
        for t in threads:
            t.join(60)
        self.assertFalse(errors)

    def test_errors_carry_code_and_message(self):
        g = GraphBuilder().leaf("x", np.ones(2), requires_grad=True)
        g.op("nosuchop", ["x"], out="y").backward_call("y", inputs=["x"])
        with self.assertRaises(GradserveError) as cm:
            self.client.grad(g)
        self.assertEqual(cm.exception.code, grpc.StatusCode.INVALID_ARGUMENT)
        self.assertIn("nosuchop", cm.exception.message)
        self.assertIn("INVALID_ARGUMENT", str(cm.exception))


class TraceIdTest(unittest.TestCase):
    """A trace id from the client reaches the server's log line and comes back (docs/operations.md,
    "Trace ids and JSON logs")."""

    TRACEPARENT = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01"

    @classmethod
    def setUpClass(cls):
        cls.server = ServerProcess("--worker_threads=2", "--log_requests=all",
                                   "--max_message_bytes=6000000", "--chunk_bytes=1000000").start()
        cls.client = cls.server.client()

    @classmethod
    def tearDownClass(cls):
        cls.client.close()
        cls.server.stop()

    def square(self, n=3):
        g = GraphBuilder().leaf("x", np.arange(n, dtype=np.float32), requires_grad=True)
        g.op("mul", ["x", "x"], out="y").op("sum", ["y"], out="loss")
        return g.backward_call("loss", inputs=["x"])

    def logged(self, needle):
        """Waits (the log is read by a thread) for a server log line containing needle."""
        for _ in range(100):
            lines = [line for line in self.server.log().splitlines() if needle in line]
            if lines:
                return lines[-1]
            time.sleep(0.05)
        self.fail(f"no log line with {needle!r} in:\n{self.server.log()}")

    def test_request_id_unary_and_streamed(self):
        r = self.client.grad(self.square(), request_id="py-unary", trace_id="py-trace-1")
        self.assertEqual(r.trace_id, "py-trace-1")
        self.assertIn("trace=py-trace-1", self.logged("id=py-unary"))
        r = self.client.grad(self.square(), request_id="py-stream", trace_id="py-trace-2",
                             stream=True)
        self.assertEqual(r.trace_id, "py-trace-2")
        self.assertIn("trace=py-trace-2", self.logged("id=py-stream"))

    def test_traceparent_and_forward(self):
        r = self.client.grad(self.square(), request_id="py-w3c", trace_id=self.TRACEPARENT)
        self.assertEqual(r.trace_id, self.TRACEPARENT)
        self.assertIn(f"trace={self.TRACEPARENT}", self.logged("id=py-w3c"))
        with self.client.forward(self.square(), request_id="py-fwd",
                                 trace_id="py-trace-fwd") as session:
            self.assertEqual(session.trace_id, "py-trace-fwd")
        self.assertIn("trace=py-trace-fwd", self.logged("id=py-fwd"))

    def test_without_one_nothing_is_sent_or_echoed(self):
        r = self.client.grad(self.square(), request_id="py-none")
        self.assertIsNone(r.trace_id)
        self.assertNotIn("trace=", self.logged("id=py-none"))

    def test_an_id_the_server_would_ignore_is_refused_before_sending(self):
        for bad in ["", "has space", "x" * 129, "caf\u00e9"]:
            with self.assertRaises(ValueError):
                self.client.grad(self.square(), trace_id=bad)

    def test_asyncio_client(self):
        async def run():
            async with AsyncClient(self.server.address, timeout=30) as c:
                unary = await c.grad(self.square(), request_id="py-aio", trace_id="py-aio-1")
                streamed = await c.grad(self.square(), trace_id="py-aio-2", stream=True)
                return unary.trace_id, streamed.trace_id

        self.assertEqual(asyncio.run(run()), ("py-aio-1", "py-aio-2"))
        self.assertIn("trace=py-aio-1", self.logged("id=py-aio"))


if __name__ == "__main__":
    unittest.main(verbosity=2)
