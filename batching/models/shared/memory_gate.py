"""A budget of bytes shared by work that runs on several threads at once.

The data plane checks each media item on a worker thread, as many at once as requests come
in; each check's decoding holds its estimated bytes only while it runs, through
:meth:`MemoryGate.reserve`. A reservation starts when what is already reserved and itself fit
the budget, or when nothing else is reserved (one reservation larger than the budget still
runs, alone), and reservations start in the order they asked: a large one is never passed
over by a stream of small ones. So the decodes running at one time hold together at most
the budget (or one item's cost, when that is larger).

No torch, no Pillow: pure threading.
"""

from __future__ import annotations

import threading
from collections import deque
from collections.abc import Iterator
from contextlib import contextmanager

__all__ = ["DECODES", "MemoryGate"]


class MemoryGate:
    """Reservations of bytes against a budget each caller names (see the module's
    docstring)."""

    def __init__(self) -> None:
        self._changed = threading.Condition()
        self._reserved = 0
        self._waiting: deque[object] = deque()

    @property
    def reserved(self) -> int:
        """The bytes reserved now."""
        with self._changed:
            return self._reserved

    def wait_for_waiting(self, count: int, timeout: float) -> bool:
        """Whether ``count`` reservations are waiting, within ``timeout`` seconds (for what
        observes the gate: a test, a diagnostic)."""
        with self._changed:
            return self._changed.wait_for(lambda: len(self._waiting) >= count, timeout)

    @contextmanager
    def reserve(self, cost: int, budget: int) -> Iterator[None]:
        """Hold ``cost`` bytes of ``budget`` for the block, waiting for them first."""
        ticket = object()
        with self._changed:
            self._waiting.append(ticket)
            self._changed.notify_all()
            try:
                self._changed.wait_for(
                    lambda: (
                        self._waiting[0] is ticket
                        and (self._reserved == 0 or self._reserved + cost <= budget)
                    )
                )
            finally:
                self._waiting.remove(ticket)
                self._changed.notify_all()
            self._reserved += cost
        try:
            yield
        finally:
            with self._changed:
                self._reserved -= cost
                self._changed.notify_all()


#: The process's image decodes: the data plane's checks reserve their decoding's bytes here.
DECODES = MemoryGate()
