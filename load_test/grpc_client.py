"""The ``grpc`` API's sender: KServe v2 ``ModelInfer`` over gRPC, with ``grpc.aio`` and the
stub generated in ``tritonclient.grpc``.

``grpcio`` and ``tritonclient[grpc]`` are imported when a gRPC run starts, never before, so
the rest of the tool works without them. The ``ModelInferRequest`` messages are built once,
from the payloads' ``raw_input_contents``, as HTTP bodies are; per request the sender only
picks one, calls, and reads the first output's shape.

Outcomes are recorded under the HTTP status the server's HTTP door would have answered:
OK 200, INVALID_ARGUMENT 400, NOT_FOUND 404, UNAVAILABLE 503, DEADLINE_EXCEEDED 504, anything
else 500. Two gRPC outcomes are the transport's, not the server's, and are counted as the
HTTP client counts them: DEADLINE_EXCEEDED at the tool's own client timeout is a client
timeout, and UNAVAILABLE raised by the gRPC library because no connection could be made or
kept (no server answer at all) is a connection error.
"""

from __future__ import annotations

import asyncio
import math
import time
from typing import Any

from load_test.http1 import Response
from load_test.payloads import INPUT_NAME, PayloadSet

__all__ = ["MAX_CHANNELS", "STATUS_OF_CODE", "GrpcSender", "infer_requests"]

#: At most this many channels (each its own HTTP/2 connection) per run; one multiplexes
#: many concurrent calls, so more only spread the load over connections.
MAX_CHANNELS = 4
#: Concurrent calls per channel before another channel is opened (up to MAX_CHANNELS).
CALLS_PER_CHANNEL = 64

#: gRPC status code names and the HTTP status each is recorded as (others: 500).
STATUS_OF_CODE = {
    "OK": 200,
    "INVALID_ARGUMENT": 400,
    "NOT_FOUND": 404,
    "UNAVAILABLE": 503,
    "DEADLINE_EXCEEDED": 504,
}

# What grpc core says when the transport failed, as opposed to a server's UNAVAILABLE answer.
_TRANSPORT_FAILURES = (
    "failed to connect",
    "connection refused",
    "connection reset",
    "socket closed",
    "broken pipe",
    "goaway",
    "endpoint closing",
)


def infer_requests(payloads: PayloadSet) -> list[Any]:
    """One ``ModelInferRequest`` per payload: a BYTES ``[n, 1]`` input whose data is the
    payload's body in ``raw_input_contents``."""
    from tritonclient.grpc import service_pb2

    requests = []
    for payload in payloads.payloads:
        request = service_pb2.ModelInferRequest(model_name=payloads.model_name)
        request.inputs.add(name=INPUT_NAME, datatype="BYTES", shape=[payload.items, 1])
        request.raw_input_contents.append(payload.body)
        requests.append(request)
    return requests


class GrpcSender:
    """Sends payload ``index`` as a ``ModelInfer`` call and reports ``(sent, Response)``.

    ``limit`` calls at most are in flight (closed loop: the clients; open loop: the
    ``max_connections`` bound, beyond which a call waits and the wait counts in its latency,
    as it does for the HTTP pool). The response's ``outputs`` is the first output's batch
    dimension; its body is empty.
    """

    def __init__(self, target: str, payloads: PayloadSet, limit: int, bounded: bool) -> None:
        import grpc
        from tritonclient.grpc import service_pb2_grpc

        self._requests = infer_requests(payloads)
        self._error = grpc.aio.AioRpcError
        self._deadline_code = grpc.StatusCode.DEADLINE_EXCEEDED
        self._unavailable = grpc.StatusCode.UNAVAILABLE
        self._status = {
            getattr(grpc.StatusCode, name): status for name, status in STATUS_OF_CODE.items()
        }
        count = min(MAX_CHANNELS, max(1, math.ceil(limit / CALLS_PER_CHANNEL)))
        options = [
            # Separate connections: by default channels to one target share a subchannel.
            ("grpc.use_local_subchannel_pool", 1),
            ("grpc.max_receive_message_length", -1),
            ("grpc.max_send_message_length", -1),
        ]
        self._channels = [grpc.aio.insecure_channel(target, options=options) for _ in range(count)]
        self._calls = [
            service_pb2_grpc.GRPCInferenceServiceStub(channel).ModelInfer
            for channel in self._channels
        ]
        self._slots = asyncio.Semaphore(limit) if bounded else None
        self.opened = count

    async def send(self, index: int, deadline: float) -> tuple[float, Response]:
        request = self._requests[index % len(self._requests)]
        call = self._calls[index % len(self._calls)]
        slots = self._slots
        if slots is not None:
            await slots.acquire()
        try:
            sent = time.monotonic()
            timeout = deadline - sent
            if timeout <= 0:
                raise TimeoutError("client timeout")
            try:
                answer = await call(request, timeout=timeout)
            except self._error as exc:
                return sent, self._failed(exc, deadline)
            done = time.monotonic()
            outputs = answer.outputs
            shape = outputs[0].shape if outputs else None
            return sent, Response(200, b"", True, done, None, shape[0] if shape else None)
        finally:
            if slots is not None:
                slots.release()

    def _failed(self, exc: Any, deadline: float) -> Response:
        done = time.monotonic()
        code = exc.code()
        if code == self._deadline_code and done >= deadline - 0.002:
            raise TimeoutError("client timeout") from None
        if code == self._unavailable:
            details = (exc.details() or "").lower()
            if any(marker in details for marker in _TRANSPORT_FAILURES):
                raise ConnectionError(f"gRPC UNAVAILABLE: {exc.details()}") from None
        return Response(self._status.get(code, 500), b"", True, done)

    async def aclose(self) -> None:
        await asyncio.gather(*(channel.close() for channel in self._channels))
