"""API keys on the HTTP doors: an ASGI middleware in front of every route.

When keys are set, every request needs one (``Authorization: Bearer KEY``, or ``api-key: KEY``),
except the open paths: liveness and readiness (kubelet probes carry no key) and ``/metrics``
(Prometheus; with ``--metrics-port`` it is served on its own listener only). Deny by
default: a path is open only if ``scope["path"]`` equals one of them exactly; a path the
router would not serve needs a key too, so nothing about the routes shows to a caller
without one. The path is the ASGI scope's, never a URL
rebuilt from the ``Host`` header (Starlette's ``request.url`` is, which made vLLM's key check
bypassable: CVE-2026-48746).

A request without a valid key is answered 401 with ``WWW-Authenticate: Bearer`` before its
body is read and before any route runs, so it costs no model time; the body is JSON
``{"error": ...}``, or OpenAI's error document with code ``invalid_api_key`` under ``/v1``.
The key is never logged or echoed. Each refusal is counted (``on_refused``).
"""

from __future__ import annotations

from collections.abc import Callable, Collection

import orjson
from starlette.types import ASGIApp, Receive, Scope, Send

from batching.answers import answer_log
from batching.codecs.openai import error_document
from batching.keys import KeyCheck, credential_of

from .canned import send_json
from .middleware import request_id_of

__all__ = ["OPEN_PATHS", "ApiKeyMiddleware", "MESSAGE", "presented_key"]

#: Paths that answer without a key: the probes (the app adds ``/metrics``).
OPEN_PATHS = frozenset({"/v2/health/live", "/v2/health/ready"})

MESSAGE = "a valid API key is required: Authorization: Bearer KEY, or api-key: KEY"


def presented_key(scope: Scope) -> str | None:
    """The key an HTTP request presents (:func:`batching.keys.credential_of` of its
    headers), if any."""
    return credential_of(
        (name.decode("latin-1").lower(), value.decode("latin-1"))
        for name, value in scope["headers"]
    )


def _is_openai(path: str) -> bool:
    return path == "/v1" or path.startswith("/v1/")


class ApiKeyMiddleware:
    """Refuses, with 401, every HTTP request outside ``open_paths`` that presents no key
    ``keys`` accepts (an API key or an admin key: :class:`batching.keys.AccessKeys`); counts
    each refusal with ``on_refused``."""

    def __init__(
        self,
        app: ASGIApp,
        keys: KeyCheck,
        open_paths: Collection[str] = OPEN_PATHS,
        on_refused: Callable[[], None] | None = None,
    ) -> None:
        self.app = app
        self.keys = keys
        self.open_paths = frozenset(open_paths)
        self.on_refused = on_refused

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] not in ("http", "websocket"):
            await self.app(scope, receive, send)
            return
        path: str = scope["path"]
        if path in self.open_paths and scope["type"] == "http":
            await self.app(scope, receive, send)
            return
        presented = presented_key(scope)
        if self.keys.accepts(presented):
            await self.app(scope, receive, send)
            return
        if self.on_refused is not None:
            self.on_refused()
        answer_log.answered(f"request {request_id_of(scope)}", 401, "no valid API key")
        if scope["type"] == "websocket":
            await send({"type": "websocket.close", "code": 1008})
            return
        # RFC 6750 3.1: a presented but unknown token is an invalid_token; a missing one is not.
        challenge = b'Bearer error="invalid_token"' if presented else b"Bearer"
        if _is_openai(path):
            body = error_document(MESSAGE, "invalid_request_error", None, "invalid_api_key")
        else:
            body = orjson.dumps({"error": MESSAGE})
        await send_json(send, 401, body, [(b"www-authenticate", challenge)])
