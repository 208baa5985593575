"""A typed use of the gradserve package, checked by test_types.py (mypy, with the package's
configuration: warn_unused_ignores makes each "type: ignore[...]" line a mistake the
annotations must catch). Never run. The generated messages (GradRequest, ...) are Any to mypy,
so a wrong message type is not caught."""

from __future__ import annotations

from typing import Dict, List, Optional

import numpy as np

import gradserve
from gradserve import CallResult, Client, GradResult, GradserveError, GraphBuilder, Session
from gradserve.aio import AsyncClient
from gradserve.credentials import resolve_token
from gradserve.targets import grpc_target


def build() -> GraphBuilder:
    return (GraphBuilder()
            .leaf("x", np.array([1.0, 2.0, 3.0]), requires_grad=True)
            .leaf("t", [0, 1, 2])
            .op("mul", ["x", "x"], out="y", alpha=2.0)
            .op("sum", ["y"], out="loss", dim=[0], keepdim=False)
            .backward_call("loss", inputs=["x"], retain_graph=True)
            .return_values("loss"))


def train(target: str) -> Optional[np.ndarray]:
    token: Optional[str] = resolve_token()
    with Client(grpc_target(target), timeout=10.0, tls_ca="ca.pem", token=token) as client:
        result: GradResult = client.grad(build(), stream=None)
        call: CallResult = result.calls[0]
        loss: np.ndarray = result.values["loss"]
        timings: Dict[str, int] = result.timings
        echoed: bytes = client.ping(b"hi")
        state: str = client.health()
        with client.forward(build(), return_values=["loss"]) as session:
            s: Session = session
            again: List[CallResult] = s.backward([gradserve.backward_call("loss", inputs=["x"])])
        del loss, timings, echoed, state, again
        return call["x"]


async def train_async(target: str) -> int:
    async with AsyncClient(target, timeout=10.0) as client:
        result: GradResult = await client.grad(build())
        return result.num_nodes


def mistakes(client: Client) -> None:
    try:
        client.grad(build(), timeout="10")  # type: ignore[arg-type]
    except GradserveError as e:
        message: str = e.message
        del message
    GraphBuilder().op("neg", ["x"], out=3)  # type: ignore[arg-type]
    Client("127.0.0.1:1", timeout="10")  # type: ignore[arg-type]
    gradient: np.ndarray = client.grad(build()).calls[0]["x"]  # type: ignore[assignment]
    del gradient
