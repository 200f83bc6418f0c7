"""The answers the connection layer writes itself, before or instead of the app
(:mod:`batching.http.connections`): whole HTTP/1.1 responses, each with a JSON error body, and
each closing the connection; and the JSON answer a middleware sends itself instead of the
app's (:func:`send_json`).
"""

from __future__ import annotations

from collections.abc import Sequence

from starlette.types import Send

__all__ = [
    "BAD_HOST",
    "BODY_DEADLINE",
    "BODY_TIMEOUT",
    "HEADERS_TOO_LARGE",
    "HEADER_TIMEOUT",
    "TOO_MANY_CONNECTIONS",
    "TOO_MANY_HEADERS",
    "send_json",
]


async def send_json(
    send: Send, status: int, body: bytes, headers: Sequence[tuple[bytes, bytes]] = ()
) -> None:
    """Answer ``status`` with the JSON ``body`` (and ``headers``) through ASGI's ``send``."""
    await send(
        {
            "type": "http.response.start",
            "status": status,
            "headers": [
                (b"content-type", b"application/json"),
                (b"content-length", str(len(body)).encode()),
                *headers,
            ],
        }
    )
    await send({"type": "http.response.body", "body": body})


def _canned(status: bytes, reason: bytes, extra: bytes = b"") -> bytes:
    body = b'{"error":"' + reason + b'"}'
    return (
        b"HTTP/1.1 " + status + b"\r\ncontent-type: application/json\r\n"
        b"content-length: "
        + str(len(body)).encode()
        + b"\r\n"
        + extra
        + b"connection: close\r\n\r\n"
    ) + body


#: Beyond the connection cap (and any reserved probe slot), or a non-probe request on one.
TOO_MANY_CONNECTIONS = _canned(
    b"503 Service Unavailable", b"too many connections; retry", b"retry-after: 1\r\n"
)
HEADER_TIMEOUT = _canned(b"408 Request Timeout", b"the request headers took too long")
BODY_TIMEOUT = _canned(b"408 Request Timeout", b"the request body took too long")
BODY_DEADLINE = _canned(
    b"408 Request Timeout", b"the request body was not all in within the body deadline"
)
HEADERS_TOO_LARGE = _canned(
    b"431 Request Header Fields Too Large", b"the request headers are too large"
)
TOO_MANY_HEADERS = _canned(b"431 Request Header Fields Too Large", b"too many request headers")
BAD_HOST = _canned(b"400 Bad Request", b"an HTTP/1.1 request must carry exactly one Host header")
