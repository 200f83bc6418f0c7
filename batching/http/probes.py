"""The probes' reserve: connections beyond the cap, each taken for one liveness or readiness
probe, so that the probes keep answering when every slot of the cap is taken.

Beyond ``--max-connections``, ``--probe-connections`` more connections are taken on
probation (:class:`ProbeReserve`). Such a connection serves one request, and only if its
request line asks for a probe path (:data:`PROBE_PATHS`); it must send its headers within
:data:`PROBE_HEADER_TIMEOUT`, and when every reserved slot is taken, a new connection evicts the
oldest one still silent, so idle sockets cannot hold the reserve: a prober that sends its
request as it connects (as kubelet and load balancers do) is always heard.
"""

from __future__ import annotations

from typing import Generic, Protocol, TypeVar

__all__ = ["PROBE_HEADER_TIMEOUT", "PROBE_PATHS", "ProbeReserve", "Reserved"]

#: The paths a reserved (beyond the cap) connection may ask for: liveness and readiness.
PROBE_PATHS = frozenset({b"/v2/health/live", b"/v2/health/ready"})

#: How long a reserved connection may take to send its headers.
PROBE_HEADER_TIMEOUT = 1.0


class Reserved(Protocol):
    """A connection that holds a reserved slot."""

    def silent(self) -> bool:
        """Whether it has sent nothing to read yet (and is not already being refused)."""

    def evict(self) -> None:
        """Give up its slot: answered with the cap's 503 and closed."""


Connection = TypeVar("Connection", bound=Reserved)


class ProbeReserve(Generic[Connection]):
    """The reserved connections open now, oldest first (one reserve per server).

    :param size: how many there may be (``--probe-connections``).
    """

    def __init__(self, size: int) -> None:
        self.size = size
        self._open: dict[Connection, None] = {}

    def __len__(self) -> int:
        return len(self._open)

    def take(self, connection: Connection) -> bool:
        """Whether ``connection``, beyond the cap, may wait for a probe request: a slot is
        free, or the oldest reserved connection still silent gives up its own."""
        if len(self._open) >= self.size:
            oldest = next((other for other in self._open if other.silent()), None)
            if oldest is None:
                return False
            oldest.evict()
        self._open[connection] = None
        return True

    def release(self, connection: Connection) -> None:
        """``connection``'s slot, if it has one, is free again."""
        self._open.pop(connection, None)
