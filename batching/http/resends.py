"""Early resends across connections: which refused requests, from which client address, are
held when they come back too soon, and until when.

A refusal (503) says how long the queue needs before it could take the request. A client that
ignores Retry-After and resends at once, even on a new connection, is held until then
(:mod:`batching.http.connections` holds it, read but not started), so a retry storm costs the
server one refusal per hold instead of one per round trip.

The key is the client's address and the request itself (method, path, query, body length and
CRC-32): never the address alone, so that behind a proxy, where every client shares one
address, only the *same* request sent again is held, never another client's different one;
an identical request from another client behind it waits at most the hold, which is the time
the queue could not have taken it anyway. The table is bounded (:data:`MAX_HELD`): past it the
oldest refusals are forgotten first (their resends are then merely not held), so a refusal
costs at most one bounded slot that its hold's end frees.
"""

from __future__ import annotations

from typing import Any

#: Most refused requests remembered at once (a few hundred bytes each).
MAX_HELD = 16384

#: The largest body a held resend may have: uvicorn stops reading past 64 KiB of unread body,
#: and a held request must be read whole before it can be compared.
HOLDABLE_BODY = 65536

#: What makes two requests the same: method, path, query, body length and body CRC-32.
RequestKey = tuple[str, bytes, bytes, int, int]

__all__ = ["HOLDABLE_BODY", "MAX_HELD", "RequestKey", "Resends", "content_length", "holdable"]


class Resends:
    """Refused requests by client address, each with the loop time until which it is held."""

    def __init__(self, size: int = MAX_HELD) -> None:
        self._size = size
        self._until: dict[tuple[str, RequestKey], float] = {}

    def __len__(self) -> int:
        return len(self._until)

    def refused(self, client: str, request: RequestKey, until: float, now: float) -> None:
        """``request`` from ``client`` was refused; hold a resend of it until ``until``."""
        table = self._until
        key = (client, request)
        table.pop(key, None)
        table[key] = until
        # Oldest first: drop what has expired at the front, and whatever passes the bound.
        while table:
            first = next(iter(table))
            if len(table) <= self._size and table[first] > now:
                break
            del table[first]

    def held_until(self, client: str, request: RequestKey, now: float) -> float | None:
        """Until when to hold ``request`` from ``client`` (forgotten then), or None."""
        until = self._until.pop((client, request), None)
        if until is None or until <= now:
            return None
        return until


def content_length(scope: Any) -> int | None:
    """The body's length a request announced (``Content-Length``), if it did."""
    for name, value in scope["headers"]:
        if name.lower() == b"content-length":
            try:
                return int(value)
            except ValueError:
                return None
    return None


def holdable(scope: Any) -> bool:
    """Whether a request's body is announced and small enough to be read whole while held."""
    length = content_length(scope)
    return length is not None and length <= HOLDABLE_BODY
