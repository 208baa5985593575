"""Shared memory (gradserve.SharedMemory, Client.register_shared_memory) through the Python client
against a real server started with --shared_memory_prefix: leaves, seeds and gradients through
a region equal PyTorch's and the same request sent inline, in one-shot calls and sessions; a
read-only region as a destination, an unregistered region, a range past the end and an object
shrunk after registering are each INVALID_ARGUMENT with a clear message, and the server keeps
serving; a second registration of a name is ALREADY_EXISTS, a second unregistration NOT_FOUND;
a server without the flag refuses registering with FAILED_PRECONDITION. The SharedMemory class
itself: put/get round trips, bounds, keys, close.

Run: GRADSERVE_SERVER=... GRADSERVE_PY_STUBS=... /usr/bin/python3 tests/python/test_shared_memory.py
"""

import asyncio
import gc
import itertools
import os
import unittest

import grpc
import numpy as np
import torch

from server_fixture import ServerProcess  # first: puts client/python on sys.path
import gradserve
from gradserve import (GradserveError, GraphBuilder, SharedMemory, backward_call, from_tensor,
                       to_tensor)
from gradserve.aio import AsyncClient
from gradserve.v1 import tensor_pb2

PREFIX = "/gradserve_pytest"
_counter = itertools.count()

N = 4096
X = (np.arange(N) % 17 - 8) * 0.25
W = (np.arange(N) % 13 - 6) * -0.5
NBYTES = N * 8  # float64


def new_key():
    return f"{PREFIX}_{os.getpid()}_{next(_counter)}"


def model(x, w, destinations=None):
    """loss = sum(tanh(x * w) * x): gradients for x and w, leaves x and w arrays or tensors."""
    return (GraphBuilder()
            .leaf("x", x, requires_grad=True)
            .leaf("w", w, requires_grad=True)
            .op("mul", ["x", "w"], out="y")
            .op("tanh", ["y"], out="t")
            .op("mul", ["t", "x"], out="tx")
            .op("sum", ["tx"], out="loss")
            .backward_call("loss", inputs=["x", "w"], gradient_destinations=destinations))


def torch_gradients():
    x = torch.tensor(X, requires_grad=True)
    w = torch.tensor(W, requires_grad=True)
    loss = (torch.tanh(x * w) * x).sum()
    gx, gw = torch.autograd.grad(loss, [x, w])
    return gx.numpy(), gw.numpy()


class SharedMemoryObjectTest(unittest.TestCase):
    """The SharedMemory class alone, no server."""

    def test_put_then_get_round_trips_dtype_shape_and_values(self):
        arrays = [np.arange(6, dtype=np.float64).reshape(2, 3).T, np.array(2.5, np.float32),
                  np.array([[-1, 2**40]], np.int64), np.array([True, False, True]),
                  np.array([1.5, -2.0], dtype=">f8"), np.zeros((0, 3), np.float32)]
        with SharedMemory(new_key(), 256) as shm:
            for offset, a in zip((0, 64, 100, 200, 240, 256), arrays):
                t = shm.put("r", offset, a)
                self.assertEqual(t.WhichOneof("contents"), "shared_memory")
                self.assertEqual((t.shared_memory.region, t.shared_memory.offset,
                                  t.shared_memory.byte_size), ("r", offset, a.nbytes))
                self.assertEqual(t.dtype, to_tensor(a).dtype)
                self.assertEqual(list(t.shape), list(a.shape))
                b = shm.get(t)
                self.assertEqual(b.dtype, a.dtype.newbyteorder("="))
                np.testing.assert_array_equal(b, a)
                self.assertTrue(b.flags.writeable)
                # The same bytes as the inline tensor carries.
                self.assertEqual(bytes(shm.buffer()[offset:offset + a.nbytes]), to_tensor(a).data)
            # byte_size 0 means the shape's size.
            t = shm.put("r", 0, np.ones(4))
            t.shared_memory.byte_size = 0
            np.testing.assert_array_equal(shm.get(t), np.ones(4))

    def test_bounds_and_contents_are_value_errors(self):
        with SharedMemory(new_key(), 64) as shm:
            with self.assertRaisesRegex(ValueError, "does not fit|not within"):
                shm.put("r", 40, np.ones(4))  # 32 bytes at 40 of 64
            with self.assertRaisesRegex(ValueError, "not within"):
                shm.put("r", -8, np.ones(1))
            with self.assertRaises(TypeError):
                shm.put("r", 0, np.ones(2, np.int32))
            t = shm.put("r", 0, np.ones(8))
            t.shared_memory.offset = 8
            with self.assertRaisesRegex(ValueError, r"range of region 'r' \[8, \+64\) is not "
                                        "within shared memory"):
                shm.get(t)
            t.shared_memory.offset = 0
            t.shared_memory.byte_size = 16
            with self.assertRaisesRegex(ValueError, "needs 64 bytes"):
                shm.get(t)
            with self.assertRaisesRegex(ValueError, "not in shared memory"):
                shm.get(to_tensor(np.ones(2)))
            # A tensor in shared memory is no inline tensor.
            with self.assertRaisesRegex(ValueError, "SharedMemory.get"):
                from_tensor(shm.put("r", 0, np.ones(2)))

    def test_keys_sizes_and_close(self):
        for bad in ("gradserve_x", "/", "/a/b", ""):
            with self.assertRaisesRegex(ValueError, "shm_open"):
                SharedMemory(bad, 64)
        key = new_key()
        with self.assertRaisesRegex(ValueError, "positive"):
            SharedMemory(key, 0)
        shm = SharedMemory(key, 64, mode=0o640)
        path = "/dev/shm" + key
        self.assertEqual(os.stat(path).st_size, 64)
        self.assertEqual(os.stat(path).st_mode & 0o777, 0o640)
        with self.assertRaises(FileExistsError):
            SharedMemory(key, 64)  # exists: refused, and the first is untouched
        self.assertTrue(os.path.exists(path))
        shm.close()
        self.assertFalse(os.path.exists(path))
        self.assertTrue(shm.closed)
        shm.close()  # a second close does nothing
        with self.assertRaisesRegex(ValueError, "closed"):
            shm.put("r", 0, np.ones(1))
        # One never closed is unlinked when collected.
        forgotten = SharedMemory(key, 64)
        del forgotten
        gc.collect()
        self.assertFalse(os.path.exists(path))


class SharedMemoryServerTest(unittest.TestCase):

    @classmethod
    def setUpClass(cls):
        cls.server = ServerProcess("--worker_threads=2",
                                   f"--shared_memory_prefix={PREFIX}").start()
        cls.client = cls.server.client()

    @classmethod
    def tearDownClass(cls):
        cls.client.close()
        cls.server.stop()

    def region(self, name, byte_size, writable):
        """A new SharedMemory registered as name; closed and unregistered after the test."""
        shm = SharedMemory(new_key(), byte_size)
        self.addCleanup(shm.close)
        ttl = self.client.register_shared_memory(name, shm, writable=writable)
        self.assertGreater(ttl, 0)
        self.addCleanup(self.unregister_quietly, name)
        return shm

    def unregister_quietly(self, name):
        try:
            self.client.unregister_shared_memory(name)
        except GradserveError as e:
            if e.code != grpc.StatusCode.NOT_FOUND:
                raise

    def assert_still_serving(self):
        result = self.client.grad(model(X, W))
        np.testing.assert_allclose(result.calls[0]["x"], torch_gradients()[0], rtol=1e-12)

    def assert_refused(self, request, code, message):
        with self.assertRaises(GradserveError) as e:
            self.client.grad(request)
        self.assertEqual(e.exception.code, code, e.exception)
        self.assertIn(message, e.exception.message)
        self.assert_still_serving()
        return e.exception

    def test_gradients_through_shared_memory_equal_pytorch_and_inline(self):
        inline = self.client.grad(model(X, W))
        gx, gw = torch_gradients()
        src = self.region("in", 2 * NBYTES, writable=False)
        dst = self.region("out", 2 * NBYTES, writable=True)
        xs, ws = src.put("in", 0, X), src.put("in", NBYTES, W)
        result = self.client.grad(model(xs, ws, {"x": dst.range("out", 0, NBYTES),
                                                 "w": dst.range("out", NBYTES, NBYTES)}))
        # The bytes of neither the leaves nor the gradients crossed the connection.
        self.assertLess(result.response.ByteSize(), 512)
        call = result.calls[0]
        self.assertEqual(set(call.in_shared_memory), {"x", "w"})
        self.assertIsNone(call.gradients["x"])
        self.assertTrue(call.connected["x"])
        self.assertEqual(call.in_shared_memory["x"].shared_memory.region, "out")
        self.assertIn("in_shared_memory", repr(call))
        for name, expected in (("x", gx), ("w", gw)):
            got = dst.get(call.in_shared_memory[name])
            self.assertEqual(got.shape, (N,))
            np.testing.assert_array_equal(got, inline.calls[0][name])
            np.testing.assert_allclose(got, expected, rtol=1e-12)
        # Leaves in shared memory, gradients inline: as the inline request.
        mixed = self.client.grad(model(xs, W))
        self.assertEqual(mixed.calls[0].in_shared_memory, {})
        np.testing.assert_array_equal(mixed.calls[0]["w"], inline.calls[0]["w"])

        info = self.client.info()
        self.assertEqual(info.limits.shared_memory_prefix, PREFIX)
        self.assertEqual(info.counters.shared_memory_regions, 2)
        self.assertEqual(info.counters.shared_memory_bytes, 4 * NBYTES)
        self.client.unregister_shared_memory("in")
        self.client.unregister_shared_memory("out")
        self.assertEqual(self.client.info().counters.shared_memory_regions, 0)
        with self.assertRaises(GradserveError) as e:
            self.client.unregister_shared_memory("out")
        self.assertEqual(e.exception.code, grpc.StatusCode.NOT_FOUND)
        self.assertIn("out", e.exception.message)

    def test_a_gradient_of_one_value_equals_pytorch_inline_and_in_shared_memory(self):
        # sum(x * 3)'s gradient is one value expanded, and stays so until it is written out
        # (Note [A gradient of one value]); two such gradients reaching x are added. Long enough
        # that sum's gradient is not copied out (over 4096 elements); in float32 over 1 MiB too,
        # where the product is never stored (Note [A scaled sum in one pass]).
        for n, dtype in ((3 * N + 5, np.float32), (3 * N + 5, np.float64), (300001, np.float32)):
            x = ((np.arange(n) % 17 - 8) * 0.25).astype(dtype)
            graphs = {
                "one": lambda b: b.op("mul", ["x"], out="y", other=3.0).op("sum", ["y"], out="loss"),
                "two": lambda b: (b.op("mul", ["x"], out="y", other=3.0).op("sum", ["y"], out="a")
                                  .op("mul", ["x"], out="z", other=-0.5).op("sum", ["z"], out="b")
                                  .op("add", ["a", "b"], out="loss")),
            }
            tx = torch.tensor(x, requires_grad=True)
            expected = {
                "one": torch.autograd.grad((tx * 3.0).sum(), tx)[0].numpy(),
                "two": torch.autograd.grad((tx * 3.0).sum() + (tx * -0.5).sum(), tx)[0].numpy(),
            }
            region = f"out_{np.dtype(dtype).name}_{n}"
            dst = self.region(region, x.nbytes + 16, writable=True)
            for name, build in graphs.items():
                with self.subTest(dtype=np.dtype(dtype).name, graph=name):
                    dst.buffer()[:x.nbytes + 16] = bytes([7]) * (x.nbytes + 16)
                    inline = self.client.grad(
                        build(GraphBuilder().leaf("x", x, requires_grad=True))
                        .backward_call("loss", inputs=["x"]))
                    np.testing.assert_array_equal(inline.calls[0]["x"], expected[name])
                    result = self.client.grad(
                        build(GraphBuilder().leaf("x", x, requires_grad=True))
                        .backward_call("loss", inputs=["x"], gradient_destinations={
                            "x": dst.range(region, 8, x.nbytes)}))
                    got = dst.get(result.calls[0].in_shared_memory["x"])
                    np.testing.assert_array_equal(got, expected[name])
                    # Nothing outside the range was written.
                    around = bytes(dst.buffer()[:8]) + bytes(dst.buffer()[8 + x.nbytes:])
                    self.assertEqual(around, bytes([7]) * 16)

    def test_session_takes_leaves_seeds_and_destinations_in_shared_memory(self):
        buf = self.region("buf", 4 * NBYTES, writable=True)
        xs = buf.put("buf", 0, X)
        forward = (GraphBuilder().leaf("x", xs, requires_grad=True)
                   .leaf("w", W, requires_grad=True).op("mul", ["x", "w"], out="y")
                   .op("tanh", ["y"], out="t"))
        seed = np.sign(X) * 0.5
        x = torch.tensor(X, requires_grad=True)
        t = torch.tanh(x * torch.tensor(W))
        gx, = torch.autograd.grad(t, [x], torch.tensor(seed))
        with self.client.forward(forward) as session:
            calls = session.backward([backward_call(
                "t", {"t": buf.put("buf", NBYTES, seed)}, ["x", "w"],
                gradient_destinations={"x": buf.range("buf", 2 * NBYTES, NBYTES)})])
        self.assertEqual(set(calls[0].in_shared_memory), {"x"})
        np.testing.assert_allclose(buf.get(calls[0].in_shared_memory["x"]), gx.numpy(),
                                   rtol=1e-12)
        self.assertEqual(calls[0]["w"].shape, (N,))  # no destination: inline

    def test_bad_regions_and_ranges_are_invalid_argument_and_harm_nothing(self):
        src = self.region("ro", NBYTES, writable=False)
        dst = self.region("rw", NBYTES, writable=True)
        xs = src.put("ro", 0, X)
        e = self.assert_refused(model(X, W, {"x": dst.range("ro", 0, NBYTES)}),
                                grpc.StatusCode.INVALID_ARGUMENT, "was registered read-only")
        self.assertEqual(e.method, "ComputeGradients")
        unregistered = tensor_pb2.Tensor()
        unregistered.CopyFrom(xs)
        unregistered.shared_memory.region = "nope"
        self.assert_refused(model(unregistered, W), grpc.StatusCode.INVALID_ARGUMENT,
                            "leaf 'x': shared-memory region 'nope' is not registered")
        self.assert_refused(model(X, W, {"x": SharedMemory.range("nope", 0, NBYTES)}),
                            grpc.StatusCode.INVALID_ARGUMENT, "'nope' is not registered")
        past_end = tensor_pb2.Tensor()
        past_end.CopyFrom(xs)
        past_end.shared_memory.offset = 8
        self.assert_refused(model(past_end, W), grpc.StatusCode.INVALID_ARGUMENT,
                            "is not within shared-memory region 'ro'")
        self.assert_refused(model(X, W, {"x": dst.range("rw", 8, NBYTES)}),
                            grpc.StatusCode.INVALID_ARGUMENT,
                            "is not within shared-memory region 'rw'")
        self.assert_refused(model(X, W, {"x": dst.range("rw", 0, NBYTES - 8)}),
                            grpc.StatusCode.INVALID_ARGUMENT, "destination range has")
        # Registrations the server refuses.
        with self.assertRaises(GradserveError) as e:
            self.client.register_shared_memory("ro", src)
        self.assertEqual(e.exception.code, grpc.StatusCode.ALREADY_EXISTS)
        with self.assertRaises(GradserveError) as e:
            self.client.register_shared_memory("big", src.key, byte_size=NBYTES + 1)
        self.assertEqual(e.exception.code, grpc.StatusCode.INVALID_ARGUMENT)
        with SharedMemory("/gradserve_elsewhere_" + str(os.getpid()), 64) as other:
            with self.assertRaises(GradserveError) as e:
                self.client.register_shared_memory("other", other)
            self.assertEqual(e.exception.code, grpc.StatusCode.INVALID_ARGUMENT)
        with self.assertRaisesRegex(ValueError, "give byte_size"):
            self.client.register_shared_memory("absent", PREFIX + "_absent")
        self.assert_still_serving()

    def test_an_object_shrunk_after_registering_is_invalid_argument(self):
        buf = self.region("shrunk", 2 * NBYTES, writable=True)
        xs = buf.put("shrunk", NBYTES, X)
        # Shrunk under the server, whose mapping outlives it (this process reads nothing past
        # the new end: its own mapping would fault there too).
        os.truncate("/dev/shm" + buf.key, NBYTES // 2)
        self.assert_refused(model(xs, W), grpc.StatusCode.INVALID_ARGUMENT,
                            "the client shrank it")
        self.assert_refused(model(X, W, {"w": buf.range("shrunk", NBYTES, NBYTES)}),
                            grpc.StatusCode.INVALID_ARGUMENT, "shrank")

    def test_register_by_key_and_idle_ttl(self):
        shm = SharedMemory(new_key(), 128)
        self.addCleanup(shm.close)
        ttl = self.client.register_shared_memory("bykey", shm.key, idle_ttl=30)
        self.addCleanup(self.unregister_quietly, "bykey")
        self.assertEqual(ttl, 30.0)
        self.assertEqual(self.client.info().counters.shared_memory_bytes, 128)  # the whole object
        with self.assertRaisesRegex(ValueError, "idle_ttl"):
            self.client.register_shared_memory("zero", shm, idle_ttl=0)

    def test_asyncio_client_registers_and_unregisters(self):
        shm = SharedMemory(new_key(), NBYTES)
        self.addCleanup(shm.close)

        async def run():
            async with AsyncClient(self.server.address, timeout=30) as client:
                await client.register_shared_memory("aio", shm, writable=True)
                result = await client.grad(model(X, W, {"x": shm.range("aio", 0, NBYTES)}))
                await client.unregister_shared_memory("aio")
                with self.assertRaises(GradserveError) as e:
                    await client.unregister_shared_memory("aio")
                self.assertEqual(e.exception.code, grpc.StatusCode.NOT_FOUND)
                return result

        result = asyncio.run(run())
        np.testing.assert_allclose(shm.get(result.calls[0].in_shared_memory["x"]),
                                   torch_gradients()[0], rtol=1e-12)


class SharedMemoryReplicasTest(unittest.TestCase):
    """A Client of two replicas sends the requests that name a region to the one that holds it
    (over the sessions' channel, as it registered it), unary and streamed; round robin would
    send every other one to the replica without the region."""

    def test_requests_naming_a_region_reach_the_server_that_holds_it(self):
        flags = ("--worker_threads=2", f"--shared_memory_prefix={PREFIX}")
        with ServerProcess(*flags) as a, ServerProcess(*flags) as b, \
                SharedMemory(new_key(), 2 * NBYTES) as shm:
            client = gradserve.Client(f"{a.address},{b.address}", timeout=30)
            self.addCleanup(client.close)
            client.register_shared_memory("buf", shm, writable=True)
            xs = shm.put("buf", 0, X)
            request = model(xs, W, {"x": shm.range("buf", NBYTES, NBYTES)})
            gx, _ = torch_gradients()
            for i in range(6):
                result = client.grad(request, stream=(i % 2 == 1))
                np.testing.assert_allclose(shm.get(result.calls[0].in_shared_memory["x"]), gx,
                                           rtol=1e-12)
            # Requests that name no region are still answered by both.
            for _ in range(4):
                np.testing.assert_allclose(client.grad(model(X, W)).calls[0]["x"], gx,
                                           rtol=1e-12)


class SharedMemoryOffTest(unittest.TestCase):

    def test_registering_without_the_flag_is_failed_precondition(self):
        with ServerProcess() as server, SharedMemory(new_key(), 64) as shm:
            client = server.client()
            try:
                with self.assertRaises(GradserveError) as e:
                    client.register_shared_memory("buf", shm, writable=True)
                self.assertEqual(e.exception.code, grpc.StatusCode.FAILED_PRECONDITION)
                self.assertIn("shared_memory_prefix", e.exception.message)
                # A request naming a region is refused, not faulted.
                t = tensor_pb2.Tensor(dtype=tensor_pb2.DTYPE_FLOAT32, shape=[16])
                t.shared_memory.CopyFrom(SharedMemory.range("buf", 0, 64))
                with self.assertRaises(GradserveError) as e:
                    client.grad(GraphBuilder().leaf("x", t, requires_grad=True)
                                .op("sum", ["x"], out="loss").backward_call("loss"))
                self.assertEqual(e.exception.code, grpc.StatusCode.INVALID_ARGUMENT)
                self.assertIn("shared memory is off on this server", e.exception.message)
                self.assertEqual(client.ping(b"ok"), b"ok")
            finally:
                client.close()


if __name__ == "__main__":
    unittest.main()
