"""The request id: honoured from ``X-Request-ID`` (or made), kept in the scope, echoed back."""

from __future__ import annotations

import itertools
import re
import uuid
from collections.abc import Callable

from starlette.types import ASGIApp, Message, Receive, Scope, Send

__all__ = ["RequestIdMiddleware", "request_id_of"]

_REQUEST_ID = re.compile(r"^[\x21-\x7e]{1,128}$")


def request_id_of(scope: Scope) -> str:
    """The request id :class:`RequestIdMiddleware` stored in ``scope``, or "-"."""
    return str(scope.get("state", {}).get("request_id", "-"))


class RequestIdMiddleware:
    """Honours ``X-Request-ID`` (or makes one), stores it in the scope and echoes it back."""

    def __init__(self, app: ASGIApp) -> None:
        self.app = app
        # A random prefix per process and a counter: unique, and without uuid4's system
        # call per request (6% of the event loop's time under load, profiled).
        prefix = uuid.uuid4().hex[:12]
        counter = itertools.count(1)
        self._new_id: Callable[[], str] = lambda: f"{prefix}-{next(counter)}"

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        request_id = ""
        for key, value in scope["headers"]:
            if key == b"x-request-id":
                candidate = value.decode("latin-1")
                if _REQUEST_ID.match(candidate):
                    request_id = candidate
                break
        if not request_id:
            request_id = self._new_id()
        scope.setdefault("state", {})["request_id"] = request_id
        encoded = request_id.encode("latin-1")

        async def send_with_id(message: Message) -> None:
            if message["type"] == "http.response.start":
                message["headers"] = [*message.get("headers", []), (b"x-request-id", encoded)]
            await send(message)

        await self.app(scope, receive, send_with_id)
