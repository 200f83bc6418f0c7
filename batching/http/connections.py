"""Bounded HTTP/1.1 connections: the timeouts and the cap uvicorn lacks, in its own protocol.

uvicorn (0.54) closes an idle keep-alive connection (``timeout_keep_alive``) but has no
timeout for a request whose headers or body never finish arriving, and its only cap
(``limit_concurrency``) answers 503 to *every request* once that many connections are open,
so 2,000 idle sockets would turn every normal client away. :func:`protocol_class` builds a
subclass of uvicorn's httptools protocol that adds, per connection:

- a **header timeout**: from the connection's first moment (or, on a kept-alive connection,
  from the next request's first byte) until its headers are complete; past it, 408 and close;
- a **body timeout**: the longest wait for the next piece of a body that is still arriving;
  past it the handler hears a disconnect, and the client gets 408 if nothing was answered;
- the **keep-alive timeout** (uvicorn's own timer, given a float);
- a **connection cap**: a connection beyond it is answered at once with a canned 503 and
  closed, without ever reaching the app, so the open connections (and file descriptors)
  stay bounded while the connections already open are served as usual;
- a **lingering close** (:mod:`batching.http.lingering`): an answer sent before the request
  has all arrived (a 413 for a 32 MiB body, a 401, a 431, or any early error) says
  ``connection: close``; the server half-closes where the transport can, discards what still
  arrives until the request's body is all in, the client closes, or
  :attr:`ConnectionLimits.linger` seconds have passed, and then closes (over TLS, with a
  close_notify), as nginx does. Closing at once would make the kernel answer the unread bytes
  with a reset, and the client would lose the answer it had not read yet.

It also holds **early resends**. A refusal (503) leaves in the request's scope how long the
queue needs before it could take that request (:func:`hold_resends`). When the same request
(method, path, query and body alike) comes back from the same client address before then, on
that connection or a new one (:mod:`batching.http.resends`), it is read but not started until
then: a client that resends at once, ignoring Retry-After, waits as if it had honoured a short
one, instead of costing the server a refusal (and a new connection) every millisecond. A first
request, another request, or the same one from another address is never held, so a refusal
itself stays immediate.

It also bounds **what a request may be** before any handler runs:

- a **header limit**: the request line and headers together may take at most
  :attr:`ConnectionLimits.max_header_bytes` bytes, counted as they arrive (the parser never
  holds more than that of a head), and at most :attr:`ConnectionLimits.max_header_count`
  header lines; past either, 431 and close, without reading the rest;
- a **body deadline**: from the end of the headers until the body's last byte, however
  steadily its pieces arrive; past it, 408 as for the body timeout;
- **Host**: an HTTP/1.1 request must carry exactly one Host header (RFC 9112, section 3.2);
  without one, or with two, 400 and close. HTTP/1.0 may omit it.

And it keeps the **probes** answering when every slot is taken: beyond the connection cap,
:attr:`ConnectionLimits.probe_connections` more connections are taken on probation. Such a
connection serves one request, and only if its request line asks for a probe path
(:data:`PROBE_PATHS`); any other request gets the cap's 503. It must send its headers within
:data:`PROBE_HEADER_TIMEOUT`, and when all reserved slots are taken, a new connection evicts
the oldest one still silent, so idle sockets cannot hold the reserve: a prober that sends its
request as it connects (as kubelet and load balancers do) is always heard.

Timers are armed only while a request is incomplete: a request that arrives in one read pays
one timer (the header timer, cancelled by its own headers), a multi-read body one per read.
"""

from __future__ import annotations

import asyncio
import dataclasses
import zlib
from collections.abc import MutableMapping
from typing import Any, cast

import httptools
from uvicorn._types import ASGI3Application
from uvicorn.protocols.http.httptools_impl import HttpToolsProtocol, RequestResponseCycle

from batching.errors import Unavailable

from .lingering import Linger, LingeringTransport, adopt
from .resends import RequestKey, Resends

__all__ = ["HOLD_KEY", "PROBE_PATHS", "ConnectionLimits", "hold_resends", "protocol_class"]

#: Where a door leaves, in a refused request's scope, how long an early resend of it is held.
HOLD_KEY = "batching.hold"

#: The largest body a held resend may have: uvicorn stops reading past 64 KiB of unread body,
#: and a held request must be read whole before it can be compared.
HOLDABLE_BODY = 65536

#: The paths a reserved (beyond the cap) connection may ask for: liveness and readiness.
PROBE_PATHS = frozenset({b"/v2/health/live", b"/v2/health/ready"})

#: How long a reserved connection may take to send its headers.
PROBE_HEADER_TIMEOUT = 1.0


def hold_resends(scope: MutableMapping[str, Any], exc: Unavailable) -> None:
    """Ask the connection that carried ``scope`` to hold the same request, sent again before
    ``exc.hold`` seconds have passed, until then."""
    if exc.hold is not None and exc.hold > 0:
        scope[HOLD_KEY] = exc.hold


@dataclasses.dataclass(frozen=True, slots=True)
class ConnectionLimits:
    """How long a connection may take, and how many there may be. Seconds; 0 turns one off."""

    #: From a request's first byte (or the connection's start) until its headers are in.
    header_timeout: float = 10.0
    #: Longest gap between two reads of a body that is still arriving.
    body_timeout: float = 10.0
    #: An idle kept-alive connection is closed after this long.
    keep_alive_timeout: float = 5.0
    #: Most open connections; beyond it a new one gets 503 and is closed. 0: no cap.
    max_connections: int = 4096
    #: After answering before the request was all read, the longest to drain it before closing.
    linger: float = 5.0
    #: Most bytes of a request line and headers together; beyond it, 431. 0: no limit.
    max_header_bytes: int = 65536
    #: Most header lines in a request; beyond it, 431. 0: no limit.
    max_header_count: int = 100
    #: From the end of the headers until the body's last byte; past it, 408. 0: never.
    body_deadline: float = 30.0
    #: Connections beyond ``max_connections`` taken for one probe request each.
    probe_connections: int = 8

    def __post_init__(self) -> None:
        for name in (
            "header_timeout",
            "body_timeout",
            "keep_alive_timeout",
            "linger",
            "body_deadline",
        ):
            if getattr(self, name) < 0:
                raise ValueError(f"{name} must be >= 0")
        for name in ("max_connections", "max_header_count", "probe_connections"):
            if getattr(self, name) < 0:
                raise ValueError(f"{name} must be >= 0")
        if self.max_header_bytes and self.max_header_bytes < 1024:
            raise ValueError("max_header_bytes must be 0 (no limit) or >= 1024")


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


class _Refused(Exception):
    """Raised from a parser callback to stop parsing a request that is refused."""


class BoundedHttpProtocol(HttpToolsProtocol):
    """uvicorn's httptools protocol with :class:`ConnectionLimits`; see the module's text."""

    limits = ConnectionLimits()
    #: The reserved (probe-only) connections open now, oldest first; one per server.
    reserve: dict[BoundedHttpProtocol, None] = {}
    #: Refused requests by client address, whose early resends are held; one per server.
    resends = Resends()

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        # uvicorn types it as int; call_later takes any number of seconds.
        self.timeout_keep_alive = self.limits.keep_alive_timeout  # type: ignore[assignment]
        self._header_timer: asyncio.TimerHandle | None = None
        self._body_timer: asyncio.TimerHandle | None = None
        #: The lingering close under way, once an answer was sent early.
        self._lingering: Linger | None = None
        #: Refused (over the cap) or answered early: what arrives now is discarded.
        self._discarding = False
        # Early resends: the body's CRC so far, the last complete request's key (with its
        # cycle), the refused request's key and until when a resend of it is held, and the
        # request waiting to be compared or released.
        self._body_crc = 0
        self._body_length = 0
        self._last_request: tuple[RequestResponseCycle, RequestKey] | None = None
        self._deferred: tuple[RequestResponseCycle, ASGI3Application] | None = None
        self._hold_timer: asyncio.TimerHandle | None = None
        # The head (request line and headers) now arriving: whether one is, its bytes and
        # header lines so far, and how many heads were complete (to see one end in a feed).
        self._in_head = True
        self._head_bytes = 0
        self._header_count = 0
        self._heads = 0
        # The body deadline: when the current request's headers were complete, its timer.
        self._body_started = 0.0
        self._deadline_timer: asyncio.TimerHandle | None = None
        #: A reserved connection: one probe request, then close.
        self._probe_only = False
        #: What to answer when a parser callback refused the request.
        self._refusal: bytes | None = None

    # ------------------------------------------------------------------ connection life

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        cap = self.limits.max_connections
        if cap and len(self.connections) - len(self.reserve) >= cap:
            if not self._take_reserved_slot():
                self.transport = cast(asyncio.Transport, transport)
                transport = cast(asyncio.Transport, transport)
                transport.write(TOO_MANY_CONNECTIONS)
                self._linger(min(1.0, self.limits.linger))
                return
            self._probe_only = True
            self.reserve[self] = None
        super().connection_made(transport)  # type: ignore[arg-type]
        self._arm_header_timer()

    def _take_reserved_slot(self) -> bool:
        """Whether this connection, beyond the cap, may wait for a probe request: a reserved
        slot is free, or the oldest reserved connection still silent gives up its own."""
        if len(self.reserve) < self.limits.probe_connections:
            return True
        for other in self.reserve:
            if other._heads == 0 and not other._discarding:
                other._evict()
                return True
        return False

    def _evict(self) -> None:
        # It has sent nothing to read: answer and close, without a linger to hold its socket.
        self.reserve.pop(self, None)
        self._discarding = True
        self.transport.write(TOO_MANY_CONNECTIONS)
        self.transport.close()

    def connection_lost(self, exc: Exception | None) -> None:
        timers = (self._header_timer, self._body_timer, self._hold_timer, self._deadline_timer)
        for timer in timers:
            if timer is not None:
                timer.cancel()
        self._header_timer = self._body_timer = self._hold_timer = self._deadline_timer = None
        if self._lingering is not None:
            self._lingering.cancel()
        self._deferred = None
        self.reserve.pop(self, None)
        super().connection_lost(exc)

    def eof_received(self) -> bool | None:  # type: ignore[override]
        if self._lingering is not None:
            self._lingering.end()
        elif self._discarding:
            self.transport.close()
        return None

    def data_received(self, data: bytes) -> None:
        if self._discarding:
            if self._lingering is not None:
                self._lingering.discard(data)
            return
        if self._header_timer is None and (self.cycle is None or self.cycle.response_complete):
            self._arm_header_timer()
        self._feed(data)
        cycle = self.cycle
        if (
            cycle is not None
            and cycle.more_body
            and not cycle.response_complete
            and not self._discarding
            and self._header_timer is None
        ):
            if self.limits.body_timeout:
                if self._body_timer is not None:
                    self._body_timer.cancel()
                self._body_timer = self.loop.call_later(
                    self.limits.body_timeout, self._body_expired
                )
            if self.limits.body_deadline and self._deadline_timer is None:
                self._deadline_timer = self.loop.call_at(
                    self._body_started + self.limits.body_deadline, self._deadline_passed
                )

    def _feed(self, data: bytes) -> None:
        """Parse ``data``, never letting a head grow past ``max_header_bytes``: while a head
        is arriving, only what fits under the limit is parsed; if that does not end the head,
        431 and the rest is discarded unread."""
        limit = self.limits.max_header_bytes
        while data:
            if not self._in_head or not limit:
                super().data_received(data)
                return
            room = limit - self._head_bytes
            if len(data) <= room:
                self._head_bytes += len(data)
                super().data_received(data)
                return
            heads = self._heads
            piece, data = data[:room], data[room:]
            self._head_bytes += len(piece)
            if piece:
                super().data_received(piece)
            if self._discarding or self.transport.is_closing():
                return
            if self._heads == heads:
                self._refuse(HEADERS_TOO_LARGE)
                return

    def _refuse(self, answer: bytes) -> None:
        """Answer ``answer`` (a canned answer that closes) and discard what still arrives."""
        if self._discarding or self.transport.is_closing():
            return
        self.transport.write(answer)
        # A connection beyond the cap lingers no longer than one refused at the cap.
        self._linger(min(1.0, self.limits.linger) if self._probe_only else self.limits.linger)

    def send_400_response(self, msg: str) -> None:
        # uvicorn's answer to a parser error; a callback that refused the request (raising
        # _Refused) says what to answer instead.
        refusal, self._refusal = self._refusal, None
        if refusal is None:
            super().send_400_response(msg)
        else:
            self._refuse(refusal)

    # --------------------------------------------------------------- parser callbacks

    def on_header(self, name: bytes, value: bytes) -> None:
        self._header_count += 1
        cap = self.limits.max_header_count
        if cap and self._header_count > cap:
            self._refusal = TOO_MANY_HEADERS
            raise _Refused
        super().on_header(name, value)

    def on_headers_complete(self) -> None:
        if self._header_timer is not None:
            self._header_timer.cancel()
            self._header_timer = None
        self._in_head = False
        self._heads += 1
        refusal = self._refusal_of_head()
        if refusal is not None:
            self._refusal = refusal
            raise _Refused
        self._body_started = self.loop.time()
        super().on_headers_complete()
        cycle = self.cycle
        if cycle is not None:
            adopt(cycle, self.transport, self)
        if self._probe_only and cycle is not None:
            cycle.keep_alive = False  # one probe per reserved connection

    def _refusal_of_head(self) -> bytes | None:
        """What to answer instead of serving a head just complete, if anything."""
        version = self.parser.get_http_version()
        if version == "1.1" and sum(1 for name, _ in self.headers if name == b"host") != 1:
            return BAD_HOST
        if self._probe_only and httptools.parse_url(self.url).path not in PROBE_PATHS:
            return TOO_MANY_CONNECTIONS
        return None

    def on_message_begin(self) -> None:
        super().on_message_begin()
        self._body_crc = self._body_length = 0
        self._header_count = 0

    def on_body(self, body: bytes) -> None:
        super().on_body(body)
        self._body_crc = zlib.crc32(body, self._body_crc)
        self._body_length += len(body)

    def on_message_complete(self) -> None:
        if self._body_timer is not None:
            self._body_timer.cancel()
            self._body_timer = None
        if self._deadline_timer is not None:
            self._deadline_timer.cancel()
            self._deadline_timer = None
        # What follows on this connection is the next request's head.
        self._in_head = True
        self._head_bytes = 0
        super().on_message_complete()
        cycle = self.cycle
        scope = cycle.scope
        key: RequestKey = (
            scope["method"],
            scope["raw_path"],
            scope["query_string"],
            self._body_length,
            self._body_crc,
        )
        self._last_request = (cycle, key)
        deferred, self._deferred = self._deferred, None
        if deferred is None:
            return
        until = None
        if deferred[0] is cycle:
            until = self.resends.held_until(self._client_host(), key, self.loop.time())
        if until is not None:
            self._hold_timer = self.loop.call_at(until, self._release, *deferred)
        else:
            super()._start_asgi_task(*deferred)

    def _client_host(self) -> str:
        return self.client[0] if self.client else ""

    def _start_asgi_task(self, cycle: RequestResponseCycle, app: ASGI3Application) -> None:
        if self.resends and cycle is self.cycle and cycle.more_body and _holdable(cycle.scope):
            # Possibly a refused request again, too early: compare once it is all in.
            self._deferred = (cycle, app)
            return
        super()._start_asgi_task(cycle, app)

    def _release(self, cycle: RequestResponseCycle, app: ASGI3Application) -> None:
        self._hold_timer = None
        if not self.transport.is_closing():
            super()._start_asgi_task(cycle, app)

    def on_response_complete(self) -> None:
        cycle = self.cycle
        if cycle is not None and isinstance(cycle.transport, LingeringTransport):
            cycle.transport.flush()
        last = self._last_request
        if cycle is not None and last is not None and last[0] is cycle:
            hold = cycle.scope.get(HOLD_KEY)
            if isinstance(hold, float | int) and hold > 0:
                now = self.loop.time()
                self.resends.refused(self._client_host(), last[1], now + hold, now)
        if self._discarding:
            # Answered before the body was all in (413, or any early error): the answer said
            # connection: close and the connection lingers (close_after_answer); the rest of
            # the body is not worth parsing, and nothing is kept alive.
            self.server_state.total_requests += 1
            return
        super().on_response_complete()

    # ------------------------------------------------------------------------ closing

    def close_after_answer(self) -> None:
        """The answer was sent on a connection that must close (the client asked, HTTP/1.0,
        or an answer begun before the body was all in): linger if the request's body is
        still arriving, else close now."""
        cycle = self.cycle
        if cycle is not None and cycle.more_body and not self.transport.is_closing():
            self._linger(self.limits.linger)
        else:
            self.transport.close()

    def _linger(self, seconds: float) -> None:
        if self._discarding:
            return
        self._discarding = True
        for timer in (self._header_timer, self._body_timer, self._deadline_timer):
            if timer is not None:
                timer.cancel()
        self._header_timer = self._body_timer = self._deadline_timer = None
        self._unset_keepalive_if_required()
        # A refused connection has no flow control yet (uvicorn types it as always there).
        flow: Any = self.flow
        if flow is not None:
            flow.resume_reading()
        self._lingering = Linger(self.loop, self.transport, seconds, self._unread_body())

    def _unread_body(self) -> int | None:
        """How many bytes of the request's body are still to come, if its head is complete
        and announced its length; None if unknown."""
        cycle = self.cycle
        if cycle is None or self._in_head or not cycle.more_body:
            return None
        length = _content_length(cycle.scope)
        return None if length is None else length - self._body_length

    def _arm_header_timer(self) -> None:
        timeout = self.limits.header_timeout
        if self._probe_only:
            timeout = min(timeout, PROBE_HEADER_TIMEOUT) if timeout else PROBE_HEADER_TIMEOUT
        if timeout:
            self._header_timer = self.loop.call_later(timeout, self._headers_expired)

    def _headers_expired(self) -> None:
        self._header_timer = None
        if self.transport.is_closing():
            return
        if self.cycle is not None and not self.cycle.response_complete:
            return  # a request is in progress; its headers are complete
        self.transport.write(HEADER_TIMEOUT)
        self.transport.close()

    def _body_expired(self) -> None:
        self._body_timer = None
        self._end_body(BODY_TIMEOUT)

    def _deadline_passed(self) -> None:
        self._deadline_timer = None
        self._end_body(BODY_DEADLINE)

    def _end_body(self, answer: bytes) -> None:
        for timer in (self._body_timer, self._deadline_timer):
            if timer is not None:
                timer.cancel()
        self._body_timer = self._deadline_timer = None
        cycle = self.cycle
        if cycle is None or not cycle.more_body or self.transport.is_closing():
            return
        answered = cycle.response_started
        # The handler waiting for the body hears a disconnect; anything it sends is dropped.
        cycle.disconnected = True
        cycle.message_event.set()
        if not answered:
            self.transport.write(answer)
        self.transport.close()


def _content_length(scope: Any) -> int | None:
    """The body's length a request announced (``Content-Length``), if it did."""
    for name, value in scope["headers"]:
        if name.lower() == b"content-length":
            try:
                return int(value)
            except ValueError:
                return None
    return None


def _holdable(scope: Any) -> bool:
    """Whether a request's body is announced and small enough to be read whole while held."""
    length = _content_length(scope)
    return length is not None and length <= HOLDABLE_BODY


def protocol_class(limits: ConnectionLimits) -> type[HttpToolsProtocol]:
    """A protocol class for ``uvicorn.Config(http=...)`` that enforces ``limits``."""
    return type(
        "BoundedHttpProtocol",
        (BoundedHttpProtocol,),
        {"limits": limits, "reserve": {}, "resends": Resends()},
    )
