"""What the batcher reports as it works: an observer protocol, so the core imports no metrics
library; the server's Prometheus families and statistics implement it and tests may record
it."""

from __future__ import annotations

from typing import Protocol

__all__ = ["BatchEvents", "NoEvents"]


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

    def dropped(self, reason: str, items: int) -> None: ...


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

    def dropped(self, reason: str, items: int) -> None:
        return None
