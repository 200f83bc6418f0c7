"""What every HTTP door reads from a request: its body (bounded), the deadline it asks for,
and whether its client is still there (together: its :class:`~batching.plane.Caller`)."""

from __future__ import annotations

from collections.abc import Awaitable, Callable

from starlette.requests import Request

from batching.errors import InvalidRequest, PayloadTooLarge
from batching.plane import Caller, DataPlane
from batching.plane.calls import loop_time

from .connections import ARRIVED_KEY
from .middleware import request_id_of

__all__ = [
    "TIMEOUT_HEADER",
    "BodyTooLarge",
    "caller_of",
    "disconnect_of",
    "read_body",
    "read_unattributed_body",
    "timeout_of",
]

TIMEOUT_HEADER = "x-request-timeout-ms"


class BodyTooLarge(PayloadTooLarge):
    """Raised when a request body is over the byte limit: a 413 the edge decides, so the edge
    counts it (``recorded``, or :func:`read_unattributed_body`), not the batcher."""


async def read_body(request: Request, limit: int) -> bytes:
    """The whole body, refusing more than ``limit`` bytes before reading them all.

    :raises BodyTooLarge: declared or actual size over ``limit``.
    """
    declared = request.headers.get("content-length")
    if declared is not None and declared.isdigit() and int(declared) > limit:
        raise BodyTooLarge(f"the request body is over the {limit}-byte limit")
    chunks: list[bytes] = []
    size = 0
    async for chunk in request.stream():
        size += len(chunk)
        if size > limit:
            raise BodyTooLarge(f"the request body is over the {limit}-byte limit")
        chunks.append(chunk)
    return b"".join(chunks)


async def read_unattributed_body(plane: DataPlane, request: Request, limit: int) -> bytes:
    """:func:`read_body` for a door whose body names the model (``/v1/...``): a body over the
    limit is answered before any model is known, so it is counted here, under model ""
    (``batching_requests_total{code="413"}`` and ``batching_rejected_total{reason="too_large"}``).
    """
    started = plane.now()
    try:
        return await read_body(request, limit)
    except BodyTooLarge:
        plane.record(None, 413, started)
        plane.refused("", "too_large")
        raise


def timeout_of(request: Request) -> float | None:
    """Seconds the client's ``X-Request-Timeout-Ms`` asks for, or None.

    :raises InvalidRequest: when it is not a positive number.
    """
    asked = request.headers.get(TIMEOUT_HEADER)
    if asked is None:
        return None
    try:
        asked_ms = float(asked)
    except ValueError:
        asked_ms = -1.0
    if not asked_ms > 0 or asked_ms != asked_ms:
        raise InvalidRequest(f"{TIMEOUT_HEADER} must be a positive number of ms")
    return asked_ms / 1000


def disconnect_of(request: Request) -> Callable[[], Awaitable[None]]:
    """A coroutine function that returns once the client has hung up."""

    async def disconnected() -> None:
        while True:
            message = await request.receive()
            if message["type"] == "http.disconnect":
                return

    return disconnected


def caller_of(request: Request) -> Caller:
    """Who asks: the request's id, the timeout its header asks for, and its disconnect; its
    deadline counts from when its connection had its head (an early resend held before it
    starts keeps that time), or from now where no connection says.

    :raises InvalidRequest: a timeout header that is not a positive number.
    """
    arrived = request.scope.get(ARRIVED_KEY)
    return Caller(
        request_id_of(request.scope),
        timeout_of(request),
        disconnect_of(request),
        arrived if isinstance(arrived, float) else loop_time(),
    )
