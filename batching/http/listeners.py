"""The metrics listener (``--metrics-port``): which routes each listener serves.

With a metrics port, the server listens on two sockets with the same app: the main port serves
everything but ``/metrics``; the metrics port serves only ``/metrics`` and the two health probes
(so it can be firewalled apart, and a scrape or probe never needs a key). Which listener a
request came in on is the socket's own local port (``scope["server"]``, set by uvicorn from the
connection, not from the ``Host`` header).
"""

from __future__ import annotations

import orjson
from starlette.types import ASGIApp, Receive, Scope, Send

from .canned import send_json

__all__ = ["METRICS_LISTENER_PATHS", "METRICS_PATH", "ListenerRoutes"]

METRICS_PATH = "/metrics"

#: What the metrics listener serves.
METRICS_LISTENER_PATHS = frozenset({METRICS_PATH, "/v2/health/live", "/v2/health/ready"})


class ListenerRoutes:
    """Answers 404 to a request for a route its listener does not serve: ``/metrics`` on the
    main port, anything but :data:`METRICS_LISTENER_PATHS` on ``metrics_port``."""

    def __init__(self, app: ASGIApp, metrics_port: int) -> None:
        self.app = app
        self.metrics_port = metrics_port

    def serves(self, scope: Scope) -> bool:
        server = scope.get("server")
        on_metrics = server is not None and len(server) > 1 and server[1] == self.metrics_port
        path: str = scope["path"]
        if on_metrics:
            return scope["type"] == "http" and path in METRICS_LISTENER_PATHS
        return path != METRICS_PATH

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] not in ("http", "websocket") or self.serves(scope):
            await self.app(scope, receive, send)
            return
        if scope["type"] == "websocket":
            await send({"type": "websocket.close", "code": 1008})
            return
        await send_json(send, 404, orjson.dumps({"error": "Not Found"}))
