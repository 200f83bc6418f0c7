"""A minimal HTTP/1.1 keep-alive client on asyncio protocols, for ``http://`` targets.

Why not httpx: on this project's 2-core machines httpx's AsyncClient spent 0.9-2.8 ms of CPU
per request (more with more concurrent requests), so the load generator, not the server,
would have set the numbers. This client spends about 40-60 us: one prebuilt request write and
one incremental response parse. It speaks just enough HTTP for a load test: a request per
connection at a time, Content-Length, chunked or read-until-close bodies, ``Connection:
close``. The completion time is taken in ``data_received``, the moment the last byte arrives,
not when the awaiting coroutine next runs.
"""

from __future__ import annotations

import asyncio
import time
from dataclasses import dataclass

__all__ = ["ConnectionPool", "HttpProtocol", "Response", "build_request"]

_MAX_HEAD = 64 * 1024


@dataclass(slots=True)
class Response:
    """A parsed response; ``done`` is ``time.monotonic()`` when its last byte arrived.

    ``header_length`` is the ``Inference-Header-Content-Length`` header of a KServe v2 answer
    with binary data (None without it). ``outputs`` is set by senders that count the outputs
    themselves (gRPC); for the others the body is read.
    """

    status: int
    body: bytes
    keep_alive: bool
    done: float
    header_length: int | None = None
    outputs: int | None = None


class StaleConnection(ConnectionError):
    """A reused connection closed before any byte of the response: safe to retry once."""


def build_request(
    host: str,
    path: str,
    content_type: str,
    body: bytes,
    headers: tuple[tuple[str, str], ...] = (),
) -> bytes:
    """The complete bytes of a POST, built once per payload."""
    extra = "".join(f"{name}: {value}\r\n" for name, value in headers)
    head = (
        f"POST {path} HTTP/1.1\r\nHost: {host}\r\nContent-Type: {content_type}\r\n"
        f"Content-Length: {len(body)}\r\n{extra}Accept: application/json\r\n\r\n"
    )
    return head.encode("latin-1") + body


class HttpProtocol(asyncio.Protocol):
    """One connection; carries at most one request at a time."""

    def __init__(self) -> None:
        self.transport: asyncio.Transport | None = None
        self.closed = False
        self.used = False
        self._buf = bytearray()
        self._waiter: asyncio.Future[Response] | None = None
        self._received_any = False
        # Parsed head of the response in progress: (status, body start, length or -1 for
        # read-until-close or -2 for chunked, keep-alive).
        self._head: tuple[int, int, int, bool] | None = None
        # Its Inference-Header-Content-Length, when it has one.
        self._header_length: int | None = None

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        assert isinstance(transport, asyncio.Transport)
        self.transport = transport

    def request(self, data: bytes) -> asyncio.Future[Response]:
        """Write one request; the future resolves with its response."""
        assert self.transport is not None and self._waiter is None
        loop = asyncio.get_running_loop()
        self._waiter = loop.create_future()
        self._received_any = False
        self.used = True
        self.transport.write(data)
        return self._waiter

    def abort(self, exc: BaseException) -> None:
        """Fail the request in flight (a client timeout) and drop the connection."""
        self._fail(exc)
        self.close()

    def close(self) -> None:
        self.closed = True
        if self.transport is not None:
            self.transport.abort()

    def data_received(self, data: bytes) -> None:
        self._received_any = True
        self._buf += data
        while self._buf and self._parse():
            pass

    def eof_received(self) -> bool | None:
        return False

    def connection_lost(self, exc: Exception | None) -> None:
        self.closed = True
        if self._head is not None and self._head[2] == -1 and self._waiter is not None:
            status, start, _, _ = self._head
            self._finish(status, bytes(self._buf[start:]), False)
            return
        if self._received_any:
            self._fail(ConnectionResetError("connection closed mid-response"))
        else:
            self._fail(StaleConnection("connection closed before the response"))

    def _fail(self, exc: BaseException) -> None:
        waiter, self._waiter = self._waiter, None
        if waiter is not None and not waiter.done():
            waiter.set_exception(exc)

    def _finish(self, status: int, body: bytes, keep_alive: bool) -> None:
        done = time.monotonic()
        self._head = None
        header_length, self._header_length = self._header_length, None
        waiter, self._waiter = self._waiter, None
        if waiter is not None and not waiter.done():
            waiter.set_result(Response(status, body, keep_alive, done, header_length))
        if not keep_alive:
            self.close()

    def _parse(self) -> bool:
        """Consume one complete response from the buffer; False when more bytes are needed."""
        buf = self._buf
        if self._head is None:
            end = buf.find(b"\r\n\r\n")
            if end < 0:
                if len(buf) > _MAX_HEAD:
                    self.abort(ConnectionError("response head too large"))
                return False
            self._head = self._parse_head(bytes(buf[:end]), end + 4)
        status, start, length, keep_alive = self._head
        if 100 <= status < 200:
            del buf[:start]
            self._head = None
            self._header_length = None
            return True
        if length >= 0:
            if len(buf) < start + length:
                return False
            body = bytes(buf[start : start + length])
            del buf[: start + length]
            self._finish(status, body, keep_alive)
            return True
        if length == -2:
            parsed = _parse_chunked(buf, start)
            if parsed is None:
                return False
            body, consumed = parsed
            del buf[:consumed]
            self._finish(status, body, keep_alive)
            return True
        return False  # read until close: connection_lost finishes it

    def _parse_head(self, head: bytes, start: int) -> tuple[int, int, int, bool]:
        lines = head.split(b"\r\n")
        parts = lines[0].split(b" ", 2)
        try:
            status = int(parts[1])
        except (IndexError, ValueError):
            self.abort(ConnectionError(f"bad status line {lines[0][:80]!r}"))
            return (0, start, 0, False)
        keep_alive = parts[0] != b"HTTP/1.0"
        length = -1
        for line in lines[1:]:
            name, _, value = line.partition(b":")
            name = name.strip().lower()
            if name == b"content-length":
                length = int(value)
            elif name == b"transfer-encoding" and b"chunked" in value.lower():
                length = -2
            elif name == b"connection":
                token = value.strip().lower()
                keep_alive = token == b"keep-alive" or (keep_alive and token != b"close")
            elif name == b"inference-header-content-length":
                try:
                    self._header_length = int(value)
                except ValueError:
                    self._header_length = -1  # not a number: the answer is malformed
        if status in (204, 304) or 100 <= status < 200:
            length = 0
        if length == -1:
            keep_alive = False
        return status, start, length, keep_alive


def _parse_chunked(buf: bytearray, start: int) -> tuple[bytes, int] | None:
    """``(body, bytes consumed)`` of a complete chunked body at ``start``, else None."""
    pos = start
    chunks: list[bytes] = []
    while True:
        line_end = buf.find(b"\r\n", pos)
        if line_end < 0:
            return None
        size = int(bytes(buf[pos:line_end]).split(b";")[0], 16)
        pos = line_end + 2
        if size == 0:
            # Trailers, if any, end with an empty line.
            end = buf.find(b"\r\n\r\n", pos - 2)
            if end < 0:
                return None
            return b"".join(chunks), end + 4
        if len(buf) < pos + size + 2:
            return None
        chunks.append(bytes(buf[pos : pos + size]))
        pos += size + 2


class ConnectionPool:
    """Up to ``limit`` keep-alive connections to one host; waiting for one is measured."""

    def __init__(self, host: str, port: int, limit: int) -> None:
        self.host = host
        self.port = port
        self.limit = limit
        self._idle: list[HttpProtocol] = []
        self._slots = asyncio.Semaphore(limit)
        self.opened = 0

    async def acquire(self, fresh: bool = False) -> HttpProtocol:
        """A connection to use for one request; the caller must :meth:`release` it."""
        await self._slots.acquire()
        while self._idle and not fresh:
            conn = self._idle.pop()
            if not conn.closed:
                return conn
        try:
            loop = asyncio.get_running_loop()
            _, conn = await loop.create_connection(HttpProtocol, self.host, self.port)
        except BaseException:
            self._slots.release()
            raise
        self.opened += 1
        return conn

    def release(self, conn: HttpProtocol, reusable: bool) -> None:
        if reusable and not conn.closed:
            self._idle.append(conn)
        else:
            conn.close()
        self._slots.release()

    def close(self) -> None:
        for conn in self._idle:
            conn.close()
        self._idle.clear()
