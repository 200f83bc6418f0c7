"""Triton's logging extension over HTTP: ``GET /v2/logging`` (the settings now) and ``POST
/v2/logging`` (change them; the answer is the settings then). What the settings mean is
:mod:`batching.log_settings`. The route changes the server, so it needs an API key when keys
are configured (:mod:`.auth`)."""

from __future__ import annotations

import orjson
from starlette.requests import Request
from starlette.responses import Response
from starlette.routing import Route

from batching.errors import InvalidRequest
from batching.log_settings import LogSettings

from .requests import read_body

__all__ = ["logging_routes"]

MAX_BODY_BYTES = 1 << 16


def _json(document: object) -> Response:
    return Response(orjson.dumps(document), media_type="application/json")


def logging_routes(settings: LogSettings) -> list[Route]:
    """``/v2/logging`` over ``settings``."""

    async def logging_endpoint(request: Request) -> Response:
        if request.method == "GET":
            return _json(settings.current())
        body = await read_body(request, MAX_BODY_BYTES)
        try:
            document = orjson.loads(body) if body.strip() else {}
        except orjson.JSONDecodeError:
            raise InvalidRequest("the request body is not valid JSON") from None
        if not isinstance(document, dict):
            raise InvalidRequest("the request body must be a JSON object of log settings")
        return _json(settings.update(document))

    return [Route("/v2/logging", logging_endpoint, methods=["GET", "POST"])]
