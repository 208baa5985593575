"""The asyncio client: Client's calls as coroutines, on grpc.aio.

    import asyncio
    from gradserve.aio import AsyncClient

    async def main():
        async with AsyncClient("127.0.0.1:50051", timeout=10) as client:
            result = await client.grad(builder)
            print(result.calls[0]["x"])

    asyncio.run(main())

The constructor takes Client's arguments (target lists and dns:///, the tls and token options,
timeout, channel_options) with the same meaning and the same errors; grad, info, ping, health,
register_shared_memory and unregister_shared_memory are coroutines returning what Client's
return, and raise GradserveError. Use it from one event loop; it may run many calls at once
(asyncio.gather).
"""

from __future__ import annotations

from typing import Any, Iterable, Optional, Sequence, Union

import grpc
import grpc.aio

from gradserve import _stubs, chunks
from gradserve.client import (_CHUNK_OVERHEAD, _DEFAULT_MESSAGE_LIMIT, GradInput, GradResult,
                              GradserveError, _as_request, channel_settings,
                              _shared_memory_request)
from gradserve.shared_memory import SharedMemory
from gradserve.targets import ChannelOption
from gradserve.trace import echoed_trace_id, trace_metadata
from gradserve.v1 import gradserve_pb2, gradserve_pb2_grpc


class AsyncClient:
    """A grpc.aio connection to a gradserve server, or to several; see gradserve.Client."""

    def __init__(self, target: str, *, timeout: Optional[float] = None,
                 credentials: Optional[grpc.ChannelCredentials] = None,
                 channel_options: Sequence[ChannelOption] = (), tls: bool = False,
                 tls_ca: Optional[str] = None, tls_cert: Optional[str] = None,
                 tls_key: Optional[str] = None, token: Optional[str] = None,
                 token_file: Optional[str] = None) -> None:
        target, credentials, options = channel_settings(
            target, credentials, channel_options, tls=tls, tls_ca=tls_ca, tls_cert=tls_cert,
            tls_key=tls_key, token=token, token_file=token_file)
        if credentials is None:
            self._channel = grpc.aio.insecure_channel(target, options=options)
        else:
            self._channel = grpc.aio.secure_channel(target, credentials, options=options)
        self._stub = gradserve_pb2_grpc.GradServiceStub(self._channel)
        self._stream = self._channel.stream_stream(
            "/gradserve.v1.GradService/ComputeGradientsStream")
        self._timeout = timeout
        self._limits: Optional[gradserve_pb2.Limits] = None
        self._health_pb2 = _stubs.load_health_module(_stubs.find_stubs_dir())
        self._health_check = self._channel.unary_unary(
            "/grpc.health.v1.Health/Check",
            request_serializer=self._health_pb2.HealthCheckRequest.SerializeToString,
            response_deserializer=self._health_pb2.HealthCheckResponse.FromString)

    async def close(self) -> None:
        """Closes the channel; calls in flight are cancelled."""
        await self._channel.close()

    async def __aenter__(self) -> "AsyncClient":
        return self

    async def __aexit__(self, *exc: Any) -> None:
        await self.close()

    def _deadline(self, timeout: Optional[float]) -> Optional[float]:
        return self._timeout if timeout is None else timeout

    async def _call(self, method: str, awaitable: Any) -> Any:
        try:
            return await awaitable
        except grpc.aio.AioRpcError as e:
            raise GradserveError(e.code(), e.details() or "", method) from None

    async def wait_ready(self, timeout: float) -> None:
        """Waits until the channel connects; GradserveError(UNAVAILABLE) after timeout."""
        import asyncio
        try:
            await asyncio.wait_for(self._channel.channel_ready(), timeout)
        except asyncio.TimeoutError:
            raise GradserveError(grpc.StatusCode.UNAVAILABLE,
                                 f"not connected after {timeout} s", "wait_ready") from None

    async def grad(self, request: GradInput,
                   calls: Optional[Iterable[gradserve_pb2.BackwardCall]] = None, *,
                   return_values: Sequence[str] = (), request_id: Optional[str] = None,
                   timeout: Optional[float] = None, stream: Optional[bool] = None,
                   trace_id: Optional[str] = None) -> GradResult:
        """As Client.grad: a GraphBuilder, GradRequest or Graph in, a GradResult out (its
        trace_id the one the server echoed)."""
        metadata = trace_metadata(trace_id)
        message = _as_request(request, calls, return_values, request_id)
        payload = message.SerializeToString()
        if stream is None:
            stream = (len(payload) > _DEFAULT_MESSAGE_LIMIT and
                      len(payload) > (await self._server_limits(timeout)).max_message_bytes)
        if not stream:
            unary = self._stub.ComputeGradients(message, timeout=self._deadline(timeout),
                                                metadata=metadata)
            response = await self._call("ComputeGradients", unary)
            return GradResult(response, echoed_trace_id(await unary.trailing_metadata()))
        limits = await self._server_limits(timeout)
        size = max(1, min(limits.chunk_bytes or _DEFAULT_MESSAGE_LIMIT,
                          (limits.max_message_bytes or _DEFAULT_MESSAGE_LIMIT) - _CHUNK_OVERHEAD))

        call = self._stream(iter(chunks.chunk_messages(payload, size)),
                            timeout=self._deadline(timeout), metadata=metadata)

        async def run() -> bytes:
            try:
                return chunks.join_data([m async for m in call])
            except ValueError as e:
                raise GradserveError(grpc.StatusCode.INTERNAL,
                                     f"the server's streamed response is malformed: {e}",
                                     "ComputeGradientsStream") from None

        data = await self._call("ComputeGradientsStream", run())
        return GradResult(gradserve_pb2.GradResponse.FromString(data),
                          echoed_trace_id(await call.trailing_metadata()))

    async def _server_limits(self, timeout: Optional[float]) -> gradserve_pb2.Limits:
        if self._limits is None:
            try:
                self._limits = (await self.info(timeout)).limits
            except GradserveError as e:
                if e.code != grpc.StatusCode.PERMISSION_DENIED:
                    raise
                self._limits = gradserve_pb2.Limits()
        return self._limits

    async def info(self, timeout: Optional[float] = None) -> gradserve_pb2.ServerInfo:
        """The server's ServerInfo message."""
        return await self._call("GetServerInfo", self._stub.GetServerInfo(
            gradserve_pb2.ServerInfoRequest(), timeout=self._deadline(timeout)))

    async def ping(self, payload: bytes = b"", timeout: Optional[float] = None) -> bytes:
        """Echoes payload through the server."""
        response = await self._call("Ping", self._stub.Ping(
            gradserve_pb2.PingRequest(payload=payload), timeout=self._deadline(timeout)))
        return response.payload

    async def health(self, service: str = "", timeout: Optional[float] = None) -> str:
        """The grpc.health.v1 status name of service ("" for the whole server)."""
        response = await self._call("Health/Check", self._health_check(
            self._health_pb2.HealthCheckRequest(service=service), timeout=self._deadline(timeout)))
        return self._health_pb2.HealthCheckResponse.ServingStatus.Name(response.status)

    async def register_shared_memory(self, name: str, shm_or_key: Union[SharedMemory, str],
                                     byte_size: Optional[int] = None, writable: bool = False,
                                     idle_ttl: Optional[float] = None,
                                     timeout: Optional[float] = None) -> float:
        """As Client.register_shared_memory: the idle TTL granted, in seconds. Over this
        client's one channel: give it a target of one address, as the region lives on the
        server that registered it."""
        request = _shared_memory_request(name, shm_or_key, byte_size, writable, idle_ttl)
        response = await self._call("RegisterSharedMemory", self._stub.RegisterSharedMemory(
            request, timeout=self._deadline(timeout)))
        return float(response.idle_ttl_ms) / 1000.0

    async def unregister_shared_memory(self, name: str, timeout: Optional[float] = None
                                       ) -> None:
        """As Client.unregister_shared_memory (NOT_FOUND for an unknown name)."""
        await self._call("UnregisterSharedMemory", self._stub.UnregisterSharedMemory(
            gradserve_pb2.UnregisterSharedMemoryRequest(name=name),
            timeout=self._deadline(timeout)))
