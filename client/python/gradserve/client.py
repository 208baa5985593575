"""The gradserve client: sends GradRequests and returns numpy gradients.

    with Client("127.0.0.1:50051") as c:
        result = c.grad(builder)            # a GraphBuilder, a GradRequest, or a Graph + calls
        result.calls[0]["x"]                # the gradient for x, a numpy array (None: unused)

Shared memory (clients on the server's host, gradserve/shared_memory.py): register_shared_memory
makes a SharedMemory object a region of the server's; leaves and seeds may be SharedMemory.put
tensors, and backward_call(gradient_destinations=...) has gradients written into the region:
they come back in CallResult.in_shared_memory, read with SharedMemory.get.

Errors: every failed RPC raises GradserveError carrying the gRPC status code (grpc.StatusCode)
and the server's message, which names the node, op and value involved. Client-side misuse
(a bad dtype, a non-request argument) raises TypeError or ValueError before anything is sent.

Threading: a Client may be shared by threads; each call is independent (the gRPC channel is
thread-safe). The cached server limits are written at most once per client and race benignly.
"""

from __future__ import annotations

import os
from typing import (Any, Callable, Dict, Iterable, List, Optional, Sequence, Tuple, TypeVar,
                    Union)

import grpc
import numpy as np

from gradserve import _stubs, chunks
from gradserve.credentials import channel_credentials, resolve_token
from gradserve.graph import GraphBuilder
from gradserve.shared_memory import SharedMemory, object_path
from gradserve.targets import CHANNEL_OPTIONS, SESSION_CHANNEL_OPTIONS, ChannelOption, grpc_target
from gradserve.tensors import from_tensor
from gradserve.trace import echoed_trace_id, trace_metadata
from gradserve.v1 import gradserve_pb2, gradserve_pb2_grpc, graph_pb2, tensor_pb2

# Every gRPC implementation accepts messages this large by default; larger requests may need
# the streamed RPC, depending on the server's limit (GetServerInfo).
_DEFAULT_MESSAGE_LIMIT = 4 << 20
# Room left in a chunk for the Chunk message's own fields.
_CHUNK_OVERHEAD = 1 << 10

# What grad() and forward() take as the request.
GradInput = Union[GraphBuilder, gradserve_pb2.GradRequest, graph_pb2.Graph]

_T = TypeVar("_T")


class GradserveError(Exception):
    """A failed call: ``code`` (grpc.StatusCode), ``message`` (the server's) and ``method``."""

    def __init__(self, code: grpc.StatusCode, message: str, method: str) -> None:
        super().__init__(f"{method}: {code.name}: {message}")
        self.code = code
        self.message = message
        self.method = method


class CallResult:
    """The gradients of one backward call, by input name, in the order the server sent them.

    gradients: name -> numpy array, or None where the input was not connected and
      materialize_grads was off, or where the gradient was written to shared memory.
    connected: name -> whether the roots reach the input. in_shared_memory: name -> the Tensor
      message (dtype, shape, and the SharedMemoryRange it was written to) of each gradient
      the server wrote to its gradient_destinations range; read it with
      SharedMemory.get(result.in_shared_memory[name]).
    """

    def __init__(self, message: gradserve_pb2.CallResult) -> None:
        self.gradients: Dict[str, Optional[np.ndarray]] = {}
        self.connected: Dict[str, bool] = {}
        self.in_shared_memory: Dict[str, tensor_pb2.Tensor] = {}
        for g in message.gradients:
            value: Optional[np.ndarray] = None
            if g.HasField("value"):
                if g.value.WhichOneof("contents") == "shared_memory":
                    self.in_shared_memory[g.name] = g.value
                else:
                    value = from_tensor(g.value)
            self.gradients[g.name] = value
            self.connected[g.name] = g.connected

    def __getitem__(self, name: str) -> Optional[np.ndarray]:
        return self.gradients[name]

    def __repr__(self) -> str:
        if not self.in_shared_memory:
            return f"CallResult({self.gradients!r})"
        ranges = {name: t.shared_memory.region for name, t in self.in_shared_memory.items()}
        return f"CallResult({self.gradients!r}, in_shared_memory={ranges!r})"


class GradResult:
    """A GradResponse as numpy: calls (CallResult per BackwardCall), values (name -> array),
    num_nodes, timings (stage -> microseconds), request_id, and the raw message as response;
    trace_id: the trace id the server echoed (gradserve/trace.py), or None."""

    def __init__(self, response: gradserve_pb2.GradResponse,
                 trace_id: Optional[str] = None) -> None:
        self.response = response
        self.trace_id = trace_id
        self.request_id: str = response.request_id
        self.calls: List[CallResult] = [CallResult(c) for c in response.calls]
        self.values: Dict[str, np.ndarray] = {v.name: from_tensor(v.value)
                                              for v in response.values}
        self.num_nodes: int = response.num_nodes
        t = response.timings
        self.timings: Dict[str, int] = {"queue_us": t.queue_us, "forward_us": t.forward_us,
                        "backward_us": t.backward_us, "total_us": t.total_us}


def channel_settings(target: str, credentials: Optional[grpc.ChannelCredentials],
                     channel_options: Sequence[ChannelOption], *, tls: bool,
                     tls_ca: Optional[str], tls_cert: Optional[str], tls_key: Optional[str],
                     token: Optional[str], token_file: Optional[str]
                     ) -> "tuple[str, Optional[grpc.ChannelCredentials], List[ChannelOption]]":
    """The gRPC target, credentials (None: plaintext) and channel options of a client, blocking
    or asyncio: the TLS options or the given credentials, with the bearer token; no message
    size limit of the client's own; CHANNEL_OPTIONS, unless channel_options sets the same key."""
    if credentials is None:
        credentials = channel_credentials(tls=tls, tls_ca=tls_ca, tls_cert=tls_cert,
                                          tls_key=tls_key, token=token, token_file=token_file)
    else:
        if tls or tls_ca or tls_cert or tls_key:
            raise ValueError("give credentials or the tls options, not both")
        bearer = resolve_token(token, token_file)
        if bearer is not None:
            credentials = grpc.composite_channel_credentials(
                credentials, grpc.access_token_call_credentials(bearer))
    own = {key for key, _ in channel_options}
    options = ([("grpc.max_receive_message_length", -1),
                ("grpc.max_send_message_length", -1)] +
               [o for o in CHANNEL_OPTIONS if o[0] not in own] + list(channel_options))
    return grpc_target(target), credentials, options


def _as_request(request: GradInput, calls: Optional[Iterable[gradserve_pb2.BackwardCall]],
                return_values: Iterable[str], request_id: Optional[str]
                ) -> gradserve_pb2.GradRequest:
    if isinstance(request, GraphBuilder):
        message = request.request()
    elif isinstance(request, gradserve_pb2.GradRequest):
        message = gradserve_pb2.GradRequest()
        message.CopyFrom(request)
    elif isinstance(request, graph_pb2.Graph):
        message = gradserve_pb2.GradRequest(graph=request)
    else:
        raise TypeError("grad() takes a GraphBuilder, a GradRequest or a Graph, not "
                        f"{type(request).__name__}")
    message.calls.extend(calls or ())
    message.return_values.extend(return_values)
    if request_id is not None:
        message.request_id = request_id
    return message


def _graph_names_shared_memory(graph: Any) -> bool:
    return (any(leaf.value.HasField("shared_memory") for leaf in graph.leaves) or
            any(op.HasField("body") and _graph_names_shared_memory(op.body)
                for op in graph.ops))


def _names_shared_memory(request: gradserve_pb2.GradRequest) -> bool:
    """True if request names a shared-memory range (a leaf, a seed, a gradient destination):
    it must reach the server its regions were registered with, over the sessions' channel."""
    return (_graph_names_shared_memory(request.graph) or
            any(call.gradient_destinations or
                any(seed.HasField("shared_memory") for seed in call.seeds.values())
                for call in request.calls))


def _shared_memory_request(name: str, shm_or_key: Union[SharedMemory, str],
                           byte_size: Optional[int], writable: bool, idle_ttl: Optional[float]
                           ) -> gradserve_pb2.RegisterSharedMemoryRequest:
    """The RegisterSharedMemoryRequest of Client.register_shared_memory's arguments; raises
    ValueError as it does."""
    if isinstance(shm_or_key, SharedMemory):
        key = shm_or_key.key
        size = shm_or_key.byte_size if byte_size is None else byte_size
    else:
        key = shm_or_key
        if byte_size is None:
            try:
                size = os.stat(object_path(key)).st_size
            except OSError as e:
                raise ValueError(f"shared memory {key}: {e.strerror}; create it first or "
                                 "give byte_size") from None
        else:
            size = byte_size
    if idle_ttl is not None and not idle_ttl > 0:
        raise ValueError(f"idle_ttl must be positive seconds (or None), got {idle_ttl}")
    ttl_ms = 0 if idle_ttl is None else max(1, round(idle_ttl * 1000))
    return gradserve_pb2.RegisterSharedMemoryRequest(
        name=name, key=key, byte_size=size, writable=writable, idle_ttl_ms=ttl_ms)


class Client:
    """A connection to a gradserve server, or to several.

    target: "host:port", a comma-separated list of IP:PORT or [IPV6]:PORT, or any gRPC target
    string such as "dns:///NAME:PORT" (a name that resolves to every replica). Calls are spread
    over the addresses (round_robin) and one that ends UNAVAILABLE is retried, on another
    server, up to 4 attempts (gradserve/targets.py); a malformed list raises ValueError.
    timeout: default deadline of each call in seconds (None: no deadline). channel_options:
    extra gRPC channel options (("grpc.service_config", JSON) replaces ours).

    Security (docs/security.md), as the `gradserve` tool's flags of the same names: tls_ca
    (PEM file of the CAs the server's certificate must chain to; implies TLS), tls_cert and
    tls_key (this client's certificate chain and key, for mutual TLS), tls (TLS with the
    system's roots), token or token_file (the bearer token, sent as "authorization: Bearer
    TOKEN"; by default the environment variable GRADSERVE_TOKEN if set; token="" sends none).
    A token needs TLS. Or credentials: your own grpc.ChannelCredentials instead of the tls
    options (the token is then added to them). Misuse raises ValueError before connecting
    (gradserve/credentials.py); a call the server refuses raises GradserveError with
    UNAUTHENTICATED (no or unknown token) or PERMISSION_DENIED (method not allowed).
    """

    def __init__(self, target: str, *, timeout: Optional[float] = None,
                 credentials: Optional[grpc.ChannelCredentials] = None,
                 channel_options: Sequence[ChannelOption] = (), tls: bool = False,
                 tls_ca: Optional[str] = None, tls_cert: Optional[str] = None,
                 tls_key: Optional[str] = None, token: Optional[str] = None,
                 token_file: Optional[str] = None) -> None:
        target, credentials, options = channel_settings(
            target, credentials, channel_options, tls=tls, tls_ca=tls_ca, tls_cert=tls_cert,
            tls_key=tls_key, token=token, token_file=token_file)
        session_options = ([("grpc.max_receive_message_length", -1),
                            ("grpc.max_send_message_length", -1)] + SESSION_CHANNEL_OPTIONS +
                           [o for o in channel_options if o[0] != "grpc.service_config"])
        self._channel = self._open(target, credentials, options)
        # Sessions' calls, made on first use (docs/sessions.md).
        self._session_channel_args = (target, credentials, session_options)
        self._session_stub: Any = None
        self._session_stream: Any = None
        self._stub = gradserve_pb2_grpc.GradServiceStub(self._channel)
        # ComputeGradientsStream on bytes: the Chunks are written and read by gradserve/chunks.py.
        self._stream = self._channel.stream_stream(
            "/gradserve.v1.GradService/ComputeGradientsStream")
        self._timeout = timeout
        self._limits: Optional[gradserve_pb2.Limits] = None
        health = _stubs.load_health_module(_stubs.find_stubs_dir())
        self._health_pb2 = health
        self._health_check = self._channel.unary_unary(
            "/grpc.health.v1.Health/Check",
            request_serializer=health.HealthCheckRequest.SerializeToString,
            response_deserializer=health.HealthCheckResponse.FromString)

    @staticmethod
    def _open(target: str, credentials: Optional[grpc.ChannelCredentials],
              options: Sequence[ChannelOption]) -> grpc.Channel:
        if credentials is None:
            return grpc.insecure_channel(target, options=options)
        return grpc.secure_channel(target, credentials, options=options)

    def close(self) -> None:
        """Closes the channels; calls in flight are cancelled."""
        self._channel.close()
        if self._session_stub is not None:
            self._session_channel.close()

    def __enter__(self) -> Client:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def _call(self, method: str, fn: Callable[[Optional[float]], _T],
              timeout: Optional[float]) -> _T:
        try:
            return fn(self._timeout if timeout is None else timeout)
        except grpc.RpcError as e:
            raise GradserveError(e.code(), e.details() or "", method) from None

    def wait_ready(self, timeout: Optional[float]) -> None:
        """Blocks until the channel connects; GradserveError(UNAVAILABLE) after timeout."""
        try:
            grpc.channel_ready_future(self._channel).result(timeout=timeout)
        except grpc.FutureTimeoutError:
            raise GradserveError(grpc.StatusCode.UNAVAILABLE,
                                 f"not connected after {timeout} s", "wait_ready") from None

    def grad(self, request: GradInput,
             calls: Optional[Iterable[gradserve_pb2.BackwardCall]] = None, *,
             return_values: Iterable[str] = (), request_id: Optional[str] = None,
             timeout: Optional[float] = None, stream: Optional[bool] = None,
             trace_id: Optional[str] = None) -> GradResult:
        """Records the graph on the server, runs the backward calls and returns a GradResult.

        request: a GraphBuilder, a GradRequest or a Graph; calls (BackwardCall messages) and
        return_values are appended to it. stream: True for ComputeGradientsStream, False for the
        unary call, None to pick the stream only when the request is over the server's message
        limit. trace_id: sent as `traceparent` or `x-request-id` (gradserve/trace.py); the
        server logs it and echoes it, as the result's trace_id. Raises GradserveError (and
        ValueError for a trace_id the server would ignore).
        """
        metadata = trace_metadata(trace_id)
        message = _as_request(request, calls, return_values, request_id)
        payload = message.SerializeToString()
        if stream is None:
            stream = (len(payload) > _DEFAULT_MESSAGE_LIMIT and
                      len(payload) > self._server_limits(timeout).max_message_bytes)
        # A request that names shared memory goes where its regions are: the server that
        # answered register_shared_memory over the sessions' channel (docs/shared_memory.md).
        via_sessions = _names_shared_memory(message)
        if not stream:
            stub = self._sessions() if via_sessions else self._stub
            response, call = self._call(
                "ComputeGradients",
                lambda t: stub.ComputeGradients.with_call(message, timeout=t, metadata=metadata),
                timeout)
            return GradResult(response, echoed_trace_id(call.trailing_metadata()))
        response, trailing = self._grad_streamed(payload, timeout, metadata, via_sessions)
        return GradResult(response, echoed_trace_id(trailing))

    def forward(self, request: GradInput, *, return_values: Iterable[str] = (),
                request_id: Optional[str] = None, timeout: Optional[float] = None,
                trace_id: Optional[str] = None) -> Session:
        """Runs the graph forward on the server and holds it there: returns a Session.

        request: as grad()'s (its backward calls are ignored); return_values: forward values to
        return (Session.values). The session's calls all go over one connection, to the server
        that answered this (docs/sessions.md). Use the Session as a context manager, which
        releases it. trace_id: as grad()'s; the echo is the Session's trace_id. Raises
        GradserveError.
        """
        metadata = trace_metadata(trace_id)
        message = _as_request(request, None, return_values, request_id)
        forward = gradserve_pb2.ForwardRequest(request_id=message.request_id,
                                               graph=message.graph,
                                               return_values=message.return_values)
        stub = self._sessions()
        response, call = self._call(
            "Forward", lambda t: stub.Forward.with_call(forward, timeout=t, metadata=metadata),
            timeout)
        return Session(self, stub, response, echoed_trace_id(call.trailing_metadata()))

    def _sessions(self) -> Any:
        if self._session_stub is None:  # races benignly: the loser's channel is dropped
            self._session_channel = self._open(*self._session_channel_args)
            self._session_stream = self._session_channel.stream_stream(
                "/gradserve.v1.GradService/ComputeGradientsStream")
            self._session_stub = gradserve_pb2_grpc.GradServiceStub(self._session_channel)
        return self._session_stub

    def _server_limits(self, timeout: Optional[float]) -> gradserve_pb2.Limits:
        if self._limits is None:
            try:
                self._limits = self.info(timeout).limits
            except GradserveError as e:
                # A token may be allowed grad but not info (docs/security.md): then the limits
                # are unknown (zeros), and requests over the default message size are streamed
                # in chunks of that size.
                if e.code != grpc.StatusCode.PERMISSION_DENIED:
                    raise
                self._limits = gradserve_pb2.Limits()
        return self._limits

    def _grad_streamed(self, payload: bytes, timeout: Optional[float], metadata: Any = (),
                       via_sessions: bool = False) -> Tuple[gradserve_pb2.GradResponse, Any]:
        """The response of ComputeGradientsStream and the call's trailing metadata, over the
        sessions' channel if via_sessions."""
        limits = self._server_limits(timeout)
        if via_sessions:
            self._sessions()
        open_stream = self._session_stream if via_sessions else self._stream
        size = max(1, min(limits.chunk_bytes or _DEFAULT_MESSAGE_LIMIT,
                          (limits.max_message_bytes or _DEFAULT_MESSAGE_LIMIT) - _CHUNK_OVERHEAD))

        def run(t: Optional[float]) -> Tuple[bytes, Any]:  # the Chunks as bytes (chunks.py)
            call = open_stream(chunks.chunk_messages(payload, size), timeout=t,
                               metadata=metadata)
            try:
                data = chunks.join_data(call)
            except ValueError as e:
                raise GradserveError(grpc.StatusCode.INTERNAL,
                                     f"the server's streamed response is malformed: {e}",
                                     "ComputeGradientsStream") from None
            return data, call.trailing_metadata()

        response, trailing = self._call("ComputeGradientsStream", run, timeout)
        return gradserve_pb2.GradResponse.FromString(response), trailing

    def info(self, timeout: Optional[float] = None) -> gradserve_pb2.ServerInfo:
        """The server's ServerInfo message: version, limits, devices, ops and counters."""
        return self._call("GetServerInfo", lambda t: self._stub.GetServerInfo(
            gradserve_pb2.ServerInfoRequest(), timeout=t), timeout)

    def ping(self, payload: bytes = b"", timeout: Optional[float] = None) -> bytes:
        """Echoes payload through the server; returns the echoed bytes."""
        response = self._call("Ping", lambda t: self._stub.Ping(
            gradserve_pb2.PingRequest(payload=payload), timeout=t), timeout)
        return response.payload

    def health(self, service: str = "", timeout: Optional[float] = None) -> str:
        """The grpc.health.v1 status name of service ("" for the whole server): "SERVING",
        "NOT_SERVING", ... Raises GradserveError (e.g. NOT_FOUND for an unknown service)."""
        response = self._call("Health/Check", lambda t: self._health_check(
            self._health_pb2.HealthCheckRequest(service=service), timeout=t), timeout)
        return self._health_pb2.HealthCheckResponse.ServingStatus.Name(response.status)

    def register_shared_memory(self, name: str, shm_or_key: Union[SharedMemory, str],
                               byte_size: Optional[int] = None, writable: bool = False,
                               idle_ttl: Optional[float] = None,
                               timeout: Optional[float] = None) -> float:
        """Has the server map a POSIX shared-memory object on its host as the region ``name``,
        which this client's requests then name in SharedMemoryRange.region
        (gradserve/shared_memory.py); returns the idle TTL it got, in seconds.

        shm_or_key: a SharedMemory, or an object's shm_open key ("/name", which must start
        with the server's --shared_memory_prefix). byte_size: how many bytes from its start
        the server maps (default: the whole object). writable: whether the server may write
        gradients into it (gradient_destinations); otherwise it is mapped read-only.
        idle_ttl: seconds without a call naming the region after which the server ends it
        (None: the server's --shared_memory_idle_ttl, also the most it grants).
        Sent over the sessions' connection, as are the grad() requests that name a region:
        a region lives on the one server that registered it, and they reach it even when the
        target lists several servers.
        Raises ValueError for a key of no object or an idle_ttl <= 0; GradserveError
        FAILED_PRECONDITION (shared memory off on the server), INVALID_ARGUMENT (key outside
        the prefix, object smaller than byte_size), ALREADY_EXISTS (name taken),
        PERMISSION_DENIED (another tenant's object), RESOURCE_EXHAUSTED (too many regions or
        bytes).
        """
        request = _shared_memory_request(name, shm_or_key, byte_size, writable, idle_ttl)
        stub = self._sessions()
        response = self._call("RegisterSharedMemory",
                              lambda t: stub.RegisterSharedMemory(request, timeout=t), timeout)
        return float(response.idle_ttl_ms) / 1000.0

    def unregister_shared_memory(self, name: str, timeout: Optional[float] = None) -> None:
        """Ends the region ``name``: the server unmaps it once the calls using it are done (the
        object itself stays until SharedMemory.close). Raises GradserveError NOT_FOUND for a
        name this client's tenant has not registered (or already unregistered)."""
        request = gradserve_pb2.UnregisterSharedMemoryRequest(name=name)
        stub = self._sessions()
        self._call("UnregisterSharedMemory",
                   lambda t: stub.UnregisterSharedMemory(request, timeout=t), timeout)


class Session:
    """A graph held on the server between its forward pass and its backward calls.

    session_id, values (name -> array, the forward values asked for), num_nodes. backward()
    runs backward calls over the held graph, as often as retain_graph allows (a call without
    it frees the saved tensors, as in PyTorch: a later one raises FAILED_PRECONDITION).
    release() ends it; as a context manager it is released on exit. A session ended by the
    server (expired after --session_idle_ttl, or the server drained) raises GradserveError
    NOT_FOUND or UNAVAILABLE: run the forward pass again (docs/sessions.md).
    """

    def __init__(self, client: Client, stub: Any, response: gradserve_pb2.ForwardResponse,
                 trace_id: Optional[str] = None) -> None:
        self._client = client
        self._stub = stub
        self.response = response
        self.trace_id = trace_id  # the forward call's, as the server echoed it
        self.session_id: str = response.session_id
        self.values: Dict[str, np.ndarray] = {v.name: from_tensor(v.value)
                                              for v in response.values}
        self.num_nodes: int = response.num_nodes
        self._released = False

    def backward(self, calls: Union[GraphBuilder, Iterable[gradserve_pb2.BackwardCall]], *,
                 request_id: str = "", timeout: Optional[float] = None) -> List[CallResult]:
        """Runs calls (BackwardCall messages: gradserve.backward_call(...), or a GraphBuilder's
        backward calls) in order; returns a CallResult per call. Seeds and gradient
        destinations may be in shared memory registered through this session's client."""
        messages = list(calls.request().calls if isinstance(calls, GraphBuilder) else calls)
        request = gradserve_pb2.BackwardRequest(request_id=request_id,
                                                session_id=self.session_id, calls=messages)
        response = self._client._call(
            "Backward", lambda t: self._stub.Backward(request, timeout=t), timeout)
        return [CallResult(c) for c in response.calls]

    def extend(self, graph: Union[GraphBuilder, graph_pb2.Graph], *,
               return_values: Iterable[str] = (), request_id: str = "",
               timeout: Optional[float] = None) -> Dict[str, np.ndarray]:
        """Runs more ops over the session's values and adds them to its held graph, as if they
        had ended the forward graph (docs/sessions.md, "Extending a session"): graph's ops may
        read any value of the session by name and define new ones, and later backward calls
        may start from those. graph: a GraphBuilder (its backward calls are ignored) or a
        Graph. return_values: values to return, new or old; they are also added to
        self.values. Returns them by name. Raises GradserveError (INVALID_ARGUMENT naming an
        unknown or repeated name)."""
        message = graph.graph() if isinstance(graph, GraphBuilder) else graph
        request = gradserve_pb2.ExtendRequest(request_id=request_id, session_id=self.session_id,
                                              graph=message, return_values=list(return_values))
        response = self._client._call(
            "Extend", lambda t: self._stub.Extend(request, timeout=t), timeout)
        values = {v.name: from_tensor(v.value) for v in response.values}
        self.values.update(values)
        self.num_nodes += response.num_nodes
        return values

    def release(self, timeout: Optional[float] = None) -> None:
        """Ends the session on the server, freeing its memory; a second release does nothing."""
        if self._released:
            return
        self._released = True
        request = gradserve_pb2.ReleaseRequest(session_id=self.session_id)
        self._client._call("Release", lambda t: self._stub.Release(request, timeout=t), timeout)

    def __enter__(self) -> Session:
        return self

    def __exit__(self, *exc: object) -> None:
        try:
            self.release()
        except GradserveError as e:
            # Already ended by the server (expired, drained): nothing is left to free.
            if e.code not in (grpc.StatusCode.NOT_FOUND, grpc.StatusCode.UNAVAILABLE):
                raise
