"""What the batcher reports as it works: an observer protocol, so the core imports no metrics
library; the server's Prometheus families and statistics implement it and tests may record
it."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Protocol

__all__ = ["BatchEvents", "BatchRun", "NoEvents", "RequestRun"]


@dataclass(frozen=True, slots=True)
class BatchRun:
    """One batch that ran, as told to :meth:`BatchEvents.batch_ran`: only for batches that
    carried at least one traced request (a request submitted with a ``trace``)."""

    #: Items and padded tokens (items x longest) the batch ran, and why it was released.
    items: int
    tokens: int
    reason: str
    #: The instance that ran it (its label), "" when the caller did not name it.
    instance: str
    #: Seconds the batch's oldest item waited; seconds from its start to its end (the wall
    #: time the instance held it, transfers included); the model's compute seconds.
    queue_wait: float
    run_s: float
    compute_s: float
    #: The ``trace`` of every request whose items it carried (opaque to the core: whatever
    #: the door passed to ``Batcher.submit``), once each, in the batch's order.
    traces: Sequence[object]


@dataclass(frozen=True, slots=True)
class RequestRun:
    """How a traced request went in the batcher, as told to :meth:`BatchEvents.request_ran`:
    seconds queued (until its first batch started), in batches (from then until it was
    resolved) and computed (the model's compute of every batch it ran in), and in how many
    batches; ``ok`` as in :meth:`BatchEvents.request_done`."""

    queue_s: float
    batched_s: float
    compute_s: float
    batches: int
    ok: bool


class BatchEvents(Protocol):
    """What the batcher reports; metrics implement it, tests may record it."""

    def batch_done(
        self, items: int, tokens: int, reason: str, queue_wait: float, compute_s: float
    ) -> None: ...

    def request_done(self, queue_s: float, compute_s: float, total_s: float, ok: bool) -> None:
        """A request admitted to the queue is resolved, once: ``queue_s`` from its enqueue
        until its first batch started (until now if it never ran), ``compute_s`` the model's
        compute time of every batch it ran in, ``total_s`` from its enqueue until now; ``ok``
        when every item was answered (not failed, cancelled or too late)."""
        ...

    def rejected(self, reason: str) -> None: ...

    def step_done(self, rows: int, seconds: float) -> None:
        """A generating model's running batch stepped: ``rows`` sequences got a token each
        from one forward of ``seconds`` (each one's time per output token in that step)."""
        ...

    def dropped(self, reason: str, items: int) -> None: ...

    def batch_ran(self, batch: BatchRun) -> None:
        """A batch that carried traced requests ran (after :meth:`batch_done`)."""
        ...

    def request_ran(self, trace: object, run: RequestRun) -> None:
        """A request submitted with ``trace`` is resolved (with :meth:`request_done`)."""
        ...


class NoEvents:
    """Discards every event."""

    def batch_done(
        self, items: int, tokens: int, reason: str, queue_wait: float, compute_s: float
    ) -> None:
        return None

    def request_done(self, queue_s: float, compute_s: float, total_s: float, ok: bool) -> None:
        return None

    def rejected(self, reason: str) -> None:
        return None

    def step_done(self, rows: int, seconds: float) -> None:
        return None

    def dropped(self, reason: str, items: int) -> None:
        return None

    def batch_ran(self, batch: BatchRun) -> None:
        return None

    def request_ran(self, trace: object, run: RequestRun) -> None:
        return None
