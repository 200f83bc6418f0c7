"""Bounded HTTP/1.1 connections: the timeouts and the cap uvicorn lacks, in its own protocol.

uvicorn closes an idle keep-alive connection (``timeout_keep_alive``) but has no
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
- a **lingering close** (:mod:`batching.http.lingering`, which says why): an answer sent
  before the request has all arrived says ``connection: close``, and the connection drains
  what still arrives for at most :attr:`ConnectionLimits.linger` seconds before it closes.

It also holds **early resends** (:mod:`batching.http.resends` says which and why): a
refusal leaves in the request's scope how long the queue needs (:func:`hold_resends`); the same
request from the same client address, back before then, is read but not started until then.

It also bounds **what a request may be** before any handler runs:

- a **header limit**: the request line and headers together may take at most
  :attr:`ConnectionLimits.max_header_bytes` bytes, counted as they arrive (the parser never
  holds more than that of a head), and at most :attr:`ConnectionLimits.max_header_count`
  header lines; past either, 431 and close, without reading the rest;
- a **body deadline**: from the end of the headers until the body's last byte, however
  steadily its pieces arrive; past it, 408 as for the body timeout;
- **Host**: an HTTP/1.1 request must carry exactly one Host header (RFC 9112, section 3.2);
  without one, or with two, 400 and close. HTTP/1.0 may omit it.

And it keeps the **probes** answering when every slot is taken, on connections taken beyond
the cap for one probe request each (:mod:`batching.http.probes`).

Timers are armed only while a request is incomplete: a request that arrives in one read pays
one timer (the header timer, cancelled by its own headers), a multi-read body one per read.

Some of what it overrides is private to uvicorn: :mod:`batching.http.uvicorn_check` says what,
and :func:`protocol_class` checks that the uvicorn installed still has it.
"""

from __future__ import annotations

import asyncio
import zlib
from collections.abc import MutableMapping
from typing import Any, cast

import httptools
from uvicorn._types import ASGI3Application
from uvicorn.protocols.http.httptools_impl import HttpToolsProtocol, RequestResponseCycle

from batching.errors import Unavailable

from . import canned
from .limits import ConnectionLimits
from .lingering import Linger, LingeringTransport, adopt
from .probes import PROBE_HEADER_TIMEOUT, PROBE_PATHS, ProbeReserve
from .resends import RequestKey, Resends, content_length, holdable
from .uvicorn_check import check_uvicorn

__all__ = ["ARRIVED_KEY", "HOLD_KEY", "hold_resends", "protocol_class"]

#: Where a door leaves, in a refused request's scope, how long an early resend of it is held.
HOLD_KEY = "batching.hold"
#: Where the connection leaves, in a request's scope, the event loop's time its head was
#: complete: its deadline counts from then, even when it is held before it starts.
ARRIVED_KEY = "batching.arrived"


def hold_resends(scope: MutableMapping[str, object], exc: Unavailable) -> None:
    """Ask the connection that carried ``scope`` to hold the same request, sent again before
    ``exc.hold`` seconds have passed, until then."""
    if exc.hold is not None and exc.hold > 0:
        scope[HOLD_KEY] = exc.hold


class _Refused(Exception):
    """Raised from a parser callback to stop parsing a request that is refused."""


class BoundedHttpProtocol(HttpToolsProtocol):
    """uvicorn's httptools protocol with :class:`ConnectionLimits`; see the module's text."""

    limits = ConnectionLimits()
    #: The reserved (probe-only) connections open now, oldest first; one per server.
    reserve: ProbeReserve[BoundedHttpProtocol] = ProbeReserve(limits.probe_connections)
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
            if not self.reserve.take(self):
                self.transport = cast(asyncio.Transport, transport)
                transport = cast(asyncio.Transport, transport)
                transport.write(canned.TOO_MANY_CONNECTIONS)
                self._linger(min(1.0, self.limits.linger))
                return
            self._probe_only = True
        super().connection_made(transport)  # type: ignore[arg-type]
        self._arm_header_timer()

    def silent(self) -> bool:
        """A reserved connection that has sent no head yet, and is not being refused."""
        return self._heads == 0 and not self._discarding

    def evict(self) -> None:
        """Give up a reserved slot: it has sent nothing to read, so answer and close, without
        a linger to hold its socket."""
        self.reserve.release(self)
        self._discarding = True
        self.transport.write(canned.TOO_MANY_CONNECTIONS)
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
        self.reserve.release(self)
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
                self._refuse(canned.HEADERS_TOO_LARGE)
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
            self._refusal = canned.TOO_MANY_HEADERS
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
            # The request's deadline counts from here, however long it is held before it
            # starts (an early resend, below).
            cycle.scope[ARRIVED_KEY] = self._body_started  # type: ignore[literal-required]
            adopt(cycle, self.transport, self)
        if self._probe_only and cycle is not None:
            cycle.keep_alive = False  # one probe per reserved connection

    def _refusal_of_head(self) -> bytes | None:
        """What to answer instead of serving a head just complete, if anything."""
        version = self.parser.get_http_version()
        if version == "1.1" and sum(1 for name, _ in self.headers if name == b"host") != 1:
            return canned.BAD_HOST
        if self._probe_only and httptools.parse_url(self.url).path not in PROBE_PATHS:
            return canned.TOO_MANY_CONNECTIONS
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
        if self.resends and cycle is self.cycle and cycle.more_body and holdable(cycle.scope):
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
        length = content_length(cycle.scope)
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
        self.transport.write(canned.HEADER_TIMEOUT)
        self.transport.close()

    def _body_expired(self) -> None:
        self._body_timer = None
        self._end_body(canned.BODY_TIMEOUT)

    def _deadline_passed(self) -> None:
        self._deadline_timer = None
        self._end_body(canned.BODY_DEADLINE)

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


def protocol_class(limits: ConnectionLimits) -> type[HttpToolsProtocol]:
    """A protocol class for ``uvicorn.Config(http=...)`` that enforces ``limits``.

    :raises UvicornMismatch: uvicorn lacks what this protocol overrides or calls.
    """
    check_uvicorn()
    return type(
        "BoundedHttpProtocol",
        (BoundedHttpProtocol,),
        {
            "limits": limits,
            "reserve": ProbeReserve(limits.probe_connections),
            "resends": Resends(),
        },
    )
