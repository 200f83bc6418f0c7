"""How a connection ends after an answer sent before its request was all read.

An answer can go out while the request's body is still arriving: a 413 decided from
``Content-Length``, a 401 decided from the headers, a 431 for headers that never end, or any
error a handler raises before reading the body. Such a connection is never reused, on any
transport:

- the answer says so: uvicorn's request cycle, once :func:`adopt` has taken it, adds
  ``connection: close`` to an answer begun while the body is still arriving (the canned
  answers of :mod:`batching.http.canned` always carry it), so a client's pool opens a
  new connection for its next request instead of sending it into one that is ending;
- the server **lingers**, as nginx does (:class:`Linger`): where the transport can, it
  half-closes at once (FIN after the answer), then reads and discards what the client still
  sends, so that the client, busy writing its body, reads its answer instead of a reset (a
  kernel answers unread bytes at close with a reset, and the reset makes the client's kernel
  drop the answer it had not read yet);
- the linger ends, and the connection closes, as soon as the request's announced body is all
  in, the client closes its side, or :attr:`~batching.http.limits.ConnectionLimits.linger`
  seconds have passed. Over TLS, which cannot half-close, closing sends the TLS close_notify
  after the answer: the client sees a clean end of the connection, never a silence in which
  its next request would be lost.
"""

from __future__ import annotations

import asyncio
from typing import Any, Protocol, cast

from uvicorn._types import ASGISendEvent
from uvicorn.protocols.http.httptools_impl import RequestResponseCycle

__all__ = ["EarlyAnswerCycle", "Linger", "LingeringTransport", "adopt"]

#: An answer's head is held back for its body when it is at most this long.
_COALESCED_HEAD = 16384


class AnswerOwner(Protocol):
    """The connection a :class:`LingeringTransport` writes for."""

    loop: asyncio.AbstractEventLoop

    def close_after_answer(self) -> None:
        """Close the connection after the answer just sent (or linger first)."""


class LingeringTransport:
    """What a request cycle writes its answer to: the connection's transport, except that

    - ``close()`` asks the connection, which lingers when the request's body is still arriving;
    - the answer's head (status line and headers, uvicorn's first write) waits for the first
      piece of body, or the end of the event loop's turn, and goes out with it in one write:
      one system call instead of two, and an answer that a process killed between the two
      cannot cut after its headers (a proxy could no longer send the request elsewhere).
    """

    def __init__(self, transport: asyncio.Transport, owner: AnswerOwner) -> None:
        self._transport = transport
        self._owner = owner
        self._head: bytes | None = None
        self._wrote = False

    def write(self, data: bytes | bytearray | memoryview) -> None:
        if not self._wrote and self._head is None and len(data) <= _COALESCED_HEAD:
            self._wrote = True
            self._head = bytes(data)
            self._owner.loop.call_soon(self.flush)
            return
        self._wrote = True
        head, self._head = self._head, None
        self._transport.write(head + bytes(data) if head is not None else data)

    def flush(self) -> None:
        head, self._head = self._head, None
        if head is not None and not self._transport.is_closing():
            self._transport.write(head)

    def write_eof(self) -> None:
        self.flush()
        self._transport.write_eof()

    def close(self) -> None:
        self.flush()
        self._owner.close_after_answer()

    def __getattr__(self, name: str) -> Any:
        return getattr(self._transport, name)


class EarlyAnswerCycle(RequestResponseCycle):
    """uvicorn's request cycle, except that an answer begun before the request's body is all
    in closes the connection, and says so (``connection: close``)."""

    async def send(self, message: ASGISendEvent) -> None:
        if not self.response_started and self.more_body:
            # uvicorn writes connection: close for a cycle not kept alive, then closes.
            self.keep_alive = False
        await super().send(message)


def adopt(cycle: RequestResponseCycle, transport: asyncio.Transport, owner: AnswerOwner) -> None:
    """Make ``cycle``, just created by uvicorn for ``owner``'s connection, write through a
    :class:`LingeringTransport` and close after an early answer (:class:`EarlyAnswerCycle`)."""
    if isinstance(cycle.transport, LingeringTransport):
        return
    cycle.transport = cast(asyncio.Transport, LingeringTransport(transport, owner))
    # uvicorn builds the cycle itself; the subclass adds a step to send and no state.
    cycle.__class__ = EarlyAnswerCycle


class Linger:
    """One connection's lingering close, started once its answer is written.

    :param transport: the connection's own transport.
    :param seconds: the longest the linger lasts; then the connection closes.
    :param unread: how many bytes of the request's body are still to come, when the request
        announced its length (``Content-Length``); None when unknown (a chunked body, or
        headers that were never complete): then only the client's close or the time ends it.
    """

    def __init__(
        self,
        loop: asyncio.AbstractEventLoop,
        transport: asyncio.Transport,
        seconds: float,
        unread: int | None,
    ) -> None:
        self._transport = transport
        self._unread = unread
        self._timer: asyncio.TimerHandle | None = None
        if transport.can_write_eof():
            # The answer, then FIN: the client reads it all, then sees the end.
            transport.write_eof()
        if unread is not None and unread <= 0:
            self.end()
        else:
            self._timer = loop.call_later(seconds, self.end)

    def discard(self, data: bytes) -> None:
        """Drop ``data``, which arrived while lingering; end once the body is all in."""
        if self._unread is None:
            return
        self._unread -= len(data)
        if self._unread <= 0:
            self.end()

    def end(self) -> None:
        """Close now: over TLS, the close_notify goes out after what is still buffered."""
        self.cancel()
        if not self._transport.is_closing():
            self._transport.close()

    def cancel(self) -> None:
        """Stop the timer (the connection is gone)."""
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None
