"""Relative redirects: a redirect's ``Location`` never names a host.

Starlette's router answers a path that only lacks (or has an extra) trailing slash with a 307
whose ``Location`` it builds from the request's Host header, so a client (or a cache in front
of the server) could be told to go to any host it likes. :class:`RelativeRedirectMiddleware`
keeps only the path and query of every redirect the app sends (``Location: /v2/health/live``);
RFC 9110 (section 10.2.2) lets a ``Location`` be relative, and every HTTP client resolves it
against the URL it asked for.
"""

from __future__ import annotations

from urllib.parse import urlsplit, urlunsplit

from starlette.types import ASGIApp, Message, Receive, Scope, Send

__all__ = ["RelativeRedirectMiddleware", "relative_location"]


def relative_location(location: bytes) -> bytes:
    """``location`` without its scheme and host: ``http://evil/x/?q=1`` -> ``/x/?q=1``."""
    parts = urlsplit(location.decode("latin-1"))
    path = parts.path or "/"
    if not path.startswith("/") or path.startswith("//"):
        # Never a path a client could read as another host (``//evil/``).
        path = "/" + path.lstrip("/")
    return urlunsplit(("", "", path, parts.query, parts.fragment)).encode("latin-1")


class RelativeRedirectMiddleware:
    """Rewrites the ``Location`` of every 3xx answer to :func:`relative_location`."""

    def __init__(self, app: ASGIApp) -> None:
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return

        async def send_relative(message: Message) -> None:
            if message["type"] == "http.response.start" and 300 <= message["status"] < 400:
                message["headers"] = [
                    (name, relative_location(value) if name.lower() == b"location" else value)
                    for name, value in message.get("headers", [])
                ]
            await send(message)

        await self.app(scope, receive, send_relative)
