"""Graph sessions (docs/sessions.md) through the Python client against a real server: the
forward values and each backward call's gradients equal PyTorch's for the same graph, the
seeds chosen after a look at the outputs; retain_graph as in PyTorch; Extend adds a loss chosen
after a look at the outputs, and backward from it equals PyTorch's; the context manager
releases.

Run: GRADSERVE_SERVER=... GRADSERVE_PY_STUBS=... /usr/bin/python3 tests/python/test_sessions.py
"""

import unittest

import grpc
import numpy as np
import torch

from server_fixture import ServerProcess  # first: puts client/python on sys.path
from gradserve import GradserveError, GraphBuilder, backward_call

X = np.array([[0.5, -1.0, 2.0], [1.5, 0.25, -0.75]])
W = np.array([[0.2, -0.4], [0.7, 0.1], [-0.3, 0.9]])


def model():
    return (GraphBuilder()
            .leaf("x", X, requires_grad=True)
            .leaf("w", W, requires_grad=True)
            .op("matmul", ["x", "w"], out="h")
            .op("tanh", ["h"], out="y")
            .op("sum", ["y"], out="loss"))


def torch_model():
    x = torch.tensor(X, requires_grad=True)
    w = torch.tensor(W, requires_grad=True)
    y = torch.tanh(x @ w)
    return x, w, y, y.sum()


class SessionTest(unittest.TestCase):

    @classmethod
    def setUpClass(cls):
        cls.server = ServerProcess("--worker_threads=2", "--max_sessions_per_tenant=4").start()
        cls.client = cls.server.client()

    @classmethod
    def tearDownClass(cls):
        cls.client.close()
        cls.server.stop()

    def sessions(self):
        return self.client.info().counters.sessions

    def test_forward_then_backward_matches_pytorch(self):
        x, w, y, _ = torch_model()
        with self.client.forward(model(), return_values=["y"]) as s:
            self.assertEqual(len(s.session_id), 32)
            np.testing.assert_allclose(s.values["y"], y.detach().numpy(), rtol=1e-12)
            self.assertEqual(self.sessions(), 1)
            # A seed the client only knows after seeing the output: a reward per element.
            seed = np.sign(s.values["y"]) * 0.5
            retained = s.backward([backward_call("y", {"y": seed}, ["x", "w"],
                                                 retain_graph=True)])
            gx, gw = torch.autograd.grad(y, [x, w], torch.tensor(seed), retain_graph=True)
            np.testing.assert_allclose(retained[0]["x"], gx.numpy(), rtol=1e-12)
            np.testing.assert_allclose(retained[0]["w"], gw.numpy(), rtol=1e-12)
            # Again, without retain_graph: the same gradients, then the graph is freed.
            again = s.backward([backward_call("y", {"y": seed}, ["x", "w"])])
            np.testing.assert_allclose(again[0]["w"], gw.numpy(), rtol=1e-12)
            with self.assertRaises(GradserveError) as e:
                s.backward([backward_call("y", {"y": seed}, ["x"])])
            self.assertEqual(e.exception.code, grpc.StatusCode.FAILED_PRECONDITION)
            _, _, y2, _ = torch_model()
            y2.backward(torch.tensor(seed))
            with self.assertRaises(RuntimeError):  # PyTorch fails the same way
                y2.backward(torch.tensor(seed))
        self.assertEqual(self.sessions(), 0)

    def test_equals_one_shot_request(self):
        one_shot = self.client.grad(model().backward_call("loss", inputs=["x", "w"]))
        with self.client.forward(model()) as s:
            calls = s.backward([backward_call("loss", inputs=["x", "w"])])
        for name in ("x", "w"):
            np.testing.assert_array_equal(calls[0][name], one_shot.calls[0][name])

    def test_accumulate_grad_persists_like_pytorch(self):
        x, w, _, loss = torch_model()
        loss.backward(retain_graph=True)
        loss.backward()
        with self.client.forward(model()) as s:
            call = backward_call("loss", accumulate_grad=True, retain_graph=True)
            s.backward([call])
            second = s.backward([call])
        np.testing.assert_allclose(second[0]["x"], x.grad.numpy(), rtol=1e-12)
        np.testing.assert_allclose(second[0]["w"], w.grad.numpy(), rtol=1e-12)

    def test_extend_then_backward_matches_pytorch(self):
        x, w, y, _ = torch_model()
        with self.client.forward(model(), return_values=["y"]) as s:
            # A target the client picks only after seeing the outputs, then a loss against it.
            target = np.round(s.values["y"])
            new = s.extend(GraphBuilder()
                           .leaf("target", target)
                           .op("mse_loss", ["y", "target"], out="mse"),
                           return_values=["mse"])
            mse = torch.nn.functional.mse_loss(y, torch.tensor(target))
            np.testing.assert_allclose(new["mse"], mse.detach().numpy(), rtol=1e-12)
            self.assertEqual(s.values["mse"], new["mse"])
            # A second extension reads the first's value and an original one.
            s.extend(GraphBuilder()
                     .leaf("scale", np.array(3.0))
                     .op("mul", ["mse", "scale"], out="scaled")
                     .op("sum", ["h"], out="hsum")
                     .op("add", ["scaled", "hsum"], out="total"))
            total = mse * 3.0 + (x @ w).sum()
            gx, gw = torch.autograd.grad(total, [x, w], retain_graph=True)
            calls = s.backward([backward_call("total", inputs=["x", "w"], retain_graph=True)])
            np.testing.assert_allclose(calls[0]["x"], gx.numpy(), rtol=1e-12)
            np.testing.assert_allclose(calls[0]["w"], gw.numpy(), rtol=1e-12)
            # The forward graph's own roots still work.
            gx, = torch.autograd.grad(y.sum(), [x])
            calls = s.backward([backward_call("loss", inputs=["x"])])
            np.testing.assert_allclose(calls[0]["x"], gx.numpy(), rtol=1e-12)

    def test_extend_refuses_unknown_and_repeated_names(self):
        with self.client.forward(model()) as s:
            with self.assertRaises(GradserveError) as e:
                s.extend(GraphBuilder().op("exp", ["nope"], out="e"))
            self.assertEqual(e.exception.code, grpc.StatusCode.INVALID_ARGUMENT)
            self.assertIn("'nope'", e.exception.message)
            with self.assertRaises(GradserveError) as e:
                s.extend(GraphBuilder().op("exp", ["y"], out="loss"))
            self.assertEqual(e.exception.code, grpc.StatusCode.INVALID_ARGUMENT)
            self.assertIn("'loss'", e.exception.message)
            # Neither left anything behind: the session goes on.
            s.extend(GraphBuilder().op("exp", ["loss"], out="e"))
            calls = s.backward([backward_call("e", inputs=["x"])])
            self.assertEqual(calls[0]["x"].shape, X.shape)
        s.release()
        with self.assertRaises(GradserveError) as e:
            s.extend(GraphBuilder().op("exp", ["y"], out="e2"))
        self.assertEqual(e.exception.code, grpc.StatusCode.NOT_FOUND)
        self.assertIn(s.session_id, e.exception.message)

    def test_released_session_is_not_found(self):
        s = self.client.forward(model())
        s.release()
        s.release()  # a second release does nothing
        with self.assertRaises(GradserveError) as e:
            s.backward([backward_call("loss", inputs=["x"])])
        self.assertEqual(e.exception.code, grpc.StatusCode.NOT_FOUND)
        self.assertIn(s.session_id, e.exception.message)


if __name__ == "__main__":
    unittest.main()
