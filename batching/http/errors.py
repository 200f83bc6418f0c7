"""The one place where errors become HTTP status codes, and the handlers that answer them as
JSON ``{"error": "..."}`` (never a traceback)."""

from __future__ import annotations

import contextlib
import logging
from collections.abc import Iterator, Mapping

import orjson
from starlette.exceptions import HTTPException
from starlette.requests import Request
from starlette.responses import Response

from batching.answers import answer_log, internal_message
from batching.errors import (
    CLIENT_CLOSED,
    STATUS_FOR,
    BatchingError,
    ClientGone,
    Unavailable,
    status_of,
)
from batching.plane import Caller, DataPlane
from batching.runtime.deployment import Deployment

from .connections import hold_resends
from .middleware import request_id_of
from .requests import BodyTooLarge, caller_of

__all__ = [
    "CLIENT_CLOSED",
    "EXCEPTION_HANDLERS",
    "STATUS_FOR",
    "error_response",
    "recorded",
    "status_of",
    "with_request_id",
]

logger = logging.getLogger("batching")


def error_response(message: str, status: int, headers: Mapping[str, str] | None = None) -> Response:
    return Response(
        orjson.dumps({"error": message}),
        status_code=status,
        media_type="application/json",
        headers=headers,
    )


@contextlib.contextmanager
def recorded(plane: DataPlane, deployment: Deployment, request: Request) -> Iterator[Caller]:
    """Count and time one request to ``deployment`` under the status it was answered with:
    200 when the block returns, else the status of the error that escaped (499 when the
    client went away). The block gets who asks (:func:`.requests.caller_of`): its deadline
    counts from here."""
    started = plane.now()
    status = 500
    try:
        yield caller_of(request)
        status = 200
    except BatchingError as exc:
        status = status_of(exc)
        if isinstance(exc, BodyTooLarge):
            # Refused at the edge: the batcher, which counts the other refusals, never saw it.
            plane.refused(deployment.name, "too_large")
        raise
    finally:
        plane.record(deployment, status, started)


def with_request_id(message: str, status: int, request_id: str) -> str:
    """``message``, naming the request id when ``status`` is a failure of the server's own (500),
    whose details are in the log under it."""
    return f"{message} (request id {request_id})" if status == 500 else message


async def _batching_error(request: Request, exc: Exception) -> Response:
    assert isinstance(exc, BatchingError)
    if isinstance(exc, ClientGone):
        return Response(status_code=CLIENT_CLOSED)  # to nobody
    status = status_of(exc)
    headers = None
    if isinstance(exc, Unavailable):
        headers = {"Retry-After": str(max(1, round(exc.retry_after)))}
        hold_resends(request.scope, exc)
    message = with_request_id(str(exc), status, request_id_of(request.scope))
    answer_log.answered(f"request {request_id_of(request.scope)}", status, message)
    return error_response(message, status, headers)


async def _http_error(request: Request, exc: Exception) -> Response:
    assert isinstance(exc, HTTPException)
    return error_response(exc.detail, exc.status_code, exc.headers)


async def _unexpected_error(request: Request, exc: Exception) -> Response:
    request_id = request_id_of(request.scope)
    logger.error("request %s failed with an internal error", request_id, exc_info=exc)
    return error_response(internal_message(request_id), 500)


#: The app's exception handlers: the error tree, Starlette's own HTTP errors, anything else.
EXCEPTION_HANDLERS = {
    BatchingError: _batching_error,
    HTTPException: _http_error,
    Exception: _unexpected_error,
}
