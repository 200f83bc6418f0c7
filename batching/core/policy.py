"""Batch policies: how long a forming batch may wait for more items.

A policy is pure arithmetic on the numbers passed in: it never reads a clock, sleeps or
polls. The collector asks it once per arrival while a batch forms, and tells it what it
observed, so every rule is a table test.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Protocol

__all__ = ["BatchPolicy", "FixedPolicy", "Formation"]


@dataclass(frozen=True, slots=True)
class Formation:
    """The state of one forming batch, as the collector sees it."""

    #: Loop time now, in seconds.
    now: float
    #: Enqueue time of the oldest job in the batch: the window is measured from here.
    oldest_enqueued_at: float
    #: Items collected into the batch so far (at least 1).
    batch_items: int
    #: Padded tokens the batch costs so far (items x longest); 0 when the model has no tokens.
    batch_tokens: int
    #: The cap on items per batch.
    max_batch_size: int
    #: True when other jobs were already queued behind the first one: traffic is concurrent.
    backlog: bool
    #: Instances of this model running a batch right now (not counting the forming one).
    busy_instances: int
    #: Instances of this model in all.
    instances: int


class BatchPolicy(Protocol):
    """Decides the wait window of a forming batch."""

    def max_delay(self, formation: Formation) -> float:
        """Seconds after ``formation.oldest_enqueued_at`` at which the batch must go."""
        ...

    def observe_arrival(self, now: float, items: int) -> None:
        """``items`` were admitted at loop time ``now``."""
        ...

    def observe_batch(self, items: int, tokens: int, compute_s: float) -> None:
        """A batch of ``items`` (``tokens`` padded tokens) took ``compute_s`` on its instance."""
        ...


class FixedPolicy:
    """Triton's window: wait up to ``max_queue_delay`` from the oldest job's enqueue time.

    A job that finds its instance idle and nothing queued behind it goes out at once: at low
    load nobody is coming to share the batch, so waiting would only add latency.
    """

    def __init__(self, max_queue_delay: float) -> None:
        if max_queue_delay < 0:
            raise ValueError("max_queue_delay must be >= 0")
        self.max_queue_delay = max_queue_delay

    def max_delay(self, formation: Formation) -> float:
        if not formation.backlog:
            return 0.0
        return self.max_queue_delay

    def observe_arrival(self, now: float, items: int) -> None:
        return None

    def observe_batch(self, items: int, tokens: int, compute_s: float) -> None:
        return None
