"""The server span of every HTTP request, outermost of the app's middleware (CORS aside), so
that a request refused before any route runs (401) has one too.

The span is parented on the request's ``traceparent`` header when it has one, set as the
current request span for the data plane (:mod:`batching.tracing.spans`), and ended when the
last byte of the answer is handed to the server, with the status code; an error answer's
span also says why (``batching.reason``: the error's message from the answer's body, or that
the client disconnected). A request whose handler raised, or was cancelled, ends its span
with the reason too. Only mounted when tracing is on.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import orjson
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from batching.tracing.spans import RequestSpan, reset_current_span, set_current_span

from .errors import CLIENT_CLOSED
from .middleware import request_id_of

if TYPE_CHECKING:
    from batching.tracing.provider import Tracing

__all__ = ["TracingMiddleware"]

#: Error bodies larger than this are not read for their reason.
_REASON_BYTES = 4096


def reason_of(body: bytes) -> str | None:
    """The error message of an error answer's JSON body (``{"error": "..."}``, or OpenAI's
    ``{"error": {"message": "..."}}``), or None."""
    if not body or len(body) > _REASON_BYTES:
        return None
    try:
        document = orjson.loads(body)
    except orjson.JSONDecodeError:
        return None
    error = document.get("error") if isinstance(document, dict) else None
    if isinstance(error, dict):
        error = error.get("message")
    return error if isinstance(error, str) else None


class TracingMiddleware:
    """Starts, and ends with its outcome, the server span of every HTTP request."""

    def __init__(self, app: ASGIApp, tracing: Tracing) -> None:
        from opentelemetry.trace import SpanKind

        self.app = app
        self.tracing = tracing
        self._kind = SpanKind.SERVER

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        method = str(scope["method"])
        fields = self.tracing.fields
        carrier = {
            key: value.decode("latin-1")
            for name, value in scope["headers"]
            if (key := name.decode("latin-1").lower()) in fields
        }
        span = self.tracing.request(
            method,
            carrier,
            self._kind,
            {
                "http.request.method": method,
                "url.path": str(scope["path"]),
                "url.scheme": str(scope.get("scheme", "http")),
            },
        )
        status = 0
        error_body: list[bytes] = []

        async def traced_send(message: Message) -> None:
            nonlocal status
            kind = message["type"]
            if kind == "http.response.start":
                status = int(message["status"])
            elif kind == "http.response.body" and status >= 400:
                if sum(map(len, error_body)) <= _REASON_BYTES:
                    error_body.append(message.get("body", b""))
            try:
                await send(message)
            except Exception:
                span.end("the connection closed while the answer was sent", None)
                raise
            if kind == "http.response.body" and not message.get("more_body", False):
                self._end(span, scope, status, b"".join(error_body))

        token = set_current_span(span)
        try:
            await self.app(scope, receive, traced_send)
        except Exception as exc:
            # Past the request id middleware, which answers 500: an answer was half sent.
            span.end(f"internal error: {type(exc).__name__}", type(exc).__name__)
            raise
        finally:
            reset_current_span(token)
            # Cancelled, or returned without finishing an answer.
            span.end("cancelled before an answer was sent", None)

    def _end(self, span: RequestSpan, scope: Scope, status: int, body: bytes) -> None:
        attributes = span.attributes
        attributes["http.response.status_code"] = status
        attributes["batching.request_id"] = request_id_of(scope)
        route = scope.get("route")
        template = getattr(route, "path", None)
        if isinstance(template, str) and span.recording:
            attributes["http.route"] = template
            span.span.update_name(f"{scope['method']} {template}")
        if status < 400:
            span.end(None, None)
            return
        if status == CLIENT_CLOSED:
            reason: str | None = "the client disconnected before its answer"
        else:
            reason = reason_of(body) or f"answered {status}"
        span.end(reason, str(status) if status >= 500 else None)
